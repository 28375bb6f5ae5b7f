//! `ModuleOps` for the decorator. `embedding` and its backward have their own rule (the ids'
//! sharding carried to the output). `linear` and its backward are Burn's default formulas with
//! the weight kept where the layout map put it (`Keep::Weight` in `rules/matmul.rs`: Megatron's
//! stationary weights; a plain matmul would be free to gather the weight instead). The
//! convolutions (`conv1d` through `conv2d`, as Burn's default; `conv2d`, `conv3d`) and their
//! input, weight and bias gradients run on `ops/conv.rs` (`rules/conv.rs`: batch and spatial
//! dims kept sharded, halos exchanged between neighbours, `ops/halo.rs`); the transposed
//! convolutions and their weight and bias gradients too, as the convolution's adjoint
//! (`rules::conv::conv_transpose`; their input gradient is Burn's default, a convolution); the
//! global average pool (`adaptive_avg_pool2d` to `[1, 1]`, a pending sum) and the 2-D pools and
//! their backward passes on `ops/pool.rs` (`rules/conv.rs::pool`: the same halos, channels
//! kept sharded) where its plan applies. `layer_norm` and the 1-D pools (through the 2-D ones) are
//! Burn's defaults built on the float primitives (so they inherit the efficient rules); the
//! other ops below are required by Burn and run batch-parallel (input sharded on dim 0, weights
//! replicated) or, for the rare ones, through the gather fallback.

use burn::tensor::TensorMetadata;
use burn::tensor::backend::Backend;
use burn::tensor::ops::{
    AttentionModuleOptions, BoolTensor, ConvOptions, ConvTransposeOptions, DeformConv2dBackward,
    DeformConvOptions, FloatTensor, FloatTensorOps, IntTensor, InterpolateOptions,
    MaxPool2dBackward, MaxPool2dWithIndices, ModuleOps, UnfoldOptions,
};

use super::common::{self as c, prep};
use super::conv;
use super::dispatch::{is_solo, only, run_batch_with, run2, solo_map};
use super::pool;
use super::weight_grads;
use crate::backend::DistributedBackend;
use crate::layout::Layout;
use crate::redistribute::{execute, redistribute};
use crate::rules::conv::global_average;
use crate::rules::matmul::Keep;
use crate::rules::module;
use crate::stack::At;
use crate::tensor::{BoolKind, DTensor, FloatKind, IntKind, Kind};

type FT<B> = DTensor<<B as burn::tensor::backend::BackendTypes>::FloatTensorPrimitive>;

/// [`run_batch_with`] for float outputs.
fn run_batch<B: Backend>(
    x: &FT<B>,
    batched_out: bool,
    f: impl Fn(usize) -> B::FloatTensorPrimitive + Sync,
) -> FT<B> {
    run_batch_with::<B, _>(x, batched_out, empty_batch::<B, FloatKind>, f)
}

/// A float op of `x` alone, batch-parallel ([`prep`], [`run_batch`]): `f` gets each device's
/// shard of `x` (its chunk of the batch, all else whole) and returns that device's output.
fn batch_map<B: Backend>(
    x: FT<B>,
    f: impl Fn(B::FloatTensorPrimitive) -> B::FloatTensorPrimitive + Sync,
) -> FT<B> {
    let xl = x.layout.clone();
    let xs = prep::<B, FloatKind>(x, &xl, true);
    run_batch::<B>(&xs, true, |i| f(xs.per_device()[i].clone()))
}

/// [`batch_map`] for a backward pass: `f` gets each device's shards of `x` and of the output
/// gradient `grad` (laid out as `x`) and returns that device's input gradient.
fn batch_map_grad<B: Backend>(
    x: FT<B>,
    grad: FT<B>,
    f: impl Fn(B::FloatTensorPrimitive, B::FloatTensorPrimitive) -> B::FloatTensorPrimitive + Sync,
) -> FT<B> {
    let xl = x.layout.clone();
    let xs = prep::<B, FloatKind>(x, &xl, true);
    let g = prep::<B, FloatKind>(grad, &xl, true);
    run_batch::<B>(&xs, true, |i| {
        f(xs.per_device()[i].clone(), g.per_device()[i].clone())
    })
}

/// A per-shard output of kind `K` with its dim 0 cut to 0 (see [`run_batch`]).
fn empty_batch<B: Backend, K: Kind<B>>(r: &K::P) -> K::P {
    K::narrow(r.clone(), 0, 0..0)
}

/// `t` with size-1 dims prepended up to `rank` (Burn's `unsqueeze_leading` in its default
/// `linear`): a weight `[d_in, d_out]` broadcast over the batch dims of a matmul.
fn lead<B: Backend>(t: FT<B>, rank: usize) -> FT<B> {
    let n = t.shape.len();
    if n >= rank {
        return t;
    }
    let mut dims = vec![1; rank - n];
    dims.extend_from_slice(&t.shape);
    DistributedBackend::<B>::float_reshape(t, dims.into())
}

