//! [`DistributedBackend`]: the backend decorator.

use std::marker::PhantomData;

use burn::tensor::DType;
use burn::tensor::backend::{
    Backend, BackendTypes, DTypeUsageSet, ExecutionError, QTensorPrimitive,
};
use burn::tensor::quantization::QuantScheme;

use crate::device::DistributedDevice;
use crate::tensor::DTensor;

/// A Burn backend decorator (like `Autodiff<B>`) that makes any backend `B` distributed,
/// DTensor-style: every tensor carries a [`Layout`](crate::Layout) on a [`Mesh`](crate::Mesh) of
/// `B`'s devices and holds one `B` primitive per mesh device; every op runs per shard on `B`
/// plus the collectives the layouts imply (the sharding rules: `burn-dtensor/src/rules/`).
///
/// The device is a [`DistributedDevice`] (a mesh). Tensors created on it are replicated;
/// [`relayout`](crate::DTensorExt::relayout), [`distribute`](crate::distribute) and a
/// [`LayoutMap`](crate::LayoutMap) shard them. Whatever the layouts, results equal `B`'s on the
/// whole tensor (to float rounding: sums over shards add in another order).
///
/// Not to be confused with the *trait* `burn::tensor::backend::distributed::DistributedBackend`
/// of Burn's `distributed` feature; this crate never glob-imports it.
#[derive(Clone, Copy, Debug, Default)]
pub struct DistributedBackend<B> {
    _b: PhantomData<B>,
}

impl<B: Backend> BackendTypes for DistributedBackend<B> {
    type Device = DistributedDevice<B::Device>;
    type FloatTensorPrimitive = DTensor<B::FloatTensorPrimitive>;
    type FloatElem = B::FloatElem;
    type IntTensorPrimitive = DTensor<B::IntTensorPrimitive>;
    type IntElem = B::IntElem;
    type BoolTensorPrimitive = DTensor<B::BoolTensorPrimitive>;
    type BoolElem = B::BoolElem;
    type QuantizedTensorPrimitive = crate::ops::QTensor<B>;
}

impl<B: Backend> DistributedBackend<B> {
    /// The default quantization scheme of tensors on `device`: the inner backend's (quantized
    /// tensors hold `B`'s quantized primitives). Mirrors Burn's `Dispatch::default_quant_scheme`,
    /// which Burn's conformance suite calls on its test backend.
    pub fn default_quant_scheme(_device: &DistributedDevice<B::Device>) -> QuantScheme {
        <B::QuantizedTensorPrimitive as QTensorPrimitive>::default_scheme()
    }
}

impl<B: Backend> Backend for DistributedBackend<B> {
    fn name(device: &Self::Device) -> String {
        format!(
            "distributed<{}>[{}]",
            B::name(&device.mesh.devices()[0]),
            device.mesh
        )
    }
    /// Seeds the decorator's counter-based stream ([`crate::random`], every random creation)
    /// and the inner backend's own generator on every device.
    fn seed(device: &Self::Device, seed: u64) {
        crate::random::seed(seed);
        for d in device.mesh.devices() {
            B::seed(d, seed);
        }
    }
    fn sync(device: &Self::Device) -> Result<(), ExecutionError> {
        for d in device.mesh.devices() {
            B::sync(d)?;
        }
        Ok(())
    }
    fn dtype_usage(device: &Self::Device, dtype: DType) -> DTypeUsageSet {
        B::dtype_usage(&device.mesh.devices()[0], dtype)
    }
    fn device_count(_type_id: u16) -> usize {
        1
    }
}

/// With the `nccl` feature, Burn's `distributed` feature is on and `Autodiff<B>` requires Burn's
/// collective trait of its inner backend. The decorator runs its own collectives (see
/// [`crate::collective`]), so it keeps the trait's defaults: Burn's data-parallel gradient sync
/// (`DistributedParams` on parameters) is not supported on it; shard with a layout map instead.
#[cfg(feature = "nccl")]
impl<B: Backend> burn::tensor::backend::distributed::DistributedBackend for DistributedBackend<B> {}
