//! Differentiable copies of a module, one per replica.

use std::collections::{HashMap, HashSet};

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::tensor::ops::{BoolTensor, FloatTensor, IntTensor};
use burn::tensor::{Bool, DType, Int, Tensor, TensorPrimitive, backend::Backend};

use crate::kernels::{self, ConcatBackend, ReplicaGraphs};
use crate::{ops, profile};

/// Default size of one coalesced parameter transfer: 25 MiB.
pub const DEFAULT_BUCKET_SIZE: usize = 25 * 1024 * 1024;

/// One copy of `module` per device, each with its parameters on that device.
///
/// A copy on the device that already holds a parameter shares that parameter's data (no
/// copy). Copies on another device receive the parameters in coalesced transfers of about
/// [`DEFAULT_BUCKET_SIZE`] bytes (see [`replicate_with_buckets`]); replicas that share a device
/// share one transfer. Under an autodiff backend every replica's gradient sums into the
/// original parameters, and the gradients of a transfer come back as one buffer.
///
/// Under an autodiff backend, every trainable parameter is first given a graph node on the
/// calling thread (a free reshape to its own shape), and all these nodes are joined into one
/// autodiff graph by one graph node that has all of them as parents (no kernel runs).
/// Replicas' forwards on other threads then only add nodes to that one graph
/// and never merge two graphs: Burn 0.21's graph locator can lose a node registered by one
/// thread while another thread merges that node's graph (missing or wrong gradients). A
/// single replica runs on the calling thread and needs no anchoring.
///
/// Running states (Burn's `RunningState`, e.g. batch-norm statistics) are shared by a module
/// and all its clones, so every replica reads the one value, which stays where the module
/// holds it; a replica on another device moves it in its own forward.
///
/// # Example
///
/// ```
/// use burn::backend::Flex;
/// use burn::nn::{Linear, LinearConfig};
/// use burn_dataparallel::replicate;
///
/// let device = Default::default();
/// let model: Linear<Flex> = LinearConfig::new(4, 2).init(&device);
/// let replicas = replicate(&model, &[device, device]);
/// assert_eq!(replicas.len(), 2);
/// ```
pub fn replicate<B: ConcatBackend, M: Module<B>>(module: &M, devices: &[B::Device]) -> Vec<M> {
    replicate_with_buckets(module, devices, DEFAULT_BUCKET_SIZE)
}

/// [`replicate`] with coalesced transfers of at most `bucket_size` bytes.
///
/// The float parameters bound for another device are grouped, in module order, by dtype and
/// by whether they require a gradient; each group is cut into buckets of at most
/// `bucket_size` bytes (a larger parameter gets a bucket of its own), and each bucket moves
/// as one flat buffer ([`kernels::coalesce`] then [`kernels::move_split`]). A `bucket_size` of
/// zero moves every parameter on its own. Int and bool parameters move one by one.
pub fn replicate_with_buckets<B: ConcatBackend, M: Module<B>>(
    module: &M,
    devices: &[B::Device],
    bucket_size: usize,
) -> Vec<M> {
    replicate_for_forward(module, devices, bucket_size, None, false, None).replicas
}

/// Makes a copy of a module whose running states are its own: the same parameters and
/// values, but `RunningState`s that the module and its clones do not share. Burn 0.21 only
/// makes new running states through a module's constructor or `AutodiffModule`, so this is
/// `M::from_inner(module.valid())` (or its inner-backend twin).
pub(crate) type OwnStates<M> = fn(&M) -> M;

/// The replicas of one forward, and where their running states live.
pub(crate) struct Replicas<B: Backend, M> {
    /// One copy of the module per device entry.
    pub(crate) replicas: Vec<M>,
    /// Copies whose running states are their own, with the number of replicas using each.
    own: Vec<(M, usize)>,
    /// How many replicas read and update the module's own running states.
    shared: usize,
    /// The ids of the module's running states (empty unless some copy has its own).
    states: HashSet<ParamId>,
    /// Whether a replica on another device shares the module's running states: its forward
    /// moves them with Burn's `to_device` on its worker thread, out of this crate's reach.
    pub(crate) shared_elsewhere: bool,
    _backend: core::marker::PhantomData<B>,
}

