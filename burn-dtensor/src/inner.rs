//! What the decorator knows about its inner backend beyond Burn's traits: three performance
//! traits that decide how shards run and how stacked operands are laid out, where a
//! host-memory backend keeps a shard's bytes ([`host_bytes`], [`host_bytes_mut`]), and NdArray's
//! GEMM and reshape on its shards as they lie ([`matmul_strided`], also Flex's batched GEMM off
//! rayon's pool, and [`reshape_view`]). Burn 0.21 has no trait for them, so they are read from
//! the backend's type name, here and nowhere else. An inner backend not named here gets what
//! suits a GPU backend: no worker threads, no dense copies, reshapes taken as views. Each answer
//! only changes speed, never values (the equivalence suites run every backend against the
//! oracle either way), except [`rows_split_exactly`], which is `true` only where a split matmul
//! is known to be bitwise the whole one.

/// Per-shard work from which the shards of one op run on rayon's pool; below it, waking the
/// pool (a futex round trip per op) costs more than it saves. Work is counted in elements of
/// the largest input shard, and for matmul as multiply-adds / [`MATMUL_WORK_PER_ELEMENT`].
///
/// Default 256 Ki (1 MiB of f32 per shard). Measured on a 2-core machine (NOTES.md): at 16 Ki,
/// the IMDB step's `[1200, 48]` per-shard gradients and their sums ran on the pool and the
/// data-parallel step took 1.62 ms against 1.27 ms serial; the 20000 -> 4096 MLP's shards
/// (millions of elements) gain 1.6x from the pool.
/// [`Config::parallel_min_elements`](crate::Config::parallel_min_elements) (or
/// `BURN_DTENSOR_PAR_MIN`).
pub(crate) fn par_min() -> usize {
    crate::config::config().parallel_min_elements
}

/// Multiply-adds of a matmul worth one element of element-wise work in [`par_min`]'s count
/// (a matmul's inputs can be small while its compute is large: `[256, 256] @ [256, 256]` is
/// 64 Ki elements per input but 16.8 M multiply-adds).
pub(crate) const MATMUL_WORK_PER_ELEMENT: usize = 16;

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

/// Whether inner backend `B`'s matmul computes every output element by the same operations
/// whatever the number of rows `m`: NdArray only (`matrixmultiply`'s GEMM: a block size along
/// the contracting dim fixed per kernel, never split, each element accumulated over it in
/// order). Then a contraction split by rows across processes is bitwise the whole one
/// (`rules::matmul::row_split_contraction`). Flex's GEMM (the `gemm` crate) chooses its blocking
/// from the shape, and CubeCL picks kernels and tiles by shape, so for them the answer is
/// `false` and the whole contraction runs on every process: the only answer of this module that
/// would change values if it were wrong, so it is `true` only where known.
pub fn rows_split_exactly<B>() -> bool {
    std::any::type_name::<B>().starts_with("burn_ndarray::")
}

/// Whether [`crate::api::distribute`] lays out a stacked input of inner backend `B` with its row
/// blocks in order (`stack::rows_inner_order`), the stack a permuted view of that buffer: Flex
/// only, whose ops take a permuted view as it lies (its unary ops map the storage in memory
/// order and keep the strides). Not NdArray: its SIMD unary ops (`abs`, ...) on a permuted
/// array that is not uniquely owned write the memory-order results into a row-major array, so
/// they return the values in the wrong places (`burn-ndarray` 0.21, `unary_scalar_simd_owned`;
/// Burn's conformance test `clone_invariance::float::Abs` caught it, NOTES.md). Not a CubeCL
/// backend, which would copy the permuted view at its first kernel.
pub fn row_blocks_in_memory<B>() -> bool {
    std::any::type_name::<B>().starts_with("burn_flex::")
}

/// Whether inner backend `B` copies the data on every reshape: NdArray (its `reshape` returns an
/// owned array even for a contiguous input; the decorator's own reshapes take a
/// [`reshape_view`] first, which covers row-major arrays only). There merging dims for an
/// element-wise op costs a copy per operand (stacked operands are often broadcast views), more
/// than the low-rank fast path saves: without it the model-parallel step went from 824 to
/// 740 µs, the data-parallel one from 700 to 651 µs (NOTES.md, before [`reshape_view`]).
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

/// `f` on primitive `t`'s dims, read in place where its backend keeps them (a Flex tensor's
/// layout) instead of built as a new `Shape` (`TensorMetadata::shape` clones them): the
/// decorator reads the dims of every stacked op's operands and output several times (the
/// output check, the element-wise plan, the reshape and memory-order tests), and building
/// them was about 14 µs of the 8-device spatial IMDB step on Flex against 4 µs for the single
/// device's own ops (NOTES.md, session 64). Other backends: `f(&t.shape())`.
#[inline]
pub fn with_dims<P: burn::tensor::TensorMetadata + 'static, R>(
    t: &P,
    f: impl FnOnce(&[usize]) -> R,
) -> R {
    #[cfg(feature = "flex")]
    if let Some(x) = (t as &dyn std::any::Any).downcast_ref::<burn_flex::FlexTensor>() {
        return f(x.layout().shape());
    }
    f(&t.shape())
}

/// The order of `t`'s dims in which it is row-major and contiguous, where `t` is a permuted view
/// of such a tensor: a transposed operand, e.g. a data-parallel weight gradient's `x^T` stacked
/// as `[positions, features, rows]` with strides `[rows * features, 1, features]`. `Some(q)`, not
/// the identity, with `permute(t, q)` row-major ([`host_bytes`] reads it in place); dims of size
/// 1 keep their place. `None` for a tensor already row-major, any other layout (a slice, a
/// broadcast, negative strides), and backends other than NdArray and Flex. Only speed depends
/// on the answer: the caller runs a relayout on the row-major tensor and permutes the result
/// back (`collective::stacked::all_to_all_across`).
pub fn row_major_order<P: 'static>(t: &P) -> Option<Vec<usize>> {
    let any = t as &dyn std::any::Any;
    #[cfg(feature = "ndarray")]
    if let Some(t) = any.downcast_ref::<burn_ndarray::NdArrayTensor>() {
        use burn_ndarray::NdArrayTensor as T;
        macro_rules! layout {
            ($($v:ident),*) => {
                match t {
                    $(T::$v(s) => {
                        let v = s.view();
                        crate::host::row_major_order(v.shape(), v.strides())
                    })*
                }
            };
        }
        return layout!(F64, F32, I64, I32, I16, I8, U64, U32, U16, U8, Bool);
    }
    #[cfg(feature = "flex")]
    if let Some(t) = any.downcast_ref::<burn_flex::FlexTensor>() {
        let l = t.layout();
        return (l.start_offset() == 0)
            .then(|| crate::host::row_major_order(l.shape(), l.strides()))
            .flatten();
    }
    let _ = any;
    None
}

/// Primitive `t` copied row-major on the host where its backend would copy it element by element:
/// a Flex tensor that is a strided view (a permuted or sliced stacked shard) whose dims do not
/// merge to two or fewer ([`crate::host::collapse_strided`]; up to two, Flex's own tiled copy is
/// as fast). `None` for every other backend, layout and dtype (bool, quantized, negative
/// strides): the caller keeps `t`. See [`crate::tensor::Kind::dense`].
pub fn dense_copy<P: 'static>(t: &P) -> Option<burn::tensor::TensorData> {
    #[cfg(feature = "flex")]
    if let Some((t, strides)) = flex_host_view(t) {
        let l = t.layout();
        let shape: &[usize] = l.shape();
        if crate::host::collapse_strided(shape, &strides).0.len() <= 2 {
            return None;
        }
        return crate::host::copy_strided(t.bytes(), t.dtype(), shape, &strides, l.start_offset());
    }
    let _ = t;
    None
}

/// `t` as a Flex strided view (not contiguous) of a numeric dtype (not bool or quantized) with
/// its strides, all non-negative, in elements: what [`crate::host::copy_strided`] reads. `None`
/// otherwise (a contiguous tensor is its own row-major copy).
#[cfg(feature = "flex")]
fn flex_host_view<P: 'static>(t: &P) -> Option<(&burn_flex::FlexTensor, Vec<usize>)> {
    use burn::tensor::DType;
    let t = (t as &dyn std::any::Any).downcast_ref::<burn_flex::FlexTensor>()?;
    if t.is_contiguous() || matches!(t.dtype(), DType::Bool(_) | DType::QFloat(_)) {
        return None;
    }
    let strides = t
        .layout()
        .strides()
        .iter()
        .map(|&s| usize::try_from(s).ok())
        .collect::<Option<_>>()?;
    Some((t, strides))
}

