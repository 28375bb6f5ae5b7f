//! The dispatcher: redistribute the inputs to the layouts a rule asks for, run the inner op on
//! every shard, tag the output with the rule's layout.
//!
//! Devices that hold identical inputs (same chunk, same pending coordinate, same inner device:
//! replicas on virtual devices) compute once and share the result, so a replicated op on an
//! 8-device virtual mesh costs one inner op, not eight. On a stacked virtual mesh
//! ([`crate::stack`]) an op whose closure has a stacked form runs once on the stacked operands.

use burn::tensor::TensorMetadata;
use burn::tensor::backend::Backend;

use crate::inner::{par_min, threads_for};
use crate::layout::Layout;
use crate::redistribute::{execute, execute_stacked};
use crate::rules::Strategy;
use crate::stack::{self, At};
use crate::tensor::{DTensor, Kind, Shards};

/// For each device: `None` to compute, `Some(j)` to reuse device `j`'s result.
pub(crate) fn dedupe_plan<D: PartialEq>(layouts: &[&Layout], devices: &[D]) -> Vec<Option<usize>> {
    let topo = &layouts[0].mesh;
    if devices.len() == 1 {
        return vec![None];
    }
    let mut axes: smallvec::SmallVec<[bool; 4]> = smallvec::smallvec![false; topo.ndim()];
    for l in layouts {
        for a in l.dims.iter().flatten() {
            axes[*a] = true;
        }
        for (a, p) in l.partial.iter().enumerate() {
            axes[a] |= p.is_some();
        }
    }
    // A device's key: its coordinates on the used axes, as one mixed-radix number.
    let key = |i: usize| -> usize {
        (0..topo.ndim())
            .filter(|&a| axes[a])
            .fold(0, |k, a| k * topo.axis_size(a) + topo.coord(i, a))
    };
    let keys: Vec<usize> = (0..devices.len()).map(|j| key(topo.global(j))).collect();
    (0..devices.len())
        .map(|i| (0..i).find(|&j| keys[j] == keys[i] && devices[j] == devices[i]))
        .collect()
}

/// Runs `f` on every shard that `plan` says to compute (in parallel when `threads` allows it,
/// each shard holds at least [`par_min`] elements and more than one must be computed), then
/// fills the replicas.
fn run_each<P: Clone + Send, I: Send>(
    inputs: Vec<I>,
    plan: &[Option<usize>],
    work: usize,
    threads: bool,
    f: impl Fn(usize, I) -> P + Sync,
) -> Vec<P> {
    use rayon::prelude::*;
    if inputs.len() == 1 {
        return inputs.into_iter().map(|x| f(0, x)).collect();
    }
    let todo = plan.iter().filter(|p| p.is_none()).count();
    let mut slots: Vec<Option<P>> =
        if threads && todo > 1 && work >= par_min() && rayon::current_num_threads() > 1 {
            inputs
                .into_par_iter()
                .enumerate()
                .map(|(i, x)| plan[i].is_none().then(|| f(i, x)))
                .collect()
        } else {
            inputs
                .into_iter()
                .enumerate()
                .map(|(i, x)| plan[i].is_none().then(|| f(i, x)))
                .collect()
        };
    for i in 0..slots.len() {
        if let Some(j) = plan[i] {
            slots[i] = slots[j].clone();
        }
    }
    slots
        .into_iter()
        .map(|s| s.expect("every shard computed or copied"))
        .collect()
}