/// [`replicate_with_buckets`] for a forward: with `own_states`, replicas on a device that the
/// module is not on get running states of their own, one set per device (one per replica
/// after the first with `per_replica`, for tests on one device), which [`Replicas::fold`]
/// folds back into the module's after the forward.
///
/// With `graphs`, each replica's trainable parameters are its own leaves, taps of
/// [`ReplicaGraphs::input`] whose gradients go to the module's parameters: the transfers carry
/// plain values, and no graph is shared between replicas.
pub(crate) fn replicate_for_forward<B: ConcatBackend, M: Module<B>>(
    module: &M,
    devices: &[B::Device],
    bucket_size: usize,
    own_states: Option<OwnStates<M>>,
    per_replica: bool,
    graphs: Option<&dyn ReplicaGraphs<B>>,
) -> Replicas<B, M> {
    let module = match (devices.len(), graphs) {
        (1, _) | (_, Some(_)) => module.clone(),
        _ => {
            let mut anchor = Anchor { nodes: Vec::new() };
            let module = module.clone().map(&mut anchor);
            anchor.join();
            module
        }
    };
    let home = module.devices();
    // Running states are untracked float tensors; a module without any needs no own sets.
    let untracked = !Shapes::of(&module).is_empty();
    // Which set of running states each replica uses: `None` for the module's, `Some(k)` for
    // the own set `k`, which lives on `own_devices[k]`.
    let mut own_devices: Vec<&B::Device> = Vec::new();
    let groups: Vec<Option<usize>> = devices
        .iter()
        .enumerate()
        .map(|(i, device)| {
            let own = match own_states {
                Some(_) if devices.len() > 1 && untracked => {
                    (per_replica && i > 0) || !home.contains(device)
                }
                _ => false,
            };
            own.then(|| match own_devices.iter().position(|d| *d == device) {
                Some(k) if !per_replica => k,
                _ => {
                    own_devices.push(device);
                    own_devices.len() - 1
                }
            })
        })
        .collect();
    // Only a copy mapped onto a device the module is not on can move shared states.
    let elsewhere = devices
        .iter()
        .zip(&groups)
        .any(|(device, group)| group.is_none() && !home.contains(device));
    let noted = (devices.len() > 1 && elsewhere && untracked).then(|| States::note(&module));
    let mut states = HashSet::new();
    let sources: Vec<M> = match own_states {
        Some(fresh) if !own_devices.is_empty() => {
            let tensors = Tensors::of(&module);
            own_devices
                .iter()
                .enumerate()
                .map(|(k, _)| {
                    let copy = fresh(&module);
                    if k == 0 {
                        states = running_states(&copy);
                    }
                    copy.map(&mut Adopt { tensors: &tensors })
                })
                .collect()
        }
        _ => Vec::new(),
    };
    // With per-replica graphs the copies carry plain values; each replica then taps them.
    let (module_plain, sources, targets) = match graphs {
        Some(_) => (
            module.clone().map(&mut Detach),
            sources
                .into_iter()
                .map(|source| source.map(&mut Detach))
                .collect(),
            Tensors::of(&module).tracked_floats(),
        ),
        None => (module.clone(), sources, HashMap::new()),
    };
    let mut copies: Vec<(&B::Device, Option<usize>, M)> = Vec::new();
    let mut own: Vec<Option<(M, usize)>> = (0..sources.len()).map(|_| None).collect();
    let replicas = devices
        .iter()
        .zip(&groups)
        .enumerate()
        .map(|(replica, (device, &group))| {
            let copy = match copies.iter().find(|(d, g, _)| *d == device && *g == group) {
                Some((_, _, copy)) => copy.clone(),
                None => {
                    let source = group.map_or(&module_plain, |k| &sources[k]);
                    let copy = move_coalesced(source, device, bucket_size);
                    copies.push((device, group, copy.clone()));
                    copy
                }
            };
            if let Some(k) = group {
                // The source shares the copy's running states and holds only the module's own
                // tensors: dropping it on this thread releases nothing a worker still needs
                // (Fusion loses a tensor whose last reference is dropped on another thread
                // while a worker's queued kernel still reads it).
                own[k].get_or_insert_with(|| (sources[k].clone(), 0)).1 += 1;
            }
            match graphs {
                Some(graphs) => copy.map(&mut Taps {
                    graphs,
                    replica,
                    targets: &targets,
                }),
                None => copy,
            }
        })
        .collect();
    // A state put back is one a replica elsewhere shares and would move in its forward.
    let shared_elsewhere = noted.is_some_and(|noted| noted.restore(&module));
    Replicas {
        replicas,
        own: own.into_iter().flatten().collect(),
        shared: groups.iter().filter(|group| group.is_none()).count(),
        states,
        shared_elsewhere,
        _backend: core::marker::PhantomData,
    }
}

