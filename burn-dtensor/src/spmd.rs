//! SPMD across processes (multi-controller, as `jax.distributed` and torchrun): the process
//! world, the [`ProcessGroup`] interface a collective engine implements, and the process grid
//! of a mesh.
//!
//! Every process runs the same program. A mesh built with [`Mesh::spmd`](crate::Mesh::spmd)
//! spans every process of the world: each process contributes the same number of devices and
//! owns one contiguous block of mesh positions (JAX's rule), its *addressable* positions, and
//! holds only their shards. Sharding rules and redistribution plans are pure functions of
//! layouts and shapes, so every process takes the same decisions; a collective along a mesh axis
//! combines the shards inside the process first (the in-process path: stacked, CubeCL or
//! generic), then across the processes of that axis' process group (the engine: MPI).
//!
//! The world comes from the launch environment ([`init`]): under `mpirun` (OpenMPI's
//! `OMPI_COMM_WORLD_*`, MPICH/PMI's `PMI_*`) with the `mpi` feature it is the MPI world; a
//! process started alone is a world of one, where [`Mesh::spmd`](crate::Mesh::spmd) is
//! [`Mesh::new`](crate::Mesh::new) and nothing here costs anything.
//!
//! Faults: every cross-process collective waits at most [`collective_timeout`] (default 30 s,
//! `BURN_DTENSOR_COLLECTIVE_TIMEOUT_S`); past it the process prints which collective, which mesh
//! axis and which peer ranks are gone or stopped, and exits with status [`TIMEOUT_EXIT_CODE`]
//! (a collective runs inside a Burn op, which cannot return an error). A rank that dies makes
//! `mpirun` end the job at once, naming that rank.

use std::collections::hash_map::DefaultHasher;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use burn::tensor::DType;

use crate::error::{DTensorError, Result};
use crate::layout::ReduceOp;

/// Exit status of a process whose cross-process collective timed out.
pub const TIMEOUT_EXIT_CODE: i32 = 75;

/// A group of processes that run collectives together: the world, or the processes along one
/// mesh axis. Implemented once per engine ([`crate::collective`]'s `mpi` for MPI; a world of one
/// process needs none). Buffers are host bytes: the element-wise reduction needs `dtype`, the
/// other collectives move bytes.
///
/// A collective that does not complete within [`collective_timeout`] ends the process with a
/// message naming the operation `what` and the missing peers (see the module docs): the methods
/// return only on success.
pub trait ProcessGroup: Send + Sync {
    /// This process's rank in the group (`0..size`).
    fn rank(&self) -> usize;
    /// Number of processes in the group.
    fn size(&self) -> usize;
    /// The world ranks of the members, in group rank order (for diagnostics).
    fn world_ranks(&self) -> &[usize];
    /// The name of the engine (`mpi`).
    fn engine(&self) -> &'static str;
    /// Splits the group: processes passing equal `color` form a sub-group, ranked by `key`.
    /// Collective: every member calls it, in the same order.
    fn split(&self, color: usize, key: usize) -> Arc<dyn ProcessGroup>;
    /// In place, the element-wise `op`-reduction of every member's `buf` (elements of `dtype`;
    /// bool is one byte per element, reduced as or/and).
    fn all_reduce(&self, buf: &mut [u8], dtype: DType, op: ReduceOp, what: &str);
    /// The concatenation, in rank order, of every member's `send`; member `r` sends `counts[r]`
    /// bytes (uneven and empty parts allowed).
    fn all_gather(&self, send: &[u8], counts: &[usize], what: &str) -> Vec<u8>;
    /// Gives every member the `buf` of member `root` (all pass buffers of the same length).
    fn broadcast(&self, buf: &mut [u8], root: usize, what: &str);
}

/// Where each rank of the world runs, exchanged at start-up (for fault messages).
#[derive(Clone, Debug)]
pub(crate) struct Peer {
    pub(crate) host: String,
    pub(crate) pid: u32,
}

/// The processes of this SPMD run. [`init`] gives it.
pub struct World {
    group: Option<Arc<dyn ProcessGroup>>,
    // Read by the engines' fault messages.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    peers: Vec<Peer>,
}

impl fmt::Debug for World {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "World(rank {} of {})", self.rank(), self.size())
    }
}

