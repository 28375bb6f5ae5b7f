//! `relayout` on `Autodiff<DistributedBackend<B>>` is differentiable: the backward pass
//! relayouts the gradient back to the input's layout, with the values of the plain backend.

use burn::backend::{Autodiff, NdArray};
use burn::tensor::{Tensor, TensorData, Tolerance};
use burn_dtensor::{DTensorExt, DistributedBackend, Layout, Mesh, distribute};

type Ad = Autodiff<DistributedBackend<NdArray>>;

#[test]
fn gradient_flows_back_through_relayout_in_the_input_layout() {
    let mesh = Mesh::virtual_devices(
        [("x", 2), ("y", 4)],
        burn::backend::ndarray::NdArrayDevice::Cpu,
    )
    .unwrap();
    let dx = TensorData::new(
        (0..30).map(|i| i as f32 / 8.0 - 2.0).collect::<Vec<_>>(),
        [5, 6],
    );
    let dc = TensorData::new(
        (0..30)
            .map(|i| ((i * 7) % 11) as f32 / 4.0)
            .collect::<Vec<_>>(),
        [5, 6],
    );
    // Oracle: d/dx sum(exp(x) * c) = exp(x) * c.
    let want = (Tensor::<NdArray, 2>::from_data(dx.clone(), &Default::default()).exp()
        * Tensor::<NdArray, 2>::from_data(dc.clone(), &Default::default()))
    .into_data();
    let specs = [
        ["unsharded", "unsharded"],
        ["x", "unsharded"],
        ["unsharded", "y"],
        ["x", "y"],
        ["y", "x"],
    ];
    for from in specs {
        for to in specs {
            let lf = Layout::new(&mesh, from).unwrap();
            let lt = Layout::new(&mesh, to).unwrap();
            let x: Tensor<Ad, 2> = distribute::<Ad, 2, burn::tensor::Float>(dx.clone(), &lf)
                .unwrap()
                .require_grad();
            let c: Tensor<Ad, 2> = distribute(dc.clone(), &lt).unwrap();
            let y = x.clone().relayout(&lt).unwrap();
            assert_eq!(y.layout(), lt);
            let g = (y.exp() * c).sum().backward();
            let gx = x.grad(&g).unwrap();
            assert_eq!(
                Tensor::<Ad, 2>::from_inner(gx.clone())
                    .layout()
                    .without_partial(),
                lf,
                "{from:?} -> {to:?}"
            );
            gx.into_data()
                .assert_approx_eq::<f32>(&want, Tolerance::default());
        }
    }
}
