//! TF-IDF text vectorizer with the semantics of Keras 3
//! `keras.layers.TextVectorization(output_mode="tf_idf", max_tokens=1200)` with the default
//! `standardize="lower_and_strip_punctuation"` and `split="whitespace"`, as used by the
//! TensorFlow DTensor IMDB tutorial.
//!
//! The specification below was fixed by this project from Keras' documentation and source:
//! [`TextVectorization`](https://keras.io/api/layers/preprocessing_layers/text/text_vectorization/),
//! [`StringLookup`](https://keras.io/api/layers/preprocessing_layers/categorical/string_lookup/)
//! and its base class `IndexLookup` (`keras/src/layers/preprocessing/index_lookup.py`:
//! `finalize_state`, `_inverse_document_frequency`, `call`).
//!
//! 1. **Standardize** (`lower_and_strip_punctuation`, i.e. `tf.strings.lower` then
//!    `regex_replace` with Keras' `DEFAULT_STRIP_REGEX`): ASCII letters `A-Z` are lower-cased,
//!    every other byte (non-ASCII UTF-8 included) is unchanged; the 32 ASCII punctuation
//!    characters ``!"#$%&'()*+,-./:;<=>?@[\]^_`{|}~`` are deleted. Standardizing happens before
//!    splitting, so `"don't"` becomes `"dont"`, `"<br />"` becomes `"br"`, and
//!    `"good<br /><br />bad"` becomes the tokens `"goodbr"`, `"br"`, `"bad"`.
//! 2. **Split** (`whitespace`, i.e. `tf.strings.split` without separator): on runs of the six
//!    ASCII whitespace bytes space, `\t`, `\n`, `\x0B` (vertical tab), `\x0C` (form feed) and
//!    `\r` (C `isspace`; note that Rust's `u8::is_ascii_whitespace` leaves out `\x0B`); empty
//!    tokens are dropped. Non-ASCII spaces (e.g. U+00A0) do not split.
//! 3. **Vocabulary** (`IndexLookup.finalize_state`): index 0 is the single out-of-vocabulary
//!    (OOV) bucket, shown as `"[UNK]"`; then the `max_tokens - 1` terms with the highest total
//!    number of occurrences over all fitted documents (not document frequency), ties broken by
//!    the term's bytes in *descending* order (`np.lexsort((tokens, counts))[::-1]`). When the
//!    corpus has fewer distinct terms, the vocabulary is shorter and so is the output
//!    (Keras' default `pad_to_max_tokens=False`): the output width is [`TfIdfVectorizer::vocab_size`],
//!    at most `max_tokens`.
//! 4. **IDF** (`_inverse_document_frequency`): `idf[t] = ln(1 + N / (1 + df[t]))`, evaluated in
//!    `f64` and stored as `f32`, where `N` is the number of fitted documents and `df[t]` the
//!    number of documents containing `t`. The OOV weight (index 0) is the mean of the other
//!    terms' (`f32`) weights; it is accumulated in `f64` and rounded to `f32` (Keras uses a
//!    `float32` `tf.reduce_mean`, which may differ in the last bit).
//! 5. **Transform** (`IndexLookup.call`, `output_mode="tf_idf"`): a document's row holds, for
//!    each vocabulary term, its raw count in the document times its idf, as `f32`
//!    (`count as f32 * idf`); every token outside the vocabulary counts into index 0 (times
//!    the OOV weight). No normalisation.

use std::path::Path;

// foldhash (hashbrown's default hasher) rather than std's SipHash: the vocabulary's lookups are
// short strings hashed once per token, and no input here is adversarial. Counting the 25k
// training reviews took about 13% less time, vectorising the 50k about 25% (NOTES.md, session 73).
use foldhash::{HashMap, HashMapExt};

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::error::DataError;

/// The OOV token shown at index 0 of the vocabulary (Keras' default `oov_token`).
pub const OOV_TOKEN: &str = "[UNK]";

/// `max_tokens` of the TensorFlow DTensor tutorial.
pub const DEFAULT_MAX_TOKENS: usize = 1200;

/// The 32 ASCII punctuation characters deleted by standardization.
pub const PUNCTUATION: &str = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";

/// Format tag written into saved vectorizers.
const FORMAT: &str = "dtensor-imdb/tfidf";
/// Version of the saved format.
const FORMAT_VERSION: u32 = 1;

/// Whether `b` is one of the 32 deleted ASCII punctuation bytes.
#[inline]
fn is_punct(b: u8) -> bool {
    b.is_ascii_punctuation()
}

/// Whether `c` separates tokens: the six ASCII whitespace bytes of C `isspace`.
#[inline]
fn is_split_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\x0B' | '\x0C' | '\r')
}

