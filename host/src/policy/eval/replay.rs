//! `edgeroute policy replay LOG candidate.wasm`: how a candidate policy
//! would have done on the traffic a node logged (`decisions.rs`), before
//! anyone swaps it in.
//!
//! Each logged request has the features the live policy saw, the plan it
//! chose with its propensity, and the outcome. Its reward is the same
//! trade-off the bandit learns: quality (the client's feedback when there
//! is one; else 0 for a failure, the local model's confidence for a local
//! answer, `cloud_quality` for a cloud one) − `cost_weight` × cost in
//! milli-dollars − `latency_weight` × seconds over the budget (or over
//! `latency_target_ms` without one). The candidate is asked for a plan on
//! the same features; when it agrees with the logged plan it is also told
//! the outcome (`observe`), so a learning candidate learns as it would
//! have live. Three estimates of its mean reward:
//!
//! - IPS (inverse propensity): the logged rewards where it agrees, each
//!   weighted by 1/propensity. Unbiased when every plan it picks had a
//!   chance to be logged; a deterministic live policy (propensity 1)
//!   leaves the other plans unseen, and the agreement rate says how much
//!   of the traffic the estimate covers.
//! - DM (direct method): the mean logged reward of the plan it picks
//!   (the overall mean for a plan never logged).
//! - DR (doubly robust): DM, corrected by IPS where it agrees; right when
//!   either the propensities or the reward model are.

use super::super::PolicyVersion;
use crate::decisions::{Decided, Line};
use crate::policy::convert::label;
use edgeroute_core::Outcome;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

/// The reward's weights; the defaults are the bandit's.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct Weights {
    /// Reward lost per milli-dollar of cloud cost.
    #[arg(long, default_value_t = 1.0)]
    pub cost_weight: f64,
    /// Reward lost per second over the latency budget.
    #[arg(long, default_value_t = 0.2)]
    pub latency_weight: f64,
    /// The budget of requests that did not give one.
    #[arg(long, default_value_t = 2000.0)]
    pub latency_target_ms: f64,
    /// The quality assumed for a cloud answer without feedback.
    #[arg(long, default_value_t = 0.8)]
    pub cloud_quality: f64,
}

impl Weights {
    pub fn reward(&self, d: &Decided, feedback: Option<f32>) -> f64 {
        let o = &d.outcome;
        let local = o
            .served_by
            .as_deref()
            .is_some_and(|s| s.starts_with("local:"));
        let quality = match (o.ok, feedback) {
            (false, _) => 0.0,
            (true, Some(score)) => score.clamp(0.0, 1.0) as f64,
            (true, None) if local => o.confidence.map_or(0.5, f64::from),
            (true, None) => self.cloud_quality,
        };
        let target = d
            .features
            .latency_budget_ms
            .map_or(self.latency_target_ms, f64::from);
        let over_s = (o.latency_ms as f64 - target).max(0.0) / 1000.0;
        quality - self.cost_weight * o.cost_micro_usd as f64 / 1000.0 - self.latency_weight * over_s
    }
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub records: usize,
    /// Share of requests where the candidate chose the logged plan.
    pub agreement: f64,
    /// The live policy's mean reward.
    pub logged: f64,
    pub ips: f64,
    pub dm: f64,
    pub dr: f64,
    pub logged_plans: BTreeMap<String, u64>,
    pub candidate_plans: BTreeMap<String, u64>,
    /// True when some logged decision had no propensity (a deterministic
    /// live policy): IPS then only covers where the candidate agrees.
    pub deterministic_logging: bool,
}

/// Read a log: decisions in order, and the last feedback for each id.
pub fn read(text: &str) -> anyhow::Result<(Vec<Decided>, HashMap<String, f32>)> {
    let (mut decided, mut feedback) = (Vec::new(), HashMap::new());
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        match serde_json::from_str::<Line>(line)
            .map_err(|e| anyhow::anyhow!("line {}: not a decision-log line: {e}", n + 1))?
        {
            Line::Decision(d) => decided.push(*d),
            Line::Feedback {
                id,
                feedback: score,
            } => {
                feedback.insert(id, score);
            }
        }
    }
    Ok((decided, feedback))
}

