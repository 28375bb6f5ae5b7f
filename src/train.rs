//! The training driver of the IMDB example: modes (mesh + layout map), placements (where a
//! batch goes), the training loop with per-epoch evaluation, checkpoints that ignore the mesh,
//! and the JSON summary.
//!
//! The loop is written once, generic over a [`Placement`]: `single` runs the bare inner backend
//! (`Autodiff<I>`), the three parallel modes run `Autodiff<DistributedBackend<I>>`, and the only
//! thing that differs between them is the mesh and the layout map.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use burn::module::{AutodiffModule, Module};
use burn::optim::{AdamConfig, GradientsParams, Optimizer, SgdConfig};
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder};
use burn::tensor::backend::{AutodiffBackend, Backend, BackendTypes};
use burn::tensor::{Int, Tensor, TensorData};
use burn_dtensor::checkpoint::{Checkpoint, ShardedOptimizer, StateDict};
use burn_dtensor::spmd::World;
use burn_dtensor::{
    CommEvent, CommLog, DistributedBackend, DistributedDevice, Layout, LayoutMap, Mesh, UNSHARDED,
    record_comms,
};
use serde::{Deserialize, Serialize};

use crate::batch::{DropPolicy, VectorizedSet, batches, epoch_order};
use crate::checkpoint::{self, Adaptor, OPTIM_PREFIX, lib_err};
use crate::data::tfidf::{SparseCounts, TfIdfVectorizer};
use crate::data::{DataError, imdb};
use crate::model::{ImdbMlp, LossReduction, correct};
use crate::shared_data::{Reader, Writer, once_per_launch, shared};

/// Errors of the example, each saying what to fix.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// Data loading.
    #[error(transparent)]
    Data(#[from] DataError),
    /// Mesh, layout or layout-map problems.
    #[error(transparent)]
    Layout(#[from] burn_dtensor::DTensorError),
    /// Bad flag combination.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Checkpoint read/write.
    #[error("checkpoint `{path}`: {reason}")]
    Checkpoint {
        /// Path.
        path: String,
        /// What went wrong.
        reason: String,
    },
}

/// The parallel mode (the TensorFlow DTensor tutorial's three, plus the bare backend).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// The bare inner backend, no decorator.
    Single,
    /// Mesh `batch=8`, every weight replicated.
    Data,
    /// Mesh `batch=4,model=2`, dense weights sharded over `model`.
    Model,
    /// Mesh `batch=2,feature=2,model=2`, input and `dense1.weight` also sharded over `feature`.
    Spatial,
}

impl Mode {
    /// The tutorial's mesh for this mode.
    pub fn default_mesh(self) -> &'static str {
        match self {
            Mode::Single => "",
            Mode::Data => "batch=8",
            Mode::Model => "batch=4,model=2",
            Mode::Spatial => "batch=2,feature=2,model=2",
        }
    }
    /// The tutorial's layout map for this mode (TOML).
    pub fn default_layout_map(self) -> &'static str {
        match self {
            Mode::Single | Mode::Data => "",
            Mode::Model => {
                "'^dense1\\.weight$' = [\"unsharded\", \"model\"]\n'^dense1\\.bias$' = [\"model\"]\n'^dense2\\.weight$' = [\"model\", \"unsharded\"]\n"
            }
            Mode::Spatial => {
                "'^dense1\\.weight$' = [\"feature\", \"model\"]\n'^dense1\\.bias$' = [\"model\"]\n'^dense2\\.weight$' = [\"model\", \"unsharded\"]\n"
            }
        }
    }
}

/// Which optimizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    /// `burn::optim::Sgd` (the tutorial's, lr 1e-2).
    Sgd,
    /// `burn::optim::Adam`.
    Adam,
}

impl OptimizerKind {
    /// The learning rate when none is given: 1e-3 for Adam, 1e-2 for SGD (the tutorial's).
    pub fn default_lr(self) -> f64 {
        match self {
            OptimizerKind::Adam => 1e-3,
            OptimizerKind::Sgd => 1e-2,
        }
    }
}

/// Everything a run needs besides the data.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainConfig {
    /// Mode.
    pub mode: Mode,
    /// Total epochs (a resumed run trains the epochs after the checkpoint's).
    pub epochs: usize,
    /// At most this many steps per epoch (short runs).
    pub max_steps: Option<usize>,
    /// Global batch size.
    pub batch_size: usize,
    /// Optimizer.
    pub optimizer: OptimizerKind,
    /// Learning rate.
    pub lr: f64,
    /// Seed of the weights and of the data order.
    pub seed: u64,
    /// Loss reduction over the batch.
    pub loss: LossReduction,
    /// Short/uneven batch policy.
    pub drop_policy: DropPolicy,
    /// Evaluate on the test split at each epoch's end.
    pub eval: bool,
    /// Save a checkpoint at each epoch's end here.
    pub checkpoint_dir: Option<PathBuf>,
    /// Resume from this checkpoint directory (written in any mode).
    pub resume: Option<PathBuf>,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            mode: Mode::Data,
            epochs: 2,
            max_steps: None,
            batch_size: 64,
            optimizer: OptimizerKind::Adam,
            lr: 1e-3,
            seed: 42,
            loss: LossReduction::Mean,
            drop_policy: DropPolicy::Uneven,
            eval: true,
            checkpoint_dir: None,
            resume: None,
        }
    }
}

/// Vectorised train and test splits plus the fitted vectorizer.
pub struct Prepared {
    /// 25k train reviews.
    pub train: VectorizedSet,
    /// 25k test reviews.
    pub test: VectorizedSet,
    /// Fitted on the train texts (`max_tokens = 1200`).
    pub vectorizer: TfIdfVectorizer,
}

/// Loads aclImdb from `path` (see [`imdb::resolve_source`]), fits the TF-IDF on the train texts
/// and counts each review's terms (`TfIdfVectorizer::count_rows`): the [`VectorizedSet`]s weigh
/// a batch's rows by the idf when it is built, bitwise `TfIdfVectorizer::transform`'s rows.
///
/// # Errors
/// Data errors (missing or corrupt archive, ...).
pub fn prepare(path: &Path) -> Result<Prepared, AppError> {
    count_prepared(path)?.into_prepared()
}