/// Standardizes `text` like Keras' `lower_and_strip_punctuation`: ASCII `A-Z` lower-cased,
/// the 32 ASCII punctuation characters ([`PUNCTUATION`]) deleted, everything else kept.
pub fn standardize(text: &str) -> String {
    // Byte by byte: an ASCII byte never occurs inside a multi-byte UTF-8 sequence, and
    // `to_ascii_lowercase` and `is_punct` leave the other bytes alone, so every non-ASCII
    // character is copied unchanged. Each byte is written, then kept or overwritten by the next
    // (no branch per byte: 3x faster than pushing `char`s, measured on the 50k reviews).
    let mut out = vec![0u8; text.len()];
    let mut n = 0;
    for &b in text.as_bytes() {
        out[n] = b.to_ascii_lowercase();
        n += usize::from(!is_punct(b));
    }
    out.truncate(n);
    String::from_utf8(out).expect("deleting or lower-casing ASCII bytes keeps UTF-8 valid")
}

/// Splits an already standardized text into its non-empty tokens.
pub(crate) fn split_tokens(standardized: &str) -> impl Iterator<Item = &str> {
    standardized.split(is_split_space).filter(|t| !t.is_empty())
}

/// Standardizes and splits `text` into tokens, exactly as the vectorizer sees it.
///
/// `tokenize("Hello, World!!") == ["hello", "world"]`.
pub fn tokenize(text: &str) -> Vec<String> {
    split_tokens(&standardize(text))
        .map(str::to_owned)
        .collect()
}

/// Per-term statistics while fitting.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct TermCount {
    /// Occurrences over all documents.
    total: u64,
    /// Documents containing the term (the `df` of the idf formula).
    documents: u64,
    /// The number of the last document (counted from 1 in its [`Counter`]) that contained the
    /// term: a document adds to `documents` only on its first occurrence of the term.
    last_document: u64,
}

/// Term statistics of a run of documents, counted one document after another.
pub(crate) struct Counter {
    terms: HashMap<String, TermCount>,
    documents: u64,
}

/// The fitted term statistics: term -> [`TermCount`].
pub(crate) type Counts = HashMap<String, TermCount>;

impl Counter {
    fn new() -> Self {
        Counter {
            terms: HashMap::new(),
            documents: 0,
        }
    }

    /// Adds one document's tokens: one to each token's total, and one to the document
    /// frequency of each distinct term (one hash lookup per token, no sort).
    fn add_document(&mut self, text: &str) {
        self.documents += 1;
        let doc = self.documents;
        let standardized = standardize(text);
        for token in split_tokens(&standardized) {
            match self.terms.get_mut(token) {
                Some(entry) => {
                    entry.total += 1;
                    if entry.last_document != doc {
                        entry.documents += 1;
                        entry.last_document = doc;
                    }
                }
                None => {
                    self.terms.insert(
                        token.to_owned(),
                        TermCount {
                            total: 1,
                            documents: 1,
                            last_document: doc,
                        },
                    );
                }
            }
        }
    }

    /// Merges `other`'s statistics into `self`'s (the larger map absorbs the smaller one). The
    /// two counters saw different documents; no document is added after a merge.
    fn merge(mut self, mut other: Counter) -> Counter {
        if self.terms.len() < other.terms.len() {
            std::mem::swap(&mut self, &mut other);
        }
        for (term, count) in other.terms {
            let entry = self.terms.entry(term).or_insert(TermCount {
                total: 0,
                documents: 0,
                last_document: 0,
            });
            entry.total += count.total;
            entry.documents += count.documents;
        }
        self.documents += other.documents;
        self
    }
}

/// The [`Counts`] of `texts` (one document each), counted in parallel (rayon); the result does
/// not depend on the number of threads.
pub(crate) fn count_terms<S: AsRef<str> + Sync>(texts: &[S]) -> Counts {
    texts
        .par_iter()
        .fold(Counter::new, |mut counter, text| {
            counter.add_document(text.as_ref());
            counter
        })
        .reduce(Counter::new, Counter::merge)
        .terms
}

/// The `keep` most frequent terms as `(term, total count, document frequency)`, in Keras'
/// vocabulary order (`IndexLookup.finalize_state`): total count descending, ties broken by the
/// term's bytes in descending order.
pub(crate) fn ranked_terms(counts: Counts, keep: usize) -> Vec<(String, u64, u64)> {
    let mut terms: Vec<(String, u64, u64)> = counts
        .into_iter()
        .map(|(t, c)| (t, c.total, c.documents))
        .collect();
    // Total count descending, then the term's bytes descending (terms are unique).
    terms.sort_unstable_by(|a, b| {
        b.1.cmp(&a.1)
            .then_with(|| b.0.as_bytes().cmp(a.0.as_bytes()))
    });
    terms.truncate(keep);
    terms
}

/// A dense, row-major `f32` matrix of TF-IDF features.
#[derive(Debug, Clone, PartialEq)]
pub struct TfIdfMatrix {
    /// Number of documents.
    pub rows: usize,
    /// Number of features: the vectorizer's [`TfIdfVectorizer::vocab_size`].
    pub cols: usize,
    /// `rows * cols` values; document `i` is `values[i * cols..(i + 1) * cols]`.
    pub values: Vec<f32>,
}

impl TfIdfMatrix {
    /// The features of document `i`, or `None` when `i >= rows`.
    pub fn row(&self, i: usize) -> Option<&[f32]> {
        (i < self.rows).then(|| &self.values[i * self.cols..(i + 1) * self.cols])
    }

