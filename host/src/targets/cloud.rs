//! The cloud target: the cloud-fetch component calling an OpenAI-compatible
//! upstream over `wasi:http`. The host gives each call the upstream's URL,
//! and the egress guard decides what may actually leave; the upstream's key
//! stays in the host, which adds it to the requests the guard lets out.

use super::{Job, TargetFailure, TargetResult, trapped};
use crate::audit::Event;
use crate::bindings::target::TargetPre;
use crate::config::UpstreamConfig;
use crate::egress::{self, CallMeter, Credential, EgressAudit, EgressHooks};
use crate::per_thread::ClientPerThread;
use crate::runtime::roles::cloud_fetch::{self, CloudState};
use crate::runtime::roles::{self, Role};
use crate::runtime::{self, NO_DEADLINE, Sink};
use anyhow::Context;
use edgeroute_core::{Estimate, Features, Speed};
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use wasmtime::component::ResourceTable;
use wasmtime::{Engine, Store};
use wasmtime_wasi_http::WasiHttpCtx;

/// An upstream as the node uses it, with its key read once at start.
pub struct Upstream {
    pub config: UpstreamConfig,
    credential: Option<Credential>,
    /// How fast it has answered (EWMAs), for the router's estimates.
    speed: Mutex<Speed>,
}

/// The upstream's key, read once from the variable the config names.
fn credential(upstream: &UpstreamConfig) -> anyhow::Result<Option<Credential>> {
    let Some(var) = &upstream.api_key_env else {
        return Ok(None);
    };
    let name = &upstream.name;
    match std::env::var(var) {
        Ok(key) if !key.is_empty() => Credential::bearer(&upstream.base_url, &key)
            .map(Some)
            .with_context(|| format!("upstream '{name}': the key in {var} cannot be sent")),
        _ => {
            tracing::warn!(upstream = %name, env = %var, "API key variable is not set or empty; calling without a key");
            Ok(None)
        }
    }
}

/// The environment of a cloud-fetch instance: where its upstream is, and
/// nothing secret. The key is the host's to add (see `egress`).
fn guest_env(upstream: &Upstream) -> Vec<(&str, &str)> {
    vec![("EDGEROUTE_UPSTREAM_URL", upstream.config.base_url.as_str())]
}

pub struct CloudTarget {
    /// The fetcher on pooled instances, while fewer than [`POOL_SLOTS`]
    /// calls run; None when the component does not fit a pool slot.
    pooled: Option<Pooled>,
    /// The fetcher on the node's engine: every call past the pool's.
    engine: Engine,
    pre: TargetPre<CloudState>,
    upstreams: BTreeMap<String, Upstream>,
    allowed_hosts: Arc<HashSet<String>>,
    timeout: Duration,
    pub audit: Arc<EgressAudit>,
    /// Pools of connections for every call to every upstream, one per thread.
    clients: Arc<ClientPerThread>,
}

/// Calls that run on pooled instances at once; more take a fresh instance
/// each (an `mmap` and page faults, ~30 µs more). An agent's calls are
/// sequential, and 64 streams open at once is a busy edge node.
pub const POOL_SLOTS: u32 = 64;

struct Pooled {
    engine: Engine,
    pre: TargetPre<CloudState>,
    /// One permit per slot, held until the call's store is dropped.
    slots: Arc<tokio::sync::Semaphore>,
    /// Calls that found every slot taken (logged the first time).
    overflowed: std::sync::atomic::AtomicU64,
    size: u32,
}

/// The client request behind a cloud call, as the egress guard sees it:
/// whether it may leave the node (checked on every outgoing HTTP request),
/// and what the audit log records about it (never its text).
#[derive(Debug, Clone, Default)]
pub struct Taint {
    pub request_id: String,
    pub may_leave: bool,
    /// The policy version that placed it, and why.
    pub policy: String,
    pub reason: String,
    pub sensitivity: &'static str,
    /// As the node counted them (an upstream's own count wins when given).
    pub prompt_tokens: u32,
    /// Its level may go to a peer of this node's trust zone
    /// (`[guard] zone_levels`), though not to the cloud.
    pub may_stay_in_zone: bool,
}

impl Taint {
    /// A request that may leave the node, known only by its id
    /// (benchmarks and tests).
    pub fn may_leave(request_id: &str) -> Self {
        Self {
            request_id: request_id.into(),
            may_leave: true,
            ..Self::default()
        }
    }
}

