//! The decorator's cost per op, on tensors small enough that the inner kernel is negligible:
//! `a + b` and `a.matmul(b)` on `[8, 8]`, and the same under `Autodiff` (forward + backward),
//! on bare NdArray, a mesh of one device, and 8 virtual devices (replicated, and sharded on
//! dim 0). The difference to bare NdArray is the decorator's bookkeeping: rules, layouts,
//! redistribution checks, dispatch.
//!
//! `cargo bench -p burn-dtensor-benches --bench op_overhead`

use burn::backend::{Autodiff, NdArray};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use burn_dtensor::{DistributedBackend, Layout, Mesh, distribute};
use criterion::{Criterion, criterion_group, criterion_main};

/// mimalloc rather than glibc's malloc: glibc returns the buffers freed at the end of a step to
/// the OS and page-faults them back in on the next (measured in NOTES.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn data() -> TensorData {
    TensorData::new((0..64).map(|i| i as f32 / 64.0).collect::<Vec<_>>(), [8, 8])
}

fn ops<B: Backend>(c: &mut Criterion, name: &str, a: Tensor<B, 2>, b: Tensor<B, 2>) {
    c.bench_function(&format!("op/{name}/add"), |bench| {
        bench.iter(|| a.clone() + b.clone())
    });
    c.bench_function(&format!("op/{name}/matmul"), |bench| {
        bench.iter(|| a.clone().matmul(b.clone()))
    });
}

fn backward<B: burn::tensor::backend::AutodiffBackend>(
    c: &mut Criterion,
    name: &str,
    a: Tensor<B, 2>,
    b: Tensor<B, 2>,
) {
    let a = a.require_grad();
    c.bench_function(
        &format!("op/{name}/autodiff_add_mul_sum_backward"),
        |bench| {
            bench.iter(|| {
                let y = ((a.clone() + b.clone()) * b.clone()).sum();
                y.backward()
            })
        },
    );
}

fn overhead(c: &mut Criterion) {
    let dev = Default::default();
    ops::<NdArray>(
        c,
        "bare",
        Tensor::from_data(data(), &dev),
        Tensor::from_data(data(), &dev),
    );
    backward::<Autodiff<NdArray>>(
        c,
        "bare",
        Tensor::from_data(data(), &dev),
        Tensor::from_data(data(), &dev),
    );
    type D = DistributedBackend<NdArray>;
    for (name, n, spec) in [
        ("mesh_of_one", 1, ["unsharded", "unsharded"]),
        ("8dev_replicated", 8, ["unsharded", "unsharded"]),
        ("8dev_sharded", 8, ["x", "unsharded"]),
    ] {
        let mesh = Mesh::new([("x", n)], vec![dev; n]).unwrap();
        let l = Layout::new(&mesh, spec).unwrap();
        let a: Tensor<D, 2> = distribute(data(), &l).unwrap();
        let b: Tensor<D, 2> = distribute(data(), &l).unwrap();
        ops::<D>(c, name, a.clone(), b.clone());
        backward::<Autodiff<D>>(c, name, Tensor::from_inner(a), Tensor::from_inner(b));
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).warm_up_time(std::time::Duration::from_millis(300)).measurement_time(std::time::Duration::from_secs(1));
    targets = overhead
}
criterion_main!(benches);
