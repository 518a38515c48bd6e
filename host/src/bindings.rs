//! Host-side bindings for the worlds in `wit/routing.wit`.

/// The `policy` world: configure, route, observe.
pub mod policy {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "policy",
        exports: { default: async },
    });
    pub use self::edgeroute::routing::types::{Sensitivity, Target};
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
