//! The OpenAI-compatible HTTP API: HTTP only. A chat request's body and
//! headers go to the pipeline (`router::serve`); what comes back — a
//! finished completion, a stream, or a failure — is rendered here as JSON,
//! SSE or an OpenAI error envelope. No placement decision is made here.

mod admin;
mod clients;
mod dashboard;
mod embeddings;
pub mod error;
mod feedback;
mod gateway;
pub mod openai;
mod spin;

use crate::node::Node;
use crate::router::{self, Finished, Output, Route, Served, Signals, Stream};
use crate::targets::Delta;
use crate::tenants::Tenant;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use edgeroute_request::tools;
use error::ApiError;
use http_body_util::BodyExt;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;

pub const TARGET_HEADER: &str = "x-edgeroute-target";
pub const REASON_HEADER: &str = "x-edgeroute-reason";
/// The id (content hash) of the policy version that routed the request.
pub const POLICY_HEADER: &str = "x-edgeroute-policy";
/// The local model's confidence in the answer (0 to 1, the geometric mean
/// of its tokens' probabilities), when known before the response began.
pub const CONFIDENCE_HEADER: &str = "x-edgeroute-confidence";
/// Declared sensitivity; may be repeated or a comma-separated list, and
/// every value counts (the most restrictive wins).
pub const SENSITIVITY_HEADER: &str = "x-edgeroute-sensitivity";
pub const LATENCY_BUDGET_HEADER: &str = "x-edgeroute-latency-budget-ms";
/// An agent's session: its calls prefer the local model's cached prefix of
/// the session's previous call.
pub const SESSION_HEADER: &str = "x-edgeroute-session";
/// Prompt tokens the local model continued from its prefix cache.
pub const CACHED_TOKENS_HEADER: &str = "x-edgeroute-cached-tokens";
/// A caller that escalates by itself (a Spin gateway's streamed cascade):
/// a minimum confidence; a local answer judged below it is declined (409
/// `low_confidence`, with the confidence header) instead of sent.
pub const JUDGE_HEADER: &str = "x-edgeroute-judge";

pub fn router(node: Arc<Node>) -> Router {
    // What a client calls: behind its API key when the node has tenants.
    let api = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(models))
        .route("/v1/feedback", post(feedback::post))
        .route("/v1/gateway/egress", post(gateway::post))
        .route("/v1/embeddings", post(embeddings::post))
        .merge(spin::routes())
        .route_layer(axum::middleware::from_fn_with_state(
            node.clone(),
            clients::require,
        ));
    Router::new()
        .merge(api)
        .route("/healthz", get(healthz))
        .route("/ledger", get(ledger))
        .route("/metrics", get(metrics))
        .route("/fleet/load", get(fleet_load))
        .merge(admin::routes())
        .merge(dashboard::routes())
        .method_not_allowed_fallback(|method: axum::http::Method| async move {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "invalid_request_error",
                "method_not_allowed",
                format!("{method} is not allowed on this endpoint"),
            )
        })
        .fallback(|| async {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "not_found",
                "no such endpoint",
            )
        })
        .with_state(node)
}

