//! The library's run-time configuration: one value, [`Config`], built with its `with_*` methods
//! and installed with [`configure`], with the `BURN_DTENSOR_*` environment variables as its
//! fallback (read once, by [`Config::from_env`], the only place that reads them).
//!
//! | setting | environment variable | default | read |
//! |---|---|---|---|
//! | [`Config::collective_timeout`] | `BURN_DTENSOR_COLLECTIVE_TIMEOUT_S` (seconds, fractions allowed) | 30 s | at every wait of a cross-process collective, and at start-up |
//! | [`Config::reduction`] | `BURN_DTENSOR_SPMD_REDUCTION` (`ordered` or `engine`) | `ordered` | at every cross-process reduction |
//! | [`Config::process_engine`] | `BURN_DTENSOR_SPMD_ENGINE` (`mpi` or `nccl`) | `mpi` | when a multi-process mesh is built |
//! | [`Config::stacked_execution`] | `BURN_DTENSOR_STACKED` (`0` or `1`) | on | when a mesh is built |
//! | [`Config::parallel_min_elements`] | `BURN_DTENSOR_PAR_MIN` (elements) | 262144 | at every op |
//! | [`Config::gradient_bucket_bytes`] | `BURN_DTENSOR_BUCKET_KIB` (KiB; 0: off) | 64 KiB | at every [`crate::settle_gradients`] |
//! | [`Config::strided_send`] | `BURN_DTENSOR_STRIDED_SEND` (`pack`, `datatype` or `single-copy`) | `single-copy` | at every cross-process all-gather and all-to-all |
//! | [`Config::large_message_bytes`] | `BURN_DTENSOR_LARGE_MESSAGE_KIB` (KiB) | 1024 KiB | at every cross-process collective on MPI |
//!
//! Every process of an SPMD run must use the same reduction, engine, gradient bucket size,
//! strided send and large-message size: they are agreed on when a multi-process mesh is built
//! ([`crate::spmd`]), and a difference is a typed error.
//!
//! ```
//! use burn_dtensor::{Config, Reduction, configure, config};
//! // The environment's values, with the reduction order replaced.
//! configure(Config::from_env()?.with_reduction(Reduction::Engine));
//! assert_eq!(config().reduction, Reduction::Engine);
//! // A bad value in the environment is a typed error naming the variable.
//! let bad = Config::from_vars(|k| (k == "BURN_DTENSOR_STACKED").then(|| "yes".to_string()));
//! assert!(bad.unwrap_err().to_string().contains("BURN_DTENSOR_STACKED"));
//! # Ok::<(), burn_dtensor::DTensorError>(())
//! ```

use std::cell::Cell;
use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::error::{DTensorError, Result};

/// How a cross-process all-reduce (and the reduction of a reduce-scatter) combines the processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduction {
    /// Every shard of the group reaches every process, which reduces them in mesh coordinate
    /// order as a single process holding the whole mesh does; and a matmul that one process
    /// would contract over a sharded dim in one go (the stacked deferred partial products, see
    /// `stack::contracts`) gathers that dim of both operands and computes the same matmul.
    /// Results are those of the one-process run whatever the process count (measured bitwise
    /// on the IMDB model in f32, 2, 4 and 8 processes, three modes), and equal on every rank.
    /// Moves each process's shards to all others (`k/2` times the engine's all-reduce bytes for
    /// `k` positions along the axis). The default: the promise that a layout never changes the
    /// result holds to the bit across process counts.
    Ordered,
    /// The shards of a process are reduced in process, then the processes through the engine's
    /// all-reduce (`MPI_Iallreduce`): the engine's bandwidth, with sums rounded in the order of
    /// the engine's algorithm.
    Engine,
}

/// The engine that moves bytes between processes ([`crate::spmd::ProcessGroup`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessEngine {
    /// MPI (feature `mpi`) on host memory: every backend.
    Mpi,
    /// NCCL (features `nccl` and `mpi`, MPI only to start): CUDA meshes with one device per
    /// process.
    Nccl,
}

impl ProcessEngine {
    /// The engine's name (`mpi`, `nccl`), as in `BURN_DTENSOR_SPMD_ENGINE`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Mpi => "mpi",
            Self::Nccl => "nccl",
        }
    }
}

