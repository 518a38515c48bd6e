//! Shadow runs: a candidate policy sees the same features as the live one;
//! its decisions are recorded, never acted on, so an operator can see where
//! the two would disagree before promoting it.

use crate::policy::PolicyVersion;
use crate::policy::convert::label;
use edgeroute_core::{Decision, Features, PolicyFailure};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
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
pub struct ShadowSlot {
    slot: RwLock<Option<Arc<Shadow>>>,
    /// Over every candidate since the node started (`/metrics` counters
    /// must not go back when a candidate is replaced).
    compared: AtomicU64,
    agreed: AtomicU64,
}

impl ShadowSlot {
    pub fn set(&self, version: Option<Arc<PolicyVersion>>) {
        let shadow = version.map(|version| {
            Arc::new(Shadow {
                version,
                tally: Mutex::default(),
            })
        });
        *self.slot.write().unwrap_or_else(|p| p.into_inner()) = shadow;
    }

    pub fn get(&self) -> Option<Arc<Shadow>> {
        self.slot.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// (compared, agreed) over every candidate so far.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.compared.load(Ordering::Relaxed),
            self.agreed.load(Ordering::Relaxed),
        )
    }

    /// Run the candidate on the same features off the request path.
    pub fn compare(self: &Arc<Self>, features: &Features, live: &Result<Decision, PolicyFailure>) {
        let Some(shadow) = self.get() else { return };
        let (features, live, slot) = (features.clone(), label(live), self.clone());
        tokio::spawn(async move {
            let candidate = label(&shadow.version.route(&features).await);
            let agreed = candidate == live;
            slot.compared.fetch_add(1, Ordering::Relaxed);
            slot.agreed.fetch_add(agreed as u64, Ordering::Relaxed);
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
