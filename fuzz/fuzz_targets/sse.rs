//! The cloud-fetch component's SSE parser (the same source file, compiled
//! natively): never panics, and however the body is cut into pieces, the
//! events are those of the body read at once.
#![no_main]

#[path = "../../components/cloud-fetch/src/sse.rs"]
mod sse;

use libfuzzer_sys::fuzz_target;
use sse::SseEvents;

fuzz_target!(|data: &[u8]| {
    // The first byte picks the cuts: a piece length from 1 to 16.
    let Some((&cut, body)) = data.split_first() else {
        return;
    };
    let mut whole = SseEvents::default();
    let mut expected = whole.push(body);
    expected.extend(whole.finish());

    let step = usize::from(cut % 16) + 1;
    let mut pieces = SseEvents::default();
    let mut got = Vec::new();
    for piece in body.chunks(step) {
        got.extend(pieces.push(piece));
    }
    got.extend(pieces.finish());
    assert_eq!(got, expected, "cut into pieces of {step} bytes");
});
