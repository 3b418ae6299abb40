//! The backward of a step: how each step's replicas are tied to the caller's autodiff graph,
//! and the parallel backward that runs the replicas' backwards at the same time.
//!
//! - `ties.rs` decides, once per step, how the scatter, the replicate stage and the gather tie
//!   what they make to the caller's graph: the caller's own nodes (one replica), one graph
//!   joined before the replicas run (the single backward and the exact path), a graph per
//!   replica (the parallel backward), or fresh leaves (each replica's own training step).
//! - `graphs/` is the parallel backward: each replica's forward on leaves of its own, its
//!   outputs as stand-ins in the caller's graph, and a hub that runs every replica's
//!   backward on its worker and hands the summed gradients to the caller's (`comm` sums).
//! - `autodiff.rs` hooks it into Burn's `Autodiff` through
//!   [`ReplicaOps`](crate::ReplicaOps), the backend layer's interface.

mod autodiff;
mod graphs;
pub(crate) mod ties;
