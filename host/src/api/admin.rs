//! Admin endpoints: inspect, swap and roll back the routing policy, and run
//! a candidate in shadow. Bearer-token protected; off when no token is set.

use super::error::ApiError;
use super::read_body;
use crate::node::Node;
use crate::tenants::{bearer_token, same_secret};
use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::routing::{get, post};
use serde_json::{Value, json};
use std::sync::Arc;

pub fn routes() -> Router<Arc<Node>> {
    Router::new()
        .route("/admin/policy", get(show).put(swap))
        .route("/admin/policy/rollback", post(rollback))
        .route(
            "/admin/shadow",
            get(shadow_summary).put(shadow_start).delete(shadow_stop),
        )
}

pub(super) fn authorize(node: &Node, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(expected) = &node.admin_token else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "admin_disabled",
            format!(
                "admin endpoints are off: set {} to enable them",
                node.config.admin.token_env
            ),
        ));
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token);
    let matches = given.is_some_and(|g| same_secret(g, expected));
    if !matches {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "invalid_admin_token",
            "missing or wrong admin bearer token",
        ));
    }
    Ok(())
}

fn refused(error: anyhow::Error) -> ApiError {
    ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_request_error",
        "policy_refused",
        format!("{error:#}"),
    )
}

async fn show(State(node): State<Arc<Node>>, headers: HeaderMap) -> Result<Json<Value>, ApiError> {
    authorize(&node, &headers)?;
    Ok(Json(json!({
        "active": node.policy.current().describe(),
        "previous": node.policy.previous().iter().rev().map(|v| v.describe()).collect::<Vec<_>>(),
        "shadow": node.shadow.get().map(|s| s.version.describe()),
    })))
}

async fn component_bytes(node: &Node, body: Body) -> Result<Vec<u8>, ApiError> {
    let bytes = read_body(node, body, node.config.limits.max_component_bytes).await?;
    if bytes.is_empty() {
        return Err(ApiError::bad_request(
            "send the policy component's .wasm bytes as the body",
        ));
    }
    Ok(bytes.to_vec())
}

async fn swap(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    authorize(&node, &headers)?;
    let bytes = component_bytes(&node, body).await?;
    let version = node
        .policy
        .swap(bytes, "admin".into())
        .await
        .map_err(refused)?;
    Ok(Json(
        json!({ "swapped": true, "active": version.describe() }),
    ))
}

async fn rollback(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    authorize(&node, &headers)?;
    let version = node.policy.rollback().await.map_err(|e| {
        ApiError::new(
            StatusCode::CONFLICT,
            "invalid_request_error",
            "no_previous_policy",
            format!("{e:#}"),
        )
    })?;
    Ok(Json(
        json!({ "rolled_back": true, "active": version.describe() }),
    ))
}

async fn shadow_start(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    authorize(&node, &headers)?;
    let bytes = component_bytes(&node, body).await?;
    let version = node
        .policy
        .prepare(bytes, "admin:shadow".into())
        .await
        .map_err(refused)?;
    node.shadow.set(Some(version));
    Ok(Json(node.shadow.summary()))
}

async fn shadow_stop(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    authorize(&node, &headers)?;
    let summary = node.shadow.summary();
    node.shadow.set(None);
    Ok(Json(summary))
}

async fn shadow_summary(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    authorize(&node, &headers)?;
    Ok(Json(node.shadow.summary()))
}

#[cfg(test)]
mod tests {
    use super::bearer_token;

    #[test]
    fn bearer_scheme_is_case_insensitive_and_needs_a_token() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer abc"), Some("abc"));
        assert_eq!(bearer_token("BEARER  abc "), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("abc"), None);
    }
}
