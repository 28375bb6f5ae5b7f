//! Where a created tensor lives: the layout that every creation op (`from_data`, `zeros`,
//! `ones`, `full`, `empty`, random, `arange`) gives its result, so that each process allocates
//! and fills only the shards it holds, never the whole tensor.
//!
//! Two sources, in order:
//! 1. a **scoped creation layout** ([`with_creation_layout`]): inside the closure, a tensor
//!    created on the layout's mesh with exactly the given global shape gets that layout (this is
//!    how [`LayoutMap::apply`](crate::LayoutMap::apply) materialises each parameter of a module
//!    directly in its target layout, JAX's `jit(init, out_shardings=...)`);
//! 2. the mesh's creation-layout policy ([`Mesh::with_creation_sharding`](crate::Mesh::with_creation_sharding)),
//!    replicated by default.

use std::cell::RefCell;
use std::sync::Arc;

use crate::error::{DTensorError, Result};
use crate::layout::Layout;
use crate::mesh::{Mesh, MeshTopology};

thread_local! {
    /// The scoped creation layouts of this thread, innermost last: (global shape, layout).
    static SCOPES: RefCell<Vec<(Vec<usize>, Layout)>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with tensors of global `shape` created on `layout`'s mesh laid out by `layout`
/// (directly: each device allocates and fills only its shard). Creations of other shapes, or on
/// other meshes, follow the mesh's creation policy as usual; scopes nest (the innermost matching
/// one wins) and end with `f`, also on a panic. The scope is per thread.
///
/// Values do not depend on the layout: `zeros`, `full`, `from_data` are the same tensor, and a
/// random creation draws the same values for every layout (see [`crate::random`]).
///
/// # Errors
/// [`DTensorError::RankMismatch`] when `shape` does not fit the layout's rank, and partial
/// layouts ([`DTensorError::Unsupported`]): a created tensor is settled.
///
/// ```
/// use burn::backend::NdArray;
/// use burn::tensor::{Distribution, Tensor};
/// use burn_dtensor::{DTensorExt, DistributedBackend, DistributedDevice, Layout, Mesh, with_creation_layout};
///
/// type B = DistributedBackend<NdArray>;
/// let mesh = Mesh::virtual_devices([("model", 4)], Default::default()).unwrap();
/// let device = DistributedDevice::new(mesh.clone());
/// let layout = Layout::new(&mesh, ["unsharded", "model"]).unwrap();
/// let w = with_creation_layout(&layout, &[8, 12], || {
///     Tensor::<B, 2>::random([8, 12], Distribution::Default, &device)
/// })
/// .unwrap();
/// assert_eq!(w.layout(), layout); // each device drew only its [8, 3] shard
/// ```
pub fn with_creation_layout<R>(
    layout: &Layout,
    shape: &[usize],
    f: impl FnOnce() -> R,
) -> Result<R> {
    layout.check_rank(shape.len())?;
    if layout.is_partial() {
        return Err(DTensorError::Unsupported(format!(
            "a creation layout must be settled, got the partial layout {layout}; create the tensor settled and relayout it"
        )));
    }
    struct Pop;
    impl Drop for Pop {
        fn drop(&mut self) {
            SCOPES.with(|s| s.borrow_mut().pop());
        }
    }
    SCOPES.with(|s| s.borrow_mut().push((shape.to_vec(), layout.clone())));
    let _pop = Pop;
    Ok(f())
}

/// The layout of a tensor of global `shape` created on `mesh` now: the innermost scoped
/// creation layout of that shape and mesh, else the mesh's creation policy.
pub(crate) fn layout_for(mesh: &Arc<MeshTopology>, shape: &[usize]) -> Layout {
    let scoped = SCOPES.with(|s| {
        s.borrow()
            .iter()
            .rev()
            .find(|(sh, l)| sh == shape && l.mesh.id == mesh.id)
            .map(|(_, l)| l.clone())
    });
    scoped.unwrap_or_else(|| Layout::created_on(mesh, shape.len()))
}

impl<D: Clone + PartialEq + Send + Sync + 'static> Mesh<D> {
    /// The same mesh with a *creation-layout policy*: every tensor created on it (from data,
    /// `zeros`, `ones`, `full`, `empty`, random) has global dim `i` sharded over mesh axis
    /// `spec[i]` (or unsharded for [`UNSHARDED`](crate::UNSHARDED)); dims beyond `spec`, and
    /// tensors of lower rank, keep the rest unsharded. Each device then receives only its chunk
    /// (uneven or empty chunks when a dim is smaller than or not divisible by its axis).
    ///
    /// This shards a whole program without touching it: `Tensor::from_data(data, &device)` with
    /// `device = DistributedDevice::new(mesh.with_creation_sharding(["a", "b"])?)` starts every
    /// computation on sharded tensors (the conformance suite runs Burn's tests this way). Results
    /// are unchanged: a layout never changes values. An empty `spec` gives back the replicated
    /// policy. The variants are distinct meshes (tensors move between them with `to_device` or `relayout`).
    ///
    /// # Errors
    /// [`DTensorError::UnknownAxis`] for a name the mesh lacks, [`DTensorError::AxisUsedTwice`]
    /// when an axis shards two dims, [`DTensorError::TooManyMeshes`] (see
    /// [`crate::MAX_MESHES`]).
    pub fn with_creation_sharding<S: AsRef<str>>(
        &self,
        spec: impl IntoIterator<Item = S>,
    ) -> Result<Self> {
        let layout = Layout::new(self, spec)?;
        let mut creation = layout.dims.to_vec();
        while creation.last() == Some(&None) {
            creation.pop();
        }
        Self::intern(
            self.topo.axes.clone(),
            self.devices.to_vec(),
            self.topo.stacked,
            creation,
            self.topo.grid.clone(),
        )
    }
}
