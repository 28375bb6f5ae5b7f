//! A fully convolutional encoder-decoder's training step (a 3x3 `Conv2d`, a 3x3 one of stride 2
//! down to half the resolution, a 3x3 max pool of stride 1, a `ConvTranspose2d` of kernel 4 and
//! stride 2 back up (DCGAN's upsampling), a last 3x3 `Conv2d`; padding 1, ReLU between; mean
//! squared error against a target image, SGD) on 8 virtual devices, as a ratio to the bare backend's step measured in the same
//! run, with the bytes the step's collectives move:
//! - `data`: mesh `batch=8`, the images sharded on the batch;
//! - `spatial`: mesh `batch=2,h=2,w=2`, the images sharded on batch, height and width (each
//!   device a quarter of 2 images: halos exchanged between neighbours for the convolutions
//!   and the pool, overlap rows folded back for the transposed convolution, `rules/conv.rs`);
//! - `spatial-h`: mesh `h=8`, the height alone sharded (every device a band of every image).
//!
//! Parameters are replicated (created on the mesh); their gradients are pending sums settled by
//! the optimizer. `cargo bench --bench cnn_step` (`DTENSOR_BENCH_ROUNDS=<rounds>x<steps>`,
//! default 2x10; images `[8, 4, 64, 64]`, 8 channels inside): rank-free, one process. Under
//! `cargo test --all-targets` one small step per mode runs as a smoke test. Figures in NOTES.md.

use std::time::Instant;

use burn::backend::{Autodiff, NdArray};
use burn::module::Module;
use burn::nn::PaddingConfig2d;
use burn::nn::conv::{Conv2d, Conv2dConfig, ConvTranspose2d, ConvTranspose2dConfig};
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::activation::relu;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::module::max_pool2d;
use burn::tensor::{ElementConversion, Tensor, TensorData};
use burn_dtensor::{
    DistributedBackend, DistributedDevice, Layout, Mesh, UNSHARDED, distribute, record_comms,
};

#[path = "common/mod.rs"]
mod common;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Module, Debug)]
struct Fcn<B: Backend> {
    conv1: Conv2d<B>,
    down: Conv2d<B>,
    up: ConvTranspose2d<B>,
    conv3: Conv2d<B>,
}

impl<B: Backend> Fcn<B> {
    /// `[batch, c, h, w]` to `[batch, c, h, w]` (`c` channels in and out, `hidden` inside).
    fn new(c: usize, hidden: usize, device: &B::Device) -> Self {
        let conv = |i, o, s| {
            Conv2dConfig::new([i, o], [3, 3])
                .with_stride([s, s])
                .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
                .init(device)
        };
        Self {
            conv1: conv(c, hidden, 1),
            down: conv(hidden, hidden, 2),
            up: ConvTranspose2dConfig::new([hidden, hidden], [4, 4])
                .with_stride([2, 2])
                .with_padding([1, 1])
                .init(device),
            conv3: conv(hidden, c, 1),
        }
    }
    fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let x = relu(self.conv1.forward(x));
        let x = relu(self.down.forward(x));
        // A 3x3 max filter (stride 1, padding 1): a pool that reads its neighbours' rows.
        let x = max_pool2d(x, [3, 3], [1, 1], [1, 1], [1, 1], false);
        let x = relu(self.up.forward(x));
        self.conv3.forward(x)
    }
}

/// One SGD step of `model` on `(x, y)`; the loss read back (a host sync on every backend).
fn step<B: AutodiffBackend>(
    model: Fcn<B>,
    opt: &mut impl Optimizer<Fcn<B>, B>,
    x: Tensor<B, 4>,
    y: Tensor<B, 4>,
) -> (Fcn<B>, f32) {
    let loss = (model.forward(x) - y).powi_scalar(2).mean();
    let value = loss.clone().into_scalar().elem::<f32>();
    let grads = GradientsParams::from_grads(loss.backward(), &model);
    (opt.step(1e-3, model, grads), value)
}

/// Deterministic images `[shape]` in [-1, 1) from a xorshift generator seeded with `seed`.
fn image(shape: [usize; 4], seed: u64) -> TensorData {
    let mut s = seed;
    let v: Vec<f32> = (0..shape.iter().product::<usize>())
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % 2000) as f32 / 1000.0 - 1.0
        })
        .collect();
    TensorData::new(v, shape)
}

