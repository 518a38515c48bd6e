//! Detection lives in `crates/detect` (shared with the Spin gateway
//! component); this is its constructor from the node's `[guard]` config.

pub use edgeroute_detect::{CONFIDENTIAL, Detector, eval, normalize};

use crate::config::GuardConfig;

/// The built-in rules plus `[guard] patterns`, minus `[guard] allow`.
pub fn detector(guard: &GuardConfig) -> anyhow::Result<Detector> {
    Detector::new(&edgeroute_detect::Settings {
        patterns: &guard.patterns,
        allow: &guard.allow,
        prose_threshold: guard.prose_threshold,
        prose_classifier_threshold: guard.prose_classifier_threshold,
    })
    .map_err(anyhow::Error::msg)
}
