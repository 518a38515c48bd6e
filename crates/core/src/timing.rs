//! Where the time went on one request, sent back as a standard
//! `Server-Timing` header by the node and the Spin gateway (browsers'
//! developer tools show it; `edgeroute bench` adds it up): each step of
//! the pipeline beside the hop it made, so a slow answer says whether the
//! router or the model or upstream was slow.

use std::time::Instant;

pub const HEADER: &str = "server-timing";

#[derive(Debug, Clone)]
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_come_out_in_order_with_their_milliseconds() {
        let mut timing = Timing::start();
        timing.mark("parse");
        std::thread::sleep(std::time::Duration::from_millis(2));
        timing.mark("policy");
        let header = timing.header();
        let steps: Vec<(&str, f64)> = header
            .split(", ")
            .map(|s| {
                let (name, ms) = s.split_once(";dur=").unwrap();
                (name, ms.parse().unwrap())
            })
            .collect();
        assert_eq!(steps.len(), 2, "{header}");
        assert_eq!((steps[0].0, steps[1].0), ("parse", "policy"));
        assert!(steps[1].1 >= 2.0, "{header}");
    }
}
