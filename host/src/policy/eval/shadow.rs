//! Shadow runs: a candidate policy sees the same features as the live one;
//! its decisions are recorded, never acted on, so an operator can see where
//! the two would disagree before promoting it.

use crate::policy::PolicyVersion;
use crate::policy::convert::label;
use edgeroute_core::{Decision, Features, PolicyFailure};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};

#[derive(Default)]
struct Tally {
    compared: u64,
    agreed: u64,
    /// (live, shadow) label → count, disagreements only.
    differences: BTreeMap<(String, String), u64>,
    /// sensitivity → (compared, agreed)
    by_sensitivity: BTreeMap<&'static str, (u64, u64)>,
}

pub struct Shadow {
    pub version: Arc<PolicyVersion>,
    tally: Mutex<Tally>,
}

#[derive(Default)]
pub struct ShadowSlot(RwLock<Option<Arc<Shadow>>>);

impl ShadowSlot {
    pub fn set(&self, version: Option<Arc<PolicyVersion>>) {
        let shadow = version.map(|version| {
            Arc::new(Shadow {
                version,
                tally: Mutex::default(),
            })
        });
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = shadow;
    }

    pub fn get(&self) -> Option<Arc<Shadow>> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Run the candidate on the same features off the request path.
    pub fn compare(&self, features: &Features, live: &Result<Decision, PolicyFailure>) {
        let Some(shadow) = self.get() else { return };
        let (features, live) = (features.clone(), label(live));
        tokio::spawn(async move {
            let candidate = label(&shadow.version.route(&features).await);
            let agreed = candidate == live;
            let mut t = shadow.tally.lock().unwrap_or_else(|p| p.into_inner());
            t.compared += 1;
            t.agreed += agreed as u64;
            let by = t
                .by_sensitivity
                .entry(features.sensitivity.name())
                .or_default();
            by.0 += 1;
            by.1 += agreed as u64;
            if !agreed {
                *t.differences.entry((live, candidate)).or_default() += 1;
            }
        });
    }

    pub fn summary(&self) -> Value {
        let Some(shadow) = self.get() else {
            return json!({ "candidate": null });
        };
        let t = shadow.tally.lock().unwrap_or_else(|p| p.into_inner());
        let rate =
            |agreed: u64, compared: u64| (compared > 0).then(|| agreed as f64 / compared as f64);
        json!({
            "candidate": shadow.version.describe(),
            "compared": t.compared,
            "agreed": t.agreed,
            "agreement_rate": rate(t.agreed, t.compared),
            "differences": t.differences.iter().map(|((live, candidate), n)| json!({ "live": live, "candidate": candidate, "requests": n })).collect::<Vec<_>>(),
            "by_sensitivity": t.by_sensitivity.iter().map(|(s, (c, a))| (s.to_string(), json!({ "compared": c, "agreed": a, "agreement_rate": rate(*a, *c) }))).collect::<serde_json::Map<_, _>>(),
        })
    }
}