/// [`prepare`] once per SPMD launch, for every rank: rank 0 resolves the source (`data`, as
/// [`imdb::resolve_source`]; `on_source` is called with the path it found), loads the reviews,
/// fits the TF-IDF and counts each review's terms; it sends every other rank the fitted
/// vectorizer and the sparse term counts ([`SparseCounts`], 38 MB against the dense features'
/// 240 MB on aclImdb, as one [`shared_data`](crate::shared_data) file through
/// [`once_per_launch`]), and every rank holds them in its [`VectorizedSet`]s: bitwise
/// what [`prepare`] gives, with one rank's work instead of every rank's (8 ranks on 2 cores
/// spent 10-12 s each preparing the same data; NOTES.md, session 73). The other ranks never
/// open the archive. In a world of one this is [`prepare`].
///
/// A collective: every rank calls it at the same point. The other ranks wait for rank 0 up to
/// [`PREPARE_TIMEOUT`](crate::shared_data::PREPARE_TIMEOUT) (or the collective timeout, if
/// longer), not the collective timeout: on a first run rank 0 may be downloading the archive.
///
/// # Errors
/// On rank 0 its data errors; on the other ranks [`AppError::Data`] saying that rank 0 could
/// not prepare the data (rank 0's own message says why), or that its file was malformed.
pub fn prepare_once(
    world: &World,
    data: Option<&Path>,
    on_source: impl FnOnce(&Path),
) -> Result<Prepared, AppError> {
    let prepare = || {
        let path = imdb::resolve_source(data)?;
        on_source(&path);
        count_prepared(&path)
    };
    once_per_launch(world, "prepared IMDB data", prepare, Counted::encode, |r| {
        Ok(Counted::decode(r)?)
    })?
    .into_prepared()
}

/// What rank 0 of [`prepare_once`] sends: the fitted vectorizer and each split's term counts
/// and labels.
struct Counted {
    vectorizer: TfIdfVectorizer,
    train: (SparseCounts, Vec<u8>),
    test: (SparseCounts, Vec<u8>),
}

/// [`prepare`] up to the term counts.
fn count_prepared(path: &Path) -> Result<Counted, AppError> {
    let data = imdb::load(path)?;
    let train_texts: Vec<&str> = data.train.iter().map(|r| r.text.as_str()).collect();
    let vectorizer = TfIdfVectorizer::fit(&train_texts, crate::model::INPUT_DIM)?;
    check_vocabulary(vectorizer.vocab_size(), data.train.len())?;
    let set = |reviews: &[imdb::Review]| {
        let texts: Vec<&str> = reviews.iter().map(|r| r.text.as_str()).collect();
        let labels = reviews.iter().map(|r| r.label).collect();
        (vectorizer.count_rows(&texts), labels)
    };
    Ok(Counted {
        train: set(&data.train),
        test: set(&data.test),
        vectorizer,
    })
}

impl Counted {
    /// One [`shared_data`](crate::shared_data) file: per split `offsets` (U64), `columns` and
    /// `counts` (U32) and `labels` (U8), the vectorizer as JSON in the metadata. The arrays are
    /// sent from where they are.
    fn encode(&mut self) -> Result<Writer<'_>, DataError> {
        let json = serde_json::to_string(&self.vectorizer).map_err(|e| shared(e.to_string()))?;
        let mut w = Writer::new().metadata("vectorizer", json);
        for (split, (c, labels)) in [("train", &mut self.train), ("test", &mut self.test)] {
            w = w
                .array(&format!("{split}.offsets"), &mut c.offsets)
                .array(&format!("{split}.columns"), &mut c.columns)
                .array(&format!("{split}.counts"), &mut c.counts)
                .array(&format!("{split}.labels"), labels);
        }
        Ok(w)
    }

    /// The inverse of [`encode`](Self::encode): the received arrays become the counts, not
    /// copied.
    fn decode(mut r: Reader) -> Result<Self, DataError> {
        let vectorizer: TfIdfVectorizer =
            serde_json::from_str(r.metadata("vectorizer")?).map_err(|e| shared(e.to_string()))?;
        let mut split = |split: &str| -> Result<(SparseCounts, Vec<u8>), DataError> {
            let offsets: Vec<u64> = r.take(&format!("{split}.offsets"))?;
            let counts = SparseCounts {
                rows: offsets.len().saturating_sub(1),
                cols: vectorizer.vocab_size(),
                offsets,
                columns: r.take(&format!("{split}.columns"))?,
                counts: r.take(&format!("{split}.counts"))?,
            };
            let labels: Vec<u8> = r.take(&format!("{split}.labels"))?;
            if labels.len() != counts.rows {
                let reason = format!("{split}: {} labels for {} rows", labels.len(), counts.rows);
                return Err(shared(reason));
            }
            Ok((counts, labels))
        };
        let (train, test) = (split("train")?, split("test")?);
        Ok(Counted {
            train,
            test,
            vectorizer,
        })
    }

    /// Both splits as [`VectorizedSet`]s of these counts (weighed per batch).
    fn into_prepared(self) -> Result<Prepared, AppError> {
        let vectorizer = Arc::new(self.vectorizer);
        let set = |(counts, labels): (SparseCounts, Vec<u8>)| {
            VectorizedSet::new(vectorizer.clone(), counts, labels)
        };
        Ok(Prepared {
            train: set(self.train)?,
            test: set(self.test)?,
            vectorizer: TfIdfVectorizer::clone(&vectorizer),
        })
    }
}

/// Checks that the fitted vocabulary fills the model's input width ([`crate::model::INPUT_DIM`]
/// terms, the tutorial's `max_tokens`): a corpus with fewer distinct terms would give TF-IDF
/// rows narrower than `dense1`'s input.
///
/// # Errors
/// [`AppError::Config`] saying how many terms the corpus had.
pub fn check_vocabulary(vocab_size: usize, documents: usize) -> Result<(), AppError> {
    if vocab_size < crate::model::INPUT_DIM {
        return Err(AppError::Config(format!(
            "the training corpus ({documents} reviews) has only {vocab_size} distinct terms (with the OOV slot), fewer than the model's input width {}: use the full aclImdb training set or a larger corpus",
            crate::model::INPUT_DIM
        )));
    }
    Ok(())
}

/// Checks a learning rate: finite and positive.
///
/// # Errors
/// [`AppError::Config`] naming the value.
pub fn check_lr(lr: f64) -> Result<(), AppError> {
    if !(lr.is_finite() && lr > 0.0) {
        return Err(AppError::Config(format!(
            "--lr must be a finite positive number, got {lr}; e.g. --lr 0.001"
        )));
    }
    Ok(())
}