/// [`run_each`] for an op whose output (global `shape` under `layout`) has an empty shard on some
/// positions (an uneven split that leaves a position none: dim 0 of `[2, 3]` over 4 devices)
/// while the whole output is not empty: those positions do not run `f` and get an empty shard
/// of their shape, the computed shards' dtype, on their input's `device`. An op on an empty
/// shard computes nothing, and some backends mis-handle one: `burn-cubecl` 0.21 underflows in
/// `CubeTensor::is_nonoverlapping` (`shape - 1` on a dim of 0) when a binary op may write into
/// an empty operand, a panic in debug builds, and fused Wgpu then returned wrong values on the
/// other shards. When every shard is empty (an empty global tensor) `f` runs everywhere: the
/// inner backend's own behaviour on an empty tensor. When every shard *here* is empty while the
/// output is not (a process of a multi-process mesh holding only empty shards: no computed
/// shard gives the dtype), `f` runs too, with every operand kept shared meanwhile, so that no
/// backend may write into an empty operand in place (the `burn-cubecl` check above is only
/// reached for an operand it may reuse).
fn run_shards<B: Backend, KO: Kind<B>, I: Send + Clone>(
    inputs: Vec<I>,
    plan: &[Option<usize>],
    work: usize,
    (layout, shape): (&Layout, &[usize]),
    device: impl Fn(&I) -> B::Device + Sync,
    f: impl Fn(usize, I) -> KO::P + Sync,
) -> Vec<KO::P> {
    // Only a dim that does not split evenly can leave a position an empty shard.
    let local: Vec<Vec<usize>> = if !crate::layout::is_even(layout, shape) && !shape.contains(&0) {
        (0..inputs.len())
            .map(|i| crate::layout::local_shape(layout, shape, layout.mesh.global(i)))
            .collect()
    } else {
        Vec::new()
    };
    let empty: Vec<bool> = local.iter().map(|l| l.contains(&0)).collect();
    if !empty.contains(&true) {
        return run_each(inputs, plan, work, threads_for::<B>(), f);
    }
    if !empty.contains(&false) {
        // Every position here empty: no computed shard gives the dtype, so `f` runs on them,
        // its operands held shared (no in-place write into an empty buffer).
        let held = inputs.clone();
        let out = run_each(inputs, plan, work, threads_for::<B>(), f);
        drop(held);
        return out;
    }
    let shards = run_each(inputs, plan, work, threads_for::<B>(), |i, x| {
        if empty[i] {
            Err(device(&x))
        } else {
            Ok(f(i, x))
        }
    });
    let dtype = shards
        .iter()
        .find_map(|r| r.as_ref().ok())
        .expect("a position with a non-empty output shard computed it")
        .dtype();
    shards
        .into_iter()
        .zip(local)
        .map(|(r, shape)| r.unwrap_or_else(|d| KO::empty(shape, dtype, &d)))
        .collect()
}

/// Whether the tensor lives on a mesh of one device. There every layout places the whole tensor
/// on that device and a pending reduction over one device is already its value, so an op is the
/// inner op on the one shard, with a replicated output: [`solo_map`] builds it without computing a
/// sharding rule (the decorator's per-op cost on a one-device mesh).
pub(crate) fn is_solo<P>(t: &DTensor<P>) -> bool {
    matches!(&t.shards, Shards::PerDevice(v) if v.len() == 1) && !t.layout.mesh.multi
}

/// The only shard of a tensor on a one-device mesh.
pub(crate) fn only<P>(t: DTensor<P>) -> P {
    t.into_per_device().into_iter().next().expect("one shard")
}

/// An op on a one-device mesh: `f` on `t`'s only shard (other operands taken with [`only`]
/// inside `f`), the result replicated on the same mesh.
///
/// It runs for every op on such a mesh, so it allocates nothing of its own: the input's shape
/// and shard vectors and its layout are reused for the output (the shard vector in place when
/// `P` and `Q` have one size, as the inner backends' float/int/bool primitives do).
pub(crate) fn solo_map<P, Q: burn::tensor::TensorMetadata>(
    t: DTensor<P>,
    f: impl FnOnce(P) -> Q,
) -> DTensor<Q> {
    let DTensor {
        mut shape,
        layout,
        shards,
        ..
    } = t;
    let Shards::PerDevice(shards) = shards else {
        unreachable!("is_solo: one per-device shard")
    };
    let mut f = Some(f);
    let shards: Vec<Q> = shards
        .into_iter()
        .map(|x| f.take().expect("one shard")(x))
        .collect();
    shape.clear();
    shape.extend(shards[0].shape().iter());
    let layout = Layout::replicated_like(layout, shape.len());
    DTensor::from_parts(shape, layout, shards)
}

/// [`dedupe_plan`] for the devices the shards sit on (nothing to plan for a single shard).
fn plan_for<B: Backend, K: Kind<B>>(shards: &[K::P], layouts: &[&Layout]) -> Vec<Option<usize>> {
    if shards.len() == 1 {
        return vec![None];
    }
    let devices: Vec<B::Device> = shards.iter().map(K::device).collect();
    dedupe_plan(layouts, &devices)
}