fn opt<B: Backend>(t: Option<FT<B>>, x: &Layout) -> Option<FT<B>> {
    t.map(|t| prep::<B, FloatKind>(t, x, false))
}

/// `t` relaid out to `to`, keeping its form (stacked or per device); `to` comes from a rule,
/// so a mesh or rank mismatch is an internal bug.
fn relayout<B: Backend>(t: FT<B>, to: &Layout) -> FT<B> {
    redistribute::<B, FloatKind>(t, to).unwrap_or_else(|e| panic!("burn-dtensor: {e}"))
}

/// `g`, a weight's gradient, with its pending sums over the axes that shard the weight (laid
/// out as `w`) reduce-scattered onto it now ([`weight_grads::settle_now`]); else as it is.
fn settle_now<B: Backend>(g: FT<B>, w: Option<&Layout>) -> FT<B> {
    match w.and_then(|w| weight_grads::settle_now(&g.layout, w)) {
        Some(to) => relayout::<B>(g, &to),
        None => g,
    }
}

/// For a vocabulary-parallel table (dim 0 sharded in `table`), the rows `lo..hi` a device
/// holds; `None` for a table whose vocabulary is whole.
fn vocab_rows(table: &Layout, shape: &[usize]) -> impl Fn(At) -> Option<(usize, usize)> + use<> {
    let sharded = table.dims[0].is_some();
    let rows = c::rows_of(table, shape, 0);
    move |at| {
        sharded.then(|| {
            let r = rows(at);
            (r.start, r.end)
        })
    }
}

/// `t` `[b, s, d]` with the rows where `outside` `[b, s]` is true set to the sum's identity
/// (`-0.0`, [`Kind::identity_where`]): the members of a pending sum that hold none of a row.
fn zero_rows<B: Backend>(t: FloatTensor<B>, outside: BoolTensor<B>) -> FloatTensor<B> {
    let [b, s, d] = t.shape().dims();
    let mask = B::bool_expand(B::bool_reshape(outside, [b, s, 1].into()), [b, s, d].into());
    <FloatKind as Kind<B>>::identity_where(t, mask)
}

/// A transposed convolution batch-parallel: `x`'s batch shards by the replicated weight and
/// bias, `inner` the inner backend's `conv_transpose*` (where [`conv::transpose`]'s plan does not
/// keep a spatial dim sharded).
fn batch_conv_transpose<B: Backend, const N: usize>(
    x: FT<B>,
    weight: FT<B>,
    bias: Option<FT<B>>,
    options: ConvTransposeOptions<N>,
    inner: impl Fn(
        B::FloatTensorPrimitive,
        B::FloatTensorPrimitive,
        Option<B::FloatTensorPrimitive>,
        ConvTransposeOptions<N>,
    ) -> B::FloatTensorPrimitive
    + Sync,
) -> FT<B> {
    let xl = x.layout.clone();
    let xs = prep::<B, FloatKind>(x, &xl, true);
    let w = prep::<B, FloatKind>(weight, &xl, false);
    let b = opt::<B>(bias, &xl);
    run_batch::<B>(&xs, true, |i| {
        inner(
            xs.per_device()[i].clone(),
            w.per_device()[i].clone(),
            b.as_ref().map(|b| b.per_device()[i].clone()),
            options.clone(),
        )
    })
}

/// The transposed convolutions of one rank through `ops/conv.rs` (the rule
/// `rules::conv::conv_transpose`: the adjoint of a convolution, batch and spatial dims kept
/// sharded, halo rows folded back to their owners); their input gradient is Burn's default, a
/// convolution (so `conv*` above, with its halos).
macro_rules! conv_transpose_ops {
    ($n:literal: $fwd:ident, $dw:ident, $db:ident; $conv_dx:ident, $conv_dw:ident) => {
        /// `[batch, channels_in, spatial...]` by `[channels_in, channels_out / groups,
        /// kernel...]` (global shapes), per device on its block, the halo rows of its output
        /// window folded back onto their owners (`rules/conv.rs`).
        fn $fwd(
            x: FloatTensor<Self>,
            weight: FloatTensor<Self>,
            bias: Option<FloatTensor<Self>>,
            options: ConvTransposeOptions<$n>,
        ) -> FloatTensor<Self> {
            conv::transpose::<B, $n>(x, weight, bias, options, B::$conv_dx, |x, w, b, o| {
                batch_conv_transpose::<B, $n>(x, w, b, o, B::$fwd)
            })
        }
        fn $dw(
            x: FloatTensor<Self>,
            weight: FloatTensor<Self>,
            output_grad: FloatTensor<Self>,
            options: ConvTransposeOptions<$n>,
        ) -> FloatTensor<Self> {
            conv::transpose_weight_backward::<B, $n>(
                x,
                weight,
                output_grad,
                options,
                B::$conv_dw,
                B::$dw,
            )
        }
        bias_backward!($db);
    };
}

