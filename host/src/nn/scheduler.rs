//! Continuous batching: one thread per local model owns a single llama.cpp
//! context, and every running generation is a sequence in it. Each step
//! decodes one batch that holds the next token of every running sequence
//! and up to `PREFILL_CHUNK` tokens of newcomers' prompts, so N streams
//! cost about one pass over the weights instead of N, and a long prompt
//! joins in pieces instead of stalling the others. New requests join at
//! the next step; finished or cancelled ones leave.
//!
//! The KV cache is one unified pool of `kv_budget_tokens` cells. A running
//! sequence reserves its prompt plus its completion budget when admitted;
//! a finished one stays as an idle sequence for prefix reuse (see
//! `prefix.rs`) until its cells are needed, least recently used first. A
//! request that does not fit beside the running ones waits for them (the
//! local target sends one that may leave the node elsewhere instead:
//! `targets/local.rs`, `kv_full`).
//!
//! The wasi-nn backend submits a prompt and then blocks on the sequence's
//! events, one per token, so the local-worker component does not change.

use super::decoding::Decoding;
use super::engine::{Finish, LoadedModel, PREFILL_CHUNK, Sampled, Sampling, Step, backend, ms};
use super::paced::{self, Pace};
use super::prefix::{CacheScope, Idle, PrefixCache};
use anyhow::{Context, anyhow, bail};
use edgeroute_core::Confidence;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::token::LlamaToken;
use std::collections::VecDeque;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// How a model's scheduler batches.
#[derive(Debug, Clone, Copy)]
pub struct BatchParams {
    /// Sequences decoded together (`[local] max_concurrent`).
    pub width: u32,
    /// KV cells shared by running and idle sequences.
    pub kv_budget_tokens: u32,
    /// Run the paced test backend instead of llama.cpp (`paced.rs`).
    pub paced: Option<Pace>,
}

/// Finished sequences kept for prefix reuse, beyond the running ones. Each
/// is a llama.cpp sequence id; their cells count against the KV budget.
const IDLE_SEQUENCES: u32 = 8;

/// The handle of one model's scheduler thread. Dropping it lets the thread
/// end once its running sequences have.
pub struct Scheduler {
    model: Arc<LoadedModel>,
    inbox: Mutex<Sender<Submit>>,
    shared: Arc<Shared>,
    budget: u32,
}

/// What the scheduler thread publishes for the router and the metrics.
pub(super) struct Shared {
    idle: Mutex<PrefixCache<i32>>,
    pub(super) running: AtomicU32,
    pub(super) waiting: AtomicU32,
    /// Cells reserved by running sequences plus cells held by idle ones.
    kv_used: AtomicU32,
    /// Cells reserved by running sequences only (idle ones can be evicted).
    kv_reserved: AtomicU32,
}

pub(super) struct Submit {
    pub(super) tokens: Vec<LlamaToken>,
    sampling: Sampling,
    decoding: Decoding,
    pub(super) max_tokens: u32,
    scope: Option<CacheScope>,
    pub(super) events: Sender<Event>,
    pub(super) cancelled: Arc<AtomicBool>,
}

pub(super) enum Event {
    /// The sequence holds cells now; `reused` prompt tokens came from an
    /// idle sequence.
    Admitted {
        reused: u32,
    },
    Token {
        step: Step,
        completion_tokens: u32,
        confidence: Confidence,
    },
    Failed(String),
}

/// A snapshot of the scheduler's load.
#[derive(Debug, Clone, Copy, Default)]
pub struct BatchLoad {
    pub running: u32,
    pub waiting: u32,
    pub kv_used: u32,
    /// Cells running sequences hold: a newcomer needing more than the
    /// budget minus these waits for one of them to finish.
    pub kv_reserved: u32,
    pub kv_budget: u32,
    pub idle_sequences: u32,
}

