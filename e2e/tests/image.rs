//! The OCI images, built without a container engine by `scripts/image.sh` (what
//! `make image` runs), from the binaries of this build: built twice to the same digests,
//! pushed to a registry on loopback (`crane registry serve`), their config read back and
//! compared with the `Dockerfile` stage of the same name, and their filesystem run.
//!
//! Running an image: its filesystem (`crane export`) is mounted read-only and becomes
//! the root of a process that runs as the image's user, in user and mount namespaces
//! (`unshare`, no privileges needed). What a container runtime adds is added and nothing
//! else: mount points for /proc, /dev and /etc/hosts (a hosts file naming the test's NATS,
//! as the kubelet writes one). So the binary, its loader and libraries, name resolution
//! (nsswitch.conf) and the user all come from the image, and any write to the root fails.
//!
//! The binaries are the debug ones stripped of debug info (a few hundred MB less to
//! compress, push and unpack); `make image` builds the same layout from release binaries.
//!
//! A release (`scripts/release.sh`, what `make release` runs) to the same kind of
//! registry, checked as a user would: every image's signature and SBOM attestation with
//! `cosign verify` and the release's public key (and an image it did not sign refused),
//! the chart pulled from the registry rendering the release's images, the plugin's
//! archive, the krew manifest and the checksums; the release workflow passes actionlint.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use herald_e2e::helm::{ok, output};
use herald_e2e::{env, free_port, repo_root, unique_name, workspace_binary};
use serde_json::Value;

const IMAGES: [&str; 3] = ["herald-operator", "herald-dispatcher", "herald-api"];
const WAIT: Duration = Duration::from_secs(90);

fn tool(name: &str) -> PathBuf {
    let dir = std::env::var_os("HERALD_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
                .join(".cache/herald/bin")
        });
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: run scripts/build-e2e.sh first",
        path.display()
    );
    path
}

fn crane() -> Command {
    Command::new(tool("crane"))
}

/// A directory removed when the test ends, however it ends.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(unique_name("herald-image"));
        std::fs::create_dir_all(&dir).expect("creating the work dir");
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        // The extracted root filesystems hold read-only directories.
        let _ = Command::new("chmod")
            .args(["-R", "u+w"])
            .arg(&self.0)
            .status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process killed when the test ends.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The workspace binaries of this build (cargo builds them beside the tests), stripped.
fn stripped_binaries(dir: &Path, names: &[&str]) -> PathBuf {
    let out = dir.join("bin");
    std::fs::create_dir_all(&out).expect("creating the binary dir");
    for &name in names {
        let binary = workspace_binary(name);
        let mut strip = Command::new("objcopy");
        strip.arg("--strip-debug").arg(&binary).arg(out.join(name));
        ok(strip, None);
    }
    out
}

/// `scripts/image.sh` from `bin_dir` into `out`; the digest of each image, read from its
/// OCI layout.
fn build(bin_dir: &Path, out: &Path) -> BTreeMap<String, String> {
    let mut cmd = Command::new(repo_root().join("scripts/image.sh"));
    cmd.arg("--bin-dir")
        .arg(bin_dir)
        .arg("--out")
        .arg(out)
        .env("TMPDIR", std::env::temp_dir())
        .env_remove("REGISTRY")
        .env_remove("SOURCE_DATE_EPOCH");
    ok(cmd, None);
    IMAGES
        .iter()
        .map(|name| {
            let index = std::fs::read_to_string(out.join(name).join("index.json"))
                .expect("the layout's index.json");
            let index: Value = serde_json::from_str(&index).expect("index.json is JSON");
            let digest = index["manifests"][0]["digest"]
                .as_str()
                .expect("a manifest digest")
                .to_owned();
            (name.to_string(), digest)
        })
        .collect()
}

/// The `USER`, `EXPOSE`, `ENTRYPOINT` and `CMD` of the `Dockerfile` stage `target`.
#[derive(Debug, Default)]
struct Stage {
    user: String,
    exposed_ports: Vec<String>,
    entrypoint: Vec<String>,
    cmd: Option<Vec<String>>,
}

