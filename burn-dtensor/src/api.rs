//! The user-facing API on Burn tensors: [`DTensorExt`] (a tensor's layout, relayout, local
//! shards, visualisation) and [`distribute`] / [`from_local_shards`] (host data and per-device
//! tensors onto the mesh), for float, int and bool tensors alike.
//!
//! Everything here works on `Tensor<DistributedBackend<B>, D, K>` and on
//! `Tensor<Autodiff<DistributedBackend<B>>, D, K>` through the [`DistributedOps`] trait, for
//! the kinds [`DistributedKind`] covers (`Float`, `Int`, `Bool`).

use burn::tensor::backend::{Backend, BackendTypes};
use burn::tensor::ops::{BoolTensor, FloatTensor, IntTensor, QTensorOps, QuantizedTensor};
use burn::tensor::{BasicOps, Bool, Float, Int, Tensor, TensorData, TensorPrimitive};

use crate::backend::DistributedBackend;
use crate::error::{DTensorError, Result};
use crate::layout::Layout;
use crate::layout::local_shape;
use crate::mesh::Mesh;
use crate::ops::common;
use crate::redistribute::redistribute;
use crate::tensor::{BoolKind, DTensor, FloatKind, IntKind, Kind};

/// Backends whose tensors carry layouts: [`DistributedBackend<B>`] and
/// `Autodiff<DistributedBackend<B>>`. Use it as a bound (`B: DistributedOps`) in code that works
/// on both; the methods are the backend-level hooks behind [`DTensorExt`].
pub trait DistributedOps: Backend {
    /// The backend that runs each shard.
    type Inner: Backend;
    /// The distributed primitive under a float tensor (a reference, no copy).
    #[doc(hidden)]
    fn float_dtensor(t: &FloatTensor<Self>) -> &DTensor<FloatTensor<Self::Inner>>;
    /// The distributed primitive under a float tensor (no copy; on autodiff backends the
    /// tensor leaves the graph).
    #[doc(hidden)]
    fn float_into_dtensor(t: FloatTensor<Self>) -> DTensor<FloatTensor<Self::Inner>>;
    /// A float tensor of this backend from a distributed primitive (an autodiff leaf).
    #[doc(hidden)]
    fn float_from_dtensor(t: DTensor<FloatTensor<Self::Inner>>) -> FloatTensor<Self>;
    /// The distributed primitive under an int tensor.
    #[doc(hidden)]
    fn int_dtensor(t: &IntTensor<Self>) -> &DTensor<IntTensor<Self::Inner>>;
    /// The distributed primitive under an int tensor (no copy).
    #[doc(hidden)]
    fn int_into_dtensor(t: IntTensor<Self>) -> DTensor<IntTensor<Self::Inner>>;
    /// An int tensor of this backend from a distributed primitive.
    #[doc(hidden)]
    fn int_from_dtensor(t: DTensor<IntTensor<Self::Inner>>) -> IntTensor<Self>;
    /// The distributed primitive under a bool tensor.
    #[doc(hidden)]
    fn bool_dtensor(t: &BoolTensor<Self>) -> &DTensor<BoolTensor<Self::Inner>>;
    /// The distributed primitive under a bool tensor (no copy).
    #[doc(hidden)]
    fn bool_into_dtensor(t: BoolTensor<Self>) -> DTensor<BoolTensor<Self::Inner>>;
    /// A bool tensor of this backend from a distributed primitive.
    #[doc(hidden)]
    fn bool_from_dtensor(t: DTensor<BoolTensor<Self::Inner>>) -> BoolTensor<Self>;
    /// The layout of a quantized tensor (always replicated).
    #[doc(hidden)]
    fn q_layout(t: &QuantizedTensor<Self>) -> Layout;
    /// Relayout of a float tensor: differentiable on autodiff backends (the gradient is relaid
    /// out back to the input's layout).
    ///
    /// # Errors
    /// Rank mismatch, or a layout on a mesh of other devices.
    #[doc(hidden)]
    fn float_relayout(t: FloatTensor<Self>, layout: &Layout) -> Result<FloatTensor<Self>> {
        Ok(Self::float_from_dtensor(redistribute::<
            Self::Inner,
            FloatKind,
        >(
            Self::float_into_dtensor(t),
            layout,
        )?))
    }
    /// Relayout of a float tensor outside the autodiff graph: the result is a fresh leaf (what a
    /// parameter needs; see [`LayoutMap`](crate::LayoutMap)).
    ///
    /// # Errors
    /// Rank mismatch, or a layout on a mesh of other devices.
    #[doc(hidden)]
    fn float_relayout_leaf(t: FloatTensor<Self>, layout: &Layout) -> Result<FloatTensor<Self>> {
        Self::float_relayout(t, layout)
    }
}

