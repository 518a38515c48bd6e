//! The node configuration (`runtime-config/edgeroute.toml`).
//!
//! Every field has a default so a minimal file (or none of a section) works;
//! relative paths are resolved against the config file's folder so the node
//! behaves the same whatever directory it is started from.

use anyhow::{Context, bail};
pub use edgeroute_core::OnPolicyFailure;
use edgeroute_core::Sensitivity;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub node: NodeConfig,
    pub admin: AdminConfig,
    pub local: LocalConfig,
    pub cloud: CloudConfig,
    pub policy: PolicyConfig,
    pub guard: GuardConfig,
    pub limits: Limits,
    pub audit: AuditConfig,
    /// Client tenants and their API keys (`host/src/tenants.rs`). With
    /// none that has a key the API is open (loopback only, unless
    /// `edgeroute up --insecure-open`).
    pub tenants: BTreeMap<String, TenantConfig>,
    pub ledger: LedgerConfig,
    pub spin: SpinConfig,
    /// Other edgeroute nodes this one may forward to (`host/src/fleet`);
    /// absent: a single node.
    pub fleet: Option<FleetConfig>,
}

/// This node's place in a fleet.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetConfig {
    /// This node's name, unique in the fleet (`peer:NAME` elsewhere).
    pub node: String,
    /// Its trust zone (a rack, a site): `[guard] zone_levels` may let
    /// restricted data reach peers of the same zone, never another.
    #[serde(default = "FleetConfig::default_zone")]
    pub zone: String,
    /// The URL peers reach this node at (published with its load);
    /// empty: `http://` and the address `edgeroute up` listens on.
    #[serde(default)]
    pub url: String,
    /// Environment variable holding the fleet token every node shares;
    /// a forwarded request without it is refused. Required.
    #[serde(default = "FleetConfig::default_token_env")]
    pub token_env: String,
    /// A Redis server where nodes publish their load
    /// (`redis://host:6379`); without it, `peers` are asked over HTTP.
    #[serde(default)]
    pub redis: Option<String>,
    /// Peers known from the config (used when there is no Redis).
    #[serde(default)]
    pub peers: Vec<PeerConfig>,
    /// How often this node publishes its load and reads the others'.
    #[serde(default = "FleetConfig::default_report_ms")]
    pub report_ms: u64,
    /// A peer whose last report is older than this is not a candidate.
    #[serde(default = "FleetConfig::default_stale_ms")]
    pub stale_ms: u64,
    /// A session goes back to the node holding its prefix unless that
    /// node's estimated wait is above this.
    #[serde(default = "FleetConfig::default_session_bound_ms")]
    pub session_bound_ms: u32,
    /// How the peer is picked: `load-aware` (the power of two choices over
    /// estimated waits that fit the budget, sessions to their home),
    /// `random` (any live peer, blind to load and budget) or
    /// `random-within-budget` (a random peer, only if its wait fits): the
    /// baselines `edgeroute bench --fleet-loopback` compares against.
    #[serde(default)]
    pub choice: PeerChoice,
    /// The token itself, for nodes a program starts in-process (`edgeroute
    /// bench`); never read from a file.
    #[serde(skip)]
    pub token_value: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PeerChoice {
    #[default]
    LoadAware,
    Random,
    /// A random peer, kept only when its estimated wait fits the
    /// request's budget (else none): the baseline that keeps budgets as
    /// load-aware placement does, without choosing by load.
    RandomWithinBudget,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerConfig {
    pub name: String,
    pub url: String,
}

impl FleetConfig {
    fn default_zone() -> String {
        "default".into()
    }
    fn default_token_env() -> String {
        "EDGEROUTE_FLEET_TOKEN".into()
    }
    fn default_report_ms() -> u64 {
        250
    }
    fn default_stale_ms() -> u64 {
        1500
    }
    fn default_session_bound_ms() -> u32 {
        2000
    }

    /// The shared token; a fleet without one is a config error (forwarded
    /// requests skip the client key check, so they must prove they come
    /// from a node).
    pub fn token(&self) -> anyhow::Result<String> {
        self.token_value
            .clone()
            .or_else(|| std::env::var(&self.token_env).ok())
            .map(|t| t.trim().to_string())
            .filter(|t| t.len() >= 16)
            .with_context(|| {
                format!(
                    "[fleet] needs a shared token of at least 16 characters in ${}",
                    self.token_env
                )
            })
    }
}

/// One client tenant.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// Every request of this tenant is at least this sensitive (a Spin app
    /// that handles patient records is `restricted` without changing its
    /// code); a request or detection can only raise it.
    #[serde(default)]
    pub sensitivity: Sensitivity,
    /// Where this tenant's requests may run: `local`, `cloud`.
    #[serde(default = "all_target_kinds")]
    pub targets: Vec<TenantTarget>,
    /// Requests a minute, with bursts of up to this many; 0 is unlimited.
    #[serde(default)]
    pub requests_per_minute: u32,
    /// SHA-256 (hex) of each API key: the config never holds a key
    /// (`edgeroute key new TENANT` makes one and prints its line).
    #[serde(default)]
    pub keys_sha256: Vec<String>,
    /// An environment variable holding keys, comma-separated.
    #[serde(default)]
    pub keys_env: Option<String>,
    /// Whether this tenant may report cloud calls it made itself
    /// (`POST /v1/gateway/egress`: a Spin gateway), which the node writes
    /// into its ledger and egress audit log.
    #[serde(default)]
    pub egress_reports: bool,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum TenantTarget {
    Local,
    Cloud,
}

fn all_target_kinds() -> Vec<TenantTarget> {
    vec![TenantTarget::Local, TenantTarget::Cloud]
}

/// How `/ledger` buckets traffic.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct LedgerConfig {
    /// `metadata.task` labels the ledger keeps apart; any other task counts
    /// as `other`. The ledger is never keyed by client text, so its size
    /// stays bounded and no client's words are shown to another.
    pub tasks: Vec<String>,
}

