//! Collectives along one mesh axis: each runs independently within every sub-group of the axis
//! (the devices whose coordinates differ only on that axis, see
//! [`MeshTopology::groups`](crate::MeshTopology::groups)).
//!
//! [`generic`] implements them with the inner backend's own ops (slice, cat, add, to_device), so
//! they run on any Burn backend, virtual devices included. Every call is recorded in the
//! current [`CommDebugMode`](crate::CommDebugMode) scope.

//! Two engine interfaces, each engine one file:
//! - in process, [`interface::LocalEngine`]: the mesh's engines are chosen when it is built
//!   ([`engine::LocalEngines::for_device`], the one place that looks at features): with `wgpu`
//!   or `cuda`, [`cube`] runs the collectives of a group whose shards sit on one device as a
//!   single CubeCL kernel launch; with `nccl`, [`nccl`] runs sum all-reduces across distinct
//!   CUDA devices. [`generic`] asks them first and falls back to the backend's ops.
//!
//! On a multi-process mesh ([`crate::Mesh::spmd`]) each collective combines the shards of the
//! process first, then runs its across-process part ([`across`]) on the axis' process group,
//! whose engine is one file behind the second interface, [`interface::ProcessGroup`]: `mpi`
//! (feature `mpi`, the default), or `nccl_process` (features `nccl` and `mpi`, CUDA meshes,
//! `BURN_DTENSOR_SPMD_ENGINE=nccl`), chosen when the mesh is built
//! ([`engine::across_engine`]).
//!
//! [`stacked`] runs them on tensors held in stacked form on a virtual mesh ([`crate::stack`]).

pub(crate) mod across;
#[cfg(all(feature = "mpi", target_os = "linux"))]
pub(crate) mod cma;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod cube;
pub(crate) mod engine;
pub mod generic;
pub(crate) mod interface;
#[cfg(feature = "mpi")]
pub(crate) mod mpi;
#[cfg(all(feature = "cuda", feature = "nccl"))]
pub mod nccl;
#[cfg(all(feature = "nccl", feature = "mpi"))]
pub(crate) mod nccl_process;
pub mod stacked;

pub use generic::{all_gather, all_reduce, all_to_all, local_chunk, pad_partial, reduce_scatter};
