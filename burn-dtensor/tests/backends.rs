//! The equivalence suite written once, generic over the inner backend, and run on every
//! available backend against NdArray on the whole tensor (the oracle): Flex always, Wgpu with
//! the `wgpu` feature (CI runs it on Mesa's software Vulkan device, `WgpuDevice::Cpu`), Cuda
//! with the `cuda` feature on a machine with a GPU (and fused Cuda with `cuda,fusion`).
//!
//! Shapes are chosen uneven (dims not divisible by their mesh axis) and data are multiples of
//! 1/8 so sums are exact in any order; tolerances only absorb transcendental rounding.

use burn::backend::NdArray;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData, Tolerance};
use burn_dtensor::{DTensorExt, DistributedBackend, Layout, Mesh, ReduceOp, distribute};

#[macro_use]
mod common;

fn tol() -> Tolerance<f32> {
    Tolerance::rel_abs(1e-4, 1e-5)
}

fn data(shape: [usize; 2], seed: usize) -> TensorData {
    let n = shape[0] * shape[1];
    TensorData::new(
        (0..n)
            .map(|i| (((i * 37 + seed * 11) % 23) as f32 - 11.0) / 8.0)
            .collect::<Vec<_>>(),
        shape,
    )
}

fn oracle(d: &TensorData) -> Tensor<NdArray, 2> {
    Tensor::from_data(d.clone(), &Default::default())
}

/// Every layout of a rank-2 tensor on a 2-D mesh `a x b` (unsharded / a / b per dim).
fn layouts<D>(mesh: &Mesh<D>) -> Vec<Layout> {
    let opts = ["unsharded", "a", "b"];
    let mut v = Vec::new();
    for x in opts {
        for y in opts {
            if x != y || x == "unsharded" {
                v.push(Layout::new(mesh, [x, y]).unwrap());
            }
        }
    }
    v
}

fn mesh<I: Backend>(device: &I::Device) -> Mesh<I::Device> {
    Mesh::new([("a", 2), ("b", 2)], vec![device.clone(); 4]).unwrap()
}

/// Matmul for every pair of operand layouts (batch/free/contracting dims sharded, partial sums).
/// Uneven shapes (shards held per device) and even ones (held stacked on a virtual mesh).
pub fn matmul<I: Backend>(device: I::Device) {
    let m = mesh::<I>(&device);
    for (sa, sb) in [([5, 7], [7, 3]), ([4, 6], [6, 2])] {
        let (da, db) = (data(sa, 1), data(sb, 2));
        let want = oracle(&da).matmul(oracle(&db)).into_data();
        for la in layouts(&m) {
            for lb in layouts(&m) {
                let a: Tensor<DistributedBackend<I>, 2> = distribute(da.clone(), &la).unwrap();
                let b: Tensor<DistributedBackend<I>, 2> = distribute(db.clone(), &lb).unwrap();
                a.matmul(b)
                    .into_data()
                    .convert::<f32>()
                    .assert_approx_eq::<f32>(&want, tol());
            }
        }
    }
}

/// Reductions over sharded uneven dims (mean and variance included), softmax, element-wise
/// ops with broadcasting.
pub fn reductions<I: Backend>(device: I::Device) {
    let m = mesh::<I>(&device);
    for (shape, l) in [[5, 7], [4, 6]]
        .into_iter()
        .flat_map(|s| layouts(&m).into_iter().map(move |l| (s, l)))
    {
        let d = data(shape, 3);
        let o = oracle(&d);
        let t: Tensor<DistributedBackend<I>, 2> = distribute(d.clone(), &l).unwrap();
        let c = |x: Tensor<DistributedBackend<I>, 2>, want: Tensor<NdArray, 2>| {
            x.into_data()
                .convert::<f32>()
                .assert_approx_eq::<f32>(&want.into_data(), tol())
        };
        for dim in 0..2 {
            // Of a transposed view (BatchNorm's `swap_dims(0, 1)` before its mean): on Flex the
            // stacked shards are a permuted view, reduced in their row-major dim order.
            let (tt, ot) = (t.clone().transpose(), o.clone().transpose());
            c(tt.clone().sum_dim(dim), ot.clone().sum_dim(dim));
            c(tt.clone().mean_dim(dim), ot.clone().mean_dim(dim));
            c(tt.max_dim(dim), ot.max_dim(dim));
            c(t.clone().sum_dim(dim), o.clone().sum_dim(dim));
            c(t.clone().mean_dim(dim), o.clone().mean_dim(dim));
            c(t.clone().max_dim(dim), o.clone().max_dim(dim));
            c(t.clone().min_dim(dim), o.clone().min_dim(dim));
            c(t.clone().var(dim), o.clone().var(dim));
            c(
                burn::tensor::activation::softmax(t.clone(), dim),
                burn::tensor::activation::softmax(o.clone(), dim),
            );
        }
        // Scalar ops, casts and a comparison of the transposed view and of the input (on Flex
        // both permuted views: run in their row-major order, copied back by runs), then combined
        // with a row-major operand.
        let (tt, ot) = (t.clone().transpose(), o.clone().transpose());
        for (x, ox) in [(tt, ot), (t.clone(), o.clone())] {
            let (xc, oxc) = (x.full_like(0.25), ox.full_like(0.25));
            let scaled = x.clone().mul_scalar(0.5).add_scalar(1.0).div_scalar(4.0);
            let oscaled = ox.clone().mul_scalar(0.5).add_scalar(1.0).div_scalar(4.0);
            c(scaled.clone(), oscaled.clone());
            c(scaled + xc.clone(), oscaled + oxc.clone());
            c(
                x.clone().greater_elem(0.0).float() + x.clone().int().float(),
                ox.clone().greater_elem(0.0).float() + ox.clone().int().float(),
            );
            c(
                xc - x.clone().clamp(-0.5, 0.5).neg(),
                oxc - ox.clone().clamp(-0.5, 0.5).neg(),
            );
        }
        if shape == [4, 6] {
            // A scalar op on a view whose dim order is a 3-cycle (not its own inverse).
            let cycled = t.clone().reshape([4, 2, 3]).permute([2, 0, 1]);
            let ocycled = o.clone().reshape([4, 2, 3]).permute([2, 0, 1]);
            c(
                cycled
                    .mul_scalar(0.5)
                    .add_scalar(1.0)
                    .permute([1, 2, 0])
                    .reshape([4, 6]),
                ocycled
                    .mul_scalar(0.5)
                    .add_scalar(1.0)
                    .permute([1, 2, 0])
                    .reshape([4, 6]),
            );
        }
        c(t.clone().sum().unsqueeze(), o.clone().sum().unsqueeze());
        c(
            t.clone() * t.clone().mean_dim(0) + t.clone().exp(),
            o.clone() * o.clone().mean_dim(0) + o.clone().exp(),
        );
        c(
            burn::tensor::activation::relu(t.clone()).transpose(),
            burn::tensor::activation::relu(o.clone()).transpose(),
        );
    }
}

