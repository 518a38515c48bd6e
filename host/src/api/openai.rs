//! OpenAI chat-completions wire format: what clients send and what they
//! get back, including the streaming chunk shape and the error envelope.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

#[derive(Debug, Deserialize)]
pub struct ChatCompletionRequest {
    pub model: String,
    pub messages: Vec<ChatMessage>,
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// The newer name for `max_tokens`.
    #[serde(default)]
    pub max_completion_tokens: Option<u32>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    #[serde(default)]
    pub seed: Option<u64>,
    #[serde(default)]
    pub stream: bool,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub n: Option<u32>,
    /// edgeroute reads `sensitivity`, `task` and `latency_budget_ms` here.
    #[serde(default)]
    pub metadata: Option<serde_json::Map<String, Value>>,
}

#[derive(Debug, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

#[derive(Debug, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
}

/// A message's content: a string, or a list of parts of which edgeroute
/// serves the text ones.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

impl ChatMessage {
    /// The message's text, or why it has none edgeroute can serve.
    pub fn text(&self) -> Result<String, String> {
        match &self.content {
            None => Ok(String::new()),
            Some(Content::Text(text)) => Ok(text.clone()),
            Some(Content::Parts(parts)) => parts
                .iter()
                .map(|part| match (part.kind.as_str(), &part.text) {
                    ("text", Some(text)) => Ok(text.as_str()),
                    (kind, _) => Err(format!("content part of type '{kind}' is not supported")),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(|texts| texts.join("")),
        }
    }
}

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
