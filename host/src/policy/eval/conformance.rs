//! What every policy component must do, checked the same way by a node at
//! swap time (`probe`) and offline by `edgeroute policy check` (`check`):
//! answer within its deadline, never trap on valid features, name only
//! targets the node has, and — with the host's guard — never place data
//! that may not leave on a cloud target. `--reference` adds a table of the
//! decisions the reference (default) policy gives, for ports of it.

use crate::policy::PolicyVersion;
use crate::policy::convert::label;
use anyhow::bail;
use edgeroute_core::guard::{self, Facts, NodeView, OnPolicyFailure, PeerView, Placement};
use edgeroute_core::{Choice, Estimate, Features, Sensitivity, Target, TextStats};

/// The targets a node has, by name.
pub struct Targets {
    pub local: Vec<String>,
    pub cloud: Vec<String>,
}

/// Features with everything but the deciding fields at neutral values.
pub fn features(
    prompt_tokens: u32,
    sensitivity: Sensitivity,
    may_leave: bool,
    local: &[&str],
    cloud: &[&str],
) -> Features {
    Features {
        request_id: "conformance".into(),
        requested_model: "auto".into(),
        prompt_tokens,
        max_tokens: 64,
        sensitivity,
        detected: Vec::new(),
        may_leave,
        task: String::new(),
        latency_budget_ms: None,
        stream: false,
        message_count: 1,
        local_models: local.iter().map(|s| s.to_string()).collect(),
        cloud_upstreams: cloud.iter().map(|s| s.to_string()).collect(),
        ..Features::default()
    }
}

/// Up to two peers, as a node in a fleet would offer them.
fn random_peers(rng: &mut XorShift) -> Vec<edgeroute_core::PeerFeature> {
    let mut peers = Vec::new();
    for name in ["edge-2", "edge-3"] {
        if rng.below(2) == 0 {
            peers.push(edgeroute_core::PeerFeature {
                name: name.into(),
                wait_ms: rng.below(10_000) as u32,
                same_zone: rng.below(2) == 0,
                session_home: rng.below(4) == 0,
            });
        }
    }
    peers
}

/// A few ordinary requests a node asks a new policy before swapping it in.
fn canned() -> Vec<(&'static str, Features)> {
    use Sensitivity::*;
    let (l, c) = (&["smollm2"][..], &["frontier"][..]);
    vec![
        ("short public prompt", features(12, Public, true, l, c)),
        ("long public prompt", features(4000, Public, true, l, c)),
        ("restricted prompt", features(12, Restricted, false, l, c)),
        ("no local model", features(12, Public, true, &[], c)),
    ]
}

/// Swap-time probe: every canned request answered, no trap, no timeout.
pub async fn probe(version: &PolicyVersion) -> anyhow::Result<()> {
    for (what, f) in canned() {
        if let Err(failure) = version.route(&f).await {
            bail!("{what}: {failure}");
        }
    }
    Ok(())
}

/// `label`, features, expected target, expected reason — what the
/// reference policy answers with its default parameters (local_model
/// "smollm2", cloud_upstream "frontier", local_max_prompt_tokens 512).
fn reference_table() -> Vec<(&'static str, Features, &'static str, &'static str)> {
    use Sensitivity::*;
    let (l, c) = (&["smollm2"][..], &["frontier"][..]);
    vec![
        (
            "short public",
            features(12, Public, true, l, c),
            "local:smollm2",
            "short prompt (12 <= 512 tokens): local",
        ),
        (
            "at the threshold",
            features(512, Public, true, l, c),
            "local:smollm2",
            "short prompt (512 <= 512 tokens): local",
        ),
        (
            "just over",
            features(513, Public, true, l, c),
            "cloud:frontier",
            "long prompt (513 > 512 tokens): cloud",
        ),
        (
            "long internal that may leave",
            features(3000, Internal, true, l, c),
            "cloud:frontier",
            "long prompt (3000 > 512 tokens): cloud",
        ),
        (
            "long restricted",
            features(3000, Restricted, false, l, c),
            "local:smollm2",
            "sensitive: stays local",
        ),
        (
            "short restricted",
            features(5, Restricted, false, l, c),
            "local:smollm2",
            "sensitive: stays local",
        ),
        (
            "restricted, local missing",
            features(5, Restricted, false, &[], c),
            "local:smollm2",
            "sensitive: stays local",
        ),
        (
            "short, local missing",
            features(5, Public, true, &[], c),
            "cloud:frontier",
            "local model unavailable",
        ),
        (
            "long, cloud missing",
            features(3000, Public, true, l, &[]),
            "local:smollm2",
            "cloud upstream unavailable: local",
        ),
        (
            "short, nothing configured",
            features(5, Public, true, &[], &[]),
            "local:smollm2",
            "short prompt (5 <= 512 tokens): local",
        ),
    ]
}

