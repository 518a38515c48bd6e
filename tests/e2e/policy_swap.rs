//! Hot-swapping routing policies on a running node: under load, with
//! broken candidates, with state carried across swaps and restarts, in
//! shadow, through the watched file, and behind the admin token.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use edgeroute_testkit::{FakeCloud, Node, NodeBuilder, Resp, unique};
use serde_json::{Value, json};

use crate::EDGEROUTE;
use crate::components::{
    CLOUD_FETCH, POLICY_ALWAYS_CLOUD, POLICY_BANDIT, POLICY_COUNTER, POLICY_COUNTER_V2,
    POLICY_DEFAULT, POLICY_LOOP, POLICY_TRAP, POLICY_WRONG_WORLD,
};

const TOKEN: &str = "test-admin-token";

fn bytes(component: &str) -> Vec<u8> {
    std::fs::read(component).expect("fixture component exists")
}

fn with_admin(builder: NodeBuilder) -> NodeBuilder {
    builder.env("EDGEROUTE_ADMIN_TOKEN", TOKEN)
}

/// One admin call; returns the status and the JSON body.
fn admin(
    node: &Node,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
    token: Option<&str>,
) -> (u16, Value) {
    let agent = ureq::Agent::new_with_config(
        ureq::config::Config::builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(120)))
            .build(),
    );
    let url = format!("{}{path}", node.url());
    let auth = token.map(|t| format!("Bearer {t}"));
    let response = match method {
        "PUT" => {
            let mut r = agent.put(&url);
            if let Some(a) = &auth {
                r = r.header("authorization", a);
            }
            r.send(body.unwrap_or_default())
        }
        "POST" => {
            let mut r = agent.post(&url);
            if let Some(a) = &auth {
                r = r.header("authorization", a);
            }
            r.send_empty()
        }
        "DELETE" => {
            let mut r = agent.delete(&url);
            if let Some(a) = &auth {
                r = r.header("authorization", a);
            }
            r.call()
        }
        _ => {
            let mut r = agent.get(&url);
            if let Some(a) = &auth {
                r = r.header("authorization", a);
            }
            r.call()
        }
    }
    .unwrap_or_else(|e| panic!("{method} {path}: {e}\n{}", node.logs()));
    let status = response.status().as_u16();
    let text = response.into_body().read_to_string().unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn active_id(node: &Node) -> String {
    let (status, body) = admin(node, "GET", "/admin/policy", None, Some(TOKEN));
    assert_eq!(status, 200, "{body}");
    body["active"]["id"]
        .as_str()
        .expect("active id")
        .to_string()
}

fn swap(node: &Node, component: &[u8]) -> (u16, Value) {
    admin(node, "PUT", "/admin/policy", Some(component), Some(TOKEN))
}

