//! burn-train's Learner on the decorator reproduces `imdb_mlp`'s hand-written loop: the same
//! seed, data order, optimizer and batch size give the same per-iteration losses, in the data,
//! model and spatial modes, on the real data (skipped with a printed reason when the archive is
//! absent). Kept short for CI: 2 epochs of 10 steps (both epochs' orders are checked), validation
//! on 1024 test reviews.

mod common;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use burn::backend::NdArray;
use burn_dtensor::LayoutMap;
use clap::Parser;
use dtensor_imdb::batch::VectorizedSet;
use dtensor_imdb::learner::{self, LearnerError, LearnerOptions, RendererKind};
use dtensor_imdb::learner_cli::{LearnerArgs, run_args};
use dtensor_imdb::train::{self, AppError, Distributed, Mode, Prepared, Quiet, TrainConfig};

struct Data {
    prepared: Prepared,
    train: Arc<VectorizedSet>,
    valid: Arc<VectorizedSet>,
}

fn data() -> Option<&'static Data> {
    static D: OnceLock<Option<Data>> = OnceLock::new();
    D.get_or_init(|| {
        common::archive().map(|p| {
            let prepared = train::prepare(&p).expect("preparing the real data");
            let valid = prepared.test.slice(0..1024);
            Data {
                train: Arc::new(prepared.train.clone()),
                valid: Arc::new(valid),
                prepared,
            }
        })
    })
    .as_ref()
}

fn placement(mode: Mode) -> Distributed<NdArray> {
    Distributed::new(
        mode.default_mesh(),
        8,
        Default::default(),
        LayoutMap::from_toml_str(mode.default_layout_map()).unwrap(),
    )
    .unwrap()
}

fn artifact_dir(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("dtensor-learner-test-{}-{tag}", std::process::id()))
}

/// NdArray's seeded RNG is process-global: runs that seed and draw weights must not interleave.
static RNG_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The Learner's per-iteration training losses equal `imdb_mlp`'s for the first 20 steps (two
/// epochs of 10), in data, model and spatial mode; its checkpointer writes each epoch, a run
/// resumed from its epoch-1 checkpoint gives the unbroken run's epoch-2 losses, and its
/// validation runs after each epoch.
#[test]
fn learner_losses_match_imdb_mlp() {
    let Some(d) = data() else { return };
    let _guard = RNG_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let cfg = TrainConfig {
        epochs: 2,
        max_steps: Some(10),
        eval: false,
        ..TrainConfig::default()
    };
    for mode in [Mode::Data, Mode::Model, Mode::Spatial] {
        let cfg = TrainConfig {
            mode,
            ..cfg.clone()
        };
        let t = std::time::Instant::now();
        let reference = train::train(&placement(mode), &cfg, &d.prepared, &mut Quiet)
            .unwrap()
            .0
            .train_losses;
        let t_loop = t.elapsed();
        let dir = artifact_dir(&format!("{mode:?}"));
        let opts = LearnerOptions {
            artifact_dir: dir.clone(),
            checkpoints: true,
            resume_epoch: None,
            renderer: RendererKind::Quiet,
            valid_batch_size: 512,
            summary: false,
        };
        let t = std::time::Instant::now();
        let (summary, _model) = learner::fit(
            Arc::new(placement(mode)),
            &cfg,
            d.train.clone(),
            d.valid.clone(),
            &opts,
        )
        .unwrap();
        let t_learner = t.elapsed();
        assert_eq!(reference.len(), 20, "{mode:?}: imdb_mlp steps");
        assert_eq!(
            summary.train_losses.len(),
            20,
            "{mode:?}: the Learner's logged iterations"
        );
        let max_rel = reference
            .iter()
            .zip(&summary.train_losses)
            .map(|(a, b)| (a - b).abs() / a.abs().max(1e-6))
            .fold(0.0f32, f32::max);
        println!(
            "{mode:?}: max relative loss difference over 20 steps {max_rel:.2e} (imdb_mlp {:.2} s, Learner {:.2} s); valid accuracy {:?}",
            t_loop.as_secs_f64(),
            t_learner.as_secs_f64(),
            summary.valid_accuracy
        );
        assert!(
            max_rel <= 1e-6,
            "{mode:?}: imdb_mlp {reference:?} vs Learner {:?}",
            summary.train_losses
        );
        assert_eq!(
            summary.valid_accuracy.len(),
            2,
            "{mode:?}: one validation per epoch"
        );
        assert!(
            summary
                .valid_accuracy
                .iter()
                .all(|a| (0.4..=1.0).contains(a)),
            "{mode:?}: {:?}",
            summary.valid_accuracy
        );
        for epoch in [1, 2] {
            let f = dir.join(format!("checkpoint/model-{epoch}.mpk"));
            assert!(f.exists(), "{mode:?}: no checkpoint {}", f.display());
        }
        // Resuming from the Learner's epoch-1 checkpoint (model, Adam state, through burn-train's
        // loader, which restores records on the default device) continues the unbroken run.
        let resumed = learner::fit(
            Arc::new(placement(mode)),
            &cfg,
            d.train.clone(),
            d.valid.clone(),
            &LearnerOptions {
                resume_epoch: Some(1),
                ..opts.clone()
            },
        )
        .unwrap()
        .0
        .train_losses;
        let max_rel_resumed = reference[10..]
            .iter()
            .zip(&resumed)
            .map(|(a, b)| (a - b).abs() / a.abs().max(1e-6))
            .fold(0.0f32, f32::max);
        println!("{mode:?}: resumed at epoch 1: max relative difference {max_rel_resumed:.2e}");
        assert_eq!(resumed.len(), 10, "{mode:?}: resumed iterations");
        assert!(
            max_rel_resumed <= 1e-6,
            "{mode:?}: unbroken {:?} vs resumed {resumed:?}",
            &reference[10..]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Bad flag combinations are typed errors before any data is read.
#[test]
fn learner_cli_rejects_bad_flags_early() {
    let parse = |extra: &[&str]| {
        let mut a = vec!["imdb_learner", "--data", "/nonexistent/aclImdb.tar.gz"];
        a.extend_from_slice(extra);
        LearnerArgs::parse_from(a)
    };
    let e = run_args(parse(&["--resume-epoch", "1", "--no-checkpoints"])).unwrap_err();
    assert!(
        matches!(e, LearnerError::App(AppError::Config(ref m)) if m.contains("--no-checkpoints")),
        "{e}"
    );
    let e = run_args(parse(&["--batch-size", "63", "--drop-policy", "strict"])).unwrap_err();
    assert!(
        matches!(e, LearnerError::App(AppError::Config(ref m)) if m.contains("divisible")),
        "{e}"
    );
    let e = run_args(parse(&["--mode", "model", "--mesh", "batch=8"])).unwrap_err();
    assert!(matches!(e, LearnerError::App(AppError::Layout(_))), "{e}");
    // The learning rate and the output paths are checked before the data is read (the data
    // path does not exist: reaching it would be another error).
    let e = run_args(parse(&["--lr=NaN"])).unwrap_err();
    assert!(
        matches!(e, LearnerError::App(AppError::Config(ref m)) if m.contains("--lr")),
        "{e}"
    );
    let e = run_args(parse(&["--plot", "curves.png"])).unwrap_err();
    assert!(
        matches!(e, LearnerError::App(AppError::Config(ref m)) if m.contains(".svg")),
        "{e}"
    );
    let e = run_args(parse(&["--summary-json", "/nonexistent-dir/s.json"])).unwrap_err();
    assert!(
        matches!(e, LearnerError::App(AppError::Config(ref m)) if m.contains("--summary-json")),
        "{e}"
    );
}
