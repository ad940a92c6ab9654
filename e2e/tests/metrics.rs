//! The metrics people alert on, read the way Prometheus reads them: the operator and a
//! dispatcher run as processes (`herald-test-operator`, `herald-test-dispatcher`) against
//! this process's private test environment, a tenant's endpoints answer 200, 429, 500,
//! 410 and slowly, events (and one invalid event) are published, and `/metrics` of both
//! is scraped four times a second. Every metric that `docs/metrics.md` lists must be
//! exposed, and must move the way its meaning says (a counter counts this tenant's
//! attempts, a gauge shows the backlog while there is one...); every metric exposed must
//! be listed there.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use herald_core::v1alpha1::{SigningSecret, WebhookEndpoint};
use herald_e2e::dataplane::{DataPlane, TEST_SHARDS};
use herald_e2e::faults::{Dispatchers, Operators};
use herald_e2e::receiver::{Behavior, Receiver};
use herald_e2e::{TestContext, eventually, fault_lock, free_port, private_env, repo_root};
use kube::api::PostParams;
use serde_json::{Value, json};

const DISPATCHER: &str = env!("CARGO_BIN_EXE_herald-test-dispatcher");
const OPERATOR: &str = env!("CARGO_BIN_EXE_herald-test-operator");
const WAIT: Duration = Duration::from_secs(120);

/// One sample of the text format: `name{labels} value`.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parses what Herald's binaries serve (OpenMetrics text from prometheus-client): the
/// metric families (`# TYPE` lines, counters with their `_total`) and the samples.
fn parse(text: &str) -> (BTreeSet<String>, Vec<Sample>) {
    let mut families = BTreeSet::new();
    let mut samples = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
                panic!("bad TYPE line: {line}");
            };
            let name = if kind == "counter" {
                format!("{name}_total")
            } else {
                name.to_owned()
            };
            families.insert(name);
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("a sample has a value");
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value: {line}"));
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => (name, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        let labels = labels
            .split("\",")
            .filter(|l| !l.is_empty())
            .map(|pair| {
                let (k, v) = pair.split_once("=\"").expect("label=\"value\"");
                (k.to_owned(), v.trim_end_matches('"').to_owned())
            })
            .collect();
        samples.push(Sample {
            name: name.to_owned(),
            labels,
            value,
        });
    }
    (families, samples)
}

/// The metric names of the dispatcher's and the operator's tables in `docs/metrics.md`.
fn documented() -> BTreeSet<String> {
    let doc =
        std::fs::read_to_string(repo_root().join("docs/metrics.md")).expect("docs/metrics.md");
    doc.lines()
        .filter_map(|l| l.strip_prefix("| `herald_"))
        .map(|l| format!("herald_{}", l.split('`').next().unwrap_or_default()))
        // The API's table is checked by e2e/tests/api.rs against its own process.
        .filter(|name| !name.starts_with("herald_api_"))
        .collect()
}

/// Everything scraped so far: the families, and per series its largest value. The
/// processes are fresh, so a counter or a histogram's count above zero has moved.
#[derive(Default)]
struct Seen {
    families: BTreeSet<String>,
    max: BTreeMap<String, (Sample, f64)>,
}

impl Seen {
    fn add(&mut self, text: &str) {
        let (families, samples) = parse(text);
        self.families.extend(families);
        for sample in samples {
            let id = format!("{}{:?}", sample.name, sample.labels);
            let value = sample.value;
            let entry = self.max.entry(id).or_insert((sample, value));
            entry.1 = entry.1.max(value);
        }
    }

    /// The largest value any series of `name` with (at least) `labels` reached.
    fn best(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.max
            .values()
            .filter(|(s, _)| {
                s.name == name
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.get(*k).is_some_and(|x| x == v))
            })
            .map(|(_, max)| *max)
            .reduce(f64::max)
    }

    /// Such a series was above zero at some scrape.
    fn moved(&self, name: &str, labels: &[(&str, &str)]) -> bool {
        self.best(name, labels).is_some_and(|max| max > 0.0)
    }
}

