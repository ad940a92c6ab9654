//! The Helm chart `charts/herald` against the real kube-apiserver: lint, server-side
//! validation of everything it renders, install / upgrade / uninstall, the values schema,
//! and its RBAC — the operator, impersonating the chart's ServiceAccount, reconciles to
//! Ready; the dispatcher's ServiceAccount may do nothing.
//!
//! Each test has its own namespace and its own release name, so cluster-scoped objects
//! (ClusterRole, ClusterRoleBinding, named after the release) never clash between
//! parallel tests. The CRDs are installed cluster-wide by the harness (server-side apply,
//! not Helm), so installs use `crds.install=false`; the CRD templates themselves are
//! checked by rendering and by a server-side dry run.

use std::time::Duration;

use herald_core::v1alpha1::{SigningSecret, WebhookEndpoint, WebhookReplay};
use herald_e2e::helm::{chart_dir, documents, helm, kinds, ok, output, template};
use herald_e2e::{TestContext, env, eventually, repo_root, unique_name};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{EnvVar, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{DeleteParams, PostParams};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;

const WAIT: Duration = Duration::from_secs(60);

/// A release of the chart in a test's namespace; uninstalled on [`Release::uninstall`].
struct Release {
    name: String,
    namespace: String,
    /// What `helm install` printed (the rendered NOTES.txt among it).
    installed: String,
}

impl Release {
    fn install(ctx: &TestContext, prefix: &str, set: &[&str]) -> Self {
        let mut release = Self {
            name: unique_name(prefix),
            namespace: ctx.namespace.clone(),
            installed: String::new(),
        };
        release.installed = release.helm("install", set);
        release
    }

    fn helm(&self, action: &str, set: &[&str]) -> String {
        let mut cmd = helm();
        cmd.args([action, &self.name])
            .arg(chart_dir())
            .args(["--namespace", &self.namespace])
            // The harness installed the CRDs cluster-wide (not through Helm).
            .args(["--set", "crds.install=false"])
            // The test API server runs no pods: NATS is never dialled.
            .args(["--set", "nats.url=nats://nats.invalid:4222"]);
        for value in set {
            cmd.args(["--set", value]);
        }
        ok(cmd, None)
    }

    fn fullname(&self) -> String {
        format!("{}-herald", self.name)
    }

    fn operator(&self) -> String {
        format!("{}-operator", self.fullname())
    }

    fn dispatcher(&self) -> String {
        format!("{}-dispatcher", self.fullname())
    }

    /// The manifest Helm installed for this release.
    fn manifest(&self) -> String {
        let mut cmd = helm();
        cmd.args([
            "get",
            "manifest",
            &self.name,
            "--namespace",
            &self.namespace,
        ]);
        ok(cmd, None)
    }

    fn uninstall(&self) -> String {
        let mut cmd = helm();
        cmd.args(["uninstall", &self.name, "--namespace", &self.namespace]);
        ok(cmd, None)
    }
}

/// `kubectl get -f -` of `manifest`: the objects of it that exist, as `kind/name`.
fn existing(manifest: &str, namespace: &str) -> Vec<String> {
    let mut cmd = env().kubectl();
    cmd.args([
        "get",
        "--ignore-not-found",
        "-o",
        "name",
        "-n",
        namespace,
        "-f",
        "-",
    ]);
    let mut names: Vec<String> = ok(cmd, Some(manifest)).lines().map(str::to_owned).collect();
    names.sort();
    names
}

fn env_var<'a>(env: &'a [EnvVar], name: &str) -> Option<&'a EnvVar> {
    env.iter().find(|e| e.name == name)
}

fn env_value(env: &[EnvVar], name: &str) -> Option<String> {
    env_var(env, name).and_then(|e| e.value.clone())
}

fn container_env(spec: Option<&k8s_openapi::api::core::v1::PodSpec>) -> Vec<EnvVar> {
    spec.and_then(|s| s.containers.first())
        .and_then(|c| c.env.clone())
        .unwrap_or_default()
}

