//! The IMDB MLP training step (global batch 64, 1200 -> 48 -> BatchNorm -> 2, SGD) in single,
//! data, model and spatial mode on 8 virtual devices, inner NdArray and Flex; forward-only
//! inference; the decorator's overhead (a mesh of one device against the bare backend); and a
//! larger MLP (20000 -> 4096 -> 2, global batch 256) in the three modes, with its per-device
//! parameter memory printed. With `--features wgpu` (`cuda`) the IMDB step also runs on Wgpu
//! (Cuda) when a device is found, and with `cuda` the large MLP too. On a GPU pass
//! `--warm-up-time 4`: CubeCL autotunes each new matmul shape on its first calls, which the
//! default 0.3 s warm-up leaves inside the samples (medians 2-18x too high, NOTES.md session 29).
//!
//! `DTENSOR_BENCH_FULL=1 cargo bench --bench imdb_step` (the large MLP at its real size; without
//! the variable it uses 200 -> 64 -> 2). Under `cargo test --all-targets` each bench runs once as
//! a smoke test.

use burn::backend::{Flex, NdArray};
use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::optim::SgdConfig;
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use burn_dtensor::{DTensorExt, LayoutMap};
use criterion::{Criterion, criterion_group};
use dtensor_imdb::model::ImdbMlp;
use dtensor_imdb::train::{Distributed, Mode, Placement, Single};

#[path = "common/mod.rs"]
mod common;
use common::{batch, imdb_train_step};

/// mimalloc rather than glibc's malloc: glibc returns the buffers freed at the end of a step to
/// the OS and page-faults them back in on the next (measured in NOTES.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn distributed_on<I: Backend>(mode: Mode, device: I::Device) -> Distributed<I> {
    Distributed::new(
        mode.default_mesh(),
        8,
        device,
        LayoutMap::from_toml_str(mode.default_layout_map()).unwrap(),
    )
    .unwrap()
}

/// The IMDB step in the four modes on inner backend `I`.
fn modes<I: Backend>(
    c: &mut Criterion,
    backend: &str,
    device: I::Device,
    dims: (usize, usize, usize),
) {
    for mode in [Mode::Single, Mode::Data, Mode::Model, Mode::Spatial] {
        let name = format!("imdb/{backend}/{mode:?}").to_lowercase();
        match mode {
            Mode::Single => bench_step(
                c,
                &name,
                &Single::<I> {
                    device: device.clone(),
                },
                dims,
                64,
            ),
            m => bench_step(c, &name, &distributed_on::<I>(m, device.clone()), dims, 64),
        }
    }
}

/// Whether a GPU backend finds a device here (benches skip it otherwise).
#[allow(dead_code)]
fn available<I: Backend>(device: &I::Device) -> bool {
    let d = device.clone();
    let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        Tensor::<I, 1>::zeros([1], &d).into_data()
    }))
    .is_ok();
    if !ok {
        eprintln!("skipped: no device for {}", std::any::type_name::<I>());
    }
    ok
}

fn bench_step<P: Placement>(
    c: &mut Criterion,
    name: &str,
    p: &P,
    dims: (usize, usize, usize),
    n: usize,
) {
    let (x, y) = batch(n, dims.0, 7);
    let device = p.device();
    let model = p
        .prepare_model(ImdbMlp::with_dims(dims.0, dims.1, dims.2, &device))
        .unwrap();
    let mut optim = SgdConfig::new().init();
    let mut slot = Some(model);
    c.bench_function(&format!("{name}/train_step"), |b| {
        b.iter(|| imdb_train_step(p, &mut slot, &mut optim, &x, &y))
    });
    let inference = slot.take().unwrap().valid();
    c.bench_function(&format!("{name}/inference"), |b| {
        b.iter(|| {
            let (xb, _) = p.valid_batch(x.clone(), y.clone()).unwrap();
            inference.forward(xb).into_data()
        })
    });
}

/// Parameter bytes held by each device.
struct Bytes(Vec<usize>);
impl<B: burn_dtensor::DistributedOps> ModuleVisitor<B> for Bytes {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let t = param.val();
        let l = t.layout();
        let shape = t.dims();
        for (i, b) in self.0.iter_mut().enumerate() {
            *b += l.shard_shape(&shape, i).iter().product::<usize>() * 4;
        }
    }
}

