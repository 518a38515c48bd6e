//! Parse + validate, the pipeline's first step: from raw body bytes (in
//! OpenAI's chat-completions wire format) to a validated chat request, with
//! a clear [`Invalid`] for everything a client can get wrong.
//!
//! The body is parsed strictly: a key that appears twice in any object is
//! refused. A lenient parser keeps the first or the last duplicate, and a
//! client that merges objects could then turn `"sensitivity":
//! "restricted"` into `"public"` without anyone seeing it.

use crate::config::Limits;
use crate::nn::Decoding;
use crate::nn::decoding::MAX_STOP_SEQUENCES;
use serde::Deserialize;
use serde_json::{Map, Value};
use std::sync::Arc;

/// A request the pipeline refuses before routing it (HTTP 4xx).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub kind: InvalidKind,
    pub message: String,
    /// The request field at fault, when there is one.
    pub param: Option<&'static str>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InvalidKind {
    /// Malformed or out-of-range input.
    Request,
    /// `model` names nothing on this node.
    UnknownModel,
}

impl Invalid {
    pub fn request(message: impl Into<String>) -> Self {
        Self {
            kind: InvalidKind::Request,
            message: message.into(),
            param: None,
        }
    }

    pub fn param(mut self, param: &'static str) -> Self {
        self.param = Some(param);
        self
    }
}

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
    /// The client's request as sent, less `metadata` (edgeroute's labels):
    /// what a cloud upstream receives, so fields the node does not
    /// interpret (tools, tool_choice, response_format, unknown ones) reach
    /// it unchanged.
    pub passthrough: Map<String, Value>,
    /// What only an upstream can serve (tool calls, a schema llama.cpp
    /// cannot turn into a grammar): such a request goes to the cloud when
    /// it may leave, else a 400.
    pub needs_cloud: Option<&'static str>,
    /// `stop` and `response_format`, as the local model follows them.
    pub decoding: Decoding,
}

/// Parse JSON refusing duplicate keys anywhere (`edgeroute_detect::body`).
pub fn strict_json(body: &[u8]) -> Result<Value, Invalid> {
    edgeroute_detect::body::strict_json(body).map_err(|e| Invalid::request(e.to_string()))
}

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

pub use edgeroute_detect::body::{ChatMessage, Content, ContentPart};

const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

pub fn parse(body: &[u8], limits: &Limits, id: String, created: u64) -> Result<Prepared, Invalid> {
    if body.is_empty() {
        return Err(Invalid::request(
            "the request body is empty; send a JSON chat completion request",
        ));
    }
    if std::str::from_utf8(body).is_err() {
        return Err(Invalid::request("the request body is not valid UTF-8"));
    }
    let value = strict_json(body)?;
    let mut passthrough = match &value {
        Value::Object(object) => object.clone(),
        _ => Map::new(),
    };
    passthrough.remove("metadata");
    let stop = stop_sequences(passthrough.get("stop"))?;
    let (grammar, needs_cloud) = match needs_cloud(&passthrough) {
        Some(what) => (None, Some(what)),
        None => match response_format(passthrough.get("response_format"))? {
            LocalFormat::Free => (None, None),
            LocalFormat::Grammar(grammar) => (Some(grammar), None),
            LocalFormat::UpstreamOnly(what) => (None, Some(what)),
        },
    };
    let request = ChatCompletionRequest::deserialize(value)
        .map_err(|e| Invalid::request(format!("invalid chat completion request: {e}")))?;
    if request.messages.is_empty() {
        return Err(
            Invalid::request("'messages' must contain at least one message").param("messages"),
        );
    }
    let mut messages = Vec::with_capacity(request.messages.len());
    for (i, message) in request.messages.iter().enumerate() {
        if !ROLES.contains(&message.role.as_str()) {
            return Err(Invalid::request(format!(
                "messages[{i}].role '{}' is not one of {}",
                message.role,
                ROLES.join(", ")
            ))
            .param("messages"));
        }
        let text = message
            .text()
            .map_err(|why| Invalid::request(format!("messages[{i}]: {why}")).param("messages"))?;
        // llama.cpp's C API takes NUL-terminated strings.
        if text.contains('\0') {
            return Err(
                Invalid::request(format!("messages[{i}] contains a NUL character"))
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
        return Err(Invalid::request("every message is empty").param("messages"));
    }
    if let Some(n) = request.n
        && n != 1
    {
        return Err(Invalid::request("only n = 1 is supported").param("n"));
    }
    let temperature = request.temperature.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(Invalid::request("'temperature' must be between 0 and 2").param("temperature"));
    }
    let top_p = request.top_p.unwrap_or(1.0);
    if !(0.0..=1.0).contains(&top_p) || top_p == 0.0 {
        return Err(Invalid::request("'top_p' must be in (0, 1]").param("top_p"));
    }
    let max_tokens = request
        .max_completion_tokens
        .or(request.max_tokens)
        .unwrap_or(256)
        .min(limits.max_completion_tokens);
    if max_tokens == 0 {
        return Err(Invalid::request("'max_tokens' must be at least 1").param("max_tokens"));
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
        passthrough,
        needs_cloud,
        decoding: Decoding { stop, grammar },
    })
}

