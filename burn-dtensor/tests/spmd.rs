//! The promise across processes: on a mesh spanning 2 and 4 processes ([`Mesh::spmd`], MPI),
//! every op, relayout and gradient gives what `NdArray` gives on the whole tensor, uneven and
//! empty shards and pending reductions included, and every process's own shards hold their
//! chunk of it.
//!
//! Each test launches itself under `mpirun -np N` (the test binary, this test only, one test
//! thread); the processes run the body and compare against the oracle they compute alone.
//! Without `mpirun` or without the `mpi` feature the tests say so and pass, unless
//! `BURN_DTENSOR_REQUIRE_MPI=1` (CI sets it) makes that a failure.

use std::ops::Range;
use std::process::Command;

#[allow(unused)]
mod common;
#[path = "../../tests/common/ompi.rs"]
mod ompi;

use burn::backend::ndarray::NdArrayDevice;
use burn::backend::{Autodiff, NdArray};
use burn::module::Param;
use burn::optim::GradientsParams;
use burn::tensor::{Int, Tensor, TensorData};
use burn_dtensor::{
    CollectiveKind, DTensorExt, DistributedBackend, DistributedDevice, Layout, Mesh, ReduceOp,
    StridedSend, UNSHARDED, config, configure, distribute, record_comms, settle_gradients, spmd,
};

type N = NdArray<f32>;
type DB = DistributedBackend<NdArray<f32>>;
type Dev = NdArrayDevice;

/// Runs `name` (this binary's test of that name) as `np` MPI processes; `true` when it ran.
fn launch(name: &str, np: usize) -> bool {
    launch_with(name, np, &[])
}

/// [`launch`] with environment variables for the processes.
fn launch_with(name: &str, np: usize, env: &[(&str, &str)]) -> bool {
    let require = std::env::var("BURN_DTENSOR_REQUIRE_MPI").is_ok_and(|v| v == "1");
    let skip = |why: &str| {
        assert!(!require, "{why} (BURN_DTENSOR_REQUIRE_MPI=1)");
        println!("skipped: {why}");
        false
    };
    if !cfg!(feature = "mpi") {
        return skip("burn-dtensor built without the `mpi` feature");
    }
    if Command::new("mpirun").arg("--version").output().is_err() {
        return skip("no `mpirun` (apt-get install openmpi-bin libopenmpi-dev)");
    }
    let exe = std::env::current_exe().unwrap();
    let out = ompi::own_session_dir(&mut Command::new("timeout"))
        .args(["300", "mpirun", "--allow-run-as-root", "--oversubscribe"])
        .args(["--mca", "btl", "self,vader,tcp", "-np", &np.to_string()])
        .arg(&exe)
        .args([name, "--exact", "--test-threads=1", "--nocapture"])
        .env("BURN_DTENSOR_SPMD_WORKER", "1")
        .env("BURN_DTENSOR_COLLECTIVE_TIMEOUT_S", "60")
        .envs(env.iter().copied())
        .output()
        .expect("running mpirun");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{name} on {np} processes failed ({}):\n{text}",
        out.status
    );
    // Every rank ran the body (not a vacuous pass).
    let ran = text.matches(&format!("spmd-ok {name}")).count();
    assert_eq!(ran, np, "{name}: {ran} of {np} ranks finished:\n{text}");
    true
}

/// On the launching side (not a worker): runs `name` as each process count of `counts` in
/// turn (stopping at the first skip) and returns `true`; in a worker, `false`.
fn launched(name: &str, counts: &[usize]) -> bool {
    if is_worker() {
        return false;
    }
    for &np in counts {
        if !launch(name, np) {
            break;
        }
    }
    true
}

fn is_worker() -> bool {
    std::env::var_os("BURN_DTENSOR_SPMD_WORKER").is_some()
}

fn done(name: &str) {
    let w = spmd::init().unwrap();
    // The network namespace too: the two-host test checks that ranks ran in different ones.
    let net = std::fs::read_link("/proc/self/ns/net")
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    println!("spmd-ok {name} (rank {} of {}) {net}", w.rank(), w.size());
}

/// Meshes of 4 and 8 positions, every process holding `size / world` of them.
fn meshes() -> Vec<Mesh<Dev>> {
    let n = spmd::init().unwrap().size();
    let specs: &[&[(&str, usize)]] = &[&[("a", 4)], &[("x", 2), ("y", 2)], &[("x", 2), ("y", 4)]];
    specs
        .iter()
        .map(|s| {
            let size: usize = s.iter().map(|(_, k)| k).product();
            let m = Mesh::spmd(s.iter().copied(), vec![Dev::default(); size / n]).unwrap();
            // A process holding several positions of one device runs them stacked.
            assert_eq!(m.topology().is_stacked(), size / n > 1, "{m}");
            m
        })
        .collect()
}

/// Every rank-2 layout of the mesh (each dim unsharded or on one axis, no axis twice), and each
/// settled one again with a pending sum over every axis it leaves free.
fn layouts(m: &Mesh<Dev>) -> Vec<Layout> {
    let a = m.topology().axes().len();
    let settled = settled_layouts(m, 2);
    // Every pair of options but an axis on both dims.
    assert_eq!(settled.len(), (a + 1) * (a + 1) - a, "{m}: rank-2 layouts");
    let mut out = Vec::new();
    for l in settled {
        for i in 0..a {
            if (0..2).all(|d| l.dim_axis(d) != Some(i)) {
                out.push(l.clone().with_partial(i, ReduceOp::Sum));
            }
        }
        out.push(l);
    }
    out
}

/// Every settled layout of rank `rank` on the mesh: each dim unsharded or on one axis, no
/// axis twice.
fn settled_layouts(m: &Mesh<Dev>, rank: usize) -> Vec<Layout> {
    let mut opts = vec![UNSHARDED.to_string()];
    opts.extend(m.topology().axes().iter().map(|(a, _)| a.clone()));
    let mut specs: Vec<Vec<&str>> = vec![Vec::new()];
    for _ in 0..rank {
        specs = specs
            .into_iter()
            .flat_map(|s| {
                opts.iter().map(move |o| {
                    let mut s = s.clone();
                    s.push(o.as_str());
                    s
                })
            })
            .collect();
    }
    specs
        .into_iter()
        .filter_map(|s| Layout::new(m, s).ok())
        .collect()
}

fn data(shape: [usize; 2], seed: usize) -> TensorData {
    let n = shape[0] * shape[1];
    let v: Vec<f32> = (0..n)
        .map(|i| (((i * 7 + seed * 13) % 33) as f32 - 16.0) / 8.0)
        .collect();
    TensorData::new(v, shape)
}

fn extract(v: &[f32], shape: &[usize], ranges: &[Range<usize>]) -> Vec<f32> {
    let mut out = Vec::new();
    for i in ranges[0].clone() {
        for j in ranges[1].clone() {
            out.push(v[i * shape[1] + j]);
        }
    }
    out
}

fn close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= 1e-4 * a.abs().max(b.abs()) + 1e-5,
            "{what}: [{i}] {a} != {b}"
        );
    }
}

/// The gathered value against the oracle, and each of this process's shards against its chunk.
fn check(what: &str, got: Tensor<DB, 2>, want: Tensor<N, 2>) {
    let desc = got.describe();
    let w: Vec<f32> = want.into_data().to_vec().unwrap();
    let shape = got.dims().to_vec();
    let g: Vec<f32> = got.clone().into_data().to_vec().unwrap();
    close(&format!("{what} -> {desc}"), &g, &w);
    let l = got.layout();
    let settled = if l.is_partial() {
        got.relayout(&l.without_partial()).unwrap()
    } else {
        got
    };
    let sl = settled.layout();
    let topo = sl.mesh().clone();
    let shards = settled.to_local_shards();
    assert_eq!(
        shards.len(),
        topo.local_size(),
        "{what}: addressable shards"
    );
    for (j, s) in shards.into_iter().enumerate() {
        let ranges = sl.shard_ranges(&shape, topo.global(j));
        let v: Vec<f32> = s.into_data().to_vec().unwrap();
        close(
            &format!("{what} -> {desc}: position {}", topo.global(j)),
            &v,
            &extract(&w, &shape, &ranges),
        );
    }
}

/// `gather_to_process` to each process in turn: the global value there (to the ordered
/// reduction's rounding for a partial layout; of float, int and bool tensors), `None` elsewhere,
/// and a typed error for a rank the run does not have.
fn gathered_to_each_process(what: &str, x: Tensor<DB, 2>, want: &TensorData) {
    let w = spmd::init().unwrap();
    let want_f: Vec<f32> = want.to_vec().unwrap();
    let partial = x.layout().is_partial();
    for q in 0..w.size() {
        // Every process calls every gather (SPMD); only `q` gets values.
        let got = x.clone().gather_to_process(q).unwrap();
        let (ints, bools) = if partial {
            (None, None)
        } else {
            (
                x.clone().int().gather_to_process(q).unwrap(),
                x.clone().greater_elem(0.0).gather_to_process(q).unwrap(),
            )
        };
        if q != w.rank() {
            assert!(
                got.is_none() && ints.is_none() && bools.is_none(),
                "{what}: gathered to {q}"
            );
            continue;
        }
        let got = got.expect("the destination gets the value");
        assert_eq!(got.shape, want.shape, "{what}");
        close(
            &format!("{what}: gathered to {q}"),
            &got.to_vec::<f32>().unwrap(),
            &want_f,
        );
        if !partial {
            assert_eq!(&got, want, "{what}: gathered to {q}, bitwise");
            let want_i: Vec<i64> = want_f.iter().map(|v| *v as i64).collect();
            let ints = ints.expect("the destination gets the ints");
            assert_eq!(ints.to_vec::<i64>().unwrap(), want_i, "{what}: int");
            let want_b: Vec<bool> = want_f.iter().map(|v| *v > 0.0).collect();
            let bools = bools.expect("the destination gets the bools");
            assert_eq!(bools.to_vec::<bool>().unwrap(), want_b, "{what}: bool");
        }
    }
    let err = x.gather_to_process(w.size()).unwrap_err().to_string();
    assert!(
        err.contains(&format!("process {} does not exist", w.size())),
        "{err}"
    );
}

/// Element-wise, reduction, matmul and relayout on every layout pair, even and uneven shapes;
/// every layout gathered to each process in turn.
#[test]
fn ops_and_relayouts_across_processes() {
    let name = "ops_and_relayouts_across_processes";
    if launched(name, &[2, 4]) {
        return;
    }
    let dev = Default::default();
    for m in meshes() {
        let ls = layouts(&m);
        for shape in [[5, 3], [8, 6], [2, 7]] {
            let (dx, dy) = (data(shape, 1), data(shape, 2));
            let dw = data([shape[1], 4], 3);
            let ox = Tensor::<N, 2>::from_data(dx.clone(), &dev);
            let oy = Tensor::<N, 2>::from_data(dy.clone(), &dev);
            let ow = Tensor::<N, 2>::from_data(dw.clone(), &dev);
            for la in &ls {
                let x: Tensor<DB, 2> = distribute(dx.clone(), la).unwrap();
                check(&format!("distribute {la}"), x.clone(), ox.clone());
                gathered_to_each_process(&format!("{la}"), x.clone(), &dx);
                check(&format!("exp {la}"), x.clone().exp(), ox.clone().exp());
                check(
                    &format!("sum_dim(0) {la}"),
                    x.clone().sum_dim(0),
                    ox.clone().sum_dim(0),
                );
                check(
                    &format!("sum_dim(1) {la}"),
                    x.clone().sum_dim(1),
                    ox.clone().sum_dim(1),
                );
                // Indexing a sharded dim: masked per position, a pending sum across processes.
                let gi: Vec<i64> = (0..shape[0])
                    .map(|i| ((i * 2 + 1) % shape[1]) as i64)
                    .collect();
                let gi = TensorData::new(gi, [shape[0], 1]);
                let ids = TensorData::new(vec![shape[0] as i64 - 1, 0], [2]);
                let gidx: Tensor<DB, 2, Int> =
                    distribute(gi.clone(), &Layout::replicated(&m, 2)).unwrap();
                let sidx: Tensor<DB, 1, Int> =
                    distribute(ids.clone(), &Layout::replicated(&m, 1)).unwrap();
                check(
                    &format!("gather(1) {la}"),
                    x.clone().gather(1, gidx),
                    ox.clone().gather(1, Tensor::from_data(gi, &dev)),
                );
                check(
                    &format!("select(0) {la}"),
                    x.clone().select(0, sidx),
                    ox.clone().select(0, Tensor::from_data(ids, &dev)),
                );
                for lb in &ls {
                    let y: Tensor<DB, 2> = distribute(dy.clone(), lb).unwrap();
                    check(
                        &format!("{la} + {lb}"),
                        x.clone() + y,
                        ox.clone() + oy.clone(),
                    );
                    let settled = lb.without_partial();
                    check(
                        &format!("relayout {la} -> {settled}"),
                        x.clone().relayout(&settled).unwrap(),
                        ox.clone(),
                    );
                    let lw = Layout::new(&m, [UNSHARDED, UNSHARDED]).unwrap();
                    let lw = if lb.dims().iter().any(Option::is_some) {
                        lb.without_partial()
                    } else {
                        lw
                    };
                    let w: Tensor<DB, 2> = distribute(dw.clone(), &lw).unwrap();
                    check(
                        &format!("{la} @ {lw}"),
                        x.clone().matmul(w),
                        ox.clone().matmul(ow.clone()),
                    );
                }
            }
        }
    }
    done(name);
}

