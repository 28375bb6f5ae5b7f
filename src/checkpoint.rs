//! Crash-safe sharded checkpoints of the IMDB trainer, on [`burn_dtensor::checkpoint`].
//!
//! A checkpoint directory holds one committed checkpoint per epoch in its own subdirectory, and
//! a `LATEST` file naming the current one:
//!
//! ```text
//! ckpt/LATEST                                  "epoch-0002"
//! ckpt/epoch-0002/metadata.json                 per tensor: global shape, dtype, layout at
//!                                               save time, per shard its box, file, byte range
//!                                               and CRC-32s; the attributes below
//! ckpt/epoch-0002/shards-00000-of-00004.safetensors   the distinct shards rank 0 owns
//! ckpt/epoch-0002/shards-00001-of-00004.safetensors   ... (one file per process owning a shard)
//! ```
//!
//! Tensors: the parameters by module path (`dense1.weight`), Adam's state by parameter
//! (`optim.dense1.weight.moment_1`, `moment_2`, counter `optim.dense1.weight.time`).
//! Attributes: `train` (a [`CheckpointState`]: epochs done, mode, optimizer, loss history) and
//! `vectorizer` (the fitted TF-IDF vectorizer, so that `imdb_predict --checkpoint` needs nothing
//! else).
//!
//! Every process writes only the distinct shards it owns, in its own layout (`--mode single`,
//! the plain backend, writes its tensors whole): no process gathers a tensor. A resume on any
//! mesh, mode and process count reads only the parts of the files that overlap the shards it
//! will hold.
//!
//! A save writes the epoch as a new directory (the library's commit: every process writes and
//! syncs its file into a staging directory, then the chief writes `metadata.json` and renames
//! the staging directory into place), then the chief replaces `LATEST` by writing `LATEST.tmp`
//! and renaming it over `LATEST`. The rename of `LATEST` is the commit point: a process killed at
//! any moment (SIGKILL included, on any rank) leaves `LATEST` naming either the previous complete
//! checkpoint or the new one. Older epochs are removed after the commit. A damaged, missing or
//! foreign file is an [`AppError::Checkpoint`] naming the tensor and the file.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Bool, Int, Tensor};
use burn_dtensor::DTensorError;
use burn_dtensor::checkpoint::{Checkpoint, METADATA_FILE, SaveOptions, ShardedOptimizer};
use serde::{Deserialize, Serialize};

use crate::data::tfidf::TfIdfVectorizer;
use crate::model::ImdbMlp;
use crate::train::{AppError, Mode, OptimizerKind, Placement};

/// The name of the commit-point file inside a checkpoint directory.
pub const LATEST: &str = "LATEST";
/// The attribute holding the [`CheckpointState`].
pub const TRAIN_ATTRIBUTE: &str = "train";
/// The attribute holding the TF-IDF vectorizer.
pub const VECTORIZER_ATTRIBUTE: &str = "vectorizer";
/// The prefix of the optimizer's tensors and counters.
pub const OPTIM_PREFIX: &str = "optim";

/// The optimizer of the IMDB model on backend `AD` ([`ShardedOptimizer`] `X`: Adam, or SGD
/// without momentum).
pub type Adaptor<X, AD> = OptimizerAdaptor<X, ImdbMlp<AD>, AD>;

/// What a checkpoint records besides the tensors (its `train` attribute).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointState {
    /// Epochs completed (the next run starts at this 0-based epoch).
    pub epochs_done: usize,
    /// Mode that wrote it.
    pub mode: Mode,
    /// Optimizer it holds state for.
    pub optimizer: OptimizerKind,
    /// Losses so far (all epochs).
    pub train_losses: Vec<f32>,
}

