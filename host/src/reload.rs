//! Background upkeep of a running node: swap in the policy file when it
//! changes on disk, and persist the policy's state now and then.

use crate::node::Node;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

const POLL: Duration = Duration::from_millis(250);
const PERSIST_EVERY: Duration = Duration::from_secs(1);

/// What identifies a file version without reading it.
fn stamp(path: &PathBuf) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// Runs until the node is dropped.
pub fn spawn(node: &Arc<Node>) {
    let watched = node
        .config
        .policy
        .component
        .clone()
        .filter(|_| node.config.policy.watch);
    let weak = Arc::downgrade(node);
    tokio::spawn(async move {
        let mut seen = watched.as_ref().and_then(stamp);
        let mut last_persist = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(POLL).await;
            let Some(node) = weak.upgrade() else { return };
            if let Some(path) = &watched {
                let now = stamp(path);
                // Act once the file has stopped changing for one poll, so a
                // copy in progress is not mistaken for a broken component.
                if now.is_some() && now != seen {
                    tokio::time::sleep(POLL).await;
                    if stamp(path) == now {
                        seen = now;
                        swap_from_file(&node, path).await;
                    }
                }
            }
            if last_persist.elapsed() >= PERSIST_EVERY {
                node.policy.persist().await;
                last_persist = tokio::time::Instant::now();
            }
        }
    });
}

async fn swap_from_file(node: &Node, path: &PathBuf) {
    let bytes = match tokio::fs::read(path).await {
        Ok(bytes) => bytes,
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "policy file changed but cannot be read; keeping the active policy");
            return;
        }
    };
    match node.policy.swap(bytes, path.display().to_string()).await {
        Ok(version) => eprintln!(
            "policy file changed: swapped in {} ({:.1} ms)",
            version.id, version.load_ms
        ),
        Err(error) => eprintln!(
            "policy file changed but was refused, keeping {}: {error:#}",
            node.policy.current().id
        ),
    }
}
