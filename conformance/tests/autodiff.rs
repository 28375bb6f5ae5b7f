//! Burn 0.21's autodiff conformance suite (`burn-backend-tests/tests/autodiff/`, its test files
//! unchanged) on `Autodiff<DistributedBackend<Inner>>` (NdArray or Flex inside, see
//! `burn_dtensor_conformance::Inner`), with and without Burn's balanced checkpointing (as
//! upstream's `common/autodiff.rs`), in the layout setting that `BURN_DTENSOR_CONFORMANCE`
//! selects (see `burn_dtensor_conformance::Setting`).
#![recursion_limit = "256"]
#![allow(clippy::single_range_in_vec_init, clippy::duplicate_mod)]

// The suite imports `burn_backend_tests::might_panic` (upstream's crate root re-exports it).
#[cfg(conformance_suite)]
extern crate alloc;
#[cfg(conformance_suite)]
extern crate self as burn_backend_tests;
#[cfg(conformance_suite)]
pub use burn_tensor_testgen::might_panic;

/// The suite's element types (upstream's defaults).
pub type FloatElem = f32;
/// The suite's element types (upstream's defaults).
#[allow(unused)]
pub type IntElem = i32;

#[cfg(conformance_suite)]
mod backend {
    use super::{FloatElem, IntElem};

    /// The inner backend of `Autodiff`.
    pub type Base = burn_dtensor_conformance::Dist;

    /// The backend under test.
    pub type TestBackend = burn_autodiff::Autodiff<Base>;

    #[ctor::ctor]
    fn init_device_settings() {
        burn_dtensor_conformance::configure(
            <FloatElem as burn_tensor::Element>::dtype(),
            <IntElem as burn_tensor::Element>::dtype(),
        );
    }

    /// The device of the autodiff tests: the setting's default device (upstream enables
    /// autodiff on a dispatch device; here the backend type is `Autodiff<..>`).
    pub struct AutodiffDevice;

    impl AutodiffDevice {
        #[allow(clippy::new_ret_no_self)]
        pub fn new() -> <TestBackend as burn_tensor::backend::BackendTypes>::Device {
            Default::default()
        }
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
#[path = "../../../shared/vendor/burn-backend-tests-0.21.0/tests/autodiff/mod.rs"]
mod base;

/// The same tests with Burn's balanced checkpointing (upstream: a checkpointed dispatch device).
#[cfg(conformance_suite)]
mod checkpointing {
    pub use super::{AutodiffDevice, FloatElem};

    /// The backend under test, checkpointed.
    pub type TestBackend = burn_autodiff::Autodiff<
        super::Base,
        burn_autodiff::checkpoint::strategy::BalancedCheckpointing,
    >;
    #[allow(unused)]
    pub type TestTensor<const D: usize> = burn_tensor::Tensor<TestBackend, D>;
    #[allow(unused)]
    pub type TestTensorInt<const D: usize> = burn_tensor::Tensor<TestBackend, D, burn_tensor::Int>;
    #[allow(unused)]
    pub type TestTensorBool<const D: usize> =
        burn_tensor::Tensor<TestBackend, D, burn_tensor::Bool>;

    include!("../../../shared/vendor/burn-backend-tests-0.21.0/tests/autodiff/mod.rs");
}

/// Stands in for the suite on machines without `../shared/vendor` (see `build.rs`).
#[cfg(not(conformance_suite))]
#[test]
fn conformance_suite_not_found() {
    println!(
        "skipped: Burn's conformance suite is not at ../shared/vendor/burn-backend-tests-0.21.0 (CI vendors it there)"
    );
}
