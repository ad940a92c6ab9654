//! Every `kubectl herald` command against the real environment, run as a tenant runs
//! it: the plugin binary (`kubectl-herald`) with a kubeconfig whose identity is a
//! ServiceAccount token from a TokenRequest, bound to the chart's
//! `herald-delivery-operator` ClusterRole (the delivery log and redelivery of Herald's
//! API) and to a Role for Herald's resources. The operator, a dispatcher and Herald's
//! HTTP API (`herald-api`) run as processes; a receiver on loopback records what is
//! delivered.
//!
//! Needs the workspace's binaries (`cargo build -p kubectl-herald -p herald-api`, or
//! `cargo build --workspace --bins` as `make test` does).

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write as _};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use herald_core::v1alpha1::{SigningSecret, WebhookEndpoint, WebhookReplay};
use herald_e2e::dataplane::DataPlane;
use herald_e2e::faults::{Dispatchers, Operators};
use herald_e2e::helm::{documents, template};
use herald_e2e::receiver::{Behavior, Received, Receiver};
use herald_e2e::{TestContext, env, eventually, free_port, workspace_binary};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, Role, RoleBinding};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use kube::config::Kubeconfig;
use serde_json::{Value, json};

const DISPATCHER: &str = env!("CARGO_BIN_EXE_herald-test-dispatcher");
const OPERATOR: &str = env!("CARGO_BIN_EXE_herald-test-operator");
const WAIT: Duration = Duration::from_secs(90);

/// What a run of the plugin printed.
#[derive(Debug)]
struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// One test's tenant: its namespace, the processes, a receiver, and a kubeconfig with
/// the tenant's token.
struct Tenant {
    ctx: TestContext,
    rx: Receiver,
    dp: DataPlane,
    kubeconfig: PathBuf,
    token: String,
    /// Probe events (`order.probe`) published until the endpoint delivered one (the
    /// ones before that may have found no configuration yet).
    probes: u64,
    api_url: String,
    _operators: Operators,
    _dispatchers: Dispatchers,
}