impl CloudTarget {
    pub fn new(
        engine: &Engine,
        fetcher: &[u8],
        upstreams: &[UpstreamConfig],
        timeout: Duration,
        audit_log: Option<crate::audit::AuditLog>,
    ) -> anyhow::Result<Self> {
        Self::with_pool(engine, fetcher, upstreams, timeout, audit_log, POOL_SLOTS)
    }

    /// [`Self::new`] with `slots` pooled instances; 0: none, every call
    /// instantiates afresh (the benchmark's baseline; a test makes the
    /// pool small to fill it).
    pub(crate) fn with_pool(
        engine: &Engine,
        fetcher: &[u8],
        upstreams: &[UpstreamConfig],
        timeout: Duration,
        audit_log: Option<crate::audit::AuditLog>,
        slots: u32,
    ) -> anyhow::Result<Self> {
        let pre = prepare(engine, fetcher)?;
        let pooled = match (slots > 0)
            .then(|| {
                runtime::pooled_engine(slots)
                    .and_then(|engine| Ok((prepare(&engine, fetcher)?, engine)))
            })
            .transpose()
        {
            Ok(None) => None,
            Ok(Some((pre, engine))) => Some(Pooled {
                engine,
                pre,
                slots: Arc::new(tokio::sync::Semaphore::new(slots as usize)),
                overflowed: Default::default(),
                size: slots,
            }),
            Err(error) => {
                tracing::warn!(error = %format!("{error:#}"), "cloud-fetch cannot run on pooled instances; every call instantiates afresh");
                None
            }
        };

        let mut allowed = HashSet::new();
        let mut by_name = BTreeMap::new();
        for upstream in upstreams {
            allowed.insert(egress::upstream_authority(&upstream.base_url)?);
            by_name.insert(
                upstream.name.clone(),
                Upstream {
                    config: upstream.clone(),
                    credential: credential(upstream)?,
                    speed: Mutex::default(),
                },
            );
        }
        Ok(Self {
            pooled,
            engine: engine.clone(),
            pre,
            upstreams: by_name,
            allowed_hosts: Arc::new(allowed),
            timeout,
            audit: Arc::new(EgressAudit::with_log(audit_log)),
            clients: Arc::new(ClientPerThread::new(crate::egress::upstream_client)?),
        })
    }

    pub fn upstream(&self, name: &str) -> Option<&UpstreamConfig> {
        self.upstreams.get(name).map(|u| &u.config)
    }

    pub fn upstream_names(&self) -> Vec<String> {
        self.upstreams.keys().cloned().collect()
    }

    /// Record how long a successful call took: `ttft_ms` when it streamed.
    pub fn observe_speed(&self, name: &str, ttft_ms: Option<f64>, total_ms: f64, tokens: u32) {
        if let Some(upstream) = self.upstreams.get(name) {
            let mut speed = upstream.speed.lock().unwrap_or_else(|p| p.into_inner());
            speed.observe_remote(ttft_ms, total_ms, tokens);
        }
    }

    /// The estimate for each upstream that has answered before.
    pub fn estimates(&self, features: &Features) -> Vec<(String, Estimate)> {
        let estimate = |u: &Upstream| {
            let speed = u.speed.lock().unwrap_or_else(|p| p.into_inner());
            speed.estimate(features.prompt_tokens, features.max_tokens, 0.0)
        };
        self.upstreams
            .iter()
            .filter_map(|(name, u)| Some((name.clone(), estimate(u)?)))
            .collect()
    }

