//! The IMDB MLP trained with burn-train's `Learner` (`SupervisedTraining`: metrics, TUI or
//! plain renderer, file checkpointer) on any [`Placement`]: the bare backend (`single`) or
//! `Autodiff<DistributedBackend<I>>` on the mesh and layout map of `data`, `model` or `spatial`
//! mode. The model, its initialisation, the data order and the batch placement are the ones
//! `imdb_mlp`'s hand-written loop ([`crate::train`]) uses, so both give the same losses.
//!
//! The pieces a Burn user writes for a Learner, here for a distributed backend:
//! - [`TrainBatcher`] / [`ValidBatcher`]: `burn::data` batchers that place each batch for the
//!   mesh through the placement (sharded over `batch`, and over `feature` in spatial mode);
//! - [`ImdbLoader`]: a `burn::data` [`DataLoader`] whose epochs visit the rows in
//!   [`epoch_order`] (the order `imdb_mlp` uses), cut by [`batches`] under the drop policy;
//! - `TrainStep` / `InferenceStep` for [`ImdbMlp`], with burn-train's `ClassificationOutput`
//!   (loss and accuracy metrics);
//! - [`RunLog`]: a metric logger that keeps each iteration's training loss and each epoch's
//!   validation figures, for the summary and the tests.
//!
//! The binary is `examples/imdb_learner.rs` (flags in [`crate::learner_cli`]).

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use burn::backend::Flex;
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataloader::{DataLoader, DataLoaderIterator, Progress};
use burn::data::dataset::Dataset;
use burn::optim::{AdamConfig, Optimizer, SgdConfig};
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder};
use burn::tensor::backend::{AutodiffBackend, Backend, BackendTypes};
use burn::tensor::{Int, Tensor};
use burn::train::logger::{FileMetricLogger, MetricLogger};
use burn::train::metric::store::{EpochSummary, MetricsUpdate, Split};
use burn::train::metric::{
    AccuracyMetric, LossMetric, Metric, MetricDefinition, MetricId, NumericEntry,
};
use burn::train::renderer::{
    EvaluationName, EvaluationProgress, MetricState, MetricsRenderer, MetricsRendererEvaluation,
    MetricsRendererTraining, ProgressType, TrainingProgress,
};
use burn::train::{
    ClassificationOutput, InferenceStep, Learner, SupervisedTraining, TrainOutput, TrainStep,
};
use serde::{Deserialize, Serialize};

use crate::batch::{DropPolicy, Example, VectorizedSet, batches, epoch_order, host_batch};
use crate::model::{ImdbMlp, LossReduction};
use crate::train::{
    AppError, Mode, OptimizerKind, Placement, TrainConfig, check_batch, init_model,
};

/// Errors of a Learner run, each saying what to fix.
#[derive(Debug, thiserror::Error)]
pub enum LearnerError {
    /// Configuration, layout, data and checkpoint errors, as `imdb_mlp`'s.
    #[error(transparent)]
    App(#[from] AppError),
    /// burn-train's event store had not delivered the last metrics when training returned.
    #[error(
        "burn-train's metric logging did not finish within {0:?} after training, so the logged losses are incomplete; check that the renderer is not blocked (press `q` in the TUI) and rerun"
    )]
    LogNotClosed(Duration),
}

/// The inference (non-autodiff) backend of a placement.
pub type InnerOf<P> = <<P as Placement>::AD as AutodiffBackend>::InnerBackend;

/// One batch of the IMDB MLP: TF-IDF rows `[n, 1200]` and labels `[n]`, laid out for the mesh.
#[derive(Debug, Clone)]
pub struct ImdbBatch<B: Backend> {
    /// Features `[n, 1200]`.
    pub features: Tensor<B, 2>,
    /// Labels `[n]` (0 = neg, 1 = pos).
    pub labels: Tensor<B, 1, Int>,
}

fn host_rows(items: &[Example]) -> (burn::tensor::TensorData, burn::tensor::TensorData) {
    let width = items
        .first()
        .map_or(crate::model::INPUT_DIM, |e| e.features.len());
    host_batch(
        items.iter().map(|e| (e.features.as_slice(), e.label)),
        width,
    )
}

/// Training batcher: stacks the examples and places them with [`Placement::train_batch`] (on a
/// mesh: sharded over `batch`, and over `feature` where the mesh has that axis). The placement
/// knows the mesh; the device the loader hands in is the model's (the same mesh).
pub struct TrainBatcher<P>(pub Arc<P>);