impl Tenant {
    /// A namespace with a SigningSecret and a WebhookEndpoint `orders` (final 400s, a
    /// fast retry), configured and delivering; the tenant's ServiceAccount and token.
    async fn new(prefix: &str, behavior: Behavior) -> Self {
        let ctx = TestContext::new(prefix).await;
        let ns = ctx.namespace.clone();
        let mut operators = Operators::new(OPERATOR, env(), &ns, prefix);
        operators.start("op0");
        let mut dispatchers = Dispatchers::new(DISPATCHER, env().nats_url(), prefix);
        dispatchers.start("d0");
        let rx = Receiver::start().await;
        rx.behave("orders", behavior);
        let dp = DataPlane::new(ctx.nats.clone()).await;
        let secret: SigningSecret = serde_json::from_value(json!({
            "apiVersion": "herald.dev/v1alpha1", "kind": "SigningSecret",
            "metadata": {"name": "orders"}, "spec": {}
        }))
        .unwrap();
        ctx.api::<SigningSecret>()
            .create(&PostParams::default(), &secret)
            .await
            .expect("creating the SigningSecret");
        let endpoint: WebhookEndpoint = serde_json::from_value(json!({
            "apiVersion": "herald.dev/v1alpha1", "kind": "WebhookEndpoint",
            "metadata": {"name": "orders"},
            "spec": {"url": rx.url("orders"), "eventTypes": ["order.*"],
                     "secretRef": {"name": "orders"},
                     "delivery": {"finalStatusCodes": [400], "retry": {"schedule": ["1s"]}}}
        }))
        .unwrap();
        ctx.api::<WebhookEndpoint>()
            .create(&PostParams::default(), &endpoint)
            .await
            .expect("creating the WebhookEndpoint");
        // Delivering once a probe (data 1: answered 200 by every behaviour here) arrives.
        let probes = Arc::new(AtomicU64::new(0));
        eventually("the endpoint delivering", WAIT, || {
            let (dp, rx, ns, probes) = (dp.clone(), rx.clone(), ns.clone(), probes.clone());
            async move {
                if rx.request_count("orders") == 0 {
                    dp.publish(&ns, "order.probe", json!(1)).await;
                    probes.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                (rx.request_count("orders") > 0).then_some(())
            }
        })
        .await;
        let probes = probes.load(Ordering::SeqCst);
        let token = tenant_token(&ctx).await;
        let kubeconfig = write_kubeconfig(&ns, &token);
        Self {
            ctx,
            rx,
            dp,
            kubeconfig,
            token,
            probes,
            api_url: String::new(),
            _operators: operators,
            _dispatchers: dispatchers,
        }
    }

    /// `kubectl herald <args>` as the tenant, `stdin` piped in.
    async fn herald_with(&self, args: &[&str], stdin: &[u8]) -> Run {
        let mut cmd = Command::new(workspace_binary("kubectl-herald"));
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .env_remove("KUBECONFIG")
            .env_remove("HERALD_TOKEN")
            .env_remove("WEBHOOK_SECRET")
            .env("HERALD_API_URL", &self.api_url);
        run(cmd, stdin.to_vec()).await
    }

    async fn herald(&self, args: &[&str]) -> Run {
        self.herald_with(args, b"").await
    }

    fn ns(&self) -> &str {
        &self.ctx.namespace
    }
}

/// Runs a command off the test's runtime (the receiver answers on it meanwhile).
async fn run(mut cmd: Command, stdin: Vec<u8>) -> Run {
    let output = tokio::task::spawn_blocking(move || {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting kubectl-herald");
        let mut pipe = child.stdin.take().unwrap();
        let _ = pipe.write_all(&stdin);
        drop(pipe);
        child.wait_with_output().expect("kubectl-herald output")
    })
    .await
    .unwrap();
    let run = Run {
        ok: output.status.success(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    };
    eprintln!("kubectl herald: {run:?}");
    run
}

/// A ServiceAccount `tenant` bound in its namespace to the chart's ClusterRole
/// `herald-delivery-operator` (the delivery log, redeliver, redrive-dead, test; taken
/// from `helm template`, applied once for the whole environment) and to a Role for
/// Herald's resources as a tenant team has it; a token for it from a TokenRequest.
async fn tenant_token(ctx: &TestContext) -> String {
    let rendered = template("herald", &ctx.namespace, &["api.enabled=true"]);
    let cluster_role = documents(&rendered)
        .into_iter()
        .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == "herald-delivery-operator")
        .expect("the chart's herald-delivery-operator ClusterRole");
    let cluster_role: ClusterRole = serde_json::from_value(cluster_role).unwrap();
    Api::<ClusterRole>::all(ctx.client.clone())
        .patch(
            "herald-delivery-operator",
            &PatchParams::apply("herald-e2e-plugin").force(),
            &Patch::Apply(&cluster_role),
        )
        .await
        .expect("applying the chart's ClusterRole");
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": "herald-resources"},
        "rules": [
            {"apiGroups": ["herald.dev"], "resources": ["webhookendpoints"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["herald.dev"], "resources": ["webhookreplays"],
             "verbs": ["get", "list", "watch", "create"]},
            {"apiGroups": ["herald.dev"], "resources": ["signingsecrets"],
             "verbs": ["get", "list", "watch", "patch"]}
        ]
    }))
    .unwrap();
    ctx.api::<Role>()
        .create(&PostParams::default(), &role)
        .await
        .expect("creating the Role");
    for (name, kind) in [
        ("herald-delivery-operator", "ClusterRole"),
        ("herald-resources", "Role"),
    ] {
        let binding: RoleBinding = serde_json::from_value(json!({
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": ctx.namespace}]
        }))
        .unwrap();
        ctx.api::<RoleBinding>()
            .create(&PostParams::default(), &binding)
            .await
            .expect("creating a RoleBinding");
    }
    let sa: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "tenant"}})).unwrap();
    let accounts = ctx.api::<ServiceAccount>();
    accounts
        .create(&PostParams::default(), &sa)
        .await
        .expect("creating the ServiceAccount");
    let request: TokenRequest =
        serde_json::from_value(json!({"spec": {"expirationSeconds": 3600}})).unwrap();
    let answer = accounts
        .create_token_request("tenant", &PostParams::default(), &request)
        .await
        .expect("a TokenRequest");
    answer.status.and_then(|s| s.token).expect("a token")
}