/// A small deterministic generator, so a failing case can be replayed.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn subset(&mut self, names: &[String]) -> Vec<String> {
        names
            .iter()
            .filter(|_| self.below(2) == 0)
            .cloned()
            .collect()
    }
}

fn random_features(rng: &mut XorShift, targets: &Targets) -> Features {
    let sensitivity = [
        Sensitivity::Public,
        Sensitivity::Internal,
        Sensitivity::Restricted,
    ][rng.below(3) as usize];
    let may_leave = match sensitivity {
        Sensitivity::Restricted => false,
        Sensitivity::Internal => rng.below(2) == 0,
        Sensitivity::Public => true,
    };
    let mut features = Features {
        request_id: format!("random-{}", rng.next()),
        requested_model: "auto".into(),
        prompt_tokens: [rng.below(64), rng.below(1024), rng.below(100_000)][rng.below(3) as usize]
            as u32,
        max_tokens: 1 + rng.below(2048) as u32,
        sensitivity,
        detected: if rng.below(4) == 0 {
            vec!["email".into()]
        } else {
            Vec::new()
        },
        may_leave,
        task: ["", "classify", "extract", "chat"][rng.below(4) as usize].into(),
        latency_budget_ms: (rng.below(2) == 0).then(|| rng.below(5000) as u32),
        stream: rng.below(2) == 0,
        message_count: 1 + rng.below(40) as u32,
        text: TextStats {
            chars: rng.below(400_000) as u32,
            words: rng.below(80_000) as u32,
            digits: rng.below(1000) as u32,
            code: rng.below(2) == 0,
            question: rng.below(2) == 0,
            non_ascii_permille: rng.below(1001) as u32,
        },
        local_queue_depth: rng.below(16) as u32,
        local_running: rng.below(2) as u32,
        local_wait_ms: rng.below(60_000) as u32,
        local_estimate: (rng.below(2) == 0).then(|| random_estimate(rng)),
        cloud_estimates: random_estimates(rng, &targets.cloud),
        local_models: rng.subset(&targets.local),
        cloud_upstreams: rng.subset(&targets.cloud),
        peers: random_peers(rng),
        peer_pick: None,
        cached_prefix_tokens: 0,
        // A policy gets an embedding only when it asked, but one that asked
        // must cope with none (a node without the model) and odd sizes.
        embedding: match rng.below(3) {
            0 => None,
            1 => Some(random_unit_vector(rng, 384)),
            _ => {
                let dims = rng.below(1025) as usize;
                Some(random_unit_vector(rng, dims))
            }
        },
    };
    // The cache never holds more than the prompt.
    features.cached_prefix_tokens = rng.below(features.prompt_tokens as u64 + 1) as u32;
    features.peer_pick = features.peers.first().map(|p| p.name.to_string());
    features
}

fn random_unit_vector(rng: &mut XorShift, dims: usize) -> Vec<f32> {
    let v: Vec<f32> = (0..dims)
        .map(|_| rng.below(2001) as f32 / 1000.0 - 1.0)
        .collect();
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm == 0.0 {
        return v;
    }
    v.into_iter().map(|x| x / norm).collect()
}

