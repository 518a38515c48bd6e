//! `edgeroute bench --fleet-loopback`: the spillover comparison of
//! `--fleet-only` on a real fleet. Three nodes run in this process, each
//! serving HTTP on loopback, publishing its load through a real Redis
//! (`redis-server` from the PATH) and running the real router, default
//! policy, guard and forwarding. Only the local model is replaced, by the
//! paced test backend (`[local.test_backend]`) at the speeds `edgeroute
//! bench` measured on this machine: three real models on two cores would
//! measure the shared CPU, not the placement. The cloud is a loopback
//! stand-in that records what reached it, which is how spillover is
//! counted and how a restricted request reaching it would be caught.
//!
//! What it assumes, as the simulation does where it applies: Poisson
//! arrivals, a and c at 1.5× the mean rate and b at 0.5×; a fifth of the
//! requests restricted (they never leave their node); every request
//! streamed with a latency budget of two generations; load reports one
//! generation apart. The same arrivals meet each fleet in turn: isolated
//! (no `[fleet]`), random peer (`[fleet] choice = "random"`), load-aware
//! (the default choice).

use super::fleet::{Mode, Rng, skewed_rates};
use super::proxy::{only_upstream, serve_on};
use super::upstream::{self, Timing};
use crate::config::Config;
use crate::nn::Pace;
use crate::node::Node;
use anyhow::{Context, bail};
use serde_json::json;
use std::collections::HashSet;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const NODES: [&str; 3] = ["a", "b", "c"];
/// One stream's speeds on this machine's SmolLM2 at one thread, as
/// `edgeroute bench` measured them (README, "Local throughput").
const PACE: Pace = Pace {
    prefill_tokens_per_s: 120.0,
    decode_tokens_per_s: 60.0,
};
const SLOTS: u32 = 2;
const MAX_QUEUE: u32 = 8;
const COMPLETION_TOKENS: u32 = 24;
const RESTRICTED: f64 = 0.2;
const UTILISATION: f64 = 0.8;
/// A cloud call: round trip, its first token, then its decode speed.
const CLOUD: Timing = Timing {
    round_trip: Duration::from_millis(300),
    server_ttft: Duration::from_millis(200),
    tokens_per_s: 100.0,
};
const TOKEN: &str = "bench-fleet-token-0123456789";

/// A `redis-server` on a free loopback port, killed on drop.
struct RedisServer {
    child: Child,
    url: String,
}