/// A convolution's (or transposed convolution's) `*_bias_backward`: [`bias_gradient`].
macro_rules! bias_backward {
    ($db:ident) => {
        fn $db(
            _x: FloatTensor<Self>,
            bias: FloatTensor<Self>,
            output_grad: FloatTensor<Self>,
        ) -> FloatTensor<Self> {
            bias_gradient::<B>(&bias, output_grad)
        }
    };
}

/// The convolutions of one rank and their gradients through `ops/conv.rs` (the rule
/// `rules::conv`: batch and spatial dims kept sharded, halos exchanged).
macro_rules! conv_ops {
    ($n:literal: $fwd:ident, $dx:ident, $dw:ident, $db:ident) => {
        /// `[batch, channels_in, spatial...]` by `[channels_out, channels_in / groups,
        /// kernel...]` (global shapes), per device on its block and halo (`rules/conv.rs`).
        fn $fwd(
            x: FloatTensor<Self>,
            weight: FloatTensor<Self>,
            bias: Option<FloatTensor<Self>>,
            options: ConvOptions<$n>,
        ) -> FloatTensor<Self> {
            conv::forward::<B, $n>(x, weight, bias, options, B::$fwd)
        }
        fn $dx(
            x: FloatTensor<Self>,
            weight: FloatTensor<Self>,
            output_grad: FloatTensor<Self>,
            options: ConvOptions<$n>,
        ) -> FloatTensor<Self> {
            conv::x_backward::<B, $n>(x, weight, output_grad, options, B::$dx)
        }
        fn $dw(
            x: FloatTensor<Self>,
            weight: FloatTensor<Self>,
            output_grad: FloatTensor<Self>,
            options: ConvOptions<$n>,
        ) -> FloatTensor<Self> {
            conv::weight_backward::<B, $n>(x, weight, output_grad, options, B::$dw)
        }
        bias_backward!($db);
    };
}

/// A convolution's bias gradient `[channels_out]`: the output gradient
/// `[batch, channels_out, spatial...]` summed over every dim but the channels (a pending sum
/// over the axes sharding them, as any sum of a sharded dim).
fn bias_gradient<B: Backend>(bias: &FT<B>, output_grad: FT<B>) -> FT<B> {
    type D<B> = DistributedBackend<B>;
    let r = output_grad.shape.len();
    let g = (2..r).rev().fold(output_grad, D::<B>::float_sum_dim);
    D::<B>::float_reshape(D::<B>::float_sum_dim(g, 0), bias.shape.clone().into())
}

/// A 1-D convolution's operand `[a, b, length]` as `[a, b, length, 1]` (Burn's
/// `conv1d_from_conv2d`).
fn as_2d<B: Backend>(t: FT<B>) -> FT<B> {
    let mut dims = t.shape.clone();
    dims.push(1);
    DistributedBackend::<B>::float_reshape(t, dims.into())
}

/// A 1-D convolution's (or transposed convolution's) weight gradient as the 2-D one `f` (with
/// the 2-D `options`) of its operands as [`as_2d`], reshaped back to the weight's shape `[a, b,
/// kernel]`: a sharded length keeps its halo form.
fn weight_grad_as_2d<B: Backend, O>(
    x: FT<B>,
    weight: FT<B>,
    grad: FT<B>,
    options: O,
    f: impl FnOnce(FT<B>, FT<B>, FT<B>, O) -> FT<B>,
) -> FT<B> {
    let shape = weight.shape.clone();
    let dw = f(as_2d::<B>(x), as_2d::<B>(weight), as_2d::<B>(grad), options);
    DistributedBackend::<B>::float_reshape(dw, shape.into())
}

/// The 2-D options of a 1-D convolution run as [`as_2d`].
fn options_2d(o: &ConvOptions<1>) -> ConvOptions<2> {
    ConvOptions::new(
        [o.stride[0], 1],
        [o.padding[0], 0],
        [o.dilation[0], 1],
        o.groups,
    )
}