impl World {
    /// This process's rank (0 is the chief: it writes summaries and checkpoints).
    pub fn rank(&self) -> usize {
        self.group.as_ref().map_or(0, |g| g.rank())
    }
    /// Number of processes.
    pub fn size(&self) -> usize {
        self.group.as_ref().map_or(1, |g| g.size())
    }
    /// Whether this is rank 0.
    pub fn is_chief(&self) -> bool {
        self.rank() == 0
    }
    /// The engine, `"mpi"`, or `"none"` for a world of one process.
    pub fn engine(&self) -> &'static str {
        self.group.as_ref().map_or("none", |g| g.engine())
    }
    /// The world's process group (`None` in a world of one): the engine itself, for benchmarks
    /// and tools that move host bytes between processes.
    pub fn process_group(&self) -> Option<&Arc<dyn ProcessGroup>> {
        self.group()
    }
    pub(crate) fn group(&self) -> Option<&Arc<dyn ProcessGroup>> {
        self.group.as_ref()
    }

    /// Checks that every process passes the same `value` for `what` (a mesh, a layout map, a
    /// seed: anything all ranks must agree on), the start-up handshake of an SPMD run.
    /// Collective: every process calls it, in the same order. Free in a world of one.
    ///
    /// # Errors
    /// [`DTensorError::ProcessMismatch`] naming the first rank whose value differs from this
    /// process's, with both values (shortened).
    pub fn agree(&self, what: &str, value: &str) -> Result<()> {
        let Some(g) = &self.group else {
            return Ok(());
        };
        let mine = value.as_bytes();
        let mut len = (mine.len() as u64).to_le_bytes().to_vec();
        let lens = g.all_gather(
            &len,
            &vec![8; g.size()],
            &format!("start-up check of the {what}"),
        );
        let counts: Vec<usize> = lens
            .chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()) as usize)
            .collect();
        let all = g.all_gather(mine, &counts, &format!("start-up check of the {what}"));
        len.clear();
        let mut at = 0;
        for (r, &n) in counts.iter().enumerate() {
            let theirs = &all[at..at + n];
            at += n;
            if theirs != mine {
                let show = |b: &[u8]| {
                    let s = String::from_utf8_lossy(b).replace('\n', " ");
                    if s.chars().count() > 80 {
                        let mut h = DefaultHasher::new();
                        b.hash(&mut h);
                        format!(
                            "`{}...` (hash {:016x})",
                            s.chars().take(60).collect::<String>(),
                            h.finish()
                        )
                    } else {
                        format!("`{s}`")
                    }
                };
                return Err(DTensorError::ProcessMismatch {
                    what: what.to_string(),
                    me: self.rank(),
                    ours: show(mine),
                    rank: r,
                    theirs: show(theirs),
                });
            }
        }
        Ok(())
    }

    /// Waits until every process gets here.
    pub fn barrier(&self) {
        if let Some(g) = &self.group {
            g.all_gather(&[], &vec![0; g.size()], "barrier");
        }
    }

    /// `what` for messages: `"rank 2 of 4"`.
    pub fn describe(&self) -> String {
        format!("rank {} of {}", self.rank(), self.size())
    }
}

/// The launch environment's `(rank, size)`: OpenMPI's `OMPI_COMM_WORLD_RANK/SIZE`, else
/// PMI's `PMI_RANK/PMI_SIZE` (MPICH, Slurm); `None` for a process started alone.
pub fn launch_env() -> Option<(usize, usize)> {
    let get = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<usize>().ok());
    let pair = |r: &str, s: &str| Some((get(r)?, get(s)?));
    pair("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE").or_else(|| pair("PMI_RANK", "PMI_SIZE"))
}

static WORLD: OnceLock<std::result::Result<World, DTensorError>> = OnceLock::new();

