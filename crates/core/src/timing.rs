//! Where the time went on one request, sent back as a standard
//! `Server-Timing` header by the node and the Spin gateway (browsers'
//! developer tools show it; `edgeroute bench` reports it): each step of
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

    /// A part of the step just marked, measured where it happened (the
    /// upstream's share of a cloud step): listed after that step, and
    /// not a step of its own, so the next mark still counts from the last.
    pub fn part(&mut self, name: &'static str, took: std::time::Duration) {
        self.steps.push((name, took.as_secs_f64() * 1e3));
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

/// A `Server-Timing` header's entries that carry a duration, as a client
/// reads them: each name and its milliseconds, in order (steps and parts
/// alike; an entry without `dur` is left out).
pub fn entries(header: &str) -> impl Iterator<Item = (&str, f64)> {
    header.split(',').filter_map(|part| {
        let (name, ms) = part.trim().split_once(";dur=")?;
        Some((name, ms.parse().ok()?))
    })
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
        let steps: Vec<(&str, f64)> = entries(&header).collect();
        assert_eq!(steps.len(), 2, "{header}");
        assert_eq!((steps[0].0, steps[1].0), ("parse", "policy"));
        assert!(steps[1].1 >= 2.0, "{header}");
    }

    #[test]
    fn a_part_is_listed_after_its_step_and_the_next_step_counts_from_that_step() {
        let mut timing = Timing::start();
        std::thread::sleep(std::time::Duration::from_millis(2));
        timing.mark("cloud");
        timing.part("upstream", std::time::Duration::from_millis(50));
        timing.mark("after");
        let header = timing.header();
        let steps: Vec<(&str, f64)> = entries(&header).collect();
        let names: Vec<&str> = steps.iter().map(|s| s.0).collect();
        assert_eq!(names, ["cloud", "upstream", "after"], "{header}");
        assert_eq!(steps[1].1, 50.0, "{header}");
        // Marked right after "cloud": none of the part's 50 ms is in it.
        assert!(steps[2].1 < 50.0, "{header}");
    }
}
