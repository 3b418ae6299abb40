//! The forward entry points of a [`DataParallel`]: the model's own [`Forward`], a function
//! over a replica and its shard, and the exact form for closures that capture.
//!
//! The functions the fast forms take are `fn` pointers: a closure coerces to one only if it
//! captures nothing, so a forward that reaches a tracked tensor or module other than through
//! its input does not compile. When one is passed anyway, rustc's note "method defined here"
//! shows the line of the method's name, which therefore says what to write instead (hence
//! the `rustfmt::skip`).

use burn::module::Module;

use super::DataParallel;
use crate::error::{BoxError, DataParallelError};
use crate::forward::Forward;
use crate::gather::Gather;
use crate::scatter::Scatter;
use crate::step;

impl<M: Module> DataParallel<M> {
    /// Runs the wrapped module's [`Forward`] on every shard of `input` and gathers the outputs.
    ///
    /// A drop-in for the bare model's forward in a training loop; use
    /// [`try_forward`](Self::try_forward) to handle failures as values.
    ///
    /// # Shapes
    ///
    /// Those of `M::forward`, with the batch dimension [`dim`](Self::dim) of the input split
    /// and that of the output concatenated.
    ///
    /// # Panics
    ///
    /// With the [`DataParallelError`]'s message where [`try_forward`](Self::try_forward)
    /// returns it, and as the bare model's forward would on misuse.
    pub fn forward(&self, input: M::Input) -> M::Output
    where
        M: Forward,
    {
        self.try_forward(input)
            .unwrap_or_else(|error| panic!("{error}"))
    }

    /// Like [`forward`](Self::forward), returning failures as values.
    ///
    /// # Shapes
    ///
    /// Those of [`forward`](Self::forward).
    ///
    /// # Errors
    ///
    /// Those of [`try_forward_with`](Self::try_forward_with).
    pub fn try_forward(&self, input: M::Input) -> Result<M::Output, DataParallelError>
    where
        M: Forward,
    {
        self.try_forward_with(input, <M as Forward>::forward)
    }

    /// Runs `forward(replica, shard)` for every shard of `input` and gathers the outputs.
    ///
    /// `forward` is a function or a closure that captures nothing: everything a replica uses
    /// comes through `input` (split along [`dim`](Self::dim)) or is the wrapped module, so the
    /// wrapper gives every tracked tensor its gradient. A tensor every replica uses whole
    /// goes in the input as [`Broadcast`](crate::Broadcast), a value that is not a batch as a
    /// number or [`Shared`](crate::Shared), and a second trainable module in the wrapped
    /// module (a tuple of modules is a module). A closure that captures does not compile;
    /// [`forward_with_captures`](Self::forward_with_captures) takes one.
    ///
    /// A single shard runs on the calling thread; several run at the same time, each on its
    /// device's worker thread. Return [`Mean`](crate::Mean) or [`Sum`](crate::Sum) around a
    /// per-replica loss to combine it over the whole batch.
    ///
    /// # Shapes
    ///
    /// Those of `forward`, with the batch dimension [`dim`](Self::dim) of the input split and
    /// that of the output concatenated.
    ///
    /// # Panics
    ///
    /// With the [`DataParallelError`]'s message where
    /// [`try_forward_with`](Self::try_forward_with) returns it.
    ///
    /// # Example
    ///
    /// A learnable scale every replica uses, passed in the input:
    ///
    /// ```
    /// use burn::nn::{Linear, LinearConfig};
    /// use burn::tensor::{Device, Tensor};
    /// use burn_dataparallel::{Broadcast, DataParallel};
    ///
    /// let device = Device::flex().autodiff();
    /// let model: Linear = LinearConfig::new(4, 3).init(&device);
    /// let dp = DataParallel::new(model, vec![device.clone(); 2]).unwrap();
    /// let scale = Tensor::<2>::ones([1, 3], &device).require_grad();
    /// let x = Tensor::<2>::ones([6, 4], &device);
    /// let y = dp.forward_with((x, Broadcast(scale.clone())), |m, (x, Broadcast(s))| {
    ///     m.forward(x) * s
    /// });
    /// let grads = y.sum().backward();
    /// assert_eq!(scale.grad(&grads).unwrap().dims(), [1, 3]);
    /// ```
    ///
    /// Capturing `scale` instead is refused by the compiler:
    ///
    /// ```compile_fail,E0308
    /// # use burn::nn::{Linear, LinearConfig};
    /// # use burn::tensor::{Device, Tensor};
    /// # use burn_dataparallel::DataParallel;
    /// # let device = Device::flex().autodiff();
    /// # let model: Linear = LinearConfig::new(4, 3).init(&device);
    /// # let dp = DataParallel::new(model, vec![device.clone(); 2]).unwrap();
    /// let scale = Tensor::<2>::ones([1, 3], &device).require_grad();
    /// let x = Tensor::<2>::ones([6, 4], &device);
    /// let y = dp.forward_with(x, |m, x| m.forward(x) * scale.clone());
    /// ```
    #[rustfmt::skip]
    pub fn forward_with<I, O>( // no captures: tensors go in the input (`Broadcast`), else use `forward_with_captures`
        &self,
        input: I,
        forward: fn(&M, I) -> O,
    ) -> O
    where
        I: Scatter + Send,
        O: Gather + Send,
    {
        self.try_forward_with(input, forward)
            .unwrap_or_else(|error| panic!("{error}"))
    }

