//! Tokens and what they cost.

/// Tokens of one completion.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
}

/// An upstream's prices, in US dollars per million tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Prices {
    pub usd_per_mtok_in: f64,
    pub usd_per_mtok_out: f64,
}

impl Prices {
    pub fn cost(&self, usage: Usage) -> f64 {
        (usage.prompt_tokens as f64 * self.usd_per_mtok_in
            + usage.completion_tokens as f64 * self.usd_per_mtok_out)
            / 1e6
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_is_per_million_tokens_each_way() {
        let prices = Prices {
            usd_per_mtok_in: 2.0,
            usd_per_mtok_out: 8.0,
        };
        let usage = Usage {
            prompt_tokens: 500_000,
            completion_tokens: 250_000,
        };
        assert!((prices.cost(usage) - 3.0).abs() < 1e-12);
    }
}
