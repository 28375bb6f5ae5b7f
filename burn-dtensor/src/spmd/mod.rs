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
//! The world comes from the launch environment ([`init`], detected in one place:
//! [`LaunchEnv`]): under `mpirun` (Open MPI's `OMPI_COMM_WORLD_*`), MPICH/Hydra (`PMI_*`),
//! `srun --mpi=pmix` (`SLURM_*`) or another PMIx launcher, with the `mpi` feature, it is the MPI
//! world; a process started alone is a world of one, where [`Mesh::spmd`](crate::Mesh::spmd)
//! is [`Mesh::new`](crate::Mesh::new) and nothing here costs anything. A launch this process
//! cannot join (no `mpi` feature, torchrun, variables set by hand) is an error, never a
//! process training alone as one of several copies.
//!
//! # Faults
//! A fault the job cannot continue from (a timed-out collective or start-up, a panic in a
//! multi-process world, [`abort_job`]) ends the whole job through one policy, documented in
//! `fault.rs`: `MPI_Abort` through the engine, so the launcher ends every rank at once, with a
//! message naming the rank and the cause. Otherwise the library returns errors; a rank that
//! dies makes the launcher end the job at once, naming that rank.

use std::collections::hash_map::DefaultHasher;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::collective::engine::AcrossWrap;
use crate::config::try_config;
use crate::error::{DTensorError, Result};
use crate::fault::{Peer, end_job, hostname, install_panic_hook, world_group};

mod launch_env;
pub use crate::collective::interface::ProcessGroup;
pub use crate::config::Reduction;
pub use crate::fault::TIMEOUT_EXIT_CODE;
pub use crate::inner::exclusive_device;
pub use launch_env::{LaunchEnv, LaunchSource};

