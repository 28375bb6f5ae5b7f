//! Burn's op traits for [`DistributedBackend`](crate::DistributedBackend), one file per trait,
//! each op a line: a sharding rule from [`crate::rules`] plus the inner op, run by
//! [`dispatch`]. The generic bodies shared by float, int and bool tensors live in [`common`].

pub mod common;

/// Element-wise op families, written once for float and int tensors: `$P` is the primitive
/// alias (`FloatTensor`/`IntTensor`), `$K` the [`Kind`](crate::tensor::Kind) marker.
macro_rules! unary_ops {
    ($P:ident, $K:ty, $lin:ident: $($name:ident),* $(,)?) => {$(
        fn $name(t: $P<DistributedBackend<B>>) -> $P<DistributedBackend<B>> {
            c::unary::<B, $K, $K>(t, Linearity::$lin, B::$name)
        }
    )*};
}
macro_rules! scalar_ops {
    ($P:ident, $K:ty, $lin:ident: $($name:ident),* $(,)?) => {$(
        fn $name(t: $P<DistributedBackend<B>>, v: Scalar) -> $P<DistributedBackend<B>> {
            c::unary::<B, $K, $K>(t, Linearity::$lin, |x| B::$name(x, v))
        }
    )*};
}
macro_rules! binary_ops {
    ($P:ident, $K:ty, $lin:ident: $($name:ident),* $(,)?) => {$(
        fn $name(a: $P<DistributedBackend<B>>, b: $P<DistributedBackend<B>>) -> $P<DistributedBackend<B>> {
            c::binary::<B, $K, $K, $K>(a, b, Linearity::$lin, B::$name)
        }
    )*};
}
macro_rules! compare_ops {
    ($P:ident, $K:ty: $($name:ident),* $(,)?) => {$(
        fn $name(a: $P<DistributedBackend<B>>, b: $P<DistributedBackend<B>>, o: BoolDType) -> BoolTensor<DistributedBackend<B>> {
            c::binary::<B, $K, $K, BoolKind>(a, b, Linearity::None, |x, y| B::$name(x, y, o))
        }
    )*};
}
macro_rules! compare_scalar_ops {
    ($P:ident, $K:ty: $($name:ident),* $(,)?) => {$(
        fn $name(a: $P<DistributedBackend<B>>, v: Scalar, o: BoolDType) -> BoolTensor<DistributedBackend<B>> {
            c::unary::<B, $K, BoolKind>(a, Linearity::None, |x| B::$name(x, v, o))
        }
    )*};
}
/// Ops along one dim that keep the shape (cumulative ops): the dim whole, the rest per shard.
macro_rules! along_dim_ops {
    ($P:ident, $K:ty: $($name:ident),* $(,)?) => {$(
        fn $name(t: $P<DistributedBackend<B>>, dim: usize) -> $P<DistributedBackend<B>> {
            let shape = t.shape.clone();
            c::along::<B, $K, $K>(t, &[dim], shape, |x| B::$name(x, dim))
        }
    )*};
}
/// Creation ops filled by shape alone (`empty`, `zeros`, `ones`): each distinct shard made at
/// its own shape on its device ([`dispatch::create`]), never the whole tensor.
macro_rules! create_ops {
    ($P:ident, $K:ty, $DT:ty: $($name:ident),* $(,)?) => {$(
        fn $name(shape: Shape, device: &Device<DistributedBackend<B>>, dtype: $DT) -> $P<DistributedBackend<B>> {
            create::<B, $K>(&device.mesh, shape.to_vec(), |d, s| B::$name(s.into(), d, dtype))
        }
    )*};
}

// The macros above are textually scoped into the op modules declared below.
pub mod dispatch;

mod activation;
mod bool_tensor;
mod conv;
mod float;
mod halo;
mod int;
mod module;
mod pool;
mod qtensor;
pub use qtensor::QTensor;
mod transaction;
mod weight_grads;
