//! The driver of `imdb_transformer`: the Keras example "Text classification with Transformer"
//! on the IMDB reviews, trained on the bare backend (`--mode single`) or on
//! `DistributedBackend` in five parallel modes that differ only by a mesh, a layout map
//! (`layouts/transformer/*.toml`) and the layout of the token ids:
//!
//! | mode | mesh | parameters | token ids |
//! |---|---|---|---|
//! | `data` | `batch=8` | replicated | `[batch, -]` |
//! | `fsdp` | `batch=8` | dim 0 over `batch` (`fsdp.toml`) | `[batch, -]` |
//! | `tp` | `batch=4,model=2` | Megatron over `model` (`tp.toml`) | `[batch, -]` |
//! | `tp-sp` | `batch=4,model=2` | as `tp` (`tp-sp.toml`) | `[batch, model]`: sequence parallel |
//! | `2d` | `batch=4,model=2` | `tp` over `model` x `fsdp` over `batch` (`2d.toml`) | `[batch, -]` |
//!
//! After each backward pass the gradients settle into their parameters' layouts
//! ([`burn_dtensor::settle_gradients`]: FSDP's reduce-scatter, DDP's all-reduce), so Adam runs
//! shard-local and its moments are sharded like the parameters.
//!
//! Every mode starts from the same weights for a seed (drawn by the decorator's counter-based
//! generator, copied onto the bare backend for `single`); dropout masks are drawn by the
//! backend's generator, so with `--dropout` above 0 `single` and the sharded modes see
//! different masks (the sharded modes agree with each other).

use std::path::Path;
use std::time::Instant;

use burn::backend::Autodiff;
use burn::module::AutodiffModule;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use burn_dtensor::spmd::World;
use burn_dtensor::{
    CommEvent, CommLog, DistributedBackend, DistributedDevice, Layout, LayoutMap, Mesh, UNSHARDED,
    record_comms, settle_gradients,
};
use serde::{Deserialize, Serialize};

use crate::batch::{DropPolicy, batches, epoch_order};
use crate::data::sequence::{SequenceVectorizer, Truncation};
use crate::data::{DataError, imdb};
use crate::model::{correct, param_values, with_param_values};
use crate::say;
use crate::shared_data::{Reader, Writer, once_per_launch, shared};
use crate::train::AppError;
use crate::transformer::{TextTransformer, TextTransformerConfig};

/// The parallel mode of `imdb_transformer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum TfMode {
    /// The bare inner backend on one device.
    Single,
    /// Data parallel: parameters replicated, the batch sharded.
    Data,
    /// FSDP (ZeRO-3): every parameter sharded on its dim 0 over `batch`.
    Fsdp,
    /// Megatron tensor parallelism over `model`, data parallel over `batch`.
    Tp,
    /// `tp` plus sequence parallelism: the token ids, hence the activations between the
    /// blocks, sharded over the sequence on `model`.
    #[value(name = "tp-sp")]
    TpSp,
    /// `fsdp` over `batch` times `tp` over `model`.
    #[value(name = "2d")]
    #[serde(rename = "2d")]
    TwoD,
}

impl TfMode {
    /// The mode's mesh (empty for `single`).
    pub fn default_mesh(self) -> &'static str {
        match self {
            TfMode::Single => "",
            TfMode::Data | TfMode::Fsdp => "batch=8",
            TfMode::Tp | TfMode::TpSp | TfMode::TwoD => "batch=4,model=2",
        }
    }

    /// The mode's layout map (TOML, the files under `layouts/transformer/`).
    pub fn layout_map(self) -> &'static str {
        match self {
            TfMode::Single | TfMode::Data => "",
            TfMode::Fsdp => include_str!("../layouts/transformer/fsdp.toml"),
            TfMode::Tp => include_str!("../layouts/transformer/tp.toml"),
            TfMode::TpSp => include_str!("../layouts/transformer/tp-sp.toml"),
            TfMode::TwoD => include_str!("../layouts/transformer/2d.toml"),
        }
    }

    /// The sharding spec of the token ids `[batch, seq]` (the labels take its first entry).
    pub fn ids_spec(self) -> [&'static str; 2] {
        match self {
            TfMode::TpSp => ["batch", "model"],
            _ => ["batch", UNSHARDED],
        }
    }
}

