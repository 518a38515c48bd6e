//! The guard: hard rules the policy cannot override. It is the only place
//! that decides where data may go, and it is asked at every hop: the first
//! placement ([`place`]) and every fallback after a local failure
//! ([`after_local_failure`]).
//!
//! - A request that may not leave is never placed on a target off the node.
//! - When local cannot serve such a request, the answer is a refusal, never
//!   a quiet cloud fallback.
//! - A policy that failed gets the configured safe default.

use crate::decision::{Cascade, Choice, Decision, PolicyFailure};
use crate::refusal::{Refusal, Refused};
use crate::sensitivity::Sensitivity;
use crate::target::Target;
use serde::Deserialize;

/// What to do when the policy gives no usable answer.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum OnPolicyFailure {
    /// Serve on the first local model (the guard still applies).
    #[default]
    Local,
    /// Refuse the request.
    Error,
}

/// The operator's rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rules {
    /// Levels that may never leave the node.
    pub never_leave: Vec<Sensitivity>,
    pub on_policy_failure: OnPolicyFailure,
}

impl Default for Rules {
    fn default() -> Self {
        Self {
            never_leave: vec![Sensitivity::Restricted],
            on_policy_failure: OnPolicyFailure::Local,
        }
    }
}

impl Rules {
    pub fn may_leave(&self, level: Sensitivity) -> bool {
        !self.never_leave.contains(&level)
    }
}

/// What the guard needs to know about a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    pub sensitivity: Sensitivity,
    pub may_leave: bool,
    /// The client's tenant may not use targets off the node, whatever the
    /// data's level (`may_leave` is then false too).
    pub tenant_confined: bool,
    /// The level may go to a peer in this node's trust zone even though
    /// it may not leave for the cloud (`[guard] zone_levels`).
    pub may_stay_in_zone: bool,
}

impl Facts {
    /// Facts for a request judged by its level alone.
    pub fn of_level(sensitivity: Sensitivity, may_leave: bool) -> Self {
        Self {
            sensitivity,
            may_leave,
            tenant_confined: false,
            may_stay_in_zone: false,
        }
    }

    /// Whether the request may be forwarded to `peer`: anywhere when it
    /// may leave, inside the trust zone when its level may stay there,
    /// never for a confined tenant.
    pub fn may_go_to(&self, peer: &PeerView<'_>) -> bool {
        !self.tenant_confined && (self.may_leave || (peer.same_zone && self.may_stay_in_zone))
    }

    /// Why a request that may not leave stays: its data, or its tenant.
    fn why_stays(&self) -> String {
        if self.tenant_confined {
            "this client's tenant may only use this node".to_string()
        } else {
            format!("{} data may not leave the node", self.sensitivity)
        }
    }
}

/// What the guard needs to know about the node.
#[derive(Debug, Clone, Copy)]
pub struct NodeView<'a> {
    pub local_models: &'a [String],
    /// Where a request that must stay goes when the policy named no usable
    /// local model (the first configured model).
    pub default_local: Option<&'a str>,
    pub upstreams: &'a [String],
    pub on_policy_failure: OnPolicyFailure,
    /// Peers of the fleet that are candidates now (fresh load reports);
    /// empty on a single node and for a request that was forwarded here
    /// (a forwarded request is never forwarded again).
    pub peers: &'a [PeerView<'a>],
    /// The peer the host chose for this request (`edgeroute_core::fleet`)
    /// if it must leave this node for the fleet; None when there is none.
    pub peer_pick: Option<&'a str>,
}

/// A peer as the guard sees it (borrowed from the request's features).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerView<'a> {
    pub name: &'a str,
    /// In this node's trust zone.
    pub same_zone: bool,
}

