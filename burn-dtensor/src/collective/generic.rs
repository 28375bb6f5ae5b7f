//! Collectives written once over [`Kind`]: they work on any inner backend.
//!
//! Each function takes the per-device shards of one tensor (row-major over the mesh), the mesh
//! topology and the axis, and rewrites the shards of every sub-group of that axis in place. The
//! mesh's in-process engines ([`LocalEngines`], chosen when the mesh was built) are asked first
//! for each group's reduction, concatenation or all-reduce; across processes, the axis'
//! [`crate::spmd::ProcessGroup`] ([`across`]).

use burn::tensor::backend::Backend;
use burn::tensor::{Shape, TensorMetadata};

use super::across;
use super::engine::LocalEngines;
use super::interface::ReduceOp;
use crate::comm::{self, CollectiveKind};
use crate::inner::{par_min, threads_for};
use crate::mesh::MeshTopology;
use crate::shard::chunk;
use crate::tensor::Kind;

fn nbytes<P: TensorMetadata>(p: &P) -> u64 {
    (p.shape().num_elements() * p.dtype().size()) as u64
}

/// `x` on `dev`: as it is when it is there already, else moved.
fn on_device<B: Backend, K: Kind<B>>(x: K::P, dev: &B::Device) -> K::P {
    if K::device(&x) == *dev {
        x
    } else {
        K::to_device(x, dev)
    }
}

/// Gives every member of each group the value `f(group's shards)`, moved to its device.
fn set_group<B: Backend, K: Kind<B>>(shards: &mut [K::P], group: &[usize], value: K::P) {
    for &i in group {
        shards[i] = on_device::<B, K>(value.clone(), &K::device(&shards[i]));
    }
}

/// The shards of `group`, on its first member's device (those already there as they are).
fn on_first_device<B: Backend, K: Kind<B>>(shards: &[K::P], group: &[usize]) -> Vec<K::P> {
    let dev0 = K::device(&shards[group[0]]);
    group
        .iter()
        .map(|&i| on_device::<B, K>(shards[i].clone(), &dev0))
        .collect()
}

/// Element-wise reduction of a group's shards onto its first member's device: `k - 1` inner ops,
/// as a chain, or, when the shards are large enough for worker threads (CPU backends, see
/// [`threads_for`] and [`par_min`]), as a pairwise tree whose pairs of a level run in parallel.
///
/// The mesh's in-process engines ([`MeshTopology::engines`]: CubeCL's one-launch reduction) are
/// asked first.
fn reduce_group<B: Backend, K: Kind<B>>(
    shards: &[K::P],
    group: &[usize],
    op: ReduceOp,
    engines: &LocalEngines,
) -> K::P {
    let tree = as_tree::<B>(shards[group[0]].shape().num_elements());
    reduce_group_as::<B, K>(shards, group, op, engines, tree)
}

/// Whether [`reduce_group`] reduces shards of `elements` elements as a tree (worker threads)
/// rather than a chain.
fn as_tree<B: Backend>(elements: usize) -> bool {
    threads_for::<B>() && elements >= par_min()
}

