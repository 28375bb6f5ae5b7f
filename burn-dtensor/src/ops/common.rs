//! Op bodies written once for every tensor kind (`K` = float, int or bool): each picks a rule
//! and hands the inner op to the dispatcher.

use burn::tensor::backend::Backend;
use burn::tensor::ops::{BoolTensor, IntTensor};
use burn::tensor::{Scalar, Shape, Slice, TensorData, TensorMetadata};

use super::dispatch::{self, is_solo, only, run_n, run1, run2, run2_weighted, run3, solo_map};
use crate::layout::Layout;
use crate::layout::local_ranges;
use crate::mesh::Mesh;
use crate::redistribute::execute_stacked;
use crate::rules::pointwise::{Linearity, broadcast_shape, nary, nary_memo};
use crate::rules::{self, Strategy, fallback, index, reduce, view};
use crate::stack::{self, At};
use crate::tensor::{DTensor, Kind};
use crate::{DistributedDevice, host};

/// Brings `t` to the layout: dim 0 as `x`'s (when `batched`) or replicated, all else whole.
/// Every operand of a batch-parallel op (and a convolution's weight and bias) passes here, so
/// this is where an operand on another mesh than `x` is refused ([`same_mesh`]).
pub fn prep<B: Backend, K: Kind<B>>(t: DTensor<K::P>, x: &Layout, batched: bool) -> DTensor<K::P> {
    same_mesh(x, &t.layout);
    let s = rules::module::batch_parallel(x, &[batched], &[t.shape.len()], 0);
    crate::redistribute::execute::<B, K>(t, &s.inputs[0])
}

/// Panics with a clear message when two operands live on different meshes (ops cannot return
/// errors).
pub fn same_mesh(a: &Layout, b: &Layout) {
    if a.mesh.id != b.mesh.id {
        panic!(
            "burn-dtensor: operands live on different meshes ({} and {}); move one onto the other's \
             mesh with `tensor.to_device(&DistributedDevice::new(mesh))`",
            a.mesh, b.mesh
        );
    }
}

/// A partial tensor whose reduction already ran (it is memoised and shared by clones, see
/// [`DTensor`]) stands for its reduced value: ops that would keep it partial (linear ops,
/// views) then produce a settled result instead of a new partial that a later consumer would
/// reduce a second time (e.g. BatchNorm's batch mean, reduced for the normalisation, then
/// scaled for the running mean).
///
/// A pending sum with a settle layout (`DTensor::settle_to`: a sharded operand of the additive op
/// that made it) is settled there now, once (memoised): only additive ops keep it pending
/// ([`binary`]), every other op reads it settled as its producer's operand was.
fn settled<B: Backend, K: Kind<B>>(t: DTensor<K::P>) -> DTensor<K::P> {
    settle_hinted::<B, K>(settled_memo(t))
}

/// A pending sum with a settle layout (`DTensor::settle_to`) settled there (memoised), before a
/// rule reads its layout; any other tensor unchanged. For the ops that do not call [`settled`]
/// (reductions over a dim, matmul, the module ops): their rules would otherwise see a
/// replicated pending sum and ask for it whole.
pub fn settle_hinted<B: Backend, K: Kind<B>>(t: DTensor<K::P>) -> DTensor<K::P> {
    match &t.settle_to {
        Some(to) if t.layout.is_partial() => {
            let to = to.clone();
            crate::redistribute::redistribute::<B, K>(t, &to)
                .unwrap_or_else(|e| panic!("burn-dtensor: {e}"))
        }
        _ => t,
    }
}

/// [`settled`] for the operands of an additive op: the memoised value where there is one, a
/// pending sum with a settle layout kept pending (the op may add to the sum).
fn settled_memo<P: Clone>(t: DTensor<P>) -> DTensor<P> {
    match t.reduced.as_ref().and_then(|r| r.get()) {
        Some(r) if t.layout.is_partial() => r.clone(),
        _ => t,
    }
}

/// `op(t)` for an op linear in `t` (a sum over a dim, a view, an embedding's backward): when
/// `t` is a pending sum not settled yet and `op` keeps its pending axes pending, the output is
/// registered with `t`'s memo, so that when `t` settles, `op` runs on the settled value and
/// that becomes the output's settled value: no second collective for the values `t`'s already
/// summed (see [`crate::tensor::Memo`]). `op` must be the decorator's own op (it is run again,
/// on the settled input, with communication only where a rule of it would communicate
/// anyway); the registration is dropped when its result is not the output's layout without
/// `t`'s pending axes.
pub fn linear_in<P: Clone + Send + Sync + 'static>(
    t: DTensor<P>,
    op: impl Fn(DTensor<P>) -> DTensor<P> + Send + Sync + 'static,
) -> DTensor<P> {
    let Some(source) = t.derivable().cloned() else {
        return op(t);
    };
    let pending = t.layout.partial.clone();
    let op = std::sync::Arc::new(op);
    let out = op.as_ref()(t);
    let Some(memo) = &out.reduced else {
        return out;
    };
    if out.layout.keeps_partial(&pending) && out.settle_to.is_none() && memo.get().is_none() {
        crate::tensor::Memo::derive(&source, &pending, memo, &out.layout, op);
    }
    out
}

/// A deferred partial operand (see [`crate::tensor::Deferred`]) of an additive op that keeps
/// its sum pending, as that same pending sum built from its reduced value: on each pending axis
/// the value sits on the axis' first member, zeros on the others; or, where the sum settles into
/// a dim sharded over the axis (`settle`, see `DTensor::settle_to`), each member holds its chunk
/// of that dim at its offset (zeros elsewhere). Reading its shards instead would compute the
/// per-shard products, and their sum rounds differently from the one contraction over the whole
/// dim that the reduced value is; a multi-process mesh computes that whole contraction there
/// (`rules::matmul::gathered_contraction`), settled, and adds it to the sharded operand chunk by
/// chunk: placing each chunk on the member that settles it keeps every element's terms on one
/// member in the order autodiff adds them (`r + g_q + g_k + g_v`), so one process and several
/// agree bitwise, and the per-shard products are never computed.
fn deferred_placed<B: Backend, K: Kind<B>>(
    t: DTensor<K::P>,
    settle: Option<&Layout>,
) -> DTensor<K::P> {
    use crate::collective::stacked;
    let crate::tensor::Shards::Deferred(d) = &t.shards else {
        return t;
    };
    let topo = t.layout.mesh.clone();
    let mut x = d.reduced.clone();
    let held = t.layout.without_partial();
    for (a, op) in t.layout.partial.iter().enumerate() {
        let Some(op) = *op else { continue };
        match settle.and_then(|h| h.axis_dim(a)) {
            Some(dim)
                if op == crate::ReduceOp::Sum
                    && held.dims[dim].is_none()
                    && t.shape[dim] % topo.axis_size(a) == 0 =>
            {
                x = stacked::local_chunk::<B, K>(x, &topo, a, dim);
                x = stacked::pad_partial::<B, K>(x, &topo, a, dim);
            }
            _ => x = stacked::make_partial::<B, K>(x, &topo, a, op),
        }
    }
    stack::output(t.shape.clone(), (*t.layout).clone(), x)
}

