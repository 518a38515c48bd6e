//! The model and its tokens on llama.cpp, and `Generation`: one chat
//! completion in a context of its own, advanced one token per `step`. The
//! node generates through the batch scheduler (`scheduler.rs`); a
//! `Generation` is the one-at-a-time baseline the benchmark compares it
//! with, and the dataset replay's direct path.

use super::decoding::{Decoding, StopScan};
use anyhow::{Context, anyhow, bail};
use edgeroute_core::confidence::{self, Confidence};
use edgeroute_core::{Estimate, Speed};
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::{LlamaChatMessage, LlamaChatTemplate, LlamaModel};
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;
use std::num::NonZeroU32;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

/// llama.cpp's global state may be initialised once per process.
pub(super) fn backend() -> &'static LlamaBackend {
    static BACKEND: OnceLock<LlamaBackend> = OnceLock::new();
    BACKEND.get_or_init(|| {
        let mut backend = LlamaBackend::init().expect("llama.cpp backend initialises once");
        // llama.cpp logs every tensor at load; our own log line says what matters.
        if std::env::var_os("EDGEROUTE_LLAMA_LOG").is_none() {
            backend.void_logs();
        }
        backend
    })
}

/// Prompt tokens decoded per llama.cpp batch during the prefill.
pub(super) const PREFILL_CHUNK: u32 = 512;

/// How a generation runs; the node config sets threads and context size.
#[derive(Debug, Clone, Copy)]
pub struct RuntimeParams {
    pub threads: u32,
    pub context_size: u32,
}

/// A GGUF model loaded once per node and shared by every generation.
pub struct LoadedModel {
    pub name: String,
    pub(super) model: LlamaModel,
    template: Option<LlamaChatTemplate>,
    pub(super) runtime: RuntimeParams,
    /// Measured on every generation: context creation (the overhead),
    /// prefill and decode per token. The router's latency estimates.
    speed: Mutex<Speed>,
    /// Tokens of recent chat pieces (system prompts, tool descriptions),
    /// by their flags (`add_special`, `parse_special`).
    pieces: crate::memo::Memo<(bool, bool), Vec<LlamaToken>>,
    /// The chat template rendered with placeholders, by sequence of roles.
    renderings: crate::memo::Memo<(), Result<String, String>>,
}

/// What a client may set per request.
#[derive(Debug, Clone, Copy)]
pub struct Sampling {
    pub max_tokens: u32,
    pub temperature: f32,
    pub top_p: f32,
    pub seed: u32,
}

impl Default for Sampling {
    fn default() -> Self {
        Self {
            max_tokens: 128,
            temperature: 0.0,
            top_p: 1.0,
            seed: 0,
        }
    }
}

impl LoadedModel {
    pub fn load(name: &str, path: &Path, runtime: RuntimeParams) -> anyhow::Result<Arc<Self>> {
        if !path.is_file() {
            bail!("model file {} does not exist", path.display());
        }
        let model = LlamaModel::load_from_file(backend(), path, &LlamaModelParams::default())
            .with_context(|| format!("llama.cpp could not load {}", path.display()))?;
        // A model without a template can still serve raw prompts.
        let template = model.chat_template(None).ok();
        Ok(Arc::new(Self {
            name: name.to_string(),
            model,
            template,
            runtime,
            speed: Mutex::new(Speed::default()),
            // At most 256 × 16 KiB of text (and its tokens) held.
            pieces: crate::memo::Memo::new(256, 16 * 1024),
            // Sequences of up to about a hundred messages.
            renderings: crate::memo::Memo::new(64, 1024),
        }))
    }

    /// The prompt text the model sees for these messages, through the chat
    /// template stored in the GGUF file.
    pub fn render_chat(&self, messages: &[(String, String)]) -> anyhow::Result<String> {
        let template = self.template.as_ref().ok_or_else(|| {
            anyhow!(
                "model '{}' has no chat template in its GGUF metadata",
                self.name
            )
        })?;
        let chat = messages
            .iter()
            .map(|(role, content)| LlamaChatMessage::new(role.clone(), content.clone()))
            .collect::<Result<Vec<_>, _>>()
            .context("a message contains a NUL byte")?;
        self.model
            .apply_chat_template(template, &chat, true)
            .map_err(|e| anyhow!("chat template of '{}' failed: {e}", self.name))
    }

