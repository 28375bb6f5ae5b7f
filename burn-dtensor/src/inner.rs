//! What the decorator knows about its inner backend beyond Burn's traits: three performance
//! traits that decide how shards run and how stacked operands are laid out, and where a
//! host-memory backend keeps a shard's bytes ([`host_bytes`]). Burn 0.21 has no
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

/// The bytes of primitive `t` read in place, for a transfer between processes that needs no
/// copy of them: NdArray's and Flex's tensors (the `ndarray` and `flex` features, on by
/// default) in row-major contiguous layout, numeric elements. `None` for every other backend,
/// layout and dtype (bool; a permuted or sliced view): the caller downloads a copy then. Read
/// from the primitive's concrete type (`Any`), as everything in this module; the answer only
/// changes speed (the bytes are the same either way).
pub fn host_bytes<P: 'static>(t: &P) -> Option<&[u8]> {
    let any = t as &dyn std::any::Any;
    #[cfg(feature = "ndarray")]
    if let Some(t) = any.downcast_ref::<burn_ndarray::NdArrayTensor>() {
        use burn_ndarray::NdArrayTensor as T;
        // Only an array (owned or borrowed) whose logical order is its memory order
        // (`to_slice`).
        macro_rules! bytes {
            ($($v:ident),*) => {
                match t {
                    $(T::$v(s) => s.view().to_slice().map(|v| bytemuck::cast_slice(v)),)*
                    T::Bool(_) => None,
                }
            };
        }
        return bytes!(F64, F32, I64, I32, I16, I8, U64, U32, U16, U8);
    }
    #[cfg(feature = "flex")]
    if let Some(t) = any.downcast_ref::<burn_flex::FlexTensor>() {
        if matches!(t.dtype(), burn::tensor::DType::Bool(_)) {
            return None;
        }
        let es = t.dtype().size();
        return t
            .layout()
            .contiguous_offsets()
            .map(|(start, end)| &t.bytes()[start * es..end * es]);
    }
    let _ = any;
    None
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

    /// In place where the bytes are the row-major tensor (equal to a download of it), `None`
    /// for a permuted view and for bool.
    #[test]
    fn host_bytes_only_for_row_major_host_tensors() {
        use burn::tensor::{Tensor, TensorPrimitive};
        fn check<B: burn::tensor::backend::Backend>() {
            let d = Default::default();
            let t = Tensor::<B, 2>::from_data([[1.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]], &d);
            let want = t.to_data();
            let p = match t.clone().into_primitive() {
                TensorPrimitive::Float(p) => p,
                TensorPrimitive::QFloat(_) => unreachable!(),
            };
            assert_eq!(super::host_bytes(&p), Some(want.as_bytes()));
            let tp = match t.clone().transpose().into_primitive() {
                TensorPrimitive::Float(p) => p,
                TensorPrimitive::QFloat(_) => unreachable!(),
            };
            assert_eq!(super::host_bytes(&tp), None);
            let b = t.greater_elem(2.0).into_primitive();
            assert_eq!(super::host_bytes(&b), None);
        }
        check::<NdArray>();
        check::<Flex>();
        // Another backend's primitive (the decorator's own): never read in place.
        assert_eq!(super::host_bytes(&0u32), None);
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
