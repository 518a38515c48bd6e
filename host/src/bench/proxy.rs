//! What the node adds to a cloud call: the same requests, from the same
//! pooled client in the same run, straight to a loopback upstream that
//! answers at once and through the node (its HTTP server, the pipeline,
//! policy, guard, the cloud-fetch component and the pooled upstream
//! client). Reports the added latency (non-streaming p50/p99), the added
//! time to first byte (streaming), and how many connections the node
//! opened to the upstream per 1,000 requests.

use super::upstream::{self, Timing};
use crate::config::Config;
use crate::node::Node;
use anyhow::{Context, bail};
use serde_json::{Value, json};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Only an upstream serves a request that offers tools: every request
/// through the node is a cloud call, as an agent's would be.
fn body(stream: bool) -> Value {
    json!({
        "model": "auto",
        "messages": [{"role": "user", "content": "Look up the weather in Lyon."}],
        "tools": [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}],
        "max_tokens": 1,
        "stream": stream,
    })
}

/// One request; its time to the first body byte and to the end.
async fn call(
    client: &reqwest::Client,
    url: &str,
    stream: bool,
) -> anyhow::Result<(Duration, Duration)> {
    let body = body(stream).to_string();
    let t0 = Instant::now();
    let mut response = client
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await?;
    if !response.status().is_success() {
        bail!("{url} answered {}", response.status());
    }
    let mut first = None;
    while let Some(chunk) = response.chunk().await? {
        if !chunk.is_empty() {
            first.get_or_insert_with(|| t0.elapsed());
        }
    }
    let total = t0.elapsed();
    Ok((first.unwrap_or(total), total))
}

pub async fn run(mut config: Config, requests: u32) -> anyhow::Result<()> {
    if requests == 0 {
        bail!("--proxy-requests must be at least 1");
    }
    let instant = Timing {
        round_trip: Duration::ZERO,
        server_ttft: Duration::ZERO,
        tokens_per_s: 1e9,
    };
    // One upstream for the direct calls, one for the node's, so each
    // counts only its own connections.
    let direct = upstream::start(instant).await?;
    let behind = upstream::start(instant).await?;
    let upstream = config
        .cloud
        .upstreams
        .first_mut()
        .context("the config has no cloud upstream to stand in for")?;
    upstream.base_url = behind.base_url.clone();
    config.cloud.upstreams.truncate(1);
    let node = Node::start(config).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let node_url = format!("http://{}/v1/chat/completions", listener.local_addr()?);
    let limits = crate::serve::ServeLimits {
        max_connections: 1024,
        header_read_timeout: Duration::from_secs(10),
        shutdown_grace: Duration::from_secs(1),
    };
    tokio::spawn(crate::serve::serve(
        listener,
        crate::api::router(node.clone()),
        limits,
        std::future::pending(),
    ));
    let direct_url = format!("{}/chat/completions", direct.base_url);
    let client = reqwest::Client::new();

    println!(
        "what the node adds to a cloud call: {requests} requests each way, alternating, one pooled client, loopback upstream that answers at once (1 token)"
    );
    let warm_up = 50;
    for stream in [false, true] {
        let opened_first = behind.connections.load(Ordering::Relaxed);
        for _ in 0..warm_up {
            call(&client, &direct_url, stream).await?;
            call(&client, &node_url, stream).await?;
        }
        let opened_before = behind.connections.load(Ordering::Relaxed);
        let (mut d, mut n) = (Vec::new(), Vec::new());
        for _ in 0..requests {
            let pick = |(first, total): (Duration, Duration)| if stream { first } else { total };
            d.push(pick(call(&client, &direct_url, stream).await?));
            n.push(pick(call(&client, &node_url, stream).await?));
        }
        let opened = behind.connections.load(Ordering::Relaxed) - opened_before;
        let opened_all = behind.connections.load(Ordering::Relaxed) - opened_first;
        let what = if stream {
            "streaming, time to first byte"
        } else {
            "non-streaming, whole answer"
        };
        let (direct, through) = (super::Spread::of(d), super::Spread::of(n));
        let (d50, d99, n50, n99) = (direct.p50, direct.p99, through.p50, through.p99);
        println!(
            "  {what}: direct p50 {d50:.0} µs, p99 {d99:.0} µs; through the node p50 {n50:.0} µs, p99 {n99:.0} µs; added p50 {:.0} µs, p99 {:.0} µs",
            n50 - d50,
            n99 - d99
        );
        println!(
            "    connections the node opened to the upstream: {opened} during the {requests} measured requests ({:.1} per 1,000), {opened_all} counting the {warm_up} warm-up ones",
            opened as f64 * 1000.0 / requests as f64
        );
    }
    Ok(())
}
