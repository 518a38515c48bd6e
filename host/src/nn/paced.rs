//! The paced test backend (`[local.test_backend]`): a stand-in for the
//! llama.cpp batch that produces a fixed, labelled text at a configured
//! prefill and decode speed instead of running the model. It exists so a
//! fleet of several nodes on one machine measures placement, not the CPU
//! three real models would fight over (`edgeroute bench --fleet-loopback`).
//! Everything around it is real: the model's tokenizer and chat template,
//! the local-worker component over wasi-nn, admission, the router, policy,
//! guard, forwarding and the fleet's reports.
//!
//! It speaks the scheduler's protocol (`Submit` in, `Event` out), so the
//! wasi-nn backend cannot tell the difference. Each of `width` slots runs
//! one generation at the configured per-stream speeds (as if the batch
//! kept every stream at that speed); more requests wait in order. No KV
//! cells are reserved and nothing is reused; stop sequences and grammars
//! are not applied.

use super::engine::{Finish, LoadedModel, Step, ms};
use super::scheduler::{Event, Shared, Submit};
use edgeroute_core::Confidence;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// How fast the test backend pretends to be, per stream
/// (`[local.test_backend]`).
#[derive(Debug, Clone, Copy, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pace {
    pub prefill_tokens_per_s: f64,
    pub decode_tokens_per_s: f64,
}

/// What every paced completion says, word by word (one word per token),
/// so no one mistakes it for a model's answer.
const WORDS: [&str; 8] = [
    "[paced",
    " test",
    " backend:",
    " not",
    " a",
    " model's",
    " answer]",
    " ",
];

/// The log-probability each paced token reports: a confident model, so a
/// confidence cascade keeps the local answer.
const LOGPROB: f32 = -0.05;

struct Running {
    submit: Submit,
    /// When the next token is due.
    due: Instant,
    every: Duration,
    completion_tokens: u32,
    confidence: Confidence,
}

/// The paced scheduler thread: admit in order into `width` slots, hand
/// out each slot's tokens when they are due, until the handle is dropped
/// and nothing runs.
pub(super) fn run(
    model: Arc<LoadedModel>,
    width: usize,
    pace: Pace,
    requests: Receiver<Submit>,
    shared: Arc<Shared>,
) {
    let per_prefill = Duration::from_secs_f64(1.0 / pace.prefill_tokens_per_s);
    let per_token = Duration::from_secs_f64(1.0 / pace.decode_tokens_per_s);
    // The host's latency estimates read these speeds as if measured.
    let report_speed = || {
        model.measured(|speed| {
            speed.prefill_ms_per_token.add(ms(per_prefill));
            speed.decode_ms_per_token.add(ms(per_token));
        })
    };
    report_speed();
    let mut waiting: VecDeque<Submit> = VecDeque::new();
    let mut running: Vec<Running> = Vec::new();
    // The handle is gone: finish what was submitted, then end.
    let mut closed = false;
    loop {
        let next_due = running.iter().map(|r| r.due).min();
        let until = |due: Instant| due.saturating_duration_since(Instant::now());
        let received = match next_due {
            None if closed && waiting.is_empty() => return,
            None if closed => Err(RecvTimeoutError::Timeout),
            None => requests.recv().map_err(|_| RecvTimeoutError::Disconnected),
            Some(due) if closed => {
                std::thread::sleep(until(due));
                Err(RecvTimeoutError::Timeout)
            }
            Some(due) => requests.recv_timeout(until(due)),
        };
        match received {
            Ok(submit) => waiting.push_back(submit),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => closed = true,
        }
        while let Ok(submit) = requests.try_recv() {
            waiting.push_back(submit);
        }
        waiting.retain(|s| !s.cancelled.load(Ordering::Relaxed));
        running.retain(|r| !r.submit.cancelled.load(Ordering::Relaxed));
        let now = Instant::now();
        while running.len() < width
            && let Some(submit) = waiting.pop_front()
        {
            if submit.events.send(Event::Admitted { reused: 0 }).is_err() {
                continue;
            }
            report_speed();
            running.push(Running {
                due: now + per_prefill * submit.tokens.len() as u32,
                every: per_token,
                completion_tokens: 0,
                confidence: Confidence::default(),
                submit,
            });
        }
        shared
            .running
            .store(running.len() as u32, Ordering::Relaxed);
        shared
            .waiting
            .store(waiting.len() as u32, Ordering::Relaxed);
        let now = Instant::now();
        running.retain_mut(|r| r.due > now || hand_out(r));
    }
}

/// Send a due token; whether the generation goes on.
fn hand_out(r: &mut Running) -> bool {
    let i = r.completion_tokens as usize % WORDS.len();
    r.completion_tokens += 1;
    r.confidence.add(LOGPROB);
    let last = r.completion_tokens >= r.submit.max_tokens;
    let event = Event::Token {
        step: Step {
            text: WORDS[i].to_string(),
            finish: last.then_some(Finish::Length),
        },
        completion_tokens: r.completion_tokens,
        confidence: r.confidence,
    };
    // From the due time, not from now: a late wake-up does not slow the pace.
    r.due += r.every;
    r.submit.events.send(event).is_ok() && !last
}
