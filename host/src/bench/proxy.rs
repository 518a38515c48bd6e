//! What the node adds to a cloud call: the same requests, from the same
//! pooled client in the same run, straight to a loopback upstream that
//! answers at once and through the node (its HTTP server, the pipeline,
//! policy, guard, the cloud-fetch component and the pooled upstream
//! client). Reports the added latency (non-streaming p50/p99), the added
//! time to first byte (streaming), and how many connections the node
//! opened to the upstream per 1,000 requests. The cloud fetcher is also
//! called alone, against the node's HTTP client calling the same upstream.
//!
//! Then what a hop to a peer of the fleet adds: the same request sent to a
//! node that serves it from the cloud (`b`, no local model), and to a node
//! whose local queue is always full (`a`, `max_queue = 0`), which forwards
//! it to `b`; the difference is the forwarding (a's server, pipeline,
//! guard and its HTTP client, b's check of the fleet token).

use super::upstream::{self, Timing};
use crate::config::Config;
use crate::node::Node;
use anyhow::{Context, bail};
use serde_json::{Value, json};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// A plain chat request: `b` serves it from the cloud, `a` forwards it.
fn plain(stream: bool) -> Value {
    json!({
        "model": "auto",
        "messages": [{"role": "user", "content": "What is the weather in Lyon?"}],
        "max_tokens": 1,
        "stream": stream,
    })
}

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
    send(client, url, body(stream).to_string()).await
}

/// One POST of `body` (JSON, or any text); its time to the first body byte
/// and to the end. A status other than success is an error.
pub(super) async fn send(
    client: &reqwest::Client,
    url: &str,
    body: String,
) -> anyhow::Result<(Duration, Duration)> {
    let (first, total, _) = send_timed(client, url, body).await?;
    Ok((first, total))
}

/// [`send`], with the answer's `Server-Timing` header (the Spin gateway
/// says where its time went).
pub(super) async fn send_timed(
    client: &reqwest::Client,
    url: &str,
    body: String,
) -> anyhow::Result<(Duration, Duration, Option<String>)> {
    let t0 = Instant::now();
    let mut response = client
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await?;
    if !response.status().is_success() {
        let status = response.status();
        let why = response.text().await.unwrap_or_default();
        bail!("{url} answered {status}: {why}");
    }
    let timing = response
        .headers()
        .get("server-timing")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let mut first = None;
    while let Some(chunk) = response.chunk().await? {
        if !chunk.is_empty() {
            first.get_or_insert_with(|| t0.elapsed());
        }
    }
    let total = t0.elapsed();
    Ok((first.unwrap_or(total), total, timing))
}

/// The p50 and p99 of each step a `Server-Timing` header named (`name;dur=ms,
/// …`), in the order the steps first appear: where `whose` time went.
pub(super) fn report_steps(whose: &str, headers: &[String]) {
    let mut steps: Vec<(String, Vec<f64>)> = Vec::new();
    for header in headers {
        for (name, ms) in edgeroute_core::timing::entries(header) {
            match steps.iter_mut().find(|(n, _)| n == name) {
                Some((_, all)) => all.push(ms),
                None => steps.push((name.to_owned(), vec![ms])),
            }
        }
    }
    if steps.is_empty() {
        return;
    }
    let line: Vec<String> = steps
        .into_iter()
        .map(|(name, all)| {
            let spread = super::Spread::of(
                all.iter()
                    .map(|ms| Duration::from_secs_f64(ms / 1e3))
                    .collect(),
            );
            format!("{name} {:.0}/{:.0}", spread.p50, spread.p99)
        })
        .collect();
    println!(
        "    {whose} steps (Server-Timing), p50/p99 µs: {}",
        line.join(", ")
    );
}

/// An upstream that answers at once, one token.
const INSTANT: Timing = Timing {
    round_trip: Duration::ZERO,
    server_ttft: Duration::ZERO,
    tokens_per_s: 1e9,
};

/// The config's first upstream, pointed at `base_url`, is its only one.
pub(super) fn only_upstream(config: &mut Config, base_url: &str) -> anyhow::Result<()> {
    let first = config
        .cloud
        .upstreams
        .first_mut()
        .context("the config has no cloud upstream to stand in for")?;
    first.base_url = base_url.to_string();
    config.cloud.upstreams.truncate(1);
    Ok(())
}

/// Serve `node` on a free loopback port; its base URL.
async fn serve(node: &std::sync::Arc<Node>) -> anyhow::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    serve_on(listener, node, std::future::pending());
    Ok(url)
}

/// Serve `node` on `listener` until `shutdown`.
pub(super) fn serve_on(
    listener: tokio::net::TcpListener,
    node: &std::sync::Arc<Node>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    tokio::spawn(crate::serve::serve(
        listener,
        crate::api::router(node.clone()),
        (&node.config.limits).into(),
        shutdown,
    ));
}