/// The embedding table's gradient `[vocab, d]` of `output_grad` `[batch, seq, d]` (see
/// `embedding_backward`, which wraps it to settle from a pending gradient's settled value).
/// Only the table's layout and shape are used. With `settle`, a pending sum over an axis that
/// shards the table is reduce-scattered onto it at once (FSDP, see `ops/weight_grads.rs`).
fn table_gradient<B: Backend>(
    table: &Layout,
    shape: &[usize],
    output_grad: FT<B>,
    indices: IntTensor<DistributedBackend<B>>,
    settle: bool,
) -> FT<B> {
    let output_grad = c::settle_hinted::<B, FloatKind>(output_grad);
    let s = module::embedding_backward(
        table,
        shape,
        &output_grad.layout,
        &indices.layout,
        &indices.shape,
    );
    let rows = vocab_rows(&s.output, shape);
    let vocab = shape[0];
    let table_grad = run2::<B, FloatKind, IntKind, FloatKind>(
        output_grad,
        indices,
        &s,
        shape.to_vec(),
        false,
        |at, g, i| {
            let (n, d) = (rows(at).map_or(vocab, |(lo, hi)| hi - lo), g.shape()[2]);
            let table = B::float_empty([n, d].into(), &B::float_device(&g), g.dtype().into());
            match rows(at) {
                None => B::embedding_backward(table, g, i),
                Some((lo, hi)) => {
                    let (local, outside) = c::local_indices::<B>(i, lo..hi);
                    let g = zero_rows::<B>(g, outside);
                    if hi > lo {
                        B::embedding_backward(table, g, local)
                    } else {
                        table
                    }
                }
            }
        },
    );
    if settle {
        settle_now::<B>(table_grad, Some(table))
    } else {
        table_grad
    }
}

