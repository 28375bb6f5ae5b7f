//! Batching: the vectorised reviews as a `burn::data` dataset, a seeded per-epoch order, and
//! global batches cut under a drop policy.

use std::ops::Range;
use std::sync::Arc;

use burn::data::dataset::Dataset;
use rand::SeedableRng;
use rand::seq::SliceRandom;

use crate::data::error::DataError;
use crate::data::tfidf::{SparseCounts, TfIdfVectorizer};

/// What to do with a batch the mesh's batch axis cannot shard evenly.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum DropPolicy {
    /// Keep every batch; a batch not divisible by the batch axis is sharded unevenly (the first
    /// shards one row larger). Results are exact either way.
    Uneven,
    /// Drop the last batch when it is smaller than the batch size.
    DropLast,
    /// Refuse a batch size the batch axis does not divide, and drop a short last batch.
    Strict,
}

/// The vectorised reviews: each review's TF-IDF row `[width]` (f32) and its label.
///
/// The rows are held as their term counts ([`SparseCounts`], compressed sparse rows) and
/// weighed by the vectorizer's idf when a batch or an example is built (`count as f32 * idf`, as
/// [`TfIdfVectorizer::transform`] computes them, so a batch is bitwise the dense matrix's rows).
/// On aclImdb (94 distinct terms a review of the 1200) both splits take 38 MB this way against
/// 240 MB dense, and every rank of an SPMD launch holds them (NOTES.md, session 75).
#[derive(Debug, Clone)]
pub struct VectorizedSet {
    vectorizer: Arc<TfIdfVectorizer>,
    counts: SparseCounts,
    labels: Vec<u8>,
}

/// One example of a [`VectorizedSet`].
#[derive(Debug, Clone)]
pub struct Example {
    /// TF-IDF row `[width]`.
    pub features: Vec<f32>,
    /// Label.
    pub label: u8,
}

impl Dataset<Example> for VectorizedSet {
    fn get(&self, index: usize) -> Option<Example> {
        (index < self.len()).then(|| {
            let mut features = vec![0.0; self.width()];
            self.vectorizer
                .weigh_row(self.counts.row(index), &mut features);
            Example {
                features,
                label: self.labels[index],
            }
        })
    }
    fn len(&self) -> usize {
        self.labels.len()
    }
}

impl VectorizedSet {
    /// The reviews whose term counts are `counts` ([`TfIdfVectorizer::count_rows`] of
    /// `vectorizer`, or an equal one) with their `labels` (0 = neg, 1 = pos), one per row.
    ///
    /// # Errors
    /// [`DataError::InvalidCounts`] when the counts do not fit the vectorizer
    /// ([`SparseCounts::check`]) or the number of labels is not the number of rows.
    pub fn new(
        vectorizer: Arc<TfIdfVectorizer>,
        counts: SparseCounts,
        labels: Vec<u8>,
    ) -> Result<Self, DataError> {
        counts.check(vectorizer.vocab_size())?;
        if labels.len() != counts.rows {
            return Err(DataError::InvalidCounts {
                reason: format!("{} labels for {} rows", labels.len(), counts.rows),
            });
        }
        Ok(Self {
            vectorizer,
            counts,
            labels,
        })
    }

    /// Vectorises `texts` with `vectorizer` ([`TfIdfVectorizer::count_rows`]), one label each.
    ///
    /// # Errors
    /// [`DataError::InvalidCounts`] when `labels` and `texts` differ in length.
    pub fn from_texts<S: AsRef<str> + Sync>(
        vectorizer: Arc<TfIdfVectorizer>,
        texts: &[S],
        labels: Vec<u8>,
    ) -> Result<Self, DataError> {
        let counts = vectorizer.count_rows(texts);
        Self::new(vectorizer, counts, labels)
    }

    /// The number of reviews.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there is no review.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The row width: the vectorizer's [`TfIdfVectorizer::vocab_size`] (1200 on aclImdb).
    pub fn width(&self) -> usize {
        self.counts.cols
    }

    /// The labels, one per review (0 = neg, 1 = pos).
    pub fn labels(&self) -> &[u8] {
        &self.labels
    }

    /// The term counts the rows are weighed from.
    pub fn counts(&self) -> &SparseCounts {
        &self.counts
    }

