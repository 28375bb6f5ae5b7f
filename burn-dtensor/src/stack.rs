//! Stacked execution: on a virtual mesh (every position is the same inner device), the shards
//! of a tensor are held as **one** inner primitive with one leading dim per mesh axis, and an op
//! runs as **one** inner op on it instead of one per shard.
//!
//! The stacked primitive of a tensor of global shape `[n_0, .., n_{r-1}]` under a layout on a
//! mesh of axes `(m_0, .., m_{k-1})` has shape [`stack_shape`]: `[s_0, .., s_{k-1}, l_0, ..,
//! l_{r-1}]`, where `s_a = m_a` when the layout uses axis `a` (shards a dim with it or has a
//! pending reduction on it) and 1 otherwise, and `l_d` is the per-shard size of dim `d`. The
//! shard of the device at mesh coordinates `c` is the sub-tensor at `[c_a or 0 per axis]`: the
//! same values, one shard per index of the leading dims, as the per-device form
//! ([`DTensor`]'s docs). Nothing is computed on the global tensor: per-shard ops keep their
//! per-shard semantics (an element-wise op on the stack is that op on every shard; a matmul
//! broadcasts over the leading dims; a sum over a sharded dim leaves one partial sum per index of
//! the axis), and the collectives the layouts imply run on the stack
//! ([`crate::collective::stacked`]): an all-reduce is a reduction over the axis' leading dim, an
//! all-gather moves the axis' leading dim next to the tensor dim and merges them.
//!
//! This is what `jax.vmap` over a device axis, or an SPMD program batched over its replicas,
//! would do. It replaces 8 small inner ops by one on an 8-device virtual mesh: on a CPU, where
//! the virtual devices share the cores anyway, the per-op cost of the inner backend (allocation,
//! dispatch, iterator setup) is what dominated the per-shard path at the IMDB job's sizes.
//!
//! On a multi-process mesh ([`crate::Mesh::spmd`]) a process stacks only the positions it holds
//! (its addressable shards, a box of the mesh): the leading dim of a used axis has that axis'
//! *local* extent ([`crate::MeshTopology::local_axis_size`]), index `c` being the process's
//! coordinate `local_origin + c`. Compute runs stacked as in one process, and so do the
//! collectives along an axis the process holds whole. Along an axis that spans processes,
//! every relayout step runs on the stack too (the collectives combined in process, then one
//! exchange across processes for all of the process's groups: `collective::stacked`). Results
//! and communication accounting are those of the per-position path.
//!
//! Stacked form applies when the mesh allows it ([`crate::MeshTopology::is_stacked`]: virtual,
//! not switched off) and the layout splits every sharded dim evenly with no empty dim; other
//! tensors stay per device, and an op whose operands are not all stackable (or whose rule has
//! no stacked form, e.g. ops with 1-D index operands) converts them with [`to_per_device`].

use burn::tensor::backend::Backend;
use burn::tensor::{Shape, Slice, TensorMetadata};

use crate::inner::{prefer_dense, reshape_copies};
use crate::layout::Layout;
use crate::rules::pointwise::broadcast_shape;

use crate::tensor::{DTensor, Kind, Shards};

/// Where an op's inner closure runs: on the shard of one mesh device (its flat index), or once
/// on the stacked primitive whose first `k` dims are the mesh axes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum At {
    /// The shard of mesh device `i` (row-major).
    Device(usize),
    /// The stacked primitive of a mesh of `k` axes.
    Stacked(usize),
}

impl At {
    /// What to add to a tensor dim to address the inner primitive: 0 per device, `k` stacked.
    pub fn off(self) -> usize {
        match self {
            At::Device(_) => 0,
            At::Stacked(k) => k,
        }
    }
    /// The inner primitive's shape for a tensor of global `shape` under `layout`: the per-shard
    /// shape of the device, or the [`stack_shape`].
    pub fn shape(self, layout: &Layout, shape: &[usize]) -> Vec<usize> {
        match self {
            At::Device(i) => crate::layout::local_shape(layout, shape, i),
            At::Stacked(_) => stack_shape(layout, shape),
        }
    }
    /// Per-shard slices, with a full slice over each leading mesh dim when stacked.
    pub fn slices(self, local: &[Slice]) -> Vec<Slice> {
        let mut s = vec![Slice::full(); self.off()];
        s.extend_from_slice(local);
        s
    }
    /// A per-shard permutation of the tensor dims, leaving the leading mesh dims in place.
    pub fn axes(self, axes: &[usize]) -> Vec<usize> {
        let k = self.off();
        (0..k).chain(axes.iter().map(|&a| a + k)).collect()
    }
}

/// Whether the layout uses mesh axis `a`: shards a dim with it or has a pending reduction on it.
pub fn uses_axis(layout: &Layout, a: usize) -> bool {
    layout.partial[a].is_some() || layout.dims.contains(&Some(a))
}

/// The stacked primitive's shape (see the module docs): per mesh axis the extent this process
/// holds ([`MeshTopology::local_axis_size`](crate::MeshTopology::local_axis_size): the axis size
/// in one process) where the layout uses it, else 1; then the per-shard shape (the layout must
/// split its sharded dims evenly).
pub fn stack_shape(layout: &Layout, shape: &[usize]) -> Vec<usize> {
    let k = layout.mesh.ndim();
    (0..k)
        .map(|a| stack_axis(layout, a))
        .chain(shard_dims(layout, shape))
        .collect()
}

/// Whether `got` is the [`stack_shape`] of global `shape` under `layout`, without building it:
/// [`output`] checks every stacked op's result so, and a plain pass over the mesh axes and the
/// tensor dims costs a fraction of collecting or chaining the dims (chaining them was about 1.5%
/// of the Flex model step in session 52's profile).
fn is_stack_shape(layout: &Layout, shape: &[usize], got: &[usize]) -> bool {
    let topo = &layout.mesh;
    let k = topo.ndim();
    if got.len() != k + shape.len() || layout.dims.len() != shape.len() {
        return false;
    }
    // One pass over the tensor dims (noting the first 64 axes that shard them), one over the
    // mesh axes (past 64, `uses_axis` as `stack_axis` asks it).
    let (mesh_dims, dims) = got.split_at(k);
    let mut sharding = 0u64;
    for ((s, &n), &g) in layout.dims.iter().zip(shape).zip(dims) {
        let want = match *s {
            None => n,
            Some(a) => {
                if a < 64 {
                    sharding |= 1 << a;
                }
                n / topo.axis_size(a)
            }
        };
        if g != want {
            return false;
        }
    }
    mesh_dims.iter().enumerate().all(|(a, &g)| {
        let used = if a < 64 {
            (sharding >> a) & 1 == 1 || layout.partial[a].is_some()
        } else {
            uses_axis(layout, a)
        };
        g == if used { topo.local_axis_size(a) } else { 1 }
    })
}

/// The stacked primitive's dim for mesh axis `a` ([`stack_shape`]).
fn stack_axis(layout: &Layout, a: usize) -> usize {
    if uses_axis(layout, a) {
        layout.mesh.local_axis_size(a)
    } else {
        1
    }
}

/// The per-shard dims of a tensor of global `shape` under `layout` ([`stack_shape`]'s trailing
/// dims; the layout splits its sharded dims evenly).
fn shard_dims<'a>(layout: &'a Layout, shape: &'a [usize]) -> impl Iterator<Item = usize> + 'a {
    let topo = &layout.mesh;
    layout
        .dims
        .iter()
        .zip(shape)
        .map(move |(s, &n)| s.map_or(n, |a| n / topo.axis_size(a)))
}

