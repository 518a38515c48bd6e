//! The default routing policy.
//!
//! Sensitive requests stay local. Otherwise, in order:
//!  1. availability: a request goes where its preferred target exists;
//!  2. length: a long prompt goes to the cloud, where a bigger context and
//!     faster prefill pay for the round trip, unless the local model's
//!     prefix cache already holds all but a short part of it (an agent's
//!     next call);
//!  3. load: when the local queue's wait exceeds the latency budget (or
//!     `spill_wait_ms` without one), the request spills: to the peer of the
//!     fleet the host picked (its wait fits the budget), else the cloud;
//!  4. budget: when the host's estimate of the local run does not fit the
//!     client's latency budget (time to first token when streaming, the
//!     whole answer otherwise), it spills the same way;
//!  5. the middle band of prompt length runs as a confidence cascade: the
//!     local model answers, and the host escalates to the cloud when the
//!     answer's confidence is below `cascade_min_confidence`;
//!  6. short prompts run locally.
//!
//! Parameters (`[policy.params]` in the node config), all optional:
//!  - `local_model` (default "smollm2")
//!  - `cloud_upstream` (default "frontier")
//!  - `local_max_prompt_tokens` (default 512): the longest prompt kept local.
//!  - `cascade_from_tokens` (default 128): prompts longer than this, up to
//!    `local_max_prompt_tokens`, run as a cascade.
//!  - `cascade_min_confidence` (default 0.5, 0 turns the cascade off): the
//!    local answer's confidence below which it is escalated.
//!  - `spill_wait_ms` (default 10000): the local wait that spills a request
//!    without a latency budget to the cloud.

// The glue wit-bindgen generates for `observe` passes the outcome's fields
// as separate arguments.
#![allow(clippy::too_many_arguments)]

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

// The 0.2 policy world (`wit/routing-0.2`): the functions are exported as
// the `router` interface. Its ports in other languages still target 0.1,
// which the node links too.
wit_bindgen::generate!({
    world: "policy",
    path: "../../wit/routing-0.2",
});

use edgeroute::routing::types::{Cascade, Decision, Features, Needs, Outcome, Plan, Target};
use exports::edgeroute::routing::router::Guest;

struct Config {
    local_model: String,
    cloud_upstream: String,
    local_max_prompt_tokens: u32,
    cascade_from_tokens: u32,
    cascade_min_confidence: f32,
    spill_wait_ms: u32,
}

impl Config {
    fn defaults() -> Self {
        Config {
            local_model: "smollm2".into(),
            cloud_upstream: "frontier".into(),
            local_max_prompt_tokens: 512,
            cascade_from_tokens: 128,
            cascade_min_confidence: 0.5,
            spill_wait_ms: 10_000,
        }
    }

    fn from_params(params: Vec<(String, String)>) -> Result<Self, String> {
        fn number<T: std::str::FromStr>(key: &str, value: &str, what: &str) -> Result<T, String> {
            value
                .trim()
                .parse()
                .map_err(|_| format!("{key} must be {what}, got {value:?}"))
        }
        let mut config = Config::defaults();
        for (key, value) in params {
            let tokens = "a whole number of tokens";
            match key.as_str() {
                "local_model" => config.local_model = value,
                "cloud_upstream" => config.cloud_upstream = value,
                "local_max_prompt_tokens" => {
                    config.local_max_prompt_tokens = number(&key, &value, tokens)?
                }
                "cascade_from_tokens" => config.cascade_from_tokens = number(&key, &value, tokens)?,
                "cascade_min_confidence" => {
                    let min: f32 = number(&key, &value, "a number from 0 to 1")?;
                    if !(0.0..=1.0).contains(&min) {
                        return Err(format!("{key} must be from 0 to 1, got {value:?}"));
                    }
                    config.cascade_min_confidence = min;
                }
                "spill_wait_ms" => {
                    config.spill_wait_ms = number(&key, &value, "a whole number of milliseconds")?
                }
                // Other policies share the config file's params table; a key
                // meant for one of them is not an error here.
                _ => {}
            }
        }
        Ok(config)
    }
}

