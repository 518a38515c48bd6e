//! The process node: the real `edgeroute` binary, started with
//! `edgeroute up` on a config written for the test, killed on drop.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::exclusive::{self, Share};
use crate::http::{self, REQUEST_TIMEOUT};
use crate::{API_KEY_ENV, FakeCloud, LOCAL_MODEL, Resp, UPSTREAM, UPSTREAM_MODEL, lock, unique};

/// The model `scripts/fetch-models.sh` installs (`./dev setup` runs it).
/// The audit log's file name in a test node's folder.
const AUDIT_LOG: &str = "egress-audit.jsonl";

const MODEL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../models/SmolLM2-135M-Instruct.Q4_1.gguf"
);
/// The sentence-embedding model `scripts/fetch-models.sh` converts.
pub const EMBEDDING_MODEL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../models/all-MiniLM-L6-v2.Q8_0.gguf"
);
/// Its name in the test config (`/v1/embeddings`' `model`).
pub const EMBEDDING_NAME: &str = "minilm";
/// How long a node may take from spawn to its "listening" line (model load included).
const STARTUP_TIMEOUT: Duration = Duration::from_secs(120);
/// The line `edgeroute up` prints on stdout once it accepts requests.
const LISTENING_PREFIX: &str = "edgeroute listening on http://";

/// The `edgeroute` binary under test. Cargo tells only the test target it
/// builds the binary for where it is, so that target names it once:
/// `const EDGEROUTE: Edgeroute = Edgeroute::new(env!("CARGO_BIN_EXE_edgeroute"));`
#[derive(Clone, Copy, Debug)]
pub struct Edgeroute {
    binary: &'static str,
}

impl Edgeroute {
    pub const fn new(binary: &'static str) -> Edgeroute {
        Edgeroute { binary }
    }

    /// A node pointed at `cloud`, to configure further and then
    /// [`start`](NodeBuilder::start).
    pub fn node(&self, cloud: &FakeCloud) -> NodeBuilder {
        NodeBuilder::new(self.binary, cloud.url())
    }

    /// A node with the default test config pointed at `cloud`.
    pub fn start(&self, cloud: &FakeCloud) -> Node {
        self.node(cloud).start()
    }

    /// The binary as a command, for its other subcommands
    /// (`policy check`, `policy swap`, …).
    pub fn command(&self) -> Command {
        Command::new(self.binary)
    }

    /// `edgeroute policy replay LOG_OR_DATASET CANDIDATE --config CONFIG
    /// EXTRA… --json`: the parsed report; panics with the output on failure.
    pub fn policy_replay(
        &self,
        log: &Path,
        candidate: &str,
        config: &Path,
        extra: &[&str],
    ) -> Value {
        let output = self
            .command()
            .args(["policy", "replay"])
            .arg(log)
            .arg(candidate)
            .arg("--config")
            .arg(config)
            .args(extra)
            .arg("--json")
            .output()
            .expect("run edgeroute policy replay");
        assert!(
            output.status.success(),
            "replay failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice(&output.stdout).expect("replay --json prints JSON")
    }

    /// `edgeroute policy check [--reference] --config
    /// runtime-config/edgeroute.toml FILE`, run from the repository root:
    /// whether it passed, and everything it printed.
    pub fn policy_check(&self, file: &Path, reference: bool) -> (bool, String) {
        let mut command = self.command();
        command.args(["policy", "check"]);
        if reference {
            command.arg("--reference");
        }
        let output = command
            .arg("--config")
            .arg(Path::new(crate::REPO_ROOT).join("runtime-config/edgeroute.toml"))
            .arg(file)
            .current_dir(crate::REPO_ROOT)
            .output()
            .expect("run edgeroute policy check");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        (output.status.success(), text)
    }
}

/// Writes a node config for a test and starts `edgeroute up` on it.
#[derive(Clone, Debug)]
pub struct NodeBuilder {
    binary: &'static str,
    policy_component: Option<PathBuf>,
    model_path: PathBuf,
    model_optional: bool,
    upstream_url: String,
    max_queue: u32,
    deadline_ms: u64,
    local_max_prompt_tokens: u32,
    extra_args: Vec<String>,
    env: Vec<(String, String)>,
    policy_params: Vec<(String, String)>,
    embedding: bool,
    limits: Vec<(String, u64)>,
    /// `[local]` entries, values as TOML.
    local: Vec<(String, String)>,
    guard: String,
    extra_toml: String,
}

impl NodeBuilder {
    /// Defaults: embedded default policy, SmolLM2 required, the given
    /// upstream, `max_queue = 8`, `deadline_ms = 20`,
    /// `local_max_prompt_tokens = 64`.
    fn new(binary: &'static str, upstream_url: String) -> NodeBuilder {
        NodeBuilder {
            binary,
            policy_component: None,
            model_path: PathBuf::from(MODEL),
            model_optional: false,
            upstream_url,
            max_queue: 8,
            deadline_ms: 20,
            local_max_prompt_tokens: 64,
            extra_args: Vec::new(),
            env: Vec::new(),
            policy_params: Vec::new(),
            embedding: true,
            limits: Vec::new(),
            local: Vec::new(),
            guard: String::new(),
            extra_toml: String::new(),
        }
    }

