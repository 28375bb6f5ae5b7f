//! Typed errors for every user-facing entry point (mesh and layout construction,
//! redistribution, host <-> mesh transfers, layout maps).
//!
//! Backend ops themselves cannot return errors (Burn's op traits are infallible); they
//! only ever see layouts that these constructors already validated.

use thiserror::Error;

/// Everything that can go wrong when building meshes and layouts or moving data between them.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum DTensorError {
    /// A layout or redistribution names a mesh axis the mesh does not have.
    #[error(
        "unknown mesh axis `{axis}`: the mesh has axes [{available}]; use one of them or `unsharded`"
    )]
    UnknownAxis {
        /// The offending name.
        axis: String,
        /// The mesh's axis names, comma separated.
        available: String,
    },
    /// A mesh axis shards two tensor dims (or appears twice in a mesh definition).
    #[error(
        "mesh axis `{axis}` is used twice (dims {first} and {second}); each mesh axis may shard at most one tensor dim"
    )]
    AxisUsedTwice {
        /// The axis.
        axis: String,
        /// First dim (or position) using it.
        first: usize,
        /// Second dim (or position) using it.
        second: usize,
    },
    /// The layout's rank is not the tensor's rank.
    #[error(
        "rank mismatch: the layout has {layout_rank} dims but the tensor has rank {tensor_rank}; give one entry (`unsharded` or an axis name) per tensor dim"
    )]
    RankMismatch {
        /// Entries in the layout.
        layout_rank: usize,
        /// Rank of the tensor.
        tensor_rank: usize,
    },
    /// The product of the mesh axis sizes differs from the number of devices given.
    #[error(
        "device count mismatch: mesh shape {shape} needs {expected} devices but {given} were given (repeat a device to make virtual devices)"
    )]
    DeviceCountMismatch {
        /// Mesh shape, e.g. `batch=4, model=2`.
        shape: String,
        /// Product of the axis sizes.
        expected: usize,
        /// Devices passed in.
        given: usize,
    },
    /// One process built more distinct meshes than a device id can number.
    #[error(
        "more than {limit} distinct meshes in one process: a mesh's id is Burn's 16-bit device \
         index; build each mesh once and reuse it (a mesh built again with the same axes, \
         devices and settings is the same mesh and does not count again)"
    )]
    TooManyMeshes {
        /// [`crate::MAX_MESHES`].
        limit: usize,
    },
    /// A mesh with more positions than can be counted, or a mesh of virtual devices with more
    /// than [`crate::MAX_VIRTUAL_POSITIONS`].
    #[error("mesh shape {shape} is too large: {reason}")]
    MeshTooLarge {
        /// Mesh shape, e.g. `batch=4, model=2`.
        shape: String,
        /// How large, against which limit.
        reason: String,
    },
    /// A mesh axis of size zero, or an axis name that is empty, `unsharded`, or holds whitespace
    /// or one of `,=@[]` (the characters of the mesh spec and of a tensor's description).
    #[error(
        "invalid mesh axis `{axis}` of size {size}: axis names must be non-empty, not `unsharded`, \
         without whitespace or any of `,=@[]` (e.g. `batch`, `model_2`), and sizes at least 1"
    )]
    InvalidAxis {
        /// Axis name.
        axis: String,
        /// Axis size.
        size: usize,
    },
    /// An internal step given a layout of another mesh than its tensor's (the public relayout
    /// moves tensors across meshes itself).
    #[error(
        "mesh mismatch: a layout of mesh {to} was given for a tensor on mesh {from}; move the tensor to that mesh first (`tensor.relayout(&layout)` moves it shard to shard, `tensor.to_device(&DistributedDevice::new(mesh))` in the mesh's creation layout)"
    )]
    MeshMismatch {
        /// Source mesh, displayed.
        from: String,
        /// Target mesh, displayed.
        to: String,
    },
    /// A mesh definition that names the same axis twice (`batch=8,batch=1`).
    #[error(
        "mesh axis `{axis}` is defined twice in the mesh (positions {first} and {second}); give each mesh axis a distinct name, e.g. `batch=4,model=2`"
    )]
    DuplicateMeshAxis {
        /// Axis name.
        axis: String,
        /// Position of its first definition.
        first: usize,
        /// Position of its second definition.
        second: usize,
    },
    /// A layout whose mesh is not a mesh of the backend's inner devices (built with another
    /// device type), so its devices cannot be found.
    #[error(
        "layout on mesh [{mesh}] is not a mesh of {backend} devices; build the layout from a `Mesh` of the backend's inner devices"
    )]
    UnknownMesh {
        /// The layout's mesh, displayed.
        mesh: String,
        /// The inner backend's type name.
        backend: String,
    },
    /// The number of local shards passed to `from_local_shards` is not the mesh size.
    #[error("expected one shard per mesh device ({expected}), got {given}")]
    ShardCountMismatch {
        /// Mesh size.
        expected: usize,
        /// Shards given.
        given: usize,
    },
    /// A local shard does not have the shape its layout implies.
    #[error(
        "shard {index} has shape {found:?} but the layout implies {expected:?} for global shape {global:?}"
    )]
    ShardShapeMismatch {
        /// Flat device index.
        index: usize,
        /// Shape found.
        found: Vec<usize>,
        /// Shape implied by the layout.
        expected: Vec<usize>,
        /// The global shape.
        global: Vec<usize>,
    },
    /// A local shard whose dtype differs from the first shard's: a tensor's shards share one
    /// dtype.
    #[error(
        "shard {index} has dtype {found} but shard 0 has {expected}; a tensor's shards share one dtype: cast them to one (`Tensor::cast`)"
    )]
    ShardDtypeMismatch {
        /// Flat device index.
        index: usize,
        /// Its dtype, displayed.
        found: String,
        /// Shard 0's dtype, displayed.
        expected: String,
    },
    /// A local shard on another device than the one its mesh position is on: the ops that use
    /// it would run on the wrong device, or fail inside the inner backend on operands of two
    /// devices.
    #[error(
        "shard {index} is on device {found} but its mesh position is on {expected}; move it there first (`Tensor::to_device`)"
    )]
    ShardDeviceMismatch {
        /// Flat device index.
        index: usize,
        /// The shard's device, displayed.
        found: String,
        /// The device of its mesh position, displayed.
        expected: String,
    },
    /// A mesh description string (`batch=4,model=2`) that does not parse.
    #[error(
        "cannot parse mesh `{spec}`: {reason}; write it as `axis=size,axis=size`, e.g. `batch=4,model=2`"
    )]
    MeshParse {
        /// The string.
        spec: String,
        /// What was wrong.
        reason: String,
    },
    /// A layout map rule whose pattern is not a valid regex.
    #[error("invalid regex `{pattern}` in layout map: {reason}")]
    InvalidRegex {
        /// The pattern.
        pattern: String,
        /// The regex crate's message.
        reason: String,
    },
    /// A layout map rule that matched no parameter of the module.
    #[error(
        "layout map rule(s) matched no parameter: [{patterns}]; known parameter paths: [{paths}]"
    )]
    UnmatchedRule {
        /// The patterns that matched nothing.
        patterns: String,
        /// The module's parameter paths.
        paths: String,
    },
    /// A layout map applied for one mesh to a module whose parameters live on another.
    #[error(
        "parameter `{path}` lives on {on}, but the layout map is applied for mesh {mesh}: create the module on that mesh's device (`Model::new(&DistributedDevice::new(mesh))`) or pass the topology of the mesh the module lives on"
    )]
    ModuleOnOtherMesh {
        /// The parameter's module path.
        path: String,
        /// The parameter's device, displayed.
        on: String,
        /// The mesh given to [`LayoutMap::apply`](crate::LayoutMap::apply), displayed.
        mesh: String,
    },
    /// A layout map rule matched a parameter whose rank differs from the rule's layout.
    #[error(
        "layout map rule `{pattern}` gives {layout_rank} dims but parameter `{path}` has rank {param_rank}"
    )]
    RuleRankMismatch {
        /// Pattern.
        pattern: String,
        /// Parameter path.
        path: String,
        /// Layout rank.
        layout_rank: usize,
        /// Parameter rank.
        param_rank: usize,
    },
    /// A layout map file that cannot be read or parsed.
    #[error(
        "cannot read layout map `{path}`: {reason}; expected TOML lines like `\"dense1\\\\.weight\" = [\"unsharded\", \"model\"]`"
    )]
    LayoutMapFile {
        /// File path.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// The processes of an SPMD run cannot tile the mesh with one contiguous block each.
    #[error(
        "mesh {mesh} ({global} positions) cannot be split over {processes} processes of {local} devices each: {reason}"
    )]
    ProcessGrid {
        /// The mesh, `batch=4,model=2`.
        mesh: String,
        /// Positions in the mesh (product of the axis sizes).
        global: usize,
        /// Processes in the run.
        processes: usize,
        /// Devices each process contributes.
        local: usize,
        /// What does not fit, and how to fix it.
        reason: String,
    },
    /// The processes of an SPMD run disagree on something that must be equal on all of them
    /// (mesh, layout map, seed): they were started with different flags or files.
    #[error(
        "the processes disagree on the {what}: rank {rank} has {theirs}, rank {me} has {ours}; start every process with the same flags and files"
    )]
    ProcessMismatch {
        /// What differs (`mesh`, `layout map`, `seed`, ...).
        what: String,
        /// This process's rank.
        me: usize,
        /// This process's value (or its hash).
        ours: String,
        /// The first rank that differs.
        rank: usize,
        /// Its value (or hash).
        theirs: String,
    },
    /// Two processes of an SPMD run on one host hold the same GPU
    /// ([`crate::spmd::World::claim_devices`]).
    #[error(
        "ranks {first} and {second} on host {host} both use {device}: a GPU serves one process. \
         Start at most one process per GPU of a node (`srun --ntasks-per-node` = GPUs per node, \
         the resource spec's `gpus`), let each process take the GPU of its local rank \
         (`--device auto`), or give each its own with `--device N` / `CUDA_VISIBLE_DEVICES`"
    )]
    SharedDevice {
        /// The device, as its `Debug` form.
        device: String,
        /// The host both processes run on.
        host: String,
        /// The lower rank.
        first: usize,
        /// The rank that also holds it.
        second: usize,
    },
    /// A resource spec file ([`crate::launch::ResourceSpec`]) that cannot be used.
    #[error("resource spec `{path}`: {reason}")]
    ResourceSpec {
        /// The file.
        path: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// A process rank that the SPMD run does not have (e.g. the destination of
    /// [`crate::DTensorExt::gather_to_process`]).
    #[error(
        "process {process} does not exist: the run has {size} process(es), ranks 0..{size}; name one of those (0 is the chief)"
    )]
    NoSuchProcess {
        /// The rank asked for.
        process: usize,
        /// Processes in the run.
        size: usize,
    },
    /// Joining the process world failed (see the message), e.g. a run under `mpirun` of a binary
    /// built without the `mpi` feature.
    #[error("multi-process start-up failed: {0}")]
    Spmd(String),
    /// A sharded checkpoint ([`crate::checkpoint`]) that cannot be written or read: a missing,
    /// damaged or foreign file, or a tensor that does not match the one being loaded. `path` is
    /// the checkpoint directory or the file at fault; `reason` names the tensor and says what to do.
    #[error("checkpoint {path}: {reason}")]
    Checkpoint {
        /// The checkpoint directory or file.
        path: String,
        /// What is wrong (naming the tensor and file) and how to fix it.
        reason: String,
    },
    /// A `BURN_DTENSOR_*` environment variable with a value it does not accept
    /// ([`crate::Config::from_env`]).
    #[error("environment variable {var}=`{value}` is not valid: expected {expected}")]
    Config {
        /// The variable.
        var: String,
        /// Its value.
        value: String,
        /// What it accepts.
        expected: String,
    },
    /// Host data whose dtype is not supported by `distribute` (e.g. quantized data).
    #[error("unsupported data for this operation: {0}")]
    Unsupported(String),
}

/// Result alias.
pub type Result<T> = std::result::Result<T, DTensorError>;
