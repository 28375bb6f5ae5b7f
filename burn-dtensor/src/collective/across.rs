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
use burn::tensor::{DType, TensorData};

use crate::comm::CollectiveKind;
use crate::host;
use crate::layout::ReduceOp;
use crate::mesh::MeshTopology;
use crate::shard::chunk;
use crate::spmd::ProcessGroup;
use crate::tensor::Kind;

fn what(kind: CollectiveKind, topo: &MeshTopology, axis: usize, shape: &[usize]) -> String {
    format!(
        "{kind} along mesh axis `{}` (tensor {shape:?}) across processes",
        topo.axis_name(axis)
    )
}

fn nbytes(d: &TensorData) -> u64 {
    d.as_bytes().len() as u64
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
    let device = K::device(&x);
    let data = K::into_host(x);
    let dtype = data.dtype;
    // Half floats have no MPI type: reduced in f32.
    let wide = matches!(dtype, DType::F16 | DType::BF16);
    let data = if wide {
        data.convert_dtype(DType::F32)
    } else {
        data
    };
    let shape = data.shape.clone();
    let mut bytes = data.into_bytes().to_vec();
    let w = what(CollectiveKind::AllReduce, topo, axis, global);
    let work_dtype = if wide { DType::F32 } else { dtype };
    pg.all_reduce(&mut bytes, work_dtype, op, &w);
    let p = pg.size() as u64;
    let n = bytes.len() as u64;
    let mut out = TensorData::from_bytes_vec(bytes, shape, work_dtype);
    if wide {
        out = out.convert_dtype(dtype);
    }
    (K::from_data(out, &device), 2 * (p - 1) * n / p)
}

/// The deterministic form of the across-process all-reduce, in bounded memory: the flattened
/// shards are cut in one chunk per process; an all-to-all gives process `q` chunk `q` of every
/// member's shard of the group (all `k` of them, in mesh coordinate order), it reduces them with
/// `reduce` (the in-process reduction, element-wise), and an all-gather of the reduced chunks
/// gives everyone the whole result: the traffic of a ring all-reduce (`2 (p-1)/p` of the buffer
/// per process, where gathering every shard moved `k - 1` times it) and no process ever holds
/// more than its own shards plus one chunk of each member's. Every element is still reduced in
/// mesh coordinate order, the order of a single process holding the whole mesh, so results are
/// bitwise those of that run and equal on every rank whatever the process count (see
/// [`crate::spmd::Reduction`]). `members` are this process's shards of the group, in coordinate
/// order. Returns the bytes this process received.
pub(crate) fn all_reduce_ordered<B: Backend, K: Kind<B>>(
    members: Vec<K::P>,
    pg: &Arc<dyn ProcessGroup>,
    topo: &MeshTopology,
    axis: usize,
    global: &[usize],
    reduce: impl FnOnce(&[K::P]) -> K::P,
) -> (K::P, u64) {
    let device = K::device(&members[0]);
    let l = members.len();
    let mut datas: Vec<TensorData> = members.into_iter().map(K::into_host).collect();
    let (shape, dtype) = (datas[0].shape.clone(), datas[0].dtype);
    let es = dtype.size();
    let m = datas[0].num_elements();
    let (p, me) = (pg.size(), pg.rank());
    let part = |q: usize| chunk(m, p, q);
    // This process's parts for process q: chunk q of each of its members, member-major. With
    // one member the chunks already lie in destination order: its buffer is sent as it is.
    let send: Vec<u8> = if l == 1 {
        datas.pop().expect("one member").into_bytes().to_vec()
    } else {
        let mut send = Vec::with_capacity(l * m * es);
        for q in 0..p {
            for d in &datas {
                send.extend_from_slice(&d.as_bytes()[part(q).start * es..part(q).end * es]);
            }
        }
        send
    };
    drop(datas);
    let send_counts: Vec<usize> = (0..p).map(|q| l * part(q).len() * es).collect();
    let c = part(me).len();
    let w = what(CollectiveKind::AllReduce, topo, axis, global);
    let got = pg.all_to_all(&send, &send_counts, &vec![l * c * es; p], &w);
    drop(send);
    // Every member's chunk `me`, in coordinate order (process-major, then its members).
    let mine: Vec<u8> = if c == 0 {
        Vec::new()
    } else {
        let chunks: Vec<K::P> = got
            .chunks(c * es)
            .map(|b| K::from_data(TensorData::from_bytes_vec(b.to_vec(), [c], dtype), &device))
            .collect();
        drop(got);
        K::into_host(reduce(&chunks)).into_bytes().to_vec()
    };
    let counts: Vec<usize> = (0..p).map(|q| part(q).len() * es).collect();
    let all = pg.all_gather(&mine, &counts, &w);
    let received = (p - 1) as u64 * (l * c * es) as u64 + (all.len() - mine.len()) as u64;
    let out = K::from_data(TensorData::from_bytes_vec(all, shape, dtype), &device);
    (out, received)
}