/// Flags of `imdb_transformer` (defaults: the Keras example's).
#[derive(Debug, Clone, Serialize, Deserialize, clap::Parser)]
#[command(
    name = "imdb_transformer",
    about = "The Keras transformer text classifier on IMDB, single-device or data-, FSDP-, tensor-, sequence- or 2-D-parallel by layout map"
)]
pub struct TfConfig {
    /// Parallel mode.
    #[arg(long, value_enum, default_value = "data")]
    pub mode: TfMode,
    /// Mesh (default: the mode's, e.g. `batch=4,model=2`).
    #[arg(long)]
    pub mesh: Option<String>,
    /// Mesh devices in all (virtual copies of the inner device; split over the processes of
    /// an SPMD launch).
    #[arg(long, default_value_t = 8)]
    pub devices: usize,
    /// Epochs over the 25k training reviews.
    #[arg(long, default_value_t = 2)]
    pub epochs: usize,
    /// Global batch size.
    #[arg(long, default_value_t = 32)]
    pub batch_size: usize,
    /// Adam's learning rate.
    #[arg(long, default_value_t = 1e-3)]
    pub lr: f64,
    /// Stop each epoch after this many steps.
    #[arg(long)]
    pub max_steps: Option<usize>,
    /// Vocabulary size, padding and OOV included (Keras' `max_tokens`).
    #[arg(long, default_value_t = 20_000)]
    pub max_tokens: usize,
    /// Tokens per review (Keras' `output_sequence_length`).
    #[arg(long, default_value_t = 200)]
    pub seq_len: usize,
    /// Which tokens of a longer review are kept: `pre` the last, padded at the start
    /// (`pad_sequences`' defaults, which the Keras example applies to its sequences), `post`
    /// the first (`TextVectorization`'s `output_sequence_length`).
    #[arg(long, value_enum, default_value = "pre")]
    pub truncate: Truncation,
    /// Embedding and model width.
    #[arg(long, default_value_t = 32)]
    pub d_model: usize,
    /// Attention heads (must divide `--d-model`).
    #[arg(long, default_value_t = 2)]
    pub heads: usize,
    /// Feed-forward width.
    #[arg(long, default_value_t = 32)]
    pub ff: usize,
    /// Encoder blocks.
    #[arg(long, default_value_t = 1)]
    pub layers: usize,
    /// Dropout rate.
    #[arg(long, default_value_t = 0.1)]
    pub dropout: f64,
    /// Seed of the weights and of the batch order.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Evaluate on the 25k test reviews after each epoch.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub eval: bool,
    /// aclImdb archive or directory (else `IMDB_DATA`, the cache, or a download).
    #[arg(long)]
    pub data: Option<std::path::PathBuf>,
    /// Write the run's summary as JSON here.
    #[arg(long)]
    pub summary: Option<std::path::PathBuf>,
}

impl TfConfig {
    /// The model's sizes for a vocabulary of `vocab_size` ids.
    pub fn model(&self, vocab_size: usize) -> TextTransformerConfig {
        TextTransformerConfig::new(vocab_size)
            .with_seq_len(self.seq_len)
            .with_d_model(self.d_model)
            .with_heads(self.heads)
            .with_ff(self.ff)
            .with_layers(self.layers)
            .with_dropout(self.dropout)
    }

    /// Checks the flags that Burn's modules would otherwise reject with a panic.
    ///
    /// # Errors
    /// [`AppError::Config`] saying which flag to change.
    pub fn check(&self) -> Result<(), AppError> {
        let bad = |m: String| Err(AppError::Config(m));
        if self.heads == 0 || self.d_model == 0 || !self.d_model.is_multiple_of(self.heads) {
            return bad(format!(
                "--heads {} must divide --d-model {} (each head takes d_model / heads)",
                self.heads, self.d_model
            ));
        }
        if self.seq_len == 0 || self.ff == 0 || self.layers == 0 || self.batch_size == 0 {
            return bad("--seq-len, --ff, --layers and --batch-size must be at least 1".into());
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return bad(format!("--dropout {} must be in [0, 1)", self.dropout));
        }
        crate::train::check_lr(self.lr)
    }
}

