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

use std::collections::HashMap;

use burn::module::{AutodiffModule, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorMetadata, TensorPrimitive};

use crate::api::{DTensorExt, DistributedOps};
use crate::error::Result;
use crate::redistribute::bucket;
use crate::tensor::{DTensor, FloatKind};

/// Relayouts every gradient in `grads` to its parameter's layout in `module` (global values
/// unchanged; per-shard shapes become the parameter's): a pending sum over an axis that shards
/// the parameter is reduce-scattered, one over an axis that replicates it all-reduced (the
/// reduction the run's order gives, bitwise as a relayout). Gradients of parameters absent from
/// `module`, and parameters without a gradient, are left as they are. Call it between
/// `GradientsParams::from_grads` and `Optimizer::step`; in one process on the mesh of one it
/// moves nothing.
///
/// **Gradient buckets.** The data-parallel gradients (a replicated parameter, a pending
/// reduction over axes that cross processes) are all-reduced in buckets of up to
/// [`Config::gradient_bucket_bytes`](crate::Config::gradient_bucket_bytes) (64 KiB; DDP's
/// `bucket_cap_mb`), one collective per bucket instead of one per gradient, in the module's
/// parameter order, one bucket per (mesh, pending reductions, dtype); the values are those of
/// the gradients settled one by one (the reduction is element-wise: bitwise with the ordered
/// reduction). In-process reductions are not bucketed: they cost no per-message latency, and the
/// copies in and out of a bucket would cost more than they save.
///
/// Every process calls it (SPMD): the collectives of a multi-process mesh are entered by all.
///
/// A gradient on another mesh than its parameter is moved to the parameter's layout (see
/// [`DTensorExt::relayout`](crate::DTensorExt::relayout)).
///
/// # Errors
/// [`DTensorError::Config`](crate::DTensorError::Config) when a `BURN_DTENSOR_*` setting does not
/// parse; a gradient's relayout errors ([`DTensorExt::relayout`](crate::DTensorExt::relayout)).
pub fn settle_gradients<B, M>(grads: GradientsParams, module: &M) -> Result<GradientsParams>
where
    B: AutodiffBackend + DistributedOps,
    B::InnerBackend: DistributedOps,
    M: AutodiffModule<B>,
{
    let cap = crate::config::try_config()?.gradient_bucket_bytes;
    let mut settler = Settler::<B> {
        grads,
        cap,
        buckets: Vec::new(),
        settled: HashMap::new(),
        registering: false,
        error: None,
        _backend: std::marker::PhantomData,
    };
    module.visit(&mut settler);
    if let Some(e) = settler.error {
        return Err(e);
    }
    for (_, members, _) in std::mem::take(&mut settler.buckets) {
        let (ids, ts): (Vec<ParamId>, Vec<_>) = members.into_iter().unzip();
        let ts = bucket::settle_together::<Shard<B>, FloatKind>(ts)?;
        settler.settled.extend(ids.into_iter().zip(ts));
    }
    // The bucketed gradients, registered back with their ranks known.
    if !settler.settled.is_empty() {
        settler.registering = true;
        module.visit(&mut settler);
    }
    match settler.error {
        Some(e) => Err(e),
        None => Ok(settler.grads),
    }
}

/// The backend of one shard of a gradient.
type Shard<B> = <<B as AutodiffBackend>::InnerBackend as DistributedOps>::Inner;
/// A gradient's distributed primitive.
type Grad<B> = DTensor<FloatTensor<Shard<B>>>;
/// One bucket: its key, its members in parameter order, its bytes.
type Bucket<B> = (bucket::Key, Vec<(ParamId, Grad<B>)>, usize);

struct Settler<B: AutodiffBackend>
where
    B::InnerBackend: DistributedOps,
{
    grads: GradientsParams,
    cap: usize,
    /// Open and full buckets in the order they were opened: key, members, bytes.
    buckets: Vec<Bucket<B>>,
    /// Bucketed gradients settled, waiting to be registered (the second visit).
    settled: HashMap<ParamId, Grad<B>>,
    /// The second visit: only the settled bucket members are registered.
    registering: bool,
    error: Option<crate::DTensorError>,
    _backend: std::marker::PhantomData<B>,
}

impl<B: AutodiffBackend> Settler<B>
where
    B::InnerBackend: DistributedOps,
{
    /// Adds `grad` to the last open bucket of its key, or opens one when it would pass the cap.
    fn add(&mut self, key: bucket::Key, id: ParamId, grad: Grad<B>) {
        let bytes = grad.shape.iter().product::<usize>() * grad.dtype().size();
        let open = self.buckets.iter_mut().rev().find(|b| b.0 == key);
        match open {
            Some(b) if b.2 + bytes <= self.cap => {
                b.1.push((id, grad));
                b.2 += bytes;
            }
            _ => self.buckets.push((key, vec![(id, grad)], bytes)),
        }
    }
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
        if let Some(settled) = self.settled.remove(&param.id) {
            let g = <B::InnerBackend as DistributedOps>::float_from_dtensor(settled);
            self.grads.register::<B::InnerBackend, D>(
                param.id,
                Tensor::from_primitive(TensorPrimitive::Float(g)),
            );
            return;
        }
        if self.registering {
            return;
        }
        let Some(grad) = self.grads.remove::<B::InnerBackend, D>(param.id) else {
            return;
        };
        // `layout()` reads through a clone of the tensor (Burn's `Tensor` lends no reference to
        // its primitive): once per tensor.
        let target = param.val().layout().without_partial();
        let layout = grad.layout();
        if layout == target {
            self.grads.register::<B::InnerBackend, D>(param.id, grad);
            return;
        }
        if self.cap > 0 && layout.without_partial() == target {
            let dt = <B::InnerBackend as DistributedOps>::float_into_dtensor(
                grad.into_primitive().tensor(),
            );
            match bucket::bucketable(&dt).filter(|_| crosses_processes(dt.layout())) {
                Some(key) => return self.add(key, param.id, dt),
                None => {
                    let g = <B::InnerBackend as DistributedOps>::float_from_dtensor(dt);
                    return self.settle_one::<D>(
                        param.id,
                        Tensor::from_primitive(TensorPrimitive::Float(g)),
                        &target,
                    );
                }
            }
        }
        self.settle_one::<D>(param.id, grad, &target);
    }
}

impl<B> Settler<B>
where
    B: AutodiffBackend + DistributedOps,
    B::InnerBackend: DistributedOps,
{
    /// Settles one gradient by its own relayout to `target`.
    fn settle_one<const D: usize>(
        &mut self,
        id: ParamId,
        grad: Tensor<B::InnerBackend, D>,
        target: &crate::Layout,
    ) {
        match grad.relayout(target) {
            Ok(g) => self.grads.register::<B::InnerBackend, D>(id, g),
            Err(e) => self.error = Some(e),
        }
    }
}

/// Whether a pending reduction of `layout` runs over an axis that crosses processes.
fn crosses_processes(layout: &crate::Layout) -> bool {
    let mesh = layout.mesh();
    (0..mesh.ndim()).any(|a| layout.partial(a).is_some() && mesh.process_group(a).is_some())
}
