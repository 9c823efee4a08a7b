//! Small SVG chart renderer (line and grouped bar charts) for reports, built on `plotters`.
//!
//! Everything is rendered into an in-memory SVG string of fixed size (800x450) so callers can
//! embed it in HTML/Markdown or write it to disk. Text is emitted as SVG `<text>` elements;
//! because no font feature is enabled, text widths are *estimated* (see [`text_width`]) and the
//! layout (legend wrapping, category label wrapping) is computed from those estimates.

use plotters::coord::Shift;
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::FontTransform;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// Canvas size in pixels; fixed so every chart in a report lines up.
const WIDTH: u32 = 800;
const HEIGHT: u32 = 450;
const FONT: &str = "sans-serif";
/// Plotters font sizes; the SVG backend writes `font-size = size / 1.24`.
const TITLE_SIZE: f64 = 22.0;
const LEGEND_SIZE: f64 = 15.0;
const AXIS_DESC_SIZE: f64 = 16.0;
const TICK_SIZE: f64 = 14.0;
const VALUE_SIZE: f64 = 12.0;
const LEGEND_ROW_H: i32 = 20;
/// Longer names are truncated so a single series cannot push the legend off the canvas.
const MAX_LEGEND_CHARS: usize = 40;
/// Fraction of the data span added on each side of an axis.
const PAD: f64 = 0.1;

/// Tableau-10 palette: distinguishable and reasonably colour-blind friendly.
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];
const GRID_BOLD: RGBColor = RGBColor(215, 215, 215);
const TEXT_COLOR: RGBColor = RGBColor(30, 30, 30);
const REFERENCE_COLOR: RGBColor = RGBColor(60, 60, 60);

/// Errors from chart rendering.
#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    /// Plotters failed while drawing; its error types are generic over the backend, so they are
    /// flattened to a string to keep this enum simple.
    #[error("chart drawing failed: {0}")]
    Drawing(String),
}

impl<E: std::error::Error + Send + Sync> From<DrawingAreaErrorKind<E>> for ChartError {
    fn from(e: DrawingAreaErrorKind<E>) -> Self {
        ChartError::Drawing(e.to_string())
    }
}

/// One named line in a [`LineChart`]. Points are drawn in the given order (not sorted).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// A line chart with markers at every point. Non-finite points (and non-positive ones on a log
/// axis) are skipped and break the line at that spot.
#[derive(Debug, Clone, Default)]
pub struct LineChart<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    pub series: &'a [Series],
    pub log_x: bool,
    pub log_y: bool,
}

/// One x category of a [`BarChart`]: bars keyed by series name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BarGroup {
    pub label: String,
    pub bars: Vec<(String, f64)>,
}

/// A grouped bar chart. Colours are assigned per series name in order of first appearance,
/// so the same series has the same colour in every group.
#[derive(Debug, Clone, Default)]
pub struct BarChart<'a> {
    pub title: &'a str,
    pub y_label: &'a str,
    pub groups: &'a [BarGroup],
    /// Optional dashed horizontal line, e.g. `(1.0, "best static")`; its label goes in the legend
    /// so it can never overlap the bars.
    pub reference: Option<(f64, &'a str)>,
    /// Print each bar's value above (or below, if negative) the bar; rotated when wider than the
    /// bar, and skipped altogether when bars are too narrow for even rotated text. Off by default
    /// because it gets busy with many bars.
    pub show_values: bool,
}

/// Renders a line chart to an SVG document.
pub fn line_chart(c: &LineChart<'_>) -> Result<String, ChartError> {
    // Split every series into runs of drawable points; a skipped point breaks the line rather
    // than silently joining its neighbours.
    let runs: Vec<Vec<Vec<(f64, f64)>>> = c
        .series
        .iter()
        .map(|s| {
            let mut out: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
            for &(x, y) in &s.points {
                if drawable(x, c.log_x) && drawable(y, c.log_y) {
                    if let Some(last) = out.last_mut() {
                        // Log axes are plotted as linear axes over log10 values (see `Axis`).
                        last.push((to_axis(x, c.log_x), to_axis(y, c.log_y)));
                    }
                } else if out.last().is_some_and(|r| !r.is_empty()) {
                    out.push(Vec::new());
                }
            }
            out.retain(|r| !r.is_empty());
            out
        })
        .collect();
    let all = runs.iter().flatten().flatten();
    let x_axis = Axis::new(axis_range(all.clone().map(|p| p.0), c.log_x), c.log_x, 8);
    let y_axis = Axis::new(axis_range(all.map(|p| p.1), c.log_y), c.log_y, 6);

    let legend: Vec<LegendItem> = c
        .series
        .iter()
        .enumerate()
        .map(|(i, s)| LegendItem {
            name: truncate(&s.name, MAX_LEGEND_CHARS),
            color: color(i),
            swatch: Swatch::Line(i),
        })
        .collect();

    render(|root| {
        let body = draw_header(root, c.title, &legend)?;
        plot_lines(root, &body, c, &runs, &x_axis, &y_axis)
    })
}