/// [`reduce_group`] with the shape of the reduction fixed by the caller (a chain, or a tree when
/// `parallel`): the chunks of a chunked reduction ([`across::all_reduce_ordered`]) are reduced
/// in the shape their whole shards would be, so every element is summed in the same order.
fn reduce_group_as<B: Backend, K: Kind<B>>(
    shards: &[K::P],
    group: &[usize],
    op: ReduceOp,
    engines: &LocalEngines,
    parallel: bool,
) -> K::P {
    use rayon::prelude::*;
    let mut level = on_first_device::<B, K>(shards, group);
    if level.len() > 1
        && let Some(r) = engines.reduce(&level, op)
    {
        return r;
    }
    if !parallel {
        // A chain: the first sum is a fresh buffer that the later ones can reuse (CPU backends
        // write into an operand they own alone), where a tree allocates one per pair.
        let mut it = level.into_iter();
        let first = it.next().expect("a group has at least one member");
        return it.fold(first, |acc, x| K::reduce(acc, x, op));
    }
    while level.len() > 1 {
        let odd = (level.len() % 2 == 1).then(|| level.pop().unwrap());
        let mut pairs = Vec::with_capacity(level.len() / 2);
        let mut it = level.into_iter();
        while let (Some(a), Some(b)) = (it.next(), it.next()) {
            pairs.push((a, b));
        }
        level = if parallel && pairs.len() > 1 {
            pairs
                .into_par_iter()
                .map(|(a, b)| K::reduce(a, b, op))
                .collect()
        } else {
            pairs
                .into_iter()
                .map(|(a, b)| K::reduce(a, b, op))
                .collect()
        };
        level.extend(odd);
    }
    level.pop().expect("a group has at least one member")
}

/// The reduction of the chunks of a group's shards that a process receives in a chunked
/// ordered collective ([`across::all_reduce_ordered`], [`across::reduce_scatter_ordered`]): all
/// of them in order, in the shape (chain or tree) the whole shards of `group` would be reduced in,
/// so that every element is summed as in one process.
fn ordered_chunks<'a, B: Backend, K: Kind<B>>(
    shards: &[K::P],
    group: &[usize],
    op: ReduceOp,
    topo: &'a MeshTopology,
) -> impl Fn(&[K::P]) -> K::P + 'a {
    ordered_reduction::<B, K>(shards[group[0]].shape().num_elements(), op, topo)
}

/// [`ordered_chunks`] for shards of `elements` elements: the element-wise reduction of all the
/// given pieces, in order, in the shape (chain or tree) shards of that size are reduced in.
pub(crate) fn ordered_reduction<'a, B: Backend, K: Kind<B>>(
    elements: usize,
    op: ReduceOp,
    topo: &'a MeshTopology,
) -> impl Fn(&[K::P]) -> K::P + 'a {
    let tree = as_tree::<B>(elements);
    move |all| {
        let everyone: Vec<usize> = (0..all.len()).collect();
        reduce_group_as::<B, K>(all, &everyone, op, &topo.engines, tree)
    }
}

/// The reduction of an in-process group's shards and, on a multi-process mesh, of the matching
/// groups of the other processes along the axis (process group `pg`): in mesh coordinate order
/// ([`across::all_reduce_ordered`]) unless [`crate::spmd::Reduction::Engine`] was chosen, then
/// in process and through the engine's all-reduce. Returns the bytes received from other
/// processes.
fn reduce_across<B: Backend, K: Kind<B>>(
    shards: &mut [K::P],
    group: &[usize],
    pg: Option<&std::sync::Arc<dyn super::interface::ProcessGroup>>,
    topo: &MeshTopology,
    axis: usize,
    op: ReduceOp,
    global: &[usize],
) -> (K::P, u64) {
    let Some(pg) = pg else {
        return (reduce_group::<B, K>(shards, group, op, &topo.engines), 0);
    };
    match crate::config::config().reduction {
        crate::config::Reduction::Ordered => {
            let members = group.iter().map(|&i| shards[i].clone()).collect();
            let reduce = ordered_chunks::<B, K>(shards, group, op, topo);
            across::all_reduce_ordered::<B, K>(members, pg, topo, axis, global, reduce)
        }
        crate::config::Reduction::Engine => {
            let acc = if let [only] = group {
                // The one shard of this process's group, moved out (its slot is overwritten
                // with the result by the caller): left shared with the slot, the engine could
                // not reduce it in place.
                let placeholder = K::zeros(
                    Shape::new([0]),
                    &K::device(&shards[*only]),
                    shards[*only].dtype(),
                );
                std::mem::replace(&mut shards[*only], placeholder)
            } else {
                reduce_group::<B, K>(shards, group, op, &topo.engines)
            };
            across::all_reduce::<B, K>(acc, pg, topo, axis, op, global)
        }
    }
}

