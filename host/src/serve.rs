//! The node's HTTP server loop. axum's own `serve` sets no limits, so a
//! node on an open port could be stopped from outside: a client that
//! never finishes its headers holds a connection forever, enough of them
//! exhaust the process's descriptors, and a graceful shutdown waits on a
//! half-sent request indefinitely. Here, on hyper's HTTP/1 connections:
//!
//! - a header-read timeout (`[limits] header_read_timeout_ms`): a
//!   connection whose request head is not complete in time is closed;
//! - a connection cap (`[limits] max_connections`): beyond it, new
//!   connections wait in the kernel's backlog instead of taking
//!   descriptors, and the ones already open keep being served;
//! - a shutdown deadline (`[limits] shutdown_grace_ms`): on SIGTERM or
//!   Ctrl-C the node stops accepting, lets requests in flight finish for
//!   that long, then exits anyway.
//!
//! Accepted sockets get `TCP_NODELAY`: the first SSE chunk must not wait
//! for a delayed ACK.

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

#[derive(Debug, Clone, Copy)]
pub struct ServeLimits {
    pub max_connections: usize,
    pub header_read_timeout: Duration,
    pub shutdown_grace: Duration,
}

/// Serve `app` on `listener` until `shutdown` resolves, then drain.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ServeLimits,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => permit?,
            () = &mut shutdown => break,
        };
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(error) => {
                    // Out of descriptors, or a connection reset while
                    // queued: wait a moment rather than spin.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        if let Err(error) = tcp.set_nodelay(true) {
            tracing::debug!(%error, "could not set TCP_NODELAY");
        }
        let connection = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout)
            .serve_connection(
                TokioIo::new(crate::quickack::QuickAck(tcp)),
                TowerToHyperService::new(app.clone()),
            );
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    eprintln!(
        "edgeroute: shutting down; finishing requests in flight (up to {} ms)",
        limits.shutdown_grace.as_millis()
    );
    if tokio::time::timeout(limits.shutdown_grace, graceful.shutdown())
        .await
        .is_err()
    {
        eprintln!("edgeroute: shutdown deadline passed; closing the connections still open");
    }
    Ok(())
}
