//! Relayout and each collective against tensor size, on 8 virtual devices (mesh `x=8`):
//! all-gather (sharded -> replicated), all-reduce (partial sum -> replicated), reduce-scatter
//! (partial sum -> sharded), all-to-all (sharded dim 0 -> dim 1), local slice (replicated ->
//! sharded, no communication).
//!
//! Throughput is the global tensor's bytes per second (NCCL's "algbw"). Paths: `ndarray` (the
//! generic path on NdArray); with `--features wgpu`, `wgpu-kernel` (one CubeCL launch per group,
//! `collective::cube`) and `wgpu-generic` (the same backend through the generic path, pairwise
//! adds and `cat`); with `--features cuda`, `cuda-kernel` and `cuda-generic`. GPU timings wait
//! for the device (`Backend::sync`) before the clock stops.
//!
//! `cargo bench -p burn-dtensor-benches --bench collectives [--features wgpu]`
//! (`DTENSOR_BENCH_FULL=1` adds 2048x2048 and 4096x4096).

use burn::backend::NdArray;
use burn::tensor::TensorData;
use burn::tensor::backend::Backend;
use burn_dtensor::{DTensorExt, DistributedBackend, Layout, Mesh, ReduceOp, distribute};
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};

/// mimalloc rather than glibc's malloc: glibc returns the buffers freed at the end of a step to
/// the OS and page-faults them back in on the next (measured in NOTES.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn bench_path<I: Backend>(c: &mut Criterion, path: &str, device: I::Device) {
    let mesh = Mesh::new([("x", 8)], vec![device.clone(); 8]).unwrap();
    let sizes: &[usize] = if std::env::var_os("DTENSOR_BENCH_FULL").is_some() {
        &[64, 512, 2048, 4096]
    } else {
        &[64, 512]
    };
    let s0 = Layout::new(&mesh, ["x", "unsharded"]).unwrap();
    let s1 = Layout::new(&mesh, ["unsharded", "x"]).unwrap();
    let r = Layout::replicated(&mesh, 2);
    let p = r.clone().with_partial(0, ReduceOp::Sum);
    let cases: [(&str, &Layout, &Layout); 5] = [
        ("all_gather", &s0, &r),
        ("all_reduce", &p, &r),
        ("reduce_scatter", &p, &s0),
        ("all_to_all", &s0, &s1),
        ("local_slice", &r, &s0),
    ];
    let mut group = c.benchmark_group(format!("relayout/{path}"));
    for &n in sizes {
        let data = TensorData::new(
            (0..n * n).map(|i| (i % 97) as f32).collect::<Vec<_>>(),
            [n, n],
        );
        group.throughput(Throughput::Bytes((n * n * 4) as u64));
        for (name, from, to) in cases {
            // A fresh tensor per iteration: a partial tensor memoises its reduction across clones.
            group.bench_function(format!("{name}/{n}x{n}"), |b| {
                b.iter_batched(
                    || {
                        let t = distribute::<DistributedBackend<I>, 2, burn::tensor::Float>(
                            data.clone(),
                            from,
                        )
                        .unwrap();
                        I::sync(&device).unwrap();
                        t
                    },
                    |t| {
                        let out = t.relayout(to).unwrap();
                        I::sync(&device).unwrap();
                        out
                    },
                    BatchSize::LargeInput,
                )
            });
        }
    }
    group.finish();
}

fn collectives(c: &mut Criterion) {
    bench_path::<NdArray>(c, "ndarray", Default::default());
    #[cfg(feature = "wgpu")]
    {
        use burn_dtensor::cube_kernels::set_kernels_enabled;
        let device = burn::backend::wgpu::WgpuDevice::Cpu;
        let d = device.clone();
        let found = std::panic::catch_unwind(move || {
            burn::tensor::Tensor::<burn::backend::Wgpu, 1>::zeros([1], &d).into_data()
        })
        .is_ok();
        if found {
            bench_path::<burn::backend::Wgpu>(c, "wgpu-kernel", device.clone());
            set_kernels_enabled(false);
            bench_path::<burn::backend::Wgpu>(c, "wgpu-generic", device);
            set_kernels_enabled(true);
        }
    }
    #[cfg(feature = "cuda")]
    {
        use burn_dtensor::cube_kernels::set_kernels_enabled;
        bench_path::<burn::backend::Cuda>(c, "cuda-kernel", Default::default());
        set_kernels_enabled(false);
        bench_path::<burn::backend::Cuda>(c, "cuda-generic", Default::default());
        set_kernels_enabled(true);
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).warm_up_time(std::time::Duration::from_millis(300)).measurement_time(std::time::Duration::from_secs(1));
    targets = collectives
}
criterion_main!(benches);
