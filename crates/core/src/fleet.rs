//! Choosing another node of the fleet for a request. Pure functions over
//! numbers, so the node and the fleet simulation (`edgeroute bench
//! --fleet-only`) run the same choice: the simulation on virtual time,
//! the node on the wall clock.
//!
//! Why not tower's `balance::p2c` and `load::PeakEwma`, which the issue
//! suggested: `p2c::Balance` owns its services and dispatches the call
//! itself, but here the choice must be made before anything is sent, shown
//! to the policy as a feature and checked by the guard; the candidate set
//! changes per request (trust zone, latency budget); and `PeakEwma`'s
//! `Cost` is opaque, so it cannot be added to the wait a peer reports.
//! The two algorithms are a few lines each; they are written here as
//! tower writes them (a random pair, the lower load; a peak-sensitive
//! EWMA that decays with time), with time passed in.

/// A peak-sensitive moving average of a peer's service time: a slower
/// sample is taken at once, faster ones pull it down with a time decay
/// (Finagle's and tower's peak EWMA). A peer that just got slow is avoided
/// at once; one that recovered wins its traffic back gradually.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PeakEwma {
    estimate_ms: f64,
    updated_ms: f64,
    /// How long a sample takes to lose 63 % of its weight.
    decay_ms: f64,
}

impl PeakEwma {
    pub fn new(default_ms: f64, decay_ms: f64, now_ms: f64) -> Self {
        Self {
            estimate_ms: default_ms,
            updated_ms: now_ms,
            decay_ms: decay_ms.max(1.0),
        }
    }

    pub fn observe(&mut self, sample_ms: f64, now_ms: f64) {
        if !sample_ms.is_finite() || sample_ms < 0.0 {
            return;
        }
        if sample_ms > self.estimate_ms {
            self.estimate_ms = sample_ms;
        } else {
            let elapsed = (now_ms - self.updated_ms).max(0.0);
            let keep = (-elapsed / self.decay_ms).exp();
            self.estimate_ms = self.estimate_ms * keep + sample_ms * (1.0 - keep);
        }
        self.updated_ms = now_ms;
    }

    pub fn get(&self) -> f64 {
        self.estimate_ms
    }
}

/// A peer's wait as this node estimates it: what the peer last reported
/// (up to a report interval old), plus what the requests this node
/// forwarded to it since that report and still open add (the report
/// cannot count them; a stream counts until it ends). They join the
/// `depth` the peer reported, on its `slots`, each taking `service_ms`:
/// one that finds a free slot adds nothing, one that queues adds one
/// slot-freeing interval (`estimate::queue_wait_ms`).
pub fn estimated_wait_ms(
    reported_wait_ms: f64,
    depth: u32,
    unreported: u32,
    slots: u32,
    service_ms: f64,
) -> f64 {
    let queued = |d: u32| crate::estimate::queue_wait_ms(d, slots, service_ms);
    reported_wait_ms.max(0.0) + queued(depth.saturating_add(unreported)) - queued(depth)
}

/// Power of two choices: two candidates at random, the one with the lower
/// load. Nearly as good as asking every node, and without the herd that
/// "always the least loaded" sends to one node between two load reports.
/// `random(n)` answers a uniform index below `n`.
pub fn power_of_two(loads: &[f64], random: &mut impl FnMut(usize) -> usize) -> Option<usize> {
    match loads.len() {
        0 => None,
        1 => Some(0),
        n => {
            let a = random(n) % n;
            let mut b = random(n - 1) % (n - 1);
            if b >= a {
                b += 1;
            }
            Some(if loads[b] < loads[a] { b } else { a })
        }
    }
}

/// Rendezvous (highest random weight) hashing: every node that knows the
/// same names ranks them the same way for a key, and removing one node
/// moves only the keys it held. The first is the key's home.
pub fn rendezvous_rank(key: &str, names: &[&str]) -> Vec<usize> {
    let key = fnv1a(key.as_bytes());
    let mut scored: Vec<(u64, usize)> = names
        .iter()
        .enumerate()
        .map(|(i, name)| (score(key, name), i))
        .collect();
    scored.sort_unstable_by(|a, b| b.cmp(a));
    scored.into_iter().map(|(_, i)| i).collect()
}

