//! The hand-off to burn-collective with the peers as processes: this test binary again, once
//! per node, running `node_process`, all-reducing through the orchestrator over the loopback
//! interface. Against the fixed burn-collective of this workspace; every wait is bounded.

use std::time::Duration;

use burn::backend::{Autodiff, Flex};
use burn_dataparallel_handoff::barrier::two_global_all_reduces;
use burn_dataparallel_handoff::*;
use burn_dataparallel_multinode::nodes::{Hosts, NODE_ENV, run_node_from_env, run_processes};

type B = Autodiff<Flex>;

/// burn-collective keeps one collective per backend type in the process: one test at a time.
static COLLECTIVE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The barrier that ends every global all-reduce, on one node: with the fix, the second
/// all-reduce returns (published 0.21.0: it never does, `upstream/collective_barrier.rs`).
#[test]
fn two_global_all_reduces_in_one_process() {
    let _one = COLLECTIVE.lock().unwrap_or_else(|e| e.into_inner());
    two_global_all_reduces::<Flex>(Duration::from_secs(30)).unwrap();
}

/// `HALF` steps through the wrapper, the checkpoint, then `HALF` more on one process per
/// address of `hosts`, each on its own slice of every global batch, node `i` in network
/// namespace `namespaces[i]` when given; their parameters equal the wrapper's own
/// continuation from the same checkpoint.
fn hand_off_to_processes(hosts: &Hosts, namespaces: Option<&[String]>, optim: Optim) {
    let device = Default::default();
    let dir = tempfile::tempdir().expect("a temporary folder");
    let (all, saved) = first_half::<B>(&device, optim, dir.path());
    let (next, path) = (&all[HALF..], dir.path().join("classifier"));
    let exe = std::env::current_exe().expect("this test binary");
    let command = |node: usize| {
        let mut command = match namespaces {
            Some(names) => {
                let mut command = std::process::Command::new("ip");
                command.args(["netns", "exec", &names[node]]).arg(&exe);
                command
            }
            None => std::process::Command::new(&exe),
        };
        command.args(["--exact", "node_process", "--ignored", "--nocapture"]);
        command
    };
    let trained = run_processes::<B>(
        command,
        hosts,
        &path,
        (HALF, BATCHES, ROWS),
        optim,
        &device,
        Duration::from_secs(60),
    );
    assert_eq!(trained.len(), hosts.nodes.len());
    let reference = load::<B>(&path, &device).expect("load");
    assert_eq!(
        parameters(&reference),
        saved,
        "the checkpoint keeps every bit"
    );
    let (reference, _) = train_data_parallel(reference, vec![device; 3], next, optim);
    let reference = parameters(&reference);
    for (node, trained) in trained.iter().enumerate() {
        let difference = relative_difference(&parameters(trained), &reference);
        assert!(
            difference < 1e-4,
            "node {node} (at {}) against DataParallel: relative difference {difference:e}",
            hosts.nodes[node]
        );
    }
}

/// [`hand_off_to_processes`] on `nodes` processes of this machine, over the loopback interface.
fn hand_off_on_loopback(nodes: usize, optim: Optim) {
    let _one = COLLECTIVE.lock().unwrap_or_else(|e| e.into_inner());
    hand_off_to_processes(&Hosts::loopback(nodes), None, optim);
}

#[test]
fn two_processes_continue_the_wrappers_training_sgd() {
    hand_off_on_loopback(2, Optim::Sgd(0.1));
}

#[test]
fn four_processes_continue_the_wrappers_training_sgd() {
    hand_off_on_loopback(4, Optim::Sgd(0.1));
}

#[test]
fn two_processes_continue_the_wrappers_training_adam() {
    hand_off_on_loopback(2, Optim::Adam(1e-2));
}

#[test]
fn four_processes_continue_the_wrappers_training_adam() {
    hand_off_on_loopback(4, Optim::Adam(1e-2));
}

