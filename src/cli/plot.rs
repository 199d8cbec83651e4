//! Plots of a run's metrics, drawn with plotters beside `metrics.jsonl`: `loss.svg` and
//! `loss.png`, one panel each for the loss (training and validation), the held-out exact match
//! (addition) and the throughput, against the optimizer step. `tessera train` draws them at
//! the end of a run; `tessera plot` redraws them from the metrics at any time (during a run,
//! or with `--log-scale`).
//!
//! The PNG's text uses DejaVu Sans compiled into the program (the `dejavu` crate), so drawing
//! needs no system fonts. On a log scale, values at or below zero cannot be placed and are
//! left out, as matplotlib masks them; so are points past ±10^15 (no loss, rate or step
//! reaches them, and an axis spanning them cannot be ticked).

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use clap::Args;
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;

use crate::{Error, Result};

/// Points of (step, value).
type Series = Vec<(f64, f64)>;

/// What a run's `metrics.jsonl` records, as series against the step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metrics {
    pub loss: Series,
    pub validation_loss: Series,
    /// Percent of held-out addition problems answered exactly.
    pub exact_match: Series,
    pub tokens_per_s: Series,
}

impl Metrics {
    /// Reads a metrics file; lines that are not JSON objects (a line cut by a kill) are skipped.
    pub fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let mut m = Metrics::default();
        for line in text.lines() {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            let Some(step) = v.get("step").and_then(|s| s.as_f64()) else {
                continue;
            };
            let add = |series: &mut Series, value: Option<f64>| {
                if let Some(y) = value.filter(|y| y.is_finite()) {
                    series.push((step, y));
                }
            };
            add(&mut m.loss, v.get("loss").and_then(|l| l.as_f64()));
            add(
                &mut m.tokens_per_s,
                v.get("tokens_per_s").and_then(|t| t.as_f64()),
            );
            if let Some(e) = v.get("eval") {
                add(
                    &mut m.validation_loss,
                    e.get("validation_loss").and_then(|l| l.as_f64()),
                );
                add(
                    &mut m.exact_match,
                    e.get("heldout_exact_match")
                        .and_then(|a| a.as_f64())
                        .map(|a| a * 100.0),
                );
            }
        }
        Ok(m)
    }
}

/// `tessera plot`: redraws a run's plots from its metrics.
#[derive(Args, Clone, Debug)]
pub struct PlotArgs {
    /// The run's output directory (holding metrics.jsonl).
    #[arg(long, default_value = "runs/latest")]
    pub run: PathBuf,
    /// Draw the loss on a logarithmic scale.
    #[arg(long)]
    pub log_scale: bool,
}

pub fn run(args: &PlotArgs) -> Result<()> {
    let metrics = Metrics::read(&args.run.join("metrics.jsonl"))?;
    for path in write_plots(&metrics, &args.run, args.log_scale)? {
        println!("{}", path.display());
    }
    Ok(())
}

const WIDTH: u32 = 960;
const PANEL_HEIGHT: u32 = 320;
const FONT: &str = "sans-serif";
const TRAINING: RGBColor = RGBColor(31, 119, 180);
const VALIDATION: RGBColor = RGBColor(214, 39, 40);
const OTHER: RGBColor = RGBColor(44, 160, 44);

/// Writes `dir/loss.svg` and `dir/loss.png` (each atomically) and returns their paths.
pub fn write_plots(metrics: &Metrics, dir: &Path, log_scale: bool) -> Result<[PathBuf; 2]> {
    register_font()?;
    let panels = panels(metrics, log_scale);
    let height = PANEL_HEIGHT * panels.len() as u32;
    let (svg_path, png_path) = (dir.join("loss.svg"), dir.join("loss.png"));

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        draw(&root, &panels).map_err(|e| drawing_error(&svg_path, e))?;
    }
    tessera_core::io::write_atomic(&svg_path, svg.as_bytes())?;

    let mut pixels = vec![0u8; WIDTH as usize * height as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut pixels, (WIDTH, height)).into_drawing_area();
        draw(&root, &panels).map_err(|e| drawing_error(&png_path, e))?;
    }
    tessera_core::io::write_atomic(&png_path, &encode_png(&pixels, WIDTH, height, &png_path)?)?;
    Ok([svg_path, png_path])
}

fn register_font() -> Result<()> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular()).is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(Error::format(
            "DejaVu Sans",
            "the built-in font did not load",
        ))
    }
}

/// One series drawn as a line.
struct Line<'a> {
    name: &'a str,
    color: RGBColor,
    points: &'a [(f64, f64)],
}

