//! The mode-equivalence test with an f64 inner backend, in its own test binary: Burn keys its
//! per-device default dtype by device type and id, which `NdArray<f32>` and `NdArray<f64>`
//! share, so an f32 run earlier in the same process would make this one create f32 tensors.

mod common;

use burn::backend::ndarray::NdArray;
use burn_dtensor::LayoutMap;
use dtensor_imdb::train::{self, Distributed, Mode, Quiet, Single, TrainConfig};

/// Losses of each step and the trained weights (every parameter, gathered to the host).
fn run_on<I: burn::tensor::backend::Backend>(
    mode: Mode,
    cfg: &TrainConfig,
    data: &train::Prepared,
) -> (Vec<f32>, Vec<Vec<f64>>) {
    let cfg = TrainConfig {
        mode,
        ..cfg.clone()
    };
    fn weights<B: burn::tensor::backend::Backend>(
        m: &dtensor_imdb::model::ImdbMlp<B>,
    ) -> Vec<Vec<f64>> {
        let v =
            |t: burn::tensor::Tensor<B, 2>| t.into_data().convert::<f64>().to_vec::<f64>().unwrap();
        let v1 =
            |t: burn::tensor::Tensor<B, 1>| t.into_data().convert::<f64>().to_vec::<f64>().unwrap();
        vec![
            v(m.dense1.weight.val()),
            v1(m.dense1.bias.as_ref().unwrap().val()),
            v1(m.bn.gamma.val()),
            v1(m.bn.beta.val()),
            v(m.dense2.weight.val()),
            v1(m.dense2.bias.as_ref().unwrap().val()),
        ]
    }
    match mode {
        Mode::Single => {
            let (s, m) = train::train(
                &Single::<I> {
                    device: Default::default(),
                },
                &cfg,
                data,
                &mut Quiet,
            )
            .unwrap();
            (s.train_losses, weights(&m))
        }
        m => {
            let p = Distributed::<I>::new(
                m.default_mesh(),
                8,
                Default::default(),
                LayoutMap::from_toml_str(m.default_layout_map()).unwrap(),
            )
            .unwrap();
            let (s, m) = train::train(&p, &cfg, data, &mut Quiet).unwrap();
            (s.train_losses, weights(&m))
        }
    }
}

fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / x.abs().max(1e-6))
        .fold(0.0, f32::max)
}

/// The same comparison with an f64 inner backend: the sharded runs then agree with the
/// single-device run to 1e-4 relative over all 100 steps (the f32 drift above is rounding,
/// not sharding).
/// Seeded runs of the two tests must not interleave (the generators are process-wide).
static RNG_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn modes_match_single_device_losses_f64() {
    let _guard = RNG_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let Some(p) = common::archive() else { return };
    let data = &train::prepare(&p).unwrap();
    type F64 = NdArray<f64>;
    let cfg = TrainConfig {
        epochs: 1,
        max_steps: Some(100),
        eval: false,
        ..TrainConfig::default()
    };
    let (single, w_single) = run_on::<F64>(Mode::Single, &cfg, data);
    for mode in [Mode::Data, Mode::Model, Mode::Spatial] {
        let (losses, w) = run_on::<F64>(mode, &cfg, data);
        let all = max_rel(&single, &losses);
        // Weights after the 100 steps, every parameter, relative to the parameter's scale.
        let wdiff = w_single
            .iter()
            .zip(&w)
            .map(|(a, b)| {
                let scale = a.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1e-12);
                a.iter()
                    .zip(b)
                    .map(|(x, y)| (x - y).abs() / scale)
                    .fold(0.0, f64::max)
            })
            .fold(0.0, f64::max);
        println!(
            "{mode:?} (f64 inner): max relative loss difference {all:.2e}, weights {wdiff:.2e} after 100 steps"
        );
        assert!(all < 1e-4, "{mode:?}: {all}");
        assert!(wdiff < 1e-4, "{mode:?}: weights differ by {wdiff}");
    }
}

#[path = "common/transformer.rs"]
mod transformer;

/// The transformer of `imdb_transformer` in every parallel mode gives the bare backend's f64
/// per-step losses over 50 steps to 1e-12 (relative), on synthetic reviews.
#[test]
fn transformer_modes_match_the_bare_backend_f64() {
    use dtensor_imdb::transformer_train::TfMode;
    let steps = 50;
    let want = transformer::run_mode::<NdArray<f64>>(TfMode::Single, steps, &RNG_LOCK).train_losses;
    assert_eq!(want.len(), steps);
    assert!(want[steps - 1] < want[0], "losses {want:?}");
    for mode in transformer::MODES {
        let got = transformer::run_mode::<NdArray<f64>>(mode, steps, &RNG_LOCK).train_losses;
        for (s, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-12 * w.abs(),
                "{mode:?} f64 step {s}: {g} vs {w} (single)"
            );
        }
    }
}
