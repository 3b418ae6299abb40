//! [`Module`] for the wrapper, transparent to Burn.
//!
//! Everything delegates to the wrapped module: parameter visits and maps (hence the record),
//! device moves, training and validation states. A checkpoint saved through the wrapper is
//! the bare module's checkpoint, without the `inner.` prefix that `#[derive(Module)]` on a
//! wrapper struct would add.

use burn::module::{
    Content, Devices, Module, ModuleDisplay, ModuleDisplayDefault, ModuleMapper, ModuleVisitor,
};
use burn::tensor::Device;

use super::DataParallel;

impl<M: Clone> Clone for DataParallel<M> {
    fn clone(&self) -> Self {
        Self {
            module: self.module.clone(),
            settings: self.settings.clone(),
        }
    }
}

impl<M: core::fmt::Debug> core::fmt::Debug for DataParallel<M> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let settings = &self.settings;
        f.debug_struct("DataParallel")
            .field("module", &self.module)
            .field("devices", &settings.devices)
            .field("output_device", &settings.output_device)
            .field("dim", &settings.dim)
            .field("shard_weights", &settings.shard_weights)
            .field("adaptive_shards", &settings.balancer.is_some())
            .field("profiling", &settings.profiler.is_enabled())
            .field("loss_reduction", &settings.loss_reduction)
            .finish()
    }
}

impl<M: Module> Module for DataParallel<M> {
    fn collect_devices(&self, devices: Devices) -> Devices {
        self.module.collect_devices(devices)
    }

    fn fork(self, device: &Device) -> Self {
        Self {
            module: self.module.fork(device),
            ..self
        }
    }

    fn to_device(self, device: &Device) -> Self {
        Self {
            module: self.module.to_device(device),
            ..self
        }
    }

    fn train(self) -> Self {
        Self {
            module: self.module.train(),
            ..self
        }
    }

    fn valid(&self) -> Self {
        Self {
            module: self.module.valid(),
            settings: self.settings.clone(),
        }
    }

    fn materialize(self) -> Self {
        Self {
            module: self.module.materialize(),
            ..self
        }
    }

    fn visit<V: ModuleVisitor>(&self, visitor: &mut V) {
        self.module.visit(visitor)
    }

    fn map<Mapper: ModuleMapper>(self, mapper: &mut Mapper) -> Self {
        Self {
            module: self.module.map(mapper),
            ..self
        }
    }
}

impl<M: ModuleDisplay> ModuleDisplayDefault for DataParallel<M> {
    fn content(&self, content: Content) -> Option<Content> {
        content
            .set_top_level_type("DataParallel")
            .add_debug_attribute("devices", &self.settings.devices)
            .add_debug_attribute("output_device", &self.settings.output_device)
            .add_debug_attribute("dim", &self.settings.dim)
            .add("module", &self.module)
            .optional()
    }

    fn num_params(&self) -> usize {
        self.module.num_params()
    }
}

impl<M: ModuleDisplay> ModuleDisplay for DataParallel<M> {}

impl<M: ModuleDisplay> core::fmt::Display for DataParallel<M> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}", ModuleDisplay::format(self, Default::default()))
    }
}
