//! The recording fake cloud: an OpenAI-compatible upstream on loopback that
//! keeps every request it receives, so a test can prove what left the node.

use std::collections::BTreeMap;
use std::future::IntoFuture;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use axum::body::Body;
use axum::extract::State;
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde_json::{Value, json};

use crate::{CLOUD_REPLY, MAX_READ, UPSTREAM_MODEL, lock, truncate};

/// How [`FakeCloud`] streams [`CLOUD_REPLY`]: one SSE chunk per piece.
const CLOUD_REPLY_PIECES: [&str; 3] = ["cloud", " says", " hi"];

/// One request as the fake cloud received it.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    /// Lower-case header names; repeated headers joined with ", ".
    pub headers: BTreeMap<String, String>,
    /// The body parsed as JSON (`Value::Null` when it is not JSON).
    pub body: Value,
    /// The body as text (lossy UTF-8).
    pub body_text: String,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
    }

    /// A chat completion request (`POST …/chat/completions`).
    pub fn is_chat(&self) -> bool {
        self.method == "POST" && self.path.ends_with("/chat/completions")
    }

    /// Whether `needle` appears anywhere in the body or the headers.
    pub fn mentions(&self, needle: &str) -> bool {
        self.body_text.contains(needle) || self.headers.values().any(|v| v.contains(needle))
    }
}

type Log = Arc<Mutex<Vec<Recorded>>>;

/// A real OpenAI-compatible server on 127.0.0.1 (its own thread and tokio
/// runtime) that records every request. `POST /v1/chat/completions` answers
/// [`CLOUD_REPLY`] (as SSE chunks when `stream: true`); `GET /v1/models` lists
/// [`UPSTREAM_MODEL`]; anything else is a 404 (and is still recorded).
pub struct FakeCloud {
    addr: SocketAddr,
    log: Log,
    /// TCP connections accepted so far.
    connections: Arc<std::sync::atomic::AtomicUsize>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl FakeCloud {
    pub fn start() -> FakeCloud {
        let listener =
            std::net::TcpListener::bind("127.0.0.1:0").expect("fake cloud: bind 127.0.0.1:0");
        listener
            .set_nonblocking(true)
            .expect("fake cloud: set_nonblocking");
        let addr = listener.local_addr().expect("fake cloud: local_addr");
        let log: Log = Arc::default();
        let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let accepted = connections.clone();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let app = Router::new()
            .fallback(record_and_answer)
            .with_state(log.clone());
        let thread = std::thread::Builder::new()
            .name(format!("fake-cloud-{}", addr.port()))
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("fake cloud: tokio runtime");
                runtime.block_on(async move {
                    use axum::serve::ListenerExt;
                    let listener = tokio::net::TcpListener::from_std(listener)
                        .expect("fake cloud: tokio listener")
                        .tap_io(move |_| {
                            accepted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        });
                    tokio::select! {
                        served = axum::serve(listener, app).into_future() => {
                            if let Err(e) = served {
                                eprintln!("[fake-cloud] server error: {e}");
                            }
                        }
                        _ = stop_rx => {}
                    }
                });
                // Dropping the runtime here cancels any connection still open.
            })
            .expect("fake cloud: spawn thread");
        FakeCloud {
            addr,
            log,
            connections,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    /// The base URL to configure as an upstream: `http://127.0.0.1:PORT/v1`.
    pub fn url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// TCP connections the fake cloud has accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<Recorded> {
        lock(&self.log).clone()
    }

    /// The chat completion requests received so far.
    pub fn chat_requests(&self) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(Recorded::is_chat)
            .collect()
    }

    /// The requests whose body or headers contain `needle`.
    pub fn requests_mentioning(&self, needle: &str) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|r| r.mentions(needle))
            .collect()
    }

    /// Assert that exactly `times` requests mentioned `needle` (0: the
    /// text never left the node), with everything recorded in the message.
    #[track_caller]
    pub fn assert_received(&self, needle: &str, times: usize) {
        let got = self.requests_mentioning(needle).len();
        assert_eq!(
            got,
            times,
            "the cloud received {got} request(s) mentioning {needle}, expected {times}\n{}",
            self.describe()
        );
    }

    /// A readable dump of what was recorded, for assertion messages.
    pub fn describe(&self) -> String {
        let requests = self.requests();
        if requests.is_empty() {
            return "fake cloud recorded no requests".to_owned();
        }
        let mut out = format!("fake cloud recorded {} request(s):\n", requests.len());
        for r in requests {
            out.push_str(&format!(
                "  {} {} {}\n",
                r.method,
                r.path,
                truncate(&r.body_text, 500)
            ));
        }
        out
    }
}

