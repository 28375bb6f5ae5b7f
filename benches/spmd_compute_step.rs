//! A compute-bound training step across processes: two `Linear(4096, 4096)` layers with a ReLU
//! between them, batch 256, mean squared error, SGD (issue 22's throughput check). One thread
//! per process (`RAYON_NUM_THREADS=1`, `MATMUL_NUM_THREADS=1`, the two pools NdArray uses).
//!
//! `cargo bench --features mpi --bench spmd_compute_step` starts, in turn:
//! - one process with one thread: the bare NdArray step, then the same step on a mesh of 2
//!   virtual devices in data-parallel (`batch=2`, the batch sharded, gradients all-reduced) and
//!   model-parallel form (`model=2`: the first layer column-parallel, the second row-parallel, one
//!   all-reduce of the `[256, 4096]` activation forward and one backward);
//! - `mpirun -np 2`, one thread each: the same two meshes with one device per process.
//!
//! and prints the median step (ms) of each, and the throughput of the 2-process runs as a
//! multiple of the 1-process bare step's (samples per second, the same global batch). On a
//! machine with two cores the ideal is 2x. Every process runs the same fixed number of steps.
//! Figures in NOTES.md.

use std::process::Command;
use std::time::Instant;

use burn::backend::{Autodiff, NdArray};
use burn::module::Module;
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};
use burn_dtensor::spmd::{self, Reduction};
use burn_dtensor::{DistributedBackend, DistributedDevice, Layout, LayoutMap, Mesh, UNSHARDED};

#[path = "common/mod.rs"]
mod common;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The worker's marker in the environment (set by `main` for the children it starts).
const CHILD: &str = "SPMD_COMPUTE_CHILD";

#[derive(Module, Debug)]
struct TwoLinear<B: Backend> {
    l1: Linear<B>,
    relu: Relu,
    l2: Linear<B>,
}

impl<B: Backend> TwoLinear<B> {
    fn new(d: usize, device: &B::Device) -> Self {
        Self {
            l1: LinearConfig::new(d, d).init(device),
            relu: Relu::new(),
            l2: LinearConfig::new(d, d).init(device),
        }
    }
    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.l2.forward(self.relu.forward(self.l1.forward(x)))
    }
}

/// Sizes: `(width, batch, timed steps)`.
fn sizes() -> (usize, usize, usize) {
    if common::smoke() {
        (64, 16, 2)
    } else {
        (4096, 256, 10)
    }
}

/// Deterministic inputs and targets, `[batch, width]` each.
fn data(width: usize, batch: usize) -> (TensorData, TensorData) {
    let v = |seed: usize| -> Vec<f32> {
        (0..batch * width)
            .map(|i| ((i * 7919 + seed) % 1000) as f32 / 500.0 - 1.0)
            .collect()
    };
    (
        TensorData::new(v(1), [batch, width]),
        TensorData::new(v(2), [batch, width]),
    )
}