/// More than the test config's 64-token threshold: the default policy
/// sends it to the cloud, so the storm does not wait on local inference.
fn long_prompt(tag: &str) -> Value {
    let text = format!(
        "Ticket {tag}. Summarize in one sentence: {}",
        "the delivery arrived late, the box was damaged and the invoice listed the wrong items. "
            .repeat(6)
    );
    json!({ "model": "auto", "messages": [{ "role": "user", "content": text }], "max_tokens": 8 })
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[test]
fn swap_storm_under_load_loses_no_request() {
    let cloud = FakeCloud::start();
    let node = with_admin(EDGEROUTE.node(&cloud).policy_component(POLICY_DEFAULT)).start();
    let (default_bytes, cloud_bytes) = (bytes(POLICY_DEFAULT), bytes(POLICY_ALWAYS_CLOUD));
    let id_default = active_id(&node);
    let (status, body) = swap(&node, &cloud_bytes);
    assert_eq!(status, 200, "{body}");
    let id_cloud = body["active"]["id"].as_str().unwrap().to_string();
    assert_ne!(id_default, id_cloud);

    // Each response must name the version that decided it, and carry that
    // version's reason.
    let check = |resp: &Resp| {
        assert_eq!(resp.status, 200, "{resp:?}");
        let id = resp
            .header("x-edgeroute-policy")
            .unwrap_or_default()
            .to_string();
        let reason = resp.reason().unwrap_or_default().to_string();
        if id == id_default {
            assert!(
                reason.starts_with("long prompt ("),
                "default policy, reason {reason}"
            );
        } else {
            assert_eq!(id, id_cloud, "unknown policy version in {resp:?}");
            assert_eq!(reason, "fixture: always cloud");
        }
        id
    };

    // Baseline latency in the same run, no swaps.
    let mut baseline = Vec::new();
    for i in 0..200 {
        let t = Instant::now();
        check(&node.post_chat(long_prompt(&format!("base-{i}")), &[]));
        baseline.push(t.elapsed());
    }

    let swapping = AtomicBool::new(true);
    let (latencies, seen, swap_times) = std::thread::scope(|s| {
        let clients: Vec<_> = (0..4)
            .map(|c| {
                let (node, swapping, check) = (&node, &swapping, &check);
                s.spawn(move || {
                    let mut latencies = Vec::new();
                    let mut seen = std::collections::BTreeSet::new();
                    let started = Instant::now();
                    // Keep the load on until the swaps are done; bounded in count and time.
                    for i in 0..5_000 {
                        if (!swapping.load(Ordering::Relaxed) && i >= 250)
                            || started.elapsed() > Duration::from_secs(240)
                        {
                            break;
                        }
                        let t = Instant::now();
                        let resp = node.post_chat(long_prompt(&format!("storm-{c}-{i}")), &[]);
                        latencies.push(t.elapsed());
                        seen.insert(check(&resp));
                    }
                    (latencies, seen)
                })
            })
            .collect();
        let mut swap_times = Vec::new();
        for i in 0..100 {
            let next = if i % 2 == 0 {
                &default_bytes
            } else {
                &cloud_bytes
            };
            let t = Instant::now();
            let (status, body) = swap(&node, next);
            swap_times.push(t.elapsed());
            assert_eq!(status, 200, "swap {i}: {body}");
        }
        swapping.store(false, Ordering::Relaxed);
        let mut latencies = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for client in clients {
            let (l, s) = client.join().expect("client thread");
            latencies.extend(l);
            seen.extend(s);
        }
        (latencies, seen, swap_times)
    });
    assert!(
        latencies.len() >= 1000,
        "only {} requests during the storm",
        latencies.len()
    );
    assert_eq!(
        seen.len(),
        2,
        "both versions should have answered during the storm: {seen:?}"
    );
    // 100 swaps from the cloud fixture, ending on it: the active one is known.
    assert_eq!(active_id(&node), id_cloud);

    let (mut baseline, mut storm, mut swaps) = (baseline, latencies, swap_times);
    baseline.sort();
    storm.sort();
    swaps.sort();
    // Reported, not asserted: timing belongs to measurement, not to pass/fail.
    eprintln!(
        "swap storm: {} requests, 0 failed; latency p50/p99 without swaps {:?}/{:?}, during 100 swaps {:?}/{:?}; swap (compile+probe+switch) p50 {:?} p99 {:?}",
        storm.len(),
        percentile(&baseline, 0.5),
        percentile(&baseline, 0.99),
        percentile(&storm, 0.5),
        percentile(&storm, 0.99),
        percentile(&swaps, 0.5),
        percentile(&swaps, 0.99),
    );
}

#[test]
fn broken_candidates_are_refused_and_the_old_policy_keeps_answering() {
    let cloud = FakeCloud::start();
    let node = with_admin(EDGEROUTE.node(&cloud)).start();
    let before = active_id(&node);
    let default_bytes = bytes(POLICY_DEFAULT);
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("wrong world", bytes(POLICY_WRONG_WORLD), "policy world"),
        ("imports wasi:http", bytes(CLOUD_FETCH), "may not import"),
        (
            // Allowed by the old allowlist but never linked for a policy:
            // it passed the check, then failed with a misleading message.
            "imports wasi:nn",
            b"(component (import \"wasi:nn/graph@0.2.0-rc-2024-10-28\" (instance)))".to_vec(),
            "may not import wasi:nn/graph",
        ),
        (
            "truncated file",
            default_bytes[..default_bytes.len() / 2].to_vec(),
            "not a valid WebAssembly component",
        ),
        ("traps on its first call", bytes(POLICY_TRAP), "trap"),
        ("loops forever", bytes(POLICY_LOOP), "timed out"),
        (
            "not wasm at all",
            b"hello".to_vec(),
            "not a valid WebAssembly component",
        ),
    ];
    for (what, component, expect) in cases {
        let (status, body) = swap(&node, &component);
        assert_eq!(status, 422, "{what}: {body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(expect),
            "{what}: expected '{expect}' in: {message}"
        );
        assert_eq!(
            active_id(&node),
            before,
            "{what} must not replace the active policy"
        );
        let resp = node.post_chat(long_prompt(&unique("after-refusal")), &[]);
        assert_eq!(resp.status, 200, "{what}: {resp:?}");
        assert_eq!(resp.header("x-edgeroute-policy"), Some(before.as_str()));
        assert!(
            resp.reason()
                .unwrap_or_default()
                .starts_with("long prompt ("),
            "{resp:?}"
        );
        // `edgeroute policy check` refuses exactly what the node refused,
        // for the same reason: both call `policy::admit`.
        let file = node.dir().join(format!("{}.wasm", unique("candidate")));
        std::fs::write(&file, &component).unwrap();
        let (passed, text) = EDGEROUTE.policy_check(&file, false);
        assert!(!passed, "{what}: policy check passed:\n{text}");
        assert!(
            text.contains(expect),
            "{what}: expected '{expect}' in:\n{text}"
        );
    }
}

