//! The node's HTTP server loop. axum's own `serve` sets no limits, so a
//! node on an open port could be stopped from outside: a client that
//! never finishes its headers holds a connection forever, enough of them
//! exhaust the process's descriptors, and a graceful shutdown waits on a
//! half-sent request indefinitely. Here, on hyper's HTTP/1 connections:
//!
//! - a header-read timeout (`[limits] header_read_timeout_ms`): a
//!   connection whose request head is not complete in time is closed;
//! - a connection cap (`[limits] max_connections`): at the cap, a new
//!   connection takes the place of the one idle longest (no request in
//!   flight: a client that sends nothing, one still inside its request
//!   head, a keep-alive connection between requests), so clients that
//!   hold sockets open cannot keep others out; when every connection is
//!   busy, new ones wait in the kernel's backlog;
//! - a shutdown deadline (`[limits] shutdown_grace_ms`): on SIGTERM or
//!   Ctrl-C the node stops accepting, lets requests in flight finish for
//!   that long, then exits anyway.
//!
//! Accepted sockets get `TCP_NODELAY`: the first SSE chunk must not wait
//! for a delayed ACK.

pub mod idle_poll;
mod threads;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::sync::Semaphore;
use tower::ServiceExt;

#[derive(Debug, Clone, Copy)]
pub struct ServeLimits {
    pub max_connections: usize,
    pub header_read_timeout: Duration,
    pub shutdown_grace: Duration,
    /// How long a connection thread polls before it sleeps.
    pub idle_poll: Duration,
}

impl From<&crate::config::Limits> for ServeLimits {
    fn from(limits: &crate::config::Limits) -> Self {
        Self {
            max_connections: limits.max_connections,
            header_read_timeout: Duration::from_millis(limits.header_read_timeout_ms),
            shutdown_grace: Duration::from_millis(limits.shutdown_grace_ms),
            idle_poll: Duration::from_micros(limits.idle_poll_us),
        }
    }
}

/// Connections the kernel completes before the node accepts them. Tokio's
/// `bind` asks for 1024; a burst of clients beyond the accept queue has
/// its SYNs dropped, and a dropped client retries only after a second, so
/// the node asks for more (Linux caps it at `net.core.somaxconn`, 4096 by
/// default).
const BACKLOG: u32 = 4096;

/// A listener on `addr` (`host:port`) with the node's backlog.
pub async fn listen(addr: &str) -> anyhow::Result<TcpListener> {
    let mut last = None;
    for addr in tokio::net::lookup_host(addr).await? {
        let socket = if addr.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        // As tokio's `bind` does: a restarted node can listen at once.
        socket.set_reuseaddr(true)?;
        match socket.bind(addr).and_then(|()| socket.listen(BACKLOG)) {
            Ok(listener) => return Ok(listener),
            Err(error) => last = Some(error),
        }
    }
    Err(last.map_or_else(
        || anyhow::anyhow!("{addr} resolves to no address"),
        anyhow::Error::from,
    ))
}

