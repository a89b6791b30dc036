//! The comparison harness's results drawn as SVG charts (`examples/charts.rs` runs this; see its
//! module doc for the files).
//!
//! The harness (`benches/compare.rs`) appends one JSON object per line to its results file: a
//! `"kind":"disk"` record per run, then a `"kind":"engine"` record per (engine, run). The charts show
//! the newest set of engine records (those sharing the newest record's `started` stamp and `n`, one
//! harness invocation) and, as the harness's table does, each figure's median across the runs; a
//! latency distribution's median is taken quantile by quantile.
//!
//! Each engine keeps its colour in every chart; ctxlog comes first and is drawn with a dark outline.

use std::path::{Path, PathBuf};

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde_json::Value;

/// What the chart functions return.
pub type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The quantiles at which the harness records a latency distribution (`*_latency_ms_quantiles`):
/// the value at each `q`, nearest rank; the last, `q = 1.0`, is the largest latency seen.
pub const LATENCY_QUANTILES: [f64; 15] = [
    0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 0.999, 1.0,
];

/// The engines in the order the charts show them (others found in the results follow, by name).
pub const ENGINES: [&str; 5] = ["ctxlog", "sled", "redb", "sqlite", "fjall"];

/// An engine's colour, the same in every chart (Okabe–Ito and Dark2 hues, told apart by most
/// colour-blind readers).
#[must_use]
pub fn engine_colour(engine: &str) -> RGBColor {
    match engine {
        "ctxlog" => RGBColor(0xd5, 0x5e, 0x00),
        "sled" => RGBColor(0x00, 0x72, 0xb2),
        "redb" => RGBColor(0x00, 0x9e, 0x73),
        "sqlite" => RGBColor(0xcc, 0x79, 0xa7),
        "fjall" => RGBColor(0xa6, 0x76, 0x1d),
        _ => RGBColor(0x88, 0x88, 0x88),
    }
}

const FONT: &str = "sans-serif";
const WIDTH: u32 = 900;
const HEIGHT: u32 = 500;
const OUTLINE: RGBColor = RGBColor(0x22, 0x22, 0x22);

// ---------------------------------------------------------------------------------------------
// Reading the results.

/// The JSON objects of a results file, one per non-blank line.
///
/// # Errors
/// A line that is not JSON, named by its number.
pub fn parse_jsonl(text: &str) -> Res<Vec<Value>> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| serde_json::from_str(l).map_err(|e| format!("line {}: {e}", i + 1).into()))
        .collect()
}

/// The median of `xs` (the mean of the middle two for an even count), as the harness's table takes it.
#[must_use]
pub fn median(mut xs: Vec<f64>) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(f64::total_cmp);
    let mid = xs.len() / 2;
    Some(if xs.len() % 2 == 1 {
        xs[mid]
    } else {
        f64::midpoint(xs[mid - 1], xs[mid])
    })
}

/// One harness invocation's engine results.
#[derive(Debug, Clone)]
pub struct ResultSet {
    /// Items loaded (W1's N).
    pub n: u64,
    /// The invocation's start, seconds since the Unix epoch, when recorded.
    pub started: Option<u64>,
    /// The largest run number.
    pub runs: u64,
    /// The engines present, in chart order.
    pub engines: Vec<String>,
    /// The engine records.
    pub records: Vec<Value>,
}

/// The newest set of engine records in `records`: those with the same `started` stamp and `n` as the
/// last engine record. `None` without engine records.
#[must_use]
pub fn newest_set(records: &[Value]) -> Option<ResultSet> {
    let is_engine = |r: &&Value| r["kind"] == "engine";
    let last = records.iter().rev().find(is_engine)?;
    let set: Vec<Value> = records
        .iter()
        .filter(is_engine)
        .filter(|r| r["started"] == last["started"] && r["n"] == last["n"])
        .cloned()
        .collect();
    let mut engines: Vec<String> = Vec::new();
    for e in set.iter().filter_map(|r| r["engine"].as_str()) {
        if !engines.iter().any(|x| x == e) {
            engines.push(e.to_owned());
        }
    }
    let rank = |e: &str| ENGINES.iter().position(|x| *x == e).unwrap_or(ENGINES.len());
    engines.sort_by(|a, b| rank(a).cmp(&rank(b)).then_with(|| a.cmp(b)));
    Some(ResultSet {
        n: last["n"].as_u64().unwrap_or(0),
        started: last["started"].as_u64(),
        runs: set.iter().filter_map(|r| r["run"].as_u64()).max().unwrap_or(0),
        engines,
        records: set,
    })
}

