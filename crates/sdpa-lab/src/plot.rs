//! PNG plots drawn in Rust with plotters, using the bundled DejaVu Sans font (so nothing depends
//! on the fonts a machine has installed).

use std::path::Path;
use std::sync::Once;

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::{CoordTranslate, Shift};
use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::context::LabError;

mod heatmap;
pub use heatmap::heatmap;

static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");
static REGISTER: Once = Once::new();

fn register_font() {
    REGISTER.call_once(|| {
        // The bytes are a valid TrueType font bundled with the crate; a failure would only
        // mean text is missing from the plots.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
        let _ = plotters::style::register_font("sans-serif", FontStyle::Bold, FONT);
    });
}

/// A palette that stays distinguishable when printed in grey.
pub const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// One line of a plot.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend label.
    pub label: String,
    /// (x, y) points, drawn in order.
    pub points: Vec<(f64, f64)>,
    /// Dashed reference line instead of a solid line with markers.
    pub dashed: bool,
    /// Markers only, no line (a scatter); hollow markers when `hollow`.
    pub markers_only: bool,
    /// Hollow markers (e.g. censored runs).
    pub hollow: bool,
    /// A thin line without markers (one of many seeds).
    pub thin: bool,
    /// A solid line without markers (a curve of many points, e.g. a share by step).
    pub curve: bool,
    /// The palette index of its colour (default: its position in the plot).
    pub color: Option<usize>,
    /// A shaded interval band around the line: (x, lower, upper), e.g. a 95% interval.
    pub band: Vec<(f64, f64, f64)>,
    /// Text drawn at each point instead of a marker (one per point; the series stays out of the
    /// legend): labels on the plot itself, e.g. which d_k a cluster of points is.
    pub texts: Vec<String>,
}

impl Series {
    /// A solid line with markers.
    pub fn line(label: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Self {
            label: label.into(),
            points,
            dashed: false,
            markers_only: false,
            hollow: false,
            thin: false,
            curve: false,
            color: None,
            band: Vec::new(),
            texts: Vec::new(),
        }
    }

    /// Markers only (a scatter), filled or hollow.
    pub fn scatter(label: impl Into<String>, points: Vec<(f64, f64)>, hollow: bool) -> Self {
        Self {
            markers_only: true,
            hollow,
            ..Self::line(label, points)
        }
    }

    /// A thin line without markers (one of many seeds; give it an empty label to keep it out
    /// of the legend).
    pub fn thin(label: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Self {
            thin: true,
            ..Self::line(label, points)
        }
    }

    /// A solid line with a shaded band: each point is (x, value, lower, upper).
    pub fn with_band(label: impl Into<String>, points: Vec<(f64, f64, f64, f64)>) -> Self {
        Self {
            band: points.iter().map(|p| (p.0, p.2, p.3)).collect(),
            ..Self::line(label, points.iter().map(|p| (p.0, p.1)).collect())
        }
    }

    /// A solid line without markers (a step curve of many points).
    pub fn curve(label: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Self {
            curve: true,
            ..Self::line(label, points)
        }
    }

    /// Labels on the plot: each text drawn at its point (data coordinates), in the series'
    /// colour, never in the legend.
    pub fn texts(points: Vec<(f64, f64, String)>) -> Self {
        Self {
            texts: points.iter().map(|p| p.2.clone()).collect(),
            ..Self::line("", points.iter().map(|p| (p.0, p.1)).collect())
        }
    }

    /// The same series in palette colour `i`.
    pub fn colored(mut self, i: usize) -> Self {
        self.color = Some(i);
        self
    }

    /// A dashed reference line.
    pub fn reference(label: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Self {
            dashed: true,
            ..Self::line(label, points)
        }
    }
}

/// A line plot.
#[derive(Debug, Clone)]
pub struct LinePlot {
    /// Title.
    pub title: String,
    /// X axis label.
    pub x_label: String,
    /// Y axis label.
    pub y_label: String,
    /// Logarithmic x axis.
    pub log_x: bool,
    /// Logarithmic y axis.
    pub log_y: bool,
    /// The lines.
    pub series: Vec<Series>,
}