impl<B: ConcatBackend, M: Module<B>> Replicas<B, M> {
    /// Folds the running states that replicas updated in their own sets into `module`'s,
    /// whose replicas' updates are already synchronised (Burn's averaging): the result is
    /// the mean over all replicas, as if all had shared one set.
    ///
    /// Computed as `h + Σ n/N (s - h)`, so that states no replica updated (inference) come
    /// back bit for bit, on whole buffers: each own set comes home in one coalesced transfer
    /// per dtype, and the arithmetic runs once per set and dtype, not once per state.
    pub(crate) fn fold(self, module: &M, home: &B::Device) {
        if self.own.is_empty() || self.states.is_empty() {
            return;
        }
        let total = (self.shared + self.own.iter().map(|(_, n)| n).sum::<usize>()) as f64;
        let base = Flat::of(module, &self.states);
        let own: Vec<(HashMap<ParamId, Tensor<B, 1>>, usize)> = self
            .own
            .into_iter()
            .map(|(copy, count)| {
                // Averages the updates of the replicas that share this set.
                let _ = copy.clone().into_record();
                (Flat::of(&copy, &self.states).into_iter().collect(), count)
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
            let length: usize = counts.iter().sum();
            let start = kernels::coalesce(members.iter().map(|&i| base[i].1.clone()).collect());
            // A state missing from a set counts as not updated there: the module's value,
            // sent to the set's device.
            let buffer = |set: &HashMap<ParamId, Tensor<B, 1>>, device: &B::Device| {
                let pieces = members.iter().map(|&i| match set.get(&base[i].0) {
                    Some(value) => value.clone(),
                    None => kernels::move_split(base[i].1.clone(), &[base[i].1.dims()[0]], device)
                        .pop()
                        .expect("one piece"),
                });
                kernels::coalesce(pieces.collect())
            };
            let mut sum = start.clone();
            for (flat, count) in &own {
                let Some(device) = flat.values().next().map(Tensor::device) else {
                    continue;
                };
                if device != *home {
                    profile::count_move((length * dtype.size()) as u64);
                }
                let moved = kernels::move_split(buffer(flat, &device), &[length], home)
                    .pop()
                    .expect("one piece");
                let step = moved.sub(start.clone()).mul_scalar(*count as f64 / total);
                sum = sum.add(step);
            }
            for (&i, value) in members.iter().zip(kernels::uncoalesce(sum, &counts)) {
                folded.insert(base[i].0, value);
            }
        }
        let _ = module.clone().map(&mut SetStates { values: folded });
    }
}

/// The ids of `module`'s running states: the untracked float tensors that a mapped clone of
/// the module changes in the module itself (Burn's `RunningState` shares its value with
/// every clone; a parameter does not). Overwrites those states with placeholders.
fn running_states<B: Backend, M: Module<B>>(module: &M) -> HashSet<ParamId> {
    let before = Shapes::of(module);
    let _ = module.clone().map(&mut Placeholders);
    let after = Shapes::of(module);
    before
        .into_iter()
        .filter(|(id, shape)| after.get(id) != Some(shape))
        .map(|(id, _)| id)
        .collect()
}

/// The shapes of a module's untracked, non-empty float tensors.
struct Shapes {
    shapes: HashMap<ParamId, Vec<usize>>,
}

impl Shapes {
    fn of<B: Backend, M: Module<B>>(module: &M) -> HashMap<ParamId, Vec<usize>> {
        let mut shapes = Self {
            shapes: HashMap::new(),
        };
        module.visit(&mut shapes);
        shapes.shapes
    }
}

impl<B: Backend> ModuleVisitor<B> for Shapes {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let tensor = param.val();
        if !tensor.is_require_grad() && tensor.shape().num_elements() > 0 {
            self.shapes.insert(param.id, tensor.dims().to_vec());
        }
    }
}

/// Replaces untracked, non-empty float tensors by uninitialised ones one item longer.
struct Placeholders;