impl ResultSet {
    fn of<'a>(&'a self, engine: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        self.records.iter().filter(move |r| r["engine"] == engine)
    }

    /// The median across runs of `engine`'s `field`.
    #[must_use]
    pub fn median(&self, engine: &str, field: &str) -> Option<f64> {
        median(self.of(engine).filter_map(|r| r[field].as_f64()).collect())
    }

    /// The median across runs of `engine`'s array `field`, element by element (runs whose array has
    /// another length than the first's are left out).
    #[must_use]
    pub fn median_array(&self, engine: &str, field: &str) -> Option<Vec<f64>> {
        let arrays: Vec<Vec<f64>> = self
            .of(engine)
            .filter_map(|r| r[field].as_array())
            .map(|a| a.iter().filter_map(Value::as_f64).collect::<Vec<f64>>())
            .collect();
        let len = arrays.first()?.len();
        let arrays: Vec<&Vec<f64>> = arrays.iter().filter(|a| a.len() == len).collect();
        (0..len)
            .map(|i| median(arrays.iter().map(|a| a[i]).collect()))
            .collect()
    }

    /// The quantiles the latency arrays were recorded at (the records' own list, else this crate's).
    #[must_use]
    pub fn quantiles(&self) -> Vec<f64> {
        self.records
            .iter()
            .find_map(|r| r["latency_quantiles"].as_array())
            .map_or_else(
                || LATENCY_QUANTILES.to_vec(),
                |a| a.iter().filter_map(Value::as_f64).collect(),
            )
    }

    /// ctxlog's figure as "times better than the best other engine" (> 1: ctxlog ahead), with that
    /// engine's name: the harness table's last column.
    #[must_use]
    pub fn ratio_to_best_other(&self, figure: &Figure) -> Option<(f64, String)> {
        let mine = self.median("ctxlog", figure.field)?;
        let best = self
            .engines
            .iter()
            .filter(|e| *e != "ctxlog")
            .filter_map(|e| self.median(e, figure.field).map(|v| (e.clone(), v)))
            .reduce(|a, b| {
                let better = if figure.higher_better { b.1 > a.1 } else { b.1 < a.1 };
                if better {
                    b
                } else {
                    a
                }
            })?;
        if best.1 <= 0.0 || mine <= 0.0 {
            return None;
        }
        let ratio = if figure.higher_better {
            mine / best.1
        } else {
            best.1 / mine
        };
        Some((ratio, best.0))
    }

    /// "W1, N = 200,000, medians of 3 runs".
    #[must_use]
    pub fn describe(&self) -> String {
        format!(
            "W1, N = {}, median of {} run{}",
            thousands(self.n),
            self.runs,
            if self.runs == 1 { "" } else { "s" }
        )
    }
}

// ---------------------------------------------------------------------------------------------
// What is drawn.

/// One figure of the harness's results, as a chart shows it.
#[derive(Debug, Clone, Copy)]
pub struct Figure {
    /// The JSON field.
    pub field: &'static str,
    /// The panel's title in its phase's chart.
    pub title: &'static str,
    /// The label in the summary chart (empty: not in it).
    pub summary: &'static str,
    /// The unit after `scale`.
    pub unit: &'static str,
    /// Whether a larger value is better.
    pub higher_better: bool,
    /// Multiply the JSON value by this for display (s to ms, bytes to MB).
    pub scale: f64,
}

const fn fig(
    field: &'static str,
    title: &'static str,
    summary: &'static str,
    unit: &'static str,
    higher_better: bool,
    scale: f64,
) -> Figure {
    Figure {
        field,
        title,
        summary,
        unit,
        higher_better,
        scale,
    }
}

/// One phase's chart: a panel per figure, side by side.
#[derive(Debug, Clone, Copy)]
pub struct PhaseChart {
    /// The file name.
    pub file: &'static str,
    /// The chart's title.
    pub title: &'static str,
    /// Its figures.
    pub figures: &'static [Figure],
}