/// Primitive `t` reshaped to `shape` then permuted by `order`, copied row-major on the host in
/// one pass where `t` is a Flex strided view (not contiguous) whose reshape is a view
/// ([`crate::host::view_strides`]): the view's strides permuted, then
/// [`crate::host::copy_strided`]. A strided `t` would otherwise be copied twice, by the reshape
/// ([`dense_copy`]) and by the permute (a spatial step's gradient chunks, NOTES.md session 45).
/// `None` for every other backend, dtype (bool, quantized) or layout (contiguous, negative
/// strides, a reshape that needs a copy): the caller reshapes and permutes.
pub fn reshape_permute_copy<P: 'static>(
    t: &P,
    shape: &[usize],
    order: &[usize],
) -> Option<burn::tensor::TensorData> {
    #[cfg(feature = "flex")]
    if let Some((t, strides)) = flex_host_view(t) {
        let l = t.layout();
        let view = crate::host::view_strides(l.shape(), &strides, shape)?;
        let (shape, strides): (Vec<usize>, Vec<usize>) =
            order.iter().map(|&d| (shape[d], view[d])).unzip();
        return crate::host::copy_strided(t.bytes(), t.dtype(), &shape, &strides, l.start_offset());
    }
    let _ = (t, shape, order);
    None
}

/// The bytes of a host tensor primitive for writing in place: [`host_bytes`]'s bytes where,
/// besides, this primitive is their only owner (no clone or view of it shares them), so that a
/// collective can write its result over its input (an in-place all-reduce) and the primitive
/// then holds the result. `None` where [`host_bytes`] is `None` or the storage is shared: the
/// caller writes into a new buffer then.
pub fn host_bytes_mut<P: 'static>(t: &mut P) -> Option<&mut [u8]> {
    let any = t as &mut dyn std::any::Any;
    #[cfg(feature = "ndarray")]
    if any.is::<burn_ndarray::NdArrayTensor>() {
        use burn_ndarray::NdArrayTensor as T;
        let t = any.downcast_mut::<T>().expect("checked");
        // Owned and unique (a borrowed storage is never), in standard layout: `as_slice_mut`
        // would otherwise copy (copy-on-write) or give `None`.
        macro_rules! bytes {
            ($($v:ident),*) => {
                match t {
                    $(T::$v(s) => {
                        if !s.is_owned() || !s.is_unique() {
                            return None;
                        }
                        s.ensure_owned().as_slice_mut().map(|v| bytemuck::cast_slice_mut(v))
                    })*
                    T::Bool(_) => None,
                }
            };
        }
        return bytes!(F64, F32, I64, I32, I16, I8, U64, U32, U16, U8);
    }
    #[cfg(feature = "flex")]
    if any.is::<burn_flex::FlexTensor>() {
        use burn::tensor::DType;
        let t = any
            .downcast_mut::<burn_flex::FlexTensor>()
            .expect("checked");
        let es = t.dtype().size();
        let (start, end) = t.layout().contiguous_offsets()?;
        macro_rules! bytes {
            ($($d:ident => $e:ty),*) => {
                match t.dtype() {
                    $(DType::$d => t
                        .try_storage_mut::<$e>()
                        .map(|v| bytemuck::cast_slice_mut::<$e, u8>(v)),)*
                    _ => None,
                }
            };
        }
        let all = bytes!(F64 => f64, F32 => f32, I64 => i64, I32 => i32, I16 => i16, I8 => i8,
            U64 => u64, U32 => u32, U16 => u16, U8 => u8)?;
        return Some(&mut all[start * es..end * es]);
    }
    let _ = any;
    None
}

/// The scaffold of the NdArray views ([`reshape_view`], [`rows_view`], [`merge_leading_view`]):
/// `$t` (a primitive of type `P`) as an owned, row-major (with `any layout`: any strides) NdArray
/// array of any element type, shared
/// (`ArcArray<E, IxDyn>`, bound to `$a`), turned by `$view` (an `Option` of the viewed array)
/// into a primitive of type `P` again; `None` for another backend or layout, or where `$view`
/// gives none.
#[cfg(feature = "ndarray")]
macro_rules! ndarray_view {
    ($t:expr, |$a:ident| $view:expr) => {
        ndarray_view!(@each $t, true, |$a| $view; F64, F32, I64, I32, I16, I8, U64, U32, U16, U8, Bool)
    };
    // Any strides (a permuted or broadcast view too), where `$view` checks what it needs.
    (any layout $t:expr, |$a:ident| $view:expr) => {
        ndarray_view!(@each $t, false, |$a| $view; F64, F32, I64, I32, I16, I8, U64, U32, U16, U8, Bool)
    };
    (@each $t:expr, $standard:expr, |$a:ident| $view:expr; $($v:ident),*) => {{
        use burn_ndarray::NdArrayTensor as T;
        (|| {
            let t = ($t as &dyn std::any::Any).downcast_ref::<T>()?;
            let out: T = match t {
                $(T::$v(s) => {
                    if !s.is_owned() || ($standard && !s.view().is_standard_layout()) {
                        return None;
                    }
                    let $a = s.clone().into_shared();
                    T::$v($view?.into())
                })*
                // Variants left out of the list (`sum_dim_fixed_rank`: floats only).
                #[allow(unreachable_patterns)]
                _ => return None,
            };
            $crate::inner::as_primitive::<T, P>(out)
        })()
    }};
}

/// Primitive `t` reshaped to `shape` as a view of its storage, where the inner backend's own
/// reshape would copy: NdArray's arrays in row-major (standard) layout, whose `reshape` returns
/// a copy even then ([`reshape_copies`]); Flex tensors whose dims of more than one element are
/// row-major and contiguous whatever the strides of their dims of size 1 (Flex's reshape copies
/// those). The view shares `t`'s storage (NdArray's arrays are
/// reference-counted and copy on write), so the values are those of the backend's reshape and
/// dropping `t` leaves the view the storage's only owner. `Err(shape)` (handed back, so neither
/// path copies it) for every other backend, for a permuted or strided array and for a `shape`
/// of another element count: the caller uses the backend's reshape then. Every reshape of the
/// decorator goes through here first
/// ([`crate::tensor::Kind::reshape`]): in the stacked matmul and its contraction these copies
/// were 3-4% of the 8-device model-parallel IMDB step (NOTES.md).
pub fn reshape_view<P: 'static>(
    t: &P,
    shape: burn::tensor::Shape,
) -> Result<P, burn::tensor::Shape> {
    #[cfg(feature = "ndarray")]
    if let Some(v) = ndarray_view!(t, |a| a
        .into_shape_with_order(ndarray::IxDyn(&shape[..]))
        .ok())
    {
        return Ok(v);
    }
    #[cfg(feature = "flex")]
    if let Some(f) = (t as &dyn std::any::Any).downcast_ref::<burn_flex::FlexTensor>() {
        let l = f.layout();
        if shape.num_elements() != l.num_elements() || !big_dims_row_major(l.shape(), l.strides()) {
            return Err(shape);
        }
        let mut strides = vec![0isize; shape.len()];
        let mut step = 1isize;
        for (s, &d) in strides.iter_mut().zip(shape.iter()).rev() {
            *s = step;
            step *= d as isize;
        }
        return flex_view(f, shape, strides)
            .ok_or_else(|| unreachable!("a Flex view of a Flex tensor"));
    }
    let _ = t;
    Err(shape)
}

/// Primitive `t` reshaped to `shape` as a strided view of its storage wherever one exists
/// ([`crate::host::view_strides`], numpy's no-copy reshape): a Flex tensor with non-negative
/// strides, for an operand the next op reads as it lies whatever its strides (a GEMM's, which
/// packs its operands). The contraction over a sharded batch merges the batch axis into the
/// rows of a `distribute`d input kept as a view of the global buffer (`[b, f, 1, 32, 600]`
/// with row stride 1200: the merged rows `[f, 64, 600]` keep stride 1200). `None` for other
/// backends, negative strides and reshapes that need a copy: the caller copies.
pub fn strided_reshape_view<P: 'static>(t: &P, shape: &[usize]) -> Option<P> {
    #[cfg(feature = "flex")]
    if let Some(f) = (t as &dyn std::any::Any).downcast_ref::<burn_flex::FlexTensor>() {
        let l = f.layout();
        let strides: Vec<usize> = l
            .strides()
            .iter()
            .map(|&s| usize::try_from(s).ok())
            .collect::<Option<_>>()?;
        let view = crate::host::view_strides(l.shape(), &strides, shape)?;
        let view = view.into_iter().map(|s| s as isize).collect();
        return flex_view(f, shape.to_vec().into(), view);
    }
    let _ = (t, shape);
    None
}

