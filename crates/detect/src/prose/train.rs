//! Training the prose classifier: logistic regression over the hashed
//! features, by AdaGrad with a little L2, in a fixed order — the same
//! examples give the same weights, bit for bit, on any machine. `build.rs`
//! runs it on `crates/detect/prose-train/` at compile time (the weights are
//! never a file in the repository that could drift from the data), and
//! the cross-validation test runs it on parts of the same data.
//!
//! Why not a crate (linfa-logistic, smartcore): they pull in ndarray and a
//! solver for what is thirty lines, in a build script that must stay fast.

// In the library only `sigmoid` runs; the rest is for `build.rs` and tests.
#![cfg_attr(not(test), allow(dead_code))]

use super::features::{BUCKETS, Features};

/// One labelled text's features, as (bucket, value) with each unit of the
/// text counted once per feature.
pub struct Example {
    pub features: Vec<(u32, f32)>,
    pub confidential: bool,
}

impl Example {
    pub fn new(features: &Features, confidential: bool) -> Self {
        Self {
            features: scaled(&features.buckets),
            confidential,
        }
    }
}

/// The values a model reads for these buckets: each [`scale`]d.
pub fn scaled(buckets: &[u32]) -> Vec<(u32, f32)> {
    let value = scale(buckets.len());
    buckets.iter().map(|&b| (b, value)).collect()
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
    let positives = examples.iter().filter(|e| e.confidential).count().max(1);
    let positive_weight = (examples.len() - positives) as f32 / positives as f32;
    let mut order: Vec<usize> = (0..examples.len()).collect();
    let mut seed = 0x9E37_79B9_7F4A_7C15_u64;
    for _ in 0..EPOCHS {
        shuffle(&mut order, &mut seed);
        for &i in &order {
            let example = &examples[i];
            let p = sigmoid(model.logit(&example.features));
            let error = if example.confidential {
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
