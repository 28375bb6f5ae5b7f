//! The MPI engine of [`ProcessGroup`]: collectives across processes and hosts on the `mpi`
//! crate (rsmpi) over the system's MPI (OpenMPI or MPICH), for tensors in host memory.
//!
//! Every call is a non-blocking MPI collective (`MPI_Iallreduce`, `MPI_Iallgatherv`,
//! `MPI_Ibcast`) polled until it completes or [`Config::collective_timeout`](crate::Config::collective_timeout) passes, so a peer that
//! stops answering ends this process with a message instead of a hang
//! ([`crate::spmd`]'s fault handling). MPI runs at `MPI_THREAD_SERIALIZED`: one lock orders
//! every call of the process (rsmpi's communicators are not `Send`; the lock is what makes
//! sharing them sound). MPI is finalised at process exit (`atexit`), as `mpirun` expects.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use burn::tensor::DType;
use mpi::Threading;
use mpi::collective::SystemOperation;
use mpi::datatype::{Equivalence, Partition, PartitionMut};
use mpi::request::{Request, Scope, scope};
use mpi::topology::{Color, SimpleCommunicator};
use mpi::traits::*;

use super::interface::{ProcessGroup, ReduceOp};
use crate::config::config;
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
    }))
}

/// Polls `req` until it completes; past the timeout, ends the process naming `what`.
fn wait<'a, R: ?Sized, S: Scope<'a>>(mut req: Request<'a, R, S>, what: &str, members: &[usize]) {
    let timeout = config().collective_timeout;
    let start = Instant::now();
    let mut polls = 0u32;
    loop {
        match req.test() {
            Ok(_) => return,
            Err(r) => req = r,
        }
        polls += 1;
        if polls < 2000 {
            std::thread::yield_now();
        } else {
            if start.elapsed() > timeout {
                collective_failed(what, members, start.elapsed());
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

/// The offsets of parts of `counts` bytes laid back to back (MPI's `displs`).
fn displacements(counts: &[usize]) -> Vec<i32> {
    counts
        .iter()
        .scan(0i32, |at, &n| {
            let here = *at;
            *at += n as i32;
            Some(here)
        })
        .collect()
}

/// Reads `buf` as elements of `T` (any alignment).
fn typed<T: Copy>(buf: &[u8]) -> Vec<T> {
    let n = buf.len() / size_of::<T>();
    // SAFETY: `n` whole elements lie in `buf`; unaligned reads of plain data.
    (0..n)
        .map(|i| unsafe { std::ptr::read_unaligned(buf.as_ptr().add(i * size_of::<T>()).cast()) })
        .collect()
}

fn untyped<T: Copy>(v: &[T], buf: &mut [u8]) {
    // SAFETY: `v` is plain data of exactly `buf.len()` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(v.as_ptr().cast::<u8>(), buf.as_mut_ptr(), buf.len());
    }
}

impl MpiGroup {
    fn reduce<T: Equivalence + Copy>(&self, buf: &mut [u8], op: SystemOperation, what: &str) {
        if buf.is_empty() {
            // Every member has the same (empty) shape: nothing to exchange.
            return;
        }
        let send: Vec<T> = typed(buf);
        let mut recv = send.clone();
        scope(|s| {
            let req = self
                .comm
                .0
                .immediate_all_reduce_into(s, &send[..], &mut recv[..], op);
            wait(req, what, &self.world_ranks);
        });
        untyped(&recv, buf);
    }
}

impl ProcessGroup for MpiGroup {
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
        };
        let me = self.world_ranks[self.rank] as u64;
        let all = g.all_gather(
            &me.to_le_bytes(),
            &vec![8; size],
            "start-up exchange of a process group's ranks",
        );
        g.world_ranks = all
            .chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()) as usize)
            .collect();
        Arc::new(g)
    }
    fn all_reduce(&self, buf: &mut [u8], dtype: DType, op: ReduceOp, what: &str) {
        let _guard = LOCK.lock().unwrap();
        let sys = match op {
            ReduceOp::Sum => SystemOperation::sum(),
            ReduceOp::Max => SystemOperation::max(),
            ReduceOp::Min => SystemOperation::min(),
        };
        match dtype {
            DType::F64 => self.reduce::<f64>(buf, sys, what),
            DType::F32 | DType::Flex32 => self.reduce::<f32>(buf, sys, what),
            DType::I64 => self.reduce::<i64>(buf, sys, what),
            DType::I32 => self.reduce::<i32>(buf, sys, what),
            DType::I16 => self.reduce::<i16>(buf, sys, what),
            DType::I8 => self.reduce::<i8>(buf, sys, what),
            DType::U64 => self.reduce::<u64>(buf, sys, what),
            DType::U32 => self.reduce::<u32>(buf, sys, what),
            DType::U16 => self.reduce::<u16>(buf, sys, what),
            DType::U8 => self.reduce::<u8>(buf, sys, what),
            DType::Bool(_) => {
                let logical = match op {
                    ReduceOp::Sum | ReduceOp::Max => SystemOperation::logical_or(),
                    ReduceOp::Min => SystemOperation::logical_and(),
                };
                if dtype.size() == 4 {
                    self.reduce::<u32>(buf, logical, what)
                } else {
                    self.reduce::<u8>(buf, logical, what)
                }
            }
            other => panic!(
                "burn-dtensor: no MPI reduction for {other:?} (the caller converts half floats)"
            ),
        }
    }
    fn all_gather_into(&self, send: &[u8], counts: &[usize], recv: &mut [u8], what: &str) {
        let _guard = LOCK.lock().unwrap();
        let total: usize = counts.iter().sum();
        assert_eq!(recv.len(), total, "burn-dtensor: all-gather receive buffer");
        // Never a dangling pointer: an empty slice's is 0x1, which OpenMPI reads as MPI_IN_PLACE
        // (an all-gather of nothing is the barrier of `spmd`).
        let mut spare = [0u8; 1];
        let recv = if recv.is_empty() {
            &mut spare[..0]
        } else {
            recv
        };
        let one = [0u8; 1];
        let send = if send.is_empty() { &one[..0] } else { send };
        let c: Vec<i32> = counts.iter().map(|&n| n as i32).collect();
        let d = displacements(counts);
        assert!(
            total <= i32::MAX as usize,
            "burn-dtensor: a cross-process all-gather of {total} bytes exceeds MPI's 2 GiB count"
        );
        let mut part = PartitionMut::new(recv, c, d);
        scope(|s| {
            let req = self
                .comm
                .0
                .immediate_all_gather_varcount_into(s, send, &mut part);
            wait(req, what, &self.world_ranks);
        });
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
    /// `MPI_Ialltoallv`, waited on against the collective timeout.
    fn all_to_all_into(
        &self,
        send: &[u8],
        send_counts: &[usize],
        recv_counts: &[usize],
        recv: &mut [u8],
        what: &str,
    ) {
        let _guard = LOCK.lock().unwrap();
        let total: usize = recv_counts.iter().sum();
        assert_eq!(recv.len(), total, "burn-dtensor: all-to-all receive buffer");
        assert!(
            total <= i32::MAX as usize && send.len() <= i32::MAX as usize,
            "burn-dtensor: a cross-process all-to-all of {} bytes exceeds MPI's 2 GiB count",
            total.max(send.len())
        );
        // Never a dangling pointer (see `all_gather_into`): one spare byte where a side is empty.
        let mut spare = [0u8; 1];
        let recv = if recv.is_empty() {
            &mut spare[..0]
        } else {
            recv
        };
        let mut sbuf = Vec::new();
        let send = if send.is_empty() {
            sbuf.push(0u8);
            &sbuf[..]
        } else {
            send
        };
        let sc: Vec<i32> = send_counts.iter().map(|&n| n as i32).collect();
        let rc: Vec<i32> = recv_counts.iter().map(|&n| n as i32).collect();
        let part = Partition::new(send, sc, displacements(send_counts));
        let mut rpart = PartitionMut::new(recv, rc, displacements(recv_counts));
        scope(|s| {
            let req = self
                .comm
                .0
                .immediate_all_to_all_varcount_into(s, &part, &mut rpart);
            wait(req, what, &self.world_ranks);
        });
    }
    fn broadcast(&self, buf: &mut [u8], root: usize, what: &str) {
        if buf.is_empty() {
            return;
        }
        let _guard = LOCK.lock().unwrap();
        scope(|s| {
            let req = self
                .comm
                .0
                .process_at_rank(root as i32)
                .immediate_broadcast_into(s, buf);
            wait(req, what, &self.world_ranks);
        });
    }
}
