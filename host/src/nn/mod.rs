//! wasi-nn for the local worker: llama.cpp models loaded once per node and
//! exposed by name through wasmtime-wasi-nn's backend traits.

mod backend;
pub mod decoding;
pub mod embed;
pub mod engine;
mod paced;
pub mod prefix;
pub mod scheduler;

pub use backend::{GgmlBackend, ModelRegistry};
pub use embed::{Embedder, Embedding};
pub use engine::{Finish, Generation, LoadedModel, RuntimeParams, Sampling};

use edgeroute_core::Confidence;
use std::sync::{Arc, Mutex};
use wasmtime_wasi_nn::wit::WasiNnCtx;

pub use decoding::Decoding;
pub use paced::Pace;
pub use prefix::CacheScope;
pub use scheduler::{BatchLoad, BatchParams, Scheduler};

/// What a hop reports as it runs (shared between the router and the
/// target: the wasi-nn backend, or the egress hook of a cloud call).
#[derive(Debug, Clone, Copy, Default)]
pub struct Measured {
    /// How sure the model is of its tokens so far.
    pub confidence: Confidence,
    /// Prompt tokens continued from the prefix cache.
    pub reused_tokens: u32,
    /// A cloud call's wait on its upstream, from the request handed to the
    /// node's HTTP client to the answer's first bytes (a whole small
    /// answer, or a stream's first chunk; a new connection's connect and
    /// TLS included): the rest of the cloud step is the node's own (the
    /// cloud-fetch component and wasi:http). None until those bytes come.
    pub upstream_wait: Option<std::time::Duration>,
}

pub type Meter = Arc<Mutex<Measured>>;

/// A chat as the router tokenized it for the features (template included),
/// handed to the backend with the job so the prompt is tokenized once: the
/// backend uses these tokens when the worker sends the same messages.
#[derive(Debug, Clone, PartialEq)]
pub struct Tokenized {
    pub messages: Vec<(String, String)>,
    pub tokens: Vec<llama_cpp_2::token::LlamaToken>,
}

/// A fresh wasi-nn context for one store: the shared models, one backend.
pub fn context(models: ModelRegistry) -> WasiNnCtx {
    WasiNnCtx::new(
        [wasmtime_wasi_nn::Backend::from(GgmlBackend)],
        wasmtime_wasi_nn::Registry::from(models),
    )
}
