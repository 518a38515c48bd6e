//! Names unique to a test run and call: temp directories, prompt canaries.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A string unique to this process and call (for temp names and prompt
/// canaries). Letters only after `label`, so a canary never looks like a
/// phone number or an ID to the node's PII scan.
pub fn unique(label: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{label}-{}-{}-{}",
        letters(u64::from(std::process::id())),
        letters(COUNTER.fetch_add(1, Ordering::Relaxed)),
        letters(u64::from(nanos))
    )
}

/// `n` in base 26 with digits a..z (the parts of a [`unique`] name).
pub fn letters(mut n: u64) -> String {
    let mut out = Vec::new();
    loop {
        out.push(b'a' + (n % 26) as u8);
        n /= 26;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).expect("ASCII")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_names_are_letters() {
        let a = unique("canary");
        let b = unique("canary");
        assert_ne!(a, b);
        assert!(a.starts_with("canary-"));
        assert!(
            a["canary".len()..]
                .chars()
                .all(|c| c == '-' || c.is_ascii_lowercase()),
            "{a}"
        );
        assert_eq!(letters(0), "a");
        assert_eq!(letters(27), "bb");
    }
}