/// Checks up front that a file can be written at `path` (its directory exists and is
/// writable), so that a bad `--summary-json` / `--export` fails before training, not after.
/// An existing file is left untouched; otherwise a probe file of this process's own is created
/// beside it and removed.
///
/// # Errors
/// [`AppError::Config`] naming the flag and the path.
pub fn check_output_file(flag: &str, path: &Path) -> Result<(), AppError> {
    let bad = |e: &dyn std::fmt::Display| {
        AppError::Config(format!(
            "{flag} {}: cannot write there ({e}); pick a path in an existing, writable directory",
            path.display()
        ))
    };
    if path.is_dir() {
        return Err(bad(&"it is a directory"));
    }
    if path.exists() {
        std::fs::OpenOptions::new()
            .append(true)
            .open(path)
            .map_err(|e| bad(&e))?;
        return Ok(());
    }
    // A probe of this process's own beside `path`, never `path` itself: the ranks of a
    // multi-process run all check the same path, and one rank's probe removed under another's
    // check made that check fail (seen under `sbatch`).
    let name = path.file_name().map_or_else(
        || std::ffi::OsString::from("output"),
        std::ffi::OsStr::to_os_string,
    );
    let mut probe = std::ffi::OsString::from(".");
    probe.push(&name);
    probe.push(format!(".probe-{}", std::process::id()));
    let probe = path.with_file_name(probe);
    std::fs::File::create(&probe).map_err(|e| bad(&e))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// Where batches and the model go.
pub trait Placement {
    /// The training backend.
    type AD: AutodiffBackend;
    /// The training device (a mesh for distributed placements).
    fn device(&self) -> <Self::AD as BackendTypes>::Device;
    /// A training batch: features `[n, 1200]`, labels `[n]`.
    ///
    /// # Errors
    /// Layout errors.
    #[allow(clippy::type_complexity)]
    fn train_batch(
        &self,
        x: TensorData,
        y: TensorData,
    ) -> Result<(Tensor<Self::AD, 2>, Tensor<Self::AD, 1, Int>), AppError>;
    /// An evaluation batch on the inner (non-autodiff) backend.
    ///
    /// # Errors
    /// Layout errors.
    #[allow(clippy::type_complexity)]
    fn valid_batch(
        &self,
        x: TensorData,
        y: TensorData,
    ) -> Result<
        (
            Tensor<<Self::AD as AutodiffBackend>::InnerBackend, 2>,
            Tensor<<Self::AD as AutodiffBackend>::InnerBackend, 1, Int>,
        ),
        AppError,
    >;
    /// Lays out the model's parameters.
    ///
    /// # Errors
    /// Layout-map errors.
    fn prepare_model(&self, model: ImdbMlp<Self::AD>) -> Result<ImdbMlp<Self::AD>, AppError>;
    /// The model's parameters and the optimizer's state as a checkpoint's state dict, each
    /// tensor in its current layout (its shards; the bare backend's tensors whole).
    ///
    /// # Errors
    /// Checkpoint errors (an optimizer state that cannot be saved).
    fn state_dict<X: ShardedOptimizer<<Self::AD as AutodiffBackend>::InnerBackend>>(
        &self,
        model: &ImdbMlp<Self::AD>,
        optim: &Adaptor<X, Self::AD>,
    ) -> Result<StateDict, AppError>;
    /// Loads a checkpoint's parameters and optimizer state into `model` (laid out by
    /// [`Placement::prepare_model`]) and `optim`: each process reads only its shards.
    ///
    /// # Errors
    /// Checkpoint errors naming the tensor and file.
    #[allow(clippy::type_complexity)]
    fn load_state<X: ShardedOptimizer<<Self::AD as AutodiffBackend>::InnerBackend>>(
        &self,
        ckpt: &Checkpoint,
        model: ImdbMlp<Self::AD>,
        optim: Adaptor<X, Self::AD>,
    ) -> Result<(ImdbMlp<Self::AD>, Adaptor<X, Self::AD>), AppError>;
    /// The mesh, e.g. `batch=4,model=2` (empty for single).
    fn mesh_desc(&self) -> String;
    /// Inner backend name.
    fn backend_name(&self) -> String;
    /// Size of the mesh's `batch` axis (1 without one).
    fn batch_axis(&self) -> usize {
        1
    }
    /// The gradients of one step made ready for the optimizer: on a mesh, each in its
    /// parameter's layout ([`burn_dtensor::settle_gradients`]: DDP's all-reduce, in gradient
    /// buckets across processes); on the bare backend as they are.
    ///
    /// # Errors
    /// Layout errors (a gradient on another mesh than its parameter).
    fn settle(
        &self,
        grads: GradientsParams,
        _model: &ImdbMlp<Self::AD>,
    ) -> Result<GradientsParams, AppError> {
        Ok(grads)
    }
}

/// The bare inner backend on one device.
pub struct Single<I: Backend> {
    /// The device.
    pub device: I::Device,
}

impl<I: Backend> Placement for Single<I> {
    type AD = burn::backend::Autodiff<I>;
    fn device(&self) -> I::Device {
        self.device.clone()
    }
    fn train_batch(
        &self,
        x: TensorData,
        y: TensorData,
    ) -> Result<(Tensor<Self::AD, 2>, Tensor<Self::AD, 1, Int>), AppError> {
        Ok((
            Tensor::from_data(x.convert::<I::FloatElem>(), &self.device),
            Tensor::from_data(y.convert::<I::IntElem>(), &self.device),
        ))
    }
    fn valid_batch(
        &self,
        x: TensorData,
        y: TensorData,
    ) -> Result<(Tensor<I, 2>, Tensor<I, 1, Int>), AppError> {
        Ok((
            Tensor::from_data(x.convert::<I::FloatElem>(), &self.device),
            Tensor::from_data(y.convert::<I::IntElem>(), &self.device),
        ))
    }
    /// The weights every mode starts from: drawn by the decorator's counter-based generator on
    /// a mesh of one (the values of every layout, see `burn_dtensor::random`), copied onto the
    /// bare backend, so that `--mode single` and the sharded modes start alike for a seed.
    fn prepare_model(&self, model: ImdbMlp<Self::AD>) -> Result<ImdbMlp<Self::AD>, AppError> {
        let one = DistributedDevice::new(Mesh::single(self.device.clone()));
        let (w1, w2) = (
            model.dense1.weight.lazy_shape(),
            model.dense2.weight.lazy_shape(),
        );
        let twin = ImdbMlp::<DistributedBackend<I>>::with_dims(w1[0], w1[1], w2[1], &one);
        let drawn = crate::model::param_values(&twin);
        Ok(crate::model::with_param_values(model, drawn))
    }
    fn state_dict<X: ShardedOptimizer<I>>(
        &self,
        model: &ImdbMlp<Self::AD>,
        optim: &Adaptor<X, Self::AD>,
    ) -> Result<StateDict, AppError> {
        let mut sd = StateDict::from_module_whole(model).map_err(lib_err)?;
        sd.insert_optimizer_whole(OPTIM_PREFIX, model, optim)
            .map_err(lib_err)?;
        Ok(sd)
    }
    fn load_state<X: ShardedOptimizer<I>>(
        &self,
        ckpt: &Checkpoint,
        model: ImdbMlp<Self::AD>,
        optim: Adaptor<X, Self::AD>,
    ) -> Result<(ImdbMlp<Self::AD>, Adaptor<X, Self::AD>), AppError> {
        let model = ckpt
            .load_module_whole(model, &self.device)
            .map_err(lib_err)?;
        let optim = ckpt
            .load_optimizer_whole(OPTIM_PREFIX, &model, optim)
            .map_err(lib_err)?;
        Ok((model, optim))
    }
    fn mesh_desc(&self) -> String {
        String::new()
    }
    fn backend_name(&self) -> String {
        I::name(&self.device)
    }
}

/// `DistributedBackend<I>` on a mesh with a layout map.
pub struct Distributed<I: Backend> {
    /// The mesh.
    pub mesh: Mesh<I::Device>,
    /// Parameter layouts.
    pub layout_map: LayoutMap,
    /// Input layout: `[batch, feature]` where the mesh has those axes.
    pub input_layout: Layout,
    /// Label layout: `[batch]`.
    pub label_layout: Layout,
}

/// This process's share of `devices` virtual copies of `device` (`--devices`): all of them
/// alone, `devices / N` under `mpirun -n N` (starting the SPMD world).
///
/// # Errors
/// [`AppError::Config`] for more than [`burn_dtensor::MAX_VIRTUAL_POSITIONS`] devices (checked
/// before any is made) or a count the processes cannot split evenly; the SPMD start-up errors.
pub(crate) fn process_devices<D: Clone>(devices: usize, device: D) -> Result<Vec<D>, AppError> {
    if devices > burn_dtensor::MAX_VIRTUAL_POSITIONS {
        return Err(AppError::Config(format!(
            "--devices {devices} is more than the {} virtual devices a mesh may have",
            burn_dtensor::MAX_VIRTUAL_POSITIONS
        )));
    }
    let world = burn_dtensor::spmd::init()?;
    if !devices.is_multiple_of(world.size()) {
        return Err(AppError::Config(format!(
            "--devices {devices} cannot be split over {} processes: give a multiple of the process count",
            world.size()
        )));
    }
    Ok(vec![device; devices / world.size()])
}

impl<I: Backend> Distributed<I> {
    /// Builds the placement: mesh `axes` over `devices` virtual copies of `device`
    /// (`devices` must equal the product of the axis sizes), parameters laid out by `layout_map`,
    /// the input sharded `[batch, feature]` over whichever of those axes the mesh has.
    ///
    /// Under `mpirun -n N` the mesh spans the N processes ([`Mesh::spmd`]): each process owns
    /// `devices / N` virtual copies of `device` (one contiguous block of the mesh); alone, it owns
    /// all of them. The training code is the same either way.
    ///
    /// # Errors
    /// Mesh parse errors, [`burn_dtensor::DTensorError::DeviceCountMismatch`], `devices` not
    /// divisible by the process count, the SPMD start-up errors of [`Mesh::spmd`].
    pub fn new(
        mesh_spec: &str,
        devices: usize,
        device: I::Device,
        layout_map: LayoutMap,
    ) -> Result<Self, AppError> {
        let mesh = Mesh::parse_spmd(mesh_spec, process_devices(devices, device)?)?;
        let has = |a: &str| mesh.topology().axis_index(a).is_ok();
        let spec = [
            if has("batch") { "batch" } else { UNSHARDED },
            if has("feature") { "feature" } else { UNSHARDED },
        ];
        let input_layout = Layout::new(&mesh, spec)?;
        let label_layout = Layout::new(&mesh, [spec[0]])?;
        // Fail early on axes the map names but the mesh lacks.
        for r in layout_map.rules() {
            Layout::new(&mesh, &r.spec)?;
        }
        Ok(Self {
            mesh,
            layout_map,
            input_layout,
            label_layout,
        })
    }
}

impl<I: Backend> Distributed<I> {
    /// The same placement with stacked execution on or off ([`Mesh::with_stacked_execution`]):
    /// off, every op runs per device, the arithmetic of a mesh of distinct devices and of a
    /// multi-process run.
    ///
    /// # Errors
    /// None in practice (the layouts are rebuilt on the new mesh).
    pub fn with_stacked_execution(self, on: bool) -> Result<Self, AppError> {
        let mesh = self.mesh.with_stacked_execution(on);
        let spec = self.input_layout.sharding_spec();
        let input_layout = Layout::new(&mesh, &spec)?;
        let label_layout = Layout::new(&mesh, &spec[..1])?;
        Ok(Self {
            mesh,
            input_layout,
            label_layout,
            ..self
        })
    }
}

impl<I: Backend> Placement for Distributed<I> {
    type AD = burn::backend::Autodiff<DistributedBackend<I>>;
    fn device(&self) -> DistributedDevice<I::Device> {
        DistributedDevice::new(self.mesh.clone())
    }
    fn train_batch(
        &self,
        x: TensorData,
        y: TensorData,
    ) -> Result<(Tensor<Self::AD, 2>, Tensor<Self::AD, 1, Int>), AppError> {
        let (x, y) = (x.convert::<I::FloatElem>(), y.convert::<I::IntElem>());
        Ok((
            burn_dtensor::distribute(x, &self.input_layout)?,
            burn_dtensor::distribute(y, &self.label_layout)?,
        ))
    }
    fn valid_batch(
        &self,
        x: TensorData,
        y: TensorData,
    ) -> Result<
        (
            Tensor<DistributedBackend<I>, 2>,
            Tensor<DistributedBackend<I>, 1, Int>,
        ),
        AppError,
    > {
        let (x, y) = (x.convert::<I::FloatElem>(), y.convert::<I::IntElem>());
        Ok((
            burn_dtensor::distribute(x, &self.input_layout)?,
            burn_dtensor::distribute(y, &self.label_layout)?,
        ))
    }
    fn prepare_model(&self, model: ImdbMlp<Self::AD>) -> Result<ImdbMlp<Self::AD>, AppError> {
        Ok(self.layout_map.apply(model, self.mesh.topology())?.0)
    }
    fn settle(
        &self,
        grads: GradientsParams,
        model: &ImdbMlp<Self::AD>,
    ) -> Result<GradientsParams, AppError> {
        Ok(burn_dtensor::settle_gradients(grads, model)?)
    }
    fn state_dict<X: ShardedOptimizer<DistributedBackend<I>>>(
        &self,
        model: &ImdbMlp<Self::AD>,
        optim: &Adaptor<X, Self::AD>,
    ) -> Result<StateDict, AppError> {
        let mut sd = StateDict::from_module(model).map_err(lib_err)?;
        sd.insert_optimizer(OPTIM_PREFIX, model, optim)
            .map_err(lib_err)?;
        Ok(sd)
    }
    fn load_state<X: ShardedOptimizer<DistributedBackend<I>>>(
        &self,
        ckpt: &Checkpoint,
        model: ImdbMlp<Self::AD>,
        optim: Adaptor<X, Self::AD>,
    ) -> Result<(ImdbMlp<Self::AD>, Adaptor<X, Self::AD>), AppError> {
        let model = ckpt.load_module(model).map_err(lib_err)?;
        let optim = ckpt
            .load_optimizer(OPTIM_PREFIX, &model, optim)
            .map_err(lib_err)?;
        Ok((model, optim))
    }
    fn mesh_desc(&self) -> String {
        self.mesh.to_string()
    }
    fn backend_name(&self) -> String {
        I::name(&self.mesh.devices()[0])
    }
    fn batch_axis(&self) -> usize {
        self.mesh.axis_size("batch").unwrap_or(1)
    }
}

/// Progress callbacks (the example draws bars; tests pass [`Quiet`]).
pub trait Progress {
    /// An epoch starts with `steps` steps.
    fn epoch_start(&mut self, _epoch: usize, _steps: usize) {}
    /// A step ended.
    fn step(&mut self, _loss: f32, _accuracy: f32) {}
    /// An epoch ended.
    fn epoch_end(&mut self, _epoch: usize, _test_accuracy: Option<f64>, _comm: &CommLog) {}
    /// The run resumed from the checkpoint `dir`, written after `epochs_done` epochs.
    fn resumed(&mut self, _epochs_done: usize, _dir: &Path) {}
}

/// No output.
pub struct Quiet;
impl Progress for Quiet {}

/// The JSON summary of a run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    /// Mode.
    pub mode: Mode,
    /// Mesh (`batch=4,model=2`; empty for single).
    pub mesh: String,
    /// Inner backend.
    pub backend: String,
    /// Steps trained in this run.
    pub steps: usize,
    /// Loss of each step trained in this run.
    pub train_losses: Vec<f32>,
    /// Training-batch accuracy of each step trained in this run.
    #[serde(default)]
    pub train_accuracy: Vec<f32>,
    /// Test accuracy after the last epoch (None when evaluation was off).
    pub test_accuracy: Option<f64>,
    /// Test accuracy after each epoch of this run.
    pub epoch_test_accuracy: Vec<f64>,
    /// Median wall time of a training step, ms.
    pub median_step_ms: f64,
    /// Wall time of the run (training and evaluation, excluding data preparation), s.
    pub wall_s: f64,
    /// The collectives of one training step (the first of the last epoch), as this process saw
    /// them (see `burn_dtensor::CommEvent::across_processes`).
    pub comm_per_step: Vec<CommEvent>,
    /// Bytes of one step by link kind (this process's devices): in process, across processes.
    #[serde(default)]
    pub comm_bytes_in_process: u64,
    /// See `comm_bytes_in_process`.
    #[serde(default)]
    pub comm_bytes_across_processes: u64,
    /// Processes of the run (1 without `mpirun`).
    #[serde(default = "one")]
    pub world_size: usize,
    /// Rank of the process that wrote this summary (0: the chief writes it).
    #[serde(default)]
    pub rank: usize,
    /// The configuration.
    pub config: TrainConfig,
}

