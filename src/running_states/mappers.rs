//! The visitors and mappers of the running states: finding them, copying and flattening
//! them, writing them back.

use std::collections::{HashMap, HashSet};

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::tensor::ops::{BoolTensor, IntTensor};
use burn::tensor::{Bool, Int, Tensor, TensorPrimitive, backend::Backend};

use crate::backend::{ConcatBackend, is_tracked};

/// The ids of `module`'s running states: the untracked float tensors that a mapped clone of
/// the module changes in the module itself (Burn's `RunningState` shares its value with
/// every clone; a parameter does not). Overwrites those states with placeholders.
pub(super) fn running_states<B: ConcatBackend, M: Module<B>>(module: &M) -> HashSet<ParamId> {
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
pub(super) struct Shapes {
    shapes: HashMap<ParamId, Vec<usize>>,
}

impl Shapes {
    pub(super) fn of<B: ConcatBackend, M: Module<B>>(module: &M) -> HashMap<ParamId, Vec<usize>> {
        let mut shapes = Self {
            shapes: HashMap::new(),
        };
        module.visit(&mut shapes);
        shapes.shapes
    }
}

impl<B: ConcatBackend> ModuleVisitor<B> for Shapes {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let tensor = param.val();
        if !is_tracked(&tensor) && tensor.shape().num_elements() > 0 {
            self.shapes.insert(param.id, tensor.dims().to_vec());
        }
    }
}

/// Replaces untracked, non-empty float tensors by uninitialised ones one item longer.
struct Placeholders;

impl<B: ConcatBackend> ModuleMapper<B> for Placeholders {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let tensor = param.val();
        if is_tracked(&tensor) || tensor.shape().num_elements() == 0 {
            return param;
        }
        param.map(|tensor| {
            let mut dims = tensor.dims();
            dims[0] += 1;
            Tensor::empty(dims, &tensor.device())
        })
    }
}

/// Every tensor of a module, by id.
pub(super) struct Tensors<B: Backend> {
    floats: HashMap<ParamId, TensorPrimitive<B>>,
    ints: HashMap<ParamId, IntTensor<B>>,
    bools: HashMap<ParamId, BoolTensor<B>>,
}

impl<B: Backend> Tensors<B> {
    pub(super) fn of<M: Module<B>>(module: &M) -> Self {
        let mut tensors = Self {
            floats: HashMap::new(),
            ints: HashMap::new(),
            bools: HashMap::new(),
        };
        module.visit(&mut tensors);
        tensors
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
pub(super) struct Adopt<'a, B: Backend> {
    pub(super) tensors: &'a Tensors<B>,
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
pub(super) struct Flat<'a, B: Backend> {
    ids: &'a HashSet<ParamId>,
    found: Vec<(ParamId, Tensor<B, 1>)>,
}

impl<B: Backend> Flat<'_, B> {
    pub(super) fn of<M: Module<B>>(
        module: &M,
        ids: &HashSet<ParamId>,
    ) -> Vec<(ParamId, Tensor<B, 1>)> {
        let mut flat = Flat {
            ids,
            found: Vec::new(),
        };
        module.visit(&mut flat);
        flat.found
    }
}

impl<B: Backend> ModuleVisitor<B> for Flat<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if self.ids.contains(&param.id) {
            let tensor = param.val();
            let elements = tensor.shape().num_elements();
            self.found.push((param.id, tensor.reshape([elements])));
        }
    }
}

/// Writes new values into a module's running states (shared by all its clones).
pub(super) struct SetStates<B: Backend> {
    pub(super) values: HashMap<ParamId, Tensor<B, 1>>,
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
/// were before replicas were made; mapping a copy onto another device moves the shared ones
/// of the module and every clone, and [`Noted::restore`] puts them back.
pub(super) struct Noted<B: Backend> {
    tensors: HashMap<ParamId, TensorPrimitive<B>>,
}

impl<B: ConcatBackend> Noted<B> {
    pub(super) fn of<M: Module<B>>(module: &M) -> Self {
        let mut noted = Self {
            tensors: HashMap::new(),
        };
        module.visit(&mut noted);
        noted
    }

    /// Puts back every noted value that a copy moved to another device (the noted tensors are
    /// the moved values' sources, so nothing is copied); returns whether any was.
    pub(super) fn restore<M: Module<B>>(self, module: &M) -> bool {
        let mut restore = Restore {
            tensors: self.tensors,
            restored: false,
        };
        let _ = module.clone().map(&mut restore);
        restore.restored
    }
}

impl<B: ConcatBackend> ModuleVisitor<B> for Noted<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let tensor = param.val();
        if !is_tracked(&tensor) {
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