/// A view of Flex tensor `f`'s storage with `shape` and `strides` (elements) from `f`'s own
/// start offset, as primitive type `P` (which `f` is): no copy, no clone of `f`'s layout.
#[cfg(feature = "flex")]
fn flex_view<P: 'static>(
    f: &burn_flex::FlexTensor,
    shape: burn::tensor::Shape,
    strides: Vec<isize>,
) -> Option<P> {
    let layout = burn_flex::Layout::new(shape, strides, f.layout().start_offset());
    as_primitive(burn_flex::FlexTensor::from_arc(
        f.data_arc(),
        layout,
        f.dtype(),
    ))
}

/// `t` as primitive type `P`, which it is (the caller downcast a `P` to `T`): moved through an
/// `Option` on the stack rather than a `Box<dyn Any>`, so that a view costs no allocation.
#[cfg(any(feature = "ndarray", feature = "flex"))]
pub(crate) fn as_primitive<T: 'static, P: 'static>(t: T) -> Option<P> {
    let mut slot = Some(t);
    (&mut slot as &mut dyn std::any::Any)
        .downcast_mut::<Option<P>>()
        .and_then(Option::take)
}

/// Whether a strided layout of `shape` is row-major and contiguous once its dims of size 1 are
/// left out (their strides say nothing): Flex's own `is_contiguous` also asks for the strides of
/// those dims, so a permuted view that only moved them, or a view whose dims of more than one
/// element lie in order in memory (a side-by-side weight permuted back, `stack::side_by_side`),
/// would be copied by its reshape.
#[cfg(feature = "flex")]
fn big_dims_row_major(shape: &[usize], strides: &[isize]) -> bool {
    let mut expect = 1isize;
    for (&d, &s) in shape.iter().zip(strides).rev() {
        if d == 1 {
            continue;
        }
        if s != expect {
            return false;
        }
        expect *= d as isize;
    }
    true
}

/// `shape` with its first `n` dims merged into one, for an op along dim `n` of a stacked
/// primitive (a reduction); `None` when `n < 2` (nothing to merge). Only the leading dims merge:
/// the reduced dim and those after it keep their sizes and, for a row-major primitive, their
/// strides, so a backend that picks its summation order from the strides (`ndarray`'s
/// `sum_axis` sums lanes when the reduced axis has the smallest stride, subviews in order
/// otherwise) sums every output element in the same order, and the result is bitwise the
/// unmerged op's. On NdArray a stacked `[2, 1, 2, 32, 24]` reduced along dim 3 is then a rank-3
/// `[4, 32, 24]` one: above rank 4 every subview of `ndarray`'s dynamic-rank loop allocated its
/// index, and the stacked reductions of the spatial IMDB step cost 2.9x the single device's
/// (NOTES.md, session 35).
pub fn merge_leading(shape: &[usize], n: usize) -> Option<Vec<usize>> {
    (n >= 2 && n < shape.len()).then(|| {
        let mut merged = Vec::with_capacity(shape.len() - n + 1);
        merged.push(shape[..n].iter().product());
        merged.extend_from_slice(&shape[n..]);
        merged
    })
}

/// Primitive `t` of shape `[d_0, .., d_{r-1}]` as `[d_0 * .. * d_{n-1}, d_n, .., d_{r-1}]`, a view
/// of its storage (the shape [`merge_leading`] gives): an NdArray array whose
/// leading `n` dims merge by their strides (row-major among themselves, whatever the strides
/// of the dims after them: a permuted or broadcast shard dim does not stop it), or a
/// contiguous Flex tensor. `None` for `n < 2`, for other backends and for leading dims that do
/// not merge without a copy (the caller runs on `t` as it is then: merging is only for speed).
///
/// The dims from `n` on keep their sizes and strides and the merged dim the stride of the
/// fastest of the dims it replaces, so the summation order `ndarray` picks from the strides
/// (see [`merge_leading`]) and so every value are those of the op on `t`. A
/// stacked reduction on NdArray is then of rank `r - n + 1`: above rank 4 `ndarray`'s
/// dynamic-rank loops allocate per subview (NOTES.md, session 35).
pub fn merge_leading_view<P: burn::tensor::TensorMetadata + 'static>(t: &P, n: usize) -> Option<P> {
    let merged = with_dims(t, |d| merge_leading(d, n))?;
    #[cfg(feature = "ndarray")]
    if let Some(v) = ndarray_view!(any layout t, |a| {
        let mut a = a;
        let into = ndarray::Axis(n - 1);
        let merges = (0..n - 1).rev().all(|take| a.merge_axes(ndarray::Axis(take), into));
        merges.then(|| {
            for _ in 0..n - 1 {
                a.index_axis_inplace(ndarray::Axis(0), 0);
            }
            a
        })
    }) {
        return Some(v);
    }
    #[cfg(feature = "flex")]
    if let Some(f) = (t as &dyn std::any::Any).downcast_ref::<burn_flex::FlexTensor>() {
        let shape = burn::tensor::Shape::from(merged);
        let view = f.layout().reshape(shape.clone()).map(|_| f.reshape(shape));
        return view.and_then(as_primitive);
    }
    let _ = merged;
    None
}

/// The sum (`mean`: the mean) of primitive `t` along `dim`, kept as size 1, by `ndarray`'s own
/// `sum_axis` / `mean_axis` on a fixed-rank view: an NdArray float array of rank 3 to 6, any
/// strides. NdArray's `float_sum_dim` runs the same function on a dynamic-rank (`IxDyn`) array,
/// which allocates an index per subview and per lane: with the stacked operands' mesh dims in
/// front, NdArray's sums were 12% of the spatial IMDB step (NOTES.md, session 36). The
/// algorithm, the axis it picks from the strides (the generic `min_stride_axis`, which `IxDyn`
/// and ranks 3-6 share) and so every sum are the same: bitwise the backend's op. `None` for
/// other backends, dtypes and ranks (the caller runs the backend's op then).
pub fn sum_dim_fixed_rank<P: 'static>(t: &P, dim: usize, mean: bool) -> Option<P> {
    #[cfg(feature = "ndarray")]
    {
        macro_rules! fixed {
            ($a:expr, $($r:literal => $ix:ty),*) => {
                match $a.ndim() {
                    $($r => {
                        let v = $a.view().into_dimensionality::<$ix>().ok()?;
                        let axis = ndarray::Axis(dim);
                        let out = if mean { v.mean_axis(axis)? } else { v.sum_axis(axis) };
                        Some(out.insert_axis(axis).into_dyn().into_shared())
                    })*
                    _ => None,
                }
            };
        }
        return ndarray_view!(@each t, false, |a| {
            fixed!(a, 3 => ndarray::Ix3, 4 => ndarray::Ix4, 5 => ndarray::Ix5, 6 => ndarray::Ix6)
        }; F64, F32);
    }
    #[allow(unreachable_code)]
    {
        let _ = (t, dim, mean);
        None
    }
}

/// Rows `rows` of dim 0 of primitive `t` as a view sharing its storage, where the backend's
/// slice would copy them: an NdArray array in row-major (standard) layout, owned (NdArray's
/// `slice` copies every slice into a new array). The view is row-major too, so it is read in
/// place by [`host_bytes`] and runs NdArray's contiguous fast paths; it keeps the whole storage
/// alive while it lives, so callers take it only for short-lived pieces of one buffer (the
/// blocks of a received message: the ordered reduction across processes spent 15% of a 4 MB
/// all-reduce copying them, session 28). `None` for every other backend and layout: the caller
/// slices with the backend then.
pub fn rows_view<P: 'static>(t: &P, rows: std::ops::Range<usize>) -> Option<P> {
    #[cfg(feature = "ndarray")]
    {
        return ndarray_view!(t, |a| {
            let mut a = a;
            (a.ndim() > 0 && rows.start <= rows.end && rows.end <= a.shape()[0]).then(|| {
                a.slice_axis_inplace(ndarray::Axis(0), ndarray::Slice::from(rows.clone()));
                a
            })
        });
    }
    #[allow(unreachable_code)]
    {
        let _ = (t, rows);
        None
    }
}