/// The concatenation of `parts` along `dim`: by the mesh's in-process engine when one applies to
/// the non-empty parts (CubeCL's one-launch concatenation), else the inner backend's `cat`.
fn cat_parts<B: Backend, K: Kind<B>>(parts: Vec<K::P>, dim: usize, engines: &LocalEngines) -> K::P {
    let nonempty: Vec<K::P> = parts
        .iter()
        .filter(|p| p.shape().num_elements() > 0)
        .cloned()
        .collect();
    if nonempty.len() > 1
        && let Some(r) = engines.cat(&nonempty, dim)
    {
        return r;
    }
    K::cat(parts, dim)
}

/// All-reduce along `axis`: every device ends with the `op`-reduction of its group's shards
/// (on a multi-process mesh: the in-process reduction, then across the axis' processes).
pub fn all_reduce<B: Backend, K: Kind<B>>(
    shards: &mut [K::P],
    topo: &MeshTopology,
    axis: usize,
    op: ReduceOp,
    global: &[usize],
) {
    let k = topo.local_axis_size(axis) as u64;
    let pg = across::group(topo, axis);
    let (mut bytes, mut remote) = (0, 0);
    for group in topo.local_groups(axis) {
        if pg.is_none() {
            let members: Vec<K::P> = group.iter().map(|&i| shards[i].clone()).collect();
            if let Some(reduced) = topo.engines.all_reduce(&members, op) {
                bytes += 2 * (k - 1) * nbytes(&reduced[0]);
                for (&i, r) in group.iter().zip(reduced) {
                    shards[i] = r;
                }
                continue;
            }
        }
        let (acc, b) = reduce_across::<B, K>(shards, &group, pg, topo, axis, op, global);
        bytes += 2 * (k - 1) * nbytes(&acc);
        remote += b;
        set_group::<B, K>(shards, &group, acc);
    }
    comm::record_across(
        CollectiveKind::AllReduce,
        topo.axis_name(axis),
        bytes,
        remote,
        global,
    );
}

/// All-gather along `axis` on tensor dim `dim`: each device ends with the concatenation of its
/// group's shards (in coordinate order; across processes after the in-process part).
pub fn all_gather<B: Backend, K: Kind<B>>(
    shards: &mut [K::P],
    topo: &MeshTopology,
    axis: usize,
    dim: usize,
    global: &[usize],
) {
    let k = topo.local_axis_size(axis) as u64;
    let pg = across::group(topo, axis);
    let (mut bytes, mut remote) = (0, 0);
    for group in topo.local_groups(axis) {
        let mut full = gather_group::<B, K>(shards, &group, dim, &topo.engines);
        bytes += (k - 1) * nbytes(&full);
        if let Some(pg) = pg {
            let (v, b) =
                across::all_gather::<B, K>(full, pg, topo, axis, (dim, global[dim]), global);
            full = v;
            remote += b;
        }
        set_group::<B, K>(shards, &group, full);
    }
    comm::record_across(
        CollectiveKind::AllGather,
        topo.axis_name(axis),
        bytes,
        remote,
        global,
    );
}

/// The concatenation along `dim` of a group's shards, on its first member's device.
fn gather_group<B: Backend, K: Kind<B>>(
    shards: &[K::P],
    group: &[usize],
    dim: usize,
    engines: &LocalEngines,
) -> K::P {
    let parts = on_first_device::<B, K>(shards, group);
    cat_parts::<B, K>(parts, dim, engines)
}