fn work<P: burn::tensor::TensorMetadata + 'static>(shards: &[P]) -> usize {
    shards
        .first()
        .map_or(0, |s| crate::inner::with_dims(s, |d| d.iter().product()))
}

/// Whether an op runs stacked: its closure has a stacked form (`stack`), every operand (global
/// shape, layout the rule asks for) and the output can be held stacked (see [`crate::stack`]),
/// and, on CPU backends, every shard is below [`par_min`] elements. Above it, shards run per
/// device on worker threads: one stacked op runs on one thread, and on the 20000 -> 4096 MLP
/// that made the data-parallel step 3.84 s against 2.20 s threaded per device (NOTES.md).
pub(crate) fn stacks<B>(
    stack: bool,
    out: (&Layout, &[usize]),
    inputs: &[(&Layout, &[usize])],
) -> bool {
    if !stack {
        return false;
    }
    // The threading limit read once for every operand (a per-thread copy of the configuration).
    let limit = thread_limit::<B>();
    std::iter::once(&out)
        .chain(inputs)
        .all(|&(l, s)| l.mesh.stacked && fits_stacked(l, s, limit))
}

/// Whether a tensor of global `shape` under `layout` is held stacked on inner backend `B`:
/// [`stack::stackable`], and on CPU backends shards below [`par_min`] (see [`stacks`]).
pub(crate) fn holds_stacked<B>(layout: &Layout, shape: &[usize]) -> bool {
    layout.mesh.stacked && would_hold_stacked::<B>(layout, shape)
}

/// [`holds_stacked`] as if the mesh were one process's virtual devices (see
/// [`stack::stackable_shape`]).
pub(crate) fn would_hold_stacked<B>(layout: &Layout, shape: &[usize]) -> bool {
    fits_stacked(layout, shape, thread_limit::<B>())
}

/// The per-shard work (elements) from which the shards of inner backend `B` run per device on
/// worker threads instead of stacked: [`par_min`] on CPU backends, none on the others.
fn thread_limit<B>() -> usize {
    if threads_for::<B>() {
        par_min()
    } else {
        usize::MAX
    }
}

/// [`stack::stackable_shape`], with shards below `limit` elements ([`thread_limit`]): one
/// pass, [`stack::stackable_below`].
fn fits_stacked(layout: &Layout, shape: &[usize], limit: usize) -> bool {
    stack::stackable_below(layout, shape, limit)
}

/// The body of [`run1`], [`run2_weighted`] and [`run3`]: the operands `$t` (of kinds `$K`, the
/// strategy's input `$i`) brought to the strategy's input layouts, then `$f` run once on the
/// stacked shards where [`stacks`] allows it, else per device ([`run_each`], with the per-shard
/// work `$work` computed from the redistributed operands). The first operand's devices plan the
/// replicas ([`dedupe_plan`]).
macro_rules! run_operands {
    ($s:ident, $shape:ident, $stack:ident, $f:ident, $work:expr,
     [($t0:ident, $K0:ident, 0) $(, ($t:ident, $K:ident, $i:tt))*]) => {{
        if stacks::<B>(
            $stack,
            (&$s.output, &$shape),
            &[(&$s.inputs[0], &$t0.shape) $(, (&$s.inputs[$i], &$t.shape))*],
        ) {
            let $t0 = execute_stacked::<B, $K0>($t0, &$s.inputs[0]);
            $(let $t = execute_stacked::<B, $K>($t, &$s.inputs[$i]);)*
            return stack::output(
                $shape,
                $s.output.clone(),
                $f(At::Stacked($s.output.mesh.ndim()), $t0 $(, $t)*),
            );
        }
        let $t0 = execute::<B, $K0>($t0, &$s.inputs[0]);
        $(let $t = execute::<B, $K>($t, &$s.inputs[$i]);)*
        let plan = plan_for::<B, $K0>(
            $t0.per_device(),
            &[&$s.inputs[0] $(, &$s.inputs[$i])*, &$s.output],
        );
        let w = $work;
        let mut shards = ($t0.into_per_device().into_iter() $(, $t.into_per_device().into_iter())*,);
        let inputs: Vec<_> = std::iter::from_fn(|| {
            Some((shards.0.next()? $(, shards.$i.next().expect("one shard per device"))*,))
        })
        .collect();
        let out = run_shards::<B, KO, _>(
            inputs,
            &plan,
            w,
            (&$s.output, &$shape),
            |x| $K0::device(&x.0),
            |i, ($t0 $(, $t)*,)| $f(At::Device($s.output.mesh.global(i)), $t0 $(, $t)*),
        );
        DTensor::from_parts($shape, $s.output.clone(), out)
    }};
}