/// Relayout between every pair of layouts, and from pending sum / max / min reductions (the
/// collectives: all-gather, all-to-all, local slice, all-reduce and reduce-scatter for each
/// reduce op), on uneven shards.
pub fn relayouts<I: Backend>(device: I::Device) {
    let m = mesh::<I>(&device);
    // Uneven (per device) and even (stacked on a virtual mesh).
    for shape in [[5, 6], [4, 6]] {
        let d = data(shape, 4);
        let want = d.clone().convert::<f32>();
        for from in layouts(&m) {
            for to in layouts(&m) {
                let t: Tensor<DistributedBackend<I>, 2> = distribute(d.clone(), &from).unwrap();
                t.relayout(&to)
                    .unwrap()
                    .into_data()
                    .convert::<f32>()
                    .assert_approx_eq::<f32>(&want, tol());
            }
        }
        // Pending reductions: relayout a replicated value into a partial (sum keeps it on
        // coordinate 0, max/min keep it everywhere), then settle it every way.
        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
            for to in layouts(&m) {
                if to.dims().contains(&Some(1)) {
                    continue;
                }
                let p = Layout::replicated(&m, 2).with_partial(1, op);
                let t: Tensor<DistributedBackend<I>, 2> =
                    distribute(d.clone(), &Layout::replicated(&m, 2)).unwrap();
                let t = t.relayout(&p).unwrap();
                t.relayout(&to)
                    .unwrap()
                    .into_data()
                    .convert::<f32>()
                    .assert_approx_eq::<f32>(&want, tol());
            }
        }
        // Across meshes: every layout of `m` to every layout of a mesh of 3 x 2 (stacked and
        // per device), int and bool tensors with the float one.
        for other in [
            Mesh::new([("b", 3), ("c", 2)], vec![device.clone(); 6]).unwrap(),
            Mesh::new([("b", 3), ("c", 2)], vec![device.clone(); 6])
                .unwrap()
                .with_stacked_execution(false),
        ] {
            let ints = TensorData::new(
                (0..shape[0] * shape[1]).map(|i| i as i32 % 7).collect(),
                shape,
            );
            for from in layouts(&m) {
                let t: Tensor<DistributedBackend<I>, 2> = distribute(d.clone(), &from).unwrap();
                let ti: Tensor<DistributedBackend<I>, 2, Int> =
                    distribute(ints.clone(), &from).unwrap();
                for to in [["b", "c"], ["unsharded", "b"], ["c", "unsharded"]] {
                    let to = Layout::new(&other, to).unwrap();
                    let y = t.clone().relayout(&to).unwrap();
                    assert_eq!(y.layout(), to);
                    y.into_data()
                        .convert::<f32>()
                        .assert_approx_eq::<f32>(&want, tol());
                    let yi = ti.clone().relayout(&to).unwrap();
                    assert_eq!(
                        yi.clone().into_data().convert::<i32>(),
                        ints,
                        "{from} -> {to}"
                    );
                    assert_eq!(
                        yi.equal_elem(3).relayout(&from).unwrap().into_data(),
                        Tensor::<I, 2, Int>::from_data(ints.clone(), &device)
                            .equal_elem(3)
                            .into_data(),
                        "{from} -> {to} -> back"
                    );
                }
            }
        }
    }
}

/// Ops on shards cut locally from a replicated tensor (strided views with an offset on most
/// backends), the path a layout map takes for parameters: matmul, element-wise update, sum.
pub fn sliced_shards<I: Backend>(device: I::Device) {
    let m = mesh::<I>(&device);
    let (dx, dw, dg) = (data([4, 5], 7), data([5, 6], 8), data([5, 6], 9));
    let want_mm = oracle(&dx).matmul(oracle(&dw)).into_data();
    let want_upd = (oracle(&dw) - oracle(&dg).mul_scalar(0.5)).into_data();
    for to in layouts(&m) {
        let x: Tensor<DistributedBackend<I>, 2> =
            distribute(dx.clone(), &Layout::replicated(&m, 2)).unwrap();
        let w: Tensor<DistributedBackend<I>, 2> =
            distribute(dw.clone(), &Layout::replicated(&m, 2)).unwrap();
        let w = w.relayout(&to).unwrap();
        x.matmul(w.clone())
            .into_data()
            .convert::<f32>()
            .assert_approx_eq::<f32>(&want_mm, tol());
        let g: Tensor<DistributedBackend<I>, 2> = distribute(dg.clone(), &to).unwrap();
        (w - g.mul_scalar(0.5))
            .into_data()
            .convert::<f32>()
            .assert_approx_eq::<f32>(&want_upd, tol());
    }
}

