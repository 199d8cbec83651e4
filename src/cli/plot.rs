//! A dependency-free SVG line plot of the loss curve.

use std::path::Path;

use crate::Result;

/// Writes `series` (name, points of (step, value)) as an SVG line chart, atomically.
pub fn write_svg(path: &Path, title: &str, series: &[(&str, &[(f64, f64)])]) -> Result<()> {
    const W: f64 = 720.0;
    const H: f64 = 420.0;
    const PAD: f64 = 56.0;
    const COLORS: [&str; 4] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];
    let points = series
        .iter()
        .flat_map(|(_, p)| p.iter())
        .filter(|(x, y)| x.is_finite() && y.is_finite());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in points {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    if x1 - x0 < 1e-12 {
        x1 = x0 + 1.0;
    }
    if y1 - y0 < 1e-12 {
        y1 = y0 + 1.0;
    }
    let sx = |x: f64| PAD + (x - x0) / (x1 - x0) * (W - 2.0 * PAD);
    let sy = |y: f64| H - PAD - (y - y0) / (y1 - y0) * (H - 2.0 * PAD);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n\
         <line x1=\"{PAD}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n\
         <line x1=\"{PAD}\" y1=\"{PAD}\" x2=\"{PAD}\" y2=\"{}\" stroke=\"black\"/>\n",
        W / 2.0,
        escape(title),
        H - PAD,
        W - PAD,
        H - PAD,
        H - PAD
    );
    for i in 0..=4 {
        let (fx, fy) = (
            x0 + (x1 - x0) * i as f64 / 4.0,
            y0 + (y1 - y0) * i as f64 / 4.0,
        );
        svg += &format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>\n",
            sx(fx),
            H - PAD + 18.0,
            fx.round()
        );
        svg += &format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{:.3}</text>\n",
            PAD - 6.0,
            sy(fy) + 4.0,
            fy
        );
    }
    svg += &format!(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">step</text>\n",
        W / 2.0,
        H - 12.0
    );
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let path: Vec<String> = pts
            .iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
            .collect();
        svg += &format!(
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\" points=\"{}\"/>\n",
            path.join(" ")
        );
        svg += &format!(
            "<text x=\"{}\" y=\"{}\" fill=\"{color}\" text-anchor=\"end\">{}</text>\n",
            W - PAD,
            PAD + 16.0 * i as f64,
            escape(name)
        );
    }
    svg += "</svg>\n";
    tessera_core::io::write_atomic(path, svg.as_bytes())
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
