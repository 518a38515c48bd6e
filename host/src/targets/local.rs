//! The local target: the local-worker component generating through wasi-nn
//! on models the node preloaded, each with its batch scheduler. Admission
//! is bounded: a full queue is an immediate, explicit refusal rather than
//! unbounded waiting; up to `max_concurrent` generations share the batch.
//! The same component embeds texts on the node's encoder (`embed`).

use super::{Job, TargetFailure, TargetResult, trapped};
use crate::bindings::embedding::{Embedding, EmbedsPre};
use crate::bindings::target::TargetPre;
use crate::nn::{
    self, BatchLoad, BatchParams, CacheScope, Embedder, LoadedModel, ModelRegistry, Scheduler,
};
use crate::runtime::Sink;
use crate::runtime::roles::local_worker::{self, LocalState};
use crate::runtime::roles::{self, Role};
use edgeroute_core::estimate::{ALPHA, Ewma, queue_wait_ms};
use edgeroute_core::{Estimate, Features};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::Semaphore;
use wasmtime::Engine;

pub struct LocalTarget {
    engine: Engine,
    pre: TargetPre<LocalState>,
    /// The same component, for its `embedder` export.
    embedder_pre: EmbedsPre<LocalState>,
    models: BTreeMap<String, Arc<Scheduler>>,
    max_queue: u32,
    max_concurrent: u32,
    /// Requests waiting or running; `max_queue` permits in all.
    admission: Arc<Semaphore>,
    /// Generations in the batch at once.
    running: Arc<Semaphore>,
    /// How long a generation holds its slot, for the wait estimate.
    service_ms: Mutex<Ewma>,
}

