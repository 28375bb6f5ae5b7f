//! Integer-sequence text vectorizer with the semantics of Keras 3
//! `keras.layers.TextVectorization(output_mode="int", max_tokens=20000,
//! output_sequence_length=200)` (defaults `standardize="lower_and_strip_punctuation"`,
//! `split="whitespace"`), as used by the Keras example "Text classification with Transformer"
//! and by `imdb_transformer`.
//!
//! Standardization, splitting and the ranking of terms are the TF-IDF vectorizer's
//! ([`super::tfidf`], whose module docs give the rules and their Keras sources); what differs is
//! the vocabulary's head and the output (Keras' `IndexLookup` with `mask_token=""` and one OOV
//! index, `call` with `output_mode="int"`):
//!
//! 1. **Vocabulary**: index 0 is the padding (mask) token `""`, index 1 the OOV bucket
//!    `"[UNK]"`, then the `max_tokens - 2` terms with the highest total number of occurrences
//!    (ties: the term's bytes in descending order). With fewer distinct terms the vocabulary is
//!    shorter ([`SequenceVectorizer::vocab_size`]).
//! 2. **Transform**: each token becomes its index (1 when out of vocabulary); the sequence is
//!    cut after its first `output_sequence_length` tokens and padded with 0 at the end up to
//!    that length (`RaggedTensor.to_tensor(default_value=0, shape=[None, length])`).
//!    [`Truncation::Pre`] instead keeps the *last* tokens and pads at the start, as
//!    `keras.utils.pad_sequences` does by default (`padding="pre"`, `truncating="pre"`), which
//!    the Keras transformer example applies to `keras.datasets.imdb`'s sequences.

use std::path::Path;

// foldhash, as the TF-IDF vectorizer (see there).
use foldhash::HashMap;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::error::DataError;
use super::tfidf::{OOV_TOKEN, count_terms, ranked_terms, split_tokens, standardize};

/// The padding (mask) token at index 0 of the vocabulary (Keras' `mask_token` in int mode).
pub const PAD_TOKEN: &str = "";

/// Index of the padding token.
pub const PAD_INDEX: u32 = 0;

/// Index of the OOV bucket.
pub const OOV_INDEX: u32 = 1;

/// `max_tokens` of the Keras transformer example (padding and OOV included).
pub const DEFAULT_MAX_TOKENS: usize = 20_000;

/// `output_sequence_length` of the Keras transformer example.
pub const DEFAULT_SEQUENCE_LENGTH: usize = 200;

/// Format tag written into saved vectorizers.
const FORMAT: &str = "dtensor-imdb/sequence";
/// Version of the saved format.
const FORMAT_VERSION: u32 = 1;

/// Which end of a long document is kept, and where the padding goes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Truncation {
    /// The first tokens, padding at the end (`TextVectorization`'s `output_sequence_length`).
    #[default]
    Post,
    /// The last tokens, padding at the start (`pad_sequences`' defaults).
    Pre,
}

/// Token ids of a batch of documents: `[rows, sequence_length]`, row-major, padded with
/// [`PAD_INDEX`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SequenceMatrix {
    rows: usize,
    cols: usize,
    ids: Vec<u32>,
}

impl SequenceMatrix {
    /// `[rows, sequence_length]`.
    pub fn shape(&self) -> [usize; 2] {
        [self.rows, self.cols]
    }
    /// The ids of row `i`, `None` past the end.
    pub fn row(&self, i: usize) -> Option<&[u32]> {
        (i < self.rows).then(|| &self.ids[i * self.cols..(i + 1) * self.cols])
    }
    /// Every id, row-major.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }
}

/// A fitted integer-sequence vectorizer (see the module docs for the rules).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "Repr", into = "Repr")]
pub struct SequenceVectorizer {
    max_tokens: usize,
    sequence_length: usize,
    /// Index 0 is [`PAD_TOKEN`], 1 is [`OOV_TOKEN`].
    vocabulary: Vec<String>,
    /// Term -> index, for the terms after the two special entries.
    index: HashMap<String, u32>,
    truncation: Truncation,
}

/// The serialized form of [`SequenceVectorizer`].
#[derive(Serialize, Deserialize)]
struct Repr {
    format: String,
    version: u32,
    max_tokens: usize,
    sequence_length: usize,
    vocabulary: Vec<String>,
    /// Absent in files written before the option existed: [`Truncation::Post`].
    #[serde(default)]
    truncation: Truncation,
}

impl From<SequenceVectorizer> for Repr {
    fn from(v: SequenceVectorizer) -> Self {
        Repr {
            format: FORMAT.to_owned(),
            version: FORMAT_VERSION,
            max_tokens: v.max_tokens,
            sequence_length: v.sequence_length,
            vocabulary: v.vocabulary,
            truncation: v.truncation,
        }
    }
}

