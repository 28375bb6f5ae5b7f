//! Collective throughput across processes (MPI), against tensor size, per collective, beside
//! the same collective called directly on MPI for the same bytes.
//!
//! `cargo bench --features mpi --bench spmd_collectives` re-runs this binary under
//! `mpirun -np 2` and `-np 4` (one device per process, mesh `x=N`); each process prints nothing
//! but rank 0, which prints one line per (collective, size, path):
//! - `dtensor-ordered` / `dtensor-engine` (or `dtensor`, where nothing is reduced): the relayout
//!   through burn-dtensor (`Tensor::relayout` on `DistributedBackend<NdArray>`), with the
//!   deterministic reduction (the default) and with the engine's, by how the parts move
//!   (`Config::strided_send`): `dtensor` / `dtensor-ordered` (the default) write them into the
//!   peers' receive buffers (`process_vm_writev`, 1 MiB and more; the engine reduction's
//!   `MPI_Allreduce` and `MPI_Reduce_scatter` move their own bytes), `-pack` hands MPI's
//!   collective contiguous buffers (the all-to-all's strided parts packed first), and the
//!   all-to-all's `dtensor-datatype` hands MPI its strided parts as derived datatypes;
//! - `group`: the project's own `ProcessGroup` call on host bytes for the same buffer (the engine
//!   layer alone, with its timeout watchdog);
//! - `mpi direct`: the blocking MPI collective called directly on host buffers of the same bytes,
//!   with nothing around it (`MPI_Allreduce`, `MPI_Allgather`, `MPI_Reduce_scatter_block`,
//!   `MPI_Alltoall`): the reference of issue 22. The last column is its time over this line's
//!   (1.0 = the direct call's throughput);
//! - `mpi fresh`: the same call into a receive buffer allocated in each repetition, and for the
//!   all-to-all with its send buffer packed from the transposed blocks (`direct_fresh`): the
//!   relayout's own work with nothing of burn-dtensor around it: `dtensor` against this line is
//!   what the decorator's path adds (its code, and where its buffers lie), this line against
//!   `mpi direct` what a new output and the exchange's shape cost;
//! - `mpi typed` (all-to-all only): the transposing exchange of `mpi fresh` with MPI reading the
//!   strided blocks in place (`MPI_Alltoallw` over `MPI_Type_vector` send types, `direct_typed`)
//!   instead of packing them first: whether a derived datatype beats the pack.
//!
//! Each `dtensor` repetition makes its input just before the clock starts (warm, as a step's
//! freshly computed tensor) and lines the ranks up with an untimed barrier, so that no rank's
//! clock counts a peer still making its input. `SPMD_BENCH_ONLY=<collective>`,
//! `SPMD_BENCH_SIDE=<n>` and `SPMD_BENCH_REPS=<n>` select one case and its repetitions (for a
//! profiler).
//!
//! Bandwidth is NCCL's convention: algbw = global bytes / time; busbw = algbw x 2(p-1)/p for
//! all-reduce, x (p-1)/p for all-gather, reduce-scatter and all-to-all. Fixed iteration counts
//! (every process must run the same collectives: criterion's adaptive sampling would not), the
//! median of the repetitions. Figures in NOTES.md.

use std::time::Instant;

use burn::backend::NdArray;
use burn::tensor::{DType, Tensor, TensorData};
use burn_dtensor::spmd::{self, Reduction};
use burn_dtensor::{
    DTensorExt, DistributedBackend, Layout, Mesh, ReduceOp, StridedSend, distribute,
};

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

/// The median time of `run` over `reps` repetitions after one warm-up, each on an input that
/// `make` builds untimed just before the ranks line up ([`line_up`]); what `run` returns is
/// dropped untimed, as a training step drops its buffers.
fn time_lined_up<I, O>(
    reps: usize,
    mut make: impl FnMut() -> I,
    mut run: impl FnMut(I) -> O,
) -> f64 {
    let mut times = Vec::with_capacity(reps + 1);
    for _ in 0..=reps {
        let input = make();
        line_up();
        let t = Instant::now();
        let out = run(input);
        times.push(t.elapsed().as_secs_f64());
        drop(out);
    }
    times.remove(0); // warm-up
    median(times)
}

