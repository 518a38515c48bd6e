//! A routing policy in Rust for edgeroute (world
//! `edgeroute:routing/policy@0.2.0`, in `wit/`).
//!
//! Short prompts run on the first local model, long ones on the first
//! cloud upstream; a request that may not leave stays local, or is
//! rejected when no local model is loaded. It logs through the node
//! (`host::log`) and reads the node's clock (`host::now_ms`).

wit_bindgen::generate!({
    world: "policy",
    path: "wit",
});

use edgeroute::routing::host::{self, LogLevel};
use edgeroute::routing::types::{Decision, Features, Needs, Outcome, Plan, Target};
use exports::edgeroute::routing::router::Guest;
use std::sync::atomic::{AtomicU32, Ordering};

/// Prompts up to this many tokens run locally (`[policy.params]
/// local_max_prompt_tokens`).
static LOCAL_MAX_PROMPT_TOKENS: AtomicU32 = AtomicU32::new(512);

struct Policy;

impl Guest for Policy {
    fn configure(params: Vec<(String, String)>) -> Result<Needs, String> {
        for (key, value) in params {
            if key == "local_max_prompt_tokens" {
                let tokens: u32 = value
                    .trim()
                    .parse()
                    .map_err(|_| format!("{key} must be a whole number of tokens, got {value:?}"))?;
                LOCAL_MAX_PROMPT_TOKENS.store(tokens, Ordering::Relaxed);
            }
        }
        host::log(
            LogLevel::Info,
            &format!(
                "configured: local_max_prompt_tokens={}",
                LOCAL_MAX_PROMPT_TOKENS.load(Ordering::Relaxed)
            ),
        );
        // No costly signal (the prompt embedding) is needed.
        Ok(Needs::empty())
    }

    fn route(features: Features) -> Decision {
        let decision = decide(&features);
        host::log(
            LogLevel::Debug,
            &format!("routed a prompt at {} ms since the epoch", host::now_ms()),
        );
        decision
    }

    fn observe(outcome: Outcome) {
        if !outcome.ok {
            host::log(LogLevel::Warn, "a request this policy placed failed");
        }
    }
}

fn decide(f: &Features) -> Decision {
    let run = |target, reason: &str| Decision {
        plan: Plan::Run(target),
        reason: reason.into(),
        propensity: None,
    };
    let reject = |why: &str, reason: &str| Decision {
        plan: Plan::Reject(why.into()),
        reason: reason.into(),
        propensity: None,
    };
    let local = f.local_models.first().cloned().map(Target::Local);
    let cloud = f.cloud_upstreams.first().cloned().map(Target::Cloud);
    let short = f.prompt_tokens <= LOCAL_MAX_PROMPT_TOKENS.load(Ordering::Relaxed);
    match (f.may_leave, local, cloud) {
        // Naming a local model that is not loaded would also fail closed;
        // `reject` says why.
        (false, None, _) => reject(
            "this request may not leave and no local model is loaded",
            "sensitive, no local model: reject",
        ),
        (false, Some(local), _) => run(local, "sensitive: stays local"),
        (true, Some(local), None) => run(local, "no upstream: local"),
        (true, Some(local), Some(_)) if short => run(local, "short prompt: local"),
        (true, _, Some(cloud)) => run(cloud, "long prompt: cloud"),
        (true, None, None) => reject("no target is configured", "no target: reject"),
    }
}

export!(Policy);
