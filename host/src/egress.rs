//! The egress guard, inside the host's `wasi:http`: every request a
//! component sends passes through `send_request`, so the check cannot be
//! bypassed by a component, whatever it was told by a policy.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

/// Counts of what the guard let out and refused, for `/metrics`-style views.
#[derive(Default)]
pub struct EgressAudit {
    pub allowed: AtomicU64,
    pub refused_sensitive: AtomicU64,
    pub refused_host: AtomicU64,
}

/// The hooks of one cloud call: the hosts that may be reached and whether
/// the client request that caused the call may leave the node at all.
pub struct EgressHooks {
    pub allowed_hosts: Arc<HashSet<String>>,
    pub may_leave: bool,
    pub request_id: String,
    pub audit: Arc<EgressAudit>,
}

type SendFuture = Box<
    dyn Future<
            Output = Result<
                (
                    http::Response<WasiBody>,
                    Box<dyn Future<Output = Result<(), HttpError>> + Send>,
                ),
                HttpError,
            >,
        > + Send,
>;

impl WasiHttpHooks for EgressHooks {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _response_errors: Box<dyn Future<Output = Result<(), HttpError>> + Send>,
    ) -> SendFuture {
        let authority = host_port(request.uri()).unwrap_or_default();
        if !self.may_leave {
            self.audit.refused_sensitive.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                request_id = %self.request_id,
                %authority,
                "egress refused: the request's sensitivity may not leave the node"
            );
            return Box::new(async { Err(HttpError::HttpRequestDenied) });
        }
        if !self.allowed_hosts.contains(&authority) {
            self.audit.refused_host.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                request_id = %self.request_id,
                %authority,
                "egress refused: host is not a configured upstream"
            );
            return Box::new(async { Err(HttpError::HttpRequestDenied) });
        }
        self.audit.allowed.fetch_add(1, Ordering::Relaxed);
        Box::new(async move {
            use http_body_util::BodyExt;
            let (response, io) = wasmtime_wasi_http::default_send_request(request, options).await?;
            Ok((
                response.map(BodyExt::boxed_unsync),
                Box::new(io) as Box<dyn Future<Output = _> + Send>,
            ))
        })
    }
}

/// `host:port` of a URI with the scheme's default port made explicit, so
/// `https://a.example` and `https://a.example:443` compare equal.
fn host_port(uri: &http::Uri) -> Option<String> {
    let host = uri.host()?;
    let port = uri.port_u16().unwrap_or(match uri.scheme_str() {
        Some("http") => 80,
        _ => 443,
    });
    Some(format!("{}:{port}", host.to_ascii_lowercase()))
}

/// The `host:port` the guard lets a configured upstream's base URL reach.
pub fn upstream_authority(base_url: &str) -> anyhow::Result<String> {
    let uri: http::Uri = base_url
        .parse()
        .map_err(|e| anyhow::anyhow!("invalid upstream URL '{base_url}': {e}"))?;
    host_port(&uri).ok_or_else(|| anyhow::anyhow!("upstream URL '{base_url}' has no host"))
}
