//! The TensorFlow DTensor tutorial ("Distributed training with DTensors": IMDB sentiment with an
//! MLP on 8 devices in three parallel modes) on [`burn_dtensor`]: the data pipeline
//! ([`data`]: aclImdb loader, Keras-compatible TF-IDF), batching ([`batch`]), the model
//! ([`model`]), the training driver ([`train`]) and the same training with burn-train's Learner
//! ([`learner`]). The binaries are `examples/imdb_mlp.rs`, `examples/imdb_learner.rs` and
//! `examples/imdb_predict.rs`. Beyond the tutorial: the Keras transformer text classifier
//! ([`transformer`], on [`data::sequence`]'s token ids), trained in five parallel modes by
//! [`transformer_train`] (`examples/imdb_transformer.rs`). Under `mpirun`, rank 0 alone prepares
//! the data and broadcasts it ([`shared_data`]).

#![warn(missing_docs)]

pub mod batch;
pub mod checkpoint;
pub mod cli;
pub mod console;
pub mod data;
pub mod launch_cli;
pub mod learner;
pub mod learner_cli;
pub mod memory;
pub mod model;
pub mod plot;
pub mod shared_data;
pub mod train;
pub mod transformer;
pub mod transformer_train;
