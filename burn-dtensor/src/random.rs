//! Counter-based random creation: every element of a random tensor is a pure function of the
//! seed, the creation's sequence number and the element's **global** index, so a shard is drawn
//! on its own, without the rest of the tensor, and the values are bitwise the same for every
//! layout, mesh and process count.
//!
//! The generator is Philox4x32-10 (Salmon et al., "Parallel Random Numbers: As Easy as 1, 2, 3",
//! SC'11; the generator of cuRAND and of JAX's `rbg` keys), from the `rand_philox` crate, whose
//! block function is pinned to Random123's known-answer vectors. Element `e` (row-major flat
//! index in the global shape) of the `s`-th random creation after `seed` is made from the four
//! words of the block with counter `(e, s)` (`e` in the low 64 bits, `s` in the high 64) and key
//! `splitmix64(seed)`:
//!
//! | distribution | f32 (f16, bf16: drawn as f32, then cast by the inner backend) | f64 |
//! |---|---|---|
//! | `Default` `[0, 1)` | `(w0 >> 8) * 2^-24` | `u53 = ((w0 << 21) ^ (w1 >> 11)) * 2^-53` |
//! | `Uniform(lo, hi)` `[lo, hi)` | `lo + (hi - lo) * u24` in f32 | `lo + (hi - lo) * u53` |
//! | `Normal(mean, std)` | Box-Muller in f64 on `(0, 1]` uniforms from `(w0, w1)` and `(w2, w3)`, cast | the same, in f64 |
//! | `Bernoulli(p)` | `1` if `u53 < p`, else `0` | the same |
//!
//! Integers: `Default` draws the whole range of the dtype (`w0`, or `w0 | w1 << 32` for 64-bit),
//! `Uniform(lo, hi)` is `lo + floor((w0 | w1 << 32) * (hi - lo) / 2^64)` on `[lo, hi)` (bias below
//! `(hi - lo) / 2^64`), `Normal` rounds towards zero, `Bernoulli` gives 0 or 1: the semantics of
//! Burn's `Distribution` on the inner backends, with other values.
//!
//! The stream state is process-global, like Burn's own backends': [`seed`] (called by
//! `Backend::seed` of the decorator) sets the seed and restarts the sequence; every random
//! creation takes the next sequence number. Programs that create tensors in the same order (the
//! SPMD model: every process runs the same program) draw the same tensors. Unseeded, the seed is
//! [`DEFAULT_SEED`], so that the processes of a job agree without being told (PyTorch's default
//! generator also starts from a fixed seed).

use std::ops::Range;
use std::sync::Mutex;

use burn::tensor::{DType, Distribution, IntDType, TensorData};
use rand_philox::{philox4x32_10, splitmix64};
use rayon::prelude::*;

/// The seed of the stream before any [`seed`] call.
pub const DEFAULT_SEED: u64 = 0x5EED_D7E5_0000_0001;

/// Which random creation a tensor is: the seed in force and the creation's sequence number
/// after it. Two creations with the same key and global shape have the same values, whatever
/// their layouts and meshes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StreamKey {
    /// The seed (`Backend::seed`).
    pub seed: u64,
    /// The creation's number since the seed was set (0 for the first).
    pub sequence: u64,
}

static STATE: Mutex<StreamKey> = Mutex::new(StreamKey {
    seed: DEFAULT_SEED,
    sequence: 0,
});

/// Sets the seed and restarts the sequence of random creations (what `Backend::seed` does on
/// the decorator).
pub fn seed(seed: u64) {
    *STATE.lock().unwrap_or_else(|e| e.into_inner()) = StreamKey { seed, sequence: 0 };
}

/// The key of the next random creation, advancing the sequence.
pub fn next_key() -> StreamKey {
    let mut s = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let k = *s;
    s.sequence += 1;
    k
}

/// The four Philox words of global element `e` under `key`.
#[inline]
fn block(key: [u32; 2], sequence: u64, e: u64) -> [u32; 4] {
    philox4x32_10(
        [
            e as u32,
            (e >> 32) as u32,
            sequence as u32,
            (sequence >> 32) as u32,
        ],
        key,
    )
}

/// `[0, 1)` from 24 bits (every value exact in f32).
#[inline]
fn u24(w: u32) -> f32 {
    (w >> 8) as f32 * (1.0 / 16_777_216.0)
}

