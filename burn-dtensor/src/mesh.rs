//! Device meshes: named axes with sizes over a row-major list of inner devices.

use std::any::Any;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::{DTensorError, Result};

/// The name that marks a tensor dim as not sharded (TensorFlow DTensor's `UNSHARDED`): never a
/// mesh axis name.
pub const UNSHARDED: &str = "unsharded";

/// The device-independent part of a mesh: its axes and its identity.
///
/// Layouts refer to a mesh through its topology, so [`Layout`](crate::Layout) is not generic over
/// the inner device type.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct MeshTopology {
    pub(crate) id: u16,
    pub(crate) axes: Vec<(String, usize)>,
    pub(crate) strides: Vec<usize>,
    /// Whether the shards of this mesh's tensors may be held stacked (see `crate::stack`): every
    /// device is the same inner device (a virtual mesh) of more than one position, and stacked
    /// execution was not switched off ([`Mesh::with_stacked_execution`],
    /// [`Config::stacked_execution`](crate::Config::stacked_execution)).
    pub(crate) stacked: bool,
    /// The creation-layout policy ([`Mesh::with_creation_sharding`]): tensor dim `i` of every
    /// tensor created on this mesh is sharded over mesh axis `creation[i]` (when `Some`); empty
    /// (the default): created tensors are replicated.
    pub(crate) creation: Vec<Option<usize>>,
    /// How the positions are split over the processes of an SPMD run ([`Mesh::spmd`]); the
    /// default (one process) has no groups and no position table.
    pub(crate) grid: crate::spmd::ProcessGrid,
    /// Whether the mesh spans several processes (`grid.world_size > 1`).
    pub(crate) multi: bool,
    /// The in-process collective engines for this mesh's device type, chosen when the mesh is
    /// built (see [`crate::collective`]); the cross-process engine is `grid`'s process groups.
    pub(crate) engines: crate::collective::engine::LocalEngines,
}