/// Element-wise unary op (shape kept).
pub fn unary<B: Backend, KI: Kind<B>, KO: Kind<B>>(
    t: DTensor<KI::P>,
    lin: Linearity,
    f: impl Fn(KI::P) -> KO::P + Sync,
) -> DTensor<KO::P> {
    if is_solo(&t) {
        return solo_map(t, f);
    }
    if lin == Linearity::Scaling && scaling(&t, true) {
        let hint = t.settle_to.clone();
        let t = deferred_placed::<B, KI>(t, hint.as_deref());
        let s = rules::pointwise::unary(&t.layout, lin);
        let shape = t.shape.clone();
        let mut r = run1::<B, KI, KO>(t, &s, shape, true, |_, x| f(x));
        // A product kept pending: a scaling of it may stay pending too (see `scaling`).
        if let Some(m) = &r.reduced {
            m.mark_scaled();
            r.settle_to = hint;
        }
        return r;
    }
    let t = settled::<B, KI>(t);
    if held_stacked::<B, _>(&t) {
        return map_stacked(t, |x| in_memory_order::<B, KI, KO>(x, &f));
    }
    let s = rules::pointwise::unary(&t.layout, Linearity::None);
    let shape = t.shape.clone();
    run1::<B, KI, KO>(t, &s, shape, true, |_, x| f(x))
}

/// `f(x)` for an element-wise `f` on stacked primitive `x`. On a backend that prefers dense
/// operands (Flex), a permuted view of a row-major buffer runs in its row-major dim order
/// (`permute(x, q)`, a view, [`crate::inner::row_major_order`]) and the result is the same
/// permuted view of the row-major result: the same values (each element is computed alone).
/// Such views are a `distribute`d input whose row blocks lie in order
/// ([`crate::inner::row_blocks_in_memory`]: `[batch, model]` stacked as a permuted view of the
/// global rows), a transposed stacked tensor and a weight gradient kept side by side
/// (`stack::side_by_side`). Flex's scalar ops (`mul_scalar`, `add_scalar`, comparisons with a
/// scalar, casts) walk a scalar strided iterator over such a view: `mul_scalar` of a
/// `distribute`d `[batch, model]` `[64, 48]` on 8 devices took 15 µs against 0.5 µs on a fresh
/// tensor (NOTES.md, session 60). A binary op that meets the view next runs in its memory order
/// too ([`in_memory_order2`]), copying a row-major operand by runs. Runs of fewer than 8
/// elements, every other layout and backend: `f(x)`.
fn in_memory_order<B: Backend, KI: Kind<B>, KO: Kind<B>>(
    x: KI::P,
    f: impl Fn(KI::P) -> KO::P,
) -> KO::P {
    let q = crate::inner::with_dims(&x, |xs| {
        memory_order::<B>(xs, || crate::inner::row_major_order(&x))
    });
    match q {
        Some((q, back)) => KO::permute(f(KI::permute(x, &q)), &back),
        None => f(x),
    }
}

/// The dim order `q` (from `order`: [`crate::inner::row_major_order`] of an operand) in which a
/// stacked primitive of `shape` is a permuted view of a row-major buffer, and its inverse, on a
/// backend that prefers dense operands and where the permutation back copies runs of at least 8
/// elements ([`crate::collective::stacked::permutes_by_runs`]): the order [`in_memory_order`]
/// and [`in_memory_order2`] run in. `None` otherwise (`order` is not asked on other backends).
fn memory_order<B: Backend>(
    shape: &[usize],
    order: impl FnOnce() -> Option<Vec<usize>>,
) -> Option<(Vec<usize>, Vec<usize>)> {
    if !crate::inner::prefer_dense::<B>() {
        return None;
    }
    let q = order()?;
    let back = crate::host::inverse_permutation(&q);
    let in_memory: Vec<usize> = q.iter().map(|&i| shape[i]).collect();
    crate::collective::stacked::permutes_by_runs(&in_memory, &back).then_some((q, back))
}

/// `f(x, y)` for an element-wise `f` on stacked primitives of one shape, where one of them is a
/// permuted view of a row-major buffer on a backend that prefers dense operands (Flex): both run
/// in that view's memory order (the other operand copied into it by contiguous runs where it is
/// not already laid out so, [`crate::collective::stacked::permute`]) and the result is the same
/// permuted view of a row-major result. The same values (each element is computed alone), and
/// the same layout on both sides of an update `w - lr * g` whose operands are kept side by side
/// (`stack::side_by_side`), so no copy at all; Flex would walk a permuted operand through its
/// scalar strided iterator. Runs of fewer than 8 elements, every other layout and backend:
/// `f(x, y)`.
fn in_memory_order2<B: Backend, K1: Kind<B>, K2: Kind<B>, KO: Kind<B>>(
    x: K1::P,
    y: K2::P,
    f: impl FnOnce(K1::P, K2::P) -> KO::P,
) -> KO::P {
    let order = || crate::inner::row_major_order(&x).or_else(|| crate::inner::row_major_order(&y));
    match crate::inner::with_dims(&x, |xs| memory_order::<B>(xs, order)) {
        Some((q, back)) => {
            use crate::collective::stacked::permute;
            KO::permute(f(permute::<B, K1>(x, &q), permute::<B, K2>(y, &q)), &back)
        }
        None => f(x, y),
    }
}

/// Whether `t` is held stacked, with no pending reduction, where the dispatcher would run an op
/// on it stacked ([`dispatch::holds_stacked`]): then an element-wise op whose operands all share
/// `t`'s layout and shape keeps them ([`rules::pointwise::nary`] on equal layouts is that layout
/// in and out), and runs once on the stacked primitives without a rule, a relayout check or a
/// new layout ([`map_stacked`]). Most element-wise ops of a training step are such.
fn held_stacked<B: Backend, P>(t: &DTensor<P>) -> bool {
    matches!(t.shards, crate::tensor::Shards::Stacked(_))
        && !t.layout.is_partial()
        && dispatch::holds_stacked::<B>(&t.layout, &t.shape)
}

/// `f` on the stacked primitive of `t` ([`held_stacked`]), an element-wise op: the output has
/// `t`'s shape and shares its layout (checked as every stacked output is, [`stack::output`]).
fn map_stacked<P, Q: TensorMetadata + 'static>(
    t: DTensor<P>,
    f: impl FnOnce(P) -> Q,
) -> DTensor<Q> {
    let DTensor {
        shape,
        layout,
        shards,
        ..
    } = t;
    let crate::tensor::Shards::Stacked(x) = shards else {
        unreachable!("held_stacked: a stacked tensor")
    };
    stack::output(shape, layout, f(x))
}

/// Whether a [`Linearity::Scaling`] op may keep its pending operand `t` pending (each member's
/// term multiplied, see `rules::pointwise::Linearity`): only where the op holds `t`'s last
/// handle and `t` has not settled, since another holder would settle it and the product would
/// then be a second collective of the same sum; and, for a product by a scalar (`by_scalar`),
/// only where `t` is itself a product kept pending (dropout's `(x * mask) * (1 / keep)`), so
/// that `lr * g` settles a gradient before it updates a parameter and BatchNorm's
/// `var * momentum` its batch statistic before it updates the running one: module state never
/// becomes a pending sum.
fn scaling<P>(t: &DTensor<P>, by_scalar: bool) -> bool {
    t.reduced.as_ref().is_some_and(|m| {
        std::sync::Arc::strong_count(m) == 1 && m.get().is_none() && (!by_scalar || m.is_scaled())
    })
}

