//! Collectives on a stacked primitive (see [`crate::stack`]): dim `a < k` of the primitive is mesh
//! axis `a`, tensor dim `d` is primitive dim `k + d`. Each is one or two inner ops on the whole
//! stack, for every sub-group of the axis at once. They record the same communication as their
//! per-device counterparts in [`super::generic`] (bytes received, summed over this process's
//! devices: all of them in one process), so [`CommDebugMode`](crate::CommDebugMode) reports the
//! same figures in both forms. On a multi-process mesh they run along an axis the process holds
//! whole; along one that spans processes, all-reduces ([`all_reduce_across`]), all-gathers
//! ([`all_gather_across`]), reduce-scatters ([`reduce_scatter_across`]), all-to-alls
//! ([`all_to_all_across`]) run on the stack too, with one exchange through [`super::across`]
//! for all of the process's groups, and so do the steps without communication (local chunks,
//! pending sums made or padded), on this process's coordinates of the axis.

use burn::tensor::backend::Backend;
use burn::tensor::{Shape, Slice, TensorMetadata};

use super::interface::ReduceOp;
use crate::comm::{self, CollectiveKind};
use crate::mesh::MeshTopology;
use crate::tensor::Kind;

/// Bytes of one device's shard: the primitive's trailing (per-shard) dims.
fn shard_bytes<P: TensorMetadata>(p: &P, k: usize) -> u64 {
    let s = p.shape();
    (s[k..].iter().product::<usize>() * p.dtype().size()) as u64
}

fn with(shape: &[usize], i: usize, v: usize) -> Vec<usize> {
    let mut s = shape.to_vec();
    s[i] = v;
    s
}

/// All-reduce along `axis`: the `op`-reduction over the axis' leading dim (which becomes 1).
pub fn all_reduce<B: Backend, K: Kind<B>>(
    x: K::P,
    topo: &MeshTopology,
    axis: usize,
    op: ReduceOp,
    global: &[usize],
) -> K::P {
    record_all_reduce(&x, topo, axis, global);
    K::reduce_dim(x, axis, op)
}

/// All-reduce along `axis` when the axis spans processes (`pg`: its process group): one exchange
/// across processes for all of this process's groups, where the per-position path
/// ([`super::generic::all_reduce`]) runs one per group. The peers along the axis hold the same
/// block of the other axes, stacked in the same order, and the reduction is element-wise, so the
/// groups travel together:
/// - [`Reduction::Engine`](crate::config::Reduction::Engine): this process's members reduced
///   along the axis' dim by one inner op (the backend's order: on NdArray the per-position
///   chain's, coordinate order, for shards that path does not reduce as a tree; the engine's
///   reduction promises no order), then one engine all-reduce of the reduced stack;
/// - [`Reduction::Ordered`](crate::config::Reduction::Ordered): one
///   [`all_reduce_ordered`](super::across::all_reduce_ordered) whose members are the stack's
///   slices at this process's coordinates of the axis, reduced in the shape (chain or tree) one
///   shard is reduced in: every element in mesh coordinate order, so the values are bitwise the
///   per-position path's.
///
/// Records what the per-position path records: per group, the in-process bytes and those its
/// exchange receives from other processes.
pub fn all_reduce_across<B: Backend, K: Kind<B>>(
    x: K::P,
    topo: &MeshTopology,
    axis: usize,
    op: ReduceOp,
    global: &[usize],
    pg: &std::sync::Arc<dyn super::interface::ProcessGroup>,
) -> K::P {
    let xs = x.shape().to_vec();
    let k = xs[axis];
    let shard: usize = xs[topo.ndim()..].iter().product();
    let es = x.dtype().size();
    let p = pg.size();
    let (out, received) = match crate::config::config().reduction {
        crate::config::Reduction::Engine => {
            // The bytes the engine reduces per group (half floats widened).
            let widened = super::across::reduction_dtype(x.dtype()).size() * shard;
            let local = K::reduce_dim(x, axis, op);
            let (out, _) = super::across::all_reduce::<B, K>(local, pg, topo, axis, op, global);
            (out, 2 * (p - 1) * widened / p)
        }
        crate::config::Reduction::Ordered => {
            let n = xs.iter().product::<usize>() / k;
            let members: Vec<K::P> = members::<B, K>(x, axis)
                .into_iter()
                .map(|m| K::reshape(m, Shape::new([n])))
                .collect();
            let reduce = super::generic::ordered_reduction::<B, K>(shard, op, topo);
            let (out, _) =
                super::across::all_reduce_ordered::<B, K>(members, pg, topo, axis, global, reduce);
            let out = K::reshape(out, Shape::from(with(&xs, axis, 1)));
            // `k` members' chunk from each other process, then the others' reduced chunks.
            let mine = crate::shard::chunk(shard, p, pg.rank()).len();
            (out, ((p - 1) * k * mine + shard - mine) * es)
        }
    };
    let groups = (topo.local_size() / k) as u64;
    comm::record_across(
        CollectiveKind::AllReduce,
        topo.axis_name(axis),
        groups * 2 * (k as u64 - 1) * (shard * es) as u64,
        groups * received as u64,
        global,
    );
    out
}

