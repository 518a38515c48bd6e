//! Support for edgeroute's end-to-end tests.
//!
//! - [`FakeCloud`]: a real OpenAI-compatible HTTP server on loopback that
//!   records every request it receives, so a test can prove what did and did
//!   not leave the node.
//! - [`Node`]: the real `edgeroute` binary, started with `edgeroute up` on a
//!   config written for the test (see [`NodeBuilder`]), killed on drop.
//! - [`Resp`]: an HTTP response that never turns a 4xx/5xx into a panic, with
//!   helpers for OpenAI-style JSON, SSE streams and the routing headers.
//!
//! Integration test files use it with `mod support;`.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fmt;
use std::future::IntoFuture;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::State;
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde_json::{Value, json};

/// The repository root (the host package lives in `<root>/host`).
pub const REPO_ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
/// The model `scripts/fetch-models.sh` installs (`./dev setup` runs it).
pub const SMOLLM2_MODEL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../models/SmolLM2-135M-Instruct.Q4_1.gguf"
);
/// Name of the local model in the test config.
pub const LOCAL_MODEL: &str = "smollm2";
/// Name of the cloud upstream in the test config.
pub const UPSTREAM: &str = "frontier";
/// The model the test config asks the upstream for.
pub const UPSTREAM_MODEL: &str = "frontier-large";
/// Environment variable the test config names for the upstream API key.
pub const API_KEY_ENV: &str = "EDGEROUTE_FRONTIER_KEY";
/// What [`FakeCloud`] answers; streamed as [`CLOUD_REPLY_PIECES`].
pub const CLOUD_REPLY: &str = "cloud says hi";
pub const CLOUD_REPLY_PIECES: [&str; 3] = ["cloud", " says", " hi"];
/// How long a node may take from spawn to its "listening" line (model load included).
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(120);
/// Upper bound for a single HTTP exchange with a node.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(300);
/// The line `edgeroute up` prints on stdout once it accepts requests.
pub const LISTENING_PREFIX: &str = "edgeroute listening on http://";

const MAX_READ: u64 = 64 * 1024 * 1024;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking test thread must not hide what was recorded.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A string unique to this process and call (for temp names and prompt
/// canaries). Letters only after `label`, so a canary never looks like a
/// phone number or an ID to the node's PII scan.
pub fn unique(label: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{label}-{}-{}-{}",
        letters(u64::from(std::process::id())),
        letters(COUNTER.fetch_add(1, Ordering::Relaxed)),
        letters(u64::from(nanos))
    )
}

/// `n` in base 26 with digits a..z.
fn letters(mut n: u64) -> String {
    let mut out = Vec::new();
    loop {
        out.push(b'a' + (n % 26) as u8);
        n /= 26;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).expect("ASCII")
}

// ---------------------------------------------------------------------------
// FakeCloud
// ---------------------------------------------------------------------------

/// One request as the fake cloud received it.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    /// Lower-case header names; repeated headers joined with ", ".
    pub headers: BTreeMap<String, String>,
    /// The body parsed as JSON (`Value::Null` when it is not JSON).
    pub body: Value,
    /// The body as text (lossy UTF-8).
    pub body_text: String,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
    }

    /// A chat completion request (`POST …/chat/completions`).
    pub fn is_chat(&self) -> bool {
        self.method == "POST" && self.path.ends_with("/chat/completions")
    }

    /// Whether `needle` appears anywhere in the body or the headers.
    pub fn mentions(&self, needle: &str) -> bool {
        self.body_text.contains(needle) || self.headers.values().any(|v| v.contains(needle))
    }
}

type Log = Arc<Mutex<Vec<Recorded>>>;

