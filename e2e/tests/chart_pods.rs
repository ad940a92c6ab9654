//! The chart's pods, run for real. The chart is installed (so its ServiceAccounts and
//! RBAC exist in the API server), and each workload's container is started the way its
//! pod would run it: the image's entrypoint and default arguments (read from the
//! `Dockerfile` stage that builds that image) unless the container overrides them, and
//! exactly the rendered environment — values, Secrets and the downward API resolved as
//! the kubelet would — with nothing inherited from the test process.
//!
//! What a pod network and a kubelet add is mapped, and only that: the container port
//! becomes a free port on 127.0.0.1 (each pod has its own 8080), and the operator's
//! in-cluster credentials become a kubeconfig holding a token of the chart's
//! ServiceAccount (`kubectl create token`), so it runs with the chart's RBAC, not as
//! admin. The dispatcher gets no Kubernetes credentials at all. Each becomes ready by
//! its own readiness probe, delivers an event end to end, and stops on SIGTERM within
//! its pod's `terminationGracePeriodSeconds`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use herald_core::v1alpha1::{SigningSecret, WebhookEndpoint};
use herald_e2e::dataplane::DataPlane;
use herald_e2e::helm::{chart_dir, documents, helm, ok};
use herald_e2e::receiver::Receiver;
use herald_e2e::{TestContext, TestEnv, env, eventually, private_jwt_env, repo_root, unique_name};
use kube::api::PostParams;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(90);

/// The `ENTRYPOINT` and `CMD` of the `Dockerfile` stage whose entrypoint is `binary`.
fn image_entrypoint(binary: &str) -> (Vec<String>, Vec<String>) {
    let dockerfile =
        std::fs::read_to_string(repo_root().join("Dockerfile")).expect("reading the Dockerfile");
    let json_list = |line: &str, instruction: &str| -> Option<Vec<String>> {
        serde_json::from_str(line.strip_prefix(instruction)?.trim()).ok()
    };
    for stage in dockerfile.split("\nFROM ") {
        let entrypoint = stage.lines().find_map(|l| json_list(l, "ENTRYPOINT"));
        if let Some(entrypoint) = entrypoint.filter(|e| e[0].ends_with(&format!("/{binary}"))) {
            let cmd = stage
                .lines()
                .find_map(|l| json_list(l, "CMD"))
                .unwrap_or_default();
            return (entrypoint, cmd);
        }
    }
    panic!("no Dockerfile stage runs {binary}");
}

/// The workspace binary an image's entrypoint names (cargo builds it beside the tests).
fn built_binary(image_path: &str) -> PathBuf {
    herald_e2e::workspace_binary(image_path.rsplit('/').next().unwrap_or(image_path))
}

/// A pod of the chart, started as a process.
struct Pod {
    name: String,
    child: Child,
    /// Where the container's port 8080 is reachable.
    port: u16,
    readiness_path: String,
    termination_grace: Duration,
    log: PathBuf,
}

