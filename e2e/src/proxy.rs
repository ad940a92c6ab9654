//! A forward HTTP proxy on 127.0.0.1 for egress tests: `CONNECT` tunnels and
//! absolute-form requests (`POST http://host/path`), optional Basic authentication, and
//! a record of what it was asked. One request per absolute-form connection is enough
//! for tests (the connection is closed after the answer).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use base64::Engine;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the proxy was asked so far.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// `CONNECT` targets (`host:port`) of tunnels it opened.
    pub connects: Vec<String>,
    /// Absolute-form request targets it forwarded.
    pub forwarded: Vec<String>,
    /// Requests refused with 407 (no or wrong credentials).
    pub refused_auth: usize,
}

/// A running proxy; it stops with the test's runtime.
#[derive(Clone)]
pub struct ForwardProxy {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Seen>>,
}

impl ForwardProxy {
    /// Starts a proxy on a free port of 127.0.0.1; with `credentials` (`user:password`)
    /// it wants them as Basic `Proxy-Authorization`.
    pub async fn start(credentials: Option<&str>) -> Self {
        Self::start_on("127.0.0.1:0", credentials).await
    }

    /// Starts a proxy on `addr`, e.g. the port a dispatcher was told about while
    /// nothing listened there.
    pub async fn start_on(addr: &str, credentials: Option<&str>) -> Self {
        let listener = TcpListener::bind(addr).await.expect("binding the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let expected = credentials.map(|c| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(c)
            )
        });
        let seen = Arc::new(Mutex::new(Seen::default()));
        let record = seen.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(handle(client, expected.clone(), record.clone()));
            }
        });
        Self { addr, seen }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn seen(&self) -> Seen {
        self.seen.lock().unwrap().clone()
    }
}

async fn handle(mut client: TcpStream, expected: Option<String>, seen: Arc<Mutex<Seen>>) {
    let Some(head) = read_head(&mut client).await else {
        return;
    };
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default().to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let authorization = headers
        .iter()
        .find(|(n, _)| n == "proxy-authorization")
        .map(|(_, v)| v.as_str());
    if expected.is_some() && authorization != expected.as_deref() {
        seen.lock().unwrap().refused_auth += 1;
        let _ = client
            .write_all(b"HTTP/1.1 407 Proxy Authentication Required\r\nproxy-authenticate: Basic realm=\"test\"\r\ncontent-length: 0\r\n\r\n")
            .await;
        return;
    }
    let mut parts = request_line.split(' ');
    let (method, target) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    if method == "CONNECT" {
        let Ok(mut upstream) = TcpStream::connect(target).await else {
            let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").await;
            return;
        };
        seen.lock().unwrap().connects.push(target.to_owned());
        let _ = client
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await;
        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
        return;
    }
    // Absolute form: `METHOD http://host:port/path HTTP/1.1`, resolved here, by the proxy.
    let Some((authority, path)) = target.strip_prefix("http://").map(|rest| {
        rest.split_once('/')
            .map_or((rest, "/".to_owned()), |(a, p)| (a, format!("/{p}")))
    }) else {
        let _ = client.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
        return;
    };
    let Ok(mut upstream) = TcpStream::connect(authority).await else {
        let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").await;
        return;
    };
    seen.lock().unwrap().forwarded.push(target.to_owned());
    let version = parts.next().unwrap_or("HTTP/1.1");
    let mut forwarded = format!("{method} {path} {version}\r\n");
    for (name, value) in &headers {
        if !matches!(
            name.as_str(),
            "proxy-authorization" | "proxy-connection" | "connection"
        ) {
            forwarded.push_str(&format!("{name}: {value}\r\n"));
        }
    }
    forwarded.push_str("connection: close\r\n\r\n");
    if upstream.write_all(forwarded.as_bytes()).await.is_ok() {
        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
    }
}

/// The request head, up to its blank line (at most 16 KiB).
async fn read_head(stream: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 16 * 1024 || stream.read(&mut byte).await.ok()? != 1 {
            return None;
        }
        head.push(byte[0]);
    }
    head.truncate(head.len() - 4);
    String::from_utf8(head).ok()
}