/// One chart: its title, y-axis name, lines and scale.
struct Panel<'a> {
    title: &'a str,
    y_name: &'a str,
    lines: Vec<Line<'a>>,
    log_scale: bool,
    /// Fixed y range (the exact-match percentage), else fitted to the points.
    y_range: Option<Range<f64>>,
}

fn panels<'a>(m: &'a Metrics, log_scale: bool) -> Vec<Panel<'a>> {
    let line = |name, color, points: &'a Series| Line {
        name,
        color,
        points: points.as_slice(),
    };
    let mut loss = vec![line("training", TRAINING, &m.loss)];
    if !m.validation_loss.is_empty() {
        loss.push(line("validation", VALIDATION, &m.validation_loss));
    }
    let mut panels = vec![Panel {
        title: if log_scale {
            "loss (log scale)"
        } else {
            "loss"
        },
        y_name: "cross-entropy",
        lines: loss,
        log_scale,
        y_range: None,
    }];
    if !m.exact_match.is_empty() {
        panels.push(Panel {
            title: "held-out exact match",
            y_name: "%",
            lines: vec![line("held-out problems", OTHER, &m.exact_match)],
            log_scale: false,
            y_range: Some(0.0..100.0),
        });
    }
    if !m.tokens_per_s.is_empty() {
        panels.push(Panel {
            title: "throughput",
            y_name: "tokens/s",
            lines: vec![line("training", TRAINING, &m.tokens_per_s)],
            log_scale: false,
            y_range: None,
        });
    }
    panels
}

type DrawResult<E> = std::result::Result<(), DrawingAreaErrorKind<E>>;

fn draw<B: DrawingBackend>(
    root: &DrawingArea<B, plotters::coord::Shift>,
    panels: &[Panel],
) -> DrawResult<B::ErrorType> {
    root.fill(&WHITE)?;
    for (area, panel) in root.split_evenly((panels.len(), 1)).iter().zip(panels) {
        let (x, y) = ranges(panel);
        if panel.log_scale {
            let ticks = log_ticks(&y);
            draw_panel(area, panel, x, y.log_scale().with_key_points(ticks))?;
        } else {
            draw_panel(area, panel, x, y)?;
        }
    }
    root.present()
}