/// The values of primitive `t` for [`crate::tensor::Kind::into_data`] where the backend's own
/// download would walk them element by element: an NdArray array in row-major layout whose
/// storage another handle shares (a clone autodiff keeps, a [`reshape_view`] of it) or that
/// borrows its bytes (NdArray counts those as not unique too). NdArray
/// moves a unique array's buffer out whole but collects a shared one through its iterator (58 ms
/// for 8 MB, NOTES.md); this is one copy of the slice. `None` otherwise (the backend's download
/// is as good or better).
pub fn shared_host_data<P: 'static>(t: &P) -> Option<burn::tensor::TensorData> {
    #[cfg(feature = "ndarray")]
    {
        use burn_ndarray::NdArrayTensor as T;
        let t = (t as &dyn std::any::Any).downcast_ref::<T>()?;
        macro_rules! copy {
            ($($v:ident),*) => {
                match t {
                    $(T::$v(s) => {
                        if s.is_unique() {
                            return None;
                        }
                        let v = s.view();
                        let shape = v.shape().to_vec();
                        burn::tensor::TensorData::new(v.to_slice()?.to_vec(), shape)
                    })*
                }
            };
        }
        return Some(copy!(F64, F32, I64, I32, I16, I8, U64, U32, U16, U8, Bool));
    }
    #[allow(unreachable_code)]
    {
        let _ = t;
        None
    }
}

/// NdArray's product of two float shards (`[.., m, k] @ [.., k, n]`, batch dims equal or 1,
/// f32 or f64, any strides), computed as NdArray's `float_matmul` computes it (ndarray's
/// `general_mat_mul`, i.e. `matrixmultiply`'s GEMM, into a zeroed row-major output) but on the
/// operands as they lie. NdArray's matmul reshapes both operands to rank 3 first, and its
/// reshape copies (even a contiguous array: [`reshape_copies`]); a transposed operand is walked
/// element by element; the output is copied once more by the reshape back. With two
/// `Linear(4096, 4096)` layers at batch 256 that is four 64 MiB weight copies a step, with their
/// fresh pages. The GEMM packs its operands into blocks whatever their strides, so every output
/// element is the same sequence of operations: bitwise NdArray's result (tested below).
/// Batched and broadcast products too (one GEMM per output matrix). On Flex, its batched
/// products below the pool's bar computed on the calling thread ([`flex_batched_serial`]).
/// `None` for any other backend or dtype and for shapes the backend would reject: the caller
/// uses the backend's matmul.
pub fn matmul_strided<P: 'static>(lhs: &P, rhs: &P) -> Option<P> {
    #[cfg(feature = "ndarray")]
    {
        use burn_ndarray::NdArrayTensor as T;
        if let (Some(a), Some(b)) = (
            (lhs as &dyn std::any::Any).downcast_ref::<T>(),
            (rhs as &dyn std::any::Any).downcast_ref::<T>(),
        ) {
            let out: T = match (a, b) {
                (T::F32(a), T::F32(b)) => gemm(a.view(), b.view(), (1.0, 0.0))?.into(),
                (T::F64(a), T::F64(b)) => gemm(a.view(), b.view(), (1.0, 0.0))?.into(),
                _ => return None,
            };
            return as_primitive(out);
        }
    }
    #[cfg(feature = "flex")]
    if let (Some(a), Some(b)) = (
        (lhs as &dyn std::any::Any).downcast_ref::<burn_flex::FlexTensor>(),
        (rhs as &dyn std::any::Any).downcast_ref::<burn_flex::FlexTensor>(),
    ) {
        return as_primitive(flex_batched_serial(a, b)?);
    }
    #[allow(unreachable_code)]
    {
        let _ = (lhs, rhs);
        None
    }
}

/// The shape of a product `[.., m, k] @ [.., k, n]` of operands of shapes `a` and `b`: the
/// output's batch dims (each pair equal or one of them 1, a broadcast) and `(m, k, n)`. `None`
/// unless both have the same rank, at least 2, and the inner dims match: the shapes both
/// backends' products here accept (NdArray's and Flex's, [`matmul_strided`]).
#[cfg(any(feature = "ndarray", feature = "flex"))]
fn product_dims(a: &[usize], b: &[usize]) -> Option<(Vec<usize>, (usize, usize, usize))> {
    let r = a.len();
    if r < 2 || b.len() != r || a[r - 1] != b[r - 2] {
        return None;
    }
    let mut batch = Vec::with_capacity(r - 2);
    for (&x, &y) in a[..r - 2].iter().zip(&b[..r - 2]) {
        if x != y && x != 1 && y != 1 {
            return None;
        }
        batch.push(x.max(y));
    }
    Some((batch, (a[r - 2], a[r - 1], b[r - 1])))
}

/// Flex's batched product (`[.., m, k] @ [.., k, n]`, rank 2 or more, batch dims equal or 1, f32
/// or f64, any strides) with its matrices computed one after the other on the calling thread.
/// Flex (with its `rayon` feature, which `burn-train` turns on) spreads the matrices of a batch
/// over rayon's pool once the whole product reaches 128^3 multiply-adds, each matrix one
/// `gemm::gemm` call without threads: the 8-device IMDB step's stacked `[8, 64, 1200] @
/// [8, 1200, 6]` pays the pool's round trip for 0.5 ms of work (NOTES.md, "The single-process
/// step", parts 10 and 11). Here each matrix is that same `gemm::gemm` call, with Flex's
/// arguments (`alpha` 0, `beta` 1, strides as the operands lie, `Parallelism::None`), into a
/// row-major output that is written, never read (`read_dst` false, as Flex passes it; not
/// zeroed first: the memset was ~1% of the spatial step): bitwise Flex's result (tested
/// below). One matrix too (rank 2, or a batch of one: the side-by-side product of
/// `stack::side_by_side`): Flex's matmul makes its output with `FlexTensor::empty`, which
/// zeroes a byte buffer and copies it into an aligned one, 2 x 230 KB for the model step's
/// `[1200, 64] @ [64, 48]` weight gradient. `None`, and Flex's own matmul, for an empty dim,
/// other dtypes, shapes Flex would reject, a matrix of 192^3 multiply-adds or more (Flex then
/// threads the GEMM itself) and a product whose multiply-adds / [`MATMUL_WORK_PER_ELEMENT`]
/// reach [`par_min`], the decorator's own bar for the pool.
#[cfg(feature = "flex")]
fn flex_batched_serial(
    a: &burn_flex::FlexTensor,
    b: &burn_flex::FlexTensor,
) -> Option<burn_flex::FlexTensor> {
    use burn::tensor::DType;
    let r = a.layout().shape().len();
    let (batch, (m, k, n)) = product_dims(a.layout().shape(), b.layout().shape())?;
    if a.dtype() != b.dtype() || m == 0 || k == 0 || n == 0 {
        return None;
    }
    let matrices: usize = batch.iter().product();
    let per_matrix = m.checked_mul(n)?.checked_mul(k)?;
    // Flex's `PARALLEL_THRESHOLD`: a matrix this large is threaded inside the GEMM.
    if per_matrix >= 192 * 192 * 192
        || per_matrix.saturating_mul(matrices) / MATMUL_WORK_PER_ELEMENT >= par_min()
    {
        return None;
    }
    // Element offset of matrix `i` (row-major over the output's batch dims) in an operand, a
    // broadcast dim (length 1) contributing nothing.
    let offset = |t: &burn_flex::FlexTensor, mut i: usize| -> isize {
        let (shape, strides) = (t.layout().shape(), t.layout().strides());
        let mut at = t.layout().start_offset() as isize;
        for d in (0..r - 2).rev() {
            let index = i % batch[d];
            i /= batch[d];
            if shape[d] != 1 {
                at += index as isize * strides[d];
            }
        }
        at
    };
    // `(zero, one)`: the GEMM's `alpha` and `beta`, as Flex passes them.
    // The output is a `Vec` handed to Flex as is (`Bytes::from_elems`): `FlexTensor::empty`
    // zeroes a byte buffer and copies it into an aligned one (`Bytes::from_bytes_vec`).
    fn run<T: burn::tensor::Element + bytemuck::Pod>(
        a: &burn_flex::FlexTensor,
        b: &burn_flex::FlexTensor,
        (matrices, m, k, n): (usize, usize, usize, usize),
        offset: &dyn Fn(&burn_flex::FlexTensor, usize) -> isize,
        (zero, one): (T, T),
    ) -> Vec<T> {
        let (a_s, b_s) = (a.layout().strides(), b.layout().strides());
        let r = a_s.len();
        let (x, y): (&[T], &[T]) = (a.storage(), b.storage());
        let len = matrices * m * n;
        let mut out: Vec<T> = Vec::with_capacity(len);
        for i in 0..matrices {
            // SAFETY: the offsets and strides are the operands' own layout, so every element
            // the GEMM reads lies in their storage; matrix `i`'s `m * n` row-major outputs lie
            // inside `out`'s capacity.
            unsafe {
                gemm::gemm(
                    m,
                    n,
                    k,
                    out.as_mut_ptr().add(i * m * n),
                    1,
                    n as isize,
                    false,
                    x.as_ptr().offset(offset(a, i)),
                    a_s[r - 1],
                    a_s[r - 2],
                    y.as_ptr().offset(offset(b, i)),
                    b_s[r - 1],
                    b_s[r - 2],
                    zero,
                    one,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                );
            }
        }
        // SAFETY: with `read_dst` false (`gemm-common` then zeroes `alpha` and no kernel reads
        // the destination) and `k > 0`, each GEMM wrote all `m * n` outputs of its matrix, so
        // the first `len` elements are initialised.
        unsafe { out.set_len(len) };
        out
    }
    let dims = (matrices, m, k, n);
    let bytes = match a.dtype() {
        DType::F32 => burn::tensor::Bytes::from_elems(run::<f32>(a, b, dims, &offset, (0.0, 1.0))),
        DType::F64 => burn::tensor::Bytes::from_elems(run::<f64>(a, b, dims, &offset, (0.0, 1.0))),
        _ => return None,
    };
    let mut shape = batch;
    shape.extend([m, n]);
    let layout = burn_flex::Layout::contiguous(burn::tensor::Shape::from(shape));
    Some(burn_flex::FlexTensor::new(bytes, layout, a.dtype()))
}

