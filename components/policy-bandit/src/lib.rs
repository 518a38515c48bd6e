//! A learned routing policy: a contextual bandit over three plans — run
//! locally, run in the cloud, or a confidence cascade (local first, cloud
//! when unsure) — that learns from the outcomes the node reports.
//!
//! - Context: a few numbers from the features, never the text: prompt
//!   size, the share already in the local prefix cache, code, question,
//!   digits, other scripts, whether the local estimate fits the budget, the
//!   local wait; and the prompt's sentence embedding (which the policy
//!   asks the host for in `configure`), projected to 16 dimensions by a
//!   fixed random count sketch (distances between prompts are roughly
//!   kept, so prompts of a kind the local model gets wrong land near each
//!   other). `context` below.
//! - Model: LinUCB with one ridge regression per plan (the inverse of A
//!   kept up to date with Sherman–Morrison, so a decision is a few hundred
//!   multiplications), plus ε-greedy exploration whose probability is
//!   logged as the decision's `propensity`, so its choices can be evaluated
//!   off-policy (`edgeroute policy replay`).
//! - Reward, by stated weights: quality − `cost_weight` × cost in
//!   milli-dollars − `latency_weight` × seconds over the budget (or over
//!   `latency_target_ms` without one). Quality is what the node observed:
//!   0 for a failure; the local model's confidence for a local answer; the
//!   `cloud_quality` prior for a cloud answer, since the node cannot judge
//!   one itself. A later outcome for the same request (explicit feedback)
//!   replaces the quality with its score, correcting the earlier update.
//! - State: the regressions survive swaps and restarts (`snapshot` /
//!   `restore`, JSON with a version).
//!
//! Sensitive requests (`may-leave` false) always run locally: the guard
//! would overrule anything else, and learning from them teaches nothing.
//!
//! Parameters (`[policy.params]`), all optional: `local_model` ("smollm2"),
//! `cloud_upstream` ("frontier"), `exploration` (0.1), `ucb_alpha` (0.5),
//! `min_confidence` (0.5, the cascade's threshold), `cost_weight` (1.0),
//! `latency_weight` (0.2), `latency_target_ms` (2000), `cloud_quality`
//! (0.8), `use_embedding` (true; false: no embedding is asked for, and
//! those dimensions stay 0).

// The glue wit-bindgen generates for `observe` passes the outcome's fields
// as separate arguments.
#![allow(clippy::too_many_arguments)]

wit_bindgen::generate!({
    world: "stateful-policy",
    path: "../../wit/routing-0.2",
});

mod linucb;

use edgeroute::routing::types::{Cascade, Decision, Features, Needs, Outcome, Plan, Target};
use exports::edgeroute::routing::{router, state};
use linucb::{Arms, BASE, D};
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// The plans the bandit chooses between.
const PLANS: [&str; 3] = ["local", "cloud", "cascade"];

struct Config {
    local_model: String,
    cloud_upstream: String,
    exploration: f64,
    ucb_alpha: f64,
    min_confidence: f32,
    cost_weight: f64,
    latency_weight: f64,
    latency_target_ms: f64,
    cloud_quality: f64,
    use_embedding: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            local_model: "smollm2".into(),
            cloud_upstream: "frontier".into(),
            exploration: 0.1,
            ucb_alpha: 0.5,
            min_confidence: 0.5,
            cost_weight: 1.0,
            latency_weight: 0.2,
            latency_target_ms: 2000.0,
            cloud_quality: 0.8,
            use_embedding: true,
        }
    }
}

impl Config {
    fn from_params(params: Vec<(String, String)>) -> Result<Self, String> {
        let mut c = Config::default();
        for (key, value) in params {
            let number = |lo: f64, hi: f64| -> Result<f64, String> {
                let v: f64 = value
                    .trim()
                    .parse()
                    .map_err(|_| format!("{key} must be a number, got {value:?}"))?;
                if !(lo..=hi).contains(&v) {
                    return Err(format!("{key} must be from {lo} to {hi}, got {value:?}"));
                }
                Ok(v)
            };
            match key.as_str() {
                "local_model" => c.local_model = value.clone(),
                "cloud_upstream" => c.cloud_upstream = value.clone(),
                "exploration" => c.exploration = number(0.0, 1.0)?,
                "ucb_alpha" => c.ucb_alpha = number(0.0, 100.0)?,
                "min_confidence" => c.min_confidence = number(0.0, 1.0)? as f32,
                "cost_weight" => c.cost_weight = number(0.0, 1e6)?,
                "latency_weight" => c.latency_weight = number(0.0, 1e6)?,
                "latency_target_ms" => c.latency_target_ms = number(1.0, 1e7)?,
                "cloud_quality" => c.cloud_quality = number(0.0, 1.0)?,
                "use_embedding" => {
                    c.use_embedding = match value.trim() {
                        "true" => true,
                        "false" => false,
                        _ => return Err(format!("{key} must be true or false, got {value:?}")),
                    }
                }
                // Other policies share the params table.
                _ => {}
            }
        }
        Ok(c)
    }
}

