//! Spin's default `remote_http` LLM protocol (`[llm_compute] type =
//! "remote_http"` in a Spin runtime config): `POST /infer` and
//! `POST /embed`, so every Spin app's `llm::infer` and
//! `llm::generate_embeddings` are routed by this node.
//!
//! Spin sends no content type and reads only the body, whatever the
//! status; its bearer token is a client key (`crate::tenants`), so the
//! tenant's default sensitivity applies to an app that declares nothing.
//! `/infer` goes through the same pipeline, guard and ledger as
//! `/v1/chat/completions`: the prompt becomes one user message.
//!
//! Sampling: `maxTokens`, `temperature` and `topP` are honoured;
//! `repeatPenalty`, `repeatPenaltyLastNTokenCount` and `topK` are accepted
//! and not used (the local sampler has no repeat penalty or top-k, and an
//! OpenAI upstream has neither).

use super::error::ApiError;
use super::{embeddings, next_request_id, read_body, signals, unix_now};
use crate::node::Node;
use crate::router::{self, Finished, Output};
use crate::tenants::Tenant;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;

pub fn routes() -> Router<Arc<Node>> {
    Router::new()
        .route("/infer", post(infer))
        .route("/embed", post(embed))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InferRequest {
    model: String,
    prompt: String,
    #[serde(default)]
    options: InferOptions,
}

/// Spin always sends all six (the app's values or Spin's defaults).
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct InferOptions {
    max_tokens: Option<u32>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    #[allow(dead_code)]
    top_k: Option<u32>,
    #[allow(dead_code)]
    repeat_penalty: Option<f32>,
    #[allow(dead_code)]
    repeat_penalty_last_n_token_count: Option<u32>,
}

fn parse<T: for<'de> Deserialize<'de>>(body: &[u8], what: &str) -> Result<T, ApiError> {
    router::request::strict_json(body)
        .map_err(|invalid| invalid.message)
        .and_then(|value| serde_json::from_value(value).map_err(|e| e.to_string()))
        .map_err(|e| ApiError::bad_request(format!("invalid Spin {what} request: {e}")))
}

async fn infer(
    State(node): State<Arc<Node>>,
    Extension(tenant): Extension<Arc<Tenant>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let body = read_body(&node, body, node.config.limits.max_body_bytes).await?;
    let req: InferRequest = parse(&body, "infer")?;
    // The same request an OpenAI client would send; Spin's temperature of
    // 0.8 and top-p of 0.9 are ordinary values there.
    let mut chat = json!({
        "model": req.model,
        "messages": [{ "role": "user", "content": req.prompt }],
    });
    let options = req.options;
    if let Some(n) = options.max_tokens {
        chat["max_tokens"] = n.into();
    }
    if let Some(t) = options.temperature {
        chat["temperature"] = t.into();
    }
    if let Some(p) = options.top_p {
        chat["top_p"] = p.into();
    }
    let chat = serde_json::to_vec(&chat).map_err(|e| ApiError::internal(e.to_string()))?;
    let served = router::serve(
        &node,
        &chat,
        &signals(&headers, tenant),
        next_request_id(),
        unix_now(),
    )
    .await?;
    let finished = collect(served.output).await?;
    Ok(Json(json!({
        "text": finished.text,
        "usage": {
            "promptTokenCount": finished.usage.prompt_tokens,
            "generatedTokenCount": finished.usage.completion_tokens,
        },
    })))
}

/// The whole answer of a request that did not ask for a stream.
async fn collect(output: Output) -> Result<Finished, ApiError> {
    let mut stream = match output {
        Output::Done(finished) => return Ok(finished),
        Output::Streaming(stream) => stream,
    };
    let mut text = String::new();
    while let Some(delta) = stream.next().await {
        text.push_str(delta.text());
    }
    let finished = stream.finish().await.map_err(|failure| {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            "server_error",
            "target_failed",
            failure.to_string(),
        )
    })?;
    Ok(Finished { text, ..finished })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EmbedRequest {
    model: String,
    input: Value,
}

async fn embed(State(node): State<Arc<Node>>, body: Body) -> Result<Json<Value>, ApiError> {
    let body = read_body(&node, body, node.config.limits.max_body_bytes).await?;
    let req: EmbedRequest = parse(&body, "embed")?;
    let embedder = embeddings::embedder_for(&node, &req.model)?;
    let embedded = embeddings::embed(&node, embedder, &req.input).await?;
    Ok(Json(json!({
        "embeddings": embedded.vectors,
        "usage": { "promptTokenCount": embedded.tokens },
    })))
}
