//! The command line of the `launch` example: starts a program as an SPMD run on the cluster a
//! resource spec describes (nodes, addresses, devices, chief; see `burn_dtensor::launch`):
//! writes the OpenMPI hostfile and runs `mpirun`.

use std::path::PathBuf;
use std::process::ExitCode;

use burn_dtensor::launch::ResourceSpec;
use clap::Parser;

/// Launch a program on every device slot of a resource spec.
#[derive(Parser, Debug)]
#[command(name = "launch")]
pub struct LaunchArgs {
    /// The resource spec (TOML: `[[nodes]]` with `address`, `processes` or `gpus`, `chief`).
    #[arg(long)]
    pub spec: PathBuf,
    /// Print the hostfile and the command instead of running them (writes nothing).
    #[arg(long)]
    pub dry_run: bool,
    /// The program and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<String>,
}

/// Runs the launcher: writes the hostfile to a temporary file (removed afterwards) and runs
/// `mpirun` on it, or with `--dry-run` prints both; the exit status is the run's.
pub fn run(args: LaunchArgs) -> ExitCode {
    let spec = match ResourceSpec::from_file(&args.spec) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.dry_run {
        // Nothing is written: the hostfile's text and the command, with a placeholder path.
        let cmd = spec.mpirun(
            std::path::Path::new("<hostfile>"),
            &args.command[0],
            &args.command[1..],
        );
        print!("# <hostfile>\n{}", spec.hostfile());
        println!("{cmd:?}");
        return ExitCode::SUCCESS;
    }
    // Removed when dropped: after the run, and on every early return.
    let hostfile = match tempfile::Builder::new()
        .prefix("dtensor-hostfile-")
        .tempfile()
        .and_then(|mut f| {
            std::io::Write::write_all(&mut f, spec.hostfile().as_bytes())?;
            Ok(f)
        }) {
        Ok(f) => f,
        Err(e) => {
            eprintln!(
                "error: cannot write the hostfile in {}: {e}",
                std::env::temp_dir().display()
            );
            return ExitCode::FAILURE;
        }
    };
    let mut cmd = spec.mpirun(hostfile.path(), &args.command[0], &args.command[1..]);
    eprintln!(
        "launching {} processes on {} node(s)",
        spec.world_size(),
        spec.nodes.len()
    );
    let status = cmd.status();
    drop(hostfile);
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
