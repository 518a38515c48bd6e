//! Forwarding a request to a peer: the client's own body, over HTTP, to
//! the peer's `/v1/chat/completions`, with the fleet token, this node's
//! name (so the peer never forwards it again) and the request's level as
//! the sensitivity header (the peer's guard then judges it at least as
//! strictly). A stream is relayed as the peer sends it.
//!
//! A peer is another node of the same operator, reached by the host
//! directly, not through the cloud-fetch component (which is the only way
//! to a third party): it skips a component instance per call, which is
//! most of the proxy's added latency. The guard is asked again here, like
//! the wasi:http egress hook asks it for cloud calls, and every call is a
//! line in the egress audit log.

use super::{FORWARDED_BY_HEADER, Fleet, TOKEN_HEADER};
use crate::api::SENSITIVITY_HEADER;
use crate::audit::Event;
use crate::bindings::target::{Completion, Usage};
use crate::targets::{Backend, Delta, Generating, Job, Taint, TargetFailure, TargetResult};
use eventsource_stream::Eventsource;
use serde_json::{Value, json};
use std::time::Instant;
use tokio_stream::StreamExt;

impl Backend for Fleet {
    fn names(&self) -> Vec<String> {
        self.peers().keys().cloned().collect()
    }

    fn generate<'a>(&'a self, name: &'a str, job: Job, taint: Taint) -> Generating<'a> {
        Box::pin(self.forward(name, job, taint))
    }
}

impl Fleet {
    async fn forward(&self, name: &str, job: Job, taint: Taint) -> TargetResult {
        let target = format!("peer:{name}");
        let Some((_open, url, same_zone)) = self.open(name) else {
            return Err(TargetFailure::Unreachable(format!(
                "{target} is not a member of the fleet now"
            )));
        };
        // The egress check for peers: the request may leave the node, or
        // its level may stay in the zone and the peer is in it.
        if !(taint.may_leave || (taint.may_stay_in_zone && same_zone)) {
            let mut record = self.audit.record(Event::Refused, &taint, &target);
            record.refused_by = Some("egress");
            self.audit.write(record);
            return Err(TargetFailure::Unavailable(format!(
                "egress guard: {} data may not reach {target}",
                taint.sensitivity
            )));
        }
        let body = forwarded_body(&job)?;
        let bytes = body.len() as u64;
        let started = Instant::now();
        let client = self
            .client
            .here()
            .map_err(|e| TargetFailure::Internal(format!("no HTTP client for the fleet: {e}")))?;
        let sent = client
            .post(format!("{}/v1/chat/completions", url.trim_end_matches('/')))
            .header(TOKEN_HEADER, &self.token)
            .header(FORWARDED_BY_HEADER, &self.config.node)
            .header(SENSITIVITY_HEADER, taint.sensitivity)
            .header("content-type", "application/json")
            .timeout(self.timeout)
            .body(body)
            .send()
            .await;
        let response = match sent {
            Ok(response) => response,
            // Nothing reached the peer: another target may still serve it.
            Err(error) if error.is_connect() => {
                self.mark_down(name);
                return Err(TargetFailure::Unreachable(format!(
                    "{target} refused the connection"
                )));
            }
            Err(error) if error.is_timeout() => {
                self.audit_call(&taint, &target, &url, bytes, false);
                return Err(TargetFailure::Timeout(self.timeout.as_millis() as u64));
            }
            Err(error) => {
                self.audit_call(&taint, &target, &url, bytes, false);
                return Err(TargetFailure::Upstream(format!("{target}: {error}")));
            }
        };
        let result = match response.status() {
            status if status.is_success() => match job.stream {
                Some(_) => relay(&target, response, job).await,
                None => answer(&target, response, job).await,
            },
            status => Err(peer_error(&target, status, response).await),
        };
        self.audit_call(&taint, &target, &url, bytes, result.is_ok());
        if result.is_ok() {
            self.observe(name, started.elapsed().as_secs_f64() * 1e3);
        }
        result
    }

    fn audit_call(&self, taint: &Taint, target: &str, url: &str, bytes: u64, ok: bool) {
        let mut record = self.audit.record(Event::Egress, taint, target);
        record.host = reqwest::Url::parse(url).ok().and_then(|u| {
            let host = u.host_str()?.to_string();
            Some(match u.port_or_known_default() {
                Some(port) => format!("{host}:{port}"),
                None => host,
            })
        });
        record.bytes_sent = bytes;
        record.ok = ok;
        self.audit.write(record);
    }
}

