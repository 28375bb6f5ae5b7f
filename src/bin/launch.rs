//! `examples/launch.rs` as a binary target of the package, for the integration tests
//! (`CARGO_BIN_EXE_launch`); users run the example.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    dtensor_imdb::launch_cli::run(dtensor_imdb::launch_cli::LaunchArgs::parse())
}