    /// An extra `[local]` entry (`max_concurrent`, `kv_budget_tokens`, …).
    pub fn local(mut self, key: &str, value: u64) -> Self {
        self.local.push((key.into(), value.to_string()));
        self
    }

    /// An extra `[local]` entry whose value is text (`tool_calls`).
    pub fn local_str(mut self, key: &str, value: &str) -> Self {
        self.local.push((key.into(), toml_string(value)));
        self
    }

    /// An extra `[limits]` entry (`shutdown_grace_ms`, `max_connections`, …).
    pub fn limit(mut self, key: &str, value: u64) -> Self {
        self.limits.push((key.into(), value));
        self
    }

    /// An extra `[guard]` line, as TOML (`zone_levels = ["restricted"]`).
    pub fn guard(mut self, line: &str) -> Self {
        self.guard.push_str(line);
        self.guard.push('\n');
        self
    }

    /// TOML tables appended to the config (`[tenants.NAME]`, `[spin]`, …).
    pub fn config_extra(mut self, toml: &str) -> Self {
        self.extra_toml.push_str(toml);
        self.extra_toml.push('\n');
        self
    }

    /// The paced test backend in place of the model (`[local.test_backend]`:
    /// a fixed labelled text at these speeds), and no embedding model.
    pub fn paced(self, prefill_tokens_per_s: f64, decode_tokens_per_s: f64) -> Self {
        self.embedding(false).config_extra(&format!(
            "[local.test_backend]\nprefill_tokens_per_s = {prefill_tokens_per_s:?}\ndecode_tokens_per_s = {decode_tokens_per_s:?}"
        ))
    }

    /// Whether the node has the embedding model (default: yes).
    pub fn embedding(mut self, on: bool) -> Self {
        self.embedding = on;
        self
    }

