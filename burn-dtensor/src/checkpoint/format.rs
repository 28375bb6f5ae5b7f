//! The on-disk format of a sharded checkpoint: the metadata file (`metadata.json`), the shard
//! files (safetensors), the dtype names and the block checksums.
//!
//! ```text
//! ckpt/metadata.json                         written last, by the chief: the commit point
//! ckpt/shards-00000-of-00004.safetensors     the distinct shards rank 0 owns
//! ckpt/shards-00001-of-00004.safetensors     ... one file per rank that owns a shard
//! ```
//!
//! Each shard file is an ordinary safetensors file (8-byte little-endian header length, a JSON
//! header, the tensors' bytes; <https://github.com/huggingface/safetensors>), readable by any
//! safetensors tool: the tensor `dense1.weight@0,24` is the shard of `dense1.weight` whose box
//! starts at global offsets `[0, 24]`. The metadata gives, per tensor, the global shape, the
//! dtype, the layout at save time (mesh axes and sharding spec, for information: loading
//! reshards to any layout) and per shard its box (global offsets and sizes), its file, its
//! absolute byte range in that file and a CRC-32 of every [`BLOCK_BYTES`] (256 KiB) block of its bytes, so
//! that a reader that needs only part of a shard verifies only the blocks it reads.

use std::collections::BTreeMap;
use std::ops::Range;

use burn::tensor::DType;
use serde::{Deserialize, Serialize};

/// The metadata file's name inside a checkpoint directory.
pub const METADATA_FILE: &str = "metadata.json";
/// The `format` field of the metadata, to tell a sharded checkpoint from any other JSON.
pub const FORMAT: &str = "burn-dtensor-sharded-checkpoint";
/// The format version this build writes and reads.
pub const VERSION: u32 = 1;
/// Bytes per checksummed block of a shard (256 KiB; the last block of a shard may be shorter):
/// the granularity of partial reads (a reader reads and verifies whole blocks), against 4 bytes
/// of CRC per block in the metadata (16 KiB per GiB of checkpoint).
pub const BLOCK_BYTES: usize = 256 << 10;

/// A sharded checkpoint's `metadata.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointMetadata {
    /// Always [`FORMAT`].
    pub format: String,
    /// [`VERSION`] at write time.
    pub version: u32,
    /// Processes that wrote it.
    pub processes: usize,
    /// Every tensor by name (module parameter path such as `dense1.weight`, or a name given to
    /// [`StateDict::insert`](super::StateDict::insert)).
    pub tensors: BTreeMap<String, TensorMetadata>,
    /// Counters by name (an optimizer's step count, the epochs done), written by the chief.
    #[serde(default)]
    pub counters: BTreeMap<String, u64>,
    /// Free-form JSON values by name (a trainer's state: epochs done, loss history, the
    /// vectorizer), written by the chief.
    #[serde(default)]
    pub attributes: BTreeMap<String, serde_json::Value>,
}

/// One tensor of a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorMetadata {
    /// Global shape.
    pub shape: Vec<usize>,
    /// Element type, as safetensors names it (`F32`, `F64`, `F16`, `BF16`, `I64`, `I32`,
    /// `I16`, `I8`, `U8`, `BOOL`, ...).
    pub dtype: String,
    /// The mesh axes at save time (`[["batch", 4], ["model", 2]]`).
    pub mesh_axes: Vec<(String, usize)>,
    /// The sharding spec at save time, one entry per dim (`["unsharded", "model"]`).
    pub sharding_spec: Vec<String>,
    /// The distinct shards, each written once; together they tile the global shape.
    pub shards: Vec<ShardMetadata>,
}

