//! The main job: the TensorFlow DTensor tutorial's IMDB MLP trained single-device or data-,
//! model- or spatial-parallel on `DistributedBackend`, where the parallelism is only a mesh and
//! a layout map. `--help` lists the flags; the README shows the checkpoint flow across modes.

use std::process::ExitCode;

use clap::Parser;

/// mimalloc rather than glibc's malloc: glibc returns the buffers freed at the end of a step to
/// the OS and page-faults them back in on the next (measured in NOTES.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    dtensor_imdb::console::finish(dtensor_imdb::cli::run_args(dtensor_imdb::cli::Args::parse()))
}
