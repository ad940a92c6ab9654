//! The proxied path against a CONNECT proxy on loopback: the proxy is asked for the
//! vetted address (never the name), rebinding is still refused, the proxy's own
//! failures are named, TLS runs end to end inside the tunnel, tunnels are reused.

use std::sync::Mutex;

use tokio::net::TcpListener;

use super::loopback::{TestProxy, keep_alive_receiver, serve};
use super::*;

/// A client whose proxies are `flags` (as the dispatcher takes them), trusting the test
/// CA for TLS inside tunnels.
fn proxied_client(policy: Arc<AddressPolicy>, lookup: Lookup, flags: &[String]) -> Client {
    counting_client(policy, lookup, flags, Default::default())
}

/// [`proxied_client`] counting proxy failures in `errors`.
fn counting_client(
    policy: Arc<AddressPolicy>,
    lookup: Lookup,
    flags: &[String],
    errors: tunnel::ProxyErrors,
) -> Client {
    #[derive(clap::Parser)]
    struct Flags {
        #[command(flatten)]
        egress: EgressArgs,
    }
    crate::install_crypto_provider();
    let flags = <Flags as clap::Parser>::try_parse_from(
        std::iter::once("x").chain(flags.iter().map(String::as_str)),
    )
    .expect("flags");
    let egress = flags.egress.egress().expect("egress");
    let tls = Some(test_tls());
    Client::build(policy, egress, lookup, tls, errors, DEFAULT_IDLE_PER_HOST).expect("a client")
}

fn test_tls() -> rustls::ClientConfig {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    let ca = CertificateDer::from_pem_slice(include_bytes!("tls/ca.pem")).unwrap();
    roots.add(ca).unwrap();
    rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth()
}