    /// Like [`forward_with`](Self::forward_with), returning failures (a bad input, a
    /// panicking replica, outputs that do not gather) as values.
    ///
    /// # Shapes
    ///
    /// Those of `forward`, with the batch dimension [`dim`](Self::dim) of the input split and
    /// that of the output concatenated.
    ///
    /// # Errors
    ///
    /// Those of [`shards`](Self::shards) for a bad input;
    /// [`DataParallelError::ReplicaPanicked`] when a replica panics (the first replica that
    /// failed, by position); those of [`Gather::gather`] when the outputs disagree. The
    /// wrapper stays usable after an error.
    #[rustfmt::skip]
    pub fn try_forward_with<I, O>( // no captures: tensors go in the input (`Broadcast`), else `try_forward_with_captures`
        &self,
        input: I,
        forward: fn(&M, I) -> O,
    ) -> Result<O, DataParallelError>
    where
        I: Scatter + Send,
        O: Gather + Send,
    {
        let forward =
            move |replica: &M, shard| Ok::<_, std::convert::Infallible>(forward(replica, shard));
        self.run(input, forward, false)
    }

    /// Runs a forward that can fail, `forward(replica, shard)`, for every shard of `input`
    /// and gathers the outputs; a replica's error comes back as
    /// [`DataParallelError::ReplicaFailed`]. `forward` captures nothing, as in
    /// [`forward_with`](Self::forward_with).
    ///
    /// # Shapes
    ///
    /// Those of `forward`, with the batch dimension [`dim`](Self::dim) of the input split and
    /// that of the output concatenated.
    ///
    /// # Errors
    ///
    /// Those of [`try_forward_with`](Self::try_forward_with), and
    /// [`DataParallelError::ReplicaFailed`] when a replica returns an error.
    ///
    /// # Example
    ///
    /// ```
    /// use burn::nn::{Linear, LinearConfig};
    /// use burn::tensor::{Device, Tensor};
    /// use burn_dataparallel::DataParallel;
    ///
    /// let device = Device::flex().autodiff();
    /// let model: Linear = LinearConfig::new(4, 2).init(&device);
    /// let dp = DataParallel::new(model, vec![device.clone(); 2]).unwrap();
    /// let result = dp.try_forward_fallible(Tensor::<2>::ones([6, 4], &device), |m, x| {
    ///     match x.dims()[0] {
    ///         0 => Err(std::io::Error::other("an empty shard")),
    ///         _ => Ok(m.forward(x)),
    ///     }
    /// });
    /// assert_eq!(result.unwrap().dims(), [6, 2]);
    /// ```
    ///
    /// A closure that captures does not compile here either:
    ///
    /// ```compile_fail,E0308
    /// # use burn::nn::{Linear, LinearConfig};
    /// # use burn::tensor::{Device, Tensor};
    /// # use burn_dataparallel::DataParallel;
    /// # let device = Device::flex().autodiff();
    /// # let model: Linear = LinearConfig::new(4, 2).init(&device);
    /// # let dp = DataParallel::new(model, vec![device.clone(); 2]).unwrap();
    /// let scale = Tensor::<2>::ones([1, 2], &device).require_grad();
    /// let result = dp.try_forward_fallible(Tensor::<2>::ones([6, 4], &device), |m, x| {
    ///     Ok::<_, std::io::Error>(m.forward(x) * scale.clone())
    /// });
    /// ```
    #[rustfmt::skip]
    pub fn try_forward_fallible<I, O, E>( // no captures: tensors go in the input (`Broadcast`), else `try_forward_with_captures`
        &self,
        input: I,
        forward: fn(&M, I) -> Result<O, E>,
    ) -> Result<O, DataParallelError>
    where
        I: Scatter + Send,
        O: Gather + Send,
        E: Into<BoxError>,
    {
        self.run(input, forward, false)
    }