/// How a cross-process all-to-all sends the parts of a shard that do not lie end to end in its
/// memory (the column blocks of a row-major shard that moves from row to column sharding), and
/// whether the all-gathers and the ordered reductions write their parts into the peers (see
/// [`StridedSend::SingleCopy`]). All three move the same bytes and give the same result,
/// bitwise; they differ in copies and speed (`benches/spmd_collectives.rs`, NOTES.md).
/// Against a direct `MPI_Alltoall` of the same bytes on a 2-core VM (session 67), a 16.8 MB
/// all-to-all ran at 0.87-1.06 of it written in a single copy, 0.55-0.70 packed and 0.50-0.60
/// through datatypes on 2 processes (0.73-0.92, 0.50-0.54 and 0.45-0.57 on 4 oversubscribed
/// ones); on a 16-core Xeon host (session 61) the datatypes reached 0.80-0.91 where packing
/// reached 0.56-0.71. On 4 oversubscribed processes (session 68) a 4.2 MB all-gather ran at
/// 1.21-1.34 of a direct `MPI_Allgather` in a single copy, 0.65-0.77 through MPI's. Every
/// process of an SPMD run must use the same one (agreed when a mesh is built).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StridedSend {
    /// Each part is copied back to back into a send buffer, which the engine sends (every
    /// engine).
    Pack,
    /// The engine reads each part where it lies: MPI through one derived datatype per peer
    /// (nested `MPI_Type_create_hvector`s) and `MPI_Ialltoallw`, no send buffer. Engines
    /// without derived datatypes (NCCL) pack.
    Datatype,
    /// Each process writes its parts straight into its peers' receive buffers through the
    /// kernel (Linux cross-memory attach, `process_vm_writev`): one copy of each byte, as
    /// Open MPI moves a contiguous message between processes of one host, where packing then
    /// sending copies it twice. Used for large messages ([`Config::large_message_bytes`], from
    /// 1 MiB by default: below that its two extra rounds cost more than the copy) on MPI
    /// process groups whose members all run on one host and may write into each other
    /// (checked once per group, by every member reading every peer's memory); other groups,
    /// smaller tensors and other engines pack. The ordered reduction's exchanges of such
    /// groups, and their all-gathers from 3 processes on, move their (contiguous) parts the
    /// same way, in one round where MPI's algorithms take `log p` or `p - 1` (the other two
    /// forms leave them to MPI's collective). The default.
    ///
    /// Where Linux's Yama module limits such writes to a process's ancestors (`ptrace_scope`
    /// 1, as on Ubuntu), each process first lets same-user processes in
    /// (`PR_SET_PTRACER_ANY`), as Open MPI's shared-memory transport does; choose `pack` to
    /// leave that setting alone. A member the kernel still refuses says so on stderr.
    SingleCopy,
}

