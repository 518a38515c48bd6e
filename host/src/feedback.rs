//! Outcomes of recent requests, kept so a client's later score of an
//! answer (`POST /v1/feedback`) reaches the policy version that routed it,
//! as a second `observe` with the score. Bounded: the oldest are forgotten,
//! and feedback for them is answered like feedback for an unknown id. Only
//! the tenant that made a request may score it (ids are guessable).
//!
//! A version is held weakly: 10,000 remembered requests must not keep
//! 10,000 swapped-out versions (each a compiled component) alive. Feedback
//! for a version that is gone goes to the live one, which carries the
//! learned state across swaps (`snapshot`/`restore`).

use crate::policy::PolicyVersion;
use edgeroute_core::Outcome;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};

/// How many finished requests can still take feedback.
pub const REMEMBERED: usize = 10_000;

#[derive(Default)]
pub struct Recent {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// The version that routed each request, its outcome, and its tenant.
    by_id: HashMap<String, (Weak<PolicyVersion>, Outcome, String)>,
    order: VecDeque<String>,
}

impl Recent {
    pub fn remember(&self, version: &Arc<PolicyVersion>, outcome: &Outcome, tenant: &str) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let id = outcome.request_id.clone();
        let entry = (Arc::downgrade(version), outcome.clone(), tenant.to_string());
        if inner.by_id.insert(id.clone(), entry).is_none() {
            inner.order.push_back(id);
        }
        while inner.order.len() > REMEMBERED {
            if let Some(old) = inner.order.pop_front() {
                inner.by_id.remove(&old);
            }
        }
    }

    /// The request's outcome with `score` as its feedback, and the version
    /// that routed it if it is still loaded; None for an id this node does
    /// not remember, or one another tenant's request (the same answer: no
    /// id is confirmed).
    pub fn with_feedback(
        &self,
        id: &str,
        score: f32,
        tenant: &str,
    ) -> Option<(Option<Arc<PolicyVersion>>, Outcome)> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let (version, outcome, owner) = inner.by_id.get_mut(id)?;
        if owner != tenant {
            return None;
        }
        outcome.feedback = Some(score);
        Some((version.upgrade(), outcome.clone()))
    }
}
