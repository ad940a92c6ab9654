//! A real Kubernetes node for the test environment: containerd and runc (Debian's
//! packages), a kubelet, and the kube-scheduler and kube-controller-manager controllers
//! that Deployments and StatefulSets need, the three built from the test environment's
//! Kubernetes module (`scripts/build-e2e.sh node`). Why each setting is what it is:
//! `e2e/node/README.md`.
//!
//! The node lives in a network namespace of the test's own ([`isolate_network`]): the
//! node's address and the `kubernetes` Service's address are on that namespace's loopback
//! device, the pods get addresses on a bridge inside it, and nothing is reachable from the
//! machine's real network. The API server and NATS of the test environment listen on
//! 127.0.0.1 there; [`forward`] gives pods a way to them, as kube-proxy and a Service
//! would.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node as KubeNode;
use kube::Api;
use serde_json::Value;

use crate::helm::{built_tool, ok};
use crate::{TestEnv, eventually, repo_root};

mod teardown;
pub use teardown::{clean_up_stale_nodes, kept_logs};

/// The node's address (`--node-ip`), on the namespace's loopback device.
pub const NODE_IP: &str = "10.99.0.1";

/// The `kubernetes` Service's ClusterIP in the test environment (the first address of
/// its `--service-cluster-ip-range`, named by the API server's serving certificate): the
/// kubelet gives pods `KUBERNETES_SERVICE_HOST` = this and port 443.
pub const API_SERVICE_IP: &str = "10.0.0.1";

const REEXECUTED: &str = "HERALD_NODE_NETNS";

/// What this machine lacks to run a node: root, Debian's `containerd`, `runc`,
/// `containernetworking-plugins` and `busybox-static` (`scripts/test.sh` installs them).
/// Empty when it can.
pub fn missing_prerequisites() -> Vec<String> {
    let mut missing = Vec::new();
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(str::to_owned))
        })
        .unwrap_or_default();
    if uid != "0" {
        missing.push("root".to_owned());
    }
    for path in [
        "/usr/bin/containerd",
        "/usr/bin/ctr",
        "/usr/sbin/runc",
        "/usr/lib/cni/bridge",
        "/usr/lib/cni/host-local",
        "/bin/busybox",
    ] {
        if !Path::new(path).exists() {
            missing.push(path.to_owned());
        }
    }
    missing
}

/// Runs this process again in a network namespace of its own (`unshare --net`), unless
/// it already does, then brings its loopback device up with [`NODE_IP`] and
/// [`API_SERVICE_IP`] on it. Call it first thing in `main`, before any thread starts.
/// `Err` says why it cannot ([`missing_prerequisites`]).
pub fn isolate_network() -> Result<(), String> {
    if std::env::var_os(REEXECUTED).is_none() {
        let missing = missing_prerequisites();
        if !missing.is_empty() {
            return Err(format!("a real node needs {}", missing.join(", ")));
        }
        let exe = std::env::current_exe().map_err(|e| format!("this test's path: {e}"))?;
        let error = Command::new("unshare")
            .arg("--net")
            .arg("--")
            .arg(exe)
            .args(std::env::args_os().skip(1))
            .env(REEXECUTED, "1")
            .exec();
        return Err(format!("unshare --net: {error}"));
    }
    for args in [
        vec!["link", "set", "lo", "up"],
        vec!["addr", "add", &format!("{NODE_IP}/32"), "dev", "lo"],
        vec!["addr", "add", &format!("{API_SERVICE_IP}/32"), "dev", "lo"],
    ] {
        let mut ip = Command::new("ip");
        ip.args(&args);
        ok(ip, None);
    }
    Ok(())
}

