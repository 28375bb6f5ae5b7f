//! The guards of the integration tests that launch `mpirun` (`imdb_spmd.rs`, `launch.rs`).

use std::path::PathBuf;
use std::process::Command;

/// Whether this build and machine can launch `mpirun`: the `mpi` feature and an `mpirun` on the
/// path. If not, the test prints why and passes, unless `BURN_DTENSOR_REQUIRE_MPI=1` (CI sets
/// it) makes that a failure.
pub fn mpi_ready() -> bool {
    let require = std::env::var("BURN_DTENSOR_REQUIRE_MPI").is_ok_and(|v| v == "1");
    let why = if !cfg!(feature = "mpi") {
        "built without the `mpi` feature"
    } else if Command::new("mpirun").arg("--version").output().is_err() {
        "no `mpirun` (apt-get install openmpi-bin libopenmpi-dev)"
    } else {
        return true;
    };
    assert!(!require, "{why} (BURN_DTENSOR_REQUIRE_MPI=1)");
    println!("skipped: {why}");
    false
}

/// The IMDB archive ([`crate::common::archive`]) when [`mpi_ready`] too; `None`, with the reason
/// printed, otherwise.
pub fn archive_and_mpi() -> Option<PathBuf> {
    let archive = crate::common::archive()?;
    mpi_ready().then_some(archive)
}