/// Serve `app` on `listener` until `shutdown` resolves, then drain.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ServeLimits,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let open = Arc::new(Open::default());
    let graceful = GracefulShutdown::new();
    let threads = threads::ConnectionThreads::per_core(limits.idle_poll)?;
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
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
        let permit = match permits.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                // At the cap, with someone waiting: make room by closing
                // the connection idle longest; if every one is busy, wait
                // for one to finish (the backlog holds the rest).
                open.close_idlest();
                tokio::select! {
                    permit = permits.clone().acquire_owned() => permit?,
                    () = &mut shutdown => break,
                }
            }
        };
        let (id, conn) = open.add();
        let service = counting(app.clone(), open.clone(), conn.clone());
        let watcher = graceful.watcher();
        let open = open.clone();
        // The socket is registered again with the serving thread's reactor,
        // so its wake-ups go to that thread.
        let tcp = match tcp.into_std() {
            Ok(tcp) => tcp,
            Err(error) => {
                tracing::debug!(%error, "could not hand the connection over");
                open.remove(id);
                continue;
            }
        };
        threads.run(move |on_thread| {
            let tcp = match tokio::net::TcpStream::from_std(tcp) {
                Ok(tcp) => tcp,
                Err(error) => {
                    tracing::debug!(%error, "could not take the connection over");
                    open.remove(id);
                    return;
                }
            };
            if let Err(error) = tcp.set_nodelay(true) {
                tracing::debug!(%error, "could not set TCP_NODELAY");
            }
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .serve_connection(
                    TokioIo::new(crate::quickack::QuickAck(tcp)),
                    hyper::service::service_fn(service),
                );
            let connection = watcher.watch(connection);
            tokio::spawn(async move {
                tokio::select! {
                    ended = connection => if let Err(error) = ended {
                        tracing::debug!(%error, "connection ended with an error");
                    },
                    // Dropping the connection closes its socket.
                    () = conn.close.notified() => {}
                }
                open.remove(id);
                drop(permit);
                drop(on_thread);
            });
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

/// The connections open, so that at the cap the one idle longest can be
/// closed for a new one.
struct Open {
    connections: Mutex<HashMap<u64, Arc<Connection>>>,
    next_id: AtomicU64,
    /// The origin of `Connection::idle_since`.
    epoch: Instant,
    /// Connections closed to make room, for the log.
    closed: AtomicU64,
}

impl Default for Open {
    fn default() -> Self {
        Self {
            connections: Mutex::default(),
            next_id: AtomicU64::new(0),
            epoch: Instant::now(),
            closed: AtomicU64::new(0),
        }
    }
}

struct Connection {
    /// Requests in flight; a response body still being sent counts.
    busy: AtomicUsize,
    /// When it was opened or last finished a request, in µs from `epoch`.
    idle_since: AtomicU64,
    close: Notify,
}

impl Open {
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    fn add(&self) -> (u64, Arc<Connection>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let connection = Arc::new(Connection {
            busy: AtomicUsize::new(0),
            idle_since: AtomicU64::new(self.now()),
            close: Notify::new(),
        });
        self.lock().insert(id, connection.clone());
        (id, connection)
    }

    fn remove(&self, id: u64) {
        self.lock().remove(&id);
    }

    /// Close the connection with no request in flight that has been idle
    /// longest, if there is one. (A request that arrives on it in the
    /// same instant is cut with it: the client sees its keep-alive
    /// connection closed, as after any server's idle timeout.)
    fn close_idlest(&self) {
        let idlest = {
            let mut connections = self.lock();
            let id = connections
                .iter()
                .filter(|(_, c)| c.busy.load(Ordering::Acquire) == 0)
                .min_by_key(|(_, c)| c.idle_since.load(Ordering::Relaxed))
                .map(|(id, _)| *id);
            id.and_then(|id| connections.remove(&id))
        };
        let Some(connection) = idlest else { return };
        // A permit is stored if the task is not waiting yet.
        connection.close.notify_one();
        let closed = self.closed.fetch_add(1, Ordering::Relaxed) + 1;
        if closed == 1 || closed.is_multiple_of(1000) {
            tracing::warn!(
                closed,
                "at the connection cap ([limits] max_connections): closed the connection idle longest to accept a new one"
            );
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Connection>>> {
        self.connections.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Marks its connection busy from a request's start until its response
/// body is dropped (sent or abandoned).
struct Busy {
    open: Arc<Open>,
    connection: Arc<Connection>,
}

impl Busy {
    fn start(open: Arc<Open>, connection: Arc<Connection>) -> Self {
        connection.busy.fetch_add(1, Ordering::AcqRel);
        idle_poll::activity();
        Self { open, connection }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.connection
            .idle_since
            .store(self.open.now(), Ordering::Relaxed);
        self.connection.busy.fetch_sub(1, Ordering::AcqRel);
        // The client's next request, or the next hand-off, often follows
        // within microseconds.
        idle_poll::activity();
    }
}

/// A response from the router, as hyper's service wants it.
type Answer = std::pin::Pin<
    Box<dyn Future<Output = Result<http::Response<axum::body::Body>, Infallible>> + Send>,
>;

/// `app` as a connection's hyper service that keeps `connection`'s busy
/// count: the response body carries the mark, so a stream being sent is
/// not idle.
fn counting(
    app: Router,
    open: Arc<Open>,
    connection: Arc<Connection>,
) -> impl Fn(http::Request<hyper::body::Incoming>) -> Answer + Clone {
    move |request| {
        let busy = Busy::start(open.clone(), connection.clone());
        let app = app.clone();
        Box::pin(async move {
            let response = app.oneshot(request).await?;
            Ok(response.map(|body| {
                use http_body_util::BodyExt;
                // The closure owns the mark; dropping the body drops both.
                axum::body::Body::new(body.map_frame(move |frame| {
                    let _ = &busy;
                    frame
                }))
            }))
        })
    }
}