/// Element-wise binary op with broadcasting.
pub fn binary<B: Backend, K1: Kind<B>, K2: Kind<B>, KO: Kind<B>>(
    a: DTensor<K1::P>,
    b: DTensor<K2::P>,
    lin: Linearity,
    f: impl Fn(K1::P, K2::P) -> KO::P + Sync,
) -> DTensor<KO::P> {
    same_mesh(&a.layout, &b.layout);
    if is_solo(&a) {
        return solo_map(a, |x| f(x, only(b)));
    }
    let (mut a, mut b) = (settled_memo(a), settled_memo(b));
    // `f` on the stacked operands, broadcast and merged as `stack::elementwise_plan` says.
    let stacked = |x: K1::P, y: K2::P| {
        let e = crate::inner::with_dims(&x, |xs| {
            crate::inner::with_dims(&y, |ys| stack::elementwise_memo::<B>(&[xs, ys]))
        });
        let (p, o) = (&e.operands, &e.merged);
        let r = f(
            stack::prepare::<B, K1>(x, &p[0], o),
            stack::prepare::<B, K2>(y, &p[1], o),
        );
        if o == &e.out {
            r
        } else {
            KO::reshape(r, e.out.clone().into())
        }
    };
    // `b` of `a`'s shape and layout is held stacked when `a` is, if its shards are stacked.
    if held_stacked::<B, _>(&a)
        && a.shape == b.shape
        && a.layout == b.layout
        && matches!(b.shards, crate::tensor::Shards::Stacked(_))
    {
        let crate::tensor::Shards::Stacked(y) = b.shards else {
            unreachable!("held_stacked: a stacked tensor")
        };
        return map_stacked(a, |x| in_memory_order2::<B, K1, K2, KO>(x, y, stacked));
    }
    let keeps = match (a.layout.is_partial(), b.layout.is_partial()) {
        (true, false) => scaling(&a, false),
        (false, true) => scaling(&b, false),
        _ => false,
    };
    let lin = if lin == Linearity::Scaling && !keeps {
        Linearity::None
    } else {
        lin
    };
    let out = broadcast_shape(&[&a.shape, &b.shape]);
    let mut s = nary_memo(&[(&a.layout, &a.shape), (&b.layout, &b.shape)], &out, lin);
    if !s.output.is_partial() && (a.settle_to.is_some() || b.settle_to.is_some()) {
        // The sum does not stay pending: its operands settle where their producers said.
        (a, b) = (settled::<B, K1>(a), settled::<B, K2>(b));
        s = nary_memo(&[(&a.layout, &a.shape), (&b.layout, &b.shape)], &out, lin);
    }
    let hint = rules::pointwise::settle_layout(
        &[
            (&a.layout, &a.shape, a.settle_to.as_deref()),
            (&b.layout, &b.shape, b.settle_to.as_deref()),
        ],
        &s.output,
        &out,
    );
    let (a, b) = if s.output.is_partial() {
        (
            deferred_placed::<B, K1>(a, hint.as_ref()),
            deferred_placed::<B, K2>(b, hint.as_ref()),
        )
    } else {
        (a, b)
    };
    let mut r = run2::<B, K1, K2, KO>(a, b, &s, out, true, |at, x, y| match at {
        At::Stacked(_) => stacked(x, y),
        At::Device(_) => f(x, y),
    });
    r.settle_to = hint.map(std::sync::Arc::new);
    if lin == Linearity::Scaling
        && let Some(m) = &r.reduced
    {
        m.mark_scaled(); // see `scaling`
    }
    r
}

/// Element-wise binary op that also needs `dims` whole (cross product).
pub fn binary_along<B: Backend, K: Kind<B>>(
    a: DTensor<K::P>,
    b: DTensor<K::P>,
    dims: &[usize],
    f: impl Fn(K::P, K::P) -> K::P + Sync,
) -> DTensor<K::P> {
    same_mesh(&a.layout, &b.layout);
    if is_solo(&a) {
        return solo_map(a, |x| f(x, only(b)));
    }
    let out = broadcast_shape(&[&a.shape, &b.shape]);
    let mut s = nary(
        &[(&a.layout, &a.shape), (&b.layout, &b.shape)],
        &out,
        Linearity::None,
    );
    s.inputs
        .iter_mut()
        .for_each(|l| *l = rules::unsharded_on(l, dims));
    s.output = rules::unsharded_on(&s.output, dims).into();
    run2::<B, K, K, K>(a, b, &s, out, false, |_, x, y| f(x, y))
}

/// `mask_where(t, mask, value)`, broadcasting.
pub fn mask_where<B: Backend, K: Kind<B>, KM: Kind<B>>(
    t: DTensor<K::P>,
    mask: DTensor<KM::P>,
    value: DTensor<K::P>,
    f: impl Fn(K::P, KM::P, K::P) -> K::P + Sync,
) -> DTensor<K::P> {
    same_mesh(&t.layout, &mask.layout);
    same_mesh(&t.layout, &value.layout);
    if is_solo(&t) {
        return solo_map(t, |x| f(x, only(mask), only(value)));
    }
    let (t, value) = (settle_hinted::<B, K>(t), settle_hinted::<B, K>(value));
    let out = broadcast_shape(&[&t.shape, &mask.shape, &value.shape]);
    let s = nary_memo(
        &[
            (&t.layout, &t.shape),
            (&mask.layout, &mask.shape),
            (&value.layout, &value.shape),
        ],
        &out,
        Linearity::None,
    );
    run3::<B, K, KM, K, K>(t, mask, value, &s, out, true, |at, x, m, v| {
        if !matches!(at, At::Stacked(_)) {
            return f(x, m, v);
        }
        let e = crate::inner::with_dims(&x, |xs| {
            crate::inner::with_dims(&m, |ms| {
                crate::inner::with_dims(&v, |vs| stack::elementwise_memo::<B>(&[xs, ms, vs]))
            })
        });
        let (p, o) = (&e.operands, &e.merged);
        let r = f(
            stack::prepare::<B, K>(x, &p[0], o),
            stack::prepare::<B, KM>(m, &p[1], o),
            stack::prepare::<B, K>(v, &p[2], o),
        );
        if o == &e.out {
            r
        } else {
            K::reshape(r, e.out.clone().into())
        }
    })
}

/// An op along `dims` that keeps the rank: those dims whole, the rest per shard.
pub fn along<B: Backend, KI: Kind<B>, KO: Kind<B>>(
    t: DTensor<KI::P>,
    dims: &[usize],
    shape: Vec<usize>,
    f: impl Fn(KI::P) -> KO::P + Sync,
) -> DTensor<KO::P> {
    if is_solo(&t) {
        return solo_map(t, f);
    }
    let t = settle_hinted::<B, KI>(t);
    let s = rules::along_dims(&t.layout, dims);
    run1::<B, KI, KO>(t, &s, shape, false, |_, x| f(x))
}

/// Reduction over `dim` (kept as size 1) with a partial result when `dim` is sharded; `f(x, d)`
/// reduces the inner primitive over its dim `d`.
pub fn reduce_dim<B: Backend, K: Kind<B>>(
    t: DTensor<K::P>,
    s: &Strategy,
    dim: usize,
    f: impl Fn(K::P, usize) -> K::P + Sync,
) -> DTensor<K::P> {
    if is_solo(&t) {
        return solo_map(t, |x| f(x, dim));
    }
    let mut shape = t.shape.clone();
    shape[dim] = 1;
    run1::<B, K, K>(t, s, shape, true, |at, x| match at {
        At::Device(_) => f(x, dim),
        At::Stacked(k) => reduce_stacked::<B, K>(x, dim + k, &f),
    })
}

/// `f(x, d)`, a reduction of stacked primitive `x` along its dim `d` kept as size 1.
///
/// - A permuted view (BatchNorm's `swap_dims(0, 1)` before its mean: `[.., 48, rows]` over
///   row-major `[.., rows, 48]`) on a backend that prefers dense operands (Flex) is reduced in
///   its row-major dim order (`permute(x, q)`, a view, [`crate::inner::row_major_order`]) and
///   the result permuted back (a reshape where only the reduced dim, now 1, moves): no copy of
///   `x`, and Flex sums the dense tensor along a middle dim, accumulating its rows in order as
///   it does along the strided dim of one shard's view (`At::Device`); copied dense, the rows'
///   short runs went to its horizontal row sums.
/// - Else a strided view is made dense first where the backend would copy it element by element
///   ([`Kind::dense`]).
///
/// Either way the leading dims are merged where that is a view ([`on_merged_leading`]).
fn reduce_stacked<B: Backend, K: Kind<B>>(
    x: K::P,
    d: usize,
    f: impl Fn(K::P, usize) -> K::P,
) -> K::P {
    if crate::inner::prefer_dense::<B>()
        && let Some(q) = crate::inner::row_major_order(&x)
    {
        // `back[d]`: where dim `d` of `x` sits in the permuted view.
        let back = crate::host::inverse_permutation(&q);
        let r = on_merged_leading::<B, K>(K::permute(x, &q), back[d], f);
        // The reduced dim is 1 now: moving it back is a reshape where only it moves.
        return crate::collective::stacked::permute::<B, K>(r, &back);
    }
    on_merged_leading::<B, K>(K::dense(x), d, f)
}

