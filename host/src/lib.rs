//! edgeroute: an edge inference router. Requests arrive on an
//! OpenAI-compatible API, a WebAssembly routing policy places each one on a
//! local model (llama.cpp through wasi-nn) or a cloud upstream (through a
//! wasi:http component), and a guard in the host keeps sensitive data local.
//!
//! Follow a request by module: `api` (HTTP only) → `router` (the pipeline:
//! `request` → `features` → `policy` → the guard in `edgeroute_core` →
//! `targets` (`local` / `cloud`, with `nn` and `egress` under them) →
//! `ledger`). The vocabulary they share is the `edgeroute_core` crate.

pub mod api;
pub mod audit;
pub mod bench;
pub mod bindings;
pub mod cli;
pub mod components;
pub mod config;
pub mod decisions;
pub mod detect;
pub mod egress;
pub mod feedback;
pub mod fleet;
pub mod ledger;
pub mod log_writer;
pub mod memo;
pub mod metrics;
pub mod nn;
pub mod node;
pub mod per_thread;
pub mod policy;
pub mod preinit;
pub mod quickack;
pub mod reload;
pub mod report;
pub mod router;
pub mod runtime;
pub mod serve;
pub mod targets;
pub mod tenants;
