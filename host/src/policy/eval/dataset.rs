//! `edgeroute policy replay DATASET candidate.wasm`: a policy placed on a
//! labelled dataset, where every example says what each target would have
//! given (quality 0–1, latency, cost), so a router's choices can be scored
//! against all-local, all-cloud, random, a prompt-length threshold, a
//! confidence cascade and the oracle (`curve.rs` for the numbers).
//!
//! The host computes the features from the messages as a node would
//! (tokens with the local model's tokenizer and chat template, text
//! statistics, detection, the embedding when the candidate asks), the real
//! guard places the candidate's answer, and a learning candidate is told
//! only the outcome of the target it chose (`observe`, with the example's
//! quality as the feedback score): bandit feedback, as live. `--train`
//! replays a training split first, so the evaluation split is held out.
//!
//! One line per example:
//!
//! ```json
//! {"id": "capital-0007", "messages": [{"role": "user", "content": "…"}],
//!  "max_tokens": 24, "metadata": {"task": "qa"},
//!  "targets": {"local": {"quality": 1.0, "latency_ms": 412, "cost_usd": 0.0,
//!                        "confidence": 0.86},
//!              "cloud": {"quality": 1.0, "latency_ms": 580, "cost_usd": 4.2e-6}}}
//! ```
//!
//! A cascade is served as the node serves it: the local answer when its
//! confidence reaches the minimum, else the cloud's, after both latencies.