/// Tick labels for an axis spanning `lo..hi`: plain numbers from 1e−4 to 1e5 (so that one axis
/// never mixes 1.0e-4 with 0.001), scientific beyond. On a log axis a tick is a power (of 2 or
/// 10) and gets four significant digits, so 0.125 reads 0.125, not 0.12; on a linear axis, as
/// many decimals as the span needs to tell neighbouring ticks apart.
fn tick(v: f64, lo: f64, hi: f64, log: bool) -> String {
    let a = v.abs();
    if a == 0.0 {
        return "0".into();
    }
    if !(1e-4..1e5).contains(&a) {
        return format!("{v:.1e}");
    }
    let decimals = if log {
        (3.0 - a.log10().floor()).clamp(0.0, 8.0) as usize
    } else {
        // The step between ticks is about a tenth of the span.
        let step = ((hi - lo) / 10.0).abs().max(1e-12);
        (-step.log10().floor()).clamp(0.0, 6.0) as usize
    };
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

fn bounds(values: impl Iterator<Item = f64>, log: bool) -> (f64, f64) {
    let v: Vec<f64> = values
        .filter(|x| x.is_finite() && (!log || *x > 0.0))
        .collect();
    if v.is_empty() {
        return if log { (0.1, 10.0) } else { (0.0, 1.0) };
    }
    let (lo, hi) = v
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| {
            (a.min(x), b.max(x))
        });
    if log {
        let (lo, hi) = if lo == hi {
            (lo / 2.0, hi * 2.0)
        } else {
            (lo, hi)
        };
        (lo / 1.3, hi * 1.3)
    } else {
        let pad = if hi > lo {
            0.06 * (hi - lo)
        } else {
            0.5_f64.max(hi.abs() * 0.1)
        };
        (lo - pad, hi + pad)
    }
}

/// The colour of series `i`: its own palette index, or its position.
fn color_of(s: &Series, i: usize) -> RGBColor {
    COLORS[s.color.unwrap_or(i) % COLORS.len()]
}

/// The points of `s` a plot's axes can show (positive where an axis is logarithmic).
fn usable(plot: &LinePlot, a: f64, b: f64) -> bool {
    a.is_finite() && b.is_finite() && (!plot.log_x || a > 0.0) && (!plot.log_y || b > 0.0)
}

/// The shaded band of series `i`, lighter when many bands overlap.
fn draw_band<'a, DB, CT>(
    chart: &mut ChartContext<'a, DB, CT>,
    plot: &LinePlot,
    i: usize,
    s: &Series,
) -> Result<(), String>
where
    DB: DrawingBackend + 'a,
    CT: CoordTranslate<From = (f64, f64)>,
{
    let color = color_of(s, i);
    let band: Vec<(f64, f64, f64)> = s
        .band
        .iter()
        .copied()
        .filter(|(x, lo, hi)| usable(plot, *x, *lo) && usable(plot, *x, *hi))
        .collect();
    let banded = plot.series.iter().filter(|s| s.band.len() >= 2).count();
    let alpha = if banded <= 2 { 0.28 } else { 0.14 };
    if band.len() >= 2 {
        let outline: Vec<(f64, f64)> = band
            .iter()
            .map(|(x, _, hi)| (*x, *hi))
            .chain(band.iter().rev().map(|(x, lo, _)| (*x, *lo)))
            .collect();
        chart
            .draw_series(std::iter::once(Polygon::new(
                outline,
                color.mix(alpha).filled(),
            )))
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The line (or markers) of series `i`.
fn draw_series<'a, DB, CT>(
    chart: &mut ChartContext<'a, DB, CT>,
    plot: &LinePlot,
    i: usize,
    s: &Series,
) -> Result<(), String>
where
    DB: DrawingBackend + 'a,
    CT: CoordTranslate<From = (f64, f64)>,
{
    let color = color_of(s, i);
    let pts: Vec<(f64, f64)> = s
        .points
        .iter()
        .copied()
        .filter(|(a, b)| usable(plot, *a, *b))
        .collect();
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    if !s.texts.is_empty() {
        let font = ("sans-serif", 15).into_font().color(&color);
        chart
            .draw_series(
                s.points
                    .iter()
                    .zip(&s.texts)
                    .filter(|((a, b), _)| usable(plot, *a, *b))
                    .map(|(p, t)| Text::new(t.clone(), *p, font.clone())),
            )
            .map_err(err)?;
    } else if s.markers_only {
        let style = if s.hollow {
            color.stroke_width(1)
        } else {
            color.mix(0.7).filled()
        };
        chart
            .draw_series(pts.into_iter().map(|p| Circle::new(p, 4, style)))
            .map_err(err)?;
    } else if s.dashed {
        chart
            .draw_series(DashedLineSeries::new(pts, 8, 5, color.stroke_width(2)))
            .map_err(err)?;
    } else if s.thin {
        chart
            .draw_series(LineSeries::new(pts, color.mix(0.35).stroke_width(1)))
            .map_err(err)?;
    } else if s.curve {
        chart
            .draw_series(LineSeries::new(pts, color.stroke_width(2)))
            .map_err(err)?;
    } else {
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(err)?;
        chart
            .draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled())))
            .map_err(err)?;
    }
    Ok(())
}

