//! The OpenAI-compatible HTTP API. A chat request flows
//! `request` (parse) → `features` → `policy` → `guard` → `targets` → `ledger`.

mod admin;
pub mod error;
pub mod openai;
pub mod request;

use crate::bindings::policy::{Features, Outcome};
use crate::bindings::target::{ChatRequest, Completion, Message};
use crate::features::{self, sensitivity_name};
use crate::guard::{self, NodeView, Placement, Refusal};
use crate::ledger::Entry;
use crate::node::Node;
use crate::policy::PolicyVersion;
use crate::targets::cloud::Taint;
use crate::targets::{Job, TargetFailure, TargetResult};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use error::ApiError;
use http_body_util::BodyExt;
use request::Prepared;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc::{self, UnboundedReceiver};
use tokio::task::JoinHandle;

pub const TARGET_HEADER: &str = "x-edgeroute-target";
pub const REASON_HEADER: &str = "x-edgeroute-reason";
/// The id (content hash) of the policy version that routed the request.
pub const POLICY_HEADER: &str = "x-edgeroute-policy";

pub fn router(node: Arc<Node>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(models))
        .route("/healthz", get(healthz))
        .route("/ledger", get(ledger))
        .merge(admin::routes())
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

pub fn set_route_headers(headers: &mut HeaderMap, target: &str, reason: &str) {
    // Header values must be visible ASCII; reasons are for humans, so
    // anything else becomes '?'.
    let clean = |s: &str| -> HeaderValue {
        let ascii: String = s
            .chars()
            .map(|c| if (' '..='~').contains(&c) { c } else { '?' })
            .collect();
        HeaderValue::from_str(&ascii).unwrap_or_else(|_| HeaderValue::from_static("?"))
    };
    headers.insert(TARGET_HEADER, clean(target));
    headers.insert(REASON_HEADER, clean(reason));
}

