//! Convolutions and their input and weight gradients, run per device on the plan of
//! [`crate::rules::conv`]: the batch and the spatial dims stay sharded, each device convolving
//! its block plus a halo from its neighbours (spatial parallelism); with no sharded spatial dim
//! the batch-parallel form ([`run_batch_with`]).
//!
//! A transposed convolution is the input gradient of the convolution it transposes
//! ([`transpose`], [`crate::rules::conv::conv_transpose`]): each device computes its output window
//! from its own block, the window's overlap rows folded back onto the neighbours that own them;
//! its weight gradient is that convolution's weight gradient ([`transpose_weight_backward`]).
//!
//! The halo exchange and its adjoint are [`super::halo`]'s; a convolution's windows hold the
//! padding's zeros, the convolution then run unpadded on those dims.
//!
//! The weight and bias gradients are pending sums over every axis that shards the input, as a
//! linear layer's data-parallel gradient, reduce-scattered at once onto an FSDP-sharded weight
//! ([`weight_grads::settle_now`]).

use burn::tensor::backend::Backend;
use burn::tensor::ops::{ConvOptions, ConvTransposeOptions, FloatTensorOps};
use burn::tensor::{Shape, TensorMetadata};

use super::dispatch::{run_batch_with, run_positions};
use super::halo::{fold_windows, narrow, window, window_shape, windows};
use super::weight_grads;
use crate::backend::DistributedBackend;
use crate::layout::{Layout, ReduceOp};
use crate::redistribute::execute;
use crate::rules::conv::{ConvPlan, batch, conv, conv_transpose};
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

/// The plan of a transposed convolution of `x` by `weight` with `o` ([`conv_transpose`]: the
/// plan of the convolution it transposes, and the output's global shape).
fn transpose_plan_of<T, const N: usize>(
    x: &DTensor<T>,
    weight: &DTensor<T>,
    o: &ConvTransposeOptions<N>,
) -> Option<(ConvPlan, Vec<usize>)> {
    let geometry = [&o.stride[..], &o.padding, &o.padding_out, &o.dilation];
    conv_transpose(&x.layout, &x.shape, &weight.shape, geometry, o.groups)
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
    adjoint::<B, N>(&plan, &x_shape, &w, &g, local(&options, &plan), inner)
}

/// The input gradient of a convolution on `plan` with halos (global shape `x_shape`, laid out as
/// [`ConvPlan::x`]): each device's window gradient from its own block of the output gradient `g`
/// (laid out as [`ConvPlan::out`]) alone, by `inner` (a `conv*_x_backward` run unpadded on the
/// halo dims, `opts`), the halo rows' gradients sent back to their owners and added in
/// ([`fold_windows`]). A transposed convolution's forward too ([`transpose`]).
fn adjoint<B: Backend, const N: usize>(
    plan: &ConvPlan,
    x_shape: &[usize],
    w: &FT<B>,
    g: &FT<B>,
    opts: ConvOptions<N>,
    inner: impl Fn(P<B>, P<B>, P<B>, ConvOptions<N>) -> P<B> + Sync,
) -> FT<B> {
    let grads = run_positions::<B, _>(g, &[&plan.x, &plan.out], |j| {
        let gj = g.per_device()[j].clone();
        let shape = window_shape(&plan.x, x_shape, &plan.halos, j);
        let dtype = gj.dtype().into();
        let xj = B::float_empty(Shape::from(shape), &B::float_device(&gj), dtype);
        inner(xj, w.per_device()[j].clone(), gj, opts.clone())
    });
    fold_windows::<B>(grads, &plan.x, x_shape, &plan.halos)
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
    let plan = plan_of(&x.layout, &x.shape, &weight.shape, &options);
    let opts = local(&options, &plan);
    weight_gradient::<B>(&plan, x, weight, grad, |x, w, g| {
        inner(x, w, g, opts.clone())
    })
}

