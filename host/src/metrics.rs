//! `GET /metrics`: the node in Prometheus text format (0.0.4), with the
//! official `prometheus-client` crate. It was chosen over `metrics` + an
//! exporter because it is the Prometheus project's own, has typed label
//! sets, and encodes the classic text format that `promtool check metrics`
//! and every scraper read.
//!
//! Two kinds of series:
//! - what only the pipeline sees (a request's placement, duration, time to
//!   first token, the policy call's duration) is recorded here, per request;
//! - what another part already counts (queue depth, egress decisions,
//!   swaps, shadow agreement, policy failures, ledger money) is read from
//!   that part at scrape time, so no number is kept twice.

use crate::node::Node;
use edgeroute_core::TargetKind;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// The `Content-Type` of `GET /metrics`.
pub use prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    placement: &'static str,
    reason: &'static str,
    sensitivity: &'static str,
    status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PlacementLabels {
    placement: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabels {
    policy: String,
}

/// A configured upstream, by its name in the config (a bounded set).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UpstreamLabels {
    upstream: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CauseLabels {
    cause: &'static str,
}

/// Why a request ended where it did, in a handful of classes (the reason
/// text itself is unbounded, so it is no label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasonClass {
    /// Where the policy placed it (a cascade's first target included).
    Policy,
    /// A cascade's second target, after a low-confidence local answer.
    Escalated,
    /// Another target after the first one failed or was busy.
    Fallback,
    /// The guard put it somewhere the policy did not name (sensitivity,
    /// an unknown target, a prompt too long for the local model).
    Override,
    /// The policy failed and the node's safe default placed it.
    PolicyFailure,
    Refused,
    /// A cloud call a Spin gateway made itself and reported
    /// (`POST /v1/gateway/egress`).
    Reported,
}

impl ReasonClass {
    fn label(self) -> &'static str {
        match self {
            ReasonClass::Policy => "policy",
            ReasonClass::Escalated => "escalated",
            ReasonClass::Fallback => "fallback",
            ReasonClass::Override => "override",
            ReasonClass::PolicyFailure => "policy_failure",
            ReasonClass::Refused => "refused",
            ReasonClass::Reported => "reported",
        }
    }
}

/// One finished request, as the pipeline saw it.
pub struct Finished {
    /// None when it was refused before any target.
    pub placement: Option<TargetKind>,
    pub reason: ReasonClass,
    pub sensitivity: &'static str,
    pub ok: bool,
    pub duration: Duration,
    /// From the request's arrival to the first text, when it streamed.
    pub first_text: Option<Duration>,
    pub completion_tokens: u32,
}

/// Request-path series. Families are `Arc`s inside, so a scrape clones
/// them into its registry instead of locking the node.
pub struct Metrics {
    requests: Family<RequestLabels, Counter>,
    duration: Family<PlacementLabels, Histogram>,
    first_token: Family<PlacementLabels, Histogram>,
    tokens_per_second: Family<PlacementLabels, Histogram>,
    policy_call: Family<PolicyLabels, Histogram>,
    upstream_wait: Family<UpstreamLabels, Histogram>,
    refusals: Family<CauseLabels, Counter>,
}

/// Seconds, from a fast local answer to a slow cloud one.
const LATENCY_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];
const TOKENS_PER_SECOND_BUCKETS: [f64; 10] =
    [1.0, 2.0, 5.0, 10.0, 20.0, 40.0, 60.0, 100.0, 200.0, 500.0];
/// A policy call takes microseconds; its deadline is tens of milliseconds.
const POLICY_CALL_BUCKETS: [f64; 12] = [
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 1e-3, 5e-3, 2e-2, 0.1,
];

impl Default for Metrics {
    fn default() -> Self {
        Self {
            requests: Family::default(),
            duration: Family::new_with_constructor(|| Histogram::new(LATENCY_BUCKETS)),
            first_token: Family::new_with_constructor(|| Histogram::new(LATENCY_BUCKETS)),
            tokens_per_second: Family::new_with_constructor(|| {
                Histogram::new(TOKENS_PER_SECOND_BUCKETS)
            }),
            policy_call: Family::new_with_constructor(|| Histogram::new(POLICY_CALL_BUCKETS)),
            upstream_wait: Family::new_with_constructor(|| Histogram::new(LATENCY_BUCKETS)),
            refusals: Family::default(),
        }
    }
}

fn placement(kind: Option<TargetKind>) -> &'static str {
    kind.map_or("none", TargetKind::name)
}

impl Metrics {
    pub fn request(&self, r: &Finished) {
        let status = match (r.placement, r.ok) {
            (None, _) => "refused",
            (Some(_), true) => "ok",
            (Some(_), false) => "error",
        };
        self.requests
            .get_or_create(&RequestLabels {
                placement: placement(r.placement),
                reason: r.reason.label(),
                sensitivity: r.sensitivity,
                status,
            })
            .inc();
        let Some(kind) = r.placement else { return };
        let labels = PlacementLabels {
            placement: kind.name(),
        };
        self.duration
            .get_or_create(&labels)
            .observe(r.duration.as_secs_f64());
        if !r.ok {
            return;
        }
        if let Some(first) = r.first_text {
            self.first_token
                .get_or_create(&labels)
                .observe(first.as_secs_f64());
        }
        // Decode speed: tokens after the first over the time they took
        // (the whole answer's time when it did not stream).
        let generating = r.duration.saturating_sub(r.first_text.unwrap_or_default());
        if r.completion_tokens > 1 && !generating.is_zero() {
            self.tokens_per_second
                .get_or_create(&labels)
                .observe(f64::from(r.completion_tokens - 1) / generating.as_secs_f64());
        }
    }

