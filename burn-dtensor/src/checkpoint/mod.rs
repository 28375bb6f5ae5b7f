//! Sharded checkpoints: every process writes only the distinct shards it owns, and a load on
//! **any** mesh, layout and process count reads only the parts of the files that overlap the
//! shards it will hold (PyTorch DCP's `save` / `load` and Orbax's sharded checkpoints, for
//! Burn). No process ever holds a whole tensor that its layout shards, at save or at load.
//!
//! ```
//! use burn::backend::NdArray;
//! use burn::tensor::{Tensor, TensorData};
//! use burn_dtensor::checkpoint::{Checkpoint, SaveOptions, StateDict, save};
//! use burn_dtensor::{DTensorExt, DistributedBackend, Layout, Mesh, distribute};
//!
//! type B = DistributedBackend<NdArray>;
//! let dir = std::env::temp_dir().join(format!("ckpt-doc-{}", std::process::id()));
//! let _ = std::fs::remove_dir_all(&dir);
//! // Saved from a [4, 2] mesh with the columns sharded over `model`...
//! let cpu = burn::backend::ndarray::NdArrayDevice::Cpu;
//! let mesh = Mesh::virtual_devices([("batch", 4), ("model", 2)], cpu)?;
//! let w: Tensor<B, 2> = distribute(
//!     TensorData::new((0..24).map(|v| v as f32).collect::<Vec<_>>(), [4, 6]),
//!     &Layout::new(&mesh, ["unsharded", "model"])?,
//! )?;
//! let mut state = StateDict::new();
//! state.insert("w", w.clone())?;
//! let meta = save(&dir.join("step-1"), state, &SaveOptions::default())?;
//! assert_eq!(meta.tensors["w"].shards.len(), 2); // one writer per distinct shard
//! // ... loaded on a mesh of 3 with the rows sharded (uneven: 2, 1, 1 rows).
//! let other = Mesh::virtual_devices([("x", 3)], cpu)?;
//! let ckpt = Checkpoint::open(&dir.join("step-1"))?;
//! let back: Tensor<B, 2> = ckpt.read("w", &Layout::new(&other, ["x", "unsharded"])?)?;
//! assert_eq!(back.describe(), "f32[4@x, 6]");
//! back.into_data().assert_eq(&w.into_data(), true);
//! # std::fs::remove_dir_all(&dir).unwrap();
//! # Ok::<(), burn_dtensor::DTensorError>(())
//! ```
//!
//! **Layout on disk** ([`format`](mod@format)): a checkpoint is a directory holding one safetensors file per
//! process that owns a shard (`shards-00002-of-00004.safetensors`, readable by any safetensors
//! tool) and `metadata.json`: per tensor its global shape, dtype, the layout at save time, and per
//! shard its box (global offsets and sizes), file, byte range and CRC-32 per 256 KiB block.
//!
//! **Writers**: each distinct shard is written once, by one of the processes holding it: the
//! one with the fewest bytes planned so far (replicas spread the writing over the processes, as
//! PyTorch DCP's deduplicating save plan does). A plain backend's tensors
//! ([`StateDict::insert_data`]) are written by the chief. Partial tensors are reduced first
//! (their settled value is saved).
//!
//! **Commit** ([`save`]): all processes write and sync their files into a staging directory
//! (`.NAME.partial` beside `NAME`), exchange their shard index (which doubles as a barrier),
//! then the chief writes and syncs `metadata.json` and renames the staging directory to `NAME`.
//! A crash of any process at any point leaves `NAME` absent (the previous checkpoint, if any,
//! untouched); a directory without `metadata.json` is never a checkpoint. The directory must be
//! on a file system every process sees (one host, or NFS / Lustre / GPFS across hosts).
//!
//! **Load** ([`Checkpoint`]): [`Checkpoint::read`] builds a tensor in any layout on any mesh;
//! [`Checkpoint::load_module`] loads a module in place, each parameter in the layout it has now
//! (apply the [`LayoutMap`](crate::LayoutMap) first, as DCP loads into a sharded state dict).
//! [`Checkpoint::load_module_whole`] loads into a module of a plain backend, the converter to one
//! ordinary Burn record for users who leave the mesh. A missing, damaged or foreign file, or a
//! tensor whose name, shape or rank does not match, is a [`DTensorError::Checkpoint`] naming
//! the tensor and the file.

