//! Errors as OpenAI-style JSON, so SDKs surface our message verbatim.

use super::openai::error_body;
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
    pub route: Option<Box<(String, String)>>,
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

    pub fn param(mut self, param: &'static str) -> Self {
        self.param = Some(param);
        self
    }

    pub fn routed(mut self, target: impl Into<String>, reason: impl Into<String>) -> Self {
        self.route = Some(Box::new((target.into(), reason.into())));
        self
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
            let (target, reason) = *route;
            super::set_route_headers(response.headers_mut(), &target, &reason);
        }
        response
    }
}
