//! `edgeroute bench`: ratios against baselines measured in the same
//! process. Generation through the local worker and wasi-nn is compared
//! with the same prompt, threads and sampling on llama.cpp called directly
//! (the `Generation` type the backend itself drives, without wasm). The
//! agent chain (`chain.rs`) compares local calls with and without prefix
//! reuse against a simulated cloud (`upstream.rs`); `batching.rs` measures
//! concurrent local requests against one at a time.

mod batching;
mod chain;
mod connections;
mod detection;
mod embedding;
mod fleet;
mod fleet_loopback;
mod observability;
mod proxy;
mod spin_gateway;
pub(crate) mod upstream;

use crate::bindings::target::{ChatRequest, Message};
use crate::config::Config;
use crate::nn;
use crate::nn::Sampling;
use crate::node::Node;
use crate::router::{self, Signals};
use crate::targets::Job;
use anyhow::{Context, bail};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct Options {
    /// Local model to measure (default: the first configured).
    #[arg(long)]
    pub model: Option<String>,
    /// Tokens to generate per run.
    #[arg(long, default_value_t = 64)]
    pub tokens: u32,
    /// Measured runs of each path (after one warm-up each).
    #[arg(long, default_value_t = 5)]
    pub runs: u32,
    /// Policy calls to time.
    #[arg(long, default_value_t = 20_000)]
    pub policy_calls: u32,
    /// Run only the agent chain.
    #[arg(long)]
    pub chain_only: bool,
    /// Run only the batching benchmark (concurrent local requests).
    #[arg(long)]
    pub batching_only: bool,
    /// Only what the node adds to a cloud call (latency, time to first
    /// byte, connections to the upstream), against a loopback upstream.
    #[arg(long)]
    pub proxy_only: bool,
    /// Requests each way in the proxy benchmark.
    #[arg(long, default_value_t = 1000)]
    pub proxy_requests: u32,
    /// Inference threads, in place of the config's `[local] threads`.
    #[arg(long)]
    pub threads: Option<u32>,
    /// Batch width, in place of the config's `[local] max_concurrent`
    /// (the batching benchmark runs up to 8 requests at once).
    #[arg(long)]
    pub max_concurrent: Option<u32>,
    /// Only the fleet: the spillover simulation (3, 30, 300 nodes) and
    /// the placement decision's cost with 300 peers. Needs no model.
    #[arg(long)]
    pub fleet_only: bool,
    /// Requests per simulated run (after a tenth more as warm-up).
    #[arg(long, default_value_t = 100_000)]
    pub fleet_requests: usize,
    /// Where to write the spillover-against-utilisation plot (SVG).
    #[arg(long)]
    pub fleet_plot: Option<std::path::PathBuf>,
    /// Only the fleet on loopback: three nodes in this process with Redis
    /// (`redis-server` on the PATH) and the paced test backend, isolated
    /// against random peer against load-aware on the same arrivals.
    #[arg(long)]
    pub fleet_loopback: bool,
    /// Requests per fleet in `--fleet-loopback` (after a tenth more as
    /// warm-up); about 15 s of traffic per 100.
    #[arg(long, default_value_t = 600)]
    pub fleet_loopback_requests: usize,
    /// Only what Spin adds in front of the node: the root spin.toml's
    /// gateway (non-streaming and first byte) and a Spin app's
    /// `llm::infer`, under the real `spin up` (`$SPIN` or `spin` on the
    /// PATH; `spin build` first). Needs no model.
    #[arg(long)]
    pub spin_gateway: bool,
    /// Requests each way in `--spin-gateway`.
    #[arg(long, default_value_t = 500)]
    pub spin_requests: u32,
    /// Only slow and idle clients: `/healthz` from a fresh connection
    /// while `--connections` sockets sit open (half stuck in their request
    /// head, half silent), against it with nothing else open. Needs no
    /// model.
    #[arg(long)]
    pub connections_only: bool,
    /// Sockets held open in `--connections-only`.
    #[arg(long, default_value_t = 10_000)]
    pub connections: usize,
    /// Run only the detection benchmark.
    #[arg(long)]
    pub detection_only: bool,
    /// Only the embedding signal's cost (llama.cpp direct and through the
    /// local worker, and `--embedding-policy`'s route call).
    #[arg(long)]
    pub embedding_only: bool,
    /// Only the policy call and what metrics and the audit log add to a
    /// request.
    #[arg(long)]
    pub observability_only: bool,
    /// The labelled detection sets to score the detector on (repeatable):
    /// by default the ones the rules were tuned on (the generated set,
    /// the hand-written topics and the development sets,
    /// tests/detection/DEV.md, DEV2.md, DEV3.md to DEV9.md) and the four held-out
    /// ones (tests/detection/HELDOUT.md to HELDOUT4.md), which estimate
    /// unseen text (the fourth's prompts were never read; some of the
    /// first's and third's were, by mistake: see their files).
    #[arg(long, default_values = ["tests/detection/eval.jsonl", "tests/detection/topics.jsonl", "tests/detection/dev.jsonl", "tests/detection/dev2.jsonl", "tests/detection/dev3.jsonl", "tests/detection/dev4.jsonl", "tests/detection/dev5.jsonl", "tests/detection/dev6.jsonl", "tests/detection/dev7.jsonl", "tests/detection/dev8.jsonl", "tests/detection/dev9.jsonl", "tests/detection/heldout.jsonl", "tests/detection/heldout2.jsonl", "tests/detection/heldout3.jsonl", "tests/detection/heldout4.jsonl"])]
    pub detection_set: Vec<std::path::PathBuf>,
    /// A policy that asks for the prompt embedding (e.g. the bandit's
    /// .wasm): its route call is timed on features with an embedding.
    #[arg(long)]
    pub embedding_policy: Option<std::path::PathBuf>,
    /// A second embedding model file (e.g. the same encoder's weights as
    /// Q8_0, `scripts/requantize-model.py`) timed against the configured
    /// one, alternating, with the cosine between their vectors.
    #[arg(long)]
    pub embedding_compare: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub chain: chain::ChainOptions,
}

