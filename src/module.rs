//! [`Module`] implementations that make the wrapper transparent to Burn.
//!
//! Everything delegates to the wrapped module: the record, parameter visits and maps, device
//! moves. A checkpoint saved through the wrapper is the bare module's checkpoint, without the
//! `inner.` prefix that `#[derive(Module)]` on a wrapper struct would add.

use burn::module::{
    AutodiffModule, Content, Devices, HasAutodiffModule, Module, ModuleDisplay,
    ModuleDisplayDefault, ModuleMapper, ModuleVisitor,
};
use burn::tensor::backend::{AutodiffBackend, Backend};

use crate::data_parallel::DataParallel;
use crate::data_parallel::{own_inner_states, own_states};

impl<B: Backend, M: Clone> Clone for DataParallel<B, M> {
    fn clone(&self) -> Self {
        Self {
            module: self.module.clone(),
            settings: self.settings.clone(),
            own_states: self.own_states,
            relocate: self.relocate,
        }
    }
}

impl<B: Backend, M: core::fmt::Debug> core::fmt::Debug for DataParallel<B, M> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let settings = &self.settings;
        f.debug_struct("DataParallel")
            .field("module", &self.module)
            .field("devices", &settings.devices)
            .field("output_device", &settings.output_device)
            .field("dim", &settings.dim)
            .field("shard_weights", &settings.shard_weights)
            .field("bucket_size", &settings.bucket_size)
            .field("profiling", &settings.profiler.is_enabled())
            .field("running_states_per_device", &self.own_states.is_some())
            .field("parallel_backward", &settings.parallel_backward)
            .field("loss_reduction", &settings.loss_reduction)
            .finish()
    }
}

impl<B: Backend, M: Module<B>> Module<B> for DataParallel<B, M> {
    type Record = M::Record;

    fn collect_devices(&self, devices: Devices<B>) -> Devices<B> {
        self.module.collect_devices(devices)
    }

    fn fork(self, device: &B::Device) -> Self {
        let module = match self.relocate {
            Some(relocate) => relocate(self.module, device, true),
            None => self.module.fork(device),
        };
        Self { module, ..self }
    }

    fn to_device(self, device: &B::Device) -> Self {
        let module = match self.relocate {
            Some(relocate) => relocate(self.module, device, false),
            None => self.module.to_device(device),
        };
        Self { module, ..self }
    }

    fn visit<V: ModuleVisitor<B>>(&self, visitor: &mut V) {
        self.module.visit(visitor)
    }

    fn map<Mapper: ModuleMapper<B>>(self, mapper: &mut Mapper) -> Self {
        Self {
            module: self.module.map(mapper),
            ..self
        }
    }

    fn load_record(self, record: Self::Record) -> Self {
        Self {
            module: self.module.load_record(record),
            ..self
        }
    }

    fn into_record(self) -> Self::Record {
        self.module.into_record()
    }
}

impl<B: AutodiffBackend, M: AutodiffModule<B>> AutodiffModule<B> for DataParallel<B, M> {
    type InnerModule = DataParallel<B::InnerBackend, M::InnerModule>;

    fn valid(&self) -> Self::InnerModule {
        DataParallel {
            module: self.module.valid(),
            settings: self.settings.clone(),
            own_states: Some(own_inner_states::<B, M>),
            relocate: None,
        }
    }

    fn from_inner(inner: Self::InnerModule) -> Self {
        DataParallel {
            module: M::from_inner(inner.module),
            settings: inner.settings,
            own_states: Some(own_states::<B, M>),
            relocate: None,
        }
    }
}

impl<B: AutodiffBackend, M: HasAutodiffModule<B>> HasAutodiffModule<B>
    for DataParallel<B::InnerBackend, M>
where
    M: Module<B::InnerBackend>,
    M::TrainModule: AutodiffModule<B, InnerModule = M>,
{
    type TrainModule = DataParallel<B, M::TrainModule>;
}

impl<B: Backend, M: ModuleDisplay> ModuleDisplayDefault for DataParallel<B, M> {
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

impl<B: Backend, M: ModuleDisplay> ModuleDisplay for DataParallel<B, M> {}

impl<B: Backend, M: ModuleDisplay> core::fmt::Display for DataParallel<B, M> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}", ModuleDisplay::format(self, Default::default()))
    }
}
