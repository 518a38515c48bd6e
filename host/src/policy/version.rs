//! One loaded policy component: compiled, checked against its role,
//! instantiated and configured, with one live instance called under a
//! deadline and a memory cap. A trap, timeout or out-of-memory costs the
//! instance (rebuilt on the next call), never the node. A version knows
//! nothing of probes, history or swaps: see `host` and `eval`.

use super::convert;
use super::log::PolicyLog;
use crate::bindings::{policy as wit1, policy_v2 as wit2};
use crate::config::PolicyConfig;
use crate::runtime::roles::policy::PolicyState;
use crate::runtime::roles::{self, Role};
use crate::runtime::{self, EPOCH_TICK};
use anyhow::Context;
use edgeroute_core::{Decision, Features, Needs, Outcome, PolicyFailure};
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use wasmtime::component::{Instance, InstancePre, ResourceTable, TypedFunc};
use wasmtime::{Engine, Store, Trap};

/// What every version is run with (from `[policy]`).
#[derive(Clone)]
pub struct Settings {
    params: Vec<(String, String)>,
    deadline_ms: u64,
    memory_limit: usize,
}

impl Settings {
    pub fn from_config(config: &PolicyConfig) -> Self {
        Self {
            params: config.params.clone().into_iter().collect(),
            deadline_ms: config.deadline_ms.max(1),
            memory_limit: config.memory_limit_bytes,
        }
    }

    fn deadline_ticks(&self) -> u64 {
        (self.deadline_ms * 1000).div_ceil(EPOCH_TICK.as_micros() as u64)
    }

    /// Instantiation and `configure` run once per instance and, for an
    /// interpreter-based policy, take milliseconds on a busy machine: they
    /// get their own, larger budget than a `route` call.
    fn start_ticks(&self) -> u64 {
        let start_ms = self.deadline_ms.max(START_DEADLINE_MS);
        (start_ms * 1000).div_ceil(EPOCH_TICK.as_micros() as u64)
    }
}

/// Budget for instantiating a policy and running its `configure`.
const START_DEADLINE_MS: u64 = 2_000;

type SnapshotFn = TypedFunc<(), (Vec<u8>,)>;
type RestoreFn = TypedFunc<(Vec<u8>,), (Result<(), String>,)>;

/// Which `edgeroute:routing` policy world a component implements; both
/// link side by side, so 0.1 policies keep working unchanged.
#[derive(Clone)]
enum World {
    V1(wit1::PolicyPre<PolicyState>),
    V2(wit2::PolicyPre<PolicyState>),
}

impl World {
    fn of(pre: InstancePre<PolicyState>, source: &str) -> anyhow::Result<Self> {
        let v2 = match wit2::PolicyPre::new(pre.clone()) {
            Ok(v2) => return Ok(World::V2(v2)),
            Err(error) => error,
        };
        let v1 = match wit1::PolicyPre::new(pre) {
            Ok(v1) => return Ok(World::V1(v1)),
            Err(error) => error,
        };
        anyhow::bail!(
            "{source} does not implement the edgeroute:routing/policy world (0.2: {v2}; 0.1: {v1})"
        )
    }

    fn instance_pre(&self) -> &InstancePre<PolicyState> {
        match self {
            World::V1(pre) => pre.instance_pre(),
            World::V2(pre) => pre.instance_pre(),
        }
    }

    fn version(&self) -> &'static str {
        match self {
            World::V1(_) => "0.1",
            World::V2(_) => "0.2",
        }
    }
}

/// A live instance's exports, by world.
enum Bound {
    V1(wit1::Policy),
    V2(wit2::Policy),
}

struct Live {
    store: Store<PolicyState>,
    policy: Bound,
    /// Present when the component exports the `stateful-policy` additions.
    snapshot: Option<SnapshotFn>,
    restore: Option<RestoreFn>,
    /// What its `configure` said it needs (0.1: nothing).
    needs: Needs,
}

