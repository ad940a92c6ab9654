//! The examples under `examples/` against the real API server: the tenant's GitOps
//! directory (a kustomization) and the replay apply with server-side apply; once the
//! operator has reconciled them, applying them again changes nothing, because the operator
//! writes status and finalizers only, never spec — so Argo CD and Flux see no drift. And
//! the Python receiver (the `standardwebhooks` package) verifies what Herald signs.
//! (The Rust receiver's verification is tested in `examples/rust`.)

use std::io::Write as _;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use herald_core::signing::{SigningKey, sign};
use herald_e2e::{TestContext, env, eventually, repo_root};
use serde_json::Value;
use tokio::sync::oneshot;

const WAIT: Duration = Duration::from_secs(60);

/// `examples/<dir>` rendered by kustomize, moved from namespace `shop` into `namespace`.
fn kustomize(dir: &str, namespace: &str) -> String {
    let out = env()
        .kubectl()
        .arg("kustomize")
        .arg(repo_root().join("examples").join(dir))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl kustomize examples/{dir}: {}",
        stderr(&out)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("namespace: shop"),
        "examples/{dir} sets namespace: shop"
    );
    text.replace("namespace: shop", &format!("namespace: {namespace}"))
}

/// `examples/<file>` with the namespace of the test.
fn manifest(file: &str, namespace: &str) -> String {
    let text = std::fs::read_to_string(repo_root().join("examples").join(file)).unwrap();
    text.replace(
        "metadata:\n",
        &format!("metadata:\n  namespace: {namespace}\n"),
    )
}

fn kubectl(args: &[&str], stdin: &str) -> Output {
    let mut child = env()
        .kubectl()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Every Herald object of the namespace as JSON.
fn objects(namespace: &str) -> Vec<Value> {
    let out = env()
        .kubectl()
        .args([
            "get",
            "-n",
            namespace,
            "-o",
            "json",
            "--show-managed-fields",
        ])
        .arg("webhookendpoints,signingsecrets,webhookreplays")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    list["items"].as_array().cloned().unwrap_or_default()
}

fn id(object: &Value) -> String {
    format!("{}/{}", object["kind"], object["metadata"]["name"])
}

/// The operator has seen the object's current generation: its `Ready` condition is there.
fn reconciled(object: &Value) -> bool {
    let generation = &object["metadata"]["generation"];
    object["status"]["conditions"]
        .as_array()
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c["type"] == "Ready" && c["observedGeneration"] == *generation)
        })
}

fn start_operator(namespace: &str) -> oneshot::Sender<()> {
    start_operator_with(namespace, &[])
}

fn start_operator_with(namespace: &str, extra: &[&str]) -> oneshot::Sender<()> {
    herald_e2e::start_operator(env(), namespace, extra)
}

#[tokio::test]
async fn the_examples_apply_server_side_and_show_no_drift_once_reconciled() {
    let ctx = TestContext::new("examples").await;
    let ns = ctx.namespace.clone();
    let tenant = kustomize("tenant", &ns);
    let replay = manifest("replay/replay.yaml", &ns);
    let apply = ["apply", "--server-side", "-f", "-"];
    for (what, text) in [("examples/tenant", &tenant), ("examples/replay", &replay)] {
        let out = kubectl(&apply, text);
        assert!(out.status.success(), "{what}: {}", stderr(&out));
    }
    // The demo's variant of the tenant directory is accepted too (the API server checks it,
    // nothing is stored).
    let demo = kustomize("demo", &ns).replace("http://RECEIVER", "http://127.0.0.1:9");
    let out = kubectl(
        &["apply", "--server-side", "--dry-run=server", "-f", "-"],
        &demo,
    );
    assert!(out.status.success(), "examples/demo: {}", stderr(&out));

    let stop = start_operator(&ns);
    let before = eventually("the operator to reconcile every example", WAIT, || {
        let objects = objects(&ns);
        let done = objects.len() == 5 && objects.iter().all(reconciled);
        async move { done.then_some(objects) }
    })
    .await;

    // What a GitOps tool does on every sync: compare, then apply again.
    for (what, text) in [("examples/tenant", &tenant), ("examples/replay", &replay)] {
        let out = kubectl(&["diff", "--server-side", "-f", "-"], text);
        assert!(
            out.status.code() == Some(0),
            "{what}: kubectl diff found drift after the operator reconciled:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            stderr(&out)
        );
        let out = kubectl(&apply, text);
        assert!(out.status.success(), "{what}: {}", stderr(&out));
    }
    let after = objects(&ns);
    for object in &before {
        let again = after
            .iter()
            .find(|o| id(o) == id(object))
            .unwrap_or_else(|| panic!("{} disappeared", id(object)));
        assert_eq!(
            object["metadata"]["generation"],
            again["metadata"]["generation"],
            "{}: re-applying changed its spec",
            id(object)
        );
        assert_eq!(object["spec"], again["spec"], "{}", id(object));
        // Only the applier (kubectl here, Argo CD or Flux in real life) owns spec; the
        // operator owns status (and finalizers), never a field of spec.
        let managers = again["metadata"]["managedFields"].as_array().unwrap();
        assert!(
            managers
                .iter()
                .any(|m| m["manager"] == "herald.dev/operator"),
            "{}: no status written by the operator: {managers:?}",
            id(object)
        );
        for entry in managers {
            if entry["manager"] != "kubectl" {
                assert!(
                    entry["fieldsV1"].get("f:spec").is_none(),
                    "{}: {} owns spec fields: {entry}",
                    id(object),
                    entry["manager"]
                );
            }
        }
    }
    let _ = stop.send(());
    ctx.cleanup().await;
}

