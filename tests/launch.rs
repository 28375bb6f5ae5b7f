//! The resource-spec launcher: typed errors for bad specs, the hostfile, and a real two-process
//! run of `imdb_mlp` started by `examples/launch.rs` from a spec of one localhost node.

mod common;

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
        s.mpirun(std::path::Path::new("/tmp/h"), "prog", &["--x".into()])
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
    let cmd = format!("{:?}", s.mpirun(std::path::Path::new("/h"), "prog", &[]));
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
    assert!(!format!("{:?}", cpu.mpirun(std::path::Path::new("/h"), "p", &[])).contains("-x"));
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
        text.contains("n1 slots=2\nn2 slots=2\n") && text.contains("\"-np\" \"4\""),
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
    let Some(data) = common::archive() else {
        return;
    };
    let require = std::env::var("BURN_DTENSOR_REQUIRE_MPI").is_ok_and(|v| v == "1");
    if !cfg!(feature = "mpi") || Command::new("mpirun").arg("--version").output().is_err() {
        assert!(!require, "no MPI (BURN_DTENSOR_REQUIRE_MPI=1)");
        println!("skipped: no mpirun or built without the `mpi` feature");
        return;
    }
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
    let o = Command::new("timeout")
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
        .arg(&out)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "{text}");
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

fn mpi_ready() -> bool {
    let require = std::env::var("BURN_DTENSOR_REQUIRE_MPI").is_ok_and(|v| v == "1");
    if !cfg!(feature = "mpi") || Command::new("mpirun").arg("--version").output().is_err() {
        assert!(!require, "no MPI (BURN_DTENSOR_REQUIRE_MPI=1)");
        println!("skipped: no mpirun or built without the `mpi` feature");
        return false;
    }
    true
}

/// `mpirun` over `-np 1 PROGRAM ARGS` blocks, one per rank (MPMD syntax), so that each rank can
/// get its own flags and environment; 60 s collective timeout.
fn mpirun_ranks(ranks: &[Vec<String>]) -> Command {
    let mut c = Command::new("timeout");
    c.args(["300", "mpirun", "--allow-run-as-root", "--oversubscribe"])
        .args(["--mca", "btl", "self,vader,tcp"])
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
    let Some(data) = common::archive() else {
        return;
    };
    if !mpi_ready() {
        return;
    }
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
    let (code, text, secs) = run_timed(mpirun_ranks(&[rank0, rank1]), "burn-dtensor [rank 0");
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
    assert!(secs < 5.0, "ended {secs:.1} s after the error:\n{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every setting that shapes the communication, made to differ on one rank, stops the job at
/// start-up with an error naming the setting and both values (before: the backend and the
/// reduction passed, then MPI_ERR_TRUNCATE; the training flags gave a truncated Debug string).
#[test]
fn processes_that_differ_are_told_which_setting() {
    let Some(data) = common::archive() else {
        return;
    };
    if !mpi_ready() {
        return;
    }
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
        let (code, text, _) = run_timed(mpirun_ranks(&[with(&[]), rank1]), "");
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
    if !mpi_ready() {
        return;
    }
    let (code, text, _) = run_timed(
        mpirun_ranks(&[
            vec![imdb.display().to_string(), "--mode".into(), "single".into()],
            vec![imdb.display().to_string(), "--mode".into(), "single".into()],
        ]),
        "",
    );
    assert_ne!(code, 0, "{text}");
    assert!(
        text.contains("--mode single trains the bare backend in one process"),
        "{text}"
    );
}
