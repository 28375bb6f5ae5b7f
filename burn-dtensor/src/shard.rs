//! Global <-> local geometry of one dim: which slice of a global dim each shard holds (the
//! per-layout forms, [`crate::layout::local_ranges`] and its kin, build on it).
//!
//! Chunk semantics (also for sizes not divisible by the axis size): a dim of global size `n`
//! split over `k` shards gives shard `i` the half-open range
//! `[i*q + min(i, r), i*q + min(i, r) + q + (i < r))` with `q = n / k`, `r = n % k`: the first
//! `r` shards are one element larger. Shards may be empty when `n < k`.

use std::ops::Range;

/// The range of a dim of global size `n` held by shard `i` of `k`.
pub fn chunk(n: usize, k: usize, i: usize) -> Range<usize> {
    let (q, r) = (n / k, n % k);
    let start = i * q + i.min(r);
    start..start + q + usize::from(i < r)
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
