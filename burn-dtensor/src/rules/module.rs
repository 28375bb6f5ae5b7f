//! Batch-parallel module ops (adaptive pooling, interpolate, attention; the convolutions, their
//! transposed forms, the 2-D pools and the global average pool have their own rules,
//! [`super::conv`], and run here only where those keep no spatial shard): with the input sharded
//! only along dim 0 (the batch) and every other operand replicated, each shard runs the inner op
//! on its own samples and the output keeps the batch sharding. Any other layout is first
//! redistributed to that form. The embedding lookup and its backward (below) carry the ids'
//! sharding instead.

use super::Strategy;
use crate::layout::{Layout, ReduceOp};

/// `x` keeps its dim-0 sharding, everything else whole; `others` operand layouts are replicated
/// (`batched[i]` marks the operands whose dim 0 is the batch too, like an output gradient).
pub fn batch_parallel(x: &Layout, batched: &[bool], ranks: &[usize], out_rank: usize) -> Strategy {
    let a = x.dims.first().copied().flatten();
    let lay = |rank: usize, is_batch: bool| {
        let mut l = Layout::replicated_on(&x.mesh, rank);
        if is_batch && rank > 0 {
            l.dims[0] = a;
        }
        l
    };
    Strategy {
        inputs: batched
            .iter()
            .zip(ranks)
            .map(|(&b, &r)| lay(r, b))
            .collect(),
        output: lay(out_rank, true).into(),
    }
}

/// `embedding(weights [vocab, d], ids [batch, seq]) -> [batch, seq, d]`: each device looks its
/// own ids up in its own part of the table, so the output's batch and sequence dims are sharded
/// as the ids' and `d` as the table's, with no communication.
///
/// - A table sharded over the vocabulary on an axis the ids leave free is *vocabulary
///   parallel* (Megatron's `VocabParallelEmbedding`): each device looks up only the ids in its
///   rows (the sum's identity for the others), so the output is a pending sum over that axis.
///   That is chosen unless its all-reduce moves more bytes than gathering the table
///   ([`super::index::masking_pays`]: twice the per-device output, `[batch, seq, d]` of the
///   ids' and the table's shards, at most the per-device gathered table, `vocab x d`-shard), as
///   for `select` and `gather` on a sharded dim. Else the table is gathered (a position
///   embedding's `[seq, d]` table looked up by replicated positions under FSDP).
/// - A table sharded over the vocabulary on an axis that also shards the ids' sequence
///   (Megatron-SP, `tp-sp`) stays vocabulary parallel by the same measure, with the ids
///   gathered over the sequence first (`[batch, seq]` integers): the output is a pending sum
///   over the whole sequence, which the sequence-sharded residual reduce-scatters, and its
///   gradient is all-gathered back, as Megatron-SP's embedding does. Else the table is
///   gathered.
/// - A table sharded over the vocabulary on an axis that also shards the ids' batch (FSDP's
///   `Shard(0)` over the batch axis) is gathered first: the batch's ids stay apart, so each
///   device keeps only its samples' activations.
/// - An axis that shards both the ids and the table's `d` stays on the ids (the table's `d` is
///   gathered).
///
/// Ids sharded over the sequence dim give a sequence-sharded activation (sequence parallelism
/// from the input's layout).
///
/// `table` and `ids_shape` are the global shapes `[vocab, d]` and `[batch, seq]`.
pub fn embedding(weights: &Layout, table: &[usize], ids: &Layout, ids_shape: &[usize]) -> Strategy {
    let mut il = ids.without_partial();
    let mut wl = weights.without_partial();
    if let Some(a) = wl.dims[1]
        && il.axis_dim(a).is_some()
    {
        wl.dims[1] = None;
    }
    // The ids a vocabulary-parallel lookup reads: every member of the vocabulary's axis must
    // look up the same ids, so a sequence sharded over that axis is gathered (integers).
    let mut lookup = il.clone();
    if let Some(a) = wl.dims[0] {
        match il.axis_dim(a) {
            None => {}
            Some(1) => lookup.dims[1] = None,
            Some(_) => wl.dims[0] = None,
        }
    }
    if wl.dims[0].is_some() {
        let out = Layout::replicated_on(&lookup.mesh, 3)
            .set_dim(0, lookup.dims[0])
            .set_dim(1, lookup.dims[1])
            .set_dim(2, wl.dims[1]);
        let out_shape = [ids_shape[0], ids_shape[1], table[1]];
        if super::index::masking_pays(&out, &out_shape, &wl, table, 0) {
            il = lookup;
        } else {
            wl.dims[0] = None;
        }
    }
    let mut out = Layout::replicated_on(&il.mesh, 3)
        .set_dim(0, il.dims[0])
        .set_dim(1, il.dims[1])
        .set_dim(2, wl.dims[1]);
    if let Some(a) = wl.dims[0] {
        out = out.with_partial(a, ReduceOp::Sum);
    }
    Strategy {
        inputs: vec![wl, il],
        output: out.into(),
    }
}

/// `embedding_backward(grad [batch, seq, d], ids [batch, seq]) -> [vocab, d]` (the table only
/// gives the shape): the adjoint of [`embedding`] for a table in layout `weights`. Each device
/// adds its own rows of the gradient at its own ids (a vocabulary-parallel table: only the ids
/// in its rows), so the result has the forward table's layout and is a pending sum over every
/// axis that shards the ids (a data-parallel table's gradient is one reduction, as every other
/// gradient's; an FSDP table's settles by a reduce-scatter). Inputs: the gradient in the
/// forward's output layout, the ids as in the forward. The lookup's adjoint is linear in the
/// gradient, so a gradient `grad` still pending over an axis the forward output leaves free
/// stays pending into the table's gradient (a position embedding broadcast over a sharded
/// batch: its gradient's sum over the batch settles once, on the table's own layout).
///
/// `table` and `ids_shape` are the global shapes `[vocab, d]` and `[batch, seq]`.
pub fn embedding_backward(
    weights: &Layout,
    table: &[usize],
    grad: &Layout,
    ids: &Layout,
    ids_shape: &[usize],
) -> Strategy {
    let fwd = embedding(weights, table, ids, ids_shape);
    let mut g = fwd.output.without_partial();
    let mut out = fwd.inputs[0].clone();
    for a in fwd.inputs[1].dims.iter().flatten() {
        out = out.with_partial(*a, ReduceOp::Sum);
    }
    for a in 0..grad.mesh.ndim() {
        if grad.partial(a) == Some(ReduceOp::Sum)
            && fwd.output.axis_dim(a).is_none()
            && fwd.output.partial(a).is_none()
            && out.axis_dim(a).is_none()
        {
            g = g.with_partial(a, ReduceOp::Sum);
            out = out.with_partial(a, ReduceOp::Sum);
        }
    }
    Strategy {
        inputs: vec![g, fwd.inputs[1].clone()],
        output: out.into(),
    }
}
