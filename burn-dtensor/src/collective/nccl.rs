//! All-reduce across distinct CUDA devices with NCCL (feature `nccl`, which turns on Burn's
//! `distributed` feature: cubecl-cuda's NCCL all-reduce behind
//! `burn::tensor::backend::distributed::DistributedBackend::all_reduce`).
//!
//! The in-process engine ([`Nccl`]) of meshes over `CudaDevice`s: [`super::generic::all_reduce`]
//! asks it first for a sum over a group whose shards are
//! `CubeTensor<CudaRuntime>`s on pairwise distinct devices: every member's call is enqueued on
//! its device's communication stream (the pattern of Burn's own gradient-sync server), then each
//! device waits for its collective. Anything else (one device, max/min, another backend) returns
//! `None` and takes the kernel or generic path.
//!
//! Status: type-checked in CI; it has not run, since no machine with two CUDA devices was
//! available (see NOTES.md).

use std::any::Any;

use burn::tensor::backend::DeviceOps;
use burn::tensor::backend::distributed::{DistributedBackend as BurnCollectives, ReduceOperation};
use burn_cubecl::CubeBackend;
use burn_cubecl::tensor::CubeTensor;
use cubecl::cuda::CudaRuntime;

use super::interface::LocalEngine;
use super::interface::ReduceOp;

/// The Cuda backend type whose `all_reduce` is called (its element generics do not matter: the
/// collective uses each tensor's own dtype).
type CudaInner = CubeBackend<CudaRuntime, f32, i32, u8>;

/// NCCL as the in-process collective engine of meshes over `CudaDevice`s (see
/// [`super::engine::LocalEngines::for_device`]).
pub(crate) struct Nccl;

impl LocalEngine for Nccl {
    fn name(&self) -> &'static str {
        "nccl"
    }
    /// The NCCL all-reduce of `members` (one shard per device of a group), or `None` when it
    /// does not apply (see the module docs).
    fn all_reduce(&self, members: &[&dyn Any], op: ReduceOp) -> Option<Vec<Box<dyn Any>>> {
        if op != ReduceOp::Sum || members.len() < 2 {
            return None;
        }
        let ts: Vec<&CubeTensor<CudaRuntime>> = members
            .iter()
            .map(|p| p.downcast_ref())
            .collect::<Option<_>>()?;
        if ts
            .iter()
            .any(|t| !t.dtype.is_float() || t.qparams.is_some())
        {
            return None;
        }
        let ids: Vec<_> = ts.iter().map(|t| t.device.id()).collect();
        if (1..ids.len()).any(|i| ids[..i].contains(&ids[i])) {
            return None;
        }
        let pending: Vec<_> = ts
            .into_iter()
            .map(|t| CudaInner::all_reduce(t.clone(), ReduceOperation::Sum, ids.clone()))
            .collect();
        Some(
            pending
                .into_iter()
                .map(|c| Box::new(c.resolve()) as Box<dyn Any>)
                .collect(),
        )
    }
}