    /// The shape `[rows, cols]`.
    pub fn shape(&self) -> [usize; 2] {
        [self.rows, self.cols]
    }
}

/// The term counts of vectorised documents as compressed sparse rows: what
/// [`TfIdfVectorizer::weigh`] turns into a [`TfIdfMatrix`] (`count as f32 * idf`, bitwise
/// [`TfIdfVectorizer::transform`]'s values). On aclImdb (50k reviews, 94 distinct columns a
/// review) it takes 38 MB against the dense matrix's 240 MB, so a multi-process launch prepares
/// the data once and sends these.
#[derive(Debug, Clone, PartialEq)]
pub struct SparseCounts {
    /// Number of documents.
    pub rows: usize,
    /// Number of features (the vectorizer's [`TfIdfVectorizer::vocab_size`]).
    pub cols: usize,
    /// `rows + 1` offsets into `columns` and `counts`: document `i`'s entries are
    /// `offsets[i]..offsets[i + 1]`.
    pub offsets: Vec<u64>,
    /// The column of each entry, increasing within a document; every column `< cols`.
    pub columns: Vec<u32>,
    /// The number of occurrences (at least 1) of each entry's term in its document.
    pub counts: Vec<u32>,
}

impl SparseCounts {
    /// Checks that these counts fit a vectorizer of `cols` features ([`TfIdfVectorizer::vocab_size`]):
    /// that width, `rows + 1` increasing offsets from 0 to the number of entries, one count per
    /// column, every column `< cols`.
    ///
    /// # Errors
    /// [`DataError::InvalidCounts`] saying which of these fails.
    pub fn check(&self, cols: usize) -> Result<(), DataError> {
        let bad = |reason: String| Err(DataError::InvalidCounts { reason });
        if self.cols != cols {
            return bad(format!("{} columns, the vectorizer has {cols}", self.cols));
        }
        let nnz = self.columns.len();
        if self.counts.len() != nnz
            || self.offsets.len() != self.rows + 1
            || self.offsets.first() != Some(&0)
            || self.offsets.last() != Some(&(nnz as u64))
            || self.offsets.windows(2).any(|w| w[0] > w[1])
        {
            return bad(format!(
                "{} rows with {} offsets for {nnz} columns and {} counts: expected rows + 1 \
                 increasing offsets from 0 to the number of entries",
                self.rows,
                self.offsets.len(),
                self.counts.len()
            ));
        }
        if let Some(c) = self.columns.iter().find(|&&c| c as usize >= cols) {
            return bad(format!("column {c} is out of range (width {cols})"));
        }
        Ok(())
    }

    /// Document `i`'s entries: its columns and their counts (equal lengths).
    ///
    /// # Panics
    /// When `i >= rows` or the offsets do not fit the entries (counts that failed
    /// [`check`](Self::check)).
    pub fn row(&self, i: usize) -> (&[u32], &[u32]) {
        let (a, b) = (self.offsets[i] as usize, self.offsets[i + 1] as usize);
        (&self.columns[a..b], &self.counts[a..b])
    }

    /// The documents `range` as counts of their own (offsets from 0).
    ///
    /// # Panics
    /// When `range` reaches past `rows`.
    pub fn slice(&self, range: std::ops::Range<usize>) -> SparseCounts {
        let (a, b) = (
            self.offsets[range.start] as usize,
            self.offsets[range.end] as usize,
        );
        SparseCounts {
            rows: range.len(),
            cols: self.cols,
            offsets: self.offsets[range.start..=range.end]
                .iter()
                .map(|&o| o - a as u64)
                .collect(),
            columns: self.columns[a..b].to_vec(),
            counts: self.counts[a..b].to_vec(),
        }
    }

    /// The heap bytes these counts hold (offsets, columns and counts).
    pub fn heap_bytes(&self) -> usize {
        self.offsets.len() * 8 + (self.columns.len() + self.counts.len()) * 4
    }
}

/// A fitted TF-IDF vectorizer (Keras `TextVectorization(output_mode="tf_idf")` semantics; see
/// the [module documentation](self) for the exact specification).
///
/// Serializable with serde (and [`save`](Self::save)/[`load`](Self::load) as JSON), so an
/// exported model can vectorize new text at prediction time; deserializing validates the state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "VectorizerRepr", into = "VectorizerRepr")]
pub struct TfIdfVectorizer {
    max_tokens: usize,
    num_documents: u64,
    /// Index 0 is [`OOV_TOKEN`].
    vocabulary: Vec<String>,
    /// Same length as `vocabulary`.
    idf: Vec<f32>,
    /// Term -> column, for all terms but the OOV token.
    index: HashMap<String, usize>,
}

/// The serialized form of [`TfIdfVectorizer`].
#[derive(Serialize, Deserialize)]
struct VectorizerRepr {
    format: String,
    version: u32,
    max_tokens: usize,
    num_documents: u64,
    vocabulary: Vec<String>,
    idf: Vec<f32>,
}

