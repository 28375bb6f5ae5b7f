//! The command line of the `imdb_learner` example: `imdb_mlp`'s mode, mesh, layout-map,
//! backend and optimizer flags, trained with burn-train's Learner ([`crate::learner`]).

use std::path::PathBuf;
use std::sync::Arc;

use burn::tensor::backend::Backend;
use clap::Parser;

use crate::cli::{BackendKind, RunFlags};
use crate::data::imdb;
use crate::learner::{self, LearnerError, LearnerOptions, LearnerSummary, RendererKind};
use crate::model::LossReduction;
use crate::train::{self, AppError, Mode, Placement, Single, TrainConfig};

/// The flags of `imdb_learner`.
#[derive(Parser, Debug)]
#[command(
    name = "imdb_learner",
    about = "IMDB sentiment MLP on burn-dtensor, trained with burn-train's Learner (metrics, TUI, checkpoints)"
)]
pub struct LearnerArgs {
    /// Mesh, layout map, backend, training settings, data, outputs (as `imdb_mlp`'s).
    #[command(flatten)]
    pub run: RunFlags,
    /// burn-train's artifact directory (metric logs, experiment.log, checkpoint/); default:
    /// `<temp dir>/burn-dtensor-imdb-learner/<mode>`.
    #[arg(long)]
    pub artifact_dir: Option<PathBuf>,
    /// Do not register burn-train's file checkpointer.
    #[arg(long)]
    pub no_checkpoints: bool,
    /// Resume from the Learner checkpoint of this epoch (1-based) in the artifact directory,
    /// written in any mode.
    #[arg(long)]
    pub resume_epoch: Option<usize>,
    /// Validation batch size (the test split, after each epoch).
    #[arg(long, default_value_t = 2048)]
    pub valid_batch_size: usize,
}

impl LearnerArgs {
    /// The run's [`TrainConfig`] (imdb_mlp's fields; the mean loss).
    pub fn train_config(&self) -> TrainConfig {
        self.run.train_config(LossReduction::Mean, true, None, None)
    }

    /// The Learner settings of the run.
    pub fn options(&self) -> LearnerOptions {
        let default = LearnerOptions::default();
        LearnerOptions {
            artifact_dir: self.artifact_dir.clone().unwrap_or_else(|| {
                default
                    .artifact_dir
                    .join(format!("{:?}", self.run.mode).to_lowercase())
            }),
            checkpoints: !self.no_checkpoints,
            resume_epoch: self.resume_epoch,
            renderer: RendererKind::Default,
            valid_batch_size: self.valid_batch_size,
            summary: true,
        }
    }
}

fn run<P: Placement + Send + Sync + 'static>(
    p: P,
    args: &LearnerArgs,
) -> Result<LearnerSummary, LearnerError> {
    let cfg = args.train_config();
    let opts = args.options();
    // Bad layout inputs fail here, before the (slow) data preparation: the placement checked
    // the mesh and the map's axes; the batch size and the map's rules (each parameter is
    // materialised in its own layout: only shards are allocated) are checked now.
    train::check_batch(cfg.batch_size, p.batch_axis(), cfg.drop_policy)?;
    p.prepare_model(crate::model::ImdbMlp::new(&p.device()))?;
    learner::check_options(&cfg, &opts)?;
    let path = imdb::resolve_source(args.run.data.as_deref()).map_err(AppError::from)?;
    crate::say!("loading {} ...", path.display());
    let t = std::time::Instant::now();
    let data = train::prepare(&path)?;
    println!(
        "{} train / {} test reviews vectorised (TF-IDF, {} terms) in {:.1} s, held as term counts in {:.0} MB",
        data.train.len(),
        data.test.len(),
        data.vectorizer.vocab_size(),
        t.elapsed().as_secs_f64(),
        (data.train.heap_bytes() + data.test.heap_bytes()) as f64 / 1e6
    );
    println!(
        "training with burn-train's Learner; artifacts in {}",
        opts.artifact_dir.display()
    );
    let (summary, model) = learner::fit(
        Arc::new(p),
        &cfg,
        Arc::new(data.train),
        Arc::new(data.test),
        &opts,
    )?;
    if let Some(path) = &args.run.summary_json {
        std::fs::write(path, serde_json::to_string_pretty(&summary).unwrap())
            .map_err(|e| AppError::Config(format!("cannot write {}: {e}", path.display())))?;
    }
    if let Some(path) = &args.run.plot {
        crate::plot::plot_runs(&[(&summary).into()], path)?;
        println!("curves drawn to {}", path.display());
    }
    if let Some(path) = &args.run.export {
        train::export(model, &data.vectorizer, path)?;
        println!("exported to {} (+ .vectorizer.json)", path.display());
    }
    println!(
        "done: mode {:?}, mesh [{}], {} steps, wall {:.1} s, test accuracy per epoch {:?}",
        summary.mode,
        summary.mesh,
        summary.train_losses.len(),
        summary.wall_s,
        summary.valid_accuracy
    );
    Ok(summary)
}

fn with_backend<I: Backend>(args: &LearnerArgs) -> Result<LearnerSummary, LearnerError> {
    if args.run.mode == Mode::Single {
        let device = I::Device::default();
        return run(Single::<I> { device }, args);
    }
    let p = args.run.distributed::<I>()?;
    args.run.announce(&p)?;
    run(p, args)
}

/// Runs the example with parsed flags; returns the run's summary.
///
/// # Errors
/// Every bad input (malformed layout map, mesh/device mismatch, unknown axis, unshardable batch
/// size under `--drop-policy strict`, a resume without checkpoints: all checked before the data
/// is loaded; missing or corrupt data) as a typed [`LearnerError`].
pub fn run_args(args: LearnerArgs) -> Result<LearnerSummary, LearnerError> {
    train::check_lr(args.train_config().lr)?;
    crate::cli::check_outputs(
        args.run.summary_json.as_deref(),
        args.run.export.as_deref(),
        args.run.plot.as_deref(),
    )?;
    match args.run.backend {
        BackendKind::Ndarray => with_backend::<burn::backend::NdArray>(&args),
        BackendKind::Flex => with_backend::<burn::backend::Flex>(&args),
        #[cfg(feature = "wgpu")]
        BackendKind::Wgpu => with_backend::<burn::backend::Wgpu>(&args),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => with_backend::<burn::backend::Cuda>(&args),
    }
}
