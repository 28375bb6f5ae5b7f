//! The TensorFlow DTensor tutorial's MLP, from ordinary `burn::nn` modules and named as in the
//! tutorial: `dense1: Linear(1200 -> 48)`, relu, `bn: BatchNorm(48)`, `dense2: Linear(48 -> 2)`.
//! Nothing here knows about meshes: the parallelism comes from the layout map alone.

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{BatchNorm, BatchNormConfig, Linear, LinearConfig};
use burn::tensor::activation::relu;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

/// Width of the TF-IDF input (Keras `max_tokens`).
pub const INPUT_DIM: usize = 1200;
/// Hidden width.
pub const HIDDEN_DIM: usize = 48;
/// Classes (neg, pos).
pub const CLASSES: usize = 2;

/// The IMDB MLP. Shapes are global: input `[batch, 1200]`, logits `[batch, 2]`.
#[derive(Module, Debug)]
pub struct ImdbMlp<B: Backend> {
    /// `Linear(1200 -> 48)`; weight `[1200, 48]` (Burn stores `[d_input, d_output]`).
    pub dense1: Linear<B>,
    /// `BatchNorm` over the 48 hidden features.
    pub bn: BatchNorm<B>,
    /// `Linear(48 -> 2)`; weight `[48, 2]`.
    pub dense2: Linear<B>,
}

/// How the per-example cross-entropy is reduced over a batch.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum LossReduction {
    /// Sum over the batch (the TensorFlow tutorial's `reduce_sum`).
    Sum,
    /// Mean over the batch.
    Mean,
}

impl<B: Backend> ImdbMlp<B> {
    /// A freshly initialised model (Burn's default initialisers; lazy until first use).
    pub fn new(device: &B::Device) -> Self {
        Self::with_dims(INPUT_DIM, HIDDEN_DIM, CLASSES, device)
    }

    /// The same architecture with other widths (the larger MLP of the benches).
    pub fn with_dims(input: usize, hidden: usize, classes: usize, device: &B::Device) -> Self {
        Self {
            dense1: LinearConfig::new(input, hidden).init(device),
            bn: BatchNormConfig::new(hidden).init(device),
            dense2: LinearConfig::new(hidden, classes).init(device),
        }
    }

    /// Logits `[batch, 2]` for TF-IDF rows `[batch, 1200]`.
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let h = relu(self.dense1.forward(x));
        let h = self.bn.forward(h);
        self.dense2.forward(h)
    }

    /// Softmax cross-entropy of `logits` against `labels` (`[batch]`, 0 = neg, 1 = pos).
    pub fn loss(
        &self,
        logits: Tensor<B, 2>,
        labels: Tensor<B, 1, Int>,
        reduction: LossReduction,
    ) -> Tensor<B, 1> {
        let n = logits.dims()[0];
        let mean = CrossEntropyLossConfig::new()
            .init(&logits.device())
            .forward(logits, labels);
        match reduction {
            LossReduction::Mean => mean,
            LossReduction::Sum => mean.mul_scalar(n as f32),
        }
    }
}

/// Number of correct predictions (argmax of the logits equals the label).
pub fn correct<B: Backend>(logits: Tensor<B, 2>, labels: Tensor<B, 1, Int>) -> usize {
    let pred = logits.argmax(1).squeeze_dim::<1>(1);
    pred.equal(labels)
        .int()
        .sum()
        .into_scalar()
        .to_string()
        .parse::<f64>()
        .unwrap_or(0.0) as usize
}

/// The values of every float parameter of `module` (BatchNorm's running statistics included), in
/// visit order (lazy parameters are materialised, in that order). With
/// [`with_param_values`] this moves weights between backends: the bare backend's model of
/// `--mode single` starts from the weights the distributed modes draw.
pub fn param_values<B: Backend, M: Module<B>>(module: &M) -> Vec<TensorData> {
    struct Read(Vec<TensorData>);
    impl<B: Backend> ModuleVisitor<B> for Read {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0.push(param.val().into_data());
        }
    }
    let mut r = Read(Vec::new());
    module.visit(&mut r);
    r.0
}

/// `module` with its float parameters replaced by `values` in visit order (as
/// [`param_values`] reads them), keeping ids and gradient requirements.
///
/// # Panics
/// When `values` does not have one tensor per float parameter of the same shape (a model of
/// another architecture: an internal bug).
pub fn with_param_values<B: Backend, M: Module<B>>(module: M, values: Vec<TensorData>) -> M {
    struct Write(std::vec::IntoIter<TensorData>);
    impl<B: Backend> ModuleMapper<B> for Write {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            let v = self.0.next().expect("one value per float parameter");
            param.map(|t| {
                assert_eq!(t.shape().to_vec(), v.shape.to_vec(), "parameter shape");
                Tensor::from_data(v.convert_dtype(t.dtype()), &t.device())
                    .set_require_grad(t.is_require_grad())
            })
        }
    }
    let mut w = Write(values.into_iter());
    let m = module.map(&mut w);
    assert!(w.0.next().is_none(), "more values than float parameters");
    m
}
