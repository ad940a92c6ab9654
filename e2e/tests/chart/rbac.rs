//! The chart's RBAC: least privilege for each ServiceAccount, Secret rights that follow
//! the tenant namespaces, and the real operator reconciling as the chart's ServiceAccount.

use super::*;

/// `kubectl auth can-i VERB RESOURCE --as SUBJECT -n NS`: whether it is allowed.
fn can_i(subject: &str, namespace: &str, verb: &str, resource: &str) -> bool {
    let mut cmd = env().kubectl();
    cmd.args([
        "auth", "can-i", verb, resource, "--as", subject, "-n", namespace,
    ]);
    let out = output(cmd, None);
    let answer = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    match answer.as_str() {
        "yes" => true,
        "no" => false,
        other => panic!(
            "kubectl auth can-i {verb} {resource} --as {subject}: {other:?} {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

#[tokio::test]
async fn service_accounts_have_least_privilege() {
    let ctx = TestContext::new("chart-rbac").await;
    let release = Release::install(&ctx, "rbac", &[]);
    let ns = &ctx.namespace;
    let dispatcher = format!("system:serviceaccount:{ns}:{}", release.dispatcher());
    for (verb, resource) in [
        ("list", "secrets"),
        ("get", "secrets"),
        ("get", "leases.coordination.k8s.io"),
        ("list", "webhookendpoints.herald.dev"),
        ("get", "configmaps"),
        ("create", "events.events.k8s.io"),
        ("list", "pods"),
    ] {
        assert!(
            !can_i(&dispatcher, ns, verb, resource),
            "the dispatcher may {verb} {resource}"
        );
    }
    let operator = format!("system:serviceaccount:{ns}:{}", release.operator());
    for (verb, resource, allowed) in [
        ("watch", "webhookendpoints.herald.dev", true),
        ("patch", "signingsecrets.herald.dev/status", true),
        // Serving every namespace, Secrets are granted per namespace (below).
        ("get", "secrets", false),
        ("create", "secrets", false),
        ("delete", "secrets", false),
        ("update", "secrets", false),
        ("create", "webhookendpoints.herald.dev", false),
        ("delete", "webhookendpoints.herald.dev", false),
        ("list", "configmaps", false),
        ("create", "events.events.k8s.io", true),
        ("create", "leases.coordination.k8s.io", true),
        ("delete", "leases.coordination.k8s.io", false),
    ] {
        assert_eq!(
            can_i(&operator, ns, verb, resource),
            allowed,
            "operator: {verb} {resource}"
        );
    }
    // The Lease rights are the release's own Lease in the release namespace only.
    let lease = format!("leases.coordination.k8s.io/{}-leader", release.operator());
    assert!(can_i(&operator, ns, "update", &lease));
    assert!(!can_i(
        &operator,
        ns,
        "update",
        "leases.coordination.k8s.io/other"
    ));
    assert!(!can_i(&operator, "default", "update", &lease));
    release.uninstall();
    ctx.cleanup().await;
}

/// `kubectl auth can-i VERB RESOURCE --as SUBJECT --all-namespaces`: whether it is
/// allowed cluster-wide.
fn can_i_everywhere(subject: &str, verb: &str, resource: &str) -> bool {
    let mut cmd = env().kubectl();
    cmd.args([
        "auth",
        "can-i",
        verb,
        resource,
        "--as",
        subject,
        "--all-namespaces",
    ]);
    String::from_utf8_lossy(&output(cmd, None).stdout).trim() == "yes"
}

/// The Secret rights of a SigningSecret's operator, in both modes: with
/// `operator.tenantNamespaces`, Secrets (and everything else) only in those namespaces and
/// nothing cluster-wide; serving every namespace, no Secret anywhere until the platform
/// team binds the Secrets role in a namespace (the command NOTES.txt prints), and every
/// Secret, `kube-system` included, only with the explicit `operator.clusterWideSecrets`.
#[tokio::test]
async fn operator_secret_rights_follow_tenant_namespaces() {
    let ctx = TestContext::new("chart-secrets").await;
    let other = TestContext::new("chart-tenant").await;
    let bystander = TestContext::new("chart-bystander").await;
    let (ns, tenant, outsider) = (&ctx.namespace, &other.namespace, &bystander.namespace);
    let secret_verbs = ["get", "list", "watch", "create", "patch"];

    // Tenant namespaces: RoleBindings there, nothing cluster-wide.
    let tenants = format!("operator.tenantNamespaces={{{ns},{tenant}}}");
    let release = Release::install(&ctx, "tenants", &[&tenants]);
    let operator = format!("system:serviceaccount:{ns}:{}", release.operator());
    let docs = documents(&release.manifest());
    assert!(
        !kinds(&docs).iter().any(|k| k == "ClusterRoleBinding"),
        "no cluster-wide binding with tenant namespaces"
    );
    for namespace in [ns, tenant] {
        for verb in secret_verbs {
            assert!(
                can_i(&operator, namespace, verb, "secrets"),
                "{verb} secrets in {namespace}"
            );
        }
        assert!(can_i(
            &operator,
            namespace,
            "watch",
            "webhookendpoints.herald.dev"
        ));
        assert!(can_i(
            &operator,
            namespace,
            "create",
            "events.events.k8s.io"
        ));
    }
    for namespace in [outsider.as_str(), "kube-system", "default"] {
        for verb in secret_verbs {
            assert!(
                !can_i(&operator, namespace, verb, "secrets"),
                "{verb} secrets in {namespace}"
            );
        }
        assert!(!can_i(
            &operator,
            namespace,
            "list",
            "webhookendpoints.herald.dev"
        ));
        assert!(!can_i(
            &operator,
            namespace,
            "create",
            "events.events.k8s.io"
        ));
    }
    for resource in [
        "secrets",
        "webhookendpoints.herald.dev",
        "signingsecrets.herald.dev",
    ] {
        assert!(
            !can_i_everywhere(&operator, "list", resource),
            "list {resource} cluster-wide"
        );
    }
    let deployment = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("the operator");
    let operator_env = deployment["spec"]["template"]["spec"]["containers"][0]["env"].to_string();
    assert!(
        operator_env.contains(&format!("\"{ns},{tenant}\"")),
        "{operator_env}"
    );
    release.uninstall();

    // Every namespace (the default): Herald's resources cluster-wide, Secrets nowhere.
    let release = Release::install(&ctx, "all", &[]);
    let operator = format!("system:serviceaccount:{ns}:{}", release.operator());
    assert!(can_i_everywhere(
        &operator,
        "watch",
        "webhookendpoints.herald.dev"
    ));
    assert!(!can_i_everywhere(&operator, "list", "secrets"));
    for namespace in [ns, tenant, outsider, "kube-system"] {
        assert!(
            !can_i(&operator, namespace, "get", "secrets"),
            "get secrets in {namespace}"
        );
    }
    assert!(
        release.installed.contains("create rolebinding"),
        "NOTES say how to grant Secrets:\n{}",
        release.installed
    );
    // The platform team grants one tenant namespace, as NOTES.txt says.
    let role = format!("{}-secrets", release.operator());
    let mut bind = env().kubectl();
    bind.args(["-n", tenant, "create", "rolebinding", &role])
        .arg(format!("--clusterrole={role}"))
        .arg(format!("--serviceaccount={ns}:{}", release.operator()));
    ok(bind, None);
    for verb in secret_verbs {
        assert!(
            can_i(&operator, tenant, verb, "secrets"),
            "{verb} secrets in {tenant}"
        );
    }
    for namespace in [ns, outsider, "kube-system"] {
        assert!(
            !can_i(&operator, namespace, "get", "secrets"),
            "get secrets in {namespace}"
        );
    }

    // The explicit opt-in, and only it, reaches every Secret.
    release.helm("upgrade", &["operator.clusterWideSecrets=true"]);
    assert!(can_i(&operator, "kube-system", "get", "secrets"));
    assert!(can_i_everywhere(&operator, "watch", "secrets"));
    let manifest = release.manifest();
    assert!(manifest.contains("HERALD_WATCH_SECRETS_CLUSTER_WIDE"));
    // ... and refuses to combine with tenant namespaces, whose Secrets are already granted.
    let mut cmd = helm();
    cmd.args(["template", "x"]).arg(chart_dir()).args([
        "--set",
        "operator.clusterWideSecrets=true",
        "--set",
        &tenants,
    ]);
    let refused = output(cmd, None);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("clusterWideSecrets"));
    release.uninstall();
    for c in [ctx, other, bystander] {
        c.cleanup().await;
    }
}

/// A kubeconfig like the environment's that impersonates `user`.
fn impersonating_kubeconfig(user: &str, path: &std::path::Path) {
    let text = std::fs::read_to_string(env().kubeconfig()).expect("reading the kubeconfig");
    let mut config: Value = serde_norway::from_str(&text).expect("kubeconfig parses");
    for entry in config["users"].as_array_mut().expect("users") {
        entry["user"]["as"] = json!(user);
    }
    std::fs::write(
        path,
        serde_norway::to_string(&config).expect("kubeconfig serializes"),
    )
    .expect("writing the kubeconfig");
}

fn is_ready(conditions: Option<&Vec<Condition>>) -> bool {
    conditions
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// `GET /metrics` of the in-process operator.
async fn scrape(port: u16) -> Option<String> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await
        .ok()?;
    let mut body = String::new();
    stream.read_to_string(&mut body).await.ok()?;
    Some(body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_with_the_charts_rbac_reconciles() {
    let ctx = TestContext::new("chart-op").await;
    let release = Release::install(&ctx, "op", &["allowNetworks={127.0.0.0/8}"]);
    let ns = ctx.namespace.clone();
    let kubeconfig = std::env::temp_dir().join(format!("{}-kubeconfig", release.name));
    impersonating_kubeconfig(
        &format!("system:serviceaccount:{ns}:{}", release.operator()),
        &kubeconfig,
    );
    let port = herald_e2e::free_port();
    let lease_name = format!("{}-leader", release.operator());
    // The flags the chart's Deployment sets through the environment.
    let args = [
        "herald-operator",
        "--nats-url",
        env().nats_url(),
        // The test environment's NATS runs with the test dispatchers' shard count.
        "--shards",
        "4",
        "--namespace",
        &ns,
        "--lease-namespace",
        &ns,
        "--lease-name",
        &lease_name,
        "--identity",
        "op-0",
        "--kubeconfig",
        &kubeconfig.display().to_string(),
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--allow-network",
        "127.0.0.0/8",
    ]
    .map(str::to_owned);
    let config =
        <herald_operator::Config as clap::Parser>::try_parse_from(args).expect("operator flags");
    let (stop, stopped) = oneshot::channel::<()>();
    let operator = tokio::spawn(herald_operator::run(config, async move {
        let _ = stopped.await;
    }));

    let secrets = ctx.api::<SigningSecret>();
    let endpoints = ctx.api::<WebhookEndpoint>();
    let secret: SigningSecret = serde_json::from_value(json!({
        "apiVersion": "herald.dev/v1alpha1", "kind": "SigningSecret",
        "metadata": {"name": "keys"}, "spec": {}
    }))
    .expect("SigningSecret");
    let endpoint: WebhookEndpoint = serde_json::from_value(json!({
        "apiVersion": "herald.dev/v1alpha1", "kind": "WebhookEndpoint",
        "metadata": {"name": "orders"},
        "spec": {"url": "https://127.0.0.1:8443/hook", "eventTypes": ["order.*"], "secretRef": {"name": "keys"}}
    }))
    .expect("WebhookEndpoint");
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("creating the SigningSecret");
    endpoints
        .create(&PostParams::default(), &endpoint)
        .await
        .expect("creating the WebhookEndpoint");

    // Installed to serve every namespace (the chart's default), the operator may not
    // touch Secrets here yet, and the SigningSecret says so ...
    eventually("the SigningSecret SecretForbidden", WAIT, || async {
        let s = secrets.get("keys").await.ok()?;
        let conditions = s.status?.conditions;
        let ready = conditions.iter().find(|c| c.type_ == "Ready")?;
        (ready.status == "False" && ready.reason == "SecretForbidden").then_some(())
    })
    .await;
    // ... until the platform team binds the Secrets role in this namespace, as NOTES.txt
    // says; the operator looks again by itself.
    let role = format!("{}-secrets", release.operator());
    let mut bind = env().kubectl();
    bind.args(["-n", &ns, "create", "rolebinding", &role])
        .arg(format!("--clusterrole={role}"))
        .arg(format!("--serviceaccount={ns}:{}", release.operator()));
    ok(bind, None);
    eventually("the SigningSecret Ready", WAIT, || async {
        let s = secrets.get("keys").await.ok()?;
        is_ready(s.status.as_ref().map(|s| &s.conditions)).then_some(())
    })
    .await;
    eventually("the WebhookEndpoint Ready", WAIT, || async {
        let e = endpoints.get("orders").await.ok()?;
        is_ready(e.status.as_ref().map(|s| &s.conditions)).then_some(())
    })
    .await;
    // A replay of the last hour to that endpoint: the replay controller's rights. A replay
    // is checked against the event store, which a dispatcher creates; none runs here, and
    // this may be the first test against this NATS.
    herald_e2e::dataplane::DataPlane::new(ctx.nats.clone()).await;
    let replays = ctx.api::<WebhookReplay>();
    let from = jiff::Timestamp::now() - jiff::SignedDuration::from_hours(1);
    let replay: WebhookReplay = serde_json::from_value(json!({
        "apiVersion": "herald.dev/v1alpha1", "kind": "WebhookReplay",
        "metadata": {"name": "last-hour"},
        "spec": {"endpoint": "orders", "from": from.to_string()}
    }))
    .expect("WebhookReplay");
    replays
        .create(&PostParams::default(), &replay)
        .await
        .expect("creating the WebhookReplay");
    eventually("the WebhookReplay validated", WAIT, || async {
        let r = replays.get("last-hour").await.ok()?;
        is_ready(r.status.as_ref().map(|s| &s.conditions)).then_some(())
    })
    .await;
    // The generated key Secret (create + patch), the Lease (create + update), an Event.
    let generated = ctx
        .api::<Secret>()
        .get("keys")
        .await
        .expect("generated Secret");
    assert!(generated.data.is_some_and(|d| d.contains_key("current")));
    let lease = ctx
        .api::<Lease>()
        .get(&lease_name)
        .await
        .expect("the Lease");
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("op-0")
    );
    eventually("a KeyGenerated Event", WAIT, || async {
        let mut cmd = env().kubectl();
        cmd.args([
            "get",
            "events.events.k8s.io",
            "-n",
            &ns,
            "-o",
            "jsonpath={.items[*].reason}",
        ]);
        ok(cmd, None).contains("KeyGenerated").then_some(())
    })
    .await;

    // Deleting goes through the finalizers (patch on the resources).
    secrets
        .delete("keys", &DeleteParams::default())
        .await
        .expect("deleting the SigningSecret");
    endpoints
        .delete("orders", &DeleteParams::default())
        .await
        .expect("deleting the WebhookEndpoint");
    eventually("both resources gone", WAIT, || async {
        let s = secrets.get_opt("keys").await.ok()?;
        let e = endpoints.get_opt("orders").await.ok()?;
        (s.is_none() && e.is_none()).then_some(())
    })
    .await;

    // No reconcile failed for want of a permission: no `kube` error category at all.
    let metrics = eventually("the operator's metrics", WAIT, || scrape(port)).await;
    let kube_errors: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("herald_operator_reconcile_errors_total{"))
        .filter(|l| l.contains("category=\"kube\"") && !l.ends_with(" 0"))
        .collect();
    assert!(
        kube_errors.is_empty(),
        "reconciles failed against the API: {kube_errors:?}"
    );
    assert!(metrics.contains("herald_operator_leader 1"), "{metrics}");

    let _ = stop.send(());
    let result = tokio::time::timeout(Duration::from_secs(30), operator)
        .await
        .expect("the operator stops")
        .expect("operator task");
    assert!(result.is_ok(), "{result:?}");
    // A graceful stop releases the Lease (update), so a standby takes over at once.
    let lease = ctx
        .api::<Lease>()
        .get(&lease_name)
        .await
        .expect("the Lease");
    assert_eq!(lease.spec.and_then(|s| s.holder_identity), None);
    let _ = std::fs::remove_file(&kubeconfig);
    release.uninstall();
    ctx.cleanup().await;
}
