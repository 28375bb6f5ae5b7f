//! What a user reads, once per job: in an SPMD launch only rank 0 (the chief) prints progress,
//! tables and summaries; colours and progress bars only where stdout is a terminal of a process
//! started alone (under `mpirun` a rank's stdout is a pseudo-terminal even when the job's
//! output goes to a file); and the examples' one way to end on an error ([`finish`]).

use std::fmt::Display;
use std::io::IsTerminal;
use std::process::ExitCode;

use burn_dtensor::spmd::LaunchEnv;

fn launch() -> Option<LaunchEnv> {
    LaunchEnv::detect().ok()
}

/// Whether this process prints what a user reads: rank 0 of its launch, or a process alone.
/// Read from the launch environment, so it holds before the SPMD world is joined.
pub fn is_chief() -> bool {
    launch().is_none_or(|l| l.rank == 0)
}

/// Whether this process is one of several (an SPMD launch).
pub fn is_multi_process() -> bool {
    launch().is_some_and(|l| l.is_multi_process())
}

/// Whether to draw colours and progress bars: stdout is a terminal, the process was started
/// alone, and `NO_COLOR` is not set (<https://no-color.org>).
pub fn color() -> bool {
    std::io::stdout().is_terminal()
        && !is_multi_process()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// `println!` on the chief only ([`is_chief`]).
#[macro_export]
macro_rules! say {
    ($($t:tt)*) => {
        if $crate::console::is_chief() {
            println!($($t)*);
        }
    };
}

/// The exit of an example's `main`: success, or the error printed as `error: ...` with a
/// failure status. In an SPMD launch the error ends the whole job at once
/// ([`burn_dtensor::spmd::abort_job`]: the message names this rank, and no peer is left
/// waiting in a collective for a rank that has stopped).
pub fn finish<T, E: Display>(result: Result<T, E>) -> ExitCode {
    match result {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) if is_multi_process() => burn_dtensor::spmd::abort_job(&format!("error: {e}"), 1),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
