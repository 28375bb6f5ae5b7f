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
