//! The local worker: runs a chat completion on a model the node preloaded,
//! through wasi:nn, and streams it through the sink. It has no network: the
//! prompt it sees never leaves the node.

use crate::bindings::target::Target;
use crate::runtime::{Sink, SinkData};
use wasmtime::component::{Linker, ResourceTable};
use wasmtime::{Engine, Store};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_nn::wit::{WasiNnCtx, WasiNnView};

/// What a local worker may import: the `target` world's host side and
/// wasi:nn.
pub const ALLOWED: &[&str] = with_wasi_basics![
    "edgeroute:routing/completion-types",
    "edgeroute:routing/sink",
    "wasi:nn/errors",
    "wasi:nn/graph",
    "wasi:nn/inference",
    "wasi:nn/tensor",
];

/// Store state of one local generation.
pub struct LocalState {
    pub wasi: WasiCtx,
    pub table: ResourceTable,
    pub nn: WasiNnCtx,
    pub sink: Sink,
}

impl LocalState {
    /// A store for one call: no deadline (a generation runs as long as its
    /// tokens take; cancellation comes through the sink).
    pub fn store(engine: &Engine, nn: WasiNnCtx, sink: Sink) -> Store<Self> {
        let mut store = Store::new(
            engine,
            Self {
                wasi: crate::runtime::wasi(&[]),
                table: ResourceTable::new(),
                nn,
                sink,
            },
        );
        store.set_epoch_deadline(crate::runtime::NO_DEADLINE);
        store
    }
}

impl WasiView for LocalState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

pub fn linker(engine: &Engine) -> anyhow::Result<Linker<LocalState>> {
    let mut linker = Linker::<LocalState>::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    wasmtime_wasi_nn::wit::add_to_linker(&mut linker, |s: &mut LocalState| {
        WasiNnView::new(&mut s.table, &mut s.nn)
    })?;
    Target::add_to_linker::<_, SinkData>(&mut linker, |s: &mut LocalState| &mut s.sink)?;
    Ok(linker)
}
