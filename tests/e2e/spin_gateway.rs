//! The routing itself as a Spin application: the root `spin.toml` built by
//! the real `spin build` and run by the real `spin up`, its gateway
//! component placing each request with the node's code and the node's
//! policy file, beside a node and a recording cloud. Without a Spin CLI the
//! tests say so and stop (see `spin.rs` for where the CLI comes from).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use edgeroute_testkit::{
    CLOUD_REPLY, FakeCloud, LOCAL_MODEL, Node, REPO_ROOT, Resp, UPSTREAM, UPSTREAM_MODEL,
    post_json, post_raw_to, unique,
};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::EDGEROUTE;
use crate::components::POLICY_CLOUD_V2;
use crate::spin::{SpinApp, long_prompt, spin_or_skip};

/// The node's client key for the gateway: a tenant confined to `local`.
const GATEWAY_TENANT: &str = "[tenants.gateway]\nkeys_env = \"GATEWAY_KEYS\"\ntargets = [\"local\"]\negress_reports = true\n\
                              [tenants.direct]\nkeys_env = \"DIRECT_KEYS\"\n";

/// `spin build` of the root application, once per test run, into the
/// shared target folder's `wasm-components` (the node's own guest build
/// folder, not locked while the tests run): the policy comes out byte for
/// byte as the node embeds it.
fn build_root(spin: &Path) {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let target = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .parent()
            .expect("CARGO_TARGET_TMPDIR is <target>/tmp");
        let out = Command::new(spin)
            .args(["build", "-f", &format!("{REPO_ROOT}/spin.toml")])
            .env("CARGO_TARGET_DIR", target)
            .env("EDGEROUTE", env!("CARGO_BIN_EXE_edgeroute"))
            .output()
            .expect("run spin build");
        assert!(
            out.status.success(),
            "spin build failed\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    });
}

/// The Spin CLI with the root application built, or None (and a printed
/// reason) where Spin cannot run.
fn spin_built(test: &str) -> Option<PathBuf> {
    let spin = spin_or_skip(test)?;
    build_root(&spin);
    Some(spin)
}

fn root(path: &str) -> PathBuf {
    Path::new(REPO_ROOT).join(path)
}

/// The node's policy id: the first 6 bytes of the file's sha256.
fn policy_id(file: &Path) -> String {
    let bytes = std::fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    Sha256::digest(bytes)
        .iter()
        .take(6)
        .map(|b| format!("{b:02x}"))
        .collect()
}

struct Keys {
    gateway: String,
    direct: String,
}

fn node(cloud: &FakeCloud, policy: Option<&str>) -> (Node, Keys) {
    let keys = Keys {
        gateway: unique("gateway-key"),
        direct: unique("direct-key"),
    };
    let mut builder = EDGEROUTE
        .node(cloud)
        .env("GATEWAY_KEYS", &keys.gateway)
        .env("DIRECT_KEYS", &keys.direct)
        .config_extra(GATEWAY_TENANT);
    if let Some(policy) = policy {
        builder = builder.policy_component(policy);
    }
    (builder.start(), keys)
}

/// The TCP_NODELAY shim `spin build` builds (scripts/spin-nodelay.c).
fn nodelay_shim() -> PathBuf {
    let shim = root("target-wasm/spin-nodelay.so");
    assert!(
        shim.is_file(),
        "spin build did not build {}",
        shim.display()
    );
    shim
}

/// Whether a socket accepted by a process started with `preload` has
/// Nagle's algorithm off: Python accepts a connection from itself and
/// reports the accepted socket's TCP_NODELAY.
fn accepted_with_nodelay(preload: Option<&Path>) -> bool {
    const ACCEPT: &str = "import socket\n\
        l = socket.socket(); l.bind(('127.0.0.1', 0)); l.listen(1)\n\
        c = socket.create_connection(l.getsockname())\n\
        a, _ = l.accept()\n\
        print(a.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))\n";
    let mut python = Command::new("python3");
    python.args(["-c", ACCEPT]);
    match preload {
        Some(shim) => python.env("LD_PRELOAD", shim),
        None => python.env_remove("LD_PRELOAD"),
    };
    let out = python.output().expect("run python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    match String::from_utf8_lossy(&out.stdout).trim() {
        "0" => false,
        "1" => true,
        other => panic!("python3 reported TCP_NODELAY {other:?}"),
    }
}

/// Spin 4.0.2 leaves Nagle's algorithm on for the connections it accepts,
/// so a streamed answer's second write waited for the client's delayed
/// acknowledgement: 40 ms at the end of every answer the gateway streams
/// (`edgeroute bench --spin-gateway`). `./dev spin` (and every gateway in
/// these tests) runs Spin with the shim preloaded; this checks the shim
/// itself does what it is for, and nothing without it does.
#[test]
fn the_nodelay_shim_turns_nagle_off_for_accepted_connections() {
    // The shim is built by `spin build`.
    if spin_built("the_nodelay_shim_turns_nagle_off_for_accepted_connections").is_none() {
        return;
    }
    assert!(!accepted_with_nodelay(None), "Nagle is on by default");
    assert!(accepted_with_nodelay(Some(&nodelay_shim())));
}

/// The root app under `spin up` (a manifest, normally the root spin.toml)
/// with the node, the cloud and the key as its variables and the flags of
/// `runtime-config/spin-up.args`.
fn gateway(
    spin: &Path,
    manifest: &Path,
    node: &Node,
    keys: &Keys,
    cloud: &FakeCloud,
    (upstream_url, upstream_key): (&str, &str),
    variables: &[(&'static str, String)],
) -> SpinApp {
    let origin = cloud.url().trim_end_matches("/v1").to_string();
    let mut env = vec![
        ("SPIN_VARIABLE_NODE_URL", node.url()),
        ("SPIN_VARIABLE_NODE_KEY", keys.gateway.clone()),
        ("SPIN_VARIABLE_UPSTREAM_URL", upstream_url.to_string()),
        ("SPIN_VARIABLE_UPSTREAM_ORIGIN", origin),
        ("SPIN_VARIABLE_UPSTREAM_MODEL", UPSTREAM_MODEL.to_string()),
        ("SPIN_VARIABLE_UPSTREAM_KEY", upstream_key.to_string()),
    ];
    env.extend(variables.iter().cloned());
    // Run as `./dev spin` runs it, so the flags and the preloaded
    // TCP_NODELAY shim are known to work.
    env.push(("LD_PRELOAD", nodelay_shim().display().to_string()));
    let flags = std::fs::read_to_string(root("runtime-config/spin-up.args")).unwrap();
    SpinApp::launch(
        spin,
        manifest,
        &std::fs::read_to_string(root("runtime-config/spin-runtime-config.toml")).unwrap(),
        &env,
        &flags
            .lines()
            .filter(|line| !line.trim_start().starts_with('#'))
            .flat_map(str::split_whitespace)
            .collect::<Vec<_>>(),
    )
}

/// How a request says it is restricted: a name, the body, the headers.
type Case<'a> = (&'a str, Value, Vec<(&'a str, &'a str)>);

/// The policy's cascade for every prompt, escalating below `min_confidence`.
fn cascade_everywhere(min_confidence: &str) -> (&'static str, String) {
    (
        "SPIN_VARIABLE_POLICY_PARAMS",
        format!(
            "local_model={LOCAL_MODEL},cloud_upstream={UPSTREAM},local_max_prompt_tokens=100000,\
             cascade_from_tokens=1,cascade_min_confidence={min_confidence}"
        ),
    )
}

/// The node's test policy parameters (testkit's NodeBuilder).
fn node_params() -> (&'static str, String) {
    (
        "SPIN_VARIABLE_POLICY_PARAMS",
        format!("local_model={LOCAL_MODEL},cloud_upstream={UPSTREAM},local_max_prompt_tokens=64"),
    )
}

fn chat(app: &SpinApp, body: &Value, headers: &[(&str, &str)]) -> Resp {
    post_json(&format!("{}/v1/chat/completions", app.url()), body, headers)
}

/// The first line of the node's audit log that `wanted` picks, within 10 s
/// (the gateway reports after answering; the log is written every 50 ms).
#[track_caller]
fn wait_for_audit(node: &Node, wanted: impl Fn(&Value) -> bool) -> Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(node.audit_log()).unwrap_or_default();
        let found = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|line| wanted(line));
        if let Some(line) = found {
            return line;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no such audit line:\n{text}\n--- node ---\n{}",
            node.logs()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn ask(prompt: &str) -> Value {
    json!({"model": "auto", "max_tokens": 8, "temperature": 0,
           "messages": [{"role": "user", "content": prompt}]})
}

#[test]
fn the_spin_gateway_places_requests_with_the_nodes_policy_file_and_guard() {
    let Some(spin) =
        spin_built("the_spin_gateway_places_requests_with_the_nodes_policy_file_and_guard")
    else {
        return;
    };
    let cloud = FakeCloud::start();
    let (node, keys) = node(&cloud, None);

    // The Spin app plugs in the very file the node runs: the node's
    // policy id is the dependency's content hash.
    let health = node.get("/healthz").json();
    assert_eq!(
        health["policy"].as_str(),
        Some(policy_id(&root("target-wasm/policy_default.wasm")).as_str()),
        "{health}"
    );
    let manifest = std::fs::read_to_string(root("spin.toml")).unwrap();
    assert!(
        manifest.contains(
            r#""edgeroute:routing/router@0.2.0" = { path = "target-wasm/policy_default.wasm" }"#
        ),
        "spin.toml's policy dependency moved; this test reads it there"
    );
    assert!(!manifest.contains(&keys.gateway));

    let secret = unique("sk-spin-secret");
    // The root app against this node and cloud; the variables vary.
    let upstream = format!("{}/chat/completions", cloud.url());
    let launch = |variables: &[(&'static str, String)]| {
        gateway(
            &spin,
            &root("spin.toml"),
            &node,
            &keys,
            &cloud,
            (&upstream, &secret),
            variables,
        )
    };
    let app = launch(&[
        node_params(),
        (
            "SPIN_VARIABLE_DETECT_PATTERNS",
            r#"[{"kind":"employee-id","regex":"\\bEMP-\\d{6}\\b"}]"#.to_string(),
        ),
    ]);
    let direct = format!("Bearer {}", keys.direct);

    // A short prompt: local on the node, as the node itself places it.
    let short = ask("Name a colour.");
    let answer = chat(&app, &short, &[]);
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.target(), Some("local:smollm2"), "{answer:?}");
    assert_ne!(answer.content().as_deref(), Some(CLOUD_REPLY), "{answer:?}");
    assert_eq!(
        node.post_chat(short, &[("authorization", &direct)])
            .target(),
        answer.target()
    );
    // The answer says where the gateway's time went, the hop included.
    assert_eq!(
        answer.server_timing_steps(),
        [
            "settings", "read", "parse", "detect", "policy", "guard", "local", "body"
        ],
        "{answer:?}"
    );

    // A public long prompt: the cloud, with the secret key added, the
    // upstream's model, and nothing of edgeroute's labels.
    let before = cloud.chat_requests().len();
    let canary = unique("gateway-public");
    let mut body = ask(&long_prompt(&canary));
    body["metadata"] = json!({"task": "gateway-test-task"});
    let answer = chat(&app, &body, &[]);
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.target(), Some("cloud:frontier"), "{answer:?}");
    assert_eq!(answer.content().as_deref(), Some(CLOUD_REPLY), "{answer:?}");
    let steps = answer.server_timing_steps();
    assert!(
        steps.contains(&"cloud") && !steps.contains(&"local"),
        "{answer:?}"
    );
    cloud.assert_received(&canary, 1);
    let sent = cloud.requests_mentioning(&canary).remove(0);
    assert_eq!(
        sent.header("authorization"),
        Some(format!("Bearer {secret}").as_str())
    );
    assert_eq!(sent.body["model"], UPSTREAM_MODEL);
    assert!(!sent.mentions("gateway-test-task"), "{}", sent.body_text);
    assert!(!sent.mentions(&keys.gateway), "the node's key left");
    assert_eq!(
        cloud.chat_requests().len(),
        before + 1,
        "something else left"
    );
    assert_eq!(
        node.post_chat(body.clone(), &[("authorization", &direct)])
            .target(),
        Some("cloud:frontier"),
        "the node places it the same way"
    );

    // The gateway reported its cloud call to the node (after answering):
    // a line in the node's egress audit log, marked as the gateway's, and
    // a cloud request in the gateway tenant's ledger. Never the text.
    let reported = wait_for_audit(&node, |line| line["via"] == "gateway");
    assert_eq!(reported["target"], "cloud:frontier", "{reported}");
    assert_eq!(reported["event"], "egress", "{reported}");
    assert_eq!(reported["sensitivity"], "public", "{reported}");
    assert_eq!(reported["ok"], true, "{reported}");
    let origin = cloud.url().trim_end_matches("/v1").to_string();
    assert_eq!(
        Some(reported["host"].as_str().unwrap()),
        origin.strip_prefix("http://"),
        "{reported}"
    );
    assert!(reported["request_id"].as_str().unwrap().starts_with("gw-"));
    assert_eq!(
        reported["bytes_sent"].as_u64(),
        Some(sent.body_text.len() as u64)
    );
    assert!(!reported.to_string().contains(&canary), "{reported}");
    let gateway_key = format!("Bearer {}", keys.gateway);
    let ledger = node
        .get_with("/ledger", &[("authorization", &gateway_key)])
        .json();
    let cloud_requests: u64 = ledger["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["tenant"] == "gateway")
        .map(|b| b["cloud"]["requests"].as_u64().unwrap())
        .sum();
    assert_eq!(cloud_requests, 1, "{ledger}");
    let metrics = node.get("/metrics").body_text;
    let reported: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("edgeroute_requests_total{") && l.contains("reason=\"reported\""))
        .collect();
    assert_eq!(reported.len(), 1, "{metrics}");
    assert!(
        reported[0].contains("placement=\"cloud\"") && reported[0].ends_with(" 1"),
        "{reported:?}"
    );
    // Only a tenant allowed to report may: the direct client is refused.
    let forged = json!({"request_id": "forged-1", "target": "cloud:frontier",
        "policy": "p", "reason": "r", "sensitivity": "public", "prompt_tokens": 1,
        "completion_tokens": 1, "bytes_sent": 1, "ok": true, "latency_ms": 1.0});
    let refused = node.post_json(
        "/v1/gateway/egress",
        forged.clone(),
        &[("authorization", &direct)],
    );
    assert_eq!(refused.status, 403, "{refused:?}");
    // And a report must name a cloud target.
    let mut local = forged;
    local["target"] = json!("local:smollm2");
    let refused = node.post_json(
        "/v1/gateway/egress",
        local,
        &[("authorization", &gateway_key)],
    );
    assert_eq!(refused.status, 400, "{refused:?}");
    assert_eq!(refused.json()["error"]["param"], "target", "{refused:?}");

    // Streamed, it streams through from the upstream.
    let mut streamed = ask(&long_prompt(&unique("gateway-stream")));
    streamed["stream"] = json!(true);
    let answer = chat(&app, &streamed, &[]);
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.stream().text, CLOUD_REPLY, "{answer:?}");

    // Restricted, however it is said, the same long prompt stays local:
    // declared in a header (a duplicated one included), in metadata, or
    // found by detection; the policy would have sent it to the cloud.
    let cases: [Case; 4] = [
        (
            "header",
            ask(&long_prompt("{c}")),
            vec![("x-edgeroute-sensitivity", "restricted")],
        ),
        (
            "second header",
            ask(&long_prompt("{c}")),
            vec![
                ("x-edgeroute-sensitivity", "public"),
                ("x-edgeroute-sensitivity", "restricted"),
            ],
        ),
        (
            "metadata",
            {
                let mut b = ask(&long_prompt("{c}"));
                b["metadata"] = json!({"sensitivity": "restricted"});
                b
            },
            vec![],
        ),
        (
            "detected",
            ask(&format!("{} Card 4111 1111 1111 1111.", long_prompt("{c}"))),
            vec![],
        ),
    ];
    for (how, body, headers) in cases {
        let canary = unique(&format!("gateway-restricted-{}", how.replace(' ', "-")));
        let body: Value = serde_json::from_str(&body.to_string().replace("{c}", &canary)).unwrap();
        let answer = chat(&app, &body, &headers);
        assert_eq!(answer.status, 200, "{how}: {answer:?}");
        assert_eq!(answer.target(), Some("local:smollm2"), "{how}: {answer:?}");
        assert!(
            answer.reason().is_some_and(|r| r.contains("restricted")),
            "{how}: {answer:?}"
        );
        cloud.assert_received(&canary, 0);
    }

    // The operator's own pattern (the detect_patterns variable, as the
    // node's [guard] patterns) keeps an otherwise public prompt local.
    let canary = unique("gateway-operator-pattern");
    let answer = chat(
        &app,
        &ask(&format!("{} Ticket EMP-123456.", long_prompt(&canary))),
        &[],
    );
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.target(), Some("local:smollm2"), "{answer:?}");
    assert!(
        answer.reason().is_some_and(|r| r.contains("employee-id")),
        "{answer:?}"
    );
    cloud.assert_received(&canary, 0);

    // Bad input: the OpenAI envelope, nothing sent anywhere.
    let before = cloud.requests().len();
    let answer = post_json(
        &format!("{}/v1/chat/completions", app.url()),
        &json!({"messages": []}),
        &[],
    );
    assert_eq!(answer.status, 400, "{answer:?}");
    assert_eq!(answer.json()["error"]["type"], "invalid_request_error");
    assert_eq!(cloud.requests().len(), before);
    // A key twice in one object (a client merging objects): refused, not
    // judged by one copy; nothing reaches the cloud.
    let canary = unique("gateway-duplicate-key");
    let doubled = format!(
        r#"{{"model":"auto","metadata":{{"sensitivity":"restricted","sensitivity":"public"}},"messages":[{{"role":"user","content":"{}"}}]}}"#,
        long_prompt(&canary)
    );
    let answer = post_raw_to(
        app.url(),
        "/v1/chat/completions",
        doubled.as_bytes(),
        "application/json",
    );
    assert_eq!(answer.status, 400, "{answer:?}");
    assert!(answer.body_text.contains("appears twice"), "{answer:?}");
    cloud.assert_received(&canary, 0);
    // Over the gateway's 1 MiB: refused as it streams in, not held whole.
    let huge = ask(&"x".repeat((1 << 20) + 1)).to_string();
    let answer = post_raw_to(
        app.url(),
        "/v1/chat/completions",
        huge.as_bytes(),
        "application/json",
    );
    assert_eq!(answer.status, 413, "{answer:?}");
    assert_eq!(answer.json()["error"]["type"], "invalid_request_error");
    assert_eq!(cloud.requests().len(), before);
    drop(app);

    // The cascade for every prompt, with a bar no answer clears: the node
    // answers locally with its confidence, the gateway escalates a public
    // request through the guard, and keeps a restricted one's local answer.
    let app = launch(&[cascade_everywhere("1")]);
    let canary = unique("gateway-cascade");
    let answer = chat(&app, &ask(&format!("Name a colour. {canary}")), &[]);
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.target(), Some("cloud:frontier"), "{answer:?}");
    assert!(
        answer
            .reason()
            .is_some_and(|r| r.contains("escalated: confidence")),
        "{answer:?}"
    );
    cloud.assert_received(&canary, 1);
    // Streamed: judged on the node's first tokens (it declines below the
    // bar), then the cloud's stream.
    let canary = unique("gateway-cascade-stream");
    let mut streamed = ask(&format!("Name a colour. {canary}"));
    streamed["stream"] = json!(true);
    let answer = chat(&app, &streamed, &[]);
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.target(), Some("cloud:frontier"), "{answer:?}");
    assert!(
        answer
            .reason()
            .is_some_and(|r| r.contains("escalated: confidence")),
        "{answer:?}"
    );
    assert_eq!(answer.stream().text, CLOUD_REPLY, "{answer:?}");
    cloud.assert_received(&canary, 1);

    let canary = unique("gateway-cascade-restricted");
    let mut body = ask(&format!("Name a colour. {canary}"));
    let restricted = [("x-edgeroute-sensitivity", "restricted")];
    let answer = chat(&app, &body, &restricted);
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.target(), Some("local:smollm2"), "{answer:?}");
    assert!(
        answer.header("x-edgeroute-confidence").is_some(),
        "the local answer's confidence is shown: {answer:?}"
    );
    // Streamed, a restricted request has no second hop to judge for: the
    // node streams it (the same greedy text).
    body["stream"] = json!(true);
    let events = chat(&app, &body, &restricted);
    assert_eq!(events.target(), Some("local:smollm2"), "{events:?}");
    assert_eq!(Some(events.stream().text), answer.content(), "{events:?}");
    cloud.assert_received(&canary, 0);

    // Tools, as the node places them: public ones to the cloud (the
    // node's default `[local] tool_calls = "kept"`), restricted ones to the
    // node's tool-call grammar; a body the node would refuse is refused
    // here with the node's message, sent nowhere.
    let tools = json!([{"type": "function", "function": {"name": "get_time"}}]);
    let canary = unique("gateway-tools");
    let mut with_tools = ask(&format!("What time is it? {canary}"));
    with_tools["tools"] = tools;
    with_tools["tool_choice"] = json!("required");
    let answer = chat(&app, &with_tools, &[]);
    assert_eq!(answer.target(), Some("cloud:frontier"), "{answer:?}");
    assert!(
        answer
            .reason()
            .is_some_and(|r| r.contains("cannot serve tool calls for a request that may leave")),
        "{answer:?}"
    );
    cloud.assert_received(&canary, 1);
    with_tools["max_tokens"] = json!(32);
    let answer = chat(&app, &with_tools, &restricted);
    assert_eq!(answer.target(), Some("local:smollm2"), "{answer:?}");
    assert_eq!(
        answer.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
        "get_time",
        "{answer:?}"
    );
    let mut custom = ask(&format!("Grep it. {canary}"));
    custom["tools"] = json!([{"type": "custom", "custom": {"name": "grep"}}]);
    let refused = chat(&app, &custom, &restricted);
    assert_eq!(refused.status, 400, "{refused:?}");
    assert_eq!(refused.json()["error"]["code"], "unsupported_locally");
    let mut hot = ask(&format!("Name a colour. {canary}"));
    hot["temperature"] = json!(3);
    let refused = chat(&app, &hot, &[]);
    assert_eq!(refused.status, 400, "{refused:?}");
    assert!(
        refused
            .body_text
            .contains("'temperature' must be between 0 and 2"),
        "{refused:?}"
    );
    cloud.assert_received(&canary, 1);
    drop(app);

    // A bar every answer clears (0 would turn the cascade off): a public
    // streamed request is judged on the node's first tokens and kept: it
    // streams from the node token by token (not one piece after the whole
    // answer), the same greedy text as unstreamed, with its confidence,
    // finish reason and usage.
    let app = launch(&[cascade_everywhere("0.001")]);
    let canary = unique("gateway-cascade-kept");
    let mut body = ask(&format!("List ten colours, one per line. {canary}"));
    body["max_tokens"] = json!(40);
    let whole = chat(&app, &body, &[]);
    assert_eq!(whole.target(), Some("local:smollm2"), "{whole:?}");
    // Longer than the node holds back to judge (16 tokens), so a stream
    // from the node has text after the judged part.
    assert!(
        whole.json()["usage"]["completion_tokens"].as_u64() > Some(16),
        "{whole:?}"
    );
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let events = chat(&app, &body, &[]);
    assert_eq!(events.status, 200, "{events:?}");
    assert_eq!(events.target(), Some("local:smollm2"), "{events:?}");
    assert_eq!(
        events.header("content-type"),
        Some("text/event-stream"),
        "{events:?}"
    );
    assert!(
        events.header("x-edgeroute-confidence").is_some(),
        "{events:?}"
    );
    let stream = events.stream();
    assert_eq!(Some(stream.text.clone()), whole.content(), "{events:?}");
    assert!(stream.content_chunks > 1, "{events:?}");
    assert!(stream.done_last && stream.errors.is_empty(), "{events:?}");
    assert!(stream.finish_reason.is_some(), "{events:?}");
    assert_eq!(
        stream
            .usage
            .as_ref()
            .map(|u| u["completion_tokens"].clone()),
        Some(whole.json()["usage"]["completion_tokens"].clone()),
        "{events:?}"
    );
    cloud.assert_received(&canary, 0);
}