impl Drop for FakeCloud {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn record_and_answer(State(log): State<Log>, request: axum::extract::Request) -> Response {
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_READ as usize)
        .await
        .unwrap_or_default();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let mut headers: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in &parts.headers {
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        headers
            .entry(name.as_str().to_owned())
            .and_modify(|v| {
                v.push_str(", ");
                v.push_str(&value);
            })
            .or_insert(value);
    }
    let path = parts.uri.path().to_owned();
    lock(&log).push(Recorded {
        method: parts.method.to_string(),
        path: path.clone(),
        headers,
        body: body.clone(),
        body_text: String::from_utf8_lossy(&bytes).into_owned(),
    });

    if parts.method == Method::POST && path.ends_with("/chat/completions") {
        if String::from_utf8_lossy(&bytes).contains(FAKE_RATE_LIMIT) {
            let mut limited = openai_error(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_exceeded",
                "fake cloud: slow down",
            );
            limited
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("7"));
            return limited;
        }
        fake_chat_completion(&body)
    } else if parts.method == Method::GET && path.ends_with("/models") {
        Json(json!({
            "object": "list",
            "data": [{"id": UPSTREAM_MODEL, "object": "model", "created": 0, "owned_by": "fake-cloud"}]
        }))
        .into_response()
    } else {
        openai_error(
            StatusCode::NOT_FOUND,
            "not_found",
            &format!("no route for {path}"),
        )
    }
}

fn openai_error(status: StatusCode, code: &str, message: &str) -> Response {
    let body =
        json!({"error": {"message": message, "type": "invalid_request_error", "code": code}});
    (status, Json(body)).into_response()
}

fn fake_chat_completion(request: &Value) -> Response {
    let Some(messages) = request.get("messages").and_then(Value::as_array) else {
        return openai_error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "messages must be an array",
        );
    };
    let model = request
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or(UPSTREAM_MODEL)
        .to_owned();
    // Whitespace-separated words: good enough for a fake usage block.
    let prompt_tokens: usize = messages
        .iter()
        .filter_map(|m| m.get("content").and_then(Value::as_str))
        .map(|c| c.split_whitespace().count())
        .sum();
    let completion_tokens = CLOUD_REPLY_PIECES.len();
    let usage = json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    });
    let id = "chatcmpl-fakecloud";
    let created = 1_700_000_000u64;

    if request.get("stream").and_then(Value::as_bool) == Some(true) {
        let chunk = |delta: Value, finish_reason: Value| {
            json!({
                "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
            })
        };
        let mut events = vec![chunk(
            json!({"role": "assistant", "content": ""}),
            Value::Null,
        )];
        match tool_turn(request, messages) {
            // A tool call streams as OpenAI's do: the id and name first,
            // then the arguments in pieces.
            Some((message, "tool_calls")) => {
                let call = &message["tool_calls"][0];
                events.push(chunk(
                    json!({"tool_calls": [{"index": 0, "id": call["id"], "type": "function",
                        "function": {"name": call["function"]["name"], "arguments": ""}}]}),
                    Value::Null,
                ));
                let arguments = FAKE_TOOL_ARGUMENTS;
                let (head, tail) = arguments.split_at(arguments.len() / 2);
                for piece in [head, tail] {
                    events.push(chunk(
                        json!({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}),
                        Value::Null,
                    ));
                }
                events.push(chunk(json!({}), json!("tool_calls")));
            }
            Some((message, _)) => {
                events.push(chunk(json!({"content": message["content"]}), Value::Null));
                events.push(chunk(json!({}), json!("stop")));
            }
            None => {
                for piece in CLOUD_REPLY_PIECES {
                    events.push(chunk(json!({"content": piece}), Value::Null));
                }
                events.push(chunk(json!({}), json!("stop")));
            }
        }
        let include_usage = request
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            == Some(true);
        if include_usage {
            events.push(json!({
                "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [], "usage": usage,
            }));
        }
        let mut sse = String::new();
        for event in events {
            sse.push_str(&format!("data: {event}\n\n"));
        }
        sse.push_str("data: [DONE]\n\n");
        return Response::builder()
            .status(StatusCode::OK)
            .header(header::CONTENT_TYPE, "text/event-stream")
            .header(header::CACHE_CONTROL, "no-cache")
            .body(Body::from(sse))
            .expect("fake cloud: SSE response");
    }

    let (message, finish_reason) = tool_turn(request, messages)
        .unwrap_or_else(|| (json!({"role": "assistant", "content": CLOUD_REPLY}), "stop"));
    Json(json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{
            "index": 0,
            "message": message,
            "finish_reason": finish_reason,
        }],
        "usage": usage,
    }))
    .into_response()
}