/// Global parameter shapes of a module by path (`dense1.weight`), what a checkpoint must match.
pub fn param_shapes<B: Backend, M: Module<B>>(m: &M) -> BTreeMap<String, Vec<usize>> {
    struct Shapes {
        path: Vec<String>,
        out: BTreeMap<String, Vec<usize>>,
    }
    impl Shapes {
        fn add(&mut self, dims: Vec<usize>) {
            self.out.insert(self.path.join("."), dims);
        }
    }
    impl<B: Backend> ModuleVisitor<B> for Shapes {
        fn enter_module(&mut self, name: &str, _container: &str) {
            self.path.push(name.to_string());
        }
        fn exit_module(&mut self, _name: &str, _container: &str) {
            self.path.pop();
        }
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
            self.add(p.lazy_shape().to_vec());
        }
        fn visit_int<const D: usize>(&mut self, p: &Param<Tensor<B, D, Int>>) {
            self.add(p.lazy_shape().to_vec());
        }
        fn visit_bool<const D: usize>(&mut self, p: &Param<Tensor<B, D, Bool>>) {
            self.add(p.lazy_shape().to_vec());
        }
    }
    let mut v = Shapes {
        path: Vec::new(),
        out: BTreeMap::new(),
    };
    m.visit(&mut v);
    v.out
}