/// The memory order in which [`crate::api::distribute`] lays out a stacked input on Flex
/// ([`crate::inner::row_blocks_in_memory`]), where it differs from the stacked primitive's own: the mesh dims of `stack` (the
/// [`stack_shape`] of a tensor under `layout`) that hold more than one shard, reordered so that
/// the axis splitting tensor dim 0 (the rows: the batch) comes after the others; dims of size 1
/// and the per-shard dims keep their place. `Some(order)` lists the stacked dims in memory
/// order (a permutation of `0..stack.len()`); `None` when that is the stacked order itself.
///
/// The stack is then a permuted view of that buffer, each shard still one row-major block, and
/// the row blocks of each other position lie one after the other: the contraction over the
/// row axis ([`contract`], a weight gradient `x^T @ dy` over a sharded batch) merges them
/// without a copy. The spatial IMDB input `[64, 1200]` on `[batch, feature]` is stacked
/// `[2, 2, 1, 32, 600]` and laid out as `[2 (feature), 2 (batch), 1, 32, 600]`: its merge was
/// a 307 KB copy every step (1.5-1.9% of the Flex step, NOTES.md).
pub fn rows_inner_order(layout: &Layout, stack: &[usize]) -> Option<Vec<usize>> {
    let rows = layout.dims.first().copied().flatten()?;
    let k = layout.mesh.ndim();
    let big: Vec<usize> = (0..k).filter(|&a| stack[a] > 1).collect();
    let mut sorted = big.clone();
    sorted.sort_by_key(|&a| a == rows);
    if sorted == big {
        return None;
    }
    let mut order: Vec<usize> = (0..stack.len()).collect();
    for (&slot, &a) in big.iter().zip(&sorted) {
        order[slot] = a;
    }
    Some(order)
}

/// The stacked primitive of a tensor under a settled `layout` as a view of its global
/// row-major buffer, for a process holding the whole mesh: `(split, order)` with `split` the
/// global shape with every sharded dim split into `[axis size, per-shard size]` and a dim of 1
/// per unused mesh axis, and `order` the permutation of `split` that gives the [`stack_shape`]
/// `stack`. `permute(reshape(global, split), order)` is then the stack without a copy: the
/// shard at mesh coordinates `c` is the global box of `c`, as the stacked form requires.
/// ([`crate::api::distribute`] on Flex: the spatial IMDB input `[64, 1200]` on
/// `[batch, feature]` is `[2, 32, 2, 600]` permuted to `[2, 2, 1, 32, 600]`, where the copy of
/// its boxes was 3% of the step.)
pub fn global_split(layout: &Layout, stack: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let k = layout.mesh.ndim();
    let r = stack.len() - k;
    let mut split = Vec::with_capacity(k + r);
    let mut at = vec![0; k + r];
    for (a, slot) in at.iter_mut().enumerate().take(k) {
        if !layout.dims.contains(&Some(a)) {
            *slot = split.len();
            split.push(1);
        }
    }
    for d in 0..r {
        if let Some(a) = layout.dims[d] {
            at[a] = split.len();
            split.push(stack[a]);
        }
        at[k + d] = split.len();
        split.push(stack[k + d]);
    }
    (split, at)
}

/// Elements of the stacked primitive that one process holding the whole mesh would hold
/// ([`stack_shape`] with every used axis at its full size): what the decisions that must not
/// depend on the process count weigh (`ops::common::matmul`'s contraction), where
/// [`stack_shape`] gives this process's block.
pub fn whole_mesh_stack_elements(layout: &Layout, shape: &[usize]) -> usize {
    let topo = &layout.mesh;
    (0..topo.ndim())
        .filter(|&a| uses_axis(layout, a))
        .map(|a| topo.axis_size(a))
        .product::<usize>()
        * shard_elements(layout, shape)
}

/// Elements of one shard of a tensor of global `shape` under `layout` (even split).
pub fn shard_elements(layout: &Layout, shape: &[usize]) -> usize {
    shard_dims(layout, shape).product()
}

/// The highest rank of a stacked primitive (mesh axes + tensor rank): NdArray's limit.
pub const MAX_STACKED_RANK: usize = 6;

/// Whether a tensor of global `shape` under `layout` may be held stacked: the mesh runs stacked,
/// the stacked rank is at most [`MAX_STACKED_RANK`], every sharded dim splits evenly, no dim is
/// empty and no axis both shards a dim and has a pending reduction.
pub fn stackable(layout: &Layout, shape: &[usize]) -> bool {
    layout.mesh.stacked && stackable_shape(layout, shape)
}

/// [`stackable`] but for the mesh's own switch: whether a tensor of this shape and layout could
/// be held stacked were the whole mesh one process's virtual devices. A multi-process mesh uses
/// it to take the decisions one process would take (see `ops::common::matmul`).
pub fn stackable_shape(layout: &Layout, shape: &[usize]) -> bool {
    stackable_shard_elements(layout, shape).is_some()
}

/// [`stackable_shape`] with shards of fewer than `limit` elements ([`shard_elements`]): the
/// dispatcher asks it of every operand and output of every op (`ops::dispatch::stacks`), where
/// the two checks apart, each going over the dims and their mesh axes again, were about 7 µs of
/// the spatial IMDB step on Flex (NOTES.md).
pub fn stackable_below(layout: &Layout, shape: &[usize], limit: usize) -> bool {
    stackable_shard_elements(layout, shape).is_some_and(|e| e < limit)
}

/// [`shard_elements`] where the tensor may be held stacked ([`stackable_shape`]: the stacked
/// rank is at most [`MAX_STACKED_RANK`], every sharded dim splits evenly, no dim is empty, no
/// axis both shards a dim and has a pending reduction), else `None`; one pass over the dims.
fn stackable_shard_elements(layout: &Layout, shape: &[usize]) -> Option<usize> {
    let topo = &layout.mesh;
    if topo.ndim() + shape.len() > MAX_STACKED_RANK {
        return None;
    }
    let mut elements = 1usize;
    for (d, &n) in shape.iter().enumerate() {
        let per = match layout.dims.get(d).copied().flatten() {
            None => n,
            Some(a) => {
                let m = topo.axis_size(a);
                if n % m != 0 {
                    return None;
                }
                n / m
            }
        };
        if per == 0 {
            return None;
        }
        elements = elements.saturating_mul(per);
    }
    let pending_on_sharding = layout.is_partial()
        && layout
            .partial
            .iter()
            .enumerate()
            .any(|(a, p)| p.is_some() && layout.dims.contains(&Some(a)));
    (!pending_on_sharding).then_some(elements)
}

/// The global flat index of the device whose shard represents device `i`'s (both global flat
/// indices of positions this process holds): same coordinates on the axes the layout uses, this
/// process's first coordinate on the others (0 in one process).
pub(crate) fn representative(layout: &Layout, i: usize) -> usize {
    let topo = &layout.mesh;
    (0..topo.ndim())
        .filter(|&a| !uses_axis(layout, a))
        .fold(i, |i, a| {
            i + topo.local_origin(a) * topo.strides[a] - topo.coord(i, a) * topo.strides[a]
        })
}

/// Whether device `i` (a global flat index this process holds) holds a distinct shard under
/// `layout` (it is its own [`representative`]: this process's first coordinate on every axis the
/// layout does not use). The representatives in row-major order are the stacked primitive's
/// shards, in its order; in one process one per chunk of the global tensor.
fn is_representative(layout: &Layout, i: usize) -> bool {
    representative(layout, i) == i
}

