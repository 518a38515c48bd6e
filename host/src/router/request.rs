//! From raw body bytes to a validated chat request, with a clear 4xx for
//! everything a client can get wrong.

use super::error::ApiError;
use super::openai::ChatCompletionRequest;
use crate::config::Limits;
use serde_json::{Map, Value};

/// A chat request that passed validation.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub id: String,
    pub created: u64,
    /// What the client put in `model`.
    pub requested_model: String,
    /// (role, text) pairs.
    pub messages: Vec<(String, String)>,
    pub max_tokens: u32,
    pub temperature: f32,
    pub top_p: f32,
    pub seed: u32,
    pub stream: bool,
    pub include_usage: bool,
    pub metadata: Map<String, Value>,
}

const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

pub fn parse(body: &[u8], limits: &Limits, id: String, created: u64) -> Result<Prepared, ApiError> {
    if body.is_empty() {
        return Err(ApiError::bad_request(
            "the request body is empty; send a JSON chat completion request",
        ));
    }
    if std::str::from_utf8(body).is_err() {
        return Err(ApiError::bad_request("the request body is not valid UTF-8"));
    }
    let request: ChatCompletionRequest = serde_json::from_slice(body).map_err(|e| {
        if e.is_syntax() || e.is_eof() {
            ApiError::bad_request(format!("the request body is not valid JSON: {e}"))
        } else {
            ApiError::bad_request(format!("invalid chat completion request: {e}"))
        }
    })?;
    if request.messages.is_empty() {
        return Err(
            ApiError::bad_request("'messages' must contain at least one message").param("messages"),
        );
    }
    let mut messages = Vec::with_capacity(request.messages.len());
    for (i, message) in request.messages.iter().enumerate() {
        if !ROLES.contains(&message.role.as_str()) {
            return Err(ApiError::bad_request(format!(
                "messages[{i}].role '{}' is not one of {}",
                message.role,
                ROLES.join(", ")
            ))
            .param("messages"));
        }
        let text = message.text().map_err(|why| {
            ApiError::bad_request(format!("messages[{i}]: {why}")).param("messages")
        })?;
        // llama.cpp's C API takes NUL-terminated strings.
        if text.contains('\0') {
            return Err(
                ApiError::bad_request(format!("messages[{i}] contains a NUL character"))
                    .param("messages"),
            );
        }
        // "developer" is the newer name for "system"; chat templates know only the latter.
        let role = if message.role == "developer" {
            "system"
        } else {
            &message.role
        };
        messages.push((role.to_string(), text));
    }
    if messages.iter().all(|(_, text)| text.trim().is_empty()) {
        return Err(ApiError::bad_request("every message is empty").param("messages"));
    }
    if let Some(n) = request.n
        && n != 1
    {
        return Err(ApiError::bad_request("only n = 1 is supported").param("n"));
    }
    let temperature = request.temperature.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(
            ApiError::bad_request("'temperature' must be between 0 and 2").param("temperature"),
        );
    }
    let top_p = request.top_p.unwrap_or(1.0);
    if !(0.0..=1.0).contains(&top_p) || top_p == 0.0 {
        return Err(ApiError::bad_request("'top_p' must be in (0, 1]").param("top_p"));
    }
    let max_tokens = request
        .max_completion_tokens
        .or(request.max_tokens)
        .unwrap_or(256)
        .min(limits.max_completion_tokens);
    if max_tokens == 0 {
        return Err(ApiError::bad_request("'max_tokens' must be at least 1").param("max_tokens"));
    }
    Ok(Prepared {
        id,
        created,
        requested_model: request.model,
        messages,
        max_tokens,
        temperature,
        top_p,
        seed: request.seed.unwrap_or(0) as u32,
        stream: request.stream,
        include_usage: request.stream_options.is_some_and(|o| o.include_usage),
        metadata: request.metadata.unwrap_or_default(),
    })
}
