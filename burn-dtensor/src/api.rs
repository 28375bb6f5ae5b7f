//! The user-facing API on Burn tensors: layouts, relayout, host <-> mesh transfers, local shards.
//!
//! Everything here works on `Tensor<DistributedBackend<B>, D>` and on
//! `Tensor<Autodiff<DistributedBackend<B>>, D>` through the [`DistributedOps`] trait.

use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{Int, Tensor, TensorData, TensorPrimitive};

use crate::backend::DistributedBackend;
use crate::error::{DTensorError, Result};
use crate::layout::Layout;
use crate::mesh::Mesh;
use crate::ops::common;
use crate::redistribute::redistribute;
use crate::shard::local_shape;
use crate::tensor::{DTensor, FloatKind, IntKind};

/// Backends whose tensors carry layouts: [`DistributedBackend<B>`] and
/// `Autodiff<DistributedBackend<B>>`.
pub trait DistributedOps: Backend {
    /// The backend that runs each shard.
    type Inner: Backend;
    /// The layout of a float tensor.
    fn float_layout(t: &FloatTensor<Self>) -> Layout;
    /// The layout of an int tensor.
    fn int_layout(t: &IntTensor<Self>) -> Layout;
    /// The layout of a quantized tensor (always replicated).
    fn q_layout(t: &burn::tensor::ops::QuantizedTensor<Self>) -> Layout;
    /// Relayout of a float tensor (differentiable on autodiff backends: the gradient is relaid
    /// out back to the input's layout).
    ///
    /// # Errors
    /// Mesh or rank mismatch.
    fn float_relayout(t: FloatTensor<Self>, layout: &Layout) -> Result<FloatTensor<Self>>;
    /// Relayout of a float tensor outside the autodiff graph: the result is a fresh leaf (what a
    /// parameter needs; see [`LayoutMap`](crate::LayoutMap)).
    ///
    /// # Errors
    /// Mesh or rank mismatch.
    fn float_relayout_leaf(t: FloatTensor<Self>, layout: &Layout) -> Result<FloatTensor<Self>> {
        Self::float_relayout(t, layout)
    }
    /// Relayout of an int tensor.
    ///
    /// # Errors
    /// Mesh or rank mismatch.
    fn int_relayout(t: IntTensor<Self>, layout: &Layout) -> Result<IntTensor<Self>>;
    /// A float tensor from host data, each device receiving only its chunk.
    ///
    /// # Errors
    /// Mesh or rank mismatch.
    fn float_distribute(
        data: TensorData,
        mesh: &Mesh<<Self::Inner as burn::tensor::backend::BackendTypes>::Device>,
        layout: &Layout,
    ) -> Result<FloatTensor<Self>>;
    /// An int tensor from host data, each device receiving only its chunk.
    ///
    /// # Errors
    /// Mesh or rank mismatch.
    fn int_distribute(
        data: TensorData,
        mesh: &Mesh<<Self::Inner as burn::tensor::backend::BackendTypes>::Device>,
        layout: &Layout,
    ) -> Result<IntTensor<Self>>;
    /// The distributed primitive under a float tensor (no copy).
    fn float_dtensor(t: FloatTensor<Self>) -> DTensor<FloatTensor<Self::Inner>>;
}

impl<B: Backend> DistributedOps for DistributedBackend<B> {
    type Inner = B;
    fn float_layout(t: &FloatTensor<Self>) -> Layout {
        (*t.layout).clone()
    }
    fn int_layout(t: &IntTensor<Self>) -> Layout {
        (*t.layout).clone()
    }
    fn q_layout(t: &burn::tensor::ops::QuantizedTensor<Self>) -> Layout {
        (*t.layout).clone()
    }
    fn float_relayout(t: FloatTensor<Self>, layout: &Layout) -> Result<FloatTensor<Self>> {
        redistribute::<B, FloatKind>(t, layout)
    }
    fn int_relayout(t: IntTensor<Self>, layout: &Layout) -> Result<IntTensor<Self>> {
        redistribute::<B, IntKind>(t, layout)
    }
    fn float_distribute(
        data: TensorData,
        mesh: &Mesh<B::Device>,
        layout: &Layout,
    ) -> Result<FloatTensor<Self>> {
        common::distribute::<B, FloatKind>(data, mesh, layout)
    }
    fn int_distribute(
        data: TensorData,
        mesh: &Mesh<B::Device>,
        layout: &Layout,
    ) -> Result<IntTensor<Self>> {
        common::distribute::<B, IntKind>(data, mesh, layout)
    }
    fn float_dtensor(t: FloatTensor<Self>) -> DTensor<FloatTensor<B>> {
        t
    }
}

fn float_prim<B: Backend, const D: usize>(t: Tensor<B, D>) -> FloatTensor<B> {
    match t.into_primitive() {
        TensorPrimitive::Float(p) => p,
        TensorPrimitive::QFloat(q) => B::dequantize(q, burn::tensor::FloatDType::F32),
    }
}

/// The layout of a tensor.
pub fn layout<B: DistributedOps, const D: usize>(t: &Tensor<B, D>) -> Layout {
    match t.clone().into_primitive() {
        TensorPrimitive::Float(p) => B::float_layout(&p),
        TensorPrimitive::QFloat(q) => B::q_layout(&q),
    }
}

