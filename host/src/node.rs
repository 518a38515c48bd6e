//! A running node: the config and every part built from it, shared by all
//! request handlers.

use crate::audit::AuditLog;
use crate::config::Config;
use crate::decisions::DecisionLog;
use crate::feedback::Recent;
use crate::ledger::Ledger;
use crate::metrics::Metrics;
use crate::nn::{Embedder, LoadedModel, RuntimeParams};
use crate::policy::PolicyHost;
use crate::policy::eval::shadow::ShadowSlot;
use crate::targets::Backend;
use crate::targets::cloud::CloudTarget;
use crate::targets::local::LocalTarget;
use crate::{components, runtime};
use anyhow::bail;
use edgeroute_core::TargetKind;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct Node {
    pub config: Config,
    pub policy: PolicyHost,
    /// A candidate policy that sees live features but never decides.
    pub shadow: Arc<ShadowSlot>,
    pub local: LocalTarget,
    pub cloud: CloudTarget,
    /// The sentence-embedding model, when one is configured and present.
    pub embedder: Option<Arc<Embedder>>,
    /// Sensitive-data detection: the built-in rules and the operator's.
    pub detector: crate::detect::NodeDetector,
    pub ledger: Ledger,
    /// Request-path series for `GET /metrics`.
    pub metrics: Metrics,
    /// Outcomes of recent requests, for `POST /v1/feedback`.
    pub recent: Recent,
    /// Where decisions and outcomes are appended, when configured.
    pub decisions: Option<DecisionLog>,
    pub started: Instant,
    /// Bearer token of the admin endpoints; None turns them off.
    pub admin_token: Option<String>,
    /// API keys and their tenants.
    pub clients: crate::tenants::Clients,
    /// This node's fleet (`[fleet]`); None on a single node.
    pub fleet: Option<Arc<crate::fleet::Fleet>>,
}

/// What to tell a user whose model file is missing.
pub const FETCH_HINT: &str = "fetch the default model with `./dev setup` (or `scripts/fetch-models.sh`), or point [[local.models]] path at a GGUF file";

impl Node {
    pub async fn start(config: Config) -> anyhow::Result<Arc<Node>> {
        // Before the models load: a key mistake should fail in a second.
        let clients = crate::tenants::Clients::from_config(&config)?;
        let engine = runtime::engine()?;
        let runtime_params = RuntimeParams {
            threads: config.local.threads,
            context_size: config.local.context_size,
        };
        let mut models = Vec::new();
        for model in &config.local.models {
            if !model.path.is_file() {
                if model.optional {
                    tracing::warn!(model = %model.name, path = %model.path.display(), "optional model is missing; serving without it");
                    continue;
                }
                bail!(
                    "model '{}' not found at {}: {FETCH_HINT}",
                    model.name,
                    model.path.display()
                );
            }
            let size_mb = std::fs::metadata(&model.path)
                .map(|m| m.len() >> 20)
                .unwrap_or(0);
            eprintln!(
                "loading model '{}' from {} ({size_mb} MiB)…",
                model.name,
                model.path.display()
            );
            let t = Instant::now();
            let model_runtime = runtime_params;
            let (name, path) = (model.name.clone(), model.path.clone());
            let loaded =
                tokio::task::spawn_blocking(move || LoadedModel::load(&name, &path, model_runtime))
                    .await??;
            eprintln!(
                "loaded model '{}' in {} ms",
                model.name,
                t.elapsed().as_millis()
            );
            models.push(loaded);
        }
        if let Some(pace) = &config.local.test_backend {
            eprintln!(
                "WARNING: [local.test_backend] is set: local requests get a fixed test text at {} prompt and {} completion tokens/s; no model runs",
                pace.prefill_tokens_per_s, pace.decode_tokens_per_s
            );
        }
        let embedder = match &config.local.embedding {
            Some(e) if !e.path.is_file() => {
                if !e.optional {
                    bail!(
                        "embedding model '{}' not found at {}: {FETCH_HINT}",
                        e.name,
                        e.path.display()
                    );
                }
                tracing::warn!(model = %e.name, path = %e.path.display(), "optional embedding model is missing; serving without embeddings");
                None
            }
            Some(e) => {
                let (name, path, threads) = (e.name.clone(), e.path.clone(), config.local.threads);
                let t = Instant::now();
                let embedder =
                    tokio::task::spawn_blocking(move || Embedder::load(&name, &path, threads, 0))
                        .await??;
                eprintln!(
                    "loaded embedding model '{}' ({} dimensions, {} tokens) in {} ms",
                    e.name,
                    embedder.dims(),
                    embedder.window(),
                    t.elapsed().as_millis()
                );
                Some(Arc::new(embedder))
            }
            None => None,
        };
        let local = LocalTarget::new(
            &engine,
            components::LOCAL_WORKER,
            models,
            config.local.max_queue,
            crate::nn::BatchParams {
                width: config.local.max_concurrent,
                kv_budget_tokens: config.local.kv_budget_tokens,
                paced: config.local.test_backend,
            },
        )?;
        let cloud = CloudTarget::new(
            &engine,
            components::CLOUD_FETCH,
            &config.cloud.upstreams,
            Duration::from_millis(config.limits.cloud_timeout_ms),
            AuditLog::from_config(&config.audit, &config.state_dir_or_default())?,
        )?;
        let fleet = match &config.fleet {
            Some(fleet) => Some(Arc::new(crate::fleet::Fleet::new(
                fleet.clone(),
                fleet.token()?,
                config.guard.zone_levels.clone(),
                cloud.audit.clone(),
                Duration::from_millis(config.limits.cloud_timeout_ms),
            )?)),
            None => None,
        };
        let policy =
            PolicyHost::new(&engine, &config.policy, config.node.state_dir.clone()).await?;
        let reference = config.reference_prices();
        Ok(Arc::new(Node {
            policy,
            shadow: Arc::default(),
            local,
            cloud,
            embedder,
            detector: crate::detect::NodeDetector::from_guard(&config.guard)?,
            ledger: Ledger::new(reference, Some(config.ledger.tasks.clone())),
            metrics: Metrics::default(),
            recent: Recent::default(),
            decisions: match &config.node.decision_log {
                Some(path) => Some(DecisionLog::open(path)?),
                None => None,
            },
            started: Instant::now(),
            admin_token: config.admin.token(),
            clients,
            fleet,
            config,
        }))
    }

    /// The backend that serves a kind of target; None for a kind this
    /// node has none of (peers, on a node outside a fleet).
    pub fn backend(&self, kind: TargetKind) -> Option<&dyn Backend> {
        match kind {
            TargetKind::Local => Some(&self.local),
            TargetKind::Cloud => Some(&self.cloud),
            TargetKind::Peer => self.fleet.as_deref().map(|f| f as &dyn Backend),
        }
    }

    /// The first configured local model: where requests that must stay go
    /// when the policy named none that is usable.
    pub fn default_local_model(&self) -> Option<&str> {
        self.config.local.models.first().map(|m| m.name.as_str())
    }
}
