//! `/v1/embeddings` on the real embedding model, and the prompt embedding
//! a policy gets only when it asks for it.

use crate::EDGEROUTE;
use crate::components::POLICY_FEATURES_ECHO;
use base64::Engine as _;
use edgeroute_testkit::{EMBEDDING_NAME, FakeCloud, Node, Resp};
use serde_json::{Value, json};

fn embed(node: &Node, body: Value, headers: &[(&str, &str)]) -> Resp {
    node.post_json("/v1/embeddings", body, headers)
}

fn vectors(resp: &Resp) -> Vec<Vec<f64>> {
    assert_eq!(resp.status, 200, "{resp:?}");
    resp.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            d["embedding"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        })
        .collect()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[track_caller]
fn assert_error(resp: &Resp, status: u16, code: &str, param: &str) {
    assert_eq!(resp.status, status, "{resp:?}");
    let error = &resp.json()["error"];
    assert_eq!(error["code"], code, "{resp:?}");
    assert_eq!(error["param"], param, "{resp:?}");
}

#[test]
fn embeddings_are_openai_shaped_meaningful_and_never_leave_the_node() {
    let cloud = FakeCloud::start();
    let node = EDGEROUTE.start(&cloud);
    let texts = [
        "The cat sits on the mat",
        "A cat is sitting on a rug",
        "Quarterly revenue grew four percent",
    ];
    let resp = embed(
        &node,
        json!({"model": EMBEDDING_NAME, "input": texts}),
        &[("x-edgeroute-sensitivity", "restricted")],
    );
    let v = vectors(&resp);
    let body = resp.json();
    assert_eq!(body["object"], "list");
    assert_eq!(body["model"], EMBEDDING_NAME);
    assert_eq!(v.len(), 3);
    assert!(
        v.iter().all(|e| e.len() == 384),
        "all-MiniLM-L6-v2 is 384-d"
    );
    for (i, e) in v.iter().enumerate() {
        assert!((dot(e, e) - 1.0).abs() < 1e-4, "unit length");
        assert_eq!(body["data"][i]["index"], i);
    }
    // Similar sentences are close, an unrelated one is not.
    let (similar, unrelated) = (dot(&v[0], &v[1]), dot(&v[0], &v[2]));
    assert!(
        similar > 0.6 && unrelated < 0.2,
        "similar {similar}, unrelated {unrelated}"
    );
    // [CLS] + tokens + [SEP] per input.
    let tokens = body["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!((20..40).contains(&tokens), "{body}");
    assert_eq!(body["usage"]["total_tokens"], tokens);

    // base64 (what the official Python SDK asks for): the same floats.
    let packed = embed(
        &node,
        json!({"model": "auto", "input": texts[0], "encoding_format": "base64"}),
        &[],
    );
    assert_eq!(packed.status, 200, "{packed:?}");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(packed.json()["data"][0]["embedding"].as_str().unwrap())
        .unwrap();
    let floats: Vec<f64> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
        .collect();
    assert_eq!(floats.len(), 384);
    assert!(floats.iter().zip(&v[0]).all(|(a, b)| (a - b).abs() < 1e-6));

    // Bad input: clear errors in the OpenAI envelope, and the node serves on.
    let bad = |body: Value| embed(&node, body, &[]);
    assert_error(
        &bad(json!({"model": "gpt-4o", "input": "x"})),
        404,
        "model_not_found",
        "model",
    );
    assert_error(
        &bad(json!({"model": "auto", "input": [[1, 2, 3]]})),
        400,
        "invalid_request",
        "input",
    );
    assert_error(
        &bad(json!({"model": "auto", "input": []})),
        400,
        "invalid_request",
        "input",
    );
    assert_error(
        &bad(json!({"model": "auto", "input": "word ".repeat(600)})),
        400,
        "invalid_request",
        "input",
    );
    assert_error(
        &bad(json!({"model": "auto", "input": "x", "dimensions": 64})),
        400,
        "invalid_request",
        "dimensions",
    );
    assert_error(
        &bad(json!({"model": "auto", "input": "x", "encoding_format": "hex"})),
        400,
        "invalid_request",
        "encoding_format",
    );
    assert_eq!(
        bad(json!({"model": "auto", "input": "still here"})).status,
        200
    );
    assert!(
        cloud.requests().is_empty(),
        "embeddings never leave the node: {}",
        cloud.describe()
    );
}

#[test]
fn a_node_without_an_embedding_model_says_so() {
    let cloud = FakeCloud::start();
    let node = EDGEROUTE.node(&cloud).embedding(false).start();
    let resp = embed(&node, json!({"model": "auto", "input": "hello"}), &[]);
    assert_error(&resp, 404, "model_not_found", "model");
    assert!(
        resp.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("[local.embedding]"),
        "{resp:?}"
    );
}

/// The `embedding=` value the echo fixture wrote into the reason.
fn echoed_embedding(resp: &Resp) -> String {
    assert_eq!(resp.status, 200, "{resp:?}");
    let reason = resp.reason().unwrap_or_default();
    reason
        .split(';')
        .next()
        .unwrap_or_default()
        .split(' ')
        .find_map(|pair| pair.strip_prefix("embedding="))
        .unwrap_or_else(|| panic!("no embedding= in {reason}"))
        .to_string()
}

#[test]
fn a_policy_gets_the_prompt_embedding_only_when_it_asks() {
    let cloud = FakeCloud::start();
    let question = "What is the capital of Portugal?";
    let chat = json!({
        "model": "auto", "max_tokens": 1,
        "messages": [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Hi."},
            {"role": "user", "content": question}
        ]
    });
    let asking = EDGEROUTE
        .node(&cloud)
        .policy_component(POLICY_FEATURES_ECHO)
        .policy_param("echo_embedding", "true")
        .start();
    // The last user message's embedding, as /v1/embeddings makes it.
    let reference = vectors(&embed(
        &asking,
        json!({"model": "auto", "input": question}),
        &[],
    ));
    let head: Vec<String> = reference[0][..3]
        .iter()
        .map(|x| format!("{x:.4}"))
        .collect();
    let got = echoed_embedding(&asking.post_chat(chat.clone(), &[]));
    assert_eq!(got, format!("384:{}", head.join(",")));
    drop(asking);

    // The same policy without asking, and a node without the model: none.
    let silent = EDGEROUTE
        .node(&cloud)
        .policy_component(POLICY_FEATURES_ECHO)
        .start();
    assert_eq!(
        echoed_embedding(&silent.post_chat(chat.clone(), &[])),
        "none"
    );
    drop(silent);
    let without = EDGEROUTE
        .node(&cloud)
        .embedding(false)
        .policy_component(POLICY_FEATURES_ECHO)
        .policy_param("echo_embedding", "true")
        .start();
    assert_eq!(echoed_embedding(&without.post_chat(chat, &[])), "none");
}

#[test]
fn healthz_says_what_the_active_policy_asked_for() {
    let cloud = FakeCloud::start();
    let threshold = EDGEROUTE.start(&cloud);
    let health = threshold.get("/healthz").json();
    assert_eq!(health["policy_needs"], json!([]), "{health}");
    assert_eq!(health["embedding_model"], EMBEDDING_NAME, "{health}");
    drop(threshold);
    let bandit = EDGEROUTE
        .node(&cloud)
        .policy_component(crate::components::POLICY_BANDIT)
        .start();
    let health = bandit.get("/healthz").json();
    assert_eq!(health["policy_needs"], json!(["embedding"]), "{health}");
}
