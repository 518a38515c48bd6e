//! What `/metrics` and the egress audit log add to a request: the series a
//! finished request records, and the audit line a cloud call writes (one
//! `write` to a file), each timed over many requests, against the policy
//! call measured in the same run. Rendering `/metrics` is timed too; it
//! runs per scrape, not per request.

use super::Spread;
use crate::audit::{AuditLog, Event, Record};
use crate::metrics::{Finished, ReasonClass};
use crate::node::Node;
use edgeroute_core::TargetKind;
use std::time::{Duration, Instant};

const REQUESTS: usize = 20_000;
const PACE: Duration = Duration::from_micros(50);

/// `route_p99_us`: the policy call's p99 from the same run (the baseline).
pub fn run(node: &Node, route_p99_us: f64) -> anyhow::Result<()> {
    let policy = node.policy.current().id.clone();
    let kinds = [TargetKind::Local, TargetKind::Cloud];
    let mut metrics = Vec::with_capacity(REQUESTS);
    for i in 0..REQUESTS {
        let finished = Finished {
            placement: Some(kinds[i % 2]),
            reason: ReasonClass::Policy,
            sensitivity: "public",
            ok: true,
            duration: Duration::from_millis(100 + (i % 900) as u64),
            first_text: Some(Duration::from_millis(20 + (i % 80) as u64)),
            completion_tokens: 16,
        };
        let t = Instant::now();
        node.metrics
            .policy_call(&policy, Duration::from_micros(5 + (i % 10) as u64));
        node.metrics.request(std::hint::black_box(&finished));
        metrics.push(t.elapsed());
    }
    let metrics = Spread::of(metrics);

    let dir = std::env::temp_dir().join(format!("edgeroute-bench-audit-{}", std::process::id()));
    let log = AuditLog::open(&dir.join("egress-audit.jsonl"), 64 << 20, 1)?;
    let mut audit = Vec::with_capacity(REQUESTS);
    let started = Instant::now();
    for i in 0..REQUESTS {
        // One cloud request every 50 µs (20 000 a second, far beyond what a
        // node sends out): back to back, the loop would only measure how
        // fast the writer drains a full queue.
        while started.elapsed() < PACE * i as u32 {
            std::hint::spin_loop();
        }
        // Building the record (its strings) is part of what a request pays.
        let t = Instant::now();
        let record = Record {
            at_ms: crate::audit::now_ms(),
            event: Event::Egress,
            request_id: format!("chatcmpl-bench-{i}"),
            target: "cloud:frontier".into(),
            host: Some("api.example.test:443".into()),
            policy: policy.clone(),
            reason: "prompt of 812 tokens > 512: cloud".into(),
            sensitivity: "public".into(),
            refused_by: None,
            prompt_tokens: 812,
            completion_tokens: 64,
            bytes_sent: 3900,
            ok: true,
            via: None,
        };
        log.write(record);
        audit.push(t.elapsed());
    }
    let queued = Instant::now();
    log.flush();
    let drained = queued.elapsed();
    let audit = Spread::of(audit);
    std::fs::remove_dir_all(&dir).ok();

    let mut renders = Vec::with_capacity(200);
    for _ in 0..200 {
        let t = Instant::now();
        std::hint::black_box(node.metrics.render(node));
        renders.push(t.elapsed());
    }
    let renders = Spread::of(renders);

    println!("observability ({REQUESTS} requests each):");
    println!(
        "  metrics per request (request series + policy-call histogram): p50 {:.2} µs, p99 {:.2} µs",
        metrics.p50, metrics.p99
    );
    println!(
        "  audit line per egress (queued at 20 000/s; a thread writes the queue every 50 ms): p50 {:.2} µs, p99 {:.2} µs; the last flush took {:.1} ms",
        audit.p50,
        audit.p99,
        drained.as_secs_f64() * 1e3
    );
    println!(
        "  both, p99 sum {:.2} µs per cloud request (bound 5 µs); {:.2}x the policy call's p99 ({:.1} µs) in this run",
        metrics.p99 + audit.p99,
        (metrics.p99 + audit.p99) / route_p99_us.max(1e-9),
        route_p99_us
    );
    println!(
        "  /metrics render (per scrape, not per request): p50 {:.0} µs, p99 {:.0} µs",
        renders.p50, renders.p99
    );
    Ok(())
}
