//! `edgeroute policy test POLICY.wasm CASES.jsonl`: table-driven tests of
//! a policy's own answers. One JSON object per line:
//!
//! ```json
//! {"name": "long prompts go to the cloud",
//!  "features": {"prompt_tokens": 900},
//!  "observe": [{"served_by": "local:smollm2", "ok": false}],
//!  "expect": {"decision": "cloud:frontier", "reason": "long prompt"}}
//! ```
//!
//! `features` overrides a base request (a 12-token public prompt, with the
//! config's local models and upstreams); setting `sensitivity` alone also
//! sets `may_leave` as the config's guard would. `observe` lists outcomes
//! reported to the policy before this case is routed (cases run in order,
//! on one instance, so state carries over); an outcome is for the request
//! the previous case routed unless it names another (`request_id`), so a
//! learning policy learns from the decision it made there: give each case
//! its own `request_id` in `features`. `expect.decision` is the plan
//! as a label (`local:NAME`, `cloud:NAME`, `local:A→cloud:B`, `reject`,
//! `failed`); `expect.reason` a regular expression the reason must match.
//! What is tested is the policy's answer, before the host's guard.

use super::conformance;
use crate::config::Config;
use crate::decisions::Logged;
use crate::policy::PolicyVersion;
use crate::policy::convert::label;
use edgeroute_core::{Features, Outcome, Sensitivity, Target};
use serde::Deserialize;
use serde_json::{Map, Value};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    #[serde(default)]
    features: Map<String, Value>,
    #[serde(default)]
    observe: Vec<Observed>,
    expect: Expect,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Expect {
    decision: Option<String>,
    reason: Option<String>,
}

/// An outcome as a case file writes it (the decision log's form).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Observed {
    /// The request it is for; by default the one the previous case routed.
    request_id: Option<String>,
    /// `local:NAME`, `cloud:NAME`, or null when refused.
    served_by: Option<String>,
    #[serde(default = "yes")]
    ok: bool,
    #[serde(default = "hundred")]
    latency_ms: u32,
    #[serde(default)]
    prompt_tokens: u32,
    #[serde(default)]
    completion_tokens: u32,
    #[serde(default)]
    cost_micro_usd: u64,
    confidence: Option<f32>,
    feedback: Option<f32>,
}

fn yes() -> bool {
    true
}

fn hundred() -> u32 {
    100
}

/// One case's verdict: its name, and why it failed.
pub struct Verdict {
    pub name: String,
    pub failure: Option<String>,
}

/// The request a case starts from.
fn base(config: &Config) -> Features {
    let local: Vec<&str> = config
        .local
        .models
        .iter()
        .map(|m| m.name.as_str())
        .collect();
    let cloud: Vec<&str> = config
        .cloud
        .upstreams
        .iter()
        .map(|u| u.name.as_str())
        .collect();
    conformance::features(12, Sensitivity::Public, true, &local, &cloud)
}

fn features(config: &Config, overrides: &Map<String, Value>) -> Result<Features, String> {
    let mut merged = match serde_json::to_value(base(config)) {
        Ok(Value::Object(map)) => map,
        _ => return Err("the base features do not serialise".into()),
    };
    for (key, value) in overrides {
        merged.insert(key.clone(), value.clone());
    }
    let mut features: Features =
        serde_json::from_value(Value::Object(merged)).map_err(|e| format!("features: {e}"))?;
    if overrides.contains_key("sensitivity") && !overrides.contains_key("may_leave") {
        features.may_leave = config.guard.may_leave(features.sensitivity);
    }
    Ok(features)
}

/// `o` as the policy receives it, for `previous` (the request id the last
/// case routed) unless it names its own.
fn outcome(o: &Observed, previous: Option<&str>) -> Result<Outcome, String> {
    // Checked here, so a misspelt target is an error, not a refusal.
    if let Some(label) = &o.served_by {
        label
            .parse::<Target>()
            .map_err(|e| format!("observe: served_by '{label}': {e}"))?;
    }
    let logged = Logged {
        served_by: o.served_by.clone(),
        ok: o.ok,
        latency_ms: o.latency_ms,
        prompt_tokens: o.prompt_tokens,
        completion_tokens: o.completion_tokens,
        cost_micro_usd: o.cost_micro_usd,
        confidence: o.confidence,
    };
    let request_id = o.request_id.as_deref().or(previous).unwrap_or("case");
    Ok(logged.outcome(request_id, o.feedback))
}

/// Run every case of `text` on `version`, in order. A line that is not a
/// valid case is a failed case that says why.
pub async fn run(version: &PolicyVersion, config: &Config, text: &str) -> Vec<Verdict> {
    let mut verdicts = Vec::new();
    // The request id the last case routed: its outcomes' default.
    let mut previous: Option<String> = None;
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() || line.trim_start().starts_with("//") {
            continue;
        }
        let case: Case = match serde_json::from_str(line) {
            Ok(case) => case,
            Err(e) => {
                verdicts.push(Verdict {
                    name: format!("line {}", n + 1),
                    failure: Some(format!("not a case: {e}")),
                });
                continue;
            }
        };
        let failure = run_case(version, config, &case, &mut previous).await.err();
        verdicts.push(Verdict {
            name: case.name,
            failure,
        });
    }
    verdicts
}

async fn run_case(
    version: &PolicyVersion,
    config: &Config,
    case: &Case,
    previous: &mut Option<String>,
) -> Result<(), String> {
    if case.expect.decision.is_none() && case.expect.reason.is_none() {
        return Err("expect names neither a decision nor a reason".into());
    }
    let reason_pattern = case
        .expect
        .reason
        .as_deref()
        .map(regex::Regex::new)
        .transpose()
        .map_err(|e| format!("expect.reason is not a regular expression: {e}"))?;
    let features = features(config, &case.features)?;
    for observed in &case.observe {
        version
            .observe(&outcome(observed, previous.as_deref())?)
            .await;
    }
    let decision = version.route(&features).await;
    *previous = Some(features.request_id.clone());
    let got = label(&decision);
    let reason = match &decision {
        Ok(d) => d.reason.clone(),
        Err(failure) => failure.to_string(),
    };
    if let Some(expected) = &case.expect.decision
        && *expected != got
    {
        return Err(format!(
            "expected decision {expected}, got {got} (reason: {reason})"
        ));
    }
    if let Some(pattern) = &reason_pattern
        && !pattern.is_match(&reason)
    {
        return Err(format!(
            "reason {reason:?} does not match /{}/ (decision {got})",
            pattern.as_str()
        ));
    }
    Ok(())
}
