//! The distributed tensor primitive: a global shape, a layout and one inner primitive per mesh
//! device, plus [`Kind`], the handful of inner ops (slice, cat, reduce, move) that
//! redistribution and collectives need, implemented once per tensor kind (float, int, bool).

use std::sync::{Arc, Mutex, OnceLock, Weak};

use burn::tensor::backend::Backend;
use burn::tensor::ops::{BoolTensor, FloatTensor, IntTensor};
use burn::tensor::{DType, Shape, Slice, TensorData, TensorMetadata};

use crate::layout::{Layout, Partials, ReduceOp};

/// A distributed tensor: global `shape`, its `layout` on a mesh, and its shard values in one of
/// the states of [`Shards`] (per device, stacked, or stacked with deferred partial products).
///
/// Replicated dims hold the whole extent on each device; a partial layout means the global value
/// is the reduction of the shards along the pending axes.
#[derive(Clone, Debug)]
pub struct DTensor<P> {
    pub(crate) shape: Vec<usize>,
    /// Shared, so that moving a tensor through the decorator's layers moves a pointer rather
    /// than the layout's inline dims (the tensor is moved by value several times per op).
    pub(crate) layout: Arc<Layout>,
    /// Where the shard values are: the tensor's one piece of state.
    pub(crate) shards: Shards<P>,
    /// Memoised reduction of a partial tensor, shared by clones, so that two consumers of one
    /// partial result (say a gradient used twice by Adam) trigger one all-reduce, not two; and
    /// the linear functions of it taken while it was pending, settled from it (see [`Memo`]).
    /// Allocated only for partial layouts (the others have nothing to memoise). A cache of the
    /// value, not a state: every reader may ignore it.
    pub(crate) reduced: Option<Arc<Memo<P>>>,
    /// Where a pending sum settles when a consumer needs its value: the layout with the dims
    /// that an operand of the additive op that made it sharded over the pending axes (a
    /// sequence-sharded residual plus a row-parallel output: a reduce-scatter, not an
    /// all-reduce). Set only on partial tensors of that origin; `None` settles to
    /// [`Layout::without_partial`]. See `rules::pointwise::nary`.
    pub(crate) settle_to: Option<Arc<Layout>>,
    /// Which logical value this is: fresh for every op's output, shared by clones and by the
    /// same value in another state (see [`DTensor::with_shards`]). The key of
    /// `redistribute::reuse`'s memo of the last all-gather.
    pub(crate) id: u64,
}

/// The memo of a partial tensor's reduction (see [`DTensor`]'s `reduced`), and the tensors
/// derived from it by linear ops while it was still pending.
///
/// A pending sum `x` may feed a linear op `f` (a sum over a dim, a view, an embedding's
/// backward) before another consumer settles it: `f(x)` is then a pending sum of its own, and
/// settling it would be a second all-reduce of values the first one already summed (tensor
/// parallelism: the position embedding's gradient `Σ_batch g` taken from the activation
/// gradient `g` before the vocabulary-parallel lookup's backward all-reduces `g`; Megatron
/// all-reduces `g` first, so its position gradient needs no communication). Each such `f(x)`
/// registers here; when `x` settles, its settled value `s` is handed to every registered `f`
/// still alive, and `f(s)` (local: the op on a settled input) becomes the memoised value of
/// `f(x)`. That value may still be pending over the axes `x` was not (a sum over a dim
/// sharded over another axis): it is the same global value with fewer pending axes, which the
/// consumer settles as usual. The same code runs on every process count, so one process and
/// several stay bitwise equal.
pub(crate) struct Memo<P> {
    value: OnceLock<Box<DTensor<P>>>,
    derived: Mutex<Vec<Derived<P>>>,
    /// For a derived tensor: the pending sum it comes from first (the root of its chain of
    /// linear ops) and the whole chain as one function, so that a tensor derived from a derived
    /// one registers with the root, which the intermediate tensors need not outlive (autodiff
    /// drops them as soon as they are consumed).
    origin: OnceLock<Origin<P>>,
    /// Whether the pending sum is a product kept pending by `rules::pointwise::Linearity::Scaling`
    /// (dropout's mask on a row-parallel output): a scaling of it may stay pending too, where a
    /// scaling of any other pending sum (`lr * g`) settles it (see `ops::common::scaling`).
    scaled: std::sync::atomic::AtomicBool,
}

