//! Element-wise ops (unary, binary with broadcasting, scalar, compare, mask).
//!
//! Binary ops align their inputs: the output shards each dim like the input (largest first)
//! that shards it without conflict; other inputs are redistributed to match (a replicated input
//! is sliced locally, for free). A size-1 (broadcast) dim is never sharded.

use std::rc::Rc;

use super::Strategy;
use crate::layout::{Layout, Partials, ReduceOp};
use crate::memo;

/// How an op treats pending reductions (partial sums) of its inputs.
///
/// Addition keeps partial sums partial: `sum(a_i) + sum(b_i) = sum(a_i + b_i)` settles two
/// pending sums with one reduction, and `r + sum(b_i) = sum(b_i + [r on member 0])` adds a
/// settled operand without settling the sum (PyTorch DTensor's `Replicate -> Partial` for
/// linear ops). A product by a settled operand may keep a pending sum pending,
/// `sum(a_i) * m = sum(a_i * m)` (PyTorch DTensor's linearity of `mul.Tensor` and
/// `mul.Scalar`), but only where the op allows it ([`Linearity::Scaling`]). Every other
/// element-wise op settles its partial inputs first, even a linear one (`neg`): settling before
/// costs the same bytes as settling after (the output is never smaller than the partial input),
/// and the settled value is memoised on the input, so every consumer of one partial result
/// shares a single all-reduce. (Keeping `g * (1 - beta)` partial made Adam all-reduce each
/// gradient twice: once for the scaled copy, once for `g^2`.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Linearity {
    /// Inputs are settled first.
    None,
    /// Addition/subtraction: partial sums on the same axes stay partial.
    Additive,
    /// A product of one pending sum (of the output's full shape) by settled operands or a
    /// scalar: the sum stays pending, each member's term multiplied. The op decides whether to
    /// ask for it (`ops::common::scaling`): the rule itself cannot see whether the product is an
    /// activation (dropout's mask on a row-parallel output, which Megatron-SP reduce-scatters
    /// after the mask) or an update of module state (`lr * g`, which must settle before it
    /// reaches a parameter). Where a multiplier is `±inf` or NaN, a member's zero term gives
    /// NaN where the settled product is infinite: the op only asks for finite scalars.
    Scaling,
}

impl Linearity {
    /// The linearity of a product by the scalar `v` (a quotient by it when `divisor`):
    /// [`Linearity::Scaling`] where the product of each member's term is finite for finite
    /// terms (`v` finite, and non-zero for a divisor), else [`Linearity::None`].
    pub fn of_scalar(v: f64, divisor: bool) -> Self {
        if v.is_finite() && !(divisor && v == 0.0) {
            Linearity::Scaling
        } else {
            Linearity::None
        }
    }
}

/// Whether every pending reduction in `p` is a sum (the only kind a linear op may keep).
fn only_sum(p: &Partials) -> bool {
    p.iter().all(|x| x.is_none_or(|o| o == ReduceOp::Sum))
}

/// Unary op: same layout, pending reductions settled first, or kept for a
/// [`Linearity::Scaling`] of sums.
pub fn unary(l: &Layout, lin: Linearity) -> Strategy {
    let r = if lin == Linearity::Scaling && only_sum(&l.partial) {
        l.clone()
    } else {
        l.without_partial()
    };
    Strategy {
        inputs: vec![r.clone()],
        output: r.into(),
    }
}

/// [`nary`], memoised per thread on its arguments ([`crate::memo`]): the rule of every
/// element-wise op of a training step is computed once, in its first step.
pub fn nary_memo(
    inputs: &[(&Layout, &[usize])],
    out_shape: &[usize],
    lin: Linearity,
) -> Rc<Strategy> {
    let mut params = memo::Key::new();
    params.push(lin as usize);
    params.extend_from_slice(out_shape);
    super::memoised(super::Rule::Nary, inputs, &params, || {
        nary(inputs, out_shape, lin)
    })
}

