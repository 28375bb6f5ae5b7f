//! The IMDB MLP of `imdb_mlp`, trained with burn-train's Learner (loss and accuracy metrics, its
//! TUI dashboard in a terminal or its plain renderer otherwise, its file checkpointer) on
//! `Autodiff<DistributedBackend<_>>`, data-, model- or spatial-parallel by `--mode` alone.
//! `--help` lists the flags.

use std::process::ExitCode;

use clap::Parser;

/// mimalloc rather than glibc's malloc (see `imdb_mlp` and NOTES.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    dtensor_imdb::console::finish(dtensor_imdb::learner_cli::run_args(
        dtensor_imdb::learner_cli::LearnerArgs::parse(),
    ))
}