/// `python3` with the `standardwebhooks` package, or why not.
fn python_with_standardwebhooks() -> Result<(), String> {
    match Command::new("python3")
        .args(["-c", "import standardwebhooks, cryptography"])
        .output()
    {
        Err(e) => Err(format!("python3 is not available ({e})")),
        Ok(out) if !out.status.success() => Err(format!(
            "the standardwebhooks or cryptography package is not installed (pip install -r \
             examples/receivers/python/requirements.txt): {}",
            stderr(&out).lines().last().unwrap_or_default()
        )),
        Ok(_) => Ok(()),
    }
}

/// Runs `code` with `examples/receivers/python` importable; returns its stdout.
fn python(code: &str, stdin: &str) -> String {
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(code)
        .env("PYTHONPATH", repo_root().join("examples/receivers/python"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "python: {}", stderr(&out));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_python_receiver_verifies_what_herald_signs() {
    if let Err(reason) = python_with_standardwebhooks() {
        eprintln!("SKIPPED the_python_receiver_verifies_what_herald_signs: {reason}");
        return;
    }
    // The Standard Webhooks test vector, through the package the receiver uses.
    let out = python(
        r#"
from datetime import datetime, timezone
from standardwebhooks.webhooks import Webhook
wh = Webhook("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
print(wh.sign("msg_p5jXN8AQM9LWM0D4loKWxJek",
              datetime.fromtimestamp(1614265330, tz=timezone.utc), '{"test": 2432232314}'))
"#,
        "",
    );
    assert_eq!(
        out.trim(),
        "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    );

    // A request signed now by Herald's signing code (during a rotation: two keys sign),
    // checked by the receiver's `verify` with only the new secret; then tampered with.
    let new = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let old = "whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    let keys = [
        SigningKey::from_whsec(new).unwrap(),
        SigningKey::from_whsec(old).unwrap(),
    ];
    let now = jiff::Timestamp::now().as_second();
    let body = r#"{"type":"order.created","timestamp":"2026-11-30T00:00:00Z","data":{"id":"o-1"}}"#;
    let signature = sign(&keys, "msg_1", now, body.as_bytes());
    let request = serde_json::json!({
        "secret": new,
        "headers": {
            "webhook-id": "msg_1",
            "webhook-timestamp": now.to_string(),
            "webhook-signature": signature,
        },
        "body": body,
    });
    let check = r#"
import json, sys
from receiver import verify, WebhookVerificationError
r = json.load(sys.stdin)
def outcome(body, headers):
    try:
        return "ok " + verify([r["secret"]], headers, body.encode())["data"]["id"]
    except WebhookVerificationError as e:
        return "rejected"
print(outcome(r["body"], r["headers"]))
print(outcome(r["body"].replace("o-1", "o-2"), r["headers"]))
stale = dict(r["headers"], **{"webhook-timestamp": str(int(r["headers"]["webhook-timestamp"]) - 3600)})
print(outcome(r["body"], stale))
"#;
    let out = python(check, &request.to_string());
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines, ["ok o-1", "rejected", "rejected"], "{out}");

    // Ed25519 (`v1a`): Herald's signature, during a move from HMAC (both entries), checked
    // by the receiver with only the public key — the cryptography package, OpenSSL's
    // Ed25519, not Herald's code.
    let (whsk, _) = herald_core::signing::generate_whsk().unwrap();
    let ed25519 = SigningKey::parse(&whsk).unwrap();
    let public = ed25519.public_key().unwrap().to_string();
    let signature = sign(&[ed25519, keys[0].clone()], "msg_2", now, body.as_bytes());
    assert!(signature.starts_with("v1a,"), "{signature}");
    let request = serde_json::json!({
        "secret": public,
        "headers": {
            "webhook-id": "msg_2",
            "webhook-timestamp": now.to_string(),
            "webhook-signature": signature,
        },
        "body": body,
    });
    let out = python(check, &request.to_string());
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines, ["ok o-1", "rejected", "rejected"], "{out}");

    // A verification challenge as Herald builds it: the receiver's answer is one Herald
    // takes as an echo; an ordinary event gets none.
    use herald_core::verification;
    let challenge = verification::challenge().unwrap();
    let body = verification::request_body(
        &herald_core::dataplane::EndpointKey::new("shop", "orders"),
        &challenge,
        jiff::Timestamp::now(),
    );
    let answer = python(
        r#"
import json, sys
from receiver import challenge_answer
print(challenge_answer(json.load(sys.stdin)))
print(challenge_answer({"type": "order.created", "data": {"challenge": "x"}}))
"#,
        std::str::from_utf8(&body).unwrap(),
    );
    let lines: Vec<&str> = answer.lines().collect();
    assert!(verification::echoed(lines[0], &challenge), "{answer}");
    assert_eq!(lines[1], "None");
}

/// `kubectl explain` prints the CRD's field documentation as whole sentences: the doc
/// comments' line breaks do not reach the schema (kubectl keeps every line break it
/// finds, so they broke sentences in the middle).
#[tokio::test]
async fn kubectl_explain_prints_whole_sentences() {
    herald_e2e::install_crds(&env().client().await).await;
    let sentence = "Disable the endpoint after it has failed continuously (no success at all) \
                    for this long.";
    // Discovery may lag the CRD's establishment by a moment.
    let text = eventually("kubectl explain to know the CRD", WAIT, || async {
        let out = env()
            .kubectl()
            .args(["explain", "webhookendpoints.spec.delivery.disableAfter"])
            .output()
            .unwrap();
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    })
    .await;
    let joined = text.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(joined.contains(sentence), "{text}");
    // kubectl wraps at 80 columns and keeps every line break of the text; so inside a
    // paragraph each line must end only because the next word would not fit.
    let description: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("DESCRIPTION"))
        .skip(1)
        .map(str::trim_end)
        .collect();
    for pair in description.windows(2) {
        let (line, next) = (pair[0], pair[1]);
        let Some(word) = next.split_whitespace().next() else {
            continue;
        };
        assert!(
            line.is_empty() || line.len() + 1 + word.len() > 80,
            "a line broken before the width (the source's line break?): {line:?} then {word:?}\n{text}"
        );
    }
}

