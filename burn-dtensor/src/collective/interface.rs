//! The two interfaces a collective engine implements, and the reduction they apply: a leaf
//! module (it imports nothing of the crate but `host`'s byte helpers, themselves a leaf), so
//! that the engines, the mesh, the layouts and the SPMD world all depend on it and never on
//! each other through it.
//!
//! - [`LocalEngine`]: a fused in-process step over the shards of one group that a process holds
//!   (CubeCL kernels, NCCL across the CUDA devices of one process), chosen per mesh in
//!   `collective/engine.rs`.
//! - [`ProcessGroup`]: the processes along one mesh axis (MPI, NCCL across processes), chosen
//!   in the same file when a multi-process mesh is built.

use std::any::Any;
use std::mem::MaybeUninit;
use std::ops::Range;
use std::sync::Arc;

use burn::tensor::DType;

/// The reduction a partial result is waiting for along one mesh axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// The global value is the sum of the devices' values.
    Sum,
    /// The global value is the element-wise maximum.
    Max,
    /// The global value is the element-wise minimum.
    Min,
}

/// A fused in-process collective step. Every method returns `None` when the engine does not
/// apply to these primitives; the default implementations never apply.
pub(crate) trait LocalEngine: Send + Sync + 'static {
    /// A short name (`"cubecl-wgpu"`, `"nccl"`): the mesh's `Debug` and equality use it.
    fn name(&self) -> &'static str;
    /// The element-wise `op`-reduction of `parts` (same shape, same device) as one primitive.
    fn reduce(&self, _parts: &[&dyn Any], _op: ReduceOp) -> Option<Box<dyn Any>> {
        None
    }
    /// The concatenation of non-empty `parts` (same device) along `dim`.
    fn cat(&self, _parts: &[&dyn Any], _dim: usize) -> Option<Box<dyn Any>> {
        None
    }
    /// An all-reduce of `members`, one primitive per member device (distinct devices): each
    /// member's result, in order.
    fn all_reduce(&self, _members: &[&dyn Any], _op: ReduceOp) -> Option<Vec<Box<dyn Any>>> {
        None
    }
}

/// Copies `src` into `dst` (of the same length), initialising it.
///
/// # Panics
/// When the lengths differ.
pub(crate) fn write_bytes(dst: &mut [MaybeUninit<u8>], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "burn-dtensor: copy between buffers");
    // SAFETY: both hold `src.len()` bytes and cannot overlap (one is borrowed mutably).
    unsafe {
        std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_mut_ptr().cast(), src.len());
    }
}

/// The offsets of parts of `counts` bytes laid back to back.
pub(crate) fn offsets(counts: &[usize]) -> Vec<usize> {
    counts
        .iter()
        .scan(0, |at, &n| {
            let here = *at;
            *at += n;
            Some(here)
        })
        .collect()
}

/// Checks that parts `(counts, offsets)` (one per member) lie inside a buffer of `len` bytes.
///
/// # Panics
/// When one does not, or the two lists differ in length, naming `what`.
pub(crate) fn check_parts(len: usize, (counts, offsets): (&[usize], &[usize]), what: &str) {
    assert_eq!(
        counts.len(),
        offsets.len(),
        "burn-dtensor: {what}: one offset per part"
    );
    for (&c, &at) in counts.iter().zip(offsets) {
        assert!(
            at.checked_add(c).is_some_and(|end| end <= len),
            "burn-dtensor: {what}: a part of {c} bytes at {at} lies outside a buffer of {len}"
        );
    }
}

/// A copy of member `rank`'s part of an all-gather buffer (`counts[rank]` bytes at offset
/// `counts[..rank].sum()`), the input of an in-place all-gather
/// ([`ProcessGroup::all_gather_in_place`]) run as a copying one.
///
/// # Safety
/// That part of `buf` is initialised.
pub(crate) unsafe fn own_part(buf: &[MaybeUninit<u8>], counts: &[usize], rank: usize) -> Vec<u8> {
    let at: usize = counts[..rank].iter().sum();
    buf[at..at + counts[rank]]
        .iter()
        // SAFETY: initialised (this function's contract).
        .map(|b| unsafe { b.assume_init() })
        .collect()
}