/// Renders a grouped bar chart to an SVG document. Non-finite bar values are not drawn.
pub fn bar_chart(c: &BarChart<'_>) -> Result<String, ChartError> {
    let names = series_names(c.groups);
    let reference = c.reference.filter(|r| r.0.is_finite());

    let mut legend: Vec<LegendItem> = names
        .iter()
        .enumerate()
        .map(|(i, n)| LegendItem {
            name: truncate(n, MAX_LEGEND_CHARS),
            color: color(i),
            swatch: Swatch::Box,
        })
        .collect();
    if let Some((_, label)) = reference {
        legend.push(LegendItem {
            name: truncate(label, MAX_LEGEND_CHARS),
            color: REFERENCE_COLOR,
            swatch: Swatch::Dashed,
        });
    }

    // Bars always start at zero, so zero must be on the axis; the reference line must be too.
    let values = c
        .groups
        .iter()
        .flat_map(|g| g.bars.iter().map(|b| b.1))
        .chain(reference.map(|r| r.0))
        .filter(|v| v.is_finite());
    let (lo, hi) = bar_value_range(values, c.show_values);
    let y_axis = Axis::with_ticks(lo, hi, linear_ticks(lo, hi, 8));

    let n_groups = c.groups.len().max(1);
    let max_bars = c
        .groups
        .iter()
        .map(|g| g.bars.len())
        .max()
        .unwrap_or(0)
        .max(1);

    render(|root| {
        let body = draw_header(root, c.title, &legend)?;
        let (bw, bh) = body.dim_in_pixel();
        // Category labels are drawn by hand (plotters has no multi-line labels), so the label
        // area is sized from the same estimate used to lay them out.
        let margin = 12;
        let y_area = 75;
        let plot_w = f64::from(bw) - f64::from(2 * margin + y_area);
        let group_px = (plot_w / n_groups as f64).max(1.0);
        let labels = CategoryLabels::layout(c.groups, group_px, f64::from(bh) * 0.3);

        let mut chart = ChartBuilder::on(&body)
            .margin(margin)
            .x_label_area_size(labels.area_height)
            .y_label_area_size(y_area)
            // No x key points: category labels are drawn below by hand.
            .build_cartesian_2d(
                Axis::with_ticks(0.0, n_groups as f64, Vec::new()),
                y_axis.clone(),
            )?;
        chart
            .configure_mesh()
            .y_desc(c.y_label)
            .y_label_formatter(&|v| y_axis.label(*v))
            .label_style(text_style(TICK_SIZE))
            .axis_desc_style(text_style(AXIS_DESC_SIZE))
            .bold_line_style(GRID_BOLD)
            .draw()?;

        // Bars share one width across groups so equal values look equal everywhere; each group's
        // bars are centred in its slot, leaving 20% of the slot as a gap between groups.
        let bar_w = 0.8 / max_bars as f64;
        let mut value_labels = Vec::new();
        for (gi, g) in c.groups.iter().enumerate() {
            let start = gi as f64 + 0.5 - bar_w * g.bars.len() as f64 / 2.0;
            for (bi, (name, v)) in g.bars.iter().enumerate() {
                if !v.is_finite() {
                    continue;
                }
                let x0 = start + bi as f64 * bar_w + bar_w * 0.05;
                let x1 = x0 + bar_w * 0.9;
                let ci = names.iter().position(|n| n == name).unwrap_or(0);
                chart.draw_series(std::iter::once(Rectangle::new(
                    [(x0, 0.0), (x1, *v)],
                    color(ci).filled(),
                )))?;
                let (px0, _) = chart.backend_coord(&(x0, *v));
                let (px1, py) = chart.backend_coord(&(x1, *v));
                value_labels.push(((px0 + px1) / 2, py, px1 - px0, *v));
            }
        }

        if let Some((r, _)) = reference {
            let (x0, y) = chart.backend_coord(&(0.0, r));
            let (x1, _) = chart.backend_coord(&(n_groups as f64, r));
            draw_dashed(root, x0, x1, y, REFERENCE_COLOR, 2)?;
        }

        // Bars narrower than a line of (rotated) text would get overlapping labels; print no
        // values at all then rather than an unreadable smear.
        let bar_px = value_labels.iter().map(|l| l.2).min().unwrap_or(0);
        if c.show_values && f64::from(bar_px) >= VALUE_SIZE / 1.24 + 3.0 {
            for (cx, py, bar_px, v) in value_labels {
                draw_value_label(root, cx, py, bar_px, v)?;
            }
        }

        let (_, y_base) = chart.backend_coord(&(0.0, lo));
        for (gi, lines) in labels.lines.iter().enumerate() {
            let (cx, _) = chart.backend_coord(&(gi as f64 + 0.5, lo));
            labels.draw(root, cx, y_base + 6, lines)?;
        }
        Ok(())
    })
}