impl Scheduler {
    /// Create the model's batch context and start its thread.
    pub fn spawn(model: Arc<LoadedModel>, params: BatchParams) -> anyhow::Result<Self> {
        let context_size = model.context_size();
        if params.width == 0 {
            bail!("local.max_concurrent must be at least 1");
        }
        if params.kv_budget_tokens < context_size {
            bail!(
                "local.kv_budget_tokens ({}) must hold at least one full context (context_size = {context_size})",
                params.kv_budget_tokens
            );
        }
        let shared = Arc::new(Shared {
            idle: Mutex::new(PrefixCache::new(IDLE_SEQUENCES as usize)),
            running: AtomicU32::new(0),
            waiting: AtomicU32::new(0),
            kv_used: AtomicU32::new(0),
            kv_reserved: AtomicU32::new(0),
        });
        let (inbox, requests) = mpsc::channel();
        let (ready_tx, ready) = mpsc::sync_channel(1);
        let (thread_model, thread_shared) = (model.clone(), shared.clone());
        let thread = std::thread::Builder::new().name(format!("batch-{}", model.name));
        if let Some(pace) = params.paced {
            let width = params.width as usize;
            thread
                .spawn(move || paced::run(thread_model, width, pace, requests, thread_shared))
                .context("cannot start the paced test backend's thread")?;
        } else {
            thread
                .spawn(move || run(thread_model, params, requests, thread_shared, ready_tx))
                .context("cannot start the batch scheduler thread")?;
            ready
                .recv()
                .map_err(|_| anyhow!("the batch scheduler thread ended at start"))??;
        }
        Ok(Self {
            model,
            inbox: Mutex::new(inbox),
            shared,
            budget: params.kv_budget_tokens,
        })
    }

    pub fn model(&self) -> &Arc<LoadedModel> {
        &self.model
    }

    /// Queue a generation; returns once it holds a sequence (after waiting
    /// for KV cells if the running ones hold them). Blocks its thread.
    pub fn submit(
        &self,
        tokens: Vec<LlamaToken>,
        sampling: Sampling,
        decoding: Decoding,
        scope: Option<CacheScope>,
    ) -> anyhow::Result<Sequence> {
        let max_tokens = self
            .model
            .completion_room(tokens.len(), sampling.max_tokens)?;
        let (events, rx) = mpsc::channel();
        let cancelled = Arc::new(AtomicBool::new(false));
        let prompt_tokens = tokens.len() as u32;
        let submit = Submit {
            tokens,
            sampling,
            decoding,
            max_tokens,
            scope,
            events,
            cancelled: cancelled.clone(),
        };
        self.inbox
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(submit)
            .map_err(|_| anyhow!("the batch scheduler of '{}' stopped", self.model.name))?;
        let mut sequence = Sequence {
            events: rx,
            cancelled,
            prompt_tokens,
            reused_tokens: 0,
            completion_tokens: 0,
            confidence: Confidence::default(),
            finished: None,
        };
        match sequence.next_event()? {
            Event::Admitted { reused } => sequence.reused_tokens = reused,
            Event::Failed(message) => bail!(message),
            Event::Token { .. } => bail!("the batch scheduler sent a token before admitting"),
        }
        Ok(sequence)
    }

    /// Prompt tokens a request in `scope` would continue from an idle
    /// sequence now (the last prompt token is always decoded again: its
    /// logits predict the first output token).
    pub fn cached_prefix(&self, tokens: &[LlamaToken], scope: &CacheScope) -> u32 {
        let idle = self.shared.idle.lock().unwrap_or_else(|p| p.into_inner());
        idle.peek(tokens, scope).min(tokens.len().saturating_sub(1)) as u32
    }

    pub fn load(&self) -> BatchLoad {
        let idle = self.shared.idle.lock().unwrap_or_else(|p| p.into_inner());
        BatchLoad {
            running: self.shared.running.load(Ordering::Relaxed),
            waiting: self.shared.waiting.load(Ordering::Relaxed),
            kv_used: self.shared.kv_used.load(Ordering::Relaxed),
            kv_reserved: self.shared.kv_reserved.load(Ordering::Relaxed),
            kv_budget: self.budget,
            idle_sequences: idle.len() as u32,
        }
    }
}

/// One generation in the batch, as its caller sees it: `step` blocks for
/// the next token. Dropping it cancels the sequence, which leaves the batch
/// and frees its cells at the next step.
pub struct Sequence {
    events: Receiver<Event>,
    cancelled: Arc<AtomicBool>,
    pub prompt_tokens: u32,
    /// Prompt tokens taken from an idle sequence instead of prefilled.
    pub reused_tokens: u32,
    pub completion_tokens: u32,
    pub confidence: Confidence,
    finished: Option<Finish>,
}

impl Sequence {
    fn next_event(&self) -> anyhow::Result<Event> {
        self.events
            .recv()
            .map_err(|_| anyhow!("the batch scheduler stopped"))
    }

