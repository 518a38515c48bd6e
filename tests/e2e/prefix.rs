//! Prefix reuse end to end: an agent's next call continues from the cached
//! state of its previous one (reported in `x-edgeroute-cached-tokens`, the
//! reason and the policy's `cached-prefix-tokens`), gives the same text as
//! a cold run, and a public request never reuses a restricted request's
//! cache.

use edgeroute_testkit::{FakeCloud, Node, Resp};
use serde_json::{Value, json};

use crate::EDGEROUTE;
use crate::components::POLICY_FEATURES_ECHO;

const SYSTEM: &str = "You are a planning agent. Tools: search(query), calc(expr), \
                      weather(city). Answer in one short line.";

fn call(messages: &[Value]) -> Value {
    json!({"model": "auto", "messages": messages, "max_tokens": 12, "temperature": 0})
}

fn first_turn() -> Vec<Value> {
    vec![
        json!({"role": "system", "content": SYSTEM}),
        json!({"role": "user", "content": "Plan a picnic in Paris for six people."}),
    ]
}

/// The conversation after the first answer and a tool result.
fn second_turn(answer: &str) -> Vec<Value> {
    let mut messages = first_turn();
    messages.push(json!({"role": "assistant", "content": answer}));
    messages.push(
        json!({"role": "user", "content": "Tool result: weather(Paris) = sunny, 24C. Continue."}),
    );
    messages
}

#[track_caller]
fn local_answer(resp: &Resp) -> String {
    assert_eq!(resp.status, 200, "{resp:?}");
    resp.content()
        .unwrap_or_else(|| panic!("no content\n{resp:?}"))
}

fn cached(resp: &Resp) -> u32 {
    resp.header("x-edgeroute-cached-tokens")
        .map_or(0, |n| n.parse().unwrap())
}

/// What the echo policy saw as `cached-prefix-tokens`.
fn policy_saw(resp: &Resp) -> u32 {
    let reason = resp.reason().unwrap_or_default();
    let value = reason
        .split(' ')
        .find_map(|pair| pair.strip_prefix("cached="))
        .unwrap_or_else(|| panic!("no cached= in {reason}"));
    value.parse().unwrap()
}

fn echo_node(cloud: &FakeCloud) -> Node {
    EDGEROUTE
        .node(cloud)
        .policy_component(POLICY_FEATURES_ECHO)
        .start()
}

#[test]
fn an_agents_next_call_reuses_its_prefix_and_says_the_same() {
    let cloud = FakeCloud::start();
    let node = echo_node(&cloud);

    // Cold: the second turn as the first request this node sees.
    let answer = local_answer(&node.post_chat(call(&first_turn()), &[]));
    let restart = echo_node(&cloud);
    let cold = restart.post_chat(call(&second_turn(&answer)), &[]);
    assert_eq!(cached(&cold), 0, "{cold:?}");
    assert_eq!(policy_saw(&cold), 0, "{cold:?}");
    let cold_text = local_answer(&cold);
    drop(restart);

    // Warm: the same second turn after the first, on the first node.
    let warm = node.post_chat(call(&second_turn(&answer)), &[]);
    let reused = cached(&warm);
    let prompt = warm.json()["usage"]["prompt_tokens"].as_u64().unwrap() as u32;
    assert!(
        reused > 20 && reused < prompt,
        "reused {reused} of {prompt}\n{warm:?}"
    );
    assert_eq!(
        policy_saw(&warm),
        reused,
        "the policy saw what the run reused\n{warm:?}"
    );
    assert!(
        warm.reason()
            .unwrap_or_default()
            .contains(&format!("{reused} prompt tokens from the prefix cache")),
        "{warm:?}"
    );
    assert_eq!(
        local_answer(&warm),
        cold_text,
        "a prefix hit must not change the text"
    );
    // The answer can reach the client a step before the scheduler files
    // its sequence as idle: wait for that, within 10 s.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut health = node.get("/healthz").json();
    while health["local_prefix_cache"]["smollm2"].as_u64() < Some(1)
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(20));
        health = node.get("/healthz").json();
    }
    assert!(
        health["local_prefix_cache"]["smollm2"].as_u64() >= Some(1),
        "{health}"
    );
}

#[test]
fn a_public_request_never_reuses_a_restricted_prefix() {
    let cloud = FakeCloud::start();
    let node = echo_node(&cloud);
    let restricted = [("x-edgeroute-sensitivity", "restricted")];
    let public = [("x-edgeroute-sensitivity", "public")];

    let first = node.post_chat(call(&first_turn()), &restricted);
    local_answer(&first);
    // The only cached state is restricted: nothing for a public request.
    let resp = node.post_chat(call(&first_turn()), &public);
    local_answer(&resp);
    assert_eq!((cached(&resp), policy_saw(&resp)), (0, 0), "{resp:?}");
    // Control: the public request's own state is reused by the next one,
    // and a restricted request may reuse a public prefix.
    let again = node.post_chat(call(&first_turn()), &public);
    assert!(cached(&again) > 20, "{again:?}");
    let up = node.post_chat(call(&first_turn()), &restricted);
    assert!(cached(&up) > 20, "{up:?}");
}