pub async fn run(config: Config, requests: u32) -> anyhow::Result<()> {
    cloud_call(config.clone(), requests).await?;
    // The same with the connection threads sleeping at once: what polling
    // before sleeping buys, in this run.
    if config.limits.idle_poll_us > 0 {
        let mut sleeping = config.clone();
        sleeping.limits.idle_poll_us = 0;
        println!("  the same with [limits] idle_poll_us = 0 (connection threads sleep at once):");
        cloud_call(sleeping, requests).await?;
    }
    fetcher_instances(requests).await?;
    peer_hop(config, requests).await
}

/// The cloud fetcher called directly (no HTTP into the node): on pooled
/// instances, against a fresh instance per call as the node did before.
async fn fetcher_instances(requests: u32) -> anyhow::Result<()> {
    use crate::bindings::target::Message;
    use crate::targets::cloud::{CloudTarget, POOL_SLOTS};
    use crate::targets::{Job, Taint, greedy_request};
    let upstream = upstream::start(INSTANT).await?;
    let config = crate::config::UpstreamConfig {
        name: "bench".into(),
        base_url: upstream.base_url.clone(),
        model: "bench".into(),
        api_key_env: None,
        usd_per_mtok_in: 0.0,
        usd_per_mtok_out: 0.0,
    };
    let engine = crate::runtime::engine()?;
    let target = |slots| {
        let fetcher = crate::components::CLOUD_FETCH;
        let timeout = Duration::from_secs(30);
        CloudTarget::with_pool(
            &engine,
            fetcher,
            std::slice::from_ref(&config),
            timeout,
            None,
            slots,
        )
    };
    let (fresh, pooled) = (target(0)?, target(POOL_SLOTS)?);
    // The baseline: the node's own upstream client, the same request and
    // upstream, no component (what the fetcher adds over plain HTTP).
    let client = crate::egress::upstream_client()?;
    let url = format!(
        "{}/chat/completions",
        upstream.base_url.trim_end_matches('/')
    );
    let plain = json!({
        "model": "bench",
        "messages": [{"role": "user", "content": "What is the weather in Lyon?"}],
        "max_tokens": 1,
    })
    .to_string();
    let host_client = || async {
        let started = Instant::now();
        let answer = client
            .post(&url)
            .header("content-type", "application/json")
            .body(plain.clone())
            .send()
            .await?
            .error_for_status()?
            .bytes()
            .await?;
        serde_json::from_slice::<Value>(&answer)?;
        anyhow::Ok(started.elapsed())
    };
    async fn once(cloud: &CloudTarget) -> anyhow::Result<Duration> {
        let question = Message {
            role: "user".into(),
            content: "What is the weather in Lyon?".into(),
        };
        let job = Job::new(greedy_request(vec![question], 1));
        let started = Instant::now();
        cloud
            .generate("bench", job, Taint::may_leave("bench"))
            .await
            .map_err(|e| anyhow::anyhow!("cloud-fetch call failed: {e}"))?;
        Ok(started.elapsed())
    }
    for _ in 0..50 {
        once(&fresh).await?;
        once(&pooled).await?;
        host_client().await?;
    }
    let (mut f, mut p, mut h) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..requests {
        f.push(once(&fresh).await?);
        p.push(once(&pooled).await?);
        h.push(host_client().await?);
    }
    let (f, p, h) = (
        super::Spread::of(f),
        super::Spread::of(p),
        super::Spread::of(h),
    );
    println!(
        "  the cloud fetcher called directly ({requests} calls each way, alternating): a fresh instance per call p50 {:.0} µs, p99 {:.0} µs; pooled instances p50 {:.0} µs, p99 {:.0} µs (pooled / fresh: p50 {:.2}, p99 {:.2}); the node's HTTP client alone p50 {:.0} µs, p99 {:.0} µs (pooled fetcher / client: p50 {:.2}, p99 {:.2})",
        f.p50,
        f.p99,
        p.p50,
        p.p99,
        p.p50 / f.p50,
        p.p99 / f.p99,
        h.p50,
        h.p99,
        p.p50 / h.p50,
        p.p99 / h.p99
    );
    Ok(())
}

