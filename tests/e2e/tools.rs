//! OpenAI compatibility on the cloud path: a tool-call round trip with the
//! official `openai` client through the recording cloud, every field the
//! node does not interpret forwarded unchanged, and a request only an
//! upstream can serve refused (never sent) when it may not leave.

use std::process::Command;

use edgeroute_testkit::{FAKE_RATE_LIMIT, FAKE_TOOL_CALL_ID, FakeCloud, UPSTREAM_MODEL};
use serde_json::{Value, json};

use crate::EDGEROUTE;

const OPENAI_TOOLS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/openai_tools.py");

#[test]
fn a_tool_call_round_trip_with_the_openai_client_reaches_the_cloud_unchanged() {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let cloud = FakeCloud::start();
    let node = EDGEROUTE.start(&cloud);
    let output = Command::new(&python)
        .arg(OPENAI_TOOLS)
        .arg(format!("{}/v1", node.url()))
        .env("NO_PROXY", "127.0.0.1,localhost")
        .output()
        .unwrap_or_else(|e| {
            panic!("run {python} {OPENAI_TOOLS}: {e} (pip install -r tests/requirements.txt)")
        });
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{OPENAI_TOOLS} failed\n{stdout}\n{stderr}\n--- node ---\n{}",
        node.logs()
    );
    // A short prompt would run locally; tools put it in the cloud, and the
    // reason says why.
    let call: Value = serde_json::from_str(stdout.lines().next().unwrap()).unwrap();
    assert_eq!(call["target"], "cloud:frontier", "{stdout}");
    assert!(
        call["reason"]
            .as_str()
            .unwrap()
            .contains("cannot serve tool calls"),
        "{stdout}"
    );
    assert_eq!(call["tool_calls"][0]["id"], FAKE_TOOL_CALL_ID, "{stdout}");

    let sent = cloud.chat_requests();
    assert_eq!(sent.len(), 3, "{}", cloud.describe());
    assert_eq!(sent[2].body["stream"], true);
    assert_eq!(sent[2].body["tools"], sent[0].body["tools"]);
    let (first, second) = (&sent[0].body, &sent[1].body);
    // The client's fields as it sent them, with the upstream's model name.
    assert_eq!(first["model"], UPSTREAM_MODEL);
    assert_eq!(first["tools"][0]["function"]["name"], "get_weather");
    assert_eq!(
        first["tools"][0]["function"]["parameters"]["required"],
        json!(["city"])
    );
    assert_eq!(first["tool_choice"], "auto");
    assert_eq!(first["x_custom_field"], json!({"kept": true}));
    // The agent's second turn carries the call and its result.
    let messages = second["messages"].as_array().unwrap();
    assert_eq!(
        messages[1]["tool_calls"][0]["id"], FAKE_TOOL_CALL_ID,
        "{second}"
    );
    assert_eq!(messages[2]["role"], "tool");
    assert_eq!(messages[2]["tool_call_id"], FAKE_TOOL_CALL_ID);
}

#[test]
fn a_request_only_an_upstream_can_serve_is_refused_when_it_may_not_leave() {
    let cloud = FakeCloud::start();
    let node = EDGEROUTE.start(&cloud);
    let tools = json!([{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]);
    let body = |stream: bool| {
        json!({
            "model": "auto",
            "messages": [{"role": "user", "content": "Find the record"}],
            "tools": tools,
            "stream": stream,
            "metadata": {"sensitivity": "restricted"},
        })
    };
    let refused = node.post_chat(body(false), &[]);
    assert_eq!(refused.status, 400, "{refused:?}");
    assert_eq!(
        refused.json()["error"]["code"],
        "unsupported_locally",
        "{refused:?}"
    );
    let streamed = node.post_chat(body(true), &[]);
    assert_eq!(streamed.status, 400, "{streamed:?}");
    assert_eq!(
        streamed.json()["error"]["code"],
        "unsupported_locally",
        "{streamed:?}"
    );
    assert!(cloud.chat_requests().is_empty(), "{}", cloud.describe());

    // A public request offering tools goes to the cloud, with the fields
    // the node does not know and without edgeroute's metadata.
    let resp = node.post_chat(
        json!({
            "model": "auto",
            "messages": [{"role": "user", "content": "hi"}],
            "tools": tools,
            "response_format": {"type": "json_object"},
            "logit_bias": {"50256": -100},
            "metadata": {"task": "greeting"},
        }),
        &[],
    );
    assert_eq!(resp.status, 200, "{resp:?}");
    assert_eq!(resp.target(), Some("cloud:frontier"), "{resp:?}");
    assert!(resp.reason().unwrap().contains("tool calls"), "{resp:?}");
    let sent = &cloud.chat_requests()[0].body;
    assert_eq!(
        sent["response_format"],
        json!({"type": "json_object"}),
        "{sent}"
    );
    assert_eq!(sent["logit_bias"], json!({"50256": -100}), "{sent}");
    assert!(sent.get("metadata").is_none(), "{sent}");
}

#[test]
fn an_upstream_429_reaches_the_client_with_its_retry_after_and_costs_nothing() {
    let cloud = FakeCloud::start();
    let node = EDGEROUTE.start(&cloud);
    // Only the cloud can serve tools: the upstream's 429 is the answer.
    let resp = node.post_chat(
        json!({
            "model": "auto",
            "messages": [{"role": "user", "content": format!("Look it up. {FAKE_RATE_LIMIT}")}],
            "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}],
        }),
        &[],
    );
    assert_eq!(resp.status, 429, "{resp:?}");
    assert_eq!(
        resp.json()["error"]["code"],
        "rate_limit_exceeded",
        "{resp:?}"
    );
    assert_eq!(resp.header("retry-after"), Some("7"), "{resp:?}");
    // A public prompt the local model can take is served there instead.
    let long = format!(
        "{FAKE_RATE_LIMIT}. Summarise: {}",
        ["the ferry timetable changed twice this winter and the harbour office posted new notices";
            5]
            .join("; ")
    );
    let resp = node.post_chat(
        json!({"model": "auto", "messages": [{"role": "user", "content": long}], "max_tokens": 8}),
        &[],
    );
    assert_eq!(resp.status, 200, "{resp:?}");
    assert_eq!(resp.target(), Some("local:smollm2"), "{resp:?}");
    assert!(resp.reason().unwrap().contains("cloud failed"), "{resp:?}");
    // Both reached the upstream once, and neither was charged.
    assert_eq!(
        cloud.requests_mentioning(FAKE_RATE_LIMIT).len(),
        2,
        "{}",
        cloud.describe()
    );
    let ledger = node.get("/ledger").json();
    assert_eq!(ledger["totals"]["cloud_cost_usd"], 0.0, "{ledger}");
}

#[test]
fn upstream_connections_are_pooled_and_reused() {
    let cloud = FakeCloud::start();
    let node = EDGEROUTE.start(&cloud);
    // Requests only the cloud serves, one after another.
    for i in 0..20 {
        let resp = node.post_chat(
            json!({
                "model": "auto",
                "messages": [{"role": "user", "content": format!("Request {i}: look it up.")}],
                "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}],
            }),
            &[],
        );
        assert_eq!(resp.status, 200, "{resp:?}");
    }
    assert_eq!(cloud.chat_requests().len(), 20);
    // One connection, kept alive between calls (a new one per request
    // before the pool).
    assert_eq!(cloud.connections(), 1, "connections opened for 20 calls");
}
