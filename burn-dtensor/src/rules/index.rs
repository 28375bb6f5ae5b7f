//! Indexing ops: slice, select, gather, scatter, cat. Each runs per shard when the dims it
//! indexes are unsharded (those are gathered first) and the other operands are aligned.

use burn::tensor::Slice;

use super::{Strategy, unsharded_on};
use crate::layout::Layout;

/// Whether `s` selects the whole of a dim of size `n`.
pub fn is_full(s: &Slice, n: usize) -> bool {
    let (r, step) = s.to_range_and_step(n);
    r.start == 0 && r.end == n && step == 1
}

/// `slice`: sliced dims whole; the pending reductions survive (slicing is linear).
pub fn slice(l: &Layout, shape: &[usize], slices: &[Slice]) -> Strategy {
    let mut input = l.clone();
    for (d, s) in slices.iter().enumerate() {
        if !is_full(s, shape[d]) {
            input.dims[d] = None;
        }
    }
    Strategy {
        inputs: vec![input.clone()],
        output: input.into(),
    }
}

/// `slice_assign(t, slices, value)`: sliced dims whole in both; other dims aligned.
pub fn slice_assign(l: &Layout, shape: &[usize], slices: &[Slice]) -> Strategy {
    let sliced: Vec<usize> = (0..shape.len())
        .filter(|&d| slices.get(d).is_some_and(|s| !is_full(s, shape[d])))
        .collect();
    let t = unsharded_on(l, &sliced);
    Strategy {
        inputs: vec![t.clone(), t.clone()],
        output: t.into(),
    }
}

/// `select(t, dim, indices)` (output: `t`'s shape with `indices.len()` along `dim`): `t`'s
/// `dim` whole, every other dim of `t` kept; the indices keep their sharding, which becomes the
/// output's `dim` (each device selects the rows of its own indices, as [`gather_nd`]'s batch
/// dims). That is what keeps an embedding lookup (`weights.select(0, ids)`) data-parallel: the
/// batch-sharded ids select batch-sharded rows, with no all-gather of the ids. The indices are
/// gathered over an axis that `t` already uses (to shard another dim or as a pending
/// reduction). `t`'s pending reductions survive (selecting rows commutes with the element-wise
/// reduction).
pub fn select(t: &Layout, indices: &Layout, dim: usize) -> Strategy {
    let mut tl = t.clone();
    tl.dims[dim] = None;
    let mut il = indices.without_partial();
    if let Some(a) = il.dims[0]
        && (tl.axis_dim(a).is_some() || tl.partial(a).is_some())
    {
        il.dims[0] = None;
    }
    let out = tl.clone().set_dim(dim, il.dims[0]);
    Strategy {
        inputs: vec![tl, il],
        output: out.into(),
    }
}

/// `select_add(t, dim, indices, values)` (`t` with the rows of `values` added at `indices`
/// along `dim`; bool: or-ed): the backward of [`select`]. With the indices sharded over an axis
/// that `t` leaves free, each device adds only its own indices' rows: `t` becomes a pending sum
/// over that axis (its value on the axis' first member, zeros elsewhere), `values` is sharded
/// like the indices along `dim` and like `t` elsewhere, and the output is that pending sum (so
/// an embedding's gradient in data-parallel training is one reduction, as every other
/// parameter's, and no device gathers the batch's gradient rows). Otherwise the indices and
/// `values`' `dim` are replicated and every device adds every row to its shard of `t` (`dim`
/// whole): so for a kind without a pending sum (`sum` false: bool's `select_or`), and where `t`
/// already waits for another reduction over that axis.
pub fn select_add(t: &Layout, indices: &Layout, dim: usize, sum: bool) -> Strategy {
    let tl = unsharded_on(t, &[dim]);
    let il = indices.without_partial();
    match il.dims[0] {
        Some(a)
            if sum
                && tl.axis_dim(a).is_none()
                && tl
                    .partial(a)
                    .is_none_or(|op| op == crate::layout::ReduceOp::Sum) =>
        {
            let values = tl.clone().set_dim(dim, Some(a));
            let out = tl.with_partial(a, crate::layout::ReduceOp::Sum);
            Strategy {
                inputs: vec![out.clone(), il, values],
                output: out.into(),
            }
        }
        _ => Strategy {
            inputs: vec![tl.clone(), Layout::replicated_on(&tl.mesh, 1), tl.clone()],
            output: tl.into(),
        },
    }
}

