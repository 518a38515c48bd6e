//! The policy host: the active version, the ones it replaced (for
//! rollback), and swaps between them. Versions are swapped atomically: a
//! request keeps the version that routed it, so in-flight work finishes on
//! the old one. A version becomes active only after it was admitted:
//! loaded, then probed as a step of its own.

use super::eval::conformance;
use super::persist::StateFile;
use super::version::{PolicyVersion, Settings};
use crate::config::PolicyConfig;
use anyhow::Context;
use edgeroute_core::{Decision, Features, Outcome, PolicyFailure};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Instant;
use wasmtime::Engine;

/// How many replaced versions are kept for rollback.
const HISTORY: usize = 8;

/// Load a component and probe it: what a node does before a swap or a
/// shadow run, and what `edgeroute policy check` does offline — one
/// function, so the two refuse exactly the same components.
pub async fn admit(
    engine: &Engine,
    bytes: Vec<u8>,
    source: String,
    config: &PolicyConfig,
) -> anyhow::Result<Arc<PolicyVersion>> {
    admit_with(engine, bytes, source, Settings::from_config(config), true).await
}

async fn admit_with(
    engine: &Engine,
    bytes: Vec<u8>,
    source: String,
    settings: Settings,
    probe_required: bool,
) -> anyhow::Result<Arc<PolicyVersion>> {
    let started = Instant::now();
    let version = PolicyVersion::load(engine, bytes, source, settings).await?;
    if let Err(why) = conformance::probe(&version).await {
        let why = why.context(format!("policy {} failed the probe", version.source));
        if probe_required {
            return Err(why);
        }
        // At start there is no earlier version to keep: serve, and let the
        // guard's safe default answer whenever this policy fails.
        tracing::warn!("{why:#}; it stays active and its failures get the safe default");
    }
    version.reset().await?;
    tracing::debug!(id = %version.id, ms = started.elapsed().as_secs_f64() * 1e3, "policy admitted");
    Ok(version)
}

pub struct PolicyHost {
    engine: Engine,
    settings: Settings,
    current: RwLock<Arc<PolicyVersion>>,
    previous: std::sync::Mutex<Vec<Arc<PolicyVersion>>>,
    /// Swaps happen one at a time; requests never wait on this.
    swapping: tokio::sync::Mutex<()>,
    state: Option<StateFile>,
    /// Swaps and rollbacks done (`/metrics`).
    swaps: AtomicU64,
    rollbacks: AtomicU64,
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
        // The node's first policy is kept even when its probe fails:
        // there is nothing better to keep instead.
        let version = admit_with(engine, bytes, source, settings.clone(), false).await?;
        let state = state_dir.as_deref().map(StateFile::in_dir).transpose()?;
        let host = Self {
            engine: engine.clone(),
            settings,
            current: RwLock::new(version),
            previous: Default::default(),
            swapping: Default::default(),
            state,
            swaps: AtomicU64::new(0),
            rollbacks: AtomicU64::new(0),
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

    /// Admit a version from bytes without activating it (swap, shadow).
    pub async fn prepare(
        &self,
        bytes: Vec<u8>,
        source: String,
    ) -> anyhow::Result<Arc<PolicyVersion>> {
        admit_with(&self.engine, bytes, source, self.settings.clone(), true).await
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
        if version.stateful
            && let Some(state) = &self.state
        {
            state.mark_dirty();
        }
    }

    /// Admit `bytes` and make it the active policy, carrying state across
    /// when both versions take part. A component that fails any check is
    /// refused and the active one stays.
    pub async fn swap(&self, bytes: Vec<u8>, source: String) -> anyhow::Result<Arc<PolicyVersion>> {
        let _one_at_a_time = self.swapping.lock().await;
        let next = self.prepare(bytes, source).await?;
        self.activate(next).await;
        self.swaps.fetch_add(1, Ordering::Relaxed);
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
        self.rollbacks.fetch_add(1, Ordering::Relaxed);
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
        if let Some(state) = &self.state {
            state.mark_dirty();
        }
        self.persist().await;
        replaced
    }

    /// Write the active policy's state to the state directory, if it has
    /// state and changed since the last write.
    pub async fn persist(&self) {
        let Some(file) = &self.state else { return };
        if !file.take_dirty() {
            return;
        }
        if let Some(state) = self.current().snapshot().await {
            file.write(&state).await;
        }
    }

    async fn restore_persisted(&self) {
        let Some(file) = &self.state else { return };
        let Some(state) = file.read() else { return };
        let current = self.current();
        let path = file.path().display();
        match current.restore(state).await {
            Ok(()) => tracing::info!(%path, policy = %current.id, "policy state restored"),
            Err(why) => tracing::info!(%path, %why, "persisted policy state not restored"),
        }
    }

    /// (swaps, rollbacks) since the node started.
    pub fn changes(&self) -> (u64, u64) {
        (
            self.swaps.load(Ordering::Relaxed),
            self.rollbacks.load(Ordering::Relaxed),
        )
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::eval::conformance;
    use crate::policy::eval::shadow::ShadowSlot;
    use edgeroute_core::{Choice, Sensitivity, Usage};

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("EDGEROUTE_COMPONENTS_DIR")).join(name)
    }

