//! The CubeCL collective kernels (`collective::cube`): all-reduce (sum, max, min), reduce-scatter
//! and all-gather as one kernel launch per mesh group (all-to-all: one per device), on Wgpu
//! (Mesa's software Vulkan device in CI) and Cuda. Each case checks every device's shard against values computed on the host, and
//! that the one-launch path was taken (the launch counter moves by exactly one per group).
//! The meshes run per device (`with_stacked_execution(false)`): these kernels serve the shards of
//! distinct devices; a stacked virtual mesh runs its collectives as ops on the stack instead.
//!
//! Sizes are chosen so that most are not multiples of the vector width (1, 3, 35, 1027 elements;
//! uneven shards along leading and inner dims), alongside aligned ones (64, widths of 4).
#![cfg(any(feature = "wgpu", feature = "cuda"))]

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use burn_dtensor::cube_kernels::kernel_launches;
use burn_dtensor::{
    DTensorExt, DistributedBackend, Layout, Mesh, ReduceOp, distribute, from_local_shards,
};

#[macro_use]
mod common;

/// Tests share the process-wide launch counter, so they run one at a time.
static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((i * 37 + seed * 11) % 23) as f32 - 11.0) / 8.0)
        .collect()
}

fn host_reduce(parts: &[Vec<f32>], op: ReduceOp) -> Vec<f32> {
    (0..parts[0].len())
        .map(|i| {
            let it = parts.iter().map(|p| p[i]);
            match op {
                ReduceOp::Sum => it.sum(),
                ReduceOp::Max => it.fold(f32::NEG_INFINITY, f32::max),
                ReduceOp::Min => it.fold(f32::INFINITY, f32::min),
            }
        })
        .collect()
}

fn shards_f32<I: Backend, const D: usize>(
    t: Tensor<DistributedBackend<I>, D>,
) -> Vec<(Vec<usize>, Vec<f32>)> {
    t.to_local_shards()
        .into_iter()
        .map(|s| {
            (
                s.dims().to_vec(),
                s.into_data().convert::<f32>().to_vec::<f32>().unwrap(),
            )
        })
        .collect()
}

/// Runs `f` and returns its result with the number of collective kernel launches it made.
fn launches<R>(f: impl FnOnce() -> R) -> (R, u64) {
    let before = kernel_launches();
    let r = f();
    (r, kernel_launches() - before)
}

/// All-reduce of a pending sum / max / min on 1-D meshes of 2, 3 and 8 devices, for tensor
/// sizes that are and are not multiples of the vector width.
pub fn all_reduce_each_op<I: Backend>(device: I::Device) {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    for k in [2usize, 3, 8] {
        let mesh = Mesh::new([("x", k)], vec![device.clone(); k])
            .unwrap()
            .with_stacked_execution(false);
        for shape in [[1usize, 1], [1, 3], [5, 7], [4, 16], [1, 1027]] {
            let n = shape[0] * shape[1];
            for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
                let parts: Vec<Vec<f32>> = (0..k).map(|s| values(n, s + 1)).collect();
                let local = parts
                    .iter()
                    .map(|p| Tensor::<I, 2>::from_data(TensorData::new(p.clone(), shape), &device))
                    .collect();
                let partial = Layout::replicated(&mesh, 2).with_partial(0, op);
                let t = from_local_shards(local, shape, &partial).unwrap();
                let (out, l) =
                    launches(|| shards_f32(t.relayout(&Layout::replicated(&mesh, 2)).unwrap()));
                assert_eq!(l, 1, "{k} devices, {shape:?}, {op:?}: one launch");
                let want = host_reduce(&parts, op);
                for (d, (dims, got)) in out.iter().enumerate() {
                    assert_eq!(dims, &shape.to_vec());
                    assert_eq!(got, &want, "device {d} of {k}, {shape:?}, {op:?}");
                }
            }
        }
    }
}

