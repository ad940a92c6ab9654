//! Endpoint verification as a tenant and a platform team meet it: an endpoint that asks
//! for it (`spec.verify`) and one in a namespace the platform team marked receive nothing
//! until their receivers echo Herald's signed challenge; the status says why; events
//! published meanwhile are delivered once they do.

use herald_core::verification::EVENT_TYPE;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Patch, PatchParams};

use super::*;

fn is_challenge(r: &Received) -> bool {
    r.json()["type"] == EVENT_TYPE
}

/// Events (not challenges) `path` received, by their `data.n`.
fn events(rx: &Receiver, path: &str) -> Vec<i64> {
    rx.received(path)
        .iter()
        .filter(|r| !is_challenge(r))
        .filter_map(|r| r.json()["data"]["n"].as_i64())
        .collect()
}

#[tokio::test]
async fn an_endpoint_receives_nothing_until_its_receiver_echoes_the_challenge() {
    let Stack {
        _faults,
        ctx,
        stop_operator,
        rx,
        dp,
    } = Stack::start("verify", "keys").await;
    let endpoint = |name: &str, verify: bool| {
        json!({
            "apiVersion": "herald.dev/v1alpha1", "kind": "WebhookEndpoint",
            "metadata": {"name": name},
            "spec": {"url": rx.url(name), "eventTypes": ["order.*"], "secretRef": {"name": "keys"},
                     "verify": verify}
        })
    };
    // "asks" wants verification, its receiver does not echo yet (it answers 200 "ok",
    // as a third party's URL would); "plain" does not ask.
    apply(&ctx, endpoint("asks", true));
    apply(&ctx, endpoint("plain", false));
    let endpoints: Api<WebhookEndpoint> = ctx.api();
    let failed =
        until_condition(&endpoints, "asks", "Verified", ("False", "ChallengeFailed")).await;
    assert!(failed.contains("without echoing"), "{failed}");
    let (_, _, ready) = condition(&endpoints, "asks", "Ready").await.unwrap();
    assert!(ready.contains("verification challenge"), "{ready}");
    until_condition(&endpoints, "asks", "Ready", ("False", "NotVerified")).await;
    until_condition(&endpoints, "plain", "Ready", ("True", "Accepted")).await;
    assert_eq!(
        condition(&endpoints, "plain", "Verified").await,
        None,
        "no Verified condition where nothing asks for it"
    );

    // The challenge is a signed webhook with a fresh challenge each time.
    let key = current_key(&ctx, "keys").await;
    let challenges: Vec<Received> = rx
        .received("asks")
        .into_iter()
        .filter(is_challenge)
        .collect();
    let first = &challenges[0];
    verify(
        std::slice::from_ref(&key),
        first.header("webhook-id"),
        first.header("webhook-timestamp"),
        first.header("webhook-signature"),
        &first.body,
        jiff::Timestamp::now().as_second(),
        300,
    )
    .expect("the challenge is signed with the endpoint's key");
    assert!(first.header("webhook-id").starts_with("verify_"));
    let body = first.json();
    assert!(
        body["data"]["challenge"]
            .as_str()
            .unwrap()
            .starts_with("hvc_")
    );
    assert_eq!(body["data"]["endpoint"]["name"], "asks");

    // Events published now reach "plain" and wait for "asks".
    for n in 0..3 {
        dp.publish(&ctx.namespace, "order.created", json!({"n": n}))
            .await;
    }
    eventually("plain received the events", WAIT, || async {
        (events(&rx, "plain").len() >= 3).then_some(())
    })
    .await;
    assert!(
        events(&rx, "asks").is_empty(),
        "delivered before the receiver echoed: {:?}",
        events(&rx, "asks")
    );

    // The receiver's owner deploys the echo: verified, Ready, and the held events come.
    rx.behave("asks", Behavior::echoing());
    let verified =
        until_condition(&endpoints, "asks", "Verified", ("True", "ChallengeEchoed")).await;
    assert!(verified.contains(&rx.url("asks")), "{verified}");
    until_condition(&endpoints, "asks", "Ready", ("True", "Accepted")).await;
    eventually("the held events delivered", WAIT, || async {
        let mut got = events(&rx, "asks");
        got.sort_unstable();
        got.dedup();
        (got == [0, 1, 2]).then_some(())
    })
    .await;

    // The platform team requires verification for the whole namespace: "plain", whose
    // receiver does not echo, stops receiving until it does.
    let namespaces: Api<Namespace> = Api::all(ctx.client.clone());
    let annotate = |value: &str| json!({"metadata": {"annotations": {"herald.dev/require-endpoint-verification": value}}});
    namespaces
        .patch(
            &ctx.namespace,
            &PatchParams::default(),
            &Patch::Merge(annotate("true")),
        )
        .await
        .unwrap();
    until_condition(
        &endpoints,
        "plain",
        "Verified",
        ("False", "ChallengeFailed"),
    )
    .await;
    until_condition(&endpoints, "plain", "Ready", ("False", "NotVerified")).await;
    // Held once the dispatcher has the configuration that says so.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = events(&rx, "plain").len();
    dp.publish(&ctx.namespace, "order.created", json!({"n": 10}))
        .await;
    eventually("asks received the next event", WAIT, || async {
        events(&rx, "asks").contains(&10).then_some(())
    })
    .await;
    assert_eq!(
        events(&rx, "plain").len(),
        before,
        "delivered to an unverified endpoint in a namespace that requires verification"
    );
    rx.behave("plain", Behavior::echoing());
    until_condition(&endpoints, "plain", "Verified", ("True", "ChallengeEchoed")).await;
    eventually("plain received the held event", WAIT, || async {
        events(&rx, "plain").contains(&10).then_some(())
    })
    .await;

    let _ = stop_operator.send(());
    ctx.cleanup().await;
}