/// This process's positions that hold distinct shards under `layout` ([`is_representative`]),
/// as `(local index, global flat index)` pairs in row-major order: the members of the stacked
/// primitive, in its order.
pub(crate) fn local_representatives(layout: &Layout) -> impl Iterator<Item = (usize, usize)> + '_ {
    (0..layout.mesh.local_size())
        .map(|j| (j, layout.mesh.global(j)))
        .filter(|&(_, i)| is_representative(layout, i))
}

/// Puts a per-device tensor in stacked form (a no-op when it already is): the representative
/// shards (one per index of the used axes, row-major) are concatenated along a new leading dim,
/// one inner `cat` (a single reshape when the tensor is replicated).
///
/// The caller checks [`stackable`].
pub fn to_stacked<B: Backend, K: Kind<B>>(t: DTensor<K::P>) -> DTensor<K::P> {
    if t.is_stacked() {
        return t;
    }
    debug_assert!(
        stackable(&t.layout, &t.shape),
        "stacking {} of shape {:?}",
        t.layout,
        t.shape
    );
    let target = stack_shape(&t.layout, &t.shape);
    let per = t.per_device();
    let reps: Vec<K::P> = local_representatives(&t.layout)
        .map(|(j, _)| per[j].clone())
        .collect();
    let stack = if reps.len() == 1 {
        K::reshape(reps.into_iter().next().expect("one shard"), target.into())
    } else {
        let parts = reps
            .into_iter()
            .map(|p| {
                let mut s = vec![1];
                s.extend(p.shape().iter());
                K::reshape(p, s.into())
            })
            .collect();
        K::reshape(K::cat(parts, 0), target.into())
    };
    // The same logical tensor: it shares the memoised reduction of a partial value.
    t.with_shards(Shards::Stacked(stack))
}

/// Puts a stacked tensor in per-device form (a no-op when it already is): one slice of the
/// stack per representative device (a view on CPU backends), shared by its replicas.
pub fn to_per_device<B: Backend, K: Kind<B>>(t: DTensor<K::P>) -> DTensor<K::P> {
    if !t.is_stacked() {
        return t;
    }
    let stack = t.shards()[0].clone();
    let (shape, layout) = (&t.shape, &t.layout);
    let topo = layout.mesh.clone();
    let k = topo.ndim();
    let n = topo.local_size();
    let mut out: Vec<K::P> = Vec::with_capacity(n);
    for j in 0..n {
        let i = topo.global(j);
        let rep = representative(layout, i);
        if rep != i {
            let p = out[topo.local_index(rep)].clone();
            out.push(p);
            continue;
        }
        let local = crate::layout::local_shape(layout, shape, i);
        let sliced = if (0..k).any(|a| uses_axis(layout, a)) {
            let mut slices: Vec<Slice> = (0..k)
                .map(|a| {
                    let c = if uses_axis(layout, a) {
                        topo.coord(i, a) - topo.local_origin(a)
                    } else {
                        0
                    };
                    Slice::new(c as isize, Some(c as isize + 1), 1)
                })
                .collect();
            slices.extend(std::iter::repeat_n(Slice::full(), local.len()));
            K::slice(stack.clone(), &slices)
        } else {
            stack.clone()
        };
        out.push(K::reshape(sliced, Shape::from(local)));
    }
    t.with_shards(Shards::PerDevice(out))
}

/// A stacked op's result as a tensor of global `shape` under `layout`.
///
/// # Panics
/// When the inner op did not produce the [`stack_shape`] (a sharding rule without a stacked
/// form routed here: an internal bug, reported rather than returned as wrong numbers).
pub fn output<P: TensorMetadata + 'static>(
    shape: Vec<usize>,
    layout: impl Into<std::sync::Arc<Layout>>,
    stack: P,
) -> DTensor<P> {
    let layout = layout.into();
    assert!(
        crate::inner::with_dims(&stack, |got| is_stack_shape(&layout, &shape, got)),
        "burn-dtensor: stacked op produced {:?}, expected {:?} for global {shape:?} under {layout} (please report)",
        stack.shape().to_vec(),
        stack_shape(&layout, &shape)
    );
    DTensor::from_stacked(shape, layout, stack)
}

/// A matmul of stacked operands `[s.., m, k] @ [t.., k, n]` (`ks` leading mesh dims, tensor
/// rank 2). The mesh axes that only the lhs uses (a batch axis: `s_a > 1 = t_a`) index row
/// blocks of one product with the same rhs, so they fold into the lhs' rows: a data-parallel
/// forward (`t` all ones) becomes a single `[S*m, k] @ [k, n]` GEMM, as on one device, instead
/// of `S` small ones, and a model-parallel one (batch axis on the lhs, model axis on the rhs)
/// one GEMM per rhs shard instead of one per (batch, model) pair, each packing its rhs once.
/// The fold is a free reshape when those axes come after the axes both operands use (data and
/// model mode); before one (spatial mode's batch axis before its feature axis), only on
/// backends that [`prefer_dense`], as a strided view where the lhs' memory allows. The result
/// is unfolded back, with a permuted view when the rhs uses axes of its own (not on backends that [`prefer_dense`], where strided operands are
/// slow: there the rhs' own axes fold into the columns instead, [`side_by_side`]). Otherwise,
/// and for axes both use (one partial product per shard: a weight gradient over a sharded
/// batch), it is the inner batched matmul `f`, which broadcasts the mesh dims.
pub fn matmul<B: Backend, K: Kind<B>>(
    x: K::P,
    y: K::P,
    ks: usize,
    f: impl Fn(K::P, K::P) -> K::P,
) -> K::P {
    matmul_out::<B, K>(x, y, ks, false, f)
}

