//! Errors as OpenAI-style JSON, so SDKs surface our message verbatim.

use super::openai::error_body;
use crate::router::{Failure, Invalid, InvalidKind, Route};
use crate::targets::TargetFailure;
use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub code: &'static str,
    pub message: String,
    pub param: Option<&'static str>,
    /// Where the request was headed and why, when a decision was made.
    /// Boxed: errors travel in every `Result` of the request path.
    pub route: Option<Box<Route>>,
}

impl ApiError {
    pub fn new(
        status: StatusCode,
        kind: &'static str,
        code: &'static str,
        message: impl Into<String>,
    ) -> Self {
        Self {
            status,
            kind,
            code,
            message: message.into(),
            param: None,
            route: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "invalid_request",
            message,
        )
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "internal_error",
            message,
        )
    }

    pub fn param(mut self, param: &'static str) -> Self {
        self.param = Some(param);
        self
    }

    pub fn routed(mut self, route: Route) -> Self {
        self.route = Some(Box::new(route));
        self
    }
}

/// The one place where the pipeline's failures become HTTP statuses and
/// OpenAI error types.
impl From<Failure> for ApiError {
    fn from(failure: Failure) -> Self {
        use edgeroute_core::Refusal;
        match failure {
            Failure::Invalid(invalid) => invalid.into(),
            Failure::Internal(message) => ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                "internal_error",
                message,
            ),
            Failure::Refused { refused, route } => {
                let (status, kind) = match refused.cause {
                    Refusal::PolicyRejected { .. } => (StatusCode::FORBIDDEN, "permission_error"),
                    Refusal::PromptTooLong { .. } | Refusal::Unsupported { .. } => {
                        (StatusCode::BAD_REQUEST, "invalid_request_error")
                    }
                    Refusal::PolicyFailed { .. }
                    | Refusal::LocalUnavailable { .. }
                    | Refusal::LocalBusy { .. }
                    | Refusal::NoTarget { .. } => (StatusCode::SERVICE_UNAVAILABLE, "server_error"),
                };
                ApiError::new(
                    status,
                    kind,
                    refused.cause.code(),
                    refused.cause.to_string(),
                )
                .routed(route)
            }
            Failure::Target { failure, route } => {
                let (status, code) = match &failure {
                    TargetFailure::Busy(_) => (StatusCode::SERVICE_UNAVAILABLE, "local_busy"),
                    TargetFailure::Unavailable(_) => {
                        (StatusCode::SERVICE_UNAVAILABLE, "target_unavailable")
                    }
                    TargetFailure::BadRequest(_) => (StatusCode::BAD_REQUEST, "invalid_request"),
                    TargetFailure::Upstream(_) => (StatusCode::BAD_GATEWAY, "upstream_error"),
                    TargetFailure::RateLimited { .. } => {
                        (StatusCode::TOO_MANY_REQUESTS, "rate_limit_exceeded")
                    }
                    TargetFailure::Timeout(_) => (StatusCode::GATEWAY_TIMEOUT, "upstream_timeout"),
                    TargetFailure::Internal(_) => {
                        (StatusCode::INTERNAL_SERVER_ERROR, "target_failed")
                    }
                    TargetFailure::Unreachable(_) => {
                        (StatusCode::SERVICE_UNAVAILABLE, "target_unreachable")
                    }
                };
                let kind = match status {
                    StatusCode::BAD_REQUEST => "invalid_request_error",
                    // As OpenAI types a rate limit (and the node's own).
                    StatusCode::TOO_MANY_REQUESTS => "requests",
                    _ => "server_error",
                };
                let served_by = route
                    .target
                    .as_ref()
                    .map_or_else(|| "none".to_string(), ToString::to_string);
                ApiError::new(status, kind, code, format!("{served_by}: {failure}")).routed(route)
            }
            Failure::Declined {
                confidence,
                min_confidence,
                route,
            } => ApiError::new(
                StatusCode::CONFLICT,
                "invalid_request_error",
                "low_confidence",
                format!(
                    "the local answer's confidence {confidence:.2} is below the {min_confidence:.2} asked for (x-edgeroute-judge): declined, nothing was sent"
                ),
            )
            .routed(route),
        }
    }
}

impl From<Invalid> for ApiError {
    fn from(invalid: Invalid) -> Self {
        let error = match invalid.kind {
            InvalidKind::Request => ApiError::bad_request(invalid.message),
            InvalidKind::UnknownModel => ApiError::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "model_not_found",
                invalid.message,
            ),
        };
        match invalid.param {
            Some(param) => error.param(param),
            None => error,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = error_body(&self.message, self.kind, self.code);
        if let Some(param) = self.param {
            body["error"]["param"] = param.into();
        }
        let mut response = (self.status, Json(body)).into_response();
        if let Some(route) = self.route {
            super::set_route_headers(response.headers_mut(), &route);
        }
        response
    }
}