/// One distinct shard of a tensor in a shard file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardMetadata {
    /// Global offset of the shard's box, per dim.
    pub offsets: Vec<usize>,
    /// Extent of the shard's box, per dim (row-major in the file).
    pub sizes: Vec<usize>,
    /// The shard file, relative to the checkpoint directory.
    pub file: String,
    /// Absolute byte range of the shard's bytes in `file`.
    pub byte_range: (u64, u64),
    /// CRC-32 (IEEE, as zlib) of each [`BLOCK_BYTES`] block of the shard's bytes, in order.
    pub block_crc32: Vec<u32>,
}

impl ShardMetadata {
    /// The shard's box as one global range per dim.
    pub fn ranges(&self) -> Vec<Range<usize>> {
        self.offsets
            .iter()
            .zip(&self.sizes)
            .map(|(&o, &s)| o..o + s)
            .collect()
    }
}

impl CheckpointMetadata {
    /// Checks every tensor's entry ([`TensorMetadata::check`]), so that a damaged or edited
    /// `metadata.json` is refused when it is opened rather than read into wrong values.
    ///
    /// # Errors
    /// The first inconsistency found, naming the tensor (and the shard by its index and
    /// offsets).
    pub fn check(&self) -> Result<(), String> {
        self.tensors.iter().try_for_each(|(name, t)| t.check(name))
    }
}

impl TensorMetadata {
    /// Checks that this entry describes what a writer of this format writes, so that what
    /// [`read`](super::Checkpoint::read) gets from the shards is the tensor and nothing else:
    /// - the shape's element count and every shard's bytes fit this machine's `usize`;
    /// - each shard's `offsets` and `sizes` have the tensor's rank and its box lies inside the
    ///   shape;
    /// - each shard's byte range is ordered, holds its box's elements (for a dtype this build
    ///   knows: the element count times the element size, one byte for `BOOL`) and has one
    ///   CRC-32 per [`BLOCK_BYTES`] block;
    /// - each shard's `file` is a relative path inside the checkpoint directory (no `..`, no
    ///   root), so a checkpoint cannot make a reader open files elsewhere;
    /// - the shards tile the shape: no two boxes overlap and their element counts add up to
    ///   the shape's, so every element is read from exactly one shard.
    ///
    /// # Errors
    /// The first inconsistency, as a sentence naming tensor `name` (the caller adds the file).
    pub fn check(&self, name: &str) -> Result<(), String> {
        self.inconsistency(name).map_err(|why| {
            format!(
                "{why}; metadata.json is damaged or was edited: restore it or use an earlier \
                 checkpoint"
            )
        })
    }

    /// [`TensorMetadata::check`] without its advice.
    fn inconsistency(&self, name: &str) -> Result<(), String> {
        let numel = checked_numel(&self.shape).ok_or_else(|| {
            format!(
                "tensor `{name}` has shape {:?}, more elements than this machine can address",
                self.shape
            )
        })?;
        let elem = dtype_of_name(&self.dtype).map(elem_bytes);
        let mut covered = 0usize;
        for (i, s) in self.shards.iter().enumerate() {
            let count = self.shard_inconsistency(s, elem).map_err(|why| {
                format!(
                    "tensor `{name}`: shard {i} (offsets {:?}, sizes {:?}) {why}",
                    s.offsets, s.sizes
                )
            })?;
            covered = covered.saturating_add(count);
        }
        if let Some((a, b)) = overlapping(&self.shards) {
            return Err(format!(
                "tensor `{name}`: shards {a} and {b} overlap (offsets {:?} and {:?})",
                self.shards[a].offsets, self.shards[b].offsets
            ));
        }
        if covered != numel {
            return Err(format!(
                "tensor `{name}`: its shards hold {covered} of the {numel} elements of shape {:?} \
                 (a shard is missing from the metadata)",
                self.shape
            ));
        }
        Ok(())
    }

