//! The gather's concatenation on one device against Burn's `Tensor::cat` and a plain copy of
//! the same bytes; with `--split`, the scatter's split into contiguous pieces against Burn's.
//!
//! ```sh
//! cargo bench --bench concat                                       # CPU (Flex)
//! cargo bench --features cuda,fusion,autotune --bench concat -- --device cuda:0
//! cargo bench --features cuda,autotune --bench concat -- --device cuda:0 --split
//! cargo bench --features cuda,fusion,autotune --bench concat -- --device cuda:0 --fusion-ways
//! ```
//!
//! For every total size and count of inputs, three operations on the same inputs alternate
//! (the order rotating each round, after one warm-up round): `gather` (`Gather::gather` of a
//! `Tensor` on its output device: the crate's kernel on CubeCL devices, under Fusion the
//! kernel or Fusion's `cat` by the crate's rule), `cat`
//! (`Tensor::cat`), and `copy` (the whole output's bytes read and written once, by
//! `add_scalar`: the device's copy rate). A sample is `--iters` calls then a device sync,
//! their outputs kept until after it. Each call reads tensors of its own: Burn's Fusion merges
//! operations on one input (element-wise ones, `cat`) into one kernel that reads it once.
//! Printed per case: each operation's median time per call, the spread of its rounds, its
//! rate (bytes read and written per second), `gather`'s ratio to `cat` and to `copy`, and
//! `gather`'s host time per call (the calls enqueued, before the sync): where it comes near
//! its time per call, the host's launch work, not the device, sets the gather's time. (Under
//! Fusion operations run at the sync, so there the host time is the queue's only.)
//! `--fusion-ways` adds `kernel`, the gather with the crate's kernel forced, after `gather`.
//! `--alt-cubes N` adds `alt`, the gather (the kernel forced under Fusion) with the kernel's
//! cap of cubes at `N` instead of its default, after them; `--alt-group N` the same with at
//! most `N` inputs a launch (several launches into the one output), alone or with
//! `--alt-cubes`.
//!
//! With `--split` the first two operations are `scatter` (`Scatter::scatter` of one tensor
//! into `parts` pieces along its columns, all on the device: the crate's kernel, one launch
//! writing contiguous pieces) and `split` (Burn's `split_with_sizes`, each piece then copied
//! by `add_scalar` into a contiguous tensor, as a replica's first operation or a move to
//! another device would: Burn's slices along the columns are strided views). Splits along
//! rows are views in both and cost no copy.

use std::time::{Duration, Instant};

use burn::tensor::{Device, Tensor};
use burn_dataparallel::__bench::{
    FusionConcat, set_concat_cubes, set_concat_group, set_fusion_concat,
};
use burn_dataparallel::{DeviceList, Gather, Scatter, Shards};
use clap::Parser;

#[derive(Parser, Debug)]
struct Args {
    /// The device (one entry of a `DeviceList`).
    #[arg(long, default_value = "cpu")]
    device: DeviceList,
    /// Total sizes of the output, in KiB.
    #[arg(long, value_delimiter = ',', default_value = "4,64,1024,16384,262144")]
    sizes_kib: Vec<usize>,
    /// Counts of inputs.
    #[arg(long, value_delimiter = ',', default_value = "2,4,8")]
    parts: Vec<usize>,
    /// Columns of every input (rows make up the size; fewer columns for sizes without a row
    /// of them per input).
    #[arg(long, default_value_t = 1024)]
    cols: usize,
    /// Timed rounds after one warm-up round.
    #[arg(long, default_value_t = 7)]
    rounds: usize,
    /// Calls per sample.
    #[arg(long, default_value_t = 20)]
    iters: usize,
    /// Split one tensor along its columns instead of concatenating.
    #[arg(long)]
    split: bool,
    /// Under Fusion: the gather by the crate's rule (`gather`) beside the gather with the
    /// crate's kernel forced (`kernel`), where the rule may take Fusion's `cat`.
    #[arg(long)]
    fusion_ways: bool,
    /// The gather with the concat kernel's cap of cubes at this many (`alt`), beside the
    /// gather with the default cap.
    #[arg(long)]
    alt_cubes: Option<usize>,
    /// The gather with at most this many inputs a launch of the concat kernel (`alt`), beside
    /// the gather with one launch for all.
    #[arg(long)]
    alt_group: Option<usize>,
    /// Passed by `cargo bench`.
    #[arg(long, hide = true)]
    bench: bool,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    Gather,
    /// The gather with the crate's kernel forced under Fusion (`--fusion-ways`).
    Kernel,
    /// The gather with another cap of cubes or of inputs a launch, the kernel forced under
    /// Fusion (`--alt-cubes`, `--alt-group`; `None`: the default).
    Alt {
        cubes: Option<usize>,
        group: Option<usize>,
    },
    Cat,
    Scatter,
    Split,
    Copy,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Gather => "gather",
            Op::Kernel => "kernel",
            Op::Alt { .. } => "alt",
            Op::Cat => "cat",
            Op::Scatter => "scatter",
            Op::Split => "split",
            Op::Copy => "copy",
        }
    }
}