impl LocalTarget {
    pub fn new(
        engine: &Engine,
        worker: &[u8],
        models: Vec<Arc<LoadedModel>>,
        max_queue: u32,
        batch: BatchParams,
    ) -> anyhow::Result<Self> {
        let component = roles::compile(engine, worker, Role::LocalWorker, "local worker")?;
        let instance_pre = local_worker::linker(engine)?.instantiate_pre(&component)?;
        let pre = TargetPre::new(instance_pre.clone())?;
        let embedder_pre = EmbedsPre::new(instance_pre)?;
        let max_concurrent = batch.width;
        let models = models
            .into_iter()
            .map(|model| {
                Ok((
                    model.name.clone(),
                    Arc::new(Scheduler::spawn(model, batch)?),
                ))
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Self {
            engine: engine.clone(),
            pre,
            embedder_pre,
            models,
            max_queue,
            max_concurrent,
            admission: Arc::new(Semaphore::new(max_queue as usize)),
            running: Arc::new(Semaphore::new(max_concurrent as usize)),
            service_ms: Mutex::new(Ewma::new(ALPHA)),
        })
    }

    pub fn model(&self, name: &str) -> Option<&Arc<LoadedModel>> {
        self.models.get(name).map(|s| s.model())
    }

    /// Prompt tokens `model` would continue from its prefix cache now.
    pub fn cached_prefix(
        &self,
        model: &str,
        tokens: &[llama_cpp_2::token::LlamaToken],
        scope: &CacheScope,
    ) -> u32 {
        self.models
            .get(model)
            .map_or(0, |s| s.cached_prefix(tokens, scope))
    }

    /// The batch scheduler's load on `model`.
    /// Why `job` would wait for KV cells on `model` now, if it would: its
    /// prompt plus completion budget does not fit beside what running
    /// sequences hold (idle sequences are evicted for it, so they do not
    /// count). As of the scheduler's last step: two requests arriving
    /// together may both pass, and the second then waits as before.
    fn kv_full(&self, model: &str, job: &Job) -> Option<String> {
        let load = self.batch_load(model)?;
        let prompt = job.prompt.as_ref().map_or(0, |p| p.tokens.len() as u32);
        let needs = prompt + job.request.max_tokens;
        (load.kv_reserved + needs > load.kv_budget).then(|| {
            format!(
                "the KV cache is full: {} of {} cells reserved, this request needs {needs}",
                load.kv_reserved, load.kv_budget
            )
        })
    }

    pub fn batch_load(&self, model: &str) -> Option<BatchLoad> {
        Some(self.models.get(model)?.load())
    }

    pub fn model_names(&self) -> Vec<String> {
        self.models.keys().cloned().collect()
    }

    /// Requests waiting for or running on the local backend.
    pub fn queue_depth(&self) -> u32 {
        self.max_queue - self.admission.available_permits() as u32
    }

    /// Generations running now.
    pub fn running(&self) -> u32 {
        self.max_concurrent - self.running.available_permits() as u32
    }

    /// How long a request arriving now would wait for a generation slot
    /// (`edgeroute_core::estimate::queue_wait_ms` over the requests ahead
    /// of it and the measured generation time); a request waiting for KV
    /// cells holds the queue as if every slot were busy. A policy that sees
    /// it can send a request that may leave elsewhere instead of waiting.
    pub fn wait_ms(&self) -> u32 {
        let mut depth = self.queue_depth();
        let kv_waiting: u32 = self.models.values().map(|s| s.load().waiting).sum();
        if kv_waiting > 0 {
            depth = depth.max(self.max_concurrent);
        }
        queue_wait_ms(depth, self.max_concurrent, self.service_ms().unwrap_or(0.0)).round() as u32
    }

    /// How long a generation holds its slot (EWMA); none before the first.
    pub fn service_ms(&self) -> Option<f64> {
        self.service_ms
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get()
    }

    /// The local estimate for a request of these features on `model`.
    pub fn estimate(&self, model: &str, features: &Features) -> Option<Estimate> {
        // Only the part of the prompt not in the prefix cache is prefilled.
        self.model(model)?.estimate(
            features.prompt_tokens - features.cached_prefix_tokens,
            features.max_tokens,
            features.local_wait_ms as f64,
        )
    }

    /// Run `job` on the model it names (`job.request.model`).
    pub async fn generate(&self, job: Job) -> TargetResult {
        let Ok(_queued) = self.admission.clone().try_acquire_owned() else {
            return Err(TargetFailure::Busy(self.max_queue));
        };
        if !self.models.contains_key(&job.request.model) {
            return Err(TargetFailure::Unavailable(format!(
                "local model '{}' is not loaded",
                job.request.model
            )));
        }
        let _running =
            self.running.clone().acquire_owned().await.map_err(|_| {
                TargetFailure::Unavailable("the local target is shutting down".into())
            })?;
        let started = Instant::now();
        let engine = self.engine.clone();
        let pre = self.pre.clone();
        let nn = nn::context(ModelRegistry::new(
            self.models.values(),
            &job.meter,
            job.cache.as_ref(),
            job.prompt.clone(),
            &job.decoding,
        ));
        let handle = tokio::runtime::Handle::current();
        // llama.cpp blocks its thread for the whole generation; keep it off
        // the async workers that serve other requests.
        let result = tokio::task::spawn_blocking(move || {
            handle.block_on(async move {
                let mut store = LocalState::store(
                    &engine,
                    nn,
                    Sink {
                        tx: job.stream,
                        waiting: job.waiting,
                    },
                );
                let target = pre.instantiate_async(&mut store).await.map_err(trapped)?;
                target
                    .edgeroute_routing_generator()
                    .call_generate(&mut store, &job.request)
                    .await
                    .map_err(trapped)?
                    .map_err(TargetFailure::from)
            })
        })
        .await
        .map_err(|e| TargetFailure::Internal(format!("local generation panicked: {e}")));
        let held = started.elapsed().as_secs_f64() * 1e3;
        self.service_ms
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .add(held);
        result?
    }

    /// Embed `texts` on the node's encoder through the local worker and
    /// wasi-nn, in one instance. `cut_to`: see the `embedder` interface (a
    /// text too long without it is a `BadRequest`). Not admitted through
    /// the generation queue: the encoder has its own context and lock.
    pub async fn embed(
        &self,
        embedder: &Arc<Embedder>,
        texts: Vec<String>,
        cut_to: Option<u32>,
    ) -> Result<Vec<Embedding>, TargetFailure> {
        let engine = self.engine.clone();
        let pre = self.embedder_pre.clone();
        let nn = nn::context(ModelRegistry::embedding(embedder));
        let model = embedder.name.clone();
        let handle = tokio::runtime::Handle::current();
        // The encoder blocks its thread for milliseconds per text.
        tokio::task::spawn_blocking(move || {
            handle.block_on(async move {
                let mut store = LocalState::store(&engine, nn, Sink::default());
                let worker = pre.instantiate_async(&mut store).await.map_err(trapped)?;
                worker
                    .edgeroute_routing_embedder()
                    .call_embed(&mut store, &model, &texts, cut_to)
                    .await
                    .map_err(trapped)?
                    .map_err(TargetFailure::from)
            })
        })
        .await
        .map_err(|e| TargetFailure::Internal(format!("embedding panicked: {e}")))?
    }
}

/// Nothing leaves the node here, so the taint has nothing to guard.
impl super::Backend for LocalTarget {
    fn names(&self) -> Vec<String> {
        self.model_names()
    }

    fn generate<'a>(
        &'a self,
        name: &'a str,
        mut job: Job,
        taint: super::Taint,
    ) -> super::Generating<'a> {
        job.request.model = name.to_string();
        // A request that may leave does not wait for KV cells: it fails
        // here as unavailable, and the guard's fallback sends it on (a
        // peer, the cloud). One that may not leave waits its turn.
        if taint.may_leave
            && let Some(why) = self.kv_full(name, &job)
        {
            return Box::pin(async move { Err(TargetFailure::Unavailable(why)) });
        }
        Box::pin(LocalTarget::generate(self, job))
    }
}