/// The phase charts, p1.svg to p7.svg, with the harness's headline figures.
pub const PHASE_CHARTS: [PhaseChart; 7] = [
    PhaseChart {
        file: "p1.svg",
        title: "P1 bulk load, durable batches of 1,000",
        figures: &[
            fig(
                "p1_items_s",
                "items per second",
                "P1 bulk load, items/s",
                "items/s",
                true,
                1.0,
            ),
            fig("p1_mb_s", "MB of JSON per second", "", "MB/s", true, 1.0),
        ],
    },
    PhaseChart {
        file: "p2.svg",
        title: "P2 durable single-item adds",
        figures: &[
            fig(
                "p2_ops_s",
                "1 thread",
                "P2 durable adds/s, 1 thread",
                "adds/s",
                true,
                1.0,
            ),
            fig(
                "p2_8t_ops_s",
                "8 threads",
                "P2 durable adds/s, 8 threads",
                "adds/s",
                true,
                1.0,
            ),
            fig(
                "p2_8t_p99_ms",
                "8 threads, p99 latency",
                "P2 8 threads, p99 latency",
                "ms",
                false,
                1.0,
            ),
        ],
    },
    PhaseChart {
        file: "p3.svg",
        title: "P3 random resolves by id",
        figures: &[
            fig(
                "p3_ops_s",
                "parsed into items",
                "P3 resolves/s, parsed",
                "resolves/s",
                true,
                1.0,
            ),
            fig(
                "p3_raw_ops_s",
                "raw JSON bytes",
                "P3 resolves/s, raw JSON",
                "resolves/s",
                true,
                1.0,
            ),
        ],
    },
    PhaseChart {
        file: "p4.svg",
        title: "P4 typed time-window queries",
        figures: &[
            fig(
                "p4_items_s",
                "parsed into items",
                "P4 window query items/s, parsed",
                "items/s",
                true,
                1.0,
            ),
            fig(
                "p4_raw_items_s",
                "raw JSON bytes",
                "P4 window query items/s, raw",
                "items/s",
                true,
                1.0,
            ),
        ],
    },
    PhaseChart {
        file: "p5.svg",
        title: "P5 close, then reopen until the first resolve answers",
        figures: &[
            fig("p5_close_s", "close", "P5 close", "ms", false, 1e3),
            fig(
                "p5_reopen_s",
                "reopen to first resolve",
                "P5 reopen to first resolve",
                "ms",
                false,
                1e3,
            ),
        ],
    },
    PhaseChart {
        file: "p6.svg",
        title: "P6 footprint: bytes on disk (allocated)",
        figures: &[
            fig("p6_bytes", "after the loads", "", "MB", false, 1e-6),
            fig(
                "p6_ratio",
                "/ logical JSON, live",
                "P6 bytes on disk / JSON",
                "ratio",
                false,
                1.0,
            ),
            fig(
                "p6_ratio_after_reopen",
                "/ logical JSON, after reopen",
                "P6 bytes / JSON after reopen",
                "ratio",
                false,
                1.0,
            ),
        ],
    },
    PhaseChart {
        file: "p7.svg",
        title: "P7 expire (or delete) half the items and reclaim the space",
        figures: &[
            fig(
                "p7_total_s",
                "expire + reclaim",
                "P7 expire + reclaim time",
                "s",
                false,
                1.0,
            ),
            fig("p7_bytes_after", "bytes on disk after", "", "MB", false, 1e-6),
            fig(
                "p7_ratio_live",
                "bytes after / live JSON",
                "P7 bytes after / live JSON",
                "ratio",
                false,
                1.0,
            ),
        ],
    },
];

/// The latency charts: (file, title, unit, scale from ms, panels as (field, title)).
type LatencyChart = (
    &'static str,
    &'static str,
    &'static str,
    f64,
    &'static [(&'static str, &'static str)],
);

const LATENCY_CHARTS: [LatencyChart; 2] = [
    (
        "latency-p2.svg",
        "P2 durable single-item add latency",
        "ms",
        1.0,
        &[
            ("p2_latency_ms_quantiles", "1 thread"),
            ("p2_8t_latency_ms_quantiles", "8 threads"),
        ],
    ),
    (
        "latency-p3.svg",
        "P3 resolve latency (one resolve in 16 timed)",
        "µs",
        1e3,
        &[
            ("p3_latency_ms_quantiles", "parsed into items"),
            ("p3_raw_latency_ms_quantiles", "raw JSON bytes"),
        ],
    ),
];

/// The summary chart's file name.
pub const SUMMARY_FILE: &str = "summary.svg";

// ---------------------------------------------------------------------------------------------
// Numbers as labels.

/// `n` with thousands separators: 200,000.
#[must_use]
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A short label for `v`: three significant digits, `k` and `M` for thousands and millions
/// (12345 → "12.3k", 0.01234 → "0.0123", 5000 → "5k").
#[must_use]
pub fn compact(v: f64) -> String {
    if !v.is_finite() {
        return "–".into();
    }
    if v == 0.0 {
        return "0".into();
    }
    let a = v.abs();
    let (x, suffix) = if a >= 1e9 {
        (v / 1e9, "G")
    } else if a >= 1e6 {
        (v / 1e6, "M")
    } else if a >= 1e3 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let decimals = (2.0 - x.abs().log10().floor()).clamp(0.0, 6.0) as usize;
    let mut s = format!("{x:.decimals$}");
    if s.contains('.') {
        while s.ends_with('0') {
            s.pop();
        }
        if s.ends_with('.') {
            s.pop();
        }
    }
    s.push_str(suffix);
    s
}

/// A ratio as the harness's table writes it: two decimals ("2.31x"), none from 100 on.
#[must_use]
pub fn fmt_ratio(r: f64) -> String {
    if r < 100.0 {
        format!("{r:.2}x")
    } else {
        format!("{r:.0}x")
    }
}

