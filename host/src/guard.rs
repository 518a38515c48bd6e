//! The guard: hard rules the policy cannot override. A request whose
//! sensitivity may not leave the node is never placed on a cloud target;
//! when local cannot serve it, the answer is an error, never a quiet cloud
//! fallback. A failed policy gets the configured safe default.

use crate::bindings::policy::{Decision, Features, Target};
use crate::config::OnPolicyFailure;
use crate::features::sensitivity_name;
use crate::policy::PolicyFailure;

/// Where a request goes after the guard.
#[derive(Debug, Clone, PartialEq)]
pub enum Placement {
    Local { model: String, reason: String },
    Cloud { upstream: String, reason: String },
    Refuse(Refusal),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    /// 403 for a policy's reject, 503 when nothing may serve the request.
    pub status: u16,
    pub code: &'static str,
    pub message: String,
    pub reason: String,
}

/// What the guard needs to know about the node.
pub struct NodeView<'a> {
    pub local_models: &'a [String],
    /// The local model used when a request must stay but the policy did
    /// not name a usable one (the first configured model).
    pub default_local: Option<&'a str>,
    pub upstreams: &'a [String],
    pub on_policy_failure: OnPolicyFailure,
}

pub fn place(
    decision: Result<Decision, PolicyFailure>,
    features: &Features,
    node: &NodeView,
) -> Placement {
    let decision = match decision {
        Ok(decision) => decision,
        Err(failure) => return safe_default(&failure.to_string(), features, node),
    };
    let reason = decision.reason;
    match decision.target {
        Target::Reject(message) => Placement::Refuse(Refusal {
            status: 403,
            code: "policy_rejected",
            message: format!("the routing policy refused this request: {message}"),
            reason,
        }),
        Target::Cloud(upstream) if !features.may_leave => stay_local(
            None,
            format!(
                "guard: {} data may not leave the node (policy wanted cloud:{upstream})",
                sensitivity_name(features.sensitivity)
            ),
            features,
            node,
        ),
        Target::Cloud(upstream) if !node.upstreams.contains(&upstream) => safe_default(
            &format!("policy named unknown upstream '{upstream}'"),
            features,
            node,
        ),
        Target::Cloud(upstream) => Placement::Cloud { upstream, reason },
        Target::Local(model) => stay_local(Some(model), reason, features, node),
    }
}

/// The policy gave no usable answer: the configured default, guarded.
fn safe_default(why: &str, features: &Features, node: &NodeView) -> Placement {
    match node.on_policy_failure {
        OnPolicyFailure::Local => {
            stay_local(None, format!("{why}; safe default: local"), features, node)
        }
        OnPolicyFailure::Error => Placement::Refuse(Refusal {
            status: 503,
            code: "policy_failed",
            message: format!("the routing policy failed ({why}) and the node is set to refuse"),
            reason: format!("{why}; safe default: error"),
        }),
    }
}

/// Run locally if the model is there; otherwise fall back to the cloud only
/// when the request may leave, else fail closed.
fn stay_local(
    model: Option<String>,
    reason: String,
    features: &Features,
    node: &NodeView,
) -> Placement {
    let model = model.filter(|m| node.local_models.contains(m)).or_else(|| {
        node.default_local
            .filter(|m| node.local_models.iter().any(|l| l == m))
            .map(str::to_string)
    });
    if let Some(model) = model {
        return Placement::Local { model, reason };
    }
    if features.may_leave
        && let Some(upstream) = node.upstreams.first()
    {
        return Placement::Cloud {
            upstream: upstream.clone(),
            reason: format!("{reason}; local model unavailable: cloud fallback"),
        };
    }
    Placement::Refuse(unavailable_locally(features, &reason))
}

/// The fail-closed answer for a request that may not leave.
pub fn unavailable_locally(features: &Features, reason: &str) -> Refusal {
    Refusal {
        status: 503,
        code: "local_unavailable",
        message: format!(
            "this request is {} and may only run on this node, but no local model can serve it now; it was not sent anywhere",
            sensitivity_name(features.sensitivity)
        ),
        reason: format!("{reason}; local unavailable: fail closed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bindings::policy::Sensitivity;

    fn features(sensitivity: Sensitivity, may_leave: bool) -> Features {
        crate::conformance::features(10, sensitivity, may_leave, &[], &[])
    }

    fn cloud(name: &str) -> Result<Decision, PolicyFailure> {
        Ok(Decision {
            target: Target::Cloud(name.into()),
            reason: "policy".into(),
        })
    }

    const MODELS: &[String] = &[];

    #[test]
    fn restricted_never_goes_to_cloud_even_when_the_policy_says_so() {
        let local = vec!["smollm2".to_string()];
        let ups = vec!["frontier".to_string()];
        let node = NodeView {
            local_models: &local,
            default_local: Some("smollm2"),
            upstreams: &ups,
            on_policy_failure: OnPolicyFailure::Local,
        };
        let placed = place(
            cloud("frontier"),
            &features(Sensitivity::Restricted, false),
            &node,
        );
        assert!(
            matches!(placed, Placement::Local { ref model, .. } if model == "smollm2"),
            "{placed:?}"
        );
    }

    #[test]
    fn restricted_without_local_fails_closed_whatever_happened() {
        let ups = vec!["frontier".to_string()];
        let node = NodeView {
            local_models: MODELS,
            default_local: Some("smollm2"),
            upstreams: &ups,
            on_policy_failure: OnPolicyFailure::Local,
        };
        let f = features(Sensitivity::Restricted, false);
        for decision in [
            cloud("frontier"),
            Ok(Decision {
                target: Target::Local("smollm2".into()),
                reason: "p".into(),
            }),
            Err(PolicyFailure::Timeout(5)),
            Err(PolicyFailure::Trap("boom".into())),
        ] {
            match place(decision, &f, &node) {
                Placement::Refuse(r) => assert_eq!((r.status, r.code), (503, "local_unavailable")),
                other => panic!("restricted request placed at {other:?}"),
            }
        }
    }

    #[test]
    fn public_request_falls_back_to_cloud_when_local_is_missing() {
        let ups = vec!["frontier".to_string()];
        let node = NodeView {
            local_models: MODELS,
            default_local: Some("smollm2"),
            upstreams: &ups,
            on_policy_failure: OnPolicyFailure::Local,
        };
        let placed = place(
            Ok(Decision {
                target: Target::Local("smollm2".into()),
                reason: "short".into(),
            }),
            &features(Sensitivity::Public, true),
            &node,
        );
        assert!(matches!(placed, Placement::Cloud { .. }), "{placed:?}");
    }

    #[test]
    fn policy_failure_with_error_default_refuses() {
        let local = vec!["smollm2".to_string()];
        let node = NodeView {
            local_models: &local,
            default_local: Some("smollm2"),
            upstreams: &[],
            on_policy_failure: OnPolicyFailure::Error,
        };
        let placed = place(
            Err(PolicyFailure::Timeout(5)),
            &features(Sensitivity::Public, true),
            &node,
        );
        assert!(
            matches!(
                placed,
                Placement::Refuse(Refusal {
                    code: "policy_failed",
                    ..
                })
            ),
            "{placed:?}"
        );
    }
}
