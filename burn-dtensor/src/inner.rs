//! What the decorator knows about its inner backend beyond Burn's traits: three performance
//! traits that decide how shards run and how stacked operands are laid out. Burn 0.21 has no
//! trait for them, so they are read from the backend's type name, here and nowhere else. An
//! inner backend not named here gets what suits a GPU backend: no worker threads, no dense
//! copies, reshapes taken as views. Each answer only changes speed, never values (the
//! equivalence suites run every backend against the oracle either way).

/// Whether shards of inner backend `B` may run on worker threads: only CPU backends (NdArray,
/// Flex), whose ops are plain computations on the calling thread. CubeCL backends (Wgpu, Cuda)
/// give each submitting thread its own stream; kernels for shards of one device submitted from
/// pool threads produced wrong results on Wgpu in testing, and the GPU runs them concurrently
/// anyway, so they are submitted from the calling thread.
pub fn threads_for<B>() -> bool {
    let name = std::any::type_name::<B>();
    name.starts_with("burn_ndarray::") || name.starts_with("burn_flex::")
}

/// Whether `device` is one a process must hold alone when several processes share a host: a
/// GPU (CUDA, ROCm, or a discrete or integrated adapter under Wgpu). Two processes on one GPU
/// share its memory and serialise on it, and NCCL refuses them only inside the first
/// collective. Host devices (NdArray's and Flex's `Cpu`, Wgpu's CPU and default adapters) may be
/// shared. Read from the device's type name and `Debug` form, as everything in this module.
pub fn exclusive_device<D: std::fmt::Debug>(device: &D) -> bool {
    let name = std::any::type_name::<D>();
    if name.starts_with("cubecl_cuda::") || name.starts_with("cubecl_hip::") {
        return true;
    }
    if name.starts_with("cubecl_wgpu::") {
        let d = format!("{device:?}");
        return d.starts_with("DiscreteGpu") || d.starts_with("IntegratedGpu");
    }
    false
}

/// Whether inner backend `B` runs a broadcasting element-wise op above rank 2 faster on
/// materialised operands: Flex only. Its fast paths cover same-shape operands and row
/// broadcasts; a model-parallel bias (`[4, 2, 16, 24] + [1, 2, 1, 24]`) otherwise walks its
/// scalar strided iterator (the model step: 1.02 ms broadcasting, 758 µs materialised).
/// NdArray's broadcasting is fast and the copies slowed its model step (886 µs -> 1.01 ms);
/// CubeCL kernels broadcast natively.
pub fn prefer_dense<B>() -> bool {
    std::any::type_name::<B>().starts_with("burn_flex::")
}

/// Whether inner backend `B` copies the data on every reshape: NdArray (its `reshape` returns an
/// owned array even for a contiguous input). There merging dims for an element-wise op costs a
/// copy per operand, more than the low-rank fast path saves: without it the model-parallel step
/// went from 824 to 740 µs, the data-parallel one from 700 to 651 µs (NOTES.md).
pub fn reshape_copies<B>() -> bool {
    std::any::type_name::<B>().starts_with("burn_ndarray::")
}

#[cfg(test)]
mod tests {
    use burn::backend::{Flex, NdArray};

    #[test]
    fn worker_threads_only_for_cpu_backends() {
        assert!(super::threads_for::<NdArray>());
        assert!(super::threads_for::<Flex>());
        assert!(!super::threads_for::<crate::DistributedBackend<NdArray>>());
    }

    #[test]
    fn dense_operands_for_flex_and_copying_reshapes_for_ndarray_only() {
        assert!(super::prefer_dense::<Flex>() && !super::prefer_dense::<NdArray>());
        assert!(super::reshape_copies::<NdArray>() && !super::reshape_copies::<Flex>());
        assert!(!super::prefer_dense::<crate::DistributedBackend<Flex>>());
    }

    #[test]
    fn only_gpus_are_exclusive_devices() {
        use burn::backend::ndarray::NdArrayDevice;
        assert!(!super::exclusive_device(&NdArrayDevice::Cpu));
        #[cfg(feature = "wgpu")]
        {
            use burn::backend::wgpu::WgpuDevice;
            assert!(super::exclusive_device(&WgpuDevice::DiscreteGpu(0)));
            assert!(super::exclusive_device(&WgpuDevice::IntegratedGpu(1)));
            assert!(!super::exclusive_device(&WgpuDevice::Cpu));
            assert!(!super::exclusive_device(&WgpuDevice::DefaultDevice));
        }
        #[cfg(feature = "cuda")]
        assert!(super::exclusive_device(&burn::backend::cuda::CudaDevice {
            index: 0
        }));
    }
}