/// The slices of the stack at each index of `axis` (this process's coordinates of it, in
/// order), each shaped as the stack with 1 along the axis: views on NdArray when the axis leads
/// (a run of rows, [`crate::inner::rows_view`]), else the backend's `narrow`.
fn members<B: Backend, K: Kind<B>>(x: K::P, axis: usize) -> Vec<K::P> {
    let xs = x.shape().to_vec();
    let (k, one) = (xs[axis], Shape::from(with(&xs, axis, 1)));
    if xs[..axis].iter().all(|&d| d == 1) {
        let rows = K::reshape(x, Shape::new([k, xs.iter().product::<usize>() / k]));
        (0..k)
            .map(|c| {
                let row = crate::inner::rows_view(&rows, c..c + 1)
                    .unwrap_or_else(|| K::narrow(rows.clone(), 0, c..c + 1));
                K::reshape(row, one.clone())
            })
            .collect()
    } else {
        (0..k)
            .map(|c| K::narrow(x.clone(), axis, c..c + 1))
            .collect()
    }
}

/// How many of this process's positions each slot of the stack `x` stands for: 1, unless the
/// stack holds a replicated axis once (size 1, broadcast to its positions). An exchange of the
/// stack moves that many times fewer bytes than the per-position path, whose count the
/// accounting keeps.
fn positions_per_slot<P: TensorMetadata>(x: &P, topo: &MeshTopology) -> u64 {
    let slots: usize = x.shape()[..topo.ndim()].iter().product();
    (topo.local_size() / slots) as u64
}

/// Records the all-reduce along `axis` of a stacked primitive `x` (or of any primitive with the
/// same per-shard dims, such as its reduced value) without running it.
pub fn record_all_reduce<P: TensorMetadata>(
    x: &P,
    topo: &MeshTopology,
    axis: usize,
    global: &[usize],
) {
    let m = topo.axis_size(axis) as u64;
    let groups = topo.local_size() as u64 / m;
    comm::record(
        CollectiveKind::AllReduce,
        topo.axis_name(axis),
        groups * 2 * (m - 1) * shard_bytes(x, topo.ndim()),
        global,
    );
}

/// Reduce-scatter along `axis` onto tensor dim `dim`: the reduction, then each index of the axis
/// keeps its chunk of `dim`.
pub fn reduce_scatter<B: Backend, K: Kind<B>>(
    x: K::P,
    topo: &MeshTopology,
    axis: usize,
    op: ReduceOp,
    dim: usize,
    global: &[usize],
) -> K::P {
    record_reduce_scatter(&x, topo, axis, global);
    local_chunk::<B, K>(K::reduce_dim(x, axis, op), topo, axis, dim)
}

