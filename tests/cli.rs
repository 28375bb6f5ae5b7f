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

/// A mistyped device count or mesh size is refused before a device is made (it made one
/// handle per device first: `--devices 99999999999` ran for minutes without a word), and axis
/// sizes whose product overflows are refused (the product wrapped).
#[test]
fn oversized_meshes_are_refused_up_front() {
    let e = run(&["--mesh", "batch=99999999999", "--devices", "99999999999"]).unwrap_err();
    assert!(
        matches!(&e, AppError::Config(m) if m.contains("--devices 99999999999")),
        "{e}"
    );
    let e = run(&[
        "--mesh",
        "batch=4294967296,model=4294967296",
        "--devices",
        "8",
    ])
    .unwrap_err();
    assert!(
        matches!(e, AppError::Layout(DTensorError::MeshTooLarge { .. })),
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

/// The example binary exits non-zero with the message on stderr (the example's `main`, built
/// as the package's `imdb_mlp` binary for the tests).
#[test]
fn example_binary_exits_non_zero() {
    let bin = env!("CARGO_BIN_EXE_imdb_mlp");
    let out = std::process::Command::new(bin)
        .args(["--mesh", "batch=3", "--devices", "8"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("device count mismatch"), "{err}");
}

/// Inputs that used to train to NaN, panic, or fail only after training now fail up front
/// (`--data` points nowhere: an error about the data would mean the check came too late).
#[test]
fn learning_rate_must_be_finite_and_positive() {
    for lr in ["NaN", "inf", "-1", "0"] {
        let flag = format!("--lr={lr}");
        let e = run(&[&flag, "--data", "/nonexistent/never-read.tar.gz"]).unwrap_err();
        assert!(
            matches!(&e, AppError::Config(m) if m.contains("--lr must be a finite positive number")),
            "--lr {lr}: {e}"
        );
    }
}

#[test]
fn mesh_axis_defined_twice() {
    let e = run(&["--mesh", "batch=8,batch=1", "--data", "/nonexistent/x"]).unwrap_err();
    assert!(
        matches!(&e, AppError::Layout(DTensorError::DuplicateMeshAxis { axis, .. }) if axis == "batch"),
        "{e}"
    );
    assert!(e.to_string().contains("defined twice in the mesh"), "{e}");
}

#[test]
fn unwritable_outputs_fail_before_training() {
    let file = tmp("a-file", b"x");
    let under_file = file.join("sub");
    let p = under_file.to_str().unwrap();
    for flag in ["--summary-json", "--export"] {
        let e = run(&[flag, p, "--data", "/nonexistent/x"]).unwrap_err();
        assert!(
            matches!(&e, AppError::Config(m) if m.contains(flag) && m.contains("cannot write there")),
            "{flag}: {e}"
        );
    }
    let e = run(&["--checkpoint-dir", p, "--data", "/nonexistent/x"]).unwrap_err();
    assert!(
        matches!(&e, AppError::Checkpoint { path, .. } if path == p),
        "--checkpoint-dir: {e}"
    );
    // A directory given as the summary file.
    let dir = file.parent().unwrap().to_str().unwrap().to_string();
    let e = run(&["--summary-json", &dir, "--data", "/nonexistent/x"]).unwrap_err();
    assert!(
        matches!(&e, AppError::Config(m) if m.contains("is a directory")),
        "{e}"
    );
}

#[test]
fn resume_from_a_directory_without_checkpoint() {
    let dir = std::env::temp_dir().join(format!("dtensor-cli-empty-ckpt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.to_str().unwrap();
    let e = run(&["--resume", d, "--data", "/nonexistent/x"]).unwrap_err();
    assert!(
        matches!(&e, AppError::Checkpoint { path, reason } if path.ends_with("LATEST") && reason.contains("cannot read")),
        "{e}"
    );
}

/// A corpus with fewer distinct terms than the model's 1200 inputs (it used to panic in matmul).
#[test]
fn corpus_smaller_than_the_vocabulary() {
    let root = std::env::temp_dir().join(format!("dtensor-tiny-imdb-{}", std::process::id()));
    for split in ["train", "test"] {
        for (label, rating) in [("pos", 9), ("neg", 2)] {
            let d = root.join("aclImdb").join(split).join(label);
            std::fs::create_dir_all(&d).unwrap();
            for i in 0..3 {
                std::fs::write(
                    d.join(format!("{i}_{rating}.txt")),
                    format!("a {label} film number {i}, quite short"),
                )
                .unwrap();
            }
        }
    }
    let e = run(&["--data", root.to_str().unwrap(), "--epochs", "1"]).unwrap_err();
    assert!(
        matches!(&e, AppError::Config(m) if m.contains("distinct terms") && m.contains("1200")),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(root);
}

/// `imdb_predict`'s classification refuses a text it cannot judge (it used to answer
/// "positive (0.625)" for an empty text) and classifies the others.
#[test]
fn predict_refuses_texts_without_vocabulary_words() {
    use dtensor_imdb::data::tfidf::TfIdfVectorizer;
    use dtensor_imdb::model::{INPUT_DIM, ImdbMlp};
    let corpus: Vec<String> = (0..30)
        .map(|d| {
            (0..60)
                .map(|w| format!("w{}", d * 50 + w))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    let v = TfIdfVectorizer::fit(&corpus, INPUT_DIM).unwrap();
    assert_eq!(v.vocab_size(), INPUT_DIM);
    let dev = Default::default();
    let model = ImdbMlp::<burn::backend::NdArray>::new(&dev);
    let classify = |texts: &[&str]| {
        let t: Vec<String> = texts.iter().map(|s| s.to_string()).collect();
        dtensor_imdb::train::classify(&model, &v, &t, &dev)
    };
    let p = classify(&["w1 w2 w3", "w400 w401"]).unwrap();
    assert_eq!(p.len(), 2);
    assert!(p.iter().all(|x| (0.0..=1.0).contains(x)), "{p:?}");
    for (texts, what) in [
        (vec!["w1 w2", "   "], "text 2 is empty"),
        (
            vec!["zzz qqq"],
            "text 1 has no word of the model's vocabulary",
        ),
    ] {
        let e = classify(&texts).unwrap_err();
        assert!(matches!(&e, AppError::Config(m) if m.contains(what)), "{e}");
    }
}

/// `--epochs 0` and `--max-steps 0` train nothing: refused with the other flags, before the data
/// (before: "train loss 0.0000, train acc 0.000", and `--plot` failed after evaluation).
#[test]
fn zero_epochs_or_steps_are_refused_up_front() {
    for (flags, says) in [
        (&["--epochs", "0"][..], "--epochs 0 trains nothing"),
        (
            &["--max-steps", "0", "--plot", "x.svg"][..],
            "--max-steps 0 trains nothing",
        ),
    ] {
        let mut all = flags.to_vec();
        all.extend(["--data", "/nonexistent/archive.tar.gz"]);
        let e = run(&all).unwrap_err();
        assert!(
            matches!(&e, AppError::Config(m) if m.contains(says)),
            "{flags:?}: {e}"
        );
    }
}

/// A layout-map file without a rule is refused (it would replicate every parameter silently);
/// a syntax error names the line and column.
#[test]
fn empty_or_malformed_layout_map_files() {
    let empty = tmp("empty.toml", b"# nothing here\n");
    let e = run(&["--layout-map", empty.to_str().unwrap()]).unwrap_err();
    assert!(e.to_string().contains("it has no rule"), "{e}");
    let bad = tmp(
        "bad.toml",
        b"'^dense1' = [\"model\"]\n'^dense2' = [\"model\" \"x\"]\n",
    );
    let e = run(&["--layout-map", bad.to_str().unwrap()]).unwrap_err();
    assert!(e.to_string().contains("line 2, column"), "{e}");
}
