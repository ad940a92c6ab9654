//! Tests of whole attempts against receivers (and proxies) on loopback.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use herald_core::signing::SigningKey;
use herald_core::ssrf::AddressPolicy;
use herald_core::v1alpha1::Header;

use super::redact::{MAX_BODY_READ, NOT_KEPT};
use super::resolve::{Lookup, allowed_addresses};
use super::*;

mod direct;
mod loopback;
mod mtls;
mod proxied;

/// A client with no proxies and the system resolver.
fn client(policy: Arc<AddressPolicy>) -> Client {
    client_with_lookup(policy, system_lookup())
}

/// A client with no proxies and a given resolver.
fn client_with_lookup(policy: Arc<AddressPolicy>, lookup: Lookup) -> Client {
    let errors = Default::default();
    Client::build(
        policy,
        Egress::default(),
        lookup,
        None,
        errors,
        DEFAULT_IDLE_PER_HOST,
    )
    .expect("a client")
}

/// A receiver on `ip:port` that answers `200` and closes each connection (so every
/// attempt resolves again); counts the connections it accepted.
async fn counting_receiver(ip: &str, port: u16) -> (u16, Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind((ip, port))
        .await
        .expect("bind");
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16 * 1024];
                let mut read = Vec::new();
                // The request is small: its head and 2-byte body come in a read or two.
                while !read.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => read.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    .await;
            });
        }
    });
    (port, accepted)
}

/// Two receivers on one port: 127.0.0.1 (`ok`) and 127.0.0.2 (`internal`).
async fn two_receivers() -> (
    u16,
    Arc<std::sync::atomic::AtomicUsize>,
    Arc<std::sync::atomic::AtomicUsize>,
) {
    // A port free on 127.0.0.1 is almost always free on 127.0.0.2; try a few.
    for _ in 0..10 {
        let (port, ok) = counting_receiver("127.0.0.1", 0).await;
        if tokio::net::TcpListener::bind(("127.0.0.2", port))
            .await
            .is_ok()
        {
            let (_, internal) = counting_receiver("127.0.0.2", port).await;
            return (port, ok, internal);
        }
    }
    panic!("no port free on both 127.0.0.1 and 127.0.0.2");
}

/// A resolver whose answers are scripted call by call (the last one repeats).
fn scripted(answers: Vec<Vec<&str>>) -> (Lookup, Arc<std::sync::atomic::AtomicUsize>) {
    let answers: Vec<Vec<SocketAddr>> = answers
        .into_iter()
        .map(|ips| {
            ips.iter()
                .map(|ip| SocketAddr::new(ip.parse().unwrap(), 0))
                .collect()
        })
        .collect();
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = calls.clone();
    let lookup: Lookup = Arc::new(move |host: String| {
        assert_eq!(host, "hooks.test");
        let n = count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let answer = answers[n.min(answers.len() - 1)].clone();
        Box::pin(async move { Ok(answer) })
    });
    (lookup, calls)
}

/// `127.0.0.1/32` stands for the public internet here (it is the allowlisted network
/// of these tests); 127.0.0.2 for an internal address the policy refuses.
fn policy(allow: &[&str]) -> Arc<AddressPolicy> {
    Arc::new(AddressPolicy {
        allow: allow.iter().map(|net| net.parse().unwrap()).collect(),
        allow_http: true,
    })
}

/// The specification's test key.
fn test_keys() -> [SigningKey; 1] {
    [SigningKey::from_whsec("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap()]
}

/// An attempt of `{}` to `url`, signed with `keys`: no headers, 5 s, direct, no TLS of
/// its own.
fn attempt_to<'a>(url: &'a str, keys: &'a [SigningKey]) -> Attempt<'a> {
    Attempt {
        url,
        event_id: "msg_1",
        body: Bytes::from_static(b"{}"),
        keys,
        headers: &[],
        timeout: Duration::from_secs(5),
        redact_fields: &[],
        proxy: None,
        tls: None,
    }
}

async fn post(http: &Client, policy: &AddressPolicy, port: u16) -> AttemptResult {
    let keys = test_keys();
    let url = format!("http://hooks.test:{port}/");
    send(http, policy, attempt_to(&url, &keys)).await
}

fn count(n: &std::sync::atomic::AtomicUsize) -> usize {
    n.load(std::sync::atomic::Ordering::SeqCst)
}
