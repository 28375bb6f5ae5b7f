//! Launching an SPMD run from a resource spec file, the AutoDist idea: the cluster (nodes,
//! addresses, devices, chief) is described once in TOML, and the same training program is
//! started on it as one process per device slot, through `mpirun`.
//!
//! ```toml
//! # cluster.toml
//! [[nodes]]
//! address = "10.0.0.1"
//! processes = 4        # CPU: processes on this node (each owns mesh_size / world devices)
//! chief = true         # rank 0 runs here (prints, writes summaries and checkpoints)
//!
//! [[nodes]]
//! address = "10.0.0.2"
//! gpus = [0, 1, 2, 3]  # one process per GPU: the process of local rank i takes gpus[i]
//!
//! [mpi]
//! args = ["--mca", "btl", "self,tcp"]   # extra mpirun arguments (optional)
//!
//! [slurm]                  # only for sbatch / srun (all optional)
//! partition = "gpu"
//! time = "01:00:00"        # Slurm's --time
//! ```
//!
//! On a Slurm cluster the same spec gives a batch script ([`ResourceSpec::slurm_script`]: one
//! job of `--nodes` x `--ntasks-per-node` tasks, `--gres=gpu:N` for GPU nodes, whose `srun
//! --mpi=pmix` starts the program) or an `srun` command for an existing allocation
//! ([`ResourceSpec::srun`]). Slurm chooses the nodes (the addresses are used only with
//! `nodelist = true`) and the GPUs: each process takes the GPU of its local rank among those
//! Slurm makes visible, so `gpus` counts GPUs there.
//!
//! [`ResourceSpec::hostfile`] gives the OpenMPI hostfile (`address slots=n`, the chief first so
//! that it gets rank 0) and [`ResourceSpec::mpirun`] the command. With `gpus`, the command
//! exports [`RANK_GPUS_VAR`]: each rank's GPU, in rank order, which
//! [`LaunchEnv::gpu`](crate::spmd::LaunchEnv::gpu) reads back in the process (the GPU of its
//! local rank on its node).
//!
//! Addresses are host names (letters, digits, `-`, `.`, `_`) or IP literals, compared without
//! regard to case (DNS names are case-insensitive). The processes find their rank
//! and world size in the environment `mpirun` sets ([`crate::spmd::init`]), so `mpirun -n 4
//! program` typed by hand works the same.

use std::path::Path;
use std::process::Command;

use serde::Deserialize;

use crate::error::{DTensorError, Result};

/// One machine of the cluster.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Node {
    /// Host name or IP address `mpirun` reaches it by (ssh for remote nodes).
    pub address: String,
    /// GPU indices on this node: one process per GPU.
    #[serde(default)]
    pub gpus: Vec<usize>,
    /// Processes on this node (CPU runs); with `gpus`, must equal their count when given.
    pub processes: Option<usize>,
    /// Whether rank 0 runs here (at most one node; default: the first).
    #[serde(default)]
    pub chief: bool,
}

impl Node {
    /// Processes started on this node: `processes`, else one per GPU.
    pub fn slots(&self) -> usize {
        self.processes.unwrap_or(self.gpus.len())
    }
}

/// Extra `mpirun` settings.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MpiOptions {
    /// The launcher binary (default `mpirun`).
    pub mpirun: Option<String>,
    /// Extra arguments, before the program.
    #[serde(default)]
    pub args: Vec<String>,
}