/// What the bandit remembers of a request until its outcome (and a later
/// feedback) arrives.
struct Pending {
    plan: usize,
    context: [f64; D],
    budget_ms: Option<u32>,
    /// The reward already learned from, replaced by a later one.
    learned: Option<f64>,
}

/// Requests remembered for outcomes and feedback; older ones are dropped.
const PENDING: usize = 4096;

struct Bandit {
    config: Config,
    arms: Arms,
    pending: HashMap<String, Pending>,
    order: VecDeque<String>,
}

static BANDIT: Mutex<Option<Bandit>> = Mutex::new(None);

fn with_bandit<R>(f: impl FnOnce(&mut Bandit) -> R) -> R {
    let mut guard = BANDIT.lock().unwrap_or_else(|e| e.into_inner());
    let bandit = guard.get_or_insert_with(|| Bandit {
        config: Config::default(),
        arms: Arms::new(PLANS.len()),
        pending: HashMap::new(),
        order: VecDeque::new(),
    });
    f(bandit)
}

/// The context vector: bounded numbers, so no feature dominates.
fn context(f: &Features, use_embedding: bool) -> [f64; D] {
    let tokens = f.prompt_tokens.max(1) as f64;
    let fits = match (f.latency_budget_ms, &f.local_estimate) {
        (Some(budget), Some(e)) => (e.total_ms <= budget) as u8 as f64,
        _ => 1.0,
    };
    let base = [
        1.0,
        (tokens.ln() / 8.0).min(1.5),
        f.cached_prefix_tokens as f64 / tokens,
        f.text.code as u8 as f64,
        f.text.question as u8 as f64,
        (f.text.digits as f64 / (f.text.chars.max(1) as f64) * 5.0).min(1.0),
        f.text.non_ascii_permille as f64 / 1000.0,
        fits,
        (f.local_wait_ms as f64 / 10_000.0).min(1.0),
    ];
    let mut x = [0.0; D];
    x[..BASE].copy_from_slice(&base);
    if let (true, Some(embedding)) = (use_embedding, &f.embedding) {
        project(embedding, &mut x[BASE..]);
    }
    x
}

/// A fixed random projection of a (unit-length) embedding, as a count
/// sketch: each input is added, with a random sign, to one random output
/// (both from a hash of its index), so every instance and every replay
/// projects the same way. Inner products — how alike two prompts are — are
/// kept in expectation, at one hash and one add per input: a dense ±1
/// matrix cost 6 144 multiply-adds, most of a 30 µs route call in wasm.
/// Scaled by √16 so the outputs are of order 1, and clamped so an odd
/// vector cannot dominate.
fn project(embedding: &[f32], out: &mut [f64]) {
    out.iter_mut().for_each(|o| *o = 0.0);
    let k = out.len() as u64;
    if k == 0 {
        return;
    }
    let scale = (k as f64).sqrt();
    for (i, &v) in embedding.iter().enumerate() {
        let h = mix(i as u64);
        let sign = if h >> 63 == 0 { 1.0 } else { -1.0 };
        out[(h % k) as usize] += sign * v as f64;
    }
    out.iter_mut()
        .for_each(|o| *o = (*o * scale).clamp(-3.0, 3.0));
}