/// Ops along `dim` whose operands all share one shape off `dim` (gather, scatter, cat): every
/// operand and the output take one layout with `dim` whole, each other dim sharded like the
/// first operand that shards it (in argument order, without reusing an axis). Taking the
/// sharding of *any* operand, not only the first, matters when the first is replicated: the
/// backward of `gather` scatters a batch-sharded gradient into replicated zeros, which must not
/// gather the indices (zeros are sliced locally for free).
pub fn along_dim_aligned(ls: &[&Layout], dim: usize) -> Strategy {
    let mut t = unsharded_on(ls[0], &[dim]);
    for l in &ls[1..] {
        for (d, a) in l.dims.iter().enumerate() {
            if let Some(a) = *a
                && d != dim
                && t.dims[d].is_none()
                && t.axis_dim(a).is_none()
            {
                t.dims[d] = Some(a);
            }
        }
    }
    Strategy {
        inputs: vec![t.clone(); ls.len()],
        output: t.into(),
    }
}

/// `cat` along `dim`: [`along_dim_aligned`] over the inputs.
pub fn cat(ls: &[&Layout], dim: usize) -> Strategy {
    along_dim_aligned(ls, dim)
}

/// `gather_nd(data, indices)` with `indices` of shape `[i_0, .., i_{m-2}, k]` (each row a
/// coordinate into `data`'s first `k` dims): output `[i_0, .., i_{m-2}, d_k, .., d_{r-1}]`.
///
/// Per shard when `data`'s indexed dims `0..k` and the indices' coordinate dim are whole: the
/// indices' batch dims stay sharded (they become the output's leading dims) and so do `data`'s
/// trailing dims `k..` (the output's trailing dims). An axis sharding both keeps the indices'
/// dim (the data's is gathered). Pending reductions are settled first (the output is not partial).
pub fn gather_nd(data: &Layout, indices: &Layout, k: usize) -> Strategy {
    let (r, m) = (data.rank(), indices.rank());
    let mut d = unsharded_on(data, &(0..k).collect::<Vec<_>>());
    let i = unsharded_on(indices, &[m - 1]);
    for j in k..r {
        if d.dims[j].is_some_and(|a| i.axis_dim(a).is_some()) {
            d.dims[j] = None;
        }
    }
    let mut out = Layout::replicated_on(&data.mesh, m - 1 + r - k);
    out.dims[..m - 1].copy_from_slice(&i.dims[..m - 1]);
    out.dims[m - 1..].copy_from_slice(&d.dims[k..]);
    Strategy {
        inputs: vec![d, i],
        output: out.into(),
    }
}

/// `scatter_nd(data, indices, values, op)`, shapes as in [`gather_nd`] (`values` has the shape
/// `gather_nd` would give). Per shard when `data`'s indexed dims `0..k` are whole and every device
/// sees every update: the indices are replicated and so are the values' batch dims, while
/// `data`'s trailing dims `k..` stay sharded with the values' trailing dims aligned to them (each
/// device applies all updates to its chunk, in the same order as on one device, so duplicate
/// indices resolve as on the inner backend). The output has `data`'s layout.
pub fn scatter_nd(data: &Layout, indices: &Layout, k: usize) -> Strategy {
    let (r, m) = (data.rank(), indices.rank());
    let d = unsharded_on(data, &(0..k).collect::<Vec<_>>());
    let mut v = Layout::replicated_on(&data.mesh, m - 1 + r - k);
    v.dims[m - 1..].copy_from_slice(&d.dims[k..]);
    Strategy {
        inputs: vec![d.clone(), Layout::replicated_on(&data.mesh, m), v],
        output: d.into(),
    }
}
