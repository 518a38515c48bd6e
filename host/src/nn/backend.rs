//! The `ggml` wasi-nn backend: llama.cpp behind wasmtime-wasi-nn's backend
//! traits. Streaming over the standard interface follows the convention
//! documented on the `local-worker` world in `wit/routing.wit`: the first
//! `compute` takes `messages` or `prompt` (+ `metadata`) and prefills; each
//! `compute` returns one `token`, and `finish` + `metadata` at the end.
//! An embedding graph (the node's encoder) answers one `compute` per text
//! with `embedding` and `metadata` (the convention is on the same world).

use super::embed::{Embedder, TooLong};
use super::engine::Sampling;
use super::scheduler::{Scheduler, Sequence};
use super::{CacheScope, Decoding, Meter, Tokenized};
use serde::Deserialize;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use wasmtime_wasi_nn::backend::{
    BackendError, BackendExecutionContext, BackendFromDir, BackendGraph, BackendInner, Id,
    NamedTensor,
};
use wasmtime_wasi_nn::wit::{ExecutionTarget, GraphEncoding, TensorType};
use wasmtime_wasi_nn::{ExecutionContext, Graph, GraphRegistry, Tensor};

/// Graphs are preloaded by the host; guests only open them by name.
pub struct GgmlBackend;

impl BackendInner for GgmlBackend {
    fn encoding(&self) -> GraphEncoding {
        GraphEncoding::Ggml
    }

    fn load(&mut self, _: &[&[u8]], _: ExecutionTarget) -> Result<Graph, BackendError> {
        // Loading weights per guest would cost seconds and hundreds of MB per
        // request; the node loads each model once at start.
        Err(failure(
            "edgeroute preloads models: open them with load-by-name",
        ))
    }

    fn as_dir_loadable(&mut self) -> Option<&mut dyn BackendFromDir> {
        None
    }
}

/// The models a guest may open with `load-by-name`, made for one request:
/// every generation it starts reports its tokens' log-probabilities to
/// the request's [`Meter`], which the router reads while text streams.
#[derive(Clone, Default)]
pub struct ModelRegistry(HashMap<String, Graph>);

impl ModelRegistry {
    pub fn new<'a>(
        models: impl IntoIterator<Item = &'a Arc<Scheduler>>,
        meter: &Meter,
        cache: Option<&CacheScope>,
        prompt: Option<Arc<Tokenized>>,
        decoding: &Decoding,
    ) -> Self {
        let graphs = models.into_iter().map(|scheduler| {
            let graph: Box<dyn BackendGraph> = Box::new(LlamaGraph {
                scheduler: scheduler.clone(),
                meter: meter.clone(),
                cache: cache.cloned(),
                prompt: prompt.clone(),
                decoding: decoding.clone(),
            });
            (scheduler.model().name.clone(), Graph::from(graph))
        });
        Self(graphs.collect())
    }
}

impl ModelRegistry {
    /// Only the node's encoder, for an embedding call.
    pub fn embedding(embedder: &Arc<Embedder>) -> Self {
        let graph: Box<dyn BackendGraph> = Box::new(EmbeddingGraph(embedder.clone()));
        Self(HashMap::from([(embedder.name.clone(), Graph::from(graph))]))
    }
}

impl GraphRegistry for ModelRegistry {
    fn get(&self, name: &str) -> Option<&Graph> {
        self.0.get(name)
    }
    fn get_mut(&mut self, name: &str) -> Option<&mut Graph> {
        self.0.get_mut(name)
    }
}

struct LlamaGraph {
    scheduler: Arc<Scheduler>,
    meter: Meter,
    /// The request's prefix-cache scope; None: no reuse.
    cache: Option<CacheScope>,
    prompt: Option<Arc<Tokenized>>,
    decoding: Decoding,
}

impl BackendGraph for LlamaGraph {
    fn init_execution_context(&self) -> Result<ExecutionContext, BackendError> {
        let ctx: Box<dyn BackendExecutionContext> = Box::new(LlamaExecution {
            scheduler: self.scheduler.clone(),
            meter: self.meter.clone(),
            cache: self.cache.clone(),
            prompt: self.prompt.clone(),
            decoding: self.decoding.clone(),
            generation: Mutex::new(None),
        });
        Ok(ExecutionContext::from(ctx))
    }
}