#[test]
fn helm_lint_strict_passes() {
    let mut cmd = helm();
    cmd.args(["lint", "--strict"]).arg(chart_dir());
    let out = ok(cmd, None);
    assert!(out.contains("0 chart(s) failed"), "{out}");
}

#[tokio::test]
async fn rendered_chart_passes_server_side_validation() {
    let ctx = TestContext::new("chart-dryrun").await;
    let release = unique_name("dry");
    // Everything that renders with core APIs on: CRDs, NetworkPolicy, a watch namespace
    // (RoleBinding instead of ClusterRoleBinding), the NATS URL from a Secret.
    let watch = format!("operator.watchNamespace={}", ctx.namespace);
    for set in [
        vec!["crds.install=true", "networkPolicy.enabled=true"],
        vec![
            "crds.install=false",
            &watch,
            "nats.existingSecret=nats-url",
            "allowNetworks={10.0.0.0/8,fd00::/8}",
            "allowHttp=true",
        ],
    ] {
        let rendered = template(&release, &ctx.namespace, &set);
        let mut cmd = env().kubectl();
        cmd.args(["apply", "--dry-run=server", "-n", &ctx.namespace, "-f", "-"]);
        let out = ok(cmd, Some(&rendered));
        let docs = documents(&rendered);
        assert_eq!(
            out.lines().count(),
            docs.len(),
            "every rendered object is validated ({set:?}):\n{out}"
        );
    }
    // The optional prometheus-operator objects render (their CRDs are not in the test
    // API server, so they are checked for shape here, not applied).
    let monitoring = documents(&template(
        &release,
        &ctx.namespace,
        &[
            "metrics.serviceMonitor.enabled=true",
            "metrics.prometheusRule.enabled=true",
        ],
    ));
    let rule = monitoring
        .iter()
        .find(|d| d["kind"] == "PrometheusRule")
        .expect("a PrometheusRule");
    let exprs: Vec<&str> = rule["spec"]["groups"][0]["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .filter_map(|r| r["expr"].as_str())
        .collect();
    for metric in [
        "herald_operator_endpoints{state=\"Disabled\"}",
        "herald_dispatcher_oldest_pending_seconds",
        "herald_dispatcher_attempts_total{outcome=\"Success\"}",
        "herald_dispatcher_dead_letters_total",
    ] {
        assert!(
            exprs.iter().any(|e| e.contains(metric)),
            "no alert on {metric}: {exprs:?}"
        );
    }
    assert!(monitoring.iter().any(|d| d["kind"] == "ServiceMonitor"));
    ctx.cleanup().await;
}

#[tokio::test]
async fn crd_templates_are_kept_and_follow_crds_install() {
    let ctx = TestContext::new("chart-crds").await;
    let docs = documents(&template("crds", &ctx.namespace, &[]));
    let crds: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == "CustomResourceDefinition")
        .collect();
    let mut names: Vec<&str> = crds
        .iter()
        .map(|c| c["metadata"]["name"].as_str().unwrap_or_default())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "signingsecrets.herald.dev",
            "webhookendpoints.herald.dev",
            "webhookreplays.herald.dev"
        ]
    );
    for crd in &crds {
        assert_eq!(
            crd["metadata"]["annotations"]["helm.sh/resource-policy"], "keep",
            "{}: helm uninstall would delete every tenant's resources",
            crd["metadata"]["name"]
        );
        // Apart from the annotation, the same CRD as the committed crds/ (which the
        // harness installed).
        let file = repo_root().join(format!(
            "crds/{}.yaml",
            crd["metadata"]["name"].as_str().unwrap_or_default()
        ));
        let mut committed: Value = serde_norway::from_str(
            &std::fs::read_to_string(&file).expect("reading the committed CRD"),
        )
        .expect("committed CRD parses");
        committed["metadata"]["annotations"] = json!({"helm.sh/resource-policy": "keep"});
        assert_eq!(*crd, &committed, "{}", file.display());
    }
    let without = documents(&template("crds", &ctx.namespace, &["crds.install=false"]));
    assert!(
        !without
            .iter()
            .any(|d| d["kind"] == "CustomResourceDefinition"),
        "crds.install=false still renders CRDs"
    );
    ctx.cleanup().await;
}