/// Whether `I` is one of the host backends (Flex, NdArray).
fn host<I: Backend>() -> bool {
    ["burn_flex::", "burn_ndarray::"]
        .iter()
        .any(|p| std::any::type_name::<I>().starts_with(p))
}

/// Ops on a tensor whose dim 0 splits unevenly over its mesh axis (`[2, 3]` over 4 devices: two
/// positions hold an empty shard), one per family that runs per shard: a flip along the split
/// dim met by a tensor sharded on it (Flex's debug builds rejected the empty chunk's slice past
/// the end of a flipped dim, found by Burn's conformance suite on `DistributedBackend<Flex>`),
/// a unary op then a binary one on fresh shards (on Wgpu the binary op on an empty shard panicked
/// inside `burn-cubecl`, which subtracts 1 from a dim of 0, and fused Wgpu returned wrong values
/// on the other shards), a comparison (bool output), a cast (int output), a reduction along the
/// unsplit dim and a matmul by a replicated weight: each equal to the inner backend's values on
/// the whole tensors.
pub fn empty_shards<I: Backend>(device: I::Device) {
    let m = Mesh::new([("x", 4)], vec![device.clone(); 4]).unwrap();
    let (dx, dy, dw) = (data([2, 3], 10), data([2, 3], 11), data([3, 2], 12));
    let rows = Layout::new(&m, ["x", "unsharded"]).unwrap();
    let (ox, oy, ow) = (oracle(&dx), oracle(&dy), oracle(&dw));
    let x: Tensor<DistributedBackend<I>, 2> = distribute(dx, &rows).unwrap();
    let y: Tensor<DistributedBackend<I>, 2> = distribute(dy, &rows).unwrap();
    let w: Tensor<DistributedBackend<I>, 2> = distribute(dw, &Layout::replicated(&m, 2)).unwrap();
    assert!(x.clone().to_local_shards().iter().any(|s| s.dims()[0] == 0));
    let close = |got: TensorData, want: TensorData| {
        got.convert::<f32>()
            .assert_approx_eq::<f32>(&want.convert::<f32>(), tol())
    };
    close(
        (x.clone().flip([0, 1]) * y.clone()).into_data(),
        (ox.clone().flip([0, 1]) * oy.clone()).into_data(),
    );
    close(
        ((x.clone() * 0.5).exp() + y.clone()).into_data(),
        ((ox.clone() * 0.5).exp() + oy.clone()).into_data(),
    );
    close(
        x.clone().greater(y.clone()).float().into_data(),
        ox.clone().greater(oy.clone()).float().into_data(),
    );
    close(
        (x.clone() * 8.0).int().into_data(),
        (ox.clone() * 8.0).int().into_data(),
    );
    close(
        x.clone().sum_dim(1).into_data(),
        ox.clone().sum_dim(1).into_data(),
    );
    close(x.matmul(w).into_data(), ox.matmul(ow).into_data());
}

/// Gradients through a sharded matmul + reduction on `Autodiff<DistributedBackend<I>>` equal
/// `Autodiff<I>`'s on the whole tensors (the inner backend itself is the oracle: on an H100,
/// Cuda's f32 matmul differs from NdArray's by up to 8e-4 relative, the layouts by far less).
pub fn gradients<I: Backend>(device: I::Device) {
    type Ad<I> = burn::backend::Autodiff<DistributedBackend<I>>;
    let m = mesh::<I>(&device);
    let (dx, dw) = (data([6, 5], 5), data([5, 3], 6));
    let ox = Tensor::<burn::backend::Autodiff<I>, 2>::from_data(dx.clone(), &device);
    let ow = Tensor::<burn::backend::Autodiff<I>, 2>::from_data(dw.clone(), &device).require_grad();
    let g = burn::tensor::activation::log_softmax(ox.matmul(ow.clone()), 1)
        .sum()
        .backward();
    let want = ow.grad(&g).unwrap().into_data().convert::<f32>();
    for (lx, lw) in [
        (["a", "unsharded"], ["unsharded", "unsharded"]),
        (["a", "b"], ["b", "unsharded"]),
        (["unsharded", "unsharded"], ["unsharded", "b"]),
    ] {
        let x: Tensor<Ad<I>, 2> = distribute(dx.clone(), &Layout::new(&m, lx).unwrap()).unwrap();
        let w: Tensor<Ad<I>, 2> =
            distribute::<Ad<I>, 2, burn::tensor::Float>(dw.clone(), &Layout::new(&m, lw).unwrap())
                .unwrap()
                .require_grad();
        let g = burn::tensor::activation::log_softmax(x.matmul(w.clone()), 1)
            .sum()
            .backward();
        w.grad(&g)
            .unwrap()
            .into_data()
            .convert::<f32>()
            .assert_approx_eq::<f32>(&want, tol());
    }
}

