//! Convolutions and their input and weight gradients, run per device on the plan of
//! [`crate::rules::conv`]: the batch and the spatial dims stay sharded, each device convolving
//! its block plus a halo from its neighbours (spatial parallelism); with no sharded spatial dim
//! the batch-parallel form ([`run_batch_with`]).
//!
//! **The halo exchange** of a spatial dim is one collective permute along its mesh axis
//! ([`collective_permute`], XLA's collective-permute): each block sends its last `left` rows to
//! its right neighbour and its first `right` rows to its left one, so a device receives
//! `left + right` rows whatever the axis size (an all-gather of the strips, the first
//! implementation, received `(parts - 1) × (left + right)`). Across processes only the pieces
//! between neighbouring processes cross, in one personalised exchange; values are moved, never
//! combined, so the exchange is bitwise the same on any process count. Each device's *window*
//! (the rows its output chunk reads, the padding's zeros included, the convolution then run
//! unpadded on that dim) is padded to the longest window, so windows of every device form a
//! tensor of even chunks and a second sharded spatial dim exchanges them in turn (its pieces
//! carry the first dim's halo rows: the corners). The input gradient is the adjoint: each
//! device's window gradient, the gradient of its halo rows sent back to the neighbours that own
//! them and added into their blocks, dims in reverse order.
//!
//! The weight and bias gradients are pending sums over every axis that shards the input, as a
//! linear layer's data-parallel gradient, reduce-scattered at once onto an FSDP-sharded weight
//! ([`weight_grads::settle_now`]).

use burn::tensor::backend::Backend;
use burn::tensor::ops::ConvOptions;
use burn::tensor::{Shape, Slice, TensorMetadata};

use super::dispatch::{run_batch_with, run_positions};
use super::weight_grads;
use crate::collective::generic::collective_permute;
use crate::layout::{Layout, ReduceOp};
use crate::redistribute::execute;
use crate::rules::conv::{ConvPlan, Halo, conv};
use crate::tensor::{DTensor, FloatKind, Kind};

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

/// The options each device runs with: no padding on a dim with a halo (its window holds the
/// padding's zeros where it reaches past the tensor).
fn local<const N: usize>(o: &ConvOptions<N>, plan: &ConvPlan) -> ConvOptions<N> {
    let mut o = o.clone();
    for h in &plan.halos {
        o.padding[h.dim - 2] = 0;
    }
    o
}

/// `t` replicated on `x`'s mesh (a weight or bias; operands on another mesh refused).
fn replicated<B: Backend>(t: FT<B>, x: &Layout) -> FT<B> {
    super::common::prep::<B, FloatKind>(t, x, false)
}

fn narrow<B: Backend>(t: P<B>, dim: usize, r: std::ops::Range<usize>) -> P<B> {
    <FloatKind as Kind<B>>::narrow(t, dim, r)
}

/// Zeros shaped as `like` but `rows` long on `dim`, pushed onto `v` (none for 0 rows: no
/// device allocates or launches for an empty piece).
fn zeros<B: Backend>(v: &mut Vec<P<B>>, like: &P<B>, dim: usize, rows: usize) {
    if rows > 0 {
        let mut s = like.shape();
        s[dim] = rows;
        v.push(B::float_zeros(
            s,
            &B::float_device(like),
            like.dtype().into(),
        ));
    }
}

/// The pieces concatenated along `dim` (empty ones skipped).
fn cat<B: Backend>(parts: Vec<P<B>>, dim: usize) -> P<B> {
    <FloatKind as Kind<B>>::cat(parts, dim)
}

/// `t` with `v` added into its rows `r` of `dim`.
fn add_rows<B: Backend>(t: P<B>, dim: usize, r: std::ops::Range<usize>, v: P<B>) -> P<B> {
    let mut s = vec![Slice::full(); t.shape().num_dims()];
    s[dim] = Slice::new(r.start as isize, Some(r.end as isize), 1);
    let cur = B::float_slice(t.clone(), &s);
    B::float_slice_assign(t, &s, B::float_add(cur, v))
}

/// The coordinate along `h`'s axis of this process's `j`-th position.
fn coord_of(t: &Layout, h: &Halo, j: usize) -> usize {
    t.mesh.coord(t.mesh.global(j), h.axis)
}

/// Per device, the pieces received from its left and its right neighbour ([`exchange`]).
type Received<B> = Vec<(Option<P<B>>, Option<P<B>>)>;

/// The piece a device sends a neighbour, from its coordinate on the axis and its shard.
type Piece<'a, B> = &'a dyn Fn(usize, &P<B>) -> P<B>;

