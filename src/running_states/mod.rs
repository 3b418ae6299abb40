//! Running states (Burn's `RunningState`, such as batch-norm statistics) across replicas.
//!
//! A `RunningState` keeps its value behind an `Arc` that every clone of a module shares, and
//! one pending update per OS thread, averaged when a thread that holds one reads it again or
//! when the module is turned into its record. Replicas are clones, so by default they all read
//! the module's one set and leave one update each (one per worker thread); the forward ends
//! by averaging them.
//!
//! Replicas on a device the module is not on get a set of their own per device (when the
//! wrapper knows how to make one, see [`OwnStates`]): Burn's batch norm would otherwise move
//! the shared statistics to the replica's device inside the replica's forward, a transfer this
//! crate cannot fence. After the forward those sets come home in one transfer per dtype and
//! fold into the module's: `h + Σ n/N (s - h)`, the mean over all replicas' updates, what they
//! give when all share one set.

use std::collections::{HashMap, HashSet};

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::tensor::{DType, Tensor, backend::Backend};

use crate::backend::{self, ConcatBackend, comm};

mod mappers;

use mappers::{Adopt, Flat, Noted, SetStates, Shapes, Tensors, running_states};

/// Makes a copy of a module whose running states are its own: the same parameters and
/// values, but `RunningState`s that the module and its clones do not share. Burn 0.21 only
/// makes new running states through a module's constructor or `AutodiffModule`, so this is
/// `M::from_inner(module.valid())` (or its inner-backend twin).
pub(crate) type OwnStates<M> = fn(&M) -> M;

/// Where each replica's running states live for one forward, and how they come home.
pub(crate) struct RunningStates<B: Backend, M> {
    /// The module the replicas are copied from (a clone: clones share running states).
    module: M,
    /// Per replica: `None` for the module's own set, `Some(k)` for own set `k`.
    groups: Vec<Option<usize>>,
    /// Each own set (a copy of the module holding it) and the number of replicas using it.
    sets: Vec<(M, usize)>,
    /// The ids of the module's running states (empty unless some replica has its own set).
    ids: HashSet<ParamId>,
    /// The module's untracked tensors before replicas were made, when a replica elsewhere
    /// shares them.
    noted: Option<Noted<B>>,
    /// Whether a replica on another device shares the module's running states: its forward
    /// moves them with Burn's `to_device` on its worker thread, out of this crate's reach.
    pub(crate) shared_elsewhere: bool,
}

impl<B: ConcatBackend, M: Module<B>> RunningStates<B, M> {
    /// Plans the running states of replicas on `devices`: with `own_states`, replicas on a
    /// device that the module is not on get one set per device.
    pub(crate) fn plan(
        module: &M,
        devices: &[B::Device],
        own_states: Option<OwnStates<M>>,
    ) -> Self {
        let home = module.devices();
        // Running states are untracked float tensors; a module without any needs no own sets.
        let untracked = devices.len() > 1 && !Shapes::of(module).is_empty();
        let mut own_devices: Vec<&B::Device> = Vec::new();
        let groups: Vec<Option<usize>> = devices
            .iter()
            .map(|device| {
                let own = own_states.is_some() && untracked && !home.contains(device);
                own.then(|| match own_devices.iter().position(|d| *d == device) {
                    Some(k) => k,
                    None => {
                        own_devices.push(device);
                        own_devices.len() - 1
                    }
                })
            })
            .collect();
        let elsewhere = devices
            .iter()
            .zip(&groups)
            .any(|(device, group)| group.is_none() && !home.contains(device));
        let noted = (untracked && elsewhere).then(|| Noted::of(module));
        let mut ids = HashSet::new();
        let sets = match own_states {
            Some(fresh) if !own_devices.is_empty() => {
                let tensors = Tensors::of(module);
                (0..own_devices.len())
                    .map(|k| {
                        let copy = fresh(module);
                        if k == 0 {
                            ids = running_states(&copy);
                        }
                        let count = groups.iter().filter(|g| **g == Some(k)).count();
                        (copy.map(&mut Adopt { tensors: &tensors }), count)
                    })
                    .collect()
            }
            _ => Vec::new(),
        };
        Self {
            module: module.clone(),
            groups,
            sets,
            ids,
            noted,
            shared_elsewhere: false,
        }
    }

    /// Which set replica `replica` uses: `None` for the module's, `Some(k)` for own set `k`.
    pub(crate) fn group(&self, replica: usize) -> Option<usize> {
        self.groups[replica]
    }

    /// The module replica `replica` is copied from: the planned module, or the copy holding
    /// its set.
    pub(crate) fn source(&self, replica: usize) -> &M {
        match self.groups[replica] {
            Some(k) => &self.sets[k].0,
            None => &self.module,
        }
    }

