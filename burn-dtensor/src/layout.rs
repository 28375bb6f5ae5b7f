//! Layouts (sharding specs): for each tensor dim, the mesh axis that shards it (or none), and
//! for each mesh axis, an optional pending reduction (a *partial* result).
//!
//! This is TensorFlow DTensor's `Layout` extended with PyTorch DTensor's `Partial` placement:
//! a matmul whose contracting dim is sharded yields a partial sum that is only reduced
//! (all-reduce or reduce-scatter) when a consumer needs it.

use std::fmt;
use std::sync::Arc;

use crate::error::{DTensorError, Result};
use crate::mesh::{Mesh, MeshTopology};

pub use crate::mesh::UNSHARDED;

pub use crate::collective::interface::ReduceOp;

/// Per-dim placement.
pub type DimSpec = Option<usize>;

/// One [`DimSpec`] per tensor dim, inline up to rank 6 (layouts are built for every op, so they
/// avoid the heap).
pub(crate) type DimSpecs = smallvec::SmallVec<[DimSpec; 6]>;
/// One pending reduction (or none) per mesh axis, inline up to 4 axes.
pub(crate) type Partials = smallvec::SmallVec<[Option<ReduceOp>; 4]>;

/// A tensor's layout on a mesh: one entry per tensor dim (`None` = unsharded, `Some(a)` = sharded
/// over mesh axis `a`, each axis at most once) and, per mesh axis, an optional pending reduction.
///
/// Sharding uses *chunk semantics* that also cover sizes not divisible by the axis size: a dim of
/// global size `n` over an axis of size `k` gives shard `i` the range starting at
/// `i * (n / k) + min(i, n % k)` of length `n / k + (i < n % k)`: the first `n % k` shards are one
/// element larger (see [`Layout::shard_ranges`]). Every op stays exact on such uneven shards.
///
/// ```
/// use burn_dtensor::{DTensorError, Layout, Mesh};
/// let mesh = Mesh::virtual_devices([("batch", 4), ("model", 2)], ())?;
/// // Global [10, 6]: rows over `batch` (10 = 3+3+2+2, uneven), columns over `model`.
/// let l = Layout::new(&mesh, ["batch", "model"])?;
/// assert_eq!(l.shard_ranges(&[10, 6], 0), vec![0..3, 0..3]); // device 0 = (batch 0, model 0)
/// assert_eq!(l.shard_ranges(&[10, 6], 7), vec![8..10, 3..6]); // device 7 = (batch 3, model 1)
/// assert_eq!(l.shard_shape(&[10, 6], 5), vec![2, 3]);
/// // Bad specs are typed errors that name the problem.
/// assert!(matches!(Layout::new(&mesh, ["batch", "batch"]), Err(DTensorError::AxisUsedTwice { .. })));
/// assert!(matches!(Layout::new(&mesh, ["rows", "unsharded"]), Err(DTensorError::UnknownAxis { .. })));
/// # Ok::<(), DTensorError>(())
/// ```
#[derive(PartialEq, Eq)]
pub struct Layout {
    pub(crate) mesh: Arc<MeshTopology>,
    pub(crate) dims: DimSpecs,
    pub(crate) partial: Partials,
}

/// Copies the inline dims and partials as slices (`SmallVec`'s own `Clone` extends item by
/// item; layouts are cloned several times per op).
impl Clone for Layout {
    fn clone(&self) -> Self {
        Self {
            mesh: self.mesh.clone(),
            dims: DimSpecs::from_slice(&self.dims),
            partial: Partials::from_slice(&self.partial),
        }
    }
}

/// Hashes the mesh by its id, not its contents (equal layouts have equal meshes, so equal ids:
/// consistent with `Eq`). The derived hash walked the whole topology (axis names, process grid,
/// engines) on every relayout plan lookup: 1.6-1.9% of the spatial IMDB step (NOTES.md, session
/// 35).
impl std::hash::Hash for Layout {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.mesh.id.hash(state);
        self.dims.hash(state);
        self.partial.hash(state);
    }
}