fn one() -> usize {
    1
}

pub use crate::checkpoint::CheckpointState;

type Rec = NamedMpkFileRecorder<FullPrecisionSettings>;

fn ck_err(path: &Path, e: impl std::fmt::Display) -> AppError {
    AppError::Checkpoint {
        path: path.display().to_string(),
        reason: e.to_string(),
    }
}

/// Trains per `cfg` on `data` with placement `p`.
///
/// # Errors
/// Layout, checkpoint and configuration errors.
pub fn train<P: Placement>(
    p: &P,
    cfg: &TrainConfig,
    data: &Prepared,
    progress: &mut dyn Progress,
) -> Result<(Summary, ImdbMlp<P::AD>), AppError> {
    match cfg.optimizer {
        OptimizerKind::Sgd => train_with(p, cfg, data, progress, SgdConfig::new().init()),
        OptimizerKind::Adam => train_with(p, cfg, data, progress, AdamConfig::new().init()),
    }
}

/// The updated model, the loss and the logits of one [`step`].
pub type Stepped<B> = (ImdbMlp<B>, Tensor<B, 1>, Tensor<B, 2>);

/// One training step on placement `p`: forward, loss, backward, the gradients settled
/// ([`Placement::settle`]), optimizer update. Returns the updated model, the loss and the logits
/// (for accuracy).
///
/// # Errors
/// Layout errors from settling the gradients.
pub fn step<P: Placement, O: Optimizer<ImdbMlp<P::AD>, P::AD>>(
    p: &P,
    model: ImdbMlp<P::AD>,
    optim: &mut O,
    (x, y): (Tensor<P::AD, 2>, Tensor<P::AD, 1, Int>),
    lr: f64,
    reduction: LossReduction,
) -> Result<Stepped<P::AD>, AppError> {
    let logits = model.forward(x);
    let loss = model.loss(logits.clone(), y, reduction);
    let grads = p.settle(GradientsParams::from_grads(loss.backward(), &model), &model)?;
    Ok((optim.step(lr, model, grads), loss, logits))
}

