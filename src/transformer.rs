//! The text classifier of the Keras example "Text classification with Transformer", from Burn's
//! own modules only: token [`Embedding`] plus a learned position [`Embedding`], a
//! [`TransformerEncoder`] (Burn's `MultiHeadAttention`, `PositionWiseFeedForward`, `LayerNorm`,
//! dropout; post-norm as Keras' block), mean pooling over the sequence and a [`Linear`] head to
//! 2 classes. Nothing here knows about meshes: `imdb_transformer`'s parallel modes come from a
//! mesh and a layout map over these parameter paths (`tokens.weight`, `positions.weight`,
//! `encoder.layers.0.mha.query.weight`, `encoder.layers.0.pwff.linear_inner.weight`,
//! `encoder.layers.0.norm_1.gamma`, `head.weight`, ...).
//!
//! Differences from the Keras example, kept on purpose: Burn's attention splits `d_model` over
//! the heads (`d_k = d_model / heads`; Keras' `key_dim=32` gives each head 32); the head is one
//! `Linear` (Keras adds `Dense(20, relu)` and two dropouts before it); LayerNorm's epsilon, the
//! feed-forward activation (ReLU) and the initializers follow Keras: embeddings uniform in
//! [-0.05, 0.05] (Keras' `Embedding` default, where Burn's is N(0, 1)), linear weights Glorot
//! uniform (Keras' `Dense` default; Burn's biases are drawn the same way where Keras' start at
//! zero).

use burn::config::Config;
use burn::module::{Initializer, Module};
use burn::nn::activation::ActivationConfig;
use burn::nn::transformer::{
    TransformerEncoder, TransformerEncoderConfig, TransformerEncoderInput,
};
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};

/// Sizes of [`TextTransformer`]; the defaults are the Keras example's.
#[derive(Config, Debug)]
pub struct TextTransformerConfig {
    /// Number of token ids (the vectorizer's vocabulary, padding and OOV included).
    pub vocab_size: usize,
    /// Sequence length (the vectorizer's `output_sequence_length`).
    #[config(default = 200)]
    pub seq_len: usize,
    /// Embedding and model width (`embed_dim`).
    #[config(default = 32)]
    pub d_model: usize,
    /// Attention heads; must divide `d_model`.
    #[config(default = 2)]
    pub heads: usize,
    /// Feed-forward width (`ff_dim`).
    #[config(default = 32)]
    pub ff: usize,
    /// Encoder blocks.
    #[config(default = 1)]
    pub layers: usize,
    /// Dropout rate of the blocks.
    #[config(default = 0.1)]
    pub dropout: f64,
    /// Output classes.
    #[config(default = 2)]
    pub classes: usize,
}

/// Token and position embeddings, a transformer encoder, mean pooling and a linear head.
///
/// Input: token ids `[batch, seq_len]` (global shape). Output: logits `[batch, classes]`.
#[derive(Module, Debug)]
pub struct TextTransformer<B: Backend> {
    /// Token embedding, `[vocab_size, d_model]`.
    pub tokens: Embedding<B>,
    /// Learned position embedding, `[seq_len, d_model]`.
    pub positions: Embedding<B>,
    /// The encoder blocks.
    pub encoder: TransformerEncoder<B>,
    /// The classifier, `d_model -> classes`.
    pub head: Linear<B>,
}

impl TextTransformerConfig {
    /// The model, its parameters created lazily by Burn's initializers (a layout map's `apply`
    /// then materialises each directly in its layout).
    ///
    /// # Panics
    /// When `heads` does not divide `d_model` (Burn's `MultiHeadAttention`); `imdb_transformer`
    /// checks its flags before.
    pub fn init<B: Backend>(&self, device: &B::Device) -> TextTransformer<B> {
        // Keras' defaults: `Embedding(embeddings_initializer="uniform")` is U(-0.05, 0.05),
        // `Dense(kernel_initializer="glorot_uniform")`.
        let embedding = Initializer::Uniform {
            min: -0.05,
            max: 0.05,
        };
        let glorot = Initializer::XavierUniform { gain: 1.0 };
        let encoder = TransformerEncoderConfig::new(self.d_model, self.ff, self.heads, self.layers)
            .with_dropout(self.dropout)
            .with_activation(ActivationConfig::Relu)
            .with_layer_norm_eps(1e-6)
            .with_initializer(glorot.clone())
            .init(device);
        TextTransformer {
            tokens: EmbeddingConfig::new(self.vocab_size, self.d_model)
                .with_initializer(embedding.clone())
                .init(device),
            positions: EmbeddingConfig::new(self.seq_len, self.d_model)
                .with_initializer(embedding)
                .init(device),
            encoder,
            head: LinearConfig::new(self.d_model, self.classes)
                .with_initializer(glorot)
                .init(device),
        }
    }
}

impl<B: Backend> TextTransformer<B> {
    /// Logits `[batch, classes]` of token ids `[batch, seq]` (`seq` at most the position
    /// embedding's length).
    pub fn forward(&self, ids: Tensor<B, 2, Int>) -> Tensor<B, 2> {
        let [batch, seq] = ids.dims();
        let device = ids.device();
        let positions = Tensor::<B, 1, Int>::arange(0..seq as i64, &device).reshape([1, seq]);
        let x = self.tokens.forward(ids) + self.positions.forward(positions);
        let x = self.encoder.forward(TransformerEncoderInput::new(x));
        let pooled = x.mean_dim(1).reshape([batch, self.head.weight.dims()[0]]);
        self.head.forward(pooled)
    }
}
