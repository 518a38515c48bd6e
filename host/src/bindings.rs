//! Host-side bindings for the worlds in `wit/`. Each policy world version
//! has its own module; `policy::convert` is the one place their types meet
//! the host's vocabulary.

/// `edgeroute:routing@0.1.0`, world `policy`: configure, route, observe as
/// world functions (`snapshot`/`restore` for `stateful-policy`).
pub mod policy {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "policy",
        exports: { default: async },
    });
    pub use self::edgeroute::routing::types::{Sensitivity, Target};
}

/// `edgeroute:routing@0.2.0`, world `policy`: the same functions exported
/// as the interface `router` (and `state` for stateful policies).
pub mod policy_v2 {
    wasmtime::component::bindgen!({
        path: "../wit/routing-0.2",
        world: "policy",
        exports: { default: async },
    });
    pub use self::edgeroute::routing::types::{
        Cascade, Decision, Estimate, Features, Needs, Outcome, Peer, Plan, Sensitivity, Target,
        TextStats,
    };
}

/// The `target` world shared by the local worker and cloud-fetch.
pub mod target {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "target",
        exports: { default: async },
    });
    pub use self::edgeroute::routing::completion_types::{Message, Usage};
    pub use self::edgeroute::routing::{completion_types, sink};
    pub use self::exports::edgeroute::routing::generator::{ChatRequest, Completion, TargetError};
}

/// The `embeds` world: what the local worker exports besides
/// `generator`. Its error type is the `target` world's.
pub mod embedding {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "embeds",
        exports: { default: async },
        with: { "edgeroute:routing/completion-types": super::target::completion_types },
    });
    pub use self::exports::edgeroute::routing::embedder::Embedding;
}
