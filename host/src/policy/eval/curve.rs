//! Cost–quality curves and the numbers routers are compared by
//! (RouteLLM's): how much of the quality gap between the weak model
//! (all local) and the strong one (all cloud) a router recovers, as a
//! function of the share of requests it sends to the cloud.
//!
//! - PGR (performance gap recovered) of a point: (quality − local) /
//!   (cloud − local).
//! - A curve is a router's points over a sweep of its trade-off parameter,
//!   joined by straight lines and closed by the two fixed ends, (0, 0)
//!   (nothing sent: all local) and (1, 1) (everything sent: all cloud).
//! - APGR is the area under the PGR curve over cloud share 0 to 1: 0.5 for
//!   a router that picks at random, near 1 for the oracle.
//! - CPT(x) is the smallest cloud share at which the curve reaches PGR x.

use serde::Serialize;

/// One run of a router over a dataset.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Point {
    /// The parameter value this run used (`cost_weight=2`), or empty.
    pub setting: String,
    /// Share of requests that reached the cloud (escalations included).
    pub cloud_share: f64,
    /// Mean quality of the answers served.
    pub quality: f64,
    /// Mean cost per request, in dollars.
    pub cost_usd: f64,
    /// Mean latency per request, in milliseconds.
    pub latency_ms: f64,
    /// Share of requests a cascade escalated.
    pub escalated: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Curve {
    pub name: String,
    pub points: Vec<Point>,
    /// None when the dataset has no gap to recover (cloud ≤ local).
    pub apgr: Option<f64>,
    pub cpt50: Option<f64>,
    pub cpt80: Option<f64>,
}

impl Curve {
    /// Summarise `points` against the all-local and all-cloud quality.
    pub fn new(name: impl Into<String>, points: Vec<Point>, local: f64, cloud: f64) -> Self {
        let gap = cloud - local;
        let line = (gap > 1e-12).then(|| pgr_line(&points, local, gap));
        Curve {
            name: name.into(),
            apgr: line.as_deref().map(area),
            cpt50: line.as_deref().and_then(|l| reach(l, 0.5)),
            cpt80: line.as_deref().and_then(|l| reach(l, 0.8)),
            points,
        }
    }
}

/// (cloud share, PGR) sorted by share, with both ends; where several runs
/// share a cloud share, the best counts (a router can always be set to it).
fn pgr_line(points: &[Point], local: f64, gap: f64) -> Vec<(f64, f64)> {
    let mut line: Vec<(f64, f64)> = points
        .iter()
        .map(|p| (p.cloud_share.clamp(0.0, 1.0), (p.quality - local) / gap))
        .collect();
    line.push((0.0, 0.0));
    line.push((1.0, 1.0));
    line.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
    line.dedup_by(|later, earlier| (later.0 - earlier.0).abs() < 1e-12);
    line
}

/// The trapezoid area under a line over [0, 1].
fn area(line: &[(f64, f64)]) -> f64 {
    line.windows(2)
        .map(|w| (w[1].0 - w[0].0) * (w[0].1 + w[1].1) / 2.0)
        .sum()
}

/// The first cloud share at which the line reaches `target`.
fn reach(line: &[(f64, f64)], target: f64) -> Option<f64> {
    if line.first()?.1 >= target {
        return Some(line[0].0);
    }
    line.windows(2).find_map(|w| {
        let ((x0, y0), (x1, y1)) = (w[0], w[1]);
        (y1 >= target && y0 < target).then(|| x0 + (x1 - x0) * (target - y0) / (y1 - y0))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(cloud_share: f64, quality: f64) -> Point {
        Point {
            setting: String::new(),
            cloud_share,
            quality,
            cost_usd: 0.0,
            latency_ms: 0.0,
            escalated: 0.0,
        }
    }

    #[test]
    fn random_routing_recovers_half() {
        // Random routing: quality rises linearly with the cloud share.
        let points = (0..=10)
            .map(|i| point(i as f64 / 10.0, 0.4 + 0.6 * i as f64 / 10.0))
            .collect();
        let c = Curve::new("random", points, 0.4, 1.0);
        assert!((c.apgr.unwrap() - 0.5).abs() < 1e-12);
        assert!((c.cpt50.unwrap() - 0.5).abs() < 1e-12);
        assert!((c.cpt80.unwrap() - 0.8).abs() < 1e-12);
    }

    #[test]
    fn a_router_that_finds_the_gap_early_scores_high() {
        // Local is right on 60 %: sending exactly the other 40 % recovers
        // everything. Area: 0.4 × 1 / 2 + 0.6 × 1 = 0.8.
        let c = Curve::new("oracle", vec![point(0.4, 1.0)], 0.6, 1.0);
        assert!((c.apgr.unwrap() - 0.8).abs() < 1e-12);
        assert!((c.cpt50.unwrap() - 0.2).abs() < 1e-12);
        assert!((c.cpt80.unwrap() - 0.32).abs() < 1e-12);
    }

    #[test]
    fn the_best_run_at_a_share_counts_and_no_gap_gives_none() {
        let c = Curve::new("r", vec![point(0.5, 0.7), point(0.5, 0.9)], 0.5, 1.0);
        // Line (0,0) (0.5,0.8) (1,1): 0.5×0.8/2 + 0.5×1.8/2 = 0.65.
        assert!((c.apgr.unwrap() - 0.65).abs() < 1e-12);
        assert!(
            Curve::new("flat", vec![point(0.5, 0.5)], 0.5, 0.5)
                .apgr
                .is_none()
        );
    }
}