/// A sequence's channel is `Send` but not `Sync`; the mutex makes the
/// execution context shareable as the trait requires (it is never contended).
struct LlamaExecution {
    scheduler: Arc<Scheduler>,
    meter: Meter,
    cache: Option<CacheScope>,
    /// The router's tokens for this request's chat, if it counted them.
    prompt: Option<Arc<Tokenized>>,
    /// The host's stop sequences and grammar for this request.
    decoding: Decoding,
    generation: Mutex<Option<Sequence>>,
}

/// The `metadata` input tensor.
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "kebab-case")]
struct Metadata {
    max_tokens: Option<u32>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    seed: Option<u32>,
}

#[derive(Deserialize)]
struct ChatMessage {
    role: String,
    content: String,
}

impl LlamaExecution {
    fn start(&self, inputs: &[NamedTensor]) -> Result<Sequence, BackendError> {
        let model = self.scheduler.model();
        let text_of = |name: &str| -> Result<Option<&str>, BackendError> {
            inputs
                .iter()
                .find(|t| t.name == name)
                .map(|t| {
                    std::str::from_utf8(&t.tensor.data)
                        .map_err(|_| failure(format!("input '{name}' is not UTF-8")))
                })
                .transpose()
        };
        let metadata: Metadata = match text_of("metadata")? {
            Some(json) => serde_json::from_str(json)
                .map_err(|e| failure(format!("input 'metadata' is not valid JSON: {e}")))?,
            None => Metadata::default(),
        };
        let tokens = if let Some(json) = text_of("messages")? {
            let messages: Vec<ChatMessage> = serde_json::from_str(json)
                .map_err(|e| failure(format!("input 'messages' is not a message list: {e}")))?;
            let pairs: Vec<(String, String)> =
                messages.into_iter().map(|m| (m.role, m.content)).collect();
            match &self.prompt {
                // The router counted these messages' tokens already.
                Some(prompt) if prompt.messages == pairs => prompt.tokens.clone(),
                _ => model.chat_tokens(&pairs).map_err(backend_error)?,
            }
        } else if let Some(prompt) = text_of("prompt")? {
            // A raw prompt is the caller's own: its control tokens count.
            model.tokenize(prompt)
        } else {
            return Err(failure(
                "the first compute needs a 'messages' or 'prompt' input",
            ));
        };
        let defaults = Sampling::default();
        let sampling = Sampling {
            max_tokens: metadata.max_tokens.unwrap_or(defaults.max_tokens),
            temperature: metadata.temperature.unwrap_or(defaults.temperature),
            top_p: metadata.top_p.unwrap_or(defaults.top_p),
            seed: metadata.seed.unwrap_or(defaults.seed),
        };
        let generation = self
            .scheduler
            .submit(tokens, sampling, self.decoding.clone(), self.cache.clone())
            .map_err(backend_error)?;
        self.meter
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .reused_tokens = generation.reused_tokens;
        Ok(generation)
    }
}

impl BackendExecutionContext for LlamaExecution {
    fn set_input(&mut self, _: Id, _: &Tensor) -> Result<(), BackendError> {
        Err(by_index())
    }

    fn get_output(&mut self, _: Id) -> Result<Tensor, BackendError> {
        Err(by_index())
    }

