//! wasi-nn for the local worker: llama.cpp models loaded once per node and
//! exposed by name through wasmtime-wasi-nn's backend traits.

mod backend;
pub mod engine;

pub use backend::{GgmlBackend, ModelRegistry};
pub use engine::{Finish, Generation, LoadedModel, RuntimeParams, Sampling};

use edgeroute_core::Confidence;
use std::sync::{Arc, Mutex};
use wasmtime_wasi_nn::wit::WasiNnCtx;

/// Where a request's generation reports how sure the model is, token by
/// token (shared between the wasi-nn backend and the router).
pub type Meter = Arc<Mutex<Confidence>>;

/// A fresh wasi-nn context for one store: the shared models, one backend.
pub fn context(models: ModelRegistry) -> WasiNnCtx {
    WasiNnCtx::new(
        [wasmtime_wasi_nn::Backend::from(GgmlBackend)],
        wasmtime_wasi_nn::Registry::from(models),
    )
}
