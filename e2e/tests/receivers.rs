//! The receiver examples of `examples/receivers/` (Go, TypeScript, Python, Java, Rust),
//! each with its language's official Standard Webhooks library, against real deliveries:
//! each runs as a process of its own on a free loopback port and a real dispatcher
//! delivers to it through a small front that answers 503 to the first request whatever
//! the receiver said, so Herald retries it with the same `webhook-id`. Each receiver must
//! process every event exactly once and report the retry as a duplicate; a request Herald
//! signed, captured and sent again is a duplicate too, and is processed on another path
//! (the key is the path and the `webhook-id`, as for another endpoint); a tampered body
//! and a stale timestamp are refused; a verification challenge is echoed.
//!
//! A missing toolchain or package prints `SKIPPED <test>: <reason>` and the test returns:
//! `scripts/test.sh` installs them. Each test builds its receiver once (incremental,
//! outside the clone: `~/.cache/herald/receivers`, `~/.cache/herald/receivers-target`).

use std::collections::HashMap;
use std::io::{BufRead as _, BufReader};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use herald_core::signing::{SigningKey, sign};
use herald_e2e::dataplane::{DataPlane, TEST_SECRET, endpoint, shared_dispatcher, until_applied};
use herald_e2e::{env, eventually, free_port, repo_root, unique_name};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);
/// A secret that signs nothing here: every receiver gets `OTHER,TEST_SECRET`, the list a
/// key rotation gives, and must accept what either signed.
const OTHER: &str = "whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
/// The events published, one each.
const TYPES: [&str; 3] = ["order.created", "order.paid", "order.shipped"];

#[tokio::test]
async fn the_go_receiver_processes_each_event_once() {
    check(Lang::Go).await;
}

#[tokio::test]
async fn the_typescript_receiver_processes_each_event_once() {
    check(Lang::TypeScript).await;
}

#[tokio::test]
async fn the_python_receiver_processes_each_event_once() {
    check(Lang::Python).await;
}

#[tokio::test]
async fn the_java_receiver_processes_each_event_once() {
    check(Lang::Java).await;
}