/// [`matmul`]; with `side_by_side_out`, a product whose rhs shards run side by side
/// ([`side_by_side`]) returns its output as it lies (a permuted view of `[.., m, R*n]`), not
/// copied into the stack's order.
fn matmul_out<B: Backend, K: Kind<B>>(
    x: K::P,
    y: K::P,
    ks: usize,
    side_by_side_out: bool,
    f: impl Fn(K::P, K::P) -> K::P,
) -> K::P {
    let (xs, ys) = (x.shape().to_vec(), y.shape().to_vec());
    if xs.len() != ks + 2 {
        return f(x, y);
    }
    let rhs_only: Vec<usize> = (0..ks).filter(|&a| xs[a] == 1 && ys[a] > 1).collect();
    if !rhs_only.is_empty() && prefer_dense::<B>() {
        return side_by_side::<B, K>(x, y, ks, &rhs_only, side_by_side_out, f);
    }
    let lhs_only: Vec<usize> = (0..ks).filter(|&a| xs[a] > 1 && ys[a] == 1).collect();
    if lhs_only.is_empty() {
        return f(x, y);
    }
    let both_last = (0..ks).filter(|&a| xs[a] > 1 && ys[a] > 1).max();
    let (m, kk, n) = (xs[ks], xs[ks + 1], ys[ks + 1]);
    let rest: Vec<usize> = (0..ks).filter(|a| !lhs_only.contains(a)).collect();
    let folded: usize = lhs_only.iter().map(|&a| xs[a]).product();
    let lhs_shape: Vec<usize> = rest
        .iter()
        .map(|&a| xs[a])
        .chain([folded * m, kk])
        .collect();
    // An lhs-only axis before an axis both use (spatial's batch before its feature axis:
    // `[2, 2, 1, 32, 600] @ [1, 2, 1, 600, 48]`) folds only where the lhs' rows of one
    // both-axis index lie adjacent in memory, as `distribute` lays out a batch-sharded input
    // ([`rows_inner_order`]): then they are one strided view, `[2, 1, 64, 600]`, and the GEMM
    // runs the single device's row count (4 products of 32 rows ran the `gemm` crate's
    // 2-column remainder tiles on their 32 columns of `x^T`). A permuted lhs (`x^T` rows
    // received by an all-to-all, `[4, 150, 64]` viewed from `[4, 64, 150]`) would be copied by
    // the fold's reshape, so it folds as a strided view too where its memory allows (the
    // spatial weight gradient's `x^T` from an input kept as a view of its global buffer:
    // `[2, 600, 64]` is the global `[1200, 64]`, one product as on one device). Both only on
    // backends that [`prefer_dense`]; elsewhere, and where no view exists, the products run
    // as the lhs lies.
    let reorder = both_last.is_some_and(|b| b > lhs_only[0]);
    let x = if reorder || crate::inner::row_major_order(&x).is_some() {
        if !prefer_dense::<B>() {
            return f(x, y);
        }
        let view = if reorder {
            let order: Vec<usize> = rest
                .iter()
                .chain(&lhs_only)
                .copied()
                .chain([ks, ks + 1])
                .collect();
            crate::inner::strided_reshape_view(&K::permute(x.clone(), &order), &lhs_shape)
        } else {
            crate::inner::strided_reshape_view(&x, &lhs_shape)
        };
        match view {
            Some(v) => v,
            None => return f(x, y),
        }
    } else {
        K::reshape(x, Shape::from(lhs_shape))
    };
    let rhs_shape: Vec<usize> = rest.iter().map(|&a| ys[a]).chain([kk, n]).collect();
    let out = f(x, K::reshape(y, Shape::from(rhs_shape)));
    // [rest.., L*m, n] -> [rest.., L.., m, n] -> mesh order.
    let split: Vec<usize> = rest
        .iter()
        .map(|&a| xs[a].max(ys[a]))
        .chain(lhs_only.iter().map(|&a| xs[a]))
        .chain([m, n])
        .collect();
    let listed: Vec<usize> = rest.iter().chain(&lhs_only).copied().collect();
    let order: Vec<usize> = (0..ks)
        .map(|a| {
            listed
                .iter()
                .position(|&b| b == a)
                .expect("every axis listed")
        })
        .chain([ks, ks + 1])
        .collect();
    crate::collective::stacked::permute::<B, K>(K::reshape(out, Shape::from(split)), &order)
}

/// [`matmul`] with the mesh axes `rhs_only` (those only the rhs uses: a model axis, one weight
/// shard per index, every shard multiplying the same lhs rows) folded into the columns: the rhs
/// shards laid side by side (`[.., R.., k, n] -> [.., k, R*n]`, one copy by contiguous runs of
/// `n`), one product with the whole width, and the output's columns split back into the axes
/// (`[.., m, R*n] -> [.., R.., m, n]`, a copy by runs of `n` again). This is the single
/// device's GEMM: the IMDB model step's `[64, 1200] @ [1200, 48]` instead of eight (or two)
/// products of width 24, which the `gemm` crate computes with half-empty 16-row tiles
/// (`x1x6` kernels: `[16, 1200] @ [1200, 24]` x 8 took 87 µs against 75 µs side by side,
/// copies included, and 69 µs for the single device's product; NOTES.md, session 62).
/// Every output element is the same dot product over `k`, in the same order (`gemm` blocks
/// `k` by the cache sizes and kernel, never by `m` or `n`). Only for backends that
/// [`prefer_dense`] (Flex), where it was measured: on NdArray the products keep their fold
/// into rows with a permuted output, and CubeCL backends pick their tiles per shape.
///
/// The rhs copy is skipped where the rhs already lies side by side (a permuted view of
/// `[.., k, R.., n]`: `collective::stacked::permute` returns the view). With `view_out` (a
/// weight gradient, [`contract`]) the output is returned as it lies too, a permuted view of
/// `[.., m, R*n]`, so that the weight updated with it is stored side by side and no 57,600-float
/// copy is left in the IMDB model step (both copies took back most of what the wider GEMM
/// saves, NOTES.md sessions 62-63).
fn side_by_side<B: Backend, K: Kind<B>>(
    x: K::P,
    y: K::P,
    ks: usize,
    rhs_only: &[usize],
    view_out: bool,
    f: impl Fn(K::P, K::P) -> K::P,
) -> K::P {
    let ys = y.shape().to_vec();
    let (k, n) = (ys[ks], ys[ks + 1]);
    let rest: Vec<usize> = (0..ks).filter(|a| !rhs_only.contains(a)).collect();
    let wide: usize = rhs_only.iter().map(|&a| ys[a]).product();
    // [rest.., k, R.., n], then [mesh dims with 1 at the rhs-only axes, k, R*n].
    let order: Vec<usize> = rest
        .iter()
        .copied()
        .chain([ks])
        .chain(rhs_only.iter().copied())
        .chain([ks + 1])
        .collect();
    let mut flat: Vec<usize> = (0..ks)
        .map(|a| if rhs_only.contains(&a) { 1 } else { ys[a] })
        .collect();
    flat.extend([k, wide * n]);
    let y = K::reshape(
        crate::collective::stacked::permute::<B, K>(y, &order),
        Shape::from(flat),
    );
    // No axis is the rhs' own now: the lhs-only axes fold into the rows as usual.
    let out = matmul::<B, K>(x, y, ks, f);
    let os = out.shape().to_vec();
    // [rest.., m, R.., n] -> mesh order, then [m, n].
    let split: Vec<usize> = rest
        .iter()
        .map(|&a| os[a])
        .chain([os[ks]])
        .chain(rhs_only.iter().map(|&a| ys[a]))
        .chain([n])
        .collect();
    let nr = rest.len();
    let back: Vec<usize> = (0..ks)
        .map(|a| match rhs_only.iter().position(|&b| b == a) {
            Some(j) => nr + 1 + j,
            None => rest
                .iter()
                .position(|&b| b == a)
                .expect("every axis listed"),
        })
        .chain([nr, nr + 1 + rhs_only.len()])
        .collect();
    let out = K::reshape(out, Shape::from(split));
    if view_out {
        K::permute(out, &back)
    } else {
        crate::collective::stacked::permute::<B, K>(out, &back)
    }
}

