//! Crash-safe, mesh-independent checkpoints of the IMDB trainer.
//!
//! A checkpoint directory holds one complete checkpoint per committed epoch in its own
//! subdirectory, and a `LATEST` file naming the committed one:
//!
//! ```text
//! ckpt/LATEST              "epoch-0002"
//! ckpt/epoch-0002/model.mpk    the model record (Burn's named MessagePack)
//! ckpt/epoch-0002/optim.mpk    the optimizer record
//! ckpt/epoch-0002/state.json   epochs done, mode, optimizer, losses, parameter shapes,
//!                              and the length and SHA-256 of both records
//! ```
//!
//! A save writes the new epoch into a temporary directory (`.tmp-epoch-0003`), syncs it, renames
//! it into place, then replaces `LATEST` by writing `LATEST.tmp` and renaming it over `LATEST`
//! (a rename is atomic on POSIX file systems). The rename of `LATEST` is the commit point: a
//! process killed at any moment (SIGKILL included) leaves `LATEST` naming either the previous
//! complete checkpoint or the new one, never a mix. Older epochs are removed after the commit.
//!
//! Records hold every tensor whole (the decorator's `into_data` gathers the global value), so a
//! checkpoint written under one mesh and layout map loads under any other. Loading checks, before
//! anything is used, that the files have the recorded length and digest and that the parameter
//! shapes and optimizer match the model being resumed; every mismatch is an [`AppError`] that
//! names the file.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::Optimizer;
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Recorder};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Bool, Int, Tensor};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::model::ImdbMlp;
use crate::train::{AppError, Mode, OptimizerKind};

/// The name of the commit-point file inside a checkpoint directory.
pub const LATEST: &str = "LATEST";

/// Length and SHA-256 (lowercase hex) of a checkpoint file, recorded when it was written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileDigest {
    /// Length in bytes.
    pub len: u64,
    /// SHA-256 of the content, lowercase hex.
    pub sha256: String,
}

impl FileDigest {
    fn of(bytes: &[u8]) -> Self {
        Self {
            len: bytes.len() as u64,
            sha256: format!("{:x}", Sha256::digest(bytes)),
        }
    }
}

/// What a checkpoint records besides the model and optimizer records (its `state.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckpointState {
    /// Epochs completed (the next run starts at this 0-based epoch).
    pub epochs_done: usize,
    /// Mode that wrote it.
    pub mode: Mode,
    /// Optimizer it holds state for.
    pub optimizer: OptimizerKind,
    /// Losses so far (all epochs).
    pub train_losses: Vec<f32>,
    /// Global shape of every model parameter, by module path (`dense1.weight` -> `[1200, 48]`).
    pub params: BTreeMap<String, Vec<usize>>,
    /// Length and digest of `model.mpk` and `optim.mpk`.
    pub files: BTreeMap<String, FileDigest>,
}

/// Global parameter shapes of a module by path (`dense1.weight`), what a checkpoint must match.
pub fn param_shapes<B: burn::tensor::backend::Backend, M: Module<B>>(
    m: &M,
) -> BTreeMap<String, Vec<usize>> {
    struct Shapes {
        path: Vec<String>,
        out: BTreeMap<String, Vec<usize>>,
    }
    impl Shapes {
        fn add(&mut self, dims: Vec<usize>) {
            self.out.insert(self.path.join("."), dims);
        }
    }
    impl<B: burn::tensor::backend::Backend> ModuleVisitor<B> for Shapes {
        fn enter_module(&mut self, name: &str, _container: &str) {
            self.path.push(name.to_string());
        }
        fn exit_module(&mut self, _name: &str, _container: &str) {
            self.path.pop();
        }
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
            self.add(p.val().dims().to_vec());
        }
        fn visit_int<const D: usize>(&mut self, p: &Param<Tensor<B, D, Int>>) {
            self.add(p.val().dims().to_vec());
        }
        fn visit_bool<const D: usize>(&mut self, p: &Param<Tensor<B, D, Bool>>) {
            self.add(p.val().dims().to_vec());
        }
    }
    let mut v = Shapes {
        path: Vec::new(),
        out: BTreeMap::new(),
    };
    m.visit(&mut v);
    v.out
}

type Rec = NamedMpkBytesRecorder<FullPrecisionSettings>;

