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
//! use burn::tensor::{Tensor, TensorData};
//! use burn_dtensor::{DistributedBackend, DistributedDevice, Layout, Mesh, distribute, relayout};
//!
//! type B = DistributedBackend<NdArray>;
//! let mesh = Mesh::virtual_devices([("batch", 4), ("model", 2)], Default::default()).unwrap();
//! let device = DistributedDevice::new(mesh.clone());
//! // A batch sharded over `batch` (each device receives only its rows)...
//! let x: Tensor<B, 2> = distribute(TensorData::new((0..24).map(|v| v as f32).collect::<Vec<_>>(), [6, 4]),
//!     &mesh, &Layout::batch_sharded(&mesh, "batch", 2).unwrap()).unwrap();
//! // ... times a weight sharded over `model` on its output dim: no communication.
//! let w = relayout(Tensor::<B, 2>::ones([4, 2], &device), &Layout::new(&mesh, ["unsharded", "model"]).unwrap()).unwrap();
//! let y = x.matmul(w);
//! assert_eq!(burn_dtensor::describe(&y), "f32[6@batch, 2@model]");
//! let expected: Vec<f32> = (0..6).flat_map(|r| { let s = (0..4).map(|c| (r * 4 + c) as f32).sum::<f32>(); [s, s] }).collect();
//! assert_eq!(y.into_data().to_vec::<f32>().unwrap(), expected);
//! ```
//!
//! The tree follows the concepts: [`mesh`], [`layout`], [`shard`] (global <-> local geometry),
//! [`device`], [`tensor`] (the primitive), [`backend`] and [`ops`] (Burn's op traits, thin),
//! [`rules`] (sharding rules, one op family per file), [`redistribute`] (plans and execution),
//! [`collective`], [`stack`] (stacked execution on virtual meshes), [`autodiff`] (differentiable relayout), [`layout_map`], [`comm`]
//! (communication accounting) and [`error`].

#![warn(missing_docs)]

pub mod api;
pub mod autodiff;
pub mod backend;
pub mod collective;
pub mod comm;
pub mod device;
pub mod error;
pub mod host;
pub mod inner;
pub mod layout;
pub mod layout_map;
pub mod mesh;
pub mod ops;
pub mod redistribute;
pub mod rules;
pub mod shard;
pub mod stack;
pub mod tensor;

pub use api::{
    DistributedOps, describe, distribute, distribute_int, from_local_shards, layout, layout_int,
    relayout, relayout_int, to_local_shards,
};
pub use backend::DistributedBackend;
pub use comm::{CollectiveKind, CommDebugMode, CommEvent, CommLog, record_comms};
pub use device::DistributedDevice;
pub use error::{DTensorError, Result};
pub use layout::{Layout, ReduceOp, UNSHARDED};
pub use layout_map::LayoutMap;
pub use mesh::{Mesh, MeshTopology};
pub use tensor::DTensor;
