//! A fleet of edgeroute nodes. Each node publishes its load (`sync`) and
//! reads its peers'; a request this node cannot serve well may be
//! forwarded to a peer (`forward`), chosen by `edgeroute_core::fleet`
//! (a session's home, else the power of two choices) among the peers that
//! are fresh, not full, fit the request's latency budget and that the
//! guard lets the request reach (its level, the trust zone).
//!
//! A forwarded request carries the fleet token and is never forwarded
//! again: the receiving node shows its policy no peers.

mod forward;
pub mod sync;

use crate::config::{FleetConfig, PeerChoice};
use crate::egress::EgressAudit;
use crate::per_thread::ClientPerThread;
use edgeroute_core::fleet::{self, Ask, Candidate, PeakEwma};
use edgeroute_core::guard::{Facts, PeerView};
use edgeroute_core::{PeerFeature, Sensitivity};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Header naming the node that forwarded a request (with the token).
pub const FORWARDED_BY_HEADER: &str = "x-edgeroute-forwarded-by";
/// Header carrying the fleet token between nodes.
pub const TOKEN_HEADER: &str = "x-edgeroute-fleet-token";

/// What a node publishes about itself, every `report_ms`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub node: String,
    pub zone: String,
    /// Where peers reach it.
    pub url: String,
    /// Its estimate of a new request's wait for a local slot.
    pub wait_ms: u32,
    pub queue: u32,
    pub running: u32,
    /// Its queue is at its bound: a forwarded request would be refused.
    pub full: bool,
    /// Generations it runs at once (its batch width).
    pub slots: u32,
    /// Its measured time of one generation (0: none measured yet).
    #[serde(default)]
    pub service_ms: u32,
    /// KV cells not in use by running generations.
    pub kv_free_tokens: u32,
    pub models: Vec<String>,
    /// Unix milliseconds when it was made.
    pub at_ms: u64,
}

/// A peer as this node knows it.
struct PeerState {
    /// The report's node name, shared with every request's candidates
    /// (300 peers would otherwise cost 300 allocations a decision).
    name: Arc<str>,
    report: Report,
    /// When this node received the report (its own clock: peers' clocks
    /// are not trusted for staleness).
    seen: Instant,
    /// Peak-EWMA of the time a forwarded request took there.
    service: PeakEwma,
    /// Requests this node forwarded there that have not ended.
    forwarded: Arc<Forwarded>,
    /// It refused a connection: not a candidate until its next report.
    down: bool,
}

impl PeerState {
    /// A candidate: its last report is younger than `stale` and it has
    /// not refused a connection since.
    fn fresh(&self, now: Instant, stale: Duration) -> bool {
        now.saturating_duration_since(self.seen) < stale && !self.down
    }
}

/// The peers a request may go to, and the one the host would choose.
#[derive(Debug, Clone, Default)]
pub struct Candidates {
    /// What the policy sees.
    pub features: Vec<PeerFeature>,
    /// `edgeroute_core::fleet::choose` over them.
    pub pick: Option<String>,
}

/// A known peer's state as `/metrics` shows it.
pub struct PeerLoad {
    pub name: String,
    pub fresh: bool,
    pub wait_ms: u32,
    pub open: u32,
}

pub struct Fleet {
    pub config: FleetConfig,
    token: String,
    zone_levels: Vec<Sensitivity>,
    peers: Mutex<BTreeMap<String, PeerState>>,
    /// Forwards and load polls; one pool of connections per thread.
    client: ClientPerThread,
    /// Zero of the peak-EWMA clock.
    epoch: Instant,
    audit: Arc<EgressAudit>,
    timeout: Duration,
    random: Mutex<u64>,
}

/// The requests this node has open at one peer.
#[derive(Default)]
struct Forwarded {
    /// All of them (`/metrics`).
    open: AtomicU32,
    /// Those sent since the peer's last report: the report does not count
    /// them yet, so the wait estimate adds them (the others are in it).
    unreported: AtomicU32,
    /// Reports taken from the peer so far: which report a request followed.
    reports: AtomicU64,
}

impl Forwarded {
    fn report_taken(&self) {
        self.reports.fetch_add(1, Ordering::Relaxed);
        self.unreported.store(0, Ordering::Relaxed);
    }
}

/// A forwarded request that has not ended: it counts in its peer's load
/// until dropped (a stream, until its last byte), and in this node's
/// estimate of the peer's wait until the peer reports again.
pub struct Open {
    forwarded: Arc<Forwarded>,
    /// `reports` when it was sent.
    after: u64,
}

