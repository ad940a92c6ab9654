//! The chart's monitoring: the PrometheusRule's alerts tested by promtool against
//! synthetic series (`charts/herald/tests/alerts_test.yaml`), the Grafana dashboard and
//! its ConfigMap, and every metric either uses being one `docs/metrics.md` documents.
//! No test environment: only helm and promtool from `scripts/build-e2e.sh` (a missing
//! tool fails the test, it never skips it).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use herald_e2e::helm::{built_tool, chart_dir, documents, ok, output};
use herald_e2e::repo_root;
use serde_json::Value;

/// `helm template` of the chart as release `herald` in namespace `herald` (the
/// names the rule tests expect: jobs `herald-dispatcher`, `herald-operator-metrics`).
fn render(set: &[&str]) -> Vec<Value> {
    let mut cmd = Command::new(built_tool("helm"));
    cmd.args(["template", "herald"])
        .arg(chart_dir())
        .args(["--namespace", "herald"]);
    for value in set {
        cmd.args(["--set", value]);
    }
    documents(&ok(cmd, None))
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn rule_spec() -> Value {
    let docs = render(&["metrics.prometheusRule.enabled=true"]);
    let rules = of_kind(&docs, "PrometheusRule");
    assert_eq!(rules.len(), 1, "one PrometheusRule");
    rules[0]["spec"].clone()
}

fn rules(spec: &Value) -> impl Iterator<Item = &Value> {
    spec["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").iter())
}

fn alerts(spec: &Value) -> Vec<&Value> {
    rules(spec).filter(|r| r.get("alert").is_some()).collect()
}

