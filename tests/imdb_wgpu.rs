//! `imdb_mlp --backend wgpu` (feature `wgpu`): the three parallel modes on a CubeCL backend give
//! the NdArray single-device losses over the first steps, on the real data. CI runs it on Mesa's
//! software Vulkan device; without any Vulkan adapter the test prints why it skips.
#![cfg(feature = "wgpu")]

mod common;

use burn::backend::{NdArray, Wgpu};
use burn::tensor::Tensor;
use burn_dtensor::LayoutMap;
use dtensor_imdb::train::{self, Distributed, Mode, OptimizerKind, Quiet, Single, TrainConfig};

fn adapter_available() -> bool {
    std::panic::catch_unwind(|| Tensor::<Wgpu, 1>::zeros([1], &Default::default()).into_data())
        .is_ok()
}

#[test]
fn wgpu_modes_match_ndarray_first_steps() {
    let Some(p) = common::archive() else { return };
    if !adapter_available() {
        println!("skipped: no wgpu adapter (install mesa-vulkan-drivers for the software device)");
        return;
    }
    let data = train::prepare(&p).unwrap();
    // Each backend draws initial weights from its own RNG, so the runs start from one set drawn
    // on NdArray: a zero-step checkpoint that every run resumes (checkpoints are backend- and
    // mesh-independent).
    let ckpt = std::env::temp_dir().join(format!("dtensor-wgpu-init-{}", std::process::id()));
    let init = TrainConfig {
        mode: Mode::Single,
        epochs: 1,
        max_steps: Some(0),
        eval: false,
        checkpoint_dir: Some(ckpt.clone()),
        optimizer: OptimizerKind::Sgd,
        lr: 1e-2,
        ..TrainConfig::default()
    };
    train::train(
        &Single::<NdArray> {
            device: Default::default(),
        },
        &init,
        &data,
        &mut Quiet,
    )
    .unwrap();
    // SGD, the tutorial's optimizer: Adam's first update is about lr * sign(g), which turns
    // rounding-level gradient entries (summed in another order by the GPU kernels) into full-size
    // steps of either sign, so it compares backends poorly after step 1.
    let cfg = TrainConfig {
        epochs: 2,
        max_steps: Some(3),
        eval: false,
        resume: Some(ckpt.clone()),
        optimizer: OptimizerKind::Sgd,
        lr: 1e-2,
        ..TrainConfig::default()
    };
    let want = train::train(
        &Single::<NdArray> {
            device: Default::default(),
        },
        &TrainConfig {
            mode: Mode::Single,
            ..cfg.clone()
        },
        &data,
        &mut Quiet,
    )
    .unwrap()
    .0
    .train_losses;
    assert_eq!(want.len(), 3);
    for mode in [Mode::Data, Mode::Model, Mode::Spatial] {
        let place = Distributed::<Wgpu>::new(
            mode.default_mesh(),
            8,
            Default::default(),
            LayoutMap::from_toml_str(mode.default_layout_map()).unwrap(),
        )
        .unwrap();
        let got = train::train(
            &place,
            &TrainConfig {
                mode,
                ..cfg.clone()
            },
            &data,
            &mut Quiet,
        )
        .unwrap()
        .0
        .train_losses;
        let diff = want
            .iter()
            .zip(&got)
            .map(|(a, b)| (a - b).abs() / a.abs())
            .fold(0.0f32, f32::max);
        println!(
            "{mode:?} on wgpu: losses {got:?} vs ndarray {want:?}: max relative difference {diff:.2e}"
        );
        assert!(diff < 1e-4, "{mode:?}: {diff}");
    }
    let _ = std::fs::remove_dir_all(ckpt);
}
