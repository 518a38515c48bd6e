//! `edgeroute bench --fleet-only`: how much cloud spillover choosing a
//! peer by load saves, in a discrete-event simulation of 3, 30 and 300
//! nodes, and what the placement decision costs with 300 peers.
//!
//! The simulation runs the node's own choice (`edgeroute_core::fleet`:
//! `estimated_wait_ms`, `choose`) on virtual time; what it assumes:
//! - each node runs `SLOTS` generations at once (the batch width) and
//!   queues up to `MAX_QUEUE` requests; a generation takes an exponential
//!   time of mean `SERVICE_MS` (a 200-token prompt and 64 tokens at the
//!   speeds `edgeroute bench` measured on 2 threads);
//! - arrivals are Poisson; half the nodes get 1.5× the mean rate, half
//!   0.5× (skewed load); `RESTRICTED` of the requests may not leave their
//!   node; every request has the same latency budget;
//! - a node knows its own load exactly and its peers' from reports
//!   published every `stale_ms` (so 0 to `stale_ms` old), plus, for the
//!   load-aware choice, what it forwarded since (`estimated_wait_ms`);
//! - a request runs locally when the local wait fits its budget; else
//!   *isolated* sends it to the cloud, *random peer* forwards it to any
//!   other node (no load information), *load-aware* to the power-of-two
//!   choice among the peers whose estimated wait fits the budget; a
//!   forwarded request that finds its peer full goes to the cloud from
//!   there (it is never forwarded twice).

use crate::report::svg::{self, Series};
use edgeroute_core::estimate::queue_wait_ms;
use edgeroute_core::fleet::{self, Ask, Candidate};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::path::Path;
use std::time::Instant;

const SLOTS: u32 = 4;
const MAX_QUEUE: u32 = 16;
const SERVICE_MS: f64 = 2500.0;
const RESTRICTED: f64 = 0.2;
/// What forwarding adds before the peer starts (measured on loopback).
const FORWARD_MS: f64 = 1.5;
/// A cloud call: round trip plus generation.
const CLOUD_MS: f64 = 300.0 + 1500.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    Isolated,
    RandomPeer,
    LoadAware,
    /// A random peer, taken only when its estimated wait fits the budget.
    RandomWithinBudget,
}

impl Mode {
    pub(super) const ALL: [Mode; 4] = [
        Mode::Isolated,
        Mode::RandomPeer,
        Mode::LoadAware,
        Mode::RandomWithinBudget,
    ];

    pub(super) fn name(self) -> &'static str {
        match self {
            Mode::Isolated => "isolated",
            Mode::RandomPeer => "random peer",
            Mode::LoadAware => "load-aware",
            Mode::RandomWithinBudget => "random within budget",
        }
    }

    pub(super) fn slug(self) -> &'static str {
        match self {
            Mode::Isolated => "isolated",
            Mode::RandomPeer => "random",
            Mode::LoadAware => "load-aware",
            Mode::RandomWithinBudget => "random-within-budget",
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Scenario {
    nodes: usize,
    utilisation: f64,
    stale_ms: f64,
    budget_ms: f64,
    requests: usize,
}

#[derive(Debug, Default)]
struct Result {
    arrivals: usize,
    /// Requests that may leave, and those of them the cloud served.
    public: usize,
    spilled: usize,
    refused: usize,
    forwarded: usize,
    /// Forwarded, then sent to the cloud by a peer that was full after all.
    bounced: usize,
    latencies: Vec<f64>,
}

impl Result {
    fn spill(&self) -> f64 {
        self.spilled as f64 / self.public.max(1) as f64
    }

    fn percentile(&mut self, p: f64) -> f64 {
        if self.latencies.is_empty() {
            return 0.0;
        }
        self.latencies.sort_by(f64::total_cmp);
        let i = ((self.latencies.len() - 1) as f64 * p).round() as usize;
        self.latencies[i]
    }
}

/// Skewed load: even-numbered nodes get 1.5× `mean` (per ms), odd ones
/// 0.5×.
pub(super) fn skewed_rates(nodes: usize, mean: f64) -> Vec<f64> {
    (0..nodes)
        .map(|i| mean * if i % 2 == 0 { 1.5 } else { 0.5 })
        .collect()
}

/// xorshift64*: a reproducible stream for the simulation.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub(super) fn unit(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    pub(super) fn exp(&mut self, mean: f64) -> f64 {
        -mean * self.unit().ln()
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() >> 33) as usize % n.max(1)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Arrival {
        node: usize,
    },
    /// A forwarded request reaching its peer.
    Forwarded {
        origin: usize,
        peer: usize,
        /// When it arrived at its origin, in µs of virtual time.
        arrived_us: u64,
        /// The peer's reports published when it was sent.
        after: u64,
    },
    Done {
        node: usize,
        origin: usize,
        after: u64,
    },
    Report {
        node: usize,
    },
}