    /// Route with this policy component (`.wasm`) instead of the embedded default.
    pub fn policy_component(mut self, path: impl Into<PathBuf>) -> Self {
        self.policy_component = Some(path.into());
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

    /// An extra `[policy.params]` entry for the policy's `configure`.
    pub fn policy_param(mut self, key: &str, value: &str) -> Self {
        self.policy_params.push((key.into(), value.into()));
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
    /// The config of a node whose files live in `dir`.
    fn config_toml(&self, dir: &Path) -> String {
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
{local}[[local.models]]
name = "{LOCAL_MODEL}"
path = {model_path}
optional = {optional}
{embedding}[[cloud.upstreams]]
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
{policy_params}[guard]
never_leave = ["restricted"]
detect_pii = true
{guard}[limits]
max_body_bytes = 1048576
{limits}[audit]
path = {audit}
{extra}"#,
            extra = self.extra_toml,
            guard = self.guard,
            audit = toml_string(&dir.join(AUDIT_LOG).display().to_string()),
            max_queue = self.max_queue,
            model_path = toml_string(&self.model_path.display().to_string()),
            optional = self.model_optional,
            embedding = if self.embedding {
                format!(
                    "[local.embedding]\nname = \"{EMBEDDING_NAME}\"\npath = {}\n",
                    toml_string(EMBEDDING_MODEL)
                )
            } else {
                String::new()
            },
            base_url = toml_string(&self.upstream_url),
            component = toml_string(&component),
            deadline_ms = self.deadline_ms,
            local_max_prompt_tokens = self.local_max_prompt_tokens,
            limits = self
                .limits
                .iter()
                .map(|(k, v)| format!("{k} = {v}\n"))
                .collect::<String>(),
            local = self
                .local
                .iter()
                .map(|(k, v)| format!("{k} = {v}\n"))
                .collect::<String>(),
            policy_params = self
                .policy_params
                .iter()
                .map(|(k, v)| format!("{k} = {}\n", toml_string(v)))
                .collect::<String>(),
        )
    }

    /// Write the config and start the node; returns once it is listening.
    /// Panics (with the node's output) if it exits or is not listening
    /// within two minutes.
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
        let config = self.config_toml(&dir);
        std::fs::write(&config_path, &config)
            .unwrap_or_else(|e| panic!("write {}: {e}", config_path.display()));
        eprintln!("[testkit] config {}:\n{config}", config_path.display());

        let share = exclusive::share();
        let api_key = unique("sk-edgeroute-test");
        let mut command = Command::new(self.binary);
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
        eprintln!("[testkit] starting {command:?}");
        let mut child = command
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", self.binary));

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
            agent: http::agent(),
            _share: share,
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
        eprintln!("[testkit] node listening on {}", node.url());
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
fn parse_listening_line(line: &str) -> Option<SocketAddr> {
    let rest = &line[line.find(LISTENING_PREFIX)? + LISTENING_PREFIX.len()..];
    let end = rest
        .find(|c: char| !(c.is_ascii_hexdigit() || matches!(c, '.' | ':' | '[' | ']')))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// A running `edgeroute up` process; killed when dropped. While it runs,
/// no [`exclusive`](crate::exclusive) section of another test does.
pub struct Node {
    child: Child,
    addr: SocketAddr,
    dir: PathBuf,
    logs: Arc<Mutex<String>>,
    api_key: String,
    agent: ureq::Agent,
    /// Released after the process is killed (fields drop after `drop`).
    _share: Share,
}

impl Node {
    /// `http://127.0.0.1:PORT` (append `/v1` for an OpenAI base URL).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Everything the node printed so far (stdout and stderr, interleaved by line).
    pub fn logs(&self) -> String {
        lock(&self.logs).clone()
    }

    /// [`Node::logs`] once they hold `needle`: the node writes its log in
    /// batches (every 10 ms), so a line logged during a request may come
    /// after its answer. Panics after 5 s without it.
    pub fn logs_with(&self, needle: &str) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let logs = self.logs();
            if logs.contains(needle) {
                return logs;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the node never logged '{needle}':\n{logs}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The upstream API key the node was given through [`API_KEY_ENV`].
    pub fn api_key(&self) -> &str {
        &self.api_key
    }

    /// The node's egress audit log (`[audit] path`).
    pub fn audit_log(&self) -> PathBuf {
        self.dir.join(AUDIT_LOG)
    }

    /// The directory holding this node's config (its working directory).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether the process is still running.
    /// Send SIGTERM (a graceful shutdown) and wait up to `within` for the
    /// process to exit; its exit status, or None if it is still running.
    pub fn terminate(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// The node's `host:port`, for raw sockets.
    /// Send a chat request on a raw connection and leave it open: the
    /// caller reads what it wants and drops the stream to leave, as a
    /// client that goes away does.
    pub fn open_chat(&self, body: &Value) -> std::net::TcpStream {
        use std::io::Write;
        let body = serde_json::to_vec(body).expect("a JSON body");
        let mut tcp = std::net::TcpStream::connect(self.addr).expect("the node accepts");
        write!(
            tcp,
            "POST /v1/chat/completions HTTP/1.1\r\nhost: node\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )
        .and_then(|()| tcp.write_all(&body))
        .expect("the node reads the request");
        tcp
    }

    /// The node process's id (for /proc, signals).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// `POST /v1/chat/completions` with a JSON body and extra headers.
    /// 4xx/5xx are returned, not raised; a transport failure panics.
    pub fn post_chat(&self, body: Value, headers: &[(&str, &str)]) -> Resp {
        self.post_json("/v1/chat/completions", body, headers)
    }

    /// `POST path` with a JSON body and extra headers (`/v1/embeddings`,
    /// `/v1/feedback`, …); 4xx/5xx are returned, a transport failure panics.
    pub fn post_json(&self, path: &str, body: Value, headers: &[(&str, &str)]) -> Resp {
        let mut request = self
            .agent
            .post(format!("{}{path}", self.url()))
            .header("content-type", "application/json");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let bytes = serde_json::to_vec(&body).expect("serialize request body");
        request
            .send(bytes)
            .and_then(Resp::from_ureq)
            .unwrap_or_else(|e| {
                panic!(
                    "POST {path} failed: {e}\n--- node output ---\n{}",
                    self.logs()
                )
            })
    }

    /// `GET path` (e.g. `/healthz`, `/v1/models`).
    pub fn get(&self, path: &str) -> Resp {
        self.get_with(path, &[])
    }

    /// `GET path` with extra headers (`authorization`, …).
    pub fn get_with(&self, path: &str, headers: &[(&str, &str)]) -> Resp {
        let mut request = self.agent.get(format!("{}{path}", self.url()));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request
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
    /// invalid UTF-8, oversized bodies), through the raw client: a node that
    /// answers early (413 before reading a large body) and closes is seen
    /// answering, not as a write error.
    pub fn post_raw(&self, body: impl AsRef<[u8]>, content_type: &str) -> Resp {
        let path = "/v1/chat/completions";
        http::raw_post(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_listening_line() {
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
    fn quotes_toml_strings() {
        let quoted = toml_string("C:\\models\\\"x\".gguf");
        let parsed: std::collections::BTreeMap<String, String> =
            serde_json::from_str(&format!("{{\"v\": {quoted}}}")).unwrap();
        assert_eq!(parsed["v"], "C:\\models\\\"x\".gguf");
    }
}
