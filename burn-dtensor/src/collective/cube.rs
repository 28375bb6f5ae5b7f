//! Collectives as CubeCL kernels, for CubeCL inner backends (`burn-wgpu`, `burn-cuda`).
//!
//! When every shard of a group sits on one device (virtual devices on one GPU, or the software
//! Vulkan device in CI), the group's collective is **one kernel launch over the N shards**:
//!
//! - all-reduce and reduce-scatter: [`group_reduce_kernel`] reads the N shard buffers (a
//!   `Sequence` of arrays, unrolled at compile time) and writes the element-wise sum / max / min
//!   once; reduce-scatter then hands each member a view (a slice, no copy) of its chunk;
//! - all-gather: [`group_cat_kernel`] writes the concatenation along the gathered dim, each
//!   output element read from the shard that owns its column (uneven shards included);
//! - all-to-all: each device assembles its new shard from the N pieces with the same kernel.
//!
//! The generic path would do `N - 1` pairwise adds (each a launch and a fresh buffer) or a
//! `cat`. Outputs are allocated dense (`empty_device_contiguous_dtype`): CubeCL's default
//! allocation pads rows on CUDA (a `[5, 7]` f32 tensor gets row stride 8), which the kernels'
//! flat indexing would misread, as the first run on a GPU showed. Both kernels are vectorised (`Vector<T, N>` loads) with the widest vector size the
//! device offers that divides the row widths; sizes that are not multiples fall back to narrower
//! vectors, down to scalars. Inputs that are not contiguous are made contiguous first.
//!
//! The kernels are the in-process collective engine ([`CubeKernels`]) of meshes over
//! `WgpuDevice` or `CudaDevice`, chosen when the mesh is built
//! ([`super::engine::LocalEngines::for_device`]); each call still checks that the primitives are
//! `CubeTensor`s of that runtime: a fusion backend's primitives, a dtype the
//! kernels do not handle (quantized, native bool, flex32), empty tensors or shards on different
//! devices fall back to the generic path. [`kernel_launches`] counts the launches so tests can
//! check the path was taken.

use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use burn::tensor::{BoolStore, DType, Shape, TensorMetadata};
use burn_cubecl::CubeRuntime;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::calculate_cube_count_elemwise;
use cubecl::prelude::*;

use super::interface::LocalEngine;
use super::interface::ReduceOp;

static LAUNCHES: AtomicU64 = AtomicU64::new(0);
static ENABLED: AtomicBool = AtomicBool::new(true);

/// Switches the kernel path on (the default) or off, process-wide. Off, CubeCL backends use the
/// generic path (pairwise inner-backend adds and `cat`): benches compare the two this way.
pub fn set_kernels_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Number of collective kernel launches since the process started (all threads). Tests read it
/// before and after a collective to check that the one-launch path was taken.
pub fn kernel_launches() -> u64 {
    LAUNCHES.load(Ordering::Relaxed)
}

/// The element-wise combination of a reduction, chosen at kernel compile time.
#[derive(CubeType, Clone, Copy, Hash, PartialEq, Eq, Debug)]
pub(crate) enum Combine {
    /// `a + b`.
    Sum,
    /// `max(a, b)`.
    Max,
    /// `min(a, b)`.
    Min,
}

impl From<ReduceOp> for Combine {
    fn from(op: ReduceOp) -> Self {
        match op {
            ReduceOp::Sum => Combine::Sum,
            ReduceOp::Max => Combine::Max,
            ReduceOp::Min => Combine::Min,
        }
    }
}

/// `output[i] = inputs[0][i] ⊕ inputs[1][i] ⊕ ... ⊕ inputs[n-1][i]` over vectors of `N`
/// elements, left to right (the same order as a chain of pairwise adds). `n` is the sequence's
/// length, fixed when the kernel is compiled (one compiled kernel per group size).
#[cube(launch_unchecked)]
pub(crate) fn group_reduce_kernel<T: Numeric, N: Size>(
    inputs: &Sequence<Array<Vector<T, N>>>,
    output: &mut Array<Vector<T, N>>,
    #[comptime] op: Combine,
    #[define(T)] _dtype: StorageType,
) {
    let pos = ABSOLUTE_POS;
    if pos >= output.len() {
        terminate!();
    }
    let n = inputs.len().comptime();
    let mut acc = inputs[0][pos];
    #[unroll]
    for i in 1..n {
        let x = inputs[i][pos];
        match op {
            Combine::Sum => {
                acc += x;
            }
            Combine::Max => {
                acc = clamp_min(acc, x);
            }
            Combine::Min => {
                acc = clamp_max(acc, x);
            }
        }
    }
    output[pos] = acc;
}