/// `f(x, d)`, a reduction of stacked primitive `x` along its dim `d` kept as size 1, run with the
/// dims before `d` merged into one where that is a view ([`crate::inner::merge_leading_view`]:
/// bitwise the same values, a lower rank for the backend's loops), and the result given `x`'s
/// rank again; `f(x, d)` itself where they do not merge.
fn on_merged_leading<B: Backend, K: Kind<B>>(
    x: K::P,
    d: usize,
    f: impl Fn(K::P, usize) -> K::P,
) -> K::P {
    match crate::inner::merge_leading_view(&x, d) {
        Some(merged) => {
            let mut out = crate::inner::with_dims(&x, |s| s.to_vec());
            out[d] = 1;
            drop(x);
            K::reshape(f(merged, 1), out.into())
        }
        None => f(x, d),
    }
}

/// Reduction of all elements to shape `[1]`.
pub fn reduce_all<B: Backend, K: Kind<B>>(
    t: DTensor<K::P>,
    op: crate::ReduceOp,
    f: impl Fn(K::P) -> K::P + Sync,
) -> DTensor<K::P> {
    if is_solo(&t) {
        return solo_map(t, f);
    }
    let t = settled::<B, K>(t);
    let s = reduce::reduce_all(&t.layout, &t.shape, op);
    run1::<B, K, K>(t, &s, vec![1], true, |at, x| match at {
        At::Device(_) => f(x),
        // Per stacked shard: the shard dims flattened and reduced to one element, with the mesh
        // dims merged where that is a view (`on_merged_leading`).
        At::Stacked(k) => {
            let xs = x.shape();
            let mut flat: Vec<usize> = xs[..k].to_vec();
            flat.push(xs[k..].iter().product());
            on_merged_leading::<B, K>(K::reshape(x, flat.into()), k, |x, d| {
                K::reduce_dim(x, d, op)
            })
        }
    })
}

/// Universal fallback: gather, run the inner op on the whole tensor, replicate the output.
pub fn fallback1<B: Backend, KI: Kind<B>, KO: Kind<B>>(
    t: DTensor<KI::P>,
    f: impl Fn(KI::P) -> KO::P + Sync,
) -> DTensor<KO::P> {
    let s = fallback::replicate(&[&t.layout], 0);
    fix_replicated(run1::<B, KI, KO>(t, &s, vec![], false, |_, x| f(x)))
}

/// Gives a replicated output computed by a fallback its real shape and rank.
pub fn fix_replicated<P: TensorMetadata>(mut r: DTensor<P>) -> DTensor<P> {
    let shape = r.per_device()[0].shape().to_vec();
    r.layout = std::sync::Arc::new(Layout::replicated_on(&r.layout.mesh, shape.len()));
    r.shape = shape;
    r
}

/// The product of two float shards, the kernel given to [`matmul`] for a float matmul: the
/// inner backend's `float_matmul`, or where it applies [`crate::inner::matmul_strided`] (the
/// same GEMM on NdArray's operands as they lie, without the copies its matmul makes of both
/// operands and of the result; bitwise the same values).
pub fn shard_matmul<B: Backend>(
    lhs: B::FloatTensorPrimitive,
    rhs: B::FloatTensorPrimitive,
) -> B::FloatTensorPrimitive {
    crate::inner::matmul_strided(&lhs, &rhs).unwrap_or_else(|| B::float_matmul(lhs, rhs))
}

/// `matmul` (batched, broadcasting) under the [`rules::matmul`] strategy. Uneven layouts leave
/// some devices with empty operands, which inner backends may reject (NdArray divides by
/// `m * k`): those shards are computed here as zeros of the local output shape, which is also
/// the right value for an empty *contracting* dim (this device's share of a partial sum).
///
/// Stacked, a contracting dim sharded on both sides gives a tensor with [deferred
/// shards](crate::tensor::Deferred): its reduced value is one matmul over the whole contracting
/// dim ([`stack::contract`]), its per-shard partial products are computed only if read.
pub fn matmul<B: Backend, K: Kind<B>, F>(
    lhs: DTensor<K::P>,
    rhs: DTensor<K::P>,
    f: F,
    keep: rules::matmul::Keep,
) -> DTensor<K::P>
where
    F: Fn(K::P, K::P) -> K::P + Copy + Send + Sync + 'static,
{
    same_mesh(&lhs.layout, &rhs.layout);
    if is_solo(&lhs) {
        return solo_map(lhs, |x| f(x, only(rhs)));
    }
    let (lhs, rhs) = (settle_hinted::<B, K>(lhs), settle_hinted::<B, K>(rhs));
    let s = rules::matmul::matmul_memo(&lhs.layout, &lhs.shape, &rhs.layout, &rhs.shape, keep);
    let r = lhs.shape.len();
    let bcast = |a: usize, b: usize| if a == 1 { b } else { a };
    let mut shape: Vec<usize> = (0..r - 2)
        .map(|d| bcast(lhs.shape[d], rhs.shape[d]))
        .collect();
    shape.extend([lhs.shape[r - 2], rhs.shape[r - 1]]);
    // Per-shard multiply-adds (batch * m * k * n of the first shards) decide the threading.
    let weigh = |x: &[K::P], y: &[K::P]| -> usize {
        let (Some(x), Some(y)) = (x.first(), y.first()) else {
            return 0;
        };
        let (xs, ys) = (x.shape(), y.shape());
        // [.., m, k] @ [.., k, n]: lhs elements * n, or rhs elements * m when rhs carries the batch.
        let macs = xs
            .num_elements()
            .saturating_mul(ys[r - 1])
            .max(ys.num_elements().saturating_mul(xs[r - 2]));
        (macs / crate::inner::MATMUL_WORK_PER_ELEMENT)
            .max(xs.num_elements())
            .max(ys.num_elements())
    };
    // Whole-mesh sizes: the decision is the one-process run's on every process count.
    let elements = stack::whole_mesh_stack_elements;
    // Whether one process holding the whole mesh as virtual devices would contract the stacked
    // operands in one matmul (a partial output whose products outnumber the operands, every
    // operand stackable): the deferred partial products below.
    let one_process_contracts = || {
        s.output.is_partial()
            && dispatch::would_hold_stacked::<B>(&s.output, &shape)
            && dispatch::would_hold_stacked::<B>(&s.inputs[0], &lhs.shape)
            && dispatch::would_hold_stacked::<B>(&s.inputs[1], &rhs.shape)
            && stack::contracts(
                elements(&s.output, &shape),
                elements(&s.inputs[0], &lhs.shape),
                elements(&s.inputs[1], &rhs.shape),
            )
    };
    // Across processes, with the ordered reduction, the same contraction: the contracting dim is
    // gathered on both operands and the whole matmul computed once per process: the one-process
    // run's arithmetic, bitwise, and fewer bytes than gathering every partial product. Where
    // the left operand's rows are free, each device computes only its block of them (every
    // element still summed over the whole contracting dim in the matmul's order), and the
    // output is gathered: a fraction of the multiply-adds on each process. Only where the
    // inner GEMM is known to compute each element alike whatever the rows (NdArray).
    if lhs.layout.mesh.multi
        && crate::config::config().reduction == crate::config::Reduction::Ordered
        && one_process_contracts()
    {
        let g = rules::matmul::gathered_contraction(&s);
        let split = crate::inner::rows_split_exactly::<B>()
            .then(|| rules::matmul::row_split_contraction(&s, &lhs.shape))
            .flatten();
        let run = split.as_ref().unwrap_or(&g);
        // Stacked where the process holds several positions: one product per distinct weight
        // shard, as per position, and the output already in the stacked form its consumer (the
        // optimizer's update of a stacked parameter) reads.
        let out = run2_weighted::<B, K, K, K>(
            lhs,
            rhs,
            run,
            shape,
            true,
            weigh,
            move |at, x, y| match at {
                At::Stacked(k) => stack::matmul::<B, K>(x, y, k, &f),
                At::Device(_) => f(x, y),
            },
        );
        return match split {
            Some(_) => crate::redistribute::redistribute::<B, K>(out, &g.output)
                .unwrap_or_else(|e| panic!("burn-dtensor: {e}")),
            None => out,
        };
    }
    if s.output.mesh.stacked && !s.output.mesh.multi && one_process_contracts() {
        let x = execute_stacked::<B, K>(lhs, &s.inputs[0]);
        let y = execute_stacked::<B, K>(rhs, &s.inputs[1]);
        let k = s.output.mesh.ndim();
        let axes: Vec<usize> = (0..k).filter(|&a| s.output.partial[a].is_some()).collect();
        let reduced = stack::contract::<B, K>(x.clone(), y.clone(), k, &axes, f);
        return DTensor::deferred(shape, s.output.clone(), reduced, move || {
            stack::matmul::<B, K>(x.clone(), y.clone(), k, f)
        });
    }
    // Stacked: the leading mesh dims are batch dims, folded into rows where `stack::matmul` can.
    run2_weighted::<B, K, K, K>(lhs, rhs, &s, shape, true, weigh, |at, x, y| {
        let (xs, ys) = (x.shape(), y.shape());
        if xs.num_elements() > 0 && ys.num_elements() > 0 {
            return match at {
                At::Stacked(k) => stack::matmul::<B, K>(x, y, k, &f),
                At::Device(_) => f(x, y),
            };
        }
        let r = xs.num_dims();
        let mut out: Vec<usize> = (0..r - 2).map(|d| bcast(xs[d], ys[d])).collect();
        out.extend([xs[r - 2], ys[r - 1]]);
        K::zeros(out.into(), &K::device(&x), x.dtype())
    })
}

