//! The decorator on NdArray in one process: ops against the whole-tensor oracle, shard-local
//! random creation, layout-mapped initialisation, sharded checkpoints (damaged ones too); with the layout map on
//! real modules, the differentiable relayout and the sharding tables as submodules (one test
//! binary: one link and one set of `DistributedBackend<NdArray>` instantiations, not four).

use burn::backend::NdArray;
use burn::tensor::{Tensor, TensorData, Tolerance};
use burn_dtensor::*;

type Inner = NdArray;
type B = DistributedBackend<Inner>;

#[path = "smoke/damaged_checkpoint.rs"]
mod damaged_checkpoint;
#[path = "smoke/layout_map.rs"]
mod layout_map;
#[path = "smoke/relayout_grad.rs"]
mod relayout_grad;
#[path = "smoke/visualize.rs"]
mod visualize;

fn mesh(axes: &[(&str, usize)]) -> Mesh<burn::backend::ndarray::NdArrayDevice> {
    Mesh::virtual_devices(
        axes.iter().map(|(a, s)| (a.to_string(), *s)),
        Default::default(),
    )
    .unwrap()
}

fn data(shape: [usize; 2], seed: u32) -> TensorData {
    let n = shape[0] * shape[1];
    TensorData::new(
        (0..n)
            .map(|i| (((i as u32).wrapping_mul(2654435761u32) ^ seed) % 1000) as f32 / 100.0 - 5.0)
            .collect::<Vec<_>>(),
        shape,
    )
}

#[test]
fn smoke_matmul_sum_mean_uneven() {
    let m = mesh(&[("batch", 4), ("model", 2)]);
    let dev = Default::default();
    let xd = data([7, 5], 1);
    let wd = data([5, 3], 2);
    let x: Tensor<B, 2> =
        distribute(xd.clone(), &Layout::new(&m, ["batch", "model"]).unwrap()).unwrap();
    let w: Tensor<B, 2> = distribute(
        wd.clone(),
        &Layout::new(&m, ["model", "unsharded"]).unwrap(),
    )
    .unwrap();
    let xr = Tensor::<Inner, 2>::from_data(xd, &dev);
    let wr = Tensor::<Inner, 2>::from_data(wd, &dev);
    let (y, log) = record_comms(|| x.clone().matmul(w.clone()));
    assert_eq!(log.events.len(), 0, "{log}");
    println!("{}", y.describe());
    y.clone().into_data().assert_approx_eq::<f32>(
        &xr.clone().matmul(wr.clone()).into_data(),
        Tolerance::default(),
    );
    x.clone()
        .mean_dim(0)
        .into_data()
        .assert_approx_eq::<f32>(&xr.clone().mean_dim(0).into_data(), Tolerance::default());
    x.clone()
        .sum()
        .into_data()
        .assert_approx_eq::<f32>(&xr.clone().sum().into_data(), Tolerance::default());
    x.clone()
        .max_dim(1)
        .into_data()
        .assert_approx_eq::<f32>(&xr.clone().max_dim(1).into_data(), Tolerance::default());
    let v = x.clone().var(0);
    v.into_data()
        .assert_approx_eq::<f32>(&xr.clone().var(0).into_data(), Tolerance::default());
    let s = burn::tensor::activation::softmax(x.clone(), 1);
    s.into_data().assert_approx_eq::<f32>(
        &burn::tensor::activation::softmax(xr.clone(), 1).into_data(),
        Tolerance::default(),
    );
    let r = x
        .clone()
        .relayout(&Layout::new(&m, ["model", "batch"]).unwrap())
        .unwrap();
    println!("{}", r.describe());
    // In one process, gathering to process 0 is `into_data`; there is no process 1.
    let gathered = r.clone().gather_to_process(0).unwrap().expect("process 0");
    gathered.assert_eq(&xr.into_data(), true);
    assert!(matches!(
        r.gather_to_process(1),
        Err(DTensorError::NoSuchProcess {
            process: 1,
            size: 1
        })
    ));
}

/// A creation-layout policy shards every tensor created on the mesh (from data, `zeros`,
/// `arange`), each device holding its chunk, and values are those of the inner backend.
#[test]
fn creation_sharding_policy_lays_out_created_tensors() {
    use burn::tensor::Int;
    let m = mesh(&[("a", 2), ("b", 2)])
        .with_creation_sharding(["a", "b"])
        .unwrap();
    let device = DistributedDevice::new(m.clone());
    let xd = data([3, 5], 7);
    let x = Tensor::<B, 2>::from_data(xd.clone(), &device);
    assert_eq!(x.describe(), "f32[3@a, 5@b]");
    // Device 3 = (a 1, b 1): rows 2..3, columns 3..5 (uneven chunks).
    let shard = x.clone().to_local_shards()[3].to_data();
    let full = xd.to_vec::<f32>().unwrap();
    assert_eq!(shard.to_vec::<f32>().unwrap(), vec![full[13], full[14]]);
    let y = (x.clone() * 2.0).sum_dim(1);
    let yr = (Tensor::<Inner, 2>::from_data(xd, &Default::default()) * 2.0).sum_dim(1);
    y.into_data()
        .assert_approx_eq::<f32>(&yr.into_data(), Tolerance::default());
    // Rank 1: only the first entry of the policy applies.
    let i = Tensor::<B, 1, Int>::arange(0..3, &device);
    assert_eq!(i.layout().sharding_spec(), vec!["a".to_string()]);
    assert_eq!(i.into_data().to_vec::<i64>().unwrap(), vec![0, 1, 2]);
    assert_eq!(
        Tensor::<B, 2>::zeros([1, 2], &device).describe(),
        "f32[1@a, 2@b]"
    );
    // Bad policies are typed errors.
    assert!(matches!(
        m.with_creation_sharding(["c"]),
        Err(DTensorError::UnknownAxis { .. })
    ));
    assert!(matches!(
        m.with_creation_sharding(["a", "a"]),
        Err(DTensorError::AxisUsedTwice { .. })
    ));
}