/// A process whose every shard is empty: a dim of 1 split over the mesh (one or two positions a
/// process, 2 and 4 processes) leaves every rank but 0 only `[0, ..]` shards, so no shard of
/// this process gives the op's output dtype or shape. Element-wise ops on fresh shards, a
/// comparison (bool out), a cast (int out), a reduction, a matmul and a batch-parallel module op
/// (`conv2d`, whose output shape only the inner op knows), gathered on every process against
/// NdArray on the whole tensors; on NdArray, and on plain and fused Wgpu, whose in-place check
/// underflows on an empty operand (`burn-cubecl` 0.21's `is_nonoverlapping`, a panic in the
/// test profile).
#[test]
fn empty_process() {
    let name = "empty_process";
    if launched(name, &[2, 4]) {
        return;
    }
    empty_process_on::<NdArray<f32>>(Default::default());
    #[cfg(feature = "wgpu")]
    {
        use burn::backend::wgpu::WgpuDevice;
        if common::available::<common::WgpuPlain>(&WgpuDevice::Cpu) {
            empty_process_on::<common::WgpuPlain>(WgpuDevice::Cpu);
        }
        #[cfg(feature = "fusion")]
        if common::available::<burn::backend::Wgpu>(&WgpuDevice::Cpu) {
            empty_process_on::<burn::backend::Wgpu>(WgpuDevice::Cpu);
        }
    }
    done(name);
}

fn empty_process_on<I: burn::tensor::backend::Backend>(device: I::Device) {
    // One and two positions a process (the second: the per-device path of a process, which
    // never stacks an uneven split).
    for per in [1, 2] {
        empty_process_mesh::<I>(device.clone(), per);
    }
}

fn empty_process_mesh<I: burn::tensor::backend::Backend>(device: I::Device, per: usize) {
    use burn::tensor::module::conv2d;
    use burn::tensor::ops::ConvOptions;
    type D<I> = DistributedBackend<I>;
    let world = spmd::init().unwrap();
    let m = Mesh::spmd([("x", world.size() * per)], vec![device; per]).unwrap();
    let rows = |r: usize| Layout::replicated(&m, r).with_dim(0, Some(0)).unwrap();
    let (dx, dy, dw) = (data([1, 3], 10), data([1, 3], 11), data([3, 2], 12));
    let dc = TensorData::new(
        (0..18).map(|i| (i as f32 - 8.5) / 4.0).collect::<Vec<_>>(),
        [1, 2, 3, 3],
    );
    let dk = TensorData::new(
        (0..24).map(|i| (i as f32 - 12.0) / 8.0).collect::<Vec<_>>(),
        [3, 2, 2, 2],
    );
    let o = |d: &TensorData| Tensor::<N, 2>::from_data(d.clone(), &Default::default());
    let (ox, oy, ow) = (o(&dx), o(&dy), o(&dw));
    let x: Tensor<D<I>, 2> = distribute(dx, &rows(2)).unwrap();
    let y: Tensor<D<I>, 2> = distribute(dy, &rows(2)).unwrap();
    let w: Tensor<D<I>, 2> = distribute(dw, &Layout::replicated(&m, 2)).unwrap();
    if world.rank() > 0 {
        assert!(x.clone().to_local_shards().iter().all(|s| s.dims()[0] == 0));
    }
    let what = format!("{} ({per} a process)", std::any::type_name::<I>());
    let same = |op: &str, got: TensorData, want: TensorData| {
        let (g, w) = (got.convert::<f32>(), want.convert::<f32>());
        assert_eq!(g.shape, w.shape, "{op} on {what}: shape");
        close(
            &format!("{op} on {what}"),
            &g.to_vec::<f32>().unwrap(),
            &w.to_vec::<f32>().unwrap(),
        );
    };
    same(
        "exp(x / 2) + y",
        ((x.clone() * 0.5).exp() + y.clone()).into_data(),
        ((ox.clone() * 0.5).exp() + oy.clone()).into_data(),
    );
    same(
        "x > y",
        x.clone().greater(y.clone()).float().into_data(),
        ox.clone().greater(oy.clone()).float().into_data(),
    );
    same(
        "int(8 x)",
        (x.clone() * 8.0).int().into_data(),
        (ox.clone() * 8.0).int().into_data(),
    );
    same(
        "sum_dim(1)",
        x.clone().sum_dim(1).into_data(),
        ox.clone().sum_dim(1).into_data(),
    );
    same("x @ w", x.matmul(w).into_data(), ox.matmul(ow).into_data());
    let c: Tensor<D<I>, 4> = distribute(dc.clone(), &rows(4)).unwrap();
    let k: Tensor<D<I>, 4> = distribute(dk.clone(), &Layout::replicated(&m, 4)).unwrap();
    let opts = || ConvOptions::new([1, 1], [0, 0], [1, 1], 1);
    let oc = Tensor::<N, 4>::from_data(dc, &Default::default());
    let ok = Tensor::<N, 4>::from_data(dk, &Default::default());
    same(
        "conv2d",
        conv2d(c, k, None, opts()).into_data(),
        conv2d(oc, ok, None, opts()).into_data(),
    );
}

/// `l` with the same sharding spec and pending reductions on mesh `m` (a mesh of the same axes).
fn on_mesh(l: &Layout, m: &Mesh<Dev>) -> Layout {
    let mut out = Layout::replicated(m, l.rank());
    for d in 0..l.rank() {
        out = out.with_dim(d, l.dim_axis(d)).unwrap();
    }
    for a in 0..m.topology().ndim() {
        if let Some(op) = l.partial(a) {
            out = out.with_partial(a, op);
        }
    }
    out
}

/// A process's positions held stacked relayout as the same positions held one by one: every
/// layout pair, both reductions, the same values bitwise and the same collectives recorded
/// (kind, axis, bytes in process and across processes). Along an axis the process holds whole
/// the stacked collectives run; along one that spans processes the per-position ones.
#[test]
fn stacked_relayouts_match_per_position_ones_across_processes() {
    let name = "stacked_relayouts_match_per_position_ones_across_processes";
    if launched(name, &[2, 4]) {
        return;
    }
    for reduction in [spmd::Reduction::Ordered, spmd::Reduction::Engine] {
        configure(config().with_reduction(reduction));
        for m in meshes().into_iter().filter(|m| m.topology().is_stacked()) {
            let unstacked = m.with_stacked_execution(false);
            let ls = layouts(&m);
            for shape in [[8, 8], [5, 3]] {
                let dx = data(shape, 4);
                for la in &ls {
                    for lb in &ls {
                        let x: Tensor<DB, 2> = distribute(dx.clone(), la).unwrap();
                        let xp: Tensor<DB, 2> =
                            distribute(dx.clone(), &on_mesh(la, &unstacked)).unwrap();
                        let (y, log) = record_comms(|| x.relayout(lb));
                        let (yp, logp) = record_comms(|| xp.relayout(&on_mesh(lb, &unstacked)));
                        let (y, yp) = match (y, yp) {
                            (Ok(y), Ok(yp)) => (y, yp),
                            // A relayout the planner refuses is refused in both forms.
                            (Err(_), Err(_)) => continue,
                            (y, yp) => panic!(
                                "{la} -> {lb}: stacked {:?}, per position {:?}",
                                y.err(),
                                yp.err()
                            ),
                        };
                        assert_eq!(log, logp, "{la} -> {lb} ({reduction:?}): collectives");
                        let (v, vp) = (y.to_local_shards(), yp.to_local_shards());
                        assert_eq!(v.len(), vp.len());
                        for (a, b) in v.into_iter().zip(vp) {
                            assert_eq!(
                                a.into_data(),
                                b.into_data(),
                                "{la} -> {lb} ({reduction:?}): shards"
                            );
                        }
                    }
                }
            }
        }
    }
    configure(config().with_reduction(spmd::Reduction::Ordered));
    done(name);
}

/// With the engine's reduction (`Reduction::Engine`): every partial layout relaid out to every
/// settled one, even and uneven shapes, so that a pending sum settles by the engine's all-reduce
/// (to replicated) or its reduce-scatter (`MPI_Reduce_scatter`, to a sharded dim 0 or dim 1),
/// against NdArray on the whole tensor (float tolerance: MPI's summation order), and the
/// reduced bytes land in each process's own shards.
#[test]
fn engine_reduction_across_processes() {
    let name = "engine_reduction_across_processes";
    if launched(name, &[2, 4]) {
        return;
    }
    let dev = Default::default();
    burn_dtensor::configure(burn_dtensor::config().with_reduction(spmd::Reduction::Engine));
    for m in meshes() {
        let ls = layouts(&m);
        for shape in [[5, 3], [8, 6], [2, 7]] {
            let dx = data(shape, 4);
            let ox = Tensor::<N, 2>::from_data(dx.clone(), &dev);
            for la in ls.iter().filter(|l| l.is_partial()) {
                for lb in ls.iter().filter(|l| !l.is_partial()) {
                    let x: Tensor<DB, 2> = distribute(dx.clone(), la).unwrap();
                    check(
                        &format!("engine relayout {la} -> {lb}"),
                        x.relayout(lb).unwrap(),
                        ox.clone(),
                    );
                }
            }
        }
    }
    burn_dtensor::configure(burn_dtensor::config().with_reduction(spmd::Reduction::Ordered));
    done(name);
}