/// A kubeconfig for the environment's API server with `token` as the identity and
/// `namespace` as the context's namespace.
fn write_kubeconfig(namespace: &str, token: &str) -> PathBuf {
    write_kubeconfig_as(namespace, json!({ "token": token }), "tenant")
}

/// A kubeconfig for the environment's API server with `user` (a kubeconfig `user`
/// entry) as the identity and `namespace` as the context's namespace.
fn write_kubeconfig_as(namespace: &str, user: Value, label: &str) -> PathBuf {
    let admin = Kubeconfig::read_from(env().kubeconfig()).expect("the admin kubeconfig");
    let cluster = admin.clusters[0].cluster.clone().expect("a cluster");
    let kubeconfig = json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "tenant",
        "clusters": [{"name": "testenv", "cluster": cluster}],
        "contexts": [{"name": "tenant",
                      "context": {"cluster": "testenv", "user": "tenant", "namespace": namespace}}],
        "users": [{"name": "tenant", "user": user}],
    });
    let path = std::env::temp_dir().join(format!("herald-plugin-{namespace}-{label}.kubeconfig"));
    std::fs::write(&path, serde_json::to_string(&kubeconfig).unwrap()).unwrap();
    path
}

/// A delivered request written back as raw HTTP, as a capture has it.
fn raw_request(r: &Received, body: &[u8]) -> Vec<u8> {
    let mut text = format!("POST /{} HTTP/1.1\r\n", r.path.trim_start_matches('/'));
    for (name, value) in &r.headers {
        if name != "content-length" {
            text.push_str(&format!("{name}: {value}\r\n"));
        }
    }
    text.push_str(&format!("content-length: {}\r\n\r\n", body.len()));
    let mut raw = text.into_bytes();
    raw.extend_from_slice(body);
    raw
}