use super::curve::{Curve, Point};
use crate::detect::Detector;
use crate::policy::PolicyVersion;
use edgeroute_core::guard::{self, Facts, NodeView, OnPolicyFailure, Placement};
use edgeroute_core::{Features, Outcome, Sensitivity, Target, TextStats, Usage};
use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Deserialize)]
pub struct Example {
    pub id: String,
    pub messages: Vec<Message>,
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// `task`, `sensitivity`, as a client sends them.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    pub targets: Targets,
    /// For the per-category table; free text.
    #[serde(default)]
    pub category: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Targets {
    pub local: Observed,
    pub cloud: Observed,
}

/// What one target gave for one example.
#[derive(Debug, Clone, Copy, Deserialize)]
pub struct Observed {
    pub quality: f64,
    pub latency_ms: f64,
    pub cost_usd: f64,
    /// The local model's confidence in its answer (local only).
    #[serde(default)]
    pub confidence: Option<f32>,
}

/// Is this text a labelled dataset (rather than a decision log)?
pub fn looks_like_dataset(text: &str) -> bool {
    text.lines()
        .find(|l| !l.trim().is_empty())
        .and_then(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .is_some_and(|v| v.get("targets").is_some() && v.get("messages").is_some())
}

pub fn read(text: &str) -> anyhow::Result<Vec<Example>> {
    let examples = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(n, line)| {
            let e: Example = serde_json::from_str(line)
                .map_err(|e| anyhow::anyhow!("line {}: not a dataset example: {e}", n + 1))?;
            for o in [&e.targets.local, &e.targets.cloud] {
                anyhow::ensure!(
                    (0.0..=1.0).contains(&o.quality) && o.latency_ms >= 0.0 && o.cost_usd >= 0.0,
                    "line {}: quality must be 0 to 1, latency and cost not negative",
                    n + 1
                );
            }
            Ok(e)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    anyhow::ensure!(!examples.is_empty(), "the dataset has no examples");
    Ok(examples)
}

/// The node the dataset is replayed on: target names and the guard.
pub struct Setting {
    pub local: String,
    pub cloud: String,
    pub never_leave: Vec<Sensitivity>,
    /// None: `[guard] detect_pii = false`.
    pub detector: Option<Detector>,
}

/// An example with the features a node would have computed for it.
pub struct Prepared {
    pub example: Example,
    pub features: Features,
    pub facts: Facts,
}

/// Counts a chat's prompt tokens (role, content pairs).
pub type CountTokens<'a> = &'a dyn Fn(&[(String, String)]) -> u32;
/// A text's embedding, None when it cannot be made.
pub type Embed<'a> = &'a dyn Fn(&str) -> Option<Vec<f32>>;

/// `embed` only when the candidate needs embeddings.
pub fn prepare(
    examples: Vec<Example>,
    setting: &Setting,
    tokens: CountTokens<'_>,
    embed: Option<Embed<'_>>,
) -> Vec<Prepared> {
    examples
        .into_iter()
        .map(|example| {
            let messages: Vec<(String, String)> = example
                .messages
                .iter()
                .map(|m| (m.role.clone(), m.content.clone()))
                .collect();
            let mut sensitivity = example
                .metadata
                .get("sensitivity")
                .map_or(Sensitivity::Public, |l| Sensitivity::from_client_label(l));
            let detected: Vec<String> = setting.detector.as_ref().map_or(Vec::new(), |d| {
                d.scan(messages.iter().map(|(_, t)| t.as_str()))
                    .into_iter()
                    .map(String::from)
                    .collect()
            });
            if !detected.is_empty() {
                sensitivity = sensitivity.max(Sensitivity::Restricted);
            }
            let may_leave = !setting.never_leave.contains(&sensitivity);
            let last_user = messages.iter().rev().find(|(r, _)| r == "user");
            let features = Features {
                request_id: example.id.clone(),
                requested_model: "auto".into(),
                prompt_tokens: tokens(&messages),
                max_tokens: example.max_tokens.unwrap_or(128),
                sensitivity,
                detected,
                may_leave,
                task: example.metadata.get("task").cloned().unwrap_or_default(),
                message_count: messages.len() as u32,
                text: TextStats::of(&messages),
                local_models: vec![setting.local.clone()],
                cloud_upstreams: vec![setting.cloud.clone()],
                embedding: embed.and_then(|e| last_user.and_then(|(_, text)| e(text))),
                ..Features::default()
            };
            Prepared {
                example,
                features,
                facts: Facts::of_level(sensitivity, may_leave),
            }
        })
        .collect()
}

/// What serving one example under one placement gave.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Served {
    pub quality: f64,
    pub latency_ms: f64,
    pub cost_usd: f64,
    pub cloud: bool,
    pub escalated: bool,
    /// Where the answer came from; None when refused.
    pub by: Option<Which>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Which {
    Local,
    Cloud,
}

/// Serve one example as the node would after the guard's placement.
pub fn serve(example: &Example, placement: &Placement) -> Served {
    let (local, cloud) = (&example.targets.local, &example.targets.cloud);
    let run = |target: &Target| match target {
        Target::Local(_) => Some(Which::Local),
        Target::Cloud(_) => Some(Which::Cloud),
        // A single node has no peers; the guard does not place one here.
        Target::Peer(_) => None,
    };
    let only = |which: Option<Which>| match which {
        Some(Which::Local) => Served::from(local, false, Some(Which::Local)),
        Some(Which::Cloud) => Served::from(cloud, true, Some(Which::Cloud)),
        None => Served::refused(),
    };
    match placement {
        Placement::Run { target, .. } => only(run(target)),
        Placement::Refuse(_) => Served::refused(),
        Placement::Cascade {
            first,
            then,
            min_confidence,
            ..
        } => {
            let first_served = only(run(first));
            let sure = local.confidence.is_some_and(|c| c >= *min_confidence);
            match (run(first), then.as_ref().and_then(run)) {
                (Some(Which::Local), Some(Which::Cloud)) if !sure => Served {
                    latency_ms: local.latency_ms + cloud.latency_ms,
                    escalated: true,
                    ..Served::from(cloud, true, Some(Which::Cloud))
                },
                _ => first_served,
            }
        }
    }
}

impl Served {
    fn from(o: &Observed, cloud: bool, by: Option<Which>) -> Self {
        Served {
            quality: o.quality,
            latency_ms: o.latency_ms,
            cost_usd: o.cost_usd,
            cloud,
            escalated: false,
            by,
        }
    }

    fn refused() -> Self {
        Served {
            quality: 0.0,
            latency_ms: 0.0,
            cost_usd: 0.0,
            cloud: false,
            escalated: false,
            by: None,
        }
    }
}

/// Mean of a run's served examples.
pub fn point(setting: impl Into<String>, served: &[Served]) -> Point {
    let n = served.len().max(1) as f64;
    let mean = |f: &dyn Fn(&Served) -> f64| served.iter().map(f).sum::<f64>() / n;
    Point {
        setting: setting.into(),
        cloud_share: mean(&|s| s.cloud as u8 as f64),
        quality: mean(&|s| s.quality),
        cost_usd: mean(&|s| s.cost_usd),
        latency_ms: mean(&|s| s.latency_ms),
        escalated: mean(&|s| s.escalated as u8 as f64),
    }
}

/// A plan on both targets, for the baselines.
fn fixed(example: &Prepared, which: Which) -> Served {
    match which {
        // The guard keeps what may not leave local, whatever a baseline
        // would like.
        Which::Cloud if example.facts.may_leave => {
            Served::from(&example.example.targets.cloud, true, Some(Which::Cloud))
        }
        _ => Served::from(&example.example.targets.local, false, Some(Which::Local)),
    }
}

/// The routers every candidate is compared with, on the same examples.
pub struct Baselines {
    pub all_local: Point,
    pub all_cloud: Point,
    pub curves: Vec<Curve>,
}

pub fn baselines(examples: &[Prepared]) -> Baselines {
    let all_local = point(
        "all local",
        &examples
            .iter()
            .map(|e| fixed(e, Which::Local))
            .collect::<Vec<_>>(),
    );
    let all_cloud = point(
        "all cloud",
        &examples
            .iter()
            .map(|e| fixed(e, Which::Cloud))
            .collect::<Vec<_>>(),
    );
    let (lo, hi) = (all_local.quality, all_cloud.quality);
    let sweep = |name: &str, cutoffs: Vec<f64>, to_cloud: &dyn Fn(&Prepared, f64) -> Served| {
        let points = cutoffs
            .iter()
            .map(|&c| {
                let served: Vec<Served> = examples.iter().map(|e| to_cloud(e, c)).collect();
                point(format!("{c}"), &served)
            })
            .collect();
        Curve::new(name, points, lo, hi)
    };
    // Random: each request to the cloud with probability p; its expected
    // quality is the straight line between the two ends.
    let random = Curve::new(
        "random",
        (0..=10)
            .map(|i| {
                let p = i as f64 / 10.0;
                Point {
                    setting: format!("p={p}"),
                    cloud_share: p,
                    quality: lo + p * (hi - lo),
                    cost_usd: all_local.cost_usd + p * (all_cloud.cost_usd - all_local.cost_usd),
                    latency_ms: all_local.latency_ms
                        + p * (all_cloud.latency_ms - all_local.latency_ms),
                    escalated: 0.0,
                }
            })
            .collect(),
        lo,
        hi,
    );
    // The length threshold: prompts longer than the cutoff go to the cloud.
    let mut lengths: Vec<f64> = examples
        .iter()
        .map(|e| e.features.prompt_tokens as f64)
        .collect();
    lengths.push(-1.0);
    lengths.sort_by(f64::total_cmp);
    lengths.dedup();
    let threshold = sweep("length threshold", lengths, &|e, cutoff| {
        let cloud = e.features.prompt_tokens as f64 > cutoff;
        fixed(e, if cloud { Which::Cloud } else { Which::Local })
    });
    // The confidence cascade: local first, escalated below the minimum.
    let mut minimums: Vec<f64> = examples
        .iter()
        .filter_map(|e| e.example.targets.local.confidence.map(f64::from))
        .collect();
    minimums.extend([0.0, 1.01]);
    minimums.sort_by(f64::total_cmp);
    minimums.dedup();
    let cascade = sweep("confidence cascade", minimums, &|e, minimum| {
        let placement = Placement::Cascade {
            first: Target::Local(String::new()),
            then: e.facts.may_leave.then(|| Target::Cloud(String::new())),
            min_confidence: minimum as f32,
            reason: String::new(),
        };
        serve(&e.example, &placement)
    });
    // The oracle: knows both answers, and sends the examples where the
    // cloud gains most first.
    let mut by_gain: Vec<(f64, usize)> = examples
        .iter()
        .enumerate()
        .filter(|(_, e)| e.facts.may_leave)
        .map(|(i, e)| {
            (
                e.example.targets.cloud.quality - e.example.targets.local.quality,
                i,
            )
        })
        .filter(|(gain, _)| *gain > 0.0)
        .collect();
    by_gain.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut to_cloud = vec![false; examples.len()];
    let mut oracle_points = vec![];
    for k in 0..=by_gain.len() {
        if k > 0 {
            to_cloud[by_gain[k - 1].1] = true;
        }
        let served: Vec<Served> = examples
            .iter()
            .zip(&to_cloud)
            .map(|(e, &c)| fixed(e, if c { Which::Cloud } else { Which::Local }))
            .collect();
        oracle_points.push(point(format!("{k} sent"), &served));
    }
    let oracle = Curve::new("oracle", oracle_points, lo, hi);
    Baselines {
        all_local,
        all_cloud,
        curves: vec![random, threshold, cascade, oracle],
    }
}

/// The node the guard sees while a candidate is replayed.
pub struct Node<'a> {
    pub local_models: &'a [String],
    pub upstreams: &'a [String],
}

/// Run a candidate over the examples: route, guard, serve, observe.
pub async fn run(candidate: &PolicyVersion, examples: &[Prepared], node: &Node<'_>) -> Vec<Served> {
    let view = NodeView {
        local_models: node.local_models,
        default_local: node.local_models.first().map(String::as_str),
        upstreams: node.upstreams,
        on_policy_failure: OnPolicyFailure::Local,
        peers: &[],
        peer_pick: None,
    };
    let mut served = Vec::with_capacity(examples.len());
    for e in examples {
        let decision = candidate.route(&e.features).await;
        let placement = guard::place(decision, &e.facts, &view);
        let s = serve(&e.example, &placement);
        let by = match s.by {
            Some(Which::Local) => node.local_models.first().cloned().map(Target::Local),
            Some(Which::Cloud) => node.upstreams.first().cloned().map(Target::Cloud),
            None => None,
        };
        let local = &e.example.targets.local;
        candidate
            .observe(&Outcome {
                request_id: e.features.request_id.clone(),
                served_by: by.clone(),
                ok: by.is_some(),
                latency_ms: s.latency_ms.round() as u32,
                usage: Usage::default(),
                cost_micro_usd: (s.cost_usd * 1e6).round() as u64,
                // A local answer's confidence was measured; an escalated
                // one was measured too, before the cloud answered.
                confidence: (s.by == Some(Which::Local) || s.escalated)
                    .then_some(local.confidence)
                    .flatten(),
                feedback: by.is_some().then_some(s.quality as f32),
            })
            .await;
        served.push(s);
    }
    served
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example(local_q: f64, conf: f32, cloud_q: f64) -> Example {
        serde_json::from_value(serde_json::json!({
            "id": "x", "messages": [{"role": "user", "content": "hi"}],
            "targets": {
                "local": {"quality": local_q, "latency_ms": 100, "cost_usd": 0.0, "confidence": conf},
                "cloud": {"quality": cloud_q, "latency_ms": 500, "cost_usd": 0.001}
            }
        }))
        .unwrap()
    }

    #[test]
    fn a_cascade_escalates_below_the_minimum_only() {
        let cascade = |min: f32, then: bool| Placement::Cascade {
            first: Target::Local("m".into()),
            then: then.then(|| Target::Cloud("c".into())),
            min_confidence: min,
            reason: String::new(),
        };
        let e = example(0.0, 0.4, 1.0);
        let sure = serve(&e, &cascade(0.3, true));
        assert_eq!(
            (sure.quality, sure.cloud, sure.escalated),
            (0.0, false, false)
        );
        let unsure = serve(&e, &cascade(0.5, true));
        assert_eq!(
            (unsure.quality, unsure.cloud, unsure.escalated),
            (1.0, true, true)
        );
        assert_eq!(unsure.latency_ms, 600.0);
        assert_eq!(unsure.cost_usd, 0.001);
        // The guard dropped the cloud hop: the local answer is served.
        let kept = serve(&e, &cascade(0.5, false));
        assert_eq!((kept.quality, kept.cloud), (0.0, false));
    }

    #[test]
    fn baselines_on_a_tiny_dataset_are_exact() {
        // Local right on the two confident examples, wrong on the others.
        let examples = vec![
            example(1.0, 0.9, 1.0),
            example(1.0, 0.8, 1.0),
            example(0.0, 0.3, 1.0),
            example(0.0, 0.6, 1.0),
        ];
        let setting = Setting {
            local: "m".into(),
            cloud: "c".into(),
            never_leave: vec![Sensitivity::Restricted],
            detector: Some(crate::detect::detector(&Default::default()).unwrap()),
        };
        let prepared = prepare(examples, &setting, &|_| 10, None);
        let b = baselines(&prepared);
        assert_eq!(b.all_local.quality, 0.5);
        assert_eq!(b.all_cloud.quality, 1.0);
        let curve = |name: &str| b.curves.iter().find(|c| c.name == name).unwrap();
        assert!((curve("random").apgr.unwrap() - 0.5).abs() < 1e-12);
        // Oracle: (0,0) (0.25,0.5) (0.5,1) (1,1): 0.0625 + 0.1875 + 0.5.
        assert!((curve("oracle").apgr.unwrap() - 0.75).abs() < 1e-12);
        // Confidence separates right from wrong exactly here, so the
        // cascade's curve is the oracle's.
        assert!((curve("confidence cascade").apgr.unwrap() - 0.75).abs() < 1e-12);
        // Every prompt has the same length: the threshold is all or nothing.
        assert!((curve("length threshold").apgr.unwrap() - 0.5).abs() < 1e-12);
    }

    #[test]
    fn a_detected_secret_stays_local_even_for_the_oracle() {
        let mut e = example(0.0, 0.1, 1.0);
        e.messages[0].content = "my card is 4111111111111111".into();
        let setting = Setting {
            local: "m".into(),
            cloud: "c".into(),
            never_leave: vec![Sensitivity::Restricted],
            detector: Some(crate::detect::detector(&Default::default()).unwrap()),
        };
        let prepared = prepare(vec![e], &setting, &|_| 10, None);
        assert!(!prepared[0].facts.may_leave);
        let b = baselines(&prepared);
        assert_eq!(b.all_cloud.cloud_share, 0.0);
    }
}