/// Reduce-scatter of a pending sum into uneven chunks (7 rows over 3 devices: 3, 2, 2), on a
/// 2 x 3 mesh (two groups, so two launches).
pub fn reduce_scatter_uneven<I: Backend>(device: I::Device) {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let mesh = Mesh::new([("a", 2), ("b", 3)], vec![device.clone(); 6])
        .unwrap()
        .with_stacked_execution(false);
    let shape = [7usize, 5];
    for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
        let parts: Vec<Vec<f32>> = (0..6).map(|s| values(35, s + 3)).collect();
        let local = parts
            .iter()
            .map(|p| Tensor::<I, 2>::from_data(TensorData::new(p.clone(), shape), &device))
            .collect();
        let t = from_local_shards(
            local,
            shape,
            &Layout::replicated(&mesh, 2).with_partial(1, op),
        )
        .unwrap();
        let (out, l) = launches(|| {
            shards_f32(
                t.relayout(&Layout::new(&mesh, ["b", "unsharded"]).unwrap())
                    .unwrap(),
            )
        });
        assert_eq!(l, 2, "{op:?}: one launch per group");
        for a in 0..2 {
            let want = host_reduce(&parts[a * 3..a * 3 + 3], op);
            let rows = [0..3usize, 3..5, 5..7];
            for b in 0..3 {
                let (dims, got) = &out[a * 3 + b];
                assert_eq!(dims, &vec![rows[b].len(), 5]);
                assert_eq!(
                    got,
                    &want[rows[b].start * 5..rows[b].end * 5].to_vec(),
                    "{op:?}, device ({a}, {b})"
                );
            }
        }
    }
}

/// All-gather of uneven shards along a leading dim, an inner dim (rows of 3, 2, 2 elements: no
/// vector width fits), a middle dim with an aligned inner size, two mesh axes at once, and an
/// empty shard (2 rows over 3 devices), for float and int tensors.
pub fn all_gather_uneven<I: Backend>(device: I::Device) {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let mesh = Mesh::new([("a", 2), ("b", 3)], vec![device.clone(); 6])
        .unwrap()
        .with_stacked_execution(false);
    for (shape, spec) in [
        ([7usize, 5, 1], ["b", "unsharded", "unsharded"]),
        ([5, 7, 1], ["unsharded", "b", "unsharded"]),
        ([2, 9, 4], ["unsharded", "b", "unsharded"]),
        ([3, 4, 8], ["a", "b", "unsharded"]),
        ([2, 2, 4], ["unsharded", "b", "unsharded"]),
    ] {
        println!("all-gather {shape:?} {spec:?}");
        let n: usize = shape.iter().product();
        let data = TensorData::new(values(n, 5), shape);
        let t: Tensor<DistributedBackend<I>, 3> =
            distribute(data.clone(), &Layout::new(&mesh, spec).unwrap()).unwrap();
        let groups = if spec[0] == "a" { 2 + 3 } else { 2 };
        let (out, l) = launches(|| shards_f32(t.relayout(&Layout::replicated(&mesh, 3)).unwrap()));
        assert_eq!(
            l, groups,
            "{shape:?} {spec:?}: one launch per group and gathered axis"
        );
        for (d, (dims, got)) in out.iter().enumerate() {
            assert_eq!(dims, &shape.to_vec());
            assert_eq!(
                got,
                &data.to_vec::<f32>().unwrap(),
                "device {d}, {shape:?} {spec:?}"
            );
        }

        println!("all-gather {shape:?} {spec:?}, int");
        let ints = TensorData::new((0..n as i32).map(|i| i * 7 - 40).collect::<Vec<_>>(), shape);
        let t: Tensor<DistributedBackend<I>, 3, Int> =
            distribute(ints.clone(), &Layout::new(&mesh, spec).unwrap()).unwrap();
        let (got, l) = launches(|| {
            t.relayout(&Layout::replicated(&mesh, 3))
                .unwrap()
                .into_data()
        });
        assert_eq!(l, groups);
        assert_eq!(
            got.convert::<i64>().to_vec::<i64>().unwrap(),
            ints.convert::<i64>().to_vec::<i64>().unwrap()
        );
    }
}

