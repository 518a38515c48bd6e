//! `POST /v1/gateway/egress`: a Spin gateway (`components/spin-gateway`)
//! reports a call it made to a cloud upstream itself, so the node's ledger
//! and egress audit log hold the gateway's cloud work beside the node's
//! own. The gateway sends its cloud calls directly (Spin's outbound HTTP,
//! limited by `allowed_outbound_hosts`), so without this the node would
//! never see them.
//!
//! ```json
//! {"request_id": "gw-…", "target": "cloud:frontier", "host": "api.example:443",
//!  "policy": "…", "reason": "…", "sensitivity": "public",
//!  "prompt_tokens": 12, "completion_tokens": 40, "bytes_sent": 310,
//!  "ok": true, "latency_ms": 812.5}
//! ```
//!
//! Only a tenant with `egress_reports = true` may report (others get a
//! 403): a report writes the ledger, so any client able to send one could
//! inflate it. Never any text of the request: the fields above only.

use super::error::ApiError;
use crate::audit::Event;
use crate::node::Node;
use crate::router::request;
use crate::tenants::Tenant;
use axum::Extension;
use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use edgeroute_core::{Prices, Sensitivity, Target, TargetKind, Usage};
use serde::Deserialize;
use std::sync::Arc;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Report {
    request_id: String,
    target: String,
    #[serde(default)]
    host: Option<String>,
    policy: String,
    reason: String,
    sensitivity: Sensitivity,
    prompt_tokens: u32,
    completion_tokens: u32,
    bytes_sent: u64,
    ok: bool,
    latency_ms: f64,
}

/// Longest text field a report may carry: ids and reasons, not content.
const MAX_FIELD: usize = 1024;
/// A day: longer is not a call's latency (and would overflow a Duration).
const MAX_LATENCY_MS: f64 = 86_400_000.0;

pub async fn post(
    State(node): State<Arc<Node>>,
    Extension(tenant): Extension<Arc<Tenant>>,
    body: Body,
) -> Result<StatusCode, ApiError> {
    if !tenant.egress_reports {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "permission_error",
            "egress_reports_not_allowed",
            format!(
                "tenant '{}' may not report egress; set egress_reports = true in its [tenants.{}]",
                tenant.name, tenant.name
            ),
        ));
    }
    let body = super::read_body(&node, body, node.config.limits.max_body_bytes).await?;
    let report: Report = request::strict_json(&body)
        .map_err(|invalid| invalid.message)
        .and_then(|value| serde_json::from_value(value).map_err(|e| e.to_string()))
        .map_err(|e| ApiError::bad_request(format!("not an egress report: {e}")))?;
    let target: Target = report
        .target
        .parse()
        .ok()
        .filter(|t: &Target| t.kind() == TargetKind::Cloud)
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "'target' must be cloud:NAME, not '{}'",
                report.target
            ))
            .param("target")
        })?;
    let texts = [
        report.request_id.as_str(),
        &report.policy,
        &report.reason,
        report.host.as_deref().unwrap_or(""),
    ];
    if texts.iter().any(|t| t.len() > MAX_FIELD)
        || !(0.0..=MAX_LATENCY_MS).contains(&report.latency_ms)
    {
        return Err(ApiError::bad_request(format!(
            "a report's text fields are at most {MAX_FIELD} bytes and latency_ms is from 0 to {MAX_LATENCY_MS}"
        )));
    }
    if node.config.guard.never_leave.contains(&report.sensitivity) {
        // The gateway's guard let out what this node's would not: its
        // never_leave differs from [guard]. Recorded all the same (the log
        // must show what left), and said loudly.
        tracing::error!(
            tenant = %tenant.name,
            request_id = %report.request_id,
            sensitivity = %report.sensitivity.name(),
            "a gateway reports {} data sent to {target}, which this node's [guard] never lets leave",
            report.sensitivity.name()
        );
    }
    let usage = Usage {
        prompt_tokens: report.prompt_tokens,
        completion_tokens: report.completion_tokens,
    };
    // Priced as the node prices the same upstream; a failed call costs nothing.
    let cost_usd = match node.cloud.upstream(target.name()) {
        Some(u) if report.ok => Prices {
            usd_per_mtok_in: u.usd_per_mtok_in,
            usd_per_mtok_out: u.usd_per_mtok_out,
        }
        .cost(usage),
        _ => 0.0,
    };
    node.ledger.record(crate::ledger::Entry {
        served_by: Some(&target),
        sensitivity: report.sensitivity,
        tenant: &tenant.name,
        task: "",
        usage,
        latency_ms: report.latency_ms,
        cost_usd,
        latency_budget_ms: None,
        confidence: None,
        escalated: false,
    });
    // In /metrics as a request of its own class, and as data let out.
    node.metrics.request(&crate::metrics::Finished {
        placement: Some(TargetKind::Cloud),
        reason: crate::metrics::ReasonClass::Reported,
        sensitivity: report.sensitivity.name(),
        ok: report.ok,
        duration: std::time::Duration::from_secs_f64(report.latency_ms / 1e3),
        first_text: None,
        completion_tokens: report.completion_tokens,
    });
    let audit = &node.cloud.audit;
    audit
        .allowed
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    audit.write(crate::audit::Record {
        at_ms: crate::audit::now_ms(),
        event: Event::Egress,
        request_id: report.request_id,
        target: target.to_string(),
        host: report.host,
        policy: report.policy,
        reason: report.reason,
        sensitivity: report.sensitivity.name().to_string(),
        refused_by: None,
        prompt_tokens: report.prompt_tokens,
        completion_tokens: report.completion_tokens,
        bytes_sent: report.bytes_sent,
        ok: report.ok,
        via: Some(tenant.name.clone()),
    });
    Ok(StatusCode::NO_CONTENT)
}