fn dashboard() -> Value {
    let path = chart_dir().join("dashboards/herald.json");
    let text = std::fs::read_to_string(&path).expect("reading the dashboard");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A directory of this test alone, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(label: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "herald-{label}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock")
                .as_nanos()
        ));
        std::fs::create_dir_all(&dir).expect("creating a temp dir");
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn promtool(dir: &Path, args: &[&str]) {
    let mut cmd = Command::new(built_tool("promtool"));
    cmd.args(args).current_dir(dir);
    let described = format!("promtool {}", args.join(" "));
    let out = output(cmd, None);
    assert!(
        out.status.success(),
        "{described} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The alerts the chart renders pass `promtool check rules` and the unit tests of
/// `charts/herald/tests/alerts_test.yaml`, which test every alert both firing and
/// not firing; every alert has a severity, a summary, a description and a runbook
/// that exists in `docs/operations.md`.
#[test]
fn alert_rules_pass_promtool() {
    let spec = rule_spec();
    let dir = TempDir::new("alerts");
    // JSON is YAML: promtool reads the rendered groups exactly as rendered.
    std::fs::write(
        dir.0.join("rules.yaml"),
        serde_json::to_string_pretty(&spec).expect("rules as JSON"),
    )
    .expect("writing rules.yaml");
    let tests = chart_dir().join("tests/alerts_test.yaml");
    std::fs::copy(&tests, dir.0.join("alerts_test.yaml")).expect("copying the tests");
    promtool(&dir.0, &["check", "rules", "rules.yaml"]);
    promtool(&dir.0, &["test", "rules", "alerts_test.yaml"]);

    // Every alert is tested both ways.
    let text = std::fs::read_to_string(&tests).expect("reading the tests");
    let cases: Value = serde_norway::from_str(&text).expect("the tests parse");
    let mut fires = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    for test in cases["tests"].as_array().expect("tests") {
        for case in test["alert_rule_test"].as_array().into_iter().flatten() {
            let name = case["alertname"].as_str().expect("alertname").to_owned();
            let expected = case["exp_alerts"].as_array().map_or(0, Vec::len);
            if expected > 0 {
                fires.insert(name);
            } else {
                quiet.insert(name);
            }
        }
    }
    let operations = std::fs::read_to_string(repo_root().join("docs/operations.md"))
        .expect("reading docs/operations.md");
    let anchors: BTreeSet<String> = operations
        .lines()
        .filter_map(|l| l.strip_prefix("### "))
        .map(|h| h.trim().to_lowercase())
        .collect();
    let alerts = alerts(&spec);
    assert!(alerts.len() >= 10, "{} alerts", alerts.len());
    for alert in alerts {
        let name = alert["alert"].as_str().expect("alert name");
        assert!(name.starts_with("Herald"), "{name}");
        assert!(fires.contains(name), "no test case where {name} fires");
        assert!(
            quiet.contains(name),
            "no test case where {name} does not fire"
        );
        let severity = alert["labels"]["severity"].as_str();
        assert!(
            matches!(severity, Some("critical" | "warning")),
            "{name}: severity {severity:?}"
        );
        for annotation in ["summary", "description", "runbook_url"] {
            assert!(
                alert["annotations"][annotation].is_string(),
                "{name} has no {annotation}"
            );
        }
        let runbook = alert["annotations"]["runbook_url"].as_str().unwrap_or("");
        let expected = format!(
            "https://github.com/herald-dev/herald/blob/main/docs/operations.md#{}",
            name.to_lowercase()
        );
        assert_eq!(runbook, expected, "{name}'s runbook");
        assert!(
            anchors.contains(&name.to_lowercase()),
            "docs/operations.md has no section `### {name}`"
        );
    }
}

/// The dashboard is valid JSON of the shape Grafana's sidecar loads, and the chart
/// ships it verbatim in a ConfigMap only when asked to.
#[test]
fn dashboard_parses_and_ships_in_a_configmap() {
    let dashboard = dashboard();
    assert_eq!(dashboard["uid"], "herald");
    assert!(dashboard["schemaVersion"].as_u64().unwrap_or(0) >= 36);
    let variables = dashboard["templating"]["list"]
        .as_array()
        .expect("variables");
    let variable = |name: &str| {
        variables
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no variable {name}"))
    };
    assert_eq!(variable("datasource")["type"], "datasource");
    assert_eq!(variable("datasource")["query"], "prometheus");
    assert_eq!(variable("namespace")["type"], "query");
    let panels = dashboard["panels"].as_array().expect("panels");
    let mut ids = BTreeSet::new();
    let mut rows = Vec::new();
    for panel in panels {
        assert!(
            ids.insert(panel["id"].as_u64().expect("panel id")),
            "duplicate panel id {}",
            panel["id"]
        );
        if panel["type"] == "row" {
            rows.push(panel["title"].as_str().unwrap_or_default().to_owned());
            continue;
        }
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{} has no query", panel["title"]);
        for target in targets {
            assert_eq!(
                target["datasource"]["uid"], "${datasource}",
                "{}",
                panel["title"]
            );
            assert!(target["expr"].as_str().is_some_and(|e| !e.is_empty()));
        }
    }
    for row in [
        "SLI",
        "Throughput",
        "Backlog",
        "Fan-out",
        "Shards",
        "Operator",
    ] {
        assert!(
            rows.iter().any(|r| r.starts_with(row)),
            "no row {row}: {rows:?}"
        );
    }

    assert!(
        of_kind(&render(&[]), "ConfigMap").is_empty(),
        "no dashboard unless enabled"
    );
    let docs = render(&[
        "metrics.grafanaDashboard.enabled=true",
        "metrics.grafanaDashboard.namespace=monitoring",
    ]);
    let maps = of_kind(&docs, "ConfigMap");
    assert_eq!(maps.len(), 1);
    let map = maps[0];
    assert_eq!(map["metadata"]["namespace"], "monitoring");
    assert_eq!(map["metadata"]["labels"]["grafana_dashboard"], "1");
    let shipped: Value = serde_json::from_str(
        map["data"]["herald.json"]
            .as_str()
            .expect("herald.json in the ConfigMap"),
    )
    .expect("the shipped dashboard parses");
    assert_eq!(
        shipped, dashboard,
        "the ConfigMap carries the dashboard verbatim"
    );
    let docs = render(&["metrics.grafanaDashboard.enabled=true"]);
    assert_eq!(
        of_kind(&docs, "ConfigMap")[0]["metadata"]["namespace"],
        "herald"
    );
}

/// Every string field called `expr` or `query`/`definition` (the dashboard's
/// variables) in `value`.
fn expressions(value: &Value, into: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                match (key.as_str(), v) {
                    ("expr" | "definition", Value::String(s)) => into.push(s.clone()),
                    _ => expressions(v, into),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| expressions(v, into)),
        _ => {}
    }
}

/// The `herald_*` metric names in a PromQL expression, histogram series suffixes
/// stripped.
fn metric_names(expr: &str) -> Vec<String> {
    let bytes = expr.as_bytes();
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b':';
    let mut names = Vec::new();
    let mut i = 0;
    while let Some(at) = expr[i..].find("herald_") {
        let start = i + at;
        let mut end = start;
        while end < bytes.len() && word(bytes[end]) {
            end += 1;
        }
        if start == 0 || !word(bytes[start - 1]) {
            let name = &expr[start..end];
            let name = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name);
            names.push(name.to_owned());
        }
        i = end.max(start + 1);
    }
    names
}

/// A renamed metric breaks the alerts and the dashboard silently; this test
/// loudly: every `herald_*` name they query is in `docs/metrics.md`, the reference
/// the metrics test keeps true.
#[test]
fn monitoring_uses_only_documented_metrics() {
    let reference = std::fs::read_to_string(repo_root().join("docs/metrics.md"))
        .expect("reading docs/metrics.md");
    let documented: BTreeSet<String> = reference
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .filter(|name| name.starts_with("herald_"))
        .map(str::to_owned)
        .collect();
    assert!(documented.len() >= 20, "{documented:?}");

    for (what, source) in [("the alerts", rule_spec()), ("the dashboard", dashboard())] {
        let mut exprs = Vec::new();
        expressions(&source, &mut exprs);
        let used: BTreeSet<String> = exprs.iter().flat_map(|e| metric_names(e)).collect();
        assert!(used.len() >= 10, "{what} use {used:?}");
        let undocumented: Vec<&String> = used.difference(&documented).collect();
        assert!(
            undocumented.is_empty(),
            "{what} use metrics docs/metrics.md does not list: {undocumented:?}"
        );
    }
    assert_eq!(
        metric_names("sum(rate(herald_x_seconds_bucket{le=\"1\"}[5m])) / herald:y + my_herald_z"),
        ["herald_x_seconds"]
    );
}