impl fmt::Debug for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl Layout {
    /// Appends this layout to a memo key ([`crate::memo`]): the mesh's interned id, then each
    /// dim's axis and each axis's pending reduction (`usize::MAX` for none).
    pub(crate) fn push_key(&self, key: &mut crate::memo::Key) {
        key.push(self.mesh.id as usize);
        key.push(self.dims.len());
        key.extend(self.dims.iter().map(|d| d.unwrap_or(usize::MAX)));
        key.extend(
            self.partial
                .iter()
                .map(|p| p.map_or(usize::MAX, |op| op as usize)),
        );
    }

    /// A layout from one entry per tensor dim: [`UNSHARDED`] or a mesh axis name.
    ///
    /// # Errors
    /// [`DTensorError::UnknownAxis`] for a name the mesh lacks, [`DTensorError::AxisUsedTwice`]
    /// when an axis shards two dims.
    pub fn new<D, S: AsRef<str>>(
        mesh: &Mesh<D>,
        spec: impl IntoIterator<Item = S>,
    ) -> Result<Self> {
        Self::from_topology(mesh.topology(), spec)
    }

    /// As [`Layout::new`], from a mesh topology.
    ///
    /// # Errors
    /// As [`Layout::new`].
    pub fn from_topology<S: AsRef<str>>(
        mesh: &Arc<MeshTopology>,
        spec: impl IntoIterator<Item = S>,
    ) -> Result<Self> {
        let mut dims = Vec::new();
        for (d, s) in spec.into_iter().enumerate() {
            let s = s.as_ref();
            if s == UNSHARDED {
                dims.push(None);
                continue;
            }
            let a = mesh.axis_index(s)?;
            if let Some(prev) = dims.iter().position(|x| *x == Some(a)) {
                return Err(DTensorError::AxisUsedTwice {
                    axis: s.to_string(),
                    first: prev,
                    second: d,
                });
            }
            dims.push(Some(a));
        }
        Ok(Self {
            mesh: mesh.clone(),
            partial: smallvec::smallvec![None; mesh.ndim()],
            dims: dims.into(),
        })
    }

    /// Every dim unsharded (each device holds the whole tensor).
    pub fn replicated<D>(mesh: &Mesh<D>, rank: usize) -> Self {
        Self::replicated_on(mesh.topology(), rank)
    }

    pub(crate) fn replicated_on(mesh: &Arc<MeshTopology>, rank: usize) -> Self {
        Self {
            mesh: mesh.clone(),
            dims: smallvec::smallvec![None; rank],
            partial: smallvec::smallvec![None; mesh.ndim()],
        }
    }

    /// The layout of a tensor of rank `rank` created on `mesh`: its creation-layout policy
    /// ([`Mesh::with_creation_sharding`]) applied to the leading dims, replicated otherwise.
    pub fn created_on(mesh: &Arc<MeshTopology>, rank: usize) -> Self {
        let mut l = Self::replicated_on(mesh, rank);
        for (d, a) in mesh.creation.iter().enumerate().take(rank) {
            l.dims[d] = *a;
        }
        l
    }

    /// [`Layout::replicated_on`] `layout`'s mesh for a rank-`rank` tensor: `layout` itself when it
    /// already is that layout (no allocation: the one-device path's common case).
    pub(crate) fn replicated_like(layout: Arc<Self>, rank: usize) -> Arc<Self> {
        if layout.rank() == rank && layout.is_replicated() {
            layout
        } else {
            Arc::new(Self::replicated_on(&layout.mesh, rank))
        }
    }

    /// Dim 0 sharded over `axis`, the rest unsharded (TensorFlow DTensor's `Layout.batch_sharded`).
    ///
    /// # Errors
    /// [`DTensorError::UnknownAxis`]; [`DTensorError::RankMismatch`] for `rank` 0 (a scalar has
    /// no batch dim: its layout is [`Layout::replicated`]).
    pub fn batch_sharded<D>(mesh: &Mesh<D>, axis: &str, rank: usize) -> Result<Self> {
        let a = mesh.topology().axis_index(axis)?;
        if rank == 0 {
            return Err(DTensorError::RankMismatch {
                layout_rank: 1,
                tensor_rank: 0,
            });
        }
        Ok(Self::replicated(mesh, rank).set_dim(0, Some(a)))
    }