/// Token ids `[n, seq_len]` and labels of one split.
#[derive(Debug, Clone)]
pub struct SequenceSet {
    /// Row-major `[n, seq_len]` token ids.
    pub ids: Vec<u32>,
    /// Tokens per row.
    pub seq_len: usize,
    /// 0 = neg, 1 = pos.
    pub labels: Vec<u8>,
}

impl SequenceSet {
    /// The rows `idx` as a host batch: ids `[len, seq_len]` and labels `[len]` (i64).
    pub fn batch(&self, idx: &[usize]) -> (TensorData, TensorData) {
        let mut ids = Vec::with_capacity(idx.len() * self.seq_len);
        for &i in idx {
            ids.extend(
                self.ids[i * self.seq_len..(i + 1) * self.seq_len]
                    .iter()
                    .map(|&t| t as i64),
            );
        }
        let labels: Vec<i64> = idx.iter().map(|&i| self.labels[i] as i64).collect();
        (
            TensorData::new(ids, [idx.len(), self.seq_len]),
            TensorData::new(labels, [idx.len()]),
        )
    }
}

/// The vectorised splits and the vectorizer fitted on the train texts.
pub struct TextData {
    /// 25k train reviews.
    pub train: SequenceSet,
    /// 25k test reviews.
    pub test: SequenceSet,
    /// Fitted on the train texts.
    pub vectorizer: SequenceVectorizer,
}

impl TextData {
    /// Loads aclImdb from `path` and vectorises both splits (`max_tokens` ids, `seq_len` per
    /// review).
    ///
    /// # Errors
    /// Data errors (missing or corrupt archive, bad vectorizer settings).
    pub fn prepare(path: &Path, max_tokens: usize, seq_len: usize) -> Result<Self, AppError> {
        Self::prepare_with(path, max_tokens, seq_len, Truncation::Post)
    }

    /// As [`prepare`](Self::prepare), keeping the end of a long review `truncation` says.
    ///
    /// # Errors
    /// As [`prepare`](Self::prepare).
    pub fn prepare_with(
        path: &Path,
        max_tokens: usize,
        seq_len: usize,
        truncation: Truncation,
    ) -> Result<Self, AppError> {
        let data = imdb::load(path)?;
        fn pairs(r: &[imdb::Review]) -> Vec<(&str, u8)> {
            r.iter().map(|r| (r.text.as_str(), r.label)).collect()
        }
        Self::from_texts_with(
            &pairs(&data.train),
            &pairs(&data.test),
            max_tokens,
            seq_len,
            truncation,
        )
    }

    /// [`prepare_with`](Self::prepare_with) once per SPMD launch, for every rank: rank 0
    /// resolves the source (`data`, as [`imdb::resolve_source`]), loads the reviews, fits the
    /// vectorizer and vectorises both splits; it sends every other rank the vectorizer and the
    /// token ids (`[n, seq_len]` u32 per split, 40 MB for aclImdb at 200 tokens) as one
    /// [`shared_data`](crate::shared_data) file, received straight into the ids' vectors. Equal
    /// on every rank to what [`prepare_with`](Self::prepare_with) gives, with one rank's work
    /// instead of every rank's (8 ranks on 2 cores: 10.9 s each; NOTES.md, session 74). The
    /// other ranks never open the archive. In a world of one this is `prepare_with`.
    ///
    /// A collective: every rank calls it at the same point, and waits for rank 0 up to
    /// [`PREPARE_TIMEOUT`](crate::shared_data::PREPARE_TIMEOUT).
    ///
    /// # Errors
    /// On rank 0 its data errors; on the other ranks [`AppError::Data`] saying that rank 0 could
    /// not prepare the data (rank 0's own message says why), or that its file was malformed.
    pub fn prepare_once(
        world: &World,
        data: Option<&Path>,
        max_tokens: usize,
        seq_len: usize,
        truncation: Truncation,
    ) -> Result<Self, AppError> {
        let prepare = || {
            let path = imdb::resolve_source(data)?;
            Self::prepare_with(&path, max_tokens, seq_len, truncation)
        };
        let decode = |r| Ok(Self::decode(r)?);
        once_per_launch(
            world,
            "prepared IMDB token ids",
            prepare,
            Self::encode,
            decode,
        )
    }