/// Joins the SPMD world once per process (later calls return the same world): the MPI world
/// when the process was launched by `mpirun` (or another PMI launcher) with more than one
/// process, else a world of one. Rank and host of every peer are exchanged, for fault messages.
/// MPI is finalised when the process exits.
///
/// # Errors
/// [`DTensorError::Spmd`] when launched as one of several processes by a binary built without
/// the `mpi` feature, or when MPI fails to start.
pub fn init() -> Result<&'static World> {
    WORLD
        .get_or_init(|| {
            let group = match launch_env() {
                Some((rank, size)) if size > 1 => Some(start_watched(rank, size)?),
                _ => None,
            };
            let me = Peer {
                host: hostname(),
                pid: std::process::id(),
            };
            let peers = match &group {
                None => vec![me],
                Some(g) => exchange_peers(g.as_ref(), &me),
            };
            Ok(World { group, peers })
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// The engine's start-up under the collective timeout. Joining the world (`MPI_Init`) waits for
/// every process of it, so a process that never joins (not started, stuck or dead before
/// joining; one that dies, `mpirun` reports at once) would hold the others forever: past
/// [`collective_timeout`] this process prints which rank it is, the world size and what it was
/// waiting for, and exits with [`TIMEOUT_EXIT_CODE`].
fn start_watched(rank: usize, size: usize) -> Result<Arc<dyn ProcessGroup>> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let done = Arc::new(AtomicBool::new(false));
    let seen = done.clone();
    let timeout = collective_timeout();
    std::thread::spawn(move || {
        let start = std::time::Instant::now();
        while start.elapsed() < timeout {
            if seen.load(Ordering::Acquire) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        if !seen.load(Ordering::Acquire) {
            eprintln!(
                "burn-dtensor: rank {rank} of {size}: the SPMD world did not start within {:.1} s \
                 (joining waits for every process): at least one of the {size} processes never \
                 joined (not started, stuck, or dead before joining); raise \
                 BURN_DTENSOR_COLLECTIVE_TIMEOUT_S if start-up is slow",
                timeout.as_secs_f64()
            );
            // SAFETY: ends the process without running exit handlers (MPI is not usable).
            unsafe { libc::_exit(TIMEOUT_EXIT_CODE) };
        }
    });
    let group = engine();
    done.store(true, Ordering::Release);
    group
}

#[cfg(feature = "mpi")]
fn engine() -> Result<Arc<dyn ProcessGroup>> {
    crate::collective::mpi::world()
}

#[cfg(not(feature = "mpi"))]
fn engine() -> Result<Arc<dyn ProcessGroup>> {
    let (rank, size) = launch_env().unwrap_or((0, 1));
    Err(DTensorError::Spmd(format!(
        "this process is rank {rank} of {size} (launched by mpirun), but burn-dtensor was built \
         without the `mpi` feature; rebuild with `--features mpi` (needs an MPI library: \
         `apt-get install openmpi-bin libopenmpi-dev libclang-dev`)"
    )))
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

fn exchange_peers(g: &dyn ProcessGroup, me: &Peer) -> Vec<Peer> {
    let mine = format!("{}\t{}", me.pid, me.host);
    let len = (mine.len() as u64).to_le_bytes();
    let lens = g.all_gather(&len, &vec![8; g.size()], "start-up exchange of the peers");
    let counts: Vec<usize> = lens
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()) as usize)
        .collect();
    let all = g.all_gather(mine.as_bytes(), &counts, "start-up exchange of the peers");
    let mut at = 0;
    counts
        .iter()
        .map(|&n| {
            let s = String::from_utf8_lossy(&all[at..at + n]).to_string();
            at += n;
            let (pid, host) = s.split_once('\t').unwrap_or(("0", "?"));
            Peer {
                host: host.to_string(),
                pid: pid.parse().unwrap_or(0),
            }
        })
        .collect()
}

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
    /// the engine's algorithm. `BURN_DTENSOR_SPMD_REDUCTION=engine`.
    Engine,
}

static REDUCTION: Mutex<Option<Reduction>> = Mutex::new(None);

/// The [`Reduction`] in force: [`set_reduction`], else `BURN_DTENSOR_SPMD_REDUCTION`
/// (`ordered` or `engine`), else [`Reduction::Ordered`]. Every process must use the same.
pub fn reduction() -> Reduction {
    if let Some(r) = *REDUCTION.lock().unwrap() {
        return r;
    }
    match std::env::var("BURN_DTENSOR_SPMD_REDUCTION").as_deref() {
        Ok("engine") => Reduction::Engine,
        _ => Reduction::Ordered,
    }
}

/// Sets [`reduction`] for this process (every process must choose the same).
pub fn set_reduction(r: Reduction) {
    *REDUCTION.lock().unwrap() = Some(r);
}

static TIMEOUT: Mutex<Option<Duration>> = Mutex::new(None);

/// How long a cross-process collective may wait for its peers before the process ends with a
/// message naming the missing ranks: [`set_collective_timeout`], else
/// `BURN_DTENSOR_COLLECTIVE_TIMEOUT_S` (seconds, fractions allowed), else 30 s.
pub fn collective_timeout() -> Duration {
    if let Some(t) = *TIMEOUT.lock().unwrap() {
        return t;
    }
    std::env::var("BURN_DTENSOR_COLLECTIVE_TIMEOUT_S")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|s| *s > 0.0 && s.is_finite())
        .map_or(Duration::from_secs(30), Duration::from_secs_f64)
}

/// Sets [`collective_timeout`] for this process.
pub fn set_collective_timeout(t: Duration) {
    *TIMEOUT.lock().unwrap() = Some(t);
}

