//! edgeroute's routing as a Spin application (`spin.toml` at the
//! repository root). `POST /v1/chat/completions` is placed the node's
//! way, with the node's code:
//!
//! 1. read strictly, every declared level and detection collected
//!    (`edgeroute_detect`, compiled to wasm32-wasip2 with the gateway);
//! 2. the policy decides: the node's own policy component file, a Spin
//!    component dependency (`policy`);
//! 3. the guard places it (`edgeroute_core::guard`): a request that may
//!    not leave is never sent to the cloud, whatever the policy said;
//! 4. local work goes to the edgeroute node on this server, cloud work to
//!    the upstream with the key (a Spin secret) added (`dispatch`).
//!
//! A cascade is judged by the node's confidence header. Whole answers are
//! judged whole. When the client streams and the request may escalate,
//! the node holds back its first `cascade_hold_tokens`, judges them and
//! declines below the threshold (`x-edgeroute-judge`), so a kept answer
//! streams from its first tokens; one that may not escalate is judged on
//! the whole local answer and sent as server-sent events in one go.

mod detector;
mod dispatch;
mod policy;
mod reply;
mod report;
mod request;
mod settings;

use edgeroute_core::guard::{self, LocalFailure, NodeView, Placement};
use edgeroute_core::timing::{self, Timing};
use edgeroute_core::{Refusal, Target};
use reply::{CONFIDENCE_HEADER, REASON_HEADER, TARGET_HEADER};
use spin_sdk::http::body::IncomingBodyExt;
use spin_sdk::http::{IntoResponse, Method, Request, StatusCode};
use spin_sdk::http_service;
use spin_sdk::wasip3::http::types::ErrorCode;

#[http_service]
async fn handle(req: Request) -> impl IntoResponse {
    match (req.method(), req.uri().path()) {
        (&Method::POST, "/v1/chat/completions") => chat(req).await,
        (&Method::GET, "/healthz") => reply::json(
            StatusCode::OK,
            r#"{"status":"ok","role":"spin-gateway"}"#.into(),
        )
        .into_response(),
        _ => refuse(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "the gateway serves POST /v1/chat/completions and GET /healthz",
        ),
    }
}

type Answer =
    Result<spin_sdk::wasip3::http::types::Response, spin_sdk::wasip3::http::types::ErrorCode>;

async fn chat(req: Request) -> Answer {
    let mut timing = Timing::start();
    let settings = match settings::get().await {
        Ok(s) => s,
        Err(why) => {
            return refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                &format!("the gateway is misconfigured, so it routes nothing: {why}"),
            );
        }
    };
    timing.mark("settings");
    let headers = req.headers().clone();
    let bytes = match read_bounded(req.into_body(), request::MAX_BODY_BYTES).await {
        Ok(Some(bytes)) => bytes,
        Ok(None) => {
            return refuse(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                &format!("the request body is over {} bytes", request::MAX_BODY_BYTES),
            );
        }
        Err(e) => {
            return refuse(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                &format!("the request body could not be read: {e:?}"),
            );
        }
    };
    timing.mark("read");
    let id = request_id();
    let chat = match request::read(&bytes, &headers, settings, id, &mut timing) {
        Ok(chat) => chat,
        Err(why) => return refuse(StatusCode::BAD_REQUEST, "invalid_request_error", &why),
    };
    let decision = policy::decide(&settings.policy_params, &chat.features);
    timing.mark("policy");
    let upstreams = settings.upstreams();
    let view = NodeView {
        local_models: &settings.local_models,
        default_local: settings.local_models.first().map(String::as_str),
        upstreams: &upstreams,
        on_policy_failure: settings.rules.on_policy_failure,
        peers: &[],
        peer_pick: None,
    };
    let placement = match guard::place(decision, &chat.facts, &view) {
        // What the node's local model would refuse goes where the node
        // sends it after that refusal: the cloud when the request may
        // leave, else a refusal (the node's 400 `unsupported_locally`).
        Placement::Run {
            target: Target::Local(_),
            reason,
        }
        | Placement::Cascade {
            first: Target::Local(_),
            reason,
            ..
        } if chat.local_cannot_serve.is_some() => {
            let what = chat.local_cannot_serve.clone().unwrap_or_default();
            guard::after_local_failure(
                &LocalFailure::Unsupported(what),
                &reason,
                &chat.facts,
                &view,
            )
        }
        placement => placement,
    };
    timing.mark("guard");
    let level = chat.sensitivity.explain();
    match placement {
        Placement::Refuse(refused) => {
            // The node's statuses for the same causes (`api/error.rs`).
            let (status, kind) = match refused.cause {
                Refusal::PolicyRejected { .. } => (StatusCode::FORBIDDEN, "permission_error"),
                Refusal::Unsupported { .. } | Refusal::PromptTooLong { .. } => {
                    (StatusCode::BAD_REQUEST, "invalid_request_error")
                }
                _ => (StatusCode::SERVICE_UNAVAILABLE, "server_error"),
            };
            let message = refused.cause.to_string();
            let mut reply = reply::coded_error(status, kind, refused.cause.code(), &message);
            let reason = format!("{}; {level}", refused.reason);
            decision_headers(&mut reply, "none", &reason, &timing);
            reply.into_response()
        }
        Placement::Run { target, reason } => {
            let reason = format!("{reason}; {level}");
            run(settings, &chat, &target, &reason, &mut timing).await
        }
        Placement::Cascade {
            first,
            then,
            min_confidence,
            reason,
        } => {
            let reason = format!("{reason}; {level}");
            let Some(then) = then else {
                return run(settings, &chat, &first, &reason, &mut timing).await;
            };
            cascade(
                settings,
                &chat,
                &view,
                (&first, &then, min_confidence),
                &reason,
                &mut timing,
            )
            .await
        }
    }
}

