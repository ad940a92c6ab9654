//! Test harness for tests against the real kube-apiserver and nats-server of
//! `e2e/testenv` (built by `scripts/build-e2e.sh`).
//!
//! The environment is started once per test run: `scripts/test.sh` starts it and sets
//! `HERALD_TESTENV_DIR`; a test binary run on its own (`cargo test -p herald-e2e`) starts
//! a private one that exits with the test process. Every test gets its own namespace
//! ([`TestContext`]), a kube [`Client`] and a NATS client, so tests run in parallel.

#![forbid(unsafe_code)]

pub mod bench;
pub mod chaos;
pub mod dataplane;
pub mod faults;
pub mod helm;
pub mod nats_process;
pub mod node;
pub mod proxy;
pub mod receiver;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, Client, Config};

/// A running test environment.
pub struct TestEnv {
    dir: PathBuf,
    bin_dir: PathBuf,
    nats_url: String,
    /// One client URL per nats-server node (one entry unless `--nats-cluster`).
    nats_nodes: Vec<String>,
    /// A private environment started by this process, if any. Never waited on: the
    /// environment exits by itself once this process is gone (`--parent-pid`).
    _child: Option<Child>,
}

static ENV: OnceLock<TestEnv> = OnceLock::new();
static PRIVATE_ENV: OnceLock<TestEnv> = OnceLock::new();
static BENCHMARK_ENV: OnceLock<TestEnv> = OnceLock::new();
static PRIVATE_CLUSTER_ENV: OnceLock<TestEnv> = OnceLock::new();
static PRIVATE_SECURE_ENV: OnceLock<TestEnv> = OnceLock::new();
static PRIVATE_JWT_ENV: OnceLock<TestEnv> = OnceLock::new();
static PRIVATE_OLDEST_ENV: OnceLock<TestEnv> = OnceLock::new();
static FAULTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The test environment of this run, started on first use when none was given.
pub fn env() -> &'static TestEnv {
    ENV.get_or_init(TestEnv::attach_or_start)
}

/// An environment of this test process alone, for tests that inject faults (NATS
/// restarts, API server blackouts) which would disturb tests sharing [`env`]. Such tests
/// also hold [`fault_lock`] so they do not disturb each other.
pub fn private_env() -> &'static TestEnv {
    PRIVATE_ENV.get_or_init(|| TestEnv::start_with("private", &[]))
}

/// The benchmark's environment: [`private_env`] with the Go collector at `GOGC=400`.
/// The testenv runs nats-server in one Go process with etcd and kube-apiserver, so each
/// collection marks their heap too; at Go's default (100) that cost nats-server 114 µs
/// of CPU per delivered event against 88 at 400 (`docs/bench/profile.md`, "Fixes").
/// A nats-server of its own collects only its own heap (and is tuned with `GOGC` or
/// `GOMEMLIMIT` in production, `docs/nats.md`).
pub fn private_benchmark_env() -> &'static TestEnv {
    BENCHMARK_ENV.get_or_init(|| TestEnv::start_with_env("bench", &[], &[("GOGC", "400")]))
}

/// An environment of this test process alone whose NATS is a JetStream cluster of three
/// nats-server processes (`testenv run --nats-cluster 3`, server names `n0`, `n1`, `n2`), for
/// tests that SIGKILL and restart single nodes ([`TestEnv::kill_nats_node`],
/// [`TestEnv::start_nats_node`]). Its [`TestEnv::nats_url`] is the comma-separated list of
/// all nodes; [`TestEnv::nats`] connects to all of them. Tests of one binary that share it
/// and kill nodes should also hold [`fault_lock`].
pub fn private_cluster_env() -> &'static TestEnv {
    PRIVATE_CLUSTER_ENV.get_or_init(|| TestEnv::start_with("cluster", &["--nats-cluster", "3"]))
}

