//! Host-side chunk copies: extracting one device's slice of a host tensor (so `distribute`
//! uploads only that slice) and assembling a global tensor from downloaded chunks (so
//! `into_data` gathers to the host without any device collective).

use std::mem::MaybeUninit;
use std::ops::Range;

use burn::tensor::{Bytes, DType, Shape, TensorData};

use crate::error::{DTensorError, Result};

/// A zeroed host buffer for elements of one dtype, allocated with that element's alignment, so
/// that the bytes a collective receives into it become a [`TensorData`] (and, on host-memory
/// backends such as NdArray, a tensor) without a copy: a `Vec<u8>` has alignment 1, and turning
/// it into `f32` elements copies it (Burn's `Bytes::try_into_vec` requires the allocation's own
/// alignment).
pub struct HostBuffer(Words);

enum Words {
    B1(Vec<u8>),
    B2(Vec<u16>),
    B4(Vec<u32>),
    B8(Vec<u64>),
}

impl HostBuffer {
    /// `bytes` zero bytes aligned for `dtype` (`bytes` a multiple of its element size).
    pub fn zeroed(bytes: usize, dtype: DType) -> Self {
        let es = dtype.size().max(1);
        HostBuffer(match es {
            2 => Words::B2(vec![0; bytes / 2]),
            4 => Words::B4(vec![0; bytes / 4]),
            8 => Words::B8(vec![0; bytes / 8]),
            _ => Words::B1(vec![0; bytes]),
        })
    }
    /// A buffer of `bytes` bytes aligned for `dtype`, filled by `fill` and never zeroed first:
    /// the receive buffer of a collective across processes ([`crate::spmd::ProcessGroup`]'s
    /// `recv`), which becomes a tensor as it is. Zeroing it cost a fifth of a 4 MB all-gather
    /// across 2 processes (session 28).
    ///
    /// # Safety
    /// `fill` writes every byte of the slice it is given (a `ProcessGroup` method does, by its
    /// safety contract).
    ///
    /// # Panics
    /// When `bytes` is not a multiple of `dtype`'s element size.
    pub unsafe fn received(
        bytes: usize,
        dtype: DType,
        fill: impl FnOnce(&mut [MaybeUninit<u8>]),
    ) -> Self {
        /// # Safety
        /// As [`HostBuffer::received`].
        unsafe fn go<W: bytemuck::Pod>(
            bytes: usize,
            fill: impl FnOnce(&mut [MaybeUninit<u8>]),
        ) -> Vec<W> {
            let es = std::mem::size_of::<W>();
            assert_eq!(bytes % es, 0, "burn-dtensor: a buffer of whole elements");
            let n = bytes / es;
            let mut v = Vec::<W>::with_capacity(n);
            let spare = v.spare_capacity_mut();
            // SAFETY: the spare capacity holds `n` elements of `W`, `n * es` bytes; any byte
            // pattern is a valid `W` (`Pod`) once written.
            let raw = unsafe {
                std::slice::from_raw_parts_mut(spare.as_mut_ptr().cast::<MaybeUninit<u8>>(), bytes)
            };
            fill(raw);
            // SAFETY: `fill` wrote all `bytes` bytes (the caller's contract).
            unsafe { v.set_len(n) };
            v
        }
        // SAFETY: the caller's contract, passed on.
        unsafe {
            HostBuffer(match dtype.size().max(1) {
                2 => Words::B2(go(bytes, fill)),
                4 => Words::B4(go(bytes, fill)),
                8 => Words::B8(go(bytes, fill)),
                _ => Words::B1(go(bytes, fill)),
            })
        }
    }
    /// The buffer's bytes, to receive into.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        match &mut self.0 {
            Words::B1(v) => v,
            Words::B2(v) => bytemuck::cast_slice_mut(v),
            Words::B4(v) => bytemuck::cast_slice_mut(v),
            Words::B8(v) => bytemuck::cast_slice_mut(v),
        }
    }
    /// The buffer's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match &self.0 {
            Words::B1(v) => v,
            Words::B2(v) => bytemuck::cast_slice(v),
            Words::B4(v) => bytemuck::cast_slice(v),
            Words::B8(v) => bytemuck::cast_slice(v),
        }
    }
    /// The row-major host tensor of `shape` and `dtype` in `src` permuted by `order`
    /// (`permute(order)` materialised row-major), copied by the runs of
    /// [`for_each_permuted_run`] in one loop per element width (no indirect call per run: the
    /// model step's side-by-side weights copy 2,400 runs of 96 bytes a step). `None` when `src`
    /// is not aligned for `dtype`'s elements.
    pub fn permuted(src: &[u8], dtype: DType, shape: &[usize], order: &[usize]) -> Option<Self> {
        fn go<W: bytemuck::Pod>(src: &[u8], shape: &[usize], order: &[usize]) -> Option<Vec<W>> {
            let src: &[W] = bytemuck::try_cast_slice(src).ok()?;
            let mut out = Vec::with_capacity(shape.iter().product());
            for_each_permuted_run(shape, order, |s, n| out.extend_from_slice(&src[s..s + n]));
            Some(out)
        }
        Some(HostBuffer(match dtype.size() {
            2 => Words::B2(go(src, shape, order)?),
            4 => Words::B4(go(src, shape, order)?),
            8 => Words::B8(go(src, shape, order)?),
            _ => Words::B1(go(src, shape, order)?),
        }))
    }
    /// A buffer of `dtype` elements copied from `src` (a host tensor's bytes) run by run:
    /// `runs` is handed a sink and calls it with each `(start, len)` in elements, in output
    /// order. The buffer is never zeroed first (half of the cost of a fresh buffer the copies
    /// overwrite anyway: `distribute`'s stacked upload spent 6% of a Flex step in that memset).
    /// `None` when `src` is not aligned for `dtype`'s elements.
    pub fn collect_runs(
        src: &[u8],
        dtype: DType,
        capacity: usize,
        runs: impl FnOnce(&mut dyn FnMut(usize, usize)),
    ) -> Option<Self> {
        fn go<W: bytemuck::Pod>(
            src: &[u8],
            capacity: usize,
            runs: impl FnOnce(&mut dyn FnMut(usize, usize)),
        ) -> Option<Vec<W>> {
            let src: &[W] = bytemuck::try_cast_slice(src).ok()?;
            let mut out = Vec::with_capacity(capacity);
            runs(&mut |s, n| out.extend_from_slice(&src[s..s + n]));
            Some(out)
        }
        Some(HostBuffer(match dtype.size() {
            2 => Words::B2(go(src, capacity, runs)?),
            4 => Words::B4(go(src, capacity, runs)?),
            8 => Words::B8(go(src, capacity, runs)?),
            _ => Words::B1(go(src, capacity, runs)?),
        }))
    }
    /// The buffer as a tensor of `shape` and `dtype` (the buffer's bytes, moved).
    pub fn into_data(self, shape: impl Into<Shape>, dtype: DType) -> TensorData {
        let bytes = match self.0 {
            Words::B1(v) => Bytes::from_elems(v),
            Words::B2(v) => Bytes::from_elems(v),
            Words::B4(v) => Bytes::from_elems(v),
            Words::B8(v) => Bytes::from_elems(v),
        };
        TensorData::from_bytes(bytes, shape, dtype)
    }
}

