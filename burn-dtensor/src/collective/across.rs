//! The across-process part of a collective on a multi-process mesh ([`crate::Mesh::spmd`]):
//! after the shards of one process are combined in process (the in-process path of
//! [`super::generic`]), one value per process goes through the axis' [`ProcessGroup`] (the
//! engine: MPI) via host memory, and comes back on the device it came from.
//!
//! Each function is called once per in-process group, in the same order on every process, so
//! the calls of the processes along an axis pair up.

use std::ops::Range;
use std::sync::Arc;

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Shape, TensorData, TensorMetadata};

use super::interface::{ProcessGroup, ReduceOp, offsets, write_bytes};
use crate::comm::CollectiveKind;
use crate::host::{self, HostBuffer};
use crate::mesh::MeshTopology;
use crate::shard::chunk;
use crate::tensor::Kind;

fn what(kind: CollectiveKind, topo: &MeshTopology, axis: usize, shape: &[usize]) -> String {
    format!(
        "{kind} along mesh axis `{}` (tensor {shape:?}) across processes",
        topo.axis_name(axis)
    )
}

/// A primitive's bytes on the host, for a transfer: read in place where the inner backend keeps
/// them in host memory in row-major order ([`crate::inner::host_bytes`]: NdArray, Flex), else a
/// downloaded copy ([`Kind::into_host`]).
enum Outgoing<P> {
    InPlace(P),
    Copy(TensorData),
}

impl<P: TensorMetadata + Clone + 'static> Outgoing<P> {
    fn new<B: Backend, K: Kind<B, P = P>>(x: P) -> Self {
        if crate::inner::host_bytes(&x).is_some() {
            return Outgoing::InPlace(x);
        }
        // A permuted or strided view on a host backend (a transposed operand of a contraction):
        // one row-major copy by the backend (NdArray lays a reshape out in row-major order),
        // read in place. A download of the view itself walked it element by element (NdArray:
        // 38% of the spatial-mode step on 2 processes). Bool is never read in place
        // ([`crate::inner::host_bytes`]), so it goes straight to the download.
        if crate::inner::threads_for::<B>() && !matches!(x.dtype(), DType::Bool(_)) {
            let shape = x.shape();
            let y = K::reshape(x.clone(), shape);
            if crate::inner::host_bytes(&y).is_some() {
                return Outgoing::InPlace(y);
            }
        }
        Outgoing::Copy(K::into_host(x))
    }
    /// The primitive whose bytes are read in place, if they are.
    fn in_place(&self) -> Option<&P> {
        match self {
            Outgoing::InPlace(x) => Some(x),
            Outgoing::Copy(_) => None,
        }
    }
    fn bytes(&self) -> &[u8] {
        match self {
            Outgoing::InPlace(x) => crate::inner::host_bytes(x).expect("checked in `new`"),
            Outgoing::Copy(d) => d.as_bytes(),
        }
    }
}

/// The dtype the engine reduces values of `dtype` in: half floats have no MPI type and are
/// widened to f32 (the caller narrows the result back), every other dtype is its own.
pub(crate) fn reduction_dtype(dtype: DType) -> DType {
    match dtype {
        DType::F16 | DType::BF16 => DType::F32,
        d => d,
    }
}

/// The bytes of `x` for an engine reduction and the dtype they are reduced in
/// ([`reduction_dtype`]): a widened download for half floats, else the bytes as they are
/// ([`Outgoing::new`]).
fn for_reduction<B: Backend, K: Kind<B>>(x: K::P) -> (Outgoing<K::P>, DType) {
    let work = reduction_dtype(x.dtype());
    if work != x.dtype() {
        (Outgoing::Copy(K::into_host(x).convert_dtype(work)), work)
    } else {
        (Outgoing::new::<B, K>(x), work)
    }
}

/// The engine's process group along `axis`, when more than one process lies along it.
pub(crate) fn group(topo: &MeshTopology, axis: usize) -> Option<&Arc<dyn ProcessGroup>> {
    topo.process_group(axis)
}