/// A contracting dim sharded on both operands, on a stacked virtual mesh: the product is a
/// partial sum whose shards are deferred (its reduced value is one matmul over the whole
/// contracting dim, see `burn_dtensor::tensor::Deferred`). Against the same ops on the mesh run
/// per device and the oracle: the value, the per-shard partial products (`to_local_shards`,
/// shard `(a, b)` is `x[.., a-th k chunk] @ w[a-th k chunk, ..]`), the sum of two such products
/// (addition keeps partial sums partial, so it reads the shards), a reduce-scatter, and the
/// communication recorded.
pub fn deferred_partials<I: Backend>(device: I::Device) {
    let m = mesh::<I>(&device);
    let d3 = |shape: [usize; 3], seed: usize| {
        TensorData::new(
            data([shape[0] * shape[1], shape[2]], seed)
                .to_vec::<f32>()
                .unwrap(),
            shape,
        )
    };
    // `a` shards k on both sides; then also the rows (b); then a batch dim (b). The products
    // outnumber the operands (as a weight gradient's do), so they are deferred.
    deferred_case::<I, 2>(
        &m,
        data([8, 2], 1),
        ["unsharded", "a"],
        data([2, 8], 2),
        ["a", "unsharded"],
    );
    deferred_case::<I, 2>(
        &m,
        data([8, 2], 1),
        ["b", "a"],
        data([2, 8], 2),
        ["a", "unsharded"],
    );
    deferred_case::<I, 3>(
        &m,
        d3([2, 8, 2], 1),
        ["b", "unsharded", "a"],
        d3([2, 2, 8], 2),
        ["b", "a", "unsharded"],
    );
}

fn deferred_case<I: Backend, const D: usize>(
    stacked: &Mesh<I::Device>,
    dx: TensorData,
    lx: [&str; D],
    dw: TensorData,
    lw: [&str; D],
) {
    let per_device = stacked.with_stacked_execution(false);
    let run = |m: &Mesh<I::Device>| {
        let x: Tensor<DistributedBackend<I>, D> =
            distribute(dx.clone(), &Layout::new(m, lx).unwrap()).unwrap();
        let w: Tensor<DistributedBackend<I>, D> =
            distribute(dw.clone(), &Layout::new(m, lw).unwrap()).unwrap();
        let mut scatter = ["unsharded"; D];
        scatter[D - 1] = "a";
        burn_dtensor::record_comms(|| {
            let y = x.clone().matmul(w.clone());
            assert!(y.layout().is_partial());
            let shards: Vec<TensorData> = y
                .clone()
                .to_local_shards()
                .into_iter()
                .map(|s| s.into_data())
                .collect();
            let sum = y.clone() + x.matmul(w.mul_scalar(2.0));
            let scattered = y
                .clone()
                .relayout(&Layout::new(m, scatter).unwrap())
                .unwrap();
            [y.into_data(), sum.into_data(), scattered.into_data()]
                .into_iter()
                .chain(shards)
                .collect::<Vec<_>>()
        })
    };
    let (got, log) = run(stacked);
    let (got1, log1) = run(&per_device);
    let (ox, ow) = (
        Tensor::<NdArray, D>::from_data(dx.clone(), &Default::default()),
        Tensor::<NdArray, D>::from_data(dw.clone(), &Default::default()),
    );
    let want = ox.clone().matmul(ow.clone());
    let mut wants = vec![
        want.clone().into_data(),
        want.clone().mul_scalar(3.0).into_data(),
        want.into_data(),
    ];
    // Shard of mesh device i = (a, b): `a` picks the k chunk, `b` the row or batch chunk.
    let k = dx.shape[D - 1] / 2;
    for i in 0..4 {
        let (ca, cb) = (i / 2, i % 2);
        let (mut xi, mut wi) = (
            ox.clone().narrow(D - 1, ca * k, k),
            ow.clone().narrow(D - 2, ca * k, k),
        );
        for (d, l) in lx.iter().enumerate().take(D - 1) {
            if *l == "b" {
                let n = dx.shape[d] / 2;
                xi = xi.narrow(d, cb * n, n);
                if d < D - 2 {
                    wi = wi.narrow(d, cb * n, n);
                }
            }
        }
        wants.push(xi.matmul(wi).into_data());
    }
    assert_eq!(got.len(), wants.len());
    for ((g, g1), w) in got.iter().zip(&got1).zip(&wants) {
        g.clone().convert::<f32>().assert_approx_eq::<f32>(w, tol());
        g1.clone()
            .convert::<f32>()
            .assert_approx_eq::<f32>(w, tol());
    }
    assert_eq!(log.summary(), log1.summary(), "{lx:?} @ {lw:?}");
    assert!(!log.events.is_empty());
}

