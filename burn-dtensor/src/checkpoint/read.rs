//! Reading boxes of a sharded checkpoint's tensors: only the checksum blocks of the saved shards
//! that overlap the box are read (resharding on load, as PyTorch DCP's load planner and Orbax
//! do), and each block read is verified against its CRC-32. Each shard file's safetensors
//! header is read once per opened checkpoint and must agree with `metadata.json` on every shard
//! read from it.

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use burn::tensor::{DType, TensorData};

use super::ckpt_err;
use super::format::{self, BLOCK_BYTES, ShardMetadata, TensorMetadata};
use crate::error::Result;

/// Most bytes read in one go (a run of consecutive blocks); bounds the host memory of a read
/// beside the box itself.
const READ_CHUNK: usize = 16 * BLOCK_BYTES;

/// The values of `ranges` (a box of the global tensor `name`) from the checkpoint in `dir`,
/// in the saved dtype, row-major.
///
/// # Errors
/// A box outside the tensor or not covered by its shards, a missing or short file, a shard file
/// whose header disagrees with the index ([`ShardFileHeader::agrees`]), or a block whose
/// checksum differs ([`crate::DTensorError::Checkpoint`] naming tensor and file).
pub(super) fn read_box(
    dir: &Path,
    headers: &Headers,
    name: &str,
    t: &TensorMetadata,
    ranges: &[Range<usize>],
) -> Result<TensorData> {
    let dtype = format::dtype_of_name(&t.dtype).ok_or_else(|| {
        ckpt_err(
            dir,
            format!(
                "tensor `{name}` has dtype {} which this build cannot read",
                t.dtype
            ),
        )
    })?;
    let elem = format::elem_bytes(dtype);
    let sizes: Vec<usize> = ranges.iter().map(|r| r.len()).collect();
    let n: usize = sizes.iter().product();
    // The shards the box overlaps, each checked against its file's header and the file's
    // length before the box is allocated: the box's bytes exist on disk where both the index
    // and the file say. No file stays open (a box may span thousands).
    let sources: Vec<&ShardMetadata> = t
        .shards
        .iter()
        .filter(|shard| {
            shard
                .ranges()
                .iter()
                .zip(ranges)
                .all(|(a, b)| a.start.max(b.start) < a.end.min(b.end))
        })
        .collect();
    for shard in &sources {
        headers
            .get(dir, name, &shard.file)?
            .agrees(dir, name, t, shard)?;
    }
    let mut out = vec![0u8; n * elem];
    let mut covered = 0usize;
    for shard in sources {
        covered += copy_overlap(dir, name, shard, ranges, elem, &mut out)?;
    }
    if covered != n {
        return Err(ckpt_err(
            dir,
            format!(
                "tensor `{name}`: the shards listed cover {covered} of the {n} elements of box \
                 {ranges:?} (a shard is missing from the metadata or the tensor's shards overlap); \
                 the checkpoint is incomplete"
            ),
        ));
    }
    Ok(match dtype {
        DType::Bool(_) => TensorData::new(out.into_iter().map(|b| b != 0).collect(), sizes),
        d => TensorData::from_bytes_vec(out, sizes, d),
    })
}

/// The safetensors headers of an opened checkpoint's shard files, each read on first use and
/// kept for the life of the [`Checkpoint`](super::Checkpoint) (its clones share them).
#[derive(Debug, Clone, Default)]
pub(super) struct Headers(Arc<Mutex<HashMap<String, Arc<ShardFileHeader>>>>);

impl Headers {
    /// The header of shard file `file` in `dir`, read when first asked for (for tensor `name`,
    /// which errors name).
    ///
    /// # Errors
    /// The file cannot be opened, or does not start with a safetensors header.
    fn get(&self, dir: &Path, name: &str, file: &str) -> Result<Arc<ShardFileHeader>> {
        if let Some(h) = self.0.lock().unwrap_or_else(|e| e.into_inner()).get(file) {
            return Ok(h.clone());
        }
        let h = Arc::new(ShardFileHeader::read(dir, name, file)?);
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(file.to_string(), h.clone());
        Ok(h)
    }
}

/// What a shard file says of itself: its length and its safetensors header (the file's own
/// index of the shards it holds, <https://github.com/huggingface/safetensors>: an 8-byte
/// little-endian header length, then the JSON header whose offsets count from its end).
#[derive(Debug)]
pub(super) struct ShardFileHeader {
    /// The file's length in bytes.
    len: u64,
    /// Where the shards' bytes start: 8 plus the header's length.
    data_start: u64,
    /// The header's entries (`name@offsets` -> dtype, shape, byte range after `data_start`).
    entries: safetensors::tensor::Metadata,
}

