//! One configuration's measurements in `benches/train_step.rs`, and how they are reported:
//! the printed table, the stage profile, the CSV and the chart written after every row.

use std::fmt::Write as _;
use std::time::Duration;

use burn_dataparallel::StepProfile;

use crate::chart::{bars, parse_csv};

/// One configuration's measurements.
pub struct Row {
    pub backend: String,
    pub model: String,
    pub batch: usize,
    pub config: String,
    pub median: Duration,
    pub first: Duration,
    pub memory: Option<u64>,
    pub profile: Option<StepProfile>,
    /// The profiled step's forward (with the loss), backward and optimizer step, each
    /// timed up to every device having run it.
    pub phases: Option<[Duration; 3]>,
}

impl Row {
    pub fn samples_per_s(&self) -> f64 {
        self.batch as f64 / self.median.as_secs_f64()
    }
}

/// The stage profile of the row's profiled step, and the rates of its transfers between
/// devices, if any.
pub fn print_profile(row: &Row) {
    if let Some([forward, backward, optimizer]) = row.phases {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "phases {} {} b{} {}: forward and loss {:.3} ms, backward {:.3} ms, optimizer {:.3} ms",
            row.backend,
            row.model,
            row.batch,
            row.config,
            ms(forward),
            ms(backward),
            ms(optimizer),
        );
    }
    let Some(profile) = &row.profile else { return };
    println!(
        "profile {} {} b{} {}: {profile}",
        row.backend, row.model, row.batch, row.config
    );
    // Effective rates of the inter-device transfers, stage time included (the replicate stage
    // also anchors the replicas' graphs).
    let rate = |bytes: u64, time: Duration| bytes as f64 / time.as_secs_f64() / 1e9;
    if profile.bytes_broadcast > 0 || profile.bytes_reduced > 0 {
        println!(
            "transfers {} {} b{} {}: broadcast {:.1} MB at {:.1} GB/s, reduce {:.1} MB at {:.1} \
             GB/s",
            row.backend,
            row.model,
            row.batch,
            row.config,
            profile.bytes_broadcast as f64 / 1e6,
            rate(profile.bytes_broadcast, profile.replicate),
            profile.bytes_reduced as f64 / 1e6,
            rate(profile.bytes_reduced, profile.backward_transfers),
        );
    }
}

/// One table row. "vs bare" is the time per sample relative to the bare model's (below 1 is
/// faster): the step-time ratio at the same batch, and 1 / speed-up in a scaling run, whose
/// batch grows with the replicas. Empty until the bare model's row has run.
pub fn print_row(row: &Row, bare_samples_per_s: Option<f64>) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let memory = row
        .memory
        .map(|b| format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64))
        .unwrap_or_else(|| "-".into());
    let profile = match &row.profile {
        Some(p) => format!(
            "{:.2} / {:.2} / {:.2} / {:.2} / {:.2}",
            ms(p.scatter),
            ms(p.replicate),
            ms(p.slowest_forward()),
            ms(p.running_states),
            ms(p.gather)
        ),
        None => "-".into(),
    };
    println!(
        "| {} | {} | {} | {} | {:.3} ms | {:.0} | {} | {:.1} s | {} | {} |",
        row.backend,
        row.model,
        row.batch,
        row.config,
        ms(row.median),
        row.samples_per_s(),
        bare_samples_per_s
            .map(|b| format!("{:.3}x", b / row.samples_per_s()))
            .unwrap_or_else(|| "-".into()),
        row.first.as_secs_f64(),
        memory,
        profile,
    );
}

/// The CSV layout shared with `benches/torch_models.py`.
pub fn csv(rows: &[Row]) -> String {
    let mut out = String::from("backend,model,batch,config,median_ms,samples_per_s,memory_bytes\n");
    for row in rows {
        let _ = writeln!(
            out,
            "{},{},{},{},{:.4},{:.1},{}",
            row.backend,
            row.model,
            row.batch,
            row.config,
            row.median.as_secs_f64() * 1e3,
            row.samples_per_s(),
            row.memory.map(|m| m.to_string()).unwrap_or_default()
        );
    }
    out
}

/// Writes the CSV and the chart named by `TRAIN_STEP_CSV` and `TRAIN_STEP_SVG` (after every
/// row, so that a run stopped at its time limit leaves what it measured).
pub fn write_outputs(rows: &[Row]) {
    let table = csv(rows);
    if let Ok(path) = std::env::var("TRAIN_STEP_CSV") {
        std::fs::write(&path, &table).expect("write the CSV");
    }
    if let Ok(path) = std::env::var("TRAIN_STEP_SVG") {
        let mut records = parse_csv(&table);
        if let Ok(torch) = std::env::var("TORCH_CSV") {
            match std::fs::read_to_string(&torch) {
                Ok(text) => records.extend(parse_csv(&text)),
                Err(error) => eprintln!("no PyTorch results at {torch}: {error}"),
            }
        }
        let per_replica = std::env::var("TRAIN_STEP_SCALE_BATCH").as_deref() == Ok("1");
        let title = match per_replica {
            true => "Training samples/s, batch per replica kept (higher is better)",
            false => "Training samples/s (higher is better)",
        };
        let chart = bars(&records, per_replica, title);
        std::fs::write(&path, chart).expect("write the chart");
    }
}