/// What Spin apps need (`docs/spin.md`).
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct SpinConfig {
    /// Model names apps already use, mapped to this node's names
    /// (`"llama2-chat" = "auto"`); applied on every endpoint.
    pub models: BTreeMap<String, String>,
}

/// The egress audit log (`host/src/audit.rs`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditConfig {
    /// On by default: what left the node is the first question a privacy
    /// review asks.
    pub enabled: bool,
    /// Relative to the state directory (`[node] state_dir`, else
    /// `$XDG_STATE_HOME/edgeroute` or `~/.local/state/edgeroute`).
    pub path: PathBuf,
    /// Rotate when the file would grow past this.
    pub max_bytes: u64,
    /// Rotated files kept (`FILE.1` is the newest).
    pub keep: u32,
}

impl Default for AuditConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            path: "egress-audit.jsonl".into(),
            max_bytes: 16 << 20,
            keep: 3,
        }
    }
}

impl Config {
    /// The first upstream's prices: what the ledger values local answers at.
    pub fn reference_prices(&self) -> edgeroute_core::Prices {
        self.cloud
            .upstreams
            .first()
            .map(|u| edgeroute_core::Prices {
                usd_per_mtok_in: u.usd_per_mtok_in,
                usd_per_mtok_out: u.usd_per_mtok_out,
            })
            .unwrap_or_default()
    }

    /// Where logs that are on by default go: `[node] state_dir`, else the
    /// user's state folder (never the folder the node was started from).
    pub fn state_dir_or_default(&self) -> PathBuf {
        if let Some(dir) = &self.node.state_dir {
            return dir.clone();
        }
        let base = std::env::var_os("XDG_STATE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".local/state"))
            })
            .unwrap_or_else(std::env::temp_dir);
        base.join("edgeroute")
    }
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct NodeConfig {
    /// Where the node keeps state across restarts (a policy's snapshot).
    /// None: nothing is persisted.
    pub state_dir: Option<PathBuf>,
    /// Append every decision and its outcome here (JSON lines, no prompt
    /// text), for `edgeroute policy replay`. None: no log.
    pub decision_log: Option<PathBuf>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Environment variable holding the admin bearer token. When it is
    /// unset or empty the admin endpoints are off.
    pub token_env: String,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            token_env: "EDGEROUTE_ADMIN_TOKEN".into(),
        }
    }
}

