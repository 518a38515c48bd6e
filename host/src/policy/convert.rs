//! The one place where the policy worlds' WIT types and the host's
//! vocabulary (`edgeroute_core`) meet. Each `edgeroute:routing` version
//! has its conversions here: 0.1 (`v1`) and 0.2 (`v2`). A field an older
//! version lacks is not shown to it; one it cannot express is written in
//! its closest form (0.1's `served-by` is text).

use edgeroute_core::{Choice, Decision, Features, Needs, Outcome, Sensitivity, Target};

/// `edgeroute:routing@0.1.0`.
pub mod v1 {
    use super::*;
    use crate::bindings::policy as wit;
    use crate::bindings::policy::edgeroute::routing::types as t;

    pub fn sensitivity(level: Sensitivity) -> wit::Sensitivity {
        match level {
            Sensitivity::Public => wit::Sensitivity::Public,
            Sensitivity::Internal => wit::Sensitivity::Internal,
            Sensitivity::Restricted => wit::Sensitivity::Restricted,
        }
    }

    pub fn features(f: &Features) -> t::Features {
        t::Features {
            request_id: f.request_id.clone(),
            requested_model: f.requested_model.clone(),
            prompt_tokens: f.prompt_tokens,
            max_tokens: f.max_tokens,
            sensitivity: sensitivity(f.sensitivity),
            pii_detected: !f.detected.is_empty(),
            may_leave: f.may_leave,
            task: f.task.clone(),
            latency_budget_ms: f.latency_budget_ms,
            stream: f.stream,
            local_queue_depth: f.local_queue_depth,
            local_models: f.local_models.clone(),
            cloud_upstreams: f.cloud_upstreams.clone(),
        }
    }

    pub fn decision(decision: t::Decision) -> Decision {
        let choice = match decision.target {
            wit::Target::Local(model) => Choice::Run(Target::Local(model)),
            wit::Target::Cloud(upstream) => Choice::Run(Target::Cloud(upstream)),
            wit::Target::Reject(message) => Choice::Reject(message),
        };
        Decision {
            choice,
            reason: decision.reason,
            propensity: None,
        }
    }

    pub fn outcome(o: &Outcome) -> t::Outcome {
        t::Outcome {
            request_id: o.request_id.clone(),
            served_by: served_by(o.served_by.as_ref()),
            ok: o.ok,
            latency_ms: o.latency_ms,
            prompt_tokens: o.usage.prompt_tokens,
            completion_tokens: o.usage.completion_tokens,
            cost_micro_usd: o.cost_micro_usd,
        }
    }
}

/// `edgeroute:routing@0.2.0`.
pub mod v2 {
    use super::*;
    use crate::bindings::policy_v2 as wit;

    pub fn sensitivity(level: Sensitivity) -> wit::Sensitivity {
        match level {
            Sensitivity::Public => wit::Sensitivity::Public,
            Sensitivity::Internal => wit::Sensitivity::Internal,
            Sensitivity::Restricted => wit::Sensitivity::Restricted,
        }
    }

    fn target(target: &Target) -> wit::Target {
        match target {
            Target::Local(name) => wit::Target::Local(name.clone()),
            Target::Cloud(name) => wit::Target::Cloud(name.clone()),
            Target::Peer(name) => wit::Target::Peer(name.clone()),
        }
    }

    pub fn needs(needs: wit::Needs) -> Needs {
        Needs {
            embedding: needs.contains(wit::Needs::EMBEDDING),
        }
    }

    fn target_from(target: wit::Target) -> Target {
        match target {
            wit::Target::Local(name) => Target::Local(name),
            wit::Target::Cloud(name) => Target::Cloud(name),
            wit::Target::Peer(name) => Target::Peer(name),
        }
    }

    pub fn features(f: &Features) -> wit::Features {
        wit::Features {
            request_id: f.request_id.clone(),
            requested_model: f.requested_model.clone(),
            prompt_tokens: f.prompt_tokens,
            max_tokens: f.max_tokens,
            sensitivity: sensitivity(f.sensitivity),
            detected: f.detected.clone(),
            may_leave: f.may_leave,
            task: f.task.clone(),
            latency_budget_ms: f.latency_budget_ms,
            stream: f.stream,
            message_count: f.message_count,
            cached_prefix_tokens: f.cached_prefix_tokens,
            text: wit::TextStats {
                chars: f.text.chars,
                words: f.text.words,
                digits: f.text.digits,
                code: f.text.code,
                question: f.text.question,
                non_ascii_permille: f.text.non_ascii_permille,
            },
            local_queue_depth: f.local_queue_depth,
            local_running: f.local_running,
            local_wait_ms: f.local_wait_ms,
            local_estimate: f.local_estimate.map(estimate),
            cloud_estimates: f
                .cloud_estimates
                .iter()
                .map(|(name, e)| (name.clone(), estimate(*e)))
                .collect(),
            local_models: f.local_models.clone(),
            cloud_upstreams: f.cloud_upstreams.clone(),
            peers: f
                .peers
                .iter()
                .map(|p| wit::Peer {
                    name: p.name.to_string(),
                    wait_ms: p.wait_ms,
                    same_zone: p.same_zone,
                    session_home: p.session_home,
                })
                .collect(),
            peer_pick: f.peer_pick.clone(),
            embedding: f.embedding.clone(),
        }
    }