fn counter_call(resp: &Resp) -> u64 {
    assert_eq!(resp.status, 200, "{resp:?}");
    let reason = resp.reason().unwrap_or_default();
    reason
        .strip_prefix("counter: call ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not a counter reason: {reason}"))
}

/// `counter` counts its calls in state it snapshots; `other` is the same
/// counter for the other policy world version.
fn policy_state_survives_a_swap_and_a_restart(counter: &str, world: &str, other: &str) {
    let cloud = FakeCloud::start();
    let state_dir = std::env::temp_dir().join(unique("edgeroute-state"));
    let start = || {
        with_admin(EDGEROUTE.node(&cloud).policy_component(counter))
            .arg("--state-dir")
            .arg(state_dir.display().to_string())
            .start()
    };
    let node = start();
    let calls: Vec<u64> = (0..3)
        .map(|i| counter_call(&node.post_chat(long_prompt(&format!("c{i}")), &[])))
        .collect();
    assert_eq!(calls, [1, 2, 3]);

    // The new instance was probed (which counts) and then given the old state.
    let (status, body) = swap(&node, &bytes(counter));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["active"]["stateful"], true);
    assert_eq!(
        body["active"]["world"],
        format!("edgeroute:routing/policy@{world}")
    );
    assert_eq!(
        counter_call(&node.post_chat(long_prompt("after-swap"), &[])),
        4
    );

    // A stateless version in between keeps nothing, and the rollback goes
    // back to the counter instance as it was.
    let (status, body) = swap(&node, &bytes(POLICY_ALWAYS_CLOUD));
    assert_eq!(status, 200, "{body}");
    let (status, body) = admin(&node, "POST", "/admin/policy/rollback", None, Some(TOKEN));
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        counter_call(&node.post_chat(long_prompt("after-rollback"), &[])),
        5
    );

    // The node persists state at least once a second; then restart it.
    std::thread::sleep(Duration::from_millis(2500));
    drop(node);
    let node = start();
    assert_eq!(
        counter_call(&node.post_chat(long_prompt("after-restart"), &[])),
        6
    );
    // Across world versions: the same state format moves between a 0.1
    // and a 0.2 policy.
    let (status, body) = swap(&node, &bytes(other));
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        counter_call(&node.post_chat(long_prompt("other-world"), &[])),
        7
    );
    drop(node);
    let _ = std::fs::remove_dir_all(&state_dir);
}

