//! Training equivalence: an ordinary `burn::nn` model (Linear 12->6, relu, BatchNorm, Linear 6->2,
//! cross-entropy) gives the same loss, the same gradient for every parameter and the same SGD
//! update on `Autodiff<DistributedBackend<NdArray>>`, whatever the parallelism (data, model,
//! spatial), as on `Autodiff<NdArray>`; and each mode runs exactly the collectives its layouts
//! imply.

use std::collections::BTreeMap;
use std::sync::Mutex;

use burn::backend::ndarray::NdArrayDevice;
use burn::backend::{Autodiff, NdArray};
use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{BatchNorm, BatchNormConfig, Linear, LinearConfig};
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn::tensor::activation::relu;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor, TensorData};
use burn_dtensor::{
    CollectiveKind, CommLog, DTensorExt, DistributedBackend, DistributedDevice, Layout, Mesh,
    distribute, record_comms,
};

type Ref = Autodiff<NdArray>;
type Dist = Autodiff<DistributedBackend<NdArray>>;
type Dev = NdArrayDevice;

#[derive(Module, Debug)]
struct Net<B: Backend> {
    dense1: Linear<B>,
    bn: BatchNorm<B>,
    dense2: Linear<B>,
}

impl<B: Backend> Net<B> {
    fn new(device: &B::Device) -> Self {
        Self {
            dense1: LinearConfig::new(12, 6).init(device),
            bn: BatchNormConfig::new(6).init(device),
            dense2: LinearConfig::new(6, 2).init(device),
        }
    }
    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.dense2
            .forward(self.bn.forward(relu(self.dense1.forward(x))))
    }
    fn loss(&self, x: Tensor<B, 2>, y: Tensor<B, 1, Int>) -> Tensor<B, 1> {
        let logits = self.forward(x);
        CrossEntropyLossConfig::new()
            .init(&logits.device())
            .forward(logits, y)
    }
}

// ---------------------------------------------------------------------------------------------
// Modes
// ---------------------------------------------------------------------------------------------

struct Mode {
    name: &'static str,
    axes: &'static [(&'static str, usize)],
    input: [&'static str; 2],
    /// Parameter path -> layout; every other parameter is replicated.
    params: &'static [(&'static str, &'static [&'static str])],
}

const DATA: Mode = Mode {
    name: "data-parallel",
    axes: &[("batch", 4)],
    input: ["batch", "unsharded"],
    params: &[],
};
const MODEL: Mode = Mode {
    name: "model-parallel",
    axes: &[("batch", 4), ("model", 2)],
    input: ["batch", "unsharded"],
    params: &[
        ("dense1.weight", &["unsharded", "model"]),
        ("dense2.weight", &["model", "unsharded"]),
    ],
};
const SPATIAL: Mode = Mode {
    name: "spatial-parallel",
    axes: &[("batch", 2), ("feature", 2), ("model", 2)],
    input: ["batch", "feature"],
    params: &[
        ("dense1.weight", &["feature", "model"]),
        ("dense2.weight", &["model", "unsharded"]),
    ],
};

impl Mode {
    fn mesh(&self) -> Mesh<Dev> {
        Mesh::virtual_devices(self.axes.iter().copied(), Dev::default()).unwrap()
    }
    fn param_layout(&self, mesh: &Mesh<Dev>, path: &str, rank: usize) -> Layout {
        self.params.iter().find(|(p, _)| *p == path).map_or_else(
            || Layout::replicated(mesh, rank),
            |(_, s)| Layout::new(mesh, s.iter()).unwrap(),
        )
    }
}

/// Relayouts every float parameter of a distributed model by its path (`dense1.weight`), keeping
/// it a leaf that requires grad.
struct Relayouter<'a> {
    mode: &'a Mode,
    mesh: Mesh<Dev>,
    path: Vec<String>,
    seen: Vec<String>,
}

impl ModuleMapper<Dist> for Relayouter<'_> {
    fn enter_module(&mut self, name: &str, _container: &str) {
        self.path.push(name.to_string());
    }
    fn exit_module(&mut self, _name: &str, _container: &str) {
        self.path.pop();
    }
    fn map_float<const D: usize>(
        &mut self,
        param: Param<Tensor<Dist, D>>,
    ) -> Param<Tensor<Dist, D>> {
        let path = self.path.join(".");
        let l = self.mode.param_layout(&self.mesh, &path, D);
        self.seen.push(path);
        param.map(|t| {
            let rg = t.is_require_grad();
            let t = t.relayout(&l).unwrap().detach();
            if rg { t.require_grad() } else { t }
        })
    }
}

/// Reads every float parameter (value, or gradient when `grads` is given) by path, in visit
/// order.
struct Reader<'a, B: AutodiffBackend> {
    path: Vec<String>,
    grads: Option<&'a B::Gradients>,
    out: Vec<(String, TensorData)>,
}

impl<'a, B: AutodiffBackend> Reader<'a, B> {
    fn read<M: Module<B>>(model: &M, grads: Option<&'a B::Gradients>) -> Vec<(String, TensorData)> {
        let mut r = Self {
            path: Vec::new(),
            grads,
            out: Vec::new(),
        };
        model.visit(&mut r);
        r.out
    }
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Reader<'_, B> {
    fn enter_module(&mut self, name: &str, _container: &str) {
        self.path.push(name.to_string());
    }
    fn exit_module(&mut self, _name: &str, _container: &str) {
        self.path.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let path = self.path.join(".");
        match self.grads {
            // BatchNorm's running statistics are module state, not trained.
            Some(_) if path.contains(".running_") => {}
            Some(g) => {
                let grad = param
                    .val()
                    .grad(g)
                    .unwrap_or_else(|| panic!("no gradient for {path}"));
                self.out.push((path, grad.into_data()));
            }
            None => self.out.push((path, param.val().into_data())),
        }
    }
}

