//! Why a request was not served. A cause, not an HTTP status: the API
//! layer maps each cause to a status and an OpenAI error in one place.

use crate::sensitivity::Sensitivity;
use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The policy answered `reject`.
    PolicyRejected { message: String },
    /// The policy failed and the node is set to refuse then.
    PolicyFailed { why: String },
    /// The request may not leave and no local model can serve it.
    LocalUnavailable { sensitivity: Sensitivity },
    /// The request may not leave and the local queue is full.
    LocalBusy {
        sensitivity: Sensitivity,
        queue: u32,
    },
    /// The request may not leave and is longer than the local context.
    PromptTooLong { prompt_tokens: u32, context: u32 },
    /// The request may leave, but nothing can serve it.
    NoTarget { why: String },
    /// The request asks for what only an upstream serves (tool calls) and
    /// may not leave the node.
    Unsupported { what: String },
}

impl Refusal {
    /// A stable, machine-readable code (the OpenAI error's `code`).
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::PolicyRejected { .. } => "policy_rejected",
            Refusal::PolicyFailed { .. } => "policy_failed",
            Refusal::LocalUnavailable { .. } => "local_unavailable",
            Refusal::LocalBusy { .. } => "local_busy",
            Refusal::PromptTooLong { .. } => "prompt_too_long",
            Refusal::NoTarget { .. } => "no_target",
            Refusal::Unsupported { .. } => "unsupported_locally",
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::PolicyRejected { message } => {
                write!(f, "the routing policy refused this request: {message}")
            }
            Refusal::PolicyFailed { why } => {
                write!(
                    f,
                    "the routing policy failed ({why}) and the node is set to refuse"
                )
            }
            Refusal::LocalUnavailable { sensitivity } => write!(
                f,
                "this request is {sensitivity} and may only run on this node, but no local model can serve it now; it was not sent anywhere"
            ),
            Refusal::LocalBusy { sensitivity, queue } => write!(
                f,
                "the local queue is full ({queue} requests waiting or running); this request is {sensitivity} and may only run on this node, so it was not sent anywhere"
            ),
            Refusal::PromptTooLong {
                prompt_tokens,
                context,
            } => write!(
                f,
                "the prompt is {prompt_tokens} tokens; the local model's context holds {context}, and this request may not leave the node"
            ),
            Refusal::NoTarget { why } => {
                write!(f, "{why}, and no cloud upstream is configured")
            }
            Refusal::Unsupported { what } => write!(
                f,
                "the local model cannot serve {what}, and this request may not leave the node; it was not sent anywhere"
            ),
        }
    }
}

/// A refusal with the routing reason that led to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub cause: Refusal,
    pub reason: String,
}
