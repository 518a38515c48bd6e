//! The wasmtime engine every component runs on, and what the roles share:
//! the WASI context a guest gets, the memory cap, the streaming sink. One
//! engine per node: compiled code and the epoch clock that bounds policy
//! calls are shared by all components. Each role (what a component may
//! import, how it is linked, its store state) is a file under `roles`.

pub mod roles;

use std::time::Duration;
use wasmtime::{Config, Engine, ResourceLimiter};
use wasmtime_wasi::WasiCtx;

/// One epoch tick; policy deadlines are counted in ticks.
pub const EPOCH_TICK: Duration = Duration::from_millis(1);

/// Ticks for stores that have no deadline of their own (targets end by
/// their own timeouts, not by being killed mid-generation).
pub const NO_DEADLINE: u64 = 1 << 40;

pub fn engine() -> anyhow::Result<Engine> {
    let mut config = Config::new();
    config.wasm_component_model(true);
    config.epoch_interruption(true);
    // Interpreter-based policies (Python, JavaScript) take seconds to
    // compile; the on-disk cache makes every later load of the same bytes
    // (a restart, a rollback, a re-swap) take milliseconds.
    match wasmtime::Cache::new(wasmtime::CacheConfig::new()) {
        Ok(cache) => {
            config.cache(Some(cache));
        }
        Err(error) => {
            tracing::warn!(%error, "compiled-code cache unavailable; components compile on every load")
        }
    }
    let engine = Engine::new(&config)?;
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("epoch-ticker".into())
        .spawn(move || {
            while let Some(engine) = weak.upgrade() {
                engine.increment_epoch();
                drop(engine);
                std::thread::sleep(EPOCH_TICK);
            }
        })?;
    Ok(engine)
}

/// WASI for a guest: stderr goes to the node's log, nothing else is given.
pub fn wasi(env: &[(&str, &str)]) -> WasiCtx {
    let mut builder = WasiCtx::builder();
    builder.inherit_stderr();
    for (key, value) in env {
        builder.env(key, value);
    }
    builder.build()
}

/// A memory cap that also remembers how much the instance uses, so the
/// admin view can show a policy's footprint.
pub struct MemoryCap {
    limit: usize,
    current: usize,
    /// A growth past the limit was refused since this store began (what
    /// a trap that follows usually comes from).
    denied: bool,
}

impl MemoryCap {
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            current: 0,
            denied: false,
        }
    }

    pub fn current(&self) -> usize {
        self.current
    }

    pub fn denied(&self) -> bool {
        self.denied
    }
}

impl ResourceLimiter for MemoryCap {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.limit {
            self.denied = true;
            return Ok(false);
        }
        self.current = desired;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 1 << 20)
    }
}

/// Where a target streams its text (`tx`, when the client asked for a
/// stream), and whether anyone still waits for the answer.
pub struct Sink {
    pub tx: Option<tokio::sync::mpsc::UnboundedSender<crate::targets::Delta>>,
    pub waiting: Option<tokio::sync::oneshot::Receiver<()>>,
}

impl crate::bindings::target::sink::Host for Sink {
    /// False when the client is gone: a stream's receiver was dropped, or
    /// the request waiting for a whole answer was.
    fn emit(&mut self, delta: String) -> bool {
        use tokio::sync::oneshot::error::TryRecvError;
        match (&self.tx, &mut self.waiting) {
            (Some(tx), _) => tx.send(crate::targets::Delta::Text(delta)).is_ok(),
            (None, Some(waiting)) => !matches!(waiting.try_recv(), Err(TryRecvError::Closed)),
            (None, None) => true,
        }
    }

    /// A delta that is not JSON is the component's error: it is dropped
    /// (the client keeps a well-formed stream) and the target told to stop.
    fn emit_raw(&mut self, delta: String) -> bool {
        let Ok(value) = serde_json::from_str::<serde_json::Value>(&delta) else {
            tracing::warn!("a target streamed a raw delta that is not JSON; stopping it");
            return false;
        };
        match &self.tx {
            Some(tx) => tx.send(crate::targets::Delta::Raw(value)).is_ok(),
            None => true,
        }
    }
}

/// `completion-types` holds only types; nothing to implement.
impl crate::bindings::target::completion_types::Host for Sink {}

/// Lets `Target::add_to_linker` reach the sink inside any store state.
pub struct SinkData;
impl wasmtime::component::HasData for SinkData {
    type Data<'a> = &'a mut Sink;
}