impl MeshTopology {
    /// Whether tensors on this mesh run in stacked form: one inner op for all shards, with the
    /// mesh axes as leading dims (see `crate::stack`). True for a virtual mesh (one inner
    /// device at every position) unless switched off.
    pub fn is_stacked(&self) -> bool {
        self.stacked
    }
    /// The names of the in-process collective engines this mesh's collectives try before the
    /// inner backend's own ops (`["cubecl-wgpu"]` on a `WgpuDevice` mesh with the `wgpu`
    /// feature; empty on CPU backends), in the order they are tried.
    pub fn collective_engines(&self) -> Vec<&'static str> {
        self.engines.names()
    }
    /// The creation-layout policy: entry `i` is the mesh axis that shards dim `i` of every tensor
    /// created on this mesh (see [`Mesh::with_creation_sharding`]); empty when created tensors
    /// are replicated.
    pub fn creation_sharding(&self) -> &[Option<usize>] {
        &self.creation
    }
    /// Axis names and sizes, in order.
    pub fn axes(&self) -> &[(String, usize)] {
        &self.axes
    }
    /// Number of mesh axes.
    pub fn ndim(&self) -> usize {
        self.axes.len()
    }
    /// Number of devices (product of the axis sizes; 1 for a mesh without axes).
    pub fn size(&self) -> usize {
        self.axes.iter().map(|(_, s)| s).product()
    }
    /// Size of axis `a`.
    pub fn axis_size(&self, a: usize) -> usize {
        self.axes[a].1
    }
    /// Name of axis `a`.
    pub fn axis_name(&self, a: usize) -> &str {
        &self.axes[a].0
    }
    /// Index of the axis called `name`.
    ///
    /// # Errors
    /// [`DTensorError::UnknownAxis`] when the mesh has no such axis.
    pub fn axis_index(&self, name: &str) -> Result<usize> {
        self.axes
            .iter()
            .position(|(n, _)| n == name)
            .ok_or_else(|| self.unknown_axis(name.to_string()))
    }
    /// The error for `axis` (a name, or `#i` for an index), which this mesh lacks: it lists
    /// the mesh's axes.
    pub(crate) fn unknown_axis(&self, axis: String) -> DTensorError {
        DTensorError::UnknownAxis {
            axis,
            available: self
                .axes
                .iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        }
    }
    /// Whether the mesh spans several processes ([`Mesh::spmd`] in a world of more than one).
    pub fn is_multi_process(&self) -> bool {
        self.multi
    }
    /// The process grid: which block of positions each process owns.
    pub fn process_grid(&self) -> &crate::spmd::ProcessGrid {
        &self.grid
    }
    /// The rank of the process that owns global position `g` (0 in one process): process
    /// coordinates are the position's coordinates divided by the local block's, ranks row-major
    /// over them (the layout [`crate::spmd`] builds).
    pub fn process_of(&self, g: usize) -> usize {
        if !self.multi {
            return 0;
        }
        let grid = &self.grid;
        self.coords(g).iter().enumerate().fold(0, |acc, (a, c)| {
            acc * grid.procs[a] + c / grid.local_sizes[a]
        })
    }
    /// Number of positions this process owns (its addressable shards): [`MeshTopology::size`]
    /// in one process.
    pub fn local_size(&self) -> usize {
        if self.multi {
            self.grid.positions.len()
        } else {
            self.size()
        }
    }
    /// The global flat index of this process's `j`-th addressable position (`j` itself in one
    /// process).
    #[inline]
    pub fn global(&self, j: usize) -> usize {
        if self.multi {
            self.grid.positions[j]
        } else {
            j
        }
    }
    /// The process group along axis `a`, when more than one process lies along it.
    pub(crate) fn process_group(
        &self,
        a: usize,
    ) -> Option<&std::sync::Arc<dyn crate::spmd::ProcessGroup>> {
        self.grid.groups.get(a).and_then(Option::as_ref)
    }
    /// Positions along axis `a` owned by each process (the axis size in one process).
    pub fn local_axis_size(&self, a: usize) -> usize {
        if self.multi {
            self.grid.local_sizes[a]
        } else {
            self.axes[a].1
        }
    }
    /// This process's first coordinate along axis `a`: its block of positions starts there
    /// (0 in one process).
    pub(crate) fn local_origin(&self, a: usize) -> usize {
        if self.multi {
            self.grid.pcoord[a] * self.grid.local_sizes[a]
        } else {
            0
        }
    }
    /// The index among this process's addressable positions of global position `g`, which this
    /// process owns (`g` itself in one process): row-major over the local block, the inverse of
    /// [`MeshTopology::global`].
    pub(crate) fn local_index(&self, g: usize) -> usize {
        if !self.multi {
            return g;
        }
        (0..self.ndim()).fold(0, |acc, a| {
            acc * self.grid.local_sizes[a] + self.coord(g, a) - self.local_origin(a)
        })
    }
    /// [`MeshTopology::groups`] restricted to this process's positions, as indices into its
    /// addressable shards: the in-process part of a collective along `a`, each group ordered by
    /// coordinate. In one process, the groups themselves.
    pub fn local_groups(&self, a: usize) -> Vec<Vec<usize>> {
        if !self.multi {
            return self.groups(a);
        }
        let l = &self.grid.local_sizes;
        let stride: usize = l[a + 1..].iter().product();
        let n = self.grid.positions.len();
        (0..n)
            .filter(|&j| (j / stride).is_multiple_of(l[a]))
            .map(|base| (0..l[a]).map(|k| base + k * stride).collect())
            .collect()
    }
    /// Coordinate of the device with flat (row-major) index `flat` along every axis.
    pub fn coords(&self, flat: usize) -> Vec<usize> {
        (0..self.ndim()).map(|a| self.coord(flat, a)).collect()
    }
    /// Coordinate of device `flat` along axis `a`.
    pub fn coord(&self, flat: usize, a: usize) -> usize {
        (flat / self.strides[a]) % self.axes[a].1
    }
    /// The sub-groups along axis `a`: the devices whose coordinates differ only on `a`, each
    /// listed in order of their coordinate on `a`. There are `size / axis_size(a)` groups.
    pub fn groups(&self, a: usize) -> Vec<Vec<usize>> {
        let (n, stride) = (self.axes[a].1, self.strides[a]);
        (0..self.size())
            .filter(|&f| self.coord(f, a) == 0)
            .map(|base| (0..n).map(|k| base + k * stride).collect())
            .collect()
    }
}

impl fmt::Display for MeshTopology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.axes.is_empty() {
            return write!(f, "<single device>");
        }
        let parts: Vec<String> = self.axes.iter().map(|(n, s)| format!("{n}={s}")).collect();
        write!(f, "{}", parts.join(","))
    }
}

