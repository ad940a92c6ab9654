//! Helpers for data-plane tests: endpoint configurations and keys written straight into
//! the `herald-config` bucket (as the operator would), events published the way a
//! producer does, and a dispatcher running in the background.

use std::sync::OnceLock;

use async_nats::jetstream::{self, kv};
use herald_core::dataplane::{
    ATTEMPTS_STREAM, AttemptOutcome, AttemptRecord, CONFIG_BUCKET, DeliveryState, EndpointConfig,
    EndpointHealth, EndpointKey, HEALTH_BUCKET, KeySet, attempt_log, event_subject, keyset_key,
    shard_for,
};
use herald_core::v1alpha1::{DeliveryPolicy, WebhookEndpoint, WebhookEndpointSpec};
use serde_json::{Value, json};

use herald_dispatcher::index::Index;

use crate::TestEnv;

/// Shards the test dispatchers run with.
pub const TEST_SHARDS: u32 = 4;

/// A vector secret everyone can verify with.
pub const TEST_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// An endpoint configuration from a `WebhookEndpoint` spec given as JSON (the same shape
/// as the YAML a tenant writes).
pub fn endpoint(namespace: &str, name: &str, spec: Value) -> EndpointConfig {
    let mut full = json!({"secretRef": {"name": "signing"}, "eventTypes": ["*"]});
    if let (Value::Object(full), Value::Object(spec)) = (&mut full, spec) {
        full.extend(spec);
    }
    let spec: WebhookEndpointSpec = serde_json::from_value(full).expect("a valid spec");
    let mut obj = WebhookEndpoint::new(name, spec);
    obj.metadata.namespace = Some(namespace.to_owned());
    obj.metadata.uid = Some(format!("uid-{namespace}-{name}"));
    obj.metadata.generation = Some(1);
    EndpointConfig::from_spec(&obj, shard_for(namespace, name, TEST_SHARDS))
}

/// An attempt record of a first attempt answered 500 with a 1 KiB response body (what a
/// long log of failed deliveries is made of), in `state`, for an event of `event_type`.
pub fn failed_record(
    event_id: String,
    time_ms: u64,
    state: DeliveryState,
    event_type: &str,
) -> AttemptRecord {
    AttemptRecord {
        event_id: event_id.into(),
        attempt: 1,
        time_ms,
        outcome: AttemptOutcome::HttpError,
        http_status: Some(500),
        latency_ms: 3,
        response: "x".repeat(1024),
        state,
        next_attempt_ms: None,
        dead_reason: None,
        replay: None,
        event_type: Some(event_type.into()),
        request_headers: Vec::new(),
        response_headers: Vec::new(),
    }
}

/// The default delivery policy with a fast retry schedule for tests.
pub fn fast_retries(schedule: &[&str]) -> DeliveryPolicy {
    serde_json::from_value(json!({"retry": {"schedule": schedule}})).expect("policy")
}

/// Data-plane access for one test.
#[derive(Clone)]
pub struct DataPlane {
    pub js: jetstream::Context,
    pub config: kv::Store,
    pub health: kv::Store,
}

impl DataPlane {
    /// Opens (creating when needed, with the dispatcher's settings) the buckets.
    pub async fn new(nats: async_nats::Client) -> Self {
        let js = jetstream::new(nats);
        // The dispatcher's own set-up creates everything; tests may run first.
        herald_dispatcher::setup::ensure(
            &js,
            herald_dispatcher::setup::DEFAULT_RETENTION,
            TEST_SHARDS,
            1,
        )
        .await
        .expect("JetStream layout");
        let config = js
            .get_key_value(CONFIG_BUCKET)
            .await
            .expect("config bucket");
        let health = js
            .get_key_value(HEALTH_BUCKET)
            .await
            .expect("health bucket");
        Self { js, config, health }
    }

    pub async fn put_endpoint(&self, config: &EndpointConfig) {
        self.config
            .put(
                config.key().config_key(),
                serde_json::to_vec(config).unwrap().into(),
            )
            .await
            .expect("writing the endpoint config");
    }

    pub async fn delete_endpoint(&self, namespace: &str, name: &str) {
        self.config
            .delete(EndpointKey::new(namespace, name).config_key())
            .await
            .expect("deleting the endpoint config");
    }