/// The first of [`rendezvous_rank`], in one pass (no sort).
pub fn rendezvous_home(key: &str, names: &[&str]) -> Option<usize> {
    let key = fnv1a(key.as_bytes());
    (0..names.len()).max_by_key(|&i| (score(key, names[i]), i))
}

fn score(key: u64, name: &str) -> u64 {
    mix(key ^ fnv1a(name.as_bytes()))
}

/// What the chooser needs to know about one peer the request may go to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate<'a> {
    pub name: &'a str,
    pub wait_ms: f64,
}

/// What the chooser needs to know about the request.
#[derive(Debug, Clone, Copy, Default)]
pub struct Ask<'a> {
    /// The client's latency budget: a peer whose wait does not fit is not
    /// a candidate.
    pub budget_ms: Option<f64>,
    /// An agent's session key and every node's name (this one included),
    /// so the session's home is the same whichever node is asked.
    pub session: Option<(&'a str, &'a [&'a str])>,
    /// A session's home is overloaded above this wait; the session then
    /// goes where the load is lowest like any request.
    pub session_bound_ms: f64,
}

impl Ask<'_> {
    /// Whether a peer with this wait may take the request (no budget: any).
    pub fn fits(&self, wait_ms: f64) -> bool {
        self.budget_ms.is_none_or(|b| wait_ms <= b)
    }
}

/// The peer a request should go to, if it leaves this node for the fleet:
/// its session's home when that is a candidate and not overloaded, else
/// the power-of-two choice among the peers whose wait fits the budget.
pub fn choose(
    ask: &Ask,
    candidates: &[Candidate],
    random: &mut impl FnMut(usize) -> usize,
) -> Option<usize> {
    let fits = |c: &Candidate| ask.fits(c.wait_ms);
    if let Some(home) = session_home(ask, candidates)
        && fits(&candidates[home])
        && candidates[home].wait_ms <= ask.session_bound_ms
    {
        return Some(home);
    }
    let eligible: Vec<usize> = (0..candidates.len())
        .filter(|&i| fits(&candidates[i]))
        .collect();
    let loads: Vec<f64> = eligible.iter().map(|&i| candidates[i].wait_ms).collect();
    power_of_two(&loads, random).map(|i| eligible[i])
}