    fn compute(
        &mut self,
        inputs: Option<Vec<NamedTensor>>,
    ) -> Result<Option<Vec<NamedTensor>>, BackendError> {
        let inputs = inputs.unwrap_or_default();
        let mut slot = self.generation.lock().unwrap_or_else(|p| p.into_inner());
        if !inputs.is_empty() {
            *slot = Some(self.start(&inputs)?);
        }
        let generation = slot
            .as_mut()
            .ok_or_else(|| failure("compute before any 'messages' or 'prompt' input"))?;
        let step = generation.step().map_err(backend_error)?;
        let confidence = generation.confidence;
        self.meter
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .confidence = confidence;
        let mut outputs = vec![bytes_tensor("token", step.text.into_bytes())];
        if let Some(finish) = step.finish {
            outputs.push(bytes_tensor("finish", finish.as_str().as_bytes().to_vec()));
            let usage = serde_json::json!({
                "input-tokens": generation.prompt_tokens,
                "output-tokens": generation.completion_tokens,
                "cached-input-tokens": generation.reused_tokens,
                "confidence": confidence.score(),
                "logprob-mean": confidence.mean_logprob(),
                "logprob-min": confidence.min_logprob(),
                "logprob-first-k": confidence.first_k_mean(),
            });
            outputs.push(bytes_tensor("metadata", usage.to_string().into_bytes()));
        }
        Ok(Some(outputs))
    }
}

/// The node's encoder as a graph. An encoder keeps nothing between texts,
/// so one execution context embeds any number of them.
struct EmbeddingGraph(Arc<Embedder>);

impl BackendGraph for EmbeddingGraph {
    fn init_execution_context(&self) -> Result<ExecutionContext, BackendError> {
        let ctx: Box<dyn BackendExecutionContext> = Box::new(EmbeddingExecution(self.0.clone()));
        Ok(ExecutionContext::from(ctx))
    }
}

struct EmbeddingExecution(Arc<Embedder>);

/// The `metadata` input of an embedding.
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
struct EmbeddingMetadata {
    cut_to: Option<u32>,
}

impl BackendExecutionContext for EmbeddingExecution {
    fn set_input(&mut self, _: Id, _: &Tensor) -> Result<(), BackendError> {
        Err(by_index())
    }

    fn get_output(&mut self, _: Id) -> Result<Tensor, BackendError> {
        Err(by_index())
    }

    fn compute(
        &mut self,
        inputs: Option<Vec<NamedTensor>>,
    ) -> Result<Option<Vec<NamedTensor>>, BackendError> {
        let inputs = inputs.unwrap_or_default();
        let input = |name: &str| inputs.iter().find(|t| t.name == name);
        let text = input("text")
            .ok_or_else(|| failure("an embedding needs a 'text' input"))
            .and_then(|t| {
                std::str::from_utf8(&t.tensor.data)
                    .map_err(|_| failure("input 'text' is not UTF-8"))
            })?;
        let metadata: EmbeddingMetadata = match input("metadata") {
            Some(t) => serde_json::from_slice(&t.tensor.data)
                .map_err(|e| failure(format!("input 'metadata' is not valid: {e}")))?,
            None => EmbeddingMetadata::default(),
        };
        let (embedding, said) = match self.0.embed(text, metadata.cut_to) {
            Ok(e) => {
                let said = serde_json::json!({"tokens": e.tokens, "truncated": e.truncated});
                (Some(e.vector), said)
            }
            // Said in the outputs: the guest's error would carry only a code.
            Err(e) => match e.downcast_ref::<TooLong>() {
                Some(t) => (
                    None,
                    serde_json::json!({"tokens": t.tokens, "window": t.window}),
                ),
                None => return Err(backend_error(e)),
            },
        };
        let mut outputs = vec![bytes_tensor("metadata", said.to_string().into_bytes())];
        if let Some(vector) = embedding {
            let dims = vec![1, vector.len() as u32];
            let data = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
            outputs.push(NamedTensor {
                name: "embedding".to_string(),
                tensor: Tensor::new(dims, TensorType::Fp32, data),
            });
        }
        Ok(Some(outputs))
    }
}

/// Tensors travel by name through `compute`; the calls by index are refused.
fn by_index() -> BackendError {
    failure("the ggml backend takes named inputs and returns outputs through compute")
}

fn bytes_tensor(name: &str, data: Vec<u8>) -> NamedTensor {
    NamedTensor {
        name: name.to_string(),
        tensor: Tensor::new(vec![data.len() as u32], TensorType::U8, data),
    }
}

fn failure(message: impl Into<String>) -> BackendError {
    BackendError::BackendAccess(wasmtime::Error::msg(message.into()))
}

fn backend_error(error: anyhow::Error) -> BackendError {
    failure(format!("{error:#}"))
}