fn better(higher: bool) -> &'static str {
    if higher {
        "higher is better"
    } else {
        "lower is better"
    }
}

// ---------------------------------------------------------------------------------------------
// Drawing.

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// An axis whose ticks are exactly `ticks` (plotters' own `with_key_points` loses the value
/// formatter).
struct Ticked<R> {
    inner: R,
    ticks: Vec<f64>,
}

/// A linear axis with the given ticks.
fn ticked(range: std::ops::Range<f64>, ticks: Vec<f64>) -> Ticked<RangedCoordf64> {
    Ticked {
        inner: range.into(),
        ticks,
    }
}

/// A log axis from `lo` to `hi` with ticks at 1, 2 and 5 times the powers of ten (only the powers
/// of ten when that makes more than a dozen).
fn log_ticked(lo: f64, hi: f64) -> Ticked<LogCoord<f64>> {
    let mut ticks = Vec::new();
    #[allow(clippy::cast_possible_truncation)]
    let mut exp = lo.log10().floor() as i32;
    while 10f64.powi(exp) <= hi {
        for m in [1.0, 2.0, 5.0] {
            let v = m * 10f64.powi(exp);
            if v >= lo && v <= hi {
                ticks.push(v);
            }
        }
        exp += 1;
    }
    if ticks.len() > 12 {
        ticks.retain(|v| (v.log10() - v.log10().round()).abs() < 1e-9);
    }
    Ticked {
        inner: (lo..hi).log_scale().into(),
        ticks,
    }
}

impl<R: Ranged<ValueType = f64>> Ranged for Ticked<R> {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.inner.map(value, limit)
    }

    fn key_points<H: KeyPointHint>(&self, _hint: H) -> Vec<f64> {
        self.ticks.clone()
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.inner.range()
    }

    fn axis_pixel_range(&self, limit: (i32, i32)) -> std::ops::Range<i32> {
        self.inner.axis_pixel_range(limit)
    }
}

/// The font at `px` pixels in the SVG (plotters' SVG backend writes a size divided by 1.24).
fn font(px: f64) -> FontDesc<'static> {
    (FONT, px * 1.24).into_font()
}

/// A white canvas with `title` at the top and `subtitle` under it; the area below them.
fn canvas<'a>(root: &Area<'a>, title: &str, subtitle: &str) -> Res<Area<'a>> {
    root.fill(&WHITE)?;
    let (head, body) = root.split_vertically(58);
    let centre = Pos::new(HPos::Center, VPos::Top);
    let mid = i32::try_from(WIDTH / 2)?;
    head.draw(&Text::new(
        title.to_owned(),
        (mid, 8),
        font(20.0).style(FontStyle::Bold).color(&BLACK).pos(centre),
    ))?;
    head.draw(&Text::new(
        subtitle.to_owned(),
        (mid, 34),
        font(13.0).color(&RGBColor(0x55, 0x55, 0x55)).pos(centre),
    ))?;
    Ok(body)
}

/// A panel of horizontal bars, one per engine (ctxlog at the top), each with its value printed at
/// its end.
fn bar_panel(area: &Area<'_>, set: &ResultSet, figure: &Figure) -> Res<()> {
    let engines = &set.engines;
    let k = engines.len();
    let values: Vec<Option<f64>> = engines
        .iter()
        .map(|e| set.median(e, figure.field).map(|v| v * figure.scale))
        .collect();
    let max = values.iter().flatten().fold(0.0f64, |a, &b| a.max(b));
    // Room right of the longest bar for its label.
    let x_max = if max > 0.0 { max * 1.38 } else { 1.0 };
    #[allow(clippy::cast_precision_loss)]
    let y_top = k as f64 - 0.5;
    #[allow(clippy::cast_precision_loss)]
    let key_points: Vec<f64> = (0..k).map(|i| i as f64).collect();
    let name_at = |y: &f64| -> String {
        #[allow(clippy::cast_possible_truncation)]
        let row = y.round() as i64;
        usize::try_from(row)
            .ok()
            .and_then(|r| k.checked_sub(r + 1))
            .and_then(|i| engines.get(i))
            .cloned()
            .unwrap_or_default()
    };
    let mut chart = ChartBuilder::on(area)
        .caption(figure.title, font(15.0))
        .margin(10)
        .margin_right(14)
        .x_label_area_size(44)
        .y_label_area_size(58)
        .build_cartesian_2d(0f64..x_max, ticked(-0.5..y_top, key_points))?;
    let x_fmt = |v: &f64| compact(*v);
    chart
        .configure_mesh()
        .disable_y_mesh()
        .light_line_style(TRANSPARENT)
        .bold_line_style(RGBColor(0xdd, 0xdd, 0xdd))
        .x_labels(4)
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&name_at)
        .x_desc(format!("{}, {}", figure.unit, better(figure.higher_better)))
        .label_style(font(13.0))
        .axis_desc_style(font(13.0))
        .draw()?;
    for (j, (engine, value)) in engines.iter().zip(&values).enumerate() {
        #[allow(clippy::cast_precision_loss)]
        let y = (k - 1 - j) as f64;
        let colour = engine_colour(engine);
        let ours = engine == "ctxlog";
        let label_style = if ours {
            font(13.0).style(FontStyle::Bold).color(&BLACK)
        } else {
            font(13.0).color(&BLACK)
        }
        .pos(Pos::new(HPos::Left, VPos::Center));
        match value {
            Some(v) => {
                chart.draw_series(std::iter::once(Rectangle::new(
                    [(0.0, y - 0.34), (*v, y + 0.34)],
                    colour.filled(),
                )))?;
                if ours {
                    chart.draw_series(std::iter::once(Rectangle::new(
                        [(0.0, y - 0.34), (*v, y + 0.34)],
                        OUTLINE.stroke_width(2),
                    )))?;
                }
                chart.draw_series(std::iter::once(
                    EmptyElement::at((*v, y)) + Text::new(compact(*v), (5, 0), label_style),
                ))?;
            }
            None => {
                chart.draw_series(std::iter::once(
                    EmptyElement::at((0.0, y)) + Text::new("not measured", (5, 0), label_style),
                ))?;
            }
        }
    }
    Ok(())
}