/// The blocking MPI collective `name` called directly on host buffers: `n` f32 elements in all
/// (the whole buffer of an all-reduce and of a reduce-scatter's input, `n / p` per process for
/// an all-gather's and an all-to-all's input). Every process runs it `reps + 1` times.
#[cfg(feature = "mpi")]
fn direct(name: &str, n: usize, p: usize, reps: usize) -> f64 {
    use mpi::collective::SystemOperation;
    use mpi::traits::*;
    let world = mpi::topology::SimpleCommunicator::world();
    let share = n / p;
    match name {
        "all-reduce" => {
            let send = vec![1f32; n];
            let mut recv = vec![0f32; n];
            time(reps, || {
                world.all_reduce_into(&send[..], &mut recv[..], SystemOperation::sum())
            })
        }
        "all-gather" => {
            let send = vec![1f32; share];
            let mut recv = vec![0f32; share * p];
            time(reps, || world.all_gather_into(&send[..], &mut recv[..]))
        }
        "reduce-scatter" => {
            let send = vec![1f32; share * p];
            let mut recv = vec![0f32; share];
            time(reps, || {
                world.reduce_scatter_block_into(&send[..], &mut recv[..], SystemOperation::sum())
            })
        }
        "all-to-all" => {
            let send = vec![1f32; share];
            let mut recv = vec![0f32; share];
            time(reps, || world.all_to_all_into(&send[..], &mut recv[..]))
        }
        other => unreachable!("no direct form of {other}"),
    }
}

/// [`direct`] as the relayout meets it: in each repetition a fresh input is made (untimed, as
/// the `dtensor` lines make theirs) and the ranks lined up, then the timed part allocates the
/// receive buffer (uninitialised, as the relayout's host buffer) and calls the collective; both
/// buffers are dropped untimed. Against `mpi direct` (two buffers reused by every repetition)
/// this is what a collective that returns a new tensor pays on top of the call (a receive
/// buffer handed out anew by the allocator; with mimalloc the block freed by the previous
/// repetition, its pages already mapped: NOTES.md, session 40). For the all-to-all the
/// timed part also packs the send buffer from a `[side / p, side]` row-major shard by column
/// blocks, the copy the bench's relayout (`[x, -] -> [-, x]`) needs besides the exchange (each
/// destination's part is a strided block of the shard). So this line is the relayout's own work
/// with nothing of burn-dtensor around it. `side`: the global tensor's side (`n = side * side`).
#[cfg(feature = "mpi")]
fn direct_fresh(name: &str, side: usize, p: usize, reps: usize) -> f64 {
    use mpi::ffi;
    use mpi::raw::AsRaw;
    use mpi::traits::*;
    let world = mpi::topology::SimpleCommunicator::world();
    let (comm, f32t) = (world.as_raw(), f32::equivalent_datatype().as_raw());
    let n = side * side;
    let share = n / p;
    let (input, output) = match name {
        "all-reduce" => (n, n),
        "all-gather" => (share, share * p),
        "reduce-scatter" => (n, share),
        "all-to-all" => (share, share),
        other => unreachable!("no direct form of {other}"),
    };
    let count = |c: usize| i32::try_from(c).expect("fewer than 2^31 elements");
    time_lined_up(
        reps,
        || vec![1f32; input],
        |source| {
            // Capacity only: MPI writes all `output` elements through the raw pointer.
            let mut recv = Vec::<f32>::with_capacity(output);
            let r = recv.as_mut_ptr().cast::<std::ffi::c_void>();
            // The all-to-all's send buffer: destination `j`'s part is rows `0..side / p` of the
            // shard's column block `j`.
            let packed = (name == "all-to-all").then(|| {
                let (rows, cols) = (side / p, side / p);
                let mut v = Vec::with_capacity(share);
                for j in 0..p {
                    for row in 0..rows {
                        let at = row * side + j * cols;
                        v.extend_from_slice(&source[at..at + cols]);
                    }
                }
                v
            });
            let send = packed.as_deref().unwrap_or(&source).as_ptr().cast();
            // SAFETY: `send` holds `input` elements, `recv` has capacity for `output`, the
            // counts below are those sizes (per process where MPI counts per process); blocking
            // calls.
            unsafe {
                match name {
                    "all-reduce" => {
                        ffi::MPI_Allreduce(send, r, count(n), f32t, ffi::RSMPI_SUM, comm)
                    }
                    "all-gather" => {
                        ffi::MPI_Allgather(send, count(share), f32t, r, count(share), f32t, comm)
                    }
                    "reduce-scatter" => ffi::MPI_Reduce_scatter_block(
                        send,
                        r,
                        count(share),
                        f32t,
                        ffi::RSMPI_SUM,
                        comm,
                    ),
                    _ => {
                        let part = count(share / p);
                        ffi::MPI_Alltoall(send, part, f32t, r, part, f32t, comm)
                    }
                };
                recv.set_len(output);
            }
            (recv, source)
        },
    )
}