/// An environment of this test process alone whose API server is the oldest Kubernetes
/// Herald supports (`testenv run --kube-apiserver` with the `kube-apiserver-oldest` that
/// `scripts/build-e2e.sh` built; no controller-manager, which must not be newer than its
/// API server).
pub fn private_oldest_env() -> &'static TestEnv {
    PRIVATE_OLDEST_ENV.get_or_init(|| {
        let apiserver = helm::built_tool("kube-apiserver-oldest");
        let apiserver = apiserver.to_str().expect("a UTF-8 tool path");
        TestEnv::start_with("oldest", &["--kube-apiserver", apiserver])
    })
}

/// An environment of this test process alone whose NATS runs the way production should:
/// TLS with verified client certificates and the permission model of
/// `examples/nats/herald-accounts.conf`, unchanged (`testenv run --nats-secure`). Every
/// client needs an identity: [`TestEnv::nats`] is the admin, [`TestEnv::nats_as`] and
/// [`TestEnv::nats_flags`] give the others (`operator`, `dispatcher`,
/// `producer-tenant-a`, `producer-tenant-b`; `stranger` has a certificate of another CA).
pub fn private_secure_env() -> &'static TestEnv {
    PRIVATE_SECURE_ENV.get_or_init(|| {
        let accounts = repo_root().join("examples/nats/herald-accounts.conf");
        let accounts = accounts.to_str().expect("a UTF-8 repository path");
        TestEnv::start_with("secure", &["--nats-secure", accounts])
    })
}

/// Like [`private_secure_env`], with the same accounts and permissions in operator (JWT)
/// mode (`testenv run --nats-secure … --nats-jwt`): an operator, account JWTs in a memory
/// resolver, and a credentials file (user JWT + NKey seed) per identity. TLS stays (with
/// verified client certificates); [`TestEnv::nats_flags`] and [`TestEnv::nats_as`] log in
/// with the identity's `.creds` instead of its NKey.
pub fn private_jwt_env() -> &'static TestEnv {
    PRIVATE_JWT_ENV.get_or_init(|| {
        let accounts = repo_root().join("examples/nats/herald-accounts.conf");
        let accounts = accounts.to_str().expect("a UTF-8 repository path");
        TestEnv::start_with("jwt", &["--nats-secure", accounts, "--nats-jwt"])
    })
}

