//! Global <-> local geometry: which slice of a global tensor each device holds.
//!
//! Chunk semantics (also for sizes not divisible by the axis size): a dim of global size `n`
//! split over `k` shards gives shard `i` the half-open range
//! `[i*q + min(i, r), i*q + min(i, r) + q + (i < r))` with `q = n / k`, `r = n % k`: the first
//! `r` shards are one element larger. Shards may be empty when `n < k`.

use std::ops::Range;

use crate::layout::Layout;

/// The range of a dim of global size `n` held by shard `i` of `k`.
pub fn chunk(n: usize, k: usize, i: usize) -> Range<usize> {
    let (q, r) = (n / k, n % k);
    let start = i * q + i.min(r);
    start..start + q + usize::from(i < r)
}

/// For device `flat` of the layout's mesh, the range of each global dim it holds.
pub fn local_ranges(layout: &Layout, shape: &[usize], flat: usize) -> Vec<Range<usize>> {
    layout
        .dims
        .iter()
        .zip(shape)
        .map(|(s, &n)| match s {
            Some(a) => chunk(n, layout.mesh.axis_size(*a), layout.mesh.coord(flat, *a)),
            None => 0..n,
        })
        .collect()
}

/// The per-shard shape of device `flat`.
pub fn local_shape(layout: &Layout, shape: &[usize], flat: usize) -> Vec<usize> {
    local_ranges(layout, shape, flat)
        .into_iter()
        .map(|r| r.len())
        .collect()
}

/// Whether some device holds an empty shard (a sharded dim smaller than its axis).
pub fn has_empty_shard(layout: &Layout, shape: &[usize]) -> bool {
    layout
        .dims
        .iter()
        .zip(shape)
        .any(|(s, &n)| s.is_some_and(|a| n < layout.mesh.axis_size(a)))
}

/// Whether every sharded dim divides evenly by its axis size.
pub fn is_even(layout: &Layout, shape: &[usize]) -> bool {
    layout
        .dims
        .iter()
        .zip(shape)
        .all(|(s, &n)| s.is_none_or(|a| n % layout.mesh.axis_size(a) == 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_dim_first_shards_larger() {
        // 10 over 4: 3,3,2,2
        let r: Vec<_> = (0..4).map(|i| chunk(10, 4, i)).collect();
        assert_eq!(r, vec![0..3, 3..6, 6..8, 8..10]);
        // 3 over 4: 1,1,1,0
        let r: Vec<_> = (0..4).map(|i| chunk(3, 4, i).len()).collect();
        assert_eq!(r, vec![1, 1, 1, 0]);
    }
}