/// What a tool-using model does: offered tools and not yet given a result,
/// it calls the first tool ([`FAKE_TOOL_CALL_ID`], arguments
/// [`FAKE_TOOL_ARGUMENTS`]); given a tool's result, it answers with
/// "the tool said: RESULT".
fn tool_turn(request: &Value, messages: &[Value]) -> Option<(Value, &'static str)> {
    let last = messages.last()?;
    if last.get("role").and_then(Value::as_str) == Some("tool") {
        let result = last
            .get("content")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let message = json!({"role": "assistant", "content": format!("the tool said: {result}")});
        return Some((message, "stop"));
    }
    let tool = request.pointer("/tools/0/function/name")?.as_str()?;
    let message = json!({
        "role": "assistant",
        "content": null,
        "tool_calls": [{
            "id": FAKE_TOOL_CALL_ID,
            "type": "function",
            "function": {"name": tool, "arguments": FAKE_TOOL_ARGUMENTS},
        }],
    });
    Some((message, "tool_calls"))
}

/// A request whose body holds this gets a 429 with `Retry-After: 7`.
pub const FAKE_RATE_LIMIT: &str = "FAKE_CLOUD_RATE_LIMIT";

/// The id of the tool call the fake cloud makes.
pub const FAKE_TOOL_CALL_ID: &str = "call_fake_1";
/// The arguments of the tool call the fake cloud makes.
pub const FAKE_TOOL_ARGUMENTS: &str = r#"{"city":"Paris"}"#;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Resp, http};

    #[test]
    fn fake_cloud_answers_and_records() {
        let cloud = FakeCloud::start();
        let agent = http::agent();
        let post = |body: &Value, auth: Option<&str>| {
            let mut request = agent
                .post(format!("{}/chat/completions", cloud.url()))
                .header("content-type", "application/json");
            if let Some(auth) = auth {
                request = request.header("authorization", auth);
            }
            Resp::from_ureq(request.send(serde_json::to_vec(body).unwrap()).unwrap()).unwrap()
        };
        let body = json!({
            "model": UPSTREAM_MODEL,
            "messages": [{"role": "user", "content": "hello from canary-selftest"}],
        });
        let resp = post(&body, Some("Bearer k"));
        assert_eq!(resp.status, 200);
        let answer = resp.json();
        assert_eq!(answer["choices"][0]["message"]["content"], CLOUD_REPLY);
        assert!(answer["usage"]["total_tokens"].as_u64().unwrap() > 0);

        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        streamed["stream_options"] = json!({"include_usage": true});
        let resp = post(&streamed, None);
        assert!(
            resp.header("content-type")
                .unwrap()
                .starts_with("text/event-stream")
        );
        let stream = resp.stream();
        assert_eq!(stream.text, CLOUD_REPLY);
        assert_eq!(stream.content_chunks, CLOUD_REPLY_PIECES.len());
        assert!(stream.done_last && stream.usage.is_some());

        let models = agent.get(format!("{}/models", cloud.url())).call().unwrap();
        assert_eq!(models.status().as_u16(), 200);

        assert_eq!(cloud.requests().len(), 3);
        assert_eq!(cloud.chat_requests().len(), 2);
        let hits = cloud.requests_mentioning("canary-selftest");
        assert_eq!(hits.len(), 2);
        assert_eq!(hits[0].header("Authorization"), Some("Bearer k"));
        assert_eq!(hits[0].body, body);
        assert!(cloud.requests_mentioning("not-sent").is_empty());
    }
}
