//! What the policy gets to see of a request: sizes, sensitivity, task,
//! budget and load — never the prompt text itself.

use crate::api::error::ApiError;
use crate::api::request::Prepared;
use crate::bindings::policy::{Features, Sensitivity};
use crate::config::GuardConfig;
use crate::pii;
use crate::targets::cloud::CloudTarget;
use crate::targets::local::LocalTarget;
use axum::http::HeaderMap;

pub const SENSITIVITY_HEADER: &str = "x-edgeroute-sensitivity";
pub const LATENCY_BUDGET_HEADER: &str = "x-edgeroute-latency-budget-ms";

pub fn sensitivity_name(s: Sensitivity) -> &'static str {
    match s {
        Sensitivity::Public => "public",
        Sensitivity::Internal => "internal",
        Sensitivity::Restricted => "restricted",
    }
}

/// Unknown labels count as the most sensitive: a typo must not leak data.
fn parse_sensitivity(label: &str) -> Sensitivity {
    match label.trim().to_ascii_lowercase().as_str() {
        "public" => Sensitivity::Public,
        "internal" => Sensitivity::Internal,
        _ => Sensitivity::Restricted,
    }
}

fn rank(s: Sensitivity) -> u8 {
    match s {
        Sensitivity::Public => 0,
        Sensitivity::Internal => 1,
        Sensitivity::Restricted => 2,
    }
}

/// The declared sensitivity: the higher of header and `metadata.sensitivity`;
/// public when neither is given.
fn declared(headers: &HeaderMap, request: &Prepared) -> Sensitivity {
    let from_header = headers
        .get(SENSITIVITY_HEADER)
        .map(|value| match value.to_str() {
            Ok(label) => parse_sensitivity(label),
            Err(_) => Sensitivity::Restricted,
        });
    let from_body = request
        .metadata
        .get("sensitivity")
        .map(|value| match value.as_str() {
            Some(label) => parse_sensitivity(label),
            None => Sensitivity::Restricted,
        });
    [from_header, from_body]
        .into_iter()
        .flatten()
        .max_by_key(|s| rank(*s))
        .unwrap_or(Sensitivity::Public)
}

pub fn may_leave(sensitivity: Sensitivity, guard: &GuardConfig) -> bool {
    let name = sensitivity_name(sensitivity);
    !guard
        .never_leave
        .iter()
        .any(|level| level.eq_ignore_ascii_case(name))
}

/// Prompt tokens as the local model counts them (its chat template
/// included); a byte estimate when no local model is loaded.
fn prompt_tokens(request: &Prepared, local: &LocalTarget) -> Result<u32, ApiError> {
    let Some(model) = local
        .model_names()
        .first()
        .and_then(|name| local.model(name).cloned())
    else {
        let bytes: usize = request.messages.iter().map(|(_, text)| text.len()).sum();
        return Ok(bytes.div_ceil(4) as u32);
    };
    let prompt = model
        .render_chat(&request.messages)
        .map_err(|e| ApiError::bad_request(format!("cannot format the messages: {e:#}")))?;
    Ok(model.tokenize(&prompt).len() as u32)
}

pub fn extract(
    request: &Prepared,
    headers: &HeaderMap,
    guard: &GuardConfig,
    local: &LocalTarget,
    cloud: &CloudTarget,
) -> Result<Features, ApiError> {
    let mut sensitivity = declared(headers, request);
    let pii_found = guard.detect_pii
        && request
            .messages
            .iter()
            .any(|(_, text)| !pii::detect(text).is_empty());
    if pii_found {
        sensitivity = Sensitivity::Restricted;
    }
    let latency_budget_ms = headers
        .get(LATENCY_BUDGET_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
        .or_else(|| {
            request
                .metadata
                .get("latency_budget_ms")
                .and_then(|v| v.as_u64())
                .map(|v| v.min(u32::MAX as u64) as u32)
        });
    Ok(Features {
        request_id: request.id.clone(),
        requested_model: request.requested_model.clone(),
        prompt_tokens: prompt_tokens(request, local)?,
        max_tokens: request.max_tokens,
        sensitivity,
        pii_detected: pii_found,
        may_leave: may_leave(sensitivity, guard),
        task: request
            .metadata
            .get("task")
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string(),
        latency_budget_ms,
        stream: request.stream,
        local_queue_depth: local.queue_depth(),
        local_models: local.model_names(),
        cloud_upstreams: cloud.upstream_names(),
    })
}