// ---------------------------------------------------------------------------------------------
// Shard-local creation: random values independent of the layout, distributions, layout-mapped
// initialisation
// ---------------------------------------------------------------------------------------------

/// The decorator's random stream is process-global: tests that seed and draw hold this lock.
static RNG_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn rng_lock() -> std::sync::MutexGuard<'static, ()> {
    RNG_LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Every rank-2 creation spec of a mesh with axes `a`, `b` (each dim unsharded or on one axis).
fn creation_specs() -> Vec<[&'static str; 2]> {
    let opts = ["unsharded", "a", "b"];
    let mut out = Vec::new();
    for d0 in opts {
        for d1 in opts {
            if d0 != d1 || d0 == "unsharded" {
                out.push([d0, d1]);
            }
        }
    }
    out
}

/// Draws `[5, 7]` of `dist` after seeding, on `device`.
fn draw<I: burn::tensor::backend::Backend>(
    dist: burn::tensor::Distribution,
    device: &DistributedDevice<I::Device>,
) -> Tensor<DistributedBackend<I>, 2> {
    use burn::tensor::Element;
    use burn::tensor::backend::Backend;
    DistributedBackend::<I>::seed(device, 11);
    // The dtype explicitly: Burn keys default dtypes by device, which the f32 and f64 backends
    // share here.
    Tensor::random([5, 7], dist, (device, I::FloatElem::dtype()))
}

/// Random creation gives bitwise the values of the mesh of one for every distribution, float
/// type, mesh (2x2, 3x1: uneven and empty shards), creation layout and execution mode, and each
/// device holds exactly its box of those values.
fn random_is_layout_free<I: burn::tensor::backend::Backend>() {
    use burn::tensor::Distribution as Dn;
    let dev = I::Device::default();
    let dists = [
        Dn::Default,
        Dn::Uniform(-2.0, 3.0),
        Dn::Normal(0.5, 2.0),
        Dn::Bernoulli(0.3),
    ];
    let one = DistributedDevice::new(Mesh::single(dev.clone()));
    for dist in dists {
        let want = draw::<I>(dist, &one).into_data();
        for axes in [[("a", 2), ("b", 2)], [("a", 3), ("b", 1)]] {
            let base =
                Mesh::virtual_devices(axes.iter().map(|(a, s)| (a.to_string(), *s)), dev.clone())
                    .unwrap();
            for stacked in [true, false] {
                for spec in creation_specs() {
                    let m = base
                        .with_stacked_execution(stacked)
                        .with_creation_sharding(spec)
                        .unwrap();
                    let got = draw::<I>(dist, &DistributedDevice::new(m.clone()));
                    let what = format!("{dist:?} on {m} stacked={stacked} {spec:?}");
                    assert_eq!(got.layout(), Layout::new(&m, spec).unwrap(), "{what}");
                    got.clone().into_data().assert_eq(&want, true);
                    let whole = Tensor::<I, 2>::from_data(want.clone(), (&dev, want.dtype));
                    for (i, shard) in got.to_local_shards().into_iter().enumerate() {
                        let r = Layout::new(&m, spec).unwrap().shard_ranges(&[5, 7], i);
                        let cut = whole.clone().slice([r[0].clone(), r[1].clone()]);
                        shard.into_data().assert_eq(&cut.into_data(), true);
                    }
                }
            }
        }
    }
}

#[test]
fn random_values_do_not_depend_on_the_layout() {
    let _g = rng_lock();
    random_is_layout_free::<NdArray<f32>>();
    random_is_layout_free::<NdArray<f64>>();
}

/// Kolmogorov-Smirnov statistic of `xs` against `cdf`.
fn ks(mut xs: Vec<f64>, cdf: impl Fn(f64) -> f64) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len() as f64;
    xs.iter()
        .enumerate()
        .map(|(i, &x)| {
            let f = cdf(x);
            (f - i as f64 / n).abs().max(((i + 1) as f64 / n - f).abs())
        })
        .fold(0.0, f64::max)
}