impl<P: Placement + Send + Sync> Batcher<P::AD, Example, ImdbBatch<P::AD>> for TrainBatcher<P> {
    fn batch(
        &self,
        items: Vec<Example>,
        _device: &<P::AD as BackendTypes>::Device,
    ) -> ImdbBatch<P::AD> {
        let (x, y) = host_rows(&items);
        // `Batcher::batch` cannot return an error; the placement was validated when it was built
        // (mesh, layouts, batch policy), so a failure here is a bug, not a user input.
        let (features, labels) = self.0.train_batch(x, y).unwrap_or_else(|e| {
            panic!(
                "placing a training batch of {} rows failed: {e}",
                items.len()
            )
        });
        ImdbBatch { features, labels }
    }
}

/// Validation batcher: as [`TrainBatcher`] on the inner (non-autodiff) backend, through
/// [`Placement::valid_batch`].
pub struct ValidBatcher<P>(pub Arc<P>);

impl<P: Placement + Send + Sync> Batcher<InnerOf<P>, Example, ImdbBatch<InnerOf<P>>>
    for ValidBatcher<P>
{
    fn batch(
        &self,
        items: Vec<Example>,
        _device: &<InnerOf<P> as BackendTypes>::Device,
    ) -> ImdbBatch<InnerOf<P>> {
        let (x, y) = host_rows(&items);
        let (features, labels) = self.0.valid_batch(x, y).unwrap_or_else(|e| {
            panic!(
                "placing a validation batch of {} rows failed: {e}",
                items.len()
            )
        });
        ImdbBatch { features, labels }
    }
}

/// Which rows an epoch of an [`ImdbLoader`] visits, in which order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EpochOrder {
    /// [`epoch_order`]`(n, seed, epoch)`: the k-th iteration over the loader is epoch
    /// `first_epoch + k` (0-based), as in `imdb_mlp`.
    Shuffled {
        /// Seed of the order.
        seed: u64,
    },
    /// The rows in order (validation).
    Sequential,
}

/// A `burn::data` [`DataLoader`] over a [`VectorizedSet`] whose epochs follow [`EpochOrder`] and
/// are cut by [`batches`] under a [`DropPolicy`] (at most `max_steps` batches an epoch), each
/// batch built by a [`Batcher`] (which places it for the mesh).
pub struct ImdbLoader<B: Backend, O> {
    set: Arc<VectorizedSet>,
    rows: Range<usize>,
    batcher: Arc<dyn Batcher<B, Example, O>>,
    device: B::Device,
    order: EpochOrder,
    batch_size: usize,
    policy: DropPolicy,
    max_steps: Option<usize>,
    next_epoch: Arc<AtomicUsize>,
}

impl<B: Backend, O> ImdbLoader<B, O> {
    /// A loader over all rows of `set`; its first iteration is epoch `first_epoch` (0-based;
    /// a run resumed after epoch k starts at k).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        set: Arc<VectorizedSet>,
        batcher: Arc<dyn Batcher<B, Example, O>>,
        device: B::Device,
        order: EpochOrder,
        batch_size: usize,
        policy: DropPolicy,
        max_steps: Option<usize>,
        first_epoch: usize,
    ) -> Self {
        let rows = 0..set.len();
        Self {
            set,
            rows,
            batcher,
            device,
            order,
            batch_size,
            policy,
            max_steps,
            next_epoch: Arc::new(AtomicUsize::new(first_epoch)),
        }
    }

    fn with(&self, device: B::Device, rows: Range<usize>) -> Self {
        Self {
            set: self.set.clone(),
            rows,
            batcher: self.batcher.clone(),
            device,
            order: self.order,
            batch_size: self.batch_size,
            policy: self.policy,
            max_steps: self.max_steps,
            next_epoch: self.next_epoch.clone(),
        }
    }

    /// The batches (row indices) of the next epoch.
    fn next_batches(&self) -> Vec<Vec<usize>> {
        let n = self.rows.len();
        let order: Vec<usize> = match self.order {
            EpochOrder::Shuffled { seed } => {
                let epoch = self.next_epoch.fetch_add(1, Ordering::SeqCst);
                epoch_order(n, seed, epoch)
            }
            EpochOrder::Sequential => (0..n).collect(),
        };
        let order: Vec<usize> = order.into_iter().map(|i| i + self.rows.start).collect();
        let mut bs = batches(&order, self.batch_size, self.policy);
        if let Some(m) = self.max_steps {
            bs.truncate(m);
        }
        bs.into_iter().map(<[usize]>::to_vec).collect()
    }
}