/// A function from a settled value to the memoised value of a derived tensor: `None` when the
/// result is not in the layout that memo needs (the tensor then settles by its own collective).
type Apply<P> = Arc<dyn Fn(DTensor<P>) -> Option<DTensor<P>> + Send + Sync>;

/// A linear function of a pending sum, taken while it was pending (see [`Memo`]).
struct Derived<P> {
    /// The memo of the derived tensor (weak: a derived tensor dropped unsettled needs nothing).
    memo: Weak<Memo<P>>,
    apply: Apply<P>,
}

/// Where a derived tensor comes from (see [`Memo`]'s `origin`).
struct Origin<P> {
    root: Weak<Memo<P>>,
    /// The root's pending reductions (the derived tensor's memo is its layout without them).
    pending: Partials,
    apply: Apply<P>,
}

impl<P> Default for Memo<P> {
    fn default() -> Self {
        Self {
            value: OnceLock::new(),
            derived: Mutex::new(Vec::new()),
            origin: OnceLock::new(),
            scaled: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

impl<P> Memo<P> {
    /// The memoised value, if the tensor has settled.
    pub(crate) fn get(&self) -> Option<&DTensor<P>> {
        self.value.get().map(|b| b.as_ref())
    }
    /// Whether the pending sum is a product kept pending (see `scaled`).
    pub(crate) fn is_scaled(&self) -> bool {
        self.scaled.load(std::sync::atomic::Ordering::Relaxed)
    }
    /// Marks the pending sum as a product kept pending (see `scaled`).
    pub(crate) fn mark_scaled(&self) {
        self.scaled
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
    /// Whether a tensor derived from this one waits for its settled value.
    pub(crate) fn has_derived(&self) -> bool {
        let derived = self.derived.lock().unwrap_or_else(|e| e.into_inner());
        derived.iter().any(|d| d.memo.strong_count() > 0)
    }
}

impl<P: Clone + 'static> Memo<P> {
    fn push(&self, memo: &Arc<Memo<P>>, apply: Apply<P>) {
        let mut derived = self.derived.lock().unwrap_or_else(|e| e.into_inner());
        derived.retain(|d| d.memo.strong_count() > 0);
        derived.push(Derived {
            memo: Arc::downgrade(memo),
            apply,
        });
    }
    /// Registers `out` (memo `out_memo`, layout `out_layout`) as `op` of the pending sum whose
    /// memo is `source` (pending reductions `pending`), not settled yet: with `source`, and,
    /// where `source` is itself derived from a root still pending, with that root through the
    /// whole chain (see [`Memo`]).
    pub(crate) fn derive(
        source: &Arc<Memo<P>>,
        pending: &Partials,
        out_memo: &Arc<Memo<P>>,
        out_layout: &Layout,
        op: Arc<dyn Fn(DTensor<P>) -> DTensor<P> + Send + Sync>,
    ) {
        let checked = |to: Layout, op: Arc<dyn Fn(DTensor<P>) -> DTensor<P> + Send + Sync>| {
            move |x: DTensor<P>| {
                let y = op(x);
                (*y.layout == to).then_some(y)
            }
        };
        let direct: Apply<P> =
            Arc::new(checked(out_layout.without_partial_on(pending), op.clone()));
        source.push(out_memo, direct.clone());
        let mut origin = Origin {
            root: Arc::downgrade(source),
            pending: pending.clone(),
            apply: direct,
        };
        if let Some(o) = source.origin.get()
            && let Some(root) = o.root.upgrade()
            && root.get().is_none()
        {
            let (first, then) = (
                o.apply.clone(),
                checked(out_layout.without_partial_on(&o.pending), op),
            );
            let chain: Apply<P> = Arc::new(move |x| first(x).and_then(&then));
            root.push(out_memo, chain.clone());
            origin = Origin {
                root: o.root.clone(),
                pending: o.pending.clone(),
                apply: chain,
            };
        }
        let _ = out_memo.origin.set(origin);
    }
    /// The memoised value, computed by `settle` if there is none yet; the first value also
    /// settles the tensors derived from this one (recursively).
    pub(crate) fn get_or_settle(&self, settle: impl FnOnce() -> DTensor<P>) -> &DTensor<P> {
        let mut first = false;
        let v = self.value.get_or_init(|| {
            first = true;
            Box::new(settle())
        });
        if first {
            self.settle_derived(v);
        }
        v
    }
    /// Hands the settled value `v` to the tensors derived from this one (see [`Memo`]).
    fn settle_derived(&self, v: &DTensor<P>) {
        let derived = std::mem::take(&mut *self.derived.lock().unwrap_or_else(|e| e.into_inner()));
        for d in derived {
            if let Some(memo) = d.memo.upgrade()
                && memo.get().is_none()
                && let Some(y) = (d.apply)(v.clone())
                && memo.value.set(Box::new(y)).is_ok()
            {
                memo.settle_derived(memo.get().expect("just set"));
            }
        }
    }
}

impl<P> std::fmt::Debug for Memo<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Memo")
            .field("settled", &self.value.get().is_some())
            .finish()
    }
}

/// The state of a [`DTensor`]'s shard values: exactly one of three forms. Every file that needs
/// to know the form matches on this enum; the choice of form for an op's output is made in one
/// place (`ops::dispatch::holds_stacked`).
#[derive(Clone, Debug)]
pub enum Shards<P> {
    /// One inner primitive per addressable mesh position, of the per-shard shape
    /// [`crate::layout::local_shape`] gives: `v[i]` is device `i` (row-major) in one process; on a
    /// multi-process mesh only this process's positions, `v[j]` being position
    /// [`MeshTopology::global`](crate::MeshTopology::global)`(j)` (see [`crate::spmd`]).
    PerDevice(Vec<P>),
    /// One primitive of shape [`crate::stack::stack_shape`] holding every addressable shard
    /// (virtual meshes only, see [`crate::stack`]): one leading dim per mesh axis (the extent
    /// this process holds where the layout uses the axis, the axis size in one process; else 1),
    /// then the per-shard shape.
    Stacked(P),
    /// A stacked partial tensor held by its reduced value, its shards computed when first read
    /// (see [`Deferred`]).
    Deferred(Arc<Deferred<P>>),
}

/// The shards of a stacked partial tensor, computed on first read, beside its reduced value,
/// computed at once.
///
/// A matmul whose contracting dim is sharded over mesh axes on both operands (a data-parallel
/// weight gradient `x^T @ g` with the batch sharded) gives one partial product per shard, and
/// the all-reduce that settles them is their sum. On a stacked virtual mesh that sum is one
/// matmul over the whole contracting dim (`[1200, 64] @ [64, 48]`, as on one device), far cheaper
/// than 8 partial `[1200, 48]` products written out and summed. The tensor keeps its partial
/// layout: the all-reduce still happens when a consumer needs the value, is recorded with the
/// same bytes ([`crate::CommDebugMode`]), and just takes the reduced value; a consumer that reads
/// the shards themselves (an additive op keeping them partial, a relayout that is not a full
/// reduction, [`crate::to_local_shards`]) gets the per-shard products, computed then.
pub struct Deferred<P> {
    /// The reduced value: the stacked primitive of the layout without its pending reductions.
    pub(crate) reduced: P,
    stack: OnceLock<P>,
    compute: Box<dyn Fn() -> P + Send + Sync>,
}

impl<P> Deferred<P> {
    /// The stacked primitive of the partial layout (the per-shard values), computed once.
    pub(crate) fn stack(&self) -> &P {
        self.stack.get_or_init(|| (self.compute)())
    }
}

impl<P> std::fmt::Debug for Deferred<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deferred")
            .field("computed", &self.stack.get().is_some())
            .finish()
    }
}