/// A device mesh: named axes with sizes over `product(sizes)` inner devices in row-major order
/// (the last axis varies fastest), like TensorFlow DTensor's `Mesh` and JAX's `Mesh`.
///
/// The same inner device may appear several times: these are *virtual devices* (TensorFlow's
/// `configure_virtual_cpus`), the way to run an 8-device mesh on one CPU backend. Meshes are
/// interned: two meshes with the same axes and the same devices are the same mesh (equal, with
/// the same id), which is what lets a [`DistributedDevice`](crate::DistributedDevice) round-trip
/// through Burn's `DeviceId`.
///
/// ```
/// use burn::backend::NdArray;
/// use burn_dtensor::Mesh;
/// let dev = Default::default();
/// let mesh = Mesh::<<NdArray as burn::tensor::backend::BackendTypes>::Device>::new(
///     [("batch", 4), ("model", 2)], vec![dev; 8]).unwrap();
/// assert_eq!(mesh.size(), 8);
/// assert_eq!(mesh.topology().groups(1)[0], vec![0, 1]);
/// ```
#[derive(Clone)]
pub struct Mesh<D> {
    pub(crate) topo: Arc<MeshTopology>,
    pub(crate) devices: Arc<Vec<D>>,
}

impl<D: fmt::Debug> fmt::Debug for Mesh<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Mesh({} over {:?})", self.topo, self.devices.first())
    }
}

impl<D> PartialEq for Mesh<D> {
    fn eq(&self, other: &Self) -> bool {
        self.topo.id == other.topo.id
    }
}

type Entry = Arc<dyn Any + Send + Sync>;
fn registry() -> &'static Mutex<Vec<Entry>> {
    static REG: OnceLock<Mutex<Vec<Entry>>> = OnceLock::new();
    REG.get_or_init(|| Mutex::new(Vec::new()))
}

