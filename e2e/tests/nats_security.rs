//! NATS as production runs it: TLS with verified client certificates and the permission
//! model of `examples/nats/herald-accounts.conf`, loaded unchanged by this process's
//! secure test environment (`testenv run --nats-secure`).
//!
//! - the operator and the dispatcher, as processes with their own identities (TLS
//!   client certificate + NKey seed from files, the flags the chart sets), deliver an
//!   event a producer identity published, and the server logged no permission violation
//!   of theirs on the way (so their permissions are what they use); a `WebhookReplay`
//!   is checked against the event store's real retention, which the operator's identity
//!   may look up without being able to read an event;
//! - a producer identity is refused reading `herald-config`, reading another tenant's
//!   lane, purging a stream and publishing into another namespace, and can still publish
//!   its own events (so the refusals are the permissions, not a broken connection);
//! - producers receive JetStream's acknowledgements on their own inbox prefixes only:
//!   one is refused `_INBOX.>` and another tenant's prefix, in both secure modes;
//! - a client without a certificate of the CA, or without a known NKey, is refused;
//! - the same in operator (JWT) mode (`testenv run --nats-secure … --nats-jwt`, the same
//!   accounts file turned into account and user JWTs): the binaries log in with
//!   `--nats-creds` (user JWT + NKey seed) and TLS, deliver a producer's event, and a
//!   producer's credentials are refused `herald-config`; an NKey without its JWT is refused;
//! - the binaries never print a password of `--nats-url`: not in `--help`, not in an
//!   error, not in their (debug) logs while the server cannot be reached.

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use futures::StreamExt;
use herald_core::dataplane::{parse_event_subject, partition_of};
use herald_core::v1alpha1::{SigningSecret, WebhookEndpoint, WebhookReplay};
use herald_e2e::faults::{Dispatchers, Operators};
use herald_e2e::receiver::Receiver;
use herald_e2e::{
    TestEnv, eventually, free_port, install_crds, private_jwt_env, private_secure_env,
};
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

const DISPATCHER: &str = env!("CARGO_BIN_EXE_herald-test-dispatcher");
const OPERATOR: &str = env!("CARGO_BIN_EXE_herald-test-operator");
const WAIT: Duration = Duration::from_secs(60);

/// A client of one identity that records what the server told it (`-ERR` lines).
struct Watched {
    client: async_nats::Client,
    errors: Arc<Mutex<Vec<String>>>,
}

impl Watched {
    async fn connect(env: &TestEnv, identity: &str) -> Self {
        Self::connect_with(env, identity, env.nats_as(identity)).await
    }

    /// The producer of namespace `ns`, as its client must be set up: replies (JetStream's
    /// acknowledgements) on its own inbox prefix `_INBOX.<ns>`, the only inbox its
    /// permissions let it subscribe to.
    async fn producer(env: &TestEnv, ns: &str) -> Self {
        let identity = format!("producer-{ns}");
        let options = env
            .nats_as(&identity)
            .custom_inbox_prefix(format!("_INBOX.{ns}"));
        Self::connect_with(env, &identity, options).await
    }

    async fn connect_with(
        env: &TestEnv,
        identity: &str,
        options: async_nats::ConnectOptions,
    ) -> Self {
        let errors = Arc::new(Mutex::new(Vec::new()));
        let sink = errors.clone();
        let client = options
            .request_timeout(Some(Duration::from_secs(2)))
            .event_callback(move |event| {
                let sink = sink.clone();
                async move {
                    if let async_nats::Event::ServerError(error) = event {
                        sink.lock().unwrap().push(error.to_string());
                    }
                }
            })
            .connect(env.nats_url())
            .await
            .unwrap_or_else(|e| panic!("connecting as {identity}: {e}"));
        Self { client, errors }
    }