/// `verify`, `replay --dry-run`, `rotate` and `endpoints`: the commands that need no
/// Herald API.
#[tokio::test]
async fn replay_rotate_verify_and_endpoints() {
    let tenant = Tenant::new("plugin-res", Behavior::default()).await;
    let ns = tenant.ns().to_owned();
    let before = tenant.rx.distinct_count("orders");
    for i in 0..5 {
        tenant.dp.publish(&ns, "order.created", json!(i)).await;
    }
    tenant.dp.publish(&ns, "invoice.paid", json!(0)).await; // not the endpoint's
    eventually("the events delivered", WAIT, || async {
        (tenant.rx.distinct_count("orders") >= before + 5).then_some(())
    })
    .await;
    // Every order.* event is in the event store, also probes published before the
    // dispatcher had the endpoint's configuration (not delivered, counted by a replay).
    let published = tenant.probes as usize + 5;

    // verify: a request the receiver captured, with the tenant's secret.
    let secrets: Api<Secret> = tenant.ctx.api();
    let secret = secrets.get("orders").await.expect("the generated Secret");
    let whsec = String::from_utf8(secret.data.unwrap()["current"].0.clone()).unwrap();
    let request = tenant.rx.received("orders").pop().unwrap();
    let raw = raw_request(&request, &request.body);
    let valid = tenant
        .herald_with(&["verify", "--secret", &whsec], &raw)
        .await;
    assert!(valid.ok, "{valid:?}");
    let id = request.header("webhook-id");
    assert!(
        valid
            .stdout
            .starts_with(&format!("valid: webhook-id {id} signed by key ")),
        "{valid:?}"
    );
    let mut tampered = request.body.to_vec();
    tampered.extend_from_slice(b" ");
    let invalid = tenant
        .herald_with(
            &["verify", "--secret", &whsec],
            &raw_request(&request, &tampered),
        )
        .await;
    assert!(!invalid.ok);
    assert_eq!(
        invalid.stdout.trim(),
        "invalid: no signature matches any of the keys"
    );
    let other = herald_core::signing::to_whsec(&[9u8; 32]);
    let wrong = tenant
        .herald_with(&["verify", "--secret", &other], &raw)
        .await;
    assert!(
        !wrong.ok && wrong.stdout.starts_with("invalid:"),
        "{wrong:?}"
    );

    // replay --dry-run follows the WebhookReplay to completion with the right count.
    let replay = tenant
        .herald(&[
            "replay",
            "orders",
            "--from",
            "10m",
            "--type",
            "order.*",
            "--dry-run",
            "--name",
            "dry",
        ])
        .await;
    assert!(replay.ok, "{replay:?}");
    assert!(
        replay
            .stdout
            .contains("webhookreplay.herald.dev/dry created"),
        "{replay:?}"
    );
    let last = replay.stdout.lines().last().unwrap_or_default().to_owned();
    let fields: Vec<&str> = last.split_whitespace().collect();
    assert_eq!(fields.get(1), Some(&"Completed"), "{replay:?}");
    assert_eq!(
        fields.get(2),
        Some(&published.to_string().as_str()),
        "matched: {replay:?}"
    );
    let status = tenant
        .ctx
        .api::<WebhookReplay>()
        .get("dry")
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(status.matched, Some(published as u64));

    // rotate: the status shows a new key.
    let signing: Api<SigningSecret> = tenant.ctx.api();
    let active_key = || async {
        let status = signing.get("orders").await.unwrap().status.unwrap();
        status.active_key_id.unwrap()
    };
    let old = active_key().await;
    let rotated = tenant.herald(&["rotate", "orders"]).await;
    assert!(rotated.ok, "{rotated:?}");
    let new = active_key().await;
    assert_ne!(new, old);
    assert!(
        rotated
            .stdout
            .contains(&format!("active key {new} (was {old})")),
        "{rotated:?}"
    );

    // endpoints: the table with the endpoint's state (Active once the operator wrote
    // the dispatcher's first health report into the status).
    eventually("the endpoint listed as Active", WAIT, || async {
        let list = tenant.herald(&["endpoints"]).await;
        assert!(list.ok, "{list:?}");
        let header = list.stdout.lines().next().unwrap_or_default().to_owned();
        assert!(header.starts_with("NAME     STATE "), "{list:?}");
        let row = list
            .stdout
            .lines()
            .find(|l| l.starts_with("orders "))
            .map(str::to_owned);
        row.filter(|r| r.contains(" Active ")).map(|_| ())
    })
    .await;

    // RBAC: the tenant's identity has no rights elsewhere, and the plugin says so.
    let elsewhere = tenant.herald(&["endpoints", "-n", "default"]).await;
    assert!(!elsewhere.ok);
    assert!(elsewhere.stderr.contains("forbidden"), "{elsewhere:?}");
    tenant.ctx.cleanup().await;
}

/// A process that is killed when dropped (the test ends or panics).
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Herald's HTTP API as a process on a free loopback port, checking tokens and access
/// with the admin kubeconfig (TokenReview, SubjectAccessReview); ready once `/readyz`
/// answers 200. Its log is `herald-plugin-<label>-api.log` in the temp dir.
async fn start_api(label: &str) -> (Killed, String) {
    let port = free_port();
    let log = std::env::temp_dir().join(format!("herald-plugin-{label}-api.log"));
    let log = std::fs::File::create(&log).expect("the API's log");
    let child = Command::new(workspace_binary("herald-api"))
        .args(["--nats-url", env().nats_url()])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .arg("--kubeconfig")
        .arg(env().kubeconfig())
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("starting herald-api");
    let api = Killed(child);
    let url = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    eventually("herald-api ready", WAIT, || async {
        let answer = http.get(format!("{url}/readyz")).send().await.ok()?;
        answer.status().is_success().then_some(())
    })
    .await;
    (api, url)
}

