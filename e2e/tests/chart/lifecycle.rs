//! A release's life: install, upgrade and uninstall, and what each leaves behind.

use super::*;

#[tokio::test]
async fn install_upgrade_uninstall() {
    let ctx = TestContext::new("chart-life").await;
    let release = Release::install(&ctx, "life", &["shards=8"]);
    // NOTES.txt tells the user what to do next.
    for next in [
        "kind: SigningSecret",
        "kind: WebhookEndpoint",
        "herald.events.<namespace>.<event-type>",
        "kubectl get whe -A",
        "crds.install=false",
    ] {
        assert!(
            release.installed.contains(next),
            "NOTES lack {next:?}:\n{}",
            release.installed
        );
    }
    let manifest = release.manifest();
    let docs = documents(&manifest);
    assert_eq!(
        kinds(&docs),
        [
            "ClusterRole",
            "ClusterRole",
            "ClusterRoleBinding",
            "Deployment",
            "PodDisruptionBudget",
            "PodDisruptionBudget",
            "Role",
            "RoleBinding",
            "Service",
            "Service",
            "ServiceAccount",
            "ServiceAccount",
            "StatefulSet",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ]
    );
    let present = existing(&manifest, &ctx.namespace);
    assert_eq!(
        present.len(),
        docs.len(),
        "not every object exists: {present:?}"
    );

    let deployments = ctx.api::<Deployment>();
    let statefulsets = ctx.api::<StatefulSet>();
    let operator = deployments
        .get(&release.operator())
        .await
        .expect("operator");
    let dispatcher = statefulsets
        .get(&release.dispatcher())
        .await
        .expect("dispatcher");
    let op_spec = operator.spec.clone();
    let disp_spec = dispatcher.spec.clone();
    assert_eq!(op_spec.replicas, Some(2));
    assert_eq!(disp_spec.replicas, Some(2));
    assert_eq!(
        disp_spec.service_name.as_deref(),
        Some(&*release.dispatcher())
    );
    let op_pod = op_spec.template.spec.clone().expect("pod spec");
    let disp_pod = disp_spec.template.spec.clone().expect("pod spec");
    let op_env = container_env(Some(&op_pod));
    let disp_env = container_env(Some(&disp_pod));
    // One shard count for both.
    assert_eq!(env_value(&op_env, "HERALD_SHARDS").as_deref(), Some("8"));
    assert_eq!(env_value(&disp_env, "HERALD_SHARDS").as_deref(), Some("8"));
    let replica_id = env_var(&disp_env, "HERALD_REPLICA_ID")
        .and_then(|e| e.value_from.as_ref())
        .and_then(|v| v.field_ref.as_ref())
        .map(|f| f.field_path.clone());
    assert_eq!(replica_id.as_deref(), Some("metadata.name"));
    assert_eq!(
        env_value(&op_env, "HERALD_LEASE_NAME"),
        Some(format!("{}-leader", release.operator()))
    );
    // The dispatcher gets no API token; both run restricted.
    assert_eq!(disp_pod.automount_service_account_token, Some(false));
    for pod in [&op_pod, &disp_pod] {
        let psc = pod.security_context.clone().expect("pod securityContext");
        assert_eq!(psc.run_as_non_root, Some(true));
        let sc = pod.containers[0]
            .security_context
            .clone()
            .expect("container securityContext");
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(
            sc.capabilities.and_then(|c| c.drop),
            Some(vec!["ALL".to_owned()])
        );
        assert_eq!(
            sc.seccomp_profile.map(|s| s.type_),
            Some("RuntimeDefault".to_owned())
        );
    }

    release.helm(
        "upgrade",
        &[
            "shards=8",
            "dispatcher.replicas=3",
            "allowNetworks={10.20.0.0/16,192.168.7.0/24}",
        ],
    );
    // The shard count is fixed at install: an upgrade that changes it is refused, and
    // says why.
    let mut cmd = helm();
    cmd.args(["upgrade", &release.name])
        .arg(chart_dir())
        .args(["--namespace", &release.namespace])
        .args([
            "--set",
            "crds.install=false",
            "--set",
            "nats.url=nats://nats.invalid:4222",
        ])
        .args(["--set", "shards=16"]);
    let refused = output(cmd, None);
    assert!(
        !refused.status.success(),
        "a shard count change was accepted"
    );
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(
        why.contains("shards cannot change after install") && why.contains("shards=8"),
        "{why}"
    );
    let dispatcher = statefulsets
        .get(&release.dispatcher())
        .await
        .expect("dispatcher");
    let disp_spec = dispatcher.spec;
    assert_eq!(disp_spec.replicas, Some(3));
    let operator = deployments
        .get(&release.operator())
        .await
        .expect("operator");
    for env in [
        container_env(disp_spec.template.spec.as_ref()),
        container_env(operator.spec.template.spec.as_ref()),
    ] {
        assert_eq!(
            env_value(&env, "HERALD_ALLOW_NETWORKS").as_deref(),
            Some("10.20.0.0/16,192.168.7.0/24")
        );
    }

    let out = release.uninstall();
    assert!(out.contains("uninstalled"), "{out}");
    eventually("every object of the release gone", WAIT, || async {
        existing(&manifest, &ctx.namespace).is_empty().then_some(())
    })
    .await;
    // The CRDs (installed by the harness, outside the release) are untouched.
    let mut cmd = env().kubectl();
    cmd.args(["get", "crd", "webhookendpoints.herald.dev", "-o", "name"]);
    ok(cmd, None);
    ctx.cleanup().await;
}