    pub async fn generate(&self, upstream: &str, mut job: Job, taint: Taint) -> TargetResult {
        let upstream = self
            .upstreams
            .get(upstream)
            .ok_or_else(|| TargetFailure::Unavailable(format!("no upstream named '{upstream}'")))?;
        job.request.model = upstream.config.model.clone();
        let env = guest_env(upstream);
        let call = Arc::new(CallMeter::default());
        let target = format!("cloud:{}", upstream.config.name);
        let audited = taint.clone();
        let state = CloudState {
            wasi: runtime::wasi(&env),
            table: ResourceTable::new(),
            http: WasiHttpCtx::new(),
            hooks: EgressHooks {
                allowed_hosts: self.allowed_hosts.clone(),
                taint,
                target: target.clone(),
                audit: self.audit.clone(),
                call: call.clone(),
                meter: job.meter.clone(),
                credential: upstream.credential.clone(),
                clients: self.clients.clone(),
            },
            sink: Sink {
                tx: job.stream,
                waiting: job.waiting,
            },
        };
        // Declared before the store, so dropped after it: the slot is free
        // only once the instance in it is gone.
        let (_slot, engine, pre) = self.instance_for_call();
        let mut store = Store::new(engine, state);
        store.set_epoch_deadline(NO_DEADLINE);
        let calling = async {
            let target = pre.instantiate_async(&mut store).await.map_err(trapped)?;
            target
                .edgeroute_routing_generator()
                .call_generate(&mut store, &job.request)
                .await
                .map_err(trapped)?
                .map_err(TargetFailure::from)
        };
        let result = match tokio::time::timeout(self.timeout, calling).await {
            Ok(result) => result,
            Err(_) => Err(TargetFailure::Timeout(self.timeout.as_millis() as u64)),
        };
        self.audit_call(&call, &audited, &target, &result);
        match &upstream.credential {
            Some(credential) => result.map_err(|failure| redact(failure, credential)),
            None => result,
        }
    }
}

/// The cloud-fetch component compiled for `engine`, checked against its role.
fn prepare(engine: &Engine, fetcher: &[u8]) -> anyhow::Result<TargetPre<CloudState>> {
    let component = roles::compile(engine, fetcher, Role::CloudFetch, "cloud-fetch")?;
    Ok(TargetPre::new(
        cloud_fetch::linker(engine)?.instantiate_pre(&component)?,
    )?)
}

impl CloudTarget {
    /// Where this call's instance comes from: a free pool slot (held by
    /// the permit), or else a fresh instance on the node's engine.
    fn instance_for_call(
        &self,
    ) -> (
        Option<tokio::sync::OwnedSemaphorePermit>,
        &Engine,
        &TargetPre<CloudState>,
    ) {
        if let Some(pooled) = &self.pooled {
            match pooled.slots.clone().try_acquire_owned() {
                Ok(permit) => return (Some(permit), &pooled.engine, &pooled.pre),
                Err(_) => {
                    if pooled.overflowed.fetch_add(1, Ordering::Relaxed) == 0 {
                        tracing::info!(
                            slots = pooled.size,
                            "more cloud calls at once than pooled instances; the rest instantiate afresh"
                        );
                    }
                }
            }
        }
        (None, &self.engine, &self.pre)
    }

    /// Calls that found every pool slot taken.
    pub fn overflowed(&self) -> u64 {
        self.pooled
            .as_ref()
            .map_or(0, |p| p.overflowed.load(Ordering::Relaxed))
    }

    /// One audit line for a call that got past the egress guard: its data
    /// left, whether or not the upstream answered.
    fn audit_call(&self, call: &CallMeter, taint: &Taint, target: &str, result: &TargetResult) {
        if call.sends.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut record = self.audit.record(Event::Egress, taint, target);
        record.host = call.host.lock().unwrap_or_else(|p| p.into_inner()).clone();
        record.bytes_sent = call.bytes.load(Ordering::Relaxed);
        if let Ok(completion) = result {
            record.ok = true;
            if completion.usage.prompt_tokens > 0 {
                record.prompt_tokens = completion.usage.prompt_tokens;
            }
            record.completion_tokens = completion.usage.completion_tokens;
        }
        self.audit.write(record);
    }
}

/// An upstream may echo the key back in an error body, which the component
/// passes on; the host, which alone holds the key, takes it out.
fn redact(failure: TargetFailure, credential: &Credential) -> TargetFailure {
    match failure {
        TargetFailure::Unavailable(m) => TargetFailure::Unavailable(credential.redact(&m)),
        TargetFailure::BadRequest(m) => TargetFailure::BadRequest(credential.redact(&m)),
        TargetFailure::Upstream(m) => TargetFailure::Upstream(credential.redact(&m)),
        TargetFailure::RateLimited {
            message,
            retry_after_s,
        } => TargetFailure::RateLimited {
            message: credential.redact(&message),
            retry_after_s,
        },
        TargetFailure::Internal(m) => TargetFailure::Internal(credential.redact(&m)),
        other => other,
    }
}

impl super::Backend for CloudTarget {
    fn names(&self) -> Vec<String> {
        self.upstream_names()
    }