/// All-to-all from rows sharded (3, 2, 2 of 7) to columns sharded (2, 2, 1 of 5): each device
/// assembles its columns in one launch.
pub fn all_to_all_uneven<I: Backend>(device: I::Device) {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let mesh = Mesh::new([("x", 3)], vec![device.clone(); 3])
        .unwrap()
        .with_stacked_execution(false);
    let data = TensorData::new(values(35, 9), [7, 5]);
    let full = data.to_vec::<f32>().unwrap();
    let t: Tensor<DistributedBackend<I>, 2> =
        distribute(data, &Layout::new(&mesh, ["x", "unsharded"]).unwrap()).unwrap();
    let (out, l) = launches(|| {
        shards_f32(
            t.relayout(&Layout::new(&mesh, ["unsharded", "x"]).unwrap())
                .unwrap(),
        )
    });
    assert_eq!(l, 3, "one launch per device");
    for (d, cols) in [0..2usize, 2..4, 4..5].into_iter().enumerate() {
        let want: Vec<f32> = (0..7)
            .flat_map(|r| cols.clone().map(move |c| (r, c)))
            .map(|(r, c)| full[r * 5 + c])
            .collect();
        assert_eq!(out[d], (vec![7, cols.len()], want), "device {d}");
    }
}

/// A model-parallel matmul (contracting dim sharded) settles its partial sum with the kernel and
/// equals the inner backend on the whole tensor.
pub fn partial_matmul<I: Backend>(device: I::Device) {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let mesh = Mesh::new([("x", 4)], vec![device.clone(); 4])
        .unwrap()
        .with_stacked_execution(false);
    let (a, b) = (
        TensorData::new(values(6 * 10, 1), [6, 10]),
        TensorData::new(values(10 * 3, 2), [10, 3]),
    );
    let want = Tensor::<I, 2>::from_data(a.clone(), &device)
        .matmul(Tensor::from_data(b.clone(), &device))
        .into_data()
        .convert::<f32>();
    let da: Tensor<DistributedBackend<I>, 2> =
        distribute(a, &Layout::new(&mesh, ["unsharded", "x"]).unwrap()).unwrap();
    let db: Tensor<DistributedBackend<I>, 2> =
        distribute(b, &Layout::new(&mesh, ["x", "unsharded"]).unwrap()).unwrap();
    let (got, l) = launches(|| {
        da.matmul(db)
            .relayout(&Layout::replicated(&mesh, 2))
            .unwrap()
            .into_data()
    });
    assert_eq!(l, 1);
    got.convert::<f32>()
        .assert_approx_eq::<f32>(&want, burn::tensor::Tolerance::rel_abs(1e-5, 1e-6));
}

/// The suite's tests, instantiated per backend by `common::suite!`.
macro_rules! kernel_suite {
    ($name:ident, $backend:ty, $device:expr) => {
        suite!(
            $name,
            $backend,
            $device,
            [
                all_reduce_each_op,
                reduce_scatter_uneven,
                all_gather_uneven,
                all_to_all_uneven,
                partial_matmul
            ]
        );
    };
}

// The kernels run on the plain CubeCL backends; with Burn's `fusion` feature `burn::backend::Wgpu`
// and `Cuda` are `Fusion<CubeBackend<..>>`, whose collectives take the generic path (tested by
// `backends.rs`' `wgpu_fusion` suite).
#[cfg(feature = "wgpu")]
kernel_suite!(
    wgpu,
    crate::common::WgpuPlain,
    burn::backend::wgpu::WgpuDevice::Cpu
);
#[cfg(feature = "cuda")]
kernel_suite!(cuda, crate::common::CudaPlain, Default::default());

/// The in-process collective engines are chosen when the mesh is built, from the inner device
/// type: CubeCL's kernels for a Wgpu mesh, none (the inner backend's ops) for NdArray.
#[cfg(feature = "wgpu")]
#[test]
fn engines_chosen_when_the_mesh_is_built() {
    let wgpu = Mesh::new([("x", 2)], vec![burn::backend::wgpu::WgpuDevice::Cpu; 2]).unwrap();
    assert_eq!(wgpu.topology().collective_engines(), ["cubecl-wgpu"]);
    let cpu = Mesh::new(
        [("x", 2)],
        vec![burn::backend::ndarray::NdArrayDevice::Cpu; 2],
    )
    .unwrap();
    assert!(cpu.topology().collective_engines().is_empty());
}
