//! The SigningSecret controller against the real API server and NATS: generated
//! Secrets, the KeySet in `herald-config`, rotation with overlap, hand edits, invalid
//! user Secrets, and key material never leaking into status or Events.

mod support;

use std::collections::BTreeMap;

use herald_core::dataplane::keyset_key;
use herald_core::signing::{SigningKey, generate_whsec};
use herald_core::v1alpha1::SigningSecret;
use herald_e2e::{TestContext, eventually};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{ResourceExt, api::ObjectMeta};
use serde_json::json;
use support::*;

fn data(secret: &Secret, key: &str) -> Option<String> {
    let bytes = secret.data.as_ref()?.get(key)?;
    String::from_utf8(bytes.0.clone()).ok()
}

async fn keyset(
    store: &async_nats::jetstream::kv::Store,
    ns: &str,
    name: &str,
) -> Option<Vec<String>> {
    let value = kv_get(store, &keyset_key(ns, name)).await?;
    serde_json::from_value(value["keys"].clone()).ok()
}

/// No status and no Event may contain key material.
async fn assert_no_leak(ctx: &TestContext, keys: &[String]) {
    let events = events_text(ctx).await;
    let statuses = serde_json::to_string(
        &ctx.api::<SigningSecret>()
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .map(|s| s.status.clone())
            .collect::<Vec<_>>(),
    )
    .unwrap();
    for text in [&events, &statuses] {
        assert!(!text.contains("whsec_"), "key material leaked: {text}");
        for key in keys {
            let b64 = key.trim_start_matches("whsec_");
            assert!(!text.contains(b64), "key material leaked: {text}");
        }
    }
}

#[tokio::test]
async fn a_signing_secret_gets_a_generated_key_and_a_keyset() {
    let ctx = TestContext::new("op-keys").await;
    let op = Operator::start(&ctx, "a", &[]);
    let (config_kv, _) = buckets(&ctx).await;
    let owner = create_secret(&ctx, "keys", json!({})).await;

    let secrets = ctx.api::<Secret>();
    let secret = eventually("generated Secret", WAIT, || async {
        secrets.get_opt("keys").await.ok()?
    })
    .await;
    let current = data(&secret, "current").expect("current key");
    let key = SigningKey::from_whsec(&current).expect("a valid whsec_ key");
    assert_eq!(
        secret
            .labels()
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("herald")
    );
    assert!(
        secret
            .owner_references()
            .iter()
            .any(|o| Some(&o.uid) == owner.uid().as_ref())
    );

    let keys = eventually("KeySet in KV", WAIT, || {
        keyset(&config_kv, &ctx.namespace, "keys")
    })
    .await;
    assert_eq!(keys, vec![current.clone()]);

    let api = ctx.api::<SigningSecret>();
    let status = eventually("SigningSecret Ready", WAIT, || async {
        let s = api.get("keys").await.ok()?.status?;
        (condition(&s.conditions, "Ready")?.status == "True").then_some(s)
    })
    .await;
    assert_eq!(status.active_key_id.as_deref(), Some(key.id()));
    assert!(status.last_rotation.is_some() && status.previous_key_id.is_none());
    eventually("KeyGenerated Event", WAIT, || async {
        event_reasons(&ctx)
            .await
            .iter()
            .any(|r| r == "KeyGenerated")
            .then_some(())
    })
    .await;
    assert_no_leak(&ctx, &[current]).await;

    // Deleting the SigningSecret withdraws its keys from NATS; the Secret follows it
    // through its owner reference.
    api.delete("keys", &Default::default()).await.unwrap();
    eventually("KeySet withdrawn", WAIT, || async {
        keyset(&config_kv, &ctx.namespace, "keys")
            .await
            .is_none()
            .then_some(())
    })
    .await;
    eventually("SigningSecret gone", WAIT, || async {
        api.get_opt("keys").await.ok()?.is_none().then_some(())
    })
    .await;
    finish(ctx, vec![op]).await;
}

