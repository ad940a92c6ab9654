//! Connections a handler can reset: the listener hands every connection a flag, and a
//! handler that sets it ([`Conn`]) makes the connection fail and close with a TCP RST.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// A listener whose connections can be reset from a handler ([`Conn`]).
pub(super) struct ResettableListener(pub(super) TcpListener);

impl Listener for ResettableListener {
    type Io = ResettableIo;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.0.accept().await {
                Ok((stream, addr)) => {
                    let _ = stream.set_nodelay(true);
                    return (
                        ResettableIo {
                            stream,
                            reset: Arc::new(AtomicBool::new(false)),
                        },
                        addr,
                    );
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.0.local_addr()
    }
}

/// A TCP connection that fails every operation once its `reset` flag is set and then
/// closes with a TCP RST.
pub(super) struct ResettableIo {
    stream: TcpStream,
    reset: Arc<AtomicBool>,
}

impl ResettableIo {
    fn check(&self) -> std::io::Result<()> {
        if self.reset.load(Ordering::SeqCst) {
            Err(std::io::ErrorKind::ConnectionReset.into())
        } else {
            Ok(())
        }
    }
}

impl Drop for ResettableIo {
    fn drop(&mut self) {
        if self.reset.load(Ordering::SeqCst) {
            let _ = self.stream.set_zero_linger();
        }
    }
}

impl AsyncRead for ResettableIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        this.check()?;
        Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for ResettableIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        this.check()?;
        Pin::new(&mut this.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        this.check()?;
        Pin::new(&mut this.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        this.check()?;
        Pin::new(&mut this.stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        this.check()?;
        Pin::new(&mut this.stream).poll_shutdown(cx)
    }
}

/// A handler's handle on its connection: setting the flag resets it.
#[derive(Clone)]
pub(super) struct Conn(pub(super) Arc<AtomicBool>);

impl Connected<IncomingStream<'_, ResettableListener>> for Conn {
    fn connect_info(stream: IncomingStream<'_, ResettableListener>) -> Self {
        Conn(stream.io().reset.clone())
    }
}
