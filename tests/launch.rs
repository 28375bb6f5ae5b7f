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
        cmd.contains("\"--hostfile\" \"/tmp/h\" \"-np\" \"5\" \"--mca\" \"btl\" \"self,tcp\" \"prog\" \"--x\""),
        "{cmd}"
    );
}

fn example(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()?
        .parent()?
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    bin.exists().then_some(bin)
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
    let (Some(launch), Some(imdb)) = (example("launch"), example("imdb_mlp")) else {
        println!("skipped: examples not built (cargo test --all-targets builds them)");
        return;
    };
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
    let s: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(s["world_size"], 2, "{s}");
    assert_eq!(s["train_losses"].as_array().unwrap().len(), 5);
    let _ = std::fs::remove_dir_all(&dir);
}