/// Reduce-scatter along `axis` onto tensor dim `dim` when the axis spans processes (`pg`: its
/// process group): one exchange across processes for all of this process's groups, where the
/// per-position path ([`super::generic::reduce_scatter`]) runs one per group. Every process
/// receives the reduction of its block of `dim` (the chunks of its coordinates of the axis,
/// [`super::across::block`]) for every group at once, and each of its positions keeps its chunk:
/// - [`Reduction::Engine`](crate::config::Reduction::Engine): this process's members reduced
///   along the axis' dim by one inner op, then one engine reduce-scatter
///   ([`super::across::reduce_scatter`], `MPI_Reduce_scatter`);
/// - [`Reduction::Ordered`](crate::config::Reduction::Ordered): one
///   [`reduce_scatter_ordered`](super::across::reduce_scatter_ordered) whose members are the
///   stack's slices at this process's coordinates, reduced in the shape (chain or tree) one
///   shard is reduced in: bitwise the per-position path's values.
///
/// Records what the per-position path records: per group, the in-process bytes and those its
/// exchange receives from other processes.
pub fn reduce_scatter_across<B: Backend, K: Kind<B>>(
    x: K::P,
    topo: &MeshTopology,
    (axis, op): (usize, ReduceOp),
    dim: usize,
    global: &[usize],
    pg: &std::sync::Arc<dyn super::interface::ProcessGroup>,
) -> K::P {
    let nd = topo.ndim();
    let l = x.shape()[axis];
    let shard = shard_bytes(&x, nd);
    let per_position = positions_per_slot(&x, topo);
    let (block, received) = match crate::config::config().reduction {
        crate::config::Reduction::Engine => {
            let local = K::reduce_dim(x, axis, op);
            super::across::reduce_scatter::<B, K>(local, pg, topo, (axis, nd + dim), op, global)
        }
        crate::config::Reduction::Ordered => {
            let elements = x.shape()[nd..].iter().product();
            let reduce = super::generic::ordered_reduction::<B, K>(elements, op, topo);
            let members = members::<B, K>(x, axis);
            super::across::reduce_scatter_ordered::<B, K>(
                members,
                pg,
                topo,
                (axis, nd + dim),
                global,
                reduce,
            )
        }
    };
    let groups = (topo.local_size() / l) as u64;
    comm::record_across(
        CollectiveKind::ReduceScatter,
        topo.axis_name(axis),
        groups * (l as u64 - 1) * shard,
        received * per_position,
        global,
    );
    chunks_onto_axis::<B, K>(block, nd, axis, dim, l)
}

/// Records the reduce-scatter along `axis` of a stacked tensor `x` (the partial tensor's
/// shards, or its reduced value: the bytes depend only on the per-shard shape) without running
/// it.
pub fn record_reduce_scatter<P: TensorMetadata>(
    x: &P,
    topo: &MeshTopology,
    axis: usize,
    global: &[usize],
) {
    let m = topo.axis_size(axis) as u64;
    let groups = topo.local_size() as u64 / m;
    comm::record(
        CollectiveKind::ReduceScatter,
        topo.axis_name(axis),
        groups * (m - 1) * shard_bytes(x, topo.ndim()),
        global,
    );
}

/// All-gather along `axis` of tensor dim `dim`: the axis' leading dim moves next to `dim` and
/// the two merge (coordinate-major, as the per-device concatenation): a permute and a reshape.
pub fn all_gather<B: Backend, K: Kind<B>>(
    x: K::P,
    topo: &MeshTopology,
    axis: usize,
    dim: usize,
    global: &[usize],
) -> K::P {
    let k = topo.ndim();
    let m = topo.axis_size(axis);
    let groups = (topo.local_size() / m) as u64;
    comm::record(
        CollectiveKind::AllGather,
        topo.axis_name(axis),
        groups * (m as u64 - 1) * m as u64 * shard_bytes(&x, k),
        global,
    );
    gather_dims::<B, K>(x, k, axis, dim)
}