/// The process-group reduction of `x` (every process passes its in-process reduction), with
/// the bytes this process received (ring-algorithm count: `2 (p-1)/p` of the buffer).
pub(crate) fn all_reduce<B: Backend, K: Kind<B>>(
    x: K::P,
    pg: &Arc<dyn ProcessGroup>,
    topo: &MeshTopology,
    axis: usize,
    op: ReduceOp,
    global: &[usize],
) -> (K::P, u64) {
    let w = what(CollectiveKind::AllReduce, topo, axis, global);
    let p = pg.size() as u64;
    // In place where this process holds the only reference to the shard's host bytes (the
    // settled gradient of a data-parallel step: its partial sum is consumed by the reduction):
    // the engine writes the result over the input and the primitive is the output, with no
    // second buffer of the message's size (fresh pages faulted in on every step).
    let mut x = x;
    let dtype = x.dtype();
    if reduction_dtype(dtype) == dtype
        && let Some(bytes) = crate::inner::host_bytes_mut(&mut x)
    {
        let n = bytes.len() as u64;
        pg.all_reduce(bytes, dtype, op, &w);
        return (x, 2 * (p - 1) * n / p);
    }
    let device = K::device(&x);
    let (shape, dtype) = (x.shape().to_vec(), x.dtype());
    let (data, work_dtype) = for_reduction::<B, K>(x);
    let n = data.bytes().len();
    // The engine reads the shard's bytes (in place on host-memory backends) and writes an
    // aligned buffer that becomes the tensor as it is: no copy around the call.
    // SAFETY: the engine writes all of `recv` (`ProcessGroup`'s contract).
    let recv = unsafe {
        HostBuffer::received(n, work_dtype, |recv| {
            pg.all_reduce_into(data.bytes(), recv, work_dtype, op, &w)
        })
    };
    drop(data);
    let out = recv.into_data(shape, work_dtype).convert_dtype(dtype);
    (K::from_data(out, &device), 2 * (p - 1) * n as u64 / p)
}

/// The engine's reduce-scatter along `dim` (`MPI_Reduce_scatter`, in the engine's own
/// reduction order): `x` is this process's in-process reduction, whole along `dim`; every
/// process receives the reduction of its block of `dim` ([`block`]). `dim` is moved first for
/// the call (the engine scatters contiguous parts) and back after it. Returns the block (the
/// shape of `x` with this process's block length along `dim`) and the bytes received
/// (`(p-1)` times the block, a ring's count).
pub(crate) fn reduce_scatter<B: Backend, K: Kind<B>>(
    x: K::P,
    pg: &Arc<dyn ProcessGroup>,
    topo: &MeshTopology,
    (axis, dim): (usize, usize),
    op: ReduceOp,
    global: &[usize],
) -> (K::P, u64) {
    let device = K::device(&x);
    let rank = x.shape().num_dims();
    let perm: Vec<usize> = std::iter::once(dim)
        .chain((0..rank).filter(|&d| d != dim))
        .collect();
    let x = if dim == 0 { x } else { K::permute(x, &perm) };
    let (mut shape, dtype) = (x.shape().to_vec(), x.dtype());
    let (data, work_dtype) = for_reduction::<B, K>(x);
    let n = shape[0];
    let row = data.bytes().len().checked_div(n).unwrap_or(0);
    let (k, l) = (topo.axis_size(axis), topo.local_axis_size(axis));
    let (p, me) = (pg.size(), pg.rank());
    let counts: Vec<usize> = (0..p).map(|q| block(n, k, l, q).len() * row).collect();
    let w = what(CollectiveKind::ReduceScatter, topo, axis, global);
    // SAFETY: the engine writes all of `recv` (`ProcessGroup`'s contract).
    let recv = unsafe {
        HostBuffer::received(counts[me], work_dtype, |recv| {
            pg.reduce_scatter_into(data.bytes(), &counts, recv, work_dtype, op, &w)
        })
    };
    drop(data);
    shape[0] = block(n, k, l, me).len();
    let out = K::from_data(
        recv.into_data(shape, work_dtype).convert_dtype(dtype),
        &device,
    );
    let out = if dim == 0 {
        out
    } else {
        K::permute(out, &crate::host::inverse_permutation(&perm))
    };
    (out, ((p - 1) * counts[me]) as u64)
}

