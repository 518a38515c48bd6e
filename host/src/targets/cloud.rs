//! The cloud target: the cloud-fetch component calling an OpenAI-compatible
//! upstream over `wasi:http`. The host gives each call the upstream's URL
//! and key, and the egress guard decides what may actually leave.

use super::{Job, TargetFailure, TargetResult, trapped};
use crate::bindings::target::{Target, TargetPre};
use crate::capabilities::Role;
use crate::config::UpstreamConfig;
use crate::egress::{self, EgressAudit, EgressHooks};
use crate::runtime::{self, NO_DEADLINE, Sink, SinkData};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use wasmtime::component::{Linker, ResourceTable};
use wasmtime::{Engine, Store};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

pub struct CloudState {
    wasi: WasiCtx,
    table: ResourceTable,
    http: WasiHttpCtx,
    hooks: EgressHooks,
    sink: Sink,
}

impl WasiView for CloudState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for CloudState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.hooks,
        }
    }
}

/// An upstream as the node uses it, with its key read once at start.
pub struct Upstream {
    pub config: UpstreamConfig,
    api_key: Option<String>,
}

pub struct CloudTarget {
    engine: Engine,
    pre: TargetPre<CloudState>,
    upstreams: BTreeMap<String, Upstream>,
    allowed_hosts: Arc<HashSet<String>>,
    timeout: Duration,
    pub audit: Arc<EgressAudit>,
}

/// Whether the client request behind a cloud call may leave the node; the
/// egress guard checks it on every outgoing HTTP request.
#[derive(Debug, Clone)]
pub struct Taint {
    pub request_id: String,
    pub may_leave: bool,
}

impl CloudTarget {
    pub fn new(
        engine: &Engine,
        fetcher: &[u8],
        upstreams: &[UpstreamConfig],
        timeout: Duration,
    ) -> anyhow::Result<Self> {
        let component = runtime::compile(engine, fetcher, Role::CloudFetch, "cloud-fetch")?;
        let mut linker = Linker::<CloudState>::new(engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)?;
        Target::add_to_linker::<_, SinkData>(&mut linker, |s: &mut CloudState| &mut s.sink)?;
        let pre = TargetPre::new(linker.instantiate_pre(&component)?)?;

        let mut allowed = HashSet::new();
        let mut by_name = BTreeMap::new();
        for upstream in upstreams {
            allowed.insert(egress::upstream_authority(&upstream.base_url)?);
            let api_key = match &upstream.api_key_env {
                Some(var) => match std::env::var(var) {
                    Ok(key) => Some(key),
                    Err(_) => {
                        tracing::warn!(upstream = %upstream.name, env = %var, "API key variable is not set; calling without a key");
                        None
                    }
                },
                None => None,
            };
            by_name.insert(
                upstream.name.clone(),
                Upstream {
                    config: upstream.clone(),
                    api_key,
                },
            );
        }
        Ok(Self {
            engine: engine.clone(),
            pre,
            upstreams: by_name,
            allowed_hosts: Arc::new(allowed),
            timeout,
            audit: Arc::default(),
        })
    }

    pub fn upstream(&self, name: &str) -> Option<&UpstreamConfig> {
        self.upstreams.get(name).map(|u| &u.config)
    }

    pub fn upstream_names(&self) -> Vec<String> {
        self.upstreams.keys().cloned().collect()
    }

    pub async fn generate(&self, upstream: &str, mut job: Job, taint: Taint) -> TargetResult {
        let upstream = self
            .upstreams
            .get(upstream)
            .ok_or_else(|| TargetFailure::Unavailable(format!("no upstream named '{upstream}'")))?;
        job.request.model = upstream.config.model.clone();
        let env = [
            ("EDGEROUTE_UPSTREAM_URL", upstream.config.base_url.as_str()),
            (
                "EDGEROUTE_UPSTREAM_KEY",
                upstream.api_key.as_deref().unwrap_or(""),
            ),
        ];
        let mut store = Store::new(
            &self.engine,
            CloudState {
                wasi: runtime::wasi(&env),
                table: ResourceTable::new(),
                http: WasiHttpCtx::new(),
                hooks: EgressHooks {
                    allowed_hosts: self.allowed_hosts.clone(),
                    may_leave: taint.may_leave,
                    request_id: taint.request_id,
                    audit: self.audit.clone(),
                },
                sink: Sink { tx: job.stream },
            },
        );
        store.set_epoch_deadline(NO_DEADLINE);
        let call = async {
            let target = self
                .pre
                .instantiate_async(&mut store)
                .await
                .map_err(trapped)?;
            target
                .edgeroute_routing_generator()
                .call_generate(&mut store, &job.request)
                .await
                .map_err(trapped)?
                .map_err(TargetFailure::from)
        };
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => result,
            Err(_) => Err(TargetFailure::Timeout(self.timeout.as_millis() as u64)),
        }
    }
}