/// The int and bool hooks of [`DistributedOps`] for a backend whose int and bool primitives
/// are the decorator's own (`DistributedBackend<B>`, and `Autodiff` over it, which passes int and
/// bool tensors through): each hook is the identity.
macro_rules! pass_through_int_bool_hooks {
    ($b:ident) => {
        fn int_dtensor(
            t: &burn::tensor::ops::IntTensor<Self>,
        ) -> &crate::tensor::DTensor<burn::tensor::ops::IntTensor<$b>> {
            t
        }
        fn int_into_dtensor(
            t: burn::tensor::ops::IntTensor<Self>,
        ) -> crate::tensor::DTensor<burn::tensor::ops::IntTensor<$b>> {
            t
        }
        fn int_from_dtensor(
            t: crate::tensor::DTensor<burn::tensor::ops::IntTensor<$b>>,
        ) -> burn::tensor::ops::IntTensor<Self> {
            t
        }
        fn bool_dtensor(
            t: &burn::tensor::ops::BoolTensor<Self>,
        ) -> &crate::tensor::DTensor<burn::tensor::ops::BoolTensor<$b>> {
            t
        }
        fn bool_into_dtensor(
            t: burn::tensor::ops::BoolTensor<Self>,
        ) -> crate::tensor::DTensor<burn::tensor::ops::BoolTensor<$b>> {
            t
        }
        fn bool_from_dtensor(
            t: crate::tensor::DTensor<burn::tensor::ops::BoolTensor<$b>>,
        ) -> burn::tensor::ops::BoolTensor<Self> {
            t
        }
    };
}
pub(crate) use pass_through_int_bool_hooks;

impl<B: Backend> DistributedOps for DistributedBackend<B> {
    type Inner = B;
    fn float_dtensor(t: &FloatTensor<Self>) -> &DTensor<FloatTensor<B>> {
        t
    }
    fn float_into_dtensor(t: FloatTensor<Self>) -> DTensor<FloatTensor<B>> {
        t
    }
    fn float_from_dtensor(t: DTensor<FloatTensor<B>>) -> FloatTensor<Self> {
        t
    }
    crate::api::pass_through_int_bool_hooks!(B);
    fn q_layout(t: &QuantizedTensor<Self>) -> Layout {
        (*t.layout).clone()
    }
}

/// The inner device type of a distributed backend.
type InnerDevice<B> = <<B as DistributedOps>::Inner as BackendTypes>::Device;

/// The mesh a layout lives on, with its devices (layouts carry the mesh's axes and id; the
/// devices come from the process' mesh registry).
///
/// # Errors
/// [`DTensorError::UnknownMesh`] when the layout was built on a mesh of another device type.
pub(crate) fn mesh_of_layout<B: DistributedOps>(layout: &Layout) -> Result<Mesh<InnerDevice<B>>> {
    Mesh::from_registry(layout.mesh.id).ok_or_else(|| DTensorError::UnknownMesh {
        mesh: layout.mesh.to_string(),
        backend: std::any::type_name::<B::Inner>().to_string(),
    })
}

/// Tensor kinds whose tensors carry a layout on a distributed backend `B`: `Float`, `Int` and
/// `Bool`. The one place where the kind-specific primitive calls are chosen, so that
/// [`DTensorExt`], [`distribute`] and [`from_local_shards`] are written once for all kinds.
pub trait DistributedKind<B: DistributedOps>: BasicOps<B> + BasicOps<B::Inner> {
    /// The layout of a primitive of this kind.
    #[doc(hidden)]
    fn layout(p: &<Self as burn::tensor::TensorKind<B>>::Primitive) -> Layout;
    /// Relayout of a primitive (float: differentiable on autodiff backends).
    ///
    /// # Errors
    /// Rank mismatch, or a layout on a mesh of other devices.
    #[doc(hidden)]
    fn relayout(
        p: <Self as burn::tensor::TensorKind<B>>::Primitive,
        layout: &Layout,
    ) -> Result<<Self as burn::tensor::TensorKind<B>>::Primitive>;
    /// A primitive from host data, each device receiving its chunk under `layout`.
    ///
    /// # Errors
    /// Rank mismatch, unknown mesh.
    #[doc(hidden)]
    fn distribute(
        data: TensorData,
        layout: &Layout,
    ) -> Result<<Self as burn::tensor::TensorKind<B>>::Primitive>;
    /// The per-device shards on the inner backend (row-major over the mesh).
    #[doc(hidden)]
    fn local_shards(
        p: <Self as burn::tensor::TensorKind<B>>::Primitive,
    ) -> Vec<<Self as burn::tensor::TensorKind<B::Inner>>::Primitive>;
    /// One shard's values on the host, downloaded as a fresh buffer moved out whole (see
    /// `Kind::into_host`: a shard shared with a parameter is otherwise read element by element
    /// by some backends).
    #[doc(hidden)]
    fn shard_into_host(p: <Self as burn::tensor::TensorKind<B::Inner>>::Primitive) -> TensorData;
    /// A primitive from per-device shards (checked by the caller).
    #[doc(hidden)]
    fn from_local_shards(
        shape: Vec<usize>,
        layout: &Layout,
        shards: Vec<<Self as burn::tensor::TensorKind<B::Inner>>::Primitive>,
    ) -> <Self as burn::tensor::TensorKind<B>>::Primitive;
}