/// A real OpenAI-compatible server on 127.0.0.1 (its own thread and tokio
/// runtime) that records every request. `POST /v1/chat/completions` answers
/// [`CLOUD_REPLY`] (as SSE chunks when `stream: true`); `GET /v1/models` lists
/// [`UPSTREAM_MODEL`]; anything else is a 404 (and is still recorded).
pub struct FakeCloud {
    addr: SocketAddr,
    log: Log,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl FakeCloud {
    pub fn start() -> FakeCloud {
        let listener =
            std::net::TcpListener::bind("127.0.0.1:0").expect("fake cloud: bind 127.0.0.1:0");
        listener
            .set_nonblocking(true)
            .expect("fake cloud: set_nonblocking");
        let addr = listener.local_addr().expect("fake cloud: local_addr");
        let log: Log = Arc::default();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let app = Router::new()
            .fallback(record_and_answer)
            .with_state(log.clone());
        let thread = std::thread::Builder::new()
            .name(format!("fake-cloud-{}", addr.port()))
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("fake cloud: tokio runtime");
                runtime.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener)
                        .expect("fake cloud: tokio listener");
                    tokio::select! {
                        served = axum::serve(listener, app).into_future() => {
                            if let Err(e) = served {
                                eprintln!("[fake-cloud] server error: {e}");
                            }
                        }
                        _ = stop_rx => {}
                    }
                });
                // Dropping the runtime here cancels any connection still open.
            })
            .expect("fake cloud: spawn thread");
        FakeCloud {
            addr,
            log,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    /// The base URL to configure as an upstream: `http://127.0.0.1:PORT/v1`.
    pub fn url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<Recorded> {
        lock(&self.log).clone()
    }

    /// How many requests (of any kind) were received.
    pub fn count(&self) -> usize {
        lock(&self.log).len()
    }

    /// The chat completion requests received so far.
    pub fn chat_requests(&self) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(Recorded::is_chat)
            .collect()
    }

    /// The requests whose body or headers contain `needle`.
    pub fn requests_mentioning(&self, needle: &str) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|r| r.mentions(needle))
            .collect()
    }

    /// A readable dump of what was recorded, for assertion messages.
    pub fn describe(&self) -> String {
        let requests = self.requests();
        if requests.is_empty() {
            return "fake cloud recorded no requests".to_owned();
        }
        let mut out = format!("fake cloud recorded {} request(s):\n", requests.len());
        for r in requests {
            out.push_str(&format!(
                "  {} {} {}\n",
                r.method,
                r.path,
                truncate(&r.body_text, 500)
            ));
        }
        out
    }
}

impl Drop for FakeCloud {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn record_and_answer(State(log): State<Log>, request: axum::extract::Request) -> Response {
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_READ as usize)
        .await
        .unwrap_or_default();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let mut headers: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in &parts.headers {
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        headers
            .entry(name.as_str().to_owned())
            .and_modify(|v| {
                v.push_str(", ");
                v.push_str(&value);
            })
            .or_insert(value);
    }
    let path = parts.uri.path().to_owned();
    lock(&log).push(Recorded {
        method: parts.method.to_string(),
        path: path.clone(),
        headers,
        body: body.clone(),
        body_text: String::from_utf8_lossy(&bytes).into_owned(),
    });

    if parts.method == Method::POST && path.ends_with("/chat/completions") {
        fake_chat_completion(&body)
    } else if parts.method == Method::GET && path.ends_with("/models") {
        Json(json!({
            "object": "list",
            "data": [{"id": UPSTREAM_MODEL, "object": "model", "created": 0, "owned_by": "fake-cloud"}]
        }))
        .into_response()
    } else {
        openai_error(
            StatusCode::NOT_FOUND,
            "not_found",
            &format!("no route for {path}"),
        )
    }
}

fn openai_error(status: StatusCode, code: &str, message: &str) -> Response {
    let body =
        json!({"error": {"message": message, "type": "invalid_request_error", "code": code}});
    (status, Json(body)).into_response()
}

fn fake_chat_completion(request: &Value) -> Response {
    let Some(messages) = request.get("messages").and_then(Value::as_array) else {
        return openai_error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "messages must be an array",
        );
    };
    let model = request
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or(UPSTREAM_MODEL)
        .to_owned();
    // Whitespace-separated words: good enough for a fake usage block.
    let prompt_tokens: usize = messages
        .iter()
        .filter_map(|m| m.get("content").and_then(Value::as_str))
        .map(|c| c.split_whitespace().count())
        .sum();
    let completion_tokens = CLOUD_REPLY_PIECES.len();
    let usage = json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    });
    let id = "chatcmpl-fakecloud";
    let created = 1_700_000_000u64;

    if request.get("stream").and_then(Value::as_bool) == Some(true) {
        let chunk = |delta: Value, finish_reason: Value| {
            json!({
                "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
            })
        };
        let mut events = vec![chunk(
            json!({"role": "assistant", "content": ""}),
            Value::Null,
        )];
        for piece in CLOUD_REPLY_PIECES {
            events.push(chunk(json!({"content": piece}), Value::Null));
        }
        events.push(chunk(json!({}), json!("stop")));
        let include_usage = request
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            == Some(true);
        if include_usage {
            events.push(json!({
                "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [], "usage": usage,
            }));
        }
        let mut sse = String::new();
        for event in events {
            sse.push_str(&format!("data: {event}\n\n"));
        }
        sse.push_str("data: [DONE]\n\n");
        return Response::builder()
            .status(StatusCode::OK)
            .header(header::CONTENT_TYPE, "text/event-stream")
            .header(header::CACHE_CONTROL, "no-cache")
            .body(Body::from(sse))
            .expect("fake cloud: SSE response");
    }

    Json(json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": CLOUD_REPLY},
            "finish_reason": "stop",
        }],
        "usage": usage,
    }))
    .into_response()
}

