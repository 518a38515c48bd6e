//! The detector, built once per component rather than per instance. Spin
//! makes a new instance every 128 requests (and for concurrency), and
//! building the detector compiles every rule's regex (tens of
//! milliseconds); so `spin build`
//! runs [`initialize`] once through `edgeroute preinit` (wasmtime's Wizer)
//! and snapshots the memory it leaves: each instance starts with the
//! detector compiled and its search caches warm. Without the snapshot the
//! first call builds it, so the gateway is only slower, never wrong.

use edgeroute_detect::{Detector, Settings};
use std::sync::OnceLock;

static DETECTOR: OnceLock<Result<Detector, String>> = OnceLock::new();

pub fn get() -> Result<&'static Detector, String> {
    DETECTOR
        .get_or_init(|| Detector::new(&Settings::default()))
        .as_ref()
        .map_err(Clone::clone)
}

/// Text touching each family of rules, scanned once so the regexes' lazy
/// automata have their common states built before the snapshot.
const WARM_UP: [&str; 4] = [
    "Hello, what is the weather like in Lyon today? Summarise the notes in one line.",
    "Contact jane.doe@example.com or +44 20 7946 0958; card 4111 1111 1111 1111, IBAN GB82 WEST 1234 5698 7654 32.",
    "Born 1 May 1990 at 12 Main Street, Springfield, IL 62701; SSN 123-45-6789; password=hunter2; key sk-test-0123456789abcdef.",
    "This memo is confidential: salary review and the merger, patient diagnosis, Rue de Rivoli 10, 机密.",
];

/// `wizer-initialize`: run by `edgeroute preinit` at build time. The
/// export stays in the snapshot (Spin never calls it; a second call would
/// find the detector built and only scan again).
pub fn initialize() {
    if let Ok(detector) = get() {
        for text in WARM_UP {
            detector.scan([text]);
        }
        detector.scan(WARM_UP);
    }
}