impl ShardFileHeader {
    /// The safetensors header's limit on its own length (`safetensors::tensor`'s
    /// `MAX_HEADER_SIZE`), which bounds what a damaged length field makes a reader allocate.
    const MAX_HEADER_BYTES: u64 = 100_000_000;

    /// Reads shard file `file`'s length and header (for tensor `name`, which errors name).
    ///
    /// # Errors
    /// It cannot be opened, or does not start with a safetensors header.
    fn read(dir: &Path, name: &str, file: &str) -> Result<Self> {
        let path = dir.join(file);
        let mut f = File::open(&path).map_err(|e| unopened(&path, name, e))?;
        let len = f.metadata().map_err(|e| unopened(&path, name, e))?.len();
        let not_safetensors = |why: String| {
            ckpt_err(
                &path,
                format!(
                    "tensor `{name}`: its shard file is not a safetensors file ({why}); the file \
                     is damaged or another file took its name: restore it or use an earlier \
                     checkpoint"
                ),
            )
        };
        let mut n = [0u8; 8];
        f.read_exact(&mut n)
            .map_err(|e| not_safetensors(format!("no header length: {e}")))?;
        let n = u64::from_le_bytes(n);
        if n > Self::MAX_HEADER_BYTES || n > len.saturating_sub(8) {
            return Err(not_safetensors(format!(
                "a header of {n} bytes in a file of {len}"
            )));
        }
        let mut header = vec![0u8; n as usize];
        f.read_exact(&mut header)
            .map_err(|e| not_safetensors(format!("its header cannot be read: {e}")))?;
        let entries = serde_json::from_slice(&header)
            .map_err(|e| not_safetensors(format!("its header does not parse: {e}")))?;
        Ok(Self {
            len,
            data_start: 8 + n,
            entries,
        })
    }

    /// Checks that this file holds `shard` of tensor `name` (entry `t`) where `metadata.json`
    /// says: its header has the entry `name@offsets` with the tensor's dtype, the shard's sizes
    /// as shape and the shard's byte range, and the file is long enough for it. This catches an
    /// index and shard files from different saves, and an index edited consistently with its
    /// checksums (two shards' offsets swapped), which the checksums alone do not.
    ///
    /// # Errors
    /// The entry is missing or differs, or the file ends before the shard does.
    fn agrees(
        &self,
        dir: &Path,
        name: &str,
        t: &TensorMetadata,
        shard: &ShardMetadata,
    ) -> Result<()> {
        let path = dir.join(&shard.file);
        let (start, end) = shard.byte_range;
        if self.len < end {
            return Err(ckpt_err(
                &path,
                format!(
                    "tensor `{name}`: its shards end at byte {end} but the file has {} bytes; \
                     the file is cut short, restore it or use an earlier checkpoint",
                    self.len
                ),
            ));
        }
        let entry = format::shard_name(name, &shard.offsets);
        let found = self.entries.info(&entry).map(|i| {
            (
                format!("{:?}", i.dtype),
                i.shape.clone(),
                (
                    self.data_start.saturating_add(i.data_offsets.0 as u64),
                    self.data_start.saturating_add(i.data_offsets.1 as u64),
                ),
            )
        });
        let indexed = (t.dtype.clone(), shard.sizes.clone(), (start, end));
        if found.as_ref() == Some(&indexed) {
            return Ok(());
        }
        let says = match found {
            None => "has no such entry".to_string(),
            Some((dtype, shape, (a, b))) => {
                format!("gives dtype {dtype}, shape {shape:?}, bytes {a}..{b}")
            }
        };
        Err(ckpt_err(
            &path,
            format!(
                "tensor `{name}`: metadata.json puts shard `{entry}` (dtype {}, shape {:?}) at \
                 bytes {start}..{end} of this file, but the file's header {says}; metadata.json \
                 and the shard files are not from the same save: restore the checkpoint or use \
                 an earlier one",
                t.dtype, shard.sizes
            ),
        ))
    }
}

/// The error for a shard file of tensor `name` at `path` that cannot be opened (`e`).
fn unopened(path: &Path, name: &str, e: std::io::Error) -> crate::DTensorError {
    ckpt_err(
        path,
        format!(
            "tensor `{name}`: its shard file cannot be opened ({e}); the checkpoint is incomplete"
        ),
    )
}

