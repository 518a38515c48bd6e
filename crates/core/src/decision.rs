//! What a routing policy answers, in the host's terms. The WIT bindings of
//! each policy world version convert into these in one place
//! (`host/src/policy/convert.rs`).

use crate::target::Target;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    Run(Target),
    /// The policy refuses the request; the text is shown to the client.
    Reject(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub choice: Choice,
    /// For humans: the reason header, the log, the audit.
    pub reason: String,
}

impl Decision {
    pub fn run(target: Target, reason: impl Into<String>) -> Self {
        Self {
            choice: Choice::Run(target),
            reason: reason.into(),
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
}
