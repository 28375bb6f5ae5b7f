//! Redistribution (relayout) between any two layouts of one mesh: [`plan`] turns a pair of
//! layouts into a list of per-mesh-axis collective steps (cached), [`execute`] runs them;
//! between layouts of two meshes, [`transfer`] cuts each target shard from the source shards.
//!
//! The transforms are PyTorch DTensor's (`_redistribute.py`): partial -> replicated is an
//! all-reduce, partial -> sharded a reduce-scatter, sharded -> replicated an all-gather,
//! sharded on dim i -> sharded on dim j an all-to-all, replicated -> sharded a local slice
//! (no communication), replicated -> partial keeps the value on coordinate 0. Several partial
//! tensors that all-reduce over the same axes settle together in one [`bucket`].

pub mod bucket;
mod execute;
mod plan;
mod reuse;
mod transfer;

pub use execute::{execute, execute_stacked, redistribute};
