//! The policy world's `host` interface on plain WASI, for a policy that a
//! Spin gateway runs as a component dependency: no edgeroute node is there
//! to provide it, and Spin wires a dependency's imports only to itself.
//! `scripts/spin-policy.sh` composes this component into a policy that
//! imports `host`; the result imports WASI's stderr and wall clock, which
//! Spin provides.
//!
//! `log` writes one line to stderr (Spin keeps a component's stderr in its
//! logs), cut and cleaned as the node does; there is no rate limit, since
//! a Spin instance lives for one request. `now-ms` reads the wall clock.

wit_bindgen::generate!({
    world: "policy-host",
    path: "../../wit/routing-0.2",
});

use exports::edgeroute::routing::host::{Guest, LogLevel};
use std::io::Write;

/// A line is cut at this many bytes, as on the node.
const MAX_LINE: usize = 1024;

struct Host;

impl Guest for Host {
    fn log(level: LogLevel, message: String) {
        let level = match level {
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
        };
        let line = clean(&message);
        // Nowhere to report a failed write to: the line is dropped.
        let _ = writeln!(std::io::stderr(), "[policy] {level}: {line}");
    }

    fn now_ms() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }
}

/// At most [`MAX_LINE`] bytes (on a character boundary), control
/// characters as spaces: one message is one line of the log.
fn clean(message: &str) -> String {
    let mut end = message.len().min(MAX_LINE);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    message[..end]
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

export!(Host);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_is_one_line_of_at_most_1024_bytes() {
        assert_eq!(clean("a\nb\tc"), "a b c");
        let long = "é".repeat(600);
        let cut = clean(&long);
        assert!(cut.len() <= MAX_LINE && cut.chars().all(|c| c == 'é'));
    }
}