fn render_phase(set: &ResultSet, chart: &PhaseChart, path: &Path) -> Res<()> {
    let root = SVGBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    let body = canvas(
        &root,
        chart.title,
        &format!("{}; ctxlog first, outlined", set.describe()),
    )?;
    let panels = body.split_evenly((1, chart.figures.len()));
    for (panel, figure) in panels.iter().zip(chart.figures) {
        bar_panel(panel, set, figure)?;
    }
    root.present()?;
    Ok(())
}

/// Where a quantile sits on the "nines" axis: -log10(1 - q) (p90 at 1, p99 at 2, p99.9 at 3); the
/// maximum (q = 1) half a step past p99.9.
fn nines(q: f64) -> f64 {
    if q >= 1.0 {
        MAX_NINES
    } else {
        -(1.0 - q).log10()
    }
}

const MAX_NINES: f64 = 3.5;

/// The labelled ticks of the nines axis.
const NINES_TICKS: [(f64, &str); 5] = [
    (0.5, "p50"),
    (0.9, "p90"),
    (0.99, "p99"),
    (0.999, "p99.9"),
    (1.0, "max"),
];

/// A row of legend entries (a thick line in the engine's colour, then its name), centred in `area`.
fn legend(area: &Area<'_>, engines: &[String]) -> Res<()> {
    let (w, h) = area.dim_in_pixel();
    let entry = 100i32;
    let n = i32::try_from(engines.len())?;
    let mut x = (i32::try_from(w)? - entry * n) / 2;
    let y = i32::try_from(h / 2)?;
    for e in engines {
        let colour = engine_colour(e);
        let width = if e == "ctxlog" { 4 } else { 2 };
        area.draw(&PathElement::new(vec![(x, y), (x + 26, y)], colour.stroke_width(width)))?;
        area.draw(&Circle::new((x + 13, y), 3, colour.filled()))?;
        let font = if e == "ctxlog" {
            font(14.0).style(FontStyle::Bold)
        } else {
            font(14.0)
        };
        area.draw(&Text::new(
            e.clone(),
            (x + 32, y),
            font.color(&BLACK).pos(Pos::new(HPos::Left, VPos::Center)),
        ))?;
        x += entry;
    }
    Ok(())
}