/// Concatenation of the inputs along one dim, with the tensors viewed as `[rows, width]`
/// matrices (`rows` = product of the dims before the gathered one; an input's `width` = its
/// gathered dim times the dims after it, in vectors of `N`). Output element `(r, c)` comes from
/// the input whose column range holds `c`.
#[cube(launch_unchecked)]
pub(crate) fn group_cat_kernel<T: Numeric, N: Size>(
    inputs: &Sequence<Array<Vector<T, N>>>,
    output: &mut Array<Vector<T, N>>,
    widths: &Sequence<usize>,
    total_width: usize,
    #[define(T)] _dtype: StorageType,
) {
    let pos = ABSOLUTE_POS;
    if pos >= output.len() {
        terminate!();
    }
    let row = pos / total_width;
    let col = pos % total_width;
    let n = inputs.len().comptime();
    let mut start = 0usize;
    #[unroll]
    for i in 0..n {
        let w = widths[i];
        if col >= start && col < start + w {
            output[pos] = inputs[i][row * w + col - start];
        }
        start += w;
    }
}

/// Dtypes the kernels handle (plain numeric storage).
fn supported(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::F64
            | DType::F32
            | DType::F16
            | DType::BF16
            | DType::I64
            | DType::I32
            | DType::I16
            | DType::I8
            | DType::U64
            | DType::U32
            | DType::U16
            | DType::U8
            | DType::Bool(BoolStore::U8 | BoolStore::U32)
    )
}

/// Widest vector size the device offers for `dtype` that divides every one of `counts`.
fn vector_size<R: CubeRuntime>(t: &CubeTensor<R>, counts: &[usize]) -> usize {
    t.client
        .io_optimized_vector_sizes(t.dtype.size())
        .filter(|&v| counts.iter().all(|c| c % v == 0))
        .max()
        .unwrap_or(1)
}

/// The parts as `CubeTensor<R>`s, when `P` is `CubeTensor<R>`, all parts share a device and a
/// supported dtype, and none is empty.
fn as_cube<R: CubeRuntime>(parts: &[&dyn Any]) -> Option<Vec<CubeTensor<R>>> {
    if !ENABLED.load(Ordering::Relaxed) {
        return None;
    }
    let mut out = Vec::with_capacity(parts.len());
    for p in parts {
        let t = p.downcast_ref::<CubeTensor<R>>()?;
        if t.qparams.is_some() || !supported(t.dtype) || t.shape().num_elements() == 0 {
            return None;
        }
        if let Some(first) = out.first() {
            let first: &CubeTensor<R> = first;
            if first.device != t.device || first.dtype != t.dtype {
                return None;
            }
        }
        out.push(into_contiguous(t.clone()));
    }
    (!out.is_empty()).then_some(out)
}

/// The buffer of `t` as an array argument. Its length is given in elements; the kernel's
/// `len()` counts vectors of the launch's vector size.
fn array_arg<R: CubeRuntime>(t: &CubeTensor<R>) -> ArrayArg<R> {
    // SAFETY: `t` is contiguous (made so in `as_cube`, or freshly allocated) and holds
    // `num_elements` values of its dtype.
    unsafe { ArrayArg::from_raw_parts(t.handle.clone(), t.shape().num_elements()) }
}

fn launch_dims<R: CubeRuntime>(t: &CubeTensor<R>, units: usize) -> (CubeCount, CubeDim) {
    let cube_dim = CubeDim::new(&t.client, units);
    (
        calculate_cube_count_elemwise(&t.client, units, cube_dim),
        cube_dim,
    )
}

