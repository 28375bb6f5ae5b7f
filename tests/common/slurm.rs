//! A real single-node Slurm cluster for the tests, started from Debian's packages (`munge`,
//! `slurmctld`, `slurmd`, `slurm-client`): a munge daemon with its own key and socket, and the
//! controller and node daemon with a `slurm.conf` generated in a temporary directory (this host
//! as the one node at 127.0.0.1, ports picked free, `proctrack/pgid` and `task/affinity`, no
//! cgroups, no accounting), stopped and removed on drop. Clients find it through `SLURM_CONF`
//! ([`SlurmCluster::command`]).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The variable that turns "Slurm cannot run here" from a skip into a failure (CI sets it).
pub const REQUIRE_VAR: &str = "BURN_DTENSOR_REQUIRE_SLURM";

/// A running single-node cluster.
pub struct SlurmCluster {
    /// The temporary directory: configuration, state, logs, the munge key and socket.
    pub dir: PathBuf,
    conf: PathBuf,
    /// The node's name (this host's short name, as `slurmd` reports it).
    pub node: String,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn run(c: &mut Command) -> Result<String, String> {
    let o = c
        .output()
        .map_err(|e| format!("cannot start {:?}: {e}", c.get_program()))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    if o.status.success() {
        Ok(text)
    } else {
        Err(format!("{c:?} failed ({}): {text}", o.status))
    }
}

fn tail(path: &Path) -> String {
    std::fs::read_to_string(path)
        .map(|t| {
            t.lines()
                .rev()
                .take(15)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_else(|e| format!("({}: {e})", path.display()))
}

impl SlurmCluster {
    /// Starts the cluster, or says precisely why it cannot (not root, a daemon missing, a daemon
    /// that does not come up: with its log).
    pub fn start() -> Result<Self, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("slurmd must run as root to start jobs; run the tests as root".into());
        }
        for bin in [
            "munged",
            "slurmctld",
            "slurmd",
            "srun",
            "sbatch",
            "sinfo",
            "scontrol",
        ] {
            if Command::new("sh")
                .args(["-c", &format!("command -v {bin}")])
                .output()
                .map_or(true, |o| !o.status.success())
            {
                return Err(format!(
                    "`{bin}` not found: apt-get install munge slurmctld slurmd slurm-client"
                ));
            }
        }
        let dir = std::env::temp_dir().join(format!("dtensor-slurm-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let munge = dir.join("munge");
        for d in [&munge, &dir.join("state"), &dir.join("spool")] {
            std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
        }
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&munge, std::fs::Permissions::from_mode(0o700)).unwrap();
        let key = munge.join("munge.key");
        let mut bytes = vec![0u8; 1024];
        std::io::Read::read_exact(
            &mut std::fs::File::open("/dev/urandom").map_err(|e| format!("/dev/urandom: {e}"))?,
            &mut bytes,
        )
        .map_err(|e| format!("/dev/urandom: {e}"))?;
        std::fs::write(&key, &bytes).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o400)).unwrap();
        let socket = munge.join("socket");
        run(Command::new("munged")
            .arg("--force")
            .arg(format!("--socket={}", socket.display()))
            .arg(format!("--key-file={}", key.display()))
            .arg(format!("--log-file={}", munge.join("log").display()))
            .arg(format!("--pid-file={}", munge.join("pid").display()))
            .arg(format!("--seed-file={}", munge.join("seed").display())))?;
        let node = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| {
                h.trim()
                    .split('.')
                    .next()
                    .unwrap_or("localhost")
                    .to_string()
            })
            .unwrap_or_else(|_| "localhost".into());
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let d = dir.display();
        let conf = dir.join("slurm.conf");
        std::fs::write(
            &conf,
            format!(
                "ClusterName=dtensor-test\n\
                 SlurmctldHost={node}(127.0.0.1)\n\
                 SlurmctldPort={ctld}\n\
                 SlurmdPort={slurmd}\n\
                 AuthType=auth/munge\n\
                 AuthInfo=socket={socket}\n\
                 CredType=cred/munge\n\
                 SlurmUser=root\n\
                 SlurmdUser=root\n\
                 StateSaveLocation={d}/state\n\
                 SlurmdSpoolDir={d}/spool\n\
                 SlurmctldPidFile={d}/slurmctld.pid\n\
                 SlurmdPidFile={d}/slurmd.pid\n\
                 SlurmctldLogFile={d}/slurmctld.log\n\
                 SlurmdLogFile={d}/slurmd.log\n\
                 ProctrackType=proctrack/pgid\n\
                 TaskPlugin=task/affinity\n\
                 SelectType=select/cons_tres\n\
                 SelectTypeParameters=CR_Core\n\
                 MpiDefault=none\n\
                 ReturnToService=2\n\
                 JobAcctGatherType=jobacct_gather/none\n\
                 AccountingStorageType=accounting_storage/none\n\
                 NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN\n\
                 PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n",
                ctld = free_port(),
                slurmd = free_port(),
                socket = socket.display(),
            ),
        )
        .unwrap();
        let cluster = Self { dir, conf, node };
        // Both daemonise once they have read the configuration.
        run(cluster.command("slurmctld").arg("-i")).map_err(|e| {
            format!(
                "{e}\nslurmctld.log:\n{}",
                tail(&cluster.dir.join("slurmctld.log"))
            )
        })?;
        run(cluster.command("slurmd").arg("-N").arg(&cluster.node)).map_err(|e| {
            format!(
                "{e}\nslurmd.log:\n{}",
                tail(&cluster.dir.join("slurmd.log"))
            )
        })?;
        let start = Instant::now();
        loop {
            let state = run(cluster.command("sinfo").args(["-h", "-o", "%t"])).unwrap_or_default();
            if state.trim() == "idle" {
                return Ok(cluster);
            }
            if start.elapsed() > Duration::from_secs(30) {
                return Err(format!(
                    "the node is `{}` after 30 s, not idle\nslurmctld.log:\n{}\nslurmd.log:\n{}",
                    state.trim(),
                    tail(&cluster.dir.join("slurmctld.log")),
                    tail(&cluster.dir.join("slurmd.log"))
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `program` (a daemon or client such as `srun`, `sbatch`) pointed at this cluster
    /// (`SLURM_CONF`; the daemons also get `-f`).
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.env("SLURM_CONF", &self.conf);
        if program == "slurmctld" || program == "slurmd" {
            c.arg("-f").arg(&self.conf);
        }
        c
    }

    /// The daemons' logs (for a failing test's message).
    pub fn logs(&self) -> String {
        format!(
            "slurmctld.log:\n{}\nslurmd.log:\n{}",
            tail(&self.dir.join("slurmctld.log")),
            tail(&self.dir.join("slurmd.log"))
        )
    }
}

fn kill_pid_file(path: &Path) {
    if let Some(pid) = std::fs::read_to_string(path)
        .ok()
        .and_then(|p| p.trim().parse::<i32>().ok())
    {
        // SAFETY: kill has no memory preconditions.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

impl Drop for SlurmCluster {
    fn drop(&mut self) {
        let _ = self.command("scontrol").arg("shutdown").output();
        std::thread::sleep(Duration::from_millis(500));
        for f in ["slurmctld.pid", "slurmd.pid", "munge/pid"] {
            kill_pid_file(&self.dir.join(f));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The cluster, or `None` after printing why it cannot run here; panics instead where
/// [`REQUIRE_VAR`] is `1`.
pub fn cluster() -> Option<SlurmCluster> {
    match SlurmCluster::start() {
        Ok(c) => Some(c),
        Err(why) => {
            let require = std::env::var(REQUIRE_VAR).is_ok_and(|v| v == "1");
            assert!(!require, "Slurm cannot run here ({REQUIRE_VAR}=1): {why}");
            println!("skipped: Slurm cannot run here: {why}");
            None
        }
    }
}
