//! Tracked tensors and modules that reach the replicas other than as split input: captured by
//! the closure of `forward_with_captures`, passed in a `Shared` value or a hand-written
//! `Scatter` the wrapper cannot see into (both run the exact path), passed whole in
//! `Broadcast`, or reached through a global, which the fast path refuses where it can see it
//! and bounds in time where it cannot. Each body runs under the watchdog of `backend_tests!`.

use std::any::Any;
use std::sync::Mutex;

use crate::common::*;
use crate::graphs::{assert_same, weighted, wrap};
use burn::module::{Module, Param};
use burn::nn::{Linear, LinearConfig};
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use burn_dataparallel::backend::move_to;
use burn_dataparallel::{
    Broadcast, DataParallel, DataParallelBackend, DataParallelConfig, DataParallelError, Scatter,
    Shards, Shared,
};

/// What a step trains beside the wrapped body: the closure reaches it without the wrapper
/// handing it out.
#[derive(Module, Debug)]
pub struct Side<B: Backend> {
    /// Multiplies the input (`[1, 8]`).
    scale_in: Param<Tensor<B, 2>>,
    /// Multiplies the body's output (`[1, 4]`).
    scale_out: Param<Tensor<B, 2>>,
    /// Before the body (8 to 8).
    pre: Linear<B>,
    /// After the body (4 to 2).
    head: Linear<B>,
}

impl<B: Backend> Side<B> {
    /// Side values with every parameter initialised, so that clones share them (Burn's
    /// `Linear` initialises its parameters lazily, each clone on its own).
    fn new(device: &B::Device) -> Self {
        let side = Self {
            scale_in: Param::from_tensor(random([1, 8], device)),
            scale_out: Param::from_tensor(random([1, 4], device)),
            pre: LinearConfig::new(8, 8).init(device),
            head: LinearConfig::new(4, 2).init(device),
        };
        for linear in [&side.pre, &side.head] {
            let _ = (linear.weight.val(), linear.bias.as_ref().map(Param::val));
        }
        side
    }
}

/// Where the captured tensor or module enters a replica's forward.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Place {
    /// `m.forward(x * s)`.
    Input,
    /// `(m.forward(x) * s).add_scalar(1.0).exp()`.
    UnderOps,
    /// `m.forward(x) * s`.
    Output,
    /// `head.forward(m.forward(x)).tanh()`.
    ModuleAfter,
    /// `m.forward(pre.forward(x))`.
    ModuleBefore,
    /// `m.forward(x * s)`, and `s` in the caller's loss too.
    AlsoInLoss,
}

const PLACES: [Place; 6] = [
    Place::Input,
    Place::UnderOps,
    Place::Output,
    Place::ModuleAfter,
    Place::ModuleBefore,
    Place::AlsoInLoss,
];

impl Place {
    fn uses_a_module(self) -> bool {
        matches!(self, Place::ModuleAfter | Place::ModuleBefore)
    }
}

/// A replica's forward with the side values at `place`; captured tensors are moved to the
/// shard's device (a no-op on one device).
fn forward<B: DataParallelBackend>(
    m: &Mlp<B>,
    side: &Side<B>,
    x: Tensor<B, 2>,
    place: Place,
) -> Tensor<B, 2> {
    let device = x.device();
    let s_in = || move_to(side.scale_in.val(), &device);
    match place {
        Place::Input | Place::AlsoInLoss => m.forward(x * s_in()),
        Place::UnderOps => (m.forward(x) * move_to(side.scale_out.val(), &device))
            .add_scalar(1.0)
            .exp(),
        Place::Output => m.forward(x) * move_to(side.scale_out.val(), &device),
        Place::ModuleAfter => side.head.forward(m.forward(x)).tanh(),
        Place::ModuleBefore => m.forward(side.pre.forward(x)),
    }
}

/// The step's loss over a forward's output.
fn loss<B: DataParallelBackend>(
    output: Tensor<B, 2>,
    side: &Side<B>,
    place: Place,
) -> Tensor<B, 1> {
    let loss = weighted(output, 1.0);
    match place {
        Place::AlsoInLoss => loss + side.scale_in.val().powi_scalar(2).sum(),
        _ => loss,
    }
}

