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