/// The sum over mesh axes `axes` of the stacked matmul `[s.., b.., m, k] @ [t.., b.., k, n]`
/// (`ks` leading mesh dims, both operands using every axis of `axes`): the all-reduced value of
/// the per-shard partial products, as one matmul over the whole contracting dim. Each operand's
/// `axes` dims move next to its contracting dim and merge with it (the same order on both
/// sides), leaving size 1 on those mesh dims: the stacked primitive of the output layout without
/// its pending reductions.
///
/// The lhs merges as `[P, k, m] -> [P*k, m]` and is then transposed back (a view): its usual
/// source is a weight gradient's `x^T`, a transposed view of the contiguous `x`, so the merge
/// runs on contiguous data (free on backends whose reshape is a view) and the matmul takes the
/// transposed operand as it takes `x^T` on one device. The rhs merges as `[P, k, n] -> [P*k, n]`.
pub fn contract<B: Backend, K: Kind<B>>(
    x: K::P,
    y: K::P,
    ks: usize,
    axes: &[usize],
    f: impl Fn(K::P, K::P) -> K::P,
) -> K::P {
    use crate::collective::stacked::permute_for_merge;
    let (xs, ys) = (x.shape().to_vec(), y.shape().to_vec());
    let r = xs.len();
    let p: usize = axes.iter().map(|&a| xs[a]).product();
    debug_assert!(
        axes.iter().all(|&a| xs[a] == ys[a]),
        "contracting over {axes:?}: {xs:?} @ {ys:?}"
    );
    let others = (0..ks).filter(|a| !axes.contains(a));
    // The shape after the merge: the `axes` dims 1, then the last two dims `(a, b)` with `P` folded
    // into `a`.
    let merged = |s: &[usize], a: usize, b: usize| -> Vec<usize> {
        let mut out: Vec<usize> = (0..r - 2)
            .map(|d| if axes.contains(&d) { 1 } else { s[d] })
            .collect();
        out.extend([p * s[a], s[b]]);
        out
    };
    // Both as [others.., b.., axes.., k, c] (the lhs transposed first), merged into [.., P*k, c].
    let order: Vec<usize> = others
        .chain(ks..r - 2)
        .chain(axes.iter().copied())
        .chain([r - 2, r - 1])
        .collect();
    let merge = |t: K::P| -> K::P {
        let ts = t.shape().to_vec();
        // Already in the merged order in memory (an input laid out by `rows_inner_order`): a
        // view, where the backend's reshape of the row-major permute is one.
        if let Some(q) = crate::inner::row_major_order(&t)
            && crate::collective::stacked::same_order_of_big_dims(&ts, &q, &order)
        {
            return K::reshape(K::permute(t, &q), Shape::from(merged(&ts, r - 2, r - 1)));
        }
        if prefer_dense::<B>() && !crate::collective::stacked::only_unit_dims_move(&ts, &order) {
            // A strided view that merges without a copy (the input kept as a view of the
            // global buffer by `distribute`, its batch rows one stride apart): the GEMM reads
            // it as it lies.
            let shape = merged(&ts, r - 2, r - 1);
            if crate::inner::host_bytes(&t).is_none()
                && let Some(v) =
                    crate::inner::strided_reshape_view(&K::permute(t.clone(), &order), &shape)
            {
                return v;
            }
            // One copy by contiguous runs on the host where `t` is a row-major host tensor
            // (the spatial weight gradient's input, 32 x 600 runs); else slices at each index
            // of the axes, concatenated along the contracting dim. Flex would otherwise copy a
            // permuted view through its scalar strided iterator (340 µs against 60), and its
            // `cat` copies each slice of a larger buffer twice (`to_contiguous`, then the cat).
            match crate::collective::stacked::dense_permute::<B, K>(&t, &order) {
                Some(p) => K::reshape(p, Shape::from(merged(&ts, r - 2, r - 1))),
                None => cat_over::<B, K>(t, axes, r - 2),
            }
        } else {
            // A real permute is copied by runs here too (NdArray's reshape of the permuted
            // view would copy it element by element: 4% of the spatial IMDB step).
            K::reshape(
                permute_for_merge::<B, K>(t, &order),
                Shape::from(merged(&ts, r - 2, r - 1)),
            )
        }
    };
    let swap: Vec<usize> = (0..r - 2).chain([r - 1, r - 2]).collect();
    let x = K::permute(merge(K::permute(x, &swap)), &swap);
    let y = merge(y);
    // Folding lhs-only axes into rows would leave a permuted output when the rhs has axes of its
    // own; the batched matmul gives it contiguous (it is a weight gradient the update reads).
    // Backends that prefer dense operands lay the rhs' own axes side by side instead
    // ([`side_by_side`]) and keep the output as the product wrote it, the shards side by side:
    // the update `w - lr * g` then runs on it in that order and leaves the weight so, and the
    // next forward reads it without a copy.
    if (0..ks).any(|a| x.shape()[a] == 1 && y.shape()[a] > 1) && !prefer_dense::<B>() {
        f(x, y)
    } else {
        matmul_out::<B, K>(x, y, ks, true, f)
    }
}

/// `x` sliced at every index of the mesh dims `axes` (row-major), the slices concatenated along
/// `dim`: the axes' dims become 1 and `dim` grows by their product, index-major.
fn cat_over<B: Backend, K: Kind<B>>(x: K::P, axes: &[usize], dim: usize) -> K::P {
    let xs = x.shape().to_vec();
    let count: usize = axes.iter().map(|&a| xs[a]).product();
    let parts = (0..count)
        .map(|mut c| {
            let mut s = vec![Slice::full(); xs.len()];
            for &a in axes.iter().rev() {
                let i = c % xs[a];
                c /= xs[a];
                s[a] = Slice::new(i as isize, Some(i as isize + 1), 1);
            }
            K::slice(x.clone(), &s)
        })
        .collect();
    K::cat(parts, dim)
}

/// Whether a stacked matmul with a contracting dim sharded over mesh axes is better settled by
/// [`contract`] than by its per-shard partial products: when those products (`partial`
/// elements, the stacked output) outnumber the operands' elements, which `contract` may have to
/// copy to merge the axes into the contracting dim.
///
/// Measured on the IMDB step (NOTES.md): a data-parallel weight gradient (`8 x [1200, 48]`
/// products from `[64, 1200]` and `[64, 48]`, ratio 5.8) and the spatial one (`[2, 2, 2, 600,
/// 24]` products, ratio 1.4) contract; a forward matmul with the features sharded (`[2, 2, 2,
/// 32, 24]` products from a `[64, 1200]` input) keeps its partial products.
pub fn contracts(partial: usize, lhs: usize, rhs: usize) -> bool {
    partial > lhs + rhs
}

/// The shapes of the operands of an op along one dim (gather, scatter: every operand has the
/// same size as the first outside `dim`) folded around it: the dims before `dim` merged into one,
/// the dims after it into another, groups of size 1 dropped. Returns the folded shapes and the
/// position of `dim` among them; `None` when the operands differ outside `dim` or nothing folds.
///
/// Stacked operands add leading mesh dims (`[2, 4, 8, 2]` for a `[64, 2]` tensor sharded over
/// two axes): folded, a gather along the last dim is `[64, 2]` again, the single device's rank-2
/// op. Flex's gather above rank 2 runs on rayon whatever its size, and waking the pool for the
/// IMDB loss's 64 elements was 11% of the data-parallel step on Flex (NOTES.md, session 34).
/// The fold only renames positions, so the result is the unfolded op's, bitwise.
pub fn fold_along(shapes: &[&[usize]], dim: usize) -> Option<(Vec<Vec<usize>>, usize)> {
    let first = shapes[0];
    let agree = shapes
        .iter()
        .all(|s| s.len() == first.len() && (0..first.len()).all(|d| d == dim || s[d] == first[d]));
    if !agree {
        return None;
    }
    let outer: usize = first[..dim].iter().product();
    let inner: usize = first[dim + 1..].iter().product();
    let rank = usize::from(outer != 1) + 1 + usize::from(inner != 1);
    if rank >= first.len() {
        return None;
    }
    let folded = shapes
        .iter()
        .map(|s| {
            let mut f = Vec::with_capacity(rank);
            if outer != 1 {
                f.push(outer);
            }
            f.push(s[dim]);
            if inner != 1 {
                f.push(inner);
            }
            f
        })
        .collect();
    Some((folded, usize::from(outer != 1)))
}