pub mod format;
mod optim;
mod read;
mod write;

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{BasicOps, Bool, DType, Int, Tensor, TensorData};

pub use format::{BLOCK_BYTES, CheckpointMetadata, METADATA_FILE, ShardMetadata, TensorMetadata};
pub use optim::{ShardedOptimizer, StateParts};

use crate::api::{DTensorExt, DistributedKind, DistributedOps};
use crate::error::{DTensorError, Result};
use crate::layout::Layout;

pub(crate) fn ckpt_err(path: &Path, reason: impl std::fmt::Display) -> DTensorError {
    DTensorError::Checkpoint {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

/// Options of [`save`].
#[derive(Clone, Default)]
pub struct SaveOptions {
    write_point: Option<Arc<dyn Fn() + Send + Sync>>,
}

impl SaveOptions {
    /// Calls `f` at every write point of a save (before and after each file, halfway through the
    /// shard file and the metadata, before and after the commit's rename): a test hook, e.g. to
    /// kill the process at the k-th point and check that the previous checkpoint stays current.
    pub fn on_write_point(mut self, f: impl Fn() + Send + Sync + 'static) -> Self {
        self.write_point = Some(Arc::new(f));
        self
    }
    pub(crate) fn write_point(&self) {
        if let Some(f) = &self.write_point {
            f();
        }
    }
}

/// The tensors to save, by name (PyTorch's state dict): each tensor's metadata and the
/// distinct shards this process owns (their values are downloaded only while the file is
/// written). Every process inserts the same names in the same order (SPMD), since a partial
/// tensor is reduced on insertion.
#[derive(Default)]
pub struct StateDict {
    tensors: BTreeMap<String, TensorMetadata>,
    counters: BTreeMap<String, u64>,
    attributes: BTreeMap<String, serde_json::Value>,
    owned: Vec<write::OwnedShard>,
    /// Bytes each process (by rank) is planned to write so far.
    planned: BTreeMap<usize, u64>,
}

impl StateDict {
    /// An empty state dict.
    pub fn new() -> Self {
        Self::default()
    }

    /// The names inserted so far, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// Adds a counter (an optimizer's step count, epochs done) under `name`; the chief's value
    /// is the one written.
    ///
    /// # Errors
    /// [`DTensorError::Checkpoint`] for a name already present.
    pub fn insert_counter(&mut self, name: impl Into<String>, value: u64) -> Result<()> {
        let name = name.into();
        self.check_new(&name)?;
        self.counters.insert(name, value);
        Ok(())
    }

    fn check_new(&self, name: &str) -> Result<()> {
        if self.tensors.contains_key(name)
            || self.counters.contains_key(name)
            || self.attributes.contains_key(name)
        {
            return Err(ckpt_err(
                Path::new("<state dict>"),
                format!("`{name}` inserted twice: give every entry its own name"),
            ));
        }
        Ok(())
    }

    /// Adds `value` (anything serde serialises: a trainer's epoch count and loss history, a
    /// vectorizer) as the JSON attribute `name` of the metadata; the chief's value is the one
    /// written. Read it back with [`Checkpoint::attribute`].
    ///
    /// # Errors
    /// [`DTensorError::Checkpoint`] for a name already present or a value that does not
    /// serialise to JSON.
    pub fn insert_attribute(
        &mut self,
        name: impl Into<String>,
        value: &impl serde::Serialize,
    ) -> Result<()> {
        let name = name.into();
        self.check_new(&name)?;
        let v = serde_json::to_value(value).map_err(|e| {
            ckpt_err(
                Path::new("<state dict>"),
                format!("attribute `{name}` does not serialise to JSON: {e}"),
            )
        })?;
        self.attributes.insert(name, v);
        Ok(())
    }

    /// Adds a whole tensor held on the host by this process (shape `data.shape`, any dtype a
    /// checkpoint holds) under `name`: the chief writes it as one shard covering the tensor;
    /// every process must insert it (the same value, SPMD). The entry point for plain-backend
    /// tensors (`tensor.into_data()`); it loads under any layout like any other tensor.
    ///
    /// # Errors
    /// [`DTensorError::Checkpoint`] for a name already present or a dtype a checkpoint cannot
    /// hold (quantized: dequantize first).
    pub fn insert_data(&mut self, name: impl Into<String>, data: TensorData) -> Result<()> {
        let name = name.into();
        self.check_new(&name)?;
        let shape = data.shape.to_vec();
        let dtype = data.dtype;
        let dtype_name = format::dtype_name(dtype).ok_or_else(|| {
            ckpt_err(
                Path::new("<state dict>"),
                format!("tensor `{name}` has dtype {dtype:?}, which a checkpoint cannot hold (dequantize it first)"),
            )
        })?;
        let entry = TensorMetadata {
            shape: shape.clone(),
            dtype: dtype_name,
            mesh_axes: Vec::new(),
            sharding_spec: vec![crate::UNSHARDED.to_string(); shape.len()],
            shards: Vec::new(),
        };
        if !shape.contains(&0) {
            *self.planned.entry(0).or_default() +=
                (shape.iter().product::<usize>() * format::elem_bytes(dtype)) as u64;
        }
        if crate::spmd::init()?.is_chief() && !shape.contains(&0) {
            self.owned.push(write::OwnedShard {
                tensor: name.clone(),
                offsets: vec![0; shape.len()],
                sizes: shape,
                dtype,
                values: Box::new(move || data),
            });
        }
        self.tensors.insert(name, entry);
        Ok(())
    }

    /// Every parameter of `module`, a module of a plain backend (no mesh), whole, by module
    /// path ([`StateDict::insert_data`] of each parameter's value): the checkpoint of a
    /// one-device run, which loads on any mesh like a sharded one.
    ///
    /// # Errors
    /// As [`StateDict::insert_data`].
    pub fn from_module_whole<B: Backend, M: Module<B>>(module: &M) -> Result<Self> {
        sync_running_states(module);
        let mut v = CollectWhole {
            path: Vec::new(),
            state: Self::new(),
            error: None,
        };
        module.visit(&mut v);
        match v.error {
            Some(e) => Err(e),
            None => Ok(v.state),
        }
    }

    /// Adds `tensor` (global shape, any layout; float, int or bool) under `name`.
    ///
    /// # Errors
    /// [`DTensorError::Checkpoint`] for a name already present or a dtype a checkpoint cannot
    /// hold (quantized: dequantize first).
    pub fn insert<B, const D: usize, K>(
        &mut self,
        name: impl Into<String>,
        tensor: Tensor<B, D, K>,
    ) -> Result<()>
    where
        B: DistributedOps,
        K: DistributedKind<B> + 'static,
        <K as BasicOps<B>>::Elem: burn::tensor::Element,
    {
        let name = name.into();
        let here = Path::new("<state dict>");
        self.check_new(&name)?;
        let shape = tensor.dims().to_vec();
        let dtype = tensor.dtype();
        let mut layout = DTensorExt::layout(&tensor);
        let mut prim = tensor.into_primitive();
        if layout.is_partial() {
            layout = layout.without_partial();
            prim = K::relayout(prim, &layout)?;
        }
        let entry = write::tensor_entry(&shape, dtype, &layout).ok_or_else(|| {
            ckpt_err(
                here,
                format!("tensor `{name}` has dtype {dtype:?}, which a checkpoint cannot hold (dequantize it first)"),
            )
        })?;
        let topo = layout.mesh.clone();
        let boxes: Vec<Vec<Range<usize>>> = (0..topo.size())
            .map(|g| layout.shard_ranges(&shape, g))
            .collect();
        let writers = self.plan_writers(&topo, &boxes, dtype);
        for (j, p) in K::local_shards(prim).into_iter().enumerate() {
            let g = topo.global(j);
            if !writers.contains(&g) {
                continue; // empty, or another position writes this box
            }
            let mine = &boxes[g];
            self.owned.push(write::OwnedShard {
                tensor: name.clone(),
                offsets: mine.iter().map(|r| r.start).collect(),
                sizes: mine.iter().map(|r| r.len()).collect(),
                dtype,
                values: Box::new(move || K::shard_into_host(p)),
            });
        }
        self.tensors.insert(name, entry);
        Ok(())
    }

    /// The mesh position that writes each distinct non-empty box of `boxes` (one per mesh
    /// position): among the positions holding the box, the one whose process has the fewest
    /// bytes planned so far in this state dict (the first in mesh order on a tie), so that
    /// replicas spread the writing over the processes (PyTorch DCP's deduplicating save plan
    /// balances the same way). Every process computes the same plan: the same tensors are
    /// inserted in the same order.
    fn plan_writers(
        &mut self,
        topo: &crate::MeshTopology,
        boxes: &[Vec<Range<usize>>],
        dtype: DType,
    ) -> Vec<usize> {
        let elem = format::elem_bytes(dtype) as u64;
        let mut done = vec![false; boxes.len()];
        let mut writers = Vec::new();
        for g in 0..boxes.len() {
            if done[g] {
                continue;
            }
            let holders: Vec<usize> = (g..boxes.len()).filter(|&q| boxes[q] == boxes[g]).collect();
            for &q in &holders {
                done[q] = true;
            }
            let numel = crate::host::box_numel(&boxes[g]);
            if numel == 0 {
                continue;
            }
            let load = |q: usize| self.planned.get(&topo.process_of(q)).copied().unwrap_or(0);
            let w = *holders
                .iter()
                .min_by_key(|&&q| (load(q), q))
                .expect("a box has a holder");
            *self.planned.entry(topo.process_of(w)).or_default() += numel as u64 * elem;
            writers.push(w);
        }
        writers
    }

    /// Every parameter of `module` (float, int and bool), by its module path (`dense1.weight`),
    /// in its current layout.
    ///
    /// # Errors
    /// As [`StateDict::insert`].
    pub fn from_module<B: DistributedOps, M: Module<B>>(module: &M) -> Result<Self> {
        sync_running_states(module);
        let mut v = Collect {
            path: Vec::new(),
            state: Self::new(),
            error: None,
        };
        module.visit(&mut v);
        match v.error {
            Some(e) => Err(e),
            None => Ok(v.state),
        }
    }
}

struct Collect {
    path: Vec<String>,
    state: StateDict,
    error: Option<DTensorError>,
}

impl Collect {
    fn add<B, const D: usize, K>(&mut self, t: Tensor<B, D, K>)
    where
        B: DistributedOps,
        K: DistributedKind<B> + 'static,
        <K as BasicOps<B>>::Elem: burn::tensor::Element,
    {
        if self.error.is_none()
            && let Err(e) = self.state.insert(self.path.join("."), t)
        {
            self.error = Some(e);
        }
    }
}

/// The `ModuleVisitor` of a state collector (`$ty`, with a `path` stack and an `add` method):
/// each parameter's value `$t` given to `add` as `$e`, under its module path.
macro_rules! collector_visitor {
    ($ty:ty, $bound:path, $t:ident => $e:expr) => {
        impl<B: $bound> ModuleVisitor<B> for $ty {
            fn enter_module(&mut self, name: &str, _container_type: &str) {
                self.path.push(name.to_string());
            }
            fn exit_module(&mut self, _name: &str, _container_type: &str) {
                self.path.pop();
            }
            fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
                let $t = p.val();
                self.add($e);
            }
            fn visit_int<const D: usize>(&mut self, p: &Param<Tensor<B, D, Int>>) {
                let $t = p.val();
                self.add($e);
            }
            fn visit_bool<const D: usize>(&mut self, p: &Param<Tensor<B, D, Bool>>) {
                let $t = p.val();
                self.add($e);
            }
        }
    };
}

collector_visitor!(Collect, DistributedOps, t => t);

/// Folds the pending update of every `RunningState` of `module` (BatchNorm's running mean and
/// variance) into its value. Burn's module visit reads a running state's value without this
/// (the last training step's update would be lost, the statistics one step behind); its
/// `into_record` syncs, on the shared state, so a record of a clone (tensor handles only, no
/// copy or collective) does it.
fn sync_running_states<B: Backend, M: Module<B>>(module: &M) {
    let _ = module.clone().into_record();
}

struct CollectWhole {
    path: Vec<String>,
    state: StateDict,
    error: Option<DTensorError>,
}

impl CollectWhole {
    fn add(&mut self, data: TensorData) {
        if self.error.is_none()
            && let Err(e) = self.state.insert_data(self.path.join("."), data)
        {
            self.error = Some(e);
        }
    }
}

collector_visitor!(CollectWhole, Backend, t => t.into_data());

/// Writes `state` as a sharded checkpoint into the **new** directory `dir` (see the module docs
/// for the files and the commit). Collective: every process calls it with the same names.
/// Returns the metadata written.
///
/// # Errors
/// [`DTensorError::Checkpoint`] when `dir` exists, when the staging directory is not visible to
/// every process, or for any write error (on any process: the error reaches every process and
/// nothing is committed).
pub fn save(dir: &Path, state: StateDict, opts: &SaveOptions) -> Result<CheckpointMetadata> {
    write::save(dir, state, opts)
}

/// [`save`] of every parameter of `module` ([`StateDict::from_module`]).
///
/// # Errors
/// As [`save`].
pub fn save_module<B: DistributedOps, M: Module<B>>(
    dir: &Path,
    module: &M,
) -> Result<CheckpointMetadata> {
    save(
        dir,
        StateDict::from_module(module)?,
        &SaveOptions::default(),
    )
}

/// A committed sharded checkpoint, opened for reading (its metadata read and checked).
#[derive(Debug, Clone)]
pub struct Checkpoint {
    dir: PathBuf,
    meta: CheckpointMetadata,
    /// The shard files' headers, each read once, on its first read.
    headers: read::Headers,
}

impl Checkpoint {
    /// Opens the checkpoint in `dir`.
    ///
    /// # Errors
    /// [`DTensorError::Checkpoint`] when `dir` has no `metadata.json` (not a checkpoint, or one
    /// whose save never committed), it is not a sharded checkpoint of a version this build
    /// reads, or a tensor's entry is inconsistent ([`CheckpointMetadata::check`]: a shard
    /// outside the shape, overlapping or missing shards, a byte range that does not hold its
    /// box, a shard file outside the directory), naming the tensor and the shard.
    pub fn open(dir: &Path) -> Result<Self> {
        let path = dir.join(METADATA_FILE);
        let bytes = std::fs::read(&path).map_err(|e| {
            ckpt_err(
                &path,
                format!("cannot read it ({e}): not a committed sharded checkpoint"),
            )
        })?;
        let meta: CheckpointMetadata = serde_json::from_slice(&bytes)
            .map_err(|e| ckpt_err(&path, format!("not a sharded checkpoint's metadata: {e}")))?;
        if meta.format != format::FORMAT || meta.version > format::VERSION {
            return Err(ckpt_err(
                &path,
                format!(
                    "format `{}` version {}: this build reads `{}` up to version {}",
                    meta.format,
                    meta.version,
                    format::FORMAT,
                    format::VERSION
                ),
            ));
        }
        meta.check().map_err(|reason| ckpt_err(&path, reason))?;
        Ok(Self {
            dir: dir.to_path_buf(),
            meta,
            headers: Default::default(),
        })
    }

    /// The checkpoint's metadata.
    pub fn metadata(&self) -> &CheckpointMetadata {
        &self.meta
    }

    /// The counter `name` ([`StateDict::insert_counter`]).
    ///
    /// # Errors
    /// [`DTensorError::Checkpoint`] when the checkpoint has no such counter.
    pub fn counter(&self, name: &str) -> Result<u64> {
        self.meta
            .counters
            .get(name)
            .copied()
            .ok_or_else(|| ckpt_err(&self.dir, format!("no counter `{name}` in this checkpoint")))
    }

    /// The attribute `name` ([`StateDict::insert_attribute`]) as a `T`.
    ///
    /// # Errors
    /// [`DTensorError::Checkpoint`] naming `metadata.json` when the checkpoint has no such
    /// attribute or its value is not a `T`.
    pub fn attribute<T: serde::de::DeserializeOwned>(&self, name: &str) -> Result<T> {
        let path = self.dir.join(METADATA_FILE);
        let v =
            self.meta.attributes.get(name).ok_or_else(|| {
                ckpt_err(&path, format!("no attribute `{name}` in this checkpoint"))
            })?;
        T::deserialize(v).map_err(|e| ckpt_err(&path, format!("attribute `{name}`: {e}")))
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn tensor(&self, name: &str, shape: Option<&[usize]>) -> Result<&TensorMetadata> {
        let t = self.meta.tensors.get(name).ok_or_else(|| {
            let mut names: Vec<&str> = self.meta.tensors.keys().map(String::as_str).collect();
            names.truncate(8);
            ckpt_err(
                &self.dir,
                format!(
                    "no tensor `{name}` in this checkpoint (it has {} tensors: {}{}); is it a \
                     checkpoint of another model?",
                    self.meta.tensors.len(),
                    names.join(", "),
                    if self.meta.tensors.len() > 8 {
                        ", ..."
                    } else {
                        ""
                    }
                ),
            )
        })?;
        if let Some(shape) = shape
            && shape != t.shape.as_slice()
        {
            return Err(ckpt_err(
                &self.dir,
                format!(
                    "tensor `{name}` has shape {:?} in the checkpoint but {shape:?} here; is it a \
                     checkpoint of another model?",
                    t.shape
                ),
            ));
        }
        Ok(t)
    }

    /// Tensor `name`'s entry, checked to have `shape` and to be of tensor kind `kind` (Burn's
    /// `TensorKind::name`): a read converts between dtypes of one kind (an `F32` checkpoint
    /// into an `F16` model), never between kinds, which would truncate floats into ints or
    /// ints into bools without a word.
    ///
    /// # Errors
    /// As [`Checkpoint::tensor`], and a tensor of another kind.
    fn tensor_like(&self, name: &str, shape: &[usize], kind: &str) -> Result<&TensorMetadata> {
        let t = self.tensor(name, Some(shape))?;
        match format::kind_of_name(&t.dtype) {
            Some(saved) if saved != kind => Err(ckpt_err(
                &self.dir,
                format!(
                    "tensor `{name}` is saved as {} (kind {saved}) but read as kind {kind}: read \
                     it with kind {saved} and convert it yourself if that is meant",
                    t.dtype
                ),
            )),
            _ => Ok(t),
        }
    }

    /// The values of the box `ranges` of tensor `name` (host data in the saved dtype): reads
    /// only the checksum blocks of the saved shards that overlap the box.
    ///
    /// # Errors
    /// [`DTensorError::Checkpoint`]: unknown name, a box of another rank, outside the tensor or
    /// with a reversed range, missing or damaged shards, a shard file whose safetensors header
    /// disagrees with `metadata.json` on a shard read from it (its name, dtype, shape or bytes;
    /// each file's header is read once per opened checkpoint).
    pub fn read_box(&self, name: &str, ranges: &[Range<usize>]) -> Result<TensorData> {
        let t = self.tensor(name, None)?;
        if ranges.len() != t.shape.len()
            || ranges
                .iter()
                .zip(&t.shape)
                .any(|(r, &n)| r.end > n || r.start > r.end)
        {
            return Err(ckpt_err(
                &self.dir,
                format!(
                    "box {ranges:?} is not a box of tensor `{name}` of shape {:?}: give one \
                     range per dim, inside the dim, start at most end",
                    t.shape
                ),
            ));
        }
        read::read_box(&self.dir, &self.headers, name, t, ranges)
    }

    /// Tensor `name`'s whole value on the host (for export and for leaving the mesh; a sharded
    /// tensor is better read with [`Checkpoint::read`]).
    ///
    /// # Errors
    /// As [`Checkpoint::read_box`].
    pub fn read_whole(&self, name: &str) -> Result<TensorData> {
        let shape = self.tensor(name, None)?.shape.clone();
        let ranges: Vec<Range<usize>> = shape.iter().map(|&n| 0..n).collect();
        self.read_box(name, &ranges)
    }

    /// Tensor `name` in `layout` (any mesh of `B`'s devices, any process count): each process
    /// reads only the boxes of its own mesh positions, each distinct box once, and uploads it
    /// to the devices that hold it. The dtype is the one Burn's `Tensor::from_data` creates from
    /// the saved values on the layout's devices (the inner device's default for the kind: a
    /// tensor saved as `I64` reads as `I32` on Wgpu, one saved as `F64` as `F32` on an `f32`
    /// backend); the values are converted as Burn converts them.
    ///
    /// # Errors
    /// [`DTensorError::Checkpoint`] for an unknown name, a rank other than `D`, a tensor of
    /// another kind than `K` (a float tensor read as `Int`, say), missing or damaged shards;
    /// [`DTensorError::Unsupported`] for a partial `layout`;
    /// [`DTensorError::UnknownMesh`] for a layout on a mesh of other devices.
    pub fn read<B, const D: usize, K>(&self, name: &str, layout: &Layout) -> Result<Tensor<B, D, K>>
    where
        B: DistributedOps,
        K: DistributedKind<B>,
        <K as BasicOps<B>>::Elem: burn::tensor::Element,
    {
        let t = self.tensor(name, None)?;
        if t.shape.len() != D {
            return Err(ckpt_err(
                &self.dir,
                format!(
                    "tensor `{name}` has rank {} in the checkpoint, not {D}",
                    t.shape.len()
                ),
            ));
        }
        let shape: [usize; D] = t.shape.clone().try_into().expect("rank checked");
        self.read_as(name, shape, layout, None)
    }

    /// [`Checkpoint::read`] with the shape checked and the values converted to `dtype`.
    fn read_as<B, const D: usize, K>(
        &self,
        name: &str,
        shape: [usize; D],
        layout: &Layout,
        dtype: Option<DType>,
    ) -> Result<Tensor<B, D, K>>
    where
        B: DistributedOps,
        K: DistributedKind<B>,
        <K as BasicOps<B>>::Elem: burn::tensor::Element,
    {
        self.tensor_like(name, &shape, <K as burn::tensor::TensorKind<B>>::name())?;
        layout.check_rank(D)?;
        if layout.is_partial() {
            return Err(DTensorError::Unsupported(format!(
                "reading `{name}` into the partial layout {layout}: give a layout without pending reductions"
            )));
        }
        let mesh = crate::api::mesh_of_layout::<B>(layout)?;
        let topo = &layout.mesh;
        let mut boxes: HashMap<Vec<Range<usize>>, TensorData> = HashMap::new();
        let mut prims = Vec::with_capacity(topo.local_size());
        for (j, device) in mesh.devices().iter().enumerate() {
            let ranges = layout.shard_ranges(&shape, topo.global(j));
            let data = match boxes.get(&ranges) {
                Some(d) => d.clone(),
                None => {
                    let mut d = self.read_box(name, &ranges)?;
                    if let Some(want) = dtype
                        && want != d.dtype
                    {
                        d = d.convert_dtype(want);
                    }
                    boxes.insert(ranges, d.clone());
                    d
                }
            };
            prims.push(Tensor::<B::Inner, D, K>::from_data(data, device).into_primitive());
        }
        drop(boxes);
        Ok(Tensor::from_primitive(K::from_local_shards(
            shape.to_vec(),
            layout,
            prims,
        )))
    }

    /// Loads every parameter of `module` from this checkpoint, in place: each parameter keeps
    /// its current layout (apply the layout map first), dtype and `require_grad`, and each
    /// process reads only its shards. Parameters are found by module path (`dense1.weight`);
    /// tensors of the checkpoint that the module lacks are ignored (an optimizer's, say).
    ///
    /// # Errors
    /// [`DTensorError::Checkpoint`] naming the first parameter the checkpoint lacks or holds in
    /// another shape or tensor kind (a dtype of the same kind is converted), or a missing or
    /// damaged shard.
    pub fn load_module<B: DistributedOps, M: Module<B>>(&self, module: M) -> Result<M> {
        let mut m = Loader {
            ckpt: self,
            path: Vec::new(),
            error: None,
        };
        let module = module.map(&mut m);
        match m.error {
            Some(e) => Err(e),
            None => Ok(module),
        }
    }

    /// Loads every parameter of `module`, a module of a plain backend `B` (no mesh), with
    /// whole tensors on `device`: the converter from a sharded checkpoint to one ordinary Burn
    /// module, which Burn's recorders then save as one file (`module.save_file(...)`).
    ///
    /// # Errors
    /// As [`Checkpoint::load_module`].
    pub fn load_module_whole<B: Backend, M: Module<B>>(
        &self,
        module: M,
        device: &B::Device,
    ) -> Result<M> {
        let mut m = WholeLoader::<B> {
            ckpt: self,
            device: device.clone(),
            path: Vec::new(),
            error: None,
        };
        let module = module.map(&mut m);
        match m.error {
            Some(e) => Err(e),
            None => Ok(module),
        }
    }
}

struct Loader<'a> {
    ckpt: &'a Checkpoint,
    path: Vec<String>,
    error: Option<DTensorError>,
}

impl Loader<'_> {
    fn load<B, const D: usize, K>(&mut self, t: Tensor<B, D, K>) -> Tensor<B, D, K>
    where
        B: DistributedOps,
        K: DistributedKind<B> + burn::tensor::TensorKind<B>,
        <K as BasicOps<B>>::Elem: burn::tensor::Element,
    {
        if self.error.is_some() {
            return t;
        }
        let layout = DTensorExt::layout(&t);
        match self
            .ckpt
            .read_as::<B, D, K>(&self.path.join("."), t.dims(), &layout, Some(t.dtype()))
        {
            Ok(v) => v,
            Err(e) => {
                self.error = Some(e);
                t
            }
        }
    }
}

