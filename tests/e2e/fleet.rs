//! A fleet on loopback: real nodes, a real Redis as their load store, the
//! recording cloud. A busy node forwards what it may to an idle peer (the
//! trust zone decides where restricted data may go), a forwarded request is
//! authenticated and never forwarded again, a peer that dies mid-stream
//! gives the client an error event, and a stale peer is not chosen.

use edgeroute_testkit::{FakeCloud, Node, Redis, unique};
use serde_json::{Value, json};
use std::io::Read;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::EDGEROUTE;

const TOKEN: &str = "fleet-token-for-the-e2e-tests";

/// A node of the fleet; `busy` ones run one generation and queue nothing
/// more, so a second request finds the local model full.
fn fleet_node(cloud: &FakeCloud, redis: &Redis, name: &str, zone: &str, guard: &str) -> Node {
    EDGEROUTE
        .node(cloud)
        .embedding(false)
        .local("max_concurrent", 1)
        .max_queue(1)
        .guard(guard)
        .env("EDGEROUTE_FLEET_TOKEN", TOKEN)
        .config_extra(&format!(
            "[fleet]\nnode = \"{name}\"\nzone = \"{zone}\"\nredis = \"{}\"\nreport_ms = 100\nstale_ms = 1000\n",
            redis.url()
        ))
        .start()
}

fn fleet(node: &Node) -> Value {
    node.get("/healthz").json()["fleet"].clone()
}

