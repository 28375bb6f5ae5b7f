//! Differentiable relayout on `Autodiff<DistributedBackend<B>>`, following Burn's
//! custom-backward pattern (see `burn-autodiff/src/ops/distributed.rs`): the forward pass
//! relayouts, the backward pass relayouts the gradient back to the input's layout (the adjoint
//! of a redistribution is the inverse redistribution; a partial input receives its gradient
//! replicated, which is the adjoint of the reduction).

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;

use crate::api::DistributedOps;
use crate::backend::DistributedBackend;
use crate::error::Result;
use crate::layout::Layout;
use crate::redistribute::{execute, redistribute};
use crate::tensor::{DTensor, FloatKind};

#[derive(Debug)]
struct Relayout;

impl<B: Backend> Backward<DistributedBackend<B>, 1> for Relayout {
    type State = Layout;

    fn backward(
        self,
        ops: Ops<Self::State, 1>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let back = ops.state.without_partial();
        unary::<DistributedBackend<B>, _>(ops.parents, ops.node, grads, |grad| {
            execute::<B, FloatKind>(grad, &back)
        })
    }
}

impl<B: Backend, C: CheckpointStrategy> DistributedOps for Autodiff<DistributedBackend<B>, C> {
    type Inner = B;
    fn float_dtensor(t: &FloatTensor<Self>) -> &DTensor<FloatTensor<B>> {
        &t.primitive
    }
    fn float_into_dtensor(t: FloatTensor<Self>) -> DTensor<FloatTensor<B>> {
        t.primitive
    }
    fn float_from_dtensor(t: DTensor<FloatTensor<B>>) -> FloatTensor<Self> {
        Self::from_inner(t)
    }
    crate::api::pass_through_int_bool_hooks!(B);
    fn q_layout(t: &burn::tensor::ops::QuantizedTensor<Self>) -> Layout {
        (*t.layout).clone()
    }
    fn float_relayout(t: FloatTensor<Self>, layout: &Layout) -> Result<FloatTensor<Self>> {
        let from = (*t.primitive.layout).clone();
        let out = redistribute::<B, FloatKind>(t.primitive.clone(), layout)?;
        Ok(
            match Relayout
                .prepare::<C>([t.node.clone()])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => prep.finish(from, out),
                // Untracked input: a fresh leaf, so that callers may mark it as requiring grad.
                OpsKind::UnTracked(_) => Self::from_inner(out),
            },
        )
    }
    fn float_relayout_leaf(t: FloatTensor<Self>, layout: &Layout) -> Result<FloatTensor<Self>> {
        Ok(Self::from_inner(redistribute::<B, FloatKind>(
            t.primitive,
            layout,
        )?))
    }
}
