//! Which launcher started this process, read from its environment: the one place that decides
//! whether a process is one of several (JAX's `jax.distributed.initialize()` detection, for MPI
//! launchers and Slurm).
//!
//! Sources, in the order they are tried (the first whose variables are present wins):
//!
//! | source | rank | size | local rank | node |
//! |---|---|---|---|---|
//! | Open MPI 4 and 5 (`mpirun`, `prterun`) | `OMPI_COMM_WORLD_RANK` | `OMPI_COMM_WORLD_SIZE` | `OMPI_COMM_WORLD_LOCAL_RANK` (`_LOCAL_SIZE`) | host name |
//! | MPICH / Hydra (`mpiexec`) | `PMI_RANK` | `PMI_SIZE` | `MPI_LOCALRANKID` (`MPI_LOCALNRANKS`) | host name |
//! | Slurm job step (`srun`) | `SLURM_PROCID` | `SLURM_STEP_NUM_TASKS`, else `SLURM_NTASKS` | `SLURM_LOCALID` | `SLURMD_NODENAME`, else `SLURM_STEP_NODELIST`'s first |
//! | PMIx alone (a PMIx launcher that sets nothing else) | `PMIX_RANK` | learnt from MPI | 0 | host name |
//! | torchrun / torch.distributed | `RANK` | `WORLD_SIZE` | `LOCAL_RANK` | `MASTER_ADDR` is not a node |
//! | none | 0 | 1 | 0 | host name |
//!
//! Slurm counts only inside a job step (`SLURM_STEP_ID` set): a batch script's own shell is
//! one process, however many tasks the allocation has. torchrun is detected only to refuse it:
//! burn-dtensor joins MPI worlds, and a process that trained alone as one of `WORLD_SIZE`
//! copies would silently train the whole model `WORLD_SIZE` times.
//!
//! [`LaunchEnv::joinable`] says whether this build can join the launch: a multi-process launch
//! needs the `mpi` feature, and torchrun cannot be joined at all. [`crate::spmd::init`] calls
//! it, then checks that the MPI world it started has the size the environment promised (a
//! variable set by hand, or `srun` without `--mpi=pmix`, starts a world of one).

use std::fmt;

use crate::error::{DTensorError, Result};

/// The launcher a process was started by (see the module table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LaunchSource {
    /// Started alone: a world of one process.
    Alone,
    /// Open MPI's `mpirun` / `prterun` (`OMPI_COMM_WORLD_*`).
    OpenMpi,
    /// MPICH's Hydra `mpiexec` or another PMI-1/2 launcher (`PMI_RANK`, `PMI_SIZE`).
    Hydra,
    /// A Slurm job step (`srun`; MPI joins through PMIx with `--mpi=pmix`).
    Slurm,
    /// A PMIx launcher that sets only `PMIX_RANK`.
    Pmix,
    /// PyTorch's torchrun (`RANK`, `WORLD_SIZE`): detected to be refused.
    Torchrun,
}

impl fmt::Display for LaunchSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LaunchSource::Alone => "none (started alone)",
            LaunchSource::OpenMpi => "Open MPI",
            LaunchSource::Hydra => "MPICH/Hydra (PMI)",
            LaunchSource::Slurm => "Slurm (srun)",
            LaunchSource::Pmix => "PMIx",
            LaunchSource::Torchrun => "torchrun",
        })
    }
}

/// This process's place in its launch, as its environment states it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchEnv {
    /// Which launcher.
    pub source: LaunchSource,
    /// Rank in the world (`0..size`).
    pub rank: usize,
    /// Processes in the world; `None` where only MPI can tell ([`LaunchSource::Pmix`]).
    pub size: Option<usize>,
    /// Rank among the processes on this node (which GPU a process takes by default).
    pub local_rank: usize,
    /// Processes on this node, where the launcher says.
    pub local_size: Option<usize>,
    /// The node (host name) this process runs on.
    pub node: String,
    /// The GPU this process takes when its launch assigns one: entry `rank` of
    /// [`RANK_GPUS_VAR`](crate::launch::RANK_GPUS_VAR), which the resource-spec launcher
    /// exports (a node's `gpus[local rank]`); `None` for a CPU rank or without the variable.
    pub gpu: Option<usize>,
    /// The variables the values were read from, `NAME=value` joined by spaces (for messages).
    pub evidence: String,
    /// Whether a process-management server MPI can join through is present (`PMIX_RANK`,
    /// `PMI_RANK` or `PMI_FD` set): `srun --mpi=pmix` gives one, plain `srun` none.
    pub pmi: bool,
}

