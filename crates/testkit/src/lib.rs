//! Support for edgeroute's end-to-end tests (`tests/e2e/`).
//!
//! - [`FakeCloud`] (`cloud.rs`): a real OpenAI-compatible HTTP server on
//!   loopback that records every request it receives, so a test can prove
//!   what did and did not leave the node.
//! - [`Edgeroute`], [`NodeBuilder`], [`Node`] (`node.rs`): the real
//!   `edgeroute` binary, started with `edgeroute up` on a config written for
//!   the test, killed on drop.
//! - [`Resp`], [`StreamSummary`] (`resp.rs`): an HTTP response that never
//!   turns a 4xx/5xx into a panic, with helpers for OpenAI-style JSON, SSE
//!   streams and the routing headers.
//! - `http.rs`: the HTTP clients behind [`Node`], among them a raw HTTP/1.1
//!   client for bodies no well-behaved client would send.
//! - [`Browser`] (`browser.rs`): headless Chromium over WebDriver, for the
//!   dashboard.
//! - [`Redis`] (`redis.rs`): a real `redis-server` on loopback, the
//!   fleet's load store.
//! - [`unique`] (`names.rs`): names and prompt canaries unique to a call.
//! - [`exclusive`] (`exclusive.rs`): the machine to oneself, for work that
//!   must not share the cores with another test's node.
//!
//! The binary under test is known only to the test target that cargo builds
//! it for (`env!("CARGO_BIN_EXE_edgeroute")`), so the test binary hands it
//! over once:
//!
//! ```rust
//! use edgeroute_testkit::{Edgeroute, FakeCloud};
//!
//! const EDGEROUTE: Edgeroute = Edgeroute::new(env!("CARGO_BIN_EXE_edgeroute"));
//!
//! // In a test:
//! let cloud = FakeCloud::start();
//! let node = EDGEROUTE.node(&cloud).max_queue(0).start(); // or EDGEROUTE.start(&cloud)
//! let resp = node.get("/healthz");
//! assert_eq!(resp.status, 200, "{resp:?}");
//! assert!(cloud.chat_requests().is_empty(), "{}", cloud.describe());
//! ```

use std::sync::{Mutex, MutexGuard};

mod browser;
mod cloud;
mod exclusive;
mod http;
mod names;
mod node;
mod redis;
mod resp;

pub use browser::Browser;
pub use cloud::{FAKE_RATE_LIMIT, FAKE_TOOL_ARGUMENTS, FAKE_TOOL_CALL_ID, FakeCloud, Recorded};
pub use exclusive::{Exclusive, exclusive};
pub use http::{post_json, post_raw_to};
pub use names::{letters, unique};
pub use node::{EMBEDDING_NAME, Edgeroute, Node, NodeBuilder};
pub use redis::Redis;
pub use resp::{Resp, StreamSummary};

/// The repository root (this crate lives in `<root>/crates/testkit`).
pub const REPO_ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
/// Name of the local model in the test config.
pub const LOCAL_MODEL: &str = "smollm2";
/// Name of the cloud upstream in the test config.
pub const UPSTREAM: &str = "frontier";
/// The model the test config asks the upstream for.
pub const UPSTREAM_MODEL: &str = "frontier-large";
/// Environment variable the test config names for the upstream API key.
pub const API_KEY_ENV: &str = "EDGEROUTE_FRONTIER_KEY";
/// What [`FakeCloud`] answers to every chat completion.
pub const CLOUD_REPLY: &str = "cloud says hi";

/// The most a helper reads of any HTTP body.
const MAX_READ: u64 = 64 * 1024 * 1024;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking test thread must not hide what was recorded.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `s` cut to at most `max` bytes (on a character boundary), for messages.
fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes in all)", &s[..end], s.len())
}