/// The CRDs Herald ships, by name.
const CRD_NAMES: [&str; 3] = [
    "webhookendpoints.herald.dev",
    "signingsecrets.herald.dev",
    "webhookreplays.herald.dev",
];

/// `kubectl <verb> crd <every Herald CRD> <args>`.
fn kubectl_crds(verb: &str, args: &[&str]) {
    let mut cmd = env().kubectl();
    cmd.args([verb, "crd"]).args(CRD_NAMES).args(args);
    ok(cmd, None);
}

/// CRDs applied with kubectl (as the harness did, and the README suggests for GitOps): a
/// release with `crds.install=true` is refused by Helm with its ownership message (the
/// chart's README quotes it and says what to do); `crds.install=false` installs beside
/// them; after the README's adoption commands, `crds.install=true` takes them over.
#[tokio::test]
async fn crds_applied_with_kubectl_are_left_alone_or_adopted() {
    let ctx = TestContext::new("chart-adopt").await;
    let name = unique_name("adopt");
    let install = |set: &str| {
        let mut cmd = helm();
        cmd.args(["install", &name])
            .arg(chart_dir())
            .args(["--namespace", &ctx.namespace])
            .args(["--set", "nats.url=nats://nats.invalid:4222"])
            .args(["--set", set]);
        output(cmd, None)
    };
    let refused = install("crds.install=true");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "Helm took CRDs it does not own");
    println!("helm refused: {stderr}");
    for quoted in [
        "exists and cannot be imported into the current release",
        "invalid ownership metadata",
        "app.kubernetes.io/managed-by",
    ] {
        assert!(stderr.contains(quoted), "{quoted:?} not in: {stderr}");
    }

    let beside = install("crds.install=false");
    assert!(
        beside.status.success(),
        "{}",
        String::from_utf8_lossy(&beside.stderr)
    );
    let mut cmd = helm();
    cmd.args(["uninstall", &name, "--namespace", &ctx.namespace]);
    ok(cmd, None);

    let release_name = format!("meta.helm.sh/release-name={name}");
    let release_namespace = format!("meta.helm.sh/release-namespace={}", ctx.namespace);
    kubectl_crds(
        "label",
        &["app.kubernetes.io/managed-by=Helm", "--overwrite"],
    );
    kubectl_crds(
        "annotate",
        &[&release_name, &release_namespace, "--overwrite"],
    );
    let adopted = install("crds.install=true");
    let result = adopted.status.success();
    let mut cmd = helm();
    cmd.args(["get", "manifest", &name, "--namespace", &ctx.namespace]);
    let manifest = if result { ok(cmd, None) } else { String::new() };
    let mut cmd = helm();
    cmd.args(["uninstall", &name, "--namespace", &ctx.namespace]);
    let _ = output(cmd, None);
    // Back to CRDs owned by nobody, as the other tests expect.
    kubectl_crds("label", &["app.kubernetes.io/managed-by-"]);
    kubectl_crds(
        "annotate",
        &[
            "meta.helm.sh/release-name-",
            "meta.helm.sh/release-namespace-",
        ],
    );
    assert!(result, "{}", String::from_utf8_lossy(&adopted.stderr));
    let owned = documents(&manifest)
        .iter()
        .filter(|d| d["kind"] == "CustomResourceDefinition")
        .count();
    assert_eq!(owned, 3, "the release owns the CRDs");
    let mut cmd = env().kubectl();
    cmd.args(["get", "crd", "-o", "name"]).args(CRD_NAMES);
    assert_eq!(ok(cmd, None).lines().count(), 3, "uninstall kept the CRDs");
    ctx.cleanup().await;
}