impl<P> DTensor<P> {
    /// Builds a tensor from its parts (no check: internal).
    fn with_state(shape: Vec<usize>, layout: Arc<Layout>, shards: Shards<P>) -> Self {
        debug_assert_eq!(
            layout.rank(),
            shape.len(),
            "layout {layout} vs shape {shape:?}"
        );
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let reduced = layout.is_partial().then(Arc::default);
        Self {
            shape,
            layout,
            shards,
            reduced,
            settle_to: None,
            id: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        }
    }
    /// Builds a per-device tensor from its shards (no check: internal).
    pub(crate) fn from_parts(
        shape: Vec<usize>,
        layout: impl Into<Arc<Layout>>,
        shards: Vec<P>,
    ) -> Self {
        let layout = layout.into();
        debug_assert_eq!(layout.mesh.local_size(), shards.len());
        Self::with_state(shape, layout, Shards::PerDevice(shards))
    }
    /// Builds a tensor in stacked form from its one stacked primitive (no check: internal).
    pub(crate) fn from_stacked(
        shape: Vec<usize>,
        layout: impl Into<Arc<Layout>>,
        stack: P,
    ) -> Self {
        Self::with_state(shape, layout.into(), Shards::Stacked(stack))
    }
    /// A stacked partial tensor held by its reduced value (the stacked primitive of
    /// `layout.without_partial()`), its shards computed by `compute` when first read (see
    /// [`Deferred`]).
    pub(crate) fn deferred(
        shape: Vec<usize>,
        layout: impl Into<Arc<Layout>>,
        reduced: P,
        compute: impl Fn() -> P + Send + Sync + 'static,
    ) -> Self {
        let layout = layout.into();
        debug_assert!(
            layout.is_partial() && layout.mesh.stacked,
            "deferred shards are for stacked partial tensors"
        );
        let d = Arc::new(Deferred {
            reduced,
            stack: OnceLock::new(),
            compute: Box::new(compute),
        });
        Self::with_state(shape, layout, Shards::Deferred(d))
    }
    /// The memo of a pending sum that linear ops may derive tensors from (see [`Memo`]): not
    /// settled yet, and with no settle layout (those are settled before any op reads them).
    pub(crate) fn derivable(&self) -> Option<&Arc<Memo<P>>> {
        self.reduced
            .as_ref()
            .filter(|m| self.settle_to.is_none() && m.get().is_none())
    }
    /// The same logical tensor in another state: keeps the memoised reduction.
    pub(crate) fn with_shards(self, shards: Shards<P>) -> Self {
        Self { shards, ..self }
    }
    /// Whether the shards are held stacked (one primitive, possibly deferred; see [`Shards`]).
    pub fn is_stacked(&self) -> bool {
        !matches!(self.shards, Shards::PerDevice(_))
    }
    /// The global shape.
    pub fn global_shape(&self) -> &[usize] {
        &self.shape
    }
    /// The layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }
    /// The per-device primitives (row-major over the mesh), or, when [`DTensor::is_stacked`], the
    /// one stacked primitive (deferred shards computed now). [`crate::to_local_shards`] always
    /// gives per-device shards.
    pub fn shards(&self) -> &[P] {
        match &self.shards {
            Shards::PerDevice(v) => v,
            Shards::Stacked(p) => std::slice::from_ref(p),
            Shards::Deferred(d) => std::slice::from_ref(d.stack()),
        }
    }
    /// Consumes the tensor into its primitives (as [`DTensor::shards`]).
    pub fn into_shards(self) -> Vec<P>
    where
        P: Clone,
    {
        match self.shards {
            Shards::PerDevice(v) => v,
            Shards::Stacked(p) => vec![p],
            Shards::Deferred(d) => vec![d.stack().clone()],
        }
    }
    /// The per-device shards of a tensor known to be per device (the dispatcher's operands after
    /// [`crate::redistribute::execute`]).
    ///
    /// # Panics
    /// On a stacked tensor (an internal bug).
    pub(crate) fn per_device(&self) -> &[P] {
        match &self.shards {
            Shards::PerDevice(v) => v,
            _ => panic!("burn-dtensor: per-device shards expected, found a stacked tensor"),
        }
    }
    /// As [`DTensor::per_device`], by value.
    pub(crate) fn into_per_device(self) -> Vec<P> {
        match self.shards {
            Shards::PerDevice(v) => v,
            _ => panic!("burn-dtensor: per-device shards expected, found a stacked tensor"),
        }
    }
    /// The stacked primitive of a stacked tensor (deferred shards computed now).
    ///
    /// # Panics
    /// On a per-device tensor (an internal bug).
    pub(crate) fn into_stack(self) -> P
    where
        P: Clone,
    {
        match self.shards {
            Shards::Stacked(p) => p,
            Shards::Deferred(d) => d.stack().clone(),
            Shards::PerDevice(_) => {
                panic!("burn-dtensor: a stacked tensor expected, found per-device shards")
            }
        }
    }
    /// Per-shard shape of this process's `j`-th shard (the mesh position
    /// [`MeshTopology::global`](crate::MeshTopology::global)`(j)`; device `j` in one process).
    pub fn local_shape(&self, j: usize) -> Vec<usize> {
        crate::layout::local_shape(&self.layout, &self.shape, self.layout.mesh.global(j))
    }
}

