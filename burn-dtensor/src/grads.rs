//! Gradients settled into their parameters' layouts before the optimizer step: the
//! post-backward hook of PyTorch's FSDP (a reduce-scatter of each gradient to the parameter's
//! `Shard(0)`) and of DDP (an all-reduce of each gradient of a replicated parameter), as one
//! relayout per gradient on a mesh.
//!
//! A gradient leaves the backward pass in whatever layout the rules gave its last op: the
//! weight gradient of a batch-sharded matmul is a pending sum over the batch axis, whatever the
//! weight's layout. Left so, the optimizer's first non-linear op on it (Adam's `grad²`)
//! all-reduces it to a replicated tensor, and the optimizer state made from it is replicated
//! too: FSDP would keep no memory. Settled first, the gradient has its parameter's layout, the
//! optimizer runs shard-local (no collective in the step) and its state is sharded like the
//! parameter.

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;

use crate::api::{DTensorExt, DistributedOps};
use crate::error::Result;

/// Relayouts every gradient in `grads` to its parameter's layout in `module` (global values
/// unchanged; per-shard shapes become the parameter's): a pending sum over an axis that shards
/// the parameter is reduce-scattered, one over an axis that replicates it all-reduced (the
/// reduction the run's order gives, bitwise as a relayout). Gradients of parameters absent from
/// `module`, and parameters without a gradient, are left as they are. Call it between
/// `GradientsParams::from_grads` and `Optimizer::step`; in one process on the mesh of one it
/// moves nothing.
///
/// Every process calls it (SPMD): the collectives of a multi-process mesh are entered by all.
///
/// # Errors
/// [`DTensorError::MeshMismatch`](crate::DTensorError::MeshMismatch) when a gradient lies on
/// another mesh than its parameter.
pub fn settle_gradients<B, M>(grads: GradientsParams, module: &M) -> Result<GradientsParams>
where
    B: AutodiffBackend + DistributedOps,
    B::InnerBackend: DistributedOps,
    M: AutodiffModule<B>,
{
    let mut settler = Settler::<B> {
        grads,
        error: None,
        _backend: std::marker::PhantomData,
    };
    module.visit(&mut settler);
    match settler.error {
        Some(e) => Err(e),
        None => Ok(settler.grads),
    }
}

struct Settler<B> {
    grads: GradientsParams,
    error: Option<crate::DTensorError>,
    _backend: std::marker::PhantomData<B>,
}

impl<B> ModuleVisitor<B> for Settler<B>
where
    B: AutodiffBackend + DistributedOps,
    B::InnerBackend: DistributedOps,
{
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if self.error.is_some() {
            return;
        }
        let Some(grad) = self.grads.remove::<B::InnerBackend, D>(param.id) else {
            return;
        };
        let target = param.val().layout().without_partial();
        let grad = if grad.layout() == target {
            Ok(grad)
        } else {
            grad.relayout(&target)
        };
        match grad {
            Ok(g) => self.grads.register::<B::InnerBackend, D>(param.id, g),
            Err(e) => self.error = Some(e),
        }
    }
}