/// Reduce-scatter along `axis`: the group's `op`-reduction, chunked along `dim` (whose full size
/// is `n`) so that the member with coordinate `c` keeps chunk `c`. Across processes, in the
/// default ordered reduction: each process receives only its block of every member's shard and
/// reduces it ([`across::reduce_scatter_ordered`]); with the engine's reduction: the in-process
/// reduction, then the engine's reduce-scatter across the processes ([`across::reduce_scatter`],
/// one `MPI_Reduce_scatter`), then each member keeps its chunk of its process's block.
pub fn reduce_scatter<B: Backend, K: Kind<B>>(
    shards: &mut [K::P],
    topo: &MeshTopology,
    axis: usize,
    op: ReduceOp,
    dim: usize,
    global: &[usize],
) {
    let (k, l) = (topo.axis_size(axis), topo.local_axis_size(axis));
    let pg = across::group(topo, axis);
    let (mut bytes, mut remote) = (0, 0);
    for group in topo.local_groups(axis) {
        let n = shards[group[0]].shape()[dim];
        bytes += (l as u64 - 1) * nbytes(&shards[group[0]]);
        // The reduced block of `dim` this process's members share, and where it starts.
        let (acc, base, b) = match pg {
            Some(pg) if crate::config::config().reduction == crate::config::Reduction::Ordered => {
                let members = group.iter().map(|&i| shards[i].clone()).collect();
                let reduce = ordered_chunks::<B, K>(shards, &group, op, topo);
                let (acc, b) = across::reduce_scatter_ordered::<B, K>(
                    members,
                    pg,
                    topo,
                    (axis, dim),
                    global,
                    reduce,
                );
                (acc, across::block(n, k, l, pg.rank()).start, b)
            }
            Some(pg) => {
                let acc = reduce_group::<B, K>(shards, &group, op, &topo.engines);
                let (acc, b) =
                    across::reduce_scatter::<B, K>(acc, pg, topo, (axis, dim), op, global);
                (acc, across::block(n, k, l, pg.rank()).start, b)
            }
            None => {
                let (acc, b) = reduce_across::<B, K>(shards, &group, pg, topo, axis, op, global);
                (acc, 0, b)
            }
        };
        remote += b;
        for &i in &group {
            let dev = K::device(&shards[i]);
            let r = chunk(n, k, topo.coord(topo.global(i), axis));
            let part = K::narrow(acc.clone(), dim, r.start - base..r.end - base);
            shards[i] = K::to_device(part, &dev);
        }
    }
    comm::record_across(
        CollectiveKind::ReduceScatter,
        topo.axis_name(axis),
        bytes,
        remote,
        global,
    );
}

/// All-to-all along `axis`: shards split along `to_dim` are exchanged so that afterwards the
/// tensor is whole along `from_dim` and chunked along `to_dim` (full size `n_to`).
pub fn all_to_all<B: Backend, K: Kind<B>>(
    shards: &mut [K::P],
    topo: &MeshTopology,
    axis: usize,
    from_dim: usize,
    to_dim: usize,
    global: &[usize],
) {
    let k = topo.axis_size(axis);
    if let Some(pg) = across::group(topo, axis) {
        // Across processes: this process's members' blocks joined along `from_dim`, then each
        // process receives only the part of every process's block in its block of `to_dim`
        // ([`across::all_to_all`]); each device keeps its chunk of that.
        let l = topo.local_axis_size(axis) as u64;
        let (mut bytes, mut remote) = (0, 0);
        for group in topo.local_groups(axis) {
            let block = gather_group::<B, K>(shards, &group, from_dim, &topo.engines);
            bytes += (l - 1) * nbytes(&block);
            let n_to = block.shape()[to_dim];
            let from = (from_dim, global[from_dim]);
            let (mine, b) =
                across::all_to_all::<B, K>(block, pg, topo, axis, (from, to_dim), global);
            remote += b;
            let base = across::block(n_to, k, l as usize, pg.rank()).start;
            for &i in &group {
                let r = chunk(n_to, k, topo.coord(topo.global(i), axis));
                let dev = K::device(&shards[i]);
                shards[i] = K::to_device(
                    K::narrow(mine.clone(), to_dim, r.start - base..r.end - base),
                    &dev,
                );
            }
        }
        comm::record_across(
            CollectiveKind::AllToAll,
            topo.axis_name(axis),
            bytes,
            remote,
            global,
        );
        return;
    }
    let mut bytes = 0;
    // One process along the axis: a local group is the whole group, in coordinate order.
    for group in topo.local_groups(axis) {
        let n_to = shards[group[0]].shape()[to_dim];
        let olds: Vec<K::P> = group.iter().map(|&i| shards[i].clone()).collect();
        for (c, &i) in group.iter().enumerate() {
            let dev = K::device(&olds[c]);
            let parts = olds
                .iter()
                .map(|p| on_device::<B, K>(K::narrow(p.clone(), to_dim, chunk(n_to, k, c)), &dev))
                .collect::<Vec<_>>();
            shards[i] = cat_parts::<B, K>(parts, from_dim, &topo.engines);
            bytes += nbytes(&olds[c]) * (k as u64 - 1) / k as u64;
        }
    }
    comm::record(
        CollectiveKind::AllToAll,
        topo.axis_name(axis),
        bytes,
        global,
    );
}

