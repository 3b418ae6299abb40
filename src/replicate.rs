//! Differentiable copies of a module, one per replica.

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::{Bool, FloatDType, Int, Tensor, backend::Backend};

use crate::ops;

/// One copy of `module` per device, each with its parameters on that device.
///
/// A copy on the device that already holds a parameter shares that parameter's data (no
/// copy); a copy on another device moves it with `to_device`, whose backward moves the
/// gradient back. Under an autodiff backend every replica's gradient sums into the original
/// parameters.
///
/// Under an autodiff backend, every trainable parameter is first given a graph node on the
/// calling thread (a free reshape to its own shape), and all these nodes are joined into one
/// autodiff graph. Replicas' forwards on other threads then only add nodes to that one graph
/// and never merge two graphs: Burn 0.21's graph locator can lose a node registered by one
/// thread while another thread merges that node's graph (missing or wrong gradients). A
/// single replica runs on the calling thread and needs no anchoring.
pub fn replicate<B: Backend, M: Module<B>>(module: &M, devices: &[B::Device]) -> Vec<M> {
    let module = match devices.len() {
        1 => module.clone(),
        _ => {
            let mut anchor = Anchor { probes: Vec::new() };
            let module = module.clone().map(&mut anchor);
            anchor.join();
            module
        }
    };
    devices
        .iter()
        .map(|device| module.clone().map(&mut MoveTo { device }))
        .collect()
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

/// Gives trainable parameters a graph node each and keeps a one-element slice of each node.
struct Anchor<B: Backend> {
    probes: Vec<Tensor<B, 1>>,
}

impl<B: Backend> Anchor<B> {
    /// Joins the graphs of all anchored parameters with one operation that has every probe as
    /// a parent; its output is discarded.
    fn join(self) {
        if self.probes.len() < 2 {
            return;
        }
        let mut groups: Vec<Vec<Tensor<B, 1>>> = Vec::new();
        for probe in self.probes {
            match groups.iter_mut().find(|g| g[0].dtype() == probe.dtype()) {
                Some(group) => group.push(probe),
                None => groups.push(vec![probe]),
            }
        }
        let mut joined: Vec<Tensor<B, 1>> = groups.into_iter().map(|g| Tensor::cat(g, 0)).collect();
        if joined.len() > 1 {
            joined = joined
                .into_iter()
                .map(|t| t.cast(FloatDType::F32))
                .collect();
        }
        let _ = Tensor::cat(joined, 0);
    }
}

impl<B: Backend> ModuleMapper<B> for Anchor<B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let tensor = param.val();
        let elements = tensor.shape().num_elements();
        if !tensor.is_require_grad() || elements == 0 {
            return param;
        }
        param.map(|tensor| {
            let dims = tensor.dims();
            let node = tensor.reshape(dims);
            self.probes
                .push(node.clone().reshape([elements]).narrow(0, 0, 1));
            node
        })
    }
}

struct MoveTo<'a, D> {
    device: &'a D,
}

impl<B: Backend> ModuleMapper<B> for MoveTo<'_, B::Device> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        param.map(|tensor| ops::move_to(tensor, self.device))
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
