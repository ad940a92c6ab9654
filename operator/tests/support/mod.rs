//! Shared helpers of the operator's end-to-end tests: an in-process operator scoped to
//! the test's namespace, KV access, object builders and condition lookups.

#![allow(dead_code)]

use std::time::Duration;

use async_nats::jetstream::{self, kv};
use herald_core::dataplane::{CONFIG_BUCKET, HEALTH_BUCKET};
use herald_core::v1alpha1::{SigningSecret, WebhookEndpoint};
use herald_e2e::{TestContext, TestEnv, env, eventually};
use herald_operator::Config;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::PostParams;
use serde_json::json;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How long a reconcile may take to show. The operator tests run last in `make test`,
/// after 25 minutes of e2e tests have filled the shared API server and loaded both cores:
/// there one run took 47 s for what takes 18 s alone, and an endpoint missed 30 s.
pub const WAIT: Duration = Duration::from_secs(60);

/// An operator running in this process; stops on [`Operator::stop`] or drop.
pub struct Operator {
    pub identity: String,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), herald_operator::Error>>>,
}

impl Operator {
    /// Starts an operator reconciling only `ctx`'s namespace, with its Lease there too.
    /// `extra` are additional flags.
    pub fn start(ctx: &TestContext, identity: &str, extra: &[&str]) -> Self {
        Self::start_in(env(), ctx, identity, extra)
    }

