//! The proxied path's connections: the target's host is resolved and vetted by Herald
//! (the same check as the direct path), then the proxy is asked to `CONNECT` to one of
//! the vetted *addresses*, never to the name, so the proxy has nothing to resolve and a
//! name rebound between Herald's check and the proxy's connection cannot reach an
//! internal address. TLS (SNI and certificate check against the URL's host name) and
//! HTTP then run inside the tunnel (`hyper-rustls` over this connector). Every failure
//! of the proxy itself is a [`ProxyError`] that names the proxy, so an attempt record
//! says whose fault it was.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use herald_core::ssrf::AddressPolicy;
use hyper::Uri;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::resolve::{Lookup, destination};
use crate::metrics::ProxyErrorLabel;
use herald_core::egress::ProxyDef;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

/// The longest answer head to a CONNECT Herald reads.
const MAX_PROXY_HEAD: usize = 8 * 1024;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The proxy failed, not the target (except [`ProxyError::Refused`] with a 502/504,
/// where the proxy could not reach the vetted address).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProxyError {
    #[error("egress proxy {proxy} is unreachable")]
    Unreachable {
        proxy: String,
        #[source]
        source: std::io::Error,
    },
    #[error("egress proxy {proxy} did not open a tunnel within {}s", .timeout.as_secs())]
    Slow { proxy: String, timeout: Duration },
    #[error("egress proxy {proxy} refused Herald's credentials: {status}")]
    Auth { proxy: String, status: String },
    #[error("egress proxy {proxy} did not open a tunnel to {target}: {status}")]
    Refused {
        proxy: String,
        target: SocketAddr,
        status: String,
    },
    #[error("egress proxy {proxy} answered CONNECT with {what}")]
    Invalid { proxy: String, what: &'static str },
}

/// Connects through one proxy; `hyper-rustls` wraps it for TLS, a pooled hyper client
/// (one per proxy) around that reuses the tunnels.
#[derive(Clone)]
pub(crate) struct TunnelConnector {
    pub(crate) proxy: Arc<ProxyDef>,
    pub(crate) policy: Arc<AddressPolicy>,
    pub(crate) lookup: Lookup,
    /// For the TCP connection to the proxy and its answer to CONNECT together.
    pub(crate) connect_timeout: Duration,
    /// `herald_dispatcher_egress_proxy_errors_total`.
    pub(crate) errors: ProxyErrors,
}

pub(crate) type ProxyErrors = Family<ProxyErrorLabel, Counter>;

impl ProxyError {
    /// The metric's `reason`.
    fn reason(&self) -> &'static str {
        match self {
            Self::Unreachable { .. } => "unreachable",
            Self::Slow { .. } => "timeout",
            Self::Auth { .. } => "auth",
            Self::Refused { .. } => "refused",
            Self::Invalid { .. } => "invalid",
        }
    }
}

impl tower_service::Service<Uri> for TunnelConnector {
    type Response = TokioIo<TcpStream>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { this.connect(dst).await.map(TokioIo::new) })
    }
}

impl TunnelConnector {
    /// A tunnel to the first vetted address of `dst`'s host the proxy connects to.
    async fn connect(&self, dst: Uri) -> Result<TcpStream, BoxError> {
        let (addrs, port) = destination(&self.policy, &self.lookup, &dst).await?;
        let mut refused = None;
        for ip in addrs {
            let tunnel = self.tunnel(SocketAddr::new(ip, port)).await;
            if let Err(e) = &tunnel {
                let label = ProxyErrorLabel {
                    proxy: self.proxy.name.clone(),
                    reason: e.reason(),
                };
                self.errors.get_or_create(&label).inc();
            }
            match tunnel {
                Ok(stream) => return Ok(stream),
                // The proxy could not reach this address: the next one may do.
                Err(e @ ProxyError::Refused { .. }) => refused = Some(e),
                Err(e) => return Err(e.into()),
            }
        }
        Err(refused.map_or_else(|| "no address to connect to".into(), Into::into))
    }

