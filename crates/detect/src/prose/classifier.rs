//! The prose classifier at run time: the weights `build.rs` trained
//! (`train`), and a text scored window by window so that one confidential
//! paragraph in a long prompt is not averaged away by the rest.

use super::features::{self, BUCKETS};
use super::train::{scale, sigmoid};

/// The bias, then a weight per bucket: little-endian f32, read in place
/// (nothing to decode at start, one copy in memory).
static MODEL: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/prose-model.bin"));

fn weight(bucket: usize) -> f32 {
    let at = 4 + 4 * bucket;
    f32::from_le_bytes([MODEL[at], MODEL[at + 1], MODEL[at + 2], MODEL[at + 3]])
}

fn bias() -> f32 {
    f32::from_le_bytes([MODEL[0], MODEL[1], MODEL[2], MODEL[3]])
}

/// Units (words, or CJK characters) a window spans: about the length of a
/// training example, which is what the weights were fitted on.
const WINDOW: usize = 64;
/// Windows overlap by half, so a passage at a window's edge is whole in
/// the next one.
const STEP: usize = WINDOW / 2;

/// The probability that the most confidential-looking window of `text` (a
/// normalised text) is confidential prose.
pub fn probability(text: &str) -> f32 {
    const _: () = assert!(MODEL_LEN == 4 * (BUCKETS + 1));
    let mut units = Vec::new();
    features::for_each_unit(text, |buckets| {
        let sum = buckets.iter().map(|&b| weight(b as usize)).sum::<f32>();
        units.push((sum, buckets.len() as u32));
    });
    sigmoid(best_logit(&units, bias()))
}

/// The highest log-odds of any window over `units` (summed weights and
/// feature counts), under `bias`.
pub fn best_logit(units: &[(f32, u32)], bias: f32) -> f32 {
    if units.is_empty() {
        return f32::NEG_INFINITY;
    }
    // Running sums: a window's score is two subtractions.
    let mut sums = Vec::with_capacity(units.len() + 1);
    sums.push((0.0_f32, 0_u64));
    for &(s, n) in units {
        let (ts, tn) = sums[sums.len() - 1];
        sums.push((ts + s, tn + u64::from(n)));
    }
    let score = |from: usize, to: usize| {
        let (s, n) = (sums[to].0 - sums[from].0, sums[to].1 - sums[from].1);
        bias + s * scale(n as usize)
    };
    let n = units.len();
    let mut best = score(0, n.min(WINDOW));
    let mut from = STEP;
    while from + WINDOW < n + STEP {
        let to = (from + WINDOW).min(n);
        best = best.max(score(to.saturating_sub(WINDOW), to));
        from += STEP;
    }
    best
}

const MODEL_LEN: usize = include_bytes!(concat!(env!("OUT_DIR"), "/prose-model.bin")).len();
