//! Routing policies, split by lifetime:
//!
//! - `version`: one loaded component (compile, instantiate, call under a
//!   deadline and a memory cap); knows nothing of probes or swaps;
//! - `host`: the active version, its history, swap and rollback; it admits
//!   a version only after the probe, as a step of its own;
//! - `persist`: a policy's state on disk;
//! - `eval`: probe, conformance and shadow, built on versions;
//! - `convert`: WIT types ↔ the host's vocabulary, in one place.

pub mod convert;
pub mod eval;
pub mod host;
pub mod log;
pub mod persist;
pub mod template;
pub mod version;

pub use edgeroute_core::PolicyFailure;
pub use host::{PolicyHost, admit};
pub use version::PolicyVersion;