struct ImdbLoaderIter<'a, B: Backend, O> {
    loader: &'a ImdbLoader<B, O>,
    batches: std::vec::IntoIter<Vec<usize>>,
    done: usize,
    total: usize,
}

impl<B: Backend, O> Iterator for ImdbLoaderIter<'_, B, O> {
    type Item = O;
    fn next(&mut self) -> Option<O> {
        let idx = self.batches.next()?;
        let items: Vec<Example> = idx
            .iter()
            .map(|&i| self.loader.set.get(i).expect("row index within the set"))
            .collect();
        self.done += items.len();
        Some(self.loader.batcher.batch(items, &self.loader.device))
    }
}

impl<B: Backend, O> DataLoaderIterator<O> for ImdbLoaderIter<'_, B, O> {
    fn progress(&self) -> Progress {
        Progress::new(self.done, self.total)
    }
}

impl<B: Backend, O: Send + 'static> DataLoader<B, O> for ImdbLoader<B, O> {
    fn iter<'a>(&'a self) -> Box<dyn DataLoaderIterator<O> + 'a> {
        let batches = self.next_batches();
        let total = batches.iter().map(Vec::len).sum();
        Box::new(ImdbLoaderIter {
            loader: self,
            batches: batches.into_iter(),
            done: 0,
            total,
        })
    }
    fn num_items(&self) -> usize {
        self.rows.len()
    }
    fn to_device(&self, device: &B::Device) -> Arc<dyn DataLoader<B, O>> {
        Arc::new(self.with(device.clone(), self.rows.clone()))
    }
    fn slice(&self, start: usize, end: usize) -> Arc<dyn DataLoader<B, O>> {
        let start = (self.rows.start + start).min(self.rows.end);
        let end = (self.rows.start + end).clamp(start, self.rows.end);
        Arc::new(self.with(self.device.clone(), start..end))
    }
}

impl<B: AutodiffBackend> TrainStep for ImdbMlp<B> {
    type Input = ImdbBatch<B>;
    type Output = ClassificationOutput<B>;

    /// Forward, mean cross-entropy, backward: the step of [`crate::train::step`], whose
    /// optimizer update the Learner makes.
    fn step(&self, batch: ImdbBatch<B>) -> TrainOutput<ClassificationOutput<B>> {
        let logits = self.forward(batch.features);
        let loss = self.loss(logits.clone(), batch.labels.clone(), LossReduction::Mean);
        let grads = loss.backward();
        TrainOutput::new(
            self,
            grads,
            ClassificationOutput::new(loss, logits, batch.labels),
        )
    }
}

impl<B: Backend> InferenceStep for ImdbMlp<B> {
    type Input = ImdbBatch<B>;
    type Output = ClassificationOutput<B>;

    fn step(&self, batch: ImdbBatch<B>) -> ClassificationOutput<B> {
        let logits = self.forward(batch.features);
        let loss = self.loss(logits.clone(), batch.labels.clone(), LossReduction::Mean);
        ClassificationOutput::new(loss, logits, batch.labels)
    }
}

#[derive(Default)]
struct RunLogState {
    names: HashMap<MetricId, String>,
    train_losses: Vec<f32>,
    /// epoch (1-based) -> metric name -> running (epoch) value.
    valid: BTreeMap<usize, HashMap<String, f64>>,
    closed: bool,
}

/// What a Learner run logged, shared with the [`MetricLogger`] that [`RunLog::logger`] makes:
/// the training loss of every iteration, and each epoch's validation loss and accuracy (the
/// Learner's own metrics, as its file logger records them).
#[derive(Clone, Default)]
pub struct RunLog {
    inner: Arc<(Mutex<RunLogState>, Condvar)>,
}

/// The [`MetricLogger`] side of a [`RunLog`]. burn-train drops it when its event store closes
/// (after the last event), which [`RunLog::wait_closed`] waits for.
pub struct RunLogger(RunLog);

impl RunLog {
    /// A logger to register with `SupervisedTraining::with_metric_logger`.
    pub fn logger(&self) -> RunLogger {
        RunLogger(self.clone())
    }

    /// Waits until burn-train has closed the logger (all events delivered), at most `timeout`.
    /// Returns whether it was closed.
    pub fn wait_closed(&self, timeout: Duration) -> bool {
        let (m, cv) = &*self.inner;
        let g = m.lock().unwrap_or_else(|e| e.into_inner());
        let (g, _) = cv
            .wait_timeout_while(g, timeout, |s| !s.closed)
            .unwrap_or_else(|e| e.into_inner());
        g.closed
    }

