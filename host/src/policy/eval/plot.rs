//! The replay's cost–quality plot as a small SVG: quality against the
//! share of requests sent to the cloud, one line per router.
//!
//! Written by hand rather than with `plotters`: laying out its axis labels
//! needs a font stack (system fonts through fontconfig, or a bundled font
//! file), which is a lot of build for a dozen lines and some text. An SVG
//! viewer lays out our text itself.

use super::curve::Curve;
use std::fmt::Write as _;
use std::path::Path;

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 480.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 250.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = 60.0;
const COLOURS: [&str; 8] = [
    "#888888", "#d62728", "#2ca02c", "#000000", "#1f77b4", "#9467bd", "#ff7f0e", "#17becf",
];

/// Draw every curve's points (sorted by cloud share) between the all-local
/// and all-cloud ends.
pub fn curves(path: &Path, curves: &[Curve], local: f64, cloud: f64) -> anyhow::Result<()> {
    std::fs::write(path, svg(curves, local, cloud))
        .map_err(|e| anyhow::anyhow!("cannot write the plot to {}: {e}", path.display()))
}

fn svg(curves: &[Curve], local: f64, cloud: f64) -> String {
    let (plot_w, plot_h) = (WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM);
    let q_lo = (local.min(cloud) - 0.05).max(0.0);
    let q_hi = (local.max(cloud) + 0.05).min(1.0);
    let x = |share: f64| LEFT + share.clamp(0.0, 1.0) * plot_w;
    let y = |quality: f64| TOP + (1.0 - (quality - q_lo) / (q_hi - q_lo).max(1e-9)) * plot_h;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    // Axes and ticks.
    let _ = writeln!(
        s,
        r#"<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="black"/>"#
    );
    for i in 0..=10 {
        let share = i as f64 / 10.0;
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}%</text>"#,
            x(share),
            TOP + plot_h + 18.0,
            i * 10
        );
        let q = q_lo + (q_hi - q_lo) * share;
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{q:.2}</text>"#,
            LEFT - 6.0,
            y(q) + 4.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">requests sent to the cloud</text>"#,
        LEFT + plot_w / 2.0,
        HEIGHT - 15.0
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(18 {:.1}) rotate(-90)" text-anchor="middle">mean quality</text>"#,
        TOP + plot_h / 2.0
    );
    for (i, curve) in curves.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let mut points: Vec<(f64, f64)> = curve
            .points
            .iter()
            .map(|p| (p.cloud_share, p.quality))
            .collect();
        points.push((0.0, local));
        points.push((1.0, cloud));
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let line: Vec<String> = points
            .iter()
            .map(|(c, q)| format!("{:.1},{:.1}", x(*c), y(*q)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"/>"#,
            line.join(" ")
        );
        for p in &curve.points {
            let _ = writeln!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{colour}"/>"#,
                x(p.cloud_share),
                y(p.quality)
            );
        }
        let label = match curve.apgr {
            Some(apgr) => format!("{} (APGR {apgr:.2})", curve.name),
            None => curve.name.clone(),
        };
        let ly = TOP + 10.0 + i as f64 * 20.0;
        let _ = writeln!(
            s,
            r#"<line x1="{:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{colour}" stroke-width="2"/>"#,
            WIDTH - RIGHT + 12.0,
            WIDTH - RIGHT + 32.0
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}">{}</text>"#,
            WIDTH - RIGHT + 38.0,
            ly + 4.0,
            escape(&label)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::eval::curve::Point;

    #[test]
    fn every_curve_is_drawn_and_labelled() {
        let point = |c: f64, q: f64| Point {
            setting: String::new(),
            cloud_share: c,
            quality: q,
            cost_usd: 0.0,
            latency_ms: 0.0,
            escalated: 0.0,
        };
        let curves = vec![
            Curve::new("a <b>", vec![point(0.5, 0.9)], 0.5, 1.0),
            Curve::new("c", vec![point(0.2, 0.6), point(0.6, 0.95)], 0.5, 1.0),
        ];
        let text = svg(&curves, 0.5, 1.0);
        assert_eq!(text.matches("<polyline").count(), 2);
        assert_eq!(text.matches("<circle").count(), 3);
        assert!(text.contains("a &lt;b&gt; (APGR"));
        assert!(text.ends_with("</svg>\n"));
    }
}
