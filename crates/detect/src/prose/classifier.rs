//! The prose classifier at run time: the weights `build.rs` trained
//! (`train`), and a text scored window by window (`features::windows`) so
//! that one confidential passage in a long prompt is not averaged away by
//! the rest. A stream: whatever the text's size, only the last window's
//! units are kept.

use super::features::{self, BUCKETS, STEP, WINDOWS};
use super::train::{scale, sigmoid};

/// The bias, then a weight per bucket: little-endian f32, read in place
/// (nothing to decode at start, one copy in memory). The type checks the
/// size `build.rs` wrote.
static MODEL: &[u8; 4 * (BUCKETS + 1)] =
    include_bytes!(concat!(env!("OUT_DIR"), "/prose-model.bin"));

fn weight(bucket: usize) -> f32 {
    let at = 4 + 4 * bucket;
    f32::from_le_bytes([MODEL[at], MODEL[at + 1], MODEL[at + 2], MODEL[at + 3]])
}

fn bias() -> f32 {
    f32::from_le_bytes([MODEL[0], MODEL[1], MODEL[2], MODEL[3]])
}

/// The probability that the most confidential-looking window of `text` (a
/// normalised text) is confidential prose.
pub fn probability(text: &str) -> f32 {
    sigmoid(best_logit(text, bias(), weight))
}

/// The longest window: the units kept.
const LONGEST: usize = WINDOWS[WINDOWS.len() - 1];

/// The highest log-odds of any window of `text` under a model's `bias`
/// and `weight`s (the built one, or one a test trained).
pub fn best_logit(text: &str, bias: f32, weight: impl Fn(usize) -> f32) -> f32 {
    // Each of the last LONGEST units' summed weights and feature count.
    let mut ring = [(0.0_f32, 0_u32); LONGEST];
    let mut seen = 0_usize;
    let mut best = f32::NEG_INFINITY;
    let score = |ring: &[(f32, u32); LONGEST], seen: usize, size: usize| {
        let (mut sum, mut count) = (0.0_f64, 0_usize);
        for back in 1..=size.min(seen) {
            let (s, n) = ring[(seen - back) % LONGEST];
            sum += f64::from(s);
            count += n as usize;
        }
        bias + sum as f32 * scale(count)
    };
    features::for_each_unit(text, |buckets| {
        let sum = buckets.iter().map(|&b| weight(b as usize)).sum::<f32>();
        ring[seen % LONGEST] = (sum, buckets.len() as u32);
        seen += 1;
        if seen.is_multiple_of(STEP) {
            for size in WINDOWS.into_iter().filter(|&size| seen >= size) {
                best = best.max(score(&ring, seen, size));
            }
        }
    });
    if seen > 0 {
        // The windows ending at the text's end (or all of a short text)
        // that the stream has not scored.
        for size in WINDOWS {
            if !seen.is_multiple_of(STEP) || seen < size {
                best = best.max(score(&ring, seen, size));
            }
        }
    }
    best
}
