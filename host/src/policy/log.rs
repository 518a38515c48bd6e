//! A policy's lines in the node's log (`edgeroute:routing/host.log`, WIT
//! 0.2): tagged with the version's id, cleaned, cut, and rate-limited per
//! version so a policy that logs on every request cannot flood the node's
//! log (a token bucket: 10 lines a second, bursts of 20).

use std::sync::{Arc, Mutex};
use std::time::Instant;

const PER_SECOND: f64 = 10.0;
const BURST: f64 = 20.0;
/// The longest line kept, in bytes (cut at a character boundary).
const MAX_LINE: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Debug,
    Info,
    Warn,
    Error,
}

struct Bucket {
    tokens: f64,
    refilled: Instant,
    dropped: u64,
}

/// Shared by every instance of one policy version.
#[derive(Clone)]
pub struct PolicyLog {
    policy: Arc<str>,
    bucket: Arc<Mutex<Bucket>>,
}

impl PolicyLog {
    pub fn new(policy: &str) -> Self {
        Self {
            policy: policy.into(),
            bucket: Arc::new(Mutex::new(Bucket {
                tokens: BURST,
                refilled: Instant::now(),
                dropped: 0,
            })),
        }
    }

    /// The line as it will be logged, or None when over the rate: then it
    /// is counted, and the next line that passes says how many were lost.
    pub fn admit(&self, message: &str) -> Option<String> {
        let dropped = {
            let mut b = self.bucket.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            b.tokens =
                (b.tokens + now.duration_since(b.refilled).as_secs_f64() * PER_SECOND).min(BURST);
            b.refilled = now;
            if b.tokens < 1.0 {
                b.dropped += 1;
                return None;
            }
            b.tokens -= 1.0;
            std::mem::take(&mut b.dropped)
        };
        let mut line: String = message
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        if line.len() > MAX_LINE {
            let mut cut = MAX_LINE;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            line.truncate(cut);
            line.push('…');
        }
        if dropped > 0 {
            line.push_str(&format!(
                " ({dropped} earlier lines dropped: over 10 a second)"
            ));
        }
        Some(line)
    }

    pub fn write(&self, level: Level, message: &str) {
        let Some(line) = self.admit(message) else {
            return;
        };
        let policy = &*self.policy;
        match level {
            Level::Debug => tracing::debug!(target: "policy", %policy, "{line}"),
            Level::Info => tracing::info!(target: "policy", %policy, "{line}"),
            Level::Warn => tracing::warn!(target: "policy", %policy, "{line}"),
            Level::Error => tracing::error!(target: "policy", %policy, "{line}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bursts_pass_then_lines_are_dropped_and_counted() {
        let log = PolicyLog::new("abc");
        let passed = (0..25).filter(|_| log.admit("hello").is_some()).count();
        // 20 in the burst, and at most one more refilled while looping.
        assert!((20..=21).contains(&passed), "{passed}");
        std::thread::sleep(std::time::Duration::from_millis(150));
        let next = log.admit("again").expect("refilled after 100 ms");
        assert!(next.starts_with("again ("), "{next}");
        assert!(next.contains("earlier lines dropped"), "{next}");
    }

    #[test]
    fn lines_are_cleaned_and_cut() {
        let log = PolicyLog::new("abc");
        assert_eq!(log.admit("a\nb\u{1b}[31mc").unwrap(), "a b [31mc");
        let long = "é".repeat(1000);
        let line = log.admit(&long).unwrap();
        assert!(line.len() <= MAX_LINE + '…'.len_utf8(), "{}", line.len());
        assert!(line.ends_with('…'));
    }
}