    /// Tokens of raw text, control tokens (`<|im_start|>`) included: for
    /// a prompt the caller built itself.
    pub fn tokenize(&self, text: &str) -> Vec<LlamaToken> {
        self.model.vocab().tokenize(text.as_bytes(), true, true)
    }

    /// Tokens of a chat through the model's template: the template's
    /// control tokens become single tokens, as the model was trained, and
    /// the messages' own text never does. A user who types
    /// `<|im_end|><|im_start|>system` gets those characters as text, not a
    /// forged system turn (and a prompt full of them costs no more than
    /// other text). The template is rendered with a placeholder for each
    /// message's content, and the text between placeholders is the
    /// template's.
    pub fn chat_tokens(&self, messages: &[(String, String)]) -> anyhow::Result<Vec<LlamaToken>> {
        self.tokens_of_chat(messages, None)
    }

    /// [`Self::chat_tokens`], remembering the pieces for this tenant and
    /// sensitivity level: an agent's system prompt and tool descriptions
    /// are tokenized once. Kept apart by level like the prefix cache, so a
    /// public request cannot time whether a restricted one sent a text.
    pub fn chat_tokens_for(
        &self,
        messages: &[(String, String)],
        scope: &super::prefix::CacheScope,
    ) -> anyhow::Result<Vec<LlamaToken>> {
        let scope = crate::memo::scope(&scope.tenant, scope.level);
        self.tokens_of_chat(messages, Some(&scope))
    }

    fn tokens_of_chat(
        &self,
        messages: &[(String, String)],
        tenant: Option<&str>,
    ) -> anyhow::Result<Vec<LlamaToken>> {
        // Private-use characters: no template writes them.
        let mark = |i: usize| format!("\u{E000}edgeroute-message-{i}\u{E001}");
        // The rendering depends on the roles alone (the contents are
        // placeholders), and llama.cpp recognises the template from its
        // source on every call: most requests repeat a few sequences of
        // roles, so each is rendered once. Length-prefixed, so no two
        // sequences share a key.
        let roles: String = messages
            .iter()
            .map(|(role, _)| format!("{}:{role}", role.len()))
            .collect();
        let render = || {
            let placeholders: Vec<(String, String)> = messages
                .iter()
                .enumerate()
                .map(|(i, (role, _))| (role.clone(), mark(i)))
                .collect();
            self.render_chat(&placeholders)
                .map_err(|e| format!("{e:#}"))
        };
        let rendered = self
            .renderings
            .get(tenant.unwrap_or(""), &roles, (), render, Result::is_ok)
            .map_err(anyhow::Error::msg)?;
        let vocab = self.model.vocab();
        // (add_special, parse_special): control tokens are parsed in the
        // template's text only, never in a message's.
        let piece = |text: &str, flags: (bool, bool)| {
            let tokenize = || vocab.tokenize(text.as_bytes(), flags.0, flags.1);
            match tenant {
                Some(tenant) => self.pieces.get(tenant, text, flags, tokenize, |_| true),
                None => tokenize(),
            }
        };
        let mut tokens = Vec::new();
        let mut rest = rendered.as_str();
        for (i, (_, content)) in messages.iter().enumerate() {
            let (template, after) = rest.split_once(&mark(i)).ok_or_else(|| {
                anyhow!(
                    "the chat template of '{}' changes message text, so the messages cannot be kept apart from its control tokens",
                    self.name
                )
            })?;
            tokens.extend(piece(template, (i == 0, true)));
            tokens.extend(piece(content, (false, false)));
            rest = after;
        }
        if rest.contains('\u{E000}') {
            bail!("the chat template of '{}' repeats message text", self.name);
        }
        tokens.extend(piece(rest, (messages.is_empty(), true)));
        Ok(tokens)
    }

    /// How long a request of this size would take here once its turn
    /// comes after `wait_ms`; None before the first generation.
    pub fn estimate(&self, prompt_tokens: u32, max_tokens: u32, wait_ms: f64) -> Option<Estimate> {
        let speed = self.speed.lock().unwrap_or_else(|p| p.into_inner());
        speed.estimate(prompt_tokens, max_tokens, wait_ms)
    }