/// The per-device shards of a distributed primitive, row-major over the mesh.
fn per_device<B: Backend, K: Kind<B>>(t: DTensor<K::P>) -> Vec<K::P> {
    crate::stack::to_per_device::<B, K>(t).into_per_device()
}

/// A float primitive's distributed form: quantized tensors are dequantized (they are always
/// replicated, see [`DistributedOps::q_layout`]).
fn float_dt<B: DistributedOps>(p: TensorPrimitive<B>) -> DTensor<FloatTensor<B::Inner>> {
    match p {
        TensorPrimitive::Float(p) => B::float_into_dtensor(p),
        TensorPrimitive::QFloat(q) => {
            B::float_into_dtensor(B::dequantize(q, burn::tensor::FloatDType::F32))
        }
    }
}

impl<B: DistributedOps> DistributedKind<B> for Float {
    fn layout(p: &TensorPrimitive<B>) -> Layout {
        match p {
            TensorPrimitive::Float(p) => (*B::float_dtensor(p).layout).clone(),
            TensorPrimitive::QFloat(q) => B::q_layout(q),
        }
    }
    fn relayout(p: TensorPrimitive<B>, layout: &Layout) -> Result<TensorPrimitive<B>> {
        let p = match p {
            TensorPrimitive::Float(p) => p,
            TensorPrimitive::QFloat(q) => B::dequantize(q, burn::tensor::FloatDType::F32),
        };
        Ok(TensorPrimitive::Float(B::float_relayout(p, layout)?))
    }
    fn distribute(data: TensorData, layout: &Layout) -> Result<TensorPrimitive<B>> {
        let mesh = mesh_of_layout::<B>(layout)?;
        let t = common::distribute::<B::Inner, FloatKind>(data, &mesh, layout)?;
        Ok(TensorPrimitive::Float(B::float_from_dtensor(t)))
    }
    fn local_shards(p: TensorPrimitive<B>) -> Vec<TensorPrimitive<B::Inner>> {
        per_device::<B::Inner, FloatKind>(float_dt::<B>(p))
            .into_iter()
            .map(TensorPrimitive::Float)
            .collect()
    }
    fn shard_into_host(p: TensorPrimitive<B::Inner>) -> TensorData {
        match p {
            TensorPrimitive::Float(p) => <FloatKind as Kind<B::Inner>>::into_host(p),
            TensorPrimitive::QFloat(q) => <FloatKind as Kind<B::Inner>>::into_host(
                B::Inner::dequantize(q, burn::tensor::FloatDType::F32),
            ),
        }
    }
    fn from_local_shards(
        shape: Vec<usize>,
        layout: &Layout,
        shards: Vec<TensorPrimitive<B::Inner>>,
    ) -> TensorPrimitive<B> {
        let shards = shards
            .into_iter()
            .map(|p| match p {
                TensorPrimitive::Float(p) => p,
                TensorPrimitive::QFloat(q) => {
                    B::Inner::dequantize(q, burn::tensor::FloatDType::F32)
                }
            })
            .collect();
        TensorPrimitive::Float(B::float_from_dtensor(DTensor::from_parts(
            shape,
            layout.clone(),
            shards,
        )))
    }
}

/// [`DistributedKind`] for the kinds whose primitive is the distributed primitive itself.
macro_rules! plain_kind {
    ($kind:ty, $k:ty, $get:ident, $into:ident, $from:ident) => {
        impl<B: DistributedOps> DistributedKind<B> for $kind {
            fn layout(p: &<Self as burn::tensor::TensorKind<B>>::Primitive) -> Layout {
                (*B::$get(p).layout).clone()
            }
            fn relayout(
                p: <Self as burn::tensor::TensorKind<B>>::Primitive,
                layout: &Layout,
            ) -> Result<<Self as burn::tensor::TensorKind<B>>::Primitive> {
                Ok(B::$from(redistribute::<B::Inner, $k>(B::$into(p), layout)?))
            }
            fn distribute(
                data: TensorData,
                layout: &Layout,
            ) -> Result<<Self as burn::tensor::TensorKind<B>>::Primitive> {
                let mesh = mesh_of_layout::<B>(layout)?;
                Ok(B::$from(common::distribute::<B::Inner, $k>(
                    data, &mesh, layout,
                )?))
            }
            fn local_shards(
                p: <Self as burn::tensor::TensorKind<B>>::Primitive,
            ) -> Vec<<Self as burn::tensor::TensorKind<B::Inner>>::Primitive> {
                per_device::<B::Inner, $k>(B::$into(p))
            }
            fn shard_into_host(
                p: <Self as burn::tensor::TensorKind<B::Inner>>::Primitive,
            ) -> TensorData {
                <$k as Kind<B::Inner>>::into_host(p)
            }
            fn from_local_shards(
                shape: Vec<usize>,
                layout: &Layout,
                shards: Vec<<Self as burn::tensor::TensorKind<B::Inner>>::Primitive>,
            ) -> <Self as burn::tensor::TensorKind<B>>::Primitive {
                B::$from(DTensor::from_parts(shape, layout.clone(), shards))
            }
        }
    };
}
plain_kind!(
    Int,
    IntKind,
    int_dtensor,
    int_into_dtensor,
    int_from_dtensor
);
plain_kind!(
    Bool,
    BoolKind,
    bool_dtensor,
    bool_into_dtensor,
    bool_from_dtensor
);