/// Checks the step counts: `--epochs` and `--max-steps` of 0 would train nothing and report a
/// zero loss and accuracy as if they were results.
///
/// # Errors
/// [`AppError::Config`] naming the flag.
pub fn check_counts(epochs: usize, max_steps: Option<usize>) -> Result<(), AppError> {
    if epochs == 0 {
        return Err(AppError::Config(
            "--epochs 0 trains nothing: give at least 1 (the total, resumed epochs included)"
                .into(),
        ));
    }
    if max_steps == Some(0) {
        return Err(AppError::Config(
            "--max-steps 0 trains nothing: give at least 1, or leave it out for whole epochs"
                .into(),
        ));
    }
    Ok(())
}

/// Every field of `cfg` as `(name, value)`, for the SPMD start-up agreement
/// ([`burn_dtensor::spmd::World::agree_fields`]): a mismatch names the field.
pub fn config_fields(cfg: &TrainConfig) -> Vec<(String, String)> {
    let serde_json::Value::Object(map) = serde_json::to_value(cfg).expect("a plain struct") else {
        unreachable!("TrainConfig serialises to an object")
    };
    let name = |k: &str| -> String {
        // The field names of TrainConfig, as flags where there is one.
        let flag = match k {
            "mode" => "--mode",
            "epochs" => "--epochs",
            "max_steps" => "--max-steps",
            "batch_size" => "--batch-size",
            "optimizer" => "--optimizer",
            "lr" => "--lr",
            "seed" => "--seed",
            "loss" => "--loss",
            "drop_policy" => "--drop-policy",
            "eval" => "evaluation (--no-eval)",
            "checkpoint_dir" => "--checkpoint-dir",
            "resume" => "--resume",
            other => other,
        };
        flag.to_string()
    };
    map.into_iter()
        .map(|(k, v)| {
            let v = v.as_str().map_or_else(|| v.to_string(), str::to_string);
            (name(&k), v)
        })
        .collect()
}

