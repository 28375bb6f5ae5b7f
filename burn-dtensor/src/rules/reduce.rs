//! Reductions. Summing (or averaging) over a sharded dim is done per shard and leaves a
//! partial sum on that dim's mesh axis, reduced by the consumer that needs it (one all-reduce
//! or reduce-scatter), exactly as BatchNorm's batch statistics need. Means divide the local sums
//! by the *global* count, so they are exact on uneven shards. Max/min over a sharded dim leave
//! a partial max/min. Index-returning and cumulative reductions need the dim whole.

use super::{Strategy, along_dims};
use crate::layout::{Layout, ReduceOp};

/// Sum/mean over `dim` (rank kept, `dim` becomes size 1).
pub fn sum_dim(l: &Layout, dim: usize) -> Strategy {
    reduce_dim(l, dim, ReduceOp::Sum)
}

/// [`sum_dim`], memoised per thread ([`super::memoised`]).
pub fn sum_dim_memo(l: &Layout, dim: usize) -> std::rc::Rc<Strategy> {
    super::memoised(super::Rule::SumDim, &[(l, &[])], &[dim], || sum_dim(l, dim))
}

/// Max (`ReduceOp::Max`) or min over `dim`: partial max/min when the dim is sharded and no
/// shard is empty, else the dim is gathered first.
pub fn extremum_dim(l: &Layout, shape: &[usize], dim: usize, op: ReduceOp) -> Strategy {
    if crate::layout::has_empty_shard(l, shape) {
        return along_dims(l, &[dim]);
    }
    reduce_dim(l, dim, op)
}

fn reduce_dim(l: &Layout, dim: usize, op: ReduceOp) -> Strategy {
    // Pending reductions survive only if they are of the same kind as this one.
    let mut input = l.clone();
    for p in input.partial.iter_mut() {
        if p.is_some_and(|x| x != op) {
            *p = None;
        }
    }
    let mut out = input.clone();
    if let Some(a) = l.dims[dim] {
        out.dims[dim] = None;
        out.partial[a] = Some(op);
    }
    Strategy {
        inputs: vec![input],
        output: out.into(),
    }
}

/// Reduction of all elements to shape `[1]`: every sharding axis becomes pending.
pub fn reduce_all(l: &Layout, shape: &[usize], op: ReduceOp) -> Strategy {
    if op != ReduceOp::Sum && crate::layout::has_empty_shard(l, shape) {
        let r = l
            .without_partial()
            .delete(&(0..l.rank()).collect::<Vec<_>>());
        let all = super::unsharded_on(l, &(0..l.rank()).collect::<Vec<_>>());
        let mut out = r;
        out.dims = smallvec::smallvec![None];
        return Strategy {
            inputs: vec![all],
            output: out.into(),
        };
    }
    let mut s = (0..l.rank()).fold(reduce_dim(l, 0, op), |acc, d| {
        let next = reduce_dim(&acc.output, d, op);
        Strategy {
            inputs: acc.inputs,
            output: next.output,
        }
    });
    std::sync::Arc::make_mut(&mut s.output).dims = smallvec::smallvec![None];
    s
}
