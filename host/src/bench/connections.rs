//! Whether slow and idle clients can keep everyone else out: `/healthz`
//! timed from a fresh connection, first with nothing else open (the
//! baseline), then while `connections` clients hold sockets open, half of
//! them stuck inside their request head and half silent. The node runs in
//! this process with its configured `[limits]`, behind the real server
//! loop (`crate::serve`); the clients run on a runtime of their own.

use super::Spread;
use super::batching::rss_mib;
use crate::config::Config;
use crate::node::Node;
use anyhow::{Context, bail};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The bound on `/healthz` with 10 000 such clients open.
const SLOW: Duration = Duration::from_millis(100);

/// A probe that takes longer than this counts as failed.
const PROBE_TIMEOUT: Duration = Duration::from_secs(15);

/// The clients' sockets, and what became of them.
#[derive(Default)]
struct Flood {
    /// Connected (the node may not have accepted them yet).
    connected: AtomicUsize,
    /// Could not connect at all.
    refused: AtomicUsize,
    /// Closed by the node while the client still held them.
    closed_by_node: AtomicUsize,
}

pub async fn run(mut config: Config, connections: usize) -> anyhow::Result<()> {
    if connections == 0 {
        bail!("--connections must be at least 1");
    }
    // /healthz needs no model; the backend only has to exist.
    config.local.test_backend = Some(crate::nn::Pace {
        prefill_tokens_per_s: 1e9,
        decode_tokens_per_s: 1e9,
    });
    config.local.embedding = None;
    let limits = config.limits.clone();
    let node = Node::start(config).await?;
    let listener = crate::serve::listen("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    super::proxy::serve_on(listener, &node, std::future::pending());
    // A fresh connection per probe: a pooled one would never meet the cap.
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(PROBE_TIMEOUT)
        .build()?;
    let url = format!("http://{addr}/healthz");
    println!(
        "slow and idle clients: {connections} connections, half stuck in their request head, half silent; [limits] max_connections {}, header_read_timeout_ms {}",
        limits.max_connections, limits.header_read_timeout_ms
    );
    let rss_before = rss_mib();
    let (before, failed) = probes(&client, &url, 200, Duration::from_millis(5)).await;
    if failed > 0 {
        bail!("{failed} of 200 /healthz probes failed with nothing else open");
    }
    let before = Spread::of(before);

    let flood = Arc::new(Flood::default());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let clients = {
        let flood = flood.clone();
        std::thread::spawn(move || hold_connections(addr, connections, flood, stopped))
    };
    // The probes start while the clients are still connecting: those the
    // kernel's backlog drops try again later (after 1, 3, 7 s, ...).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let connected_at_start = flood.connected.load(Ordering::Relaxed);
    let probing = Instant::now();
    let (during, failed) = probes(&client, &url, 1000, Duration::from_millis(10)).await;
    let probed_for = probing.elapsed();
    let rss_during = rss_mib();
    let closed = flood.closed_by_node.load(Ordering::Relaxed);
    let _ = stop.send(true);
    clients
        .join()
        .map_err(|_| anyhow::anyhow!("the client thread panicked"))??;
    let worst = during.iter().max().copied().unwrap_or_default();
    let slow = during.iter().filter(|t| **t > SLOW).count();
    let probed = during.len() + failed;
    if during.is_empty() {
        bail!("every /healthz probe failed with the clients open");
    }
    let during = Spread::of(during);
    println!(
        "  clients: {connected_at_start} connected when the probes began, {} when they ended {:.1} s later, {} could not connect; the node closed {closed} of them meanwhile",
        flood.connected.load(Ordering::Relaxed),
        probed_for.as_secs_f64(),
        flood.refused.load(Ordering::Relaxed),
    );
    println!(
        "  /healthz from a fresh connection: nothing else open p50 {:.0} µs, p99 {:.0} µs; with the clients open p50 {:.0} µs, p99 {:.0} µs, slowest {:.1} ms, {slow} of {probed} over {} ms, {failed} failed (over {} s); p99 ratio {:.2}",
        before.p50,
        before.p99,
        during.p50,
        during.p99,
        worst.as_secs_f64() * 1e3,
        SLOW.as_millis(),
        PROBE_TIMEOUT.as_secs(),
        during.p99 / before.p99
    );
    println!(
        "  resident memory (node and clients, one process): {rss_before:.0} MiB before, {rss_during:.0} MiB with the clients open"
    );
    Ok(())
}

/// `n` probes `every` apart, fewer if they take longer than a minute in
/// all: the successful ones' times and the failures.
async fn probes(
    client: &reqwest::Client,
    url: &str,
    n: usize,
    every: Duration,
) -> (Vec<Duration>, usize) {
    let (mut times, mut failed) = (Vec::with_capacity(n), 0);
    let began = Instant::now();
    for _ in 0..n {
        if began.elapsed() > Duration::from_secs(60) {
            break;
        }
        let start = Instant::now();
        match client.get(url).send().await {
            Ok(response) if response.status().is_success() => {
                let _ = response.bytes().await;
                times.push(start.elapsed());
            }
            _ => failed += 1,
        }
        tokio::time::sleep(every).await;
    }
    (times, failed)
}

/// Open `n` connections to `addr` (even ones send a request head that
/// never ends, odd ones nothing) and hold each until `stop`, noting those
/// the node closes first.
fn hold_connections(
    addr: std::net::SocketAddr,
    n: usize,
    flood: Arc<Flood>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("the clients' runtime")?;
    runtime.block_on(async move {
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..n {
            let (flood, mut stop) = (flood.clone(), stop.clone());
            tasks.spawn(async move {
                let Ok(mut socket) = tokio::net::TcpStream::connect(addr).await else {
                    flood.refused.fetch_add(1, Ordering::Relaxed);
                    return;
                };
                flood.connected.fetch_add(1, Ordering::Relaxed);
                if i % 2 == 0 {
                    let _ = socket
                        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                        .await;
                }
                let mut buf = [0u8; 512];
                tokio::select! {
                    _ = socket.read(&mut buf) => {
                        flood.closed_by_node.fetch_add(1, Ordering::Relaxed);
                    }
                    _ = stop.wait_for(|stop| *stop) => {}
                }
            });
        }
        let _ = stop.wait_for(|stop| *stop).await;
        tasks.shutdown().await;
    });
    Ok(())
}
