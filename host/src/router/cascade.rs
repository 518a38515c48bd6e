//! A confidence cascade: the local model answers first, its answer is
//! judged by the model's own confidence, and below the policy's threshold
//! the request is escalated to the second target, when the guard lets it
//! go there (a request that may not leave keeps the local answer, and the
//! reason says it was low-confidence).
//!
//! Non-streaming, the whole local answer is judged. Streaming, the first
//! `[policy] cascade_hold_tokens` tokens are held back and judged, then
//! streamed or dropped. The local answer is kept until the second target
//! has produced its first text, so a failed escalation loses nothing. Both
//! legs are in the ledger; the policy's `observe` gets the first leg's
//! confidence with the outcome of the answer the client received.

use super::run::{self, FirstEvent, Run};

use super::{Context, Failure, Leg, Served};
use crate::bindings::target::Completion;
use crate::targets::{Delta, TargetFailure};
use edgeroute_core::guard::{self, Placement};
use edgeroute_core::{Target, Usage};
use std::collections::VecDeque;

/// The second half of a placed cascade.
pub(super) struct Judge {
    /// None when the guard dropped the second hop.
    pub then: Option<Target>,
    pub min_confidence: f32,
    /// The caller escalates by itself (`x-edgeroute-judge`): below the
    /// threshold, the answer is declined rather than kept.
    pub decline: bool,
}

impl Judge {
    /// For a caller that escalates by itself: judged against its minimum,
    /// declined below it, never sent on by the node.
    pub fn declining(min_confidence: f32) -> Self {
        Self {
            then: None,
            min_confidence,
            decline: true,
        }
    }
}

/// `run` is the cascade's first hop and `first` its first event.
pub(super) async fn judge(
    mut ctx: Context,
    mut run: Run,
    first: FirstEvent,
    judge: Judge,
) -> Result<Served, Failure> {
    let hold = ctx.node.config.policy.cascade_hold_tokens.max(1);
    let (mut held, mut ended) = (VecDeque::new(), None);
    match first {
        FirstEvent::Delta(delta) => held.push_back(delta),
        FirstEvent::Ended(result) => ended = Some(result),
    }
    while ended.is_none() && run.tokens() < hold {
        match run.deltas.recv().await {
            Some(delta) => held.push_back(delta),
            None => ended = Some(run::join(&mut run.task).await),
        }
    }
    if let Some(Err(failure)) = ended {
        return ctx.answer(run, FirstEvent::Ended(Err(failure))).await;
    }
    let Some(confidence) = run.confidence() else {
        return ctx.resume(run, held, ended).await;
    };
    ctx.judged = Some(confidence);
    let min = judge.min_confidence;
    let escalation = judge.then.as_ref().and_then(|then| {
        ctx.with_view(|view| guard::escalate(then, confidence, min, ctx.facts(), view))
    });
    // Holding back the first tokens and judging them.
    ctx.timing.mark("judge");
    let Some(Placement::Run {
        target: then,
        reason: why,
    }) = escalation
    else {
        if judge.decline && confidence < min {
            return ctx.decline(run, ended, confidence, min).await;
        }
        let verdict = if confidence < min {
            format!("low confidence {confidence:.2} < {min:.2}: local answer kept")
        } else {
            format!("confidence {confidence:.2} >= {min:.2}: local answer")
        };
        run.reason = format!("{}; {verdict}", run.reason);
        return ctx.resume(run, held, ended).await;
    };

    let reason = format!("{}; {why}", run.reason);
    let mut second = ctx.launch(then, reason);
    let answer = second.first_event().await;
    ctx.mark_hop(&second);
    if let FirstEvent::Ended(Err(failure)) = &answer {
        ctx.record_leg(
            Some(&second.target),
            false,
            Usage::default(),
            Leg::FailedEscalation,
            None,
        );
        run.reason = format!(
            "{}; {why}, but {} failed ({failure}): local answer kept",
            run.reason, second.target
        );
        return ctx.resume(run, held, ended).await;
    }
    // The second answer is coming: stop the first, and keep it as a leg.
    run.deltas.close();
    let first_result = match ended {
        Some(result) => result,
        None => run::join(&mut run.task).await,
    };
    let usage = first_result.map_or(Usage::default(), |c| ctx.finished(&run.target, c).usage);
    ctx.record_leg(Some(&run.target), true, usage, Leg::Escalated, ctx.judged);
    ctx.answer(second, answer).await
}

impl Context {
    /// Stop the first hop and tell the caller its answer was below the
    /// confidence it asked for; its tokens are in the ledger.
    async fn decline(
        self,
        mut run: Run,
        ended: Option<Result<Completion, TargetFailure>>,
        confidence: f32,
        min_confidence: f32,
    ) -> Result<Served, Failure> {
        run.deltas.close();
        let result = match ended {
            Some(result) => result,
            None => run::join(&mut run.task).await,
        };
        run.reason = format!(
            "{}; low confidence {confidence:.2} < {min_confidence:.2}: declined for the caller to escalate",
            run.reason
        );
        let mut route = self.run_route(&run);
        route.confidence = Some(confidence);
        let usage = result.map_or(Usage::default(), |c| self.finished(&run.target, c).usage);
        // The local work is a leg that was not the answer, as when a
        // cascade escalates; the request got no answer here (the caller's
        // own escalation is its to account for).
        self.record_leg(
            Some(&run.target),
            true,
            usage,
            Leg::Escalated,
            Some(confidence),
        );
        self.finish_request(None, false, Usage::default(), Some(confidence), None)
            .await;
        Err(Failure::Declined {
            confidence,
            min_confidence,
            route,
        })
    }

    /// Go on with the first hop's answer: finished, or streaming from the
    /// held-back text.
    async fn resume(
        self,
        run: Run,
        held: VecDeque<Delta>,
        ended: Option<Result<Completion, TargetFailure>>,
    ) -> Result<Served, Failure> {
        match ended {
            Some(ended) => self.answer_ended(run, ended).await,
            None => Ok(self.answer_streaming(run, held)),
        }
    }
}
