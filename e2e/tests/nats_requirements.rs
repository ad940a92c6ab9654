//! A NATS Herald cannot run on is refused with a message that says what to change, in
//! the log a pod shows (and, for the dispatcher, which exits, in the pod's termination
//! message: the chart sets `terminationMessagePolicy: FallbackToLogsOnError`). The
//! servers are real: nats-server 2.11 (built by `scripts/build-e2e.sh` as
//! `nats-server-old`), once with JetStream and once without.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use herald_e2e::faults::Operators;
use herald_e2e::nats_process::NatsProcess;
use herald_e2e::{TestContext, free_port, workspace_binary};

const OPERATOR: &str = env!("CARGO_BIN_EXE_herald-test-operator");
const WAIT: Duration = Duration::from_secs(60);

/// The real dispatcher binary against `url`: it must exit unsuccessfully, saying `what`.
fn dispatcher_refuses(url: &str, what: &str) {
    let mut child = Command::new(workspace_binary("herald-dispatcher"))
        .args(["--nats-url", url, "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting herald-dispatcher");
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for the dispatcher") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the dispatcher kept running against a NATS it cannot use ({what})");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let output = child.wait_with_output().expect("the dispatcher's output");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!status.success(), "the dispatcher exited 0:\n{log}");
    assert!(
        log.contains(what),
        "the dispatcher's log does not say {what:?}:\n{log}"
    );
}

/// The operator against `url`: not ready, and its log says `what` (it keeps trying, so a
/// NATS fixed later is picked up without a restart).
async fn operator_refuses(ctx: &TestContext, url: &str, what: &str, id: &str) {
    let port = free_port();
    let mut operators = Operators::new(OPERATOR, herald_e2e::env(), &ctx.namespace, id)
        .with_args(&["--nats-url", url, "--listen", &format!("127.0.0.1:{port}")]);
    operators.start(id);
    let log = operators.log(id);
    let deadline = Instant::now() + WAIT;
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains(what) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the operator's log does not say {what:?}:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let ready = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}/readyz"))
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success());
    assert!(!ready, "the operator is ready on a NATS it cannot use");
    operators.stop_all().await;
}

#[tokio::test]
async fn a_nats_herald_cannot_run_on_is_refused_with_what_to_change() {
    let ctx = TestContext::new("natsreq").await;

    let old = NatsProcess::start("nats-server-old", true);
    let too_old = "nats-server \"2.11.17\" is too old: Herald needs 2.12 or newer";
    dispatcher_refuses(&old.url, too_old);
    operator_refuses(&ctx, &old.url, too_old, "natsreq-old").await;
    drop(old);

    let plain = NatsProcess::start("nats-server-old", false);
    let no_jetstream = "JetStream is not enabled on this NATS server or for this account";
    dispatcher_refuses(&plain.url, no_jetstream);
    operator_refuses(&ctx, &plain.url, no_jetstream, "natsreq-nojs").await;
    drop(plain);

    ctx.cleanup().await;
}