const MESSAGES: [(&str, &str); 2] = [
    ("system", "You are a helpful assistant."),
    (
        "user",
        "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    ),
];

/// One generation's timings.
struct Sample {
    ttft: Duration,
    decode_tokens_per_s: f64,
    tokens: u32,
    text: String,
}

fn decode_rate(tokens: u32, decode: Duration) -> f64 {
    // The first token comes out of the prefill; the rest are decode steps.
    tokens.saturating_sub(1) as f64 / decode.as_secs_f64().max(1e-9)
}

fn direct(
    model: &Arc<nn::LoadedModel>,
    prompt: &[llama_cpp_2::token::LlamaToken],
    sampling: Sampling,
) -> anyhow::Result<Sample> {
    let t0 = Instant::now();
    // No prefix cache: every run prefills, as the wasi-nn path's does.
    let mut generation = model.start(prompt.to_vec(), sampling)?;
    let mut text = generation.step()?.text;
    let t_first = Instant::now();
    let (rest, _) = generation.run_to_end()?;
    text.push_str(&rest);
    let tokens = generation.completion_tokens();
    Ok(Sample {
        ttft: t_first - t0,
        decode_tokens_per_s: decode_rate(tokens, t_first.elapsed()),
        tokens,
        text,
    })
}

/// One streamed generation through the node's local path (local worker,
/// wasi-nn, the batch scheduler), without prefix reuse so every run
/// prefills.
pub(super) struct Streamed {
    pub started: Instant,
    /// When the first text arrived.
    pub first: Option<Instant>,
    pub text: String,
    pub completion: crate::bindings::target::Completion,
}

pub(super) async fn stream_local(node: &Node, request: ChatRequest) -> anyhow::Result<Streamed> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let started = Instant::now();
    let generation = node.local.generate(Job {
        request,
        stream: Some(tx),
        meter: Default::default(),
        cache: None,
        prompt: None,
        decoding: Default::default(),
        waiting: None,
    });
    let collect = async {
        let mut first = None;
        let mut text = String::new();
        while let Some(delta) = rx.recv().await {
            first.get_or_insert_with(Instant::now);
            text.push_str(delta.text());
        }
        (first, text)
    };
    let (completion, (first, text)) = tokio::join!(generation, collect);
    let completion = completion.map_err(|e| anyhow::anyhow!("local worker failed: {e}"))?;
    Ok(Streamed {
        started,
        first,
        text,
        completion,
    })
}