fn dockerfile_stage(target: &str) -> Stage {
    let dockerfile =
        std::fs::read_to_string(repo_root().join("Dockerfile")).expect("reading the Dockerfile");
    let stage = dockerfile
        .split("\nFROM ")
        .find(|s| {
            s.lines()
                .next()
                .is_some_and(|from| from.trim_end().ends_with(&format!(" AS {target}")))
        })
        .unwrap_or_else(|| panic!("no Dockerfile stage {target}"));
    let json_list = |rest: &str| -> Vec<String> {
        serde_json::from_str(rest.trim())
            .unwrap_or_else(|e| panic!("{target}: not an exec-form list: {rest}: {e}"))
    };
    let mut parsed = Stage::default();
    for line in stage.lines() {
        let (instruction, rest) = line.split_once(' ').unwrap_or((line, ""));
        match instruction {
            "USER" => parsed.user = rest.trim().to_owned(),
            "EXPOSE" => parsed
                .exposed_ports
                .extend(rest.split_whitespace().map(|p| {
                    if p.contains('/') {
                        p.to_owned()
                    } else {
                        format!("{p}/tcp")
                    }
                })),
            "ENTRYPOINT" => parsed.entrypoint = json_list(rest),
            "CMD" => parsed.cmd = Some(json_list(rest)),
            _ => {}
        }
    }
    parsed
}