/// A byte vector of length `n` filled by `fill`, which must initialise every byte of the slice it
/// is given (a [`ProcessGroup`] method's `recv`: its safety contract).
fn filled(n: usize, fill: impl FnOnce(&mut [MaybeUninit<u8>])) -> Vec<u8> {
    let mut v = Vec::with_capacity(n);
    fill(&mut v.spare_capacity_mut()[..n]);
    // SAFETY: `fill` initialised the first `n` bytes (the contract of `ProcessGroup`'s methods).
    unsafe { v.set_len(n) };
    v
}

/// The boxes of [`ProcessGroup::all_to_all_boxes`] as parts of one send buffer: `send` itself
/// when every box is a contiguous run of it (blocks of a leading dim: nothing to pack), else
/// the boxes packed back to back (in a buffer from `host::scratch`). Returns the packed bytes
/// (`None`: send `send` as it is), each box's byte count and offset.
///
/// # Panics
/// When `send` is not the size of `shape` or a box lies outside it.
pub(crate) fn pack_boxes(
    send: &[u8],
    (shape, elem): (&[usize], usize),
    boxes: &[Option<&[Range<usize>]>],
) -> (Option<Vec<u8>>, Vec<usize>, Vec<usize>) {
    check_boxes(send.len(), (shape, elem), boxes);
    let numel = |b: &[Range<usize>]| crate::host::box_numel(b);
    let counts: Vec<usize> = boxes.iter().map(|b| b.map_or(0, numel) * elem).collect();
    let in_place: Option<Vec<usize>> = boxes
        .iter()
        .map(|b| match b {
            Some(b) if numel(b) > 0 => crate::host::contiguous_start(shape, b).map(|s| s * elem),
            _ => Some(0),
        })
        .collect();
    if let Some(at) = in_place {
        return (None, counts, at);
    }
    let mut packed = crate::host::scratch(0);
    let mut at = Vec::with_capacity(boxes.len());
    for b in boxes {
        at.push(packed.len());
        if let Some(b) = b {
            crate::host::append_box(shape, elem, send, b, &mut packed);
        }
    }
    (Some(packed), counts, at)
}

/// [`ProcessGroup::all_to_all_boxes`] by packing: the boxes back to back, or as they lie
/// when each is a contiguous run ([`pack_boxes`]), then [`ProcessGroup::all_to_all_placed`].
/// The trait's default, and an engine's fallback.
pub(crate) fn packed_all_to_all<G: ProcessGroup + ?Sized>(
    pg: &G,
    send: &[u8],
    array: (&[usize], usize),
    send_boxes: &[Option<&[Range<usize>]>],
    recv: &mut [MaybeUninit<u8>],
    recv_parts: (&[usize], &[usize]),
    what: &str,
) {
    own_box_apart(
        pg.rank(),
        send,
        array,
        send_boxes,
        recv,
        recv_parts,
        what,
        |boxes, recv, recv_parts| {
            let (packed, counts, at) = pack_boxes(send, array, boxes);
            let bytes = packed.as_deref().unwrap_or(send);
            pg.all_to_all_placed(bytes, (&counts, &at), recv, recv_parts, what);
            if let Some(packed) = packed {
                crate::host::return_scratch(packed);
            }
        },
    )
}

/// [`ProcessGroup::all_to_all_boxes`] with member `me`'s own box kept out of the exchange:
/// `exchange` moves the other boxes (given the own box as `None` and its receive count as 0),
/// then the own box is copied from `send` straight into its receive part
/// ([`crate::host::read_box_into`]): one copy, where sending it to itself through the engine
/// packed it and copied it again.
///
/// # Panics
/// As [`check_own_box`], which checks the boxes and parts first (the own box's bytes against
/// its receive count included).
#[allow(clippy::too_many_arguments)]
pub(crate) fn own_box_apart(
    me: usize,
    send: &[u8],
    (shape, elem): (&[usize], usize),
    send_boxes: &[Option<&[Range<usize>]>],
    recv: &mut [MaybeUninit<u8>],
    (recv_counts, recv_at): (&[usize], &[usize]),
    what: &str,
    exchange: impl FnOnce(&[Option<&[Range<usize>]>], &mut [MaybeUninit<u8>], (&[usize], &[usize])),
) {
    let parts = (recv_counts, recv_at);
    let array = (shape, elem);
    let bytes = check_own_box(me, send.len(), array, send_boxes, recv.len(), parts, what);
    let Some(own) = send_boxes.get(me).copied().flatten() else {
        return exchange(send_boxes, recv, parts);
    };
    let mut boxes = send_boxes.to_vec();
    boxes[me] = None;
    let mut counts = recv_counts.to_vec();
    counts[me] = 0;
    exchange(&boxes, recv, (&counts, recv_at));
    let at = recv_at[me];
    crate::host::read_box_into(shape, elem, send, own, &mut recv[at..at + bytes]);
}

