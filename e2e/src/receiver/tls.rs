//! A mutual-TLS front for a test receiver: completes TLS only with a client certificate
//! of a given CA, then passes the connection's bytes to the receiver (which sees plain
//! HTTP). The certificates are `e2e/tls` (its `make.sh` makes them).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};

/// A file of `e2e/tls`.
pub fn fixture(name: &str) -> PathBuf {
    crate::repo_root().join("e2e/tls").join(name)
}

/// Listens on a free port of 127.0.0.1 with the certificate `receiver.pem` (valid for
/// 127.0.0.1), demands a client certificate signed by `ca.pem`, and forwards each
/// accepted connection to `target`. Returns the port.
pub async fn mtls_front(target: SocketAddr) -> u16 {
    herald_dispatcher::install_crypto_provider();
    let read = |name: &str| std::fs::read(fixture(name)).expect("a TLS fixture");
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(&read("ca.pem")).expect("a CA certificate"))
        .expect("a usable CA");
    let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots))
        .build()
        .expect("a client verifier");
    let config = rustls::ServerConfig::builder()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![CertificateDer::from_pem_slice(&read("receiver.pem")).expect("a certificate")],
            PrivateKeyDer::from_pem_slice(&read("receiver.key")).expect("a key"),
        )
        .expect("a server configuration");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("an address").port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(stream).await else {
                    return;
                };
                let Ok(mut plain) = TcpStream::connect(target).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    port
}
