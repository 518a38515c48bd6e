//! The dataset replay as a command: load what computing the features
//! needs (the local model's tokenizer, the embedding model when the
//! candidate asks for it), run the baselines and the candidate over a
//! sweep, print a table (or JSON), draw the curves.

use super::curve::{Curve, Point};
use super::dataset::{self, Node, Prepared, Setting};
use super::plot;
use crate::config::Config;
use crate::nn::{Embedder, LoadedModel, RuntimeParams};
use crate::policy;
use anyhow::{Context, bail};
use serde::Serialize;
use std::path::{Path, PathBuf};

pub struct Options {
    pub train: Option<PathBuf>,
    pub sweep: Option<String>,
    pub plot: Option<PathBuf>,
    pub json: bool,
}

#[derive(Serialize)]
struct Report {
    examples: usize,
    train_examples: usize,
    candidate: String,
    all_local: Point,
    all_cloud: Point,
    /// The baselines, then the candidate's curve (last).
    curves: Vec<Curve>,
    /// Per category: examples, local accuracy, mean local confidence.
    categories: Vec<(String, usize, f64, Option<f64>)>,
}

/// `name=v1,v2,…` → (name, values).
fn parse_sweep(sweep: &str) -> anyhow::Result<(String, Vec<String>)> {
    let (name, values) = sweep
        .split_once('=')
        .context("--sweep takes NAME=V1,V2,… (a [policy.params] entry and its values)")?;
    let values: Vec<String> = values
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect();
    if name.trim().is_empty() || values.is_empty() {
        bail!("--sweep takes NAME=V1,V2,… with at least one value");
    }
    Ok((name.trim().to_string(), values))
}

pub async fn replay(
    text: &str,
    path: &Path,
    file: &Path,
    config: &Path,
    options: Options,
) -> anyhow::Result<()> {
    let config = Config::load(config)?;
    let examples = dataset::read(text).with_context(|| format!("in {}", path.display()))?;
    let train = match &options.train {
        Some(p) => dataset::read(
            &std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?,
        )
        .with_context(|| format!("in {}", p.display()))?,
        None => Vec::new(),
    };
    let sweep = options.sweep.as_deref().map(parse_sweep).transpose()?;
    let bytes = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    let engine = crate::runtime::engine()?;
    let source = file.display().to_string();
    // Admitted once up front: a broken candidate fails before minutes of
    // feature computation, and its `needs` say whether to embed.
    let first = policy::admit(&engine, bytes.clone(), source.clone(), &config.policy).await?;

    let local_config = config
        .local
        .models
        .first()
        .context("the config has no [[local.models]]: its tokenizer counts prompt tokens")?;
    let upstream = config.cloud.upstreams.first().context(
        "the config has no [[cloud.upstreams]]: a dataset replay places requests on one",
    )?;
    let runtime = RuntimeParams {
        threads: config.local.threads,
        context_size: config.local.context_size,
    };
    let model = LoadedModel::load(&local_config.name, &local_config.path, runtime)?;
    let embedder = match (&config.local.embedding, first.needs.embedding) {
        (Some(e), true) => Some((
            Embedder::load(&e.name, &e.path, config.local.threads, 0)?,
            e.feature_tokens,
        )),
        (None, true) => bail!(
            "{} needs prompt embeddings and the config has no [local.embedding]",
            file.display()
        ),
        _ => None,
    };
    let setting = Setting {
        local: local_config.name.clone(),
        cloud: upstream.name.clone(),
        never_leave: config.guard.never_leave.clone(),
        detector: config
            .guard
            .detect_pii
            .then(|| crate::detect::detector(&config.guard))
            .transpose()?,
    };
    let tokens = |m: &[(String, String)]| {
        model
            .chat_tokens(m)
            .map(|t| t.len() as u32)
            .unwrap_or_default()
    };
    let embed = embedder
        .as_ref()
        .map(|(e, cut)| move |text: &str| e.embed(text, Some(*cut)).ok().map(|x| x.vector));
    let embed_ref = embed
        .as_ref()
        .map(|f| f as &dyn Fn(&str) -> Option<Vec<f32>>);
    if !options.json {
        eprintln!(
            "computing features of {} examples{}…",
            examples.len() + train.len(),
            if embed_ref.is_some() {
                " (with embeddings)"
            } else {
                ""
            }
        );
    }
    let train = dataset::prepare(train, &setting, &tokens, embed_ref);
    let evaluated = dataset::prepare(examples, &setting, &tokens, embed_ref);

    let base = dataset::baselines(&evaluated);
    let (lo, hi) = (base.all_local.quality, base.all_cloud.quality);
    let node = Node {
        local_models: std::slice::from_ref(&setting.local),
        upstreams: std::slice::from_ref(&setting.cloud),
    };
    let runs: Vec<(String, Option<(String, String)>)> = match &sweep {
        Some((name, values)) => values
            .iter()
            .map(|v| (format!("{name}={v}"), Some((name.clone(), v.clone()))))
            .collect(),
        None => vec![(String::new(), None)],
    };
    let mut points = Vec::new();
    for (label, param) in runs {
        let mut policy_config = config.policy.clone();
        if let Some((name, value)) = param {
            policy_config.params.insert(name, value);
        }
        // A fresh instance per setting: what it learns in one run must
        // not carry into the next.
        let candidate =
            policy::admit(&engine, bytes.clone(), source.clone(), &policy_config).await?;
        dataset::run(&candidate, &train, &node).await;
        let served = dataset::run(&candidate, &evaluated, &node).await;
        if !options.json {
            eprintln!(
                "  ran {}",
                if label.is_empty() {
                    "the candidate"
                } else {
                    &label
                }
            );
        }
        points.push(dataset::point(label, &served));
    }
    let name = file
        .file_name()
        .map_or(source.clone(), |n| n.to_string_lossy().into_owned());
    let mut curves = base.curves;
    curves.push(Curve::new(format!("candidate {name}"), points, lo, hi));
    let report = Report {
        examples: evaluated.len(),
        train_examples: train.len(),
        candidate: name,
        all_local: base.all_local,
        all_cloud: base.all_cloud,
        curves,
        categories: categories(&evaluated),
    };
    if let Some(path) = &options.plot {
        plot::curves(path, &report.curves, lo, hi)?;
        if !options.json {
            eprintln!("plot written to {}", path.display());
        }
    }
    if options.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report, path);
    }
    Ok(())
}

