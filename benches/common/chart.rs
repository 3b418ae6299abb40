//! The charts of the benches, as SVG drawn with `plotters`, from the CSV rows of one run
//! (`backend,model,batch,config,median_ms,samples_per_s,memory_bytes`: `benches/train_step.rs`,
//! `benches/strategies.rs` and PyTorch's `benches/torch_models.py` write it):
//!
//! - [`bars`]: samples/s per model and batch, one bar per configuration, a value axis per
//!   panel;
//! - [`scaling`]: speed-up against the replica (or GPU) count, one line per strategy.
#![allow(dead_code)]

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// One CSV row: model, "backend: configuration", batch, samples/s.
pub type Record = (String, String, usize, f64);

const COLORS: [RGBColor; 10] = [
    RGBColor(0x4c, 0x72, 0xb0),
    RGBColor(0x55, 0xa8, 0x68),
    RGBColor(0xc4, 0x4e, 0x52),
    RGBColor(0x81, 0x72, 0xb2),
    RGBColor(0xcc, 0xb9, 0x74),
    RGBColor(0x64, 0xb5, 0xcd),
    RGBColor(0x8c, 0x8c, 0x8c),
    RGBColor(0xe1, 0x7c, 0x05),
    RGBColor(0x2a, 0x2a, 0x2a),
    RGBColor(0xb0, 0x4c, 0x9c),
];

const GREY: RGBColor = RGBColor(0xbb, 0xbb, 0xbb);

fn color(i: usize) -> RGBColor {
    COLORS[i % COLORS.len()]
}

/// How many replicas (or GPUs) a configuration name says it runs: `n` in "DataParallel xn",
/// `N` in "DDP N GPUs"; 1 for the bare model.
pub fn replica_count(config: &str) -> usize {
    let words: Vec<&str> = config.split_whitespace().collect();
    let after_x = words
        .iter()
        .find_map(|w| w.strip_prefix('x').and_then(|n| n.parse().ok()));
    let before_gpus = words
        .windows(2)
        .find(|w| w[1].starts_with("GPU"))
        .and_then(|w| w[0].parse().ok());
    after_x.or(before_gpus).unwrap_or(1).max(1)
}

/// A configuration's strategy: its name without the counts ("DataParallel x2 on 2 devices"
/// and "DataParallel x4" are one strategy); `None` for a bare model, the baseline.
pub fn strategy(config: &str) -> Option<String> {
    let (backend, name) = config.split_once(": ").unwrap_or(("", config));
    if name.starts_with("bare") {
        return None;
    }
    let words: Vec<&str> = name
        .split_whitespace()
        .filter(|w| {
            let count = w.strip_prefix('x').unwrap_or(w);
            !(count.parse::<usize>().is_ok()
                || w.starts_with("GPU")
                || *w == "on"
                || *w == "devices")
        })
        .collect();
    Some(format!("{backend}: {}", words.join(" ")))
}

/// `1234567` as "1.23M", `45678` as "45.7k".
fn human(value: f64) -> String {
    match value {
        v if v >= 1e6 => format!("{:.2}M", v / 1e6),
        v if v >= 1e4 => format!("{:.1}k", v / 1e3),
        v if v >= 1e3 => format!("{:.2}k", v / 1e3),
        v => format!("{v:.0}"),
    }
}

/// Draws a legend, one swatch (a square, or a line with `lines`) and name per entry, on
/// `area`.
fn legend(area: &Area<'_>, entries: &[(String, RGBColor)], lines: bool) {
    let style = TextStyle::from(("sans-serif", 13).into_font());
    for (i, (name, color)) in entries.iter().enumerate() {
        let y = 6 + 18 * i as i32;
        let swatch = match lines {
            true => Rectangle::new([(20, y + 5), (38, y + 8)], color.filled()),
            false => Rectangle::new([(20, y), (32, y + 12)], color.filled()),
        };
        area.draw(&swatch).expect("draw");
        area.draw_text(name, &style, (44, y)).expect("draw");
    }
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// The panels of a chart: one per model and batch (the batch per replica with
/// `per_replica`: the scaling runs, whose batch grows with the replicas), sorted.
struct Panels<'r> {
    records: &'r [Record],
    per_replica: bool,
    groups: Vec<(String, usize)>,
}

impl<'r> Panels<'r> {
    fn new(records: &'r [Record], per_replica: bool) -> Self {
        let mut panels = Self {
            records,
            per_replica,
            groups: Vec::new(),
        };
        for record in records {
            let key = (record.0.clone(), panels.batch(record));
            if !panels.groups.contains(&key) {
                panels.groups.push(key);
            }
        }
        panels.groups.sort();
        panels
    }

    /// A row's batch as the panels group it.
    fn batch(&self, record: &Record) -> usize {
        match self.per_replica {
            true => record.2 / replica_count(&record.1),
            false => record.2,
        }
    }

