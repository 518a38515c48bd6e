//! The one place where the policy world's WIT types and the host's
//! vocabulary (`edgeroute_core`) meet. When `edgeroute:routing` grows a new
//! version, its conversions are added here and nowhere else.

use crate::bindings::policy as wit;
use edgeroute_core::{Choice, Decision, Sensitivity, Target};

pub fn sensitivity_to_wit(level: Sensitivity) -> wit::Sensitivity {
    match level {
        Sensitivity::Public => wit::Sensitivity::Public,
        Sensitivity::Internal => wit::Sensitivity::Internal,
        Sensitivity::Restricted => wit::Sensitivity::Restricted,
    }
}

pub fn sensitivity_from_wit(level: wit::Sensitivity) -> Sensitivity {
    match level {
        wit::Sensitivity::Public => Sensitivity::Public,
        wit::Sensitivity::Internal => Sensitivity::Internal,
        wit::Sensitivity::Restricted => Sensitivity::Restricted,
    }
}

pub fn decision_from_wit(decision: wit::Decision) -> Decision {
    let choice = match decision.target {
        wit::Target::Local(model) => Choice::Run(Target::Local(model)),
        wit::Target::Cloud(upstream) => Choice::Run(Target::Cloud(upstream)),
        wit::Target::Reject(message) => Choice::Reject(message),
    };
    Decision {
        choice,
        reason: decision.reason,
    }
}

/// `outcome.served-by` in WIT 0.1 is text: a target's text form, or `none`
/// for a refused request.
pub fn served_by(target: Option<&Target>) -> String {
    target.map_or_else(|| "none".to_string(), ToString::to_string)
}

/// A decision as a comparable label: the target's text form, `reject`, or
/// `failed` (shadow tallies and conformance reports).
pub fn label<E>(decision: &Result<Decision, E>) -> String {
    match decision {
        Ok(Decision {
            choice: Choice::Run(target),
            ..
        }) => target.to_string(),
        Ok(Decision {
            choice: Choice::Reject(_),
            ..
        }) => "reject".into(),
        Err(_) => "failed".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wit_decisions_become_typed_targets() {
        let decision = decision_from_wit(wit::Decision {
            target: wit::Target::Cloud("frontier".into()),
            reason: "long".into(),
        });
        assert_eq!(
            decision,
            Decision::run(Target::Cloud("frontier".into()), "long")
        );
        assert_eq!(label::<()>(&Ok(decision)), "cloud:frontier");
        for level in Sensitivity::ALL {
            assert_eq!(sensitivity_from_wit(sensitivity_to_wit(level)), level);
        }
        assert_eq!(served_by(None), "none");
    }
}