impl<B: Backend> ModuleMapper<B> for Placeholders {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let tensor = param.val();
        if tensor.is_require_grad() || tensor.shape().num_elements() == 0 {
            return param;
        }
        param.map(|tensor| {
            let mut dims = tensor.dims();
            dims[0] += 1;
            Tensor::empty(dims, &tensor.device())
        })
    }
}

/// Detaches every tracked float tensor: the values without their graph.
struct Detach;

impl<B: Backend> ModuleMapper<B> for Detach {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        if !param.val().is_require_grad() {
            return param;
        }
        param.map(|tensor| tensor.detach())
    }
}

/// Gives a replica's copy of every trainable parameter a tap of the replica's graph.
struct Taps<'a, B: Backend> {
    graphs: &'a dyn ReplicaGraphs<B>,
    replica: usize,
    /// The module's trainable parameters, by id.
    targets: &'a HashMap<ParamId, FloatTensor<B>>,
}

impl<B: Backend> ModuleMapper<B> for Taps<'_, B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let Some(target) = self.targets.get(&param.id) else {
            return param;
        };
        param.map(|value| match value.into_primitive() {
            TensorPrimitive::Float(value) => Tensor::from_primitive(TensorPrimitive::Float(
                self.graphs.input(self.replica, value, target),
            )),
            quantized => Tensor::from_primitive(quantized),
        })
    }
}

/// Every tensor of a module, by id.
struct Tensors<B: Backend> {
    floats: HashMap<ParamId, TensorPrimitive<B>>,
    ints: HashMap<ParamId, IntTensor<B>>,
    bools: HashMap<ParamId, BoolTensor<B>>,
}

impl<B: Backend> Tensors<B> {
    fn of<M: Module<B>>(module: &M) -> Self {
        let mut tensors = Self {
            floats: HashMap::new(),
            ints: HashMap::new(),
            bools: HashMap::new(),
        };
        module.visit(&mut tensors);
        tensors
    }
}

impl<B: Backend> Tensors<B> {
    /// The tracked float tensors.
    fn tracked_floats(self) -> HashMap<ParamId, FloatTensor<B>> {
        self.floats
            .into_iter()
            .filter_map(|(id, tensor)| match tensor {
                TensorPrimitive::Float(tensor) if B::float_is_require_grad(&tensor) => {
                    Some((id, tensor))
                }
                _ => None,
            })
            .collect()
    }
}

impl<B: Backend> ModuleVisitor<B> for Tensors<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.floats.insert(param.id, param.val().into_primitive());
    }

    fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<B, D, Int>>) {
        self.ints.insert(param.id, param.val().into_primitive());
    }

    fn visit_bool<const D: usize>(&mut self, param: &Param<Tensor<B, D, Bool>>) {
        self.bools.insert(param.id, param.val().into_primitive());
    }
}

/// Gives a copy the module's tensors (parameters with their graph nodes, running states'
/// values), matched by id; the copy keeps its own running-state containers.
struct Adopt<'a, B: Backend> {
    tensors: &'a Tensors<B>,
}

impl<B: Backend> ModuleMapper<B> for Adopt<'_, B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        match self.tensors.floats.get(&param.id) {
            Some(tensor) => param.map(|_| Tensor::from_primitive(tensor.clone())),
            None => param,
        }
    }

    fn map_int<const D: usize>(
        &mut self,
        param: Param<Tensor<B, D, Int>>,
    ) -> Param<Tensor<B, D, Int>> {
        match self.tensors.ints.get(&param.id) {
            Some(tensor) => param.map(|_| Tensor::from_primitive(tensor.clone())),
            None => param,
        }
    }

    fn map_bool<const D: usize>(
        &mut self,
        param: Param<Tensor<B, D, Bool>>,
    ) -> Param<Tensor<B, D, Bool>> {
        match self.tensors.bools.get(&param.id) {
            Some(tensor) => param.map(|_| Tensor::from_primitive(tensor.clone())),
            None => param,
        }
    }
}

/// A module's running states, flattened, in module order.
struct Flat<'a, B: Backend> {
    states: &'a HashSet<ParamId>,
    found: Vec<(ParamId, Tensor<B, 1>)>,
}

impl<B: Backend> Flat<'_, B> {
    fn of<M: Module<B>>(module: &M, states: &HashSet<ParamId>) -> Vec<(ParamId, Tensor<B, 1>)> {
        let mut flat = Flat {
            states,
            found: Vec::new(),
        };
        module.visit(&mut flat);
        flat.found
    }
}

