//! The IMDB MLP training step (global batch 64, 1200 -> 48 -> BatchNorm -> 2, SGD; the
//! synthetic sparse batches of `imdb_step`) per process count and mode: one process (the
//! 8-device virtual mesh, stacked and per device) and `mpirun -np 2|4|8` (each process owning
//! 8/N of the devices, collectives across processes on MPI).
//!
//! `cargo bench --features mpi --bench spmd_imdb_step`: rank 0 prints the median of 100 steps
//! (after 10 warm-up steps) per mode and both cross-process reductions (each process's
//! positions stacked, and the ordered reduction per device too), on the tutorial's
//! 8-device meshes and on meshes of 2 devices (one device per process on 2 processes, against
//! the same mesh in one process). Every process runs the
//! same fixed number of steps (criterion's adaptive sampling would desynchronise the ranks).
//! Machines with fewer cores than processes measure overhead, not scaling. Figures in NOTES.md.

use std::time::Instant;

use burn::backend::NdArray;
use burn::optim::SgdConfig;
use burn_dtensor::LayoutMap;
use burn_dtensor::spmd::{self, Reduction};
use dtensor_imdb::model::ImdbMlp;
use dtensor_imdb::train::{Distributed, Mode, Placement};

#[path = "common/mod.rs"]
mod common;
use common::{batch, imdb_train_step};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The mesh of `mode` over 8 devices (the tutorial's), or a mesh of 2 devices of the same style
/// (size-1 axes keep the tutorial's layout maps valid): `batch=2`; `batch=1,model=2`;
/// `batch=1,feature=2,model=1` (the input and `dense1.weight` sharded over `feature`).
fn mesh_of(mode: Mode, devices: usize) -> &'static str {
    match (mode, devices) {
        (_, 8) => mode.default_mesh(),
        (Mode::Data, 2) => "batch=2",
        (Mode::Model, 2) => "batch=1,model=2",
        (Mode::Spatial, 2) => "batch=1,feature=2,model=1",
        _ => unreachable!("meshes of 8 and 2 devices only"),
    }
}

/// Median step time (ms) of `mode` on a mesh of `devices` devices ([`mesh_of`]) on this world.
fn median_step(mode: Mode, devices: usize, stacked: bool, steps: usize) -> f64 {
    let p = Distributed::<NdArray>::new(
        mesh_of(mode, devices),
        devices,
        Default::default(),
        LayoutMap::from_toml_str(mode.default_layout_map()).unwrap(),
    )
    .unwrap()
    .with_stacked_execution(stacked)
    .unwrap();
    let (x, y) = batch(64, 1200, 7);
    let device = p.device();
    let mut model = Some(p.prepare_model(ImdbMlp::new(&device)).unwrap());
    let mut optim = SgdConfig::new().init();
    let mut times = Vec::new();
    for i in 0..steps + 10 {
        let t = Instant::now();
        imdb_train_step(&p, &mut model, &mut optim, &x, &y);
        if i >= 10 {
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// `f()`, or NaN when `SPMD_BENCH_VARIANT` (for a profiler) names another variant: `stacked`
/// (the ordered reduction across processes), `per-device` or `engine`.
fn timed(variant: &str, f: impl FnOnce() -> f64) -> f64 {
    if std::env::var("SPMD_BENCH_VARIANT").is_ok_and(|v| v != variant) {
        return f64::NAN;
    }
    f()
}

/// Prints one line per mode for the meshes of `devices` devices (8: the tutorial's; 2: one
/// device per process on 2 processes), when the world's processes can split them.
fn run_all(devices: usize, steps: usize) {
    let world = spmd::init().expect("joining the world");
    let n = world.size();
    if !devices.is_multiple_of(n) {
        return;
    }
    for mode in [Mode::Data, Mode::Model, Mode::Spatial] {
        let name = format!("{mode:?}").to_lowercase();
        // `SPMD_BENCH_ONLY=model` (for a profiler): one mode.
        if std::env::var("SPMD_BENCH_ONLY").is_ok_and(|only| only != name) {
            continue;
        }
        let mesh = mesh_of(mode, devices);
        if n == 1 {
            let stacked = timed("stacked", || median_step(mode, devices, true, steps));
            let per_device = timed("per-device", || median_step(mode, devices, false, steps));
            println!(
                "{name:<8} {mesh:<26} 1 process   stacked {stacked:7.2} ms   per device {per_device:7.2} ms"
            );
        } else {
            // Stacked: each process runs its positions as one stack (a process holding one
            // position runs it alone either way); per device: one inner op per position.
            burn_dtensor::configure(burn_dtensor::config().with_reduction(Reduction::Ordered));
            let ordered = timed("stacked", || median_step(mode, devices, true, steps));
            let per_device = timed("per-device", || median_step(mode, devices, false, steps));
            burn_dtensor::configure(burn_dtensor::config().with_reduction(Reduction::Engine));
            let engine = timed("engine", || median_step(mode, devices, true, steps));
            if world.is_chief() {
                println!(
                    "{name:<8} {mesh:<26} {n} processes ordered {ordered:7.2} ms   engine     {engine:7.2} ms   ordered per device {per_device:7.2} ms"
                );
            }
        }
    }
}

fn main() {
    // `cargo test --all-targets` runs this binary without `--bench`: 2 timed steps, 1 and 2
    // processes, a smoke test.
    // `SPMD_BENCH_REPS=2000` and `SPMD_BENCH_DEVICES=8` (for a profiler): more steps, one mesh size.
    let steps = if common::smoke() {
        2
    } else {
        std::env::var("SPMD_BENCH_REPS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(100)
    };
    for devices in [8, 2] {
        if std::env::var("SPMD_BENCH_DEVICES").is_ok_and(|d| d != devices.to_string()) {
            continue;
        }
        run_all(devices, steps);
    }
    if spmd::LaunchEnv::detect().is_ok_and(|l| l.is_multi_process()) {
        return;
    }
    if !cfg!(feature = "mpi") {
        println!("skipped the multi-process runs: build with `--features mpi`");
        return;
    }
    common::under_mpirun(&[2, 4, 8]);
}