/// Distributed-tensor methods on Burn's `Tensor` (float, int and bool), in the manner of
/// PyTorch's `DTensor` methods and JAX's `Array.sharding`: import the trait
/// (`use burn_dtensor::DTensorExt;`) and call them on any tensor of `DistributedBackend<B>` or
/// `Autodiff<DistributedBackend<B>>`.
///
/// ```
/// use burn::backend::NdArray;
/// use burn::tensor::{Int, Tensor, TensorData};
/// use burn_dtensor::{DTensorExt, DistributedBackend, DistributedDevice, Layout, Mesh};
///
/// type B = DistributedBackend<NdArray>;
/// let mesh = Mesh::virtual_devices([("batch", 2)], Default::default())?;
/// let device = DistributedDevice::new(mesh.clone());
/// let labels = Tensor::<B, 1, Int>::from_data([1, 0, 1], &device); // replicated
/// assert!(labels.layout().is_replicated());
/// let labels = labels.relayout(&Layout::batch_sharded(&mesh, "batch", 1)?)?;
/// assert_eq!(labels.describe(), "i64[3@batch]");
/// // Each device holds its chunk (uneven: the first shard is one larger).
/// let shards = labels.clone().to_local_shards();
/// assert_eq!(shards[0].to_data().to_vec::<i64>().unwrap(), vec![1, 0]);
/// assert_eq!(shards[1].to_data().to_vec::<i64>().unwrap(), vec![1]);
/// // The global value is unchanged by the layout.
/// assert_eq!(labels.into_data().to_vec::<i64>().unwrap(), vec![1, 0, 1]);
/// # Ok::<(), burn_dtensor::DTensorError>(())
/// ```
pub trait DTensorExt: Sized {
    /// The same tensor type on the inner backend (what one shard is).
    type Local;
    /// The tensor's layout (sharding spec and pending reductions) on its mesh.
    fn layout(&self) -> Layout;
    /// Redistributes the tensor to `layout` (TensorFlow DTensor's `dtensor.relayout`, PyTorch's
    /// `DTensor.redistribute`), running the collectives the two layouts imply (all-gather,
    /// all-reduce, reduce-scatter, all-to-all or a local chunk). The global value is unchanged.
    /// Float tensors are differentiable through it on `Autodiff<DistributedBackend<B>>`: the
    /// backward pass relayouts the gradient back to the input's layout.
    ///
    /// `layout` may lie on **another mesh** of the same inner device type (JAX's
    /// `jax.device_put(x, NamedSharding(other_mesh, spec))`): each target shard is cut from the
    /// source shards that overlap it, in one all-to-all over the SPMD world when the source mesh
    /// spans processes, so no process holds more of the tensor than its source and target
    /// shards (a 256 MiB tensor moved from row blocks on 2 processes to column blocks of
    /// another mesh raised each process's peak by 1.0 x its block). Every process calls it.
    /// `Tensor::to_device` to another mesh's [`DistributedDevice`](crate::DistributedDevice) is
    /// this relayout to the layout a tensor created there gets (replicated unless a creation
    /// layout says otherwise).
    ///
    /// # Errors
    /// [`DTensorError::RankMismatch`] when the layout's rank is not the tensor's,
    /// [`DTensorError::UnknownMesh`] when it lies on a mesh of another device type.
    fn relayout(self, layout: &Layout) -> Result<Self>;
    /// The per-device shards on the inner backend, one per mesh device in row-major order,
    /// each of the per-shard shape the layout implies (replicated dims whole, sharded dims
    /// chunked, see [`Layout::shard_ranges`]). A partial layout gives the unreduced values.
    fn to_local_shards(self) -> Vec<Self::Local>;
    /// The global value in one process only: `Some(data)` (global shape) in the process of
    /// rank `process` (0 is the chief), `None` in every other (PyTorch's `gather` to `dst`), for
    /// exporting a tensor or logging a value without making every process hold it. Every
    /// process calls it (SPMD). A partial tensor is reduced first (as by a relayout); then each
    /// distinct non-empty shard is sent once, by the first mesh position holding it, straight to
    /// `process`: one all-to-all in which only `process` receives (MPI's `MPI_Alltoallv`). Peak
    /// memory: the other processes hold nothing beyond a host copy of the shards they send;
    /// `process` up to about twice the tensor (the received bytes, and the assembled whole
    /// unless the shards are row blocks that already lie end to end; measured for 256 MiB in
    /// row shards on 2 and 4 processes: 1.0x the shard elsewhere, 2.0x the tensor there).
    /// [`Tensor::into_data`] by contrast gives every process the whole value. In one process
    /// this is `Some(into_data())`.
    ///
    /// # Errors
    /// [`DTensorError::NoSuchProcess`] when `process` is not a rank of the run,
    /// [`DTensorError::Unsupported`] for a quantized tensor spread over processes.
    fn gather_to_process(self, process: usize) -> Result<Option<TensorData>>;
    /// `f32[64@batch, 1200]`: dtype, global shape and sharding, in JAX's notation.
    fn describe(&self) -> String;
    /// The tensor's layout drawn as a table of device blocks (see
    /// [`visualize_sharding`](crate::visualize_sharding)), with ANSI colours when `color` is true
    /// (e.g. `std::io::stdout().is_terminal()`).
    fn sharding_table(&self, color: bool) -> String;
}

