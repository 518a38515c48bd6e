//! Features, the pipeline's second step: what the policy gets to see of a
//! request (sizes, text statistics, sensitivity, task, budget, load, the
//! host's latency estimates — never the prompt text itself), and the facts
//! the guard judges it by.
//!
//! Sensitivity is collected from every place a level can come from (each
//! value of each sensitivity header, `metadata.sensitivity`, detection) into
//! one [`SensitivitySet`]; the most restrictive level wins.

use super::request::{Invalid, Prepared};
use crate::config::GuardConfig;
use crate::detect::NodeDetector;
use crate::fleet::{Candidates, Fleet};
use crate::nn::{CacheScope, Embedder, Tokenized};
use crate::node::Node;
use crate::targets::cloud::CloudTarget;
use crate::targets::local::LocalTarget;
use crate::tenants::{self, Tenant};
use edgeroute_core::guard::Facts;
use edgeroute_core::{Features, Sensitivity, SensitivitySet, Source, TextStats};
use std::sync::Arc;

/// Request-level signals that travel outside the body (HTTP headers).
#[derive(Debug, Clone, Default)]
pub struct Signals {
    /// Every value of every sensitivity header, in order; `None` for a
    /// value that is not text (it counts as restricted).
    pub sensitivity: Vec<Option<String>>,
    /// The latency budget header, if sent.
    pub latency_budget_ms: Option<String>,
    /// The session header, if sent.
    pub session: Option<String>,
    /// The client's tenant (from its API key); None is an open node's
    /// client: public by default, every target allowed.
    pub tenant: Option<Arc<Tenant>>,
    /// The peer that forwarded this request (its fleet token checked): it
    /// is never forwarded again.
    pub forwarded_by: Option<String>,
    /// `x-edgeroute-judge`, if sent: the caller escalates by itself.
    pub judge: Option<String>,
}

/// What the policy sees, and what the guard judges.
pub struct Extracted {
    pub features: Features,
    pub sensitivity: SensitivitySet,
    pub facts: Facts,
    /// The client's tenant, for the ledger.
    pub tenant: String,
    /// Whose cached prefix a local run may reuse, and whose it leaves.
    pub cache: CacheScope,
    /// The prompt's tokens on the local model, counted for the features
    /// and handed to the backend (tokenized once).
    pub prompt: Option<Arc<Tokenized>>,
}

/// Every declared and detected level of a request.
pub fn collect_sensitivity(
    request: &Prepared,
    signals: &Signals,
    guard: &GuardConfig,
    detector: &NodeDetector,
) -> SensitivitySet {
    let mut set = SensitivitySet::new();
    if let Some(tenant) = &signals.tenant
        && tenant.sensitivity > Sensitivity::Public
    {
        set.add(Source::TenantDefault, tenant.sensitivity);
    }
    edgeroute_detect::collect::declared(&mut set, &signals.sensitivity, &request.metadata);
    if guard.detect_pii {
        // Clean texts are remembered per tenant and declared level: a
        // request declared public never hits on a restricted one's text.
        let tenant = signals
            .tenant
            .as_ref()
            .map_or(tenants::OPEN, |t| t.name.as_str());
        let scope = crate::memo::scope(tenant, set.level());
        detector.detected(
            &mut set,
            &scope,
            request.client_texts(),
            &request.metadata,
            &request.passthrough,
        );
    }
    set
}

/// Prompt tokens as the local model counts them (its chat template
/// included), and how many of them its prefix cache holds for this
/// request's scope; a byte estimate when no local model is loaded.
fn prompt_tokens(
    request: &Prepared,
    local: &LocalTarget,
    cache: &CacheScope,
) -> Result<(u32, u32, Option<Arc<Tokenized>>), Invalid> {
    let Some((name, model)) = local
        .model_names()
        .into_iter()
        .next()
        .and_then(|name| Some((name.clone(), local.model(&name)?.clone())))
    else {
        let bytes: usize = request.messages.iter().map(|(_, text)| text.len()).sum();
        return Ok((bytes.div_ceil(4) as u32, 0, None));
    };
    let tokens = model
        .chat_tokens_for(&request.messages, cache)
        .map_err(|e| Invalid::request(format!("cannot format the messages: {e:#}")))?;
    Ok((
        tokens.len() as u32,
        local.cached_prefix(&name, &tokens, cache),
        Some(Arc::new(Tokenized {
            messages: request.messages.clone(),
            tokens,
        })),
    ))
}

fn latency_budget_ms(request: &Prepared, signals: &Signals) -> Option<u32> {
    signals
        .latency_budget_ms
        .as_deref()
        .and_then(|v| v.trim().parse().ok())
        .or_else(|| {
            request
                .metadata
                .get("latency_budget_ms")
                .and_then(|v| v.as_u64())
                .map(|v| v.min(u32::MAX as u64) as u32)
        })
}

/// The node parts features are measured from.
pub struct Sources<'a> {
    pub guard: &'a GuardConfig,
    pub detector: &'a NodeDetector,
    pub local: &'a LocalTarget,
    pub cloud: &'a CloudTarget,
    pub fleet: Option<&'a Fleet>,
}

