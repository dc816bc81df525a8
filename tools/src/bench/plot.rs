//! Plots in the style of the FlashAttention papers: TFLOP/s against sequence length (log2
//! axis), one panel per (head_dim, mask), one figure per dtype, one curve per kernel and peer.
//!
//! Drawn with [`plotters`] and written as `bench-<dtype>.svg` and `bench-<dtype>.png`. Text is
//! measured and rasterised by plotters' `ab_glyph` feature from DejaVu Sans embedded in the
//! binary (`tools/assets/fonts/`), so no system font library (fontconfig, freetype) is needed at run
//! time. Everything fails soft: a figure that cannot be drawn is reported in
//! [`PlotOutput::errors`], never a panic or an abort.

use super::report::BenchReport;
use flashattn::error::Result;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::register_font;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// DejaVu Sans (Bitstream Vera licence, see `tools/assets/fonts/LICENSE-DejaVu.txt`),
/// subset to the characters figures can hold (the labels are ASCII: kernel, peer and GPU
/// names, numbers), so that the binary carries 56 KB instead of 750 KB. Glyph outlines and
/// advances are those of the full font. Made with fonttools 4.68:
/// `pyftsubset DejaVuSans.ttf --unicodes=U+0020-007E,U+00A0-00FF,U+2013-2014,U+2018-201D,`
/// `U+2026,U+2212,U+2264-2265,U+00D7 --layout-features=kern --glyph-names --name-IDs='*'`
/// `--name-legacy --name-languages='*' --notdef-outline`.
const FONT_BYTES: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");
/// The family every text of the figures uses; the embedded font is registered under it.
const FAMILY: &str = "sans-serif";
/// Panel size in pixels at scale 1 (the SVG); the PNG is drawn at [`PNG_SCALE`].
const PANEL_W: f64 = 570.0;
const PANEL_H: f64 = 400.0;
/// Pixel scale of the PNG relative to the SVG (sharper text and lines).
const PNG_SCALE: f64 = 1.5;

const INK: RGBColor = RGBColor(20, 20, 20);
const MUTED: RGBColor = RGBColor(90, 90, 90);
const GRID: RGBColor = RGBColor(225, 225, 225);
const FRAME: RGBColor = RGBColor(120, 120, 120);

/// Registers the embedded font with plotters once per process.
///
/// # Errors
/// The font bytes were rejected (cannot happen with the shipped file).
fn ensure_font() -> std::result::Result<(), String> {
    static REGISTERED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            register_font(FAMILY, FontStyle::Normal, FONT_BYTES)
                .map_err(|_| "embedded DejaVuSans.ttf was rejected by ab_glyph".to_string())
        })
        .clone()
}

/// One curve.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Line name in the report (`mma`, `flash`, ...).
    pub name: String,
    /// Legend text.
    pub label: String,
    /// (seqlen, TFLOP/s or `None` when skipped), sorted by seqlen.
    pub points: Vec<(usize, Option<f64>)>,
}

/// One panel: a (head_dim, mask) pair.
#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    /// E.g. `head_dim 64, causal`.
    pub title: String,
    /// Curves with at least one point.
    pub series: Vec<Series>,
}

/// One figure: a dtype.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    /// `f16` or `bf16`.
    pub dtype: String,
    /// Headline (dtype and device).
    pub title: String,
    /// Second line: what is plotted, software and method.
    pub subtitle: String,
    /// Panel rows (head dims).
    pub rows: usize,
    /// Panel columns (masks).
    pub cols: usize,
    /// Row-major panels.
    pub panels: Vec<Panel>,
    /// Every series name of the figure, in legend order.
    pub legend: Vec<String>,
    /// Axis titles (x: the log2 axis of lengths; y: the measure).
    pub x_desc: String,
    /// Y axis title.
    pub y_desc: String,
}

/// Legend text of a line.
pub fn label(name: &str) -> String {
    match name {
        "flash" => "SDPA flash (FA2)".into(),
        "cudnn" => "SDPA cuDNN".into(),
        "efficient" => "SDPA mem-efficient".into(),
        "read" => "read-only pass".into(),
        other => format!("flashattn {other}"),
    }
}

