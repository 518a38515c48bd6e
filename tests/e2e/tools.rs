//! OpenAI compatibility on both paths: a tool-call round trip with the
//! official `openai` client through the recording cloud, every field the
//! node does not interpret forwarded unchanged; the same round trip on the
//! local model's tool-call grammar for restricted data (nothing sent); and
//! a request only an upstream can serve refused (never sent) when it may
//! not leave.

use std::process::Command;

use edgeroute_testkit::{FAKE_RATE_LIMIT, FAKE_TOOL_CALL_ID, FakeCloud, UPSTREAM_MODEL};
use serde_json::{Value, json};

use crate::EDGEROUTE;

const OPENAI_TOOLS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/openai_tools.py");

#[test]
fn a_tool_call_round_trip_with_the_openai_client_reaches_the_cloud_unchanged() {
    let cloud = FakeCloud::start();
    let node = EDGEROUTE.start(&cloud);
    let stdout = run_openai_tools(&node, &[]);
    // A public request offering tools goes to the cloud: the default
    // policy already sends it there for the prompt the tools' description
    // makes (176 tokens), and the local model would not take it anyway.
    let call: Value = serde_json::from_str(stdout.lines().next().unwrap()).unwrap();
    assert_eq!(call["target"], "cloud:frontier", "{stdout}");
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

fn run_openai_tools(node: &edgeroute_testkit::Node, extra: &[&str]) -> String {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let output = Command::new(&python)
        .arg(OPENAI_TOOLS)
        .args(extra)
        .arg(format!("{}/v1", node.url()))
        .env("NO_PROXY", "127.0.0.1,localhost")
        .output()
        .unwrap_or_else(|e| {
            panic!("run {python} {OPENAI_TOOLS}: {e} (pip install -r tests/requirements.txt)")
        });
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{OPENAI_TOOLS} failed\n{stdout}\n{stderr}\n--- node ---\n{}",
        node.logs()
    );
    stdout
}

#[test]
fn restricted_tool_calls_are_served_by_the_local_grammar_and_nothing_leaves() {
    let cloud = FakeCloud::start();
    // A length threshold above the tools' description: the policy places
    // these requests locally, so `[local] tool_calls` decides.
    let node = EDGEROUTE.node(&cloud).local_max_prompt_tokens(2000).start();
    // The official client's round trip, every request restricted: the call,
    // the answer after the tool's result, the call streamed.
    let stdout = run_openai_tools(&node, &["--local"]);
    let call: Value = serde_json::from_str(stdout.lines().next().unwrap()).unwrap();
    assert!(
        call["target"].as_str().unwrap().starts_with("local:"),
        "{stdout}"
    );
    assert_eq!(call["finish_reason"], "tool_calls", "{stdout}");
    assert!(cloud.chat_requests().is_empty(), "{}", cloud.describe());

    // `tool_choice` naming a function: the call is to that one, whatever
    // the prompt says; its arguments follow the schema (an integer id).
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather",
         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "lookup_patient",
         "parameters": {"type": "object", "properties": {"id": {"type": "integer"}},
                        "required": ["id"], "additionalProperties": false}}},
    ]);
    let body = |stream: bool| {
        json!({
            "model": "auto",
            "messages": [{"role": "user", "content": "Open the file of patient 4471"}],
            "tools": tools,
            "tool_choice": {"type": "function", "function": {"name": "lookup_patient"}},
            "max_tokens": 48,
            "stream": stream,
            "metadata": {"sensitivity": "restricted"},
        })
    };
    let resp = node.post_chat(body(false), &[]);
    assert_eq!(resp.status, 200, "{resp:?}");
    let choice = &resp.json()["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{resp:?}");
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "lookup_patient", "{resp:?}");
    assert!(
        call["id"].as_str().unwrap().starts_with("call_"),
        "{resp:?}"
    );
    let arguments: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert!(arguments["id"].is_i64(), "{arguments}");
    assert_eq!(arguments.as_object().unwrap().len(), 1, "{arguments}");

    // Streamed: one delta carries the whole call, with its index.
    let streamed = node.post_chat(body(true), &[]);
    assert_eq!(streamed.status, 200, "{streamed:?}");
    let chunks: Vec<Value> = streamed
        .body_text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let delta = chunks
        .iter()
        .find_map(|c| c.pointer("/choices/0/delta/tool_calls/0"))
        .unwrap_or_else(|| panic!("no tool-call delta: {streamed:?}"));
    assert_eq!(delta["index"], 0);
    assert_eq!(delta["function"]["name"], "lookup_patient");
    assert!(
        chunks
            .iter()
            .any(|c| c.pointer("/choices/0/finish_reason") == Some(&json!("tool_calls"))),
        "{streamed:?}"
    );
    assert!(cloud.chat_requests().is_empty(), "{}", cloud.describe());

    // The same request public: by default (`kept`) an upstream serves it.
    let mut public = body(false);
    public.as_object_mut().unwrap().remove("metadata");
    let resp = node.post_chat(public, &[]);
    assert_eq!(resp.target(), Some("cloud:frontier"), "{resp:?}");
    assert!(
        resp.reason()
            .unwrap()
            .contains("cannot serve tool calls for a request that may leave"),
        "{resp:?}"
    );
    assert_eq!(cloud.chat_requests().len(), 1, "{}", cloud.describe());
}