/// Ends the process after a cross-process collective `what` over the world ranks `members`
/// waited `waited` without completing: prints which peers are not running (dead or stopped,
/// for peers on this host) and exits with [`TIMEOUT_EXIT_CODE`] without finalising MPI (a
/// finalise would wait on the stuck collective).
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) fn collective_failed(what: &str, members: &[usize], waited: Duration) -> ! {
    let world = WORLD.get().and_then(|w| w.as_ref().ok());
    let me = world.map_or(0, World::rank);
    let here = hostname();
    let mut gone = Vec::new();
    let mut unknown = Vec::new();
    if let Some(w) = world {
        for &r in members.iter().filter(|&&r| r != me) {
            let Some(p) = w.peers.get(r) else { continue };
            if p.host != here {
                unknown.push(format!("rank {r} (pid {} on {})", p.pid, p.host));
                continue;
            }
            match std::fs::read_to_string(format!("/proc/{}/stat", p.pid)) {
                Err(_) => gone.push(format!("rank {r} (pid {}) is dead", p.pid)),
                Ok(stat) => {
                    let state = stat
                        .rsplit_once(") ")
                        .and_then(|(_, rest)| rest.chars().next())
                        .unwrap_or('?');
                    match state {
                        'Z' | 'X' => gone.push(format!("rank {r} (pid {}) is dead", p.pid)),
                        'T' | 't' => gone.push(format!("rank {r} (pid {}) is stopped", p.pid)),
                        _ => {}
                    }
                }
            }
        }
    }
    let diagnosis = if !gone.is_empty() {
        gone.join(", ")
    } else if !unknown.is_empty() {
        format!(
            "the peers on this host are running; on other hosts: {}",
            unknown.join(", ")
        )
    } else {
        format!(
            "every peer of ranks {members:?} is still running: one of them has not reached this collective (a hung step, or processes running different programs)"
        )
    };
    eprintln!(
        "burn-dtensor [rank {me}]: error: {what} did not complete within {:.1} s: {diagnosis}. \
         Raise BURN_DTENSOR_COLLECTIVE_TIMEOUT_S if the peers are only slow.",
        waited.as_secs_f64()
    );
    // SAFETY: `_exit` ends the process at once (no atexit handler: MPI_Finalize would block).
    unsafe { libc::_exit(TIMEOUT_EXIT_CODE) }
}

/// How a mesh's positions are split over the processes of the world: per mesh axis the number
/// of processes along it (`procs`) and of positions each holds along it (`local`), with
/// `procs[a] * local[a]` the axis size; this process's coordinate in the process grid; and the
/// process group of each axis along which more than one process lies.
///
/// One process: every count 1 except `local` (the axis sizes) and no groups.
#[derive(Clone, Default)]
pub struct ProcessGrid {
    pub(crate) world_size: usize,
    pub(crate) procs: Vec<usize>,
    pub(crate) local_sizes: Vec<usize>,
    pub(crate) pcoord: Vec<usize>,
    /// Global flat index of each addressable position, row-major over the local block.
    pub(crate) positions: Vec<usize>,
    pub(crate) groups: Vec<Option<Arc<dyn ProcessGroup>>>,
}

impl PartialEq for ProcessGrid {
    fn eq(&self, o: &Self) -> bool {
        self.world_size == o.world_size && self.procs == o.procs && self.pcoord == o.pcoord
    }
}
impl Eq for ProcessGrid {}
impl Hash for ProcessGrid {
    fn hash<H: Hasher>(&self, h: &mut H) {
        (self.world_size, &self.procs, &self.pcoord).hash(h)
    }
}
impl fmt::Debug for ProcessGrid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ProcessGrid(procs {:?}, this process at {:?})",
            self.procs, self.pcoord
        )
    }
}

impl ProcessGrid {
    /// Positions along every axis held by this process: its block's extent per axis.
    pub fn local_sizes(&self) -> &[usize] {
        &self.local_sizes
    }
    /// Processes along every mesh axis.
    pub fn processes(&self) -> &[usize] {
        &self.procs
    }
    /// This process's coordinate in the process grid.
    pub fn process_coords(&self) -> &[usize] {
        &self.pcoord
    }
}