    /// The speeds measured so far.
    pub fn speed(&self) -> Speed {
        *self.speed.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn measured(&self, update: impl FnOnce(&mut Speed)) {
        update(&mut self.speed.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// Bytes of KV cache per token (F16 keys and values, every layer).
    pub fn kv_bytes_per_token(&self) -> u64 {
        let head_dim = self.model.n_embd().max(0) as u64 / self.model.n_head().max(1) as u64;
        self.model.n_layer() as u64 * 2 * head_dim * self.model.n_head_kv() as u64 * 2
    }

    /// Bytes of the model's weights.
    pub fn size_bytes(&self) -> u64 {
        self.model.size()
    }

    /// Tokens in the model's vocabulary (the length of a logits row).
    pub fn vocab_size(&self) -> usize {
        self.model.n_vocab().max(0) as usize
    }

    pub fn context_size(&self) -> u32 {
        self.runtime.context_size
    }

    /// Start a generation in a context of its own: prefill the prompt and
    /// make the first token ready.
    pub fn start(
        self: &Arc<Self>,
        tokens: Vec<LlamaToken>,
        sampling: Sampling,
    ) -> anyhow::Result<Generation> {
        Generation::new(self.clone(), tokens, sampling)
    }

    /// The most tokens a completion of `prompt_tokens` may have: the
    /// client's limit, cut to what is left of the context window.
    pub(super) fn completion_room(
        &self,
        prompt_tokens: usize,
        max_tokens: u32,
    ) -> anyhow::Result<u32> {
        let n_ctx = self.runtime.context_size;
        if prompt_tokens == 0 {
            bail!("the prompt is empty");
        }
        if prompt_tokens as u64 + 1 > n_ctx as u64 {
            bail!(
                "prompt is {prompt_tokens} tokens; model '{}' serves at most {} with this node's context size",
                self.name,
                n_ctx.saturating_sub(1)
            );
        }
        Ok(max_tokens.min(n_ctx - prompt_tokens as u32))
    }

    /// Seconds to prefill `tokens` in a fresh context (its creation not
    /// counted), with logits for every position (`every_logit`) or only
    /// the last, as a generation's prefill. A step of batched decoding
    /// needs every row's logits, so the output head (vocabulary × width)
    /// runs for each token it makes but once per prefill: the two speeds'
    /// ratio is the share of the prefill speed batching can reach on this
    /// model (`edgeroute bench --batching` reports it).
    pub fn time_prefill(&self, tokens: &[LlamaToken], every_logit: bool) -> anyhow::Result<f64> {
        let chunk = self.runtime.context_size.min(PREFILL_CHUNK);
        let mut context = self.new_context(chunk)?;
        let mut batch = LlamaBatch::new(chunk as usize, 1);
        let started = Instant::now();
        prefill(&mut context, &mut batch, tokens, chunk, every_logit)?;
        Ok(started.elapsed().as_secs_f64())
    }

    fn new_context(&self, chunk: u32) -> anyhow::Result<LlamaContext<'static>> {
        let threads = self.runtime.threads as i32;
        let params = LlamaContextParams::default()
            .with_n_ctx(NonZeroU32::new(self.runtime.context_size))
            .with_n_batch(chunk)
            .with_n_threads(threads)
            .with_n_threads_batch(threads);
        let context = self
            .model
            .new_context(backend(), params)
            .context("llama.cpp could not create a context")?;
        // SAFETY: the context borrows `self.model`. It lives only in a
        // `Generation`, which holds an Arc of this model in a field that
        // drops after the context (field order), so the borrow never
        // outlives the model.
        Ok(unsafe { std::mem::transmute::<LlamaContext<'_>, LlamaContext<'static>>(context) })
    }
}

/// Decode `tokens` into `context` from position 0, `chunk` at a time (the
/// context's `n_batch`), with logits for every position or only the last.
fn prefill(
    context: &mut LlamaContext<'static>,
    batch: &mut LlamaBatch,
    tokens: &[LlamaToken],
    chunk: u32,
    every_logit: bool,
) -> anyhow::Result<()> {
    let last = tokens.len().saturating_sub(1);
    for (c, piece) in tokens.chunks(chunk as usize).enumerate() {
        batch.clear();
        for (j, token) in piece.iter().enumerate() {
            let position = c * chunk as usize + j;
            batch.add(
                *token,
                position as i32,
                &[0],
                every_logit || position == last,
            )?;
        }
        context.decode(batch).context("llama.cpp prefill failed")?;
    }
    Ok(())
}

/// Why a generation ended, in OpenAI's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    Stop,
    Length,
}

impl Finish {
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
        }
    }
}

