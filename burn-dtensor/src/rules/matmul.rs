//! Matrix multiplication `[..., m, k] x [..., k, n] -> [..., m, n]` (batch dims broadcast).
//!
//! As PyTorch DTensor's einsum-derived strategies (`_ops/_matrix_ops.py`): a sharded batch dim
//! shards both sides and the output; a sharded free dim (`m` of the left, `n` of the right)
//! shards the output; a contracting dim `k` sharded on both sides over the same axis gives a
//! *partial sum* on that axis, reduced only when a consumer needs it. When only one side shards
//! `k`, the other is sliced locally to match (free for a replicated operand).

use super::Strategy;
use super::pointwise::{Linearity, nary};
use crate::layout::{Layout, ReduceOp};

/// The matmul strategy for `lhs` `[..., m, k]` and `rhs` `[..., k, n]`.
pub fn matmul(lhs: &Layout, ls: &[usize], rhs: &Layout, rs: &[usize]) -> Strategy {
    let r = ls.len();
    let (m, k, n) = (r - 2, r - 1, r - 1);
    // Batch dims behave like a broadcast element-wise op.
    let batch_shape: Vec<usize> = (0..r - 2).map(|d| ls[d].max(rs[d])).collect();
    let strip = |l: &Layout| l.without_partial().delete(&[r - 2, r - 1]);
    let (lb, rb) = (strip(lhs), strip(rhs));
    let batch = nary(
        &[(&lb, &ls[..r - 2]), (&rb, &rs[..r - 2])],
        &batch_shape,
        Linearity::None,
    )
    .output;
    let used =
        |a: usize, extra: &[Option<usize>]| batch.axis_dim(a).is_some() || extra.contains(&Some(a));
    // Contracting dim: prefer the larger operand's sharding.
    let lsize: usize = ls.iter().product();
    let rsize: usize = rs.iter().product();
    let cands = if lsize >= rsize {
        [lhs.dims[k], rhs.dims[r - 2]]
    } else {
        [rhs.dims[r - 2], lhs.dims[k]]
    };
    let ak = cands.into_iter().flatten().find(|&a| !used(a, &[]));
    let am = lhs.dims[m].filter(|&a| !used(a, &[ak]));
    let an = rhs.dims[n].filter(|&a| !used(a, &[ak, am]));
    let mk = |b: &Layout, s: &[usize], d0: Option<usize>, d1: Option<usize>, full: &[usize]| {
        let mut l = Layout::replicated_on(&lhs.mesh, r);
        for d in 0..r - 2 {
            if s[d] == full[d] {
                l.dims[d] = b.dims[d];
            }
        }
        l.dims[r - 2] = d0;
        l.dims[r - 1] = d1;
        l
    };
    let lin = mk(&batch, ls, am, ak, &batch_shape);
    let rin = mk(&batch, rs, ak, an, &batch_shape);
    let mut out = mk(&batch, &batch_shape, am, an, &batch_shape);
    if let Some(a) = ak {
        out = out.with_partial(a, ReduceOp::Sum);
    }
    Strategy {
        inputs: vec![lin, rin],
        output: out,
    }
}

/// The whole-contraction form of a partial matmul strategy `s`: the contracting dim gathered on
/// both operands (each keeps its other dims' sharding) and the output settled (`s.output`
/// without its pending sums). What a multi-process mesh runs where one process would contract
/// the stacked operands in one matmul (see `ops::common::matmul`).
pub fn gathered_contraction(s: &Strategy) -> Strategy {
    let mut lhs = s.inputs[0].clone();
    let mut rhs = s.inputs[1].clone();
    let r = lhs.rank();
    lhs.dims[r - 1] = None;
    rhs.dims[r - 2] = None;
    Strategy {
        inputs: vec![lhs, rhs],
        output: s.output.without_partial(),
    }
}
