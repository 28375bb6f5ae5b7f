//! `FloatTensorOps` for the decorator: each op is a rule plus the inner op.

use burn::tensor::backend::Backend;
use burn::tensor::ops::{BoolTensor, Device, FloatTensor, FloatTensorOps, IntTensor};
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
use crate::tensor::{BoolKind, FloatKind as F, IntKind};

type D<B> = DistributedBackend<B>;

macro_rules! arg_reduce {
    ($($name:ident),*) => {$(
        fn $name(t: FloatTensor<D<B>>, dim: usize, o: IntDType) -> IntTensor<D<B>> {
            let mut shape = t.shape.clone();
            shape[dim] = 1;
            c::along::<B, F, IntKind>(t, &[dim], shape, |x| B::$name(x, dim, o))
        }
    )*};
}

/// The inner sum along `d` (kept as size 1) as every stacked sum runs ([`Kind::reduce_dim`]: at
/// a fixed rank where NdArray would loop at a dynamic one, bitwise the backend's op).
///
/// [`Kind::reduce_dim`]: crate::tensor::Kind::reduce_dim
fn sum_dim<B: Backend>(x: FloatTensor<B>, d: usize) -> FloatTensor<B> {
    <F as crate::tensor::Kind<B>>::reduce_dim(x, d, ReduceOp::Sum)
}

impl<B: Backend> FloatTensorOps<Self> for DistributedBackend<B> {
    fn float_from_data(data: TensorData, device: &Device<Self>) -> FloatTensor<Self> {
        c::from_data::<B, F>(data, device)
    }
    /// Drawn shard by shard from the counter-based stream ([`crate::random`]): each device
    /// draws only the elements it holds, and the values are the same for every layout, mesh and
    /// process count.
    fn float_random(
        shape: Shape,
        dist: Distribution,
        device: &Device<Self>,
        dtype: FloatDType,
    ) -> FloatTensor<Self> {
        let key = crate::random::next_key();
        let dt: burn::tensor::DType = dtype.into();
        let f64 = crate::random::draws_f64(dt);
        let global = shape.to_vec();
        create_from_host::<B, F>(
            &device.mesh,
            shape.to_vec(),
            |ranges| crate::random::float_box(&global, ranges, dist, f64, key),
            |data, d| {
                let drawn = data.dtype;
                let t = B::float_from_data(data, d);
                if drawn == dt {
                    t
                } else {
                    B::float_cast(t, dtype)
                }
            },
        )
    }
    async fn float_into_data(
        t: FloatTensor<Self>,
    ) -> Result<TensorData, burn::tensor::backend::ExecutionError> {
        Ok(c::into_data::<B, F>(t))
    }
    fn float_device(t: &FloatTensor<Self>) -> Device<Self> {
        c::device::<B, _>(t)
    }
    fn float_to_device(t: FloatTensor<Self>, device: &Device<Self>) -> FloatTensor<Self> {
        c::to_device::<B, F>(t, device)
    }
    fn float_into_int(t: FloatTensor<Self>, o: IntDType) -> IntTensor<Self> {
        c::unary::<B, F, IntKind>(t, Linearity::None, |x| B::float_into_int(x, o))
    }
    create_ops!(FloatTensor, F, FloatDType: float_empty, float_zeros, float_ones);
    fn float_full(
        shape: Shape,
        v: Scalar,
        device: &Device<Self>,
        dtype: FloatDType,
    ) -> FloatTensor<Self> {
        create::<B, F>(&device.mesh, shape.to_vec(), |d, s| {
            B::float_full(s.into(), v, d, dtype)
        })
    }

    binary_ops!(FloatTensor, F, Additive: float_add, float_sub);
    binary_ops!(FloatTensor, F, Scaling: float_mul);
    binary_ops!(FloatTensor, F, None: float_div, float_remainder, float_powf, float_atan2);
    scalar_ops!(FloatTensor, F, None: float_add_scalar, float_sub_scalar, float_remainder_scalar, float_powf_scalar_impl, float_clamp_min, float_clamp_max);
    fn float_mul_scalar(t: FloatTensor<Self>, v: Scalar) -> FloatTensor<Self> {
        let lin = Linearity::of_scalar(v.elem(), false);
        c::unary::<B, F, F>(t, lin, |x| B::float_mul_scalar(x, v))
    }
    fn float_div_scalar(t: FloatTensor<Self>, v: Scalar) -> FloatTensor<Self> {
        let lin = Linearity::of_scalar(v.elem(), true);
        c::unary::<B, F, F>(t, lin, |x| B::float_div_scalar(x, v))
    }
    unary_ops!(FloatTensor, F, None: float_recip, float_exp, float_log, float_log1p, float_sqrt, float_abs, float_cos, float_sin, float_tan,
        float_cosh, float_sinh, float_tanh, float_acos, float_acosh, float_asin, float_asinh, float_atan, float_atanh,
        float_round, float_floor, float_ceil, float_trunc, float_erf);
    unary_ops!(FloatTensor, F, None: float_neg);
    compare_ops!(FloatTensor, F: float_equal, float_greater, float_greater_equal, float_lower, float_lower_equal);
    compare_scalar_ops!(FloatTensor, F: float_equal_elem, float_greater_elem, float_greater_equal_elem, float_lower_elem, float_lower_equal_elem);
    along_dim_ops!(FloatTensor, F: float_cumsum, float_cumprod, float_cummin, float_cummax);
    /// A reduction (`dim` becomes size 1) computed with `dim` whole.
    fn float_prod_dim(t: FloatTensor<Self>, dim: usize) -> FloatTensor<Self> {
        let mut shape = t.shape.clone();
        shape[dim] = 1;
        c::along::<B, F, F>(t, &[dim], shape, |x| B::float_prod_dim(x, dim))
    }
    arg_reduce!(float_argmax, float_argmin);

