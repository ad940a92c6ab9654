//! Who the pods are: NATS TLS and identities from the Secrets, and what the operator may read.

use super::*;

/// The chart's NATS security values, run for real against NATS in operator (JWT) mode
/// with TLS ([`private_jwt_env`]): the CA in a Secret (`nats.tls.caSecret`), each binary's
/// identity in its own Secret (`nats.{operator,dispatcher}Identity`: client certificate,
/// key and credentials file), mounted where the rendered pod spec says and found there
/// through the rendered environment. Both pods become ready by their probes and deliver
/// an event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_charts_pods_connect_with_the_nats_tls_and_identity_secrets() {
    herald_dispatcher::install_crypto_provider();
    let te = private_jwt_env();
    let files = te.nats_secure_dir().expect("a secure environment");
    let ctx = TestContext::new_in(te, "chart-nats").await;
    let ns = ctx.namespace.clone();
    let file = |name: &str| files.join(name).display().to_string();
    let mut secrets = vec![("nats-ca", vec![("ca.crt", file("ca.pem"))])];
    for identity in ["operator", "dispatcher"] {
        secrets.push((
            if identity == "operator" {
                "nats-operator"
            } else {
                "nats-dispatcher"
            },
            vec![
                ("tls.crt", file(&format!("{identity}.crt"))),
                ("tls.key", file(&format!("{identity}.key"))),
                ("user.creds", file(&format!("{identity}.creds"))),
            ],
        ));
    }
    for (name, keys) in &secrets {
        let mut create = te.kubectl();
        create.args(["create", "secret", "generic", name, "-n", &ns]);
        for (key, path) in keys {
            create.arg(format!("--from-file={key}={path}"));
        }
        ok(create, None);
    }
    let mut set = vec!["nats.tls.caSecret=nats-ca".to_owned()];
    for binary in ["operator", "dispatcher"] {
        set.extend([
            format!("nats.{binary}Identity.secret=nats-{binary}"),
            format!("nats.{binary}Identity.certFile=tls.crt"),
            format!("nats.{binary}Identity.keyFile=tls.key"),
            format!("nats.{binary}Identity.credsFile=user.creds"),
        ]);
    }
    let set: Vec<&str> = set.iter().map(String::as_str).collect();
    let release = Release::install_in(te, &ctx, "pods-nats", &set);
    let (deployment, statefulset) = (
        release.workload("Deployment"),
        release.workload("StatefulSet"),
    );
    for workload in [&deployment, &statefulset] {
        let container = &workload["spec"]["template"]["spec"]["containers"][0];
        let names: Vec<&str> = container["env"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v["name"].as_str())
            .collect();
        for expected in [
            "HERALD_NATS_TLS_CA",
            "HERALD_NATS_TLS_CERT",
            "HERALD_NATS_TLS_KEY",
            "HERALD_NATS_CREDS",
        ] {
            assert!(
                names.contains(&expected),
                "{expected} not rendered: {names:?}"
            );
        }
        assert_eq!(
            container["volumeMounts"].as_array().map(Vec::len),
            Some(2),
            "the CA and the identity are mounted: {container}"
        );
    }
    let mut operator = release.pod(&deployment, "0");
    let mut dispatcher = release.pod(&statefulset, "0");
    for pod in [&mut operator, &mut dispatcher] {
        pod.until_ready().await;
    }
    let rx = Receiver::start().await;
    tenant_endpoint(&ctx, &rx.url("orders")).await;
    // Published as the environment's admin (a producer identity may only use its own
    // tenant namespace, and this test's namespace is a fresh one).
    let dp = DataPlane::new(te.nats().await).await;
    dp.publish(&ns, "order.created", json!({"id": 7})).await;
    let delivered = eventually("the event delivered", WAIT, || {
        let got = rx.received("orders");
        async move { got.first().cloned() }
    })
    .await;
    assert_eq!(delivered.json()["data"]["id"], 7);
    assert!(delivered.header("webhook-signature").starts_with("v1,"));
    for pod in [dispatcher, operator] {
        pod.terminate().await;
    }
    release.uninstall();
    ctx.cleanup().await;
}