/// One call of `op` on `inputs` (gathered along dim 0) or on `whole` (their rows in one
/// tensor; split along its columns by `shards`).
fn call(op: Op, inputs: &[Tensor<2>], whole: &Tensor<2>, shards: &Shards) -> Vec<Tensor<2>> {
    match op {
        Op::Gather => vec![Gather::gather(inputs.to_vec(), shards).expect("same shapes")],
        Op::Kernel => {
            set_fusion_concat(FusionConcat::Kernel);
            let output = Gather::gather(inputs.to_vec(), shards).expect("same shapes");
            set_fusion_concat(FusionConcat::Rule);
            vec![output]
        }
        Op::Alt { cubes, group } => {
            // Each knob set for this call only, back to what it was after.
            let cubes = cubes.map(set_concat_cubes);
            let group = group.map(set_concat_group);
            let output = call(Op::Kernel, inputs, whole, shards);
            if let Some(cubes) = cubes {
                set_concat_cubes(cubes);
            }
            if let Some(group) = group {
                set_concat_group(group);
            }
            output
        }
        Op::Cat => vec![Tensor::cat(inputs.to_vec(), 0)],
        Op::Scatter => Scatter::scatter(whole.clone(), shards),
        Op::Split => (whole.clone().split_with_sizes(shards.sizes().to_vec(), 1))
            .into_iter()
            .map(|piece| piece.add_scalar(1.0))
            .collect(),
        Op::Copy => vec![whole.clone().add_scalar(1.0)],
    }
}

/// The time per call of `iters` calls of `op`, synced at both ends, and the host's time per
/// call until the last was enqueued. The outputs live until after the sync: Burn's Fusion
/// skips an operation whose output is dropped unread. Each call has inputs of its own
/// (`Inputs`).
fn sample(op: Op, inputs: &Inputs, shards: &Shards, iters: usize) -> (Duration, Duration) {
    let device = inputs.wholes[0].device();
    device.sync().expect("the device answers");
    let start = Instant::now();
    let outputs: Vec<Vec<Tensor<2>>> = (0..iters)
        .map(|k| {
            let k = k % inputs.wholes.len();
            call(op, &inputs.pieces[k], &inputs.wholes[k], shards)
        })
        .collect();
    let enqueued = start.elapsed() / iters as u32;
    device.sync().expect("the device answers");
    let elapsed = start.elapsed() / iters as u32;
    drop(outputs);
    (elapsed, enqueued)
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
}

/// The inputs of a sample's calls, each call's its own: Burn's Fusion merges operations that
/// read one tensor into one kernel that reads it once (twenty copies of one tensor measured
/// above the device's memory bandwidth), and `cat` is one of the operations it fuses.
struct Inputs {
    /// Per call, `parts` tensors to concatenate.
    pieces: Vec<Vec<Tensor<2>>>,
    /// Per call, one tensor of all their rows, for the copy.
    wholes: Vec<Tensor<2>>,
}