#[test]
fn policy_state_survives_a_swap_and_a_restart_world_0_1() {
    policy_state_survives_a_swap_and_a_restart(POLICY_COUNTER, "0.1", POLICY_COUNTER_V2);
}

#[test]
fn policy_state_survives_a_swap_and_a_restart_world_0_2() {
    policy_state_survives_a_swap_and_a_restart(POLICY_COUNTER_V2, "0.2", POLICY_COUNTER);
}

#[test]
fn admin_endpoints_need_the_token_and_are_off_without_one() {
    let cloud = FakeCloud::start();
    let node = with_admin(EDGEROUTE.node(&cloud)).start();
    let component = bytes(POLICY_ALWAYS_CLOUD);
    for token in [None, Some("wrong-token")] {
        for (method, path) in [
            ("GET", "/admin/policy"),
            ("PUT", "/admin/policy"),
            ("POST", "/admin/policy/rollback"),
            ("GET", "/admin/shadow"),
        ] {
            let (status, body) = admin(&node, method, path, Some(&component), token);
            assert_eq!(status, 401, "{method} {path} with {token:?}: {body}");
            assert_eq!(body["error"]["code"], "invalid_admin_token");
        }
    }
    let before = active_id(&node);
    assert_eq!(before.len(), 12);

    let off = EDGEROUTE.node(&cloud).start();
    let (status, body) = admin(&off, "PUT", "/admin/policy", Some(&component), Some(TOKEN));
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "admin_disabled");
    let resp = off.post_chat(long_prompt("still-default"), &[]);
    assert!(
        resp.reason()
            .unwrap_or_default()
            .starts_with("long prompt ("),
        "{resp:?}"
    );
}

#[test]
fn replacing_the_policy_file_swaps_it_in() {
    let cloud = FakeCloud::start();
    let file = std::env::temp_dir().join(format!("{}.wasm", unique("watched-policy")));
    std::fs::copy(POLICY_DEFAULT, &file).unwrap();
    let node = EDGEROUTE.node(&cloud).policy_component(&file).start();
    let resp = node.post_chat(long_prompt("before"), &[]);
    assert!(
        resp.reason()
            .unwrap_or_default()
            .starts_with("long prompt ("),
        "{resp:?}"
    );

    // Write the new version beside it and rename over, as deploy tools do.
    let staged = file.with_extension("staged");
    std::fs::copy(POLICY_ALWAYS_CLOUD, &staged).unwrap();
    std::fs::rename(&staged, &file).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let resp = node.post_chat(long_prompt("after"), &[]);
        assert_eq!(resp.status, 200, "{resp:?}");
        if resp.reason() == Some("fixture: always cloud") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new policy file was not picked up\n{}",
            node.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // A broken file is refused; the last good version keeps answering.
    std::fs::write(&staged, b"not a component").unwrap();
    std::fs::rename(&staged, &file).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let resp = node.post_chat(long_prompt("after-broken"), &[]);
    assert_eq!(resp.reason(), Some("fixture: always cloud"), "{resp:?}");
    node.logs_with("refused");
    let _ = std::fs::remove_file(&file);
}