/// Settings of the Slurm job ([`ResourceSpec::slurm_script`], [`ResourceSpec::srun`]), each an
/// `sbatch`/`srun` option of the same name.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SlurmOptions {
    /// `--partition`.
    pub partition: Option<String>,
    /// `--time`, the job's time limit in Slurm's forms (`minutes`, `HH:MM:SS`, `D-HH:MM:SS`).
    pub time: Option<String>,
    /// `--job-name` (default `burn-dtensor`).
    pub job_name: Option<String>,
    /// `--account`.
    pub account: Option<String>,
    /// `--output`, the job's output file (default `burn-dtensor-%j.out`, `%j` the job id).
    pub output: Option<String>,
    /// Pin the job to the spec's addresses as Slurm node names (`--nodelist`); by default Slurm
    /// picks the nodes.
    #[serde(default)]
    pub nodelist: bool,
    /// Extra `sbatch` options, one per `#SBATCH` line (`["--mem=16G"]`).
    #[serde(default)]
    pub args: Vec<String>,
}

/// A cluster description: nodes with their addresses and devices, and which one is the chief.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ResourceSpec {
    /// The machines, in rank order (after the chief).
    pub nodes: Vec<Node>,
    /// `mpirun` settings.
    #[serde(default)]
    pub mpi: MpiOptions,
    /// Slurm settings (for `sbatch` / `srun` only).
    #[serde(default)]
    pub slurm: SlurmOptions,
}

/// The variable [`ResourceSpec::mpirun`] exports when nodes list `gpus`: every rank's GPU index,
/// comma-separated in world-rank order, `-` for a rank without one (a CPU node).
pub const RANK_GPUS_VAR: &str = "BURN_DTENSOR_RANK_GPUS";

/// Why `address` cannot be a node address, or `None` when it can: a host name (labels of
/// letters, digits, `-` and `_` joined by `.`, at most 253 characters) or an IPv4/IPv6 literal.
fn bad_address(address: &str) -> Option<String> {
    if address.is_empty() {
        return Some("is empty".into());
    }
    if address.parse::<std::net::IpAddr>().is_ok() {
        return None;
    }
    if let Some(c) = address.chars().find(|c| c.is_whitespace()) {
        return Some(format!(
            "contains white space ({c:?}): give one host name or IP address, and the process \
             count as `processes = N`"
        ));
    }
    let label_ok = |l: &str| {
        !l.is_empty()
            && !l.starts_with('-')
            && l.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    };
    if address.len() > 253 || !address.split('.').all(label_ok) {
        return Some(
            "is neither a host name (letters, digits, `-`, `_`, dot-separated labels) nor an IP \
             address"
                .into(),
        );
    }
    None
}

fn spec_err(path: &str, reason: impl Into<String>) -> DTensorError {
    DTensorError::ResourceSpec {
        path: path.to_string(),
        reason: reason.into(),
    }
}

