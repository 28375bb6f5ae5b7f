//! Planning a relayout as a sequence of collective steps along mesh axes.

use std::sync::Arc;

use crate::error::{DTensorError, Result};
use crate::layout::{Layout, ReduceOp};
use crate::memo;

/// One step of a relayout, along one mesh axis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Settle a pending reduction on every device of the axis.
    AllReduce {
        /// Mesh axis.
        axis: usize,
        /// The pending reduction.
        op: ReduceOp,
    },
    /// Settle a pending reduction and keep only this device's chunk of `dim`.
    ReduceScatter {
        /// Mesh axis.
        axis: usize,
        /// The pending reduction.
        op: ReduceOp,
        /// Tensor dim that becomes sharded.
        dim: usize,
    },
    /// Un-shard `dim`.
    AllGather {
        /// Mesh axis.
        axis: usize,
        /// Tensor dim that becomes whole.
        dim: usize,
    },
    /// Move the axis from sharding `from` to sharding `to`.
    AllToAll {
        /// Mesh axis.
        axis: usize,
        /// Dim that becomes whole.
        from: usize,
        /// Dim that becomes sharded.
        to: usize,
    },
    /// Keep this device's chunk of `dim` (no communication).
    LocalChunk {
        /// Mesh axis.
        axis: usize,
        /// Tensor dim that becomes sharded.
        dim: usize,
    },
    /// Turn a replicated value into a pending reduction (sum: coordinate 0 keeps the value,
    /// the others hold zeros; max/min: unchanged). No communication.
    MakePartial {
        /// Mesh axis.
        axis: usize,
        /// The reduction.
        op: ReduceOp,
    },
    /// Turn `dim`, sharded over the axis, into a pending sum with `dim` whole: each device
    /// writes its chunk at its offset into zeros of the whole dim, so the sum over the axis is
    /// the tensor. No communication (the adjoint of a reduce-scatter's local chunk; where the
    /// target keeps the sum pending, an all-gather plus [`Step::MakePartial`] would move the
    /// whole tensor for nothing).
    PadPartial {
        /// Mesh axis.
        axis: usize,
        /// Tensor dim that becomes whole.
        dim: usize,
    },
}

/// Plans the relayout `from -> to` (memoised per layout pair and thread, [`crate::memo`]).
///
/// # Errors
/// [`DTensorError::MeshMismatch`] for layouts of different meshes,
/// [`DTensorError::RankMismatch`] for different ranks.
pub fn plan(from: &Layout, to: &Layout) -> Result<Arc<Vec<Step>>> {
    if from.mesh.id != to.mesh.id {
        return Err(DTensorError::MeshMismatch {
            from: from.mesh.to_string(),
            to: to.mesh.to_string(),
        });
    }
    to.check_rank(from.rank())?;
    thread_local!(static MEMO: memo::Memo<Arc<Vec<Step>>> = Default::default());
    let mut key = memo::Key::new();
    from.push_key(&mut key);
    to.push_key(&mut key);
    Ok(Arc::clone(&memo::get_or(&MEMO, key, || {
        Arc::new(plan_uncached(from, to))
    })))
}

fn plan_uncached(from: &Layout, to: &Layout) -> Vec<Step> {
    let mut cur = from.clone();
    let mut steps = Vec::new();
    let naxes = cur.mesh.ndim();
    // 1. Pending reductions the target does not keep.
    for a in 0..naxes {
        let Some(op) = cur.partial[a] else { continue };
        if to.partial[a] == Some(op) {
            continue;
        }
        cur.partial[a] = None;
        match to.axis_dim(a) {
            Some(j) if cur.dims[j].is_none() => {
                steps.push(Step::ReduceScatter {
                    axis: a,
                    op,
                    dim: j,
                });
                cur.dims[j] = Some(a);
            }
            _ => steps.push(Step::AllReduce { axis: a, op }),
        }
    }
    // 2. Axes that shard a dim the target does not shard with them: un-shard or move.
    // Axes leaving for no dim go first so that they free dims for the moves.
    let mut order: Vec<usize> = (0..naxes).collect();
    order.sort_by_key(|&a| to.axis_dim(a).is_some());
    for a in order {
        let Some(i) = cur.axis_dim(a) else { continue };
        if to.dims[i] == Some(a) {
            continue;
        }
        cur.dims[i] = None;
        match to.axis_dim(a) {
            None if to.partial[a] == Some(ReduceOp::Sum) && cur.partial[a].is_none() => {
                steps.push(Step::PadPartial { axis: a, dim: i });
                cur.partial[a] = Some(ReduceOp::Sum);
            }
            Some(j) if cur.dims[j].is_none() && cur.partial[a].is_none() => {
                steps.push(Step::AllToAll {
                    axis: a,
                    from: i,
                    to: j,
                });
                cur.dims[j] = Some(a);
            }
            _ => steps.push(Step::AllGather { axis: a, dim: i }),
        }
    }
    // 3. Local slices for what the target shards and we do not.
    for a in 0..naxes {
        if let Some(j) = to.axis_dim(a)
            && cur.dims[j] != Some(a)
        {
            debug_assert!(cur.dims[j].is_none());
            steps.push(Step::LocalChunk { axis: a, dim: j });
            cur.dims[j] = Some(a);
        }
    }
    // 4. New pending reductions.
    for a in 0..naxes {
        if let Some(op) = to.partial[a]
            && cur.partial[a].is_none()
        {
            steps.push(Step::MakePartial { axis: a, op });
            cur.partial[a] = Some(op);
        }
    }
    debug_assert_eq!(&cur, to, "plan from {from} did not reach {to}");
    steps
}
