//! Token generation on llama.cpp: one `Generation` is one chat completion,
//! advanced one token per `step`. The wasi-nn backend and the benchmark's
//! direct baseline both drive this type, so they measure the same work.

use super::prefix::{CacheScope, Idle, PrefixCache};
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
const PREFILL_CHUNK: u32 = 512;

/// How a generation runs; the node config sets threads and context size.
#[derive(Debug, Clone, Copy)]
pub struct RuntimeParams {
    pub threads: u32,
    pub context_size: u32,
    /// Idle contexts kept for prefix reuse (0: none).
    pub prefix_cache_entries: u32,
}

/// A GGUF model loaded once per node and shared by every generation.
pub struct LoadedModel {
    pub name: String,
    /// Contexts of finished generations, for prefix reuse. Declared before
    /// `model`: fields drop in order, and every context borrows the model.
    cache: Mutex<PrefixCache<LlamaContext<'static>>>,
    model: LlamaModel,
    template: Option<LlamaChatTemplate>,
    runtime: RuntimeParams,
    /// Measured on every generation: context creation (the overhead),
    /// prefill and decode per token. The router's latency estimates.
    speed: Mutex<Speed>,
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
            cache: Mutex::new(PrefixCache::new(runtime.prefix_cache_entries as usize)),
            model,
            template,
            runtime,
            speed: Mutex::new(Speed::default()),
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
        // Private-use characters: no template writes them.
        let mark = |i: usize| format!("\u{E000}edgeroute-message-{i}\u{E001}");
        let placeholders: Vec<(String, String)> = messages
            .iter()
            .enumerate()
            .map(|(i, (role, _))| (role.clone(), mark(i)))
            .collect();
        let rendered = self.render_chat(&placeholders)?;
        let vocab = self.model.vocab();
        let mut tokens = Vec::new();
        let mut rest = rendered.as_str();
        for (i, (_, content)) in messages.iter().enumerate() {
            let (template, after) = rest.split_once(&mark(i)).ok_or_else(|| {
                anyhow!(
                    "the chat template of '{}' changes message text, so the messages cannot be kept apart from its control tokens",
                    self.name
                )
            })?;
            tokens.extend(vocab.tokenize(template.as_bytes(), i == 0, true));
            tokens.extend(vocab.tokenize(content.as_bytes(), false, false));
            rest = after;
        }
        if rest.contains('\u{E000}') {
            bail!("the chat template of '{}' repeats message text", self.name);
        }
        tokens.extend(vocab.tokenize(rest.as_bytes(), messages.is_empty(), true));
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