/// The library's settings (see the [module docs](self) for each one's variable and default).
/// Copy it, change it with the `with_*` methods, install it with [`configure`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Config {
    /// How long a cross-process collective (or joining the world) may wait for its peers
    /// before the job ends with a message naming the missing ranks ([`crate::spmd`]'s fault
    /// policy).
    pub collective_timeout: Duration,
    /// The order of cross-process reductions.
    pub reduction: Reduction,
    /// The cross-process engine of multi-process meshes built from now on.
    pub process_engine: ProcessEngine,
    /// Whether virtual meshes built from now on run their shards stacked (one inner op for all
    /// shards, see [`crate::Mesh::with_stacked_execution`]).
    pub stacked_execution: bool,
    /// Per-shard work (elements of the largest input shard; a matmul's multiply-adds count 1/16
    /// each) from which the shards of one op run on worker threads (CPU backends only). Below
    /// it, waking the pool costs more than it saves (measured on a 2-core machine, NOTES.md: at
    /// 16 Ki the IMDB data-parallel step took 1.62 ms against 1.27 ms serial).
    pub parallel_min_elements: usize,
    /// The most bytes of one gradient bucket: [`crate::settle_gradients`] all-reduces the
    /// data-parallel gradients whose reduction crosses processes in buckets of up to this many
    /// bytes (one collective per bucket, see `redistribute::bucket`), as DDP's `bucket_cap_mb`.
    /// A gradient larger than the cap is a bucket of its own; 0 settles every gradient alone.
    /// The default, 64 KiB, is far below DDP's 25 MiB because a bucket here copies its members
    /// in and out (DDP's gradients are views of their bucket): measured on 2 processes
    /// (`benches/spmd_collectives.rs`, NOTES.md), a bucket of gradients of 1-4 KB settles
    /// 1.6-2.9x faster than the gradients one by one, of 32 KB at 0.8-1.0x, of 256 KB at
    /// 0.4-0.6x (the copies cost more than the latency saved).
    pub gradient_bucket_bytes: usize,
    /// How a cross-process all-to-all sends a shard's strided parts, and whether the
    /// all-gathers and the ordered reductions' exchanges write their parts into the peers
    /// ([`StridedSend::SingleCopy`]).
    pub strided_send: StridedSend,
    /// The size (bytes of the whole tensor a collective moves, equal on every member) from
    /// which a collective across processes on MPI is a large message: it waits for its peers
    /// with a polled `MPI_Ibarrier`, then runs MPI's blocking collective (Open MPI's tuned
    /// algorithms, where the non-blocking ones progress only while polled), polls without
    /// sleeping for up to 1 s, and with [`StridedSend::SingleCopy`] its all-gather and
    /// all-to-all parts are written straight into the peers (below it, the single copy's two
    /// extra rounds cost more than the copy they save). The default, 1 MiB, comes from
    /// measurements on a 2-core machine with 2 and 4 processes (NOTES.md, "Speed across
    /// processes"); the crossover moves with the machine and the process count (there, the
    /// engine all-reduce's blocking call was faster from 262 KB on 2 processes, the polled one
    /// up to 1 MB on 4 sharing the 2 cores), so measure it on yours with
    /// `benches/spmd_collectives.rs` (`SPMD_BENCH_SIDE` picks one size). Every member moves the
    /// same bytes either way, so the results do not change, except that [`Reduction::Engine`]'s
    /// sums may be added in another order (the ordered reduction's are bitwise the same). 0
    /// makes every collective large. The world's own control messages (the start-up checks,
    /// checkpoints' indexes) and a process group's set-up exchanges are never large.
    pub large_message_bytes: usize,
}

impl Default for Config {
    /// The built-in defaults (no environment).
    fn default() -> Self {
        Self {
            collective_timeout: Duration::from_secs(30),
            reduction: Reduction::Ordered,
            process_engine: ProcessEngine::Mpi,
            stacked_execution: true,
            parallel_min_elements: 256 * 1024,
            gradient_bucket_bytes: 64 << 10,
            strided_send: StridedSend::SingleCopy,
            large_message_bytes: 1 << 20,
        }
    }
}