impl AdminConfig {
    pub fn token(&self) -> Option<String> {
        // A token that is only whitespace would be guessable: it counts as unset.
        std::env::var(&self.token_env)
            .ok()
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty())
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LocalConfig {
    /// Inference threads per generation. On a 2-core box one thread degrades
    /// gracefully under load while two can collapse, hence a knob.
    pub threads: u32,
    /// Requests waiting for or running on the local backend; beyond this a
    /// request is refused rather than queued without bound.
    pub max_queue: u32,
    /// Generations decoded together in one batch (continuous batching:
    /// one llama.cpp context, a sequence per generation).
    pub max_concurrent: u32,
    /// Longest prompt plus completion of one generation, in tokens.
    pub context_size: u32,
    /// The model's KV cache, in tokens (about 23 KiB each for
    /// SmolLM2-135M), allocated at start: running generations reserve
    /// their prompt plus completion budget, and finished ones stay in the
    /// rest for prefix reuse until the cells are needed. A request that
    /// does not fit beside the running ones waits if it may not leave the
    /// node (one that may is refused as unavailable and goes on to the
    /// guard's fallback). At least `context_size`.
    pub kv_budget_tokens: u32,
    pub models: Vec<ModelConfig>,
    /// The sentence-embedding model: `/v1/embeddings`, and the prompt
    /// embedding a policy may ask for. None: neither is available.
    pub embedding: Option<EmbeddingConfig>,
    /// A TEST backend instead of llama.cpp: each generation produces a
    /// fixed, labelled text at these speeds (the model file is still read
    /// for its tokenizer). For a fleet of nodes on one machine, where real
    /// models would measure the shared CPU instead of the placement.
    pub test_backend: Option<crate::nn::Pace>,
    /// Which requests offering tools the local model serves (with a
    /// tool-call grammar); the others go to an upstream.
    pub tool_calls: LocalToolCalls,
}

pub use edgeroute_request::tools::LocalToolCalls;

impl Default for LocalConfig {
    fn default() -> Self {
        Self {
            threads: 1,
            max_queue: 8,
            max_concurrent: 4,
            context_size: 2048,
            kv_budget_tokens: 8192,
            models: Vec::new(),
            embedding: None,
            test_backend: None,
            tool_calls: LocalToolCalls::default(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// The name clients and policies use (`model` in the request body).
    pub name: String,
    /// A GGUF file.
    pub path: PathBuf,
    /// When true a missing file leaves the node running without this model
    /// (requests that need it fail closed) instead of refusing to start.
    #[serde(default)]
    pub optional: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbeddingConfig {
    /// The name clients use in `/v1/embeddings` (`model`).
    pub name: String,
    /// A GGUF encoder with mean pooling (BERT-style).
    pub path: PathBuf,
    /// A policy's prompt embedding covers the last user message cut to
    /// this many tokens, which bounds its cost per request.
    #[serde(default = "default_feature_tokens")]
    pub feature_tokens: u32,
    /// As for a chat model: a missing file leaves the node running
    /// without embeddings instead of refusing to start.
    #[serde(default)]
    pub optional: bool,
}

/// The first 32 tokens say what kind of request it is; the encoder's cost
/// grows with the tokens (about 1.5 ms a token on one core here), so a
/// longer cut buys little for a routing hint.
fn default_feature_tokens() -> u32 {
    32
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct CloudConfig {
    pub upstreams: Vec<UpstreamConfig>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    pub name: String,
    /// OpenAI-compatible base URL, e.g. `https://api.example.com/v1`.
    pub base_url: String,
    /// The model name sent upstream.
    pub model: String,
    /// Name of the environment variable that holds the API key. The key
    /// itself never appears in config files or logs.
    #[serde(default)]
    pub api_key_env: Option<String>,
    #[serde(default)]
    pub usd_per_mtok_in: f64,
    #[serde(default)]
    pub usd_per_mtok_out: f64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// A policy `.wasm` component; empty means the embedded default policy.
    pub component: Option<PathBuf>,
    /// Deadline of one policy call.
    pub deadline_ms: u64,
    /// Linear memory cap of a policy instance.
    pub memory_limit_bytes: usize,
    pub on_failure: OnPolicyFailure,
    /// Swap in the component file whenever it changes on disk.
    pub watch: bool,
    /// Passed verbatim to the policy's `configure`.
    pub params: BTreeMap<String, String>,
    /// A streamed cascade holds back this many tokens of the local answer,
    /// judges their confidence, then streams them or escalates. More
    /// tokens judge better and delay the first byte longer.
    pub cascade_hold_tokens: u32,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            component: None,
            deadline_ms: 20,
            memory_limit_bytes: 64 << 20,
            on_failure: OnPolicyFailure::Local,
            watch: true,
            params: BTreeMap::new(),
            cascade_hold_tokens: 16,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GuardConfig {
    /// Sensitivity levels that may never leave the node. An unknown level
    /// is a config error naming it: a typo must not let data leave.
    pub never_leave: Vec<Sensitivity>,
    /// Raise a request to `restricted` when the prompt looks like it holds
    /// personal data, secrets or confidential prose (`crates/detect`).
    pub detect_pii: bool,
    /// The operator's own detectors: a kind and a regex.
    pub patterns: Vec<GuardPattern>,
    /// Regexes of text known to be harmless (a public test card number,
    /// the company's own support address); removed before detection.
    pub allow: Vec<String>,
    /// Confidential prose: one marking ("confidential") scores 1, a topic
    /// word (salary, diagnosis, lawsuit, merger, …) 0.5; at this score or
    /// more the request is restricted.
    pub prose_threshold: f32,
    /// Confidential prose, by the classifier trained on
    /// `crates/detect/prose-train/`: a text it gives this probability or
    /// more is restricted (either detector is enough); 1 turns it off.
    pub prose_classifier_threshold: f32,
    /// Levels that may not leave the node for the cloud but may go to a
    /// peer of the same trust zone (`[fleet] zone`). Empty by default:
    /// restricted data stays on its node.
    pub zone_levels: Vec<Sensitivity>,
}

impl Default for GuardConfig {
    fn default() -> Self {
        Self {
            never_leave: vec![Sensitivity::Restricted],
            detect_pii: true,
            patterns: Vec::new(),
            allow: Vec::new(),
            prose_threshold: 1.0,
            prose_classifier_threshold: edgeroute_detect::Settings::default()
                .prose_classifier_threshold,
            zone_levels: Vec::new(),
        }
    }
}

/// An operator's own detector: a kind and a regex.
pub use edgeroute_detect::Pattern as GuardPattern;

impl GuardConfig {
    pub fn may_leave(&self, level: Sensitivity) -> bool {
        !self.never_leave.contains(&level)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    pub max_body_bytes: usize,
    /// Upper bound on `max_tokens`; larger asks are clamped.
    pub max_completion_tokens: u32,
    /// Wall-clock limit of one cloud call.
    pub cloud_timeout_ms: u64,
    /// Largest policy component accepted by the admin API.
    pub max_component_bytes: usize,
    /// Open client connections. At the cap a new one takes the place of
    /// the one idle longest (no request in flight); when every one is
    /// busy, new ones wait in the backlog.
    pub max_connections: usize,
    /// A connection whose request head is not complete in this time is
    /// closed (a client slow to send its headers cannot hold it).
    pub header_read_timeout_ms: u64,
    /// A request body not complete in this time gets a 408 (a client slow
    /// to send its body cannot hold a connection either).
    pub body_read_timeout_ms: u64,
    /// On SIGTERM, requests in flight get this long to finish.
    pub shutdown_grace_ms: u64,
    /// After a request starts or ends, a connection thread with nothing
    /// to do polls this long before it sleeps (0: sleeps at once); see
    /// `serve/idle_poll.rs`.
    pub idle_poll_us: u64,
}

/// The longest `[limits] idle_poll_us` accepted: 10 ms.
pub const MAX_IDLE_POLL_US: u64 = 10_000;

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body_bytes: 1 << 20,
            max_completion_tokens: 1024,
            cloud_timeout_ms: 60_000,
            max_component_bytes: 64 << 20,
            max_connections: 1024,
            header_read_timeout_ms: 10_000,
            body_read_timeout_ms: 30_000,
            shutdown_grace_ms: 10_000,
            idle_poll_us: 500,
        }
    }
}

impl Config {
    /// `runtime-config/edgeroute.toml` as built into the binary. Its
    /// relative paths (the models) resolve against the current folder, so
    /// it suits what needs names and parameters, not files (`policy check`).
    pub fn embedded() -> anyhow::Result<Self> {
        Self::parse(
            include_str!("../../runtime-config/edgeroute.toml"),
            Path::new("."),
        )
        .context("invalid built-in config")
    }

    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}", path.display()))?;
        Self::parse(&text, path.parent().unwrap_or(Path::new(".")))
            .with_context(|| format!("invalid config file {}", path.display()))
    }

    /// Parse and validate config text; relative paths resolve against `base`.
    pub fn parse(text: &str, base: &Path) -> anyhow::Result<Self> {
        let mut config: Config = toml::from_str(text)?;
        config.resolve_paths(base);
        config.validate()?;
        Ok(config)
    }

    fn resolve_paths(&mut self, base: &Path) {
        if let Some(log) = &self.node.decision_log
            && log.is_relative()
        {
            self.node.decision_log = Some(base.join(log));
        }
        if let Some(dir) = &self.node.state_dir
            && dir.is_relative()
        {
            self.node.state_dir = Some(base.join(dir));
        }
        for model in &mut self.local.models {
            if model.path.is_relative() {
                model.path = base.join(&model.path);
            }
        }
        if let Some(embedding) = &mut self.local.embedding
            && embedding.path.is_relative()
        {
            embedding.path = base.join(&embedding.path);
        }
        if let Some(component) = &self.policy.component {
            if component.as_os_str().is_empty() {
                self.policy.component = None;
            } else if component.is_relative() {
                self.policy.component = Some(base.join(component));
            }
        }
    }

    /// The checks `load` runs; again after command-line overrides.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.local.max_concurrent == 0 {
            bail!("local.max_concurrent must be at least 1");
        }
        if self.local.kv_budget_tokens < self.local.context_size {
            bail!(
                "local.kv_budget_tokens ({}) must hold at least one full context (context_size = {})",
                self.local.kv_budget_tokens,
                self.local.context_size
            );
        }
        if self.local.threads == 0 {
            bail!("local.threads must be at least 1");
        }
        // Polling is for hand-offs microseconds apart; a longer window
        // only burns CPU.
        if self.limits.idle_poll_us > MAX_IDLE_POLL_US {
            bail!(
                "limits.idle_poll_us ({}) must be at most {MAX_IDLE_POLL_US} (0 turns polling off)",
                self.limits.idle_poll_us
            );
        }
        if let Some(pace) = &self.local.test_backend {
            let good = |x: f64| x.is_finite() && x > 0.0;
            if !good(pace.prefill_tokens_per_s) || !good(pace.decode_tokens_per_s) {
                bail!("local.test_backend: both speeds must be positive tokens per second");
            }
        }
        if let Some(embedding) = &self.local.embedding
            && embedding.feature_tokens == 0
        {
            bail!("local.embedding.feature_tokens must be at least 1");
        }
        // A NaN or infinite lexicon threshold would find nothing, silently.
        let t = self.guard.prose_threshold;
        if !(t.is_finite() && t > 0.0) {
            bail!("guard.prose_threshold must be a positive number, not {t}");
        }
        let t = self.guard.prose_classifier_threshold;
        if !(t > 0.0 && t <= 1.0) {
            bail!(
                "guard.prose_classifier_threshold must be in (0, 1] (1 turns the classifier off), not {t}"
            );
        }
        for (name, tenant) in &self.tenants {
            crate::tenants::check_name(name)?;
            for digest in &tenant.keys_sha256 {
                if digest.len() != 64 || !digest.bytes().all(|b| b.is_ascii_hexdigit()) {
                    bail!(
                        "tenants.{name}.keys_sha256: '{digest}' is not a SHA-256 in hex (64 characters); `edgeroute key new {name}` prints one"
                    );
                }
            }
            if name == crate::tenants::OPEN {
                bail!("tenants.{name}: the name '{name}' is kept for clients of an open node");
            }
        }
        if let Some(fleet) = &self.fleet {
            if fleet.node.is_empty() || fleet.peers.iter().any(|p| p.name == fleet.node) {
                bail!("fleet.node must be a name of its own, not empty and not one of fleet.peers");
            }
            if fleet.stale_ms <= fleet.report_ms {
                bail!("fleet.stale_ms must be longer than fleet.report_ms");
            }
        }
        let mut names: Vec<&str> = self.local.models.iter().map(|m| m.name.as_str()).collect();
        names.extend(self.cloud.upstreams.iter().map(|u| u.name.as_str()));
        let mut seen = std::collections::HashSet::new();
        for name in names {
            if !seen.insert(name) {
                bail!(
                    "target name '{name}' is used twice (models and upstreams share one namespace)"
                );
            }
        }
        Ok(())
    }

