//! Batching: the vectorised reviews as a `burn::data` dataset, a seeded per-epoch order, and
//! global batches cut under a drop policy.

use burn::data::dataset::Dataset;
use rand::SeedableRng;
use rand::seq::SliceRandom;

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

/// The vectorised reviews: TF-IDF rows `[n, width]` (row-major f32) and labels.
#[derive(Debug, Clone)]
pub struct VectorizedSet {
    /// Row-major `[n, width]` TF-IDF values.
    pub features: Vec<f32>,
    /// Row width (the vectorizer's `vocab_size()`, 1200).
    pub width: usize,
    /// 0 = neg, 1 = pos.
    pub labels: Vec<u8>,
}

/// One example of a [`VectorizedSet`].
#[derive(Debug, Clone)]
pub struct Example {
    /// TF-IDF row.
    pub features: Vec<f32>,
    /// Label.
    pub label: u8,
}

impl Dataset<Example> for VectorizedSet {
    fn get(&self, index: usize) -> Option<Example> {
        (index < self.labels.len()).then(|| Example {
            features: self.features[index * self.width..(index + 1) * self.width].to_vec(),
            label: self.labels[index],
        })
    }
    fn len(&self) -> usize {
        self.labels.len()
    }
}

impl VectorizedSet {
    /// Gathers the rows `idx` into a host batch: features `[len, width]` and labels `[len]`.
    pub fn batch(&self, idx: &[usize]) -> (burn::tensor::TensorData, burn::tensor::TensorData) {
        host_batch(
            idx.iter().map(|&i| {
                (
                    &self.features[i * self.width..(i + 1) * self.width],
                    self.labels[i],
                )
            }),
            self.width,
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