    fn measured(&self, update: impl FnOnce(&mut Speed)) {
        update(&mut self.speed.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// Tokens in the model's vocabulary (the length of a logits row).
    pub fn vocab_size(&self) -> usize {
        self.model.n_vocab().max(0) as usize
    }

    pub fn context_size(&self) -> u32 {
        self.runtime.context_size
    }

    /// Start a generation: prefill the prompt and make the first token
    /// ready. With a cache scope, it continues from the cached context
    /// sharing the longest prefix with the prompt (if the scope may reuse
    /// one), and leaves its own context in the cache when it ends; without
    /// one (the benchmark's baselines) it neither reuses nor keeps.
    pub fn start(
        self: &Arc<Self>,
        tokens: Vec<LlamaToken>,
        sampling: Sampling,
        cache: Option<CacheScope>,
    ) -> anyhow::Result<Generation> {
        Generation::new(self.clone(), tokens, sampling, cache)
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
        // SAFETY: the context borrows `self.model`. It lives in a
        // `Generation`, which holds an Arc of this model, or in this
        // model's cache, which is dropped before the model (field order),
        // so the borrow never outlives the model.
        Ok(unsafe { std::mem::transmute::<LlamaContext<'_>, LlamaContext<'static>>(context) })
    }

    /// A cached context holding the longest prefix of `tokens` that
    /// `scope` may reuse, with the state after that prefix removed, and the
    /// number of tokens it still holds. At least the last prompt token is
    /// decoded again: its logits predict the first output token.
    fn reuse(
        &self,
        tokens: &[LlamaToken],
        scope: Option<&CacheScope>,
    ) -> Option<(LlamaContext<'static>, usize)> {
        let taken = {
            let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            cache.take(tokens, scope?)
        };
        let (idle, shared) = taken?;
        let keep = shared.min(tokens.len() - 1);
        let mut context = idle.context;
        match context.clear_kv_cache_seq(Some(0), Some(keep as u32), None) {
            Ok(true) => Some((context, keep)),
            // The model's memory cannot drop a suffix: start this context over.
            _ => {
                context.clear_kv_cache();
                Some((context, 0))
            }
        }
    }

    /// Contexts kept in the prefix cache now.
    pub fn cached_contexts(&self) -> usize {
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Prompt tokens a request in `scope` would reuse from the cache now.
    pub fn cached_prefix(&self, tokens: &[LlamaToken], scope: &CacheScope) -> u32 {
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        // The last prompt token is always decoded again (see Generation::new).
        cache
            .peek(tokens, scope)
            .min(tokens.len().saturating_sub(1)) as u32
    }
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

/// A running completion. It owns its llama.cpp context until it ends and
/// then hands it to the model's prefix cache (`Drop`); the context borrows
/// the model, which `model` keeps alive.
pub struct Generation {
    /// Some until the generation is dropped.
    context: Option<LlamaContext<'static>>,
    /// The tokens whose KV state the context holds, from position 0: what a
    /// later request can reuse. Extra state past it (a prefill that failed
    /// half way) is harmless: reuse clears everything after the shared part.
    history: Vec<LlamaToken>,
    /// None: the context is not kept for reuse.
    cache: Option<CacheScope>,
    /// Prompt tokens taken from the cache instead of prefilled.
    pub reused_tokens: u32,
    sampler: LlamaSampler,
    batch: LlamaBatch<'static>,
    /// Position of the next token in the context.
    position: i32,
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    max_tokens: u32,
    /// Bytes of a UTF-8 character split across tokens.
    pending: Vec<u8>,
    finished: Option<Finish>,
    /// Log-probabilities of the tokens produced so far.
    pub confidence: Confidence,
    /// When decoding began (after the prefill), for the decode speed.
    decode_started: Instant,
    model: Arc<LoadedModel>,
}

impl Generation {
    fn new(
        model: Arc<LoadedModel>,
        tokens: Vec<LlamaToken>,
        sampling: Sampling,
        cache: Option<CacheScope>,
    ) -> anyhow::Result<Self> {
        let started = Instant::now();
        let n_ctx = model.runtime.context_size;
        if tokens.is_empty() {
            bail!("the prompt is empty");
        }
        if tokens.len() as u64 + 1 > n_ctx as u64 {
            bail!(
                "prompt is {} tokens; model '{}' serves at most {} with this node's context size",
                tokens.len(),
                model.name,
                n_ctx.saturating_sub(1)
            );
        }
        // Generation stops at the context's end even when max_tokens is larger.
        let room = n_ctx - tokens.len() as u32;
        let max_tokens = sampling.max_tokens.min(room);
        // The prefill runs in chunks of PREFILL_CHUNK tokens: llama.cpp sizes
        // its compute buffers by n_batch, and a context-sized batch made
        // every context slower to create than the prefill itself.
        let chunk = n_ctx.min(PREFILL_CHUNK);
        let (context, reused) = match model.reuse(&tokens, cache.as_ref()) {
            Some(reused) => reused,
            None => (model.new_context(chunk)?, 0),
        };
        let created = Instant::now();

        let mut generation = Self {
            context: Some(context),
            history: tokens[..reused].to_vec(),
            cache,
            reused_tokens: reused as u32,
            sampler: sampler_for(&sampling),
            batch: LlamaBatch::new(chunk as usize, 1),
            position: tokens.len() as i32,
            prompt_tokens: tokens.len() as u32,
            completion_tokens: 0,
            max_tokens,
            pending: Vec::new(),
            finished: None,
            confidence: Confidence::default(),
            decode_started: created,
            model,
        };
        let last = tokens.len() - 1;
        for (c, piece) in tokens[reused..].chunks(chunk as usize).enumerate() {
            generation.batch.clear();
            for (j, token) in piece.iter().enumerate() {
                let position = reused + c * chunk as usize + j;
                // Only the prompt's last token needs logits: it predicts the first output.
                generation
                    .batch
                    .add(*token, position as i32, &[0], position == last)?;
            }
            let batch = &mut generation.batch;
            generation
                .context
                .as_mut()
                .expect("a generation has its context until dropped")
                .decode(batch)
                .context("llama.cpp prefill failed")?;
        }
        generation.history = tokens;
        let prefilled = Instant::now();
        let prefill_tokens = generation.history.len() - reused;
        generation.model.measured(|speed| {
            if reused == 0 {
                speed.overhead_ms.add(ms(created.duration_since(started)));
            }
            // A few tokens say more about fixed costs than about speed.
            if prefill_tokens >= 16 {
                speed
                    .prefill_ms_per_token
                    .add(ms(prefilled.duration_since(created)) / prefill_tokens as f64);
            }
        });
        generation.decode_started = prefilled;
        if max_tokens == 0 {
            generation.finished = Some(Finish::Length);
        }
        Ok(generation)
    }

    fn context(&self) -> &LlamaContext<'static> {
        self.context
            .as_ref()
            .expect("a generation has its context until dropped")
    }

    pub fn finished(&self) -> Option<Finish> {
        self.finished
    }

    /// Sample one token from the ready logits and decode it so the next
    /// step's logits are ready. After the end it keeps answering the finish.
    pub fn step(&mut self) -> anyhow::Result<Step> {
        if let Some(finish) = self.finished {
            return Ok(Step {
                text: self.flush_pending(),
                finish: Some(finish),
            });
        }
        let last = self.batch.n_tokens() - 1;
        let context = self
            .context
            .as_ref()
            .expect("a generation has its context until dropped");
        let token = self.sampler.sample(context, last);
        self.sampler.accept(token);
        // The model's own probability of the token, whatever the sampler
        // did: the confidence a cascade judges.
        let logits = self.context().get_logits_ith(last);
        self.confidence
            .add(confidence::logprob(logits, token.0 as usize));
        let vocab = self.model.model.vocab();
        if vocab.is_eog(token) {
            self.record_decode_speed();
            self.finished = Some(Finish::Stop);
            return Ok(Step {
                text: self.flush_pending(),
                finish: self.finished,
            });
        }
        self.completion_tokens += 1;
        self.pending
            .extend_from_slice(&vocab.token_to_piece(token, false, None));
        let text = self.take_complete_utf8();
        if self.completion_tokens >= self.max_tokens {
            self.record_decode_speed();
            self.finished = Some(Finish::Length);
            let mut text = text;
            text.push_str(&self.flush_pending());
            return Ok(Step {
                text,
                finish: self.finished,
            });
        }
        self.batch.clear();
        self.batch.add(token, self.position, &[0], true)?;
        self.position += 1;
        self.context
            .as_mut()
            .expect("a generation has its context until dropped")
            .decode(&mut self.batch)
            .context("llama.cpp decode failed")?;
        self.history.push(token);
        Ok(Step { text, finish: None })
    }

    fn record_decode_speed(&self) {
        if self.completion_tokens == 0 {
            return;
        }
        let per_token = ms(self.decode_started.elapsed()) / self.completion_tokens as f64;
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

/// A generation that ends, finished or not, leaves its context to the
/// model's prefix cache (when it has a scope).
impl Drop for Generation {
    fn drop(&mut self) {
        let (Some(context), Some(scope)) = (self.context.take(), self.cache.take()) else {
            return;
        };
        let idle = Idle::new(context, std::mem::take(&mut self.history), scope);
        let mut cache = self.model.cache.lock().unwrap_or_else(|p| p.into_inner());
        cache.put(idle);
    }
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn sampler_for(sampling: &Sampling) -> LlamaSampler {
    if sampling.temperature <= 0.0 {
        LlamaSampler::greedy()
    } else {
        LlamaSampler::chain_simple([
            LlamaSampler::top_p(sampling.top_p.clamp(0.0, 1.0), 1),
            LlamaSampler::temp(sampling.temperature),
            LlamaSampler::dist(sampling.seed),
        ])
    }
}