/// `copies` sets of `parts` inputs of `cols` columns (fewer where `bytes` has not a row of
/// them per input) and uneven rows (the first ones one row longer) that make up `bytes` of
/// f32 (rounded to whole rows), and as many tensors of the same rows.
fn inputs(bytes: usize, parts: usize, cols: usize, copies: usize, device: &Device) -> Inputs {
    let cols = cols.min(bytes / 4 / parts).max(1);
    let rows = (bytes / 4 / cols).max(parts);
    let random =
        |rows: usize| Tensor::random([rows, cols], burn::tensor::Distribution::Default, device);
    let pieces = (0..copies)
        .map(|_| {
            (0..parts)
                .map(|i| random(rows / parts + usize::from(i < rows % parts)))
                .collect()
        })
        .collect();
    let wholes = (0..copies).map(|_| random(rows)).collect();
    Inputs { pieces, wholes }
}

fn main() {
    let args = Args::parse();
    let device = args
        .device
        .into_vec()
        .into_iter()
        .next()
        .expect("one device");
    println!(
        "device {device:?}, {} rounds of {} calls",
        args.rounds, args.iters
    );
    // Ours first, then Burn's, then the copy; ours are compared with both.
    let mut ops: Vec<Op> = match (args.split, args.fusion_ways) {
        (false, false) => vec![Op::Gather, Op::Cat, Op::Copy],
        (false, true) => vec![Op::Gather, Op::Kernel, Op::Cat, Op::Copy],
        (true, _) => vec![Op::Scatter, Op::Split, Op::Copy],
    };
    let (cubes, group) = (args.alt_cubes, args.alt_group);
    if (cubes.is_some() || group.is_some()) && !args.split {
        ops.insert(ops.len() - 2, Op::Alt { cubes, group });
    }
    let ours = ops.len() - 2;
    let (burns, copy) = (ops[ours], ops[ours + 1]);
    print!("{:>10} {:>5} |", "KiB", "parts");
    for op in &ops {
        print!(" {:>24}", format!("{} ms (range) GB/s", op.name()));
    }
    print!(" |");
    for op in &ops[..ours] {
        for other in [burns, copy] {
            print!(" {:>10}", format!("{}/{}", op.name(), other.name()));
        }
    }
    for op in &ops[..ours] {
        print!(" {:>12}", format!("{} host ms", op.name()));
    }
    println!();
    for &kib in &args.sizes_kib {
        for &parts in &args.parts {
            let inputs = inputs(kib * 1024, parts, args.cols, args.iters, &device);
            let [rows, cols] = inputs.wholes[0].dims();
            let bytes = 2.0 * (rows * cols * 4) as f64;
            let devices = vec![device.clone(); parts];
            let shards = match args.split {
                false => Shards::new(parts, &devices, None, 0, device.clone()),
                true => Shards::new(cols, &devices, None, 1, device.clone()),
            };
            let mut times: Vec<Vec<Duration>> = vec![Vec::new(); ops.len()];
            let mut hosts: Vec<Vec<Duration>> = vec![Vec::new(); ops.len()];
            for round in 0..=args.rounds {
                for k in 0..ops.len() {
                    let index = (k + round) % ops.len();
                    let (time, host) = sample(ops[index], &inputs, &shards, args.iters);
                    if round > 0 {
                        times[index].push(time);
                        hosts[index].push(host);
                    }
                }
            }
            let cells: Vec<(Duration, String)> = times
                .iter()
                .map(|samples| {
                    let (low, high) =
                        (samples.iter().min().unwrap(), samples.iter().max().unwrap());
                    let mid = median(samples.clone());
                    let rate = bytes / mid.as_secs_f64() / 1e9;
                    let ms = |d: &Duration| d.as_secs_f64() * 1e3;
                    (
                        mid,
                        format!("{:.4} ({:.4}-{:.4}) {rate:.1}", ms(&mid), ms(low), ms(high)),
                    )
                })
                .collect();
            let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
            print!("{kib:>10} {parts:>5} |");
            for cell in &cells {
                print!(" {:>24}", cell.1);
            }
            print!(" |");
            for cell in &cells[..ours] {
                for other in [&cells[ours], &cells[ours + 1]] {
                    print!(" {:>10.3}", ratio(cell.0, other.0));
                }
            }
            for host in &hosts[..ours] {
                print!(" {:>12.4}", median(host.clone()).as_secs_f64() * 1e3);
            }
            println!();
        }
    }
}
