//! `POST /v1/embeddings`: the node's sentence-embedding model, in OpenAI's
//! format, so an SDK's `embeddings.create` (and a Spin app's
//! `llm::generate_embeddings`) work unchanged.
//!
//! Embeddings are always computed here, by the local worker component
//! through wasi-nn: no input is sent anywhere, so a restricted text is as
//! safe as a public one. `model` is `auto` or the
//! configured embedding model's name. `input` is a string or a list of
//! strings; token arrays are refused with a clear error (the node's
//! tokenizer is the model's own). `encoding_format` `base64` (what the
//! official Python SDK asks for) packs little-endian f32s, as OpenAI does.
//! An input longer than the model's window is a 400, never silently cut.

use super::error::ApiError;
use crate::nn::Embedder;
use crate::node::Node;
use crate::router::request;
use crate::targets::TargetFailure;
use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;

/// Inputs one call may carry: each is embedded in turn on the one encoder
/// context, so a huge batch would hold the model for everyone else.
pub const MAX_INPUTS: usize = 256;
/// Text one call may carry in all, in bytes (~64 full windows).
pub const MAX_TOTAL_BYTES: usize = 128 * 1024;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EmbeddingsRequest {
    model: String,
    input: Value,
    #[serde(default)]
    encoding_format: Option<String>,
    /// OpenAI lets some models shorten vectors; this one cannot, so any
    /// other value than its own size is refused.
    #[serde(default)]
    dimensions: Option<u32>,
    /// Accepted for compatibility; not used.
    #[serde(default)]
    #[allow(dead_code)]
    user: Option<String>,
}

pub async fn post(State(node): State<Arc<Node>>, body: Body) -> Result<Json<Value>, ApiError> {
    let body = super::read_body(&node, body, node.config.limits.max_body_bytes).await?;
    let req: EmbeddingsRequest = request::strict_json(&body)
        .map_err(|invalid| invalid.message)
        .and_then(|value| serde_json::from_value(value).map_err(|e| e.to_string()))
        .map_err(|e| ApiError::bad_request(format!("invalid embeddings request: {e}")))?;
    let embedder = embedder_for(&node, &req.model)?;
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "encoding_format must be 'float' or 'base64', got '{other}'"
            ))
            .param("encoding_format"));
        }
    };
    if let Some(d) = req.dimensions
        && d as usize != embedder.dims()
    {
        return Err(ApiError::bad_request(format!(
            "model '{}' makes {}-dimensional embeddings and cannot shorten them",
            embedder.name,
            embedder.dims()
        ))
        .param("dimensions"));
    }
    let embedded = embed(&node, embedder, &req.input).await?;
    let data: Vec<Value> = embedded
        .vectors
        .into_iter()
        .enumerate()
        .map(|(index, vector)| {
            let embedding = if base64 {
                let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(vector)
            };
            json!({ "object": "embedding", "index": index, "embedding": embedding })
        })
        .collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": embedded.model,
        "usage": { "prompt_tokens": embedded.tokens, "total_tokens": embedded.tokens },
    })))
}

/// The node's embedding model, when `model` names it (`auto`, its name,
/// or a `[spin] models` alias of either).
pub(super) fn embedder_for(node: &Node, model: &str) -> Result<Arc<Embedder>, ApiError> {
    let Some(embedder) = node.embedder.clone() else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "model_not_found",
            "this node has no embedding model ([local.embedding] in the config)",
        )
        .param("model"));
    };
    let model = node.config.model_alias(model);
    if model != "auto" && model != embedder.name {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "model_not_found",
            format!(
                "no embedding model '{model}' on this node; use '{}' or 'auto'",
                embedder.name
            ),
        )
        .param("model"));
    }
    Ok(embedder)
}

pub(super) struct Embedded {
    pub model: String,
    pub vectors: Vec<Vec<f32>>,
    pub tokens: u32,
}

/// Embed `input` (a string or a list of strings) on the node's encoder,
/// through the local worker and wasi-nn.
pub(super) async fn embed(
    node: &Node,
    embedder: Arc<Embedder>,
    input: &Value,
) -> Result<Embedded, ApiError> {
    let inputs = texts(input)?;
    // Each input is at most the model's window; together, at most this many
    // windows' worth of text, so one request cannot hold the model for
    // minutes.
    let total: usize = inputs.iter().map(String::len).sum();
    if total > MAX_TOTAL_BYTES {
        return Err(ApiError::bad_request(format!(
            "the inputs hold {total} bytes; at most {MAX_TOTAL_BYTES} per request"
        ))
        .param("input"));
    }
    let results = node
        .local
        .embed(&embedder, inputs, None)
        .await
        .map_err(|e| match e {
            TargetFailure::BadRequest(message) => ApiError::bad_request(message).param("input"),
            other => ApiError::internal(format!("embedding failed: {other}")),
        })?;
    let tokens: u32 = results.iter().map(|e| e.tokens).sum();
    Ok(Embedded {
        model: embedder.name.clone(),
        vectors: results.into_iter().map(|e| e.vector).collect(),
        tokens,
    })
}

/// The texts to embed: one string, or a non-empty list of strings.
fn texts(input: &Value) -> Result<Vec<String>, ApiError> {
    let bad = |message: String| Err(ApiError::bad_request(message).param("input"));
    let list = match input {
        Value::String(s) => return Ok(vec![s.clone()]),
        Value::Array(items) => items,
        _ => return bad("input must be a string or a list of strings".into()),
    };
    if list.is_empty() {
        return bad("input must not be empty".into());
    }
    if list.len() > MAX_INPUTS {
        return bad(format!(
            "at most {MAX_INPUTS} inputs per request, got {}",
            list.len()
        ));
    }
    list.iter()
        .map(|item| match item {
            Value::String(s) if !s.is_empty() => Ok(s.clone()),
            Value::String(_) => Err(ApiError::bad_request("an input string is empty").param("input")),
            _ => Err(ApiError::bad_request(
                "input must be strings: token arrays are not accepted (the node tokenizes with the model's own tokenizer)",
            )
            .param("input")),
        })
        .collect()
}