async fn through_wasi_nn(node: &Node, model: &str, sampling: Sampling) -> anyhow::Result<Sample> {
    let request = ChatRequest {
        model: model.to_string(),
        messages: MESSAGES
            .iter()
            .map(|(role, content)| Message {
                role: role.to_string(),
                content: content.to_string(),
            })
            .collect(),
        max_tokens: sampling.max_tokens,
        temperature: sampling.temperature,
        top_p: sampling.top_p,
        seed: sampling.seed,
        stream: true,
        passthrough: None,
    };
    let Streamed {
        started: t0,
        first,
        text,
        completion,
    } = stream_local(node, request).await?;
    let t_first = first.context("the local worker streamed nothing")?;
    let tokens = completion.usage.completion_tokens;
    Ok(Sample {
        ttft: t_first - t0,
        decode_tokens_per_s: decode_rate(tokens, t_first.elapsed()),
        tokens,
        text,
    })
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

/// The policy call on its own, on the features the pipeline extracts.
async fn policy_route(
    node: &Arc<Node>,
    n: u32,
) -> anyhow::Result<(Spread, edgeroute_core::Features)> {
    let signals = Signals::default();
    let body = short_chat();
    let features = router::decide(node, body.as_bytes(), &signals, "bench".into(), 0)
        .await
        .map_err(|e| anyhow::anyhow!("the bench request was refused: {e:?}"))?
        .features()
        .clone();
    let mut calls = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let t = Instant::now();
        let _ = std::hint::black_box(node.policy.route(&features).await);
        calls.push(t.elapsed());
    }
    let calls = Spread::of(calls);
    println!(
        "policy.route ({}, {n} calls): p50 {:.1} µs, p99 {:.1} µs",
        node.policy.current().source,
        calls.p50,
        calls.p99
    );
    Ok((calls, features))
}

/// The short chat the pipeline's benchmarks decide on.
fn short_chat() -> String {
    serde_json::json!({
        "model": "auto",
        "messages": [{ "role": "user", "content": "Classify: the parcel arrived broken." }],
        "max_tokens": 16,
    })
    .to_string()
}

/// p50 and p99 of a set of timings, in microseconds.
pub(super) struct Spread {
    pub p50: f64,
    pub p99: f64,
}