/// How the side values reach the replicas.
#[derive(Clone, Copy, Debug)]
enum Route {
    /// Captured by the closure of `forward_with_captures`.
    Captured,
    /// In the input, as `Shared(side)`: a value the wrapper cannot see into.
    Shared,
    /// In the input, in a hand-written `Scatter` that hands every part the same value.
    Cloned,
}

/// A hand-written `Scatter` that gives every part the same side values and keeps the
/// default of `scatters_every_tensor` (false).
#[derive(Clone)]
struct Cloned<B: Backend>(Tensor<B, 2>, Side<B>);

impl<B: DataParallelBackend> Scatter<B> for Cloned<B> {
    fn batch_size(&self, dim: usize) -> Result<Option<usize>, DataParallelError> {
        Ok(Some(self.0.dims()[dim]))
    }

    fn scatter(self, shards: &Shards<B>) -> Vec<Self> {
        let Cloned(x, side) = self;
        Scatter::scatter(x, shards)
            .into_iter()
            .map(|part| Cloned(part, side.clone()))
            .collect()
    }
}

/// Runs the wrapper's forward with the side values at `place`, reached by `route`.
fn forward_dp<B: DataParallelBackend>(
    dp: &DataParallel<B, Mlp<B>>,
    side: &Side<B>,
    x: Tensor<B, 2>,
    place: Place,
    route: Route,
) -> Result<Tensor<B, 2>, DataParallelError> {
    match route {
        Route::Captured => dp.try_forward_with_captures(x, |m, x| forward(m, side, x, place)),
        Route::Shared => dp.try_forward_with(
            (x, Shared(side.clone()), Shared(place)),
            |m, (x, Shared(side), Shared(place))| forward(m, &side, x, place),
        ),
        Route::Cloned => dp.try_forward_with(
            (Cloned(x, side.clone()), Shared(place)),
            |m, (Cloned(x, side), Shared(place))| forward(m, &side, x, place),
        ),
    }
}

/// Three SGD steps of the wrapped body and of the side values it reaches at `place` by
/// `route` leave both where the same steps of the bare pair leave them; on distinct devices,
/// a captured module on the caller's device fails the replicas elsewhere with a typed error.
fn three_steps_match_bare<B: DataParallelBackend>(place: Place, route: Route, parallel: bool) {
    let device = Default::default();
    let mut dp = wrap(Mlp::<B>::new(8, 16, 4, &device), 3, parallel);
    let mut side = Side::<B>::new(&device);
    let mut bare = dp.module().clone();
    let mut bare_side = side.clone();
    let (mut optim, mut optim_side) = (SgdConfig::new().init(), SgdConfig::new().init());
    let (mut optim_bare, mut optim_bare_side) = (SgdConfig::new().init(), SgdConfig::new().init());
    let what = format!("{place:?} by {route:?}");
    for _ in 0..3 {
        let x = random::<B, 2>([9, 8], &device);
        let output = forward(&bare, &bare_side, x.clone(), place);
        let mut grads = loss(output, &bare_side, place).backward();
        let body_grads = GradientsParams::from_module(&mut grads, &bare);
        let side_grads = GradientsParams::from_module(&mut grads, &bare_side);
        bare = optim_bare.step(0.05, bare, body_grads);
        bare_side = optim_bare_side.step(0.05, bare_side, side_grads);

        let output = match forward_dp(&dp, &side, x, place, route) {
            // What a closure captures stays on the caller's device: replicas elsewhere are
            // refused before they run.
            Err(DataParallelError::CapturesAcrossDevices { .. })
                if distinct_plan() && matches!(route, Route::Captured) =>
            {
                return;
            }
            other => other.unwrap_or_else(|error| panic!("{what}: {error}")),
        };
        let mut grads = loss(output, &side, place).backward();
        let body_grads = GradientsParams::from_module(&mut grads, &dp);
        let side_grads = GradientsParams::from_module(&mut grads, &side);
        dp = optim.step(0.05, dp, body_grads);
        side = optim_side.step(0.05, side, side_grads);
    }
    assert!(
        !(distinct_plan() && matches!(route, Route::Captured)),
        "{what}: replicas on other devices ran a capturing closure"
    );
    for (a, e) in param_values(dp.module()).iter().zip(&param_values(&bare)) {
        assert_close(a, e, &format!("{what}: body after three steps"));
    }
    for (a, e) in param_values(&side).iter().zip(&param_values(&bare_side)) {
        assert_close(a, e, &format!("{what}: side values after three steps"));
    }
}