#[tokio::test]
async fn the_rust_standardwebhooks_receiver_processes_each_event_once() {
    check(Lang::Rust).await;
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Lang {
    Go,
    TypeScript,
    Python,
    Java,
    Rust,
}

impl Lang {
    fn name(self) -> &'static str {
        match self {
            Lang::Go => "go",
            Lang::TypeScript => "typescript",
            Lang::Python => "python",
            Lang::Java => "java",
            Lang::Rust => "rust-standardwebhooks",
        }
    }

    fn dir(self) -> PathBuf {
        repo_root().join("examples/receivers").join(self.name())
    }

    /// Fetches the packages (`Err`, a reason to skip, when the toolchain or they are
    /// missing), builds (a failure fails the test), and returns the command that runs the
    /// receiver, without its `--port`.
    fn prepare(self) -> Result<Command, String> {
        let dir = self.dir();
        let out = cache().join(self.name());
        match self {
            Lang::Go => {
                tool("go", &["version"])?;
                fetch(
                    Command::new("go")
                        .args(["mod", "download"])
                        .current_dir(&dir),
                )?;
                let binary = out.join("receiver");
                build(
                    Command::new("go")
                        .args(["build", "-p", "1", "-buildvcs=false", "-o"])
                        .arg(&binary)
                        .arg(".")
                        .current_dir(&dir),
                );
                Ok(Command::new(binary))
            }
            Lang::TypeScript => {
                tool("node", &["--version"])?;
                tool("npm", &["--version"])?;
                if !dir.join("node_modules/standardwebhooks").exists() {
                    fetch(
                        Command::new("npm")
                            .args(["ci", "--no-audit", "--no-fund"])
                            .current_dir(&dir),
                    )?;
                }
                // tsc writes dist/ beside node_modules, where Node resolves the package.
                build(Command::new(dir.join("node_modules/.bin/tsc")).current_dir(&dir));
                let mut command = Command::new("node");
                command.arg(dir.join("dist/receiver.js"));
                Ok(command)
            }
            Lang::Python => {
                tool("python3", &["-c", "import standardwebhooks, cryptography"]).map_err(|e| {
                    format!("{e} (pip install -r examples/receivers/python/requirements.txt)")
                })?;
                let mut command = Command::new("python3");
                command.arg(dir.join("receiver.py"));
                Ok(command)
            }
            Lang::Java => {
                tool("java", &["-version"])?;
                tool("mvn", &["--version"])?;
                let build_dir = format!("-DbuildDirectory={}", out.display());
                let mvn = |args: &[&str]| {
                    let mut command = Command::new("mvn");
                    command
                        .args(["-B", "-q", "-Dstyle.color=never", &build_dir])
                        .args(args)
                        .current_dir(&dir);
                    command
                };
                // Offline first: resolving the plugins online takes half a minute even
                // when everything is in ~/.m2.
                let offline = mvn(&["-o", "package"]).output().expect("running mvn");
                if !offline.status.success() {
                    fetch(&mut mvn(&["dependency:go-offline"]))?;
                    build(&mut mvn(&["package"]));
                }
                let mut command = Command::new("java");
                command
                    .arg("-cp")
                    .arg(format!("{0}/receiver.jar:{0}/lib/*", out.display()))
                    .arg("dev.herald.receiver.Receiver");
                Ok(command)
            }
            Lang::Rust => {
                tool("cargo", &["--version"])?;
                let target = home().join(".cache/herald/receivers-target");
                let manifest = dir.join("Cargo.toml");
                fetch(
                    Command::new("cargo")
                        .args(["fetch", "--locked", "--manifest-path"])
                        .arg(&manifest),
                )?;
                build(
                    Command::new("cargo")
                        .args(["build", "--offline", "--locked"])
                        .arg("--manifest-path")
                        .arg(&manifest)
                        .env("CARGO_TARGET_DIR", &target),
                );
                Ok(Command::new(
                    target.join("debug/herald-receiver-standardwebhooks"),
                ))
            }
        }
    }

    /// What one line of the receiver's standard output says. The Python example prints
    /// `<path> <status> <webhook-id> <type> <data>[ (duplicate, ignored)]`, the others
    /// `processed <webhook-id> <type>`, `duplicate <webhook-id>` or `rejected <why>`.
    fn parse(self, line: &str) -> Option<Outcome> {
        let words: Vec<&str> = line.split_whitespace().collect();
        if self == Lang::Python {
            return match words.as_slice() {
                [_, "204", id, ..] if line.ends_with("(duplicate, ignored)") => {
                    Some(Outcome::Duplicate(id.to_string()))
                }
                [_, "204", id, kind, ..] => {
                    Some(Outcome::Processed(id.to_string(), kind.to_string()))
                }
                [_, "401", ..] => Some(Outcome::Rejected),
                _ => None,
            };
        }
        match words.as_slice() {
            ["processed", id, kind] => Some(Outcome::Processed(id.to_string(), kind.to_string())),
            ["duplicate", id] => Some(Outcome::Duplicate(id.to_string())),
            ["rejected", ..] => Some(Outcome::Rejected),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Processed(String, String),
    Duplicate(String),
    Rejected,
}

fn home() -> PathBuf {
    std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from)
}

/// Build outputs, outside the clone.
fn cache() -> PathBuf {
    home().join(".cache/herald/receivers")
}

/// `Err` (skip) when `program` cannot run.
fn tool(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("{program} is not available ({e})"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Fetches packages: `Err` (skip) when that fails, as it does without the registry.
fn fetch(command: &mut Command) -> Result<(), String> {
    let out = command.output().map_err(|e| format!("{command:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "could not fetch the packages ({command:?}): {}{}",
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Builds with everything fetched: a failure is the example's, and fails the test.
fn build(command: &mut Command) {
    let out = command.output().expect("running the build");
    assert!(
        out.status.success(),
        "{command:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A receiver process; killed when dropped.
struct Running {
    child: Child,
    port: u16,
    lines: Arc<Mutex<Vec<String>>>,
    lang: Lang,
    stderr: PathBuf,
}

impl Running {
    async fn start(lang: Lang, mut command: Command) -> Self {
        let port = free_port();
        let stderr = std::env::temp_dir().join(format!("herald-receiver-{}.err.log", lang.name()));
        let mut child = command
            .args(["--port", &port.to_string()])
            .env("WEBHOOK_SECRET", format!("{OTHER},{TEST_SECRET}"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).expect("the stderr log"))
            .spawn()
            .unwrap_or_else(|e| panic!("starting {command:?}: {e}"));
        let lines = Arc::new(Mutex::new(Vec::new()));
        let theirs = lines.clone();
        let stdout = child.stdout.take().expect("piped stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                theirs.lock().unwrap().push(line);
            }
        });
        let mut running = Self {
            child,
            port,
            lines,
            lang,
            stderr,
        };
        let started = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = running.child.try_wait() {
                panic!(
                    "the {} receiver exited ({status}): {}",
                    lang.name(),
                    running.logs()
                );
            }
            assert!(
                started.elapsed() < WAIT,
                "the {} receiver does not listen: {}",
                lang.name(),
                running.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        running
    }

    fn outcomes(&self) -> Vec<Outcome> {
        let lines = self.lines.lock().unwrap();
        lines.iter().filter_map(|l| self.lang.parse(l)).collect()
    }

    fn logs(&self) -> String {
        format!(
            "stdout:\n{}\nstderr:\n{}",
            self.lines.lock().unwrap().join("\n"),
            std::fs::read_to_string(&self.stderr).unwrap_or_default()
        )
    }

    fn processed(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for outcome in self.outcomes() {
            if let Outcome::Processed(id, kind) = outcome {
                out.push((id, kind));
            }
        }
        out
    }

    fn duplicates(&self) -> Vec<String> {
        let mut out = Vec::new();
        for outcome in self.outcomes() {
            if let Outcome::Duplicate(id) = outcome {
                out.push(id);
            }
        }
        out
    }

    fn rejected(&self) -> usize {
        self.outcomes()
            .iter()
            .filter(|o| **o == Outcome::Rejected)
            .count()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A request as Herald sent it, and what the receiver answered.
#[derive(Clone, Debug)]
struct Captured {
    headers: HashMap<String, String>,
    body: Bytes,
    status: u16,
    /// Answered 503 by the front.
    refused: bool,
}

/// Between the dispatcher and the receiver: forwards each request, keeps a copy, and
/// answers 503 to the first whatever the receiver said, so that Herald delivers it again.
struct Front {
    target: String,
    client: reqwest::Client,
    fail_next: AtomicBool,
    captured: Mutex<Vec<Captured>>,
}

const FORWARDED: [&str; 4] = [
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "content-type",
];

impl Front {
    async fn start(target: String) -> (Arc<Self>, String) {
        herald_dispatcher::install_crypto_provider();
        let front = Arc::new(Self {
            target,
            client: reqwest::Client::new(),
            fail_next: AtomicBool::new(true),
            captured: Mutex::new(Vec::new()),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding the front");
        let url = format!("http://{}", listener.local_addr().unwrap());
        let app = Router::new().fallback(forward).with_state(front.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        (front, url)
    }

    /// Sends `headers` and `body` to the receiver's `/hook`: its status and body.
    async fn send(&self, headers: &HashMap<String, String>, body: Bytes) -> (u16, String) {
        self.send_to("hook", headers, body).await
    }

    async fn send_to(
        &self,
        path: &str,
        headers: &HashMap<String, String>,
        body: Bytes,
    ) -> (u16, String) {
        let mut request = self
            .client
            .post(format!("{}/{path}", self.target))
            .body(body);
        for name in FORWARDED {
            if let Some(value) = headers.get(name) {
                request = request.header(name, value);
            }
        }
        let response = request.send().await.expect("the receiver answers");
        let status = response.status().as_u16();
        (status, response.text().await.unwrap_or_default())
    }
}

async fn forward(
    State(front): State<Arc<Front>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    assert_eq!(uri.path(), "/hook");
    let headers: HashMap<String, String> = FORWARDED
        .iter()
        .filter_map(|name| {
            Some((
                name.to_string(),
                headers.get(*name)?.to_str().ok()?.to_owned(),
            ))
        })
        .collect();
    let (status, _) = front.send(&headers, body.clone()).await;
    let refused = front.fail_next.swap(false, Ordering::SeqCst);
    front.captured.lock().unwrap().push(Captured {
        headers,
        body,
        status,
        refused,
    });
    if refused {
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY)
}

/// Headers of a request signed now (or `age_seconds` ago) with the test secret by
/// Herald's signing code.
fn signed(id: &str, age_seconds: i64, body: &[u8]) -> HashMap<String, String> {
    let timestamp = jiff::Timestamp::now().as_second() - age_seconds;
    let key = SigningKey::from_whsec(TEST_SECRET).unwrap();
    HashMap::from([
        ("webhook-id".to_owned(), id.to_owned()),
        ("webhook-timestamp".to_owned(), timestamp.to_string()),
        (
            "webhook-signature".to_owned(),
            sign(&[key], id, timestamp, body),
        ),
        ("content-type".to_owned(), "application/json".to_owned()),
    ])
}

async fn check(lang: Lang) {
    let test = format!(
        "the_{}_receiver_processes_each_event_once",
        lang.name().replace('-', "_")
    );
    let command = match lang.prepare() {
        Ok(command) => command,
        Err(reason) => {
            eprintln!("SKIPPED {test}: {reason}");
            return;
        }
    };
    let rx = Running::start(lang, command).await;
    let (front, front_url) = Front::start(format!("http://127.0.0.1:{}", rx.port)).await;

    // A real endpoint of a real dispatcher, pointed at the front; retries after a second.
    let index = shared_dispatcher(env());
    let dp = DataPlane::new(env().nats().await).await;
    let ns = unique_name(&format!("rx-{}", lang.name()));
    dp.put_keys(&ns, "signing", &[TEST_SECRET]).await;
    let config = endpoint(
        &ns,
        "hook",
        json!({"url": format!("{front_url}/hook"), "delivery": {"retry": {"schedule": ["1s"]}}}),
    );
    dp.put_endpoint(&config).await;
    until_applied(index, &config).await;
    for (n, kind) in TYPES.iter().enumerate() {
        dp.publish(&ns, kind, json!({"n": n})).await;
    }

    // Every event processed, and Herald's second delivery of the refused one reported
    // (and its answer back through the front: all the requests captured).
    let started = Instant::now();
    while rx.processed().len() < TYPES.len()
        || rx.duplicates().is_empty()
        || front.captured.lock().unwrap().len() <= TYPES.len()
    {
        let sent = front.captured.lock().unwrap().clone();
        assert!(
            started.elapsed() < WAIT,
            "{test}: after {WAIT:?}, not yet {} events processed and a redelivery; \
             through the front: {:?}\n{}",
            TYPES.len(),
            sent.iter()
                .map(|c| (&c.headers["webhook-id"], c.status, c.refused))
                .collect::<Vec<_>>(),
            rx.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let sent = front.captured.lock().unwrap().clone();
    let retried = sent
        .iter()
        .find(|c| c.refused)
        .expect("the front refused one")
        .headers["webhook-id"]
        .clone();
    assert!(
        sent.iter().all(|c| c.status == 204),
        "{test} answered {:?}\n{}",
        sent.iter().map(|c| c.status).collect::<Vec<_>>(),
        rx.logs()
    );
    assert!(
        sent.iter()
            .filter(|c| c.headers["webhook-id"] == retried)
            .count()
            >= 2,
        "Herald did not deliver {retried} again"
    );
    let mut processed = rx.processed();
    processed.sort();
    let mut expected: Vec<(String, String)> = sent
        .iter()
        .map(|c| {
            let event: serde_json::Value = serde_json::from_slice(&c.body).unwrap();
            (
                c.headers["webhook-id"].clone(),
                event["type"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    expected.sort();
    expected.dedup();
    assert_eq!(
        processed,
        expected,
        "{test}: each event exactly once\n{}",
        rx.logs()
    );
    let mut kinds: Vec<&str> = processed.iter().map(|(_, kind)| kind.as_str()).collect();
    kinds.sort();
    assert_eq!(kinds, TYPES);
    assert!(rx.duplicates().contains(&retried), "{}", rx.logs());

    // A request Herald signed, sent again as it was: accepted, not processed again.
    let last = sent.last().unwrap();
    let duplicates = rx.duplicates().len();
    let (status, _) = front.send(&last.headers, last.body.clone()).await;
    assert_eq!(status, 204, "{test}: a redelivery is acknowledged");
    eventually(
        &format!("{test}: the re-sent request reported"),
        WAIT,
        || {
            let n = rx.duplicates().len();
            async move { (n > duplicates).then_some(()) }
        },
    )
    .await;
    assert_eq!(
        rx.duplicates().last(),
        Some(&last.headers["webhook-id"]),
        "{}",
        rx.logs()
    );

    // The same request on another path, as for another endpoint that gets the event:
    // processed, the key being the path and the `webhook-id`.
    let (status, _) = front
        .send_to("other-endpoint", &last.headers, last.body.clone())
        .await;
    assert_eq!(status, 204);

    // Tampered with: refused.
    let tampered = String::from_utf8_lossy(&last.body).replace("order.", "order-");
    let (status, _) = front.send(&last.headers, tampered.into()).await;
    assert_eq!(
        status,
        401,
        "{test} accepted a tampered body\n{}",
        rx.logs()
    );

    // Signed by Herald's code now (accepted: the signer is right), and an hour ago
    // (refused: a captured request replayed later).
    let body = br#"{"type":"order.refunded","timestamp":"2026-12-07T10:00:00Z","data":{"n":9}}"#;
    let (status, _) = front
        .send(&signed("msg_fresh", 0, body), Bytes::from_static(body))
        .await;
    assert_eq!(status, 204, "{test} refused a fresh request\n{}", rx.logs());
    let (status, _) = front
        .send(&signed("msg_stale", 3600, body), Bytes::from_static(body))
        .await;
    assert_eq!(
        status,
        401,
        "{test} accepted a stale timestamp\n{}",
        rx.logs()
    );

    // Herald's endpoint verification: the challenge echoed.
    let challenge = "hvc_receivers-test-challenge";
    let body = json!({
        "type": herald_core::verification::EVENT_TYPE,
        "timestamp": "2026-12-07T10:00:00Z",
        "data": {"challenge": challenge, "endpoint": {"namespace": ns, "name": "hook"}},
    })
    .to_string();
    let (status, answer) = front
        .send(&signed("verify_test", 0, body.as_bytes()), body.into())
        .await;
    assert_eq!(status, 200, "{test}: {answer}");
    assert!(
        herald_core::verification::echoed(&answer, challenge),
        "{test} answered {answer:?}"
    );

    // The refused requests left no trace but a `rejected` line.
    eventually(&format!("{test}: the refusals reported"), WAIT, || {
        let n = rx.rejected();
        async move { (n >= 2).then_some(()) }
    })
    .await;
    let processed = rx.processed();
    let ids: Vec<&str> = processed.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(
        ids[TYPES.len()..],
        [last.headers["webhook-id"].as_str(), "msg_fresh"],
        "{}",
        rx.logs()
    );
    println!(
        "{test}: {} events processed once each, {} duplicates reported, 2 refused",
        TYPES.len(),
        rx.duplicates().len()
    );
    dp.delete_endpoint(&ns, "hook").await;
}