    /// The training loss of each iteration, all epochs in order.
    pub fn train_losses(&self) -> Vec<f32> {
        self.state().train_losses.clone()
    }

    /// The validation value of `metric` (e.g. `"Accuracy"`, in percent, or `"Loss"`) at the end
    /// of each epoch, in epoch order.
    pub fn valid_epochs(&self, metric: &str) -> Vec<f64> {
        self.state()
            .valid
            .values()
            .filter_map(|m| m.get(metric).copied())
            .collect()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, RunLogState> {
        self.inner.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for RunLogger {
    fn drop(&mut self) {
        self.0.state().closed = true;
        self.0.inner.1.notify_all();
    }
}

impl MetricLogger for RunLogger {
    fn log(&mut self, update: MetricsUpdate, epoch: usize, split: &Split) {
        let mut s = self.0.state();
        let loss = LossMetric::<Flex>::new().name();
        for u in update.entries_numeric {
            let Some(name) = s.names.get(&u.entry.metric_id).cloned() else {
                continue;
            };
            match split {
                Split::Train if name == *loss => {
                    // The metric holds the batch's f32 loss widened to f64: exact.
                    s.train_losses.push(u.numeric_entry.current() as f32);
                }
                Split::Valid => {
                    s.valid
                        .entry(epoch)
                        .or_default()
                        .insert(name, u.running_entry.current());
                }
                _ => {}
            }
        }
    }
    fn read_numeric(
        &mut self,
        name: &str,
        _epoch: usize,
        _split: &Split,
    ) -> Result<Vec<NumericEntry>, String> {
        // The file logger registered before this one answers these queries.
        Err(format!("RunLog keeps no history of `{name}`"))
    }
    fn log_metric_definition(&mut self, definition: MetricDefinition) {
        self.0
            .state()
            .names
            .insert(definition.metric_id, definition.name);
    }
    fn log_epoch_summary(&mut self, _summary: EpochSummary) {}
}

/// A renderer that shows nothing (tests, benchmarks).
pub struct QuietRenderer;

impl MetricsRendererTraining for QuietRenderer {
    fn update_train(&mut self, _state: MetricState) {}
    fn update_valid(&mut self, _state: MetricState) {}
    fn render_train(&mut self, _item: TrainingProgress, _p: Vec<ProgressType>) {}
    fn render_valid(&mut self, _item: TrainingProgress, _p: Vec<ProgressType>) {}
}

impl MetricsRendererEvaluation for QuietRenderer {
    fn update_test(&mut self, _name: EvaluationName, _state: MetricState) {}
    fn render_test(&mut self, _item: EvaluationProgress, _p: Vec<ProgressType>) {}
}

impl MetricsRenderer for QuietRenderer {
    fn manual_close(&mut self) {}
    fn register_metric(&mut self, _definition: MetricDefinition) {}
}

/// burn-train's renderer off a terminal: one readable line per tenth of an epoch (and at its
/// last iteration) with the latest value of every metric, where burn-train's own
/// `CliMetricsRenderer` prints the `TrainingProgress { .. }` debug form of every iteration.
#[derive(Default)]
pub struct PlainRenderer {
    names: std::collections::HashMap<MetricId, String>,
    train: std::collections::BTreeMap<String, String>,
    valid: std::collections::BTreeMap<String, String>,
}

impl PlainRenderer {
    fn update(&mut self, valid: bool, state: MetricState) {
        let entry = match state {
            MetricState::Generic(e) | MetricState::Numeric(e, _) => e,
        };
        let name = self
            .names
            .get(&entry.metric_id)
            .cloned()
            .unwrap_or_else(|| "metric".into());
        let values = if valid {
            &mut self.valid
        } else {
            &mut self.train
        };
        values.insert(name, entry.serialized_entry.formatted);
    }

    fn line(&self, split: &str, item: &TrainingProgress) {
        let Some(p) = &item.progress else { return };
        let every = (p.items_total / 10).max(1);
        if p.items_processed % every != 0 && p.items_processed != p.items_total {
            return;
        }
        let values = if split == "valid" {
            &self.valid
        } else {
            &self.train
        };
        let metrics: Vec<String> = values.iter().map(|(k, v)| format!("{k} {v}")).collect();
        println!(
            "{split} epoch {}/{}, {}/{} items: {}",
            item.global_progress.items_processed,
            item.global_progress.items_total,
            p.items_processed,
            p.items_total,
            metrics.join(", ")
        );
    }
}

impl MetricsRendererTraining for PlainRenderer {
    fn update_train(&mut self, state: MetricState) {
        self.update(false, state);
    }
    fn update_valid(&mut self, state: MetricState) {
        self.update(true, state);
    }
    fn render_train(&mut self, item: TrainingProgress, _p: Vec<ProgressType>) {
        self.line("train", &item);
    }
    fn render_valid(&mut self, item: TrainingProgress, _p: Vec<ProgressType>) {
        self.line("valid", &item);
    }
}

impl MetricsRendererEvaluation for PlainRenderer {
    fn update_test(&mut self, _name: EvaluationName, state: MetricState) {
        self.update(true, state);
    }
    fn render_test(&mut self, item: EvaluationProgress, _p: Vec<ProgressType>) {
        self.line("test", &TrainingProgress::from(&item));
    }
}

impl MetricsRenderer for PlainRenderer {
    fn manual_close(&mut self) {}
    fn register_metric(&mut self, definition: MetricDefinition) {
        self.names.insert(definition.metric_id, definition.name);
    }
}

/// How the Learner shows progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RendererKind {
    /// burn-train's TUI dashboard when stdout is a terminal ([`crate::console::color`]), else
    /// [`PlainRenderer`].
    Default,
    /// Nothing ([`QuietRenderer`]).
    Quiet,
}

/// Learner settings besides the [`TrainConfig`].
#[derive(Debug, Clone)]
pub struct LearnerOptions {
    /// burn-train's artifact directory: metric logs, `experiment.log`, `checkpoint/`.
    pub artifact_dir: PathBuf,
    /// Register burn-train's file checkpointer (model, optimizer and scheduler records per
    /// epoch under `artifact_dir/checkpoint`, mesh-independent).
    pub checkpoints: bool,
    /// Resume from the Learner checkpoint of this epoch (1-based; needs `checkpoints`); the data
    /// order continues as an unbroken run's.
    pub resume_epoch: Option<usize>,
    /// Renderer.
    pub renderer: RendererKind,
    /// Validation batch size (inference only; what [`crate::train::evaluate`] uses).
    pub valid_batch_size: usize,
    /// Print burn-train's end-of-training summary and write `experiment.log`.
    pub summary: bool,
}

impl Default for LearnerOptions {
    fn default() -> Self {
        Self {
            artifact_dir: std::env::temp_dir().join("burn-dtensor-imdb-learner"),
            checkpoints: true,
            resume_epoch: None,
            renderer: RendererKind::Default,
            valid_batch_size: 2048,
            summary: true,
        }
    }
}

/// What a Learner run reports.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LearnerSummary {
    /// Mode.
    pub mode: Mode,
    /// Mesh (`batch=4,model=2`; empty for single).
    pub mesh: String,
    /// Inner backend.
    pub backend: String,
    /// The training loss of each iteration this run trained.
    pub train_losses: Vec<f32>,
    /// Validation (test split) accuracy after each epoch, as a fraction.
    pub valid_accuracy: Vec<f64>,
    /// Validation loss after each epoch.
    pub valid_loss: Vec<f64>,
    /// Wall time of `launch` (training, validation, checkpoints), s.
    pub wall_s: f64,
}

/// Trains the IMDB MLP with burn-train's Learner on placement `p`: `cfg`'s epochs, batch size,
/// optimizer, learning rate (constant), seed (weights and data order), drop policy and
/// `max_steps`; validation on `valid` after each epoch. Returns the summary and the trained
/// inference model.
///
/// # Errors
/// [`AppError::Config`] for settings the Learner path does not take (`--loss sum`,
/// `imdb_mlp`'s own checkpoint flags, a resume without checkpoints), batch-size errors as
/// `imdb_mlp`'s, layout-map errors; [`LearnerError::LogNotClosed`] when burn-train's metric
/// logging does not finish.
pub fn fit<P: Placement + Send + Sync + 'static>(
    p: Arc<P>,
    cfg: &TrainConfig,
    train: Arc<VectorizedSet>,
    valid: Arc<VectorizedSet>,
    opts: &LearnerOptions,
) -> Result<(LearnerSummary, ImdbMlp<InnerOf<P>>), LearnerError> {
    check_options(cfg, opts)?;
    check_batch(cfg.batch_size, p.batch_axis(), cfg.drop_policy)?;
    match cfg.optimizer {
        OptimizerKind::Sgd => fit_with(p, cfg, train, valid, opts, SgdConfig::new().init()),
        OptimizerKind::Adam => fit_with(p, cfg, train, valid, opts, AdamConfig::new().init()),
    }
}