    /// Checks shard `s` alone (rank, box, byte range, checksums, file; `elem`: the element size
    /// of a dtype this build knows) and returns its element count.
    ///
    /// # Errors
    /// What is wrong with it, as the end of a sentence that names the shard.
    fn shard_inconsistency(&self, s: &ShardMetadata, elem: Option<usize>) -> Result<usize, String> {
        let rank = self.shape.len();
        if s.offsets.len() != rank || s.sizes.len() != rank {
            return Err(format!("does not have the tensor's rank {rank}"));
        }
        let inside = s
            .offsets
            .iter()
            .zip(&s.sizes)
            .zip(&self.shape)
            .all(|((&o, &n), &dim)| o.checked_add(n).is_some_and(|end| end <= dim));
        if !inside {
            return Err(format!("lies outside the tensor's shape {:?}", self.shape));
        }
        let (start, end) = s.byte_range;
        if end < start {
            return Err(format!(
                "has the byte range {start}..{end}, which ends before it starts"
            ));
        }
        let len = usize::try_from(end - start)
            .map_err(|_| "has more bytes than this machine can address".to_string())?;
        // Inside the shape, so its element count does not overflow.
        let count: usize = s.sizes.iter().product();
        if let Some(elem) = elem
            && count.checked_mul(elem) != Some(len)
        {
            return Err(format!(
                "has {len} bytes for {count} elements of {}",
                self.dtype
            ));
        }
        if s.block_crc32.len() != len.div_ceil(BLOCK_BYTES) {
            return Err(format!(
                "has {} block checksums for {len} bytes (one per {BLOCK_BYTES} bytes)",
                s.block_crc32.len()
            ));
        }
        let plain = !s.file.is_empty()
            && std::path::Path::new(&s.file)
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)));
        if !plain {
            return Err(format!(
                "names the file `{}`, which is not a path inside the checkpoint directory",
                s.file
            ));
        }
        Ok(count)
    }
}

/// The element count of `shape`, `None` where it overflows `usize`.
fn checked_numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
}

/// The indices of two non-empty shards whose boxes overlap, if any (boxes inside the shape,
/// of the same rank: [`TensorMetadata::check`] checks that first). A sweep along the dim with
/// the most distinct offsets: each box is compared only with the boxes before it in that order
/// that reach past its start there (for the grid a layout writes, none or its own row of the
/// grid), not with every other box.
fn overlapping(shards: &[ShardMetadata]) -> Option<(usize, usize)> {
    let rank = shards.first()?.offsets.len();
    let mut order: Vec<usize> = (0..shards.len())
        .filter(|&i| shards[i].sizes.iter().all(|&n| n > 0))
        .collect();
    if rank == 0 {
        // Every box of a scalar is the whole scalar.
        return (order.len() > 1).then(|| (order[0], order[1]));
    }
    let sweep = (0..rank)
        .max_by_key(|&d| {
            let mut starts: Vec<usize> = order.iter().map(|&i| shards[i].offsets[d]).collect();
            starts.sort_unstable();
            starts.dedup();
            starts.len()
        })
        .unwrap_or(0);
    order.sort_by_key(|&i| shards[i].offsets[sweep]);
    let end = |i: usize, d: usize| shards[i].offsets[d] + shards[i].sizes[d];
    let mut open: Vec<usize> = Vec::new();
    for &i in &order {
        let start = shards[i].offsets[sweep];
        open.retain(|&j| end(j, sweep) > start);
        let meets = |j: usize| {
            (0..rank).all(|d| shards[i].offsets[d] < end(j, d) && shards[j].offsets[d] < end(i, d))
        };
        if let Some(&j) = open.iter().find(|&&j| meets(j)) {
            return Some((j.min(i), j.max(i)));
        }
        open.push(i);
    }
    None
}

/// The name of rank `rank`'s shard file among `size` processes.
pub fn shard_file(rank: usize, size: usize) -> String {
    format!("shards-{rank:05}-of-{size:05}.safetensors")
}

/// The name of a shard inside its safetensors file: `dense1.weight@0,24`.
pub fn shard_name(tensor: &str, offsets: &[usize]) -> String {
    let o: Vec<String> = offsets.iter().map(usize::to_string).collect();
    format!("{tensor}@{}", o.join(","))
}