/// Where a request goes after the guard.
#[derive(Debug, Clone, PartialEq)]
pub enum Placement {
    Run {
        target: Target,
        reason: String,
    },
    /// Run `first` (a local model: confidence is measured there) and judge
    /// its answer; below `min_confidence`, ask [`escalate`] for `then`.
    /// `then` is None when the guard dropped the second hop (the request
    /// may not go there): the answer is still judged, so the response can
    /// say it was low-confidence.
    Cascade {
        first: Target,
        then: Option<Target>,
        min_confidence: f32,
        reason: String,
    },
    Refuse(Refused),
}

impl Placement {
    fn refuse(cause: Refusal, reason: impl Into<String>) -> Self {
        Placement::Refuse(Refused {
            cause,
            reason: reason.into(),
        })
    }
}

/// The first placement of a request, from the policy's answer.
pub fn place(
    decision: Result<Decision, PolicyFailure>,
    facts: &Facts,
    node: &NodeView,
) -> Placement {
    let decision = match decision {
        Ok(decision) => decision,
        Err(failure) => return safe_default(&failure.to_string(), facts, node),
    };
    let reason = decision.reason;
    let target = match decision.choice {
        Choice::Reject(message) => {
            return Placement::refuse(Refusal::PolicyRejected { message }, reason);
        }
        Choice::Run(target) => target,
        Choice::Cascade(cascade) => return place_cascade(cascade, reason, facts, node),
    };
    place_target(target, reason, facts, node)
}

/// Both hops of a cascade are judged by the same rules as a single target.
/// Only a local first hop can be judged (confidence is measured on local
/// models); a second hop the guard would not allow is dropped, and the
/// request keeps whatever the first hop answers.
fn place_cascade(cascade: Cascade, reason: String, facts: &Facts, node: &NodeView) -> Placement {
    let min = cascade.min_confidence;
    let first = place_target(cascade.first.clone(), reason, facts, node);
    let Placement::Run { target, reason } = first else {
        return first;
    };
    if !matches!(target, Target::Local(_)) {
        let reason = format!(
            "{reason}; no escalation to {}: confidence is measured only on local models",
            cascade.then
        );
        return Placement::Run { target, reason };
    }
    if !min.is_finite() || min <= 0.0 {
        return Placement::Run { target, reason };
    }
    let then = match place_target(cascade.then.clone(), String::new(), facts, node) {
        Placement::Run { target: then, .. } if then == cascade.then && then != target => Ok(then),
        _ if !facts.may_leave => Err(facts.why_stays()),
        _ => Err("not available".to_string()),
    };
    let reason = match &then {
        Ok(then) => format!("{reason}; escalate to {then} below confidence {min:.2}"),
        Err(why) => format!("{reason}; no escalation to {}: {why}", cascade.then),
    };
    Placement::Cascade {
        first: target,
        then: then.ok(),
        min_confidence: min,
        reason,
    }
}

/// The first hop of a cascade answered with `confidence`. Below the
/// threshold, the second hop, judged again (the guard is asked at every
/// hop); None keeps the first answer.
pub fn escalate(
    then: &Target,
    confidence: f32,
    min_confidence: f32,
    facts: &Facts,
    node: &NodeView,
) -> Option<Placement> {
    if confidence >= min_confidence {
        return None;
    }
    let reason = format!("escalated: confidence {confidence:.2} < {min_confidence:.2}");
    match place_target(then.clone(), reason, facts, node) {
        placed @ Placement::Run { .. } if matches!(&placed, Placement::Run { target, .. } if target == then) => {
            Some(placed)
        }
        _ => None,
    }
}

/// Place one target the policy named.
fn place_target(target: Target, reason: String, facts: &Facts, node: &NodeView) -> Placement {
    match target {
        Target::Local(model) => stay_local(Some(model), reason, facts, node),
        // A peer that is a candidate now and that this request may reach;
        // any other peer is judged like the cloud below (stay, or unknown).
        Target::Peer(name)
            if node
                .peers
                .iter()
                .any(|p| p.name == name && facts.may_go_to(p)) =>
        {
            Placement::Run {
                target: Target::Peer(name),
                reason,
            }
        }
        off_node if !facts.may_leave => stay_local(
            None,
            format!("guard: {} (policy wanted {off_node})", facts.why_stays()),
            facts,
            node,
        ),
        Target::Cloud(upstream) if node.upstreams.contains(&upstream) => Placement::Run {
            target: Target::Cloud(upstream),
            reason,
        },
        unknown => safe_default(
            &format!("policy named unknown target '{unknown}'"),
            facts,
            node,
        ),
    }
}

