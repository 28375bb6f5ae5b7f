//! Writing a sharded checkpoint: every process writes the distinct shards it owns into its own
//! safetensors file, then the chief commits the metadata (see [`save`]).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use burn::tensor::{DType, TensorData};

use super::format::{
    self, CheckpointMetadata, METADATA_FILE, ShardMetadata, TensorMetadata, block_checksums,
};
use super::{SaveOptions, StateDict, ckpt_err};
use crate::error::Result;

/// One shard this process writes: its tensor, box and the download of its values.
pub(super) struct OwnedShard {
    pub(super) tensor: String,
    pub(super) offsets: Vec<usize>,
    pub(super) sizes: Vec<usize>,
    pub(super) dtype: DType,
    pub(super) values: Box<dyn FnOnce() -> TensorData + Send>,
}

/// A shard's entry in the safetensors header: dtype, shape and length only. Its `data` is
/// empty on purpose: `safetensors::serialize` of these views gives exactly the file's header
/// (the crate computes the order and offsets), and the shards' bytes are then streamed after it
/// one at a time from their own buffers, never copied into the crate's buffer.
struct HeaderView {
    dtype: safetensors::Dtype,
    shape: Vec<usize>,
    len: usize,
}

impl safetensors::View for HeaderView {
    fn dtype(&self) -> safetensors::Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&[])
    }
    fn data_len(&self) -> usize {
        self.len
    }
}

/// The bytes of a shard as written: little-endian elements of the saved dtype (bool as one
/// byte per element, `Flex32` as `F32`); borrowed from the download when it already is that.
fn host_bytes(data: &TensorData) -> Cow<'_, [u8]> {
    match data.dtype {
        DType::Bool(burn::tensor::BoolStore::Native) => Cow::Borrowed(data.as_bytes()),
        DType::Bool(_) => Cow::Owned(data.iter::<bool>().map(u8::from).collect()),
        DType::Flex32 => Cow::Owned(data.clone().convert_dtype(DType::F32).into_bytes().to_vec()),
        _ => Cow::Borrowed(data.as_bytes()),
    }
}

/// The staging directory of a checkpoint being written to `dir`: `.NAME.partial` beside it.
fn staging(dir: &Path) -> Result<PathBuf> {
    let name = dir.file_name().ok_or_else(|| {
        ckpt_err(
            dir,
            "the checkpoint path has no final component; give a directory such as ckpt/step-100",
        )
    })?;
    let parent = dir.parent().unwrap_or(Path::new("."));
    Ok(parent.join(format!(".{}.partial", name.to_string_lossy())))
}

