//! The direct path's connections: the target's host is resolved and vetted on every new
//! connection ([`vetted`], the same check the proxied path makes before asking for a
//! tunnel), and only an address the platform's policy allows is connected to, so a
//! name rebound to an internal address between two connections cannot reach it. TLS and
//! HTTP run over it (`hyper-rustls` wraps this connector; one pooled hyper client reuses
//! the connections, see `super::Client`).

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use herald_core::ssrf::AddressPolicy;
use hyper::Uri;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::resolve::{Lookup, destination};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Connects to the first vetted address of the URL's host that answers.
#[derive(Clone)]
pub(crate) struct DirectConnector {
    pub(crate) policy: Arc<AddressPolicy>,
    pub(crate) lookup: Lookup,
    /// For each address tried.
    pub(crate) connect_timeout: Duration,
}

/// No vetted address took the connection.
#[derive(Debug, thiserror::Error)]
#[error("connecting to {addr}")]
pub(crate) struct ConnectFailed {
    addr: SocketAddr,
    #[source]
    source: std::io::Error,
}

impl tower_service::Service<Uri> for DirectConnector {
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

impl DirectConnector {
    async fn connect(&self, dst: Uri) -> Result<TcpStream, BoxError> {
        let (addrs, port) = destination(&self.policy, &self.lookup, &dst).await?;
        let mut failed = None;
        for ip in addrs {
            let addr = SocketAddr::new(ip, port);
            let attempt = tokio::time::timeout(self.connect_timeout, TcpStream::connect(addr));
            let error = match attempt.await {
                Ok(Ok(stream)) => {
                    stream.set_nodelay(true)?;
                    return Ok(stream);
                }
                Ok(Err(error)) => error,
                Err(_) => std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no connection within {}s", self.connect_timeout.as_secs()),
                ),
            };
            failed = Some(ConnectFailed {
                addr,
                source: error,
            });
        }
        Err(failed.map_or_else(|| "no address to connect to".into(), Into::into))
    }
}
