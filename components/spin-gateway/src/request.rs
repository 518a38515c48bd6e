//! A chat request read the node's way: the node's own parser
//! (`edgeroute_request`: strict JSON, the same 400s, messages with offered
//! tools described), every declared and detected level
//! (`edgeroute_detect`), the features the policy sees, and what the local
//! model cannot serve.

use crate::reply::{BUDGET_HEADER, SENSITIVITY_HEADER};
use crate::settings::Settings;
use edgeroute_core::guard::Facts;
use edgeroute_core::{Features, SensitivitySet, TextStats};
use edgeroute_detect::{Settings as DetectSettings, collect};
use edgeroute_request::tools::LocalToolCalls;
use serde_json::{Map, Value};
use spin_sdk::http::HeaderMap;

/// Largest body the gateway reads (the node's default `max_body_bytes`).
pub const MAX_BODY_BYTES: usize = 1 << 20;

pub struct Chat {
    /// The client's body as sent, as an object.
    pub body: Map<String, Value>,
    pub stream: bool,
    pub sensitivity: SensitivitySet,
    pub facts: Facts,
    pub features: Features,
    /// Why the node's local model would not serve it, if it would not: the
    /// guard then places it as the node does after such a local failure.
    pub local_cannot_serve: Option<String>,
}

pub fn read(
    bytes: &[u8],
    headers: &HeaderMap,
    settings: &Settings,
    id: String,
    timing: &mut edgeroute_core::timing::Timing,
) -> Result<Chat, String> {
    // Schemas are the node's to convert (it has llama.cpp): here any
    // converts, so a response_format never counts as upstream-only.
    let prepared = edgeroute_request::parse(bytes, u32::MAX, id.clone(), 0, &|_| Ok(String::new()))
        .map_err(|invalid| invalid.message)?;
    let mut body = prepared.passthrough;
    let metadata = prepared.metadata;
    if !metadata.is_empty() {
        body.insert("metadata".into(), Value::Object(metadata.clone()));
    }
    let messages = prepared.messages;
    let tools_described_at = prepared.tools_described_at;
    let mut rest = body.clone();
    rest.remove("metadata");
    timing.mark("parse");

    // Every value of every sensitivity header; one that is not text counts
    // as restricted.
    let declared: Vec<Option<String>> = headers
        .get_all(SENSITIVITY_HEADER)
        .iter()
        .map(|v| v.to_str().ok().map(str::to_owned))
        .collect();
    let mut sensitivity = SensitivitySet::new();
    collect::declared(&mut sensitivity, &declared, &metadata);
    if settings.detect_pii {
        let detector = crate::detector::get()?;
        // The operator's own patterns and allow list: compiled per request
        // (a few regexes), on top of the built-in rules in the snapshot.
        let own;
        let detector = if settings.detect_patterns.is_empty()
            && settings.detect_allow.is_empty()
            && settings.prose_threshold == DetectSettings::default().prose_threshold
            && settings.prose_classifier_threshold
                == DetectSettings::default().prose_classifier_threshold
        {
            detector
        } else {
            own = detector.with(&DetectSettings {
                patterns: &settings.detect_patterns,
                allow: &settings.detect_allow,
                prose_threshold: settings.prose_threshold,
                prose_classifier_threshold: settings.prose_classifier_threshold,
            })?;
            &own
        };
        let texts = edgeroute_request::client_texts(&messages, tools_described_at);
        collect::detected(&mut sensitivity, detector, texts, &metadata, &rest, |text| {
            detector.alone(text)
        });
        timing.mark("detect");
    }
    let level = sensitivity.level();
    let facts = Facts::of_level(level, settings.rules.may_leave(level));

    let (stream, max_tokens) = (prepared.stream, prepared.max_tokens);
    // As the node with its default `[local] tool_calls`.
    let tools_refused = prepared
        .tools
        .as_ref()
        .and_then(|_| LocalToolCalls::default().refusal(facts.may_leave));
    let local_cannot_serve = prepared.needs_cloud.or(tools_refused).map(str::to_string);
    let latency_budget_ms = headers
        .get(BUDGET_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
        .or_else(|| {
            metadata
                .get("latency_budget_ms")
                .and_then(Value::as_u64)
                .map(|v| v.min(u32::MAX as u64) as u32)
        });
    // No tokenizer in the gateway: the node's own estimate when it has no
    // local model (four bytes a token).
    let bytes_of_text: usize = messages.iter().map(|(_, t)| t.len()).sum();
    let features = Features {
        request_id: id,
        requested_model: body
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or("auto")
            .to_owned(),
        prompt_tokens: bytes_of_text.div_ceil(4) as u32,
        max_tokens,
        sensitivity: level,
        detected: sensitivity.detected().map(str::to_owned).collect(),
        may_leave: facts.may_leave,
        task: metadata
            .get("task")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
        latency_budget_ms,
        stream,
        message_count: messages.len() as u32,
        text: TextStats::of(&messages),
        local_models: settings.local_models.clone(),
        cloud_upstreams: settings.upstreams(),
        ..Features::default()
    };
    Ok(Chat {
        body,
        stream,
        sensitivity,
        facts,
        features,
        local_cannot_serve,
    })
}