pub fn extract(
    request: &Prepared,
    signals: &Signals,
    node: &Sources,
) -> Result<Extracted, Invalid> {
    let Sources {
        guard,
        detector,
        local,
        cloud,
        fleet,
    } = *node;
    let sensitivity = collect_sensitivity(request, signals, guard, detector);
    let level = sensitivity.level();
    // A tenant limited to the node keeps even public data here.
    let tenant_allows_cloud = signals.tenant.as_ref().is_none_or(|t| t.cloud);
    let facts = Facts {
        sensitivity: level,
        may_leave: guard.may_leave(level) && tenant_allows_cloud,
        tenant_confined: guard.may_leave(level) && !tenant_allows_cloud,
        may_stay_in_zone: fleet.is_some_and(|f| f.zone_allows(level)) && tenant_allows_cloud,
    };
    let tenant = signals
        .tenant
        .as_ref()
        .map_or_else(|| tenants::OPEN.to_string(), |t| t.name.clone());
    let cache = CacheScope {
        level,
        session: signals.session.clone(),
        tenant: tenant.clone(),
    };
    let (prompt_tokens, cached_prefix_tokens, prompt) = prompt_tokens(request, local, &cache)?;
    let mut features = Features {
        request_id: request.id.clone(),
        requested_model: request.requested_model.clone(),
        prompt_tokens,
        cached_prefix_tokens,
        max_tokens: request.max_tokens,
        sensitivity: level,
        detected: sensitivity.detected().map(str::to_string).collect(),
        may_leave: facts.may_leave,
        task: request
            .metadata
            .get("task")
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string(),
        latency_budget_ms: latency_budget_ms(request, signals),
        stream: request.stream,
        message_count: request.messages.len() as u32,
        text: TextStats::of(&request.messages),
        local_queue_depth: local.queue_depth(),
        local_running: local.running(),
        local_wait_ms: local.wait_ms(),
        local_estimate: None,
        cloud_estimates: Vec::new(),
        local_models: local.model_names(),
        cloud_upstreams: cloud.upstream_names(),
        peers: Vec::new(),
        peer_pick: None,
        // Computed after extraction, only for a policy that asked.
        embedding: None,
    };
    // A forwarded request sees no peers: it is never forwarded again.
    let fleet = match fleet {
        Some(fleet) if signals.forwarded_by.is_none() => fleet.candidates(
            &facts,
            features.latency_budget_ms,
            signals.session.as_deref(),
        ),
        _ => Candidates::default(),
    };
    features.peers = fleet.features;
    features.peer_pick = fleet.pick;
    // The estimates scale with the request's size, so they come last.
    features.local_estimate = features
        .local_models
        .first()
        .and_then(|model| local.estimate(model, &features));
    features.cloud_estimates = cloud.estimates(&features);
    Ok(Extracted {
        features,
        sensitivity,
        facts,
        tenant,
        cache,
        prompt,
    })
}

