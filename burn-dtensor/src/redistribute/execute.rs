//! Running a relayout plan on the shards of a tensor.

use std::sync::Arc;

use burn::tensor::TensorMetadata;
use burn::tensor::backend::Backend;

use super::plan::{Step, plan};
use crate::collective;
use crate::error::Result;
use crate::layout::{Layout, ReduceOp};
use crate::stack;
use crate::tensor::{DTensor, Kind, Shards};

/// Relayouts `t` to `to`, running the collectives the two layouts imply.
///
/// A partial tensor that is fully reduced keeps the reduced value memoised, shared by its
/// clones, so two consumers trigger one all-reduce. The last pure all-gather made on the calling
/// thread is memoised too (see `reuse`): the same tensor gathered to the same layout again right
/// after is not communicated twice.
///
/// A `to` on another mesh moves the tensor there shard to shard (see `transfer`): no device
/// and no process holds more of it than its source and target shards.
///
/// # Errors
/// [`DTensorError::RankMismatch`](crate::DTensorError::RankMismatch);
/// [`DTensorError::UnknownMesh`](crate::DTensorError::UnknownMesh) for a `to` on a mesh of
/// another device type.
///
/// The result keeps the input's form (per device or stacked, see [`crate::stack`]), except that
/// a stacked tensor goes per device when `to` cannot be held stacked (an uneven split).
pub fn redistribute<B: Backend, K: Kind<B>>(
    t: DTensor<K::P>,
    to: &Layout,
) -> Result<DTensor<K::P>> {
    if *t.layout == *to {
        return Ok(t);
    }
    if t.layout.mesh.id != to.mesh.id {
        return super::transfer::to_other_mesh::<B, K>(t, to);
    }
    let steps = plan(&t.layout, to)?;
    // A pending sum already settled (memoised, or settled from the tensor it was derived from;
    // see `Memo`) starts from that value, whatever settled layout `to` is.
    if !to.is_partial()
        && let Some(v) = t.reduced.as_ref().and_then(|m| m.get())
    {
        return redistribute::<B, K>(v.clone(), to);
    }
    if let Some(r) = from_reduced::<B, K>(&t, to, &steps) {
        return Ok(r);
    }
    let t = if t.is_stacked() && !stack::stackable(to, &t.shape) {
        stack::to_per_device::<B, K>(t)
    } else {
        t
    };
    // A pending sum with a settle layout (see `DTensor::settle_to`) settles there first, once
    // for all its consumers, whatever they ask for.
    let hinted = t.layout.is_partial() && !to.is_partial() && t.settle_to.is_some();
    let reduces_all = hinted
        || (t.layout.is_partial()
            && steps
                .iter()
                .all(|s| !matches!(s, Step::ReduceScatter { .. }))
            && !to.is_partial());
    if reduces_all {
        let settled = match &t.settle_to {
            Some(l) if hinted => (**l).clone(),
            _ => t.layout.without_partial(),
        };
        let reduce = |t: DTensor<K::P>| {
            let t = if t.is_stacked() && !stack::stackable(&settled, &t.shape) {
                stack::to_per_device::<B, K>(t)
            } else {
                t
            };
            let steps = plan(&t.layout, &settled).unwrap();
            run::<B, K>(t, &settled, &steps)
        };
        let reduced = match &t.reduced {
            // A clone of this tensor may settle it too: memoised, one all-reduce for both.
            // So may a tensor derived from it while it was pending (see `Memo`), settled
            // from its value.
            Some(memo)
                if Arc::strong_count(memo) > 1 || memo.get().is_some() || memo.has_derived() =>
            {
                memo.get_or_settle(|| reduce(t.clone())).clone()
            }
            // No clone shares the memo: the shards are moved into the reduction, which can then
            // write in place into memory no other tensor reads (`collective::across`).
            _ => reduce(t),
        };
        return redistribute::<B, K>(reduced, to);
    }
    if steps.iter().all(|s| matches!(s, Step::AllGather { .. })) {
        if let Some(r) = super::reuse::get(&t, to) {
            return Ok(r);
        }
        let src = super::reuse::key(&t);
        let r = run::<B, K>(t, to, &steps);
        super::reuse::put(src, to, &r);
        return Ok(r);
    }
    Ok(run::<B, K>(t, to, &steps))
}