    /// One [`shared_data`](crate::shared_data) file: per split `ids` (U32, row-major
    /// `[n, seq_len]`) and `labels` (U8), the vectorizer as JSON in the metadata. The arrays are
    /// sent from where they are.
    fn encode(&mut self) -> Result<Writer<'_>, DataError> {
        let json = serde_json::to_string(&self.vectorizer).map_err(|e| shared(e.to_string()))?;
        let mut w = Writer::new().metadata("vectorizer", json);
        for (split, set) in [("train", &mut self.train), ("test", &mut self.test)] {
            w = w
                .array(&format!("{split}.ids"), &mut set.ids)
                .array(&format!("{split}.labels"), &mut set.labels);
        }
        Ok(w)
    }

    /// The inverse of [`encode`](Self::encode), checking that each split has `seq_len` ids per
    /// label and only ids of the vocabulary (an id past it would fail in the embedding).
    fn decode(mut r: Reader) -> Result<Self, DataError> {
        let vectorizer: SequenceVectorizer =
            serde_json::from_str(r.metadata("vectorizer")?).map_err(|e| shared(e.to_string()))?;
        let (seq_len, vocab) = (vectorizer.sequence_length(), vectorizer.vocab_size());
        let mut split = |split: &str| -> Result<SequenceSet, DataError> {
            let (ids, labels): (Vec<u32>, Vec<u8>) = (
                r.take(&format!("{split}.ids"))?,
                r.take(&format!("{split}.labels"))?,
            );
            if labels.len().checked_mul(seq_len) != Some(ids.len()) {
                return Err(shared(format!(
                    "{split}: {} ids for {} labels of {seq_len} tokens",
                    ids.len(),
                    labels.len()
                )));
            }
            if let Some(id) = ids.iter().find(|&&id| id as usize >= vocab) {
                return Err(shared(format!(
                    "{split}: token id {id} outside the vocabulary of {vocab}"
                )));
            }
            Ok(SequenceSet {
                ids,
                seq_len,
                labels,
            })
        };
        Ok(Self {
            train: split("train")?,
            test: split("test")?,
            vectorizer,
        })
    }

    /// Fits the vectorizer on the `train` texts and vectorises both splits (`(text, label)`
    /// pairs, label 0 or 1).
    ///
    /// # Errors
    /// Bad vectorizer settings, an empty training set.
    pub fn from_texts(
        train: &[(&str, u8)],
        test: &[(&str, u8)],
        max_tokens: usize,
        seq_len: usize,
    ) -> Result<Self, AppError> {
        Self::from_texts_with(train, test, max_tokens, seq_len, Truncation::Post)
    }

    /// As [`from_texts`](Self::from_texts), keeping the end of a long text `truncation` says.
    ///
    /// # Errors
    /// As [`from_texts`](Self::from_texts).
    pub fn from_texts_with(
        train: &[(&str, u8)],
        test: &[(&str, u8)],
        max_tokens: usize,
        seq_len: usize,
        truncation: Truncation,
    ) -> Result<Self, AppError> {
        fn texts<'a>(r: &[(&'a str, u8)]) -> Vec<&'a str> {
            r.iter().map(|r| r.0).collect()
        }
        let vectorizer = SequenceVectorizer::fit(&texts(train), max_tokens, seq_len)?
            .with_truncation(truncation);
        let set = |r: &[(&str, u8)]| SequenceSet {
            ids: vectorizer.transform(&texts(r)).ids().to_vec(),
            seq_len,
            labels: r.iter().map(|r| r.1).collect(),
        };
        Ok(Self {
            train: set(train),
            test: set(test),
            vectorizer,
        })
    }
}