/// How a policy call can fail: it trapped, ran past its deadline, or
/// trapped after the memory cap refused it more memory.
/// Indexes into `failures_by_kind` are this enum's values, so a kind and
/// its label cannot drift apart.
#[derive(Clone, Copy)]
enum FailureKind {
    Trap = 0,
    Timeout = 1,
    Memory = 2,
}

const FAILURE_KINDS: [&str; 3] = ["trap", "timeout", "memory"];

/// One loaded policy component.
pub struct PolicyVersion {
    /// First 12 hex digits of the component's SHA-256.
    pub id: String,
    /// `embedded:default`, a file path, or `admin`.
    pub source: String,
    pub loaded_at_unix: u64,
    pub size_bytes: usize,
    /// Time to compile, check and configure it (and, once admitted, probe).
    pub load_ms: f64,
    pub stateful: bool,
    /// The costly signals it asked for; the pipeline computes only these.
    pub needs: Needs,
    /// The `edgeroute:routing` version of its world (`0.1`, `0.2`).
    pub world: &'static str,
    pub calls: AtomicU64,
    pub failures: AtomicU64,
    /// `failures` by kind, in the order of [`FAILURE_KINDS`].
    failures_by_kind: [AtomicU64; 3],
    /// Linear memory of the current instance, in bytes.
    pub memory_bytes: AtomicUsize,
    /// Its `host.log` lines, rate-limited across its instances.
    log: PolicyLog,
    settings: Settings,
    engine: Engine,
    pre: World,
    live: tokio::sync::Mutex<Option<Live>>,
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn content_id(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    digest.iter().take(6).map(|b| format!("{b:02x}")).collect()
}

impl PolicyVersion {
    /// Compile, check imports and world, instantiate and configure.
    /// Compilation runs on a blocking thread: it takes milliseconds for a
    /// Rust policy and seconds for an interpreter-based one.
    pub async fn load(
        engine: &Engine,
        bytes: Vec<u8>,
        source: String,
        settings: Settings,
    ) -> anyhow::Result<Arc<Self>> {
        let started = Instant::now();
        let id = content_id(&bytes);
        let size_bytes = bytes.len();
        let component = {
            let (engine, source) = (engine.clone(), source.clone());
            tokio::task::spawn_blocking(move || {
                roles::compile(&engine, &bytes, Role::Policy, &source)
            })
            .await??
        };
        let instance_pre = roles::policy::linker(engine)?
            .instantiate_pre(&component)
            .map_err(anyhow::Error::from)
            .with_context(|| {
                format!("{source} does not implement the edgeroute:routing/policy world")
            })?;
        let pre = World::of(instance_pre, &source)?;
        let mut version = Self {
            log: PolicyLog::new(&id),
            id,
            source,
            loaded_at_unix: unix_now(),
            size_bytes,
            load_ms: 0.0,
            stateful: false,
            needs: Needs::default(),
            world: pre.version(),
            calls: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            failures_by_kind: Default::default(),
            memory_bytes: AtomicUsize::new(0),
            settings,
            engine: engine.clone(),
            pre,
            live: tokio::sync::Mutex::new(None),
        };
        let live = version
            .instantiate()
            .await
            .map_err(anyhow::Error::from)
            .with_context(|| format!("policy {} failed to start", version.source))?;
        version.stateful = live.snapshot.is_some() && live.restore.is_some();
        version.needs = live.needs;
        *version.live.get_mut() = Some(live);
        version.load_ms = started.elapsed().as_secs_f64() * 1e3;
        Ok(Arc::new(version))
    }

    /// Start over on a fresh instance, forgetting every call so far: the
    /// probe's calls must not become the policy's history (a bandit would
    /// learn from them).
    pub async fn reset(&self) -> anyhow::Result<()> {
        let fresh = self.instantiate().await.map_err(anyhow::Error::from)?;
        *self.live.lock().await = Some(fresh);
        self.calls.store(0, Ordering::Relaxed);
        Ok(())
    }

