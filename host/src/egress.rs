//! The egress guard, inside the host's `wasi:http`: every request a
//! component sends passes through `send_request`, so the check cannot be
//! bypassed by a component, whatever it was told by a policy.
//!
//! The same hooks keep the upstream's key in the host: a guest may not set
//! credential headers (`is_forbidden_header`), and `send_request` adds the
//! key to the requests that go to the upstream it belongs to, after the
//! guard has let them out. No guest ever holds the key, so none can leak it.

use crate::audit::{self, AuditLog, Event, Record};
use crate::per_thread::ClientPerThread;
use crate::targets::Taint;
use http::header::{self, HeaderName, HeaderValue};
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use wasmtime_wasi_http::{
    DEFAULT_FORBIDDEN_HEADERS, Error as HttpError, ForbiddenHeaderFilter, RequestOptions, WasiBody,
    WasiHttpHooks,
};

/// Counts of what the guard let out and refused (`/metrics`), and the
/// audit log where each refusal and each call that went out is written.
#[derive(Default)]
pub struct EgressAudit {
    pub allowed: AtomicU64,
    pub refused_sensitive: AtomicU64,
    pub refused_host: AtomicU64,
    pub log: Option<AuditLog>,
}

impl EgressAudit {
    pub fn with_log(log: Option<AuditLog>) -> Self {
        Self {
            log,
            ..Self::default()
        }
    }

    /// A record about `taint`'s request headed for `target`.
    pub fn record(&self, event: Event, taint: &Taint, target: &str) -> Record {
        Record {
            at_ms: audit::now_ms(),
            event,
            request_id: taint.request_id.clone(),
            target: target.to_string(),
            host: None,
            policy: taint.policy.clone(),
            reason: taint.reason.clone(),
            sensitivity: taint.sensitivity.to_string(),
            refused_by: None,
            prompt_tokens: taint.prompt_tokens,
            completion_tokens: 0,
            bytes_sent: 0,
            ok: false,
            via: None,
        }
    }

    pub fn write(&self, record: Record) {
        if let Some(log) = &self.log {
            log.write(record);
        }
    }
}

/// What one cloud call sent, counted by its hooks: whether anything went
/// out, where, and how many body bytes.
#[derive(Default)]
pub struct CallMeter {
    pub sends: AtomicU64,
    pub bytes: Arc<AtomicU64>,
    pub host: std::sync::Mutex<Option<String>>,
}

/// The hooks of one cloud call: the hosts that may be reached, the client
/// request behind the call (may it leave the node at all?), and the key of
/// the upstream chosen for the call.
pub struct EgressHooks {
    pub allowed_hosts: Arc<HashSet<String>>,
    pub taint: Taint,
    /// `cloud:NAME`, for the audit.
    pub target: String,
    pub audit: Arc<EgressAudit>,
    pub call: Arc<CallMeter>,
    /// This hop's meter (each hop of a request has its own), where the
    /// wait on the upstream is reported.
    pub meter: crate::nn::Meter,
    /// Added only to requests for this upstream's origin: another allowed
    /// host (a second upstream) must not receive this one's key.
    pub credential: Option<Credential>,
    /// The node's pools of upstream connections, one per thread.
    pub clients: Arc<ClientPerThread>,
}

/// The node's client for upstream calls (one per thread:
/// [`ClientPerThread`]). Connections are kept and
/// reused (HTTP/1.1 keep-alive; HTTP/2 when the server offers it by ALPN),
/// where wasmtime's default sender opens a new TCP and TLS connection per
/// request. No redirects and no proxy from the environment: the guard
/// checked this request's host, and only that host may receive it.
pub fn upstream_client() -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .tcp_nodelay(true)
        .pool_idle_timeout(std::time::Duration::from_secs(90))
        .build()
}

/// The most body a guest's request may carry out of the node: a cloud
/// call's body is a client request (`[limits] max_body_bytes`) in the
/// upstream's format, far below this.
const MAX_SENT_BODY: usize = 64 << 20;