impl<B, const D: usize, K> DTensorExt for Tensor<B, D, K>
where
    B: DistributedOps,
    K: DistributedKind<B>,
    <K as BasicOps<B>>::Elem: burn::tensor::Element,
{
    type Local = Tensor<B::Inner, D, K>;
    fn layout(&self) -> Layout {
        K::layout(&self.clone().into_primitive())
    }
    fn relayout(self, layout: &Layout) -> Result<Self> {
        layout.check_rank(D)?;
        Ok(Tensor::from_primitive(K::relayout(
            self.into_primitive(),
            layout,
        )?))
    }
    fn to_local_shards(self) -> Vec<Self::Local> {
        K::local_shards(self.into_primitive())
            .into_iter()
            .map(Tensor::from_primitive)
            .collect()
    }
    fn gather_to_process(self, process: usize) -> Result<Option<TensorData>> {
        let multi = DTensorExt::layout(&self).mesh.is_multi_process();
        let world = if multi {
            Some(crate::spmd::init()?)
        } else {
            None
        };
        let size = world.map_or(1, |w| w.size());
        if process >= size {
            return Err(DTensorError::NoSuchProcess { process, size });
        }
        match world.and_then(|w| w.process_group().map(|g| (w.rank(), g))) {
            None => Ok(Some(self.into_data())),
            Some((me, group)) => {
                let shape = self.dims().to_vec();
                let dtype = self.dtype();
                if matches!(dtype, burn::tensor::DType::QFloat(_)) {
                    return Err(DTensorError::Unsupported(
                        "a quantized tensor cannot be gathered to one process: dequantize it first"
                            .into(),
                    ));
                }
                let what = format!("the gather of {} to process {process}", self.describe());
                let mut layout = DTensorExt::layout(&self);
                let mut prim = self.into_primitive();
                if layout.is_partial() {
                    layout = layout.without_partial();
                    prim = K::relayout(prim, &layout)?;
                }
                let shards = K::local_shards(prim)
                    .into_iter()
                    .enumerate()
                    .map(|(j, p)| (layout.mesh.global(j), p));
                gather_shards(
                    &layout,
                    &shape,
                    dtype,
                    shards,
                    K::shard_into_host,
                    (me, process, group.as_ref()),
                    &what,
                )
            }
        }
    }
    fn describe(&self) -> String {
        DTensorExt::layout(self).describe(&dtype_name(self.dtype()), &self.dims())
    }
    fn sharding_table(&self, color: bool) -> String {
        crate::visualize::render(
            &DTensorExt::layout(self),
            &self.dims(),
            &dtype_name(self.dtype()),
            color,
        )
    }
}