type GridKey = (Vec<(String, usize)>, usize, &'static str);
static GRIDS: Mutex<Vec<(GridKey, ProcessGrid)>> = Mutex::new(Vec::new());

/// The process grid of a mesh of `axes` over a world where each process contributes `local`
/// devices: each process takes the next contiguous row-major block of `local` positions, which
/// must be a box (JAX's rule): the trailing axes whole, then a divisor of one axis. Builds the
/// process group of every axis with more than one process along it, after checking that every
/// process asks for the same mesh. Collective over the world (every process builds the same
/// meshes in the same order); cached per `(axes, local, engine)`. `engine` is the
/// cross-process engine ([`crate::collective::engine::across_engine`]): its name, agreed on
/// with the mesh, and how an axis group is made from its MPI group (`None`: MPI itself).
///
/// # Errors
/// [`DTensorError::ProcessGrid`] when the block is not a box or the counts do not multiply;
/// [`DTensorError::ProcessMismatch`] when the processes ask for different meshes.
pub(crate) fn grid(
    axes: &[(String, usize)],
    local: usize,
    world: &World,
    (engine, wrap): (&'static str, Option<crate::collective::engine::AcrossWrap>),
) -> Result<ProcessGrid> {
    let key = (axes.to_vec(), local, engine);
    if let Some((_, g)) = GRIDS.lock().unwrap().iter().find(|(k, _)| *k == key) {
        return Ok(g.clone());
    }
    let n = world.size();
    let global: usize = axes.iter().map(|(_, s)| s).product();
    let desc = axes
        .iter()
        .map(|(a, s)| format!("{a}={s}"))
        .collect::<Vec<_>>()
        .join(",");
    world.agree(
        "mesh",
        &format!("{desc} with {local} devices per process, engine {engine}"),
    )?;
    let err = |reason: String| DTensorError::ProcessGrid {
        mesh: desc.clone(),
        global,
        processes: n,
        local,
        reason,
    };
    if local == 0 || global != local * n {
        return Err(err(format!(
            "{n} x {local} = {} devices, the mesh needs {global}; give each process {} devices",
            n * local,
            if global.is_multiple_of(n) {
                (global / n).to_string()
            } else {
                format!("a share of {global} (not divisible by {n})")
            }
        )));
    }
    let mut local_sizes = vec![1; axes.len()];
    let mut rem = local;
    for a in (0..axes.len()).rev() {
        let s = axes[a].1;
        if rem == 1 {
            break;
        }
        if rem.is_multiple_of(s) {
            local_sizes[a] = s;
            rem /= s;
        } else if s.is_multiple_of(rem) {
            local_sizes[a] = rem;
            rem = 1;
        } else {
            return Err(err(format!(
                "a block of {local} consecutive positions is not a box of the mesh (axis `{}` of size {s} \
                 vs the {rem} positions left); reorder the mesh axes or change the process count",
                axes[a].0
            )));
        }
    }
    let procs: Vec<usize> = axes
        .iter()
        .zip(&local_sizes)
        .map(|((_, s), l)| s / l)
        .collect();
    // Row-major process coordinate of this rank.
    let mut r = world.rank();
    let mut pcoord = vec![0; axes.len()];
    for a in (0..axes.len()).rev() {
        pcoord[a] = r % procs[a];
        r /= procs[a];
    }
    // Addressable positions: row-major over the local block.
    let mut strides = vec![1; axes.len()];
    for a in (0..axes.len().saturating_sub(1)).rev() {
        strides[a] = strides[a + 1] * axes[a + 1].1;
    }
    let positions = (0..local)
        .map(|j| {
            let mut j = j;
            let mut flat = 0;
            for a in (0..axes.len()).rev() {
                let c = j % local_sizes[a];
                j /= local_sizes[a];
                flat += (pcoord[a] * local_sizes[a] + c) * strides[a];
            }
            flat
        })
        .collect();
    let world_group = world.group();
    let groups = (0..axes.len())
        .map(|a| {
            let Some(g) = world_group else {
                return Ok(None);
            };
            if procs[a] == 1 {
                return Ok(None);
            }
            // Processes differing only on axis `a`: the color is the process grid index with
            // coordinate `a` zeroed, the key the coordinate on `a`.
            let color = (0..axes.len()).fold(0, |acc, b| {
                acc * procs[b] + if b == a { 0 } else { pcoord[b] }
            });
            let sub = g.split(color, pcoord[a]);
            match &wrap {
                None => Ok(Some(sub)),
                Some(w) => w(sub).map(Some),
            }
        })
        .collect::<Result<_>>()?;
    let g = ProcessGrid {
        world_size: n,
        procs,
        local_sizes,
        pcoord,
        positions,
        groups,
    };
    GRIDS.lock().unwrap().push((key, g.clone()));
    Ok(g)
}