/// One hop; the answer streams through as the node or upstream sends it.
async fn run(
    settings: &settings::Settings,
    chat: &request::Chat,
    target: &Target,
    reason: &str,
    timing: &mut Timing,
) -> Answer {
    // A cloud call is reported to the node's ledger and audit log.
    let mut call = None;
    let sent = match target {
        Target::Local(model) => dispatch::to_node(settings, chat, model).await,
        Target::Cloud(_) => {
            let body = dispatch::cloud_body(settings, chat);
            call = Some(report::CloudCall::start(settings, chat, reason, body.len()));
            dispatch::to_cloud(settings, body).await
        }
        // The gateway shows the policy no peers, so the guard never
        // places one; refuse rather than guess.
        Target::Peer(name) => {
            return refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                &format!("the gateway has no fleet peers (policy wanted peer {name})"),
            );
        }
    };
    timing.mark(target.kind().name());
    let response = match sent {
        Ok(response) => response,
        Err(mut reply) => {
            if let Some(call) = call {
                call.finish(false, None);
            }
            decision_headers(&mut reply, &target.to_string(), reason, timing);
            return reply.into_response();
        }
    };
    relay(chat, target, reason, timing, response, call).await
}

/// `target`'s answer to the client, as it comes.
async fn relay(
    chat: &request::Chat,
    target: &Target,
    reason: &str,
    timing: &mut Timing,
    response: spin_sdk::http::Response,
    call: Option<report::CloudCall>,
) -> Answer {
    let ok = response.status().is_success();
    let broke_off = |e: ErrorCode, timing: &Timing| {
        let mut reply = reply::error(
            StatusCode::BAD_GATEWAY,
            "server_error",
            &format!("{target}'s answer broke off: {e:?}"),
        );
        decision_headers(&mut reply, &target.to_string(), reason, timing);
        reply.into_response()
    };
    // Never the answer as received: returned as is, it would go out with
    // its own headers (ours dropped). A whole answer goes out in one piece
    // with its length; a stream with its first chunk beside the headers.
    // Spin's listener does not set TCP_NODELAY, so a piece written alone
    // after the headers waits for the client's delayed ACK (40 ms).
    if chat.stream {
        let prefetched = dispatch::Prefetched::of(response).await;
        timing.mark("first-chunk");
        if let Some(call) = call {
            call.finish(ok && prefetched.is_ok(), None);
        }
        let mut response = match prefetched {
            Ok(response) => response,
            Err(e) => return broke_off(e, timing),
        };
        reply::drop_hop_by_hop(response.headers_mut());
        decision_headers(&mut response, &target.to_string(), reason, timing);
        response.into_response()
    } else {
        let (mut parts, body) = response.into_parts();
        let body = body.bytes().await;
        timing.mark("body");
        if let Some(call) = call {
            call.finish(ok && body.is_ok(), body.as_deref().ok());
        }
        let body = match body {
            Ok(body) => body,
            Err(e) => return broke_off(e, timing),
        };
        reply::drop_hop_by_hop(&mut parts.headers);
        parts.headers.remove("content-length");
        let mut response =
            spin_sdk::http::Response::from_parts(parts, http_body_util::Full::new(body));
        decision_headers(&mut response, &target.to_string(), reason, timing);
        response.into_response()
    }
}

