//! cloud-fetch: runs one chat completion against an OpenAI-compatible
//! upstream through wasi:http/outgoing-handler.
//!
//! The host gives each instance its upstream in the environment:
//! `EDGEROUTE_UPSTREAM_URL` (a base URL such as `http://127.0.0.1:9999/v1`).
//! The upstream's API key is not given: the host adds the `Authorization`
//! header to requests for that upstream after its egress guard lets them
//! out, and refuses the header if a component sets it. So this component
//! never holds the key and cannot leak it, in a message or anywhere else.

mod sse;

use serde::{Deserialize, Serialize};
use sse::SseEvents;
use wasip2::http::outgoing_handler;
use wasip2::http::types::{
    ErrorCode, Fields, IncomingBody, IncomingResponse, Method, OutgoingBody, OutgoingRequest,
    Scheme,
};
use wasip2::io::streams::{InputStream, StreamError};

wit_bindgen::generate!({
    world: "cloud-fetch",
    path: "../../wit",
});

use edgeroute::routing::completion_types::{RateLimit, Usage};
use edgeroute::routing::sink;
use exports::edgeroute::routing::generator::{ChatRequest, Completion, Guest, TargetError};

/// How much of an error body reaches the client.
const ERROR_BODY_CHARS: usize = 500;
/// How much of an error body we read at all.
const ERROR_BODY_READ_LIMIT: usize = 64 * 1024;
/// The most bytes one wasi:io `write` call may take.
const WRITE_CHUNK: usize = 4096;
/// How much we ask for per read; the stream returns what it has.
const READ_CHUNK: u64 = 16 * 1024;

struct CloudFetch;

impl Guest for CloudFetch {
    fn generate(request: ChatRequest) -> Result<Completion, TargetError> {
        let upstream = Upstream::from_env()?;
        let body = request_body(&request)?;
        let response = upstream.post("/chat/completions", &body, request.stream)?;
        if request.stream {
            read_stream(&request, &response.stream)
        } else {
            read_whole(&request, &response.stream)
        }
    }
}

// ---------------------------------------------------------------- upstream

struct Upstream {
    scheme: Scheme,
    authority: String,
    /// The base URL's path without a trailing slash, e.g. "/v1".
    base_path: String,
    /// The base URL's query ("?api-version=..."), appended to every path.
    query: String,
}

