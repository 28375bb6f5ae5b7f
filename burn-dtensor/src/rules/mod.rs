//! Sharding rules, one op family per file. A rule looks at the input layouts and shapes and
//! returns a [`Strategy`]: the layout each input must be redistributed to, and the layout of the
//! output. The dispatcher ([`crate::ops::dispatch`]) then redistributes the inputs, runs the
//! inner op on every shard, and tags the result with the output layout.
//!
//! Adding an op's rule is a one-place change: pick the family file, write the rule, call it from
//! the op in `ops/`. Rules choose the output layout that needs the least communication; any op
//! without a specialised rule uses [`fallback`] (gather, inner op on the whole tensor,
//! re-shard), which is always correct.
//!
//! | family | file | output |
//! |---|---|---|
//! | element-wise unary/binary/compare/mask, broadcasting | [`pointwise`] | aligned sharding, partial kept by linear ops |
//! | matmul (batched) | [`matmul`] | batch/free dims sharded, sharded contracting dim -> partial sum |
//! | sum, mean, max, min, prod, arg*, cumulative | [`reduce`] | partial sum over a reduced sharded dim |
//! | swap_dims, permute, reshape, expand, flip, unfold | [`view`] | dims carried through |
//! | slice, select, gather, scatter, cat | [`index`] | per shard when the indexed dim is unsharded; select, gather (where cheaper) and their adds masked on a sharded one |
//! | convolutions (conv1d/2d/3d) and their gradients | [`conv`] | batch and spatial dims kept (halo exchange), channels whole |
//! | 2-D pools (avg, max, max with indices) and their gradients | [`conv::pool`] | batch, channel and spatial dims kept (halo exchange) |
//! | transposed convolutions (conv_transpose1d/2d/3d) and their gradients | [`conv::conv_transpose`] | batch and spatial dims kept (the convolution's adjoint: overlap rows folded back), channels whole |
//! | global average pool (adaptive avg pool to `[1, 1]`) of a spatially sharded input | [`conv::global_average`] | batch kept, a pending sum over the spatial axes |
//! | batch-parallel module ops (other adaptive pools, interpolate, attention); embedding | [`module`] | dim 0 kept; the ids' sharding |
//! | everything else | [`fallback`] | replicated |

pub mod conv;
pub mod fallback;
pub mod index;
pub mod matmul;
pub mod module;
pub mod pointwise;
pub mod reduce;
pub mod view;

use std::rc::Rc;

use crate::layout::Layout;
use crate::memo;

/// What a rule decides: the layout each input is redistributed to, and the output layout.
#[derive(Debug, Clone, PartialEq)]
pub struct Strategy {
    /// Required input layouts, in argument order.
    pub inputs: Vec<Layout>,
    /// Output layout, shared: every run of a memoised strategy hands it to its result by a
    /// reference count, not a copy (`ops::dispatch`).
    pub output: std::sync::Arc<Layout>,
}

/// The rules [`memoised`] keeps strategies of, one memo key space each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rule {
    /// [`pointwise::nary`] (params: the linearity, then the output shape).
    Nary,
    /// [`matmul::matmul`] (params: the [`matmul::Keep`]).
    Matmul,
    /// [`view::reshape`] (params: the new shape).
    Reshape,
    /// [`view::permute`] (params: the axes).
    Permute,
    /// [`reduce::sum_dim`] (params: the dim).
    SumDim,
}

/// `rule()`, the strategy of rule `which` for `operands` (each a layout and its global shape)
/// and `params`, memoised per thread on exactly those arguments ([`crate::memo`]): a training
/// step calls the same op on the same layouts and shapes every step, so each op's rule runs in
/// the first step only, and later steps share its strategy by reference count (PyTorch
/// DTensor's sharding propagation cache, per op schema). `rule` must depend on nothing else.
pub(crate) fn memoised(
    which: Rule,
    operands: &[(&Layout, &[usize])],
    params: &[usize],
    rule: impl FnOnce() -> Strategy,
) -> Rc<Strategy> {
    thread_local!(static MEMO: memo::Memo<Strategy> = Default::default());
    let mut key = memo::Key::new();
    key.push(which as usize);
    memo::push_list(&mut key, params);
    for (l, s) in operands {
        l.push_key(&mut key);
        memo::push_list(&mut key, s);
    }
    memo::get_or(&MEMO, key, rule)
}

/// Layout `l` with `dims` unsharded and no pending reduction: the requirement of every op
/// that works along `dims` (cumulative ops, argmax, flip, ...).
pub fn unsharded_on(l: &Layout, dims: &[usize]) -> Layout {
    let mut r = l.without_partial();
    for &d in dims {
        r.dims[d] = None;
    }
    r
}

/// The per-shard op is valid on `unsharded_on(l, dims)` and keeps the layout.
pub fn along_dims(l: &Layout, dims: &[usize]) -> Strategy {
    let r = unsharded_on(l, dims);
    Strategy {
        inputs: vec![r.clone()],
        output: r.into(),
    }
}