impl Open {
    fn new(forwarded: &Arc<Forwarded>) -> Self {
        forwarded.open.fetch_add(1, Ordering::Relaxed);
        forwarded.unreported.fetch_add(1, Ordering::Relaxed);
        Self {
            forwarded: forwarded.clone(),
            after: forwarded.reports.load(Ordering::Relaxed),
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        let f = &self.forwarded;
        f.open.fetch_sub(1, Ordering::Relaxed);
        if f.reports.load(Ordering::Relaxed) == self.after {
            let _ = f
                .unreported
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        }
    }
}

/// A new peer's service time before it has served anything of ours: one
/// short generation on this hardware (`edgeroute bench`).
const DEFAULT_SERVICE_MS: f64 = 1000.0;
/// How long a slow sample keeps weight in the peak-EWMA.
const SERVICE_DECAY_MS: f64 = 10_000.0;

impl Fleet {
    /// `token`: the fleet's shared secret (`FleetConfig::token`).
    pub fn new(
        config: FleetConfig,
        token: String,
        zone_levels: Vec<Sensitivity>,
        audit: Arc<EgressAudit>,
        timeout: Duration,
    ) -> anyhow::Result<Self> {
        let mut seed = [0u8; 8];
        getrandom::fill(&mut seed).map_err(|e| anyhow::anyhow!("no random seed: {e}"))?;
        Ok(Self {
            token,
            zone_levels,
            peers: Mutex::default(),
            client: {
                let connect_timeout = Duration::from_millis(config.stale_ms);
                ClientPerThread::new(move || {
                    reqwest::Client::builder()
                        .tcp_nodelay(true)
                        .connect_timeout(connect_timeout)
                        .build()
                })?
            },
            epoch: Instant::now(),
            audit,
            timeout,
            random: Mutex::new(u64::from_le_bytes(seed) | 1),
            config,
        })
    }

    pub fn name(&self) -> &str {
        &self.config.node
    }

    /// Whether a presented fleet token is this fleet's, in constant time.
    pub fn authorize(&self, presented: &str) -> bool {
        crate::tenants::same_secret(presented, &self.token)
    }

    fn now_ms(&self) -> f64 {
        self.epoch.elapsed().as_secs_f64() * 1e3
    }