impl Config {
    /// The defaults overridden by the `BURN_DTENSOR_*` environment variables that are set.
    ///
    /// # Errors
    /// [`DTensorError::Config`] naming the variable, its value and what it accepts.
    pub fn from_env() -> Result<Self> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// As [`Config::from_env`] with `var` in place of the environment (`None`: unset).
    ///
    /// # Errors
    /// [`DTensorError::Config`] as [`Config::from_env`].
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let mut c = Self::default();
        let bad = |name: &str, value: &str, expected: &str| DTensorError::Config {
            var: name.to_string(),
            value: value.to_string(),
            expected: expected.to_string(),
        };
        let get = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        // A size in KiB, as bytes.
        let kib = |name: &str, v: &str, expected: &str| {
            v.trim()
                .parse::<usize>()
                .ok()
                .and_then(|k| k.checked_mul(1024))
                .ok_or_else(|| bad(name, v, expected))
        };
        const TIMEOUT: &str = "BURN_DTENSOR_COLLECTIVE_TIMEOUT_S";
        if let Some(v) = get(TIMEOUT) {
            // `try_from`: a value past `Duration`'s range (about 5.8e11 years) is refused, not
            // a panic.
            let s = v.trim().parse::<f64>().ok();
            c.collective_timeout = s
                .filter(|s| *s > 0.0)
                .and_then(|s| Duration::try_from_secs_f64(s).ok())
                .ok_or_else(|| {
                    bad(
                        TIMEOUT,
                        &v,
                        "a positive number of seconds below 1.8e19, e.g. 30 or 2.5",
                    )
                })?;
        }
        const REDUCTION: &str = "BURN_DTENSOR_SPMD_REDUCTION";
        if let Some(v) = get(REDUCTION) {
            c.reduction = match v.trim() {
                "ordered" => Reduction::Ordered,
                "engine" => Reduction::Engine,
                _ => return Err(bad(REDUCTION, &v, "`ordered` (the default) or `engine`")),
            };
        }
        const ENGINE: &str = "BURN_DTENSOR_SPMD_ENGINE";
        if let Some(v) = get(ENGINE) {
            c.process_engine = match v.trim() {
                "mpi" => ProcessEngine::Mpi,
                "nccl" => ProcessEngine::Nccl,
                _ => return Err(bad(ENGINE, &v, "`mpi` (the default) or `nccl`")),
            };
        }
        const STACKED: &str = "BURN_DTENSOR_STACKED";
        if let Some(v) = get(STACKED) {
            c.stacked_execution = match v.trim() {
                "0" => false,
                "1" => true,
                _ => return Err(bad(STACKED, &v, "`0` (off) or `1` (on, the default)")),
            };
        }
        const PAR_MIN: &str = "BURN_DTENSOR_PAR_MIN";
        if let Some(v) = get(PAR_MIN) {
            c.parallel_min_elements = v
                .trim()
                .parse()
                .map_err(|_| bad(PAR_MIN, &v, "a number of elements, e.g. 262144"))?;
        }
        const BUCKET: &str = "BURN_DTENSOR_BUCKET_KIB";
        if let Some(v) = get(BUCKET) {
            c.gradient_bucket_bytes = kib(BUCKET, &v, "a number of KiB, e.g. 64 (0: no buckets)")?;
        }
        const STRIDED: &str = "BURN_DTENSOR_STRIDED_SEND";
        if let Some(v) = get(STRIDED) {
            c.strided_send = match v.trim() {
                "pack" => StridedSend::Pack,
                "datatype" => StridedSend::Datatype,
                "single-copy" => StridedSend::SingleCopy,
                _ => {
                    let expected = "`single-copy` (the default), `pack` or `datatype`";
                    return Err(bad(STRIDED, &v, expected));
                }
            };
        }
        const LARGE: &str = "BURN_DTENSOR_LARGE_MESSAGE_KIB";
        if let Some(v) = get(LARGE) {
            c.large_message_bytes =
                kib(LARGE, &v, "a number of KiB, e.g. 1024 (0: every message)")?;
        }
        Ok(c)
    }

    /// With [`Config::collective_timeout`] set to `t`.
    pub fn with_collective_timeout(mut self, t: Duration) -> Self {
        self.collective_timeout = t;
        self
    }
    /// With [`Config::reduction`] set to `r`.
    pub fn with_reduction(mut self, r: Reduction) -> Self {
        self.reduction = r;
        self
    }
    /// With [`Config::process_engine`] set to `e`.
    pub fn with_process_engine(mut self, e: ProcessEngine) -> Self {
        self.process_engine = e;
        self
    }
    /// With [`Config::stacked_execution`] set to `on`.
    pub fn with_stacked_execution(mut self, on: bool) -> Self {
        self.stacked_execution = on;
        self
    }
    /// With [`Config::parallel_min_elements`] set to `n`.
    pub fn with_parallel_min_elements(mut self, n: usize) -> Self {
        self.parallel_min_elements = n;
        self
    }
    /// With [`Config::gradient_bucket_bytes`] set to `bytes` (0: no buckets).
    pub fn with_gradient_bucket_bytes(mut self, bytes: usize) -> Self {
        self.gradient_bucket_bytes = bytes;
        self
    }
    /// With [`Config::strided_send`] set to `s`.
    pub fn with_strided_send(mut self, s: StridedSend) -> Self {
        self.strided_send = s;
        self
    }
    /// With [`Config::large_message_bytes`] set to `bytes` (0: every collective is large).
    pub fn with_large_message_bytes(mut self, bytes: usize) -> Self {
        self.large_message_bytes = bytes;
        self
    }
}

/// `None` until [`configure`] or the first [`config`].
static CURRENT: RwLock<Option<Config>> = RwLock::new(None);

/// Installs `config` for this process, from now on (see the [module docs](self) for when each
/// setting is read). Every process of an SPMD run must install the same reduction and engine.
pub fn configure(config: Config) {
    *CURRENT.write().unwrap_or_else(|e| e.into_inner()) = Some(config);
    GENERATION.fetch_add(1, Ordering::Release);
}