    pub async fn put_keys(&self, namespace: &str, secret: &str, keys: &[&str]) {
        let set = KeySet {
            keys: keys.iter().map(|k| k.to_string()).collect(),
        };
        self.config
            .put(
                keyset_key(namespace, secret),
                serde_json::to_vec(&set).unwrap().into(),
            )
            .await
            .expect("writing the key set");
    }

    /// Publishes `{"type", "data"}` to `herald.events.<ns>.<type>`; returns the stream
    /// sequence once JetStream acknowledged it.
    pub async fn publish(&self, namespace: &str, event_type: &str, data: Value) -> u64 {
        let body = serde_json::to_vec(&json!({"type": event_type, "data": data})).unwrap();
        self.publish_raw(&event_subject(namespace, event_type), body)
            .await
    }

    pub async fn publish_raw(&self, subject: &str, body: Vec<u8>) -> u64 {
        self.js
            .publish(subject.to_owned(), body.into())
            .await
            .expect("publish")
            .await
            .expect("publish ack")
            .sequence
    }

    pub async fn health(&self, namespace: &str, name: &str) -> Option<EndpointHealth> {
        let entry = self
            .health
            .get(EndpointKey::new(namespace, name).config_key())
            .await
            .ok()??;
        serde_json::from_slice(&entry).ok()
    }

    /// Every attempt record of an endpoint so far, oldest first.
    pub async fn attempts(&self, namespace: &str, name: &str) -> Vec<Value> {
        let subject = EndpointKey::new(namespace, name).attempts_subject();
        read_all(&self.js, ATTEMPTS_STREAM, &subject)
            .await
            .iter()
            .flat_map(|payload| {
                attempt_log::decode_as(payload)
                    .map(|record| record.expect("attempt record"))
                    .collect::<Vec<Value>>()
            })
            .collect()
    }
}

/// Every message of `subject` in `stream`, oldest first.
pub async fn read_all(js: &jetstream::Context, stream: &str, subject: &str) -> Vec<Vec<u8>> {
    let stream = js.get_stream(stream).await.expect("stream");
    let mut out = Vec::new();
    let mut seq = 1;
    while let Ok(message) = stream.direct_get_next_for_subject(subject, Some(seq)).await {
        seq = message.sequence + 1;
        out.push(message.payload.to_vec());
    }
    out
}

static SHARED_DISPATCHER: OnceLock<Index> = OnceLock::new();

/// Starts (once per test process) a dispatcher against `env` on a thread of its own, so
/// it outlives each test's runtime. It runs until the process ends. Returns its
/// configuration index.
pub fn shared_dispatcher(env: &'static TestEnv) -> &'static Index {
    SHARED_DISPATCHER.get_or_init(|| spawn_dispatcher(env, |_| {}))
}

/// Starts a dispatcher against `env` with the test settings as `tweak` changes them, on
/// a thread of its own; it runs until the process ends. Returns its configuration index.
pub fn spawn_dispatcher(
    env: &TestEnv,
    tweak: impl FnOnce(&mut herald_dispatcher::Config),
) -> Index {
    let index = Index::default();
    let theirs = index.clone();
    let mut config = herald_dispatcher::Config::for_tests(
        env.nats_url(),
        &format!("e2e-{}", std::process::id()),
    );
    tweak(&mut config);
    std::thread::spawn(move || {
        herald_dispatcher::install_crypto_provider();
        let runtime = tokio::runtime::Runtime::new().expect("dispatcher runtime");
        let run = herald_dispatcher::run_with_index(config, theirs, std::future::pending());
        if let Err(error) = runtime.block_on(run) {
            panic!("dispatcher failed: {error}");
        }
    });
    index
}

/// Waits until the shared dispatcher uses `config` (its generation and pause state).
pub async fn until_applied(index: &Index, config: &EndpointConfig) {
    let key = config.key();
    crate::eventually(
        &format!("the dispatcher to apply {key}"),
        std::time::Duration::from_secs(30),
        || {
            let applied = index.endpoint(&key).is_some_and(|e| e.config == *config);
            async move { applied.then_some(()) }
        },
    )
    .await;
}
