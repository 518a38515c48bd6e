//! How a request ended, reported to the policy version that routed it.

use crate::cost::Usage;
use crate::target::Target;

#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub request_id: String,
    /// None when the request was refused.
    pub served_by: Option<Target>,
    pub ok: bool,
    pub latency_ms: u32,
    pub usage: Usage,
    pub cost_micro_usd: u64,
    /// The local model's confidence in its answer (0 to 1), when measured.
    pub confidence: Option<f32>,
    /// The client's score of the answer (0 to 1), from `POST /v1/feedback`.
    pub feedback: Option<f32>,
}
