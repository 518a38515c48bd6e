//! The report's charts as inline SVG: horizontal stacked bars, a histogram
//! and a line chart. Hand-written for the reason `policy/eval/plot.rs`
//! gives (a plotting crate needs a font stack to lay out its labels; a
//! browser lays out ours).

use std::fmt::Write as _;

pub const LOCAL: &str = "#2ca02c";
pub const CLOUD: &str = "#1f77b4";
pub const REFUSED: &str = "#d62728";
pub const ESCALATED: &str = "#ff7f0e";

pub fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A series: its name, colour, and one value per category (or point).
pub struct Series<'a> {
    pub name: &'a str,
    pub colour: &'a str,
    pub values: Vec<f64>,
}

fn legend(s: &mut String, series: &[Series], x: f64, y: f64) {
    for (i, series) in series.iter().enumerate() {
        let x = x + i as f64 * 130.0;
        let _ = write!(
            s,
            r#"<rect x="{x}" y="{}" width="12" height="12" fill="{}"/><text x="{}" y="{}">{}</text>"#,
            y - 10.0,
            series.colour,
            x + 16.0,
            y,
            escape(series.name)
        );
    }
}

/// One bar per category, its segments the series, as shares of the bar
/// (`shares`) or as counts; each bar is labelled with its total.
pub fn stacked_bars(categories: &[String], series: &[Series], shares: bool) -> String {
    let (label_w, bar_w, row_h) = (260.0, 420.0, 22.0);
    let height = 40.0 + row_h * categories.len() as f64 + 10.0;
    let width = label_w + bar_w + 80.0;
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    legend(&mut s, series, label_w, 16.0);
    let totals: Vec<f64> = (0..categories.len())
        .map(|i| series.iter().map(|se| se.values[i]).sum())
        .collect();
    let max_total = totals.iter().copied().fold(0.0, f64::max).max(1e-9);
    for (i, category) in categories.iter().enumerate() {
        let y = 30.0 + row_h * i as f64;
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
            label_w - 8.0,
            y + 14.0,
            escape(category)
        );
        let scale = if shares {
            bar_w / totals[i].max(1e-9)
        } else {
            bar_w / max_total
        };
        let mut x = label_w;
        for se in series {
            let w = se.values[i] * scale;
            if w > 0.0 {
                let _ = write!(
                    s,
                    r#"<rect x="{x:.1}" y="{y}" width="{w:.1}" height="{}" fill="{}"><title>{}: {}</title></rect>"#,
                    row_h - 6.0,
                    se.colour,
                    escape(se.name),
                    se.values[i]
                );
            }
            x += w;
        }
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{}">{}</text>"#,
            x + 6.0,
            y + 14.0,
            totals[i]
        );
    }
    s.push_str("</svg>");
    s
}

/// A chart's SVG so far (frame, ticks, legend) and its value ranges, which
/// map values to pixels.
struct Frame {
    svg: String,
    x: (f64, f64),
    y: (f64, f64),
}

const W: f64 = 640.0;
const H: f64 = 300.0;
const L: f64 = 70.0;
const R: f64 = 20.0;
const T: f64 = 30.0;
const B: f64 = 40.0;

impl Frame {
    fn new(x: (f64, f64), y: (f64, f64), x_label: &str, y_label: &str, series: &[Series]) -> Frame {
        let mut frame = Frame {
            svg: format!(
                r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">"#
            ),
            x,
            y,
        };
        let mut s = format!(
            r##"<rect x="{L}" y="{T}" width="{}" height="{}" fill="none" stroke="#888"/>"##,
            W - L - R,
            H - T - B
        );
        for i in 0..=4 {
            let f = i as f64 / 4.0;
            let (xv, yv) = (x.0 + (x.1 - x.0) * f, y.0 + (y.1 - y.0) * f);
            let _ = write!(
                s,
                r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text><text x="{}" y="{:.1}" text-anchor="end">{}</text>"#,
                frame.px(xv),
                H - B + 16.0,
                tick(xv),
                L - 6.0,
                frame.py(yv) + 4.0,
                tick(yv)
            );
        }
        let middle = T + (H - T - B) / 2.0;
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text><text x="14" y="{middle}" transform="rotate(-90 14 {middle})" text-anchor="middle">{}</text>"#,
            L + (W - L - R) / 2.0,
            H - 6.0,
            escape(x_label),
            escape(y_label)
        );
        legend(&mut s, series, L, 18.0);
        frame.svg.push_str(&s);
        frame
    }

    fn px(&self, v: f64) -> f64 {
        L + (v - self.x.0) / (self.x.1 - self.x.0).max(1e-9) * (W - L - R)
    }

    fn py(&self, v: f64) -> f64 {
        T + (1.0 - (v - self.y.0) / (self.y.1 - self.y.0).max(1e-9)) * (H - T - B)
    }
}

fn tick(v: f64) -> String {
    if v.abs() >= 100.0 || v == v.round() {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else if v.abs() >= 0.01 {
        format!("{v:.2}")
    } else {
        format!("{v:.4}")
    }
}

/// Counts per bin (`edges` has one more entry than each series' values),
/// one outlined step line per series so several can overlap.
pub fn histogram(edges: &[f64], series: &[Series], x_label: &str) -> String {
    let max = series
        .iter()
        .flat_map(|s| s.values.iter().copied())
        .fold(0.0, f64::max)
        .max(1.0);
    let mut frame = Frame::new(
        (edges[0], *edges.last().unwrap_or(&1.0)),
        (0.0, max),
        x_label,
        "requests",
        series,
    );
    for se in series {
        let mut path = format!("M{:.1},{:.1}", frame.px(edges[0]), frame.py(0.0));
        for (i, v) in se.values.iter().enumerate() {
            let _ = write!(
                path,
                " L{:.1},{:.1} L{:.1},{:.1}",
                frame.px(edges[i]),
                frame.py(*v),
                frame.px(edges[i + 1]),
                frame.py(*v)
            );
        }
        let _ = write!(
            path,
            " L{:.1},{:.1}",
            frame.px(*edges.last().unwrap_or(&1.0)),
            frame.py(0.0)
        );
        let _ = write!(
            frame.svg,
            r#"<path d="{path}" fill="{}" fill-opacity="0.25" stroke="{}" stroke-width="1.5"/>"#,
            se.colour, se.colour
        );
    }
    frame.svg.push_str("</svg>");
    frame.svg
}

/// Lines over a shared x (e.g. minutes since the first request).
pub fn lines(x: &[f64], series: &[Series], x_label: &str, y_label: &str) -> String {
    let x_range = (
        x.first().copied().unwrap_or(0.0),
        x.last()
            .copied()
            .unwrap_or(1.0)
            .max(x.first().copied().unwrap_or(0.0) + 1e-9),
    );
    let y_max = series
        .iter()
        .flat_map(|s| s.values.iter().copied())
        .fold(0.0, f64::max)
        .max(1e-9);
    let mut frame = Frame::new(x_range, (0.0, y_max), x_label, y_label, series);
    for se in series {
        let points: Vec<String> = x
            .iter()
            .zip(&se.values)
            .map(|(x, y)| format!("{:.1},{:.1}", frame.px(*x), frame.py(*y)))
            .collect();
        let _ = write!(
            frame.svg,
            r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="2"/>"#,
            points.join(" "),
            se.colour
        );
    }
    frame.svg.push_str("</svg>");
    frame.svg
}