    /// [`Operator::start`] against the environment `env`.
    pub fn start_in(env: &TestEnv, ctx: &TestContext, identity: &str, extra: &[&str]) -> Self {
        let kubeconfig = env.kubeconfig();
        let mut args = vec![
            "herald-operator".to_owned(),
            "--nats-url".into(),
            env.nats_url().into(),
            // One shard count per NATS: the test dispatchers run with it too.
            "--shards".into(),
            herald_e2e::dataplane::TEST_SHARDS.to_string(),
            "--namespace".into(),
            ctx.namespace.clone(),
            "--lease-namespace".into(),
            ctx.namespace.clone(),
            "--identity".into(),
            identity.into(),
            "--kubeconfig".into(),
            kubeconfig.display().to_string(),
            "--listen".into(),
            "127.0.0.1:0".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let config = <Config as clap::Parser>::try_parse_from(args).expect("operator flags");
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(herald_operator::run(config, async move {
            let _ = rx.await;
        }));
        Self {
            identity: identity.to_owned(),
            stop: Some(tx),
            task: Some(task),
        }
    }

    /// Whether `run` is still running (it returns only on shutdown or a fatal error).
    pub fn is_running(&self) -> bool {
        self.task.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Graceful shutdown; returns what `run` returned.
    pub async fn stop(mut self) -> Result<(), herald_operator::Error> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let task = self.task.take().expect("running");
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("operator stops within 30 s")
            .expect("operator task")
    }

    /// Kills the operator as a crash would: no Lease release, nothing graceful.
    pub fn crash(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// The KV buckets (waiting until the operator created them).
pub async fn buckets(ctx: &TestContext) -> (kv::Store, kv::Store) {
    let js = jetstream::new(ctx.nats.clone());
    eventually("the herald KV buckets", WAIT, || async {
        let config = js.get_key_value(CONFIG_BUCKET).await.ok()?;
        let health = js.get_key_value(HEALTH_BUCKET).await.ok()?;
        Some((config, health))
    })
    .await
}

pub async fn kv_get(store: &kv::Store, key: &str) -> Option<serde_json::Value> {
    let bytes = store.get(key).await.expect("KV get")?;
    Some(serde_json::from_slice(&bytes).expect("KV value is JSON"))
}

pub async fn create_secret(
    ctx: &TestContext,
    name: &str,
    spec: serde_json::Value,
) -> SigningSecret {
    let obj: SigningSecret = serde_json::from_value(json!({
        "apiVersion": "herald.dev/v1alpha1",
        "kind": "SigningSecret",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .expect("SigningSecret");
    ctx.api::<SigningSecret>()
        .create(&PostParams::default(), &obj)
        .await
        .expect("creating SigningSecret")
}

pub async fn create_endpoint(
    ctx: &TestContext,
    name: &str,
    url: &str,
    secret: &str,
) -> WebhookEndpoint {
    let obj: WebhookEndpoint = serde_json::from_value(json!({
        "apiVersion": "herald.dev/v1alpha1",
        "kind": "WebhookEndpoint",
        "metadata": {"name": name},
        "spec": {"url": url, "eventTypes": ["order.*"], "secretRef": {"name": secret}},
    }))
    .expect("WebhookEndpoint");
    ctx.api::<WebhookEndpoint>()
        .create(&PostParams::default(), &obj)
        .await
        .expect("creating WebhookEndpoint")
}

pub fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Waits until the endpoint's `Ready` condition has `status` and returns the object.
pub async fn endpoint_ready(ctx: &TestContext, name: &str, status: &str) -> WebhookEndpoint {
    let api = ctx.api::<WebhookEndpoint>();
    eventually(&format!("endpoint {name} Ready={status}"), WAIT, || async {
        let obj = api.get(name).await.ok()?;
        let ready = condition(&obj.status.as_ref()?.conditions, "Ready")?;
        (ready.status == status).then_some(obj)
    })
    .await
}

/// All Events in the test's namespace, rendered as JSON text (for leak checks).
pub async fn events_text(ctx: &TestContext) -> String {
    let events = ctx
        .api::<k8s_openapi::api::events::v1::Event>()
        .list(&Default::default())
        .await
        .expect("listing Events");
    serde_json::to_string(&events.items).expect("Events as JSON")
}

/// Reasons of the Events in the namespace.
pub async fn event_reasons(ctx: &TestContext) -> Vec<String> {
    let events = ctx
        .api::<k8s_openapi::api::events::v1::Event>()
        .list(&Default::default())
        .await
        .expect("listing Events");
    events.items.into_iter().filter_map(|e| e.reason).collect()
}

/// Deletes every Herald object of the test while its operators still run — they remove
/// their finalizers, as they would in a cluster — and waits until they are gone; then
/// stops the operators and deletes the namespace. (Deleting the namespace first would
/// also delete the operators' Lease, which lives there only in tests.)
pub async fn finish(ctx: TestContext, ops: Vec<Operator>) {
    delete_all(&ctx, Duration::from_secs(120)).await;
    drop(ops);
    ctx.cleanup().await;
}

/// Deletes every Herald object in the namespace and waits until they are gone.
pub async fn delete_all(ctx: &TestContext, timeout: Duration) {
    let dp = kube::api::DeleteParams::default();
    let lp = kube::api::ListParams::default();
    let endpoints = ctx.api::<WebhookEndpoint>();
    let secrets = ctx.api::<SigningSecret>();
    let replays = ctx.api::<herald_core::v1alpha1::WebhookReplay>();
    endpoints
        .delete_collection(&dp, &lp)
        .await
        .expect("deleting endpoints");
    secrets
        .delete_collection(&dp, &lp)
        .await
        .expect("deleting signing secrets");
    replays
        .delete_collection(&dp, &lp)
        .await
        .expect("deleting replays");
    eventually(
        "Herald objects deleted, finalizers honoured",
        timeout,
        || async {
            let lp = kube::api::ListParams::default().limit(1);
            let left = endpoints.list_metadata(&lp).await.ok()?.items.len()
                + secrets.list_metadata(&lp).await.ok()?.items.len()
                + replays.list_metadata(&lp).await.ok()?.items.len();
            (left == 0).then_some(())
        },
    )
    .await;
}

/// Waits until the endpoint's `Ready` condition has `reason` and returns the condition.
pub async fn endpoint_reason(ctx: &TestContext, name: &str, reason: &str) -> Condition {
    let api = ctx.api::<WebhookEndpoint>();
    eventually(
        &format!("endpoint {name} Ready reason {reason}"),
        WAIT,
        || async {
            let obj = api.get(name).await.ok()?;
            let ready = condition(&obj.status.as_ref()?.conditions, "Ready")?.clone();
            (ready.reason == reason).then_some(ready)
        },
    )
    .await
}