/// Local first, judged by the node's confidence header; below the
/// threshold the guard is asked again before the cloud hop.
async fn cascade(
    settings: &settings::Settings,
    chat: &request::Chat,
    view: &NodeView<'_>,
    (first, then, min): (&Target, &Target, f32),
    reason: &str,
    timing: &mut Timing,
) -> Answer {
    let Target::Local(model) = first else {
        return run(settings, chat, first, reason, timing).await;
    };
    // Streamed, and the second hop allowed (0 is below any threshold):
    // judged on the node's first tokens, which it declines (409) below
    // `min`. Otherwise judged on the whole local answer.
    let judged = chat.stream && guard::escalate(then, 0.0, min, &chat.facts, view).is_some();
    let response = if judged {
        dispatch::to_node_judged(settings, chat, model, min).await
    } else {
        dispatch::to_node_whole(settings, chat, model).await
    };
    timing.mark("local");
    let response = match response {
        Ok(response) => response,
        Err(mut reply) => {
            decision_headers(&mut reply, &first.to_string(), reason, timing);
            return reply.into_response();
        }
    };
    // A judged stream below `min` comes back declined; a whole answer
    // comes back answered.
    let status = response.status();
    let below_or_answered = if judged {
        status == StatusCode::CONFLICT
    } else {
        status.is_success()
    };
    if let Some(confidence) = confidence_of(&response)
        && below_or_answered
        && let Some(Placement::Run {
            target,
            reason: why,
        }) = guard::escalate(then, confidence, min, &chat.facts, view)
    {
        return run(settings, chat, &target, &format!("{reason}; {why}"), timing).await;
    }
    // A kept judged stream (or a node that declined without a usable
    // confidence) goes to the client as it comes: never a second run.
    if judged {
        return relay(chat, first, reason, timing, response, None).await;
    }
    let kept = response.headers().clone();
    let body = match response.into_body().bytes().await {
        Ok(body) => body,
        Err(e) => {
            return refuse(
                StatusCode::BAD_GATEWAY,
                "server_error",
                &format!("the node's answer could not be read: {e:?}"),
            );
        }
    };
    let mut reply = if chat.stream && status.is_success() {
        let include_usage = chat
            .body
            .get("stream_options")
            .and_then(|o| o.get("include_usage"))
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false);
        match reply::as_events(&body, include_usage) {
            Some(events) => reply::events(events),
            None => {
                return refuse(
                    StatusCode::BAD_GATEWAY,
                    "server_error",
                    "the node's answer is not a chat completion",
                );
            }
        }
    } else {
        reply::json(status, body)
    };
    let names: &[&str] = if chat.stream && status.is_success() {
        &[CONFIDENCE_HEADER]
    } else {
        &["content-type", CONFIDENCE_HEADER]
    };
    for &name in names {
        if let Some(value) = kept.get(name) {
            reply.headers_mut().insert(name, value.clone());
        }
    }
    timing.mark("body");
    decision_headers(&mut reply, &first.to_string(), reason, timing);
    reply.into_response()
}

/// The node's confidence header.
fn confidence_of<B>(response: &spin_sdk::http::Response<B>) -> Option<f32> {
    response
        .headers()
        .get(CONFIDENCE_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<f32>().ok())
}

fn decision_headers<B>(
    reply: &mut spin_sdk::http::Response<B>,
    target: &str,
    reason: &str,
    timing: &Timing,
) {
    let headers = reply.headers_mut();
    headers.insert(TARGET_HEADER, reply::header_value(target));
    headers.insert(REASON_HEADER, reply::header_value(reason));
    headers.insert(timing::HEADER, reply::header_value(&timing.header()));
}

fn refuse(status: StatusCode, kind: &str, message: &str) -> Answer {
    reply::error(status, kind, message).into_response()
}

/// The body, or None as soon as it passes `limit` bytes: an oversized
/// body is refused without being held whole in the instance's memory.
async fn read_bounded<B>(mut body: B, limit: usize) -> Result<Option<bytes::Bytes>, B::Error>
where
    B: http_body::Body<Data = bytes::Bytes> + Unpin,
{
    use http_body_util::BodyExt;
    let mut bytes = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            if bytes.len() + data.len() > limit {
                return Ok(None);
            }
            bytes.extend_from_slice(&data);
        }
    }
    Ok(Some(bytes.freeze()))
}

/// Unique enough to find a request in the node's and upstream's logs.
fn request_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("gw-{nanos:x}")
}
