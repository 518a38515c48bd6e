//! Responses the gateway writes itself: errors in the OpenAI envelope, and
//! the decision headers the node sends too.

use spin_sdk::http::{HeaderMap, HeaderValue, StatusCode};

pub const TARGET_HEADER: &str = "x-edgeroute-target";
pub const REASON_HEADER: &str = "x-edgeroute-reason";
pub const SENSITIVITY_HEADER: &str = "x-edgeroute-sensitivity";
pub const BUDGET_HEADER: &str = "x-edgeroute-latency-budget-ms";
pub const CONFIDENCE_HEADER: &str = "x-edgeroute-confidence";
/// Asks the node to decline a local answer judged below this confidence.
pub const JUDGE_HEADER: &str = "x-edgeroute-judge";

pub type Reply = spin_sdk::http::Response<http_body_util::Full<bytes::Bytes>>;

/// `{"error": {"message", "type", "param", "code"}}` with `status`.
pub fn error(status: StatusCode, kind: &str, message: &str) -> Reply {
    error_body(status, kind, serde_json::Value::Null, message)
}

/// As [`error`], with the node's `code` for the same refusal.
pub fn coded_error(status: StatusCode, kind: &str, code: &str, message: &str) -> Reply {
    error_body(status, kind, code.into(), message)
}

fn error_body(status: StatusCode, kind: &str, code: serde_json::Value, message: &str) -> Reply {
    let body = serde_json::json!({
        "error": {"message": message, "type": kind, "param": null, "code": code}
    });
    json(status, body.to_string().into())
}

pub fn json(status: StatusCode, body: bytes::Bytes) -> Reply {
    let mut reply = spin_sdk::http::Response::new(http_body_util::Full::new(body));
    *reply.status_mut() = status;
    reply
        .headers_mut()
        .insert("content-type", HeaderValue::from_static("application/json"));
    reply
}

/// A whole chat completion as the server-sent events a streaming client
/// expects (OpenAI's chunk shape): the role, the content or tool calls in
/// one delta, the finish reason, the usage when asked, `[DONE]`. None when
/// `completion` is not a chat completion.
pub fn as_events(completion: &[u8], include_usage: bool) -> Option<bytes::Bytes> {
    use serde_json::{Value, json};
    let completion: Value = serde_json::from_slice(completion).ok()?;
    let choice = completion.get("choices")?.get(0)?;
    let message = choice.get("message")?;
    let event = |fields: Value| {
        let mut chunk = json!({
            "id": completion["id"],
            "object": "chat.completion.chunk",
            "created": completion["created"],
            "model": completion["model"],
        });
        chunk.as_object_mut()?.extend(fields.as_object()?.clone());
        Some(format!("data: {chunk}\n\n"))
    };
    let delta = |delta: Value, finish: &Value| {
        event(json!({"choices": [{ "index": 0, "delta": delta, "finish_reason": finish }]}))
    };
    let mut events = delta(json!({"role": "assistant", "content": ""}), &Value::Null)?;
    if let Some(calls) = edgeroute_request::tools::streamed_calls(message) {
        events += &delta(calls, &Value::Null)?;
    } else if let Some(text) = message.get("content").and_then(Value::as_str)
        && !text.is_empty()
    {
        events += &delta(json!({ "content": text }), &Value::Null)?;
    }
    events += &delta(json!({}), choice.get("finish_reason")?)?;
    if include_usage {
        events += &event(json!({"choices": [], "usage": completion["usage"]}))?;
    }
    events += "data: [DONE]\n\n";
    Some(events.into())
}

/// Server-sent events the gateway wrote whole.
pub fn events(body: bytes::Bytes) -> Reply {
    let mut reply = spin_sdk::http::Response::new(http_body_util::Full::new(body));
    let headers = reply.headers_mut();
    headers.insert(
        "content-type",
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert("cache-control", HeaderValue::from_static("no-cache"));
    reply
}

/// A header value from text the gateway wrote (a reason, a target):
/// characters a header cannot carry become `?`.
pub fn header_value(text: &str) -> HeaderValue {
    let clean: String = text
        .chars()
        .map(|c| {
            if c.is_ascii() && !c.is_ascii_control() {
                c
            } else {
                '?'
            }
        })
        .collect();
    HeaderValue::from_str(&clean).unwrap_or(HeaderValue::from_static("?"))
}

/// Headers of one connection, which WASI HTTP refuses in a response the
/// component returns (`HeaderError::Forbidden`): a streamed answer from
/// the node carries `transfer-encoding: chunked`. Spin frames the body
/// again itself.
pub fn drop_hop_by_hop(headers: &mut HeaderMap) {
    for name in [
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "upgrade",
        "http2-settings",
        "host",
    ] {
        headers.remove(name);
    }
}
