//! The ledger: traffic bucketed by tenant, prompt length, task,
//! sensitivity, latency budget and the local model's confidence, with what each
//! placement cost and how long it took, so an operator can see what the
//! router saves, where the cascade escalates and where a learned policy
//! explores (`GET /ledger`).

use edgeroute_core::{Prices, Sensitivity, Target, TargetKind, Usage};
use serde::Serialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Mutex;

/// One finished request.
pub struct Entry<'a> {
    /// None when the request was refused.
    pub served_by: Option<&'a Target>,
    pub sensitivity: Sensitivity,
    /// The client's tenant (a configured name, or `open`).
    pub tenant: &'a str,
    /// The client's `metadata.task`; bucketed only when the config lists it.
    pub task: &'a str,
    pub usage: Usage,
    pub latency_ms: f64,
    pub cost_usd: f64,
    /// The client's latency budget, if it gave one.
    pub latency_budget_ms: Option<u32>,
    /// The local model's confidence in the answer, when measured.
    pub confidence: Option<f32>,
    /// The first leg of a cascade whose answer was escalated: its work
    /// counts, and the bucket shows how often the cascade gave up on it.
    pub escalated: bool,
}

#[derive(Default, Serialize, Clone)]
struct Aggregate {
    requests: u64,
    latency_ms_total: f64,
    prompt_tokens: u64,
    completion_tokens: u64,
    cost_usd: f64,
}

impl Aggregate {
    fn add(&mut self, e: &Entry) {
        self.requests += 1;
        self.latency_ms_total += e.latency_ms;
        self.prompt_tokens += e.usage.prompt_tokens as u64;
        self.completion_tokens += e.usage.completion_tokens as u64;
        self.cost_usd += e.cost_usd;
    }

    fn mean_latency_ms(&self) -> Option<f64> {
        (self.requests > 0).then(|| self.latency_ms_total / self.requests as f64)
    }
}

#[derive(Default)]
struct Bucket {
    local: Aggregate,
    cloud: Aggregate,
    refused: u64,
    /// Local answers a cascade replaced with another target's.
    escalated: u64,
}

#[derive(PartialEq, Eq, PartialOrd, Ord, Clone)]
struct Key {
    tenant: String,
    length: &'static str,
    task: String,
    sensitivity: &'static str,
    budget: &'static str,
    confidence: &'static str,
}

fn budget_band(budget_ms: Option<u32>) -> &'static str {
    match budget_ms {
        None => "none",
        Some(0..1000) => "<1s",
        Some(1000..5000) => "1-5s",
        Some(_) => "5s+",
    }
}

/// Bands of the geometric-mean token probability: where a cascade with a
/// threshold in one of them would escalate.
fn confidence_band(confidence: Option<f32>) -> &'static str {
    match confidence {
        None => "n/a",
        Some(c) if c < 0.4 => "<0.4",
        Some(c) if c < 0.7 => "0.4-0.7",
        Some(_) => "0.7+",
    }
}

fn length_bucket(tokens: u32) -> &'static str {
    match tokens {
        0..64 => "0-63",
        64..256 => "64-255",
        256..1024 => "256-1023",
        _ => "1024+",
    }
}

#[derive(Debug, Default, Clone, Copy)]
pub struct Totals {
    pub cloud_cost_usd: f64,
    pub cost_avoided_usd: f64,
}

pub struct Ledger {
    reference: Prices,
    /// Task labels kept apart; None keeps every label (an offline report
    /// on the operator's own decision log).
    tasks: Option<Vec<String>>,
    buckets: Mutex<BTreeMap<Key, Bucket>>,
}

impl Ledger {
    pub fn new(reference: Prices, tasks: Option<Vec<String>>) -> Self {
        Self {
            reference,
            tasks,
            buckets: Mutex::default(),
        }
    }

    /// A node's ledger is keyed by configured names only: a client's text
    /// neither grows it nor is shown to other clients.
    fn task_label(&self, task: &str) -> String {
        match &self.tasks {
            _ if task.is_empty() => "-".into(),
            Some(listed) if !listed.iter().any(|t| t == task) => "other".into(),
            _ => task.to_string(),
        }
    }

    pub fn record(&self, entry: Entry) {
        let key = Key {
            tenant: entry.tenant.to_string(),
            length: length_bucket(entry.usage.prompt_tokens),
            task: self.task_label(entry.task),
            sensitivity: entry.sensitivity.name(),
            budget: budget_band(entry.latency_budget_ms),
            confidence: confidence_band(entry.confidence),
        };
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let bucket = buckets.entry(key).or_default();
        bucket.escalated += entry.escalated as u64;
        match entry.served_by.map(Target::kind) {
            Some(TargetKind::Local) => bucket.local.add(&entry),
            // A peer is another node's local model, but it is off this
            // node: until the fleet has its own column it counts as cloud.
            Some(TargetKind::Cloud | TargetKind::Peer) => bucket.cloud.add(&entry),
            None => bucket.refused += 1,
        }
    }

    /// What the cloud cost and what local answers avoided, over all
    /// buckets (`/metrics`).
    pub fn totals(&self) -> Totals {
        let buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let mut totals = Totals::default();
        for b in buckets.values() {
            totals.cloud_cost_usd += b.cloud.cost_usd;
            totals.cost_avoided_usd += self.avoided(b);
        }
        totals
    }

    fn avoided(&self, bucket: &Bucket) -> f64 {
        self.reference.cost(Usage {
            prompt_tokens: bucket.local.prompt_tokens as u32,
            completion_tokens: bucket.local.completion_tokens as u32,
        })
    }