/// The standard normal CDF (`erfc` by W. J. Cody's rational Chebyshev form as in Numerical
/// Recipes' `erfcc`, relative error below 1.2e-7).
fn normal_cdf(x: f64) -> f64 {
    let z = (x / std::f64::consts::SQRT_2).abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t
        * (-z * z - 1.26551223
            + t * (1.00002368
                + t * (0.37409196
                    + t * (0.09678418
                        + t * (-0.18628806
                            + t * (0.27886807
                                + t * (-1.13520398
                                    + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))))))))
            .exp();
    if x >= 0.0 { 1.0 - 0.5 * r } else { 0.5 * r }
}

/// Each distribution is right, drawn sharded over 8 devices: mean and variance within 5
/// standard errors, and the Kolmogorov-Smirnov distance below its 1% critical value
/// (1.63 / sqrt(n)), for uniform and normal in f32 and f64; Bernoulli's rate; integers uniform
/// on `[lo, hi)` with every value about equally often.
#[test]
fn random_distributions_are_right() {
    use burn::tensor::Distribution as Dn;
    use burn::tensor::backend::Backend;
    let _g = rng_lock();
    let n = 1 << 17;
    let m = mesh(&[("a", 4), ("b", 2)])
        .with_creation_sharding(["a", "b"])
        .unwrap();
    let dv = DistributedDevice::new(m);
    let crit = 1.63 / (n as f64).sqrt();
    let moments = |xs: &[f64]| {
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (xs.len() - 1) as f64;
        (mean, var)
    };
    let draw32 = |d: Dn| -> Vec<f64> {
        let t = Tensor::<B, 2>::random([n / 64, 64], d, &dv);
        t.into_data()
            .to_vec::<f32>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect()
    };
    type B64 = DistributedBackend<NdArray<f64>>;
    let draw64 = |d: Dn| -> Vec<f64> {
        let t = Tensor::<B64, 2>::random([n / 64, 64], d, (&dv, burn::tensor::DType::F64));
        t.into_data().to_vec::<f64>().unwrap()
    };
    B::seed(&dv, 5);
    for xs in [
        draw32(Dn::Uniform(-1.0, 3.0)),
        draw64(Dn::Uniform(-1.0, 3.0)),
    ] {
        let (mean, var) = moments(&xs);
        let se = (16.0 / 12.0 / n as f64).sqrt();
        assert!((mean - 1.0).abs() < 5.0 * se, "uniform mean {mean}");
        assert!((var - 16.0 / 12.0).abs() < 0.02, "uniform var {var}");
        assert!(xs.iter().all(|x| (-1.0..3.0).contains(x)));
        let d = ks(xs, |x| ((x + 1.0) / 4.0).clamp(0.0, 1.0));
        assert!(d < crit, "uniform KS {d} >= {crit}");
    }
    for xs in [draw32(Dn::Normal(1.0, 2.0)), draw64(Dn::Normal(1.0, 2.0))] {
        let (mean, var) = moments(&xs);
        assert!(
            (mean - 1.0).abs() < 5.0 * (4.0 / n as f64).sqrt(),
            "normal mean {mean}"
        );
        assert!(
            (var - 4.0).abs() < 5.0 * 4.0 * (2.0 / n as f64).sqrt(),
            "normal var {var}"
        );
        let d = ks(xs, |x| normal_cdf((x - 1.0) / 2.0));
        assert!(d < crit, "normal KS {d} >= {crit}");
    }
    for xs in [draw32(Dn::Bernoulli(0.3)), draw64(Dn::Bernoulli(0.3))] {
        assert!(xs.iter().all(|x| *x == 0.0 || *x == 1.0));
        let (mean, _) = moments(&xs);
        assert!(
            (mean - 0.3).abs() < 5.0 * (0.21 / n as f64).sqrt(),
            "bernoulli rate {mean}"
        );
    }
    let ints = Tensor::<B, 2, burn::tensor::Int>::random([n / 64, 64], Dn::Uniform(-3.0, 5.0), &dv);
    let v: Vec<i64> = ints.into_data().convert::<i64>().to_vec().unwrap();
    for k in -3..5 {
        let c = v.iter().filter(|x| **x == k).count() as f64;
        let e = n as f64 / 8.0;
        assert!(
            (c - e).abs() < 5.0 * (e * 7.0 / 8.0).sqrt(),
            "int {k}: {c} of {n}"
        );
    }
    assert!(v.iter().all(|x| (-3..5).contains(x)));
}

/// `arange` created sharded (uneven) is NdArray's `arange`, each device holding its chunk.
#[test]
fn arange_is_created_per_shard() {
    let m = mesh(&[("a", 3)]).with_creation_sharding(["a"]).unwrap();
    let dv = DistributedDevice::new(m.clone());
    for (range, step) in [(0..10, 1), (-7..20, 3), (4..4, 1)] {
        let got = Tensor::<B, 1, burn::tensor::Int>::arange_step(range.clone(), step, &dv);
        assert_eq!(got.layout(), Layout::new(&m, ["a"]).unwrap());
        let want =
            Tensor::<Inner, 1, burn::tensor::Int>::arange_step(range, step, &Default::default());
        got.into_data().assert_eq(&want.into_data(), true);
    }
    // A zero step is refused as on the inner backend (a panic, not an empty or endless range).
    let zero = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        Tensor::<B, 1, burn::tensor::Int>::arange_step(0..3, 0, &dv)
    }));
    assert!(zero.is_err());
}

