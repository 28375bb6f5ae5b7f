//! 2-D pools (`avg_pool2d`, `max_pool2d`, `max_pool2d_with_indices`) and their backward passes
//! with the spatial dims kept sharded, on the plan of [`crate::rules::conv::pool`]: each device
//! pools its window (its block plus the halo rows its output reads, [`super::halo`]), run
//! unpadded on the dims with a halo, the window's rows outside the tensor filled with the
//! pool's padding value (`-inf` for a max pool, which never picks one; zeros for an average pool
//! that counts the padding in its divisor). The channel dim keeps its sharding too. Where the
//! plan does not apply (`None`), `ops/module.rs` runs the batch-parallel form.
//!
//! **Indices.** `max_pool2d_with_indices` returns, as the inner backend does on the whole
//! tensor, each maximum's flat index `row * width + column` in the *global* input plane: a
//! device's index into its window (`r * w + c`, `w` its window's width) becomes
//! `(r + row0) * width + (c + col0)` with `(row0, col0)` its window's first global position,
//! and the backward pass maps it back before the inner backend scatters the gradient into the
//! window.
//!
//! **The global average pool** (`adaptive_avg_pool2d` to `[1, 1]`, [`global_average`]) needs no
//! halo: each device averages its block over the global count, a pending sum.

use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{Shape, TensorMetadata};

use super::dispatch::run_positions;
use super::halo::{coord_of, fold_windows, window, window_shape, windows};
use crate::backend::DistributedBackend;
use crate::redistribute::execute;
use crate::rules::conv::ConvPlan;
use crate::tensor::{DTensor, FloatKind, IntKind};

type FT<B> = DTensor<FloatTensor<B>>;
type IT<B> = DTensor<IntTensor<B>>;

/// A 2-D pool's geometry: `[kernel, stride, padding, dilation]`, each `[height, width]`
/// (dilation 1 for an average pool).
pub(crate) type Geometry = [[usize; 2]; 4];

/// The plan of a pool of `x` ([`crate::rules::conv::pool`]).
pub(crate) fn plan<B: Backend>(
    x: &FT<B>,
    g: Geometry,
    ceil_mode: bool,
    counts_padding: bool,
) -> Option<ConvPlan> {
    crate::rules::conv::pool(&x.layout, &x.shape, g, ceil_mode, counts_padding)
}

/// Runs `f(window, local padding)` on every device's window of `x` (rows outside the tensor
/// filled with `pad`) and returns each addressable position's result.
fn on_windows<B: Backend, R: Clone + Send>(
    x: FT<B>,
    plan: &ConvPlan,
    (padding, pad): ([usize; 2], f64),
    f: impl Fn(FloatTensor<B>, [usize; 2]) -> R + Sync,
) -> Vec<R> {
    let xs = execute::<B, FloatKind>(x, &plan.x);
    let ext = windows::<B>(xs, &plan.halos, pad);
    let p = plan.local_padding(padding);
    run_positions::<B, _>(&ext, &[&plan.x], |j| {
        f(window::<B>(&ext, &plan.halos, j), p)
    })
}

/// A pool's output (`[batch, channels, height_out, width_out]`, laid out as [`ConvPlan::out`]):
/// `inner(window, local padding)` on every device's window; `pad` fills the window's rows
/// outside the tensor.
pub(crate) fn forward<B: Backend>(
    x: FT<B>,
    plan: &ConvPlan,
    padding: [usize; 2],
    pad: f64,
    inner: impl Fn(FloatTensor<B>, [usize; 2]) -> FloatTensor<B> + Sync,
) -> FT<B> {
    let out = on_windows::<B, _>(x, plan, (padding, pad), inner);
    DTensor::from_parts(plan.out_shape.clone(), plan.out.clone(), out)
}

/// `max_pool2d_with_indices` on windows: the output and the global flat indices (module docs),
/// both laid out as [`ConvPlan::out`].
pub(crate) fn max_with_indices<B: Backend>(
    x: FT<B>,
    plan: &ConvPlan,
    [k, s, p, d]: Geometry,
) -> (FT<B>, IT<B>) {
    let x_shape = x.shape.clone();
    let both = on_windows::<B, _>(x, plan, (p, f64::NEG_INFINITY), |w, p| {
        let r = B::max_pool2d_with_indices(w, k, s, p, d, false);
        (r.output, r.indices)
    });
    let (out, idx): (Vec<_>, Vec<_>) = both
        .into_iter()
        .enumerate()
        .map(|(j, (o, i))| (o, to_global::<B>(i, plan, &x_shape, j)))
        .unzip();
    (
        DTensor::from_parts(plan.out_shape.clone(), plan.out.clone(), out),
        DTensor::from_parts(plan.out_shape.clone(), plan.out.clone(), idx),
    )
}

/// The input gradient of a pool run on windows (`[batch, channels, height, width]` in `x`'s
/// planned layout): `inner(window-shaped zeros, the output gradient's shard, j)` is the inner
/// backend's gradient of device `j`'s window (Burn's pool backward passes read the input's
/// shape, never its values), summed back onto the blocks ([`fold_windows`]).
fn backward<B: Backend>(
    x: FT<B>,
    grad: FT<B>,
    plan: &ConvPlan,
    inner: impl Fn(FloatTensor<B>, FloatTensor<B>, usize) -> FloatTensor<B> + Sync,
) -> FT<B> {
    let x_shape = x.shape.clone();
    drop(x);
    let g = execute::<B, FloatKind>(grad, &plan.out);
    let grads = run_positions::<B, _>(&g, &[&plan.x, &plan.out], |j| {
        let gj = g.per_device()[j].clone();
        let shape = Shape::from(window_shape(&plan.x, &x_shape, &plan.halos, j));
        let xj = B::float_zeros(shape, &B::float_device(&gj), gj.dtype().into());
        inner(xj, gj, j)
    });
    fold_windows::<B>(grads, &plan.x, &x_shape, &plan.halos)
}