    /// The next token's text; after the end it keeps answering the finish.
    pub fn step(&mut self) -> anyhow::Result<Step> {
        if let Some(finish) = self.finished {
            return Ok(Step {
                text: String::new(),
                finish: Some(finish),
            });
        }
        match self.next_event()? {
            Event::Token {
                step,
                completion_tokens,
                confidence,
            } => {
                self.completion_tokens = completion_tokens;
                self.confidence = confidence;
                self.finished = step.finish;
                Ok(step)
            }
            Event::Failed(message) => Err(anyhow!(message)),
            Event::Admitted { .. } => Err(anyhow!("the batch scheduler admitted a sequence twice")),
        }
    }
}

impl Drop for Sequence {
    fn drop(&mut self) {
        self.cancelled.store(true, Ordering::Relaxed);
    }
}

/// A sequence in the batch, on the scheduler thread.
struct Running {
    seq: i32,
    prompt: Vec<LlamaToken>,
    /// Prompt tokens whose KV state the sequence holds.
    fed: usize,
    /// Every token in the sequence's cells, from position 0.
    history: Vec<LlamaToken>,
    /// The sampled token to decode at the next step.
    next: Option<LlamaToken>,
    sampled: Sampled,
    /// Cells this sequence may come to hold: prompt plus completion budget.
    reserved: u32,
    /// Batch index of this sequence's logits after the current decode.
    logits_at: Option<i32>,
    scope: Option<CacheScope>,
    events: Sender<Event>,
    cancelled: Arc<AtomicBool>,
}

/// The scheduler thread: make the context, then step until the handle is
/// dropped and nothing runs.
fn run(
    model: Arc<LoadedModel>,
    params: BatchParams,
    requests: Receiver<Submit>,
    shared: Arc<Shared>,
    ready: mpsc::SyncSender<anyhow::Result<()>>,
) {
    let threads = model.runtime.threads as i32;
    let batch_size = PREFILL_CHUNK + params.width;
    let context_params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(params.kv_budget_tokens))
        .with_n_batch(batch_size)
        .with_n_ubatch(batch_size)
        .with_n_seq_max(params.width + IDLE_SEQUENCES)
        // One pool of cells for all sequences: a long conversation may use
        // more than an even share, and any mix of prefill and decode fits
        // one llama.cpp batch.
        .with_kv_unified(true)
        .with_n_threads(threads)
        .with_n_threads_batch(threads);
    let mut context = match model.model.new_context(backend(), context_params) {
        Ok(context) => {
            let _ = ready.send(Ok(()));
            context
        }
        Err(e) => {
            let _ = ready.send(Err(anyhow!(
                "llama.cpp could not create the batch context of '{}' ({} KV tokens): {e}",
                model.name,
                params.kv_budget_tokens
            )));
            return;
        }
    };
    let mut batcher = Batcher {
        model: &model,
        width: params.width as usize,
        budget: params.kv_budget_tokens,
        requests,
        waiting: VecDeque::new(),
        running: Vec::new(),
        free: (0..(params.width + IDLE_SEQUENCES) as i32).rev().collect(),
        shared,
        batch: LlamaBatch::new(batch_size as usize, 1),
    };
    while batcher.step(&mut context) {}
}

struct Batcher<'m> {
    model: &'m LoadedModel,
    width: usize,
    budget: u32,
    requests: Receiver<Submit>,
    waiting: VecDeque<Submit>,
    running: Vec<Running>,
    /// Sequence ids holding no cells.
    free: Vec<i32>,
    shared: Arc<Shared>,
    batch: LlamaBatch<'static>,
}

