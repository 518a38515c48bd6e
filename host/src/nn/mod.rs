//! wasi-nn for the local worker: llama.cpp models loaded once per node and
//! exposed by name through wasmtime-wasi-nn's backend traits.

mod backend;
pub mod engine;

pub use backend::{GgmlBackend, ModelRegistry};
pub use engine::{Finish, Generation, LoadedModel, RuntimeParams, Sampling};

use wasmtime_wasi_nn::wit::WasiNnCtx;

/// A fresh wasi-nn context for one store: the shared models, one backend.
pub fn context(models: &ModelRegistry) -> WasiNnCtx {
    WasiNnCtx::new(
        [wasmtime_wasi_nn::Backend::from(GgmlBackend)],
        wasmtime_wasi_nn::Registry::from(models.clone()),
    )
}
