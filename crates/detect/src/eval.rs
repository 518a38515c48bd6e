//! Scoring the detector on a labelled set (`tests/detection/eval.jsonl`):
//! one JSON object per line with `messages` and the `kinds` it holds
//! (empty for a clean prompt). `edgeroute bench` prints the report; a test
//! holds the detector to it.

use super::Detector;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Deserialize)]
struct Labelled {
    id: String,
    messages: Vec<Message>,
    kinds: Vec<String>,
}

#[derive(Deserialize)]
struct Message {
    content: String,
}

#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub sensitive: usize,
    pub clean: usize,
    /// Sensitive prompts where something was found (the request stays on
    /// the node): what the guard needs.
    pub kept_local: usize,
    /// Clean prompts where something was found.
    pub false_positives: usize,
    /// Per labelled kind: (prompts with it, prompts where it was found).
    pub by_kind: BTreeMap<String, (usize, usize)>,
    /// Ids of sensitive prompts nothing was found in, and of clean ones
    /// something was (with what).
    pub missed: Vec<String>,
    pub flagged_clean: Vec<(String, Vec<String>)>,
}

impl Report {
    pub fn recall(&self) -> f64 {
        self.kept_local as f64 / self.sensitive.max(1) as f64
    }

    pub fn false_positive_rate(&self) -> f64 {
        self.false_positives as f64 / self.clean.max(1) as f64
    }
}

pub fn evaluate(detector: &Detector, text: &str) -> Result<Report, String> {
    let mut report = Report::default();
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let l: Labelled = serde_json::from_str(line)
            .map_err(|e| format!("line {}: not a labelled prompt: {e}", n + 1))?;
        let found = detector.scan(l.messages.iter().map(|m| m.content.as_str()));
        if l.kinds.is_empty() {
            report.clean += 1;
            if !found.is_empty() {
                report.false_positives += 1;
                report
                    .flagged_clean
                    .push((l.id, found.iter().map(|k| k.to_string()).collect()));
            }
            continue;
        }
        report.sensitive += 1;
        if found.is_empty() {
            report.missed.push(l.id.clone());
        } else {
            report.kept_local += 1;
        }
        for kind in &l.kinds {
            let entry = report.by_kind.entry(kind.clone()).or_default();
            entry.0 += 1;
            entry.1 += found.contains(&kind.as_str()) as usize;
        }
    }
    Ok(report)
}