impl<B: Backend> ModuleVisitor<B> for Flat<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if self.states.contains(&param.id) {
            let tensor = param.val();
            let elements = tensor.shape().num_elements();
            self.found.push((param.id, tensor.reshape([elements])));
        }
    }
}

/// Writes new values into a module's running states (shared by all its clones).
struct SetStates<B: Backend> {
    values: HashMap<ParamId, Tensor<B, 1>>,
}

impl<B: Backend> ModuleMapper<B> for SetStates<B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        match self.values.remove(&param.id) {
            Some(value) => param.map(|tensor| value.reshape(tensor.dims())),
            None => param,
        }
    }
}

/// The untracked float tensors of a module (running states, frozen parameters) where they
/// were before replicas were made.
///
/// Burn's `RunningState` (batch-norm statistics) keeps its value behind an `Arc` that every
/// clone of a module shares, so mapping a copy onto another device moves the value of the
/// original and of every other replica too. [`States::restore`] puts such values back, so
/// that they stay on the module's device: replicas on that device then read them with no
/// transfer, and the wrapped module is not left with statistics scattered over the GPUs.
struct States<B: Backend> {
    tensors: HashMap<ParamId, TensorPrimitive<B>>,
}

impl<B: Backend> States<B> {
    fn note<M: Module<B>>(module: &M) -> Self {
        let mut states = Self {
            tensors: HashMap::new(),
        };
        module.visit(&mut states);
        states
    }

    /// Puts back every noted value that a replica moved to another device; the noted tensors
    /// are the moved values' sources, so nothing is copied.
    /// Returns whether any value was put back.
    fn restore<M: Module<B>>(self, module: &M) -> bool {
        let mut restore = Restore {
            tensors: self.tensors,
            restored: false,
        };
        let _ = module.clone().map(&mut restore);
        restore.restored
    }
}

impl<B: Backend> ModuleVisitor<B> for States<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let tensor = param.val();
        if !tensor.is_require_grad() {
            self.tensors.insert(param.id, tensor.into_primitive());
        }
    }
}

struct Restore<B: Backend> {
    tensors: HashMap<ParamId, TensorPrimitive<B>>,
    restored: bool,
}

impl<B: Backend> ModuleMapper<B> for Restore<B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let Some(noted) = self.tensors.remove(&param.id) else {
            return param;
        };
        let noted = Tensor::<B, D>::from_primitive(noted);
        param.map(|tensor| {
            if tensor.device() == noted.device() {
                tensor
            } else {
                self.restored = true;
                noted
            }
        })
    }
}

/// Moves every float tensor of `module` that is not on `device` back there, in place: what
/// reaches the module's running states, which its clones share. The sources are not fenced;
/// the caller fences the devices involved.
///
/// After the replicas' forwards, Burn averages batch-norm statistics on whichever replica's
/// device comes first; this brings them back to the module's device.
pub(crate) fn bring_states_home<B: ConcatBackend, M: Module<B>>(module: &M, device: &B::Device) {
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

/// A float parameter bound for another device, flattened.
struct Outgoing<B: Backend> {
    id: ParamId,
    flat: Tensor<B, 1>,
    dtype: DType,
    tracked: bool,
}

/// The buckets for parameters of `(dtype, tracked, bytes)`: groups of positions, in order.
///
/// Parameters with the same dtype and tracking are packed in order into buckets of at most
/// `bucket_size` bytes; a parameter larger than that gets a bucket of its own.
pub(crate) fn plan_buckets(params: &[(DType, bool, usize)], bucket_size: usize) -> Vec<Vec<usize>> {
    let mut groups: Vec<((DType, bool), Vec<usize>)> = Vec::new();
    for (i, (dtype, tracked, _)) in params.iter().enumerate() {
        let key = (*dtype, *tracked);
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, members)) => members.push(i),
            None => groups.push((key, vec![i])),
        }
    }
    let mut buckets = Vec::new();
    for (_, members) in groups {
        let mut bucket: Vec<usize> = Vec::new();
        let mut bytes = 0;
        for i in members {
            let size = params[i].2;
            if !bucket.is_empty() && bytes + size > bucket_size {
                buckets.push(std::mem::take(&mut bucket));
                bytes = 0;
            }
            bucket.push(i);
            bytes += size;
        }
        if !bucket.is_empty() {
            buckets.push(bucket);
        }
    }
    buckets
}