/// The candidate that is the session's home, when the home is a peer (it
/// may be this node, or a node that is not a candidate for this request).
pub fn session_home(ask: &Ask, candidates: &[Candidate]) -> Option<usize> {
    let (key, everyone) = ask.session?;
    let home = everyone[rendezvous_home(key, everyone)?];
    candidates.iter().position(|c| c.name == home)
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// SplitMix64's finaliser: spreads FNV's weak low bits over the word.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic "random" source walking through indices.
    fn counter() -> impl FnMut(usize) -> usize {
        let mut next = 0usize;
        move |n| {
            next = next
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (next >> 33) % n
        }
    }

    #[test]
    fn two_choices_take_the_lower_load() {
        let mut random = |n: usize| n - 1;
        // a = 2 (last), b = 1 (n - 2 = 1, below a): load 5 < 9.
        assert_eq!(power_of_two(&[1.0, 5.0, 9.0], &mut random), Some(1));
        assert_eq!(power_of_two(&[], &mut random), None);
        assert_eq!(power_of_two(&[3.0], &mut random), Some(0));
        // Over many draws the most loaded of three is never chosen, and
        // both others are.
        let mut random = counter();
        let mut seen = [0u32; 3];
        for _ in 0..300 {
            seen[power_of_two(&[1.0, 5.0, 9.0], &mut random).unwrap()] += 1;
        }
        assert_eq!(seen[2], 0);
        assert!(seen[0] > seen[1] && seen[1] > 0, "{seen:?}");
    }

    #[test]
    fn peak_ewma_jumps_up_and_decays_down() {
        let mut e = PeakEwma::new(100.0, 1000.0, 0.0);
        e.observe(400.0, 10.0);
        assert_eq!(e.get(), 400.0);
        // A fast sample right away barely moves it; one much later does.
        e.observe(100.0, 20.0);
        assert!(e.get() > 390.0, "{}", e.get());
        e.observe(100.0, 10_000.0);
        assert!(e.get() < 101.0, "{}", e.get());
    }

    #[test]
    fn unreported_requests_add_only_the_queueing_they_cause() {
        // Nothing sent since the report: the report.
        assert_eq!(estimated_wait_ms(200.0, 5, 0, 4, 800.0), 200.0);
        // Two sent to a peer running one of four: a newcomer still finds
        // a free slot.
        assert_eq!(estimated_wait_ms(0.0, 1, 2, 4, 800.0), 0.0);
        // Three sent to one running three: six in four slots, so a
        // newcomer waits three slot-freeing intervals (800 / 4 each).
        assert_eq!(estimated_wait_ms(0.0, 3, 3, 4, 800.0), 600.0);
        // Already queueing: each one adds an interval on top of the report.
        assert_eq!(estimated_wait_ms(400.0, 6, 2, 4, 800.0), 800.0);
        // No slots reported counts as one; a negative report as none.
        assert_eq!(estimated_wait_ms(-5.0, 0, 2, 0, 800.0), 1600.0);
    }

    #[test]
    fn rendezvous_is_stable_and_moves_only_the_removed_nodes_keys() {
        let all = ["edge-1", "edge-2", "edge-3", "edge-4"];
        let without_3 = ["edge-1", "edge-2", "edge-4"];
        let mut moved = 0;
        let mut homes = [0u32; 4];
        for k in 0..400 {
            let key = format!("session-{k}");
            let home = all[rendezvous_rank(&key, &all)[0]];
            assert_eq!(
                rendezvous_home(&key, &all),
                Some(rendezvous_rank(&key, &all)[0])
            );
            homes[all.iter().position(|n| *n == home).unwrap()] += 1;
            assert_eq!(home, all[rendezvous_rank(&key, &all)[0]]);
            let after = without_3[rendezvous_rank(&key, &without_3)[0]];
            if home != "edge-3" {
                assert_eq!(home, after, "{key} moved although its home stayed");
            } else {
                moved += 1;
            }
        }
        // Roughly a quarter each.
        assert!(homes.iter().all(|&h| (60..140).contains(&h)), "{homes:?}");
        assert!(moved > 0);
    }

    #[test]
    fn choose_respects_budget_session_and_bound() {
        let peers = [
            Candidate {
                name: "edge-2",
                wait_ms: 100.0,
            },
            Candidate {
                name: "edge-3",
                wait_ms: 3000.0,
            },
        ];
        let mut random = counter();
        // A budget that only edge-2 fits.
        let ask = Ask {
            budget_ms: Some(1000.0),
            ..Ask::default()
        };
        for _ in 0..20 {
            assert_eq!(choose(&ask, &peers, &mut random), Some(0));
        }
        // Nothing fits: no peer.
        let tight = Ask {
            budget_ms: Some(50.0),
            ..Ask::default()
        };
        assert_eq!(choose(&tight, &peers, &mut random), None);
        // A session whose home is edge-3 goes there while it is under the
        // bound, and falls back to the lower load above it.
        let everyone = ["edge-1", "edge-2", "edge-3"];
        let key = (0..)
            .map(|k| format!("s{k}"))
            .find(|k| everyone[rendezvous_rank(k, &everyone)[0]] == "edge-3")
            .unwrap();
        let session = Ask {
            session: Some((&key, &everyone)),
            session_bound_ms: 5000.0,
            ..Ask::default()
        };
        assert_eq!(session_home(&session, &peers), Some(1));
        assert_eq!(choose(&session, &peers, &mut random), Some(1));
        let overloaded = Ask {
            session_bound_ms: 2000.0,
            ..session
        };
        assert_eq!(choose(&overloaded, &peers, &mut random), Some(0));
    }
}