    /// Waits (at most 5 s) for the server's permission violation naming `subject`.
    async fn refused(&self, what: &str, subject: &str) {
        let needle = format!("\"{}\"", subject.to_lowercase());
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let errors = self.errors.lock().unwrap().clone();
            if errors.iter().any(|e| {
                let e = e.to_lowercase();
                e.contains("permissions violation") && e.contains(&needle)
            }) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: no permission violation for {subject}; the server said {errors:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn ensure_namespace(client: &kube::Client, name: &str) {
    let ns: Namespace = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"herald.dev/e2e": "true"}}
    }))
    .expect("namespace object");
    match Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("creating namespace {name}: {e}"),
    }
}

/// The server's log lines of permission violations by a client named `name...`.
fn violations_of(env: &TestEnv, name: &str) -> Vec<String> {
    let log = std::fs::read_to_string(env.nats_log()).unwrap_or_default();
    log.lines()
        .filter(|l| l.contains("Violation") && l.contains(name))
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn herald_delivers_over_tls_as_its_own_identities() {
    deliver_as_own_identities(private_secure_env()).await;
}

/// The operator and the dispatcher, started with `env`'s flags for their identities,
/// deliver an event the producer of `tenant-a` published, and the server logged no
/// permission violation of theirs.
async fn deliver_as_own_identities(env: &'static TestEnv) {
    let kube = env.client().await;
    install_crds(&kube).await;
    let ns = "tenant-a";
    ensure_namespace(&kube, ns).await;
    let admin = env.nats().await;
    let rx = Receiver::start().await;

    let operator_flags = env.nats_flags("operator");
    let flags: Vec<&str> = operator_flags.iter().map(String::as_str).collect();
    let mut operators = Operators::new(OPERATOR, env, ns, "secure").with_args(&flags);
    operators.start("op0");
    let dispatcher_flags = env.nats_flags("dispatcher");
    let flags: Vec<&str> = dispatcher_flags.iter().map(String::as_str).collect();
    let mut dispatchers = Dispatchers::new(DISPATCHER, env.nats_url(), "secure").with_args(&flags);
    dispatchers.start("d0");

    let secret: SigningSecret = serde_json::from_value(json!({
        "apiVersion": "herald.dev/v1alpha1", "kind": "SigningSecret",
        "metadata": {"name": "keys"}, "spec": {}
    }))
    .expect("SigningSecret");
    Api::<SigningSecret>::namespaced(kube.clone(), ns)
        .create(&PostParams::default(), &secret)
        .await
        .expect("creating the SigningSecret");
    let endpoint: WebhookEndpoint = serde_json::from_value(json!({
        "apiVersion": "herald.dev/v1alpha1", "kind": "WebhookEndpoint",
        "metadata": {"name": "orders"},
        "spec": {"url": rx.url("orders"), "eventTypes": ["order.*"], "secretRef": {"name": "keys"}}
    }))
    .expect("WebhookEndpoint");
    Api::<WebhookEndpoint>::namespaced(kube.clone(), ns)
        .create(&PostParams::default(), &endpoint)
        .await
        .expect("creating the WebhookEndpoint");

    // The operator (its identity) wrote the configuration.
    let config = jetstream::new(admin.clone())
        .get_key_value("herald-config")
        .await
        .expect("herald-config, as admin");
    let key = herald_core::dataplane::EndpointKey::new(ns, "orders").config_key();
    eventually("the endpoint configured in NATS", WAIT, || async {
        config.get(&key).await.ok()?.map(|_| ())
    })
    .await;

    // The producer of tenant-a publishes (acknowledged) until the dispatcher, whose
    // index may not hold the endpoint yet, delivers one.
    let producer = Watched::producer(env, "tenant-a").await;
    let js = jetstream::new(producer.client.clone());
    let deadline = Instant::now() + WAIT;
    let mut published = 0;
    while rx.received("orders").is_empty() {
        assert!(
            Instant::now() < deadline,
            "nothing delivered after {published} acknowledged publishes; exited: {:?}; logs {:?}",
            dispatchers.exited(),
            dispatchers.log_files()
        );
        let body = serde_json::to_vec(&json!({"type": "order.created", "data": {"n": published}}))
            .expect("event");
        js.publish(format!("herald.events.{ns}.order.created"), body.into())
            .await
            .expect("the producer's own publish")
            .await
            .expect("acknowledged by JetStream across the account boundary");
        published += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let got = rx.received("orders")[0].clone();
    assert_eq!(got.json()["type"], "order.created");
    assert!(got.header("webhook-id").starts_with("msg_"));
    assert!(got.header("webhook-signature").starts_with("v1,"));

    // A replay is checked against the event store's real retention: the operator's
    // identity reads the stream's configuration, never an event. A dry run of failed
    // events is carried out by the dispatcher's identity: it reads the endpoint's
    // attempt log and the range from the event store, and reports progress.
    let replays = Api::<WebhookReplay>::namespaced(kube.clone(), ns);
    let from = jiff::Timestamp::now() - jiff::SignedDuration::from_hours(1);
    let replay: WebhookReplay = serde_json::from_value(json!({
        "apiVersion": "herald.dev/v1alpha1", "kind": "WebhookReplay",
        "metadata": {"name": herald_e2e::unique_name("again")},
        "spec": {"endpoint": "orders", "from": from.to_string(), "dryRun": true,
                 "onlyFailed": true}
    }))
    .expect("WebhookReplay");
    let name = replays
        .create(&PostParams::default(), &replay)
        .await
        .expect("creating the WebhookReplay")
        .metadata
        .name
        .expect("a name");
    let matched = eventually("the dry-run WebhookReplay carried out", WAIT, || async {
        let status = replays.get(&name).await.ok()?.status?;
        let valid = status
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        let complete = status
            .conditions
            .iter()
            .any(|c| c.type_ == "Complete" && c.status == "True");
        (valid && complete).then_some(status.matched)
    })
    .await;
    assert_eq!(matched, Some(0), "the one event was delivered: none failed");
    let operator = Watched::connect(env, "operator").await;
    let retention =
        herald_core::dataplane::layout::event_retention(&jetstream::new(operator.client.clone()))
            .await
            .expect("the operator looks up the event store's retention");
    assert!(
        retention.is_some(),
        "the dispatcher created the event store"
    );
    let direct = "$JS.API.DIRECT.GET.HERALD_EVENTS";
    let _ = operator.client.request(direct, "{\"seq\":1}".into()).await;
    operator
        .refused("the operator reading an event", direct)
        .await;
    // It publishes Herald's operational events into a namespace, and no other event.
    let operational = format!("herald.events.{ns}.herald.endpoint.disabled");
    jetstream::new(operator.client.clone())
        .publish(
            operational,
            r#"{"type":"herald.endpoint.disabled","data":{}}"#.into(),
        )
        .await
        .expect("the operator publishes an operational event")
        .await
        .expect("the event store takes it");
    let forged = format!("herald.events.{ns}.order.created");
    let _ = operator.client.publish(forged.clone(), "{}".into()).await;
    let _ = operator.client.flush().await;
    operator
        .refused("the operator publishing a tenant's event", &forged)
        .await;

    // The HTTP API, as its own identity, reads the log and queues work.
    let webhook_id = got.header("webhook-id").to_owned();
    api_as_own_identity(env, ns, &rx, &webhook_id).await;

    // Let the dispatcher run its periodic work (purges, health, leases) for a while.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let exited = [dispatchers.exited(), operators.exited()].concat();
    dispatchers.stop_all().await;
    operators.stop_all().await;
    assert!(exited.is_empty(), "exited on their own: {exited:?}");
    for name in ["herald-dispatcher", "herald-operator", "herald-api"] {
        let refused = violations_of(env, name);
        assert!(
            refused.is_empty(),
            "{name} needs more than examples/nats/herald-accounts.conf allows: {refused:#?}"
        );
    }
    // The server does log violations (the check above can fail): the producer's tests
    // below cause some; the name is in the lines it checks.
}

/// `herald-api` with `env`'s flags for the `api` identity (development mode, loopback:
/// this checks NATS, not RBAC): it lists and reads the endpoint's deliveries, takes an
/// event over HTTP, redelivers the delivered event, sends a test event and redrives;
/// it cannot read the signing keys.
async fn api_as_own_identity(env: &'static TestEnv, ns: &str, rx: &Receiver, webhook_id: &str) {
    let port = free_port();
    let flags = env.nats_flags("api");
    let log = std::fs::File::create(env.nats_log().with_file_name("herald-api-secure.log"))
        .expect("a log file");
    let mut child = Command::new(herald_e2e::workspace_binary("herald-api"))
        .args(["--nats-url", env.nats_url(), "--insecure-dev-no-auth"])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(&flags)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("starting herald-api");
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}/v1/namespaces/{ns}");
    let call = |method: reqwest::Method, path: String, body: Option<&'static str>| {
        let mut request = http.request(method, format!("{base}{path}"));
        if let Some(body) = body {
            request = request.header("idempotency-key", "secure-1").body(body);
        }
        async move {
            let response = request.send().await.ok()?;
            let status = response.status().as_u16();
            Some((status, response.text().await.unwrap_or_default()))
        }
    };
    eventually("herald-api lists the delivery", WAIT, || async {
        let (status, body) = call(
            reqwest::Method::GET,
            "/endpoints/orders/deliveries".into(),
            None,
        )
        .await?;
        (status == 200 && body.contains(webhook_id)).then_some(())
    })
    .await;
    let calls = [
        (
            reqwest::Method::GET,
            format!("/endpoints/orders/deliveries/{webhook_id}"),
            None,
            200,
        ),
        (
            reqwest::Method::POST,
            "/events".into(),
            Some(r#"{"type":"order.created","data":1}"#),
            202,
        ),
        (
            reqwest::Method::POST,
            format!("/endpoints/orders/redeliver/{webhook_id}"),
            None,
            202,
        ),
        (
            reqwest::Method::POST,
            "/endpoints/orders/test".into(),
            None,
            202,
        ),
        (
            reqwest::Method::POST,
            "/endpoints/orders/redrive-dead".into(),
            None,
            202,
        ),
    ];
    for (method, path, body, expected) in calls {
        let answer = call(method.clone(), path.clone(), body).await;
        assert_eq!(
            answer.as_ref().map(|a| a.0),
            Some(expected),
            "{method} {path}: {answer:?}"
        );
    }
    eventually("the redelivery received", WAIT, || async {
        let n = rx
            .received("orders")
            .iter()
            .filter(|r| r.header("webhook-id") == webhook_id)
            .count();
        (n >= 2).then_some(())
    })
    .await;
    let _ = child.kill();
    let _ = child.wait();
    let api = Watched::connect(env, "api").await;
    let keys = format!("$JS.API.DIRECT.GET.KV_herald-config.$KV.herald-config.key.{ns}.keys");
    let _ = api.client.request(keys.clone(), "".into()).await;
    api.refused("the API reading signing keys", &keys).await;
    // Nor an endpoint's values from Secrets (header credentials, client keys).
    let credentials =
        format!("$JS.API.DIRECT.GET.KV_herald-config.$KV.herald-config.cred.{ns}.orders");
    let _ = api.client.request(credentials.clone(), "".into()).await;
    api.refused("the API reading endpoint credentials", &credentials)
        .await;
}

#[tokio::test]
async fn a_producer_may_publish_its_own_events_and_nothing_else() {
    let env = private_secure_env();
    let admin = env.nats().await;
    let admin_js = jetstream::new(admin.clone());
    // The layout exists (as a dispatcher would create it).
    herald_e2e::dataplane::DataPlane::new(admin.clone()).await;
    let producer = Watched::producer(env, "tenant-a").await;
    let js = jetstream::new(producer.client.clone());
    let unique = herald_e2e::unique_name("probe").replace('-', "_");

    // Its own namespace: acknowledged, and stored.
    let own = format!("herald.events.tenant-a.{unique}.own");
    let body = serde_json::to_vec(&json!({"type": format!("{unique}.own"), "data": {}})).unwrap();
    let ack = js
        .publish(own.clone(), body.clone().into())
        .await
        .expect("publish")
        .await
        .expect("its own namespace is acknowledged");
    let mut events = admin_js.get_stream("HERALD_EVENTS").await.expect("events");
    let stored = events.get_raw_message(ack.sequence).await.expect("stored");
    let own_type = format!("{unique}.own");
    assert_eq!(
        parse_event_subject(stored.subject.as_str()),
        Some(("tenant-a", own_type.as_str()))
    );

    // Another namespace: no acknowledgement, nothing stored.
    let other = format!("herald.events.tenant-b.{unique}.other");
    let ack = js.publish(other.clone(), body.into()).await;
    let acked = match ack {
        Ok(ack) => ack.await.is_ok(),
        Err(_) => false,
    };
    assert!(!acked, "a publish into tenant-b was acknowledged");
    producer.refused("publishing into tenant-b", &other).await;
    // Where it would be stored: tenant-b's partition.
    let stored_other = format!(
        "herald.stored.{}.tenant-b.{unique}.other",
        partition_of("tenant-b", herald_e2e::dataplane::TEST_SHARDS)
    );
    assert!(
        events
            .get_last_raw_message_by_subject(&stored_other)
            .await
            .is_err(),
        "the event for tenant-b was stored"
    );

    // herald-config (the signing keys): no bucket, no direct read, no subscription.
    assert!(js.get_key_value("herald-config").await.is_err());
    producer
        .refused(
            "opening herald-config",
            "$JS.API.STREAM.INFO.KV_herald-config",
        )
        .await;
    let direct = "$JS.API.DIRECT.GET.KV_herald-config.$KV.herald-config.key.tenant-b.keys";
    assert!(producer.client.request(direct, "".into()).await.is_err());
    producer.refused("reading a key set", direct).await;
    let mut watch = producer
        .client
        .subscribe("$KV.herald-config.>")
        .await
        .expect("subscribe is sent");
    producer
        .refused("watching herald-config", "$KV.herald-config.>")
        .await;
    let config = admin_js
        .get_key_value("herald-config")
        .await
        .expect("config");
    config
        .put(format!("probe.{unique}"), "x".into())
        .await
        .expect("admin writes");
    let seen = tokio::time::timeout(Duration::from_secs(1), watch.next()).await;
    assert!(
        !matches!(seen, Ok(Some(_))),
        "the producer saw a write to herald-config"
    );
    config
        .purge(format!("probe.{unique}"))
        .await
        .expect("clean up");

    // Another tenant's lane: neither a subscription nor a consumer.
    let mut lanes = producer
        .client
        .subscribe("herald.q.>")
        .await
        .expect("subscribe is sent");
    producer.refused("reading the lanes", "herald.q.>").await;
    assert!(js.get_stream("HERALD_DELIVERIES").await.is_err());
    let create = "$JS.API.CONSUMER.CREATE.HERALD_DELIVERIES.spy.herald.q.>";
    assert!(
        producer
            .client
            .request(create, r#"{"stream_name":"HERALD_DELIVERIES","config":{"name":"spy","filter_subject":"herald.q.>","ack_policy":"none"}}"#.into())
            .await
            .is_err()
    );
    producer.refused("a consumer on the lanes", create).await;
    let lane = "herald.q.0.tenant-b.orders.new";
    admin
        .publish(lane, "lane message".into())
        .await
        .expect("admin publishes");
    admin.flush().await.expect("flush");
    let seen = tokio::time::timeout(Duration::from_secs(1), lanes.next()).await;
    assert!(!matches!(seen, Ok(Some(_))), "the producer read a lane");

    // Purging (or deleting) a stream.
    let before = events.info().await.expect("info").state.messages;
    assert!(before > 0);
    for subject in [
        "$JS.API.STREAM.PURGE.HERALD_EVENTS",
        "$JS.API.STREAM.DELETE.HERALD_EVENTS",
    ] {
        assert!(producer.client.request(subject, "".into()).await.is_err());
        producer.refused("purging the event store", subject).await;
    }
    let after = events.info().await.expect("info").state.messages;
    assert!(
        after >= before,
        "the event store lost messages: {before} → {after}"
    );
}

#[tokio::test]
async fn a_producer_receives_only_its_own_acknowledgements() {
    own_acknowledgements_only(private_secure_env()).await;
}

#[tokio::test]
async fn in_jwt_mode_a_producer_receives_only_its_own_acknowledgements() {
    own_acknowledgements_only(private_jwt_env()).await;
}

/// Producers share the account `PRODUCERS`; each receives JetStream's acknowledgements on
/// its own inbox prefix `_INBOX.<ns>`. Tenant A is refused `_INBOX.>` and tenant B's
/// prefix and sees none of B's acknowledgements, while its own still arrive; a client
/// left on the shared default prefix gets no acknowledgement (its subscription is
/// refused), so a producer set up the old way fails visibly instead of reading others'.
async fn own_acknowledgements_only(env: &'static TestEnv) {
    let admin = env.nats().await;
    herald_e2e::dataplane::DataPlane::new(admin.clone()).await;
    let spy = Watched::producer(env, "tenant-a").await;
    let victim = Watched::producer(env, "tenant-b").await;
    let unique = herald_e2e::unique_name("inbox").replace('-', "_");
    let body = |ns: &str| {
        serde_json::to_vec(&json!({"type": format!("{unique}.{ns}"), "data": {}}))
            .expect("json")
            .into()
    };

    let mut every_inbox = spy
        .client
        .subscribe("_INBOX.>")
        .await
        .expect("subscribe is sent");
    spy.refused("every producer's inbox", "_INBOX.>").await;
    let mut their_inbox = spy
        .client
        .subscribe("_INBOX.tenant-b.>")
        .await
        .expect("subscribe is sent");
    spy.refused("tenant-b's inbox", "_INBOX.tenant-b.>").await;

    let victim_js = jetstream::new(victim.client.clone());
    for _ in 0..5 {
        victim_js
            .publish(format!("herald.events.tenant-b.{unique}.probe"), body("b"))
            .await
            .expect("publish")
            .await
            .expect("tenant-b's publish is acknowledged on its own inbox");
    }
    for (what, subscription) in [
        ("_INBOX.>", &mut every_inbox),
        ("_INBOX.tenant-b.>", &mut their_inbox),
    ] {
        let seen = tokio::time::timeout(Duration::from_secs(1), subscription.next()).await;
        assert!(
            !matches!(seen, Ok(Some(_))),
            "tenant-a read one of tenant-b's acknowledgements on {what}"
        );
    }
    jetstream::new(spy.client.clone())
        .publish(format!("herald.events.tenant-a.{unique}.probe"), body("a"))
        .await
        .expect("publish")
        .await
        .expect("tenant-a's own publish is still acknowledged");

    // The shared default prefix: the subscription for replies is refused, so the publish
    // is never acknowledged (the server stores it; the producer's retry is deduplicated).
    let shared = Watched::connect(env, "producer-tenant-a").await;
    let mut js = jetstream::new(shared.client.clone());
    js.set_timeout(Duration::from_secs(2));
    let acked = match js
        .publish(format!("herald.events.tenant-a.{unique}.shared"), body("a"))
        .await
    {
        Ok(ack) => ack.await.is_ok(),
        Err(_) => false,
    };
    assert!(!acked, "a reply reached the shared prefix _INBOX");
    let errors = shared.errors.lock().unwrap().clone();
    assert!(
        errors.iter().any(|e| e
            .to_lowercase()
            .contains("permissions violation for subscription to \"_inbox.")),
        "the server did not refuse the shared inbox: {errors:?}"
    );
}

#[tokio::test]
async fn clients_without_the_cas_certificate_or_a_known_nkey_are_refused() {
    let env = private_secure_env();
    let dir = env.nats_secure_dir().expect("a secure environment");
    herald_dispatcher::install_crypto_provider();
    let seed = std::fs::read_to_string(dir.join("admin.nk")).expect("seed");
    let seed = seed.trim().to_owned();
    let attempt = |options: async_nats::ConnectOptions| async move {
        tokio::time::timeout(Duration::from_secs(10), options.connect(env.nats_url()))
            .await
            .map(|r| r.map(|_| ()))
    };
    // The control: with everything, the connection works.
    assert!(matches!(attempt(env.nats_as("admin")).await, Ok(Ok(()))));
    let cases = [
        (
            "no client certificate",
            async_nats::ConnectOptions::new()
                .add_root_certificates(dir.join("ca.pem"))
                .require_tls(true)
                .nkey(seed.clone()),
        ),
        (
            "a client certificate of another CA",
            async_nats::ConnectOptions::new()
                .add_root_certificates(dir.join("ca.pem"))
                .add_client_certificate(dir.join("stranger.crt"), dir.join("stranger.key"))
                .require_tls(true)
                .nkey(seed.clone()),
        ),
        (
            "no NKey",
            async_nats::ConnectOptions::new()
                .add_root_certificates(dir.join("ca.pem"))
                .add_client_certificate(dir.join("admin.crt"), dir.join("admin.key"))
                .require_tls(true),
        ),
        (
            "without the server's CA",
            async_nats::ConnectOptions::new()
                .add_client_certificate(dir.join("admin.crt"), dir.join("admin.key"))
                .require_tls(true)
                .nkey(seed.clone()),
        ),
    ];
    for (what, options) in cases {
        let result = attempt(options).await;
        assert!(
            matches!(result, Ok(Err(_))),
            "{what}: expected a refused connection, got {result:?}"
        );
    }
}

#[tokio::test]
async fn herald_delivers_with_credentials_files_in_jwt_mode() {
    let env = private_jwt_env();
    assert!(env.nats_jwt(), "not an operator-mode environment");
    let flags = env.nats_flags("dispatcher");
    assert!(
        flags.iter().any(|f| f == "--nats-creds") && !flags.iter().any(|f| f == "--nats-nkey"),
        "{flags:?}"
    );
    deliver_as_own_identities(env).await;
}

#[tokio::test]
async fn in_jwt_mode_a_producers_credentials_reach_its_events_and_not_the_keys() {
    let env = private_jwt_env();
    let admin = env.nats().await;
    let admin_js = jetstream::new(admin.clone());
    herald_e2e::dataplane::DataPlane::new(admin.clone()).await;
    let producer = Watched::producer(env, "tenant-a").await;
    let js = jetstream::new(producer.client.clone());
    let unique = herald_e2e::unique_name("probe").replace('-', "_");

    // Its own namespace: acknowledged across the account boundary (the import with its
    // activation token), and stored.
    let own = format!("herald.events.tenant-a.{unique}.own");
    let body = serde_json::to_vec(&json!({"type": format!("{unique}.own"), "data": {}})).unwrap();
    let ack = js
        .publish(own.clone(), body.clone().into())
        .await
        .expect("publish")
        .await
        .expect("its own namespace is acknowledged");
    let events = admin_js.get_stream("HERALD_EVENTS").await.expect("events");
    let stored = events.get_raw_message(ack.sequence).await.expect("stored");
    let own_type = format!("{unique}.own");
    assert_eq!(
        parse_event_subject(stored.subject.as_str()),
        Some(("tenant-a", own_type.as_str()))
    );

    // Another namespace, and herald-config: refused by the user JWT's permissions.
    let other = format!("herald.events.tenant-b.{unique}.other");
    let acked = match js.publish(other.clone(), body.into()).await {
        Ok(ack) => ack.await.is_ok(),
        Err(_) => false,
    };
    assert!(!acked, "a publish into tenant-b was acknowledged");
    producer.refused("publishing into tenant-b", &other).await;
    assert!(js.get_key_value("herald-config").await.is_err());
    producer
        .refused(
            "opening herald-config",
            "$JS.API.STREAM.INFO.KV_herald-config",
        )
        .await;
    let direct = "$JS.API.DIRECT.GET.KV_herald-config.$KV.herald-config.key.tenant-b.keys";
    assert!(producer.client.request(direct, "".into()).await.is_err());
    producer.refused("reading a key set", direct).await;

    // The seed alone (no user JWT) does not log in: the server really is in JWT mode.
    let dir = env.nats_secure_dir().expect("a secure environment");
    let seed = std::fs::read_to_string(dir.join("admin.nk")).expect("seed");
    let nkey_only = async_nats::ConnectOptions::new()
        .add_root_certificates(dir.join("ca.pem"))
        .add_client_certificate(dir.join("admin.crt"), dir.join("admin.key"))
        .require_tls(true)
        .nkey(seed.trim().to_owned());
    let result =
        tokio::time::timeout(Duration::from_secs(10), nkey_only.connect(env.nats_url())).await;
    assert!(
        matches!(result, Ok(Err(_))),
        "an NKey without its JWT: expected a refused connection, got {:?}",
        result.map(|r| r.map(|_| ()))
    );
}

/// Output of `bin args` with `env`, killed after `run_for` if still running.
fn run(bin: &str, args: &[&str], env: &[(&str, &str)], run_for: Duration) -> String {
    let mut child = Command::new(bin)
        .args(args)
        .env_remove("HERALD_NATS_URL")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the binary");
    let deadline = Instant::now() + run_for;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let out = child.wait_with_output().expect("output");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn a_password_in_the_nats_url_is_never_printed() {
    let password = "hunter2-do-not-print";
    let port = free_port();
    let url = format!("nats://herald:{password}@127.0.0.1:{port}");
    for bin in [DISPATCHER, OPERATOR] {
        let help = run(
            bin,
            &["--help"],
            &[("HERALD_NATS_URL", &url)],
            Duration::from_secs(10),
        );
        assert!(help.contains("--nats-nkey"), "{help}");
        assert!(help.contains("--nats-tls-ca"), "{help}");
        assert!(
            !help.contains(password),
            "--help of {bin} printed it:\n{help}"
        );
    }
    // A URL that does not parse: the dispatcher exits with an error naming the entry.
    let bad = format!("nats://herald:{password}@[::1");
    let error = run(
        DISPATCHER,
        &["--listen", "127.0.0.1:0"],
        &[("HERALD_NATS_URL", &bad)],
        Duration::from_secs(10),
    );
    assert!(error.contains("entry 1 of --nats-url"), "{error}");
    assert!(!error.contains(password), "the error printed it:\n{error}");
    // Nothing listens on the port: the dispatcher retries, logging every attempt (with
    // async-nats at debug level, which prints server addresses).
    let logs = run(
        DISPATCHER,
        &["--listen", "127.0.0.1:0"],
        &[("HERALD_NATS_URL", &url), ("RUST_LOG", "debug")],
        Duration::from_secs(4),
    );
    assert!(
        logs.contains(&format!("{port}")),
        "the logs do not show connection attempts:\n{logs}"
    );
    assert!(!logs.contains(password), "the logs printed it:\n{logs}");
}