/// Send a request the guard let out through this thread's pool, with the
/// guest's connect and first-byte timeouts.
async fn send_pooled(
    client: reqwest::Client,
    request: http::Request<WasiBody>,
    options: Option<RequestOptions>,
) -> Result<http::Response<WasiBody>, HttpError> {
    use http_body_util::{BodyExt, Limited, StreamBody};
    use tokio_stream::StreamExt;
    let (parts, body) = request.into_parts();
    // The whole body first, then one request: the guest writes it right
    // after handing the request over, and a body in hand goes out with the
    // head in one write (a streamed one took a write per chunk, and the
    // upstream a wake-up for each).
    let body = match Limited::new(body, MAX_SENT_BODY).collect().await {
        Ok(body) => body.to_bytes(),
        Err(error) => {
            return Err(match error.downcast::<HttpError>() {
                Ok(error) => *error,
                Err(_) => HttpError::HttpRequestBodySize(Some(MAX_SENT_BODY as u64)),
            });
        }
    };
    let request = client
        .request(parts.method, parts.uri.to_string())
        .headers(parts.headers)
        .body(body);
    // The connect timeout bounds the wait for the head too when the guest
    // gave no first-byte timeout: a pooled connection skips the connect.
    let wait = options
        .and_then(|o| o.first_byte_timeout.or(o.connect_timeout))
        .unwrap_or(std::time::Duration::from_secs(600));
    let response = match tokio::time::timeout(wait, request.send()).await {
        Ok(response) => response.map_err(http_error)?,
        Err(_) => return Err(HttpError::ConnectionTimeout),
    };
    let mut head = http::Response::builder()
        .status(response.status())
        .version(response.version());
    if let Some(headers) = head.headers_mut() {
        *headers = response.headers().clone();
    }
    let frames = response
        .bytes_stream()
        .map(|chunk| chunk.map(hyper::body::Frame::data).map_err(http_error));
    head.body(StreamBody::new(frames).boxed_unsync())
        .map_err(|e| HttpError::InternalError(Some(e.to_string())))
}

fn http_error(error: reqwest::Error) -> HttpError {
    if error.is_timeout() {
        HttpError::ConnectionTimeout
    } else if error.is_connect() {
        HttpError::ConnectionRefused
    } else {
        HttpError::InternalError(Some(error.to_string()))
    }
}

/// An upstream's API key as the `Authorization` header the host adds for
/// it. The value is marked sensitive, so `http` prints it as `Sensitive`
/// in any `Debug` output and HTTP/2 encoders never index it.
#[derive(Clone)]
pub struct Credential {
    scheme: http::uri::Scheme,
    /// `host:port`, as `upstream_authority` gives it.
    authority: String,
    authorization: HeaderValue,
    /// Kept to take it out of what an upstream echoes back (`redact`).
    key: String,
}

impl Credential {
    /// `Authorization: Bearer KEY` for the upstream at `base_url`.
    pub fn bearer(base_url: &str, key: &str) -> anyhow::Result<Self> {
        let uri = parse_upstream(base_url)?;
        let scheme = uri
            .scheme()
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("upstream URL '{base_url}' has no scheme"))?;
        let authority = host_port(&uri)
            .ok_or_else(|| anyhow::anyhow!("upstream URL '{base_url}' has no host"))?;
        // The error quotes neither the key nor the header built from it.
        let mut authorization = HeaderValue::from_str(&format!("Bearer {key}"))
            .map_err(|_| anyhow::anyhow!("the API key is not a valid HTTP header value"))?;
        authorization.set_sensitive(true);
        Ok(Self {
            scheme,
            authority,
            authorization,
            key: key.to_string(),
        })
    }

    /// `text` without the key. An upstream may echo the request back in an
    /// error body; only the host, which alone holds the key, can take the
    /// key out before the body reaches a client.
    pub fn redact(&self, text: &str) -> String {
        if self.key.is_empty() {
            text.to_string()
        } else {
            text.replace(&self.key, "[redacted]")
        }
    }

    /// Whether a request to `uri` goes to this credential's upstream: same
    /// scheme (the key never goes out in clear text to an `https` upstream's
    /// host) and same `host:port`.
    fn is_for(&self, uri: &http::Uri) -> bool {
        uri.scheme() == Some(&self.scheme)
            && host_port(uri).is_some_and(|authority| authority == self.authority)
    }
}