/// Products whose rhs alone is sharded over a mesh axis along its columns (a model axis, 24
/// columns a shard, as the IMDB `dense1` on a `model=2` mesh): a model-parallel forward, a
/// weight gradient contracting a sharded batch (`stack::contract`), the same with the input's
/// features sharded too (the spatial weight gradient), and a spatial product (the contracting
/// dim sharded too: partial products). Data with rounding and `k = 600` (two of
/// Flex's GEMM blocks of 512), so a change of summation order would show: on Flex and NdArray
/// the stacked mesh and the mesh run per device give the inner backend's own bits (the whole
/// product, or each shard's product; the per-device weight gradient sums two partial products,
/// so it is compared to the tolerance), on the other backends the values to the tolerance.
pub fn narrow_model_products<I: Backend>(device: I::Device) {
    let exact = host::<I>();
    let rough = |shape: [usize; 2], seed: usize| {
        TensorData::new(
            (0..shape[0] * shape[1])
                .map(|i| ((i * 7919 + seed * 104_729) as f32 * 1e-3).sin())
                .collect::<Vec<f32>>(),
            shape,
        )
    };
    let (dx, dw, dy) = (rough([16, 600], 1), rough([600, 48], 2), rough([16, 48], 3));
    let inner = |d: &TensorData| Tensor::<I, 2>::from_data(d.clone(), &device);
    let check = |got: TensorData, want: TensorData, bitwise: bool| {
        if bitwise {
            assert_eq!(got, want);
        } else {
            got.assert_approx_eq::<f32>(&want, Tolerance::rel_abs(1e-3, 1e-4));
        }
    };
    let stacked = mesh::<I>(&device);
    for (m, per_device) in [
        (stacked.clone(), false),
        (stacked.with_stacked_execution(false), true),
    ] {
        let put = |d: &TensorData, l: [&str; 2]| -> Tensor<DistributedBackend<I>, 2> {
            distribute(d.clone(), &Layout::new(&m, l).unwrap()).unwrap()
        };
        // Model-parallel forward: the rows on `a`, the weight's columns on `b`.
        let y = put(&dx, ["a", "unsharded"]).matmul(put(&dw, ["unsharded", "b"]));
        check(
            y.into_data(),
            inner(&dx).matmul(inner(&dw)).into_data(),
            exact,
        );
        // A weight gradient: the batch contracted over `a`, the columns on `b`.
        let g = put(&dx, ["a", "unsharded"])
            .transpose()
            .matmul(put(&dy, ["a", "b"]));
        let g_inner = inner(&dx).transpose().matmul(inner(&dy));
        check(
            g.clone().into_data(),
            g_inner.clone().into_data(),
            exact && !per_device,
        );
        // SGD's update with it, twice, and the forward with the updated weight: on Flex the
        // gradient's shards stay side by side as the product wrote them (`stack::side_by_side`),
        // the first update mixes that order with the row-major weight, the second meets two
        // side-by-side operands, and the forward reads the weight as it lies. Element-wise ops
        // and the whole-width product: the inner backend's bits on the whole tensors.
        let (mut w, mut w_inner) = (put(&dw, ["unsharded", "b"]), inner(&dw));
        for _ in 0..2 {
            w = w - g.clone().mul_scalar(1e-2);
            w_inner = w_inner - g_inner.clone().mul_scalar(1e-2);
            check(
                w.clone().into_data(),
                w_inner.clone().into_data(),
                exact && !per_device,
            );
        }
        let y = put(&dx, ["a", "unsharded"]).matmul(w.clone());
        check(
            y.into_data(),
            inner(&dx).matmul(w_inner.clone()).into_data(),
            exact && !per_device,
        );
        // And the updated weight's values per shard (its shards are views of one buffer).
        for (i, s) in w.to_local_shards().into_iter().enumerate() {
            let want = w_inner.clone().narrow(1, (i % 2) * 24, 24);
            check(s.into_data(), want.into_data(), exact && !per_device);
        }
        // A spatial weight gradient: the batch contracted over `a`, the input's features on
        // `b`, so merging `a` into the contracting dim moves it inside `b` (`stack::contract`;
        // on Flex the distributed input already holds its row blocks in that order,
        // `stack::rows_inner_order`, and the merge is a view; elsewhere a copy by runs); shard
        // `cb` of the result is that feature block's product.
        let g = put(&dx, ["a", "b"])
            .transpose()
            .matmul(put(&dy, ["a", "unsharded"]));
        let blocks = (0..2)
            .map(|cb| {
                inner(&dx)
                    .narrow(1, cb * 300, 300)
                    .transpose()
                    .matmul(inner(&dy))
            })
            .collect();
        check(
            g.into_data(),
            Tensor::cat(blocks, 0).into_data(),
            exact && !per_device,
        );
        // The spatial IMDB forward: rows on `a`, the contracting dim on `b`, the weight's
        // columns on a third axis `c` (on Flex the input is a view of its global buffer, the
        // rows of both `a` shards fold into one product per `b` shard, the weight's `c` shards
        // side by side): shard `(ca, cb, cc)` is the partial product of its blocks, each the
        // inner backend's own bits.
        let m3 = Mesh::new([("a", 2), ("b", 2), ("c", 2)], vec![device.clone(); 8])
            .unwrap()
            .with_stacked_execution(!per_device);
        let put3 = |d: &TensorData, l: [&str; 2]| -> Tensor<DistributedBackend<I>, 2> {
            distribute(d.clone(), &Layout::new(&m3, l).unwrap()).unwrap()
        };
        let p = put3(&dx, ["a", "b"]).matmul(put3(&dw, ["b", "c"]));
        assert!(p.layout().is_partial());
        for (i, s) in p.to_local_shards().into_iter().enumerate() {
            let (ca, cb, cc) = (i / 4, (i / 2) % 2, i % 2);
            let want = inner(&dx)
                .narrow(0, ca * 8, 8)
                .narrow(1, cb * 300, 300)
                .matmul(inner(&dw).narrow(0, cb * 300, 300).narrow(1, cc * 24, 24));
            check(s.into_data(), want.into_data(), exact);
        }
        // Spatial: the contracting dim on `a` (a partial product per shard), the columns on `b`.
        let p = put(&dx, ["unsharded", "a"]).matmul(put(&dw, ["a", "b"]));
        assert!(p.layout().is_partial());
        for (i, s) in p.to_local_shards().into_iter().enumerate() {
            let (ca, cb) = (i / 2, i % 2);
            let want = inner(&dx)
                .narrow(1, ca * 300, 300)
                .matmul(inner(&dw).narrow(0, ca * 300, 300).narrow(1, cb * 24, 24));
            check(s.into_data(), want.into_data(), exact);
        }
    }
}