impl<P: TensorMetadata> TensorMetadata for DTensor<P> {
    fn dtype(&self) -> DType {
        match &self.shards {
            Shards::PerDevice(v) => v[0].dtype(),
            Shards::Stacked(p) => p.dtype(),
            Shards::Deferred(d) => d.reduced.dtype(),
        }
    }
    fn shape(&self) -> Shape {
        Shape::from(&self.shape[..])
    }
}

/// The inner operations that layouts, collectives and redistribution need, for one tensor kind.
///
/// Implemented by [`FloatKind`], [`IntKind`] and [`BoolKind`], so the whole redistribution
/// machinery is written once for the three kinds.
pub trait Kind<B: Backend>: 'static {
    /// The inner primitive.
    type P: TensorMetadata + Clone + Send + Sync + 'static;
    /// Concatenation along `dim` (empty parts are skipped).
    fn cat(parts: Vec<Self::P>, dim: usize) -> Self::P;
    /// Slicing.
    fn slice(t: Self::P, slices: &[Slice]) -> Self::P;
    /// The slice of `t` along `dim` (every other dim whole); `t` itself when `range` is the whole
    /// dim. An empty `range` (an uneven split's empty shard) gives a new empty primitive of the
    /// slice's shape, dtype and device, made from no bytes ([`Kind::from_data`]), not a slice:
    /// no inner op ever runs on it. `burn-cubecl` copies a slice whose byte offsets are not
    /// aligned to the device's (`[2, 3]` f32 cut to rows `2..2`) with a kernel of as many units
    /// as the slice has elements, and CUDA refuses a launch of 0 cubes (`CUDA_ERROR_INVALID_VALUE`,
    /// reported at the next read of any tensor on that stream; Wgpu runs it as a no-op); Flex
    /// computes a slice's offset from its start, which past the end of a flipped dim is negative
    /// and rejected by its debug builds (Burn's conformance tests `*_flipped_*` on a mesh of 4
    /// along dim 0). A quantized `t` is sliced at `0..0` instead (its data carries parameters).
    fn narrow(t: Self::P, dim: usize, range: std::ops::Range<usize>) -> Self::P {
        let shape = t.shape();
        if range.start == 0 && range.end == shape[dim] {
            return t;
        }
        let dtype = t.dtype();
        if range.is_empty() && !matches!(dtype, DType::QFloat(_)) {
            let mut dims: Vec<usize> = shape.iter().copied().collect();
            dims[dim] = 0;
            return Self::empty(dims, dtype, &Self::device(&t));
        }
        let range = if range.is_empty() { 0..0 } else { range };
        let slices: Vec<Slice> = (0..shape.num_dims())
            .map(|d| {
                if d == dim {
                    Slice::new(range.start as isize, Some(range.end as isize), 1)
                } else {
                    Slice::full()
                }
            })
            .collect();
        Self::slice(t, &slices)
    }
    /// A primitive of `shape` (with a 0 in it) and `dtype` on `device`, made from no bytes. Every
    /// empty shard the decorator makes comes from here, never from a slice or a kernel: on Cuda,
    /// `burn-cubecl` copies an unaligned empty slice with a launch of 0 cubes, which the driver
    /// refuses (`CUDA_ERROR_INVALID_VALUE`). Not for quantized dtypes (their bytes carry a scale).
    fn empty(shape: Vec<usize>, dtype: DType, device: &B::Device) -> Self::P {
        debug_assert!(
            shape.contains(&0),
            "an empty primitive has a 0 in its shape"
        );
        Self::from_data(TensorData::from_bytes_vec(Vec::new(), shape, dtype), device)
    }
    /// The device of a primitive.
    fn device(t: &Self::P) -> B::Device;
    /// Moves to a device.
    fn to_device(t: Self::P, device: &B::Device) -> Self::P;
    /// Element-wise combination of two partial values.
    fn reduce(a: Self::P, b: Self::P, op: ReduceOp) -> Self::P;
    /// Zeros of a shape and dtype.
    fn zeros(shape: Shape, device: &B::Device, dtype: DType) -> Self::P;
    /// Upload.
    fn from_data(data: TensorData, device: &B::Device) -> Self::P;
    /// Download (blocking).
    fn into_data(t: Self::P) -> TensorData;
    /// Download for a transfer between processes: [`Kind::into_data`] of a fresh copy (`x * 1`,
    /// bit-preserving; on NdArray a reshape to the same shape, which is also row-major for a
    /// permuted view) for the numeric kinds. A shard shared with other handles (autodiff keeps
    /// clones) is read element by element by some backends (NdArray: an `ArcArray` iterator,
    /// 58 ms for 8 MB here); a fresh buffer is moved out whole (about 10x faster).
    fn into_host(t: Self::P) -> TensorData {
        Self::into_data(t)
    }
    /// Reshape (a view where [`crate::inner::reshape_view`] gives one; a strided input made
    /// [`Kind::dense`] first).
    fn reshape(t: Self::P, shape: Shape) -> Self::P;
    /// `t` row-major where it is a strided view that its backend would copy element by element
    /// on the next op that needs it contiguous ([`crate::inner::dense_copy`]: Flex's views of
    /// three or more merged dims); `t` itself otherwise. Same values, same shape.
    fn dense(t: Self::P) -> Self::P {
        match crate::inner::dense_copy(&t) {
            Some(data) => Self::from_data(data, &Self::device(&t)),
            None => t,
        }
    }
    /// Permutation of the dims.
    fn permute(t: Self::P, axes: &[usize]) -> Self::P;
    /// Repetition along `dim` (a materialised copy).
    fn repeat_dim(t: Self::P, dim: usize, times: usize) -> Self::P;
    /// `op`-reduction along `dim`, kept as size 1 (bool: sum and max are `any`, min is `all`).
    fn reduce_dim(t: Self::P, dim: usize, op: ReduceOp) -> Self::P;
    /// Whether the kind keeps a pending sum (float, int); bool does not (its `or` is settled at
    /// once).
    const PENDING_SUM: bool;
    /// `t` with the elements where `mask` (of `t`'s shape) is true set to the identity of the
    /// kind's sum: float `-0.0` (IEEE 754 addition's identity: `x + -0.0` is `x` for every `x`,
    /// `-0.0` and NaN included, where `+0.0` would turn a `-0.0` into `+0.0`), int 0, bool
    /// `false` (the identity of `or`). A device's share of a masked gather (the indices outside
    /// its rows) and of a masked scatter (the updates outside them) is made of it.
    fn identity_where(t: Self::P, mask: BoolTensor<B>) -> Self::P;
}