#[tokio::test]
async fn bad_values_are_refused_with_a_message() {
    let ctx = TestContext::new("chart-schema").await;
    let cases = [
        ("dispatcher.replicas=-1", "/dispatcher/replicas"),
        ("operator.replicas=-1", "/operator/replicas"),
        ("shards=0", "/shards"),
        ("shards=5000", "/shards"),
        ("allowNetworks={not-a-cidr}", "not-a-cidr"),
        ("allowNetworks={10.0.0.0/33}", "10.0.0.0/33"),
        ("replicas=2", "additional properties 'replicas' not allowed"),
        ("nats.url=localhost:4222", "/nats/url"),
    ];
    for (set, expected) in cases {
        let mut cmd = helm();
        cmd.args(["template", "bad"])
            .arg(chart_dir())
            .args(["--set", set]);
        let out = output(cmd, None);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{set} was accepted");
        assert!(
            stderr.contains("values don't meet the specifications of the schema")
                && stderr.contains(expected),
            "{set}: the message does not name {expected}:\n{stderr}"
        );
    }
    // `helm install` refuses too, before creating anything.
    let mut cmd = helm();
    cmd.args(["install", "bad"])
        .arg(chart_dir())
        .args(["--namespace", &ctx.namespace])
        .args(["--set", "crds.install=false", "--set", "shards=0"]);
    let out = output(cmd, None);
    assert!(!out.status.success(), "install with shards=0 was accepted");
    assert!(String::from_utf8_lossy(&out.stderr).contains("/shards"));
    let mut cmd = helm();
    cmd.args(["list", "-q", "--namespace", &ctx.namespace]);
    assert_eq!(ok(cmd, None).trim(), "", "a refused install left a release");
    ctx.cleanup().await;
}

#[tokio::test]
async fn install_upgrade_uninstall() {
    let ctx = TestContext::new("chart-life").await;
    let release = Release::install(&ctx, "life", &["shards=8"]);
    // NOTES.txt tells the user what to do next.
    for next in [
        "kind: SigningSecret",
        "kind: WebhookEndpoint",
        "herald.events.<namespace>.<event-type>",
        "kubectl get whe -A",
        "crds.install=false",
    ] {
        assert!(
            release.installed.contains(next),
            "NOTES lack {next:?}:\n{}",
            release.installed
        );
    }
    let manifest = release.manifest();
    let docs = documents(&manifest);
    assert_eq!(
        kinds(&docs),
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "Deployment",
            "PodDisruptionBudget",
            "PodDisruptionBudget",
            "Role",
            "RoleBinding",
            "Service",
            "Service",
            "ServiceAccount",
            "ServiceAccount",
            "StatefulSet",
        ]
    );
    let present = existing(&manifest, &ctx.namespace);
    assert_eq!(
        present.len(),
        docs.len(),
        "not every object exists: {present:?}"
    );

    let deployments = ctx.api::<Deployment>();
    let statefulsets = ctx.api::<StatefulSet>();
    let operator = deployments
        .get(&release.operator())
        .await
        .expect("operator");
    let dispatcher = statefulsets
        .get(&release.dispatcher())
        .await
        .expect("dispatcher");
    let op_spec = operator.spec.clone();
    let disp_spec = dispatcher.spec.clone();
    assert_eq!(op_spec.replicas, Some(2));
    assert_eq!(disp_spec.replicas, Some(2));
    assert_eq!(
        disp_spec.service_name.as_deref(),
        Some(&*release.dispatcher())
    );
    let op_pod = op_spec.template.spec.clone().expect("pod spec");
    let disp_pod = disp_spec.template.spec.clone().expect("pod spec");
    let op_env = container_env(Some(&op_pod));
    let disp_env = container_env(Some(&disp_pod));
    // One shard count for both.
    assert_eq!(env_value(&op_env, "HERALD_SHARDS").as_deref(), Some("8"));
    assert_eq!(env_value(&disp_env, "HERALD_SHARDS").as_deref(), Some("8"));
    let replica_id = env_var(&disp_env, "HERALD_REPLICA_ID")
        .and_then(|e| e.value_from.as_ref())
        .and_then(|v| v.field_ref.as_ref())
        .map(|f| f.field_path.clone());
    assert_eq!(replica_id.as_deref(), Some("metadata.name"));
    assert_eq!(
        env_value(&op_env, "HERALD_LEASE_NAME"),
        Some(format!("{}-leader", release.operator()))
    );
    // The dispatcher gets no API token; both run restricted.
    assert_eq!(disp_pod.automount_service_account_token, Some(false));
    for pod in [&op_pod, &disp_pod] {
        let psc = pod.security_context.clone().expect("pod securityContext");
        assert_eq!(psc.run_as_non_root, Some(true));
        let sc = pod.containers[0]
            .security_context
            .clone()
            .expect("container securityContext");
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(
            sc.capabilities.and_then(|c| c.drop),
            Some(vec!["ALL".to_owned()])
        );
        assert_eq!(
            sc.seccomp_profile.map(|s| s.type_),
            Some("RuntimeDefault".to_owned())
        );
    }

    release.helm(
        "upgrade",
        &[
            "shards=8",
            "dispatcher.replicas=3",
            "allowNetworks={10.20.0.0/16,192.168.7.0/24}",
        ],
    );
    // The shard count is fixed at install: an upgrade that changes it is refused, and
    // says why.
    let mut cmd = helm();
    cmd.args(["upgrade", &release.name])
        .arg(chart_dir())
        .args(["--namespace", &release.namespace])
        .args([
            "--set",
            "crds.install=false",
            "--set",
            "nats.url=nats://nats.invalid:4222",
        ])
        .args(["--set", "shards=16"]);
    let refused = output(cmd, None);
    assert!(
        !refused.status.success(),
        "a shard count change was accepted"
    );
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(
        why.contains("shards cannot change after install") && why.contains("shards=8"),
        "{why}"
    );
    let dispatcher = statefulsets
        .get(&release.dispatcher())
        .await
        .expect("dispatcher");
    let disp_spec = dispatcher.spec;
    assert_eq!(disp_spec.replicas, Some(3));
    let operator = deployments
        .get(&release.operator())
        .await
        .expect("operator");
    for env in [
        container_env(disp_spec.template.spec.as_ref()),
        container_env(operator.spec.template.spec.as_ref()),
    ] {
        assert_eq!(
            env_value(&env, "HERALD_ALLOW_NETWORKS").as_deref(),
            Some("10.20.0.0/16,192.168.7.0/24")
        );
    }

    let out = release.uninstall();
    assert!(out.contains("uninstalled"), "{out}");
    eventually("every object of the release gone", WAIT, || async {
        existing(&manifest, &ctx.namespace).is_empty().then_some(())
    })
    .await;
    // The CRDs (installed by the harness, outside the release) are untouched.
    let mut cmd = env().kubectl();
    cmd.args(["get", "crd", "webhookendpoints.herald.dev", "-o", "name"]);
    ok(cmd, None);
    ctx.cleanup().await;
}