/// Why a local run could not start; each is a new hop for the guard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocalFailure {
    Busy {
        queue: u32,
    },
    /// The request uses a feature only an upstream serves (`tools`).
    Unsupported(String),
    Unavailable(String),
    TooLong {
        prompt_tokens: u32,
        context: u32,
    },
}

impl std::fmt::Display for LocalFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LocalFailure::Busy { queue } => write!(
                f,
                "the local queue is full ({queue} requests waiting or running)"
            ),
            LocalFailure::Unavailable(why) => f.write_str(why),
            LocalFailure::Unsupported(what) => write!(f, "the local model cannot serve {what}"),
            LocalFailure::TooLong {
                prompt_tokens,
                context,
            } => write!(
                f,
                "the prompt is {prompt_tokens} tokens; the local model's context holds {context}"
            ),
        }
    }
}

/// Local could not serve: a request that may leave goes to the cloud, one
/// that may not gets a refusal naming the cause and goes nowhere.
pub fn after_local_failure(
    failure: &LocalFailure,
    reason: &str,
    facts: &Facts,
    node: &NodeView,
) -> Placement {
    // A busy or missing local model is this node's problem, not the
    // request's: a peer the request may reach serves it before the cloud.
    if let (LocalFailure::Busy { .. } | LocalFailure::Unavailable(_), Some(pick)) =
        (failure, node.peer_pick)
        && let Some(peer) = node.peers.iter().find(|p| p.name == pick)
        && facts.may_go_to(peer)
    {
        return Placement::Run {
            target: Target::Peer(peer.name.to_string()),
            reason: format!("{reason}; local failed ({failure}): forwarded to peer"),
        };
    }
    if facts.may_leave {
        return match node.upstreams.first() {
            Some(upstream) => Placement::Run {
                target: Target::Cloud(upstream.clone()),
                reason: format!("{reason}; local failed ({failure}): cloud fallback"),
            },
            None => Placement::refuse(
                Refusal::NoTarget {
                    why: failure.to_string(),
                },
                format!("{reason}; {failure}"),
            ),
        };
    }
    let cause = match failure {
        LocalFailure::Busy { queue } => Refusal::LocalBusy {
            sensitivity: facts.sensitivity,
            queue: *queue,
        },
        LocalFailure::TooLong {
            prompt_tokens,
            context,
        } => Refusal::PromptTooLong {
            prompt_tokens: *prompt_tokens,
            context: *context,
        },
        LocalFailure::Unavailable(_) => Refusal::LocalUnavailable {
            sensitivity: facts.sensitivity,
        },
        LocalFailure::Unsupported(what) => Refusal::Unsupported { what: what.clone() },
    };
    Placement::refuse(cause, format!("{reason}; {failure}: fail closed"))
}

/// A cloud run failed before it produced any text. Staying on the node
/// needs no permission, so the request may be served locally when a local
/// model is there; it is never sent to another upstream, so no upstream
/// sees it twice. None: nothing else can serve it.
pub fn after_cloud_failure(why: &str, reason: &str, node: &NodeView) -> Option<Placement> {
    let model = node
        .default_local
        .filter(|m| node.local_models.iter().any(|l| l == m))?;
    Some(Placement::Run {
        target: Target::Local(model.to_string()),
        reason: format!("{reason}; cloud failed ({why}): local fallback"),
    })
}

/// Whether a request that already tried `tried` may go on to `next`:
/// never the same target twice, and never a second target off the node
/// (the first may have received the request before it failed; another
/// upstream must not get a copy too).
pub fn may_try(tried: &[Target], next: &Target) -> bool {
    let again = tried.contains(next);
    let second_off_node = next.leaves_node() && tried.iter().any(Target::leaves_node);
    !again && !second_off_node
}