/// All-gather along `axis` onto tensor dim `dim` when the axis spans processes (`pg`: its
/// process group): this process's members gathered in the stack ([`all_gather`]'s local step),
/// then one exchange across processes for all of this process's groups
/// ([`super::across::all_gather`] along the stack's dim of `dim`: the peers along the axis hold
/// the same block of the other axes, stacked in the same order), where the per-position path
/// ([`super::generic::all_gather`]) runs one per group. Records what that path records: per
/// group, the in-process bytes and the other processes' blocks.
pub fn all_gather_across<B: Backend, K: Kind<B>>(
    x: K::P,
    topo: &MeshTopology,
    axis: usize,
    dim: usize,
    global: &[usize],
    pg: &std::sync::Arc<dyn super::interface::ProcessGroup>,
) -> K::P {
    let nd = topo.ndim();
    let (k, m) = (x.shape()[axis] as u64, topo.axis_size(axis) as u64);
    let shard = shard_bytes(&x, nd);
    let local = gather_dims::<B, K>(x, nd, axis, dim);
    let (out, _) =
        super::across::all_gather::<B, K>(local, pg, topo, axis, (nd + dim, global[dim]), global);
    let groups = topo.local_size() as u64 / k;
    comm::record_across(
        CollectiveKind::AllGather,
        topo.axis_name(axis),
        groups * (k - 1) * k * shard,
        groups * (m - k) * shard,
        global,
    );
    out
}

fn gather_dims<B: Backend, K: Kind<B>>(x: K::P, k: usize, axis: usize, dim: usize) -> K::P {
    let xs = x.shape().to_vec();
    let p = k + dim;
    let m = xs[axis];
    let mut order: Vec<usize> = (0..xs.len()).filter(|&i| i != axis).collect();
    order.insert(p - 1, axis);
    let mut target = with(&xs, axis, 1);
    target[p] *= m;
    K::reshape(permute_for_merge::<B, K>(x, &order), Shape::from(target))
}

/// [`permute`] for a caller that merges dims of the result next, a reshape that copies a real
/// permute on every backend: the copy made once by contiguous runs where `x` is a row-major
/// host tensor ([`dense_permute`], which [`permute`] itself does on Flex only), not by the
/// backend's reshape of the permuted view. NdArray's copies such a view element by element: 4.3%
/// of rank 0's model-parallel IMDB step on 2 processes (the all-gathers of `[2, 2, 300, 24]`
/// over a batch axis with the model axis inside it), 4% of the spatial step in one process (the
/// weight gradient's contraction, `stack::contract`).
pub(crate) fn permute_for_merge<B: Backend, K: Kind<B>>(x: K::P, order: &[usize]) -> K::P {
    if !crate::inner::prefer_dense::<B>()
        && !only_unit_dims_move(&x.shape(), order)
        && let Some(p) = dense_permute::<B, K>(&x, order)
    {
        return p;
    }
    permute::<B, K>(x, order)
}

/// `permute(order)`, as a reshape when it only moves size-1 dims (the non-1 dims keep their
/// order): the layout stays contiguous, which backends that test contiguity strictly (Flex:
/// strides of size-1 dims included) need to keep later reshapes and element-wise ops on their
/// fast paths. On backends that [`prefer_dense`](crate::inner::prefer_dense) a permutation that
/// leaves a permuted view row-major is that view, contiguous; any other is copied by runs
/// ([`dense_permute`]) where it can be.
pub(crate) fn permute<B: Backend, K: Kind<B>>(x: K::P, order: &[usize]) -> K::P {
    if order.iter().enumerate().all(|(i, &o)| i == o) {
        return x;
    }
    let permuted =
        |xs: &[usize]| -> Shape { order.iter().map(|&i| xs[i]).collect::<Vec<_>>().into() };
    if crate::inner::with_dims(&x, |xs| only_unit_dims_move(xs, order)) {
        let shape = crate::inner::with_dims(&x, permuted);
        return K::reshape(x, shape);
    }
    if crate::inner::prefer_dense::<B>() {
        // Already row-major in `order` (a permuted view of a buffer laid out that way: a weight
        // kept side by side, `stack::side_by_side`): the permuted view is that buffer.
        if let Some(q) = crate::inner::row_major_order(&x)
            && crate::inner::with_dims(&x, |xs| same_order_of_big_dims(xs, &q, order))
        {
            let shape = crate::inner::with_dims(&x, permuted);
            return K::reshape(K::permute(x, order), shape);
        }
        if let Some(p) = dense_permute::<B, K>(&x, order) {
            return p;
        }
    }
    K::permute(x, order)
}