/// safetensors' dtype for a Burn dtype (`None` for quantized data, which is not saved).
pub fn safetensors_dtype(d: DType) -> Option<safetensors::Dtype> {
    use safetensors::Dtype as S;
    Some(match d {
        DType::F64 => S::F64,
        DType::F32 | DType::Flex32 => S::F32,
        DType::F16 => S::F16,
        DType::BF16 => S::BF16,
        DType::I64 => S::I64,
        DType::I32 => S::I32,
        DType::I16 => S::I16,
        DType::I8 => S::I8,
        DType::U64 => S::U64,
        DType::U32 => S::U32,
        DType::U16 => S::U16,
        DType::U8 => S::U8,
        DType::Bool(_) => S::BOOL,
        _ => return None,
    })
}

/// The name written in the metadata for a Burn dtype (safetensors' name).
pub fn dtype_name(d: DType) -> Option<String> {
    safetensors_dtype(d).map(|s| format!("{s:?}"))
}

/// The Burn dtype of a metadata dtype name (`bool` is the host bool, one byte per element).
pub fn dtype_of_name(name: &str) -> Option<DType> {
    Some(match name {
        "F64" => DType::F64,
        "F32" => DType::F32,
        "F16" => DType::F16,
        "BF16" => DType::BF16,
        "I64" => DType::I64,
        "I32" => DType::I32,
        "I16" => DType::I16,
        "I8" => DType::I8,
        "U64" => DType::U64,
        "U32" => DType::U32,
        "U16" => DType::U16,
        "U8" => DType::U8,
        "BOOL" => DType::Bool(burn::tensor::BoolStore::Native),
        _ => return None,
    })
}

/// The tensor kind (Burn's `TensorKind::name`: `Float`, `Int` or `Bool`) of a metadata dtype
/// name; `None` for a name this build does not know.
pub fn kind_of_name(name: &str) -> Option<&'static str> {
    let d = dtype_of_name(name)?;
    Some(if d.is_float() {
        "Float"
    } else if d.is_bool() {
        "Bool"
    } else {
        "Int"
    })
}

/// Bytes per element of dtype `d` in a shard file (one for `BOOL`; `Flex32` is written as
/// `F32`).
pub(crate) fn elem_bytes(d: DType) -> usize {
    match d {
        DType::Bool(_) => 1,
        DType::Flex32 => 4,
        d => d.size(),
    }
}

