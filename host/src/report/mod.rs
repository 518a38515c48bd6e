//! `edgeroute report`: a node's traffic as one self-contained HTML file (no
//! scripts, no network; charts are inline SVG) that an operator attaches to
//! a review. It reads either
//! - a ledger snapshot (`curl NODE/ledger > ledger.json`): placement share,
//!   latency, cost and escalations by bucket; or
//! - a decision log (`edgeroute up --decision-log FILE`): the same buckets,
//!   rebuilt with the node's own ledger code, plus what only per-request
//!   lines show — latency distributions and cost saved over time.

pub(crate) mod svg;

use crate::decisions::{Decided, Line};
use crate::ledger::{Entry, Ledger};
use anyhow::{Context, bail};
use edgeroute_core::{Prices, Target, TargetKind, Usage};
use serde_json::Value;
use std::fmt::Write as _;
use std::path::Path;
use svg::{CLOUD, ESCALATED, LOCAL, REFUSED, Series, escape};

/// What the report was made from.
enum Input {
    Ledger(Value),
    Log(Vec<Decided>),
}

/// What was written, for the command's summary line.
pub struct Written {
    pub requests: u64,
    pub buckets: usize,
    pub from_log: bool,
}

/// Read `input`, write the report to `output`. `prices`: the reference
/// upstream's, to value local answers from a log (a ledger snapshot has
/// them already).
pub fn run(input: &Path, output: &Path, prices: Option<Prices>) -> anyhow::Result<Written> {
    let text = std::fs::read_to_string(input)
        .with_context(|| format!("cannot read {}", input.display()))?;
    let parsed = parse(&text).with_context(|| format!("cannot read {}", input.display()))?;
    let name = input
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let (html, written) = render(&name, parsed, prices);
    std::fs::write(output, html).with_context(|| format!("cannot write {}", output.display()))?;
    Ok(written)
}

fn parse(text: &str) -> anyhow::Result<Input> {
    if let Ok(value) = serde_json::from_str::<Value>(text)
        && value.get("buckets").is_some_and(Value::is_array)
    {
        return Ok(Input::Ledger(value));
    }
    let mut decided = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Line>(line) {
            Ok(Line::Decision(d)) => decided.push(*d),
            // Feedback changes no placement, latency or cost.
            Ok(Line::Feedback { .. }) => {}
            Err(e) if n == 0 => bail!(
                "neither a ledger snapshot (GET /ledger) nor a decision log (JSON lines): {e}"
            ),
            Err(e) => bail!("line {}: {e}", n + 1),
        }
    }
    if decided.is_empty() {
        bail!("no requests in it");
    }
    Ok(Input::Log(decided))
}

/// The cascade's second target, when the request was answered by it.
fn escalated(d: &Decided) -> bool {
    match (d.decision.split_once('→'), &d.outcome.served_by) {
        (Some((_, then)), Some(served)) => then == served,
        _ => false,
    }
}

fn served_by(d: &Decided) -> Option<Target> {
    d.outcome.served_by.as_deref().and_then(|s| s.parse().ok())
}

/// The log's requests in the node's own ledger, so the buckets are exactly
/// what `/ledger` would have shown.
fn ledger_of(log: &[Decided], prices: Prices) -> Value {
    let ledger = Ledger::new(prices, None);
    for d in log {
        let target = served_by(d);
        ledger.record(Entry {
            served_by: target.as_ref(),
            sensitivity: d.features.sensitivity,
            tenant: "-",
            task: &d.features.task,
            usage: Usage {
                prompt_tokens: d.outcome.prompt_tokens,
                completion_tokens: d.outcome.completion_tokens,
            },
            latency_ms: f64::from(d.outcome.latency_ms),
            cost_usd: d.outcome.cost_micro_usd as f64 / 1e6,
            latency_budget_ms: d.features.latency_budget_ms,
            confidence: d.outcome.confidence,
            escalated: escalated(d),
        });
    }
    ledger.summary(None)
}