impl TryFrom<Repr> for SequenceVectorizer {
    type Error = DataError;

    fn try_from(r: Repr) -> Result<Self, DataError> {
        let bad = |reason: String| Err(DataError::InvalidVectorizer { reason });
        if r.format != FORMAT || r.version != FORMAT_VERSION {
            return bad(format!(
                "format {:?} version {}, expected {FORMAT:?} version {FORMAT_VERSION}",
                r.format, r.version
            ));
        }
        check(r.max_tokens, r.sequence_length)?;
        if r.vocabulary.get(..2) != Some(&[PAD_TOKEN.to_owned(), OOV_TOKEN.to_owned()][..]) {
            return bad(format!(
                "vocabulary must start with {PAD_TOKEN:?}, {OOV_TOKEN:?}"
            ));
        }
        if r.vocabulary.len() < 3 || r.vocabulary.len() > r.max_tokens {
            return bad(format!(
                "vocabulary has {} entries, expected 3..={}",
                r.vocabulary.len(),
                r.max_tokens
            ));
        }
        let index = build_index(&r.vocabulary);
        if index.len() != r.vocabulary.len() - 2 {
            return bad("vocabulary contains duplicate terms".to_owned());
        }
        Ok(SequenceVectorizer {
            max_tokens: r.max_tokens,
            sequence_length: r.sequence_length,
            vocabulary: r.vocabulary,
            index,
            truncation: r.truncation,
        })
    }
}

fn build_index(vocabulary: &[String]) -> HashMap<String, u32> {
    vocabulary
        .iter()
        .enumerate()
        .skip(2)
        .map(|(i, t)| (t.clone(), i as u32))
        .collect()
}

fn check(max_tokens: usize, sequence_length: usize) -> Result<(), DataError> {
    if max_tokens < 3 || max_tokens > u32::MAX as usize {
        return Err(DataError::InvalidSequenceTokens { max_tokens });
    }
    if sequence_length == 0 {
        return Err(DataError::InvalidSequenceLength);
    }
    Ok(())
}

impl SequenceVectorizer {
    /// Fits the vocabulary on `texts` (one document each), like Keras' `adapt`.
    ///
    /// `max_tokens` bounds the vocabulary including the padding and OOV entries (20000 in the
    /// Keras example); `sequence_length` is the output length (200 there).
    ///
    /// # Errors
    /// [`DataError::InvalidSequenceTokens`] when `max_tokens < 3`,
    /// [`DataError::InvalidSequenceLength`] for a length of 0, [`DataError::EmptyCorpus`] for
    /// zero documents, [`DataError::NoTokens`] when no document contains a token.
    pub fn fit<S: AsRef<str> + Sync>(
        texts: &[S],
        max_tokens: usize,
        sequence_length: usize,
    ) -> Result<Self, DataError> {
        check(max_tokens, sequence_length)?;
        if texts.is_empty() {
            return Err(DataError::EmptyCorpus);
        }
        let counts = count_terms(texts);
        if counts.is_empty() {
            return Err(DataError::NoTokens {
                documents: texts.len(),
            });
        }
        let mut vocabulary = vec![PAD_TOKEN.to_owned(), OOV_TOKEN.to_owned()];
        vocabulary.extend(
            ranked_terms(counts, max_tokens - 2)
                .into_iter()
                .map(|(t, _, _)| t),
        );
        let index = build_index(&vocabulary);
        Ok(SequenceVectorizer {
            max_tokens,
            sequence_length,
            vocabulary,
            index,
            truncation: Truncation::Post,
        })
    }

    /// The same vocabulary, cutting and padding documents as `truncation` says.
    pub fn with_truncation(mut self, truncation: Truncation) -> Self {
        self.truncation = truncation;
        self
    }

    /// Which end of a long document [`transform`](Self::transform) keeps.
    pub fn truncation(&self) -> Truncation {
        self.truncation
    }

    /// The token ids of `texts`: `[texts.len(), sequence_length]` (rows in parallel); row `i`
    /// equals [`transform_one`](Self::transform_one) of `texts[i]`.
    pub fn transform<S: AsRef<str> + Sync>(&self, texts: &[S]) -> SequenceMatrix {
        let cols = self.sequence_length;
        let mut ids = vec![PAD_INDEX; texts.len() * cols];
        ids.par_chunks_mut(cols)
            .zip(texts.par_iter())
            .for_each(|(row, text)| self.fill_row(text.as_ref(), row));
        SequenceMatrix {
            rows: texts.len(),
            cols,
            ids,
        }
    }

    /// The token ids of one document: its first `sequence_length` tokens' indices
    /// ([`OOV_INDEX`] out of vocabulary), padded with [`PAD_INDEX`] at the end; under
    /// [`Truncation::Pre`] its last ones, padded at the start.
    pub fn transform_one(&self, text: &str) -> Vec<u32> {
        let mut row = vec![PAD_INDEX; self.sequence_length];
        self.fill_row(text, &mut row);
        row
    }