/// Checks an all-to-all's boxes against its send buffer of `send_len` bytes ([`check_boxes`]),
/// its receive parts against a buffer of `recv_len` bytes ([`check_parts`]), and that member
/// `me`'s own box holds as many bytes as its receive part. Returns those bytes (0 where `me`
/// has no own box).
///
/// # Panics
/// Naming what is wrong (a caller's bug: the library builds the boxes and parts).
pub(crate) fn check_own_box(
    me: usize,
    send_len: usize,
    (shape, elem): (&[usize], usize),
    send_boxes: &[Option<&[Range<usize>]>],
    recv_len: usize,
    (recv_counts, recv_at): (&[usize], &[usize]),
    what: &str,
) -> usize {
    check_boxes(send_len, (shape, elem), send_boxes);
    check_parts(recv_len, (recv_counts, recv_at), what);
    let own = send_boxes
        .get(me)
        .copied()
        .flatten()
        .map_or(0, |b| crate::host::box_numel(b) * elem);
    let part = recv_counts.get(me).copied().unwrap_or(0);
    assert_eq!(
        own, part,
        "burn-dtensor: {what}: this member's own part is {own} bytes, its receive part {part}"
    );
    own
}

/// Checks that `send` holds the array of `shape` (`elem` bytes an element) and every box lies
/// inside it, one range per dim.
///
/// # Panics
/// Naming what is wrong (a caller's bug: the library builds the boxes).
pub(crate) fn check_boxes(
    len: usize,
    (shape, elem): (&[usize], usize),
    boxes: &[Option<&[Range<usize>]>],
) {
    assert_eq!(
        len,
        shape.iter().product::<usize>() * elem,
        "burn-dtensor: an all-to-all's send buffer is not its array of {shape:?}"
    );
    for b in boxes.iter().flatten() {
        assert!(
            b.len() == shape.len()
                && b.iter()
                    .zip(shape)
                    .all(|(r, &n)| r.start <= r.end && r.end <= n),
            "burn-dtensor: an all-to-all's box {b:?} lies outside its array of {shape:?}"
        );
    }
}

