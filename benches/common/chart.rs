//! The chart of `benches/train_step.rs`: samples/s per model and configuration, as SVG, from
//! the CSV rows of one run (and PyTorch's, `benches/torch_models.py`).

use std::fmt::Write as _;

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

/// A grouped bar chart of samples/s: one panel per model and batch size, one bar per
/// configuration, each panel scaled to its own maximum. With `per_replica`, rows are grouped
/// by their batch per replica (the scaling runs, whose batch grows with the replicas).
pub fn svg(records: &[(String, String, usize, f64)], per_replica: bool) -> String {
    let group_batch = |config: &str, batch: usize| match per_replica {
        true => batch / replica_count(config),
        false => batch,
    };
    let mut groups: Vec<(String, usize)> = Vec::new();
    let mut configs: Vec<String> = Vec::new();
    for (model, config, batch, _) in records {
        let key = (model.clone(), group_batch(config, *batch));
        if !groups.contains(&key) {
            groups.push(key);
        }
        if !configs.contains(config) {
            configs.push(config.clone());
        }
    }
    let colors = [
        "#4c72b0", "#55a868", "#c44e52", "#8172b2", "#ccb974", "#64b5cd", "#8c8c8c", "#e17c05",
    ];
    let (panel_w, panel_h, top, left) = (40.0 + 28.0 * configs.len() as f64, 260.0, 40.0, 30.0);
    let width = left + panel_w * groups.len() as f64 + 20.0;
    let height = top + panel_h + 60.0 + 18.0 * configs.len() as f64;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
         font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" \
         fill=\"white\"/>\n<text x=\"{left}\" y=\"20\" font-size=\"14\">Training samples/s per \
         model and batch size{} (bar label: samples/s)</text>\n",
        if per_replica { " per replica" } else { "" }
    );
    let suffix = if per_replica { "/replica" } else { "" };
    for (g, (model, batch)) in groups.iter().enumerate() {
        let x0 = left + panel_w * g as f64;
        let in_group: Vec<_> = records
            .iter()
            .filter(|r| &r.0 == model && group_batch(&r.1, r.2) == *batch)
            .collect();
        let max = in_group.iter().map(|r| r.3).fold(1e-9, f64::max);
        for r in &in_group {
            let c = configs.iter().position(|c| *c == r.1).unwrap_or(0);
            let h = (panel_h - 20.0) * r.3 / max;
            let x = x0 + 10.0 + 28.0 * c as f64;
            let y = top + panel_h - h;
            let _ = writeln!(
                out,
                "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"24\" height=\"{h:.1}\" fill=\"{}\"/>\
                 <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"8\" text-anchor=\"middle\">{:.0}</text>",
                colors[c % colors.len()],
                x + 12.0,
                y - 3.0,
                r.3
            );
        }
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{model} b{batch}{suffix}</text>",
            x0 + panel_w / 2.0,
            top + panel_h + 16.0
        );
    }
    for (c, config) in configs.iter().enumerate() {
        let y = top + panel_h + 40.0 + 18.0 * c as f64;
        let _ = writeln!(
            out,
            "<rect x=\"{left}\" y=\"{:.1}\" width=\"12\" height=\"12\" fill=\"{}\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\">{config}</text>",
            y - 10.0,
            colors[c % colors.len()],
            left + 18.0,
            y
        );
    }
    out.push_str("</svg>\n");
    out
}

/// `(model, backend and configuration, batch, samples/s)` from CSV text.
pub fn parse_csv(text: &str) -> Vec<(String, String, usize, f64)> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split(',').collect();
            Some((
                f.get(1)?.to_string(),
                format!("{}: {}", f.first()?, f.get(3)?),
                f.get(2)?.parse().ok()?,
                f.get(5)?.parse().ok()?,
            ))
        })
        .collect()
}
