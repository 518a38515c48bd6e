//! Sensitivity collection over any body and header values: never panics,
//! and the guard's promises hold whatever else the request says. A
//! request that says `restricted` anywhere (a header value among others,
//! or `metadata.sensitivity`) is restricted; so is one carrying a card
//! number in a message. A body the node and the gateway refuse before
//! collecting (messages that are not chat messages, metadata that is not
//! an object) is skipped: it goes nowhere.
#![no_main]

use edgeroute_core::{Sensitivity, SensitivitySet};
use edgeroute_detect::body::{ChatMessage, strict_json};
use edgeroute_detect::{Detector, Settings, collect};
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value};
use std::sync::LazyLock;

static DETECTOR: LazyLock<Detector> =
    LazyLock::new(|| Detector::new(&Settings::default()).expect("the built-in rules compile"));

/// The request's level, or None when it would be refused as invalid.
fn level(body: &Map<String, Value>, headers: &[Option<String>]) -> Option<Sensitivity> {
    let parsed: Vec<ChatMessage> = serde_json::from_value(body.get("messages")?.clone()).ok()?;
    let messages = parsed
        .iter()
        .map(|m| Some((m.role.clone(), m.text().ok()?)))
        .collect::<Option<Vec<_>>>()?;
    let metadata = match body.get("metadata") {
        Some(Value::Object(m)) => m.clone(),
        None | Some(Value::Null) => Map::new(),
        Some(_) => return None,
    };
    let mut rest = body.clone();
    rest.remove("metadata");
    let mut set = SensitivitySet::new();
    collect::declared(&mut set, headers, &metadata);
    collect::detected(
        &mut set,
        &DETECTOR,
        messages.iter().map(|(_, t)| t.as_str()),
        &metadata,
        &rest,
        |text| DETECTOR.alone(text),
    );
    Some(set.level())
}

fuzz_target!(|data: &[u8]| {
    // The first line: header values separated by '|'; the rest: the body.
    let (head, body) = match data.iter().position(|&b| b == b'\n') {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (&data[..0], data),
    };
    let headers: Vec<Option<String>> = head
        .split(|&b| b == b'|')
        .filter(|h| !h.is_empty())
        .map(|h| std::str::from_utf8(h).ok().map(str::to_owned))
        .collect();
    let Ok(Value::Object(body)) = strict_json(body) else {
        return;
    };
    if level(&body, &headers).is_none() {
        return;
    }

    let mut declared = headers.clone();
    declared.push(Some("restricted".into()));
    assert_eq!(
        level(&body, &declared),
        Some(Sensitivity::Restricted),
        "a restricted header was outvoted"
    );

    let mut labelled = body.clone();
    let mut metadata = match labelled.get("metadata") {
        Some(Value::Object(m)) => m.clone(),
        _ => Map::new(),
    };
    metadata.insert("sensitivity".into(), "restricted".into());
    labelled.insert("metadata".into(), Value::Object(metadata));
    assert_eq!(
        level(&labelled, &headers),
        Some(Sensitivity::Restricted),
        "restricted metadata was outvoted"
    );

    let mut carded = body.clone();
    let card = serde_json::json!({"role": "user", "content": "card 4111 1111 1111 1111 exp 12/29"});
    if let Some(Value::Array(messages)) = carded.get_mut("messages") {
        messages.push(card);
    }
    assert_eq!(
        level(&carded, &headers),
        Some(Sensitivity::Restricted),
        "a card number was not found"
    );
});