/// Whether the runs of `permute(order)` of a row-major tensor of `shape` are long enough for
/// [`dense_permute`] to copy it by runs: at least 8 elements, below which the per-run
/// bookkeeping costs more than the backend's element-wise copy saves.
pub(crate) fn permutes_by_runs(shape: &[usize], order: &[usize]) -> bool {
    crate::host::permute_run(shape, order) >= 8
}

/// `permute(order)` materialised row-major, by one copy per contiguous run of the host bytes
/// ([`crate::host::for_each_permuted_run`]): always for a backend that
/// [`prefer_dense`](crate::inner::prefer_dense) (Flex), where a permuted view is copied through
/// its scalar strided iterator by whichever op reads it next (a model- or spatial-parallel
/// step's BatchNorm sums and gradient chunks: 7% of the spatial step), and on any backend
/// before a merge that would copy anyway ([`permute_for_merge`]). `None` when `x` is not a row-major host tensor of a numeric dtype, or the
/// runs are too short for the copies to beat the iterator.
pub(crate) fn dense_permute<B: Backend, K: Kind<B>>(x: &K::P, order: &[usize]) -> Option<K::P> {
    let shape = x.shape().to_vec();
    let dtype = x.dtype();
    if !permutes_by_runs(&shape, order) || matches!(dtype, burn::tensor::DType::QFloat(_)) {
        return None;
    }
    let src = crate::inner::host_bytes(x)?;
    let out = crate::host::HostBuffer::permuted(src, dtype, &shape, order)?;
    let out_shape: Vec<usize> = order.iter().map(|&i| shape[i]).collect();
    Some(K::from_data(out.into_data(out_shape, dtype), &K::device(x)))
}

/// Whether `order` only moves dims of size 1 (the others keep their relative order).
pub(crate) fn only_unit_dims_move(shape: &[usize], order: &[usize]) -> bool {
    (0..shape.len())
        .filter(|&i| shape[i] != 1)
        .eq(big_dims(shape, order))
}

/// Whether permutations `p` and `q` of the dims of `shape` list its dims of more than one
/// element in the same order (they differ only in where the dims of size 1 go, which moves no
/// element).
pub(crate) fn same_order_of_big_dims(shape: &[usize], p: &[usize], q: &[usize]) -> bool {
    big_dims(shape, p).eq(big_dims(shape, q))
}

/// The dims of more than one element of `shape`, in the order `order` lists them (no
/// allocation: [`permute`] asks on every stacked permute).
fn big_dims<'a>(shape: &'a [usize], order: &'a [usize]) -> impl Iterator<Item = usize> + 'a {
    order.iter().copied().filter(move |&i| shape[i] != 1)
}

/// No communication: each index of `axis` keeps its chunk of tensor dim `dim` (whose size the
/// axis size divides): a reshape and a permute, both views on CPU backends. When the permute
/// is a real one, backends that [`prefer_dense`](crate::inner::prefer_dense) get one contiguous
/// copy instead, by runs on the host ([`dense_permute`]) or, where the tensor is not a row-major
/// host tensor, the chunks sliced and concatenated along the axis' dim: Flex would otherwise
/// copy the permuted view through its scalar strided iterator at every later reshape (a
/// model-parallel BatchNorm gradient, `[1, 2, 64, 24] -> [4, 2, 16, 24]`).
pub fn local_chunk<B: Backend, K: Kind<B>>(
    x: K::P,
    topo: &MeshTopology,
    axis: usize,
    dim: usize,
) -> K::P {
    let p = topo.ndim() + dim;
    debug_assert_eq!(
        x.shape()[axis],
        1,
        "local chunk along an axis already in use"
    );
    // On a multi-process mesh, this process's coordinates of the axis: their chunks first.
    let (m, l) = (topo.axis_size(axis), topo.local_axis_size(axis));
    let x = if l < m {
        let len = x.shape()[p] / m;
        let origin = topo.local_origin(axis);
        K::narrow(x, p, origin * len..(origin + l) * len)
    } else {
        x
    };
    chunks_onto_axis::<B, K>(x, topo.ndim(), axis, dim, l)
}