pub fn set_route_headers(headers: &mut HeaderMap, route: &Route) {
    let target = route
        .target
        .as_ref()
        .map_or_else(|| "none".to_string(), ToString::to_string);
    // Header values must be visible ASCII; reasons are for humans, so
    // anything else becomes '?'.
    let clean = |s: &str| -> HeaderValue {
        let ascii: String = s
            .chars()
            .map(|c| if (' '..='~').contains(&c) { c } else { '?' })
            .collect();
        HeaderValue::from_str(&ascii).unwrap_or_else(|_| HeaderValue::from_static("?"))
    };
    headers.insert(TARGET_HEADER, clean(&target));
    headers.insert(REASON_HEADER, clean(&route.reason));
    if let Some(id) = route
        .policy_id
        .as_deref()
        .and_then(|id| HeaderValue::from_str(id).ok())
    {
        headers.insert(POLICY_HEADER, id);
    }
    if let Some(seconds) = route.retry_after_s {
        headers.insert(axum::http::header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    if let Some(tokens) = route.cached_tokens {
        headers.insert(CACHED_TOKENS_HEADER, HeaderValue::from(tokens));
    }
    if let Some(confidence) = route.confidence {
        headers.insert(CONFIDENCE_HEADER, clean(&format!("{confidence:.3}")));
    }
    if !route.server_timing.is_empty() {
        headers.insert(edgeroute_core::timing::HEADER, clean(&route.server_timing));
    }
}

/// This node's load report, for peers without a shared store; behind the
/// fleet token (it tells how busy the node is).
async fn fleet_load(State(node): State<Arc<Node>>, headers: HeaderMap) -> Response {
    let presented = headers
        .get(crate::fleet::TOKEN_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    match &node.fleet {
        Some(fleet) if fleet.authorize(presented) => {
            Json(crate::fleet::sync::own_report(&node, fleet)).into_response()
        }
        _ => clients::bad_fleet_token(),
    }
}

async fn healthz(State(node): State<Arc<Node>>) -> Json<serde_json::Value> {
    Json(json!({
        "status": "ok",
        "uptime_s": node.started.elapsed().as_secs(),
        "policy": node.policy.current().id,
        // A file name, not the node's directory layout: /healthz is public.
        "policy_source": std::path::Path::new(&node.policy.current().source)
            .file_name()
            .map(|name| name.to_string_lossy().into_owned()),
        "policy_failures": node.policy.failures(),
        // The costly signals the active policy asked for (`configure`).
        "policy_needs": if node.policy.current().needs.embedding { vec!["embedding"] } else { vec![] },
        "embedding_model": node.embedder.as_ref().map(|e| e.name.clone()),
        "local_models": node.local.model_names(),
        // "llama.cpp", or the paced TEST backend, which runs no model.
        "local_backend": if node.config.local.test_backend.is_some() { "test (paced, no model)" } else { "llama.cpp" },
        "local_queue_depth": node.local.queue_depth(),
        "local_running": node.local.running(),
        // Idle sequences kept for prefix reuse, per model.
        "local_prefix_cache": node.local.model_names().iter()
            .filter_map(|name| Some((name.clone(), node.local.batch_load(name)?.idle_sequences)))
            .collect::<std::collections::BTreeMap<_, _>>(),
        // Each model's batch: sequences running and waiting for KV cells,
        // and the cells used (running reservations plus idle sequences).
        "local_batch": node.local.model_names().iter()
            .filter_map(|name| {
                let load = node.local.batch_load(name)?;
                Some((name.clone(), json!({
                    "running": load.running,
                    "waiting": load.waiting,
                    "kv_used_tokens": load.kv_used,
                    "kv_budget_tokens": load.kv_budget,
                })))
            })
            .collect::<std::collections::BTreeMap<_, _>>(),
        "local_wait_ms": node.local.wait_ms(),
        "cloud_upstreams": node.cloud.upstream_names(),
        "fleet": node.fleet.as_ref().map(|f| f.status()),
        // Whether the admin endpoints are on (the dashboard shows its
        // swap and rollback buttons only then).
        "admin_enabled": node.admin_token.is_some(),
        "egress": {
            "allowed": node.cloud.audit.allowed.load(Ordering::Relaxed),
            "refused_sensitive": node.cloud.audit.refused_sensitive.load(Ordering::Relaxed),
            "refused_host": node.cloud.audit.refused_host.load(Ordering::Relaxed),
        },
    }))
}

async fn models(State(node): State<Arc<Node>>) -> Json<serde_json::Value> {
    let created = node_created(&node);
    let mut data = vec![
        json!({ "id": "auto", "object": "model", "created": created, "owned_by": "edgeroute" }),
    ];
    for name in node.local.model_names() {
        data.push(json!({ "id": name, "object": "model", "created": created, "owned_by": "edgeroute:local" }));
    }
    for name in node.cloud.upstream_names() {
        data.push(json!({ "id": name, "object": "model", "created": created, "owned_by": "edgeroute:cloud" }));
    }
    Json(json!({ "object": "list", "data": data }))
}

/// Prometheus text format (`crate::metrics`).
async fn metrics(State(node): State<Arc<Node>>) -> Response {
    let mut response = node.metrics.render(&node).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(crate::metrics::CONTENT_TYPE),
    );
    response
}

/// The whole ledger for the operator (admin token) or on an open node; a
/// client's own tenant's buckets for a client key.
async fn ledger(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
) -> Result<Json<serde_json::Value>, ApiError> {
    if !node.clients.required() || admin::authorize(&node, &headers).is_ok() {
        return Ok(Json(node.ledger.summary(None)));
    }
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match node.clients.identify(authorization) {
        Ok(tenant) => Ok(Json(node.ledger.summary(Some(&tenant.name)))),
        Err(_) => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "invalid_api_key",
            "the ledger needs a client key (its tenant's traffic) or the admin token (all of it)",
        )),
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn node_created(node: &Node) -> u64 {
    unix_now() - node.started.elapsed().as_secs()
}

fn next_request_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!(
        "chatcmpl-{:x}-{}",
        unix_now(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Read at most `limit` bytes within `[limits] body_read_timeout_ms`; a
/// larger body is refused without reading the rest into memory, and a body
/// that stalls gets a 408 instead of holding its connection.
pub(crate) async fn read_body(node: &Node, body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let timeout_ms = node.config.limits.body_read_timeout_ms;
    let reading = http_body_util::Limited::new(body, limit).collect();
    let Ok(read) = tokio::time::timeout(Duration::from_millis(timeout_ms), reading).await else {
        return Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            "request_timeout",
            format!("the request body did not arrive within {timeout_ms} ms"),
        ));
    };
    match read {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "request_too_large",
            format!("the request body exceeds this node's limit of {limit} bytes"),
        )),
        Err(e) => Err(ApiError::bad_request(format!(
            "could not read the request body: {e}"
        ))),
    }
}

