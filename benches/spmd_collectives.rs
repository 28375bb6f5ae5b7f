//! Collective throughput across processes (MPI), against tensor size, per collective, beside
//! the engine's own figure for the same bytes.
//!
//! `cargo bench --features mpi --bench spmd_collectives` re-runs this binary under
//! `mpirun -np 2` and `-np 4` (one device per process, mesh `x=N`); each process prints nothing
//! but rank 0, which prints one line per (collective, size):
//! - `dtensor`: the relayout through burn-dtensor (`Tensor::relayout` on
//!   `DistributedBackend<NdArray>`: device -> host -> MPI -> host -> device), both reductions
//!   (`ordered`, the default, and `engine`);
//! - `engine`: the raw `ProcessGroup` call on host bytes for the same buffer, what the engine
//!   itself gives: `MPI_Iallreduce` of the whole buffer for all-reduce and reduce-scatter (which
//!   burn-dtensor runs as an all-reduce and a local chunk), `MPI_Iallgatherv` of one process's
//!   share for all-gather and all-to-all (an all-gather and a local chunk).
//!
//! Bandwidth is NCCL's convention: algbw = global bytes / time; busbw = algbw x 2(p-1)/p for
//! all-reduce, x (p-1)/p for all-gather, reduce-scatter and all-to-all. Fixed iteration counts
//! (every process must run the same collectives: criterion's adaptive sampling would not), the
//! median of the repetitions. Figures in NOTES.md.

use std::time::Instant;

use burn::backend::NdArray;
use burn::tensor::{DType, Tensor, TensorData};
use burn_dtensor::spmd::{self, Reduction};
use burn_dtensor::{DTensorExt, DistributedBackend, Layout, Mesh, ReduceOp, distribute};

#[path = "common/mod.rs"]
mod common;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

type DB = DistributedBackend<NdArray>;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn time(reps: usize, mut f: impl FnMut()) -> f64 {
    f(); // warm-up
    median(
        (0..reps)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .collect(),
    )
}

fn worker() {
    let world = spmd::init().expect("joining the MPI world");
    let p = world.size();
    let chief = world.is_chief();
    let mesh: Mesh<burn::backend::ndarray::NdArrayDevice> =
        Mesh::spmd([("x", p)], vec![Default::default()]).unwrap();
    let s0 = Layout::new(&mesh, ["x", "unsharded"]).unwrap();
    let s1 = Layout::new(&mesh, ["unsharded", "x"]).unwrap();
    let r = Layout::replicated(&mesh, 2);
    let part = r.clone().with_partial(0, ReduceOp::Sum);
    let cases: [(&str, &Layout, &Layout, f64); 4] = [
        ("all-reduce", &part, &r, 2.0),
        ("all-gather", &s0, &r, 1.0),
        ("reduce-scatter", &part, &s0, 1.0),
        ("all-to-all", &s0, &s1, 1.0),
    ];
    let pg = world.process_group().expect("more than one process");
    if chief {
        println!("processes {p} (engine {}):", world.engine());
        println!(
            "{:<15} {:>9} {:<16} {:>10} {:>10} {:>10}",
            "collective", "size", "path", "time", "algbw", "busbw"
        );
    }
    // `cargo test --all-targets` runs this binary without `--bench`: one small size, a smoke test.
    let sides: &[usize] = if common::smoke() {
        &[64]
    } else {
        &[64, 256, 1024, 2048]
    };
    for &side in sides {
        let bytes = (side * side * 4) as f64;
        let reps = if side >= 1024 { 10 } else { 30 };
        let data = TensorData::new(vec![1.0f32; side * side], [side, side]);
        let line = |name: &str, path: &str, t: f64, factor: f64| {
            if chief {
                let alg = bytes / t / 1e9;
                let bus = alg * factor * (p - 1) as f64 / p as f64;
                println!(
                    "{name:<15} {:>9} {path:<16} {:>8.3}ms {:>7.2}GB/s {:>7.2}GB/s",
                    if bytes < 1e6 {
                        format!("{:.0}KB", bytes / 1e3)
                    } else {
                        format!("{:.1}MB", bytes / 1e6)
                    },
                    t * 1e3,
                    alg,
                    bus
                );
            }
        };
        for (name, from, to, factor) in cases {
            // A fresh input each repetition (a partial tensor memoises its reduced value, so
            // relaying out clones of one would reduce once): the time of `distribute` alone
            // (no communication) is measured and taken off.
            let upload = time(reps, || {
                let x: Tensor<DB, 2> = distribute(data.clone(), from).unwrap();
                let _ = x.to_local_shards();
            });
            let modes: &[(Reduction, &str)] = if from.is_partial() {
                &[
                    (Reduction::Ordered, "dtensor-ordered"),
                    (Reduction::Engine, "dtensor-engine"),
                ]
            } else {
                &[(Reduction::Ordered, "dtensor")]
            };
            for &(mode, path) in modes {
                burn_dtensor::configure(burn_dtensor::config().with_reduction(mode));
                let t = time(reps, || {
                    let x: Tensor<DB, 2> = distribute(data.clone(), from).unwrap();
                    let _ = x.relayout(to).unwrap().to_local_shards();
                }) - upload;
                line(name, path, t, factor);
            }
            burn_dtensor::configure(burn_dtensor::config().with_reduction(Reduction::Ordered));
            // The engine alone on the same global buffer: an all-reduce of all of it, or an
            // all-gather of one process's share of it.
            let reduces = from.is_partial();
            let t = if reduces {
                let mut buf = vec![0u8; bytes as usize];
                time(reps, || {
                    pg.all_reduce(&mut buf, DType::F32, ReduceOp::Sum, "bench")
                })
            } else {
                let share = vec![0u8; bytes as usize / p];
                let counts = vec![share.len(); p];
                time(reps, || {
                    let _ = pg.all_gather(&share, &counts, "bench");
                })
            };
            line(
                name,
                if reduces {
                    "engine allreduce"
                } else {
                    "engine allgatherv"
                },
                t,
                factor,
            );
        }
    }
}

fn main() {
    if spmd::LaunchEnv::detect().is_ok_and(|l| l.is_multi_process()) {
        worker();
        return;
    }
    if !cfg!(feature = "mpi") {
        println!(
            "skipped: build with `--features mpi` (and install OpenMPI) to measure across processes"
        );
        return;
    }
    // `cargo test --all-targets` runs this binary without `--bench`: 2 processes, one small
    // size, a smoke test.
    common::under_mpirun(&[2, 4]);
}