/// Bytes a process sends in one exchange of a chunked ordered reduction
/// ([`reduce_own_block`]): a larger input goes in several exchanges (rounds), at most
/// `4 x` the processes, so that besides the block it produces a process holds one round's send
/// and receive buffers, not its whole input twice.
const ROUND_BYTES: usize = 8 << 20;

/// The ordered reduction behind [`all_reduce_ordered`] and [`reduce_scatter_ordered`]: process
/// `q` receives from every member of the group (all `k`, in mesh coordinate order) the range
/// `ranges(q)` of `dim` of its shard, and reduces those `k` blocks with `reduce`. `members` are
/// this process's shards of the group (same shape, whole along `dim`), in coordinate order.
///
/// Inputs over [`ROUND_BYTES`] go in rounds: round `r` moves slice `r` of every block (each
/// member's slice downloaded on its own) and reduces it; the caller places the reduced slices
/// (`emit`). Where one member is read in place and cut along dim 0, this process's own slice is
/// a view of it, never sent to itself. `reduce` is element-wise (its shape, chain or tree, is
/// fixed by the caller from the whole shards), so every element is reduced as in one exchange:
/// the rounds change the memory, never a bit of the result. Peak beside the input: one round's
/// send buffer, its received blocks as a tensor, and what `emit` keeps of the block produced.
///
/// Each round's reduced slice goes to `emit` with its range of `dim` within this process's
/// block (`0..ranges(me).len()`; the slice has the members' shape with that length along `dim`);
/// the ranges of the rounds tile the block, in order (empty slices are not emitted). Returns the
/// bytes this process received.
fn reduce_own_block<B: Backend, K: Kind<B>>(
    mut members: Vec<K::P>,
    pg: &Arc<dyn ProcessGroup>,
    (dim, ranges): (usize, &dyn Fn(usize) -> Range<usize>),
    w: &str,
    reduce: &dyn Fn(&[K::P]) -> K::P,
    emit: &mut dyn FnMut(Range<usize>, K::P),
) -> u64 {
    let device = K::device(&members[0]);
    let shape = members[0].shape().to_vec();
    let dtype = members[0].dtype();
    let (es, l) = (dtype.size(), members.len());
    let (p, me) = (pg.size(), pg.rank());
    let input = l * shape.iter().product::<usize>() * es;
    let rounds = input.div_ceil(ROUND_BYTES).clamp(1, 4 * p);
    // Slice r of process q's range of `dim`, as a box of the members' shape.
    let boxed = |q: usize, r: usize| -> Vec<Range<usize>> {
        let b = ranges(q);
        let c = chunk(b.len(), rounds, r);
        (0..shape.len())
            .map(|d| {
                if d == dim {
                    b.start + c.start..b.start + c.end
                } else {
                    0..shape[d]
                }
            })
            .collect()
    };
    // One round: each member downloaded once, whole, and cut on the host.
    let mut hosts: Vec<Outgoing<K::P>> = if rounds == 1 {
        members.drain(..).map(Outgoing::new::<B, K>).collect()
    } else {
        Vec::new()
    };
    let mut received = 0u64;
    // One member, cut along a dim that only size-1 dims precede (the flattened all-reduce, a
    // reduce-scatter of dim 0): every process's slice of every round is one run of the
    // member's bytes, sent from where it lies (the engine takes each part's offset) instead of
    // packed into a send buffer. Taken for several rounds only where the bytes are read in place
    // (a download of the whole member would undo the rounds' bounded memory).
    let run = shape[dim + 1..].iter().product::<usize>() * es;
    let in_place = l == 1
        && shape[..dim].iter().all(|&n| n == 1)
        && (rounds == 1 || crate::inner::host_bytes(&members[0]).is_some());
    let source: Option<Outgoing<K::P>> = match (in_place, rounds) {
        (false, _) => None,
        (true, 1) => (!hosts.is_empty()).then(|| hosts.remove(0)),
        (true, _) => Some(Outgoing::new::<B, K>(members[0].clone())),
    };
    for r in 0..rounds {
        // Process q's parts: slice r of its range of each member, member-major.
        let mine = boxed(me, r);
        // This process's own slice of a member sent from where it lies, cut along dim 0: read
        // there as a view, not sent to itself through the engine (a copy of `1/p` of the round).
        let own: Option<K::P> = match source.as_ref().and_then(Outgoing::in_place) {
            Some(m) if dim == 0 => crate::inner::rows_view(m, mine[0].clone()),
            _ => None,
        };
        let not_sent = |q: usize| q == me && own.is_some();
        let mut send = host::scratch(0);
        let mut send_counts = Vec::with_capacity(p);
        let mut send_at = Vec::with_capacity(p);
        // Elements of one member this round sends to all processes: equal on every process.
        let mut round = 0;
        for q in 0..p {
            let at = send.len();
            let part = boxed(q, r);
            round += host::box_numel(&part);
            if source.is_some() {
                send_counts.push(if not_sent(q) {
                    0
                } else {
                    host::box_numel(&part) * es
                });
                send_at.push(part[dim].start * run);
                continue;
            }
            if rounds == 1 {
                for d in &hosts {
                    host::append_box(&shape, es, d.bytes(), &part, &mut send);
                }
            } else if host::box_numel(&part) > 0 {
                for m in &members {
                    // A view where the backend's slice would copy (NdArray, a leading dim).
                    let rows = part[dim].clone();
                    let slice = (dim == 0)
                        .then(|| crate::inner::rows_view(m, rows.clone()))
                        .flatten()
                        .unwrap_or_else(|| K::narrow(m.clone(), dim, rows));
                    send.extend_from_slice(Outgoing::new::<B, K>(slice).bytes());
                }
            }
            send_counts.push(send.len() - at);
            send_at.push(at);
        }
        let bytes: &[u8] = match &source {
            Some(src) => src.bytes(),
            None => &send,
        };
        let c = host::box_numel(&mine);
        let recv_counts: Vec<usize> = (0..p)
            .map(|q| if not_sent(q) { 0 } else { l * c * es })
            .collect();
        let recv_at = offsets(&recv_counts);
        // The parts as runs of the bytes (one-dim boxes), so that the engine may write them
        // into its peers (`Config::strided_send`); every process calls the same method, and
        // the round's size, which decides how, is the same on every process.
        let runs: Vec<Range<usize>> = (send_at.iter().zip(&send_counts))
            .map(|(&at, &c)| at..at + c)
            .collect();
        let boxes: Vec<Option<&[Range<usize>]>> =
            runs.iter().map(|b| Some(std::slice::from_ref(b))).collect();
        // SAFETY: the parts at `recv_at` tile `got`; the engine writes all of them
        // (`ProcessGroup`'s contract).
        let got = unsafe {
            HostBuffer::received(recv_counts.iter().sum(), dtype, |got| {
                pg.all_to_all_boxes(
                    bytes,
                    (&[bytes.len()], 1),
                    &boxes,
                    got,
                    (&recv_counts, &recv_at),
                    round * l * es,
                    w,
                )
            })
        };
        host::return_scratch(send);
        received += ((p - 1) * l * c * es) as u64;
        if c == 0 {
            continue;
        }
        // Every member's slice, in coordinate order (process-major, then its members): views
        // of one tensor made of the received buffer as it is (no copy per block), and the own
        // view where it was not sent.
        // The blocks lie end to end along dim 0 of the box's shape, so each is a narrow of it.
        let mut all_shape: Vec<usize> = mine.iter().map(|r| r.len()).collect();
        let rows = all_shape[0];
        all_shape[0] *= if own.is_some() { (p - 1) * l } else { p * l };
        let all = K::from_data(got.into_data(all_shape, dtype), &device);
        let blocks: Vec<K::P> = (0..p * l)
            .map(|j| match &own {
                Some(own) if j / l == me => own.clone(),
                _ => {
                    // The received blocks skip this process's own, where it was not sent.
                    let j = if own.is_some() && j / l > me {
                        j - l
                    } else {
                        j
                    };
                    let r = j * rows..(j + 1) * rows;
                    crate::inner::rows_view(&all, r.clone())
                        .unwrap_or_else(|| K::narrow(all.clone(), 0, r))
                }
            })
            .collect();
        drop(all);
        let piece = reduce(&blocks);
        drop(blocks);
        let at = ranges(me).start;
        emit(mine[dim].start - at..mine[dim].end - at, piece);
    }
    received
}