#[tokio::test]
async fn rotation_on_demand_overlaps_then_drops_the_previous_key() {
    let ctx = TestContext::new("op-rotate").await;
    let op = Operator::start(&ctx, "a", &[]);
    let (config_kv, _) = buckets(&ctx).await;
    create_secret(&ctx, "keys", json!({"rotation": {"overlap": "3s"}})).await;
    let first = eventually("first key", WAIT, || async {
        keyset(&config_kv, &ctx.namespace, "keys")
            .await?
            .into_iter()
            .next()
    })
    .await;
    let first_id = SigningKey::from_whsec(&first).unwrap().id().to_owned();

    let api = ctx.api::<SigningSecret>();
    api.patch(
        "keys",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"rotation": {"request": "2026-11-30"}}})),
    )
    .await
    .unwrap();
    let keys = eventually("two keys during the overlap", WAIT, || async {
        let keys = keyset(&config_kv, &ctx.namespace, "keys").await?;
        (keys.len() == 2).then_some(keys)
    })
    .await;
    assert_eq!(keys[1], first, "newest first, the previous key second");
    let second = keys[0].clone();
    let status = eventually("status shows the previous key", WAIT, || async {
        let s = api.get("keys").await.ok()?.status?;
        (s.previous_key_id.is_some()).then_some(s)
    })
    .await;
    assert_eq!(status.previous_key_id.as_deref(), Some(first_id.as_str()));
    assert_eq!(
        status.active_key_id.as_deref(),
        Some(SigningKey::from_whsec(&second).unwrap().id())
    );
    assert_eq!(
        status.observed_rotation_request.as_deref(),
        Some("2026-11-30")
    );
    assert!(status.previous_key_valid_until.is_some());

    let keys = eventually("one key after the overlap", WAIT, || async {
        let keys = keyset(&config_kv, &ctx.namespace, "keys").await?;
        (keys.len() == 1).then_some(keys)
    })
    .await;
    assert_eq!(keys, vec![second.clone()]);
    let secret = ctx.api::<Secret>().get("keys").await.unwrap();
    assert!(
        data(&secret, "previous").is_none(),
        "previous dropped from the Secret"
    );
    let status = eventually("status without the previous key", WAIT, || async {
        let s = api.get("keys").await.ok()?.status?;
        (s.previous_key_id.is_none()).then_some(s)
    })
    .await;
    assert!(status.previous_key_valid_until.is_none());

    // The annotation rotates too, once per value.
    api.patch(
        "keys",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {"herald.dev/rotate": "now"}}})),
    )
    .await
    .unwrap();
    let keys = eventually("rotated by annotation", WAIT, || async {
        let keys = keyset(&config_kv, &ctx.namespace, "keys").await?;
        (keys.len() == 2 && keys[1] == second).then_some(keys)
    })
    .await;
    eventually("SecretRotated Event", WAIT, || async {
        event_reasons(&ctx)
            .await
            .iter()
            .any(|r| r == "SecretRotated")
            .then_some(())
    })
    .await;
    assert_no_leak(&ctx, &[first, second, keys[0].clone()]).await;
    finish(ctx, vec![op]).await;
}

#[tokio::test]
async fn a_hand_edited_secret_is_picked_up() {
    let ctx = TestContext::new("op-edit").await;
    let op = Operator::start(&ctx, "a", &[]);
    let (config_kv, _) = buckets(&ctx).await;
    create_secret(&ctx, "keys", json!({})).await;
    eventually("first key", WAIT, || {
        keyset(&config_kv, &ctx.namespace, "keys")
    })
    .await;

    let (mine, id) = generate_whsec().unwrap();
    ctx.api::<Secret>()
        .patch(
            "keys",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"current": mine}})),
        )
        .await
        .unwrap();
    eventually("the edited key in KV", WAIT, || async {
        let keys = keyset(&config_kv, &ctx.namespace, "keys").await?;
        (keys == vec![mine.clone()]).then_some(())
    })
    .await;
    let api = ctx.api::<SigningSecret>();
    eventually("status shows the edited key's id", WAIT, || async {
        let s = api.get("keys").await.ok()?.status?;
        (s.active_key_id.as_deref() == Some(id.as_str())).then_some(())
    })
    .await;
    finish(ctx, vec![op]).await;
}

#[tokio::test]
async fn an_invalid_user_secret_names_the_bad_data_key() {
    let ctx = TestContext::new("op-badkey").await;
    let op = Operator::start(&ctx, "a", &[]);
    let bad = "whsec_dG9vc2hvcnQ=";
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("mine".into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "current".to_owned(),
            ByteString(bad.as_bytes().to_vec()),
        )])),
        ..Default::default()
    };
    ctx.api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    create_secret(&ctx, "keys", json!({"secretName": "mine"})).await;
    let api = ctx.api::<SigningSecret>();
    let ready = eventually("InvalidSpec", WAIT, || async {
        let s = api.get("keys").await.ok()?.status?;
        let c = condition(&s.conditions, "Ready")?.clone();
        (c.status == "False").then_some(c)
    })
    .await;
    assert_eq!(ready.reason, "InvalidSpec");
    assert!(
        ready.message.contains("`current`") && ready.message.contains("mine"),
        "{}",
        ready.message
    );
    assert!(!ready.message.contains("dG9vc2hvcnQ"), "{}", ready.message);
    // Herald does not take over a Secret it did not create.
    let secret = ctx.api::<Secret>().get("mine").await.unwrap();
    assert!(secret.owner_references().is_empty());
    assert_eq!(data(&secret, "current").as_deref(), Some(bad));
    finish(ctx, vec![op]).await;
}

#[tokio::test]
async fn keys_rotate_on_schedule() {
    let ctx = TestContext::new("op-every").await;
    let op = Operator::start(&ctx, "a", &[]);
    let (config_kv, _) = buckets(&ctx).await;
    create_secret(
        &ctx,
        "keys",
        json!({"rotation": {"every": "2s", "overlap": "1s"}}),
    )
    .await;
    let first = eventually("first key", WAIT, || async {
        keyset(&config_kv, &ctx.namespace, "keys")
            .await?
            .into_iter()
            .next()
    })
    .await;
    // No request: the schedule alone brings a new key, and the old one overlaps.
    let keys = eventually("a scheduled rotation", WAIT, || async {
        let keys = keyset(&config_kv, &ctx.namespace, "keys").await?;
        (keys[0] != first).then_some(keys)
    })
    .await;
    assert!(keys.len() <= 2, "{}", keys.len());
    let api = ctx.api::<SigningSecret>();
    let first_id = SigningKey::from_whsec(&first).unwrap().id().to_owned();
    let status = eventually("status shows the rotation", WAIT, || async {
        let s = api.get("keys").await.ok()?.status?;
        (s.active_key_id.as_deref() != Some(first_id.as_str())).then_some(s)
    })
    .await;
    assert!(status.observed_rotation_request.is_none());
    assert!(status.last_rotation.is_some());
    finish(ctx, vec![op]).await;
}