// ---------------------------------------------------------------------------
// Node
// ---------------------------------------------------------------------------

/// Writes a node config for a test and starts `edgeroute up` on it.
#[derive(Clone, Debug)]
pub struct NodeBuilder {
    policy_component: Option<PathBuf>,
    model_path: PathBuf,
    model_optional: bool,
    upstream_url: String,
    max_queue: u32,
    deadline_ms: u64,
    local_max_prompt_tokens: u32,
    extra_args: Vec<String>,
    env: Vec<(String, String)>,
}

impl NodeBuilder {
    /// Defaults: embedded default policy, SmolLM2 required, the given
    /// upstream, `max_queue = 8`, `deadline_ms = 20`,
    /// `local_max_prompt_tokens = 64`.
    pub fn new(upstream_url: impl Into<String>) -> NodeBuilder {
        NodeBuilder {
            policy_component: None,
            model_path: PathBuf::from(SMOLLM2_MODEL),
            model_optional: false,
            upstream_url: upstream_url.into(),
            max_queue: 8,
            deadline_ms: 20,
            local_max_prompt_tokens: 64,
            extra_args: Vec::new(),
            env: Vec::new(),
        }
    }

    /// Route with this policy component (`.wasm`) instead of the embedded default.
    pub fn policy_component(mut self, path: impl Into<PathBuf>) -> Self {
        self.policy_component = Some(path.into());
        self
    }

    /// Route with the embedded default policy (`component = ""`).
    pub fn default_policy(mut self) -> Self {
        self.policy_component = None;
        self
    }