    fn peers(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, PeerState>> {
        self.peers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Take a peer's report (from Redis or its `/fleet/load`).
    pub fn accept(&self, report: Report) {
        if report.node == self.config.node {
            return;
        }
        let now = self.now_ms();
        let mut peers = self.peers();
        let state = peers
            .entry(report.node.clone())
            .or_insert_with(|| PeerState {
                name: report.node.as_str().into(),
                report: report.clone(),
                seen: Instant::now(),
                service: PeakEwma::new(DEFAULT_SERVICE_MS, SERVICE_DECAY_MS, now),
                forwarded: Arc::default(),
                down: false,
            });
        // The store is read every report_ms whether or not the peer wrote
        // since: only a new report counts what was sent before it.
        if state.report.at_ms != report.at_ms {
            state.forwarded.report_taken();
        }
        state.report = report;
        state.seen = Instant::now();
        state.down = false;
    }

    /// A peer refused the connection: not a candidate until it reports again.
    pub fn mark_down(&self, name: &str) {
        if let Some(state) = self.peers().get_mut(name) {
            state.down = true;
        }
    }

    /// Count a request forwarded to `name` until the guard is dropped.
    fn open(&self, name: &str) -> Option<(Open, String, bool)> {
        let peers = self.peers();
        let state = peers.get(name)?;
        Some((
            Open::new(&state.forwarded),
            state.report.url.clone(),
            state.report.zone == self.config.zone,
        ))
    }

    /// A forwarded request to `name` took `ms` to its end.
    fn observe(&self, name: &str, ms: f64) {
        let now = self.now_ms();
        if let Some(state) = self.peers().get_mut(name) {
            state.service.observe(ms, now);
        }
    }

    /// Whether a level may go to a peer of this node's zone although it
    /// may not leave the node for the cloud.
    pub fn zone_allows(&self, level: Sensitivity) -> bool {
        self.zone_levels.contains(&level)
    }

    fn random(&self, n: usize) -> usize {
        // xorshift64*: enough for picking two of n peers.
        let mut x = self.random.lock().unwrap_or_else(|p| p.into_inner());
        *x ^= *x >> 12;
        *x ^= *x << 25;
        *x ^= *x >> 27;
        (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n.max(1)
    }

    /// The peers `facts`' request may go to now, and the host's choice.
    pub fn candidates(
        &self,
        facts: &Facts,
        budget_ms: Option<u32>,
        session: Option<&str>,
    ) -> Candidates {
        let stale = Duration::from_millis(self.config.stale_ms);
        let now = Instant::now();
        let peers = self.peers();
        let fresh: Vec<(&String, &PeerState)> =
            peers.iter().filter(|(_, s)| s.fresh(now, stale)).collect();
        let mut out = Candidates::default();
        let mut waits = Vec::new();
        for (name, state) in &fresh {
            let view = PeerView {
                name,
                same_zone: state.report.zone == self.config.zone,
            };
            if state.report.full || !facts.may_go_to(&view) {
                continue;
            }
            // The peer's own generation time once it has measured one;
            // until then the peak-EWMA of what it took for this node.
            let service = match state.report.service_ms {
                0 => state.service.get(),
                ms => f64::from(ms),
            };
            let wait = fleet::estimated_wait_ms(
                f64::from(state.report.wait_ms),
                state.report.queue,
                state.forwarded.unreported.load(Ordering::Relaxed),
                state.report.slots,
                service,
            );
            waits.push(wait);
            out.features.push(PeerFeature {
                name: state.name.clone(),
                wait_ms: wait.round().min(f64::from(u32::MAX)) as u32,
                same_zone: view.same_zone,
                session_home: false,
            });
        }
        // Every live node's name, this one included, so a session's home
        // is the same whichever node is asked.
        let mut everyone: Vec<&str> = fresh.iter().map(|(n, _)| n.as_str()).collect();
        everyone.push(self.name());
        let candidates: Vec<Candidate> = out
            .features
            .iter()
            .zip(&waits)
            .map(|(f, &wait_ms)| Candidate {
                name: &f.name,
                wait_ms,
            })
            .collect();
        let ask = Ask {
            budget_ms: budget_ms.map(f64::from),
            session: session.map(|key| (key, everyone.as_slice())),
            session_bound_ms: f64::from(self.config.session_bound_ms),
        };
        let home = fleet::session_home(&ask, &candidates);
        let pick = match self.config.choice {
            PeerChoice::LoadAware => fleet::choose(&ask, &candidates, &mut |n| self.random(n)),
            PeerChoice::Random | PeerChoice::RandomWithinBudget if candidates.is_empty() => None,
            PeerChoice::Random => Some(self.random(candidates.len())),
            PeerChoice::RandomWithinBudget => {
                let i = self.random(candidates.len());
                ask.fits(candidates[i].wait_ms).then_some(i)
            }
        };
        let pick = pick.map(|i| candidates[i].name.to_string());
        drop(candidates);
        if let Some(home) = home {
            out.features[home].session_home = true;
        }
        out.pick = pick;
        out
    }

    /// Every known peer's state, for `/metrics`.
    pub fn peer_loads(&self) -> Vec<PeerLoad> {
        let stale = Duration::from_millis(self.config.stale_ms);
        self.peers()
            .iter()
            .map(|(name, s)| PeerLoad {
                name: name.clone(),
                fresh: s.fresh(Instant::now(), stale),
                wait_ms: s.report.wait_ms,
                open: s.forwarded.open.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// What `/healthz` shows of the fleet.
    pub fn status(&self) -> serde_json::Value {
        let stale = Duration::from_millis(self.config.stale_ms);
        let peers: Vec<serde_json::Value> = self
            .peers()
            .iter()
            .map(|(name, s)| {
                serde_json::json!({
                    "name": name,
                    "zone": s.report.zone,
                    "wait_ms": s.report.wait_ms,
                    "full": s.report.full,
                    "open": s.forwarded.open.load(Ordering::Relaxed),
                    "age_ms": s.seen.elapsed().as_millis() as u64,
                    "fresh": s.fresh(Instant::now(), stale),
                })
            })
            .collect();
        serde_json::json!({
            "node": self.config.node,
            "zone": self.config.zone,
            "store": if self.config.redis.is_some() { "redis" } else { "http" },
            // Levels that may reach a peer of this zone but not the cloud.
            "zone_levels": self.zone_levels.iter().map(|l| l.name()).collect::<Vec<_>>(),
            "peers": peers,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fleet(choice: &str) -> Fleet {
        let config: FleetConfig = toml::from_str(&format!(
            "node = \"here\"\nzone = \"site-a\"\nurl = \"http://127.0.0.1:1\"\nstale_ms = 600000\nchoice = \"{choice}\"\n"
        ))
        .unwrap();
        Fleet::new(
            config,
            "fleet-token-for-unit-tests".into(),
            vec![Sensitivity::Restricted],
            Arc::default(),
            Duration::from_secs(1),
        )
        .unwrap()
    }

    fn report(node: &str, zone: &str, at_ms: u64) -> Report {
        Report {
            node: node.into(),
            zone: zone.into(),
            url: "http://127.0.0.1:1".into(),
            // Two generations of 1000 ms in its two slots.
            wait_ms: 500,
            queue: 2,
            running: 2,
            full: false,
            slots: 2,
            service_ms: 1000,
            kv_free_tokens: 0,
            models: Vec::new(),
            at_ms,
        }
    }

    /// The blind baseline is blind to load, not to the guard: restricted
    /// data is only ever offered a peer of its own zone, and a level that
    /// may not stay in the zone is offered none.
    #[test]
    fn a_random_pick_stays_among_the_peers_the_guard_allows() {
        let fleet = fleet("random");
        fleet.accept(report("same", "site-a", 1));
        fleet.accept(report("other", "site-b", 1));
        let mut zoned = Facts::of_level(Sensitivity::Restricted, false);
        zoned.may_stay_in_zone = true;
        for _ in 0..200 {
            let c = fleet.candidates(&zoned, None, None);
            assert_eq!(c.pick.as_deref(), Some("same"));
            assert!(c.features.iter().all(|p| &*p.name == "same"));
        }
        let kept = Facts::of_level(Sensitivity::Restricted, false);
        let c = fleet.candidates(&kept, None, None);
        assert!(c.pick.is_none() && c.features.is_empty(), "{c:?}");
        // Public data may go to either, and over many picks goes to both.
        let public = Facts::of_level(Sensitivity::Public, true);
        let picks: std::collections::BTreeSet<_> = (0..200)
            .filter_map(|_| fleet.candidates(&public, None, None).pick)
            .collect();
        assert_eq!(picks.len(), 2, "{picks:?}");
    }

    /// The budget-keeping baseline picks at random and keeps the pick only
    /// when its wait fits: a busy peer is sometimes drawn and then none is
    /// taken, though an idle one was there (what load-aware avoids).
    #[test]
    fn a_random_pick_within_budget_is_dropped_when_its_wait_does_not_fit() {
        // An idle peer, and one whose wait is far over a 5 s budget.
        let with_peers = |choice: &str| {
            let fleet = fleet(choice);
            fleet.accept(report("idle", "site-a", 1));
            let mut busy = report("busy", "site-a", 1);
            busy.wait_ms = 60_000;
            busy.queue = 8;
            fleet.accept(busy);
            fleet
        };
        let fleet = with_peers("random-within-budget");
        let public = Facts::of_level(Sensitivity::Public, true);
        let picks: Vec<Option<String>> = (0..200)
            .map(|_| fleet.candidates(&public, Some(5_000), None).pick)
            .collect();
        assert!(
            picks.iter().all(|p| p.as_deref() != Some("busy")),
            "{picks:?}"
        );
        assert!(picks.iter().any(|p| p.as_deref() == Some("idle")));
        assert!(picks.iter().any(Option::is_none));
        // Without a budget any pick is kept.
        assert!((0..50).all(|_| fleet.candidates(&public, None, None).pick.is_some()));
        // Load-aware takes the idle one every time.
        let aware = with_peers("load-aware");
        assert!(
            (0..50).all(
                |_| aware.candidates(&public, Some(5_000), None).pick.as_deref() == Some("idle")
            )
        );
    }

    /// A request sent since the peer's last report adds its queueing to
    /// the estimate until a new report (not a re-read of the same one)
    /// counts it.
    #[test]
    fn only_a_new_report_absorbs_what_was_sent_since() {
        let fleet = fleet("load-aware");
        fleet.accept(report("peer", "site-a", 1));
        let public = Facts::of_level(Sensitivity::Public, true);
        let wait = |f: &Fleet| f.candidates(&public, None, None).features[0].wait_ms;
        // Both slots busy: a newcomer waits one interval (1000 / 2).
        assert_eq!(wait(&fleet), 500);
        let (sent, _, _) = fleet.open("peer").unwrap();
        assert_eq!(wait(&fleet), 1000);
        fleet.accept(report("peer", "site-a", 1));
        assert_eq!(wait(&fleet), 1000, "the same report read again");
        fleet.accept(report("peer", "site-a", 2));
        assert_eq!(wait(&fleet), 500, "a new report counts it");
        drop(sent);
        assert_eq!(wait(&fleet), 500);
    }
}