fn reduce_on<R: CubeRuntime>(parts: Vec<CubeTensor<R>>, op: ReduceOp) -> Option<CubeTensor<R>> {
    let shape = parts[0].shape();
    if parts.iter().any(|p| p.shape() != shape) {
        return None;
    }
    if parts.len() == 1 {
        return parts.into_iter().next();
    }
    let len = shape.num_elements();
    let first = &parts[0];
    let vector = vector_size(first, &[len]);
    let output = empty_device_contiguous_dtype(
        first.client.clone(),
        first.device.clone(),
        shape,
        first.dtype,
    );
    let mut inputs = SequenceArg::new();
    for p in &parts {
        inputs.push(array_arg(p));
    }
    let (count, dim) = launch_dims(first, len / vector);
    // SAFETY: every input and the output hold `len / vector` vectors; the kernel guards
    // `ABSOLUTE_POS < output.len()`.
    unsafe {
        group_reduce_kernel::launch_unchecked::<R>(
            &first.client,
            count,
            dim,
            vector,
            inputs,
            array_arg(&output),
            op.into(),
            first.dtype.into(),
        );
    }
    LAUNCHES.fetch_add(1, Ordering::Relaxed);
    Some(output)
}

fn cat_on<R: CubeRuntime>(parts: Vec<CubeTensor<R>>, dim: usize) -> Option<CubeTensor<R>> {
    let shape0 = parts[0].shape();
    let rank = shape0.num_dims();
    if dim >= rank
        || parts.iter().any(|p| {
            p.shape().num_dims() != rank || (0..rank).any(|d| d != dim && p.shape()[d] != shape0[d])
        })
    {
        return None;
    }
    if parts.len() == 1 {
        return parts.into_iter().next();
    }
    let rows: usize = shape0.iter().take(dim).product();
    let inner: usize = shape0.iter().skip(dim + 1).product();
    let widths: Vec<usize> = parts.iter().map(|p| p.shape()[dim] * inner).collect();
    let total: usize = widths.iter().sum();
    let first = &parts[0];
    let vector = vector_size(first, &widths);
    let mut out_shape: Vec<usize> = shape0.iter().copied().collect();
    out_shape[dim] = parts.iter().map(|p| p.shape()[dim]).sum();
    let output = empty_device_contiguous_dtype(
        first.client.clone(),
        first.device.clone(),
        Shape::from(out_shape),
        first.dtype,
    );
    let mut inputs = SequenceArg::new();
    for p in &parts {
        inputs.push(array_arg(p));
    }
    let widths_arg: SequenceArg<R, usize> = widths.iter().map(|w| w / vector).collect();
    let (count, cube_dim) = launch_dims(first, rows * total / vector);
    // SAFETY: input `i` holds `rows * widths[i] / vector` vectors and the kernel reads row `r`,
    // column `c - start_i < widths[i] / vector` of it; the output holds `rows * total / vector`.
    unsafe {
        group_cat_kernel::launch_unchecked::<R>(
            &first.client,
            count,
            cube_dim,
            vector,
            inputs,
            array_arg(&output),
            widths_arg,
            total / vector,
            first.dtype.into(),
        );
    }
    LAUNCHES.fetch_add(1, Ordering::Relaxed);
    Some(output)
}

/// The kernels as an in-process collective engine for runtime `R` (see
/// [`super::engine::LocalEngines::for_device`]).
pub(crate) struct CubeKernels<R> {
    name: &'static str,
    _runtime: std::marker::PhantomData<fn() -> R>,
}

impl<R> CubeKernels<R> {
    pub(crate) fn new(name: &'static str) -> Self {
        Self {
            name,
            _runtime: std::marker::PhantomData,
        }
    }
}

impl<R: CubeRuntime> LocalEngine for CubeKernels<R> {
    fn name(&self) -> &'static str {
        self.name
    }
    /// The `op`-reduction of `parts` (same shape, same device) in one kernel launch, or `None`
    /// when the fused path does not apply (see the module docs).
    fn reduce(&self, parts: &[&dyn Any], op: ReduceOp) -> Option<Box<dyn Any>> {
        let out = reduce_on(as_cube::<R>(parts)?, op)?;
        Some(Box::new(out))
    }
    /// The concatenation of `parts` along `dim` (same device, none empty) in one kernel launch.
    fn cat(&self, parts: &[&dyn Any], dim: usize) -> Option<Box<dyn Any>> {
        let out = cat_on(as_cube::<R>(parts)?, dim)?;
        Some(Box::new(out))
    }
}