/// `None` until `configure` runs; `route` then uses the defaults. A Mutex
/// rather than a OnceLock so that a second `configure` replaces the first.
static CONFIG: Mutex<Option<Config>> = Mutex::new(None);

/// Counters from `observe`. Nothing reads them yet; they are the state a
/// learning policy would keep, and show where that state lives.
static OBSERVED: AtomicU64 = AtomicU64::new(0);
static FAILED: AtomicU64 = AtomicU64::new(0);
static SERVED_LOCAL: AtomicU64 = AtomicU64::new(0);
static SERVED_CLOUD: AtomicU64 = AtomicU64::new(0);

struct Policy;

impl Guest for Policy {
    fn configure(params: Vec<(String, String)>) -> Result<Needs, String> {
        // Parse everything before storing, so a bad config changes nothing.
        let config = Config::from_params(params)?;
        *CONFIG.lock().unwrap_or_else(|e| e.into_inner()) = Some(config);
        // Thresholds on cheap signals only: the host computes no embedding.
        Ok(Needs::empty())
    }

    fn route(features: Features) -> Decision {
        let guard = CONFIG.lock().unwrap_or_else(|e| e.into_inner());
        let defaults;
        let config = match guard.as_ref() {
            Some(config) => config,
            None => {
                defaults = Config::defaults();
                &defaults
            }
        };
        decide(config, &features)
    }

    fn observe(outcome: Outcome) {
        OBSERVED.fetch_add(1, Relaxed);
        if !outcome.ok {
            FAILED.fetch_add(1, Relaxed);
        }
        match outcome.served_by {
            Some(Target::Local(_)) => SERVED_LOCAL.fetch_add(1, Relaxed),
            Some(Target::Cloud(_) | Target::Peer(_)) => SERVED_CLOUD.fetch_add(1, Relaxed),
            None => 0,
        };
    }
}

fn decide(config: &Config, features: &Features) -> Decision {
    let local = || Target::Local(config.local_model.clone());
    let cloud = || Target::Cloud(config.cloud_upstream.clone());
    let decision = |target, reason: String| Decision {
        plan: Plan::Run(target),
        reason,
        propensity: None,
    };

    // The guard would overrule a cloud answer anyway; saying "local" here
    // keeps the reason honest. If the local model is missing the host fails
    // closed, which is what a sensitive request needs.
    let (n, t) = (features.prompt_tokens, config.local_max_prompt_tokens);
    let (from, min) = (config.cascade_from_tokens, config.cascade_min_confidence);
    let in_cascade_band = n > from && n <= t && min > 0.0;
    let cascade = |reason: String| Decision {
        plan: Plan::Cascade(Cascade {
            first: local(),
            then: cloud(),
            min_confidence: min,
        }),
        reason,
        propensity: None,
    };

    if !features.may_leave {
        // The host judges the local answer all the same and drops the
        // cloud hop, so a sensitive answer is flagged when it is unsure.
        if in_cascade_band {
            return cascade("sensitive: stays local, judged".into());
        }
        return decision(local(), "sensitive: stays local".into());
    }

    let local_ok = features.local_models.contains(&config.local_model);
    let cloud_ok = features.cloud_upstreams.contains(&config.cloud_upstream);

    if !cloud_ok {
        // The local model is the only place left; it may still serve a long
        // prompt, or the host reports why it cannot.
        return decision(local(), "cloud upstream unavailable: local".into());
    }
    if !local_ok {
        return decision(cloud(), "local model unavailable".into());
    }
    // What the local model would prefill: an agent's conversation that is
    // already in its prefix cache costs only its new tokens.
    let cached = features.cached_prefix_tokens.min(n);
    if n - cached > t {
        return decision(cloud(), format!("long prompt ({n} > {t} tokens): cloud"));
    }
    if n > t {
        return decision(
            local(),
            format!(
                "long prompt, {cached} tokens cached ({} new <= {t}): local",
                n - cached
            ),
        );
    }
    let wait = features.local_wait_ms;
    // A busy node spills to a peer of the fleet before the cloud: the
    // host's pick already fits the budget and is the less loaded of two.
    let spill = |why: String| match &features.peer_pick {
        Some(peer) => {
            let there = features
                .peers
                .iter()
                .find(|p| &p.name == peer)
                .map_or(0, |p| p.wait_ms);
            decision(
                Target::Peer(peer.clone()),
                format!("{why}: peer {peer} (wait ~{there} ms)"),
            )
        }
        None => decision(cloud(), format!("{why}: cloud")),
    };
    match features.latency_budget_ms {
        Some(budget) if wait > budget => {
            return spill(format!("local wait {wait} ms > budget {budget} ms"));
        }
        None if wait > config.spill_wait_ms => {
            let spill_ms = config.spill_wait_ms;
            return spill(format!("local wait {wait} ms > {spill_ms} ms"));
        }
        _ => {}
    }
    if let (Some(budget), Some(estimate)) = (features.latency_budget_ms, &features.local_estimate) {
        // A stream's client sees progress from the first token on.
        let (expected, what) = if features.stream {
            (estimate.ttft_ms, "first token")
        } else {
            (estimate.total_ms, "answer")
        };
        if expected > budget {
            // The estimate counts the local wait; a peer's pick has less.
            return spill(format!(
                "local {what} in ~{expected} ms > budget {budget} ms"
            ));
        }
    }
    if in_cascade_band {
        return cascade(format!(
            "middle prompt ({from} < {n} <= {t} tokens): local, cloud if unsure"
        ));
    }
    decision(local(), format!("short prompt ({n} <= {t} tokens): local"))
}