impl LaunchEnv {
    /// Reads this process's environment.
    ///
    /// # Errors
    /// [`DTensorError::Spmd`] when a launcher's variable is present but not a number, or a rank
    /// is not below its size.
    pub fn detect() -> Result<Self> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// As [`LaunchEnv::detect`], from `get` (a variable's value by name) instead of the
    /// process environment: for tests and tools that inspect another process's environment.
    ///
    /// # Errors
    /// As [`LaunchEnv::detect`].
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let host = crate::fault::hostname;
        let evidence = std::cell::RefCell::new(Vec::new());
        let num = |k: &str| -> Result<Option<usize>> {
            let Some(v) = get(k) else { return Ok(None) };
            evidence.borrow_mut().push(format!("{k}={v}"));
            v.trim().parse::<usize>().map(Some).map_err(|_| {
                DTensorError::Spmd(format!(
                    "the launch variable {k}={v:?} is not a whole number; unset it or start \
                     the process with its launcher"
                ))
            })
        };
        let (source, rank, size, local_rank, local_size, node);
        if let (Some(r), Some(s)) = (num("OMPI_COMM_WORLD_RANK")?, num("OMPI_COMM_WORLD_SIZE")?) {
            source = LaunchSource::OpenMpi;
            (rank, size) = (r, Some(s));
            local_rank = num("OMPI_COMM_WORLD_LOCAL_RANK")?.unwrap_or(0);
            local_size = num("OMPI_COMM_WORLD_LOCAL_SIZE")?;
            node = host();
        } else if let (Some(r), Some(s)) = (num("PMI_RANK")?, num("PMI_SIZE")?) {
            source = LaunchSource::Hydra;
            (rank, size) = (r, Some(s));
            local_rank = num("MPI_LOCALRANKID")?.unwrap_or(0);
            local_size = num("MPI_LOCALNRANKS")?;
            node = host();
        } else if let (Some(r), true) = (num("SLURM_PROCID")?, get("SLURM_STEP_ID").is_some()) {
            source = LaunchSource::Slurm;
            rank = r;
            size = match num("SLURM_STEP_NUM_TASKS")? {
                Some(s) => Some(s),
                None => num("SLURM_NTASKS")?,
            };
            local_rank = num("SLURM_LOCALID")?.unwrap_or(0);
            local_size = None;
            if let Some(j) = get("SLURM_JOB_ID") {
                evidence.borrow_mut().push(format!("SLURM_JOB_ID={j}"));
            }
            node = get("SLURMD_NODENAME")
                .or_else(|| {
                    get("SLURM_STEP_NODELIST")
                        .map(|l| l.split(',').next().unwrap_or_default().to_string())
                })
                .unwrap_or_else(host);
        } else if let Some(r) = num("PMIX_RANK")? {
            source = LaunchSource::Pmix;
            (rank, size) = (r, None);
            local_rank = 0;
            local_size = None;
            node = host();
        } else if let (Some(r), Some(s)) = (num("RANK")?, num("WORLD_SIZE")?) {
            source = LaunchSource::Torchrun;
            (rank, size) = (r, Some(s));
            local_rank = num("LOCAL_RANK")?.unwrap_or(0);
            local_size = num("LOCAL_WORLD_SIZE")?;
            node = host();
        } else {
            evidence.borrow_mut().clear();
            source = LaunchSource::Alone;
            (rank, size, local_rank, local_size) = (0, Some(1), 0, Some(1));
            node = host();
        }
        let evidence = evidence.into_inner().join(" ");
        let gpu_var = crate::launch::RANK_GPUS_VAR;
        let gpu = match get(gpu_var) {
            None => None,
            Some(list) => {
                let entry = list.split(',').nth(rank).map(str::trim);
                match entry {
                    None | Some("-") | Some("") => None,
                    Some(g) => Some(g.parse::<usize>().map_err(|_| {
                        DTensorError::Spmd(format!(
                            "{gpu_var}={list:?}: entry {rank} (this rank's GPU) `{g}` is not a \
                             GPU index"
                        ))
                    })?),
                }
            }
        };
        if let Some(s) = size
            && rank >= s.max(1)
        {
            return Err(DTensorError::Spmd(format!(
                "the launch environment ({source}: {evidence}) gives rank {rank} in a world of {s}"
            )));
        }
        let pmi = ["PMIX_RANK", "PMI_RANK", "PMI_FD"]
            .iter()
            .any(|k| get(k).is_some());
        Ok(Self {
            source,
            rank,
            size,
            local_rank,
            local_size,
            node,
            gpu,
            evidence,
            pmi,
        })
    }

    /// Whether the launch has (or may have, for [`LaunchSource::Pmix`]) more than one process.
    pub fn is_multi_process(&self) -> bool {
        self.size.is_none_or(|s| s > 1)
    }

    /// Whether this build can join the launch: `Ok` for a process alone and, with the `mpi`
    /// feature, for the MPI launchers and Slurm.
    ///
    /// # Errors
    /// [`DTensorError::Spmd`] saying what was seen and what to do: a multi-process launch in a
    /// build without the `mpi` feature, a torchrun launch, or a Slurm step without PMI (plain
    /// `srun`: Open MPI would abort inside `MPI_Init` with a message about its build).
    pub fn joinable(&self) -> Result<()> {
        if !self.is_multi_process() {
            return Ok(());
        }
        let what = format!(
            "this process is rank {} of {} according to {} ({})",
            self.rank,
            self.size.map_or("?".into(), |s| s.to_string()),
            self.source,
            self.evidence
        );
        if self.source == LaunchSource::Torchrun {
            return Err(DTensorError::Spmd(format!(
                "{what}, but burn-dtensor joins MPI launches, not torchrun's rendezvous: each \
                 process would train alone as one of {} copies. Start the program with \
                 `mpirun -n {}` (or `srun --mpi=pmix`), or unset RANK and WORLD_SIZE to run \
                 one process",
                self.size.unwrap_or(0),
                self.size.unwrap_or(0)
            )));
        }
        if self.source == LaunchSource::Slurm && !self.pmi {
            return Err(DTensorError::Spmd(format!(
                "{what}, but srun started it without a PMI server (no PMIX_RANK), so MPI \
                 cannot join the other tasks and each would train alone; start it with `srun \
                 --mpi=pmix` (see `srun --mpi=list`), or with `mpirun` inside the allocation"
            )));
        }
        if !cfg!(feature = "mpi") {
            return Err(DTensorError::Spmd(format!(
                "{what}, but burn-dtensor was built without the `mpi` feature, so it cannot \
                 join the other processes; rebuild with `--features mpi` (needs an MPI library: \
                 `apt-get install openmpi-bin libopenmpi-dev libclang-dev`), or start one \
                 process without the launcher"
            )));
        }
        Ok(())
    }

    /// The error for an MPI world of `got` processes where the environment promised another
    /// size: the process was not started by a launcher MPI can join.
    pub(crate) fn world_mismatch(&self, got: usize) -> DTensorError {
        let hint = match self.source {
            LaunchSource::Slurm => {
                "under Slurm, start MPI programs with `srun --mpi=pmix` (see `srun --mpi=list`) \
                 or with `mpirun` inside the allocation"
            }
            _ => {
                "the variables were set by hand or inherited from another job: start the \
                 program with `mpirun -n N`, or unset them to run one process"
            }
        };
        DTensorError::Spmd(format!(
            "the launch environment ({}: {}) says this process is rank {} of {}, but MPI \
             started a world of {got}: it could not join the others, and would train alone as \
             one of several copies; {hint}",
            self.source,
            self.evidence,
            self.rank,
            self.size.map_or("?".into(), |s| s.to_string())
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> Result<LaunchEnv> {
        LaunchEnv::from_vars(|k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn each_source_in_order() {
        let alone = env(&[]).unwrap();
        assert_eq!(
            (alone.source, alone.rank, alone.size),
            (LaunchSource::Alone, 0, Some(1))
        );
        assert!(!alone.is_multi_process() && alone.joinable().is_ok());

        let ompi = env(&[
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
            // Open MPI under srun also sees Slurm's: Open MPI's come first.
            ("SLURM_PROCID", "0"),
            ("SLURM_STEP_ID", "0"),
            ("PMIX_RANK", "3"),
        ])
        .unwrap();
        assert_eq!(
            (
                ompi.source,
                ompi.rank,
                ompi.size,
                ompi.local_rank,
                ompi.local_size
            ),
            (LaunchSource::OpenMpi, 3, Some(4), 1, Some(2))
        );
        assert!(ompi.evidence.contains("OMPI_COMM_WORLD_SIZE=4"));

        let hydra = env(&[
            ("PMI_RANK", "1"),
            ("PMI_SIZE", "2"),
            ("MPI_LOCALRANKID", "1"),
        ])
        .unwrap();
        assert_eq!(
            (hydra.source, hydra.rank, hydra.size, hydra.local_rank),
            (LaunchSource::Hydra, 1, Some(2), 1)
        );

        let slurm = env(&[
            ("SLURM_PROCID", "2"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_STEP_NUM_TASKS", "4"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_STEP_NODELIST", "n[1-2],n7"),
            ("SLURMD_NODENAME", "n2"),
            ("SLURM_JOB_ID", "77"),
        ])
        .unwrap();
        assert_eq!(
            (slurm.source, slurm.rank, slurm.size, slurm.node.as_str()),
            (LaunchSource::Slurm, 2, Some(4), "n2")
        );
        assert!(slurm.evidence.contains("SLURM_JOB_ID=77"));
        // A batch script's shell (no step): one process.
        let batch = env(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "4")]).unwrap();
        assert_eq!(batch.source, LaunchSource::Alone);

        let pmix = env(&[("PMIX_RANK", "1")]).unwrap();
        assert_eq!((pmix.source, pmix.size), (LaunchSource::Pmix, None));
        assert!(pmix.is_multi_process());

        let torch = env(&[("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "1")]).unwrap();
        assert_eq!(torch.source, LaunchSource::Torchrun);
        let e = torch.joinable().unwrap_err().to_string();
        assert!(
            e.contains("torchrun") && e.contains("WORLD_SIZE=2") && e.contains("mpirun -n 2"),
            "{e}"
        );
        // torchrun with one process is a process alone.
        assert!(
            env(&[("RANK", "0"), ("WORLD_SIZE", "1")])
                .unwrap()
                .joinable()
                .is_ok()
        );
    }

    #[test]
    fn the_gpu_of_each_rank_from_the_launcher() {
        let at = |rank: &str| {
            env(&[
                ("OMPI_COMM_WORLD_RANK", rank),
                ("OMPI_COMM_WORLD_SIZE", "4"),
                (crate::launch::RANK_GPUS_VAR, "0,1,-,3"),
            ])
            .unwrap()
            .gpu
        };
        assert_eq!(
            ["0", "1", "2", "3"].map(at),
            [Some(0), Some(1), None, Some(3)]
        );
        let e = env(&[(crate::launch::RANK_GPUS_VAR, "x")]).unwrap_err();
        assert!(e.to_string().contains("not a GPU index"), "{e}");
    }

    #[test]
    fn bad_values_are_errors() {
        let e = env(&[("OMPI_COMM_WORLD_RANK", "x"), ("OMPI_COMM_WORLD_SIZE", "2")]).unwrap_err();
        assert!(e.to_string().contains("OMPI_COMM_WORLD_RANK=\"x\""), "{e}");
        let e = env(&[("PMI_RANK", "2"), ("PMI_SIZE", "2")]).unwrap_err();
        assert!(e.to_string().contains("rank 2 in a world of 2"), "{e}");
    }

    #[test]
    fn a_launch_the_build_cannot_join() {
        let ompi = env(&[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "2")]).unwrap();
        let joined = ompi.joinable();
        assert_eq!(joined.is_ok(), cfg!(feature = "mpi"), "{joined:?}");
        if let Err(e) = joined {
            assert!(e.to_string().contains("--features mpi"), "{e}");
        }
        let e = ompi.world_mismatch(1).to_string();
        assert!(
            e.contains("rank 0 of 2") && e.contains("world of 1") && e.contains("mpirun -n N"),
            "{e}"
        );
    }
}
