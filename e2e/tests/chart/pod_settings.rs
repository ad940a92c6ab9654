//! What platform teams set on every component's pods — extra environment and arguments,
//! labels and annotations, a PriorityClass, topology spread — rendered into the
//! operator's, the dispatcher's and the API's pod templates and accepted by the API
//! server; and the operator's `--status-refresh` as a value.

use super::*;

/// Each component: its values key, its workload, and the arguments the chart passes it
/// before the extra ones.
const COMPONENTS: [(&str, &str, &[&str]); 3] = [
    ("operator", "Deployment", &["run"]),
    ("dispatcher", "StatefulSet", &[]),
    ("api", "Deployment", &[]),
];

/// A real flag of each binary, to pass as an extra argument.
fn extra_arg(component: &str) -> &'static str {
    match component {
        "operator" => "--status-interval=30s",
        "dispatcher" => "--health-interval=5s",
        _ => "--max-page=100",
    }
}

/// The pod template of `component`'s workload in `rendered`.
fn pod_template(rendered: &str, release: &str, component: &str, kind: &str) -> Value {
    let name = format!("{release}-herald-{component}");
    documents(rendered)
        .into_iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name.as_str())
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))["spec"]["template"]
        .clone()
}

/// Every setting, for every component.
fn settings() -> Vec<String> {
    let mut set = vec![
        "api.enabled=true".to_owned(),
        "operator.statusRefresh=90s".to_owned(),
    ];
    for (component, _, _) in COMPONENTS {
        set.extend([
            format!("{component}.extraEnv[0].name=HERALD_TEST_EXTRA"),
            format!("{component}.extraEnv[0].value={component}"),
            format!("{component}.extraEnv[1].name=FROM_SECRET"),
            format!("{component}.extraEnv[1].valueFrom.secretKeyRef.name=platform-env"),
            format!("{component}.extraEnv[1].valueFrom.secretKeyRef.key=token"),
            format!("{component}.extraArgs[0]={}", extra_arg(component)),
            format!("{component}.podLabels.team=platform-{component}"),
            // The chart's own labels win: the workload's selector keeps matching.
            format!("{component}.podLabels.app\\.kubernetes\\.io/component=other"),
            format!("{component}.podAnnotations.platform/owner=team-{component}"),
            format!("{component}.priorityClassName=platform-{component}"),
            format!("{component}.topologySpreadConstraints[0].maxSkew=1"),
            format!(
                "{component}.topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone"
            ),
            format!("{component}.topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway"),
            format!("{component}.topologySpreadConstraints[1].maxSkew=2"),
            format!("{component}.topologySpreadConstraints[1].topologyKey=kubernetes.io/hostname"),
            format!("{component}.topologySpreadConstraints[1].whenUnsatisfiable=DoNotSchedule"),
            format!(
                "{component}.topologySpreadConstraints[1].labelSelector.matchLabels.spread=own"
            ),
        ]);
    }
    set
}