/// [`matmul_strided`]'s product on ndarray views: `None` unless both have the same rank (at
/// least 2), matching inner dims and batch dims that are equal or 1 (broadcast). The output's
/// matrices are computed one after the other on the calling thread (the GEMM threads a large
/// one itself): NdArray's matmul spreads them over Rayon's pool, and doing so here made the
/// 8-device IMDB step slower (model mode 0.73 -> 1.03 ms; serial 0.65 ms), the decorator
/// already running the shards of small ops on the pool or the calling thread by their size.
/// `(one, zero)`: the GEMM's `alpha` and `beta`, as NdArray passes them.
#[cfg(feature = "ndarray")]
fn gemm<E: ndarray::LinalgScalar>(
    a: ndarray::ArrayView<'_, E, ndarray::IxDyn>,
    b: ndarray::ArrayView<'_, E, ndarray::IxDyn>,
    (one, zero): (E, E),
) -> Option<ndarray::ArcArray<E, ndarray::IxDyn>> {
    use ndarray::{ArrayView2, ArrayViewMut2, Axis, Ix2};
    let (mut batch, (m, _, n)) = product_dims(a.shape(), b.shape())?;
    // Matrix `i` (row-major over the output's batch dims) of an operand, a broadcast dim
    // giving its only matrix.
    fn matrix<'a, E>(
        mut v: ndarray::ArrayView<'a, E, ndarray::IxDyn>,
        batch: &[usize],
        mut i: usize,
    ) -> ArrayView2<'a, E> {
        let mut index = vec![0; batch.len()];
        for d in (0..batch.len()).rev() {
            index[d] = i % batch[d];
            i /= batch[d];
        }
        for at in index {
            let at = if v.shape()[0] == 1 { 0 } else { at };
            v = v.index_axis_move(Axis(0), at);
        }
        v.into_dimensionality::<Ix2>().expect("rank 2 left")
    }
    let matrices: usize = batch.iter().product();
    let mut out = vec![zero; matrices * m * n];
    let one_matrix = |(i, c): (usize, &mut [E])| {
        let mut c = ArrayViewMut2::from_shape((m, n), c).expect("m * n elements");
        let (x, y) = (matrix(a.view(), &batch, i), matrix(b.view(), &batch, i));
        ndarray::linalg::general_mat_mul(one, &x, &y, zero, &mut c);
    };
    if m * n > 0 {
        out.chunks_mut(m * n).enumerate().for_each(one_matrix);
    }
    batch.extend([m, n]);
    ndarray::ArcArray::from_shape_vec(ndarray::IxDyn(&batch), out).ok()
}

#[cfg(test)]
mod tests {
    use burn::backend::{Flex, NdArray};

    #[test]
    fn leading_dims_merge_before_a_reduced_dim() {
        // A [32, 24] shard on a (2, 1, 2) stack, reduced along its dim 0 (stacked dim 3).
        assert_eq!(
            super::merge_leading(&[2, 1, 2, 32, 24], 3),
            Some(vec![4, 32, 24])
        );
        // Along the last dim: every dim before it merges, the reduced dim stays last.
        assert_eq!(
            super::merge_leading(&[2, 1, 2, 32, 24], 4),
            Some(vec![128, 24])
        );
        // One leading dim or none: nothing to merge; a dim past the rank is not an op's.
        assert_eq!(super::merge_leading(&[8, 32, 24], 1), None);
        assert_eq!(super::merge_leading(&[8, 32, 24], 0), None);
        assert_eq!(super::merge_leading(&[8, 32], 2), None);
    }

    /// [`super::merge_leading_view`] on NdArray and Flex against the unmerged tensor: for views
    /// of a rank-5 tensor (row-major, its last two dims swapped, a broadcast dim, its first and
    /// third dims swapped) and every count of leading dims that merge, the view holds the same
    /// values in the same order, and `sum_dim` along each dim after the merged ones gives
    /// bitwise the sums of `sum_dim` on the unmerged tensor (the values and the lengths, 9 and
    /// 10 against `ndarray`'s eightfold unrolled sum of a contiguous lane, are chosen so that
    /// another summation order rounds differently). Which views merge is checked too: NdArray
    /// merges leading dims whose strides allow it whatever the strides after them, Flex only
    /// contiguous tensors. Returns how many views merged.
    #[cfg(all(feature = "ndarray", feature = "flex"))]
    fn merged_views_sum_as_the_unmerged<B: burn::tensor::backend::Backend>(flex: bool) -> usize {
        use burn::tensor::{Tensor, TensorData, TensorMetadata, TensorPrimitive};
        let device = Default::default();
        let shape = [2usize, 1, 3, 9, 10];
        let values: Vec<f32> = (0..540)
            .map(|i| (i as f32 * 0.37).sin() * 1e3 + 0.1)
            .collect();
        let t = Tensor::<B, 1>::from_floats(values.as_slice(), &device).reshape(shape);
        let bcast = t
            .clone()
            .slice([0..2, 0..1, 0..3, 0..1, 0..10])
            .expand(shape);
        // (name, view, the most leading dims NdArray merges, whether Flex merges)
        let views = [
            ("row-major", t.clone(), 4, true),
            ("shard dims swapped", t.clone().swap_dims(3, 4), 3, false),
            // (NdArray's `expand` materialises the broadcast: row-major.)
            ("broadcast dim 3", bcast, 4, false),
            ("leading dims swapped", t.clone().swap_dims(0, 2), 2, false),
        ];
        let read = |p, shape: Vec<usize>| {
            Tensor::<B, 5>::from_primitive(TensorPrimitive::Float(B::float_reshape(
                p,
                shape.into(),
            )))
            .into_data()
        };
        let mut merged = 0;
        for (name, v, nd_max, merges_flex) in views {
            let vs: Vec<usize> = v.dims().to_vec();
            for n in 2..5 {
                let merges = if flex { merges_flex } else { n <= nd_max };
                let p = v.clone().into_primitive().tensor();
                let Some(m) = super::merge_leading_view(&p, n) else {
                    assert!(!merges, "{name}, {n}: not merged");
                    continue;
                };
                assert!(merges, "{name}, {n}: merged");
                merged += 1;
                let want = super::merge_leading(&vs, n).expect("n >= 2");
                assert_eq!(m.shape().to_vec(), want, "{name}, {n}");
                assert_eq!(read(m, vs.clone()), v.clone().into_data(), "{name}, {n}");
                for d in n..5 {
                    let m = super::merge_leading_view(&p, n).expect("merged above");
                    let mut out = vs.clone();
                    out[d] = 1;
                    let got: TensorData = read(B::float_sum_dim(m, 1 + d - n), out);
                    let base: TensorData = v.clone().sum_dim(d).into_data();
                    let (g, b) = (
                        got.as_slice::<f32>().unwrap(),
                        base.as_slice::<f32>().unwrap(),
                    );
                    assert!(
                        g.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
                        "{name}, {n} leading dims merged, sum along {d}: {g:?} vs {b:?}"
                    );
                }
            }
        }
        merged
    }

