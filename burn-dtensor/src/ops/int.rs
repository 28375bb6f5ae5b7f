//! `IntTensorOps` for the decorator.

use burn::tensor::backend::Backend;
use burn::tensor::ops::{BoolTensor, Device, FloatTensor, IntTensor, IntTensorOps};
use burn::tensor::{
    BoolDType, Distribution, FloatDType, IndexingUpdateOp, IntDType, Scalar, Shape, Slice,
    TensorData,
};

use super::common as c;
use super::dispatch::{create, create_from_host};
use crate::ReduceOp;
use crate::backend::DistributedBackend;
use crate::rules::matmul::Keep;
use crate::rules::pointwise::Linearity;
use crate::rules::reduce;
use crate::tensor::{BoolKind, FloatKind, IntKind as I};

type D<B> = DistributedBackend<B>;

macro_rules! arg_reduce {
    ($($name:ident),*) => {$(
        fn $name(t: IntTensor<D<B>>, dim: usize) -> IntTensor<D<B>> {
            let mut shape = t.shape.clone();
            shape[dim] = 1;
            c::along::<B, I, I>(t, &[dim], shape, |x| B::$name(x, dim))
        }
    )*};
}

impl<B: Backend> IntTensorOps<Self> for DistributedBackend<B> {
    create_ops!(IntTensor, I, IntDType: int_empty, int_zeros, int_ones);
    /// `range.start + step * i` for the elements each device holds (never the whole range).
    fn int_arange_step(
        range: std::ops::Range<i64>,
        step: usize,
        device: &Device<Self>,
        dtype: IntDType,
    ) -> IntTensor<Self> {
        if step == 0 {
            // The inner backend's own refusal (`step_by(0)` panics), as on one device.
            let t = B::int_arange_step(range, step, &device.mesh.devices()[0], dtype);
            return c::from_data::<B, I>(<I as crate::tensor::Kind<B>>::into_data(t), device);
        }
        let n = if range.end > range.start {
            ((range.end - range.start) as u64).div_ceil(step as u64) as usize
        } else {
            0
        };
        create_from_host::<B, I>(
            &device.mesh,
            vec![n],
            |r| {
                let v: Vec<i64> = r[0]
                    .clone()
                    .map(|i| range.start + (i * step) as i64)
                    .collect();
                TensorData::new(v, [r[0].len()]).convert_dtype(dtype.into())
            },
            |data, d| B::int_from_data(data, d),
        )
    }
    async fn int_into_data(
        t: IntTensor<Self>,
    ) -> Result<TensorData, burn::tensor::backend::ExecutionError> {
        Ok(c::into_data::<B, I>(t))
    }
    fn int_from_data(data: TensorData, device: &Device<Self>) -> IntTensor<Self> {
        c::from_data::<B, I>(data, device)
    }
    fn int_device(t: &IntTensor<Self>) -> Device<Self> {
        c::device::<B, _>(t)
    }
    fn int_to_device(t: IntTensor<Self>, device: &Device<Self>) -> IntTensor<Self> {
        c::to_device::<B, I>(t, device)
    }
    fn int_reshape(t: IntTensor<Self>, shape: Shape) -> IntTensor<Self> {
        c::reshape::<B, I>(t, shape.to_vec())
    }
    fn int_slice(t: IntTensor<Self>, slices: &[Slice]) -> IntTensor<Self> {
        c::slice::<B, I>(t, slices)
    }
    fn int_slice_assign(
        t: IntTensor<Self>,
        slices: &[Slice],
        v: IntTensor<Self>,
    ) -> IntTensor<Self> {
        c::slice_assign::<B, I>(t, slices, v, B::int_slice_assign)
    }
    fn int_into_float(t: IntTensor<Self>, o: FloatDType) -> FloatTensor<Self> {
        c::unary::<B, I, FloatKind>(t, Linearity::None, |x| B::int_into_float(x, o))
    }
    fn int_mask_where(
        t: IntTensor<Self>,
        mask: BoolTensor<Self>,
        v: IntTensor<Self>,
    ) -> IntTensor<Self> {
        c::mask_where::<B, I, BoolKind>(t, mask, v, B::int_mask_where)
    }
    fn int_mask_fill(t: IntTensor<Self>, mask: BoolTensor<Self>, v: Scalar) -> IntTensor<Self> {
        c::binary::<B, I, BoolKind, I>(t, mask, Linearity::None, |x, m| B::int_mask_fill(x, m, v))
    }
    fn int_gather(dim: usize, t: IntTensor<Self>, idx: IntTensor<Self>) -> IntTensor<Self> {
        c::gather::<B, I, I>(dim, t, idx, B::int_gather)
    }
    fn int_scatter_add(
        dim: usize,
        t: IntTensor<Self>,
        idx: IntTensor<Self>,
        v: IntTensor<Self>,
    ) -> IntTensor<Self> {
        c::scatter::<B, I, I>(dim, t, idx, v, B::int_scatter_add)
    }
    fn int_gather_nd(t: IntTensor<Self>, idx: IntTensor<Self>) -> IntTensor<Self> {
        c::gather_nd::<B, I, I>(t, idx, B::int_gather_nd)
    }
    fn int_scatter_nd(
        t: IntTensor<Self>,
        idx: IntTensor<Self>,
        v: IntTensor<Self>,
        op: IndexingUpdateOp,
    ) -> IntTensor<Self> {
        c::scatter_nd::<B, I, I>(t, idx, v, |x, i, v| B::int_scatter_nd(x, i, v, op))
    }
    fn int_select(t: IntTensor<Self>, dim: usize, idx: IntTensor<Self>) -> IntTensor<Self> {
        c::select::<B, I, I>(t, dim, idx, B::int_select)
    }
    fn int_select_add(
        t: IntTensor<Self>,
        dim: usize,
        idx: IntTensor<Self>,
        v: IntTensor<Self>,
    ) -> IntTensor<Self> {
        c::select_assign::<B, I, I>(t, dim, idx, v, B::int_select_add)
    }
    compare_ops!(IntTensor, I: int_equal, int_greater, int_greater_equal, int_lower, int_lower_equal);
    compare_scalar_ops!(IntTensor, I: int_equal_elem, int_greater_elem, int_greater_equal_elem, int_lower_elem, int_lower_equal_elem);
    binary_ops!(IntTensor, I, Additive: int_add, int_sub);
    binary_ops!(IntTensor, I, None: int_mul);
    binary_ops!(IntTensor, I, None: int_div, int_remainder, bitwise_and, bitwise_or, bitwise_xor, bitwise_left_shift, bitwise_right_shift);
    scalar_ops!(IntTensor, I, None: int_add_scalar, int_sub_scalar, int_div_scalar, int_remainder_scalar, bitwise_and_scalar, bitwise_or_scalar,
        bitwise_xor_scalar, bitwise_left_shift_scalar, bitwise_right_shift_scalar, int_clamp_min, int_clamp_max);
    scalar_ops!(IntTensor, I, None: int_mul_scalar);
    unary_ops!(IntTensor, I, None: int_abs, bitwise_not);
    along_dim_ops!(IntTensor, I: int_cumsum, int_cumprod, int_cummin, int_cummax);
    /// A reduction (`dim` becomes size 1) computed with `dim` whole.
    fn int_prod_dim(t: IntTensor<Self>, dim: usize) -> IntTensor<Self> {
        let mut shape = t.shape.clone();
        shape[dim] = 1;
        c::along::<B, I, I>(t, &[dim], shape, |x| B::int_prod_dim(x, dim))
    }
    arg_reduce!(int_argmax, int_argmin);

