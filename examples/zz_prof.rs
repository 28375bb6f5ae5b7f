// Profiling harness of session 58 (not committed): `examples/zz_prof.rs`, run as
// `zz_prof <single|data|model|spatial> <steps>`; prints µs per step after 50 warm-up steps.
use burn::backend::Flex;
use burn::optim::SgdConfig;
use burn::tensor::TensorData;
use burn_dtensor::LayoutMap;
use dtensor_imdb::model::{ImdbMlp, LossReduction};
use dtensor_imdb::train::{Distributed, Mode, Placement, Single, step};
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
fn batch(n: usize, width: usize, seed: u64) -> (TensorData, TensorData) {
    let mut s = seed;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let x: Vec<f32> = (0..n * width)
        .map(|_| {
            if next() % 10 == 0 {
                (next() % 1000) as f32 / 500.0
            } else {
                0.0
            }
        })
        .collect();
    let y: Vec<i64> = (0..n).map(|_| (next() % 2) as i64).collect();
    (TensorData::new(x, [n, width]), TensorData::new(y, [n]))
}
fn run<P: Placement>(p: &P, steps: usize) -> f64 {
    let (x, y) = batch(64, 1200, 7);
    let device = p.device();
    let mut model = p
        .prepare_model(ImdbMlp::with_dims(1200, 48, 2, &device))
        .unwrap();
    let mut optim = SgdConfig::new().init();
    let mut t = std::time::Duration::ZERO;
    for i in 0..steps + 50 {
        let s = std::time::Instant::now();
        let (xb, yb) = p.train_batch(x.clone(), y.clone()).unwrap();
        let (m, loss, _) = step(p, model, &mut optim, (xb, yb), 1e-2, LossReduction::Mean).unwrap();
        let _ = loss.into_data();
        model = m;
        if i >= 50 {
            t += s.elapsed();
        }
    }
    t.as_secs_f64() * 1e6 / steps as f64
}
fn main() {
    let mode = std::env::args().nth(1).unwrap();
    let steps: usize = std::env::args()
        .nth(2)
        .map(|s| s.parse().unwrap())
        .unwrap_or(1000);
    let us = match mode.as_str() {
        "single" => run(
            &Single::<Flex> {
                device: Default::default(),
            },
            steps,
        ),
        m => {
            let mode = match m {
                "data" => Mode::Data,
                "model" => Mode::Model,
                _ => Mode::Spatial,
            };
            let p = Distributed::<Flex>::new(
                mode.default_mesh(),
                8,
                Default::default(),
                LayoutMap::from_toml_str(mode.default_layout_map()).unwrap(),
            )
            .unwrap();
            run(&p, steps)
        }
    };
    println!("{mode}: {us:.1} us/step");
}