/// Accepts TCP connections on `listen` and joins each to `target`, until the runtime
/// ends: what kube-proxy does for a Service.
pub async fn forward(listen: &str, target: String) {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .unwrap_or_else(|e| panic!("binding {listen}: {e}"));
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let target = target.clone();
            tokio::spawn(async move {
                if let Ok(mut server) = tokio::net::TcpStream::connect(&target).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
}

/// A running node; [`Drop`] stops it and removes what it left on the machine.
pub struct Node {
    dir: PathBuf,
    socket: PathBuf,
    /// containerd, the kubelet, kube-scheduler, kube-controller-manager (started in
    /// that order, stopped in the reverse).
    processes: Vec<(&'static str, Child)>,
    /// The Node object's name (the machine's hostname).
    pub name: String,
}

impl Node {
    /// Starts a node in `dir` for the test environment `te` and returns once it is Ready.
    pub async fn start(te: &TestEnv, dir: &Path) -> Self {
        let _ = std::fs::remove_dir_all(dir);
        for sub in ["img", "cni/net.d", "fakesys", "manifests", "containerd"] {
            std::fs::create_dir_all(dir.join(sub)).expect("creating the node's dirs");
        }
        let mut node = Self {
            dir: dir.to_owned(),
            socket: dir.join("containerd.sock"),
            processes: Vec::new(),
            name: String::new(),
        };
        let templates = repo_root().join("e2e/node");
        let template = |name: &str| {
            std::fs::read_to_string(templates.join(name))
                .unwrap_or_else(|e| panic!("reading e2e/node/{name}: {e}"))
                .replace("@NODE_DIR@", &dir.display().to_string())
        };
        std::fs::write(
            dir.join("cni/net.d/10-bridge.conflist"),
            template("10-bridge.conflist"),
        )
        .expect("writing the CNI configuration");
        std::fs::write(
            dir.join("kubelet-config.yaml"),
            template("kubelet-config.yaml"),
        )
        .expect("writing the kubelet's configuration");
        std::fs::write(dir.join("containerd.toml"), containerd_config(dir))
            .expect("writing containerd's configuration");

        let containerd = node.spawn(
            "containerd",
            Command::new("containerd")
                .arg("--config")
                .arg(dir.join("containerd.toml")),
        );
        node.processes.push(("containerd", containerd));
        let started = Instant::now();
        while !node
            .ctr()
            .arg("version")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "containerd did not answer within 30 s; see {}",
                dir.join("containerd.log").display()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        node.import(&pause_image(dir), "localhost/pause:local");

        // A copy of the admin kubeconfig in `dir`: every process of the node names `dir`
        // on its command line, which is how a teardown finds them all.
        let kubeconfig = dir.join("kubeconfig");
        std::fs::copy(te.kubeconfig(), &kubeconfig).expect("copying the kubeconfig");
        let mut kubelet = Command::new(templates.join("run-kubelet.sh"));
        kubelet
            .env("NODE_DIR", dir)
            .env(
                "HERALD_BIN_DIR",
                built_tool("kubelet").parent().expect("bin dir"),
            )
            .env("NODE_IP", NODE_IP)
            .env("KUBELET_KUBECONFIG", &kubeconfig);
        let kubelet = node.spawn("kubelet", &mut kubelet);
        node.processes.push(("kubelet", kubelet));

        let ca = dir.join("ca.crt");
        std::fs::write(&ca, cluster_ca(&kubeconfig)).expect("writing the cluster's CA");
        let scheduler = node.spawn(
            "scheduler",
            Command::new(built_tool("kube-scheduler"))
                .arg(format!("--kubeconfig={}", kubeconfig.display()))
                .args(["--leader-elect=false", "--secure-port=0"]),
        );
        node.processes.push(("scheduler", scheduler));
        // The test environment runs the namespace and garbage-collector controllers; a
        // node needs these as well. `kube-root-ca.crt` in every namespace is what
        // in-cluster clients trust the API server with.
        let controllers = node.spawn(
            "controller-manager",
            Command::new(built_tool("kube-controller-manager"))
                .arg(format!("--kubeconfig={}", kubeconfig.display()))
                .arg(format!("--root-ca-file={}", ca.display()))
                .args([
                    "--leader-elect=false",
                    "--secure-port=0",
                    "--controllers=deployment-controller,replicaset-controller,\
                     statefulset-controller,node-lifecycle-controller,\
                     root-ca-certificate-publisher-controller",
                ]),
        );
        node.processes.push(("controller-manager", controllers));

        node.name = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .expect("the hostname")
            .trim()
            .to_owned();
        let nodes: Api<KubeNode> = Api::all(te.client().await);
        let name = node.name.clone();
        eventually("the node Ready", Duration::from_secs(120), || async {
            let n = nodes.get_opt(&name).await.ok()??;
            n.status?
                .conditions?
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
                .then_some(())
        })
        .await;
        node
    }

    /// Imports the OCI image layout `layout` into containerd's `k8s.io` namespace as
    /// `name` (a full reference: the kubelet asks for exactly that).
    pub fn import(&self, layout: &Path, name: &str) {
        let index_path = layout.join("index.json");
        let mut index: Value = serde_json::from_str(
            &std::fs::read_to_string(&index_path).expect("the layout's index.json"),
        )
        .expect("index.json is JSON");
        for manifest in index["manifests"]
            .as_array_mut()
            .expect("index.json lists manifests")
        {
            manifest["annotations"]["io.containerd.image.name"] = name.into();
        }
        std::fs::write(&index_path, index.to_string()).expect("writing index.json");
        let archive = self
            .dir
            .join("img")
            .join(format!("{}.tar", name.replace(['/', ':'], "_")));
        let mut tar = Command::new("tar");
        tar.arg("-C").arg(layout).arg("-cf").arg(&archive).args([
            "oci-layout",
            "index.json",
            "blobs",
        ]);
        ok(tar, None);
        let mut import = self.ctr();
        import.args(["images", "import"]).arg(&archive);
        ok(import, None);
    }

    /// `ctr` against this node's containerd, in the kubelet's namespace.
    fn ctr(&self) -> Command {
        let mut cmd = Command::new("ctr");
        cmd.arg("--address")
            .arg(&self.socket)
            .args(["-n", "k8s.io"]);
        cmd
    }

    fn spawn(&self, name: &str, cmd: &mut Command) -> Child {
        let log = std::fs::File::create(self.dir.join(format!("{name}.log")))
            .expect("creating a node log");
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone().expect("log handle"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"))
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // In the reverse order of their start: the controllers and the scheduler, the
        // kubelet (so it restarts nothing), containerd last.
        while let Some((_, mut child)) = self.processes.pop() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            let kept = kept_logs();
            let _ = std::fs::create_dir_all(&kept);
            for entry in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
                if entry.path().extension().is_some_and(|e| e == "log") {
                    let _ = std::fs::copy(entry.path(), kept.join(entry.file_name()));
                }
            }
            eprintln!("node: its logs are kept in {}", kept.display());
        }
        teardown::teardown(&self.dir);
    }
}

/// containerd's default configuration with its state in `dir`, its socket at
/// `dir/containerd.sock`, the pause image built here, Debian's CNI plugins, the CNI
/// configuration in `dir`, and `restrict_oom_score_adj` (root without
/// `CAP_SYS_RESOURCE` cannot raise a process's OOM score).
fn containerd_config(dir: &Path) -> String {
    let default = Command::new("containerd")
        .args(["config", "default"])
        .output()
        .expect("containerd is installed (Debian's containerd package)");
    assert!(default.status.success(), "containerd config default failed");
    let d = dir.display();
    let mut config = String::from_utf8(default.stdout).expect("a UTF-8 configuration");
    for (from, to) in [
        (
            "root = \"/var/lib/containerd\"".to_owned(),
            format!("root = \"{d}/containerd/root\""),
        ),
        (
            "state = \"/run/containerd\"".to_owned(),
            format!("state = \"{d}/containerd/state\""),
        ),
        (
            "address = \"/run/containerd/containerd.sock\"".to_owned(),
            format!("address = \"{d}/containerd.sock\""),
        ),
        (
            "restrict_oom_score_adj = false".to_owned(),
            "restrict_oom_score_adj = true".to_owned(),
        ),
        (
            "bin_dir = \"/opt/cni/bin\"".to_owned(),
            "bin_dir = \"/usr/lib/cni\"".to_owned(),
        ),
        (
            "conf_dir = \"/etc/cni/net.d\"".to_owned(),
            format!("conf_dir = \"{d}/cni/net.d\""),
        ),
    ] {
        assert!(
            config.contains(&from),
            "containerd's default configuration has no `{from}`"
        );
        config = config.replace(&from, &to);
    }
    let sandbox = config
        .lines()
        .find(|l| l.trim_start().starts_with("sandbox_image = "))
        .expect("containerd's default configuration names a sandbox image")
        .to_owned();
    config.replace(&sandbox, "    sandbox_image = \"localhost/pause:local\"")
}

/// The pod sandbox ("pause") image, built with `ocibuild` from Debian's static busybox:
/// a shell that sleeps until it is told to stop. Returns its OCI layout.
fn pause_image(dir: &Path) -> PathBuf {
    let root = dir.join("img/pause-root");
    std::fs::create_dir_all(root.join("bin")).expect("creating the pause image's root");
    std::fs::copy("/bin/busybox", root.join("bin/busybox"))
        .expect("/bin/busybox (Debian's busybox-static package)");
    std::os::unix::fs::symlink("busybox", root.join("bin/sh")).expect("linking /bin/sh");
    for tool in [
        "sleep", "nc", "wget", "ip", "ping", "ifconfig", "route", "cat", "ls",
    ] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(tool)).expect("linking a tool");
    }
    let layout = dir.join("img/pause");
    let mut build = Command::new(built_tool("ocibuild"));
    build
        .arg("--layer")
        .arg(&root)
        .arg("--entrypoint")
        .arg(r#"["/bin/sh","-c","trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"]"#)
        .args(["--tag", "localhost/pause:local", "--out"])
        .arg(&layout);
    ok(build, None);
    layout
}

/// The CA certificate (PEM) of the cluster in `kubeconfig`.
fn cluster_ca(kubeconfig: &Path) -> Vec<u8> {
    use base64::Engine as _;
    let text = std::fs::read_to_string(kubeconfig).expect("reading the kubeconfig");
    let config: Value = serde_norway::from_str(&text).expect("the kubeconfig parses");
    let data = config["clusters"][0]["cluster"]["certificate-authority-data"]
        .as_str()
        .expect("the kubeconfig embeds its CA");
    base64::engine::general_purpose::STANDARD
        .decode(data)
        .expect("the CA is base64")
}