    pub fn policy_call(&self, policy: &str, took: Duration) {
        self.policy_call
            .get_or_create(&PolicyLabels {
                policy: policy.to_string(),
            })
            .observe(took.as_secs_f64());
    }

    /// A cloud call's wait on its upstream for the first answer bytes: beside
    /// `request_duration_seconds{placement="cloud"}`, whether the upstream
    /// or the node was slow.
    pub fn upstream_wait(&self, upstream: &str, took: Duration) {
        self.upstream_wait
            .get_or_create(&UpstreamLabels {
                upstream: upstream.to_string(),
            })
            .observe(took.as_secs_f64());
    }

    pub fn refusal(&self, cause: &'static str) {
        self.refusals.get_or_create(&CauseLabels { cause }).inc();
    }

    /// The whole exposition: this node's request series and the live
    /// values of its parts.
    pub fn render(&self, node: &Node) -> String {
        let mut registry = Registry::with_prefix("edgeroute");
        registry.register(
            "requests",
            "Requests by placement, reason class, sensitivity and status",
            self.requests.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Time from a request's arrival to its end, by placement",
            self.duration.clone(),
        );
        registry.register(
            "time_to_first_token_seconds",
            "Time from a request's arrival to its first streamed text, by placement",
            self.first_token.clone(),
        );
        registry.register(
            "generation_tokens_per_second",
            "Decode speed of an answer after its first token, by placement",
            self.tokens_per_second.clone(),
        );
        registry.register(
            "policy_call_duration_seconds",
            "Duration of the policy's route call, by policy version",
            self.policy_call.clone(),
        );
        registry.register(
            "upstream_wait_seconds",
            "Time from a cloud call's request to its upstream's first answer bytes (a stream's first chunk; an error's body too; a new connection's setup included; calls that timed out first are not counted), by upstream",
            self.upstream_wait.clone(),
        );
        registry.register(
            "refusals",
            "Requests refused, by cause (the error code)",
            self.refusals.clone(),
        );
        live(&mut registry, node);
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut text, &registry);
        text
    }
}

fn counter(registry: &mut Registry, name: &str, help: &str, value: u64) {
    registry.register(name, help, ConstCounter::new(value));
}

fn gauge(registry: &mut Registry, name: &str, help: &str, value: f64) {
    registry.register(name, help, ConstGauge::new(value));
}

