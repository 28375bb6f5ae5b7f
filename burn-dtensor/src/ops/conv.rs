//! Convolutions and their input and weight gradients, run per device on the plan of
//! [`crate::rules::conv`]: the batch and the spatial dims stay sharded, each device convolving
//! its block plus a halo from its neighbours (spatial parallelism); with no sharded spatial dim
//! the batch-parallel form ([`run_batch_with`]).
//!
//! The halo exchange and its adjoint are [`super::halo`]'s; a convolution's windows hold the
//! padding's zeros, the convolution then run unpadded on those dims.
//!
//! The weight and bias gradients are pending sums over every axis that shards the input, as a
//! linear layer's data-parallel gradient, reduce-scattered at once onto an FSDP-sharded weight
//! ([`weight_grads::settle_now`]).

use burn::tensor::backend::Backend;
use burn::tensor::ops::ConvOptions;
use burn::tensor::{Shape, TensorMetadata};

use super::dispatch::{run_batch_with, run_positions};
use super::halo::{fold_windows, narrow, window, window_shape, windows};
use super::weight_grads;
use crate::layout::{Layout, ReduceOp};
use crate::redistribute::execute;
use crate::rules::conv::{ConvPlan, conv};
use crate::tensor::{DTensor, FloatKind};

type P<B> = <B as burn::tensor::backend::BackendTypes>::FloatTensorPrimitive;
type FT<B> = DTensor<P<B>>;

/// The plan of a convolution of `x` by a weight of global shape `weight`
/// (`[channels_out, channels_in / groups, kernel...]`).
fn plan_of<const N: usize>(
    x: &Layout,
    x_shape: &[usize],
    weight: &[usize],
    o: &ConvOptions<N>,
) -> ConvPlan {
    conv(
        x,
        x_shape,
        weight[0],
        &weight[2..],
        [&o.stride, &o.padding, &o.dilation],
    )
}

/// The options each device runs with: no padding on a dim with a halo
/// ([`ConvPlan::local_padding`]).
fn local<const N: usize>(o: &ConvOptions<N>, plan: &ConvPlan) -> ConvOptions<N> {
    let mut o = o.clone();
    o.padding = plan.local_padding(o.padding);
    o
}

/// `t` replicated on `x`'s mesh (a weight or bias; operands on another mesh refused).
fn replicated<B: Backend>(t: FT<B>, x: &Layout) -> FT<B> {
    super::common::prep::<B, FloatKind>(t, x, false)
}

/// A convolution (`conv2d`, `conv3d`): `x` `[batch, channels_in, spatial...]`, weight
/// `[channels_out, channels_in / groups, kernel...]`, bias `[channels_out]`; output
/// `[batch, channels_out, spatial_out...]` laid out as [`ConvPlan::out`] (global shapes). `inner`
/// is the inner backend's convolution of that rank.
pub(crate) fn forward<B: Backend, const N: usize>(
    x: FT<B>,
    weight: FT<B>,
    bias: Option<FT<B>>,
    options: ConvOptions<N>,
    inner: impl Fn(P<B>, P<B>, Option<P<B>>, ConvOptions<N>) -> P<B> + Sync,
) -> FT<B> {
    let plan = plan_of(&x.layout, &x.shape, &weight.shape, &options);
    super::common::same_mesh(&plan.x, &x.layout);
    let w = replicated::<B>(weight, &plan.x);
    let b = bias.map(|b| replicated::<B>(b, &plan.x));
    let bias_of = |j: usize| b.as_ref().map(|b| b.per_device()[j].clone());
    let xs = execute::<B, FloatKind>(x, &plan.x);
    if plan.halos.is_empty() {
        return run_batch_with::<B, _>(&xs, true, empty_batch::<B>, |j| {
            inner(
                xs.per_device()[j].clone(),
                w.per_device()[j].clone(),
                bias_of(j),
                options.clone(),
            )
        });
    }
    let ext = windows::<B>(xs, &plan.halos, 0.0);
    let opts = local(&options, &plan);
    let out = run_positions::<B, _>(&ext, &[&plan.x], |j| {
        inner(
            window::<B>(&ext, &plan.halos, j),
            w.per_device()[j].clone(),
            bias_of(j),
            opts.clone(),
        )
    });
    DTensor::from_parts(plan.out_shape.clone(), plan.out.clone(), out)
}