/// What a run reports.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TfSummary {
    /// The mode.
    pub mode: TfMode,
    /// The mesh (empty for `single`).
    pub mesh: String,
    /// Processes of the run.
    pub world_size: usize,
    /// Training steps run.
    pub steps: usize,
    /// Per-step training loss (mean cross-entropy of the global batch, in the backend's float
    /// type widened to f64).
    pub train_losses: Vec<f64>,
    /// Test accuracy after each epoch (with `--eval`).
    pub epoch_test_accuracy: Vec<f64>,
    /// Median step time, ms.
    pub median_step_ms: f64,
    /// Wall time of the training loop (evaluation included), s.
    pub wall_s: f64,
    /// The collectives of the first step (forward, backward, settling, update), summed.
    pub comm_first_step: String,
    /// The same collectives one by one, in call order.
    pub comm_events: Vec<CommEvent>,
    /// Every float parameter's path and layout (empty for `single`).
    pub parameters: Vec<String>,
    /// Number of scalar parameters of the model.
    pub num_params: usize,
    /// This process's memory in phases, MiB (see [`crate::memory`]; `None` off Linux).
    #[serde(default)]
    pub memory: TfMemory,
}

/// This process's resident memory (`VmRSS`) and its peaks (`VmHWM`, reset between phases) in
/// the phases of [`run`], MiB (2^20 bytes). Under `mpirun` each rank has its own.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TfMemory {
    /// Resident set when [`run`] started, the data already loaded.
    pub start: Option<f64>,
    /// Peak while the model was created and laid out (the layout map applied).
    pub creation_peak: Option<f64>,
    /// Resident set once the model was laid out, before the first step: the data and this
    /// process's shards of the parameters.
    pub model: Option<f64>,
    /// Peak over training and evaluation: the parameters, gradients and Adam's moments held
    /// here, plus what one step holds at once (activations, gathered parameters, unsettled
    /// gradients, collective buffers).
    pub training_peak: Option<f64>,
}

/// Trains and evaluates `cfg` on `data` with the inner backend `I` on `device` (virtual
/// copies of it form the mesh; under `mpirun` the mesh spans the processes).
///
/// # Errors
/// Bad flags, mesh and layout errors, SPMD start-up errors.
pub fn run<I: Backend>(
    cfg: &TfConfig,
    data: &TextData,
    device: I::Device,
) -> Result<TfSummary, AppError> {
    let exact = crate::memory::reset_peak();
    let start = crate::memory::status_mib("VmRSS:");
    let mut summary = run_modes::<I>(cfg, data, device)?;
    summary.memory.start = start;
    if !exact {
        summary.memory.creation_peak = None;
        summary.memory.training_peak = None;
    }
    Ok(summary)
}

fn run_modes<I: Backend>(
    cfg: &TfConfig,
    data: &TextData,
    device: I::Device,
) -> Result<TfSummary, AppError> {
    cfg.check()?;
    let model_cfg = cfg.model(data.vectorizer.vocab_size());
    if cfg.mode == TfMode::Single {
        // The weights every mode starts from: drawn on a mesh of one, copied onto the bare
        // backend.
        let one = DistributedDevice::new(Mesh::single(device.clone()));
        seed_all::<DistributedBackend<I>>(&one, cfg.seed);
        let drawn = param_values(&model_cfg.init::<DistributedBackend<I>>(&one));
        let model = with_param_values(model_cfg.init::<Autodiff<I>>(&device), drawn);
        let place_train = |x, y| Ok(on_device::<Autodiff<I>>(x, y, &device));
        let place_valid = |x, y| Ok(on_device::<I>(x, y, &device));
        return train_loop::<Autodiff<I>>(
            cfg,
            data,
            model,
            String::new(),
            Vec::new(),
            &place_train,
            &place_valid,
            &|g, _| Ok(g),
        );
    }
    let spec = cfg.mesh.as_deref().unwrap_or(cfg.mode.default_mesh());
    let mesh = Mesh::parse_spmd(spec, crate::train::process_devices(cfg.devices, device)?)?;
    let map = LayoutMap::from_toml_str(cfg.mode.layout_map())?;
    let ids_layout = Layout::new(&mesh, cfg.mode.ids_spec())?;
    let label_layout = Layout::new(&mesh, &cfg.mode.ids_spec()[..1])?;
    let dev = DistributedDevice::new(mesh.clone());
    seed_all::<Db<I>>(&dev, cfg.seed);
    let (model, report) = map.apply(model_cfg.init::<Db<I>>(&dev), mesh.topology())?;
    let parameters = report
        .assignments
        .iter()
        .map(|(p, l)| format!("{p}: {l}"))
        .collect();
    let place_train = |x, y| distributed::<Db<I>>(x, y, &ids_layout, &label_layout);
    let place_valid = |x, y| distributed::<DistributedBackend<I>>(x, y, &ids_layout, &label_layout);
    train_loop::<Db<I>>(
        cfg,
        data,
        model,
        mesh.to_string(),
        parameters,
        &place_train,
        &place_valid,
        &|g, m| Ok(settle_gradients(g, m)?),
    )
}