/// Colour of a series: fixed for the usual lines, then the rest of the tab10 palette.
fn color(name: &str, legend: &[String]) -> RGBColor {
    const FIXED: [&str; 4] = ["mma", "flash", "cudnn", "efficient"];
    const OTHERS: [RGBColor; 7] = [
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(23, 190, 207),
        RGBColor(188, 189, 34),
        RGBColor(127, 127, 127),
        RGBColor(0, 0, 0),
    ];
    match name {
        "mma" => RGBColor(214, 39, 40),
        "flash" => RGBColor(31, 119, 180),
        "cudnn" => RGBColor(44, 160, 44),
        "efficient" => RGBColor(255, 127, 14),
        _ => {
            let i = legend
                .iter()
                .filter(|n| !FIXED.contains(&n.as_str()))
                .position(|n| n == name)
                .unwrap_or(0);
            OTHERS[i % OTHERS.len()]
        }
    }
}

/// Marker shape of a series: circles for our kernels, a shape per peer.
#[derive(Debug, Clone, Copy)]
enum Marker {
    Circle,
    Triangle,
    Square,
    Diamond,
}

fn marker(name: &str) -> Marker {
    match name {
        "flash" => Marker::Triangle,
        "cudnn" => Marker::Square,
        "efficient" => Marker::Diamond,
        _ => Marker::Circle,
    }
}

/// The figures of a report, one per dtype (f16 first).
pub fn figures(report: &BenchReport) -> Vec<Figure> {
    let mut dtypes: Vec<String> = Vec::new();
    for c in &report.cases {
        if !dtypes.contains(&c.case.dtype) {
            dtypes.push(c.case.dtype.clone());
        }
    }
    let mut names: Vec<String> = report.lines.clone();
    names.extend(report.peer_names());
    let device = report
        .device
        .get("name")
        .and_then(|v| v.as_str())
        .map(str::to_string)
        .or_else(|| report.peers.env.device.clone())
        .unwrap_or_else(|| "unknown GPU".into());
    let mut sub = format!(
        "TFLOP/s against sequence length; flashattn {}; median of {} launches",
        report.version, report.method.iters
    );
    if let Some(t) = &report.peers.env.torch {
        sub.push_str(&format!("; PyTorch {t}"));
    }
    if let Some(c) = report.cases.first() {
        sub.push_str(&format!(
            "; batch x seqlen = {}, heads x head_dim = {}",
            c.case.batch * c.case.seqlen,
            c.case.heads * c.case.head_dim
        ));
    }
    dtypes
        .into_iter()
        .map(|dt| {
            let cases: Vec<_> = report.cases.iter().filter(|c| c.case.dtype == dt).collect();
            let mut dims: Vec<usize> = cases.iter().map(|c| c.case.head_dim).collect();
            dims.sort_unstable();
            dims.dedup();
            let masks: Vec<bool> = [false, true]
                .into_iter()
                .filter(|m| cases.iter().any(|c| c.case.causal == *m))
                .collect();
            let mut panels = Vec::new();
            for &d in &dims {
                for &m in &masks {
                    let mut pc: Vec<_> = cases
                        .iter()
                        .filter(|c| c.case.head_dim == d && c.case.causal == m)
                        .collect();
                    pc.sort_by_key(|c| c.case.seqlen);
                    let series = names
                        .iter()
                        .filter(|n| pc.iter().any(|c| c.tflops(n).is_some()))
                        .map(|n| Series {
                            name: n.clone(),
                            label: label(n),
                            points: pc.iter().map(|c| (c.case.seqlen, c.tflops(n))).collect(),
                        })
                        .collect();
                    panels.push(Panel {
                        title: format!("head_dim {d}, {}", if m { "causal" } else { "non-causal" }),
                        series,
                    });
                }
            }
            let legend = names
                .iter()
                .filter(|n| {
                    panels
                        .iter()
                        .any(|p| p.series.iter().any(|s| &s.name == *n))
                })
                .cloned()
                .collect();
            Figure {
                title: format!("Attention forward speed, {dt}, {device}"),
                subtitle: sub.clone(),
                rows: dims.len().max(1),
                cols: masks.len().max(1),
                panels,
                dtype: dt,
                legend,
                x_desc: "sequence length".into(),
                y_desc: "TFLOP/s".into(),
            }
        })
        .collect()
}

/// Pixel sizes of one rendering (everything scales with `k`).
#[derive(Debug, Clone, Copy)]
struct Scale(f64);

impl Scale {
    fn f(self, v: f64) -> f64 {
        v * self.0
    }
    fn i(self, v: f64) -> i32 {
        (v * self.0).round() as i32
    }
    fn u(self, v: f64) -> u32 {
        (v * self.0).round().max(1.0) as u32
    }
    /// A text style of `size` pixels at scale 1, rounded to an even pixel size: plotters'
    /// ab_glyph renderer places each glyph at `size / 2` plus its integer top, so an odd size
    /// makes the baseline jitter by a pixel between glyphs.
    fn font(self, size: f64, color: RGBColor) -> TextStyle<'static> {
        let px = (self.f(size) / 2.0).round().max(1.0) * 2.0;
        (FAMILY, px).into_font().color(&color)
    }
}