    fn generate<'a>(&'a self, name: &'a str, job: Job, taint: Taint) -> super::Generating<'a> {
        Box::pin(CloudTarget::generate(self, name, job, taint))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> crate::bindings::target::ChatRequest {
        crate::targets::greedy_request(Vec::new(), 1)
    }

    /// The real fetcher with one pool slot, as upstream `name`: a loopback
    /// server that answers one word after `round_trip` and records bodies.
    async fn one_slot_before(
        name: &str,
        round_trip: Duration,
    ) -> (crate::bench::upstream::Simulated, CloudTarget) {
        let timing = crate::bench::upstream::Timing {
            round_trip,
            server_ttft: Duration::ZERO,
            tokens_per_s: 1e9,
        };
        let upstream = crate::bench::upstream::start(timing).await.unwrap();
        let config = UpstreamConfig {
            name: name.into(),
            base_url: upstream.base_url.clone(),
            model: "m".into(),
            api_key_env: None,
            usd_per_mtok_in: 0.0,
            usd_per_mtok_out: 0.0,
        };
        let engine = crate::runtime::engine().unwrap();
        let fetcher = crate::components::CLOUD_FETCH;
        let timeout = Duration::from_secs(30);
        let cloud = CloudTarget::with_pool(&engine, fetcher, &[config], timeout, None, 1).unwrap();
        (upstream, cloud)
    }

    /// Past the pool's slots a call takes a fresh instance and still gets
    /// its answer; a slot is free again once its call has ended.
    #[tokio::test]
    async fn calls_past_the_pool_take_fresh_instances() {
        let (upstream, cloud) = one_slot_before("slow", Duration::from_millis(300)).await;
        assert!(cloud.pooled.is_some(), "the fetcher fits a pool slot");
        let call = || cloud.generate("slow", Job::new(request()), Taint::may_leave("pool"));
        // Each holds its instance for the upstream's 300 ms: one slot, three calls.
        let (a, b, c) = tokio::join!(call(), call(), call());
        for answer in [a, b, c] {
            assert_eq!(answer.unwrap().text, "word");
        }
        assert_eq!(cloud.overflowed(), 2);
        assert_eq!(call().await.unwrap().text, "word");
        assert_eq!(cloud.overflowed(), 2, "the slot was free again");
        assert_eq!(upstream.received.lock().unwrap().len(), 4);
    }

    /// The fetcher runs on a 128 KiB stack (components/cloud-fetch/build.rs)
    /// and parses, rewrites and encodes the client's body recursively: the
    /// deepest body the node's parser lets through (serde_json's recursion
    /// limit) still goes out whole.
    #[tokio::test]
    async fn the_deepest_body_a_client_may_send_fits_the_fetchers_stack() {
        let nested = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        let body = |depth: usize| {
            format!(
                r#"{{"model":"auto","messages":[{{"role":"user","content":"hi"}}],"deep":{}}}"#,
                nested(depth)
            )
        };
        let parses = |depth: usize| serde_json::from_str::<serde_json::Value>(&body(depth)).is_ok();
        let deepest = (1..1000).take_while(|&d| parses(d)).last().unwrap();
        assert!(deepest > 100, "serde_json's limit is 128 levels: {deepest}");
        let (upstream, cloud) = one_slot_before("deep", Duration::ZERO).await;
        let mut request = request();
        request.passthrough = Some(body(deepest));
        let answer = cloud
            .generate("deep", Job::new(request), Taint::may_leave("deep"))
            .await
            .unwrap();
        assert_eq!(answer.text, "word");
        let sent = upstream.received.lock().unwrap()[0].clone();
        assert!(
            String::from_utf8_lossy(&sent).contains(&nested(deepest)),
            "the nesting went out whole"
        );
    }

    #[test]
    fn the_guest_environment_holds_no_key() {
        let key = "sk-test-secret";
        let config: UpstreamConfig = toml::from_str(
            r#"
            name = "test"
            base_url = "https://api.example.com/v1"
            model = "m"
            api_key_env = "EDGEROUTE_TEST_UPSTREAM_KEY"
            "#,
        )
        .unwrap();
        let upstream = Upstream {
            credential: Some(Credential::bearer(&config.base_url, key).unwrap()),
            config,
            speed: Mutex::default(),
        };
        let env = guest_env(&upstream);
        assert!(
            env.contains(&("EDGEROUTE_UPSTREAM_URL", "https://api.example.com/v1")),
            "{env:?}"
        );
        for (name, value) in env {
            assert!(!name.to_ascii_uppercase().contains("KEY"), "{name}");
            assert!(!value.contains(key), "{name} holds the key");
        }
    }

    fn snoop() -> Vec<u8> {
        std::fs::read(concat!(
            env!("EDGEROUTE_COMPONENTS_DIR"),
            "/cloud_fetch_snoop.wasm"
        ))
        .unwrap()
    }

    /// A pooled slot is wiped between calls: what one call left in its
    /// memory (a returned stack frame, a static, a heap block never freed,
    /// the request it was given) is not there for the next call in the
    /// same slot.
    #[tokio::test]
    async fn a_pooled_slot_keeps_nothing_of_the_previous_call() {
        let config: UpstreamConfig = toml::from_str(
            r#"
            name = "snooped"
            base_url = "http://127.0.0.1:9/v1"
            model = "m"
            "#,
        )
        .unwrap();
        let engine = crate::runtime::engine().unwrap();
        let timeout = Duration::from_secs(30);
        let cloud = CloudTarget::with_pool(&engine, &snoop(), &[config], timeout, None, 1).unwrap();
        assert!(cloud.pooled.is_some(), "the snoop fits a pool slot");
        let say = |text: String| {
            let mut request = request();
            request.messages = vec![crate::bindings::target::Message {
                role: "user".into(),
                content: text,
            }];
            cloud.generate("snooped", Job::new(request), Taint::may_leave("snoop"))
        };
        // Kept backwards and searched for forwards, so the search's own
        // request does not hold what it looks for.
        let forwards = "the-previous-call-left-this";
        let backwards: String = forwards.chars().rev().collect();
        let kept = say(format!("keep:{backwards}")).await.unwrap().text;
        let at: Vec<usize> = kept
            .strip_prefix("kept at ")
            .map(|list| list.split(',').filter_map(|a| a.parse().ok()).collect())
            .unwrap_or_else(|| panic!("{kept}"));
        assert!(
            at.len() >= 5,
            "the request's copy, the stack's, the static's and the two leaked blocks': {kept}"
        );
        // Both ways a slot is wiped are tried: the stack (below the statics,
        // which the 128 KiB stack puts at 128 KiB) lies in the part that is
        // overwritten in place, the end of the leaked mebibyte in the part
        // handed back to the kernel.
        assert!(
            at.iter().any(|&a| a < 128 << 10),
            "a copy on the stack: {kept}"
        );
        assert!(
            at.iter().any(|&a| a >= runtime::POOL_KEEP_RESIDENT),
            "a copy past the kept part: {kept}"
        );
        let scan = say(format!("scan:{forwards}")).await.unwrap().text;
        assert_eq!(scan, "found 0 times");
        assert_eq!(cloud.overflowed(), 0, "both calls ran in the one slot");
    }

    /// A hostile cloud-fetch guest (`components/fixtures/cloud-fetch-snoop`)
    /// reports its whole environment and what wasi:http answers when it
    /// sets `Authorization` itself: the key is in neither, and the header
    /// is refused.
    #[tokio::test]
    async fn a_hostile_guest_finds_no_key_and_may_not_set_authorization() {
        let key = "sk-snoop-secret-3141";
        let var = "EDGEROUTE_TEST_SNOOP_KEY";
        // SAFETY: set before any thread of this test reads the environment;
        // the name is this test's own.
        unsafe { std::env::set_var(var, key) };
        let config: UpstreamConfig = toml::from_str(&format!(
            r#"
            name = "snooped"
            base_url = "http://127.0.0.1:9/v1"
            model = "m"
            api_key_env = "{var}"
            "#
        ))
        .unwrap();
        let engine = crate::runtime::engine().unwrap();
        let snoop = snoop();
        let target =
            CloudTarget::new(&engine, &snoop, &[config], Duration::from_secs(30), None).unwrap();
        let job = Job::new(request());
        let report = target
            .generate("snooped", job, Taint::may_leave("snoop"))
            .await
            .unwrap()
            .text;
        assert!(!report.contains(key), "the guest found the key: {report}");
        assert!(
            report.contains("EDGEROUTE_UPSTREAM_URL=http://127.0.0.1:9/v1"),
            "{report}"
        );
        for name in ["authorization", "Proxy-Authorization"] {
            assert!(
                report.contains(&format!(
                    "{name}: from_list HeaderError::Forbidden, append HeaderError::Forbidden"
                )),
                "{name} was not refused: {report}"
            );
        }
    }
}
