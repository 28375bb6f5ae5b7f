//! The universal fallback: every input gathered whole (replicated), the inner op run on the
//! whole tensor, the output replicated (and re-sharded by the caller when it has the input's
//! shape). Always correct; the collectives it costs show up in [`CommDebugMode`](crate::CommDebugMode).

use super::Strategy;
use crate::layout::Layout;

/// Replicate every input and the output.
pub fn replicate(inputs: &[&Layout], out_rank: usize) -> Strategy {
    let mesh = inputs[0].mesh.clone();
    Strategy {
        inputs: inputs
            .iter()
            .map(|l| Layout::replicated_on(&mesh, l.rank()))
            .collect(),
        output: Layout::replicated_on(&mesh, out_rank).into(),
    }
}
