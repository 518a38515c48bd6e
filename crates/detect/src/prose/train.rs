//! Training the prose classifier: logistic regression over the hashed
//! features, by AdaGrad with L2, in a fixed order — the same examples give
//! the same weights (bit for bit where `f32::exp` rounds the same: one
//! platform's maths library). `build.rs`
//! runs it on `crates/detect/prose-train/` at compile time (the weights are
//! never a file in the repository that could drift from the data), and
//! the cross-validation test runs it on parts of the same data.
//!
//! Why not a crate (linfa-logistic, smartcore): they pull in ndarray and a
//! solver for what is thirty lines, in a build script that must stay fast.

// In the library only `sigmoid` runs; the rest is for `build.rs` and tests.
#![cfg_attr(not(test), allow(dead_code))]

use super::features::{BUCKETS, Features, windows};

/// One window of a labelled text: each distinct bucket once, with its
/// value (how often it occurs, [`scale`]d), and what the example counts
/// for in training.
pub struct Example {
    pub features: Vec<(u32, f32)>,
    pub confidential: bool,
    pub weight: f32,
}

impl Example {
    fn of(buckets: &[u32], confidential: bool, weight: f32) -> Self {
        let value = scale(buckets.len());
        let mut sorted = buckets.to_vec();
        sorted.sort_unstable();
        let mut features: Vec<(u32, f32)> = Vec::with_capacity(sorted.len());
        for b in sorted {
            match features.last_mut() {
                Some((last, v)) if *last == b => *v += value,
                _ => features.push((b, value)),
            }
        }
        Self {
            features,
            confidential,
            weight,
        }
    }
}

/// What a labelled text teaches, read as the classifier reads it: the
/// score of a text is its best window's. A confidential text is one
/// example, whole (its confidential part may sit in any one window); a
/// clean text is every window the classifier would score, together
/// counting as one text — no window of it may look confidential.
pub fn examples(features: &Features, confidential: bool) -> Vec<Example> {
    let all = windows(features.units());
    if confidential || all.len() <= 1 {
        return vec![Example::of(&features.buckets, confidential, 1.0)];
    }
    let weight = 1.0 / all.len() as f32;
    all.into_iter()
        .map(|(from, to)| {
            let start = if from == 0 {
                0
            } else {
                features.ends[from - 1]
            };
            let end = features.ends[to - 1];
            Example::of(&features.buckets[start..end], false, weight)
        })
        .collect()
}

/// What each of `n` features counts for: 1/√n, so a text's feature vector
/// has unit length whatever its size (a long note and a one-line request
/// weigh alike) — but never more than a text of [`MIN_FEATURES`] gives,
/// so two or three words cannot carry a verdict on their own (their few
/// weights are mostly noise).
pub fn scale(n: usize) -> f32 {
    1.0 / (n.max(MIN_FEATURES) as f32).sqrt()
}

pub const MIN_FEATURES: usize = 60;

/// A trained model: a weight per bucket and a bias.
pub struct Model {
    pub weights: Vec<f32>,
    pub bias: f32,
}

impl Model {
    /// The log-odds that `features` are confidential.
    pub fn logit(&self, features: &[(u32, f32)]) -> f32 {
        self.bias
            + features
                .iter()
                .map(|&(b, v)| self.weights[b as usize] * v)
                .sum::<f32>()
    }
}

const EPOCHS: usize = 24;
const LEARNING_RATE: f32 = 0.5;
const L2: f32 = 1e-3;

pub fn train(examples: &[Example]) -> Model {
    let mut model = Model {
        weights: vec![0.0; BUCKETS],
        bias: 0.0,
    };
    let mut squares = vec![1e-6_f32; BUCKETS];
    let mut bias_squares = 1e-6_f32;
    // The classes weigh alike however many texts each has (more clean
    // texts than confidential ones are written): a probability of 0.5
    // means as much evidence either way.
    let class = |confidential: bool| -> f32 {
        examples
            .iter()
            .filter(|e| e.confidential == confidential)
            .map(|e| e.weight)
            .sum()
    };
    let (positives, negatives) = (class(true), class(false));
    assert!(
        positives > 0.0 && negatives > 0.0,
        "training needs confidential and clean texts"
    );
    let positive_weight = negatives / positives;
    let mut order: Vec<usize> = (0..examples.len()).collect();
    let mut seed = 0x9E37_79B9_7F4A_7C15_u64;
    for _ in 0..EPOCHS {
        shuffle(&mut order, &mut seed);
        for &i in &order {
            let example = &examples[i];
            let p = sigmoid(model.logit(&example.features));
            let error = example.weight
                * if example.confidential {
                    (p - 1.0) * positive_weight
                } else {
                    p
                };
            for &(b, v) in &example.features {
                let b = b as usize;
                let g = error * v + L2 * model.weights[b];
                squares[b] += g * g;
                model.weights[b] -= LEARNING_RATE * g / squares[b].sqrt();
            }
            bias_squares += error * error;
            model.bias -= LEARNING_RATE * error / bias_squares.sqrt();
        }
    }
    model
}

pub fn sigmoid(z: f32) -> f32 {
    1.0 / (1.0 + (-z).exp())
}

/// Fisher–Yates with xorshift64: a fixed order without a `rand` build
/// dependency.
fn shuffle(order: &mut [usize], seed: &mut u64) {
    for i in (1..order.len()).rev() {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        order.swap(i, (*seed % (i as u64 + 1)) as usize);
    }
}

/// The texts and labels of a training file: one JSON object per line with
/// `text` and `label` (`confidential` or `clean`); other fields (language,
/// topic) are for people reading it.
pub fn read(jsonl: &str) -> Result<Vec<(String, bool)>, String> {
    jsonl
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(n, line)| {
            let v: serde_json::Value =
                serde_json::from_str(line).map_err(|e| format!("line {}: {e}", n + 1))?;
            let text = v["text"]
                .as_str()
                .ok_or(format!("line {}: no text", n + 1))?;
            let confidential = match v["label"].as_str() {
                Some("confidential") => true,
                Some("clean") => false,
                other => return Err(format!("line {}: label {other:?}", n + 1)),
            };
            Ok((text.to_string(), confidential))
        })
        .collect()
}
