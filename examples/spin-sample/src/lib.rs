//! A minimal Spin app that exercises Spin's LLM API (`llm::infer`,
//! `llm::generate_embeddings`). Run under `spin up` with a runtime config whose
//! `[llm_compute] type = "remote_http"` points at an edgeroute node, every call
//! becomes a request to that node (see runtime-config/).
//!
//!   POST /infer[?max_tokens=N]   body: the prompt
//!       200 {"text", "prompt_tokens", "generated_tokens"}
//!   POST /embed                  body: one input a line
//!       200 {"count", "dims", "prompt_tokens", "first": [3 floats]}
//!
//! An LLM error gives 502 {"error": "<the error's Debug text>"}, e.g.
//! `RuntimeError("...")`, so a test can see what Spin made of the node's answer.

use serde_json::{Value, json};
use spin_sdk::http::body::IncomingBodyExt;
use spin_sdk::http::{IntoResponse, Json, Method, Request, StatusCode};
use spin_sdk::http_service;
use spin_sdk::llm::{self, EmbeddingModel, InferencingModel, InferencingParams};

// Both names must be listed in the component's `ai_models` in spin.toml, else
// Spin refuses the call with InvalidInput before it reaches the node.
const CHAT_MODEL: &str = "llama2-chat";
const EMBED_MODEL: &str = "all-minilm-l6-v2";

// Small by default: a test wants a quick answer, not a good one.
const DEFAULT_MAX_TOKENS: u32 = 16;

#[http_service]
async fn handle(req: Request) -> impl IntoResponse {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    let body = match req.into_body().bytes().await {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(e) => return reply(StatusCode::BAD_REQUEST, json!({"error": format!("{e:?}")})),
    };
    match (method, path.as_str()) {
        (Method::POST, "/infer") => infer(&body, &query),
        (Method::POST, "/embed") => embed(&body),
        _ => reply(StatusCode::NOT_FOUND, json!({"error": "POST /infer or /embed"})),
    }
}

fn infer(prompt: &str, query: &str) -> (StatusCode, Json<Value>) {
    let max_tokens = query_param(query, "max_tokens")
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_MAX_TOKENS);
    // Temperature 0 so that a test gets the same text on each run; the other
    // fields keep Spin's defaults (they are all sent to a "default" backend).
    let params = InferencingParams {
        max_tokens,
        temperature: 0.0,
        ..Default::default()
    };
    match llm::infer_with_options(InferencingModel::Other(CHAT_MODEL), prompt, params) {
        Ok(r) => reply(
            StatusCode::OK,
            json!({
                "text": r.text,
                "prompt_tokens": r.usage.prompt_token_count,
                "generated_tokens": r.usage.generated_token_count,
            }),
        ),
        Err(e) => reply(StatusCode::BAD_GATEWAY, json!({"error": format!("{e:?}")})),
    }
}

fn embed(body: &str) -> (StatusCode, Json<Value>) {
    let lines: Vec<String> = body
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_owned)
        .collect();
    match llm::generate_embeddings(EmbeddingModel::Other(EMBED_MODEL), &lines) {
        Ok(r) => {
            let first: Vec<f32> = r
                .embeddings
                .first()
                .map(|v| v.iter().take(3).copied().collect())
                .unwrap_or_default();
            reply(
                StatusCode::OK,
                json!({
                    "count": r.embeddings.len(),
                    "dims": r.embeddings.first().map_or(0, Vec::len),
                    "prompt_tokens": r.usage.prompt_token_count,
                    "first": first,
                }),
            )
        }
        Err(e) => reply(StatusCode::BAD_GATEWAY, json!({"error": format!("{e:?}")})),
    }
}

fn reply(status: StatusCode, body: Value) -> (StatusCode, Json<Value>) {
    (status, Json(body))
}

// No URL-decoding: the only parameter is a number.
fn query_param<'a>(query: &'a str, name: &str) -> Option<&'a str> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}
