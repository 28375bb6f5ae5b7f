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
/// The default device is the single-device mesh over `B`'s default device.
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

impl<D: DeviceOps> Default for DistributedDevice<D> {
    fn default() -> Self {
        // One cached default per inner device type: `Default` must give equal devices.
        static DEFAULTS: OnceLock<std::sync::Mutex<Vec<Box<dyn std::any::Any + Send + Sync>>>> =
            OnceLock::new();
        let reg = DEFAULTS.get_or_init(Default::default);
        let mut reg = reg.lock().unwrap();
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