impl RedisServer {
    async fn start() -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("cannot start redis-server: `./dev setup` installs it (apt redis-server)")?;
        let server = Self {
            child,
            url: format!("redis://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            if Instant::now() > deadline {
                bail!("redis-server did not listen on port {port} within 10 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(server)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Three nodes serving.
struct Fleet {
    members: Vec<Member>,
}

/// One node of the fleet: where it is served, and what stops it.
struct Member {
    url: String,
    node: Arc<Node>,
    stop: tokio::sync::oneshot::Sender<()>,
    state: std::path::PathBuf,
}

impl Fleet {
    async fn start(
        base: &Config,
        mode: Mode,
        redis: Option<&str>,
        report_ms: u64,
    ) -> anyhow::Result<Self> {
        let mut fleet = Fleet {
            members: Vec::new(),
        };
        for name in NODES {
            // Bound first: each node publishes the URL it is served at.
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let url = format!("http://{}", listener.local_addr()?);
            let mut config = base.clone();
            let state = std::env::temp_dir().join(format!(
                "edgeroute-fleet-bench-{}-{}-{name}",
                std::process::id(),
                mode.slug()
            ));
            std::fs::create_dir_all(&state)?;
            config.node.state_dir = Some(state.clone());
            if let Some(redis) = redis {
                // The mode's slug is the node's `[fleet] choice`.
                let choice = mode.slug();
                let mut f: crate::config::FleetConfig = toml::from_str(&format!(
                    "node = \"{name}\"\nredis = \"{redis}\"\nreport_ms = {report_ms}\nstale_ms = {}\nchoice = \"{choice}\"\n",
                    3 * report_ms
                ))?;
                f.url = url.clone();
                f.token_value = Some(TOKEN.into());
                config.fleet = Some(f);
            }
            let node = Node::start(config).await?;
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            serve_on(listener, &node, async move {
                let _ = stopped.await;
            });
            if node.fleet.is_some() {
                crate::fleet::sync::spawn(Arc::downgrade(&node));
            }
            fleet.members.push(Member {
                url,
                node,
                stop,
                state,
            });
        }
        if redis.is_some() {
            fleet.wait_for_peers().await?;
        }
        Ok(fleet)
    }

    /// Until every node has a fresh report from both others.
    async fn wait_for_peers(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let fresh = |node: &Arc<Node>| {
                node.fleet.as_ref().map_or(0, |f| {
                    f.status()["peers"]
                        .as_array()
                        .map_or(0, |p| p.iter().filter(|p| p["fresh"] == true).count())
                })
            };
            if self
                .members
                .iter()
                .all(|m| fresh(&m.node) == NODES.len() - 1)
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the nodes did not all hear from each other through Redis within 20 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn url(&self, node: usize) -> &str {
        &self.members[node].url
    }

    fn stop(self) {
        for member in self.members {
            let _ = member.stop.send(());
            let _ = std::fs::remove_dir_all(member.state);
        }
    }
}

/// One request of the schedule.
#[derive(Debug, Clone, Copy)]
struct Arrival {
    at: Duration,
    node: usize,
    restricted: bool,
    id: usize,
}

/// What its client saw.
#[derive(Debug)]
struct Seen {
    arrival: Arrival,
    status: u16,
    target: String,
    ttft: Duration,
    total: Duration,
    /// The stream ended with an error event.
    broken: bool,
}

fn prompt(id: usize) -> String {
    format!("req-{id:05}: In one sentence, why run a language model close to its users?")
}

/// Poisson arrivals at each node's rate, merged, `count` in all.
fn schedule(rates_per_ms: &[f64], count: usize) -> Vec<Arrival> {
    let mut rng = Rng(0x5eed_f1ee_7000_0003);
    let mut next: Vec<f64> = rates_per_ms.iter().map(|r| rng.exp(1.0 / r)).collect();
    let mut out = Vec::with_capacity(count);
    for id in 0..count {
        let node = (0..next.len())
            .min_by(|&a, &b| next[a].total_cmp(&next[b]))
            .unwrap_or(0);
        out.push(Arrival {
            at: Duration::from_secs_f64(next[node] / 1e3),
            node,
            restricted: rng.unit() < RESTRICTED,
            id,
        });
        next[node] += rng.exp(1.0 / rates_per_ms[node]);
    }
    out
}

async fn send(
    client: &reqwest::Client,
    url: &str,
    arrival: Arrival,
    budget_ms: u64,
) -> anyhow::Result<Seen> {
    let body = json!({
        "model": "auto",
        "messages": [{"role": "user", "content": prompt(arrival.id)}],
        "max_tokens": COMPLETION_TOKENS,
        "stream": true,
    });
    let mut request = client
        .post(format!("{url}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header(crate::api::LATENCY_BUDGET_HEADER, budget_ms.to_string())
        .body(body.to_string());
    if arrival.restricted {
        request = request.header(crate::api::SENSITIVITY_HEADER, "restricted");
    }
    let t0 = Instant::now();
    let mut response = request.send().await?;
    let status = response.status().as_u16();
    let target = response
        .headers()
        .get(crate::api::TARGET_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let (mut first, mut text) = (None, Vec::new());
    while let Some(chunk) = response.chunk().await? {
        if !chunk.is_empty() {
            first.get_or_insert_with(|| t0.elapsed());
            text.extend_from_slice(&chunk);
        }
    }
    let total = t0.elapsed();
    let broken = status == 200 && String::from_utf8_lossy(&text).contains("\"error\"");
    Ok(Seen {
        arrival,
        status,
        target,
        ttft: first.unwrap_or(total),
        total,
        broken,
    })
}

/// One generation's time on an idle node as a client sees it (the median
/// of three; restricted, so they run locally whatever the policy).
async fn service_time(url: &str) -> anyhow::Result<Duration> {
    let client = reqwest::Client::new();
    let mut times = Vec::new();
    for id in 0..3 {
        let arrival = Arrival {
            at: Duration::ZERO,
            node: 0,
            restricted: true,
            id: 90_000 + id,
        };
        let seen = send(&client, url, arrival, 600_000).await?;
        if seen.status != 200 || !seen.target.starts_with("local") {
            bail!(
                "the probe did not run locally (status {}, target '{}')",
                seen.status,
                seen.target
            );
        }
        times.push(seen.total);
    }
    times.sort();
    Ok(times[1])
}

#[derive(Default)]
struct Tally {
    public: usize,
    spilled: usize,
    forwarded: usize,
    restricted: usize,
    refused: usize,
    errors: usize,
    /// Answered requests whose first token came after the budget.
    late: usize,
    ttft: Vec<Duration>,
    total: Vec<Duration>,
}

impl Tally {
    fn spill(&self) -> f64 {
        self.spilled as f64 / self.public.max(1) as f64
    }
}

async fn run_mode(
    base: &Config,
    mode: Mode,
    arrivals: &[Arrival],
    warmup: usize,
    budget_ms: u64,
    report_ms: u64,
    cloud: &upstream::Simulated,
) -> anyhow::Result<Tally> {
    let redis = match mode {
        Mode::Isolated => None,
        _ => Some(RedisServer::start().await?),
    };
    let fleet = Fleet::start(
        base,
        mode,
        redis.as_ref().map(|r| r.url.as_str()),
        report_ms,
    )
    .await?;
    let before = cloud
        .received
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .len();
    let client = reqwest::Client::new();
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(arrivals.len());
    for &arrival in arrivals {
        tokio::time::sleep_until(start + arrival.at).await;
        let (client, url) = (client.clone(), fleet.url(arrival.node).to_string());
        tasks.push(tokio::spawn(async move {
            send(&client, &url, arrival, budget_ms).await
        }));
    }
    let mut seen = Vec::with_capacity(tasks.len());
    for task in tasks {
        seen.push(task.await??);
    }
    fleet.stop();
    drop(redis);
    // What reached the cloud in this run, by request id.
    let at_cloud: HashSet<usize> = cloud.received.lock().unwrap_or_else(|p| p.into_inner())
        [before..]
        .iter()
        .filter_map(|body| {
            let text = String::from_utf8_lossy(body);
            let at = text.find("req-")?;
            text.get(at + 4..at + 9)?.parse().ok()
        })
        .collect();
    let mut tally = Tally::default();
    for s in seen.iter().filter(|s| s.arrival.id >= warmup) {
        let id = s.arrival.id;
        if s.arrival.restricted {
            if at_cloud.contains(&id) {
                bail!("{}: restricted request {id} reached the cloud", mode.name());
            }
            tally.restricted += 1;
            tally.refused += usize::from(s.status == 503);
        } else {
            tally.public += 1;
            tally.spilled += usize::from(at_cloud.contains(&id));
        }
        tally.forwarded += usize::from(s.target.starts_with("peer:"));
        match s.status {
            200 if !s.broken => {
                tally.late += usize::from(s.ttft > Duration::from_millis(budget_ms));
                tally.ttft.push(s.ttft);
                tally.total.push(s.total);
            }
            503 if s.arrival.restricted => {}
            _ => tally.errors += 1,
        }
    }
    Ok(tally)
}

pub async fn run(config: Config, requests: usize) -> anyhow::Result<()> {
    if requests < 10 {
        bail!("--fleet-loopback-requests must be at least 10");
    }
    let cloud = upstream::start(CLOUD).await?;
    let mut base = config;
    only_upstream(&mut base, &cloud.base_url)?;
    base.local.embedding = None;
    base.local.test_backend = Some(PACE);
    base.local.max_concurrent = SLOTS;
    base.local.max_queue = MAX_QUEUE;
    base.node.decision_log = None;
    base.fleet = None;
    if base.local.models.is_empty() {
        bail!("the config has no local model (the test backend uses its tokenizer)");
    }
    // The generation time, on one idle node of its own.
    let probe = Fleet::start(&base, Mode::Isolated, None, 0).await?;
    let service = service_time(probe.url(0)).await?;
    probe.stop();
    let service_ms = service.as_secs_f64() * 1e3;
    let budget_ms = (2.0 * service_ms).round() as u64;
    let report_ms = service_ms.round().max(50.0) as u64;
    let mean_rate = UTILISATION * f64::from(SLOTS) / service_ms;
    let rates = skewed_rates(NODES.len(), mean_rate);
    let warmup = requests / 10;
    let arrivals = schedule(&rates, requests + warmup);
    let span = arrivals.last().map_or(0.0, |a| a.at.as_secs_f64());
    println!(
        "fleet on loopback: 3 nodes (a and c at 1.5x the mean rate, b at 0.5x) with Redis, {SLOTS} slots and a queue of {MAX_QUEUE} each; local model: the paced TEST backend at {} prompt and {} completion tokens/s per stream; a generation takes {service_ms:.0} ms; {:.0} % restricted; budget {budget_ms} ms; reports every {report_ms} ms; {requests} requests per fleet after {warmup} as warm-up, over {span:.0} s",
        PACE.prefill_tokens_per_s,
        PACE.decode_tokens_per_s,
        RESTRICTED * 100.0
    );
    println!(
        "\n| fleet | cloud spillover | load-aware's is lower by | p50 / p99 to first token | first token over budget | p50 / p99 whole answer | forwarded | restricted refused | errors |\n|---|---|---|---|---|---|---|---|---|"
    );
    let mut tallies = Vec::new();
    for mode in Mode::ALL {
        let tally = run_mode(&base, mode, &arrivals, warmup, budget_ms, report_ms, &cloud).await?;
        tallies.push((mode, tally));
    }
    let aware = tallies
        .iter()
        .find(|(m, _)| *m == Mode::LoadAware)
        .map_or(0.0, |(_, t)| t.spill());
    for (mode, tally) in &tallies {
        let mode = *mode;
        let cut = |base: f64| {
            if base > 0.0 {
                format!("{:.0} %", 100.0 * (1.0 - aware / base))
            } else {
                "–".into()
            }
        };
        let ms = |v: &Vec<Duration>| {
            if v.is_empty() {
                return "–".to_string();
            }
            let s = super::Spread::of(v.clone());
            format!("{:.0} / {:.0} ms", s.p50 / 1e3, s.p99 / 1e3)
        };
        println!(
            "| {} | {:.1} % ({} of {}) | {} | {} | {:.1} % | {} | {:.1} % | {:.1} % | {} |",
            mode.name(),
            100.0 * tally.spill(),
            tally.spilled,
            tally.public,
            if mode == Mode::LoadAware {
                "–".into()
            } else {
                cut(tally.spill())
            },
            ms(&tally.ttft),
            100.0 * tally.late as f64 / tally.ttft.len().max(1) as f64,
            ms(&tally.total),
            100.0 * tally.forwarded as f64 / (tally.public + tally.restricted).max(1) as f64,
            100.0 * tally.refused as f64 / tally.restricted.max(1) as f64,
            tally.errors,
        );
    }
    Ok(())
}
