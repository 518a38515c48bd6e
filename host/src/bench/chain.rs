//! The agent-chain benchmark: nine sequential calls of a tool-using agent
//! (a system prompt, then each call appends the previous answer and a short
//! tool result; at most 16 output tokens a call), run four ways in one
//! process: all local without prefix reuse, all local with it (a first
//! task, then a second task whose system prompt is already cached), and
//! all cloud against a simulated upstream of stated speed on loopback.
//! It reports each call's time to first token and the chain's wall time,
//! and the round trip below which the cloud chain would win.

use super::upstream::{self, Timing};
use crate::bindings::target::{ChatRequest, Message};
use crate::config::UpstreamConfig;
use crate::nn::CacheScope;
use crate::node::Node;
use crate::targets::cloud::CloudTarget;
use crate::targets::{Job, Taint};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug, Clone)]
pub struct ChainOptions {
    /// Calls in the agent chain.
    #[arg(long, default_value_t = 9)]
    pub chain_calls: u32,
    /// The simulated cloud's network round trip.
    #[arg(long, default_value_t = 300)]
    pub cloud_rtt_ms: u64,
    /// The simulated cloud's own time to first token.
    #[arg(long, default_value_t = 200)]
    pub cloud_ttft_ms: u64,
    /// The simulated cloud's decode speed.
    #[arg(long, default_value_t = 100.0)]
    pub cloud_tokens_per_s: f64,
}

const MAX_TOKENS: u32 = 16;
const SYSTEM: &str = "You are a travel agent with tools. Call a tool as \
    tool(name, args) and wait for its result. Tools: search(query) finds \
    places, weather(city, date) gives the forecast, price(item) gives a \
    price in euros, book(place, time, people) reserves. Keep every answer \
    under twenty words and never invent a tool result.";
const TASKS: [&str; 2] = [
    "Plan a picnic in Paris tomorrow for six people with a budget of 90 euros.",
    "Find a rainy-day museum visit in Lyon on Saturday for two adults.",
];

/// One call's timings.
struct Call {
    ttft_ms: f64,
    total_ms: f64,
    prompt_tokens: u32,
    cached_tokens: u32,
}

