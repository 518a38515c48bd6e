//! The decision log: one JSON line per finished request — the features a
//! policy saw (never the prompt text, nor its embedding: a replay of a
//! policy that uses the embedding sees none), the decision and its propensity, the
//! policy version, and the outcome — and one line per feedback. It is what
//! `edgeroute policy replay` evaluates a candidate policy on, off-policy,
//! before anyone swaps it in. Off unless `[node] decision_log` (or
//! `edgeroute up --decision-log FILE`) names a file; lines are appended.

use edgeroute_core::{Features, Outcome};
use serde::{Deserialize, Serialize};
use std::io::{BufWriter, Write};
use std::path::Path;

/// One line of the log.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Line {
    Decision(Box<Decided>),
    Feedback { id: String, feedback: f32 },
}

/// A request's decision and how it ended.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Decided {
    pub id: String,
    /// The id of the policy version that decided.
    pub policy: String,
    pub features: Features,
    /// The plan as a label: `local:smollm2`, `cloud:frontier`, a cascade
    /// `local:smollm2→cloud:frontier`, `reject` or `failed`.
    pub decision: String,
    pub propensity: Option<f32>,
    pub outcome: Logged,
    /// When the request finished, in Unix milliseconds (logs written
    /// before it was recorded have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_ms: Option<u64>,
}

/// The outcome as the log keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Logged {
    /// `local:NAME`, `cloud:NAME`, or none when refused.
    pub served_by: Option<String>,
    pub ok: bool,
    pub latency_ms: u32,
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub cost_micro_usd: u64,
    pub confidence: Option<f32>,
}

impl Logged {
    /// The outcome in the form a policy's `observe` takes; a `served_by`
    /// that names no target reads as refused.
    pub fn outcome(&self, request_id: &str, feedback: Option<f32>) -> Outcome {
        Outcome {
            request_id: request_id.to_string(),
            served_by: self
                .served_by
                .as_deref()
                .and_then(|s| s.parse::<edgeroute_core::Target>().ok()),
            ok: self.ok,
            latency_ms: self.latency_ms,
            usage: edgeroute_core::Usage {
                prompt_tokens: self.prompt_tokens,
                completion_tokens: self.completion_tokens,
            },
            cost_micro_usd: self.cost_micro_usd,
            confidence: self.confidence,
            feedback,
        }
    }
}

impl From<&Outcome> for Logged {
    fn from(o: &Outcome) -> Self {
        Logged {
            served_by: o.served_by.as_ref().map(ToString::to_string),
            ok: o.ok,
            latency_ms: o.latency_ms,
            prompt_tokens: o.usage.prompt_tokens,
            completion_tokens: o.usage.completion_tokens,
            cost_micro_usd: o.cost_micro_usd,
            confidence: o.confidence,
        }
    }
}

/// Lines are written by a thread of their own: the request path only
/// serialises, and a slow disk never holds up an async worker.
pub struct DecisionLog {
    lines: std::sync::mpsc::Sender<String>,
}

impl DecisionLog {
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        use anyhow::Context;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("cannot open the decision log {}", path.display()))?;
        let (lines, incoming) = std::sync::mpsc::channel::<String>();
        std::thread::Builder::new()
            .name("decision-log".into())
            .spawn(move || {
                let mut file = BufWriter::new(file);
                while let Ok(first) = incoming.recv() {
                    // A burst is written together, then flushed once, so a
                    // reader sees whole lines soon after each request.
                    let written = std::iter::once(first)
                        .chain(incoming.try_iter())
                        .try_for_each(|line| file.write_all(line.as_bytes()))
                        .and_then(|()| file.flush());
                    if let Err(error) = written {
                        tracing::warn!("could not write the decision log: {error}");
                    }
                }
            })
            .context("cannot start the decision log's writer")?;
        Ok(DecisionLog { lines })
    }

    /// Queue one line. A failed write is logged, never a failed request.
    pub fn write(&self, line: &Line) {
        match serde_json::to_string(line) {
            Ok(mut text) => {
                text.push('\n');
                let _ = self.lines.send(text);
            }
            Err(error) => tracing::warn!("could not encode a decision-log line: {error}"),
        }
    }
}
