//! Accepted connections that acknowledge what they read at once.
//!
//! A client whose socket keeps Nagle's algorithm on and writes a request's
//! headers and body apart (Spin's outbound HTTP does; so do many HTTP
//! clients) cannot send the body until the headers are acknowledged, and
//! Linux delays that acknowledgement up to 40 ms on a connection past its
//! first few segments. `TCP_NODELAY` on our side does not help: it is the
//! client's socket that waits. Linux's `TCP_QUICKACK` turns the delay off,
//! but only until the kernel next decides otherwise, so it is set again
//! after every read (one `setsockopt`, about a microsecond).
//!
//! Measured with `edgeroute bench --spin-gateway`: without it, 41–48 % of
//! the requests the Spin gateway forwarded to the node took 40 ms more.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

pub struct QuickAck(pub TcpStream);

impl QuickAck {
    fn rearm(&self) {
        #[cfg(target_os = "linux")]
        {
            // Best effort: a socket that refuses only keeps delayed ACKs.
            let _ = socket2::SockRef::from(&self.0).set_tcp_quickack(true);
        }
    }
}

impl AsyncRead for QuickAck {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.0).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.rearm();
        }
        polled
    }
}

impl AsyncWrite for QuickAck {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, data)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// The wrapper passes bytes through both ways unchanged.
    #[tokio::test]
    async fn reads_and_writes_pass_through() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = tokio::spawn(async move {
            let mut c = TcpStream::connect(addr).await.unwrap();
            c.write_all(b"ping").await.unwrap();
            let mut back = [0u8; 4];
            c.read_exact(&mut back).await.unwrap();
            back
        });
        let (tcp, _) = listener.accept().await.unwrap();
        let mut server = QuickAck(tcp);
        let mut got = [0u8; 4];
        server.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");
        server.write_all(b"pong").await.unwrap();
        assert_eq!(&client.await.unwrap(), b"pong");
    }
}