fn categories(examples: &[Prepared]) -> Vec<(String, usize, f64, Option<f64>)> {
    let mut by: std::collections::BTreeMap<String, Vec<&Prepared>> = Default::default();
    for e in examples {
        let key = e.example.category.clone().unwrap_or_else(|| "-".into());
        by.entry(key).or_default().push(e);
    }
    by.into_iter()
        .map(|(name, list)| {
            let n = list.len();
            let accuracy = list
                .iter()
                .map(|e| e.example.targets.local.quality)
                .sum::<f64>()
                / n as f64;
            let confidences: Vec<f64> = list
                .iter()
                .filter_map(|e| e.example.targets.local.confidence.map(f64::from))
                .collect();
            let confidence = (!confidences.is_empty())
                .then(|| confidences.iter().sum::<f64>() / confidences.len() as f64);
            (name, n, accuracy, confidence)
        })
        .collect()
}

fn print_table(report: &Report, path: &Path) {
    let pct = |x: Option<f64>| x.map_or("  -  ".into(), |x| format!("{:5.1} %", x * 100.0));
    println!(
        "{} examples from {} ({} replayed first for training)",
        report.examples,
        path.display(),
        report.train_examples
    );
    for (label, p) in [
        ("all local", &report.all_local),
        ("all cloud", &report.all_cloud),
    ] {
        println!(
            "  {label}: quality {:.3}, cost ${:.7}/request, latency {:.0} ms",
            p.quality, p.cost_usd, p.latency_ms
        );
    }
    println!();
    println!(
        "  {:<44} {:>6} {:>9} {:>9}",
        "router", "APGR", "CPT(50%)", "CPT(80%)"
    );
    for c in &report.curves {
        println!(
            "  {:<44} {:>6} {:>9} {:>9}",
            c.name,
            c.apgr.map_or("-".into(), |a| format!("{a:.3}")),
            pct(c.cpt50),
            pct(c.cpt80)
        );
    }
    if let Some(candidate) = report.curves.last() {
        println!();
        println!(
            "  {:<28} {:>8} {:>8} {:>12} {:>10} {:>9}",
            "candidate run", "cloud", "quality", "$/request", "latency", "escalated"
        );
        for p in &candidate.points {
            println!(
                "  {:<28} {:>8} {:>8.3} {:>12.7} {:>7.0} ms {:>9}",
                if p.setting.is_empty() {
                    "-"
                } else {
                    &p.setting
                },
                pct(Some(p.cloud_share)),
                p.quality,
                p.cost_usd,
                p.latency_ms,
                pct(Some(p.escalated))
            );
        }
    }
    println!();
    println!(
        "  {:<16} {:>5} {:>10} {:>11}",
        "category", "n", "local acc", "confidence"
    );
    for (name, n, accuracy, confidence) in &report.categories {
        println!(
            "  {name:<16} {n:>5} {:>10} {:>11}",
            pct(Some(*accuracy)),
            confidence.map_or("-".into(), |c| format!("{c:.3}"))
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_takes_a_name_and_values() {
        let (name, values) = parse_sweep("cost_weight=0, 10,20").unwrap();
        assert_eq!(name, "cost_weight");
        assert_eq!(values, ["0", "10", "20"]);
        assert!(parse_sweep("cost_weight").is_err());
        assert!(parse_sweep("cost_weight=").is_err());
        assert!(parse_sweep("=1").is_err());
    }
}
