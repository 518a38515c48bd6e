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

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Bytes;
    use http_body_util::{BodyExt, Empty};

    fn request(url: &str) -> http::Request<WasiBody> {
        let body = Empty::<Bytes>::new()
            .map_err(|never| match never {})
            .boxed_unsync();
        http::Request::post(url).body(body).unwrap()
    }

    fn hooks(may_leave: bool) -> EgressHooks {
        EgressHooks {
            allowed_hosts: Arc::new(HashSet::from(["127.0.0.1:9".to_string()])),
            may_leave,
            request_id: "t".into(),
            audit: Arc::default(),
        }
    }

    async fn send(hooks: &mut EgressHooks, url: &str) -> Result<(), HttpError> {
        let fut = hooks.send_request(request(url), None, Box::new(async { Ok(()) }));
        Box::into_pin(fut).await.map(|_| ())
    }

    #[tokio::test]
    async fn a_request_that_may_not_leave_is_refused_even_to_an_allowed_host() {
        let mut hooks = hooks(false);
        let result = send(&mut hooks, "http://127.0.0.1:9/v1/chat/completions").await;
        assert!(
            matches!(result, Err(HttpError::HttpRequestDenied)),
            "{result:?}"
        );
        assert_eq!(hooks.audit.refused_sensitive.load(Ordering::Relaxed), 1);
        assert_eq!(hooks.audit.allowed.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn only_configured_upstream_hosts_are_reachable() {
        let mut hooks = hooks(true);
        for url in [
            "http://127.0.0.2:9/v1",
            "http://127.0.0.1:10/v1",
            "https://example.invalid/v1",
        ] {
            let result = send(&mut hooks, url).await;
            assert!(
                matches!(result, Err(HttpError::HttpRequestDenied)),
                "{url}: {result:?}"
            );
        }
        assert_eq!(hooks.audit.refused_host.load(Ordering::Relaxed), 3);
        // The allowed host gets through the guard (port 9 refuses the
        // connection: the error comes from connecting, not from the guard).
        let result = send(&mut hooks, "http://127.0.0.1:9/v1").await;
        assert!(
            !matches!(result, Err(HttpError::HttpRequestDenied)),
            "{result:?}"
        );
        assert_eq!(hooks.audit.allowed.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn default_ports_compare_equal() {
        assert_eq!(
            upstream_authority("https://API.example.com/v1").unwrap(),
            "api.example.com:443"
        );
        assert_eq!(
            upstream_authority("http://127.0.0.1/v1").unwrap(),
            "127.0.0.1:80"
        );
        assert_eq!(
            upstream_authority("http://127.0.0.1:8000/v1").unwrap(),
            "127.0.0.1:8000"
        );
    }
}
