//! `GET /dashboard`: a live view of the node, served from assets embedded
//! in the binary (no network at run time; uPlot is vendored and pinned, see
//! `host/assets/dashboard/README.md`). The page reads `/healthz` and
//! `/metrics`, `/ledger` (on a node with client keys only with the admin
//! token typed in) and, with that token, the admin endpoints, so it can be
//! replaced by any other client of those.

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use std::sync::Arc;

use super::error::ApiError;
use crate::node::Node;

/// (path under `/dashboard/`, content type, bytes).
const ASSETS: [(&str, &str, &[u8]); 4] = [
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../assets/dashboard/app.js"),
    ),
    (
        "app.css",
        "text/css; charset=utf-8",
        include_bytes!("../../assets/dashboard/app.css"),
    ),
    (
        "vendor/uplot.iife.min.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../assets/dashboard/vendor/uplot.iife.min.js"),
    ),
    (
        "vendor/uplot.min.css",
        "text/css; charset=utf-8",
        include_bytes!("../../assets/dashboard/vendor/uplot.min.css"),
    ),
];

const INDEX: &[u8] = include_bytes!("../../assets/dashboard/index.html");

pub fn routes() -> Router<Arc<Node>> {
    Router::new()
        .route("/dashboard", get(index))
        .route("/dashboard/", get(index))
        .route("/dashboard/{*file}", get(asset))
}

fn respond(content_type: &'static str, bytes: &'static [u8]) -> Response {
    let mut response = bytes.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    // The page and its assets change only with the binary.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    response
}

/// The page loads only its own files and talks only to this node; an
/// injected script or a style from elsewhere is refused by the browser.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

async fn index() -> Response {
    let mut response = respond("text/html; charset=utf-8", INDEX);
    response.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    response
}

async fn asset(Path(file): Path<String>) -> Response {
    match ASSETS.iter().find(|(name, ..)| *name == file) {
        Some((_, content_type, bytes)) => respond(content_type, bytes),
        None => ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "not_found",
            "no such dashboard file",
        )
        .into_response(),
    }
}
