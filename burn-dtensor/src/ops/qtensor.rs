//! `QTensorOps`: quantized tensors are kept replicated (quantization parameters are global, so
//! a per-shard quantization would change the numbers). `quantize` gathers its input first;
//! the other quantized ops are Burn's defaults (dequantize, float op, requantize).

use burn::tensor::backend::QTensorPrimitive;
use burn::tensor::backend::{Backend, BackendTypes};
use burn::tensor::ops::{Device, FloatTensor, IntTensor, QTensorOps, QuantizedTensor};
use burn::tensor::quantization::{QuantScheme, QuantizationParametersPrimitive};
use burn::tensor::{FloatDType, Shape, Slice, TensorData, TensorMetadata};

use super::common;
use super::dispatch::dedupe_plan;
use crate::backend::DistributedBackend;
use crate::layout::Layout;
use crate::redistribute::execute;
use crate::tensor::{DTensor, FloatKind, IntKind};

/// The quantized primitive: a replicated [`DTensor`] of `B`'s quantized primitives.
pub type QTensor<B> = DTensor<<B as BackendTypes>::QuantizedTensorPrimitive>;

/// The inner primitive's settings: propagation decides how Burn's default quantized ops
/// compute, so it must be the inner backend's for equal results (the accumulation precision,
/// whose type Burn does not re-export, keeps the trait's default `F32`, as every 0.21 backend).
impl<P: QTensorPrimitive> QTensorPrimitive for DTensor<P> {
    fn scheme(&self) -> &QuantScheme {
        self.per_device()[0].scheme()
    }
    fn propagation(&self) -> burn::tensor::quantization::QuantPropagation {
        self.per_device()[0].propagation()
    }
    fn default_scheme() -> QuantScheme {
        P::default_scheme()
    }
}

/// Per-device map of a replicated quantized tensor (once per distinct inner device).
fn qmap<B: Backend, R: TensorMetadata + Clone>(
    t: QTensor<B>,
    f: impl Fn(B::QuantizedTensorPrimitive) -> R,
) -> DTensor<R> {
    let devices: Vec<B::Device> = t.per_device().iter().map(B::q_device).collect();
    let plan = dedupe_plan(&[&t.layout], &devices);
    let mesh = t.layout.mesh.clone();
    let mut out: Vec<R> = Vec::with_capacity(devices.len());
    for (i, s) in t.into_per_device().into_iter().enumerate() {
        let v = match plan[i] {
            Some(j) => out[j].clone(),
            None => f(s),
        };
        out.push(v);
    }
    common::fix_replicated(DTensor::from_parts(
        vec![],
        Layout::replicated_on(&mesh, 0),
        out,
    ))
}

fn replicated<B: Backend>(t: DTensor<B::FloatTensorPrimitive>) -> DTensor<B::FloatTensorPrimitive> {
    let l = Layout::replicated_on(&t.layout.mesh, t.shape.len());
    execute::<B, FloatKind>(t, &l)
}

impl<B: Backend> QTensorOps<Self> for DistributedBackend<B> {
    fn q_from_data(data: TensorData, device: &Device<Self>) -> QuantizedTensor<Self> {
        let shape = data.shape.to_vec();
        let l = Layout::replicated(&device.mesh, shape.len());
        let plan = dedupe_plan(&[&l], device.mesh.devices());
        let mut out: Vec<B::QuantizedTensorPrimitive> = Vec::new();
        for (i, d) in device.mesh.devices().iter().enumerate() {
            let v = match plan[i] {
                Some(j) => out[j].clone(),
                None => B::q_from_data(data.clone(), d),
            };
            out.push(v);
        }
        DTensor::from_parts(shape, l, out)
    }
    fn quantize(
        t: FloatTensor<Self>,
        scheme: &QuantScheme,
        qparams: QuantizationParametersPrimitive<Self>,
    ) -> QuantizedTensor<Self> {
        let t = replicated::<B>(t);
        let scales = replicated::<B>(qparams.scales);
        let mesh = t.layout.mesh.clone();
        let shape = t.shape.clone();
        let shards: Vec<_> = t
            .into_per_device()
            .into_iter()
            .zip(scales.into_per_device())
            .map(|(x, s)| B::quantize(x, scheme, QuantizationParametersPrimitive { scales: s }))
            .collect();
        let rank = shape.len();
        DTensor::from_parts(shape, Layout::replicated_on(&mesh, rank), shards)
    }
    fn dequantize(t: QuantizedTensor<Self>, dtype: FloatDType) -> FloatTensor<Self> {
        qmap::<B, _>(t, |x| B::dequantize(x, dtype))
    }
    fn q_device(t: &QuantizedTensor<Self>) -> Device<Self> {
        common::device::<B, _>(t)
    }
    fn q_to_device(t: QuantizedTensor<Self>, device: &Device<Self>) -> QuantizedTensor<Self> {
        if t.layout.mesh.id == device.mesh.id() {
            return t;
        }
        let data = burn::tensor::read_sync(B::q_into_data(t.per_device()[0].clone()))
            .expect("reading a quantized shard");
        Self::q_from_data(data, device)
    }
    fn q_reshape(t: QuantizedTensor<Self>, shape: Shape) -> QuantizedTensor<Self> {
        qmap::<B, _>(t, |x| B::q_reshape(x, shape.clone()))
    }
    async fn q_into_data(
        t: QuantizedTensor<Self>,
    ) -> Result<TensorData, burn::tensor::backend::ExecutionError> {
        B::q_into_data(t.per_device()[0].clone()).await
    }
    fn q_expand(t: QuantizedTensor<Self>, shape: Shape) -> QuantizedTensor<Self> {
        qmap::<B, _>(t, |x| B::q_expand(x, shape.clone()))
    }
    fn q_swap_dims(t: QuantizedTensor<Self>, d1: usize, d2: usize) -> QuantizedTensor<Self> {
        qmap::<B, _>(t, |x| B::q_swap_dims(x, d1, d2))
    }
    fn q_permute(t: QuantizedTensor<Self>, axes: &[usize]) -> QuantizedTensor<Self> {
        qmap::<B, _>(t, |x| B::q_permute(x, axes))
    }
    fn q_flip(t: QuantizedTensor<Self>, axes: &[usize]) -> QuantizedTensor<Self> {
        qmap::<B, _>(t, |x| B::q_flip(x, axes))
    }
    fn q_select(
        t: QuantizedTensor<Self>,
        dim: usize,
        idx: IntTensor<Self>,
    ) -> QuantizedTensor<Self> {
        let l = Layout::replicated_on(&idx.layout.mesh, 1);
        let idx = execute::<B, IntKind>(idx, &l);
        let shards: Vec<_> = t
            .into_per_device()
            .into_iter()
            .zip(idx.into_per_device())
            .map(|(x, i)| B::q_select(x, dim, i))
            .collect();
        common::fix_replicated(DTensor::from_parts(
            vec![],
            Layout::replicated_on(&l.mesh, 0),
            shards,
        ))
    }
    fn q_slice(t: QuantizedTensor<Self>, slices: &[Slice]) -> QuantizedTensor<Self> {
        qmap::<B, _>(t, |x| B::q_slice(x, slices))
    }
}