impl From<TfIdfVectorizer> for VectorizerRepr {
    fn from(v: TfIdfVectorizer) -> Self {
        VectorizerRepr {
            format: FORMAT.to_owned(),
            version: FORMAT_VERSION,
            max_tokens: v.max_tokens,
            num_documents: v.num_documents,
            vocabulary: v.vocabulary,
            idf: v.idf,
        }
    }
}

impl TryFrom<VectorizerRepr> for TfIdfVectorizer {
    type Error = DataError;

    fn try_from(r: VectorizerRepr) -> Result<Self, DataError> {
        let bad = |reason: String| Err(DataError::InvalidVectorizer { reason });
        if r.format != FORMAT || r.version != FORMAT_VERSION {
            return bad(format!(
                "format {:?} version {}, expected {FORMAT:?} version {FORMAT_VERSION}",
                r.format, r.version
            ));
        }
        if r.max_tokens < 2 {
            return bad(format!(
                "max_tokens is {}, must be at least 2",
                r.max_tokens
            ));
        }
        if r.vocabulary.first().map(String::as_str) != Some(OOV_TOKEN) {
            return bad(format!("vocabulary must start with {OOV_TOKEN:?}"));
        }
        if r.vocabulary.len() < 2 || r.vocabulary.len() > r.max_tokens {
            return bad(format!(
                "vocabulary has {} entries, expected 2..={}",
                r.vocabulary.len(),
                r.max_tokens
            ));
        }
        if r.idf.len() != r.vocabulary.len() {
            return bad(format!(
                "{} idf weights for {} vocabulary entries",
                r.idf.len(),
                r.vocabulary.len()
            ));
        }
        if let Some(w) = r.idf.iter().find(|w| !w.is_finite() || **w < 0.0) {
            return bad(format!(
                "idf weight {w} is not a finite non-negative number"
            ));
        }
        let index = build_index(&r.vocabulary);
        if index.len() != r.vocabulary.len() - 1 {
            return bad("vocabulary contains duplicate terms".to_owned());
        }
        Ok(TfIdfVectorizer {
            max_tokens: r.max_tokens,
            num_documents: r.num_documents,
            vocabulary: r.vocabulary,
            idf: r.idf,
            index,
        })
    }
}

fn build_index(vocabulary: &[String]) -> HashMap<String, usize> {
    vocabulary
        .iter()
        .enumerate()
        .skip(1)
        .map(|(i, t)| (t.clone(), i))
        .collect()
}

impl TfIdfVectorizer {
    /// Fits the vocabulary and idf weights on `texts` (one document each), like Keras'
    /// `TextVectorization.adapt`. Counting runs in parallel (rayon); the result does not
    /// depend on the number of threads.
    ///
    /// `max_tokens` bounds the vocabulary including the OOV slot (1200 in the tutorial).
    ///
    /// # Errors
    /// [`DataError::InvalidMaxTokens`] when `max_tokens < 2`, [`DataError::EmptyCorpus`] for
    /// zero documents, [`DataError::NoTokens`] when no document contains a token.
    pub fn fit<S: AsRef<str> + Sync>(texts: &[S], max_tokens: usize) -> Result<Self, DataError> {
        check_max_tokens(max_tokens)?;
        if texts.is_empty() {
            return Err(DataError::EmptyCorpus);
        }
        Self::from_counts(count_terms(texts), texts.len() as u64, max_tokens)
    }

