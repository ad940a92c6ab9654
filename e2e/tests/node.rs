//! The chart on a real node: `helm install` of the chart with its default images (built
//! by `scripts/image.sh` and imported into the node's containerd under the names the
//! chart asks for), run by a kubelet, containerd and runc (`herald_e2e::node`) against
//! the test environment's API server and NATS. The operator, dispatcher and herald-api
//! pods become Ready by their own probes; a tenant's endpoint gets every event of a
//! stream, signed, while a dispatcher pod is deleted (`kubectl delete pod`) and a `helm
//! upgrade` rolls every pod; `helm uninstall` leaves nothing of the release behind.
//!
//! This test has its own `main` (`harness = false`): it first moves itself into a
//! network namespace of its own, where the node lives, before any thread starts. It
//! needs root and Debian's `containerd`, `runc`, `containernetworking-plugins` and
//! `busybox-static` (`scripts/test.sh` installs them); without root it reports itself
//! skipped.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use herald_core::signing::verify;
use herald_e2e::dataplane::DataPlane;
use herald_e2e::helm::{chart_dir, helm, ok, output};
use herald_e2e::node::{
    API_SERVICE_IP, NODE_IP, Node, clean_up_stale_nodes, forward, isolate_network,
};
use herald_e2e::receiver::Receiver;
use herald_e2e::{TestEnv, eventually, orders_endpoint, private_env, repo_root, workspace_binary};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use serde_json::{Value, json};

const NAME: &str = "the_chart_runs_on_a_real_node";
const RELEASE: &str = "herald";
const NAMESPACE: &str = "herald-system";
/// The tenant's namespace.
const TENANT: &str = "shop";
const WAIT: Duration = Duration::from_secs(120);

fn main() {
    if let Err(why) = isolate_network() {
        println!("test {NAME} ... skipped: {why}");
        return;
    }
    println!("\nrunning 1 test");
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(the_chart_runs_on_a_real_node());
    println!("test {NAME} ... ok\n");
    println!("test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out");
}

fn say(started: Instant, what: &str) {
    println!("[node +{:.1}s] {what}", started.elapsed().as_secs_f64());
}