struct Queued {
    arrived: f64,
    origin: usize,
    after: u64,
}

#[derive(Default)]
struct NodeState {
    running: u32,
    queue: VecDeque<Queued>,
    /// The last report: wait, depth and whether it was full.
    reported_wait: f64,
    reported_depth: u32,
    reported_full: bool,
    /// Reports published so far.
    reports: u64,
}

impl NodeState {
    fn depth(&self) -> u32 {
        self.running + self.queue.len() as u32
    }

    /// The host's own estimate (`LocalTarget::wait_ms`).
    fn wait_ms(&self) -> f64 {
        queue_wait_ms(self.depth(), SLOTS, SERVICE_MS)
    }
}

struct Sim {
    s: Scenario,
    mode: Mode,
    rng: Rng,
    now: f64,
    events: BinaryHeap<Reverse<(u64, u64, Kind)>>,
    seq: u64,
    nodes: Vec<NodeState>,
    /// Requests `origin` forwarded to `peer` since `peer`'s last report
    /// that have not ended (what the host adds to a reported wait).
    unreported: Vec<u32>,
    rates: Vec<f64>,
    result: Result,
    counting: bool,
}

impl Sim {
    fn new(s: Scenario, mode: Mode, seed: u64) -> Self {
        let n = s.nodes;
        let mean_rate = s.utilisation * f64::from(SLOTS) / SERVICE_MS;
        let rates = skewed_rates(n, mean_rate);
        let mut sim = Sim {
            s,
            mode,
            rng: Rng(seed | 1),
            now: 0.0,
            events: BinaryHeap::new(),
            seq: 0,
            nodes: (0..n).map(|_| NodeState::default()).collect(),
            unreported: vec![0; n * n],
            rates,
            result: Result::default(),
            counting: false,
        };
        for node in 0..n {
            let first = sim.rng.exp(1.0 / sim.rates[node]);
            sim.at(first, Kind::Arrival { node });
            if s.stale_ms > 0.0 {
                let phase = sim.rng.unit() * s.stale_ms;
                sim.at(phase, Kind::Report { node });
            }
        }
        sim
    }

    fn at(&mut self, time: f64, kind: Kind) {
        self.seq += 1;
        self.events
            .push(Reverse(((time * 1000.0) as u64, self.seq, kind)));
    }

    fn run(mut self) -> Result {
        let warmup = self.s.requests / 10;
        let mut arrivals = 0usize;
        while let Some(Reverse((t, _, kind))) = self.events.pop() {
            self.now = t as f64 / 1000.0;
            match kind {
                Kind::Arrival { node } => {
                    arrivals += 1;
                    if arrivals > self.s.requests + warmup {
                        break;
                    }
                    self.counting = arrivals > warmup;
                    let next = self.now + self.rng.exp(1.0 / self.rates[node]);
                    self.at(next, Kind::Arrival { node });
                    self.arrive(node);
                }
                Kind::Forwarded {
                    origin,
                    peer,
                    arrived_us,
                    after,
                } => self.reach_peer(origin, peer, arrived_us as f64 / 1000.0, after),
                Kind::Done {
                    node,
                    origin,
                    after,
                } => self.done(node, origin, after),
                Kind::Report { node } => {
                    let (wait, full) = (
                        self.nodes[node].wait_ms(),
                        self.nodes[node].depth() >= MAX_QUEUE,
                    );
                    self.nodes[node].reported_wait = wait;
                    self.nodes[node].reported_depth = self.nodes[node].depth();
                    self.nodes[node].reported_full = full;
                    self.nodes[node].reports += 1;
                    let n = self.s.nodes;
                    for origin in 0..n {
                        self.unreported[origin * n + node] = 0;
                    }
                    let next = self.now + self.s.stale_ms;
                    self.at(next, Kind::Report { node });
                }
            }
        }
        self.result
    }

