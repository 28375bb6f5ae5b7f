//! Cross-memory attach: one process of this host writing straight into another's memory
//! (Linux `process_vm_writev`, one copy, no shared segment), the transport of the MPI engine's
//! single-copy all-to-all and all-gather
//! ([`StridedSend::SingleCopy`](crate::StridedSend::SingleCopy), `collective/mpi.rs`). Open
//! MPI's shared-memory transport moves contiguous messages the same way
//! (`btl_vader_single_copy_mechanism = cma`); writing a shard's strided parts from where they
//! lie saves the pack that an `MPI_Alltoallv` needs first, and writing every part in one round
//! saves the rounds of MPI's all-gather algorithms.
//!
//! The kernel allows it between processes that may trace each other (same user, no stricter
//! Yama or container policy; [`allow_peers`] lifts Yama's scope 1 as Open MPI does). Whether
//! it works, and whether a pid names the process the engine thinks it does (another host or
//! PID namespace would not), is checked once per process group: each member publishes its
//! host, pid and a token's address and value ([`Identity`]), and every member reads every
//! peer's token through the kernel ([`reach`]).

use std::io;
use std::ops::Range;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::host::for_each_run;

/// At most this many local pieces per `process_vm_writev` call (Linux's `IOV_MAX`).
const IOV_MAX: usize = 1024;

/// This process's token: a value peers read back through the kernel to confirm that the pid
/// they were given is this process ([`reach`]). Set once, from the pid and the clock.
static TOKEN: AtomicU64 = AtomicU64::new(0);

/// What a peer needs to check that it reaches this process: its host (the kernel's boot id),
/// its pid, and where its token lies and what it holds, as four little-endian `u64`s
/// ([`Identity::to_bytes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Identity {
    host: u64,
    pub(crate) pid: u64,
    at: u64,
    token: u64,
}

impl Identity {
    /// Bytes of [`Identity::to_bytes`].
    pub(crate) const BYTES: usize = 32;

    /// This process's identity (sets its token on first use).
    pub(crate) fn own() -> Self {
        let pid = std::process::id() as u64;
        let mut token = TOKEN.load(Ordering::Acquire);
        if token == 0 {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            let fresh = (nanos ^ (pid << 32)) | 1;
            token = match TOKEN.compare_exchange(0, fresh, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => fresh,
                Err(set) => set,
            };
        }
        Self {
            host: host_id(),
            pid,
            at: TOKEN.as_ptr() as u64,
            token,
        }
    }