/// `kubectl auth can-i VERB RESOURCE --as SUBJECT -n NS`: whether it is allowed.
fn can_i(subject: &str, namespace: &str, verb: &str, resource: &str) -> bool {
    let mut cmd = env().kubectl();
    cmd.args([
        "auth", "can-i", verb, resource, "--as", subject, "-n", namespace,
    ]);
    let out = output(cmd, None);
    let answer = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    match answer.as_str() {
        "yes" => true,
        "no" => false,
        other => panic!(
            "kubectl auth can-i {verb} {resource} --as {subject}: {other:?} {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

#[tokio::test]
async fn service_accounts_have_least_privilege() {
    let ctx = TestContext::new("chart-rbac").await;
    let release = Release::install(&ctx, "rbac", &[]);
    let ns = &ctx.namespace;
    let dispatcher = format!("system:serviceaccount:{ns}:{}", release.dispatcher());
    for (verb, resource) in [
        ("list", "secrets"),
        ("get", "secrets"),
        ("get", "leases.coordination.k8s.io"),
        ("list", "webhookendpoints.herald.dev"),
        ("get", "configmaps"),
        ("create", "events.events.k8s.io"),
        ("list", "pods"),
    ] {
        assert!(
            !can_i(&dispatcher, ns, verb, resource),
            "the dispatcher may {verb} {resource}"
        );
    }
    let operator = format!("system:serviceaccount:{ns}:{}", release.operator());
    for (verb, resource, allowed) in [
        ("watch", "webhookendpoints.herald.dev", true),
        ("patch", "signingsecrets.herald.dev/status", true),
        ("create", "secrets", true),
        ("delete", "secrets", false),
        ("update", "secrets", false),
        ("create", "webhookendpoints.herald.dev", false),
        ("delete", "webhookendpoints.herald.dev", false),
        ("list", "configmaps", false),
        ("create", "events.events.k8s.io", true),
        ("create", "leases.coordination.k8s.io", true),
        ("delete", "leases.coordination.k8s.io", false),
    ] {
        assert_eq!(
            can_i(&operator, ns, verb, resource),
            allowed,
            "operator: {verb} {resource}"
        );
    }
    // The Lease rights are the release's own Lease in the release namespace only.
    let lease = format!("leases.coordination.k8s.io/{}-leader", release.operator());
    assert!(can_i(&operator, ns, "update", &lease));
    assert!(!can_i(
        &operator,
        ns,
        "update",
        "leases.coordination.k8s.io/other"
    ));
    assert!(!can_i(&operator, "default", "update", &lease));
    release.uninstall();
    ctx.cleanup().await;
}

/// A kubeconfig like the environment's that impersonates `user`.
fn impersonating_kubeconfig(user: &str, path: &std::path::Path) {
    let text = std::fs::read_to_string(env().kubeconfig()).expect("reading the kubeconfig");
    let mut config: Value = serde_norway::from_str(&text).expect("kubeconfig parses");
    for entry in config["users"].as_array_mut().expect("users") {
        entry["user"]["as"] = json!(user);
    }
    std::fs::write(
        path,
        serde_norway::to_string(&config).expect("kubeconfig serializes"),
    )
    .expect("writing the kubeconfig");
}

fn is_ready(conditions: Option<&Vec<Condition>>) -> bool {
    conditions
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// `GET /metrics` of the in-process operator.
async fn scrape(port: u16) -> Option<String> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await
        .ok()?;
    let mut body = String::new();
    stream.read_to_string(&mut body).await.ok()?;
    Some(body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_with_the_charts_rbac_reconciles() {
    let ctx = TestContext::new("chart-op").await;
    let release = Release::install(&ctx, "op", &["allowNetworks={127.0.0.0/8}"]);
    let ns = ctx.namespace.clone();
    let kubeconfig = std::env::temp_dir().join(format!("{}-kubeconfig", release.name));
    impersonating_kubeconfig(
        &format!("system:serviceaccount:{ns}:{}", release.operator()),
        &kubeconfig,
    );
    let port = herald_e2e::free_port();
    let lease_name = format!("{}-leader", release.operator());
    // The flags the chart's Deployment sets through the environment.
    let args = [
        "herald-operator",
        "--nats-url",
        env().nats_url(),
        // The test environment's NATS runs with the test dispatchers' shard count.
        "--shards",
        "4",
        "--namespace",
        &ns,
        "--lease-namespace",
        &ns,
        "--lease-name",
        &lease_name,
        "--identity",
        "op-0",
        "--kubeconfig",
        &kubeconfig.display().to_string(),
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--allow-network",
        "127.0.0.0/8",
    ]
    .map(str::to_owned);
    let config =
        <herald_operator::Config as clap::Parser>::try_parse_from(args).expect("operator flags");
    let (stop, stopped) = oneshot::channel::<()>();
    let operator = tokio::spawn(herald_operator::run(config, async move {
        let _ = stopped.await;
    }));

    let secrets = ctx.api::<SigningSecret>();
    let endpoints = ctx.api::<WebhookEndpoint>();
    let secret: SigningSecret = serde_json::from_value(json!({
        "apiVersion": "herald.dev/v1alpha1", "kind": "SigningSecret",
        "metadata": {"name": "keys"}, "spec": {}
    }))
    .expect("SigningSecret");
    let endpoint: WebhookEndpoint = serde_json::from_value(json!({
        "apiVersion": "herald.dev/v1alpha1", "kind": "WebhookEndpoint",
        "metadata": {"name": "orders"},
        "spec": {"url": "https://127.0.0.1:8443/hook", "eventTypes": ["order.*"], "secretRef": {"name": "keys"}}
    }))
    .expect("WebhookEndpoint");
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("creating the SigningSecret");
    endpoints
        .create(&PostParams::default(), &endpoint)
        .await
        .expect("creating the WebhookEndpoint");

    eventually("the SigningSecret Ready", WAIT, || async {
        let s = secrets.get("keys").await.ok()?;
        is_ready(s.status.as_ref().map(|s| &s.conditions)).then_some(())
    })
    .await;
    eventually("the WebhookEndpoint Ready", WAIT, || async {
        let e = endpoints.get("orders").await.ok()?;
        is_ready(e.status.as_ref().map(|s| &s.conditions)).then_some(())
    })
    .await;
    // A replay of the last hour to that endpoint: the replay controller's rights.
    let replays = ctx.api::<WebhookReplay>();
    let from = jiff::Timestamp::now() - jiff::SignedDuration::from_hours(1);
    let replay: WebhookReplay = serde_json::from_value(json!({
        "apiVersion": "herald.dev/v1alpha1", "kind": "WebhookReplay",
        "metadata": {"name": "last-hour"},
        "spec": {"endpoint": "orders", "from": from.to_string()}
    }))
    .expect("WebhookReplay");
    replays
        .create(&PostParams::default(), &replay)
        .await
        .expect("creating the WebhookReplay");
    eventually("the WebhookReplay validated", WAIT, || async {
        let r = replays.get("last-hour").await.ok()?;
        is_ready(r.status.as_ref().map(|s| &s.conditions)).then_some(())
    })
    .await;
    // The generated key Secret (create + patch), the Lease (create + update), an Event.
    let generated = ctx
        .api::<Secret>()
        .get("keys")
        .await
        .expect("generated Secret");
    assert!(generated.data.is_some_and(|d| d.contains_key("current")));
    let lease = ctx
        .api::<Lease>()
        .get(&lease_name)
        .await
        .expect("the Lease");
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("op-0")
    );
    eventually("a KeyGenerated Event", WAIT, || async {
        let mut cmd = env().kubectl();
        cmd.args([
            "get",
            "events.events.k8s.io",
            "-n",
            &ns,
            "-o",
            "jsonpath={.items[*].reason}",
        ]);
        ok(cmd, None).contains("KeyGenerated").then_some(())
    })
    .await;

    // Deleting goes through the finalizers (patch on the resources).
    secrets
        .delete("keys", &DeleteParams::default())
        .await
        .expect("deleting the SigningSecret");
    endpoints
        .delete("orders", &DeleteParams::default())
        .await
        .expect("deleting the WebhookEndpoint");
    eventually("both resources gone", WAIT, || async {
        let s = secrets.get_opt("keys").await.ok()?;
        let e = endpoints.get_opt("orders").await.ok()?;
        (s.is_none() && e.is_none()).then_some(())
    })
    .await;

    // No reconcile failed for want of a permission: no `kube` error category at all.
    let metrics = eventually("the operator's metrics", WAIT, || scrape(port)).await;
    let kube_errors: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("herald_operator_reconcile_errors_total{"))
        .filter(|l| l.contains("category=\"kube\"") && !l.ends_with(" 0"))
        .collect();
    assert!(
        kube_errors.is_empty(),
        "reconciles failed against the API: {kube_errors:?}"
    );
    assert!(metrics.contains("herald_operator_leader 1"), "{metrics}");

    let _ = stop.send(());
    let result = tokio::time::timeout(Duration::from_secs(30), operator)
        .await
        .expect("the operator stops")
        .expect("operator task");
    assert!(result.is_ok(), "{result:?}");
    // A graceful stop releases the Lease (update), so a standby takes over at once.
    let lease = ctx
        .api::<Lease>()
        .get(&lease_name)
        .await
        .expect("the Lease");
    assert_eq!(lease.spec.and_then(|s| s.holder_identity), None);
    let _ = std::fs::remove_file(&kubeconfig);
    release.uninstall();
    ctx.cleanup().await;
}
