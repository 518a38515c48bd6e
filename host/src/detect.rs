//! Detection lives in `crates/detect` (shared with the Spin gateway
//! component); this is its constructor from the node's `[guard]` config,
//! and the node's memory of clean texts.

pub use edgeroute_detect::{Alone, CONFIDENTIAL, Detector, eval, normalize};

use crate::config::GuardConfig;
use crate::memo::Memo;

/// Clean texts remembered: an agent's tool schemas (about a hundred
/// strings for six tools) and earlier turns come on every call.
const CLEAN_TEXTS: usize = 2048;
/// Longer texts are judged every time; at most 2048 × 4 KiB of text (and
/// as much again prepared) is held.
const CLEAN_TEXT_BYTES: usize = 4 * 1024;

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

/// The node's detector, remembering the texts in which it found nothing.
///
/// Only clean texts are kept: a text that holds something is judged
/// again on every request, so a quick answer never says that a text with
/// a finding was sent before. Entries are per scope (the tenant and the
/// level the request declared), as the memo's other users are.
pub struct NodeDetector {
    detector: Detector,
    clean: Memo<(), Alone>,
}

impl NodeDetector {
    pub fn new(detector: Detector) -> Self {
        Self {
            detector,
            clean: Memo::new(CLEAN_TEXTS, CLEAN_TEXT_BYTES),
        }
    }

    /// [`Detector::alone`], remembered for a clean text in `scope`.
    pub fn alone_in(&self, scope: &str, text: &str) -> Alone {
        self.clean.get(
            scope,
            text,
            (),
            || self.detector.alone(text),
            |alone| alone.kinds.is_empty(),
        )
    }
}

impl std::ops::Deref for NodeDetector {
    type Target = Detector;

    fn deref(&self) -> &Detector {
        &self.detector
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_clean_texts_are_remembered_and_each_scope_has_its_own() {
        let node = NodeDetector::new(detector(&GuardConfig::default()).unwrap());
        let card = "my card is 4111 1111 1111 1111";
        for _ in 0..3 {
            assert_eq!(
                node.alone_in("open\0public", card).kinds,
                vec!["payment-card"]
            );
        }
        assert_eq!(node.clean.held(), 0, "a text with a finding is never kept");
        let clean = "type: function";
        let first = node.alone_in("open\0public", clean);
        assert!(first.kinds.is_empty());
        assert_eq!(node.alone_in("open\0public", clean), first);
        assert_eq!(node.clean.held(), 1);
        node.alone_in("open\0restricted", clean);
        assert_eq!(node.clean.held(), 2, "another scope is its own entry");
        // What is remembered is what the detector gives.
        assert_eq!(first, node.detector.alone(clean));
    }
}
