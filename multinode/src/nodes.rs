//! The hand-off's peers as processes, one node each, all-reducing through burn-collective's
//! orchestrator over the loopback interface (on several machines, the same with their
//! addresses), beside `burn-dataparallel-handoff`'s peers as threads.
//!
//! With burn-collective 0.21.0 as published this form hangs after the first gradients (its
//! barrier, see
//! [`two_global_all_reduces`](burn_dataparallel_handoff::barrier::two_global_all_reduces));
//! this workspace builds against the fixed copy that `scripts/patch-collective.sh` makes.
//! [`run_processes`] bounds the wait and fails with the nodes' state.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use burn::collective::{self, CollectiveConfig, PeerId};
use burn::tensor::backend::AutodiffBackend;

use burn_dataparallel_handoff::{
    Batch, Classifier, Optim, PeerRun, Slice, batches, free_port, load, run_peer, save,
};

/// Where one node of a run over several processes finds the others: burn-collective's
/// orchestrator and this node's own data service.
#[derive(Clone, Copy, Debug)]
pub struct Node {
    /// This node's index, and its slice of every global batch.
    pub index: usize,
    /// How many nodes (processes) take part.
    pub count: usize,
    /// The address of the global orchestrator (`burn::collective::start_global_orchestrator`).
    pub orchestrator_host: Ipv4Addr,
    /// Its port.
    pub orchestrator_port: u16,
    /// The address the other nodes reach this node at.
    pub host: Ipv4Addr,
    /// The port this node serves its tensors on, to the other nodes.
    pub data_port: u16,
}

/// The addresses of a run over several processes: the orchestrator's (where the launching
/// process listens) and each node's, as the others reach them.
#[derive(Clone, Debug)]
pub struct Hosts {
    pub orchestrator: Ipv4Addr,
    pub nodes: Vec<Ipv4Addr>,
}

impl Hosts {
    /// Every address on the loopback interface: `count` nodes on this machine.
    pub fn loopback(count: usize) -> Self {
        Self {
            orchestrator: Ipv4Addr::LOCALHOST,
            nodes: vec![Ipv4Addr::LOCALHOST; count],
        }
    }
}

/// [`train_all_reduce`] as one process of several: this process is node `node.index` of
/// `node.count`, with one peer (`device`), and the all-reduce runs between the nodes through
/// burn-collective's orchestrator. Every node runs this function with the same checkpoint,
/// batches and optimizer.
///
/// # Panics
///
/// As [`train_all_reduce`]; also if the orchestrator cannot be reached.
pub fn train_node<B: AutodiffBackend>(
    node: Node,
    path: &Path,
    device: B::Device,
    batches: &[Batch],
    optim: Optim,
) -> PeerRun<B> {
    let address =
        |host: Ipv4Addr, port: u16| format!("ws://{host}:{port}").parse().expect("an address");
    let config = CollectiveConfig::default()
        .with_num_devices(1)
        .with_num_nodes(node.count as u32)
        .with_global_address(address(node.orchestrator_host, node.orchestrator_port))
        .with_node_address(address(node.host, node.data_port))
        .with_data_service_port(node.data_port);
    collective::reset_collective::<B::InnerBackend>();
    let slice = Slice {
        index: node.index,
        count: node.count,
    };
    run_peer::<B>(
        PeerId::from(0usize),
        slice,
        device,
        config,
        path,
        batches,
        optim,
    )
}

/// The environment variable that makes a process one node of [`run_processes`]: what the
/// node needs, written by [`NodeJob::to_env`].
pub const NODE_ENV: &str = "DDP_HANDOFF_NODE";

/// What one node process of [`run_processes`] runs: its place, the checkpoint, its batches
/// (`batches(to, size)[from..to]`), the optimizer, and where to save what it trained.
#[derive(Clone, Debug)]
pub struct NodeJob {
    pub node: Node,
    pub checkpoint: PathBuf,
    pub batches: (usize, usize, usize),
    pub optim: Optim,
    pub out: PathBuf,
}

impl NodeJob {
    fn to_env(&self) -> String {
        let (kind, lr) = match self.optim {
            Optim::Adam(lr) => ("adam", lr),
            Optim::Sgd(lr) => ("sgd", lr),
        };
        let n = &self.node;
        let (from, to, size) = self.batches;
        format!(
            "{},{},{},{},{from},{to},{size},{kind},{lr},{},{},{},{}",
            n.index,
            n.count,
            n.orchestrator_port,
            n.data_port,
            n.orchestrator_host,
            n.host,
            self.checkpoint.display(),
            self.out.display()
        )
    }