/// The shapes of element-wise operands (equal ranks, broadcasting) with adjacent dims merged
/// where every operand holds them alike (all whole or all broadcast), and dims of output size 1
/// dropped; `None` when nothing merges. Stacked operands add leading mesh dims that a data
/// layout typically holds whole (`[8, 8, 48] + [1, 1, 48]`): merged, the inner op sees the
/// single-device shapes (`[64, 48] + [1, 48]`) and takes the backend's fast low-rank path
/// (Flex's broadcasting iterator above rank 2 cost 15% of a data-parallel step).
pub fn coalesce(shapes: &[&[usize]]) -> Option<Vec<Vec<usize>>> {
    let rank = shapes[0].len();
    let out = broadcast_shape(shapes);
    let dims: Vec<usize> = (0..rank).filter(|&d| out[d] != 1).collect();
    let whole = |s: &[usize], d: usize| s[d] == out[d];
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for &d in &dims {
        match groups.last_mut() {
            Some(g) if shapes.iter().all(|s| whole(s, g[0]) == whole(s, d)) => g.push(d),
            _ => groups.push(vec![d]),
        }
    }
    if groups.len() == rank {
        return None;
    }
    if groups.is_empty() {
        return Some(shapes.iter().map(|_| vec![1]).collect());
    }
    Some(
        shapes
            .iter()
            .map(|s| {
                groups
                    .iter()
                    .map(|g| g.iter().map(|&d| s[d]).product())
                    .collect()
            })
            .collect(),
    )
}

/// How one element-wise operand in stacked form reaches the inner op ([`elementwise_plan`],
/// [`prepare`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operand {
    /// `(dim, times)`: `repeat_dim`s on the stacked shape, before the reshape.
    pub repeat: Vec<(usize, usize)>,
    /// The merged shape the operand is reshaped to.
    pub shape: Vec<usize>,
    /// Whether, after the reshape, every dim where it is 1 and the output is not is repeated.
    pub dense: bool,
}

/// [`elementwise_plan`] for operands of stacked shapes `shapes` on inner backend `B`, with the
/// broadcast (unmerged) output shape, memoised per thread ([`crate::memo`]).
pub struct Elementwise {
    /// Each operand's plan, in argument order.
    pub operands: Vec<Operand>,
    /// The merged output shape the inner op computes.
    pub merged: Vec<usize>,
    /// The stacked output shape (the broadcast of `shapes`), which the result is reshaped to.
    pub out: Vec<usize>,
}

/// [`Elementwise`] for `shapes`, computed once per thread for each list of shapes and each
/// kind of inner backend (the plan depends on [`reshape_copies`] and [`prefer_dense`] only).
pub fn elementwise_memo<B>(shapes: &[&[usize]]) -> std::rc::Rc<Elementwise> {
    thread_local!(static MEMO: crate::memo::Memo<Elementwise> = Default::default());
    let mut key = crate::memo::Key::new();
    key.push(reshape_copies::<B>() as usize);
    key.push(prefer_dense::<B>() as usize);
    for s in shapes {
        crate::memo::push_list(&mut key, s);
    }
    crate::memo::get_or(&MEMO, key, || {
        let (operands, merged) = elementwise_plan::<B>(shapes);
        Elementwise {
            operands,
            merged,
            out: broadcast_shape(shapes),
        }
    })
}

/// Element-wise operands in stacked form, reshaped for the inner op: adjacent dims merged
/// ([`coalesce`]). On backends that [`prefer_dense`] (Flex, whose broadcasting iterator above
/// rank 2 is scalar), an operand that broadcasts while the merged rank is above 2 is
/// materialised: first by the fewest repeats that let the operands merge to rank 2 or less
/// (a model-parallel bias `[1, 2, 1, 24]` against `[4, 2, 16, 24]` repeats its third dim, 16
/// times its 48 elements, and the pair merges to `[1, 768]` against `[4, 768]`, Flex's shared-row
/// fast path), else to the full merged shape (one `repeat_dim` per broadcast dim). Returns each
/// operand's plan and the merged output shape.
pub fn elementwise_plan<B>(shapes: &[&[usize]]) -> (Vec<Operand>, Vec<usize>) {
    let merge = |shapes: &[&[usize]]| -> Vec<Vec<usize>> {
        if reshape_copies::<B>() {
            None
        } else {
            coalesce(shapes)
        }
        .unwrap_or_else(|| shapes.iter().map(|s| s.to_vec()).collect())
    };
    // Each operand's plan, from its repeats and merged shape; `dense` marks the operands that
    // still broadcast against `out` above rank 2 for the full repeat.
    let plan = |repeats: Vec<Vec<(usize, usize)>>,
                merged: Vec<Vec<usize>>,
                out: Vec<usize>,
                dense: bool| {
        let ops = repeats
            .into_iter()
            .zip(merged)
            .map(|(repeat, shape)| Operand {
                dense: dense && out.len() > 2 && shape != out,
                repeat,
                shape,
            })
            .collect();
        (ops, out)
    };
    let out_of = |m: &[Vec<usize>]| {
        let refs: Vec<&[usize]> = m.iter().map(|s| &s[..]).collect();
        broadcast_shape(&refs)
    };
    let none = || vec![Vec::new(); shapes.len()];
    if prefer_dense::<B>() && flex_fast_path(shapes) {
        let unmerged = shapes.iter().map(|s| s.to_vec()).collect();
        return plan(none(), unmerged, broadcast_shape(shapes), false);
    }
    let merged = merge(shapes);
    let merged_out = out_of(&merged);
    if !prefer_dense::<B>() || merged_out.len() <= 2 || merged.iter().all(|s| s == &merged_out) {
        return plan(none(), merged, merged_out, false);
    }
    let out = broadcast_shape(shapes);
    let repeats: Vec<Vec<(usize, usize)>> =
        shapes.iter().map(|s| fewest_repeats(s, &out)).collect();
    let repeated: Vec<Vec<usize>> = shapes
        .iter()
        .zip(&repeats)
        .map(|(s, r)| {
            let mut s = s.to_vec();
            for &(d, _) in r {
                s[d] = out[d];
            }
            s
        })
        .collect();
    let refs: Vec<&[usize]> = repeated.iter().map(|s| &s[..]).collect();
    let remerged = merge(&refs);
    let remerged_out = out_of(&remerged);
    if remerged_out.len() <= 2 {
        plan(repeats, remerged, remerged_out, false)
    } else {
        plan(none(), merged, merged_out, true)
    }
}

/// Whether Flex runs the binary op on the stacked `shapes` (equal ranks) at its fast path as
/// they are, so that merging their dims ([`coalesce`]) would only cost reshapes (an allocation
/// each, three per op, about 170 a data-parallel IMDB step): both operands of the output's shape
/// (Flex's same-shape paths, any rank), or the first of it and the second either a shared row
/// (`[1, .., 1, n]`: `[8, 8, 48] + [1, 1, 48]`) or a per-row scalar (the output's leading dims,
/// then 1s: `[8, 8, 48] - [8, 8, 1]`), the two broadcasts Flex 0.21's `detect_broadcast_pattern`
/// takes at any rank when the full operand comes first. Any other broadcast, and ops of three
/// operands (`mask_where`), merge as before.
fn flex_fast_path(shapes: &[&[usize]]) -> bool {
    let [lhs, rhs] = shapes else {
        return false;
    };
    let out = broadcast_shape(shapes);
    let r = out.len();
    let row = r > 0 && rhs[r - 1] == out[r - 1] && rhs[..r - 1].iter().all(|&d| d == 1);
    let scalar = (0..=r).any(|j| rhs[..j] == out[..j] && rhs[j..].iter().all(|&d| d == 1));
    *lhs == out && (*rhs == out || row || scalar)
}

