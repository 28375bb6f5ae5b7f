//! Collectives along one mesh axis: each runs independently within every sub-group of the axis
//! (the devices whose coordinates differ only on that axis, see
//! [`MeshTopology::groups`](crate::MeshTopology::groups)).
//!
//! [`generic`] implements them with the inner backend's own ops (slice, cat, add, to_device), so
//! they run on any Burn backend, virtual devices included. Every call is recorded in the
//! current [`CommDebugMode`](crate::CommDebugMode) scope.

//! With the `wgpu` or `cuda` feature, [`cube`] runs the collectives of a group whose shards sit
//! on one device as a single CubeCL kernel launch; [`generic`] uses it when the inner primitive
//! is a `CubeTensor` and falls back to the backend's ops otherwise. With the `nccl` feature,
//! [`nccl`] runs sum all-reduces across distinct CUDA devices with NCCL.
//!
//! On a multi-process mesh ([`crate::Mesh::spmd`]) each collective combines the shards of the
//! process first, then runs its across-process part ([`across`]) on the axis' process group,
//! whose engine is one file behind [`crate::spmd::ProcessGroup`]: `mpi` (feature `mpi`).
//!
//! [`stacked`] runs them on tensors held in stacked form on a virtual mesh ([`crate::stack`]).

pub(crate) mod across;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod cube;
pub mod generic;
#[cfg(feature = "mpi")]
pub(crate) mod mpi;
#[cfg(all(feature = "cuda", feature = "nccl"))]
pub mod nccl;
pub mod stacked;

pub use generic::{all_gather, all_reduce, all_to_all, local_chunk, reduce_scatter};