fn err(path: &Path, reason: impl std::fmt::Display) -> AppError {
    AppError::Checkpoint {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

/// The library's checkpoint errors as the example's (they name the file and the tensor).
pub fn lib_err(e: DTensorError) -> AppError {
    match e {
        DTensorError::Checkpoint { path, reason } => AppError::Checkpoint { path, reason },
        e => AppError::Layout(e),
    }
}

/// Test hook: with `DTENSOR_CKPT_KILL_AT=k` set, the process kills itself with SIGKILL at the
/// `k`-th write point of a save (counted from 1 over the whole process: the library's points
/// before, inside and after its shard file and, on the chief, around `metadata.json` and its
/// rename; then the chief's around `LATEST`). With `DTENSOR_CKPT_KILL_RANK=r` only rank `r`
/// kills itself. Unset, it costs an environment lookup per point.
fn write_point() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static POINT: AtomicUsize = AtomicUsize::new(0);
    let Some(k) = std::env::var("DTENSOR_CKPT_KILL_AT")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    else {
        return;
    };
    if let Some(r) = std::env::var("DTENSOR_CKPT_KILL_RANK")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        && burn_dtensor::spmd::init().map(|w| w.rank()).ok() != Some(r)
    {
        return;
    }
    if POINT.fetch_add(1, Ordering::SeqCst) + 1 == k {
        // SAFETY: kill(2) on our own pid; no memory is touched.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
}

/// Writes `bytes` to `path` and syncs it, with write points before, halfway and after.
fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), AppError> {
    write_point();
    let mut f = std::fs::File::create(path).map_err(|e| err(path, e))?;
    let half = bytes.len() / 2;
    f.write_all(&bytes[..half]).map_err(|e| err(path, e))?;
    f.flush().map_err(|e| err(path, e))?;
    write_point();
    f.write_all(&bytes[half..]).map_err(|e| err(path, e))?;
    f.sync_all().map_err(|e| err(path, e))?;
    write_point();
    Ok(())
}

fn sync_dir(dir: &Path) {
    // Makes the renames durable across power loss; not needed against process kills, and not
    // possible on every platform, so failures are ignored.
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Checks up front that a checkpoint can be written in `dir` (creating it), so an unwritable
/// directory fails before training rather than after the first epoch.
///
/// # Errors
/// [`AppError::Checkpoint`] naming the directory.
pub fn check_writable(dir: &Path) -> Result<(), AppError> {
    std::fs::create_dir_all(dir).map_err(|e| err(dir, format!("cannot create it: {e}")))?;
    let probe = dir.join(format!(".write-probe-{}", std::process::id()));
    std::fs::write(&probe, b"").map_err(|e| err(dir, format!("cannot write in it: {e}")))?;
    let _ = std::fs::remove_file(probe);
    Ok(())
}

/// The epoch directory `LATEST` names in `dir`.
///
/// # Errors
/// [`AppError::Checkpoint`] naming `LATEST` when it cannot be read or names no epoch directory.
pub fn latest(dir: &Path) -> Result<String, AppError> {
    let path = dir.join(LATEST);
    let name = std::fs::read_to_string(&path).map_err(|e| {
        err(
            &path,
            format!(
                "cannot read it ({e}); a checkpoint directory written by --checkpoint-dir has a LATEST file naming its committed epoch"
            ),
        )
    })?;
    let name = name.trim();
    if !name.starts_with("epoch-") || name.contains(['/', '\\']) {
        return Err(err(
            &path,
            format!("names `{name}`, not an epoch directory"),
        ));
    }
    Ok(name.to_string())
}

/// Saves a checkpoint of `model` and `optim` as epoch `state.epochs_done` in `dir` (see the
/// module docs), with the vectorizer. Collective: every process of the run calls it.
///
/// # Errors
/// [`AppError::Checkpoint`] for any write error on any process, naming the file.
pub fn save<P: Placement, X: ShardedOptimizer<<P::AD as AutodiffBackend>::InnerBackend>>(
    p: &P,
    dir: &Path,
    model: &ImdbMlp<P::AD>,
    optim: &Adaptor<X, P::AD>,
    state: &CheckpointState,
    vectorizer: &TfIdfVectorizer,
) -> Result<(), AppError> {
    let world = burn_dtensor::spmd::init()?;
    // The new epoch's directory: `epoch-NNNN`, or `epoch-NNNN-b` when `LATEST` names the
    // former (a run started again over an old checkpoint directory): never the current one.
    let base = format!("epoch-{:04}", state.epochs_done);
    let current = latest(dir).ok();
    let name = if current.as_deref() == Some(base.as_str()) {
        format!("{base}-b")
    } else {
        base
    };
    let target = dir.join(&name);
    // A directory of that name is never current: an earlier save committed it without reaching
    // LATEST. The chief removes it; everyone waits, so the library finds the name free.
    if world.is_chief() && target.exists() {
        std::fs::remove_dir_all(&target).map_err(|e| err(&target, e))?;
    }
    world.barrier();
    let mut sd = p.state_dict(model, optim)?;
    sd.insert_attribute(TRAIN_ATTRIBUTE, state)
        .map_err(lib_err)?;
    sd.insert_attribute(VECTORIZER_ATTRIBUTE, vectorizer)
        .map_err(lib_err)?;
    let opts = SaveOptions::default().on_write_point(write_point);
    burn_dtensor::checkpoint::save(&target, sd, &opts).map_err(lib_err)?;
    // The commit point, by the chief; its outcome reaches every process.
    let outcome = if world.is_chief() {
        match commit_latest(dir, &name) {
            Ok(()) => Vec::new(),
            Err(e) => e.to_string().into_bytes(),
        }
    } else {
        Vec::new()
    };
    let all = world.all_gather_bytes(&outcome, "checkpoint: LATEST");
    if !all[0].is_empty() {
        return Err(err(&dir.join(LATEST), String::from_utf8_lossy(&all[0])));
    }
    Ok(())
}

/// Points `LATEST` at `name` (write, sync, rename), then drops the other epochs and the
/// leftovers of interrupted saves.
fn commit_latest(dir: &Path, name: &str) -> Result<(), AppError> {
    let latest_tmp = dir.join(format!("{LATEST}.tmp"));
    write_synced(&latest_tmp, name.as_bytes())?;
    std::fs::rename(&latest_tmp, dir.join(LATEST)).map_err(|e| err(&dir.join(LATEST), e))?;
    sync_dir(dir);
    write_point();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let n = e.file_name().to_string_lossy().to_string();
            let stale = (n.starts_with("epoch-") && n != name)
                || (n.starts_with(".epoch-") && n.ends_with(".partial"));
            if stale && e.path().is_dir() {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    Ok(())
}

/// A committed checkpoint, opened (its metadata read), ready to load into a model and an
/// optimizer.
pub struct Loaded {
    /// Its `train` attribute.
    pub state: CheckpointState,
    /// The directory of the committed epoch.
    pub dir: PathBuf,
    /// The sharded checkpoint.
    pub checkpoint: Checkpoint,
}

/// Opens the checkpoint `LATEST` names in `dir`: its metadata and training state (the shards
/// are read, and their checksums verified, when loaded).
///
/// # Errors
/// [`AppError::Checkpoint`] naming the file that is missing or corrupt.
pub fn read(dir: &Path) -> Result<Loaded, AppError> {
    let edir = dir.join(latest(dir)?);
    let checkpoint = Checkpoint::open(&edir).map_err(lib_err)?;
    let state = checkpoint
        .attribute::<CheckpointState>(TRAIN_ATTRIBUTE)
        .map_err(lib_err)?;
    Ok(Loaded {
        state,
        dir: edir,
        checkpoint,
    })
}

impl Loaded {
    /// The vectorizer saved with the model.
    ///
    /// # Errors
    /// [`AppError::Checkpoint`] naming `metadata.json` when it has none.
    pub fn vectorizer(&self) -> Result<TfIdfVectorizer, AppError> {
        self.checkpoint
            .attribute(VECTORIZER_ATTRIBUTE)
            .map_err(lib_err)
    }

    /// Checks that the checkpoint holds state for `optimizer` and parameters of the shapes in
    /// `expected` (see [`param_shapes`]).
    ///
    /// # Errors
    /// [`AppError::Checkpoint`] naming `metadata.json` and what differs.
    pub fn check(
        &self,
        expected: &BTreeMap<String, Vec<usize>>,
        optimizer: OptimizerKind,
    ) -> Result<(), AppError> {
        let meta_path = self.dir.join(METADATA_FILE);
        if self.state.optimizer != optimizer {
            return Err(err(
                &meta_path,
                format!(
                    "holds {:?} state but --optimizer is {:?}; resume with --optimizer {}",
                    self.state.optimizer,
                    optimizer,
                    format!("{:?}", self.state.optimizer).to_lowercase()
                ),
            ));
        }
        let saved: BTreeMap<&str, &Vec<usize>> = self
            .checkpoint
            .metadata()
            .tensors
            .iter()
            .filter(|(k, _)| !k.starts_with(&format!("{OPTIM_PREFIX}.")))
            .map(|(k, t)| (k.as_str(), &t.shape))
            .collect();
        let diff: Vec<String> = expected
            .iter()
            .filter(|(k, v)| saved.get(k.as_str()) != Some(v))
            .map(|(k, v)| format!("{k}: checkpoint {:?}, model {v:?}", saved.get(k.as_str())))
            .chain(
                saved
                    .keys()
                    .filter(|k| !expected.contains_key(**k))
                    .map(|k| format!("{k}: not in the model")),
            )
            .collect();
        if !diff.is_empty() {
            return Err(err(
                &meta_path,
                format!(
                    "was written for another model ({}); resume with the model it was trained with",
                    diff.join("; ")
                ),
            ));
        }
        Ok(())
    }

    /// Loads the checkpoint into `model` (freshly built, laid out for the current mesh: each
    /// process reads only its shards) and `optim`, after checking that the checkpoint's
    /// optimizer and every parameter shape match.
    ///
    /// # Errors
    /// [`AppError::Checkpoint`] naming `metadata.json` for an optimizer or shape mismatch, or the
    /// tensor and shard file that is missing or damaged.
    #[allow(clippy::type_complexity)]
    pub fn load_into<
        P: Placement,
        X: ShardedOptimizer<<P::AD as AutodiffBackend>::InnerBackend>,
    >(
        &self,
        p: &P,
        model: ImdbMlp<P::AD>,
        optim: Adaptor<X, P::AD>,
        optimizer: OptimizerKind,
    ) -> Result<(ImdbMlp<P::AD>, Adaptor<X, P::AD>), AppError> {
        self.check(&param_shapes(&model), optimizer)?;
        p.load_state(&self.checkpoint, model, optim)
    }
}

/// The model of the checkpoint `LATEST` names in `dir`, whole, on a plain backend `B` (every
/// tensor read whole: for inference and export off the mesh), with its vectorizer. The model's
/// sizes are the checkpoint's.
///
/// # Errors
/// [`AppError::Checkpoint`] naming the file that is missing, damaged or of another model.
pub fn load_whole<B: Backend>(
    dir: &Path,
    device: &B::Device,
) -> Result<(ImdbMlp<B>, TfIdfVectorizer), AppError> {
    let loaded = read(dir)?;
    let meta = loaded.checkpoint.metadata();
    let shape = |name: &str| -> Result<Vec<usize>, AppError> {
        meta.tensors
            .get(name)
            .map(|t| t.shape.clone())
            .filter(|s| s.len() == 2)
            .ok_or_else(|| {
                err(
                    &loaded.dir.join(METADATA_FILE),
                    format!("no 2-d `{name}`: not a checkpoint of the IMDB model"),
                )
            })
    };
    let (w1, w2) = (shape("dense1.weight")?, shape("dense2.weight")?);
    let fresh = ImdbMlp::<B>::with_dims(w1[0], w1[1], w2[1], device);
    let model = loaded
        .checkpoint
        .load_module_whole(fresh, device)
        .map_err(lib_err)?;
    Ok((model, loaded.vectorizer()?))
}