    /// Replace a configured upstream's base URL (`--upstream NAME=URL`).
    pub fn override_upstream(&mut self, spec: &str) -> anyhow::Result<()> {
        let (name, url) = spec
            .split_once('=')
            .with_context(|| format!("--upstream expects NAME=URL, got '{spec}'"))?;
        let upstream = self
            .cloud
            .upstreams
            .iter_mut()
            .find(|u| u.name == name)
            .with_context(|| format!("--upstream: no upstream named '{name}' in the config"))?;
        upstream.base_url = url.to_string();
        Ok(())
    }

    /// The node's name for a model a client asked for: a `[spin] models`
    /// alias, or the name itself.
    pub fn model_alias<'a>(&'a self, model: &'a str) -> &'a str {
        self.spin.models.get(model).map_or(model, String::as_str)
    }

    pub fn upstream(&self, name: &str) -> Option<&UpstreamConfig> {
        self.cloud.upstreams.iter().find(|u| u.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_misspelt_never_leave_level_refuses_to_start_and_names_it() {
        let error =
            Config::parse("[guard]\nnever_leave = [\"restriced\"]\n", Path::new(".")).unwrap_err();
        let message = format!("{error:#}");
        assert!(
            message.contains("unknown sensitivity level 'restriced'"),
            "{message}"
        );
    }

    #[test]
    fn never_leave_takes_levels_in_any_case() {
        let config = Config::parse(
            "[guard]\nnever_leave = [\"Internal\", \"restricted\"]\n",
            Path::new("."),
        )
        .unwrap();
        assert!(config.guard.may_leave(Sensitivity::Public));
        assert!(!config.guard.may_leave(Sensitivity::Internal));
        assert!(!config.guard.may_leave(Sensitivity::Restricted));
        assert!(!Config::default().guard.may_leave(Sensitivity::Restricted));
    }

    #[test]
    fn idle_polling_is_bounded() {
        let poll =
            |us: u64| Config::parse(&format!("[limits]\nidle_poll_us = {us}\n"), Path::new("."));
        assert_eq!(poll(0).unwrap().limits.idle_poll_us, 0);
        assert_eq!(
            poll(MAX_IDLE_POLL_US).unwrap().limits.idle_poll_us,
            MAX_IDLE_POLL_US
        );
        let error = format!("{:#}", poll(MAX_IDLE_POLL_US + 1).unwrap_err());
        assert!(error.contains("limits.idle_poll_us"), "{error}");
    }

    #[test]
    fn unknown_fields_and_shared_names_are_errors() {
        assert!(Config::parse("[guard]\nnever_leaves = []\n", Path::new(".")).is_err());
        let twice = "[[local.models]]\nname = \"a\"\npath = \"m.gguf\"\n[[cloud.upstreams]]\nname = \"a\"\nbase_url = \"http://127.0.0.1:1/v1\"\nmodel = \"m\"\n";
        let error = format!("{:#}", Config::parse(twice, Path::new("/etc")).unwrap_err());
        assert!(error.contains("'a' is used twice"), "{error}");
    }

    #[test]
    fn the_test_backend_needs_positive_speeds_and_the_fleet_a_known_choice() {
        let pace = |p: &str, d: &str| {
            let toml = format!(
                "[local.test_backend]\nprefill_tokens_per_s = {p}\ndecode_tokens_per_s = {d}\n"
            );
            Config::parse(&toml, Path::new(".")).map(|c| c.local.test_backend)
        };
        let paced = pace("120.0", "60.0").unwrap().unwrap();
        assert_eq!(paced.decode_tokens_per_s, 60.0);
        for (p, d) in [("0.0", "60.0"), ("120.0", "-1.0"), ("nan", "60.0")] {
            let error = format!("{:#}", pace(p, d).unwrap_err());
            assert!(error.contains("local.test_backend"), "{p}, {d}: {error}");
        }
        let fleet = |choice: &str| {
            Config::parse(
                &format!("[fleet]\nnode = \"a\"\nchoice = \"{choice}\"\n"),
                Path::new("."),
            )
        };
        let random = fleet("random").unwrap();
        assert_eq!(random.fleet.unwrap().choice, PeerChoice::Random);
        assert!(fleet("fastest").is_err());
    }
}