    fn from_env(value: &str) -> Self {
        let f: Vec<&str> = value.splitn(13, ',').collect();
        let number = |i: usize| f[i].parse::<usize>().expect("a number");
        let lr: f64 = f[8].parse().expect("a learning rate");
        Self {
            node: Node {
                index: number(0),
                count: number(1),
                orchestrator_port: number(2) as u16,
                data_port: number(3) as u16,
                orchestrator_host: f[9].parse().expect("an address"),
                host: f[10].parse().expect("an address"),
            },
            batches: (number(4), number(5), number(6)),
            optim: match f[7] {
                "adam" => Optim::Adam(lr),
                "sgd" => Optim::Sgd(lr),
                other => panic!("{NODE_ENV}: no optimizer {other:?}"),
            },
            checkpoint: f[11].into(),
            out: f[12].into(),
        }
    }
}

/// In a process started by [`run_processes`] (the [`NODE_ENV`] variable set): runs the node's
/// training on `device`, saves the trained model where the parent reads it, and returns
/// true; elsewhere, false.
pub fn run_node_from_env<B: AutodiffBackend>(device: B::Device) -> bool {
    let Ok(value) = std::env::var(NODE_ENV) else {
        return false;
    };
    let job = NodeJob::from_env(&value);
    let (from, to, size) = job.batches;
    let batches = batches(to, size);
    let run = train_node::<B>(
        job.node,
        &job.checkpoint,
        device,
        &batches[from..to],
        job.optim,
    );
    let losses: Vec<String> = run.losses.iter().map(|l| format!("{l:.4}")).collect();
    println!("node {}: losses {}", job.node.index, losses.join(" "));
    save(run.trained, &job.out).expect("save the node's model");
    true
}

/// Continues from the checkpoint at `checkpoint` on one node per address of `hosts`, each a
/// process of its own, all-reducing through burn-collective's orchestrator: starts the
/// orchestrator in this process (listening on every interface), then `command(i)` for node
/// `i` with [`NODE_ENV`] set (a program that calls [`run_node_from_env`]; `command` may wrap
/// it, in `ip netns exec` say), and waits up to `limit` for all of them. Returns each node's
/// trained model, in node order, on `device`.
///
/// # Panics
///
/// If a node fails or does not finish within `limit` (the nodes still running are killed).
pub fn run_processes<B: AutodiffBackend>(
    command: impl Fn(usize) -> Command,
    hosts: &Hosts,
    checkpoint: &Path,
    batches: (usize, usize, usize),
    optim: Optim,
    device: &B::Device,
    limit: Duration,
) -> Vec<Classifier<B>> {
    let orchestrator_port = free_port();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().expect("a runtime for the orchestrator");
        runtime.block_on(collective::start_global_orchestrator(orchestrator_port));
    });
    let dir = checkpoint.parent().expect("the checkpoint's folder");
    let count = hosts.nodes.len();
    let jobs: Vec<NodeJob> = (0..count)
        .map(|index| NodeJob {
            node: Node {
                index,
                count,
                orchestrator_host: hosts.orchestrator,
                orchestrator_port,
                host: hosts.nodes[index],
                data_port: free_port(),
            },
            checkpoint: checkpoint.to_path_buf(),
            batches,
            optim,
            out: dir.join(format!("node-{index}")),
        })
        .collect();
    let mut children: Vec<Child> = jobs
        .iter()
        .map(|job| {
            command(job.node.index)
                .env(NODE_ENV, job.to_env())
                .spawn()
                .expect("start a node")
        })
        .collect();
    let deadline = Instant::now() + limit;
    let mut failed = None;
    for (index, child) in children.iter_mut().enumerate() {
        let status = loop {
            match child.try_wait().expect("a node's status") {
                Some(status) => break Some(status),
                None if Instant::now() > deadline => break None,
                None => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        match status {
            Some(status) if status.success() => {}
            other => {
                failed = Some(format!("node {index}: {other:?} (None: still running)"));
                break;
            }
        }
    }
    if let Some(failed) = failed {
        for child in &mut children {
            let _ = child.kill();
        }
        panic!("a node process failed or hung: {failed}");
    }
    jobs.iter()
        .map(|job| load::<B>(&job.out, device).expect("a node's model"))
        .collect()
}