/// What a hop to a peer adds to the time to first byte and the latency.
async fn peer_hop(mut config: Config, requests: u32) -> anyhow::Result<()> {
    let upstream = upstream::start(INSTANT).await?;
    only_upstream(&mut config, &upstream.base_url)?;
    config.local.embedding = None;
    let fleet = |name: &str, peers: Vec<crate::config::PeerConfig>| -> anyhow::Result<_> {
        let mut fleet: crate::config::FleetConfig = toml::from_str(&format!(
            "node = \"{name}\"\nreport_ms = 100\nstale_ms = 1000\n"
        ))?;
        fleet.peers = peers;
        fleet.token_value = Some("bench-fleet-token-0123456789".into());
        Ok(fleet)
    };
    // b: no local model, so every request it gets goes to the upstream.
    let mut b_config = config.clone();
    b_config.local.models.clear();
    b_config.fleet = Some(fleet("b", Vec::new())?);
    let b = Node::start(b_config).await?;
    let b_url = serve(&b).await?;
    b.fleet.as_ref().context("b is in a fleet")?;
    // a: its local queue is always full, so it forwards to b.
    let mut a_config = config;
    a_config.local.max_queue = 0;
    let mut a_fleet = fleet(
        "a",
        vec![crate::config::PeerConfig {
            name: "b".into(),
            url: b_url.clone(),
        }],
    )?;
    a_fleet.url = "http://127.0.0.1:1".into();
    a_config.fleet = Some(a_fleet);
    let a = Node::start(a_config).await?;
    let a_url = serve(&a).await?;
    crate::fleet::sync::spawn(std::sync::Arc::downgrade(&a));
    let deadline = Instant::now() + Duration::from_secs(10);
    while a
        .fleet
        .as_ref()
        .is_some_and(|f| f.status()["peers"][0]["fresh"] != true)
    {
        if Instant::now() > deadline {
            bail!(
                "node a never heard from b: {}",
                a.fleet.as_ref().map(|f| f.status()).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let client = reqwest::Client::new();
    let (to_b, to_a) = (
        format!("{b_url}/v1/chat/completions"),
        format!("{a_url}/v1/chat/completions"),
    );
    // The hop is real: a's answer names b.
    let probe = client
        .post(&to_a)
        .header("content-type", "application/json")
        .body(plain(false).to_string())
        .send()
        .await?;
    let target = probe
        .headers()
        .get("x-edgeroute-target")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    if target != "peer:b" {
        bail!(
            "a did not forward to b (target '{target}', status {})",
            probe.status()
        );
    }
    println!(
        "\nwhat a hop to a peer adds: {requests} requests each way, alternating, straight to b (which calls the upstream) and through a (whose full queue forwards to b)"
    );
    for stream in [false, true] {
        for _ in 0..50 {
            send(&client, &to_b, plain(stream).to_string()).await?;
            send(&client, &to_a, plain(stream).to_string()).await?;
        }
        let (mut direct, mut hop) = (Vec::new(), Vec::new());
        for _ in 0..requests {
            let pick = |(first, total): (Duration, Duration)| if stream { first } else { total };
            direct.push(pick(send(&client, &to_b, plain(stream).to_string()).await?));
            hop.push(pick(send(&client, &to_a, plain(stream).to_string()).await?));
        }
        let (d, h) = (super::Spread::of(direct), super::Spread::of(hop));
        let what = if stream {
            "streaming, time to first byte"
        } else {
            "non-streaming, whole answer"
        };
        println!(
            "  {what}: b p50 {:.0} µs, p99 {:.0} µs; through a p50 {:.0} µs, p99 {:.0} µs; the hop adds p50 {:.0} µs, p99 {:.0} µs",
            d.p50,
            d.p99,
            h.p50,
            h.p99,
            h.p50 - d.p50,
            h.p99 - d.p99
        );
    }
    Ok(())
}

/// What the node adds to a cloud call.
async fn cloud_call(mut config: Config, requests: u32) -> anyhow::Result<()> {
    if requests == 0 {
        bail!("--proxy-requests must be at least 1");
    }
    // One upstream for the direct calls, one for the node's, so each
    // counts only its own connections.
    let direct = upstream::start_on_own_thread(INSTANT).await?;
    let behind = upstream::start_on_own_thread(INSTANT).await?;
    only_upstream(&mut config, &behind.base_url)?;
    let node = Node::start(config).await?;
    let node_url = format!("{}/v1/chat/completions", serve(&node).await?);
    let direct_url = format!("{}/chat/completions", direct.base_url);
    // The client on one thread of its own too (see `start_on_own_thread`).
    tokio::task::spawn_blocking(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(measure_cloud_call(
                &node_url,
                &direct_url,
                &behind,
                requests,
            ))
    })
    .await?
}

/// The same requests straight to the upstream and through the node,
/// alternating; what the node adds, and where its time went.
async fn measure_cloud_call(
    node_url: &str,
    direct_url: &str,
    behind: &upstream::Simulated,
    requests: u32,
) -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    println!(
        "what the node adds to a cloud call: {requests} requests each way, alternating, one pooled client, loopback upstream that answers at once (1 token); the client and each upstream on a single-threaded runtime of its own"
    );
    let warm_up = 50;
    for stream in [false, true] {
        let opened_first = behind.connections.load(Ordering::Relaxed);
        for _ in 0..warm_up {
            call(&client, direct_url, stream).await?;
            call(&client, node_url, stream).await?;
        }
        let opened_before = behind.connections.load(Ordering::Relaxed);
        let polled_before = crate::serve::idle_poll::polled();
        let (mut d, mut n, mut steps) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..requests {
            let pick = |(first, total): (Duration, Duration)| if stream { first } else { total };
            d.push(pick(call(&client, direct_url, stream).await?));
            let (first, total, timing) =
                send_timed(&client, node_url, body(stream).to_string()).await?;
            n.push(pick((first, total)));
            steps.extend(timing);
        }
        let polled = crate::serve::idle_poll::polled() - polled_before;
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
        println!(
            "    the node's connection threads polled (rounds' own time) {:.0} µs per request",
            polled.as_secs_f64() * 1e6 / requests as f64
        );
        report_steps("the node's", &steps);
    }
    Ok(())
}