    /// Puts back the module's running states that making a copy on another device moved
    /// there (they are shared by every clone); notes whether any was.
    pub(crate) fn restore(&mut self) {
        if let Some(noted) = self.noted.take() {
            self.shared_elsewhere = noted.restore(&self.module);
        }
    }

    /// After the replicas' forwards: averages the updates of the replicas that share each
    /// set (Burn's per-thread values), folds the own sets into the module's and brings the
    /// statistics back to `home`. `devices` are every device the forward used.
    pub(crate) fn finish(self, module: &M, home: &B::Device, devices: &[B::Device]) {
        let spans_devices = devices.iter().any(|device| device != home);
        if spans_devices {
            // Averaging may move statistics between devices (Burn's own `to_device`).
            for device in devices {
                B::fence_receive(device);
            }
        }
        sync(module);
        self.fold(module, home);
        if spans_devices {
            bring_home(module, home);
            for device in devices {
                B::fence_transfers(device);
            }
        }
    }

    /// Folds the own sets into `module`'s, whose replicas' updates are already averaged:
    /// `h + Σ n/N (s - h)` on whole buffers (one transfer per set and dtype), so that states
    /// no replica updated (inference) come back bit for bit.
    fn fold(self, module: &M, home: &B::Device) {
        if self.sets.is_empty() || self.ids.is_empty() {
            return;
        }
        let shared = self.groups.iter().filter(|g| g.is_none()).count();
        let total = (shared + self.sets.iter().map(|(_, n)| n).sum::<usize>()) as f64;
        let base = Flat::of(module, &self.ids);
        let sets: Vec<(HashMap<ParamId, Tensor<B, 1>>, usize)> = self
            .sets
            .into_iter()
            .map(|(copy, count)| {
                sync(&copy);
                (Flat::of(&copy, &self.ids).into_iter().collect(), count)
            })
            .collect();
        let mut dtypes: Vec<DType> = Vec::new();
        for (_, value) in &base {
            if !dtypes.contains(&value.dtype()) {
                dtypes.push(value.dtype());
            }
        }
        let mut folded = HashMap::with_capacity(base.len());
        for dtype in dtypes {
            let members: Vec<usize> = (0..base.len())
                .filter(|&i| base[i].1.dtype() == dtype)
                .collect();
            let counts: Vec<usize> = members.iter().map(|&i| base[i].1.dims()[0]).collect();
            let start = backend::coalesce(members.iter().map(|&i| base[i].1.clone()).collect());
            let mut sum = start.clone();
            for (set, count) in &sets {
                let Some(device) = set.values().next().map(Tensor::device) else {
                    continue;
                };
                // A state missing from a set counts as not updated there: the module's value.
                let pieces = members
                    .iter()
                    .map(|&i| match set.get(&base[i].0) {
                        Some(value) => value.clone(),
                        None => comm::move_to(base[i].1.clone(), &device),
                    })
                    .collect();
                // One transfer per set and dtype.
                let moved = comm::move_to(backend::coalesce(pieces), home);
                let step = moved.sub(start.clone()).mul_scalar(*count as f64 / total);
                sum = sum.add(step);
            }
            for (&i, value) in members.iter().zip(backend::uncoalesce(sum, &counts)) {
                folded.insert(base[i].0, value);
            }
        }
        let _ = module.clone().map(&mut SetStates { values: folded });
    }
}

/// Averages the replicas' pending running-state updates into the shared value: turning a
/// clone of the module into its record runs Burn's synchronisation.
pub(crate) fn sync<B: Backend, M: Module<B>>(module: &M) {
    let _ = module.clone().into_record();
}

/// Moves every float tensor of `module` that is not on `device` back there, in place: what
/// reaches the module's running states, which its clones share. After the replicas' forwards,
/// Burn averages batch-norm statistics on whichever replica's device comes first.
fn bring_home<B: ConcatBackend, M: Module<B>>(module: &M, device: &B::Device) {
    let mut away = Away {
        device,
        found: false,
    };
    module.visit(&mut away);
    if away.found {
        B::fence_receive(device);
        let _ = module.clone().map(&mut Home { device });
    }
}

struct Away<'a, B: Backend> {
    device: &'a B::Device,
    found: bool,
}

impl<B: Backend> ModuleVisitor<B> for Away<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.found |= param.val().device() != *self.device;
    }
}

struct Home<'a, B: Backend> {
    device: &'a B::Device,
}

impl<B: Backend> ModuleMapper<B> for Home<'_, B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        if param.val().device() == *self.device {
            return param;
        }
        param.map(|tensor| tensor.to_device(self.device))
    }
}