impl Upstream {
    fn from_env() -> Result<Self, TargetError> {
        let url = std::env::var("EDGEROUTE_UPSTREAM_URL").unwrap_or_default();
        if url.is_empty() {
            return Err(TargetError::Unavailable(
                "no upstream configured (EDGEROUTE_UPSTREAM_URL is empty)".into(),
            ));
        }
        // The URL is not quoted in the error: it may carry credentials.
        let bad_url =
            || TargetError::Internal("EDGEROUTE_UPSTREAM_URL is not an http(s) URL".into());
        let (scheme, rest) = match url.split_once("://") {
            Some((s, rest)) if s.eq_ignore_ascii_case("http") => (Scheme::Http, rest),
            Some((s, rest)) if s.eq_ignore_ascii_case("https") => (Scheme::Https, rest),
            _ => return Err(bad_url()),
        };
        let (rest, query) = match rest.split_once('?') {
            Some((rest, query)) => (rest, format!("?{query}")),
            None => (rest, String::new()),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        if authority.is_empty() {
            return Err(bad_url());
        }
        Ok(Upstream {
            scheme,
            authority: authority.to_string(),
            base_path: path.trim_end_matches('/').to_string(),
            query,
        })
    }

    /// Sends a POST and waits for the response head. Any status but 2xx is
    /// an error carrying the (truncated) body.
    fn post(&self, path: &str, body: &[u8], stream: bool) -> Result<Response, TargetError> {
        let accept: &[u8] = if stream {
            b"text/event-stream"
        } else {
            b"application/json"
        };
        // No `authorization`: the host adds the upstream's key itself, and
        // refuses the header from a guest.
        let headers = [
            ("content-type".to_string(), b"application/json".to_vec()),
            ("accept".to_string(), accept.to_vec()),
            // Some servers refuse a body without a length; a length also
            // spares them a chunked decoder.
            (
                "content-length".to_string(),
                body.len().to_string().into_bytes(),
            ),
        ];
        let headers = Fields::from_list(&headers)
            .map_err(|e| TargetError::Internal(format!("building request headers: {e:?}")))?;

        let request = OutgoingRequest::new(headers);
        let path_with_query = format!("{}{}{}", self.base_path, path, self.query);
        let malformed =
            || TargetError::Internal("EDGEROUTE_UPSTREAM_URL is not a valid URL".into());
        request
            .set_method(&Method::Post)
            .map_err(|()| malformed())?;
        request
            .set_scheme(Some(&self.scheme))
            .map_err(|()| malformed())?;
        request
            .set_authority(Some(&self.authority))
            .map_err(|()| malformed())?;
        request
            .set_path_with_query(Some(&path_with_query))
            .map_err(|()| malformed())?;
        let outgoing_body = request
            .body()
            .map_err(|()| TargetError::Internal("request body already taken".into()))?;

        // Hand the request over first and write the body after: the body is
        // streamed to the connection, so writing it before anyone reads could
        // wait on a full pipe.
        let future = outgoing_handler::handle(request, None).map_err(http_error)?;
        {
            let out = outgoing_body
                .write()
                .map_err(|()| TargetError::Internal("request body stream already taken".into()))?;
            for chunk in body.chunks(WRITE_CHUNK) {
                out.blocking_write_and_flush(chunk).map_err(|e| {
                    TargetError::Unavailable(format!("sending the request: {}", stream_error(e)))
                })?;
            }
            // `out` is a child of `outgoing_body` and must go before `finish`.
        }
        OutgoingBody::finish(outgoing_body, None).map_err(http_error)?;

        future.subscribe().block();
        let head = match future.get() {
            Some(Ok(Ok(head))) => head,
            Some(Ok(Err(code))) => return Err(http_error(code)),
            Some(Err(())) | None => {
                return Err(TargetError::Internal("response already taken".into()));
            }
        };
        // Only the delta-seconds form: an HTTP date would need a clock the
        // component does not need otherwise.
        let retry_after_s = head
            .headers()
            .get("retry-after")
            .first()
            .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse::<u32>().ok());
        let response = Response::new(head)?;

        let status = response.status;
        if !(200..300).contains(&status) {
            let body = read_to_end(&response.stream, ERROR_BODY_READ_LIMIT).unwrap_or_default();
            let body = String::from_utf8_lossy(&body);
            let message = format!("HTTP {status}: {}", truncate(body.trim(), ERROR_BODY_CHARS));
            if status == 429 {
                return Err(TargetError::RateLimited(RateLimit {
                    message,
                    retry_after_s,
                }));
            }
            return Err(TargetError::Upstream(message));
        }
        Ok(response)
    }
}

/// A response head with its body stream open. Field order is drop order:
/// the stream is a child of the body, the body of the response.
struct Response {
    stream: InputStream,
    _body: IncomingBody,
    _head: IncomingResponse,
    status: u16,
}

impl Response {
    fn new(head: IncomingResponse) -> Result<Self, TargetError> {
        let status = head.status();
        let body = head
            .consume()
            .map_err(|()| TargetError::Internal("response body already taken".into()))?;
        let stream = body
            .stream()
            .map_err(|()| TargetError::Internal("response body stream already taken".into()))?;
        Ok(Response {
            stream,
            _body: body,
            _head: head,
            status,
        })
    }
}

fn http_error(code: ErrorCode) -> TargetError {
    TargetError::Unavailable(format!("upstream request failed: {code}"))
}

fn stream_error(error: StreamError) -> String {
    match error {
        StreamError::Closed => "connection closed".into(),
        StreamError::LastOperationFailed(e) => e.to_debug_string(),
    }
}

/// Reads the next piece of the body; `None` at its end.
fn read_some(stream: &InputStream) -> Result<Option<Vec<u8>>, TargetError> {
    match stream.blocking_read(READ_CHUNK) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(StreamError::Closed) => Ok(None),
        Err(e) => Err(TargetError::Unavailable(format!(
            "reading the upstream response: {}",
            stream_error(e)
        ))),
    }
}

fn read_to_end(stream: &InputStream, limit: usize) -> Result<Vec<u8>, TargetError> {
    let mut body = Vec::new();
    while body.len() < limit {
        match read_some(stream)? {
            Some(bytes) => body.extend_from_slice(&bytes),
            None => break,
        }
    }
    Ok(body)
}

fn truncate(text: &str, max_chars: usize) -> &str {
    match text.char_indices().nth(max_chars) {
        Some((end, _)) => &text[..end],
        None => text,
    }
}

// ------------------------------------------------------------ OpenAI format

#[derive(Serialize)]
struct UpstreamRequest<'a> {
    model: &'a str,
    messages: Vec<UpstreamMessage<'a>>,
    /// Omitted when 0: "no limit asked", which upstreams spell by absence.
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    temperature: f32,
    top_p: f32,
    seed: u32,
    stream: bool,
}

