//! A simulated cloud for the agent-chain benchmark: an OpenAI-compatible
//! server on loopback whose answers take a network round trip, a server
//! time to first token and a decode speed, all stated on the command line,
//! so the chain can be compared with a cloud of known speed.

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::serve::ListenerExt;
use serde_json::{Value, json};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_stream::wrappers::ReceiverStream;

#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Added once per call: the request's way there and the answer's back.
    pub round_trip: Duration,
    /// The server's own time to its first token.
    pub server_ttft: Duration,
    pub tokens_per_s: f64,
}

/// A simulated upstream while it runs.
pub struct Simulated {
    /// `http://127.0.0.1:PORT/v1`
    pub base_url: String,
    /// TCP connections accepted so far.
    pub connections: Arc<AtomicUsize>,
    /// Every chat request's body, in arrival order: what left the nodes.
    pub received: Arc<Mutex<Vec<Bytes>>>,
}

#[derive(Clone)]
struct Upstream {
    timing: Timing,
    received: Arc<Mutex<Vec<Bytes>>>,
}

/// Serve on a free loopback port.
pub async fn start(timing: Timing) -> anyhow::Result<Simulated> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr: SocketAddr = listener.local_addr()?;
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    let listener = listener.tap_io(move |tcp| {
        counted.fetch_add(1, Ordering::Relaxed);
        // As a real server's would: the first SSE chunk must not wait
        // for Nagle and the client's delayed ACK.
        let _ = tcp.set_nodelay(true);
    });
    let received = Arc::new(Mutex::new(Vec::new()));
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .with_state(Upstream {
            timing,
            received: received.clone(),
        });
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(Simulated {
        base_url: format!("http://{addr}/v1"),
        connections,
        received,
    })
}

/// [`start`], served by a single-threaded runtime on a thread of its own
/// (which lives as long as the process): an upstream is another machine,
/// so it should not share the benchmark client's runtime threads, whose
/// wake-ups on a small machine take CPU from the node at random moments.
pub async fn start_on_own_thread(timing: Timing) -> anyhow::Result<Simulated> {
    let (started, simulated) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("bench-upstream".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(error) => {
                    let _ = started.send(Err(error.into()));
                    return;
                }
            };
            runtime.block_on(async move {
                let simulated = start(timing).await;
                let serving = simulated.is_ok();
                let _ = started.send(simulated);
                if serving {
                    std::future::pending::<()>().await
                }
            })
        })?;
    simulated.await?
}

async fn chat(State(upstream): State<Upstream>, body: Bytes) -> Response {
    let timing = upstream.timing;
    upstream
        .received
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(body.clone());
    let request: Value = serde_json::from_slice(&body).unwrap_or_default();
    let tokens = request["max_tokens"].as_u64().unwrap_or(16).clamp(1, 4096) as usize;
    let stream = request["stream"].as_bool().unwrap_or(false);
    let per_token = Duration::from_secs_f64(1.0 / timing.tokens_per_s.max(1e-3));
    // The first byte reaches the client after a whole round trip (the
    // request's half and the answer's half) plus the server's first token.
    pause(timing.round_trip + timing.server_ttft).await;
    if !stream {
        pause(per_token * tokens.saturating_sub(1) as u32).await;
        let text = vec!["word"; tokens].join(" ");
        return axum::Json(json!({
            "id": "sim", "object": "chat.completion", "created": 0, "model": "sim",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 0, "completion_tokens": tokens, "total_tokens": tokens},
        }))
        .into_response();
    }
    let chunks = sse(tokens, per_token);
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(chunks))
        .unwrap_or_else(|_| Response::default())
}

/// Sleep, unless there is nothing to wait for: a zero sleep still waits
/// for the timer's next millisecond tick.
async fn pause(duration: Duration) {
    if !duration.is_zero() {
        tokio::time::sleep(duration).await;
    }
}

/// One SSE chunk per token at the decode speed, then usage and `[DONE]`.
fn sse(tokens: usize, per_token: Duration) -> ReceiverStream<Result<String, Infallible>> {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        let chunk = |delta: Value, finish: Value, usage: Value| {
            let mut event = json!({"id": "sim", "object": "chat.completion.chunk", "created": 0,
                "model": "sim", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
            if !usage.is_null() {
                event["usage"] = usage;
            }
            format!("data: {event}\n\n")
        };
        for i in 0..tokens {
            if i > 0 {
                pause(per_token).await;
            }
            let piece = if i == 0 { "word" } else { " word" };
            if tx
                .send(Ok(chunk(
                    json!({"content": piece}),
                    Value::Null,
                    Value::Null,
                )))
                .await
                .is_err()
            {
                return;
            }
        }
        let usage =
            json!({"prompt_tokens": 0, "completion_tokens": tokens, "total_tokens": tokens});
        let _ = tx.send(Ok(chunk(json!({}), json!("length"), usage))).await;
        let _ = tx.send(Ok("data: [DONE]\n\n".to_string())).await;
    });
    ReceiverStream::new(rx)
}
