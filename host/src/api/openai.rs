//! OpenAI chat-completions wire format of what clients get back: the
//! completion, the streaming chunk shape and the error envelope. What they
//! send is parsed by `router::request`.

use serde::Serialize;
use serde_json::{Value, json};

/// The error envelope OpenAI clients parse.
pub fn error_body(message: &str, kind: &str, code: &str) -> Value {
    json!({ "error": { "message": message, "type": kind, "param": null, "code": code } })
}

#[derive(Serialize)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub total_tokens: u32,
}

impl Usage {
    pub fn new(prompt_tokens: u32, completion_tokens: u32) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
        }
    }
}

pub fn completion_body(
    id: &str,
    created: u64,
    model: &str,
    text: &str,
    finish: &str,
    usage: Usage,
) -> Value {
    json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{
            "index": 0,
            "message": { "role": "assistant", "content": text },
            "finish_reason": finish,
        }],
        "usage": usage,
    })
}

/// One `chat.completion.chunk`; the first carries the role, the last the
/// finish reason.
pub fn chunk_body(
    id: &str,
    created: u64,
    model: &str,
    delta: Value,
    finish: Option<&str>,
) -> Value {
    json!({
        "id": id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{ "index": 0, "delta": delta, "finish_reason": finish }],
    })
}

/// The extra chunk `stream_options.include_usage` asks for.
pub fn usage_chunk_body(id: &str, created: u64, model: &str, usage: Usage) -> Value {
    json!({
        "id": id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage,
    })
}