/// N-ary element-wise op over same-rank inputs broadcast to `out_shape`.
pub fn nary(inputs: &[(&Layout, &[usize])], out_shape: &[usize], lin: Linearity) -> Strategy {
    let rank = out_shape.len();
    let mesh = inputs[0].0.mesh.clone();
    let mut out = Layout::replicated_on(&mesh, rank);
    // Larger inputs first: their sharding is the one worth keeping.
    let mut order: Vec<usize> = (0..inputs.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(inputs[i].1.iter().product::<usize>()));
    for &i in &order {
        let (l, s) = inputs[i];
        for d in 0..rank {
            if let Some(a) = l.dims[d]
                && s[d] == out_shape[d]
                && out.dims[d].is_none()
                && out.axis_dim(a).is_none()
            {
                out.dims[d] = Some(a);
            }
        }
    }
    // Which pending reductions survive.
    let partial_sets: Vec<&Partials> = inputs.iter().map(|(l, _)| &l.partial).collect();
    let any_partial = partial_sets.iter().any(|p| p.iter().any(Option::is_some));
    let mut keep: Option<(Partials, Vec<bool>)> = None; // (out partial, which inputs stay partial)
    if any_partial {
        let is_partial = |p: &Partials| p.iter().any(Option::is_some);
        let first = partial_sets.iter().copied().find(|p| is_partial(p));
        match (lin, first) {
            // Every partial input waits for the same sums, and one of them has the output's
            // full shape: the sum stays pending. A broadcast partial grows only beside a
            // full-size one (`x - mean(x)` in a layer norm of a pending residual: the pending
            // output is no larger than `x`, and the mean needs no all-reduce of its own); alone
            // it is settled before it grows. A settled input joins the sum as a pending sum
            // (its value on each axis' first member, zeros on the others: a local step), so
            // `r + p1 + p2 + p3` (the gradient of an activation used by a residual and by
            // query, key and value) settles once, not three times.
            (Linearity::Additive, Some(p0))
                if only_sum(p0)
                    && inputs
                        .iter()
                        .zip(&partial_sets)
                        .all(|(_, p)| !is_partial(p) || *p == p0)
                    && inputs
                        .iter()
                        .zip(&partial_sets)
                        .any(|((_, s), p)| is_partial(p) && *s == out_shape) =>
            {
                keep = Some((p0.clone(), vec![true; inputs.len()]));
            }
            // One pending sum of the output's full shape times settled operands: each member's
            // term is multiplied by the settled values, which are whole on the pending axes.
            (Linearity::Scaling, Some(p0))
                if only_sum(p0)
                    && partial_sets.iter().filter(|p| is_partial(p)).count() == 1
                    && inputs
                        .iter()
                        .zip(&partial_sets)
                        .any(|((_, s), p)| is_partial(p) && *s == out_shape) =>
            {
                keep = Some((
                    p0.clone(),
                    partial_sets.iter().map(|p| is_partial(p)).collect(),
                ));
            }
            _ => {}
        }
        // An axis cannot be both pending and sharding a dim of the output: the dim is made whole
        // and the sharded operand joins the sum with its chunk at its offset, zeros elsewhere
        // (`Step::PadPartial`, local). `r + g_q + g_k + g_v` with `r` sequence-sharded (a
        // sequence-parallel block's input gradient) so settles once, by one reduce-scatter
        // into `r`'s sharding ([`settle_layout`]), where settling each addition would cost one
        // reduce-scatter per partial operand.
        if let Some((p, _)) = &keep {
            for (a, x) in p.iter().enumerate() {
                if x.is_some()
                    && let Some(d) = out.axis_dim(a)
                {
                    out.dims[d] = None;
                }
            }
        }
    }
    let required = |i: usize| {
        let (_, s) = inputs[i];
        let mut r = Layout::replicated_on(&mesh, rank);
        for d in 0..rank {
            if s[d] == out_shape[d] {
                r.dims[d] = out.dims[d];
            }
        }
        if let Some((p, flags)) = &keep
            && flags[i]
        {
            r.partial = p.clone();
        }
        r
    };
    let ins = (0..inputs.len()).map(required).collect();
    if let Some((p, _)) = keep {
        out.partial = p;
    }
    Strategy {
        inputs: ins,
        output: out.into(),
    }
}

/// Where the pending sum of an additive op's output `out` (global shape `out_shape`) settles
/// when a consumer needs its value: `out` without its pending reductions, each pending axis
/// sharding the dim that an operand sharded with it (its own layout, `(layout, shape, None)`,
/// when not partial; its settle layout, `(_, _, Some(l))`, when it has one). `None` when no
/// operand says so (the sum then settles replicated, as any partial tensor) or `out` is not
/// partial.
///
/// Settling there is a reduce-scatter of the sum where the operand was sharded before the op
/// (Megatron-SP's one reduce-scatter per sequence-parallel region), not an all-reduce.
pub fn settle_layout(
    inputs: &[(&Layout, &[usize], Option<&Layout>)],
    out: &Layout,
    out_shape: &[usize],
) -> Option<Layout> {
    if !out.is_partial() {
        return None;
    }
    let mut h = out.without_partial();
    for a in (0..out.partial.len()).filter(|&a| out.partial[a].is_some()) {
        let from = inputs.iter().find_map(|&(l, s, hint)| match hint {
            Some(h) => h.axis_dim(a),
            None if !l.is_partial() => l.axis_dim(a).filter(|&j| s[j] == out_shape[j]),
            None => None,
        });
        if let Some(j) = from
            && h.dims[j].is_none()
            && h.axis_dim(a).is_none()
        {
            h.dims[j] = Some(a);
        }
    }
    (h != out.without_partial()).then_some(h)
}

/// Broadcast output shape of same-rank shapes (NumPy rules).
pub fn broadcast_shape(shapes: &[&[usize]]) -> Vec<usize> {
    let rank = shapes[0].len();
    (0..rank)
        .map(|d| shapes.iter().map(|s| s[d]).max().unwrap_or(1))
        .collect()
}
