//! Data prepared once per SPMD launch: rank 0 prepares it (loads the reviews, fits the
//! vectorizer, vectorises the splits) and sends the result to every other rank as one buffer,
//! instead of every rank doing the same work (8 ranks on 2 cores spent 10-12 s each preparing
//! the IMDB data; NOTES.md, sessions 73-74).
//!
//! The buffer is a [safetensors](https://huggingface.co/docs/safetensors) file held in memory:
//! named 1-D arrays of little-endian integers plus string metadata (a vectorizer as JSON),
//! written by [`Writer`] and read back, checked, by [`Reader`]. Used by the MLP's TF-IDF
//! counts (`train::prepare_once`) and the transformer's token ids
//! (`transformer_train::TextData::prepare_once`).

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::Duration;

use burn_dtensor::spmd::World;
use safetensors::{Dtype, SafeTensors, tensor::TensorView};

use crate::data::DataError;

/// How long the other ranks of [`once_per_launch`] wait for rank 0's data: long enough for a
/// download of the archive (84 MB) on a slow link. A rank 0 that fails or panics ends the launch
/// at once instead.
pub const PREPARE_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// Runs `prepare` on rank 0 only and gives every rank its result: rank 0 broadcasts `encode`'s
/// bytes ([`World::broadcast_bytes`]) and every other rank `decode`s them. In a world of one
/// this is `prepare()`.
///
/// A collective: every rank calls it at the same point, with `what` naming the data in a
/// timeout's message. The other ranks wait for rank 0 up to [`PREPARE_TIMEOUT`] (or the
/// collective timeout, if longer), not the collective timeout: on a first run rank 0 may be
/// downloading the archive. Rank 0 sends an empty buffer when `prepare` or `encode` fails, so
/// the others stop waiting at once.
///
/// # Errors
/// On rank 0 the errors of `prepare` and `encode`; on the other ranks
/// [`DataError::SharedPreparation`] saying that rank 0 failed (its own message says why), or
/// `decode`'s errors.
pub fn once_per_launch<T, E: From<DataError>>(
    world: &World,
    what: &str,
    prepare: impl FnOnce() -> Result<T, E>,
    encode: impl FnOnce(&T) -> Result<Vec<u8>, DataError>,
    decode: impl FnOnce(&[u8]) -> Result<T, E>,
) -> Result<T, E> {
    if world.size() == 1 {
        return prepare();
    }
    if world.rank() == 0 {
        let prepared = prepare().and_then(|t| Ok((encode(&t)?, t)));
        // An empty buffer tells the others that rank 0 failed (they do not wait for a
        // collective that never comes).
        let (bytes, t) = match prepared {
            Ok((bytes, t)) => (bytes, Ok(t)),
            Err(e) => (Vec::new(), Err(e)),
        };
        world.broadcast_bytes(bytes, 0, what);
        t
    } else {
        let before = burn_dtensor::config();
        let patient = before.collective_timeout.max(PREPARE_TIMEOUT);
        burn_dtensor::configure(before.with_collective_timeout(patient));
        let bytes = world.broadcast_bytes(Vec::new(), 0, what);
        burn_dtensor::configure(before);
        if bytes.is_empty() {
            return Err(
                shared("rank 0 could not prepare the data (its own error says why)").into(),
            );
        }
        decode(&bytes)
    }
}

/// A [`DataError::SharedPreparation`] with `reason`.
pub fn shared(reason: impl Into<String>) -> DataError {
    DataError::SharedPreparation {
        reason: reason.into(),
    }
}

/// Builds the buffer: named 1-D arrays and string metadata. The arrays are borrowed, not copied
/// (on a little-endian machine): the one copy is [`finish`](Self::finish)'s.
#[derive(Debug, Default)]
pub struct Writer<'a> {
    arrays: Vec<(String, Dtype, usize, Cow<'a, [u8]>)>,
    metadata: HashMap<String, String>,
}

/// `values` as little-endian bytes: borrowed where that is their memory, else converted.
fn le_bytes<T: bytemuck::Pod, const N: usize>(
    values: &[T],
    to_le: impl Fn(&T) -> [u8; N],
) -> Cow<'_, [u8]> {
    if cfg!(target_endian = "little") {
        Cow::Borrowed(bytemuck::cast_slice(values))
    } else {
        Cow::Owned(values.iter().flat_map(to_le).collect())
    }
}

impl<'a> Writer<'a> {
    /// An empty buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the metadata entry `key` (replacing one of the same key).
    pub fn metadata(mut self, key: &str, value: String) -> Self {
        self.metadata.insert(key.to_owned(), value);
        self
    }

    fn push(mut self, name: &str, dtype: Dtype, len: usize, bytes: Cow<'a, [u8]>) -> Self {
        self.arrays.push((name.to_owned(), dtype, len, bytes));
        self
    }

    /// Adds the array `name` of bytes (`U8`).
    pub fn u8s(self, name: &str, values: &'a [u8]) -> Self {
        self.push(name, Dtype::U8, values.len(), Cow::Borrowed(values))
    }

    /// Adds the array `name` of `u32`s (`U32`, little-endian).
    pub fn u32s(self, name: &str, values: &'a [u32]) -> Self {
        let bytes = le_bytes(values, |x| x.to_le_bytes());
        self.push(name, Dtype::U32, values.len(), bytes)
    }

