//! The embedding signal's cost: the encoder per prompt size (llama.cpp
//! called directly, and through the local worker and wasi-nn as the node
//! calls it), the route call of a policy that uses the embedding, and
//! proof that a policy that did not ask pays nothing (no embedding is
//! computed for it).

use super::Spread;
use crate::node::Node;
use crate::router::{Decided, Failure};
use std::path::Path;
use std::time::Instant;

/// Embeddings timed per prompt size (after one warm-up).
const RUNS: usize = 30;

pub async fn run<F: Future<Output = Result<Decided, Failure>>>(
    node: &Node,
    decide: &impl Fn() -> F,
    policy: Option<&Path>,
    policy_calls: u32,
) -> anyhow::Result<()> {
    let Some(embedder) = node.embedder.clone() else {
        println!("embedding: no [local.embedding] model configured; skipped");
        return Ok(());
    };
    // The active (threshold) policy did not ask: requests compute none.
    let before = embedder.embedded();
    for _ in 0..100 {
        let decided = decide()
            .await
            .map_err(|e| anyhow::anyhow!("the bench request was refused: {e:?}"))?;
        std::hint::black_box(decided.placement());
    }
    println!(
        "embedding ({}, {} thread(s)): {} computed for 100 requests under {} (needs: {})",
        embedder.name,
        node.config.local.threads,
        embedder.embedded() - before,
        node.policy.current().source,
        if node.policy.current().needs.embedding {
            "embedding"
        } else {
            "nothing"
        },
    );
    // The node embeds through the local worker and wasi-nn; llama.cpp
    // called directly is the baseline. Alternating, so both see the same
    // machine.
    let word = "routing ";
    let mut per_size = Vec::new();
    for tokens in [16u32, 32, 64, 128] {
        // One word is one token here; [CLS] and [SEP] make up the rest.
        let text = word.repeat(tokens as usize - 2);
        let through = node
            .local
            .embed(&embedder, vec![text.clone()], None)
            .await
            .map_err(|e| anyhow::anyhow!("embedding through the local worker: {e}"))?;
        let direct = {
            let (e, text) = (embedder.clone(), text.clone());
            tokio::task::spawn_blocking(move || e.embed(&text, None)).await??
        };
        anyhow::ensure!(
            direct.tokens == tokens && through[0].tokens == tokens,
            "{} and {} tokens, wanted {tokens}",
            direct.tokens,
            through[0].tokens
        );
        // The same weights on the same input: the same vector, bit for bit.
        anyhow::ensure!(
            through[0].vector == direct.vector,
            "the local worker's embedding differs from llama.cpp's"
        );
        let (mut direct_times, mut through_times) = (Vec::new(), Vec::new());
        for _ in 0..RUNS {
            // Off the async workers, as the node called it before.
            let (e, t) = (embedder.clone(), text.clone());
            let started = Instant::now();
            std::hint::black_box(tokio::task::spawn_blocking(move || e.embed(&t, None)).await??);
            direct_times.push(started.elapsed());
            let started = Instant::now();
            let got = node.local.embed(&embedder, vec![text.clone()], None).await;
            std::hint::black_box(got.map_err(|e| anyhow::anyhow!("{e}"))?);
            through_times.push(started.elapsed());
        }
        let (direct, through) = (Spread::of(direct_times), Spread::of(through_times));
        per_size.push(format!(
            "{tokens} tokens p50 {:.1} ms / p99 {:.1} ms (through wasi-nn p50 {:.1} / p99 {:.1} ms, ratio p50 {:.3})",
            direct.p50 / 1e3,
            direct.p99 / 1e3,
            through.p50 / 1e3,
            through.p99 / 1e3,
            through.p50 / direct.p50
        ));
    }
    println!("  encoder, llama.cpp direct: {}", per_size.join("; "));

    let Some(path) = policy else {
        println!("  (--embedding-policy FILE also times a policy's route call with an embedding)");
        return Ok(());
    };
    let bytes = std::fs::read(path)?;
    let version = crate::policy::admit(
        &crate::runtime::engine()?,
        bytes,
        path.display().to_string(),
        &node.config.policy,
    )
    .await?;
    let mut features = decide()
        .await
        .map_err(|e| anyhow::anyhow!("the bench request was refused: {e:?}"))?
        .features()
        .clone();
    let plain = time_route(&version, &features, policy_calls).await;
    features.embedding = Some(
        embedder
            .embed("Classify: the parcel arrived broken.", Some(128))?
            .vector,
    );
    let with = time_route(&version, &features, policy_calls).await;
    println!(
        "  {} route: p50 {:.1} µs / p99 {:.1} µs with a {}-d embedding; without one p50 {:.1} / p99 {:.1} µs (ratio p99 {:.2})",
        path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned()
        ),
        with.p50,
        with.p99,
        embedder.dims(),
        plain.p50,
        plain.p99,
        with.p99 / plain.p99
    );
    Ok(())
}

/// The configured encoder against another file of it (another weight
/// format), both called directly, alternating: each size's p50s, their
/// ratio, and how close the vectors are.
pub fn compare(node: &Node, file: &Path) -> anyhow::Result<()> {
    let Some(base) = node.embedder.clone() else {
        return Ok(());
    };
    let other = std::sync::Arc::new(crate::nn::embed::Embedder::load(
        "compare",
        file,
        node.config.local.threads,
        base.window(),
    )?);
    let mut per_size = Vec::new();
    for tokens in [16u32, 32, 64, 128] {
        let text = "routing ".repeat(tokens as usize - 2);
        let (mut base_times, mut other_times) = (Vec::new(), Vec::new());
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for _ in 0..=RUNS {
            let started = Instant::now();
            a = base.embed(&text, None)?.vector;
            base_times.push(started.elapsed());
            let started = Instant::now();
            b = other.embed(&text, None)?.vector;
            other_times.push(started.elapsed());
        }
        // The first call of each warms up.
        let (base_p, other_p) = (
            Spread::of(base_times.split_off(1)),
            Spread::of(other_times.split_off(1)),
        );
        per_size.push(format!(
            "{tokens} tokens p50 {:.1} ms vs {:.1} ms (ratio {:.3}), cosine {:.6}",
            base_p.p50 / 1e3,
            other_p.p50 / 1e3,
            other_p.p50 / base_p.p50,
            cosine(&a, &b)
        ));
    }
    println!(
        "  {} against {}: {}",
        file.display(),
        base.name,
        per_size.join("; ")
    );
    Ok(())
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

async fn time_route(
    version: &crate::policy::PolicyVersion,
    features: &edgeroute_core::Features,
    calls: u32,
) -> Spread {
    let mut timings = Vec::with_capacity(calls as usize);
    for i in 0..calls {
        // A fresh id per call, so an exploring policy's choices vary.
        let mut f = features.clone();
        f.request_id = format!("bench-{i}");
        let t = Instant::now();
        let _ = std::hint::black_box(version.route(&f).await);
        timings.push(t.elapsed());
    }
    Spread::of(timings)
}