    /// The view a node has of a peer (wait, depth, full): live when
    /// reports are instant.
    fn reported(&self, peer: usize) -> (f64, u32, bool) {
        let p = &self.nodes[peer];
        if self.s.stale_ms > 0.0 {
            (p.reported_wait, p.reported_depth, p.reported_full)
        } else {
            (p.wait_ms(), p.depth(), p.depth() >= MAX_QUEUE)
        }
    }

    fn arrive(&mut self, node: usize) {
        let restricted = self.rng.unit() < RESTRICTED;
        if self.counting {
            self.result.arrivals += 1;
            self.result.public += usize::from(!restricted);
        }
        let here = &self.nodes[node];
        let fits = here.depth() < MAX_QUEUE;
        if fits && (restricted || here.wait_ms() <= self.s.budget_ms) {
            return self.admit(node, node, self.now, 0);
        }
        if restricted {
            if self.counting {
                self.result.refused += 1;
            }
            return;
        }
        match self.choose_peer(node) {
            Some(peer) => {
                self.unreported[node * self.s.nodes + peer] += 1;
                if self.counting {
                    self.result.forwarded += 1;
                }
                let arrived_us = (self.now * 1000.0) as u64;
                let after = self.nodes[peer].reports;
                self.at(
                    self.now + FORWARD_MS,
                    Kind::Forwarded {
                        origin: node,
                        peer,
                        arrived_us,
                        after,
                    },
                );
            }
            None => self.cloud(),
        }
    }

    fn choose_peer(&mut self, node: usize) -> Option<usize> {
        let n = self.s.nodes;
        let ask = Ask {
            budget_ms: Some(self.s.budget_ms),
            ..Ask::default()
        };
        match self.mode {
            Mode::Isolated => None,
            Mode::RandomPeer | Mode::RandomWithinBudget if n < 2 => None,
            // Blind: any other node, whatever its load.
            Mode::RandomPeer => Some(self.random_other(node)),
            Mode::RandomWithinBudget => {
                let p = self.random_other(node);
                self.estimated_wait(node, p)
                    .is_some_and(|wait| ask.fits(wait))
                    .then_some(p)
            }
            Mode::LoadAware => {
                let mut index = Vec::with_capacity(n);
                let mut waits = Vec::with_capacity(n);
                for p in (0..n).filter(|&p| p != node) {
                    if let Some(wait) = self.estimated_wait(node, p) {
                        index.push(p);
                        waits.push(wait);
                    }
                }
                let names: Vec<String> = index.iter().map(|p| p.to_string()).collect();
                let candidates: Vec<Candidate> = names
                    .iter()
                    .zip(&waits)
                    .map(|(name, &wait_ms)| Candidate { name, wait_ms })
                    .collect();
                let rng = &mut self.rng;
                fleet::choose(&ask, &candidates, &mut |k| rng.below(k)).map(|i| index[i])
            }
        }
    }

    /// A node other than `node`, uniformly.
    fn random_other(&mut self, node: usize) -> usize {
        let p = self.rng.below(self.s.nodes - 1);
        if p >= node { p + 1 } else { p }
    }

    /// Peer `p`'s wait as `node` estimates it from `p`'s last report (none
    /// when the report says it is full).
    fn estimated_wait(&self, node: usize, p: usize) -> Option<f64> {
        let (wait, depth, full) = self.reported(p);
        if full {
            return None;
        }
        // With live reports the peer's wait already counts what this node
        // sent it.
        let unreported = if self.s.stale_ms > 0.0 {
            self.unreported[node * self.s.nodes + p]
        } else {
            0
        };
        Some(fleet::estimated_wait_ms(
            wait, depth, unreported, SLOTS, SERVICE_MS,
        ))
    }

