//! Where a weight's gradient settles, and when: as soon as it is computed, where the layout
//! map sharded the weight over an axis its gradient is pending on (FSDP's reduce-scatter in the
//! backward pass).
//!
//! A weight gradient computed from batch-sharded activations is a pending sum over the batch
//! axis. Data parallelism keeps it pending (one all-reduce per gradient, settled with the others
//! by [`settle_gradients`](crate::settle_gradients)). FSDP (`Shard(0)` over the batch axis)
//! must not: PyTorch's FSDP reduce-scatters each gradient in a post-backward hook the moment
//! autodiff has it, so a full-size gradient lives only while its reduce-scatter runs and the
//! sharded gradients are all that accumulate. Without that, every gradient waits full-size for
//! the end of the backward pass, and a rank holds a whole model's gradients at once.
//!
//! Burn 0.21 has no gradient hooks, and its `linear_weight_backward(x, grad)` is not told which
//! weight the gradient belongs to. So the forward `linear` notes here the layout of the weight
//! each activation `x` met (by the tensor's id, which autodiff's saved copy shares), and the
//! backward settles onto that layout the pending axes that shard it (a reduce-scatter), keeping
//! the others pending. The embedding's backward is given its table, so it needs no note.
//!
//! Only weights sharded on some dim are noted, so a replicated model keeps this empty. One
//! activation may feed several weights (query, key and value): where their layouts differ, the
//! note is dropped and the gradients settle as before. The notes are per thread and bounded
//! (the oldest dropped first), so an inference loop that never runs a backward holds at most
//! [`CAPACITY`] layouts. Every rank runs the same ops in the same order, so the ranks of a
//! multi-process mesh make the same reduce-scatters at the same point.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::layout::{Layout, ReduceOp};

/// Notes kept per thread: a transformer of a hundred blocks notes six per block and step.
pub const CAPACITY: usize = 4096;

/// The weight layouts by activation id, shared with the weights (a note is a reference count,
/// and the table of a full memo, 4096 entries of 16 bytes, stays in cache: with `SipHash` and
/// owned layouts it cost about 2 µs a `linear` on the spatial IMDB step, NOTES.md).
#[derive(Default)]
struct Notes {
    layouts: HashMap<u64, Option<Arc<Layout>>, rustc_hash::FxBuildHasher>,
    order: VecDeque<u64>,
}

thread_local! {
    static NOTES: RefCell<Notes> = RefCell::new(Notes::default());
}

/// Notes that the activation with id `x` multiplied a weight laid out as `w`.
pub(super) fn note(x: u64, w: &Arc<Layout>) {
    if w.dims.iter().all(Option::is_none) {
        return;
    }
    NOTES.with(|n| {
        let mut n = n.borrow_mut();
        if let Some(seen) = n.layouts.get_mut(&x) {
            if seen
                .as_ref()
                .is_none_or(|s| !Arc::ptr_eq(s, w) && **s != **w)
            {
                *seen = None;
            }
            return;
        }
        if n.order.len() == CAPACITY
            && let Some(old) = n.order.pop_front()
        {
            n.layouts.remove(&old);
        }
        n.order.push_back(x);
        n.layouts.insert(x, Some(Arc::clone(w)));
    });
}

/// The layout of the one weight the activation with id `x` met, if noted.
pub(super) fn weight_of(x: u64) -> Option<Arc<Layout>> {
    NOTES.with(|n| n.borrow().layouts.get(&x).cloned().flatten())
}

/// Where a gradient in layout `g` of a weight laid out as `w` (same global shape) settles now:
/// `w`'s sharding, with the pending sums over the axes that shard `w` reduced (a reduce-scatter)
/// and the other pending sums kept. `None` where no pending sum is over an axis of `w`, or where
/// reaching `w` would gather a dim of `g` (it then settles later, as any gradient).
pub(super) fn settle_now(g: &Layout, w: &Layout) -> Option<Layout> {
    if g.rank() != w.rank()
        || g.partial
            .iter()
            .any(|p| p.is_some_and(|o| o != ReduceOp::Sum))
        || g.dims
            .iter()
            .zip(&w.dims)
            .any(|(a, b)| a.is_some() && a != b)
    {
        return None;
    }
    let mut to = w.without_partial();
    let mut scatters = false;
    for a in 0..g.mesh.ndim() {
        if g.partial(a).is_some() {
            if to.axis_dim(a).is_some() {
                scatters = true;
            } else {
                to = to.with_partial(a, ReduceOp::Sum);
            }
        }
    }
    scatters.then_some(to)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mesh::{Mesh, UNSHARDED};

    fn mesh() -> Mesh<()> {
        Mesh::new([("batch", 4), ("model", 2)], vec![(); 8]).unwrap()
    }

    /// FSDP (`[batch, -]`) and 2-D (`[batch, model]`) weights take their gradient's pending
    /// batch sum as a reduce-scatter now; a replicated or tensor-parallel weight leaves it
    /// pending; a gradient sharded where the weight is not is left alone.
    #[test]
    fn which_gradients_settle_now() {
        let m = mesh();
        let l = |dims: [&str; 2]| Layout::new(&m, dims).unwrap();
        let pending = |l: Layout, a: usize| l.with_partial(a, ReduceOp::Sum);
        let (b, md, u) = ("batch", "model", UNSHARDED);
        let fsdp = l([b, u]);
        assert_eq!(
            settle_now(&pending(l([u, u]), 0), &fsdp),
            Some(fsdp.clone())
        );
        let two_d = l([b, md]);
        assert_eq!(
            settle_now(&pending(l([u, md]), 0), &two_d),
            Some(two_d.clone())
        );
        // Pending over both axes, the weight sharded over one: that one settles now.
        let g = pending(pending(l([u, u]), 0), 1);
        assert_eq!(settle_now(&g, &fsdp), Some(pending(fsdp.clone(), 1)));
        let tp = l([u, md]);
        assert_eq!(settle_now(&pending(l([u, md]), 0), &tp), None);
        assert_eq!(settle_now(&pending(l([u, u]), 0), &l([u, u])), None);
        assert_eq!(settle_now(&pending(l([u, md]), 0), &fsdp), None);
    }

    /// A note is kept per activation, dropped where two weights of one activation differ, and
    /// the oldest go first beyond the capacity.
    #[test]
    fn notes_are_bounded_and_unambiguous() {
        let m = mesh();
        let fsdp = Arc::new(Layout::new(&m, ["batch", UNSHARDED]).unwrap());
        let tp = Arc::new(Layout::new(&m, [UNSHARDED, "model"]).unwrap());
        note(u64::MAX, &fsdp);
        assert_eq!(weight_of(u64::MAX), Some(fsdp.clone()));
        // An equal layout of another weight keeps the note.
        note(u64::MAX, &Arc::new((*fsdp).clone()));
        assert_eq!(weight_of(u64::MAX), Some(fsdp.clone()));
        note(u64::MAX, &tp);
        assert_eq!(weight_of(u64::MAX), None);
        note(u64::MAX - 1, &Arc::new(Layout::replicated(&m, 2)));
        assert_eq!(weight_of(u64::MAX - 1), None);
        for i in 0..CAPACITY as u64 {
            note(i, &fsdp);
        }
        assert_eq!(weight_of(u64::MAX), None);
        assert_eq!(weight_of(CAPACITY as u64 - 1), Some(fsdp));
    }
}
