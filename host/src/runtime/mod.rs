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
    let engine = Engine::new(&config())?;
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

/// What a pooled engine's instance may hold: enough for a Rust component
/// (the cloud fetcher is one core module and a few shims), not for an
/// interpreter's; a component over these is refused when it is loaded.
const POOL_CORE_INSTANCES_PER_COMPONENT: u32 = 16;
const POOL_MEMORIES_PER_COMPONENT: u32 = 2;
const POOL_TABLES_PER_COMPONENT: u32 = 8;
/// A slot's linear memory may grow to this (the fetcher holds one
/// non-streamed answer at most).
const POOL_MAX_MEMORY: usize = 256 << 20;
/// Kept mapped and overwritten in place (the module's image copied back,
/// the rest zeroed) when a slot is reused; the rest of the slot is handed
/// back to the kernel and faults in again when touched. The cloud fetcher
/// is linked with a 128 KiB stack (components/cloud-fetch/build.rs) so a
/// call's stack, statics and heap lie inside this: a call then takes no
/// page faults and the reset no `madvise` (whose TLB shootdown interrupts
/// the other core). Measured with `edgeroute bench --proxy-only`
/// (2026-12-05, 3 runs each): the fetcher alone, pooled / fresh p50
/// 0.80 -> 0.74, the node's cloud step p50 ~355 -> ~330 µs. With Rust's
/// default 1 MiB stack, 0, 128 KiB and 1 MiB measured within noise. 64
/// idle slots hold 32 MiB at most. Wasmtime's `pagemap_scan` (reset only
/// the pages a call dirtied, found with the kernel's PAGEMAP_SCAN) is not
/// used: in wasmtime 48 a dirty page that is swapped out is neither reset
/// nor decommitted, so on a host with swap the next call in the slot could
/// read it; what is overwritten here is overwritten whether or not it was
/// swapped out.
pub const POOL_KEEP_RESIDENT: usize = 512 << 10;

/// An engine for components instantiated once per call, many times a
/// second (the cloud fetcher): their memories, tables and fiber stacks
/// come from pools of `slots` made once, so an instance costs no `mmap`
/// and no page faults for what the previous one in its slot touched
/// (instantiation 48 -> 20 µs here; `edgeroute bench --proxy-only`
/// compares the two).
/// A slot is wiped before reuse: nothing of one call is seen by the next.
///
/// The caller bounds its concurrent instances by `slots` (instantiating
/// past them fails); stores on it run without a deadline, so it has no
/// epoch ticker.
pub fn pooled_engine(slots: u32) -> anyhow::Result<Engine> {
    let mut pool = wasmtime::PoolingAllocationConfig::new();
    pool.total_component_instances(slots)
        .total_core_instances(slots * POOL_CORE_INSTANCES_PER_COMPONENT)
        .total_memories(slots * POOL_MEMORIES_PER_COMPONENT)
        .total_tables(slots * POOL_TABLES_PER_COMPONENT)
        .total_stacks(slots)
        .max_core_instances_per_component(POOL_CORE_INSTANCES_PER_COMPONENT)
        .max_memories_per_component(POOL_MEMORIES_PER_COMPONENT)
        .max_tables_per_component(POOL_TABLES_PER_COMPONENT)
        .max_memory_size(POOL_MAX_MEMORY)
        .linear_memory_keep_resident(POOL_KEEP_RESIDENT)
        .table_keep_resident(64 << 10)
        .async_stack_keep_resident(64 << 10);
    let mut config = config();
    config.allocation_strategy(wasmtime::InstanceAllocationStrategy::Pooling(pool));
    Ok(Engine::new(&config)?)
}

fn config() -> Config {
    let mut config = Config::new();
    config.wasm_component_model(true);
    config.epoch_interruption(true);
    // No guest here uses the component model's async ABI (the Wizer
    // snapshot in `preinit` does, on an engine of its own), and with
    // concurrency support on, every call into or out of a guest keeps
    // task bookkeeping (a host task made and deleted per host call).
    config.concurrency_support(false);
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
    config
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
/// stream), and whether anyone still waits for the answer. The default
/// streams nowhere and has no one to ask (an embedding emits nothing).
#[derive(Default)]
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