/// A labelled family whose values are read at scrape time (a `Family`
/// builds each member from one constructor, so it cannot hold them).
#[derive(Debug)]
struct Samples {
    name: &'static str,
    help: &'static str,
    kind: MetricType,
    samples: Vec<(Vec<(&'static str, String)>, f64)>,
}

impl Samples {
    fn new(name: &'static str, help: &'static str, kind: MetricType) -> Self {
        Self {
            name,
            help,
            kind,
            samples: Vec::new(),
        }
    }

    fn add(&mut self, labels: &[(&'static str, &str)], value: f64) {
        let labels = labels.iter().map(|(k, v)| (*k, v.to_string())).collect();
        self.samples.push((labels, value));
    }
}

impl Collector for Samples {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut metric = encoder.encode_descriptor(self.name, self.help, None, self.kind)?;
        for (labels, value) in &self.samples {
            let member = metric.encode_family(labels)?;
            match self.kind {
                MetricType::Counter => ConstCounter::new(*value).encode(member)?,
                _ => ConstGauge::new(*value).encode(member)?,
            }
        }
        Ok(())
    }
}

/// A file name, not the node's directory layout (as `/healthz`).
fn file_name(source: &str) -> String {
    std::path::Path::new(source)
        .file_name()
        .map_or_else(|| source.to_string(), |n| n.to_string_lossy().into_owned())
}

/// Values other parts of the node keep, read now.
fn live(registry: &mut Registry, node: &Node) {
    let mut build = Samples::new(
        "build_info",
        "The edgeroute build (always 1)",
        MetricType::Gauge,
    );
    build.add(&[("version", env!("CARGO_PKG_VERSION"))], 1.0);
    registry.register_collector(Box::new(build));

    let active = node.policy.current();
    let mut info = Samples::new(
        "policy_info",
        "The active policy version (always 1)",
        MetricType::Gauge,
    );
    info.add(
        &[
            ("policy", &active.id),
            ("source", &file_name(&active.source)),
        ],
        1.0,
    );
    registry.register_collector(Box::new(info));

    let mut failures = Samples::new(
        "policy_failures",
        "Policy calls that trapped, ran past their deadline or out of memory, by version",
        MetricType::Counter,
    );
    let mut versions = node.policy.previous();
    versions.push(active.clone());
    for version in &versions {
        for (kind, n) in version.failure_counts() {
            if n > 0 {
                failures.add(&[("policy", &version.id), ("kind", kind)], n as f64);
            }
        }
    }
    registry.register_collector(Box::new(failures));

    let (swaps, rollbacks) = node.policy.changes();
    counter(
        registry,
        "policy_swaps",
        "Policy versions swapped in",
        swaps,
    );
    counter(
        registry,
        "policy_rollbacks",
        "Rollbacks to a previous policy version",
        rollbacks,
    );
    let (compared, agreed) = node.shadow.counts();
    counter(
        registry,
        "shadow_compared",
        "Requests the shadow candidate policy also decided",
        compared,
    );
    counter(
        registry,
        "shadow_agreed",
        "Requests the shadow candidate decided as the live policy did",
        agreed,
    );

    gauge(
        registry,
        "local_queue_depth",
        "Requests waiting for or running on the local model",
        f64::from(node.local.queue_depth()),
    );
    gauge(
        registry,
        "local_running",
        "Generations running on the local model",
        f64::from(node.local.running()),
    );
    // The batch scheduler of each model: KV cells in use against its budget.
    let mut kv_used = Samples::new(
        "local_kv_used_tokens",
        "KV cells reserved by running sequences or held by idle ones, by model",
        MetricType::Gauge,
    );
    let mut kv_budget = Samples::new(
        "local_kv_budget_tokens",
        "KV cells of the model's batch context, by model",
        MetricType::Gauge,
    );
    let mut waiting = Samples::new(
        "local_batch_waiting",
        "Requests waiting for KV cells beside the running ones, by model",
        MetricType::Gauge,
    );
    for name in node.local.model_names() {
        if let Some(load) = node.local.batch_load(&name) {
            kv_used.add(&[("model", &name)], f64::from(load.kv_used));
            kv_budget.add(&[("model", &name)], f64::from(load.kv_budget));
            waiting.add(&[("model", &name)], f64::from(load.waiting));
        }
    }
    registry.register_collector(Box::new(kv_used));
    registry.register_collector(Box::new(kv_budget));
    registry.register_collector(Box::new(waiting));
    // The fleet as this node sees it, one sample per known peer.
    if let Some(fleet) = &node.fleet {
        let mut fresh = Samples::new(
            "fleet_peer_fresh",
            "1 when the peer's last load report is fresh and it took connections, by peer",
            MetricType::Gauge,
        );
        let mut wait = Samples::new(
            "fleet_peer_wait_seconds",
            "The peer's reported wait for a local slot, by peer",
            MetricType::Gauge,
        );
        let mut open = Samples::new(
            "fleet_forwarded_open",
            "Requests this node forwarded to the peer that have not ended, by peer",
            MetricType::Gauge,
        );
        for peer in fleet.peer_loads() {
            let labels = [("peer", peer.name.as_str())];
            fresh.add(&labels, f64::from(u8::from(peer.fresh)));
            wait.add(&labels, f64::from(peer.wait_ms) / 1e3);
            open.add(&labels, f64::from(peer.open));
        }
        registry.register_collector(Box::new(fresh));
        registry.register_collector(Box::new(wait));
        registry.register_collector(Box::new(open));
    }
    gauge(
        registry,
        "local_estimated_wait_seconds",
        "Estimated wait for a local generation slot",
        node.local.wait_ms() as f64 / 1e3,
    );

    let audit = &node.cloud.audit;
    counter(
        registry,
        "egress_allowed",
        "Outgoing requests the egress guard let out",
        audit.allowed.load(Ordering::Relaxed),
    );
    let mut refused = Samples::new(
        "egress_refused",
        "Outgoing requests the egress guard refused, by reason",
        MetricType::Counter,
    );
    for (reason, n) in [
        ("sensitivity", &audit.refused_sensitive),
        ("host", &audit.refused_host),
    ] {
        refused.add(&[("reason", reason)], n.load(Ordering::Relaxed) as f64);
    }
    registry.register_collector(Box::new(refused));
    counter(
        registry,
        "cloud_fetch_unpooled",
        "Cloud calls that found every pooled cloud-fetch instance busy and instantiated afresh",
        node.cloud.overflowed(),
    );

    // The process's, not the node's: connection threads serve whichever
    // node listens on them.
    registry.register(
        "idle_poll_seconds",
        "Time connection threads spent in polling rounds before sleeping, not counting the work found or what ran while a round yielded the core ([limits] idle_poll_us)",
        ConstCounter::new(crate::serve::idle_poll::polled().as_secs_f64()),
    );

    let totals = node.ledger.totals();
    registry.register(
        "cloud_spend_usd",
        "What cloud answers cost, at the upstreams' prices",
        ConstCounter::new(totals.cloud_cost_usd),
    );
    registry.register(
        "cloud_cost_avoided_usd",
        "What local answers would have cost at the reference upstream's prices",
        ConstCounter::new(totals.cost_avoided_usd),
    );
}
