//! Mutual TLS: an endpoint's client certificate and CA (`spec.tls`) against a receiver
//! on loopback that demands a client certificate of its CA (`e2e/tls`, made by its
//! `make.sh`).

use std::sync::Mutex;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;

const CA: &str = include_str!("../../../../e2e/tls/ca.pem");
const RECEIVER_CERT: &str = include_str!("../../../../e2e/tls/receiver.pem");
const RECEIVER_KEY: &str = include_str!("../../../../e2e/tls/receiver.key");
const CLIENT_CERT: &str = include_str!("../../../../e2e/tls/client.pem");
const CLIENT_KEY: &str = include_str!("../../../../e2e/tls/client.key");
const STRANGER_CERT: &str = include_str!("../../../../e2e/tls/stranger.pem");
const STRANGER_KEY: &str = include_str!("../../../../e2e/tls/stranger.key");

/// A receiver on 127.0.0.1 that completes TLS only with a client certificate of `CA`;
/// answers 200 and records the common name of each client it served.
async fn mtls_receiver() -> (u16, Arc<Mutex<Vec<String>>>) {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(CA.as_bytes()).unwrap())
        .unwrap();
    let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots))
        .build()
        .unwrap();
    let config = rustls::ServerConfig::builder()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![CertificateDer::from_pem_slice(RECEIVER_CERT.as_bytes()).unwrap()],
            PrivateKeyDer::from_pem_slice(RECEIVER_KEY.as_bytes()).unwrap(),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let clients = Arc::new(Mutex::new(Vec::new()));
    let served = clients.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (acceptor, served) = (acceptor.clone(), served.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(stream).await else {
                    return;
                };
                let peer = tls.get_ref().1.peer_certificates().map(|c| c[0].to_vec());
                let mut read = Vec::new();
                let mut buf = vec![0u8; 16 * 1024];
                while !read.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => read.extend_from_slice(&buf[..n]),
                    }
                }
                // The client's certificate, by a piece of its subject that differs.
                let name = peer
                    .map(|der| {
                        if der.windows(6).any(|w| w == b"client") {
                            "client".to_owned()
                        } else {
                            "other".to_owned()
                        }
                    })
                    .unwrap_or_default();
                served.lock().unwrap().push(name);
                let _ = tls
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    .await;
                let _ = tls.shutdown().await;
            });
        }
    });
    (port, clients)
}

async fn attempt(
    http: &Client,
    policy: &AddressPolicy,
    port: u16,
    tls: Option<&TlsMaterial>,
) -> AttemptResult {
    let keys = test_keys();
    let url = format!("https://127.0.0.1:{port}/hook");
    send(
        http,
        policy,
        Attempt {
            tls,
            ..attempt_to(&url, &keys)
        },
    )
    .await
}

#[tokio::test]
async fn an_endpoint_presents_its_client_certificate_and_trusts_its_ca() {
    crate::install_crypto_provider();
    let (port, clients) = mtls_receiver().await;
    let policy = Arc::new(AddressPolicy {
        allow: vec!["127.0.0.1/32".parse().unwrap()],
        allow_http: false,
    });
    let http = client(policy.clone());
    let material = |cert: Option<&str>, key: Option<&str>| TlsMaterial {
        client_cert: cert.map(str::to_owned),
        client_key: key.map(str::to_owned),
        ca: Some(CA.to_owned()),
    };

    let mine = material(Some(CLIENT_CERT), Some(CLIENT_KEY));
    let ok = attempt(&http, &policy, port, Some(&mine)).await;
    assert_eq!(ok.outcome, Outcome::Success, "{}", ok.snippet);
    // The client is kept: a second attempt reuses it.
    let again = attempt(&http, &policy, port, Some(&mine)).await;
    assert_eq!(again.outcome, Outcome::Success, "{}", again.snippet);
    assert_eq!(*clients.lock().unwrap(), ["client", "client"]);

    // Without a client certificate, or with one of another CA, the receiver refuses
    // the handshake; nothing is served.
    for (what, tls) in [
        ("no client certificate", material(None, None)),
        (
            "another CA's certificate",
            material(Some(STRANGER_CERT), Some(STRANGER_KEY)),
        ),
    ] {
        let refused = attempt(&http, &policy, port, Some(&tls)).await;
        assert_ne!(
            refused.outcome,
            Outcome::Success,
            "{what}: {}",
            refused.snippet
        );
    }
    // Without the endpoint's CA the receiver's certificate is not trusted.
    let untrusted = attempt(&http, &policy, port, None).await;
    assert_ne!(untrusted.outcome, Outcome::Success);
    assert!(
        untrusted.snippet.to_lowercase().contains("certificate"),
        "{}",
        untrusted.snippet
    );
    assert_eq!(
        clients.lock().unwrap().len(),
        2,
        "served without a valid client"
    );
    // The snippet of a failure never shows the key.
    let bad_key = TlsMaterial {
        client_key: Some(
            "-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n".into(),
        ),
        ..mine.clone()
    };
    let failed = attempt(&http, &policy, port, Some(&bad_key)).await;
    assert_eq!(failed.outcome, Outcome::RequestError);
    assert!(failed.snippet.starts_with("tls: "), "{}", failed.snippet);
    assert!(!failed.snippet.contains("not a key"), "{}", failed.snippet);
}
