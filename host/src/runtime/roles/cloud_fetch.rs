//! The cloud fetcher: runs a chat completion against an OpenAI-compatible
//! upstream through wasi:http and streams it through the sink. Every request
//! it sends passes the egress guard in `EgressHooks`, which also adds the
//! upstream's key: the component never holds it.

use crate::bindings::target::Target;
use crate::egress::EgressHooks;
use crate::runtime::{Sink, SinkData};
use wasmtime::Engine;
use wasmtime::component::{Linker, ResourceTable};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

/// What a cloud fetcher may import: the `target` world's host side and the
/// client half of wasi:http. No wasi:nn, no filesystem.
pub const ALLOWED: &[&str] = with_wasi_basics![
    "edgeroute:routing/completion-types",
    "edgeroute:routing/sink",
    "wasi:http/outgoing-handler",
    "wasi:http/types",
];

/// Store state of one cloud call.
pub struct CloudState {
    pub wasi: WasiCtx,
    pub table: ResourceTable,
    pub http: WasiHttpCtx,
    pub hooks: EgressHooks,
    pub sink: Sink,
}

impl WasiView for CloudState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for CloudState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.hooks,
        }
    }
}

pub fn linker(engine: &Engine) -> anyhow::Result<Linker<CloudState>> {
    let mut linker = Linker::<CloudState>::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)?;
    Target::add_to_linker::<_, SinkData>(&mut linker, |s: &mut CloudState| &mut s.sink)?;
    Ok(linker)
}