/// Every place, captured, with or without the parallel backward in the settings.
fn captured_case<B: DataParallelBackend>(parallel: bool) {
    for place in PLACES {
        three_steps_match_bare::<B>(place, Route::Captured, parallel);
    }
}

/// Every place, in a `Shared` value and in a hand-written `Scatter`: the forward's input
/// holds values the wrapper cannot see into, so it takes the exact path by itself. On
/// distinct devices, only the tensors, which the forward moves to each replica's device: a
/// module handed over as it is stays on the caller's device, and Burn 0.21 launches a matrix
/// product on another device with its buffers unchecked (which fails that device).
fn unseen_case<B: DataParallelBackend>() {
    for place in PLACES {
        if distinct_plan() && place.uses_a_module() {
            continue;
        }
        three_steps_match_bare::<B>(place, Route::Shared, true);
        three_steps_match_bare::<B>(place, Route::Cloned, true);
    }
}

/// The step profile names the path a forward took: the fast one for split tensors, the exact
/// one for `forward_with_captures` and for inputs the wrapper cannot see into (`Shared`, a
/// hand-written `Scatter` that keeps the default of `scatters_every_tensor`).
fn profile_names_the_path_case<B: DataParallelBackend>() {
    let device = Default::default();
    let dp = wrap(Mlp::<B>::new(8, 16, 4, &device), 3, true);
    let side = Side::<B>::new(&device);
    dp.set_profiling(true);
    let path = |output: Tensor<B, 2>| {
        let _ = weighted(output, 1.0).backward();
        let profile = dp.profile().expect("a profile of the step");
        let shown = profile.to_string().starts_with("exact path: ");
        (profile.exact_path, shown)
    };
    let x = || random::<B, 2>([9, 8], &device);
    assert_eq!(
        path(dp.forward_with(x(), |m, x| m.forward(x))),
        (false, false)
    );
    for route in [Route::Captured, Route::Shared, Route::Cloned] {
        if distinct_plan() && matches!(route, Route::Captured) {
            continue;
        }
        let output = forward_dp(&dp, &side, x(), Place::Input, route).expect("a forward");
        assert_eq!(path(output), (true, true), "{route:?}");
    }
    assert_eq!(
        path(dp.forward_with(x(), |m, x| m.forward(x))),
        (false, false)
    );
}

/// A tracked tensor passed whole to every replica (`Broadcast`) gets the sum of their
/// gradients.
fn broadcast_case<B: DataParallelBackend>() {
    let device = Default::default();
    let dp = wrap(Mlp::<B>::new(8, 16, 4, &device), 3, true);
    let bare = dp.module().clone();
    let x = random::<B, 2>([7, 8], &device);
    let scale = random::<B, 2>([1, 4], &device).require_grad();
    let expected = weighted(bare.forward(x.clone()) * scale.clone(), 1.0).backward();
    let output = dp.forward_with((x, Broadcast(scale.clone())), |m, (x, Broadcast(s))| {
        m.forward(x) * s
    });
    let actual = weighted(output, 1.0).backward();
    assert_same(&dp, &actual, &bare, &expected);
    assert_close(
        &values(scale.grad(&actual).expect("broadcast gradient")),
        &values(scale.grad(&expected).expect("broadcast gradient")),
        "broadcast gradient",
    );
}

/// Tracked tensors reached through a global, by the token a call passes in its input (tests
/// run at the same time in one process): what the type of a closure cannot show.
static GLOBALS: Mutex<Vec<(u64, Box<dyn Any + Send>)>> = Mutex::new(Vec::new());

fn set_global<B: Backend>(token: u64, tensor: Tensor<B, 2>) {
    GLOBALS.lock().unwrap().push((token, Box::new(tensor)));
}