/// A mode: `(name, mesh axes, the images' sharding spec)`.
type ModeSpec = (&'static str, Vec<(&'static str, usize)>, [&'static str; 4]);

fn modes() -> Vec<ModeSpec> {
    vec![
        (
            "data",
            vec![("batch", 8)],
            ["batch", UNSHARDED, UNSHARDED, UNSHARDED],
        ),
        (
            "spatial",
            vec![("batch", 2), ("h", 2), ("w", 2)],
            ["batch", UNSHARDED, "h", "w"],
        ),
        (
            "spatial-h",
            vec![("h", 8)],
            [UNSHARDED, UNSHARDED, "h", UNSHARDED],
        ),
    ]
}

/// The median of `steps` steps (ms) of `model` (a fresh optimizer: SGD holds no state), and
/// its last loss.
fn median_ms<B: AutodiffBackend>(
    mut model: Fcn<B>,
    x: &Tensor<B, 4>,
    y: &Tensor<B, 4>,
    steps: usize,
) -> (f64, f32) {
    let mut opt = SgdConfig::new().init::<B, Fcn<B>>();
    let mut times = Vec::with_capacity(steps);
    let mut loss = 0.0;
    for _ in 0..steps {
        let t = Instant::now();
        (model, loss) = step(model, &mut opt, x.clone(), y.clone());
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    (times[times.len() / 2], loss)
}

fn main() {
    type Single = Autodiff<NdArray>;
    type Dist = Autodiff<DistributedBackend<NdArray>>;
    let smoke = common::smoke();
    let (shape, hidden) = if smoke {
        ([8, 2, 16, 16], 4)
    } else {
        ([8, 4, 64, 64], 8)
    };
    let (rounds, steps) = if smoke {
        (1, 1)
    } else {
        let spec = std::env::var("DTENSOR_BENCH_ROUNDS").unwrap_or_else(|_| "2x10".into());
        let (r, s) = spec
            .split_once('x')
            .expect("DTENSOR_BENCH_ROUNDS=<rounds>x<steps>");
        (r.parse().unwrap(), s.parse().unwrap())
    };
    let (dx, dy) = (image(shape, 1), image(shape, 2));
    let dev = Default::default();
    // One draw of the initial parameters for every run (a module's parameters are drawn lazily,
    // so a clone of a fresh module would draw again).
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    let bytes =
        (recorder.record(Fcn::<Single>::new(shape[1], hidden, &dev).into_record(), ())).unwrap();
    println!("cnn_step: images {shape:?}, {hidden} channels inside, {rounds}x{steps} steps");
    for round in 0..rounds {
        let x = Tensor::<Single, 4>::from_data(dx.clone(), &dev);
        let y = Tensor::<Single, 4>::from_data(dy.clone(), &dev);
        let record = recorder.load(bytes.clone(), &dev).unwrap();
        let model = Fcn::<Single>::new(shape[1], hidden, &dev).load_record(record);
        // One step first, as the distributed runs' recorded one.
        let mut opt = SgdConfig::new().init::<Single, Fcn<Single>>();
        let (model, _) = step(model, &mut opt, x.clone(), y.clone());
        let (single, want) = median_ms(model, &x, &y, steps);
        println!("round {round}: single {single:.2} ms (loss {want:.6})");
        for (name, axes, spec) in modes() {
            let mesh = Mesh::virtual_devices(axes, dev).unwrap();
            let device = DistributedDevice::new(mesh.clone());
            let l = Layout::new(&mesh, spec).unwrap();
            let x: Tensor<Dist, 4> = distribute(dx.clone(), &l).unwrap();
            let y: Tensor<Dist, 4> = distribute(dy.clone(), &l).unwrap();
            // The single run's initial parameters, replicated on the mesh.
            let record = recorder.load(bytes.clone(), &device).unwrap();
            let model = Fcn::<Dist>::new(shape[1], hidden, &device).load_record(record);
            // The collectives of one step (the same every step).
            let mut opt = SgdConfig::new().init::<Dist, Fcn<Dist>>();
            let ((model, _), log) = record_comms(|| step(model, &mut opt, x.clone(), y.clone()));
            let (ms, loss) = median_ms(model, &x, &y, steps);
            // A layout never changes the result: the same loss after the same steps.
            assert!(
                (loss - want).abs() <= 1e-4 * want.abs(),
                "{name}: loss {loss} against the single run's {want}"
            );
            println!(
                "round {round}: {name:<9} {ms:.2} ms ({:.2}x single), loss {loss:.6}; one step: {log}",
                ms / single
            );
        }
    }
}