/// Replaces a model's float parameters by values in visit order (as [`Reader`] reads them).
struct Writer<'a>(std::slice::Iter<'a, (String, TensorData)>);

impl<B: AutodiffBackend> ModuleMapper<B> for Writer<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (_, v) = self.0.next().expect("one value per float parameter");
        param.map(|t| {
            Tensor::from_data(v.clone(), &t.device()).set_require_grad(t.is_require_grad())
        })
    }
}

/// The layouts of a distributed model's parameters (or of their gradients), by path.
struct LayoutReader<'a> {
    path: Vec<String>,
    grads: Option<&'a <Dist as AutodiffBackend>::Gradients>,
    out: BTreeMap<String, Layout>,
}

impl ModuleVisitor<Dist> for LayoutReader<'_> {
    fn enter_module(&mut self, name: &str, _container: &str) {
        self.path.push(name.to_string());
    }
    fn exit_module(&mut self, _name: &str, _container: &str) {
        self.path.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Dist, D>>) {
        let l = match self.grads {
            Some(_) if self.path.last().is_some_and(|p| p.starts_with("running_")) => return,
            Some(g) => (param.val().grad(g).unwrap()).layout(),
            None => param.val().layout(),
        };
        self.out.insert(self.path.join("."), l);
    }
}

fn layouts(
    model: &Net<Dist>,
    grads: Option<&<Dist as AutodiffBackend>::Gradients>,
) -> BTreeMap<String, Layout> {
    let mut r = LayoutReader {
        path: Vec::new(),
        grads,
        out: BTreeMap::new(),
    };
    model.visit(&mut r);
    r.out
}

// ---------------------------------------------------------------------------------------------
// Setup
// ---------------------------------------------------------------------------------------------

/// NdArray's random generator is process-global: initialisation holds this lock.
static RNG_LOCK: Mutex<()> = Mutex::new(());

/// The two models with identical weights: the distributed one drawn by the decorator's
/// counter-based generator (lazily initialised parameters materialised in visit order under
/// the lock), its values copied into the reference model. The distributed model's parameters
/// are then relaid out per `mode`.
fn models(mode: &Mode, mesh: &Mesh<Dev>) -> (Net<Ref>, Net<Dist>) {
    let dev = Dev::default();
    let mdev = DistributedDevice::new(mesh.clone());
    let (r, d) = {
        let _g = RNG_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        Dist::seed(&mdev, 42);
        let d = Net::<Dist>::new(&mdev);
        let dv = Reader::read(&d, None);
        let r = Net::<Ref>::new(&dev).map(&mut Writer(dv.iter()));
        let rv = Reader::read(&r, None);
        for ((p, a), (q, b)) in rv.iter().zip(&dv) {
            assert_eq!(p, q);
            a.assert_eq(b, true);
        }
        (r, d)
    };
    let mut m = Relayouter {
        mode,
        mesh: mesh.clone(),
        path: Vec::new(),
        seen: Vec::new(),
    };
    let d = d.map(&mut m);
    assert_eq!(
        m.seen,
        [
            "dense1.weight",
            "dense1.bias",
            "bn.gamma",
            "bn.beta",
            "bn.running_mean",
            "bn.running_var",
            "dense2.weight",
            "dense2.bias"
        ]
    );
    for (p, l) in layouts(&d, None) {
        assert_eq!(l, mode.param_layout(mesh, &p, l.rank()), "{p}");
    }
    (r, d)
}