/// Legend entries as (series name, x, y) in pixels and the y where the panels start.
fn legend_layout(
    fig: &Figure,
    k: Scale,
    measure: &dyn Fn(&str) -> u32,
) -> (Vec<(String, i32, i32)>, i32) {
    let width = fig.cols as f64 * PANEL_W;
    let item = |n: &String| 34.0 + f64::from(measure(&label(n))) / k.0 + 26.0;
    let mut rows: Vec<Vec<&String>> = vec![Vec::new()];
    let mut used = 0.0;
    for n in &fig.legend {
        if used + item(n) > width && !rows.last().is_some_and(|r| r.is_empty()) {
            rows.push(Vec::new());
            used = 0.0;
        }
        used += item(n);
        if let Some(r) = rows.last_mut() {
            r.push(n);
        }
    }
    let mut out = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        let total: f64 = row.iter().map(|n| item(n)).sum();
        let mut x = 20.0 + (width - total) / 2.0;
        for n in row {
            out.push(((*n).clone(), k.i(x), k.i(76.0 + 24.0 * i as f64)));
            x += item(n);
        }
    }
    (out, k.i(76.0 + 24.0 * rows.len() as f64 + 4.0))
}

/// Page size in pixels.
fn page_size(fig: &Figure, k: Scale, top: i32) -> (u32, u32) {
    (
        k.u(20.0 + fig.cols as f64 * PANEL_W + 20.0),
        top as u32 + k.u(fig.rows as f64 * PANEL_H + 10.0),
    )
}

/// A step of 1, 2, 2.5 or 5 times a power of ten giving about `target` intervals.
fn nice_step(max: f64, target: f64) -> f64 {
    let raw = (max / target).max(1e-9);
    let p = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * p)
}

/// `512`, `1k`, `16k`, ...
fn seqlen_label(s: usize) -> String {
    if s >= 1024 && s.is_multiple_of(1024) {
        format!("{}k", s / 1024)
    } else {
        s.to_string()
    }
}

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// Draws a marker of `size` pixels (radius) centred on `at` of any drawing area.
fn draw_marker<DB, CT>(
    area: &DrawingArea<DB, CT>,
    at: CT::From,
    shape: Marker,
    size: i32,
    color: RGBColor,
) -> std::result::Result<(), String>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
    CT: CoordTranslate,
    CT::From: Clone + 'static,
{
    let style = color.filled();
    let s = size;
    let r = match shape {
        Marker::Circle => area.draw(&(EmptyElement::at(at) + Circle::new((0, 0), s, style))),
        Marker::Triangle => {
            area.draw(&(EmptyElement::at(at) + TriangleMarker::new((0, 0), s + 1, style)))
        }
        Marker::Square => {
            let h = (s * 4 + 2) / 5;
            area.draw(&(EmptyElement::at(at) + Rectangle::new([(-h, -h), (h, h)], style)))
        }
        Marker::Diamond => {
            let d = s + 1;
            area.draw(
                &(EmptyElement::at(at)
                    + Polygon::new(vec![(0, -d), (d, 0), (0, d), (-d, 0)], style)),
            )
        }
    };
    r.map_err(err)
}

/// Draws a whole figure onto `root` (already of [`page_size`]).
fn draw<DB>(
    fig: &Figure,
    root: &DrawingArea<DB, Shift>,
    k: Scale,
) -> std::result::Result<(), String>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(err)?;
    let (w, _) = root.dim_in_pixel();
    let centre = Pos::new(HPos::Center, VPos::Center);
    let title = k.font(22.0, INK).pos(centre);
    root.draw(&Text::new(
        fig.title.clone(),
        (w as i32 / 2, k.i(22.0)),
        title,
    ))
    .map_err(err)?;
    let sub = k.font(14.0, MUTED).pos(centre);
    root.draw(&Text::new(
        fig.subtitle.clone(),
        (w as i32 / 2, k.i(48.0)),
        sub,
    ))
    .map_err(err)?;

    let legend_font = k.font(16.0, INK).pos(Pos::new(HPos::Left, VPos::Center));
    let measure = |s: &str| {
        root.estimate_text_size(s, &legend_font)
            .map(|(w, _)| w)
            .unwrap_or(s.len() as u32 * k.u(9.0))
    };
    let (items, top) = legend_layout(fig, k, &measure);
    for (name, x, y) in &items {
        let col = color(name, &fig.legend);
        root.draw(&PathElement::new(
            vec![(*x, *y), (*x + k.i(28.0), *y)],
            col.stroke_width(k.u(2.5)),
        ))
        .map_err(err)?;
        draw_marker(root, (*x + k.i(14.0), *y), marker(name), k.i(4.5), col)?;
        root.draw(&Text::new(
            label(name),
            (*x + k.i(34.0), *y),
            legend_font.clone(),
        ))
        .map_err(err)?;
    }

    let body = root.margin(top, k.i(10.0), k.i(20.0), k.i(20.0));
    let areas = body.split_evenly((fig.rows, fig.cols));
    for (p, area) in fig.panels.iter().zip(&areas) {
        draw_panel(p, fig, area, k)?;
    }
    Ok(())
}