    /// The rows of panel `g`, in their order.
    fn rows(&self, g: usize) -> Vec<&'r Record> {
        let (model, batch) = &self.groups[g];
        (self.records.iter())
            .filter(|r| &r.0 == model && self.batch(r) == *batch)
            .collect()
    }

    /// Panel `g`'s caption.
    fn caption(&self, g: usize) -> String {
        let (model, batch) = &self.groups[g];
        let suffix = if self.per_replica { " per replica" } else { "" };
        format!("{model}, batch {batch}{suffix}")
    }
}

/// An SVG chart: `title`, one panel of `panel_w` by 320 pixels per group of `panels` (drawn
/// by `panel`), and the legend of `entries` below (swatches as lines with `lines`).
fn canvas(
    title: &str,
    panels: &Panels<'_>,
    panel_w: u32,
    entries: &[(String, RGBColor)],
    lines: bool,
    mut panel: impl FnMut(&Area<'_>, usize),
) -> String {
    let plot_h = 320u32;
    // Wide enough for the title: sans-serif at 17 px averages under 9 px a character.
    let title_w = 24 + 9 * title.chars().count() as u32;
    let width = (panel_w * panels.groups.len() as u32).max(500).max(title_w);
    let height = 40 + plot_h + (14 + 18 * entries.len()) as u32;
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (width, height)).into_drawing_area();
        root.fill(&WHITE).expect("fill");
        let (head, rest) = root.split_vertically(40);
        head.draw_text(
            title,
            &TextStyle::from(("sans-serif", 17).into_font()),
            (12, 12),
        )
        .expect("draw");
        let (plots, below) = rest.split_vertically(plot_h);
        let areas = plots.split_evenly((1, panels.groups.len().max(1)));
        for (g, area) in areas.iter().enumerate().take(panels.groups.len()) {
            panel(area, g);
        }
        legend(&below, entries, lines);
        root.present().expect("present");
    }
    out
}

/// A grouped bar chart of samples/s: one panel per model and batch size, each with its own
/// value axis, one bar per configuration (one colour per configuration across panels). With
/// `per_replica`, rows are grouped by their batch per replica (the scaling runs, whose batch
/// grows with the replicas). `title` heads the chart.
pub fn bars(records: &[Record], per_replica: bool, title: &str) -> String {
    let panels = Panels::new(records, per_replica);
    let mut configs: Vec<String> = Vec::new();
    for (_, config, _, _) in records {
        if !configs.contains(config) {
            configs.push(config.clone());
        }
    }
    let entries: Vec<(String, RGBColor)> = (configs.iter().enumerate())
        .map(|(c, name)| (name.clone(), color(c)))
        .collect();
    let panel_w = (70 + 34 * configs.len()) as u32;
    canvas(title, &panels, panel_w, &entries, false, |area, g| {
        let in_group = panels.rows(g);
        let max = in_group.iter().map(|r| r.3).fold(1e-9, f64::max);
        let mut chart = ChartBuilder::on(area)
            .caption(panels.caption(g), ("sans-serif", 14))
            .margin(6)
            .y_label_area_size(52)
            .x_label_area_size(6)
            .build_cartesian_2d(0f64..in_group.len() as f64, 0f64..max * 1.15)
            .expect("chart");
        chart
            .configure_mesh()
            .disable_x_mesh()
            .light_line_style(RGBColor(0xf0, 0xf0, 0xf0))
            .x_labels(0)
            .y_labels(6)
            .y_desc("samples/s")
            .y_label_formatter(&|v| human(*v))
            .draw()
            .expect("mesh");
        for (i, r) in in_group.iter().enumerate() {
            let c = configs.iter().position(|c| *c == r.1).unwrap_or(0);
            let x = i as f64;
            let bar = Rectangle::new([(x + 0.12, 0.0), (x + 0.88, r.3)], color(c).filled());
            let label = TextStyle::from(("sans-serif", 10).into_font())
                .pos(Pos::new(HPos::Center, VPos::Bottom));
            chart.draw_series([bar]).expect("bar");
            chart
                .draw_series([Text::new(human(r.3), (x + 0.5, r.3 * 1.01), label)])
                .expect("label");
        }
    })
}

