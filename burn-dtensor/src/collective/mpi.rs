//! The MPI engine of [`ProcessGroup`]: collectives across processes and hosts on the `mpi`
//! crate (rsmpi) over the system's MPI (OpenMPI or MPICH), for tensors in host memory.
//!
//! Every call works on the caller's own bytes (no copies around it). A small message is a
//! non-blocking MPI collective (`MPI_Iallreduce`, `MPI_Iallgatherv`, `MPI_Ibcast`; the
//! reduce-scatter and all-to-all at any size: `MPI_Ireduce_scatter`, `MPI_Ialltoallv`), polled
//! until it completes or
//! [`Config::collective_timeout`](crate::Config::collective_timeout) passes, so a peer that
//! stops answering ends this process with a message instead of a hang
//! ([`crate::spmd`]'s fault handling); a large one is a polled `MPI_Ibarrier`, then the blocking
//! collective ([`large`]). A large all-gather or all-to-all between processes of one
//! host writes its parts straight into the peers' receive buffers instead
//! ([`StridedSend::SingleCopy`], [`super::cma`]). MPI runs at `MPI_THREAD_SERIALIZED`: one
//! lock orders every call of the process (rsmpi's communicators are not `Send`; the lock is
//! what makes sharing them sound). MPI is finalised at process exit (`atexit`), as `mpirun`
//! expects.

use std::ffi::c_void;
use std::mem::MaybeUninit;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use burn::tensor::DType;
use mpi::Threading;
use mpi::collective::SystemOperation;
use mpi::datatype::Equivalence;
use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::request::{Request, Scope, scope};
use mpi::topology::{Color, SimpleCommunicator};
use mpi::traits::*;

use super::interface::{
    ProcessGroup, ReduceOp, check_own_box, check_parts, offsets, own_box_apart, own_part,
    packed_all_to_all,
};
use crate::config::{StridedSend, config};
use crate::error::{DTensorError, Result};
use crate::fault::collective_failed;

/// Orders every MPI call of the process (`MPI_THREAD_SERIALIZED`).
static LOCK: Mutex<()> = Mutex::new(());

struct Comm(SimpleCommunicator);
// SAFETY: the communicator is a handle; MPI at `MPI_THREAD_SERIALIZED` allows calls from any
// thread as long as they do not overlap, which `LOCK` guarantees for every call made here.
unsafe impl Send for Comm {}
unsafe impl Sync for Comm {}

/// A process group on an MPI communicator.
pub(crate) struct MpiGroup {
    comm: Comm,
    rank: usize,
    size: usize,
    world_ranks: Vec<usize>,
    /// The members' pids when every member can write into every other's memory
    /// ([`MpiGroup::single_copy_pids`], probed at the first single-copy all-to-all), else
    /// `None`.
    single_copy: OnceLock<Option<Vec<u64>>>,
    /// The world's group, which carries only control messages ([`crate::spmd::World`]'s
    /// agreements, checkpoints' indexes, barriers): see [`control`].
    control: bool,
}

extern "C" fn finalize() {
    let _guard = LOCK.lock();
    // SAFETY: plain MPI calls on a process that initialised MPI.
    unsafe {
        let mut done = 0;
        mpi::ffi::MPI_Finalized(&mut done);
        if done == 0 {
            mpi::ffi::MPI_Finalize();
        }
    }
}

/// Initialises MPI and returns the world group.
///
/// # Errors
/// [`DTensorError::Spmd`] when MPI cannot start or lacks `MPI_THREAD_SERIALIZED`.
pub(crate) fn world() -> Result<Arc<dyn ProcessGroup>> {
    let _guard = LOCK.lock().unwrap();
    let (universe, level) = mpi::initialize_with_threading(Threading::Serialized)
        .ok_or_else(|| DTensorError::Spmd("MPI was initialised before burn-dtensor".into()))?;
    if level < Threading::Serialized {
        return Err(DTensorError::Spmd(format!(
            "the MPI library offers thread level {level:?}, burn-dtensor needs Serialized"
        )));
    }
    let world = universe.world();
    // Read `MPI_IN_PLACE`'s value now, under the lock (later calls do not call MPI).
    let _ = in_place();
    // The universe would finalise MPI when dropped; it lives as long as the process instead,
    // and `finalize` runs at exit.
    std::mem::forget(universe);
    // SAFETY: registering a plain extern "C" function.
    unsafe { libc::atexit(finalize) };
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    Ok(Arc::new(MpiGroup {
        comm: Comm(world),
        rank,
        size,
        world_ranks: (0..size).collect(),
        single_copy: OnceLock::new(),
        control: true,
    }))
}

/// Whether a message of `bytes` (the whole buffer, equal on every member, so that all choose
/// alike) is large: at least [`Config::large_message_bytes`](crate::Config::large_message_bytes)
/// (1 MiB by default; every process of a mesh has agreed on it). Large messages take the
/// blocking collective after a polled `MPI_Ibarrier` ([`MpiGroup::arrive`]): the barrier
/// catches a peer that never comes (the fault policy's timeout), and the blocking call runs
/// Open MPI's tuned algorithms, where the non-blocking ones (`libnbc`) progress only while
/// polled (measured, 2 processes: an all-gather of 4 MB at 0.15-1.0x the blocking
/// `MPI_Allgather` non-blocking). A peer that stops in the middle of a
/// blocking transfer is left to MPI (a process that dies ends an `mpirun` job). The
/// reduce-scatter stays non-blocking, polled without sleeping (`MPI_Reduce_scatter_block` ran
/// 2-5x slower than `libnbc`'s here), and so does the all-to-all (its members' byte counts
/// differ, so they could not all choose alike). A small message's wait is mostly for the peers
/// to arrive, and polling hard then takes a core from the shard work of this host's other
/// processes (the IMDB step on 2 processes: 0.85 ms with sleeps, 1.05-1.43 ms polling every
/// wait hard), so it yields a few thousand times, then sleeps 50 µs between polls.
fn large(bytes: usize) -> bool {
    bytes >= config().large_message_bytes
}

/// How long a wait on a large message polls without sleeping; past this a peer is late (a
/// checkpoint written, a slow step) and the wait sleeps between polls instead of holding a core.
const BUSY_POLL: Duration = Duration::from_secs(1);