/// The x range of all points, and the y range (padded by 5%, and kept above zero on a log
/// scale); a single value gets a range around it.
fn ranges(panel: &Panel) -> (Range<f64>, Range<f64>) {
    let points = panel
        .lines
        .iter()
        .flat_map(|l| l.points.iter())
        .filter(|&&p| placeable(p, panel.log_scale));
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in points {
        (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (0.0, 1.0, 1.0, 2.0);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    if let Some(r) = &panel.y_range {
        return (x0..x1, r.clone());
    }
    if panel.log_scale {
        let (lo, hi) = if y1 > y0 {
            (y0, y1)
        } else {
            (y0 / 2.0, y0 * 2.0)
        };
        return (x0..x1, lo / 1.1..hi * 1.1);
    }
    let pad = if y1 > y0 {
        (y1 - y0) * 0.05
    } else {
        y0.abs().max(1.0) * 0.5
    };
    (x0..x1, y0 - pad..y1 + pad)
}

fn draw_panel<B, Y>(
    area: &DrawingArea<B, plotters::coord::Shift>,
    panel: &Panel,
    x: Range<f64>,
    y: Y,
) -> DrawResult<B::ErrorType>
where
    B: DrawingBackend,
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let mut chart = ChartBuilder::on(area)
        .caption(panel.title, (FONT, 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(72)
        .build_cartesian_2d::<Range<f64>, Y>(x, y)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc(panel.y_name)
        .x_label_formatter(&|v| short_number(*v))
        .y_label_formatter(&|v| short_number(*v))
        .y_labels(8)
        .label_style((FONT, 13))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()?;
    for &Line {
        name,
        color,
        points,
    } in &panel.lines
    {
        let visible = points
            .iter()
            .copied()
            .filter(|&p| placeable(p, panel.log_scale));
        chart
            .draw_series(LineSeries::new(visible, color.stroke_width(2)))?
            .label(name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font((FONT, 13))
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(180, 180, 180))
        .draw()
}

/// Points beyond this (in either coordinate) are left out.
const LARGEST: f64 = 1e15;

fn placeable((x, y): (f64, f64), log_scale: bool) -> bool {
    x.abs() <= LARGEST && y.abs() <= LARGEST && (!log_scale || y > 0.0)
}

/// Ticks of a log axis over `range` (positive): powers of ten, or 1-2-5 of each decade, or
/// every digit, whichever first gives at least four.
fn log_ticks(range: &Range<f64>) -> Vec<f64> {
    let decades = range.start.log10().floor() as i32..=range.end.log10().ceil() as i32;
    let mut ticks = Vec::new();
    for mantissas in [
        &[1.0][..],
        &[1.0, 2.0, 5.0],
        &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0],
    ] {
        ticks = decades
            .clone()
            .flat_map(|e| mantissas.iter().map(move |m| m * 10f64.powi(e)))
            .filter(|t| range.contains(t))
            .collect();
        if ticks.len() >= 4 {
            break;
        }
    }
    ticks
}

/// Tick labels that stay short: 12,500 as `12.5k`, 2,000,000 as `2M`, 2.0 as `2`, 0.25 as
/// `0.25` (at most three decimals, no trailing zeros).
fn short_number(v: f64) -> String {
    let (scaled, suffix, decimals) = match v.abs() {
        a if a >= 1e6 => (v / 1e6, "M", 1),
        a if a >= 1e4 => (v / 1e3, "k", 1),
        a if a >= 100.0 => (v, "", 0),
        _ => (v, "", 3),
    };
    let text = format!("{scaled:.decimals$}");
    let text = if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.')
    } else {
        &text
    };
    let text = if text == "-0" { "0" } else { text };
    format!("{text}{suffix}")
}

fn drawing_error<E: std::error::Error + Send + Sync>(
    path: &Path,
    e: DrawingAreaErrorKind<E>,
) -> Error {
    Error::format(path.display().to_string(), format!("drawing the plot: {e}"))
}

fn encode_png(rgb: &[u8], width: u32, height: u32, path: &Path) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    let mut encoder = png::Encoder::new(&mut bytes, width, height);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    encoder
        .write_header()
        .and_then(|mut w| w.write_image_data(rgb))
        .map_err(|e| Error::format(path.display().to_string(), format!("encoding the PNG: {e}")))?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_ticks_are_round_numbers() {
        assert_eq!(log_ticks(&(0.01..20.0)), [0.01, 0.1, 1.0, 10.0]);
        assert_eq!(log_ticks(&(0.15..12.0)), [0.2, 0.5, 1.0, 2.0, 5.0, 10.0]);
        let ticks: Vec<String> = log_ticks(&(0.45..2.5))
            .into_iter()
            .map(short_number)
            .collect();
        assert_eq!(ticks, ["0.5", "0.6", "0.7", "0.8", "0.9", "1", "2"]);
    }

    #[test]
    fn short_numbers() {
        assert_eq!(short_number(0.0), "0");
        assert_eq!(short_number(250.0), "250");
        assert_eq!(short_number(12_500.0), "12.5k");
        assert_eq!(short_number(2_000_000.0), "2M");
        assert_eq!(short_number(2.0), "2");
        assert_eq!(short_number(0.25), "0.25");
        assert_eq!(short_number(1.0 / 3.0), "0.333");
        assert_eq!(short_number(-0.0001), "0");
    }

    #[test]
    fn metrics_are_read_by_series() {
        let dir = std::env::temp_dir().join(format!("tessera-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("metrics.jsonl");
        std::fs::write(
            &path,
            "{\"step\": 10, \"loss\": 2.5, \"tokens_per_s\": 1000.0}\n\
             {\"step\": 10, \"eval\": {\"heldout_exact_match\": 0.25}}\n\
             {\"step\": 20, \"eval\": {\"validation_loss\": 2.0}}\n\
             {\"step\": 30, \"lo",
        )
        .unwrap();
        let m = Metrics::read(&path).unwrap();
        assert_eq!(m.loss, vec![(10.0, 2.5)]);
        assert_eq!(m.tokens_per_s, vec![(10.0, 1000.0)]);
        assert_eq!(m.exact_match, vec![(10.0, 25.0)]);
        assert_eq!(m.validation_loss, vec![(20.0, 2.0)]);
        for log_scale in [false, true] {
            let [svg, png] = write_plots(&m, &dir, log_scale).unwrap();
            let svg = std::fs::read_to_string(svg).unwrap();
            assert!(svg.contains("<svg") && svg.contains("held-out exact match"));
            let png = std::fs::read(png).unwrap();
            assert_eq!(&png[1..4], b"PNG");
        }
        // Axes spanning the whole f64 range made plotters loop without end.
        let extreme = Metrics {
            loss: vec![(-1e308, 1e308), (1e308, -1e308), (0.0, 5e-324), (1.0, 2.0)],
            ..Metrics::default()
        };
        for log_scale in [false, true] {
            write_plots(&extreme, &dir, log_scale).unwrap();
            write_plots(&Metrics::default(), &dir, log_scale).unwrap();
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
