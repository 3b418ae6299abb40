//! The overlapped reduce of the parallel backward: the replicas' gradients of whole targets
//! (parameters, broadcast values), cut into buckets of at most `bucket_size` bytes in the
//! reverse order of the targets (the order a backward reaches a module's parameters, last
//! layer first). A bucket is *ready* once every replica's leaves for its targets have stored
//! their gradients; the hub reduces it on the calling thread at once, while the replicas'
//! backward goes on ([`comm::sum_flat`], the same sums as the reduce at the end).
//!
//! A bucket that never becomes ready (a leaf on no path to the replica's outputs, a gradient
//! of another dtype) and every target no bucket holds (input rows, a target some replica did
//! not use) is left to the hub's reduce after the last replica's backward.

use std::collections::VecDeque;

use burn::tensor::{DType, TensorMetadata};

use super::State;
use crate::backend::comm;
use crate::backend::{ConcatBackend, Part};

/// What the plan needs to know of a target.
pub(super) struct TargetInfo<D> {
    pub(super) device: D,
    pub(super) dtype: DType,
    pub(super) bytes: usize,
    /// A whole tensor, whose replicas' gradients are summed.
    pub(super) whole: bool,
}

/// The buckets of one backward and which of them are ready.
pub(super) struct Overlap<D> {
    buckets: Vec<Bucket<D>>,
    /// Per target, its bucket.
    of_target: Vec<Option<usize>>,
    ready: VecDeque<usize>,
}

struct Bucket<D> {
    targets: Vec<usize>,
    device: D,
    /// Per replica, its used leaves of the bucket's targets that have not stored yet.
    pending: Vec<usize>,
    /// Replicas with a leaf pending.
    incomplete: usize,
}

/// A ready bucket: its targets (in bucket order) and the device their sums go to.
pub(super) struct Ready<D> {
    pub(super) index: usize,
    pub(super) targets: Vec<usize>,
    pub(super) device: D,
}

impl<D: Clone + PartialEq> Overlap<D> {
    /// The buckets of the backward that starts now, from `state`'s targets and the leaves
    /// the forwards used.
    pub(super) fn of_backward<B: ConcatBackend<Device = D>>(
        state: &State<B>,
        bucket_size: usize,
    ) -> Self {
        let targets: Vec<TargetInfo<D>> = (state.targets.iter())
            .map(|target| TargetInfo {
                device: B::float_device(&target.tensor.primitive),
                dtype: target.tensor.primitive.dtype(),
                bytes: comm::bytes_of(&target.tensor.primitive),
                whole: target.part == Part::Whole,
            })
            .collect();
        let leaves: Vec<Vec<(usize, bool)>> = (state.replicas.iter())
            .map(|replica| {
                let leaves = replica.leaves.iter();
                leaves.map(|leaf| (leaf.target, leaf.used)).collect()
            })
            .collect();
        Self::plan(&targets, &leaves, bucket_size)
    }

    /// The buckets for `targets`, given each replica's leaves as `(target, used)` (`used`:
    /// the replica's forward used the leaf). A target is bucketed when it is whole and every
    /// replica used a leaf of it; targets of one device and dtype are packed, from the last
    /// one back, into buckets of at most `bucket_size` bytes (a larger one alone).
    pub(super) fn plan(
        targets: &[TargetInfo<D>],
        leaves: &[Vec<(usize, bool)>],
        bucket_size: usize,
    ) -> Self {
        let mut used_by = vec![0usize; targets.len()];
        for replica in leaves {
            let mut seen = vec![false; targets.len()];
            for &(target, used) in replica {
                if used && !seen[target] {
                    seen[target] = true;
                    used_by[target] += 1;
                }
            }
        }
        let candidates: Vec<usize> = (0..targets.len())
            .rev()
            .filter(|&t| targets[t].whole && used_by[t] == leaves.len())
            .collect();
        let mut devices: Vec<&D> = Vec::new();
        for &t in &candidates {
            if !devices.contains(&&targets[t].device) {
                devices.push(&targets[t].device);
            }
        }
        let mut buckets = Vec::new();
        let mut of_target = vec![None; targets.len()];
        for device in devices {
            let members: Vec<usize> = (candidates.iter().copied())
                .filter(|&t| targets[t].device == *device)
                .collect();
            let layout: Vec<(DType, bool, usize)> = (members.iter())
                .map(|&t| (targets[t].dtype, true, targets[t].bytes))
                .collect();
            for group in comm::plan_buckets(&layout, bucket_size) {
                let bucket: Vec<usize> = group.into_iter().map(|i| members[i]).collect();
                for &t in &bucket {
                    of_target[t] = Some(buckets.len());
                }
                buckets.push(Bucket {
                    targets: bucket,
                    device: device.clone(),
                    pending: vec![0; leaves.len()],
                    incomplete: 0,
                });
            }
        }
        for (replica, leaves) in leaves.iter().enumerate() {
            for &(target, used) in leaves {
                if let (true, Some(b)) = (used, of_target[target]) {
                    buckets[b].pending[replica] += 1;
                }
            }
        }
        for bucket in &mut buckets {
            bucket.incomplete = bucket.pending.iter().filter(|&&n| n > 0).count();
        }
        Self {
            buckets,
            of_target,
            ready: VecDeque::new(),
        }
    }