/// The layout of an int tensor.
pub fn layout_int<B: DistributedOps, const D: usize>(t: &Tensor<B, D, Int>) -> Layout {
    B::int_layout(&t.clone().into_primitive())
}

/// `f32[64@batch, 1200]`: dtype, global shape and sharding, JAX style.
pub fn describe<B: DistributedOps, const D: usize>(t: &Tensor<B, D>) -> String {
    let l = layout(t);
    l.describe(&format!("{:?}", t.dtype()).to_lowercase(), &t.dims())
}

/// Redistributes a tensor to `layout` (TensorFlow DTensor's `dtensor.relayout`), running the
/// collectives the two layouts imply (see [`crate::redistribute`]). Differentiable on
/// `Autodiff<DistributedBackend<B>>`: the backward pass relayouts the gradient back.
///
/// # Errors
/// [`DTensorError::MeshMismatch`] when `layout` is on another mesh, [`DTensorError::RankMismatch`]
/// when its rank is not `D`.
pub fn relayout<B: DistributedOps, const D: usize>(
    t: Tensor<B, D>,
    layout: &Layout,
) -> Result<Tensor<B, D>> {
    layout.check_rank(D)?;
    Ok(Tensor::from_primitive(TensorPrimitive::Float(
        B::float_relayout(float_prim(t), layout)?,
    )))
}

/// [`relayout`] for int tensors (e.g. labels).
///
/// # Errors
/// As [`relayout`].
pub fn relayout_int<B: DistributedOps, const D: usize>(
    t: Tensor<B, D, Int>,
    layout: &Layout,
) -> Result<Tensor<B, D, Int>> {
    layout.check_rank(D)?;
    Ok(Tensor::from_primitive(B::int_relayout(
        t.into_primitive(),
        layout,
    )?))
}

/// Sends a host tensor to the mesh with each device receiving only its own chunk under `layout`
/// (TensorFlow DTensor's `pack` of a host batch; no full copy on every device).
///
/// # Errors
/// [`DTensorError::RankMismatch`] when `data`'s rank is not `D` or not the layout's,
/// [`DTensorError::MeshMismatch`] when `layout` is on another mesh.
pub fn distribute<B: DistributedOps, const D: usize>(
    data: TensorData,
    mesh: &Mesh<<B::Inner as burn::tensor::backend::BackendTypes>::Device>,
    layout: &Layout,
) -> Result<Tensor<B, D>> {
    if data.rank() != D {
        return Err(DTensorError::RankMismatch {
            layout_rank: D,
            tensor_rank: data.rank(),
        });
    }
    Ok(Tensor::from_primitive(TensorPrimitive::Float(
        B::float_distribute(data, mesh, layout)?,
    )))
}

/// [`distribute`] for int tensors.
///
/// # Errors
/// As [`distribute`].
pub fn distribute_int<B: DistributedOps, const D: usize>(
    data: TensorData,
    mesh: &Mesh<<B::Inner as burn::tensor::backend::BackendTypes>::Device>,
    layout: &Layout,
) -> Result<Tensor<B, D, Int>> {
    if data.rank() != D {
        return Err(DTensorError::RankMismatch {
            layout_rank: D,
            tensor_rank: data.rank(),
        });
    }
    Ok(Tensor::from_primitive(B::int_distribute(
        data, mesh, layout,
    )?))
}

/// The per-device shards of a float tensor on the inner backend (row-major over the mesh),
/// each of the per-shard shape its layout implies. Partial layouts give the unreduced values.
pub fn to_local_shards<B: DistributedOps, const D: usize>(
    t: Tensor<B, D>,
) -> Vec<Tensor<B::Inner, D>> {
    let t = crate::stack::to_per_device::<B::Inner, crate::tensor::FloatKind>(B::float_dtensor(
        float_prim(t),
    ));
    t.shards
        .into_iter()
        .map(|p| Tensor::from_primitive(TensorPrimitive::Float(p)))
        .collect()
}

/// Builds a distributed tensor of global shape `shape` from one inner tensor per mesh device
/// (TensorFlow DTensor's `pack`), checked against `layout`.
///
/// # Errors
/// [`DTensorError::ShardCountMismatch`], [`DTensorError::ShardShapeMismatch`],
/// [`DTensorError::RankMismatch`].
pub fn from_local_shards<B: Backend, const D: usize>(
    shards: Vec<Tensor<B, D>>,
    shape: [usize; D],
    layout: &Layout,
) -> Result<Tensor<DistributedBackend<B>, D>> {
    layout.check_rank(D)?;
    let n = layout.mesh.size();
    if shards.len() != n {
        return Err(DTensorError::ShardCountMismatch {
            expected: n,
            given: shards.len(),
        });
    }
    let mut prims = Vec::with_capacity(n);
    for (i, s) in shards.into_iter().enumerate() {
        let expected = local_shape(layout, &shape, i);
        if s.dims().to_vec() != expected {
            return Err(DTensorError::ShardShapeMismatch {
                index: i,
                found: s.dims().to_vec(),
                expected,
                global: shape.to_vec(),
            });
        }
        prims.push(float_prim(s));
    }
    Ok(Tensor::from_primitive(TensorPrimitive::Float(
        DTensor::from_parts(shape.to_vec(), layout.clone(), prims),
    )))
}