/// An all-to-all whose parts are strided boxes of the shard, sent by MPI through derived
/// datatypes (`StridedSend::Datatype`: `MPI_Ialltoallw` over nested hvectors, no pack) or
/// written into the peers' buffers (`StridedSend::SingleCopy`: `process_vm_writev`, for
/// tensors of 1 MiB and more, as the all-gathers and the ordered reductions' exchanges are
/// then): every settled rank-3 layout relaid out to every other, even, uneven and empty
/// shards, gives the packed send's shards bitwise, the same collectives, and the whole
/// tensor's bytes gathered, also with every message large (`Config::large_message_bytes` 0:
/// MPI's blocking collectives and the single copy on small shapes). A pending sum of 1.07 MB
/// (values whose sum depends on the order) settled into every layout equals, bitwise, the
/// same mesh held by one process. A mesh built while every message is large sets up its
/// groups (their ranks, the single-copy probe) without hanging.
#[test]
fn strided_sends_across_processes() {
    let name = "strided_sends_across_processes";
    if launched(name, &[2, 4]) {
        return;
    }
    // A mesh built while every message is large (as under `BURN_DTENSOR_LARGE_MESSAGE_KIB=0`):
    // its groups' own set-up exchanges (the ranks of a new group, the single-copy probe) stay
    // small, and its all-gathers (single copies from 3 processes on) and all-to-alls run as
    // large messages on a tensor of a few hundred bytes.
    configure(config().with_large_message_bytes(0));
    let n = spmd::init().unwrap().size();
    let m = Mesh::spmd([("every_large", 4)], vec![Dev::default(); 4 / n]).unwrap();
    let dx = TensorData::new((0..48).map(|i| i as f32 - 7.5).collect::<Vec<_>>(), [8, 6]);
    let rows = Layout::new(&m, ["every_large", "unsharded"]).unwrap();
    let x: Tensor<DB, 2> = distribute(dx.clone(), &rows).unwrap();
    for to in [
        Layout::replicated(&m, 2),
        Layout::new(&m, ["unsharded", "every_large"]).unwrap(),
    ] {
        let y = x.clone().relayout(&to).unwrap();
        assert_eq!(y.into_data(), dx, "{rows} -> {to}, every message large");
    }
    configure(
        config().with_large_message_bytes(burn_dtensor::Config::default().large_message_bytes),
    );
    for m in meshes() {
        let ls = settled_layouts(&m, 3);
        assert!(ls.len() > 3, "{m}: layouts");
        // Over 1 MiB the single copy runs (smaller tensors are packed): on the one-axis mesh,
        // uneven along its last dim, with a pending sum over the axis relaid out too.
        let mut shapes = vec![[4, 6, 8], [5, 3, 2], [2, 1, 7]];
        let large = [8, 128, 261];
        if m.topology().axes().len() == 1 {
            shapes.push(large);
            let partial = Layout::replicated(&m, 3).with_partial(0, ReduceOp::Sum);
            let n: usize = large.iter().product();
            let vals = |g: usize| -> Tensor<N, 3> {
                let v: Vec<f32> = (0..n)
                    .map(|i| {
                        ((i * 7 + g * 131) % 1009) as f32 / 7.0 * 10f32.powi((i % 5) as i32 - 2)
                    })
                    .collect();
                Tensor::from_data(TensorData::new(v, large), &Dev::default())
            };
            let k = m.topology().size();
            let one = Mesh::new([("a", k)], vec![Dev::default(); k]).unwrap();
            let one_partial = Layout::replicated(&one, 3).with_partial(0, ReduceOp::Sum);
            let local = m.topology().local_size();
            for lb in &ls {
                let spec = lb.sharding_spec();
                let want = burn_dtensor::from_local_shards(
                    (0..k).map(vals).collect(),
                    large,
                    &one_partial,
                )
                .unwrap()
                .relayout(&Layout::new(&one, spec.iter().map(|s| s.as_str())).unwrap())
                .unwrap()
                .into_data();
                for send in [
                    StridedSend::Pack,
                    StridedSend::Datatype,
                    StridedSend::SingleCopy,
                ] {
                    configure(config().with_strided_send(send));
                    let mine = (0..local).map(|j| vals(m.topology().global(j))).collect();
                    let x = burn_dtensor::from_local_shards(mine, large, &partial).unwrap();
                    let got = x.relayout(lb).unwrap().into_data();
                    assert_eq!(
                        got, want,
                        "{partial} -> {lb} ({send:?}): the one-process mesh"
                    );
                }
            }
        }
        let default_large = burn_dtensor::Config::default().large_message_bytes;
        for shape in shapes {
            let n: usize = shape.iter().product();
            let v: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 3.0).collect();
            let dx = TensorData::new(v, shape);
            for la in &ls {
                for lb in &ls {
                    let relaid = |s: StridedSend, large: usize| {
                        configure(
                            config()
                                .with_strided_send(s)
                                .with_large_message_bytes(large),
                        );
                        let x: Tensor<DB, 3> = distribute(dx.clone(), la).unwrap();
                        record_comms(|| x.relayout(lb).unwrap())
                    };
                    let (packed, log) = relaid(StridedSend::Pack, default_large);
                    assert_eq!(packed.clone().into_data(), dx, "{la} -> {lb}: gathered");
                    // Every message large too (`Config::large_message_bytes` 0): MPI's blocking
                    // collectives and the single copy on these small shapes, empty parts
                    // included.
                    for (send, large) in [
                        (StridedSend::Datatype, default_large),
                        (StridedSend::SingleCopy, default_large),
                        (StridedSend::SingleCopy, 0),
                        (StridedSend::Pack, 0),
                    ] {
                        let (sent, log_s) = relaid(send, large);
                        let what =
                            format!("{shape:?} {la} -> {lb} ({send:?}, large from {large} B)");
                        assert_eq!(log, log_s, "{what}: collectives");
                        let a = packed.clone().to_local_shards();
                        let b = sent.clone().to_local_shards();
                        assert_eq!(a.len(), b.len(), "{what}");
                        for (a, b) in a.into_iter().zip(b) {
                            assert_eq!(a.into_data(), b.into_data(), "{what}: shards");
                        }
                        assert_eq!(sent.into_data(), dx, "{what}: gathered");
                    }
                }
            }
        }
    }
    let defaults = burn_dtensor::Config::default();
    configure(
        config()
            .with_strided_send(defaults.strided_send)
            .with_large_message_bytes(defaults.large_message_bytes),
    );
    done(name);
}

/// Each process passes only its block of the global tensor (`distribute_local`): the result
/// is `distribute` of the whole tensor, for every settled layout and shape; a block of the wrong
/// shape is a typed error.
#[test]
fn process_local_input_across_processes() {
    let name = "process_local_input_across_processes";
    if launched(name, &[2, 4]) {
        return;
    }
    let dev = Default::default();
    for m in meshes() {
        for l in layouts(&m).into_iter().filter(|l| !l.is_partial()) {
            for shape in [[5, 3], [8, 6], [2, 7]] {
                let d = data(shape, 9);
                let block = burn_dtensor::process_block(&l, &shape).unwrap();
                let v: Vec<f32> = d.to_vec().unwrap();
                let local = TensorData::new(
                    extract(&v, &shape, &block),
                    [block[0].len(), block[1].len()],
                );
                let x: Tensor<DB, 2> = burn_dtensor::distribute_local(local, shape, &l).unwrap();
                check(
                    &format!("distribute_local {l} {shape:?}"),
                    x,
                    Tensor::<N, 2>::from_data(d.clone(), &dev),
                );
                let bad = TensorData::new(vec![0.0f32; 3], [1, 3]);
                let e = burn_dtensor::distribute_local::<NdArray<f32>, 2, burn::tensor::Float>(
                    bad,
                    [50, 3],
                    &l,
                );
                assert!(
                    matches!(
                        e,
                        Err(burn_dtensor::DTensorError::ShardShapeMismatch { .. })
                    ),
                    "{l}"
                );
            }
        }
    }
    done(name);
}

/// Relayout to a layout of another mesh (JAX's `device_put` to another mesh's sharding): every
/// pair of the test meshes spanning the processes, every layout of the source (pending sums
/// included) to every settled layout of the target, and from and to a mesh local to each
/// process (4 devices of its own); the value and each process's shards against the oracle.
/// A 256 MiB tensor in row blocks moved to column blocks of another mesh raises no process's
/// peak by more than twice its block (plus 16 MiB): no process holds the whole tensor (measured
/// 1.00 x the block on 2 and 4 processes; the path through `into_data` and `from_data`,
/// `to_device`'s before, raised every process's peak by 511 MiB, 4 x and 8 x the block).
#[test]
fn relayout_across_meshes_across_processes() {
    let name = "relayout_across_meshes_across_processes";
    if launched(name, &[2, 4]) {
        return;
    }
    let w = spmd::init().unwrap();
    let n = w.size();
    let dev = Dev::default();
    let local = Mesh::new([("l", 2), ("k", 2)], vec![dev; 4]).unwrap();
    let mut all = meshes();
    all.push(local.clone());
    for m1 in &all {
        for m2 in &all {
            if m1.id() == m2.id() {
                continue;
            }
            for shape in [[5, 3], [8, 6]] {
                let d = data(shape, 4);
                let oracle = Tensor::<N, 2>::from_data(d.clone(), &dev);
                for la in layouts(m1) {
                    let x: Tensor<DB, 2> = distribute(d.clone(), &la).unwrap();
                    let moved = x.clone().to_device(&DistributedDevice::new(m2.clone()));
                    assert_eq!(moved.layout(), Layout::replicated(m2, 2));
                    check(&format!("to_device {la} -> {m2}"), moved, oracle.clone());
                    for lb in settled_layouts(m2, 2) {
                        let y = x.clone().relayout(&lb).unwrap();
                        assert_eq!(y.layout(), lb);
                        check(&format!("relayout {la} -> {lb}"), y, oracle.clone());
                    }
                }
            }
        }
    }
    // Memory: 256 MiB in row blocks over `p` to column blocks over `q`.
    let (mp, mq) = (
        Mesh::spmd([("p", n)], vec![dev]).unwrap(),
        Mesh::spmd([("q", n)], vec![dev]).unwrap(),
    );
    let shape = [4096, 16384];
    let rows = Layout::new(&mp, ["p", UNSHARDED]).unwrap();
    let cols = Layout::new(&mq, [UNSHARDED, "q"]).unwrap();
    let v = |i: usize, j: usize| ((i * 31 + j * 7) % 1000) as f32;
    let block = (shape[0] / n) * shape[1];
    let r0 = w.rank() * shape[0] / n;
    let mine: Vec<f32> = (0..block)
        .map(|k| v(r0 + k / shape[1], k % shape[1]))
        .collect();
    let mine = Tensor::<N, 2>::from_data(TensorData::new(mine, [shape[0] / n, shape[1]]), &dev);
    let x = burn_dtensor::from_local_shards(vec![mine], shape, &rows).unwrap();
    let (y, grew) = peak_growth(|| x.relayout(&cols).unwrap());
    let bytes = (block * 4) as u64;
    println!(
        "rank {}: relayout of 256 MiB across meshes over {n} processes raised the peak by {} MiB ({:.2} x the block)",
        w.rank(),
        grew >> 20,
        grew as f64 / bytes as f64
    );
    let c0 = w.rank() * shape[1] / n;
    let got: Vec<f32> = y
        .to_local_shards()
        .remove(0)
        .slice([4090..4096, 0..8])
        .into_data()
        .to_vec()
        .unwrap();
    let want: Vec<f32> = (0..48).map(|k| v(4090 + k / 8, c0 + k % 8)).collect();
    assert_eq!(got, want);
    assert!(
        grew <= 2 * bytes + (16 << 20),
        "peak grew {grew} B for a {bytes} B block"
    );
    done(name);
}

/// A matmul contracting over a dim sharded across processes on both operands (a data-parallel
/// weight gradient `x^T @ g`): with the ordered reduction each device computes its block of the
/// output's rows over the whole contracting dim (the left operand's rows moved onto the batch
/// axis by an all-to-all, the right operand gathered), and the output is gathered: bitwise
/// NdArray's on the whole tensors (what one process holding the mesh stacked computes), the
/// output settled and no reduction among the collectives; rows the batch axis does not divide
/// (`[14, 8]` on 4 shards) gather the contracting dim and compute the whole matmul on every
/// process instead, bitwise too. With the engine reduction it stays a partial sum, reduced by
/// the engine (equal to float tolerance). Shapes where the partial products outnumber the
/// operands (`[12, 8] @ [8, 10]` over 2 or 4 batch shards), as the one-process rule requires.
#[test]
fn contraction_across_processes() {
    let name = "contraction_across_processes";
    if launched(name, &[2, 4]) {
        return;
    }
    let dev = Default::default();
    // Values whose sums round (not multiples of a power of two), so that a different summation
    // order would show in the bits.
    let wavy = |shape: [usize; 2], seed: f32| {
        let v: Vec<f32> = (0..shape[0] * shape[1])
            .map(|i| (i as f32 * 0.37 + seed).sin() * 1.3)
            .collect();
        TensorData::new(v, shape)
    };
    for (rows, m) in [12, 14]
        .into_iter()
        .flat_map(|rows| meshes().into_iter().map(move |m| (rows, m)))
    {
        let (a, b) = (wavy([8, rows], 0.3), wavy([8, 10], 1.7));
        let want = Tensor::<N, 2>::from_data(a.clone(), &dev)
            .transpose()
            .matmul(Tensor::<N, 2>::from_data(b.clone(), &dev))
            .into_data();
        let first = m.topology().axes()[0].0.clone();
        let batch = Layout::new(&m, [first.as_str(), UNSHARDED]).unwrap();
        let x: Tensor<DB, 2> = distribute(a.clone(), &batch).unwrap();
        let g: Tensor<DB, 2> = distribute(b.clone(), &batch).unwrap();
        burn_dtensor::configure(burn_dtensor::config().with_reduction(spmd::Reduction::Ordered));
        let (y, log) = burn_dtensor::record_comms(|| x.clone().transpose().matmul(g.clone()));
        assert!(!y.layout().is_partial(), "{m}: {}", y.layout());
        let kinds: Vec<CollectiveKind> = log.events.iter().map(|e| e.kind).collect();
        let split = rows % m.topology().axes()[0].1 == 0;
        assert!(
            kinds.iter().all(
                |&k| k == CollectiveKind::AllGather || (split && k == CollectiveKind::AllToAll)
            ),
            "{m} rows {rows}: {log:?}"
        );
        assert_eq!(
            kinds.contains(&CollectiveKind::AllToAll),
            split,
            "{m} rows {rows}: {log:?}"
        );
        assert_eq!(y.into_data(), want, "{m} rows {rows}: ordered, bitwise");
        burn_dtensor::configure(burn_dtensor::config().with_reduction(spmd::Reduction::Engine));
        let y = x.transpose().matmul(g);
        assert!(y.layout().is_partial(), "{m}: {}", y.layout());
        y.into_data()
            .assert_approx_eq::<f32>(&want, burn::tensor::Tolerance::rel_abs(1e-5, 1e-6));
        burn_dtensor::configure(burn_dtensor::config().with_reduction(spmd::Reduction::Ordered));
    }
    done(name);
}

