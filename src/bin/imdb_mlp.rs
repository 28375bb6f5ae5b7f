//! `examples/imdb_mlp.rs` as a binary target of the package, so that the integration tests find
//! it (`CARGO_BIN_EXE_imdb_mlp`) under `cargo test --all-targets`, which builds examples only
//! in test mode. Users run the example: `cargo run --release --example imdb_mlp`.

use std::process::ExitCode;

use clap::Parser;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    dtensor_imdb::console::finish(dtensor_imdb::cli::run_args(dtensor_imdb::cli::Args::parse()))
}