impl<D: Clone + PartialEq + Send + Sync + 'static> Mesh<D> {
    /// Builds a mesh from `(axis name, size)` pairs and the inner devices in row-major order.
    ///
    /// # Errors
    /// - [`DTensorError::DeviceCountMismatch`] when `devices.len()` is not the product of the sizes;
    /// - [`DTensorError::DuplicateMeshAxis`] when an axis name repeats;
    /// - [`DTensorError::InvalidAxis`] for a size of 0, or a name that is empty, `unsharded`, or
    ///   holds whitespace or one of `,=@[]`;
    /// - [`DTensorError::MeshTooLarge`] when the product of the sizes overflows `usize`;
    /// - [`DTensorError::TooManyMeshes`] when the process already holds [`MAX_MESHES`] meshes
    ///   and this one is new.
    pub fn new<S: Into<String>>(
        axes: impl IntoIterator<Item = (S, usize)>,
        devices: Vec<D>,
    ) -> Result<Self> {
        let axes: Vec<(String, usize)> = axes.into_iter().map(|(n, s)| (n.into(), s)).collect();
        let expected = mesh_size(&axes)?;
        if expected != devices.len() {
            return Err(DTensorError::DeviceCountMismatch {
                shape: shape_text(&axes),
                expected,
                given: devices.len(),
            });
        }
        Self::intern(
            axes,
            devices,
            crate::config::try_config()?.stacked_execution,
            Vec::new(),
            Default::default(),
        )
    }

    /// A mesh spanning every process of the SPMD world ([`crate::spmd::init`]): `axes` over
    /// `local_devices.len()` devices per process, the same count on every process. Process `r`
    /// owns the `r`-th contiguous row-major block of positions (which must be a box: the trailing
    /// axes whole, then a divisor of one axis) and holds only their shards. In a world of one
    /// process this is [`Mesh::new`] (the single-process fast path: stacked execution and all).
    /// Collective: every process builds the same meshes in the same order.
    ///
    /// `mpirun -n 4` over `Mesh::spmd([("batch", 4), ("model", 2)], vec![dev; 2])`: rank `r` owns
    /// batch row `r`, both model columns.
    ///
    /// A process holding several positions on one inner device (a virtual mesh per process)
    /// runs them stacked, as one process does (stacked execution: each op once on the stacked
    /// shards of its block); collectives along an axis it holds whole run on the stack, and so do
    /// all-reduces, all-gathers, reduce-scatters and all-to-alls along an axis that spans
    /// processes (combined in process, then one exchange across processes for all of the
    /// process's groups, through the engine: MPI on host memory).
    ///
    /// # Errors
    /// As [`Mesh::new`] for the axes; [`DTensorError::ProcessGrid`] when the processes' devices
    /// do not tile the mesh in boxes; [`DTensorError::ProcessMismatch`] when processes ask for
    /// different meshes; [`DTensorError::SharedDevice`] when two processes of one host hold the
    /// same GPU ([`crate::spmd::World::claim_devices`]); [`DTensorError::Spmd`] when the world
    /// cannot start.
    pub fn spmd<S: Into<String>>(
        axes: impl IntoIterator<Item = (S, usize)>,
        local_devices: Vec<D>,
    ) -> Result<Self>
    where
        D: fmt::Debug,
    {
        Self::on_world(crate::spmd::init()?, axes, local_devices)
    }

    /// [`Mesh::spmd`] over a given `world` (the one [`crate::spmd::init`] returns): the world
    /// is made once, by the application or by [`Mesh::spmd`], never by the mesh itself.
    ///
    /// # Errors
    /// As [`Mesh::spmd`].
    pub fn on_world<S: Into<String>>(
        world: &crate::spmd::World,
        axes: impl IntoIterator<Item = (S, usize)>,
        local_devices: Vec<D>,
    ) -> Result<Self>
    where
        D: fmt::Debug,
    {
        let axes: Vec<(String, usize)> = axes.into_iter().map(|(n, s)| (n.into(), s)).collect();
        if world.size() == 1 {
            return Self::new(axes, local_devices);
        }
        mesh_size(&axes)?;
        // Before any collective of the mesh: no GPU held by two processes of one host.
        let mut exclusive: Vec<String> = local_devices
            .iter()
            .filter(|d| crate::inner::exclusive_device(*d))
            .map(|d| format!("{d:?}"))
            .collect();
        exclusive.sort();
        exclusive.dedup();
        world.claim_devices(&exclusive)?;
        let engine = crate::collective::engine::across_engine(&local_devices)?;
        let grid = crate::spmd::grid(
            &axes,
            local_devices.len(),
            world,
            std::any::type_name::<D>(),
            engine,
        )?;
        Self::intern(
            axes,
            local_devices,
            crate::config::try_config()?.stacked_execution,
            Vec::new(),
            grid,
        )
    }

    /// [`Mesh::spmd`] from `"batch=4,model=2"`.
    ///
    /// # Errors
    /// [`DTensorError::MeshParse`], then as [`Mesh::spmd`].
    pub fn parse_spmd(spec: &str, local_devices: Vec<D>) -> Result<Self>
    where
        D: fmt::Debug,
    {
        Self::spmd(parse_axes(spec)?, local_devices)
    }

    /// A mesh whose every position is a virtual copy of one inner device (the usual CPU setup:
    /// `NdArray` and `Flex` have a single device).
    ///
    /// # Errors
    /// As [`Mesh::new`]; [`DTensorError::MeshTooLarge`] for more than
    /// [`MAX_VIRTUAL_POSITIONS`] positions, checked before any is made.
    pub fn virtual_devices<S: Into<String>>(
        axes: impl IntoIterator<Item = (S, usize)>,
        device: D,
    ) -> Result<Self> {
        let axes: Vec<(String, usize)> = axes.into_iter().map(|(n, s)| (n.into(), s)).collect();
        let n = mesh_size(&axes)?;
        if n > MAX_VIRTUAL_POSITIONS {
            return Err(DTensorError::MeshTooLarge {
                shape: shape_text(&axes),
                reason: format!(
                    "{n} virtual positions, more than the {MAX_VIRTUAL_POSITIONS} a mesh of \
                     virtual devices may have; is an axis size mistyped?"
                ),
            });
        }
        Self::new(axes, vec![device; n])
    }

    /// The mesh of one device and no axes: every tensor on it is replicated (whole).
    ///
    /// # Panics
    /// When this process already holds [`MAX_MESHES`] distinct meshes and this one is new.
    pub fn single(device: D) -> Self {
        Self::intern(
            Vec::new(),
            vec![device],
            false,
            Vec::new(),
            Default::default(),
        )
        .unwrap_or_else(|e| panic!("burn-dtensor: {e}"))
    }

    /// Parses `"batch=4,model=2"` into axes and builds the mesh over `devices`.
    ///
    /// # Errors
    /// [`DTensorError::MeshParse`] for malformed text, then as [`Mesh::new`].
    pub fn parse(spec: &str, devices: Vec<D>) -> Result<Self> {
        Self::new(parse_axes(spec)?, devices)
    }

    /// The same mesh with stacked execution switched on or off. Stacked execution (the default
    /// on a virtual mesh) runs each op once on all shards stacked along leading mesh dims;
    /// switched off, each op runs once per distinct shard (the path real multi-device meshes
    /// take), which tests use to cover both. A mesh of distinct devices never stacks, whatever
    /// `on` says. The two variants are distinct meshes (tensors move between them with
    /// `to_device` or `relayout`, shard to shard).
    ///
    /// # Panics
    /// When this process already holds [`MAX_MESHES`] distinct meshes and this one is new.
    pub fn with_stacked_execution(&self, on: bool) -> Self {
        Self::intern(
            self.topo.axes.clone(),
            self.devices.to_vec(),
            on,
            self.topo.creation.clone(),
            self.topo.grid.clone(),
        )
        .unwrap_or_else(|e| panic!("burn-dtensor: {e}"))
    }

    /// The registered mesh of these axes, devices and settings, registered now if it is new.
    /// The infallible constructors ([`Mesh::single`], [`Mesh::with_stacked_execution`]) turn
    /// the error into their documented panic.
    ///
    /// # Errors
    /// [`DTensorError::TooManyMeshes`] when the registry already holds [`MAX_MESHES`] meshes.
    pub(crate) fn intern(
        axes: Vec<(String, usize)>,
        devices: Vec<D>,
        stacked: bool,
        creation: Vec<Option<usize>>,
        grid: crate::spmd::ProcessGrid,
    ) -> Result<Self> {
        let multi = grid.world_size > 1;
        // `devices` are this process's: a multi-process mesh stacks the positions it holds.
        let stacked = stacked && devices.len() > 1 && devices.iter().all(|d| *d == devices[0]);
        let mut reg = registry().lock().unwrap();
        for entry in reg.iter() {
            if let Some(m) = entry.downcast_ref::<Mesh<D>>()
                && m.topo.axes == axes
                && m.topo.stacked == stacked
                && m.topo.creation == creation
                && m.topo.grid == grid
                && *m.devices == devices
            {
                return Ok(m.clone());
            }
        }
        let id = mesh_id(reg.len())?;
        let mut strides = vec![1; axes.len()];
        for a in (0..axes.len().saturating_sub(1)).rev() {
            strides[a] = strides[a + 1] * axes[a + 1].1;
        }
        let mesh = Mesh {
            topo: Arc::new(MeshTopology {
                id,
                axes,
                strides,
                stacked,
                creation,
                grid,
                multi,
                engines: crate::collective::engine::LocalEngines::for_device::<D>(),
            }),
            devices: Arc::new(devices),
        };
        reg.push(Arc::new(mesh.clone()));
        Ok(mesh)
    }

    /// Looks a mesh up by the id Burn's `DeviceId::index_id` carries.
    ///
    /// Burn asks for a tensor's device several times per op, so each thread keeps the last entry
    /// it looked up (entries never change once registered) and skips the global lock.
    pub(crate) fn from_registry(id: u16) -> Option<Self> {
        thread_local! {
            static LAST: std::cell::RefCell<Option<(u16, Entry)>> = const { std::cell::RefCell::new(None) };
        }
        LAST.with(|last| {
            if let Some((i, e)) = &*last.borrow()
                && *i == id
                && let Some(m) = e.downcast_ref::<Mesh<D>>()
            {
                return Some(m.clone());
            }
            let e = registry().lock().unwrap().get(id as usize).cloned()?;
            let m = e.downcast_ref::<Mesh<D>>().cloned();
            *last.borrow_mut() = Some((id, e));
            m
        })
    }
}