/// Speed-up against the replica (or GPU) count: one panel per model and batch per replica,
/// one line per backend and strategy, each point its samples/s over the bare model's of the
/// same backend, model and batch per replica (rows of a run whose batch grows with the
/// replicas, one per GPU); a grey line marks linear scaling. With `per_replica` false the
/// batch is the global one and the bare model's is that batch's (replicas sharing a device,
/// where the line to beat is the other strategies', not linear scaling).
pub fn scaling(records: &[Record], per_replica: bool, title: &str) -> String {
    let backend = |config: &str| config.split_once(": ").map(|(b, _)| b.to_string());
    let panels = Panels::new(records, per_replica);
    let mut series: Vec<String> = Vec::new();
    for (_, config, _, _) in records {
        if let Some(name) = strategy(config)
            && !series.contains(&name)
        {
            series.push(name);
        }
    }
    let max_count = records
        .iter()
        .map(|r| replica_count(&r.1))
        .max()
        .unwrap_or(1)
        .max(2);
    let mut entries: Vec<(String, RGBColor)> = (series.iter().enumerate())
        .map(|(s, name)| (name.clone(), color(s)))
        .collect();
    if per_replica {
        entries.push(("linear scaling".into(), GREY));
    }
    canvas(title, &panels, 360, &entries, true, |area, g| {
        let in_group = panels.rows(g);
        let bare = |b: &Option<String>| {
            (in_group.iter())
                .find(|r| strategy(&r.1).is_none() && backend(&r.1) == *b)
                .map(|r| r.3)
        };
        let mut lines: Vec<(usize, Vec<(f64, f64)>)> = Vec::new();
        for (s, name) in series.iter().enumerate() {
            let mut points: Vec<(f64, f64)> = (in_group.iter())
                .filter(|r| strategy(&r.1).as_ref() == Some(name))
                .filter_map(|r| {
                    let base = bare(&backend(&r.1))?;
                    Some((replica_count(&r.1) as f64, r.3 / base))
                })
                .collect();
            // One device is the bare model itself: every line starts at 1x.
            if !points.is_empty() && !points.iter().any(|p| p.0 == 1.0) {
                points.push((1.0, 1.0));
            }
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            if !points.is_empty() {
                lines.push((s, points));
            }
        }
        // Linear scaling is the reference for distinct devices only.
        let floor = if per_replica { max_count as f64 } else { 1.0 };
        let top = (lines.iter().flat_map(|(_, p)| p.iter().map(|p| p.1))).fold(floor, f64::max);
        let mut chart = ChartBuilder::on(area)
            .caption(panels.caption(g), ("sans-serif", 14))
            .margin(8)
            .y_label_area_size(44)
            .x_label_area_size(36)
            .build_cartesian_2d(0.8f64..max_count as f64 + 0.2, 0f64..top * 1.1)
            .expect("chart");
        chart
            .configure_mesh()
            .light_line_style(RGBColor(0xf0, 0xf0, 0xf0))
            .x_labels(max_count + 1)
            .x_label_formatter(&|v| format!("{v:.0}"))
            .x_desc(match per_replica {
                true => "replicas, one per GPU",
                false => "replicas sharing one device",
            })
            .y_desc("speed-up over the bare model")
            .y_label_formatter(&|v| format!("{v:.1}x"))
            .draw()
            .expect("mesh");
        if per_replica {
            let linear = [(1.0, 1.0), (max_count as f64, max_count as f64)];
            chart
                .draw_series(LineSeries::new(linear, GREY))
                .expect("line");
        }
        for (s, points) in lines {
            let style = color(s).stroke_width(2);
            chart
                .draw_series(LineSeries::new(points.clone(), style))
                .expect("line");
            chart
                .draw_series(points.iter().map(|&p| Circle::new(p, 3, color(s).filled())))
                .expect("points");
            // A measured point near the axis reads as its value, not as a missing run at 0.
            let small = ("sans-serif", 11).into_font().color(&color(s));
            chart
                .draw_series(points.iter().filter(|p| p.1 < 0.1).map(|&(x, y)| {
                    Text::new(
                        format!("{y:.3}x (measured)"),
                        (x + 0.04, y + top * 0.03),
                        &small,
                    )
                }))
                .expect("labels");
        }
    })
}

/// `plot[-scaling|-speedup|-speedup-global] OUT.svg CSV...` (`benches/train_step.rs`): the
/// chart of earlier runs' CSV files; `CHART_TITLE` replaces the title.
pub fn plot(mode: &str, args: &[String]) {
    let out = args.first().expect("plot OUT.svg CSV...");
    let mut records = Vec::new();
    for path in &args[1..] {
        let text = std::fs::read_to_string(path).expect("read a CSV");
        records.extend(parse_csv(&text));
    }
    let title = std::env::var("CHART_TITLE").ok();
    let title = |default: &str| title.clone().unwrap_or_else(|| default.to_string());
    let chart = match mode {
        "plot" => bars(
            &records,
            false,
            &title("Training samples/s (higher is better)"),
        ),
        "plot-scaling" => bars(
            &records,
            true,
            &title("Training samples/s, batch per replica kept (higher is better)"),
        ),
        "plot-speedup" => scaling(
            &records,
            true,
            &title("Speed-up over one device, batch per replica kept"),
        ),
        "plot-speedup-global" => scaling(
            &records,
            false,
            &title("Speed-up over the bare model at the same global batch"),
        ),
        other => panic!("unknown mode {other}: plot, plot-scaling, plot-speedup[-global]"),
    };
    std::fs::write(out, chart).expect("write the chart");
}

/// Rows from CSV text (the header skipped). Rows that do not parse, and rows without a
/// measurement (samples/s zero, negative or not a number: a run that failed or did not
/// finish), are left out, so that a chart never draws a missing point as a value.
pub fn parse_csv(text: &str) -> Vec<Record> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split(',').collect();
            let samples_per_s: f64 = f.get(5)?.parse().ok()?;
            (samples_per_s.is_finite() && samples_per_s > 0.0).then_some(())?;
            Some((
                f.get(1)?.to_string(),
                format!("{}: {}", f.first()?, f.get(3)?),
                f.get(2)?.parse().ok()?,
                samples_per_s,
            ))
        })
        .collect()
}