    async fn instantiate(&self) -> wasmtime::Result<Live> {
        let mut store = Store::new(
            &self.engine,
            PolicyState {
                wasi: runtime::wasi(&[]),
                table: ResourceTable::new(),
                limits: runtime::MemoryCap::new(self.settings.memory_limit),
                log: self.log.clone(),
            },
        );
        store.limiter(|s| &mut s.limits);
        store.epoch_deadline_trap();
        store.set_epoch_deadline(self.settings.start_ticks());
        let instance: Instance = self
            .pre
            .instance_pre()
            .instantiate_async(&mut store)
            .await?;
        let (policy, snapshot, restore) = match &self.pre {
            World::V1(_) => {
                let policy = wit1::Policy::new(&mut store, &instance)?;
                // 0.1's `stateful-policy` exports these as world functions.
                let snapshot = instance.get_typed_func(&mut store, "snapshot").ok();
                let restore = instance.get_typed_func(&mut store, "restore").ok();
                (Bound::V1(policy), snapshot, restore)
            }
            World::V2(_) => {
                let policy = wit2::Policy::new(&mut store, &instance)?;
                // 0.2 exports them in the `state` interface.
                let state =
                    instance.get_export_index(&mut store, None, "edgeroute:routing/state@0.2.0");
                let func = |store: &mut Store<PolicyState>, name: &str| {
                    state
                        .as_ref()
                        .and_then(|state| instance.get_export_index(&mut *store, Some(state), name))
                };
                let snapshot = func(&mut store, "snapshot")
                    .and_then(|index| instance.get_typed_func(&mut store, index).ok());
                let restore = func(&mut store, "restore")
                    .and_then(|index| instance.get_typed_func(&mut store, index).ok());
                (Bound::V2(policy), snapshot, restore)
            }
        };
        store.set_epoch_deadline(self.settings.start_ticks());
        let params = &self.settings.params;
        let refused =
            |message: String| wasmtime::format_err!("configure refused the parameters: {message}");
        let needs = match &policy {
            Bound::V1(p) => {
                p.call_configure(&mut store, params)
                    .await?
                    .map_err(refused)?;
                Needs::default()
            }
            Bound::V2(p) => p
                .edgeroute_routing_router()
                .call_configure(&mut store, params)
                .await?
                .map(convert::v2::needs)
                .map_err(refused)?,
        };
        self.memory_bytes
            .store(store.data().limits.current(), Ordering::Relaxed);
        Ok(Live {
            store,
            policy,
            snapshot,
            restore,
            needs,
        })
    }

    /// Run `call` on the live instance (building one if the last trapped)
    /// under the deadline; a failure discards the instance.
    async fn with_live<R>(
        &self,
        call: impl AsyncFnOnce(&mut Live) -> wasmtime::Result<R>,
    ) -> Result<R, PolicyFailure> {
        let mut slot = self.live.lock().await;
        if slot.is_none() {
            match self.instantiate().await {
                Ok(live) => *slot = Some(live),
                Err(error) => return Err(self.failed(error)),
            }
        }
        let live = slot.as_mut().expect("instantiated above");
        live.store
            .set_epoch_deadline(self.settings.deadline_ticks());
        let result = call(live).await;
        self.memory_bytes
            .store(live.store.data().limits.current(), Ordering::Relaxed);
        let out_of_memory = live.store.data().limits.denied();
        result.map_err(|error| {
            // A trapped instance may hold broken state: start afresh.
            *slot = None;
            self.failed_with(error, out_of_memory)
        })
    }

    pub async fn route(&self, features: &Features) -> Result<Decision, PolicyFailure> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.with_live(async |live| match &live.policy {
            Bound::V1(p) => p
                .call_route(&mut live.store, &convert::v1::features(features))
                .await
                .map(convert::v1::decision),
            Bound::V2(p) => p
                .edgeroute_routing_router()
                .call_route(&mut live.store, &convert::v2::features(features))
                .await
                .map(convert::v2::decision),
        })
        .await
    }

