//! Bad inputs to the `imdb_mlp` command line give a typed error naming the fix (and, through
//! the example binary, a non-zero exit).

use burn_dtensor::DTensorError;
use clap::Parser;
use dtensor_imdb::cli::{Args, run_args};
use dtensor_imdb::data::DataError;
use dtensor_imdb::train::AppError;

fn tmp(name: &str, content: &[u8]) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("dtensor-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, content).unwrap();
    p
}

fn run(args: &[&str]) -> Result<(), AppError> {
    let mut v = vec!["imdb_mlp"];
    v.extend_from_slice(args);
    run_args(Args::try_parse_from(v).expect("flags parse"))
}

#[test]
fn missing_archive() {
    let e = run(&["--data", "/nonexistent/aclImdb_v1.tar.gz"]).unwrap_err();
    assert!(matches!(e, AppError::Data(_)), "{e}");
    assert!(
        e.to_string().contains("/nonexistent/aclImdb_v1.tar.gz"),
        "{e}"
    );
}

#[test]
fn corrupt_archive() {
    let p = tmp(
        "corrupt.tar.gz",
        b"\x1f\x8b\x08\x00garbage that is not a gzip stream",
    );
    let e = run(&["--data", p.to_str().unwrap()]).unwrap_err();
    assert!(
        matches!(e, AppError::Data(DataError::CorruptArchive { .. })),
        "{e}"
    );
}

#[test]
fn malformed_layout_map_file() {
    let p = tmp("bad.toml", b"dense1.weight = [\"unsharded\", ");
    let e = run(&["--layout-map", p.to_str().unwrap(), "--mode", "model"]).unwrap_err();
    assert!(
        matches!(e, AppError::Layout(DTensorError::LayoutMapFile { .. })),
        "{e}"
    );
}

#[test]
fn layout_map_rule_matching_nothing() {
    let p = tmp("nomatch.toml", b"'^dense9' = [\"model\"]\n");
    let e = run(&[
        "--mode",
        "model",
        "--layout-map",
        p.to_str().unwrap(),
        "--data",
        "/nonexistent/never-read.tar.gz",
    ])
    .unwrap_err();
    assert!(
        matches!(&e, AppError::Layout(DTensorError::UnmatchedRule { patterns, .. }) if patterns.contains("dense9")),
        "{e}"
    );
}

#[test]
fn mesh_size_not_matching_devices() {
    let e = run(&["--mesh", "batch=4,model=2", "--devices", "6"]).unwrap_err();
    assert!(
        matches!(
            e,
            AppError::Layout(DTensorError::DeviceCountMismatch {
                expected: 8,
                given: 6,
                ..
            })
        ),
        "{e}"
    );
}

#[test]
fn layout_naming_unknown_axis() {
    let p = tmp(
        "unknown.toml",
        b"'dense1\\.weight' = [\"unsharded\", \"tensor\"]\n",
    );
    let e = run(&["--mode", "model", "--layout-map", p.to_str().unwrap()]).unwrap_err();
    assert!(
        matches!(e, AppError::Layout(DTensorError::UnknownAxis { .. })),
        "{e}"
    );
}

#[test]
fn batch_size_unshardable_under_strict_policy() {
    let e = run(&[
        "--mode",
        "data",
        "--batch-size",
        "60",
        "--drop-policy",
        "strict",
    ])
    .unwrap_err();
    assert!(
        matches!(&e, AppError::Config(m) if m.contains("not divisible by the batch axis (8)")),
        "{e}"
    );
}

/// The example binary exits non-zero with the message on stderr (skipped when the example was
/// not built, e.g. `cargo test --test cli` alone; `cargo test --all-targets` builds it).
#[test]
fn example_binary_exits_non_zero() {
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples")
        .join(format!("imdb_mlp{}", std::env::consts::EXE_SUFFIX));
    if !bin.exists() {
        println!("skipped: {} not built", bin.display());
        return;
    }
    let out = std::process::Command::new(&bin)
        .args(["--mesh", "batch=3", "--devices", "8"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("device count mismatch"), "{err}");
}