impl Batcher<'_> {
    /// One scheduling round: take in requests, admit what fits, decode one
    /// batch, hand out its tokens. False when the handle is gone and
    /// nothing runs.
    fn step(&mut self, context: &mut LlamaContext<'_>) -> bool {
        if self.running.is_empty() && self.waiting.is_empty() {
            match self.requests.recv() {
                Ok(submit) => self.waiting.push_back(submit),
                Err(_) => return false,
            }
        }
        while let Ok(submit) = self.requests.try_recv() {
            self.waiting.push_back(submit);
        }
        self.drop_cancelled(context);
        self.admit(context);
        self.publish();
        if self.running.is_empty() {
            return true;
        }
        let prefilled = self.fill_batch();
        let started = Instant::now();
        if let Err(e) = context.decode(&mut self.batch) {
            let message = format!("llama.cpp decode failed: {e}");
            for running in std::mem::take(&mut self.running) {
                let _ = running.events.send(Event::Failed(message.clone()));
                self.release(context, running.seq);
            }
            return true;
        }
        let took = ms(started.elapsed());
        self.model.measured(|speed| {
            // A step's time is each running sequence's time per token when
            // it only decodes; with a prefill chunk in it, the chunk's.
            if prefilled >= 16 {
                speed.prefill_ms_per_token.add(took / prefilled as f64);
            } else if prefilled == 0 {
                speed.decode_ms_per_token.add(took);
            }
        });
        self.hand_out(context);
        true
    }

    /// Waiting requests whose caller went away leave the queue; running
    /// ones leave the batch and free their cells.
    fn drop_cancelled(&mut self, context: &mut LlamaContext<'_>) {
        self.waiting
            .retain(|s| !s.cancelled.load(Ordering::Relaxed));
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].cancelled.load(Ordering::Relaxed) {
                let running = self.running.remove(i);
                self.release(context, running.seq);
            } else {
                i += 1;
            }
        }
    }

    /// Cells held now: running reservations plus idle sequences.
    fn kv_used(&self) -> u32 {
        let idle = self.shared.idle.lock().unwrap_or_else(|p| p.into_inner());
        self.running.iter().map(|r| r.reserved).sum::<u32>() + idle.tokens() as u32
    }

    /// Admit waiting requests in order while the batch has room and their
    /// cells fit, evicting idle sequences (least recently used first) for
    /// them. The first that does not fit waits, and so do those behind it.
    fn admit(&mut self, context: &mut LlamaContext<'_>) {
        while self.running.len() < self.width {
            let Some(submit) = self.waiting.pop_front() else {
                return;
            };
            let reserved = submit.tokens.len() as u32 + submit.max_tokens;
            // The idle sequence this prompt continues, trimmed to the
            // shared prefix (at least the last prompt token is decoded
            // again: its logits predict the first output token).
            let reuse = submit.scope.as_ref().and_then(|scope| {
                let mut idle = self.shared.idle.lock().unwrap_or_else(|p| p.into_inner());
                idle.take(&submit.tokens, scope)
            });
            let (seq, kept) = match reuse {
                Some((idle, shared)) => {
                    let keep = shared.min(submit.tokens.len() - 1);
                    let trimmed = context
                        .clear_kv_cache_seq(Some(idle.context as u32), Some(keep as u32), None)
                        .unwrap_or(false);
                    if trimmed {
                        (idle.context, keep)
                    } else {
                        self.release(context, idle.context);
                        (self.free_seq(context), 0)
                    }
                }
                None => (self.free_seq(context), 0),
            };
            // Make room: other idle sequences go, oldest first.
            while self.kv_used() + reserved > self.budget {
                let evicted = {
                    let mut idle = self.shared.idle.lock().unwrap_or_else(|p| p.into_inner());
                    idle.evict_oldest()
                };
                match evicted {
                    Some(idle) => self.release(context, idle.context),
                    None => break,
                }
            }
            if self.kv_used() + reserved > self.budget {
                // Running sequences hold the cells: wait for them. The
                // kept prefix goes back to the idle pool meanwhile.
                match (kept, &submit.scope) {
                    (0, _) | (_, None) => self.release(context, seq),
                    (_, Some(scope)) => {
                        let idle = Idle::new(seq, submit.tokens[..kept].to_vec(), scope.clone());
                        self.keep_idle(context, idle);
                    }
                }
                self.waiting.push_front(submit);
                return;
            }
            let sampled = match Sampled::new(
                &submit.sampling,
                submit.max_tokens,
                &submit.decoding,
                &self.model.model,
            ) {
                Ok(sampled) => sampled,
                Err(e) => {
                    let _ = submit.events.send(Event::Failed(format!("{e:#}")));
                    self.release(context, seq);
                    continue;
                }
            };
            if submit
                .events
                .send(Event::Admitted {
                    reused: kept as u32,
                })
                .is_err()
            {
                self.release(context, seq);
                continue;
            }
            self.running.push(Running {
                seq,
                history: submit.tokens[..kept].to_vec(),
                fed: kept,
                prompt: submit.tokens,
                next: None,
                sampled,
                reserved,
                logits_at: None,
                scope: submit.scope,
                events: submit.events,
                cancelled: submit.cancelled,
            });
        }
    }

    /// A sequence id with no cells: a free one, else the oldest idle
    /// sequence's. There is always one: ids are `width` plus the idle
    /// pool's capacity, and at most `width` run.
    fn free_seq(&mut self, context: &mut LlamaContext<'_>) -> i32 {
        if let Some(seq) = self.free.pop() {
            return seq;
        }
        let evicted = {
            let mut idle = self.shared.idle.lock().unwrap_or_else(|p| p.into_inner());
            idle.evict_oldest()
        }
        .expect("a sequence id is free or idle while the batch has room");
        let _ = context.clear_kv_cache_seq(Some(evicted.context as u32), None, None);
        evicted.context
    }

    /// Free a sequence's cells and its id.
    fn release(&mut self, context: &mut LlamaContext<'_>, seq: i32) {
        let _ = context.clear_kv_cache_seq(Some(seq as u32), None, None);
        self.free.push(seq);
    }

    fn keep_idle(&mut self, context: &mut LlamaContext<'_>, idle: Idle<i32>) {
        let dropped = self
            .shared
            .idle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .put(idle);
        for idle in dropped {
            self.release(context, idle.context);
        }
    }

    /// Put every running sequence's next token in the batch, and prompt
    /// chunks of those still prefilling, in arrival order, up to
    /// `PREFILL_CHUNK` prompt tokens. Returns the prompt tokens added.
    fn fill_batch(&mut self) -> usize {
        self.batch.clear();
        let mut room = PREFILL_CHUNK as usize;
        for running in &mut self.running {
            running.logits_at = None;
            if let Some(token) = running.next.take() {
                running.logits_at = Some(self.batch.n_tokens());
                let position = running.history.len() as i32;
                self.batch
                    .add(token, position, &[running.seq], true)
                    .expect("the batch holds a token per running sequence");
                running.history.push(token);
            } else if running.fed < running.prompt.len() && room > 0 {
                let end = running.prompt.len().min(running.fed + room);
                for position in running.fed..end {
                    // Only the prompt's last token needs logits.
                    let last = position == running.prompt.len() - 1;
                    if last {
                        running.logits_at = Some(self.batch.n_tokens());
                    }
                    self.batch
                        .add(
                            running.prompt[position],
                            position as i32,
                            &[running.seq],
                            last,
                        )
                        .expect("the batch holds a prefill chunk");
                }
                running
                    .history
                    .extend_from_slice(&running.prompt[running.fed..end]);
                room -= end - running.fed;
                running.fed = end;
            }
        }
        PREFILL_CHUNK as usize - room
    }

    /// Sample each sequence that has logits and send its token; finished
    /// sequences become idle (kept for reuse when they have a scope),
    /// those whose caller is gone are freed.
    fn hand_out(&mut self, context: &mut LlamaContext<'_>) {
        let mut i = 0;
        while i < self.running.len() {
            let running = &mut self.running[i];
            let Some(index) = running.logits_at else {
                i += 1;
                continue;
            };
            let (step, next) = running.sampled.next(context, index, &self.model.model);
            running.next = next;
            let finished = step.finish.is_some();
            let event = Event::Token {
                step,
                completion_tokens: running.sampled.completion_tokens,
                confidence: running.sampled.confidence,
            };
            if !finished {
                if running.events.send(event).is_ok() {
                    i += 1;
                } else {
                    // The caller went away: its cells go.
                    let running = self.running.remove(i);
                    self.release(context, running.seq);
                }
                continue;
            }
            // Out of the batch, and the counts the router reads updated,
            // before the caller hears of the last token: a request that
            // comes right after the answer must not find these cells still
            // reserved (it would spill to the cloud; seen in CI).
            let running = self.running.remove(i);
            match running.scope {
                Some(scope) => {
                    self.keep_idle(context, Idle::new(running.seq, running.history, scope))
                }
                None => self.release(context, running.seq),
            }
            self.publish();
            let _ = running.events.send(event);
        }
        self.publish();
    }

    fn publish(&self) {
        self.shared
            .running
            .store(self.running.len() as u32, Ordering::Relaxed);
        self.shared
            .waiting
            .store(self.waiting.len() as u32, Ordering::Relaxed);
        self.shared.kv_used.store(self.kv_used(), Ordering::Relaxed);
        let reserved = self.running.iter().map(|r| r.reserved).sum::<u32>();
        self.shared.kv_reserved.store(reserved, Ordering::Relaxed);
    }
}