/// Checks a global batch size against the batch axis under a drop policy.
///
/// # Errors
/// [`AppError::Config`] when `policy` is [`DropPolicy::Strict`] and `batch_axis` does not divide
/// `batch_size`, or when `batch_size` is 0.
pub fn check_batch(
    batch_size: usize,
    batch_axis: usize,
    policy: DropPolicy,
) -> Result<(), AppError> {
    if batch_size == 0 {
        return Err(AppError::Config("--batch-size must be at least 1".into()));
    }
    if policy == DropPolicy::Strict && !batch_size.is_multiple_of(batch_axis) {
        return Err(AppError::Config(format!(
            "--batch-size {batch_size} is not divisible by the batch axis ({batch_axis}) under --drop-policy strict; pick a multiple of {batch_axis} or use --drop-policy uneven"
        )));
    }
    Ok(())
}

fn train_with<P: Placement, X: ShardedOptimizer<<P::AD as AutodiffBackend>::InnerBackend>>(
    p: &P,
    cfg: &TrainConfig,
    data: &Prepared,
    progress: &mut dyn Progress,
    mut optim: Adaptor<X, P::AD>,
) -> Result<(Summary, ImdbMlp<P::AD>), AppError> {
    check_batch(cfg.batch_size, p.batch_axis(), cfg.drop_policy)?;
    let mut model = init_model(p, cfg.seed)?;
    let mut start_epoch = 0;
    // Losses of the runs before a resumed checkpoint, carried into the checkpoints this run writes.
    let mut prior_losses = Vec::new();
    if let Some(dir) = &cfg.resume {
        let loaded = checkpoint::read(dir)?;
        start_epoch = loaded.state.epochs_done;
        prior_losses = loaded.state.train_losses.clone();
        progress.resumed(start_epoch, dir);
        (model, optim) = loaded.load_into(p, model, optim, cfg.optimizer)?;
    }
    let t_run = Instant::now();
    let n = data.train.len();
    let mut losses = Vec::new();
    let mut accuracies = Vec::new();
    let mut step_ms = Vec::new();
    let mut test_accs = Vec::new();
    let mut comm = CommLog::default();
    for epoch in start_epoch..cfg.epochs {
        let order = epoch_order(n, cfg.seed, epoch);
        let mut bs = batches(&order, cfg.batch_size, cfg.drop_policy);
        if let Some(m) = cfg.max_steps {
            bs.truncate(m);
        }
        progress.epoch_start(epoch, bs.len());
        for (s, idx) in bs.iter().enumerate() {
            let t0 = Instant::now();
            let (x, y) = data.train.batch(idx);
            let (res, log) = record_comms(|| -> Result<_, AppError> {
                let (x, y) = p.train_batch(x, y)?;
                let (next, loss, logits) = step(
                    p,
                    model.clone(),
                    &mut optim,
                    (x, y.clone()),
                    cfg.lr,
                    cfg.loss,
                )?;
                let loss_v = loss
                    .into_scalar()
                    .to_string()
                    .parse::<f32>()
                    .unwrap_or(f32::NAN);
                let acc = correct(logits.detach(), y) as f32 / idx.len() as f32;
                Ok((next, loss_v, acc))
            });
            let (next, loss_v, acc) = res?;
            model = next;
            if s == 0 {
                comm = log;
            }
            step_ms.push(t0.elapsed().as_secs_f64() * 1e3);
            losses.push(loss_v);
            accuracies.push(acc);
            progress.step(loss_v, acc);
        }
        let test_acc = if cfg.eval {
            Some(evaluate(p, &model, &data.test)?)
        } else {
            None
        };
        if let Some(a) = test_acc {
            test_accs.push(a);
        }
        progress.epoch_end(epoch, test_acc, &comm);
        if let Some(dir) = &cfg.checkpoint_dir {
            let mut all = prior_losses.clone();
            all.extend_from_slice(&losses);
            let st = CheckpointState {
                epochs_done: epoch + 1,
                mode: cfg.mode,
                optimizer: cfg.optimizer,
                train_losses: all,
            };
            checkpoint::save(p, dir, &model, &optim, &st, &data.vectorizer)?;
        }
    }
    let mut sorted = step_ms.clone();
    sorted.sort_by(f64::total_cmp);
    let median = if sorted.is_empty() {
        0.0
    } else {
        sorted[sorted.len() / 2]
    };
    let summary = Summary {
        mode: cfg.mode,
        mesh: p.mesh_desc(),
        backend: p.backend_name(),
        steps: losses.len(),
        train_losses: losses,
        train_accuracy: accuracies,
        test_accuracy: test_accs.last().copied(),
        epoch_test_accuracy: test_accs,
        median_step_ms: median,
        wall_s: t_run.elapsed().as_secs_f64(),
        comm_bytes_in_process: comm.bytes_by_link().0,
        comm_bytes_across_processes: comm.bytes_by_link().1,
        comm_per_step: comm.events,
        world_size: burn_dtensor::spmd::init()?.size(),
        rank: burn_dtensor::spmd::init()?.rank(),
        config: cfg.clone(),
    };
    Ok((summary, model))
}