export!(Policy);

#[cfg(test)]
mod tests {
    use super::*;
    use edgeroute::routing::types::{Estimate, Sensitivity, TextStats};

    fn features(prompt_tokens: u32, may_leave: bool) -> Features {
        Features {
            request_id: "r1".into(),
            requested_model: "auto".into(),
            prompt_tokens,
            cached_prefix_tokens: 0,
            max_tokens: 64,
            sensitivity: if may_leave {
                Sensitivity::Public
            } else {
                Sensitivity::Restricted
            },
            detected: Vec::new(),
            may_leave,
            task: String::new(),
            latency_budget_ms: None,
            stream: false,
            message_count: 1,
            text: TextStats {
                chars: 0,
                words: 0,
                digits: 0,
                code: false,
                question: false,
                non_ascii_permille: 0,
            },
            local_queue_depth: 0,
            local_running: 0,
            local_wait_ms: 0,
            local_estimate: None,
            cloud_estimates: Vec::new(),
            local_models: vec!["smollm2".into()],
            cloud_upstreams: vec!["frontier".into()],
            peers: Vec::new(),
            peer_pick: None,
            embedding: None,
        }
    }

    fn route(config: &Config, features: &Features) -> (String, String) {
        let d = decide(config, features);
        let target = match d.plan {
            Plan::Run(Target::Local(m)) => format!("local:{m}"),
            Plan::Run(Target::Cloud(u)) => format!("cloud:{u}"),
            Plan::Cascade(c) => format!("cascade below {}", c.min_confidence),
            other => format!("{other:?}"),
        };
        (target, d.reason)
    }

    #[test]
    fn length_bands_split_local_cascade_and_cloud() {
        let c = Config::defaults();
        assert_eq!(
            route(&c, &features(128, true)),
            (
                "local:smollm2".into(),
                "short prompt (128 <= 512 tokens): local".into()
            )
        );
        assert_eq!(
            route(&c, &features(129, true)),
            (
                "cascade below 0.5".into(),
                "middle prompt (128 < 129 <= 512 tokens): local, cloud if unsure".into()
            )
        );
        assert_eq!(
            route(&c, &features(513, true)),
            (
                "cloud:frontier".into(),
                "long prompt (513 > 512 tokens): cloud".into()
            )
        );
        let off = Config {
            cascade_min_confidence: 0.0,
            ..Config::defaults()
        };
        assert_eq!(route(&off, &features(300, true)).0, "local:smollm2");
    }