async fn send_via(
    http: &Client,
    policy: &AddressPolicy,
    url: &str,
    proxy: Option<&EgressProxy>,
) -> AttemptResult {
    let keys = [SigningKey::from_whsec("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap()];
    let headers = [Header::literal("Authorization", "Bearer tenant-token")];
    let attempt = Attempt {
        url,
        event_id: "msg_1",
        body: Bytes::from_static(b"{}"),
        keys: &keys,
        headers: &headers,
        timeout: Duration::from_secs(5),
        redact_fields: &[],
        proxy,
        tls: None,
    };
    send(http, policy, attempt).await
}

fn hooks_test_is(ip: &'static str) -> Lookup {
    Arc::new(move |_host: String| {
        Box::pin(async move { Ok(vec![SocketAddr::new(ip.parse().unwrap(), 0)]) })
    })
}

/// The proxy is asked for the vetted address, the receiver gets the request with the
/// name as its Host, signed; a second attempt reuses the tunnel.
#[tokio::test]
async fn deliveries_go_through_the_proxy_to_the_vetted_address_and_reuse_the_tunnel() {
    let proxy = TestProxy::start(None).await;
    let (port, heads) = keep_alive_receiver().await;
    let policy = policy(&["127.0.0.1/32"]);
    let http = proxied_client(
        policy.clone(),
        hooks_test_is("127.0.0.1"),
        &["--egress-proxy".into(), proxy.url()],
    );
    let url = format!("http://hooks.test:{port}/hook");
    for _ in 0..2 {
        let result = send_via(&http, &policy, &url, None).await;
        assert_eq!(result.outcome, Outcome::Success, "{}", result.snippet);
        assert_eq!(result.snippet, "ok");
    }
    assert_eq!(
        proxy.targets(),
        vec![format!("127.0.0.1:{port}")],
        "one tunnel, to the address"
    );
    let heads = heads.lock().unwrap().clone();
    assert_eq!(heads.len(), 2);
    for head in &heads {
        assert!(head.starts_with("POST /hook HTTP/1.1\r\n"), "{head}");
        let lower = head.to_ascii_lowercase();
        assert!(
            lower.contains(&format!("host: hooks.test:{port}\r\n")),
            "{head}"
        );
        assert!(lower.contains("webhook-signature: v1,"), "{head}");
        assert!(lower.contains("webhook-id: msg_1\r\n"), "{head}");
        assert!(
            lower.contains("authorization: bearer tenant-token\r\n"),
            "{head}"
        );
    }
}

/// DNS rebinding with a proxy: the second connection's name resolves to an internal
/// address; Herald refuses it before asking the proxy anything.
#[tokio::test]
async fn a_rebound_name_is_refused_before_the_proxy_is_asked() {
    let proxy = TestProxy::start(None).await;
    let (port, public, internal) = two_receivers().await;
    let policy = policy(&["127.0.0.1/32"]);
    let (lookup, _) = scripted(vec![vec!["127.0.0.1"], vec!["127.0.0.2"]]);
    let http = proxied_client(
        policy.clone(),
        lookup,
        &["--egress-proxy".into(), proxy.url()],
    );
    let url = format!("http://hooks.test:{port}/");
    let first = send_via(&http, &policy, &url, None).await;
    assert_eq!(first.outcome, Outcome::Success, "{}", first.snippet);
    let second = send_via(&http, &policy, &url, None).await;
    assert_eq!(
        second.outcome,
        Outcome::AddressForbidden,
        "{}",
        second.snippet
    );
    assert!(second.snippet.contains("127.0.0.2"), "{}", second.snippet);
    assert_eq!(proxy.targets(), vec![format!("127.0.0.1:{port}")]);
    assert_eq!((count(&public), count(&internal)), (1, 0));
    // An IP-literal URL the policy refuses never reaches the proxy either.
    let literal = send_via(&http, &policy, &format!("http://127.0.0.2:{port}/"), None).await;
    assert_eq!(
        literal.outcome,
        Outcome::AddressForbidden,
        "{}",
        literal.snippet
    );
    assert_eq!(proxy.targets().len(), 1);
}

/// A proxy that is down, refuses the tunnel or the credentials: a connect error whose
/// text names the proxy; the credentials never appear.
#[tokio::test]
async fn the_proxys_own_failures_are_connect_errors_naming_it() {
    let policy = policy(&["127.0.0.1/32"]);
    let down = format!("http://127.0.0.1:{}", {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    });
    let forbidden = TestProxy::start(Some("HTTP/1.1 403 Forbidden\r\n\r\n")).await;
    let auth = TestProxy::start(Some("HTTP/1.1 407 Proxy Authentication Required\r\n\r\n")).await;
    let garbage = TestProxy::start(Some("SSH-2.0-OpenSSH_9.6\r\n\r\n")).await;
    let dir = std::env::temp_dir().join(format!("herald-proxy-creds-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("auth"), "herald:s3cret\n").unwrap();
    let errors = tunnel::ProxyErrors::default();
    let http = counting_client(
        policy.clone(),
        hooks_test_is("127.0.0.1"),
        &[
            "--egress-proxy".into(),
            down.clone(),
            "--egress-proxy-named".into(),
            format!(
                "forbidden={},auth={},garbage={}",
                forbidden.url(),
                auth.url(),
                garbage.url()
            ),
            "--egress-proxy-credentials".into(),
            dir.to_str().unwrap().into(),
        ],
        errors.clone(),
    );
    let pick = |name: &str| EgressProxy {
        name: Some(name.into()),
        direct: false,
    };
    let url = "http://hooks.test:9/";
    for (choice, says) in [
        (
            None,
            format!(
                "egress proxy \"default\" ({}) is unreachable",
                down.trim_start_matches("http://")
            ),
        ),
        (
            Some(pick("forbidden")),
            "did not open a tunnel to 127.0.0.1:9: HTTP/1.1 403 Forbidden".into(),
        ),
        (
            Some(pick("auth")),
            "\"auth\"".to_owned()
                + &format!(
                    " (127.0.0.1:{}) refused Herald's credentials: HTTP/1.1 407",
                    auth.port
                ),
        ),
        (
            Some(pick("garbage")),
            "answered CONNECT with something that is not HTTP".into(),
        ),
    ] {
        let result = send_via(&http, &policy, url, choice.as_ref()).await;
        assert_eq!(
            result.outcome,
            Outcome::ConnectError,
            "{says}: {}",
            result.snippet
        );
        assert!(
            result.snippet.starts_with("ConnectError: egress proxy"),
            "{}",
            result.snippet
        );
        assert!(result.snippet.contains(&says), "{says}: {}", result.snippet);
    }
    // Counted per proxy and reason (herald_dispatcher_egress_proxy_errors_total).
    for (proxy, reason) in [
        ("default", "unreachable"),
        ("forbidden", "refused"),
        ("auth", "auth"),
        ("garbage", "invalid"),
    ] {
        let label = crate::metrics::ProxyErrorLabel {
            proxy: proxy.into(),
            reason,
        };
        assert_eq!(errors.get_or_create(&label).get(), 1, "{proxy} {reason}");
    }
    // The credentials went to the proxy that has them, and nowhere into the record.
    let sent = auth.connects.lock().unwrap()[0].1.clone();
    assert_eq!(sent.as_deref(), Some("Basic aGVyYWxkOnMzY3JldA=="));
    assert_eq!(forbidden.connects.lock().unwrap()[0].1, None);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An endpoint picks a named proxy, or direct where allowed; a name the platform did not
/// configure is refused without any connection.
#[tokio::test]
async fn an_endpoint_picks_an_allowed_proxy_or_direct_and_nothing_else() {
    let default = TestProxy::start(None).await;
    let eu = TestProxy::start(None).await;
    let (port, heads) = keep_alive_receiver().await;
    let policy = policy(&["127.0.0.1/32"]);
    let flags = |extra: &[&str]| {
        let mut flags = vec![
            "--egress-proxy".to_owned(),
            default.url(),
            "--egress-proxy-named".into(),
            format!("eu={}", eu.url()),
        ];
        flags.extend(extra.iter().map(|s| s.to_string()));
        flags
    };
    let http = proxied_client(policy.clone(), hooks_test_is("127.0.0.1"), &flags(&[]));
    let url = format!("http://hooks.test:{port}/");
    let pick = |name: &str| EgressProxy {
        name: Some(name.into()),
        direct: false,
    };
    let direct = EgressProxy {
        name: None,
        direct: true,
    };
    let ok = send_via(&http, &policy, &url, Some(&pick("eu"))).await;
    assert_eq!(ok.outcome, Outcome::Success, "{}", ok.snippet);
    assert_eq!((eu.targets().len(), default.targets().len()), (1, 0));
    for choice in [pick("elsewhere"), direct.clone()] {
        let refused = send_via(&http, &policy, &url, Some(&choice)).await;
        assert_eq!(
            refused.outcome,
            Outcome::AddressForbidden,
            "{}",
            refused.snippet
        );
        assert!(
            refused.snippet.contains("spec.delivery.proxy"),
            "{}",
            refused.snippet
        );
    }
    let open = proxied_client(
        policy.clone(),
        hooks_test_is("127.0.0.1"),
        &flags(&["--egress-allow-direct"]),
    );
    let ok = send_via(&open, &policy, &url, Some(&direct)).await;
    assert_eq!(ok.outcome, Outcome::Success, "{}", ok.snippet);
    assert_eq!((eu.targets().len(), default.targets().len()), (1, 0));
    assert_eq!(heads.lock().unwrap().len(), 2);
}

/// https through the tunnel: the proxy sees only the address; TLS names the host (SNI)
/// and checks the certificate against it, end to end with the receiver.
#[tokio::test]
async fn https_runs_end_to_end_inside_the_tunnel() {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    crate::install_crypto_provider();
    let certs = vec![CertificateDer::from_pem_slice(include_bytes!("tls/hooks.test.pem")).unwrap()];
    let key = PrivateKeyDer::from_pem_slice(include_bytes!("tls/hooks.test.key")).unwrap();
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let heads = Arc::new(Mutex::new(Vec::new()));
    let names = Arc::new(Mutex::new(Vec::new()));
    let (seen, sni) = (heads.clone(), names.clone());
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let Ok(tls) = acceptor.accept(stream).await else {
                continue;
            };
            sni.lock()
                .unwrap()
                .push(tls.get_ref().1.server_name().map(str::to_owned));
            tokio::spawn(serve(tls, seen.clone()));
        }
    });
    let proxy = TestProxy::start(None).await;
    let policy = Arc::new(AddressPolicy {
        allow: vec!["127.0.0.1/32".parse().unwrap()],
        allow_http: false,
    });
    let http = proxied_client(
        policy.clone(),
        hooks_test_is("127.0.0.1"),
        &["--egress-proxy".into(), proxy.url()],
    );
    let result = send_via(
        &http,
        &policy,
        &format!("https://hooks.test:{port}/tls"),
        None,
    )
    .await;
    assert_eq!(result.outcome, Outcome::Success, "{}", result.snippet);
    assert_eq!(proxy.targets(), vec![format!("127.0.0.1:{port}")]);
    assert_eq!(*names.lock().unwrap(), vec![Some("hooks.test".to_owned())]);
    assert!(heads.lock().unwrap()[0].starts_with("POST /tls HTTP/1.1"));
    // A certificate for another name fails the attempt (TLS is checked against the URL's
    // host, not against the address the tunnel goes to).
    let wrong = send_via(
        &http,
        &policy,
        &format!("https://localhost:{port}/tls"),
        None,
    )
    .await;
    assert_eq!(wrong.outcome, Outcome::ConnectError, "{}", wrong.snippet);
    assert!(
        wrong.snippet.to_lowercase().contains("certificate"),
        "{}",
        wrong.snippet
    );
}
