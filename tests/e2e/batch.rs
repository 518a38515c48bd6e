//! Continuous batching end to end: concurrent greedy requests decoded in
//! one batch say exactly what they say one at a time, a stream whose client
//! leaves frees its sequence and its KV cells at once, and a request that
//! does not fit in the KV budget beside the running ones waits for them
//! when it may not leave (one that may goes to the cloud).

use edgeroute_testkit::{FakeCloud, LOCAL_MODEL, Node};
use serde_json::{Value, json};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::EDGEROUTE;

/// One question a request asks: short facts the model states with
/// confidence.
const COUNTRIES: [&str; 8] = [
    "France", "Japan", "Italy", "Germany", "Spain", "Egypt", "Canada", "Kenya",
];

/// A greedy request the model is sure of. On a near tie (two tokens within
/// float rounding of each other) llama.cpp's CPU kernels may pick
/// differently in a batch of 8 than alone (they choose GEMM tiling and
/// attention paths by batch size), so free prose can diverge there
/// (`edgeroute bench` reports how often); a confident answer cannot, and a
/// sequence that read another's cells or got another's token would show.
fn greedy(country: &str) -> Value {
    json!({
        "model": LOCAL_MODEL,
        "messages": [{"role": "user", "content": format!("What is the capital of {country}?")}],
        "max_tokens": 16,
        "temperature": 0,
    })
}

fn batch(node: &Node) -> Value {
    node.get("/healthz").json()["local_batch"][LOCAL_MODEL].clone()
}

fn batched_node(cloud: &FakeCloud, width: u64, kv_budget: u64) -> Node {
    EDGEROUTE
        .node(cloud)
        .local("max_concurrent", width)
        .local("kv_budget_tokens", kv_budget)
        .max_queue(16)
        .start()
}

/// Send a chat request on a raw connection and leave it open: the caller
/// drops the stream to leave.
fn start_long(node: &Node, stream: bool) -> TcpStream {
    node.open_chat(&long_story(stream))
}

fn long_story(stream: bool) -> Value {
    // At temperature 2 the small model rarely samples its end token: with
    // this seed it runs to max_tokens.
    json!({
        "model": LOCAL_MODEL,
        "messages": [{"role": "user", "content": "Write a very long story."}],
        "max_tokens": 1500,
        "temperature": 2.0,
        "seed": 1,
        "stream": stream,
    })
}