/// `kubectl apply -f -` of `manifest` in `namespace` (`--dry-run=server` when `dry`).
fn kubectl_apply(manifest: &str, namespace: &str, dry: bool) -> std::process::Output {
    let mut cmd = env().kubectl();
    cmd.args(["apply", "-n", namespace, "-f", "-"]);
    if dry {
        cmd.arg("--dry-run=server");
    }
    output(cmd, Some(manifest))
}

/// Where the chart is rendered without the cluster (`helm template` piped to kubectl, as
/// Argo CD applies it) `lookup` finds nothing and Helm's own check cannot see the running
/// count; the API server refuses the change instead (`shardGuard`), with the same
/// message, and the workloads keep the count they run. An update that keeps the count
/// goes through, and `shardGuard.enabled=false` renders no policy.
#[tokio::test]
async fn shard_count_change_is_refused_without_lookup() {
    let ctx = TestContext::new("chart-guard").await;
    let name = unique_name("guard");
    let render = |set: &[&str]| {
        let mut all = vec!["crds.install=false", "nats.url=nats://nats.invalid:4222"];
        all.extend_from_slice(set);
        template(&name, &ctx.namespace, &all)
    };
    let installed = render(&["shards=8"]);
    let out = kubectl_apply(&installed, &ctx.namespace, false);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // `helm template` renders the change: no lookup, no refusal from the chart.
    let changed = render(&["shards=16"]);
    // The API server enforces a new policy once it has loaded it: a dry run goes through
    // admission, so it shows when.
    let why = eventually("the API server refuses the changed count", WAIT, || async {
        let out = kubectl_apply(&changed, &ctx.namespace, true);
        (!out.status.success()).then(|| String::from_utf8_lossy(&out.stderr).into_owned())
    })
    .await;
    assert!(why.contains("shards cannot change after install"), "{why}");

    let refused = kubectl_apply(&changed, &ctx.namespace, false);
    assert!(
        !refused.status.success(),
        "a shard count change was applied"
    );
    let why = String::from_utf8_lossy(&refused.stderr);
    println!("kubectl apply refused: {why}");
    for object in [
        format!("statefulsets.apps \"{name}-herald-dispatcher\""),
        format!("deployments.apps \"{name}-herald-operator\""),
    ] {
        assert!(why.contains(&object), "{object} not refused: {why}");
    }
    assert!(
        why.contains("this release runs 8 shards and the update asks for 16")
            && why.contains("set shards=8"),
        "{why}"
    );
    let dispatcher = ctx
        .api::<StatefulSet>()
        .get(&format!("{name}-herald-dispatcher"))
        .await
        .expect("dispatcher");
    let operator = ctx
        .api::<Deployment>()
        .get(&format!("{name}-herald-operator"))
        .await
        .expect("operator");
    for env in [
        container_env(dispatcher.spec.template.spec.as_ref()),
        container_env(operator.spec.template.spec.as_ref()),
    ] {
        assert_eq!(env_value(&env, "HERALD_SHARDS").as_deref(), Some("8"));
    }

    // Another change that keeps the count is applied as usual.
    let out = kubectl_apply(
        &render(&["shards=8", "dispatcher.replicas=3"]),
        &ctx.namespace,
        false,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dispatcher = ctx
        .api::<StatefulSet>()
        .get(&format!("{name}-herald-dispatcher"))
        .await
        .expect("dispatcher");
    assert_eq!(dispatcher.spec.replicas, Some(3));

    let unguarded = documents(&render(&["shards=8", "shardGuard.enabled=false"]));
    assert!(
        !unguarded.iter().any(|d| d["kind"]
            .as_str()
            .unwrap_or_default()
            .starts_with("ValidatingAdmission")),
        "shardGuard.enabled=false still renders the policy"
    );

    // The cluster-scoped objects (the policy, the ClusterRoles) go with the test.
    let mut cmd = env().kubectl();
    cmd.args([
        "delete",
        "--ignore-not-found",
        "-n",
        &ctx.namespace,
        "-f",
        "-",
    ]);
    ok(cmd, Some(&installed));
    ctx.cleanup().await;
}
