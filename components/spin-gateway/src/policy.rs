//! The routing policy: the same component file the node loads, plugged in
//! by Spin as a component dependency (`[component.gateway.dependencies]`
//! in spin.toml) through the policy's exported `edgeroute:routing/router`
//! interface. Conversions between its WIT types and `edgeroute_core` are
//! the node's (`host/src/policy/convert.rs`), for this guest's bindings.

use edgeroute_core::{Cascade, Choice, Decision, Features, PolicyFailure, Target};

spin_sdk::wit_bindgen::generate!({
    runtime_path: "spin_sdk::wit_bindgen::rt",
    inline: "
        package edgeroute:spin-gateway;
        world gateway {
            import edgeroute:routing/router@0.2.0;
            // Run once at build time by `edgeroute preinit` (Wizer), which
            // snapshots the memory it leaves.
            export wizer-initialize: func();
        }
    ",
    path: "../../wit/routing-0.2",
    world: "edgeroute:spin-gateway/gateway",
    generate_all,
});

use edgeroute::routing::router;

struct Gateway;

impl Guest for Gateway {
    fn wizer_initialize() {
        crate::detector::initialize();
    }
}

export!(Gateway);
use edgeroute::routing::types as wit;

/// `configure` with the operator's params, then `route`. Spin makes a new
/// instance for every request, so both are called each time; a learning
/// policy's state does not outlive the request here (use the node).
pub fn decide(params: &[(String, String)], features: &Features) -> Result<Decision, PolicyFailure> {
    router::configure(params).map_err(PolicyFailure::Refused)?;
    Ok(decision(router::route(&self::features(features))))
}

fn sensitivity(level: edgeroute_core::Sensitivity) -> wit::Sensitivity {
    match level {
        edgeroute_core::Sensitivity::Public => wit::Sensitivity::Public,
        edgeroute_core::Sensitivity::Internal => wit::Sensitivity::Internal,
        edgeroute_core::Sensitivity::Restricted => wit::Sensitivity::Restricted,
    }
}

fn features(f: &Features) -> wit::Features {
    wit::Features {
        request_id: f.request_id.clone(),
        requested_model: f.requested_model.clone(),
        prompt_tokens: f.prompt_tokens,
        cached_prefix_tokens: f.cached_prefix_tokens,
        max_tokens: f.max_tokens,
        sensitivity: sensitivity(f.sensitivity),
        detected: f.detected.clone(),
        may_leave: f.may_leave,
        task: f.task.clone(),
        latency_budget_ms: f.latency_budget_ms,
        stream: f.stream,
        message_count: f.message_count,
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
        local_estimate: None,
        cloud_estimates: Vec::new(),
        local_models: f.local_models.clone(),
        cloud_upstreams: f.cloud_upstreams.clone(),
        peers: Vec::new(),
        peer_pick: None,
        embedding: None,
    }
}

fn target(target: wit::Target) -> Target {
    match target {
        wit::Target::Local(name) => Target::Local(name),
        wit::Target::Cloud(name) => Target::Cloud(name),
        wit::Target::Peer(name) => Target::Peer(name),
    }
}

fn decision(decision: wit::Decision) -> Decision {
    let choice = match decision.plan {
        wit::Plan::Run(t) => Choice::Run(target(t)),
        wit::Plan::Cascade(c) => Choice::Cascade(Cascade {
            first: target(c.first),
            then: target(c.then),
            min_confidence: c.min_confidence,
        }),
        wit::Plan::Reject(message) => Choice::Reject(message),
    };
    Decision {
        choice,
        reason: decision.reason,
        propensity: None,
    }
}