/// Which inner device a process trains on (`--device`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceChoice {
    /// A GPU backend takes the GPU the resource spec assigns this rank (`gpus`), else, in a
    /// multi-process run, the GPU of its local rank on its node (`srun`, `mpirun`: local rank
    /// `i` takes GPU `i` of those visible, e.g. of Slurm's `CUDA_VISIBLE_DEVICES`); a CPU
    /// backend, or a run of one process, its default device.
    #[default]
    Auto,
    /// The backend's device of this index (of its default device type).
    Index(usize),
}

impl std::str::FromStr for DeviceChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            n => n
                .parse()
                .map(Self::Index)
                .map_err(|_| format!("`{s}` is neither `auto` nor a device index (0, 1, ...)")),
        }
    }
}

impl std::fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Auto => write!(f, "auto"),
            Self::Index(i) => write!(f, "{i}"),
        }
    }
}

/// This process's inner device for `choice` ([`DeviceChoice`]): the launch environment
/// ([`burn_dtensor::spmd::LaunchEnv`]) gives the local rank and any GPU the resource spec
/// assigned; a GPU ([`burn_dtensor::spmd::exclusive_device`]) is taken by index among the
/// backend's devices of the default device's type.
///
/// # Errors
/// [`AppError::Config`] when the index is not a device of the backend on this node (more
/// processes on a node than GPUs, or a wrong `--device`), naming the count and the fix.
pub fn process_device<I: Backend>(choice: DeviceChoice) -> Result<I::Device, AppError> {
    use burn::tensor::backend::{Device, DeviceId};
    let default = I::Device::default();
    let launch = burn_dtensor::spmd::LaunchEnv::detect().ok();
    let pick = match (choice, &launch) {
        (DeviceChoice::Index(i), _) => Some((i, "`--device`".to_string())),
        (DeviceChoice::Auto, Some(l)) => match l.gpu {
            Some(g) => Some((g, "the resource spec's `gpus`".to_string())),
            None if l.is_multi_process() && burn_dtensor::spmd::exclusive_device(&default) => {
                Some((
                    l.local_rank,
                    format!("local rank {} of {}", l.local_rank, l.source),
                ))
            }
            None => None,
        },
        (DeviceChoice::Auto, None) => None,
    };
    let Some((index, why)) = pick else {
        return Ok(default);
    };
    let type_id = default.to_id().type_id;
    let count = I::device_count(type_id);
    if index >= count {
        return Err(AppError::Config(format!(
            "device {index} (from {why}) does not exist: the {} backend sees {count} device(s) \
             like {default:?} here; start at most {count} process(es) per node (`srun \
             --ntasks-per-node`, the resource spec's `gpus`) or pick one with `--device N`",
            I::name(&default)
        )));
    }
    Ok(I::Device::from_id(DeviceId::new(type_id, index as u16)))
}

/// The model a run starts from: the backend seeded with `seed`, a fresh [`ImdbMlp`] on the
/// placement's device, its parameters laid out by the placement (both `imdb_mlp`'s loop and the
/// Learner example start here, so equal seeds give equal weights).
///
/// # Errors
/// Layout-map errors.
pub fn init_model<P: Placement>(p: &P, seed: u64) -> Result<ImdbMlp<P::AD>, AppError> {
    let device = p.device();
    <P::AD as Backend>::seed(&device, seed);
    // The stream every mode draws its weights from (the bare backend's own generator differs).
    burn_dtensor::random::seed(seed);
    p.prepare_model(ImdbMlp::new(&device))
}

/// The mesh spec and layout map of a run: `mesh` and the TOML file `layout_map` where given,
/// else the tutorial's for `mode` ([`Mode::default_mesh`], [`Mode::default_layout_map`]).
///
/// # Errors
/// An unreadable or malformed layout map file.
pub fn mesh_and_layout_map(
    mode: Mode,
    mesh: Option<&str>,
    layout_map: Option<&Path>,
) -> Result<(String, LayoutMap), AppError> {
    let mesh = mesh.unwrap_or(mode.default_mesh()).to_string();
    let map = match layout_map {
        Some(f) => LayoutMap::from_file(f)?,
        None => LayoutMap::from_toml_str(mode.default_layout_map())?,
    };
    Ok((mesh, map))
}

/// Test accuracy of `model` (inference mode: BatchNorm uses its running statistics).
///
/// # Errors
/// Layout errors.
pub fn evaluate<P: Placement>(
    p: &P,
    model: &ImdbMlp<P::AD>,
    set: &VectorizedSet,
) -> Result<f64, AppError> {
    let m = model.valid();
    let idx: Vec<usize> = (0..set.len()).collect();
    let mut ok = 0;
    for chunk in idx.chunks(2048) {
        let (x, y) = set.batch(chunk);
        let (x, y) = p.valid_batch(x, y)?;
        ok += correct(m.forward(x), y);
    }
    Ok(ok as f64 / set.len().max(1) as f64)
}

/// Writes the trained weights for plain single-device inference (no layouts: records gather
/// each tensor whole) to `file` (`.mpk` added), and the vectorizer beside it
/// (`<file>.vectorizer.json`).
///
/// # Errors
/// Write errors.
pub fn export<B: Backend>(
    model: ImdbMlp<B>,
    vectorizer: &TfIdfVectorizer,
    file: &Path,
) -> Result<(), AppError> {
    model
        .save_file(file.to_path_buf(), &Rec::new())
        .map_err(|e| ck_err(file, e))?;
    vectorizer.save(&vectorizer_path(file))?;
    Ok(())
}

