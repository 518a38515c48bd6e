//! Parse + validate, the pipeline's first step: from raw body bytes (in
//! OpenAI's chat-completions wire format) to a validated chat request, with
//! a clear [`Invalid`] for everything a client can get wrong.
//!
//! Outside the host crate so it can be fuzzed (`fuzz/fuzz_targets/request.rs`)
//! without wasmtime or llama.cpp: the one thing it needs from llama.cpp,
//! turning a JSON schema into a grammar, is passed in as a [`SchemaGrammar`].
//!
//! The body is parsed strictly: a key that appears twice in any object is
//! refused. A lenient parser keeps the first or the last duplicate, and a
//! client that merges objects could then turn `"sensitivity":
//! "restricted"` into `"public"` without anyone seeing it.

pub mod tools;

use serde::Deserialize;
use serde_json::{Map, Value};
use std::sync::Arc;
use tools::{Offer, Offered};

/// Turns a JSON schema (as text) into a GBNF grammar whose root rule is
/// `root`, or says why it cannot (the host passes llama.cpp's converter).
pub type SchemaGrammar = dyn Fn(&str) -> Result<String, String>;

/// OpenAI allows at most four stop sequences.
pub const MAX_STOP_SEQUENCES: usize = 4;

/// What the host asks of a local generation beyond sampling.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Decoding {
    /// The text ends before the first of these (which is not returned).
    pub stop: Vec<String>,
    /// A GBNF grammar (root rule `root`) every completion must follow.
    pub grammar: Option<Arc<str>>,
}

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
    /// What only an upstream can serve (a schema llama.cpp cannot turn
    /// into a grammar, tools of another type than `function`): such a
    /// request goes to the cloud when it may leave, else a 400.
    pub needs_cloud: Option<&'static str>,
    /// The tools the local model may call (`router::tools`); their
    /// description is already in `messages`.
    pub tools: Option<Offered>,
    /// Where that description begins in the first message's text: from
    /// there on it is the node's writing, not the client's (see
    /// [`Prepared::client_texts`]).
    pub tools_described_at: Option<usize>,
    /// `stop` and `response_format`, as the local model follows them.
    pub decoding: Decoding,
}

impl Prepared {
    /// The messages' text as the client wrote it: without the node's
    /// description of the offered tools, whose every string is the
    /// client's `tools` (in `passthrough`) wrapped in the node's own
    /// template. Detection reads this, and `passthrough` besides.
    pub fn client_texts(&self) -> impl Iterator<Item = &str> {
        client_texts(&self.messages, self.tools_described_at)
    }
}

/// [`Prepared::client_texts`] of messages taken out of their `Prepared`.
pub fn client_texts(
    messages: &[(String, String)],
    tools_described_at: Option<usize>,
) -> impl Iterator<Item = &str> {
    messages
        .iter()
        .enumerate()
        .map(move |(i, (_, text))| match tools_described_at {
            Some(at) if i == 0 => &text[..at],
            _ => text.as_str(),
        })
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

/// Parse and validate a chat-completions body. `max_completion_tokens`
/// caps `max_tokens`; `grammar` converts a `response_format` schema.
pub fn parse(
    body: &[u8],
    max_completion_tokens: u32,
    id: String,
    created: u64,
    grammar: &SchemaGrammar,
) -> Result<Prepared, Invalid> {
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
    let (grammar, mut needs_cloud) =
        match response_format(passthrough.get("response_format"), grammar)? {
            LocalFormat::Free => (None, None),
            LocalFormat::Grammar(grammar) => (Some(grammar), None),
            LocalFormat::UpstreamOnly(what) => (None, Some(what)),
        };
    let tools = match tools::offer(&passthrough)? {
        Offer::None => None,
        Offer::Local(offered) => Some(offered),
        Offer::UpstreamOnly(what) => {
            needs_cloud = Some(what);
            None
        }
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
        // Earlier tool calls and results, in the form the model reads.
        let raw = passthrough.get("messages").and_then(|m| m.get(i));
        messages.push(tools::render(role, text, raw.unwrap_or(&Value::Null)));
    }
    if messages.iter().all(|(_, text)| text.trim().is_empty()) {
        return Err(Invalid::request("every message is empty").param("messages"));
    }
    let tools_described_at = tools
        .as_ref()
        .map(|offered| tools::describe(&mut messages, offered));
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
        .min(max_completion_tokens);
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
        tools,
        tools_described_at,
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

fn response_format(
    format: Option<&Value>,
    to_grammar: &SchemaGrammar,
) -> Result<LocalFormat, Invalid> {
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
    Ok(match to_grammar(&schema.to_string()) {
        Ok(grammar) => LocalFormat::Grammar(Arc::from(grammar)),
        Err(_) => {
            LocalFormat::UpstreamOnly("a response_format schema the local model cannot follow")
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_body(body: &str) -> Result<Prepared, Invalid> {
        parse(body.as_bytes(), 1024, "t".into(), 0, &|_| {
            Ok("root ::= \"{}\"".into())
        })
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