/// The processes of this SPMD run. [`init`] gives it.
pub struct World {
    group: Option<Arc<dyn ProcessGroup>>,
    launch: LaunchEnv,
    // Read by the engines' fault messages and the device check.
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
    /// How this process was launched: the source, the local rank and the node.
    pub fn launch(&self) -> &LaunchEnv {
        &self.launch
    }
    /// The host each rank runs on, in rank order (exchanged at start-up; this host's name
    /// alone in a world of one).
    pub fn hosts(&self) -> Vec<String> {
        if self.peers.is_empty() {
            vec![hostname()]
        } else {
            self.peers.iter().map(|p| p.host.clone()).collect()
        }
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

    /// Checks that every process passes the same `value` for `what` (a mesh, a seed: anything
    /// all ranks must agree on), the start-up handshake of an SPMD run. Collective: every
    /// process calls it, in the same order. Free in a world of one.
    ///
    /// # Errors
    /// [`DTensorError::ProcessMismatch`] naming the first rank whose value differs from this
    /// process's, with both values (shortened).
    pub fn agree(&self, what: &str, value: &str) -> Result<()> {
        self.agree_fields(what, &[(what, value.to_string())])
    }

    /// As [`World::agree`] for a record of named `fields` (a configuration): a mismatch names
    /// the first field that differs and its value on both ranks, e.g. "the processes disagree on
    /// the training configuration (`lr`): rank 1 has `0.01`, rank 0 has `0.001`". A field one
    /// rank lacks shows as `<absent>`.
    ///
    /// # Errors
    /// [`DTensorError::ProcessMismatch`] as above.
    pub fn agree_fields<S: AsRef<str>>(&self, what: &str, fields: &[(S, String)]) -> Result<()> {
        let Some(g) = &self.group else {
            return Ok(());
        };
        let encode = |k: &str, v: &str| format!("{}\u{1f}{}", k, v.replace('\u{1e}', " "));
        let mine: String = fields
            .iter()
            .map(|(k, v)| encode(k.as_ref(), v))
            .collect::<Vec<_>>()
            .join("\u{1e}");
        let all = gather_bytes(
            g.as_ref(),
            mine.as_bytes(),
            &format!("start-up check of the {what}"),
        );
        let decode = |b: &[u8]| -> Vec<(String, String)> {
            String::from_utf8_lossy(b)
                .split('\u{1e}')
                .filter(|f| !f.is_empty())
                .map(|f| {
                    let (k, v) = f.split_once('\u{1f}').unwrap_or((f, ""));
                    (k.to_string(), v.to_string())
                })
                .collect()
        };
        let show = |v: Option<&str>| match v {
            None => "<absent>".to_string(),
            Some(v) if v.chars().count() > 200 => {
                let mut h = DefaultHasher::new();
                v.hash(&mut h);
                format!(
                    "`{}...` (hash {:016x})",
                    v.chars().take(160).collect::<String>(),
                    h.finish()
                )
            }
            Some(v) => format!("`{v}`"),
        };
        let ours = decode(mine.as_bytes());
        for (r, bytes) in all.iter().enumerate() {
            let theirs = decode(bytes);
            let names = ours.iter().chain(&theirs).map(|(k, _)| k.as_str());
            for k in names {
                let a = ours.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
                let b = theirs.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
                if a != b {
                    return Err(DTensorError::ProcessMismatch {
                        what: if k == what {
                            what.to_string()
                        } else {
                            format!("{what} (`{k}`)")
                        },
                        me: self.rank(),
                        ours: show(a),
                        rank: r,
                        theirs: show(b),
                    });
                }
            }
        }
        Ok(())
    }

    /// Checks that every process runs the same inner backend `B` with the same element types:
    /// a different backend or element type changes the bytes every collective moves, which an
    /// engine reports only as a raw error (`MPI_ERR_TRUNCATE`) or a hang. Collective, free in a
    /// world of one.
    ///
    /// # Errors
    /// [`DTensorError::ProcessMismatch`] naming the field (`backend`, `float element`, `int
    /// element`) and both values.
    pub fn agree_backend<B: burn::tensor::backend::Backend>(&self) -> Result<()> {
        use std::any::type_name;
        self.agree_fields(
            "inner backend",
            &[
                ("backend", type_name::<B>().to_string()),
                ("float element", type_name::<B::FloatElem>().to_string()),
                ("int element", type_name::<B::IntElem>().to_string()),
            ],
        )
    }

    /// Checks that no two processes on one host hold the same exclusive device (a GPU:
    /// [`crate::inner::exclusive_device`]): `devices` are this process's devices, named as their
    /// `Debug` form (`Cuda(0)`). Two processes on one GPU would share its memory
    /// and serialise on it, and NCCL refuses such a communicator only later, inside the first
    /// collective; refused here instead, before any collective of a mesh. Host devices (NdArray,
    /// Flex, a Vulkan CPU adapter) are never exclusive. Collective, free in a world of one.
    ///
    /// # Errors
    /// [`DTensorError::SharedDevice`] naming the device, the host and both ranks.
    pub fn claim_devices(&self, devices: &[String]) -> Result<()> {
        let Some(g) = &self.group else {
            return Ok(());
        };
        let mine = devices.join("\u{1e}");
        let all = gather_bytes(g.as_ref(), mine.as_bytes(), "start-up check of the devices");
        let mut seen: Vec<(&str, String, usize)> = Vec::new();
        for (r, bytes) in all.iter().enumerate() {
            let host = self.peers.get(r).map_or("?", |p| p.host.as_str());
            let text = String::from_utf8_lossy(bytes);
            for d in text.split('\u{1e}').filter(|d| !d.is_empty()) {
                if let Some((_, _, first)) = seen.iter().find(|(h, dd, _)| *h == host && dd == d) {
                    return Err(DTensorError::SharedDevice {
                        device: d.to_string(),
                        host: host.to_string(),
                        first: *first,
                        second: r,
                    });
                }
                seen.push((host, d.to_string(), r));
            }
        }
        Ok(())
    }

    /// Every process's `mine` (any length), in rank order: a collective that every process
    /// calls in the same order (`[mine]` in a world of one). For control messages (a
    /// checkpoint's shard index, say): the bytes go through two all-gathers on the world group,
    /// whose messages are never large (no single copy, waits polled gently), and are copied once
    /// more into the returned vectors. One process's payload for all goes through
    /// [`broadcast_bytes`](Self::broadcast_bytes) instead.
    pub fn all_gather_bytes(&self, mine: &[u8], what: &str) -> Vec<Vec<u8>> {
        match &self.group {
            Some(g) => gather_bytes(g.as_ref(), mine, what),
            None => vec![mine.to_vec()],
        }
    }

    /// `root`'s `bytes` on every process (any length): a collective that every process calls in
    /// the same order, each passing a vector of which only `root`'s is read (the others may pass
    /// an empty one). `root` gets its own vector back (not copied); every other process receives
    /// one copy of it (a length, then the bytes as [`broadcast_into`](Self::broadcast_into)
    /// sends them). For one-off payloads whose length only `root` knows (the header of the
    /// IMDB examples' prepared data). In a world of one: `bytes`.
    ///
    /// # Panics
    /// When `root` is not a rank of the world (`0..size()`): a caller's bug, the same on every
    /// process.
    pub fn broadcast_bytes(&self, bytes: Vec<u8>, root: usize, what: &str) -> Vec<u8> {
        self.check_root(root, "broadcast_bytes");
        let Some(g) = &self.group else {
            return bytes;
        };
        let mut len = (bytes.len() as u64).to_le_bytes();
        g.broadcast(&mut len, root, what);
        let mut bytes = if self.rank() == root {
            bytes
        } else {
            vec![0; u64::from_le_bytes(len) as usize]
        };
        broadcast_chunks(g.as_ref(), &mut bytes, root, what);
        bytes
    }

    /// Writes `root`'s `buf` into every other process's `buf`, in place: a collective that every
    /// process calls in the same order with a buffer of the same length (`root`'s is only
    /// read). For one-off payloads received straight into their final, typed memory (a
    /// `Vec<u32>` seen as bytes), so that no process holds a second copy: the IMDB examples'
    /// prepared arrays, 38-40 MB from rank 0. The bytes go in chunks of at most 1 GiB (MPI
    /// counts are `int`s) through the world group's gentle path (waits polled against the
    /// collective timeout), after one small exchange that checks the lengths. Free in a world of
    /// one.
    ///
    /// # Errors
    /// [`DTensorError::ProcessMismatch`] on every process when the lengths differ, naming the
    /// first rank whose length differs from this process's; nothing is sent then.
    ///
    /// # Panics
    /// When `root` is not a rank of the world (`0..size()`): a caller's bug, the same on every
    /// process.
    pub fn broadcast_into(&self, buf: &mut [u8], root: usize, what: &str) -> Result<()> {
        self.check_root(root, "broadcast_into");
        let Some(g) = &self.group else {
            return Ok(());
        };
        self.agree(
            &format!("length in bytes of the {what}"),
            &buf.len().to_string(),
        )?;
        broadcast_chunks(g.as_ref(), buf, root, what);
        Ok(())
    }

    fn check_root(&self, root: usize, call: &str) {
        assert!(
            root < self.size(),
            "burn-dtensor: {call} from rank {root} in a world of {}: give a rank below the \
             world's size",
            self.size()
        );
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

static WORLD: OnceLock<std::result::Result<World, DTensorError>> = OnceLock::new();
/// Set when [`init`] is entered: from then on [`abort_job`] never calls it (it is running, so a
/// call would re-enter it, or it has finished and [`WORLD`] holds its outcome).
static INIT_ENTERED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Joins the SPMD world once per process (later calls return the same world): the MPI world
/// when the launch environment ([`LaunchEnv::detect`]) says this process is one of several,
/// else a world of one. Rank and host of every peer are exchanged, for fault messages; in a
/// multi-process world a panic hook is installed that ends the whole job ([`abort_job`]) after
/// the panic message is printed, so a panicking rank never leaves the others waiting. MPI is
/// finalised when the process exits.
///
/// # Errors
/// [`DTensorError::Spmd`] for a launch this process cannot join, saying what it saw and what
/// to do ([`LaunchEnv::joinable`]: no `mpi` feature, torchrun), when MPI fails to start, or
/// when the MPI world's size is not the one the environment states (variables set by hand,
/// `srun` without `--mpi=pmix`).
pub fn init() -> Result<&'static World> {
    WORLD
        .get_or_init(|| {
            INIT_ENTERED.store(true, std::sync::atomic::Ordering::Release);
            let launch = LaunchEnv::detect()?;
            launch.joinable()?;
            let group = if launch.is_multi_process() {
                let g = start_watched(&launch)?;
                crate::fault::started(g.clone());
                if launch.size.is_some_and(|s| s != g.size()) {
                    return Err(launch.world_mismatch(g.size()));
                }
                // A PMIx launch of one process is a world of one.
                (g.size() > 1).then_some(g)
            } else {
                None
            };
            let me = Peer {
                host: hostname(),
                pid: std::process::id(),
            };
            let peers = match &group {
                None => vec![me],
                Some(g) => {
                    install_panic_hook();
                    exchange_peers(g.as_ref(), &me)
                }
            };
            crate::fault::set_peers(peers.clone());
            Ok(World {
                group,
                launch,
                peers,
            })
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Ends the whole SPMD job: prints `message` on standard error as
/// `burn-dtensor [rank R of N, pid P on HOST]: MESSAGE`, then ends every process with exit
/// status `code` (`code` 0 becomes 1) through the engine's abort (`MPI_Abort`, after which the
/// launcher stops every rank within about a second). A process launched as one of several that
/// has not joined the world yet joins it first (bounded by
/// [`Config::collective_timeout`](crate::Config::collective_timeout)), so its peers, which are
/// joining or already past start-up, are ended too rather than left waiting.
///
/// For the application's own errors after start-up (the library ends a job only through the
/// fault policy of the module docs). In a world of one process there is no job to end across
/// processes: the process aborts ([`std::process::abort`]); an application that wants its own
/// exit status there returns it from `main` instead (the examples' `finish` does).
pub fn abort_job(message: &str, code: i32) -> ! {
    let group = world_group().or_else(|| {
        // Not started: join first (unless this is start-up itself failing), so that the
        // peers are ended too.
        if INIT_ENTERED.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        LaunchEnv::detect()
            .ok()
            .filter(|l| l.is_multi_process() && l.joinable().is_ok())
            .and_then(|_| init().ok())
            .and_then(World::group)
            .cloned()
    });
    end_job(group, message, code)
}

/// The engine's start-up under the collective timeout. Joining the world (`MPI_Init`) waits for
/// every process of it, so a process that never joins (not started, stuck or dead before
/// joining; one that dies, `mpirun` reports at once) would hold the others forever: past
/// [`Config::collective_timeout`](crate::Config::collective_timeout) this process prints which
/// rank it is, the world size and what it was waiting for, and aborts (the fault policy of
/// `fault.rs`: no engine yet to end the job through).
fn start_watched(launch: &LaunchEnv) -> Result<Arc<dyn ProcessGroup>> {
    let (rank, size) = (
        launch.rank,
        launch.size.map_or("?".into(), |s| s.to_string()),
    );
    use std::sync::atomic::{AtomicBool, Ordering};
    let done = Arc::new(AtomicBool::new(false));
    let seen = done.clone();
    let timeout = try_config()?.collective_timeout;
    std::thread::spawn(move || {
        let start = std::time::Instant::now();
        while start.elapsed() < timeout {
            if seen.load(Ordering::Acquire) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        if !seen.load(Ordering::Acquire) {
            let message = format!(
                "rank {rank} of {size}: the SPMD world did not start within {:.1} s (joining \
                 waits for every process): at least one of the {size} processes never joined \
                 (not started, stuck, or dead before joining); raise the collective timeout \
                 (BURN_DTENSOR_COLLECTIVE_TIMEOUT_S) if start-up is slow",
                timeout.as_secs_f64()
            );
            end_job(None, &message, TIMEOUT_EXIT_CODE);
        }
    });
    let group = crate::collective::engine::start_world();
    done.store(true, Ordering::Release);
    group
}

/// `root`'s `buf` into every process's, in chunks of at most 1 GiB: MPI counts are `int`s.
fn broadcast_chunks(g: &dyn ProcessGroup, buf: &mut [u8], root: usize, what: &str) {
    const CHUNK: usize = 1 << 30;
    for chunk in buf.chunks_mut(CHUNK) {
        g.broadcast(chunk, root, what);
    }
}

/// Every member's `mine` (any length), in rank order: the lengths, then the bytes (two
/// all-gathers).
fn gather_bytes(g: &dyn ProcessGroup, mine: &[u8], what: &str) -> Vec<Vec<u8>> {
    let lens = g.all_gather(&(mine.len() as u64).to_le_bytes(), &vec![8; g.size()], what);
    let counts: Vec<usize> = lens
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()) as usize)
        .collect();
    let all = g.all_gather(mine, &counts, what);
    let mut at = 0;
    counts
        .iter()
        .map(|&n| {
            at += n;
            all[at - n..at].to_vec()
        })
        .collect()
}

fn exchange_peers(g: &dyn ProcessGroup, me: &Peer) -> Vec<Peer> {
    let mine = format!("{}\t{}", me.pid, me.host);
    gather_bytes(g, mine.as_bytes(), "start-up exchange of the peers")
        .iter()
        .map(|b| {
            let s = String::from_utf8_lossy(b);
            let (pid, host) = s.split_once('\t').unwrap_or(("0", "?"));
            Peer {
                host: host.to_string(),
                pid: pid.parse().unwrap_or(0),
            }
        })
        .collect()
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
/// process asks for the same mesh, device type (`device_type`, the inner backend's device),
/// [`reduction`], gradient bucket size and strided send (every member must call the same engine
/// collective for an all-to-all). Collective over the world (every process builds the same
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
    device_type: &'static str,
    (engine, wrap): (&'static str, Option<AcrossWrap>),
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
    // Everything that shapes the collective sequence and the bytes on the wire: a difference
    // here would surface later as a raw engine error (MPI_ERR_TRUNCATE) or a hang.
    let cfg = try_config()?;
    world.agree_fields(
        "mesh",
        &[
            ("mesh axes", desc.clone()),
            ("devices per process", local.to_string()),
            ("device type", device_type.to_string()),
            ("cross-process engine", engine.to_string()),
            ("reduction", format!("{:?}", cfg.reduction)),
            (
                "gradient bucket bytes",
                cfg.gradient_bucket_bytes.to_string(),
            ),
            ("strided send", format!("{:?}", cfg.strided_send)),
            ("large message bytes", cfg.large_message_bytes.to_string()),
        ],
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