fn sync_dir(dir: &Path) {
    // Makes the renames durable across power loss; not possible on every platform, so failures
    // are ignored (a process kill needs no sync).
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Writes `state` as a sharded checkpoint in the new directory `dir`: see
/// [`super::save`] for the protocol.
pub(super) fn save(dir: &Path, state: StateDict, opts: &SaveOptions) -> Result<CheckpointMetadata> {
    let world = crate::spmd::init()?;
    let (rank, size) = (world.rank(), world.size());
    let tmp = staging(dir)?;
    let exists = dir.exists();
    // Every process must agree on whether to go on, or some would wait for the others forever.
    let verdicts = world.all_gather_bytes(&[exists as u8], "checkpoint: target check");
    if verdicts.iter().any(|v| v.first() == Some(&1)) {
        return Err(ckpt_err(
            dir,
            "it already exists: a checkpoint is written into a new directory (give another \
             name, e.g. one per step, or remove it)",
        ));
    }
    let created = if world.is_chief() {
        // A staging directory left by an interrupted save was never committed: safe to drop.
        let made = (if tmp.exists() {
            std::fs::remove_dir_all(&tmp)
        } else {
            Ok(())
        })
        .and_then(|()| std::fs::create_dir_all(&tmp));
        match made {
            Ok(()) => Vec::new(),
            Err(e) => e.to_string().into_bytes(),
        }
    } else {
        Vec::new()
    };
    let created = world.all_gather_bytes(&created, "checkpoint: staging directory");
    if !created[0].is_empty() {
        return Err(ckpt_err(&tmp, String::from_utf8_lossy(&created[0])));
    }
    let ok = world.all_gather_bytes(&[tmp.is_dir() as u8], "checkpoint: staging directory");
    if ok.iter().any(|v| v.first() != Some(&1)) {
        return Err(ckpt_err(
            &tmp,
            "the staging directory is not visible to every process: a checkpoint directory \
             must be on a file system that all processes share",
        ));
    }

    // This process's file: the distinct shards it owns.
    let file = format::shard_file(rank, size);
    let path = tmp.join(&file);
    let StateDict {
        tensors,
        counters,
        attributes,
        owned,
        ..
    } = state;
    // Each process reports its shard index or its error, so that a failed write on one rank
    // is an error on every rank (never a rank waiting for another that gave up).
    let mine = match write_file(&path, owned, opts) {
        Ok(written) => {
            let mut index: BTreeMap<String, Vec<ShardMetadata>> = BTreeMap::new();
            for (tensor, shard) in written {
                index.entry(tensor).or_default().push(ShardMetadata {
                    file: file.clone(),
                    ..shard
                });
            }
            let mut b = vec![b'O'];
            b.extend(serde_json::to_vec(&index).expect("a shard index serialises"));
            b
        }
        Err(e) => [b"E".as_slice(), e.to_string().as_bytes()].concat(),
    };
    let all = world.all_gather_bytes(&mine, "checkpoint: shard index");
    let mut meta = CheckpointMetadata {
        format: format::FORMAT.into(),
        version: format::VERSION,
        processes: size,
        tensors,
        counters,
        attributes,
    };
    for (r, bytes) in all.iter().enumerate() {
        match bytes.split_first() {
            Some((b'O', json)) => {
                let part: BTreeMap<String, Vec<ShardMetadata>> = serde_json::from_slice(json)
                    .map_err(|e| ckpt_err(dir, format!("rank {r}'s shard index: {e}")))?;
                for (name, shards) in part {
                    if let Some(t) = meta.tensors.get_mut(&name) {
                        t.shards.extend(shards);
                    }
                }
            }
            _ => {
                let why = String::from_utf8_lossy(bytes.get(1..).unwrap_or_default());
                return Err(ckpt_err(
                    dir,
                    format!("rank {r} failed to write its shards, nothing was committed: {why}"),
                ));
            }
        }
    }
    for t in meta.tensors.values_mut() {
        t.shards.sort_by(|a, b| a.offsets.cmp(&b.offsets));
    }
    // The commit, by the chief; its outcome reaches every process (nobody returns before the
    // commit, so a caller that reads or replaces the checkpoint next sees it complete).
    let status = if world.is_chief() {
        match commit(dir, &tmp, &meta, opts) {
            Ok(()) => vec![b'O'],
            Err(e) => [b"E".as_slice(), e.to_string().as_bytes()].concat(),
        }
    } else {
        Vec::new()
    };
    let status = world.all_gather_bytes(&status, "checkpoint: commit");
    match status[0].split_first() {
        Some((b'O', _)) => Ok(meta),
        _ => Err(ckpt_err(
            dir,
            format!(
                "the commit failed: {}",
                String::from_utf8_lossy(status[0].get(1..).unwrap_or_default())
            ),
        )),
    }
}

/// The commit point: the metadata written and synced into the staging directory, then the
/// staging directory renamed to `dir` (atomic on POSIX file systems).
fn commit(dir: &Path, tmp: &Path, meta: &CheckpointMetadata, opts: &SaveOptions) -> Result<()> {
    let json = serde_json::to_vec(meta).expect("metadata serialises");
    opts.write_point();
    write_synced(&tmp.join(METADATA_FILE), &json, opts)?;
    sync_dir(tmp);
    opts.write_point();
    std::fs::rename(tmp, dir).map_err(|e| ckpt_err(dir, e))?;
    sync_dir(dir.parent().unwrap_or(Path::new(".")));
    opts.write_point();
    Ok(())
}

/// Writes this process's shard file (none when it owns no shard) and syncs it; returns each
/// shard's metadata (without the file name). Peak host memory: one shard's download.
fn write_file(
    path: &Path,
    owned: Vec<OwnedShard>,
    opts: &SaveOptions,
) -> Result<Vec<(String, ShardMetadata)>> {
    if owned.is_empty() {
        return Ok(Vec::new());
    }
    opts.write_point();
    let mut views = Vec::with_capacity(owned.len());
    for s in &owned {
        let dtype = format::safetensors_dtype(s.dtype).ok_or_else(|| {
            ckpt_err(
                path,
                format!(
                    "tensor `{}` has dtype {:?}, which a checkpoint cannot hold (dequantize it first)",
                    s.tensor, s.dtype
                ),
            )
        })?;
        let len = s.sizes.iter().product::<usize>() * format::elem_bytes(s.dtype);
        let view = HeaderView {
            dtype,
            shape: s.sizes.clone(),
            len,
        };
        views.push((format::shard_name(&s.tensor, &s.offsets), view));
    }
    let header = safetensors::serialize(views, None).map_err(|e| ckpt_err(path, e))?;
    let parsed: safetensors::tensor::Metadata = serde_json::from_slice(&header[8..])
        .map_err(|e| ckpt_err(path, format!("safetensors header: {e}")))?;
    let data_start = header.len() as u64;
    // The shards in file order (the crate sorts them by dtype alignment, then name).
    let mut order: Vec<(usize, OwnedShard)> = owned
        .into_iter()
        .map(|s| {
            let name = format::shard_name(&s.tensor, &s.offsets);
            let info = parsed.info(&name).expect("every shard is in the header");
            (info.data_offsets.0, s)
        })
        .collect();
    order.sort_by_key(|(at, _)| *at);
    let mut f = std::io::BufWriter::with_capacity(
        4 << 20,
        std::fs::File::create(path).map_err(|e| ckpt_err(path, e))?,
    );
    f.write_all(&header).map_err(|e| ckpt_err(path, e))?;
    let mut out = Vec::with_capacity(order.len());
    let mut at = data_start;
    for (_, s) in order {
        let data = (s.values)();
        let bytes = host_bytes(&data);
        let expected = s.sizes.iter().product::<usize>() * format::elem_bytes(s.dtype);
        if bytes.len() != expected {
            return Err(ckpt_err(
                path,
                format!(
                    "tensor `{}`: a shard of {} bytes where its box holds {expected}",
                    s.tensor,
                    bytes.len()
                ),
            ));
        }
        f.write_all(&bytes).map_err(|e| ckpt_err(path, e))?;
        out.push((
            s.tensor,
            ShardMetadata {
                offsets: s.offsets,
                sizes: s.sizes,
                file: String::new(),
                byte_range: (at, at + bytes.len() as u64),
                block_crc32: block_checksums(&bytes),
            },
        ));
        at += bytes.len() as u64;
        drop(bytes);
        drop(data);
        opts.write_point();
    }
    let f = f.into_inner().map_err(|e| ckpt_err(path, e.into_error()))?;
    f.sync_all().map_err(|e| ckpt_err(path, e))?;
    opts.write_point();
    Ok(out)
}

/// Writes `bytes` to `path` and syncs it, with a write point halfway.
fn write_synced(path: &Path, bytes: &[u8], opts: &SaveOptions) -> Result<()> {
    let mut f = std::fs::File::create(path).map_err(|e| ckpt_err(path, e))?;
    let half = bytes.len() / 2;
    f.write_all(&bytes[..half]).map_err(|e| ckpt_err(path, e))?;
    f.flush().map_err(|e| ckpt_err(path, e))?;
    opts.write_point();
    f.write_all(&bytes[half..]).map_err(|e| ckpt_err(path, e))?;
    f.sync_all().map_err(|e| ckpt_err(path, e))
}

/// Metadata entry of a tensor before its shards are known.
pub(super) fn tensor_entry(
    shape: &[usize],
    dtype: DType,
    layout: &crate::Layout,
) -> Option<TensorMetadata> {
    Some(TensorMetadata {
        shape: shape.to_vec(),
        dtype: format::dtype_name(dtype)?,
        mesh_axes: layout.mesh.axes().to_vec(),
        sharding_spec: layout.sharding_spec(),
        shards: Vec::new(),
    })
}