/// The last user message's embedding, cut to `cut_to` tokens, for a
/// policy that needs it. A failure leaves the feature out (the policy sees
/// none, as on a node without an embedding model) rather than failing a
/// request over a routing hint.
pub async fn embed_prompt(
    node: &Node,
    request: &Prepared,
    embedder: &Arc<Embedder>,
    cut_to: u32,
) -> Option<Vec<f32>> {
    let (_, text) = request
        .messages
        .iter()
        .rev()
        .find(|(role, text)| role == "user" && !text.trim().is_empty())?;
    // Only the first `cut_to` tokens count: a megabyte message is not
    // tokenized whole for them (no token is longer than 32 bytes here).
    let mut end = text.len().min(cut_to as usize * 32);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let texts = vec![text[..end].to_string()];
    match node.local.embed(embedder, texts, Some(cut_to)).await {
        Ok(mut embedded) => embedded.pop().map(|e| e.vector),
        Err(error) => {
            tracing::warn!(%error, "prompt embedding failed; the policy gets none");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Limits;

    fn request(metadata: &str) -> Prepared {
        let body = format!(
            r#"{{"model":"auto","messages":[{{"role":"user","content":"hello"}}],"metadata":{metadata}}}"#
        );
        super::super::request::parse(body.as_bytes(), &Limits::default(), "t".into(), 0).unwrap()
    }

    fn level(metadata: &str, headers: &[Option<&str>]) -> Sensitivity {
        let signals = Signals {
            sensitivity: headers.iter().map(|h| h.map(str::to_string)).collect(),
            ..Signals::default()
        };
        let guard = GuardConfig::default();
        let detector = NodeDetector::from_guard(&guard).unwrap();
        collect_sensitivity(&request(metadata), &signals, &guard, &detector).level()
    }

    #[test]
    fn text_in_tool_calls_and_unknown_fields_is_judged_too() {
        let guard = GuardConfig::default();
        let detector = NodeDetector::from_guard(&guard).unwrap();
        for body in [
            r#"{"model":"auto","messages":[{"role":"user","content":"go"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"pay","arguments":"{\"card\":\"4111 1111 1111 1111\"}"}}]}]}"#,
            r#"{"model":"auto","messages":[{"role":"user","content":"go"}],"user":"jane.doe@example.com"}"#,
            r#"{"model":"auto","messages":[{"role":"user","content":[{"type":"text","text":"go","note":"jane.doe@example.com"}]}]}"#,
            r#"{"model":"auto","messages":[{"role":"user","content":"pay"}],"x_card":4111111111111111}"#,
        ] {
            let request =
                super::super::request::parse(body.as_bytes(), &Limits::default(), "t".into(), 0)
                    .unwrap();
            let set = collect_sensitivity(&request, &Signals::default(), &guard, &detector);
            assert_eq!(set.level(), Sensitivity::Restricted, "{body}");
        }
    }

    #[test]
    fn message_text_is_scanned_once() {
        // Twice, "12345674" would join its own copy into a Luhn-valid
        // 16-digit number.
        let guard = GuardConfig::default();
        let detector = NodeDetector::from_guard(&guard).unwrap();
        let body = r#"{"model":"auto","messages":[{"role":"user","content":"Summarise ticket 12345674 for me."}]}"#;
        let request =
            super::super::request::parse(body.as_bytes(), &Limits::default(), "t".into(), 0)
                .unwrap();
        let set = collect_sensitivity(&request, &Signals::default(), &guard, &detector);
        assert_eq!(set.level(), Sensitivity::Public, "{:?}", set.sources());
    }

    #[test]
    fn what_a_tool_offers_is_judged_though_the_nodes_description_of_it_is_not() {
        // The node's description of the tools repeats them in its own
        // words; detection skips that and reads the client's `tools`.
        let guard = GuardConfig::default();
        let detector = NodeDetector::from_guard(&guard).unwrap();
        let with_tool = |description: &str, system: bool| {
            let system = if system {
                r#"{"role":"system","content":"be brief"},"#
            } else {
                ""
            };
            let body = format!(
                r#"{{"model":"auto","messages":[{system}{{"role":"user","content":"hi"}}],
                "tools":[{{"type":"function","function":{{"name":"pay","description":"{description}","parameters":{{"type":"object"}}}}}}]}}"#
            );
            let request =
                super::super::request::parse(body.as_bytes(), &Limits::default(), "t".into(), 0)
                    .unwrap();
            assert!(request.messages[0].1.contains(description));
            assert!(
                request.client_texts().all(|text| !text.contains("<tools>")),
                "the node's description is not the client's text"
            );
            collect_sensitivity(&request, &Signals::default(), &guard, &detector)
        };
        for system in [false, true] {
            let set = with_tool("Charge card 4111 1111 1111 1111.", system);
            assert_eq!(set.level(), Sensitivity::Restricted, "{:?}", set.sources());
            let set = with_tool("Pay an invoice.", system);
            assert_eq!(set.level(), Sensitivity::Public, "{:?}", set.sources());
        }
    }

    #[test]
    fn a_tenants_default_is_a_floor_a_request_cannot_lower() {
        let config = crate::config::Config::parse(
            "[tenants.clinic]\nsensitivity = \"restricted\"\nkeys_sha256 = [\"0000000000000000000000000000000000000000000000000000000000000000\"]\n",
            std::path::Path::new("."),
        )
        .unwrap();
        let clients = crate::tenants::Clients::from_config(&config).unwrap();
        let signals = Signals {
            sensitivity: vec![Some("public".into())],
            tenant: clients.tenants().next(),
            ..Signals::default()
        };
        let guard = GuardConfig::default();
        let detector = NodeDetector::from_guard(&guard).unwrap();
        let set = collect_sensitivity(
            &request(r#"{"sensitivity":"public"}"#),
            &signals,
            &guard,
            &detector,
        );
        assert_eq!(set.level(), Sensitivity::Restricted);
        assert!(
            set.sources()
                .contains(&(Source::TenantDefault, Sensitivity::Restricted))
        );
    }

    #[test]
    fn repeated_or_listed_headers_cannot_lower_the_level() {
        use Sensitivity::*;
        assert_eq!(
            level("{}", &[Some("public"), Some("restricted")]),
            Restricted
        );
        assert_eq!(
            level("{}", &[Some("restricted"), Some("public")]),
            Restricted
        );
        assert_eq!(level("{}", &[Some("public, restricted")]), Restricted);
        assert_eq!(level("{}", &[Some("internal"), None]), Restricted);
        assert_eq!(level("{}", &[Some("public")]), Public);
        assert_eq!(level("{}", &[]), Public);
    }

    #[test]
    fn header_and_body_disagreeing_take_the_higher() {
        use Sensitivity::*;
        assert_eq!(
            level(r#"{"sensitivity":"restricted"}"#, &[Some("public")]),
            Restricted
        );
        assert_eq!(
            level(r#"{"sensitivity":"public"}"#, &[Some("internal")]),
            Internal
        );
        assert_eq!(level(r#"{"sensitivity":7}"#, &[Some("public")]), Restricted);
    }
}