/// Collective permute along `axis` (XLA's collective-permute, JAX's `ppermute` with the pairs
/// `(c, c + shift)`): for each shift `shifts[s]`, device `i` (coordinate `c` on the axis) sends
/// `sends[s][i]` to the device of its group at coordinate `c + shift`, where there is one (the
/// axis is not cyclic: a piece with no device there is dropped). Returns `received[s][i]`, the
/// piece device `i` got from coordinate `c - shift`, on its device (`None` at the axis' ends).
/// A halo exchange is the shifts `[+1, -1]`: each device's edge rows to both neighbours.
///
/// Only the pieces move: `Σ_s (k - |shift_s|)` pieces per group, against `k (k - 1)` for an
/// all-gather of them. Across processes, pieces between devices of one process are moved
/// locally and the rest go point to point between the processes that hold the pairs
/// ([`across::permute`], [`crate::spmd::ProcessGroup::send_recv`]), every process calling it
/// once per in-process group. `sends[s]` holds
/// a piece for every position of this process (one shape per shift within a group: a receiver
/// sizes what it gets from its own piece); `global` is the shape recorded in the
/// [`CommDebugMode`](crate::CommDebugMode) log (the pieces' global shape, for the caller to
/// choose). Recorded as one [`CollectiveKind::CollectivePermute`], its bytes those received;
/// no shift, no collective.
pub fn collective_permute<B: Backend, K: Kind<B>>(
    sends: &[Vec<K::P>],
    topo: &MeshTopology,
    axis: usize,
    shifts: &[isize],
    global: &[usize],
) -> Vec<Vec<Option<K::P>>> {
    let k = topo.axis_size(axis) as isize;
    let l = topo.local_axis_size(axis) as isize;
    let coord = |i: usize| topo.coord(topo.global(i), axis) as isize;
    let n = sends.first().map_or(0, Vec::len);
    let mut out: Vec<Vec<Option<K::P>>> = shifts.iter().map(|_| vec![None; n]).collect();
    if shifts.is_empty() {
        // Nothing to move: no collective (and none recorded).
        return out;
    }
    let pg = across::group(topo, axis);
    let (mut bytes, mut remote) = (0, 0);
    for group in topo.local_groups(axis) {
        let first = coord(group[0]);
        // The position of this process holding coordinate `c` of this group, if any.
        let local = |c: isize| {
            (first..first + group.len() as isize)
                .contains(&c)
                .then(|| group[(c - first) as usize])
        };
        let mut remote_sends = Vec::new();
        let mut remote_from = Vec::new();
        let mut lands = Vec::new();
        for (s, &shift) in shifts.iter().enumerate() {
            for &i in &group {
                let to = coord(i) + shift;
                if (0..k).contains(&to) {
                    let piece = sends[s][i].clone();
                    match local(to) {
                        Some(dst) => {
                            bytes += nbytes(&piece);
                            let dev = K::device(&sends[s][dst]);
                            out[s][dst] = Some(on_device::<B, K>(piece, &dev));
                        }
                        None => remote_sends.push(((to / l) as usize, piece)),
                    }
                }
            }
            for &i in &group {
                let src = coord(i) - shift;
                if (0..k).contains(&src) && local(src).is_none() {
                    remote_from.push(((src / l) as usize, sends[s][i].shape().to_vec()));
                    lands.push((s, i));
                }
            }
        }
        let Some(pg) = pg else { continue };
        let like = &sends[0][group[0]];
        let (got, b) = across::permute::<B, K>(
            remote_sends,
            &remote_from,
            (like.dtype(), &K::device(like)),
            (pg, topo, axis),
            global,
        );
        remote += b;
        for ((s, i), piece) in lands.into_iter().zip(got) {
            let dev = K::device(&sends[s][i]);
            out[s][i] = Some(on_device::<B, K>(piece, &dev));
        }
    }
    comm::record_across(
        CollectiveKind::CollectivePermute,
        topo.axis_name(axis),
        bytes,
        remote,
        global,
    );
    out
}

