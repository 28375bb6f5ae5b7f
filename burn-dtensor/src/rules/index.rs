//! Indexing ops: slice, select, gather, scatter, cat. Each runs per shard when the dims it
//! indexes are unsharded (those are gathered first) and the other operands are aligned; but
//! select, gather and their adds keep a sharded indexed dim and mask instead (the `*_sharded`
//! rules; select and gather where that moves fewer bytes, [`masking_pays`]): every device handles
//! the indices inside its rows of that dim and leaves the others to their owners, so a
//! vocabulary-sharded table or a class-sharded log-probability is not gathered (PyTorch DTensor's
//! `MaskPartial` placement and `loss_parallel`, Megatron-LM's vocab-parallel embedding and cross
//! entropy).

use burn::tensor::Slice;

use super::{Strategy, unsharded_on};
use crate::layout::{Layout, ReduceOp};

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

/// `select(t, dim, indices)` with `t`'s `dim` sharded over mesh axis `a`, for a kind with a
/// pending sum (float, int; `None` otherwise, for an unsharded `dim`, and where a shard of `t` is
/// empty): `t` keeps its layout (pending reductions settled), each device selects the indices
/// inside its rows of `dim` and gives the sum's identity for the others
/// ([`crate::tensor::Kind::identity_where`]), so the output is a pending sum over `a` with one
/// member holding each element. The indices keep their sharding, carried to the output's `dim`,
/// unless `t` uses their axis (then they are replicated). The all-reduce that settles the output
/// moves the selected rows, where [`select`] all-gathers the whole of `t`: chosen when that
/// moves fewer bytes ([`masking_pays`]; `None` otherwise). `n` is the number of indices.
pub fn select_sharded(
    t: &Layout,
    shape: &[usize],
    indices: &Layout,
    n: usize,
    dim: usize,
    pending_sum: bool,
) -> Option<Strategy> {
    let a = masked_axis(t, shape, dim, pending_sum)?;
    let tl = t.without_partial();
    let mut il = indices.without_partial();
    if il.dims[0].is_some_and(|b| tl.dims.contains(&Some(b))) {
        il.dims[0] = None;
    }
    let out = tl.clone().set_dim(dim, il.dims[0]);
    let mut out_shape = shape.to_vec();
    out_shape[dim] = n;
    if !masking_pays(&out, &out_shape, &tl, shape, dim) {
        return None;
    }
    Some(Strategy {
        inputs: vec![tl, il],
        output: out.with_partial(a, ReduceOp::Sum).into(),
    })
}

/// `gather(dim, t, indices)` (`indices` of `t`'s shape off `dim`) with `t`'s `dim` sharded over
/// mesh axis `a`, for a kind with a pending sum: as [`select_sharded`], the output a pending sum
/// over `a`. `t` keeps its layout (pending reductions settled); the indices' `dim` is whole and
/// their other dims are sharded as `t`'s, taking an indices' sharding where `t` leaves a dim
/// whole and the axis free. This is the cross entropy's `log_softmax(logits, 1).gather(1,
/// targets)` on class-sharded logits: `[batch, 1]` values all-reduced, where [`along_dim_aligned`]
/// all-gathers the `[batch, classes]` log-probabilities. Chosen when that moves fewer bytes
/// ([`masking_pays`]; `None` otherwise); `indices_shape` is the indices' (and output's) shape.
pub fn gather_sharded(
    t: &Layout,
    shape: &[usize],
    indices: &Layout,
    indices_shape: &[usize],
    dim: usize,
    pending_sum: bool,
) -> Option<Strategy> {
    let a = masked_axis(t, shape, dim, pending_sum)?;
    let (tl, il) = aligned_off(t, indices, dim);
    if !masking_pays(&il, indices_shape, &tl, shape, dim) {
        return None;
    }
    let out = il.clone().with_partial(a, ReduceOp::Sum);
    Some(Strategy {
        inputs: vec![tl, il],
        output: out.into(),
    })
}