/// One input. `f` receives where it runs ([`At`]); `stack` says whether it is correct on a
/// stacked primitive (dims offset by [`At::off`], shapes from [`At::shape`]).
pub fn run1<B: Backend, K1: Kind<B>, KO: Kind<B>>(
    a: DTensor<K1::P>,
    s: &Strategy,
    shape: Vec<usize>,
    stack: bool,
    f: impl Fn(At, K1::P) -> KO::P + Sync,
) -> DTensor<KO::P> {
    run_operands!(s, shape, stack, f, work(a.per_device()), [(a, K1, 0)])
}

/// Two inputs (see [`run1`]).
pub fn run2<B: Backend, K1: Kind<B>, K2: Kind<B>, KO: Kind<B>>(
    a: DTensor<K1::P>,
    b: DTensor<K2::P>,
    s: &Strategy,
    shape: Vec<usize>,
    stack: bool,
    f: impl Fn(At, K1::P, K2::P) -> KO::P + Sync,
) -> DTensor<KO::P> {
    run2_weighted::<B, K1, K2, KO>(a, b, s, shape, stack, |x, y| work(x).max(work(y)), f)
}

/// [`run2`] with the per-shard work (for [`par_min`]) computed by `weigh` from the input shards
/// after redistribution.
#[allow(clippy::too_many_arguments)]
pub fn run2_weighted<B: Backend, K1: Kind<B>, K2: Kind<B>, KO: Kind<B>>(
    a: DTensor<K1::P>,
    b: DTensor<K2::P>,
    s: &Strategy,
    shape: Vec<usize>,
    stack: bool,
    weigh: impl Fn(&[K1::P], &[K2::P]) -> usize,
    f: impl Fn(At, K1::P, K2::P) -> KO::P + Sync,
) -> DTensor<KO::P> {
    run_operands!(
        s,
        shape,
        stack,
        f,
        weigh(a.per_device(), b.per_device()),
        [(a, K1, 0), (b, K2, 1)]
    )
}

/// Three inputs (see [`run1`]).
#[allow(clippy::type_complexity, clippy::too_many_arguments)]
pub fn run3<B: Backend, K1: Kind<B>, K2: Kind<B>, K3: Kind<B>, KO: Kind<B>>(
    a: DTensor<K1::P>,
    b: DTensor<K2::P>,
    c: DTensor<K3::P>,
    s: &Strategy,
    shape: Vec<usize>,
    stack: bool,
    f: impl Fn(At, K1::P, K2::P, K3::P) -> KO::P + Sync,
) -> DTensor<KO::P> {
    run_operands!(
        s,
        shape,
        stack,
        f,
        work(a.per_device()),
        [(a, K1, 0), (b, K2, 1), (c, K3, 2)]
    )
}

/// Any number of inputs of one kind (cat; see [`run1`]).
pub fn run_n<B: Backend, K: Kind<B>, KO: Kind<B>>(
    ts: Vec<DTensor<K::P>>,
    s: &Strategy,
    shape: Vec<usize>,
    stack: bool,
    f: impl Fn(At, Vec<K::P>) -> KO::P + Sync,
) -> DTensor<KO::P> {
    let operands: Vec<(&Layout, &[usize])> = s
        .inputs
        .iter()
        .zip(&ts)
        .map(|(l, t)| (l, &t.shape[..]))
        .collect();
    if stacks::<B>(stack, (&s.output, &shape), &operands) {
        let xs = ts
            .into_iter()
            .zip(&s.inputs)
            .map(|(t, l)| execute_stacked::<B, K>(t, l))
            .collect();
        return stack::output(
            shape,
            s.output.clone(),
            f(At::Stacked(s.output.mesh.ndim()), xs),
        );
    }
    let ts: Vec<DTensor<K::P>> = ts
        .into_iter()
        .zip(&s.inputs)
        .map(|(t, l)| execute::<B, K>(t, l))
        .collect();
    let devices: Vec<B::Device> = ts[0].per_device().iter().map(K::device).collect();
    let mut ls: Vec<&Layout> = s.inputs.iter().collect();
    ls.push(&s.output);
    let plan = dedupe_plan(&ls, &devices);
    let n = devices.len();
    let w = work(ts[0].per_device());
    let mut per_device: Vec<Vec<K::P>> = (0..n).map(|_| Vec::new()).collect();
    for t in ts {
        for (i, p) in t.into_per_device().into_iter().enumerate() {
            per_device[i].push(p);
        }
    }
    let out = run_shards::<B, KO, _>(
        per_device,
        &plan,
        w,
        (&s.output, &shape),
        |x| K::device(&x[0]),
        |i, x| f(At::Device(s.output.mesh.global(i)), x),
    );
    DTensor::from_parts(shape, s.output.clone(), out)
}