/// SplitMix64 data: inputs in [-2, 2], targets in {0, 1}.
fn batch(n: usize, seed: u64) -> (TensorData, TensorData) {
    let mut s = seed;
    let mut next = move || {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let x: Vec<f32> = (0..n * 12)
        .map(|_| (next() % 33) as f32 / 8.0 - 2.0)
        .collect();
    let y: Vec<i64> = (0..n).map(|_| (next() % 2) as i64).collect();
    (TensorData::new(x, [n, 12]), TensorData::new(y, [n]))
}

fn inputs(
    mode: &Mode,
    mesh: &Mesh<Dev>,
    x: &TensorData,
    y: &TensorData,
) -> (Tensor<Dist, 2>, Tensor<Dist, 1, Int>) {
    let xl = Layout::new(mesh, mode.input).unwrap();
    let yl = Layout::batch_sharded(mesh, "batch", 1).unwrap();
    (
        distribute(x.clone(), &xl).unwrap(),
        distribute(y.clone(), &yl).unwrap(),
    )
}

fn tol() -> burn::tensor::Tolerance<f32> {
    burn::tensor::Tolerance::rel_abs(1e-4, 1e-5)
}

// ---------------------------------------------------------------------------------------------
// Equivalence of loss, gradients and one SGD step
// ---------------------------------------------------------------------------------------------

fn equivalence(mode: &Mode, n: usize) {
    let mesh = mode.mesh();
    let (rm, dm) = models(mode, &mesh);
    let (x, y) = batch(n, n as u64);
    let dev = Dev::default();

    let rloss = rm.loss(
        Tensor::from_data(x.clone(), &dev),
        Tensor::from_data(y.clone(), &dev),
    );
    let (dx, dy) = inputs(mode, &mesh, &x, &y);
    let dloss = dm.loss(dx, dy);
    println!(
        "{} N={n}: loss {} = {}",
        mode.name,
        dloss.describe(),
        dloss.clone().into_data()
    );
    dloss
        .clone()
        .into_data()
        .assert_approx_eq::<f32>(&rloss.clone().into_data(), tol());

    let rgrads = rloss.backward();
    let dgrads = dloss.backward();
    let rg = Reader::read(&rm, Some(&rgrads));
    let dg = Reader::read(&dm, Some(&dgrads));
    assert_eq!(rg.len(), 6);
    for ((p, a), (q, b)) in rg.iter().zip(&dg) {
        assert_eq!(p, q);
        b.assert_approx_eq::<f32>(a, tol());
    }
    // Gradient layouts, as the backward pass leaves them: with a batch-sharded input every
    // gradient is a pending sum over `batch` (reading it, `into_data` or the optimizer's update,
    // runs one all-reduce); a sharded parameter gets its gradient in its own sharding.
    for (p, l) in layouts(&dm, Some(&dgrads)) {
        println!("  grad {p}: {l}");
        let pl = mode.param_layout(&mesh, &p, l.rank());
        assert_eq!(
            l.partial(mesh.topology().axis_index("batch").unwrap()),
            Some(burn_dtensor::ReduceOp::Sum),
            "{p}"
        );
        assert_sharded_like(&p, &l, &pl, mode);
    }

    // One SGD step on each: the same updated parameters, in the same layouts.
    let (rgp, dgp) = (
        GradientsParams::from_grads(rgrads, &rm),
        GradientsParams::from_grads(dgrads, &dm),
    );
    let rm = SgdConfig::new().init().step(0.5, rm, rgp);
    let dm = SgdConfig::new().init().step(0.5, dm, dgp);
    for ((p, a), (q, b)) in Reader::read(&rm, None).iter().zip(&Reader::read(&dm, None)) {
        assert_eq!(p, q);
        b.assert_approx_eq::<f32>(a, tol());
    }
    for (p, l) in layouts(&dm, None) {
        println!("  after the step {p}: {l}");
        assert!(!l.is_partial(), "{p}: {l}");
        assert_sharded_like(&p, &l, &mode.param_layout(&mesh, &p, l.rank()), mode);
    }
}

/// `l` (a gradient's or an updated parameter's layout) shards every dim that the parameter
/// layout `pl` shards, on the same axis. In data-parallel it is exactly `pl` (up to a pending
/// sum). In model/spatial-parallel, the gradient of a replicated parameter that only meets
/// `model`-sharded activations (the biases and BatchNorm's gamma/beta, whose activations are
/// `[N@batch, 6@model]`) comes back sharded on `model` and the SGD update `p - lr * g` then
/// takes that sharding (the element-wise rule shards the output like any sharded input, which
/// avoids gathering the gradient): the values are right, the layout of such parameters drifts
/// from replicated to `[model]`.
fn assert_sharded_like(p: &str, l: &Layout, pl: &Layout, mode: &Mode) {
    for (d, a) in pl.dims().iter().enumerate() {
        if a.is_some() {
            assert_eq!(l.dims()[d], *a, "{p}: {l} vs parameter layout {pl}");
        }
    }
    if mode.name == DATA.name {
        assert_eq!(l.without_partial(), *pl, "{p}");
    }
}

#[test]
fn data_parallel_matches_single_device() {
    for n in [10, 16] {
        equivalence(&DATA, n);
    }
}

#[test]
fn model_parallel_matches_single_device() {
    for n in [10, 16] {
        equivalence(&MODEL, n);
    }
}

#[test]
fn spatial_parallel_matches_single_device() {
    for n in [10, 16] {
        equivalence(&SPATIAL, n);
    }
}

// ---------------------------------------------------------------------------------------------
// Communication of one training step
// ---------------------------------------------------------------------------------------------

/// The collectives of one training step: forward + backward, then the SGD update.
fn step_comms(mode: &Mode, n: usize) -> (CommLog, CommLog) {
    let mesh = mode.mesh();
    let (_, dm) = models(mode, &mesh);
    let (x, y) = batch(n, 3);
    let (dx, dy) = inputs(mode, &mesh, &x, &y);
    let mut opt = SgdConfig::new().init();
    let (grads, fwd_bwd) = record_comms(|| dm.loss(dx, dy).backward());
    let grads = GradientsParams::from_grads(grads, &dm);
    let (_, update) = record_comms(|| opt.step(0.1, dm, grads));
    for (what, log) in [("forward+backward", &fwd_bwd), ("sgd step", &update)] {
        println!("{} N={n} {what}: {log}", mode.name);
        for e in &log.events {
            println!("  {} @{} {:?} ({} B)", e.kind, e.axis, e.shape, e.bytes);
        }
    }
    (fwd_bwd, update)
}

fn counts(log: &CommLog) -> BTreeMap<(CollectiveKind, String), usize> {
    log.summary()
        .into_iter()
        .map(|(k, (n, _))| (k, n))
        .collect()
}

fn expect(pairs: &[(CollectiveKind, &str, usize)]) -> BTreeMap<(CollectiveKind, String), usize> {
    pairs
        .iter()
        .map(|&(k, a, n)| ((k, a.to_string()), n))
        .collect()
}

/// The SGD update of every mode: exactly one all-reduce over `batch` per parameter gradient
/// (the pending batch sum), nothing else: no weight is ever gathered.
fn assert_one_all_reduce_per_gradient(update: &CommLog) {
    assert_eq!(
        counts(update),
        expect(&[(CollectiveKind::AllReduce, "batch", 6)]),
        "{update}"
    );
    let shapes: Vec<&[usize]> = update.events.iter().map(|e| e.shape.as_slice()).collect();
    assert_eq!(
        shapes,
        [&[12, 6][..], &[6], &[6], &[6], &[6, 2], &[2]],
        "dense1.weight, dense1.bias, bn.gamma, bn.beta, dense2.weight, dense2.bias"
    );
}

// Forward + backward, observed on every mode (N = 10 and 16 alike), all along `batch` unless
// noted:
// - BatchNorm forward: all-reduce [1, 6] (batch mean), [6] (the running-variance update
//   `var * momentum`, a partial sum scaled before `var` itself is reduced, so reduced on its
//   own), [1, 6] (batch variance). The running-mean update reuses the mean's memoised
//   reduction.
// - BatchNorm backward: all-reduce [6, 1] twice (the batch sums of the gradients that flow
//   into the mean and the variance).
// - model-parallel adds one all-reduce@model [N, 2] (the logits, a partial sum from the
//   `model`-sharded contracting dim of dense2); spatial-parallel adds that one and an
//   all-reduce@feature [N, 6] (dense1's pre-activations, contracting over `feature`).
// - The loss is a pending sum that nothing reads inside the step: no collective.
// - No all-gather, no reduce-scatter, no all-to-all in any mode.

#[test]
fn data_parallel_step_comms() {
    for n in [10, 16] {
        let (fwd_bwd, update) = step_comms(&DATA, n);
        assert_eq!(
            fwd_bwd.count(CollectiveKind::AllGather) + update.count(CollectiveKind::AllGather),
            0
        );
        assert_eq!(
            counts(&fwd_bwd),
            expect(&[(CollectiveKind::AllReduce, "batch", 3 + 2)]),
            "{fwd_bwd}"
        );
        assert_one_all_reduce_per_gradient(&update);
    }
}

#[test]
fn model_parallel_step_comms() {
    for n in [10, 16] {
        let (fwd_bwd, update) = step_comms(&MODEL, n);
        assert_eq!(
            counts(&fwd_bwd),
            expect(&[
                (CollectiveKind::AllReduce, "batch", 3 + 2),
                (CollectiveKind::AllReduce, "model", 1)
            ]),
            "{fwd_bwd}"
        );
        assert_one_all_reduce_per_gradient(&update);
    }
}

#[test]
fn spatial_parallel_step_comms() {
    for n in [10, 16] {
        let (fwd_bwd, update) = step_comms(&SPATIAL, n);
        let want = expect(&[
            (CollectiveKind::AllReduce, "batch", 3 + 2),
            (CollectiveKind::AllReduce, "feature", 1),
            (CollectiveKind::AllReduce, "model", 1),
        ]);
        assert_eq!(counts(&fwd_bwd), want, "{fwd_bwd}");
        assert_one_all_reduce_per_gradient(&update);
    }
}

/// An embedding lookup (Burn's `Embedding`: `weights.select(0, ids)`) with batch-sharded ids,
/// as in data-parallel training of a transformer: the lookup selects each device's own rows
/// (no all-gather of the ids or of the rows) and the backward's `select_add` leaves the weight's
/// gradient as a pending sum over `batch`, so forward and backward communicate nothing and
/// settling the gradient is one all-reduce of `[vocab, d]`, as for every other parameter.
/// Values against `Autodiff<NdArray>` on the whole tensors, repeated ids included.
#[test]
fn data_parallel_embedding_lookup_comms() {
    use burn::nn::Embedding;
    let mesh = Mesh::virtual_devices([("batch", 4)], Dev::default()).unwrap();
    let dev = DistributedDevice::new(mesh.clone());
    let (vocab, d, batch, seq) = (10, 6, 8, 5);
    let w: Vec<f32> = (0..vocab * d).map(|i| (i as f32 * 0.37).sin()).collect();
    let w = TensorData::new(w, [vocab, d]);
    let ids: Vec<i64> = (0..batch * seq).map(|i| ((i * 7) % vocab) as i64).collect();
    let ids = TensorData::new(ids, [batch, seq]);
    let y: Vec<f32> = (0..batch * seq * d)
        .map(|i| (i as f32 * 0.11).cos())
        .collect();
    let y = TensorData::new(y, [batch, seq, d]);

    let reference = Embedding::<Ref> {
        weight: Param::from_tensor(Tensor::from_data(w.clone(), &Dev::default())),
    };
    let out = reference.forward(Tensor::from_data(ids.clone(), &Dev::default()));
    let grads = (out.clone() * Tensor::from_data(y.clone(), &Dev::default()))
        .sum()
        .backward();
    let want_grad = reference.weight.grad(&grads).unwrap().into_data();
    let want_out = out.into_data();

    let emb = Embedding::<Dist> {
        weight: Param::from_tensor(Tensor::from_data(w, &dev)),
    };
    let batched = |rank| Layout::batch_sharded(&mesh, "batch", rank).unwrap();
    let dids: Tensor<Dist, 2, Int> = distribute(ids, &batched(2)).unwrap();
    let dy: Tensor<Dist, 3> = distribute(y, &batched(3)).unwrap();
    let (got, comms) = record_comms(|| {
        let out = emb.forward(dids);
        assert_eq!(
            out.layout(),
            batched(3),
            "the lookup keeps the batch sharded"
        );
        let grads = (out.clone() * dy).sum().backward();
        (out, emb.weight.grad(&grads).unwrap())
    });
    assert!(comms.events.is_empty(), "forward + backward: {comms}");
    let (out, grad) = got;
    out.into_data().assert_approx_eq::<f32>(&want_out, tol());
    assert!(grad.layout().is_partial(), "{}", grad.layout());
    let (grad, settle) = record_comms(|| grad.relayout(&Layout::replicated(&mesh, 2)).unwrap());
    grad.into_data().assert_approx_eq::<f32>(&want_grad, tol());
    assert_eq!(
        counts(&settle),
        expect(&[(CollectiveKind::AllReduce, "batch", 1)]),
        "{settle}"
    );
}

/// The output head and Burn's `CrossEntropyLoss` on its logits (`log_softmax`, then each row's
/// target picked by `gather`).
fn head_loss<B: Backend>(x: Tensor<B, 2>, w: Tensor<B, 2>, y: Tensor<B, 1, Int>) -> Tensor<B, 1> {
    let logits = x.matmul(w);
    CrossEntropyLossConfig::new()
        .init(&logits.device())
        .forward(logits, y)
}

/// Loss parallel (PyTorch DTensor's `loss_parallel`, Megatron-LM's vocab-parallel cross
/// entropy): a column-parallel output head gives logits sharded over the classes, and Burn's
/// unchanged `CrossEntropyLoss` runs on the class shards: forward and backward communicate only
/// `[batch]`-sized values (each row's max, its sum of exponentials, its picked log-probability),
/// never the `[batch, classes]` logits, and the head's gradient stays a pending sum over `batch`
/// in the head's layout. Loss and gradient against `Autodiff<NdArray>` on the whole tensors.
#[test]
fn loss_parallel_cross_entropy() {
    let mesh = Mesh::virtual_devices([("batch", 2), ("model", 4)], Dev::default()).unwrap();
    let (n, h, c) = (6, 5, 12);
    let wave =
        |len: usize, f: f32| -> Vec<f32> { (0..len).map(|i| (i as f32 * f).sin()).collect() };
    let x = TensorData::new(wave(n * h, 0.23), [n, h]);
    let w = TensorData::new(wave(h * c, 0.41), [h, c]);
    let y: Vec<i64> = (0..n).map(|i| ((i * 5) % c) as i64).collect();
    let y = TensorData::new(y, [n]);

    let rdev = Dev::default();
    let wr = Tensor::<Ref, 2>::from_data(w.clone(), &rdev).require_grad();
    let loss = head_loss(
        Tensor::from_data(x.clone(), &rdev),
        wr.clone(),
        Tensor::from_data(y.clone(), &rdev),
    );
    let want_grad = wr.grad(&loss.backward()).unwrap().into_data();
    let want_loss = loss.into_data();

    let batched = |rank| Layout::batch_sharded(&mesh, "batch", rank).unwrap();
    let head = Layout::new(&mesh, ["unsharded", "model"]).unwrap();
    let wd: Tensor<Dist, 2> = distribute(w, &head).unwrap();
    let wd = wd.require_grad();
    let xd: Tensor<Dist, 2> = distribute(x, &batched(2)).unwrap();
    let yd: Tensor<Dist, 1, Int> = distribute(y, &batched(1)).unwrap();
    assert_eq!(
        xd.clone().matmul(wd.clone()).layout(),
        Layout::new(&mesh, ["batch", "model"]).unwrap(),
        "the logits are sharded over the classes"
    );
    let ((loss, grad), comms) = record_comms(|| {
        let loss = head_loss(xd, wd.clone(), yd);
        let grads = loss.backward();
        (loss, wd.grad(&grads).unwrap())
    });
    assert_eq!(comms.count(CollectiveKind::AllGather), 0, "{comms}");
    assert_eq!(comms.count(CollectiveKind::AllToAll), 0, "{comms}");
    assert!(
        comms
            .events
            .iter()
            .all(|e| e.shape.iter().product::<usize>() <= n),
        "only [batch]-sized values move: {comms}"
    );
    loss.into_data().assert_approx_eq::<f32>(&want_loss, tol());
    assert_eq!(grad.layout().dims(), head.dims(), "{}", grad.layout());
    let grad = grad.relayout(&Layout::replicated(&mesh, 2)).unwrap();
    grad.into_data().assert_approx_eq::<f32>(&want_grad, tol());
}

/// The gradient flows back across a relayout to another mesh (in the input's layout) and across
/// `to_device` to another mesh: equal to `Autodiff<NdArray>`'s on the whole tensor.
#[test]
fn gradients_cross_meshes() {
    let dev = Dev::default();
    let m1 = Mesh::virtual_devices([("batch", 4)], dev).unwrap();
    let m2 = Mesh::virtual_devices([("x", 2), ("model", 3)], dev).unwrap();
    let (d1, d2) = (
        DistributedDevice::new(m1.clone()),
        DistributedDevice::new(m2.clone()),
    );
    let data = TensorData::new((0..42).map(|i| (i as f32 * 0.37).sin()).collect(), [7, 6]);
    let c = TensorData::new((0..42).map(|i| (i as f32 * 0.11).cos()).collect(), [7, 6]);
    let rows = Layout::batch_sharded(&m1, "batch", 2).unwrap();
    let cols = Layout::new(&m2, ["x", "model"]).unwrap();
    // The reference: (x * c + x^2).sum() on the whole tensor.
    let x = Tensor::<Ref, 2>::from_data(data.clone(), &dev).require_grad();
    let cr = Tensor::<Ref, 2>::from_data(c.clone(), &dev);
    let want = (x.clone() * cr + x.clone().powi_scalar(2)).sum().backward();
    let want = x.grad(&want).unwrap().into_data();
    for moved in [true, false] {
        let x: Tensor<Dist, 2> = distribute::<Dist, 2, burn::tensor::Float>(data.clone(), &rows)
            .unwrap()
            .require_grad();
        let y = if moved {
            x.clone().to_device(&d2)
        } else {
            x.clone().relayout(&cols).unwrap()
        };
        assert_eq!(y.layout().mesh(), cols.mesh());
        let cd = Tensor::<Dist, 2>::from_data(c.clone(), &d2);
        let grads = (y.clone() * cd + y.powi_scalar(2)).sum().backward();
        let g = x.grad(&grads).unwrap();
        // Burn's backward of `to_device` moves the gradient to the input's device, which
        // names the mesh only: it arrives in the mesh's creation layout (replicated).
        let want_layout = if moved {
            Layout::replicated(&m1, 2)
        } else {
            rows.clone()
        };
        assert_eq!(g.layout(), want_layout);
        assert_eq!(g.device(), d1);
        g.into_data()
            .assert_approx_eq::<f32>(&want, burn::tensor::Tolerance::default());
    }
}

/// A small spatial network of `burn::nn` modules on any backend (the convolution and decoder
/// tests' models): built from its config, and a scalar loss of an image `[batch, 3, h, w]`.
trait SpatialNet<B: Backend>: Module<B> {
    fn new(device: &B::Device) -> Self;
    fn loss(&self, x: Tensor<B, 4>) -> Tensor<B, 1>;
}

/// One step of a spatial network against `Autodiff<NdArray>` on the whole image: `R` runs on
/// `x` whole, `D` (the same parameter values) on `x` sharded over the batch, its height and its
/// width (the mesh `batch=2, h=2, w=2`). Checks ([`check_halo_step`]) that halos were exchanged,
/// the loss and the input gradient (in the input's layout), and every one of the `params`
/// parameters' gradients; returns the step's communication log.
fn spatial_step<R: SpatialNet<Ref>, D: SpatialNet<Dist>>(x: TensorData, params: usize) -> CommLog {
    let dev = Dev::default();
    let mesh = Mesh::virtual_devices([("batch", 2), ("h", 2), ("w", 2)], dev).unwrap();
    let reference = R::new(&dev);
    let xr = Tensor::<Ref, 4>::from_data(x.clone(), &dev).require_grad();
    let loss = reference.loss(xr.clone());
    let grads = loss.backward();
    let want_x = xr.grad(&grads).unwrap().into_data();
    let want_loss = loss.into_data();
    let want = Reader::read(&reference, Some(&grads));

    let mdev = DistributedDevice::new(mesh.clone());
    let values = Reader::read(&reference, None);
    let model = D::new(&mdev).map(&mut Writer(values.iter()));
    let xl = Layout::new(&mesh, ["batch", "unsharded", "h", "w"]).unwrap();
    let xd: Tensor<Dist, 4> = distribute(x, &xl).unwrap();
    let xd = xd.require_grad();
    let ((loss, grads), comms) = record_comms(|| {
        let loss = model.loss(xd.clone());
        let grads = loss.backward();
        (loss, grads)
    });
    check_halo_step(&comms, loss, &want_loss, (&xd, &grads, &want_x));
    let got = Reader::read(&model, Some(&grads));
    assert_eq!(got.len(), params);
    for ((p, a), (q, b)) in want.iter().zip(&got) {
        assert_eq!(p, q);
        b.assert_approx_eq::<f32>(a, tol());
    }
    comms
}

/// A small CNN of `burn::nn` convolutions (same padding, then stride 2).
#[derive(Module, Debug)]
struct Cnn<B: Backend> {
    conv1: burn::nn::conv::Conv2d<B>,
    conv2: burn::nn::conv::Conv2d<B>,
    conv3: burn::nn::conv::Conv1d<B>,
}

impl<B: Backend> SpatialNet<B> for Cnn<B> {
    fn new(device: &B::Device) -> Self {
        use burn::nn::PaddingConfig2d;
        use burn::nn::conv::{Conv1dConfig, Conv2dConfig};
        Self {
            conv1: Conv2dConfig::new([3, 4], [3, 3])
                .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
                .init(device),
            conv2: Conv2dConfig::new([4, 2], [3, 3])
                .with_stride([2, 2])
                .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
                .init(device),
            conv3: Conv1dConfig::new(2, 2, 3)
                .with_padding(burn::nn::PaddingConfig1d::Explicit(1, 1))
                .init(device),
        }
    }
    /// `x` `[batch, 3, h, w]` -> a scalar: the convolutions, then a weighted sum (so every
    /// output position has its own gradient).
    fn loss(&self, x: Tensor<B, 4>) -> Tensor<B, 1> {
        let y = self.conv2.forward(relu(self.conv1.forward(x)));
        let [n, c, h, w] = y.dims();
        // The 1-D convolution over each channel's pixels laid end to end, `[n, c, h * w]` (the
        // reshape's rule decides which of the spatial shardings the merged dim keeps).
        let z = self.conv3.forward(y.reshape([n, c, h * w]));
        let weights = Tensor::<B, 1, Int>::arange(0..(n * c * h * w) as i64, &z.device())
            .float()
            .reshape([n, c, h * w])
            .sin();
        (z * weights).sum()
    }
}

/// Spatial parallelism through `burn::nn`'s `Conv2d` and `Conv1d`: the image sharded over the
/// batch, its height and its width (the mesh `batch=2, h=2, w=2`); the loss, every parameter's
/// gradient and the input's equal `Autodiff<NdArray>`'s on the whole tensors, the input gradient
/// in the input's layout, and no collective moves an activation's whole height and width (only
/// halo strips, the parameters' gradients and the 1-D convolution's gathered width move).
#[test]
fn spatial_parallel_convolution() {
    let (n, h, w) = (4, 12, 10);
    let x = TensorData::new(
        (0..n * 3 * h * w)
            .map(|i| (i as f32 * 0.37).sin())
            .collect::<Vec<_>>(),
        [n, 3, h, w],
    );
    let comms = spatial_step::<Cnn<Ref>, Cnn<Dist>>(x, 6);
    // No collective moves an image or activation over its whole height and width.
    assert!(
        comms
            .events
            .iter()
            .all(|e| e.shape.len() != 4 || e.shape[2] < h || e.shape[3] < w),
        "{comms}"
    );
    assert!(comms.count(CollectiveKind::AllGather) > 0, "{comms}");
}

/// A small decoder of `burn::nn` transposed convolutions: DCGAN's upsampling (kernel 4, stride
/// 2, padding 1), then a grouped one with an output padding, then a 1-D one.
#[derive(Module, Debug)]
struct Decoder<B: Backend> {
    up1: burn::nn::conv::ConvTranspose2d<B>,
    up2: burn::nn::conv::ConvTranspose2d<B>,
    up3: burn::nn::conv::ConvTranspose1d<B>,
}

impl<B: Backend> SpatialNet<B> for Decoder<B> {
    fn new(device: &B::Device) -> Self {
        use burn::nn::conv::{ConvTranspose1dConfig, ConvTranspose2dConfig};
        Self {
            up1: ConvTranspose2dConfig::new([3, 4], [4, 4])
                .with_stride([2, 2])
                .with_padding([1, 1])
                .init(device),
            up2: ConvTranspose2dConfig::new([4, 2], [3, 3])
                .with_stride([2, 2])
                .with_padding([1, 1])
                .with_padding_out([1, 1])
                .with_groups(2)
                .init(device),
            up3: ConvTranspose1dConfig::new([2, 2], 3)
                .with_padding(1)
                .init(device),
        }
    }
    /// `x` `[batch, 3, h, w]` -> a scalar: the upsamplings (`[batch, 2, 4h, 4w]`), then a
    /// weighted sum (so every output position has its own gradient).
    fn loss(&self, x: Tensor<B, 4>) -> Tensor<B, 1> {
        let y = self.up2.forward(relu(self.up1.forward(x)));
        let [n, c, h, w] = y.dims();
        let z = self.up3.forward(y.reshape([n, c, h * w]));
        let weights = Tensor::<B, 1, Int>::arange(0..(n * c * h * w) as i64, &z.device())
            .float()
            .reshape([n, c, h * w])
            .cos();
        (z * weights).sum()
    }
}

/// Spatial parallelism through `burn::nn`'s `ConvTranspose2d` and `ConvTranspose1d` (a
/// decoder): the image sharded over the batch, its height and its width (`batch=2, h=2, w=2`);
/// the loss, every parameter's gradient and the input's equal `Autodiff<NdArray>`'s on the whole
/// tensors, the input gradient in the input's layout, and no collective moves an activation's
/// whole height and width: the forward folds overlap rows back to their owners, the input
/// gradient is a convolution with halos, the weight gradient a convolution's weight gradient
/// with halos, all collective permutes.
#[test]
fn spatial_parallel_transposed_convolution() {
    let (n, h, w) = (4, 6, 5);
    let x = TensorData::new(
        (0..n * 3 * h * w)
            .map(|i| (i as f32 * 0.53).sin())
            .collect::<Vec<_>>(),
        [n, 3, h, w],
    );
    let comms = spatial_step::<Decoder<Ref>, Decoder<Dist>>(x.clone(), 6);
    // Only halo rows move (collective permutes), but for the one all-gather of the width that
    // merging the height and width into the 1-D layer's length needs (the merged dim keeps the
    // height's axis, the reshape's rule): no activation crosses whole otherwise, forward or
    // backward.
    let gathers: Vec<_> = comms
        .events
        .iter()
        .filter(|e| e.kind != CollectiveKind::CollectivePermute)
        .map(|e| (e.kind, e.shape.clone()))
        .collect();
    assert_eq!(
        gathers,
        vec![(CollectiveKind::AllGather, vec![n, 2, 4 * h, 4 * w])],
        "{comms}"
    );

    // The batch-parallel forms: the input sharded over the batch only, and an output padding
    // not below the stride (1 at stride 1, dilation 2) with the height sharded too (the forward
    // and the weight gradient batch-parallel, Burn's own per shard): the same gradients.
    use burn::tensor::module::conv_transpose2d;
    use burn::tensor::ops::ConvTransposeOptions;
    let dev = Dev::default();
    let mesh = Mesh::virtual_devices([("batch", 2), ("h", 2), ("w", 2)], dev).unwrap();
    let wave = |n: usize, f: f32| (0..n).map(|i| (i as f32 * f).cos()).collect::<Vec<_>>();
    let (dw, db) = (
        TensorData::new(wave(3 * 4 * 4 * 4, 0.29), [3, 4, 4, 4]),
        TensorData::new(wave(4, 0.7), [4]),
    );
    let opts = || ConvTransposeOptions::new([1, 1], [1, 1], [1, 1], [2, 2], 1);
    let step = |x: Tensor<Ref, 4>, w: Tensor<Ref, 4>, b: Tensor<Ref, 1>| {
        let y = conv_transpose2d(x.clone(), w.clone(), Some(b.clone()), opts());
        let g = (y.clone() * y.sin()).sum().backward();
        [x.grad(&g), w.grad(&g)].map(|t| t.unwrap().into_data())
    };
    let ref_of = |d: &TensorData| Tensor::<Ref, 4>::from_data(d.clone(), &dev).require_grad();
    let xdata = x;
    let b = Tensor::<Ref, 1>::from_data(db.clone(), &dev).require_grad();
    let want = step(ref_of(&xdata), ref_of(&dw), b);
    for spec in [
        ["batch", "unsharded", "unsharded", "unsharded"],
        ["batch", "unsharded", "h", "unsharded"],
    ] {
        let xl = Layout::new(&mesh, spec).unwrap();
        let rep = |r| Layout::replicated(&mesh, r);
        let x: Tensor<Dist, 4> = distribute(xdata.clone(), &xl).unwrap();
        let w: Tensor<Dist, 4> = distribute(dw.clone(), &rep(4)).unwrap();
        let b: Tensor<Dist, 1> = distribute(db.clone(), &rep(1)).unwrap();
        let (x, w, b) = (x.require_grad(), w.require_grad(), b.require_grad());
        let y = conv_transpose2d(x.clone(), w.clone(), Some(b), opts());
        let g = (y.clone() * y.sin()).sum().backward();
        for (t, want) in [x.grad(&g), w.grad(&g)].into_iter().zip(&want) {
            t.unwrap().into_data().assert_approx_eq::<f32>(want, tol());
        }
    }
}

/// A ResNet-style classifier head of `burn::nn` modules: a 3x3 convolution, ReLU, the global
/// average pool (`AdaptiveAvgPool2d` to `[1, 1]`) and a linear layer to 5 classes.
#[derive(Module, Debug)]
struct Classifier<B: Backend> {
    conv: burn::nn::conv::Conv2d<B>,
    pool: burn::nn::pool::AdaptiveAvgPool2d,
    head: Linear<B>,
}

impl<B: Backend> SpatialNet<B> for Classifier<B> {
    fn new(device: &B::Device) -> Self {
        use burn::nn::PaddingConfig2d;
        use burn::nn::conv::Conv2dConfig;
        use burn::nn::pool::AdaptiveAvgPool2dConfig;
        Self {
            conv: Conv2dConfig::new([3, 6], [3, 3])
                .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
                .init(device),
            pool: AdaptiveAvgPool2dConfig::new([1, 1]).init(),
            head: LinearConfig::new(6, 5).init(device),
        }
    }
    /// `x` `[batch, 3, h, w]` -> a scalar: the logits `[batch, 5]` weighted (so every logit has
    /// its own gradient).
    fn loss(&self, x: Tensor<B, 4>) -> Tensor<B, 1> {
        let y = self.pool.forward(relu(self.conv.forward(x)));
        let [n, c, _, _] = y.dims();
        let logits = self.head.forward(y.reshape([n, c]));
        let weights = Tensor::<B, 1, Int>::arange(0..(n * 5) as i64, &logits.device())
            .float()
            .reshape([n, 5])
            .sin();
        (logits * weights).sum()
    }
}

/// A ResNet-style head on a spatially sharded image (`batch=2, h=2, w=2`): the global average
/// pool leaves a pending sum over `h` and `w` (each device averages its block over the global
/// count) that the classifier settles on `[batch, classes]`-sized values; the image is never
/// gathered. Loss, the input gradient (in the input's layout, the backward pass spreading the
/// pooled gradient over each device's own block) and every parameter's gradient equal
/// `Autodiff<NdArray>`'s on the whole tensors.
#[test]
fn spatial_parallel_global_average_pool() {
    let (n, h, w) = (4, 10, 12);
    let x = TensorData::new(
        (0..n * 3 * h * w)
            .map(|i| (i as f32 * 0.41).cos())
            .collect::<Vec<_>>(),
        [n, 3, h, w],
    );
    let comms = spatial_step::<Classifier<Ref>, Classifier<Dist>>(x, 4);
    assert_eq!(comms.count(CollectiveKind::AllGather), 0, "{comms}");
    // Past the convolution's halos, only values of at most `batch x channels` cross.
    for e in &comms.events {
        if e.kind != CollectiveKind::CollectivePermute {
            assert!(e.shape.iter().product::<usize>() <= n * 6, "{comms}");
        }
    }
}

/// Spatial parallelism through pools: `max_pool2d` (3x3, stride 2, padding 1: a ResNet stem's)
/// then `avg_pool2d` (2x2, stride 2) of an image sharded on batch, height and width, and the
/// input's gradient through both (Burn's max pool backward goes through the global indices):
/// the loss and the gradient equal `Autodiff<NdArray>`'s on the whole tensor, the gradient keeps
/// the input's layout, and only halo rows move (collective permutes, no all-gather).
#[test]
fn spatial_parallel_pools() {
    use burn::tensor::module::{avg_pool2d, max_pool2d};
    let dev = Dev::default();
    let mesh = Mesh::virtual_devices([("batch", 2), ("h", 2), ("w", 2)], dev).unwrap();
    let (n, h, w) = (4, 16, 18);
    let values: Vec<f32> = (0..n * 3 * h * w)
        .map(|i| ((i * 37 % 101) as f32 * 0.173).sin())
        .collect();
    let x = TensorData::new(values, [n, 3, h, w]);
    let target = TensorData::new(
        (0..n * 3 * 4 * 4)
            .map(|i| (i as f32 * 0.31).cos())
            .collect::<Vec<_>>(),
        [n, 3, 4, 4],
    );
    fn net<B: Backend>(x: Tensor<B, 4>, t: Tensor<B, 4>) -> Tensor<B, 1> {
        let y = max_pool2d(x, [3, 3], [2, 2], [1, 1], [1, 1], false);
        let z = avg_pool2d(y, [2, 2], [2, 2], [0, 0], true, false);
        (z * t).sum()
    }
    let xr = Tensor::<Ref, 4>::from_data(x.clone(), &dev).require_grad();
    let loss = net(xr.clone(), Tensor::from_data(target.clone(), &dev));
    let grads = loss.backward();
    let want_x = xr.grad(&grads).unwrap().into_data();
    let want_loss = loss.into_data();

    let xl = Layout::new(&mesh, ["batch", "unsharded", "h", "w"]).unwrap();
    let xd: Tensor<Dist, 4> = distribute(x, &xl).unwrap();
    let xd = xd.require_grad();
    let td: Tensor<Dist, 4> = distribute(target, &xl).unwrap();
    let ((loss, grads), comms) = record_comms(|| {
        let loss = net(xd.clone(), td);
        let grads = loss.backward();
        (loss, grads)
    });
    assert_eq!(comms.count(CollectiveKind::AllGather), 0, "{comms}");
    check_halo_step(&comms, loss, &want_loss, (&xd, &grads, &want_x));
}

/// A spatial-parallel step's checks: halos were exchanged (collective permutes), the loss
/// equals the reference's, and the input's gradient equals the reference's in the input's
/// layout.
fn check_halo_step(
    comms: &CommLog,
    loss: Tensor<Dist, 1>,
    want_loss: &TensorData,
    (x, grads, want_x): (
        &Tensor<Dist, 4>,
        &<Dist as AutodiffBackend>::Gradients,
        &TensorData,
    ),
) {
    assert!(
        comms.count(CollectiveKind::CollectivePermute) > 0,
        "{comms}"
    );
    loss.into_data().assert_approx_eq::<f32>(want_loss, tol());
    let gx = x.grad(grads).unwrap();
    assert_eq!(gx.layout().dims(), x.layout().dims(), "{}", gx.layout());
    gx.into_data().assert_approx_eq::<f32>(want_x, tol());
}