/// The body of [`DTensorExt::gather_to_process`] across processes: `shards` are this process's
/// `(global position, shard)` of a settled `layout`; `to` is (this rank, the destination rank,
/// the world's process group).
fn gather_shards<P>(
    layout: &Layout,
    shape: &[usize],
    dtype: burn::tensor::DType,
    shards: impl Iterator<Item = (usize, P)>,
    download: impl Fn(P) -> TensorData,
    (me, process, group): (usize, usize, &dyn crate::spmd::ProcessGroup),
    what: &str,
) -> Result<Option<TensorData>> {
    let topo = &layout.mesh;
    let boxes: Vec<Vec<std::ops::Range<usize>>> = (0..topo.size())
        .map(|g| layout.shard_ranges(shape, g))
        .collect();
    // The first position (in mesh order) holding each distinct non-empty box sends it.
    let senders: Vec<usize> = (0..boxes.len())
        .filter(|&g| boxes[g].iter().all(|r| !r.is_empty()) && !boxes[..g].contains(&boxes[g]))
        .collect();
    let elem = dtype.size();
    let bytes = |g: usize| crate::host::box_numel(&boxes[g]) * elem;
    let mut mine: Vec<(usize, P)> = shards.filter(|(g, _)| senders.contains(g)).collect();
    mine.sort_by_key(|(g, _)| *g);
    let mut host: Vec<TensorData> = mine.into_iter().map(|(_, p)| download(p)).collect();
    // One shard (the usual case) is sent from its download, without a copy.
    let send: std::borrow::Cow<[u8]> = if host.len() == 1 {
        std::borrow::Cow::Borrowed(host[0].as_bytes())
    } else {
        let mut all = Vec::with_capacity(host.iter().map(|d| d.as_bytes().len()).sum());
        for d in host.drain(..) {
            all.extend_from_slice(d.as_bytes());
        }
        std::borrow::Cow::Owned(all)
    };
    // Sent in mesh order within each process; received in rank order.
    let from = |q: usize| {
        senders
            .iter()
            .copied()
            .filter(move |&g| topo.process_of(g) == q)
    };
    let size = group.size();
    let send_counts: Vec<usize> = (0..size)
        .map(|q| if q == process { send.len() } else { 0 })
        .collect();
    let recv_counts: Vec<usize> = (0..size)
        .map(|q| {
            if me == process {
                from(q).map(bytes).sum()
            } else {
                0
            }
        })
        .collect();
    // SAFETY: the engine writes all of `received` (`ProcessGroup`'s contract).
    let received = unsafe {
        crate::host::HostBuffer::received(recv_counts.iter().sum(), dtype, |recv| {
            group.all_to_all_into(&send, &send_counts, &recv_counts, recv, what)
        })
    };
    drop(send);
    drop(host);
    if me != process {
        return Ok(None);
    }
    let order: Vec<usize> = (0..size).flat_map(from).collect();
    let in_order: Vec<Vec<std::ops::Range<usize>>> =
        order.iter().map(|&g| boxes[g].clone()).collect();
    let whole = if crate::host::consecutive(shape, &in_order) {
        received // boxes that lie end to end (row blocks): the whole tensor as received
    } else {
        let mut at = 0;
        let pieces: Vec<_> = order
            .iter()
            .map(|&g| {
                at += bytes(g);
                (boxes[g].as_slice(), &received.as_bytes()[at - bytes(g)..at])
            })
            .collect();
        crate::host::assemble_bytes(shape, dtype, &pieces)
    };
    Ok(Some(whole.into_data(shape.to_vec(), dtype)))
}

/// `f32`, `i64`, `bool`: the dtype as written in [`DTensorExt::describe`].
fn dtype_name(d: burn::tensor::DType) -> String {
    format!("{d:?}").to_lowercase()
}

/// Sends host data to the mesh with each device receiving only its own chunk under `layout`
/// (TensorFlow DTensor's `pack` of a host batch, JAX's `device_put` with a `NamedSharding`): no
/// device ever holds the whole tensor unless the layout replicates it. The kind (float, int or
/// bool) is the result type's; the mesh is the layout's; the dtype is the one Burn's
/// `Tensor::from_data(data, &device)` gives on the mesh's device (its default for the kind,
/// `f32` / `i64` unless set with [`burn::tensor::set_default_dtypes`]), `data` converted as Burn
/// converts it: `distribute(data, layout)` is `Tensor::from_data(data, &device)` relaid out.
///
/// `data` has the **global** shape; device `i` receives
/// [`Layout::shard_ranges`]`(shape, i)` of it.
///
/// ```
/// use burn::backend::NdArray;
/// use burn::tensor::{Int, Tensor, TensorData};
/// use burn_dtensor::{DTensorExt, DistributedBackend, Layout, Mesh, distribute};
///
/// type B = DistributedBackend<NdArray>;
/// let mesh = Mesh::virtual_devices([("batch", 4)], burn::backend::ndarray::NdArrayDevice::Cpu)?;
/// let rows = Layout::batch_sharded(&mesh, "batch", 2)?;
/// let x: Tensor<B, 2> = distribute(TensorData::new(vec![0.0f32; 8 * 3], [8, 3]), &rows)?;
/// let y: Tensor<B, 1, Int> = distribute(TensorData::new(vec![1i64; 8], [8]), &rows.delete(&[1]))?;
/// assert_eq!(x.describe(), "f32[8@batch, 3]");
/// assert_eq!(y.to_local_shards()[3].dims(), [2]);
/// # Ok::<(), burn_dtensor::DTensorError>(())
/// ```
///
/// # Errors
/// [`DTensorError::RankMismatch`] when `data`'s rank is not `D` or not the layout's,
/// [`DTensorError::UnknownMesh`] when the layout's mesh is not a mesh of `B`'s inner devices.
pub fn distribute<B, const D: usize, K>(
    data: TensorData,
    layout: &Layout,
) -> Result<Tensor<B, D, K>>
where
    B: DistributedOps,
    K: DistributedKind<B>,
{
    if data.rank() != D {
        return Err(DTensorError::RankMismatch {
            layout_rank: D,
            tensor_rank: data.rank(),
        });
    }
    let mesh = mesh_of_layout::<B>(layout)?;
    let data = creation_data::<B, K>(data, &mesh);
    Ok(Tensor::from_primitive(K::distribute(data, layout)?))
}