/// The `ModuleMapper` of a checkpoint loader (`$ty`, with a `path` stack and a `load` method for
/// every tensor kind): each parameter replaced by `load` under its module path, a float
/// parameter keeping whether it requires a gradient.
macro_rules! loader_mapper {
    ($ty:ty, $bound:path) => {
        impl<B: $bound> ModuleMapper<B> for $ty {
            fn enter_module(&mut self, name: &str, _container_type: &str) {
                self.path.push(name.to_string());
            }
            fn exit_module(&mut self, _name: &str, _container_type: &str) {
                self.path.pop();
            }
            fn map_float<const D: usize>(
                &mut self,
                param: Param<Tensor<B, D>>,
            ) -> Param<Tensor<B, D>> {
                param.map(|t| {
                    let grad = t.is_require_grad();
                    self.load(t).set_require_grad(grad)
                })
            }
            fn map_int<const D: usize>(
                &mut self,
                param: Param<Tensor<B, D, Int>>,
            ) -> Param<Tensor<B, D, Int>> {
                param.map(|t| self.load(t))
            }
            fn map_bool<const D: usize>(
                &mut self,
                param: Param<Tensor<B, D, Bool>>,
            ) -> Param<Tensor<B, D, Bool>> {
                param.map(|t| self.load(t))
            }
        }
    };
}

loader_mapper!(Loader<'_>, DistributedOps);

struct WholeLoader<'a, B: Backend> {
    ckpt: &'a Checkpoint,
    device: B::Device,
    path: Vec<String>,
    error: Option<DTensorError>,
}

impl<B: Backend> WholeLoader<'_, B> {
    fn load<const D: usize, K>(&mut self, t: Tensor<B, D, K>) -> Tensor<B, D, K>
    where
        K: BasicOps<B> + burn::tensor::TensorKind<B>,
    {
        if self.error.is_some() {
            return t;
        }
        let name = self.path.join(".");
        let read = self
            .ckpt
            .tensor_like(&name, &t.dims(), K::name())
            .and_then(|_| self.ckpt.read_whole(&name));
        match read {
            Ok(mut d) => {
                if d.dtype != t.dtype() {
                    d = d.convert_dtype(t.dtype());
                }
                Tensor::from_data(d, &self.device)
            }
            Err(e) => {
                self.error = Some(e);
                t
            }
        }
    }
}

loader_mapper!(WholeLoader<'_, B>, Backend);