fn draw_panel<DB>(
    p: &Panel,
    fig: &Figure,
    area: &DrawingArea<DB, Shift>,
    k: Scale,
) -> std::result::Result<(), String>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
{
    let mut seqlens: Vec<usize> = p
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|q| q.0))
        .collect();
    seqlens.sort_unstable();
    seqlens.dedup();
    // A log2 axis of sequence lengths, ticks at the measured lengths, 0.4 octave of air.
    let air = 2f64.powf(0.4);
    let (xmin, xmax) = match (seqlens.first(), seqlens.last()) {
        (Some(&a), Some(&z)) if a != z => (a as f64 / air, z as f64 * air),
        (Some(&a), _) => (a as f64 / 2.0, a as f64 * 2.0),
        _ => (512.0 / air, 16384.0 * air),
    };
    let xticks: Vec<f64> = if seqlens.is_empty() {
        (9..=14).map(|e| f64::from(1u32 << e)).collect()
    } else {
        seqlens.iter().map(|&s| s as f64).collect()
    };
    let ymax_data = p
        .series
        .iter()
        .flat_map(|s| s.points.iter().filter_map(|q| q.1))
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max);
    let step = nice_step(
        if ymax_data > 0.0 {
            ymax_data * 1.1
        } else {
            1.0
        },
        5.0,
    );
    let ymax = ((ymax_data * 1.1 / step).ceil() * step).max(step);
    let n_y = (ymax / step).round() as usize;

    let x_range = (xmin..xmax).log_scale().base(2.0).with_key_points(xticks);
    let mut chart = ChartBuilder::on(area)
        .caption(&p.title, k.font(18.0, INK))
        .margin_top(k.i(6.0))
        .margin_right(k.i(14.0))
        .margin_left(k.i(4.0))
        .margin_bottom(k.i(4.0))
        .x_label_area_size(k.i(46.0))
        .y_label_area_size(k.i(62.0))
        .build_cartesian_2d(x_range, 0.0..ymax)
        .map_err(err)?;
    let fmt_x = |v: &f64| seqlen_label(v.round() as usize);
    let fmt_y = |v: &f64| {
        if step >= 1.0 {
            format!("{v:.0}")
        } else {
            format!("{v:.1}")
        }
    };
    chart
        .configure_mesh()
        .x_desc(fig.x_desc.as_str())
        .y_desc(fig.y_desc.as_str())
        .x_label_formatter(&fmt_x)
        .y_label_formatter(&fmt_y)
        .y_labels(n_y + 1)
        .label_style(k.font(14.0, INK))
        .axis_desc_style(k.font(16.0, INK))
        .bold_line_style(GRID.stroke_width(k.u(1.0)))
        .light_line_style(TRANSPARENT)
        .axis_style(FRAME.stroke_width(k.u(1.0)))
        .set_all_tick_mark_size(k.i(4.0))
        .draw()
        .map_err(err)?;
    let plot = chart.plotting_area();
    plot.draw(&Rectangle::new(
        [(xmin, 0.0), (xmax, ymax)],
        FRAME.stroke_width(k.u(1.0)),
    ))
    .map_err(err)?;

    if p.series.is_empty() {
        let style = k
            .font(20.0, RGBColor(150, 150, 150))
            .pos(Pos::new(HPos::Center, VPos::Center));
        plot.draw(&Text::new(
            "no data",
            ((xmin * xmax).sqrt(), ymax / 2.0),
            style,
        ))
        .map_err(err)?;
    }
    for s in &p.series {
        let col = color(&s.name, &fig.legend);
        let line = col.stroke_width(k.u(2.5));
        // Skipped points split the curve instead of dropping to zero.
        for seg in s
            .points
            .split(|q| q.1.is_none_or(|v| !v.is_finite()))
            .filter(|seg| seg.len() > 1)
        {
            let pts: Vec<(f64, f64)> = seg
                .iter()
                .map(|&(q, v)| (q as f64, v.unwrap_or(0.0)))
                .collect();
            plot.draw(&PathElement::new(pts, line)).map_err(err)?;
        }
        for &(q, v) in &s.points {
            if let Some(v) = v.filter(|v| v.is_finite()) {
                draw_marker(plot, (q as f64, v), marker(&s.name), k.i(4.0), col)?;
            }
        }
    }
    Ok(())
}