/// A copy of `module` on `device`, float parameters moved in coalesced buckets.
fn move_coalesced<B: ConcatBackend, M: Module<B>>(
    module: &M,
    device: &B::Device,
    bucket_size: usize,
) -> M {
    move_coalesced_inner(module, device, bucket_size, true)
}

/// [`move_coalesced`]; `skip_local: false` sends even parameters already on `device` through
/// the buckets, so that one-device tests run the whole transfer path.
fn move_coalesced_inner<B: ConcatBackend, M: Module<B>>(
    module: &M,
    device: &B::Device,
    bucket_size: usize,
    skip_local: bool,
) -> M {
    let mut collect = Collect {
        device,
        skip_local,
        outgoing: Vec::new(),
        others_elsewhere: false,
    };
    module.visit(&mut collect);
    if collect.outgoing.is_empty() && !collect.others_elsewhere {
        // Everything is on `device` already: the copy shares it all, no mapping needed.
        return module.clone();
    }
    let outgoing = collect.outgoing;
    let layout: Vec<(DType, bool, usize)> = outgoing
        .iter()
        .map(|p| (p.dtype, p.tracked, p.flat.dims()[0] * p.dtype.size()))
        .collect();
    let mut arrived: HashMap<ParamId, Tensor<B, 1>> = HashMap::with_capacity(outgoing.len());
    for bucket in plan_buckets(&layout, bucket_size) {
        let counts: Vec<usize> = bucket.iter().map(|&i| outgoing[i].flat.dims()[0]).collect();
        let flats = bucket.iter().map(|&i| outgoing[i].flat.clone()).collect();
        let buffer = kernels::coalesce(flats);
        let bytes: usize = bucket.iter().map(|&i| layout[i].2).sum();
        profile::count_move(bytes as u64);
        profile::count_broadcast_transfer();
        let pieces = kernels::move_split(buffer, &counts, device);
        for (&i, piece) in bucket.iter().zip(pieces) {
            arrived.insert(outgoing[i].id, piece);
        }
    }
    module.clone().map(&mut MoveTo { device, arrived })
}

/// Flattens every non-empty float parameter that is not on `device` yet.
struct Collect<'a, B: Backend> {
    device: &'a B::Device,
    skip_local: bool,
    outgoing: Vec<Outgoing<B>>,
    /// Whether a parameter that does not travel in a bucket is on another device.
    others_elsewhere: bool,
}

impl<B: Backend> ModuleVisitor<B> for Collect<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let tensor = param.val();
        let elements = tensor.shape().num_elements();
        let local = tensor.device() == *self.device;
        if elements == 0 || (self.skip_local && local) {
            self.others_elsewhere |= !local;
            return;
        }
        let TensorPrimitive::Float(_) = tensor.clone().into_primitive() else {
            // Quantized parameters move on their own.
            self.others_elsewhere |= !local;
            return;
        };
        self.outgoing.push(Outgoing {
            id: param.id,
            dtype: tensor.dtype(),
            tracked: tensor.is_require_grad(),
            flat: tensor.reshape([elements]),
        });
    }

    fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<B, D, Int>>) {
        self.others_elsewhere |= param.val().device() != *self.device;
    }

    fn visit_bool<const D: usize>(&mut self, param: &Param<Tensor<B, D, Bool>>) {
        self.others_elsewhere |= param.val().device() != *self.device;
    }
}

/// Initialises every lazy parameter of `module` in place.
///
/// A lazy parameter that is cloned before initialisation initialises separately in each clone
/// (different weights, no gradient to the original), so replicas must only be made from an
/// initialised module.
pub(crate) fn initialize<B: Backend, M: Module<B>>(module: &M) {
    module.visit(&mut Initialize);
}

struct Initialize;

impl<B: Backend> ModuleVisitor<B> for Initialize {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let _ = param.val();
    }

    fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<B, D, Int>>) {
        let _ = param.val();
    }

    fn visit_bool<const D: usize>(&mut self, param: &Param<Tensor<B, D, Bool>>) {
        let _ = param.val();
    }
}

/// Gives trainable parameters a graph node each and keeps those nodes.
struct Anchor<B: Backend> {
    nodes: Vec<FloatTensor<B>>,
}

impl<B: ConcatBackend> Anchor<B> {
    /// Joins the graphs of all anchored parameters with one graph node that has every
    /// parameter's node as a parent ([`ConcatBackend::float_join_graphs`]); no kernel runs.
    fn join(self) {
        if self.nodes.len() >= 2 {
            B::float_join_graphs(self.nodes);
        }
    }
}

