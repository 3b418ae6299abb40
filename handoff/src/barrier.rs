//! The one-process reproduction of burn-collective 0.21.0's multi-node barrier fault: run by
//! `upstream/collective_barrier.rs` against the published crate (where it fails) and by
//! `multinode/tests/processes.rs` against the patched one (where it passes).

use burn::collective::{self, CollectiveConfig, PeerId, ReduceOperation};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorPrimitive};

use crate::free_port;

/// Two global all-reduces one after the other on one node (`num_nodes(1)`), with
/// burn-collective's orchestrator started in this process on the loopback interface: what
/// every multi-node step does, reduced to its barrier. Each must return the tensor itself
/// (the mean over one node) within `limit`.
///
/// burn-collective 0.21.0 as published fails the second: `SyncService::sync`
/// (`src/global/node/sync.rs`), the barrier that ends every global all-reduce, compares and
/// clears a copy of the shared list of arrived nodes, so at the next sync the list holds the
/// node twice and never equals the node set. `patches/burn-collective-0.21.0.patch` fixes it.
///
/// # Errors
///
/// A message naming the all-reduce that did not return within `limit`.
pub fn two_global_all_reduces<B: Backend>(limit: std::time::Duration) -> Result<(), String> {
    let (orchestrator, data) = (free_port(), free_port());
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().expect("a runtime for the orchestrator");
        runtime.block_on(collective::start_global_orchestrator(orchestrator));
    });
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let address = |port: u16| {
            format!("ws://127.0.0.1:{port}")
                .parse()
                .expect("an address")
        };
        let config = CollectiveConfig::default()
            .with_num_devices(1)
            .with_num_nodes(1)
            .with_global_address(address(orchestrator))
            .with_node_address(address(data))
            .with_data_service_port(data);
        collective::reset_collective::<B>();
        let device: B::Device = Default::default();
        let id = PeerId::from(0usize);
        collective::register::<B>(id, device.clone(), config).expect("register");
        for _ in 0..2 {
            let tensor = Tensor::<B, 1>::from_floats([1.0, 2.0, 3.0], &device);
            let reduced = collective::all_reduce::<B>(
                id,
                tensor.into_primitive().tensor(),
                ReduceOperation::Mean,
            )
            .expect("a global all-reduce");
            let values = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(reduced))
                .into_data()
                .to_vec::<f32>()
                .expect("f32 values");
            let _ = sender.send(values);
        }
        let _ = collective::finish_collective::<B>(id);
    });
    for round in 0..2 {
        match receiver.recv_timeout(limit) {
            Ok(values) if values == [1.0, 2.0, 3.0] => {}
            Ok(values) => return Err(format!("all-reduce {round} gave {values:?}")),
            Err(_) => {
                return Err(format!(
                    "global all-reduce {round} of one node did not return within {} s: the \
                     barrier that ends it waits for a node set it can no longer match",
                    limit.as_secs()
                ));
            }
        }
    }
    Ok(())
}