#[test]
fn shadow_candidate_is_recorded_never_acted_on() {
    let cloud = FakeCloud::start();
    let node = with_admin(EDGEROUTE.node(&cloud)).start();
    let (status, body) = admin(
        &node,
        "PUT",
        "/admin/shadow",
        Some(&bytes(POLICY_ALWAYS_CLOUD)),
        Some(TOKEN),
    );
    assert_eq!(status, 200, "{body}");

    // Live default policy: long → cloud (agrees with the candidate),
    // restricted → local (the candidate would have said cloud).
    let canary = unique("shadow-restricted");
    let long = node.post_chat(long_prompt("shadow-long"), &[]);
    assert!(
        long.target().is_some_and(|t| t.starts_with("cloud:")),
        "{long:?}"
    );
    let restricted = node.post_chat(
        json!({ "model": "auto", "messages": [{ "role": "user", "content": format!("Say hi. {canary}") }], "max_tokens": 4 }),
        &[("x-edgeroute-sensitivity", "restricted")],
    );
    assert_eq!(restricted.target(), Some("local:smollm2"), "{restricted:?}");
    assert!(
        cloud.requests_mentioning(&canary).is_empty(),
        "the shadow must never act"
    );

    let deadline = Instant::now() + Duration::from_secs(10);
    let summary = loop {
        let (status, summary) = admin(&node, "GET", "/admin/shadow", None, Some(TOKEN));
        assert_eq!(status, 200);
        if summary["compared"] == 2 || Instant::now() > deadline {
            break summary;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(summary["compared"], 2, "{summary}");
    assert_eq!(summary["agreed"], 1, "{summary}");
    assert_eq!(
        summary["by_sensitivity"]["restricted"]["agreed"], 0,
        "{summary}"
    );
    assert_eq!(
        summary["differences"][0]["live"], "local:smollm2",
        "{summary}"
    );
    assert_eq!(
        summary["differences"][0]["candidate"], "cloud:frontier",
        "{summary}"
    );

    let (status, _) = admin(&node, "DELETE", "/admin/shadow", None, Some(TOKEN));
    assert_eq!(status, 200);
    let (_, summary) = admin(&node, "GET", "/admin/shadow", None, Some(TOKEN));
    assert!(summary["candidate"].is_null(), "{summary}");
}

/// `learned N` in the bandit's reason: outcomes it has learned from.
fn learned(resp: &edgeroute_testkit::Resp) -> u64 {
    assert_eq!(resp.status, 200, "{resp:?}");
    let reason = resp.decision_reason().unwrap_or_default();
    reason
        .split("learned ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not a bandit reason: {reason}"))
}

/// `POST /v1/feedback` with a JSON body; the status and the JSON answer.
fn feedback(node: &Node, body: Value) -> (u16, Value) {
    let resp = node.post_json("/v1/feedback", body, &[]);
    (resp.status, resp.json())
}

#[test]
fn the_bandit_learns_from_outcomes_and_feedback_and_keeps_it_across_swaps_and_restarts() {
    let cloud = FakeCloud::start();
    let state_dir = std::env::temp_dir().join(unique("edgeroute-bandit"));
    let start = || {
        with_admin(EDGEROUTE.node(&cloud).policy_component(POLICY_BANDIT))
            .policy_param("exploration", "0")
            .arg("--state-dir")
            .arg(state_dir.display().to_string())
            .start()
    };
    let ask = |node: &Node, i: u32| {
        node.post_chat(
            json!({"model": "auto", "max_tokens": 6, "temperature": 0,
                   "messages": [{"role": "user", "content": format!("Name a colour, {i}.")}]}),
            &[],
        )
    };
    let node = start();
    let first = ask(&node, 0);
    assert!(
        first.reason().unwrap_or_default().contains("p=1.00"),
        "{first:?}"
    );
    let seen: Vec<u64> = std::iter::once(learned(&first))
        .chain((1..4).map(|i| learned(&ask(&node, i))))
        .collect();
    assert_eq!(seen, [0, 1, 2, 3], "each outcome is learned once");

    // Feedback reaches the policy (a correction, not a new outcome).
    let id = first.json()["id"].as_str().unwrap().to_string();
    let (status, body) = feedback(&node, json!({"id": id, "score": 0.9}));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["delivered_to_policy"], true, "{body}");
    assert_eq!(learned(&ask(&node, 4)), 4);
    let (status, body) = feedback(&node, json!({"id": "chatcmpl-nope", "score": 0.5}));
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("request_not_found")),
        "{body}"
    );
    let (status, body) = feedback(&node, json!({"id": id, "score": 1.5}));
    assert_eq!(
        (status, body["error"]["param"].as_str()),
        (400, Some("score")),
        "{body}"
    );

    // A swap to a new version of itself carries the model over.
    let (status, body) = swap(&node, &bytes(POLICY_BANDIT));
    assert_eq!(status, 200, "{body}");
    assert_eq!(learned(&ask(&node, 5)), 5);

    // So does a restart (state is persisted at least once a second).
    std::thread::sleep(Duration::from_millis(2500));
    drop(node);
    let node = start();
    assert_eq!(learned(&ask(&node, 6)), 6);
    drop(node);
    let _ = std::fs::remove_dir_all(&state_dir);
}

