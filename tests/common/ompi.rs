//! A directory of its own for the session files of each `mpirun` a test starts.
//!
//! Open MPI 4.1's launchers share `$TMPDIR/ompi.<host>.<uid>` and race on creating and removing
//! it when several start at once, as the tests of one binary do: the loser fails at start-up with
//! "A call to mkdir was unable to create the desired directory ... File exists"
//! (`orte_session_dir failed`; open-mpi/ompi issue 8510; seen once in this project's CI, in
//! `spmd.rs`, session 81). `OMPI_MCA_orte_tmpdir_base` set to a fresh directory per launch takes
//! the launches apart (MOOSE's test harness does the same). Included by path from the root
//! package's tests and from `burn-dtensor/tests/spmd.rs`.
#![allow(dead_code)]

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// `c` (an `mpirun`, or a program that starts one) with a session directory base of its own:
/// a fresh directory `$TMPDIR/burn-dtensor-ompi/<pid>-<n>` (Open MPI removes what it writes
/// there when the job ends). The empty ones of test processes that have ended are removed.
pub fn own_session_dir(c: &mut Command) -> &mut Command {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let root = std::env::temp_dir().join("burn-dtensor-ompi");
    for e in std::fs::read_dir(&root).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let pid = name.split('-').next().unwrap_or_default();
        if !std::path::Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir(e.path()); // only when empty
        }
    }
    let dir = root.join(format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("creating a session directory for mpirun");
    c.env("OMPI_MCA_orte_tmpdir_base", dir)
}
