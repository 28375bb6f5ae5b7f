//! Communication accounting, modelled on PyTorch's `CommDebugMode`: a scope that records every
//! collective run inside it (kind, mesh axis, bytes moved).
//!
//! Bytes are the standard ring-algorithm traffic summed over every device that takes part
//! (NCCL's "bus bandwidth" convention): with `k` devices per group and `s` the bytes of the
//! full (gathered or reduced) buffer of one group,
//! - all-gather and reduce-scatter: each device receives `(k-1)/k * s`;
//! - all-reduce: each device receives `2 (k-1)/k * s`;
//! - all-to-all: each device receives `(k-1)/k` of its local buffer;
//! - broadcast: each non-root device receives `s`.
//!
//! On a multi-process mesh ([`crate::Mesh::spmd`]) each process records what its own devices
//! receive: the in-process part by the formulas above with `k` the positions the process owns
//! along the axis, plus [`CommEvent::across_processes`], the bytes it received from other
//! processes (through the engine; all-reduce counts `2 (p-1)/p` of the buffer for `p` processes,
//! all-gather what arrived). [`CommLog::bytes_by_link`] splits the totals by link kind.
//!
//! Scopes are per thread (Burn runs the backward pass on the calling thread), so tests that
//! run in parallel do not see each other's collectives.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;

/// The kinds of collective.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum CollectiveKind {
    /// Partial -> replicated.
    AllReduce,
    /// Sharded -> replicated.
    AllGather,
    /// Partial -> sharded.
    ReduceScatter,
    /// Sharded on one dim -> sharded on another.
    AllToAll,
    /// One device's value to all.
    Broadcast,
    /// Each device's piece to the device a fixed distance along the axis (XLA's
    /// collective-permute, JAX's `ppermute`, MPI's `MPI_Sendrecv`): the halo exchange between
    /// neighbouring spatial shards of a convolution.
    CollectivePermute,
}

impl fmt::Display for CollectiveKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Self::AllReduce => "all-reduce",
            Self::AllGather => "all-gather",
            Self::ReduceScatter => "reduce-scatter",
            Self::AllToAll => "all-to-all",
            Self::Broadcast => "broadcast",
            Self::CollectivePermute => "collective-permute",
        };
        f.write_str(s)
    }
}

/// One collective call (over every sub-group of one mesh axis).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CommEvent {
    /// Which collective.
    pub kind: CollectiveKind,
    /// The mesh axis it ran along.
    pub axis: String,
    /// Bytes received, summed over all devices (see the module docs).
    pub bytes: u64,
    /// Global shape of the tensor involved.
    pub shape: Vec<usize>,
    /// The part of `bytes` that crossed processes (0 on a single-process mesh).
    #[serde(default)]
    pub across_processes: u64,
}

thread_local! {
    static SCOPES: RefCell<Vec<Vec<CommEvent>>> = const { RefCell::new(Vec::new()) };
}

pub(crate) fn record(kind: CollectiveKind, axis: &str, bytes: u64, shape: &[usize]) {
    record_across(kind, axis, bytes, 0, shape)
}

/// As [`record`], with `across` more bytes received from other processes.
pub(crate) fn record_across(
    kind: CollectiveKind,
    axis: &str,
    bytes: u64,
    across: u64,
    shape: &[usize],
) {
    SCOPES.with(|s| {
        for scope in s.borrow_mut().iter_mut() {
            scope.push(CommEvent {
                kind,
                axis: axis.to_string(),
                bytes: bytes + across,
                shape: shape.to_vec(),
                across_processes: across,
            });
        }
    });
}