    pub fn model_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.model_path = path.into();
        self
    }

    /// `optional = true`: the node starts even when the model cannot be loaded.
    pub fn model_optional(mut self, optional: bool) -> Self {
        self.model_optional = optional;
        self
    }

    pub fn upstream_url(mut self, url: impl Into<String>) -> Self {
        self.upstream_url = url.into();
        self
    }

    pub fn max_queue(mut self, n: u32) -> Self {
        self.max_queue = n;
        self
    }

    pub fn deadline_ms(mut self, ms: u64) -> Self {
        self.deadline_ms = ms;
        self
    }

    pub fn local_max_prompt_tokens(mut self, n: u32) -> Self {
        self.local_max_prompt_tokens = n;
        self
    }

    /// An extra argument after `edgeroute up --config … --listen 127.0.0.1:0`.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.extra_args.push(arg.into());
        self
    }

    /// An extra environment variable for the node process.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// The TOML config this builder writes.
    pub fn config_toml(&self) -> String {
        let component = self
            .policy_component
            .as_deref()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        format!(
            r#"[local]
threads = 1
max_queue = {max_queue}
context_size = 2048
[[local.models]]
name = "{LOCAL_MODEL}"
path = {model_path}
optional = {optional}
[[cloud.upstreams]]
name = "{UPSTREAM}"
base_url = {base_url}
model = "{UPSTREAM_MODEL}"
api_key_env = "{API_KEY_ENV}"
usd_per_mtok_in = 2.5
usd_per_mtok_out = 10.0
[policy]
component = {component}
deadline_ms = {deadline_ms}
on_failure = "local"
[policy.params]
local_model = "{LOCAL_MODEL}"
cloud_upstream = "{UPSTREAM}"
local_max_prompt_tokens = "{local_max_prompt_tokens}"
[guard]
never_leave = ["restricted"]
detect_pii = true
[limits]
max_body_bytes = 1048576
"#,
            max_queue = self.max_queue,
            model_path = toml_string(&self.model_path.display().to_string()),
            optional = self.model_optional,
            base_url = toml_string(&self.upstream_url),
            component = toml_string(&component),
            deadline_ms = self.deadline_ms,
            local_max_prompt_tokens = self.local_max_prompt_tokens,
        )
    }

    /// Write the config and start the node; returns once it is listening.
    /// Panics (with the node's output) if it exits or is not listening
    /// within [`STARTUP_TIMEOUT`].
    pub fn start(mut self) -> Node {
        if let Ok(canonical) = self.model_path.canonicalize() {
            self.model_path = canonical;
        }
        if !self.model_optional && !self.model_path.exists() {
            panic!(
                "model not found at {}: run `./dev setup` (or `bash scripts/fetch-models.sh`) first",
                self.model_path.display()
            );
        }
        if let Some(component) = &self.policy_component {
            assert!(
                component.exists(),
                "policy component {} does not exist (host/build.rs builds the test fixtures)",
                component.display()
            );
        }

        let dir = std::env::temp_dir().join(unique("edgeroute-e2e"));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        let config_path = dir.join("edgeroute.toml");
        let config = self.config_toml();
        std::fs::write(&config_path, &config)
            .unwrap_or_else(|e| panic!("write {}: {e}", config_path.display()));
        eprintln!("[support] config {}:\n{config}", config_path.display());

        let api_key = unique("sk-edgeroute-test");
        let mut command = Command::new(env!("CARGO_BIN_EXE_edgeroute"));
        command
            .arg("up")
            .arg("--config")
            .arg(&config_path)
            .arg("--listen")
            .arg("127.0.0.1:0")
            .args(&self.extra_args)
            .current_dir(&dir)
            .env(API_KEY_ENV, &api_key)
            .env("NO_PROXY", "127.0.0.1,localhost")
            .env("no_proxy", "127.0.0.1,localhost")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        eprintln!("[support] starting {command:?}");
        let mut child = command
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", env!("CARGO_BIN_EXE_edgeroute")));

        let logs: Arc<Mutex<String>> = Arc::default();
        let (ready_tx, ready_rx) = mpsc::channel::<SocketAddr>();
        let stdout = child.stdout.take().expect("child stdout");
        let stderr = child.stderr.take().expect("child stderr");
        forward_output(stdout, "stdout", logs.clone(), ready_tx.clone());
        forward_output(stderr, "stderr", logs.clone(), ready_tx);

        let mut node = Node {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            dir,
            logs,
            api_key,
            agent: http_agent(),
        };

        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            match ready_rx.recv_timeout(Duration::from_millis(100)) {
                Ok(addr) => {
                    node.addr = addr;
                    break;
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                // Both pipes closed: the process is exiting; try_wait below sees it.
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    std::thread::sleep(Duration::from_millis(100))
                }
            }
            if let Ok(Some(status)) = node.child.try_wait() {
                std::thread::sleep(Duration::from_millis(200)); // let the readers drain
                panic!(
                    "edgeroute exited ({status}) before it printed `{LISTENING_PREFIX}ADDR`\n\
                     --- node output ---\n{}",
                    node.logs()
                );
            }
            if Instant::now() > deadline {
                panic!(
                    "edgeroute did not print `{LISTENING_PREFIX}ADDR` within {STARTUP_TIMEOUT:?}\n\
                     --- node output ---\n{}",
                    node.logs()
                );
            }
        }
        eprintln!("[support] node listening on {}", node.url());
        node
    }
}

/// Quote a string as a TOML basic string.
fn toml_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Copy a child's output to stderr (captured by the test harness, shown on
/// failure) and to `logs`; report the listening address once seen.
fn forward_output(
    stream: impl Read + Send + 'static,
    label: &'static str,
    logs: Arc<Mutex<String>>,
    ready: mpsc::Sender<SocketAddr>,
) {
    std::thread::Builder::new()
        .name(format!("edgeroute-{label}"))
        .spawn(move || {
            let mut reader = BufReader::new(stream);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match reader.read_until(b'\n', &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                let text = String::from_utf8_lossy(&buf);
                let line = text.trim_end_matches(['\r', '\n']);
                eprintln!("[edgeroute {label}] {line}");
                {
                    let mut logs = lock(&logs);
                    logs.push_str(line);
                    logs.push('\n');
                }
                if let Some(addr) = parse_listening_line(line) {
                    let _ = ready.send(addr);
                }
            }
        })
        .expect("spawn output forwarder");
}

/// `…edgeroute listening on http://127.0.0.1:PORT…` → the address. Tolerates
/// log decoration around it (timestamps, ANSI colours, a JSON log line).
pub fn parse_listening_line(line: &str) -> Option<SocketAddr> {
    let rest = &line[line.find(LISTENING_PREFIX)? + LISTENING_PREFIX.len()..];
    let end = rest
        .find(|c: char| !(c.is_ascii_hexdigit() || matches!(c, '.' | ':' | '[' | ']')))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

fn http_agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(REQUEST_TIMEOUT))
        .proxy(None)
        .build()
        .new_agent()
}