pub async fn replay(
    candidate: &PolicyVersion,
    decided: &[Decided],
    feedback: &HashMap<String, f32>,
    weights: &Weights,
) -> anyhow::Result<Report> {
    anyhow::ensure!(!decided.is_empty(), "the log has no decisions to replay");
    let rewards: Vec<f64> = decided
        .iter()
        .map(|d| weights.reward(d, feedback.get(&d.id).copied()))
        .collect();
    let n = decided.len() as f64;
    let logged = rewards.iter().sum::<f64>() / n;
    // The reward model of the direct method: each plan's mean logged reward.
    let mut per_plan: HashMap<&str, (f64, u64)> = HashMap::new();
    for (d, r) in decided.iter().zip(&rewards) {
        let entry = per_plan.entry(d.decision.as_str()).or_default();
        entry.0 += r;
        entry.1 += 1;
    }
    let model = |plan: &str| {
        per_plan
            .get(plan)
            .map_or(logged, |(sum, k)| sum / *k as f64)
    };

    let mut report = Report {
        records: decided.len(),
        agreement: 0.0,
        logged,
        ips: 0.0,
        dm: 0.0,
        dr: 0.0,
        logged_plans: BTreeMap::new(),
        candidate_plans: BTreeMap::new(),
        deterministic_logging: false,
    };
    let mut agreed = 0usize;
    for (d, &r) in decided.iter().zip(&rewards) {
        let chosen = label(&candidate.route(&d.features).await);
        *report.logged_plans.entry(d.decision.clone()).or_default() += 1;
        *report.candidate_plans.entry(chosen.clone()).or_default() += 1;
        let p = match d.propensity {
            Some(p) if p > 0.0 => p as f64,
            _ => {
                report.deterministic_logging = true;
                1.0
            }
        };
        let estimate = model(&chosen);
        report.dm += estimate;
        report.dr += estimate;
        if chosen == d.decision {
            agreed += 1;
            report.ips += r / p;
            report.dr += (r - model(&d.decision)) / p;
            candidate
                .observe(&outcome(d, feedback.get(&d.id).copied()))
                .await;
        }
    }
    report.agreement = agreed as f64 / n;
    report.ips /= n;
    report.dm /= n;
    report.dr /= n;
    Ok(report)
}

/// The logged outcome in the form `observe` takes.
fn outcome(d: &Decided, feedback: Option<f32>) -> Outcome {
    d.outcome.outcome(&d.id, feedback)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decisions::Logged;

    fn decided(plan: &str, served: &str, cost: u64, confidence: Option<f32>) -> Decided {
        Decided {
            id: format!("{plan}-{cost}"),
            policy: "p".into(),
            features: Default::default(),
            decision: plan.into(),
            propensity: Some(0.5),
            outcome: Logged {
                served_by: Some(served.into()),
                ok: true,
                latency_ms: 100,
                prompt_tokens: 10,
                completion_tokens: 5,
                cost_micro_usd: cost,
                confidence,
            },
            at_ms: None,
        }
    }

    #[test]
    fn rewards_follow_the_stated_weights() {
        let w = Weights {
            cost_weight: 1.0,
            latency_weight: 0.2,
            latency_target_ms: 2000.0,
            cloud_quality: 0.8,
        };
        let local = decided("local:smollm2", "local:smollm2", 0, Some(0.6));
        assert!((w.reward(&local, None) - 0.6).abs() < 1e-6);
        assert!((w.reward(&local, Some(0.9)) - 0.9).abs() < 1e-6);
        let cloud = decided("cloud:frontier", "cloud:frontier", 300, None);
        assert!((w.reward(&cloud, None) - 0.5).abs() < 1e-9);
        let mut slow = cloud.clone();
        slow.outcome.latency_ms = 4000;
        assert!((w.reward(&slow, None) - 0.1).abs() < 1e-9);
        let mut failed = cloud;
        failed.outcome.ok = false;
        assert!((w.reward(&failed, Some(1.0)) + 0.3).abs() < 1e-9);
    }

    #[test]
    fn a_log_reads_back_with_its_feedback() {
        let d = decided("local:smollm2", "local:smollm2", 0, Some(0.7));
        let text = [
            serde_json::to_string(&Line::Decision(Box::new(d.clone()))).unwrap(),
            serde_json::to_string(&Line::Feedback {
                id: d.id.clone(),
                feedback: 0.25,
            })
            .unwrap(),
        ]
        .join("\n");
        let (decided, feedback) = read(&text).unwrap();
        assert_eq!(decided.len(), 1);
        assert_eq!(feedback.get(&d.id), Some(&0.25));
        assert!(read("{\"nonsense\": 1}").is_err());
    }
}