fn global<B: Backend>(token: u64) -> Tensor<B, 2> {
    let globals = GLOBALS.lock().unwrap();
    let (_, value) = globals.iter().find(|(t, _)| *t == token).expect("set");
    value
        .downcast_ref::<Tensor<B, 2>>()
        .expect("this backend's")
        .clone()
}

/// A tracked tensor a replica reaches through a global and uses on its output: the parallel
/// backward sees it and refuses the forward with a typed error, rather than leave it without a
/// gradient; on distinct devices Burn's device check fails the replicas elsewhere first.
fn global_on_the_output_case<B: DataParallelBackend>() {
    let device = Default::default();
    let dp = wrap(Mlp::<B>::new(8, 16, 4, &device), 3, true);
    let token = thread_token();
    set_global(token, random::<B, 2>([1, 4], &device).require_grad());
    let x = random::<B, 2>([7, 8], &device);
    let result = dp.try_forward_with((x, token), |m, (x, token)| m.forward(x) * global(token));
    if distinct_plan() {
        assert_other_device_refused(result.map(|t| t.dims()));
    } else if B::concurrent_backward() {
        assert!(
            matches!(result, Err(DataParallelError::CapturedTensor { .. })),
            "expected a captured-tensor error, got {:?}",
            result.map(|t| t.dims())
        );
    }
}

/// A tracked tensor reached through a global, used on the replicas' input and in the
/// caller's loss too: the parallel backward cannot see it, but the caller's backward ends in
/// bounded time: when Burn merged the replicas' graphs with the caller's (a fresh tensor's
/// first use), with a panic after the configured bound that names the bound and the tensor's
/// way in (a replica waited for its graph, or, when the replicas' threads raced Burn's
/// merges, its backward did not finish); or by returning.
fn global_in_the_loss_case<B: DataParallelBackend>() {
    let device = Default::default();
    let dp = DataParallelConfig::new()
        .with_backward_timeout_secs(Some(2))
        .init(Mlp::<B>::new(8, 16, 4, &device), devices::<B>(3))
        .unwrap();
    let token = thread_token();
    let scale = random::<B, 2>([1, 8], &device).require_grad();
    set_global(token, scale.clone());
    let x = random::<B, 2>([7, 8], &device);
    let forward = |m: &Mlp<B>, (x, token): (Tensor<B, 2>, u64)| m.forward(x * global(token));
    let result = dp.try_forward_with((x, token), forward);
    if distinct_plan() {
        return assert_other_device_refused(result.map(|t| t.dims()));
    }
    if !B::concurrent_backward() {
        return;
    }
    let actual = weighted(result.expect("a forward"), 1.0) + scale.sum();
    let started = std::time::Instant::now();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| actual.backward()));
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "ended after {:?}, with a bound of 2 s",
        started.elapsed()
    );
    if let Err(payload) = result {
        let message = panic_text(payload.as_ref());
        assert!(
            message.contains("backward_timeout_secs") && message.contains("global"),
            "message: {message}"
        );
    }
}

/// With replicas on distinct devices, a tensor on the caller's device meets a replica's
/// tensors on another device: Burn's device check fails that replica, and the wrapper returns
/// its panic as an error naming it.
fn assert_other_device_refused<T: std::fmt::Debug>(result: Result<T, DataParallelError>) {
    match result {
        Err(DataParallelError::ReplicaPanicked {
            replica, message, ..
        }) => {
            assert!(replica > 0, "replica 0 shares the caller's device");
            assert!(message.contains("same device"), "message: {message}");
        }
        other => panic!("expected replica on another device to fail, got {other:?}"),
    }
}

/// The text of a panic's payload.
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    match payload.downcast_ref::<String>() {
        Some(message) => message.clone(),
        None => payload
            .downcast_ref::<&str>()
            .map(|m| m.to_string())
            .unwrap_or_default(),
    }
}

backend_tests! {
    captured => captured_case(true),
        moves_nothing = "replicas on other devices are refused before any transfer";
    captured_serial => captured_case(false),
        moves_nothing = "replicas on other devices are refused before any transfer";
    unseen_inputs => unseen_case();
    profile_names_the_path => profile_names_the_path_case();
    broadcast => broadcast_case();
    global_on_the_output => global_on_the_output_case();
    global_in_the_loss => global_in_the_loss_case();
}