fn draw_lines<XR, YR>(
    area: &DrawingArea<BitMapBackend<'_>, Shift>,
    plot: &LinePlot,
    x: XR,
    y: YR,
    (x0, x1, y0, y1): (f64, f64, f64, f64),
) -> Result<(), String>
where
    XR: AsRangedCoord<Value = f64>,
    YR: AsRangedCoord<Value = f64>,
    XR::CoordDescType: ValueFormatter<f64>,
    YR::CoordDescType: ValueFormatter<f64>,
{
    let mut chart = ChartBuilder::on(area)
        .caption(&plot.title, ("sans-serif", 22))
        .margin(14)
        .x_label_area_size(52)
        .y_label_area_size(84)
        .build_cartesian_2d(x, y)
        .map_err(|e| e.to_string())?;
    let (log_x, log_y) = (plot.log_x, plot.log_y);
    chart
        .configure_mesh()
        .x_desc(&plot.x_label)
        .y_desc(&plot.y_label)
        .x_labels(label_count(7, log_x, x0, x1))
        .y_labels(label_count(8, log_y, y0, y1))
        .x_label_formatter(&|v| tick(*v, x0, x1, log_x))
        .y_label_formatter(&|v| tick(*v, y0, y1, log_y))
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 18))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(|e| e.to_string())?;
    // Every band first, so that no band covers another series' line; dashed reference lines
    // last, so that a curve lying on one (a measurement that matches its reference) does not
    // hide it.
    for (i, s) in plot.series.iter().enumerate() {
        draw_band(&mut chart, plot, i, s)?;
    }
    for dashed in [false, true] {
        for (i, s) in plot.series.iter().enumerate() {
            if s.dashed == dashed {
                draw_series(&mut chart, plot, i, s)?;
            }
        }
    }
    Ok(())
}

/// The legend, in its own column right of the plot (it never covers data).
fn draw_legend(
    area: &DrawingArea<BitMapBackend<'_>, Shift>,
    plot: &LinePlot,
) -> Result<(), String> {
    let mut y = 60;
    for (i, s) in plot.series.iter().enumerate() {
        if s.label.is_empty() {
            continue;
        }
        let color = color_of(s, i);
        let sample: Vec<(i32, i32)> = vec![(6, y), (34, y)];
        if s.markers_only {
            let style = if s.hollow {
                color.stroke_width(1)
            } else {
                color.mix(0.7).filled()
            };
            area.draw(&Circle::new((20, y), 4, style))
                .map_err(|e| e.to_string())?;
        } else if s.dashed {
            area.draw(&PathElement::new(
                vec![(6, y), (14, y)],
                color.stroke_width(2),
            ))
            .and_then(|_| {
                area.draw(&PathElement::new(
                    vec![(20, y), (28, y)],
                    color.stroke_width(2),
                ))
            })
            .map_err(|e| e.to_string())?;
        } else {
            let width = if s.thin { 1 } else { 2 };
            area.draw(&PathElement::new(sample, color.stroke_width(width)))
                .map_err(|e| e.to_string())?;
        }
        area.draw(&Text::new(
            s.label.clone(),
            (42, y - 8),
            ("sans-serif", 14).into_font(),
        ))
        .map_err(|e| e.to_string())?;
        y += 22;
    }
    Ok(())
}

/// How many tick labels an axis asks for: `linear` on a linear axis; on a log axis one per
/// power of its base in range (so that 1 and every power between get a tick: asked for fewer,
/// plotters labels every other power), at least `linear`.
fn label_count(linear: usize, log: bool, lo: f64, hi: f64) -> usize {
    if !log || lo <= 0.0 {
        return linear;
    }
    let b = log_base(lo, hi).ln();
    let powers = ((hi.ln() / b).floor() - (lo.ln() / b).ceil() + 1.0).max(0.0) as usize;
    powers.clamp(linear, 12)
}