/// `edgeroute policy replay LOG FILE --json` with the node's own config.
fn replay(node_config: &std::path::Path, log: &std::path::Path, candidate: &str) -> Value {
    EDGEROUTE.policy_replay(log, candidate, node_config, &[])
}

#[test]
fn a_decision_log_from_a_real_node_replays() {
    let cloud = FakeCloud::start();
    let log = std::env::temp_dir().join(format!("{}.jsonl", unique("decisions")));
    let node = EDGEROUTE
        .node(&cloud)
        .arg("--decision-log")
        .arg(log.display().to_string())
        .start();
    let short = json!({"model": "auto", "max_tokens": 4, "messages": [{"role": "user", "content": "Say hi."}]});
    let first = node.post_chat(short.clone(), &[]);
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(node.post_chat(long_prompt("replay"), &[]).status, 200);
    let restricted = node.post_chat(short, &[("x-edgeroute-sensitivity", "restricted")]);
    assert_eq!(restricted.status, 200, "{restricted:?}");
    let id = first.json()["id"].as_str().unwrap().to_string();
    let (status, body) = feedback(&node, json!({"id": id, "score": 0.25}));
    assert_eq!(status, 200, "{body}");
    // The node's folder goes with it: keep its config for the replay.
    let config = log.with_extension("toml");
    std::fs::copy(node.dir().join("edgeroute.toml"), &config).unwrap();
    // The log is written off the request path: wait for its lines.
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.lines().count() >= 4 || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(node);
    assert_eq!(
        text.lines().count(),
        4,
        "three decisions and a feedback:\n{text}"
    );
    assert!(
        !text.contains("Say hi"),
        "the log never holds prompt text:\n{text}"
    );

    // The live (deterministic) policy replayed on its own log agrees
    // everywhere, so every estimate is the logged mean reward.
    let same = replay(&config, &log, POLICY_DEFAULT);
    assert_eq!(same["records"], 3, "{same}");
    assert_eq!(same["agreement"], 1.0, "{same}");
    let logged = same["logged"].as_f64().unwrap();
    for estimate in ["ips", "dm", "dr"] {
        let value = same[estimate].as_f64().unwrap();
        assert!(
            (value - logged).abs() < 1e-9,
            "{estimate} {value} vs {logged}: {same}"
        );
    }
    assert_eq!(same["deterministic_logging"], true, "{same}");
    // A policy that sends everything to the cloud agrees only on the long
    // prompt the live policy also sent there.
    let other = replay(&config, &log, POLICY_ALWAYS_CLOUD);
    assert!(
        (other["agreement"].as_f64().unwrap() - 1.0 / 3.0).abs() < 1e-9,
        "{other}"
    );
    assert_eq!(other["candidate_plans"]["cloud:frontier"], 3, "{other}");
    let _ = std::fs::remove_file(&log);
    let _ = std::fs::remove_file(&config);
}