fn render(name: &str, input: Input, prices: Option<Prices>) -> (String, Written) {
    let (ledger, log) = match input {
        Input::Ledger(ledger) => (ledger, None),
        Input::Log(log) => (ledger_of(&log, prices.unwrap_or_default()), Some(log)),
    };
    let buckets = ledger["buckets"].as_array().cloned().unwrap_or_default();
    let n = |b: &Value, path: &[&str]| -> f64 {
        path.iter().fold(b, |v, k| &v[*k]).as_f64().unwrap_or(0.0)
    };
    let label = |b: &Value| {
        [
            "prompt_tokens",
            "task",
            "sensitivity",
            "latency_budget",
            "confidence",
        ]
        .iter()
        .map(|k| b[*k].as_str().unwrap_or("-").to_string())
        .collect::<Vec<_>>()
        .join(" · ")
    };
    let categories: Vec<String> = buckets.iter().map(label).collect();
    let column = |path: &[&str]| buckets.iter().map(|b| n(b, path)).collect::<Vec<_>>();
    let (local, cloud, refused, escalations) = (
        column(&["local", "requests"]),
        column(&["cloud", "requests"]),
        column(&["refused"]),
        column(&["escalated"]),
    );
    let sum = |v: &[f64]| v.iter().sum::<f64>();
    let total = sum(&local) + sum(&cloud) + sum(&refused);
    let totals = &ledger["totals"];

    let mut html = String::new();
    let _ = write!(
        html,
        r#"<!doctype html><html lang="en"><head><meta charset="utf-8"><title>edgeroute traffic report</title>
<style>body{{font-family:sans-serif;margin:2em auto;max-width:1000px;color:#222}}table{{border-collapse:collapse;margin:1em 0}}
td,th{{border-bottom:1px solid #ddd;padding:4px 10px;text-align:right}}td:first-child,th:first-child{{text-align:left}}
.note{{color:#666;font-size:90%}}h2{{margin-top:2em}}</style></head><body>
<h1>edgeroute traffic report</h1>
<p class="note">From <code>{}</code> ({}), {} requests in {} buckets.</p>"#,
        escape(name),
        if log.is_some() {
            "a decision log"
        } else {
            "a ledger snapshot"
        },
        total,
        buckets.len()
    );
    let usd = |v: &Value| v.as_f64().map_or("n/a".into(), |v| format!("${v:.6}"));
    let _ = write!(
        html,
        "<h2>Totals</h2><table><tr><th>local</th><th>cloud</th><th>refused</th><th>escalated</th>\
         <th>cloud spend</th><th>cloud cost avoided</th><th>latency saved</th></tr>\
         <tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1} s</td></tr></table>",
        sum(&local),
        sum(&cloud),
        sum(&refused),
        sum(&escalations),
        usd(&totals["cloud_cost_usd"]),
        usd(&totals["cost_avoided_usd"]),
        totals["latency_saved_ms"].as_f64().unwrap_or(0.0) / 1e3
    );
    if log.is_some() && prices.is_none() {
        html.push_str(r#"<p class="note">No reference prices were given (<code>--config</code>), so local answers are valued at $0.</p>"#);
    }

    html.push_str("<h2>Placement share by bucket</h2><p class=\"note\">Prompt tokens · task · sensitivity · latency budget · local confidence.</p>");
    html.push_str(&svg::stacked_bars(
        &categories,
        &[
            Series {
                name: "local",
                colour: LOCAL,
                values: local.clone(),
            },
            Series {
                name: "cloud",
                colour: CLOUD,
                values: cloud.clone(),
            },
            Series {
                name: "refused",
                colour: REFUSED,
                values: refused.clone(),
            },
        ],
        true,
    ));

    let escalating: Vec<usize> = (0..buckets.len())
        .filter(|&i| escalations[i] > 0.0)
        .collect();
    html.push_str("<h2>Escalations</h2>");
    if escalating.is_empty() {
        html.push_str("<p>No cascade escalated a local answer.</p>");
    } else {
        html.push_str(&svg::stacked_bars(
            &escalating
                .iter()
                .map(|&i| categories[i].clone())
                .collect::<Vec<_>>(),
            &[Series {
                name: "escalated to the cloud",
                colour: ESCALATED,
                values: escalating.iter().map(|&i| escalations[i]).collect(),
            }],
            false,
        ));
    }

    if let Some(log) = &log {
        latency_section(&mut html, log);
        cost_section(&mut html, log, prices.unwrap_or_default());
    } else {
        html.push_str("<p class=\"note\">A ledger snapshot holds no per-request times: a decision log (<code>edgeroute up --decision-log FILE</code>) adds latency distributions and cost over time.</p>");
    }

    html.push_str("<h2>Buckets</h2><table><tr><th>bucket</th><th>local</th><th>cloud</th><th>refused</th><th>escalated</th><th>local mean ms</th><th>cloud mean ms</th><th>cloud spend</th><th>cost avoided</th></tr>");
    let ms = |v: &Value| v.as_f64().map_or("–".into(), |v| format!("{v:.0}"));
    for (i, b) in buckets.iter().enumerate() {
        let _ = write!(
            html,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&categories[i]),
            local[i],
            cloud[i],
            refused[i],
            escalations[i],
            ms(&b["local"]["mean_latency_ms"]),
            ms(&b["cloud"]["mean_latency_ms"]),
            usd(&b["cloud"]["cost_usd"]),
            usd(&b["cost_avoided_usd"]),
        );
    }
    html.push_str("</table></body></html>\n");
    let written = Written {
        requests: total as u64,
        buckets: buckets.len(),
        from_log: log.is_some(),
    };
    (html, written)
}

/// Latency histograms of local and cloud answers, over 20 bins up to the
/// 99th percentile (the slowest 1 % would flatten the rest).
fn latency_section(html: &mut String, log: &[Decided]) {
    let of = |kind: TargetKind| -> Vec<f64> {
        log.iter()
            .filter(|d| d.outcome.ok && served_by(d).is_some_and(|t| t.kind() == kind))
            .map(|d| f64::from(d.outcome.latency_ms))
            .collect()
    };
    let (local, cloud) = (of(TargetKind::Local), of(TargetKind::Cloud));
    let mut all: Vec<f64> = local.iter().chain(&cloud).copied().collect();
    html.push_str("<h2>Latency</h2>");
    if all.is_empty() {
        html.push_str("<p>No answered requests.</p>");
        return;
    }
    all.sort_by(f64::total_cmp);
    let p99 = all[((all.len() - 1) as f64 * 0.99) as usize].max(1.0);
    const BINS: usize = 20;
    let edges: Vec<f64> = (0..=BINS).map(|i| p99 * i as f64 / BINS as f64).collect();
    let bin = |samples: &[f64]| {
        let mut counts = vec![0.0; BINS];
        for &s in samples {
            counts[((s / p99 * BINS as f64) as usize).min(BINS - 1)] += 1.0;
        }
        counts
    };
    let quantile = |samples: &[f64], q: f64| -> String {
        let mut s = samples.to_vec();
        s.sort_by(f64::total_cmp);
        s.get(((s.len().max(1) - 1) as f64 * q) as usize)
            .map_or("–".into(), |v| format!("{v:.0} ms"))
    };
    let _ = write!(
        html,
        "<table><tr><th>placement</th><th>answers</th><th>p50</th><th>p90</th><th>p99</th></tr>\
         <tr><td>local</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\
         <tr><td>cloud</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr></table>",
        local.len(),
        quantile(&local, 0.5),
        quantile(&local, 0.9),
        quantile(&local, 0.99),
        cloud.len(),
        quantile(&cloud, 0.5),
        quantile(&cloud, 0.9),
        quantile(&cloud, 0.99),
    );
    html.push_str(&svg::histogram(
        &edges,
        &[
            Series {
                name: "local",
                colour: LOCAL,
                values: bin(&local),
            },
            Series {
                name: "cloud",
                colour: CLOUD,
                values: bin(&cloud),
            },
        ],
        "latency (ms; answers slower than the 99th percentile in the last bin)",
    ));
}

/// Cumulative cloud spend and the cost local answers avoided, in request
/// order (by time when the log has times).
fn cost_section(html: &mut String, log: &[Decided], prices: Prices) {
    let mut ordered: Vec<&Decided> = log.iter().collect();
    ordered.sort_by_key(|d| d.at_ms.unwrap_or(0));
    let timed = ordered.iter().all(|d| d.at_ms.is_some());
    let start = ordered.first().and_then(|d| d.at_ms).unwrap_or(0);
    let (mut x, mut spent, mut avoided) = (Vec::new(), Vec::new(), Vec::new());
    let (mut s, mut a) = (0.0, 0.0);
    for (i, d) in ordered.iter().enumerate() {
        match served_by(d).map(|t| t.kind()) {
            Some(TargetKind::Local) if d.outcome.ok => {
                a += prices.cost(Usage {
                    prompt_tokens: d.outcome.prompt_tokens,
                    completion_tokens: d.outcome.completion_tokens,
                })
            }
            _ => s += d.outcome.cost_micro_usd as f64 / 1e6,
        }
        x.push(if timed {
            (d.at_ms.unwrap_or(start) - start) as f64 / 60e3
        } else {
            i as f64 + 1.0
        });
        spent.push(s);
        avoided.push(a);
    }
    html.push_str("<h2>Cost over time</h2>");
    html.push_str(&svg::lines(
        &x,
        &[
            Series {
                name: "cloud spend (USD)",
                colour: CLOUD,
                values: spent,
            },
            Series {
                name: "cloud cost avoided (USD)",
                colour: LOCAL,
                values: avoided,
            },
        ],
        if timed {
            "minutes since the first request"
        } else {
            "requests (the log has no times)"
        },
        "USD, cumulative",
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::decisions::Logged;
    use edgeroute_core::{Features, Sensitivity};

    /// A log of three requests (local; escalated to the cloud; restricted
    /// and refused) and one feedback line, as a node writes it.
    fn log() -> String {
        let line = |id: &str, sensitivity, plan: &str, served: Option<&str>, ms, cost, at| {
            let decided = Decided {
                id: id.into(),
                policy: "p".into(),
                features: Features {
                    prompt_tokens: 10,
                    task: "qa".into(),
                    sensitivity,
                    ..Features::default()
                },
                decision: plan.into(),
                propensity: None,
                outcome: Logged {
                    served_by: served.map(str::to_string),
                    ok: served.is_some(),
                    latency_ms: ms,
                    prompt_tokens: 10,
                    completion_tokens: if served.is_some() { 5 } else { 0 },
                    cost_micro_usd: cost,
                    confidence: None,
                },
                at_ms: Some(at),
            };
            serde_json::to_string(&Line::Decision(Box::new(decided))).unwrap()
        };
        [
            line(
                "a",
                Sensitivity::Public,
                "local:smollm2",
                Some("local:smollm2"),
                120,
                0,
                1_000,
            ),
            line(
                "b",
                Sensitivity::Public,
                "local:smollm2→cloud:frontier",
                Some("cloud:frontier"),
                900,
                250,
                61_000,
            ),
            r#"{"id":"b","feedback":1.0}"#.to_string(),
            line(
                "c",
                Sensitivity::Restricted,
                "cloud:frontier",
                None,
                1,
                0,
                62_000,
            ),
        ]
        .join("\n")
    }

    #[test]
    fn a_decision_log_becomes_the_ledger_the_node_would_have_shown() {
        let Input::Log(log) = parse(&log()).unwrap() else {
            panic!("a log")
        };
        assert_eq!(log.len(), 3, "feedback lines are not requests");
        assert!(escalated(&log[1]) && !escalated(&log[0]));
        let prices = Prices {
            usd_per_mtok_in: 1.0,
            usd_per_mtok_out: 2.0,
        };
        let (html, written) = render("log.jsonl", Input::Log(log), Some(prices));
        assert_eq!((written.requests, written.buckets), (3, 2));
        // 1 local + 1 cloud (escalated) + 1 refused; spend $0.000250; one
        // local answer of 10 + 5 tokens valued at $1/$2 per Mtok = $0.000020.
        assert!(
            html.contains(
                "<td>1</td><td>1</td><td>1</td><td>1</td><td>$0.000250</td><td>$0.000020</td>"
            ),
            "{html}"
        );
        assert!(html.contains("minutes since the first request"));
        assert!(html.contains("escalated to the cloud"));
        assert!(!html.contains("<script"), "self-contained, no scripts");
    }

    #[test]
    fn a_ledger_snapshot_is_read_as_is_and_garbage_is_refused() {
        let ledger = r#"{"buckets":[{"prompt_tokens":"0-63","task":"-","sensitivity":"public","latency_budget":"none","confidence":"n/a","local":{"requests":4,"mean_latency_ms":100.0,"completion_tokens":8},"cloud":{"requests":0,"mean_latency_ms":null,"completion_tokens":0,"cost_usd":0.0},"refused":0,"escalated":0,"cost_avoided_usd":0.5,"latency_saved_ms":null}],"totals":{"cloud_cost_usd":0.0,"cost_avoided_usd":0.5,"latency_saved_ms":0.0}}"#;
        let (html, written) = render("ledger.json", parse(ledger).unwrap(), None);
        assert_eq!((written.requests, written.from_log), (4, false));
        assert!(html.contains("$0.500000"), "{html}");
        assert!(html.contains("no per-request times"));
        let error = parse("hello\n").err().unwrap().to_string();
        assert!(error.contains("neither a ledger snapshot"), "{error}");
    }
}