/// The base of a log axis's ticks: powers of 2 over spans up to 2¹⁰ (the lab's sizes are powers
/// of 2, and a decade-only axis labels two or three ticks), powers of 10 beyond.
fn log_base(lo: f64, hi: f64) -> f64 {
    if lo > 0.0 && hi / lo <= 1024.0 {
        2.0
    } else {
        10.0
    }
}

/// Draws into an RGB buffer of `size` with `draw`, then writes it to `path` as a PNG, atomically
/// (a kill leaves the old plot or the new one, never a truncated file; no link is followed).
fn draw_png(
    path: &Path,
    size: (u32, u32),
    draw: impl FnOnce(DrawingArea<BitMapBackend<'_>, Shift>) -> Result<(), LabError>,
) -> Result<(), LabError> {
    let mut pixels = vec![0u8; size.0 as usize * size.1 as usize * 3];
    draw(BitMapBackend::with_buffer(&mut pixels, size).into_drawing_area())?;
    let mut bytes = Vec::new();
    {
        let mut encoder = png::Encoder::new(&mut bytes, size.0, size.1);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder.write_header().map_err(|e| LabError::io(path, e))?;
        writer
            .write_image_data(&pixels)
            .map_err(|e| LabError::io(path, e))?;
    }
    crate::files::write_atomic(path, &bytes)
}

/// Draws a line plot to a PNG file (1100 × 600: the plot, and the legend in a column beside it).
pub fn line_plot(path: &Path, plot: &LinePlot) -> Result<(), LabError> {
    register_font();
    draw_png(path, (1100, 600), |root| line_plot_on(path, plot, root))
}

fn line_plot_on(
    path: &Path,
    plot: &LinePlot,
    root: DrawingArea<BitMapBackend<'_>, Shift>,
) -> Result<(), LabError> {
    root.fill(&WHITE).map_err(|e| LabError::io(path, e))?;
    let (chart_area, legend_area) = root.split_horizontally(800);
    let xs = plot
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0));
    let ys = plot.series.iter().flat_map(|s| {
        s.points
            .iter()
            .map(|p| p.1)
            .chain(s.band.iter().flat_map(|b| [b.1, b.2]))
    });
    let (x0, x1) = bounds(xs, plot.log_x);
    let (y0, y1) = bounds(ys, plot.log_y);
    let r = (x0, x1, y0, y1);
    let (bx, by) = (log_base(x0, x1), log_base(y0, y1));
    let result = match (plot.log_x, plot.log_y) {
        (true, true) => draw_lines(
            &chart_area,
            plot,
            (x0..x1).log_scale().base(bx),
            (y0..y1).log_scale().base(by),
            r,
        ),
        (true, false) => draw_lines(&chart_area, plot, (x0..x1).log_scale().base(bx), y0..y1, r),
        (false, true) => draw_lines(&chart_area, plot, x0..x1, (y0..y1).log_scale().base(by), r),
        (false, false) => draw_lines(&chart_area, plot, x0..x1, y0..y1, r),
    };
    result.map_err(|e| LabError::io(path, e))?;
    draw_legend(&legend_area, plot).map_err(|e| LabError::io(path, e))?;
    root.present().map_err(|e| LabError::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::tick;

    #[test]
    fn log_ticks_keep_their_digits_and_one_notation() {
        assert_eq!(tick(0.125, 0.05, 2.0, true), "0.125");
        assert_eq!(tick(0.0625, 0.05, 2.0, true), "0.0625");
        assert_eq!(tick(1024.0, 16.0, 1024.0, true), "1024");
        // One axis from 1e-4 to 1e-1: every tick plain.
        assert_eq!(tick(1e-4, 1e-4, 0.1, true), "0.0001");
        assert_eq!(tick(0.001, 1e-4, 0.1, true), "0.001");
        assert_eq!(tick(3e-5, 1e-5, 0.1, true), "3.0e-5");
    }

    #[test]
    fn a_log_axis_asks_for_every_power() {
        // 0.1 … 60 in powers of 2: 2^-3 … 2^5, nine powers, 1 among them.
        assert_eq!(super::label_count(8, true, 0.1, 60.0), 9);
        assert_eq!(super::label_count(8, false, 0.1, 60.0), 8);
        // Wider than 2^10: powers of 10, fewer than asked for, so the count stays.
        assert_eq!(super::label_count(8, true, 0.01, 60.0), 8);
    }

    #[test]
    fn linear_ticks_have_the_decimals_the_span_needs() {
        assert_eq!(tick(0.5, 0.0, 1.0, false), "0.5");
        assert_eq!(tick(300.0, 0.0, 1500.0, false), "300");
    }
}