fn bool_dtype<B: Backend>(d: &B::Device) -> burn::tensor::BoolDType {
    burn::tensor::get_device_settings::<B>(d).bool_dtype
}

/// Float tensors.
pub struct FloatKind;
/// Int tensors.
pub struct IntKind;
/// Bool tensors.
pub struct BoolKind;

/// Concatenation that skips empty parts (some backends reject them). When every part is empty
/// the result is still empty but must have the concatenated shape (the summed size along
/// `dim`), which a reshape of the first part gives.
fn cat_nonempty<P: TensorMetadata>(
    mut parts: Vec<P>,
    dim: usize,
    cat: impl FnOnce(Vec<P>, usize) -> P,
    reshape: impl FnOnce(P, Shape) -> P,
) -> P {
    if parts.len() > 1 {
        let nonempty: Vec<P> = parts
            .iter()
            .filter(|p| p.shape().num_elements() > 0)
            .cloned()
            .collect();
        if nonempty.is_empty() {
            let mut shape = parts[0].shape();
            shape[dim] = parts.iter().map(|p| p.shape()[dim]).sum();
            return reshape(parts.swap_remove(0), shape);
        }
        parts = nonempty;
    }
    if parts.len() == 1 {
        parts.pop().unwrap()
    } else {
        cat(parts, dim)
    }
}