async fn healthz(State(node): State<Arc<Node>>) -> Json<serde_json::Value> {
    Json(json!({
        "status": "ok",
        "uptime_s": node.started.elapsed().as_secs(),
        "policy": node.policy.current().id,
        "policy_source": node.policy.current().source,
        "policy_failures": node.policy.failures(),
        "local_models": node.local.model_names(),
        "local_queue_depth": node.local.queue_depth(),
        "cloud_upstreams": node.cloud.upstream_names(),
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

async fn ledger(State(node): State<Arc<Node>>) -> Json<serde_json::Value> {
    Json(node.ledger.summary())
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

/// Read at most `limit` bytes; a larger body is refused without reading
/// the rest into memory.
async fn read_body(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    match http_body_util::Limited::new(body, limit).collect().await {
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

async fn chat(State(node): State<Arc<Node>>, headers: HeaderMap, body: Body) -> Response {
    match serve_chat(node, headers, body).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

/// A request after the policy and the guard, with everything needed to
/// account for it once it ends.
struct Routed {
    node: Arc<Node>,
    /// The policy version that decided; it also receives `observe`.
    policy: Arc<PolicyVersion>,
    request: Prepared,
    features: Features,
    started: Instant,
}

async fn serve_chat(node: Arc<Node>, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let started = Instant::now();
    let bytes = read_body(body, node.config.limits.max_body_bytes).await?;
    let request = request::parse(&bytes, &node.config.limits, next_request_id(), unix_now())?;
    check_model(&node, &request.requested_model)?;
    let features = features::extract(
        &request,
        &headers,
        &node.config.guard,
        &node.local,
        &node.cloud,
    )?;
    let (policy, decision) = node.policy.route(&features).await;
    node.policy.shadow.compare(&features, &decision);
    let local_models = node.local.model_names();
    let upstreams = node.cloud.upstream_names();
    let placement = guard::place(
        decision,
        &features,
        &NodeView {
            local_models: &local_models,
            default_local: node.default_local_model(),
            upstreams: &upstreams,
            on_policy_failure: node.config.policy.on_failure,
        },
    );
    let policy_id = HeaderValue::from_str(&policy.id).ok();
    let routed = Routed {
        node,
        policy,
        request,
        features,
        started,
    };
    let mut response = routed
        .dispatch(placement)
        .await
        .unwrap_or_else(IntoResponse::into_response);
    if let Some(id) = policy_id {
        response.headers_mut().insert(POLICY_HEADER, id);
    }
    Ok(response)
}

/// `model` may name a configured local model, an upstream, or `auto`;
/// where the request runs is the policy's call either way.
fn check_model(node: &Node, model: &str) -> Result<(), ApiError> {
    let known = model == "auto"
        || node.config.local.models.iter().any(|m| m.name == model)
        || node.cloud.upstream(model).is_some();
    if known {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "model_not_found",
        format!(
            "the model '{model}' does not exist on this node; GET /v1/models lists the ones that do"
        ),
    )
    .param("model"))
}

/// A generation under way: its text arrives on `deltas`, its result from `task`.
struct Run {
    served_by: String,
    reason: String,
    deltas: UnboundedReceiver<String>,
    task: JoinHandle<TargetResult>,
}

enum FirstEvent {
    Delta(String),
    Ended(TargetResult),
}

impl Run {
    /// Wait until the target either produced text or ended; until then the
    /// response status is still open, so a failure can be a proper error.
    async fn first_event(&mut self) -> FirstEvent {
        tokio::select! {
            biased;
            delta = self.deltas.recv() => match delta {
                Some(delta) => FirstEvent::Delta(delta),
                None => FirstEvent::Ended(join(&mut self.task).await),
            },
            result = &mut self.task => FirstEvent::Ended(flatten(result)),
        }
    }
}

async fn join(task: &mut JoinHandle<TargetResult>) -> TargetResult {
    flatten(task.await)
}

fn flatten(result: Result<TargetResult, tokio::task::JoinError>) -> TargetResult {
    result.unwrap_or_else(|e| Err(TargetFailure::Internal(format!("target task failed: {e}"))))
}

impl Routed {
    async fn dispatch(self, placement: Placement) -> Result<Response, ApiError> {
        let (mut run, is_local) = match placement {
            Placement::Refuse(refusal) => return Err(self.refuse(refusal).await),
            Placement::Local { model, reason } => match self.local_too_long() {
                Some(why) => (
                    self.fallback_or_fail(TargetFailure::BadRequest(why), reason)
                        .await?,
                    false,
                ),
                None => (self.launch_local(model, reason), true),
            },
            Placement::Cloud { upstream, reason } => (self.launch_cloud(upstream, reason), false),
        };
        let mut first = run.first_event().await;
        if is_local
            && let FirstEvent::Ended(Err(failure)) = &first
            && matches!(
                failure,
                TargetFailure::Busy(_) | TargetFailure::Unavailable(_)
            )
        {
            run = self
                .fallback_or_fail(failure.clone(), run.reason.clone())
                .await?;
            first = run.first_event().await;
        }
        match first {
            FirstEvent::Ended(Ok(completion)) if !self.request.stream => {
                Ok(self.complete(run, completion).await)
            }
            FirstEvent::Ended(Err(failure)) => Err(self.failed(&run, failure).await),
            FirstEvent::Ended(Ok(completion)) => Ok(self.stream(run, None, Some(Ok(completion)))),
            FirstEvent::Delta(delta) => Ok(self.stream(run, Some(delta), None)),
        }
    }

    /// The local model cannot take a prompt longer than its context.
    fn local_too_long(&self) -> Option<String> {
        let limit = self.node.config.local.context_size;
        (self.features.prompt_tokens + 1 > limit).then(|| {
            format!(
                "the prompt is {} tokens; the local model's context holds {}",
                self.features.prompt_tokens, limit
            )
        })
    }

    /// Local could not serve: a request that may leave goes to the cloud,
    /// one that may not gets a clear error and goes nowhere.
    async fn fallback_or_fail(
        &self,
        failure: TargetFailure,
        reason: String,
    ) -> Result<Run, ApiError> {
        let upstream = self.node.cloud.upstream_names().into_iter().next();
        match upstream {
            Some(upstream) if self.features.may_leave => Ok(self.launch_cloud(
                upstream,
                format!("{reason}; local failed ({failure}): cloud fallback"),
            )),
            _ => {
                let refusal = match failure {
                    TargetFailure::BadRequest(message) if !self.features.may_leave => Refusal {
                        status: 400,
                        code: "prompt_too_long",
                        message: format!("{message}, and this request may not leave the node"),
                        reason: format!("{reason}; {message}: fail closed"),
                    },
                    TargetFailure::Busy(_) if !self.features.may_leave => Refusal {
                        status: 503,
                        code: "local_busy",
                        message: format!(
                            "{failure}; this request may only run on this node and was not sent anywhere"
                        ),
                        reason: format!("{reason}; local busy: fail closed"),
                    },
                    _ if !self.features.may_leave => {
                        guard::unavailable_locally(&self.features, &format!("{reason}; {failure}"))
                    }
                    _ => Refusal {
                        status: 503,
                        code: "no_target",
                        message: format!("{failure}, and no cloud upstream is configured"),
                        reason: format!("{reason}; {failure}"),
                    },
                };
                Err(self.refuse(refusal).await)
            }
        }
    }

    fn chat_request(&self, model: String) -> ChatRequest {
        let r = &self.request;
        ChatRequest {
            model,
            messages: r
                .messages
                .iter()
                .map(|(role, content)| Message {
                    role: role.clone(),
                    content: content.clone(),
                })
                .collect(),
            max_tokens: r.max_tokens,
            temperature: r.temperature,
            top_p: r.top_p,
            seed: r.seed,
            stream: r.stream,
        }
    }

    fn job(&self, model: String) -> (Job, UnboundedReceiver<String>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let job = Job {
            request: self.chat_request(model),
            stream: self.request.stream.then_some(tx),
        };
        (job, rx)
    }

    fn launch_local(&self, model: String, reason: String) -> Run {
        let (job, deltas) = self.job(model.clone());
        let node = self.node.clone();
        let task = tokio::spawn(async move { node.local.generate(job).await });
        Run {
            served_by: format!("local:{model}"),
            reason,
            deltas,
            task,
        }
    }

    fn launch_cloud(&self, upstream: String, reason: String) -> Run {
        // The guard placed it here only if it may leave; the egress check in
        // wasi:http enforces the same taint again, whatever the code above did.
        let taint = Taint {
            request_id: self.request.id.clone(),
            may_leave: self.features.may_leave,
        };
        let (job, deltas) = self.job(String::new());
        let node = self.node.clone();
        let name = upstream.clone();
        let task = tokio::spawn(async move { node.cloud.generate(&name, job, taint).await });
        Run {
            served_by: format!("cloud:{upstream}"),
            reason,
            deltas,
            task,
        }
    }

    async fn refuse(&self, refusal: Refusal) -> ApiError {
        self.account("none", false, 0).await;
        let status =
            StatusCode::from_u16(refusal.status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
        let kind = if refusal.status == 403 {
            "permission_error"
        } else {
            "server_error"
        };
        let kind = if refusal.status == 400 {
            "invalid_request_error"
        } else {
            kind
        };
        ApiError::new(status, kind, refusal.code, refusal.message).routed("none", refusal.reason)
    }

    async fn failed(&self, run: &Run, failure: TargetFailure) -> ApiError {
        self.account(&run.served_by, false, 0).await;
        let (status, code) = match &failure {
            TargetFailure::Busy(_) => (StatusCode::SERVICE_UNAVAILABLE, "local_busy"),
            TargetFailure::Unavailable(_) => {
                (StatusCode::SERVICE_UNAVAILABLE, "target_unavailable")
            }
            TargetFailure::BadRequest(_) => (StatusCode::BAD_REQUEST, "invalid_request"),
            TargetFailure::Upstream(_) => (StatusCode::BAD_GATEWAY, "upstream_error"),
            TargetFailure::Timeout(_) => (StatusCode::GATEWAY_TIMEOUT, "upstream_timeout"),
            TargetFailure::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "target_failed"),
        };
        let kind = if status == StatusCode::BAD_REQUEST {
            "invalid_request_error"
        } else {
            "server_error"
        };
        ApiError::new(status, kind, code, format!("{}: {failure}", run.served_by))
            .routed(&run.served_by, &run.reason)
    }

    async fn complete(&self, run: Run, completion: Completion) -> Response {
        let usage = &completion.usage;
        self.account(&run.served_by, true, usage.completion_tokens)
            .await;
        let body = openai::completion_body(
            &self.request.id,
            self.request.created,
            &completion.model,
            &completion.text,
            &completion.finish_reason,
            openai::Usage::new(self.prompt_tokens(&completion), usage.completion_tokens),
        );
        let mut response = Json(body).into_response();
        set_route_headers(response.headers_mut(), &run.served_by, &run.reason);
        response
    }

    /// Local runs count prompt tokens the same way the features did; an
    /// upstream's own count wins for cloud runs when it reports one.
    fn prompt_tokens(&self, completion: &Completion) -> u32 {
        match completion.usage.prompt_tokens {
            0 => self.features.prompt_tokens,
            n => n,
        }
    }

    /// Answer as server-sent events in OpenAI's chunk format. The relay
    /// task forwards text as it comes, then accounts for the request.
    fn stream(self, mut run: Run, first: Option<String>, ended: Option<TargetResult>) -> Response {
        let (tx, rx) = mpsc::channel::<Result<Bytes, std::convert::Infallible>>(64);
        let (served_by, reason) = (run.served_by.clone(), run.reason.clone());
        let label = self.model_label(&run.served_by);
        tokio::spawn(async move {
            let r = &self.request;
            let event = |value: serde_json::Value| Ok(Bytes::from(format!("data: {value}\n\n")));
            let chunk = |delta: serde_json::Value, finish: Option<&str>| {
                event(openai::chunk_body(&r.id, r.created, &label, delta, finish))
            };
            let _ = tx
                .send(chunk(json!({ "role": "assistant", "content": "" }), None))
                .await;
            if let Some(text) = first {
                let _ = tx.send(chunk(json!({ "content": text }), None)).await;
            }
            let result = match ended {
                Some(result) => result,
                None => {
                    while let Some(text) = run.deltas.recv().await {
                        // A closed client is noticed by the target through its sink.
                        if tx
                            .send(chunk(json!({ "content": text }), None))
                            .await
                            .is_err()
                        {
                            break;
                        }
                    }
                    drop(run.deltas);
                    join(&mut run.task).await
                }
            };
            match result {
                Ok(completion) => {
                    let _ = tx
                        .send(chunk(json!({}), Some(&completion.finish_reason)))
                        .await;
                    if r.include_usage {
                        let usage = openai::Usage::new(
                            self.prompt_tokens(&completion),
                            completion.usage.completion_tokens,
                        );
                        let _ = tx
                            .send(event(openai::usage_chunk_body(
                                &r.id, r.created, &label, usage,
                            )))
                            .await;
                    }
                    self.account(&run.served_by, true, completion.usage.completion_tokens)
                        .await;
                }
                Err(failure) => {
                    // Headers are gone; the error travels as an event, as OpenAI does.
                    let _ = tx
                        .send(event(openai::error_body(
                            &failure.to_string(),
                            "server_error",
                            "target_failed",
                        )))
                        .await;
                    self.account(&run.served_by, false, 0).await;
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
        set_route_headers(headers, &served_by, &reason);
        response
    }

    /// The model name a stream's chunks carry: the local model, or the
    /// upstream's model for cloud runs.
    fn model_label(&self, served_by: &str) -> String {
        match served_by.split_once(':') {
            Some(("cloud", name)) => self
                .node
                .cloud
                .upstream(name)
                .map(|u| u.model.clone())
                .unwrap_or_default(),
            Some((_, name)) => name.to_string(),
            None => served_by.to_string(),
        }
    }

    /// Ledger entry and the policy's `observe`, once per request.
    async fn account(&self, served_by: &str, ok: bool, completion_tokens: u32) {
        let latency_ms = self.started.elapsed().as_secs_f64() * 1e3;
        let prompt_tokens = self.features.prompt_tokens;
        let cost_usd = served_by
            .strip_prefix("cloud:")
            .and_then(|name| self.node.cloud.upstream(name))
            .map(|u| {
                crate::ledger::Prices {
                    usd_per_mtok_in: u.usd_per_mtok_in,
                    usd_per_mtok_out: u.usd_per_mtok_out,
                }
                .cost(prompt_tokens, completion_tokens)
            })
            .unwrap_or(0.0);
        self.node.ledger.record(Entry {
            served_by,
            sensitivity: sensitivity_name(self.features.sensitivity),
            task: &self.features.task,
            prompt_tokens,
            completion_tokens,
            latency_ms,
            cost_usd,
        });
        tracing::info!(
            request_id = %self.request.id,
            served_by,
            ok,
            latency_ms = latency_ms as u64,
            prompt_tokens,
            completion_tokens,
            sensitivity = sensitivity_name(self.features.sensitivity),
            "request finished"
        );
        let outcome = Outcome {
            request_id: self.request.id.clone(),
            served_by: served_by.to_string(),
            ok,
            latency_ms: latency_ms as u32,
            prompt_tokens,
            completion_tokens,
            cost_micro_usd: (cost_usd * 1e6) as u64,
        };
        self.node.policy.observe(&self.policy, &outcome).await;
    }
}