/// Lines a running command prints, collected by a thread as they come.
fn collect_lines(stream: impl std::io::Read + Send + 'static) -> Arc<Mutex<Vec<String>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let theirs = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            theirs.lock().unwrap().push(line);
        }
    });
    lines
}

/// `deliveries`, `attempts`, `redeliver`, `redrive-dead`, `test` and `tail` through the
/// real Herald API with the tenant's token; refusals show the API's message.
#[tokio::test]
async fn the_delivery_log_and_redelivery_through_the_api() {
    // The first request of events 0 and 3 answers a final 400: two dead deliveries.
    let mut tenant = Tenant::new("plugin-api", Behavior::fail_first_of_every(3, 400)).await;
    let (_api, url) = start_api("plugin-api").await;
    tenant.api_url = url;
    let ns = tenant.ns().to_owned();
    for i in 0..6 {
        tenant.dp.publish(&ns, "order.created", json!(i)).await;
    }
    // (Probes are left out of the counts: those that found no configuration yet were
    // never the endpoint's deliveries, and a late one may still arrive.)
    let created = |rx: &Receiver| {
        let received = rx.received("orders");
        let ids: HashSet<&str> = received
            .iter()
            .filter(|r| r.json()["type"] == "order.created")
            .map(|r| r.header("webhook-id"))
            .collect();
        ids.len()
    };
    eventually("every event attempted, two dead", WAIT, || async {
        let attempts = tenant.dp.attempts(&ns, "orders").await;
        let dead = attempts.iter().filter(|a| a["state"] == "dead").count();
        (dead == 2 && created(&tenant.rx) == 6).then_some(())
    })
    .await;
    let id_of = |data: i64| {
        tenant
            .rx
            .received("orders")
            .iter()
            .find(|r| r.json()["data"] == json!(data))
            .map(|r| r.header("webhook-id").to_owned())
            .unwrap()
    };
    let (dead0, dead3) = (id_of(0), id_of(3));

    // deliveries: the table, and the API's JSON.
    let table = tenant.herald(&["deliveries", "orders"]).await;
    assert!(table.ok, "{table:?}");
    let mut lines = table.stdout.lines();
    assert!(lines.next().unwrap().starts_with("EVENT ID "), "{table:?}");
    let rows: Vec<&str> = lines.filter(|l| l.contains(" order.created ")).collect();
    assert_eq!(rows.len(), 6, "{table:?}");
    assert_eq!(
        rows.iter().filter(|l| l.contains(" dead ")).count(),
        2,
        "{table:?}"
    );
    let wide = tenant.herald(&["deliveries", "orders", "-o", "wide"]).await;
    assert!(
        wide.stdout
            .lines()
            .next()
            .unwrap()
            .contains("LAST ATTEMPT TIME"),
        "{wide:?}"
    );
    let dead = tenant
        .herald(&[
            "deliveries",
            "orders",
            "--status",
            "dead",
            "--since",
            "1h",
            "-o",
            "json",
        ])
        .await;
    assert!(dead.ok, "{dead:?}");
    let dead: Value = serde_json::from_str(&dead.stdout).unwrap();
    let mut ids: Vec<&str> = dead["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["eventId"].as_str().unwrap())
        .collect();
    ids.sort();
    let mut want = [dead0.as_str(), dead3.as_str()];
    want.sort();
    assert_eq!(ids, want);
    let yaml = tenant
        .herald(&["deliveries", "orders", "--limit", "1", "-o", "yaml"])
        .await;
    assert!(yaml.ok && yaml.stdout.contains("eventId:"), "{yaml:?}");

    // attempts: the dead delivery's one attempt, answered 400.
    let attempts = tenant.herald(&["attempts", "orders", &dead0]).await;
    assert!(attempts.ok, "{attempts:?}");
    assert!(attempts.stdout.contains("State:     dead"), "{attempts:?}");
    let row = attempts
        .stdout
        .lines()
        .find(|l| l.starts_with("1 "))
        .unwrap_or_default();
    assert!(row.contains("400"), "{attempts:?}");

    // redeliver one, then redrive the other dead one: both arrive again, same id.
    let again = tenant.herald(&["redeliver", "orders", &dead0]).await;
    assert!(again.ok && again.stdout.contains(&dead0), "{again:?}");
    let redrive = tenant.herald(&["redrive-dead", "orders"]).await;
    assert!(redrive.ok, "{redrive:?}");
    eventually("both dead events delivered again", WAIT, || async {
        let received = tenant.rx.received("orders");
        let times = |id: &str| {
            received
                .iter()
                .filter(|r| r.header("webhook-id") == id)
                .count()
        };
        (times(&dead0) >= 2 && times(&dead3) >= 2).then_some(())
    })
    .await;

    // test: a test event reaches the endpoint.
    let test = tenant.herald(&["test", "orders", "-o", "json"]).await;
    assert!(test.ok, "{test:?}");
    let test: Value = serde_json::from_str(&test.stdout).unwrap();
    let test_id = test["eventId"].as_str().unwrap().to_owned();
    eventually("the test event delivered", WAIT, || async {
        let received = tenant.rx.received("orders");
        received
            .iter()
            .any(|r| r.header("webhook-id") == test_id)
            .then_some(())
    })
    .await;

    // tail: attempts made while it runs, one line each, until Ctrl-C.
    let mut tail = Command::new(workspace_binary("kubectl-herald"))
        .arg("--kubeconfig")
        .arg(&tenant.kubeconfig)
        .args(["tail", "orders"])
        .env("HERALD_API_URL", &tenant.api_url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = collect_lines(tail.stdout.take().unwrap());
    let err = collect_lines(tail.stderr.take().unwrap());
    eventually("tail's header", WAIT, || async {
        (!out.lock().unwrap().is_empty()).then_some(())
    })
    .await;
    for i in [1, 2] {
        tenant.dp.publish(&ns, "order.tailed", json!(i)).await;
    }
    let tailed = eventually("two attempts tailed", WAIT, || async {
        let lines = out.lock().unwrap().clone();
        let tailed: Vec<String> = lines
            .into_iter()
            .filter(|l| l.contains("order.tailed"))
            .collect();
        (tailed.len() >= 2).then_some(tailed)
    })
    .await;
    assert_eq!(tailed.len(), 2, "each attempt once: {tailed:?}");
    assert!(tailed.iter().all(|l| l.contains("succeeded")), "{tailed:?}");
    let _ = Command::new("kill")
        .args(["-INT", &tail.id().to_string()])
        .status();
    let status = tokio::task::spawn_blocking(move || tail.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(
        status.success(),
        "tail exits 0 on Ctrl-C: {status}; {:?}",
        err.lock().unwrap()
    );

    // Refusals: another namespace (403 from the API's SubjectAccessReview), and a
    // kubeconfig identity without a bearer token (as one with a client certificate).
    let elsewhere = tenant
        .herald(&["deliveries", "orders", "-n", "default"])
        .await;
    assert!(!elsewhere.ok);
    assert!(
        elsewhere.stderr.contains("may not list deliveries")
            && elsewhere.stderr.contains("HTTP 403"),
        "{elsewhere:?}"
    );
    let anonymous = write_kubeconfig_as(&ns, json!({}), "anonymous");
    let without = |extra: &[&str]| {
        let mut cmd = Command::new(workspace_binary("kubectl-herald"));
        cmd.arg("--kubeconfig")
            .arg(&anonymous)
            .args(["deliveries", "orders"])
            .args(extra)
            .env_remove("HERALD_TOKEN")
            .env("HERALD_API_URL", &tenant.api_url);
        cmd
    };
    let refused = run(without(&[]), Vec::new()).await;
    assert!(!refused.ok);
    assert!(
        refused.stderr.contains("has no bearer token") && refused.stderr.contains("--token"),
        "{refused:?}"
    );
    // ... which works with --token.
    let with_token = run(without(&["--token", &tenant.token]), Vec::new()).await;
    assert!(with_token.ok, "{with_token:?}");
    tenant.ctx.cleanup().await;
}
