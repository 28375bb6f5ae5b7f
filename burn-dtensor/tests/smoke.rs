use burn::backend::NdArray;
use burn::tensor::{Tensor, TensorData, Tolerance};
use burn_dtensor::*;

type Inner = NdArray;
type B = DistributedBackend<Inner>;

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
    r.into_data().assert_eq(&xr.into_data(), true);
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