/// Checks the settings a Learner run cannot take (see [`fit`]).
///
/// # Errors
/// [`AppError::Config`] saying which flag to drop or change.
pub fn check_options(cfg: &TrainConfig, opts: &LearnerOptions) -> Result<(), AppError> {
    crate::train::check_counts(cfg.epochs, cfg.max_steps)?;
    if cfg.loss != LossReduction::Mean {
        return Err(AppError::Config(
            "the Learner trains with the mean loss (what burn-train's loss metric reports); drop `--loss sum`".into(),
        ));
    }
    if cfg.checkpoint_dir.is_some() || cfg.resume.is_some() {
        return Err(AppError::Config(
            "the Learner writes its own checkpoints under the artifact directory: use `--artifact-dir` and `--resume-epoch` instead of `--checkpoint-dir` / `--resume`".into(),
        ));
    }
    if opts.resume_epoch.is_some() && !opts.checkpoints {
        return Err(AppError::Config(
            "`--resume-epoch` needs the checkpointer; drop `--no-checkpoints`".into(),
        ));
    }
    if opts.valid_batch_size == 0 {
        return Err(AppError::Config(
            "the validation batch size must be at least 1".into(),
        ));
    }
    Ok(())
}

fn fit_with<P, O>(
    p: Arc<P>,
    cfg: &TrainConfig,
    train: Arc<VectorizedSet>,
    valid: Arc<VectorizedSet>,
    opts: &LearnerOptions,
    optim: O,
) -> Result<(LearnerSummary, ImdbMlp<InnerOf<P>>), LearnerError>
where
    P: Placement + Send + Sync + 'static,
    O: Optimizer<ImdbMlp<P::AD>, P::AD> + 'static,
{
    let device = p.device();
    let model = init_model(p.as_ref(), cfg.seed)?;
    let first_epoch = opts.resume_epoch.unwrap_or(0);
    let train_loader = ImdbLoader::new(
        train,
        Arc::new(TrainBatcher(p.clone())),
        device.clone(),
        EpochOrder::Shuffled { seed: cfg.seed },
        cfg.batch_size,
        cfg.drop_policy,
        cfg.max_steps,
        first_epoch,
    );
    let valid_loader = ImdbLoader::new(
        valid,
        Arc::new(ValidBatcher(p.clone())),
        device.clone(),
        EpochOrder::Sequential,
        opts.valid_batch_size,
        DropPolicy::Uneven,
        None,
        0,
    );
    let log = RunLog::default();
    let mut training = SupervisedTraining::new(
        &opts.artifact_dir,
        Arc::new(train_loader),
        Arc::new(valid_loader),
    )
    .metrics((AccuracyMetric::new(), LossMetric::new()))
    .with_metric_logger(FileMetricLogger::new(&opts.artifact_dir))
    .with_metric_logger(log.logger())
    .num_epochs(cfg.epochs);
    if opts.checkpoints {
        training =
            training.with_file_checkpointer(NamedMpkFileRecorder::<FullPrecisionSettings>::new());
    }
    if let Some(e) = opts.resume_epoch {
        training = training.checkpoint(e);
    }
    if opts.summary {
        training = training.summary();
    } else {
        training = training.with_application_logger(None);
    }
    match opts.renderer {
        RendererKind::Quiet => training = training.renderer(QuietRenderer),
        RendererKind::Default if !crate::console::color() => {
            training = training.renderer(PlainRenderer::default())
        }
        RendererKind::Default => {}
    }
    let t = Instant::now();
    let result = training.launch(Learner::new(model, optim, cfg.lr));
    let wall_s = t.elapsed().as_secs_f64();
    drop(result.renderer);
    let timeout = Duration::from_secs(60);
    if !log.wait_closed(timeout) {
        return Err(LearnerError::LogNotClosed(timeout));
    }
    let summary = LearnerSummary {
        mode: cfg.mode,
        mesh: p.mesh_desc(),
        backend: p.backend_name(),
        train_losses: log.train_losses(),
        valid_accuracy: log
            .valid_epochs(&AccuracyMetric::<Flex>::new().name())
            .into_iter()
            .map(|a| a / 100.0)
            .collect(),
        valid_loss: log.valid_epochs(&LossMetric::<Flex>::new().name()),
        wall_s,
    };
    Ok((summary, result.model))
}
