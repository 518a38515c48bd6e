//! Where the gateway sends a placed request: the node on this server for
//! local work, the upstream for cloud work. Both are outbound HTTP, which
//! spin.toml's `allowed_outbound_hosts` limits to exactly the node and the
//! configured upstream: Spin refuses any other host before a byte leaves.

use crate::reply::{self, JUDGE_HEADER, Reply, SENSITIVITY_HEADER};
use crate::request::Chat;
use crate::settings::Settings;
use spin_sdk::http::{Response, StatusCode};
use spin_sdk::wasip3::http::types::ErrorCode;

/// The node runs it on `model`, with the request's level in the header so
/// the node judges it the same (a restricted request stays there even if
/// its key's tenant were not confined to the node).
pub async fn to_node(settings: &Settings, chat: &Chat, model: &str) -> Result<Response, Reply> {
    node_request(settings, chat, model, chat.stream, None).await
}

/// As [`to_node`], streamed, with the node asked to judge its first tokens
/// and decline below `min_confidence` (`x-edgeroute-judge`: a 409
/// `low_confidence` with the confidence header, nothing streamed).
pub async fn to_node_judged(
    settings: &Settings,
    chat: &Chat,
    model: &str,
    min_confidence: f32,
) -> Result<Response, Reply> {
    let judge = (JUDGE_HEADER, min_confidence.to_string());
    node_request(settings, chat, model, true, Some(judge)).await
}

/// As [`to_node`], but the whole answer in one JSON body even when the
/// client streams: what a cascade judges before anything is sent.
pub async fn to_node_whole(
    settings: &Settings,
    chat: &Chat,
    model: &str,
) -> Result<Response, Reply> {
    node_request(settings, chat, model, false, None).await
}

async fn node_request(
    settings: &Settings,
    chat: &Chat,
    model: &str,
    stream: bool,
    extra: Option<(&'static str, String)>,
) -> Result<Response, Reply> {
    let mut body = chat.body.clone();
    body.insert("model".into(), model.into());
    if !stream {
        body.insert("stream".into(), false.into());
        body.remove("stream_options");
    }
    let level = chat.sensitivity.level().name();
    let url = format!("{}/v1/chat/completions", settings.node_url);
    let mut headers = vec![(SENSITIVITY_HEADER, level.to_string())];
    headers.extend(node_auth(settings));
    headers.extend(extra);
    let body = serde_json::to_vec(&body).expect("a JSON map serialises");
    post(&url, headers, body, "the edgeroute node").await
}

/// The key the gateway presents to the node, if it has one.
pub fn node_auth(settings: &Settings) -> Option<(&'static str, String)> {
    (!settings.node_key.is_empty())
        .then(|| ("authorization", format!("Bearer {}", settings.node_key)))
}

/// What the upstream gets: the client's body less `metadata` (edgeroute's
/// labels), with the configured model.
pub fn cloud_body(settings: &Settings, chat: &Chat) -> Vec<u8> {
    let mut body = chat.body.clone();
    body.remove("metadata");
    if !settings.upstream_model.is_empty() {
        body.insert("model".into(), settings.upstream_model.clone().into());
    }
    serde_json::to_vec(&body).expect("a JSON map serialises")
}

/// `body` (from [`cloud_body`]) to the upstream, with the key; nothing else.
pub async fn to_cloud(settings: &Settings, body: Vec<u8>) -> Result<Response, Reply> {
    let mut headers = Vec::new();
    if !settings.upstream_key.is_empty() {
        headers.push(("authorization", format!("Bearer {}", settings.upstream_key)));
    }
    post(&settings.upstream_url, headers, body, "the cloud upstream").await
}

pub async fn post(
    url: &str,
    headers: Vec<(&str, String)>,
    body: Vec<u8>,
    what: &str,
) -> Result<Response, Reply> {
    let mut request = spin_sdk::http::Request::post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    for (name, value) in headers {
        request = request.header(name, value);
    }
    let request = request
        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        .map_err(|e| {
            reply::error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                &format!("the gateway's URL for {what} is not usable ({url}): {e}"),
            )
        })?;
    spin_sdk::http::send(request).await.map_err(|e| {
        let message = match e {
            ErrorCode::HttpRequestDenied => format!(
                "the gateway may not reach {what} at {url}: its host is not in \
                 allowed_outbound_hosts (spin.toml); nothing was sent"
            ),
            other => format!("{what} at {url} did not answer: {other:?}"),
        };
        reply::error(StatusCode::BAD_GATEWAY, "server_error", &message)
    })
}

/// An answer's body with its first frame already read: returned with the
/// headers, so Spin writes both at once. Spin's listener does not set
/// `TCP_NODELAY`, and headers written alone would hold the first chunk of
/// a stream back until the client's delayed ACK (40 ms on Linux).
pub struct Prefetched {
    first: Option<http_body::Frame<bytes::Bytes>>,
    rest: spin_sdk::wasip3::http_compat::IncomingResponseBody,
}

impl Prefetched {
    /// Waits for the first frame (or the end) of `response`'s body.
    pub async fn of(response: Response) -> Result<spin_sdk::http::Response<Prefetched>, ErrorCode> {
        use http_body_util::BodyExt;
        let (parts, mut rest) = response.into_parts();
        let first = rest.frame().await.transpose()?;
        Ok(spin_sdk::http::Response::from_parts(
            parts,
            Prefetched { first, rest },
        ))
    }
}

impl http_body::Body for Prefetched {
    type Data = bytes::Bytes;
    type Error = ErrorCode;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        if let Some(first) = self.first.take() {
            return std::task::Poll::Ready(Some(Ok(first)));
        }
        std::pin::Pin::new(&mut self.rest).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.rest.is_end_stream()
    }
}