    /// Per bucket: counts, mean latency per placement, cloud spend, and the
    /// cloud cost local work avoided at the reference upstream's prices.
    /// Latency saved is only claimed where both placements were observed.
    /// Only `tenant`'s buckets when given (a client sees its own traffic).
    pub fn summary(&self, tenant: Option<&str>) -> Value {
        let buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let mut rows = Vec::new();
        let (mut spent, mut avoided, mut saved_ms) = (0.0, 0.0, 0.0);
        let mine = buckets
            .iter()
            .filter(|(key, _)| tenant.is_none_or(|t| key.tenant == t));
        for (key, b) in mine {
            let cost_avoided = self.avoided(b);
            let latency_saved_ms = match (b.local.mean_latency_ms(), b.cloud.mean_latency_ms()) {
                (Some(l), Some(c)) => Some((c - l) * b.local.requests as f64),
                _ => None,
            };
            spent += b.cloud.cost_usd;
            avoided += cost_avoided;
            saved_ms += latency_saved_ms.unwrap_or(0.0);
            rows.push(json!({
                "tenant": key.tenant,
                "prompt_tokens": key.length,
                "task": key.task,
                "sensitivity": key.sensitivity,
                "latency_budget": key.budget,
                "confidence": key.confidence,
                "local": { "requests": b.local.requests, "mean_latency_ms": b.local.mean_latency_ms(), "completion_tokens": b.local.completion_tokens },
                "cloud": { "requests": b.cloud.requests, "mean_latency_ms": b.cloud.mean_latency_ms(), "completion_tokens": b.cloud.completion_tokens, "cost_usd": b.cloud.cost_usd },
                "refused": b.refused,
                "escalated": b.escalated,
                "cost_avoided_usd": cost_avoided,
                "latency_saved_ms": latency_saved_ms,
            }));
        }
        json!({
            "buckets": rows,
            "totals": { "cloud_cost_usd": spent, "cost_avoided_usd": avoided, "latency_saved_ms": saved_ms },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(served_by: Option<&Target>, latency_ms: f64, cost_usd: f64) -> Entry<'_> {
        Entry {
            served_by,
            sensitivity: Sensitivity::Public,
            tenant: "open",
            task: "classify",
            usage: Usage {
                prompt_tokens: 10,
                completion_tokens: 5,
            },
            latency_ms,
            cost_usd,
            latency_budget_ms: None,
            confidence: None,
            escalated: false,
        }
    }

    #[test]
    fn values_local_work_at_reference_prices_and_compares_latency() {
        let ledger = Ledger::new(
            Prices {
                usd_per_mtok_in: 1.0,
                usd_per_mtok_out: 2.0,
            },
            None,
        );
        let (local, cloud) = (
            Target::Local("smollm2".into()),
            Target::Cloud("frontier".into()),
        );
        ledger.record(entry(Some(&local), 100.0, 0.0));
        ledger.record(entry(Some(&local), 300.0, 0.0));
        ledger.record(entry(Some(&cloud), 900.0, 0.5));
        ledger.record(entry(None, 1.0, 0.0));
        let s = ledger.summary(None);
        let row = &s["buckets"][0];
        assert_eq!(row["local"]["requests"], 2);
        assert_eq!(row["refused"], 1);
        // two local requests of 10 in + 5 out tokens at $1/$2 per Mtok
        assert!((row["cost_avoided_usd"].as_f64().unwrap() - 40e-6).abs() < 1e-12);
        // cloud mean 900 vs local mean 200, over two local requests
        assert_eq!(row["latency_saved_ms"], 1400.0);
        assert_eq!(s["totals"]["cloud_cost_usd"], 0.5);
    }

    #[test]
    fn tasks_are_bucketed_only_when_listed_and_tenants_see_their_own() {
        let ledger = Ledger::new(Prices::default(), Some(vec!["classify".into()]));
        let local = Target::Local("smollm2".into());
        for (tenant, task) in [
            ("a", "classify"),
            ("a", "my customer's name is Ann"),
            ("b", "another free text"),
            ("b", ""),
        ] {
            ledger.record(Entry {
                tenant,
                task,
                ..entry(Some(&local), 1.0, 0.0)
            });
        }
        let rows = |tenant| {
            ledger.summary(tenant)["buckets"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| {
                    format!(
                        "{}/{}",
                        r["tenant"].as_str().unwrap(),
                        r["task"].as_str().unwrap()
                    )
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(rows(None), ["a/classify", "a/other", "b/-", "b/other"]);
        assert_eq!(rows(Some("b")), ["b/-", "b/other"]);
    }

    #[test]
    fn budget_and_confidence_split_the_buckets() {
        let ledger = Ledger::new(Prices::default(), None);
        let local = Target::Local("smollm2".into());
        for (budget, confidence, escalated) in [
            (None, Some(0.9), false),
            (Some(800), Some(0.3), true),
            (Some(800), Some(0.35), true),
            (Some(3000), Some(0.5), false),
        ] {
            ledger.record(Entry {
                latency_budget_ms: budget,
                confidence,
                escalated,
                ..entry(Some(&local), 100.0, 0.0)
            });
        }
        let s = ledger.summary(None);
        let rows = s["buckets"].as_array().unwrap();
        assert_eq!(rows.len(), 3, "{s}");
        let unsure = rows
            .iter()
            .find(|r| r["latency_budget"] == "<1s" && r["confidence"] == "<0.4")
            .unwrap();
        assert_eq!(
            (
                unsure["local"]["requests"].as_u64(),
                unsure["escalated"].as_u64()
            ),
            (Some(2), Some(2))
        );
        assert!(
            rows.iter()
                .any(|r| r["latency_budget"] == "none" && r["confidence"] == "0.7+")
        );
        assert!(
            rows.iter()
                .any(|r| r["latency_budget"] == "1-5s" && r["confidence"] == "0.4-0.7")
        );
    }
}
