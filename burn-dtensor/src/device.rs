//! The device of [`DistributedBackend`](crate::DistributedBackend): a mesh of inner devices.

use std::fmt;
use std::sync::OnceLock;

use burn::tensor::backend::{Device, DeviceId, DeviceOps};

use crate::mesh::Mesh;

/// `DeviceId::type_id` of every distributed device.
pub const DISTRIBUTED_DEVICE_TYPE_ID: u16 = 0xD7E5;

/// The device type of `DistributedBackend<B>`: a [`Mesh`] of `B`'s devices. A tensor created on
/// it is replicated over the mesh (every device holds the whole tensor) until relaid out.
///
/// Its id (`DeviceId { type_id: DISTRIBUTED_DEVICE_TYPE_ID, index_id: mesh id }`) round-trips
/// through [`Device::from_id`], as Burn's optimizers and fusion require.
///
/// The default device is the single-device mesh over `B`'s default device, unless
/// [`DistributedDevice::set_default`] chose another mesh.
#[derive(Clone, PartialEq)]
pub struct DistributedDevice<D> {
    pub(crate) mesh: Mesh<D>,
}

impl<D> DistributedDevice<D> {
    /// The device of a mesh.
    pub fn new(mesh: Mesh<D>) -> Self {
        Self { mesh }
    }
    /// The mesh.
    pub fn mesh(&self) -> &Mesh<D> {
        &self.mesh
    }
}

impl<D> From<Mesh<D>> for DistributedDevice<D> {
    fn from(mesh: Mesh<D>) -> Self {
        Self::new(mesh)
    }
}

impl<D: fmt::Debug> fmt::Debug for DistributedDevice<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DistributedDevice({:?})", self.mesh)
    }
}

/// The default mesh per inner device type (`Default` must give equal devices).
fn default_meshes() -> &'static std::sync::Mutex<Vec<Box<dyn std::any::Any + Send + Sync>>> {
    static DEFAULTS: OnceLock<std::sync::Mutex<Vec<Box<dyn std::any::Any + Send + Sync>>>> =
        OnceLock::new();
    DEFAULTS.get_or_init(Default::default)
}

impl<D: DeviceOps> DistributedDevice<D> {
    /// Makes `mesh` the process's default device for this inner device type: what
    /// `DistributedDevice::default()` (Burn's `Default::default()` device) gives from now on,
    /// in place of the single-device mesh. Code written for one device, such as Burn's own test
    /// suite, then runs on the mesh unchanged; with a creation-layout policy
    /// ([`Mesh::with_creation_sharding`]) every tensor it creates is sharded.
    ///
    /// Call it before creating tensors on the default device: tensors already created keep
    /// the mesh they live on.
    pub fn set_default(mesh: Mesh<D>) {
        let mut reg = default_meshes().lock().unwrap();
        reg.retain(|e| e.downcast_ref::<Mesh<D>>().is_none());
        reg.push(Box::new(mesh));
    }
}

impl<D: DeviceOps> Default for DistributedDevice<D> {
    fn default() -> Self {
        let mut reg = default_meshes().lock().unwrap();
        for e in reg.iter() {
            if let Some(m) = e.downcast_ref::<Mesh<D>>() {
                return Self::new(m.clone());
            }
        }
        let m = Mesh::single(D::default());
        reg.push(Box::new(m.clone()));
        Self::new(m)
    }
}

impl<D: DeviceOps> Device for DistributedDevice<D> {
    fn from_id(id: DeviceId) -> Self {
        assert_eq!(
            id.type_id, DISTRIBUTED_DEVICE_TYPE_ID,
            "not a burn-dtensor device id: {id}"
        );
        Self::new(Mesh::from_registry(id.index_id).unwrap_or_else(|| {
            panic!("no mesh with id {} for this inner device type", id.index_id)
        }))
    }
    fn to_id(&self) -> DeviceId {
        DeviceId::new(DISTRIBUTED_DEVICE_TYPE_ID, self.mesh.id())
    }
}

impl<D: DeviceOps> DeviceOps for DistributedDevice<D> {}