/// As [`redistribute`] for layouts already known to share the mesh and rank, with the result in
/// per-device form.
///
/// # Panics
/// On a mesh or rank mismatch (an internal bug: sharding rules only produce valid layouts).
pub fn execute<B: Backend, K: Kind<B>>(t: DTensor<K::P>, to: &Layout) -> DTensor<K::P> {
    stack::to_per_device::<B, K>(
        redistribute::<B, K>(t, to).unwrap_or_else(|e| panic!("burn-dtensor: {e}")),
    )
}

/// As [`execute`], with the result as the stacked primitive; `to` must be
/// [`stackable`](stack::stackable) for the tensor's shape. A tensor whose own layout is stackable
/// is stacked first and relaid out on the stack; one whose layout is not is relaid out per device,
/// then stacked.
pub fn execute_stacked<B: Backend, K: Kind<B>>(t: DTensor<K::P>, to: &Layout) -> K::P {
    let t = if !t.is_stacked() && stack::stackable(&t.layout, &t.shape) {
        stack::to_stacked::<B, K>(t)
    } else {
        t
    };
    let r = redistribute::<B, K>(t, to).unwrap_or_else(|e| panic!("burn-dtensor: {e}"));
    stack::to_stacked::<B, K>(r).into_stack()
}

/// Deferred shards (see `Deferred`) whose every pending sum the plan reduces, with at least one
/// reduce-scatter (FSDP's gradient, or a partial product meeting a sharded operand):
/// the reductions are recorded and the reduced value taken, and a reduce-scatter becomes the
/// local chunk of it. Summing the per-shard products instead would round differently from the
/// one contraction over the whole dim, which a multi-process mesh computes
/// (`rules::matmul::gathered_contraction`): one process and several agree bitwise. `None` for
/// any other tensor or plan.
fn from_reduced<B: Backend, K: Kind<B>>(
    t: &DTensor<K::P>,
    to: &Layout,
    steps: &[Step],
) -> Option<DTensor<K::P>> {
    let Shards::Deferred(d) = &t.shards else {
        return None;
    };
    // A plan of full reductions goes through the memoised reduction (two consumers, one
    // all-reduce), which takes the reduced value too (`run`).
    if !steps
        .iter()
        .any(|s| matches!(s, Step::ReduceScatter { .. }))
    {
        return None;
    }
    let reduced_axes: Vec<usize> = steps
        .iter()
        .filter_map(|s| match *s {
            Step::AllReduce { axis, .. } | Step::ReduceScatter { axis, .. } => Some(axis),
            _ => None,
        })
        .collect();
    if !(0..t.layout.mesh.ndim())
        .filter(|&a| t.layout.partial[a].is_some())
        .all(|a| reduced_axes.contains(&a))
    {
        return None;
    }
    // The plan with its reductions recorded and taken from the reduced value: an all-reduce
    // drops out, a reduce-scatter becomes the local chunk; the other steps run as planned, in
    // order, so every collective moves and records what it would have.
    let topo = &t.layout.mesh;
    let rest: Vec<Step> = steps
        .iter()
        .filter_map(|s| match *s {
            Step::AllReduce { axis, .. } => {
                collective::stacked::record_all_reduce(&d.reduced, topo, axis, &t.shape);
                None
            }
            Step::ReduceScatter { axis, dim, .. } => {
                collective::stacked::record_reduce_scatter(&d.reduced, topo, axis, &t.shape);
                Some(Step::LocalChunk { axis, dim })
            }
            _ => Some(s.clone()),
        })
        .collect();
    let whole = stack::output(
        t.shape.clone(),
        t.layout.without_partial(),
        d.reduced.clone(),
    );
    let whole = if stack::stackable(to, &t.shape) {
        whole
    } else {
        stack::to_per_device::<B, K>(whole)
    };
    Some(run::<B, K>(whole, to, &rest))
}

