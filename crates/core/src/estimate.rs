//! The host's own latency estimates: how long a target would take to the
//! first token and to the end, from what it measured on earlier requests.
//! Policies compare them with the client's latency budget.

/// An exponentially weighted moving average: recent requests count more,
/// so an estimate follows a machine that got busier or an upstream that
/// slowed down, without keeping a history.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ewma {
    value: Option<f64>,
    /// Weight of each new sample, 0 to 1.
    alpha: f64,
}

impl Ewma {
    pub const fn new(alpha: f64) -> Self {
        Self { value: None, alpha }
    }

    /// Start from a prior (a measured or stated speed) instead of nothing.
    pub const fn starting_at(value: f64, alpha: f64) -> Self {
        Self {
            value: Some(value),
            alpha,
        }
    }

    pub fn add(&mut self, sample: f64) {
        if !sample.is_finite() || sample < 0.0 {
            return;
        }
        self.value = Some(match self.value {
            None => sample,
            Some(v) => v + self.alpha * (sample - v),
        });
    }

    pub fn get(&self) -> Option<f64> {
        self.value
    }
}

/// The weight of a new sample in every estimate of the node.
pub const ALPHA: f64 = 0.2;

/// How long a request arriving now waits for one of `slots` generation
/// slots when `depth` requests are waiting or running and a generation
/// takes `service_ms` on average: none while a slot is free, else one
/// slot-freeing interval (`service_ms / slots`, the mean time until the
/// first of `slots` running generations ends when their lengths are
/// memoryless) for itself and each request queued ahead of it. Used by the
/// node for its own wait and by the fleet simulation, so both agree.
pub fn queue_wait_ms(depth: u32, slots: u32, service_ms: f64) -> f64 {
    let slots = slots.max(1);
    if depth < slots {
        return 0.0;
    }
    f64::from(depth - slots + 1) * service_ms.max(0.0) / f64::from(slots)
}

/// A target's predicted latency for one request, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Estimate {
    /// Until the first token: waiting, the round trip, the prefill.
    pub ttft_ms: u32,
    /// Until the last token, with the whole completion budget used.
    pub total_ms: u32,
}

/// How fast one target has been.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Speed {
    /// Fixed time before the first token (round trip, server queue);
    /// for a local model, nothing beyond the prefill.
    pub overhead_ms: Ewma,
    /// Prefill time per prompt token.
    pub prefill_ms_per_token: Ewma,
    /// Decode time per completion token.
    pub decode_ms_per_token: Ewma,
}

impl Default for Speed {
    fn default() -> Self {
        Self {
            overhead_ms: Ewma::new(ALPHA),
            prefill_ms_per_token: Ewma::new(ALPHA),
            decode_ms_per_token: Ewma::new(ALPHA),
        }
    }
}

impl Speed {
    /// Record one remote run. With the first token's time (a stream) the
    /// decode speed is measured too; without it, the whole time minus the
    /// decode at the known speed is the overhead.
    pub fn observe_remote(&mut self, ttft_ms: Option<f64>, total_ms: f64, completion_tokens: u32) {
        match ttft_ms {
            Some(ttft) => {
                self.overhead_ms.add(ttft);
                if completion_tokens > 1 {
                    let per_token = (total_ms - ttft) / (completion_tokens - 1) as f64;
                    self.decode_ms_per_token.add(per_token);
                }
            }
            None => {
                let decode = self.decode_ms_per_token.get().unwrap_or(0.0);
                self.overhead_ms
                    .add((total_ms - decode * completion_tokens as f64).max(0.0));
            }
        }
    }

    /// None until the target has been measured once; `wait_ms` is the
    /// time spent queued before the work starts.
    pub fn estimate(&self, prompt_tokens: u32, max_tokens: u32, wait_ms: f64) -> Option<Estimate> {
        if self.overhead_ms.get().is_none() && self.decode_ms_per_token.get().is_none() {
            return None;
        }
        let decode = self.decode_ms_per_token.get().unwrap_or(0.0);
        let ttft = wait_ms
            + self.overhead_ms.get().unwrap_or(0.0)
            + prompt_tokens as f64 * self.prefill_ms_per_token.get().unwrap_or(0.0);
        let total = ttft + max_tokens as f64 * decode;
        let ms = |v: f64| v.round().clamp(0.0, u32::MAX as f64) as u32;
        Some(Estimate {
            ttft_ms: ms(ttft),
            total_ms: ms(total),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_frees_every_generation_over_the_slots_once_all_are_busy() {
        // A free slot: no wait, however slow a generation is.
        assert_eq!(queue_wait_ms(3, 4, 2000.0), 0.0);
        // All four busy: the first of them ends in 2000 / 4 on average.
        assert_eq!(queue_wait_ms(4, 4, 2000.0), 500.0);
        // Two more queued ahead: two more such intervals.
        assert_eq!(queue_wait_ms(6, 4, 2000.0), 1500.0);
        // One slot, or none configured: a whole generation per request.
        assert_eq!(queue_wait_ms(2, 1, 800.0), 1600.0);
        assert_eq!(queue_wait_ms(2, 0, 800.0), 1600.0);
        // Nothing measured yet (or nonsense): no wait.
        assert_eq!(queue_wait_ms(9, 2, -1.0), 0.0);
    }

    #[test]
    fn ewma_follows_recent_samples_and_ignores_nonsense() {
        let mut e = Ewma::new(0.5);
        assert_eq!(e.get(), None);
        e.add(10.0);
        assert_eq!(e.get(), Some(10.0));
        e.add(20.0);
        assert_eq!(e.get(), Some(15.0));
        e.add(f64::NAN);
        e.add(-1.0);
        assert_eq!(e.get(), Some(15.0));
        assert_eq!(Ewma::starting_at(3.0, 0.5).get(), Some(3.0));
    }

    #[test]
    fn a_stream_measures_the_round_trip_and_the_decode() {
        let mut s = Speed::default();
        s.observe_remote(Some(250.0), 250.0 + 9.0 * 10.0, 10);
        let e = s.estimate(1000, 20, 0.0).unwrap();
        assert_eq!((e.ttft_ms, e.total_ms), (250, 250 + 200));
    }

    #[test]
    fn estimate_adds_wait_overhead_prefill_and_decode() {
        let mut s = Speed::default();
        assert_eq!(s.estimate(100, 10, 0.0), None);
        // A non-streamed call: all of it counts as overhead until the
        // decode speed is known.
        s.observe_remote(None, 300.0, 10);
        assert_eq!(s.estimate(100, 10, 0.0).map(|e| e.total_ms), Some(300));
        let mut s = Speed::default();
        s.overhead_ms.add(200.0);
        s.prefill_ms_per_token.add(8.0);
        s.decode_ms_per_token.add(16.0);
        assert_eq!(
            s.estimate(100, 10, 50.0),
            Some(Estimate {
                ttft_ms: 50 + 200 + 800,
                total_ms: 50 + 200 + 800 + 160
            })
        );
    }
}