fn imdb(c: &mut Criterion) {
    let dims = (1200, 48, 2);
    modes::<NdArray>(c, "ndarray", Default::default(), dims);
    modes::<Flex>(c, "flex", Default::default(), dims);
    #[cfg(feature = "wgpu")]
    if available::<burn::backend::Wgpu>(&burn::backend::wgpu::WgpuDevice::Cpu) {
        modes::<burn::backend::Wgpu>(c, "wgpu", burn::backend::wgpu::WgpuDevice::Cpu, dims);
    }
    #[cfg(feature = "cuda")]
    if available::<burn::backend::Cuda>(&Default::default()) {
        modes::<burn::backend::Cuda>(c, "cuda", Default::default(), dims);
    }
    // Decorator overhead: a mesh of one device against the bare backend.
    let one =
        Distributed::<NdArray>::new("batch=1", 1, Default::default(), LayoutMap::new()).unwrap();
    bench_step(c, "overhead/ndarray/mesh_of_one", &one, dims, 64);
    bench_step(
        c,
        "overhead/ndarray/bare",
        &Single::<NdArray> {
            device: Default::default(),
        },
        dims,
        64,
    );
}

fn large(c: &mut Criterion) {
    large_on::<NdArray>(c, "", Default::default());
    // On a GPU the large MLP is the step that sharding is for (the IMDB MLP is launch-bound).
    #[cfg(feature = "cuda")]
    if available::<burn::backend::Cuda>(&Default::default()) {
        large_on::<burn::backend::Cuda>(c, "cuda/", Default::default());
    }
}

/// The large MLP, single device and the three modes on 8 virtual devices of inner `I`
/// (`prefix` names the backend in the bench ids; empty for NdArray).
fn large_on<I: Backend>(c: &mut Criterion, prefix: &str, device: I::Device) {
    // The real sizes in release benches; small ones when run as a test.
    let (dims, n) = if full() {
        ((20000, 4096, 2), 256)
    } else {
        ((200, 64, 2), 32)
    };
    let one = Distributed::<I>::new("batch=1", 1, device.clone(), LayoutMap::new()).unwrap();
    let mut v = Bytes(vec![0]);
    ImdbMlp::<<Distributed<I> as Placement>::AD>::with_dims(dims.0, dims.1, dims.2, &one.device())
        .visit(&mut v);
    let single_bytes = v.0[0];
    eprintln!("large MLP {dims:?}: single-device parameter bytes {single_bytes}");
    bench_step(
        c,
        &format!("large_mlp/{prefix}single"),
        &Single::<I> {
            device: device.clone(),
        },
        dims,
        n,
    );
    for mode in [Mode::Data, Mode::Model, Mode::Spatial] {
        let p = distributed_on::<I>(mode, device.clone());
        let m = p
            .prepare_model(ImdbMlp::with_dims(dims.0, dims.1, dims.2, &p.device()))
            .unwrap();
        let mut v = Bytes(vec![0; 8]);
        m.visit(&mut v);
        eprintln!(
            "large MLP {prefix}{mode:?} [{}]: per-device parameter bytes {:?} ({:.3} of single)",
            p.mesh,
            v.0[0],
            v.0[0] as f64 / single_bytes as f64
        );
        bench_step(
            c,
            &format!("large_mlp/{prefix}{mode:?}").to_lowercase(),
            &p,
            dims,
            n,
        );
    }
}

fn full() -> bool {
    std::env::var_os("DTENSOR_BENCH_FULL").is_some()
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(20)
        .warm_up_time(std::time::Duration::from_millis(300))
        .measurement_time(std::time::Duration::from_secs(2))
}

/// Runs `n` training steps and returns the seconds they took ([`stepper`]).
type Stepper = Box<dyn FnMut(usize) -> f64>;

/// `steps` training steps of the IMDB MLP on placement `p` (a model and an optimizer of its own,
/// made here), as a closure that runs them and returns the seconds they took: one contender of
/// [`interleaved`].
fn stepper<P: Placement + 'static>(p: P, dims: (usize, usize, usize)) -> Stepper {
    let (x, y) = batch(64, dims.0, 7);
    let device = p.device();
    let mut slot = Some(
        p.prepare_model(ImdbMlp::with_dims(dims.0, dims.1, dims.2, &device))
            .unwrap(),
    );
    let mut optim = SgdConfig::new().init();
    Box::new(move |steps| {
        let t = std::time::Instant::now();
        for _ in 0..steps {
            imdb_train_step(&p, &mut slot, &mut optim, &x, &y);
        }
        t.elapsed().as_secs_f64()
    })
}