#[derive(Serialize)]
struct UpstreamMessage<'a> {
    role: &'a str,
    content: &'a str,
}

fn request_body(request: &ChatRequest) -> Result<Vec<u8>, TargetError> {
    if let Some(client) = &request.passthrough {
        return passthrough_body(request, client);
    }
    let body = UpstreamRequest {
        model: &request.model,
        messages: request
            .messages
            .iter()
            .map(|m| UpstreamMessage {
                role: &m.role,
                content: &m.content,
            })
            .collect(),
        max_tokens: (request.max_tokens > 0).then_some(request.max_tokens),
        temperature: request.temperature,
        top_p: request.top_p,
        seed: request.seed,
        stream: request.stream,
    };
    serde_json::to_vec(&body).map_err(|e| TargetError::Internal(format!("encoding request: {e}")))
}

/// The client's own request, with the upstream's model name, the node's
/// clamp on the completion's length and the stream flag: everything else
/// (tools, tool_choice, response_format, stop, unknown fields) goes as the
/// client sent it.
fn passthrough_body(request: &ChatRequest, client: &str) -> Result<Vec<u8>, TargetError> {
    let mut body: serde_json::Map<String, serde_json::Value> = serde_json::from_str(client)
        .map_err(|e| {
            TargetError::Internal(format!("the passthrough request is not a JSON object: {e}"))
        })?;
    body.insert("model".into(), request.model.clone().into());
    body.insert("stream".into(), request.stream.into());
    // Every length field the client used carries the clamped value (both
    // may be sent; an upstream reads either).
    if request.max_tokens > 0 {
        let mut clamped = false;
        for key in ["max_completion_tokens", "max_tokens"] {
            if body.contains_key(key) {
                body.insert(key.into(), request.max_tokens.into());
                clamped = true;
            }
        }
        if !clamped {
            body.insert("max_tokens".into(), request.max_tokens.into());
        }
    }
    // Ask for the usage, so the ledger charges what the upstream counted
    // (the client gets its own usage chunk from the node when it asked).
    if request.stream {
        let options = body
            .entry("stream_options")
            .or_insert_with(|| serde_json::json!({}));
        if let Some(options) = options.as_object_mut() {
            options.insert("include_usage".into(), true.into());
        }
    }
    serde_json::to_vec(&body).map_err(|e| TargetError::Internal(format!("encoding request: {e}")))
}

