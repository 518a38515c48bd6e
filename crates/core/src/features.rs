//! What a routing policy sees of a request, in the host's terms. Each
//! policy world version gets it converted into its own WIT record; a field
//! an older version lacks is simply not shown to it.

use crate::sensitivity::Sensitivity;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Features {
    pub request_id: String,
    pub requested_model: String,
    /// Counted with the local model's tokenizer, chat template included.
    pub prompt_tokens: u32,
    pub max_tokens: u32,
    pub sensitivity: Sensitivity,
    /// The kinds of data detectors found (not the data).
    pub detected: Vec<&'static str>,
    pub may_leave: bool,
    pub task: String,
    pub latency_budget_ms: Option<u32>,
    pub stream: bool,
    pub message_count: u32,
    pub local_queue_depth: u32,
    pub local_models: Vec<String>,
    pub cloud_upstreams: Vec<String>,
}