/// What a GitOps tool makes of `object`: `testenv argo-health SCRIPT` (Argo CD's Lua
/// health check, run with gopher-lua as Argo CD runs it) or `testenv kstatus` (Flux).
fn gitops_verdict(args: &[&str], object: &Value) -> (String, String) {
    let mut cmd = env().testenv();
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("starting testenv");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(object.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "testenv {args:?}: {}", stderr(&out));
    let verdict: Value = serde_json::from_slice(&out.stdout).expect("a verdict");
    (
        verdict["status"].as_str().unwrap_or_default().to_owned(),
        verdict["message"].as_str().unwrap_or_default().to_owned(),
    )
}

/// The Argo CD health checks of `examples/gitops/argocd`, and kstatus (what Flux's `wait`
/// uses), run against objects the Herald operator reconciled on the real API server, in
/// each state a tenant meets.
#[tokio::test]
async fn argo_cd_health_checks_read_what_the_operator_writes() {
    let ctx = TestContext::new("argo").await;
    let ns = ctx.namespace.clone();
    let endpoint = |name: &str, spec: Value| {
        let mut spec = spec;
        spec["eventTypes"] = serde_json::json!(["order.*"]);
        serde_json::json!({
            "apiVersion": "herald.dev/v1alpha1", "kind": "WebhookEndpoint",
            "metadata": {"name": name, "namespace": ns}, "spec": spec
        })
    };
    let objects = [
        serde_json::json!({
            "apiVersion": "herald.dev/v1alpha1", "kind": "SigningSecret",
            "metadata": {"name": "keys", "namespace": ns}, "spec": {}
        }),
        endpoint(
            "accepted",
            serde_json::json!({"url": "http://127.0.0.1:9/a", "secretRef": {"name": "keys"}}),
        ),
        endpoint(
            "paused",
            serde_json::json!({"url": "http://127.0.0.1:9/p", "secretRef": {"name": "keys"}, "paused": true}),
        ),
        endpoint(
            "no-secret",
            serde_json::json!({"url": "http://127.0.0.1:9/n", "secretRef": {"name": "missing"}}),
        ),
        endpoint(
            "forbidden",
            serde_json::json!({"url": "https://10.1.2.3/f", "secretRef": {"name": "keys"}}),
        ),
    ];
    let documents: String = objects.iter().map(|o| format!("---\n{o}\n")).collect();
    let out = kubectl(&["apply", "--server-side", "-f", "-"], &documents);
    assert!(out.status.success(), "{}", stderr(&out));
    let replay = manifest("replay/replay.yaml", &ns);
    let out = kubectl(&["apply", "--server-side", "-f", "-"], &replay);
    assert!(out.status.success(), "{}", stderr(&out));

    let script = |kind: &str| {
        repo_root()
            .join("examples/gitops/argocd")
            .join(format!("{}.lua", kind.to_lowercase()))
            .display()
            .to_string()
    };
    // Before the operator has seen them: Progressing.
    for object in &objects {
        let kind = object["kind"].as_str().unwrap();
        let (status, _) = gitops_verdict(&["argo-health", &script(kind)], object);
        assert_eq!(status, "Progressing", "{}", id(object));
    }

    let stop = start_operator_with(&ns, &["--allow-network", "127.0.0.0/8", "--allow-http"]);
    // (name prefix, Argo CD health, kstatus as Flux's `wait` computes it), once settled:
    // an endpoint passes through SecretNotReady until its SigningSecret has a key.
    let want = [
        ("SigningSecret/keys", "Healthy", "Current"),
        ("WebhookEndpoint/accepted", "Healthy", "Current"),
        ("WebhookEndpoint/paused", "Suspended", "Current"),
        ("WebhookEndpoint/no-secret", "Degraded", "InProgress"),
        ("WebhookEndpoint/forbidden", "Degraded", "Failed"),
        ("WebhookReplay/", "Degraded", "InProgress"),
    ];
    let verdicts = || {
        let all = self::objects(&ns);
        let verdicts: Vec<(String, String, String, String)> = all
            .iter()
            .filter(|o| reconciled(o))
            .map(|object| {
                let kind = object["kind"].as_str().unwrap();
                let (status, message) = gitops_verdict(&["argo-health", &script(kind)], object);
                let (kstatus, _) = gitops_verdict(&["kstatus"], object);
                let name = format!("{kind}/{}", object["metadata"]["name"].as_str().unwrap());
                (name, status, kstatus, message)
            })
            .collect();
        verdicts
    };
    let settled = |verdicts: &[(String, String, String, String)]| {
        verdicts.len() == want.len()
            && verdicts.iter().all(|(name, status, kstatus, message)| {
                !message.is_empty()
                    && want.iter().any(|(prefix, health, flux)| {
                        name.starts_with(prefix) && status == health && kstatus == flux
                    })
            })
    };
    let started = std::time::Instant::now();
    let mut last = verdicts();
    while !settled(&last) {
        assert!(
            started.elapsed() < WAIT,
            "not the expected health after {WAIT:?}; last seen: {last:#?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        last = verdicts();
    }
    let _ = stop.send(());
    for (name, status, kstatus, message) in &last {
        println!("{name}: Argo CD {status} ({message}); kstatus {kstatus}");
    }
    // The kustomization merges exactly these scripts into Argo CD's `argocd-cm`.
    let out = env()
        .kubectl()
        .arg("kustomize")
        .arg(repo_root().join("examples/gitops/argocd"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let cm: Value = serde_norway::from_slice(&out.stdout).expect("one ConfigMap");
    assert_eq!(cm["metadata"]["name"], "argocd-cm");
    for kind in ["WebhookEndpoint", "SigningSecret", "WebhookReplay"] {
        let key = format!("resource.customizations.health.herald.dev_{kind}");
        let file = std::fs::read_to_string(script(kind)).unwrap();
        assert_eq!(cm["data"][&key].as_str(), Some(file.as_str()), "{key}");
    }
    ctx.cleanup().await;
}