/// The batch-parallel form of the executor, for module ops (conv, pooling, interpolate,
/// attention; see [`crate::rules::module`]) whose per-shard output shape only the inner op knows:
/// `f(i)` runs the op for position `i` on operands the caller laid out with
/// [`batch_parallel`](crate::rules::module::batch_parallel) (dim 0 as `x`'s, all else whole),
/// `xs` the main input so laid out (its shards say which positions hold an empty batch, and
/// which compute the same values); the output is sharded on dim 0 like `xs` (or replicated when
/// `batched_out` is false), with the global batch `xs.shape[0]`. Replicas compute once ([`dedupe_plan`]) and large shards run on
/// worker threads ([`par_min`]), as for every other op.
///
/// **Empty shards** are handled here, once for every batch-parallel op: a device whose chunk of
/// the batch is empty (a batch smaller than its mesh axis, or an uneven split) does not run the
/// inner op, which backends may reject or mis-compute on an empty batch (NdArray's
/// `deform_conv2d` divides by zero); it gets `empty(r)` of a computed shard `r`, the same
/// per-shard output with its dim 0 cut to 0. When every shard is empty (a global batch of 0)
/// the op runs as on one device; so it does on the empty batches of a process whose every
/// chunk is empty while the global batch is not (no computed shard gives the output's other
/// dims): the inner backend's own behaviour on an empty batch.
pub(crate) fn run_batch_with<B: Backend, R: TensorMetadata + Clone + Send>(
    xs: &DTensor<B::FloatTensorPrimitive>,
    batched_out: bool,
    empty: impl Fn(&R) -> R,
    f: impl Fn(usize) -> R + Sync,
) -> DTensor<R> {
    use crate::tensor::FloatKind;
    debug_assert_eq!(
        *xs.layout,
        crate::rules::module::batch_parallel(&xs.layout, &[true], &[xs.shape.len()], 0).inputs[0],
        "run_batch_with: the caller lays the input out batch-parallel first"
    );
    let xl = xs.layout.clone();
    let plan = plan_for::<B, FloatKind>(xs.per_device(), &[&xl]);
    let is_empty = |i: usize| xs.shape.first().is_some_and(|&n| n > 0) && xs.local_shape(i)[0] == 0;
    let positions: Vec<usize> = (0..plan.len()).collect();
    let mut computed = run_each(
        positions.clone(),
        &plan,
        work(xs.per_device()),
        threads_for::<B>(),
        |_, i| (!is_empty(i)).then(|| f(i)),
    );
    if computed.iter().all(Option::is_none) {
        // Every batch here empty while the global one is not (a process of a multi-process mesh
        // holding only empty chunks): no computed shard gives the output's other dims, so the
        // op runs on the empty batches, as for an empty global batch.
        computed = run_each(positions, &plan, 0, threads_for::<B>(), |_, i| Some(f(i)));
    }
    let some = computed
        .iter()
        .flatten()
        .next()
        .expect("a non-empty batch has a non-empty shard")
        .clone();
    let shards: Vec<R> = computed
        .into_iter()
        .map(|r| r.unwrap_or_else(|| empty(&some)))
        .collect();
    let mut shape = some.shape().to_vec();
    let mut layout = Layout::replicated_on(&xl.mesh, shape.len());
    if batched_out && !shape.is_empty() {
        shape[0] = xs.shape[0];
        layout.dims[0] = xl.dims.first().copied().flatten();
    }
    DTensor::from_parts(shape, layout, shards)
}