fn random_estimates(rng: &mut XorShift, upstreams: &[String]) -> Vec<(String, Estimate)> {
    let mut estimates = Vec::new();
    for name in upstreams {
        if rng.below(2) == 0 {
            estimates.push((name.clone(), random_estimate(rng)));
        }
    }
    estimates
}

fn random_estimate(rng: &mut XorShift) -> Estimate {
    let ttft_ms = rng.below(20_000) as u32;
    Estimate {
        ttft_ms,
        total_ms: ttft_ms + rng.below(60_000) as u32,
    }
}

/// One line of a check report.
pub struct Finding {
    pub check: String,
    pub failure: Option<String>,
}

/// Run the whole suite; every finding is reported, not just the first.
pub async fn check(
    version: &PolicyVersion,
    targets: &Targets,
    reference: bool,
    random_cases: u32,
) -> Vec<Finding> {
    let mut findings = Vec::new();
    let mut record =
        |check: String, failure: Option<String>| findings.push(Finding { check, failure });

    // A peer is known when the features offered it.
    let known = |choice: &Choice, f: &Features| {
        let known_target = |t: &Target| match t {
            Target::Local(m) => targets.local.contains(m),
            Target::Cloud(u) => targets.cloud.contains(u),
            Target::Peer(p) => f.peers.iter().any(|peer| *peer.name == **p),
        };
        match choice {
            Choice::Run(t) => known_target(t),
            Choice::Cascade(c) => known_target(&c.first) && known_target(&c.then),
            Choice::Reject(_) => true,
        }
    };

    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let (mut failures, mut unknown, mut leaks) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..random_cases {
        let f = random_features(&mut rng, targets);
        let decision = version.route(&f).await;
        match &decision {
            Err(e) => failures.push(format!("case {i}: {e}")),
            Ok(d) if !known(&d.choice, &f) => {
                unknown.push(format!("case {i}: {}", label(&decision)))
            }
            Ok(_) => {}
        }
        let facts = Facts::of_level(f.sensitivity, f.may_leave);
        let peers: Vec<PeerView> = f
            .peers
            .iter()
            .map(|p| PeerView {
                name: &p.name,
                same_zone: p.same_zone,
            })
            .collect();
        let view = NodeView {
            local_models: &targets.local,
            default_local: targets.local.first().map(String::as_str),
            upstreams: &targets.cloud,
            on_policy_failure: OnPolicyFailure::Local,
            peers: &peers,
            peer_pick: f.peer_pick.as_deref(),
        };
        let placed = guard::place(decision, &facts, &view);
        let off_node = match &placed {
            Placement::Run { target, .. } => target.leaves_node(),
            Placement::Cascade { first, then, .. } => {
                first.leaves_node() || then.as_ref().is_some_and(Target::leaves_node)
            }
            Placement::Refuse(_) => false,
        };
        if !f.may_leave && off_node {
            leaks.push(format!("case {i}: {placed:?}"));
        }
    }
    let summarize = |v: Vec<String>| {
        (!v.is_empty()).then(|| format!("{} of {random_cases} cases, e.g. {}", v.len(), v[0]))
    };
    record(
        format!(
            "answers {random_cases} random valid requests within the deadline, without trapping"
        ),
        summarize(failures),
    );
    record("names only targets the node has".into(), summarize(unknown));
    record(
        "with the guard, data that may not leave never reaches a cloud target".into(),
        summarize(leaks),
    );

    if reference {
        for (what, f, target, reason) in reference_table() {
            let decision = version.route(&f).await;
            let failure = match &decision {
                Err(e) => Some(e.to_string()),
                Ok(d) if label(&decision) != target || d.reason != reason => Some(format!(
                    "expected {target} \"{reason}\", got {} \"{}\"",
                    label(&decision),
                    d.reason
                )),
                Ok(_) => None,
            };
            record(format!("reference: {what} → {target}"), failure);
        }
    }
    findings
}