    #[test]
    #[cfg(all(feature = "ndarray", feature = "flex"))]
    fn merged_leading_dims_sum_bitwise_as_unmerged() {
        assert_eq!(merged_views_sum_as_the_unmerged::<NdArray>(false), 9);
        assert_eq!(merged_views_sum_as_the_unmerged::<Flex>(true), 3);
    }

    /// NdArray's sums and means along every dim of rank 3-6 views (row-major, transposed,
    /// broadcast, permuted) at a fixed rank are bitwise the backend's own `float_sum_dim` /
    /// `float_mean_dim` (lengths 9 and 10 and these values round differently in another
    /// summation order); rank 2, other backends and int tensors are left to the backend.
    #[test]
    #[cfg(feature = "ndarray")]
    fn fixed_rank_sums_bitwise_as_the_backend() {
        use burn::tensor::backend::BackendTypes;
        use burn::tensor::ops::FloatTensorOps;
        use burn::tensor::{Int, Tensor, TensorData, TensorPrimitive};
        type B = NdArray;
        type P = <B as BackendTypes>::FloatTensorPrimitive;
        let device = Default::default();
        let values: Vec<f32> = (0..1080)
            .map(|i| (i as f32 * 0.37).sin() * 1e3 + 0.1)
            .collect();
        let flat = Tensor::<B, 1>::from_floats(values.as_slice(), &device);
        // The values' bits, read through a rank-1 reshape (the shapes are compared apart).
        let bits = |t: P| -> Vec<u32> {
            use burn::tensor::TensorMetadata;
            let n = t.shape().num_elements();
            let d: TensorData = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(
                B::float_reshape(t, [n].into()),
            ))
            .into_data();
            d.as_slice::<f32>()
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect()
        };
        let mut checked = 0;
        let mut check = |p: P, name: &str| {
            use burn::tensor::TensorMetadata;
            let rank = p.shape().num_dims();
            for d in 0..rank {
                for mean in [false, true] {
                    let got = super::sum_dim_fixed_rank(&p, d, mean).expect("rank 3-6 f32");
                    let want = if mean {
                        B::float_mean_dim(p.clone(), d)
                    } else {
                        B::float_sum_dim(p.clone(), d)
                    };
                    assert_eq!(got.shape(), want.shape(), "{name}, dim {d}");
                    assert_eq!(bits(got), bits(want), "{name}, dim {d}, mean {mean}");
                    checked += 1;
                }
            }
        };
        let t3 = flat.clone().reshape([12, 9, 10]);
        check(t3.clone().into_primitive().tensor(), "rank 3 row-major");
        check(
            t3.clone().swap_dims(1, 2).into_primitive().tensor(),
            "rank 3 transposed",
        );
        let t4 = flat.clone().reshape([2, 6, 9, 10]);
        check(
            t4.clone().permute([2, 0, 3, 1]).into_primitive().tensor(),
            "rank 4 permuted",
        );
        let b5 = flat
            .clone()
            .reshape([2, 6, 9, 10])
            .slice([0..2, 0..1, 0..9, 0..10]);
        check(
            b5.reshape([2, 1, 1, 9, 10])
                .expand([2, 3, 2, 9, 10])
                .into_primitive()
                .tensor(),
            "rank 5 broadcast",
        );
        check(
            flat.clone()
                .reshape([2, 3, 2, 1, 9, 10])
                .into_primitive()
                .tensor(),
            "rank 6",
        );
        assert_eq!(checked, 2 * (3 + 3 + 4 + 5 + 6));
        let t2 = flat.clone().reshape([108, 10]).into_primitive().tensor();
        assert!(super::sum_dim_fixed_rank(&t2, 0, false).is_none(), "rank 2");
        let f = Tensor::<Flex, 3>::zeros([2, 3, 4], &Default::default())
            .into_primitive()
            .tensor();
        assert!(super::sum_dim_fixed_rank(&f, 0, false).is_none(), "Flex");
        let i = Tensor::<B, 3, Int>::zeros([2, 3, 4], &device).into_primitive();
        assert!(super::sum_dim_fixed_rank(&i, 0, false).is_none(), "int");
    }

    /// Every permutation of a rank-4 Flex tensor, whole and sliced (an offset and gaps), copied
    /// by [`super::dense_copy`] against Flex's own row-major read of the same view; the views
    /// that merge to two dims or fewer are left to Flex.
    #[test]
    #[cfg(feature = "flex")]
    fn dense_copies_of_flex_views_equal_flex_reads() {
        use burn::tensor::{Int, Tensor, TensorData};
        let shape = [2usize, 3, 4, 5];
        let t = Tensor::<Flex, 1, Int>::arange(0..120, &Default::default())
            .float()
            .reshape(shape);
        let mut copied = 0;
        for order in crate::host::tests::permutations4() {
            for sliced in [false, true] {
                let mut v = t.clone().permute(order.map(|o| o as isize));
                if sliced {
                    v = v.slice([0..2, 1..3, 1..3, 0..2]);
                }
                let p = v.clone().into_primitive().tensor();
                let want: TensorData = v.into_data();
                match super::dense_copy(&p) {
                    Some(got) => {
                        assert_eq!(got, want, "order {order:?}, sliced {sliced}");
                        copied += 1;
                    }
                    None => {
                        let l = p.layout();
                        let st: Vec<usize> = l.strides().iter().map(|&s| s as usize).collect();
                        assert!(
                            p.is_contiguous()
                                || crate::host::collapse_strided(l.shape(), &st).0.len() <= 2,
                            "order {order:?}, sliced {sliced}: a view of 3+ dims not copied"
                        );
                    }
                }
            }
        }
        assert!(copied >= 20, "only {copied} views copied");
    }

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
    #[cfg(all(feature = "ndarray", feature = "flex"))]
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

    /// Writable in place only where the primitive owns its bytes alone: the bytes are
    /// [`super::host_bytes`]'s, a write through them is the tensor's new value, and a clone (or
    /// a transposed view) gives `None`.
    #[test]
    #[cfg(all(feature = "ndarray", feature = "flex"))]
    fn host_bytes_mut_only_for_unshared_row_major_host_tensors() {
        use burn::tensor::{Tensor, TensorData, TensorPrimitive};
        fn prim<B: burn::tensor::backend::Backend>(t: Tensor<B, 2>) -> B::FloatTensorPrimitive {
            match t.into_primitive() {
                TensorPrimitive::Float(p) => p,
                TensorPrimitive::QFloat(_) => unreachable!(),
            }
        }
        fn check<B: burn::tensor::backend::Backend>() {
            let d = Default::default();
            let t = Tensor::<B, 2>::from_data([[1.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]], &d);
            let mut p = prim(t.clone() * 1.0);
            let want = super::host_bytes(&p).map(|b| b.to_vec());
            let bytes = super::host_bytes_mut(&mut p).expect("unique row-major");
            assert_eq!(Some(bytes.to_vec()), want);
            bytes[..4].copy_from_slice(&10.0f32.to_ne_bytes());
            let back = Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(p)).into_data();
            back.assert_eq(
                &TensorData::from([[10.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]]),
                true,
            );
            // Shared with a clone: not writable (the clone would see the write).
            let mut shared = prim(t.clone() * 1.0);
            let keep = shared.clone();
            assert!(super::host_bytes_mut(&mut shared).is_none());
            drop(keep);
            // A transposed view.
            let mut tp = prim((t * 1.0).transpose());
            assert!(super::host_bytes_mut(&mut tp).is_none());
        }
        check::<NdArray>();
        check::<Flex>();
        assert!(super::host_bytes_mut(&mut 0u32).is_none());
    }

    /// A reshape view holds the backend's reshape's values in the input's storage (no copy),
    /// for float, int and bool arrays and for a row-major slice; a transposed view and another
    /// backend get `None`. A shared row-major array downloads as a copy of its values.
    #[test]
    #[cfg(feature = "ndarray")]
    fn reshape_views_share_storage_and_hold_the_reshaped_values() {
        use burn::tensor::ops::{FloatTensorOps, IntTensorOps};
        use burn::tensor::{Int, Tensor, TensorPrimitive};
        type N = burn_ndarray::NdArrayTensor;
        let d = Default::default();
        let t = Tensor::<NdArray, 2>::from_data([[1.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]], &d);
        let p = match (t.clone() * 1.0).into_primitive() {
            TensorPrimitive::Float(p) => p,
            TensorPrimitive::QFloat(_) => unreachable!(),
        };
        let view: N = super::reshape_view(&p, [3, 2].into()).expect("row-major");
        assert_eq!(
            super::host_bytes(&view).map(<[u8]>::as_ptr),
            super::host_bytes(&p).map(<[u8]>::as_ptr),
            "a view of the same storage"
        );
        // The oracle: NdArray's own reshape (a copy).
        let want = t.clone().reshape([3, 2]).into_data();
        let got = super::shared_host_data(&view).expect("shared with `p`");
        got.assert_eq(&want, true);
        // A row-major slice (rows 1..2) reshapes as a view too.
        let row = <NdArray as FloatTensorOps<NdArray>>::float_slice(
            p.clone(),
            &[burn::tensor::Slice::from(1..2)],
        );
        let flat: N = super::reshape_view(&row, [3].into()).expect("contiguous rows");
        let flat = Tensor::<NdArray, 1>::from_primitive(TensorPrimitive::Float(flat));
        flat.into_data().assert_eq(&[4.0f32, 5.0, 6.0].into(), true);
        // Int and bool.
        let it = Tensor::<NdArray, 2, Int>::from_data([[1, 2], [3, 4]], &d);
        let i = it.clone().into_primitive();
        let iv: N = super::reshape_view(&i, [4].into()).expect("row-major ints");
        let iv = <NdArray as IntTensorOps<NdArray>>::int_into_data(iv);
        assert_eq!(
            burn::tensor::read_sync(iv)
                .unwrap()
                .to_vec::<i64>()
                .unwrap()
                .len(),
            4
        );
        let b = it.equal_elem(2).reshape([1, 4]).into_primitive();
        assert!(super::reshape_view(&b, [2, 2].into()).is_ok());
        // Not for a transposed view, a wrong element count or another backend.
        let tp = <NdArray as FloatTensorOps<NdArray>>::float_swap_dims(p.clone(), 0, 1);
        assert!(super::reshape_view(&tp, [6].into()).is_err());
        assert!(super::reshape_view(&p, [4].into()).is_err());
        assert!(super::reshape_view(&0u32, [1].into()).is_err());
        // A unique array is downloaded by the backend (its buffer moved out).
        drop((view, row, tp));
        assert!(super::shared_host_data(&p).is_none());
    }

    /// NdArray's GEMM on the operands as they lie gives bitwise NdArray's `float_matmul` (which
    /// copies both to row-major first): row-major and transposed operands, rank 2 and rank 3
    /// with a leading 1, shapes past the GEMM's blocking (`k` over 256, edge tiles), f32 and
    /// f64, batched and broadcast; `None` for incompatible shapes and another backend.
    #[test]
    #[cfg(feature = "ndarray")]
    fn strided_matmul_is_bitwise_ndarrays() {
        use burn::tensor::ops::FloatTensorOps;
        use burn::tensor::{Distribution, Tensor, TensorPrimitive};
        fn prim<const D: usize>(t: Tensor<NdArray, D>) -> burn_ndarray::NdArrayTensor {
            match t.into_primitive() {
                TensorPrimitive::Float(p) => p,
                TensorPrimitive::QFloat(_) => unreachable!(),
            }
        }
        fn operand(
            rows: usize,
            cols: usize,
            transposed: bool,
            dtype: burn::tensor::DType,
        ) -> Tensor<NdArray, 2> {
            let d = Default::default();
            let (r, c) = if transposed {
                (cols, rows)
            } else {
                (rows, cols)
            };
            let t = Tensor::<NdArray, 2>::random([r, c], Distribution::Normal(0.0, 1.0), &d)
                .cast(dtype);
            if transposed { t.transpose() } else { t }
        }
        let mut checked = 0;
        for dtype in [burn::tensor::DType::F32, burn::tensor::DType::F64] {
            for (m, k, n) in [
                (1, 1, 1),
                (3, 5, 7),
                (17, 300, 9),
                (64, 513, 33),
                (130, 64, 1),
            ] {
                for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                    let (a, b) = (operand(m, k, ta, dtype), operand(k, n, tb, dtype));
                    let want = <NdArray as FloatTensorOps<NdArray>>::float_matmul(
                        prim(a.clone()),
                        prim(b.clone()),
                    );
                    let got = super::matmul_strided(&prim(a.clone()), &prim(b.clone()))
                        .expect("one matrix each");
                    let as_data = |p| {
                        Tensor::<NdArray, 2>::from_primitive(TensorPrimitive::Float(p)).into_data()
                    };
                    assert_eq!(
                        as_data(got),
                        as_data(want),
                        "{dtype:?} {m}x{k}x{n} {ta} {tb}"
                    );
                    // Rank 3 with a leading 1.
                    let (a3, b3) = (a.unsqueeze::<3>(), b.unsqueeze::<3>());
                    let want = <NdArray as FloatTensorOps<NdArray>>::float_matmul(
                        prim(a3.clone()),
                        prim(b3.clone()),
                    );
                    let got = super::matmul_strided(&prim(a3), &prim(b3)).expect("leading 1");
                    let as_data = |p| {
                        Tensor::<NdArray, 3>::from_primitive(TensorPrimitive::Float(p)).into_data()
                    };
                    assert_eq!(as_data(got), as_data(want));
                    checked += 1;
                }
            }
        }
        assert_eq!(checked, 40);
        // Batched and broadcast (a stacked shard times a replicated weight), with a
        // transposed operand, and shapes NdArray rejects.
        let d = Default::default();
        let x = Tensor::<NdArray, 4>::random([2, 3, 17, 300], Distribution::Normal(0.0, 1.0), &d);
        let w = Tensor::<NdArray, 4>::random([1, 3, 9, 300], Distribution::Normal(0.0, 1.0), &d)
            .swap_dims(2, 3);
        let want =
            <NdArray as FloatTensorOps<NdArray>>::float_matmul(prim(x.clone()), prim(w.clone()));
        let got = super::matmul_strided(&prim(x.clone()), &prim(w)).expect("broadcast");
        let as_data =
            |p| Tensor::<NdArray, 4>::from_primitive(TensorPrimitive::Float(p)).into_data();
        assert_eq!(as_data(got), as_data(want));
        let bad = prim(Tensor::<NdArray, 4>::ones([3, 3, 300, 2], &d));
        assert!(super::matmul_strided(&prim(x), &bad).is_none());
        assert!(super::matmul_strided(&0u32, &1u32).is_none());
    }

    /// [`super::reshape_permute_copy`] against Flex's own reshape then permute, on row-major
    /// tensors and on transposed and sliced views (f32 and f64): the chunks of a local chunk
    /// (`[64, 48] -> [2, 32, 48]`, the split dim moved first) and of other splits.
    #[test]
    #[cfg(feature = "flex")]
    fn reshape_permute_copy_is_flexs_reshape_and_permute() {
        use burn::backend::Flex;
        use burn::tensor::{Tensor, TensorData, TensorPrimitive};
        let d = Default::default();
        let mut checked = 0;
        for dtype in [burn::tensor::DType::F32, burn::tensor::DType::F64] {
            let base = Tensor::<Flex, 1, burn::tensor::Int>::arange(0..48 * 64, &d)
                .float()
                .cast(dtype)
                .reshape([48, 64]);
            let views = [
                base.clone().swap_dims(0, 1),
                base.clone().slice([8..32, 0..64]).swap_dims(0, 1),
            ];
            for v in views {
                let [r, c] = v.dims();
                for (shape, order) in [
                    ([1, 2, r / 2, c], [0, 1, 2, 3]),
                    ([1, 2, r / 2, c], [0, 2, 1, 3]),
                    ([1, r, 2, c / 2], [0, 2, 1, 3]),
                    ([1, r, 4, c / 4], [2, 0, 1, 3]),
                ] {
                    let want = v.clone().reshape(shape).permute(order).into_data();
                    let p: burn_flex::FlexTensor = match v.clone().into_primitive() {
                        TensorPrimitive::Float(p) => p,
                        TensorPrimitive::QFloat(_) => unreachable!("float"),
                    };
                    let got: TensorData =
                        super::reshape_permute_copy(&p, &shape, &order).expect("a view");
                    assert_eq!(got, want, "{dtype:?} {:?} {shape:?} {order:?}", v.dims());
                    checked += 1;
                }
            }
            // A reshape that merges a transposed pair needs a copy, and a contiguous tensor
            // reshapes as a view: both left to the caller.
            let prim = |t: Tensor<Flex, 2>| match t.into_primitive() {
                TensorPrimitive::Float(p) => p,
                TensorPrimitive::QFloat(_) => unreachable!("float"),
            };
            let t = prim(base.clone().swap_dims(0, 1));
            assert!(super::reshape_permute_copy(&t, &[48 * 64], &[0]).is_none());
            let t = prim(base);
            assert!(super::reshape_permute_copy(&t, &[2, 24, 64], &[1, 0, 2]).is_none());
        }
        assert_eq!(checked, 16);
    }

    /// `with_dims` reads the dims a tensor reports (`TensorMetadata::shape`) on Flex (from its
    /// layout, in place) and on NdArray, for row-major tensors and for permuted views.
    #[test]
    #[cfg(all(feature = "flex", feature = "ndarray"))]
    fn dims_read_in_place_are_the_shape() {
        use burn::tensor::{Distribution, Tensor, TensorMetadata};
        fn check<B: burn::tensor::backend::Backend>(d: &B::Device)
        where
            B::FloatTensorPrimitive: 'static,
        {
            let t = Tensor::<B, 4>::random([2, 3, 1, 5], Distribution::Default, d);
            for p in [t.clone(), t.permute([3, 0, 2, 1])] {
                let p = p.into_primitive().tensor();
                let want = p.shape().to_vec();
                assert_eq!(super::with_dims(&p, |d| d.to_vec()), want);
            }
        }
        check::<Flex>(&Default::default());
        check::<NdArray>(&Default::default());
    }

    /// Flex: a view whose dims of more than one element lie row-major in memory (a weight's
    /// shards side by side, `[600, 2, 24]` viewed as `[1, 2, 600, 24]` and permuted back)
    /// reshapes as a view of the same bytes, with the values of Flex's own reshape of the
    /// row-major copy; a real permuted view, a wrong element count and a slice with a gap do not.
    #[test]
    #[cfg(feature = "flex")]
    fn flex_reshape_views_skip_unit_dims_strides() {
        use burn::backend::Flex;
        use burn::tensor::{Distribution, Tensor, TensorPrimitive};
        let d = Default::default();
        let buf = Tensor::<Flex, 4>::random([1, 600, 2, 24], Distribution::Default, &d);
        // The stack's order `[1, 2, 600, 24]`, then back to memory order: the big dims are
        // row-major, the unit dim's stride is not the one Flex's contiguity check asks for.
        let side = buf.clone().permute([0, 2, 1, 3]);
        let back: burn_flex::FlexTensor =
            side.clone().permute([2, 0, 1, 3]).into_primitive().tensor();
        assert!(
            !back.is_contiguous(),
            "the unit dim's stride is off: {:?}",
            back.layout()
        );
        let view = super::reshape_view(&back, [600, 48].into()).expect("big dims row-major");
        assert_eq!(
            super::host_bytes(&view).map(<[u8]>::as_ptr),
            super::host_bytes(&buf.clone().into_primitive().tensor()).map(<[u8]>::as_ptr),
            "a view of the same bytes"
        );
        let got = Tensor::<Flex, 2>::from_primitive(TensorPrimitive::Float(view)).into_data();
        got.assert_eq(&buf.clone().reshape([600, 48]).into_data(), true);
        // Not for the stack's own order (a real permutation), a wrong count, or a gap.
        let side: burn_flex::FlexTensor = side.into_primitive().tensor();
        assert!(super::reshape_view(&side, [2, 600 * 24].into()).is_err());
        let whole: burn_flex::FlexTensor = buf.clone().into_primitive().tensor();
        assert!(super::reshape_view(&whole, [600, 47].into()).is_err());
        let gap: burn_flex::FlexTensor = buf.narrow(3, 0, 12).into_primitive().tensor();
        assert!(super::reshape_view(&gap, [600, 24].into()).is_err());
    }

    /// [`super::matmul_strided`] on Flex against Flex's own `float_matmul`, bitwise: batched
    /// products (batches of 2 to 8 matrices, one of them large enough that Flex runs it on
    /// rayon's pool), f32 and f64, each operand row-major or with its last two dims swapped, a
    /// broadcast batch dim, a sliced (offset) operand, one matrix (a batch of one with a
    /// transposed lhs, and rank 2), and the products left to Flex (`None`: an empty dim,
    /// mismatched shapes, a matrix of 192^3 multiply-adds).
    #[test]
    #[cfg(feature = "flex")]
    fn flex_batched_matmul_is_bitwise_flexs() {
        use burn::backend::Flex;
        use burn::tensor::ops::FloatTensorOps;
        use burn::tensor::{Distribution, Tensor, TensorData, TensorPrimitive};
        fn prim<const D: usize>(t: Tensor<Flex, D>) -> burn_flex::FlexTensor {
            t.into_primitive().tensor()
        }
        fn data<const D: usize>(p: burn_flex::FlexTensor) -> TensorData {
            Tensor::<Flex, D>::from_primitive(TensorPrimitive::Float(p)).into_data()
        }
        let d = Default::default();
        let operand = |shape: [usize; 3], swapped: bool, dtype| {
            let [b, r, c] = shape;
            let t = if swapped {
                Tensor::<Flex, 3>::random([b, c, r], Distribution::Normal(0.0, 1.0), &d)
                    .swap_dims(1, 2)
            } else {
                Tensor::<Flex, 3>::random([b, r, c], Distribution::Normal(0.0, 1.0), &d)
            };
            t.cast(dtype)
        };
        let mut checked = 0;
        for dtype in [burn::tensor::DType::F32, burn::tensor::DType::F64] {
            // The last: 8 x 64 x 1200 x 6 multiply-adds, the IMDB model step's stacked product,
            // on Flex's pool.
            for (bs, m, k, n) in [(2, 3, 5, 7), (3, 17, 300, 9), (8, 64, 1200, 6)] {
                for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                    let (a, b) = (
                        operand([bs, m, k], ta, dtype),
                        operand([bs, k, n], tb, dtype),
                    );
                    let want = Flex::float_matmul(prim(a.clone()), prim(b.clone()));
                    let got = super::matmul_strided(&prim(a), &prim(b)).expect("batched");
                    assert_eq!(
                        data::<3>(got),
                        data::<3>(want),
                        "{dtype:?} {bs}x{m}x{k}x{n}"
                    );
                    checked += 1;
                }
            }
        }
        assert_eq!(checked, 24);
        // A rank-4 stack times a broadcast weight, the stack sliced (an offset into its storage).
        let x = Tensor::<Flex, 4>::random([2, 4, 17, 300], Distribution::Normal(0.0, 1.0), &d)
            .slice([0..2, 1..4, 0..17, 0..300]);
        let w = Tensor::<Flex, 4>::random([1, 3, 9, 300], Distribution::Normal(0.0, 1.0), &d)
            .swap_dims(2, 3);
        let want = Flex::float_matmul(prim(x.clone()), prim(w.clone()));
        let got = super::matmul_strided(&prim(x.clone()), &prim(w.clone())).expect("broadcast");
        assert_eq!(data::<4>(got), data::<4>(want));
        // Left to Flex.
        let bad = prim(Tensor::<Flex, 4>::ones([3, 3, 300, 2], &d));
        assert!(super::matmul_strided(&prim(x.clone()), &bad).is_none());
        let one = |shape: [usize; 3]| prim(Tensor::<Flex, 3>::ones(shape, &d));
        assert!(super::matmul_strided(&one([2, 0, 5]), &one([2, 5, 6])).is_none());
        assert!(super::matmul_strided(&one([2, 192, 192]), &one([2, 192, 192])).is_none());
        let two = |shape: [usize; 2]| prim(Tensor::<Flex, 2>::ones(shape, &d));
        assert!(super::matmul_strided(&two([192, 192]), &two([192, 192])).is_none());
        // One matrix (a batch of one, the side-by-side product of `stack::side_by_side`, and
        // rank 2), its lhs transposed as a weight gradient's `x^T`: Flex's own bits.
        let x = Tensor::<Flex, 3>::random([1, 64, 1200], Distribution::Normal(0.0, 1.0), &d);
        let g = Tensor::<Flex, 3>::random([1, 64, 48], Distribution::Normal(0.0, 1.0), &d);
        let xt = x.clone().swap_dims(1, 2);
        let want = Flex::float_matmul(prim(xt.clone()), prim(g.clone()));
        let got = super::matmul_strided(&prim(xt), &prim(g.clone())).expect("one matrix");
        assert_eq!(data::<3>(got), data::<3>(want));
        let (x2, w2) = (
            x.reshape([64, 1200]),
            Tensor::<Flex, 2>::random([1200, 48], Distribution::Normal(0.0, 1.0), &d),
        );
        let want = Flex::float_matmul(prim(x2.clone()), prim(w2.clone()));
        let got = super::matmul_strided(&prim(x2), &prim(w2)).expect("rank 2");
        assert_eq!(data::<2>(got), data::<2>(want));
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