/// The deterministic across-process reduce-scatter along `dim`, in bounded memory: process `q`
/// receives from every member of the group (all `k`, in mesh coordinate order) only the block of
/// `dim` that its own members keep ([`block`]), and reduces those `k` blocks with `reduce` (the
/// in-process reduction, element-wise, in the shape the whole shards would be reduced in): the
/// first half of [`all_reduce_ordered`], with the chunks cut where the result is scattered, and
/// no all-gather after it. Every element is reduced in mesh coordinate order, so the result is
/// bitwise that of one process holding the whole mesh; traffic `(p-1)/p` of the buffer per
/// process, memory the shards, one send buffer and the `k` received blocks. `members` are this
/// process's shards of the group (whole along `dim`), in coordinate order. Returns this
/// process's reduced block of `dim` and the bytes it received.
pub(crate) fn reduce_scatter_ordered<B: Backend, K: Kind<B>>(
    members: Vec<K::P>,
    pg: &Arc<dyn ProcessGroup>,
    topo: &MeshTopology,
    (axis, dim): (usize, usize),
    global: &[usize],
    reduce: impl FnOnce(&[K::P]) -> K::P,
) -> (K::P, u64) {
    let device = K::device(&members[0]);
    let l = members.len();
    let datas: Vec<TensorData> = members.into_iter().map(K::into_host).collect();
    let (shape, dtype) = (datas[0].shape.clone(), datas[0].dtype);
    let es = dtype.size();
    let (n, k) = (shape[dim], topo.axis_size(axis));
    let (p, me) = (pg.size(), pg.rank());
    let boxed = |q: usize| -> Vec<Range<usize>> {
        (0..shape.len())
            .map(|d| {
                if d == dim {
                    block(n, k, l, q)
                } else {
                    0..shape[d]
                }
            })
            .collect()
    };
    let numel = |q: usize| boxed(q).iter().map(|r| r.len()).product::<usize>();
    // Process q's parts: its block of each of this process's members, member-major.
    let mut send = Vec::with_capacity(l * shape.iter().product::<usize>() * es);
    for q in 0..p {
        for d in &datas {
            host::append_box(&shape, es, d.as_bytes(), &boxed(q), &mut send);
        }
    }
    drop(datas);
    let send_counts: Vec<usize> = (0..p).map(|q| l * numel(q) * es).collect();
    let c = numel(me);
    let w = what(CollectiveKind::ReduceScatter, topo, axis, global);
    let got = pg.all_to_all(&send, &send_counts, &vec![l * c * es; p], &w);
    drop(send);
    let mine_shape: Vec<usize> = boxed(me).iter().map(|r| r.len()).collect();
    let received = ((p - 1) * l * c * es) as u64;
    if c == 0 {
        let empty = TensorData::from_bytes_vec(Vec::new(), mine_shape, dtype);
        return (K::from_data(empty, &device), received);
    }
    // Every member's block `me`, in coordinate order (process-major, then its members).
    let blocks: Vec<K::P> = got
        .chunks(c * es)
        .map(|b| {
            let d = TensorData::from_bytes_vec(b.to_vec(), mine_shape.clone(), dtype);
            K::from_data(d, &device)
        })
        .collect();
    drop(got);
    (reduce(&blocks), received)
}

