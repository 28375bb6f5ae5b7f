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

/// The deterministic form of the across-process all-reduce: every process sends the shards of
/// its in-process group (`members`, in coordinate order), all of them arrive everywhere in mesh
/// coordinate order, and each process reduces the whole group with `reduce`, the in-process
/// reduction. The sum is then computed in the order a single process holding the whole mesh uses
/// (per device), so results are bitwise those of that run and equal on every rank whatever the
/// process count; it moves `k/2` times the bytes of the engine's all-reduce (see
/// [`crate::spmd::Reduction`]). Returns the bytes this process received.
pub(crate) fn all_reduce_ordered<B: Backend, K: Kind<B>>(
    members: Vec<K::P>,
    pg: &Arc<dyn ProcessGroup>,
    topo: &MeshTopology,
    axis: usize,
    global: &[usize],
    reduce: impl FnOnce(&[K::P]) -> K::P,
) -> (K::P, u64) {
    let device = K::device(&members[0]);
    let datas: Vec<TensorData> = members.into_iter().map(K::into_host).collect();
    let (shape, dtype) = (datas[0].shape.clone(), datas[0].dtype);
    let per = datas[0].as_bytes().len();
    let mut send = Vec::with_capacity(per * datas.len());
    for d in &datas {
        send.extend_from_slice(d.as_bytes());
    }
    let counts = vec![send.len(); pg.size()];
    let w = what(CollectiveKind::AllReduce, topo, axis, global);
    let all = pg.all_gather(&send, &counts, &w);
    let k = topo.axis_size(axis);
    let shards: Vec<K::P> = (0..k)
        .map(|c| {
            let bytes = all[c * per..(c + 1) * per].to_vec();
            K::from_data(
                TensorData::from_bytes_vec(bytes, shape.clone(), dtype),
                &device,
            )
        })
        .collect();
    (reduce(&shards), (all.len() - send.len()) as u64)
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
