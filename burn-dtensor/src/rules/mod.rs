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
//! | slice, select, gather, scatter, cat | [`index`] | per shard when the indexed dim is unsharded |
//! | batch-parallel module ops (conv, pool, interpolate, attention); embedding | [`module`] | dim 0 kept; the ids' sharding |
//! | everything else | [`fallback`] | replicated |

pub mod fallback;
pub mod index;
pub mod matmul;
pub mod module;
pub mod pointwise;
pub mod reduce;
pub mod view;

use crate::layout::Layout;

/// What a rule decides: the layout each input is redistributed to, and the output layout.
#[derive(Debug, Clone, PartialEq)]
pub struct Strategy {
    /// Required input layouts, in argument order.
    pub inputs: Vec<Layout>,
    /// Output layout.
    pub output: Layout,
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
        output: r,
    }
}