/// The policy gave no usable answer: the configured default, guarded.
fn safe_default(why: &str, facts: &Facts, node: &NodeView) -> Placement {
    match node.on_policy_failure {
        OnPolicyFailure::Local => {
            stay_local(None, format!("{why}; safe default: local"), facts, node)
        }
        OnPolicyFailure::Error => Placement::refuse(
            Refusal::PolicyFailed {
                why: why.to_string(),
            },
            format!("{why}; safe default: error"),
        ),
    }
}

/// Run locally if the model is there; otherwise fall back to the cloud only
/// when the request may leave, else fail closed.
fn stay_local(model: Option<String>, reason: String, facts: &Facts, node: &NodeView) -> Placement {
    let model = model.filter(|m| node.local_models.contains(m)).or_else(|| {
        node.default_local
            .filter(|m| node.local_models.iter().any(|l| l == m))
            .map(str::to_string)
    });
    match model {
        Some(model) => Placement::Run {
            target: Target::Local(model),
            reason,
        },
        None => after_local_failure(
            &LocalFailure::Unavailable("local model unavailable".into()),
            &reason,
            facts,
            node,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PUBLIC: Facts = Facts {
        sensitivity: Sensitivity::Public,
        may_leave: true,
        tenant_confined: false,
        may_stay_in_zone: true,
    };
    const RESTRICTED: Facts = Facts {
        sensitivity: Sensitivity::Restricted,
        may_leave: false,
        tenant_confined: false,
        may_stay_in_zone: false,
    };

    fn names(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn view<'a>(local: &'a [String], ups: &'a [String], on: OnPolicyFailure) -> NodeView<'a> {
        NodeView {
            local_models: local,
            default_local: Some("smollm2"),
            upstreams: ups,
            on_policy_failure: on,
            peers: &[],
            peer_pick: None,
        }
    }

    fn cloud(name: &str) -> Result<Decision, PolicyFailure> {
        Ok(Decision::run(Target::Cloud(name.into()), "policy"))
    }

    fn is_off_node(placement: &Placement) -> bool {
        match placement {
            Placement::Run { target, .. } => target.leaves_node(),
            Placement::Cascade { first, then, .. } => {
                first.leaves_node() || then.as_ref().is_some_and(Target::leaves_node)
            }
            Placement::Refuse(_) => false,
        }
    }

    #[test]
    fn a_request_tries_each_target_once_and_at_most_one_upstream() {
        let (local, a, b) = (
            Target::Local("smollm2".into()),
            Target::Cloud("a".into()),
            Target::Cloud("b".into()),
        );
        assert!(may_try(&[], &a));
        assert!(may_try(std::slice::from_ref(&a), &local));
        assert!(!may_try(&[a.clone(), local.clone()], &a));
        assert!(!may_try(&[a.clone(), local.clone()], &b));
        assert!(may_try(std::slice::from_ref(&local), &b));
        assert!(!may_try(std::slice::from_ref(&local), &local));
    }

    #[test]
    fn a_confined_tenant_stays_local_and_the_reason_names_the_tenant() {
        let (local, ups) = (names(&["smollm2"]), names(&["frontier"]));
        let node = view(&local, &ups, OnPolicyFailure::Local);
        let confined = Facts {
            may_leave: false,
            tenant_confined: true,
            ..PUBLIC
        };
        let placed = place(cloud("frontier"), &confined, &node);
        assert!(
            matches!(&placed, Placement::Run { target: Target::Local(_), reason } if reason.contains("tenant")),
            "{placed:?}"
        );
    }

    #[test]
    fn restricted_never_goes_off_node_even_when_the_policy_says_so() {
        let (local, ups) = (names(&["smollm2"]), names(&["frontier"]));
        let node = view(&local, &ups, OnPolicyFailure::Local);
        for target in [
            Target::Cloud("frontier".into()),
            Target::Peer("edge-2".into()),
        ] {
            let placed = place(Ok(Decision::run(target, "p")), &RESTRICTED, &node);
            assert!(
                matches!(&placed, Placement::Run { target: Target::Local(m), reason }
                    if m == "smollm2" && reason.contains("may not leave")),
                "{placed:?}"
            );
        }
    }

    #[test]
    fn restricted_without_local_fails_closed_whatever_happened() {
        let ups = names(&["frontier"]);
        let node = view(&[], &ups, OnPolicyFailure::Local);
        for decision in [
            cloud("frontier"),
            Ok(Decision::run(Target::Local("smollm2".into()), "p")),
            Err(PolicyFailure::Timeout(5)),
            Err(PolicyFailure::Trap("boom".into())),
        ] {
            match place(decision, &RESTRICTED, &node) {
                Placement::Refuse(r) => assert_eq!(r.cause.code(), "local_unavailable"),
                other => panic!("restricted request placed at {other:?}"),
            }
        }
    }

    #[test]
    fn every_fallback_hop_keeps_restricted_data_in() {
        let (local, ups) = (names(&["smollm2"]), names(&["frontier"]));
        let node = view(&local, &ups, OnPolicyFailure::Local);
        for (failure, code) in [
            (LocalFailure::Busy { queue: 8 }, "local_busy"),
            (
                LocalFailure::Unavailable("gone".into()),
                "local_unavailable",
            ),
            (
                LocalFailure::TooLong {
                    prompt_tokens: 5000,
                    context: 2048,
                },
                "prompt_too_long",
            ),
        ] {
            let placed = after_local_failure(&failure, "r", &RESTRICTED, &node);
            assert!(!is_off_node(&placed), "{placed:?}");
            match placed {
                Placement::Refuse(r) => assert_eq!(r.cause.code(), code),
                other => panic!("{other:?}"),
            }
            let public = after_local_failure(&failure, "r", &PUBLIC, &node);
            assert!(
                matches!(&public, Placement::Run { target: Target::Cloud(u), .. } if u == "frontier"),
                "{public:?}"
            );
        }
    }

    #[test]
    fn public_request_falls_back_to_cloud_when_local_is_missing() {
        let ups = names(&["frontier"]);
        let node = view(&[], &ups, OnPolicyFailure::Local);
        let placed = place(
            Ok(Decision::run(Target::Local("smollm2".into()), "short")),
            &PUBLIC,
            &node,
        );
        assert!(is_off_node(&placed), "{placed:?}");
    }

    #[test]
    fn unknown_targets_and_failures_get_the_safe_default() {
        let local = names(&["smollm2"]);
        let node = view(&local, &[], OnPolicyFailure::Error);
        for decision in [
            Err(PolicyFailure::Timeout(5)),
            cloud("nowhere"),
            Ok(Decision::run(Target::Peer("edge-9".into()), "p")),
        ] {
            match place(decision, &PUBLIC, &node) {
                Placement::Refuse(r) => assert_eq!(r.cause.code(), "policy_failed"),
                other => panic!("{other:?}"),
            }
        }
        let node = view(&local, &[], OnPolicyFailure::Local);
        let placed = place(cloud("nowhere"), &PUBLIC, &node);
        assert!(
            matches!(&placed, Placement::Run { target: Target::Local(m), reason } if m == "smollm2" && reason.contains("unknown target 'cloud:nowhere'")),
            "{placed:?}"
        );
    }

    #[test]
    fn a_policy_reject_is_a_refusal_with_its_message() {
        let node = view(&[], &[], OnPolicyFailure::Local);
        let placed = place(
            Ok(Decision {
                choice: Choice::Reject("no".into()),
                reason: "why".into(),
                propensity: None,
            }),
            &PUBLIC,
            &node,
        );
        assert_eq!(
            placed,
            Placement::Refuse(Refused {
                cause: Refusal::PolicyRejected {
                    message: "no".into()
                },
                reason: "why".into()
            })
        );
    }

    #[test]
    fn a_cascade_is_judged_hop_by_hop() {
        let (local, ups) = (names(&["smollm2"]), names(&["frontier"]));
        let node = view(&local, &ups, OnPolicyFailure::Local);
        let cascade = |first: Target, then: Target| {
            Ok(Decision {
                choice: Choice::Cascade(Cascade {
                    first,
                    then,
                    min_confidence: 0.5,
                }),
                reason: "plan".into(),
                propensity: Some(0.9),
            })
        };
        let (smol, frontier) = (
            Target::Local("smollm2".into()),
            Target::Cloud("frontier".into()),
        );
        // Restricted: the second hop is dropped, and says why.
        let placed = place(cascade(smol.clone(), frontier.clone()), &RESTRICTED, &node);
        assert!(
            matches!(&placed, Placement::Cascade { first, then: None, reason, .. } if *first == smol && reason.contains("restricted data may not leave")),
            "{placed:?}"
        );
        let placed = place(cascade(frontier.clone(), smol.clone()), &RESTRICTED, &node);
        assert!(!is_off_node(&placed), "{placed:?}");
        // Public: both hops placed.
        let placed = place(cascade(smol.clone(), frontier.clone()), &PUBLIC, &node);
        assert!(
            matches!(&placed, Placement::Cascade { first, then: Some(then), min_confidence, .. }
                if *first == smol && *then == frontier && *min_confidence == 0.5),
            "{placed:?}"
        );
        // A cloud first hop cannot be judged: it simply runs.
        let placed = place(cascade(frontier.clone(), smol.clone()), &PUBLIC, &node);
        assert!(
            matches!(&placed, Placement::Run { target, reason } if *target == frontier && reason.contains("measured only on local")),
            "{placed:?}"
        );
        // An unknown second hop is dropped, not a failure.
        let placed = place(
            cascade(smol.clone(), Target::Cloud("gone".into())),
            &PUBLIC,
            &node,
        );
        assert!(
            matches!(&placed, Placement::Cascade { first, then: None, reason, .. } if *first == smol && reason.contains("not available")),
            "{placed:?}"
        );
    }

    #[test]
    fn escalation_only_below_the_threshold_and_only_where_data_may_go() {
        let (local, ups) = (names(&["smollm2"]), names(&["frontier"]));
        let node = view(&local, &ups, OnPolicyFailure::Local);
        let frontier = Target::Cloud("frontier".into());
        assert_eq!(escalate(&frontier, 0.7, 0.6, &PUBLIC, &node), None);
        let placed = escalate(&frontier, 0.41, 0.6, &PUBLIC, &node);
        assert!(
            matches!(&placed, Some(Placement::Run { target, reason }) if *target == frontier && reason == "escalated: confidence 0.41 < 0.60"),
            "{placed:?}"
        );
        assert_eq!(escalate(&frontier, 0.0, 0.6, &RESTRICTED, &node), None);
    }

    #[test]
    fn a_failed_cloud_call_falls_back_locally_only_when_a_model_is_there() {
        let (local, ups) = (names(&["smollm2"]), names(&["frontier"]));
        let node = view(&local, &ups, OnPolicyFailure::Local);
        let placed = after_cloud_failure("connection refused", "long", &node);
        assert!(
            matches!(&placed, Some(Placement::Run { target: Target::Local(m), reason })
                if m == "smollm2" && reason.contains("cloud failed (connection refused): local fallback")),
            "{placed:?}"
        );
        let node = view(&[], &ups, OnPolicyFailure::Local);
        assert_eq!(after_cloud_failure("refused", "long", &node), None);
    }

    #[test]
    fn never_leave_rules() {
        let rules = Rules {
            never_leave: vec![Sensitivity::Internal, Sensitivity::Restricted],
            ..Rules::default()
        };
        assert!(rules.may_leave(Sensitivity::Public));
        assert!(!rules.may_leave(Sensitivity::Internal));
        assert!(!Rules::default().may_leave(Sensitivity::Restricted));
    }

    fn fleet() -> Vec<PeerView<'static>> {
        vec![
            PeerView {
                name: "edge-2",
                same_zone: true,
            },
            PeerView {
                name: "far-1",
                same_zone: false,
            },
        ]
    }

    #[test]
    fn a_busy_node_forwards_to_the_picked_peer_within_what_the_level_allows() {
        let (local, ups, peers) = (names(&["smollm2"]), names(&["frontier"]), fleet());
        let busy = LocalFailure::Busy { queue: 4 };
        for (pick, facts, forwarded) in [
            ("edge-2", PUBLIC, true),
            ("far-1", PUBLIC, true),
            // Restricted data stays on the node by default…
            ("edge-2", RESTRICTED, false),
            // …may stay in the zone when the operator allows it…
            (
                "edge-2",
                Facts {
                    may_stay_in_zone: true,
                    ..RESTRICTED
                },
                true,
            ),
            // …and never crosses into another zone.
            (
                "far-1",
                Facts {
                    may_stay_in_zone: true,
                    ..RESTRICTED
                },
                false,
            ),
            // A confined tenant never reaches a peer.
            (
                "edge-2",
                Facts {
                    may_leave: false,
                    tenant_confined: true,
                    ..PUBLIC
                },
                false,
            ),
        ] {
            let node = NodeView {
                peers: &peers,
                peer_pick: Some(pick),
                ..view(&local, &ups, OnPolicyFailure::Local)
            };
            let placed = after_local_failure(&busy, "r", &facts, &node);
            let to_peer =
                matches!(&placed, Placement::Run { target: Target::Peer(p), .. } if p == pick);
            assert_eq!(to_peer, forwarded, "{pick} {facts:?}: {placed:?}");
            if !facts.may_leave {
                assert!(
                    !matches!(
                        &placed,
                        Placement::Run {
                            target: Target::Cloud(_),
                            ..
                        }
                    ),
                    "{placed:?}"
                );
            }
            // The policy naming the peer is judged by the same rule.
            let named = place(
                Ok(Decision::run(Target::Peer(pick.into()), "p")),
                &facts,
                &node,
            );
            let named_peer = matches!(
                &named,
                Placement::Run {
                    target: Target::Peer(_),
                    ..
                }
            );
            assert_eq!(named_peer, forwarded, "{pick} {facts:?}: {named:?}");
        }
    }

    #[test]
    fn a_peer_that_is_not_a_candidate_is_never_used() {
        let (local, ups, peers) = (names(&["smollm2"]), names(&["frontier"]), fleet());
        // A forwarded request sees no peers: it is never forwarded again.
        let forwarded = NodeView {
            peers: &[],
            peer_pick: Some("edge-2"),
            ..view(&local, &ups, OnPolicyFailure::Local)
        };
        let busy = LocalFailure::Busy { queue: 4 };
        let placed = after_local_failure(&busy, "r", &PUBLIC, &forwarded);
        assert!(
            matches!(
                &placed,
                Placement::Run {
                    target: Target::Cloud(_),
                    ..
                }
            ),
            "{placed:?}"
        );
        let node = NodeView {
            peers: &peers,
            ..view(&local, &ups, OnPolicyFailure::Local)
        };
        let stale = place(
            Ok(Decision::run(Target::Peer("edge-9".into()), "p")),
            &PUBLIC,
            &node,
        );
        assert!(
            matches!(&stale, Placement::Run { target: Target::Local(_), reason } if reason.contains("unknown target")),
            "{stale:?}"
        );
        // Only Busy and Unavailable move a request to a peer: a prompt too
        // long for the model is too long on a peer with the same model.
        let long = LocalFailure::TooLong {
            prompt_tokens: 9000,
            context: 2048,
        };
        let picked = NodeView {
            peer_pick: Some("edge-2"),
            ..node
        };
        assert!(matches!(
            after_local_failure(&long, "r", &PUBLIC, &picked),
            Placement::Run {
                target: Target::Cloud(_),
                ..
            }
        ));
    }
}