impl<B: Backend> ModuleMapper<B> for Anchor<B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let tensor = param.val();
        if !tensor.is_require_grad() || tensor.shape().num_elements() == 0 {
            return param;
        }
        param.map(|tensor| {
            let dims = tensor.dims();
            let node = tensor.reshape(dims);
            // Quantized parameters are not trained; only float nodes need joining.
            if let TensorPrimitive::Float(primitive) = node.clone().into_primitive() {
                self.nodes.push(primitive);
            }
            node
        })
    }
}

/// Puts the moved float parameters in place and moves the rest one by one.
struct MoveTo<'a, B: ConcatBackend> {
    device: &'a B::Device,
    arrived: HashMap<ParamId, Tensor<B, 1>>,
}

impl<B: ConcatBackend> ModuleMapper<B> for MoveTo<'_, B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        match self.arrived.remove(&param.id) {
            Some(flat) => param.map(|tensor| flat.reshape(tensor.dims())),
            None => param.map(|tensor| ops::move_to(tensor, self.device)),
        }
    }

    fn map_int<const D: usize>(
        &mut self,
        param: Param<Tensor<B, D, Int>>,
    ) -> Param<Tensor<B, D, Int>> {
        param.map(|tensor| ops::move_to(tensor, self.device))
    }

    fn map_bool<const D: usize>(
        &mut self,
        param: Param<Tensor<B, D, Bool>>,
    ) -> Param<Tensor<B, D, Bool>> {
        param.map(|tensor| ops::move_to(tensor, self.device))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, Flex};

    const F32: DType = DType::F32;

    #[test]
    fn buckets_pack_in_order_up_to_the_size() {
        let params = [
            (F32, true, 40),
            (F32, true, 40),
            (F32, true, 30),
            (F32, true, 10),
        ];
        assert_eq!(plan_buckets(&params, 80), vec![vec![0, 1], vec![2, 3]]);
        assert_eq!(plan_buckets(&params, 1000), vec![vec![0, 1, 2, 3]]);
    }

    #[test]
    fn a_parameter_larger_than_the_size_gets_its_own_bucket() {
        let params = [(F32, true, 10), (F32, true, 500), (F32, true, 10)];
        assert_eq!(plan_buckets(&params, 100), vec![vec![0], vec![1], vec![2]]);
    }

    #[test]
    fn size_zero_moves_every_parameter_alone() {
        let params = [(F32, true, 4); 3];
        assert_eq!(plan_buckets(&params, 0), vec![vec![0], vec![1], vec![2]]);
    }

    #[test]
    fn buckets_never_mix_dtypes_or_tracking() {
        let params = [
            (F32, true, 4),
            (DType::BF16, true, 2),
            (F32, false, 4),
            (F32, true, 4),
            (DType::BF16, true, 2),
        ];
        assert_eq!(
            plan_buckets(&params, 1 << 20),
            vec![vec![0, 3], vec![1, 4], vec![2]]
        );
    }

    #[test]
    fn every_parameter_is_in_exactly_one_bucket() {
        let params: Vec<(DType, bool, usize)> = (0..50)
            .map(|i| {
                (
                    if i % 7 == 0 { DType::F16 } else { F32 },
                    i % 5 != 0,
                    4 * (1 + i * 13 % 17),
                )
            })
            .collect();
        for size in [0, 1, 16, 100, 1000] {
            let mut seen: Vec<usize> = plan_buckets(&params, size).concat();
            seen.sort();
            assert_eq!(seen, (0..50).collect::<Vec<_>>(), "bucket size {size}");
        }
    }

    type B = Autodiff<Flex>;

    #[derive(Module, Debug)]
    struct Mlp<B: Backend> {
        first: burn::nn::Linear<B>,
        second: burn::nn::Linear<B>,
    }

    impl<B: Backend> Mlp<B> {
        fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
            self.second.forward(self.first.forward(x).tanh())
        }
    }

    /// A whole module through the buckets (forced on one device): the copy computes the same
    /// output bit for bit, the original parameters get the same gradients, and the profile
    /// counts one transfer per bucket each way.
    #[test]
    fn a_module_moved_in_buckets_trains_like_the_original() {
        use crate::profile::{Profiler, Stage, stage};
        use burn::nn::LinearConfig;

        let device = Default::default();
        let mut model = Mlp::<B> {
            first: LinearConfig::new(6, 16).init(&device),
            second: LinearConfig::new(16, 3).init(&device),
        };
        // A frozen parameter travels in a bucket of its own and gains no gradient.
        model.second.weight = model.second.weight.set_require_grad(false);
        let x = Tensor::<B, 2>::from_floats([[0.5, -1.0, 2.0, 0.0, 1.5, -0.25]; 3], &device);

        let profiler = Profiler::default();
        profiler.set_enabled(true);
        let sink = profiler.start(1);
        // 256-byte buckets: [first.weight 384 B], [first.bias 64 B, second.bias 12 B] tracked,
        // [second.weight 192 B] frozen.
        let copy = stage::<B, _>(sink.as_ref(), Stage::Replicate, &[device], || {
            move_coalesced_inner(&model, &device, 256, false)
        });
        let output = copy.forward(x.clone());
        let expected = model.forward(x);
        assert_eq!(output.to_data(), expected.to_data());

        let grads = (output.clone() * output).sum().backward();
        let reference = (expected.clone() * expected).sum().backward();
        let weight = model.first.weight.val();
        assert_eq!(
            weight.grad(&grads).unwrap().to_data(),
            weight.grad(&reference).unwrap().to_data()
        );
        let biases = [
            model.first.bias.as_ref().unwrap().val(),
            model.second.bias.as_ref().unwrap().val(),
        ];
        for (i, param) in biases.iter().enumerate() {
            let got = param.grad(&grads).expect("gradient");
            let want = param.grad(&reference).expect("gradient");
            assert_eq!(got.to_data(), want.to_data(), "bias {i}");
        }
        assert!(model.second.weight.val().grad(&grads).is_none());
        assert!(!copy.second.weight.val().is_require_grad());

        let profile = profiler.last().unwrap();
        assert_eq!(profile.bytes_broadcast, 4 * (96 + 16 + 48 + 3));
        assert_eq!(profile.broadcast_transfers, 3);
        assert_eq!(profile.bytes_reduced, 4 * (96 + 16 + 3));
        assert_eq!(profile.reduce_transfers, 2);
    }

    /// Coalesce then move-split round-trips values bit for bit, and the gradients that come back
    /// through one buffer equal those of the same loss on the original tensors (zero for an
    /// unused piece).
    #[test]
    fn coalesced_transfer_round_trips_values_and_gradients() {
        let device = Default::default();
        let shapes: [&[usize]; 4] = [&[3, 5], &[7], &[2, 3, 4], &[1]];
        let params: Vec<Tensor<B, 1>> = shapes
            .iter()
            .enumerate()
            .map(|(i, shape)| {
                let n: usize = shape.iter().product();
                let values: Vec<f32> = (0..n).map(|j| ((i * 31 + j) as f32).sin() * 3.7).collect();
                Tensor::<B, 1>::from_floats(values.as_slice(), &device).require_grad()
            })
            .collect();
        let counts: Vec<usize> = params.iter().map(|p| p.dims()[0]).collect();
        let buffer = kernels::coalesce(params.clone());
        let pieces = kernels::move_split(buffer, &counts, &device);
        for (piece, param) in pieces.iter().zip(&params) {
            let (a, b) = (piece.to_data(), param.to_data());
            assert_eq!(a.as_slice::<f32>().unwrap(), b.as_slice::<f32>().unwrap());
        }
        // Piece 2 is unused; pieces 0 and 3 are used twice.
        let loss = |ts: &[Tensor<B, 1>]| {
            (ts[0].clone() * ts[0].clone()).sum()
                + ts[1].clone().exp().sum()
                + ts[3].clone() * 5.0
                + ts[0].clone().sum() * ts[3].clone()
        };
        let grads = loss(&pieces).backward();
        let reference = loss(&params).backward();
        for (i, param) in params.iter().enumerate() {
            let got = param.grad(&grads).expect("every parameter gets a gradient");
            let want = match param.grad(&reference) {
                Some(want) => want,
                None => param.clone().inner().zeros_like(),
            };
            let (got, want) = (got.to_data(), want.to_data());
            assert_eq!(
                got.as_slice::<f32>().unwrap(),
                want.as_slice::<f32>().unwrap(),
                "parameter {i}"
            );
        }
    }
}