/// Broadcast along `axis` from the member with coordinate `root`.
#[allow(dead_code)] // no layout change needs it in one process; the multi-process path will
pub fn broadcast<B: Backend, K: Kind<B>>(
    shards: &mut [K::P],
    topo: &MeshTopology,
    axis: usize,
    root: usize,
    global: &[usize],
) {
    assert!(
        !topo.is_multi_process(),
        "burn-dtensor: broadcast on a multi-process mesh"
    );
    let k = topo.axis_size(axis) as u64;
    let mut bytes = 0;
    for group in topo.groups(axis) {
        let v = shards[group[root]].clone();
        bytes += (k - 1) * nbytes(&v);
        set_group::<B, K>(shards, &group, v);
    }
    comm::record(
        CollectiveKind::Broadcast,
        topo.axis_name(axis),
        bytes,
        global,
    );
}

/// No communication: each device keeps chunk `coord(axis)` of its (whole) `dim`.
pub fn local_chunk<B: Backend, K: Kind<B>>(
    shards: &mut [K::P],
    topo: &MeshTopology,
    axis: usize,
    dim: usize,
) {
    let k = topo.axis_size(axis);
    for (i, s) in shards.iter_mut().enumerate() {
        let n = s.shape()[dim];
        *s = K::narrow(
            s.clone(),
            dim,
            chunk(n, k, topo.coord(topo.global(i), axis)),
        );
    }
}

/// No communication: each device writes its chunk of `dim` (whole size `n`) at its offset into
/// zeros of the whole dim, turning a dim sharded over `axis` into a pending sum over it (see
/// `Step::PadPartial` in `redistribute/plan.rs`).
pub fn pad_partial<B: Backend, K: Kind<B>>(
    shards: &mut [K::P],
    topo: &MeshTopology,
    axis: usize,
    dim: usize,
    n: usize,
) {
    let k = topo.axis_size(axis);
    for (i, s) in shards.iter_mut().enumerate() {
        let r = chunk(n, k, topo.coord(topo.global(i), axis));
        *s = pad_dim::<B, K>(s.clone(), dim, r.start, n - r.end);
    }
}

/// `x` with `before` and `after` zeros added along `dim`.
pub(crate) fn pad_dim<B: Backend, K: Kind<B>>(
    x: K::P,
    dim: usize,
    before: usize,
    after: usize,
) -> K::P {
    let zeros = |len: usize| {
        let mut shape = x.shape().to_vec();
        shape[dim] = len;
        K::zeros(Shape::from(shape), &K::device(&x), x.dtype())
    };
    let mut parts = Vec::with_capacity(3);
    if before > 0 {
        parts.push(zeros(before));
    }
    let tail = (after > 0).then(|| zeros(after));
    parts.push(x);
    parts.extend(tail);
    if parts.len() == 1 {
        return parts.pop().expect("one part");
    }
    K::cat(parts, dim)
}
