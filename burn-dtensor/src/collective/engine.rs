//! The in-process collective engines: fused paths for the shards of one group that a process
//! holds, chosen when the mesh is built (from the inner device type and the crate's features),
//! and held by the mesh's [`MeshTopology`](crate::MeshTopology).
//!
//! The collective algorithms ([`super::generic`]) ask the mesh's [`LocalEngines`] first and fall
//! back to the inner backend's own ops (slice, cat, add, `to_device`) when no engine applies.
//! Each engine is one file implementing [`LocalEngine`]; adding one is that file plus one line in
//! [`LocalEngines::for_device`], the only place that looks at features. The cross-process
//! engine (MPI) sits behind the other trait, [`crate::spmd::ProcessGroup`].
//!
//! Engines see type-erased primitives (`&dyn Any`): each checks the concrete type itself and
//! declines (`None`) what it does not handle (another backend, a fusion wrapper, a dtype, empty
//! or mixed-device shards), so a decline is never an error, only the generic path.

use std::any::{Any, TypeId};
use std::fmt;
use std::sync::Arc;

use crate::error::{DTensorError, Result};
use crate::layout::ReduceOp;
use crate::spmd::ProcessGroup;

/// A fused in-process collective step. Every method returns `None` when the engine does not
/// apply to these primitives; the default implementations never apply.
pub(crate) trait LocalEngine: Send + Sync + 'static {
    /// A short name (`"cubecl-wgpu"`, `"nccl"`): the mesh's `Debug` and equality use it.
    fn name(&self) -> &'static str;
    /// The element-wise `op`-reduction of `parts` (same shape, same device) as one primitive.
    fn reduce(&self, _parts: &[&dyn Any], _op: ReduceOp) -> Option<Box<dyn Any>> {
        None
    }
    /// The concatenation of non-empty `parts` (same device) along `dim`.
    fn cat(&self, _parts: &[&dyn Any], _dim: usize) -> Option<Box<dyn Any>> {
        None
    }
    /// An all-reduce of `members`, one primitive per member device (distinct devices): each
    /// member's result, in order.
    fn all_reduce(&self, _members: &[&dyn Any], _op: ReduceOp) -> Option<Vec<Box<dyn Any>>> {
        None
    }
}

/// The in-process engines of a mesh, tried in order (empty: the generic path only).
#[derive(Clone, Default)]
pub struct LocalEngines(Arc<[Arc<dyn LocalEngine>]>);

fn unerase<P: 'static>(b: Box<dyn Any>) -> P {
    *b.downcast::<P>()
        .expect("burn-dtensor: an in-process collective engine returned another primitive type")
}