/// `distribute` of data of every kind (f64, f32, i64, i32, bool) into tensors of every kind
/// creates what Burn's `Tensor::from_data` creates on the mesh's device (dtype and bytes: the
/// backend's default dtype for the kind, `i32` ints and `u32`/`u8` bools on CubeCL backends),
/// which is what the inner backend's `from_data` creates on the whole data. The values are not
/// negative: Burn's own `from_data` of a negative number into a CubeCL bool (`u32`) panics.
pub fn created_dtypes<I: Backend>(device: I::Device) {
    use burn::tensor::{BasicOps, Bool, Element, Float, Int};
    use burn_dtensor::{DistributedDevice, DistributedKind};
    fn each<I: Backend, K>(device: &I::Device, m: &Mesh<I::Device>, d: &TensorData)
    where
        K: DistributedKind<DistributedBackend<I>> + BasicOps<I>,
        <K as BasicOps<I>>::Elem: Element,
    {
        let what = format!(
            "{:?} data as {}",
            d.dtype,
            <K as burn::tensor::TensorKind<I>>::name()
        );
        let on_mesh = DistributedDevice::new(m.clone());
        let want =
            Tensor::<DistributedBackend<I>, 2, K>::from_data(d.clone(), &on_mesh).into_data();
        let inner = Tensor::<I, 2, K>::from_data(d.clone(), device).into_data();
        assert_eq!(want, inner, "{what}: the oracle");
        for spec in [["unsharded", "unsharded"], ["a", "b"], ["unsharded", "a"]] {
            let l = Layout::new(m, spec).unwrap();
            let got = distribute::<DistributedBackend<I>, 2, K>(d.clone(), &l).unwrap();
            assert_eq!(got.into_data(), want, "{what} on {l}");
        }
    }
    let m = mesh::<I>(&device);
    let n = 5 * 3usize;
    for d in [
        TensorData::new((0..n).map(|i| i as f64 * 0.75).collect::<Vec<_>>(), [5, 3]),
        TensorData::new((0..n).map(|i| i as f32 * 0.5).collect::<Vec<_>>(), [5, 3]),
        TensorData::new((0..n).map(|i| i as i64 * 3).collect::<Vec<_>>(), [5, 3]),
        TensorData::new((0..n).map(|i| i as i32 % 3).collect::<Vec<_>>(), [5, 3]),
        TensorData::new((0..n).map(|i| i % 3 == 0).collect::<Vec<_>>(), [5, 3]),
    ] {
        each::<I, Float>(&device, &m, &d);
        each::<I, Int>(&device, &m, &d);
        each::<I, Bool>(&device, &m, &d);
    }
}

/// `gather`, `select`, `scatter` (add) and `select_assign` (add) along each dim of a `[5, 7]`
/// tensor in every layout: a sharded indexed dim runs masked per device (a pending sum for
/// `gather` and `select`, settled by `into_data`), an unsharded one per shard; gather's indices
/// repeat, select's hit both ends of the dim. Int `select` takes the masked path too.
pub fn masked_indexing<I: Backend>(device: I::Device) {
    use burn::tensor::IndexingUpdateOp::Add;
    type T<I, const D: usize, K = burn::tensor::Float> = Tensor<DistributedBackend<I>, D, K>;
    let m = mesh::<I>(&device);
    let shape = [5, 7];
    let d = data(shape, 3);
    let rep = |rank| Layout::replicated(&m, rank);
    for dim in 0..2 {
        let n = shape[dim];
        // Two indices (both ends) and one along `dim` for gather: few enough that the masked
        // lookups' all-reduce moves less than gathering the tensor, so they are chosen.
        let ids: Vec<i64> = vec![n as i64 - 1, 0];
        let di = TensorData::new(ids.clone(), [ids.len()]);
        let mut gshape = shape;
        gshape[dim] = 1;
        let gi: Vec<i64> = (0..gshape[0] * gshape[1])
            .map(|i| ((i * 5) % n) as i64)
            .collect();
        let gi = TensorData::new(gi, gshape);
        let gv = data(gshape, 4);
        let mut sshape = shape;
        sshape[dim] = ids.len();
        let sv = data(sshape, 5);
        let o = || oracle(&d);
        let oi =
            |x: &TensorData| Tensor::<NdArray, 1, Int>::from_data(x.clone(), &Default::default());
        let oi2 =
            |x: &TensorData| Tensor::<NdArray, 2, Int>::from_data(x.clone(), &Default::default());
        let want = [
            o().gather(dim, oi2(&gi)).into_data(),
            o().select(dim, oi(&di)).into_data(),
            o().scatter(dim, oi2(&gi), oracle(&gv), Add).into_data(),
            o().select_assign(dim, oi(&di), oracle(&sv), Add)
                .into_data(),
        ];
        let ti: Vec<i64> = (0..shape[0] * shape[1])
            .map(|i| i as i64 * 3 - 20)
            .collect();
        let ti = TensorData::new(ti, shape);
        let want_int = Tensor::<NdArray, 2, Int>::from_data(ti.clone(), &Default::default())
            .select(dim, oi(&di))
            .into_data();
        for l in layouts(&m) {
            let x = || {
                distribute::<DistributedBackend<I>, 2, burn::tensor::Float>(d.clone(), &l).unwrap()
            };
            let idx = || distribute::<DistributedBackend<I>, 1, Int>(di.clone(), &rep(1)).unwrap();
            let gidx = || distribute::<DistributedBackend<I>, 2, Int>(gi.clone(), &rep(2)).unwrap();
            let v = |x: &TensorData| -> T<I, 2> { distribute(x.clone(), &rep(2)).unwrap() };
            let got = [
                x().gather(dim, gidx()).into_data(),
                x().select(dim, idx()).into_data(),
                x().scatter(dim, gidx(), v(&gv), Add).into_data(),
                x().select_assign(dim, idx(), v(&sv), Add).into_data(),
            ];
            for (g, w) in got.into_iter().zip(&want) {
                g.convert::<f32>().assert_approx_eq::<f32>(w, tol());
            }
            let int = distribute::<DistributedBackend<I>, 2, Int>(ti.clone(), &l).unwrap();
            assert_eq!(
                int.select(dim, idx()).into_data().convert::<i64>(),
                want_int.clone().convert::<i64>(),
                "int select along {dim} on {l}"
            );
        }
    }
}

