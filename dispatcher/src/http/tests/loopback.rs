//! A CONNECT proxy and a keep-alive receiver on loopback for the proxied tests.

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A CONNECT-only proxy on 127.0.0.1: records each CONNECT target and
/// `Proxy-Authorization`, answers `answer` instead of tunnelling when set.
/// Each CONNECT's target and `Proxy-Authorization`.
type Connects = Arc<Mutex<Vec<(String, Option<String>)>>>;

pub(super) struct TestProxy {
    pub(super) port: u16,
    pub(super) connects: Connects,
}

impl TestProxy {
    pub(super) async fn start(answer: Option<&'static str>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let connects = Arc::new(Mutex::new(Vec::new()));
        let seen = connects.clone();
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let head = read_head(&mut client).await;
                    let mut lines = head.lines();
                    let target = lines
                        .next()
                        .and_then(|l| l.strip_prefix("CONNECT "))
                        .and_then(|l| l.split(' ').next())
                        .unwrap_or_default()
                        .to_owned();
                    let auth = lines
                        .filter_map(|l| l.split_once(": "))
                        .find(|(n, _)| n.eq_ignore_ascii_case("proxy-authorization"))
                        .map(|(_, v)| v.to_owned());
                    seen.lock().unwrap().push((target.clone(), auth));
                    if let Some(answer) = answer {
                        let _ = client.write_all(answer.as_bytes()).await;
                        return;
                    }
                    let Ok(mut upstream) = TcpStream::connect(&target).await else {
                        let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").await;
                        return;
                    };
                    let _ = client
                        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                        .await;
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                });
            }
        });
        Self { port, connects }
    }

    pub(super) fn targets(&self) -> Vec<String> {
        self.connects
            .lock()
            .unwrap()
            .iter()
            .map(|(t, _)| t.clone())
            .collect()
    }

    pub(super) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

async fn read_head(stream: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte).await {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// A plain HTTP receiver that keeps connections open and answers 200 to each request,
/// recording each request head.
pub(super) async fn keep_alive_receiver() -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve(stream, seen.clone()));
        }
    });
    (port, heads)
}

/// Answers every request on `stream` (head, then a body of its content-length) with 200.
pub(super) async fn serve<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut stream: S,
    seen: Arc<Mutex<Vec<String>>>,
) {
    loop {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            match stream.read(&mut byte).await {
                Ok(1) => head.push(byte[0]),
                _ => return,
            }
        }
        let head = String::from_utf8_lossy(&head).into_owned();
        let length: usize = head
            .lines()
            .filter_map(|l| l.split_once(": "))
            .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.trim().parse().ok())
            .unwrap_or(0);
        let mut body = vec![0u8; length];
        if stream.read_exact(&mut body).await.is_err() {
            return;
        }
        seen.lock().unwrap().push(head);
        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
        if stream.write_all(ok).await.is_err() || stream.flush().await.is_err() {
            return;
        }
    }
}
