//! What a routing policy sees of a request, in the host's terms. Each
//! policy world version gets it converted into its own WIT record; a field
//! an older version lacks is simply not shown to it.

use crate::estimate::Estimate;
use crate::sensitivity::Sensitivity;
use serde::{Deserialize, Serialize};

/// Serialisable so a node's decision log can hold them and a replay can
/// give them to another policy (they never contain prompt text).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Features {
    pub request_id: String,
    pub requested_model: String,
    /// Counted with the local model's tokenizer, chat template included.
    pub prompt_tokens: u32,
    /// Leading prompt tokens the local model's prefix cache holds for this
    /// request (a local run prefills only the rest).
    pub cached_prefix_tokens: u32,
    pub max_tokens: u32,
    pub sensitivity: Sensitivity,
    /// The kinds of data detectors found (not the data).
    pub detected: Vec<String>,
    pub may_leave: bool,
    pub task: String,
    pub latency_budget_ms: Option<u32>,
    pub stream: bool,
    pub message_count: u32,
    /// Cheap statistics of the prompt's text (not the text).
    pub text: TextStats,
    pub local_queue_depth: u32,
    /// Generations running on the local model now.
    pub local_running: u32,
    /// The host's estimate of a new request's wait before its prefill.
    pub local_wait_ms: u32,
    /// The host's estimate of this request on the first local model; None
    /// before the model has generated once.
    pub local_estimate: Option<Estimate>,
    /// The same for each upstream it has seen answer.
    pub cloud_estimates: Vec<(String, Estimate)>,
    pub local_models: Vec<String>,
    pub cloud_upstreams: Vec<String>,
    /// Peers of the fleet this request may be forwarded to now (fresh,
    /// not full, reachable for its level); empty on a single node and for
    /// a request that was forwarded here.
    #[serde(default)]
    pub peers: Vec<PeerFeature>,
    /// The peer the host would choose among them (the session's home, or
    /// the power of two choices among those that fit the latency budget).
    #[serde(default)]
    pub peer_pick: Option<String>,
    /// The last user message's sentence embedding (unit length), only when
    /// the policy asked for it (`Needs::embedding`): it costs milliseconds.
    /// Never written to the decision log (it stands for the text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embedding: Option<Vec<f32>>,
}

/// A peer as a policy sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerFeature {
    /// Shared with the fleet's table: a decision over hundreds of peers
    /// copies no names.
    pub name: std::sync::Arc<str>,
    /// The host's estimate of a request's wait there: the peer's last
    /// report plus what this node sent it since.
    pub wait_ms: u32,
    /// In this node's trust zone.
    pub same_zone: bool,
    /// The agent session's home node (it likely holds the session's prefix).
    pub session_home: bool,
}

/// Signals that cost real work per request; the host computes them only
/// for a policy that declared it needs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Needs {
    pub embedding: bool,
}

/// Statistics a policy may use as a cheap complexity signal. They count
/// the user's messages only (a system prompt is the same on every call).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TextStats {
    /// Characters (Unicode scalar values).
    pub chars: u32,
    /// Whitespace-separated words.
    pub words: u32,
    /// Decimal digits.
    pub digits: u32,
    /// A code fence or a line that looks like code.
    pub code: bool,
    /// The last user message asks a question.
    pub question: bool,
    /// Characters outside ASCII, per thousand: a rough sign of a language
    /// other than English, which a small local model handles worse.
    pub non_ascii_permille: u32,
}

impl TextStats {
    /// `messages` are (role, content) pairs in order.
    pub fn of(messages: &[(String, String)]) -> Self {
        let mut stats = TextStats::default();
        let mut non_ascii = 0u64;
        let mut user = messages.iter().filter(|(role, _)| role == "user");
        for (_, text) in user.clone() {
            for c in text.chars() {
                stats.chars += 1;
                stats.digits += c.is_ascii_digit() as u32;
                non_ascii += !c.is_ascii() as u64;
            }
            stats.words += text.split_whitespace().count() as u32;
            stats.code |= looks_like_code(text);
        }
        if let Some((_, last)) = user.next_back() {
            stats.question = asks(last);
        }
        if stats.chars > 0 {
            stats.non_ascii_permille = (non_ascii * 1000 / stats.chars as u64) as u32;
        }
        stats
    }
}

fn looks_like_code(text: &str) -> bool {
    const MARKERS: [&str; 8] = [
        "```", "fn ", "def ", "#include", "=> ", "};", "import ", "</",
    ];
    MARKERS.iter().any(|m| text.contains(m))
}

fn asks(text: &str) -> bool {
    const OPENERS: [&str; 12] = [
        "what", "why", "how", "when", "where", "who", "which", "can", "could", "is", "are", "does",
    ];
    let text = text.trim();
    let first = text
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_lowercase();
    text.ends_with('?') || OPENERS.contains(&first.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(messages: &[(&str, &str)]) -> TextStats {
        let owned: Vec<(String, String)> = messages
            .iter()
            .map(|(r, c)| (r.to_string(), c.to_string()))
            .collect();
        TextStats::of(&owned)
    }

    #[test]
    fn counts_the_user_text_only() {
        let s = of(&[
            ("system", "You are helpful. 12345"),
            ("user", "Add 2 and 40"),
        ]);
        assert_eq!((s.chars, s.words, s.digits), (12, 4, 3));
        assert!(!s.code && !s.question);
        assert_eq!(s.non_ascii_permille, 0);
    }

    #[test]
    fn questions_code_and_other_scripts() {
        assert!(of(&[("user", "what is rust")]).question);
        assert!(of(&[("user", "Tell me. Really?")]).question);
        assert!(!of(&[("user", "why?"), ("user", "Say hi.")]).question);
        assert!(of(&[("user", "fix:\n```\nlet x = 1;\n```")]).code);
        assert!(of(&[("user", "Привет")]).non_ascii_permille == 1000);
        assert_eq!(of(&[]), TextStats::default());
    }
}