    fn config(component: Option<&str>) -> PolicyConfig {
        PolicyConfig {
            component: component.map(fixture),
            ..PolicyConfig::default()
        }
    }

    fn long_public() -> Features {
        conformance::features(4000, Sensitivity::Public, true, &["smollm2"], &["frontier"])
    }

    async fn reason(host: &PolicyHost) -> String {
        host.route(&long_public())
            .await
            .1
            .expect("a decision")
            .reason
    }

    #[tokio::test]
    async fn a_refused_swap_keeps_the_active_version_and_rollback_goes_back() {
        let engine = crate::runtime::engine().unwrap();
        let host = PolicyHost::new(&engine, &config(None), None).await.unwrap();
        let default = host.current().id.clone();
        assert_eq!(host.current().world, "0.2");

        let always_cloud = std::fs::read(fixture("policy_always_cloud.wasm")).unwrap();
        let swapped = host.swap(always_cloud, "test".into()).await.unwrap();
        assert_ne!(swapped.id, default);
        assert_eq!(swapped.world, "0.1");
        assert_eq!(reason(&host).await, "fixture: always cloud");

        for broken in [
            "policy_trap.wasm",
            "policy_loop.wasm",
            "policy_wrong_world.wasm",
        ] {
            let bytes = std::fs::read(fixture(broken)).unwrap();
            assert!(host.swap(bytes, broken.into()).await.is_err(), "{broken}");
            assert_eq!(
                host.current().id,
                swapped.id,
                "{broken} replaced the policy"
            );
        }

        assert_eq!(host.rollback().await.unwrap().id, default);
        assert_eq!(host.current().id, default);
        assert!(reason(&host).await.starts_with("long prompt ("));
        assert!(
            host.rollback().await.is_err(),
            "nothing left to roll back to"
        );
    }

    #[tokio::test]
    async fn a_stateful_policy_resumes_after_a_restart() {
        let engine = crate::runtime::engine().unwrap();
        let dir = std::env::temp_dir().join(format!("edgeroute-host-{}", std::process::id()));
        let config = config(Some("policy_counter_v2.wasm"));
        {
            let host = PolicyHost::new(&engine, &config, Some(dir.clone()))
                .await
                .unwrap();
            for call in 1..=3 {
                assert_eq!(reason(&host).await, format!("counter: call {call}"));
            }
            let outcome = Outcome {
                request_id: "r".into(),
                served_by: None,
                ok: true,
                latency_ms: 1,
                usage: Usage::default(),
                cost_micro_usd: 0,
                confidence: None,
                feedback: None,
            };
            host.observe(&host.current(), &outcome).await;
            host.persist().await;
        }
        // The probe's calls are not history: the new node resumes at 4.
        let host = PolicyHost::new(&engine, &config, Some(dir.clone()))
            .await
            .unwrap();
        assert_eq!(reason(&host).await, "counter: call 4");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn a_shadow_is_tallied_and_never_decides() {
        let engine = crate::runtime::engine().unwrap();
        let host = PolicyHost::new(&engine, &config(None), None).await.unwrap();
        let candidate = host
            .prepare(
                std::fs::read(fixture("policy_always_cloud.wasm")).unwrap(),
                "candidate".into(),
            )
            .await
            .unwrap();
        let shadow = Arc::new(ShadowSlot::default());
        shadow.set(Some(candidate));
        let short =
            conformance::features(12, Sensitivity::Public, true, &["smollm2"], &["frontier"]);
        for features in [short, long_public()] {
            let (_, live) = host.route(&features).await;
            assert!(matches!(&live, Ok(d) if matches!(d.choice, Choice::Run(_))));
            shadow.compare(&features, &live);
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let summary = loop {
            let summary = shadow.summary();
            if summary["compared"] == 2 {
                break summary;
            }
            assert!(std::time::Instant::now() < deadline, "{summary}");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        };
        // Short prompts: the default says local, the candidate cloud.
        assert_eq!(summary["agreed"], 1, "{summary}");
        assert_eq!(
            summary["differences"][0]["live"], "local:smollm2",
            "{summary}"
        );
        assert_eq!(
            summary["differences"][0]["candidate"], "cloud:frontier",
            "{summary}"
        );
        // The live policy is still the default.
        assert!(reason(&host).await.starts_with("long prompt ("));
    }
}