/// Median time (ms) of `steps` training steps of `model` on inputs `x` and targets `y`, after 2
/// warm-up steps.
fn median_step<B: AutodiffBackend>(
    mut model: TwoLinear<B>,
    x: Tensor<B, 2>,
    y: Tensor<B, 2>,
    steps: usize,
) -> f64 {
    let mut optim = SgdConfig::new().init();
    let mut times = Vec::new();
    for i in 0..steps + 2 {
        let t = Instant::now();
        let out = model.forward(x.clone());
        let loss = (out - y.clone()).powi_scalar(2).mean();
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(1e-4, model, grads);
        let _ = loss.into_data();
        if i >= 2 {
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// The step on the bare inner backend (no decorator).
fn bare(width: usize, batch: usize, steps: usize) -> f64 {
    type B = Autodiff<NdArray>;
    let device = Default::default();
    let (x, y) = data(width, batch);
    median_step(
        TwoLinear::<B>::new(width, &device),
        Tensor::from_data(x, &device),
        Tensor::from_data(y, &device),
        steps,
    )
}

/// The step on a 2-position mesh, `data` (`batch=2`) or model (`model=2`), spanning the
/// processes of the world (one process: 2 virtual devices).
fn sharded(data_parallel: bool, width: usize, batch: usize, steps: usize) -> f64 {
    type B = Autodiff<DistributedBackend<NdArray>>;
    let world = spmd::init().expect("joining the world");
    let (spec, map) = if data_parallel {
        ("batch=2", "")
    } else {
        (
            "model=2",
            "'^l1\\.weight$' = [\"unsharded\", \"model\"]\n'^l1\\.bias$' = [\"model\"]\n'^l2\\.weight$' = [\"model\", \"unsharded\"]\n",
        )
    };
    let mesh = Mesh::parse_spmd(spec, vec![Default::default(); 2 / world.size()]).unwrap();
    let device = DistributedDevice::new(mesh.clone());
    let model = LayoutMap::from_toml_str(map)
        .unwrap()
        .apply(TwoLinear::<B>::new(width, &device), mesh.topology())
        .unwrap()
        .0;
    let rows = if data_parallel { "batch" } else { UNSHARDED };
    let layout = Layout::new(&mesh, [rows, UNSHARDED]).unwrap();
    let (x, y) = data(width, batch);
    median_step(
        model,
        burn_dtensor::distribute(x, &layout).unwrap(),
        burn_dtensor::distribute(y, &layout).unwrap(),
        steps,
    )
}

/// Runs in each child: prints `RESULT <name> <ms>` lines (rank 0 only across processes).
/// `SPMD_BENCH_ONLY=data-2proc-engine` (for a profiler) runs that row alone.
fn worker() {
    let world = spmd::init().expect("joining the world");
    let (width, batch, steps) = sizes();
    let only = std::env::var("SPMD_BENCH_ONLY").ok();
    let wanted = |name: &str| only.as_deref().is_none_or(|o| o == name);
    let mut rows = Vec::new();
    let mut row = |name: &'static str, f: &dyn Fn() -> f64| {
        if wanted(name) {
            rows.push((name, f()));
        }
    };
    if world.size() == 1 {
        row("bare-1proc", &|| bare(width, batch, steps));
        row("data-1proc", &|| sharded(true, width, batch, steps));
        row("model-1proc", &|| sharded(false, width, batch, steps));
    } else {
        for (reduction, data, model) in [
            (
                Reduction::Ordered,
                "data-2proc-ordered",
                "model-2proc-ordered",
            ),
            (Reduction::Engine, "data-2proc-engine", "model-2proc-engine"),
        ] {
            burn_dtensor::configure(burn_dtensor::config().with_reduction(reduction));
            row(data, &|| sharded(true, width, batch, steps));
            row(model, &|| sharded(false, width, batch, steps));
        }
    }
    if world.is_chief() {
        for (name, ms) in rows {
            println!("RESULT {name} {ms:.2}");
        }
    }
}

/// Runs `c` with one thread per process and returns its `RESULT` lines as (name, ms).
fn collect(mut c: Command) -> Vec<(String, f64)> {
    c.env(CHILD, "1")
        .env("RAYON_NUM_THREADS", "1")
        .env("MATMUL_NUM_THREADS", "1");
    if common::smoke() {
        c.env("SPMD_BENCH_SMOKE", "1");
    } else {
        c.arg("--bench");
    }
    let out = c.output().expect("starting the child");
    assert!(
        out.status.success(),
        "child failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut w = l.strip_prefix("RESULT ")?.split_whitespace();
            Some((w.next()?.to_string(), w.next()?.parse().ok()?))
        })
        .collect()
}

fn main() {
    if std::env::var_os(CHILD).is_some() {
        worker();
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let mut rows = collect(Command::new(&exe));
    if cfg!(feature = "mpi") && Command::new("mpirun").arg("--version").output().is_ok() {
        let mut c = Command::new("mpirun");
        c.args(["--allow-run-as-root", "--oversubscribe", "-np", "2"])
            .arg(&exe);
        rows.extend(collect(c));
    } else {
        println!("skipped the 2-process runs: build with `--features mpi` and install OpenMPI");
    }
    let (width, batch, steps) = sizes();
    println!(
        "Linear({width}, {width}) x2, batch {batch}, SGD, one thread per process, median of {steps} steps"
    );
    let bare = rows.iter().find(|r| r.0 == "bare-1proc").map(|r| r.1);
    for (name, ms) in &rows {
        let speedup = bare.map_or(String::new(), |b| format!("{:5.2}x", b / ms));
        println!("{name:<22} {ms:9.2} ms   throughput vs bare 1 process {speedup}");
    }
}
