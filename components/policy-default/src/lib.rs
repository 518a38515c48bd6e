//! The default routing policy.
//!
//! Sensitive requests stay local; otherwise the prompt length decides:
//! short prompts run on the local model, long ones go to the cloud, where a
//! bigger context and faster prefill pay for the round trip. Availability
//! comes last: a request goes wherever its preferred target exists.
//!
//! Parameters (`[policy.params]` in the node config), all optional:
//!  - `local_model` (default "smollm2")
//!  - `cloud_upstream` (default "frontier")
//!  - `local_max_prompt_tokens` (default 512): the longest prompt kept local.

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

use edgeroute::routing::types::{Decision, Features, Outcome, Plan, Target};
use exports::edgeroute::routing::router::Guest;

struct Config {
    local_model: String,
    cloud_upstream: String,
    local_max_prompt_tokens: u32,
}

impl Config {
    fn defaults() -> Self {
        Config {
            local_model: "smollm2".into(),
            cloud_upstream: "frontier".into(),
            local_max_prompt_tokens: 512,
        }
    }

    fn from_params(params: Vec<(String, String)>) -> Result<Self, String> {
        let mut config = Config::defaults();
        for (key, value) in params {
            match key.as_str() {
                "local_model" => config.local_model = value,
                "cloud_upstream" => config.cloud_upstream = value,
                "local_max_prompt_tokens" => {
                    config.local_max_prompt_tokens = value.trim().parse().map_err(|_| {
                        format!(
                            "local_max_prompt_tokens must be a whole number of tokens, got {value:?}"
                        )
                    })?
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
    fn configure(params: Vec<(String, String)>) -> Result<(), String> {
        // Parse everything before storing, so a bad config changes nothing.
        let config = Config::from_params(params)?;
        *CONFIG.lock().unwrap_or_else(|e| e.into_inner()) = Some(config);
        Ok(())
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
    if !features.may_leave {
        return decision(local(), "sensitive: stays local".into());
    }

    let local_ok = features.local_models.contains(&config.local_model);
    let cloud_ok = features.cloud_upstreams.contains(&config.cloud_upstream);
    let (n, t) = (features.prompt_tokens, config.local_max_prompt_tokens);

    if n <= t {
        if !local_ok && cloud_ok {
            return decision(cloud(), "local model unavailable".into());
        }
        decision(local(), format!("short prompt ({n} <= {t} tokens): local"))
    } else {
        // Without our upstream the local model is the only place left; it may
        // still serve a long prompt, or the host reports why it cannot.
        if !cloud_ok {
            return decision(local(), "cloud upstream unavailable: local".into());
        }
        decision(cloud(), format!("long prompt ({n} > {t} tokens): cloud"))
    }
}

export!(Policy);

#[cfg(test)]
mod tests {
    use super::*;
    use edgeroute::routing::types::Sensitivity;

    fn features(prompt_tokens: u32, may_leave: bool) -> Features {
        Features {
            request_id: "r1".into(),
            requested_model: "auto".into(),
            prompt_tokens,
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
            local_queue_depth: 0,
            local_models: vec!["smollm2".into()],
            cloud_upstreams: vec!["frontier".into()],
        }
    }

    fn route(config: &Config, features: &Features) -> (String, String) {
        let d = decide(config, features);
        let target = match d.plan {
            Plan::Run(Target::Local(m)) => format!("local:{m}"),
            Plan::Run(Target::Cloud(u)) => format!("cloud:{u}"),
            other => format!("{other:?}"),
        };
        (target, d.reason)
    }

    #[test]
    fn threshold_splits_local_and_cloud() {
        let c = Config::defaults();
        assert_eq!(
            route(&c, &features(512, true)),
            (
                "local:smollm2".into(),
                "short prompt (512 <= 512 tokens): local".into()
            )
        );
        assert_eq!(
            route(&c, &features(513, true)),
            (
                "cloud:frontier".into(),
                "long prompt (513 > 512 tokens): cloud".into()
            )
        );
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
    }
}