impl<B: Backend> ModuleOps<Self> for DistributedBackend<B> {
    /// `x @ W + b` (x `[..., d_in]`, weight `[d_in, d_out]`, bias `[d_out]`; output
    /// `[..., d_out]`, global shapes) as Burn's default, the matmul under `Keep::Weight`
    /// (`rules/matmul.rs`): where the input and the weight ask for the same mesh axis (a
    /// sequence-sharded input meeting a column-parallel weight), the input is redistributed and
    /// the weight stays.
    fn linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
    ) -> FloatTensor<Self> {
        let r = x.shape.len();
        weight_grads::note(x.id, &weight.layout);
        let out = c::matmul::<B, FloatKind, _>(
            x,
            lead::<B>(weight, r),
            c::shard_matmul::<B>,
            Keep::Weight,
        );
        match bias {
            Some(b) => Self::float_add(out, lead::<B>(b, r)),
            None => out,
        }
    }
    /// `g @ Wᵀ` (output gradient `[..., d_out]`, result `[..., d_in]`), the weight kept
    /// (`Keep::Weight` in `rules/matmul.rs`): a row-parallel weight's input gradient
    /// all-gathers a sequence-sharded `g`.
    fn linear_x_backward(
        weight: FloatTensor<Self>,
        output_grad: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let r = output_grad.shape.len();
        let wt = lead::<B>(Self::float_swap_dims(weight, 0, 1), r);
        c::matmul::<B, FloatKind, _>(output_grad, wt, c::shard_matmul::<B>, Keep::Weight)
    }
    /// `xᵀ @ g` summed over the batch dims (`[d_in, d_out]`), the output's dims kept
    /// (`Keep::Output` in `rules/matmul.rs`): the gradient comes out in the weight's own
    /// sharding and the activations move (a batch dim sharded on both sides leaves a pending
    /// sum). A pending sum over an axis that shards the weight is reduce-scattered onto it at
    /// once (FSDP's backward reduce-scatter, see `ops/weight_grads.rs`).
    fn linear_weight_backward(
        x: FloatTensor<Self>,
        output_grad: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let weight = weight_grads::weight_of(x.id);
        let (x, output_grad) = (
            c::settle_hinted::<B, FloatKind>(x),
            c::settle_hinted::<B, FloatKind>(output_grad),
        );
        let r = x.shape.len();
        // Redistribute `x` itself (not a fresh transposed copy) to what the matmul needs, so
        // that the query, key and value weight gradients of one input share one all-gather
        // (`redistribute`'s memo of the last gather is keyed by the tensor).
        let mut xt_shape = x.shape.clone();
        xt_shape.swap(r - 2, r - 1);
        let mut xt_layout = (*x.layout).clone();
        xt_layout.dims.swap(r - 2, r - 1);
        let want = crate::rules::matmul::matmul_memo(
            &xt_layout,
            &xt_shape,
            &output_grad.layout,
            &output_grad.shape,
            Keep::Output,
        );
        let mut lx = want.inputs[0].clone();
        lx.dims.swap(r - 2, r - 1);
        let x = relayout::<B>(x, &lx);
        let xt = Self::float_swap_dims(x, r - 2, r - 1);
        let mut g =
            c::matmul::<B, FloatKind, _>(xt, output_grad, c::shard_matmul::<B>, Keep::Output);
        for dim in 0..r.saturating_sub(2) {
            g = Self::float_sum_dim(g, dim);
        }
        if r > 2 {
            let (d0, d1) = (g.shape[r - 2], g.shape[r - 1]);
            g = Self::float_reshape(g, [d0, d1].into());
        }
        settle_now::<B>(g, weight.as_deref())
    }
    conv_ops!(2: conv2d, conv2d_x_backward, conv2d_weight_backward, conv2d_bias_backward);
    conv_ops!(3: conv3d, conv3d_x_backward, conv3d_weight_backward, conv3d_bias_backward);
    /// Burn's `conv1d_x_backward` as the 2-D one of `[batch, channels, length, 1]` (as its
    /// forward, `conv1d_from_conv2d`), so a sharded length keeps its halo form.
    fn conv1d_x_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        output_grad: FloatTensor<Self>,
        options: ConvOptions<1>,
    ) -> FloatTensor<Self> {
        let shape = x.shape.clone();
        let (x, w, g) = (as_2d::<B>(x), as_2d::<B>(weight), as_2d::<B>(output_grad));
        let dx = Self::conv2d_x_backward(x, w, g, options_2d(&options));
        Self::float_reshape(dx, shape.into())
    }
    /// As [`Self::conv1d_x_backward`], for the weight `[channels_out, channels_in, kernel]`.
    fn conv1d_weight_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        output_grad: FloatTensor<Self>,
        options: ConvOptions<1>,
    ) -> FloatTensor<Self> {
        let o = options_2d(&options);
        weight_grad_as_2d::<B, _>(x, weight, output_grad, o, Self::conv2d_weight_backward)
    }
    bias_backward!(conv1d_bias_backward);
    conv_transpose_ops!(2: conv_transpose2d, conv_transpose2d_weight_backward,
        conv_transpose2d_bias_backward; conv2d_x_backward, conv2d_weight_backward);
    conv_transpose_ops!(3: conv_transpose3d, conv_transpose3d_weight_backward,
        conv_transpose3d_bias_backward; conv3d_x_backward, conv3d_weight_backward);
    /// As [`Self::conv1d_weight_backward`], for a transposed convolution (Burn's
    /// `conv_transpose1d` runs as the 2-D one of `[batch, channels, length, 1]`).
    fn conv_transpose1d_weight_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        output_grad: FloatTensor<Self>,
        options: ConvTransposeOptions<1>,
    ) -> FloatTensor<Self> {
        let o = &options;
        let o = ConvTransposeOptions::new(
            [o.stride[0], 1],
            [o.padding[0], 0],
            [o.padding_out[0], 0],
            [o.dilation[0], 1],
            o.groups,
        );
        weight_grad_as_2d::<B, _>(
            x,
            weight,
            output_grad,
            o,
            Self::conv_transpose2d_weight_backward,
        )
    }
    bias_backward!(conv_transpose1d_bias_backward);

    fn deform_conv2d(
        x: FloatTensor<Self>,
        offset: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        mask: Option<FloatTensor<Self>>,
        bias: Option<FloatTensor<Self>>,
        options: DeformConvOptions<2>,
    ) -> FloatTensor<Self> {
        let xl = x.layout.clone();
        let xs = prep::<B, FloatKind>(x, &xl, true);
        let off = prep::<B, FloatKind>(offset, &xl, true);
        let m = mask.map(|m| prep::<B, FloatKind>(m, &xl, true));
        let w = prep::<B, FloatKind>(weight, &xl, false);
        let b = opt::<B>(bias, &xl);
        run_batch::<B>(&xs, true, |i| {
            B::deform_conv2d(
                xs.per_device()[i].clone(),
                off.per_device()[i].clone(),
                w.per_device()[i].clone(),
                m.as_ref().map(|m| m.per_device()[i].clone()),
                b.as_ref().map(|b| b.per_device()[i].clone()),
                options.clone(),
            )
        })
    }
    /// Gather fallback (rare): everything replicated, gradients replicated.
    fn deform_conv2d_backward(
        x: FloatTensor<Self>,
        offset: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        mask: Option<FloatTensor<Self>>,
        bias: Option<FloatTensor<Self>>,
        output_grad: FloatTensor<Self>,
        options: DeformConvOptions<2>,
    ) -> DeformConv2dBackward<Self> {
        let rep = |t: FT<B>| {
            let l = Layout::replicated_on(&t.layout.mesh, t.shape.len());
            execute::<B, FloatKind>(t, &l)
        };
        let (x, offset, weight, output_grad) = (rep(x), rep(offset), rep(weight), rep(output_grad));
        let mask = mask.map(rep);
        let bias = bias.map(rep);
        let n = x.per_device().len();
        let outs: Vec<DeformConv2dBackward<B>> = (0..n)
            .map(|i| {
                B::deform_conv2d_backward(
                    x.per_device()[i].clone(),
                    offset.per_device()[i].clone(),
                    weight.per_device()[i].clone(),
                    mask.as_ref().map(|m| m.per_device()[i].clone()),
                    bias.as_ref().map(|b| b.per_device()[i].clone()),
                    output_grad.per_device()[i].clone(),
                    options.clone(),
                )
            })
            .collect();
        let mesh = x.layout.mesh.clone();
        let pack = |v: Vec<B::FloatTensorPrimitive>| {
            let shape = v[0].shape().to_vec();
            DTensor::from_parts(shape.clone(), Layout::replicated_on(&mesh, shape.len()), v)
        };
        let mut xg = Vec::new();
        let mut og = Vec::new();
        let mut wg = Vec::new();
        let mut mg = Vec::new();
        let mut bg = Vec::new();
        for o in outs {
            xg.push(o.x_grad);
            og.push(o.offset_grad);
            wg.push(o.weight_grad);
            if let Some(m) = o.mask_grad {
                mg.push(m);
            }
            if let Some(b) = o.bias_grad {
                bg.push(b);
            }
        }
        DeformConv2dBackward::new(
            pack(xg),
            pack(og),
            pack(wg),
            (!mg.is_empty()).then(|| pack(mg)),
            (!bg.is_empty()).then(|| pack(bg)),
        )
    }
    fn unfold4d(
        x: FloatTensor<Self>,
        kernel_size: [usize; 2],
        options: UnfoldOptions,
    ) -> FloatTensor<Self> {
        batch_map::<B>(x, |x| B::unfold4d(x, kernel_size, options.clone()))
    }
    fn avg_pool2d(
        x: FloatTensor<Self>,
        k: [usize; 2],
        s: [usize; 2],
        p: [usize; 2],
        cip: bool,
        ceil: bool,
    ) -> FloatTensor<Self> {
        if let Some(plan) = pool::plan::<B>(&x, [k, s, p, [1, 1]], ceil, cip) {
            return pool::forward::<B>(x, &plan, p, 0.0, |w, p| {
                B::avg_pool2d(w, k, s, p, cip, false)
            });
        }
        batch_map::<B>(x, |x| B::avg_pool2d(x, k, s, p, cip, ceil))
    }
    fn avg_pool2d_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        k: [usize; 2],
        s: [usize; 2],
        p: [usize; 2],
        cip: bool,
        ceil: bool,
    ) -> FloatTensor<Self> {
        if let Some(plan) = pool::plan::<B>(&x, [k, s, p, [1, 1]], ceil, cip) {
            return pool::avg_backward::<B>(x, grad, &plan, [k, s, p, [1, 1]], cip);
        }
        batch_map_grad::<B>(x, grad, |x, g| {
            B::avg_pool2d_backward(x, g, k, s, p, cip, ceil)
        })
    }
    /// A global average (`output_size` `[1, 1]`) of a spatially sharded input: a pending sum
    /// (`ops/pool.rs`, `rules::conv::global_average`); other sizes batch-parallel.
    fn adaptive_avg_pool2d(x: FloatTensor<Self>, output_size: [usize; 2]) -> FloatTensor<Self> {
        if global_average(&x.layout, &x.shape, output_size) {
            return pool::global_average::<B>(x);
        }
        batch_map::<B>(x, |x| B::adaptive_avg_pool2d(x, output_size))
    }
    fn adaptive_avg_pool2d_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        if global_average(&x.layout, &x.shape, [grad.shape[2], grad.shape[3]]) {
            return pool::global_average_backward::<B>(x, grad);
        }
        batch_map_grad::<B>(x, grad, B::adaptive_avg_pool2d_backward)
    }
    fn max_pool2d(
        x: FloatTensor<Self>,
        k: [usize; 2],
        s: [usize; 2],
        p: [usize; 2],
        d: [usize; 2],
        ceil: bool,
    ) -> FloatTensor<Self> {
        if let Some(plan) = pool::plan::<B>(&x, [k, s, p, d], ceil, true) {
            return pool::forward::<B>(x, &plan, p, f64::NEG_INFINITY, |w, p| {
                B::max_pool2d(w, k, s, p, d, false)
            });
        }
        batch_map::<B>(x, |x| B::max_pool2d(x, k, s, p, d, ceil))
    }
    fn max_pool2d_with_indices(
        x: FloatTensor<Self>,
        k: [usize; 2],
        s: [usize; 2],
        p: [usize; 2],
        d: [usize; 2],
        ceil: bool,
    ) -> MaxPool2dWithIndices<Self> {
        if let Some(plan) = pool::plan::<B>(&x, [k, s, p, d], ceil, true) {
            let (output, indices) = pool::max_with_indices::<B>(x, &plan, [k, s, p, d]);
            return MaxPool2dWithIndices::new(output, indices);
        }
        let xl = x.layout.clone();
        let xs = prep::<B, FloatKind>(x, &xl, true);
        let empty = |p: &Pair<_, _>| {
            Pair(
                empty_batch::<B, FloatKind>(&p.0),
                empty_batch::<B, IntKind>(&p.1),
            )
        };
        let both = run_batch_with::<B, _>(&xs, true, empty, |i| {
            let r = B::max_pool2d_with_indices(xs.per_device()[i].clone(), k, s, p, d, ceil);
            Pair(r.output, r.indices)
        });
        let (shape, layout) = (both.shape.clone(), both.layout.clone());
        let (o, ix): (Vec<_>, Vec<_>) = both
            .into_per_device()
            .into_iter()
            .map(|Pair(a, b)| (a, b))
            .unzip();
        MaxPool2dWithIndices::new(
            DTensor::from_parts(shape.clone(), layout.clone(), o),
            DTensor::from_parts(shape, layout, ix),
        )
    }
    fn max_pool2d_with_indices_backward(
        x: FloatTensor<Self>,
        k: [usize; 2],
        s: [usize; 2],
        p: [usize; 2],
        d: [usize; 2],
        ceil: bool,
        output_grad: FloatTensor<Self>,
        indices: IntTensor<Self>,
    ) -> MaxPool2dBackward<Self> {
        if let Some(plan) = pool::plan::<B>(&x, [k, s, p, d], ceil, true) {
            let g = [k, s, p, d];
            return MaxPool2dBackward::new(pool::max_backward::<B>(
                x,
                &plan,
                g,
                output_grad,
                indices,
            ));
        }
        let xl = x.layout.clone();
        let xs = prep::<B, FloatKind>(x, &xl, true);
        let g = prep::<B, FloatKind>(output_grad, &xl, true);
        let ix = prep::<B, IntKind>(indices, &xl, true);
        MaxPool2dBackward::new(run_batch::<B>(&xs, true, |i| {
            B::max_pool2d_with_indices_backward(
                xs.per_device()[i].clone(),
                k,
                s,
                p,
                d,
                ceil,
                g.per_device()[i].clone(),
                ix.per_device()[i].clone(),
            )
            .x_grad
        }))
    }
    fn interpolate(
        x: FloatTensor<Self>,
        output_size: [usize; 2],
        options: InterpolateOptions,
    ) -> FloatTensor<Self> {
        batch_map::<B>(x, |x| B::interpolate(x, output_size, options.clone()))
    }
    fn interpolate_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        output_size: [usize; 2],
        options: InterpolateOptions,
    ) -> FloatTensor<Self> {
        batch_map_grad::<B>(x, grad, |x, g| {
            B::interpolate_backward(x, g, output_size, options.clone())
        })
    }
    /// The rule `rules::module::embedding`: the lookup of each device's own ids (in
    /// its own rows of a vocabulary-parallel table).
    fn embedding(weights: FloatTensor<Self>, indices: IntTensor<Self>) -> FloatTensor<Self> {
        c::same_mesh(&weights.layout, &indices.layout);
        if is_solo(&weights) {
            return solo_map(weights, |w| B::embedding(w, only(indices)));
        }
        let s = module::embedding(
            &weights.layout,
            &weights.shape,
            &indices.layout,
            &indices.shape,
        );
        let rows = vocab_rows(&s.inputs[0], &weights.shape);
        let shape = vec![indices.shape[0], indices.shape[1], weights.shape[1]];
        // Where the rule gathered a sequence-sharded input's ids for a vocabulary-parallel
        // lookup (Megatron-SP), the pending output is reduce-scattered back onto the ids'
        // sequence sharding: the caller gets the sequence-parallel activation it laid out.
        let ids = indices.layout.without_partial();
        let back = (s.inputs[1] != ids).then(|| {
            s.output
                .without_partial()
                .set_dim(0, ids.dims[0])
                .set_dim(1, ids.dims[1])
        });
        let out = run2::<B, FloatKind, IntKind, FloatKind>(
            weights,
            indices,
            &s,
            shape,
            false,
            |at, w, i| match rows(at) {
                None => B::embedding(w, i),
                Some((lo, hi)) => {
                    let (local, outside) = c::local_indices::<B>(i, lo..hi);
                    let d = w.shape()[1];
                    let out = if hi > lo {
                        B::embedding(w, local)
                    } else {
                        let [b, n] = outside.shape().dims();
                        let dtype = w.dtype().into();
                        B::float_zeros([b, n, d].into(), &B::float_device(&w), dtype)
                    };
                    zero_rows::<B>(out, outside)
                }
            },
        );
        match back {
            Some(to) => relayout::<B>(out, &to),
            None => out,
        }
    }
    /// The rule `rules::module::embedding_backward`: each device adds its
    /// own gradient rows; the table is not moved (only its shape and layout are used, each
    /// device's part made empty in place). A pending sum over an axis that shards the table is
    /// reduce-scattered onto it at once (FSDP, see `ops/weight_grads.rs`).
    fn embedding_backward(
        weights: FloatTensor<Self>,
        output_grad: FloatTensor<Self>,
        indices: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        c::same_mesh(&weights.layout, &indices.layout);
        c::same_mesh(&weights.layout, &output_grad.layout);
        if is_solo(&weights) {
            return solo_map(weights, |w| {
                B::embedding_backward(w, only(output_grad), only(indices))
            });
        }
        // Linear in the output gradient: a pending one not settled yet hands its settled value
        // to this table gradient when it settles (see `c::linear_in`). The reduce-scatter onto
        // an FSDP-sharded table then waits for that value (which still needs it), unless the
        // table gradient cannot derive from it (the op itself settles the gradient's pending
        // axes).
        let (table, shape) = (weights.layout.clone(), weights.shape.clone());
        drop(weights);
        if output_grad.derivable().is_none() {
            return table_gradient::<B>(&table, &shape, output_grad, indices, true);
        }
        let pending = output_grad.layout.partial.clone();
        let t = table.clone();
        let g = c::linear_in(output_grad, move |g| {
            table_gradient::<B>(&t, &shape, g, indices.clone(), false)
        });
        if g.layout.keeps_partial(&pending) {
            g
        } else {
            settle_now::<B>(g, Some(&table))
        }
    }
    /// Batch-parallel over the query's dim 0; a mask or bias whose dim 0 is the batch is sharded
    /// with it, a broadcast one (dim 0 of size 1) is replicated.
    fn attention(
        query: FloatTensor<Self>,
        key: FloatTensor<Self>,
        value: FloatTensor<Self>,
        mask: Option<BoolTensor<Self>>,
        attn_bias: Option<FloatTensor<Self>>,
        options: AttentionModuleOptions,
    ) -> FloatTensor<Self> {
        let ql = query.layout.clone();
        let n = query.shape[0];
        let q = prep::<B, FloatKind>(query, &ql, true);
        let k = prep::<B, FloatKind>(key, &ql, true);
        let v = prep::<B, FloatKind>(value, &ql, true);
        let m = mask.map(|m| {
            let b = m.shape[0] == n;
            prep::<B, BoolKind>(m, &ql, b)
        });
        let bias = attn_bias.map(|t| {
            let b = t.shape[0] == n;
            prep::<B, FloatKind>(t, &ql, b)
        });
        run_batch::<B>(&q, true, |i| {
            B::attention(
                q.per_device()[i].clone(),
                k.per_device()[i].clone(),
                v.per_device()[i].clone(),
                m.as_ref().map(|m| m.per_device()[i].clone()),
                bias.as_ref().map(|b| b.per_device()[i].clone()),
                options,
            )
        })
    }
    fn rfft(
        signal: FloatTensor<Self>,
        dim: usize,
        n: Option<usize>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let l = crate::rules::unsharded_on(&signal.layout, &[dim]);
        let x = execute::<B, FloatKind>(signal, &l);
        let mut re = Vec::new();
        let mut im = Vec::new();
        let mut shape = x.shape.clone();
        for s in x.into_per_device() {
            let (a, b) = B::rfft(s, dim, n);
            re.push(a);
            im.push(b);
        }
        shape[dim] = re[0].shape()[dim];
        (
            DTensor::from_parts(shape.clone(), l.clone(), re),
            DTensor::from_parts(shape, l, im),
        )
    }
    fn irfft(
        re: FloatTensor<Self>,
        im: FloatTensor<Self>,
        dim: usize,
        n: Option<usize>,
    ) -> FloatTensor<Self> {
        let l = crate::rules::unsharded_on(&re.layout, &[dim]);
        let a = execute::<B, FloatKind>(re, &l);
        let b = execute::<B, FloatKind>(im, &l);
        let mut shape = a.shape.clone();
        let out: Vec<_> = a
            .into_per_device()
            .into_iter()
            .zip(b.into_per_device())
            .map(|(x, y)| B::irfft(x, y, dim, n))
            .collect();
        shape[dim] = out[0].shape()[dim];
        DTensor::from_parts(shape, l, out)
    }
}

/// Two per-shard outputs carried through [`run_batch_with`] together.
#[derive(Clone, Debug)]
struct Pair<A, B>(A, B);
impl<A: TensorMetadata, B: Clone + Send + Sync + std::fmt::Debug> TensorMetadata for Pair<A, B> {
    fn dtype(&self) -> burn::tensor::DType {
        self.0.dtype()
    }
    fn shape(&self) -> burn::tensor::Shape {
        self.0.shape()
    }
}
