//! The places a request can run, each behind the one [`Backend`] trait:
//! local models and cloud upstreams (both WebAssembly components exporting
//! the same `generator` interface), and peers of a fleet (`crate::fleet`,
//! forwarded over HTTP by the host). The router picks a backend by the
//! target's kind and relays its stream.

pub mod cloud;
pub mod local;

use crate::bindings::target::{ChatRequest, Completion, TargetError};
pub use cloud::Taint;
use std::future::Future;
use std::pin::Pin;
use tokio::sync::mpsc::UnboundedSender;

/// A generation running on a backend.
pub type Generating<'a> = Pin<Box<dyn Future<Output = TargetResult> + Send + 'a>>;

/// Where the requests of one target kind run.
pub trait Backend: Send + Sync {
    /// The names this backend serves (models, upstreams, peers).
    fn names(&self) -> Vec<String>;

    /// Run `job` on the target called `name`. `taint` says whether the
    /// client request may leave the node; a backend that sends anything
    /// off the node must enforce it.
    fn generate<'a>(&'a self, name: &'a str, job: Job, taint: Taint) -> Generating<'a>;
}

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
    #[error("the upstream is rate-limiting: {message}")]
    RateLimited {
        message: String,
        retry_after_s: Option<u32>,
    },
    #[error("{0}")]
    Internal(String),
    #[error("timed out after {0} ms")]
    Timeout(u64),
    /// Nothing reached the target (a peer refused the connection): another
    /// target may still serve the request without a copy having left.
    #[error("{0}")]
    Unreachable(String),
}

impl From<TargetError> for TargetFailure {
    fn from(error: TargetError) -> Self {
        match error {
            TargetError::Unavailable(m) => TargetFailure::Unavailable(m),
            TargetError::BadRequest(m) => TargetFailure::BadRequest(m),
            TargetError::Upstream(m) => TargetFailure::Upstream(m),
            TargetError::RateLimited(r) => TargetFailure::RateLimited {
                message: r.message,
                retry_after_s: r.retry_after_s,
            },
            TargetError::Internal(m) => TargetFailure::Internal(m),
        }
    }
}

/// One piece of a streamed answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Delta {
    Text(String),
    /// An upstream's delta that is more than text (`tool_calls`), relayed
    /// to the client as the upstream wrote it.
    Raw(serde_json::Value),
}

impl Delta {
    /// The text this piece adds to the answer (none for a raw delta).
    pub fn text(&self) -> &str {
        match self {
            Delta::Text(text) => text,
            Delta::Raw(_) => "",
        }
    }
}

/// A request on its way to a target, with where streamed text goes.
pub struct Job {
    pub request: ChatRequest,
    pub stream: Option<UnboundedSender<Delta>>,
    /// Where a local model reports its confidence as it generates; a
    /// target that cannot measure it leaves it empty.
    pub meter: crate::nn::Meter,
    /// Who may reuse the local model's cached prefix, and whose this
    /// generation's becomes; None: no reuse (benchmarks).
    pub cache: Option<crate::nn::CacheScope>,
    /// The prompt as the router tokenized it for the local model.
    pub prompt: Option<std::sync::Arc<crate::nn::Tokenized>>,
    /// Stop sequences and a grammar for a local generation.
    pub decoding: crate::nn::Decoding,
    /// Closed when nobody waits for a non-streamed answer any more (its
    /// client went away): the target is told through `sink.emit` and
    /// stops, instead of holding the local model for a lost answer.
    pub waiting: Option<tokio::sync::oneshot::Receiver<()>>,
}

/// A greedy, non-streamed request for `messages` with nothing passed
/// through (benchmarks and tests); a target fills in its model.
pub fn greedy_request(
    messages: Vec<crate::bindings::target::Message>,
    max_tokens: u32,
) -> ChatRequest {
    ChatRequest {
        model: String::new(),
        messages,
        max_tokens,
        temperature: 0.0,
        top_p: 1.0,
        seed: 0,
        stream: false,
        passthrough: None,
    }
}

impl Job {
    /// A job for `request` with nothing streamed, no cache scope and no
    /// prompt tokenized ahead (benchmarks and tests).
    pub fn new(request: ChatRequest) -> Self {
        Self {
            request,
            stream: None,
            meter: Default::default(),
            cache: None,
            prompt: None,
            decoding: Default::default(),
            waiting: None,
        }
    }
}

pub type TargetResult = Result<Completion, TargetFailure>;

/// A trap inside a target component is the component's failure, not the
/// node's: it becomes an error for this one request. The client gets the
/// trap, not the chain of contexts under it (a wasm backtrace can be tens
/// of kilobytes, and names the node's internals); the log keeps it all.
fn trapped(error: wasmtime::Error) -> TargetFailure {
    tracing::warn!("target component failed: {error:?}");
    let what = match error.downcast_ref::<wasmtime::Trap>() {
        Some(trap) => trap.to_string(),
        None => error.to_string(),
    };
    TargetFailure::Internal(format!("target component failed: {what}"))
}
