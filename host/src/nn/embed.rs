//! Sentence embeddings on llama.cpp: a small encoder model (BERT-style
//! GGUF, mean pooling) that turns a text into one vector. The node serves
//! it at `/v1/embeddings` and, when the active policy asks for it, gives
//! the policy the prompt's embedding as a complexity signal.
//!
//! One context is kept and reused under a lock: an encoder has no state
//! between calls, and making a context per call would cost more than the
//! embedding itself. Calls are short (milliseconds), so a queue of them
//! behind one lock is fine on a small node.

use super::engine::backend;
use anyhow::{Context, anyhow, bail};
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::context::params::{LlamaContextParams, LlamaPoolingType};
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::model::params::LlamaModelParams;
use std::num::NonZeroU32;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

pub struct Embedder {
    pub name: String,
    /// Declared before `model`: the context borrows it, and fields drop in
    /// order.
    context: Mutex<LlamaContext<'static>>,
    model: &'static LlamaModel,
    /// Tokens one call may embed; longer inputs are cut to it (the
    /// model's trained window, or less by config).
    max_tokens: u32,
    dims: usize,
    /// Texts embedded so far: the benchmark shows a threshold policy
    /// causes none.
    embedded: AtomicU64,
}

/// One text's embedding and what it cost.
#[derive(Debug, Clone)]
pub struct Embedding {
    /// Unit length: a dot product is the cosine similarity.
    pub vector: Vec<f32>,
    /// Tokens embedded (after any cut).
    pub tokens: u32,
    /// The input had more than `max_tokens` tokens.
    pub truncated: bool,
}

impl Embedder {
    /// `max_tokens`: the longest input embedded in full (0: the model's
    /// trained context).
    pub fn load(name: &str, path: &Path, threads: u32, max_tokens: u32) -> anyhow::Result<Self> {
        if !path.is_file() {
            bail!("embedding model file {} does not exist", path.display());
        }
        let model = LlamaModel::load_from_file(backend(), path, &LlamaModelParams::default())
            .with_context(|| format!("llama.cpp could not load {}", path.display()))?;
        // Leaked on purpose: the embedder lives as long as the node, and a
        // 'static model lets the context be kept next to it without a
        // self-referential struct.
        let model: &'static LlamaModel = Box::leak(Box::new(model));
        let trained = model.n_ctx_train().max(1);
        let window = match max_tokens {
            0 => trained,
            n => n.min(trained),
        };
        let params = LlamaContextParams::default()
            .with_n_ctx(NonZeroU32::new(window))
            .with_n_batch(window)
            .with_n_ubatch(window)
            .with_n_threads(threads as i32)
            .with_n_threads_batch(threads as i32)
            .with_embeddings(true)
            .with_pooling_type(LlamaPoolingType::Mean);
        let context = model
            .new_context(backend(), params)
            .map_err(|e| anyhow!("embedding context for '{name}': {e}"))?;
        let dims = model.n_embd().max(0) as usize;
        Ok(Self {
            name: name.to_string(),
            context: Mutex::new(context),
            model,
            max_tokens: window,
            dims,
            embedded: AtomicU64::new(0),
        })
    }

    /// Texts embedded since the node started.
    pub fn embedded(&self) -> u64 {
        self.embedded.load(Ordering::Relaxed)
    }

    /// Length of every vector this model makes.
    pub fn dims(&self) -> usize {
        self.dims
    }

    /// Tokens of `text` as this model counts them (no special tokens).
    pub fn count_tokens(&self, text: &str) -> usize {
        self.model
            .vocab()
            .tokenize(text.as_bytes(), false, false)
            .len()
    }

    /// The longest input, in tokens, embedded in full.
    pub fn window(&self) -> u32 {
        self.max_tokens
    }

    /// Embed one text. Blocking (milliseconds): call it off the async
    /// runtime. `cut_to`: cut a longer input to this many tokens (a
    /// policy's feature); None: an input longer than the window is an
    /// error (a client's `/v1/embeddings` input, which must not be
    /// silently shortened).
    pub fn embed(&self, text: &str, cut_to: Option<u32>) -> anyhow::Result<Embedding> {
        // [CLS] … [SEP] come from the model's own settings.
        let mut tokens = self.model.vocab().tokenize(text.as_bytes(), true, false);
        let limit = cut_to.map_or(self.max_tokens, |n| n.clamp(2, self.max_tokens)) as usize;
        let truncated = tokens.len() > limit;
        if truncated {
            if cut_to.is_none() {
                bail!(TooLong {
                    tokens: tokens.len(),
                    window: self.max_tokens,
                });
            }
            // Keep the model's closing token (SEP) after a cut.
            let last = tokens.last().copied();
            tokens.truncate(limit);
            if let (Some(last), Some(end)) = (last, tokens.last_mut()) {
                *end = last;
            }
        }
        if tokens.is_empty() {
            bail!("nothing to embed");
        }
        let mut batch = LlamaBatch::new(tokens.len(), 1);
        for (pos, token) in tokens.iter().enumerate() {
            batch.add(*token, pos as i32, &[0], true)?;
        }
        self.embedded.fetch_add(1, Ordering::Relaxed);
        let mut context = self.context.lock().unwrap_or_else(|p| p.into_inner());
        context.clear_kv_cache();
        context
            .encode(&mut batch)
            .map_err(|e| anyhow!("embedding failed: {e}"))?;
        let raw = context
            .embeddings_seq_ith(0)
            .map_err(|_| anyhow!("the model gave no pooled embedding"))?;
        Ok(Embedding {
            vector: normalized(raw),
            tokens: tokens.len() as u32,
            truncated,
        })
    }
}

/// An input longer than the model's window.
#[derive(Debug, thiserror::Error)]
#[error("the input is {tokens} tokens; the embedding model takes at most {window}")]
pub struct TooLong {
    pub tokens: usize,
    pub window: u32,
}

fn normalized(v: &[f32]) -> Vec<f32> {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm == 0.0 {
        return v.to_vec();
    }
    v.iter().map(|x| x / norm).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalized_has_unit_length_and_keeps_zero() {
        let v = normalized(&[3.0, 4.0]);
        assert!((v[0] - 0.6).abs() < 1e-6 && (v[1] - 0.8).abs() < 1e-6);
        assert_eq!(normalized(&[0.0, 0.0]), vec![0.0, 0.0]);
    }
}
