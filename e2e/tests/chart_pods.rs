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
use herald_e2e::{TestContext, env, eventually, repo_root, unique_name};
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
    let name = image_path.rsplit('/').next().unwrap_or(image_path);
    let exe = std::env::current_exe().expect("the test's path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target dir");
    let binary = dir.join(name);
    assert!(
        binary.exists(),
        "{} is not built (cargo test --workspace builds it)",
        binary.display()
    );
    binary
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
    /// as pod `name`, with `credentials` (a kubeconfig) or none.
    fn start(workload: &Value, name: &str, namespace: &str, credentials: Option<&PathBuf>) -> Self {
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
        let args = strings(&container["args"]).unwrap_or(cmd);
        let port = free_port();
        let container_port = container["ports"][0]["containerPort"]
            .as_u64()
            .unwrap_or(8080);
        let mut env = BTreeMap::new();
        for var in container["env"].as_array().into_iter().flatten() {
            let key = var["name"].as_str().expect("env name").to_owned();
            let value = resolve(var, name, namespace);
            env.insert(key, value);
        }
        // The pod network: the container's port on a loopback port of its own.
        for value in env.values_mut() {
            if *value == format!("0.0.0.0:{container_port}") {
                *value = format!("127.0.0.1:{port}");
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
fn resolve(var: &Value, pod: &str, namespace: &str) -> String {
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
            let mut cmd = env().kubectl();
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

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A kubeconfig for the test API server holding a token of `service_account`.
fn service_account_kubeconfig(service_account: &str, namespace: &str) -> PathBuf {
    let mut cmd = env().kubectl();
    cmd.args(["create", "token", service_account, "-n", namespace]);
    let token = ok(cmd, None).trim().to_owned();
    let text = std::fs::read_to_string(env().kubeconfig()).expect("reading the kubeconfig");
    let mut config: Value = serde_norway::from_str(&text).expect("kubeconfig parses");
    for entry in config["users"].as_array_mut().expect("users") {
        entry["user"] = json!({ "token": token });
    }
    let path = std::env::temp_dir().join(format!("{namespace}-{service_account}.kubeconfig"));
    std::fs::write(&path, serde_norway::to_string(&config).expect("serializes"))
        .expect("writing the kubeconfig");
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_charts_pods_start_as_rendered_deliver_and_stop_in_time() {
    herald_dispatcher::install_crypto_provider();
    let ctx = TestContext::new("chart-pods").await;
    let ns = ctx.namespace.clone();
    let release = unique_name("pods");
    // The NATS URL from a Secret, as production passes credentials.
    let mut secret = env().kubectl();
    secret
        .args(["create", "secret", "generic", "nats", "-n", &ns])
        .arg(format!("--from-literal=url={}", env().nats_url()));
    ok(secret, None);
    let mut install = helm();
    install
        .args(["install", &release])
        .arg(chart_dir())
        .args(["--namespace", &ns])
        .args(["--set", "crds.install=false"])
        .args(["--set", "nats.existingSecret=nats"])
        .args(["--set", "shards=4"])
        // One nats-server: streams with one replica (production values keep 3).
        .args(["--set", "nats.jetstreamReplicas=1"])
        .args(["--set", "allowNetworks={127.0.0.0/8}"])
        .args(["--set", "allowHttp=true"])
        .args(["--set", &format!("operator.watchNamespace={ns}")])
        .args(["--set", "operator.statusInterval=1s"])
        .args(["--set", "dispatcher.graceSeconds=5"]);
    ok(install, None);
    let mut get = helm();
    get.args(["get", "manifest", &release, "--namespace", &ns]);
    let docs = documents(&ok(get, None));
    let workload = |kind: &str| {
        docs.iter()
            .find(|d| d["kind"] == kind)
            .unwrap_or_else(|| panic!("the chart renders a {kind}"))
            .clone()
    };
    let (deployment, statefulset) = (workload("Deployment"), workload("StatefulSet"));
    let operator_sa = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .expect("the operator's ServiceAccount");
    assert_eq!(
        statefulset["spec"]["template"]["spec"]["automountServiceAccountToken"], false,
        "the dispatcher's pod gets no API credentials"
    );
    let credentials = service_account_kubeconfig(operator_sa, &ns);
    let operator_pod = format!("{}-0", deployment["metadata"]["name"].as_str().unwrap());
    let dispatcher_pod = format!("{}-0", statefulset["metadata"]["name"].as_str().unwrap());
    let mut operator = Pod::start(&deployment, &operator_pod, &ns, Some(&credentials));
    let mut dispatcher = Pod::start(&statefulset, &dispatcher_pod, &ns, None);
    for pod in [&mut operator, &mut dispatcher] {
        let started = Instant::now();
        while !pod.ready().await {
            assert!(
                started.elapsed() < WAIT,
                "{} not ready by its probe after {WAIT:?}",
                pod.name
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    // A tenant's endpoint, reconciled by the operator with the chart's RBAC and served by
    // the dispatcher with the chart's settings.
    let rx = Receiver::start().await;
    let secret: SigningSecret = serde_json::from_value(json!({
        "apiVersion": "herald.dev/v1alpha1", "kind": "SigningSecret",
        "metadata": {"name": "keys"}, "spec": {}
    }))
    .unwrap();
    let endpoint: WebhookEndpoint = serde_json::from_value(json!({
        "apiVersion": "herald.dev/v1alpha1", "kind": "WebhookEndpoint",
        "metadata": {"name": "orders"},
        "spec": {"url": rx.url("orders"), "eventTypes": ["order.*"], "secretRef": {"name": "keys"}}
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
    let mut uninstall = helm();
    uninstall.args(["uninstall", &release, "--namespace", &ns]);
    ok(uninstall, None);
    ctx.cleanup().await;
}
