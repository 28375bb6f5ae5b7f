//! The transformer text classifier (`dtensor_imdb::transformer`) trained by layout map alone
//! (issue 21): each mode's per-step losses against the mesh of one (the inner backend on whole
//! tensors), on a tiny configuration, and the collectives of one step.

use burn::backend::NdArray;
use burn::backend::ndarray::NdArrayDevice;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use burn_dtensor::{
    CommLog, DistributedBackend, DistributedDevice, Layout, LayoutMap, Mesh, distribute,
    record_comms,
};
use dtensor_imdb::transformer::{TextTransformer, TextTransformerConfig};

type DB = burn::backend::Autodiff<DistributedBackend<NdArray>>;

const VOCAB: usize = 50;
const SEQ: usize = 8;
const BATCH: usize = 8;

fn config() -> TextTransformerConfig {
    TextTransformerConfig::new(VOCAB)
        .with_seq_len(SEQ)
        .with_d_model(8)
        .with_heads(2)
        .with_ff(8)
        .with_dropout(0.0)
}

/// Token ids and labels of step `s` (deterministic, every id used).
fn batch(s: usize) -> (TensorData, TensorData) {
    let ids: Vec<i64> = (0..BATCH * SEQ)
        .map(|i| ((i * 7 + s * 13 + i / SEQ) % VOCAB) as i64)
        .collect();
    let labels: Vec<i64> = (0..BATCH).map(|b| ((b + s) % 2) as i64).collect();
    (
        TensorData::new(ids, [BATCH, SEQ]),
        TensorData::new(labels, [BATCH]),
    )
}

/// A mode: its mesh and layout map (the files under `layouts/transformer/`).
struct Mode {
    name: &'static str,
    axes: &'static [(&'static str, usize)],
    map: &'static str,
}

const SINGLE: Mode = Mode {
    name: "single",
    axes: &[("batch", 1)],
    map: "",
};
const MODES: [Mode; 4] = [
    Mode {
        name: "data",
        axes: &[("batch", 8)],
        map: "",
    },
    Mode {
        name: "fsdp",
        axes: &[("batch", 8)],
        map: include_str!("../../layouts/transformer/fsdp.toml"),
    },
    Mode {
        name: "tp",
        axes: &[("batch", 4), ("model", 2)],
        map: include_str!("../../layouts/transformer/tp.toml"),
    },
    Mode {
        name: "2d",
        axes: &[("batch", 4), ("model", 2)],
        map: include_str!("../../layouts/transformer/2d.toml"),
    },
];

/// `steps` Adam steps of `mode`: the losses, and the collectives of the last step (forward +
/// backward, then the update).
fn train(mode: &Mode, steps: usize) -> (Vec<f32>, CommLog, CommLog) {
    // The seeded draws must not interleave with the MLP tests' (NdArray's RNG is global).
    let _guard = crate::RNG_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let mesh = Mesh::virtual_devices(mode.axes.iter().copied(), NdArrayDevice::default()).unwrap();
    let dev = DistributedDevice::new(mesh.clone());
    DB::seed(&dev, 7);
    burn_dtensor::random::seed(7);
    let model: TextTransformer<DB> = config().init(&dev);
    let map = LayoutMap::from_toml_str(mode.map).unwrap();
    let mut model = map.apply(model, mesh.topology()).unwrap().0;
    let mut optim = AdamConfig::new().init::<DB, TextTransformer<DB>>();
    let loss_fn = CrossEntropyLossConfig::new().init(&dev);
    let ids_layout = Layout::batch_sharded(&mesh, "batch", 2).unwrap();
    let label_layout = Layout::batch_sharded(&mesh, "batch", 1).unwrap();
    let mut losses = Vec::new();
    let (mut fwd_bwd, mut update) = (CommLog::default(), CommLog::default());
    for s in 0..steps {
        let (ids, labels) = batch(s);
        let ids: Tensor<DB, 2, Int> = distribute(ids, &ids_layout).unwrap();
        let labels: Tensor<DB, 1, Int> = distribute(labels, &label_layout).unwrap();
        let ((loss, grads), log) = record_comms(|| {
            let loss = loss_fn.forward(model.forward(ids), labels);
            let grads = loss.backward();
            (loss, grads)
        });
        fwd_bwd = log;
        let grads = GradientsParams::from_grads(grads, &model);
        let (m, log) = record_comms(|| optim.step(1e-2, model.clone(), grads));
        model = m;
        update = log;
        losses.push(loss.into_scalar());
    }
    (losses, fwd_bwd, update)
}

/// Every mode gives the mesh of one's per-step losses (f32, 1e-5 relative), and prints the
/// collectives of its step.
#[test]
fn modes_match_single_device() {
    let steps = 5;
    let (want, _, _) = train(&SINGLE, steps);
    for mode in &MODES {
        let (got, fwd_bwd, update) = train(mode, steps);
        println!("{}: losses {got:?}", mode.name);
        for (what, log) in [("forward+backward", &fwd_bwd), ("adam step", &update)] {
            println!("  {what}: {log}");
            for e in &log.events {
                println!("    {} @{} {:?} ({} B)", e.kind, e.axis, e.shape, e.bytes);
            }
        }
        for (s, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 * w.abs().max(1e-3),
                "{}: step {s}: {g} vs {w} (single)",
                mode.name
            );
        }
    }
}