/// `crane registry serve` on a free loopback port, once it answers.
async fn registry() -> (Process, String) {
    let port = free_port();
    let address = format!("127.0.0.1:{port}");
    let child = crane()
        .args(["registry", "serve", "--address", &address])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting crane registry serve");
    let mut process = Process(child);
    let url = format!("http://{address}/v2/");
    let started = Instant::now();
    loop {
        if let Ok(Some(status)) = process.0.try_wait() {
            panic!("crane registry serve exited: {status}");
        }
        let response = reqwest::Client::new()
            .get(&url)
            .timeout(Duration::from_secs(2))
            .send()
            .await;
        if response.is_ok_and(|r| r.status().is_success()) {
            return (process, address);
        }
        assert!(
            started.elapsed() < WAIT,
            "no registry at {url} after {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The image's filesystem, as `crane export` gives it, unpacked into `dir`, with the
/// mount points a container runtime creates.
fn unpack(reference: &str, dir: &Path) {
    std::fs::create_dir_all(dir).expect("creating the rootfs dir");
    let mut export = crane()
        .args(["export", reference, "-"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting crane export");
    let stream = export.stdout.take().expect("crane export's stdout");
    let status = Command::new("tar")
        .arg("-xf")
        .arg("-")
        .arg("-C")
        .arg(dir)
        .stdin(stream)
        .status()
        .expect("running tar");
    assert!(status.success(), "unpacking {reference}: tar {status}");
    let exported = export.wait().expect("waiting for crane export");
    assert!(exported.success(), "crane export {reference}: {exported}");
    for mount_point in ["proc", "dev"] {
        std::fs::create_dir_all(dir.join(mount_point)).expect("a mount point");
    }
    std::fs::write(dir.join("etc/hosts"), "").expect("the /etc/hosts mount point");
}

/// `argv` run with `rootfs` as its read-only root, as `user` (`uid:gid`), with exactly
/// `env`, and `hosts` mounted as /etc/hosts.
fn in_image(
    rootfs: &Path,
    hosts: &Path,
    user: &str,
    env: &[(&str, String)],
    argv: &[&str],
) -> Command {
    let (uid, gid) = user.split_once(':').unwrap_or((user, user));
    let unshare = which("unshare");
    // The outer namespace maps us to root to mount; the inner one maps that root to the
    // image's user and makes the read-only tree the process's root.
    let script = r#"set -e
r="$1"; hosts="$2"; shift 2
mount --rbind "$r" "$r"
mount --rbind /proc "$r/proc"
mount --rbind /dev "$r/dev"
mount --bind "$hosts" "$r/etc/hosts"
mount -o remount,bind,ro "$r"
if touch "$r/.written" 2>/dev/null; then echo "the image's root is writable" >&2; exit 97; fi
exec env -i "$@""#;
    let mut cmd = Command::new(&unshare);
    cmd.args([
        "--user",
        "--map-root-user",
        "--mount",
        "sh",
        "-c",
        script,
        "sh",
    ])
    .arg(rootfs)
    .arg(hosts);
    for (key, value) in env {
        cmd.arg(format!("{key}={value}"));
    }
    cmd.arg(&unshare)
        .arg("--user")
        .arg(format!("--map-user={uid}"))
        .arg(format!("--map-group={gid}"))
        .arg("--root")
        .arg(rootfs)
        .args(argv);
    cmd
}

fn which(program: &str) -> PathBuf {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .map(|dir| dir.join(program))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("{program} is not on PATH (util-linux)"))
}

#[tokio::test]
async fn images_are_reproducible_match_the_dockerfile_and_run_read_only() {
    herald_dispatcher::install_crypto_provider();
    let work = TempDir::new();
    let bin_dir = stripped_binaries(&work.0, &IMAGES);

    // Reproducible: a second build, later, from a fresh staging dir, is bit for bit the
    // same image.
    let first = build(&bin_dir, &work.0.join("first"));
    let second = build(&bin_dir, &work.0.join("second"));
    assert_eq!(first, second, "two builds of the same binaries differ");
    assert_ne!(first["herald-operator"], first["herald-dispatcher"]);
    std::fs::remove_dir_all(work.0.join("second")).expect("removing the second build");

    let (_registry, host) = registry().await;
    let mut configs = BTreeMap::new();
    for name in IMAGES {
        let reference = format!("{host}/{name}:test");
        let mut push = crane();
        push.arg("push")
            .arg(work.0.join("first").join(name))
            .arg(&reference);
        let pushed = ok(push, None);
        assert_eq!(
            pushed.trim(),
            format!("{host}/{name}@{}", first[name]),
            "crane push reported another digest"
        );
        let mut digest = crane();
        digest.args(["digest", &reference]);
        assert_eq!(
            ok(digest, None).trim(),
            first[name],
            "the registry's digest"
        );

        let mut config = crane();
        config.args(["config", &reference]);
        let config: Value = serde_json::from_str(&ok(config, None)).expect("config is JSON");
        let stage = dockerfile_stage(name.trim_start_matches("herald-"));
        let c = &config["config"];
        assert_eq!(c["User"], "65532:65532", "{name}: user");
        assert_eq!(c["User"], stage.user.as_str(), "{name}: Dockerfile USER");
        assert_eq!(
            c["Entrypoint"],
            serde_json::json!([format!("/usr/local/bin/{name}")]),
            "{name}: entrypoint"
        );
        assert_eq!(
            c["Entrypoint"],
            serde_json::json!(stage.entrypoint),
            "{name}: Dockerfile ENTRYPOINT"
        );
        assert_eq!(
            c["Cmd"],
            serde_json::json!(stage.cmd),
            "{name}: Dockerfile CMD"
        );
        let ports: Vec<&String> = c["ExposedPorts"]
            .as_object()
            .map(|o| o.keys().collect())
            .unwrap_or_default();
        assert_eq!(ports, vec!["8080/tcp"], "{name}: exposed ports");
        assert_eq!(
            ports,
            stage.exposed_ports.iter().collect::<Vec<_>>(),
            "{name}: Dockerfile EXPOSE"
        );
        assert_eq!(config["os"], "linux");
        assert_eq!(config["created"], "1970-01-01T00:00:00Z", "{name}: created");
        configs.insert(name, (reference, c["User"].as_str().unwrap().to_owned()));
    }

    let nats_port = env()
        .nats_url()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse::<u16>().ok())
        .expect("a NATS port");
    // A name only the image's /etc/hosts knows: resolving it proves the image's libc and
    // nsswitch.conf work.
    let hosts = work.0.join("hosts");
    std::fs::write(&hosts, "127.0.0.1 localhost\n127.0.0.1 nats.herald.test\n").unwrap();

    // The operator: its CLI runs from the image (`crd` prints the CRDs, no cluster
    // needed).
    let (reference, user) = &configs["herald-operator"];
    let rootfs = work.0.join("rootfs-operator");
    unpack(reference, &rootfs);
    let run = output(
        in_image(
            &rootfs,
            &hosts,
            user,
            &[],
            &["/usr/local/bin/herald-operator", "crd"],
        ),
        None,
    );
    assert!(
        run.status.success(),
        "herald-operator crd from the image: {}\n{}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(String::from_utf8_lossy(&run.stdout).contains("kind: CustomResourceDefinition"));

    // The dispatcher: started from the image against the test's NATS, by name, with a
    // pod's settings (the chart's test values: 4 shards, loopback receivers allowed), it
    // becomes ready and stops on SIGTERM.
    let (reference, user) = &configs["herald-dispatcher"];
    let rootfs = work.0.join("rootfs-dispatcher");
    unpack(reference, &rootfs);
    let port = free_port();
    let log = work.0.join("dispatcher.log");
    let file = std::fs::File::create(&log).expect("the log file");
    let mut cmd = in_image(
        &rootfs,
        &hosts,
        user,
        &[
            (
                "HERALD_NATS_URL",
                format!("nats://nats.herald.test:{nats_port}"),
            ),
            ("HERALD_REPLICA_ID", unique_name("image")),
            ("HERALD_SHARDS", "4".into()),
            ("HERALD_ALLOW_NETWORKS", "127.0.0.0/8".into()),
            ("HERALD_ALLOW_HTTP", "true".into()),
            ("HERALD_GRACE", "5s".into()),
            ("HERALD_LISTEN", format!("127.0.0.1:{port}")),
        ],
        &["/usr/local/bin/herald-dispatcher"],
    );
    cmd.stdin(Stdio::null())
        .stdout(file.try_clone().expect("log file"))
        .stderr(file);
    let mut dispatcher = Process(cmd.spawn().expect("starting the dispatcher"));
    let dump = || std::fs::read_to_string(&log).unwrap_or_default();
    let started = Instant::now();
    loop {
        if let Ok(Some(status)) = dispatcher.0.try_wait() {
            panic!(
                "the dispatcher from the image exited ({status}):\n{}",
                dump()
            );
        }
        let response = reqwest::Client::new()
            .get(format!("http://127.0.0.1:{port}/readyz"))
            .timeout(Duration::from_secs(2))
            .send()
            .await;
        if response.is_ok_and(|r| r.status().is_success()) {
            break;
        }
        assert!(
            started.elapsed() < WAIT,
            "the dispatcher from the image not ready after {WAIT:?}:\n{}",
            dump()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // `unshare` and `env` exec, so the child is the dispatcher itself.
    let _ = Command::new("kill")
        .args(["-TERM", &dispatcher.0.id().to_string()])
        .status();
    let sent = Instant::now();
    let status = loop {
        if let Ok(Some(status)) = dispatcher.0.try_wait() {
            break status;
        }
        assert!(
            sent.elapsed() < Duration::from_secs(15),
            "the dispatcher did not stop on SIGTERM:\n{}",
            dump()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        status.success(),
        "the dispatcher exited {status}:\n{}",
        dump()
    );
}

fn cosign() -> Command {
    let mut cmd = Command::new(tool("cosign"));
    // Nothing here reaches Sigstore's public services.
    cmd.env("SIGSTORE_NO_CACHE", "true")
        .env("TUF_ROOT", std::env::temp_dir().join("herald-cosign-tuf"));
    cmd
}

/// `cosign verify` of `reference` with the release's public key (the signatures are in
/// the registry only, not in a transparency log).
fn cosign_verify(public: &Path, reference: &str) -> std::process::Output {
    let mut verify = cosign();
    verify.args(["verify", "--key"]).arg(public).args([
        "--insecure-ignore-tlog",
        "--allow-http-registry",
        reference,
    ]);
    output(verify, None)
}

/// The workspace's version, which a release must carry.
fn workspace_version() -> String {
    let manifest = std::fs::read_to_string(repo_root().join("Cargo.toml")).unwrap();
    manifest
        .split("[workspace.package]")
        .nth(1)
        .and_then(|section| section.lines().find_map(|l| l.strip_prefix("version = ")))
        .map(|v| v.trim_matches('"').to_owned())
        .expect("a version in [workspace.package]")
}

/// The version of `package` Cargo.lock resolves (the first entry of that name).
fn locked_version(package: &str) -> String {
    let lock = std::fs::read_to_string(repo_root().join("Cargo.lock")).unwrap();
    let entry = format!("name = \"{package}\"\nversion = \"");
    let (_, rest) = lock
        .split_once(&entry)
        .unwrap_or_else(|| panic!("{package} in Cargo.lock"));
    rest.split('"').next().unwrap().to_owned()
}

#[tokio::test]
async fn a_release_is_signed_attested_and_verifiable() {
    herald_dispatcher::install_crypto_provider();
    let work = TempDir::new();
    let bin_dir = stripped_binaries(
        &work.0,
        &[
            "herald-operator",
            "herald-dispatcher",
            "herald-api",
            "kubectl-herald",
        ],
    );
    let (_registry, host) = registry().await;
    let registry = format!("{host}/herald");
    let version = workspace_version();
    let out = work.0.join("release");

    // A version the code does not carry is refused before anything is pushed.
    let mut wrong = Command::new(repo_root().join("scripts/release.sh"));
    wrong.args(["--version", "9.9.9", "--registry", &registry]);
    let refused = output(wrong, None);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("bump it and commit first"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );

    let mut release = Command::new(repo_root().join("scripts/release.sh"));
    release
        .args(["--version", &version, "--registry", &registry])
        .arg("--bin-dir")
        .arg(&bin_dir)
        .arg("--out")
        .arg(&out)
        .env("TMPDIR", std::env::temp_dir())
        .env_remove("COSIGN_KEY");
    ok(release, None);
    assert!(
        !out.join("cosign.key").exists(),
        "the trial's private key is deleted"
    );
    let public = out.join("cosign.pub");

    // Every image: signed (by digest, so also by tag), its SBOM attested and listing the
    // crates Cargo.lock resolves.
    let async_nats = locked_version("async-nats");
    for name in IMAGES {
        let reference = format!("{registry}/{name}:{version}");
        let verified = cosign_verify(&public, &reference);
        let stdout = String::from_utf8_lossy(&verified.stdout);
        assert!(
            verified.status.success() && stdout.contains(name),
            "{reference}: {stdout}{}",
            String::from_utf8_lossy(&verified.stderr)
        );

        let mut attested = cosign();
        attested
            .args(["verify-attestation", "--type", "cyclonedx", "--key"])
            .arg(&public)
            .args([
                "--insecure-ignore-tlog",
                "--allow-http-registry",
                &reference,
            ]);
        let attested = ok(attested, None);
        let envelope: Value =
            serde_json::from_str(attested.lines().next().expect("an attestation")).unwrap();
        let statement = base64::Engine::decode(
            &base64::engine::general_purpose::STANDARD,
            envelope["payload"].as_str().expect("a payload"),
        )
        .unwrap();
        let statement: Value = serde_json::from_slice(&statement).unwrap();
        let components = statement["predicate"]["components"]
            .as_array()
            .unwrap_or_else(|| panic!("{name}: an SBOM with components: {statement}"));
        assert!(
            components
                .iter()
                .any(|c| c["name"] == "async-nats"
                    && c["version"].as_str() == Some(async_nats.as_str())),
            "{name}: the SBOM lists async-nats {async_nats}"
        );
        let file = out.join("sbom").join(format!("{name}.cdx.json"));
        let file: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        assert_eq!(file["bomFormat"], "CycloneDX", "{name}: the SBOM file");
    }

    // An image the release did not sign is refused with the same key.
    let unsigned = format!("{registry}/herald-operator:unsigned");
    let mut copy = crane();
    copy.args(["mutate", "--label", "unsigned=true", "-t", &unsigned])
        .arg(format!("{registry}/herald-operator:{version}"));
    ok(copy, None);
    assert!(
        !cosign_verify(&public, &unsigned).status.success(),
        "an unsigned image passed verification"
    );

    // The chart, pulled from the registry as a user would, renders the release's images.
    let pulled = work.0.join("pulled");
    std::fs::create_dir_all(&pulled).unwrap();
    let mut pull = Command::new(tool("helm"));
    pull.args(["pull", &format!("oci://{registry}/charts/herald")])
        .args(["--version", &version, "--plain-http", "--destination"])
        .arg(&pulled);
    ok(pull, None);
    let chart = pulled.join(format!("herald-{version}.tgz"));
    let mut template = Command::new(tool("helm"));
    template.arg("template").arg(&chart).args([
        "--set",
        "nats.url=nats://nats:4222",
        "--set",
        &format!("image.repository={registry}"),
    ]);
    let rendered = ok(template, None);
    for name in IMAGES.iter().take(2) {
        assert!(
            rendered.contains(&format!("image: {registry}/{name}:{version}")),
            "the chart's default tag is its version: {name}"
        );
    }
    let listed = std::fs::read_to_string(out.join("images.txt")).unwrap();
    let chart_ref = listed
        .lines()
        .find_map(|l| l.strip_prefix(&format!("oci://{registry}/charts/herald:{version} ")))
        .expect("the chart in images.txt")
        .to_owned();
    let verified = cosign_verify(&public, &chart_ref);
    assert!(
        verified.status.success(),
        "the chart's signature: {}",
        String::from_utf8_lossy(&verified.stderr)
    );

    // Checksums of every file, the plugin runs from its archive, the krew manifest names
    // the archive by its checksum.
    let mut sums = Command::new("sha256sum");
    sums.args(["--check", "--strict", "SHA256SUMS"])
        .current_dir(&out);
    let checked = ok(sums, None);
    for file in ["krew/herald.yaml", "sbom/herald-api.cdx.json", "cosign.pub"] {
        assert!(checked.contains(&format!("{file}: OK")), "{checked}");
    }
    let archive = format!("kubectl-herald_{version}_linux_amd64.tar.gz");
    let unpacked = work.0.join("plugin");
    std::fs::create_dir_all(&unpacked).unwrap();
    let mut untar = Command::new("tar");
    untar
        .arg("-xzf")
        .arg(out.join(&archive))
        .arg("-C")
        .arg(&unpacked);
    ok(untar, None);
    let mut plugin = Command::new(unpacked.join("kubectl-herald"));
    plugin.arg("--version");
    assert!(ok(plugin, None).contains(&version));
    assert!(unpacked.join("LICENSE").exists());
    let manifest: Value =
        serde_norway::from_str(&std::fs::read_to_string(out.join("krew/herald.yaml")).unwrap())
            .unwrap();
    assert_eq!(manifest["spec"]["version"], format!("v{version}"));
    let platform = &manifest["spec"]["platforms"][0];
    assert_eq!(platform["selector"]["matchLabels"]["os"], "linux");
    assert_eq!(platform["bin"], "kubectl-herald");
    assert!(
        checked.contains(&format!("{archive}: OK"))
            && listed_sum(&out, &archive) == platform["sha256"].as_str().unwrap(),
        "the krew manifest's sha256 is the archive's"
    );

    // The workflow that makes a release on a tag passes the GitHub Actions linter.
    let mut lint = Command::new(tool("actionlint"));
    lint.arg(".github/workflows/release.yml")
        .current_dir(repo_root());
    ok(lint, None);
}

/// The checksum SHA256SUMS lists for `file`.
fn listed_sum(out: &Path, file: &str) -> String {
    std::fs::read_to_string(out.join("SHA256SUMS"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_suffix(&format!("  {file}")).map(str::to_owned))
        .unwrap_or_else(|| panic!("{file} in SHA256SUMS"))
}
