//! LinUCB: one ridge regression per arm, kept as the inverse of
//! A = I + Σ x xᵀ (updated with Sherman–Morrison, no matrix inversion) and
//! b = Σ r x. An arm's score is its predicted reward θᵀx plus α times the
//! uncertainty of that prediction, sqrt(xᵀ A⁻¹ x).

use serde::{Deserialize, Serialize};

/// Length of a context vector: the cheap signals, then the projected
/// prompt embedding.
pub const D: usize = BASE + EMBEDDED;
/// The cheap signals (`context` in lib.rs).
pub const BASE: usize = 9;
/// Dimensions the prompt embedding is projected to.
pub const EMBEDDED: usize = 16;

/// The state format's version: a snapshot of another layout is refused
/// and the policy starts fresh.
const VERSION: u32 = 2;

#[derive(Clone, Serialize, Deserialize)]
struct Arm {
    a_inv: Vec<Vec<f64>>,
    b: Vec<f64>,
    /// Outcomes learned from.
    n: u64,
}

impl Arm {
    fn new() -> Self {
        let mut a_inv = vec![vec![0.0; D]; D];
        for (i, row) in a_inv.iter_mut().enumerate() {
            row[i] = 1.0;
        }
        Arm {
            a_inv,
            b: vec![0.0; D],
            n: 0,
        }
    }

    fn a_inv_x(&self, x: &[f64; D]) -> [f64; D] {
        let mut out = [0.0; D];
        for (o, row) in out.iter_mut().zip(&self.a_inv) {
            *o = row.iter().zip(x).map(|(a, x)| a * x).sum();
        }
        out
    }
}

#[derive(Clone, Serialize, Deserialize)]
pub struct Arms {
    version: u32,
    arms: Vec<Arm>,
}

impl Arms {
    pub fn new(k: usize) -> Self {
        Arms {
            version: VERSION,
            arms: vec![Arm::new(); k],
        }
    }

    /// Outcomes learned from, over all arms.
    pub fn learned(&self) -> u64 {
        self.arms.iter().map(|a| a.n).sum()
    }

    /// Upper confidence bound of each arm's reward for context `x`.
    pub fn scores(&self, x: &[f64; D], alpha: f64) -> Vec<f64> {
        self.arms
            .iter()
            .map(|arm| {
                let ax = arm.a_inv_x(x);
                // θ = A⁻¹ b, so θᵀx = bᵀ(A⁻¹x) (A⁻¹ is symmetric).
                let mean: f64 = arm.b.iter().zip(&ax).map(|(b, a)| b * a).sum();
                let var: f64 = x.iter().zip(&ax).map(|(x, a)| x * a).sum();
                mean + alpha * var.max(0.0).sqrt()
            })
            .collect()
    }

    /// Learn reward `r` for arm `k` in context `x`.
    pub fn learn(&mut self, k: usize, x: &[f64; D], r: f64) {
        let Some(arm) = self.arms.get_mut(k) else {
            return;
        };
        if !r.is_finite() {
            return;
        }
        // Sherman–Morrison: (A + x xᵀ)⁻¹ = A⁻¹ − (A⁻¹x)(A⁻¹x)ᵀ / (1 + xᵀA⁻¹x).
        let ax = arm.a_inv_x(x);
        let denom = 1.0 + x.iter().zip(&ax).map(|(x, a)| x * a).sum::<f64>();
        for (i, row) in arm.a_inv.iter_mut().enumerate() {
            for (j, cell) in row.iter_mut().enumerate() {
                *cell -= ax[i] * ax[j] / denom;
            }
        }
        for (b, x) in arm.b.iter_mut().zip(x) {
            *b += r * x;
        }
        arm.n += 1;
    }

    /// Change the reward already learned for `x` by `delta` (A is
    /// unchanged: the context was counted once).
    pub fn correct(&mut self, k: usize, x: &[f64; D], delta: f64) {
        if let Some(arm) = self.arms.get_mut(k)
            && delta.is_finite()
        {
            for (b, x) in arm.b.iter_mut().zip(x) {
                *b += delta * x;
            }
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// State from `to_json`, refused unless it has this version's layout
    /// and `k` arms.
    pub fn from_json(text: &str, k: usize) -> Result<Self, String> {
        let arms: Arms =
            serde_json::from_str(text).map_err(|e| format!("bandit state is not readable: {e}"))?;
        if arms.version != VERSION {
            return Err(format!(
                "bandit state version {} is not {VERSION}",
                arms.version
            ));
        }
        let square =
            |a: &Arm| a.a_inv.len() == D && a.a_inv.iter().all(|r| r.len() == D) && a.b.len() == D;
        if arms.arms.len() != k || !arms.arms.iter().all(square) {
            return Err(format!(
                "bandit state has another shape than {k} arms of {D}"
            ));
        }
        Ok(arms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A context of the given leading values, the rest 0.
    fn x(head: &[f64]) -> [f64; D] {
        let mut x = [0.0; D];
        x[..head.len()].copy_from_slice(head);
        x[BASE] = 0.3 * head[1];
        x
    }

    #[test]
    fn the_inverse_stays_the_inverse() {
        let mut arms = Arms::new(1);
        let xs = [
            x(&[1.0, 0.5, 0.0, 1.0, 0.0, 0.2, 0.0, 1.0, 0.1]),
            x(&[1.0, 0.9, 0.3, 0.0, 1.0, 0.0, 0.5, 0.0, 0.0]),
            x(&[1.0, 0.1, 0.0, 0.0, 0.0, 0.9, 0.0, 1.0, 0.7]),
        ];
        for x in &xs {
            arms.learn(0, x, 1.0);
        }
        // A = I + Σ x xᵀ; A · A⁻¹ must be I.
        let mut a = vec![vec![0.0; D]; D];
        for (i, row) in a.iter_mut().enumerate() {
            row[i] = 1.0;
            for x in &xs {
                for (j, cell) in row.iter_mut().enumerate() {
                    *cell += x[i] * x[j];
                }
            }
        }
        let inv = &arms.arms[0].a_inv;
        for (i, row) in a.iter().enumerate() {
            for j in 0..D {
                let v: f64 = row.iter().zip(inv).map(|(a, r)| a * r[j]).sum();
                let want = if i == j { 1.0 } else { 0.0 };
                assert!((v - want).abs() < 1e-9, "({i},{j}) = {v}");
            }
        }
    }

    #[test]
    fn the_better_arm_scores_higher_and_uncertainty_shrinks() {
        let mut arms = Arms::new(2);
        let x = x(&[1.0, 0.5, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0]);
        let before = arms.scores(&x, 1.0);
        for _ in 0..50 {
            arms.learn(0, &x, 0.9);
            arms.learn(1, &x, 0.2);
        }
        let after = arms.scores(&x, 0.0);
        assert!(after[0] > after[1], "{after:?}");
        assert!((after[0] - 0.9).abs() < 0.05, "{after:?}");
        let explored = arms.scores(&x, 1.0);
        assert!(explored[0] - after[0] < before[0], "uncertainty shrinks");
    }
}