/// A chat completion, or one chunk of a streamed one: the fields we use.
#[derive(Deserialize, Default)]
#[serde(default)]
struct UpstreamReply {
    model: Option<String>,
    choices: Vec<Choice>,
    usage: Option<UpstreamUsage>,
    /// Some servers report a failure inside a 200 stream.
    error: Option<serde_json::Value>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Choice {
    /// Present in a whole completion.
    message: Option<Content>,
    /// Present in a stream chunk.
    delta: Option<Content>,
    finish_reason: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Content {
    content: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct UpstreamUsage {
    prompt_tokens: u32,
    completion_tokens: u32,
}

fn parse_reply(bytes: &[u8]) -> Result<UpstreamReply, TargetError> {
    let reply: UpstreamReply = serde_json::from_slice(bytes).map_err(|e| {
        TargetError::Upstream(format!(
            "the upstream answered with something other than a chat completion: {e}"
        ))
    })?;
    if let Some(error) = reply.error {
        let text = error.to_string();
        return Err(TargetError::Upstream(
            truncate(&text, ERROR_BODY_CHARS).to_string(),
        ));
    }
    Ok(reply)
}

/// The chunk's `choices[0].delta` as JSON text, when it carries tool calls.
fn tool_call_delta(chunk: &str) -> Option<String> {
    let chunk: serde_json::Value = serde_json::from_str(chunk).ok()?;
    let delta = chunk.pointer("/choices/0/delta")?;
    let calls = delta
        .get("tool_calls")
        .or_else(|| delta.get("function_call"))?;
    let empty = calls.is_null() || calls.as_array().is_some_and(Vec::is_empty);
    (!empty).then(|| delta.to_string())
}

fn read_whole(request: &ChatRequest, stream: &InputStream) -> Result<Completion, TargetError> {
    let body = read_to_end(stream, usize::MAX)?;
    let reply = parse_reply(&body)?;
    // A passthrough answer goes back as the upstream wrote it: tool calls,
    // refusals and fields this component does not know included.
    let message = match request.passthrough {
        Some(_) => serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|mut whole| {
                whole
                    .pointer_mut("/choices/0/message")
                    .map(serde_json::Value::take)
            })
            .filter(serde_json::Value::is_object)
            .map(|m| m.to_string()),
        None => None,
    };
    let choice =
        reply.choices.into_iter().next().ok_or_else(|| {
            TargetError::Upstream("the upstream's completion has no choices".into())
        })?;
    let usage = reply.usage.unwrap_or_default();
    Ok(Completion {
        text: choice.message.and_then(|m| m.content).unwrap_or_default(),
        finish_reason: choice.finish_reason.unwrap_or_else(|| "stop".into()),
        usage: Usage {
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
        },
        model: reply.model.unwrap_or_else(|| request.model.clone()),
        message,
    })
}

/// Reads a server-sent-events body as it arrives and forwards each delta.
fn read_stream(request: &ChatRequest, stream: &InputStream) -> Result<Completion, TargetError> {
    let mut text = String::new();
    let mut model = None;
    let mut finish = None;
    let mut usage = None;
    let mut chunks: u32 = 0;

    let mut events = SseEvents::default();
    let mut saw_done = false;

    'read: loop {
        let (batch, at_end) = match read_some(stream)? {
            Some(bytes) => (events.push(&bytes), false),
            None => (events.finish(), true),
        };
        for data in batch {
            if data.trim() == "[DONE]" {
                saw_done = true;
                break 'read;
            }
            let chunk = parse_reply(data.as_bytes())?;
            model = chunk.model.or(model);
            usage = chunk.usage.or(usage);
            let Some(choice) = chunk.choices.into_iter().next() else {
                continue;
            };
            finish = choice.finish_reason.or(finish);
            // A passthrough stream's tool-call pieces go to the client as
            // the upstream wrote them.
            if request.passthrough.is_some()
                && let Some(raw) = tool_call_delta(&data)
            {
                chunks += 1;
                if !sink::emit_raw(&raw) {
                    finish = Some("cancelled".into());
                    break 'read;
                }
                continue;
            }
            let delta = choice.delta.and_then(|d| d.content).unwrap_or_default();
            if delta.is_empty() {
                continue;
            }
            chunks += 1;
            text.push_str(&delta);
            if !sink::emit(&delta) {
                // The client went away; dropping the response closes the
                // connection and the upstream stops generating.
                finish = Some("cancelled".into());
                break 'read;
            }
        }
        if at_end {
            break;
        }
    }

    // A connection cut mid-answer is not an answer, even if text arrived.
    if !saw_done && finish.is_none() {
        return Err(TargetError::Unavailable(
            "the upstream's stream ended before the completion finished".into(),
        ));
    }

    // Streams often carry no usage; the host counts the prompt itself, and
    // each chunk is usually one token.
    let usage = usage.unwrap_or(UpstreamUsage {
        prompt_tokens: 0,
        completion_tokens: chunks,
    });
    Ok(Completion {
        text,
        finish_reason: finish.unwrap_or_else(|| "stop".into()),
        usage: Usage {
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
        },
        model: model.unwrap_or_else(|| request.model.clone()),
        message: None,
    })
}

export!(CloudFetch);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_events_survive_any_split() {
        let body = "data: {\"a\":1}\r\n\r\n: keep-alive\n\ndata: x\ndata: y\n\ndata: [DONE]\n\n";
        let whole = SseEvents::default().push(body.as_bytes());
        assert_eq!(whole, ["{\"a\":1}", "x\ny", "[DONE]"]);
        for split in 0..body.len() {
            let mut events = SseEvents::default();
            let mut got = events.push(&body.as_bytes()[..split]);
            got.extend(events.push(&body.as_bytes()[split..]));
            got.extend(events.finish());
            assert_eq!(got, whole, "split at {split}");
        }
    }

    #[test]
    fn sse_last_event_without_blank_line() {
        let mut events = SseEvents::default();
        assert!(events.push(b"data: tail").is_empty());
        assert_eq!(events.finish(), ["tail"]);
    }

    #[test]
    fn truncate_counts_chars() {
        assert_eq!(truncate("héllo", 2), "hé");
        assert_eq!(truncate("hi", 500), "hi");
    }

    #[test]
    fn reply_parses_nulls_and_errors() {
        let reply = parse_reply(
            br#"{"model":"m","choices":[{"delta":{"content":null},"finish_reason":null}]}"#,
        )
        .unwrap_or_else(|_| panic!("parse"));
        assert_eq!(reply.choices.len(), 1);
        assert!(parse_reply(br#"{"error":{"message":"boom"}}"#).is_err());
    }
}