/// OpenAI's `stop`: a string, or up to four of them.
fn stop_sequences(value: Option<&Value>) -> Result<Vec<String>, Invalid> {
    let invalid = || {
        Invalid::request(format!(
            "'stop' must be a string or an array of at most {MAX_STOP_SEQUENCES} non-empty strings"
        ))
        .param("stop")
    };
    let stops: Vec<String> = match value {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| item.as_str().map(str::to_string).ok_or_else(invalid))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(invalid()),
    };
    if stops.len() > MAX_STOP_SEQUENCES || stops.iter().any(String::is_empty) {
        return Err(invalid());
    }
    Ok(stops)
}

/// How the local model can follow a request's `response_format`.
enum LocalFormat {
    /// Plain text: no constraint.
    Free,
    /// A GBNF grammar: a JSON object for `json_object`, the schema's
    /// grammar (converted by llama.cpp) for `json_schema`.
    Grammar(Arc<str>),
    /// A schema llama.cpp cannot convert: only an upstream can serve it.
    UpstreamOnly(&'static str),
}

fn response_format(format: Option<&Value>) -> Result<LocalFormat, Invalid> {
    let invalid = |why: &str| Invalid::request(why.to_string()).param("response_format");
    let Some(format) = format.filter(|f| !f.is_null()) else {
        return Ok(LocalFormat::Free);
    };
    let schema = match format.get("type").and_then(Value::as_str) {
        Some("text") => return Ok(LocalFormat::Free),
        Some("json_object") => serde_json::json!({"type": "object"}),
        Some("json_schema") => format
            .get("json_schema")
            .and_then(|s| s.get("schema"))
            .cloned()
            .ok_or_else(|| invalid("'response_format.json_schema.schema' is missing"))?,
        _ => {
            return Err(invalid(
                "'response_format.type' must be 'text', 'json_object' or 'json_schema'",
            ));
        }
    };
    Ok(
        match llama_cpp_2::json_schema_to_grammar(&schema.to_string()) {
            Ok(grammar) => LocalFormat::Grammar(Arc::from(grammar)),
            Err(e) => {
                tracing::info!("a response_format schema has no local grammar: {e}");
                LocalFormat::UpstreamOnly("a response_format schema the local model cannot follow")
            }
        },
    )
}

/// What in a request the local model cannot serve. It has no tool-call
/// grammar; a request that offers tools (unless `tool_choice` is `none`)
/// or carries earlier tool calls needs an upstream.
fn needs_cloud(request: &Map<String, Value>) -> Option<&'static str> {
    let offers_tools = request
        .get("tools")
        .and_then(Value::as_array)
        .is_some_and(|tools| !tools.is_empty())
        && request.get("tool_choice").and_then(Value::as_str) != Some("none");
    let has_tool_calls = request
        .get("messages")
        .and_then(Value::as_array)
        .is_some_and(|messages| {
            messages
                .iter()
                .any(|m| m.get("tool_calls").is_some_and(|c| !c.is_null()))
        });
    (offers_tools || has_tool_calls).then_some("tool calls")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_body(body: &str) -> Result<Prepared, Invalid> {
        parse(body.as_bytes(), &Limits::default(), "t".into(), 0)
    }

    #[test]
    fn a_duplicated_key_anywhere_is_refused() {
        for body in [
            r#"{"model":"auto","model":"x","messages":[{"role":"user","content":"hi"}]}"#,
            r#"{"model":"auto","messages":[{"role":"user","content":"hi"}],"metadata":{"sensitivity":"restricted","sensitivity":"public"}}"#,
            r#"{"model":"auto","messages":[{"role":"user","content":"hi","content":"ho"}]}"#,
        ] {
            let error = parse_body(body).unwrap_err();
            assert_eq!(error.kind, InvalidKind::Request);
            assert!(error.message.contains("appears twice"), "{body}: {error:?}");
        }
    }

    #[test]
    fn a_valid_request_keeps_its_metadata() {
        let prepared = parse_body(
            r#"{"model":"auto","messages":[{"role":"developer","content":[{"type":"text","text":"be brief"}]},{"role":"user","content":"hi"}],"metadata":{"sensitivity":"restricted","task":"t"}}"#,
        )
        .unwrap();
        assert_eq!(
            prepared.messages[0],
            ("system".to_string(), "be brief".to_string())
        );
        assert_eq!(prepared.metadata["sensitivity"], "restricted");
    }

    #[test]
    fn bad_input_names_what_is_wrong() {
        let cases = [
            ("", "empty"),
            ("{", "not valid JSON"),
            (r#"{"model":"auto","messages":[]}"#, "at least one message"),
            (
                r#"{"model":"auto","messages":[{"role":"robot","content":"x"}]}"#,
                "robot",
            ),
            (
                r#"{"model":"auto","messages":[{"role":"user","content":"x"}],"temperature":3}"#,
                "temperature",
            ),
            (
                r#"{"model":"auto","messages":[{"role":"user","content":"x"}],"max_tokens":0}"#,
                "max_tokens",
            ),
            (
                r#"{"model":"auto","messages":[{"role":"user","content":"x"}]} trailing"#,
                "JSON",
            ),
            (r#"{"messages":[{"role":"user","content":"x"}]}"#, "model"),
        ];
        for (body, needle) in cases {
            let error = parse_body(body).unwrap_err();
            assert!(error.message.contains(needle), "{body}: {error:?}");
        }
    }
}