/// Measures the legend in a throw-away drawing area to size the page.
fn panels_top(fig: &Figure, k: Scale) -> i32 {
    let mut sink = String::new();
    let area = SVGBackend::with_string(&mut sink, (1, 1)).into_drawing_area();
    let font = k.font(16.0, INK);
    let measure = |s: &str| {
        area.estimate_text_size(s, &font)
            .map(|(w, _)| w)
            .unwrap_or(s.len() as u32 * k.u(9.0))
    };
    legend_layout(fig, k, &measure).1
}

/// Renders a figure as an SVG document.
///
/// # Errors
/// The font registration or drawing error as text.
pub fn svg(fig: &Figure) -> std::result::Result<String, String> {
    ensure_font()?;
    let k = Scale(1.0);
    let size = page_size(fig, k, panels_top(fig, k));
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, size).into_drawing_area();
        draw(fig, &root, k)?;
        root.present().map_err(err)?;
    }
    Ok(buf)
}

/// Renders a figure into a PNG file (1.5 times the SVG's pixel size).
///
/// # Errors
/// The font registration, drawing or encoding error as text; no partial file is left.
pub fn png(fig: &Figure, path: &Path) -> std::result::Result<(), String> {
    ensure_font()?;
    let k = Scale(PNG_SCALE);
    let size = page_size(fig, k, panels_top(fig, k));
    let result = {
        let root = BitMapBackend::new(path, size).into_drawing_area();
        draw(fig, &root, k).and_then(|()| root.present().map_err(err))
    };
    if result.is_err() {
        let _ = std::fs::remove_file(path);
    }
    result
}

fn soft<T>(
    what: &str,
    f: impl FnOnce() -> std::result::Result<T, String>,
) -> std::result::Result<T, String> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r.map_err(|e| format!("{what}: {e}")),
        Err(p) => {
            let msg = super::panic_message(&*p);
            Err(format!("{what}: panicked: {msg}"))
        }
    }
}

/// Files written and what failed.
#[derive(Debug, Clone, Default)]
pub struct PlotOutput {
    /// Written files.
    pub files: Vec<PathBuf>,
    /// One message per figure or format that failed.
    pub errors: Vec<String>,
}

/// Writes `bench-<dtype>.svg` and `.png` for every dtype of the report into `out_dir`.
pub fn write_all(report: &BenchReport, out_dir: &Path) -> PlotOutput {
    write_figures(figures(report), out_dir, "bench")
}

/// Writes `<stem>-<dtype>.svg` and `.png` for every figure into `out_dir`.
pub fn write_figures(figs: Vec<Figure>, out_dir: &Path, stem: &str) -> PlotOutput {
    let mut out = PlotOutput::default();
    if let Err(e) = std::fs::create_dir_all(out_dir) {
        out.errors
            .push(format!("creating {}: {e}", out_dir.display()));
        return out;
    }
    for fig in figs {
        let svg_path = out_dir.join(format!("{stem}-{}.svg", fig.dtype));
        match soft(&svg_path.display().to_string(), || {
            std::fs::write(&svg_path, svg(&fig)?).map_err(err)
        }) {
            Ok(()) => out.files.push(svg_path),
            Err(e) => out.errors.push(e),
        }
        let png_path = out_dir.join(format!("{stem}-{}.png", fig.dtype));
        match soft(&png_path.display().to_string(), || png(&fig, &png_path)) {
            Ok(()) => out.files.push(png_path),
            Err(e) => out.errors.push(e),
        }
    }
    out
}

/// Reads a bench.json and writes its plots into `out_dir` (`flashattn bench-plot`).
///
/// # Errors
/// [`flashattn::AttnError::Io`] when the JSON cannot be read; drawing errors are in the output.
pub fn from_json(json: &Path, out_dir: &Path) -> Result<PlotOutput> {
    let report = BenchReport::read(json)?;
    Ok(write_all(&report, out_dir))
}
