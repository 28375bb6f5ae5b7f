//! Data pipeline of the DTensor IMDB examples: the aclImdb loader and the Keras-compatible
//! TF-IDF (MLP) and integer-sequence (transformer) vectorizers.

// Each module's docs are its own `//!` lines: an outer `///` here would make rustdoc resolve
// their links from this module instead.
pub mod error;
pub mod imdb;
mod json;
pub mod sequence;
pub mod tfidf;

pub use error::DataError;
