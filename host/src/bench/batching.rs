//! The batching benchmark: aggregate completion tokens/s and time to first
//! token with 1, 2, 4 and 8 concurrent local requests through the node's
//! path (local worker, wasi-nn, the batch scheduler), against the same
//! requests one at a time on llama.cpp directly (a context per generation,
//! as the node ran before batching), with the same model, threads and
//! greedy sampling in the same run. Also the prefill speed (batching's
//! ceiling), whether batched text equals one-at-a-time text, and the RSS.

use crate::bindings::target::{ChatRequest, Message};
use crate::nn::{LoadedModel, Sampling};
use crate::node::Node;
use anyhow::Context;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const TOPICS: [&str; 8] = [
    "the sea",
    "a mountain village",
    "bread",
    "a clock tower",
    "winter birds",
    "a library at night",
    "a red bicycle",
    "the first rain",
];

fn messages(topic: &str) -> Vec<(String, String)> {
    vec![(
        "user".to_string(),
        format!("Write a long story about {topic}."),
    )]
}

/// One request's result.
struct Done {
    ttft: Duration,
    tokens: u32,
    text: String,
}

async fn through_node(
    node: &Node,
    model: &str,
    topic: &str,
    max_tokens: u32,
) -> anyhow::Result<Done> {
    let request = ChatRequest {
        model: model.to_string(),
        messages: messages(topic)
            .into_iter()
            .map(|(role, content)| Message { role, content })
            .collect(),
        max_tokens,
        temperature: 0.0,
        top_p: 1.0,
        seed: 0,
        stream: true,
        passthrough: None,
    };
    let streamed = super::stream_local(node, request).await?;
    Ok(Done {
        ttft: streamed.first.context("nothing streamed")? - streamed.started,
        tokens: streamed.completion.usage.completion_tokens,
        text: streamed.text,
    })
}

fn direct(model: &Arc<LoadedModel>, topic: &str, max_tokens: u32) -> anyhow::Result<Done> {
    let t0 = Instant::now();
    let tokens = model.chat_tokens(&messages(topic))?;
    let sampling = Sampling {
        max_tokens,
        ..Sampling::default()
    };
    let mut generation = model.start(tokens, sampling)?;
    let mut text = generation.step()?.text;
    let ttft = t0.elapsed();
    text.push_str(&generation.run_to_end()?.0);
    Ok(Done {
        ttft,
        tokens: generation.completion_tokens(),
        text,
    })
}

/// The process's resident set, from /proc (0 where there is none).
pub(super) fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Forty short sentences (~300 tokens): a prompt whose prefill time says
/// more about speed than about fixed costs.
fn long_prompt() -> String {
    TOPICS
        .iter()
        .cycle()
        .take(40)
        .map(|t| format!("A note about {t}. "))
        .collect()
}

/// Prompt tokens per second of a direct prefill: a long prompt's start
/// minus a one-message start (context creation and the first sample).
fn prefill_rate(model: &Arc<LoadedModel>) -> anyhow::Result<f64> {
    let long = long_prompt();
    let time = |text: &str| -> anyhow::Result<(f64, usize)> {
        let tokens = model.chat_tokens(&[("user".into(), text.into())])?;
        let n = tokens.len();
        let t = Instant::now();
        let mut generation = model.start(
            tokens,
            Sampling {
                max_tokens: 1,
                ..Sampling::default()
            },
        )?;
        generation.step()?;
        Ok((t.elapsed().as_secs_f64(), n))
    };
    time("Hi.")?;
    let (short_s, short_n) = time("Hi.")?;
    let (long_s, long_n) = time(&long)?;
    Ok((long_n - short_n) as f64 / (long_s - short_s).max(1e-9))
}

/// Runs of each prefill for [`output_head_share`].
const CEILING_RUNS: usize = 5;