/// The deterministic form of the across-process all-reduce, in bounded memory: the flattened
/// shards are cut in one chunk per process; process `q` receives chunk `q` of every member's
/// shard of the group (all `k` of them, in mesh coordinate order) and reduces them with
/// `reduce` (the in-process reduction, element-wise; [`reduce_own_block`], in rounds for large
/// shards), and an all-gather of the reduced chunks gives everyone the whole result: the
/// traffic of a ring all-reduce (`2 (p-1)/p` of the buffer per process, where gathering every
/// shard moved `k - 1` times it) and no process ever holds more than its own shards, one
/// round's buffers and the result. Every element is still reduced in mesh coordinate order,
/// the order of a single process holding the whole mesh, so results are bitwise those of that
/// run and equal on every rank whatever the process count (see [`crate::spmd::Reduction`]).
/// `members` are this process's shards of the group, in coordinate order. Returns the bytes
/// this process received.
pub(crate) fn all_reduce_ordered<B: Backend, K: Kind<B>>(
    members: Vec<K::P>,
    pg: &Arc<dyn ProcessGroup>,
    topo: &MeshTopology,
    axis: usize,
    global: &[usize],
    reduce: impl Fn(&[K::P]) -> K::P,
) -> (K::P, u64) {
    let device = K::device(&members[0]);
    let shape = members[0].shape();
    let dtype = members[0].dtype();
    let es = dtype.size();
    let m = shape.num_elements();
    let p = pg.size();
    let part = |q: usize| chunk(m, p, q);
    let flat: Vec<K::P> = members
        .into_iter()
        .map(|t| K::reshape(t, Shape::new([m])))
        .collect();
    let w = what(CollectiveKind::AllReduce, topo, axis, global);
    let counts: Vec<usize> = (0..p).map(|q| part(q).len() * es).collect();
    let at = part(pg.rank()).start * es;
    let mut got = 0;
    // This process's reduced chunk is written, round by round, where it lies in the result; the
    // all-gather then fills in the others' chunks around it (in place: no copy of the own one).
    // SAFETY: the rounds' slices tile this process's chunk (`reduce_own_block`), so the own part
    // is initialised before the in-place all-gather, which writes every other byte of `all`
    // (`ProcessGroup`'s contract).
    let all = unsafe {
        HostBuffer::received(m * es, dtype, |all| {
            got = reduce_own_block::<B, K>(flat, pg, (0, &part), &w, &reduce, &mut |r, piece| {
                let piece = Outgoing::new::<B, K>(piece);
                write_bytes(&mut all[at + r.start * es..at + r.end * es], piece.bytes());
            });
            pg.all_gather_in_place(all, &counts, &w)
        })
    };
    let received = got + (m * es - counts[pg.rank()]) as u64;
    let out = K::from_data(all.into_data(shape.to_vec(), dtype), &device);
    (out, received)
}