// Empty shards (an uneven split leaves some devices none) never touch the device: CubeCL's
// CUDA runtime refuses to copy a tensor with a zero dim that is not the last (its contiguous
// strides contain 0: "the provided strides are not supported"), which left the server unusable
// in the first GPU run. They are allocated with `*_empty` and read as empty data.
macro_rules! kind_io {
    (float) => {
        fn cat(parts: Vec<Self::P>, dim: usize) -> Self::P {
            cat_nonempty(parts, dim, B::float_cat, B::float_reshape)
        }
        fn slice(t: Self::P, s: &[Slice]) -> Self::P {
            B::float_slice(t, s)
        }
        fn device(t: &Self::P) -> B::Device {
            B::float_device(t)
        }
        fn to_device(t: Self::P, d: &B::Device) -> Self::P {
            B::float_to_device(t, d)
        }
        fn from_data(data: TensorData, d: &B::Device) -> Self::P {
            if data.num_elements() == 0 {
                return B::float_empty(data.shape.clone(), d, data.dtype.into());
            }
            B::float_from_data(data, d)
        }
        fn into_data(t: Self::P) -> TensorData {
            if t.shape().num_elements() == 0 {
                return TensorData::from_bytes_vec(Vec::new(), t.shape(), t.dtype());
            }
            if let Some(data) = crate::inner::shared_host_data(&t) {
                return data;
            }
            burn::tensor::read_sync(B::float_into_data(t)).expect("reading a float shard")
        }
        fn reshape(t: Self::P, s: Shape) -> Self::P {
            match crate::inner::reshape_view(&t, s) {
                Ok(view) => view,
                Err(s) => B::float_reshape(<Self as Kind<B>>::dense(t), s),
            }
        }
        fn permute(t: Self::P, axes: &[usize]) -> Self::P {
            B::float_permute(t, axes)
        }
        fn repeat_dim(t: Self::P, dim: usize, times: usize) -> Self::P {
            B::float_repeat_dim(t, dim, times)
        }
    };
    (int) => {
        fn cat(parts: Vec<Self::P>, dim: usize) -> Self::P {
            cat_nonempty(parts, dim, B::int_cat, B::int_reshape)
        }
        fn slice(t: Self::P, s: &[Slice]) -> Self::P {
            B::int_slice(t, s)
        }
        fn device(t: &Self::P) -> B::Device {
            B::int_device(t)
        }
        fn to_device(t: Self::P, d: &B::Device) -> Self::P {
            B::int_to_device(t, d)
        }
        fn from_data(data: TensorData, d: &B::Device) -> Self::P {
            if data.num_elements() == 0 {
                return B::int_empty(data.shape.clone(), d, data.dtype.into());
            }
            B::int_from_data(data, d)
        }
        fn into_data(t: Self::P) -> TensorData {
            if t.shape().num_elements() == 0 {
                return TensorData::from_bytes_vec(Vec::new(), t.shape(), t.dtype());
            }
            if let Some(data) = crate::inner::shared_host_data(&t) {
                return data;
            }
            burn::tensor::read_sync(B::int_into_data(t)).expect("reading an int shard")
        }
        fn reshape(t: Self::P, s: Shape) -> Self::P {
            match crate::inner::reshape_view(&t, s) {
                Ok(view) => view,
                Err(s) => B::int_reshape(<Self as Kind<B>>::dense(t), s),
            }
        }
        fn permute(t: Self::P, axes: &[usize]) -> Self::P {
            B::int_permute(t, axes)
        }
        fn repeat_dim(t: Self::P, dim: usize, times: usize) -> Self::P {
            B::int_repeat_dim(t, dim, times)
        }
    };
    (bool) => {
        fn cat(parts: Vec<Self::P>, dim: usize) -> Self::P {
            cat_nonempty(parts, dim, B::bool_cat, B::bool_reshape)
        }
        fn slice(t: Self::P, s: &[Slice]) -> Self::P {
            B::bool_slice(t, s)
        }
        fn device(t: &Self::P) -> B::Device {
            B::bool_device(t)
        }
        fn to_device(t: Self::P, d: &B::Device) -> Self::P {
            B::bool_to_device(t, d)
        }
        fn from_data(data: TensorData, d: &B::Device) -> Self::P {
            if data.num_elements() == 0 {
                return B::bool_empty(data.shape.clone(), d, data.dtype.into());
            }
            B::bool_from_data(data, d)
        }
        fn into_data(t: Self::P) -> TensorData {
            if t.shape().num_elements() == 0 {
                return TensorData::from_bytes_vec(Vec::new(), t.shape(), t.dtype());
            }
            if let Some(data) = crate::inner::shared_host_data(&t) {
                return data;
            }
            burn::tensor::read_sync(B::bool_into_data(t)).expect("reading a bool shard")
        }
        fn reshape(t: Self::P, s: Shape) -> Self::P {
            match crate::inner::reshape_view(&t, s) {
                Ok(view) => view,
                Err(s) => B::bool_reshape(<Self as Kind<B>>::dense(t), s),
            }
        }
        fn permute(t: Self::P, axes: &[usize]) -> Self::P {
            B::bool_permute(t, axes)
        }
        fn repeat_dim(t: Self::P, dim: usize, times: usize) -> Self::P {
            B::bool_repeat_dim(t, dim, times)
        }
    };
}

