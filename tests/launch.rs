//! The resource-spec launcher: typed errors for bad specs, the hostfile, and a real two-process
//! run of `imdb_mlp` started by `examples/launch.rs` from a spec of one localhost node.

mod common;
#[path = "common/mpi.rs"]
mod mpi;
#[path = "common/ompi.rs"]
mod ompi;
#[path = "common/slurm.rs"]
mod slurm;

use std::path::PathBuf;
use std::process::Command;

use burn_dtensor::DTensorError;
use burn_dtensor::launch::ResourceSpec;

fn refused(text: &str, needle: &str) {
    match ResourceSpec::parse(text, "test.toml") {
        Err(e @ DTensorError::ResourceSpec { .. }) => {
            let m = e.to_string();
            assert!(m.contains(needle) && m.contains("test.toml"), "{m}");
        }
        other => panic!("expected a ResourceSpec error containing `{needle}`, got {other:?}"),
    }
}

#[test]
fn bad_specs_get_typed_errors_saying_what_to_fix() {
    refused("", "missing field `nodes`");
    refused("nodes = []", "no [[nodes]]");
    refused("[[nodes]]\naddress = \"a\"\n", "has no processes");
    refused(
        "[[nodes]]\naddress = \"a\"\ngpus = [0, 1]\nprocesses = 3\n",
        "3 processes for 2 GPUs",
    );
    refused(
        "[[nodes]]\naddress = \"a\"\nprocesses = 1\n[[nodes]]\naddress = \"a\"\nprocesses = 1\n",
        "same address `a`",
    );
    refused(
        "[[nodes]]\naddress = \"localhost\"\nprocesses = 1\n[[nodes]]\naddress = \"b\"\nprocesses = 1\n",
        "loopback address",
    );
    refused(
        "[[nodes]]\naddress = \"a\"\nprocesses = 1\nchief = true\n[[nodes]]\naddress = \"b\"\nprocesses = 1\nchief = true\n",
        "all marked chief",
    );
    // More processes than an MPI world can number (a C `int`), in one node or summed over
    // three whose sum overflows `usize` (a panic, or a wrapped `-np`, before).
    refused(
        "[[nodes]]\naddress = \"a\"\nprocesses = 2147483648\n",
        "2147483648 processes in all, more than the 2147483647 ranks",
    );
    let huge = (0..3)
        .map(|i| format!("[[nodes]]\naddress = \"n{i}\"\nprocesses = {}\n", i64::MAX))
        .collect::<String>();
    refused(&huge, "27670116110564327421 processes in all");
    ResourceSpec::parse(
        "[[nodes]]\naddress = \"a\"\nprocesses = 2147483647\n",
        "test.toml",
    )
    .expect("a world of i32::MAX ranks is a valid spec");
    refused(
        "[[nodes]]\naddress = \"a\"\nprocesses = 1\ncpu = 2\n",
        "unknown field `cpu`",
    );
    // Addresses: not empty, no white space (an `address = "a slots=99"` would reach the
    // hostfile verbatim), host names or IP literals, compared without regard to case.
    refused(
        "[[nodes]]\naddress = \"\"\nprocesses = 2\n",
        "the address `` is empty",
    );
    refused(
        "[[nodes]]\naddress = \"a.example slots=99\"\nprocesses = 2\n",
        "contains white space",
    );
    refused(
        "[[nodes]]\naddress = \"a/b\"\nprocesses = 2\n",
        "neither a host name",
    );
    refused(
        "[[nodes]]\naddress = \"A.EXAMPLE\"\nprocesses = 1\n[[nodes]]\naddress = \"a.example\"\nprocesses = 1\n",
        "nodes 0 and 1 have the same address `a.example`",
    );
    refused(
        "[[nodes]]\naddress = \"LocalHost\"\nprocesses = 1\n[[nodes]]\naddress = \"b\"\nprocesses = 1\n",
        "loopback address",
    );
    for ok in ["node-1.cluster.local", "10.1.2.3", "fe80::1", "gpu_07"] {
        ResourceSpec::parse(
            &format!("[[nodes]]\naddress = \"{ok}\"\nprocesses = 1\n"),
            "t",
        )
        .unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
    let e = ResourceSpec::from_file(std::path::Path::new("/nonexistent/cluster.toml")).unwrap_err();
    assert!(e.to_string().contains("cannot read it"), "{e}");
}

#[test]
fn the_chief_gets_rank_0_in_the_hostfile() {
    let s = ResourceSpec::parse(
        "[[nodes]]\naddress = \"10.0.0.1\"\nprocesses = 2\n\
         [[nodes]]\naddress = \"10.0.0.2\"\ngpus = [0, 1, 2]\nchief = true\n\
         [mpi]\nargs = [\"--mca\", \"btl\", \"self,tcp\"]\n",
        "t",
    )
    .unwrap();
    assert_eq!(s.world_size(), 5);
    assert_eq!(s.hostfile(), "10.0.0.2 slots=3\n10.0.0.1 slots=2\n");
    let cmd = format!(
        "{:?}",
        s.mpirun(
            std::path::Path::new("/tmp/h"),
            None,
            "prog",
            &["--x".into()]
        )
    );
    assert!(
        cmd.contains("\"--hostfile\" \"/tmp/h\" \"-np\" \"5\" \"-x\" \"BURN_DTENSOR_RANK_GPUS=0,1,2,-,-\" \"--mca\" \"btl\" \"self,tcp\" \"prog\" \"--x\""),
        "{cmd}"
    );
}

/// Each rank's GPU is its node's `gpus[local rank]`: exported in rank order (chief first) by
/// the command, read back by `LaunchEnv::gpu` in every rank.
#[test]
fn each_rank_takes_the_gpu_of_its_local_rank() {
    let s = ResourceSpec::parse(
        "[[nodes]]\naddress = \"cpu1\"\nprocesses = 2\n\
         [[nodes]]\naddress = \"gpu1\"\ngpus = [2, 3]\nchief = true\n",
        "t",
    )
    .unwrap();
    assert_eq!(s.rank_gpus().as_deref(), Some("2,3,-,-"));
    let cmd = format!(
        "{:?}",
        s.mpirun(std::path::Path::new("/h"), None, "prog", &[])
    );
    assert!(
        cmd.contains("\"-x\" \"BURN_DTENSOR_RANK_GPUS=2,3,-,-\""),
        "{cmd}"
    );
    let gpus = s.rank_gpus().unwrap();
    let seen: Vec<Option<usize>> = (0..s.world_size())
        .map(|r| {
            let vars = [
                ("OMPI_COMM_WORLD_RANK", r.to_string()),
                ("OMPI_COMM_WORLD_SIZE", s.world_size().to_string()),
                (burn_dtensor::launch::RANK_GPUS_VAR, gpus.clone()),
            ];
            burn_dtensor::spmd::LaunchEnv::from_vars(|k| {
                vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
            })
            .unwrap()
            .gpu
        })
        .collect();
    assert_eq!(seen, [Some(2), Some(3), None, None]);
    // CPU-only specs export nothing.
    let cpu = ResourceSpec::parse("[[nodes]]\naddress = \"a\"\nprocesses = 2\n", "t").unwrap();
    assert_eq!(cpu.rank_gpus(), None);
    assert!(
        !format!(
            "{:?}",
            cpu.mpirun(std::path::Path::new("/h"), None, "p", &[])
        )
        .contains("-x")
    );
}

/// `launch --dry-run` prints the hostfile and the command and writes nothing: the temporary
/// directory it would use stays empty.
#[test]
fn dry_run_leaves_nothing_behind() {
    let launch = example("launch");
    let dir = std::env::temp_dir().join(format!("launch-dry-{}", std::process::id()));
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let spec = dir.join("c.toml");
    std::fs::write(
        &spec,
        "[[nodes]]\naddress = \"n1\"\nprocesses = 2\n[[nodes]]\naddress = \"n2\"\nprocesses = 2\n",
    )
    .unwrap();
    let o = Command::new(&launch)
        .arg("--spec")
        .arg(&spec)
        .arg("--dry-run")
        .args(["--", "prog", "--mode", "data"])
        .env("TMPDIR", &tmp)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{text}");
    assert!(
        text.contains("n1 slots=2\nn2 slots=2\n")
            && text.contains(" -np 4 prog --mode data\n")
            && text.contains(
                "# the same run in a Slurm allocation: srun --mpi=pmix --nodes=2 \
                 --ntasks-per-node=2 prog --mode data\n"
            ),
        "{text}"
    );
    let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().collect();
    assert!(left.is_empty(), "--dry-run left {left:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The examples' `main`s, built as the package's binaries of the same names (`cargo test
/// --all-targets` builds examples only in test mode).
fn example(name: &str) -> PathBuf {
    PathBuf::from(match name {
        "launch" => env!("CARGO_BIN_EXE_launch"),
        "imdb_mlp" => env!("CARGO_BIN_EXE_imdb_mlp"),
        other => panic!("no binary target {other}"),
    })
}

/// `launch --spec local.toml -- imdb_mlp ...` runs two processes: rank 0's summary says so.
#[test]
fn launch_runs_imdb_mlp_on_a_localhost_spec() {
    let Some(data) = mpi::archive_and_mpi() else {
        return;
    };
    let (launch, imdb) = (example("launch"), example("imdb_mlp"));
    let dir = std::env::temp_dir().join(format!("launch-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let spec = dir.join("local.toml");
    std::fs::write(
        &spec,
        "[[nodes]]\naddress = \"localhost\"\nprocesses = 2\nchief = true\n\
         [mpi]\nargs = [\"--oversubscribe\"]\n",
    )
    .unwrap();
    let out = dir.join("s.json");
    let (ok, text) = output_of(
        ompi::own_session_dir(&mut Command::new("timeout"))
            .arg("300")
            .arg(&launch)
            .arg("--spec")
            .arg(&spec)
            .arg("--")
            .arg(&imdb)
            .args([
                "--mode",
                "data",
                "--epochs",
                "1",
                "--max-steps",
                "5",
                "--no-eval",
            ])
            .arg("--data")
            .arg(&data)
            .arg("--summary-json")
            .arg(&out),
    );
    assert!(ok, "{text}");
    assert!(
        text.contains("launching 2 processes on 1 node(s)"),
        "{text}"
    );
    // What a user reads is printed once, by rank 0, without terminal escapes (a rank's stdout
    // is a pseudo-terminal under mpirun even when the job's output is a file).
    for line in [
        "loading ",
        " reviews vectorised",
        "mesh [batch=8] over 2 processes (mpi) x 4 virtual ndarray devices each",
        "epoch 1: train loss",
        "  communication of one step: ",
        "done: mode Data",
    ] {
        assert_eq!(text.matches(line).count(), 1, "`{line}`:\n{text}");
    }
    assert!(
        text.contains("in process, ") && text.contains(" across processes)"),
        "the communication line splits bytes by link:\n{text}"
    );
    assert!(!text.contains('\u{1b}'), "escape sequences in:\n{text}");
    let s: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(s["world_size"], 2, "{s}");
    assert_eq!(s["train_losses"].as_array().unwrap().len(), 5);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `mpirun` over `-np 1 PROGRAM ARGS` blocks, one per rank (MPMD syntax), so that each rank can
/// get its own flags and environment; Open MPI's transports `btl` (`--mca btl`, e.g.
/// `self,vader,tcp`); 60 s collective timeout.
fn mpirun_ranks(btl: &str, ranks: &[Vec<String>]) -> Command {
    let mut c = Command::new("timeout");
    ompi::own_session_dir(&mut c);
    c.args(["300", "mpirun", "--allow-run-as-root", "--oversubscribe"])
        .args(["--mca", "btl", btl])
        .env("BURN_DTENSOR_COLLECTIVE_TIMEOUT_S", "60");
    for (i, r) in ranks.iter().enumerate() {
        if i > 0 {
            c.arg(":");
        }
        c.args(["-np", "1"]).args(r);
    }
    c
}

/// Runs `c`, returning (exit status, output, seconds from the first line containing `mark` to
/// the end of the job, or the whole run if no line has it).
fn run_timed(mut c: Command, mark: &str) -> (i32, String, f64) {
    use std::io::{BufRead, BufReader};
    use std::time::Instant;
    let mut child = c
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let read = |r: Box<dyn std::io::Read + Send>, mark: String| {
        std::thread::spawn(move || {
            let mut seen = None;
            let mut text = String::new();
            for line in BufReader::new(r).lines().map_while(Result::ok) {
                if seen.is_none() && line.contains(&mark) {
                    seen = Some(Instant::now());
                }
                text += &line;
                text.push('\n');
            }
            (text, seen)
        })
    };
    let out = read(Box::new(child.stdout.take().unwrap()), mark.to_string());
    let err = read(Box::new(child.stderr.take().unwrap()), mark.to_string());
    let status = child.wait().unwrap();
    let end = Instant::now();
    let (o, so) = out.join().unwrap();
    let (e, se) = err.join().unwrap();
    let from = [so, se].into_iter().flatten().min().unwrap_or(start);
    (
        status.code().unwrap_or(-1),
        format!("{o}{e}"),
        (end - from).as_secs_f64(),
    )
}

fn imdb_flags(data: &std::path::Path, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = ["--mode", "data", "--max-steps", "5", "--no-eval", "--data"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    v.push(data.display().to_string());
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

/// A write that fails on one rank after start-up ends the whole job within seconds, every rank
/// stopped, with a message naming that rank and its error (the collective timeout is 60 s:
/// before, rank 0 blocked in MPI_Finalize and rank 1 trained on until that timeout blamed a
/// hung step). The failure is real: rank 0 runs with a 16 KiB file-size limit (`ulimit -f`,
/// SIGXFSZ ignored), so writing its first checkpoint (230 KB) fails with EFBIG while rank 1
/// goes on to epoch 2.
#[test]
fn a_failed_write_on_one_rank_ends_the_job_at_once_naming_it() {
    let Some(data) = mpi::archive_and_mpi() else {
        return;
    };
    let imdb = example("imdb_mlp");
    let dir = std::env::temp_dir().join(format!("launch-fault-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let flags = imdb_flags(
        &data,
        &[
            "--epochs",
            "3",
            "--checkpoint-dir",
            dir.join("ckpt").to_str().unwrap(),
        ],
    );
    let limited = "trap '' XFSZ; ulimit -f 16; exec \"$0\" \"$@\"".to_string();
    let mut rank0 = vec![
        "sh".to_string(),
        "-c".into(),
        limited,
        imdb.display().to_string(),
    ];
    rank0.extend(flags.iter().cloned());
    let mut rank1 = vec![imdb.display().to_string()];
    rank1.extend(flags);
    let (code, text, secs) = run_timed(
        // TCP between the ranks: Open MPI's shared-memory transport sizes its segment with
        // ftruncate, which the file-size limit refuses too (EFBIG at MPI_Init, 2 s more start-up
        // and a degraded transport on rank 0); the fault under test is the checkpoint's alone.
        mpirun_ranks("self,tcp", &[rank0, rank1]),
        "burn-dtensor [rank 0",
    );
    println!("failed write on rank 0: exit {code}, the job ended {secs:.2} s after the error");
    assert_ne!(code, 0, "{text}");
    assert!(
        text.contains("burn-dtensor [rank 0 of 2")
            && text.contains("File too large")
            && text.contains("checkpoint"),
        "{text}"
    );
    assert!(
        !text.contains("did not complete within"),
        "the peer timed out instead of ending with the failing rank:\n{text}"
    );
    // The bound tells the two endings apart: the failing rank's abort (0.01-0.05 s on the
    // development VM; one CI run took 10 s) against the peer's collective timeout (60 s).
    assert!(
        secs < 30.0,
        "ended {secs:.1} s after the error, as if by the 60 s collective timeout:\n{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every setting that shapes the communication, made to differ on one rank, stops the job at
/// start-up with an error naming the setting and both values (before: the backend and the
/// reduction passed, then MPI_ERR_TRUNCATE; the training flags gave a truncated Debug string).
#[test]
fn processes_that_differ_are_told_which_setting() {
    let Some(data) = mpi::archive_and_mpi() else {
        return;
    };
    let imdb = example("imdb_mlp");
    let base = imdb_flags(&data, &["--epochs", "1"]);
    let with = |extra: &[&str]| -> Vec<String> {
        let mut v = vec![imdb.display().to_string()];
        v.extend(base.iter().cloned());
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let env_on = |var: &str, extra: &[&str]| -> Vec<String> {
        let mut v = vec!["env".to_string(), var.to_string()];
        v.extend(with(extra));
        v
    };
    let map = std::env::temp_dir().join(format!("launch-map-{}.toml", std::process::id()));
    std::fs::write(&map, "'^dense1\\.weight$' = [\"unsharded\", \"batch\"]\n").unwrap();
    // (setting, rank 1's command, what the error names, rank 1's value, rank 0's value): the
    // message is either rank's (the first to see it ends the job), so it is checked both ways.
    let cases: Vec<(&str, Vec<String>, &str, &str, &str)> = vec![
        (
            "backend",
            with(&["--backend", "flex"]),
            "(`--backend`)",
            "flex",
            "ndarray",
        ),
        (
            "reduction",
            env_on("BURN_DTENSOR_SPMD_REDUCTION=engine", &[]),
            "mesh (`reduction`)",
            "Engine",
            "Ordered",
        ),
        (
            "mesh",
            with(&["--mesh", "batch=4,model=2"]),
            "(`mesh axes`)",
            "batch=4,model=2",
            "batch=8",
        ),
        (
            "layout map",
            with(&["--layout-map", map.to_str().unwrap()]),
            "layout map",
            "unsharded",
            "[]",
        ),
        ("seed", with(&["--seed", "7"]), "(`--seed`)", "7", "42"),
        (
            "learning rate",
            with(&["--lr", "0.01"]),
            "(`--lr`)",
            "0.01",
            "0.001",
        ),
        (
            "optimizer",
            with(&["--optimizer", "sgd", "--lr", "0.001"]),
            "(`--optimizer`)",
            "sgd",
            "adam",
        ),
        (
            "batch size",
            with(&["--batch-size", "32"]),
            "(`--batch-size`)",
            "32",
            "64",
        ),
    ];
    for (what, rank1, field, v1, v0) in cases {
        let (code, text, _) = run_timed(mpirun_ranks("self,vader,tcp", &[with(&[]), rank1]), "");
        println!("{what}: exit {code}");
        assert_ne!(code, 0, "{what}:\n{text}");
        let says = |a: usize, va: &str, b: usize, vb: &str| {
            text.lines().any(|l| {
                l.contains("the processes disagree on the")
                    && l.contains(field)
                    && l.contains(&format!("rank {a} has `"))
                    && l.contains(va)
                    && l.contains(&format!("rank {b} has `"))
                    && l.contains(vb)
            })
        };
        assert!(
            says(1, v1, 0, v0) || says(0, v0, 1, v1),
            "{what}: expected {field} with `{v1}` and `{v0}` in:\n{text}"
        );
        assert!(
            !text.contains("MPI_ERR_TRUNCATE") && !text.contains("loading "),
            "{what}: not stopped at start-up:\n{text}"
        );
    }
    let _ = std::fs::remove_file(&map);
}

/// A launch environment this process cannot join is an error saying what was seen and what to
/// do, never a process training alone as one of several: Open MPI's or MPICH's variables set
/// without their launcher, a Slurm step without PMI, torchrun's variables, and `--mode single`
/// under a real `mpirun`.
#[test]
fn a_launch_the_process_cannot_join_is_an_error() {
    let imdb = example("imdb_mlp");
    let mpi = cfg!(feature = "mpi");
    let cases: &[(&[(&str, &str)], &str)] = &[
        (
            &[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "2")],
            if mpi {
                "but MPI started a world of 1"
            } else {
                "without the `mpi` feature"
            },
        ),
        (
            &[("PMI_RANK", "0"), ("PMI_SIZE", "2")],
            if mpi {
                "MPICH/Hydra (PMI): PMI_RANK=0 PMI_SIZE=2) says this process is rank 0 of 2, but MPI started a world of 1"
            } else {
                "without the `mpi` feature"
            },
        ),
        (
            &[("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0")],
            "burn-dtensor joins MPI launches, not torchrun's rendezvous",
        ),
        (
            &[
                ("SLURM_JOB_ID", "7"),
                ("SLURM_STEP_ID", "0"),
                ("SLURM_PROCID", "1"),
                ("SLURM_NTASKS", "2"),
            ],
            "srun started it without a PMI server (no PMIX_RANK)",
        ),
    ];
    for (vars, says) in cases {
        let mut c = Command::new("timeout");
        c.arg("120")
            .arg(&imdb)
            .args(["--mode", "data", "--max-steps", "1"]);
        for (k, v) in *vars {
            c.env(k, v);
        }
        let o = c.output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        println!("{vars:?}: {}", text.lines().last().unwrap_or_default());
        assert!(!o.status.success(), "{vars:?}:\n{text}");
        assert!(
            text.contains(says),
            "{vars:?}: expected `{says}` in:\n{text}"
        );
        assert!(
            !text.contains("loading "),
            "{vars:?} went on to train:\n{text}"
        );
    }
    if !mpi::mpi_ready() {
        return;
    }
    let (code, text, _) = run_timed(
        mpirun_ranks(
            "self,vader,tcp",
            &[
                vec![imdb.display().to_string(), "--mode".into(), "single".into()],
                vec![imdb.display().to_string(), "--mode".into(), "single".into()],
            ],
        ),
        "",
    );
    assert_ne!(code, 0, "{text}");
    assert!(
        text.contains("--mode single trains the bare backend in one process"),
        "{text}"
    );
}

/// The Slurm forms of a spec: resources as `sbatch`/`srun` options, the batch script with its
/// `srun --mpi=pmix` step (arguments quoted for the shell), and the typed error for nodes that
/// one job step cannot describe.
#[test]
fn a_spec_gives_the_slurm_batch_script_and_srun_command() {
    let s = ResourceSpec::parse(
        "[[nodes]]\naddress = \"g1\"\ngpus = [0, 1]\n\
         [[nodes]]\naddress = \"g2\"\ngpus = [0, 1]\nchief = true\n\
         [slurm]\npartition = \"gpu\"\ntime = \"01:30:00\"\nnodelist = true\n\
         output = \"run-%j.log\"\nargs = [\"--mem=16G\"]\n",
        "t",
    )
    .unwrap();
    let args = vec![
        "--mode".to_string(),
        "data".into(),
        "--data".into(),
        "/a b/x.tgz".into(),
    ];
    let script = s.slurm_script(Some(4), "/bin/imdb_mlp", &args).unwrap();
    let expected = "#!/bin/bash\n\
        # Written by burn-dtensor's `launch --slurm-script` from a resource spec.\n\
        #SBATCH --job-name=burn-dtensor\n\
        #SBATCH --output=run-%j.log\n\
        #SBATCH --nodes=2\n\
        #SBATCH --ntasks-per-node=2\n\
        #SBATCH --gres=gpu:2\n\
        #SBATCH --cpus-per-task=4\n\
        #SBATCH --nodelist=g2,g1\n\
        #SBATCH --partition=gpu\n\
        #SBATCH --time=01:30:00\n\
        #SBATCH --mem=16G\n\
        srun --mpi=pmix --cpu-bind=cores /bin/imdb_mlp --mode data --data '/a b/x.tgz'\n";
    assert_eq!(script, expected);
    let srun = burn_dtensor::launch::command_line(&s.srun(None, "p", &[]).unwrap());
    assert_eq!(
        srun,
        "srun --mpi=pmix --nodes=2 --ntasks-per-node=2 --gres=gpu:2 --nodelist=g2,g1 \
         --partition=gpu --time=01:30:00 p"
    );
    let uneven = ResourceSpec::parse(
        "[[nodes]]\naddress = \"a\"\nprocesses = 2\n[[nodes]]\naddress = \"b\"\nprocesses = 1\n",
        "t",
    )
    .unwrap();
    let e = uneven.slurm_script(None, "p", &[]).unwrap_err().to_string();
    assert!(
        e.contains("node 1 (`b`) has 1 processes") && e.contains("same task and GPU count"),
        "{e}"
    );
    refused(
        "[[nodes]]\naddress = \"a\"\nprocesses = 1\n[slurm]\nqueue = \"x\"\n",
        "unknown field `queue`",
    );
}

/// `launch --help` lists the Slurm options and the core binding.
#[test]
fn launch_help_lists_the_slurm_options() {
    let o = Command::new(example("launch"))
        .arg("--help")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    for flag in [
        "--srun",
        "--slurm-script <FILE>",
        "--sbatch",
        "--wait",
        "--cpus-per-process",
    ] {
        assert!(text.contains(flag), "`{flag}` missing from:\n{text}");
    }
}

/// The CPU sets of the processes a launch starts, from a program that prints
/// `Cpus_allowed_list` (Linux).
fn cpu_sets(output: &str) -> Vec<String> {
    let mut v: Vec<String> = output
        .lines()
        .filter_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(|l| l.trim().to_string())
        .collect();
    v.sort();
    v
}

fn write_spec(dir: &std::path::Path, text: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let spec = dir.join("spec.toml");
    std::fs::write(&spec, text).unwrap();
    spec
}

/// `--cpus-per-process 1` under mpirun binds each of two processes to its own core (read back
/// from the kernel: `Cpus_allowed_list` of each).
#[test]
fn cpus_per_process_binds_each_process_to_its_own_cores() {
    if !mpi::mpi_ready() {
        return;
    }
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        println!("skipped: one core, two processes cannot each have their own");
        return;
    }
    let dir = std::env::temp_dir().join(format!("launch-bind-{}", std::process::id()));
    let spec = write_spec(&dir, "[[nodes]]\naddress = \"localhost\"\nprocesses = 2\n");
    let (ok, text) = output_of(
        ompi::own_session_dir(&mut Command::new("timeout"))
            .args(["60"])
            .arg(example("launch"))
            .arg("--spec")
            .arg(&spec)
            .args([
                "--cpus-per-process",
                "1",
                "--",
                "grep",
                "Cpus_allowed_list",
                "/proc/self/status",
            ]),
    );
    assert!(ok, "{text}");
    assert!(text.contains("--map-by slot:PE=1 --bind-to core"), "{text}");
    let sets = cpu_sets(&text);
    assert_eq!(sets.len(), 2, "{text}");
    assert!(
        sets[0] != sets[1] && sets.iter().all(|s| s.parse::<usize>().is_ok()),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The train losses of a run's `--summary-json`.
fn losses(path: &std::path::Path) -> Vec<f64> {
    let s: serde_json::Value = serde_json::from_slice(
        &std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .unwrap();
    s["train_losses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect()
}

fn output_of(c: &mut Command) -> (bool, String) {
    let o = c.output().unwrap();
    (
        o.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

/// A real single-node Slurm cluster (munge, slurmctld, slurmd from Debian's packages, started
/// here): `srun -n 2 --mpi=pmix imdb_mlp --mode data`, the launcher's batch script through
/// `sbatch`, and the launcher's `srun` with one core per process all give the one-process run's
/// losses bitwise; `srun` without PMIx is refused with the fix; Slurm's core binding holds.
#[test]
fn a_real_slurm_cluster_runs_imdb_mlp_as_the_one_process_run() {
    let Some(data) = mpi::archive_and_mpi() else {
        return;
    };
    let Some(cluster) = slurm::cluster() else {
        return;
    };
    let dir = cluster.dir.join("runs");
    std::fs::create_dir_all(&dir).unwrap();
    let imdb = example("imdb_mlp");
    let flags = |json: &str| -> Vec<String> {
        let mut v = imdb_flags(&data, &["--epochs", "1", "--summary-json"]);
        v.push(dir.join(json).display().to_string());
        v
    };
    let (ok, text) = output_of(
        Command::new("timeout")
            .arg("300")
            .arg(&imdb)
            .args(flags("one.json")),
    );
    assert!(ok, "{text}");
    let one = losses(&dir.join("one.json"));
    assert_eq!(one.len(), 5);

    // srun by hand, as a user inside an allocation would type it.
    let (ok, text) = output_of(
        cluster
            .command("timeout")
            .args(["300", "srun", "-n", "2", "--mpi=pmix"])
            .arg(&imdb)
            .args(flags("srun.json")),
    );
    assert!(ok, "{text}\n{}", cluster.logs());
    assert!(
        text.contains("launched by Slurm (srun): 2 processes on 1 node(s)")
            && text
                .contains("mesh [batch=8] over 2 processes (mpi) x 4 virtual ndarray devices each"),
        "{text}"
    );
    assert_eq!(
        losses(&dir.join("srun.json")),
        one,
        "srun -n 2 vs one process"
    );

    // A step without PMI: each task would start a world of one; refused, with the fix.
    let (ok, text) = output_of(
        cluster
            .command("timeout")
            .args(["120", "srun", "-n", "2", "--mpi=none"])
            .arg(&imdb)
            .args(flags("none.json")),
    );
    assert!(
        !ok && text.contains("without a PMI server") && text.contains("srun --mpi=pmix"),
        "{text}"
    );
    assert!(!dir.join("none.json").exists());

    // The launcher's batch script, submitted and waited for.
    let spec = write_spec(
        &dir,
        &format!(
            "[[nodes]]\naddress = \"{}\"\nprocesses = 2\n[slurm]\noutput = \"{}/job-%j.out\"\ntime = \"10\"\n",
            cluster.node,
            dir.display()
        ),
    );
    let script = dir.join("job.sh");
    let (ok, text) = output_of(
        cluster
            .command("timeout")
            .arg("300")
            .arg(example("launch"))
            .arg("--spec")
            .arg(&spec)
            .arg("--slurm-script")
            .arg(&script)
            .args(["--sbatch", "--wait", "--"])
            .arg(&imdb)
            .args(flags("sbatch.json")),
    );
    let jobs: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("job-"))
        })
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    assert!(ok, "{text}\njob output: {jobs:?}\n{}", cluster.logs());
    assert!(text.contains("Submitted batch job"), "{text}");
    assert!(
        std::fs::read_to_string(&script)
            .unwrap()
            .contains("#SBATCH --ntasks-per-node=2"),
        "the script is kept where --slurm-script says"
    );
    assert!(
        jobs.len() == 1 && jobs[0].contains("launched by Slurm (srun): 2 processes"),
        "{jobs:?}"
    );
    assert_eq!(
        losses(&dir.join("sbatch.json")),
        one,
        "sbatch vs one process"
    );

    // The launcher's srun with one core per process: bound by Slurm, same losses.
    if std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2 {
        let bound_srun = |program: &[&std::ffi::OsStr]| {
            let mut c = cluster.command("timeout");
            c.arg("300")
                .arg(example("launch"))
                .arg("--spec")
                .arg(&spec)
                .args(["--srun", "--cpus-per-process", "1", "--"])
                .args(program);
            output_of(&mut c)
        };
        let (ok, text) = bound_srun(
            &["grep", "Cpus_allowed_list", "/proc/self/status"].map(std::ffi::OsStr::new),
        );
        assert!(ok, "{text}");
        let sets = cpu_sets(&text);
        assert!(sets.len() == 2 && sets[0] != sets[1], "{text}");
        let mut program = vec![imdb.clone().into_os_string()];
        program.extend(flags("bound.json").into_iter().map(Into::into));
        let refs: Vec<&std::ffi::OsStr> = program.iter().map(|a| a.as_os_str()).collect();
        let (ok, text) = bound_srun(&refs);
        assert!(ok, "{text}\n{}", cluster.logs());
        assert_eq!(
            losses(&dir.join("bound.json")),
            one,
            "launch --srun vs one process"
        );
    }
}
