//! The signals a policy routes by, end to end: each feature reaches a
//! recording policy with the value the host measured (text statistics,
//! budget, load, latency estimates, the local model's confidence in
//! `observe`), and the confidence cascade of the default policy escalates
//! a public low-confidence answer to the cloud, never a restricted one.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use edgeroute_testkit::{CLOUD_REPLY, FakeCloud, LOCAL_MODEL, Node, Resp, UPSTREAM, unique};
use serde_json::{Value, json};

use crate::EDGEROUTE;
use crate::components::POLICY_FEATURES_ECHO;

fn chat(prompt: &str, max_tokens: u32) -> Value {
    json!({
        "model": "auto",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
    })
}

/// The `key=value` pairs the echo fixture wrote into the reason header.
#[track_caller]
fn echoed(resp: &Resp) -> BTreeMap<String, String> {
    assert_eq!(resp.status, 200, "{resp:?}");
    let reason = resp
        .reason()
        .unwrap_or_else(|| panic!("no reason\n{resp:?}"));
    // The host appends what happened after the policy, after a ';'.
    let policy_part = reason.split(';').next().unwrap_or_default();
    policy_part
        .split(' ')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn parse_estimate(text: &str) -> (u32, u32) {
    let (ttft, total) = text
        .split_once('/')
        .unwrap_or_else(|| panic!("estimate {text:?} is not ttft/total"));
    (ttft.parse().unwrap(), total.parse().unwrap())
}

/// Poll `/healthz` until `field` reaches `at_least`.
#[track_caller]
fn wait_for_health(node: &Node, field: &str, at_least: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let health = node.get("/healthz").json();
        if health[field].as_u64().unwrap_or(0) >= at_least {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{field} never reached {at_least}: {health}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn every_signal_reaches_the_policy_with_the_measured_value() {
    let cloud = FakeCloud::start();
    // A batch one sequence wide: the load check below needs the second
    // request to wait for the first.
    let node = EDGEROUTE
        .node(&cloud)
        .policy_component(POLICY_FEATURES_ECHO)
        .local("max_concurrent", 1)
        .start();

    // Text statistics, the budget and task, on a node that has not
    // generated yet (no estimates, no confidence).
    let mut body = chat("What is 12 plus 30?", 8);
    body["metadata"] = json!({"latency_budget_ms": 5000, "task": "math"});
    let first = node.post_chat(body, &[]);
    let f = echoed(&first);
    let expect = [
        ("chars", "19"),
        ("words", "5"),
        ("digits", "4"),
        ("question", "true"),
        ("code", "false"),
        ("non_ascii", "0"),
        ("messages", "1"),
        ("budget", "5000"),
        ("task", "math"),
        ("max_tokens", "8"),
        ("stream", "false"),
        ("sensitivity", "public"),
        ("may_leave", "true"),
        ("queue", "0"),
        ("running", "0"),
        ("wait", "0"),
        ("local_est", "none"),
        ("cloud_est", "none"),
        ("last_confidence", "none"),
    ];
    for (key, value) in expect {
        assert_eq!(
            f.get(key).map(String::as_str),
            Some(value),
            "{key}\n{first:?}"
        );
    }
    assert_eq!(
        first.target(),
        Some(format!("local:{LOCAL_MODEL}").as_str())
    );
    let confidence = first
        .header("x-edgeroute-confidence")
        .unwrap_or_else(|| panic!("a local answer carries its confidence\n{first:?}"))
        .to_string();
    let value: f32 = confidence.parse().unwrap();
    assert!((0.0..=1.0).contains(&value), "{confidence}");

    // After one local generation: the local estimate exists and grows with
    // the prompt; `observe` got the confidence the client saw; code,
    // other scripts and detected data are seen.
    let second = node.post_chat(
        chat(
            "Fix this:\n```\nfn main() { println!(\"héllo\") }\n```\nMail bob@example.com",
            8,
        ),
        &[],
    );
    let f = echoed(&second);
    assert_eq!(f["last_confidence"], confidence, "{second:?}");
    assert_eq!(f["code"], "true");
    assert_ne!(f["non_ascii"], "0");
    assert_eq!(f["detected"], "email");
    assert_eq!(
        (f["sensitivity"].as_str(), f["may_leave"].as_str()),
        ("restricted", "false")
    );
    let (ttft, total) = parse_estimate(&f["local_est"]);
    assert!(ttft > 0 && total > ttft, "{second:?}");
    let longer = node.post_chat(chat(&"word ".repeat(300), 8), &[]);
    let (long_ttft, _) = parse_estimate(&echoed(&longer)["local_est"]);
    assert!(
        long_ttft > ttft,
        "300 more prompt tokens must take longer: {long_ttft} vs {ttft}"
    );

    // A cloud answer gives the upstream an estimate; no local confidence.
    let mut to_cloud = chat("Say hi.", 8);
    to_cloud["model"] = json!(UPSTREAM);
    let cloudy = node.post_chat(to_cloud, &[]);
    assert_eq!(cloudy.content().as_deref(), Some(CLOUD_REPLY), "{cloudy:?}");
    assert_eq!(cloudy.header("x-edgeroute-confidence"), None, "{cloudy:?}");
    let after = node.post_chat(chat("Say hi.", 8), &[]);
    let f = echoed(&after);
    assert!(
        f["cloud_est"].starts_with(&format!("{UPSTREAM}:")),
        "{after:?}"
    );
    assert_eq!(
        f["last_confidence"], "none",
        "a cloud outcome has no confidence"
    );

    // Load: while one generation runs, the next request sees it running
    // and a wait of about one generation.
    let url = format!("{}/v1/chat/completions", node.url());
    let background = std::thread::spawn(move || {
        ureq::post(url)
            .send_json(chat("Count from one to fifty in words.", 96))
            .map(|r| r.status().as_u16())
    });
    wait_for_health(&node, "local_running", 1);
    let loaded = node.post_chat(chat("Say hi.", 4), &[]);
    let f = echoed(&loaded);
    assert_eq!(f["running"], "1", "{loaded:?}");
    assert_eq!(f["queue"], "1", "{loaded:?}");
    assert!(f["wait"].parse::<u32>().unwrap() > 0, "{loaded:?}");
    assert_eq!(background.join().unwrap().ok(), Some(200));
}

/// A node whose default policy runs every public prompt as a cascade with
/// `min_confidence`.
fn cascade_node(cloud: &FakeCloud, min_confidence: &str) -> Node {
    EDGEROUTE
        .node(cloud)
        .policy_param("cascade_from_tokens", "0")
        .policy_param("cascade_min_confidence", min_confidence)
        .start()
}

#[track_caller]
fn ledger_row(node: &Node) -> Value {
    let ledger = node.get("/ledger").json();
    let rows = ledger["buckets"].as_array().cloned().unwrap_or_default();
    let public: Vec<&Value> = rows
        .iter()
        .filter(|r| r["sensitivity"] == "public")
        .collect();
    assert_eq!(public.len(), 1, "{ledger}");
    public[0].clone()
}

#[test]
fn the_cascade_escalates_unsure_public_answers_and_keeps_restricted_ones() {
    let cloud = FakeCloud::start();
    // No answer is ever fully sure, so every judged answer is "unsure".
    let node = cascade_node(&cloud, "1.0");
    let prompt = "Write one sentence about the sea.";

    let canary = unique("cascade-public");
    let resp = node.post_chat(chat(&format!("{prompt} {canary}"), 16), &[]);
    assert_eq!(resp.status, 200, "{resp:?}");
    assert_eq!(
        resp.target(),
        Some(format!("cloud:{UPSTREAM}").as_str()),
        "{resp:?}"
    );
    assert_eq!(resp.content().as_deref(), Some(CLOUD_REPLY), "{resp:?}");
    let reason = resp.reason().unwrap_or_default();
    assert!(
        reason.contains("escalated: confidence 0.") && reason.contains("< 1.00"),
        "{reason}"
    );
    assert!(resp.header("x-edgeroute-confidence").is_some(), "{resp:?}");
    // The local hop, the judging, then the cloud hop.
    assert_eq!(
        resp.server_timing_steps(),
        [
            "parse", "features", "policy", "guard", "local", "judge", "cloud", "upstream"
        ],
        "{resp:?}"
    );
    cloud.assert_received(&canary, 1);
    // Both legs are in the ledger: the local work and the cloud answer.
    let row = ledger_row(&node);
    assert_eq!(
        (
            row["local"]["requests"].as_u64(),
            row["cloud"]["requests"].as_u64()
        ),
        (Some(1), Some(1)),
        "{row}"
    );
    assert_eq!(row["escalated"], 1, "{row}");
    assert!(
        row["local"]["completion_tokens"].as_u64() > Some(0),
        "{row}"
    );

    // Streaming: the held-back local tokens are dropped, the cloud streams.
    let canary = unique("cascade-stream");
    let mut body = chat(&format!("{prompt} {canary}"), 24);
    body["stream"] = json!(true);
    let resp = node.post_chat(body, &[]);
    let stream = resp.stream();
    assert_eq!(stream.text, CLOUD_REPLY, "{resp:?}");
    assert!(stream.done_last, "{resp:?}");
    cloud.assert_received(&canary, 1);

    // Restricted: judged the same, never escalated; the answer says so.
    let before = cloud.chat_requests().len();
    for stream in [false, true] {
        let canary = unique("cascade-restricted");
        let mut body = chat(&format!("{prompt} {canary}"), 24);
        body["stream"] = json!(stream);
        let resp = node.post_chat(body, &[("x-edgeroute-sensitivity", "restricted")]);
        assert_eq!(resp.status, 200, "{resp:?}");
        assert_eq!(
            resp.target(),
            Some(format!("local:{LOCAL_MODEL}").as_str()),
            "{resp:?}"
        );
        let reason = resp.reason().unwrap_or_default();
        assert!(
            reason.contains("restricted data may not leave") && reason.contains("low confidence"),
            "{reason}"
        );
        let text = if stream {
            resp.stream().text
        } else {
            resp.content().unwrap_or_default()
        };
        assert!(
            text.chars().any(char::is_alphanumeric) && text != CLOUD_REPLY,
            "{resp:?}"
        );
        cloud.assert_received(&canary, 0);
    }
    assert_eq!(cloud.chat_requests().len(), before, "{}", cloud.describe());
}

/// `x-edgeroute-judge` (a Spin gateway's streamed cascade): the node
/// judges its local answer's first tokens and declines below the asked
/// confidence with a 409 `low_confidence` and the confidence header,
/// sending nothing anywhere; at or above it, the answer streams.
#[test]
fn a_caller_that_escalates_itself_gets_a_declined_answer_below_its_bar() {
    let cloud = FakeCloud::start();
    let node = EDGEROUTE.node(&cloud).start();
    let local = format!("local:{LOCAL_MODEL}");
    let prompt = "Write one sentence about the sea.";
    for stream in [true, false] {
        let canary = unique("judge-declined");
        let mut body = chat(&format!("{prompt} {canary}"), 16);
        body["model"] = json!(LOCAL_MODEL);
        body["stream"] = json!(stream);
        let resp = node.post_chat(body, &[("x-edgeroute-judge", "1")]);
        assert_eq!(resp.status, 409, "{resp:?}");
        assert_eq!(resp.json()["error"]["code"], "low_confidence", "{resp:?}");
        let confidence: f32 = resp
            .header("x-edgeroute-confidence")
            .and_then(|c| c.parse().ok())
            .expect("the confidence it was judged by");
        assert!(confidence > 0.0 && confidence < 1.0, "{resp:?}");
        assert_eq!(resp.target(), Some(local.as_str()), "{resp:?}");
        assert!(
            resp.reason().is_some_and(|r| r.contains("declined")),
            "{resp:?}"
        );
        cloud.assert_received(&canary, 0);
    }
    // A bar the answer clears: it streams, token by token past the 16
    // tokens held back to judge (an answer that long, checked by its usage).
    let list = format!("List ten colours, one per line. {}", unique("judge-kept"));
    let mut body = chat(&list, 40);
    body["model"] = json!(LOCAL_MODEL);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let resp = node.post_chat(body, &[("x-edgeroute-judge", "0.0001")]);
    assert_eq!(resp.status, 200, "{resp:?}");
    let stream = resp.stream();
    let completion = stream
        .usage
        .as_ref()
        .and_then(|u| u["completion_tokens"].as_u64());
    assert!(completion > Some(16), "{resp:?}");
    assert!(stream.content_chunks > 1 && stream.done_last, "{resp:?}");
    // Not a confidence: a clear 400, and the node serves on.
    for bad in ["0", "-1", "NaN", "high"] {
        let resp = node.post_chat(chat(prompt, 4), &[("x-edgeroute-judge", bad)]);
        assert_eq!(resp.status, 400, "{bad}: {resp:?}");
        assert!(
            resp.body_text.contains("x-edgeroute-judge"),
            "{bad}: {resp:?}"
        );
    }
    assert!(cloud.chat_requests().is_empty(), "{}", cloud.describe());
}

#[test]
fn a_confident_answer_stays_local_and_streams_whole() {
    let cloud = FakeCloud::start();
    // Any measured answer clears a threshold this low.
    let node = cascade_node(&cloud, "0.0001");
    let resp = node.post_chat(chat("Say hello in one short sentence.", 24), &[]);
    assert_eq!(
        resp.target(),
        Some(format!("local:{LOCAL_MODEL}").as_str()),
        "{resp:?}"
    );
    let plain = resp.content().unwrap_or_default();
    let mut body = chat("Say hello in one short sentence.", 24);
    body["stream"] = json!(true);
    let resp = node.post_chat(body, &[]);
    let reason = resp.reason().unwrap_or_default().to_string();
    assert!(
        reason.contains("local answer") && reason.contains(">= 0.00"),
        "{reason}"
    );
    // The held-back tokens are released in order: the same text as
    // without streaming (greedy).
    assert_eq!(resp.stream().text, plain, "{resp:?}");
    assert!(cloud.chat_requests().is_empty(), "{}", cloud.describe());
}
