//! Client authentication for the API: the `Authorization` header names the
//! tenant (`crate::tenants`), whose rate limit is counted here. The tenant
//! travels to the handler as a request extension.

use super::error::ApiError;
use crate::fleet::{FORWARDED_BY_HEADER, TOKEN_HEADER};
use crate::node::Node;
use crate::tenants::{Tenant, Unauthorized};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// Let a request in when its key names a tenant under its rate limit, or
/// when it was forwarded by a node of this fleet (its token checked in
/// constant time; the origin already checked the client's key).
pub async fn require(State(node): State<Arc<Node>>, mut request: Request, next: Next) -> Response {
    if request.headers().contains_key(FORWARDED_BY_HEADER) {
        let presented = request
            .headers()
            .get(TOKEN_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        return match &node.fleet {
            Some(fleet) if fleet.authorize(presented) => {
                request.extensions_mut().insert(node.clients.open_tenant());
                next.run(request).await
            }
            _ => bad_fleet_token(),
        };
    }
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let tenant = match node.clients.identify(authorization) {
        Ok(tenant) => tenant,
        Err(why) => return unauthorized(why),
    };
    if let Err(wait) = tenant.admit() {
        return rate_limited(&tenant, wait);
    }
    request.extensions_mut().insert(tenant);
    next.run(request).await
}

/// A request claiming to come from a peer without this fleet's token.
pub fn bad_fleet_token() -> Response {
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "invalid_request_error",
        "invalid_fleet_token",
        "a forwarded request needs this fleet's token (x-edgeroute-fleet-token)",
    )
    .into_response()
}

fn unauthorized(why: Unauthorized) -> Response {
    let message = match why {
        Unauthorized::Missing => {
            "this node needs an API key: send `Authorization: Bearer KEY` (a key of a tenant in the node's config)"
        }
        Unauthorized::Wrong => "the API key is not one this node knows",
    };
    let mut response = ApiError::new(
        StatusCode::UNAUTHORIZED,
        "invalid_request_error",
        "invalid_api_key",
        message,
    )
    .into_response();
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

fn rate_limited(tenant: &Tenant, wait: std::time::Duration) -> Response {
    let seconds = wait.as_secs_f64().ceil().max(1.0) as u64;
    let mut response = ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "requests",
        "rate_limit_exceeded",
        format!(
            "tenant '{}' is over its rate limit; retry in {seconds} s",
            tenant.name
        ),
    )
    .into_response();
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    response
}