/// `reduce` and `zeros` of the numeric kinds, from their inner ops.
macro_rules! numeric_kind {
    ($kind:ident, $prim:ident, $io:ident, $add:ident, $greater:ident, $lower:ident, $mask_where:ident, $mask_fill:ident, $identity:expr, $device:ident, $zeros:ident, $sum_dim:ident, $max_dim:ident, $min_dim:ident, $mul_scalar:ident, $reshape:ident) => {
        impl<B: Backend> Kind<B> for $kind {
            type P = $prim<B>;
            kind_io!($io);
            const PENDING_SUM: bool = true;
            fn identity_where(t: Self::P, mask: BoolTensor<B>) -> Self::P {
                B::$mask_fill(t, mask, burn::tensor::Scalar::from($identity))
            }
            fn reduce(a: Self::P, b: Self::P, op: ReduceOp) -> Self::P {
                match op {
                    ReduceOp::Sum => B::$add(a, b),
                    ReduceOp::Max => {
                        let m = B::$greater(b.clone(), a.clone(), bool_dtype::<B>(&B::$device(&a)));
                        B::$mask_where(a, m, b)
                    }
                    ReduceOp::Min => {
                        let m = B::$lower(b.clone(), a.clone(), bool_dtype::<B>(&B::$device(&a)));
                        B::$mask_where(a, m, b)
                    }
                }
            }
            fn zeros(shape: Shape, d: &B::Device, dtype: DType) -> Self::P {
                B::$zeros(shape, d, dtype.into())
            }
            fn into_host(t: Self::P) -> TensorData {
                // NdArray: its reshape to the same shape is a fresh row-major copy even of a
                // permuted view, where `x * 1` keeps the view's strides and the download then
                // walks it element by element (the backend's own reshape: `Kind::reshape`
                // would give a view of a shared buffer, which the download walks too).
                let fresh = if crate::inner::reshape_copies::<B>() {
                    let shape = t.shape();
                    B::$reshape(t, shape)
                } else {
                    B::$mul_scalar(t, 1i64.into())
                };
                <Self as Kind<B>>::into_data(fresh)
            }
            fn reduce_dim(t: Self::P, dim: usize, op: ReduceOp) -> Self::P {
                match op {
                    // NdArray's stacked sums (a stacked all-reduce sums along a mesh dim) at a
                    // fixed rank: bitwise the backend's op (`inner::sum_dim_fixed_rank`).
                    ReduceOp::Sum => crate::inner::sum_dim_fixed_rank(&t, dim, false)
                        .unwrap_or_else(|| B::$sum_dim(t, dim)),
                    ReduceOp::Max => B::$max_dim(t, dim),
                    ReduceOp::Min => B::$min_dim(t, dim),
                }
            }
        }
    };
}