/// The application with `policy` plugged in by scripts/spin-policy.sh, in
/// `dir`: the manifest copied with its files named absolutely and the
/// dependency swapped. Its path, and what the script said.
fn with_policy(dir: &Path, policy: &Path) -> (PathBuf, String) {
    let plugged = dir.join("policy.wasm");
    let out = Command::new("bash")
        .arg(root("scripts/spin-policy.sh"))
        .args([policy, plugged.as_path()])
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "spin-policy.sh: {said}");
    let manifest = dir.join("spin.toml");
    let text = std::fs::read_to_string(root("spin.toml"))
        .unwrap()
        .replace(
            "target-wasm/policy_default.wasm",
            &plugged.display().to_string(),
        )
        .replace(
            "target-wasm/spin_gateway.wasm",
            &root("target-wasm/spin_gateway.wasm").display().to_string(),
        );
    std::fs::write(&manifest, text).unwrap();
    (manifest, said)
}

/// The reference ports on the 0.2 world plug into the gateway as the Rust
/// policies do. The C one imports no `host`, so it goes in unchanged; the
/// Python and JavaScript ones log through `host`, so a host component is
/// composed in. None knows the cascade, so where the default policy would
/// escalate every answer (a threshold no confidence reaches) each keeps a
/// short prompt local, with its own reason.
#[test]
fn the_spin_gateway_runs_the_reference_ports() {
    let Some(spin) = spin_built("the_spin_gateway_runs_the_reference_ports") else {
        return;
    };
    let cloud = FakeCloud::start();
    let (node, keys) = node(&cloud, None);
    for (language, plugged) in [
        ("c", "copied unchanged"),
        ("python", "composed in"),
        ("js", "composed in"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let port = crate::policy_languages::component(language);
        let (manifest, said) = with_policy(dir.path(), &port);
        assert!(said.contains(plugged), "{language}: {said}");
        let app = gateway(
            &spin,
            &manifest,
            &node,
            &keys,
            &cloud,
            (&format!("{}/chat/completions", cloud.url()), "sk-spin"),
            &[cascade_everywhere("1.01")],
        );
        let canary = unique(&format!("gateway-{language}-port"));
        let answer = chat(&app, &ask(&format!("Name a colour. {canary}")), &[]);
        assert_eq!(answer.status, 200, "{language}: {answer:?}");
        assert_eq!(
            answer.target(),
            Some("local:smollm2"),
            "{language}: {answer:?}"
        );
        let reason = answer.reason().unwrap_or_default();
        assert!(
            reason.contains("short prompt (") && reason.contains(" <= 100000 tokens): local"),
            "{language}: {answer:?}"
        );
        cloud.assert_received(&canary, 0);
    }
}

#[test]
fn the_spin_gateway_reaches_only_allowed_hosts_and_follows_a_swapped_policy() {
    let Some(spin) =
        spin_built("the_spin_gateway_reaches_only_allowed_hosts_and_follows_a_swapped_policy")
    else {
        return;
    };
    let cloud = FakeCloud::start();
    let elsewhere = FakeCloud::start();

    // The same application with another policy file. This policy imports
    // `host` (it logs): scripts/spin-policy.sh composes a host component
    // into it, since Spin gives a dependency none.
    let dir = tempfile::tempdir().unwrap();
    let (manifest, said) = with_policy(dir.path(), Path::new(POLICY_CLOUD_V2));
    assert!(said.contains("composed in"), "{said}");
    let imports = said.lines().last().unwrap_or_default();
    assert!(
        imports.contains("it imports:") && !imports.contains("edgeroute:routing/host"),
        "{said}"
    );
    let (node, keys) = node(&cloud, Some(POLICY_CLOUD_V2));
    assert_eq!(
        node.get("/healthz").json()["policy"].as_str(),
        Some(policy_id(Path::new(POLICY_CLOUD_V2)).as_str())
    );

    // An upstream URL outside allowed_outbound_hosts (the origin is the
    // first cloud's): Spin refuses it, and nothing reaches either cloud.
    let app = gateway(
        &spin,
        &manifest,
        &node,
        &keys,
        &cloud,
        (
            &format!("{}/chat/completions", elsewhere.url()),
            "sk-unused",
        ),
        &[node_params()],
    );
    let canary = unique("gateway-elsewhere");
    let answer = chat(&app, &ask(&format!("Name a colour. {canary}")), &[]);
    assert_eq!(answer.status, 502, "{answer:?}");
    assert!(
        answer.json()["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("allowed_outbound_hosts")),
        "{answer:?}"
    );
    assert!(elsewhere.requests().is_empty());
    cloud.assert_received(&canary, 0);
    drop(app);

    // With the allowed upstream, the swapped policy sends even a short
    // prompt to the cloud, as it does on the node; restricted still stays.
    let app = gateway(
        &spin,
        &manifest,
        &node,
        &keys,
        &cloud,
        (&format!("{}/chat/completions", cloud.url()), "sk-spin"),
        &[node_params()],
    );
    let canary = unique("gateway-swapped");
    let short = ask(&format!("Name a colour. {canary}"));
    let answer = chat(&app, &short, &[]);
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.target(), Some("cloud:frontier"), "{answer:?}");
    cloud.assert_received(&canary, 1);
    let on_node = node.post_chat(
        short,
        &[("authorization", &format!("Bearer {}", keys.direct))],
    );
    assert_eq!(on_node.target(), answer.target(), "{on_node:?}");
    // The policy's log line, through the composed-in host component.
    let logged = app.stderr();
    assert!(
        logged.contains("[policy] info: fixture: gw-") && logged.contains("to the cloud"),
        "the gateway's stderr: {logged}"
    );
    let canary = unique("gateway-swapped-restricted");
    let answer = chat(
        &app,
        &ask(&format!("Name a colour. {canary}")),
        &[("x-edgeroute-sensitivity", "restricted")],
    );
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.target(), Some("local:smollm2"), "{answer:?}");
    cloud.assert_received(&canary, 0);
}
