//! The routing policy host: one live instance of the policy component,
//! called under a deadline. A trap, timeout or out-of-memory costs the
//! instance (it is rebuilt on the next call), never the node.

use crate::bindings::policy::{Decision, Features, Outcome, Policy, PolicyPre};
use crate::capabilities::Role;
use crate::components;
use crate::config::PolicyConfig;
use crate::runtime::{self, EPOCH_TICK, PolicyState};
use anyhow::Context;
use std::sync::atomic::{AtomicU64, Ordering};
use wasmtime::component::{Linker, ResourceTable};
use wasmtime::{Engine, Store, Trap};

/// Why the policy gave no decision.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PolicyFailure {
    #[error("policy timed out after {0} ms")]
    Timeout(u64),
    #[error("policy trapped: {0}")]
    Trap(String),
}

struct Live {
    store: Store<PolicyState>,
    policy: Policy,
}

pub struct PolicyHost {
    engine: Engine,
    pre: PolicyPre<PolicyState>,
    params: Vec<(String, String)>,
    deadline_ms: u64,
    memory_limit: usize,
    /// "embedded:default" or the component's path, for logs and headers.
    pub origin: String,
    /// One instance: policy state (a bandit's weights) lives in it, and a
    /// call takes about a microsecond, so serialising calls costs nothing.
    live: tokio::sync::Mutex<Option<Live>>,
    pub failures: AtomicU64,
}

impl PolicyHost {
    pub async fn new(engine: &Engine, config: &PolicyConfig) -> anyhow::Result<Self> {
        let (component, origin) = match &config.component {
            Some(path) => (
                runtime::compile_file(engine, path, Role::Policy)?,
                path.display().to_string(),
            ),
            None => (
                runtime::compile(
                    engine,
                    components::POLICY_DEFAULT,
                    Role::Policy,
                    "embedded default policy",
                )?,
                "embedded:default".to_string(),
            ),
        };
        let mut linker = Linker::<PolicyState>::new(engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
        let pre = linker
            .instantiate_pre(&component)
            .and_then(PolicyPre::new)
            .map_err(anyhow::Error::from)
            .with_context(|| format!("{origin} does not implement the policy world"))?;
        let host = Self {
            engine: engine.clone(),
            pre,
            params: config.params.clone().into_iter().collect(),
            deadline_ms: config.deadline_ms.max(1),
            memory_limit: config.memory_limit_bytes,
            origin,
            live: tokio::sync::Mutex::new(None),
            failures: AtomicU64::new(0),
        };
        // Fail at start, not on the first request, when configure refuses.
        let live = host
            .instantiate()
            .await
            .map_err(anyhow::Error::from)
            .with_context(|| format!("policy {} failed to start", host.origin))?;
        *host.live.lock().await = Some(live);
        Ok(host)
    }

    async fn instantiate(&self) -> wasmtime::Result<Live> {
        let mut store = Store::new(
            &self.engine,
            PolicyState {
                wasi: runtime::wasi(&[]),
                table: ResourceTable::new(),
                limits: runtime::memory_limit(self.memory_limit),
            },
        );
        store.limiter(|s| &mut s.limits);
        store.epoch_deadline_trap();
        store.set_epoch_deadline(self.deadline_ticks());
        let policy = self.pre.instantiate_async(&mut store).await?;
        store.set_epoch_deadline(self.deadline_ticks());
        policy
            .call_configure(&mut store, &self.params)
            .await?
            .map_err(|message| {
                wasmtime::format_err!("configure refused the parameters: {message}")
            })?;
        Ok(Live { store, policy })
    }

    fn deadline_ticks(&self) -> u64 {
        (self.deadline_ms * 1000).div_ceil(EPOCH_TICK.as_micros() as u64)
    }

    /// Ask the policy where a request runs.
    pub async fn route(&self, features: &Features) -> Result<Decision, PolicyFailure> {
        let mut slot = self.live.lock().await;
        if slot.is_none() {
            match self.instantiate().await {
                Ok(live) => *slot = Some(live),
                Err(error) => return Err(self.failed(error)),
            }
        }
        let live = slot.as_mut().expect("instantiated above");
        live.store.set_epoch_deadline(self.deadline_ticks());
        match live.policy.call_route(&mut live.store, features).await {
            Ok(decision) => Ok(decision),
            Err(error) => {
                // A trapped instance may hold broken state: start afresh.
                *slot = None;
                Err(self.failed(error))
            }
        }
    }

    /// Report what happened; failures here only cost the instance.
    pub async fn observe(&self, outcome: &Outcome) {
        let mut slot = self.live.lock().await;
        let Some(live) = slot.as_mut() else { return };
        live.store.set_epoch_deadline(self.deadline_ticks());
        if let Err(error) = live.policy.call_observe(&mut live.store, outcome).await {
            *slot = None;
            let failure = self.failed(error);
            tracing::warn!(%failure, "policy observe failed");
        }
    }

    fn failed(&self, error: wasmtime::Error) -> PolicyFailure {
        self.failures.fetch_add(1, Ordering::Relaxed);
        let failure = match error.downcast_ref::<Trap>() {
            Some(Trap::Interrupt) => PolicyFailure::Timeout(self.deadline_ms),
            _ => PolicyFailure::Trap(format!("{error:#}")),
        };
        tracing::warn!(policy = %self.origin, %failure, "policy call failed; using the safe default");
        failure
    }
}