#[tokio::test]
async fn pod_settings_render_into_every_component() {
    let ctx = TestContext::new("chart-pods").await;
    let release = unique_name("pods");
    let set = settings();
    let set: Vec<&str> = set.iter().map(String::as_str).collect();
    let rendered = template(&release, &ctx.namespace, &set);

    for (component, kind, base_args) in COMPONENTS {
        let pod = pod_template(&rendered, &release, component, kind);
        let labels = &pod["metadata"]["labels"];
        assert_eq!(
            labels["team"],
            format!("platform-{component}"),
            "{component}: {labels}"
        );
        assert_eq!(
            labels["app.kubernetes.io/component"], component,
            "{component}: the chart's label gave way to podLabels"
        );
        assert_eq!(labels["app.kubernetes.io/instance"], release.as_str());
        assert_eq!(
            pod["metadata"]["annotations"]["platform/owner"],
            format!("team-{component}")
        );
        let spec = &pod["spec"];
        assert_eq!(spec["priorityClassName"], format!("platform-{component}"));

        let container = &spec["containers"][0];
        let mut args: Vec<&str> = base_args.to_vec();
        args.push(extra_arg(component));
        assert_eq!(container["args"], json!(args), "{component}");
        let vars = container["env"].as_array().expect("env");
        // After the chart's own, in the order given.
        assert_eq!(
            vars[vars.len() - 2..],
            [
                json!({"name": "HERALD_TEST_EXTRA", "value": component}),
                json!({"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "platform-env", "key": "token"}}}),
            ],
            "{component}"
        );
        assert!(
            vars.iter().any(|e| e["name"] == "HERALD_SHARDS"),
            "{component}: the chart's environment is kept"
        );

        // A constraint without labelSelector counts this component's pods of this release;
        // one with its own keeps it.
        let spread = spec["topologySpreadConstraints"]
            .as_array()
            .expect("topologySpreadConstraints");
        assert_eq!(
            spread[0],
            json!({
                "maxSkew": 1,
                "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": {
                    "app.kubernetes.io/name": "herald",
                    "app.kubernetes.io/instance": release,
                    "app.kubernetes.io/component": component,
                }},
            }),
            "{component}"
        );
        assert_eq!(
            spread[1]["labelSelector"],
            json!({"matchLabels": {"spread": "own"}})
        );
    }
    let operator = pod_template(&rendered, &release, "operator", "Deployment");
    let vars: Vec<EnvVar> =
        serde_json::from_value(operator["spec"]["containers"][0]["env"].clone()).unwrap();
    assert_eq!(
        env_value(&vars, "HERALD_STATUS_REFRESH").as_deref(),
        Some("90s")
    );

    // The API server takes every object as rendered.
    let mut cmd = env().kubectl();
    cmd.args(["apply", "--dry-run=server", "-n", &ctx.namespace, "-f", "-"]);
    ok(cmd, Some(&rendered));
    ctx.cleanup().await;
}

/// Without the settings, the pods are what they were: no extra labels, arguments or
/// scheduling fields; the operator refreshes gauges every 5 minutes.
#[test]
fn pod_settings_default_to_nothing() {
    let rendered = template("plain", "herald", &["api.enabled=true"]);
    for (component, kind, base_args) in COMPONENTS {
        let pod = pod_template(&rendered, "plain", component, kind);
        let labels = pod["metadata"]["labels"].as_object().expect("labels");
        assert!(
            labels
                .keys()
                .all(|k| k.starts_with("app.kubernetes.io/") || k == "helm.sh/chart"),
            "{component}: {labels:?}"
        );
        assert!(pod["metadata"]["annotations"].is_null(), "{component}");
        let spec = &pod["spec"];
        for field in ["priorityClassName", "topologySpreadConstraints"] {
            assert!(spec[field].is_null(), "{component}: {field}");
        }
        let args = &spec["containers"][0]["args"];
        if base_args.is_empty() {
            assert!(args.is_null(), "{component}: {args}");
        } else {
            assert_eq!(*args, json!(base_args), "{component}");
        }
    }
    let operator = pod_template(&rendered, "plain", "operator", "Deployment");
    let vars: Vec<EnvVar> =
        serde_json::from_value(operator["spec"]["containers"][0]["env"].clone()).unwrap();
    assert_eq!(
        env_value(&vars, "HERALD_STATUS_REFRESH").as_deref(),
        Some("5m")
    );
}

/// An extra variable the chart already sets would leave which of the two counts to
/// whoever applies the manifest: refused, naming the value to use instead.
#[test]
fn extra_env_may_not_repeat_the_charts_own() {
    for (component, name) in [
        ("operator", "HERALD_STATUS_INTERVAL"),
        ("dispatcher", "HERALD_SHARDS"),
        ("api", "HERALD_API_RATE"),
    ] {
        let mut cmd = helm();
        cmd.args(["template", "dup"]).arg(chart_dir()).args([
            "--set",
            "api.enabled=true",
            "--set-string",
            &format!("{component}.extraEnv[0].name={name},{component}.extraEnv[0].value=1"),
        ]);
        let out = output(cmd, None);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{component}: {name} accepted twice");
        assert!(
            stderr.contains(&format!("{component}.extraEnv: {name} is set by the chart")),
            "{component}: {stderr}"
        );
    }
}
