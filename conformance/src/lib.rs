//! Support for running Burn 0.21's backend conformance suite (`burn-backend-tests`, vendored at
//! `../shared/vendor/burn-backend-tests-0.21.0/` beside the checkout) on
//! `DistributedBackend<Inner>` and `Autodiff<DistributedBackend<Inner>>`, the [`Inner`] backend
//! being NdArray (feature `conformance`) or Flex (feature `conformance-flex`).
//!
//! The suite's test files are included unchanged by the test targets `tests/tensor.rs` and
//! `tests/autodiff.rs`; this library picks the *layout setting* at run time
//! (`BURN_DTENSOR_CONFORMANCE`, see [`Setting`]) and makes its mesh the default device
//! ([`DistributedDevice::set_default`]), so the suite's `Default::default()` devices are that
//! mesh, with the creation-layout policy ([`Mesh::with_creation_sharding`]) sharding every
//! tensor the tests create. `BURN_DTENSOR_STACKED=0` switches stacked execution off.
//!
//! Run all settings with `./conformance/run` (counts per setting, honest `should_panic`);
//! `INNER=flex ./conformance/run` on Flex.
#![cfg(feature = "suite")]

#[cfg(all(feature = "ndarray", feature = "flex"))]
compile_error!(
    "features `conformance` (NdArray) and `conformance-flex` (Flex) each pick the inner backend the \
     suite runs on: enable one of them"
);

use std::io::Write;

use burn::tensor::backend::BackendTypes;
use burn_dtensor::{DistributedBackend, DistributedDevice, Mesh};

/// The inner backend: NdArray (feature `conformance`).
#[cfg(not(feature = "flex"))]
pub type Inner = burn::backend::NdArray<f32>;
/// The inner backend: Flex (feature `conformance-flex`).
#[cfg(feature = "flex")]
pub type Inner = burn::backend::Flex;
/// The device of [`Inner`].
pub type InnerDevice = <Inner as BackendTypes>::Device;
/// The backend under test.
pub type Dist = DistributedBackend<Inner>;
/// The device of [`Dist`].
pub type DistDevice = DistributedDevice<InnerDevice>;

/// A layout setting of the conformance run (`BURN_DTENSOR_CONFORMANCE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting {
    /// `one`: the mesh of one device (every op on the one-device fast path).
    One,
    /// `replicated`: a 2x2 virtual mesh (`a=2,b=2`), every tensor replicated.
    Replicated,
    /// `sharded` (the default): a 2x2 virtual mesh, every created tensor with dim 0 sharded over
    /// `a` and dim 1 over `b` (uneven and empty shards whenever a dim is odd or below 2).
    Sharded,
    /// `dim0`: a 1-D virtual mesh of 4 (`x=4`), every created tensor's dim 0 sharded over it.
    Dim0,
}

impl Setting {
    /// All settings, in the order the runner uses.
    pub const ALL: [Setting; 4] = [
        Setting::One,
        Setting::Replicated,
        Setting::Sharded,
        Setting::Dim0,
    ];

    /// The setting `BURN_DTENSOR_CONFORMANCE` names (`sharded` when unset).
    ///
    /// # Panics
    /// For an unknown name, listing the valid ones.
    pub fn from_env() -> Self {
        let v = std::env::var("BURN_DTENSOR_CONFORMANCE").unwrap_or_else(|_| "sharded".into());
        Self::parse(&v).unwrap_or_else(|| {
            panic!("BURN_DTENSOR_CONFORMANCE={v}: expected one of one, replicated, sharded, dim0")
        })
    }

    /// Parses a setting name.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "one" => Setting::One,
            "replicated" => Setting::Replicated,
            "sharded" => Setting::Sharded,
            "dim0" => Setting::Dim0,
            _ => return None,
        })
    }

    /// The mesh of this setting (stacked execution per `BURN_DTENSOR_STACKED`).
    pub fn mesh(self) -> Mesh<InnerDevice> {
        let dev = InnerDevice::default();
        let square = || Mesh::virtual_devices([("a", 2), ("b", 2)], dev).expect("2x2 mesh");
        match self {
            Setting::One => Mesh::single(dev),
            Setting::Replicated => square(),
            Setting::Sharded => square()
                .with_creation_sharding(["a", "b"])
                .expect("axes a, b"),
            Setting::Dim0 => Mesh::virtual_devices([("x", 4)], dev)
                .expect("mesh of 4")
                .with_creation_sharding(["x"])
                .expect("axis x"),
        }
    }
}

/// Sets the process up for the suite (called once, before any test, by the test targets'
/// constructor): the setting's mesh becomes the default device, the default dtypes are the
/// suite's (`f32`, `i32`) on it and on the inner device (as on the bare inner backend), and
/// panics are logged for the runner's `should_panic` check.
pub fn configure(float: burn::tensor::DType, int: burn::tensor::DType) {
    let mesh = Setting::from_env().mesh();
    DistributedDevice::set_default(mesh);
    let device = DistDevice::default();
    burn::tensor::set_default_dtypes::<Dist>(&device, float, int).unwrap();
    burn::tensor::set_default_dtypes::<Inner>(&InnerDevice::default(), float, int).unwrap();
    install_panic_log();
}

/// With `BURN_DTENSOR_PANIC_LOG=FILE`, every panic appends `test<TAB>file:line<TAB>message` to
/// FILE (libtest names each test's thread after the test). The runner uses it to fail
/// `should_panic` tests that passed on a panic raised inside the decorator, or with another
/// message than on the mesh of one.
fn install_panic_log() {
    let Some(path) = std::env::var_os("BURN_DTENSOR_PANIC_LOG") else {
        return;
    };
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let thread = std::thread::current();
        let name = thread.name().unwrap_or("?");
        let location = info
            .location()
            .map_or_else(|| "?".to_string(), |l| format!("{}:{}", l.file(), l.line()));
        let payload = info.payload();
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        let message = message.lines().next().unwrap_or("").replace('\t', " ");
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
        {
            let _ = writeln!(f, "{name}\t{location}\t{message}");
        }
        previous(info);
    }));
}