/// The deterministic across-process reduce-scatter along `dim`, in bounded memory: process `q`
/// receives from every member of the group (all `k`, in mesh coordinate order) only the block of
/// `dim` that its own members keep ([`block`]), and reduces those `k` blocks with `reduce` (the
/// in-process reduction, element-wise, in the shape the whole shards would be reduced in;
/// [`reduce_own_block`], in rounds for large shards): the first half of
/// [`all_reduce_ordered`], with the chunks cut where the result is scattered, and no all-gather
/// after it. Every element is reduced in mesh coordinate order, so the result is bitwise that
/// of one process holding the whole mesh; traffic `(p-1)/p` of the buffer per process, memory
/// the shards, one round's buffers and about twice the block produced. `members` are this
/// process's shards of the group (whole along `dim`), in coordinate order. Returns this
/// process's reduced block of `dim` and the bytes it received.
pub(crate) fn reduce_scatter_ordered<B: Backend, K: Kind<B>>(
    members: Vec<K::P>,
    pg: &Arc<dyn ProcessGroup>,
    topo: &MeshTopology,
    (axis, dim): (usize, usize),
    global: &[usize],
    reduce: impl Fn(&[K::P]) -> K::P,
) -> (K::P, u64) {
    let (n, k, l) = (members[0].shape()[dim], topo.axis_size(axis), members.len());
    let w = what(CollectiveKind::ReduceScatter, topo, axis, global);
    let ranges = |q: usize| block(n, k, l, q);
    let (device, dtype) = (K::device(&members[0]), members[0].dtype());
    let es = dtype.size();
    let mut out_shape = members[0].shape().to_vec();
    out_shape[dim] = ranges(pg.rank()).len();
    // The block as the one round's reduced tensor, or assembled on the host slice by slice
    // (aligned: it becomes the tensor without a copy).
    let (mut whole, mut out) = (None, None);
    let received =
        reduce_own_block::<B, K>(members, pg, (dim, &ranges), &w, &reduce, &mut |r, piece| {
            if r.len() == out_shape[dim] {
                whole = Some(piece);
                return;
            }
            let out = out.get_or_insert_with(|| {
                HostBuffer::zeroed(out_shape.iter().product::<usize>() * es, dtype)
            });
            let mut at: Vec<Range<usize>> = out_shape.iter().map(|&n| 0..n).collect();
            at[dim] = r;
            let bytes = Outgoing::new::<B, K>(piece);
            host::write_box(&out_shape, es, &at, bytes.bytes(), out.as_bytes_mut())
        });
    let out = match (whole, out) {
        (Some(whole), _) => whole,
        (None, out) => K::from_data(
            out.unwrap_or_else(|| HostBuffer::zeroed(0, dtype))
                .into_data(out_shape, dtype),
            &device,
        ),
    };
    (out, received)
}