/// A layout map applied to a freshly initialised module materialises each parameter directly
/// in its layout: no collective runs (nothing is relaid out), each device holds only its shard,
/// and the weights are those drawn on a mesh of one with the same seed.
#[test]
fn layout_mapped_init_creates_each_parameter_in_its_layout() {
    use burn::module::Module;
    use burn::nn::{Linear, LinearConfig};
    use burn::tensor::backend::Backend;
    let _g = rng_lock();
    let m = mesh(&[("batch", 2), ("model", 4)]);
    let dv = DistributedDevice::new(m.clone());
    let map = LayoutMap::new()
        .rule(r"^weight$", ["unsharded", "model"])
        .unwrap()
        .rule(r"^bias$", ["model"])
        .unwrap();
    B::seed(&dv, 3);
    let (lin, log) = record_comms(|| {
        map.apply(LinearConfig::new(10, 6).init::<B>(&dv), m.topology())
            .unwrap()
            .0
    });
    assert!(
        log.events.is_empty(),
        "collectives during a layout-mapped init: {log}"
    );
    let w = lin.weight.val();
    assert_eq!(w.layout(), Layout::new(&m, ["unsharded", "model"]).unwrap());
    let one = DistributedDevice::new(Mesh::single(Default::default()));
    B::seed(&one, 3);
    let want: Linear<B> = LinearConfig::new(10, 6).init(&one);
    w.clone()
        .into_data()
        .assert_eq(&want.weight.val().into_data(), true);
    lin.bias
        .as_ref()
        .unwrap()
        .val()
        .into_data()
        .assert_eq(&want.bias.as_ref().unwrap().val().into_data(), true);
    // Each device drew only its [10, 2|1] block (6 over 4 is uneven).
    let shapes: Vec<Vec<usize>> = w
        .to_local_shards()
        .iter()
        .map(|s| s.dims().to_vec())
        .collect();
    assert_eq!(
        shapes[..4],
        [vec![10, 2], vec![10, 2], vec![10, 1], vec![10, 1]]
    );
    let _ = lin.num_params();
}

/// A scoped creation layout applies to tensors of its shape on its mesh only; a partial layout
/// or a shape of another rank is a typed error.
#[test]
fn with_creation_layout_scopes_by_shape() {
    let m = mesh(&[("a", 2)]);
    let dv = DistributedDevice::new(m.clone());
    let l = Layout::new(&m, ["a", "unsharded"]).unwrap();
    let (x, y) = with_creation_layout(&l, &[4, 3], || {
        (
            Tensor::<B, 2>::zeros([4, 3], &dv),
            Tensor::<B, 2>::zeros([3, 4], &dv),
        )
    })
    .unwrap();
    assert_eq!(x.layout(), l);
    assert!(y.layout().is_replicated());
    assert!(
        Tensor::<B, 2>::zeros([4, 3], &dv).layout().is_replicated(),
        "scope ended"
    );
    assert!(matches!(
        with_creation_layout(&l, &[4], || ()),
        Err(DTensorError::RankMismatch { .. })
    ));
    let partial = Layout::replicated(&m, 2).with_partial(0, ReduceOp::Sum);
    assert!(matches!(
        with_creation_layout(&partial, &[4, 3], || ()),
        Err(DTensorError::Unsupported(_))
    ));
}

/// Every settled layout of a rank-2 tensor on `m` (each dim unsharded or on one axis).
fn settled_layouts(m: &Mesh<burn::backend::ndarray::NdArrayDevice>) -> Vec<Layout> {
    let axes: Vec<String> = m.topology().axes().iter().map(|(a, _)| a.clone()).collect();
    let mut opts = vec![UNSHARDED.to_string()];
    opts.extend(axes);
    let mut out = Vec::new();
    for a in &opts {
        for b in &opts {
            if a != UNSHARDED && a == b {
                continue;
            }
            out.push(Layout::new(m, [a.as_str(), b.as_str()]).unwrap());
        }
    }
    out
}

