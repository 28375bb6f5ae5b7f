//! `BoolTensorOps` for the decorator.

use burn::tensor::backend::Backend;
use burn::tensor::ops::{BoolTensor, BoolTensorOps, Device, FloatTensor, IntTensor};
use burn::tensor::{BoolDType, FloatDType, IntDType, Scalar, Shape, Slice, TensorData};

use super::common as c;
use super::dispatch::create;
use crate::backend::DistributedBackend;
use crate::rules::pointwise::Linearity;
use crate::tensor::{BoolKind as Bk, FloatKind, IntKind};

impl<B: Backend> BoolTensorOps<Self> for DistributedBackend<B> {
    create_ops!(BoolTensor, Bk, BoolDType: bool_empty, bool_zeros, bool_ones);
    async fn bool_into_data(
        t: BoolTensor<Self>,
    ) -> Result<TensorData, burn::tensor::backend::ExecutionError> {
        Ok(c::into_data::<B, Bk>(t))
    }
    fn bool_from_data(data: TensorData, device: &Device<Self>) -> BoolTensor<Self> {
        c::from_data::<B, Bk>(data, device)
    }
    fn bool_into_int(t: BoolTensor<Self>, o: IntDType) -> IntTensor<Self> {
        c::unary::<B, Bk, IntKind>(t, Linearity::None, |x| B::bool_into_int(x, o))
    }
    fn bool_into_float(t: BoolTensor<Self>, o: FloatDType) -> FloatTensor<Self> {
        c::unary::<B, Bk, FloatKind>(t, Linearity::None, |x| B::bool_into_float(x, o))
    }
    fn bool_device(t: &BoolTensor<Self>) -> Device<Self> {
        c::device::<B, _>(t)
    }
    fn bool_to_device(t: BoolTensor<Self>, device: &Device<Self>) -> BoolTensor<Self> {
        c::to_device::<B, Bk>(t, device)
    }
    fn bool_reshape(t: BoolTensor<Self>, shape: Shape) -> BoolTensor<Self> {
        c::reshape::<B, Bk>(t, shape.to_vec())
    }
    fn bool_slice(t: BoolTensor<Self>, slices: &[Slice]) -> BoolTensor<Self> {
        c::slice::<B, Bk>(t, slices)
    }
    fn bool_slice_assign(
        t: BoolTensor<Self>,
        slices: &[Slice],
        v: BoolTensor<Self>,
    ) -> BoolTensor<Self> {
        c::slice_assign::<B, Bk>(t, slices, v, B::bool_slice_assign)
    }
    fn bool_mask_where(
        t: BoolTensor<Self>,
        mask: BoolTensor<Self>,
        v: BoolTensor<Self>,
    ) -> BoolTensor<Self> {
        c::mask_where::<B, Bk, Bk>(t, mask, v, B::bool_mask_where)
    }
    fn bool_mask_fill(t: BoolTensor<Self>, mask: BoolTensor<Self>, v: Scalar) -> BoolTensor<Self> {
        c::binary::<B, Bk, Bk, Bk>(t, mask, Linearity::None, |x, m| B::bool_mask_fill(x, m, v))
    }
    fn bool_gather(dim: usize, t: BoolTensor<Self>, idx: IntTensor<Self>) -> BoolTensor<Self> {
        c::gather::<B, Bk, IntKind>(dim, t, idx, B::bool_gather)
    }
    fn bool_scatter_or(
        dim: usize,
        t: BoolTensor<Self>,
        idx: IntTensor<Self>,
        v: BoolTensor<Self>,
    ) -> BoolTensor<Self> {
        c::scatter::<B, Bk, IntKind>(dim, t, idx, v, B::bool_scatter_or)
    }
    fn bool_select(t: BoolTensor<Self>, dim: usize, idx: IntTensor<Self>) -> BoolTensor<Self> {
        c::select::<B, Bk, IntKind>(t, dim, idx, B::bool_select)
    }
    fn bool_select_or(
        t: BoolTensor<Self>,
        dim: usize,
        idx: IntTensor<Self>,
        v: BoolTensor<Self>,
    ) -> BoolTensor<Self> {
        c::select_assign::<B, Bk, IntKind>(t, dim, idx, v, B::bool_select_or)
    }
    fn bool_equal(a: BoolTensor<Self>, b: BoolTensor<Self>) -> BoolTensor<Self> {
        c::binary::<B, Bk, Bk, Bk>(a, b, Linearity::None, B::bool_equal)
    }
    fn bool_equal_elem(a: BoolTensor<Self>, v: Scalar) -> BoolTensor<Self> {
        c::unary::<B, Bk, Bk>(a, Linearity::None, |x| B::bool_equal_elem(x, v))
    }
    fn bool_not(t: BoolTensor<Self>) -> BoolTensor<Self> {
        c::unary::<B, Bk, Bk>(t, Linearity::None, B::bool_not)
    }
    fn bool_and(a: BoolTensor<Self>, b: BoolTensor<Self>) -> BoolTensor<Self> {
        c::binary::<B, Bk, Bk, Bk>(a, b, Linearity::None, B::bool_and)
    }
    fn bool_or(a: BoolTensor<Self>, b: BoolTensor<Self>) -> BoolTensor<Self> {
        c::binary::<B, Bk, Bk, Bk>(a, b, Linearity::None, B::bool_or)
    }
    fn bool_swap_dims(t: BoolTensor<Self>, d1: usize, d2: usize) -> BoolTensor<Self> {
        c::swap_dims::<B, Bk>(t, d1, d2)
    }
    fn bool_permute(t: BoolTensor<Self>, axes: &[usize]) -> BoolTensor<Self> {
        c::permute::<B, Bk>(t, axes)
    }
    fn bool_flip(t: BoolTensor<Self>, axes: &[usize]) -> BoolTensor<Self> {
        let shape = t.shape.clone();
        c::along::<B, Bk, Bk>(t, axes, shape, |x| B::bool_flip(x, axes))
    }
    fn bool_expand(t: BoolTensor<Self>, shape: Shape) -> BoolTensor<Self> {
        c::expand::<B, Bk>(t, shape.to_vec(), B::bool_expand)
    }
    fn bool_unfold(t: BoolTensor<Self>, dim: usize, size: usize, step: usize) -> BoolTensor<Self> {
        c::unfold::<B, Bk>(t, dim, size, step, |x| B::bool_unfold(x, dim, size, step))
    }
    fn bool_cat(ts: Vec<BoolTensor<Self>>, dim: usize) -> BoolTensor<Self> {
        c::cat::<B, Bk>(ts, dim)
    }
    fn bool_repeat_dim(t: BoolTensor<Self>, dim: usize, times: usize) -> BoolTensor<Self> {
        c::repeat_dim::<B, Bk>(t, dim, times, |x| B::bool_repeat_dim(x, dim, times))
    }
}