/// `[0, 1)` from 53 bits (every value exact in f64).
#[inline]
fn u53(w0: u32, w1: u32) -> f64 {
    (((w0 as u64) << 21) ^ ((w1 as u64) >> 11)) as f64 * (1.0 / 9_007_199_254_740_992.0)
}

/// A standard normal from two words pairs (Box-Muller on `(0, 1]`, so `ln` never sees 0).
#[inline]
fn std_normal(w: [u32; 4]) -> f64 {
    let u1 = 1.0 - u53(w[0], w[1]);
    let u2 = u53(w[2], w[3]);
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// Fills `out` with `f(words of element e)` for every element of the box `ranges` of a tensor
/// of global `shape`, in the box's row-major order; rows in parallel above a size.
fn fill_box<T: Send>(
    shape: &[usize],
    ranges: &[Range<usize>],
    key: StreamKey,
    f: impl Fn([u32; 4]) -> T + Sync,
) -> Vec<T> {
    let k = splitmix64(key.seed);
    let k = [k as u32, (k >> 32) as u32];
    let at = |e: usize| f(block(k, key.sequence, e as u64));
    let rank = shape.len();
    if rank == 0 {
        return vec![at(0)];
    }
    let len = crate::host::box_numel(ranges);
    if len == 0 {
        return Vec::new();
    }
    // Row-major strides of the global shape.
    let mut st = vec![1usize; rank];
    for d in (0..rank - 1).rev() {
        st[d] = st[d + 1] * shape[d + 1];
    }
    let inner = ranges[rank - 1].clone();
    let outer: Vec<usize> = ranges[..rank - 1].iter().map(|r| r.len()).collect();
    let row = |n: usize| -> Vec<T> {
        // Unravel row `n` of the box into global coordinates of the outer dims.
        let mut rest = n;
        let mut base = 0;
        for d in (0..rank - 1).rev() {
            base += (ranges[d].start + rest % outer[d]) * st[d];
            rest /= outer[d];
        }
        inner.clone().map(|i| at(base + i)).collect()
    };
    let rows = len / inner.len();
    if len >= 1 << 16 && rows > 1 {
        (0..rows).into_par_iter().flat_map_iter(row).collect()
    } else {
        (0..rows).flat_map(row).collect()
    }
}

/// The float values of the box `ranges` of a random tensor of global `shape`: f64 data when
/// `f64` is set, else f32 data (the caller casts to f16 / bf16). See the module docs for the
/// formulas.
pub fn float_box(
    shape: &[usize],
    ranges: &[Range<usize>],
    dist: Distribution,
    f64: bool,
    key: StreamKey,
) -> TensorData {
    let dims: Vec<usize> = ranges.iter().map(|r| r.len()).collect();
    if f64 {
        let v = fill_box(shape, ranges, key, |w| match dist {
            Distribution::Default => u53(w[0], w[1]),
            Distribution::Uniform(lo, hi) => {
                let v = lo + (hi - lo) * u53(w[0], w[1]);
                if v >= hi && hi > lo {
                    hi.next_down()
                } else {
                    v
                }
            }
            Distribution::Normal(mean, std) => mean + std * std_normal(w),
            Distribution::Bernoulli(p) => f64::from(u8::from(u53(w[0], w[1]) < p)),
        });
        TensorData::new(v, dims)
    } else {
        let v = fill_box(shape, ranges, key, |w| match dist {
            Distribution::Default => u24(w[0]),
            Distribution::Uniform(lo, hi) => {
                let (lo, hi) = (lo as f32, hi as f32);
                let v = lo + (hi - lo) * u24(w[0]);
                if v >= hi && hi > lo {
                    hi.next_down()
                } else {
                    v
                }
            }
            Distribution::Normal(mean, std) => (mean + std * std_normal(w)) as f32,
            Distribution::Bernoulli(p) => f32::from(u8::from(u53(w[0], w[1]) < p)),
        });
        TensorData::new(v, dims)
    }
}

/// The integer values of the box `ranges` of a random tensor of global `shape` and `dtype` (see
/// the module docs).
pub fn int_box(
    shape: &[usize],
    ranges: &[Range<usize>],
    dist: Distribution,
    dtype: IntDType,
    key: StreamKey,
) -> TensorData {
    let dims: Vec<usize> = ranges.iter().map(|r| r.len()).collect();
    // The value as i128 (wide enough for every int dtype's range), then narrowed.
    let value = |w: [u32; 4], bits: u32, signed: bool| -> i128 {
        let word = (w[0] as u64) | ((w[1] as u64) << 32);
        match dist {
            Distribution::Default => {
                let raw = if bits == 64 {
                    word
                } else {
                    word & ((1u64 << bits) - 1)
                };
                if signed {
                    // Two's complement of the low `bits` bits.
                    ((raw << (64 - bits)) as i64 >> (64 - bits)) as i128
                } else {
                    raw as i128
                }
            }
            Distribution::Uniform(lo, hi) => {
                let (lo, hi) = (lo as i128, hi as i128);
                let span = (hi - lo).max(0) as u128;
                lo + ((word as u128 * span) >> 64) as i128
            }
            Distribution::Normal(mean, std) => (mean + std * std_normal(w)) as i64 as i128,
            Distribution::Bernoulli(p) => i128::from(u53(w[0], w[1]) < p),
        }
    };
    macro_rules! ints {
        ($($d:ident => $t:ty, $bits:expr, $signed:expr);*) => {
            match dtype {
                $(IntDType::$d => TensorData::new(
                    fill_box(shape, ranges, key, |w| value(w, $bits, $signed) as $t),
                    dims,
                ),)*
            }
        };
    }
    ints!(I64 => i64, 64, true; I32 => i32, 32, true; I16 => i16, 16, true; I8 => i8, 8, true;
        U64 => u64, 64, false; U32 => u32, 32, false; U16 => u16, 16, false; U8 => u8, 8, false)
}

/// Whether `dtype` is drawn as f64 (else as f32, then cast).
pub(crate) fn draws_f64(dtype: DType) -> bool {
    dtype == DType::F64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> StreamKey {
        StreamKey {
            seed: 42,
            sequence: 3,
        }
    }

    /// A box of a tensor is the same values as that box cut from the whole tensor.
    #[test]
    fn a_box_is_the_whole_tensors_box() {
        let shape = [5, 7, 3];
        let whole = float_box(
            &shape,
            &[0..5, 0..7, 0..3],
            Distribution::Default,
            false,
            key(),
        );
        let w = whole.to_vec::<f32>().unwrap();
        let b = float_box(
            &shape,
            &[1..4, 2..7, 1..2],
            Distribution::Default,
            false,
            key(),
        );
        let got = b.to_vec::<f32>().unwrap();
        let mut want = Vec::new();
        for i in 1..4 {
            for j in 2..7 {
                want.push(w[(i * 7 + j) * 3 + 1]);
            }
        }
        assert_eq!(got, want);
        // Element 0 by hand from the block function.
        let k = splitmix64(42);
        let w0 = philox4x32_10([0, 0, 3, 0], [k as u32, (k >> 32) as u32])[0];
        assert_eq!(w[0], (w0 >> 8) as f32 / 16_777_216.0);
    }

    #[test]
    fn ranges_of_each_distribution() {
        let s = [4096];
        let all = std::slice::from_ref(&(0..4096));
        let u = float_box(&s, all, Distribution::Uniform(-2.0, 3.0), false, key());
        assert!(
            u.to_vec::<f32>()
                .unwrap()
                .iter()
                .all(|v| (-2.0..3.0).contains(v))
        );
        let b = float_box(&s, all, Distribution::Bernoulli(0.25), true, key());
        assert!(
            b.to_vec::<f64>()
                .unwrap()
                .iter()
                .all(|v| *v == 0.0 || *v == 1.0)
        );
        let i = int_box(
            &s,
            all,
            Distribution::Uniform(-3.0, 5.0),
            IntDType::I32,
            key(),
        );
        let iv = i.to_vec::<i32>().unwrap();
        assert!(iv.iter().all(|v| (-3..5).contains(v)));
        for v in -3..5 {
            assert!(iv.contains(&v), "{v} never drawn");
        }
        let i8s = int_box(&s, all, Distribution::Default, IntDType::I8, key());
        let v8 = i8s.to_vec::<i8>().unwrap();
        assert!(v8.iter().any(|v| *v < 0) && v8.iter().any(|v| *v > 0));
    }
}
