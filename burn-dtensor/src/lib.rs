//! # burn-dtensor: distributed tensors for Burn
//!
//! [`DistributedBackend<B>`] is a Burn backend decorator (like `Autodiff<B>`) that makes any
//! Burn backend distributed in the manner of TensorFlow DTensor, PyTorch DTensor and JAX
//! sharding: every tensor carries a [`Layout`] on a [`Mesh`] of devices, every op runs per shard
//! on the inner backend plus the collectives (all-reduce, all-gather, reduce-scatter,
//! all-to-all) the layouts imply. Ordinary `burn::nn` modules and `burn::optim` optimizers then
//! train data-, model- or spatial-parallel by changing only a [`LayoutMap`].
//!
//! **A layout never changes the result**: any op, any layout, gives what the inner backend
//! gives on the whole tensor (to float rounding).
//!
//! ```
//! use burn::backend::NdArray;
//! use burn::tensor::{Int, Tensor, TensorData};
//! use burn_dtensor::{DTensorExt, DistributedBackend, DistributedDevice, Layout, Mesh, distribute};
//!
//! type B = DistributedBackend<NdArray>;
//! let mesh = Mesh::virtual_devices([("batch", 4), ("model", 2)], Default::default())?;
//! let device = DistributedDevice::new(mesh.clone());
//! // A batch sharded over `batch`: each device receives only its rows...
//! let rows = Layout::batch_sharded(&mesh, "batch", 2)?;
//! let data: Vec<f32> = (0..24).map(|v| v as f32).collect();
//! let x: Tensor<B, 2> = distribute(TensorData::new(data, [6, 4]), &rows)?;
//! // ... times a weight sharded over `model` on its output dim: no communication.
//! let w = Tensor::<B, 2>::ones([4, 2], &device)
//!     .relayout(&Layout::new(&mesh, ["unsharded", "model"])?)?;
//! let y = x.matmul(w);
//! assert_eq!(y.describe(), "f32[6@batch, 2@model]");
//! let sums = (0..6).flat_map(|r| {
//!     let s = (0..4).map(|c| (r * 4 + c) as f32).sum::<f32>();
//!     [s, s]
//! });
//! assert_eq!(y.into_data().to_vec::<f32>().unwrap(), sums.collect::<Vec<_>>());
//! // Int and bool tensors take the same methods.
//! let labels: Tensor<B, 1, Int> = distribute(TensorData::new(vec![0i64, 1, 1, 0, 1, 0], [6]), &rows.delete(&[1]))?;
//! assert_eq!(labels.describe(), "i64[6@batch]");
//! # Ok::<(), burn_dtensor::DTensorError>(())
//! ```
//!
//! The public surface is the concepts: [`Mesh`] (devices and named axes), [`Layout`]
//! (sharding spec and pending reductions), [`DistributedDevice`] and [`DistributedBackend`],
//! [`DTensorExt`] (a tensor's layout, relayout, local shards), [`distribute`] and
//! [`from_local_shards`], [`LayoutMap`] (regex rules over module parameter paths),
//! [`settle_gradients`] (each gradient in its parameter's layout before the optimizer step, as
//! FSDP's reduce-scatter and DDP's all-reduce), [`CommDebugMode`] / [`record_comms`]
//! (communication accounting), [`visualize_sharding`] and
//! the typed [`DTensorError`].
//!
//! The tree follows the same concepts: `mesh.rs`, `layout.rs`, `shard.rs` (global <-> local
//! geometry), `device.rs`, `tensor.rs` (the primitive), `backend.rs` and `ops/` (Burn's op
//! traits, thin), `rules/` (sharding rules, one op family per file), `memo.rs` (per-thread memos
//! of rules and plans), `redistribute/` (plans and execution), `collective/`, `stack.rs` (stacked execution on virtual meshes), `autodiff.rs`
//! (differentiable relayout), `grads.rs` (gradients settled for the optimizer), `layout_map.rs`, `comm.rs` (communication accounting),
//! `visualize.rs` and `error.rs`.

#![warn(missing_docs)]

mod api;
#[cfg(test)]
mod architecture;
mod autodiff;
mod backend;
pub mod checkpoint;
mod collective;
mod comm;
pub mod config;
mod creation;
mod device;
mod error;
mod fault;
mod grads;
mod host;
mod inner;
pub mod launch;
mod layout;
pub mod layout_map;
mod memo;
mod mesh;
mod ops;
pub mod random;
mod redistribute;
mod rules;
mod shard;
pub mod spmd;
mod stack;
mod tensor;
mod visualize;

pub use api::{
    DTensorExt, DistributedKind, DistributedOps, distribute, distribute_local, from_local_shards,
    process_block,
};
pub use backend::DistributedBackend;
pub use comm::{CollectiveKind, CommDebugMode, CommEvent, CommLog, record_comms};
pub use config::{Config, ProcessEngine, Reduction, StridedSend, config, configure, try_config};
pub use creation::with_creation_layout;
pub use device::DistributedDevice;
pub use error::{DTensorError, Result};
pub use grads::settle_gradients;
pub use layout::{DimSpec, Layout, ReduceOp, UNSHARDED};
pub use layout_map::{LayoutMap, LayoutReport, LayoutRule};
pub use mesh::{MAX_MESHES, MAX_VIRTUAL_POSITIONS, Mesh, MeshTopology};
pub use visualize::visualize_sharding;

/// The CubeCL collective kernels' switch and launch counter (features `wgpu` / `cuda`).
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod cube_kernels {
    pub use crate::collective::cube::{kernel_launches, set_kernels_enabled};
}

/// The workspace README's Rust blocks, compiled and run as doc tests of this crate.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;