    #[test]
    fn sensitive_stays_local_even_when_local_is_missing() {
        let c = Config::defaults();
        let mut f = features(5000, false);
        assert_eq!(
            route(&c, &f),
            ("local:smollm2".into(), "sensitive: stays local".into())
        );
        f.local_models.clear();
        assert_eq!(route(&c, &f).0, "local:smollm2");
        // In the cascade band the answer is judged; the guard drops the
        // cloud hop.
        let f = features(200, false);
        assert_eq!(
            route(&c, &f),
            (
                "cascade below 0.5".into(),
                "sensitive: stays local, judged".into()
            )
        );
    }

    #[test]
    fn availability_moves_the_request() {
        let c = Config::defaults();
        let mut f = features(10, true);
        f.local_models.clear();
        assert_eq!(
            route(&c, &f),
            ("cloud:frontier".into(), "local model unavailable".into())
        );
        let mut f = features(10_000, true);
        f.cloud_upstreams.clear();
        assert_eq!(route(&c, &f).0, "local:smollm2");
    }

    #[test]
    fn a_cached_conversation_stays_local() {
        let c = Config::defaults();
        let mut f = features(900, true);
        f.cached_prefix_tokens = 850;
        assert_eq!(
            route(&c, &f),
            (
                "local:smollm2".into(),
                "long prompt, 850 tokens cached (50 new <= 512): local".into()
            )
        );
        f.cached_prefix_tokens = 100;
        assert_eq!(route(&c, &f).0, "cloud:frontier");
    }

    #[test]
    fn a_busy_local_model_spills_to_the_cloud() {
        let c = Config::defaults();
        let mut f = features(10, true);
        f.local_wait_ms = 3000;
        assert_eq!(route(&c, &f).0, "local:smollm2");
        f.latency_budget_ms = Some(2000);
        assert_eq!(
            route(&c, &f),
            (
                "cloud:frontier".into(),
                "local wait 3000 ms > budget 2000 ms: cloud".into()
            )
        );
        f.latency_budget_ms = None;
        f.local_wait_ms = 10_001;
        assert_eq!(route(&c, &f).0, "cloud:frontier");
    }

    #[test]
    fn the_budget_is_held_against_the_local_estimate() {
        let c = Config::defaults();
        let mut f = features(10, true);
        f.latency_budget_ms = Some(1000);
        // No estimate yet: nothing to hold against the budget.
        assert_eq!(route(&c, &f).0, "local:smollm2");
        f.local_estimate = Some(Estimate {
            ttft_ms: 400,
            total_ms: 1500,
        });
        assert_eq!(
            route(&c, &f),
            (
                "cloud:frontier".into(),
                "local answer in ~1500 ms > budget 1000 ms: cloud".into()
            )
        );
        // Streaming: the first token is what the client waits for.
        f.stream = true;
        assert_eq!(route(&c, &f).0, "local:smollm2");
    }

    #[test]
    fn params() {
        let p = |k: &str, v: &str| vec![(k.to_string(), v.to_string())];
        let c = Config::from_params(p("local_max_prompt_tokens", " 64 ")).unwrap();
        assert_eq!(c.local_max_prompt_tokens, 64);
        assert!(Config::from_params(p("unknown", "x")).is_ok());
        let err = Config::from_params(p("local_max_prompt_tokens", "lots"))
            .err()
            .unwrap();
        assert!(
            err.contains("local_max_prompt_tokens") && err.contains("lots"),
            "{err}"
        );
        let c = Config::from_params(p("cascade_min_confidence", "0.7")).unwrap();
        assert_eq!(c.cascade_min_confidence, 0.7);
        for bad in ["1.5", "-0.1", "sure"] {
            assert!(Config::from_params(p("cascade_min_confidence", bad)).is_err());
        }
    }
}