/// One latency distribution panel: a line per engine through its quantiles. `false` if no engine
/// has the field.
fn latency_panel(area: &Area<'_>, set: &ResultSet, field: &str, title: &str, unit: &str, scale: f64) -> Res<bool> {
    let qs = set.quantiles();
    let curves: Vec<(String, Vec<(f64, f64)>)> = set
        .engines
        .iter()
        .filter_map(|e| {
            let values = set.median_array(e, field)?;
            let points = qs
                .iter()
                .zip(values)
                .filter(|(_, v)| *v > 0.0)
                .map(|(q, v)| (nines(*q), v * scale))
                .collect::<Vec<_>>();
            (!points.is_empty()).then(|| (e.clone(), points))
        })
        .collect();
    let all = curves.iter().flat_map(|(_, p)| p.iter().map(|(_, v)| *v));
    let (lo, hi) = all.fold((f64::INFINITY, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if curves.is_empty() || !(lo > 0.0 && hi >= lo) {
        return Ok(false);
    }
    let ticks: Vec<f64> = NINES_TICKS.iter().map(|(q, _)| nines(*q)).collect();
    let x_fmt = |x: &f64| -> String {
        NINES_TICKS
            .iter()
            .find(|(q, _)| (nines(*q) - x).abs() < 1e-9)
            .map(|(_, l)| (*l).to_owned())
            .unwrap_or_default()
    };
    let y_fmt = |v: &f64| compact(*v);
    let mut chart = ChartBuilder::on(area)
        .caption(title, font(15.0))
        .margin(10)
        .margin_right(18)
        .x_label_area_size(44)
        .y_label_area_size(58)
        .build_cartesian_2d(ticked(0.0..MAX_NINES + 0.1, ticks), log_ticked(lo / 1.3, hi * 1.3))?;
    chart
        .configure_mesh()
        .light_line_style(TRANSPARENT)
        .bold_line_style(RGBColor(0xdd, 0xdd, 0xdd))
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&y_fmt)
        .x_desc("quantile (each step right: ten times rarer)")
        .y_desc(format!("{unit}, log scale, lower is better"))
        .label_style(font(13.0))
        .axis_desc_style(font(13.0))
        .draw()?;
    // ctxlog last, so that its line is on top.
    for (engine, points) in curves.iter().rev() {
        let colour = engine_colour(engine);
        let width = if engine == "ctxlog" { 4 } else { 2 };
        chart.draw_series(LineSeries::new(points.clone(), colour.stroke_width(width)))?;
        chart.draw_series(points.iter().map(|p| Circle::new(*p, 3, colour.filled())))?;
    }
    Ok(true)
}

/// A latency chart; `false` (and no file) if none of its fields is in the results.
fn render_latency(set: &ResultSet, chart: &LatencyChart, path: &Path) -> Res<bool> {
    let (_, title, unit, scale, panels) = *chart;
    if !panels
        .iter()
        .any(|(field, _)| set.engines.iter().any(|e| set.median_array(e, field).is_some()))
    {
        return Ok(false);
    }
    let root = SVGBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    let body = canvas(
        &root,
        title,
        &format!("{}; each quantile's median across runs", set.describe()),
    )?;
    let (key, plots) = body.split_vertically(30);
    legend(&key, &set.engines)?;
    for (area, (field, panel_title)) in plots.split_evenly((1, panels.len())).iter().zip(panels) {
        latency_panel(area, set, field, panel_title, unit, scale)?;
    }
    root.present()?;
    Ok(true)
}

/// The summary: ctxlog's ratio to the best other engine per headline figure, a horizontal bar from
/// 1 (on a log axis) to the ratio. `false` (and no file) without ctxlog and another engine.
fn render_summary(set: &ResultSet, path: &Path) -> Res<bool> {
    let rows: Vec<(&Figure, f64, String)> = PHASE_CHARTS
        .iter()
        .flat_map(|c| c.figures.iter())
        .filter(|f| !f.summary.is_empty())
        .filter_map(|f| set.ratio_to_best_other(f).map(|(r, who)| (f, r, who)))
        .collect();
    if rows.is_empty() {
        return Ok(false);
    }
    let k = rows.len();
    let height = HEIGHT.max(110 + 30 * u32::try_from(k)?);
    let root = SVGBackend::new(path, (WIDTH, height)).into_drawing_area();
    let body = canvas(
        &root,
        "ctxlog against the best other engine, figure by figure",
        &format!(
            "{}; times better than the best other engine (> 1: ctxlog ahead)",
            set.describe()
        ),
    )?;
    let lo = rows.iter().map(|r| r.1).fold(1.0f64, f64::min) / 1.5;
    let top = rows.iter().map(|r| r.1).fold(1.0f64, f64::max);
    // Room right of the longest bar for its label: a third of the axis's span again.
    let hi = top * (top / lo).powf(0.45) * 1.3;
    #[allow(clippy::cast_precision_loss)]
    let y_top = k as f64 - 0.5;
    #[allow(clippy::cast_precision_loss)]
    let key_points: Vec<f64> = (0..k).map(|i| i as f64).collect();
    let label_at = |y: &f64| -> String {
        #[allow(clippy::cast_possible_truncation)]
        let row = y.round() as i64;
        usize::try_from(row)
            .ok()
            .and_then(|r| k.checked_sub(r + 1))
            .and_then(|i| rows.get(i))
            .map(|r| r.0.summary.to_owned())
            .unwrap_or_default()
    };
    let x_fmt = |v: &f64| format!("{}x", compact(*v));
    let mut chart = ChartBuilder::on(&body)
        .margin(12)
        .margin_right(20)
        .x_label_area_size(44)
        .y_label_area_size(230)
        .build_cartesian_2d(log_ticked(lo, hi), ticked(-0.5..y_top, key_points))?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .light_line_style(TRANSPARENT)
        .bold_line_style(RGBColor(0xdd, 0xdd, 0xdd))
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&label_at)
        .x_desc("ctxlog / best other (log scale; right of 1: ctxlog ahead)")
        .label_style(font(13.0))
        .axis_desc_style(font(13.0))
        .draw()?;
    for (j, (_, ratio, who)) in rows.iter().enumerate() {
        #[allow(clippy::cast_precision_loss)]
        let y = (k - 1 - j) as f64;
        let ahead = *ratio >= 1.0;
        let colour = if ahead {
            engine_colour("ctxlog")
        } else {
            engine_colour(who)
        };
        chart.draw_series(std::iter::once(Rectangle::new(
            [(ratio.min(1.0), y - 0.32), (ratio.max(1.0), y + 0.32)],
            colour.filled(),
        )))?;
        let label = if ahead {
            format!("{} (next: {who})", fmt_ratio(*ratio))
        } else {
            format!("{} ({who} ahead)", fmt_ratio(*ratio))
        };
        chart.draw_series(std::iter::once(
            EmptyElement::at((ratio.max(1.0), y))
                + Text::new(
                    label,
                    (6, 0),
                    font(13.0).color(&BLACK).pos(Pos::new(HPos::Left, VPos::Center)),
                ),
        ))?;
    }
    chart.draw_series(std::iter::once(PathElement::new(
        vec![(1.0, -0.5), (1.0, y_top)],
        BLACK.stroke_width(2),
    )))?;
    root.present()?;
    Ok(true)
}

