//! What replicas on other machines cost: the wrapper over this machine's CPU and remote
//! servers (Burn's remote backend over WebSocket), each server a process in a network
//! namespace of its own behind a link limited to a set rate, against the bare model and
//! against the same split with every replica local. Needs root (`ip netns`, `tc`).
//!
//! ```sh
//! cargo bench --features remote --bench remote_step
//! cargo bench --features remote --bench remote_step -- --servers 1,2 --rates 1gbit
//! ```
//!
//! For each rate and server count it prints: the step of the bare model, of the wrapper
//! over the same number of local replicas, and of the wrapper over the servers (medians of
//! rounds interleaving the three); the bytes each server's link carried per step each way,
//! against the model's parameter bytes; and two probes of the link: a one-element read
//! (a round trip: the per-message cost) and a 16 MiB tensor there and back (the per-byte
//! cost).
//!
//! The servers run on this machine's cores: a remote replica's compute competes with the
//! local one's. What the network adds is the remote row minus the local row.

use std::time::{Duration, Instant};

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::{ModuleOptimizer, SgdConfig};
use burn::tensor::{Device, Distribution, Tensor};
use burn_dataparallel::{DataParallel, DeviceList};
use clap::Parser;

// `benches/train_step`'s models: the MLP here, the rest there.
#[allow(dead_code)]
#[path = "../train_step/models.rs"]
mod models;
#[path = "../../tests/remote/servers.rs"]
mod servers;

use models::{Batch, Net, Sizes, Trained};
use servers::Server;

#[derive(Parser, Debug)]
struct Args {
    /// Server counts.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    servers: Vec<usize>,
    /// Link rates (`tc` forms; `none` for the bare veth).
    #[arg(long, value_delimiter = ',', default_value = "none,10gbit,1gbit")]
    rates: Vec<String>,
    /// The MLP's widths: inputs, two hidden layers, classes.
    #[arg(long, value_delimiter = ',', default_value = "256,1024,1024,10")]
    widths: Vec<usize>,
    /// Rows per batch.
    #[arg(long, default_value_t = 256)]
    rows: usize,
    /// Timed rounds, each a step of every configuration.
    #[arg(long, default_value_t = 10)]
    rounds: usize,
    /// `--serve PORT`: run a server (the benchmark starts its servers so).
    #[arg(long)]
    serve: Option<u16>,
    /// Added by `cargo bench`.
    #[arg(long, hide = true)]
    bench: bool,
}

/// The model's parameter bytes (f32).
fn parameter_bytes<M: Module>(module: &M) -> usize {
    struct Count(usize);
    impl ModuleVisitor for Count {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            // Reading the values waits for whatever computes them.
            self.0 += param.val().into_data().as_bytes().len();
        }
    }
    let mut count = Count(0);
    module.visit(&mut count);
    count.0
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

/// The median time of a one-element read on `device` (a round trip), and of a 16 MiB tensor
/// moved from `local` to `device` and read back.
fn probe(local: &Device, device: &Device) -> (Duration, Duration) {
    let tiny: Vec<Duration> = (0..20)
        .map(|_| {
            let start = Instant::now();
            let _ = Tensor::<1>::zeros([1], device).into_data();
            start.elapsed()
        })
        .collect();
    let big = Tensor::<1>::random([4 << 20], Distribution::Default, local);
    let _ = big.clone().into_data();
    let there_and_back: Vec<Duration> = (0..5)
        .map(|_| {
            let start = Instant::now();
            let _ = big.clone().to_device(device).into_data();
            start.elapsed()
        })
        .collect();
    (median(tiny), median(there_and_back))
}

fn main() {
    let args = Args::parse();
    if let Some(port) = args.serve {
        servers::serve(port);
        return;
    }
    let local = Device::flex().autodiff();
    let [inputs, first, second, classes] = args.widths[..] else {
        panic!("--widths is four numbers: inputs, two hidden layers, classes");
    };
    let sizes = Sizes {
        mlp: [inputs, first, second, classes],
        image: 32,
        resnet_width: 8,
    };
    let model = Net::new("mlp", sizes, &local);
    let bytes = parameter_bytes(&model);
    println!(
        "MLP {:?}: {:.2} MB of parameters; batch {} rows ({:.2} MB in); {} rounds",
        args.widths,
        bytes as f64 / 1e6,
        args.rows,
        (args.rows * inputs * 4) as f64 / 1e6,
        args.rounds,
    );
    println!(
        "| rate | servers | bare (ms) | local x(servers+1) (ms) | remote (ms) | remote - local (ms) | sent / received per server per step (MB) | round trip (ms) | 16 MiB there and back (ms, GB/s) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for rate in &args.rates {
        for &count in &args.servers {
            let servers: Vec<Server> = (0..count).map(|_| Server::start()).collect();
            if rate != "none" {
                servers.iter().for_each(|s| s.limit_rate(rate));
            }
            let mut list = vec!["cpu".to_string()];
            list.extend(servers.iter().map(Server::entry));
            let remote: DeviceList = list.join(",").parse().expect("the servers answer");
            let remote = remote.autodiff().into_vec();
            let (round_trip, moved) = probe(&local, &remote[1]);
            let batch = Batch::random(args.rows, inputs, &local);
            let mut configs = [
                Trained::Bare(model.clone()),
                Trained::Wrapped(
                    DataParallel::new(model.clone(), vec![local.clone(); count + 1]).unwrap(),
                ),
                Trained::Wrapped(DataParallel::new(model.clone(), remote.clone()).unwrap()),
            ]
            .map(Some);
            let mut optims: Vec<ModuleOptimizer> =
                (0..3).map(|_| SgdConfig::new().init()).collect();
            let mut times: [Vec<Duration>; 3] = Default::default();
            let mut carried = (0u64, 0u64);
            // One warm-up round, then the timed ones; the remote configuration's link bytes
            // counted over its timed steps.
            for round in 0..=args.rounds {
                for (i, config) in configs.iter_mut().enumerate() {
                    let before: Vec<(u64, u64)> = servers.iter().map(Server::bytes).collect();
                    let start = Instant::now();
                    let stepped = config.take().unwrap().step(&batch, &mut optims[i]);
                    // Reading the parameters waits for the step, wherever it ran.
                    parameter_bytes(match &stepped {
                        Trained::Bare(net) => net,
                        Trained::Wrapped(dp) => dp.module(),
                    });
                    *config = Some(stepped);
                    let took = start.elapsed();
                    if round > 0 {
                        times[i].push(took);
                        if i == 2 {
                            for (server, (tx, rx)) in servers.iter().zip(before) {
                                let (tx2, rx2) = server.bytes();
                                carried.0 += tx2 - tx;
                                carried.1 += rx2 - rx;
                            }
                        }
                    }
                }
            }
            let [bare, local_split, remote_split] = times.map(median);
            let per = (args.rounds * count) as f64 * 1e6;
            println!(
                "| {rate} | {count} | {} | {} | {} | {} | {:.2} / {:.2} | {:.2} | {} ({:.2}) |",
                ms(bare),
                ms(local_split),
                ms(remote_split),
                ms(remote_split.saturating_sub(local_split)),
                carried.0 as f64 / per,
                carried.1 as f64 / per,
                round_trip.as_secs_f64() * 1e3,
                ms(moved),
                2.0 * (16u64 << 20) as f64 / moved.as_secs_f64() / 1e9,
            );
        }
    }
}