#[test]
fn tool_calls_always_serves_public_requests_locally_and_never_refuses_restricted_ones() {
    let cloud = FakeCloud::start();
    let body = |sensitivity: &str| {
        json!({
            "model": "auto",
            "messages": [{"role": "user", "content": "What time is it?"}],
            "tools": [{"type": "function", "function": {"name": "get_time"}}],
            "tool_choice": "required",
            "max_tokens": 32,
            "metadata": {"sensitivity": sensitivity},
        })
    };
    // No cascade either: the local answer is the answer.
    let always = EDGEROUTE
        .node(&cloud)
        .local_max_prompt_tokens(2000)
        .policy_param("cascade_from_tokens", "2000")
        .local_str("tool_calls", "always")
        .start();
    let resp = always.post_chat(body("public"), &[]);
    assert_eq!(resp.status, 200, "{resp:?}");
    assert!(resp.target().unwrap().starts_with("local:"), "{resp:?}");
    let calls = resp.json()["choices"][0]["message"]["tool_calls"].clone();
    assert_eq!(calls.as_array().unwrap().len(), 1, "{resp:?}");
    assert_eq!(calls[0]["function"]["name"], "get_time", "{resp:?}");

    // Asked for parallel calls, the grammar lets the model write more than
    // one (greedy SmolLM2 repeats its call until max_tokens): every whole
    // call comes back with its own id, the one cut short is dropped.
    let mut parallel = body("public");
    parallel["parallel_tool_calls"] = json!(true);
    parallel["max_tokens"] = json!(64);
    let resp = always.post_chat(parallel, &[]);
    assert_eq!(resp.status, 200, "{resp:?}");
    let choice = &resp.json()["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{resp:?}");
    let calls = choice["message"]["tool_calls"].as_array().unwrap().clone();
    assert!(calls.len() >= 2, "{resp:?}");
    let ids: std::collections::HashSet<&str> =
        calls.iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), calls.len(), "{resp:?}");
    assert!(
        calls.iter().all(|c| c["function"]["name"] == "get_time"),
        "{resp:?}"
    );
    drop(always);
    let never = EDGEROUTE
        .node(&cloud)
        .local_max_prompt_tokens(2000)
        .local_str("tool_calls", "never")
        .start();
    let refused = never.post_chat(body("restricted"), &[]);
    assert_eq!(refused.status, 400, "{refused:?}");
    assert_eq!(refused.json()["error"]["code"], "unsupported_locally");
    assert!(cloud.chat_requests().is_empty(), "{}", cloud.describe());
}

#[test]
fn a_request_only_an_upstream_can_serve_is_refused_when_it_may_not_leave() {
    let cloud = FakeCloud::start();
    let node = EDGEROUTE.start(&cloud);
    let tools = json!([{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]);
    // Tools beside a response format have no local grammar (nor does a
    // tool of another type): restricted, such a request is sent nowhere.
    for (tools, extra) in [
        (tools.clone(), json!({"type": "json_object"})),
        (
            json!([{"type": "custom", "custom": {"name": "grep"}}]),
            json!(null),
        ),
    ] {
        for stream in [false, true] {
            let refused = node.post_chat(
                json!({
                    "model": "auto",
                    "messages": [{"role": "user", "content": "Find the record"}],
                    "tools": tools,
                    "response_format": extra,
                    "stream": stream,
                    "metadata": {"sensitivity": "restricted"},
                }),
                &[],
            );
            assert_eq!(refused.status, 400, "{refused:?}");
            assert_eq!(
                refused.json()["error"]["code"],
                "unsupported_locally",
                "{refused:?}"
            );
        }
    }
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
    assert!(
        resp.reason()
            .unwrap()
            .contains("tools together with a response_format"),
        "{resp:?}"
    );
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