    /// The identity as 32 bytes: host, pid, the token's address, the token.
    pub(crate) fn to_bytes(self) -> [u8; Self::BYTES] {
        let mut b = [0u8; Self::BYTES];
        let fields = [self.host, self.pid, self.at, self.token];
        for (i, v) in fields.into_iter().enumerate() {
            b[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    /// The identity [`Identity::to_bytes`] wrote.
    ///
    /// # Panics
    /// When `b` is not 32 bytes.
    pub(crate) fn from_bytes(b: &[u8]) -> Self {
        assert_eq!(b.len(), Self::BYTES, "burn-dtensor: a peer identity");
        let v = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
        Self {
            host: v(0),
            pid: v(1),
            at: v(2),
            token: v(3),
        }
    }
}

/// This host's identity for [`Identity`]: the first 64 bits of the kernel's boot id
/// (`/proc/sys/kernel/random/boot_id`, a random UUID drawn at each boot, shared by every
/// container of the host); 0 where it cannot be read (every process then counts as one host,
/// and [`reach`] tells hosts apart by the token alone). Read once per process.
fn host_id() -> u64 {
    static HOST: OnceLock<u64> = OnceLock::new();
    *HOST.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .ok()
            .and_then(|id| {
                let hex: String = id
                    .chars()
                    .filter(char::is_ascii_hexdigit)
                    .take(16)
                    .collect();
                u64::from_str_radix(&hex, 16).ok()
            })
            .unwrap_or(0)
    })
}

/// Why this process cannot write into a peer ([`reach`]).
#[derive(Debug)]
pub(crate) enum Unreachable {
    /// The peer runs on another host (another boot id): expected, the engine's own transport
    /// carries the bytes.
    OtherHost,
    /// The process under the peer's pid is another one (another PID namespace on this host).
    OtherProcess,
    /// The kernel refused to read the peer's memory (permission: Yama's `ptrace_scope`, a
    /// container's policy, another user; or no such process).
    Refused(io::Error),
}

/// Lets processes of this user write into this one where Yama's `ptrace_scope` 1 would allow
/// only its ancestors: `prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY)`, what Open MPI's
/// shared-memory transport does before it uses cross-memory attach
/// (`opal/mca/btl/sm/btl_sm_component.c`). Nothing to do without Yama or at scope 0; scopes 2
/// and 3 admit only `CAP_SYS_PTRACE` or no one, which no setting of this process changes.
///
/// # Errors
/// The kernel's, when the `prctl` fails.
pub(crate) fn allow_peers() -> io::Result<()> {
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").ok();
    if scope.is_none_or(|s| s.trim() == "0") {
        return Ok(());
    }
    // SAFETY: a plain `prctl` on this process's own attribute.
    let rc = unsafe { libc::prctl(libc::PR_SET_PTRACER, libc::PR_SET_PTRACER_ANY, 0, 0, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether this process can write into `peer` through the kernel: on the same host, reads
/// `peer`'s token at its address in `peer.pid` (`process_vm_readv`, which needs the same
/// permission as a write) and compares it with the value `peer` published.
///
/// # Errors
/// Why not ([`Unreachable`]).
pub(crate) fn reach(peer: Identity) -> Result<(), Unreachable> {
    if peer.host != host_id() {
        return Err(Unreachable::OtherHost);
    }
    let pid = libc::pid_t::try_from(peer.pid).map_err(|_| Unreachable::OtherProcess)?;
    let mut got = 0u64;
    let local = libc::iovec {
        iov_base: (&mut got as *mut u64).cast(),
        iov_len: 8,
    };
    let remote = libc::iovec {
        iov_base: peer.at as *mut libc::c_void,
        iov_len: 8,
    };
    // SAFETY: the local iovec is this function's 8-byte variable; the kernel checks the remote
    // range against the peer's mappings and fails (returns -1) rather than fault.
    let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    if n < 0 {
        let e = io::Error::last_os_error();
        // A pid that names no process here, or a token address unmapped in the process that
        // has it: that pid is another process's (another PID namespace).
        return Err(match e.raw_os_error() {
            Some(libc::ESRCH) | Some(libc::EFAULT) => Unreachable::OtherProcess,
            _ => Unreachable::Refused(e),
        });
    }
    if n == 8 && got == peer.token {
        Ok(())
    } else {
        Err(Unreachable::OtherProcess)
    }
}

/// Writes the box `ranges` (one range per dim) of the row-major array of `shape` (`elem`
/// bytes an element) in `src` into process `pid`, at its address `dst`, in the box's
/// row-major order (as [`crate::host::append_box`] packs it): one `process_vm_writev` per
/// [`IOV_MAX`] runs, each run read where it lies in `src` (adjacent runs merged).
///
/// # Errors
/// The kernel's error, or [`io::ErrorKind::WriteZero`] when it wrote less than asked (the
/// peer's range is not mapped writable).
///
/// # Safety
/// `dst` must be the address of the box's bytes (`box_numel(ranges) * elem`) in memory of
/// process `pid` that nothing else reads or writes until the peer learns the write is done.
pub(crate) unsafe fn write_box(
    pid: u64,
    (shape, elem): (&[usize], usize),
    src: &[u8],
    ranges: &[Range<usize>],
    dst: u64,
) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::other("pid out of range"))?;
    // The runs as (byte offset in `src`, byte length), adjacent ones merged.
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for_each_run(shape, ranges, |s, _, n| {
        let (at, len) = (s * elem, n * elem);
        match runs.last_mut() {
            Some((a, l)) if *a + *l == at => *l += len,
            _ => runs.push((at, len)),
        }
    });
    let mut to = dst;
    for batch in runs.chunks(IOV_MAX) {
        let local: Vec<libc::iovec> = batch
            .iter()
            .map(|&(at, len)| libc::iovec {
                iov_base: src[at..at + len].as_ptr() as *mut libc::c_void,
                iov_len: len,
            })
            .collect();
        let bytes: usize = batch.iter().map(|r| r.1).sum();
        let remote = libc::iovec {
            iov_base: to as *mut libc::c_void,
            iov_len: bytes,
        };
        // SAFETY: every local iovec lies inside `src` (sliced above); the remote range is the
        // caller's (this function's contract), checked by the kernel against the peer's
        // mappings.
        let n = unsafe {
            libc::process_vm_writev(pid, local.as_ptr(), local.len() as _, &remote, 1, 0)
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n as usize != bytes {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("wrote {n} of {bytes} bytes"),
            ));
        }
        to += bytes as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process may write into itself through the kernel: `write_box` into this process
    /// gives what `host::append_box` packs, for boxes of one run, of strided runs, of runs
    /// that merge, and of more runs than one call takes ([`IOV_MAX`]).
    #[test]
    fn write_box_into_this_process_is_the_packed_box() {
        let me = std::process::id() as u64;
        let cases: [(&[usize], Vec<Range<usize>>); 4] = [
            (&[4, 6], vec![1..3, 0..6]),
            (&[3, 4, 5], vec![0..3, 1..3, 2..5]),
            (&[3, 4, 5], vec![1..2, 0..4, 0..5]),
            (&[2100, 3], vec![0..2100, 1..2]),
        ];
        for (shape, ranges) in cases {
            let elem = 4;
            let n: usize = shape.iter().product();
            let src: Vec<u8> = (0..n * elem).map(|i| (i * 7 % 251) as u8).collect();
            let mut want = Vec::new();
            crate::host::append_box(shape, elem, &src, &ranges, &mut want);
            let mut got = vec![0u8; want.len()];
            // SAFETY: `got` holds the box's bytes and nothing else touches it meanwhile.
            unsafe { write_box(me, (shape, elem), &src, &ranges, got.as_mut_ptr() as u64) }
                .unwrap();
            assert_eq!(got, want, "{shape:?} {ranges:?}");
        }
        // A pid that names no process is the kernel's error, not a write.
        let whole = [0..1, 0..2];
        let err = unsafe { write_box(i32::MAX as u64, (&[1, 2], 1), &[1, 2], &whole, 0) };
        assert!(err.is_err());
    }

    /// A process reaches itself by its identity, and not by a wrong token, address, pid or
    /// host; allowing peers is a no-op or succeeds here.
    #[test]
    fn reach_checks_host_pid_and_token() {
        let own = Identity::own();
        assert_eq!(Identity::from_bytes(&own.to_bytes()), own);
        allow_peers().unwrap();
        assert!(reach(own).is_ok());
        let not = |peer: Identity| match reach(peer) {
            Err(e) => e,
            Ok(()) => panic!("{peer:?} reached"),
        };
        let token = Identity {
            token: own.token ^ 2,
            ..own
        };
        assert!(matches!(not(token), Unreachable::OtherProcess));
        assert!(matches!(
            not(Identity { at: 8, ..own }),
            Unreachable::OtherProcess
        ));
        let pid = Identity {
            pid: i32::MAX as u64,
            ..own
        };
        assert!(matches!(not(pid), Unreachable::OtherProcess));
        let host = Identity {
            host: own.host ^ 1,
            ..own
        };
        assert!(matches!(not(host), Unreachable::OtherHost));
    }
}