/// The all-to-all of [`direct_fresh`] with MPI packing the strided blocks itself: each
/// destination `j`'s part is sent from the `[side / p, side]` shard in place through a vector
/// datatype (`MPI_Type_vector`: `side / p` rows of `side / p` elements, stride `side`) with
/// `MPI_Alltoallw`, received contiguous; the types are made and freed in the timed part.
#[cfg(feature = "mpi")]
fn direct_typed(side: usize, p: usize, reps: usize) -> f64 {
    use mpi::ffi;
    use mpi::raw::AsRaw;
    use mpi::traits::*;
    let world = mpi::topology::SimpleCommunicator::world();
    let (comm, f32t) = (world.as_raw(), f32::equivalent_datatype().as_raw());
    let share = side * side / p;
    let (rows, cols) = (side / p, side / p);
    let c = |x: usize| i32::try_from(x).expect("fewer than 2^31");
    time_lined_up(
        reps,
        || vec![1f32; share],
        |source| {
            let mut recv = Vec::<f32>::with_capacity(share);
            // SAFETY: the vector type covers `rows` rows of `cols` elements of the shard at
            // byte displacement `j * cols * 4`, inside `share` elements; the receive parts are
            // `rows * cols` contiguous elements each, `share` in all; blocking call.
            unsafe {
                let mut vt: ffi::MPI_Datatype = std::mem::zeroed();
                ffi::MPI_Type_vector(c(rows), c(cols), c(side), f32t, &mut vt);
                ffi::MPI_Type_commit(&mut vt);
                let ones = vec![1i32; p];
                let sd: Vec<i32> = (0..p).map(|j| c(j * cols * 4)).collect();
                let st = vec![vt; p];
                let rc = vec![c(rows * cols); p];
                let rd: Vec<i32> = (0..p).map(|j| c(j * rows * cols * 4)).collect();
                let rt = vec![f32t; p];
                ffi::MPI_Alltoallw(
                    source.as_ptr().cast(),
                    ones.as_ptr(),
                    sd.as_ptr(),
                    st.as_ptr(),
                    recv.as_mut_ptr().cast(),
                    rc.as_ptr(),
                    rd.as_ptr(),
                    rt.as_ptr(),
                    comm,
                );
                ffi::MPI_Type_free(&mut vt);
                recv.set_len(share);
            }
            (recv, source)
        },
    )
}

#[cfg(not(feature = "mpi"))]
fn direct_typed(_: usize, _: usize, _: usize) -> f64 {
    f64::NAN
}

#[cfg(not(feature = "mpi"))]
fn direct(_: &str, _: usize, _: usize, _: usize) -> f64 {
    f64::NAN
}

#[cfg(not(feature = "mpi"))]
fn direct_fresh(_: &str, _: usize, _: usize, _: usize) -> f64 {
    f64::NAN
}

/// Every process waits for the others (untimed), so that a timed collective starts together on
/// all of them, as the direct call's back-to-back repetitions do: without it, a rank's clock
/// also counts the time a peer spends making its input.
#[cfg(feature = "mpi")]
fn line_up() {
    use mpi::traits::*;
    mpi::topology::SimpleCommunicator::world().barrier();
}