/// A field of `/proc/self/status` in bytes (`VmHWM`, `VmRSS`).
fn status_bytes(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = s.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

/// `f`'s result and how far it raised this process's peak resident memory, in bytes: `VmHWM`
/// after `f` over `VmRSS` before it, the peak reset first (`clear_refs` 5).
fn peak_growth<R>(f: impl FnOnce() -> R) -> (R, u64) {
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
    let rss = status_bytes("VmRSS:");
    let r = f();
    (r, status_bytes("VmHWM:").saturating_sub(rss))
}

/// Random creation across processes: on every mesh and settled creation layout, for each
/// distribution and float type, the values are bitwise those of a mesh of one (drawn by each
/// process alone) and each process's shards hold their box of them. A large creation
/// (`[8192, 8192]` f32, 256 MiB) sharded over the processes raises no process's peak resident
/// memory by more than 1.5 times its shard (plus 16 MiB): no process draws the whole tensor.
#[test]
fn random_creation_across_processes() {
    use burn::tensor::Distribution as Dn;
    use burn::tensor::backend::Backend;
    use burn_dtensor::{DistributedDevice, with_creation_layout};
    let name = "random_creation_across_processes";
    if launched(name, &[2, 4]) {
        return;
    }
    type DB64 = DistributedBackend<NdArray<f64>>;
    let one = DistributedDevice::new(Mesh::single(Dev::default()));
    let dists = [
        Dn::Default,
        Dn::Uniform(-2.0, 3.0),
        Dn::Normal(0.5, 2.0),
        Dn::Bernoulli(0.3),
    ];
    for m in meshes() {
        let md = DistributedDevice::new(m.clone());
        for l in layouts(&m).into_iter().filter(|l| !l.is_partial()) {
            for shape in [[5, 3], [2, 7]] {
                for dist in dists {
                    DB::seed(&one, 3);
                    let want = Tensor::<DB, 2>::random(shape, dist, &one);
                    DB::seed(&md, 3);
                    let got = with_creation_layout(&l, &shape, || {
                        Tensor::<DB, 2>::random(shape, dist, &md)
                    })
                    .unwrap();
                    assert_eq!(got.layout(), l);
                    let what = format!("{dist:?} {shape:?} {l}");
                    let w: Vec<f32> = want.into_data().to_vec().unwrap();
                    for (j, s) in got.clone().to_local_shards().into_iter().enumerate() {
                        let r = l.shard_ranges(&shape, m.topology().global(j));
                        let v: Vec<f32> = s.into_data().to_vec().unwrap();
                        assert_eq!(v, extract(&w, &shape, &r), "{what}: position {j}");
                    }
                    assert_eq!(got.into_data().to_vec::<f32>().unwrap(), w, "{what}");
                    DB64::seed(&one, 3);
                    let f64 = burn::tensor::DType::F64;
                    let want = Tensor::<DB64, 2>::random(shape, dist, (&one, f64)).into_data();
                    DB64::seed(&md, 3);
                    let got = with_creation_layout(&l, &shape, || {
                        Tensor::<DB64, 2>::random(shape, dist, (&md, f64))
                    })
                    .unwrap();
                    assert_eq!(got.into_data(), want, "{what} f64");
                }
            }
        }
    }
    let n = spmd::init().unwrap().size();
    let m = Mesh::spmd([("p", n)], vec![Dev::default()]).unwrap();
    let l = Layout::new(&m, ["p", UNSHARDED]).unwrap();
    let md = DistributedDevice::new(m);
    let rss = status_bytes("VmRSS:");
    let t = with_creation_layout(&l, &[8192, 8192], || {
        Tensor::<DB, 2>::random([8192, 8192], Dn::Default, &md)
    })
    .unwrap();
    let grew = status_bytes("VmHWM:").saturating_sub(rss);
    let shard = (8192 * 8192 * 4 / n) as u64;
    println!(
        "rank {}: a 256 MiB random tensor over {n} processes raised the peak by {} MiB (shard {} MiB)",
        spmd::init().unwrap().rank(),
        grew >> 20,
        shard >> 20
    );
    assert!(
        grew <= shard * 3 / 2 + (16 << 20),
        "peak grew {grew} B for a {shard} B shard"
    );
    assert_eq!(t.clone().to_local_shards()[0].dims(), [8192 / n, 8192]);
    // Gathered to the last process only: the others hold no more than their shard once again
    // (sent from its download); the destination, the received shards and the whole.
    let me = spmd::init().unwrap().rank();
    if std::fs::write("/proc/self/clear_refs", "5").is_ok() {
        let rss = status_bytes("VmRSS:");
        let got = t.clone().gather_to_process(n - 1).unwrap();
        let grew = status_bytes("VmHWM:").saturating_sub(rss);
        let whole = shard * n as u64;
        println!(
            "rank {me}: gathering the 256 MiB tensor to rank {} raised the peak by {} MiB",
            n - 1,
            grew >> 20
        );
        if me == n - 1 {
            assert!(grew <= whole * 5 / 2 + (16 << 20), "peak grew {grew} B");
            assert_eq!(got.unwrap(), t.into_data(), "gathered to rank {}", n - 1);
        } else {
            assert!(got.is_none());
            assert!(
                grew <= shard * 3 / 2 + (16 << 20),
                "peak grew {grew} B for a {shard} B shard"
            );
            let _ = t.into_data();
        }
    }
    done(name);
}

/// The collectives across processes run in bounded memory (issue 20: about twice what they
/// produce), on a 256 MiB tensor over the processes (one mesh position each): the ordered
/// all-reduce of a partial sum (each process holds its shard, one round's slice of every
/// member's chunk and the result, never all `k` shards: what gathering them took, `k` times
/// the shard, twice) within 2 x the shard; the ordered reduce-scatter into row blocks and the
/// all-to-all from row to column blocks within 2 x the block they produce. Peaks are growths of
/// `VmHWM` over the resident input; the values are the sum on every rank.
#[test]
fn collectives_in_bounded_memory() {
    let name = "collectives_in_bounded_memory";
    if launched(name, &[2, 4]) {
        return;
    }
    let w = spmd::init().unwrap();
    let n = w.size();
    let m = Mesh::spmd([("p", n)], vec![Dev::default()]).unwrap();
    let partial = Layout::replicated(&m, 2).with_partial(0, ReduceOp::Sum);
    let shape = [4096, 16384];
    let mine = Tensor::<N, 2>::full(shape, (w.rank() + 1) as f32 * 0.1, &Dev::default());
    let x = burn_dtensor::from_local_shards(vec![mine], shape, &partial).unwrap();
    let rss = status_bytes("VmRSS:");
    let y = x.relayout(&Layout::replicated(&m, 2)).unwrap();
    let grew = status_bytes("VmHWM:").saturating_sub(rss);
    let shard: u64 = 4096 * 16384 * 4;
    println!(
        "rank {}: ordered all-reduce of 256 MiB over {n} processes raised the peak by {} MiB ({:.2} x the shard)",
        w.rank(),
        grew >> 20,
        grew as f64 / shard as f64
    );
    let want: f32 = (1..=n).map(|r| r as f32 * 0.1).sum();
    let local = y.to_local_shards().remove(0);
    let v: Vec<f32> = local.slice([0..4096, 0..64]).into_data().to_vec().unwrap();
    assert!(
        v.iter().all(|x| (x - want).abs() < 1e-5),
        "{} vs {want}",
        v[0]
    );
    // Issue 20's bar: under 2.5 x the shard on 4 processes; this test holds it to 2 x
    // (measured 1.47 x on 4 processes, 1.82 x on 2: the result, this process's reduced chunk
    // and one round's buffers).
    assert!(
        grew <= 2 * shard,
        "peak grew {grew} B for a {shard} B shard"
    );
    // The reduce-scatter of the same partial sum into row blocks: each process receives only
    // its block from every member, in rounds of a slice of every block, and assembles the
    // block it produces. The bar: twice that block (measured 1.24 x on 2 processes, 1.64 x on
    // 4), where receiving every member's block at once took the input's size again.
    let rows = Layout::new(&m, ["p", UNSHARDED]).unwrap();
    let block = shard / n as u64;
    let mine = Tensor::<N, 2>::full(shape, (w.rank() + 1) as f32 * 0.1, &Dev::default());
    let x = burn_dtensor::from_local_shards(vec![mine], shape, &partial).unwrap();
    let (r, grew) = peak_growth(|| x.relayout(&rows).unwrap());
    println!(
        "rank {}: ordered reduce-scatter of 256 MiB over {n} processes raised the peak by {} MiB ({:.2} x the block)",
        w.rank(),
        grew >> 20,
        grew as f64 / block as f64
    );
    let local = r.clone().to_local_shards().remove(0);
    assert_eq!(local.dims(), [4096 / n, 16384]);
    let v: Vec<f32> = local.slice([0..1, 0..64]).into_data().to_vec().unwrap();
    assert!(
        v.iter().all(|x| (x - want).abs() < 1e-5),
        "{} vs {want}",
        v[0]
    );
    assert!(grew <= 2 * block + (16 << 20), "peak grew {grew} B");
    // The all-to-all from row blocks to column blocks: each process sends only the parts that
    // change process. The bar: twice the block it produces, its send buffer and the result
    // (measured 2.00 x packed; since session 67 the default writes the parts from the shard
    // into the peers' results, no send buffer: 1.00 x on 2 and 4 processes, packed 1.50 x and
    // 1.75 x).
    let cols = Layout::new(&m, [UNSHARDED, "p"]).unwrap();
    let (c, grew) = peak_growth(|| r.relayout(&cols).unwrap());
    println!(
        "rank {}: all-to-all of 256 MiB over {n} processes raised the peak by {} MiB ({:.2} x the block)",
        w.rank(),
        grew >> 20,
        grew as f64 / block as f64
    );
    let local = c.to_local_shards().remove(0);
    assert_eq!(local.dims(), [4096, 16384 / n]);
    let v: Vec<f32> = local
        .slice([4095..4096, 0..64])
        .into_data()
        .to_vec()
        .unwrap();
    assert!(
        v.iter().all(|x| (x - want).abs() < 1e-5),
        "{} vs {want}",
        v[0]
    );
    assert!(grew <= 2 * block + (16 << 20), "peak grew {grew} B");
    // Rounds change no bit: an uneven partial sum of 23 MiB per process (3 rounds), with
    // values whose sum depends on the order, reduced across the processes equals the same
    // mesh in one process bitwise: all-reduce, reduce-scatter along either dim, and the
    // all-gathers that read the scattered results.
    let shape = [3001, 2003];
    let vals = |r: usize| -> Tensor<N, 2> {
        let v: Vec<f32> = (0..shape[0] * shape[1])
            .map(|i| {
                let h = (i as u64 * 2_654_435_761 + r as u64 * 40_503) % 100_003;
                h as f32 / 7.0 * 10f32.powi((i % 9) as i32 - 4)
            })
            .collect();
        Tensor::from_data(TensorData::new(v, shape), &Dev::default())
    };
    let one = Mesh::new([("p", n)], vec![Dev::default(); n]).unwrap();
    let one_partial = Layout::replicated(&one, 2).with_partial(0, ReduceOp::Sum);
    for spec in [[UNSHARDED, UNSHARDED], ["p", UNSHARDED], [UNSHARDED, "p"]] {
        let want = burn_dtensor::from_local_shards((0..n).map(vals).collect(), shape, &one_partial)
            .unwrap()
            .relayout(&Layout::new(&one, spec).unwrap())
            .unwrap()
            .into_data();
        let got = burn_dtensor::from_local_shards(vec![vals(w.rank())], shape, &partial)
            .unwrap()
            .relayout(&Layout::new(&m, spec).unwrap())
            .unwrap()
            .into_data();
        assert_eq!(got, want, "{spec:?}: bitwise the one-process mesh");
    }
    done(name);
}

/// Gradients of `sum(relu(x @ w) * y)` with `x` batch-sharded and `w` sharded on either dim,
/// against `Autodiff<NdArray>`.
#[test]
fn gradients_across_processes() {
    let name = "gradients_across_processes";
    if launched(name, &[2, 4]) {
        return;
    }
    type AD = Autodiff<DB>;
    type AN = Autodiff<N>;
    let dev = Default::default();
    for m in meshes() {
        let axes: Vec<String> = m.topology().axes().iter().map(|a| a.0.clone()).collect();
        let first = axes[0].as_str();
        let last = axes[axes.len() - 1].as_str();
        for shape in [[6, 5], [3, 7]] {
            let (dx, dw, dy) = (
                data(shape, 4),
                data([shape[1], 3], 5),
                data([shape[0], 3], 6),
            );
            let ox = Tensor::<AN, 2>::from_data(dx.clone(), &dev).require_grad();
            let ow = Tensor::<AN, 2>::from_data(dw.clone(), &dev).require_grad();
            let oy = Tensor::<AN, 2>::from_data(dy.clone(), &dev);
            let og = (ox.clone().matmul(ow.clone()).clamp_min(0.0) * oy)
                .sum()
                .backward();
            let (gx, gw) = (ox.grad(&og).unwrap(), ow.grad(&og).unwrap());
            for wspec in [[UNSHARDED, UNSHARDED], [UNSHARDED, last], [last, UNSHARDED]] {
                let lx = Layout::new(&m, [first, UNSHARDED]).unwrap();
                let lw = Layout::new(&m, wspec).unwrap();
                let x: Tensor<AD, 2> = distribute(dx.clone(), &lx).unwrap();
                let x = x.require_grad();
                let w: Tensor<AD, 2> = distribute(dw.clone(), &lw).unwrap();
                let w = w.require_grad();
                let y: Tensor<AD, 2> = distribute(dy.clone(), &lx).unwrap();
                let g = (x.clone().matmul(w.clone()).clamp_min(0.0) * y)
                    .sum()
                    .backward();
                let what = format!("{m}: x {lx}, w {lw}, shape {shape:?}");
                check(&format!("dx {what}"), x.grad(&g).unwrap(), gx.clone());
                check(&format!("dw {what}"), w.grad(&g).unwrap(), gw.clone());
            }
        }
    }
    done(name);
}

/// Spatial parallelism across processes: a convolution (padding 1, a bias) of an image sharded
/// on its height (and width, on two-axis meshes), halos exchanged between neighbours that live
/// in other processes, and its input, weight and bias gradients: every process's shards hold
/// their chunk of `Autodiff<NdArray>` on the whole tensors, the input gradient keeps the
/// input's layout, and the gathered values are bitwise those of the same mesh in one process.
/// The halo rows cross processes only between neighbours (bytes counted by hand). Pools (max
/// with its global indices, average, the global average, and the input's gradient through them)
/// on the same shards equal NdArray's on the whole tensor and, bitwise, the one-process mesh's;
/// so does a transposed convolution (its output in the input's layout) and its gradients.
#[test]
fn spatial_convolution_across_processes() {
    let name = "spatial_convolution_across_processes";
    if launched(name, &[2, 4]) {
        return;
    }
    use burn::tensor::module::conv2d;
    use burn::tensor::ops::{ConvOptions, ConvTransposeOptions};
    type AD = Autodiff<DB>;
    type AN = Autodiff<N>;
    let dev = Dev::default();
    let vals = |shape: [usize; 4], seed: usize| {
        let n = shape.iter().product::<usize>();
        let v: Vec<f32> = (0..n)
            .map(|i| (((i * 7 + seed * 13) % 33) as f32 - 16.0) / 8.0)
            .collect();
        TensorData::new(v, shape)
    };
    let (sx, sw, sy) = ([2, 2, 9, 10], [3, 2, 3, 3], [2, 3, 9, 10]);
    let (dx, dw, dy) = (vals(sx, 1), vals(sw, 2), vals(sy, 3));
    let db = TensorData::new(vec![0.5f32, -0.25, 1.0], [3]);
    let opts = || ConvOptions::new([1, 1], [1, 1], [1, 1], 1);
    let ox = Tensor::<AN, 4>::from_data(dx.clone(), &dev).require_grad();
    let ow = Tensor::<AN, 4>::from_data(dw.clone(), &dev).require_grad();
    let ob = Tensor::<AN, 1>::from_data(db.clone(), &dev).require_grad();
    let oy = Tensor::<AN, 4>::from_data(dy.clone(), &dev);
    let oout = conv2d(ox.clone(), ow.clone(), Some(ob.clone()), opts());
    let og = (oout.clone() * oy).sum().backward();
    let want = [
        oout.inner().into_data(),
        ox.grad(&og).unwrap().into_data(),
        ow.grad(&og).unwrap().into_data(),
        ob.grad(&og).unwrap().into_data(),
    ];
    // The whole run on mesh `m` (input `spec`): output, input, weight and bias gradients.
    let run = |m: &Mesh<Dev>, spec: &[&str]| {
        let lx = Layout::new(m, spec.to_vec()).unwrap();
        let x: Tensor<AD, 4> = distribute(dx.clone(), &lx).unwrap();
        let x = x.require_grad();
        let w: Tensor<AD, 4> = distribute(dw.clone(), &Layout::replicated(m, 4)).unwrap();
        let w = w.require_grad();
        let b: Tensor<AD, 1> = distribute(db.clone(), &Layout::replicated(m, 1)).unwrap();
        let b = b.require_grad();
        let y: Tensor<AD, 4> = distribute(dy.clone(), &lx).unwrap();
        let out = conv2d(x.clone(), w.clone(), Some(b.clone()), opts());
        assert_eq!(out.layout(), lx, "{m}: the output keeps the spatial shards");
        let g = (out.clone() * y).sum().backward();
        let gx = x.grad(&g).unwrap();
        assert_eq!(
            gx.layout(),
            lx,
            "{m}: the input gradient keeps the input's layout"
        );
        let (gw, gb) = (w.grad(&g).unwrap(), b.grad(&g).unwrap());
        (out.inner(), gx, gw, gb)
    };
    // Max pool (a ResNet stem's), its indices (2x2, stride 1), an average pool (3x3, stride 1,
    // padding counted), the global average (a pending sum over the spatial axes) and the input's
    // gradient through the three pools.
    fn pools<B: burn::tensor::backend::AutodiffBackend>(
        x: Tensor<B, 4>,
    ) -> ([TensorData; 4], Vec<i64>) {
        use burn::tensor::module::{
            adaptive_avg_pool2d, avg_pool2d, max_pool2d, max_pool2d_with_indices,
        };
        let y = max_pool2d(x.clone(), [3, 3], [2, 2], [1, 1], [1, 1], false);
        let z = avg_pool2d(x.clone(), [3, 3], [1, 1], [1, 1], true, false);
        let (_, ix) = max_pool2d_with_indices(x.clone(), [2, 2], [1, 1], [0, 0], [1, 1], false);
        let a = adaptive_avg_pool2d(x.clone(), [1, 1]);
        let g = ((y.clone() * y.clone().cos()).sum()
            + (z.clone() * z.clone().sin()).sum()
            + (a.clone() * a.clone().exp()).sum())
        .backward();
        let gx = x.grad(&g).unwrap().into_data();
        let ix = ix.into_data().convert::<i64>().to_vec().unwrap();
        ([y.into_data(), z.into_data(), a.into_data(), gx], ix)
    }
    let want_pools = {
        let (v, ix) = pools(Tensor::<AN, 4>::from_data(dx.clone(), &dev).require_grad());
        (v.map(|d| d.to_vec::<f32>().unwrap()), ix)
    };
    let run_pools = |m: &Mesh<Dev>, spec: &[&str]| {
        let lx = Layout::new(m, spec.to_vec()).unwrap();
        let x: Tensor<AD, 4> = distribute(dx.clone(), &lx).unwrap();
        pools(x.require_grad())
    };
    // A transposed convolution (DCGAN's upsampling: kernel 4, stride 2, padding 1, a bias) of
    // the same shards: its output and the input's, weight's and bias's gradients.
    let dwt = vals([2, 3, 4, 4], 4);
    fn transposed<B: burn::tensor::backend::AutodiffBackend>(
        [x, w]: [Tensor<B, 4>; 2],
        b: Tensor<B, 1>,
    ) -> (Tensor<B, 4>, [TensorData; 3]) {
        use burn::tensor::module::conv_transpose2d;
        let o = ConvTransposeOptions::new([2, 2], [1, 1], [0, 0], [1, 1], 1);
        let out = conv_transpose2d(x.clone(), w.clone(), Some(b.clone()), o);
        let g = (out.clone() * out.clone().sin()).sum().backward();
        let grad = |t: Tensor<B, 4>| t.grad(&g).unwrap().into_data();
        let gb = b.grad(&g).unwrap().into_data();
        (out, [grad(x), grad(w), gb])
    }
    let want_transposed = {
        let t = |d: &TensorData| Tensor::<AN, 4>::from_data(d.clone(), &dev).require_grad();
        let b = Tensor::<AN, 1>::from_data(db.clone(), &dev).require_grad();
        let (out, [gx, gw, gb]) = transposed([t(&dx), t(&dwt)], b);
        [out.into_data(), gx, gw, gb]
    };
    // On mesh `m`, the output keeping the input's layout (overlap rows folded back to their
    // owners, across processes too).
    let run_transposed = |m: &Mesh<Dev>, spec: &[&str]| {
        let lx = Layout::new(m, spec.to_vec()).unwrap();
        let x: Tensor<AD, 4> = distribute(dx.clone(), &lx).unwrap();
        let w: Tensor<AD, 4> = distribute(dwt.clone(), &Layout::replicated(m, 4)).unwrap();
        let b: Tensor<AD, 1> = distribute(db.clone(), &Layout::replicated(m, 1)).unwrap();
        let (out, [gx, gw, gb]) =
            transposed([x.require_grad(), w.require_grad()], b.require_grad());
        assert_eq!(
            out.layout(),
            lx,
            "{m}: the transposed output keeps the input's layout"
        );
        [out.into_data(), gx, gw, gb]
    };
    let world = spmd::init().unwrap();
    for m in meshes() {
        let axes: Vec<String> = m.topology().axes().iter().map(|a| a.0.clone()).collect();
        let spec: Vec<&str> = if axes.len() == 1 {
            vec![UNSHARDED, UNSHARDED, &axes[0], UNSHARDED]
        } else {
            vec![UNSHARDED, UNSHARDED, &axes[0], &axes[1]]
        };
        let what = format!("{m} x {spec:?}");
        if axes.len() == 1 {
            // Only the neighbours' halo rows cross: each process receives one row of the image
            // (2 images x 2 channels x 10 columns of f32: the kernel reaches one row past each
            // block on either side) from each neighbouring process, none from the others.
            let lx = Layout::new(&m, spec.clone()).unwrap();
            let x: Tensor<DB, 4> = distribute(dx.clone(), &lx).unwrap();
            let w: Tensor<DB, 4> = distribute(dw.clone(), &Layout::replicated(&m, 4)).unwrap();
            let (_, log) = record_comms(|| conv2d(x, w, None, opts()));
            let (rank, n) = (world.rank(), world.size());
            let neighbours = (rank > 0) as u64 + (rank + 1 < n) as u64;
            assert_eq!(
                log.count(CollectiveKind::CollectivePermute),
                1,
                "{what}: {log}"
            );
            let across: u64 = log.events.iter().map(|e| e.across_processes).sum();
            assert_eq!(across, neighbours * 2 * 2 * 10 * 4, "{what}: {log}");
        }
        let (out, gx, gw, gb) = run(&m, &spec);
        // This process's shards of the output and the input gradient: their chunks.
        for (t, w, label) in [(&out, &want[0], "output"), (&gx, &want[1], "dx")] {
            let whole = Tensor::<N, 4>::from_data(w.clone(), &dev);
            let l = t.layout();
            let topo = l.mesh().clone();
            let shards = t.clone().to_local_shards();
            assert_eq!(shards.len(), topo.local_size(), "{what} {label}: shards");
            for (j, s) in shards.into_iter().enumerate() {
                let r = l.shard_ranges(t.dims().as_slice(), topo.global(j));
                let chunk =
                    whole
                        .clone()
                        .slice([r[0].clone(), r[1].clone(), r[2].clone(), r[3].clone()]);
                close(
                    &format!(
                        "{what} {label}: position {} of rank {}",
                        topo.global(j),
                        world.rank()
                    ),
                    &s.into_data().to_vec::<f32>().unwrap(),
                    &chunk.into_data().to_vec::<f32>().unwrap(),
                );
            }
        }
        let got = [
            out.into_data(),
            gx.into_data(),
            gw.into_data(),
            gb.into_data(),
        ];
        // The same mesh in one process.
        let size = m.topology().size();
        let one = Mesh::new(
            m.topology().axes().iter().map(|(a, k)| (a.as_str(), *k)),
            vec![dev; size],
        )
        .unwrap();
        // Pools on the same shards (halo rows across processes, the max pool's global indices):
        // equal to NdArray's on the whole tensor, bitwise the one-process mesh's.
        let (pools, pools_one) = (run_pools(&m, &spec), run_pools(&one, &spec));
        for (i, label) in ["max", "avg", "global average", "dx"].iter().enumerate() {
            let got = pools.0[i].to_vec::<f32>().unwrap();
            close(&format!("{what} pools {label}"), &got, &want_pools.0[i]);
            assert_eq!(pools.0[i], pools_one.0[i], "{what} pools {label}: bitwise");
        }
        assert_eq!(pools.1, want_pools.1, "{what}: the max pool's indices");
        assert_eq!(pools.1, pools_one.1, "{what}: the indices on one process");
        let (t, t_one) = (run_transposed(&m, &spec), run_transposed(&one, &spec));
        for (i, label) in ["output", "dx", "dw", "db"].iter().enumerate() {
            let got = t[i].to_vec::<f32>().unwrap();
            let want = want_transposed[i].to_vec::<f32>().unwrap();
            close(&format!("{what} transposed {label}"), &got, &want);
            assert_eq!(t[i], t_one[i], "{what} transposed {label}: bitwise");
        }
        let (oo, ogx, ogw, ogb) = run(&one, &spec);
        let alone = [
            oo.into_data(),
            ogx.into_data(),
            ogw.into_data(),
            ogb.into_data(),
        ];
        for (i, label) in ["output", "dx", "dw", "db"].iter().enumerate() {
            close(
                &format!("{what} {label}"),
                &got[i].to_vec::<f32>().unwrap(),
                &want[i].to_vec::<f32>().unwrap(),
            );
            assert_eq!(
                got[i], alone[i],
                "{what} {label}: bitwise the one-process mesh"
            );
        }
    }
    done(name);
}

/// Gradient buckets ([`settle_gradients`], DDP's `bucket_cap_mb`): the data-parallel gradients
/// of a two-layer network settle with one cross-process all-reduce per bucket of the cap, each
/// bucket the gradients laid end to end in parameter order; the values are bitwise those of the
/// gradients settled one by one (ordered reduction) and equal NdArray's on the whole batch.
#[test]
fn gradient_buckets_across_processes() {
    let name = "gradient_buckets_across_processes";
    if launched(name, &[2, 4]) {
        return;
    }
    type AD = Autodiff<DB>;
    type AN = Autodiff<N>;
    let n = spmd::init().unwrap().size();
    let m = Mesh::spmd([("batch", 4)], vec![Dev::default(); 4 / n]).unwrap();
    let flat = |d: TensorData| {
        let v: Vec<f32> = d.to_vec().unwrap();
        let len = v.len();
        TensorData::new(v, [len])
    };
    // Batch 32: every weight gradient stays a partial sum (its product is smaller than the
    // operands it would gather, `stack::contracts`), so all four gradients are all-reduced.
    let (dx, dy) = (data([32, 8], 1), data([32, 3], 2));
    let (d1, d2) = (data([8, 6], 3), data([6, 3], 4));
    let (b1, b2) = (flat(data([1, 6], 5)), flat(data([1, 3], 6)));
    let batch = Layout::new(&m, ["batch", UNSHARDED]).unwrap();
    // Settles the gradients with buckets of at most `cap` bytes: the parameters, their settled
    // gradients and the communication of the settling.
    let run = |cap: usize| {
        configure(config().with_gradient_bucket_bytes(cap));
        let p2 = |d: &TensorData| {
            let t: Tensor<AD, 2> = distribute(d.clone(), &Layout::replicated(&m, 2)).unwrap();
            Param::from_tensor(t.require_grad())
        };
        let p1 = |d: &TensorData| {
            let t: Tensor<AD, 1> = distribute(d.clone(), &Layout::replicated(&m, 1)).unwrap();
            Param::from_tensor(t.require_grad())
        };
        let module = (p2(&d1), p1(&b1), p2(&d2), p1(&b2));
        let x: Tensor<AD, 2> = distribute(dx.clone(), &batch).unwrap();
        let y: Tensor<AD, 2> = distribute(dy.clone(), &batch).unwrap();
        let h = (x.matmul(module.0.val()) + module.1.val().unsqueeze()).clamp_min(0.0);
        let loss = ((h.matmul(module.2.val()) + module.3.val().unsqueeze()) * y).sum();
        let grads = GradientsParams::from_grads(loss.backward(), &module);
        let (grads, log) = record_comms(|| settle_gradients(grads, &module).unwrap());
        let got: Vec<Vec<f32>> = [module.0.id, module.2.id]
            .into_iter()
            .map(|id| grads.get::<DB, 2>(id).unwrap())
            .chain(
                [module.1.id, module.3.id]
                    .into_iter()
                    .map(|id| grads.get::<DB, 1>(id).unwrap().unsqueeze::<2>()),
            )
            .map(|g| {
                assert!(g.layout().is_replicated(), "{}", g.describe());
                g.into_data().to_vec().unwrap()
            })
            .collect();
        let shapes: Vec<Vec<usize>> = log
            .events
            .iter()
            .map(|e| {
                assert!(
                    e.kind == CollectiveKind::AllReduce && e.axis == "batch",
                    "{e:?}"
                );
                assert!(e.across_processes > 0, "{e:?}");
                e.shape.clone()
            })
            .collect();
        (got, shapes, log.total_bytes())
    };
    let (alone, alone_shapes, alone_bytes) = run(0);
    // Without buckets, DDP's count: one all-reduce per gradient.
    assert_eq!(alone_shapes, vec![vec![8, 6], vec![6], vec![6, 3], vec![3]]);
    // One bucket of all four (8*6 + 6 + 6*3 + 3 = 75 elements). Its bytes are those of the
    // four on 2 processes; on 4 the ordered reduction's chunks of one rank fall elsewhere.
    let (all, all_shapes, all_bytes) = run(25 << 20);
    assert_eq!(all_shapes, vec![vec![75]]);
    if n == 2 {
        assert_eq!(all_bytes, alone_bytes);
    }
    // A cap of 100 bytes: w1 (192 B) alone, b1 and w2 (24 + 72 B) together, b2 (12 B) alone.
    let (capped, capped_shapes, _) = run(100);
    assert_eq!(capped_shapes, vec![vec![8, 6], vec![24], vec![3]]);
    configure(
        config().with_gradient_bucket_bytes(burn_dtensor::Config::default().gradient_bucket_bytes),
    );
    for (what, got) in [("one bucket", &all), ("cap 100 B", &capped)] {
        for (g, a) in got.iter().zip(&alone) {
            let (g, a): (Vec<u32>, Vec<u32>) = (
                g.iter().map(|v| v.to_bits()).collect(),
                a.iter().map(|v| v.to_bits()).collect(),
            );
            assert_eq!(
                g, a,
                "{what}: bucketed gradients differ from settled one by one"
            );
        }
    }
    // The oracle: NdArray's gradients of the whole batch.
    let dev = Default::default();
    let w1 = Tensor::<AN, 2>::from_data(d1.clone(), &dev).require_grad();
    let c1 = Tensor::<AN, 1>::from_data(b1.clone(), &dev).require_grad();
    let w2 = Tensor::<AN, 2>::from_data(d2.clone(), &dev).require_grad();
    let c2 = Tensor::<AN, 1>::from_data(b2.clone(), &dev).require_grad();
    let x = Tensor::<AN, 2>::from_data(dx.clone(), &dev);
    let y = Tensor::<AN, 2>::from_data(dy.clone(), &dev);
    let h = (x.matmul(w1.clone()) + c1.clone().unsqueeze()).clamp_min(0.0);
    let g = ((h.matmul(w2.clone()) + c2.clone().unsqueeze()) * y)
        .sum()
        .backward();
    let want: Vec<Vec<f32>> = [w1.grad(&g).unwrap(), w2.grad(&g).unwrap()]
        .into_iter()
        .chain([c1.grad(&g).unwrap(), c2.grad(&g).unwrap()].map(|t| t.unsqueeze::<2>()))
        .map(|t| t.into_data().to_vec().unwrap())
        .collect();
    for (i, (g, w)) in all.iter().zip(&want).enumerate() {
        close(&format!("gradient {i} against NdArray"), g, w);
    }
    done(name);
}

/// Processes asking for different meshes get a typed error naming the rank that differs;
/// a mesh whose blocks are not boxes is refused with the fix; a bad cross-process engine choice
/// is a typed error. Also `World::broadcast_bytes` and `World::broadcast_into`, which the examples'
/// data preparation uses.
#[test]
fn start_up_checks_across_processes() {
    let name = "start_up_checks_across_processes";
    if !is_worker() {
        launch(name, 2);
        return;
    }
    let w = spmd::init().unwrap();
    // Rank 1 asks for another mesh.
    let size = if w.rank() == 0 { 4 } else { 2 };
    let e = Mesh::spmd([("a", size)], vec![Dev::default(); size / 2]).unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(e, burn_dtensor::DTensorError::ProcessMismatch { .. }),
        "{msg}"
    );
    let other = 1 - w.rank();
    assert!(msg.contains(&format!("rank {other}")), "{msg}");
    // 3 positions per process over a 2x3 mesh: fine (one row each); 2x3 with 3 per process over
    // axes (3, 2): rows of 2, a block of 3 is not a box.
    Mesh::spmd([("r", 2), ("c", 3)], vec![Dev::default(); 3]).unwrap();
    let e = Mesh::spmd([("r", 3), ("c", 2)], vec![Dev::default(); 3]).unwrap_err();
    assert!(
        matches!(e, burn_dtensor::DTensorError::ProcessGrid { .. }),
        "{e}"
    );
    // The cross-process engine is chosen with the mesh (`Config::process_engine`): NCCL without
    // its features or on CPU devices is a typed error before any collective; an unknown name
    // in `BURN_DTENSOR_SPMD_ENGINE` is one too.
    let nccl_says = if cfg!(all(feature = "nccl", feature = "mpi")) {
        "CUDA devices"
    } else {
        "--features nccl,mpi"
    };
    let before = burn_dtensor::config();
    burn_dtensor::configure(before.with_process_engine(burn_dtensor::ProcessEngine::Nccl));
    let e = Mesh::spmd([("e", 4)], vec![Dev::default(); 2]).unwrap_err();
    assert!(
        matches!(e, burn_dtensor::DTensorError::Spmd(_)) && e.to_string().contains(nccl_says),
        "nccl: {e}"
    );
    let e = burn_dtensor::Config::from_vars(|k| {
        (k == "BURN_DTENSOR_SPMD_ENGINE").then(|| "bogus".to_string())
    })
    .unwrap_err();
    assert!(
        matches!(e, burn_dtensor::DTensorError::Config { .. }) && e.to_string().contains("`mpi`"),
        "bogus: {e}"
    );
    // MPI by name is the default.
    burn_dtensor::configure(before.with_process_engine(burn_dtensor::ProcessEngine::Mpi));
    let m = Mesh::spmd([("e", 4)], vec![Dev::default(); 2]);
    assert_eq!(m.unwrap().size(), 4);
    // Seeds and layout maps: `agree`.
    let e = w.agree("seed", &format!("{}", 40 + w.rank())).unwrap_err();
    assert!(e.to_string().contains("seed"), "{e}");
    w.agree("seed", "42").unwrap();
    // The reduction order is agreed with the mesh: a difference is named, with both values.
    burn_dtensor::configure(burn_dtensor::config().with_reduction(if w.rank() == 1 {
        spmd::Reduction::Engine
    } else {
        spmd::Reduction::Ordered
    }));
    let e = Mesh::spmd([("r", 4)], vec![Dev::default(); 2])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("disagree on the mesh (`reduction`)")
            && e.contains("`Engine`")
            && e.contains("`Ordered`"),
        "{e}"
    );
    burn_dtensor::configure(burn_dtensor::config().with_reduction(spmd::Reduction::Ordered));
    // So is the large-message size (it picks blocking or polled collectives, alike everywhere).
    let large = burn_dtensor::config().large_message_bytes;
    burn_dtensor::configure(
        burn_dtensor::config().with_large_message_bytes(if w.rank() == 1 { 0 } else { large }),
    );
    let e = Mesh::spmd([("l", 4)], vec![Dev::default(); 2])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("disagree on the mesh (`large message bytes`)") && e.contains("`0`"),
        "{e}"
    );
    burn_dtensor::configure(burn_dtensor::config().with_large_message_bytes(large));
    // The inner backend and its element types.
    let e = if w.rank() == 0 {
        w.agree_backend::<NdArray<f32>>()
    } else {
        w.agree_backend::<NdArray<f64>>()
    }
    .unwrap_err()
    .to_string();
    assert!(e.contains("disagree on the inner backend"), "{e}");
    w.agree_backend::<NdArray<f32>>().unwrap();
    // A record of fields names the first that differs; a field one rank lacks is `<absent>`.
    let lr = if w.rank() == 0 { "0.001" } else { "0.01" };
    let e = w
        .agree_fields("config", &[("epochs", "2".into()), ("lr", lr.into())])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("disagree on the config (`lr`)")
            && e.contains("`0.01`")
            && e.contains("`0.001`"),
        "{e}"
    );
    let mut fields = vec![("epochs", "2".to_string())];
    if w.rank() == 1 {
        fields.push(("extra", "1".into()));
    }
    let e = w.agree_fields("config", &fields).unwrap_err().to_string();
    assert!(e.contains("(`extra`)") && e.contains("<absent>"), "{e}");
    // Two processes of one host on one GPU (the CPU devices here are never exclusive, so the
    // check is driven with GPU names): refused with both ranks and the device; distinct GPUs,
    // or none, pass.
    assert!(!spmd::exclusive_device(&Dev::default()));
    let e = w
        .claim_devices(&["CudaDevice { index: 0 }".to_string()])
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(
            e,
            burn_dtensor::DTensorError::SharedDevice {
                first: 0,
                second: 1,
                ..
            }
        ) && msg.contains("ranks 0 and 1 on host ")
            && msg.contains("both use CudaDevice { index: 0 }")
            && msg.contains("--device auto"),
        "{msg}"
    );
    w.claim_devices(&[format!("CudaDevice {{ index: {} }}", w.rank())])
        .unwrap();
    w.claim_devices(&[]).unwrap();
    // One rank's payload for all: rank 1's bytes (3 MB of a pattern, then none) arrive on every
    // rank; rank 1 keeps its own vector, not a copy.
    for len in [3 << 20, 0] {
        let sent: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let mine = if w.rank() == 1 {
            sent.clone()
        } else {
            vec![7; 5]
        };
        let at = mine.as_ptr();
        let got = w.broadcast_bytes(mine, 1, "broadcast check");
        assert_eq!(got, sent, "rank {}: broadcast of {len} bytes", w.rank());
        if w.rank() == 1 {
            assert_eq!(got.as_ptr(), at, "the root's bytes were copied");
        }
    }
    // In place, into memory the caller allocated (the examples' typed arrays as bytes).
    let sent: Vec<u8> = (0..(4u32 << 20)).map(|i| (i % 253) as u8).collect();
    let mut buf = if w.rank() == 1 {
        sent.clone()
    } else {
        vec![0; sent.len()]
    };
    w.broadcast_into(&mut buf, 1, "in-place broadcast check")
        .unwrap();
    assert_eq!(buf, sent, "rank {}: broadcast in place", w.rank());
    // Lengths that differ: a typed error on every rank naming the other, nothing written.
    let mut buf = vec![5u8; 3 + w.rank()];
    let e = w
        .broadcast_into(&mut buf, 0, "uneven broadcast")
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(e, burn_dtensor::DTensorError::ProcessMismatch { .. })
            && msg.contains(&format!("rank {other}"))
            && msg.contains("uneven broadcast"),
        "{msg}"
    );
    assert_eq!(buf, vec![5u8; 3 + w.rank()]);
    done(name);
}

