//! Per-thread memos of the pure functions every op calls: sharding rules
//! ([`crate::rules`]), stacked element-wise plans ([`crate::stack::elementwise_plan`]) and
//! relayout plans ([`crate::redistribute`]), keyed by their arguments (layouts, shapes, op
//! parameters). PyTorch DTensor caches its sharding propagation the same way, per op schema
//! (`ShardingPropagator.propagate_op_sharding`, an LRU over the op and its input specs).
//!
//! A training step calls the same op on the same layouts and shapes every step, so after the
//! first step every lookup hits. A key is the arguments flattened to machine words on the stack
//! ([`Key`]); a lookup hashes it (FxHash) and shares the value by reference count, so a hit
//! allocates nothing. A memo holds at most [`CAPACITY`] values and is emptied when full (a
//! program whose shapes change every step, say variable sequence lengths, recomputes its
//! rules, as without the memo, and never grows the memo without bound). A leaf module: it
//! knows nothing of what it stores.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::thread::LocalKey;

/// A memo key: a function's arguments flattened to words, inline up to 48 words (two rank-4
/// layouts on a 3-axis mesh with their shapes take about 30).
pub(crate) type Key = smallvec::SmallVec<[usize; 48]>;

/// The most values one memo holds before it is emptied.
pub(crate) const CAPACITY: usize = 4096;

/// The values of one memoised function, on one thread.
pub(crate) type Memo<V> = RefCell<HashMap<Key, Rc<V>, rustc_hash::FxBuildHasher>>;

/// The value of `f` memoised under `key` in `memo` (a `thread_local!` [`Memo`]): the stored one
/// when `key` was seen on this thread, else `f()`, stored. `f` runs with the memo released, so
/// it may use the memo itself.
pub(crate) fn get_or<V>(
    memo: &'static LocalKey<Memo<V>>,
    key: Key,
    f: impl FnOnce() -> V,
) -> Rc<V> {
    if let Some(v) = memo.with_borrow(|m| m.get(&key).cloned()) {
        return v;
    }
    let v = Rc::new(f());
    memo.with_borrow_mut(|m| {
        if m.len() >= CAPACITY {
            m.clear();
        }
        m.insert(key, v.clone());
    });
    v
}

/// Appends a shape (or any list of sizes) to `key`, length first, so that two lists never read
/// as one.
pub(crate) fn push_list(key: &mut Key, xs: &[usize]) {
    key.push(xs.len());
    key.extend_from_slice(xs);
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local!(static SQUARES: Memo<usize> = Default::default());

    #[test]
    fn computes_once_per_key_and_separates_lists() {
        let calls = std::cell::Cell::new(0);
        let square = |x: usize| {
            let mut k = Key::new();
            push_list(&mut k, &[x]);
            get_or(&SQUARES, k, || {
                calls.set(calls.get() + 1);
                x * x
            })
        };
        assert_eq!(*square(3), 9);
        assert_eq!(*square(3), 9);
        assert_eq!(*square(4), 16);
        assert_eq!(calls.get(), 2);
        // [1, 2] + [3] and [1] + [2, 3] are different keys.
        let (mut a, mut b) = (Key::new(), Key::new());
        push_list(&mut a, &[1, 2]);
        push_list(&mut a, &[3]);
        push_list(&mut b, &[1]);
        push_list(&mut b, &[2, 3]);
        assert_ne!(a, b);
    }

    #[test]
    fn a_full_memo_is_emptied_not_grown() {
        thread_local!(static IDS: Memo<usize> = Default::default());
        for i in 0..CAPACITY + 10 {
            let mut k = Key::new();
            k.push(i);
            assert_eq!(*get_or(&IDS, k, || i), i);
        }
        assert!(IDS.with_borrow(|m| m.len()) <= CAPACITY);
    }
}