fn run<B: Backend, K: Kind<B>>(t: DTensor<K::P>, to: &Layout, steps: &[Step]) -> DTensor<K::P> {
    // Deferred shards (see `Deferred`) settled in full: the all-reduces are recorded and the
    // reduced value taken; any other relayout computes the shards first.
    if let Shards::Deferred(d) = &t.shards
        && *to == t.layout.without_partial()
        && steps.iter().all(|s| matches!(s, Step::AllReduce { .. }))
    {
        let topo = &t.layout.mesh;
        for s in steps {
            if let Step::AllReduce { axis, .. } = *s {
                collective::stacked::record_all_reduce(&d.reduced, topo, axis, &t.shape);
            }
        }
        return stack::output(t.shape.clone(), to.clone(), d.reduced.clone());
    }
    if t.is_stacked() {
        // On the stack, in mesh coordinate order, as one process holding the mesh does; along
        // an axis that spans processes, one exchange for all of this process's groups.
        return run_stacked::<B, K>(t, to, steps);
    }
    let topo = t.layout.mesh.clone();
    let shape = t.shape.clone();
    let mut shards = t.into_per_device();
    for step in steps {
        match *step {
            Step::AllReduce { axis, op } => {
                collective::all_reduce::<B, K>(&mut shards, &topo, axis, op, &shape)
            }
            Step::ReduceScatter { axis, op, dim } => {
                collective::reduce_scatter::<B, K>(&mut shards, &topo, axis, op, dim, &shape)
            }
            Step::AllGather { axis, dim } => {
                collective::all_gather::<B, K>(&mut shards, &topo, axis, dim, &shape)
            }
            Step::AllToAll { axis, from, to } => {
                collective::all_to_all::<B, K>(&mut shards, &topo, axis, from, to, &shape)
            }
            Step::LocalChunk { axis, dim } => {
                collective::local_chunk::<B, K>(&mut shards, &topo, axis, dim)
            }
            Step::PadPartial { axis, dim } => {
                collective::pad_partial::<B, K>(&mut shards, &topo, axis, dim, shape[dim])
            }
            Step::MakePartial { axis, op } => {
                if op == ReduceOp::Sum {
                    for (i, s) in shards.iter_mut().enumerate() {
                        if topo.coord(topo.global(i), axis) != 0 {
                            *s = K::zeros(s.shape(), &K::device(s), s.dtype());
                        }
                    }
                }
            }
        }
    }
    DTensor::from_parts(shape, to.clone(), shards)
}

fn run_stacked<B: Backend, K: Kind<B>>(
    t: DTensor<K::P>,
    to: &Layout,
    steps: &[Step],
) -> DTensor<K::P> {
    use collective::stacked as c;
    let topo = t.layout.mesh.clone();
    let shape = t.shape.clone();
    let mut x = t.into_stack();
    for step in steps {
        x = match *step {
            Step::AllReduce { axis, op } => match collective::across::group(&topo, axis) {
                Some(pg) => c::all_reduce_across::<B, K>(x, &topo, axis, op, &shape, pg),
                None => c::all_reduce::<B, K>(x, &topo, axis, op, &shape),
            },
            Step::ReduceScatter { axis, op, dim } => match collective::across::group(&topo, axis) {
                Some(pg) => c::reduce_scatter_across::<B, K>(x, &topo, (axis, op), dim, &shape, pg),
                None => c::reduce_scatter::<B, K>(x, &topo, axis, op, dim, &shape),
            },
            Step::AllGather { axis, dim } => match collective::across::group(&topo, axis) {
                Some(pg) => c::all_gather_across::<B, K>(x, &topo, axis, dim, &shape, pg),
                None => c::all_gather::<B, K>(x, &topo, axis, dim, &shape),
            },
            Step::AllToAll { axis, from, to } => match collective::across::group(&topo, axis) {
                Some(pg) => c::all_to_all_across::<B, K>(x, &topo, axis, (from, to), &shape, pg),
                None => c::all_to_all::<B, K>(x, &topo, axis, from, to, &shape),
            },
            Step::LocalChunk { axis, dim } => c::local_chunk::<B, K>(x, &topo, axis, dim),
            Step::MakePartial { axis, op } => c::make_partial::<B, K>(x, &topo, axis, op),
            Step::PadPartial { axis, dim } => c::pad_partial::<B, K>(x, &topo, axis, dim),
        };
    }
    stack::output(shape, to.clone(), x)
}
