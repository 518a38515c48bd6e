//! Detection lives in `crates/detect` (shared with the Spin gateway
//! component); this is its constructor from the node's `[guard]` config,
//! and the node's memory of clean texts.

pub use edgeroute_detect::{Alone, CONFIDENTIAL, Detector, eval, normalize};

use crate::config::GuardConfig;
use crate::memo::Memo;
use edgeroute_core::SensitivitySet;
use serde_json::{Map, Value};

/// Clean texts remembered: an agent's tool schemas (about a hundred
/// strings for six tools) and earlier turns come on every call.
const CLEAN_TEXTS: usize = 2048;
/// Longer texts (before or after normalising) are judged every time; at
/// most 2048 × 4 KiB of text and as much again prepared is held.
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
/// A text is kept only from a request in which detection found nothing at
/// all: a text that is clean by itself but completes a finding with
/// another ("it starts 4111 1111" / "and ends 1111 1111"), or sits beside
/// one, is judged again every time, so a quick answer never says that a
/// text of a request with a finding was sent before. Entries are per
/// scope (the tenant and the level the request declared), as the memo's
/// other users are.
pub struct NodeDetector {
    detector: Detector,
    clean: Memo<(), Alone>,
}

impl NodeDetector {
    /// The node's detector for its `[guard]` config ([`detector`]).
    pub fn from_guard(guard: &GuardConfig) -> anyhow::Result<Self> {
        Ok(Self {
            detector: detector(guard)?,
            clean: Memo::new(CLEAN_TEXTS, CLEAN_TEXT_BYTES),
        })
    }

    /// `collect::detected`, each text judged alone from memory when a
    /// clean request of this `scope` sent it before.
    pub fn detected<'a>(
        &self,
        set: &mut SensitivitySet,
        scope: &str,
        messages: impl IntoIterator<Item = &'a str>,
        metadata: &Map<String, Value>,
        rest: &Map<String, Value>,
    ) {
        let mut learned = Vec::new();
        edgeroute_detect::collect::detected(
            set,
            &self.detector,
            messages,
            metadata,
            rest,
            |text| {
                self.clean.lookup(scope, text, ()).unwrap_or_else(|| {
                    let alone = self.detector.alone(text);
                    // Normalising can make a text longer: both are bounded.
                    if alone.kinds.is_empty()
                        && text.len() <= CLEAN_TEXT_BYTES
                        && alone.prepared.len() <= CLEAN_TEXT_BYTES
                    {
                        learned.push((text.to_owned(), alone.clone()));
                    }
                    alone
                })
            },
        );
        if set.detected().next().is_none() {
            for (text, alone) in learned {
                self.clean.insert(scope, &text, (), alone);
            }
        }
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

    fn body(json: &str) -> Map<String, Value> {
        serde_json::from_str(json).unwrap()
    }

    /// Detection of `messages` in `scope` through the node's memory.
    fn judge(node: &NodeDetector, scope: &str, messages: &[&str]) -> Vec<&'static str> {
        let mut set = SensitivitySet::new();
        let rest = body(r#"{"tools":[{"type":"function","function":{"name":"weather"}}]}"#);
        node.detected(
            &mut set,
            scope,
            messages.iter().copied(),
            &Map::new(),
            &rest,
        );
        set.detected().collect()
    }

    #[test]
    fn only_texts_of_requests_with_no_finding_are_remembered() {
        let node = NodeDetector::from_guard(&GuardConfig::default()).unwrap();
        let (public, restricted) = (
            crate::memo::scope(crate::tenants::OPEN, edgeroute_core::Sensitivity::Public),
            crate::memo::scope(
                crate::tenants::OPEN,
                edgeroute_core::Sensitivity::Restricted,
            ),
        );
        // A card typed in two parts: each part is clean alone.
        let parts = ["it starts 4111 1111", "and ends 1111 1111"];
        for _ in 0..3 {
            assert_eq!(judge(&node, &public, &parts), vec!["payment-card"]);
        }
        assert_eq!(node.clean.held(), 0, "nothing of a request with a finding");
        // A clean request: its texts (the message and the tool's strings).
        assert!(judge(&node, &public, &["what is the weather in Lyon?"]).is_empty());
        let kept = node.clean.held();
        assert!(kept >= 2, "{kept}");
        assert!(judge(&node, &public, &["what is the weather in Lyon?"]).is_empty());
        assert_eq!(node.clean.held(), kept, "the second time from memory");
        // Another scope is its own entries.
        judge(&node, &restricted, &["what is the weather in Lyon?"]);
        assert_eq!(node.clean.held(), 2 * kept);
        // What is remembered is what the detector gives, and a remembered
        // part still completes a card with the other part.
        let clean = "what is the weather in Lyon?";
        assert_eq!(
            node.clean.lookup(&public, clean, ()),
            Some(node.detector.alone(clean))
        );
        assert_eq!(
            judge(&node, &public, &[parts[0], parts[1], clean]),
            vec!["payment-card"]
        );
    }
}