/// Divides every bar in a group by that group's bar named `by`, so groups whose magnitudes
/// differ by orders of magnitude become comparable. Groups without a usable divisor (missing,
/// zero or non-finite) are left out rather than producing infinities.
pub fn normalize_groups(groups: &[BarGroup], by: &str) -> Vec<BarGroup> {
    groups
        .iter()
        .filter_map(|g| {
            let d = g.bars.iter().find(|b| b.0 == by)?.1;
            if !d.is_finite() || d == 0.0 {
                return None;
            }
            Some(BarGroup {
                label: g.label.clone(),
                bars: g.bars.iter().map(|(n, v)| (n.clone(), v / d)).collect(),
            })
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Rendering helpers
// ---------------------------------------------------------------------------------------------

type Area<'b> = DrawingArea<SVGBackend<'b>, Shift>;

/// Creates the canvas, runs `draw` on it and returns the finished SVG text.
fn render(draw: impl FnOnce(&Area<'_>) -> Result<(), ChartError>) -> Result<String, ChartError> {
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE)?;
        draw(&root)?;
        root.present()?;
    }
    Ok(buf)
}

/// Draws the lines, markers and axes of a line chart on `body` (markers go on `root` in pixel
/// coordinates so the same marker code serves the plot and the legend).
fn plot_lines(
    root: &Area<'_>,
    body: &Area<'_>,
    c: &LineChart<'_>,
    runs: &[Vec<Vec<(f64, f64)>>],
    x: &Axis,
    y: &Axis,
) -> Result<(), ChartError> {
    let mut chart = ChartBuilder::on(body)
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(75)
        .build_cartesian_2d(x.clone(), y.clone())?;
    chart
        .configure_mesh()
        .x_desc(c.x_label)
        .y_desc(c.y_label)
        .x_label_formatter(&|v| x.label(*v))
        .y_label_formatter(&|v| y.label(*v))
        .label_style(text_style(TICK_SIZE))
        .axis_desc_style(text_style(AXIS_DESC_SIZE))
        .bold_line_style(GRID_BOLD)
        .draw()?;

    for (i, series_runs) in runs.iter().enumerate() {
        let col = color(i);
        let n: usize = series_runs.iter().map(Vec::len).sum();
        // Dense series get smaller markers so the line stays visible.
        let r = match n {
            0..=40 => 4,
            41..=150 => 3,
            _ => 2,
        };
        for run in series_runs {
            chart.draw_series(LineSeries::new(run.iter().copied(), col.stroke_width(2)))?;
        }
        for p in series_runs.iter().flatten() {
            draw_marker(root, chart.backend_coord(p), i, r, col)?;
        }
    }
    Ok(())
}

fn drawable(v: f64, log: bool) -> bool {
    v.is_finite() && (!log || v > 0.0)
}

fn to_axis(v: f64, log: bool) -> f64 {
    if log { v.log10() } else { v }
}

/// One axis in plot coordinates, usable directly as a plotters coordinate. Log axes are plotted
/// as linear axes over log10 values with our own tick positions: this keeps one coordinate type
/// for all cases and avoids plotters' log tick labels, which can be dense or duplicated. (A
/// custom type because plotters' `with_key_points` wrapper loses the f64 label formatter.)
#[derive(Clone)]
struct Axis {
    inner: RangedCoordf64,
    log: bool,
    ticks: Vec<f64>,
}

impl Axis {
    fn new((lo, hi): (f64, f64), log: bool, target: usize) -> Self {
        let ticks = if log {
            log_ticks(lo, hi, target)
        } else {
            linear_ticks(lo, hi, target)
        };
        Axis {
            inner: (lo..hi).into(),
            log,
            ticks,
        }
    }

    fn with_ticks(lo: f64, hi: f64, ticks: Vec<f64>) -> Self {
        Axis {
            inner: (lo..hi).into(),
            log: false,
            ticks,
        }
    }

    fn label(&self, v: f64) -> String {
        if self.log {
            return fmt_num(10f64.powf(v));
        }
        match self.ticks.as_slice() {
            [a, b, ..] => fmt_tick(v, b - a),
            _ => fmt_num(v),
        }
    }
}

impl Ranged for Axis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.inner.map(value, limit)
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        // Only bold grid lines: the light sub-grid made the plots look busy.
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.ticks.clone()
        }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.inner.range()
    }
}

/// "Nice" tick positions (1, 2 or 5 times a power of ten) covering `lo..=hi`, about `target` of
/// them.
fn linear_ticks(lo: f64, hi: f64, target: usize) -> Vec<f64> {
    let span = hi - lo;
    if !(span.is_finite() && span > 0.0) {
        return vec![lo];
    }
    let raw = span / target.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let norm = raw / mag;
    // Round to the nearest nice step so the tick count stays close to `target`.
    let mult = if norm < 1.5 {
        1.0
    } else if norm < 3.0 {
        2.0
    } else if norm < 7.0 {
        5.0
    } else {
        10.0
    };
    let step = mult * mag;
    let first = (lo / step).ceil() as i64;
    // Ticks are k * mult * 10^e computed with one rounding (dividing by 10^-e for small steps)
    // so they come out as 0.6 rather than 0.6000000000000001; accumulating would drift.
    let scale = 10f64.powi(mag.log10().round() as i32);
    let inv = 10f64.powi(-(mag.log10().round() as i32));
    (first..first + 1000)
        .map(|k| {
            let units = k as f64 * mult;
            if scale < 1.0 {
                units / inv
            } else {
                units * scale
            }
        })
        .take_while(|v| *v <= hi + step * 1e-9)
        .collect()
}

/// Tick positions for a log axis given in log10 units: whole decades, thinned out for wide
/// ranges, with 2x and 5x (or every digit) added for narrow ones.
fn log_ticks(lo: f64, hi: f64, target: usize) -> Vec<f64> {
    let decades = hi - lo;
    if !(decades.is_finite() && decades > 0.0) {
        return vec![lo];
    }
    let mults: &[f64] = if decades > 2.5 {
        &[1.0]
    } else if decades > 1.0 {
        &[1.0, 2.0, 5.0]
    } else {
        &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]
    };
    let every = (decades / target.max(1) as f64).ceil().max(1.0) as i64;
    let mut ticks = Vec::new();
    for d in (lo.floor() as i64)..=(hi.ceil() as i64) {
        if d.rem_euclid(every) != 0 {
            continue;
        }
        for m in mults {
            let t = d as f64 + m.log10();
            if t >= lo - 1e-9 && t <= hi + 1e-9 {
                ticks.push(t);
            }
        }
    }
    if ticks.len() < 2 {
        // Less than a decade with no round numbers in it: fall back to linear ticks on the
        // actual values.
        ticks = linear_ticks(10f64.powf(lo), 10f64.powf(hi), target)
            .into_iter()
            .filter(|v| *v > 0.0)
            .map(f64::log10)
            .collect();
    }
    ticks
}