/// Resolves when the process that started this one is gone: test binaries (the test
/// dispatcher and operator) stop with the test that started them, even when it
/// panicked or was killed.
pub async fn orphaned() {
    let parent = std::os::unix::process::parent_id();
    while std::os::unix::process::parent_id() == parent {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// SIGINT, then wait (without blocking the test's runtime, which serves the receiver):
/// a graceful stop of a process a test started (a dispatcher). A process that has not
/// stopped after 30 s is killed, so a lost signal cannot hang the test.
pub async fn stop(mut child: Child) {
    let _ = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    for _ in 0..300 {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "process {} did not stop within 30 s of SIGINT; killing it",
        child.id()
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// Serializes the fault-injecting tests of one process.
pub async fn fault_lock() -> tokio::sync::MutexGuard<'static, ()> {
    FAULTS.lock().await
}

fn bin_dir() -> PathBuf {
    std::env::var_os("HERALD_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| home().join(".cache/herald/bin"))
}

fn home() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root"))
}

impl TestEnv {
    fn attach_or_start() -> Self {
        let bin_dir = bin_dir();
        if let Some(dir) = std::env::var_os("HERALD_TESTENV_DIR") {
            let dir = PathBuf::from(dir);
            wait_ready(&dir, None);
            return Self::open(dir, bin_dir, None);
        }
        Self::start()
    }

    fn start() -> Self {
        Self::start_with("", &[])
    }

    /// Starts `testenv run` with extra `args`; `label` tells the dir and log of several
    /// private environments of one process apart.
    fn start_with(label: &str, args: &[&str]) -> Self {
        Self::start_with_env(label, args, &[])
    }

    /// [`Self::start_with`] with extra environment variables for the testenv process.
    fn start_with_env(label: &str, args: &[&str], vars: &[(&str, &str)]) -> Self {
        let bin_dir = bin_dir();
        let name = if label.is_empty() {
            format!("herald-testenv-{}", std::process::id())
        } else {
            format!("herald-testenv-{}-{label}", std::process::id())
        };
        let dir = std::env::temp_dir().join(&name);
        let testenv = bin_dir.join("testenv");
        assert!(
            testenv.exists(),
            "{} is missing: run scripts/build-e2e.sh (or `make test`) first",
            testenv.display()
        );
        let log = std::fs::File::create(std::env::temp_dir().join(format!("{name}.log")))
            .expect("creating the testenv log");
        let mut child = Command::new(&testenv)
            .args(["run", "--dir"])
            .arg(&dir)
            .arg("--parent-pid")
            .arg(std::process::id().to_string())
            .args(args)
            .envs(vars.iter().copied())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log handle"))
            .stderr(log)
            .spawn()
            .expect("starting testenv");
        wait_ready(&dir, Some(&mut child));
        Self::open(dir, bin_dir, Some(child))
    }

    fn open(dir: PathBuf, bin_dir: PathBuf, child: Option<Child>) -> Self {
        let nats_url = std::fs::read_to_string(dir.join("nats-url"))
            .expect("reading nats-url")
            .trim()
            .to_owned();
        // DIR/nats-nodes is missing when attached to an environment from before it existed.
        let nats_nodes = match std::fs::read_to_string(dir.join("nats-nodes")) {
            Ok(text) => text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_owned)
                .collect(),
            Err(_) => nats_url
                .split(',')
                .map(str::trim)
                .map(str::to_owned)
                .collect(),
        };
        Self {
            dir,
            bin_dir,
            nats_url,
            nats_nodes,
            _child: child,
        }
    }

    /// The directory of the certificates and NKey seeds of a secure environment
    /// ([`private_secure_env`]), `None` for the others.
    pub fn nats_secure_dir(&self) -> Option<PathBuf> {
        let dir = self.dir.join("nats-secure");
        dir.join("ca.pem").exists().then_some(dir)
    }

    /// Whether the secure environment runs in operator (JWT) mode ([`private_jwt_env`]):
    /// identities log in with `DIR/nats-secure/<identity>.creds`.
    pub fn nats_jwt(&self) -> bool {
        self.nats_secure_dir()
            .is_some_and(|dir| dir.join("operator.jwt").exists())
    }

    /// The flags (`--nats-tls-*`, and `--nats-nkey` or in JWT mode `--nats-creds`) that
    /// make a Herald binary connect to a secure environment as `identity`; none for the
    /// others.
    pub fn nats_flags(&self, identity: &str) -> Vec<String> {
        let Some(dir) = self.nats_secure_dir() else {
            return Vec::new();
        };
        let file = |name: String| dir.join(name).display().to_string();
        let login = if self.nats_jwt() {
            ["--nats-creds".into(), file(format!("{identity}.creds"))]
        } else {
            ["--nats-nkey".into(), file(format!("{identity}.nk"))]
        };
        let mut flags = vec![
            "--nats-tls-ca".into(),
            file("ca.pem".into()),
            "--nats-tls-cert".into(),
            file(format!("{identity}.crt")),
            "--nats-tls-key".into(),
            file(format!("{identity}.key")),
        ];
        flags.extend(login);
        flags
    }

    /// Connection options of `identity` (TLS with its client certificate, its NKey or in
    /// JWT mode its credentials file) in a secure environment; plain options in the others.
    pub fn nats_as(&self, identity: &str) -> async_nats::ConnectOptions {
        let options = async_nats::ConnectOptions::new();
        let Some(dir) = self.nats_secure_dir() else {
            return options;
        };
        // rustls needs one process-wide crypto provider (several are linked in).
        herald_dispatcher::install_crypto_provider();
        let options = options
            .add_root_certificates(dir.join("ca.pem"))
            .add_client_certificate(
                dir.join(format!("{identity}.crt")),
                dir.join(format!("{identity}.key")),
            )
            .require_tls(true);
        if self.nats_jwt() {
            let creds = std::fs::read_to_string(dir.join(format!("{identity}.creds")))
                .unwrap_or_else(|e| panic!("reading the credentials of {identity}: {e}"));
            return options
                .credentials(&creds)
                .unwrap_or_else(|e| panic!("the credentials of {identity}: {e}"));
        }
        let seed = std::fs::read_to_string(dir.join(format!("{identity}.nk")))
            .unwrap_or_else(|e| panic!("reading the NKey seed of {identity}: {e}"));
        options.nkey(seed.trim().to_owned())
    }

    /// The nats-server log of a single-server environment.
    pub fn nats_log(&self) -> PathBuf {
        self.dir.join("nats.log")
    }

    /// The process id of the environment's one process (etcd, kube-apiserver and
    /// nats-server), from the `pid` file it writes.
    pub fn pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.dir.join("pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// The admin kubeconfig of the environment.
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    /// `nats://127.0.0.1:<port>`; in a cluster environment ([`private_cluster_env`]) the
    /// comma-separated URLs of all nodes. (`async_nats::connect` takes one URL per string,
    /// so split such a list into a `Vec` before connecting.)
    pub fn nats_url(&self) -> &str {
        &self.nats_url
    }

    /// A kube client with admin rights.
    pub async fn client(&self) -> Client {
        let kubeconfig = Kubeconfig::read_from(self.kubeconfig()).expect("reading kubeconfig");
        let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .expect("kubeconfig into client config");
        Client::try_from(config).expect("building the kube client")
    }

    /// A NATS client connected to the environment's JetStream-enabled server (in a cluster
    /// environment: to one of its nodes, failing over to the others).
    /// In a secure environment, as the `admin` identity (everything in Herald's account).
    pub async fn nats(&self) -> async_nats::Client {
        self.nats_as("admin")
            .connect(self.nats_nodes.clone())
            .await
            .expect("connecting to NATS")
    }

    /// `testenv <args>`: the tool that runs this environment, also the harness's way to
    /// compute what GitOps tools make of an object (`argo-health`, `kstatus`).
    pub fn testenv(&self) -> Command {
        Command::new(self.bin_dir.join("testenv"))
    }

    /// `kubectl apply --server-side` of `manifest` in `namespace`; its output (stdout
    /// dropped, stderr kept for the reason of a refusal).
    pub fn kubectl_apply(
        &self,
        namespace: &str,
        manifest: &serde_json::Value,
    ) -> std::process::Output {
        let mut child = self
            .kubectl()
            .args(["apply", "--server-side", "-n", namespace, "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("kubectl starts");
        std::io::Write::write_all(
            child.stdin.as_mut().expect("stdin is piped"),
            manifest.to_string().as_bytes(),
        )
        .expect("kubectl reads the manifest");
        child.wait_with_output().expect("kubectl ends")
    }

    /// `kubectl` (from PATH, else the one `scripts/build-e2e.sh` built) pointed at the
    /// environment.
    pub fn kubectl(&self) -> Command {
        let built = self.bin_dir.join("kubectl");
        let program = if built.exists() {
            built
        } else {
            PathBuf::from("kubectl")
        };
        let mut cmd = Command::new(program);
        cmd.env("KUBECONFIG", self.kubeconfig());
        cmd
    }

    /// Restarts only the nats-server (same port, same JetStream store); returns when it
    /// accepts connections again. In a cluster environment: a rolling restart, node by
    /// node, each one healthy again before the next.
    pub fn restart_nats(&self) {
        self.control(&["nats-restart"]);
    }

    /// The client URL of every nats-server node, node `i` at index `i` (a single entry
    /// unless this is a cluster environment).
    pub fn nats_nodes(&self) -> Vec<String> {
        self.nats_nodes.clone()
    }

    /// The node index of a nats-server by its server name (`n0`, `n1`, ... in a cluster
    /// environment; what stream info reports as `cluster.leader`).
    pub fn nats_node_index(&self, server_name: &str) -> Option<usize> {
        let i = server_name.strip_prefix('n')?.parse().ok()?;
        (i < self.nats_nodes.len()).then_some(i)
    }

    /// Cluster environments only: SIGKILLs nats-server node `i` (a real crash of its
    /// process); returns once the process is gone.
    pub fn kill_nats_node(&self, i: usize) {
        self.control(&["nats-kill", "--node", &i.to_string()]);
    }

    /// Cluster environments only: starts node `i` again with the same ports and store, so
    /// it rejoins the cluster; returns once the node reports healthy (meta and its stream
    /// replicas caught up).
    pub fn start_nats_node(&self, i: usize) {
        self.control(&["nats-start", "--node", &i.to_string()]);
    }

    /// Makes the Kubernetes API unreachable for `seconds`: open connections are cut and new
    /// ones refused. Returns as soon as the blackout has begun.
    pub fn blackout_apiserver(&self, seconds: f64) {
        self.control(&["apiserver-blackout", "--seconds", &seconds.to_string()]);
    }

    fn control(&self, args: &[&str]) {
        let status = Command::new(self.bin_dir.join("testenv"))
            .arg(args[0])
            .arg("--dir")
            .arg(&self.dir)
            .args(&args[1..])
            .status()
            .expect("running testenv control command");
        assert!(status.success(), "testenv {args:?} failed: {status}");
    }
}

fn wait_ready(dir: &Path, mut child: Option<&mut Child>) {
    let deadline = Instant::now() + Duration::from_secs(180);
    while !dir.join("ready").exists() {
        if let Some(child) = child.as_deref_mut()
            && let Ok(Some(status)) = child.try_wait()
        {
            panic!("testenv exited before it was ready ({status}); see its log in the temp dir");
        }
        assert!(
            Instant::now() < deadline,
            "testenv in {} not ready after 180 s",
            dir.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Polls `check` until it returns `Some`, or panics with `what` after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The Prometheus text a Herald process serves on `127.0.0.1:port/metrics`, if it answers
/// within 2 s.
pub async fn scrape_metrics(port: u16) -> Option<String> {
    let response = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .ok()?;
    response.text().await.ok()
}

/// Installs (server-side apply) every CRD under `crds/` and waits until each is
/// Established. Idempotent, safe to call from every test.
pub async fn install_crds(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let dir = repo_root().join("crds");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("reading crds/") {
        let path = entry.expect("crds/ entry").path();
        let text = std::fs::read_to_string(&path).expect("reading a CRD");
        let crd: CustomResourceDefinition = serde_norway::from_str(&text).expect("parsing a CRD");
        let name = crd.metadata.name.clone().expect("CRD name");
        crds.patch(
            &name,
            &PatchParams::apply("herald-e2e").force(),
            &Patch::Apply(&crd),
        )
        .await
        .unwrap_or_else(|e| panic!("applying {}: {e}", path.display()));
        names.push(name);
    }
    for name in names {
        tokio::time::timeout(
            Duration::from_secs(30),
            await_condition(crds.clone(), &name, conditions::is_crd_established()),
        )
        .await
        .unwrap_or_else(|_| panic!("CRD {name} not Established after 30 s"))
        .expect("watching the CRD");
    }
}

/// One test's slice of the environment: its own namespace, a kube client, a NATS client.
pub struct TestContext {
    pub client: Client,
    pub nats: async_nats::Client,
    pub namespace: String,
}

impl TestContext {
    /// Creates a fresh namespace `<prefix>-<unique suffix>` in the shared environment and
    /// installs the CRDs.
    pub async fn new(prefix: &str) -> Self {
        Self::new_in(env(), prefix).await
    }

    /// Like [`TestContext::new`], in a given environment.
    pub async fn new_in(env: &TestEnv, prefix: &str) -> Self {
        let client = env.client().await;
        install_crds(&client).await;
        let namespace = unique_name(prefix);
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": {"name": namespace, "labels": {"herald.dev/e2e": "true"}}
        }))
        .expect("namespace object");
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("creating namespace {namespace}: {e}"));
        Self {
            client,
            nats: env.nats().await,
            namespace,
        }
    }

    /// A namespaced API of this test's namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Sets annotations on the test's Namespace, as a platform team would.
    pub async fn annotate(&self, annotations: &[(&str, &str)]) {
        let annotations: std::collections::BTreeMap<_, _> = annotations.iter().copied().collect();
        let patch = serde_json::json!({"metadata": {"annotations": annotations}});
        Api::<Namespace>::all(self.client.clone())
            .patch(
                &self.namespace,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .expect("annotating the namespace");
    }

    /// Deletes the namespace (the environment's namespace controller removes what is in it).
    pub async fn cleanup(self) {
        let _ = Api::<Namespace>::all(self.client)
            .delete(&self.namespace, &DeleteParams::default())
            .await;
    }
}

/// A binary of this workspace (`herald-operator`, `herald-dispatcher`), built by cargo
/// beside the running test.
pub fn workspace_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target dir");
    let binary = dir.join(name);
    assert!(
        binary.exists(),
        "{} is not built (cargo build --workspace --bins builds it)",
        binary.display()
    );
    binary
}

/// A free port on 127.0.0.1 (bound, then released for a process to take).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A DNS-1123 name unique across parallel tests and processes.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{:x}{:x}{n}", std::process::id(), nanos & 0xffff)
}

/// Runs an operator in this process for `namespace` of `env` (its Lease there too) with
/// the tests' settings — 4 shards, status every second — and `extra` flags, until the
/// returned sender is used or dropped.
pub fn start_operator(
    env: &TestEnv,
    namespace: &str,
    extra: &[&str],
) -> tokio::sync::oneshot::Sender<()> {
    let kubeconfig = env.kubeconfig().display().to_string();
    let args = [
        "herald-operator",
        "--nats-url",
        env.nats_url(),
        "--namespace",
        namespace,
        "--lease-namespace",
        namespace,
        "--kubeconfig",
        &kubeconfig,
        "--listen",
        "127.0.0.1:0",
        "--shards",
        "4",
        "--status-interval",
        "1s",
    ]
    .into_iter()
    .chain(extra.iter().copied());
    let config =
        <herald_operator::Config as clap::Parser>::try_parse_from(args).expect("operator flags");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(herald_operator::run(config, async move {
        let _ = rx.await;
    }));
    tx
}

/// Creates SigningSecret `keys` and WebhookEndpoint `orders` (for `order.*`, to `url`) in
/// `namespace`, waits until the operator reports the endpoint Ready, and returns the key
/// Herald generated into the Secret `keys`.
pub async fn orders_endpoint(
    client: &Client,
    namespace: &str,
    url: &str,
    timeout: Duration,
) -> herald_core::signing::SigningKey {
    use herald_core::v1alpha1::{SigningSecret, WebhookEndpoint};
    use k8s_openapi::api::core::v1::Secret;
    let secret: SigningSecret = serde_json::from_value(serde_json::json!({
        "apiVersion": "herald.dev/v1alpha1", "kind": "SigningSecret",
        "metadata": {"name": "keys"}, "spec": {}
    }))
    .expect("a SigningSecret");
    let endpoint: WebhookEndpoint = serde_json::from_value(serde_json::json!({
        "apiVersion": "herald.dev/v1alpha1", "kind": "WebhookEndpoint",
        "metadata": {"name": "orders"},
        "spec": {"url": url, "eventTypes": ["order.*"], "secretRef": {"name": "keys"}}
    }))
    .expect("a WebhookEndpoint");
    Api::<SigningSecret>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &secret)
        .await
        .expect("creating the SigningSecret");
    let endpoints = Api::<WebhookEndpoint>::namespaced(client.clone(), namespace);
    endpoints
        .create(&PostParams::default(), &endpoint)
        .await
        .expect("creating the WebhookEndpoint");
    eventually("the WebhookEndpoint Ready", timeout, || async {
        let e = endpoints.get("orders").await.ok()?;
        e.status?
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
            .then_some(())
    })
    .await;
    let secrets = Api::<Secret>::namespaced(client.clone(), namespace);
    let whsec = eventually("the generated key", timeout, || async {
        let data = secrets.get("keys").await.ok()?.data?;
        String::from_utf8(data.get("current")?.0.clone()).ok()
    })
    .await;
    herald_core::signing::SigningKey::from_whsec(&whsec).expect("a whsec key")
}