/// The repeats that leave operand `s` broadcasting against `out` only on leading dims (then
/// whole: `[1, 1, F, F]`, a shared row) or only on trailing dims (`[F, F, 1, 1]`, a scalar per
/// row), whichever materialises fewer elements; dims of output size 1 count as neither.
fn fewest_repeats(s: &[usize], out: &[usize]) -> Vec<(usize, usize)> {
    let broadcast = |d: usize| s[d] == 1 && out[d] > 1;
    let whole = |d: usize| s[d] == out[d] && out[d] > 1;
    let dims = 0..s.len();
    let first_whole = dims.clone().find(|&d| whole(d));
    let last_whole = dims.clone().rev().find(|&d| whole(d));
    let (Some(first), Some(last)) = (first_whole, last_whole) else {
        return Vec::new(); // all broadcast (or scalar-like): both forms already
    };
    let leading: Vec<usize> = (first..s.len()).filter(|&d| broadcast(d)).collect();
    let trailing: Vec<usize> = (0..last).filter(|&d| broadcast(d)).collect();
    let size = |r: &[usize]| -> usize {
        dims.clone()
            .map(|d| if r.contains(&d) { out[d] } else { s[d] })
            .product()
    };
    let pick = if size(&leading) <= size(&trailing) {
        leading
    } else {
        trailing
    };
    pick.into_iter().map(|d| (d, out[d])).collect()
}

/// `x` repeated as `op.repeat` says, reshaped to `op.shape`, then repeated along each dim where
/// it is 1 and `out` is not, when `op.dense` ([`elementwise_plan`]).
pub fn prepare<B: Backend, K: Kind<B>>(mut x: K::P, op: &Operand, out: &[usize]) -> K::P {
    for &(d, times) in &op.repeat {
        x = K::repeat_dim(x, d, times);
    }
    let mut x = if crate::inner::with_dims(&x, |d| d == &op.shape[..]) {
        x
    } else {
        K::reshape(x, Shape::from(op.shape.clone()))
    };
    if op.dense {
        for (d, (&a, &b)) in op.shape.iter().zip(out).enumerate() {
            if a == 1 && b > 1 {
                x = K::repeat_dim(x, d, b);
            }
        }
    }
    x
}

#[cfg(test)]
mod tests {
    use super::fold_along;

    /// On Flex, a binary op whose operands Flex takes at its fast path as they lie (same shapes,
    /// a shared row, a per-row scalar, the full operand first) runs unmerged, with no reshape;
    /// a model-parallel bias still gets its repeat, and the same shapes still merge on every
    /// other backend (no `prefer_dense`: NdArray, the CubeCL ones).
    #[cfg(feature = "flex")]
    #[test]
    fn flex_binary_ops_at_their_fast_path_run_unmerged() {
        use super::elementwise_plan;
        type F = burn_flex::Flex;
        let unmerged = |shapes: &[&[usize]]| {
            let (ops, out) = elementwise_plan::<F>(shapes);
            ops.iter()
                .zip(shapes)
                .all(|(o, s)| o.repeat.is_empty() && !o.dense && o.shape == *s)
                && out == crate::rules::pointwise::broadcast_shape(shapes)
        };
        assert!(unmerged(&[&[8, 8, 48], &[8, 8, 48]]));
        assert!(unmerged(&[&[8, 8, 48], &[1, 1, 48]]));
        assert!(unmerged(&[&[8, 8, 48], &[8, 8, 1]]));
        assert!(unmerged(&[&[8, 8, 48], &[8, 1, 1]]));
        // The broadcast operand first, a broadcast in the middle, three operands: merged.
        assert!(!unmerged(&[&[1, 1, 48], &[8, 8, 48]]));
        assert!(!unmerged(&[&[8, 8, 48], &[8, 1, 48]]));
        assert!(!unmerged(&[&[8, 8, 48], &[8, 8, 48], &[8, 8, 48]]));
        // A model-parallel bias against `[batch, model]` activations: repeated, then merged.
        let (ops, out) = elementwise_plan::<F>(&[&[4, 2, 16, 24], &[1, 2, 1, 24]]);
        assert_eq!(ops[1].repeat, vec![(2, 16)]);
        assert_eq!(out, vec![4, 768]);
        // On a backend other than Flex (`Other` stands for NdArray and the CubeCL ones): merged.
        struct Other;
        let (_, out) = elementwise_plan::<Other>(&[&[8, 8, 48], &[8, 8, 48]]);
        assert_eq!(out, vec![3072]);
    }

    /// Flex: a batch axis before an axis both operands use (spatial's forward, `[2 batch,
    /// 2 feature, 1, 32, 600] @ [1, 2, 1, 600, 48]`, the lhs laid out feature-major as
    /// `distribute` lays out the input) folds its rows into one strided view per feature shard,
    /// and the product is bitwise Flex's own batched matmul of the same operands; an lhs
    /// whose batch rows are not adjacent in memory (row-major in the stack's order) runs the
    /// batched matmul as before, with the same values.
    #[cfg(feature = "flex")]
    #[test]
    fn lhs_only_axis_before_a_shared_axis_folds_into_the_rows() {
        use crate::tensor::FloatKind;
        use burn::backend::Flex;
        use burn::tensor::{Distribution, Tensor, TensorPrimitive};
        type B = Flex;
        let d = Default::default();
        let prim = |t: Tensor<B, 5>| t.into_primitive().tensor();
        let y = Tensor::<B, 5>::random([1, 2, 1, 600, 48], Distribution::Default, &d);
        let memory = Tensor::<B, 5>::random([2, 2, 1, 32, 600], Distribution::Default, &d);
        for x in [memory.clone().permute([1, 0, 2, 3, 4]), memory] {
            let want = x.clone().matmul(y.clone());
            let got = super::matmul::<B, FloatKind>(prim(x), prim(y.clone()), 3, |a, b| {
                crate::inner::matmul_strided(&a, &b).expect("a product Flex takes")
            });
            let got = Tensor::<B, 5>::from_primitive(TensorPrimitive::Float(got));
            assert_eq!(got.dims(), [2, 2, 1, 32, 48]);
            assert_eq!(got.into_data(), want.into_data());
        }
    }

    /// The one-pass check is `stackable_shape` and the shard-size bar together, on every
    /// layout of a rank-2 tensor over a 3-axis mesh (sharded, uneven, partial, partial on a
    /// sharding axis), shapes with a 0 and too high a rank, at limits on each side of the shard.
    #[test]
    fn one_pass_stack_check_is_the_two_checks() {
        use super::{shard_elements, stackable_below, stackable_shape};
        use crate::{Layout, Mesh, ReduceOp};
        let m = Mesh::new([("a", 2), ("b", 2), ("c", 2)], vec![(); 8]).unwrap();
        let names = ["unsharded", "a", "b", "c"];
        let mut layouts = Vec::new();
        for x in names {
            for y in names {
                if x == y && x != "unsharded" {
                    continue;
                }
                let l = Layout::new(&m, [x, y]).unwrap();
                layouts.push(l.clone());
                for (a, op) in [(0, ReduceOp::Sum), (2, ReduceOp::Max)] {
                    // Set directly: `with_partial` refuses an axis that shards a dim.
                    let mut p = l.clone();
                    p.partial[a] = Some(op);
                    layouts.push(p);
                }
            }
        }
        let mut seen = [0usize; 2];
        for l in &layouts {
            for shape in [[4, 6], [3, 6], [4, 0], [8, 2], [2, 2]] {
                let elements = stackable_shape(l, &shape).then(|| shard_elements(l, &shape));
                for limit in [0, 1, 4, 6, 12, usize::MAX] {
                    let want = elements.is_some_and(|e| e < limit);
                    assert_eq!(
                        stackable_below(l, &shape, limit),
                        want,
                        "{l} {shape:?} {limit}"
                    );
                    seen[want as usize] += 1;
                }
            }
        }
        assert!(seen[0] > 0 && seen[1] > 0);
        // Mesh axes and tensor dims past the stacked rank.
        let high = Layout::replicated(&m, 4);
        assert!(!stackable_shape(&high, &[2, 2, 2, 2]));
        assert!(!stackable_below(&high, &[2, 2, 2, 2], usize::MAX));
    }