/// The across-process all-to-all along `axis`, moving only what each process keeps: `x` is this
/// process's block (its block of `from_dim`, see [`block`]; whole along `to_dim`); process `q`
/// receives from every process the part of its block that lies in `q`'s block of `to_dim`,
/// and lays them end to end along `from_dim`. Returns the tensor whole along `from_dim` (of
/// length `n_from`) and this process's block of `to_dim`, and the bytes received. `from_dim`
/// and `to_dim` index `x`'s own dims (a stacked primitive's tensor dims follow its mesh dims);
/// `global` is the tensor's global shape, for messages.
pub(crate) fn all_to_all<B: Backend, K: Kind<B>>(
    x: K::P,
    pg: &Arc<dyn ProcessGroup>,
    topo: &MeshTopology,
    axis: usize,
    ((from_dim, n_from), to_dim): ((usize, usize), usize),
    global: &[usize],
) -> (K::P, u64) {
    let device = K::device(&x);
    let (shape, dtype) = (x.shape().to_vec(), x.dtype());
    let data = Outgoing::new::<B, K>(x);
    let es = dtype.size();
    let (k, l) = (topo.axis_size(axis), topo.local_axis_size(axis));
    let (p, me) = (pg.size(), pg.rank());
    let n_to = shape[to_dim];
    let with = |base: &[usize], d: usize, r: Range<usize>| -> Vec<Range<usize>> {
        (0..base.len())
            .map(|i| if i == d { r.clone() } else { 0..base[i] })
            .collect()
    };
    let parts: Vec<Vec<Range<usize>>> = (0..p)
        .map(|q| with(&shape, to_dim, block(n_to, k, l, q)))
        .collect();
    // Every part goes as a box of the shard, which the engine sends as it lies where each is a
    // contiguous run (blocks of a leading dim), else packs, reads in place or writes into its
    // peers (`Config::strided_send`); this process's own box never goes through the exchange:
    // the engine copies it from the shard straight into its place in the receive buffer
    // (`own_box_apart`), one copy. Every process calls the same engine method, whatever its
    // own shard's shape.
    // Process q's block of `from_dim`, this process's block of `to_dim`.
    let mut out_shape = shape.clone();
    out_shape[from_dim] = n_from;
    out_shape[to_dim] = block(n_to, k, l, me).len();
    let boxes: Vec<Vec<Range<usize>>> = (0..p)
        .map(|q| with(&out_shape, from_dim, block(n_from, k, l, q)))
        .collect();
    let recv_counts: Vec<usize> = boxes.iter().map(|b| host::box_numel(b) * es).collect();
    let recv_at = offsets(&recv_counts);
    let w = what(CollectiveKind::AllToAll, topo, axis, global);
    let total: usize = recv_counts.iter().sum();
    // SAFETY: the parts at `recv_at` tile the buffer; the engine writes all of them
    // (`ProcessGroup`'s contract).
    let got = unsafe {
        HostBuffer::received(total, dtype, |got| {
            let recv_parts = (&recv_counts[..], &recv_at[..]);
            let boxes: Vec<Option<&[Range<usize>]>> =
                parts.iter().map(|b| Some(b.as_slice())).collect();
            let array = (&shape[..], es);
            let global_bytes = global.iter().product::<usize>() * es;
            pg.all_to_all_boxes(
                data.bytes(),
                array,
                &boxes,
                got,
                recv_parts,
                global_bytes,
                &w,
            )
        })
    };
    drop(data);
    let received = (total - recv_counts[me]) as u64;
    // Blocks that lie end to end (of a leading dim) need no assembly.
    let out = if host::consecutive(&out_shape, &boxes) {
        got
    } else {
        let mut at = 0;
        let pieces: Vec<(&[Range<usize>], &[u8])> = boxes
            .iter()
            .zip(&recv_counts)
            .map(|(b, &c)| {
                at += c;
                (b.as_slice(), &got.as_bytes()[at - c..at])
            })
            .collect();
        host::assemble_bytes(&out_shape, dtype, &pieces)
    };
    (
        K::from_data(out.into_data(out_shape, dtype), &device),
        received,
    )
}