/// A node of [`hand_off_to_processes`]: runs only in a process that test starts (the node's
/// settings in the environment); elsewhere it has nothing to do.
#[test]
#[ignore = "a node process of the multi-process hand-off, started by those tests"]
fn node_process() {
    assert!(
        run_node_from_env::<B>(Default::default()),
        "started without {NODE_ENV}: run by `hand_off_to_processes` only"
    );
}

/// Network namespaces standing in for machines: one per node, each with its own address on a
/// bridge in this process's namespace, where the orchestrator listens. Removed on drop.
struct Namespaces {
    names: Vec<String>,
    bridge: String,
    hosts: Hosts,
}

impl Namespaces {
    /// `count` namespaces on a bridge of their own, or why they cannot be made here (no `ip`,
    /// or no right to create namespaces).
    fn new(count: usize) -> Result<Self, String> {
        let id = std::process::id();
        let subnet = format!("10.231.{}", id % 250);
        let mut made = Self {
            names: Vec::new(),
            bridge: format!("dpb{id}"),
            hosts: Hosts {
                orchestrator: format!("{subnet}.1").parse().expect("an address"),
                nodes: Vec::new(),
            },
        };
        let bridge = made.bridge.clone();
        ip(&["link", "add", &bridge, "type", "bridge"])?;
        ip(&["addr", "add", &format!("{subnet}.1/24"), "dev", &bridge])?;
        ip(&["link", "set", &bridge, "up"])?;
        for node in 0..count {
            let (name, outer, inner) = (
                format!("dpn{id}x{node}"),
                format!("dpv{id}x{node}"),
                format!("dpp{id}x{node}"),
            );
            ip(&["netns", "add", &name])?;
            made.names.push(name.clone());
            ip(&[
                "link", "add", &outer, "type", "veth", "peer", "name", &inner,
            ])?;
            ip(&["link", "set", &inner, "netns", &name])?;
            ip(&["link", "set", &outer, "master", &bridge, "up"])?;
            let address = format!("{subnet}.{}", node + 2);
            ip(&[
                "-n",
                &name,
                "addr",
                "add",
                &format!("{address}/24"),
                "dev",
                &inner,
            ])?;
            ip(&["-n", &name, "link", "set", &inner, "up"])?;
            ip(&["-n", &name, "link", "set", "lo", "up"])?;
            made.hosts.nodes.push(address.parse().expect("an address"));
        }
        Ok(made)
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for name in &self.names {
            let _ = ip(&["netns", "del", name]);
        }
        let _ = ip(&["link", "del", &self.bridge]);
    }
}

/// Runs `ip ARGS`.
fn ip(args: &[&str]) -> Result<(), String> {
    let output = std::process::Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("`ip` cannot run: {e}"))?;
    match output.status.success() {
        true => Ok(()),
        false => Err(format!(
            "`ip {}`: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        )),
    }
}

/// Four nodes, each in a network namespace of its own (its own interfaces and address, as a
/// machine has), reach the orchestrator and each other over a bridge, not the loopback
/// interface, and continue the wrapper's training as the loopback nodes do. Where namespaces
/// cannot be made (no `ip`, no CAP_NET_ADMIN) it says so and passes, unless
/// `DATAPARALLEL_REQUIRE_NETNS=1` asks for it.
#[test]
fn four_nodes_in_network_namespaces_continue_the_wrappers_training() {
    let _one = COLLECTIVE.lock().unwrap_or_else(|e| e.into_inner());
    let namespaces = match Namespaces::new(4) {
        Ok(namespaces) => namespaces,
        Err(why) if std::env::var("DATAPARALLEL_REQUIRE_NETNS").as_deref() != Ok("1") => {
            eprintln!("skipped: network namespaces cannot be made here ({why})");
            return;
        }
        Err(why) => panic!("network namespaces cannot be made here: {why}"),
    };
    hand_off_to_processes(&namespaces.hosts, Some(&namespaces.names), Optim::Sgd(0.1));
}