    fn estimate(e: edgeroute_core::Estimate) -> wit::Estimate {
        wit::Estimate {
            ttft_ms: e.ttft_ms,
            total_ms: e.total_ms,
        }
    }

    pub fn decision(decision: wit::Decision) -> Decision {
        let choice = match decision.plan {
            wit::Plan::Run(t) => Choice::Run(target_from(t)),
            wit::Plan::Cascade(c) => Choice::Cascade(edgeroute_core::Cascade {
                first: target_from(c.first),
                then: target_from(c.then),
                min_confidence: c.min_confidence,
            }),
            wit::Plan::Reject(message) => Choice::Reject(message),
        };
        Decision {
            choice,
            reason: decision.reason,
            // Only a probability is a propensity.
            propensity: decision
                .propensity
                .filter(|p| p.is_finite() && (0.0..=1.0).contains(p)),
        }
    }

    pub fn outcome(o: &Outcome) -> wit::Outcome {
        wit::Outcome {
            request_id: o.request_id.clone(),
            served_by: o.served_by.as_ref().map(target),
            ok: o.ok,
            latency_ms: o.latency_ms,
            prompt_tokens: o.usage.prompt_tokens,
            completion_tokens: o.usage.completion_tokens,
            cost_micro_usd: o.cost_micro_usd,
            confidence: o.confidence,
            feedback: o.feedback,
        }
    }
}

/// A target's text form, or `none` for a refused request (logs, 0.1's
/// `outcome.served-by`).
pub fn served_by(target: Option<&Target>) -> String {
    target.map_or_else(|| "none".to_string(), ToString::to_string)
}

/// A decision as a comparable label: the target's text form (the first hop
/// of a cascade, then `→` and the second), `reject`, or `failed` (shadow
/// tallies and conformance reports).
pub fn label<E>(decision: &Result<Decision, E>) -> String {
    match decision {
        Ok(d) => match &d.choice {
            Choice::Run(target) => target.to_string(),
            Choice::Cascade(c) => format!("{}→{}", c.first, c.then),
            Choice::Reject(_) => "reject".into(),
        },
        Err(_) => "failed".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bindings::policy as wit1;
    use crate::bindings::policy_v2 as wit2;

    #[test]
    fn both_versions_convert_to_the_same_decision() {
        let from_v1 = v1::decision(wit1::edgeroute::routing::types::Decision {
            target: wit1::Target::Cloud("frontier".into()),
            reason: "long".into(),
        });
        let from_v2 = v2::decision(wit2::Decision {
            plan: wit2::Plan::Run(wit2::Target::Cloud("frontier".into())),
            reason: "long".into(),
            propensity: None,
        });
        assert_eq!(
            from_v1,
            Decision::run(Target::Cloud("frontier".into()), "long")
        );
        assert_eq!(from_v1, from_v2);
        assert_eq!(label::<()>(&Ok(from_v1)), "cloud:frontier");
    }

    #[test]
    fn v2_carries_cascades_and_only_real_propensities() {
        let decision = v2::decision(wit2::Decision {
            plan: wit2::Plan::Cascade(wit2::Cascade {
                first: wit2::Target::Local("smollm2".into()),
                then: wit2::Target::Peer("edge-2".into()),
                min_confidence: 0.7,
            }),
            reason: "try local".into(),
            propensity: Some(1.5),
        });
        assert_eq!(decision.propensity, None);
        assert_eq!(label::<()>(&Ok(decision)), "local:smollm2→peer:edge-2");
    }

    #[test]
    fn outcomes_keep_what_each_version_can_say() {
        let outcome = Outcome {
            request_id: "r".into(),
            served_by: None,
            ok: false,
            latency_ms: 3,
            usage: Default::default(),
            cost_micro_usd: 0,
            confidence: Some(0.25),
            feedback: Some(0.5),
        };
        assert_eq!(v1::outcome(&outcome).served_by, "none");
        let v2 = v2::outcome(&outcome);
        assert!(v2.served_by.is_none());
        assert_eq!((v2.confidence, v2.feedback), (Some(0.25), Some(0.5)));
        let features = Features {
            detected: vec!["email".into()],
            ..Default::default()
        };
        assert!(v1::features(&features).pii_detected);
    }
}