/// `permute(axes)`.
pub fn permute<B: Backend, K: Kind<B>>(t: DTensor<K::P>, axes: &[usize]) -> DTensor<K::P> {
    if is_solo(&t) {
        return solo_map(t, |x| K::permute(x, axes));
    }
    let t = settled::<B, K>(t);
    let s = rules::memoised(rules::Rule::Permute, &[(&t.layout, &t.shape)], axes, || {
        view::permute(&t.layout, axes)
    });
    let shape = axes.iter().map(|&a| t.shape[a]).collect();
    run1::<B, K, K>(t, &s, shape, true, |at, x| K::permute(x, &at.axes(axes)))
}

/// `swap_dims(d1, d2)`, as the permutation that swaps them.
pub fn swap_dims<B: Backend, K: Kind<B>>(t: DTensor<K::P>, d1: usize, d2: usize) -> DTensor<K::P> {
    let mut axes: Vec<usize> = (0..t.shape.len()).collect();
    axes.swap(d1, d2);
    permute::<B, K>(t, &axes)
}

/// `reshape(shape)`.
pub fn reshape<B: Backend, K: Kind<B>>(t: DTensor<K::P>, new: Vec<usize>) -> DTensor<K::P> {
    if is_solo(&t) {
        return solo_map(t, |x| K::reshape(x, new.into()));
    }
    let t = settled::<B, K>(t);
    if t.shape == new {
        return t;
    }
    let s = rules::memoised(rules::Rule::Reshape, &[(&t.layout, &t.shape)], &new, || {
        view::reshape(&t.layout, &t.shape, &new)
    });
    let out = s.output.clone();
    run1::<B, K, K>(t, &s, new.clone(), true, |at, x| {
        K::reshape(x, at.shape(&out, &new).into())
    })
}

/// `expand(shape)`.
pub fn expand<B: Backend, K: Kind<B>>(
    t: DTensor<K::P>,
    new: Vec<usize>,
    f: impl Fn(K::P, burn::tensor::Shape) -> K::P + Sync,
) -> DTensor<K::P> {
    if is_solo(&t) {
        return solo_map(t, |x| f(x, new.into()));
    }
    let t = settled::<B, K>(t);
    let s = view::expand(&t.layout, &t.shape, &new);
    let out = s.output.clone();
    let added = new.len() - t.shape.len();
    run1::<B, K, K>(t, &s, new.clone(), true, |at, x| {
        // Stacked, the new leading tensor dims go between the mesh dims and the shard dims.
        let x = match at {
            At::Stacked(k) if added > 0 => {
                let xs = x.shape();
                let with_ones: Vec<usize> = xs[..k]
                    .iter()
                    .copied()
                    .chain(std::iter::repeat_n(1, added))
                    .chain(xs[k..].iter().copied())
                    .collect();
                K::reshape(x, with_ones.into())
            }
            _ => x,
        };
        f(x, at.shape(&out, &new).into())
    })
}

/// `unfold(dim, size, step)`: windows along a whole `dim`, appended as a new last dim.
pub fn unfold<B: Backend, K: Kind<B>>(
    t: DTensor<K::P>,
    dim: usize,
    size: usize,
    step: usize,
    f: impl Fn(K::P) -> K::P + Sync,
) -> DTensor<K::P> {
    let mut s = rules::along_dims(&t.layout, &[dim]);
    std::sync::Arc::make_mut(&mut s.output).dims.push(None);
    let mut shape = t.shape.clone();
    shape[dim] = (shape[dim].saturating_sub(size)) / step + 1;
    shape.push(size);
    run1::<B, K, K>(t, &s, shape, false, |_, x| f(x))
}

fn local_slices(slices: &[Slice], l: &Layout) -> Vec<Slice> {
    slices
        .iter()
        .enumerate()
        .map(|(d, s)| {
            if l.dims[d].is_some() {
                Slice::full()
            } else {
                *s
            }
        })
        .collect()
}

/// `slice(slices)`.
pub fn slice<B: Backend, K: Kind<B>>(t: DTensor<K::P>, slices: &[Slice]) -> DTensor<K::P> {
    if is_solo(&t) {
        return solo_map(t, |x| K::slice(x, slices));
    }
    let t = settled::<B, K>(t);
    let s = index::slice(&t.layout, &t.shape, slices);
    let shape = t
        .shape
        .iter()
        .enumerate()
        .map(|(d, &n)| slices.get(d).map_or(n, |s| s.output_size(n)))
        .collect();
    let local = local_slices(slices, &s.inputs[0]);
    run1::<B, K, K>(t, &s, shape, true, |at, x| K::slice(x, &at.slices(&local)))
}

/// `slice_assign(t, slices, value)`.
pub fn slice_assign<B: Backend, K: Kind<B>>(
    t: DTensor<K::P>,
    slices: &[Slice],
    value: DTensor<K::P>,
    f: impl Fn(K::P, &[Slice], K::P) -> K::P + Sync,
) -> DTensor<K::P> {
    same_mesh(&t.layout, &value.layout);
    let s = index::slice_assign(&t.layout, &t.shape, slices);
    let local = local_slices(slices, &s.inputs[0]);
    let shape = t.shape.clone();
    run2::<B, K, K, K>(t, value, &s, shape, true, |at, x, v| {
        f(x, &at.slices(&local), v)
    })
}

