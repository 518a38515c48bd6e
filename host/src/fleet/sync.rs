//! Publishing this node's load and reading its peers', every `report_ms`.
//!
//! With `[fleet] redis`, each node writes its report under
//! `edgeroute:fleet:node:NAME` with a time to live of `stale_ms` and reads
//! every other key of that prefix: a node that stops is gone from the
//! store within `stale_ms`, with no membership protocol of ours. Without
//! Redis, the peers listed in the config are asked for `GET /fleet/load`.

use super::{Fleet, Report, TOKEN_HEADER};
use crate::node::Node;
use std::sync::Weak;
use std::time::Duration;

const KEY_PREFIX: &str = "edgeroute:fleet:node:";

/// This node's report, from its local target's live counters.
pub fn own_report(node: &Node, fleet: &Fleet) -> Report {
    let local = &node.local;
    let models = local.model_names();
    let kv_free_tokens = models
        .iter()
        .filter_map(|m| local.batch_load(m))
        .map(|load| load.kv_budget.saturating_sub(load.kv_used))
        .sum();
    Report {
        node: fleet.config.node.clone(),
        zone: fleet.config.zone.clone(),
        url: fleet.config.url.clone(),
        wait_ms: local.wait_ms(),
        queue: local.queue_depth(),
        running: local.running(),
        full: local.queue_depth() >= node.config.local.max_queue,
        slots: node.config.local.max_concurrent,
        service_ms: local.service_ms().unwrap_or(0.0).round() as u32,
        kv_free_tokens,
        models,
        at_ms: crate::audit::now_ms(),
    }
}

/// Keep the fleet's view current until the node is gone.
pub fn spawn(node: Weak<Node>) {
    tokio::spawn(async move {
        let mut redis: Option<redis::aio::MultiplexedConnection> = None;
        let mut failing = false;
        loop {
            let Some(node) = node.upgrade() else { return };
            let Some(fleet) = node.fleet.clone() else {
                return;
            };
            let every = Duration::from_millis(fleet.config.report_ms);
            let report = own_report(&node, &fleet);
            drop(node);
            let result = match &fleet.config.redis {
                Some(url) => through_redis(url, &mut redis, &fleet, &report).await,
                None => {
                    poll_peers(&fleet).await;
                    Ok(())
                }
            };
            match result {
                Err(error) if !failing => {
                    tracing::warn!(%error, "fleet: cannot reach the load store; peers will go stale");
                    failing = true;
                    redis = None;
                }
                Err(_) => redis = None,
                Ok(()) if failing => {
                    tracing::info!("fleet: the load store answers again");
                    failing = false;
                }
                Ok(()) => {}
            }
            tokio::time::sleep(every).await;
        }
    });
}

async fn through_redis(
    url: &str,
    connection: &mut Option<redis::aio::MultiplexedConnection>,
    fleet: &Fleet,
    report: &Report,
) -> anyhow::Result<()> {
    if connection.is_none() {
        let client = redis::Client::open(url)?;
        *connection = Some(client.get_multiplexed_async_connection().await?);
    }
    let con = connection.as_mut().expect("connected above");
    let json = serde_json::to_string(report)?;
    redis::cmd("SET")
        .arg(format!("{KEY_PREFIX}{}", report.node))
        .arg(json)
        .arg("PX")
        .arg(fleet.config.stale_ms)
        .query_async::<()>(con)
        .await?;
    let mut keys: Vec<String> = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{KEY_PREFIX}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(con)
            .await?;
        keys.extend(batch);
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    keys.retain(|k| k != &format!("{KEY_PREFIX}{}", report.node));
    if keys.is_empty() {
        return Ok(());
    }
    let values: Vec<Option<String>> = redis::cmd("MGET").arg(&keys).query_async(con).await?;
    for value in values.into_iter().flatten() {
        match serde_json::from_str::<Report>(&value) {
            Ok(peer) => fleet.accept(peer),
            Err(error) => tracing::debug!(%error, "fleet: skipping a malformed load report"),
        }
    }
    Ok(())
}

/// Ask every configured peer for its report; one that does not answer in
/// a report interval keeps its old report, which goes stale.
async fn poll_peers(fleet: &Fleet) {
    let timeout = Duration::from_millis(fleet.config.report_ms.max(100));
    let client = match fleet.client.here() {
        Ok(client) => client,
        Err(error) => {
            tracing::warn!(%error, "no HTTP client to ask the peers for their load");
            return;
        }
    };
    let asks = fleet.config.peers.iter().map(|peer| {
        let url = format!("{}/fleet/load", peer.url.trim_end_matches('/'));
        let ask = client
            .get(url)
            .header(TOKEN_HEADER, &fleet.token)
            .timeout(timeout)
            .send();
        (peer.url.clone(), ask)
    });
    let mut tasks = tokio::task::JoinSet::new();
    for (url, ask) in asks {
        tasks.spawn(async move {
            let mut report = ask.await?.error_for_status()?.json::<Report>().await?;
            // It answered at the configured URL: forward there too,
            // whatever address it believes it has.
            report.url = url;
            Ok::<_, reqwest::Error>(report)
        });
    }
    while let Some(done) = tasks.join_next().await {
        if let Ok(Ok(report)) = done {
            fleet.accept(report);
        }
    }
}
