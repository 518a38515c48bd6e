//! The two places a request can run. Both are WebAssembly components
//! exporting the same `generator` interface; the host only picks one and
//! relays its stream.

pub mod cloud;
pub mod local;

use crate::bindings::target::{ChatRequest, Completion, TargetError};
use tokio::sync::mpsc::UnboundedSender;

/// Why a target could not serve a request.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TargetFailure {
    #[error("the local queue is full ({0} requests waiting or running)")]
    Busy(u32),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("upstream error: {0}")]
    Upstream(String),
    #[error("{0}")]
    Internal(String),
    #[error("timed out after {0} ms")]
    Timeout(u64),
}

impl From<TargetError> for TargetFailure {
    fn from(error: TargetError) -> Self {
        match error {
            TargetError::Unavailable(m) => TargetFailure::Unavailable(m),
            TargetError::BadRequest(m) => TargetFailure::BadRequest(m),
            TargetError::Upstream(m) => TargetFailure::Upstream(m),
            TargetError::Internal(m) => TargetFailure::Internal(m),
        }
    }
}

/// A request on its way to a target, with where streamed text goes.
pub struct Job {
    pub request: ChatRequest,
    pub stream: Option<UnboundedSender<String>>,
}

pub type TargetResult = Result<Completion, TargetFailure>;

/// A trap inside a target component is the component's failure, not the
/// node's: it becomes an error for this one request.
fn trapped(error: wasmtime::Error) -> TargetFailure {
    TargetFailure::Internal(format!("target component failed: {error:#}"))
}