#[cfg(not(feature = "mpi"))]
fn line_up() {}

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
            "{:<15} {:>9} {:<16} {:>10} {:>10} {:>10} {:>8}",
            "collective", "size", "path", "time", "algbw", "busbw", "direct/t"
        );
    }
    // `cargo test --all-targets` runs this binary without `--bench`: one small size, a smoke test.
    // `SPMD_BENCH_SIDE=1024` (for a profiler): one size.
    let one: Option<usize> = std::env::var("SPMD_BENCH_SIDE")
        .ok()
        .and_then(|s| s.parse().ok());
    let sides: Vec<usize> = if common::smoke() {
        vec![64]
    } else if let Some(side) = one {
        vec![side]
    } else {
        vec![64, 256, 1024, 2048]
    };
    for side in sides {
        let bytes = (side * side * 4) as f64;
        // `SPMD_BENCH_REPS=200` (for a profiler): more repetitions than the defaults.
        let reps = std::env::var("SPMD_BENCH_REPS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(if side >= 1024 { 10 } else { 30 });
        let data = TensorData::new(vec![1.0f32; side * side], [side, side]);
        let line = |name: &str, path: &str, t: f64, factor: f64, reference: f64| {
            if chief {
                let alg = bytes / t / 1e9;
                let bus = alg * factor * (p - 1) as f64 / p as f64;
                println!(
                    "{name:<15} {:>9} {path:<16} {:>8.3}ms {:>7.2}GB/s {:>7.2}GB/s {:>8.2}",
                    if bytes < 1e6 {
                        format!("{:.0}KB", bytes / 1e3)
                    } else {
                        format!("{:.1}MB", bytes / 1e6)
                    },
                    t * 1e3,
                    alg,
                    bus,
                    reference / t
                );
            }
        };
        for (name, from, to, factor) in cases {
            // `SPMD_BENCH_ONLY=all-gather` (for a profiler): one collective.
            if std::env::var("SPMD_BENCH_ONLY").is_ok_and(|only| only != name) {
                continue;
            }
            let reference = direct(name, side * side, p, reps);
            use {Reduction::*, StridedSend::*};
            let modes: &[(Reduction, StridedSend, &str)] = if from.is_partial() {
                &[
                    (Ordered, SingleCopy, "dtensor-ordered"),
                    (Ordered, Pack, "dtensor-ordered-pack"),
                    (Engine, SingleCopy, "dtensor-engine"),
                ]
            } else if name == "all-to-all" {
                &[
                    (Ordered, SingleCopy, "dtensor"),
                    (Ordered, Pack, "dtensor-pack"),
                    (Ordered, Datatype, "dtensor-datatype"),
                ]
            } else {
                &[
                    (Ordered, SingleCopy, "dtensor"),
                    (Ordered, Pack, "dtensor-pack"),
                ]
            };
            for &(mode, send, path) in modes {
                let c = burn_dtensor::config().with_reduction(mode);
                burn_dtensor::configure(c.with_strided_send(send));
                // A fresh input each repetition (a partial tensor memoises its reduced value,
                // so relaying out clones of one would reduce once), all made before the clock
                // starts: only the relayout is timed. Each result is dropped untimed before the
                // next relayout, as a training step drops its buffers.
                let t = time_lined_up(
                    reps,
                    || -> Tensor<DB, 2> { distribute(data.clone(), from).unwrap() },
                    |x| x.relayout(to).unwrap(),
                );
                line(name, path, t, factor, reference);
            }
            let c = burn_dtensor::config().with_reduction(Reduction::Ordered);
            burn_dtensor::configure(c.with_strided_send(StridedSend::SingleCopy));
            // The engine layer alone (`ProcessGroup`, with its timeout watchdog) on buffers of
            // the same bytes as the direct call.
            let n = bytes as usize;
            let share = n / p;
            let t = match name {
                "all-reduce" => {
                    let (send, mut recv) = (vec![0u8; n], Vec::<u8>::with_capacity(n));
                    let recv = &mut recv.spare_capacity_mut()[..n];
                    time(reps, || {
                        pg.all_reduce_into(&send, recv, DType::F32, ReduceOp::Sum, "bench")
                    })
                }
                "reduce-scatter" => {
                    let (send, mut recv) = (vec![0u8; share * p], Vec::<u8>::with_capacity(share));
                    let recv = &mut recv.spare_capacity_mut()[..share];
                    time(reps, || {
                        pg.reduce_scatter_into(
                            &send,
                            &vec![share; p],
                            recv,
                            DType::F32,
                            ReduceOp::Sum,
                            "bench",
                        )
                    })
                }
                "all-gather" => {
                    let (send, mut recv) = (vec![0u8; share], Vec::<u8>::with_capacity(share * p));
                    let recv = &mut recv.spare_capacity_mut()[..share * p];
                    time(reps, || {
                        pg.all_gather_into(&send, &vec![share; p], recv, "bench")
                    })
                }
                _ => {
                    let (send, mut recv) = (vec![0u8; share], Vec::<u8>::with_capacity(share));
                    let recv = &mut recv.spare_capacity_mut()[..share];
                    let counts = vec![share / p; p];
                    time(reps, || {
                        pg.all_to_all_into(&send, &counts, &counts, recv, "bench")
                    })
                }
            };
            line(name, "group", t, factor, reference);
            line(name, "mpi direct", reference, factor, reference);
            let fresh = direct_fresh(name, side, p, reps);
            line(name, "mpi fresh", fresh, factor, reference);
            if name == "all-to-all" {
                let typed = direct_typed(side, p, reps);
                line(name, "mpi typed", typed, factor, reference);
            }
        }
    }
    buckets(&mesh, chief);
}