/// Whether `a` and `b` have the same shape except on `dim`.
fn same_off(a: &[usize], b: &[usize], dim: usize) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .enumerate()
            .all(|(d, (x, y))| d == dim || x == y)
}

/// `gather(dim, t, indices)`: masked per device when `t`'s `dim` is sharded
/// ([`index::gather_sharded`]); per shard when `indices` matches `t` off `dim`, else fallback.
pub fn gather<B: Backend, K: Kind<B>, KI: Kind<B, P = IntTensor<B>>>(
    dim: usize,
    t: DTensor<K::P>,
    idx: DTensor<KI::P>,
    f: impl Fn(usize, K::P, KI::P) -> K::P + Sync,
) -> DTensor<K::P> {
    same_mesh(&t.layout, &idx.layout);
    if is_solo(&t) {
        return solo_map(t, |x| f(dim, x, only(idx)));
    }
    let aligned = same_off(&t.shape, &idx.shape, dim);
    if aligned
        && let Some(s) = index::gather_sharded(
            &t.layout,
            &t.shape,
            &idx.layout,
            &idx.shape,
            dim,
            K::PENDING_SUM,
        )
    {
        let rows = rows_of(&s.inputs[0], &t.shape, dim);
        let shape = idx.shape.clone();
        return run2::<B, K, KI, K>(t, idx, &s, shape, false, |at, x, i| {
            let (local, outside) = local_indices::<B>(i, rows(at));
            K::identity_where(f(dim, x, local), outside)
        });
    }
    let s = if aligned {
        index::along_dim_aligned(&[&t.layout, &idx.layout], dim)
    } else {
        fallback::replicate(&[&t.layout, &idx.layout], idx.shape.len())
    };
    let shape = idx.shape.clone();
    run2::<B, K, KI, K>(t, idx, &s, shape, true, |at, x, i| match at {
        At::Device(_) => f(dim, x, i),
        // Stacked: folded to the single device's rank around `dim` (see `stack::fold_along`).
        At::Stacked(k) => {
            let (xs, is) = (x.shape().to_vec(), i.shape().to_vec());
            match stack::fold_along(&[&xs, &is], dim + k) {
                Some((folded, d)) => {
                    let [fx, fi] = <[Vec<usize>; 2]>::try_from(folded).expect("two operands");
                    let out = f(d, K::reshape(x, fx.into()), KI::reshape(i, fi.into()));
                    K::reshape(out, is.into())
                }
                None => f(dim + k, x, i),
            }
        }
    })
}

/// `scatter_add(dim, t, indices, value)` (bool: `scatter_or`): masked per device when `t`'s
/// `dim` is sharded ([`index::scatter_sharded`]); per shard when the operands match off `dim`,
/// else fallback.
pub fn scatter<B: Backend, K: Kind<B>, KI: Kind<B, P = IntTensor<B>>>(
    dim: usize,
    t: DTensor<K::P>,
    idx: DTensor<KI::P>,
    value: DTensor<K::P>,
    f: impl Fn(usize, K::P, KI::P, K::P) -> K::P + Sync,
) -> DTensor<K::P> {
    same_mesh(&t.layout, &idx.layout);
    if is_solo(&t) {
        return solo_map(t, |x| f(dim, x, only(idx), only(value)));
    }
    let aligned = same_off(&t.shape, &idx.shape, dim) && idx.shape == value.shape;
    if aligned && let Some(s) = index::scatter_sharded(&t.layout, &t.shape, &idx.layout, dim) {
        let rows = rows_of(&s.inputs[0], &t.shape, dim);
        let shape = t.shape.clone();
        return run3::<B, K, KI, K, K>(t, idx, value, &s, shape, false, |at, x, i, v| {
            let (local, outside) = local_indices::<B>(i, rows(at));
            f(dim, x, local, K::identity_where(v, outside))
        });
    }
    let s = if aligned {
        index::along_dim_aligned(&[&t.layout, &idx.layout, &value.layout], dim)
    } else {
        fallback::replicate(&[&t.layout, &idx.layout, &value.layout], t.shape.len())
    };
    let shape = t.shape.clone();
    run3::<B, K, KI, K, K>(t, idx, value, &s, shape, true, |at, x, i, v| match at {
        At::Device(_) => f(dim, x, i, v),
        // Stacked: folded as `gather` is.
        At::Stacked(k) => {
            let (xs, is, vs) = (x.shape().to_vec(), i.shape().to_vec(), v.shape().to_vec());
            match stack::fold_along(&[&xs, &is, &vs], dim + k) {
                Some((folded, d)) => {
                    let [fx, fi, fv] = <[Vec<usize>; 3]>::try_from(folded).expect("three operands");
                    let out = f(
                        d,
                        K::reshape(x, fx.into()),
                        KI::reshape(i, fi.into()),
                        K::reshape(v, fv.into()),
                    );
                    K::reshape(out, xs.into())
                }
                None => f(dim + k, x, i, v),
            }
        }
    })
}

/// `gather_nd(data, indices)` under [`index::gather_nd`] (per shard, never stacked: the indices
/// hold global coordinates of the indexed dims, which are whole on every device).
pub fn gather_nd<B: Backend, K: Kind<B>, KI: Kind<B>>(
    t: DTensor<K::P>,
    idx: DTensor<KI::P>,
    f: impl Fn(K::P, KI::P) -> K::P + Sync,
) -> DTensor<K::P> {
    same_mesh(&t.layout, &idx.layout);
    if is_solo(&t) {
        return solo_map(t, |x| f(x, only(idx)));
    }
    let m = idx.shape.len();
    let k = idx.shape[m - 1];
    let s = index::gather_nd(&t.layout, &idx.layout, k);
    let shape = idx.shape[..m - 1]
        .iter()
        .chain(&t.shape[k..])
        .copied()
        .collect();
    run2::<B, K, KI, K>(t, idx, &s, shape, false, |_, x, i| f(x, i))
}

/// `scatter_nd(data, indices, values, op)` under [`index::scatter_nd`] (per shard, not stacked).
pub fn scatter_nd<B: Backend, K: Kind<B>, KI: Kind<B>>(
    t: DTensor<K::P>,
    idx: DTensor<KI::P>,
    value: DTensor<K::P>,
    f: impl Fn(K::P, KI::P, K::P) -> K::P + Sync,
) -> DTensor<K::P> {
    same_mesh(&t.layout, &idx.layout);
    same_mesh(&t.layout, &value.layout);
    if is_solo(&t) {
        return solo_map(t, |x| f(x, only(idx), only(value)));
    }
    let k = idx.shape[idx.shape.len() - 1];
    let s = index::scatter_nd(&t.layout, &idx.layout, k);
    let shape = t.shape.clone();
    run3::<B, K, KI, K, K>(t, idx, value, &s, shape, false, |_, x, i, v| f(x, i, v))
}

/// `select(t, dim, indices)`: masked per device when `t`'s `dim` is sharded
/// ([`index::select_sharded`]), else [`index::select`] (the indices' sharding carried to `dim`).
pub fn select<B: Backend, K: Kind<B>, KI: Kind<B, P = IntTensor<B>>>(
    t: DTensor<K::P>,
    dim: usize,
    idx: DTensor<KI::P>,
    f: impl Fn(K::P, usize, KI::P) -> K::P + Sync,
) -> DTensor<K::P> {
    same_mesh(&t.layout, &idx.layout);
    if is_solo(&t) {
        return solo_map(t, |x| f(x, dim, only(idx)));
    }
    let mut shape = t.shape.clone();
    shape[dim] = idx.shape[0];
    if let Some(s) = index::select_sharded(
        &t.layout,
        &t.shape,
        &idx.layout,
        idx.shape[0],
        dim,
        K::PENDING_SUM,
    ) {
        let rows = rows_of(&s.inputs[0], &t.shape, dim);
        return run2::<B, K, KI, K>(t, idx, &s, shape, false, |at, x, i| {
            let (local, outside) = local_indices::<B>(i, rows(at));
            let out = f(x, dim, local);
            let outside = spread_along::<B>(outside, dim, &out.shape());
            K::identity_where(out, outside)
        });
    }
    let s = index::select(&t.layout, &idx.layout, dim);
    run2::<B, K, KI, K>(t, idx, &s, shape, false, |_, x, i| f(x, dim, i))
}