impl Pod {
    /// Starts the first container of `workload` (a rendered Deployment or StatefulSet)
    /// of test environment `te` as pod `name`, with `credentials` (a kubeconfig) or none.
    fn start(
        te: &TestEnv,
        workload: &Value,
        name: &str,
        namespace: &str,
        credentials: Option<&PathBuf>,
    ) -> Self {
        let spec = &workload["spec"]["template"]["spec"];
        let container = &spec["containers"][0];
        let image = container["image"].as_str().expect("an image");
        let binary_name = image
            .rsplit('/')
            .next()
            .and_then(|n| n.split(':').next())
            .expect("an image name");
        let (entrypoint, cmd) = image_entrypoint(binary_name);
        let strings = |v: &Value| -> Option<Vec<String>> {
            v.as_array().map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_owned))
                    .collect()
            })
        };
        let command = strings(&container["command"]).unwrap_or(entrypoint);
        let mut args = strings(&container["args"]).unwrap_or(cmd);
        let port = herald_e2e::free_port();
        let container_port = container["ports"][0]["containerPort"]
            .as_u64()
            .unwrap_or(8080);
        let mut env = BTreeMap::new();
        for var in container["env"].as_array().into_iter().flatten() {
            let key = var["name"].as_str().expect("env name").to_owned();
            let value = resolve(te, var, name, namespace);
            env.insert(key, value);
        }
        // The pod network: the container's port on a loopback port of its own.
        for value in env.values_mut() {
            if *value == format!("0.0.0.0:{container_port}") {
                *value = format!("127.0.0.1:{port}");
            }
        }
        // The kubelet's mounts: each mounted Secret's keys as files in a directory of
        // this pod, and every value (environment, arguments) naming a path under the
        // mount path pointed there.
        let root = std::env::temp_dir().join(format!("herald-chart-pod-{namespace}-{name}-mounts"));
        let _ = std::fs::remove_dir_all(&root);
        for mount in container["volumeMounts"].as_array().into_iter().flatten() {
            let mount_path = mount["mountPath"].as_str().expect("a mountPath");
            let volume = spec["volumes"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|v| v["name"] == mount["name"])
                .unwrap_or_else(|| panic!("no volume for the mount {mount}"));
            let source = &volume["secret"];
            let secret = source["secretName"]
                .as_str()
                .unwrap_or_else(|| panic!("a volume the test does not map: {volume}"));
            assert!(
                source["items"].is_null(),
                "secret items not mapped: {volume}"
            );
            let dir = root.join(mount_path.trim_start_matches('/'));
            std::fs::create_dir_all(&dir).expect("a mount directory");
            let mut get = te.kubectl();
            get.args(["get", "secret", secret, "-n", namespace, "-o", "json"]);
            let object: Value = serde_json::from_str(&ok(get, None)).expect("a Secret");
            for (key, value) in object["data"].as_object().expect("the Secret's data") {
                let bytes = base64_decode(value.as_str().expect("base64 data"));
                std::fs::write(dir.join(key), bytes).expect("writing a mounted file");
            }
            for value in env.values_mut().chain(args.iter_mut()) {
                if let Some(rest) = value.strip_prefix(mount_path)
                    && rest.starts_with('/')
                {
                    *value = format!("{}{rest}", dir.display());
                }
            }
        }
        if let Some(kubeconfig) = credentials {
            env.insert("KUBECONFIG".into(), kubeconfig.display().to_string());
        }
        let log = std::env::temp_dir().join(format!("herald-chart-pod-{name}.log"));
        let file = std::fs::File::create(&log).expect("a log file");
        let child = Command::new(built_binary(&command[0]))
            .args(&command[1..])
            .args(&args)
            .env_clear()
            .envs(&env)
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log file"))
            .stderr(file)
            .spawn()
            .expect("starting the pod's process");
        let probe = &container["readinessProbe"]["httpGet"];
        Self {
            name: name.to_owned(),
            child,
            port,
            readiness_path: probe["path"]
                .as_str()
                .expect("a readiness probe")
                .to_owned(),
            termination_grace: Duration::from_secs(
                spec["terminationGracePeriodSeconds"].as_u64().unwrap_or(30),
            ),
            log,
        }
    }

    async fn ready(&mut self) -> bool {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!(
                "{} exited ({status}):\n{}",
                self.name,
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
        let url = format!("http://127.0.0.1:{}{}", self.port, self.readiness_path);
        let response = reqwest::Client::new()
            .get(url)
            .timeout(Duration::from_secs(2))
            .send()
            .await;
        response.is_ok_and(|r| r.status().is_success())
    }

    async fn until_ready(&mut self) {
        let started = Instant::now();
        while !self.ready().await {
            assert!(
                started.elapsed() < WAIT,
                "{} not ready by its probe after {WAIT:?}",
                self.name
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// SIGTERM (what the kubelet sends), then the time until the process exited.
    async fn terminate(mut self) -> Duration {
        let sent = Instant::now();
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        while sent.elapsed() < self.termination_grace + Duration::from_secs(5) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return sent.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = self.child.kill();
        panic!(
            "{} did not stop within {:?} of SIGTERM",
            self.name, self.termination_grace
        );
    }
}

/// An environment variable's value as the kubelet would give it.
fn resolve(te: &TestEnv, var: &Value, pod: &str, namespace: &str) -> String {
    if let Some(value) = var["value"].as_str() {
        return value.to_owned();
    }
    let from = &var["valueFrom"];
    if let Some(path) = from["fieldRef"]["fieldPath"].as_str() {
        return match path {
            "metadata.name" => pod.to_owned(),
            "metadata.namespace" => namespace.to_owned(),
            other => panic!("downward API field {other} not mapped"),
        };
    }
    for (reference, kind) in [("secretKeyRef", "secret"), ("configMapKeyRef", "configmap")] {
        let r = &from[reference];
        if let (Some(name), Some(key)) = (r["name"].as_str(), r["key"].as_str()) {
            let mut cmd = te.kubectl();
            cmd.args(["get", kind, name, "-n", namespace, "-o", "json"]);
            let object: Value = serde_json::from_str(&ok(cmd, None)).expect("an object");
            let value = object["data"][key].as_str().expect("the key exists");
            return if kind == "secret" {
                let decoded = base64_decode(value);
                String::from_utf8(decoded).expect("a UTF-8 value")
            } else {
                value.to_owned()
            };
        }
    }
    panic!("an env var the test cannot resolve: {var}");
}

fn base64_decode(text: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .expect("a Secret's data is base64")
}

/// A kubeconfig for the test API server holding a token of `service_account`.
fn service_account_kubeconfig(te: &TestEnv, service_account: &str, namespace: &str) -> PathBuf {
    let mut cmd = te.kubectl();
    cmd.args(["create", "token", service_account, "-n", namespace]);
    let token = ok(cmd, None).trim().to_owned();
    let text = std::fs::read_to_string(te.kubeconfig()).expect("reading the kubeconfig");
    let mut config: Value = serde_norway::from_str(&text).expect("kubeconfig parses");
    for entry in config["users"].as_array_mut().expect("users") {
        entry["user"] = json!({ "token": token });
    }
    let path = std::env::temp_dir().join(format!("{namespace}-{service_account}.kubeconfig"));
    std::fs::write(&path, serde_norway::to_string(&config).expect("serializes"))
        .expect("writing the kubeconfig");
    path
}

/// A release of the chart in a test's namespace, configured for the test environment:
/// the NATS URL from a Secret (as production passes credentials), one JetStream replica
/// (one nats-server; production values keep 3), loopback receivers allowed, the operator
/// serving only the test's namespace (`operator.tenantNamespaces`; a later `--set` of it
/// replaces that).
struct Release {
    name: String,
    namespace: String,
    env: &'static TestEnv,
}

impl Release {
    fn install(ctx: &TestContext, prefix: &str, set: &[&str]) -> Self {
        Self::install_in(env(), ctx, prefix, set)
    }

    /// Like [`Release::install`], in test environment `te` (`ctx` is a context of it).
    fn install_in(te: &'static TestEnv, ctx: &TestContext, prefix: &str, set: &[&str]) -> Self {
        let release = Self {
            name: unique_name(prefix),
            namespace: ctx.namespace.clone(),
            env: te,
        };
        let mut secret = te.kubectl();
        secret
            .args([
                "create",
                "secret",
                "generic",
                "nats",
                "-n",
                &release.namespace,
            ])
            .arg(format!("--from-literal=url={}", te.nats_url()));
        ok(secret, None);
        release.helm("install", set);
        release
    }

    /// `helm <action>` (install or upgrade) with the test's values and `set`.
    fn helm(&self, action: &str, set: &[&str]) {
        let mut cmd = helm();
        cmd.env("KUBECONFIG", self.env.kubeconfig());
        cmd.args([action, &self.name])
            .arg(chart_dir())
            .args(["--namespace", &self.namespace]);
        for value in [
            "crds.install=false",
            "nats.existingSecret=nats",
            "shards=4",
            "nats.jetstreamReplicas=1",
            "allowNetworks={127.0.0.0/8}",
            "allowHttp=true",
            &format!("operator.tenantNamespaces={{{}}}", self.namespace),
            "operator.statusInterval=1s",
            "dispatcher.graceSeconds=5",
        ]
        .iter()
        .chain(set)
        {
            cmd.args(["--set", value]);
        }
        ok(cmd, None);
    }

    /// The rendered workload of `kind` (Deployment: the operator; StatefulSet: the
    /// dispatcher) as installed now.
    fn workload(&self, kind: &str) -> Value {
        let mut get = helm();
        get.env("KUBECONFIG", self.env.kubeconfig());
        get.args([
            "get",
            "manifest",
            &self.name,
            "--namespace",
            &self.namespace,
        ]);
        documents(&ok(get, None))
            .into_iter()
            .find(|d| d["kind"] == kind)
            .unwrap_or_else(|| panic!("the chart renders a {kind}"))
    }

    /// A pod of `workload` named with `suffix` (a StatefulSet's ordinal, a Deployment's
    /// replica), started with its ServiceAccount's token when it mounts one.
    fn pod(&self, workload: &Value, suffix: &str) -> Pod {
        let spec = &workload["spec"]["template"]["spec"];
        let credentials = (spec["automountServiceAccountToken"] != false).then(|| {
            let account = spec["serviceAccountName"]
                .as_str()
                .expect("a ServiceAccount");
            service_account_kubeconfig(self.env, account, &self.namespace)
        });
        let name = format!(
            "{}-{suffix}",
            workload["metadata"]["name"].as_str().unwrap()
        );
        Pod::start(
            self.env,
            workload,
            &name,
            &self.namespace,
            credentials.as_ref(),
        )
    }

    fn uninstall(&self) {
        let mut cmd = helm();
        cmd.env("KUBECONFIG", self.env.kubeconfig());
        cmd.args(["uninstall", &self.name, "--namespace", &self.namespace]);
        ok(cmd, None);
    }
}

/// Creates a SigningSecret and a WebhookEndpoint for `order.*` to `url` in the test's
/// namespace and waits until the operator reports the endpoint Ready.
async fn tenant_endpoint(ctx: &TestContext, url: &str) {
    let secret: SigningSecret = serde_json::from_value(json!({
        "apiVersion": "herald.dev/v1alpha1", "kind": "SigningSecret",
        "metadata": {"name": "keys"}, "spec": {}
    }))
    .unwrap();
    let endpoint: WebhookEndpoint = serde_json::from_value(json!({
        "apiVersion": "herald.dev/v1alpha1", "kind": "WebhookEndpoint",
        "metadata": {"name": "orders"},
        "spec": {"url": url, "eventTypes": ["order.*"], "secretRef": {"name": "keys"}}
    }))
    .unwrap();
    ctx.api::<SigningSecret>()
        .create(&PostParams::default(), &secret)
        .await
        .expect("creating the SigningSecret");
    let endpoints = ctx.api::<WebhookEndpoint>();
    endpoints
        .create(&PostParams::default(), &endpoint)
        .await
        .expect("creating the WebhookEndpoint");
    eventually("the WebhookEndpoint Ready", WAIT, || async {
        let e = endpoints.get("orders").await.ok()?;
        e.status?
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
            .then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_charts_pods_start_as_rendered_deliver_and_stop_in_time() {
    herald_dispatcher::install_crypto_provider();
    let ctx = TestContext::new("chart-pods").await;
    let ns = ctx.namespace.clone();
    let release = Release::install(&ctx, "pods", &[]);
    let (deployment, statefulset) = (
        release.workload("Deployment"),
        release.workload("StatefulSet"),
    );
    assert_eq!(
        statefulset["spec"]["template"]["spec"]["automountServiceAccountToken"], false,
        "the dispatcher's pod gets no API credentials"
    );
    let mut operator = release.pod(&deployment, "0");
    let mut dispatcher = release.pod(&statefulset, "0");
    for pod in [&mut operator, &mut dispatcher] {
        pod.until_ready().await;
    }
    // A tenant's endpoint, reconciled by the operator with the chart's RBAC and served by
    // the dispatcher with the chart's settings.
    let rx = Receiver::start().await;
    tenant_endpoint(&ctx, &rx.url("orders")).await;
    let dp = DataPlane::new(env().nats().await).await;
    dp.publish(&ns, "order.created", json!({"id": 1})).await;
    let delivered = eventually("the event delivered", WAIT, || {
        let got = rx.received("orders");
        async move { got.first().cloned() }
    })
    .await;
    assert_eq!(delivered.json()["data"]["id"], 1);
    assert!(delivered.header("webhook-signature").starts_with("v1,"));

    for pod in [dispatcher, operator] {
        let (name, grace) = (pod.name.clone(), pod.termination_grace);
        let took = pod.terminate().await;
        println!("{name}: stopped {took:?} after SIGTERM (grace {grace:?})");
        assert!(took < grace, "{name} took {took:?}, its grace is {grace:?}");
    }
    release.uninstall();
    ctx.cleanup().await;
}

/// The chart's NATS security values, run for real against NATS in operator (JWT) mode
/// with TLS ([`private_jwt_env`]): the CA in a Secret (`nats.tls.caSecret`), each binary's
/// identity in its own Secret (`nats.{operator,dispatcher}Identity`: client certificate,
/// key and credentials file), mounted where the rendered pod spec says and found there
/// through the rendered environment. Both pods become ready by their probes and deliver
/// an event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_charts_pods_connect_with_the_nats_tls_and_identity_secrets() {
    herald_dispatcher::install_crypto_provider();
    let te = private_jwt_env();
    let files = te.nats_secure_dir().expect("a secure environment");
    let ctx = TestContext::new_in(te, "chart-nats").await;
    let ns = ctx.namespace.clone();
    let file = |name: &str| files.join(name).display().to_string();
    let mut secrets = vec![("nats-ca", vec![("ca.crt", file("ca.pem"))])];
    for identity in ["operator", "dispatcher"] {
        secrets.push((
            if identity == "operator" {
                "nats-operator"
            } else {
                "nats-dispatcher"
            },
            vec![
                ("tls.crt", file(&format!("{identity}.crt"))),
                ("tls.key", file(&format!("{identity}.key"))),
                ("user.creds", file(&format!("{identity}.creds"))),
            ],
        ));
    }
    for (name, keys) in &secrets {
        let mut create = te.kubectl();
        create.args(["create", "secret", "generic", name, "-n", &ns]);
        for (key, path) in keys {
            create.arg(format!("--from-file={key}={path}"));
        }
        ok(create, None);
    }
    let mut set = vec!["nats.tls.caSecret=nats-ca".to_owned()];
    for binary in ["operator", "dispatcher"] {
        set.extend([
            format!("nats.{binary}Identity.secret=nats-{binary}"),
            format!("nats.{binary}Identity.certFile=tls.crt"),
            format!("nats.{binary}Identity.keyFile=tls.key"),
            format!("nats.{binary}Identity.credsFile=user.creds"),
        ]);
    }
    let set: Vec<&str> = set.iter().map(String::as_str).collect();
    let release = Release::install_in(te, &ctx, "pods-nats", &set);
    let (deployment, statefulset) = (
        release.workload("Deployment"),
        release.workload("StatefulSet"),
    );
    for workload in [&deployment, &statefulset] {
        let container = &workload["spec"]["template"]["spec"]["containers"][0];
        let names: Vec<&str> = container["env"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v["name"].as_str())
            .collect();
        for expected in [
            "HERALD_NATS_TLS_CA",
            "HERALD_NATS_TLS_CERT",
            "HERALD_NATS_TLS_KEY",
            "HERALD_NATS_CREDS",
        ] {
            assert!(
                names.contains(&expected),
                "{expected} not rendered: {names:?}"
            );
        }
        assert_eq!(
            container["volumeMounts"].as_array().map(Vec::len),
            Some(2),
            "the CA and the identity are mounted: {container}"
        );
    }
    let mut operator = release.pod(&deployment, "0");
    let mut dispatcher = release.pod(&statefulset, "0");
    for pod in [&mut operator, &mut dispatcher] {
        pod.until_ready().await;
    }
    let rx = Receiver::start().await;
    tenant_endpoint(&ctx, &rx.url("orders")).await;
    // Published as the environment's admin (a producer identity may only use its own
    // tenant namespace, and this test's namespace is a fresh one).
    let dp = DataPlane::new(te.nats().await).await;
    dp.publish(&ns, "order.created", json!({"id": 7})).await;
    let delivered = eventually("the event delivered", WAIT, || {
        let got = rx.received("orders");
        async move { got.first().cloned() }
    })
    .await;
    assert_eq!(delivered.json()["data"]["id"], 7);
    assert!(delivered.header("webhook-signature").starts_with("v1,"));
    for pod in [dispatcher, operator] {
        pod.terminate().await;
    }
    release.uninstall();
    ctx.cleanup().await;
}

/// A rolling upgrade as Kubernetes performs it, while a producer publishes: `helm
/// upgrade` with new values, then the dispatcher StatefulSet's pods replaced one at a
/// time from the highest ordinal (each stopped with SIGTERM, its successor started from
/// the new rendering and ready before the next), and the operator Deployment surged (a
/// new pod ready before an old one stops). Every event is delivered; each pod stops
/// inside its grace period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_upgrade_delivers_every_event() {
    herald_dispatcher::install_crypto_provider();
    let ctx = TestContext::new("chart-roll").await;
    let ns = ctx.namespace.clone();
    let release = Release::install(&ctx, "roll", &["dispatcher.replicas=2"]);
    let (deployment, statefulset) = (
        release.workload("Deployment"),
        release.workload("StatefulSet"),
    );
    let mut operators = vec![release.pod(&deployment, "a"), release.pod(&deployment, "b")];
    let mut dispatchers = vec![
        release.pod(&statefulset, "0"),
        release.pod(&statefulset, "1"),
    ];
    for pod in operators.iter_mut().chain(dispatchers.iter_mut()) {
        pod.until_ready().await;
    }
    let rx = Receiver::start().await;
    tenant_endpoint(&ctx, &rx.url("orders")).await;

    const EVENTS: i64 = 800;
    let dp = DataPlane::new(env().nats().await).await;
    let producer = tokio::spawn({
        let (dp, ns) = (dp.clone(), ns.clone());
        async move {
            for i in 0..EVENTS {
                dp.publish(&ns, "order.created", json!(i)).await;
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
        }
    });
    tokio::time::sleep(Duration::from_secs(2)).await;

    release.helm(
        "upgrade",
        &[
            "dispatcher.replicas=2",
            "dispatcher.maxInFlightPerShard=512",
        ],
    );
    let statefulset = release.workload("StatefulSet");
    let env_of = |w: &Value| w["spec"]["template"]["spec"]["containers"][0]["env"].clone();
    assert!(
        env_of(&statefulset).to_string().contains("\"512\""),
        "the upgrade changes the dispatcher's environment"
    );
    assert!(
        !producer.is_finished(),
        "the rollout starts while events flow"
    );
    let mut stops = Vec::new();
    // StatefulSet: highest ordinal first, each successor ready before the next.
    for ordinal in (0..dispatchers.len()).rev() {
        let old = dispatchers.remove(ordinal);
        let (name, grace) = (old.name.clone(), old.termination_grace);
        stops.push((name, old.terminate().await, grace));
        let mut new = release.pod(&statefulset, &ordinal.to_string());
        new.until_ready().await;
        dispatchers.insert(ordinal, new);
    }
    println!(
        "dispatchers replaced while the producer {}",
        if producer.is_finished() {
            "had finished"
        } else {
            "was still publishing"
        }
    );
    // Deployment: surge one new pod, then stop one old.
    let deployment = release.workload("Deployment");
    for suffix in ["c", "d"] {
        let mut new = release.pod(&deployment, suffix);
        new.until_ready().await;
        let old = operators.remove(0);
        let (name, grace) = (old.name.clone(), old.termination_grace);
        stops.push((name, old.terminate().await, grace));
        operators.push(new);
    }
    producer.await.expect("the producer");

    let all: std::collections::BTreeSet<i64> = (0..EVENTS).collect();
    let received = || -> std::collections::BTreeSet<i64> {
        rx.received("orders")
            .iter()
            .filter_map(|r| r.json()["data"].as_i64())
            .collect()
    };
    let waited = Instant::now();
    while received() != all {
        if waited.elapsed() > WAIT {
            let missing: Vec<_> = all.difference(&received()).take(20).copied().collect();
            panic!("after the rollout, missing e.g. {missing:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let duplicates = rx.received("orders").len() as i64 - EVENTS;
    println!("rolling upgrade: {EVENTS} events delivered, {duplicates} duplicates");
    for (name, took, grace) in stops {
        println!("{name}: stopped {took:?} after SIGTERM (grace {grace:?})");
        assert!(took < grace, "{name} took {took:?}, its grace is {grace:?}");
    }
    for pod in operators.into_iter().chain(dispatchers) {
        pod.terminate().await;
    }
    release.uninstall();
    ctx.cleanup().await;
}

/// Least privilege, run for real (issue 13): the chart with two tenant namespaces, the
/// operator binary with its ServiceAccount's token. It serves both — a SigningSecret
/// becomes Ready with its Secret generated, a WebhookEndpoint becomes Ready, a hand-edited
/// key is picked up through its namespace's Secret watch long before the 5-minute resync —
/// while the same token cannot read a Secret in a namespace it has no business in, nor in
/// `kube-system`, nor list Secrets cluster-wide.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_serves_its_tenants_and_reads_no_other_secret() {
    herald_dispatcher::install_crypto_provider();
    let ctx = TestContext::new("chart-least").await;
    let other = TestContext::new("chart-least-t").await;
    let bystander = TestContext::new("chart-least-b").await;
    let mut cmd = env().kubectl();
    cmd.args([
        "-n",
        &bystander.namespace,
        "create",
        "secret",
        "generic",
        "database",
    ])
    .arg("--from-literal=password=not-for-herald");
    ok(cmd, None);
    let tenants = format!(
        "operator.tenantNamespaces={{{},{}}}",
        ctx.namespace, other.namespace
    );
    let release = Release::install(&ctx, "least", &[&tenants]);
    let deployment = release.workload("Deployment");
    let mut operator = release.pod(&deployment, "0");
    operator.until_ready().await;

    // The operator's own token, as its pod would hold it.
    let account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .expect("a ServiceAccount");
    let token = service_account_kubeconfig(env(), account, &ctx.namespace);
    let as_operator = |args: &[&str]| {
        let mut cmd = env().kubectl();
        cmd.arg("--kubeconfig").arg(&token).args(args);
        herald_e2e::helm::output(cmd, None)
    };
    for args in [
        &["get", "secret", "database", "-n", &bystander.namespace][..],
        &["get", "secrets", "-n", &bystander.namespace],
        &["get", "secrets", "-n", "kube-system"],
        &["get", "secrets", "--all-namespaces"],
        &["get", "webhookendpoints.herald.dev", "--all-namespaces"],
    ] {
        let out = as_operator(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains("Forbidden"),
            "the operator's token may `kubectl {}`: {}{stderr}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout)
        );
    }
    // The same token does read where it must (the test above is not refusing everything).
    let out = as_operator(&["get", "secrets", "-n", &other.namespace]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Both tenant namespaces are served.
    tenant_endpoint(&ctx, "http://127.0.0.1:9/orders").await;
    tenant_endpoint(&other, "http://127.0.0.1:9/orders").await;
    let generated = other
        .api::<k8s_openapi::api::core::v1::Secret>()
        .get("keys")
        .await
        .expect("the Secret generated in the second tenant namespace");
    assert!(generated.data.is_some_and(|d| d.contains_key("current")));

    // A hand-edited key there is picked up through the per-namespace Secret watch.
    let signing = other.api::<SigningSecret>();
    let active = |s: SigningSecret| s.status.and_then(|s| s.active_key_id);
    let before = active(signing.get("keys").await.expect("the SigningSecret"));
    let (key, _) = herald_core::signing::generate_whsec().expect("a key");
    let mut edit = env().kubectl();
    edit.args([
        "-n",
        &other.namespace,
        "create",
        "secret",
        "generic",
        "keys",
    ])
    .arg(format!("--from-literal=current={key}"))
    .args(["--dry-run=client", "-o", "yaml"]);
    let manifest = ok(edit, None);
    let mut apply = env().kubectl();
    apply.args(["-n", &other.namespace, "apply", "-f", "-"]);
    ok(apply, Some(&manifest));
    eventually("the edited key active", Duration::from_secs(60), || async {
        let now = active(signing.get("keys").await.ok()?);
        (now.is_some() && now != before).then_some(())
    })
    .await;

    // Not one reconcile failed for want of a permission.
    let metrics = reqwest::get(format!("http://127.0.0.1:{}/metrics", operator.port))
        .await
        .expect("the operator's metrics")
        .text()
        .await
        .expect("metrics text");
    let kube_errors: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("herald_operator_reconcile_errors_total{"))
        .filter(|l| l.contains("category=\"kube\"") && !l.ends_with(" 0"))
        .collect();
    assert!(kube_errors.is_empty(), "{kube_errors:?}");
    let log = std::fs::read_to_string(&operator.log).unwrap_or_default();
    assert!(
        !log.to_lowercase().contains("forbidden"),
        "the operator was refused:\n{log}"
    );

    operator.terminate().await;
    release.uninstall();
    let _ = std::fs::remove_file(&token);
    for c in [ctx, other, bystander] {
        c.cleanup().await;
    }
}