/// A running `edgeroute up` process; killed when dropped.
pub struct Node {
    child: Child,
    addr: SocketAddr,
    dir: PathBuf,
    logs: Arc<Mutex<String>>,
    api_key: String,
    agent: ureq::Agent,
}

impl Node {
    pub fn builder(cloud: &FakeCloud) -> NodeBuilder {
        NodeBuilder::new(cloud.url())
    }

    /// A node with the default config pointed at `cloud`.
    pub fn start(cloud: &FakeCloud) -> Node {
        Node::builder(cloud).start()
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT` (append `/v1` for an OpenAI base URL).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Everything the node printed so far (stdout and stderr, interleaved by line).
    pub fn logs(&self) -> String {
        lock(&self.logs).clone()
    }

    /// The upstream API key the node was given through [`API_KEY_ENV`].
    pub fn api_key(&self) -> &str {
        &self.api_key
    }

    /// The directory holding this node's config (its working directory).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// `POST /v1/chat/completions` with a JSON body and extra headers.
    /// 4xx/5xx are returned, not raised; a transport failure panics.
    pub fn post_chat(&self, body: Value, headers: &[(&str, &str)]) -> Resp {
        self.try_post_chat(body, headers).unwrap_or_else(|e| {
            panic!(
                "POST /v1/chat/completions failed: {e}\n--- node output ---\n{}",
                self.logs()
            )
        })
    }

    pub fn try_post_chat(
        &self,
        body: Value,
        headers: &[(&str, &str)],
    ) -> Result<Resp, ureq::Error> {
        let mut request = self
            .agent
            .post(format!("{}/v1/chat/completions", self.url()))
            .header("content-type", "application/json");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let bytes = serde_json::to_vec(&body).expect("serialize request body");
        Resp::from_ureq(request.send(bytes)?)
    }

    /// `GET path` (e.g. `/healthz`, `/v1/models`).
    pub fn get(&self, path: &str) -> Resp {
        self.agent
            .get(format!("{}{path}", self.url()))
            .call()
            .and_then(Resp::from_ureq)
            .unwrap_or_else(|e| {
                panic!(
                    "GET {path} failed: {e}\n--- node output ---\n{}",
                    self.logs()
                )
            })
    }

    /// `POST /v1/chat/completions` with arbitrary bytes (malformed JSON,
    /// invalid UTF-8, oversized bodies).
    pub fn post_raw(&self, body: impl AsRef<[u8]>, content_type: &str) -> Resp {
        self.post_raw_to("/v1/chat/completions", body, content_type)
    }

    /// Like [`Node::post_raw`] for any path. Uses a minimal HTTP/1.1 client
    /// that writes the body on one thread while reading the response on
    /// another, so a server that answers early (413 before reading a large
    /// body) and closes is still seen answering, not as a write error.
    pub fn post_raw_to(&self, path: &str, body: impl AsRef<[u8]>, content_type: &str) -> Resp {
        raw_post(
            self.addr,
            path,
            body.as_ref(),
            content_type,
            REQUEST_TIMEOUT,
        )
        .unwrap_or_else(|e| {
            panic!(
                "raw POST {path} ({} bytes) failed: {e}\n--- node output ---\n{}",
                body.as_ref().len(),
                self.logs()
            )
        })
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

// ---------------------------------------------------------------------------
// Responses
// ---------------------------------------------------------------------------

/// An HTTP response, whatever its status.
#[derive(Clone)]
pub struct Resp {
    pub status: u16,
    /// Lower-case names, in received order.
    pub headers: Vec<(String, String)>,
    pub body_text: String,
}

impl Resp {
    fn from_ureq(mut response: ureq::http::Response<ureq::Body>) -> Result<Resp, ureq::Error> {
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .map(|(name, value)| {
                (
                    name.as_str().to_ascii_lowercase(),
                    String::from_utf8_lossy(value.as_bytes()).into_owned(),
                )
            })
            .collect();
        let bytes = response
            .body_mut()
            .with_config()
            .limit(MAX_READ)
            .read_to_vec()?;
        Ok(Resp {
            status,
            headers,
            body_text: String::from_utf8_lossy(&bytes).into_owned(),
        })
    }

    /// The first header called `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// `x-edgeroute-target`, e.g. `local:smollm2` or `cloud:frontier`.
    pub fn target(&self) -> Option<&str> {
        self.header("x-edgeroute-target")
    }

    /// `x-edgeroute-reason`.
    pub fn reason(&self) -> Option<&str> {
        self.header("x-edgeroute-reason")
    }

    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The body as JSON; panics with the response if it is not JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body_text)
            .unwrap_or_else(|e| panic!("response body is not JSON ({e}): {self:?}"))
    }

    /// `choices[0].message.content` of a non-streaming completion.
    pub fn content(&self) -> Option<String> {
        serde_json::from_str::<Value>(&self.body_text)
            .ok()?
            .pointer("/choices/0/message/content")?
            .as_str()
            .map(str::to_owned)
    }

    /// The `data:` payloads of a server-sent-events body, in order.
    pub fn sse_data(&self) -> Vec<String> {
        let mut events = Vec::new();
        let mut current: Option<String> = None;
        for line in self.body_text.lines() {
            let line = line.trim_end_matches('\r');
            if line.is_empty() {
                if let Some(data) = current.take() {
                    events.push(data);
                }
            } else if let Some(data) = line.strip_prefix("data:") {
                let data = data.strip_prefix(' ').unwrap_or(data);
                match &mut current {
                    Some(existing) => {
                        existing.push('\n');
                        existing.push_str(data);
                    }
                    None => current = Some(data.to_owned()),
                }
            }
        }
        if let Some(data) = current {
            events.push(data);
        }
        events
    }

    /// A parsed OpenAI chat completion stream (panics if a chunk is not JSON).
    pub fn stream(&self) -> StreamSummary {
        let data = self.sse_data();
        let mut summary = StreamSummary {
            events: data.len(),
            done_last: data.last().map(String::as_str) == Some("[DONE]"),
            ..StreamSummary::default()
        };
        for payload in &data {
            if payload == "[DONE]" {
                summary.done_count += 1;
                continue;
            }
            let chunk: Value = serde_json::from_str(payload)
                .unwrap_or_else(|e| panic!("SSE chunk is not JSON ({e}): {payload}\n{self:?}"));
            summary.objects.push(
                chunk
                    .get("object")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
            );
            if chunk.get("error").is_some() {
                summary.errors.push(chunk.clone());
            }
            if let Some(choices) = chunk.get("choices").and_then(Value::as_array) {
                for choice in choices {
                    if let Some(text) = choice.pointer("/delta/content").and_then(Value::as_str)
                        && !text.is_empty()
                    {
                        summary.content_chunks += 1;
                        summary.text.push_str(text);
                    }
                    if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
                        summary.finish_reason = Some(reason.to_owned());
                    }
                }
            }
            if let Some(usage) = chunk.get("usage").filter(|u| !u.is_null()) {
                summary.usage = Some(usage.clone());
            }
        }
        summary
    }
}