/// The across-process all-to-all along `axis`, moving only what each process keeps: `x` is this
/// process's block (its block of `from_dim`, see [`block`]; whole along `to_dim`); process `q`
/// receives from every process the part of its block that lies in `q`'s block of `to_dim`,
/// and lays them end to end along `from_dim`. Returns the tensor whole along `from_dim` (global
/// size `global[from_dim]`) and this process's block of `to_dim`, and the bytes received.
pub(crate) fn all_to_all<B: Backend, K: Kind<B>>(
    x: K::P,
    pg: &Arc<dyn ProcessGroup>,
    topo: &MeshTopology,
    axis: usize,
    (from_dim, to_dim): (usize, usize),
    global: &[usize],
) -> (K::P, u64) {
    let device = K::device(&x);
    let data = K::into_host(x);
    let (shape, dtype) = (data.shape.clone(), data.dtype);
    let es = dtype.size();
    let (k, l) = (topo.axis_size(axis), topo.local_axis_size(axis));
    let (p, me) = (pg.size(), pg.rank());
    let (n_from, n_to) = (global[from_dim], shape[to_dim]);
    let with = |base: &[usize], d: usize, r: Range<usize>| -> Vec<Range<usize>> {
        (0..base.len())
            .map(|i| if i == d { r.clone() } else { 0..base[i] })
            .collect()
    };
    let mut send = Vec::with_capacity(data.as_bytes().len());
    let mut send_counts = Vec::with_capacity(p);
    for q in 0..p {
        let at = send.len();
        let part = with(&shape, to_dim, block(n_to, k, l, q));
        host::append_box(&shape, es, data.as_bytes(), &part, &mut send);
        send_counts.push(send.len() - at);
    }
    drop(data);
    // Process q's block of `from_dim`, this process's block of `to_dim`.
    let mut out_shape = shape.clone();
    out_shape[from_dim] = n_from;
    out_shape[to_dim] = block(n_to, k, l, me).len();
    let boxes: Vec<Vec<Range<usize>>> = (0..p)
        .map(|q| with(&out_shape, from_dim, block(n_from, k, l, q)))
        .collect();
    let recv_counts: Vec<usize> = boxes
        .iter()
        .map(|b| b.iter().map(|r| r.len()).product::<usize>() * es)
        .collect();
    let w = what(CollectiveKind::AllToAll, topo, axis, global);
    let got = pg.all_to_all(&send, &send_counts, &recv_counts, &w);
    let received = (got.len() - recv_counts[me]) as u64;
    drop(send);
    let mut at = 0;
    let pieces: Vec<(&[Range<usize>], &[u8])> = boxes
        .iter()
        .zip(&recv_counts)
        .map(|(b, &c)| {
            at += c;
            (b.as_slice(), &got[at - c..at])
        })
        .collect();
    // Blocks that lie end to end (of a leading dim) need no assembly.
    let out = if host::consecutive(&out_shape, &boxes) {
        drop(pieces);
        got
    } else {
        host::assemble_bytes(&out_shape, es, &pieces)
    };
    let out = TensorData::from_bytes_vec(out, out_shape, dtype);
    (K::from_data(out, &device), received)
}

/// The range of a dim of global size `n` (split in `k` chunks over an axis) held by process
/// `q`, which owns `l` consecutive coordinates of the axis.
pub(crate) fn block(n: usize, k: usize, l: usize, q: usize) -> Range<usize> {
    chunk(n, k, q * l).start..chunk(n, k, (q + 1) * l - 1).end
}

/// The concatenation along `dim` of every process's `x` (each its block of the dim, see
/// [`block`]): the across-process all-gather, with the bytes this process received.
pub(crate) fn all_gather<B: Backend, K: Kind<B>>(
    x: K::P,
    pg: &Arc<dyn ProcessGroup>,
    topo: &MeshTopology,
    axis: usize,
    dim: usize,
    global: &[usize],
) -> (K::P, u64) {
    let device = K::device(&x);
    let data = K::into_host(x);
    let dtype = data.dtype;
    let mut full: Vec<usize> = data.shape.to_vec();
    let n = global[dim];
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
    let sent = nbytes(&data);
    let all = pg.all_gather(data.as_bytes(), &counts, &w);
    let mut at = 0;
    let pieces = blocks
        .iter()
        .zip(&counts)
        .map(|(b, &c)| {
            let mut shape = full.clone();
            shape[dim] = b.len();
            let ranges: Vec<Range<usize>> = full
                .iter()
                .enumerate()
                .map(|(d, &s)| if d == dim { b.clone() } else { 0..s })
                .collect();
            let piece = TensorData::from_bytes_vec(all[at..at + c].to_vec(), shape, dtype);
            at += c;
            (ranges, piece)
        })
        .collect();
    let out = host::assemble(&full, pieces).expect("assembling an all-gather across processes");
    (K::from_data(out, &device), all.len() as u64 - sent)
}