/// The signals a client sends as headers. Every value of the sensitivity
/// header is kept: a proxy that appends a header must not be able to turn a
/// restricted request public by going first.
fn signals(headers: &HeaderMap, tenant: Arc<Tenant>) -> Signals {
    Signals {
        tenant: Some(tenant),
        sensitivity: headers
            .get_all(SENSITIVITY_HEADER)
            .iter()
            .map(|value| value.to_str().ok().map(str::to_string))
            .collect(),
        latency_budget_ms: headers
            .get(LATENCY_BUDGET_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
        session: headers
            .get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty()),
        judge: headers
            .get(JUDGE_HEADER)
            .map(|v| v.to_str().unwrap_or_default().to_string()),
        // `clients::require` let it in only with the fleet's token.
        forwarded_by: headers
            .get(crate::fleet::FORWARDED_BY_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
    }
}

async fn chat(
    State(node): State<Arc<Node>>,
    Extension(tenant): Extension<Arc<Tenant>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let bytes = match read_body(&node, body, node.config.limits.max_body_bytes).await {
        Ok(bytes) => bytes,
        Err(error) => return error.into_response(),
    };
    match router::serve(
        &node,
        &bytes,
        &signals(&headers, tenant),
        next_request_id(),
        unix_now(),
    )
    .await
    {
        Ok(served) => render(served),
        Err(failure) => ApiError::from(failure).into_response(),
    }
}

fn render(served: Served) -> Response {
    let Served {
        id,
        created,
        stream,
        include_usage,
        model,
        route,
        output,
    } = served;
    let sse = Sse {
        id,
        created,
        model,
        include_usage,
    };
    match output {
        Output::Done(finished) if !stream => {
            let mut body = openai::completion_body(
                &sse.id,
                sse.created,
                &sse.model,
                &finished.text,
                &finished.finish_reason,
                openai::Usage::new(
                    finished.usage.prompt_tokens,
                    finished.usage.completion_tokens,
                ),
            );
            // An upstream's message goes back as it wrote it: tool calls,
            // refusals and fields the node does not know included.
            if let Some(message) = finished.message {
                body["choices"][0]["message"] = message;
            }
            let mut response = Json(body).into_response();
            set_route_headers(response.headers_mut(), &route);
            response
        }
        Output::Done(finished) => sse.respond(&route, Relay::Finished(finished)),
        Output::Streaming(stream) => sse.respond(&route, Relay::Stream(stream)),
    }
}

/// What an SSE response relays.
enum Relay {
    /// Ended before any text was streamed.
    Finished(Finished),
    Stream(Box<Stream>),
}

/// Server-sent events in OpenAI's chunk format.
struct Sse {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
}

impl Sse {
    fn event(value: serde_json::Value) -> Result<Bytes, std::convert::Infallible> {
        Ok(Bytes::from(format!("data: {value}\n\n")))
    }

    fn chunk(
        &self,
        delta: serde_json::Value,
        finish: Option<&str>,
    ) -> Result<Bytes, std::convert::Infallible> {
        Self::event(openai::chunk_body(
            &self.id,
            self.created,
            &self.model,
            delta,
            finish,
        ))
    }

    /// The relay task forwards text as it comes; the pipeline accounts for
    /// the request when the stream is finished.
    fn respond(self, route: &Route, relay: Relay) -> Response {
        let (tx, rx) = mpsc::channel::<Result<Bytes, std::convert::Infallible>>(64);
        tokio::spawn(async move {
            let _ = tx
                .send(self.chunk(json!({ "role": "assistant", "content": "" }), None))
                .await;
            let result = match relay {
                Relay::Finished(finished) => {
                    if let Some(delta) = finished.message.as_ref().and_then(tools::streamed_calls) {
                        let _ = tx.send(self.chunk(delta, None)).await;
                    } else if !finished.text.is_empty() {
                        let _ = tx
                            .send(self.chunk(json!({ "content": finished.text }), None))
                            .await;
                    }
                    Ok(finished)
                }
                Relay::Stream(mut stream) => {
                    while let Some(delta) = stream.next().await {
                        let delta = match delta {
                            Delta::Text(text) => json!({ "content": text }),
                            // An upstream's tool-call delta, as it wrote it.
                            Delta::Raw(delta) => delta,
                        };
                        // A closed client is noticed by the target through its sink.
                        if tx.send(self.chunk(delta, None)).await.is_err() {
                            break;
                        }
                    }
                    stream.finish().await
                }
            };
            match result {
                Ok(finished) => {
                    let _ = tx
                        .send(self.chunk(json!({}), Some(&finished.finish_reason)))
                        .await;
                    if self.include_usage {
                        let usage = openai::Usage::new(
                            finished.usage.prompt_tokens,
                            finished.usage.completion_tokens,
                        );
                        let _ = tx
                            .send(Self::event(openai::usage_chunk_body(
                                &self.id,
                                self.created,
                                &self.model,
                                usage,
                            )))
                            .await;
                    }
                }
                Err(failure) => {
                    // Headers are gone; the error travels as an event, as OpenAI does.
                    let _ = tx
                        .send(Self::event(openai::error_body(
                            &failure.to_string(),
                            "server_error",
                            "target_failed",
                        )))
                        .await;
                }
            }
            let _ = tx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await;
        });
        let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
        let mut response = Response::new(body);
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        set_route_headers(headers, route);
        response
    }
}