    /// The layout with the given tensor dims removed (TensorFlow DTensor's `Layout.delete`), e.g.
    /// the layout of a reduction's output.
    pub fn delete(&self, dims: &[usize]) -> Self {
        let mut l = self.clone();
        l.dims = self
            .dims
            .iter()
            .enumerate()
            .filter(|(d, _)| !dims.contains(d))
            .map(|(_, s)| *s)
            .collect();
        l
    }

    /// Tensor rank.
    pub fn rank(&self) -> usize {
        self.dims.len()
    }
    /// The mesh topology.
    pub fn mesh(&self) -> &Arc<MeshTopology> {
        &self.mesh
    }
    /// Per-dim mesh axis index (`None` = unsharded).
    pub fn dims(&self) -> &[DimSpec] {
        &self.dims
    }
    /// The mesh axis sharding tensor dim `d`.
    pub fn dim_axis(&self, d: usize) -> Option<usize> {
        self.dims[d]
    }
    /// The tensor dim sharded by mesh axis `a`, if any.
    pub fn axis_dim(&self, a: usize) -> Option<usize> {
        self.dims.iter().position(|x| *x == Some(a))
    }
    /// The pending reduction on mesh axis `a`.
    pub fn partial(&self, a: usize) -> Option<ReduceOp> {
        self.partial[a]
    }
    /// Whether any mesh axis holds a pending reduction.
    pub fn is_partial(&self) -> bool {
        self.partial.iter().any(Option::is_some)
    }
    /// Whether no dim is sharded and nothing is pending.
    pub fn is_replicated(&self) -> bool {
        self.dims.iter().all(Option::is_none) && !self.is_partial()
    }
    /// The same layout with every pending reduction dropped (what a consumer sees once reduced).
    pub fn without_partial(&self) -> Self {
        let mut l = self.clone();
        l.partial.iter_mut().for_each(|p| *p = None);
        l
    }
    /// The same layout without the pending reductions on the axes pending in `settled` (what a
    /// consumer sees once those are reduced; the others stay pending).
    pub(crate) fn without_partial_on(&self, settled: &Partials) -> Self {
        let mut l = self.clone();
        for (p, s) in l.partial.iter_mut().zip(settled) {
            if s.is_some() {
                *p = None;
            }
        }
        l
    }
    /// Whether every reduction pending in `pending` is still pending here.
    pub(crate) fn keeps_partial(&self, pending: &Partials) -> bool {
        pending
            .iter()
            .zip(&self.partial)
            .all(|(i, o)| i.is_none() || i == o)
    }
    /// Marks mesh axis `a` (its index in the mesh) as holding a pending `op` reduction. The
    /// checked form, by axis name, is [`Layout::with_partial_on`].
    ///
    /// # Panics
    /// When axis `a` also shards a dim (an axis is either sharding or pending, never both), or
    /// is not an axis of the mesh.
    pub fn with_partial(mut self, a: usize, op: ReduceOp) -> Self {
        assert!(
            a < self.mesh.ndim(),
            "mesh axis {a} is not an axis of the mesh {} (axes 0..{})",
            self.mesh,
            self.mesh.ndim()
        );
        assert!(
            self.axis_dim(a).is_none(),
            "mesh axis {a} cannot be both sharding and partial"
        );
        self.partial[a] = Some(op);
        self
    }
    /// The layout with mesh axis `axis` holding a pending `op` reduction (PyTorch's
    /// `Partial(op)` placement on that mesh dim): each shard holds a term, and the tensor's
    /// value is their reduction over the axis.
    ///
    /// ```
    /// use burn_dtensor::{DTensorError, Layout, Mesh, ReduceOp};
    ///
    /// let mesh = Mesh::virtual_devices([("batch", 2), ("model", 2)], ())?;
    /// let l = Layout::new(&mesh, ["batch", "unsharded"])?.with_partial_on("model", ReduceOp::Sum)?;
    /// assert_eq!(l.to_string(), "[batch, unsharded]{partial sum@model} on batch=2,model=2");
    /// assert_eq!(l.partial(1), Some(ReduceOp::Sum));
    /// assert!(matches!(
    ///     Layout::new(&mesh, ["batch", "unsharded"])?.with_partial_on("batch", ReduceOp::Sum),
    ///     Err(DTensorError::Unsupported(_))
    /// ));
    /// # Ok::<(), DTensorError>(())
    /// ```
    ///
    /// # Errors
    /// [`DTensorError::UnknownAxis`] when the mesh has no axis `axis`;
    /// [`DTensorError::Unsupported`] when `axis` shards a dim of the layout (an axis is either
    /// sharding or pending, never both).
    pub fn with_partial_on(self, axis: &str, op: ReduceOp) -> Result<Self> {
        let a = self.mesh.axis_index(axis)?;
        if let Some(d) = self.axis_dim(a) {
            return Err(DTensorError::Unsupported(format!(
                "mesh axis `{axis}` shards dim {d} of the layout {self} and cannot also hold a \
                 pending reduction: unshard that dim first (`with_dim({d}, None)`)"
            )));
        }
        Ok(self.with_partial(a, op))
    }
    /// The layout with tensor dim `d` sharded over mesh axis `axis` (its index in the mesh), or
    /// unsharded with `None`; the other dims as they are.
    ///
    /// # Errors
    /// [`DTensorError::RankMismatch`] when `d` is not a dim of the layout,
    /// [`DTensorError::UnknownAxis`] when `axis` is not an axis of the mesh,
    /// [`DTensorError::AxisUsedTwice`] when `axis` already shards another dim,
    /// [`DTensorError::Unsupported`] when `axis` holds a pending reduction (settle it first).
    pub fn with_dim(self, d: usize, axis: Option<usize>) -> Result<Self> {
        if d >= self.rank() {
            return Err(DTensorError::RankMismatch {
                layout_rank: self.rank(),
                tensor_rank: d + 1,
            });
        }
        if let Some(a) = axis {
            let Some((name, _)) = self.mesh.axes().get(a) else {
                return Err(self.mesh.unknown_axis(format!("#{a}")));
            };
            if let Some(other) = self.axis_dim(a).filter(|&o| o != d) {
                return Err(DTensorError::AxisUsedTwice {
                    axis: name.clone(),
                    first: other.min(d),
                    second: other.max(d),
                });
            }
            if self.partial(a).is_some() {
                return Err(DTensorError::Unsupported(format!(
                    "mesh axis `{name}` holds a pending reduction and cannot also shard dim {d}: \
                     settle it first (`without_partial`, or relayout the tensor)"
                )));
            }
        }
        Ok(self.set_dim(d, axis))
    }
    /// [`Layout::with_dim`] unchecked: for the sharding rules, which build valid layouts (an
    /// intermediate of a chain of calls may not be).
    pub(crate) fn set_dim(mut self, d: usize, axis: Option<usize>) -> Self {
        self.dims[d] = axis;
        self
    }
    /// The layout in user terms: one entry per dim, [`UNSHARDED`] or the axis name.
    pub fn sharding_spec(&self) -> Vec<String> {
        self.dims
            .iter()
            .map(|s| {
                s.map_or(UNSHARDED.to_string(), |a| {
                    self.mesh.axis_name(a).to_string()
                })
            })
            .collect()
    }
    /// The range of each global dim that mesh device `device` (flat index, row-major) holds
    /// of a tensor of global shape `shape` under this layout: the whole extent on unsharded
    /// dims, its chunk on sharded ones (chunk semantics, see [`Layout`]; possibly empty).
    ///
    /// # Panics
    /// When `shape` does not have the layout's rank, or `device` is not below the mesh size
    /// (as an index out of bounds would; [`Layout::check_rank`] checks the rank first).
    pub fn shard_ranges(&self, shape: &[usize], device: usize) -> Vec<std::ops::Range<usize>> {
        self.assert_shard_of(shape, device);
        local_ranges(self, shape, device)
    }
    /// The per-shard shape of mesh device `device` (the lengths of [`Layout::shard_ranges`]).
    ///
    /// # Panics
    /// As [`Layout::shard_ranges`].
    pub fn shard_shape(&self, shape: &[usize], device: usize) -> Vec<usize> {
        self.assert_shard_of(shape, device);
        local_shape(self, shape, device)
    }
    /// The checks of [`Layout::shard_ranges`]: without them a wrong rank or device gave ranges
    /// of another shard, or of fewer dims, without a word.
    fn assert_shard_of(&self, shape: &[usize], device: usize) {
        assert!(
            shape.len() == self.rank(),
            "shape {shape:?} has rank {}, the layout {self} has {} dims",
            shape.len(),
            self.rank()
        );
        assert!(
            device < self.mesh.size(),
            "device {device} is not a position of the mesh {} ({} devices)",
            self.mesh,
            self.mesh.size()
        );
    }
    /// Checks that this layout fits a tensor of the given rank.
    ///
    /// # Errors
    /// [`DTensorError::RankMismatch`].
    pub fn check_rank(&self, rank: usize) -> Result<()> {
        if rank != self.rank() {
            return Err(DTensorError::RankMismatch {
                layout_rank: self.rank(),
                tensor_rank: rank,
            });
        }
        Ok(())
    }
    /// Formats the layout with a global shape and dtype, JAX style: `f32[64@batch, 1200]`,
    /// with pending reductions appended as `{partial sum@model}`.
    pub fn describe(&self, dtype: &str, shape: &[usize]) -> String {
        let dims: Vec<String> = self
            .dims
            .iter()
            .zip(shape)
            .map(|(s, n)| match s {
                Some(a) => format!("{n}@{}", self.mesh.axis_name(*a)),
                None => n.to_string(),
            })
            .collect();
        format!("{dtype}[{}]{}", dims.join(", "), self.partial_suffix())
    }
    fn partial_suffix(&self) -> String {
        let p: Vec<String> = self
            .partial
            .iter()
            .enumerate()
            .filter_map(|(a, p)| {
                p.map(|op| {
                    format!(
                        "partial {}@{}",
                        format!("{op:?}").to_lowercase(),
                        self.mesh.axis_name(a)
                    )
                })
            })
            .collect();
        if p.is_empty() {
            String::new()
        } else {
            format!("{{{}}}", p.join(", "))
        }
    }
}

