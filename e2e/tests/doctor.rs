//! `kubectl herald doctor` against the real environment, as a platform team runs it: the
//! plugin binary with the environment's admin kubeconfig and NATS URL, the operator, a
//! dispatcher and herald-api as processes. All OK on a healthy installation; then the
//! installation is broken one way at a time — the dispatcher stopped (shards unheld),
//! the operator killed and stopped (a stale and a released Lease), a CRD deleted and one
//! altered, the replicas asked for more than the streams have, a stream's message size
//! limit lowered, events larger than NATS' max_payload, herald-api gone — and each time
//! exactly the matching line fails, saying what is wrong, and the exit status is 1.
//!
//! Runs in a private environment: it deletes a CRD and changes streams, which would
//! disturb tests sharing one. Needs the workspace's binaries
//! (`cargo build -p kubectl-herald -p herald-api`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use async_nats::jetstream;
use herald_core::dataplane::DEADLETTER_STREAM;
use herald_e2e::faults::{Dispatchers, Operators};
use herald_e2e::{
    TestContext, TestEnv, eventually, free_port, install_crds, private_env, workspace_binary,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{DeleteParams, PostParams};

const DISPATCHER: &str = env!("CARGO_BIN_EXE_herald-test-dispatcher");
const OPERATOR: &str = env!("CARGO_BIN_EXE_herald-test-operator");
const WAIT: Duration = Duration::from_secs(90);

/// Every line `doctor` prints, in order.
const CHECKS: [&str; 11] = [
    "crd/webhookendpoints.herald.dev",
    "crd/signingsecrets.herald.dev",
    "crd/webhookreplays.herald.dev",
    "operator",
    "nats",
    "shards",
    "stream/HERALD_EVENTS",
    "stream/HERALD_DELIVERIES",
    "stream/HERALD_ATTEMPTS",
    "stream/HERALD_DEADLETTER",
    "herald-api",
];

/// What one run of `doctor` printed.
#[derive(Debug)]
struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
    /// check → (status, message), parsed from the lines.
    lines: BTreeMap<String, (String, String)>,
}

impl Run {
    /// The checks that failed.
    fn failed(&self) -> Vec<&str> {
        CHECKS
            .iter()
            .copied()
            .filter(|c| self.lines.get(*c).is_some_and(|(s, _)| s == "FAIL"))
            .collect()
    }

    fn message(&self, check: &str) -> &str {
        &self.lines[check].1
    }

    /// Exit status 1, and exactly `checks` failed, each message containing its text.
    fn fails_exactly(&self, checks: &[(&str, &str)]) {
        assert!(!self.ok, "exit status 0 with failures: {self:#?}");
        let expected: Vec<&str> = checks.iter().map(|(c, _)| *c).collect();
        assert_eq!(self.failed(), expected, "{self:#?}");
        for (check, text) in checks {
            assert!(
                self.message(check).contains(text),
                "{check}: expected {text:?} in {:?}",
                self.message(check)
            );
        }
    }
}

/// How to run `doctor` against this installation.
struct Doctor {
    kubeconfig: PathBuf,
    nats_url: String,
    api_url: String,
    namespace: String,
}

impl Doctor {
    async fn run(&self, extra: &[&str]) -> Run {
        self.run_against(&self.nats_url, extra).await
    }

