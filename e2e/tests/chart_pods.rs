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

use herald_core::v1alpha1::SigningSecret;
use herald_e2e::dataplane::DataPlane;
use herald_e2e::helm::{chart_dir, documents, helm, ok};
use herald_e2e::receiver::Receiver;
use herald_e2e::{TestContext, TestEnv, env, eventually, private_jwt_env, repo_root, unique_name};
use serde_json::{Value, json};

#[path = "chart_pods/identity.rs"]
mod identity;
#[path = "chart_pods/running.rs"]
mod running;

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

/// SigningSecret `keys` and WebhookEndpoint `orders` for `order.*` to `url` in the test's
/// namespace, Ready.
async fn tenant_endpoint(ctx: &TestContext, url: &str) {
    herald_e2e::orders_endpoint(&ctx.client, &ctx.namespace, url, WAIT).await;
}