    /// [`fit`](Self::fit) for any iterator of documents, sequentially.
    ///
    /// # Errors
    /// As [`fit`](Self::fit).
    pub fn fit_iter<I>(texts: I, max_tokens: usize) -> Result<Self, DataError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        check_max_tokens(max_tokens)?;
        let mut counter = Counter::new();
        for text in texts {
            counter.add_document(text.as_ref());
        }
        if counter.documents == 0 {
            return Err(DataError::EmptyCorpus);
        }
        Self::from_counts(counter.terms, counter.documents, max_tokens)
    }

    fn from_counts(
        counts: Counts,
        num_documents: u64,
        max_tokens: usize,
    ) -> Result<Self, DataError> {
        if counts.is_empty() {
            return Err(DataError::NoTokens {
                documents: num_documents as usize,
            });
        }
        let terms = ranked_terms(counts, max_tokens - 1);

        let n = num_documents as f64;
        let mut vocabulary = Vec::with_capacity(terms.len() + 1);
        let mut idf = Vec::with_capacity(terms.len() + 1);
        vocabulary.push(OOV_TOKEN.to_owned());
        idf.push(0.0f32); // replaced by the mean below
        for (term, _count, df) in terms {
            vocabulary.push(term);
            idf.push((1.0 + n / (1.0 + df as f64)).ln() as f32);
        }
        let mean = idf[1..].iter().map(|&w| f64::from(w)).sum::<f64>() / (idf.len() - 1) as f64;
        idf[0] = mean as f32;
        let index = build_index(&vocabulary);
        Ok(TfIdfVectorizer {
            max_tokens,
            num_documents,
            vocabulary,
            idf,
            index,
        })
    }

    /// Vectorizes `texts` into a dense `[texts.len(), vocab_size()]` row-major matrix
    /// (rows computed in parallel). Row `i` equals [`transform_one`](Self::transform_one) of
    /// `texts[i]`.
    pub fn transform<S: AsRef<str> + Sync>(&self, texts: &[S]) -> TfIdfMatrix {
        let cols = self.vocab_size();
        let mut values = vec![0.0f32; texts.len() * cols];
        values
            .par_chunks_mut(cols)
            .zip(texts.par_iter())
            .for_each(|(row, text)| self.fill_row(text.as_ref(), row));
        TfIdfMatrix {
            rows: texts.len(),
            cols,
            values,
        }
    }

    /// Vectorizes one document: `vocab_size()` values, `count(term) * idf(term)` per
    /// vocabulary term, out-of-vocabulary tokens counted into index 0.
    pub fn transform_one(&self, text: &str) -> Vec<f32> {
        let mut row = vec![0.0f32; self.vocab_size()];
        self.fill_row(text, &mut row);
        row
    }

    /// Adds the occurrences of each column's terms in `text` to `counts` (`vocab_size()`
    /// long; out-of-vocabulary tokens into column 0).
    fn count_tokens(&self, text: &str, counts: &mut [u32]) {
        let standardized = standardize(text);
        for tok in split_tokens(&standardized) {
            let col = self.index.get(tok).copied().unwrap_or(0);
            counts[col] += 1;
        }
    }

    /// `row` has length `vocab_size()` and is zero.
    fn fill_row(&self, text: &str, row: &mut [f32]) {
        let mut counts = vec![0u32; row.len()];
        self.count_tokens(text, &mut counts);
        for ((out, &count), &w) in row.iter_mut().zip(&counts).zip(&self.idf) {
            *out = count as f32 * w;
        }
    }

    /// The term counts of `texts` (one document each, counted in parallel), sparse:
    /// [`weigh`](Self::weigh) of the result equals [`transform`](Self::transform) of `texts`,
    /// bitwise.
    pub fn count_rows<S: AsRef<str> + Sync>(&self, texts: &[S]) -> SparseCounts {
        let cols = self.vocab_size();
        let rows: Vec<Vec<(u32, u32)>> = texts
            .par_iter()
            .map_init(
                || vec![0u32; cols],
                |counts, text| {
                    self.count_tokens(text.as_ref(), counts);
                    let mut entries = Vec::new();
                    for (col, count) in counts.iter_mut().enumerate() {
                        if *count != 0 {
                            entries.push((col as u32, std::mem::take(count)));
                        }
                    }
                    entries
                },
            )
            .collect();
        let nnz = rows.iter().map(Vec::len).sum();
        let mut out = SparseCounts {
            rows: texts.len(),
            cols,
            offsets: Vec::with_capacity(texts.len() + 1),
            columns: Vec::with_capacity(nnz),
            counts: Vec::with_capacity(nnz),
        };
        out.offsets.push(0);
        for entries in rows {
            for (col, count) in entries {
                out.columns.push(col);
                out.counts.push(count);
            }
            out.offsets.push(out.columns.len() as u64);
        }
        out
    }

    /// The TF-IDF matrix of term counts made by [`count_rows`](Self::count_rows) (on this
    /// vectorizer or an equal one): `count as f32 * idf` at each entry, `0.0` elsewhere, as
    /// [`transform`](Self::transform) computes it.
    ///
    /// # Errors
    /// [`DataError::InvalidCounts`] when `counts` do not fit this vectorizer (another width,
    /// offsets out of order or past the entries, a column out of range).
    pub fn weigh(&self, counts: &SparseCounts) -> Result<TfIdfMatrix, DataError> {
        let cols = self.vocab_size();
        counts.check(cols)?;
        let mut values = vec![0.0f32; counts.rows * cols];
        values
            .par_chunks_mut(cols)
            .enumerate()
            .for_each(|(i, row)| self.weigh_row(counts.row(i), row));
        Ok(TfIdfMatrix {
            rows: counts.rows,
            cols,
            values,
        })
    }

    /// Writes one document's TF-IDF values (`count as f32 * idf`, as
    /// [`transform`](Self::transform) computes them) at its entries' columns of `row`; the other
    /// values of `row` are left as they are, so a zeroed row becomes the document's dense row.
    ///
    /// # Panics
    /// When a column is `>= row.len()` or past the vocabulary: the entries must come from
    /// [`SparseCounts::row`] of counts that passed [`SparseCounts::check`] for this vectorizer.
    pub(crate) fn weigh_row(&self, (columns, counts): (&[u32], &[u32]), row: &mut [f32]) {
        for (&col, &count) in columns.iter().zip(counts) {
            row[col as usize] = count as f32 * self.idf[col as usize];
        }
    }

    /// The vocabulary: index 0 is `"[UNK]"`, then terms by decreasing total count.
    /// Its length is [`vocab_size`](Self::vocab_size).
    pub fn vocabulary(&self) -> &[String] {
        &self.vocabulary
    }

    /// The idf weight of each vocabulary entry (index 0: mean of the others).
    pub fn idf(&self) -> &[f32] {
        &self.idf
    }

    /// The `max_tokens` the vectorizer was fitted with (upper bound of `vocab_size`).
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// The output width: vocabulary size including the OOV slot; `max_tokens` unless the
    /// corpus had fewer distinct terms.
    pub fn vocab_size(&self) -> usize {
        self.vocabulary.len()
    }

    /// Number of documents the vectorizer was fitted on (`N` of the idf formula).
    pub fn num_documents(&self) -> u64 {
        self.num_documents
    }

    /// Column of `term` (already standardized), `None` when it is out of vocabulary.
    pub fn term_index(&self, term: &str) -> Option<usize> {
        self.index.get(term).copied()
    }

    /// Writes the vectorizer as JSON to `path` (f32 weights round-trip exactly).
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