/// The halo exchange along `h`'s axis: every device sends `to_right(c, shard)` to its right
/// neighbour and `to_left(c, shard)` to its left one (`None`: that direction carries no rows),
/// in one collective permute. Returns, per device, what came from its left and from its right
/// neighbour (`None` at the axis' ends and for a direction that carries nothing).
fn exchange<B: Backend>(
    t: &FT<B>,
    h: &Halo,
    to_right: Option<Piece<'_, B>>,
    to_left: Option<Piece<'_, B>>,
) -> Received<B> {
    let pieces = |f: Piece<'_, B>| -> Vec<P<B>> {
        (t.per_device().iter().enumerate())
            .map(|(j, p)| f(coord_of(&t.layout, h, j), p))
            .collect()
    };
    let (mut sends, mut shifts) = (Vec::new(), Vec::new());
    for (f, shift) in [(to_right, 1), (to_left, -1)] {
        if let Some(f) = f {
            sends.push(pieces(f));
            shifts.push(shift);
        }
    }
    // Logged as the pieces' global shape: each device's pieces side by side on `h.dim`.
    let mut shape = t.shape.clone();
    shape[h.dim] = h.parts()
        * sends
            .iter()
            .map(|v| v.first().map_or(0, |p| p.shape()[h.dim]))
            .sum::<usize>();
    let mut got =
        collective_permute::<B, FloatKind>(&sends, &t.layout.mesh, h.axis, &shifts, &shape)
            .into_iter();
    let n = t.per_device().len();
    let mut take = |present: bool| {
        if present {
            got.next().expect("one result per shift")
        } else {
            vec![None; n]
        }
    };
    let from_left = take(to_right.is_some());
    let from_right = take(to_left.is_some());
    from_left.into_iter().zip(from_right).collect()
}

/// `x` (blocks on `h.dim`) as every device's window on it, padded to [`Halo::padded`] rows:
/// `[parts × padded]` rows of even chunks, on `x`'s layout.
fn extend<B: Backend>(x: FT<B>, h: &Halo) -> FT<B> {
    let (d, l, r) = (h.dim, h.left, h.right);
    // Each block's last `l` rows go right (its right neighbour's left halo), its first `r` rows
    // left (its left neighbour's right halo).
    let last = |c: usize, p: &P<B>| {
        let n = h.block(c).len();
        narrow::<B>(p.clone(), d, n - l..n)
    };
    let first = |_: usize, p: &P<B>| narrow::<B>(p.clone(), d, 0..r);
    let halos = exchange::<B>(&x, h, (l > 0).then_some(&last), (r > 0).then_some(&first));
    let padded = h.padded();
    let windows: Vec<P<B>> = (x.per_device().iter().enumerate())
        .map(|(j, p)| {
            let c = coord_of(&x.layout, h, j);
            let [above, from_left, own, from_right, below] = h.pieces(c);
            let b = h.block(c);
            let mut v = Vec::new();
            zeros::<B>(&mut v, p, d, above.len());
            if !from_left.is_empty() {
                // The left neighbour's last `l` rows are global rows `b.start - l..b.start`.
                let at = from_left.start + l - b.start;
                let g = halos[j].0.clone().expect("a left halo received");
                v.push(narrow::<B>(g, d, at..at + from_left.len()));
            }
            v.push(narrow::<B>(
                p.clone(),
                d,
                own.start - b.start..own.end - b.start,
            ));
            if !from_right.is_empty() {
                // The right neighbour's first `r` rows are global rows `b.end..b.end + r`.
                let at = from_right.start - b.end;
                let g = halos[j].1.clone().expect("a right halo received");
                v.push(narrow::<B>(g, d, at..at + from_right.len()));
            }
            zeros::<B>(&mut v, p, d, below.len() + padded - h.window_len(c));
            cat::<B>(v, d)
        })
        .collect();
    let mut shape = x.shape.clone();
    shape[d] = h.parts() * padded;
    DTensor::from_parts(shape, x.layout.clone(), windows)
}

