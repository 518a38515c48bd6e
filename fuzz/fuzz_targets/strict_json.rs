//! Strict JSON: never panics; what it accepts has no key twice anywhere
//! and survives a round trip (serialised again, it parses to the same
//! value).
#![no_main]

use edgeroute_detect::body::strict_json;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = strict_json(data) else {
        return;
    };
    let again = serde_json::to_vec(&value).expect("a parsed value serialises");
    assert_eq!(
        strict_json(&again).as_ref(),
        Ok(&value),
        "round trip changed the value"
    );
});
