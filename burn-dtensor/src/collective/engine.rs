//! Where engines are chosen, the one file that looks at the crate's engine features: the
//! in-process engines of a mesh ([`LocalEngines::for_device`]: fused paths for the shards of one
//! group that a process holds, chosen when the mesh is built from the inner device type, and
//! held by the mesh's [`MeshTopology`](crate::MeshTopology)); the engine that starts the
//! process world ([`start_world`]: MPI); and the cross-process engine of a multi-process
//! mesh's axis groups ([`across_engine`]: MPI or NCCL, from [`crate::Config`]).
//!
//! The collective algorithms ([`super::generic`]) ask the mesh's [`LocalEngines`] first and fall
//! back to the inner backend's own ops (slice, cat, add, `to_device`) when no engine applies.
//! Each engine is one file implementing [`LocalEngine`] or [`ProcessGroup`]
//! (`super::interface`); adding one is that file plus one line here. A non-MPI world engine
//! (TCP, say) would be one `ProcessGroup` file and one line in [`start_world`].
//!
//! Engines see type-erased primitives (`&dyn Any`): each checks the concrete type itself and
//! declines (`None`) what it does not handle (another backend, a fusion wrapper, a dtype, empty
//! or mixed-device shards), so a decline is never an error, only the generic path.

use std::any::{Any, TypeId};
use std::fmt;
use std::sync::Arc;

use super::interface::{LocalEngine, ProcessGroup, ReduceOp};
use crate::config::{ProcessEngine, try_config};
use crate::error::Result;

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

/// Starts the engine of the process world (a multi-process launch, [`crate::spmd::init`]):
/// MPI (feature `mpi`), which also bootstraps every other cross-process engine.
///
/// # Errors
/// [`crate::DTensorError::Spmd`] when MPI fails to start, or in a build without the `mpi` feature
/// (never reached there: [`crate::spmd::LaunchEnv::joinable`] refuses the launch first).
pub(crate) fn start_world() -> Result<Arc<dyn ProcessGroup>> {
    #[cfg(feature = "mpi")]
    return super::mpi::world();
    #[cfg(not(feature = "mpi"))]
    Err(crate::DTensorError::Spmd(
        "no cross-process engine in this build: rebuild with `--features mpi`".into(),
    ))
}

/// The cross-process engine for a multi-process mesh whose process holds `devices`:
/// [`Config::process_engine`](crate::Config::process_engine) = MPI (the default: MPI itself,
/// host memory) or NCCL (features `nccl` and `mpi`; CUDA meshes, one device per process:
/// `super::nccl_process`). Returns the engine's name (agreed on by every process with the mesh)
/// and the wrap that makes an axis group, `None` for MPI's own groups.
///
/// # Errors
/// [`crate::DTensorError::Spmd`] for NCCL without the features, or a mesh NCCL cannot serve (not
/// CUDA, several devices per process); [`crate::DTensorError::Config`] for a bad environment.
pub(crate) fn across_engine<D: 'static>(
    devices: &[D],
) -> Result<(&'static str, Option<AcrossWrap>)> {
    let _ = devices;
    match try_config()?.process_engine {
        ProcessEngine::Mpi => Ok(("mpi", None)),
        #[cfg(all(feature = "nccl", feature = "mpi"))]
        ProcessEngine::Nccl => {
            let ordinal = super::nccl_process::ordinal_of(devices)?;
            let wrap: AcrossWrap = Arc::new(move |g| {
                Ok(Arc::new(super::nccl_process::over(g, ordinal)?) as Arc<dyn ProcessGroup>)
            });
            Ok(("nccl", Some(wrap)))
        }
        #[cfg(not(all(feature = "nccl", feature = "mpi")))]
        ProcessEngine::Nccl => Err(crate::DTensorError::Spmd(
            "the NCCL cross-process engine: burn-dtensor was built without NCCL across \
             processes; rebuild with `--features nccl,mpi`"
                .into(),
        )),
    }
}
