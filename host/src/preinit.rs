//! `edgeroute preinit`: pre-initialise a component with wasmtime's Wizer.
//! Its initialisation export runs once here, and the memory it leaves is
//! written into a new component, so every instance starts from there.
//!
//! Why: Spin makes a fresh instance of a component for every request. The
//! gateway (`components/spin-gateway`) would otherwise compile the
//! detector's regexes on each one (about 60 ms natively, more in wasm);
//! snapshotted, an instance starts with them compiled and warmed.
//!
//! The component's imports are not available here: each is defined as a
//! trap, so an initialisation that calls one fails loudly instead of
//! snapshotting a half-built state. One exception: `wasi:random/
//! insecure-seed`, which Rust's standard library asks for the first time
//! it makes a `HashMap` (its hasher's keys). It gets random bytes drawn
//! now, so every instance of this build starts from the same secret keys
//! (as every thread of one process does natively; later maps derive new
//! keys from them).

use anyhow::{Context, bail};
use std::path::Path;
use wasmtime::component::Linker;
use wasmtime::{Config, Engine, Store};
use wasmtime_wizer::Wizer;

/// The export the gateway runs its initialisation in (Wizer's default).
pub const INIT_EXPORT: &str = "wizer-initialize";

pub async fn run(input: &Path, output: &Path) -> anyhow::Result<()> {
    let wasm = std::fs::read(input).with_context(|| format!("reading {}", input.display()))?;
    let mut config = Config::new();
    config.wasm_component_model_async(true);
    let engine = Engine::new(&config)?;
    let mut store = Store::new(&engine, ());
    let (snapshot, _) = Wizer::new()
        .init_func(INIT_EXPORT)
        // Wizer 48 drops the core export but leaves the component's lift
        // of it, which makes an invalid component; keeping it is harmless
        // (a second call finds the work done).
        .keep_init_func(true)
        .run_component(&mut store, &wasm, async |store, component| {
            let mut linker = Linker::new(store.engine());
            let engine = store.engine().clone();
            for (name, _) in component.component_type().imports(&engine) {
                if name.starts_with("wasi:random/insecure-seed@") {
                    linker.instance(name)?.func_wrap("insecure-seed", |_, ()| {
                        let mut seed = [0u8; 16];
                        getrandom::fill(&mut seed).map_err(|e| wasmtime::format_err!("{e}"))?;
                        let (a, b) = seed.split_at(8);
                        let word = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
                        Ok(((word(a), word(b)),))
                    })?;
                }
            }
            linker.define_unknown_imports_as_traps(component)?;
            linker.instantiate_async(store, component).await
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e:#}"))
        .with_context(|| {
            format!(
                "pre-initialising {} (its `{INIT_EXPORT}` export)",
                input.display()
            )
        })?;
    if snapshot.is_empty() {
        bail!("pre-initialising {} produced no component", input.display());
    }
    std::fs::write(output, snapshot).with_context(|| format!("writing {}", output.display()))
}