/// Padded axis range (in axis units, i.e. log10 for log axes) over the given values, which are
/// already filtered and transformed. Handles no values and a single distinct value, which would
/// otherwise give plotters an empty range.
fn axis_range(values: impl Iterator<Item = f64>, log: bool) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if lo > hi {
        return (0.0, 1.0);
    }
    if log {
        // In log10 units: a single value gets half a decade either side.
        let pad = if hi > lo { (hi - lo) * PAD } else { 0.5 };
        return (lo - pad, hi + pad);
    }
    let pad = if hi > lo {
        (hi - lo) * PAD
    } else if lo != 0.0 {
        lo.abs() * PAD
    } else {
        1.0
    };
    let (mut a, mut b) = (lo - pad, hi + pad);
    // Don't let padding invent negative values for non-negative data (and vice versa). Only
    // with a real span: for all-zero data clamping both ends would leave an empty range.
    if hi > lo {
        if lo >= 0.0 && a < 0.0 {
            a = 0.0;
        }
        if hi <= 0.0 && b > 0.0 {
            b = 0.0;
        }
    }
    (a, b)
}

/// Value range for bars: always includes zero, padded away from zero only. Extra headroom is
/// left for value labels.
fn bar_value_range(values: impl Iterator<Item = f64>, show_values: bool) -> (f64, f64) {
    let (mut lo, mut hi) = (0.0f64, 0.0f64);
    for v in values {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if lo == hi {
        return (0.0, 1.0);
    }
    let pad = (hi - lo) * if show_values { 2.0 * PAD } else { PAD };
    let a = if lo < 0.0 { lo - pad } else { 0.0 };
    let b = if hi > 0.0 { hi + pad } else { 0.0 };
    (a, b)
}

/// Series names in order of first appearance across groups; defines the colour of each name.
fn series_names(groups: &[BarGroup]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for g in groups {
        for (n, _) in &g.bars {
            if !names.contains(n) {
                names.push(n.clone());
            }
        }
    }
    names
}

fn color(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

fn text_style(size: f64) -> TextStyle<'static> {
    TextStyle::from((FONT, size).into_font()).color(&TEXT_COLOR)
}

/// Estimated rendered width in pixels of `text` at plotters font size `size`.
///
/// Without a font feature nobody knows real glyph widths (the browser picks the font), so this
/// assumes an average glyph of 0.6 em, a bit wider than typical sans-serif text so layouts err
/// on the side of spare room. Counts chars, so wide (e.g. CJK) scripts are underestimated.
fn text_width(text: &str, size: f64) -> f64 {
    text.chars().count() as f64 * size / 1.24 * 0.6
}

/// Shortens `s` to at most `max` chars, marking the cut with an ellipsis.
fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// Shortens `s` so its estimated width fits in `px`.
fn fit(s: &str, size: f64, px: f64) -> String {
    let per_char = text_width("x", size);
    let max = (px / per_char).floor().max(1.0) as usize;
    truncate(s, max)
}

/// SI suffixes used for large magnitudes; beyond the last one numbers go scientific.
const SI: [(f64, &str); 4] = [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")];

/// Compact number format for value labels (and log-axis ticks): about 3 significant digits,
/// SI suffixes from 10 000 up ("45k", "1.2M") and scientific notation for tiny or huge
/// magnitudes, so labels stay short.
fn fmt_num(v: f64) -> String {
    let a = v.abs();
    if !v.is_finite() || a == 0.0 {
        // Also maps -0.0 to "0".
        return if v.is_finite() {
            "0".to_string()
        } else {
            v.to_string()
        };
    }
    if !(1e-3..1e15).contains(&a) {
        return fmt_sci(v);
    }
    let (scale, suffix) = si_scale(a);
    let m = v / scale;
    let decimals = (2 - m.abs().log10().floor() as i32).max(0) as usize;
    format!("{}{suffix}", trim_zeros(&format!("{m:.decimals$}")))
}

/// Tick label for a linear axis with tick spacing `step`: same style as [`fmt_num`], but with
/// as many decimals as the spacing needs so neighbouring ticks never print the same text.
fn fmt_tick(v: f64, step: f64) -> String {
    let a = v.abs();
    if !(v.is_finite() && step.is_finite() && step > 0.0) || a < step * 1e-9 {
        return fmt_num(if a < step * 1e-9 { 0.0 } else { v });
    }
    if a >= 1e15 {
        return fmt_sci(v);
    }
    let (scale, suffix) = si_scale(a);
    // Fewest decimals that represent the step exactly (0.25 needs 2, 0.2 needs 1).
    let st = step / scale;
    let Some(decimals) = (0..=6usize).find(|d| {
        let x = st * 10f64.powi(*d as i32);
        (x - x.round()).abs() < 1e-6 * x.max(1.0)
    }) else {
        return fmt_sci(v);
    };
    format!(
        "{}{suffix}",
        trim_zeros(&format!("{:.decimals$}", v / scale))
    )
}

fn si_scale(a: f64) -> (f64, &'static str) {
    // Suffixes start at 10k: "2500" reads better than "2.5k".
    if a < 1e4 {
        return (1.0, "");
    }
    SI.iter()
        .copied()
        .find(|(s, _)| a >= *s)
        .unwrap_or((1.0, ""))
}

fn fmt_sci(v: f64) -> String {
    let s = format!("{v:.2e}");
    // "1.50e-6" -> "1.5e-6", "1.00e20" -> "1e20"
    match s.split_once('e') {
        Some((m, e)) => format!("{}e{e}", trim_zeros(m)),
        None => s,
    }
}

fn trim_zeros(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

// ---------------------------------------------------------------------------------------------
// Title and legend
// ---------------------------------------------------------------------------------------------

enum Swatch {
    Box,
    /// Line with the marker shape of the given series index.
    Line(usize),
    Dashed,
}

struct LegendItem {
    name: String,
    color: RGBColor,
    swatch: Swatch,
}

const SWATCH_W: i32 = 24;
const SWATCH_GAP: i32 = 6;
const ITEM_GAP: i32 = 20;

/// Draws the title and a centred, wrapping legend above the plot, and returns the area left for
/// the plot. Keeping the legend outside the plot means it can never hide data.
fn draw_header<'b>(
    root: &Area<'b>,
    title: &str,
    legend: &[LegendItem],
) -> Result<Area<'b>, ChartError> {
    let w = WIDTH as i32;
    let mut y = 10;
    if !title.is_empty() {
        let t = fit(title, TITLE_SIZE, f64::from(w - 20));
        let style = text_style(TITLE_SIZE).pos(Pos::new(HPos::Center, VPos::Top));
        root.draw(&Text::new(t, (w / 2, y), style))?;
        y += 30;
    }

    let item_w =
        |it: &LegendItem| SWATCH_W + SWATCH_GAP + text_width(&it.name, LEGEND_SIZE).ceil() as i32;
    let mut rows: Vec<Vec<&LegendItem>> = Vec::new();
    let mut row_w = 0;
    for it in legend {
        let iw = item_w(it);
        match rows.last_mut() {
            Some(row) if row_w + ITEM_GAP + iw <= w - 40 => {
                row.push(it);
                row_w += ITEM_GAP + iw;
            }
            _ => {
                rows.push(vec![it]);
                row_w = iw;
            }
        }
    }
    for row in &rows {
        let total: i32 =
            row.iter().map(|it| item_w(it)).sum::<i32>() + ITEM_GAP * (row.len() as i32 - 1);
        let mut x = (w - total) / 2;
        let cy = y + LEGEND_ROW_H / 2;
        for it in row {
            draw_swatch(root, it, x, cy)?;
            let style = text_style(LEGEND_SIZE).pos(Pos::new(HPos::Left, VPos::Center));
            root.draw(&Text::new(
                it.name.clone(),
                (x + SWATCH_W + SWATCH_GAP, cy),
                style,
            ))?;
            x += item_w(it) + ITEM_GAP;
        }
        y += LEGEND_ROW_H;
    }
    y += 4;
    let (_, body) = root.split_vertically(y);
    Ok(body)
}

fn draw_swatch(root: &Area<'_>, it: &LegendItem, x: i32, cy: i32) -> Result<(), ChartError> {
    match it.swatch {
        Swatch::Box => {
            root.draw(&Rectangle::new(
                [(x + 5, cy - 7), (x + 19, cy + 7)],
                it.color.filled(),
            ))?;
        }
        Swatch::Line(shape) => {
            root.draw(&PathElement::new(
                vec![(x, cy), (x + SWATCH_W, cy)],
                it.color.stroke_width(2),
            ))?;
            draw_marker(root, (x + SWATCH_W / 2, cy), shape, 4, it.color)?;
        }
        Swatch::Dashed => draw_dashed(root, x, x + SWATCH_W, cy, it.color, 2)?,
    }
    Ok(())
}

/// Marker shapes cycle with the series index so series stay distinguishable without colour.
fn draw_marker(
    root: &Area<'_>,
    (x, y): (i32, i32),
    shape: usize,
    r: i32,
    col: RGBColor,
) -> Result<(), ChartError> {
    let style = col.filled();
    match shape % 4 {
        0 => root.draw(&Circle::new((x, y), r, style))?,
        1 => root.draw(&Rectangle::new(
            [(x - r + 1, y - r + 1), (x + r - 1, y + r - 1)],
            style,
        ))?,
        2 => root.draw(&Polygon::new(
            vec![(x, y - r - 1), (x + r + 1, y + r), (x - r - 1, y + r)],
            style,
        ))?,
        _ => root.draw(&Polygon::new(
            vec![
                (x, y - r - 1),
                (x + r + 1, y),
                (x, y + r + 1),
                (x - r - 1, y),
            ],
            style,
        ))?,
    }
    Ok(())
}

/// Horizontal dashed line in pixel coordinates (drawn as segments; one `<polyline>` each).
fn draw_dashed(
    root: &Area<'_>,
    x0: i32,
    x1: i32,
    y: i32,
    col: RGBColor,
    width: u32,
) -> Result<(), ChartError> {
    let (dash, gap) = (8, 5);
    let mut x = x0;
    while x < x1 {
        let end = (x + dash).min(x1);
        root.draw(&PathElement::new(
            vec![(x, y), (end, y)],
            col.stroke_width(width),
        ))?;
        x = end + gap;
    }
    Ok(())
}

/// Value label at the end of a bar: horizontal if it fits the bar width, otherwise rotated so it
/// never overlaps the neighbouring bars' labels.
fn draw_value_label(
    root: &Area<'_>,
    cx: i32,
    py: i32,
    bar_px: i32,
    v: f64,
) -> Result<(), ChartError> {
    let s = fmt_num(v);
    let up = v >= 0.0;
    if text_width(&s, VALUE_SIZE) <= f64::from(bar_px) + 4.0 {
        let (vpos, dy) = if up {
            (VPos::Bottom, -3)
        } else {
            (VPos::Top, 3)
        };
        let style = text_style(VALUE_SIZE).pos(Pos::new(HPos::Center, vpos));
        root.draw(&Text::new(s, (cx, py + dy), style))?;
    } else {
        // Rotated 270°: reads bottom-to-top; "start" anchoring makes it grow away from the bar.
        let (hpos, dy) = if up {
            (HPos::Left, -3)
        } else {
            (HPos::Right, 3)
        };
        let style = text_style(VALUE_SIZE)
            .transform(FontTransform::Rotate270)
            .pos(Pos::new(hpos, VPos::Center));
        root.draw(&Text::new(s, (cx, py + dy), style))?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Category labels for bar charts
// ---------------------------------------------------------------------------------------------

/// Pre-computed x category labels: word-wrapped horizontally when groups are wide enough,
/// otherwise rotated and truncated to the available height.
struct CategoryLabels {
    lines: Vec<Vec<String>>,
    rotated: bool,
    area_height: u32,
}

const CAT_LINE_H: i32 = 15;
const CAT_MAX_LINES: usize = 3;
/// Below this slot width even one short word doesn't fit, so labels are rotated.
const CAT_MIN_HORIZONTAL_PX: f64 = 45.0;

impl CategoryLabels {
    fn layout(groups: &[BarGroup], group_px: f64, max_rotated_px: f64) -> Self {
        let avail = group_px - 6.0;
        if group_px >= CAT_MIN_HORIZONTAL_PX {
            let lines: Vec<Vec<String>> = groups.iter().map(|g| wrap(&g.label, avail)).collect();
            let n = lines.iter().map(Vec::len).max().unwrap_or(1).max(1);
            return CategoryLabels {
                lines,
                rotated: false,
                area_height: 10 + n as u32 * CAT_LINE_H as u32,
            };
        }
        let lines: Vec<Vec<String>> = groups
            .iter()
            .map(|g| vec![fit(&g.label, TICK_SIZE, max_rotated_px)])
            .collect();
        let longest = lines
            .iter()
            .flatten()
            .map(|l| text_width(l, TICK_SIZE))
            .fold(0.0, f64::max);
        CategoryLabels {
            lines,
            rotated: true,
            area_height: (longest.ceil() as u32 + 12).max(30),
        }
    }

    fn draw(&self, root: &Area<'_>, cx: i32, top: i32, lines: &[String]) -> Result<(), ChartError> {
        if self.rotated {
            let style = text_style(TICK_SIZE)
                .transform(FontTransform::Rotate270)
                .pos(Pos::new(HPos::Right, VPos::Center));
            for l in lines {
                root.draw(&Text::new(l.clone(), (cx, top), style.clone()))?;
            }
            return Ok(());
        }
        let style = text_style(TICK_SIZE).pos(Pos::new(HPos::Center, VPos::Top));
        for (i, l) in lines.iter().enumerate() {
            root.draw(&Text::new(
                l.clone(),
                (cx, top + i as i32 * CAT_LINE_H),
                style.clone(),
            ))?;
        }
        Ok(())
    }
}

/// Greedy word wrap to `px` (estimated), at most [`CAT_MAX_LINES`] lines; overlong words and
/// the last line are truncated with an ellipsis.
fn wrap(text: &str, px: f64) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut cur = String::new();
    for word in text.split_whitespace() {
        let candidate = if cur.is_empty() {
            word.to_string()
        } else {
            format!("{cur} {word}")
        };
        if cur.is_empty() || text_width(&candidate, TICK_SIZE) <= px {
            cur = candidate;
        } else {
            lines.push(std::mem::take(&mut cur));
            cur = word.to_string();
        }
    }
    if !cur.is_empty() {
        lines.push(cur);
    }
    if lines.len() > CAT_MAX_LINES {
        let rest = lines.split_off(CAT_MAX_LINES - 1).join(" ");
        lines.push(format!("{rest}…"));
    }
    lines.iter().map(|l| fit(l, TICK_SIZE, px)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Contents of all `<text>` elements (plotters puts the text on its own line).
    fn texts(svg: &str) -> Vec<String> {
        svg.split("<text")
            .skip(1)
            .filter_map(|t| {
                Some(
                    t.split_once('>')?
                        .1
                        .split_once("</text>")?
                        .0
                        .trim()
                        .to_string(),
                )
            })
            .collect()
    }

    fn s(name: &str, points: &[(f64, f64)]) -> Series {
        Series {
            name: name.to_string(),
            points: points.to_vec(),
        }
    }

    fn g(label: &str, bars: &[(&str, f64)]) -> BarGroup {
        BarGroup {
            label: label.to_string(),
            bars: bars.iter().map(|(n, v)| (n.to_string(), *v)).collect(),
        }
    }

    fn example_line_series() -> Vec<Series> {
        vec![
            s(
                "baseline",
                &[
                    (1.0, 120.0),
                    (2.0, 260.0),
                    (4.0, 480.0),
                    (8.0, 900.0),
                    (16.0, 1500.0),
                ],
            ),
            s(
                "tuned (ours)",
                &[
                    (1.0, 150.0),
                    (2.0, 310.0),
                    (4.0, 640.0),
                    (8.0, 1250.0),
                    (16.0, 2300.0),
                ],
            ),
            s(
                "static",
                &[
                    (1.0, 100.0),
                    (2.0, 190.0),
                    (4.0, f64::NAN),
                    (8.0, 610.0),
                    (16.0, 800.0),
                ],
            ),
        ]
    }

    fn example_groups() -> Vec<BarGroup> {
        vec![
            g(
                "small file reads",
                &[("baseline", 120.0), ("tuned", 160.0), ("static", 100.0)],
            ),
            g(
                "large sequential write",
                &[
                    ("baseline", 45000.0),
                    ("tuned", 52000.0),
                    ("static", 40000.0),
                ],
            ),
            g(
                "metadata",
                &[("baseline", 3.5), ("tuned", 2.9), ("static", 3.1)],
            ),
            g("mixed", &[("tuned", 800.0), ("baseline", 700.0)]),
        ]
    }

    #[test]
    fn line_chart_contains_title_and_names() {
        let series = example_line_series();
        for (log_x, log_y) in [(false, false), (true, false), (false, true), (true, true)] {
            let svg = line_chart(&LineChart {
                title: "Throughput vs threads",
                x_label: "threads",
                y_label: "MB/s",
                series: &series,
                log_x,
                log_y,
            })
            .unwrap();
            assert!(svg.starts_with("<svg"), "{svg}");
            assert!(texts(&svg).iter().any(|t| t == "Throughput vs threads"));
            for se in &series {
                assert!(texts(&svg).contains(&se.name), "missing {}", se.name);
            }
            assert!(svg.contains("<text"));
            assert!(svg.contains("width=\"800\"") && svg.contains("height=\"450\""));
        }
    }

    #[test]
    fn bar_chart_has_one_rect_per_bar_plus_legend() {
        let groups = example_groups();
        let svg = bar_chart(&BarChart {
            title: "Ops/s by workload",
            y_label: "ops/s",
            groups: &groups,
            reference: Some((1000.0, "best static")),
            show_values: true,
        })
        .unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(texts(&svg).iter().any(|t| t == "Ops/s by workload"));
        for n in ["baseline", "tuned", "static", "best static"] {
            assert!(texts(&svg).iter().any(|t| t == n), "missing {n}");
        }
        let bars: usize = groups.iter().map(|g| g.bars.len()).sum();
        let legend_boxes = 3;
        let background = 1;
        assert_eq!(
            svg.matches("<rect").count(),
            background + bars + legend_boxes,
            "{svg}"
        );
    }

    #[test]
    fn bar_colors_follow_series_name() {
        let groups = vec![
            g("a", &[("x", 1.0), ("y", 2.0)]),
            g("b", &[("y", 3.0), ("x", 4.0)]),
        ];
        let svg = bar_chart(&BarChart {
            groups: &groups,
            ..Default::default()
        })
        .unwrap();
        let fills: Vec<&str> = svg
            .lines()
            .filter(|l| l.starts_with("<rect"))
            .skip(1) // background
            .filter_map(|l| l.split("fill=\"").nth(1)?.split('"').next())
            .collect();
        // legend x, legend y, then bars a.x, a.y, b.y, b.x (legend is drawn first)
        assert_eq!(fills.len(), 6, "{svg}");
        assert_eq!(fills[0], fills[2]);
        assert_eq!(fills[1], fills[3]);
        assert_eq!(fills[1], fills[4]);
        assert_eq!(fills[0], fills[5]);
        assert_ne!(fills[0], fills[1]);
    }

    #[test]
    fn degenerate_line_inputs_are_ok() {
        let cases: Vec<Vec<Series>> = vec![
            vec![],
            vec![s("empty", &[])],
            vec![s("one", &[(3.0, 7.0)])],
            vec![s("zeros", &[(0.0, 0.0), (0.0, 0.0)])],
            vec![s(
                "nan",
                &[
                    (f64::NAN, 1.0),
                    (1.0, f64::INFINITY),
                    (2.0, f64::NEG_INFINITY),
                ],
            )],
            vec![s("negative", &[(-5.0, -1.0), (-1.0, -3.0)])],
            vec![s(
                "mixed",
                &[(0.0, 1.0), (1.0, f64::NAN), (2.0, 0.0), (3.0, -2.0)],
            )],
        ];
        for series in &cases {
            for (log_x, log_y) in [(false, false), (true, true)] {
                let svg = line_chart(&LineChart {
                    title: "t",
                    series,
                    log_x,
                    log_y,
                    ..Default::default()
                });
                let svg = svg.unwrap();
                assert!(svg.starts_with("<svg"));
                for se in series {
                    assert!(svg.contains(&se.name));
                }
            }
        }
    }

    #[test]
    fn degenerate_bar_inputs_are_ok() {
        let cases: Vec<Vec<BarGroup>> = vec![
            vec![],
            vec![g("empty", &[])],
            vec![g("one", &[("a", 5.0)])],
            vec![g("zeros", &[("a", 0.0), ("b", 0.0)])],
            vec![g("nan", &[("a", f64::NAN), ("b", f64::INFINITY)])],
            vec![g("neg", &[("a", -3.0), ("b", 2.0)])],
            vec![g("", &[("", 1.0)])],
        ];
        for groups in &cases {
            for reference in [None, Some((1.0, "ref")), Some((f64::NAN, "nan ref"))] {
                let svg = bar_chart(&BarChart {
                    title: "t",
                    y_label: "y",
                    groups,
                    reference,
                    show_values: true,
                })
                .unwrap();
                assert!(svg.starts_with("<svg"));
            }
        }
    }

    #[test]
    fn many_groups_and_long_labels_do_not_panic() {
        let groups: Vec<BarGroup> = (0..40)
            .map(|i| {
                g(
                    &format!("a rather long workload label number {i}"),
                    &[("s1", i as f64), ("s2", 1.0)],
                )
            })
            .collect();
        let svg = bar_chart(&BarChart {
            title: &"very long title ".repeat(20),
            groups: &groups,
            ..Default::default()
        })
        .unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains('…'));
    }

    #[test]
    fn normalize_groups_divides_by_named_bar() {
        let groups = vec![
            g("a", &[("x", 10.0), ("base", 5.0), ("y", 1.0)]),
            g("b", &[("x", 3.0)]),
            g("c", &[("base", 0.0), ("x", 1.0)]),
            g("d", &[("base", -2.0), ("x", 1.0)]),
        ];
        let n = normalize_groups(&groups, "base");
        assert_eq!(
            n,
            vec![
                g("a", &[("x", 2.0), ("base", 1.0), ("y", 0.2)]),
                g("d", &[("base", 1.0), ("x", -0.5)])
            ]
        );
    }

    #[test]
    fn axis_ranges_are_never_empty() {
        let cases: [&[f64]; 6] = [&[], &[0.0], &[0.0, 0.0], &[5.0], &[-3.0], &[1.0, 2.0]];
        for vals in cases {
            for log in [false, true] {
                let vals: Vec<f64> = vals
                    .iter()
                    .copied()
                    .filter(|v| drawable(*v, log))
                    .map(|v| to_axis(v, log))
                    .collect();
                let (lo, hi) = axis_range(vals.iter().copied(), log);
                assert!(lo < hi, "{vals:?} log={log}: {lo}..{hi}");
                assert!(vals.iter().all(|v| (lo..=hi).contains(v)));
            }
        }
        assert_eq!(axis_range([1.0, 11.0].into_iter(), false), (0.0, 12.0));
        assert_eq!(bar_value_range([0.0, 0.0].into_iter(), false), (0.0, 1.0));
        let (lo, hi) = bar_value_range([2.0, 10.0].into_iter(), false);
        assert_eq!(lo, 0.0);
        assert!((hi - 11.0).abs() < 1e-9);
    }

    #[test]
    fn ticks_are_round_and_in_range() {
        assert_eq!(
            linear_ticks(0.0, 1.0, 5),
            vec![0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
        );
        let t = log_ticks(0.0, 3.0, 8);
        assert_eq!(t, vec![0.0, 1.0, 2.0, 3.0]);
        assert_eq!(
            linear_ticks(-0.07, 0.07, 6),
            vec![-0.06, -0.04, -0.02, 0.0, 0.02, 0.04, 0.06]
        );
        assert_eq!(
            linear_ticks(0.0, 62400.0, 8),
            vec![0.0, 10000.0, 20000.0, 30000.0, 40000.0, 50000.0, 60000.0]
        );
        // Narrow log range falls back to linear ticks on real values.
        let t = log_ticks(120f64.log10(), 140f64.log10(), 5);
        assert!(t.len() >= 2);
        assert!(
            t.iter()
                .all(|v| (120f64.log10()..=140f64.log10()).contains(v))
        );
    }

    #[test]
    fn number_format_is_compact() {
        assert_eq!(fmt_num(0.0), "0");
        assert_eq!(fmt_num(1.0), "1");
        assert_eq!(fmt_num(1.5), "1.5");
        assert_eq!(fmt_num(0.00123), "0.00123");
        assert_eq!(fmt_num(1234.6), "1235");
        assert_eq!(fmt_num(2_500_000.0), "2.5M");
        assert_eq!(fmt_num(45_000.0), "45k");
        assert_eq!(fmt_num(987_654.0), "988k");
        assert_eq!(fmt_num(9_999.0), "9999");
        assert_eq!(fmt_num(-0.0001), "-1e-4");
        assert_eq!(fmt_num(-0.0), "0");
        assert_eq!(fmt_num(3e20), "3e20");
        assert_eq!(fmt_tick(100_500.0, 500.0), "100.5k");
        assert_eq!(fmt_tick(1_000_000.0, 200_000.0), "1M");
        assert_eq!(fmt_tick(800_000.0, 200_000.0), "800k");
        assert_eq!(fmt_tick(0.0003, 0.0001), "0.0003");
        assert_eq!(fmt_tick(1.25, 0.25), "1.25");
        assert_eq!(fmt_tick(2.0, 0.5), "2");
    }

    #[test]
    fn wrap_respects_width_and_line_limit() {
        let lines = wrap("one two three four five six seven eight", 40.0);
        assert!(lines.len() <= CAT_MAX_LINES);
        assert!(
            lines
                .iter()
                .all(|l| text_width(l, TICK_SIZE) <= 40.0 + text_width("…", TICK_SIZE))
        );
    }

    /// Writes example charts for eyeballing (see /tmp/charts-dev/example-*.svg).
    #[test]
    fn write_examples() {
        let Ok(dir) = std::env::var("CHARTS_EXAMPLE_DIR") else {
            return;
        };
        let series = example_line_series();
        let line = line_chart(&LineChart {
            title: "Throughput vs threads",
            x_label: "threads",
            y_label: "throughput (MB/s)",
            series: &series,
            log_x: true,
            log_y: false,
        })
        .unwrap();
        std::fs::write(format!("{dir}/example-line.svg"), line).unwrap();
        let groups = example_groups();
        let bar = bar_chart(&BarChart {
            title: "Ops/s by workload",
            y_label: "ops/s",
            groups: &groups,
            reference: None,
            show_values: true,
        })
        .unwrap();
        std::fs::write(format!("{dir}/example-bar.svg"), bar).unwrap();
        let norm = normalize_groups(&groups, "static");
        let bar = bar_chart(&BarChart {
            title: "Ops/s relative to static",
            y_label: "speedup vs static",
            groups: &norm,
            reference: Some((1.0, "best static")),
            show_values: true,
        })
        .unwrap();
        std::fs::write(format!("{dir}/example-bar-normalized.svg"), bar).unwrap();
        // Stress cases: many groups with long labels, negative values, long legend, one point.
        let many: Vec<BarGroup> = (0..24)
            .map(|i| {
                g(
                    &format!("workload-{i} with long name"),
                    &[
                        ("alpha series", i as f64 - 5.0),
                        ("beta", 3.0),
                        ("gamma with a much longer name", 1.5),
                    ],
                )
            })
            .collect();
        let bar = bar_chart(&BarChart {
            title: "Many groups",
            y_label: "delta",
            groups: &many,
            reference: Some((2.0, "target")),
            show_values: true,
        })
        .unwrap();
        std::fs::write(format!("{dir}/example-stress-bar.svg"), bar).unwrap();
        let many_series: Vec<Series> = (0..12)
            .map(|i| {
                s(
                    &format!("series number {i}"),
                    &[(1.0 + i as f64, 1e-3 * 10f64.powi(i)), (20.0, 5.0)],
                )
            })
            .collect();
        let line = line_chart(&LineChart {
            title: "Log-log with many series",
            x_label: "x",
            y_label: "y",
            series: &many_series,
            log_x: true,
            log_y: true,
        })
        .unwrap();
        std::fs::write(format!("{dir}/example-stress-line.svg"), line).unwrap();
        let one = [s("only", &[(3.0, 0.0)])];
        let line = line_chart(&LineChart {
            title: "One point",
            series: &one,
            ..Default::default()
        })
        .unwrap();
        std::fs::write(format!("{dir}/example-stress-one.svg"), line).unwrap();
    }
}