/// Counts the [`configure`] calls, so that each thread's copy of the configuration
/// ([`config`], read on every op) is refreshed only when it changed.
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// The configuration in force: the last [`configure`]d one, else the environment's
/// ([`Config::from_env`], read once).
///
/// # Errors
/// [`DTensorError::Config`] when nothing was configured and an environment variable is bad:
/// raised where a mesh or the world is made, before any op.
pub fn try_config() -> Result<Config> {
    if let Some(c) = *CURRENT.read().unwrap_or_else(|e| e.into_inner()) {
        return Ok(c);
    }
    let c = Config::from_env()?;
    let mut slot = CURRENT.write().unwrap_or_else(|e| e.into_inner());
    Ok(*slot.get_or_insert(c))
}

/// [`try_config`] for the places that cannot return an error (inside an op): a bad environment
/// was already reported when the mesh was made ([`try_config`]'s error); if nothing made a
/// mesh yet, the built-in defaults.
///
/// Each thread keeps a copy, refreshed when [`configure`] was called since it was taken: ops read
/// the configuration on every call, and the shared lock cost about 4% of a small op.
pub fn config() -> Config {
    thread_local!(static COPY: Cell<Option<(u64, Config)>> = const { Cell::new(None) });
    let generation = GENERATION.load(Ordering::Acquire);
    if let Some((g, c)) = COPY.get()
        && g == generation
    {
        return c;
    }
    let c = try_config().unwrap_or_default();
    COPY.set(Some((generation, c)));
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn environment_overrides_each_default_and_bad_values_are_named() {
        assert_eq!(Config::from_vars(vars(&[])).unwrap(), Config::default());
        let c = Config::from_vars(vars(&[
            ("BURN_DTENSOR_COLLECTIVE_TIMEOUT_S", "2.5"),
            ("BURN_DTENSOR_SPMD_REDUCTION", "engine"),
            ("BURN_DTENSOR_SPMD_ENGINE", "nccl"),
            ("BURN_DTENSOR_STACKED", "0"),
            ("BURN_DTENSOR_PAR_MIN", "16"),
            ("BURN_DTENSOR_BUCKET_KIB", "512"),
            ("BURN_DTENSOR_STRIDED_SEND", "pack"),
            ("BURN_DTENSOR_LARGE_MESSAGE_KIB", "256"),
        ]))
        .unwrap();
        assert_eq!(
            c,
            Config::default()
                .with_collective_timeout(Duration::from_millis(2500))
                .with_reduction(Reduction::Engine)
                .with_process_engine(ProcessEngine::Nccl)
                .with_stacked_execution(false)
                .with_parallel_min_elements(16)
                .with_gradient_bucket_bytes(512 << 10)
                .with_strided_send(StridedSend::Pack)
                .with_large_message_bytes(256 << 10)
        );
        for (var, value, says) in [
            ("BURN_DTENSOR_COLLECTIVE_TIMEOUT_S", "-1", "positive number"),
            ("BURN_DTENSOR_COLLECTIVE_TIMEOUT_S", "1e300", "below 1.8e19"),
            (
                "BURN_DTENSOR_COLLECTIVE_TIMEOUT_S",
                "inf",
                "positive number",
            ),
            (
                "BURN_DTENSOR_COLLECTIVE_TIMEOUT_S",
                "NaN",
                "positive number",
            ),
            ("BURN_DTENSOR_SPMD_REDUCTION", "fast", "`ordered`"),
            ("BURN_DTENSOR_SPMD_ENGINE", "bogus", "`mpi`"),
            ("BURN_DTENSOR_STACKED", "yes", "`0`"),
            ("BURN_DTENSOR_PAR_MIN", "lots", "number of elements"),
            ("BURN_DTENSOR_BUCKET_KIB", "-3", "number of KiB"),
            ("BURN_DTENSOR_STRIDED_SEND", "typed", "`single-copy`"),
            ("BURN_DTENSOR_LARGE_MESSAGE_KIB", "1M", "number of KiB"),
        ] {
            let e = Config::from_vars(|k| (k == var).then(|| value.to_string())).unwrap_err();
            let text = e.to_string();
            assert!(
                matches!(e, DTensorError::Config { .. })
                    && text.contains(var)
                    && text.contains(value)
                    && text.contains(says),
                "{text}"
            );
        }
    }
}