/// A convolution and a transposed convolution of an image sharded over its height and width
/// (halo exchanges and their adjoint, the inner backend's `conv2d` and its input and weight
/// gradients per device), and over batch and height: the output, the input's, weight's and
/// bias's gradients against the inner backend's `Autodiff` on the whole tensors (same padding,
/// stride 2; the transposed one with an output padding at stride 2).
pub fn spatial_convolution<I: Backend>(device: I::Device) {
    use burn::tensor::module::{conv_transpose2d, conv2d};
    use burn::tensor::ops::{ConvOptions, ConvTransposeOptions};
    type Ad<I> = burn::backend::Autodiff<I>;
    type Dd<I> = burn::backend::Autodiff<DistributedBackend<I>>;
    let m = mesh::<I>(&device);
    let wave = |n: usize, f: f32| (0..n).map(|i| (i as f32 * f).sin()).collect::<Vec<_>>();
    let (dx, dw, db) = (
        TensorData::new(wave(2 * 3 * 9 * 8, 0.31), [2, 3, 9, 8]),
        TensorData::new(wave(4 * 3 * 3 * 3, 0.53), [4, 3, 3, 3]),
        TensorData::new(wave(4, 0.7), [4]),
    );
    /// A 3x3 convolution of padding 1, or the transposed one (output padding `stride - 1`, the
    /// weight's values as `[channels_in 3, channels_out 4, 3, 3]`).
    fn op<B: Backend>(
        (x, w, b): (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 1>),
        stride: usize,
        transposed: bool,
    ) -> Tensor<B, 4> {
        let (s, p) = ([stride; 2], [1; 2]);
        if transposed {
            let o = ConvTransposeOptions::new(s, p, [stride - 1; 2], [1, 1], 1);
            conv_transpose2d(x, w.reshape([3, 4, 3, 3]), Some(b), o)
        } else {
            conv2d(x, w, Some(b), ConvOptions::new(s, p, [1, 1], 1))
        }
    }
    for (stride, transposed) in [(1, false), (2, false), (1, true), (2, true)] {
        let run = |x: Tensor<Ad<I>, 4>, w: Tensor<Ad<I>, 4>, b: Tensor<Ad<I>, 1>| {
            let y = op((x.clone(), w.clone(), b.clone()), stride, transposed);
            let g = (y.clone() * y.clone().sin()).sum().backward();
            let grad = |t: &Tensor<Ad<I>, 4>| t.grad(&g).unwrap().into_data().convert::<f32>();
            let gb = b.grad(&g).unwrap().into_data().convert::<f32>();
            [y.into_data().convert::<f32>(), grad(&x), grad(&w), gb]
        };
        let want = run(
            Tensor::from_data(dx.clone(), &device).require_grad(),
            Tensor::from_data(dw.clone(), &device).require_grad(),
            Tensor::from_data(db.clone(), &device).require_grad(),
        );
        for spec in [
            ["unsharded", "unsharded", "a", "b"],
            ["a", "unsharded", "b", "unsharded"],
        ] {
            let xl = Layout::new(&m, spec).unwrap();
            let x: Tensor<Dd<I>, 4> = distribute(dx.clone(), &xl).unwrap();
            let rep = |r| Layout::replicated(&m, r);
            let w: Tensor<Dd<I>, 4> = distribute(dw.clone(), &rep(4)).unwrap();
            let b: Tensor<Dd<I>, 1> = distribute(db.clone(), &rep(1)).unwrap();
            let (x, w, b) = (x.require_grad(), w.require_grad(), b.require_grad());
            let y = op((x.clone(), w.clone(), b.clone()), stride, transposed);
            let ctx = format!("stride {stride}, transposed {transposed}, on {xl}");
            assert_eq!(y.layout().dims(), xl.dims(), "{ctx}");
            let g = (y.clone() * y.clone().sin()).sum().backward();
            let gx = x.grad(&g).unwrap();
            assert_eq!(gx.layout().dims(), xl.dims(), "{ctx}");
            let got = [
                y.into_data().convert::<f32>(),
                gx.into_data().convert::<f32>(),
                w.grad(&g).unwrap().into_data().convert::<f32>(),
                b.grad(&g).unwrap().into_data().convert::<f32>(),
            ];
            // The output, then the input's, weight's and bias's gradients.
            for (g, w) in got.iter().zip(&want) {
                g.assert_approx_eq::<f32>(w, tol());
            }
        }
    }
}

