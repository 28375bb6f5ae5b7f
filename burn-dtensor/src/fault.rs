//! The fault policy of an SPMD run, in one place: how the library ends a job it cannot
//! continue. It ends one in exactly these cases, each printing on the failing rank a message
//! that names it (`burn-dtensor [rank R of N, pid P on HOST]: ...`):
//! - a cross-process collective waits longer than
//!   [`Config::collective_timeout`](crate::Config::collective_timeout)
//!   ([`collective_failed`]: the message names the collective, the mesh axis and the peers that
//!   are stopped or gone; a collective runs inside a Burn op, which cannot return an error);
//! - joining the world takes longer than that timeout (a rank that never joins);
//! - a panic on any thread of a multi-process world (the hook [`install_panic_hook`]), so the
//!   other ranks do not wait for a peer that will never come;
//! - the application asks for it ([`crate::spmd::abort_job`], for its own errors after
//!   start-up).
//!
//! Every one goes through [`end_job`]: the engine's abort (`MPI_Abort`: the launcher ends every
//! rank at once, with the given exit status) once the engine has started, else
//! [`std::process::abort`] (start-up never completed: no engine to abort through, and no exit
//! handler may run, since MPI's finaliser would wait for the world). Nothing else in the library
//! ends the process: every other failure is a returned [`crate::DTensorError`].

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::collective::interface::ProcessGroup;

/// Exit status of a job whose cross-process collective (or start-up) timed out.
pub const TIMEOUT_EXIT_CODE: i32 = 75;

/// Where each rank of the world runs, exchanged at start-up (for fault messages).
#[derive(Clone, Debug)]
pub(crate) struct Peer {
    pub(crate) host: String,
    pub(crate) pid: u32,
}

/// The world's process group as soon as the engine has started ([`started`]).
static WORLD_GROUP: OnceLock<Arc<dyn ProcessGroup>> = OnceLock::new();
/// Every rank's host and pid, in rank order, once exchanged ([`set_peers`]).
static PEERS: OnceLock<Vec<Peer>> = OnceLock::new();

/// Records the world's process group, from the moment the engine has started: the group
/// [`end_job`] aborts through.
pub(crate) fn started(group: Arc<dyn ProcessGroup>) {
    let _ = WORLD_GROUP.set(group);
}

/// The world's process group, once the engine has started.
pub(crate) fn world_group() -> Option<Arc<dyn ProcessGroup>> {
    WORLD_GROUP.get().cloned()
}

/// Records every rank's host and pid (for [`collective_failed`]'s diagnosis).
pub(crate) fn set_peers(peers: Vec<Peer>) {
    let _ = PEERS.set(peers);
}

/// Ends the whole job: prints `message` on standard error as
/// `burn-dtensor [rank R of N, pid P on HOST]: MESSAGE` (`[pid P]` without a group), then ends
/// every process with exit status `code` (0 becomes 1) through `group`'s abort (`MPI_Abort`),
/// or, without a group, aborts this process ([`std::process::abort`], SIGABRT).
pub(crate) fn end_job(group: Option<Arc<dyn ProcessGroup>>, message: &str, code: i32) -> ! {
    let code = if code == 0 { 1 } else { code };
    write_line(&format!("burn-dtensor [{}]: {message}", who(&group)));
    match group {
        Some(g) => g.abort(code),
        None => std::process::abort(),
    }
}

/// `rank R of N, pid P on HOST` in `group` (the world), or `pid P` without one.
fn who(group: &Option<Arc<dyn ProcessGroup>>) -> String {
    match group {
        Some(g) => format!(
            "rank {} of {}, pid {} on {}",
            g.rank(),
            g.size(),
            std::process::id(),
            hostname()
        ),
        None => format!("pid {}", std::process::id()),
    }
}

/// Prints `burn-dtensor [rank R of N, pid P on HOST]: note: MESSAGE` on standard error: what
/// a user should know about a run that goes on (a slower path taken), once where it happens.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) fn note(message: &str) {
    write_line(&format!(
        "burn-dtensor [{}]: note: {message}",
        who(&world_group())
    ));
}

/// Ends the job ([`end_job`], status [`TIMEOUT_EXIT_CODE`]) after a cross-process
/// collective `what` over the world ranks `members` waited `waited` without completing. The
/// message names the peers on this host that are stopped, and only those when there are any
/// (they are the cause: a peer that exited at the same moment may have ended on this same
/// timeout); else the peers that have exited; else says every peer is running.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) fn collective_failed(what: &str, members: &[usize], waited: Duration) -> ! {
    let me = world_group().map_or(0, |g| g.rank());
    let here = hostname();
    let (mut stopped, mut exited, mut elsewhere) = (Vec::new(), Vec::new(), Vec::new());
    if let Some(peers) = PEERS.get() {
        for &r in members.iter().filter(|&&r| r != me) {
            let Some(p) = peers.get(r) else { continue };
            if p.host != here {
                elsewhere.push(format!("rank {r} (pid {} on {})", p.pid, p.host));
                continue;
            }
            let state = std::fs::read_to_string(format!("/proc/{}/stat", p.pid))
                .ok()
                .and_then(|stat| {
                    let (_, rest) = stat.rsplit_once(") ")?;
                    rest.chars().next()
                });
            match state {
                None | Some('Z' | 'X') => exited.push(format!("rank {r} (pid {})", p.pid)),
                Some('T' | 't') => stopped.push(format!("rank {r} (pid {}) is stopped", p.pid)),
                _ => {}
            }
        }
    }
    let diagnosis = if !stopped.is_empty() {
        stopped.join(", ")
    } else if !exited.is_empty() {
        format!("{} exited without reaching it", exited.join(", "))
    } else if !elsewhere.is_empty() {
        format!(
            "the peers on this host are running; on other hosts: {}",
            elsewhere.join(", ")
        )
    } else {
        format!(
            "every peer of ranks {members:?} is still running: one of them has not reached this collective (a hung step, or processes running different programs)"
        )
    };
    end_job(
        world_group(),
        &format!(
            "error: {what} did not complete within {:.1} s: {diagnosis}. Raise \
             BURN_DTENSOR_COLLECTIVE_TIMEOUT_S if the peers are only slow.",
            waited.as_secs_f64()
        ),
        TIMEOUT_EXIT_CODE,
    )
}

/// Writes `line` and a newline to stderr in one `write` call. `eprintln!` writes each piece of
/// its format separately, and `mpirun` forwards a rank's stderr in the chunks it reads: its own
/// abort banner could land between the pieces of a message that ends the job.
pub(crate) fn write_line(line: &str) {
    use std::io::Write;
    let mut stderr = std::io::stderr().lock();
    let _ = stderr.write_all(format!("{line}\n").as_bytes());
    let _ = stderr.flush();
}

/// In a multi-process world, a panic on any thread ends the job after the usual panic message
/// ([`end_job`]), instead of leaving the peers waiting in their next collective.
pub(crate) fn install_panic_hook() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        previous(info);
        let at = info
            .location()
            .map_or(String::new(), |l| format!(" at {}:{}", l.file(), l.line()));
        let what = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        end_job(
            world_group(),
            &format!("error: panicked{at}: {what}; ending the job"),
            101,
        );
    }));
}

/// This machine's host name (`?` when unreadable).
pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}