/// Runs `name` as `np` processes with `env`, expecting failure: (exit status, output, seconds).
fn launch_failing(name: &str, np: usize, env: &[(&str, &str)]) -> (i32, String, f64) {
    let exe = std::env::current_exe().unwrap();
    let t = std::time::Instant::now();
    let mut c = Command::new("timeout");
    ompi::own_session_dir(&mut c);
    c.args(["120", "mpirun", "--allow-run-as-root", "--oversubscribe"])
        .args(["--mca", "btl", "self,vader,tcp", "-np", &np.to_string()])
        .arg(&exe)
        .args([name, "--exact", "--test-threads=1", "--nocapture"])
        .env("BURN_DTENSOR_SPMD_WORKER", "1");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().expect("running mpirun");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (
        out.status.code().unwrap_or(-1),
        text,
        t.elapsed().as_secs_f64(),
    )
}

/// A rank that stops answering (SIGSTOP) mid-step ends the others within the collective timeout
/// with an error naming it and the collective; a rank that dies (SIGKILL) makes `mpirun` end
/// the job at once, naming it; a rank that panics after start-up ends the job at once (well
/// inside a 60 s timeout), naming itself and the panic; a rank that never joins ends the others
/// within the timeout, each naming itself and the start-up. None hangs.
#[test]
fn a_stopped_or_killed_rank_ends_the_job_naming_it() {
    let name = "a_stopped_or_killed_rank_ends_the_job_naming_it";
    if !is_worker() {
        if !launch(name, 2) {
            return; // the fault-free run (no SPMD_FAULT): both ranks finish
        }
        let (code, text, secs) = launch_failing(
            name,
            2,
            &[
                ("SPMD_FAULT", "stop"),
                ("BURN_DTENSOR_COLLECTIVE_TIMEOUT_S", "3"),
            ],
        );
        println!("stopped rank: exit {code} after {secs:.1} s");
        assert_ne!(code, 0, "{text}");
        assert!(
            text.contains("all-reduce along mesh axis `a`")
                && text.contains("did not complete within 3.0 s")
                && text.contains("rank 1 (pid")
                && text.contains("is stopped"),
            "{text}"
        );
        assert!(secs < 60.0, "took {secs} s:\n{text}");
        let (code, text, secs) = launch_failing(
            name,
            2,
            &[
                ("SPMD_FAULT", "kill"),
                ("BURN_DTENSOR_COLLECTIVE_TIMEOUT_S", "30"),
            ],
        );
        println!("killed rank: exit {code} after {secs:.1} s");
        assert_ne!(code, 0, "{text}");
        assert!(text.contains("rank 1"), "{text}");
        assert!(secs < 30.0, "took {secs} s (the timeout is 30 s):\n{text}");
        let (code, text, secs) = launch_failing(
            name,
            2,
            &[
                ("SPMD_FAULT", "panic"),
                ("BURN_DTENSOR_COLLECTIVE_TIMEOUT_S", "60"),
            ],
        );
        println!("panicking rank: exit {code} after {secs:.1} s");
        assert_ne!(code, 0, "{text}");
        assert!(
            text.contains("burn-dtensor [rank 1 of 2")
                && text.contains("panicked at")
                && text.contains("injected fault on rank 1"),
            "{text}"
        );
        assert!(!text.contains("did not complete within"), "{text}");
        // Start-up and the first collective take about a second; the timeout is 60 s.
        assert!(secs < 20.0, "took {secs} s:\n{text}");
        let (code, text, secs) = launch_failing(
            name,
            2,
            &[
                ("SPMD_FAULT", "never-join"),
                ("BURN_DTENSOR_COLLECTIVE_TIMEOUT_S", "3"),
            ],
        );
        println!("rank that never joins: exit {code} after {secs:.1} s");
        assert_ne!(code, 0, "{text}");
        assert!(
            text.contains("rank 0 of 2: the SPMD world did not start within 3.0 s"),
            "{text}"
        );
        assert!(secs < 60.0, "took {secs} s:\n{text}");
        return;
    }
    // Rank 1 sleeps past the test's time before joining.
    if std::env::var("SPMD_FAULT").as_deref() == Ok("never-join")
        && spmd::LaunchEnv::detect().is_ok_and(|l| l.rank == 1)
    {
        std::thread::sleep(std::time::Duration::from_secs(110));
    }
    let w = spmd::init().unwrap();
    let m = Mesh::spmd([("a", 2)], vec![Dev::default()]).unwrap();
    let l = Layout::new(&m, ["a", UNSHARDED]).unwrap();
    let x: Tensor<DB, 2> = distribute(data([4, 3], 1), &l).unwrap();
    assert_eq!(
        x.clone().sum().into_scalar(),
        data([4, 3], 1).to_vec::<f32>().unwrap().iter().sum::<f32>()
    );
    if w.rank() == 1 {
        match std::env::var("SPMD_FAULT").as_deref() {
            // SAFETY: signalling this process.
            Ok("stop") => unsafe {
                libc::raise(libc::SIGSTOP);
            },
            Ok("kill") => unsafe {
                libc::raise(libc::SIGKILL);
            },
            Ok("panic") => panic!("injected fault on rank 1"),
            _ => {}
        }
    }
    let _ = (x * 2.0).sum().into_scalar();
    done(name);
}

