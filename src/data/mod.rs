//! Data pipeline of the DTensor IMDB examples: the aclImdb loader and the Keras-compatible
//! TF-IDF (MLP) and integer-sequence (transformer) vectorizers.

/// Typed errors of the data pipeline.
pub mod error;
/// Loading (and locating/downloading) the labelled IMDB reviews.
pub mod imdb;
mod json;
/// Integer-sequence vectorizer with Keras `TextVectorization(output_mode="int")` semantics.
pub mod sequence;
/// TF-IDF vectorizer with Keras `TextVectorization(output_mode="tf_idf")` semantics.
pub mod tfidf;

pub use error::DataError;
