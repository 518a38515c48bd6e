//! How sure the local model was of its answer, from the log-probability of
//! each token it produced. The summary grows token by token, so a streaming
//! cascade can judge the first tokens while the rest are still coming.
//!
//! The score is the geometric mean of the tokens' probabilities,
//! `exp(mean log p)`, between 0 and 1: one very unsure token lowers it less
//! than the minimum does, and a long confident answer is not punished for
//! its length the way a product of probabilities would be.

/// How many first tokens `first_k_mean` covers.
pub const FIRST_K: u32 = 8;

#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Confidence {
    tokens: u32,
    sum: f64,
    min: f32,
    first_k_sum: f64,
}

impl Confidence {
    /// Count one more token with log-probability `logprob` (≤ 0).
    pub fn add(&mut self, logprob: f32) {
        // A NaN from a broken model must not pass for confidence.
        let logprob = if logprob.is_nan() {
            f32::NEG_INFINITY
        } else {
            logprob.min(0.0)
        };
        self.min = if self.tokens == 0 {
            logprob
        } else {
            self.min.min(logprob)
        };
        if self.tokens < FIRST_K {
            self.first_k_sum += logprob as f64;
        }
        self.tokens += 1;
        self.sum += logprob as f64;
    }

    pub fn tokens(&self) -> u32 {
        self.tokens
    }

    pub fn mean_logprob(&self) -> Option<f32> {
        (self.tokens > 0).then(|| (self.sum / self.tokens as f64) as f32)
    }

    pub fn min_logprob(&self) -> Option<f32> {
        (self.tokens > 0).then_some(self.min)
    }

    /// Mean log-probability of the first [`FIRST_K`] tokens.
    pub fn first_k_mean(&self) -> Option<f32> {
        let n = self.tokens.min(FIRST_K);
        (n > 0).then(|| (self.first_k_sum / n as f64) as f32)
    }

    /// The geometric-mean token probability, 0 to 1; None before any token.
    pub fn score(&self) -> Option<f32> {
        self.mean_logprob().map(|m| m.exp().clamp(0.0, 1.0))
    }
}

/// The log-probability of `token` under the distribution `logits` give
/// (a log-softmax at one index), computed stably: subtract the maximum
/// before exponentiating so large logits cannot overflow.
pub fn logprob(logits: &[f32], token: usize) -> f32 {
    let Some(&chosen) = logits.get(token) else {
        return f32::NEG_INFINITY;
    };
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return f32::NEG_INFINITY;
    }
    let sum: f32 = logits.iter().map(|&l| (l - max).exp()).sum();
    chosen - max - sum.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprob_is_a_log_softmax() {
        // Two equal logits: each has probability 1/2.
        assert!((logprob(&[3.0, 3.0], 0) - 0.5f32.ln()).abs() < 1e-6);
        // Shifting every logit changes nothing; huge ones do not overflow.
        let a = logprob(&[1.0, 2.0, 3.0], 2);
        let b = logprob(&[1001.0, 1002.0, 1003.0], 2);
        assert!((a - b).abs() < 1e-4, "{a} vs {b}");
        let p: f32 = (0..3).map(|i| logprob(&[1.0, 2.0, 3.0], i).exp()).sum();
        assert!((p - 1.0).abs() < 1e-5);
        assert_eq!(logprob(&[1.0], 5), f32::NEG_INFINITY);
    }

    #[test]
    fn summary_of_tokens() {
        let mut c = Confidence::default();
        assert_eq!(c.score(), None);
        for p in [0.9f32, 0.5, 0.8] {
            c.add(p.ln());
        }
        assert_eq!(c.tokens(), 3);
        let geometric = (0.9f32 * 0.5 * 0.8).powf(1.0 / 3.0);
        assert!((c.score().unwrap() - geometric).abs() < 1e-5);
        assert!((c.min_logprob().unwrap() - 0.5f32.ln()).abs() < 1e-6);
        assert_eq!(c.first_k_mean(), c.mean_logprob());
        for _ in 0..20 {
            c.add(0.0);
        }
        // The first k are fixed once seen; the mean keeps moving.
        let first: f32 = [0.9f32, 0.5, 0.8].iter().map(|p| p.ln()).sum::<f32>() / FIRST_K as f32;
        assert!((c.first_k_mean().unwrap() - first).abs() < 1e-5);
        assert!(c.score().unwrap() > geometric);
    }

    #[test]
    fn nan_counts_as_no_confidence() {
        let mut c = Confidence::default();
        c.add(f32::NAN);
        assert_eq!(c.score(), Some(0.0));
    }
}