/// The tag of a collective permute's point-to-point messages ([`MpiGroup::send_recv`]); MPI
/// never matches them with a collective's, and messages between two processes on one tag
/// arrive in the order they were sent, so consecutive permutes pair up.
const PERMUTE_TAG: i32 = 0x7065;

/// Polls `done` (one `MPI_Test`) until it returns true; past the timeout, ends the process
/// naming `what`. `large` ([`MpiGroup::is_large`] of the larger of what this process sends and
/// receives: never for a control message) chooses how hard it polls.
fn poll(mut done: impl FnMut() -> bool, large: bool, what: &str, members: &[usize]) {
    let timeout = config().collective_timeout;
    let busy = if large { BUSY_POLL } else { Duration::ZERO };
    let start = Instant::now();
    let mut polls = 0u32;
    while !done() {
        polls = polls.saturating_add(1);
        if polls < 2000 || (!polls.is_multiple_of(256) && start.elapsed() < busy) {
            std::thread::yield_now();
            continue;
        }
        let waited = start.elapsed();
        if waited > timeout {
            collective_failed(what, members, waited);
        }
        if waited >= busy {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

/// Polls `req`, a `large` message or not, until it completes ([`poll`]).
fn wait<'a, R: ?Sized, S: Scope<'a>>(
    req: Request<'a, R, S>,
    large: bool,
    what: &str,
    members: &[usize],
) {
    let mut req = Some(req);
    poll(
        || match req.take().unwrap().test() {
            Ok(_) => true,
            Err(r) => {
                req = Some(r);
                false
            }
        },
        large,
        what,
        members,
    );
}

/// Polls a raw request, started by a raw non-blocking call, a `large` message or not, until it
/// completes ([`poll`]).
fn wait_raw(mut req: ffi::MPI_Request, large: bool, what: &str, members: &[usize]) {
    poll(
        || {
            let mut flag = 0;
            // SAFETY: `req` is an active request of this process; MPI sets it to null when done.
            unsafe { ffi::MPI_Test(&mut req, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
            flag != 0
        },
        large,
        what,
        members,
    );
}

/// MPI's datatype and operation for an element-wise `op`-reduction of `dtype` (bool: or/and of
/// its bytes, 1 or 4 per element).
///
/// # Panics
/// For a dtype with no MPI type (half floats: the caller converts them to f32).
fn reduction(dtype: DType, op: ReduceOp) -> (ffi::MPI_Datatype, ffi::MPI_Op) {
    let sys = match (dtype, op) {
        (DType::Bool(_), ReduceOp::Sum | ReduceOp::Max) => SystemOperation::logical_or(),
        (DType::Bool(_), ReduceOp::Min) => SystemOperation::logical_and(),
        (_, ReduceOp::Sum) => SystemOperation::sum(),
        (_, ReduceOp::Max) => SystemOperation::max(),
        (_, ReduceOp::Min) => SystemOperation::min(),
    };
    let t = match dtype {
        DType::F64 => f64::equivalent_datatype().as_raw(),
        DType::F32 | DType::Flex32 => f32::equivalent_datatype().as_raw(),
        DType::I64 => i64::equivalent_datatype().as_raw(),
        DType::I32 => i32::equivalent_datatype().as_raw(),
        DType::I16 => i16::equivalent_datatype().as_raw(),
        DType::I8 => i8::equivalent_datatype().as_raw(),
        DType::U64 => u64::equivalent_datatype().as_raw(),
        DType::U32 => u32::equivalent_datatype().as_raw(),
        DType::U16 => u16::equivalent_datatype().as_raw(),
        DType::U8 => u8::equivalent_datatype().as_raw(),
        DType::Bool(_) if dtype.size() == 4 => u32::equivalent_datatype().as_raw(),
        DType::Bool(_) => u8::equivalent_datatype().as_raw(),
        other => {
            panic!("burn-dtensor: no MPI reduction for {other:?} (the caller converts half floats)")
        }
    };
    (t, sys.as_raw())
}

/// Bytes per element of a reduced buffer (bool: 1 or 4, as the backend stores it).
fn elem_bytes(dtype: DType) -> usize {
    dtype.size().max(1)
}

/// An element count as MPI's `int`.
///
/// # Panics
/// Past `i32::MAX` elements (MPI's count).
fn count(n: usize, what: &str) -> i32 {
    i32::try_from(n).unwrap_or_else(|_| {
        panic!("burn-dtensor: {what}: {n} elements exceed MPI's count (2^31 - 1)")
    })
}

thread_local! {
    /// How deep this thread is in [`control`] calls.
    static CONTROL: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Runs `f`, whose collectives are control messages: never large ([`MpiGroup::is_large`]),
/// so never blocking nor single-copy, whatever
/// [`Config::large_message_bytes`](crate::Config::large_message_bytes) says. A group's own
/// set-up exchanges are control messages (the ranks of a new group, the single-copy probe):
/// a single copy there would start the probe again inside the probe, and a new group knows no
/// world ranks yet. So are the world group's messages ([`MpiGroup::control`]): they run
/// before the processes have agreed on the size (the mesh's start-up check), and wait polled
/// against the collective timeout.
fn control<R>(f: impl FnOnce() -> R) -> R {
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            CONTROL.with(|c| c.set(c.get() - 1));
        }
    }
    CONTROL.with(|c| c.set(c.get() + 1));
    let _leave = Leave;
    f()
}

impl MpiGroup {
    /// Whether a collective of `bytes` on this group is large ([`large`]): never for the
    /// control messages ([`control`]), which choose alike whatever the configured size.
    fn is_large(&self, bytes: usize) -> bool {
        !self.control && CONTROL.with(|c| c.get()) == 0 && large(bytes)
    }

    /// The frame of the all-to-alls: checks the receive parts (one per member, inside `recv`)
    /// and MPI's `int` limit on both buffers, takes `LOCK`, lets `start` begin the non-blocking
    /// call on the buffers' pointers, the receive parts' byte counts and offsets and the
    /// request, and waits on it (the larger of `sent` and the received bytes choosing how hard
    /// it polls) against the collective timeout; what `start` returns (its argument arrays and
    /// datatypes, which MPI reads until the call completes) is dropped after the wait, under
    /// the lock.
    ///
    /// # Panics
    /// When a receive part lies outside `recv`, or a buffer exceeds MPI's 2 GiB count.
    fn exchange<R>(
        &self,
        send: &[u8],
        recv: &mut [MaybeUninit<u8>],
        (recv_counts, recv_at): (&[usize], &[usize]),
        sent: usize,
        what: &str,
        start: impl FnOnce(*mut c_void, *mut c_void, &[i32], &[i32], &mut ffi::MPI_Request) -> R,
    ) {
        check_parts(recv.len(), (recv_counts, recv_at), what);
        assert_eq!(
            recv_counts.len(),
            self.size,
            "burn-dtensor: all-to-all counts (one per member)"
        );
        assert!(
            recv.len() <= i32::MAX as usize && send.len() <= i32::MAX as usize,
            "burn-dtensor: a cross-process all-to-all of {} bytes exceeds MPI's 2 GiB count",
            recv.len().max(send.len())
        );
        let total: usize = recv_counts.iter().sum();
        let (mut spare_r, mut spare_s) = ([0u8; 8], [0u8; 8]);
        let recv_ptr = never_dangling(recv.as_ptr(), recv.len(), &mut spare_r);
        let send_ptr = never_dangling(send.as_ptr(), send.len(), &mut spare_s);
        let (rc, rd) = (byte_counts(recv_counts, what), byte_counts(recv_at, what));
        let _guard = LOCK.lock().unwrap();
        let mut req = unsafe { ffi::RSMPI_REQUEST_NULL };
        let keep = start(send_ptr, recv_ptr, &rc, &rd, &mut req);
        wait_raw(req, self.is_large(total.max(sent)), what, &self.world_ranks);
        drop(keep);
    }

    /// The members' pids ([`MpiGroup::single_copy_pids`]) where a collective of `global_bytes`
    /// (equal on every member) moves its parts by single-copy writes: with
    /// [`StridedSend::SingleCopy`] from [`large`] on (below, the single copy's two rounds,
    /// the addresses and the barrier, cost more than the copy they save), on a group whose
    /// probe passed. Every member decides alike. Collective where it probes.
    fn single_copy(&self, global_bytes: usize, what: &str) -> Option<&[u64]> {
        if config().strided_send == StridedSend::SingleCopy && self.is_large(global_bytes) {
            self.single_copy_pids(what)
        } else {
            None
        }
    }

    /// The members' pids, in group rank order, when every member can write into every other's
    /// memory through the kernel ([`super::cma`]): probed once per group, at its first
    /// single-copy collective, by an all-gather of the members' [`Identity`]s, each member
    /// reading every peer's token, and an all-reduce of the verdicts, so that every member
    /// agrees. First each member lets its peers in where Yama's `ptrace_scope` would not
    /// ([`allow_peers`], as Open MPI does). `None` (always, off Linux) sends every collective
    /// of the group through MPI; where the kernel refused a peer on this host, the member says
    /// so once on stderr (a note, not an error: the results are the same). Collective; the
    /// caller does not hold `LOCK`.
    fn single_copy_pids(&self, what: &str) -> Option<&[u64]> {
        #[cfg(target_os = "linux")]
        let probe = || {
            use super::cma::{Identity, Unreachable, allow_peers, reach};
            let w = format!("{what} (probing single-copy writes)");
            let allowed = allow_peers();
            let own = Identity::own().to_bytes();
            let all = self.all_gather(&own, &vec![Identity::BYTES; self.size], &w);
            let peers: Vec<Identity> = all
                .chunks(Identity::BYTES)
                .map(Identity::from_bytes)
                .collect();
            let mut refused = None;
            let ok = (0..self.size)
                .filter(|&q| q != self.rank)
                .all(|q| match reach(peers[q]) {
                    Ok(()) => true,
                    Err(Unreachable::Refused(e)) => {
                        refused = Some((q, e));
                        false
                    }
                    Err(_) => false,
                });
            let mut verdict = (ok as u32).to_le_bytes();
            self.all_reduce(&mut verdict, DType::U32, ReduceOp::Min, &w);
            if let Some((q, e)) = refused {
                let allowing = match allowed {
                    Ok(()) => String::new(),
                    Err(a) => format!(" (allowing peers failed: {a})"),
                };
                crate::fault::note(&format!(
                    "collectives among ranks {:?} go through MPI without single-copy writes: \
                     this process may not read the memory of rank {} (pid {}): {e}{allowing}; \
                     same-user processes may when /proc/sys/kernel/yama/ptrace_scope is 0 or 1",
                    self.world_ranks, self.world_ranks[q], peers[q].pid
                ));
            }
            (u32::from_le_bytes(verdict) == 1).then(|| peers.iter().map(|p| p.pid).collect())
        };
        #[cfg(not(target_os = "linux"))]
        let probe = || None;
        self.single_copy.get_or_init(|| control(probe)).as_deref()
    }

    /// [`ProcessGroup::all_to_all_boxes`] by cross-memory attach ([`super::cma`]): once every
    /// member has arrived, the members tell each other where in their receive buffers each
    /// part goes (an all-to-all of an address and a byte count per pair), each writes its
    /// boxes there from where they lie in `send` (`process_vm_writev`, one copy; its own box,
    /// if any, by a local copy after those), and a barrier tells every member that its parts
    /// have arrived.
    /// `pids` are the members' ([`MpiGroup::single_copy_pids`]). The all-gather
    /// ([`MpiGroup::allgather_raw`]) is the case of one box, this member's part, for every
    /// peer.
    ///
    /// # Safety
    /// `recv` is the start and length of a buffer valid for writes that nothing else reads or
    /// writes during the call; `send` may overlap it only outside the receive parts.
    ///
    /// # Panics
    /// When a member expects a part of another size than this process sends (a caller's bug),
    /// or the kernel refuses a write after the group's probe passed (a peer gone): the fault
    /// policy's panic hook then ends the job.
    #[allow(clippy::too_many_arguments)]
    unsafe fn single_copy_all_to_all(
        &self,
        pids: &[u64],
        send: &[u8],
        (shape, elem): (&[usize], usize),
        send_boxes: &[Option<&[std::ops::Range<usize>]>],
        (recv, recv_len): (*mut MaybeUninit<u8>, usize),
        (recv_counts, recv_at): (&[usize], &[usize]),
        what: &str,
    ) {
        assert!(
            send_boxes.len() == self.size && recv_counts.len() == self.size,
            "burn-dtensor: all-to-all boxes and counts (one per member)"
        );
        let me = self.rank;
        let parts = (recv_counts, recv_at);
        let own = check_own_box(
            me,
            send.len(),
            (shape, elem),
            send_boxes,
            recv_len,
            parts,
            what,
        );
        let base = recv as u64;
        let wanted: Vec<u8> = (0..self.size)
            .flat_map(|q| [base + recv_at[q] as u64, recv_counts[q] as u64])
            .flat_map(u64::to_le_bytes)
            .collect();
        // The addresses go round in one `MPI_Ialltoall`, polled against the collective timeout
        // (it is also the check that every member has arrived), and the writes end at a
        // blocking `MPI_Barrier`, as the large collectives run ([`large`]): each
        // non-blocking round progresses only while polled, and on an oversubscribed host three
        // rounds as `libnbc` operations made the exchange 2-4x slower than the packed one. The
        // polled exchange replaced a polled `MPI_Ibarrier` before a blocking `MPI_Alltoall`:
        // one round less, 2-3 µs a call on 2 processes (session 69).
        let comm = self.comm.0.as_raw();
        let guard = LOCK.lock().unwrap();
        let mut wants = vec![0u8; 16 * self.size];
        let mut req = unsafe { ffi::RSMPI_REQUEST_NULL };
        // SAFETY: 16 bytes from and to each member, inside the two buffers, which outlive the
        // wait below.
        unsafe {
            ffi::MPI_Ialltoall(
                wanted.as_ptr() as *mut c_void,
                16,
                bytes_type(),
                wants.as_mut_ptr().cast(),
                16,
                bytes_type(),
                comm,
                &mut req,
            )
        };
        wait_raw(req, false, what, &self.world_ranks);
        drop(guard);
        for (q, b) in send_boxes.iter().enumerate() {
            let v = |i: usize| {
                let at = q * 16 + i * 8;
                u64::from_le_bytes(wants[at..at + 8].try_into().unwrap())
            };
            let (at, len) = (v(0), v(1) as usize);
            let bytes = b.map_or(0, |b| crate::host::box_numel(b) * elem);
            if q == self.rank {
                continue;
            }
            assert_eq!(
                len, bytes,
                "burn-dtensor: {what}: member {q} expects {len} bytes, this process sends {bytes}"
            );
            if let Some(b) = b.filter(|_| bytes > 0) {
                // SAFETY: member `q` gave `at` as the start of the `len` bytes of its receive
                // buffer that hold this process's part (checked against its buffer there), and
                // leaves them alone until the barrier below.
                #[cfg(target_os = "linux")]
                let wrote = unsafe { super::cma::write_box(pids[q], (shape, elem), send, b, at) };
                // Never reached: `single_copy_pids` is `None` off Linux.
                #[cfg(not(target_os = "linux"))]
                let wrote: std::io::Result<()> =
                    Err(std::io::Error::other("single-copy writes need Linux"));
                if let Err(e) = wrote {
                    let (rank, pid) = (self.world_ranks[q], pids[q]);
                    panic!(
                        "burn-dtensor: {what}: writing {bytes} bytes into rank {rank} \
                         (pid {pid}) failed: {e}"
                    );
                }
            }
        }
        // The own part after the writes into the peers, not before them: on 2 processes of a
        // 2-core VM, a 4.2 MB transposing all-to-all took 25-50 µs less so (the writes 82-84
        // µs against 114-132 µs after the own copy; the same order in C: 176-185 µs against
        // 218-229 µs, session 69), and it overlaps the wait for the slowest writer.
        if let Some(b) = send_boxes[me].filter(|_| own > 0) {
            // SAFETY: the own part lies inside `recv` (checked), which the caller lends for
            // writes, and outside `send` (the caller's contract); no peer writes it.
            let part = unsafe { std::slice::from_raw_parts_mut(recv.add(recv_at[me]), own) };
            crate::host::read_box_into(shape, elem, send, b, part);
        }
        let _guard = LOCK.lock().unwrap();
        // SAFETY: a plain barrier on this group's communicator.
        unsafe { ffi::MPI_Barrier(comm) };
    }

    /// [`ProcessGroup::all_to_all_boxes`] by [`StridedSend::Datatype`]: `MPI_Ialltoallw`, each
    /// box one datatype over `send` (nested `MPI_Type_create_hvector`s around its contiguous
    /// runs, [`box_type`]), so MPI reads the parts where they lie and no send buffer is packed;
    /// waited on against the collective timeout. Boxes are checked by the caller.
    fn typed_all_to_all(
        &self,
        send: &[u8],
        (shape, elem): (&[usize], usize),
        send_boxes: &[Option<&[std::ops::Range<usize>]>],
        recv: &mut [MaybeUninit<u8>],
        recv_parts: (&[usize], &[usize]),
        what: &str,
    ) {
        let sent = send.len();
        self.exchange(send, recv, recv_parts, sent, what, |s, r, rc, rd, req| {
            // One committed type per non-empty box, freed when `exchange` drops them after
            // the wait (under the lock).
            let types: Vec<Option<(mpi::datatype::UserDatatype, usize)>> = send_boxes
                .iter()
                .map(|b| b.and_then(|b| box_type(shape, elem, b)))
                .collect();
            let sc: Vec<i32> = types.iter().map(|t| t.is_some() as i32).collect();
            let sd: Vec<i32> = types
                .iter()
                .map(|t| t.as_ref().map_or(0, |(_, at)| count(*at, what)))
                .collect();
            let t = bytes_type();
            let st: Vec<ffi::MPI_Datatype> = types
                .iter()
                .map(|ty| ty.as_ref().map_or(t, |(ty, _)| ty.as_raw()))
                .collect();
            let rt = vec![t; self.size];
            // SAFETY: every box lies inside `send` (checked), so each type read at its
            // displacement stays inside it; every receive part lies inside `recv` (checked by
            // `exchange`); the buffers and the types outlive its wait.
            unsafe {
                ffi::MPI_Ialltoallw(
                    s,
                    sc.as_ptr(),
                    sd.as_ptr(),
                    st.as_ptr(),
                    r,
                    rc.as_ptr(),
                    rd.as_ptr(),
                    rt.as_ptr(),
                    self.comm.0.as_raw(),
                    req,
                )
            };
            // A non-blocking collective reads its argument arrays until it completes.
            (types, sc, sd, st, rt)
        });
    }

    /// Waits, against the collective timeout, until every member has reached this collective
    /// (`MPI_Ibarrier`, polled): the check before a blocking call on a large message, so that
    /// a peer that stopped or died before it still ends the job with a message naming `what`.
    /// The caller holds `LOCK`.
    fn arrive(&self, what: &str) {
        let mut req = unsafe { ffi::RSMPI_REQUEST_NULL };
        // SAFETY: a plain non-blocking barrier on this group's communicator.
        unsafe { ffi::MPI_Ibarrier(self.comm.0.as_raw(), &mut req) };
        wait_raw(req, false, what, &self.world_ranks);
    }
    /// The all-reduce of [`ProcessGroup::all_reduce_into`] (`send` given) or of
    /// [`ProcessGroup::all_reduce`] (`send` `None`: `MPI_IN_PLACE`, which the caller has checked
    /// is known): `MPI_Iallreduce`, or the blocking `MPI_Allreduce` for a large message
    /// ([`large`]).
    ///
    /// `recv` points to `len` bytes this call writes (all of them).
    fn allreduce_raw(
        &self,
        send: Option<&[u8]>,
        (recv, len): (*mut c_void, usize),
        dtype: DType,
        op: ReduceOp,
        what: &str,
    ) {
        if len == 0 {
            // Every member has the same (empty) shape: nothing to exchange.
            return;
        }
        let (t, o) = reduction(dtype, op);
        let n = count(len / elem_bytes(dtype), what);
        let send_ptr = match send {
            Some(s) => s.as_ptr().cast(),
            None => in_place().expect("checked by the caller"),
        };
        let _guard = LOCK.lock().unwrap();
        if self.is_large(len) {
            self.arrive(what);
            // SAFETY: `send` (or `recv` itself, in place) and `recv` hold `n` elements of `t`;
            // the call is blocking.
            unsafe { ffi::MPI_Allreduce(send_ptr, recv, n, t, o, self.comm.0.as_raw()) };
            return;
        }
        let mut req = unsafe { ffi::RSMPI_REQUEST_NULL };
        // SAFETY: `send` (or `recv` itself) and `recv` hold `n` elements of `t` and outlive the
        // wait below.
        unsafe { ffi::MPI_Iallreduce(send_ptr, recv, n, t, o, self.comm.0.as_raw(), &mut req) };
        wait_raw(req, self.is_large(len), what, &self.world_ranks);
    }
    /// The all-gather of [`ProcessGroup::all_gather_into`] (`send` given: this member's
    /// `counts[rank]` bytes) or of [`ProcessGroup::all_gather_in_place`] (`send` `None`:
    /// `MPI_IN_PLACE`, which the caller has checked is known, this member's part already in
    /// `recv`): `MPI_Iallgatherv`, or for a large message ([`large`]) this member's part
    /// written into every peer's `recv` ([`MpiGroup::single_copy_all_to_all`] with one box, the
    /// part, for each peer; in groups of 3 or more, where [`MpiGroup::single_copy`] allows) or
    /// the blocking `MPI_Allgatherv`. Writes every part of `recv` that is not this member's
    /// own (and that one too when `send` is given).
    fn allgather_raw(
        &self,
        send: Option<&[u8]>,
        counts: &[usize],
        recv: &mut [MaybeUninit<u8>],
        what: &str,
    ) {
        let total: usize = counts.iter().sum();
        assert_eq!(recv.len(), total, "burn-dtensor: all-gather receive buffer");
        assert_eq!(
            counts.len(),
            self.size,
            "burn-dtensor: all-gather counts (one per member)"
        );
        assert!(
            total <= i32::MAX as usize,
            "burn-dtensor: a cross-process all-gather of {total} bytes exceeds MPI's 2 GiB count"
        );
        // From 3 members on: MPI's all-gather then runs `log p` or `p - 1` rounds, the single
        // copy two (the addresses, the barrier). Of 2, MPI's one exchange was as fast or
        // faster. Session 68, ratio to a direct `MPI_Allgather`: on 2 processes at 4.2 MB,
        // MPI's path 0.94-1.33, the single copy 0.95-1.12; on 4, MPI's 0.65-1.18 (4.2 MB) and
        // 0.45-0.71 (16.8 MB), the single copy 1.06-1.28 and 0.67-0.85.
        if self.size > 2
            && let Some(pids) = self.single_copy(total, what)
        {
            let (me, at) = (self.rank, offsets(counts));
            let mine = at[me]..at[me] + counts[me];
            let base = recv.as_mut_ptr();
            // This member's part: sent from `send`, and copied into place by the call after
            // its writes; in place, sent from where it lies in `recv`.
            let own = match send {
                Some(s) => s,
                // SAFETY: this member's part of `recv` is initialised (by the caller of the
                // in-place form), and only read until the call returns.
                None => unsafe {
                    std::slice::from_raw_parts(base.add(mine.start).cast(), mine.len())
                },
            };
            let whole = 0..mine.len();
            let boxes: Vec<Option<&[std::ops::Range<usize>]>> = (0..self.size)
                .map(|q| (q != me || send.is_some()).then_some(std::slice::from_ref(&whole)))
                .collect();
            let mut parts = counts.to_vec();
            if send.is_none() {
                parts[me] = 0;
            }
            // SAFETY: `recv` is the caller's, borrowed for this call; `own` is `send` (apart
            // from `recv`) or lies in this member's part of `recv`, which no peer writes and
            // the call's own box (none then) leaves alone.
            unsafe {
                self.single_copy_all_to_all(
                    pids,
                    own,
                    (&[mine.len()], 1),
                    &boxes,
                    (base, total),
                    (&parts, &at),
                    what,
                )
            };
            return;
        }
        let (mut spare_r, mut spare_s) = ([0u8; 8], [0u8; 8]);
        let recv = never_dangling(recv.as_ptr(), total, &mut spare_r);
        let send_ptr = match send {
            Some(s) => never_dangling(s.as_ptr(), s.len(), &mut spare_s),
            None => in_place().expect("checked by the caller") as *mut c_void,
        };
        let (c, d) = (
            byte_counts(counts, what),
            byte_counts(&offsets(counts), what),
        );
        let (t, comm) = (bytes_type(), self.comm.0.as_raw());
        let _guard = LOCK.lock().unwrap();
        if self.is_large(total) {
            self.arrive(what);
            // SAFETY: `send` (or this member's part of `recv`, in place) holds its count of
            // bytes, `recv` the sum of `counts` at the displacements `d`; the call is blocking.
            unsafe {
                ffi::MPI_Allgatherv(
                    send_ptr,
                    c[self.rank],
                    t,
                    recv,
                    c.as_ptr(),
                    d.as_ptr(),
                    t,
                    comm,
                )
            };
            return;
        }
        let mut req = unsafe { ffi::RSMPI_REQUEST_NULL };
        // SAFETY: as above; `send`, `recv`, `c` and `d` outlive the wait below.
        unsafe {
            ffi::MPI_Iallgatherv(
                send_ptr,
                c[self.rank],
                t,
                recv,
                c.as_ptr(),
                d.as_ptr(),
                t,
                comm,
                &mut req,
            )
        };
        wait_raw(req, self.is_large(total), what, &self.world_ranks);
    }
}

/// The byte datatype of the collectives that move bytes.
fn bytes_type() -> ffi::MPI_Datatype {
    u8::equivalent_datatype().as_raw()
}

/// Byte counts as MPI's `int`s.
///
/// # Panics
/// Past `i32::MAX` bytes (MPI's count), naming `what`.
fn byte_counts(counts: &[usize], what: &str) -> Vec<i32> {
    counts.iter().map(|&n| count(n, what)).collect()
}

/// A pointer to `len` bytes for MPI, never dangling: an empty slice's pointer is 0x1, which
/// Open MPI reads as `MPI_IN_PLACE` (an all-gather of nothing is the barrier of `spmd`), so an
/// empty buffer points to `spare` instead.
fn never_dangling<T>(ptr: *const T, len: usize, spare: &mut [u8; 8]) -> *mut c_void {
    if len == 0 {
        spare.as_mut_ptr().cast()
    } else {
        ptr as *mut c_void
    }
}

/// The box `b` (one range per dim) of a row-major array of `shape` with `elem`-byte elements as
/// one committed MPI datatype, and the byte offset of its first element: its trailing dims that
/// the box covers whole merge with the dim before them into one contiguous run of bytes, and
/// each dim before that is an `MPI_Type_create_hvector` (one block per index, the dim's stride
/// in bytes apart) around the type of the dims after it. `None` for an empty box. Call with
/// `LOCK` held.
///
/// # Panics
/// When a run, a count or the offset exceeds MPI's `int`.
fn box_type(
    shape: &[usize],
    elem: usize,
    b: &[std::ops::Range<usize>],
) -> Option<(mpi::datatype::UserDatatype, usize)> {
    use mpi::datatype::UncommittedUserDatatype as Type;
    if shape.is_empty() || b.iter().any(|r| r.is_empty()) {
        return None;
    }
    let mut strides = vec![elem; shape.len()];
    for d in (0..shape.len() - 1).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    let at = b.iter().zip(&strides).map(|(r, s)| r.start * s).sum();
    let (mut d, mut run) = (shape.len() - 1, elem * b[shape.len() - 1].len());
    while d > 0 && b[d].len() == shape[d] {
        d -= 1;
        run *= b[d].len();
    }
    let what = "an all-to-all's datatype";
    let mut ty = Type::contiguous(count(run, what), &u8::equivalent_datatype());
    for dd in (0..d).rev() {
        ty = Type::heterogeneous_vector(count(b[dd].len(), what), 1, strides[dd] as _, &ty);
    }
    Some((ty.commit(), at))
}

/// The MPI library's `MPI_IN_PLACE`, a C macro that rsmpi does not export: `(void *) 1` in
/// Open MPI's `mpi.h`, `(void *) -1` in MPICH's (and its derivatives'), read from
/// `MPI_Get_library_version` once. `None` for another library: the in-place all-reduce then
/// copies its input.
fn in_place() -> Option<*const std::ffi::c_void> {
    use std::sync::OnceLock;
    static VALUE: OnceLock<Option<usize>> = OnceLock::new();
    let v = *VALUE.get_or_init(|| {
        let mut buf = vec![0 as std::ffi::c_char; 8192];
        let mut len = 0;
        // SAFETY: the buffer holds MPI_MAX_LIBRARY_VERSION_STRING (at most 8192 in Open MPI
        // and MPICH) characters; callable before initialisation.
        unsafe { ffi::MPI_Get_library_version(buf.as_mut_ptr(), &mut len) };
        let text: String = buf[..len.max(0) as usize]
            .iter()
            .map(|&c| c as u8 as char)
            .collect();
        if text.contains("Open MPI") {
            Some(1)
        } else if text.contains("MPICH") {
            Some(usize::MAX)
        } else {
            None
        }
    });
    v.map(|v| v as *const std::ffi::c_void)
}

// SAFETY: every method given a `recv` returns after MPI wrote all of it (the counts are
// checked against its length first; `all_to_all_placed`: all of its parts, checked to lie
// inside it), or never (the fault policy ends the process).
unsafe impl ProcessGroup for MpiGroup {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn world_ranks(&self) -> &[usize] {
        &self.world_ranks
    }
    fn engine(&self) -> &'static str {
        "mpi"
    }
    fn split(&self, color: usize, key: usize) -> Arc<dyn ProcessGroup> {
        let comm = {
            let _guard = LOCK.lock().unwrap();
            self.comm
                .0
                .split_by_color_with_key(Color::with_value(color as i32), key as i32)
                .expect("a defined color gives a communicator")
        };
        let (rank, size) = (comm.rank() as usize, comm.size() as usize);
        let mut g = MpiGroup {
            comm: Comm(comm),
            rank,
            size,
            world_ranks: Vec::new(),
            single_copy: OnceLock::new(),
            control: false,
        };
        let me = self.world_ranks[self.rank] as u64;
        let all = control(|| {
            g.all_gather(
                &me.to_le_bytes(),
                &vec![8; size],
                "start-up exchange of a process group's ranks",
            )
        });
        g.world_ranks = all
            .chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()) as usize)
            .collect();
        Arc::new(g)
    }
    /// From `send` into `recv`, both the caller's bytes: `MPI_Iallreduce`, or the blocking
    /// `MPI_Allreduce` for a large message ([`large`]).
    fn all_reduce_into(
        &self,
        send: &[u8],
        recv: &mut [MaybeUninit<u8>],
        dtype: DType,
        op: ReduceOp,
        what: &str,
    ) {
        assert_eq!(send.len(), recv.len(), "burn-dtensor: all-reduce buffers");
        self.allreduce_raw(
            Some(send),
            (recv.as_mut_ptr().cast(), recv.len()),
            dtype,
            op,
            what,
        );
    }
    /// In `buf` itself, with `MPI_IN_PLACE` where the MPI library's value of it is known
    /// ([`in_place`]; else the provided copy of `buf` as the input): no second buffer of the
    /// message's size, so no fresh pages to fault in.
    fn all_reduce(&self, buf: &mut [u8], dtype: DType, op: ReduceOp, what: &str) {
        if in_place().is_some() {
            self.allreduce_raw(None, (buf.as_mut_ptr().cast(), buf.len()), dtype, op, what);
        } else {
            let send = buf.to_vec();
            self.allreduce_raw(
                Some(&send),
                (buf.as_mut_ptr().cast(), buf.len()),
                dtype,
                op,
                what,
            );
        }
    }
    /// `MPI_Ireduce_scatter` from `send` into `recv`, both the caller's bytes.
    fn reduce_scatter_into(
        &self,
        send: &[u8],
        recv_counts: &[usize],
        recv: &mut [MaybeUninit<u8>],
        dtype: DType,
        op: ReduceOp,
        what: &str,
    ) {
        let es = elem_bytes(dtype);
        assert_eq!(
            recv_counts.len(),
            self.size,
            "burn-dtensor: reduce-scatter counts"
        );
        assert_eq!(
            recv.len(),
            recv_counts[self.rank],
            "burn-dtensor: reduce-scatter buffer"
        );
        assert_eq!(
            send.len(),
            recv_counts.iter().sum::<usize>(),
            "burn-dtensor: reduce-scatter input"
        );
        if send.is_empty() {
            return;
        }
        let (t, o) = reduction(dtype, op);
        let counts: Vec<i32> = recv_counts.iter().map(|&c| count(c / es, what)).collect();
        // Never a dangling pointer ([`never_dangling`]): one spare element where this member
        // receives nothing.
        let mut spare = [0u8; 8];
        let recv = never_dangling(recv.as_ptr(), recv.len(), &mut spare);
        let _guard = LOCK.lock().unwrap();
        let mut req = unsafe { ffi::RSMPI_REQUEST_NULL };
        // SAFETY: `send` holds the sum of `counts` elements of `t`, `recv` this member's count;
        // both (and `counts`) outlive the wait below.
        unsafe {
            ffi::MPI_Ireduce_scatter(
                send.as_ptr().cast(),
                recv,
                counts.as_ptr(),
                t,
                o,
                self.comm.0.as_raw(),
                &mut req,
            )
        };
        wait_raw(req, self.is_large(send.len()), what, &self.world_ranks);
    }
    /// `MPI_Iallgatherv`, or for a large message ([`large`]) the single copy into the
    /// peers' buffers ([`MpiGroup::single_copy`]) or the blocking `MPI_Allgatherv`, into
    /// `recv` as the caller allocated it.
    fn all_gather_into(
        &self,
        send: &[u8],
        counts: &[usize],
        recv: &mut [MaybeUninit<u8>],
        what: &str,
    ) {
        assert_eq!(
            send.len(),
            counts[self.rank],
            "burn-dtensor: all-gather input (this member's count)"
        );
        self.allgather_raw(Some(send), counts, recv, what);
    }
    /// With `MPI_IN_PLACE` where the MPI library's value of it is known ([`in_place`]; else the
    /// provided copy of the own part as the input).
    unsafe fn all_gather_in_place(
        &self,
        buf: &mut [MaybeUninit<u8>],
        counts: &[usize],
        what: &str,
    ) {
        if in_place().is_some() {
            self.allgather_raw(None, counts, buf, what);
        } else {
            // SAFETY: the caller initialised this member's part (the method's contract).
            let own = unsafe { own_part(buf, counts, self.rank) };
            self.allgather_raw(Some(&own), counts, buf, what);
        }
    }
    fn abort(&self, code: i32) -> ! {
        // No lock: the thread that holds it may be this one (a timed-out wait), and an abort
        // must not wait for another. Open MPI ends every rank of the job.
        // SAFETY: MPI is initialised (this group exists); `MPI_Abort` does not return.
        unsafe {
            mpi::ffi::MPI_Abort(mpi::ffi::RSMPI_COMM_WORLD, code);
        }
        std::process::abort()
    }
    /// `MPI_Ialltoallv` ([`ProcessGroup::all_to_all_placed`] with the parts back to back).
    fn all_to_all_into(
        &self,
        send: &[u8],
        send_counts: &[usize],
        recv_counts: &[usize],
        recv: &mut [MaybeUninit<u8>],
        what: &str,
    ) {
        assert_eq!(
            recv.len(),
            recv_counts.iter().sum::<usize>(),
            "burn-dtensor: all-to-all receive buffer"
        );
        assert_eq!(
            send.len(),
            send_counts.iter().sum::<usize>(),
            "burn-dtensor: all-to-all input"
        );
        let (send_at, recv_at) = (offsets(send_counts), offsets(recv_counts));
        self.all_to_all_placed(
            send,
            (send_counts, &send_at),
            recv,
            (recv_counts, &recv_at),
            what,
        );
    }
    /// `MPI_Irecv` from and `MPI_Isend` to each member with a nonzero count (no other member
    /// takes part), waited on together (`MPI_Testall`) against the collective timeout.
    fn send_recv(
        &self,
        send: &[u8],
        send_counts: &[usize],
        recv_counts: &[usize],
        recv: &mut [MaybeUninit<u8>],
        what: &str,
    ) {
        assert!(
            send_counts.len() == self.size && recv_counts.len() == self.size,
            "burn-dtensor: {what}: one count per member"
        );
        let (send_at, recv_at) = (offsets(send_counts), offsets(recv_counts));
        check_parts(send.len(), (send_counts, &send_at), what);
        check_parts(recv.len(), (recv_counts, &recv_at), what);
        let (t, comm) = (bytes_type(), self.comm.0.as_raw());
        let _guard = LOCK.lock().unwrap();
        let mut reqs = Vec::new();
        for q in (0..self.size).filter(|&q| recv_counts[q] > 0) {
            // SAFETY: the part lies inside `recv` (checked), which outlives the wait below.
            let mut req = unsafe { ffi::RSMPI_REQUEST_NULL };
            unsafe {
                let buf = recv[recv_at[q]..].as_mut_ptr().cast();
                let n = count(recv_counts[q], what);
                ffi::MPI_Irecv(buf, n, t, q as i32, PERMUTE_TAG, comm, &mut req)
            };
            reqs.push(req);
        }
        for r in (0..self.size).filter(|&r| send_counts[r] > 0) {
            // SAFETY: the part lies inside `send` (checked), which outlives the wait below.
            let mut req = unsafe { ffi::RSMPI_REQUEST_NULL };
            unsafe {
                let buf = send[send_at[r]..].as_ptr().cast();
                let n = count(send_counts[r], what);
                ffi::MPI_Isend(buf, n, t, r as i32, PERMUTE_TAG, comm, &mut req)
            };
            reqs.push(req);
        }
        let moved = send.len().max(recv.len());
        poll(
            || {
                let mut flag = 0;
                // SAFETY: active requests of this process (MPI sets each to null when done).
                unsafe {
                    ffi::MPI_Testall(
                        reqs.len() as i32,
                        reqs.as_mut_ptr(),
                        &mut flag,
                        ffi::RSMPI_STATUSES_IGNORE,
                    )
                };
                flag != 0
            },
            self.is_large(moved),
            what,
            &self.world_ranks,
        );
    }
    /// `MPI_Ialltoallv` with the caller's displacements, waited on against the collective
    /// timeout.
    fn all_to_all_placed(
        &self,
        send: &[u8],
        (send_counts, send_at): (&[usize], &[usize]),
        recv: &mut [MaybeUninit<u8>],
        recv_parts: (&[usize], &[usize]),
        what: &str,
    ) {
        check_parts(send.len(), (send_counts, send_at), what);
        assert_eq!(
            send_counts.len(),
            self.size,
            "burn-dtensor: all-to-all counts (one per member)"
        );
        // The parts lie inside the buffers (checked), so offsets and counts fit MPI's `int`
        // when the buffers do (checked by `exchange`).
        let sent = send_counts.iter().sum();
        self.exchange(send, recv, recv_parts, sent, what, |s, r, rc, rd, req| {
            let (sc, sd) = (byte_counts(send_counts, what), byte_counts(send_at, what));
            let t = bytes_type();
            // SAFETY: every part lies inside its buffer (checked above and by `exchange`);
            // every buffer outlives the wait of `exchange`.
            unsafe {
                ffi::MPI_Ialltoallv(
                    s,
                    sc.as_ptr(),
                    sd.as_ptr(),
                    t,
                    r,
                    rc.as_ptr(),
                    rd.as_ptr(),
                    t,
                    self.comm.0.as_raw(),
                    req,
                )
            };
            // A non-blocking collective reads its argument arrays until it completes.
            (sc, sd)
        });
    }
    /// By [`Config::strided_send`](crate::Config::strided_send):
    /// - [`StridedSend::Datatype`]: one datatype per box ([`MpiGroup::typed_all_to_all`]);
    /// - [`StridedSend::SingleCopy`]: each box written straight into its member's receive
    ///   buffer ([`MpiGroup::single_copy_all_to_all`]) where the group allows it
    ///   ([`MpiGroup::single_copy_pids`]) and the tensor is a large message ([`large`])
    ///   (`global_bytes`), else packed;
    /// - [`StridedSend::Pack`]: the trait's packing.
    fn all_to_all_boxes(
        &self,
        send: &[u8],
        (shape, elem): (&[usize], usize),
        send_boxes: &[Option<&[std::ops::Range<usize>]>],
        recv: &mut [MaybeUninit<u8>],
        recv_parts: (&[usize], &[usize]),
        global_bytes: usize,
        what: &str,
    ) {
        let array = (shape, elem);
        if let Some(pids) = self.single_copy(global_bytes, what) {
            let recv = (recv.as_mut_ptr(), recv.len());
            // SAFETY: `recv` is the caller's receive buffer, borrowed for this call, apart
            // from `send`.
            return unsafe {
                self.single_copy_all_to_all(pids, send, array, send_boxes, recv, recv_parts, what)
            };
        }
        if config().strided_send != StridedSend::Datatype {
            return packed_all_to_all(self, send, array, send_boxes, recv, recv_parts, what);
        }
        assert_eq!(
            send_boxes.len(),
            self.size,
            "burn-dtensor: all-to-all boxes (one per member)"
        );
        // This member's own box is copied locally, not sent to itself through a datatype;
        // `own_box_apart` checks the boxes and parts first.
        own_box_apart(
            self.rank,
            send,
            array,
            send_boxes,
            recv,
            recv_parts,
            what,
            |b, r, p| self.typed_all_to_all(send, array, b, r, p, what),
        );
    }
    fn broadcast(&self, buf: &mut [u8], root: usize, what: &str) {
        if buf.is_empty() {
            return;
        }
        let len = buf.len();
        let _guard = LOCK.lock().unwrap();
        if self.is_large(len) {
            self.arrive(what);
            self.comm.0.process_at_rank(root as i32).broadcast_into(buf);
            return;
        }
        scope(|s| {
            let req = self
                .comm
                .0
                .process_at_rank(root as i32)
                .immediate_broadcast_into(s, buf);
            wait(req, self.is_large(len), what, &self.world_ranks);
        });
    }
}
