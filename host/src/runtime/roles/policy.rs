//! The routing policy: pure computation over a request's features. It gets
//! the WASI basics a language runtime pulls in, with an empty environment,
//! no preopened directory and no socket, and the routing types; nothing
//! that reaches the network, a file or a model. Its memory is capped and
//! its calls run under a deadline (see `policy`).

use crate::bindings::policy_v2::edgeroute::routing::host;
use crate::policy::log::{Level, PolicyLog};
use crate::runtime::MemoryCap;
use wasmtime::Engine;
use wasmtime::component::HasSelf;
use wasmtime::component::{Linker, ResourceTable};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

/// What a policy may import. `edgeroute:routing/types` holds only types,
/// so there is nothing to link for it; the policy's functions are exports.
/// `edgeroute:routing/host` (0.2) is its log line and clock.
pub const ALLOWED: &[&str] = with_wasi_basics!["edgeroute:routing/types", "edgeroute:routing/host"];

/// Store state of a policy instance.
pub struct PolicyState {
    pub wasi: WasiCtx,
    pub table: ResourceTable,
    pub limits: MemoryCap,
    /// Where its `host.log` lines go (shared by the version's instances).
    pub log: PolicyLog,
}

impl host::Host for PolicyState {
    fn log(&mut self, level: host::LogLevel, message: String) {
        let level = match level {
            host::LogLevel::Debug => Level::Debug,
            host::LogLevel::Info => Level::Info,
            host::LogLevel::Warn => Level::Warn,
            host::LogLevel::Error => Level::Error,
        };
        self.log.write(level, &message);
    }

    fn now_ms(&mut self) -> u64 {
        crate::audit::now_ms()
    }
}

impl WasiView for PolicyState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

pub fn linker(engine: &Engine) -> anyhow::Result<Linker<PolicyState>> {
    let mut linker = Linker::<PolicyState>::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    host::add_to_linker::<PolicyState, HasSelf<PolicyState>>(&mut linker, |state| state)?;
    Ok(linker)
}
