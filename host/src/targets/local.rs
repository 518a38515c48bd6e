//! The local target: the local-worker component generating through wasi-nn
//! on models the node preloaded. Admission is bounded: a full queue is an
//! immediate, explicit refusal rather than unbounded waiting.

use super::{Job, TargetFailure, TargetResult, trapped};
use crate::bindings::target::TargetPre;
use crate::nn::{self, LoadedModel, ModelRegistry};
use crate::runtime::roles::local_worker::{self, LocalState};
use crate::runtime::roles::{self, Role};
use crate::runtime::{self, NO_DEADLINE, Sink};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::Semaphore;
use wasmtime::component::ResourceTable;
use wasmtime::{Engine, Store};

pub struct LocalTarget {
    engine: Engine,
    pre: TargetPre<LocalState>,
    models: BTreeMap<String, Arc<LoadedModel>>,
    registry: ModelRegistry,
    max_queue: u32,
    /// Requests waiting or running; `max_queue` permits in all.
    admission: Arc<Semaphore>,
    /// Generations running at once.
    running: Arc<Semaphore>,
}

impl LocalTarget {
    pub fn new(
        engine: &Engine,
        worker: &[u8],
        models: Vec<Arc<LoadedModel>>,
        max_queue: u32,
        max_concurrent: u32,
    ) -> anyhow::Result<Self> {
        let component = roles::compile(engine, worker, Role::LocalWorker, "local worker")?;
        let pre = TargetPre::new(local_worker::linker(engine)?.instantiate_pre(&component)?)?;
        let mut registry = ModelRegistry::default();
        for model in &models {
            registry.insert(model.clone());
        }
        Ok(Self {
            engine: engine.clone(),
            pre,
            models: models.into_iter().map(|m| (m.name.clone(), m)).collect(),
            registry,
            max_queue,
            admission: Arc::new(Semaphore::new(max_queue as usize)),
            running: Arc::new(Semaphore::new(max_concurrent as usize)),
        })
    }

    pub fn model(&self, name: &str) -> Option<&Arc<LoadedModel>> {
        self.models.get(name)
    }

    pub fn model_names(&self) -> Vec<String> {
        self.models.keys().cloned().collect()
    }

    /// Requests waiting for or running on the local backend.
    pub fn queue_depth(&self) -> u32 {
        self.max_queue - self.admission.available_permits() as u32
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
        let engine = self.engine.clone();
        let pre = self.pre.clone();
        let nn = nn::context(&self.registry);
        let handle = tokio::runtime::Handle::current();
        // llama.cpp blocks its thread for the whole generation; keep it off
        // the async workers that serve other requests.
        tokio::task::spawn_blocking(move || {
            handle.block_on(async move {
                let mut store = Store::new(
                    &engine,
                    LocalState {
                        wasi: runtime::wasi(&[]),
                        table: ResourceTable::new(),
                        nn,
                        sink: Sink { tx: job.stream },
                    },
                );
                store.set_epoch_deadline(NO_DEADLINE);
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
        .map_err(|e| TargetFailure::Internal(format!("local generation panicked: {e}")))?
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
        _taint: super::Taint,
    ) -> super::Generating<'a> {
        job.request.model = name.to_string();
        Box::pin(LocalTarget::generate(self, job))
    }
}