/// Names the upstream, never the key.
impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("scheme", &self.scheme)
            .field("authority", &self.authority)
            .finish_non_exhaustive()
    }
}

/// Headers a guest may not set: credentials are the host's to add, and
/// `wasmtime-wasi-http`'s defaults keep the hop-by-hop headers its client
/// manages. `proxy-authorization` is among the defaults; it is named here
/// too so that a change of defaults cannot let it through.
fn guest_may_not_set(name: &HeaderName) -> bool {
    *name == header::AUTHORIZATION
        || *name == header::PROXY_AUTHORIZATION
        || DEFAULT_FORBIDDEN_HEADERS.contains(name)
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
    /// Called by `wasi:http` for every header a guest sets (`fields`), so a
    /// guest that sets `Authorization` gets `header-error.forbidden`.
    fn is_forbidden_header(&mut self, name: &HeaderName) -> bool {
        guest_may_not_set(name)
    }

    /// The same rule for the code paths that check headers away from the
    /// store; the default would only apply wasmtime's own list.
    fn forbidden_header_filter(&mut self) -> ForbiddenHeaderFilter {
        Arc::new(guest_may_not_set)
    }

    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _response_errors: Box<dyn Future<Output = Result<(), HttpError>> + Send>,
    ) -> SendFuture {
        let authority = host_port(request.uri()).unwrap_or_default();
        let refusal = if !self.taint.may_leave {
            self.audit.refused_sensitive.fetch_add(1, Ordering::Relaxed);
            Some("the request's sensitivity may not leave the node")
        } else if !self.allowed_hosts.contains(&authority) {
            self.audit.refused_host.fetch_add(1, Ordering::Relaxed);
            Some("host is not a configured upstream")
        } else {
            None
        };
        if let Some(why) = refusal {
            tracing::warn!(request_id = %self.taint.request_id, %authority, "egress refused: {why}");
            let mut record = self.audit.record(Event::Refused, &self.taint, &self.target);
            record.host = Some(authority);
            record.refused_by = Some("egress");
            self.audit.write(record);
            return Box::new(async { Err(HttpError::HttpRequestDenied) });
        }
        self.audit.allowed.fetch_add(1, Ordering::Relaxed);
        self.call.sends.fetch_add(1, Ordering::Relaxed);
        *self.call.host.lock().unwrap_or_else(|p| p.into_inner()) = Some(authority);
        // Count the body as it is sent, for the audit's `bytes_sent`.
        let bytes = self.call.bytes.clone();
        let request = request.map(|body| {
            use http_body_util::BodyExt;
            body.map_frame(move |frame| {
                if let Some(data) = frame.data_ref() {
                    bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
                }
                frame
            })
            .boxed_unsync()
        });
        let mut request = request;
        // Only now, past the guard: a refused request never carried the key.
        if let Some(credential) = &self.credential
            && credential.is_for(request.uri())
        {
            request
                .headers_mut()
                .insert(header::AUTHORIZATION, credential.authorization.clone());
        }
        let client = match self.clients.here() {
            Ok(client) => client,
            Err(error) => {
                let why = format!("no upstream client: {error:#}");
                return Box::new(async move { Err(HttpError::InternalError(Some(why))) });
            }
        };
        let meter = self.meter.clone();
        Box::new(async move {
            let asked = std::time::Instant::now();
            let response = send_pooled(client, request, options).await?;
            // Until the answer's first bytes: a streaming upstream sends its
            // head before it has read the prompt, its first token after.
            let response = response.map(|body| {
                use http_body_util::BodyExt;
                // Only the first data frame is timed: a stream's later
                // chunks take no lock.
                let mut timed = false;
                body.map_frame(move |frame| {
                    if !timed && frame.is_data() {
                        timed = true;
                        let mut measured = meter.lock().unwrap_or_else(|p| p.into_inner());
                        measured.upstream_wait = Some(asked.elapsed());
                    }
                    frame
                })
                .boxed_unsync()
            });
            // The pool drives its connections; nothing to run per request.
            let io = async { Ok(()) };
            Ok((response, Box::new(io) as Box<dyn Future<Output = _> + Send>))
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

fn parse_upstream(base_url: &str) -> anyhow::Result<http::Uri> {
    base_url
        .parse()
        .map_err(|e| anyhow::anyhow!("invalid upstream URL '{base_url}': {e}"))
}

/// The `host:port` the guard lets a configured upstream's base URL reach.
pub fn upstream_authority(base_url: &str) -> anyhow::Result<String> {
    let uri = parse_upstream(base_url)?;
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

    fn clients() -> Arc<ClientPerThread> {
        Arc::new(ClientPerThread::new(upstream_client).unwrap())
    }

    fn hooks(may_leave: bool) -> EgressHooks {
        EgressHooks {
            allowed_hosts: Arc::new(HashSet::from(["127.0.0.1:9".to_string()])),
            taint: taint(may_leave),
            target: "cloud:test".into(),
            audit: Arc::default(),
            call: Arc::default(),
            meter: Default::default(),
            credential: None,
            clients: clients(),
        }
    }

    fn taint(may_leave: bool) -> Taint {
        Taint {
            request_id: "t".into(),
            may_leave,
            ..Taint::default()
        }
    }

    const KEY: &str = "test-key";

    /// Hooks that may reach `allowed`, with the key of `upstream`.
    fn hooks_with_key(allowed: &[&str], upstream: &str) -> EgressHooks {
        EgressHooks {
            allowed_hosts: Arc::new(allowed.iter().map(|a| a.to_string()).collect()),
            taint: taint(true),
            target: "cloud:test".into(),
            audit: Arc::default(),
            call: Arc::default(),
            meter: Default::default(),
            credential: Some(Credential::bearer(&format!("http://{upstream}/v1"), KEY).unwrap()),
            clients: clients(),
        }
    }

    /// A one-request HTTP server on loopback: its `host:port`, and the head
    /// of the request it received (request line and headers, as sent).
    async fn recording_server() -> (String, tokio::task::JoinHandle<String>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let authority = listener.local_addr().unwrap().to_string();
        let received = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut buf = [0u8; 4096];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = socket.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                head.extend_from_slice(&buf[..n]);
            }
            socket
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                .await
                .unwrap();
            String::from_utf8_lossy(&head).into_owned()
        });
        (authority, received)
    }

    /// The value of header `name` in a raw request head; names compare
    /// case-insensitively, as HTTP/1.1 has them.
    fn header_value<'a>(head: &'a str, name: &str) -> Option<&'a str> {
        head.lines().skip(1).find_map(|line| {
            let (field, value) = line.split_once(':')?;
            field.eq_ignore_ascii_case(name).then_some(value.trim())
        })
    }

    async fn send(hooks: &mut EgressHooks, url: &str) -> Result<(), HttpError> {
        let fut = hooks.send_request(request(url), None, Box::new(async { Ok(()) }));
        Box::into_pin(fut).await.map(|_| ())
    }

    /// The body is gathered before the request goes (one write with the
    /// head), up to a cap: a guest that streams more is refused before
    /// anything is sent (port 9 would refuse a connection; the error says
    /// the body, not the connection).
    #[tokio::test]
    async fn a_body_over_the_cap_is_refused_before_sending() {
        let mut hooks = hooks(true);
        let chunk = Bytes::from(vec![b'a'; 1 << 20]);
        let chunks = (0..=MAX_SENT_BODY >> 20)
            .map(move |_| Ok::<_, HttpError>(hyper::body::Frame::data(chunk.clone())));
        let body = http_body_util::StreamBody::new(tokio_stream::iter(chunks)).boxed_unsync();
        let request = http::Request::post("http://127.0.0.1:9/v1/chat/completions")
            .body(body)
            .unwrap();
        let fut = hooks.send_request(request, None, Box::new(async { Ok(()) }));
        let result = Box::into_pin(fut).await.map(|_| ());
        assert!(
            matches!(result, Err(HttpError::HttpRequestBodySize(Some(n))) if n == MAX_SENT_BODY as u64),
            "{result:?}"
        );
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
    fn a_guest_may_not_set_credentials() {
        let mut hooks = hooks(true);
        for name in [
            "Authorization",
            "authorization",
            "AUTHORIZATION",
            "Proxy-Authorization",
        ] {
            let name: HeaderName = name.parse().unwrap();
            assert!(hooks.is_forbidden_header(&name), "{name}");
            assert!((hooks.forbidden_header_filter())(&name), "{name}");
        }
        // wasmtime's defaults still hold; ordinary headers pass.
        assert!(hooks.is_forbidden_header(&header::CONNECTION));
        assert!(hooks.is_forbidden_header(&header::HOST));
        assert!(!hooks.is_forbidden_header(&header::CONTENT_TYPE));
        // What `fields.from-list` / `fields.append` do with a guest's header.
        let refused = wasmtime_wasi_http::FieldMap::new_mutable(64 * 1024).append(
            &mut hooks,
            "Authorization".into(),
            b"Bearer guest-key".to_vec(),
        );
        assert_eq!(refused, Err(wasmtime_wasi_http::FieldMapError::Forbidden));
    }

    #[tokio::test]
    async fn the_upstream_receives_its_key_from_the_host() {
        let (upstream, received) = recording_server().await;
        let mut hooks = hooks_with_key(&[&upstream], &upstream);
        let url = format!("http://{upstream}/v1/chat/completions");
        let result = send(&mut hooks, &url).await;
        assert!(result.is_ok(), "{result:?}");
        let head = received.await.unwrap();
        assert_eq!(
            header_value(&head, "authorization"),
            Some("Bearer test-key"),
            "{head}"
        );
    }

    #[tokio::test]
    async fn another_allowed_host_does_not_receive_the_key() {
        let (upstream, _never_called) = recording_server().await;
        let (other, received) = recording_server().await;
        let mut hooks = hooks_with_key(&[&upstream, &other], &upstream);
        let url = format!("http://{other}/v1/chat/completions");
        let result = send(&mut hooks, &url).await;
        assert!(result.is_ok(), "{result:?}");
        let head = received.await.unwrap();
        assert_eq!(header_value(&head, "authorization"), None, "{head}");
    }

    #[test]
    fn a_credential_is_for_its_own_scheme_and_authority_only() {
        let credential = Credential::bearer("http://LOCALHOST:8000/v1", "test-key").unwrap();
        let is_for = |url: &str| credential.is_for(&url.parse().unwrap());
        assert!(is_for("http://localhost:8000/v1/chat/completions"));
        assert!(!is_for("https://localhost:8000/v1/chat/completions"));
        assert!(!is_for("http://localhost:8001/v1/chat/completions"));
        assert!(!is_for("http://127.0.0.1:8000/v1/chat/completions"));
        assert!(!format!("{credential:?}").contains("test-key"));
        assert_eq!(
            credential.redact("echo: Bearer test-key, test-key"),
            "echo: Bearer [redacted], [redacted]"
        );
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