/// The largest send buffer [`scratch`] keeps between calls: a larger one is freed after its use
/// (a model bigger than a process must not hold a tensor's worth of bytes forever).
const SCRATCH_MAX: usize = 16 << 20;

thread_local! {
    static SCRATCH: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// The number of elements in the box `ranges` (one range per dim; the product of their
/// lengths, 1 for a rank-0 box).
pub fn box_numel(ranges: &[Range<usize>]) -> usize {
    ranges.iter().map(|r| r.len()).product()
}

/// An empty byte buffer to assemble a transfer's send side in, reused between calls on this
/// thread (up to [`SCRATCH_MAX`] bytes of capacity): a fresh buffer's pages are faulted in (and
/// zeroed by the kernel) on every call, which cost more than the copy into it. Give it back
/// with [`return_scratch`].
pub fn scratch(capacity: usize) -> Vec<u8> {
    let mut v = SCRATCH.with(|s| s.take());
    v.clear();
    v.reserve(capacity);
    v
}

/// Keeps `v` for the next [`scratch`] on this thread when its capacity is at most
/// [`SCRATCH_MAX`]; frees it otherwise.
pub fn return_scratch(v: Vec<u8>) {
    if v.capacity() <= SCRATCH_MAX {
        SCRATCH.with(|s| s.set(v));
    }
}

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// Calls `f(src_offset, dst_offset, len)` (in elements) for every contiguous run of the box
/// `ranges` inside a tensor of `shape`, where dst is the box itself laid out row-major.
pub(crate) fn for_each_run(
    shape: &[usize],
    ranges: &[Range<usize>],
    f: impl FnMut(usize, usize, usize),
) {
    let whole: Vec<Range<usize>> = shape.iter().map(|&n| 0..n).collect();
    for_each_run_between(ranges, &whole, ranges, f)
}

/// Calls `f(src_offset, dst_offset, len)` (in elements) for every row (along the last dim) of
/// the box `cut`, global coordinates, which both `from` and `into` hold: the offsets are the
/// row's in the row-major layouts of box `from` (src) and box `into` (dst). [`for_each_run`] is
/// the case `from` = the whole tensor, `into` = `cut`; a relayout across meshes copies a piece
/// from a source shard into a target shard with it.
pub(crate) fn for_each_run_between(
    cut: &[Range<usize>],
    from: &[Range<usize>],
    into: &[Range<usize>],
    mut f: impl FnMut(usize, usize, usize),
) {
    let rank = cut.len();
    if rank == 0 {
        f(0, 0, 1);
        return;
    }
    if cut.iter().any(|r| r.is_empty()) {
        return;
    }
    let lens = |b: &[Range<usize>]| b.iter().map(|r| r.len()).collect::<Vec<_>>();
    let (sf, si) = (strides(&lens(from)), strides(&lens(into)));
    let inner = cut[rank - 1].len();
    let outer = lens(&cut[..rank - 1]);
    let count: usize = outer.iter().product();
    let mut idx = vec![0usize; rank - 1];
    // The offset of the current row's first element inside `outer_box` (strides `st`).
    let at = |idx: &[usize], outer_box: &[Range<usize>], st: &[usize]| {
        (0..rank - 1)
            .map(|d| (cut[d].start + idx[d] - outer_box[d].start) * st[d])
            .sum::<usize>()
            + cut[rank - 1].start
            - outer_box[rank - 1].start
    };
    for _ in 0..count {
        f(at(&idx, from, &sf), at(&idx, into, &si), inner);
        for d in (0..rank - 1).rev() {
            idx[d] += 1;
            if idx[d] < outer[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

fn elem_size(data: &TensorData) -> Result<usize> {
    if matches!(data.dtype, burn::tensor::DType::QFloat(_)) {
        return Err(DTensorError::Unsupported(
            "quantized host data cannot be sharded; distribute it replicated".into(),
        ));
    }
    Ok(data.dtype.size())
}

/// The box `ranges` of a host tensor, as its own host tensor.
///
/// # Errors
/// [`DTensorError::Unsupported`] for quantized data.
pub fn extract(data: &TensorData, ranges: &[Range<usize>]) -> Result<TensorData> {
    let shape: Vec<usize> = data.shape.to_vec();
    if ranges
        .iter()
        .zip(&shape)
        .all(|(r, &n)| r.start == 0 && r.end == n)
    {
        return Ok(data.clone());
    }
    let es = elem_size(data)?;
    let src = data.as_bytes();
    let out_shape: Vec<usize> = ranges.iter().map(|r| r.len()).collect();
    let mut out = vec![0u8; out_shape.iter().product::<usize>() * es];
    for_each_run(&shape, ranges, |s, d, n| {
        out[d * es..(d + n) * es].copy_from_slice(&src[s * es..(s + n) * es])
    });
    Ok(TensorData::from_bytes_vec(out, out_shape, data.dtype))
}

/// Appends the box `ranges` of the row-major tensor `src` (of `shape`, elements of `elem`
/// bytes) to `out`, row-major.
pub fn append_box(
    shape: &[usize],
    elem: usize,
    src: &[u8],
    ranges: &[Range<usize>],
    out: &mut Vec<u8>,
) {
    let at = out.len();
    let n = box_numel(ranges);
    // Runs come in the box's row-major order, so they are appended as they come (no zeroing
    // of the destination first: that memset was half of an all-to-all's send side).
    out.reserve(n * elem);
    for_each_run(shape, ranges, |s, d, n| {
        debug_assert_eq!(at + d * elem, out.len());
        out.extend_from_slice(&src[s * elem..(s + n) * elem])
    });
    debug_assert_eq!(out.len(), at + n * elem);
}

/// [`append_box`] into memory not yet written: box `ranges` of the row-major tensor of `shape`
/// (`elem` bytes per element) in `src`, copied in the box's row-major order into `out`, which
/// holds exactly the box. Every byte of `out` is written.
///
/// # Panics
/// When `out` is not the box's size.
pub fn read_box_into(
    shape: &[usize],
    elem: usize,
    src: &[u8],
    ranges: &[Range<usize>],
    out: &mut [MaybeUninit<u8>],
) {
    let n = box_numel(ranges);
    assert_eq!(out.len(), n * elem, "burn-dtensor: a box's destination");
    for_each_run(shape, ranges, |s, d, n| {
        let (from, to) = (
            &src[s * elem..(s + n) * elem],
            &mut out[d * elem..(d + n) * elem],
        );
        // SAFETY: both hold `n * elem` bytes and cannot overlap (`out` is borrowed mutably).
        unsafe { std::ptr::copy_nonoverlapping(from.as_ptr(), to.as_mut_ptr().cast(), from.len()) };
    });
}

/// A strided view's dims with size-1 dims dropped and adjacent dims merged where the outer
/// one's stride is the inner one's span (`strides[i] == strides[i + 1] * shape[i + 1]`): the
/// same elements in the same order, as few dims as the view allows. Strides in elements.
// Used by `inner`'s Flex paths only.
#[cfg_attr(not(feature = "flex"), allow(dead_code))]
pub fn collapse_strided(shape: &[usize], strides: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let (mut cs, mut ct): (Vec<usize>, Vec<usize>) = (Vec::new(), Vec::new());
    for (&n, &st) in shape.iter().zip(strides) {
        if n == 1 {
            continue;
        }
        match (cs.last_mut(), ct.last()) {
            (Some(pn), Some(&pt)) if pt == st * n => {
                *pn *= n;
                *ct.last_mut().expect("same length") = st;
            }
            _ => {
                cs.push(n);
                ct.push(st);
            }
        }
    }
    (cs, ct)
}

/// The strides (in elements) of `new_shape` as a view of the strided view (`shape`, `strides`)
/// with the same elements in row-major order, where one exists without a copy: each run of old
/// dims that merges or splits into a run of new dims must be contiguous within itself (numpy's
/// `_attempt_nocopy_reshape`). Size-1 dims take stride 0. `None` when the element counts differ,
/// a dim is empty, or the reshape needs a copy.
// Used by `inner`'s Flex paths only.
#[cfg_attr(not(feature = "flex"), allow(dead_code))]
pub fn view_strides(shape: &[usize], strides: &[usize], new_shape: &[usize]) -> Option<Vec<usize>> {
    if shape.iter().product::<usize>() != new_shape.iter().product::<usize>() || shape.contains(&0)
    {
        return None;
    }
    let old: Vec<(usize, usize)> = shape
        .iter()
        .zip(strides)
        .filter(|&(&n, _)| n != 1)
        .map(|(&n, &s)| (n, s))
        .collect();
    let new: Vec<usize> = (0..new_shape.len())
        .filter(|&d| new_shape[d] != 1)
        .collect();
    let mut out = vec![0; new_shape.len()];
    let (mut oi, mut ni) = (0, 0);
    while oi < old.len() && ni < new.len() {
        let (o0, n0) = (oi, ni);
        let (mut op, mut np) = (old[oi].0, new_shape[new[ni]]);
        while op != np {
            if op < np {
                oi += 1;
                op *= old.get(oi)?.0;
            } else {
                ni += 1;
                np *= new_shape[*new.get(ni)?];
            }
        }
        // The old dims o0..=oi must be one contiguous block of the view.
        if (o0..oi).any(|k| old[k].1 != old[k + 1].1 * old[k + 1].0) {
            return None;
        }
        out[new[ni]] = old[oi].1;
        for k in (n0..ni).rev() {
            out[new[k]] = out[new[k + 1]] * new_shape[new[k + 1]];
        }
        oi += 1;
        ni += 1;
    }
    (oi == old.len() && ni == new.len()).then_some(out)
}

/// Appends to `out` the `rows x cols` block of `src` whose element `(r, c)` is at
/// `base + r + c * ls` (a transposed matrix: rows contiguous in `src`), row-major, in square
/// tiles: each tile reads `TILE` short runs and writes `TILE` short runs, where a row at a time
/// would gather `cols` single elements a row apart for every output row.
///
/// # Panics
/// When the block reaches past `src` (the caller checks the view's reach first).
// Used by `copy_strided`, itself used by `inner`'s Flex paths only.
#[cfg_attr(not(feature = "flex"), allow(dead_code))]
fn transpose_into<W: Copy>(
    src: &[W],
    base: usize,
    (rows, cols, ls): (usize, usize, usize),
    out: &mut Vec<W>,
) {
    const TILE: usize = 8;
    let start = out.len();
    // Checked once here: every read below lies in `block`, every write in the reserved part.
    let block = &src[base..base + (rows - 1) + (cols - 1) * ls + 1];
    out.reserve(rows * cols);
    let (from, to) = (block.as_ptr(), out.as_mut_ptr());
    for r0 in (0..rows).step_by(TILE) {
        let r1 = (r0 + TILE).min(rows);
        for c0 in (0..cols).step_by(TILE) {
            if r1 - r0 == TILE && c0 + TILE <= cols {
                // A whole tile, at constant bounds the compiler unrolls: its eight source
                // columns' pointers held once, each output row written from them. About 2
                // instructions an element where the general loop below takes about 8 (a spatial
                // IMDB step's transposed chunks, NOTES.md session 66).
                // SAFETY: as below, for `r0 <= r < r0 + TILE <= rows`, `c0 <= c < c0 + TILE <=
                // cols`.
                unsafe {
                    let column: [*const W; TILE] =
                        std::array::from_fn(|c| from.add((c0 + c) * ls + r0));
                    for r in 0..TILE {
                        let row = to.add(start + (r0 + r) * cols + c0);
                        for (c, col) in column.iter().enumerate() {
                            *row.add(c) = *col.add(r);
                        }
                    }
                }
                continue;
            }
            for c in c0..(c0 + TILE).min(cols) {
                // SAFETY: `c * ls + r < block.len()` for `r < rows`, `c < cols`, and
                // `start + r * cols + c < start + rows * cols`, within the reserved capacity.
                unsafe {
                    let column = from.add(c * ls);
                    let row = to.add(start + c);
                    for r in r0..r1 {
                        *row.add(r * cols) = *column.add(r);
                    }
                }
            }
        }
    }
    // SAFETY: the tiles cover every `(r, c)` of the block once, so all `rows * cols` elements
    // after `start` were written.
    unsafe { out.set_len(start + rows * cols) };
}

/// The strided view of host bytes `src` (`shape`, non-negative `strides` and `offset` in
/// elements of `dtype`) copied into a row-major tensor of `shape`: an odometer over the outer
/// dims (merged first, [`collapse_strided`]) and a tight loop over the innermost one, a
/// `memcpy` where it is contiguous, a tiled transpose where the last two dims are a
/// transposed matrix ([`transpose_into`]). This is what Flex's own copy of a view above two merged
/// dims does element by element through its strided iterator (4-9% of a model- or
/// spatial-parallel step's time on Flex, NOTES.md session 34). `None` when `src` is not aligned
/// for `dtype`'s elements, or the view reaches past it.
// Used by `inner`'s Flex paths only.
#[cfg_attr(not(feature = "flex"), allow(dead_code))]
pub fn copy_strided(
    src: &[u8],
    dtype: DType,
    shape: &[usize],
    strides: &[usize],
    offset: usize,
) -> Option<TensorData> {
    fn go<W: bytemuck::Pod>(
        src: &[u8],
        shape: &[usize],
        strides: &[usize],
        offset: usize,
    ) -> Option<Vec<W>> {
        let src: &[W] = bytemuck::try_cast_slice(src).ok()?;
        let n: usize = shape.iter().product();
        let mut out = Vec::with_capacity(n);
        if n == 0 {
            return Some(out);
        }
        let reach = shape
            .iter()
            .zip(strides)
            .map(|(&d, &st)| (d - 1) * st)
            .sum::<usize>();
        if offset + reach >= src.len() {
            return None;
        }
        let Some((&last, rest)) = shape.split_last() else {
            out.push(src[offset]);
            return Some(out);
        };
        let ls = strides[rest.len()];
        // A transposed block (the last two dims with strides `(1, ls)`: a swapped or permuted
        // shard, `[4, 2, 16, 24]` with strides `[16, 1536, 1, 64]` in a model-parallel step)
        // is copied as one unit per index of the dims before it, tile by tile, instead of one
        // gather of `last` elements at a time.
        let rows = match rest.split_last() {
            Some((&rows, _)) if ls > 1 && strides[rest.len() - 1] == 1 => Some(rows),
            _ => None,
        };
        let outer = &shape[..shape.len() - 1 - usize::from(rows.is_some())];
        let mut idx = vec![0usize; outer.len()];
        let mut base = offset;
        loop {
            if let Some(rows) = rows {
                transpose_into(src, base, (rows, last, ls), &mut out);
            } else if ls == 1 {
                out.extend_from_slice(&src[base..base + last]);
            } else {
                out.extend((0..last).map(|j| src[base + j * ls]));
            }
            let mut d = outer.len();
            loop {
                if d == 0 {
                    return Some(out);
                }
                d -= 1;
                idx[d] += 1;
                base += strides[d];
                if idx[d] < outer[d] {
                    break;
                }
                base -= strides[d] * outer[d];
                idx[d] = 0;
            }
        }
    }
    let (cs, ct) = collapse_strided(shape, strides);
    let words = match dtype.size() {
        2 => Words::B2(go(src, &cs, &ct, offset)?),
        4 => Words::B4(go(src, &cs, &ct, offset)?),
        8 => Words::B8(go(src, &cs, &ct, offset)?),
        _ => Words::B1(go(src, &cs, &ct, offset)?),
    };
    Some(HostBuffer(words).into_data(shape.to_vec(), dtype))
}

/// The runs of the row-major tensor of `shape` permuted by `order` (output dim `i` is input
/// dim `order[i]`): `f(start, len)` in elements of the input, in the output's row-major order,
/// one call per run of the trailing dims that keep their place, so a copy by runs goes at
/// memory speed where a strided view's materialisation walks it element by element
/// ([`permute_run`] gives the run length: a caller may prefer another path when it is short).
pub fn for_each_permuted_run(shape: &[usize], order: &[usize], mut f: impl FnMut(usize, usize)) {
    let lead = moved_dims(order);
    let run = permute_run(shape, order);
    let st = strides(shape);
    // (extent, input stride) of each moved output dim; the input offset follows an odometer
    // over them (one add per run, not a sum over the dims).
    let dims: Vec<(usize, usize)> = order[..lead].iter().map(|&d| (shape[d], st[d])).collect();
    if dims.iter().any(|&(n, _)| n == 0) {
        return;
    }
    let (mut idx, mut at) = (vec![0usize; lead], 0usize);
    loop {
        f(at, run);
        let mut i = lead;
        loop {
            if i == 0 {
                return;
            }
            i -= 1;
            idx[i] += 1;
            at += dims[i].1;
            if idx[i] < dims[i].0 {
                break;
            }
            at -= dims[i].1 * dims[i].0;
            idx[i] = 0;
        }
    }
}

/// The permutation that undoes `order` (`permute(permute(t, order), inverse)` is `t`).
pub fn inverse_permutation(order: &[usize]) -> Vec<usize> {
    let mut back = vec![0; order.len()];
    for (i, &d) in order.iter().enumerate() {
        back[d] = i;
    }
    back
}

/// Elements per contiguous run of [`for_each_permuted_run`] for `shape` and `order`.
pub fn permute_run(shape: &[usize], order: &[usize]) -> usize {
    shape[moved_dims(order)..].iter().product()
}

/// The dim order `q` in which a tensor of `shape` and element `strides` is row-major and
/// contiguous (`permute(t, q)` has strides `[.., shape[q[r-1]], 1]`), when that is not the order
/// it has: a permuted view of a row-major tensor (a transpose). Dims of size 1 keep their place
/// (their strides say nothing). `None` when the tensor is row-major already, has a negative
/// stride, or is no permutation of a contiguous tensor (a slice, a broadcast).
#[cfg(any(feature = "ndarray", feature = "flex"))]
pub fn row_major_order(shape: &[usize], strides: &[isize]) -> Option<Vec<usize>> {
    if strides.iter().any(|&s| s < 0) {
        return None;
    }
    // Big dims already in non-increasing stride order (the stable sort below would keep them):
    // not a permuted view. Asked on every stacked element-wise op, so no allocation here.
    let mut big_strides = (0..shape.len())
        .filter(|&d| shape[d] > 1)
        .map(|d| strides[d]);
    if let Some(first) = big_strides.next()
        && big_strides
            .try_fold(first, |prev, s| (s <= prev).then_some(s))
            .is_some()
    {
        return None;
    }
    let big: Vec<usize> = (0..shape.len()).filter(|&d| shape[d] > 1).collect();
    let mut sorted = big.clone();
    sorted.sort_by_key(|&d| std::cmp::Reverse(strides[d]));
    if sorted == big {
        return None;
    }
    let mut expect = 1isize;
    for &d in sorted.iter().rev() {
        if strides[d] != expect {
            return None;
        }
        expect *= shape[d] as isize;
    }
    let mut q: Vec<usize> = (0..shape.len()).collect();
    for (&slot, &d) in big.iter().zip(&sorted) {
        q[slot] = d;
    }
    Some(q)
}

/// How many leading dims a permutation `order` moves: the trailing dims after them keep their
/// place.
fn moved_dims(order: &[usize]) -> usize {
    let kept = (0..order.len())
        .rev()
        .take_while(|&i| order[i] == i)
        .count();
    order.len() - kept
}

/// The boxes `boxes` of a host tensor, each row-major, one after the other, as one host tensor
/// of `shape` (which holds exactly their elements): the stacked form of a sharded tensor
/// ([`crate::stack`]) built on the host, so that it uploads contiguous in one transfer.
///
/// # Errors
/// [`DTensorError::Unsupported`] for quantized data.
pub fn stack(
    data: TensorData,
    boxes: &[Vec<Range<usize>>],
    shape: Vec<usize>,
) -> Result<TensorData> {
    let whole: Vec<usize> = data.shape.to_vec();
    if consecutive(&whole, boxes) {
        // The boxes tile the buffer in order (a split of the leading dim): only the shape changes.
        return Ok(TensorData {
            shape: shape.into(),
            ..data
        });
    }
    let es = elem_size(&data)?;
    let src = data.as_bytes();
    let total: usize = shape.iter().product();
    // Boxes one after the other, each row-major: the runs come in output order.
    let runs = |sink: &mut dyn FnMut(usize, usize)| {
        for ranges in boxes {
            for_each_run(&whole, ranges, |s, _, n| sink(s, n));
        }
    };
    if let Some(out) = HostBuffer::collect_runs(src, data.dtype, total, runs) {
        debug_assert_eq!(
            out.as_bytes().len(),
            total * es,
            "boxes must fill the stacked shape"
        );
        return Ok(out.into_data(shape, data.dtype));
    }
    // Bytes not aligned for their elements: the same runs, copied as bytes.
    let mut out = Vec::with_capacity(total * es);
    runs(&mut |s, n| out.extend_from_slice(&src[s * es..(s + n) * es]));
    debug_assert_eq!(out.len(), total * es, "boxes must fill the stacked shape");
    Ok(TensorData::from_bytes_vec(out, shape, data.dtype))
}

/// Where the box `ranges` of a row-major tensor of `shape` starts (in elements) when it is one
/// contiguous run of the buffer (every dim after the first one it spans more than one index of
/// is whole), else `None`.
pub fn contiguous_start(shape: &[usize], ranges: &[Range<usize>]) -> Option<usize> {
    let first = ranges
        .iter()
        .position(|r| r.len() > 1)
        .unwrap_or(ranges.len());
    if ranges
        .iter()
        .zip(shape)
        .skip(first + 1)
        .any(|(r, &n)| r.start != 0 || r.end != n)
    {
        return None;
    }
    Some(
        ranges
            .iter()
            .zip(shape)
            .fold(0, |acc, (r, &n)| acc * n + r.start),
    )
}

/// Whether `boxes` of a row-major tensor of `shape` are contiguous runs of its buffer that follow
/// one another from its start to its end.
pub fn consecutive(shape: &[usize], boxes: &[Vec<Range<usize>>]) -> bool {
    let mut next = 0;
    for ranges in boxes {
        if contiguous_start(shape, ranges) != Some(next) {
            return false;
        }
        next += box_numel(ranges);
    }
    next == shape.iter().product::<usize>()
}

/// Assembles a host tensor of `shape` from chunks `(box, data)` that tile it.
///
/// # Errors
/// [`DTensorError::Unsupported`] for quantized data.
pub fn assemble(
    shape: &[usize],
    pieces: Vec<(Vec<Range<usize>>, TensorData)>,
) -> Result<TensorData> {
    let dtype = pieces[0].1.dtype;
    if pieces.len() == 1
        && pieces[0]
            .0
            .iter()
            .zip(shape)
            .all(|(r, &n)| r.start == 0 && r.end == n)
    {
        return Ok(pieces.into_iter().next().unwrap().1);
    }
    elem_size(&pieces[0].1)?;
    let boxes: Vec<(&[Range<usize>], &[u8])> = pieces
        .iter()
        .map(|(r, d)| (r.as_slice(), d.as_bytes()))
        .collect();
    Ok(assemble_bytes(shape, dtype, &boxes).into_data(shape.to_vec(), dtype))
}

/// Writes `src`, the row-major bytes of the box `ranges` (elements of `elem` bytes), into
/// `out`, the row-major bytes of a tensor of `shape`.
pub fn write_box(
    shape: &[usize],
    elem: usize,
    ranges: &[Range<usize>],
    src: &[u8],
    out: &mut [u8],
) {
    for_each_run(shape, ranges, |dst_off, piece_off, n| {
        out[dst_off * elem..(dst_off + n) * elem]
            .copy_from_slice(&src[piece_off * elem..(piece_off + n) * elem]);
    });
}

/// The row-major bytes of a tensor of `shape` and `dtype` from the row-major bytes of boxes
/// that tile it, in a buffer aligned for `dtype` ([`HostBuffer::into_data`] without a copy).
pub fn assemble_bytes(
    shape: &[usize],
    dtype: DType,
    pieces: &[(&[Range<usize>], &[u8])],
) -> HostBuffer {
    let elem = dtype.size();
    let mut out = HostBuffer::zeroed(shape.iter().product::<usize>() * elem, dtype);
    for (ranges, src) in pieces {
        write_box(shape, elem, ranges, src, out.as_bytes_mut());
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use burn::tensor::TensorData;

    /// The 24 permutations of 4 dims.
    pub(crate) fn permutations4() -> Vec<[usize; 4]> {
        let mut out = Vec::new();
        for a in 0..4 {
            for b in 0..4 {
                for c in 0..4 {
                    for d in 0..4 {
                        let mut seen = [a, b, c, d];
                        seen.sort();
                        if seen == [0, 1, 2, 3] {
                            out.push([a, b, c, d]);
                        }
                    }
                }
            }
        }
        out
    }

    /// The row-major order of a permuted view: it undoes every permutation of a 4-dim tensor,
    /// leaves size-1 dims in place, and is refused for slices, broadcasts and negative strides.
    #[test]
    #[cfg(any(feature = "ndarray", feature = "flex"))]
    fn row_major_order_undoes_a_permutation() {
        use super::row_major_order;
        // Row-major strides of `shape`, then the view permuted by `order`.
        let permuted = |shape: &[usize], order: &[usize]| -> (Vec<usize>, Vec<isize>) {
            let mut strides = vec![1isize; shape.len()];
            for d in (0..shape.len().saturating_sub(1)).rev() {
                strides[d] = strides[d + 1] * shape[d + 1] as isize;
            }
            order.iter().map(|&d| (shape[d], strides[d])).unzip()
        };
        // Every permutation of a 4-dim tensor: `q` undoes it (`order[q[i]]` back in order).
        for order in permutations4() {
            let (shape, strides) = permuted(&[2, 3, 4, 5], &order);
            match row_major_order(&shape, &strides) {
                None => assert_eq!(order, [0, 1, 2, 3]),
                Some(q) => {
                    let undone: Vec<usize> = q.iter().map(|&i| order[i]).collect();
                    assert_eq!(undone, [0, 1, 2, 3], "{order:?}");
                }
            }
        }
        // A stacked `x^T`: `[positions 4, features 1200, rows 8]`, from row-major `[4, 8, 1200]`.
        assert_eq!(
            row_major_order(&[4, 1200, 8], &[9600, 1, 1200]),
            Some(vec![0, 2, 1])
        );
        // Size-1 dims keep their place whatever their stride.
        assert_eq!(
            row_major_order(&[1, 1200, 1, 8], &[7, 1, 3, 1200]),
            Some(vec![0, 3, 2, 1])
        );
        // A slice (a gap between rows), a broadcast, a negative stride: no such order.
        assert_eq!(row_major_order(&[3, 4], &[1, 6]), None);
        assert_eq!(row_major_order(&[3, 4], &[0, 1]), None);
        assert_eq!(row_major_order(&[3, 4], &[-4, 1]), None);
        // Row-major already, with size-1 dims of any stride between the others, and a broadcast
        // with equal strides: `None` at once, as the stable sort would say.
        assert_eq!(row_major_order(&[2, 1, 3, 4], &[12, 99, 4, 1]), None);
        assert_eq!(row_major_order(&[2, 1, 3, 1], &[3, 0, 1, 7]), None);
        assert_eq!(row_major_order(&[4, 3], &[0, 0]), None);
        assert_eq!(row_major_order(&[1, 5], &[3, 1]), None);
        // A size-1 dim's stride out of order does not make a permuted view.
        assert_eq!(row_major_order(&[2, 1, 3], &[3, 100, 1]), None);
    }

    /// [`super::copy_strided`] against the strided-view formula (element `i` of the view at
    /// `offset + sum(i_d * strides[d])`), for every permutation of a `[3, 5, 9, 11]` tensor
    /// (odd sizes: partial tiles of the transposed-block path), at an offset, with a broadcast
    /// dim, a slice, 1-dim and 0-dim views, and in the four element widths.
    #[test]
    fn copy_strided_is_the_view_formula() {
        use burn::tensor::DType;
        let src: Vec<u32> = (0..2000).collect();
        let bytes: &[u8] = bytemuck::cast_slice(&src);
        let naive = |shape: &[usize], strides: &[usize], offset: usize| -> Vec<u32> {
            let n: usize = shape.iter().product();
            (0..n)
                .map(|mut i| {
                    let mut at = offset;
                    for d in (0..shape.len()).rev() {
                        at += (i % shape[d]) * strides[d];
                        i /= shape[d];
                    }
                    src[at]
                })
                .collect()
        };
        let check = |shape: &[usize], strides: &[usize], offset: usize| {
            let got =
                super::copy_strided(bytes, DType::U32, shape, strides, offset).expect("in bounds");
            assert_eq!(got.shape.to_vec(), shape.to_vec());
            assert_eq!(
                got.to_vec::<u32>().unwrap(),
                naive(shape, strides, offset),
                "{shape:?} {strides:?} {offset}"
            );
        };
        let (shape, row_major) = ([3, 5, 9, 11], [495, 99, 11, 1]);
        for order in permutations4() {
            let s: Vec<usize> = order.iter().map(|&d| shape[d]).collect();
            let t: Vec<usize> = order.iter().map(|&d| row_major[d]).collect();
            check(&s, &t, 0);
            check(&s, &t, 7);
        }
        // A broadcast dim, a slice of a transposed matrix, 1-dim and 0-dim views.
        check(&[4, 9, 11], &[0, 1, 9], 3);
        check(&[2, 6, 5], &[400, 1, 40], 2);
        // Transposed blocks of whole tiles only (the unrolled path), of whole tiles beside
        // partial ones in both dims (19 x 10), and the spatial IMDB step's transposed chunk
        // (32 rows of a column-major `[64, 24]` block per batch shard).
        check(&[2, 16, 24], &[400, 1, 16], 5);
        check(&[2, 19, 10], &[400, 1, 19], 1);
        check(&[2, 32, 24], &[32, 1, 64], 0);
        check(&[17], &[3], 1);
        check(&[], &[], 5);
        // The other element widths take the same paths.
        for (dtype, width) in [(DType::U8, 1), (DType::U16, 2), (DType::U64, 8)] {
            let (s, t) = ([4, 7, 5], [1, 4, 28]);
            let got = super::copy_strided(bytes, dtype, &s, &t, 1).expect("in bounds");
            let mut want = Vec::new();
            for a in 0..4 {
                for b in 0..7 {
                    for c in 0..5 {
                        let at = (1 + a + b * 4 + c * 28) * width;
                        want.extend_from_slice(&bytes[at..at + width]);
                    }
                }
            }
            assert_eq!(got.as_bytes(), &want[..], "{dtype:?}");
        }
        // Past the end: `None`, not a panic.
        assert!(super::copy_strided(bytes, DType::U32, &[10, 11], &[1, 200], 0).is_none());
    }

    /// Reshapes as views: row-major, a transposed view split and merged where it can be, and
    /// the reshapes that need a copy.
    #[test]
    fn view_strides_split_and_merge_contiguous_blocks() {
        use super::view_strides;
        // Row-major [6, 4]: any reshape is a view.
        assert_eq!(
            view_strides(&[6, 4], &[4, 1], &[2, 3, 4]),
            Some(vec![12, 4, 1])
        );
        assert_eq!(view_strides(&[6, 4], &[4, 1], &[24]), Some(vec![1]));
        assert_eq!(view_strides(&[6, 4], &[4, 1], &[3, 8]), Some(vec![8, 1]));
        // The transpose of a row-major [4, 6] ([6, 4] with strides [1, 6]): its dims split
        // (the spatial step's `[64, 48] -> [2, 32, 48]`), a unit dim dropped or added...
        assert_eq!(
            view_strides(&[6, 4], &[1, 6], &[2, 3, 4]),
            Some(vec![3, 1, 6])
        );
        assert_eq!(
            view_strides(&[1, 6, 4], &[99, 1, 6], &[6, 1, 2, 2]),
            Some(vec![1, 0, 12, 6])
        );
        // ...but do not merge across the transposed pair, and counts must agree.
        assert_eq!(view_strides(&[6, 4], &[1, 6], &[24]), None);
        assert_eq!(view_strides(&[6, 4], &[1, 6], &[3, 8]), None);
        assert_eq!(view_strides(&[6, 4], &[4, 1], &[5, 5]), None);
        assert_eq!(view_strides(&[6, 0], &[1, 6], &[0, 6]), None);
    }

    /// Every permutation of a rank-4 tensor (odd sizes) against NdArray's own permute.
    #[test]
    fn permute_by_runs_equals_the_backend_permute() {
        use burn::backend::NdArray;
        use burn::tensor::Tensor;
        let shape = [2usize, 3, 4, 5];
        let values: Vec<f32> = (0..120).map(|v| v as f32).collect();
        let t = Tensor::<NdArray, 4>::from_data(
            TensorData::new(values.clone(), shape),
            &Default::default(),
        );
        let mut count = 0;
        for order in permutations4() {
            let mut out = Vec::new();
            super::for_each_permuted_run(&shape, &order, &mut |s, n| {
                out.extend_from_slice(&values[s..s + n])
            });
            let want = t.clone().permute(order.map(|o| o as isize)).into_data();
            assert_eq!(
                out.as_slice(),
                want.as_slice::<f32>().unwrap(),
                "order {order:?}"
            );
            count += 1;
        }
        assert_eq!(count, 24);
        assert_eq!(super::permute_run(&shape, &[1, 0, 2, 3]), 20);
        assert_eq!(super::permute_run(&shape, &[0, 1, 3, 2]), 1);
    }

    fn grid() -> TensorData {
        TensorData::new((0..12).map(|v| v as f32).collect::<Vec<_>>(), [4, 3])
    }

    /// Row blocks tile the buffer in order (no copy); column blocks are gathered box by box.
    #[test]
    fn stack_lays_out_boxes_one_after_the_other() {
        let rows = crate::host::stack(grid(), &[vec![0..2, 0..3], vec![2..4, 0..3]], vec![2, 2, 3])
            .unwrap();
        assert!(super::consecutive(
            &[4, 3],
            &[vec![0..2, 0..3], vec![2..4, 0..3]]
        ));
        assert_eq!(rows.shape.to_vec(), vec![2, 2, 3]);
        assert_eq!(
            rows.to_vec::<f32>().unwrap(),
            (0..12).map(|v| v as f32).collect::<Vec<_>>()
        );
        let boxes = [vec![0..4, 0..1], vec![0..4, 1..2], vec![0..4, 2..3]];
        assert!(!super::consecutive(&[4, 3], &boxes));
        let cols = crate::host::stack(grid(), &boxes, vec![3, 4, 1]).unwrap();
        assert_eq!(
            cols.to_vec::<f32>().unwrap(),
            vec![0., 3., 6., 9., 1., 4., 7., 10., 2., 5., 8., 11.]
        );
        // Out of order: not consecutive.
        assert!(!super::consecutive(
            &[4, 3],
            &[vec![2..4, 0..3], vec![0..2, 0..3]]
        ));
    }

    /// A box read into memory not yet written equals the hand-listed elements of the box (and
    /// `append_box`'s bytes), for a column block, a row block, an inner block of a rank-3
    /// tensor, a scalar and an empty box.
    #[test]
    fn read_box_into_writes_the_box_row_major() {
        use std::mem::MaybeUninit;
        let read = |shape: &[usize], src: &[f32], ranges: &[std::ops::Range<usize>]| {
            let n = super::box_numel(ranges);
            let bytes: &[u8] = bytemuck::cast_slice(src);
            let mut out = vec![MaybeUninit::<u8>::uninit(); n * 4];
            super::read_box_into(shape, 4, bytes, ranges, &mut out);
            // SAFETY: `read_box_into` writes every byte of `out`.
            let got: Vec<u8> = out.iter().map(|b| unsafe { b.assume_init() }).collect();
            let mut packed = Vec::new();
            super::append_box(shape, 4, bytes, ranges, &mut packed);
            assert_eq!(got, packed);
            got.chunks(4)
                .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
                .collect::<Vec<f32>>()
        };
        let g: Vec<f32> = (0..12).map(|v| v as f32).collect();
        assert_eq!(
            read(&[4, 3], &g, &[0..4, 1..3]),
            vec![1., 2., 4., 5., 7., 8., 10., 11.]
        );
        assert_eq!(
            read(&[4, 3], &g, &[2..4, 0..3]),
            vec![6., 7., 8., 9., 10., 11.]
        );
        let c: Vec<f32> = (0..24).map(|v| v as f32).collect();
        assert_eq!(
            read(&[2, 3, 4], &c, &[1..2, 1..3, 2..4]),
            vec![18., 19., 22., 23.]
        );
        assert_eq!(read(&[], &[7.0], &[]), vec![7.0]);
        assert_eq!(read(&[4, 3], &g, &[1..1, 0..3]), Vec::<f32>::new());
    }
}