/// Gradient buckets (`settle_gradients`, issue 22 item 3): `k` data-parallel gradients of `m`
/// f32 each (pending sums over `x`, replicated parameters) settled one by one (bucket cap 0)
/// and in buckets (the cap of the environment: 64 KiB unless `BURN_DTENSOR_BUCKET_KIB` says
/// otherwise), per reduction; the last column is the
/// one-by-one time over the bucketed one (above 1: buckets are faster).
fn buckets(mesh: &Mesh<burn::backend::ndarray::NdArrayDevice>, chief: bool) {
    use burn::backend::Autodiff;
    use burn::module::Param;
    use burn::optim::GradientsParams;
    type AD = Autodiff<DB>;
    if std::env::var("SPMD_BENCH_ONLY").is_ok_and(|only| only != "buckets") {
        return;
    }
    let cap = burn_dtensor::config().gradient_bucket_bytes;
    let r1 = Layout::replicated(mesh, 1);
    let part = r1.clone().with_partial(0, ReduceOp::Sum);
    let shapes: &[(usize, usize)] = if common::smoke() {
        &[(4, 256)]
    } else {
        &[(8, 256), (32, 1024), (32, 8 * 1024), (32, 64 * 1024)]
    };
    if chief {
        println!(
            "{:<15} {:>13} {:<16} {:>10} {:>10} {:>8}",
            "gradients", "k x bytes", "reduction", "one by one", "bucketed", "ratio"
        );
    }
    for &(k, m) in shapes {
        let reps = 20;
        let module: Vec<Param<Tensor<AD, 1>>> = (0..k)
            .map(|_| {
                Param::from_tensor(distribute(TensorData::new(vec![0.5f32; m], [m]), &r1).unwrap())
            })
            .collect();
        let grads = || {
            let mut g = GradientsParams::new();
            for p in &module {
                let t: Tensor<DB, 1> =
                    distribute(TensorData::new(vec![1.0f32; m], [m]), &r1).unwrap();
                g.register::<DB, 1>(p.id, t.relayout(&part).unwrap());
            }
            g
        };
        for (mode, name) in [
            (Reduction::Ordered, "ordered"),
            (Reduction::Engine, "engine"),
        ] {
            let mut t = [0.0; 2];
            for (i, cap) in [0, cap].into_iter().enumerate() {
                burn_dtensor::configure(
                    burn_dtensor::config()
                        .with_reduction(mode)
                        .with_gradient_bucket_bytes(cap),
                );
                let mut inputs: Vec<GradientsParams> = (0..=reps).map(|_| grads()).collect();
                let mut times = Vec::with_capacity(reps + 1);
                while let Some(g) = inputs.pop() {
                    let t0 = Instant::now();
                    let settled = burn_dtensor::settle_gradients(g, &module).unwrap();
                    times.push(t0.elapsed().as_secs_f64());
                    drop(settled);
                }
                times.remove(0);
                t[i] = median(times);
            }
            if chief {
                println!(
                    "{:<15} {:>13} {name:<16} {:>8.3}ms {:>8.3}ms {:>8.2}",
                    "settle",
                    format!("{k} x {}KB", m * 4 / 1024),
                    t[0] * 1e3,
                    t[1] * 1e3,
                    t[0] / t[1]
                );
            }
        }
    }
    burn_dtensor::configure(
        burn_dtensor::config()
            .with_reduction(Reduction::Ordered)
            .with_gradient_bucket_bytes(cap),
    );
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
