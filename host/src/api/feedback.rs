//! `POST /v1/feedback`: a client's score (0 to 1) of an answer it got,
//! by the response's `id`. The policy version that routed the request gets
//! it through `observe` (WIT 0.2's `outcome.feedback`), so a learning
//! policy learns from what users say as well as from what the node saw.
//!
//! ```json
//! {"id": "chatcmpl-…", "score": 0.8}
//! ```
//!
//! An unknown (or long forgotten) id is a 404; a score outside 0 to 1 is a
//! 400. A 0.1 policy has no feedback field: the score is kept, not sent.

use super::error::ApiError;
use crate::node::Node;
use crate::router::request;
use crate::tenants::Tenant;
use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Feedback {
    id: String,
    score: f64,
}

pub async fn post(
    State(node): State<Arc<Node>>,
    Extension(tenant): Extension<Arc<Tenant>>,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    // The node's own body limit and read timeout, as every endpoint.
    let body = super::read_body(&node, body, node.config.limits.max_body_bytes).await?;
    let feedback: Feedback = request::strict_json(&body)
        .map_err(|invalid| invalid.message)
        .and_then(|value| serde_json::from_value(value).map_err(|e| e.to_string()))
        .map_err(|e| {
            ApiError::bad_request(format!(
                "feedback must be {{\"id\": \"<response id>\", \"score\": 0..1}}: {e}"
            ))
        })?;
    if !(0.0..=1.0).contains(&feedback.score) {
        return Err(ApiError::bad_request(format!(
            "score must be from 0 to 1, got {}",
            feedback.score
        ))
        .param("score"));
    }
    let score = feedback.score as f32;
    let Some((version, outcome)) = node.recent.with_feedback(&feedback.id, score, &tenant.name)
    else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "request_not_found",
            format!(
                "no request '{}' on this node (feedback is taken for its last {} requests)",
                feedback.id,
                crate::feedback::REMEMBERED
            ),
        )
        .param("id"));
    };
    // The version that routed it, or the live one if it was swapped out
    // since (it carries the learned state).
    let version = version.unwrap_or_else(|| node.policy.current());
    if let Some(log) = &node.decisions {
        log.write(&crate::decisions::Line::Feedback {
            id: feedback.id.clone(),
            feedback: score,
        });
    }
    let delivered = version.world != "0.1";
    if delivered {
        node.policy.observe(&version, &outcome).await;
    }
    Ok(Json(json!({
        "object": "feedback",
        "id": feedback.id,
        "score": feedback.score,
        "policy": version.id,
        "delivered_to_policy": delivered,
    })))
}
