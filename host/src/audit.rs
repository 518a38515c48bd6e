//! The egress audit log: one JSON line per call that took a request's data
//! off the node, and one per attempt the node refused — what a privacy
//! review asks for first. Never the text: ids, the target, the policy
//! version and its reason, the sensitivity, token counts and the bytes
//! sent. On by default (`[audit]`), appended to a file under the state
//! directory and rotated by size (`FILE` → `FILE.1` → … → `FILE.KEEP`).
//!
//! A request only queues its record; a background thread writes the queue
//! in order every 50 ms, one `write` per line, and the node flushes it
//! before it exits.

use crate::config::AuditConfig;
use anyhow::Context;
use serde::Serialize;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// What happened at the egress boundary.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Event {
    /// A call that passed the egress guard: the request's data left.
    Egress,
    /// An attempt to send a request's data out that was refused.
    Refused,
}

/// One line. Field names are the format (README: "The egress audit log").
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    /// Unix time in milliseconds.
    pub at_ms: u64,
    pub event: Event,
    pub request_id: String,
    /// `cloud:NAME` (a peer later).
    pub target: String,
    /// The `host:port` the data went to (or was headed for).
    pub host: Option<String>,
    /// The policy version that placed the request.
    pub policy: String,
    pub reason: String,
    pub sensitivity: String,
    /// Who refused: `guard` (the placement) or `egress` (wasi:http).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused_by: Option<&'static str>,
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    /// Request body bytes that went out (0 when refused).
    pub bytes_sent: u64,
    /// Whether the upstream answered.
    pub ok: bool,
    /// The tenant that made the call itself and reported it (a Spin
    /// gateway, `POST /v1/gateway/egress`); absent for the node's own calls.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The file and its size; only the writer thread touches it.
struct Writer {
    path: PathBuf,
    max_bytes: u64,
    keep: u32,
    file: File,
    size: u64,
}

/// Records queued by requests, written by the flusher thread.
struct Shared {
    pending: Mutex<Vec<Record>>,
    writer: Mutex<Writer>,
}

impl Shared {
    /// Write everything queued so far, in order.
    fn drain(&self) {
        let mut writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let records = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()));
        for record in &records {
            writer.write(record);
        }
    }
}

/// How often the flusher writes what requests queued. A request only
/// pushes its record under a lock (no file write, no thread wake-up); the
/// price is that a line reaches the file up to this long after its request.
const FLUSH_EVERY: Duration = Duration::from_millis(50);
/// Beyond this many queued lines (a stalled disk) a request writes the
/// queue itself rather than letting it grow: an audit log drops nothing.
const MAX_PENDING: usize = 65_536;

pub struct AuditLog {
    path: PathBuf,
    shared: Arc<Shared>,
}

impl AuditLog {
    /// The log of `config`, with a relative `path` under `state_dir`;
    /// None when it is turned off.
    pub fn from_config(config: &AuditConfig, state_dir: &Path) -> anyhow::Result<Option<Self>> {
        if !config.enabled {
            return Ok(None);
        }
        Self::open(&state_dir.join(&config.path), config.max_bytes, config.keep).map(Some)
    }