/// Pools of an image sharded over its height and width (halo exchanges, the window's padding
/// filled with `-inf` for the max pool, the inner backend's pools and their backward passes per
/// device, the max pool's indices mapped between windows and the global plane; the global
/// average as a pending sum): the outputs, the indices and the input's gradient against the
/// inner backend's `Autodiff` on the whole tensor.
pub fn spatial_pools<I: Backend>(device: I::Device) {
    use burn::tensor::module::{
        adaptive_avg_pool2d, avg_pool2d, max_pool2d, max_pool2d_with_indices,
    };
    type Ad<I> = burn::backend::Autodiff<I>;
    type Dd<I> = burn::backend::Autodiff<DistributedBackend<I>>;
    let m = mesh::<I>(&device);
    let wave = |n: usize, f: f32| (0..n).map(|i| (i as f32 * f).sin()).collect::<Vec<_>>();
    let dx = TensorData::new(wave(2 * 3 * 11 * 10, 0.37), [2, 3, 11, 10]);
    fn run<B: burn::tensor::backend::AutodiffBackend>(x: Tensor<B, 4>) -> [TensorData; 5] {
        let y = max_pool2d(x.clone(), [3, 3], [2, 2], [1, 1], [1, 1], false);
        let z = avg_pool2d(x.clone(), [3, 3], [1, 1], [1, 1], true, false);
        let (_, ix) = max_pool2d_with_indices(x.clone(), [2, 2], [1, 1], [0, 0], [1, 1], false);
        // The global average: a pending sum over the spatial axes, its backward per block.
        let a = adaptive_avg_pool2d(x.clone(), [1, 1]);
        let loss = (y.clone() * y.clone().cos()).sum()
            + (z.clone() * z.clone().sin()).sum()
            + (a.clone() * a.clone().exp()).sum();
        let g = loss.backward();
        let f = |t: Tensor<B, 4>| t.into_data().convert::<f32>();
        [
            f(y),
            f(z),
            f(a),
            ix.into_data().convert::<i64>(),
            x.grad(&g).unwrap().into_data().convert::<f32>(),
        ]
    }
    let want = run::<Ad<I>>(Tensor::from_data(dx.clone(), &device).require_grad());
    for spec in [
        ["unsharded", "unsharded", "a", "b"],
        ["a", "b", "unsharded", "unsharded"],
        ["unsharded", "a", "b", "unsharded"],
    ] {
        let xl = Layout::new(&m, spec).unwrap();
        let x: Tensor<Dd<I>, 4> = distribute(dx.clone(), &xl).unwrap();
        let got = run::<Dd<I>>(x.require_grad());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            if i == 3 {
                assert_eq!(g, w, "indices on {xl}");
            } else {
                g.assert_approx_eq::<f32>(w, tol());
            }
        }
    }
}

/// The suite's tests, instantiated per backend by `common::suite!`.
macro_rules! backend_suite {
    ($name:ident, $backend:ty, $device:expr) => {
        suite!(
            $name,
            $backend,
            $device,
            [
                matmul,
                reductions,
                relayouts,
                sliced_shards,
                empty_shards,
                gradients,
                deferred_partials,
                narrow_model_products,
                created_dtypes,
                masked_indexing,
                spatial_convolution,
                spatial_pools
            ]
        );
    };
}

backend_suite!(flex, burn::backend::Flex, Default::default());
backend_suite!(ndarray, burn::backend::NdArray, Default::default());
#[cfg(feature = "wgpu")]
backend_suite!(
    wgpu,
    crate::common::WgpuPlain,
    burn::backend::wgpu::WgpuDevice::Cpu
);
// With the `fusion` feature, `burn::backend::Wgpu` is `Fusion<CubeBackend<..>>`: the same suite
// on the fused backend (the CubeCL collective kernels do not apply there; the generic path runs).
#[cfg(feature = "fusion")]
backend_suite!(
    wgpu_fusion,
    burn::backend::Wgpu,
    burn::backend::wgpu::WgpuDevice::Cpu
);
#[cfg(feature = "cuda")]
backend_suite!(cuda, crate::common::CudaPlain, Default::default());
// With `fusion` too, `burn::backend::Cuda` is `Fusion<CubeBackend<CudaRuntime>>`: the suite on
// the fused Cuda backend, as on fused Wgpu.
#[cfg(all(feature = "cuda", feature = "fusion"))]
backend_suite!(cuda_fusion, burn::backend::Cuda, Default::default());

/// `from_local_shards` refuses a shard on another device than its mesh position's, naming both:
/// Wgpu's `Cpu` and `DefaultDevice` are two devices of a mesh, and both shards are made on the
/// first (no op runs on the second).
#[cfg(feature = "wgpu")]
#[test]
fn a_shard_on_another_device_is_a_typed_error() {
    use burn::backend::wgpu::WgpuDevice;
    use burn_dtensor::{DTensorError, from_local_shards};
    let m = Mesh::new([("x", 2)], vec![WgpuDevice::Cpu, WgpuDevice::DefaultDevice]).unwrap();
    let rows = Layout::batch_sharded(&m, "x", 2).unwrap();
    let shards = vec![Tensor::<common::WgpuPlain, 2>::zeros([1, 3], &WgpuDevice::Cpu); 2];
    let err = from_local_shards(shards, [2, 3], &rows).unwrap_err();
    assert!(
        matches!(&err, DTensorError::ShardDeviceMismatch { index: 1, found, expected }
            if found.contains("Cpu") && expected.contains("DefaultDevice")),
        "{err}"
    );
    assert!(err.to_string().contains("to_device"), "{err}");
}
