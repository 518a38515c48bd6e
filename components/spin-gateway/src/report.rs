//! What the gateway tells the node about a cloud call it made itself: the
//! node's `POST /v1/gateway/egress` writes it into the node's ledger and
//! egress audit log (the gateway's key needs `egress_reports = true` in
//! its tenant). Ids, the target, the reason, the level and token counts:
//! never the request's text.
//!
//! The report is sent after the answer has gone to the client
//! (`spin_sdk::wasip3::spawn`: the instance finishes it after returning),
//! so the client never waits for it; a report that fails is written to
//! the component's log, and the answer is not affected.

use crate::dispatch;
use crate::request::Chat;
use crate::settings::Settings;
use std::time::Instant;

/// A cloud call under way.
pub struct CloudCall {
    report: serde_json::Map<String, serde_json::Value>,
    url: String,
    auth: Option<(&'static str, String)>,
    started: Instant,
}

impl CloudCall {
    pub fn start(settings: &Settings, chat: &Chat, reason: &str, bytes_sent: usize) -> Self {
        let report = serde_json::json!({
            "request_id": chat.features.request_id,
            "target": format!("cloud:{}", settings.upstream_name),
            "host": host_of(&settings.upstream_url),
            "policy": "spin-gateway",
            "reason": reason,
            "sensitivity": chat.sensitivity.level().name(),
            "prompt_tokens": chat.features.prompt_tokens,
            "bytes_sent": bytes_sent,
        });
        Self {
            report: report.as_object().cloned().unwrap_or_default(),
            url: format!("{}/v1/gateway/egress", settings.node_url),
            auth: dispatch::node_auth(settings),
            started: Instant::now(),
        }
    }

    /// The call ended (`ok`: the upstream answered with success); `body`
    /// is a whole answer, whose `usage` is the upstream's own count. A
    /// stream's completion tokens are not counted here.
    pub fn finish(mut self, ok: bool, body: Option<&[u8]>) {
        let usage = body
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(b).ok())
            .and_then(|v| v.get("usage").cloned());
        let count = |name: &str| usage.as_ref().and_then(|u| u.get(name)?.as_u64());
        if let Some(prompt) = count("prompt_tokens") {
            self.report.insert("prompt_tokens".into(), prompt.into());
        }
        self.report.insert(
            "completion_tokens".into(),
            count("completion_tokens").unwrap_or(0).into(),
        );
        self.report.insert("ok".into(), ok.into());
        let latency_ms = self.started.elapsed().as_secs_f64() * 1e3;
        self.report.insert("latency_ms".into(), latency_ms.into());
        let body = serde_json::to_vec(&self.report).expect("a JSON map serialises");
        let headers: Vec<_> = self.auth.into_iter().collect();
        let url = self.url;
        spin_sdk::wasip3::spawn(async move {
            match dispatch::post(&url, headers, body, "the edgeroute node").await {
                Ok(response) if response.status().is_success() => {}
                Ok(response) => eprintln!(
                    "edgeroute gateway: the node refused an egress report ({})",
                    response.status()
                ),
                Err(_) => eprintln!("edgeroute gateway: the node did not take an egress report"),
            }
        });
    }
}

/// `host:port` of a URL, as the node's audit log writes it.
fn host_of(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit('@').next()?;
    if authority.is_empty() {
        return None;
    }
    if authority
        .rsplit_once(':')
        .is_some_and(|(_, port)| port.parse::<u16>().is_ok())
    {
        return Some(authority.to_string());
    }
    let port = if scheme.eq_ignore_ascii_case("https") {
        443
    } else {
        80
    };
    Some(format!("{authority}:{port}"))
}