/// Primitive dim `k + dim` (`k` mesh dims) cut in `m` equal chunks, chunk `c` at index `c` of
/// the axis' size-1 leading dim `axis`: [`local_chunk`] on the part of the dim this process
/// holds (`m` its coordinates of the axis).
fn chunks_onto_axis<B: Backend, K: Kind<B>>(
    x: K::P,
    k: usize,
    axis: usize,
    dim: usize,
    m: usize,
) -> K::P {
    let xs = x.shape().to_vec();
    let p = k + dim;
    let n = xs[p];
    // Drop the axis' size-1 dim, split `dim` into (m, n / m); the m sits at p - 1.
    let mut split: Vec<usize> = xs[..axis].iter().chain(&xs[axis + 1..p]).copied().collect();
    split.extend([m, n / m]);
    split.extend(&xs[p + 1..]);
    let mut order: Vec<usize> = (0..split.len()).filter(|&i| i != p - 1).collect();
    order.insert(axis, p - 1);
    if crate::inner::prefer_dense::<B>() && !only_unit_dims_move(&split, &order) {
        if let Some(d) = crate::inner::reshape_permute_copy(&x, &split, &order) {
            return K::from_data(d, &K::device(&x));
        }
        let split = K::reshape(x.clone(), Shape::from(split));
        if let Some(p) = dense_permute::<B, K>(&split, &order) {
            return p;
        }
        let len = n / m;
        let parts = (0..m)
            .map(|c| {
                let mut s = vec![Slice::full(); xs.len()];
                s[p] = Slice::new((c * len) as isize, Some(((c + 1) * len) as isize), 1);
                K::slice(x.clone(), &s)
            })
            .collect();
        return K::cat(parts, axis);
    }
    permute::<B, K>(K::reshape(x, Shape::from(split)), &order)
}

/// All-to-all along `axis`, from sharding tensor dim `from` to sharding `to`.
pub fn all_to_all<B: Backend, K: Kind<B>>(
    x: K::P,
    topo: &MeshTopology,
    axis: usize,
    from: usize,
    to: usize,
    global: &[usize],
) -> K::P {
    let k = topo.ndim();
    let m = topo.axis_size(axis) as u64;
    comm::record(
        CollectiveKind::AllToAll,
        topo.axis_name(axis),
        topo.local_size() as u64 * (shard_bytes(&x, k) * (m - 1) / m),
        global,
    );
    let whole = gather_dims::<B, K>(x, k, axis, from);
    local_chunk::<B, K>(whole, topo, axis, to)
}