impl LocalEngines {
    /// The engines for meshes of inner device type `D`, as the enabled features provide them:
    /// CubeCL kernels for `WgpuDevice` (feature `wgpu`) and `CudaDevice` (feature `cuda`), NCCL
    /// across CUDA devices (feature `nccl`).
    pub(crate) fn for_device<D: 'static>() -> Self {
        #[allow(unused_mut)]
        let mut v: Vec<Arc<dyn LocalEngine>> = Vec::new();
        let is = |t: TypeId| TypeId::of::<D>() == t;
        let _ = &is;
        #[cfg(all(feature = "cuda", feature = "nccl"))]
        if is(TypeId::of::<cubecl::cuda::CudaDevice>()) {
            v.push(Arc::new(super::nccl::Nccl));
        }
        #[cfg(feature = "cuda")]
        if is(TypeId::of::<cubecl::cuda::CudaDevice>()) {
            v.push(Arc::new(super::cube::CubeKernels::<
                cubecl::cuda::CudaRuntime,
            >::new("cubecl-cuda")));
        }
        #[cfg(feature = "wgpu")]
        if is(TypeId::of::<burn::backend::wgpu::WgpuDevice>()) {
            v.push(Arc::new(super::cube::CubeKernels::<
                burn::backend::wgpu::WgpuRuntime,
            >::new("cubecl-wgpu")));
        }
        Self(v.into())
    }
    /// The names of the engines, in the order they are tried.
    pub fn names(&self) -> Vec<&'static str> {
        self.0.iter().map(|e| e.name()).collect()
    }
    fn erase<P: 'static>(parts: &[P]) -> Vec<&dyn Any> {
        parts.iter().map(|p| p as &dyn Any).collect()
    }
    /// [`LocalEngine::reduce`] of the first engine that applies.
    pub(crate) fn reduce<P: 'static>(&self, parts: &[P], op: ReduceOp) -> Option<P> {
        if self.0.is_empty() {
            return None;
        }
        let refs = Self::erase(parts);
        self.0.iter().find_map(|e| e.reduce(&refs, op)).map(unerase)
    }
    /// [`LocalEngine::cat`] of the first engine that applies.
    pub(crate) fn cat<P: 'static>(&self, parts: &[P], dim: usize) -> Option<P> {
        if self.0.is_empty() {
            return None;
        }
        let refs = Self::erase(parts);
        self.0.iter().find_map(|e| e.cat(&refs, dim)).map(unerase)
    }
    /// [`LocalEngine::all_reduce`] of the first engine that applies.
    pub(crate) fn all_reduce<P: 'static>(&self, members: &[P], op: ReduceOp) -> Option<Vec<P>> {
        if self.0.is_empty() {
            return None;
        }
        let refs = Self::erase(members);
        self.0
            .iter()
            .find_map(|e| e.all_reduce(&refs, op))
            .map(|v| v.into_iter().map(unerase).collect())
    }
}

impl fmt::Debug for LocalEngines {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

impl PartialEq for LocalEngines {
    fn eq(&self, other: &Self) -> bool {
        self.names() == other.names()
    }
}

impl Eq for LocalEngines {}

impl std::hash::Hash for LocalEngines {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.names().hash(state)
    }
}

/// Makes the process group of one mesh axis from its bootstrap (MPI) group: the cross-process
/// engine. Called collectively by the group's members when the mesh is built.
pub(crate) type AcrossWrap =
    Arc<dyn Fn(Arc<dyn ProcessGroup>) -> Result<Arc<dyn ProcessGroup>> + Send + Sync>;

/// The cross-process engine for a multi-process mesh whose process holds `devices`:
/// `BURN_DTENSOR_SPMD_ENGINE` = `mpi` (the default: MPI itself, host memory) or `nccl` (features
/// `nccl` and `mpi`; CUDA meshes, one device per process: [`super::nccl_process`]). Returns the
/// engine's name (agreed on by every process with the mesh) and the wrap that makes an axis
/// group, `None` for MPI's own groups.
///
/// # Errors
/// [`DTensorError::Spmd`] for an unknown engine name, `nccl` without the features, or a mesh
/// NCCL cannot serve (not CUDA, several devices per process).
pub(crate) fn across_engine<D: 'static>(
    devices: &[D],
) -> Result<(&'static str, Option<AcrossWrap>)> {
    let _ = devices;
    match std::env::var("BURN_DTENSOR_SPMD_ENGINE").as_deref() {
        Err(_) | Ok("") | Ok("mpi") => Ok(("mpi", None)),
        #[cfg(all(feature = "nccl", feature = "mpi"))]
        Ok("nccl") => {
            let ordinal = super::nccl_process::ordinal_of(devices)?;
            let wrap: AcrossWrap = Arc::new(move |g| {
                Ok(Arc::new(super::nccl_process::over(g, ordinal)?) as Arc<dyn ProcessGroup>)
            });
            Ok(("nccl", Some(wrap)))
        }
        #[cfg(not(all(feature = "nccl", feature = "mpi")))]
        Ok("nccl") => Err(DTensorError::Spmd(
            "BURN_DTENSOR_SPMD_ENGINE=nccl: burn-dtensor was built without NCCL across \
             processes; rebuild with `--features nccl,mpi`"
                .into(),
        )),
        Ok(other) => Err(DTensorError::Spmd(format!(
            "BURN_DTENSOR_SPMD_ENGINE={other}: unknown engine; use `mpi` (the default) or `nccl`"
        ))),
    }
}