    fn fill_row(&self, text: &str, row: &mut [u32]) {
        let standardized = standardize(text);
        let id = |tok: &str| self.index.get(tok).copied().unwrap_or(OOV_INDEX);
        match self.truncation {
            Truncation::Post => {
                for (out, tok) in row.iter_mut().zip(split_tokens(&standardized)) {
                    *out = id(tok);
                }
            }
            Truncation::Pre => {
                let toks: Vec<&str> = split_tokens(&standardized).collect();
                let n = toks.len().min(row.len());
                let start = row.len() - n;
                for (out, tok) in row[start..].iter_mut().zip(&toks[toks.len() - n..]) {
                    *out = id(tok);
                }
            }
        }
    }

    /// The vocabulary: `""`, `"[UNK]"`, then terms by decreasing total count.
    pub fn vocabulary(&self) -> &[String] {
        &self.vocabulary
    }

    /// Number of token ids (the embedding's rows): `max_tokens` unless the corpus had fewer
    /// distinct terms.
    pub fn vocab_size(&self) -> usize {
        self.vocabulary.len()
    }

    /// The output length of every sequence.
    pub fn sequence_length(&self) -> usize {
        self.sequence_length
    }

    /// The `max_tokens` the vectorizer was fitted with.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// Writes the vectorizer as JSON to `path`.
    ///
    /// # Errors
    /// [`DataError::Io`] or [`DataError::Json`].
    pub fn save(&self, path: &Path) -> Result<(), DataError> {
        super::json::save(self, path)
    }

    /// Reads a vectorizer written by [`save`](Self::save), validating it.
    ///
    /// # Errors
    /// [`DataError::Io`], or [`DataError::Json`] for malformed or inconsistent content.
    pub fn load(path: &Path) -> Result<Self, DataError> {
        super::json::load(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hand-computed: counts the=4, cat=2, sat=2, on=1, mat=1; ties by bytes descending.
    #[test]
    fn vocabulary_and_ids_as_keras_int_mode() {
        let texts = ["The cat sat on the mat.", "The CAT sat; the end!"];
        let v = SequenceVectorizer::fit(&texts, 5, 4).unwrap();
        // the(4); then count 2: sat, cat (bytes descending); room for 3 terms.
        assert_eq!(v.vocabulary(), ["", "[UNK]", "the", "sat", "cat"]);
        assert_eq!(v.vocab_size(), 5);
        // Cut after 4 tokens; "on" is out of vocabulary.
        assert_eq!(v.transform_one("the cat sat on the mat"), [2, 4, 3, 1]);
        // Padded at the end.
        assert_eq!(v.transform_one("Cat!"), [4, 0, 0, 0]);
        assert_eq!(v.transform_one(""), [0, 0, 0, 0]);
        let m = v.transform(&["the end", "mat cat"]);
        assert_eq!(m.shape(), [2, 4]);
        assert_eq!(m.row(0), Some(&[2, 1, 0, 0][..]));
        assert_eq!(m.row(1), Some(&[1, 4, 0, 0][..]));
        assert_eq!(m.row(2), None);
        // pad_sequences' defaults: the last 4 tokens, padded at the start.
        let p = v.clone().with_truncation(Truncation::Pre);
        assert_eq!(p.transform_one("the cat sat on the mat"), [3, 1, 2, 1]);
        assert_eq!(p.transform_one("Cat!"), [0, 0, 0, 4]);
        assert_eq!(p.transform(&["the end"]).row(0), Some(&[0, 0, 2, 1][..]));
    }

    #[test]
    fn bad_settings_are_typed_errors() {
        assert!(matches!(
            SequenceVectorizer::fit(&["a b"], 2, 4),
            Err(DataError::InvalidSequenceTokens { max_tokens: 2 })
        ));
        assert!(matches!(
            SequenceVectorizer::fit(&["a b"], 10, 0),
            Err(DataError::InvalidSequenceLength)
        ));
        assert!(matches!(
            SequenceVectorizer::fit::<&str>(&[], 10, 4),
            Err(DataError::EmptyCorpus)
        ));
        assert!(matches!(
            SequenceVectorizer::fit(&["!!", " "], 10, 4),
            Err(DataError::NoTokens { documents: 2 })
        ));
    }

    #[test]
    fn save_and_load_round_trip_and_validate() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.json");
        let v = SequenceVectorizer::fit(&["b a a c", "a c"], 10, 3).unwrap();
        v.save(&path).unwrap();
        assert_eq!(SequenceVectorizer::load(&path).unwrap(), v);
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replace("\"[UNK]\"", "\"a2\"")).unwrap();
        let err = SequenceVectorizer::load(&path).unwrap_err().to_string();
        assert!(err.contains("must start with"), "{err}");
    }
}
