//! The last all-gather, memoised per thread: a tensor gathered twice in a row to one layout is
//! gathered once.
//!
//! Burn's modules hand one activation to several ops that each redistribute it: the query, key
//! and value linears of a sequence-parallel attention each all-gather the same sequence-sharded
//! input, and a row-parallel linear's backward gathers the same output gradient for its input
//! gradient and again for its weight gradient. Megatron-SP gathers once in both places (the
//! gather is an explicit step of its model code); XLA's common-subexpression elimination does
//! the same for JAX. Here the relayout itself remembers its last pure gather (a plan of
//! all-gathers only, whose result is a function of the source alone) and hands the same
//! result to the next request for that source and layout.
//!
//! One entry per thread: the memory held is one gathered tensor (the next gather replaces it),
//! so FSDP's gathered weights are still released after their use and sequence parallelism's
//! activations are not kept whole until the backward (the backward gathers again, as
//! Megatron-SP recomputes its all-gather). Every process of a multi-process mesh runs the same
//! ops in the same order, so all ranks hit and miss alike and their collectives still match.

use std::any::Any;
use std::cell::RefCell;

use crate::layout::Layout;
use crate::tensor::DTensor;

struct Entry<P> {
    id: u64,
    stacked: bool,
    to: Layout,
    out: DTensor<P>,
}

thread_local! {
    static LAST: RefCell<Option<Box<dyn Any>>> = const { RefCell::new(None) };
}

/// The memoised gather of `t` to `to`, if it was the last one made on this thread.
pub(super) fn get<P: Clone + 'static>(t: &DTensor<P>, to: &Layout) -> Option<DTensor<P>> {
    LAST.with(|last| {
        let last = last.borrow();
        let e = last.as_ref()?.downcast_ref::<Entry<P>>()?;
        (e.id == t.id && e.stacked == t.is_stacked() && e.to == *to).then(|| e.out.clone())
    })
}

/// The memo's key of a source tensor: its id and whether it is held stacked.
pub(super) fn key<P>(t: &DTensor<P>) -> (u64, bool) {
    (t.id, t.is_stacked())
}

/// Remembers `out`, the gather to `to` of the source with key `src` (replacing the previous
/// entry).
pub(super) fn put<P: Clone + 'static>(src: (u64, bool), to: &Layout, out: &DTensor<P>) {
    let e = Entry {
        id: src.0,
        stacked: src.1,
        to: to.clone(),
        out: out.clone(),
    };
    LAST.with(|last| *last.borrow_mut() = Some(Box::new(e)));
}