#[tokio::test]
async fn every_documented_metric_is_exposed_and_moves() {
    let _lock = fault_lock().await;
    let env = private_env();
    let ctx = TestContext::new_in(env, "metrics").await;
    let ns = ctx.namespace.clone();
    let dp = DataPlane::new(ctx.nats.clone()).await;
    let rx = Receiver::start().await;
    let (op_port, disp_port) = (free_port(), free_port());
    // An egress proxy nothing listens on (the proxy error counter); both binaries take it.
    let proxy = format!("down=http://127.0.0.1:{}", free_port());
    let egress = ["--egress-proxy-named", proxy.as_str()];
    let mut operators = Operators::new(OPERATOR, env, &ns, "metrics")
        .with_args(&["--listen", &format!("127.0.0.1:{op_port}")])
        .with_args(&egress);
    operators.start("op0");
    let mut dispatchers = Dispatchers::new(DISPATCHER, env.nats_url(), "metrics")
        .with_args(&["--listen", &format!("127.0.0.1:{disp_port}")])
        .with_args(&egress);

    // One endpoint per behaviour a metric has to show.
    rx.behave("ok", Behavior::default());
    rx.behave("limited", Behavior::statuses(&[429, 200]));
    rx.behave("broken", Behavior::statuses(&[500]));
    rx.behave("tripped", Behavior::statuses(&[500]));
    rx.behave("gone", Behavior::statuses(&[410]));
    rx.behave("slow", Behavior::delayed(Duration::from_millis(1500)));
    let endpoints = [
        ("ok", json!({})),
        ("limited", json!({"retry": {"schedule": ["2s"]}})),
        (
            "broken",
            json!({"retry": {"schedule": ["2s"]}, "circuitBreaker": {"failureThreshold": 1000}}),
        ),
        (
            "tripped",
            json!({"circuitBreaker": {"failureThreshold": 1}}),
        ),
        ("gone", json!({})),
        ("slow", json!({"maxInFlight": 2})),
        (
            "proxied",
            json!({"proxy": {"name": "down"}, "retry": {"schedule": ["2s"]}}),
        ),
    ];
    let secret: SigningSecret = serde_json::from_value(json!({
        "apiVersion": "herald.dev/v1alpha1", "kind": "SigningSecret",
        "metadata": {"name": "keys"}, "spec": {}
    }))
    .expect("SigningSecret");
    ctx.api::<SigningSecret>()
        .create(&PostParams::default(), &secret)
        .await
        .expect("creating the SigningSecret");
    for (name, delivery) in &endpoints {
        let obj: WebhookEndpoint = serde_json::from_value(json!({
            "apiVersion": "herald.dev/v1alpha1", "kind": "WebhookEndpoint",
            "metadata": {"name": name},
            "spec": {"url": rx.url(name), "eventTypes": ["m.*"], "secretRef": {"name": "keys"},
                     "delivery": delivery}
        }))
        .expect("WebhookEndpoint");
        ctx.api::<WebhookEndpoint>()
            .create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("creating WebhookEndpoint {name}: {e}"));
    }
    for (name, _) in &endpoints {
        let key = herald_core::dataplane::EndpointKey::new(&ns, name).config_key();
        eventually(&format!("{name} configured in NATS"), WAIT, || async {
            let entry = dp.config.get(&key).await.ok()??;
            let config: Value = serde_json::from_slice(&entry).ok()?;
            config["held"].is_null().then_some(())
        })
        .await;
    }

    let mut seen = Seen::default();
    // A backlog for fan-out to work through once the dispatcher starts (the fan-out lag
    // gauge), an invalid event (a dead letter), then the dispatcher.
    for i in 0..300 {
        dp.publish(&ns, "m.created", json!(i)).await;
    }
    dp.publish_raw(
        &format!("herald.events.{ns}.m.created"),
        b"not json".to_vec(),
    )
    .await;
    dispatchers.start("d0");

    let documented = documented();
    let unchecked: Vec<_> = documented
        .iter()
        .filter(|name| moved_as_meant(name, &seen, &ns).is_none())
        .collect();
    assert!(
        unchecked.is_empty(),
        "documented in docs/metrics.md but without a check here: {unchecked:?}"
    );

    let started = Instant::now();
    let mut blackout_done = false;
    let failing = loop {
        for port in [op_port, disp_port] {
            if let Some(text) = herald_e2e::scrape_metrics(port).await {
                seen.add(&text);
            }
        }
        let failing: Vec<&String> = documented
            .iter()
            .filter(|name| moved_as_meant(name, &seen, &ns) != Some(true))
            .collect();
        if failing.is_empty() || started.elapsed() > WAIT {
            break failing;
        }
        // Reconcile errors: the API server away for a few seconds while the operator
        // writes the endpoints' changing status.
        if !blackout_done && started.elapsed() > Duration::from_secs(5) {
            blackout_done = true;
            env.blackout_apiserver(4.0);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let exposed = seen.families.clone();
    dispatchers.stop_all().await;
    operators.stop_all().await;
    ctx.cleanup().await;

    let undocumented: Vec<_> = exposed.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "exposed but not in docs/metrics.md: {undocumented:?}"
    );
    let missing: Vec<_> = documented.difference(&exposed).collect();
    assert!(
        missing.is_empty(),
        "in docs/metrics.md but not exposed: {missing:?}"
    );
    let detail: Vec<String> = failing
        .iter()
        .map(|name| {
            let series: Vec<String> = seen
                .max
                .values()
                .filter(|(s, _)| s.name.starts_with(name.as_str()))
                .map(|(s, max)| format!("{}{:?} max {max}", s.name, s.labels))
                .take(12)
                .collect();
            format!("{name}:\n    {}", series.join("\n    "))
        })
        .collect();
    assert!(
        failing.is_empty(),
        "metrics that did not move within {WAIT:?}:\n{}",
        detail.join("\n")
    );
}