/// How fast a prefill is with every position's logits against the last
/// position's only, as a ratio of medians, the two alternating: what
/// computing the output head for every token (as every decode step does)
/// leaves of the prefill speed.
fn output_head_share(model: &Arc<LoadedModel>) -> anyhow::Result<f64> {
    let tokens = model.chat_tokens(&[("user".into(), long_prompt())])?;
    let (mut last_only, mut every) = (Vec::new(), Vec::new());
    model.time_prefill(&tokens, false)?;
    for _ in 0..CEILING_RUNS {
        last_only.push(model.time_prefill(&tokens, false)?);
        every.push(model.time_prefill(&tokens, true)?);
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Ok(median(last_only) / median(every))
}

pub async fn run(
    node: &Arc<Node>,
    name: &str,
    max_tokens: u32,
    threads: u32,
) -> anyhow::Result<()> {
    let model = node
        .local
        .model(name)
        .with_context(|| format!("local model '{name}' is not loaded"))?
        .clone();
    let load = node.local.batch_load(name).context("no batch scheduler")?;
    let width = node.config.local.max_concurrent;
    let idle_rss = rss_mib();
    println!(
        "batching: model {name}, {threads} thread(s), batch width {width}, KV budget {} tokens, {max_tokens} tokens a request, greedy",
        load.kv_budget
    );
    // Warm both paths once.
    through_node(node, name, TOPICS[0], 4).await?;
    {
        let model = model.clone();
        tokio::task::spawn_blocking(move || direct(&model, TOPICS[0], 4)).await??;
    }
    let prefill = {
        let model = model.clone();
        tokio::task::spawn_blocking(move || prefill_rate(&model)).await??
    };
    let ceiling = {
        let model = model.clone();
        tokio::task::spawn_blocking(move || output_head_share(&model)).await??
    };

    // The baseline: every prompt one at a time, each in its own context.
    let started = Instant::now();
    let one_at_a_time = {
        let model = model.clone();
        tokio::task::spawn_blocking(move || {
            TOPICS
                .iter()
                .map(|t| direct(&model, t, max_tokens))
                .collect::<anyhow::Result<Vec<_>>>()
        })
        .await??
    };
    let baseline_s = started.elapsed().as_secs_f64();
    let baseline_tokens: u32 = one_at_a_time.iter().map(|d| d.tokens).sum();
    let baseline_rate = baseline_tokens as f64 / baseline_s;

    println!(
        "  {:<11} {:>12} {:>10} {:>10} {:>10} {:>12} {:>9}",
        "concurrent", "tokens/s", "vs 1", "vs direct", "% prefill", "TTFT p50/p99", "same text"
    );
    let mut single_rate = None;
    // The RSS peak, sampled while the sequences run.
    let peak_kib = Arc::new(AtomicU64::new(0));
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (peak_kib, sampling) = (peak_kib.clone(), sampling.clone());
        std::thread::spawn(move || {
            while sampling.load(Ordering::Relaxed) {
                peak_kib.fetch_max((rss_mib() * 1024.0) as u64, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    for concurrency in [1usize, 2, 4, 8] {
        // Rounds of `concurrency` requests until all eight prompts ran.
        let started = Instant::now();
        let mut results = Vec::new();
        for round in TOPICS.chunks(concurrency) {
            let runs: Vec<_> = round
                .iter()
                .map(|topic| {
                    let (node, name) = (node.clone(), name.to_string());
                    tokio::spawn(async move { through_node(&node, &name, topic, max_tokens).await })
                })
                .collect();
            for run in runs {
                results.push(run.await??);
            }
        }
        let wall = started.elapsed().as_secs_f64();
        let tokens: u32 = results.iter().map(|d| d.tokens).sum();
        let rate = tokens as f64 / wall;
        let single = *single_rate.get_or_insert(rate);
        let same = results
            .iter()
            .zip(&one_at_a_time)
            .all(|(a, b)| a.text == b.text);
        let ttft = super::Spread::of(results.iter().map(|d| d.ttft).collect());
        println!(
            "  {:<11} {:>12.1} {:>9.2}x {:>9.2}x {:>9.0}% {:>5.0}/{:<6.0} {:>9}",
            concurrency,
            rate,
            rate / single,
            rate / baseline_rate,
            rate / prefill * 100.0,
            ttft.p50 / 1e3,
            ttft.p99 / 1e3,
            same
        );
    }
    sampling.store(false, Ordering::Relaxed);
    let _ = sampler.join();
    let peak_rss = peak_kib.load(Ordering::Relaxed) as f64 / 1024.0;
    println!(
        "  direct one at a time: {baseline_rate:.1} tokens/s; prefill {prefill:.0} tokens/s (direct, same threads)"
    );
    println!(
        "  batching's ceiling: a prefill with every position's logits (as a batch of decodes needs them) runs at {:.0} % of the speed of one with the last position's only (median of {CEILING_RUNS} each, alternating): 8 streams can reach at most ~{:.0} tokens/s here",
        ceiling * 100.0,
        ceiling * prefill
    );
    let kv_mib = load.kv_budget as f64 * model.kv_bytes_per_token() as f64 / (1 << 20) as f64;
    // The node also holds the embedding model, if it has one: its weights
    // are part of "the model" in the bound.
    let embedding_bytes = node
        .config
        .local
        .embedding
        .as_ref()
        .and_then(|e| std::fs::metadata(&e.path).ok())
        .map_or(0, |m| m.len());
    let model_mib = (model.size_bytes() + embedding_bytes) as f64 / (1 << 20) as f64;
    let bound = kv_mib + model_mib + 100.0;
    println!(
        "  RSS: idle {idle_rss:.0} MiB, peak with up to 8 sequences {peak_rss:.0} MiB (llama.cpp allocates and clears the whole KV cache at start, so sequences add little); bound = KV budget {kv_mib:.0} MiB + models {model_mib:.0} MiB + 100 MiB = {bound:.0} MiB: {}",
        if peak_rss <= bound { "within" } else { "OVER" }
    );
    Ok(())
}
