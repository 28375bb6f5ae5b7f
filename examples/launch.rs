//! Starts a program as an SPMD run on the cluster a resource spec describes (nodes, addresses,
//! devices, chief; see `burn_dtensor::launch`): writes the OpenMPI hostfile and runs `mpirun`.
//!
//! ```sh
//! cargo run --release --features mpi --example launch -- --spec cluster.toml -- \
//!     target/release/examples/imdb_mlp --mode model
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use burn_dtensor::launch::ResourceSpec;
use clap::Parser;

/// Launch a program on every device slot of a resource spec.
#[derive(Parser, Debug)]
struct Args {
    /// The resource spec (TOML: `[[nodes]]` with `address`, `processes` or `gpus`, `chief`).
    #[arg(long)]
    spec: PathBuf,
    /// Print the hostfile and the command instead of running them.
    #[arg(long)]
    dry_run: bool,
    /// The program and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let spec = match ResourceSpec::from_file(&args.spec) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let hostfile = std::env::temp_dir().join(format!("dtensor-hostfile-{}", std::process::id()));
    if let Err(e) = std::fs::write(&hostfile, spec.hostfile()) {
        eprintln!(
            "error: cannot write the hostfile {}: {e}",
            hostfile.display()
        );
        return ExitCode::FAILURE;
    }
    let mut cmd = spec.mpirun(&hostfile, &args.command[0], &args.command[1..]);
    if args.dry_run {
        print!("# hostfile {}\n{}", hostfile.display(), spec.hostfile());
        println!("{cmd:?}");
        return ExitCode::SUCCESS;
    }
    eprintln!(
        "launching {} processes on {} node(s)",
        spec.world_size(),
        spec.nodes.len()
    );
    let status = cmd.status();
    let _ = std::fs::remove_file(&hostfile);
    match status {
        Ok(s) if s.success() => ExitCode::SUCCESS,
        Ok(s) => {
            eprintln!("error: the run ended with {s}");
            ExitCode::from(s.code().unwrap_or(1).clamp(1, 255) as u8)
        }
        Err(e) => {
            eprintln!(
                "error: cannot start mpirun ({e}): install OpenMPI (apt-get install openmpi-bin)"
            );
            ExitCode::FAILURE
        }
    }
}
