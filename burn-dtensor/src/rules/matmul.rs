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

/// Which operand's sharding a matmul keeps where both operands ask for one mesh axis (the
/// output cannot be sharded twice over it, so one side is redistributed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Keep {
    /// A plain matmul: the contracting dim's sharding first (the larger operand's), then the
    /// left operand's free dim `m`, then the right's `n`.
    #[default]
    Contraction,
    /// `rhs` is a weight: `Linear`'s forward `x @ W` and its input gradient `g @ Wᵀ`. The
    /// activation's batch keeps its sharding (the matmul's batch dims, or the rows of a 2-D
    /// input); otherwise the weight's sharding is kept (its contracting dim, then its free dim)
    /// and the activation moves: Megatron's stationary weights. A column-parallel weight
    /// `[d, d_out@model]` meeting a sequence-sharded input `[b, s@model, d]` all-gathers the
    /// input over the sequence (Megatron-SP's `g`), where [`Keep::Contraction`] would gather the
    /// weight; an FSDP weight `[d@batch, d_out]` meeting a batch-sharded input is gathered.
    Weight,
    /// `Linear`'s weight gradient `xᵀ @ g`: the output's dims (the weight's own `d_in`,
    /// `d_out`) first, then the contracting dim (the tokens), so that the gradient comes out in
    /// the weight's layout and the activations move.
    Output,
}

/// The matmul strategy for `lhs` `[..., m, k]` and `rhs` `[..., k, n]` (global shapes `ls`,
/// `rs`), resolving conflicts over a mesh axis as `keep` says.
pub fn matmul(lhs: &Layout, ls: &[usize], rhs: &Layout, rs: &[usize], keep: Keep) -> Strategy {
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
    // The contracting dim's candidates: the weight's, or the larger operand's first.
    let lsize: usize = ls.iter().product();
    let rsize: usize = rs.iter().product();
    let k_cands = if keep != Keep::Weight && lsize >= rsize {
        [lhs.dims[k], rhs.dims[r - 2]]
    } else {
        [rhs.dims[r - 2], lhs.dims[k]]
    };
    #[derive(Clone, Copy)]
    enum Dim {
        K,
        M,
        N,
    }
    let order = match keep {
        Keep::Contraction => [Dim::K, Dim::M, Dim::N],
        // A 2-D input's rows are its batch.
        Keep::Weight if r == 2 => [Dim::M, Dim::K, Dim::N],
        Keep::Weight => [Dim::K, Dim::N, Dim::M],
        Keep::Output => [Dim::M, Dim::N, Dim::K],
    };
    let (mut ak, mut am, mut an) = (None, None, None);
    for d in order {
        let taken = [ak, am, an];
        let free = |a: &usize| batch.axis_dim(*a).is_none() && !taken.contains(&Some(*a));
        match d {
            Dim::K => ak = k_cands.into_iter().flatten().find(free),
            Dim::M => am = lhs.dims[m].filter(free),
            Dim::N => an = rhs.dims[n].filter(free),
        }
    }
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
        output: out.into(),
    }
}

/// [`matmul`], memoised per thread ([`super::memoised`]).
pub fn matmul_memo(
    lhs: &Layout,
    ls: &[usize],
    rhs: &Layout,
    rs: &[usize],
    keep: Keep,
) -> std::rc::Rc<Strategy> {
    super::memoised(
        super::Rule::Matmul,
        &[(lhs, ls), (rhs, rs)],
        &[keep as usize],
        || matmul(lhs, ls, rhs, rs, keep),
    )
}

/// The row-split form of [`gathered_contraction`]: where `s` contracts over exactly one mesh
/// axis `a` (its output partial over `a` alone) and leaves the left operand's rows `m` free, the
/// rows are sharded over `a` instead: the left operand `[..., m@a, k]` (an all-to-all from
/// `[..., m, k@a]`), the right one gathered along `k`, and the output `[..., m@a, n]`, settled.
/// Each device computes its block of rows with the whole contraction, so every element is
/// summed over `k` in the one matmul's order, as [`gathered_contraction`]'s is, at `1/size(a)`
/// of its multiply-adds; gathering the output to `gathered_contraction(s).output` gives its
/// value, bitwise where the inner matmul's per-element operations do not depend on the rows
/// (`inner::rows_split_exactly`, which `ops::common::matmul` asks first). A data-parallel
/// weight gradient `xᵀ @ g` (`[d_in, tokens@batch] @ [tokens@batch, d_out]`) is one. `None`
/// when another axis also contracts, the rows are sharded, the right operand's `n` uses `a`, or
/// `size(a)` does not divide `m` (global shape `ls` of the left).
pub fn row_split_contraction(s: &Strategy, ls: &[usize]) -> Option<Strategy> {
    let out = &s.output;
    let mut axes = (0..out.mesh.ndim()).filter(|&a| out.partial[a].is_some());
    let (Some(a), None) = (axes.next(), axes.next()) else {
        return None;
    };
    let r = ls.len();
    let (mut lhs, mut rhs) = (s.inputs[0].clone(), s.inputs[1].clone());
    if lhs.dims[r - 2].is_some()
        || lhs.dims[r - 1] != Some(a)
        || rhs.dims[r - 1] == Some(a)
        || !ls[r - 2].is_multiple_of(out.mesh.axis_size(a))
    {
        return None;
    }
    lhs.dims[r - 2] = Some(a);
    lhs.dims[r - 1] = None;
    rhs.dims[r - 2] = None;
    let mut output = out.without_partial();
    output.dims[r - 2] = Some(a);
    Some(Strategy {
        inputs: vec![lhs, rhs],
        output: output.into(),
    })
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
        output: s.output.without_partial().into(),
    }
}