enum Where<'a> {
    /// On the local model; `Some` reuses cached prefixes in that scope.
    Local(&'a str, Option<CacheScope>),
    Cloud(&'a CloudTarget),
}

async fn call(node: &Node, at: &Where<'_>, messages: &[Message]) -> anyhow::Result<(Call, String)> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let meter = crate::nn::Meter::default();
    let (model, cache) = match at {
        Where::Local(model, cache) => (model.to_string(), cache.clone()),
        Where::Cloud(_) => (String::new(), None),
    };
    let job = Job {
        request: ChatRequest {
            model,
            messages: messages.to_vec(),
            max_tokens: MAX_TOKENS,
            temperature: 0.0,
            top_p: 1.0,
            seed: 0,
            stream: true,
            passthrough: None,
        },
        stream: Some(tx),
        meter: meter.clone(),
        cache,
        prompt: None,
        decoding: Default::default(),
        waiting: None,
    };
    let t0 = Instant::now();
    // The job owns the only sender: the text channel closes when it ends.
    let generation = async {
        match at {
            Where::Local(..) => node.local.generate(job).await,
            Where::Cloud(cloud) => cloud.generate("sim", job, Taint::may_leave("chain")).await,
        }
    };
    let first = async {
        let first = rx.recv().await.map(|_| Instant::now());
        while rx.recv().await.is_some() {}
        first
    };
    let (completion, first) = tokio::join!(generation, first);
    let completion = completion.map_err(|e| anyhow::anyhow!("chain call failed: {e}"))?;
    let done = t0.elapsed();
    let first = first.map_or(done, |t| t - t0);
    let measured = *meter.lock().unwrap_or_else(|p| p.into_inner());
    let call = Call {
        ttft_ms: first.as_secs_f64() * 1e3,
        total_ms: done.as_secs_f64() * 1e3,
        prompt_tokens: completion.usage.prompt_tokens,
        cached_tokens: measured.reused_tokens,
    };
    Ok((call, completion.text))
}

/// One chain: `calls` sequential calls, each appending the last answer and
/// a tool result.
async fn chain(node: &Node, at: &Where<'_>, task: &str, calls: u32) -> anyhow::Result<Vec<Call>> {
    let message = |role: &str, content: &str| Message {
        role: role.into(),
        content: content.into(),
    };
    let mut messages = vec![message("system", SYSTEM), message("user", task)];
    let mut out = Vec::new();
    for i in 0..calls {
        let (timing, answer) = call(node, at, &messages).await?;
        out.push(timing);
        messages.push(message("assistant", &answer));
        messages.push(message(
            "user",
            &format!(
                "Tool result {}: ok, 24C and sunny, 12 euros, slot 14:00 free.",
                i + 1
            ),
        ));
    }
    Ok(out)
}

fn wall(calls: &[Call]) -> f64 {
    calls.iter().map(|c| c.total_ms).sum()
}

pub async fn run(node: &Arc<Node>, model: &str, options: &ChainOptions) -> anyhow::Result<()> {
    let timing = Timing {
        round_trip: Duration::from_millis(options.cloud_rtt_ms),
        server_ttft: Duration::from_millis(options.cloud_ttft_ms),
        tokens_per_s: options.cloud_tokens_per_s,
    };
    let base_url = upstream::start(timing).await?.base_url;
    let sim = UpstreamConfig {
        name: "sim".into(),
        base_url,
        model: "sim".into(),
        api_key_env: None,
        usd_per_mtok_in: 0.0,
        usd_per_mtok_out: 0.0,
    };
    let engine = crate::runtime::engine()?;
    let cloud = CloudTarget::new(
        &engine,
        crate::components::CLOUD_FETCH,
        &[sim],
        Duration::from_secs(60),
        None,
    )?;
    let n = options.chain_calls.max(1);
    println!(
        "agent chain: {n} sequential calls, <= {MAX_TOKENS} output tokens each, greedy; \
         simulated cloud: {} ms round trip + {} ms server TTFT + {} tokens/s",
        options.cloud_rtt_ms, options.cloud_ttft_ms, options.cloud_tokens_per_s
    );
    let scope = |session: &str| {
        Some(CacheScope {
            session: Some(session.into()),
            ..CacheScope::default()
        })
    };
    let cold = chain(node, &Where::Local(model, None), TASKS[0], n).await?;
    let reuse = chain(node, &Where::Local(model, scope("bench-1")), TASKS[0], n).await?;
    // An agent's second task: its system prompt is in the cache already.
    let second = chain(node, &Where::Local(model, scope("bench-2")), TASKS[1], n).await?;
    let remote = chain(node, &Where::Cloud(&cloud), TASKS[0], n).await?;

    println!(
        "  {:>4} {:>7} {:>20} {:>20} {:>20} {:>10}",
        "call", "prompt", "local, no reuse", "local, reuse", "reuse, 2nd task", "cloud"
    );
    println!(
        "  {:>4} {:>7} {:>20} {:>20} {:>20} {:>10}",
        "", "tokens", "TTFT / total ms", "TTFT ms (cached)", "TTFT ms (cached)", "TTFT ms"
    );
    for i in 0..n as usize {
        println!(
            "  {:>4} {:>7} {:>11.0} / {:>6.0} {:>12.0} ({:>5}) {:>12.0} ({:>5}) {:>10.0}",
            i + 1,
            reuse[i].prompt_tokens,
            cold[i].ttft_ms,
            cold[i].total_ms,
            reuse[i].ttft_ms,
            reuse[i].cached_tokens,
            second[i].ttft_ms,
            second[i].cached_tokens,
            remote[i].ttft_ms,
        );
    }
    let (w_cold, w_reuse, w_second, w_cloud) =
        (wall(&cold), wall(&reuse), wall(&second), wall(&remote));
    println!(
        "  chain wall time: local no reuse {:.0} ms, local reuse {:.0} ms ({:.2}x faster), \
         reuse with the system prompt cached {:.0} ms, cloud {:.0} ms",
        w_cold,
        w_reuse,
        w_cold / w_reuse,
        w_second,
        w_cloud
    );
    let last = n as usize - 1;
    println!(
        "  call {} vs call 1 with reuse: TTFT ratio {:.2} for a prompt {:.1}x longer",
        n,
        reuse[last].ttft_ms / reuse[0].ttft_ms,
        reuse[last].prompt_tokens as f64 / reuse[0].prompt_tokens.max(1) as f64
    );
    // Each cloud call pays the round trip once: the cloud chain moves by
    // n ms per ms of round trip.
    let break_even = options.cloud_rtt_ms as f64 + (w_second - w_cloud) / n as f64;
    println!(
        "  local (2nd task) / cloud wall-time ratio {:.2}; break-even round trip: {:.0} ms \
         (below it the cloud chain is faster)",
        w_second / w_cloud,
        break_even.max(0.0)
    );
    if let Some(speed) = node.local.model(model).map(|m| m.speed()) {
        let rate = |ms: Option<f64>| ms.map_or("n/a".to_string(), |ms| format!("{:.0}", 1e3 / ms));
        println!(
            "  local speeds (moving averages): prefill {} tokens/s, decode {} tokens/s",
            rate(speed.prefill_ms_per_token.get()),
            rate(speed.decode_ms_per_token.get())
        );
    }
    Ok(())
}