/// CRC-32 of every [`BLOCK_BYTES`] block of `bytes`.
pub fn block_checksums(bytes: &[u8]) -> Vec<u32> {
    bytes.chunks(BLOCK_BYTES).map(crc32fast::hash).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_names_round_trip() {
        for d in [
            DType::F64,
            DType::F32,
            DType::F16,
            DType::BF16,
            DType::I64,
            DType::I32,
            DType::I8,
            DType::U8,
        ] {
            assert_eq!(dtype_of_name(&dtype_name(d).unwrap()), Some(d));
        }
    }

    /// A tensor of `shape` (f32) cut into `grid` equal boxes per dim, in one file, as a writer
    /// of this format writes it.
    fn tiled(shape: &[usize], grid: &[usize]) -> TensorMetadata {
        let cells: usize = grid.iter().product();
        let shards = (0..cells)
            .map(|c| {
                let mut rest = c;
                let mut offsets = vec![0; shape.len()];
                let mut sizes = vec![0; shape.len()];
                for d in (0..shape.len()).rev() {
                    let k = rest % grid[d];
                    rest /= grid[d];
                    sizes[d] = shape[d] / grid[d];
                    offsets[d] = k * sizes[d];
                }
                let bytes = sizes.iter().product::<usize>() as u64 * 4;
                ShardMetadata {
                    offsets,
                    sizes,
                    file: shard_file(0, 1),
                    byte_range: (c as u64 * bytes, (c as u64 + 1) * bytes),
                    block_crc32: vec![0; (bytes as usize).div_ceil(BLOCK_BYTES)],
                }
            })
            .collect();
        TensorMetadata {
            shape: shape.to_vec(),
            dtype: "F32".into(),
            mesh_axes: Vec::new(),
            sharding_spec: Vec::new(),
            shards,
        }
    }

    /// What a writer writes passes; each inconsistency is refused with a sentence naming the
    /// tensor and what is wrong (independent of the reader: hand-made entries).
    #[test]
    fn check_refuses_each_inconsistency() {
        let ok = tiled(&[4, 6], &[2, 3]);
        ok.check("t").unwrap();
        tiled(&[], &[]).check("scalar").unwrap();
        tiled(&[4, 0], &[2, 1]).check("empty").unwrap();
        let refused = |edit: &dyn Fn(&mut TensorMetadata), says: &str| {
            let mut t = ok.clone();
            edit(&mut t);
            let e = t.check("t").unwrap_err();
            assert!(e.contains("`t`") && e.contains(says), "{says}: {e}");
        };
        refused(&|t| t.shards[1].offsets.push(0), "rank 2");
        refused(&|t| t.shards[5].offsets[1] = 5, "outside");
        refused(&|t| t.shards[5].offsets[1] = usize::MAX, "outside");
        refused(&|t| t.shards[2].byte_range.1 = 3, "ends before it starts");
        refused(
            &|t| t.shards[2].byte_range.1 += 4,
            "20 bytes for 4 elements",
        );
        refused(&|t| t.shards[2].block_crc32.push(0), "2 block checksums");
        for file in ["", "/etc/passwd", "../x.safetensors", "a/../../x", "./x"] {
            refused(&|t| t.shards[0].file = file.into(), "not a path inside");
        }
        refused(&|t| t.shards[4].offsets = vec![1, 2], "overlap");
        refused(&|t| drop(t.shards.pop()), "20 of the 24");
        refused(&|t| t.shape = vec![usize::MAX, 3], "more elements");
        refused(&|t| t.shape = vec![6, 6], "24 of the 36");
        // Two boxes of a scalar overlap; an unknown dtype's byte counts are left to its reader.
        let mut two = tiled(&[], &[]);
        two.shards.push(two.shards[0].clone());
        assert!(two.check("s").unwrap_err().contains("overlap"));
        let mut other = ok.clone();
        other.dtype = "F8_E4M3".into();
        other.shards[0].byte_range.1 -= 1;
        other.check("t").unwrap();
        // Boxes that touch do not overlap; boxes that overlap only by their last cell do.
        let mut corner = tiled(&[4, 4], &[2, 2]);
        corner.check("c").unwrap();
        corner.shards[3].offsets = vec![1, 1];
        assert!(
            corner
                .check("c")
                .unwrap_err()
                .contains("shards 0 and 3 overlap")
        );
        // Many shards along one dim or in a grid: a sweep, not a comparison of every pair.
        tiled(&[3, 1 << 16], &[1, 1 << 14]).check("cols").unwrap();
        tiled(&[1 << 8, 1 << 8], &[1 << 7, 1 << 7])
            .check("grid")
            .unwrap();
        let mut late = tiled(&[3, 1 << 16], &[1, 1 << 14]);
        let last = late.shards.len() - 1;
        late.shards[last].offsets[1] -= 1;
        late.shards[last].sizes[1] = 4;
        assert!(late.check("l").unwrap_err().contains("overlap"));
    }

    #[test]
    fn checksums_cover_every_block() {
        let bytes: Vec<u8> = (0..(2 * BLOCK_BYTES + 5))
            .map(|i| (i % 251) as u8)
            .collect();
        let sums = block_checksums(&bytes);
        assert_eq!(sums.len(), 3);
        assert_eq!(sums[2], crc32fast::hash(&bytes[2 * BLOCK_BYTES..]));
        assert_eq!(shard_name("a.b", &[0, 24]), "a.b@0,24");
    }
}