    fn int_matmul(lhs: IntTensor<Self>, rhs: IntTensor<Self>) -> IntTensor<Self> {
        c::matmul::<B, I, _>(lhs, rhs, B::int_matmul, Keep::Contraction)
    }
    fn int_sum(t: IntTensor<Self>) -> IntTensor<Self> {
        c::reduce_all::<B, I>(t, ReduceOp::Sum, B::int_sum)
    }
    fn int_prod(t: IntTensor<Self>) -> IntTensor<Self> {
        c::fallback1::<B, I, I>(t, B::int_prod)
    }
    fn int_max(t: IntTensor<Self>) -> IntTensor<Self> {
        c::reduce_all::<B, I>(t, ReduceOp::Max, B::int_max)
    }
    fn int_min(t: IntTensor<Self>) -> IntTensor<Self> {
        c::reduce_all::<B, I>(t, ReduceOp::Min, B::int_min)
    }
    fn int_sum_dim(t: IntTensor<Self>, dim: usize) -> IntTensor<Self> {
        let s = reduce::sum_dim_memo(&t.layout, dim);
        c::reduce_dim::<B, I>(t, &s, dim, B::int_sum_dim)
    }
    /// Integer mean rounds per element, so a sharded dim is gathered first (a per-shard
    /// partial mean would round differently).
    fn int_mean_dim(t: IntTensor<Self>, dim: usize) -> IntTensor<Self> {
        let mut shape = t.shape.clone();
        shape[dim] = 1;
        c::along::<B, I, I>(t, &[dim], shape, |x| B::int_mean_dim(x, dim))
    }
    fn int_max_dim(t: IntTensor<Self>, dim: usize) -> IntTensor<Self> {
        let s = reduce::extremum_dim(&t.layout, &t.shape, dim, ReduceOp::Max);
        c::reduce_dim::<B, I>(t, &s, dim, B::int_max_dim)
    }
    fn int_min_dim(t: IntTensor<Self>, dim: usize) -> IntTensor<Self> {
        let s = reduce::extremum_dim(&t.layout, &t.shape, dim, ReduceOp::Min);
        c::reduce_dim::<B, I>(t, &s, dim, B::int_min_dim)
    }
    fn int_argtopk(t: IntTensor<Self>, dim: usize, k: usize) -> IntTensor<Self> {
        let mut shape = t.shape.clone();
        shape[dim] = k;
        c::along::<B, I, I>(t, &[dim], shape, |x| B::int_argtopk(x, dim, k))
    }
    fn int_swap_dims(t: IntTensor<Self>, d1: usize, d2: usize) -> IntTensor<Self> {
        c::swap_dims::<B, I>(t, d1, d2)
    }
    fn int_permute(t: IntTensor<Self>, axes: &[usize]) -> IntTensor<Self> {
        c::permute::<B, I>(t, axes)
    }
    fn int_flip(t: IntTensor<Self>, axes: &[usize]) -> IntTensor<Self> {
        let shape = t.shape.clone();
        c::along::<B, I, I>(t, axes, shape, |x| B::int_flip(x, axes))
    }
    /// Drawn shard by shard from the counter-based stream ([`crate::random`]): the same values
    /// for every layout, mesh and process count.
    fn int_random(
        shape: Shape,
        dist: Distribution,
        device: &Device<Self>,
        dtype: IntDType,
    ) -> IntTensor<Self> {
        let key = crate::random::next_key();
        let global = shape.to_vec();
        create_from_host::<B, I>(
            &device.mesh,
            shape.to_vec(),
            |ranges| crate::random::int_box(&global, ranges, dist, dtype, key),
            |data, d| B::int_from_data(data, d),
        )
    }
    fn int_expand(t: IntTensor<Self>, shape: Shape) -> IntTensor<Self> {
        c::expand::<B, I>(t, shape.to_vec(), B::int_expand)
    }
    fn int_cast(t: IntTensor<Self>, dtype: IntDType) -> IntTensor<Self> {
        c::unary::<B, I, I>(t, Linearity::None, |x| B::int_cast(x, dtype))
    }
    fn int_unfold(t: IntTensor<Self>, dim: usize, size: usize, step: usize) -> IntTensor<Self> {
        c::unfold::<B, I>(t, dim, size, step, |x| B::int_unfold(x, dim, size, step))
    }
    fn int_cat(ts: Vec<IntTensor<Self>>, dim: usize) -> IntTensor<Self> {
        c::cat::<B, I>(ts, dim)
    }
    fn int_repeat_dim(t: IntTensor<Self>, dim: usize, times: usize) -> IntTensor<Self> {
        c::repeat_dim::<B, I>(t, dim, times, |x| B::int_repeat_dim(x, dim, times))
    }
}