/// Copies the part of `shard` inside `ranges` into `out` (the box, row-major); returns the
/// number of elements copied.
fn copy_overlap(
    dir: &Path,
    name: &str,
    shard: &ShardMetadata,
    ranges: &[Range<usize>],
    elem: usize,
    out: &mut [u8],
) -> Result<usize> {
    // The metadata was checked when the checkpoint was opened (`TensorMetadata::check`): the
    // shard has the box's rank, lies inside the shape, and its byte range holds its elements.
    let rank = ranges.len();
    let sr = shard.ranges();
    let ov: Vec<Range<usize>> = sr
        .iter()
        .zip(ranges)
        .map(|(a, b)| a.start.max(b.start)..a.end.min(b.end).max(a.start.max(b.start)))
        .collect();
    let count = crate::host::box_numel(&ov);
    if count == 0 {
        return Ok(0);
    }
    // Runs: the overlap is contiguous (in the shard and in the box) along the trailing dims it
    // covers whole in both, plus the next one.
    let mut inner = 1usize; // elements per run
    let mut split = rank; // dims [split..] are inside one run
    while split > 0 {
        let d = split - 1;
        inner *= ov[d].len();
        split = d;
        if ov[d].len() != sr[d].len() || ov[d].len() != ranges[d].len() {
            break;
        }
    }
    let strides = |sizes: &[usize]| {
        let mut s = vec![1usize; rank];
        for d in (0..rank.saturating_sub(1)).rev() {
            s[d] = s[d + 1] * sizes[d + 1];
        }
        s
    };
    let s_str = strides(&shard.sizes);
    let b_sizes: Vec<usize> = ranges.iter().map(|r| r.len()).collect();
    let b_str = strides(&b_sizes);
    // Every run's (offset in the shard, offset in the box), in elements, in the shard's order.
    let outer: Vec<Range<usize>> = ov[..split].to_vec();
    let total = crate::host::box_numel(&outer);
    let mut runs = Vec::with_capacity(total);
    for k in 0..total {
        // The k-th outer index, row-major.
        let mut rest = k;
        let mut so = 0;
        let mut bo = 0;
        for d in (0..rank).rev() {
            let g = if d < split {
                let g = outer[d].start + rest % outer[d].len();
                rest /= outer[d].len();
                g
            } else {
                ov[d].start
            };
            so += (g - sr[d].start) * s_str[d];
            bo += (g - ranges[d].start) * b_str[d];
        }
        runs.push((so * elem, bo * elem));
    }
    let run_bytes = inner * elem;
    let path = dir.join(&shard.file);
    let file = File::open(&path).map_err(|e| unopened(&path, name, e))?;
    let shard_len = (shard.byte_range.1 - shard.byte_range.0) as usize;
    // The blocks the runs touch, read in chunks of consecutive blocks and verified.
    let mut blocks: Vec<usize> = runs
        .iter()
        .flat_map(|&(so, _)| so / BLOCK_BYTES..=(so + run_bytes - 1) / BLOCK_BYTES)
        .collect();
    blocks.dedup();
    blocks.sort_unstable();
    blocks.dedup();
    let mut i = 0;
    let mut run_at = 0; // first run not yet fully copied (runs are in shard order)
    while i < blocks.len() {
        let first = blocks[i];
        let mut last = first;
        while i + 1 < blocks.len()
            && blocks[i + 1] == last + 1
            && (blocks[i + 1] + 1 - first) * BLOCK_BYTES <= READ_CHUNK
        {
            i += 1;
            last = blocks[i];
        }
        i += 1;
        let lo = first * BLOCK_BYTES;
        let hi = ((last + 1) * BLOCK_BYTES).min(shard_len);
        let mut buf = vec![0u8; hi - lo];
        file.read_exact_at(&mut buf, shard.byte_range.0 + lo as u64)
            .map_err(|e| {
                ckpt_err(
                    &path,
                    format!(
                        "tensor `{name}`: shard {:?} is cut short ({e}); the file is damaged",
                        shard.offsets
                    ),
                )
            })?;
        for (k, block) in buf.chunks(BLOCK_BYTES).enumerate() {
            if crc32fast::hash(block) != shard.block_crc32[first + k] {
                return Err(ckpt_err(
                    &path,
                    format!(
                        "tensor `{name}`: shard {:?} fails its checksum (block {} of {}); the file \
                         is damaged, restore it or use an earlier checkpoint",
                        shard.offsets,
                        first + k,
                        shard.block_crc32.len()
                    ),
                ));
            }
        }
        // Copy the parts of runs inside [lo, hi).
        let mut r = run_at;
        while r < runs.len() && runs[r].0 < hi {
            let (so, bo) = runs[r];
            let a = so.max(lo);
            let b = (so + run_bytes).min(hi);
            if a < b {
                out[bo + (a - so)..bo + (b - so)].copy_from_slice(&buf[a - lo..b - lo]);
            }
            if so + run_bytes <= hi {
                run_at = r + 1;
            }
            r += 1;
        }
    }
    Ok(count)
}
