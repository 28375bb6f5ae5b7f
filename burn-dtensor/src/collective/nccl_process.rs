//! The NCCL engine of [`ProcessGroup`] (features `nccl` and `mpi`): collectives across processes
//! and hosts on NCCL, each process driving one CUDA device, bootstrapped over MPI. Chosen for
//! the per-axis groups of a multi-process mesh over `CudaDevice`s with
//! `BURN_DTENSOR_SPMD_ENGINE=nccl` ([`crate::collective::engine::across_engine`]); MPI stays
//! the default.
//!
//! Start-up, as `torch.distributed` and NCCL's own examples do it: member 0 of a group creates
//! an `ncclUniqueId` and broadcasts its 128 bytes over the bootstrap (MPI) group; every member
//! then joins with `ncclCommInitRank`. [`ProcessGroup::split`] (one communicator per mesh-axis
//! group, at mesh build) splits the bootstrap group and exchanges a fresh id in each sub-group.
//!
//! Buffers: the [`ProcessGroup`] interface moves host bytes (the across-process part of every
//! collective downloads the process's local result first, `collective/across.rs`), so each call
//! stages them through device memory: host -> device, the NCCL collective on this engine's
//! stream, device -> host. That is correct on any CUDA machine but pays two copies per call
//! that a device-buffer interface would not (the next step, with zero-copy MPI). Uneven
//! all-gathers are padded to the largest count (NCCL's all-gather is even). Dtypes NCCL lacks
//! (f16 / bf16 without cudarc's `f16` feature, flex32, quantized) go through the bootstrap
//! group instead. Every wait polls a CUDA event against [`Config::collective_timeout`](crate::Config::collective_timeout) and ends the
//! process naming the collective on expiry, as the MPI engine does.
//!
//! Status: type-checked in CI (`cargo clippy -p burn-dtensor --features nccl,mpi`); not run, as
//! no session had a CUDA machine with two GPUs (NCCL wants one device per rank).

use std::any::Any;
use std::ffi::c_void;
use std::mem::MaybeUninit;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use burn::tensor::DType;
use cudarc::driver::{CudaContext, CudaStream, DevicePtr, DevicePtrMut};
use cudarc::nccl::{result as nccl, sys};

use super::interface::{ProcessGroup, ReduceOp, write_bytes};
use crate::config::config;
use crate::error::{DTensorError, Result};
use crate::fault::collective_failed;

/// An NCCL communicator handle.
struct Comm(sys::ncclComm_t);
// SAFETY: a handle; every use is under `NcclGroup::lock`, so no two threads call NCCL on one
// communicator at once (NCCL's rule for a communicator).
unsafe impl Send for Comm {}
unsafe impl Sync for Comm {}

impl Drop for Comm {
    fn drop(&mut self) {
        // SAFETY: the communicator was initialised and is not used after this.
        unsafe {
            let _ = nccl::comm_destroy(self.0);
        }
    }
}

/// A process group on an NCCL communicator, beside the bootstrap group it was made from.
pub(crate) struct NcclGroup {
    comm: Comm,
    stream: Arc<CudaStream>,
    bootstrap: Arc<dyn ProcessGroup>,
    lock: Mutex<()>,
}

/// NCCL over `bootstrap`'s processes on CUDA device `ordinal` (the same group ranks).
///
/// # Errors
/// [`DTensorError::Spmd`] when the CUDA device or the NCCL communicator cannot be set up.
pub(crate) fn over(bootstrap: Arc<dyn ProcessGroup>, ordinal: usize) -> Result<NcclGroup> {
    let fail = |what: &str, e: &dyn std::fmt::Debug| {
        DTensorError::Spmd(format!(
            "NCCL across processes: {what} failed on CUDA device {ordinal} ({e:?}); set \
             BURN_DTENSOR_SPMD_ENGINE=mpi to use MPI"
        ))
    };
    let ctx = CudaContext::new(ordinal).map_err(|e| fail("opening the device", &e))?;
    let stream = ctx
        .new_stream()
        .map_err(|e| fail("creating a stream", &e))?;
    let mut id = [0u8; 128];
    if bootstrap.rank() == 0 {
        let uid = nccl::get_uniqueid().map_err(|e| fail("ncclGetUniqueId", &e))?;
        for (b, c) in id.iter_mut().zip(uid.internal) {
            *b = c as u8;
        }
    }
    bootstrap.broadcast(&mut id, 0, "NCCL unique id exchange");
    let uid = sys::ncclUniqueId {
        internal: id.map(|b| b as std::ffi::c_char),
    };
    let mut comm = std::mem::MaybeUninit::uninit();
    ctx.bind_to_thread()
        .map_err(|e| fail("binding the device", &e))?;
    // SAFETY: `comm` is written by a successful `ncclCommInitRank`, every member passes the
    // same id, its own rank and the group size.
    let comm = unsafe {
        nccl::comm_init_rank(
            comm.as_mut_ptr(),
            bootstrap.size() as i32,
            uid,
            bootstrap.rank() as i32,
        )
        .map_err(|e| fail("ncclCommInitRank", &e))?;
        comm.assume_init()
    };
    Ok(NcclGroup {
        comm: Comm(comm),
        stream,
        bootstrap,
        lock: Mutex::new(()),
    })
}