/// One decode step's result.
pub struct Step {
    /// New text; empty while a multi-byte character is still incomplete.
    pub text: String,
    pub finish: Option<Finish>,
}

/// What turns rows of logits into a completion: the request's sampler,
/// the confidence, the completion budget, and the bytes of a character
/// split across tokens. The baseline `Generation` and every scheduled
/// sequence hold one each, so the same logits give the same text.
pub(super) struct Sampled {
    sampler: LlamaSampler,
    /// Bytes of a UTF-8 character split across tokens.
    pending: Vec<u8>,
    /// The request's stop sequences.
    stop: StopScan,
    pub completion_tokens: u32,
    max_tokens: u32,
    /// Log-probabilities of the tokens produced so far.
    pub confidence: Confidence,
    pub finished: Option<Finish>,
}

impl Sampled {
    pub fn new(
        sampling: &Sampling,
        max_tokens: u32,
        decoding: &Decoding,
        model: &LlamaModel,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            sampler: sampler_for(sampling, decoding, model)?,
            pending: Vec::new(),
            stop: StopScan::new(&decoding.stop),
            completion_tokens: 0,
            max_tokens,
            confidence: Confidence::default(),
            finished: (max_tokens == 0).then_some(Finish::Length),
        })
    }

    /// Sample the next token from the logits at batch `index` of the last
    /// decode. Returns the step, and the token to decode next while the
    /// completion goes on.
    pub fn next(
        &mut self,
        context: &LlamaContext<'_>,
        index: i32,
        model: &LlamaModel,
    ) -> (Step, Option<LlamaToken>) {
        if let Some(finish) = self.finished {
            return (self.end(finish), None);
        }
        // `sample` also accepts the token (a grammar advances on it).
        let token = self.sampler.sample(context, index);
        // The model's own probability of the token, whatever the sampler
        // did: the confidence a cascade judges.
        let logits = context.get_logits_ith(index);
        self.confidence
            .add(confidence::logprob(logits, token.0 as usize));
        let vocab = model.vocab();
        if vocab.is_eog(token) {
            return (self.end(Finish::Stop), None);
        }
        self.completion_tokens += 1;
        self.pending
            .extend_from_slice(&vocab.token_to_piece(token, false, None));
        let complete = self.take_complete_utf8();
        let (text, stopped) = self.stop.push(&complete);
        if stopped {
            self.pending.clear();
            self.finished = Some(Finish::Stop);
            let finish = self.finished;
            return (Step { text, finish }, None);
        }
        if self.completion_tokens >= self.max_tokens {
            let mut step = self.end(Finish::Length);
            step.text.insert_str(0, &text);
            return (step, None);
        }
        (Step { text, finish: None }, Some(token))
    }

    /// The end of the completion: what is left of a split character and
    /// any text held back as a possible stop sequence.
    fn end(&mut self, finish: Finish) -> Step {
        let tail = self.flush_pending();
        let (mut text, stopped) = self.stop.push(&tail);
        if !stopped {
            text.push_str(&self.stop.flush());
        }
        let finish = if stopped { Finish::Stop } else { finish };
        self.finished = Some(finish);
        Step {
            text,
            finish: Some(finish),
        }
    }

    fn take_complete_utf8(&mut self) -> String {
        match std::str::from_utf8(&self.pending) {
            Ok(s) => {
                let s = s.to_string();
                self.pending.clear();
                s
            }
            Err(e) if e.error_len().is_none() => {
                // An incomplete character at the end: keep it for the next token.
                let valid = e.valid_up_to();
                let s = String::from_utf8_lossy(&self.pending[..valid]).into_owned();
                self.pending.drain(..valid);
                s
            }
            Err(_) => self.flush_pending(),
        }
    }

    fn flush_pending(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

/// A completion in a llama.cpp context of its own, which borrows the
/// model that `model` keeps alive.
pub struct Generation {
    // Declared before `model`: fields drop in order.
    context: LlamaContext<'static>,
    sampled: Sampled,
    batch: LlamaBatch<'static>,
    /// Position of the next token in the context.
    position: i32,
    pub prompt_tokens: u32,
    /// When decoding began (after the prefill), for the decode speed.
    decode_started: Instant,
    model: Arc<LoadedModel>,
}

impl Generation {
    fn new(
        model: Arc<LoadedModel>,
        tokens: Vec<LlamaToken>,
        sampling: Sampling,
    ) -> anyhow::Result<Self> {
        let started = Instant::now();
        let max_tokens = model.completion_room(tokens.len(), sampling.max_tokens)?;
        // The prefill runs in chunks of PREFILL_CHUNK tokens: llama.cpp sizes
        // its compute buffers by n_batch, and a context-sized batch made
        // every context slower to create than the prefill itself.
        let chunk = model.runtime.context_size.min(PREFILL_CHUNK);
        let mut context = model.new_context(chunk)?;
        let created = Instant::now();
        let mut batch = LlamaBatch::new(chunk as usize, 1);
        // Only the prompt's last token needs logits: it predicts the first output.
        prefill(&mut context, &mut batch, &tokens, chunk, false)?;
        let prefilled = Instant::now();
        model.measured(|speed| {
            speed.overhead_ms.add(ms(created.duration_since(started)));
            // A few tokens say more about fixed costs than about speed.
            if tokens.len() >= 16 {
                speed
                    .prefill_ms_per_token
                    .add(ms(prefilled.duration_since(created)) / tokens.len() as f64);
            }
        });
        Ok(Self {
            context,
            sampled: Sampled::new(&sampling, max_tokens, &Decoding::default(), &model.model)?,
            batch,
            position: tokens.len() as i32,
            prompt_tokens: tokens.len() as u32,
            decode_started: prefilled,
            model,
        })
    }

    pub fn finished(&self) -> Option<Finish> {
        self.sampled.finished
    }

    pub fn completion_tokens(&self) -> u32 {
        self.sampled.completion_tokens
    }

    pub fn confidence(&self) -> Confidence {
        self.sampled.confidence
    }

    /// Sample one token from the ready logits and decode it so the next
    /// step's logits are ready. After the end it keeps answering the finish.
    pub fn step(&mut self) -> anyhow::Result<Step> {
        let was_running = self.sampled.finished.is_none();
        let last = self.batch.n_tokens() - 1;
        let (step, next) = self.sampled.next(&self.context, last, &self.model.model);
        let Some(token) = next else {
            if was_running {
                self.record_decode_speed();
            }
            return Ok(step);
        };
        self.batch.clear();
        self.batch.add(token, self.position, &[0], true)?;
        self.position += 1;
        self.context
            .decode(&mut self.batch)
            .context("llama.cpp decode failed")?;
        Ok(step)
    }

    fn record_decode_speed(&self) {
        let tokens = self.sampled.completion_tokens;
        if tokens == 0 {
            return;
        }
        let per_token = ms(self.decode_started.elapsed()) / tokens as f64;
        self.model
            .measured(|speed| speed.decode_ms_per_token.add(per_token));
    }

    /// Run to the end; the benchmark's baseline and non-streaming callers.
    pub fn run_to_end(&mut self) -> anyhow::Result<(String, Finish)> {
        let mut text = String::new();
        loop {
            let step = self.step()?;
            text.push_str(&step.text);
            if let Some(finish) = step.finish {
                return Ok((text, finish));
            }
        }
    }
}

pub(super) fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The request's sampler: greedy at temperature 0, else top-p, temperature
/// and a seeded draw; behind a grammar when the request has one, so only
/// tokens the grammar allows are candidates.
fn sampler_for(
    sampling: &Sampling,
    decoding: &Decoding,
    model: &LlamaModel,
) -> anyhow::Result<LlamaSampler> {
    let mut chain = Vec::new();
    if let Some(grammar) = &decoding.grammar {
        chain.push(
            LlamaSampler::grammar(model, grammar, "root")
                .map_err(|e| anyhow!("llama.cpp refused the response format's grammar: {e}"))?,
        );
    }
    if sampling.temperature <= 0.0 {
        chain.push(LlamaSampler::greedy());
    } else {
        chain.push(LlamaSampler::top_p(sampling.top_p.clamp(0.0, 1.0), 1));
        chain.push(LlamaSampler::temp(sampling.temperature));
        chain.push(LlamaSampler::dist(sampling.seed));
    }
    Ok(LlamaSampler::chain_simple(chain))
}