fn err(path: &Path, reason: impl std::fmt::Display) -> AppError {
    AppError::Checkpoint {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

/// Test hook: with `DTENSOR_CKPT_KILL_AT=k` set, the process kills itself with SIGKILL at the
/// `k`-th write point of a save (counted from 1 over the whole process: before, inside and after
/// each file, before and after the commit), so tests can check that a crash at each point leaves
/// a checkpoint that resumes correctly. Unset, it costs an environment lookup per point.
fn write_point() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static POINT: AtomicUsize = AtomicUsize::new(0);
    let Some(k) = std::env::var("DTENSOR_CKPT_KILL_AT")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    else {
        return;
    };
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

fn epoch_dir_name(epochs_done: usize) -> String {
    format!("epoch-{epochs_done:04}")
}

/// Checks up front that a checkpoint can be written in `dir` (creating it), so an unwritable
/// directory fails before training rather than after the first epoch.
///
/// # Errors
/// [`AppError::Checkpoint`] naming the directory.
pub fn check_writable(dir: &Path) -> Result<(), AppError> {
    std::fs::create_dir_all(dir).map_err(|e| err(dir, format!("cannot create it: {e}")))?;
    let probe = dir.join(".write-probe");
    std::fs::write(&probe, b"").map_err(|e| err(dir, format!("cannot write in it: {e}")))?;
    let _ = std::fs::remove_file(probe);
    Ok(())
}

/// Saves a checkpoint of `model` and `optim` as epoch `state.epochs_done` in `dir`, atomically
/// (see the module docs). `state.params` and `state.files` are filled in here.
///
/// # Errors
/// [`AppError::Checkpoint`] for any write error, naming the file.
pub fn save<B: AutodiffBackend, O: Optimizer<ImdbMlp<B>, B>>(
    dir: &Path,
    model: &ImdbMlp<B>,
    optim: &O,
    state: CheckpointState,
) -> Result<(), AppError> {
    let name = epoch_dir_name(state.epochs_done);
    let tmp = dir.join(format!(".tmp-{name}"));
    // Recording gathers every tensor's global value (across processes in an SPMD run, where
    // every rank takes part); then the chief (rank 0) alone writes, and the others wait for its
    // commit, so a checkpoint is one set of global tensors whatever the mesh or process count.
    let rec = Rec::new();
    let model_bytes = Recorder::<B>::record(&rec, model.clone().into_record(), ())
        .map_err(|e| err(&tmp.join("model.mpk"), e))?;
    let optim_bytes = Recorder::<B>::record(&rec, optim.to_record(), ())
        .map_err(|e| err(&tmp.join("optim.mpk"), e))?;
    let world = burn_dtensor::spmd::init()?;
    if !world.is_chief() {
        world.barrier();
        return Ok(());
    }
    let r = write_epoch(dir, &name, &tmp, model, model_bytes, optim_bytes, state);
    world.barrier();
    r
}

fn write_epoch<B: AutodiffBackend>(
    dir: &Path,
    name: &str,
    tmp: &Path,
    model: &ImdbMlp<B>,
    model_bytes: Vec<u8>,
    optim_bytes: Vec<u8>,
    mut state: CheckpointState,
) -> Result<(), AppError> {
    std::fs::create_dir_all(dir).map_err(|e| err(dir, e))?;
    if tmp.exists() {
        std::fs::remove_dir_all(tmp).map_err(|e| err(tmp, e))?;
    }
    std::fs::create_dir(tmp).map_err(|e| err(tmp, e))?;
    state.params = param_shapes(model);
    state.files = BTreeMap::from([
        ("model.mpk".to_string(), FileDigest::of(&model_bytes)),
        ("optim.mpk".to_string(), FileDigest::of(&optim_bytes)),
    ]);
    write_synced(&tmp.join("model.mpk"), &model_bytes)?;
    write_synced(&tmp.join("optim.mpk"), &optim_bytes)?;
    let json = serde_json::to_vec_pretty(&state).expect("checkpoint state serialises");
    write_synced(&tmp.join("state.json"), &json)?;
    sync_dir(tmp);
    let final_dir = dir.join(name);
    if final_dir.exists() {
        // A directory of the same epoch that LATEST may name: never touch it in place. Move it
        // aside first (LATEST, if it names it, then names nothing until the commit below, and a
        // resume says so rather than loading a mix).
        let aside = dir.join(format!(".old-{name}"));
        let _ = std::fs::remove_dir_all(&aside);
        std::fs::rename(&final_dir, &aside).map_err(|e| err(&final_dir, e))?;
    }
    std::fs::rename(tmp, &final_dir).map_err(|e| err(&final_dir, e))?;
    sync_dir(dir);
    write_point();
    let latest_tmp = dir.join(format!("{LATEST}.tmp"));
    write_synced(&latest_tmp, name.as_bytes())?;
    std::fs::rename(&latest_tmp, dir.join(LATEST)).map_err(|e| err(&dir.join(LATEST), e))?;
    sync_dir(dir);
    write_point();
    // Committed: drop the other epochs and any leftovers of interrupted saves.
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let n = e.file_name().to_string_lossy().to_string();
            let stale = (n.starts_with("epoch-") && n != name)
                || n.starts_with(".tmp-epoch-")
                || n.starts_with(".old-epoch-");
            if stale && e.path().is_dir() {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    Ok(())
}

/// A checkpoint read and verified, ready to load into a model and an optimizer.
pub struct Loaded {
    /// Its `state.json`.
    pub state: CheckpointState,
    /// The directory of the committed epoch.
    pub dir: PathBuf,
    model: Vec<u8>,
    optim: Vec<u8>,
}

/// Reads the checkpoint `LATEST` names in `dir` and verifies it: both records have the length
/// and SHA-256 recorded at write time, and `state.json` parses.
///
/// # Errors
/// [`AppError::Checkpoint`] naming the file that is missing, truncated or corrupt.
pub fn read(dir: &Path) -> Result<Loaded, AppError> {
    let latest = dir.join(LATEST);
    let name = std::fs::read_to_string(&latest).map_err(|e| {
        err(
            &latest,
            format!(
                "cannot read it ({e}); a checkpoint directory written by --checkpoint-dir has a LATEST file naming its committed epoch"
            ),
        )
    })?;
    let name = name.trim();
    if !name.starts_with("epoch-") || name.contains(['/', '\\']) {
        return Err(err(
            &latest,
            format!("names `{name}`, not an epoch directory"),
        ));
    }
    let edir = dir.join(name);
    let state_path = edir.join("state.json");
    let text = std::fs::read_to_string(&state_path).map_err(|e| err(&state_path, e))?;
    let state: CheckpointState =
        serde_json::from_str(&text).map_err(|e| err(&state_path, format!("corrupt: {e}")))?;
    let read_checked = |file: &str| -> Result<Vec<u8>, AppError> {
        let path = edir.join(file);
        let bytes = std::fs::read(&path).map_err(|e| err(&path, e))?;
        let want = state
            .files
            .get(file)
            .ok_or_else(|| err(&state_path, format!("records no digest for {file}")))?;
        let got = FileDigest::of(&bytes);
        if got.len != want.len {
            return Err(err(
                &path,
                format!(
                    "truncated or overwritten: {} bytes, {} were written; resume from another checkpoint",
                    got.len, want.len
                ),
            ));
        }
        if got.sha256 != want.sha256 {
            return Err(err(
                &path,
                "corrupt: its SHA-256 differs from the one recorded when it was written; resume from another checkpoint",
            ));
        }
        Ok(bytes)
    };
    let model = read_checked("model.mpk")?;
    let optim = read_checked("optim.mpk")?;
    Ok(Loaded {
        state,
        dir: edir,
        model,
        optim,
    })
}

impl Loaded {
    /// Checks that the checkpoint holds state for `optimizer` and parameters of the shapes in
    /// `expected` (see [`param_shapes`]).
    ///
    /// # Errors
    /// [`AppError::Checkpoint`] naming `state.json` and what differs.
    pub fn check(
        &self,
        expected: &BTreeMap<String, Vec<usize>>,
        optimizer: OptimizerKind,
    ) -> Result<(), AppError> {
        let state_path = self.dir.join("state.json");
        if self.state.optimizer != optimizer {
            return Err(err(
                &state_path,
                format!(
                    "holds {:?} state but --optimizer is {:?}; resume with --optimizer {}",
                    self.state.optimizer,
                    optimizer,
                    format!("{:?}", self.state.optimizer).to_lowercase()
                ),
            ));
        }
        if &self.state.params != expected {
            let diff: Vec<String> = expected
                .iter()
                .filter(|(k, v)| self.state.params.get(*k) != Some(v))
                .map(|(k, v)| {
                    format!(
                        "{k}: checkpoint {:?}, model {v:?}",
                        self.state.params.get(k)
                    )
                })
                .chain(
                    self.state
                        .params
                        .keys()
                        .filter(|k| !expected.contains_key(*k))
                        .map(|k| format!("{k}: not in the model")),
                )
                .collect();
            return Err(err(
                &state_path,
                format!(
                    "was written for another model ({}); resume with the model it was trained with",
                    diff.join("; ")
                ),
            ));
        }
        Ok(())
    }

    /// Loads the records into `model` (freshly built, laid out for the current mesh) and
    /// `optim`, after checking that the checkpoint's optimizer and every parameter shape match.
    ///
    /// # Errors
    /// [`AppError::Checkpoint`] naming `state.json` for an optimizer or shape mismatch, or the
    /// record file that fails to decode.
    pub fn load_into<B: AutodiffBackend, O: Optimizer<ImdbMlp<B>, B>>(
        self,
        model: ImdbMlp<B>,
        optim: O,
        optimizer: OptimizerKind,
        device: &B::Device,
    ) -> Result<(ImdbMlp<B>, O), AppError> {
        self.check(&param_shapes(&model), optimizer)?;
        let rec = Rec::new();
        let mrec = Recorder::<B>::load(&rec, self.model, device)
            .map_err(|e| err(&self.dir.join("model.mpk"), e))?;
        let orec = Recorder::<B>::load(&rec, self.optim, device)
            .map_err(|e| err(&self.dir.join("optim.mpk"), e))?;
        Ok((model.load_record(mrec), optim.load_record(orec)))
    }
}