/// The across-process part of a collective permute along `axis` (see
/// [`super::generic::collective_permute`]): `sends` are this process's pieces for devices of
/// other processes, each with its destination's rank in `pg`, and `from` is, for each piece
/// expected here, the rank it comes from and its shape (one entry per piece, in the order the
/// senders list them: by piece kind, then by coordinate). Each process sends every process it
/// talks to the pieces addressed to it back to back ([`ProcessGroup::send_recv`]: MPI's
/// `MPI_Isend` / `MPI_Irecv` between those processes only).
/// Returns the received pieces in `from`'s order, on `device`, and the bytes received.
pub(crate) fn permute<B: Backend, K: Kind<B>>(
    sends: Vec<(usize, K::P)>,
    from: &[(usize, Vec<usize>)],
    (dtype, device): (DType, &B::Device),
    (pg, topo, axis): (&Arc<dyn ProcessGroup>, &MeshTopology, usize),
    global: &[usize],
) -> (Vec<K::P>, u64) {
    let p = pg.size();
    let es = dtype.size();
    // The pieces for each rank, back to back in the order they were listed.
    let mut parts: Vec<Vec<u8>> = vec![Vec::new(); p];
    for (q, x) in sends {
        assert!(
            q != pg.rank(),
            "burn-dtensor: a collective permute sends to its own process"
        );
        parts[q].extend_from_slice(Outgoing::new::<B, K>(x).bytes());
    }
    let send_counts: Vec<usize> = parts.iter().map(Vec::len).collect();
    let send: Vec<u8> = parts.concat();
    let numel = |s: &[usize]| s.iter().product::<usize>();
    let mut recv_counts = vec![0; p];
    for (q, s) in from {
        recv_counts[*q] += numel(s) * es;
    }
    let recv_at = offsets(&recv_counts);
    let total: usize = recv_counts.iter().sum();
    let w = what(CollectiveKind::CollectivePermute, topo, axis, global);
    // SAFETY: the engine writes every byte of `got` (`ProcessGroup`'s contract).
    let got = unsafe {
        HostBuffer::received(total, dtype, |got| {
            pg.send_recv(&send, &send_counts, &recv_counts, got, &w)
        })
    };
    // Each received piece cut from its rank's part, in listing order.
    let mut cursor = recv_at;
    let pieces = from
        .iter()
        .map(|(q, s)| {
            let n = numel(s) * es;
            let at = cursor[*q];
            cursor[*q] += n;
            let bytes = got.as_bytes()[at..at + n].to_vec();
            K::from_data(TensorData::from_bytes_vec(bytes, s.clone(), dtype), device)
        })
        .collect();
    (pieces, total as u64)
}