    /// Whether `target` is in a bucket.
    #[cfg(test)]
    fn holds(&self, target: usize) -> bool {
        self.of_target[target].is_some()
    }

    /// A used leaf of `replica` for `target` has stored its gradient (once per leaf); true
    /// when that makes a bucket ready.
    pub(super) fn stored(&mut self, replica: usize, target: usize) -> bool {
        let Some(b) = self.of_target[target] else {
            return false;
        };
        let bucket = &mut self.buckets[b];
        let Some(pending) = bucket.pending.get_mut(replica).filter(|n| **n > 0) else {
            return false;
        };
        *pending -= 1;
        if *pending > 0 {
            return false;
        }
        bucket.incomplete -= 1;
        if bucket.incomplete > 0 {
            return false;
        }
        self.ready.push_back(b);
        true
    }

    /// The next ready bucket, taken out of the queue.
    pub(super) fn next_ready(&mut self) -> Option<Ready<D>> {
        let index = self.ready.pop_front()?;
        let bucket = &self.buckets[index];
        Some(Ready {
            index,
            targets: bucket.targets.clone(),
            device: bucket.device.clone(),
        })
    }

    /// The number of buckets.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.buckets.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(bytes: usize, whole: bool) -> TargetInfo<u8> {
        TargetInfo {
            device: 0,
            dtype: DType::F32,
            bytes,
            whole,
        }
    }

    #[test]
    fn buckets_run_from_the_last_target_back() {
        let targets = [
            info(40, true),
            info(40, true),
            info(30, true),
            info(10, false),
        ];
        let all = vec![(0, true), (1, true), (2, true), (3, true)];
        let plan = Overlap::plan(&targets, &[all.clone(), all], 80);
        let buckets: Vec<&Vec<usize>> = plan.buckets.iter().map(|b| &b.targets).collect();
        assert_eq!(buckets, vec![&vec![2, 1], &vec![0]]);
        assert!(!plan.holds(3), "rows are left to the final reduce");
    }

    #[test]
    fn a_bucket_is_ready_when_every_replica_has_stored_its_part() {
        let targets = [info(4, true), info(4, true)];
        // Replica 1 has two leaves for target 0 (one target passed twice).
        let leaves = vec![
            vec![(0, true), (1, true)],
            vec![(0, true), (0, true), (1, true)],
        ];
        let mut plan = Overlap::plan(&targets, &leaves, 1 << 20);
        assert_eq!(plan.len(), 1);
        assert!(!plan.stored(0, 1));
        assert!(!plan.stored(1, 0));
        assert!(!plan.stored(0, 0));
        assert!(!plan.stored(1, 1));
        assert!(plan.next_ready().is_none());
        assert!(plan.stored(1, 0));
        let ready = plan.next_ready().expect("ready");
        assert_eq!((ready.index, ready.targets), (0, vec![1, 0]));
        // A store past the count (a step run twice) readies nothing again.
        assert!(!plan.stored(1, 0));
        assert!(plan.next_ready().is_none());
    }

    #[test]
    fn targets_a_replica_did_not_use_are_not_bucketed() {
        let targets = [info(4, true), info(4, true)];
        let leaves = vec![vec![(0, true), (1, false)], vec![(0, true), (1, true)]];
        let plan = Overlap::plan(&targets, &leaves, 1 << 20);
        assert!(plan.holds(0));
        assert!(!plan.holds(1));
    }
}