    /// Runs `forward(replica, shard)`, a closure that may capture tensors and modules, for
    /// every shard of `input` and gathers the outputs, on the exact path: every tracked
    /// tensor the closure reaches, captured or not, gets the bare model's gradient, through
    /// the caller's one autodiff graph.
    ///
    /// What the closure captures stays on its own device, so this form runs only replicas on
    /// the output device (several
    /// replicas of one device, for tests; or one shard): with others it returns
    /// [`DataParallelError::CapturesAcrossDevices`]. On several devices, pass tensors in the
    /// input and train a second module inside the wrapped one, with
    /// [`forward_with`](Self::forward_with), which is also the faster form.
    ///
    /// # Shapes
    ///
    /// Those of `forward`, with the batch dimension [`dim`](Self::dim) of the input split and
    /// that of the output concatenated.
    ///
    /// # Panics
    ///
    /// With the [`DataParallelError`]'s message where
    /// [`try_forward_with_captures`](Self::try_forward_with_captures) returns it.
    ///
    /// # Example
    ///
    /// A head trained beside the wrapped body, captured by the closure:
    ///
    /// ```
    /// use burn::nn::{Linear, LinearConfig};
    /// use burn::tensor::{Device, Tensor};
    /// use burn_dataparallel::DataParallel;
    ///
    /// let device = Device::flex().autodiff();
    /// let body: Linear = LinearConfig::new(4, 3).init(&device);
    /// let head: Linear = LinearConfig::new(3, 2).init(&device);
    /// let dp = DataParallel::new(body, vec![device.clone(); 3]).unwrap();
    /// let x = Tensor::<2>::ones([9, 4], &device);
    /// let y = dp.forward_with_captures(x, |m, x| head.forward(m.forward(x)).tanh());
    /// let grads = y.powi_scalar(2).mean().backward();
    /// assert!(head.weight.grad(&grads).is_some());
    /// ```
    pub fn forward_with_captures<I, O, F>(&self, input: I, forward: F) -> O
    where
        I: Scatter + Send,
        O: Gather + Send,
        F: Fn(&M, I) -> O + Sync,
    {
        self.try_forward_with_captures(input, forward)
            .unwrap_or_else(|error| panic!("{error}"))
    }

    /// Like [`forward_with_captures`](Self::forward_with_captures), returning failures as
    /// values.
    ///
    /// # Shapes
    ///
    /// Those of `forward`, with the batch dimension [`dim`](Self::dim) of the input split and
    /// that of the output concatenated.
    ///
    /// # Errors
    ///
    /// [`DataParallelError::CapturesAcrossDevices`] where a shard would go to a device other
    /// than the output device; those of [`try_forward_with`](Self::try_forward_with).
    pub fn try_forward_with_captures<I, O, F>(
        &self,
        input: I,
        forward: F,
    ) -> Result<O, DataParallelError>
    where
        I: Scatter + Send,
        O: Gather + Send,
        F: Fn(&M, I) -> O + Sync,
    {
        let forward =
            |replica: &M, shard| Ok::<_, std::convert::Infallible>(forward(replica, shard));
        self.run(input, forward, true)
    }

    /// The pipeline's forward (`step.rs`) with this wrapper's module and settings; `captures`
    /// keeps every shard on the output device.
    fn run<I, O, E, F>(&self, input: I, forward: F, captures: bool) -> Result<O, DataParallelError>
    where
        I: Scatter + Send,
        O: Gather + Send,
        E: Into<BoxError>,
        F: Fn(&M, I) -> Result<O, E> + Sync,
    {
        if captures && !crate::parallel_apply::in_replica() {
            // What the closure captures stays on its device (`CapturesAcrossDevices`).
            let devices = self.shards(&input)?.devices().to_vec();
            if devices.iter().any(|d| *d != self.settings.output_device) {
                let devices = format!("{devices:?}");
                return Err(DataParallelError::CapturesAcrossDevices { devices });
            }
        }
        let forward = |m: &M, input| forward(m, input).map_err(Into::into);
        step::forward(&self.module, &self.settings, input, forward, captures)
    }
}
