//! A policy's state on disk, so a learned policy survives a restart. The
//! host decides when; this file only knows how: write to a temporary file
//! and rename, so a crash never leaves half a state file.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

pub struct StateFile {
    path: PathBuf,
    /// Set when the active policy's state may have changed since the last
    /// write.
    dirty: AtomicBool,
}

impl StateFile {
    /// The state file in `dir`, which is created if missing.
    pub fn in_dir(dir: &std::path::Path) -> anyhow::Result<Self> {
        use anyhow::Context;
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create state directory {}", dir.display()))?;
        Ok(Self {
            path: dir.join("policy-state.bin"),
            dirty: AtomicBool::new(false),
        })
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    pub fn mark_dirty(&self) {
        self.dirty.store(true, Ordering::Relaxed);
    }

    /// Whether a write is due; clears the mark.
    pub fn take_dirty(&self) -> bool {
        self.dirty.swap(false, Ordering::Relaxed)
    }

    pub async fn write(&self, state: &[u8]) {
        let tmp = self.path.with_extension("tmp");
        let written = tokio::fs::write(&tmp, state)
            .await
            .and(tokio::fs::rename(&tmp, &self.path).await);
        if let Err(error) = written {
            tracing::warn!(path = %self.path.display(), %error, "could not persist policy state");
            self.mark_dirty();
        }
    }

    pub fn read(&self) -> Option<Vec<u8>> {
        std::fs::read(&self.path).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn state_round_trips_through_the_file_and_dirty_is_one_shot() {
        let dir = std::env::temp_dir().join(format!("edgeroute-persist-{}", std::process::id()));
        let file = StateFile::in_dir(&dir).unwrap();
        assert_eq!(file.read(), None);
        file.mark_dirty();
        assert!(file.take_dirty());
        assert!(!file.take_dirty());
        file.write(b"weights").await;
        assert_eq!(file.read().as_deref(), Some(&b"weights"[..]));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