/// A weight gradient on `plan`: `inner` run per device on its window of `x` (its block where
/// `plan` has no halos), the weight and its block of `grad` (laid out as [`ConvPlan::out`]),
/// the results a pending sum over [`ConvPlan::sharded_axes`], reduce-scattered at once onto a
/// weight sharded over one of them.
fn weight_gradient<B: Backend>(
    plan: &ConvPlan,
    x: FT<B>,
    weight: FT<B>,
    grad: FT<B>,
    inner: impl Fn(P<B>, P<B>, P<B>) -> P<B> + Sync,
) -> FT<B> {
    let wl = weight.layout.clone();
    let w = replicated::<B>(weight, &plan.x);
    let g = execute::<B, FloatKind>(grad, &plan.out);
    let xs = execute::<B, FloatKind>(x, &plan.x);
    let per_device = if plan.halos.is_empty() {
        let zero = |r: &P<B>| B::float_zeros(r.shape(), &B::float_device(r), r.dtype().into());
        run_batch_with::<B, _>(&xs, false, zero, |j| {
            let (x, g) = (xs.per_device()[j].clone(), g.per_device()[j].clone());
            inner(x, w.per_device()[j].clone(), g)
        })
        .into_per_device()
    } else {
        let ext = windows::<B>(xs, &plan.halos, 0.0);
        run_positions::<B, _>(&ext, &[&plan.x, &plan.out], |j| {
            let (x, g) = (window::<B>(&ext, &plan.halos, j), g.per_device()[j].clone());
            inner(x, w.per_device()[j].clone(), g)
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

/// The options of the convolution a transposed convolution is the adjoint of
/// ([`crate::rules::conv::conv_transpose`]).
fn adjoint_options<const N: usize>(o: &ConvTransposeOptions<N>) -> ConvOptions<N> {
    ConvOptions::new(o.stride, o.padding, o.dilation, o.groups)
}

/// A transposed convolution (`conv_transpose2d`, `conv_transpose3d`): `x` `[batch, channels_in,
/// spatial...]` by a weight `[channels_in, channels_out / groups, kernel...]`, plus a bias
/// `[channels_out]`; output `[batch, channels_out, spatial_out...]` (global shapes), laid out as
/// `x` where [`conv_transpose`]'s plan keeps the spatial shards: the [`adjoint`] of the
/// convolution it transposes, `inner` the inner backend's `conv*_x_backward` of that convolution.
/// Elsewhere `batch`, the batch-parallel form, runs it.
pub(crate) fn transpose<B: Backend, const N: usize>(
    x: FT<B>,
    weight: FT<B>,
    bias: Option<FT<B>>,
    options: ConvTransposeOptions<N>,
    inner: impl Fn(P<B>, P<B>, P<B>, ConvOptions<N>) -> P<B> + Sync,
    batch: impl FnOnce(FT<B>, FT<B>, Option<FT<B>>, ConvTransposeOptions<N>) -> FT<B>,
) -> FT<B> {
    let o = &options;
    let Some((plan, shape)) = transpose_plan_of(&x, &weight, o) else {
        return batch(x, weight, bias, options);
    };
    super::common::same_mesh(&plan.out, &x.layout);
    let w = replicated::<B>(weight, &plan.x);
    let g = execute::<B, FloatKind>(x, &plan.out);
    let opts = local(&adjoint_options(o), &plan);
    let out = adjoint::<B, N>(&plan, &shape, &w, &g, opts, inner);
    let Some(b) = bias else { return out };
    // Added once the halo rows are folded in: `[channels_out]` as `[1, channels_out, 1...]`.
    type D<B> = DistributedBackend<B>;
    let mut dims = vec![1; shape.len()];
    dims[1] = shape[1];
    let b = D::<B>::float_reshape(replicated::<B>(b, &plan.x), dims.into());
    D::<B>::float_add(out, b)
}

/// A transposed convolution's weight gradient (the weight's global shape). On the plan of its
/// forward ([`conv_transpose`], from `x`'s layout: an output gradient that reaches it in another
/// layout, even replicated, is cut to the forward output's, never `x` gathered): the weight
/// gradient of the convolution it transposes, taken at the output gradient `grad` as that
/// convolution's input (its halos exchanged) and `x` as its output gradient, `conv_inner` the
/// inner backend's `conv*_weight_backward`. Where that plan does not apply, batch-parallel with
/// `inner`, the inner backend's `conv_transpose*_weight_backward`.
pub(crate) fn transpose_weight_backward<B: Backend, const N: usize>(
    x: FT<B>,
    weight: FT<B>,
    grad: FT<B>,
    options: ConvTransposeOptions<N>,
    conv_inner: impl Fn(P<B>, P<B>, P<B>, ConvOptions<N>) -> P<B> + Sync,
    inner: impl Fn(P<B>, P<B>, P<B>, ConvTransposeOptions<N>) -> P<B> + Sync,
) -> FT<B> {
    let o = &options;
    match transpose_plan_of(&x, &weight, o) {
        Some((plan, _)) => {
            let opts = local(&adjoint_options(o), &plan);
            weight_gradient::<B>(&plan, grad, weight, x, |g, w, x| {
                conv_inner(g, w, x, opts.clone())
            })
        }
        None => {
            let plan = batch(&x.layout, grad.shape.clone());
            weight_gradient::<B>(&plan, x, weight, grad, |x, w, g| inner(x, w, g, o.clone()))
        }
    }
}

/// A per-shard output with its batch cut to 0 (an empty batch shard, see [`run_batch_with`]).
fn empty_batch<B: Backend>(r: &P<B>) -> P<B> {
    narrow::<B>(r.clone(), 0, 0..0)
}