    /// The bytes this set holds on the heap (its counts and labels; the vectorizer is shared).
    pub fn heap_bytes(&self) -> usize {
        self.counts.heap_bytes() + self.labels.len()
    }

    /// The reviews `rows` as a set of their own.
    ///
    /// # Panics
    /// When `rows` reaches past [`len`](Self::len).
    pub fn slice(&self, rows: Range<usize>) -> Self {
        Self {
            vectorizer: self.vectorizer.clone(),
            counts: self.counts.slice(rows.clone()),
            labels: self.labels[rows].to_vec(),
        }
    }

    /// Gathers the rows `idx` into a host batch: features `[len, width]` (f32, each row weighed
    /// from its counts into zeros) and labels `[len]` (i64).
    ///
    /// # Panics
    /// When an index is `>= len()`.
    pub fn batch(&self, idx: &[usize]) -> (burn::tensor::TensorData, burn::tensor::TensorData) {
        let width = self.width();
        let mut x = vec![0.0f32; idx.len() * width];
        for (&i, row) in idx.iter().zip(x.chunks_exact_mut(width.max(1))) {
            self.vectorizer.weigh_row(self.counts.row(i), row);
        }
        let y = idx.iter().map(|&i| self.labels[i] as i64).collect();
        (
            burn::tensor::TensorData::new(x, [idx.len(), width]),
            burn::tensor::TensorData::new(y, [idx.len()]),
        )
    }
}

/// Stacks rows (TF-IDF row of `width` values, label) into a host batch: features
/// `[rows, width]` (f32) and labels `[rows]` (i64), as the placements take them.
///
/// # Panics
/// When a row's length is not `width`.
pub fn host_batch<'a>(
    rows: impl ExactSizeIterator<Item = (&'a [f32], u8)>,
    width: usize,
) -> (burn::tensor::TensorData, burn::tensor::TensorData) {
    let n = rows.len();
    let mut x = Vec::with_capacity(n * width);
    let mut y = Vec::with_capacity(n);
    for (row, label) in rows {
        assert_eq!(row.len(), width, "a TF-IDF row of the wrong width");
        x.extend_from_slice(row);
        y.push(label as i64);
    }
    (
        burn::tensor::TensorData::new(x, [n, width]),
        burn::tensor::TensorData::new(y, [n]),
    )
}

/// The order of epoch `epoch` (0-based): a permutation of `0..n` drawn from `seed` and the
/// epoch only, so a run resumed at epoch k sees the order an unbroken run would have.
pub fn epoch_order(n: usize, seed: u64, epoch: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..n).collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(
        seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(epoch as u64),
    );
    idx.shuffle(&mut rng);
    idx
}

/// Cuts an order into global batches of `batch_size` under `policy`.
pub fn batches(order: &[usize], batch_size: usize, policy: DropPolicy) -> Vec<&[usize]> {
    let mut out: Vec<&[usize]> = order.chunks(batch_size).collect();
    if policy != DropPolicy::Uneven && out.last().is_some_and(|b| b.len() < batch_size) {
        out.pop();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_whose_counts_or_labels_do_not_fit_is_a_typed_error() {
        let texts = ["the cat sat", "the dog ran", "a cat"];
        let v = Arc::new(TfIdfVectorizer::fit(&texts, 5).unwrap());
        let wider = TfIdfVectorizer::fit(&["a b c d e f g"], 8).unwrap();
        let invalid =
            |r: Result<VectorizedSet, DataError>| matches!(r, Err(DataError::InvalidCounts { .. }));
        assert!(VectorizedSet::from_texts(v.clone(), &texts, vec![0, 1, 0]).is_ok());
        assert!(invalid(VectorizedSet::from_texts(
            v.clone(),
            &texts,
            vec![0, 1]
        )));
        assert!(invalid(VectorizedSet::new(
            v,
            wider.count_rows(&texts),
            vec![0, 1, 0]
        )));
    }

    #[test]
    fn a_slice_of_the_counts_is_the_counts_of_the_sliced_texts() {
        let texts = ["the cat sat", "", "the dog ran the", "a cat", "dog"];
        let v = TfIdfVectorizer::fit(&texts, 5).unwrap();
        let all = v.count_rows(&texts);
        for (a, b) in [(0, 5), (1, 4), (2, 2), (4, 5)] {
            assert_eq!(all.slice(a..b), v.count_rows(&texts[a..b]), "{a}..{b}");
        }
    }
}
