//! What a routing policy answers, in the host's terms. The WIT bindings of
//! each policy world version convert into these in one place
//! (`host/src/policy/convert.rs`).

use crate::target::Target;

#[derive(Debug, Clone, PartialEq)]
pub enum Choice {
    Run(Target),
    /// Try `first`; serve `then` when the first answer's confidence is
    /// below `min_confidence`.
    Cascade(Cascade),
    /// The policy refuses the request; the text is shown to the client.
    Reject(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Cascade {
    pub first: Target,
    pub then: Target,
    pub min_confidence: f32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub choice: Choice,
    /// For humans: the reason header, the log, the audit.
    pub reason: String,
    /// The probability a learned policy chose this with (for replay and
    /// off-policy evaluation); None for a deterministic policy.
    pub propensity: Option<f32>,
}

impl Decision {
    pub fn run(target: Target, reason: impl Into<String>) -> Self {
        Self {
            choice: Choice::Run(target),
            reason: reason.into(),
            propensity: None,
        }
    }
}

/// Why the policy gave no decision.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyFailure {
    #[error("policy timed out after {0} ms")]
    Timeout(u64),
    #[error("policy trapped: {0}")]
    Trap(String),
    /// Its `configure` refused the operator's params (the Spin gateway
    /// configures a fresh instance per request; the node refuses such a
    /// policy at load time instead).
    #[error("policy refused its configuration: {0}")]
    Refused(String),
}