/// `data` in the dtype Burn's `Tensor::<B, D, K>::from_data(data, &device)` gives a tensor on the
/// mesh's device (`DistributedDevice::new(mesh)`): its default dtype for the kind
/// ([`burn::tensor::set_default_dtypes`]; `f32` and `i64` unless set), converted as Burn
/// converts. Quantized data is kept as it is, as Burn keeps it. Without this, float data given
/// for an `Int` tensor, say, made an `Int` tensor of a float dtype.
fn creation_data<B: DistributedOps, K: BasicOps<B>>(
    data: TensorData,
    mesh: &Mesh<InnerDevice<B>>,
) -> TensorData {
    if matches!(data.dtype, burn::tensor::DType::QFloat(_)) {
        return data;
    }
    let device = crate::DistributedDevice::new(mesh.clone());
    // The settings are keyed by device, which `DistributedBackend<I>` and `Autodiff` over it
    // share: the same policy `Tensor::from_data` reads for `B`.
    let s = burn::tensor::get_device_settings::<DistributedBackend<B::Inner>>(&device);
    let dtype = match K::name() {
        "Float" => s.float_dtype.into(),
        "Int" => s.int_dtype.into(),
        _ => s.bool_dtype.into(),
    };
    data.convert_dtype(dtype)
}

/// Builds a distributed tensor of global shape `shape` from **this process's part** of the
/// data (JAX's `make_array_from_process_local_data`, the TF DTensor tutorial's
/// `repack_local_tensor`): in an SPMD run ([`crate::Mesh::spmd`]) each process passes only the
/// box of the global tensor its mesh positions cover ([`process_block`]), e.g. its slice of the
/// global batch, and no process ever holds the whole tensor. In one process the block is the
/// whole tensor and this is [`distribute`] (the same dtype too).
///
/// # Errors
/// [`DTensorError::ShardShapeMismatch`] (with `index` this process's rank) when `local` is not
/// the block's shape; [`DTensorError::Unsupported`] for a partial layout (give the settled value);
/// [`DTensorError::RankMismatch`].
pub fn distribute_local<B, const D: usize, K>(
    local: TensorData,
    shape: [usize; D],
    layout: &Layout,
) -> Result<Tensor<DistributedBackend<B>, D, K>>
where
    B: Backend,
    K: DistributedKind<DistributedBackend<B>> + BasicOps<B>,
    <K as BasicOps<B>>::Elem: burn::tensor::Element,
{
    layout.check_rank(D)?;
    if layout.is_partial() {
        return Err(DTensorError::Unsupported(
            "distribute_local takes settled values: give a layout without pending reductions"
                .into(),
        ));
    }
    let block = process_block(layout, &shape)?;
    let lens: Vec<usize> = block.iter().map(|r| r.len()).collect();
    if local.shape.to_vec() != lens {
        return Err(DTensorError::ShardShapeMismatch {
            index: crate::spmd::init()?.rank(),
            found: local.shape.to_vec(),
            expected: lens,
            global: shape.to_vec(),
        });
    }
    let mesh = mesh_of_layout::<DistributedBackend<B>>(layout)?;
    // The dtype `distribute` gives (Burn's creation rule on the mesh's device), for every shard.
    let local = creation_data::<DistributedBackend<B>, K>(local, &mesh);
    let dtype = local.dtype;
    let topo = &layout.mesh;
    let mut shards = Vec::with_capacity(topo.local_size());
    for (j, device) in mesh.devices().iter().enumerate() {
        let ranges: Vec<std::ops::Range<usize>> = layout
            .shard_ranges(&shape, topo.global(j))
            .into_iter()
            .zip(&block)
            .map(|(r, b)| r.start - b.start..r.end - b.start)
            .collect();
        let chunk = crate::host::extract(&local, &ranges)?;
        shards.push(Tensor::<B, D, K>::from_data(chunk, (device, dtype)));
    }
    from_local_shards(shards, shape, layout)
}

/// The box of a global tensor of `shape` that this process's mesh positions cover under
/// `layout` (one range per dim; the whole tensor in one process): what it passes to
/// [`distribute_local`].
///
/// # Errors
/// [`DTensorError::RankMismatch`] when `shape` does not have the layout's rank.
pub fn process_block(layout: &Layout, shape: &[usize]) -> Result<Vec<std::ops::Range<usize>>> {
    layout.check_rank(shape.len())?;
    let topo = &layout.mesh;
    Ok((0..shape.len())
        .map(|d| {
            let ranges = (0..topo.local_size())
                .map(|j| layout.shard_ranges(shape, topo.global(j))[d].clone());
            let start = ranges.clone().map(|r| r.start).min().unwrap_or(0);
            let end = ranges.map(|r| r.end).max().unwrap_or(0);
            start..end.max(start)
        })
        .collect())
}