/// The four modes of the IMDB step on inner backend `I`, in interleaved rounds: every round
/// runs `steps` steps of each mode back to back (the order rotating from round to round), so
/// that a slow stretch of a noisy machine slows every mode of that round alike. Prints, per
/// mode, the median step time over the rounds and the median over rounds of the ratio to the
/// single device's step in the same round (the issue 22 figure: the sharded step over the bare
/// backend's), with its range.
fn interleaved<I: Backend>(backend: &str, device: I::Device, rounds: usize, steps: usize)
where
    I::Device: 'static,
{
    let dims = (1200, 48, 2);
    // `DTENSOR_BENCH_MODES=model` (or `single,spatial`): those modes alone, for a profiler
    // (ratios are to the first mode listed).
    let only = std::env::var("DTENSOR_BENCH_MODES").ok();
    let mut contenders: Vec<(Mode, Stepper)> =
        [Mode::Single, Mode::Data, Mode::Model, Mode::Spatial]
            .into_iter()
            .filter(|m| {
                only.as_deref().is_none_or(|o| {
                    o.split(',')
                        .any(|w| w.trim() == format!("{m:?}").to_lowercase())
                })
            })
            .map(|mode| {
                let run = match mode {
                    Mode::Single => stepper(
                        Single::<I> {
                            device: device.clone(),
                        },
                        dims,
                    ),
                    m => stepper(distributed_on::<I>(m, device.clone()), dims),
                };
                (mode, run)
            })
            .collect();
    for (_, run) in &mut contenders {
        run(steps / 4 + 1); // warm-up
    }
    let k = contenders.len();
    let mut times = vec![Vec::with_capacity(rounds); k];
    for r in 0..rounds {
        for j in 0..k {
            let i = (r + j) % k;
            times[i].push(contenders[i].1(steps) / steps as f64);
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!("imdb/{backend}: {rounds} interleaved rounds of {steps} steps");
    let first = contenders
        .first()
        .map(|(m, _)| format!("{m:?}").to_lowercase())
        .expect("DTENSOR_BENCH_MODES names at least one of single, data, model, spatial");
    for (i, (mode, _)) in contenders.iter().enumerate() {
        let ratios: Vec<f64> = (0..rounds).map(|r| times[i][r] / times[0][r]).collect();
        let (lo, hi) = ratios
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
        println!(
            "  {:<8} {:>8.1} us  x{:.3} of {first} (rounds {lo:.3}-{hi:.3})",
            format!("{mode:?}").to_lowercase(),
            median(times[i].clone()) * 1e6,
            median(ratios),
        );
    }
}

criterion_group! { name = benches; config = config(); targets = imdb }
criterion_group! { name = large_benches; config = config().sample_size(10).measurement_time(std::time::Duration::from_secs(5)); targets = large }

/// Criterion's benches (what `criterion_main!` would run); or, with
/// `DTENSOR_BENCH_INTERLEAVED=<rounds>[x<steps>]` (e.g. `15x200`; 200 steps a round by default),
/// the IMDB step's modes in interleaved rounds on NdArray and Flex (or Cuda alone, with
/// `DTENSOR_BENCH_BACKEND=cuda`) ([`interleaved`]) instead:
/// `DTENSOR_BENCH_INTERLEAVED=15 cargo bench --bench imdb_step`.
fn main() {
    if let Ok(spec) = std::env::var("DTENSOR_BENCH_INTERLEAVED") {
        let (rounds, steps) = spec.split_once('x').unwrap_or((&spec, "200"));
        let (rounds, steps) = (
            rounds
                .parse()
                .expect("DTENSOR_BENCH_INTERLEAVED=<rounds>[x<steps>]"),
            steps
                .parse()
                .expect("DTENSOR_BENCH_INTERLEAVED=<rounds>[x<steps>]"),
        );
        // `DTENSOR_BENCH_BACKEND=flex` (or `ndarray`, or `cuda` with that feature): that inner
        // backend alone.
        let only = std::env::var("DTENSOR_BENCH_BACKEND").ok();
        let on = |b: &str| only.as_deref().is_none_or(|o| o == b);
        if on("ndarray") {
            interleaved::<NdArray>("ndarray", Default::default(), rounds, steps);
        }
        if on("flex") {
            interleaved::<Flex>("flex", Default::default(), rounds, steps);
        }
        // Cuda only when named (`DTENSOR_BENCH_BACKEND=cuda`): it needs a device.
        #[cfg(feature = "cuda")]
        if only.as_deref() == Some("cuda") {
            interleaved::<burn::backend::Cuda>("cuda", Default::default(), rounds, steps);
        }
        return;
    }
    benches();
    large_benches();
    Criterion::default().configure_from_args().final_summary();
}