/// `select_add(t, dim, indices, value)` (bool: `select_or`): [`index::select_add`], masked per
/// device where it keeps `t`'s `dim` sharded.
pub fn select_assign<B: Backend, K: Kind<B>, KI: Kind<B, P = IntTensor<B>>>(
    t: DTensor<K::P>,
    dim: usize,
    idx: DTensor<KI::P>,
    value: DTensor<K::P>,
    f: impl Fn(K::P, usize, KI::P, K::P) -> K::P + Sync,
) -> DTensor<K::P> {
    same_mesh(&t.layout, &idx.layout);
    if is_solo(&t) {
        return solo_map(t, |x| f(x, dim, only(idx), only(value)));
    }
    let s = index::select_add(&t.layout, &t.shape, &idx.layout, dim, K::PENDING_SUM);
    let shape = t.shape.clone();
    if s.inputs[0].dims[dim].is_none() {
        return run3::<B, K, KI, K, K>(t, idx, value, &s, shape, false, |_, x, i, v| {
            f(x, dim, i, v)
        });
    }
    let rows = rows_of(&s.inputs[0], &t.shape, dim);
    run3::<B, K, KI, K, K>(t, idx, value, &s, shape, false, |at, x, i, v| {
        let (local, outside) = local_indices::<B>(i, rows(at));
        let outside = spread_along::<B>(outside, dim, &v.shape());
        f(x, dim, local, K::identity_where(v, outside))
    })
}

/// The rows `lo..hi` of `dim` that the device an op runs at holds of a tensor of global `shape`
/// under `layout` (the masked index rules run per device, never stacked).
pub(crate) fn rows_of(
    layout: &Layout,
    shape: &[usize],
    dim: usize,
) -> impl Fn(At) -> std::ops::Range<usize> + Sync + use<> {
    let (layout, shape) = (layout.clone(), shape.to_vec());
    move |at| {
        let At::Device(g) = at else {
            unreachable!("the masked index ops run per device")
        };
        layout.shard_ranges(&shape, g)[dim].clone()
    }
}

/// Indices made local to the rows `rows` of an indexed dim a device holds: `index - rows.start`,
/// or 0 where the index is outside them (any row the device holds: its value is masked); and the
/// mask of those outside, of the indices' shape.
pub(crate) fn local_indices<B: Backend>(
    ids: IntTensor<B>,
    rows: std::ops::Range<usize>,
) -> (IntTensor<B>, BoolTensor<B>) {
    let dt = burn::tensor::get_device_settings::<B>(&B::int_device(&ids)).bool_dtype;
    let (lo, hi) = (
        Scalar::from(rows.start as i64),
        Scalar::from(rows.end as i64),
    );
    let inside = B::bool_and(
        B::int_greater_equal_elem(ids.clone(), lo, dt),
        B::int_lower_elem(ids.clone(), hi, dt),
    );
    let outside = B::bool_not(inside);
    // Outside indices become `lo` before the subtraction: no unsigned index underflows.
    let local = B::int_sub_scalar(B::int_mask_fill(ids, outside.clone(), lo), lo);
    (local, outside)
}

/// A mask `[n]` over the indices of `select` spread along `dim` of a tensor of `shape` (whose
/// `dim` is `n`).
fn spread_along<B: Backend>(mask: BoolTensor<B>, dim: usize, shape: &Shape) -> BoolTensor<B> {
    let mut lined = vec![1; shape.num_dims()];
    lined[dim] = shape[dim];
    B::bool_expand(B::bool_reshape(mask, lined.into()), shape.clone())
}

/// `cat(tensors, dim)`: `dim` whole, other dims aligned with the first tensor.
pub fn cat<B: Backend, K: Kind<B>>(ts: Vec<DTensor<K::P>>, dim: usize) -> DTensor<K::P> {
    ts.iter().for_each(|t| same_mesh(&ts[0].layout, &t.layout));
    let s = index::cat(&ts.iter().map(|t| &*t.layout).collect::<Vec<_>>(), dim);
    let mut shape = ts[0].shape.clone();
    shape[dim] = ts.iter().map(|t| t.shape[dim]).sum();
    run_n::<B, K, K>(ts, &s, shape, true, |at, parts| {
        K::cat(parts, dim + at.off())
    })
}

/// `repeat_dim(dim, times)`.
pub fn repeat_dim<B: Backend, K: Kind<B>>(
    t: DTensor<K::P>,
    dim: usize,
    times: usize,
    f: impl Fn(K::P) -> K::P + Sync,
) -> DTensor<K::P> {
    let mut shape = t.shape.clone();
    shape[dim] *= times;
    along::<B, K, K>(t, &[dim], shape, f)
}

/// The mesh of a tensor (from the registry, by its topology id).
pub fn mesh_of<B: Backend, P>(t: &DTensor<P>) -> Mesh<B::Device> {
    Mesh::from_registry(t.layout.mesh.id).expect("tensor on an unregistered mesh")
}

/// The device of a tensor: its mesh.
pub fn device<B: Backend, P>(t: &DTensor<P>) -> DistributedDevice<B::Device> {
    DistributedDevice::new(mesh_of::<B, P>(t))
}

/// Uploads host data replicated on every device of the mesh (once per distinct inner device),
/// or, on a mesh with a creation-layout policy ([`Mesh::with_creation_sharding`]), with each
/// device receiving only its chunk of the policy's layout.
pub fn from_data<B: Backend, K: Kind<B>>(
    data: TensorData,
    device: &DistributedDevice<B::Device>,
) -> DTensor<K::P> {
    let layout = crate::creation::layout_for(device.mesh.topology(), &data.shape.to_vec());
    distribute::<B, K>(data, &device.mesh, &layout)
        .expect("a created layout of the data's own rank on its own mesh")
}