/// splitmix64's finaliser: a well-mixed bit from a small integer.
fn mix(mut h: u64) -> u64 {
    h = h.wrapping_add(0x9e37_79b9_7f4a_7c15);
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// A number in [0, 1) from the request id: exploration that a replay of
/// the same request reproduces.
fn uniform(seed: &str) -> f64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in seed.bytes() {
        h ^= byte as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    (h >> 11) as f64 / (1u64 << 53) as f64
}

impl Bandit {
    fn decide(&mut self, f: &Features) -> Decision {
        let c = &self.config;
        let local = Target::Local(c.local_model.clone());
        let cloud = Target::Cloud(c.cloud_upstream.clone());
        let fixed = |target: Target, reason: &str| Decision {
            plan: Plan::Run(target),
            reason: reason.into(),
            propensity: None,
        };
        if !f.may_leave {
            return fixed(local, "bandit: sensitive, stays local");
        }
        let local_ok = f.local_models.contains(&c.local_model);
        let cloud_ok = f.cloud_upstreams.contains(&c.cloud_upstream);
        match (local_ok, cloud_ok) {
            (true, true) => {}
            (false, true) => return fixed(cloud, "bandit: local model unavailable"),
            _ => return fixed(local, "bandit: cloud upstream unavailable"),
        }
        let x = context(f, c.use_embedding);
        let scores = self.arms.scores(&x, c.ucb_alpha);
        let greedy = (0..PLANS.len())
            .max_by(|&a, &b| scores[a].total_cmp(&scores[b]))
            .unwrap_or(0);
        let k = PLANS.len() as f64;
        let roll = uniform(&f.request_id);
        let (plan, propensity) = if roll < c.exploration {
            // Explore: uniformly, the greedy plan included.
            let plan = ((roll / c.exploration) * k) as usize % PLANS.len();
            let p = c.exploration / k
                + if plan == greedy {
                    1.0 - c.exploration
                } else {
                    0.0
                };
            (plan, p)
        } else {
            (greedy, 1.0 - c.exploration + c.exploration / k)
        };
        let min_confidence = c.min_confidence;
        self.remember(
            f.request_id.clone(),
            Pending {
                plan,
                context: x,
                budget_ms: f.latency_budget_ms,
                learned: None,
            },
        );
        let how = if plan == greedy { "best" } else { "exploring" };
        let reason = format!(
            "bandit: {} ({how}, score {:.2}, p={propensity:.2}, learned {})",
            PLANS[plan],
            scores[plan],
            self.arms.learned()
        );
        let plan = match plan {
            0 => Plan::Run(local),
            1 => Plan::Run(cloud),
            _ => Plan::Cascade(Cascade {
                first: local,
                then: cloud,
                min_confidence,
            }),
        };
        Decision {
            plan,
            reason,
            propensity: Some(propensity as f32),
        }
    }

    fn remember(&mut self, id: String, pending: Pending) {
        if self.pending.insert(id.clone(), pending).is_none() {
            self.order.push_back(id);
        }
        while self.order.len() > PENDING {
            if let Some(old) = self.order.pop_front() {
                self.pending.remove(&old);
            }
        }
    }

    /// The reward of an outcome, by the configured weights.
    fn reward(&self, o: &Outcome, budget_ms: Option<u32>) -> f64 {
        let c = &self.config;
        let quality = if !o.ok {
            0.0
        } else if let Some(score) = o.feedback {
            score.clamp(0.0, 1.0) as f64
        } else {
            match (&o.served_by, o.confidence) {
                (Some(Target::Local(_)), Some(confidence)) => confidence as f64,
                (Some(Target::Local(_)), None) => 0.5,
                _ => c.cloud_quality,
            }
        };
        let target = budget_ms.map_or(c.latency_target_ms, |b| b as f64);
        let over_s = (o.latency_ms as f64 - target).max(0.0) / 1000.0;
        let cost_milli_usd = o.cost_micro_usd as f64 / 1000.0;
        quality - c.cost_weight * cost_milli_usd - c.latency_weight * over_s
    }

    fn observe(&mut self, o: &Outcome) {
        let Some(pending) = self.pending.get(&o.request_id) else {
            return;
        };
        let (plan, x, budget, learned) = (
            pending.plan,
            pending.context,
            pending.budget_ms,
            pending.learned,
        );
        let reward = self.reward(o, budget);
        match learned {
            // A later outcome (feedback) replaces the reward learned before.
            Some(before) => self.arms.correct(plan, &x, reward - before),
            None => self.arms.learn(plan, &x, reward),
        }
        if let Some(pending) = self.pending.get_mut(&o.request_id) {
            pending.learned = Some(reward);
        }
    }
}

struct Policy;

impl router::Guest for Policy {
    fn configure(params: Vec<(String, String)>) -> Result<Needs, String> {
        let config = Config::from_params(params)?;
        let needs = if config.use_embedding {
            Needs::EMBEDDING
        } else {
            Needs::empty()
        };
        with_bandit(|b| b.config = config);
        Ok(needs)
    }

    fn route(features: Features) -> Decision {
        with_bandit(|b| b.decide(&features))
    }

    fn observe(outcome: Outcome) {
        with_bandit(|b| b.observe(&outcome));
    }
}

impl state::Guest for Policy {
    fn snapshot() -> Vec<u8> {
        with_bandit(|b| b.arms.to_json().into_bytes())
    }

    fn restore(state: Vec<u8>) -> Result<(), String> {
        let text = String::from_utf8(state).map_err(|_| "bandit state is not UTF-8".to_string())?;
        let arms = Arms::from_json(&text, PLANS.len())?;
        with_bandit(|b| b.arms = arms);
        Ok(())
    }
}

export!(Policy);

#[cfg(test)]
mod tests {
    use super::*;
    use edgeroute::routing::types::{Estimate, Sensitivity, TextStats};

    fn features(id: &str, tokens: u32) -> Features {
        Features {
            request_id: id.into(),
            requested_model: "auto".into(),
            prompt_tokens: tokens,
            cached_prefix_tokens: 0,
            max_tokens: 32,
            sensitivity: Sensitivity::Public,
            detected: vec![],
            may_leave: true,
            task: String::new(),
            latency_budget_ms: None,
            stream: false,
            message_count: 1,
            text: TextStats {
                chars: tokens * 4,
                words: tokens,
                digits: 0,
                code: false,
                question: true,
                non_ascii_permille: 0,
            },
            local_queue_depth: 0,
            local_running: 0,
            local_wait_ms: 0,
            local_estimate: Some(Estimate {
                ttft_ms: 100,
                total_ms: 500,
            }),
            cloud_estimates: vec![],
            local_models: vec!["smollm2".into()],
            cloud_upstreams: vec!["frontier".into()],
            peers: Vec::new(),
            peer_pick: None,
            embedding: None,
        }
    }

    /// A unit vector near one of two directions: two kinds of prompt.
    fn embedding(kind: usize, jitter: u64) -> Vec<f32> {
        let mut v: Vec<f32> = (0..384)
            .map(|i| {
                let base = if (i / 192) == kind { 1.0 } else { 0.0 };
                base + ((mix(jitter * 1000 + i as u64) % 100) as f32 - 50.0) / 500.0
            })
            .collect();
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.iter_mut().for_each(|x| *x /= norm);
        v
    }

    #[test]
    fn it_learns_which_kind_of_prompt_the_local_model_gets_wrong() {
        // Same size and text statistics; only the embedding tells the
        // kinds apart. Local answers kind 0 right and kind 1 wrong.
        let mut b = fresh();
        for i in 0..400u64 {
            let kind = (i % 2) as usize;
            let id = format!("t{i}");
            let mut f = features(&id, 30);
            f.embedding = Some(embedding(kind, i));
            let d = b.decide(&f);
            let served_local = plan_of(&d) != "cloud";
            let quality = if served_local && kind == 1 { 0.0 } else { 1.0 };
            b.observe(&outcome(&id, served_local, quality));
        }
        // Exploration (20 %) picks some other plan now and then.
        let mut stays = [0usize; 2];
        for (kind, stayed) in stays.iter_mut().enumerate() {
            for i in 0..40u64 {
                let mut f = features(&format!("held{kind}-{i}"), 30);
                f.embedding = Some(embedding(kind, 10_000 + i));
                *stayed += (plan_of(&b.decide(&f)) != "cloud") as usize;
            }
        }
        assert!(
            stays[0] >= 32,
            "kind 0 should stay local: {} of 40",
            stays[0]
        );
        assert!(
            stays[1] <= 8,
            "kind 1 should go to the cloud: {} of 40 stayed",
            stays[1]
        );
    }

    fn outcome(id: &str, local: bool, quality: f32) -> Outcome {
        Outcome {
            request_id: id.into(),
            served_by: Some(if local {
                Target::Local("smollm2".into())
            } else {
                Target::Cloud("frontier".into())
            }),
            ok: true,
            latency_ms: 400,
            prompt_tokens: 20,
            completion_tokens: 10,
            cost_micro_usd: if local { 0 } else { 300 },
            confidence: local.then_some(quality),
            feedback: None,
        }
    }

    fn fresh() -> Bandit {
        Bandit {
            config: Config {
                exploration: 0.2,
                ..Config::default()
            },
            arms: Arms::new(PLANS.len()),
            pending: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    fn plan_of(d: &Decision) -> &'static str {
        match &d.plan {
            Plan::Run(Target::Local(_)) => "local",
            Plan::Run(_) => "cloud",
            Plan::Cascade(_) => "cascade",
            Plan::Reject(_) => "reject",
        }
    }

    #[test]
    fn learns_that_unsure_local_answers_lose_to_the_cloud() {
        let mut b = fresh();
        // Short prompts: the local model is sure. Long ones: it is not.
        for i in 0..600 {
            let long = i % 2 == 1;
            let id = format!("r{i}");
            let f = features(&id, if long { 900 } else { 20 });
            let d = b.decide(&f);
            let local_quality = if long { 0.1 } else { 0.95 };
            let o = match plan_of(&d) {
                "local" => outcome(&id, true, local_quality),
                "cloud" => outcome(&id, false, 0.0),
                // An escalated cascade pays for the local try in latency.
                _ if long => Outcome {
                    latency_ms: 3000,
                    ..outcome(&id, false, 0.0)
                },
                // A confident local answer is not escalated.
                _ => outcome(&id, true, local_quality),
            };
            b.observe(&o);
        }
        b.config.exploration = 0.0;
        b.config.ucb_alpha = 0.0;
        // Short: local or a cascade that stays local (the same outcome).
        assert_ne!(plan_of(&b.decide(&features("short", 20))), "cloud");
        assert_eq!(plan_of(&b.decide(&features("long", 900))), "cloud");
    }

    #[test]
    fn propensities_are_probabilities_of_the_logged_choice() {
        let mut b = fresh();
        let mut explored = 0;
        for i in 0..400 {
            let d = b.decide(&features(&format!("p{i}"), 50));
            let p = d.propensity.unwrap();
            assert!(p > 0.0 && p <= 1.0, "{p}");
            if d.reason.contains("exploring") {
                explored += 1;
                assert!((p - 0.2 / 3.0).abs() < 1e-6, "{p}");
            }
        }
        // About 2/3 of the 20 % exploration picks a plan that is not the best.
        assert!((25..85).contains(&explored), "{explored}");
    }

    #[test]
    fn feedback_replaces_the_reward_it_corrects() {
        let mut a = fresh();
        let mut b = fresh();
        let f = features("x", 40);
        a.decide(&f);
        b.decide(&f);
        let mut first = outcome("x", true, 0.2);
        a.observe(&first);
        first.feedback = Some(0.9);
        a.observe(&first);
        // The same as having learned the feedback's reward only.
        b.observe(&first);
        assert_eq!(a.arms.to_json(), b.arms.to_json());
    }

    #[test]
    fn sensitive_requests_stay_local_and_are_not_explored() {
        let mut b = fresh();
        b.config.exploration = 1.0;
        let mut f = features("s", 10);
        f.may_leave = false;
        let d = b.decide(&f);
        assert_eq!((plan_of(&d), d.propensity), ("local", None));
    }

    #[test]
    fn state_round_trips_and_bad_state_is_refused() {
        let mut b = fresh();
        for i in 0..20 {
            let id = format!("s{i}");
            b.decide(&features(&id, 30));
            b.observe(&outcome(&id, true, 0.7));
        }
        let json = b.arms.to_json();
        let back = Arms::from_json(&json, PLANS.len()).unwrap();
        let x = context(&features("y", 30), true);
        for (a, b) in back.scores(&x, 0.5).iter().zip(b.arms.scores(&x, 0.5)) {
            assert!((a - b).abs() < 1e-9, "{a} vs {b}");
        }
        assert!(Arms::from_json("{}", PLANS.len()).is_err());
        assert!(Arms::from_json(&json, 2).is_err());
    }

    #[test]
    fn params_are_checked() {
        let p = |k: &str, v: &str| vec![(k.to_string(), v.to_string())];
        assert!(Config::from_params(p("exploration", "1.5")).is_err());
        assert!(Config::from_params(p("exploration", "lots")).is_err());
        assert_eq!(
            Config::from_params(p("exploration", "0.3"))
                .unwrap()
                .exploration,
            0.3
        );
    }
}