/// All-to-all along `axis`, from sharding tensor dim `from` to sharding `to`, when the axis
/// spans processes (`pg`: its process group): this process's members joined along `from` in the
/// stack (its block of `from`), then one exchange across processes for all of its groups
/// ([`super::across::all_to_all`]: each process receives only the parts in its block of `to`),
/// where the per-position path ([`super::generic::all_to_all`]) runs one per group; each
/// position keeps its chunk of `to`. Records what that path records: per group, the
/// in-process bytes and those received from other processes.
pub fn all_to_all_across<B: Backend, K: Kind<B>>(
    x: K::P,
    topo: &MeshTopology,
    axis: usize,
    (from, to): (usize, usize),
    global: &[usize],
    pg: &std::sync::Arc<dyn super::interface::ProcessGroup>,
) -> K::P {
    let nd = topo.ndim();
    // A permuted view of a row-major tensor (a data-parallel weight gradient's `x^T`, whose
    // product is split by rows across processes): the exchange runs on the row-major tensor,
    // its dims renamed, and the result is permuted back (a view the GEMM reads as it reads
    // `x^T`). On the view, merging the gathered dims copied it element by element first
    // (NdArray's reshape of a transposed array: 4.6% of rank 0's data-parallel step on 2
    // processes). The same bytes move either way.
    if let Some(q) = crate::inner::row_major_order(&x).filter(|q| (0..nd).all(|i| q[i] == i)) {
        let mut back = vec![0; q.len()];
        for (j, &i) in q.iter().enumerate() {
            back[i] = j;
        }
        let renamed: Vec<usize> = q[nd..].iter().map(|&i| global[i - nd]).collect();
        let dims = (back[nd + from] - nd, back[nd + to] - nd);
        let out = all_to_all_across::<B, K>(K::permute(x, &q), topo, axis, dims, &renamed, pg);
        return K::permute(out, &back);
    }
    let xs = x.shape().to_vec();
    let (l, m) = (xs[axis], topo.axis_size(axis));
    let shard = shard_bytes(&x, nd);
    let per_position = positions_per_slot(&x, topo);
    let local = gather_dims::<B, K>(x, nd, axis, from);
    let whole_from = (nd + from, m * xs[nd + from]);
    let (mine, received) =
        super::across::all_to_all::<B, K>(local, pg, topo, axis, (whole_from, nd + to), global);
    let groups = (topo.local_size() / l) as u64;
    comm::record_across(
        CollectiveKind::AllToAll,
        topo.axis_name(axis),
        groups * (l as u64 - 1) * l as u64 * shard,
        received * per_position,
        global,
    );
    chunks_onto_axis::<B, K>(mine, nd, axis, to, l)
}

/// A replicated value made partial along `axis` (no communication): for a sum, coordinate 0 of
/// the axis keeps the value and the others hold zeros; for max and min every coordinate keeps
/// it. On a multi-process mesh the stack holds this process's coordinates of the axis (see
/// [`MeshTopology::local_axis_size`]): only the process holding coordinate 0 keeps the sum's
/// value.
pub fn make_partial<B: Backend, K: Kind<B>>(
    x: K::P,
    topo: &MeshTopology,
    axis: usize,
    op: ReduceOp,
) -> K::P {
    let l = topo.local_axis_size(axis);
    let zeros = |x: &K::P, n: usize| {
        let xs = x.shape().to_vec();
        K::zeros(Shape::from(with(&xs, axis, n)), &K::device(x), x.dtype())
    };
    let parts = match op {
        ReduceOp::Sum if topo.local_origin(axis) != 0 => return zeros(&x, l),
        ReduceOp::Sum if l == 1 => return x,
        ReduceOp::Sum => {
            let rest = zeros(&x, l - 1);
            vec![x, rest]
        }
        ReduceOp::Max | ReduceOp::Min => vec![x; l],
    };
    K::cat(parts, axis)
}

/// Tensor dim `dim`, sharded over `axis`, made a pending sum over it (see
/// `Step::PadPartial` in `redistribute/plan.rs`): the slot of coordinate `c` of the axis gets its
/// chunk at offset `c * len` of the whole dim, zeros elsewhere. No communication. On a
/// multi-process mesh the stack's slots are this process's coordinates of the axis.
pub fn pad_partial<B: Backend, K: Kind<B>>(
    x: K::P,
    topo: &MeshTopology,
    axis: usize,
    dim: usize,
) -> K::P {
    let (m, l, origin) = (
        topo.axis_size(axis),
        topo.local_axis_size(axis),
        topo.local_origin(axis),
    );
    let p = topo.ndim() + dim;
    let xs = x.shape().to_vec();
    let len = xs[p];
    let parts = (0..l)
        .map(|i| {
            let mut s = vec![Slice::full(); xs.len()];
            s[axis] = Slice::new(i as isize, Some(i as isize + 1), 1);
            let xc = K::slice(x.clone(), &s);
            let c = origin + i;
            super::generic::pad_dim::<B, K>(xc, p, c * len, (m - 1 - c) * len)
        })
        .collect();
    K::cat(parts, axis)
}