impl Spread {
    pub(super) fn of(mut timings: Vec<Duration>) -> Self {
        timings.sort();
        let at = |p: f64| {
            timings[((timings.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1e6
        };
        Self {
            p50: at(0.5),
            p99: at(0.99),
        }
    }
}

pub async fn run(mut config: Config, options: Options) -> anyhow::Result<()> {
    if options.runs == 0 {
        bail!("--runs must be at least 1");
    }
    if let Some(threads) = options.threads {
        config.local.threads = threads;
    }
    if let Some(width) = options.max_concurrent {
        config.local.max_concurrent = width;
    }
    let threads = config.local.threads;
    if options.fleet_only {
        return fleet::run(options.fleet_plot.as_deref(), options.fleet_requests);
    }
    if options.fleet_loopback {
        return fleet_loopback::run(config, options.fleet_loopback_requests).await;
    }
    if options.spin_gateway {
        return spin_gateway::run(config, options.spin_requests).await;
    }
    if options.connections_only {
        return connections::run(config, options.connections).await;
    }
    if options.proxy_only {
        // Its own node, whose upstream is the benchmark's.
        return proxy::run(config, options.proxy_requests).await;
    }
    let node = Node::start(config).await?;
    let name = match &options.model {
        Some(name) => name.clone(),
        None => node
            .default_local_model()
            .context("no local model is configured")?
            .to_string(),
    };
    let model = node
        .local
        .model(&name)
        .with_context(|| format!("local model '{name}' is not loaded"))?
        .clone();
    let messages: Vec<(String, String)> = MESSAGES
        .iter()
        .map(|(r, c)| (r.to_string(), c.to_string()))
        .collect();
    if options.detection_only {
        return detection::run(&node.detector, &options.detection_set);
    }
    if options.chain_only {
        return chain::run(&node, &name, &options.chain).await;
    }
    if options.batching_only {
        return batching::run(&node, &name, options.tokens, threads).await;
    }
    if options.embedding_only {
        let signals = Signals::default();
        let body = short_chat();
        let decide = || router::decide(&node, body.as_bytes(), &signals, "bench".into(), 0);
        return embedding::run(
            &node,
            &decide,
            options.embedding_policy.as_deref(),
            options.policy_calls,
        )
        .await
        .and(match &options.embedding_compare {
            Some(file) => embedding::compare(&node, file),
            None => Ok(()),
        });
    }
    if options.observability_only {
        let (calls, _) = policy_route(&node, options.policy_calls).await?;
        return observability::run(&node, calls.p99);
    }
    // The same tokens the wasi-nn path gets from these messages.
    let prompt = model.chat_tokens(&messages)?;
    let sampling = Sampling {
        max_tokens: options.tokens,
        temperature: 0.0,
        top_p: 1.0,
        seed: 0,
    };

    println!(
        "generation: model {name}, {threads} thread(s), {} tokens, greedy, {} runs each (after a warm-up)",
        options.tokens, options.runs
    );
    let run_direct = || {
        let (model, prompt) = (model.clone(), prompt.clone());
        tokio::task::spawn_blocking(move || direct(&model, &prompt, sampling))
    };
    run_direct().await??;
    through_wasi_nn(&node, &name, sampling).await?;
    let (mut d, mut w) = (Vec::new(), Vec::new());
    for i in 0..options.runs {
        // Alternate the order so neither path always runs on a warmer cache.
        if i % 2 == 0 {
            d.push(run_direct().await??);
            w.push(through_wasi_nn(&node, &name, sampling).await?);
        } else {
            w.push(through_wasi_nn(&node, &name, sampling).await?);
            d.push(run_direct().await??);
        }
    }
    let same_text = d
        .iter()
        .zip(&w)
        .all(|(a, b)| a.text == b.text && a.tokens == b.tokens);
    let stat = |s: &[Sample], f: fn(&Sample) -> f64| median(s.iter().map(f).collect());
    let (d_rate, w_rate) = (
        stat(&d, |s| s.decode_tokens_per_s),
        stat(&w, |s| s.decode_tokens_per_s),
    );
    let (d_ttft, w_ttft) = (
        stat(&d, |s| s.ttft.as_secs_f64() * 1e3),
        stat(&w, |s| s.ttft.as_secs_f64() * 1e3),
    );
    println!(
        "  {:<28} {:>12} {:>12} {:>8}",
        "", "direct", "wasi-nn", "ratio"
    );
    println!(
        "  {:<28} {:>12.1} {:>12.1} {:>8.3}",
        "decode tokens/s (median)",
        d_rate,
        w_rate,
        w_rate / d_rate
    );
    println!(
        "  {:<28} {:>12.2} {:>12.2} {:>8.3}",
        "time to first token ms",
        d_ttft,
        w_ttft,
        d_ttft / w_ttft
    );
    println!(
        "  ratio = wasi-nn speed / direct speed (1.0 = no overhead); same greedy text on both paths: {same_text}"
    );

    // The confidence signal's share of a decode step: a log-softmax over
    // the whole vocabulary for every token produced.
    let vocab = model.vocab_size();
    let logits: Vec<f32> = (0..vocab)
        .map(|i| ((i * 7919) % 1000) as f32 / 100.0)
        .collect();
    let mut per_token = Vec::with_capacity(200);
    for i in 0..200 {
        let t = Instant::now();
        std::hint::black_box(edgeroute_core::confidence::logprob(
            std::hint::black_box(&logits),
            i % vocab,
        ));
        per_token.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let confidence_us = median(per_token);
    println!(
        "  confidence (log-softmax over {vocab} tokens): {confidence_us:.1} µs per token = {:.2} % of a decode step",
        confidence_us / (1e6 / w_rate) * 100.0
    );

    let signals = Signals::default();
    let body = short_chat();
    let decide = || router::decide(&node, body.as_bytes(), &signals, "bench".into(), 0);
    let (calls, features) = policy_route(&node, options.policy_calls).await?;
    observability::run(&node, calls.p99)?;

    // Swapping: the time to take a new version live, and what swaps in
    // the background do to the route latency measured above.
    // Swap the policy under test with itself, so the numbers are its own.
    let bytes = match &node.config.policy.component {
        Some(path) => std::fs::read(path)?,
        None => crate::components::POLICY_DEFAULT.to_vec(),
    };
    let mut swaps = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        node.policy.swap(bytes.clone(), "bench".into()).await?;
        swaps.push(t.elapsed());
    }
    let swaps = Spread::of(swaps);
    println!(
        "policy swap (compile + check + probe + switch, 20 swaps, compiled-code cache warm after the first): p50 {:.2} ms, p99 {:.2} ms",
        swaps.p50 / 1e3,
        swaps.p99 / 1e3
    );
    let storm = {
        let node = node.clone();
        let bytes = bytes.clone();
        tokio::spawn(async move {
            loop {
                if node
                    .policy
                    .swap(bytes.clone(), "bench".into())
                    .await
                    .is_err()
                {
                    return;
                }
                tokio::task::yield_now().await;
            }
        })
    };
    let mut during = Vec::with_capacity(options.policy_calls as usize);
    for _ in 0..options.policy_calls {
        let t = Instant::now();
        let _ = std::hint::black_box(node.policy.route(&features).await);
        during.push(t.elapsed());
    }
    storm.abort();
    let during = Spread::of(during);
    println!(
        "policy.route during continuous swaps: p50 {:.1} µs, p99 {:.1} µs (ratio to no swaps: p50 {:.2}, p99 {:.2}); memory per instance {} KiB",
        during.p50,
        during.p99,
        during.p50 / calls.p50,
        during.p99 / calls.p99,
        node.policy
            .current()
            .memory_bytes
            .load(std::sync::atomic::Ordering::Relaxed)
            / 1024
    );

    // Everything the host does before a target runs: the pipeline's
    // parse, features (tokenizing the prompt with the local model), policy
    // and guard — `router::decide`, exactly as a request runs it.
    let mut overhead = Vec::with_capacity(options.policy_calls as usize);
    for _ in 0..options.policy_calls {
        let t = Instant::now();
        let decided = decide()
            .await
            .map_err(|e| anyhow::anyhow!("the bench request was refused: {e:?}"))?;
        std::hint::black_box(decided.placement());
        overhead.push(t.elapsed());
    }
    let overhead = Spread::of(overhead);
    println!(
        "host overhead before inference (parse + features + policy + guard): p50 {:.1} µs, p99 {:.1} µs",
        overhead.p50, overhead.p99
    );
    detection::run(&node.detector, &options.detection_set)?;
    embedding::run(
        &node,
        &decide,
        options.embedding_policy.as_deref(),
        options.policy_calls,
    )
    .await?;
    println!();
    batching::run(&node, &name, options.tokens, threads).await?;
    println!();
    chain::run(&node, &name, &options.chain).await?;
    Ok(())
}