/// A host batch on one device of the bare backend `B`.
fn on_device<B: Backend>(ids: TensorData, labels: TensorData, device: &B::Device) -> Batch<B> {
    (
        Tensor::from_data(ids.convert::<B::IntElem>(), device),
        Tensor::from_data(labels.convert::<B::IntElem>(), device),
    )
}

/// A host batch distributed on a mesh: ids in `ids`' layout, labels in `labels`'.
fn distributed<B: burn_dtensor::DistributedOps>(
    ids: TensorData,
    labels: TensorData,
    ids_layout: &Layout,
    label_layout: &Layout,
) -> Result<Batch<B>, AppError> {
    Ok((
        burn_dtensor::distribute(ids.convert::<B::IntElem>(), ids_layout)?,
        burn_dtensor::distribute(labels.convert::<B::IntElem>(), label_layout)?,
    ))
}

/// Seeds the backend's generator and the decorator's counter-based one (the weights' stream).
fn seed_all<B: Backend>(device: &B::Device, seed: u64) {
    B::seed(device, seed);
    burn_dtensor::random::seed(seed);
}

/// The distributed training backend.
type Db<I> = Autodiff<DistributedBackend<I>>;
/// Token ids `[batch, seq]` and labels `[batch]` on a backend.
type Batch<B> = (Tensor<B, 2, Int>, Tensor<B, 1, Int>);
type Inner<B> = <B as AutodiffBackend>::InnerBackend;
type Place<'a, B> = dyn Fn(TensorData, TensorData) -> Result<Batch<B>, AppError> + 'a;
type Settle<'a, B> =
    dyn Fn(GradientsParams, &TextTransformer<B>) -> Result<GradientsParams, AppError> + 'a;

/// The training loop, the same for every mode: Adam, mean cross-entropy, gradients settled by
/// `settle` before each update, test accuracy after each epoch.
#[allow(clippy::too_many_arguments)]
fn train_loop<B: AutodiffBackend>(
    cfg: &TfConfig,
    data: &TextData,
    mut model: TextTransformer<B>,
    mesh: String,
    parameters: Vec<String>,
    place: &Place<'_, B>,
    place_valid: &Place<'_, Inner<B>>,
    settle: &Settle<'_, B>,
) -> Result<TfSummary, AppError> {
    let memory = TfMemory {
        creation_peak: crate::memory::status_mib("VmHWM:"),
        model: crate::memory::status_mib("VmRSS:"),
        ..TfMemory::default()
    };
    crate::memory::reset_peak();
    let num_params = burn::module::Module::num_params(&model);
    let mut optim = AdamConfig::new().init::<B, TextTransformer<B>>();
    let loss_fn = CrossEntropyLossConfig::new().init(&model.head.weight.device());
    let n = data.train.labels.len();
    let t_run = Instant::now();
    let (mut losses, mut step_ms, mut accs) = (Vec::new(), Vec::new(), Vec::new());
    let mut comm = CommLog::default();
    for epoch in 0..cfg.epochs {
        let order = epoch_order(n, cfg.seed, epoch);
        let mut bs = batches(&order, cfg.batch_size, DropPolicy::Uneven);
        if let Some(m) = cfg.max_steps {
            bs.truncate(m);
        }
        let every = (bs.len() / 10).max(1);
        for (s, idx) in bs.iter().enumerate() {
            let t0 = Instant::now();
            let (x, y) = data.train.batch(idx);
            let (res, log) = record_comms(|| -> Result<_, AppError> {
                let (x, y) = place(x, y)?;
                let loss = loss_fn.forward(model.forward(x), y);
                let grads = settle(GradientsParams::from_grads(loss.backward(), &model), &model)?;
                let next = optim.step(cfg.lr, model.clone(), grads);
                Ok((next, loss.into_scalar().elem::<f64>()))
            });
            let (next, loss) = res?;
            model = next;
            if losses.is_empty() {
                comm = log;
            }
            step_ms.push(t0.elapsed().as_secs_f64() * 1e3);
            losses.push(loss);
            if (s + 1) % every == 0 {
                say!(
                    "epoch {} step {}/{}: loss {loss:.4}",
                    epoch + 1,
                    s + 1,
                    bs.len()
                );
            }
        }
        if cfg.eval {
            let acc = evaluate::<B>(&model.valid(), &data.test, cfg.batch_size, place_valid)?;
            say!("epoch {}: test accuracy {acc:.4}", epoch + 1);
            accs.push(acc);
        }
    }
    let mut sorted = step_ms.clone();
    sorted.sort_by(f64::total_cmp);
    Ok(TfSummary {
        mode: cfg.mode,
        mesh,
        world_size: burn_dtensor::spmd::init()?.size(),
        steps: losses.len(),
        train_losses: losses,
        epoch_test_accuracy: accs,
        median_step_ms: sorted.get(sorted.len() / 2).copied().unwrap_or(0.0),
        wall_s: t_run.elapsed().as_secs_f64(),
        comm_first_step: comm.to_string(),
        comm_events: comm.events,
        num_params,
        parameters,
        memory: TfMemory {
            training_peak: crate::memory::status_mib("VmHWM:"),
            ..memory
        },
    })
}

