//! Starts a program as an SPMD run on the cluster a resource spec describes (nodes, addresses,
//! devices, chief; see `burn_dtensor::launch`): writes the OpenMPI hostfile and runs `mpirun`.
//!
//! ```sh
//! cargo run --release --features mpi --example launch -- --spec cluster.toml -- \
//!     target/release/examples/imdb_mlp --mode model
//! ```

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    dtensor_imdb::launch_cli::run(dtensor_imdb::launch_cli::LaunchArgs::parse())
}