impl<D> Mesh<D> {
    /// The axes and identity of this mesh.
    pub fn topology(&self) -> &Arc<MeshTopology> {
        &self.topo
    }
    /// The inner devices of this process's positions, row-major (virtual devices repeat): every
    /// device of the mesh in one process, the addressable ones in an SPMD run ([`Mesh::spmd`]).
    pub fn devices(&self) -> &[D] {
        &self.devices
    }
    /// Number of positions of the whole mesh (every process's).
    pub fn size(&self) -> usize {
        self.topo.size()
    }
    /// The interned id (stable for the life of the process).
    pub fn id(&self) -> u16 {
        self.topo.id
    }
    /// Size of the axis called `name`.
    ///
    /// # Errors
    /// [`DTensorError::UnknownAxis`].
    pub fn axis_size(&self, name: &str) -> Result<usize> {
        Ok(self.topo.axis_size(self.topo.axis_index(name)?))
    }
}

impl<D> fmt::Display for Mesh<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.topo)
    }
}

/// The characters an axis name may not hold: those of the textual forms that name axes (the
/// mesh spec `batch=4,model=2`, a tensor's description `f32[8@batch, 3]`), and whitespace.
const AXIS_NAME_RESERVED: &[char] = &[',', '=', '@', '[', ']'];

