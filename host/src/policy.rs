//! The routing policy host. Each loaded component is a `PolicyVersion`
//! with one live instance, called under a deadline and a memory cap; a
//! trap, timeout or out-of-memory costs the instance (rebuilt on the next
//! call), never the node. Versions are swapped atomically: a request keeps
//! the version that routed it, so in-flight work finishes on the old one.

use crate::bindings::policy::{Decision, Features, Outcome, Policy, PolicyPre};
use crate::capabilities::Role;
use crate::config::PolicyConfig;
use crate::conformance;
use crate::runtime::{self, EPOCH_TICK, PolicyState};
use anyhow::Context;
use sha2::{Digest, Sha256};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use wasmtime::component::{Instance, Linker, ResourceTable, TypedFunc};
use wasmtime::{Engine, Store, Trap};

/// Why the policy gave no decision.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PolicyFailure {
    #[error("policy timed out after {0} ms")]
    Timeout(u64),
    #[error("policy trapped: {0}")]
    Trap(String),
}

/// What every version is run with (from `[policy]`).
#[derive(Clone)]
struct Settings {
    params: Vec<(String, String)>,
    deadline_ms: u64,
    memory_limit: usize,
}

impl Settings {
    fn from_config(config: &PolicyConfig) -> Self {
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

/// Whether a failed probe refuses the component.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Probe {
    /// Swaps, shadows and `policy check`: the active version stays.
    Required,
    /// The node's first policy: nothing to keep instead.
    WarnOnly,
}

type SnapshotFn = TypedFunc<(), (Vec<u8>,)>;
type RestoreFn = TypedFunc<(Vec<u8>,), (Result<(), String>,)>;

struct Live {
    store: Store<PolicyState>,
    policy: Policy,
    /// Present when the component exports the `stateful-policy` additions.
    snapshot: Option<SnapshotFn>,
    restore: Option<RestoreFn>,
}

/// One loaded policy component.
pub struct PolicyVersion {
    /// First 12 hex digits of the component's SHA-256.
    pub id: String,
    /// `embedded:default`, a file path, or `admin`.
    pub source: String,
    pub loaded_at_unix: u64,
    pub size_bytes: usize,
    /// Time to compile, check, probe and configure it.
    pub load_ms: f64,
    pub stateful: bool,
    pub calls: AtomicU64,
    pub failures: AtomicU64,
    /// Linear memory of the current instance, in bytes.
    pub memory_bytes: AtomicUsize,
    settings: Settings,
    engine: Engine,
    pre: PolicyPre<PolicyState>,
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
    /// Compile, check imports and world, instantiate, configure and probe.
    /// Compilation runs on a blocking thread: it takes milliseconds for a
    /// Rust policy and seconds for an interpreter-based one.
    async fn load(
        engine: &Engine,
        bytes: Vec<u8>,
        source: String,
        settings: Settings,
        probe: Probe,
    ) -> anyhow::Result<Arc<Self>> {
        let started = Instant::now();
        let id = content_id(&bytes);
        let size_bytes = bytes.len();
        let component = {
            let (engine, source) = (engine.clone(), source.clone());
            tokio::task::spawn_blocking(move || {
                runtime::compile(&engine, &bytes, Role::Policy, &source)
            })
            .await??
        };
        let mut linker = Linker::<PolicyState>::new(engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
        let pre = linker
            .instantiate_pre(&component)
            .and_then(PolicyPre::new)
            .map_err(anyhow::Error::from)
            .with_context(|| {
                format!("{source} does not implement the edgeroute:routing/policy world")
            })?;
        let mut version = Self {
            id,
            source,
            loaded_at_unix: unix_now(),
            size_bytes,
            load_ms: 0.0,
            stateful: false,
            calls: AtomicU64::new(0),
            failures: AtomicU64::new(0),
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
        *version.live.get_mut() = Some(live);
        if let Err(why) = conformance::probe(&version).await {
            let why = why.context(format!("policy {} failed the probe", version.source));
            if probe == Probe::Required {
                return Err(why);
            }
            // At start there is no earlier version to keep: serve, and let
            // the guard's safe default answer whenever this policy fails.
            tracing::warn!("{why:#}; it stays active and its failures get the safe default");
        }
        // The probe's calls must not become the policy's history (a bandit
        // would learn from them): serve from a fresh instance.
        let fresh = version.instantiate().await.map_err(anyhow::Error::from)?;
        *version.live.get_mut() = Some(fresh);
        version.calls.store(0, Ordering::Relaxed);
        version.load_ms = started.elapsed().as_secs_f64() * 1e3;
        Ok(Arc::new(version))
    }

    async fn instantiate(&self) -> wasmtime::Result<Live> {
        let mut store = Store::new(
            &self.engine,
            PolicyState {
                wasi: runtime::wasi(&[]),
                table: ResourceTable::new(),
                limits: runtime::MemoryCap::new(self.settings.memory_limit),
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
        let policy = Policy::new(&mut store, &instance)?;
        let snapshot = instance
            .get_typed_func::<(), (Vec<u8>,)>(&mut store, "snapshot")
            .ok();
        let restore = instance
            .get_typed_func::<(Vec<u8>,), (Result<(), String>,)>(&mut store, "restore")
            .ok();
        store.set_epoch_deadline(self.settings.start_ticks());
        policy
            .call_configure(&mut store, &self.settings.params)
            .await?
            .map_err(|message| {
                wasmtime::format_err!("configure refused the parameters: {message}")
            })?;
        self.memory_bytes
            .store(store.data().limits.current(), Ordering::Relaxed);
        Ok(Live {
            store,
            policy,
            snapshot,
            restore,
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
        result.map_err(|error| {
            // A trapped instance may hold broken state: start afresh.
            *slot = None;
            self.failed(error)
        })
    }

    pub async fn route(&self, features: &Features) -> Result<Decision, PolicyFailure> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.with_live(async |live| live.policy.call_route(&mut live.store, features).await)
            .await
    }

    pub async fn observe(&self, outcome: &Outcome) {
        if let Err(failure) = self
            .with_live(async |live| live.policy.call_observe(&mut live.store, outcome).await)
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
        self.failures.fetch_add(1, Ordering::Relaxed);
        // The trap itself, not the wasm backtrace: this ends up in a header.
        let failure = match error.downcast_ref::<Trap>() {
            Some(Trap::Interrupt) => PolicyFailure::Timeout(self.settings.deadline_ms),
            Some(trap) => PolicyFailure::Trap(trap.to_string()),
            None => PolicyFailure::Trap(error.to_string()),
        };
        tracing::warn!(policy = %self.id, source = %self.source, %failure, "policy call failed");
        failure
    }

    pub fn describe(&self) -> serde_json::Value {
        serde_json::json!({
            "id": self.id,
            "source": self.source,
            "loaded_at": self.loaded_at_unix,
            "size_bytes": self.size_bytes,
            "load_ms": self.load_ms,
            "stateful": self.stateful,
            "calls": self.calls.load(Ordering::Relaxed),
            "failures": self.failures.load(Ordering::Relaxed),
            "memory_bytes": self.memory_bytes.load(Ordering::Relaxed),
        })
    }
}

/// Load a component as a swap would, without a node: `edgeroute policy check`.
pub async fn load_for_check(
    engine: &Engine,
    bytes: Vec<u8>,
    source: String,
    config: &PolicyConfig,
) -> anyhow::Result<Arc<PolicyVersion>> {
    PolicyVersion::load(
        engine,
        bytes,
        source,
        Settings::from_config(config),
        Probe::Required,
    )
    .await
}

/// How many replaced versions are kept for rollback.
const HISTORY: usize = 8;

/// The active policy, its predecessors, and an optional shadow candidate.
pub struct PolicyHost {
    engine: Engine,
    settings: Settings,
    current: RwLock<Arc<PolicyVersion>>,
    previous: std::sync::Mutex<Vec<Arc<PolicyVersion>>>,
    /// Swaps happen one at a time; requests never wait on this.
    swapping: tokio::sync::Mutex<()>,
    state_file: Option<PathBuf>,
    state_dirty: AtomicBool,
    pub shadow: crate::shadow::ShadowSlot,
}

impl PolicyHost {
    pub async fn new(
        engine: &Engine,
        config: &PolicyConfig,
        state_dir: Option<PathBuf>,
    ) -> anyhow::Result<Self> {
        let settings = Settings::from_config(config);
        let (bytes, source) = match &config.component {
            Some(path) => (
                std::fs::read(path)
                    .with_context(|| format!("cannot read policy component {}", path.display()))?,
                path.display().to_string(),
            ),
            None => (
                crate::components::POLICY_DEFAULT.to_vec(),
                "embedded:default".to_string(),
            ),
        };
        let version =
            PolicyVersion::load(engine, bytes, source, settings.clone(), Probe::WarnOnly).await?;
        if let Some(dir) = &state_dir {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create state directory {}", dir.display()))?;
        }
        let host = Self {
            engine: engine.clone(),
            settings,
            current: RwLock::new(version),
            previous: Default::default(),
            swapping: Default::default(),
            state_file: state_dir.map(|d| d.join("policy-state.bin")),
            state_dirty: AtomicBool::new(false),
            shadow: Default::default(),
        };
        host.restore_persisted().await;
        Ok(host)
    }

    pub fn current(&self) -> Arc<PolicyVersion> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn previous(&self) -> Vec<Arc<PolicyVersion>> {
        self.previous
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Build a version from bytes without activating it (swap, shadow, check).
    pub async fn prepare(
        &self,
        bytes: Vec<u8>,
        source: String,
    ) -> anyhow::Result<Arc<PolicyVersion>> {
        PolicyVersion::load(
            &self.engine,
            bytes,
            source,
            self.settings.clone(),
            Probe::Required,
        )
        .await
    }

    /// Ask the active policy; the version is returned so the request can
    /// report to the same one that decided.
    pub async fn route(
        &self,
        features: &Features,
    ) -> (Arc<PolicyVersion>, Result<Decision, PolicyFailure>) {
        let version = self.current();
        let decision = version.route(features).await;
        (version, decision)
    }

    pub async fn observe(&self, version: &PolicyVersion, outcome: &Outcome) {
        version.observe(outcome).await;
        if version.stateful {
            self.state_dirty.store(true, Ordering::Relaxed);
        }
    }

    /// Load `bytes` and make it the active policy, carrying state across
    /// when both versions take part. A component that fails any check is
    /// refused and the active one stays.
    pub async fn swap(&self, bytes: Vec<u8>, source: String) -> anyhow::Result<Arc<PolicyVersion>> {
        let _one_at_a_time = self.swapping.lock().await;
        let next = self.prepare(bytes, source).await?;
        self.activate(next).await;
        Ok(self.current())
    }

    /// Go back to the version before the active one.
    pub async fn rollback(&self) -> anyhow::Result<Arc<PolicyVersion>> {
        let _one_at_a_time = self.swapping.lock().await;
        let previous = self
            .previous
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop()
            .context("there is no previous policy version to roll back to")?;
        let replaced = self.replace(previous.clone()).await;
        // Rolling back is not a new version: don't offer the replaced one
        // as the next rollback target.
        self.previous
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|v| !Arc::ptr_eq(v, &replaced));
        Ok(previous)
    }

    async fn activate(&self, next: Arc<PolicyVersion>) {
        let replaced = self.replace(next).await;
        let mut previous = self.previous.lock().unwrap_or_else(|p| p.into_inner());
        previous.push(replaced);
        if previous.len() > HISTORY {
            previous.remove(0);
        }
    }

    async fn replace(&self, next: Arc<PolicyVersion>) -> Arc<PolicyVersion> {
        let old = self.current();
        if let Some(state) = old.snapshot().await {
            match next.restore(state).await {
                Ok(()) => {
                    tracing::info!(from = %old.id, to = %next.id, "policy state carried across the swap")
                }
                Err(why) => {
                    tracing::info!(from = %old.id, to = %next.id, %why, "new policy did not take the old state")
                }
            }
        }
        let replaced = std::mem::replace(
            &mut *self.current.write().unwrap_or_else(|p| p.into_inner()),
            next.clone(),
        );
        tracing::info!(id = %next.id, source = %next.source, load_ms = next.load_ms, "policy swapped in");
        self.state_dirty.store(true, Ordering::Relaxed);
        self.persist().await;
        replaced
    }

    /// Write the active policy's state to the state directory, if it has
    /// state and changed since the last write.
    pub async fn persist(&self) {
        let Some(path) = &self.state_file else { return };
        if !self.state_dirty.swap(false, Ordering::Relaxed) {
            return;
        }
        let Some(state) = self.current().snapshot().await else {
            return;
        };
        let tmp = path.with_extension("tmp");
        // Write then rename, so a crash never leaves half a state file.
        let written = tokio::fs::write(&tmp, &state)
            .await
            .and(tokio::fs::rename(&tmp, path).await);
        if let Err(error) = written {
            tracing::warn!(path = %path.display(), %error, "could not persist policy state");
            self.state_dirty.store(true, Ordering::Relaxed);
        }
    }

    async fn restore_persisted(&self) {
        let Some(path) = &self.state_file else { return };
        let Ok(state) = std::fs::read(path) else {
            return;
        };
        let current = self.current();
        match current.restore(state).await {
            Ok(()) => {
                tracing::info!(path = %path.display(), policy = %current.id, "policy state restored")
            }
            Err(why) => {
                tracing::info!(path = %path.display(), %why, "persisted policy state not restored")
            }
        }
    }

    pub fn failures(&self) -> u64 {
        let previous: u64 = self
            .previous()
            .iter()
            .map(|v| v.failures.load(Ordering::Relaxed))
            .sum();
        previous + self.current().failures.load(Ordering::Relaxed)
    }
}