async fn the_chart_runs_on_a_real_node() {
    herald_dispatcher::install_crypto_provider();
    let started = Instant::now();
    clean_up_stale_nodes();
    let te = private_env();
    let work = std::env::temp_dir().join(format!("herald-node-{}", std::process::id()));
    let images = build_images(&work.join("images"));
    say(started, "images built");
    let node = Node::start(te, &work.join("node")).await;
    let (repository, version) = chart_image_defaults();
    // The chart's default images, and the same again under the tag of the "next release"
    // the upgrade below moves to.
    let next = format!("{version}-next");
    for (name, layout) in &images {
        node.import(layout, &format!("{repository}/{name}:{version}"));
        node.import(layout, &format!("{repository}/{name}:{next}"));
    }
    say(
        started,
        &format!("node {} Ready; images imported", node.name),
    );

    // What a Service and kube-proxy give pods: the API server at the `kubernetes`
    // Service's address, NATS at the node's.
    forward(&format!("{API_SERVICE_IP}:443"), host_port(te.kubeconfig())).await;
    let nats_port = te
        .nats_url()
        .rsplit(':')
        .next()
        .expect("a NATS port")
        .to_owned();
    forward(
        &format!("{NODE_IP}:{nats_port}"),
        format!("127.0.0.1:{nats_port}"),
    )
    .await;

    // A tenant namespace the operator serves (with the Secrets of its signing keys).
    let mut namespace = te.kubectl();
    namespace.args(["create", "namespace", TENANT]);
    ok(namespace, None);
    let values = [
        format!("nats.url=nats://{NODE_IP}:{nats_port}"),
        format!("operator.tenantNamespaces={{{TENANT}}}"),
    ];
    let values: Vec<&str> = values.iter().map(String::as_str).collect();
    let installed = Instant::now();
    helm_release(te, "install", &values);
    say(
        started,
        &format!(
            "helm install --wait: every workload ready {:.1} s after the install began",
            installed.elapsed().as_secs_f64()
        ),
    );
    let pods: Api<Pod> = Api::namespaced(te.client().await, NAMESPACE);
    let ready = ready_pods(&pods).await;
    for component in ["operator", "dispatcher", "api"] {
        assert!(
            ready.iter().any(|p| p.component == component),
            "no Ready {component} pod: {ready:?}"
        );
    }
    let names: Vec<_> = ready.iter().map(|p| p.name.as_str()).collect();
    say(started, &format!("Ready by their probes: {names:?}"));

    // The tenant.
    let rx = Receiver::start_on(NODE_IP).await;
    let client = te.client().await;
    let key = orders_endpoint(&client, TENANT, &rx.url("orders"), WAIT).await;
    say(started, "the tenant's endpoint Ready");

    let dp = DataPlane::new(te.nats().await).await;
    let stop = Arc::new(AtomicBool::new(false));
    let producer = tokio::spawn({
        let (dp, stop) = (dp.clone(), stop.clone());
        async move {
            let mut sent = 0i64;
            while !stop.load(Ordering::Relaxed) || sent < 200 {
                dp.publish(TENANT, "order.created", json!(sent)).await;
                sent += 1;
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
            sent
        }
    });
    eventually("the first deliveries", WAIT, || async {
        (rx.received("orders").len() >= 20).then_some(())
    })
    .await;

    // kubectl delete pod: its StatefulSet replaces it; the other replica takes its
    // shards meanwhile.
    let victim = ready
        .iter()
        .find(|p| p.component == "dispatcher")
        .expect("a dispatcher pod")
        .clone();
    let mut delete = te.kubectl();
    delete.args([
        "delete",
        "pod",
        &victim.name,
        "-n",
        NAMESPACE,
        "--wait=true",
    ]);
    ok(delete, None);
    eventually(
        &format!("{} replaced and Ready", victim.name),
        WAIT,
        || async {
            let pod = pods.get_opt(&victim.name).await.ok()??;
            (pod.metadata.uid.as_ref() != Some(&victim.uid) && pod_ready(&pod)).then_some(())
        },
    )
    .await;
    say(
        started,
        &format!(
            "kubectl delete pod {}: replaced and Ready; {} requests so far",
            victim.name,
            rx.received("orders").len()
        ),
    );

    // helm upgrade to a new release's images while events flow: every pod of every
    // workload is replaced.
    let before: BTreeSet<String> = ready_pods(&pods).await.into_iter().map(|p| p.uid).collect();
    let upgraded = Instant::now();
    helm_release(
        te,
        "upgrade",
        &[values.as_slice(), &[&format!("image.tag={next}")]].concat(),
    );
    assert!(
        !producer.is_finished(),
        "the upgrade ran while events flowed"
    );
    say(
        started,
        &format!(
            "helm upgrade --wait: rolled out in {:.1} s; {} requests so far",
            upgraded.elapsed().as_secs_f64(),
            rx.received("orders").len()
        ),
    );
    let after = ready_pods(&pods).await;
    let stayed: Vec<_> = after.iter().filter(|p| before.contains(&p.uid)).collect();
    assert!(
        stayed.is_empty(),
        "the upgrade replaces every pod; these stayed: {stayed:?}"
    );

    // A few seconds more of events, served by the new release's pods alone.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    let sent = producer.await.expect("the producer");
    if let Err(missing) = rx.until_numbered("orders", sent, WAIT).await {
        panic!(
            "{} of {sent} events never arrived, e.g. {:?}\n{}",
            missing.len(),
            &missing[..missing.len().min(20)],
            describe(te)
        );
    }
    let requests = rx.received("orders");
    let now = jiff::Timestamp::now().as_second();
    for request in &requests {
        verify(
            std::slice::from_ref(&key),
            request.header("webhook-id"),
            request.header("webhook-timestamp"),
            request.header("webhook-signature"),
            &request.body,
            now,
            600,
        )
        .expect("every request is signed with the tenant's key");
    }
    say(
        started,
        &format!(
            "{sent} events published, every one delivered and signed ({} requests, {} duplicates)",
            requests.len(),
            requests.len() as i64 - sent
        ),
    );

    // helm uninstall: nothing of the release is left.
    let mut uninstall = helm();
    uninstall
        .env("KUBECONFIG", te.kubeconfig())
        .args(["uninstall", RELEASE, "--namespace", NAMESPACE, "--wait"])
        .args(["--timeout", "3m"]);
    ok(uninstall, None);
    eventually("every pod of the release gone", WAIT, || async {
        pods.list(&ListParams::default())
            .await
            .ok()?
            .items
            .is_empty()
            .then_some(())
    })
    .await;
    let selector = format!("app.kubernetes.io/instance={RELEASE}");
    let mut left = te.kubectl();
    left.args([
        "get",
        "deployments,statefulsets,services,serviceaccounts,configmaps,secrets,roles,\
         rolebindings,poddisruptionbudgets,clusterroles,clusterrolebindings,\
         validatingadmissionpolicies,validatingadmissionpolicybindings",
        "-A",
        "-l",
        &selector,
        "-o",
        "name",
    ]);
    let left = ok(left, None);
    assert!(
        left.trim().is_empty(),
        "helm uninstall left objects of the release:\n{left}"
    );
    let mut releases = helm();
    releases
        .env("KUBECONFIG", te.kubeconfig())
        .args(["list", "-A", "-q"]);
    assert_eq!(ok(releases, None).trim(), "", "no release is left");
    say(
        started,
        "helm uninstall --wait: no pod, object or release record of the release left (the CRDs stay, as the chart documents)",
    );
    drop(node);
    let _ = std::fs::remove_dir_all(&work);
}

/// `helm <action>` of the release with the values this environment needs and `set`:
/// one JetStream replica (one nats-server), the receiver's network allowed over HTTP,
/// herald-api on, short grace periods and status intervals for a quick test.
fn helm_release(te: &TestEnv, action: &str, set: &[&str]) {
    let mut cmd = helm();
    cmd.env("KUBECONFIG", te.kubeconfig())
        .args([action, RELEASE])
        .arg(chart_dir())
        .args(["--namespace", NAMESPACE, "--wait", "--timeout", "90s"]);
    if action == "install" {
        cmd.arg("--create-namespace");
    }
    for value in [
        "shards=4",
        "nats.jetstreamReplicas=1",
        &format!("allowNetworks={{{NODE_IP}/32}}"),
        "allowHttp=true",
        "api.enabled=true",
        "operator.statusInterval=1s",
        "dispatcher.graceSeconds=5",
    ]
    .iter()
    .chain(set)
    {
        cmd.args(["--set", value]);
    }
    let out = output(cmd, None);
    assert!(
        out.status.success(),
        "helm {action} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        describe(te)
    );
}

/// What `kubectl` says of the release's pods and the namespace's events, for a
/// failure's message.
fn describe(te: &TestEnv) -> String {
    let mut text = String::new();
    for args in [
        vec!["get", "pods", "-o", "wide", "-n", NAMESPACE],
        vec!["describe", "pods", "-n", NAMESPACE],
        vec!["get", "events", "-n", NAMESPACE],
        vec![
            "logs",
            "-n",
            NAMESPACE,
            "--tail=20",
            "--prefix",
            "-l",
            "app.kubernetes.io/instance=herald",
        ],
    ] {
        let mut kubectl = te.kubectl();
        kubectl.args(&args);
        let out = output(kubectl, None);
        text.push_str(&format!(
            "$ kubectl {}\n{}{}\n",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    text
}

/// The images' repository and tag the chart asks for by default: `image.repository` and
/// the chart's version.
fn chart_image_defaults() -> (String, String) {
    let read = |file: &str| -> Value {
        let text = std::fs::read_to_string(chart_dir().join(file)).expect("reading the chart");
        serde_norway::from_str(&text).expect("the chart's YAML parses")
    };
    let repository = read("values.yaml")["image"]["repository"]
        .as_str()
        .expect("image.repository")
        .to_owned();
    let version = read("Chart.yaml")["version"]
        .as_str()
        .expect("the chart's version")
        .to_owned();
    (repository, version)
}

/// The three images `scripts/image.sh` builds from this build's binaries (debug info
/// stripped: the images are imported, not pushed), each as an OCI layout in `out`.
fn build_images(out: &Path) -> Vec<(String, PathBuf)> {
    let names = ["herald-operator", "herald-dispatcher", "herald-api"];
    let bin = out.join("bin");
    std::fs::create_dir_all(&bin).expect("creating the image work dir");
    for name in names {
        let mut strip = Command::new("objcopy");
        strip
            .arg("--strip-debug")
            .arg(workspace_binary(name))
            .arg(bin.join(name));
        ok(strip, None);
    }
    let mut build = Command::new(repo_root().join("scripts/image.sh"));
    build
        .arg("--bin-dir")
        .arg(&bin)
        .arg("--out")
        .arg(out)
        .env("TMPDIR", std::env::temp_dir())
        .env_remove("REGISTRY")
        .env_remove("TAG");
    ok(build, None);
    names
        .iter()
        .map(|name| (name.to_string(), out.join(name)))
        .collect()
}

/// `host:port` of the API server in `kubeconfig`.
fn host_port(kubeconfig: PathBuf) -> String {
    let text = std::fs::read_to_string(kubeconfig).expect("reading the kubeconfig");
    let config: Value = serde_norway::from_str(&text).expect("the kubeconfig parses");
    config["clusters"][0]["cluster"]["server"]
        .as_str()
        .and_then(|s| s.strip_prefix("https://"))
        .expect("an https server")
        .trim_end_matches('/')
        .to_owned()
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// A pod of the release.
#[derive(Debug, Clone)]
struct ReadyPod {
    name: String,
    /// `app.kubernetes.io/component`: operator, dispatcher, api.
    component: String,
    uid: String,
}

/// The release's pods, once every one is Ready.
async fn ready_pods(pods: &Api<Pod>) -> Vec<ReadyPod> {
    eventually("every pod of the release Ready", WAIT, || async {
        let list = pods.list(&ListParams::default()).await.ok()?.items;
        (!list.is_empty() && list.iter().all(pod_ready)).then(|| {
            list.iter()
                .map(|p| ReadyPod {
                    name: p.metadata.name.clone().unwrap_or_default(),
                    component: p
                        .metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get("app.kubernetes.io/component"))
                        .cloned()
                        .unwrap_or_default(),
                    uid: p.metadata.uid.clone().unwrap_or_default(),
                })
                .collect()
        })
    })
    .await
}