/// The adjoint of [`extend`]: `g`, every device's gradient of its padded window on `h.dim`,
/// summed back onto the blocks (`[input]` rows, the layout kept).
fn fold_back<B: Backend>(g: FT<B>, h: &Halo) -> FT<B> {
    let (d, l, r) = (h.dim, h.left, h.right);
    // Where each piece sits in a window: after the zeros above it.
    let offsets = |c: usize| {
        let [above, from_left, own, ..] = h.pieces(c);
        let o = above.len() + from_left.len();
        (above.len(), o, o + own.len())
    };
    // To the left neighbour: the gradient of its last `l` rows; to the right one: of its
    // first `r` rows (zeros where this device's window did not read them).
    let to_left = |c: usize, p: &P<B>| {
        let [_, from_left, ..] = h.pieces(c);
        let (b, (top, _, _)) = (h.block(c), offsets(c));
        let mut v = Vec::new();
        if from_left.is_empty() {
            zeros::<B>(&mut v, p, d, l);
        } else {
            zeros::<B>(&mut v, p, d, from_left.start + l - b.start);
            v.push(narrow::<B>(p.clone(), d, top..top + from_left.len()));
            zeros::<B>(&mut v, p, d, b.start - from_left.end);
        }
        cat::<B>(v, d)
    };
    let to_right = |c: usize, p: &P<B>| {
        let [_, _, _, from_right, _] = h.pieces(c);
        let (b, (_, _, after_own)) = (h.block(c), offsets(c));
        let mut v = Vec::new();
        if from_right.is_empty() {
            zeros::<B>(&mut v, p, d, r);
        } else {
            zeros::<B>(&mut v, p, d, from_right.start - b.end);
            v.push(narrow::<B>(
                p.clone(),
                d,
                after_own..after_own + from_right.len(),
            ));
            zeros::<B>(&mut v, p, d, b.end + r - from_right.end);
        }
        cat::<B>(v, d)
    };
    let halos = exchange::<B>(
        &g,
        h,
        (r > 0).then_some(&to_right),
        (l > 0).then_some(&to_left),
    );
    let blocks: Vec<P<B>> = (g.per_device().iter().enumerate())
        .map(|(j, p)| {
            let c = coord_of(&g.layout, h, j);
            let [_, _, own, _, _] = h.pieces(c);
            let b = h.block(c);
            let (_, at, _) = offsets(c);
            let mut v = Vec::new();
            zeros::<B>(&mut v, p, d, own.start - b.start);
            v.push(narrow::<B>(p.clone(), d, at..at + own.len()));
            zeros::<B>(&mut v, p, d, b.end - own.end);
            let mut t = cat::<B>(v, d);
            let n = b.len();
            // From the right neighbour, the gradient of this block's last `l` rows; from the
            // left one, of its first `r`.
            if let Some(s) = halos[j].1.clone() {
                t = add_rows::<B>(t, d, n - l..n, s);
            }
            if let Some(s) = halos[j].0.clone() {
                t = add_rows::<B>(t, d, 0..r, s);
            }
            t
        })
        .collect();
    let mut shape = g.shape.clone();
    shape[d] = h.input;
    DTensor::from_parts(shape, g.layout.clone(), blocks)
}

/// Device `j`'s window of `t` (padded windows on every halo dim) cut to its own length.
fn window<B: Backend>(t: &FT<B>, plan: &ConvPlan, j: usize) -> P<B> {
    plan.halos.iter().fold(t.per_device()[j].clone(), |p, h| {
        narrow::<B>(p, h.dim, 0..h.window_len(coord_of(&t.layout, h, j)))
    })
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
    let ext = plan.halos.iter().fold(xs, |t, h| extend::<B>(t, h));
    let opts = local(&options, &plan);
    let out = run_positions::<B, _>(&ext, &[&plan.x], |j| {
        inner(
            window::<B>(&ext, &plan, j),
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
    let (x_shape, mesh) = (x.shape.clone(), x.layout.mesh.clone());
    drop(x);
    let opts = local(&options, &plan);
    let windows = run_positions::<B, _>(&g, &[&plan.x, &plan.out], |j| {
        let gj = g.per_device()[j].clone();
        let mut shape = plan.x.shard_shape(&x_shape, mesh.global(j));
        for h in &plan.halos {
            shape[h.dim] = h.window_len(coord_of(&plan.x, h, j));
        }
        let dtype = gj.dtype().into();
        let xj = B::float_empty(Shape::from(shape), &B::float_device(&gj), dtype);
        let dx = inner(xj, w.per_device()[j].clone(), gj, opts.clone());
        plan.halos.iter().fold(dx, |t, h| {
            let (mut v, like) = (vec![t.clone()], t);
            let pad = h.padded() - h.window_len(coord_of(&plan.x, h, j));
            zeros::<B>(&mut v, &like, h.dim, pad);
            cat::<B>(v, h.dim)
        })
    });
    let mut shape = x_shape;
    for h in &plan.halos {
        shape[h.dim] = h.parts() * h.padded();
    }
    let t = DTensor::from_parts(shape, plan.x.clone(), windows);
    plan.halos.iter().rev().fold(t, |t, h| fold_back::<B>(t, h))
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
        let ext = plan.halos.iter().fold(xs, |t, h| extend::<B>(t, h));
        let opts = local(&options, &plan);
        run_positions::<B, _>(&ext, &[&plan.x, &plan.out], |j| {
            let (x, g) = (window::<B>(&ext, &plan, j), g.per_device()[j].clone());
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
