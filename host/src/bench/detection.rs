//! Detection on the labelled evaluation set: recall by kind, the share of
//! sensitive prompts kept on the node, false positives on clean ones, and
//! the time to scan a 4 KB prompt and an agent's request with six tools.

use super::Spread;
use crate::detect::{Detector, NodeDetector, eval};
use std::path::{Path, PathBuf};
use std::time::Instant;

pub fn run(detector: &NodeDetector, sets: &[PathBuf]) -> anyhow::Result<()> {
    for set in sets {
        score(detector, set)?;
    }
    scan_time(detector);
    agent_time(detector);
    Ok(())
}

fn score(detector: &Detector, set: &Path) -> anyhow::Result<()> {
    let Ok(text) = std::fs::read_to_string(set) else {
        println!(
            "detection: no evaluation set at {} (--detection-set); skipped",
            set.display()
        );
        return Ok(());
    };
    let report = eval::evaluate(detector, &text).map_err(anyhow::Error::msg)?;
    println!(
        "detection ({}): {} of {} sensitive prompts kept local (recall {:.3}); {} of {} clean prompts flagged (false positives {:.1} %)",
        set.display(),
        report.kept_local,
        report.sensitive,
        report.recall(),
        report.false_positives,
        report.clean,
        report.false_positive_rate() * 100.0
    );
    let kinds: Vec<String> = report
        .by_kind
        .iter()
        .map(|(kind, (n, found))| format!("{kind} {found}/{n}"))
        .collect();
    println!(
        "  recall by kind (found as that kind): {}",
        kinds.join(", ")
    );
    if !report.missed.is_empty() {
        println!("  missed: {}", report.missed.join(", "));
    }
    if !report.flagged_clean.is_empty() {
        let flagged: Vec<String> = report
            .flagged_clean
            .iter()
            .map(|(id, kinds)| format!("{id} ({})", kinds.join(",")))
            .collect();
        println!("  flagged clean: {}", flagged.join(", "));
    }
    Ok(())
}

fn scan_time(detector: &Detector) {
    // What most requests are: a short question, and the strings of one
    // tool's description (as `edgeroute bench --proxy-only` sends).
    let short = [
        "Look up the weather in Lyon.",
        "function",
        "weather",
        "object",
    ];
    let mut timings = Vec::with_capacity(2000);
    for _ in 0..2000 {
        let t = Instant::now();
        std::hint::black_box(detector.scan(short));
        timings.push(t.elapsed());
    }
    let spread = Spread::of(timings);
    println!(
        "detection: scan of a short chat (a question and a tool's 3 strings): p50 {:.1} µs, p99 {:.1} µs",
        spread.p50, spread.p99
    );
    // A 4 KB prompt of ordinary prose with numbers in it, and one secret
    // at its end: the whole text is scanned either way.
    let filler = "The quarterly report lists 42 stores, 1,250 staff and revenue of 3.4 million across 12 regions; please summarise it in three bullet points. ";
    let mut prompt = filler.repeat(4096 / filler.len() + 1);
    prompt.truncate(4000);
    prompt.push_str(" key AKIA4H7Q2ZK9RT3WXP5N");
    let mut timings = Vec::with_capacity(200);
    for _ in 0..200 {
        let t = Instant::now();
        std::hint::black_box(detector.scan([prompt.as_str()]));
        timings.push(t.elapsed());
    }
    let spread = Spread::of(timings);
    println!(
        "detection: scan of a {} byte prompt: p50 {:.0} µs, p99 {:.0} µs",
        prompt.len(),
        spread.p50,
        spread.p99
    );
}

/// An agent's call: a system prompt, a question, and six tools' schemas
/// (about a hundred short strings), judged as the node judges a request
/// (`collect::detected`): every text alone, then all joined. Each text
/// judged every time, against the node's memory of clean texts (the same
/// request again, as an agent's next call sends its tools again),
/// alternating.
fn agent_time(detector: &NodeDetector) {
    use edgeroute_detect::collect;
    let tool = |name: &str| {
        serde_json::json!({"type": "function", "function": {
            "name": name,
            "description": format!("Call {name} with the given arguments and return its result as JSON."),
            "parameters": {"type": "object", "properties": {
                "query": {"type": "string", "description": "What to look for, in plain words."},
                "limit": {"type": "integer", "description": "At most this many results."},
                "city": {"type": "string", "description": "A city name."}},
                "required": ["query"]}}})
    };
    let tools: Vec<_> = [
        "weather",
        "search",
        "calendar",
        "email_send",
        "files_read",
        "http_get",
    ]
    .into_iter()
    .map(tool)
    .collect();
    let body = serde_json::json!({"model": "auto", "tools": tools, "max_tokens": 64});
    let rest = body.as_object().cloned().unwrap_or_default();
    let messages = [
        "You are a helpful agent. Use the tools when they help.",
        "Look up the weather in Lyon and put a reminder in my calendar.",
    ];
    let metadata = serde_json::Map::new();
    let (mut fresh, mut remembered) = (Vec::new(), Vec::new());
    let (mut kinds_fresh, mut kinds_remembered) = (Vec::new(), Vec::new());
    for i in 0..1000 {
        let mut set = edgeroute_core::SensitivitySet::new();
        let t = Instant::now();
        if i % 2 == 0 {
            collect::detected(&mut set, detector, messages, &metadata, &rest, |text| {
                detector.alone(text)
            });
            fresh.push(t.elapsed());
            kinds_fresh = set.detected().collect();
        } else {
            detector.detected(&mut set, "bench", messages, &metadata, &rest);
            remembered.push(t.elapsed());
            kinds_remembered = set.detected().collect();
        }
    }
    let (fresh, remembered) = (Spread::of(fresh), Spread::of(remembered));
    println!(
        "detection: an agent's request with six tools: every text judged p50 {:.0} µs, p99 {:.0} µs; clean texts remembered p50 {:.0} µs, p99 {:.0} µs (ratio p50 {:.2}); same findings: {}",
        fresh.p50,
        fresh.p99,
        remembered.p50,
        remembered.p99,
        remembered.p50 / fresh.p50,
        kinds_fresh == kinds_remembered
    );
}