/// A group of processes that run collectives together: the world, or the processes along one
/// mesh axis. Implemented once per engine (`collective/mpi.rs` for MPI, `collective/nccl_process.rs`
/// for NCCL; a world of one process needs none). Buffers are host bytes: the element-wise reduction needs `dtype`, the
/// other collectives move bytes.
///
/// A collective that does not complete within [`Config::collective_timeout`](crate::Config::collective_timeout) ends the job with a
/// message naming the operation `what` and the missing peers ([`crate::spmd`]'s fault policy):
/// the methods return only on success.
///
/// Receive buffers (`recv`) are memory the caller has not initialised (`MaybeUninit`): a
/// received tensor's buffer is allocated and handed to the engine as it is, never zeroed first
/// (zeroing it cost a fifth of a 4 MB all-gather across 2 processes, measured in session 28).
///
/// # Safety
/// Every method that is given a `recv` writes every byte of it before it returns (it returns
/// only on success): callers read `recv` as initialised bytes afterwards. The one exception is
/// [`ProcessGroup::all_to_all_placed`], which writes every byte of the parts it is given and
/// leaves the rest to its caller.
pub unsafe trait ProcessGroup: Send + Sync {
    /// This process's rank in the group (`0..size`).
    fn rank(&self) -> usize;
    /// Number of processes in the group.
    fn size(&self) -> usize;
    /// The world ranks of the members, in group rank order (for diagnostics).
    fn world_ranks(&self) -> &[usize];
    /// The name of the engine (`mpi`).
    fn engine(&self) -> &'static str;
    /// Splits the group: processes passing equal `color` form a sub-group, ranked by `key`.
    /// Collective: every member calls it, in the same order.
    fn split(&self, color: usize, key: usize) -> Arc<dyn ProcessGroup>;
    /// The element-wise `op`-reduction of every member's `send` (elements of `dtype`; bool is
    /// reduced as or/and of its elements), written into `recv` (same length, allocated by the
    /// caller so that it can become a tensor without a copy).
    fn all_reduce_into(
        &self,
        send: &[u8],
        recv: &mut [MaybeUninit<u8>],
        dtype: DType,
        op: ReduceOp,
        what: &str,
    );
    /// [`ProcessGroup::all_reduce_into`] in place (one copy of `buf` as the input).
    fn all_reduce(&self, buf: &mut [u8], dtype: DType, op: ReduceOp, what: &str) {
        let out = filled(buf.len(), |recv| {
            self.all_reduce_into(buf, recv, dtype, op, what)
        });
        buf.copy_from_slice(&out);
    }
    /// The reduce-scatter: the element-wise `op`-reduction of every member's `send`, of which
    /// member `r` receives the `recv_counts[r]` bytes at offset `recv_counts[..r].sum()`, written
    /// into `recv` (of `recv_counts[rank]` bytes). `send` holds `recv_counts.iter().sum()` bytes
    /// on every member (uneven and empty parts allowed).
    ///
    /// The default is an all-reduce of the whole buffer and a copy of this member's part
    /// (twice the traffic); engines with a native reduce-scatter (MPI's `MPI_Reduce_scatter`)
    /// override it.
    fn reduce_scatter_into(
        &self,
        send: &[u8],
        recv_counts: &[usize],
        recv: &mut [MaybeUninit<u8>],
        dtype: DType,
        op: ReduceOp,
        what: &str,
    ) {
        let all = filled(send.len(), |all| {
            self.all_reduce_into(send, all, dtype, op, what)
        });
        let at: usize = recv_counts[..self.rank()].iter().sum();
        write_bytes(recv, &all[at..at + recv_counts[self.rank()]]);
    }
    /// The concatenation, in rank order, of every member's `send`, written into `recv` (of
    /// `counts.iter().sum()` bytes); member `r` sends `counts[r]` bytes (uneven and empty parts
    /// allowed). The caller allocates `recv`, so that it can be aligned for the elements it
    /// receives (`crate::host::HostBuffer`) and become a tensor without a copy.
    fn all_gather_into(
        &self,
        send: &[u8],
        counts: &[usize],
        recv: &mut [MaybeUninit<u8>],
        what: &str,
    );
    /// [`ProcessGroup::all_gather_into`] with this member's part already where it belongs: `buf`
    /// holds `counts.iter().sum()` bytes, this member's part (`counts[rank]` bytes at offset
    /// `counts[..rank].sum()`) written by the caller, and the call writes every other part. No
    /// send buffer and no copy of the own part: the caller computes its part into the result
    /// (the ordered all-reduce writes its reduced chunk there).
    ///
    /// The default copies the own part out and calls [`ProcessGroup::all_gather_into`]; MPI
    /// passes `MPI_IN_PLACE` where the library's value of it is known.
    ///
    /// # Safety
    /// The caller has initialised this member's part of `buf`. On return every byte of `buf`
    /// is initialised (the trait's contract).
    unsafe fn all_gather_in_place(
        &self,
        buf: &mut [MaybeUninit<u8>],
        counts: &[usize],
        what: &str,
    ) {
        // SAFETY: the caller initialised this member's part (this method's contract).
        let own = unsafe { own_part(buf, counts, self.rank()) };
        self.all_gather_into(&own, counts, buf, what)
    }
    /// [`ProcessGroup::all_gather_into`] into a new byte buffer.
    fn all_gather(&self, send: &[u8], counts: &[usize], what: &str) -> Vec<u8> {
        filled(counts.iter().sum(), |recv| {
            self.all_gather_into(send, counts, recv, what)
        })
    }
    /// The personalised exchange: member `r` receives, from every member `q` in rank order,
    /// the part of `q`'s `send` addressed to `r`. `send` holds this member's parts for members
    /// `0..size` back to back, `send_counts[r]` bytes for member `r`; `recv_counts[q]` is what
    /// `q` sends here (uneven and empty parts allowed). The received parts are written back to
    /// back into `recv` (of `recv_counts.iter().sum()` bytes, allocated by the caller).
    ///
    /// The default moves every member's whole `send` to everyone (an all-gather of the counts,
    /// then of the buffers): correct, `size` times the bytes; engines with a native all-to-all
    /// (MPI's `MPI_Alltoallv`) override it.
    fn all_to_all_into(
        &self,
        send: &[u8],
        send_counts: &[usize],
        recv_counts: &[usize],
        recv: &mut [MaybeUninit<u8>],
        what: &str,
    ) {
        let n = self.size();
        let mine: Vec<u8> = send_counts
            .iter()
            .flat_map(|c| (*c as u64).to_le_bytes())
            .collect();
        let counts = self.all_gather(&mine, &vec![8 * n; n], what);
        let count = |q: usize, r: usize| {
            let at = (q * n + r) * 8;
            u64::from_le_bytes(counts[at..at + 8].try_into().unwrap()) as usize
        };
        let totals: Vec<usize> = (0..n).map(|q| (0..n).map(|r| count(q, r)).sum()).collect();
        let all = self.all_gather(send, &totals, what);
        let (me, mut at, mut base) = (self.rank(), 0, 0);
        for q in 0..n {
            let off: usize = (0..me).map(|r| count(q, r)).sum();
            let c = count(q, me);
            assert_eq!(c, recv_counts[q], "burn-dtensor: all-to-all counts");
            write_bytes(&mut recv[at..at + c], &all[base + off..base + off + c]);
            at += c;
            base += totals[q];
        }
        assert_eq!(at, recv.len(), "burn-dtensor: all-to-all receive buffer");
    }
    /// The point-to-point exchange of a collective permute: member `r` receives `send_counts[r]`
    /// bytes of this member's `send` (its parts back to back in member order; 0: nothing goes
    /// to `r`), and `recv_counts[q]` bytes come from member `q`, written back to back in member
    /// order into `recv` (of `recv_counts.iter().sum()` bytes). Counts must pair up (what `q`
    /// sends here is what this member expects from `q`). Every member calls it, those with
    /// nothing to move too.
    ///
    /// The default is [`ProcessGroup::all_to_all_into`] (a personalised exchange over the whole
    /// group); MPI sends and receives between the members with a nonzero count only
    /// (`MPI_Isend` / `MPI_Irecv`): a halo exchange then waits on its neighbours, not the group.
    fn send_recv(
        &self,
        send: &[u8],
        send_counts: &[usize],
        recv_counts: &[usize],
        recv: &mut [MaybeUninit<u8>],
        what: &str,
    ) {
        self.all_to_all_into(send, send_counts, recv_counts, recv, what)
    }
    /// [`ProcessGroup::all_to_all_into`] with the parts where the caller puts them: the part
    /// for member `r` is the `send_parts.0[r]` bytes of `send` at offset `send_parts.1[r]`; the
    /// part from member `q` (`recv_parts.0[q]` bytes) is written at offset `recv_parts.1[q]` of
    /// `recv`. The parts of `recv` must not overlap; bytes of `recv` outside them are left as
    /// they are, for the caller to write (this member's own part, copied there straight from
    /// its source instead of through the engine: an all-to-all that rearranges a shard packs
    /// the parts it sends, and the engine's copy of the own part would be a second copy).
    ///
    /// # Panics
    /// When a part lies outside its buffer.
    ///
    /// The default packs the send parts back to back, calls
    /// [`ProcessGroup::all_to_all_into`] and places the received parts; MPI's `MPI_Ialltoallv`
    /// takes the displacements itself.
    fn all_to_all_placed(
        &self,
        send: &[u8],
        send_parts: (&[usize], &[usize]),
        recv: &mut [MaybeUninit<u8>],
        recv_parts: (&[usize], &[usize]),
        what: &str,
    ) {
        check_parts(send.len(), send_parts, what);
        check_parts(recv.len(), recv_parts, what);
        let mut packed = Vec::with_capacity(send_parts.0.iter().sum());
        for (&c, &at) in send_parts.0.iter().zip(send_parts.1) {
            packed.extend_from_slice(&send[at..at + c]);
        }
        let got = filled(recv_parts.0.iter().sum(), |got| {
            self.all_to_all_into(&packed, send_parts.0, recv_parts.0, got, what)
        });
        let mut from = 0;
        for (&c, &at) in recv_parts.0.iter().zip(recv_parts.1) {
            write_bytes(&mut recv[at..at + c], &got[from..from + c]);
            from += c;
        }
    }
    /// [`ProcessGroup::all_to_all_placed`] with the send parts read from a row-major array:
    /// the part for member `r` is the box `send_boxes[r]` (one range per dim of `shape`, in
    /// elements of `elem` bytes; `None` sends nothing) of the array of `shape` in `send`, sent in
    /// the box's row-major order. The receive side is [`ProcessGroup::all_to_all_placed`]'s.
    /// How an engine reads the boxes is [`Config::strided_send`](crate::Config::strided_send);
    /// `global_bytes` (a size equal on every member: the exchanged tensor's, or a round's of a
    /// chunked reduction) lets it choose by size, all members alike.
    ///
    /// # Panics
    /// When a box lies outside `shape` or `send` is not the array's size, or as
    /// [`ProcessGroup::all_to_all_placed`].
    ///
    /// Every member must call it for the same all-to-all (not some this method, some
    /// [`ProcessGroup::all_to_all_placed`]): an engine may run it as another collective.
    ///
    /// This member's own box (`send_boxes[rank]`) is copied from `send` into its receive part
    /// by one local copy, never sent to itself through the exchange.
    ///
    /// The default packs the boxes back to back (unless each is a contiguous run already,
    /// no pack needed) and calls [`ProcessGroup::all_to_all_placed`]; MPI may instead hand
    /// `MPI_Ialltoallw` one datatype per box
    /// ([`StridedSend::Datatype`](crate::StridedSend::Datatype)) or write each box into its
    /// member's receive buffer ([`StridedSend::SingleCopy`](crate::StridedSend::SingleCopy)).
    #[allow(clippy::too_many_arguments)]
    fn all_to_all_boxes(
        &self,
        send: &[u8],
        (shape, elem): (&[usize], usize),
        send_boxes: &[Option<&[Range<usize>]>],
        recv: &mut [MaybeUninit<u8>],
        recv_parts: (&[usize], &[usize]),
        global_bytes: usize,
        what: &str,
    ) {
        let _ = global_bytes;
        packed_all_to_all(
            self,
            send,
            (shape, elem),
            send_boxes,
            recv,
            recv_parts,
            what,
        )
    }
    /// [`ProcessGroup::all_to_all_into`] into a new byte buffer.
    fn all_to_all(
        &self,
        send: &[u8],
        send_counts: &[usize],
        recv_counts: &[usize],
        what: &str,
    ) -> Vec<u8> {
        filled(recv_counts.iter().sum(), |recv| {
            self.all_to_all_into(send, send_counts, recv_counts, recv, what)
        })
    }
    /// Gives every member the `buf` of member `root` (all pass buffers of the same length).
    fn broadcast(&self, buf: &mut [u8], root: usize, what: &str);
    /// Ends every process of the job with exit status `code` (`MPI_Abort` on the world): the
    /// engine's part of [`crate::spmd::abort_job`]. Never returns.
    fn abort(&self, code: i32) -> !;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The own box is kept out of the exchange (given as `None`, its receive count 0, every
    /// other box and count as they were) and copied into its receive part as `append_box`
    /// packs it; the exchange fills the rest.
    #[test]
    fn own_box_apart_copies_the_own_box_once() {
        let (shape, elem) = ([4usize, 6], 4);
        let send: Vec<u8> = (0..4 * 6 * elem).map(|i| (i * 7 % 251) as u8).collect();
        // Member q's box: columns 2q..2q+2 of every row; this member is 1.
        let boxes: Vec<Vec<Range<usize>>> = (0..3).map(|q| vec![0..4, 2 * q..2 * q + 2]).collect();
        let send_boxes: Vec<Option<&[Range<usize>]>> =
            boxes.iter().map(|b| Some(b.as_slice())).collect();
        let counts = vec![32, 32, 32];
        let at = offsets(&counts);
        let mut recv = vec![MaybeUninit::new(0u8); 96];
        let mut seen = None;
        own_box_apart(
            1,
            &send,
            (&shape, elem),
            &send_boxes,
            &mut recv,
            (&counts, &at),
            "test",
            |b, r, (c, a)| {
                let nones: Vec<bool> = b.iter().map(Option::is_none).collect();
                seen = Some((nones, c.to_vec(), a.to_vec()));
                for q in [0, 2] {
                    write_bytes(&mut r[a[q]..a[q] + c[q]], &[0xAB; 32]);
                }
            },
        );
        let (b, c, a) = seen.expect("the exchange ran");
        assert_eq!(b, [false, true, false], "only the own box is left out");
        assert_eq!((c, a), (vec![32, 0, 32], at.clone()));
        // SAFETY: every byte was written (the exchange's parts and the own copy).
        let got: Vec<u8> = recv.iter().map(|x| unsafe { x.assume_init() }).collect();
        let mut own = Vec::new();
        crate::host::append_box(&shape, elem, &send, &boxes[1], &mut own);
        assert_eq!(&got[32..64], &own[..]);
        assert!(got[..32].iter().chain(&got[64..]).all(|&x| x == 0xAB));
    }
}