/// The NCCL element type of `dtype`, `None` where NCCL (as built) has none.
fn nccl_type(dtype: DType) -> Option<(sys::ncclDataType_t, usize)> {
    use sys::ncclDataType_t as T;
    Some(match dtype {
        DType::F64 => (T::ncclFloat64, 8),
        DType::F32 => (T::ncclFloat32, 4),
        DType::I64 => (T::ncclInt64, 8),
        DType::I32 => (T::ncclInt32, 4),
        DType::I8 => (T::ncclInt8, 1),
        DType::U64 => (T::ncclUint64, 8),
        DType::U32 => (T::ncclUint32, 4),
        DType::U8 => (T::ncclUint8, 1),
        // One byte per element, reduced as or (max) / and (min): see `ProcessGroup`.
        DType::Bool(_) => (T::ncclUint8, 1),
        _ => return None,
    })
}

impl NcclGroup {
    /// Waits for the work enqueued on the stream, at most [`Config::collective_timeout`](crate::Config::collective_timeout).
    fn wait(&self, what: &str) {
        let event = self
            .stream
            .record_event(None)
            .unwrap_or_else(|e| panic!("burn-dtensor: NCCL {what}: recording an event: {e:?}"));
        let timeout = config().collective_timeout;
        let start = Instant::now();
        loop {
            match event.try_is_complete() {
                Ok(true) => return,
                Ok(false) => {}
                Err(e) => panic!("burn-dtensor: NCCL {what} failed on the device: {e:?}"),
            }
            if start.elapsed() > timeout {
                collective_failed(what, self.bootstrap.world_ranks(), start.elapsed());
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    /// Runs `op(device pointer, stream)` on a device copy of `buf`, then copies it back.
    fn staged(&self, buf: &mut [u8], what: &str, op: impl FnOnce(*mut c_void, sys::cudaStream_t)) {
        if buf.is_empty() {
            return;
        }
        let _guard = self.lock.lock().unwrap();
        let mut dev = self
            .stream
            .clone_htod(&buf[..])
            .unwrap_or_else(|e| panic!("burn-dtensor: NCCL {what}: upload: {e:?}"));
        {
            let (ptr, _sync) = dev.device_ptr_mut(&self.stream);
            op(ptr as usize as *mut c_void, self.stream.cu_stream() as _);
        }
        self.wait(what);
        self.stream
            .memcpy_dtoh(&dev, buf)
            .unwrap_or_else(|e| panic!("burn-dtensor: NCCL {what}: download: {e:?}"));
        self.wait(what);
    }
}

fn check(r: std::result::Result<nccl::NcclStatus, nccl::NcclError>, what: &str) {
    if let Err(e) = r {
        panic!("burn-dtensor: NCCL {what}: {e:?}");
    }
}

// SAFETY: every method given a `recv` writes all of it before returning (a copy of the whole
// input, or of every member's part, whose counts sum to its length), or panics.
unsafe impl ProcessGroup for NcclGroup {
    fn rank(&self) -> usize {
        self.bootstrap.rank()
    }
    fn size(&self) -> usize {
        self.bootstrap.size()
    }
    fn world_ranks(&self) -> &[usize] {
        self.bootstrap.world_ranks()
    }
    fn engine(&self) -> &'static str {
        "nccl"
    }
    fn split(&self, color: usize, key: usize) -> Arc<dyn ProcessGroup> {
        let sub = self.bootstrap.split(color, key);
        let ordinal = self.stream.context().ordinal();
        match over(sub, ordinal) {
            Ok(g) => Arc::new(g),
            Err(e) => panic!("burn-dtensor: {e}"),
        }
    }
    fn all_reduce_into(
        &self,
        send: &[u8],
        recv: &mut [MaybeUninit<u8>],
        dtype: DType,
        op: ReduceOp,
        what: &str,
    ) {
        write_bytes(recv, send);
        // SAFETY: `write_bytes` initialised every byte of `recv`.
        let recv = unsafe { &mut *(recv as *mut [MaybeUninit<u8>] as *mut [u8]) };
        self.all_reduce(recv, dtype, op, what);
    }
    fn all_reduce(&self, buf: &mut [u8], dtype: DType, op: ReduceOp, what: &str) {
        let Some((t, size)) = nccl_type(dtype) else {
            return self.bootstrap.all_reduce(buf, dtype, op, what);
        };
        let nop = match op {
            ReduceOp::Sum if matches!(dtype, DType::Bool(_)) => sys::ncclRedOp_t::ncclMax,
            ReduceOp::Sum => sys::ncclRedOp_t::ncclSum,
            ReduceOp::Max => sys::ncclRedOp_t::ncclMax,
            ReduceOp::Min => sys::ncclRedOp_t::ncclMin,
        };
        let count = buf.len() / size;
        let comm = self.comm.0;
        self.staged(buf, what, |ptr, stream| {
            // SAFETY: `ptr` holds `count` elements of `t` on this communicator's device.
            check(
                unsafe { nccl::all_reduce(ptr, ptr, count, t, nop, comm, stream) },
                what,
            )
        });
    }
    fn all_gather_into(
        &self,
        send: &[u8],
        counts: &[usize],
        recv: &mut [MaybeUninit<u8>],
        what: &str,
    ) {
        assert_eq!(
            recv.len(),
            counts.iter().sum::<usize>(),
            "burn-dtensor: all-gather receive buffer"
        );
        let _guard = self.lock.lock().unwrap();
        let n = self.size();
        let max = counts.iter().copied().max().unwrap_or(0);
        if max == 0 {
            return;
        }
        // Even parts of `max` bytes (NCCL's all-gather), then the padding dropped.
        let mut padded = send.to_vec();
        padded.resize(max, 0);
        let src = self
            .stream
            .clone_htod(&padded[..])
            .unwrap_or_else(|e| panic!("burn-dtensor: NCCL {what}: upload: {e:?}"));
        let mut dst = self
            .stream
            .alloc_zeros::<u8>(max * n)
            .unwrap_or_else(|e| panic!("burn-dtensor: NCCL {what}: allocation: {e:?}"));
        {
            let (s, _s) = src.device_ptr(&self.stream);
            let (d, _d) = dst.device_ptr_mut(&self.stream);
            // SAFETY: `src` holds `max` bytes, `dst` `max * n` on this communicator's device.
            check(
                unsafe {
                    nccl::all_gather(
                        s as usize as *const c_void,
                        d as usize as *mut c_void,
                        max,
                        sys::ncclDataType_t::ncclUint8,
                        self.comm.0,
                        self.stream.cu_stream() as _,
                    )
                },
                what,
            );
        }
        self.wait(what);
        let all = self
            .stream
            .clone_dtoh(&dst)
            .unwrap_or_else(|e| panic!("burn-dtensor: NCCL {what}: download: {e:?}"));
        self.wait(what);
        let mut at = 0;
        for (r, &c) in counts.iter().enumerate() {
            write_bytes(&mut recv[at..at + c], &all[r * max..r * max + c]);
            at += c;
        }
    }
    fn abort(&self, code: i32) -> ! {
        self.bootstrap.abort(code)
    }
    fn broadcast(&self, buf: &mut [u8], root: usize, what: &str) {
        let comm = self.comm.0;
        let len = buf.len();
        self.staged(buf, what, |ptr, stream| {
            // SAFETY: `ptr` holds `len` bytes on this communicator's device.
            check(
                unsafe {
                    nccl::broadcast(
                        ptr,
                        ptr,
                        len,
                        sys::ncclDataType_t::ncclUint8,
                        root as i32,
                        comm,
                        stream,
                    )
                },
                what,
            )
        });
    }
}

/// The CUDA device ordinal a process drives, when `devices` (its local mesh devices) are all
/// one `CudaDevice`.
///
/// # Errors
/// [`DTensorError::Spmd`] for another device type or several CUDA devices in one process.
pub(crate) fn ordinal_of<D: 'static>(devices: &[D]) -> Result<usize> {
    let idx: Option<Vec<usize>> = devices
        .iter()
        .map(|d| {
            (d as &dyn Any)
                .downcast_ref::<cubecl::cuda::CudaDevice>()
                .map(|c| c.index)
        })
        .collect();
    match idx.as_deref() {
        Some([first, rest @ ..]) if rest.iter().all(|i| i == first) => Ok(*first),
        Some(_) => Err(DTensorError::Spmd(
            "BURN_DTENSOR_SPMD_ENGINE=nccl needs each process to drive one CUDA device (NCCL: one \
             device per rank); give each process one device, or use the default MPI engine"
                .into(),
        )),
        None => Err(DTensorError::Spmd(
            "BURN_DTENSOR_SPMD_ENGINE=nccl is for meshes of CUDA devices; this mesh's devices are \
             not `CudaDevice`s: unset it to use MPI"
                .into(),
        )),
    }
}