fn check_max_tokens(max_tokens: usize) -> Result<(), DataError> {
    if max_tokens < 2 {
        Err(DataError::InvalidMaxTokens { max_tokens })
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strs(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn punctuation_list_is_the_32_ascii_marks() {
        assert_eq!(PUNCTUATION.len(), 32);
        let all: Vec<u8> = (0u8..128).filter(|&b| is_punct(b)).collect();
        assert_eq!(all, PUNCTUATION.as_bytes());
    }

    #[test]
    fn standardize_strips_punctuation_and_lowercases_ascii() {
        assert_eq!(tokenize("Hello, World!!"), strs(&["hello", "world"]));
        assert_eq!(tokenize("don't"), strs(&["dont"]));
        assert_eq!(tokenize("<br />"), strs(&["br"]));
        // Punctuation is deleted before splitting: "Good<br /><br />Bad" -> "goodbr br bad".
        assert_eq!(
            tokenize("Good<br /><br />Bad"),
            strs(&["goodbr", "br", "bad"])
        );
        assert_eq!(tokenize("a-b a - b ..."), strs(&["ab", "a", "b"]));
        assert_eq!(standardize(PUNCTUATION), "");
        // Only ASCII letters change case; non-ASCII bytes are kept as they are.
        assert_eq!(
            tokenize("ÀB ÉCOLE Straße MIXED"),
            strs(&["Àb", "École", "straße", "mixed"])
        );
        assert_eq!(tokenize("ÄÖÜ"), strs(&["ÄÖÜ"]));
    }

    #[test]
    fn split_on_ascii_whitespace_runs() {
        assert_eq!(
            tokenize("  a\tb\nc\x0Bd\x0Ce\rf   g  "),
            strs(&["a", "b", "c", "d", "e", "f", "g"])
        );
        // NO-BREAK SPACE is not ASCII whitespace.
        assert_eq!(tokenize("a\u{A0}b"), strs(&["a\u{A0}b"]));
        assert!(tokenize(" \t\n").is_empty());
        assert!(tokenize("").is_empty());
    }

    /// Three documents; N = 3.
    ///   counts: the 1+1+2 = 4, cat 1+0+1 = 2, sat 1, end 1, dog 1
    ///   df:     the 3, cat 2, sat 1, end 1, dog 1
    /// Order: the (4), cat (2), then the count-1 ties by bytes descending: sat > end > dog.
    const CORPUS: [&str; 3] = ["The cat sat.", "the dog", "THE cat, the end!"];

    #[test]
    fn idf_formula_on_three_documents() {
        let v = TfIdfVectorizer::fit(&CORPUS, 10).unwrap();
        assert_eq!(
            v.vocabulary(),
            strs(&["[UNK]", "the", "cat", "sat", "end", "dog"])
        );
        // Fewer distinct terms than max_tokens - 1: output width = vocabulary size = 6.
        assert_eq!(v.vocab_size(), 6);
        assert_eq!(v.max_tokens(), 10);
        assert_eq!(v.num_documents(), 3);

        // idf = ln(1 + N / (1 + df)), in f64, then rounded to f32:
        //   the: ln(1 + 3/4) = ln 1.75 = 0.5596157879354227 -> f32 0.5596158 (0.55961579084...)
        //   cat: ln(1 + 3/3) = ln 2    = 0.6931471805599453 -> f32 0.6931472 (0.69314718246...)
        //   sat/end/dog: ln(1 + 3/2) = ln 2.5 = 0.9162907318741551 -> f32 0.91629076 (0.91629076004...)
        let the = (1.0f64 + 3.0 / 4.0).ln() as f32;
        let cat = (1.0f64 + 3.0 / 3.0).ln() as f32;
        let one = (1.0f64 + 3.0 / 2.0).ln() as f32;
        assert_eq!(the, 0.559_615_8);
        assert_eq!(cat, std::f32::consts::LN_2); // 0.6931472
        assert_eq!(one, 0.916_290_76);
        // OOV: mean of the five f32 weights,
        //   (0.5596157908 + 0.6931471825 + 3 * 0.9162907600) / 5 = 0.8003270506858826
        //   -> f32 0.80032706.
        let oov = 0.800_327_06_f32;
        assert_eq!(v.idf(), &[oov, the, cat, one, one, one]);

        // "the" twice, "cat" once, two unknown tokens ("unknown", "words") -> index 0 twice.
        let row = v.transform_one("The the CAT unknown words");
        assert_eq!(row, vec![2.0 * oov, 2.0 * the, cat, 0.0, 0.0, 0.0]);
        // Empty documents give a zero row.
        assert_eq!(v.transform_one(""), vec![0.0; 6]);
    }

    #[test]
    fn vocabulary_ranks_by_total_count_not_document_frequency() {
        // x: count 3, df 1;  y: count 2, df 2 -> x first.
        let v = TfIdfVectorizer::fit(&["x x x", "y", "y"], 10).unwrap();
        assert_eq!(v.vocabulary(), strs(&["[UNK]", "x", "y"]));
        // idf x = ln(1 + 3/2) = 0.91629076, y = ln(1 + 3/3) = 0.6931472.
        assert_eq!(v.idf()[1..], [0.916_290_76_f32, std::f32::consts::LN_2]);
    }

    #[test]
    fn ties_are_broken_by_bytes_descending() {
        // "B" standardizes to "b": a, b and c each occur twice, so the order is c > b > a.
        let v = TfIdfVectorizer::fit(&["b a c", "c a B"], 10).unwrap();
        assert_eq!(v.vocabulary(), strs(&["[UNK]", "c", "b", "a"]));
        // Byte order: "é" (C3 A9) > "zz" (7A 7A) > "z" (7A), each occurring once.
        let v = TfIdfVectorizer::fit(&["z é zz"], 10).unwrap();
        assert_eq!(v.vocabulary(), strs(&["[UNK]", "é", "zz", "z"]));
    }

    #[test]
    fn max_tokens_truncates_and_unknowns_use_the_mean_idf() {
        // max_tokens = 3: [UNK] + the 2 most frequent terms of CORPUS (the, cat).
        let v = TfIdfVectorizer::fit(&CORPUS, 3).unwrap();
        assert_eq!(v.vocabulary(), strs(&["[UNK]", "the", "cat"]));
        assert_eq!(v.vocab_size(), 3);
        // OOV idf = mean(0.5596158, 0.6931472) = 0.6263814866542816 -> f32 0.6263815.
        let (the, cat, oov) = (0.559_615_8_f32, std::f32::consts::LN_2, 0.626_381_5_f32);
        assert_eq!(v.idf(), &[oov, the, cat]);
        // "sat" and "dog" fell out of the vocabulary: 2 OOV tokens.
        assert_eq!(v.transform_one("sat dog cat"), vec![2.0 * oov, 0.0, cat]);
        assert_eq!(v.term_index("sat"), None);
        assert_eq!(v.term_index("cat"), Some(2));

        let m = v.transform(&CORPUS);
        assert_eq!(m.shape(), [3, 3]);
        // Document 2: "THE cat, the end!" -> the x2, cat x1, end -> OOV x1.
        assert_eq!(m.row(2).unwrap(), &[oov, 2.0 * the, cat]);
        assert_eq!(m.row(3), None);
        for (i, doc) in CORPUS.iter().enumerate() {
            assert_eq!(m.row(i).unwrap(), v.transform_one(doc).as_slice());
        }
    }

    #[test]
    fn parallel_and_sequential_fit_agree() {
        let docs: Vec<String> = (0..500)
            .map(|i| format!("word{} common, Word{} x{} the THE", i % 37, i % 11, i % 3))
            .collect();
        let a = TfIdfVectorizer::fit(&docs, 20).unwrap();
        let b = TfIdfVectorizer::fit_iter(docs.iter(), 20).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.vocabulary()[1], "the"); // 1000 occurrences
    }

    #[test]
    fn sparse_counts_weigh_to_the_dense_transform_bitwise() {
        let fit = ["the cat sat on the mat", "the dog", "a cat and a dog"];
        // A vocabulary of 4 terms plus the OOV slot: "zebra" and "unknown" count into column 0.
        let v = TfIdfVectorizer::fit(&fit, 5).unwrap();
        let docs = [
            "dog! DOG? dog",
            "",
            "zebra unknown the the cat",
            "the cat sat on the mat",
        ];
        let counts = v.count_rows(&docs);
        assert_eq!((counts.rows, counts.cols), (4, 5));
        assert_eq!(counts.offsets.first(), Some(&0));
        // Hand-counted: "dog" three times; nothing; OOV twice, "the" twice, "cat" once.
        let dog = v.term_index("dog").unwrap() as u32;
        let row = |i: usize| {
            let (a, b) = (counts.offsets[i] as usize, counts.offsets[i + 1] as usize);
            counts.columns[a..b]
                .iter()
                .copied()
                .zip(counts.counts[a..b].iter().copied())
                .collect::<Vec<_>>()
        };
        assert_eq!(row(0), vec![(dog, 3)]);
        assert_eq!(row(1), vec![]);
        let (the, cat) = (v.term_index("the").unwrap(), v.term_index("cat").unwrap());
        let mut want = vec![(0, 2), (the as u32, 2), (cat as u32, 1)];
        want.sort_unstable();
        assert_eq!(row(2), want);
        let bits = |m: &TfIdfMatrix| m.values.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let (weighed, dense) = (v.weigh(&counts).unwrap(), v.transform(&docs));
        assert_eq!(weighed.shape(), dense.shape());
        assert_eq!(bits(&weighed), bits(&dense));
    }

    #[test]
    fn counts_that_do_not_fit_the_vectorizer_are_typed_errors() {
        let v = TfIdfVectorizer::fit(&["the cat sat", "the dog"], 5).unwrap();
        let good = v.count_rows(&["the cat", "dog dog"]);
        assert!(v.weigh(&good).is_ok());
        let wider = TfIdfVectorizer::fit(&["a b c d e f g"], 8).unwrap();
        let broken = [
            // Another vectorizer's width.
            wider.count_rows(&["a b"]),
            SparseCounts {
                offsets: vec![0, 2, 1],
                ..good.clone()
            },
            SparseCounts {
                offsets: vec![0, 1],
                ..good.clone()
            },
            SparseCounts {
                counts: good.counts[1..].to_vec(),
                ..good.clone()
            },
            SparseCounts {
                columns: good.columns.iter().map(|_| 5).collect(),
                ..good.clone()
            },
        ];
        for counts in &broken {
            assert!(
                matches!(v.weigh(counts), Err(DataError::InvalidCounts { .. })),
                "{counts:?}"
            );
        }
    }

    #[test]
    fn bad_inputs_are_typed_errors() {
        assert!(matches!(
            TfIdfVectorizer::fit(&["a"], 1),
            Err(DataError::InvalidMaxTokens { max_tokens: 1 })
        ));
        assert!(matches!(
            TfIdfVectorizer::fit(&["a"], 0),
            Err(DataError::InvalidMaxTokens { .. })
        ));
        let none: [&str; 0] = [];
        assert!(matches!(
            TfIdfVectorizer::fit(&none, 5),
            Err(DataError::EmptyCorpus)
        ));
        assert!(matches!(
            TfIdfVectorizer::fit_iter(none, 5),
            Err(DataError::EmptyCorpus)
        ));
        assert!(matches!(
            TfIdfVectorizer::fit(&["...", " ", ""], 5),
            Err(DataError::NoTokens { documents: 3 })
        ));
        // max_tokens = 2: one term.
        let v = TfIdfVectorizer::fit(&CORPUS, 2).unwrap();
        assert_eq!(v.vocabulary(), strs(&["[UNK]", "the"]));
        assert_eq!(v.idf()[0], v.idf()[1]);
    }

    #[test]
    fn json_round_trip_and_validation() {
        let v = TfIdfVectorizer::fit(&CORPUS, 5).unwrap();
        let dir = super::super::imdb::tests::TempDir::new("tfidf-json");
        let path = dir.0.join("tfidf.json");
        v.save(&path).unwrap();
        let w = TfIdfVectorizer::load(&path).unwrap();
        assert_eq!(v, w);
        assert_eq!(
            v.transform_one("the cat and the hat"),
            w.transform_one("the cat and the hat")
        );

        // Inconsistent state is rejected.
        let mut json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        json["idf"].as_array_mut().unwrap().pop();
        std::fs::write(&path, json.to_string()).unwrap();
        let err = TfIdfVectorizer::load(&path).unwrap_err();
        assert!(matches!(err, DataError::Json { .. }), "{err}");
        assert!(err.to_string().contains("idf weights"), "{err}");

        std::fs::write(&path, "not json").unwrap();
        assert!(matches!(
            TfIdfVectorizer::load(&path),
            Err(DataError::Json { .. })
        ));
        assert!(matches!(
            TfIdfVectorizer::load(&dir.0.join("missing.json")),
            Err(DataError::Io { .. })
        ));
    }

    #[test]
    fn real_train_split_vocabulary() {
        let Some(path) = super::super::imdb::tests::real_data_path() else {
            return;
        };
        let data = super::super::imdb::load(&path).unwrap();
        let texts: Vec<&str> = data.train.iter().map(|r| r.text.as_str()).collect();
        let start = std::time::Instant::now();
        let v = TfIdfVectorizer::fit(&texts, DEFAULT_MAX_TOKENS).unwrap();
        let fit = start.elapsed();
        let m = v.transform(&texts);
        let total = start.elapsed();
        eprintln!(
            "fit {:.2?}, fit+transform {:.2?} ({} docs x {} features)",
            fit, total, m.rows, m.cols
        );
        eprintln!("first 20 vocabulary terms: {:?}", &v.vocabulary()[..20]);
        eprintln!("their idf: {:?}", &v.idf()[..20]);
        assert_eq!(v.vocab_size(), 1200);
        assert_eq!(m.shape(), [25_000, 1200]);
        assert_eq!(v.vocabulary()[0], "[UNK]");
        assert_eq!(&v.vocabulary()[1..4], &["the", "and", "a"]);
        assert!(m.values.iter().all(|x| x.is_finite() && *x >= 0.0));
        // Every review has tokens, most of them in the vocabulary.
        assert!((0..m.rows).all(|i| m.row(i).unwrap().iter().any(|&x| x > 0.0)));
    }
}