impl ResourceSpec {
    /// Reads and validates a TOML resource spec.
    ///
    /// # Errors
    /// [`DTensorError::ResourceSpec`] naming the file: unreadable, malformed TOML, unknown keys,
    /// or a spec [`ResourceSpec::validate`] refuses.
    pub fn from_file(path: &Path) -> Result<Self> {
        let p = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| spec_err(&p, format!("cannot read it: {e}")))?;
        Self::parse(&text, &p)
    }

    /// Parses and validates TOML text (`origin` names it in errors).
    ///
    /// # Errors
    /// As [`ResourceSpec::from_file`].
    pub fn parse(text: &str, origin: &str) -> Result<Self> {
        let spec: Self = toml::from_str(text).map_err(|e| spec_err(origin, e.to_string()))?;
        spec.validate(origin)?;
        Ok(spec)
    }

    /// Checks the spec: at least one node; every address a host name or IP literal; every node
    /// with at least one process and, when it gives both, as many processes as GPUs; distinct
    /// addresses (ignoring case); at most one chief; no loopback address in a spec of several
    /// nodes (the other nodes could not reach it); at most `i32::MAX` processes in all (MPI
    /// numbers ranks with a C `int`).
    ///
    /// # Errors
    /// [`DTensorError::ResourceSpec`] saying which node and what to change.
    pub fn validate(&self, origin: &str) -> Result<()> {
        if self.nodes.is_empty() {
            return Err(spec_err(
                origin,
                "no [[nodes]]: describe at least one machine",
            ));
        }
        for (i, n) in self.nodes.iter().enumerate() {
            if let Some(why) = bad_address(&n.address) {
                return Err(spec_err(
                    origin,
                    format!("node {i}: the address `{}` {why}", n.address),
                ));
            }
            if n.slots() == 0 {
                return Err(spec_err(
                    origin,
                    format!(
                        "node {i} (`{}`) has no processes: give `processes = N` or `gpus = [..]`",
                        n.address
                    ),
                ));
            }
            if let Some(p) = n.processes
                && !n.gpus.is_empty()
                && p != n.gpus.len()
            {
                return Err(spec_err(
                    origin,
                    format!(
                        "node {i} (`{}`) has {p} processes for {} GPUs: one process per GPU",
                        n.address,
                        n.gpus.len()
                    ),
                ));
            }
            if let Some(j) = self.nodes[..i]
                .iter()
                .position(|m| m.address.eq_ignore_ascii_case(&n.address))
            {
                return Err(spec_err(
                    origin,
                    format!(
                        "nodes {j} and {i} have the same address `{}`: list each machine once",
                        n.address
                    ),
                ));
            }
            let loopback = n.address.eq_ignore_ascii_case("localhost")
                || n.address.starts_with("127.")
                || n.address == "::1";
            if loopback && self.nodes.len() > 1 {
                return Err(spec_err(
                    origin,
                    format!(
                        "node {i} has the loopback address `{}` in a spec of {} nodes: give an address the other nodes can reach",
                        n.address,
                        self.nodes.len()
                    ),
                ));
            }
        }
        // MPI numbers a world's ranks with a C `int`.
        let world = self
            .nodes
            .iter()
            .try_fold(0usize, |sum, n| sum.checked_add(n.slots()))
            .filter(|&w| w <= i32::MAX as usize);
        if world.is_none() {
            return Err(spec_err(
                origin,
                format!(
                    "the nodes start {} processes in all, more than the {} ranks an MPI world \
                     can number: is a `processes` mistyped?",
                    self.nodes.iter().map(|n| n.slots() as u128).sum::<u128>(),
                    i32::MAX
                ),
            ));
        }
        let chiefs: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| self.nodes[i].chief)
            .collect();
        if chiefs.len() > 1 {
            return Err(spec_err(
                origin,
                format!("nodes {chiefs:?} are all marked chief: mark one"),
            ));
        }
        Ok(())
    }

    /// Processes in the run (the sum of every node's slots; at most `i32::MAX` in a spec that
    /// passed [`ResourceSpec::validate`], saturating at `usize::MAX` in one that did not).
    pub fn world_size(&self) -> usize {
        self.nodes
            .iter()
            .fold(0usize, |sum, n| sum.saturating_add(n.slots()))
    }

    /// The nodes in rank order: the chief (or the first node) first.
    pub fn ranked_nodes(&self) -> Vec<&Node> {
        let chief = self.nodes.iter().position(|n| n.chief).unwrap_or(0);
        std::iter::once(&self.nodes[chief])
            .chain(
                self.nodes
                    .iter()
                    .enumerate()
                    .filter(|&(i, _)| i != chief)
                    .map(|(_, n)| n),
            )
            .collect()
    }

    /// The OpenMPI hostfile: `address slots=n` per node, the chief first (rank 0 runs there with
    /// mpirun's default by-slot mapping).
    pub fn hostfile(&self) -> String {
        self.ranked_nodes()
            .iter()
            .map(|n| format!("{} slots={}\n", n.address, n.slots()))
            .collect()
    }

    /// Every rank's GPU in world-rank order (the value of [`RANK_GPUS_VAR`]), `None` when no
    /// node lists GPUs. Ranks fill the nodes in [`ResourceSpec::ranked_nodes`] order, slot by
    /// slot (mpirun's default mapping), so rank `r` on a node is that node's local rank `i`
    /// and takes `gpus[i]`.
    pub fn rank_gpus(&self) -> Option<String> {
        if self.nodes.iter().all(|n| n.gpus.is_empty()) {
            return None;
        }
        let per_rank: Vec<String> = self
            .ranked_nodes()
            .iter()
            .flat_map(|n| {
                (0..n.slots()).map(|i| n.gpus.get(i).map_or("-".into(), |g| g.to_string()))
            })
            .collect();
        Some(per_rank.join(","))
    }

    /// The `mpirun` command that starts `program args..` on every slot, with `hostfile` (the
    /// text of [`ResourceSpec::hostfile`] written to a file) and the spec's extra arguments,
    /// exporting [`RANK_GPUS_VAR`] when nodes list GPUs. Adds `--allow-run-as-root` when
    /// running as root. With `cpus_per_process`, binds each process to that many cores
    /// (`--map-by slot:PE=n --bind-to core`).
    pub fn mpirun(
        &self,
        hostfile: &Path,
        cpus_per_process: Option<usize>,
        program: &str,
        args: &[String],
    ) -> Command {
        let mut c = Command::new(self.mpi.mpirun.as_deref().unwrap_or("mpirun"));
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            c.arg("--allow-run-as-root");
        }
        c.arg("--hostfile")
            .arg(hostfile)
            .args(["-np", &self.world_size().to_string()]);
        if let Some(n) = cpus_per_process {
            c.args(["--map-by", &format!("slot:PE={n}"), "--bind-to", "core"]);
        }
        if let Some(g) = self.rank_gpus() {
            c.args(["-x", &format!("{RANK_GPUS_VAR}={g}")]);
        }
        c.args(&self.mpi.args).arg(program).args(args);
        c
    }

    /// The Slurm resource options of the spec, as `sbatch`/`srun` take them: `--nodes`,
    /// `--ntasks-per-node` (every node's slots), `--gres=gpu:N` when nodes list GPUs,
    /// `--cpus-per-task` with `cpus_per_process`, then the `[slurm]` settings.
    ///
    /// # Errors
    /// [`DTensorError::ResourceSpec`] when nodes differ in process or GPU count (one Slurm job
    /// step gives every node the same count).
    pub fn slurm_options(&self, cpus_per_process: Option<usize>) -> Result<Vec<String>> {
        let first = &self.nodes[0];
        if let Some((i, n)) = self
            .nodes
            .iter()
            .enumerate()
            .find(|(_, n)| n.slots() != first.slots() || n.gpus.len() != first.gpus.len())
        {
            return Err(spec_err(
                "<spec>",
                format!(
                    "node {i} (`{}`) has {} processes and {} GPUs, node 0 (`{}`) {} and {}: a \
                     Slurm job gives every node the same task and GPU count, so make the nodes \
                     equal (or write a heterogeneous job by hand)",
                    n.address,
                    n.slots(),
                    n.gpus.len(),
                    first.address,
                    first.slots(),
                    first.gpus.len()
                ),
            ));
        }
        let o = &self.slurm;
        let mut v = vec![
            format!("--nodes={}", self.nodes.len()),
            format!("--ntasks-per-node={}", first.slots()),
        ];
        if !first.gpus.is_empty() {
            v.push(format!("--gres=gpu:{}", first.gpus.len()));
        }
        if let Some(n) = cpus_per_process {
            v.push(format!("--cpus-per-task={n}"));
        }
        if o.nodelist {
            let names: Vec<&str> = self
                .ranked_nodes()
                .iter()
                .map(|n| n.address.as_str())
                .collect();
            v.push(format!("--nodelist={}", names.join(",")));
        }
        for (flag, value) in [
            ("partition", &o.partition),
            ("time", &o.time),
            ("account", &o.account),
        ] {
            if let Some(x) = value {
                v.push(format!("--{flag}={x}"));
            }
        }
        Ok(v)
    }

    /// The `srun` command that starts `program args..` as one job step over the spec's
    /// resources ([`ResourceSpec::slurm_options`]), MPI joining through PMIx (`--mpi=pmix`),
    /// each process bound to its cores with `cpus_per_process`. Inside an allocation (`salloc`,
    /// a batch script) the step runs there; elsewhere `srun` makes its own job.
    ///
    /// # Errors
    /// As [`ResourceSpec::slurm_options`].
    pub fn srun(
        &self,
        cpus_per_process: Option<usize>,
        program: &str,
        args: &[String],
    ) -> Result<Command> {
        let mut c = Command::new("srun");
        c.arg("--mpi=pmix")
            .args(self.slurm_options(cpus_per_process)?);
        if cpus_per_process.is_some() {
            c.arg("--cpu-bind=cores");
        }
        c.arg(program).args(args);
        Ok(c)
    }

    /// A batch script for `sbatch`: `#SBATCH` lines for the spec's resources
    /// ([`ResourceSpec::slurm_options`]), the job name and output file, the `[slurm] args`, then
    /// `srun --mpi=pmix program args..` (arguments quoted for the shell), which starts one
    /// process per task; `sbatch` prints the job id and the run's output goes to the output file.
    ///
    /// # Errors
    /// As [`ResourceSpec::slurm_options`]; [`DTensorError::ResourceSpec`] for an argument the
    /// shell cannot quote (a NUL byte).
    pub fn slurm_script(
        &self,
        cpus_per_process: Option<usize>,
        program: &str,
        args: &[String],
    ) -> Result<String> {
        let o = &self.slurm;
        let mut lines = vec![
            "#!/bin/bash".to_string(),
            "# Written by burn-dtensor's `launch --slurm-script` from a resource spec.".into(),
            format!(
                "#SBATCH --job-name={}",
                o.job_name.as_deref().unwrap_or("burn-dtensor")
            ),
            format!(
                "#SBATCH --output={}",
                o.output.as_deref().unwrap_or("burn-dtensor-%j.out")
            ),
        ];
        for opt in self.slurm_options(cpus_per_process)?.iter().chain(&o.args) {
            lines.push(format!("#SBATCH {opt}"));
        }
        let mut step = vec!["srun".to_string(), "--mpi=pmix".into()];
        if cpus_per_process.is_some() {
            step.push("--cpu-bind=cores".into());
        }
        step.push(program.to_string());
        step.extend(args.iter().cloned());
        lines.push(shell_line(step.iter().map(String::as_str))?);
        Ok(lines.join("\n") + "\n")
    }
}

/// `words` as one POSIX shell line: words of letters, digits and `-_./=:,+@%` as they are, any
/// other quoted by `shlex` (so `--mpi=pmix` stays readable and `a b` becomes `'a b'`).
///
/// # Errors
/// [`DTensorError::ResourceSpec`] for a word with a NUL byte.
pub fn shell_line<'a>(words: impl IntoIterator<Item = &'a str>) -> Result<String> {
    let plain = |w: &str| {
        !w.is_empty()
            && w.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
    };
    let quoted: Result<Vec<String>> = words
        .into_iter()
        .map(|w| {
            if plain(w) {
                Ok(w.to_string())
            } else {
                shlex::try_quote(w)
                    .map(|q| q.into_owned())
                    .map_err(|e| spec_err("<command>", format!("cannot quote `{w}`: {e}")))
            }
        })
        .collect();
    Ok(quoted?.join(" "))
}

/// `command` as one shell line (program and arguments quoted as [`shell_line`] does), for
/// printing what a launcher runs.
pub fn command_line(command: &Command) -> String {
    let words: Vec<String> = std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(|w| w.to_string_lossy().into_owned())
        .collect();
    shell_line(words.iter().map(String::as_str)).unwrap_or_else(|_| format!("{command:?}"))
}