/// Poll the batch until `check` holds.
#[track_caller]
fn wait_for(node: &Node, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let load = batch(node);
        if check(&load) {
            return load;
        }
        assert!(
            Instant::now() < deadline,
            "{what} never happened: {load}\n{}",
            node.logs()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn eight_concurrent_greedy_requests_say_what_eight_sequential_ones_do() {
    let cloud = FakeCloud::start();
    // One at a time, each on a node that has seen nothing else (no prefix
    // in its cache from another prompt).
    let sequential: Vec<String> = {
        let node = batched_node(&cloud, 8, 8192);
        COUNTRIES
            .iter()
            .map(|&country| {
                let resp = node.post_chat(greedy(country), &[]);
                assert_eq!(resp.status, 200, "{resp:?}");
                resp.content().unwrap()
            })
            .collect()
    };
    let node = batched_node(&cloud, 8, 8192);
    // The most sequences seen in the batch at once while they run.
    let peak = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    let concurrent: Vec<String> = std::thread::scope(|s| {
        let watcher = s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                let running = batch(&node)["running"].as_u64().unwrap_or(0);
                peak.fetch_max(running, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        let handles: Vec<_> = COUNTRIES
            .iter()
            .map(|&country| {
                let node = &node;
                s.spawn(move || node.post_chat(greedy(country), &[]))
            })
            .collect();
        let texts = handles
            .into_iter()
            .map(|h| {
                let resp = h.join().unwrap();
                assert_eq!(resp.status, 200, "{resp:?}");
                resp.content().unwrap()
            })
            .collect();
        done.store(true, Ordering::Relaxed);
        watcher.join().unwrap();
        texts
    });
    assert_eq!(
        concurrent, sequential,
        "batched greedy decoding must not change any text"
    );
    let peak = peak.load(Ordering::Relaxed);
    assert!(
        peak >= 4,
        "the requests never shared a batch: at most {peak}"
    );
}

#[test]
fn a_stream_whose_client_leaves_frees_its_sequence_and_cells() {
    let cloud = FakeCloud::start();
    let node = batched_node(&cloud, 4, 8192);
    let client = start_long(&node, true);
    let running = wait_for(&node, "the generation starting", |b| b["running"] == 1);
    assert!(running["kv_used_tokens"].as_u64() > Some(1000), "{running}");
    std::thread::sleep(Duration::from_millis(300));
    drop(client);
    let left = Instant::now();
    let freed = wait_for(&node, "the sequence leaving", |b| b["running"] == 0);
    assert!(left.elapsed() < Duration::from_secs(5), "{freed}");
    // A cancelled sequence is not kept for reuse: its cells are free.
    assert_eq!(freed["kv_used_tokens"], 0, "{freed}");
    assert_eq!(node.post_chat(greedy("Peru"), &[]).status, 200);
}

#[test]
fn a_request_that_does_not_fit_the_kv_budget_waits_for_the_running_one() {
    let cloud = FakeCloud::start();
    // Room for one context: a long generation's reservation (its prompt
    // plus its completion budget, over 1,000 tokens) leaves no room for a
    // second.
    let node = batched_node(&cloud, 2, 2048);
    // One finished generation, so the node knows how long one takes.
    assert_eq!(node.post_chat(greedy("Chile"), &[]).status, 200);
    // Its sequence retires just after its answer is sent: until then it
    // holds its cells, and the long request below would not fit (it went
    // to the cloud once in CI, and `running == 1` below saw this one).
    wait_for(&node, "the first answer's sequence retiring", |b| {
        b["running"] == 0
    });
    let first = start_long(&node, true);
    wait_for(&node, "the first generation starting", |b| {
        b["running"] == 1
    });
    // A public request that does not fit does not wait: the guard's
    // fallback sends it to the cloud at once, and the reason says why.
    let public = node.post_chat(long_story(false), &[]);
    assert_eq!(public.target(), Some("cloud:frontier"), "{public:?}");
    assert!(
        public
            .reason()
            .is_some_and(|r| r.contains("the KV cache is full")),
        "{public:?}"
    );
    // A restricted one waits for the cells.
    let mut restricted = long_story(false);
    restricted["metadata"] = json!({"sensitivity": "restricted"});
    let second = node.open_chat(&restricted);
    let load = wait_for(&node, "the second request waiting", |b| b["waiting"] == 1);
    assert_eq!(load["running"], 1, "{load}");
    assert!(
        load["kv_used_tokens"].as_u64() <= load["kv_budget_tokens"].as_u64(),
        "{load}"
    );
    // A batch slot is free, but the wait the policy sees is not zero: a
    // request that may leave can go to the cloud instead of queueing.
    let health = node.get("/healthz").json();
    assert!(health["local_wait_ms"].as_u64() > Some(0), "{health}");
    // The first leaves: the second gets its cells and runs.
    drop(first);
    wait_for(&node, "the second request running", |b| {
        b["waiting"] == 0 && b["running"] == 1
    });
    drop(second);
    wait_for(&node, "the batch emptying", |b| b["running"] == 0);
    // A short request fits beside nothing and answers at once.
    let resp = node.post_chat(greedy("Peru"), &[]);
    assert_eq!(resp.status, 200, "{resp:?}");
    // Only the public request that did not fit reached the cloud: the
    // restricted one, refused the same cells, waited on the node.
    assert_eq!(cloud.chat_requests().len(), 1, "{}", cloud.describe());
}
