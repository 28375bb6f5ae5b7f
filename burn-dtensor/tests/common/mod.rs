//! Shared by the backend-generic suites (`backends.rs`, `cube_collectives.rs`): the device probe,
//! the plain (unfused) CubeCL backend types, and the macro that instantiates a suite per backend.
#![allow(dead_code, unused_macros)]

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

/// Whether the backend can run at all here (a GPU backend without an adapter cannot); a suite
/// prints why it skips instead of failing on machines without one, unless
/// `BURN_DTENSOR_REQUIRE_DEVICE` is set (CI sets it, so a lost device fails the run).
pub fn available<I: Backend>(device: &I::Device) -> bool {
    let d = device.clone();
    let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        Tensor::<I, 1>::zeros([1], &d).into_data()
    }))
    .is_ok();
    if !ok {
        assert!(
            std::env::var_os("BURN_DTENSOR_REQUIRE_DEVICE").is_none(),
            "no device for {}",
            std::any::type_name::<I>()
        );
        println!(
            "skipped: no device for {} (for wgpu, install mesa-vulkan-drivers)",
            std::any::type_name::<I>()
        );
    }
    ok
}

/// Wgpu without Burn's fusion, whatever the features (with `fusion`, `burn::backend::Wgpu` is
/// `Fusion<CubeBackend<..>>`).
#[cfg(feature = "wgpu")]
pub type WgpuPlain =
    burn::backend::wgpu::CubeBackend<burn::backend::wgpu::WgpuRuntime, f32, i32, u32>;
/// Cuda without Burn's fusion, whatever the features.
#[cfg(feature = "cuda")]
pub type CudaPlain = burn_cubecl::CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>;

/// `suite!(name, Backend, device, [test_fn, ..])`: a module `name` with one `#[test]` per generic
/// `test_fn::<Backend>(device)` of the including file, each skipped when the device is missing.
macro_rules! suite {
    ($name:ident, $backend:ty, $device:expr, [$($test:ident),* $(,)?]) => {
        mod $name {
            $(
                #[test]
                fn $test() {
                    if crate::common::available::<$backend>(&$device) {
                        super::$test::<$backend>($device);
                    }
                }
            )*
        }
    };
}