/// Test accuracy of `model` (inference: no dropout) in batches of `batch_size`.
fn evaluate<B: AutodiffBackend>(
    model: &TextTransformer<Inner<B>>,
    set: &SequenceSet,
    batch_size: usize,
    place: &Place<'_, Inner<B>>,
) -> Result<f64, AppError> {
    let n = set.labels.len();
    let order: Vec<usize> = (0..n).collect();
    let mut right = 0;
    for idx in order.chunks(batch_size) {
        let (x, y) = set.batch(idx);
        let (x, y) = place(x, y)?;
        right += correct(model.forward(x), y);
    }
    Ok(right as f64 / n.max(1) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared_data::loopback;

    fn texts() -> TextData {
        let train = [
            ("the cat sat", 0),
            ("a dog ran far away", 1),
            ("the end", 0),
        ];
        let test = [("dog and cat", 1), ("unknown words only here", 0)];
        TextData::from_texts_with(&train, &test, 6, 3, Truncation::Pre).unwrap()
    }

    #[test]
    fn the_shared_token_ids_round_trip() {
        let mut sent = texts();
        let got = TextData::decode(loopback(sent.encode().unwrap()).unwrap()).unwrap();
        assert_eq!(got.vectorizer, sent.vectorizer);
        assert_eq!(got.vectorizer.truncation(), Truncation::Pre);
        for (g, s) in [(&got.train, &sent.train), (&got.test, &sent.test)] {
            assert_eq!((&g.ids, &g.labels, g.seq_len), (&s.ids, &s.labels, 3));
        }
        // The ids are the vectorizer's own transform of the texts.
        let want = sent
            .vectorizer
            .transform(&["dog and cat", "unknown words only here"]);
        assert_eq!(got.test.ids, want.ids());
    }

    #[test]
    fn shared_token_ids_that_do_not_fit_are_typed_errors() {
        let shared_err = |t: &mut TextData| {
            let r = TextData::decode(loopback(t.encode().unwrap()).unwrap());
            matches!(r, Err(DataError::SharedPreparation { reason }) if reason.contains("train"))
        };
        let mut t = texts();
        t.train.ids.pop();
        assert!(
            shared_err(&mut t),
            "ids not a multiple of the sequence length"
        );
        let mut t = texts();
        t.train.labels.push(1);
        assert!(shared_err(&mut t), "a label without its ids");
        let mut t = texts();
        t.train.ids[4] = t.vectorizer.vocab_size() as u32;
        assert!(shared_err(&mut t), "an id outside the vocabulary");
    }
}