/// Where [`export`] puts the vectorizer.
pub fn vectorizer_path(file: &Path) -> PathBuf {
    let mut s = file.as_os_str().to_owned();
    s.push(".vectorizer.json");
    PathBuf::from(s)
}

/// Loads an exported model on a plain backend.
///
/// # Errors
/// Read errors.
pub fn load_exported<B: Backend>(
    file: &Path,
    device: &B::Device,
) -> Result<(ImdbMlp<B>, TfIdfVectorizer), AppError> {
    let mut mpk = file.as_os_str().to_owned();
    mpk.push(".mpk");
    let model = ImdbMlp::<B>::new(device)
        .load_file(file.to_path_buf(), &Rec::new(), device)
        .map_err(|e| {
            ck_err(
                Path::new(&mpk),
                format!(
                    "cannot load it as the exported model ({e}); the file is missing, truncated or not written by `imdb_mlp --export`"
                ),
            )
        })?;
    let v = TfIdfVectorizer::load(&vectorizer_path(file))?;
    Ok((model, v))
}

/// The positive-class probability (softmax over the two logits) of each review text under
/// `model` (the tutorial's SavedModel inference): texts are vectorised with `vectorizer`, the
/// batch `[texts.len(), 1200]` runs in inference mode on `device`.
///
/// # Errors
/// [`AppError::Config`] for a text with no word of the vocabulary (empty, or only unknown
/// words): its TF-IDF row would carry nothing but the out-of-vocabulary count, and the answer
/// would be the model's biases, not a judgement of the text.
pub fn classify<B: Backend>(
    model: &ImdbMlp<B>,
    vectorizer: &TfIdfVectorizer,
    texts: &[String],
    device: &B::Device,
) -> Result<Vec<f32>, AppError> {
    let m = vectorizer.transform(texts);
    for (i, t) in texts.iter().enumerate() {
        // Index 0 is the out-of-vocabulary bucket.
        let row = &m.values[i * m.cols..(i + 1) * m.cols];
        if row[1..].iter().all(|v| *v == 0.0) {
            let why = if t.trim().is_empty() {
                "is empty"
            } else {
                "has no word of the model's vocabulary"
            };
            return Err(AppError::Config(format!(
                "text {} {why}, so the model cannot classify it; give a review in English (a few words at least)",
                i + 1
            )));
        }
    }
    let x = Tensor::<B, 2>::from_data(TensorData::new(m.values, [m.rows, m.cols]), device);
    let p = burn::tensor::activation::softmax(model.forward(x), 1)
        .into_data()
        .to_vec::<f32>()
        .map_err(|e| AppError::Config(format!("reading the probabilities: {e:?}")))?;
    Ok(p.chunks(2).map(|c| c[1]).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared_data::loopback;
    use burn::data::dataset::Dataset;

    /// A [`Counted`] of a few reviews (a vocabulary of 5), as rank 0 would send it.
    fn counted() -> Counted {
        let train = ["the cat sat", "the dog ran", "a cat and a dog", "the end"];
        let test = ["dog dog", "unknown words", "the cat"];
        let vectorizer = TfIdfVectorizer::fit(&train, 5).unwrap();
        Counted {
            train: (vectorizer.count_rows(&train), vec![0, 1, 1, 0]),
            test: (vectorizer.count_rows(&test), vec![1, 0, 1]),
            vectorizer,
        }
    }

    #[test]
    fn the_shared_preparation_buffer_round_trips_to_the_dense_features() {
        let mut sent = counted();
        let got = Counted::decode(loopback(sent.encode().unwrap()).unwrap()).unwrap();
        assert_eq!(got.vectorizer, sent.vectorizer);
        assert_eq!(got.train, sent.train);
        assert_eq!(got.test, sent.test);
        // The receiving rank's batches are the vectorizer's dense transform, bitwise, in any
        // order of rows.
        let prepared = got.into_prepared().unwrap();
        let test = ["dog dog", "unknown words", "the cat"];
        let dense = sent.vectorizer.transform(&test);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let (x, y) = prepared.test.batch(&[2, 0, 1, 2]);
        assert_eq!(x.shape.to_vec(), vec![4, 5]);
        let want: Vec<f32> = [2, 0, 1, 2]
            .iter()
            .flat_map(|&i| dense.row(i).unwrap().to_vec())
            .collect();
        assert_eq!(bits(x.as_slice::<f32>().unwrap()), bits(&want));
        assert_eq!(y.as_slice::<i64>().unwrap(), &[1, 1, 0, 1]);
        // "dog dog" has a non-zero entry, so the check above is not all zeros.
        assert!(want.iter().any(|&v| v > 0.0));
        assert_eq!(prepared.test.width(), 5);
        assert_eq!(prepared.train.labels(), &[0, 1, 1, 0]);
        // One example through `burn::data`'s `Dataset`, and a slice of the set.
        let example = Dataset::get(&prepared.test, 1).unwrap();
        assert_eq!(bits(&example.features), bits(dense.row(1).unwrap()));
        assert!(Dataset::get(&prepared.test, 3).is_none());
        let tail = prepared.test.slice(1..3);
        assert_eq!((tail.len(), tail.labels()), (2, &[0u8, 1][..]));
        let (x, _) = tail.batch(&[1]);
        assert_eq!(
            bits(x.as_slice::<f32>().unwrap()),
            bits(dense.row(2).unwrap())
        );
    }

    #[test]
    fn a_malformed_shared_preparation_buffer_is_a_typed_error() {
        let shared_err =
            |r: Result<Counted, DataError>| matches!(r, Err(DataError::SharedPreparation { .. }));
        // A file without the vectorizer.
        let mut c = counted();
        let no_meta = Writer::new().array("train.offsets", &mut c.train.0.offsets);
        assert!(shared_err(Counted::decode(loopback(no_meta).unwrap())));
        // Labels that do not match the rows: a malformed buffer, and a typed error on a
        // `Counted` made in place too.
        c.test.1.pop();
        assert!(shared_err(Counted::decode(
            loopback(c.encode().unwrap()).unwrap()
        )));
        assert!(matches!(
            c.into_prepared(),
            Err(AppError::Data(DataError::InvalidCounts { .. }))
        ));
    }
}