fn fresh_peers(node: &Node) -> Vec<String> {
    fleet(node)["peers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["fresh"] == true && p["full"] == false)
        .filter_map(|p| p["name"].as_str().map(str::to_string))
        .collect()
}

#[track_caller]
fn wait_until(what: &str, node: &Node, check: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check() {
        assert!(
            Instant::now() < deadline,
            "{what} never happened: {}\n{}",
            fleet(node),
            node.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Occupy the node's one slot with a long generation; drop it to leave.
fn occupy(node: &Node) -> TcpStream {
    let held = node.open_chat(&long_story(false));
    wait_until("the local slot filling", node, || {
        node.get("/healthz").json()["local_queue_depth"] == 1
    });
    held
}

/// At temperature 2 the small model rarely samples its end token: with
/// this seed it runs to max_tokens.
fn long_story(stream: bool) -> Value {
    json!({
        "model": "auto",
        "messages": [{"role": "user", "content": "Write a very long story."}],
        "max_tokens": 1500,
        "temperature": 2.0,
        "seed": 1,
        "stream": stream,
    })
}

fn short(text: &str) -> Value {
    json!({
        "model": "auto",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 8,
        "temperature": 0,
    })
}

/// Restricted requests the node has answered or refused (its
/// `edgeroute_requests_total` series): unlike its log, it cannot lag
/// behind an earlier public stream that is still being accounted.
fn restricted_requests(node: &Node) -> f64 {
    node.get("/metrics")
        .body_text
        .lines()
        .filter(|l| {
            l.starts_with("edgeroute_requests_total{") && l.contains("sensitivity=\"restricted\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn a_busy_node_forwards_to_an_idle_peer_and_restricted_data_stays_in_its_zone() {
    let cloud = FakeCloud::start();
    let redis = Redis::start();
    // Restricted data may go to a peer of the same zone (r1), never to r2.
    let zone_rule = r#"zone_levels = ["restricted"]"#;
    let a = fleet_node(&cloud, &redis, "a", "r1", zone_rule);
    let b = fleet_node(&cloud, &redis, "b", "r1", zone_rule);
    let c = fleet_node(&cloud, &redis, "c", "r2", zone_rule);
    wait_until("a seeing b and c", &a, || fresh_peers(&a).len() == 2);
    let _held = occupy(&a);

    // Public: forwarded to a peer, not spilled to the cloud.
    let resp = a.post_chat(short("Say hello."), &[]);
    assert_eq!(resp.status, 200, "{resp:?}\n{}", a.logs());
    let target = resp.target().unwrap_or_default().to_string();
    assert!(target.starts_with("peer:"), "{target}: {resp:?}");
    assert!(resp.content().is_some_and(|t| !t.is_empty()), "{resp:?}");

    // A stream is relayed from the peer as it comes.
    let mut body = short("Count to three.");
    body["stream"] = json!(true);
    let resp = a.post_chat(body, &[]);
    assert_eq!(resp.status, 200, "{resp:?}");
    assert!(resp.target().unwrap_or_default().starts_with("peer:"));
    let stream = resp.stream();
    assert!(stream.done_last && stream.errors.is_empty(), "{stream:?}");
    assert!(!stream.text.is_empty(), "{stream:?}");

    // Restricted: only ever b (same zone), never c, never the cloud.
    let before_c = restricted_requests(&c);
    for i in 0..6 {
        // b runs one request at a time: wait for its report to say it is
        // free (a full peer is not a candidate).
        wait_until("b free", &a, || fresh_peers(&a).contains(&"b".to_string()));
        let canary = unique("fleet-restricted");
        let resp = a.post_chat(
            short(&format!("Note {i}: {canary}")),
            &[("x-edgeroute-sensitivity", "restricted")],
        );
        assert_eq!(resp.status, 200, "{resp:?}\n{}", fleet(&a));
        assert_eq!(resp.target(), Some("peer:b"), "{resp:?}");
        assert!(cloud.requests_mentioning(&canary).is_empty());
    }
    assert_eq!(
        restricted_requests(&c),
        before_c,
        "c served restricted data"
    );
    assert_eq!(restricted_requests(&b), 6.0);
    assert!(cloud.chat_requests().is_empty(), "{}", cloud.describe());
    // Forwarded requests are counted as peer placements and audited as
    // egress to the peer (the log is written every 50 ms).
    let metrics = a.get("/metrics").body_text;
    assert!(metrics.contains("placement=\"peer\""), "{metrics}");
    assert!(
        metrics.contains("fleet_peer_fresh{peer=\"b\"} 1"),
        "{metrics}"
    );
    crate::observability::promtool_passes(&metrics);
    std::thread::sleep(Duration::from_millis(200));
    let audit = std::fs::read_to_string(a.audit_log()).unwrap_or_default();
    let to_b = audit
        .lines()
        .filter(|l| l.contains("\"target\":\"peer:b\"") && l.contains("\"event\":\"egress\""))
        .count();
    assert!(to_b >= 6, "{audit}");

    // Without the zone rule restricted data stays on its node: a busy one
    // refuses it.
    let d = fleet_node(&cloud, &redis, "d", "r1", "");
    wait_until("d seeing its peers", &d, || fresh_peers(&d).len() >= 2);
    let _held_d = occupy(&d);
    let before = (restricted_requests(&b), restricted_requests(&c));
    let canary = unique("fleet-stays");
    let resp = d.post_chat(short(&canary), &[("x-edgeroute-sensitivity", "restricted")]);
    assert_eq!(resp.status, 503, "{resp:?}");
    assert_eq!(resp.json()["error"]["code"], "local_busy", "{resp:?}");
    assert_eq!((restricted_requests(&b), restricted_requests(&c)), before);
    assert!(cloud.requests_mentioning(&canary).is_empty());
}

/// Read from a raw response until `needle` shows up or `within` passes.
fn read_until(tcp: &mut TcpStream, needle: &str, within: Duration) -> String {
    tcp.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let deadline = Instant::now() + within;
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline && !String::from_utf8_lossy(&seen).contains(needle) {
        match tcp.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
            Err(_) => {}
        }
    }
    String::from_utf8_lossy(&seen).into_owned()
}

#[test]
fn forwarding_is_authenticated_never_repeated_and_fails_cleanly() {
    let cloud = FakeCloud::start();
    let redis = Redis::start();
    let a = fleet_node(&cloud, &redis, "a", "default", "");
    let b = fleet_node(&cloud, &redis, "b", "default", "");
    wait_until("a seeing b", &a, || fresh_peers(&a) == ["b"]);

    // A forwarded request needs the fleet's token.
    for token in ["wrong-token-of-the-same-size-xx", ""] {
        let resp = b.post_chat(
            short("hi"),
            &[
                ("x-edgeroute-forwarded-by", "a"),
                ("x-edgeroute-fleet-token", token),
            ],
        );
        assert_eq!(resp.status, 401, "{resp:?}");
        assert_eq!(resp.json()["error"]["code"], "invalid_fleet_token");
    }
    assert_eq!(fleet(&b)["peers"][0]["name"], "a");

    // A forwarded request is never forwarded again: busy b spills it to
    // the cloud, not back to idle a.
    let held_b = occupy(&b);
    let resp = b.post_chat(
        short("Forwarded once."),
        &[
            ("x-edgeroute-forwarded-by", "a"),
            ("x-edgeroute-fleet-token", TOKEN),
        ],
    );
    assert_eq!(resp.status, 200, "{resp:?}");
    assert_eq!(resp.target(), Some("cloud:frontier"), "{resp:?}");
    drop(held_b);
    // b frees its slot at its next decode step; a hears of it in b's next
    // report.
    wait_until("b idle again", &b, || {
        b.get("/healthz").json()["local_queue_depth"] == 0
    });
    std::thread::sleep(Duration::from_millis(300));
    wait_until("a hearing b is idle", &a, || fresh_peers(&a) == ["b"]);

    // A peer that dies mid-stream: the client gets an error event.
    let _held_a = occupy(&a);
    let mut tcp = a.open_chat(&long_story(true));
    let head = read_until(&mut tcp, "\"content\":\"", Duration::from_secs(30));
    assert!(head.contains("x-edgeroute-target: peer:b"), "{head}");
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &b.pid().to_string()])
        .status();
    let rest = read_until(&mut tcp, "\"error\"", Duration::from_secs(30));
    assert!(
        rest.contains("\"error\"") && rest.contains("peer:b"),
        "no error event after the peer died: {rest}"
    );
    assert!(!rest.contains("\"finish_reason\":\"stop\""), "{rest}");

    // A stale peer is not chosen: a spills to the cloud.
    wait_until("b going stale", &a, || fresh_peers(&a).is_empty());
    let resp = a.post_chat(short("After the peer died."), &[]);
    assert_eq!(resp.status, 200, "{resp:?}");
    assert_eq!(resp.target(), Some("cloud:frontier"), "{resp:?}");
    assert_eq!(cloud.chat_requests().len(), 2, "{}", cloud.describe());
}

/// The test backend the loopback fleet benchmark runs: the real tokenizer
/// and worker, a fixed labelled text at the configured speeds, and a node
/// that says it runs no model.
#[test]
fn the_paced_test_backend_streams_its_labelled_text_no_faster_than_its_pace() {
    let cloud = FakeCloud::start();
    let node = EDGEROUTE.node(&cloud).paced(1000.0, 40.0).start();
    let health = node.get("/healthz").json();
    assert_eq!(
        health["local_backend"], "test (paced, no model)",
        "{health}"
    );
    let t0 = Instant::now();
    let resp = node.post_chat(
        json!({
            "model": "auto",
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 20,
            "stream": true,
            "stream_options": {"include_usage": true},
        }),
        &[],
    );
    let took = t0.elapsed();
    assert_eq!(resp.status, 200, "{resp:?}");
    assert!(
        resp.target().is_some_and(|t| t.starts_with("local")),
        "{resp:?}"
    );
    let stream = resp.stream();
    assert!(stream.errors.is_empty(), "{stream:?}");
    assert!(
        stream
            .text
            .starts_with("[paced test backend: not a model's answer]"),
        "{stream:?}"
    );
    assert_eq!(
        stream.finish_reason.as_deref(),
        Some("length"),
        "{stream:?}"
    );
    let usage = stream.usage.clone().expect("usage in the last chunk");
    assert_eq!(usage["completion_tokens"], 20, "{usage}");
    // 20 tokens at 40/s: the pace is a floor, however fast the machine.
    assert!(
        took >= Duration::from_millis(19 * 1000 / 40),
        "20 tokens at 40/s came in {took:?}"
    );
    assert!(cloud.chat_requests().is_empty(), "{}", cloud.describe());
}