    pub async fn observe(&self, outcome: &Outcome) {
        if let Err(failure) = self
            .with_live(async |live| match &live.policy {
                Bound::V1(p) => {
                    p.call_observe(&mut live.store, &convert::v1::outcome(outcome))
                        .await
                }
                Bound::V2(p) => {
                    p.edgeroute_routing_router()
                        .call_observe(&mut live.store, &convert::v2::outcome(outcome))
                        .await
                }
            })
            .await
        {
            tracing::warn!(policy = %self.id, %failure, "policy observe failed");
        }
    }

    /// The policy's own state, when it exports `snapshot`.
    pub async fn snapshot(&self) -> Option<Vec<u8>> {
        if !self.stateful {
            return None;
        }
        self.with_live(async |live| match &live.snapshot {
            Some(f) => f
                .call_async(&mut live.store, ())
                .await
                .map(|(state,)| Some(state)),
            None => Ok(None),
        })
        .await
        .ok()
        .flatten()
    }

    /// Hand state to the policy; `Err` says why it was not taken.
    pub async fn restore(&self, state: Vec<u8>) -> Result<(), String> {
        if !self.stateful {
            return Err("the policy does not export restore".into());
        }
        self.with_live(async |live| match &live.restore {
            Some(f) => f.call_async(&mut live.store, (state,)).await.map(|(r,)| r),
            None => Ok(Err("the policy does not export restore".into())),
        })
        .await
        .map_err(|failure| failure.to_string())?
    }

    fn failed(&self, error: wasmtime::Error) -> PolicyFailure {
        self.failed_with(error, false)
    }

    /// `out_of_memory`: the memory cap refused a growth before the call
    /// failed, so the trap (an allocator's abort, usually) was its result.
    fn failed_with(&self, error: wasmtime::Error, out_of_memory: bool) -> PolicyFailure {
        self.failures.fetch_add(1, Ordering::Relaxed);
        // The trap itself, not the wasm backtrace: this ends up in a header.
        let (kind, failure) = match error.downcast_ref::<Trap>() {
            Some(Trap::Interrupt) => (
                FailureKind::Timeout,
                PolicyFailure::Timeout(self.settings.deadline_ms),
            ),
            _ if out_of_memory => (
                FailureKind::Memory,
                PolicyFailure::Trap(format!(
                    "out of memory: the policy tried to grow past its {} byte limit",
                    self.settings.memory_limit
                )),
            ),
            Some(trap) => (FailureKind::Trap, PolicyFailure::Trap(trap.to_string())),
            None => (FailureKind::Trap, PolicyFailure::Trap(error.to_string())),
        };
        self.failures_by_kind[kind as usize].fetch_add(1, Ordering::Relaxed);
        tracing::warn!(policy = %self.id, source = %self.source, %failure, "policy call failed");
        failure
    }

    /// Failures so far by kind (`/metrics`).
    pub fn failure_counts(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        FAILURE_KINDS
            .iter()
            .zip(&self.failures_by_kind)
            .map(|(kind, n)| (*kind, n.load(Ordering::Relaxed)))
    }

    pub fn describe(&self) -> serde_json::Value {
        serde_json::json!({
            "id": self.id,
            "source": self.source,
            "loaded_at": self.loaded_at_unix,
            "size_bytes": self.size_bytes,
            "load_ms": self.load_ms,
            "stateful": self.stateful,
            "world": format!("edgeroute:routing/policy@{}", self.world),
            "calls": self.calls.load(Ordering::Relaxed),
            "failures": self.failures.load(Ordering::Relaxed),
            "memory_bytes": self.memory_bytes.load(Ordering::Relaxed),
        })
    }
}