/// The range of a dim of global size `n` (split in `k` chunks over an axis) held by process
/// `q`, which owns `l` consecutive coordinates of the axis.
pub(crate) fn block(n: usize, k: usize, l: usize, q: usize) -> Range<usize> {
    chunk(n, k, q * l).start..chunk(n, k, (q + 1) * l - 1).end
}

/// The concatenation along `dim` of every process's `x` (each its block of the dim, whose whole
/// size is `n`, see [`block`]): the across-process all-gather, with the bytes this process
/// received. `dim` indexes `x`'s own dims (a stacked primitive's tensor dims follow its mesh
/// dims); `global` is the tensor's global shape, for messages.
pub(crate) fn all_gather<B: Backend, K: Kind<B>>(
    x: K::P,
    pg: &Arc<dyn ProcessGroup>,
    topo: &MeshTopology,
    axis: usize,
    (dim, n): (usize, usize),
    global: &[usize],
) -> (K::P, u64) {
    let device = K::device(&x);
    let (mut full, dtype) = (x.shape().to_vec(), x.dtype());
    let data = Outgoing::new::<B, K>(x);
    full[dim] = n;
    let (k, l) = (topo.axis_size(axis), topo.local_axis_size(axis));
    let row: usize = full
        .iter()
        .enumerate()
        .filter(|&(d, _)| d != dim)
        .map(|(_, s)| s)
        .product::<usize>()
        * dtype.size();
    let blocks: Vec<Range<usize>> = (0..pg.size()).map(|q| block(n, k, l, q)).collect();
    let counts: Vec<usize> = blocks.iter().map(|b| b.len() * row).collect();
    let w = what(CollectiveKind::AllGather, topo, axis, global);
    let sent = data.bytes().len() as u64;
    let total: usize = counts.iter().sum();
    // SAFETY: the engine writes all of `all` (`ProcessGroup`'s contract).
    let all = unsafe {
        HostBuffer::received(total, dtype, |all| {
            pg.all_gather_into(data.bytes(), &counts, all, &w)
        })
    };
    drop(data);
    let boxes: Vec<Vec<Range<usize>>> = blocks
        .iter()
        .map(|b| {
            full.iter()
                .enumerate()
                .map(|(d, &s)| if d == dim { b.clone() } else { 0..s })
                .collect()
        })
        .collect();
    // Blocks of a leading dim lie end to end: the received buffer is the result.
    let out = if host::consecutive(&full, &boxes) {
        all
    } else {
        let mut at = 0;
        let pieces: Vec<(&[Range<usize>], &[u8])> = boxes
            .iter()
            .zip(&counts)
            .map(|(b, &c)| {
                at += c;
                (b.as_slice(), &all.as_bytes()[at - c..at])
            })
            .collect();
        host::assemble_bytes(&full, dtype, &pieces)
    };
    (
        K::from_data(out.into_data(full, dtype), &device),
        total as u64 - sent,
    )
}