impl fmt::Display for Layout {
    /// `[batch, unsharded] on batch=4,model=2` plus pending reductions.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[{}]{} on {}",
            self.sharding_spec().join(", "),
            self.partial_suffix(),
            self.mesh
        )
    }
}

/// For device `flat` of the layout's mesh, the range of each global dim it holds.
pub(crate) fn local_ranges(
    layout: &Layout,
    shape: &[usize],
    flat: usize,
) -> Vec<std::ops::Range<usize>> {
    layout
        .dims
        .iter()
        .zip(shape)
        .map(|(s, &n)| match s {
            Some(a) => {
                crate::shard::chunk(n, layout.mesh.axis_size(*a), layout.mesh.coord(flat, *a))
            }
            None => 0..n,
        })
        .collect()
}

/// The per-shard shape of device `flat`.
pub(crate) fn local_shape(layout: &Layout, shape: &[usize], flat: usize) -> Vec<usize> {
    local_ranges(layout, shape, flat)
        .into_iter()
        .map(|r| r.len())
        .collect()
}

/// Whether some device holds an empty shard (a sharded dim smaller than its axis).
pub(crate) fn has_empty_shard(layout: &Layout, shape: &[usize]) -> bool {
    layout
        .dims
        .iter()
        .zip(shape)
        .any(|(s, &n)| s.is_some_and(|a| n < layout.mesh.axis_size(a)))
}

/// Whether every sharded dim divides evenly by its axis size.
pub(crate) fn is_even(layout: &Layout, shape: &[usize]) -> bool {
    layout
        .dims
        .iter()
        .zip(shape)
        .all(|(s, &n)| s.is_none_or(|a| n % layout.mesh.axis_size(a) == 0))
}