/// Runs `f(j)` for every addressable position `j` of `xs`, each distinct shard once (positions
/// that differ only along axes none of `layouts` shards share its result, [`dedupe_plan`]) and
/// on worker threads where large ([`par_min`]): the executor's loop for an op that lays its
/// operands out itself (the halo convolution, `ops/conv.rs`).
pub(crate) fn run_positions<B: Backend, R: Clone + Send>(
    xs: &DTensor<B::FloatTensorPrimitive>,
    layouts: &[&Layout],
    f: impl Fn(usize) -> R + Sync,
) -> Vec<R> {
    use crate::tensor::FloatKind;
    let plan = plan_for::<B, FloatKind>(xs.per_device(), layouts);
    let positions: Vec<usize> = (0..plan.len()).collect();
    run_each(
        positions,
        &plan,
        work(xs.per_device()),
        threads_for::<B>(),
        |_, j| f(j),
    )
}

/// Creation on a mesh, shard-local: the result has the creation layout
/// ([`crate::creation::layout_for`]: a scoped creation layout, else the mesh's policy) and each
/// distinct shard is made by `f(device, per-shard shape)` (stacked virtual meshes: one call with
/// the stacked shape), so no device, and no process, allocates the whole tensor unless it holds
/// it. `f` must fill by shape alone (zeros, ones, full, empty).
pub fn create<B: Backend, K: Kind<B>>(
    mesh: &crate::Mesh<B::Device>,
    shape: Vec<usize>,
    f: impl Fn(&B::Device, Vec<usize>) -> K::P + Sync,
) -> DTensor<K::P> {
    let layout = crate::creation::layout_for(mesh.topology(), &shape);
    if let [device] = mesh.devices()
        && !mesh.topology().multi
    {
        return DTensor::from_parts(shape.clone(), layout, vec![f(device, shape)]);
    }
    if holds_stacked::<B>(&layout, &shape) {
        let p = f(&mesh.devices()[0], stack::stack_shape(&layout, &shape));
        return stack::output(shape, layout, p);
    }
    let plan = dedupe_plan(&[&layout], mesh.devices());
    let n = shape.iter().product();
    let at: Vec<(B::Device, Vec<usize>)> = (0..mesh.devices().len())
        .map(|j| {
            let local = crate::layout::local_shape(&layout, &shape, layout.mesh.global(j));
            (mesh.devices()[j].clone(), local)
        })
        .collect();
    let shards = run_each(at, &plan, n, threads_for::<B>(), |_, (d, s)| f(&d, s));
    DTensor::from_parts(shape, layout, shards)
}

/// Creation from host values made per shard: as [`create`], with each distinct shard's values
/// made by `values(box)` (the global ranges the shard holds) and uploaded by `upload`. A random
/// creation draws only its shards this way ([`crate::random`]).
pub fn create_from_host<B: Backend, K: Kind<B>>(
    mesh: &crate::Mesh<B::Device>,
    shape: Vec<usize>,
    values: impl Fn(&[std::ops::Range<usize>]) -> burn::tensor::TensorData + Sync,
    upload: impl Fn(burn::tensor::TensorData, &B::Device) -> K::P + Sync,
) -> DTensor<K::P> {
    let layout = crate::creation::layout_for(mesh.topology(), &shape);
    let ranges = |j: usize| crate::layout::local_ranges(&layout, &shape, layout.mesh.global(j));
    if holds_stacked::<B>(&layout, &shape) {
        // The representative shards, row-major over the used axes, are the stacked buffer.
        let mut bytes = Vec::new();
        let mut dtype = None;
        for (j, _) in stack::local_representatives(&layout) {
            let d = values(&ranges(j));
            dtype = Some(d.dtype);
            bytes.extend_from_slice(d.as_bytes());
        }
        let data = burn::tensor::TensorData::from_bytes_vec(
            bytes,
            stack::stack_shape(&layout, &shape),
            dtype.expect("a mesh has a position"),
        );
        let p = upload(data, &mesh.devices()[0]);
        return stack::output(shape, layout, p);
    }
    let plan = dedupe_plan(&[&layout], mesh.devices());
    let n = shape.iter().product();
    let at: Vec<usize> = (0..mesh.devices().len()).collect();
    let shards = run_each(at, &plan, n, threads_for::<B>(), |_, j| {
        upload(values(&ranges(j)), &mesh.devices()[j])
    });
    DTensor::from_parts(shape, layout, shards)
}