    /// Asks the proxy for a tunnel to `target`, an address the policy allowed.
    async fn tunnel(&self, target: SocketAddr) -> Result<TcpStream, ProxyError> {
        let proxy = self.proxy.to_string();
        let slow = || ProxyError::Slow {
            proxy: proxy.clone(),
            timeout: self.connect_timeout,
        };
        let unreachable = |source| ProxyError::Unreachable {
            proxy: proxy.clone(),
            source,
        };
        let opened = async {
            let mut stream =
                TcpStream::connect((self.proxy.host.as_str(), self.proxy.port)).await?;
            stream.set_nodelay(true)?;
            let mut request = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
            if let Some(authorization) = self.proxy.authorization() {
                request.push_str("Proxy-Authorization: ");
                request.push_str(authorization);
                request.push_str("\r\n");
            }
            request.push_str("\r\n");
            stream.write_all(request.as_bytes()).await?;
            let head = read_head(&mut stream).await?;
            Ok::<_, std::io::Error>((stream, head))
        };
        let (stream, head) = tokio::time::timeout(self.connect_timeout, opened)
            .await
            .map_err(|_| slow())?
            .map_err(unreachable)?;
        let invalid = |what| ProxyError::Invalid {
            proxy: proxy.clone(),
            what,
        };
        let head = head.ok_or_else(|| invalid("an answer head over 8 KiB or cut short"))?;
        if head.leftover {
            return Err(invalid("data before the tunnel was used"));
        }
        let status_line = head.status_line;
        let code =
            parse_status(&status_line).ok_or_else(|| invalid("something that is not HTTP"))?;
        match code {
            200..=299 => Ok(stream),
            407 => Err(ProxyError::Auth {
                proxy,
                status: status_line,
            }),
            _ => Err(ProxyError::Refused {
                proxy,
                target,
                status: status_line,
            }),
        }
    }
}

/// The proxy's answer head to CONNECT.
struct Head {
    /// The first line, printable ASCII only, at most 128 bytes.
    status_line: String,
    /// Bytes came after the head (nothing may: Herald speaks first in the tunnel).
    leftover: bool,
}

/// Reads the answer head; `None` when it is too long or the connection ended first.
async fn read_head(stream: &mut TcpStream) -> std::io::Result<Option<Head>> {
    let mut head = Vec::with_capacity(256);
    let mut buf = [0u8; 1024];
    loop {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Ok(None);
        }
        head.extend_from_slice(&buf[..n]);
        if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
            let status_line: String = String::from_utf8_lossy(line)
                .chars()
                .filter(|c| c.is_ascii() && !c.is_ascii_control())
                .take(128)
                .collect();
            return Ok(Some(Head {
                status_line,
                leftover: head.len() > end + 4,
            }));
        }
        if head.len() > MAX_PROXY_HEAD {
            return Ok(None);
        }
    }
}

/// The status code of `HTTP/1.x NNN reason`.
fn parse_status(line: &str) -> Option<u16> {
    let mut parts = line.split(' ');
    let version = parts.next()?;
    let code = parts.next()?;
    (version.starts_with("HTTP/1.") && code.len() == 3)
        .then(|| code.parse().ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines_are_parsed_strictly() {
        assert_eq!(
            parse_status("HTTP/1.1 200 Connection established"),
            Some(200)
        );
        assert_eq!(
            parse_status("HTTP/1.0 407 Proxy Authentication Required"),
            Some(407)
        );
        assert_eq!(parse_status("HTTP/1.1 502"), Some(502));
        for bad in [
            "SSH-2.0-OpenSSH",
            "HTTP/2 200",
            "HTTP/1.1 2000 x",
            "",
            "HTTP/1.1",
        ] {
            assert_eq!(parse_status(bad), None, "{bad}");
        }
    }
}