fn scratch(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("dtensor-smoke-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A sharded checkpoint written under any layout (uneven and replicated shards, a pending sum)
/// reads back bitwise under every layout of other meshes; each distinct shard is written once
/// (a replicated tensor once in all); int and bool tensors too; reading a box gives exactly that
/// box of the global value.
#[test]
fn sharded_checkpoint_reshards_on_load() {
    use burn::tensor::{Bool, Int};
    use burn_dtensor::checkpoint::{Checkpoint, SaveOptions, StateDict, save};
    let root = scratch("reshard");
    let want = data([5, 7], 9);
    let ints = TensorData::new((0..6).map(|i| i * 7 - 20).collect::<Vec<i64>>(), [6]);
    let bools = TensorData::new((0..12).map(|i| i % 3 == 0).collect::<Vec<bool>>(), [3, 4]);
    let meshes = [
        mesh(&[("x", 2), ("y", 2)]),
        mesh(&[("x", 3), ("y", 1)]),
        mesh(&[("a", 4)]),
    ];
    let mut k = 0;
    for m in &meshes {
        for l in settled_layouts(m) {
            let dir = root.join(format!("c{k}"));
            k += 1;
            let x: Tensor<B, 2> = distribute(want.clone(), &l).unwrap();
            let mut state = StateDict::new();
            state.insert("x", x.clone()).unwrap();
            // A tensor with a pending sum: its settled value is saved.
            let half: Tensor<B, 2> = distribute(want.clone(), &l).unwrap() * 0.5;
            let halves = half.clone().into_data();
            let free = (0..m.topology().ndim()).find(|&a| l.axis_dim(a).is_none());
            let p = match free {
                Some(a) => half
                    .relayout(&l.clone().with_partial(a, ReduceOp::Sum))
                    .unwrap(),
                None => half,
            };
            assert_eq!(p.layout().is_partial(), free.is_some());
            state.insert("p", p).unwrap();
            let i: Tensor<B, 1, Int> = distribute(
                ints.clone(),
                &Layout::new(m, [m.topology().axis_name(0)]).unwrap(),
            )
            .unwrap();
            state.insert("i", i).unwrap();
            let b: Tensor<B, 2, Bool> = distribute(bools.clone(), &l).unwrap();
            state.insert("b", b).unwrap();
            assert!(matches!(
                state.insert("x", x),
                Err(DTensorError::Checkpoint { .. })
            ));
            let meta = save(&dir, state, &SaveOptions::default()).unwrap();
            // One shard per distinct box.
            let distinct: std::collections::BTreeSet<_> = (0..m.size())
                .map(|d| {
                    let r = l.shard_ranges(&[5, 7], d);
                    r.iter().map(|r| (r.start, r.end)).collect::<Vec<_>>()
                })
                .collect();
            assert_eq!(meta.tensors["x"].shards.len(), distinct.len(), "{l}");
            assert_eq!(meta.tensors["x"].sharding_spec, l.sharding_spec());
            let ckpt = Checkpoint::open(&dir).unwrap();
            for other in &meshes {
                for to in settled_layouts(other) {
                    let got: Tensor<B, 2> = ckpt.read("x", &to).unwrap();
                    assert_eq!(got.layout(), to);
                    got.into_data().assert_eq(&want, true);
                    let got: Tensor<B, 2> = ckpt.read("p", &to).unwrap();
                    got.into_data().assert_eq(&halves, true);
                    let got: Tensor<B, 2, Bool> = ckpt.read("b", &to).unwrap();
                    got.into_data().assert_eq(&bools, true);
                }
                let to = Layout::new(other, [other.topology().axis_name(0)]).unwrap();
                let got: Tensor<B, 1, Int> = ckpt.read("i", &to).unwrap();
                got.into_data().assert_eq(&ints, true);
            }
            let bx = ckpt.read_box("x", &[1..4, 2..7]).unwrap();
            let w: Vec<f32> = want.to_vec().unwrap();
            let sub: Vec<f32> = (1..4)
                .flat_map(|r| (2..7).map(move |c| (r, c)))
                .map(|(r, c)| w[r * 7 + c])
                .collect();
            assert_eq!(bx.to_vec::<f32>().unwrap(), sub);
        }
    }
    std::fs::remove_dir_all(&root).unwrap();
}

/// A module saved under one layout map loads into the same module under another mesh and layout
/// map bitwise, each parameter keeping the layout it is loaded into; the converter to a plain
/// backend gives the same values.
#[test]
fn sharded_checkpoint_loads_a_module_in_any_layout() {
    use burn::module::Module;
    use burn::nn::{Linear, LinearConfig};
    use burn::tensor::backend::Backend;
    use burn_dtensor::checkpoint::{Checkpoint, save_module};
    let _g = rng_lock();
    let root = scratch("module");
    let ma = mesh(&[("batch", 2), ("model", 2)]);
    let da = DistributedDevice::new(ma.clone());
    let model = LayoutMap::new()
        .rule(r"^weight$", ["unsharded", "model"])
        .unwrap()
        .rule(r"^bias$", ["model"])
        .unwrap();
    B::seed(&da, 11);
    let saved = model
        .apply(LinearConfig::new(9, 5).init::<B>(&da), ma.topology())
        .unwrap()
        .0;
    save_module(&root.join("ck"), &saved).unwrap();
    let mb = mesh(&[("x", 3)]);
    let db = DistributedDevice::new(mb.clone());
    let rows = LayoutMap::new()
        .rule(r"^weight$", ["x", "unsharded"])
        .unwrap();
    B::seed(&db, 12);
    let fresh = rows
        .apply(LinearConfig::new(9, 5).init::<B>(&db), mb.topology())
        .unwrap()
        .0;
    let ckpt = Checkpoint::open(&root.join("ck")).unwrap();
    let loaded: Linear<B> = ckpt.load_module(fresh).unwrap();
    assert_eq!(
        loaded.weight.val().layout(),
        Layout::new(&mb, ["x", "unsharded"]).unwrap()
    );
    loaded
        .weight
        .val()
        .into_data()
        .assert_eq(&saved.weight.val().into_data(), true);
    loaded
        .bias
        .as_ref()
        .unwrap()
        .val()
        .into_data()
        .assert_eq(&saved.bias.as_ref().unwrap().val().into_data(), true);
    // Out of the mesh: a plain NdArray module.
    let plain: Linear<Inner> = LinearConfig::new(9, 5).init(&Default::default());
    let plain = ckpt.load_module_whole(plain, &Default::default()).unwrap();
    plain
        .weight
        .val()
        .into_data()
        .assert_eq(&saved.weight.val().into_data(), true);
    // Another model: the parameter and both shapes are named.
    let other = LinearConfig::new(9, 6).init::<B>(&db);
    let e = ckpt.load_module(other).unwrap_err().to_string();
    assert!(
        e.contains("`weight`") && e.contains("[9, 5]") && e.contains("[9, 6]"),
        "{e}"
    );
    let _ = saved.num_params();
    std::fs::remove_dir_all(&root).unwrap();
}

/// What goes wrong is a typed error naming the tensor and the file: a damaged byte, a missing
/// shard file, an existing target, an uncommitted directory, an unknown tensor.
#[test]
fn sharded_checkpoint_errors_name_what_is_wrong() {
    use burn_dtensor::checkpoint::{Checkpoint, SaveOptions, StateDict, save};
    let root = scratch("errors");
    let m = mesh(&[("a", 2)]);
    let l = Layout::new(&m, ["a", "unsharded"]).unwrap();
    let x: Tensor<B, 2> = distribute(data([6, 4], 3), &l).unwrap();
    let mut state = StateDict::new();
    state.insert("enc.w", x.clone()).unwrap();
    let dir = root.join("ck");
    let meta = save(&dir, state, &SaveOptions::default()).unwrap();
    // The target exists.
    let mut again = StateDict::new();
    again.insert("enc.w", x.clone()).unwrap();
    let e = save(&dir, again, &SaveOptions::default()).unwrap_err();
    assert!(e.to_string().contains("already exists"), "{e}");
    // Not committed.
    let e = Checkpoint::open(&root).unwrap_err();
    assert!(e.to_string().contains("metadata.json"), "{e}");
    // Each shard file is a standard safetensors file holding its boxes.
    let shard = &meta.tensors["enc.w"].shards[1];
    let bytes = std::fs::read(dir.join(&shard.file)).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let view = st.tensor("enc.w@3,0").unwrap();
    assert_eq!(view.shape(), [3, 4]);
    let w: Vec<f32> = data([6, 4], 3).to_vec().unwrap();
    let got: Vec<f32> = view
        .data()
        .chunks(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(got, w[12..]);
    // A damaged byte in the second shard.
    let file = dir.join(&shard.file);
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[shard.byte_range.0 as usize + 5] ^= 0x40;
    std::fs::write(&file, &bytes).unwrap();
    let ckpt = Checkpoint::open(&dir).unwrap();
    let e = ckpt
        .read::<B, 2, burn::tensor::Float>("enc.w", &l)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`enc.w`") && e.contains("checksum") && e.contains(&shard.file),
        "{e}"
    );
    // The first shard alone still reads (only overlapping blocks are read and verified).
    ckpt.read_box("enc.w", &[0..3, 0..4]).unwrap();
    // A missing shard file.
    std::fs::remove_file(&file).unwrap();
    let e = ckpt.read_whole("enc.w").unwrap_err().to_string();
    assert!(e.contains("`enc.w`") && e.contains(&shard.file), "{e}");
    // An unknown tensor.
    let e = ckpt.read_whole("dec.w").unwrap_err().to_string();
    assert!(e.contains("`dec.w`") && e.contains("enc.w"), "{e}");
    // A float tensor read as an int one (before: its values truncated without a word); a
    // dtype of the same kind converts.
    let e = ckpt
        .read::<B, 2, burn::tensor::Int>("enc.w", &l)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`enc.w` is saved as F32 (kind Float) but read as kind Int"),
        "{e}"
    );
    std::fs::remove_dir_all(&root).unwrap();
}

/// Adam resumed from a sharded checkpoint continues exactly: the model and Adam's moments and
/// step count saved after 3 steps under one layout map, loaded into a fresh model and optimizer
/// under the same layouts, give the unbroken run's next 3 losses bitwise; under another mesh and
/// layout map, the same losses to float rounding.
#[test]
fn sharded_checkpoint_resumes_adam_exactly() {
    use burn::backend::Autodiff;
    use burn::nn::{Linear, LinearConfig};
    use burn::optim::{AdamConfig, GradientsParams, Optimizer};
    use burn::tensor::backend::Backend;
    use burn_dtensor::checkpoint::{Checkpoint, SaveOptions, StateDict, save};
    type AB = Autodiff<B>;
    let _g = rng_lock();
    let root = scratch("adam");
    let xd = data([8, 6], 4);
    let yd = data([8, 3], 5);
    fn run<O: Optimizer<Linear<AB>, AB>>(
        mut model: Linear<AB>,
        optim: &mut O,
        x: &Tensor<AB, 2>,
        y: &Tensor<AB, 2>,
        steps: usize,
    ) -> (Linear<AB>, Vec<f32>) {
        let mut losses = Vec::new();
        for _ in 0..steps {
            let loss = (model.forward(x.clone()) - y.clone()).powi_scalar(2).mean();
            losses.push(loss.clone().into_scalar());
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optim.step(1e-2, model, grads);
        }
        (model, losses)
    }
    let setup = |axes: &[(&str, usize)], w: [&str; 2], b: [&str; 1], seed: u64| {
        let m = mesh(axes);
        let dv = DistributedDevice::new(m.clone());
        let map = LayoutMap::new()
            .rule(r"^weight$", w)
            .unwrap()
            .rule(r"^bias$", b)
            .unwrap();
        AB::seed(&dv, seed);
        let model = map
            .apply(LinearConfig::new(6, 3).init::<AB>(&dv), m.topology())
            .unwrap()
            .0;
        let rows = Layout::new(&m, [m.topology().axis_name(0), "unsharded"]).unwrap();
        let x: Tensor<AB, 2> = distribute(xd.clone(), &rows).unwrap();
        let y: Tensor<AB, 2> = distribute(yd.clone(), &rows).unwrap();
        (model, x, y)
    };
    let a = [("batch", 2), ("model", 3)];
    let (model, x, y) = setup(&a, ["unsharded", "model"], ["model"], 5);
    let mut optim = AdamConfig::new().init::<AB, Linear<AB>>();
    let (model, _) = run(model, &mut optim, &x, &y, 3);
    let mut state = StateDict::from_module(&model).unwrap();
    state.insert_optimizer("optim", &model, &optim).unwrap();
    state.insert_counter("steps", 3).unwrap();
    let meta = save(&root.join("ck"), state, &SaveOptions::default()).unwrap();
    assert!(meta.tensors.contains_key("optim.weight.moment_2"));
    assert_eq!(meta.counters["optim.weight.time"], 3);
    let (_, unbroken) = run(model, &mut optim, &x, &y, 3);
    let ckpt = Checkpoint::open(&root.join("ck")).unwrap();
    assert_eq!(ckpt.counter("steps").unwrap(), 3);
    // Same layouts, fresh weights and optimizer: bitwise.
    let (fresh, x, y) = setup(&a, ["unsharded", "model"], ["model"], 77);
    let model = ckpt.load_module(fresh).unwrap();
    let optim = AdamConfig::new().init::<AB, Linear<AB>>();
    let mut optim = ckpt.load_optimizer("optim", &model, optim).unwrap();
    let (_, resumed) = run(model, &mut optim, &x, &y, 3);
    assert_eq!(resumed, unbroken);
    // Another mesh and layout map (rows of the weight over 4, uneven): to rounding.
    let (fresh, x, y) = setup(&[("x", 4)], ["x", "unsharded"], ["unsharded"], 78);
    let model = ckpt.load_module(fresh).unwrap();
    let optim = AdamConfig::new().init::<AB, Linear<AB>>();
    let mut optim = ckpt.load_optimizer("optim", &model, optim).unwrap();
    let (_, other) = run(model, &mut optim, &x, &y, 3);
    for (a, b) in other.iter().zip(&unbroken) {
        assert!(
            (a - b).abs() <= 1e-5 * b.abs().max(1.0),
            "{other:?} vs {unbroken:?}"
        );
    }
    // Without the optimizer state the run differs (the test can fail).
    let (fresh, x, y) = setup(&a, ["unsharded", "model"], ["model"], 79);
    let model = ckpt.load_module(fresh).unwrap();
    let mut optim = AdamConfig::new().init::<AB, Linear<AB>>();
    let (_, cold) = run(model, &mut optim, &x, &y, 3);
    assert_ne!(cold, unbroken);
    std::fs::remove_dir_all(&root).unwrap();
}

/// A checkpoint crosses the edge of the mesh both ways, optimizer state included: a plain
/// backend's model and Adam state saved whole (`from_module_whole`, `insert_optimizer_whole`,
/// an attribute) resume on a 4-position mesh with the weight's rows sharded (uneven), and a
/// sharded checkpoint resumes on the plain backend (`load_module_whole`,
/// `load_optimizer_whole`); both continue the plain unbroken run to float rounding, while a cold
/// optimizer does not.
#[test]
fn checkpoint_leaves_and_enters_the_mesh_with_adam_state() {
    use burn::backend::{Autodiff, NdArray};
    use burn::nn::{Linear, LinearConfig};
    use burn::optim::{AdamConfig, GradientsParams, Optimizer};
    use burn::tensor::backend::{AutodiffBackend, Backend};
    use burn_dtensor::checkpoint::{Checkpoint, SaveOptions, StateDict, save};
    type P = Autodiff<NdArray>;
    type AB = Autodiff<B>;
    let _g = rng_lock();
    let root = scratch("edge");
    let (xd, yd) = (data([8, 6], 4), data([8, 3], 5));
    fn run<A: AutodiffBackend, O: Optimizer<Linear<A>, A>>(
        mut model: Linear<A>,
        optim: &mut O,
        x: &Tensor<A, 2>,
        y: &Tensor<A, 2>,
        steps: usize,
    ) -> (Linear<A>, Vec<f32>) {
        let mut losses = Vec::new();
        for _ in 0..steps {
            let loss = (model.forward(x.clone()) - y.clone()).powi_scalar(2).mean();
            losses.push(
                loss.clone()
                    .into_data()
                    .convert::<f32>()
                    .to_vec::<f32>()
                    .unwrap()[0],
            );
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optim.step(1e-2, model, grads);
        }
        (model, losses)
    }
    let close = |a: &[f32], b: &[f32]| {
        a.len() == b.len()
            && a.iter()
                .zip(b)
                .all(|(a, b)| (a - b).abs() <= 1e-5 * b.abs().max(1.0))
    };
    let cpu = Default::default();
    let plain = |seed: u64| {
        P::seed(&cpu, seed);
        let m = LinearConfig::new(6, 3).init::<P>(&cpu);
        let x = Tensor::<P, 2>::from_data(xd.clone(), &cpu);
        let y = Tensor::<P, 2>::from_data(yd.clone(), &cpu);
        (m, x, y)
    };
    let sharded = |seed: u64| {
        let m = mesh(&[("x", 4)]);
        let dv = DistributedDevice::new(m.clone());
        AB::seed(&dv, seed);
        let map = LayoutMap::new()
            .rule(r"^weight$", ["x", "unsharded"])
            .unwrap();
        let model = map
            .apply(LinearConfig::new(6, 3).init::<AB>(&dv), m.topology())
            .unwrap()
            .0;
        let rows = Layout::new(&m, ["x", "unsharded"]).unwrap();
        let x: Tensor<AB, 2> = distribute(xd.clone(), &rows).unwrap();
        let y: Tensor<AB, 2> = distribute(yd.clone(), &rows).unwrap();
        (model, x, y)
    };
    // The plain run: 3 steps, saved whole, 3 more.
    let (model, x, y) = plain(5);
    let mut optim = AdamConfig::new().init::<P, Linear<P>>();
    let (model, _) = run(model, &mut optim, &x, &y, 3);
    let mut state = StateDict::from_module_whole(&model).unwrap();
    state
        .insert_optimizer_whole("optim", &model, &optim)
        .unwrap();
    state.insert_attribute("trainer", &("plain", 3u32)).unwrap();
    let meta = save(&root.join("plain"), state, &SaveOptions::default()).unwrap();
    assert_eq!(meta.tensors["optim.weight.moment_1"].shards.len(), 1);
    assert!(meta.tensors["weight"].mesh_axes.is_empty());
    let (_, unbroken) = run(model.clone(), &mut optim, &x, &y, 3);
    let (_, cold) = run(
        model,
        &mut AdamConfig::new().init::<P, Linear<P>>(),
        &x,
        &y,
        3,
    );
    assert!(
        !close(&cold, &unbroken),
        "a cold optimizer must give other losses"
    );
    let ckpt = Checkpoint::open(&root.join("plain")).unwrap();
    assert_eq!(
        ckpt.attribute::<(String, u32)>("trainer").unwrap(),
        ("plain".to_string(), 3)
    );
    assert!(ckpt.attribute::<u32>("trainer").is_err());
    assert!(ckpt.attribute::<u32>("missing").is_err());
    // ... enters the mesh.
    let (fresh, xs, ys) = sharded(70);
    let model = ckpt.load_module(fresh).unwrap();
    assert_eq!(model.weight.val().describe(), "f32[6@x, 3]");
    let optim = AdamConfig::new().init::<AB, Linear<AB>>();
    let mut optim = ckpt.load_optimizer("optim", &model, optim).unwrap();
    let (model, on_mesh) = run(model, &mut optim, &xs, &ys, 3);
    assert!(close(&on_mesh, &unbroken), "{on_mesh:?} vs {unbroken:?}");
    // The mesh's state saved sharded after those 3 steps ... leaves the mesh.
    let mut state = StateDict::from_module(&model).unwrap();
    state.insert_optimizer("optim", &model, &optim).unwrap();
    save(&root.join("mesh"), state, &SaveOptions::default()).unwrap();
    let ckpt = Checkpoint::open(&root.join("mesh")).unwrap();
    let (fresh, _, _) = plain(71);
    let back = ckpt.load_module_whole(fresh, &cpu).unwrap();
    let optim = AdamConfig::new().init::<P, Linear<P>>();
    let mut optim = ckpt.load_optimizer_whole("optim", &back, optim).unwrap();
    let (_, off_mesh) = run(back, &mut optim, &x, &y, 3);
    // The mesh's 3 steps and the plain backend's next 3 continue the plain run of 9 steps.
    let (model, x, y) = plain(5);
    let mut optim = AdamConfig::new().init::<P, Linear<P>>();
    let (_, nine) = run(model, &mut optim, &x, &y, 9);
    assert!(close(&nine[3..6], &on_mesh), "{nine:?} vs {on_mesh:?}");
    assert!(close(&nine[6..], &off_mesh), "{nine:?} vs {off_mesh:?}");
    std::fs::remove_dir_all(&root).unwrap();
}