/// Builds a distributed tensor of global shape `shape` from one inner tensor per mesh device
/// (TensorFlow DTensor's `pack`, PyTorch's `DTensor.from_local`), checked against `layout`:
/// shard `i` must be on the device of mesh position `i` ([`Mesh::devices`](crate::Mesh::devices);
/// JAX's `make_array_from_single_device_arrays` checks the same) and have the per-shard shape
/// `layout` gives device `i` (see [`Layout::shard_ranges`]). Replicated dims must hold equal
/// values on every device, which is not checked (as in PyTorch).
///
/// ```
/// use burn::backend::NdArray;
/// use burn::backend::ndarray::NdArrayDevice;
/// use burn::tensor::Tensor;
/// use burn_dtensor::{DTensorError, DTensorExt, Layout, Mesh, from_local_shards};
///
/// let mesh = Mesh::virtual_devices([("batch", 2)], NdArrayDevice::Cpu)?;
/// let rows = Layout::batch_sharded(&mesh, "batch", 2)?;
/// let dev = NdArrayDevice::Cpu;
/// // Global [3, 2] over 2 devices: 2 rows on device 0, 1 row on device 1.
/// let shards = vec![
///     Tensor::<NdArray, 2>::from_data([[1.0, 2.0], [3.0, 4.0]], &dev),
///     Tensor::<NdArray, 2>::from_data([[5.0, 6.0]], &dev),
/// ];
/// let x = from_local_shards(shards, [3, 2], &rows)?;
/// assert_eq!(x.describe(), "f32[3@batch, 2]");
/// assert_eq!(x.into_data().to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
/// // A shard of the wrong per-shard shape is refused.
/// let bad = vec![Tensor::<NdArray, 2>::zeros([1, 2], &dev); 2];
/// assert!(matches!(
///     from_local_shards(bad, [3, 2], &rows),
///     Err(DTensorError::ShardShapeMismatch { index: 0, .. })
/// ));
/// # Ok::<(), DTensorError>(())
/// ```
///
/// # Errors
/// [`DTensorError::ShardCountMismatch`] when `shards.len()` is not the mesh size,
/// [`DTensorError::ShardShapeMismatch`] for a shard of the wrong shape,
/// [`DTensorError::ShardDtypeMismatch`] for a shard of another dtype than the first,
/// [`DTensorError::ShardDeviceMismatch`] for a shard on another device than its mesh
/// position's ([`Mesh::devices`](crate::Mesh::devices)),
/// [`DTensorError::RankMismatch`] when the layout's rank is not `D`,
/// [`DTensorError::UnknownMesh`] when the layout's mesh is not a mesh of `B`'s devices.
pub fn from_local_shards<B, const D: usize, K>(
    shards: Vec<Tensor<B, D, K>>,
    shape: [usize; D],
    layout: &Layout,
) -> Result<Tensor<DistributedBackend<B>, D, K>>
where
    B: Backend,
    K: DistributedKind<DistributedBackend<B>> + BasicOps<B>,
    <K as BasicOps<B>>::Elem: burn::tensor::Element,
{
    layout.check_rank(D)?;
    let mesh = mesh_of_layout::<DistributedBackend<B>>(layout)?;
    let n = layout.mesh.local_size();
    if shards.len() != n {
        return Err(DTensorError::ShardCountMismatch {
            expected: n,
            given: shards.len(),
        });
    }
    let mut prims = Vec::with_capacity(n);
    for (i, s) in shards.iter().enumerate() {
        let expected = local_shape(layout, &shape, layout.mesh.global(i));
        if s.dims().to_vec() != expected {
            return Err(DTensorError::ShardShapeMismatch {
                index: i,
                found: s.dims().to_vec(),
                expected,
                global: shape.to_vec(),
            });
        }
        // Shards of two dtypes would fail deep inside the inner backend's first op on both.
        if s.dtype() != shards[0].dtype() {
            return Err(DTensorError::ShardDtypeMismatch {
                index: i,
                found: format!("{:?}", s.dtype()),
                expected: format!("{:?}", shards[0].dtype()),
            });
        }
        let (found, expected) = (s.device(), &mesh.devices()[i]);
        if &found != expected {
            return Err(DTensorError::ShardDeviceMismatch {
                index: i,
                found: format!("{found:?}"),
                expected: format!("{expected:?}"),
            });
        }
    }
    for s in shards {
        prims.push(s.into_primitive());
    }
    Ok(Tensor::from_primitive(K::from_local_shards(
        shape.to_vec(),
        layout,
        prims,
    )))
}