/// Uploads host data with each device receiving only its chunk under `layout`.
///
/// # Errors
/// Rank mismatch, or unsupported (quantized) data.
pub fn distribute<B: Backend, K: Kind<B>>(
    data: TensorData,
    mesh: &Mesh<B::Device>,
    layout: &Layout,
) -> crate::Result<DTensor<K::P>> {
    let shape = data.shape.to_vec();
    layout.check_rank(shape.len())?;
    if layout.mesh.id != mesh.id() {
        return Err(crate::DTensorError::MeshMismatch {
            from: layout.mesh.to_string(),
            to: mesh.to_string(),
        });
    }
    let settled = layout.without_partial();
    if dispatch::holds_stacked::<B>(&settled, &shape) {
        // Stacked: the shards laid out in the stacked form on the host (one host copy, none when
        // they tile the buffer in order: replicated, or a split of dim 0), one upload of a
        // contiguous stack; then the pending reductions of a partial `layout`, if any. Local
        // chunks on the device would leave a permuted view where a dim is sharded on an axis
        // after the first (spatial mode's features), which backends then copy element by
        // element.
        let target = stack::stack_shape(&settled, &shape);
        let boxes: Vec<_> = stack::local_representatives(&settled)
            .map(|(_, i)| local_ranges(&settled, &shape, i))
            .collect();
        // On Flex, a process holding the whole mesh takes the global buffer as it is and views
        // it as the stack (`stack::global_split`), where the boxes would be copied: the GEMMs
        // and the contraction's merge read such a view as it lies.
        let global = (crate::inner::row_blocks_in_memory::<B>()
            && !settled.mesh.multi
            && !matches!(data.dtype, burn::tensor::DType::QFloat(_))
            && !host::consecutive(&shape, &boxes))
        .then(|| stack::global_split(&settled, &target))
        .filter(|(split, order)| crate::collective::stacked::permutes_by_runs(split, order));
        // Else, on Flex, the row blocks go one after the other in memory, the stack a permuted
        // view of them (`stack::rows_inner_order`: a later contraction over the rows merges them
        // without a copy).
        let rows_inner = || {
            crate::inner::row_blocks_in_memory::<B>()
                .then(|| stack::rows_inner_order(&settled, &target))
                .flatten()
        };
        let p = if let Some((split, order)) = global {
            let whole = K::reshape(K::from_data(data, &mesh.devices()[0]), split.into());
            K::permute(whole, &order)
        } else if let Some(order) = rows_inner() {
            // The boxes (one per stack position, row-major over its mesh dims) in memory
            // order: the stack's mesh dims permuted as `order` permutes them.
            let k = settled.mesh.ndim();
            let mut in_memory = Vec::with_capacity(boxes.len());
            host::for_each_permuted_run(&target[..k], &order[..k], &mut |s, n| {
                in_memory.extend_from_slice(&boxes[s..s + n])
            });
            let memory: Vec<usize> = order.iter().map(|&d| target[d]).collect();
            let buffer = K::from_data(host::stack(data, &in_memory, memory)?, &mesh.devices()[0]);
            K::permute(buffer, &host::inverse_permutation(&order))
        } else {
            K::from_data(host::stack(data, &boxes, target)?, &mesh.devices()[0])
        };
        let t = stack::output(shape, settled, p);
        return if layout.is_partial() {
            crate::redistribute::redistribute::<B, K>(t, layout)
        } else {
            Ok(t)
        };
    }
    let plan = super::dispatch::dedupe_plan(&[&settled], mesh.devices());
    let n = mesh.devices().len();
    let computed: Vec<usize> = (0..n).filter(|&i| plan[i].is_none()).collect();
    let mut data = Some(data);
    let mut shards: Vec<K::P> = Vec::with_capacity(n);
    for (i, dev) in mesh.devices().iter().enumerate() {
        let p = match plan[i] {
            Some(j) => shards[j].clone(),
            None => {
                // A device holding the whole tensor gets the host buffer itself on the last upload
                // (no copy on a single device or a mesh of one), a copy before; a sharded one
                // copies only its chunk.
                let ranges = local_ranges(&settled, &shape, layout.mesh.global(i));
                let whole = ranges
                    .iter()
                    .zip(&shape)
                    .all(|(r, &n)| r.start == 0 && r.end == n);
                let d = match (whole, computed.last() == Some(&i)) {
                    (true, true) => data.take().expect("host data"),
                    (true, false) => data.clone().expect("host data"),
                    (false, _) => host::extract(data.as_ref().expect("host data"), &ranges)?,
                };
                K::from_data(d, dev)
            }
        };
        shards.push(p);
    }
    let t = DTensor::from_parts(shape, settled, shards);
    Ok(if layout.is_partial() {
        crate::redistribute::execute::<B, K>(t, layout)
    } else {
        t
    })
}

/// Downloads the global tensor: partial results are reduced on the mesh, then one device per
/// distinct chunk is read and the chunks are assembled on the host (no device collective).
///
/// On a multi-process mesh every process gets the whole global value: the tensor is all-gathered
/// to replicated (in process, then across processes), then read from its first shard.
pub fn into_data<B: Backend, K: Kind<B>>(t: DTensor<K::P>) -> TensorData {
    if t.layout.mesh.multi {
        let whole = Layout::replicated_on(&t.layout.mesh, t.shape.len());
        let t = crate::redistribute::execute::<B, K>(t, &whole);
        let first = t
            .into_per_device()
            .into_iter()
            .next()
            .expect("a process owns a position");
        return K::into_data(first);
    }
    let t = if t.layout.is_partial() {
        crate::redistribute::execute::<B, K>(t.clone(), &t.layout.without_partial())
    } else {
        stack::to_per_device::<B, K>(t)
    };
    // One device per chunk (the layout is settled: its used axes are the sharding ones).
    let per = t.per_device();
    let pieces = stack::local_representatives(&t.layout)
        .map(|(j, i)| {
            (
                local_ranges(&t.layout, &t.shape, i),
                K::into_data(per[j].clone()),
            )
        })
        .collect();
    host::assemble(&t.shape, pieces).expect("assembling shards on the host")
}

/// Moves a tensor to another mesh, in the layout a tensor of its shape created there gets
/// ([`crate::creation`]: a scoped creation layout, else the mesh's creation policy), or returns
/// it when already there. Shard to shard (see [`crate::redistribute::redistribute`]): no device
/// holds more than its target shard.
pub fn to_device<B: Backend, K: Kind<B>>(
    t: DTensor<K::P>,
    device: &DistributedDevice<B::Device>,
) -> DTensor<K::P> {
    if t.layout.mesh.id == device.mesh.id() {
        return t;
    }
    let layout = crate::creation::layout_for(device.mesh.topology(), &t.shape);
    crate::redistribute::redistribute::<B, K>(t, &layout)
        .unwrap_or_else(|e| panic!("burn-dtensor: moving a tensor to another mesh: {e}"))
}

#[cfg(test)]
mod tests {
    /// A distributed input with its rows on `a` and its columns on `b` is held on Flex as a
    /// permuted view of its row blocks (`rows_inner_order`), on NdArray as the stack itself
    /// (`inner::row_blocks_in_memory`); either way every shard holds its own block of the global
    /// tensor.
    #[cfg(any(feature = "flex", feature = "ndarray"))]
    fn input_row_blocks_in_memory<B: burn::tensor::backend::Backend>(view: bool) {
        use burn::tensor::{TensorData, TensorMetadata};

        use crate::tensor::{FloatKind, Kind, Shards};
        use crate::{Layout, Mesh};
        let devices = vec![B::Device::default(); 8];
        let m = Mesh::new([("a", 2), ("b", 2), ("c", 2)], devices).unwrap();
        let data = TensorData::new((0..48).map(|i| i as f32).collect::<Vec<_>>(), [8, 6]);
        let l = Layout::new(&m, ["a", "b"]).unwrap();
        let t = super::distribute::<B, FloatKind>(data.clone(), &m, &l).unwrap();
        let Shards::Stacked(p) = &t.shards else {
            panic!("a stacked mesh holds the input stacked")
        };
        assert_eq!(p.shape().to_vec(), vec![2, 2, 1, 4, 3]);
        assert_eq!(
            crate::inner::row_major_order(p),
            view.then(|| vec![1, 0, 2, 3, 4])
        );
        let whole = data.to_vec::<f32>().unwrap();
        let t = crate::stack::to_per_device::<B, FloatKind>(t);
        for (i, shard) in t.per_device().iter().enumerate() {
            let (ra, cb) = (i / 4, (i / 2) % 2);
            let want: Vec<f32> = (0..4)
                .flat_map(|r| (0..3).map(move |c| (ra * 4 + r) * 6 + cb * 3 + c))
                .map(|k| whole[k])
                .collect();
            let got = <FloatKind as Kind<B>>::into_data(shard.clone())
                .to_vec::<f32>()
                .unwrap();
            assert_eq!(got, want, "device {i}");
        }
    }

    #[cfg(feature = "flex")]
    #[test]
    fn flex_input_row_blocks_in_memory() {
        input_row_blocks_in_memory::<burn_flex::Flex>(true);
    }

    #[cfg(feature = "ndarray")]
    #[test]
    fn ndarray_input_row_blocks_in_memory() {
        input_row_blocks_in_memory::<burn_ndarray::NdArray>(false);
    }
}