    /// `doctor` with `nats_url` instead of the environment's.
    async fn run_against(&self, nats_url: &str, extra: &[&str]) -> Run {
        let mut cmd = Command::new(workspace_binary("kubectl-herald"));
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["doctor", "--nats-url", nats_url])
            .args(["--api-url", &self.api_url])
            .args(["--operator-namespace", &self.namespace])
            .args(["--timeout", "5s"])
            .args(extra)
            .env_remove("KUBECONFIG")
            .env_remove("HERALD_API_URL")
            .env_remove("HERALD_NATS_URL")
            .env_remove("HERALD_JETSTREAM_REPLICAS")
            .env_remove("HERALD_MAX_EVENT_BYTES")
            .env_remove("HERALD_LEASE_NAME")
            .env_remove("HERALD_OPERATOR_NAMESPACE");
        let output = tokio::task::spawn_blocking(move || {
            cmd.stdin(Stdio::null())
                .output()
                .expect("running kubectl-herald")
        })
        .await
        .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let lines = stdout
            .lines()
            .filter_map(|line| {
                let mut parts = line.splitn(2, ' ');
                let status = parts.next()?.to_owned();
                let rest = parts.next()?.trim_start();
                let (check, message) = rest.split_once(' ')?;
                Some((check.to_owned(), (status, message.trim().to_owned())))
            })
            .collect();
        let run = Run {
            ok: output.status.success(),
            stdout,
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            lines,
        };
        eprintln!(
            "kubectl herald doctor {extra:?}:\n{}{}",
            run.stdout, run.stderr
        );
        run
    }

    /// Runs `doctor` until `check` fails with `text` in its message (the state the test
    /// caused takes a moment to show: a Lease to expire, a CRD to go).
    async fn until_failing(&self, check: &str, text: &str) -> Run {
        eventually(
            &format!("doctor: {check} failing with {text:?}"),
            WAIT,
            || async {
                let run = self.run(&[]).await;
                let failing = run
                    .lines
                    .get(check)
                    .is_some_and(|(s, m)| s == "FAIL" && m.contains(text));
                failing.then_some(run)
            },
        )
        .await
    }

    /// Runs `doctor` until every line is OK, and checks the lines and the exit status.
    async fn until_healthy(&self) -> Run {
        let run = eventually("doctor: every check OK", WAIT, || async {
            let run = self.run(&[]).await;
            run.ok.then_some(run)
        })
        .await;
        let checks: Vec<&str> = run.lines.keys().map(String::as_str).collect();
        let mut expected = CHECKS.to_vec();
        expected.sort_unstable();
        assert_eq!(checks, expected, "one line per check: {run:#?}");
        for (check, (status, _)) in &run.lines {
            assert_eq!(status, "OK", "{check}: {run:#?}");
        }
        run
    }
}