/// Whether a masked lookup's all-reduce of its output (`out` of global `out_shape`, settled)
/// moves no more than gathering `t`'s `dim` (laid out as `t`, global `shape`) would: twice the
/// per-device output at most the per-device gathered `t` (a ring all-reduce moves about twice
/// its buffer, an all-gather its result once). The measure of the vocabulary-parallel embedding
/// ([`super::module::embedding`]); PyTorch DTensor costs its strategies by the same bytes.
pub fn masking_pays(
    out: &Layout,
    out_shape: &[usize],
    t: &Layout,
    shape: &[usize],
    dim: usize,
) -> bool {
    let numel = |v: Vec<usize>| v.iter().product::<usize>();
    let gathered = numel(unsharded_on(t, &[dim]).shard_shape(shape, 0));
    2 * numel(out.shard_shape(out_shape, 0)) <= gathered
}

/// `scatter_add(dim, t, indices, values)` (bool: or; `indices` and `values` of one shape, `t`'s
/// off `dim`) with `t`'s `dim` sharded over a mesh axis (`None` for an unsharded `dim` and where a
/// shard of `t` is empty): `t` keeps its layout (pending reductions settled), the indices and
/// values have `dim` whole and their other dims sharded as `t`'s, and each device adds the
/// updates whose indices fall inside its rows (the others replaced by the identity,
/// [`crate::tensor::Kind::identity_where`]). No collective, where [`along_dim_aligned`] gathers
/// `t`'s `dim` and leaves the result whole.
pub fn scatter_sharded(
    t: &Layout,
    shape: &[usize],
    indices: &Layout,
    dim: usize,
) -> Option<Strategy> {
    masked_axis(t, shape, dim, true)?;
    let (tl, il) = aligned_off(t, indices, dim);
    Some(Strategy {
        inputs: vec![tl.clone(), il.clone(), il],
        output: tl.into(),
    })
}

/// The mesh axis sharding `t`'s `dim` where the masked rules apply: a kind with a pending sum
/// where the rule needs one, and no empty shard of `t` (an empty shard has no row to clamp an
/// outside index to).
fn masked_axis(t: &Layout, shape: &[usize], dim: usize, pending_sum: bool) -> Option<usize> {
    let a = t.dims[dim]?;
    (pending_sum && !crate::layout::has_empty_shard(t, shape)).then_some(a)
}

/// `t` settled with its `dim` sharding kept, and `indices` settled with `dim` whole and every
/// other dim sharded as `t`'s, taking the indices' axis where `t` leaves a dim whole and does not
/// use the axis (both layouts then agree off `dim`).
fn aligned_off(t: &Layout, indices: &Layout, dim: usize) -> (Layout, Layout) {
    let mut tl = t.without_partial();
    let mut il = unsharded_on(indices, &[dim]);
    for d in (0..tl.rank()).filter(|&d| d != dim) {
        if tl.dims[d].is_none()
            && let Some(b) = il.dims[d]
            && tl.axis_dim(b).is_none()
        {
            tl.dims[d] = Some(b);
        }
        il.dims[d] = tl.dims[d];
    }
    (tl, il)
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
///
/// `t`'s `dim` stays sharded where it is (no empty shard): each device adds only the rows whose
/// indices fall inside its own rows of `dim` (the others' values replaced by the identity,
/// [`crate::tensor::Kind::identity_where`]), so a vocabulary-sharded table takes its rows'
/// updates without being gathered; `values`' `dim` then follows the indices as above.
pub fn select_add(
    t: &Layout,
    shape: &[usize],
    indices: &Layout,
    dim: usize,
    sum: bool,
) -> Strategy {
    let tl = match masked_axis(t, shape, dim, true) {
        Some(_) => t.without_partial(),
        None => unsharded_on(t, &[dim]),
    };
    let il = indices.without_partial();
    match il.dims[0] {
        Some(a) if sum && !tl.dims.contains(&Some(a)) => {
            let values = tl.clone().set_dim(dim, Some(a));
            let out = tl.with_partial(a, ReduceOp::Sum);
            Strategy {
                inputs: vec![out.clone(), il, values],
                output: out.into(),
            }
        }
        _ => Strategy {
            inputs: vec![
                tl.clone(),
                Layout::replicated_on(&tl.mesh, 1),
                tl.clone().set_dim(dim, None),
            ],
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