/// A recording scope: every collective run on this thread between [`CommDebugMode::new`] and
/// [`CommDebugMode::finish`] (or drop) is recorded. Scopes nest.
///
/// ```
/// use burn::backend::NdArray;
/// use burn::tensor::{Tensor, TensorData};
/// use burn_dtensor::{CollectiveKind, CommDebugMode, DistributedBackend, Layout, Mesh, distribute};
/// type B = DistributedBackend<NdArray>;
/// let mesh = Mesh::virtual_devices([("batch", 4)], burn::backend::ndarray::NdArrayDevice::Cpu)?;
/// let x: Tensor<B, 2> = distribute(
///     TensorData::new(vec![1.0f32; 8 * 3], [8, 3]),
///     &Layout::batch_sharded(&mesh, "batch", 2)?,
/// )?;
/// let scope = CommDebugMode::new();
/// let total = x.sum(); // per-shard sums, then one all-reduce over `batch`
/// assert_eq!(total.into_scalar(), 24.0);
/// let log = scope.finish();
/// assert_eq!(log.count_on(CollectiveKind::AllReduce, "batch"), 1);
/// println!("{log}"); // per (collective, mesh axis): count and bytes
/// # Ok::<(), burn_dtensor::DTensorError>(())
/// ```
pub struct CommDebugMode {
    depth: usize,
    finished: bool,
}

impl CommDebugMode {
    /// Starts recording.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        let depth = SCOPES.with(|s| {
            let mut s = s.borrow_mut();
            s.push(Vec::new());
            s.len()
        });
        Self {
            depth,
            finished: false,
        }
    }
    /// Stops recording and returns what was recorded.
    pub fn finish(mut self) -> CommLog {
        self.finished = true;
        CommLog {
            events: self.take(),
        }
    }
    fn take(&self) -> Vec<CommEvent> {
        SCOPES.with(|s| {
            let mut s = s.borrow_mut();
            let ev = s.get(self.depth - 1).cloned().unwrap_or_default();
            s.truncate(self.depth - 1);
            ev
        })
    }
}

impl Drop for CommDebugMode {
    fn drop(&mut self) {
        if !self.finished {
            self.take();
        }
    }
}

/// Runs `f` and returns its result with the collectives it ran.
pub fn record_comms<R>(f: impl FnOnce() -> R) -> (R, CommLog) {
    let scope = CommDebugMode::new();
    let r = f();
    (r, scope.finish())
}

/// The collectives recorded by a [`CommDebugMode`] scope.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CommLog {
    /// In execution order.
    pub events: Vec<CommEvent>,
}

impl CommLog {
    /// Number of collectives of `kind`.
    pub fn count(&self, kind: CollectiveKind) -> usize {
        self.events.iter().filter(|e| e.kind == kind).count()
    }
    /// Number of collectives of `kind` along `axis`.
    pub fn count_on(&self, kind: CollectiveKind, axis: &str) -> usize {
        self.events
            .iter()
            .filter(|e| e.kind == kind && e.axis == axis)
            .count()
    }
    /// Total bytes.
    pub fn total_bytes(&self) -> u64 {
        self.events.iter().map(|e| e.bytes).sum()
    }
    /// Total bytes by link kind: `(in process, across processes)`.
    pub fn bytes_by_link(&self) -> (u64, u64) {
        let across: u64 = self.events.iter().map(|e| e.across_processes).sum();
        (self.total_bytes() - across, across)
    }
    /// `(kind, axis) -> (count, bytes)`.
    pub fn summary(&self) -> BTreeMap<(CollectiveKind, String), (usize, u64)> {
        let mut m = BTreeMap::new();
        for e in &self.events {
            let v = m.entry((e.kind, e.axis.clone())).or_insert((0, 0));
            v.0 += 1;
            v.1 += e.bytes;
        }
        m
    }
}

/// `3x all-reduce@batch (1.2 KiB), ... (3.6 KiB total)`: count, kind, mesh axis and bytes per
/// (kind, axis); when bytes crossed processes the total is split by link kind,
/// `(... total: X in process, Y across processes)` ([`CommLog::bytes_by_link`]).
impl fmt::Display for CommLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.events.is_empty() {
            return write!(f, "no collectives");
        }
        let parts: Vec<String> = self
            .summary()
            .into_iter()
            .map(|((k, a), (n, b))| format!("{n}x {k}@{a} ({})", human_bytes(b)))
            .collect();
        let (within, across) = self.bytes_by_link();
        if across == 0 {
            return write!(
                f,
                "{} ({} total)",
                parts.join(", "),
                human_bytes(self.total_bytes())
            );
        }
        write!(
            f,
            "{} ({} total: {} in process, {} across processes)",
            parts.join(", "),
            human_bytes(self.total_bytes()),
            human_bytes(within),
            human_bytes(across)
        )
    }
}

/// `1536` -> `1.5 KiB`.
pub fn human_bytes(b: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}