    fn reach_peer(&mut self, origin: usize, peer: usize, arrived: f64, after: u64) {
        let there = &self.nodes[peer];
        if there.depth() < MAX_QUEUE && there.wait_ms() <= self.s.budget_ms {
            self.admit(peer, origin, arrived, after);
        } else {
            // The peer's own policy spills it; it is not forwarded again.
            self.ended(origin, peer, after);
            if self.counting {
                self.result.bounced += 1;
            }
            self.cloud();
        }
    }

    fn cloud(&mut self) {
        if self.counting {
            self.result.spilled += 1;
            self.result.latencies.push(CLOUD_MS);
        }
    }

    fn admit(&mut self, node: usize, origin: usize, arrived: f64, after: u64) {
        let state = &mut self.nodes[node];
        if state.running < SLOTS {
            state.running += 1;
            self.start(node, origin, arrived, after);
        } else {
            state.queue.push_back(Queued {
                arrived,
                origin,
                after,
            });
        }
    }

    fn start(&mut self, node: usize, origin: usize, arrived: f64, after: u64) {
        let service = self.rng.exp(SERVICE_MS);
        let end = self.now + service;
        if self.counting {
            self.result.latencies.push(end - arrived);
        }
        self.at(
            end,
            Kind::Done {
                node,
                origin,
                after,
            },
        );
    }

    /// A request `origin` forwarded to `peer` ended: it leaves the
    /// unreported count unless a report since has counted it.
    fn ended(&mut self, origin: usize, peer: usize, after: u64) {
        if self.nodes[peer].reports == after {
            let i = origin * self.s.nodes + peer;
            self.unreported[i] = self.unreported[i].saturating_sub(1);
        }
    }

    fn done(&mut self, node: usize, origin: usize, after: u64) {
        if origin != node {
            self.ended(origin, node, after);
        }
        match self.nodes[node].queue.pop_front() {
            Some(next) => self.start(node, next.origin, next.arrived, next.after),
            None => self.nodes[node].running -= 1,
        }
    }
}

fn simulate(s: Scenario, mode: Mode) -> Result {
    Sim::new(s, mode, 0x9e37_79b9_7f4a_7c15 ^ s.nodes as u64).run()
}

/// One table row per scenario: spillover of each mode and the reductions.
fn row(label: &str, s: Scenario) -> [f64; 4] {
    let mut results: Vec<Result> = Mode::ALL.iter().map(|&m| simulate(s, m)).collect();
    let spill: Vec<f64> = results.iter().map(Result::spill).collect();
    let cut = |base: f64, x: f64| {
        if base > 0.0 {
            100.0 * (1.0 - x / base)
        } else {
            0.0
        }
    };
    let aware = &mut results[2];
    let (p50, p99) = (aware.percentile(0.5), aware.percentile(0.99));
    println!(
        "| {label} | {:.1} % | {:.1} % | {:.1} % | {:.1} % | {:.0} % | {:.0} % | {:.0} % | {:.1} / {:.1} s | {:.1} % | {:.2} % |",
        100.0 * spill[0],
        100.0 * spill[1],
        100.0 * spill[3],
        100.0 * spill[2],
        cut(spill[0], spill[2]),
        cut(spill[1], spill[2]),
        cut(spill[3], spill[2]),
        p50 / 1e3,
        p99 / 1e3,
        100.0 * aware.forwarded as f64 / aware.arrivals.max(1) as f64,
        100.0 * aware.refused as f64 / aware.arrivals.max(1) as f64,
    );
    [spill[0], spill[1], spill[2], spill[3]]
}

const HEADER: &str = "| scenario | isolated | random peer | random within budget | load-aware | vs isolated | vs random | vs random within budget | load-aware p50 / p99 | forwarded | restricted refused |\n|---|---|---|---|---|---|---|---|---|---|---|";