/// A backward pass's plan (that of the forward of `x` by `weight`), the weight replicated on
/// the input's mesh and the output gradient `grad` in the output's layout.
fn backward_operands<B: Backend, const N: usize>(
    x: &FT<B>,
    weight: FT<B>,
    grad: FT<B>,
    options: &ConvOptions<N>,
) -> (ConvPlan, FT<B>, FT<B>) {
    let plan = plan_of(&x.layout, &x.shape, &weight.shape, options);
    let w = replicated::<B>(weight, &plan.x);
    let g = execute::<B, FloatKind>(grad, &plan.out);
    (plan, w, g)
}

/// The input gradient of [`forward`] (`[batch, channels_in, spatial...]` in [`ConvPlan::x`]):
/// `x` gives only its shape and layout (Burn's input gradient reads no input value), `grad` the
/// output's gradient; `inner` the inner backend's `conv*_x_backward`.
pub(crate) fn x_backward<B: Backend, const N: usize>(
    x: FT<B>,
    weight: FT<B>,
    grad: FT<B>,
    options: ConvOptions<N>,
    inner: impl Fn(P<B>, P<B>, P<B>, ConvOptions<N>) -> P<B> + Sync,
) -> FT<B> {
    let (plan, w, g) = backward_operands::<B, N>(&x, weight, grad, &options);
    if plan.halos.is_empty() {
        let xs = execute::<B, FloatKind>(x, &plan.x);
        return run_batch_with::<B, _>(&xs, true, empty_batch::<B>, |j| {
            let (x, g) = (xs.per_device()[j].clone(), g.per_device()[j].clone());
            inner(x, w.per_device()[j].clone(), g, options.clone())
        });
    }
    let x_shape = x.shape.clone();
    drop(x);
    let opts = local(&options, &plan);
    let grads = run_positions::<B, _>(&g, &[&plan.x, &plan.out], |j| {
        let gj = g.per_device()[j].clone();
        let shape = window_shape(&plan.x, &x_shape, &plan.halos, j);
        let dtype = gj.dtype().into();
        let xj = B::float_empty(Shape::from(shape), &B::float_device(&gj), dtype);
        inner(xj, w.per_device()[j].clone(), gj, opts.clone())
    });
    fold_windows::<B>(grads, &plan.x, &x_shape, &plan.halos)
}

/// The weight gradient of [`forward`] (the weight's global shape): a pending sum over every
/// axis sharding the input, reduce-scattered at once onto a weight sharded over one of them;
/// `inner` the inner backend's `conv*_weight_backward`.
pub(crate) fn weight_backward<B: Backend, const N: usize>(
    x: FT<B>,
    weight: FT<B>,
    grad: FT<B>,
    options: ConvOptions<N>,
    inner: impl Fn(P<B>, P<B>, P<B>, ConvOptions<N>) -> P<B> + Sync,
) -> FT<B> {
    let wl = weight.layout.clone();
    let (plan, w, g) = backward_operands::<B, N>(&x, weight, grad, &options);
    let xs = execute::<B, FloatKind>(x, &plan.x);
    let per_device = if plan.halos.is_empty() {
        let zero = |r: &P<B>| B::float_zeros(r.shape(), &B::float_device(r), r.dtype().into());
        run_batch_with::<B, _>(&xs, false, zero, |j| {
            let (x, g) = (xs.per_device()[j].clone(), g.per_device()[j].clone());
            inner(x, w.per_device()[j].clone(), g, options.clone())
        })
        .into_per_device()
    } else {
        let ext = windows::<B>(xs, &plan.halos, 0.0);
        let opts = local(&options, &plan);
        run_positions::<B, _>(&ext, &[&plan.x, &plan.out], |j| {
            let (x, g) = (window::<B>(&ext, &plan.halos, j), g.per_device()[j].clone());
            inner(x, w.per_device()[j].clone(), g, opts.clone())
        })
    };
    let layout = plan.sharded_axes().into_iter().fold(
        Layout::replicated_on(&plan.x.mesh, w.shape.len()),
        |l, a| l.with_partial(a, ReduceOp::Sum),
    );
    let out = DTensor::from_parts(w.shape.clone(), layout, per_device);
    match weight_grads::settle_now(&out.layout, &wl) {
        Some(to) => execute::<B, FloatKind>(out, &to),
        None => out,
    }
}

/// A per-shard output with its batch cut to 0 (an empty batch shard, see [`run_batch_with`]).
fn empty_batch<B: Backend>(r: &P<B>) -> P<B> {
    narrow::<B>(r.clone(), 0, 0..0)
}