/// Axis names non-empty, distinct, not `unsharded`, without whitespace or
/// [`AXIS_NAME_RESERVED`] characters; sizes positive.
fn check_axes(axes: &[(String, usize)]) -> Result<()> {
    let reserved = |c: char| c.is_whitespace() || c.is_control() || AXIS_NAME_RESERVED.contains(&c);
    for (i, (n, s)) in axes.iter().enumerate() {
        if n.is_empty() || *s == 0 || n == UNSHARDED || n.contains(reserved) {
            return Err(DTensorError::InvalidAxis {
                axis: n.clone(),
                size: *s,
            });
        }
        if let Some(j) = axes[..i].iter().position(|(m, _)| m == n) {
            return Err(DTensorError::DuplicateMeshAxis {
                axis: n.clone(),
                first: j,
                second: i,
            });
        }
    }
    Ok(())
}

/// Most distinct meshes one process may build: a mesh's id is Burn's `DeviceId::index_id`,
/// a `u16`. Building a mesh already built (same axes, devices and settings) returns it and
/// counts once.
pub const MAX_MESHES: usize = u16::MAX as usize + 1;

/// The id of the `n`-th mesh registered (from 0).
fn mesh_id(n: usize) -> Result<u16> {
    u16::try_from(n).map_err(|_| DTensorError::TooManyMeshes { limit: MAX_MESHES })
}

/// Most positions of a mesh of virtual devices ([`Mesh::virtual_devices`]): 2^20, more than
/// the devices of any machine or cluster a mesh of virtual copies stands in for. The mesh
/// holds one device handle per position (and a sharded tensor one shard per position), so a
/// mistyped axis size (`batch=40000000`) is refused before anything is allocated.
pub const MAX_VIRTUAL_POSITIONS: usize = 1 << 20;

/// `axes` checked ([`check_axes`]) and their positions counted.
///
/// # Errors
/// As [`check_axes`]; [`DTensorError::MeshTooLarge`] when the product of the sizes overflows
/// `usize`.
fn mesh_size(axes: &[(String, usize)]) -> Result<usize> {
    check_axes(axes)?;
    axes.iter()
        .try_fold(1usize, |n, (_, s)| n.checked_mul(*s))
        .ok_or_else(|| DTensorError::MeshTooLarge {
            shape: shape_text(axes),
            reason: format!(
                "the product of its axis sizes is more than {}, the most positions this \
                 machine can count",
                usize::MAX
            ),
        })
}

/// `axes` as `batch=4,model=2`, for errors.
fn shape_text(axes: &[(String, usize)]) -> String {
    axes.iter()
        .map(|(n, s)| format!("{n}={s}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Parses `"batch=4,model=2"` (whitespace allowed) into `(axis, size)` pairs.
///
/// # Errors
/// [`DTensorError::MeshParse`] naming what was wrong.
pub fn parse_axes(spec: &str) -> Result<Vec<(String, usize)>> {
    let err = |reason: String| DTensorError::MeshParse {
        spec: spec.to_string(),
        reason,
    };
    if spec.trim().is_empty() {
        return Err(err("no axes".into()));
    }
    let mut out = Vec::new();
    for (i, part) in spec.split(',').map(str::trim).enumerate() {
        if part.is_empty() {
            return Err(err(format!(
                "axis {} is empty (two commas in a row, or a comma at an end): write \
                 `name=size` between commas, e.g. `batch=4,model=2`",
                i + 1
            )));
        }
        let (name, size) = part
            .split_once('=')
            .ok_or_else(|| err(format!("`{part}` has no `=`")))?;
        let size: usize = size.trim().parse().map_err(|_| {
            err(format!(
                "size `{}` of `{}` is not a positive integer",
                size.trim(),
                name.trim()
            ))
        })?;
        out.push((name.trim().to_string(), size));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ids number meshes 0..=65535; the next is a typed error (before: a panic inside
    /// `intern`, also through the fallible constructors), whose message says what to do.
    #[test]
    fn mesh_ids_run_out_as_a_typed_error() {
        assert_eq!(mesh_id(0).unwrap(), 0);
        assert_eq!(mesh_id(MAX_MESHES - 1).unwrap(), u16::MAX);
        let e = mesh_id(MAX_MESHES).unwrap_err();
        assert_eq!(e, DTensorError::TooManyMeshes { limit: 65536 });
        assert!(e.to_string().contains("reuse it"), "{e}");
        assert!(mesh_id(usize::MAX).is_err());
    }
}
