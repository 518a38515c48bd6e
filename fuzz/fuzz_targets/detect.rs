//! Detection over any text: never panics, and whatever text surrounds it, a
//! card number or an email address on a line of its own is found (text
//! that could hide a value from the scanner is a way out for data).
#![no_main]

use edgeroute_detect::{Detector, Settings};
use libfuzzer_sys::fuzz_target;
use std::sync::LazyLock;

static DETECTOR: LazyLock<Detector> =
    LazyLock::new(|| Detector::new(&Settings::default()).expect("the built-in rules compile"));

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = DETECTOR.scan([text.as_ref()]);
    let around = format!("{text}\ncard 4111 1111 1111 1111\n{text}");
    assert!(
        DETECTOR.scan([around.as_str()]).contains(&"payment-card"),
        "card not found in {around:?}"
    );
    let around = format!("{text}\nmail jane.doe@example.com\n{text}");
    assert!(
        DETECTOR.scan([around.as_str()]).contains(&"email"),
        "email not found in {around:?}"
    );
});
