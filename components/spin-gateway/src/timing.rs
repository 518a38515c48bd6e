//! Where the gateway's time went on one request, sent back as a standard
//! `Server-Timing` header (browsers' developer tools show it; `edgeroute
//! bench --spin-gateway` adds it up): the gateway's own steps beside the
//! hop it made, so a slow answer says whether the gateway or the node or
//! upstream was slow.

use std::time::Instant;

pub const HEADER: &str = "server-timing";

pub struct Timing {
    last: Instant,
    /// Each step's name and milliseconds, in order.
    steps: Vec<(&'static str, f64)>,
}

impl Timing {
    pub fn start() -> Self {
        Self {
            last: Instant::now(),
            steps: Vec::with_capacity(8),
        }
    }

    /// The time since the previous mark is `step`'s.
    pub fn mark(&mut self, step: &'static str) {
        let now = Instant::now();
        self.steps
            .push((step, now.duration_since(self.last).as_secs_f64() * 1e3));
        self.last = now;
    }

    /// `read;dur=0.041, detect;dur=0.210, …` (milliseconds).
    pub fn header(&self) -> String {
        let mut out = String::with_capacity(self.steps.len() * 20);
        for (i, (step, ms)) in self.steps.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            out.push_str(&format!("{step};dur={ms:.3}"));
        }
        out
    }
}
