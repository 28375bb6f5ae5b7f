//! The command line of the `launch` example: starts a program as an SPMD run on the cluster a
//! resource spec describes (nodes, addresses, devices, chief; see `burn_dtensor::launch`):
//! writes the OpenMPI hostfile and runs `mpirun`; or, on a Slurm cluster, runs `srun` inside an
//! allocation, or writes and submits an `sbatch` script.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use burn_dtensor::launch::{ResourceSpec, command_line};
use clap::Parser;

/// Launch a program on every device slot of a resource spec: with `mpirun` (default), with
/// Slurm's `srun` (`--srun`, inside an `salloc` allocation), or as a Slurm batch job
/// (`--slurm-script FILE`, `--sbatch`).
#[derive(Parser, Debug)]
#[command(name = "launch")]
pub struct LaunchArgs {
    /// The resource spec (TOML: `[[nodes]]` with `address`, `processes` or `gpus`, `chief`;
    /// `[mpi]`; `[slurm]` with `partition`, `time`, `job_name`, `account`, `output`,
    /// `nodelist`, `args`).
    #[arg(long)]
    pub spec: PathBuf,
    /// Print the hostfile and the command (or the batch script) instead of running them
    /// (writes nothing).
    #[arg(long)]
    pub dry_run: bool,
    /// Bind each process to this many CPU cores (`mpirun --map-by slot:PE=N --bind-to core`;
    /// Slurm `--cpus-per-task=N --cpu-bind=cores`).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub cpus_per_process: Option<u32>,
    /// Slurm: start the run as one job step with `srun --mpi=pmix` (inside an allocation from
    /// `salloc`, or as a job of its own) instead of `mpirun`.
    #[arg(long, conflicts_with_all = ["slurm_script", "sbatch"])]
    pub srun: bool,
    /// Slurm: write the batch script for the spec to FILE (`#SBATCH` resources, then `srun
    /// --mpi=pmix PROGRAM`); submitted only with `--sbatch`.
    #[arg(long, value_name = "FILE")]
    pub slurm_script: Option<PathBuf>,
    /// Slurm: submit the batch script with `sbatch` (the `--slurm-script` file, else a temporary
    /// one); prints the job id; the run's output goes to the `[slurm] output` file.
    #[arg(long)]
    pub sbatch: bool,
    /// With `--sbatch`: wait until the job ends (`sbatch --wait`); the exit status is the job's.
    #[arg(long, requires = "sbatch")]
    pub wait: bool,
    /// The program and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<String>,
}

fn fail(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::FAILURE
}

/// Runs `cmd` (printed first as a shell line); the exit status is its own (clamped to
/// 1..=255 on failure). `install` says what to do when the program cannot start.
fn run_command(mut cmd: Command, install: &str) -> ExitCode {
    eprintln!("+ {}", command_line(&cmd));
    match cmd.status() {
        Ok(s) if s.success() => ExitCode::SUCCESS,
        Ok(s) => {
            eprintln!("error: the run ended with {s}");
            ExitCode::from(s.code().unwrap_or(1).clamp(1, 255) as u8)
        }
        Err(e) => fail(format!(
            "cannot start {} ({e}): {install}",
            cmd.get_program().to_string_lossy()
        )),
    }
}

/// Runs the launcher: writes the hostfile to a temporary file (removed afterwards) and runs
/// `mpirun` on it, or runs `srun`, or writes / submits the Slurm batch script; with
/// `--dry-run` prints what it would write and run. The exit status is the run's.
pub fn run(args: LaunchArgs) -> ExitCode {
    let spec = match ResourceSpec::from_file(&args.spec) {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    let cpus = args.cpus_per_process.map(|n| n as usize);
    let (program, rest) = (&args.command[0], &args.command[1..]);
    if args.srun {
        return match spec.srun(cpus, program, rest) {
            Ok(c) if args.dry_run => {
                println!("{}", command_line(&c));
                ExitCode::SUCCESS
            }
            Ok(c) => run_command(
                c,
                "run it on a Slurm cluster (apt-get install slurm-client), inside `salloc`",
            ),
            Err(e) => fail(e),
        };
    }
    if args.slurm_script.is_some() || args.sbatch {
        return slurm_batch(&spec, &args, cpus);
    }
    if args.dry_run {
        // Nothing is written: the hostfile's text and the command, with a placeholder path, and
        // the same run under Slurm where the spec allows one.
        let cmd = spec.mpirun(Path::new("<hostfile>"), cpus, program, rest);
        print!("# <hostfile>\n{}", spec.hostfile());
        println!("{}", command_line(&cmd));
        if let Ok(c) = spec.srun(cpus, program, rest) {
            println!("# the same run in a Slurm allocation: {}", command_line(&c));
        }
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
            return fail(format!(
                "cannot write the hostfile in {}: {e}",
                std::env::temp_dir().display()
            ));
        }
    };
    eprintln!(
        "launching {} processes on {} node(s)",
        spec.world_size(),
        spec.nodes.len()
    );
    let cmd = spec.mpirun(hostfile.path(), cpus, program, rest);
    let code = run_command(cmd, "install OpenMPI (apt-get install openmpi-bin)");
    drop(hostfile);
    code
}

/// `--slurm-script` / `--sbatch`: writes the batch script (to the given file, or a temporary
/// one that `sbatch` reads before it returns), then submits it with `--sbatch`.
fn slurm_batch(spec: &ResourceSpec, args: &LaunchArgs, cpus: Option<usize>) -> ExitCode {
    let script = match spec.slurm_script(cpus, &args.command[0], &args.command[1..]) {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    let mut sbatch = Command::new("sbatch");
    if args.wait {
        sbatch.arg("--wait");
    }
    if args.dry_run {
        let path = args
            .slurm_script
            .as_deref()
            .map_or("<script>".into(), |p| p.display().to_string());
        print!("# {path}\n{script}");
        if args.sbatch {
            println!("{} {path}", command_line(&sbatch));
        }
        return ExitCode::SUCCESS;
    }
    let written = match &args.slurm_script {
        Some(p) => std::fs::write(p, &script)
            .map(|()| None)
            .map_err(|e| format!("cannot write the batch script {}: {e}", p.display())),
        None => tempfile::Builder::new()
            .prefix("dtensor-sbatch-")
            .suffix(".sh")
            .tempfile()
            .and_then(|mut f| {
                std::io::Write::write_all(&mut f, script.as_bytes())?;
                Ok(Some(f))
            })
            .map_err(|e| {
                format!(
                    "cannot write the batch script in {}: {e}",
                    std::env::temp_dir().display()
                )
            }),
    };
    let temp = match written {
        Ok(t) => t,
        Err(e) => return fail(e),
    };
    let path = match (&args.slurm_script, &temp) {
        (Some(p), _) => p.clone(),
        (None, Some(t)) => t.path().to_path_buf(),
        (None, None) => unreachable!("a script is written to a file or a temporary file"),
    };
    if !args.sbatch {
        eprintln!(
            "wrote {}: submit it with `sbatch {}`",
            path.display(),
            path.display()
        );
        return ExitCode::SUCCESS;
    }
    sbatch.arg(&path);
    run_command(
        sbatch,
        "run it on a Slurm cluster's login node (apt-get install slurm-client)",
    )
}