    pub fn open(path: &Path, max_bytes: u64, keep: u32) -> anyhow::Result<Self> {
        let shared = Arc::new(Shared {
            pending: Mutex::default(),
            writer: Mutex::new(Writer::open(path, max_bytes, keep)?),
        });
        // The thread holds only a weak reference: it ends with the log.
        let weak = Arc::downgrade(&shared);
        std::thread::Builder::new()
            .name("egress-audit".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(FLUSH_EVERY);
                    match weak.upgrade() {
                        Some(shared) => shared.drain(),
                        None => return,
                    }
                }
            })
            .context("cannot start the audit log writer")?;
        Ok(Self {
            path: path.to_path_buf(),
            shared,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Queue one line. The egress decision was already made by the guard;
    /// writing it never fails a request.
    pub fn write(&self, record: Record) {
        let backlog = {
            let mut pending = self
                .shared
                .pending
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            pending.push(record);
            pending.len()
        };
        if backlog >= MAX_PENDING {
            self.shared.drain();
        }
    }

    /// Write every line queued so far.
    pub fn flush(&self) {
        self.shared.drain();
    }
}

impl Drop for AuditLog {
    fn drop(&mut self) {
        self.shared.drain();
    }
}

impl Writer {
    fn open(path: &Path, max_bytes: u64, keep: u32) -> anyhow::Result<Self> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create the audit log folder {}", dir.display()))?;
        }
        let file = append(path)?;
        let size = file.metadata().map(|m| m.len()).unwrap_or(0);
        Ok(Self {
            path: path.to_path_buf(),
            max_bytes: max_bytes.max(1),
            keep,
            file,
            size,
        })
    }

    fn write(&mut self, record: &Record) {
        let mut line = match serde_json::to_vec(record) {
            Ok(line) => line,
            Err(e) => {
                tracing::error!(error = %e, "cannot encode an audit record");
                return;
            }
        };
        line.push(b'\n');
        if self.size > 0
            && self.size + line.len() as u64 > self.max_bytes
            && let Err(e) = self.rotate()
        {
            tracing::error!(error = %format!("{e:#}"), path = %self.path.display(), "cannot rotate the audit log");
        }
        // One `write` per line (append mode), so a reader never sees half
        // a line from us.
        match self.file.write_all(&line) {
            Ok(()) => self.size += line.len() as u64,
            Err(e) => {
                tracing::error!(error = %e, path = %self.path.display(), "cannot write the audit log")
            }
        }
    }

    /// `FILE.{keep-1}` → `FILE.{keep}`, …, `FILE` → `FILE.1`, and a new
    /// `FILE`; the oldest beyond `keep` is dropped.
    fn rotate(&mut self) -> anyhow::Result<()> {
        let numbered = |n: u32| PathBuf::from(format!("{}.{n}", self.path.display()));
        if self.keep == 0 {
            std::fs::remove_file(&self.path).ok();
        } else {
            for n in (1..self.keep).rev() {
                if numbered(n).exists() {
                    std::fs::rename(numbered(n), numbered(n + 1))?;
                }
            }
            std::fs::rename(&self.path, numbered(1))?;
        }
        self.file = append(&self.path)?;
        self.size = 0;
        Ok(())
    }
}

fn append(path: &Path) -> anyhow::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("cannot open the audit log {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str) -> Record {
        Record {
            at_ms: 1,
            event: Event::Egress,
            request_id: id.into(),
            target: "cloud:frontier".into(),
            host: Some("127.0.0.1:9".into()),
            policy: "abc".into(),
            reason: "long prompt".into(),
            sensitivity: "public".into(),
            refused_by: None,
            prompt_tokens: 10,
            completion_tokens: 5,
            bytes_sent: 321,
            ok: true,
            via: None,
        }
    }

    fn lines(path: &Path) -> Vec<String> {
        std::fs::read_to_string(path)
            .map(|s| s.lines().map(str::to_string).collect())
            .unwrap_or_default()
    }

    #[test]
    fn rotates_by_size_and_keeps_the_newest_files() {
        let dir = std::env::temp_dir().join(format!("edgeroute-audit-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        let path = dir.join("audit.jsonl");
        let one = serde_json::to_vec(&record("r-0")).unwrap().len() as u64 + 1;
        // Room for two lines per file, two rotated files kept.
        let log = AuditLog::open(&path, 2 * one, 2).unwrap();
        for i in 0..7 {
            log.write(record(&format!("r-{i}")));
        }
        log.flush();
        let ids = |p: &Path| -> Vec<String> {
            lines(p)
                .iter()
                .map(|l| {
                    serde_json::from_str::<serde_json::Value>(l).unwrap()["request_id"]
                        .as_str()
                        .unwrap()
                        .to_string()
                })
                .collect()
        };
        assert_eq!(ids(&path), ["r-6"]);
        assert_eq!(ids(&dir.join("audit.jsonl.1")), ["r-4", "r-5"]);
        assert_eq!(ids(&dir.join("audit.jsonl.2")), ["r-2", "r-3"]);
        assert!(
            !dir.join("audit.jsonl.3").exists(),
            "only `keep` old files stay"
        );
        // A reopened log continues the file and its size.
        drop(log);
        let log = AuditLog::open(&path, 2 * one, 2).unwrap();
        log.write(record("r-7"));
        log.flush();
        assert_eq!(ids(&path), ["r-6", "r-7"]);
        std::fs::remove_dir_all(&dir).ok();
    }
}