/// Network namespaces `a` and `b` joined by a veth pair (10.77.0.1 <-> 10.77.0.2), removed on
/// drop.
struct TwoHosts {
    names: [String; 2],
}

impl TwoHosts {
    fn create() -> Result<Self, String> {
        let id = std::process::id();
        let names = [format!("dt{id}a"), format!("dt{id}b")];
        let hosts = TwoHosts {
            names: names.clone(),
        };
        let (a, b) = (names[0].as_str(), names[1].as_str());
        let (va, vb) = (format!("dv{id}a"), format!("dv{id}b"));
        let steps: Vec<Vec<&str>> = vec![
            vec!["netns", "add", a],
            vec!["netns", "add", b],
            vec!["link", "add", &va, "type", "veth", "peer", "name", &vb],
            vec!["link", "set", &va, "netns", a],
            vec!["link", "set", &vb, "netns", b],
            vec!["-n", a, "addr", "add", "10.77.0.1/24", "dev", &va],
            vec!["-n", b, "addr", "add", "10.77.0.2/24", "dev", &vb],
            vec!["-n", a, "link", "set", &va, "up"],
            vec!["-n", b, "link", "set", &vb, "up"],
            vec!["-n", a, "link", "set", "lo", "up"],
            vec!["-n", b, "link", "set", "lo", "up"],
        ];
        for s in steps {
            let out = Command::new("ip")
                .args(&s)
                .output()
                .map_err(|e| format!("ip: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "ip {}: {}",
                    s.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
        }
        Ok(hosts)
    }
}

impl Drop for TwoHosts {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

/// Two hosts simulated by two network namespaces on this machine: `mpirun` runs in the first,
/// starts its daemon in the second through a launch agent that enters it (in place of ssh),
/// and MPI talks TCP over the veth pair between them (`--mca btl self,tcp`). The gradients
/// suite then runs with one rank per "host". Needs root and `ip`; skips (saying why) otherwise,
/// unless `BURN_DTENSOR_REQUIRE_MPI=1`.
#[test]
fn two_hosts_as_network_namespaces() {
    let name = "gradients_across_processes";
    if is_worker() {
        return; // the ranks run `gradients_across_processes`
    }
    let require = std::env::var("BURN_DTENSOR_REQUIRE_MPI").is_ok_and(|v| v == "1");
    if !cfg!(feature = "mpi") || Command::new("mpirun").arg("--version").output().is_err() {
        assert!(!require, "no MPI (BURN_DTENSOR_REQUIRE_MPI=1)");
        println!("skipped: no mpirun or built without the `mpi` feature");
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        assert!(
            !require,
            "network namespaces need root (BURN_DTENSOR_REQUIRE_MPI=1)"
        );
        println!("skipped: creating network namespaces needs root");
        return;
    }
    let hosts = match TwoHosts::create() {
        Ok(h) => h,
        Err(e) => {
            assert!(!require, "cannot create network namespaces: {e}");
            println!("skipped: cannot create network namespaces: {e}");
            return;
        }
    };
    let dir = std::env::temp_dir().join(format!("two-hosts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let agent = dir.join("nsagent.sh");
    std::fs::write(
        &agent,
        format!(
            "#!/bin/sh\n# mpirun's remote launch agent: enter the namespace of the host.\n\
             host=\"$1\"; shift\ncase \"$host\" in\n  10.77.0.1) ns={} ;;\n  10.77.0.2) ns={} ;;\n\
             *) echo \"unknown host $host\" >&2; exit 1 ;;\nesac\n\
             exec ip netns exec \"$ns\" /bin/sh -c \"$*\"\n",
            hosts.names[0], hosts.names[1]
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755)).unwrap();
    let hostfile = dir.join("hosts");
    std::fs::write(&hostfile, "10.77.0.1 slots=1\n10.77.0.2 slots=1\n").unwrap();
    let exe = std::env::current_exe().unwrap();
    let out = ompi::own_session_dir(&mut Command::new("timeout"))
        .args(["120", "ip", "netns", "exec", &hosts.names[0]])
        .args(["mpirun", "--allow-run-as-root", "-np", "2", "--hostfile"])
        .arg(&hostfile)
        .arg("--mca")
        .arg("plm_rsh_agent")
        .arg(&agent)
        .args(["--mca", "btl", "self,tcp"])
        .args(["--mca", "btl_tcp_if_include", "10.77.0.0/24"])
        .args(["--mca", "oob_tcp_if_include", "10.77.0.0/24"])
        .args([
            "-x",
            "BURN_DTENSOR_SPMD_WORKER",
            "-x",
            "BURN_DTENSOR_COLLECTIVE_TIMEOUT_S",
        ])
        .arg(&exe)
        .args([name, "--exact", "--test-threads=1", "--nocapture"])
        .env("BURN_DTENSOR_SPMD_WORKER", "1")
        .env("BURN_DTENSOR_COLLECTIVE_TIMEOUT_S", "60")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "two-host run failed ({}):\n{text}",
        out.status
    );
    let nets: std::collections::BTreeSet<&str> = text
        .lines()
        .filter(|l| l.contains(&format!("spmd-ok {name}")))
        .filter_map(|l| l.split_whitespace().last())
        .collect();
    assert_eq!(
        nets.len(),
        2,
        "the ranks should run in two network namespaces:\n{text}"
    );
    drop(hosts);
}

/// Bytes this process has read through `read`/`pread` so far (`rchar` of `/proc/self/io`).
fn read_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/io").unwrap();
    let line = s.lines().find(|l| l.starts_with("rchar:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Sharded checkpoints across processes: 4, then 2, then 1 process(es) each write a checkpoint
/// of the same tensors (uneven shards, a replicated one, a pending sum) and read back every
/// checkpoint written so far under every settled layout of meshes of 4 and 8 positions: the
/// values are bitwise the written ones, every process's shards their box. Each distinct shard is
/// written once (the replicated tensor by the chief alone), and a process reading its share of
/// a sharded 8 MiB tensor reads about that share from disk, not the whole tensor.
#[test]
fn sharded_checkpoint_across_processes() {
    use burn_dtensor::checkpoint::{Checkpoint, SaveOptions, StateDict, save};
    let name = "sharded_checkpoint_across_processes";
    if !is_worker() {
        let root = std::env::temp_dir().join(format!("dtensor-spmd-ckpt-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let dir = root.display().to_string();
        for np in [4, 2, 1] {
            if !launch_with(name, np, &[("DTENSOR_TEST_CKPT", &dir)]) {
                break;
            }
        }
        std::fs::remove_dir_all(&root).unwrap();
        return;
    }
    let root = std::path::PathBuf::from(std::env::var("DTENSOR_TEST_CKPT").unwrap());
    let w = spmd::init().unwrap();
    let n = w.size();
    let m = Mesh::spmd([("x", 2), ("y", 4)], vec![Dev::default(); 8 / n]).unwrap();
    let shape = [37, 26];
    let want = data(shape, 5);
    let wv: Vec<f32> = want.to_vec().unwrap();
    let cols = Layout::new(&m, [UNSHARDED, "y"]).unwrap();
    let both = Layout::new(&m, ["y", UNSHARDED]).unwrap();
    let mut state = StateDict::new();
    state
        .insert(
            "model.w",
            distribute::<DB, 2, burn::tensor::Float>(want.clone(), &cols).unwrap(),
        )
        .unwrap();
    state
        .insert(
            "rep",
            distribute::<DB, 2, burn::tensor::Float>(want.clone(), &Layout::replicated(&m, 2))
                .unwrap(),
        )
        .unwrap();
    let half = distribute::<DB, 2, burn::tensor::Float>(want.clone(), &both).unwrap() * 0.5;
    state
        .insert(
            "pending",
            half.relayout(&both.clone().with_partial(0, ReduceOp::Sum))
                .unwrap(),
        )
        .unwrap();
    let big = TensorData::new(
        (0..2048 * 1024).map(|i| i as f32).collect::<Vec<_>>(),
        [2048, 1024],
    );
    let rows = Layout::new(&m, ["x", "y"]).unwrap();
    state
        .insert(
            "big",
            distribute::<DB, 2, burn::tensor::Float>(big.clone(), &rows).unwrap(),
        )
        .unwrap();
    let meta = save(
        &root.join(format!("by-{n}")),
        state,
        &SaveOptions::default(),
    )
    .unwrap();
    assert_eq!(meta.processes, n);
    assert_eq!(meta.tensors["model.w"].shards.len(), 4);
    assert_eq!(meta.tensors["pending"].shards.len(), 4);
    assert_eq!(meta.tensors["big"].shards.len(), 8);
    let rep = &meta.tensors["rep"].shards;
    // Written once, by whichever process had the fewest bytes planned.
    assert_eq!(rep.len(), 1);
    assert!(rep[0].file.ends_with(&format!("-of-{n:05}.safetensors")));
    // The writing is spread: with 2 or 4 processes, more than one process writes.
    let files: std::collections::BTreeSet<&str> = meta
        .tensors
        .values()
        .flat_map(|t| t.shards.iter().map(|s| s.file.as_str()))
        .collect();
    assert_eq!(files.len() > 1, n > 1, "{files:?}");
    // Every checkpoint written so far (by 4, 2 and this count), under every layout.
    let mut written: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    written.sort();
    for dir in written
        .iter()
        .filter(|d| d.file_name().unwrap().to_string_lossy().starts_with("by-"))
    {
        let ckpt = Checkpoint::open(dir).unwrap();
        for mm in meshes() {
            for l in layouts(&mm).into_iter().filter(|l| !l.is_partial()) {
                for (t, scale) in [("model.w", 1.0), ("rep", 1.0), ("pending", 0.5)] {
                    let wv: Vec<f32> = wv.iter().map(|v| v * scale).collect();
                    let got: Tensor<DB, 2> = ckpt.read(t, &l).unwrap();
                    let what = format!("{t} from {} as {l}", dir.display());
                    for (j, s) in got.clone().to_local_shards().into_iter().enumerate() {
                        let r = l.shard_ranges(&shape, mm.topology().global(j));
                        let v: Vec<f32> = s.into_data().to_vec().unwrap();
                        assert!(v == extract(&wv, &shape, &r), "{what}: position {j}");
                    }
                    assert!(got.into_data().to_vec::<f32>().unwrap() == wv, "{what}");
                }
            }
        }
        // This process's share of the 8 MiB tensor, sharded by rows over the processes.
        let p = Mesh::spmd([("p", n)], vec![Dev::default()]).unwrap();
        let share = Layout::new(&p, ["p", UNSHARDED]).unwrap();
        let before = read_bytes();
        let got: Tensor<DB, 2> = ckpt.read("big", &share).unwrap();
        let read = read_bytes() - before;
        let bytes = 2048 * 1024 * 4 / n as u64;
        // Whole checksum blocks are read: at most one block more per saved shard overlapped.
        let slack = 8 * burn_dtensor::checkpoint::BLOCK_BYTES as u64;
        println!("rank {}: read {read} B for a {bytes} B share", w.rank());
        assert!(read <= bytes + slack, "read {read} B for a {bytes} B share");
        let r = share.shard_ranges(&[2048, 1024], p.topology().global(0));
        let v: Vec<f32> = got.to_local_shards()[0]
            .clone()
            .into_data()
            .to_vec()
            .unwrap();
        assert_eq!(v[0], (r[0].start * 1024) as f32);
        assert_eq!(v.len(), r[0].len() * 1024);
        assert_eq!(*v.last().unwrap(), (r[0].end * 1024 - 1) as f32);
    }
    done(name);
}

/// The commit of a sharded checkpoint survives a `kill -9` of any process at any write point:
/// two processes save a checkpoint `prev`, then `next` with rank `r` killing itself at its `k`-th
/// write point (before, inside and after its shard file; around the chief's metadata and
/// rename), for every `k` until a save runs through. After each kill `prev` still reads back
/// exactly, and `next` is either absent or complete (a kill after the commit); a new save over
/// the leftovers succeeds.
#[test]
fn sharded_checkpoint_survives_a_kill_at_every_write_point() {
    use burn_dtensor::checkpoint::{Checkpoint, SaveOptions, StateDict, save};
    let name = "sharded_checkpoint_survives_a_kill_at_every_write_point";
    let shape = [9, 6];
    let want = data(shape, 2);
    let check = |dir: &std::path::Path| {
        let m = Mesh::virtual_devices([("a", 1)], Dev::default()).unwrap();
        let ckpt = Checkpoint::open(dir).unwrap();
        let got: Tensor<DB, 2> = ckpt
            .read("w", &Layout::new(&m, [UNSHARDED, UNSHARDED]).unwrap())
            .unwrap();
        got.into_data().assert_eq(&want, true);
    };
    if !is_worker() {
        if !cfg!(feature = "mpi") || Command::new("mpirun").arg("--version").output().is_err() {
            let _ = launch(name, 2); // says why it skips (fails under BURN_DTENSOR_REQUIRE_MPI)
            return;
        }
        let root = std::env::temp_dir().join(format!("dtensor-spmd-kill-{}", std::process::id()));
        let mut kills = 0;
        for rank in [0usize, 1] {
            for k in 1.. {
                let dir = root.join(format!("r{rank}-k{k}"));
                std::fs::create_dir_all(&dir).unwrap();
                let env = [
                    ("DTENSOR_TEST_CKPT", dir.display().to_string()),
                    ("DTENSOR_KILL", format!("{rank}:{k}")),
                ];
                let env: Vec<(&str, &str)> = env.iter().map(|(a, b)| (*a, b.as_str())).collect();
                let (code, text, _) = launch_failing(name, 2, &env);
                check(&dir.join("prev"));
                if code == 0 {
                    assert!(text.contains("spmd-ok"), "{text}");
                    check(&dir.join("next"));
                    break;
                }
                kills += 1;
                // Absent, or committed whole.
                if dir.join("next").exists() {
                    check(&dir.join("next"));
                }
                assert!(
                    !dir.join("next").exists() || dir.join("next").join("metadata.json").exists()
                );
            }
        }
        assert!(kills >= 6, "only {kills} write points");
        println!("killed at {kills} write points: the previous checkpoint always stayed whole");
        std::fs::remove_dir_all(&root).unwrap();
        return;
    }
    let root = std::path::PathBuf::from(std::env::var("DTENSOR_TEST_CKPT").unwrap());
    let (kill_rank, kill_at) = std::env::var("DTENSOR_KILL")
        .unwrap()
        .split_once(':')
        .map(|(a, b)| (a.parse::<usize>().unwrap(), b.parse::<usize>().unwrap()))
        .unwrap();
    let w = spmd::init().unwrap();
    let m = Mesh::spmd([("p", 2)], vec![Dev::default()]).unwrap();
    let l = Layout::new(&m, ["p", UNSHARDED]).unwrap();
    let state = || {
        let mut s = StateDict::new();
        s.insert(
            "w",
            distribute::<DB, 2, burn::tensor::Float>(want.clone(), &l).unwrap(),
        )
        .unwrap();
        s
    };
    save(&root.join("prev"), state(), &SaveOptions::default()).unwrap();
    let point = std::sync::atomic::AtomicUsize::new(0);
    let opts = SaveOptions::default().on_write_point(move || {
        let n = point.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        if w.rank() == kill_rank && n == kill_at {
            // SAFETY: kill(2) on this process.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
    });
    // A leftover staging directory of an earlier interrupted save is replaced.
    save(&root.join("next"), state(), &opts).unwrap();
    done(name);
}
