//! Batch-parallel module ops (conv, pooling, interpolate, attention): with the input sharded
//! only along dim 0 (the batch) and every other operand replicated, each shard runs the inner op
//! on its own samples and the output keeps the batch sharding. Any other layout is first
//! redistributed to that form.

use super::Strategy;
use crate::layout::Layout;

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
        output: lay(out_rank, true),
    }
}