/// A process that is killed when dropped (the test ends or panics).
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// herald-api as a process on a free loopback port of `env`, ready once `/readyz` is 200.
async fn start_api(env: &TestEnv) -> (Killed, String) {
    let port = free_port();
    let log = std::env::temp_dir().join("herald-doctor-api.log");
    let log = std::fs::File::create(&log).expect("the API's log");
    let child = Command::new(workspace_binary("herald-api"))
        .args(["--nats-url", env.nats_url()])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .arg("--kubeconfig")
        .arg(env.kubeconfig())
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

/// Changes the schema of `spec` in the first version of CRD `name`, as someone editing
/// the CRD by hand would.
async fn alter_crd(
    crds: &Api<CustomResourceDefinition>,
    name: &str,
    change: impl FnOnce(&mut serde_json::Value),
) {
    let crd = crds.get(name).await.expect("the CRD");
    let mut value = serde_json::to_value(&crd).unwrap();
    change(&mut value["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]);
    let crd: CustomResourceDefinition = serde_json::from_value(value).unwrap();
    crds.replace(name, &PostParams::default(), &crd)
        .await
        .expect("replacing the CRD");
}

/// Sets the dead-letter stream's `max_msg_size`.
async fn set_max_message_size(nats: &async_nats::Client, size: i32) {
    let js = jetstream::new(nats.clone());
    let mut stream = js.get_stream(DEADLETTER_STREAM).await.expect("the stream");
    let mut config = stream.info().await.expect("its info").config.clone();
    config.max_message_size = size;
    js.update_stream(config).await.expect("updating the stream");
}

#[tokio::test]
async fn doctor_says_ok_and_then_what_is_wrong_for_each_fault() {
    let env = private_env();
    let ctx = TestContext::new_in(env, "doctor").await;
    let ns = ctx.namespace.clone();
    let mut operators = Operators::new(OPERATOR, env, &ns, "doctor");
    operators.start("op0");
    let mut dispatchers = Dispatchers::new(DISPATCHER, env.nats_url(), "doctor");
    dispatchers.start("d0");
    let (api, api_url) = start_api(env).await;
    let doctor = Doctor {
        kubeconfig: env.kubeconfig(),
        nats_url: env.nats_url().to_owned(),
        api_url,
        namespace: ns.clone(),
    };

    // Healthy: every line OK, exit 0; the same as a document.
    let healthy = doctor.until_healthy().await;
    assert!(
        healthy
            .message("shards")
            .starts_with("all 4 shards held, by 1 dispatcher (d0)"),
        "{healthy:#?}"
    );
    assert!(
        healthy.message("operator").starts_with("op0 leads"),
        "{healthy:#?}"
    );
    let json = doctor.run(&["-o", "json"]).await;
    assert!(json.ok, "{json:#?}");
    let document: serde_json::Value = serde_json::from_str(&json.stdout).expect("JSON");
    assert_eq!(document["passed"], true);
    assert_eq!(document["checks"].as_array().unwrap().len(), CHECKS.len());

    // No dispatcher: every shard unheld.
    dispatchers.stop("d0").await;
    let run = doctor
        .until_failing("shards", "4 of 4 shards without a live holder (0-3)")
        .await;
    run.fails_exactly(&[("shards", "no dispatcher is alive")]);
    dispatchers.start("d0");
    doctor.until_healthy().await;

    // No operator: killed, its Lease goes stale (5 s in the tests); stopped, it is released.
    operators.kill("op0");
    let run = doctor.until_failing("operator", "was last renewed").await;
    run.fails_exactly(&[("operator", "no operator leads: Lease ")]);
    assert!(
        run.message("operator").contains("by op0 and lasts 5s"),
        "{run:#?}"
    );
    operators.start("op0");
    doctor.until_healthy().await;
    operators.stop("op0").await;
    let run = doctor.until_failing("operator", "has no holder").await;
    run.fails_exactly(&[("operator", "no operator leads")]);
    operators.start("op0");
    doctor.until_healthy().await;

    // A CRD deleted, then installed again.
    let crds: Api<CustomResourceDefinition> = Api::all(ctx.client.clone());
    crds.delete("webhookreplays.herald.dev", &DeleteParams::default())
        .await
        .expect("deleting the CRD");
    let run = doctor
        .until_failing("crd/webhookreplays.herald.dev", "not installed")
        .await;
    run.fails_exactly(&[(
        "crd/webhookreplays.herald.dev",
        "not installed: install or upgrade the chart's CRDs",
    )]);
    install_crds(&ctx.client).await;
    doctor.until_healthy().await;

    // A CRD altered: a field this plugin does not know.
    let endpoints = "webhookendpoints.herald.dev";
    alter_crd(&crds, endpoints, |spec| {
        spec["properties"]["legacyField"] = serde_json::json!({"type": "string"});
    })
    .await;
    let run = doctor.run(&[]).await;
    run.fails_exactly(&[(
        "crd/webhookendpoints.herald.dev",
        "herald.dev/v1alpha1 differs from this plugin's: field spec.legacyField is only in the cluster's",
    )]);
    assert!(
        run.message("crd/webhookendpoints.herald.dev")
            .ends_with("or use the kubectl-herald of the installed release"),
        "{run:#?}"
    );
    alter_crd(&crds, endpoints, |spec| {
        spec["properties"]
            .as_object_mut()
            .expect("spec properties")
            .remove("legacyField");
    })
    .await;
    doctor.until_healthy().await;

    // Streams: fewer replicas than the installation asks for; a message size limit below
    // Herald's largest message.
    let run = doctor.run(&["--jetstream-replicas", "3"]).await;
    let asked = "has 1 replica, the installation asks for 3 (--jetstream-replicas";
    run.fails_exactly(&[
        ("stream/HERALD_EVENTS", asked),
        ("stream/HERALD_DELIVERIES", asked),
        ("stream/HERALD_ATTEMPTS", asked),
        ("stream/HERALD_DEADLETTER", asked),
    ]);
    set_max_message_size(&ctx.nats, 1024).await;
    let run = doctor.run(&[]).await;
    run.fails_exactly(&[(
        "stream/HERALD_DEADLETTER",
        "takes messages of at most 1024 bytes (max_msg_size) but Herald writes up to 263168 here",
    )]);
    set_max_message_size(&ctx.nats, -1).await;
    doctor.until_healthy().await;

    // NATS: events larger than the server carries.
    let run = doctor.run(&["--max-event-bytes", "2000000"]).await;
    run.fails_exactly(&[(
        "nats",
        "max_payload is 1048576 bytes but Herald needs 2001024",
    )]);

    // herald-api gone.
    drop(api);
    let run = doctor.run(&[]).await;
    let no_answer = format!("no answer from {}", doctor.api_url);
    run.fails_exactly(&[("herald-api", no_answer.as_str())]);

    // NATS unreachable: its line fails, the data-plane lines are skipped, the rest runs.
    let unreachable = format!("nats://127.0.0.1:{}", free_port());
    let run = doctor.run_against(&unreachable, &[]).await;
    assert!(!run.ok);
    assert!(run.failed().contains(&"nats"), "{run:#?}");
    assert!(
        run.message("nats")
            .starts_with(&format!("cannot connect to NATS at {unreachable}")),
        "{run:#?}"
    );
    assert_eq!(run.lines["shards"].0, "SKIP");
    assert_eq!(run.lines["crd/webhookendpoints.herald.dev"].0, "OK");

    operators.stop_all().await;
    dispatchers.stop_all().await;
    ctx.cleanup().await;
}