/// Device `j`'s window origin `(row0, col0)` in the global plane and its width, with the
/// global width: the terms of the index maps (module docs).
fn origin(plan: &ConvPlan, x_shape: &[usize], j: usize) -> ([i64; 2], i64, i64) {
    let mut start = [0i64; 2];
    let mut len = [x_shape[2] as i64, x_shape[3] as i64];
    for h in &plan.halos {
        let c = coord_of(&plan.x, h, j);
        start[h.dim - 2] = h.window(c).start as i64;
        len[h.dim - 2] = h.window_len(c) as i64;
    }
    (start, len[1], x_shape[3] as i64)
}

/// Flat plane indices `i` of rows `from` wide as indices of rows `to` wide, moved by `shift`:
/// `(i / from) * to + i % from + shift` (`i + shift` when the widths agree).
fn remap<B: Backend>(i: IntTensor<B>, from: i64, to: i64, shift: i64) -> IntTensor<B> {
    if from == to {
        return B::int_add_scalar(i, shift.into());
    }
    let rows = B::int_mul_scalar(B::int_div_scalar(i.clone(), from.into()), to.into());
    let cols = B::int_remainder_scalar(i, from.into());
    B::int_add_scalar(B::int_add(rows, cols), shift.into())
}

/// Device `j`'s window indices as global ones: `(i / w + row0) * width + i % w + col0`.
fn to_global<B: Backend>(
    i: IntTensor<B>,
    plan: &ConvPlan,
    x_shape: &[usize],
    j: usize,
) -> IntTensor<B> {
    let ([r0, c0], w, width) = origin(plan, x_shape, j);
    remap::<B>(i, w, width, r0 * width + c0)
}

/// The inverse of [`to_global`]: `(g / width - row0) * w + g % width - col0`.
fn to_local<B: Backend>(
    g: IntTensor<B>,
    plan: &ConvPlan,
    x_shape: &[usize],
    j: usize,
) -> IntTensor<B> {
    let ([r0, c0], w, width) = origin(plan, x_shape, j);
    remap::<B>(g, width, w, -(r0 * w + c0))
}

/// `max_pool2d_with_indices_backward` on windows: the output gradient and the global indices
/// brought to [`ConvPlan::out`], each device's indices mapped into its window.
pub(crate) fn max_backward<B: Backend>(
    x: FT<B>,
    plan: &ConvPlan,
    [k, s, p, d]: Geometry,
    grad: FT<B>,
    indices: IT<B>,
) -> FT<B> {
    let x_shape = x.shape.clone();
    let ix = execute::<B, IntKind>(indices, &plan.out);
    let p = plan.local_padding(p);
    backward::<B>(x, grad, plan, |xj, gj, j| {
        let i = to_local::<B>(ix.per_device()[j].clone(), plan, &x_shape, j);
        B::max_pool2d_with_indices_backward(xj, k, s, p, d, false, gj, i).x_grad
    })
}

/// `avg_pool2d_backward` on windows (`dilation` unused: 1).
pub(crate) fn avg_backward<B: Backend>(
    x: FT<B>,
    grad: FT<B>,
    plan: &ConvPlan,
    [k, s, p, _]: Geometry,
    count_include_pad: bool,
) -> FT<B> {
    let p = plan.local_padding(p);
    backward::<B>(x, grad, plan, |xj, gj, _| {
        B::avg_pool2d_backward(xj, gj, k, s, p, count_include_pad, false)
    })
}

/// A global average pool (`adaptive_avg_pool2d` to `[1, 1]`) of `x` `[batch, channels, height,
/// width]` with its height or width sharded ([`crate::rules::conv::global_average`]): the mean
/// over the width, then over the height, each per shard over the global count, so the output
/// `[batch, channels, 1, 1]` is a pending sum over the axes that sharded them (`float_mean_dim`'s
/// rule), its batch and channels as `x`'s.
pub(crate) fn global_average<B: Backend>(x: FT<B>) -> FT<B> {
    use burn::tensor::ops::FloatTensorOps;
    type D<B> = DistributedBackend<B>;
    D::<B>::float_mean_dim(D::<B>::float_mean_dim(x, 3), 2)
}

/// The input gradient of [`global_average`] (`[batch, channels, height, width]`, laid out as `x`
/// without pending sums): `grad` (`[batch, channels, 1, 1]`) divided by `height × width` and
/// expanded over each device's own block; only `x`'s shape and layout are read.
pub(crate) fn global_average_backward<B: Backend>(x: FT<B>, grad: FT<B>) -> FT<B> {
    let xl = x.layout.without_partial();
    let mut gl = xl.clone();
    (gl.dims[2], gl.dims[3]) = (None, None);
    let g = execute::<B, FloatKind>(grad, &gl);
    let shape = x.shape.clone();
    drop(x);
    let count = (shape[2] * shape[3]) as f64;
    let per_device = run_positions::<B, _>(&g, &[&xl], |j| {
        let block = xl.shard_shape(&shape, xl.mesh.global(j));
        let gj = B::float_div_scalar(g.per_device()[j].clone(), count.into());
        B::float_expand(gj, Shape::from(block))
    });
    DTensor::from_parts(shape, xl, per_device)
}