/// Least privilege, run for real (issue 13): the chart with two tenant namespaces, the
/// operator binary with its ServiceAccount's token. It serves both — a SigningSecret
/// becomes Ready with its Secret generated, a WebhookEndpoint becomes Ready, a hand-edited
/// key is picked up through its namespace's Secret watch long before the 5-minute resync —
/// while the same token cannot read a Secret in a namespace it has no business in, nor in
/// `kube-system`, nor list Secrets cluster-wide.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_serves_its_tenants_and_reads_no_other_secret() {
    herald_dispatcher::install_crypto_provider();
    let ctx = TestContext::new("chart-least").await;
    let other = TestContext::new("chart-least-t").await;
    let bystander = TestContext::new("chart-least-b").await;
    let mut cmd = env().kubectl();
    cmd.args([
        "-n",
        &bystander.namespace,
        "create",
        "secret",
        "generic",
        "database",
    ])
    .arg("--from-literal=password=not-for-herald");
    ok(cmd, None);
    let tenants = format!(
        "operator.tenantNamespaces={{{},{}}}",
        ctx.namespace, other.namespace
    );
    let release = Release::install(&ctx, "least", &[&tenants]);
    let deployment = release.workload("Deployment");
    let mut operator = release.pod(&deployment, "0");
    operator.until_ready().await;

    // The operator's own token, as its pod would hold it.
    let account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .expect("a ServiceAccount");
    let token = service_account_kubeconfig(env(), account, &ctx.namespace);
    let as_operator = |args: &[&str]| {
        let mut cmd = env().kubectl();
        cmd.arg("--kubeconfig").arg(&token).args(args);
        herald_e2e::helm::output(cmd, None)
    };
    for args in [
        &["get", "secret", "database", "-n", &bystander.namespace][..],
        &["get", "secrets", "-n", &bystander.namespace],
        &["get", "secrets", "-n", "kube-system"],
        &["get", "secrets", "--all-namespaces"],
        &["get", "webhookendpoints.herald.dev", "--all-namespaces"],
    ] {
        let out = as_operator(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains("Forbidden"),
            "the operator's token may `kubectl {}`: {}{stderr}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout)
        );
    }
    // The same token does read where it must (the test above is not refusing everything).
    let out = as_operator(&["get", "secrets", "-n", &other.namespace]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Both tenant namespaces are served.
    tenant_endpoint(&ctx, "http://127.0.0.1:9/orders").await;
    tenant_endpoint(&other, "http://127.0.0.1:9/orders").await;
    let generated = other
        .api::<k8s_openapi::api::core::v1::Secret>()
        .get("keys")
        .await
        .expect("the Secret generated in the second tenant namespace");
    assert!(generated.data.is_some_and(|d| d.contains_key("current")));

    // A hand-edited key there is picked up through the per-namespace Secret watch.
    let signing = other.api::<SigningSecret>();
    let active = |s: SigningSecret| s.status.and_then(|s| s.active_key_id);
    let before = active(signing.get("keys").await.expect("the SigningSecret"));
    let (key, _) = herald_core::signing::generate_whsec().expect("a key");
    let mut edit = env().kubectl();
    edit.args([
        "-n",
        &other.namespace,
        "create",
        "secret",
        "generic",
        "keys",
    ])
    .arg(format!("--from-literal=current={key}"))
    .args(["--dry-run=client", "-o", "yaml"]);
    let manifest = ok(edit, None);
    let mut apply = env().kubectl();
    apply.args(["-n", &other.namespace, "apply", "-f", "-"]);
    ok(apply, Some(&manifest));
    eventually("the edited key active", Duration::from_secs(60), || async {
        let now = active(signing.get("keys").await.ok()?);
        (now.is_some() && now != before).then_some(())
    })
    .await;

    // Not one reconcile failed for want of a permission.
    let metrics = reqwest::get(format!("http://127.0.0.1:{}/metrics", operator.port))
        .await
        .expect("the operator's metrics")
        .text()
        .await
        .expect("metrics text");
    let kube_errors: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("herald_operator_reconcile_errors_total{"))
        .filter(|l| l.contains("category=\"kube\"") && !l.ends_with(" 0"))
        .collect();
    assert!(kube_errors.is_empty(), "{kube_errors:?}");
    let log = std::fs::read_to_string(&operator.log).unwrap_or_default();
    assert!(
        !log.to_lowercase().contains("forbidden"),
        "the operator was refused:\n{log}"
    );

    operator.terminate().await;
    release.uninstall();
    let _ = std::fs::remove_file(&token);
    for c in [ctx, other, bystander] {
        c.cleanup().await;
    }
}