pub fn run(plot: Option<&Path>, requests: usize) -> anyhow::Result<()> {
    let base = Scenario {
        nodes: 30,
        utilisation: 0.8,
        stale_ms: SERVICE_MS,
        budget_ms: 2.0 * SERVICE_MS,
        requests,
    };
    println!(
        "fleet simulation: {SLOTS} slots and a queue of {MAX_QUEUE} per node, generations of {SERVICE_MS} ms on average, half the nodes at 1.5x the mean arrival rate and half at 0.5x, {:.0} % restricted; cloud spillover is the share of the requests that may leave which the cloud served; {requests} requests per run after a tenth as warm-up",
        RESTRICTED * 100.0
    );
    println!(
        "\nSpillover by fleet size and utilisation (reports up to one generation stale, budget two generations):\n\n{HEADER}"
    );
    let utilisations = [0.5, 0.6, 0.7, 0.8, 0.9, 0.95];
    let mut curves: Vec<[f64; 4]> = Vec::new();
    for nodes in [3, 30, 300] {
        for &u in &utilisations {
            let s = Scenario {
                nodes,
                utilisation: u,
                ..base
            };
            let spill = row(&format!("{nodes} nodes, {:.0} %", u * 100.0), s);
            if nodes == 30 {
                curves.push(spill);
            }
        }
    }
    println!("\nStaleness of the load reports (30 nodes, 80 %):\n\n{HEADER}");
    for stale in [0.0, 500.0, 2500.0, 5000.0, 10_000.0] {
        let s = Scenario {
            stale_ms: stale,
            ..base
        };
        row(&format!("reports every {:.1} s", stale / 1e3), s);
    }
    println!("\nLatency budget (30 nodes, 80 %):\n\n{HEADER}");
    for budget in [1.0, 2.0, 4.0] {
        let s = Scenario {
            budget_ms: budget * SERVICE_MS,
            ..base
        };
        row(&format!("budget {:.1} s", budget * SERVICE_MS / 1e3), s);
    }
    decision_cost()?;
    if let Some(path) = plot {
        let x: Vec<f64> = utilisations.iter().map(|u| u * 100.0).collect();
        let colours = [svg::REFUSED, svg::ESCALATED, svg::LOCAL, svg::CLOUD];
        let series: Vec<Series> = Mode::ALL
            .iter()
            .enumerate()
            .map(|(i, m)| Series {
                name: m.name(),
                colour: colours[i],
                values: curves.iter().map(|c| 100.0 * c[i]).collect(),
            })
            .collect();
        let chart = svg::lines(&x, &series, "mean utilisation (%)", "cloud spillover (%)");
        std::fs::write(path, chart)?;
        println!("\nplot: {}", path.display());
    }
    Ok(())
}

/// The node's own placement step with 300 fresh peers: the candidates the
/// guard allows, their estimated waits, and the choice.
fn decision_cost() -> anyhow::Result<()> {
    use crate::fleet::{Fleet, Report};
    use edgeroute_core::Sensitivity;
    use edgeroute_core::guard::Facts;
    let config: crate::config::FleetConfig =
        toml::from_str("node = \"bench\"\nurl = \"http://127.0.0.1:1\"\nstale_ms = 600000\n")?;
    let fleet = Fleet::new(
        config,
        "bench-token-0123456789".into(),
        Vec::new(),
        std::sync::Arc::default(),
        std::time::Duration::from_secs(1),
    )?;
    for i in 0..300u32 {
        fleet.accept(Report {
            node: format!("edge-{i}"),
            zone: "default".into(),
            url: format!("http://10.0.{}.{}:8080", i / 250, i % 250),
            wait_ms: (i * 37) % 5000,
            queue: i % 16,
            running: 4,
            full: i % 7 == 0,
            slots: 4,
            service_ms: 2500,
            kv_free_tokens: 4096,
            models: vec!["smollm2".into()],
            at_ms: 0,
        });
    }
    let facts = Facts::of_level(Sensitivity::Public, true);
    let mut took = Vec::new();
    for i in 0..20_000u32 {
        let session = (i % 3 == 0).then(|| format!("session-{i}"));
        let t = Instant::now();
        let c = fleet.candidates(&facts, Some(4000), session.as_deref());
        took.push(t.elapsed());
        std::hint::black_box(c);
    }
    let took = super::Spread::of(took);
    println!(
        "\nplacement decision with 300 peers (candidates, estimated waits, session home, power of two choices), 20 000 calls: p50 {:.1} µs, p99 {:.1} µs",
        took.p50, took.p99
    );
    Ok(())
}
