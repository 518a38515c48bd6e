//! A generation under way on one target: its text arrives on `deltas`, its
//! result from `task`. The pipeline waits for the first event before it
//! commits to an answer, so a target that fails before producing anything
//! can still be followed by another hop (or a proper error status).

use crate::bindings::target::{ChatRequest, Completion};
use crate::nn::{CacheScope, Decoding, Meter, Tokenized};
use crate::node::Node;
use crate::targets::{Delta, Job, Taint, TargetFailure, TargetResult};
use edgeroute_core::Target;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::{self, UnboundedReceiver};
use tokio::task::JoinHandle;

/// What a local run takes from the pipeline beside the chat request.
pub(super) struct LocalInputs {
    /// Whose cached prefix it may reuse, and whose it leaves.
    pub cache: CacheScope,
    /// The prompt's tokens, counted for the features.
    pub prompt: Option<Arc<Tokenized>>,
    /// `stop` and `response_format` as the local model follows them.
    pub decoding: Decoding,
}

pub(super) struct Run {
    pub target: Target,
    pub reason: String,
    pub deltas: UnboundedReceiver<Delta>,
    pub task: JoinHandle<TargetResult>,
    /// This hop's measures: the local model's confidence so far, a cloud
    /// call's wait on its upstream.
    pub meter: Meter,
    pub started: Instant,
    /// When the first text arrived, if it streamed.
    pub first_text: Option<Instant>,
    /// Dropped with the run (its client went away): the target stops.
    _waiting: tokio::sync::oneshot::Sender<()>,
}

pub(super) enum FirstEvent {
    Delta(Delta),
    Ended(Result<Completion, TargetFailure>),
}

impl Run {
    /// Start `request` on `target`. A cloud call carries the request's
    /// taint: the egress hook in wasi:http refuses it again if the request
    /// may not leave, whatever the code above did.
    pub fn launch(
        node: &Arc<Node>,
        target: Target,
        reason: String,
        mut request: ChatRequest,
        taint: Taint,
        local: LocalInputs,
    ) -> Run {
        let (tx, deltas) = mpsc::unbounded_channel();
        // Each backend fills in the model it runs (the local model, the
        // upstream's configured model).
        request.model = String::new();
        let meter = Meter::default();
        let (waiting_tx, waiting) = tokio::sync::oneshot::channel();
        let job = Job {
            stream: request.stream.then_some(tx),
            request,
            meter: meter.clone(),
            cache: Some(local.cache),
            prompt: local.prompt,
            decoding: local.decoding,
            waiting: Some(waiting),
        };
        let node = node.clone();
        let on = target.clone();
        let task = tokio::spawn(async move {
            match node.backend(on.kind()) {
                Some(backend) => backend.generate(on.name(), job, taint).await,
                None => Err(TargetFailure::Unavailable(format!(
                    "{on}: this node has no {} targets",
                    on.kind().name()
                ))),
            }
        });
        Run {
            target,
            reason,
            deltas,
            task,
            meter,
            started: Instant::now(),
            first_text: None,
            _waiting: waiting_tx,
        }
    }

    /// The geometric-mean probability of the tokens generated so far.
    pub fn confidence(&self) -> Option<f32> {
        self.measured().confidence.score()
    }

    /// Tokens the local model has produced so far.
    pub fn tokens(&self) -> u32 {
        self.measured().confidence.tokens()
    }

    /// Prompt tokens the local model continued from its prefix cache.
    pub fn reused_tokens(&self) -> u32 {
        self.measured().reused_tokens
    }

    /// How long a cloud call waited on its upstream for the answer's first
    /// bytes (None before them, and for other targets).
    pub fn upstream_wait(&self) -> Option<std::time::Duration> {
        self.measured().upstream_wait
    }

    fn measured(&self) -> crate::nn::Measured {
        *self.meter.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wait until the target either produced text or ended; until then the
    /// response status is still open, so a failure can be a proper error.
    pub async fn first_event(&mut self) -> FirstEvent {
        tokio::select! {
            biased;
            delta = self.deltas.recv() => match delta {
                Some(delta) => {
                    self.first_text = Some(Instant::now());
                    FirstEvent::Delta(delta)
                }
                None => FirstEvent::Ended(join(&mut self.task).await),
            },
            result = &mut self.task => FirstEvent::Ended(flatten(result)),
        }
    }
}

pub(super) async fn join(task: &mut JoinHandle<TargetResult>) -> TargetResult {
    flatten(task.await)
}

fn flatten(result: Result<TargetResult, tokio::task::JoinError>) -> TargetResult {
    result.unwrap_or_else(|e| Err(TargetFailure::Internal(format!("target task failed: {e}"))))
}