    /// Adds the array `name` of `u64`s (`U64`, little-endian).
    pub fn u64s(self, name: &str, values: &'a [u64]) -> Self {
        let bytes = le_bytes(values, |x| x.to_le_bytes());
        self.push(name, Dtype::U64, values.len(), bytes)
    }

    /// The safetensors bytes.
    ///
    /// # Errors
    /// [`DataError::SharedPreparation`] when safetensors refuses an array (two of one name).
    pub fn finish(self) -> Result<Vec<u8>, DataError> {
        let views = self
            .arrays
            .iter()
            .map(|(name, dtype, len, bytes)| {
                TensorView::new(*dtype, vec![*len], bytes)
                    .map(|v| (name.as_str(), v))
                    .map_err(|e| shared(e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let metadata = (!self.metadata.is_empty()).then_some(self.metadata);
        safetensors::serialize(views, metadata).map_err(|e| shared(e.to_string()))
    }
}

/// Reads a [`Writer`]'s buffer back; every accessor checks what it reads.
pub struct Reader<'a> {
    arrays: SafeTensors<'a>,
    metadata: HashMap<String, String>,
}

impl<'a> Reader<'a> {
    /// Parses `bytes`.
    ///
    /// # Errors
    /// [`DataError::SharedPreparation`] for bytes that are not a safetensors buffer (truncated,
    /// foreign).
    pub fn parse(bytes: &'a [u8]) -> Result<Self, DataError> {
        let (_, header) = SafeTensors::read_metadata(bytes).map_err(|e| shared(e.to_string()))?;
        let arrays = SafeTensors::deserialize(bytes).map_err(|e| shared(e.to_string()))?;
        Ok(Self {
            arrays,
            metadata: header.metadata().clone().unwrap_or_default(),
        })
    }

    /// The metadata entry `key`.
    ///
    /// # Errors
    /// [`DataError::SharedPreparation`] when it is missing.
    pub fn metadata(&self, key: &str) -> Result<&str, DataError> {
        self.metadata
            .get(key)
            .map(String::as_str)
            .ok_or_else(|| shared(format!("no {key} in the buffer's metadata")))
    }

    fn array(&self, name: &str, dtype: Dtype) -> Result<&'a [u8], DataError> {
        let t = self
            .arrays
            .tensor(name)
            .map_err(|e| shared(e.to_string()))?;
        if t.dtype() != dtype {
            return Err(shared(format!(
                "{name} is {:?}, expected {dtype:?}",
                t.dtype()
            )));
        }
        Ok(t.data())
    }

    /// The array `name` of bytes.
    ///
    /// # Errors
    /// [`DataError::SharedPreparation`] when it is missing or not `U8`.
    pub fn u8s(&self, name: &str) -> Result<Vec<u8>, DataError> {
        Ok(self.array(name, Dtype::U8)?.to_vec())
    }

    /// The array `name` of `u32`s.
    ///
    /// # Errors
    /// [`DataError::SharedPreparation`] when it is missing or not `U32`.
    pub fn u32s(&self, name: &str) -> Result<Vec<u32>, DataError> {
        let bytes = self.array(name, Dtype::U32)?;
        let le = |c: &[u8]| u32::from_le_bytes(c.try_into().expect("chunks of 4 bytes"));
        Ok(bytes.chunks_exact(4).map(le).collect())
    }

    /// The array `name` of `u64`s.
    ///
    /// # Errors
    /// [`DataError::SharedPreparation`] when it is missing or not `U64`.
    pub fn u64s(&self, name: &str) -> Result<Vec<u64>, DataError> {
        let bytes = self.array(name, Dtype::U64)?;
        let le = |c: &[u8]| u64::from_le_bytes(c.try_into().expect("chunks of 8 bytes"));
        Ok(bytes.chunks_exact(8).map(le).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrays_and_metadata_round_trip_and_are_checked_on_reading() {
        let bytes = Writer::new()
            .metadata("what", "{\"a\": 1}".into())
            .u8s("labels", &[0, 1, 1])
            .u32s("ids", &[7, u32::MAX, 0])
            .u64s("offsets", &[0, 1 << 40])
            .finish()
            .unwrap();
        let r = Reader::parse(&bytes).unwrap();
        assert_eq!(r.metadata("what").unwrap(), "{\"a\": 1}");
        assert_eq!(r.u8s("labels").unwrap(), vec![0, 1, 1]);
        assert_eq!(r.u32s("ids").unwrap(), vec![7, u32::MAX, 0]);
        assert_eq!(r.u64s("offsets").unwrap(), vec![0, 1 << 40]);
        let shared_err = |r: Result<(), DataError>| matches!(r, Err(DataError::SharedPreparation { reason }) if !reason.is_empty());
        assert!(
            shared_err(r.u32s("labels").map(drop)),
            "a U8 array read as U32"
        );
        assert!(shared_err(r.u8s("missing").map(drop)));
        assert!(shared_err(r.metadata("missing").map(drop)));
        assert!(shared_err(
            Reader::parse(&bytes[..bytes.len() / 2]).map(drop)
        ));
        assert!(shared_err(Reader::parse(b"not a buffer").map(drop)));
    }
}
