//! The node's request parser (`edgeroute_request::parse`): never panics,
//! and what it accepts is what the pipeline relies on — at least one
//! message, no NUL in any text (llama.cpp takes C strings), `max_tokens`
//! within the cap, sampling in range, edgeroute's `metadata` not in the
//! body an upstream receives, and offered tools described in a first
//! system message with a grammar that has exactly one root. A local answer
//! read as a tool call has arguments that are JSON.
#![no_main]

use edgeroute_request::{parse, tools};
use libfuzzer_sys::fuzz_target;

const CAP: u32 = 1024;

/// Stands in for llama.cpp's converter (not linked here): some schemas
/// convert, some do not, so both paths are taken.
fn to_grammar(schema: &str) -> Result<String, String> {
    if schema.len() % 3 == 0 {
        return Err("unsupported".into());
    }
    Ok(format!("root ::= root-kv\nroot-kv ::= {schema:?}\n"))
}

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data)
        && let Some(message) = tools::call_message(text, "call_1")
    {
        let arguments = message["tool_calls"][0]["function"]["arguments"]
            .as_str()
            .expect("arguments are a string");
        serde_json::from_str::<serde_json::Value>(arguments).expect("arguments are JSON");
    }
    let Ok(prepared) = parse(data, CAP, "id".into(), 0, &to_grammar) else {
        return;
    };
    assert!(!prepared.messages.is_empty());
    assert!(
        prepared
            .messages
            .iter()
            .all(|(_, text)| !text.contains('\0'))
    );
    assert!((1..=CAP).contains(&prepared.max_tokens));
    assert!((0.0..=2.0).contains(&prepared.temperature));
    assert!(prepared.top_p > 0.0 && prepared.top_p <= 1.0);
    assert!(!prepared.passthrough.contains_key("metadata"));
    if let Some(offered) = &prepared.tools {
        let (role, text) = &prepared.messages[0];
        assert_eq!(role, "system");
        assert!(text.contains("<tools>"));
        if let Ok(grammar) = offered.grammar(&to_grammar) {
            // Rules begin lines (literals hold no raw newline).
            let roots = grammar.lines().filter(|l| l.starts_with("root ::="));
            assert_eq!(roots.count(), 1, "{grammar}");
        }
    }
});