    fn float_clamp(t: FloatTensor<Self>, min: Scalar, max: Scalar) -> FloatTensor<Self> {
        c::unary::<B, F, F>(t, Linearity::None, |x| B::float_clamp(x, min, max))
    }
    fn float_cast(t: FloatTensor<Self>, dtype: FloatDType) -> FloatTensor<Self> {
        c::unary::<B, F, F>(t, Linearity::None, |x| B::float_cast(x, dtype))
    }
    fn float_matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        c::matmul::<B, F, _>(lhs, rhs, c::shard_matmul::<B>, Keep::Contraction)
    }
    fn float_cross(
        lhs: FloatTensor<Self>,
        rhs: FloatTensor<Self>,
        dim: usize,
    ) -> FloatTensor<Self> {
        c::binary_along::<B, F>(lhs, rhs, &[dim], |x, y| B::float_cross(x, y, dim))
    }
    fn float_swap_dims(t: FloatTensor<Self>, d1: usize, d2: usize) -> FloatTensor<Self> {
        c::linear_in(t, move |t| c::swap_dims::<B, F>(t, d1, d2))
    }
    fn float_permute(t: FloatTensor<Self>, axes: &[usize]) -> FloatTensor<Self> {
        let axes = axes.to_vec();
        c::linear_in(t, move |t| c::permute::<B, F>(t, &axes))
    }
    fn float_flip(t: FloatTensor<Self>, axes: &[usize]) -> FloatTensor<Self> {
        let shape = t.shape.clone();
        c::along::<B, F, F>(t, axes, shape, |x| B::float_flip(x, axes))
    }
    fn float_reshape(t: FloatTensor<Self>, shape: Shape) -> FloatTensor<Self> {
        let shape = shape.to_vec();
        c::linear_in(t, move |t| c::reshape::<B, F>(t, shape.clone()))
    }
    fn float_gather(dim: usize, t: FloatTensor<Self>, idx: IntTensor<Self>) -> FloatTensor<Self> {
        c::gather::<B, F, IntKind>(dim, t, idx, B::float_gather)
    }
    fn float_scatter_add(
        dim: usize,
        t: FloatTensor<Self>,
        idx: IntTensor<Self>,
        v: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        c::scatter::<B, F, IntKind>(dim, t, idx, v, B::float_scatter_add)
    }
    fn float_gather_nd(t: FloatTensor<Self>, idx: IntTensor<Self>) -> FloatTensor<Self> {
        c::gather_nd::<B, F, IntKind>(t, idx, B::float_gather_nd)
    }
    fn float_scatter_nd(
        t: FloatTensor<Self>,
        idx: IntTensor<Self>,
        v: FloatTensor<Self>,
        op: IndexingUpdateOp,
    ) -> FloatTensor<Self> {
        c::scatter_nd::<B, F, IntKind>(t, idx, v, |x, i, v| B::float_scatter_nd(x, i, v, op))
    }
    fn float_select(t: FloatTensor<Self>, dim: usize, idx: IntTensor<Self>) -> FloatTensor<Self> {
        c::select::<B, F, IntKind>(t, dim, idx, B::float_select)
    }
    fn float_select_add(
        t: FloatTensor<Self>,
        dim: usize,
        idx: IntTensor<Self>,
        v: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        c::select_assign::<B, F, IntKind>(t, dim, idx, v, B::float_select_add)
    }
    fn float_slice(t: FloatTensor<Self>, slices: &[Slice]) -> FloatTensor<Self> {
        c::slice::<B, F>(t, slices)
    }
    fn float_slice_assign(
        t: FloatTensor<Self>,
        slices: &[Slice],
        v: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        c::slice_assign::<B, F>(t, slices, v, B::float_slice_assign)
    }
    fn float_mask_where(
        t: FloatTensor<Self>,
        mask: BoolTensor<Self>,
        v: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        c::mask_where::<B, F, BoolKind>(t, mask, v, B::float_mask_where)
    }
    fn float_mask_fill(
        t: FloatTensor<Self>,
        mask: BoolTensor<Self>,
        v: Scalar,
    ) -> FloatTensor<Self> {
        c::binary::<B, F, BoolKind, F>(t, mask, Linearity::None, |x, m| B::float_mask_fill(x, m, v))
    }
    fn float_sum(t: FloatTensor<Self>) -> FloatTensor<Self> {
        c::reduce_all::<B, F>(t, ReduceOp::Sum, B::float_sum)
    }
    fn float_max(t: FloatTensor<Self>) -> FloatTensor<Self> {
        c::reduce_all::<B, F>(t, ReduceOp::Max, B::float_max)
    }
    fn float_min(t: FloatTensor<Self>) -> FloatTensor<Self> {
        c::reduce_all::<B, F>(t, ReduceOp::Min, B::float_min)
    }
    fn float_prod(t: FloatTensor<Self>) -> FloatTensor<Self> {
        c::fallback1::<B, F, F>(t, B::float_prod)
    }
    /// Over a dim of one element (global), the operand itself, with no inner op: Burn's
    /// `mean_dim` and `sum_dim` backward sum the output gradient over the reduced dim, already
    /// of size 1, a full op per call on a sharded mesh (about 1 µs each, several per IMDB step).
    /// The values are the operand's: an inner backend that adds the element to a zero turns a
    /// `-0.0` into `+0.0`, which this keeps; every mesh size and process count alike. On a mesh
    /// of one the inner op runs, as for every op there.
    fn float_sum_dim(t: FloatTensor<Self>, dim: usize) -> FloatTensor<Self> {
        if t.shape[dim] == 1 && !super::dispatch::is_solo(&t) {
            return t;
        }
        c::linear_in(t, move |t| {
            let t = c::settle_hinted::<B, F>(t);
            let s = reduce::sum_dim_memo(&t.layout, dim);
            c::reduce_dim::<B, F>(t, &s, dim, sum_dim::<B>)
        })
    }
    /// Exact on uneven shards: over a sharded dim, each shard sums locally and divides by the
    /// *global* size, leaving a partial sum.
    fn float_mean_dim(t: FloatTensor<Self>, dim: usize) -> FloatTensor<Self> {
        c::linear_in(t, move |t| {
            let t = c::settle_hinted::<B, F>(t);
            let s = reduce::sum_dim_memo(&t.layout, dim);
            let n = t.shape[dim] as f64;
            if s.inputs[0].dims[dim].is_some() {
                c::reduce_dim::<B, F>(t, &s, dim, |x, d| {
                    B::float_div_scalar(sum_dim::<B>(x, d), n.into())
                })
            } else {
                c::reduce_dim::<B, F>(t, &s, dim, |x, d| {
                    crate::inner::sum_dim_fixed_rank(&x, d, true)
                        .unwrap_or_else(|| B::float_mean_dim(x, d))
                })
            }
        })
    }
    fn float_max_dim(t: FloatTensor<Self>, dim: usize) -> FloatTensor<Self> {
        let s = reduce::extremum_dim(&t.layout, &t.shape, dim, ReduceOp::Max);
        c::reduce_dim::<B, F>(t, &s, dim, B::float_max_dim)
    }
    fn float_min_dim(t: FloatTensor<Self>, dim: usize) -> FloatTensor<Self> {
        let s = reduce::extremum_dim(&t.layout, &t.shape, dim, ReduceOp::Min);
        c::reduce_dim::<B, F>(t, &s, dim, B::float_min_dim)
    }
    fn float_argtopk(t: FloatTensor<Self>, dim: usize, k: usize, o: IntDType) -> IntTensor<Self> {
        let mut shape = t.shape.clone();
        shape[dim] = k;
        c::along::<B, F, IntKind>(t, &[dim], shape, |x| B::float_argtopk(x, dim, k, o))
    }
    fn float_expand(t: FloatTensor<Self>, shape: Shape) -> FloatTensor<Self> {
        c::expand::<B, F>(t, shape.to_vec(), B::float_expand)
    }
    fn float_unfold(
        t: FloatTensor<Self>,
        dim: usize,
        size: usize,
        step: usize,
    ) -> FloatTensor<Self> {
        c::unfold::<B, F>(t, dim, size, step, |x| B::float_unfold(x, dim, size, step))
    }
    fn float_cat(ts: Vec<FloatTensor<Self>>, dim: usize) -> FloatTensor<Self> {
        c::cat::<B, F>(ts, dim)
    }
    fn float_repeat_dim(t: FloatTensor<Self>, dim: usize, times: usize) -> FloatTensor<Self> {
        c::repeat_dim::<B, F>(t, dim, times, |x| B::float_repeat_dim(x, dim, times))
    }
    fn float_sort(t: FloatTensor<Self>, dim: usize, descending: bool) -> FloatTensor<Self> {
        let shape = t.shape.clone();
        c::along::<B, F, F>(t, &[dim], shape, |x| B::float_sort(x, dim, descending))
    }
    fn float_argsort(
        t: FloatTensor<Self>,
        dim: usize,
        descending: bool,
        o: IntDType,
    ) -> IntTensor<Self> {
        let shape = t.shape.clone();
        c::along::<B, F, IntKind>(t, &[dim], shape, |x| {
            B::float_argsort(x, dim, descending, o)
        })
    }
}
