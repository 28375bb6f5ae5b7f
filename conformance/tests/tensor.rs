//! Burn 0.21's tensor conformance suite (`burn-backend-tests/tests/common/tensor.rs`, its test
//! files unchanged) on `DistributedBackend<Inner>` (NdArray or Flex inside, see
//! `burn_dtensor_conformance::Inner`) in the layout setting that `BURN_DTENSOR_CONFORMANCE`
//! selects (see `burn_dtensor_conformance::Setting`).
#![recursion_limit = "256"]
#![allow(clippy::single_range_in_vec_init)]

#[cfg(conformance_suite)]
extern crate alloc;

/// The suite's element types (upstream's defaults).
pub type FloatElem = f32;
/// The suite's element types (upstream's defaults).
#[allow(unused)]
pub type IntElem = i32;

#[cfg(conformance_suite)]
mod backend {
    use super::{FloatElem, IntElem};

    /// The backend under test.
    pub type TestBackend = burn_dtensor_conformance::Dist;

    #[ctor::ctor]
    fn init_device_settings() {
        burn_dtensor_conformance::configure(
            <FloatElem as burn_tensor::Element>::dtype(),
            <IntElem as burn_tensor::Element>::dtype(),
        );
    }

    /// Collection of types used across tests (as upstream's `common/backend.rs`).
    #[allow(unused)]
    pub mod prelude {
        pub use burn_tensor::Tensor;

        use super::*;
        pub type TestTensor<const D: usize> = Tensor<TestBackend, D>;
        pub type TestTensorInt<const D: usize> = Tensor<TestBackend, D, burn_tensor::Int>;
        pub type TestTensorBool<const D: usize> = Tensor<TestBackend, D, burn_tensor::Bool>;
    }

    #[allow(unused)]
    pub use prelude::*;
}
#[cfg(conformance_suite)]
pub use backend::*;

#[cfg(conformance_suite)]
#[path = "../../../shared/vendor/burn-backend-tests-0.21.0/tests/common/tensor.rs"]
mod tensor;

/// Stands in for the suite on machines without `../shared/vendor` (see `build.rs`).
#[cfg(not(conformance_suite))]
#[test]
fn conformance_suite_not_found() {
    println!(
        "skipped: Burn's conformance suite is not at ../shared/vendor/burn-backend-tests-0.21.0 (CI vendors it there)"
    );
}

/// The layout setting is really applied: tensors the suite creates (from data and `zeros`) carry
/// the setting's layout on its mesh, stacked unless `BURN_DTENSOR_STACKED=0`.
#[cfg(conformance_suite)]
#[test]
fn conformance_setting_is_applied() {
    use burn_dtensor_conformance::Setting;
    let device = Default::default();
    let from_data = TestTensor::<3>::from_data([[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]], &device);
    let zeros = TestTensor::<2>::zeros([3, 1], &device);
    let ints = TestTensorInt::<1>::arange(0..5, &device);
    let (expected3, expected2, expected1) = match Setting::from_env() {
        Setting::One => (
            "f32[1, 3, 2]",
            "f32[3, 1]",
            "[unsharded] on <single device>",
        ),
        Setting::Replicated => ("f32[1, 3, 2]", "f32[3, 1]", "[unsharded] on a=2,b=2"),
        Setting::Sharded => ("f32[1@a, 3@b, 2]", "f32[3@a, 1@b]", "[a] on a=2,b=2"),
        Setting::Dim0 => ("f32[1@x, 3, 2]", "f32[3@x, 1]", "[x] on x=4"),
    };
    use burn_dtensor::DTensorExt;
    assert_eq!(from_data.describe(), expected3);
    assert_eq!(zeros.describe(), expected2);
    assert_eq!(ints.layout().to_string(), expected1);
    let mesh = from_data.layout().mesh().clone();
    let stacked = std::env::var("BURN_DTENSOR_STACKED").map_or(true, |v| v != "0");
    assert_eq!(mesh.is_stacked(), stacked && mesh.size() > 1);
    from_data.into_data().assert_eq(
        &burn_tensor::TensorData::from([[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]]),
        false,
    );
}
