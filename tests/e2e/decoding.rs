//! `stop` and `response_format` on the local model: the text ends before
//! a stop sequence (streamed or not, no part of it sent), and a restricted
//! request asking for JSON gets JSON from the local model (a grammar built
//! from the schema by llama.cpp), where before it could only be refused.

use edgeroute_testkit::{FakeCloud, LOCAL_MODEL};
use serde_json::{Value, json};

use crate::EDGEROUTE;

const RESTRICTED: [(&str, &str); 1] = [("x-edgeroute-sensitivity", "restricted")];

fn ask(extra: Value) -> Value {
    let mut body = json!({
        "model": LOCAL_MODEL,
        "messages": [{"role": "user", "content": "Describe a quiet harbour town in three sentences."}],
        "max_tokens": 40,
        "temperature": 0,
    });
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

#[test]
fn the_local_model_stops_before_a_stop_sequence() {
    let cloud = FakeCloud::start();
    let node = EDGEROUTE.start(&cloud);
    let free = node.post_chat(ask(json!({})), &[]);
    assert_eq!(free.status, 200, "{free:?}");
    let text = free.content().unwrap();
    // A word from the middle of the greedy answer becomes the stop.
    let words: Vec<&str> = text.split_whitespace().collect();
    assert!(words.len() >= 6, "{text}");
    let stop = format!(" {}", words[words.len() / 2]);
    let before = &text[..text.find(&stop).unwrap()];

    let cut = node.post_chat(ask(json!({"stop": [stop, "\u{1F600}"]})), &[]);
    assert_eq!(cut.status, 200, "{cut:?}");
    assert_eq!(cut.content().as_deref(), Some(before), "stop {stop:?}");
    assert_eq!(cut.json()["choices"][0]["finish_reason"], "stop");

    let streamed = node.post_chat(ask(json!({"stop": stop, "stream": true})), &[]);
    let summary = streamed.stream();
    assert_eq!(summary.text, before, "{streamed:?}");
    assert_eq!(summary.finish_reason.as_deref(), Some("stop"));

    // Bad `stop` values are the client's error, in the OpenAI envelope.
    for bad in [json!(5), json!(["a", "b", "c", "d", "e"]), json!([""])] {
        let resp = node.post_chat(ask(json!({"stop": bad})), &[]);
        assert_eq!(resp.status, 400, "{resp:?}");
        assert_eq!(resp.json()["error"]["param"], "stop", "{resp:?}");
    }
    assert!(cloud.chat_requests().is_empty(), "{}", cloud.describe());
}

#[test]
fn a_restricted_request_for_json_gets_json_from_the_local_model() {
    let cloud = FakeCloud::start();
    let node = EDGEROUTE.start(&cloud);
    let object = node.post_chat(
        json!({
            "model": "auto",
            "messages": [{"role": "user", "content": "Return a JSON object with one key, \"answer\", whose value is the capital of France."}],
            "response_format": {"type": "json_object"},
            "max_tokens": 120,
            "temperature": 0,
        }),
        &RESTRICTED,
    );
    assert_eq!(object.status, 200, "{object:?}");
    assert_eq!(object.target(), Some("local:smollm2"), "{object:?}");
    // SmolLM2 tends to nest objects until max_tokens: what it wrote is
    // still JSON from the first character, where unconstrained it answers
    // in prose.
    let content = object.content().unwrap();
    assert!(content.starts_with('{'), "{content}");
    if object.json()["choices"][0]["finish_reason"] == "stop" {
        let parsed: Value =
            serde_json::from_str(&content).unwrap_or_else(|e| panic!("not JSON ({e}): {content}"));
        assert!(parsed.is_object(), "{content}");
    }

    // A schema with two required fields and nothing else: the grammar
    // closes the object, so the answer is complete JSON of that shape.
    let schema = json!({
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "population": {"type": "integer"},
        },
        "required": ["city", "population"],
        "additionalProperties": false,
    });
    let typed = node.post_chat(
        json!({
            "model": "auto",
            "messages": [{"role": "user", "content": "Which city is the capital of France, and how many people live there?"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": schema}},
            "max_tokens": 120,
            "temperature": 0,
        }),
        &RESTRICTED,
    );
    assert_eq!(typed.status, 200, "{typed:?}");
    assert_eq!(typed.target(), Some("local:smollm2"), "{typed:?}");
    assert_eq!(typed.json()["choices"][0]["finish_reason"], "stop");
    let content = typed.content().unwrap();
    let parsed: Value =
        serde_json::from_str(&content).unwrap_or_else(|e| panic!("not JSON ({e}): {content}"));
    assert!(parsed["city"].is_string(), "{content}");
    assert!(parsed["population"].is_i64(), "{content}");
    assert_eq!(parsed.as_object().unwrap().len(), 2, "{content}");

    // A format the node does not know is refused, not ignored.
    let resp = node.post_chat(
        json!({
            "model": "auto",
            "messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "xml"},
        }),
        &RESTRICTED,
    );
    assert_eq!(resp.status, 400, "{resp:?}");
    assert_eq!(resp.json()["error"]["param"], "response_format");
    assert!(cloud.chat_requests().is_empty(), "{}", cloud.describe());
}