/// Whether metric `name` moved the way its meaning says, for tenant `ns`; `None` for a
/// metric this test does not know.
fn moved_as_meant(name: &str, s: &Seen, ns: &str) -> Option<bool> {
    let tenant = [("namespace", ns)];
    let count = |suffix: &str, labels: &[(&str, &str)]| s.moved(&format!("{name}{suffix}"), labels);
    let at_least = |min: f64| s.best(name, &[]).is_some_and(|v| v >= min);
    let shards = f64::from(TEST_SHARDS);
    Some(match name.strip_prefix("herald_")? {
        "dispatcher_first_attempt_latency_seconds" | "dispatcher_attempt_duration_seconds" => {
            count("_count", &tenant)
        }
        "dispatcher_attempts_total" => [
            ("Success", "2xx"),
            ("RateLimited", "429"),
            ("HttpError", "5xx"),
            ("Gone", "4xx"),
        ]
        .iter()
        .all(|(outcome, class)| {
            s.moved(
                name,
                &[
                    ("namespace", ns),
                    ("outcome", outcome),
                    ("code_class", class),
                ],
            )
        }),
        // The 429 endpoint's deliveries took two attempts; the 500 ones died after two.
        "dispatcher_delivery_attempts" => {
            count("_count", &[("result", "delivered")])
                && count("_bucket", &[("result", "dead"), ("le", "2.0")])
        }
        "dispatcher_dead_deliveries_total"
        | "dispatcher_backlog_deliveries"
        | "dispatcher_scheduled_retries"
        | "dispatcher_oldest_pending_age_seconds" => s.moved(name, &tenant),
        "dispatcher_endpoint_oldest_pending_age_seconds" => {
            s.moved(name, &[("namespace", ns), ("endpoint", "slow")])
        }
        "dispatcher_in_flight"
        | "dispatcher_lane_buffer_bytes"
        | "dispatcher_endpoint_states"
        | "dispatcher_open_circuits"
        | "dispatcher_disabled_endpoints"
        | "dispatcher_fanout_pending_events"
        | "dispatcher_dead_letters_total"
        | "operator_reconcile_errors_total" => s.moved(name, &[]),
        "dispatcher_egress_proxy_errors_total" => {
            s.moved(name, &[("proxy", "down"), ("reason", "unreachable")])
        }
        "dispatcher_shards" | "dispatcher_owned_shards" => s.best(name, &[]) == Some(shards),
        "dispatcher_endpoints" => at_least(6.0),
        "dispatcher_events_ingested_total" | "dispatcher_events_fanned_out_total" => {
            at_least(300.0)
        }
        "dispatcher_fanout_latency_seconds" => s
            .best(&format!("{name}_count"), &[])
            .is_some_and(|v| v >= 300.0),
        "operator_reconciles_total" => {
            s.moved(name, &[("kind", "WebhookEndpoint")])
                && s.moved(name, &[("kind", "SigningSecret")])
        }
        "operator_reconcile_duration_seconds" => count("_count", &[("kind", "WebhookEndpoint")]),
        "operator_endpoints" => {
            s.moved(name, &[("state", "Active")]) && s.moved(name, &[("state", "Disabled")])
        }
        "operator_leader" => s.best(name, &[]) == Some(1.0),
        _ => return None,
    })
}