impl fmt::Debug for Resp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "HTTP {}", self.status)?;
        for (name, value) in &self.headers {
            writeln!(f, "{name}: {value}")?;
        }
        write!(f, "\n{}", truncate(&self.body_text, 4000))
    }
}

/// What a chat completion SSE stream contained.
#[derive(Clone, Debug, Default)]
pub struct StreamSummary {
    /// Number of SSE events (`[DONE]` included).
    pub events: usize,
    /// Chunks whose `delta.content` is non-empty.
    pub content_chunks: usize,
    /// The concatenated content.
    pub text: String,
    /// The last `finish_reason` seen.
    pub finish_reason: Option<String>,
    /// Whether the final event is `[DONE]`.
    pub done_last: bool,
    pub done_count: usize,
    /// The `object` field of each JSON chunk.
    pub objects: Vec<String>,
    pub usage: Option<Value>,
    /// Chunks carrying an `error` object.
    pub errors: Vec<Value>,
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes in all)", &s[..end], s.len())
}

// ---------------------------------------------------------------------------
// Minimal raw HTTP/1.1 client (for bodies no well-behaved client would send)
// ---------------------------------------------------------------------------

fn raw_post(
    addr: SocketAddr,
    path: &str,
    body: &[u8],
    content_type: &str,
    timeout: Duration,
) -> std::io::Result<Resp> {
    let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(10))?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let mut writer = stream.try_clone()?;
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: {content_type}\r\n\
         Content-Length: {}\r\nAccept: application/json\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    let write_thread = std::thread::spawn(move || -> std::io::Result<()> {
        writer.write_all(&request)?;
        writer.flush()
    });

    let mut reader = stream;
    let mut raw = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let read_result = loop {
        match reader.read(&mut buf) {
            Ok(0) => break Ok(()),
            Ok(n) => {
                raw.extend_from_slice(&buf[..n]);
                if parse_http_response(&raw, false).is_some() {
                    break Ok(());
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => break Err(e),
        }
    };
    // Unblocks the writer if the server stopped reading the body.
    let _ = reader.shutdown(Shutdown::Both);
    let write_result = write_thread.join();

    match parse_http_response(&raw, true) {
        Some(resp) => Ok(resp),
        None => {
            let why = match (read_result, write_result) {
                (Err(e), _) => format!("read: {e}"),
                (Ok(()), Ok(Err(e))) => format!("write: {e}"),
                _ => "connection closed".to_owned(),
            };
            Err(std::io::Error::other(format!(
                "no complete HTTP response ({why}); received {} bytes: {}",
                raw.len(),
                truncate(&String::from_utf8_lossy(&raw), 500)
            )))
        }
    }
}

/// Parse `raw` as an HTTP/1.1 response. Returns `None` while incomplete;
/// with `at_eof`, a body without length runs to the end of `raw`.
fn parse_http_response(raw: &[u8], at_eof: bool) -> Option<Resp> {
    let head_end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&raw[..head_end]).into_owned();
    let rest = &raw[head_end + 4..];
    let mut lines = head.split("\r\n");
    let status: u16 = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let find = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let body =
        if find("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked")) {
            decode_chunked(rest)?
        } else if let Some(len) = find("content-length").and_then(|v| v.parse::<usize>().ok()) {
            if rest.len() < len {
                return None;
            }
            rest[..len].to_vec()
        } else if status == 204 || status == 304 || (100..200).contains(&status) {
            Vec::new()
        } else if at_eof {
            rest.to_vec()
        } else {
            return None;
        };
    Some(Resp {
        status,
        headers,
        body_text: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// Decode a complete chunked body; `None` while the final chunk is missing.
fn decode_chunked(mut data: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = data.windows(2).position(|w| w == b"\r\n")?;
        let size_text = String::from_utf8_lossy(&data[..line_end]);
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        data = &data[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        if data.len() < size + 2 {
            return None;
        }
        out.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
}

// ---------------------------------------------------------------------------
// Self-tests of this module (no node needed)
// ---------------------------------------------------------------------------

#[cfg(test)]
mod self_tests {
    use super::*;

    #[test]
    fn support_parses_the_listening_line() {
        let addr: SocketAddr = "127.0.0.1:4242".parse().unwrap();
        for line in [
            "edgeroute listening on http://127.0.0.1:4242",
            "2025-01-01T00:00:00Z  INFO edgeroute listening on http://127.0.0.1:4242/ (3 models)",
            "\u{1b}[32mINFO\u{1b}[0m edgeroute listening on http://127.0.0.1:4242\u{1b}[0m",
            r#"{"level":"INFO","message":"edgeroute listening on http://127.0.0.1:4242","target":"x"}"#,
        ] {
            assert_eq!(parse_listening_line(line), Some(addr), "{line}");
        }
        assert_eq!(
            parse_listening_line("edgeroute listening on http://[::1]:80"),
            Some("[::1]:80".parse().unwrap())
        );
        assert_eq!(parse_listening_line("listening on 127.0.0.1:4242"), None);
    }

    #[test]
    fn support_parses_raw_http_responses() {
        let raw = b"HTTP/1.1 413 Payload Too Large\r\ncontent-type: application/json\r\n\
                    content-length: 13\r\n\r\n{\"error\":{}}\n";
        let resp = parse_http_response(raw, false).expect("complete");
        assert_eq!(resp.status, 413);
        assert_eq!(resp.header("Content-Type"), Some("application/json"));
        assert_eq!(resp.body_text, "{\"error\":{}}\n");
        assert!(parse_http_response(&raw[..raw.len() - 3], false).is_none());

        let chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\
                        4\r\nWiki\r\n5;ext=1\r\npedia\r\n0\r\n\r\n";
        assert_eq!(
            parse_http_response(chunked, false).unwrap().body_text,
            "Wikipedia"
        );
        assert!(parse_http_response(&chunked[..chunked.len() - 5], false).is_none());

        let until_eof = b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\n\r\nbad";
        assert!(parse_http_response(until_eof, false).is_none());
        assert_eq!(
            parse_http_response(until_eof, true).unwrap().body_text,
            "bad"
        );
    }

    #[test]
    fn support_parses_sse_streams() {
        let resp = Resp {
            status: 200,
            headers: vec![],
            body_text: concat!(
                "data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\r\n\r\n",
                ": a comment\n\n",
                "data:{\"object\":\"chat.completion.chunk\",\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n",
                "data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"delta\":{\"content\":\"lo\"},\"finish_reason\":\"stop\"}]}\n\n",
                "data: [DONE]\n\n",
            )
            .to_owned(),
        };
        let stream = resp.stream();
        assert_eq!(stream.events, 4);
        assert_eq!(stream.content_chunks, 2);
        assert_eq!(stream.text, "Hello");
        assert_eq!(stream.finish_reason.as_deref(), Some("stop"));
        assert!(stream.done_last);
        assert_eq!(stream.done_count, 1);
    }

    #[test]
    fn support_unique_names_are_letters() {
        let a = unique("canary");
        let b = unique("canary");
        assert_ne!(a, b);
        assert!(a.starts_with("canary-"));
        assert!(
            a["canary".len()..]
                .chars()
                .all(|c| c == '-' || c.is_ascii_lowercase()),
            "{a}"
        );
        assert_eq!(letters(0), "a");
        assert_eq!(letters(27), "bb");
    }

    #[test]
    fn support_quotes_toml_strings() {
        let quoted = toml_string("C:\\models\\\"x\".gguf");
        let parsed: BTreeMap<String, String> =
            serde_json::from_str(&format!("{{\"v\": {quoted}}}")).unwrap();
        assert_eq!(parsed["v"], "C:\\models\\\"x\".gguf");
    }

    #[test]
    fn support_fake_cloud_answers_and_records() {
        let cloud = FakeCloud::start();
        let agent = http_agent();
        let body = json!({
            "model": UPSTREAM_MODEL,
            "messages": [{"role": "user", "content": "hello from canary-selftest"}],
        });
        let mut response = agent
            .post(format!("{}/chat/completions", cloud.url()))
            .header("authorization", "Bearer k")
            .send_json(&body)
            .unwrap();
        assert_eq!(response.status().as_u16(), 200);
        let answer: Value = response.body_mut().read_json().unwrap();
        assert_eq!(answer["choices"][0]["message"]["content"], CLOUD_REPLY);
        assert!(answer["usage"]["total_tokens"].as_u64().unwrap() > 0);

        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        streamed["stream_options"] = json!({"include_usage": true});
        let response = agent
            .post(format!("{}/chat/completions", cloud.url()))
            .send_json(&streamed)
            .unwrap();
        let resp = Resp::from_ureq(response).unwrap();
        assert!(
            resp.header("content-type")
                .unwrap()
                .starts_with("text/event-stream")
        );
        let stream = resp.stream();
        assert_eq!(stream.text, CLOUD_REPLY);
        assert_eq!(stream.content_chunks, CLOUD_REPLY_PIECES.len());
        assert!(stream.done_last && stream.usage.is_some());

        let models = agent.get(format!("{}/models", cloud.url())).call().unwrap();
        assert_eq!(models.status().as_u16(), 200);

        assert_eq!(cloud.count(), 3);
        assert_eq!(cloud.chat_requests().len(), 2);
        let hits = cloud.requests_mentioning("canary-selftest");
        assert_eq!(hits.len(), 2);
        assert_eq!(hits[0].header("Authorization"), Some("Bearer k"));
        assert_eq!(hits[0].body, body);
        assert!(cloud.requests_mentioning("not-sent").is_empty());
    }

    #[test]
    fn support_raw_client_sees_an_early_413() {
        // A server that answers before reading a large body, then closes.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut socket, _) = listener.accept().unwrap();
            let mut head = [0u8; 1024];
            let _ = socket.read(&mut head);
            let body =
                r#"{"error":{"message":"too large","type":"invalid_request_error","code":null}}"#;
            let response = format!(
                "HTTP/1.1 413 Payload Too Large\r\ncontent-type: application/json\r\n\
                 content-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            // One write, as an HTTP server does it (piecewise writes would sit
            // behind Nagle and be discarded by the reset below).
            socket.write_all(response.as_bytes()).unwrap();
            // Closing with unread data makes the kernel reset the connection.
        });
        let big = vec![b'a'; 10 * 1024 * 1024];
        let resp = raw_post(
            addr,
            "/v1/chat/completions",
            &big,
            "application/json",
            REQUEST_TIMEOUT,
        )
        .expect("the 413 is read even though the body was not");
        assert_eq!(resp.status, 413);
        assert!(resp.body_text.contains("too large"));
        server.join().unwrap();
    }
}