numeric_kind!(
    FloatKind,
    FloatTensor,
    float,
    float_add,
    float_greater,
    float_lower,
    float_mask_where,
    float_mask_fill,
    -0.0f64,
    float_device,
    float_zeros,
    float_sum_dim,
    float_max_dim,
    float_min_dim,
    float_mul_scalar,
    float_reshape
);
numeric_kind!(
    IntKind,
    IntTensor,
    int,
    int_add,
    int_greater,
    int_lower,
    int_mask_where,
    int_mask_fill,
    0i64,
    int_device,
    int_zeros,
    int_sum_dim,
    int_max_dim,
    int_min_dim,
    int_mul_scalar,
    int_reshape
);

impl<B: Backend> Kind<B> for BoolKind {
    type P = BoolTensor<B>;
    kind_io!(bool);
    const PENDING_SUM: bool = false;
    fn identity_where(t: Self::P, mask: BoolTensor<B>) -> Self::P {
        B::bool_and(t, B::bool_not(mask))
    }
    fn reduce(a: Self::P, b: Self::P, op: ReduceOp) -> Self::P {
        match op {
            ReduceOp::Sum | ReduceOp::Max => B::bool_or(a, b),
            ReduceOp::Min => B::bool_and(a, b),
        }
    }
    fn zeros(shape: Shape, d: &B::Device, dtype: DType) -> Self::P {
        B::bool_zeros(shape, d, dtype.into())
    }
    fn reduce_dim(t: Self::P, dim: usize, op: ReduceOp) -> Self::P {
        match op {
            ReduceOp::Sum | ReduceOp::Max => B::bool_any_dim(t, dim),
            ReduceOp::Min => B::bool_all_dim(t, dim),
        }
    }
}