/// The client's body as the origin received it, asking for usage in a
/// stream so the ledger counts the peer's tokens.
fn forwarded_body(job: &Job) -> Result<String, TargetFailure> {
    let mut body: Value = job
        .request
        .passthrough
        .as_deref()
        .and_then(|b| serde_json::from_str(b).ok())
        .ok_or_else(|| TargetFailure::Internal("no request body to forward".into()))?;
    body["stream"] = json!(job.stream.is_some());
    if job.stream.is_some() {
        body["stream_options"] = json!({ "include_usage": true });
    }
    Ok(body.to_string())
}

/// A peer's error in the OpenAI envelope, as a failure of this target.
async fn peer_error(
    target: &str,
    status: reqwest::StatusCode,
    response: reqwest::Response,
) -> TargetFailure {
    let body: Value = response.json().await.unwrap_or(Value::Null);
    let message = body["error"]["message"]
        .as_str()
        .unwrap_or("no error message")
        .to_string();
    let message = format!("{target} answered {}: {message}", status.as_u16());
    match status.as_u16() {
        400 => TargetFailure::BadRequest(message),
        429 => TargetFailure::RateLimited {
            message,
            retry_after_s: None,
        },
        _ => TargetFailure::Upstream(message),
    }
}

fn usage(value: &Value) -> Usage {
    let count = |k: &str| value[k].as_u64().unwrap_or(0) as u32;
    Usage {
        prompt_tokens: count("prompt_tokens"),
        completion_tokens: count("completion_tokens"),
    }
}

async fn answer(target: &str, response: reqwest::Response, job: Job) -> TargetResult {
    let waiting = job.waiting;
    let read = response.json::<Value>();
    let body = match waiting {
        // The client went away: stop reading (the peer sees the closed
        // connection and stops too).
        Some(mut gone) => tokio::select! {
            body = read => body,
            _ = &mut gone => return Err(TargetFailure::Internal("the client went away".into())),
        },
        None => read.await,
    }
    .map_err(|e| TargetFailure::Upstream(format!("{target}: unreadable answer: {e}")))?;
    let message = &body["choices"][0]["message"];
    Ok(Completion {
        text: message["content"].as_str().unwrap_or_default().to_string(),
        finish_reason: body["choices"][0]["finish_reason"]
            .as_str()
            .unwrap_or("stop")
            .to_string(),
        usage: usage(&body["usage"]),
        model: body["model"].as_str().unwrap_or_default().to_string(),
        // Tool calls go back as the peer (and its upstream) wrote them.
        message: message.get("tool_calls").map(|_| message.to_string()),
    })
}

/// Relay the peer's stream; a stream that ends before its last chunk is a
/// failure (the client gets an error event, not a truncated answer).
async fn relay(target: &str, response: reqwest::Response, job: Job) -> TargetResult {
    let tx = job.stream.expect("relay is called for streams");
    let mut events = response.bytes_stream().eventsource();
    let (mut text, mut finish, mut usage_seen, mut model) = (String::new(), None, None, None);
    let mut done = false;
    while let Some(event) = events.next().await {
        let event = event
            .map_err(|e| TargetFailure::Upstream(format!("{target}: the stream broke: {e}")))?;
        if event.data == "[DONE]" {
            done = true;
            break;
        }
        let chunk: Value = serde_json::from_str(&event.data)
            .map_err(|e| TargetFailure::Upstream(format!("{target}: bad chunk: {e}")))?;
        if let Some(error) = chunk.get("error") {
            let message = error["message"].as_str().unwrap_or("failed mid-stream");
            return Err(TargetFailure::Upstream(format!("{target}: {message}")));
        }
        model = model.or_else(|| chunk["model"].as_str().map(str::to_string));
        if chunk["usage"].is_object() {
            usage_seen = Some(usage(&chunk["usage"]));
        }
        let choice = &chunk["choices"][0];
        if let Some(reason) = choice["finish_reason"].as_str() {
            finish = Some(reason.to_string());
        }
        let delta = &choice["delta"];
        let piece = if delta.get("tool_calls").is_some() {
            Some(Delta::Raw(delta.clone()))
        } else {
            delta["content"]
                .as_str()
                .filter(|t| !t.is_empty())
                .map(|t| Delta::Text(t.to_string()))
        };
        if let Some(piece) = piece {
            text.push_str(piece.text());
            if tx.send(piece).is_err() {
                // The client went away: dropping the response closes the
                // connection, and the peer stops generating.
                finish = Some("cancelled".into());
                done = true;
                break;
            }
        }
    }
    if !done {
        return Err(TargetFailure::Upstream(format!(
            "{target}: the stream ended before the completion finished"
        )));
    }
    Ok(Completion {
        text,
        finish_reason: finish.unwrap_or_else(|| "stop".into()),
        usage: usage_seen.unwrap_or(Usage {
            prompt_tokens: 0,
            completion_tokens: 0,
        }),
        model: model.unwrap_or_default(),
        message: None,
    })
}