    /// The output check agrees with the stack shape it stands for: hand-computed for a sharded
    /// layout, every dim of it (and the rank) checked, on sharded, replicated and partial layouts.
    #[test]
    fn stack_shape_check_agrees_with_the_stack_shape() {
        use super::{is_stack_shape, stack_shape};
        use crate::{Layout, Mesh, ReduceOp};
        let m = Mesh::new([("a", 2), ("b", 2), ("c", 2)], vec![(); 8]).unwrap();
        let sharded = Layout::new(&m, ["a", "b"]).unwrap();
        assert_eq!(stack_shape(&sharded, &[4, 6]), vec![2, 2, 1, 2, 3]);
        let layouts = [
            sharded,
            Layout::new(&m, ["unsharded", "c"]).unwrap(),
            Layout::replicated(&m, 2),
            Layout::new(&m, ["a", "unsharded"])
                .unwrap()
                .with_partial(2, ReduceOp::Sum),
        ];
        for l in &layouts {
            let shape = [4, 6];
            let want = stack_shape(l, &shape);
            assert!(is_stack_shape(l, &shape, &want), "{l}");
            for d in 0..want.len() {
                let mut off = want.clone();
                off[d] += 1;
                assert!(!is_stack_shape(l, &shape, &off), "{l} dim {d}");
            }
            assert!(!is_stack_shape(l, &shape, &want[1..]), "{l} rank");
        }
    }

    /// `global_split` views the global buffer as the stack: for layouts sharding the rows, the
    /// columns, both (in either axis order) or nothing, `permute(reshape(global, split), order)`
    /// (Flex's own reshape and permute) holds the values of the stacked boxes copied on the host
    /// (`host::stack`, the oracle: each box the global ranges of its position).
    #[cfg(feature = "flex")]
    #[test]
    fn global_split_views_the_stacked_boxes() {
        use super::{global_split, local_representatives, stack_shape};
        use crate::{Layout, Mesh};
        use burn::tensor::TensorData;
        let m = Mesh::new([("a", 2), ("b", 2), ("c", 2)], vec![(); 8]).unwrap();
        let shape = [4usize, 6];
        let data = TensorData::new((0..24).map(|i| i as f32).collect::<Vec<_>>(), shape);
        for dims in [
            ["a", "b"],
            ["b", "a"],
            ["unsharded", "c"],
            ["c", "unsharded"],
            ["unsharded", "unsharded"],
        ] {
            let l = Layout::new(&m, dims).unwrap();
            let stack = stack_shape(&l, &shape);
            let boxes: Vec<_> = local_representatives(&l)
                .map(|(_, i)| crate::layout::local_ranges(&l, &shape, i))
                .collect();
            let want = crate::host::stack(data.clone(), &boxes, stack.clone()).unwrap();
            let (split, order) = global_split(&l, &stack);
            let got = burn_flex::FlexTensor::from_data(data.clone())
                .reshape(split.into())
                .permute(&order)
                .into_data();
            assert_eq!(got.shape.to_vec(), stack, "{l}");
            got.assert_eq(&want, true);
        }
    }

    /// The rows' axis goes after the other mesh dims holding more than one shard; dims of size 1
    /// and the per-shard dims stay; nothing moves when the rows' axis is already last, alone, or
    /// the rows are not sharded.
    #[test]
    fn row_blocks_go_inside_the_other_axes() {
        use super::rows_inner_order;
        use crate::{Layout, Mesh};
        let m = Mesh::new([("a", 2), ("b", 2), ("c", 2)], vec![(); 8]).unwrap();
        let order = |dims: [&str; 2], stack: &[usize]| {
            rows_inner_order(&Layout::new(&m, dims).unwrap(), stack)
        };
        // The spatial input: rows on `a`, features on `b`, `c` unused.
        assert_eq!(
            order(["a", "b"], &[2, 2, 1, 4, 3]),
            Some(vec![1, 0, 2, 3, 4])
        );
        // Rows on `a`, a pending or sharded `c` too: `a` after both.
        assert_eq!(
            order(["a", "c"], &[2, 1, 2, 4, 3]),
            Some(vec![2, 1, 0, 3, 4])
        );
        assert_eq!(order(["b", "a"], &[2, 2, 1, 4, 3]), None);
        assert_eq!(order(["a", "unsharded"], &[2, 1, 1, 4, 6]), None);
        assert_eq!(order(["unsharded", "a"], &[2, 1, 1, 8, 3]), None);
    }

    #[test]
    fn broadcasting_operands_repeat_the_fewest_dims() {
        use super::fewest_repeats;
        // A model-parallel bias against a [batch, model, rows, cols] stack: the rows repeat.
        assert_eq!(
            fewest_repeats(&[1, 2, 1, 24], &[4, 2, 16, 24]),
            vec![(2, 16)]
        );
        // A per-row statistic: already a scalar per row after the whole dims.
        assert_eq!(fewest_repeats(&[4, 2, 16, 1], &[4, 2, 16, 24]), vec![]);
        // Broadcast inside both ends: the cheaper form (leading: 2 * 3 * 7 repeated from 1 * 3 * 1).
        assert_eq!(fewest_repeats(&[1, 3, 1, 7], &[5, 3, 2, 7]), vec![(2, 2)]);
        assert_eq!(fewest_repeats(&[5, 1, 3, 1], &[5, 9, 3, 2]), vec![(1, 9)]);
        // Whole, or broadcast everywhere: nothing to repeat.
        assert_eq!(fewest_repeats(&[4, 2, 16, 24], &[4, 2, 16, 24]), vec![]);
        assert_eq!(fewest_repeats(&[1, 1, 1, 1], &[4, 2, 16, 24]), vec![]);
    }

    #[test]
    fn operands_fold_around_the_indexed_dim() {
        // Cross-entropy's gather on a [batch 2, model 4] stack: [2, 4, 8, 2] along the last dim,
        // indices [2, 4, 8, 1] -> the single device's [64, 2] and [64, 1].
        assert_eq!(
            fold_along(&[&[2, 4, 8, 2], &[2, 4, 8, 1]], 3),
            Some((vec![vec![64, 2], vec![64, 1]], 1))
        );
        // Along a middle dim: the dims before and after merge ([1, 4] drops the unit group).
        assert_eq!(
            fold_along(&[&[2, 3, 5, 7], &[2, 3, 1, 7]], 2),
            Some((vec![vec![6, 5, 7], vec![6, 1, 7]], 1))
        );
        assert_eq!(
            fold_along(&[&[1, 1, 5, 7], &[1, 1, 2, 7]], 2),
            Some((vec![vec![5, 7], vec![2, 7]], 0))
        );
        // Nothing to fold, and operands that differ off the dim (a broadcast mesh dim) stay.
        assert_eq!(fold_along(&[&[6, 5, 7], &[6, 1, 7]], 1), None);
        assert_eq!(fold_along(&[&[2, 4, 8, 2], &[1, 4, 8, 1]], 3), None);
    }
}