/// Draws every chart of `set` into `dir` (created if missing); the files written.
///
/// # Errors
/// A file that cannot be written.
pub fn render_all(set: &ResultSet, dir: &Path) -> Res<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    for chart in &PHASE_CHARTS {
        if chart
            .figures
            .iter()
            .all(|f| set.engines.iter().all(|e| set.median(e, f.field).is_none()))
        {
            continue;
        }
        let path = dir.join(chart.file);
        render_phase(set, chart, &path)?;
        written.push(path);
    }
    for chart in &LATENCY_CHARTS {
        let path = dir.join(chart.0);
        if render_latency(set, chart, &path)? {
            written.push(path);
        }
    }
    let path = dir.join(SUMMARY_FILE);
    if render_summary(set, &path)? {
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// Two invocations: an older one (n = 1000) and the newest (n = 2000, three runs of ctxlog and
    /// sled, two of sqlite), with disk records between them.
    fn sample() -> String {
        let mut lines = vec![
            r#"{"kind":"disk","run":1,"started":100,"seq_write_mb_s":500}"#.to_owned(),
            r#"{"kind":"engine","engine":"ctxlog","run":1,"n":1000,"started":100,"p1_items_s":1.0}"#.to_owned(),
            r#"{"kind":"engine","engine":"sled","run":1,"n":1000,"started":100,"p1_items_s":2.0}"#.to_owned(),
            String::new(),
        ];
        for run in 1..=3u64 {
            lines.push(format!(
                r#"{{"kind":"disk","run":{run},"started":200,"seq_write_mb_s":400}}"#
            ));
            for (engine, base) in [("sled", 100.0), ("sqlite", 50.0), ("ctxlog", 300.0)] {
                if engine == "sqlite" && run == 3 {
                    continue;
                }
                #[allow(clippy::cast_precision_loss)]
                let v = base * run as f64;
                let q: Vec<f64> = LATENCY_QUANTILES.iter().map(|q| (q + 0.01) * v / 100.0).collect();
                lines.push(
                    serde_json::json!({
                        "kind": "engine", "engine": engine, "run": run, "n": 2000, "started": 200,
                        "p1_items_s": v, "p1_mb_s": v / 10.0,
                        "p2_ops_s": v, "p2_8t_ops_s": v * 2.0, "p2_8t_p99_ms": 100.0 / v,
                        "p3_ops_s": v, "p3_raw_ops_s": v * 1.5,
                        "p5_close_s": 0.01, "p5_reopen_s": 0.02 * run as f64,
                        "p6_bytes": 1e6 * v, "p7_ratio_live": 1.5,
                        "latency_quantiles": LATENCY_QUANTILES,
                        "p2_latency_ms_quantiles": q,
                        "p2_8t_latency_ms_quantiles": q.iter().map(|x| x * 3.0).collect::<Vec<f64>>(),
                    })
                    .to_string(),
                );
            }
        }
        lines.join("\n")
    }

    #[test]
    fn medians() {
        assert_eq!(median(vec![]), None);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
    }

    #[test]
    fn newest_set_and_its_medians() {
        let records = parse_jsonl(&sample()).unwrap();
        assert_eq!(records.len(), 3 + 3 * 4 - 1, "blank lines skipped");
        let set = newest_set(&records).unwrap();
        assert_eq!((set.n, set.started, set.runs), (2000, Some(200), 3));
        assert_eq!(set.engines, ["ctxlog", "sled", "sqlite"], "chart order, not file order");
        assert_eq!(set.records.len(), 8);
        assert_eq!(set.median("ctxlog", "p1_items_s"), Some(600.0));
        assert_eq!(
            set.median("sqlite", "p1_items_s"),
            Some(75.0),
            "two runs: the mean of both"
        );
        assert_eq!(set.median("ctxlog", "p4_items_s"), None);
        let q = set.median_array("sled", "p2_latency_ms_quantiles").unwrap();
        assert_eq!(q.len(), LATENCY_QUANTILES.len());
        assert!((q[6] - 0.51 * 2.0).abs() < 1e-9, "{q:?}");
        assert_eq!(set.quantiles(), LATENCY_QUANTILES.to_vec());
        // Higher is better: ctxlog 600 against sled's 200. Lower is better: p99 100/600 against 100/200.
        let (r, who) = set.ratio_to_best_other(&PHASE_CHARTS[0].figures[0]).unwrap();
        assert_eq!(who, "sled");
        assert!((r - 3.0).abs() < 1e-9);
        let p99 = &PHASE_CHARTS[1].figures[2];
        assert_eq!(p99.field, "p2_8t_p99_ms");
        let (r, who) = set.ratio_to_best_other(p99).unwrap();
        assert_eq!(who, "sled");
        assert!((r - 3.0).abs() < 1e-9, "{r}");

        assert!(parse_jsonl("{}\nnot json\n")
            .unwrap_err()
            .to_string()
            .contains("line 2"));
        assert!(newest_set(&parse_jsonl(r#"{"kind":"disk"}"#).unwrap()).is_none());
    }

    #[test]
    fn labels() {
        assert_eq!(compact(0.0), "0");
        assert_eq!(compact(12345.0), "12.3k");
        assert_eq!(compact(50000.0), "50k");
        assert_eq!(compact(1_234_567.0), "1.23M");
        assert_eq!(compact(2345.0), "2.35k");
        assert_eq!(compact(999.0), "999");
        assert_eq!(fmt_ratio(0.7912), "0.79x");
        assert_eq!(fmt_ratio(2000.4), "2000x");
        assert_eq!(compact(0.012_34), "0.0123");
        assert_eq!(compact(1.5), "1.5");
        assert_eq!(thousands(200_000), "200,000");
        assert_eq!(thousands(999), "999");
        assert!((nines(0.99) - 2.0).abs() < 1e-9);
    }

    #[test]
    fn renders_well_formed_svg_naming_every_engine() {
        let set = newest_set(&parse_jsonl(&sample()).unwrap()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let written = render_all(&set, dir.path()).unwrap();
        let names: Vec<String> = written
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        // P4 has no figures in the sample, nor P3 latency: no file for them.
        assert_eq!(
            names,
            [
                "p1.svg",
                "p2.svg",
                "p3.svg",
                "p5.svg",
                "p6.svg",
                "p7.svg",
                "latency-p2.svg",
                "summary.svg"
            ]
        );
        let mut texts_of = BTreeMap::new();
        for path in &written {
            let svg = std::fs::read_to_string(path).unwrap();
            let doc = roxmltree::Document::parse(&svg).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert_eq!(doc.root_element().tag_name().name(), "svg");
            let texts: Vec<&str> = doc.descendants().filter_map(|n| n.text()).map(str::trim).collect();
            texts_of.insert(
                path.file_name().unwrap().to_string_lossy().into_owned(),
                texts.join("|"),
            );
            if names.iter().any(|n| path.ends_with(n) && n != "summary.svg") {
                for engine in &set.engines {
                    assert!(texts.contains(&engine.as_str()), "{} lacks {engine}", path.display());
                }
            }
            // Every text at least 12 px.
            for node in doc.descendants().filter(|n| n.has_tag_name("text")) {
                let size: f64 = node.attribute("font-size").unwrap().parse().unwrap();
                assert!(size >= 12.0, "{}: font-size {size}", path.display());
            }
        }
        let summary = &texts_of["summary.svg"];
        assert!(
            summary.contains("|P1 bulk load, items/s|") && summary.contains("|3.00x (next: sled)|"),
            "{summary}"
        );
        let p1 = &texts_of["p1.svg"];
        assert!(
            p1.contains("|items/s, higher is better|") && p1.contains("|600|"),
            "{p1}"
        );
        let p5 = &texts_of["p5.svg"];
        assert!(p5.contains("|ms, lower is better|") && p5.contains("|10|"), "{p5}");
    }
}
