//! Data prepared once per SPMD launch: rank 0 prepares it (loads the reviews, fits the
//! vectorizer, vectorises the splits) and sends the result to every other rank, instead of
//! every rank doing the same work (8 ranks on 2 cores spent 10-12 s each preparing the IMDB
//! data; NOTES.md, sessions 73-74).
//!
//! What goes over the wire is a [safetensors](https://huggingface.co/docs/safetensors) file:
//! named 1-D arrays of little-endian integers plus string metadata (a vectorizer as JSON),
//! built by [`Writer`] and read back, checked, by [`Reader`]. It is sent in parts, the header
//! then each array in the header's order, and every array is received straight into the typed
//! vector it ends in ([`World::broadcast_into`]): no rank holds the file as one buffer beside
//! the arrays (NOTES.md, session 76). The parts joined are the file (tested against
//! safetensors' own reader). Used by the MLP's TF-IDF counts (`train::prepare_once`) and the
//! transformer's token ids (`transformer_train::TextData::prepare_once`).

use std::collections::HashMap;
use std::time::Duration;

use burn_dtensor::spmd::World;
use safetensors::tensor::{Dtype, Metadata, TensorInfo};

use crate::data::DataError;

/// How long the other ranks of [`once_per_launch`] wait for rank 0's data: long enough for a
/// download of the archive (84 MB) on a slow link. A rank 0 that fails or panics ends the launch
/// at once instead.
pub const PREPARE_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// Runs `prepare` on rank 0 only and gives every rank its result: rank 0 sends `encode`'s
/// [`Writer`] (its header with [`World::broadcast_bytes`], then each array with
/// [`World::broadcast_into`]), every other rank receives it as a [`Reader`] and `decode`s that.
/// In a world of one this is `prepare()`.
///
/// A collective: every rank calls it at the same point, with `what` naming the data in a
/// timeout's message. The other ranks wait for rank 0 up to [`PREPARE_TIMEOUT`] (or the
/// collective timeout, if longer), not the collective timeout: on a first run rank 0 may be
/// downloading the archive. Rank 0 sends an empty header when `prepare` or `encode` fails, so
/// the others stop waiting at once.
///
/// # Errors
/// On rank 0 the errors of `prepare` and `encode`; on the other ranks
/// [`DataError::SharedPreparation`] saying that rank 0 failed (its own message says why) or
/// that the header was malformed, or `decode`'s errors.
pub fn once_per_launch<T, E: From<DataError>>(
    world: &World,
    what: &str,
    prepare: impl FnOnce() -> Result<T, E>,
    encode: impl for<'a> FnOnce(&'a mut T) -> Result<Writer<'a>, DataError>,
    decode: impl FnOnce(Reader) -> Result<T, E>,
) -> Result<T, E> {
    if world.size() == 1 {
        return prepare();
    }
    let send = |buf: &mut [u8]| {
        world
            .broadcast_into(buf, 0, what)
            .map_err(|e| shared(e.to_string()))
    };
    if world.rank() == 0 {
        let mut t = match prepare() {
            Ok(t) => t,
            Err(e) => return Err(fail(world, what, e)),
        };
        let (header, mut arrays) = match encode(&mut t).and_then(Writer::into_parts) {
            Ok(parts) => parts,
            Err(e) => return Err(fail(world, what, e.into())),
        };
        world.broadcast_bytes(header, 0, what);
        for array in &mut arrays {
            send(array.bytes_mut())?;
        }
        drop(arrays);
        Ok(t)
    } else {
        let before = burn_dtensor::config();
        let patient = before.collective_timeout.max(PREPARE_TIMEOUT);
        burn_dtensor::configure(before.with_collective_timeout(patient));
        let header = world.broadcast_bytes(Vec::new(), 0, what);
        burn_dtensor::configure(before);
        if header.is_empty() {
            return Err(
                shared("rank 0 could not prepare the data (its own error says why)").into(),
            );
        }
        decode(Reader::receive(&header, send)?)
    }
}

/// Rank 0's `e`, after an empty header has told the others that it failed (so that they do not
/// wait for a collective that never comes).
fn fail<E>(world: &World, what: &str, e: E) -> E {
    world.broadcast_bytes(Vec::new(), 0, what);
    e
}

/// A [`DataError::SharedPreparation`] with `reason`.
pub fn shared(reason: impl Into<String>) -> DataError {
    DataError::SharedPreparation {
        reason: reason.into(),
    }
}

/// The bytes of one array on their way out: the array's own memory where that is its
/// little-endian form, else a little-endian copy.
#[derive(Debug)]
pub enum ArrayBytes<'a> {
    /// The array's memory (a little-endian machine, or bytes).
    Borrowed(&'a mut [u8]),
    /// A little-endian copy (a big-endian machine).
    Owned(Vec<u8>),
}

impl ArrayBytes<'_> {
    /// The bytes (mutable because MPI's broadcast takes one buffer for both ends; the root's is
    /// only read).
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Self::Borrowed(b) => b,
            Self::Owned(v) => v,
        }
    }
}

/// An element type of the file's arrays: `u8`, `u32` or `u64` (safetensors' `U8`, `U32`,
/// `U64`).
pub trait Element: bytemuck::Pod + sealed::Sealed {
    /// Its safetensors type.
    const DTYPE: Dtype;
    /// `self` from little-endian to native order and back (the same swap).
    fn swap_le(self) -> Self;
    #[doc(hidden)]
    fn wrap(values: Vec<Self>) -> Array;
    #[doc(hidden)]
    fn unwrap(array: Array) -> Option<Vec<Self>>;
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! element {
    ($t:ty, $dtype:ident) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: Dtype = Dtype::$dtype;
            fn swap_le(self) -> Self {
                <$t>::from_le(self)
            }
            fn wrap(values: Vec<Self>) -> Array {
                Array::$dtype(values)
            }
            fn unwrap(array: Array) -> Option<Vec<Self>> {
                match array {
                    Array::$dtype(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}
element!(u8, U8);
element!(u32, U32);
element!(u64, U64);

/// One received array, in its final type.
#[doc(hidden)]
#[derive(Debug)]
pub enum Array {
    U8(Vec<u8>),
    U32(Vec<u32>),
    U64(Vec<u64>),
}

impl Array {
    fn dtype(&self) -> Dtype {
        match self {
            Array::U8(_) => Dtype::U8,
            Array::U32(_) => Dtype::U32,
            Array::U64(_) => Dtype::U64,
        }
    }

    /// A zeroed array of `len` `T`s whose bytes `receive` fills (little-endian).
    fn receive<T: Element>(
        len: usize,
        receive: &mut impl FnMut(&mut [u8]) -> Result<(), DataError>,
    ) -> Result<Self, DataError> {
        let mut v = vec![T::zeroed(); len];
        receive(bytemuck::cast_slice_mut(&mut v))?;
        if cfg!(target_endian = "big") {
            v.iter_mut().for_each(|x| *x = x.swap_le());
        }
        Ok(T::wrap(v))
    }
}

/// Builds the file: named 1-D arrays and string metadata. The arrays are borrowed, not copied
/// (on a little-endian machine), and sent from where they are.
#[derive(Debug, Default)]
pub struct Writer<'a> {
    arrays: Vec<(String, Dtype, ArrayBytes<'a>)>,
    metadata: HashMap<String, String>,
}

impl<'a> Writer<'a> {
    /// An empty file.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the metadata entry `key` (replacing one of the same key).
    pub fn metadata(mut self, key: &str, value: String) -> Self {
        self.metadata.insert(key.to_owned(), value);
        self
    }

    /// Adds the array `name` (1-D, little-endian), sent from `values`' own memory on a
    /// little-endian machine.
    pub fn array<T: Element>(mut self, name: &str, values: &'a mut [T]) -> Self {
        let bytes = if cfg!(target_endian = "little") {
            ArrayBytes::Borrowed(bytemuck::cast_slice_mut(values))
        } else {
            let le: Vec<T> = values.iter().map(|x| x.swap_le()).collect();
            ArrayBytes::Owned(bytemuck::cast_slice(&le).to_vec())
        };
        self.arrays.push((name.to_owned(), T::DTYPE, bytes));
        self
    }

    /// The file in parts: its header (the 8-byte little-endian header length, then the JSON
    /// header, padded with spaces to a multiple of 8 bytes, as safetensors writes it) and each
    /// array's bytes in the header's order (as safetensors orders them: by decreasing alignment,
    /// then by name). Joined, they are the safetensors file.
    ///
    /// # Errors
    /// [`DataError::SharedPreparation`] when safetensors refuses the header (two arrays of one
    /// name).
    pub fn into_parts(mut self) -> Result<(Vec<u8>, Vec<ArrayBytes<'a>>), DataError> {
        self.arrays
            .sort_by(|(a, da, ..), (b, db, ..)| db.cmp(da).then_with(|| a.cmp(b)));
        let mut names = std::collections::HashSet::new();
        if let Some((name, ..)) = self.arrays.iter().find(|(n, ..)| !names.insert(n)) {
            return Err(shared(format!("two arrays named {name}")));
        }
        let mut offset = 0;
        let mut infos = Vec::with_capacity(self.arrays.len());
        let mut parts = Vec::with_capacity(self.arrays.len());
        for (name, dtype, mut bytes) in self.arrays {
            let n = bytes.bytes_mut().len();
            let info = TensorInfo {
                dtype,
                shape: vec![n * 8 / dtype.bitsize()],
                data_offsets: (offset, offset + n),
            };
            offset += n;
            infos.push((name, info));
            parts.push(bytes);
        }
        let metadata = (!self.metadata.is_empty()).then_some(self.metadata);
        let header = Metadata::new(metadata, infos).map_err(|e| shared(e.to_string()))?;
        let mut json = serde_json::to_vec(&header).map_err(|e| shared(e.to_string()))?;
        json.resize(json.len().next_multiple_of(8), b' ');
        let mut out = (json.len() as u64).to_le_bytes().to_vec();
        out.extend(json);
        Ok((out, parts))
    }
}

/// A [`Writer`]'s file, received: every accessor checks what it reads and hands the array over
/// (each can be taken once).
#[derive(Debug)]
pub struct Reader {
    arrays: HashMap<String, Array>,
    metadata: HashMap<String, String>,
}

impl Reader {
    /// Parses the file's `header` ([`Writer::into_parts`]'s first part) and receives each of
    /// its arrays with `receive`, in the header's order, into a zeroed vector of the array's
    /// type whose bytes `receive` fills.
    ///
    /// # Errors
    /// [`DataError::SharedPreparation`] for a header that is not a safetensors header
    /// (truncated, foreign); for one that names an array of a type other than `U8`, `U32` and
    /// `U64` or not 1-D (after receiving every array, so that a sender is not left waiting);
    /// and `receive`'s errors.
    pub fn receive(
        header: &[u8],
        mut receive: impl FnMut(&mut [u8]) -> Result<(), DataError>,
    ) -> Result<Self, DataError> {
        let json = header
            .split_first_chunk::<8>()
            .filter(|(n, json)| u64::from_le_bytes(**n) == json.len() as u64)
            .map(|(_, json)| json)
            .ok_or_else(|| shared("the header's length does not match its bytes"))?;
        let header: Metadata = serde_json::from_slice(json).map_err(|e| shared(e.to_string()))?;
        let (mut arrays, mut refused) = (HashMap::new(), None);
        for name in header.offset_keys() {
            let info = header.info(&name).expect("a name of the header");
            let array = match (info.dtype, &info.shape[..]) {
                (Dtype::U8, &[len]) => Array::receive::<u8>(len, &mut receive)?,
                (Dtype::U32, &[len]) => Array::receive::<u32>(len, &mut receive)?,
                (Dtype::U64, &[len]) => Array::receive::<u64>(len, &mut receive)?,
                (dtype, shape) => {
                    // Received all the same, so that the sender is not left waiting.
                    let (start, end) = info.data_offsets;
                    receive(&mut vec![0; end - start])?;
                    refused.get_or_insert(format!(
                        "{name} is {dtype:?} of shape {shape:?}, not a 1-D U8, U32 or U64 array"
                    ));
                    continue;
                }
            };
            arrays.insert(name, array);
        }
        if let Some(reason) = refused {
            return Err(shared(reason));
        }
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
            .ok_or_else(|| shared(format!("no {key} in the file's metadata")))
    }

    /// Takes the array `name` of `T`s.
    ///
    /// # Errors
    /// [`DataError::SharedPreparation`] when it is missing, taken already or of another type.
    pub fn take<T: Element>(&mut self, name: &str) -> Result<Vec<T>, DataError> {
        let array = self.arrays.remove(name).ok_or_else(|| {
            shared(format!(
                "no array {name} in the file (or it was taken already)"
            ))
        })?;
        let got = array.dtype();
        T::unwrap(array)
            .ok_or_else(|| shared(format!("{name} is {got:?}, expected {:?}", T::DTYPE)))
    }
}

/// `writer`'s file sent through memory, as [`once_per_launch`] sends it between processes: for
/// tests of an `encode`/`decode` pair.
///
/// # Errors
/// [`Writer::into_parts`]'s and [`Reader::receive`]'s.
pub fn loopback(writer: Writer<'_>) -> Result<Reader, DataError> {
    let (header, mut arrays) = writer.into_parts()?;
    let mut arrays = arrays.iter_mut();
    Reader::receive(&header, |buf| {
        let sent = arrays
            .next()
            .ok_or_else(|| shared("more arrays received than sent"))?
            .bytes_mut();
        if sent.len() != buf.len() {
            return Err(shared(format!(
                "{} bytes sent, {} expected",
                sent.len(),
                buf.len()
            )));
        }
        buf.copy_from_slice(sent);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::SafeTensors;

    fn shared_err<T>(r: Result<T, DataError>) -> bool {
        matches!(r, Err(DataError::SharedPreparation { reason }) if !reason.is_empty())
    }

    #[test]
    fn arrays_and_metadata_round_trip_and_are_checked_on_reading() {
        let (mut labels, mut ids, mut offsets) = (
            vec![0u8, 1, 1],
            vec![7u32, u32::MAX, 0],
            vec![0u64, 1 << 40],
        );
        let w = Writer::new()
            .metadata("what", "{\"a\": 1}".into())
            .array("labels", &mut labels)
            .array("ids", &mut ids)
            .array("offsets", &mut offsets);
        let mut r = loopback(w).unwrap();
        assert_eq!(r.metadata("what").unwrap(), "{\"a\": 1}");
        assert_eq!(r.take::<u8>("labels").unwrap(), [0, 1, 1]);
        assert_eq!(r.take::<u32>("ids").unwrap(), [7, u32::MAX, 0]);
        assert!(shared_err(r.take::<u32>("ids")), "an array taken twice");
        assert!(
            shared_err(r.take::<u32>("offsets")),
            "a U64 array taken as U32"
        );
        assert!(shared_err(r.take::<u8>("missing")));
        assert!(shared_err(r.metadata("missing")));
        // Two of one name, of other types, with another type sorted between them.
        let mut between = vec![1u32];
        let twice = Writer::new()
            .array("ids", &mut labels)
            .array("other", &mut between)
            .array("ids", &mut offsets);
        assert!(shared_err(twice.into_parts()), "two arrays of one name");
    }

    /// The parts joined are a safetensors file that safetensors' own reader reads back: the
    /// independent oracle for the header and the arrays' order and bytes.
    #[test]
    fn the_parts_joined_are_the_safetensors_file() {
        let (mut a, mut b, mut c) = (vec![3u8, 4], vec![1u32, 2, 3], vec![9u64]);
        let w = Writer::new()
            .metadata("k", "v".into())
            .array("z.bytes", &mut a)
            .array("a.u32", &mut b)
            .array("m.u64", &mut c);
        let (header, mut parts) = w.into_parts().unwrap();
        assert_eq!(header.len() % 8, 0, "the header padded to 8 bytes");
        let mut file = header.clone();
        parts
            .iter_mut()
            .for_each(|p| file.extend_from_slice(p.bytes_mut()));
        let st = SafeTensors::deserialize(&file).unwrap();
        let le = |v: &[u32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        assert_eq!(st.tensor("z.bytes").unwrap().data(), [3, 4]);
        assert_eq!(st.tensor("a.u32").unwrap().data(), le(&[1, 2, 3]));
        assert_eq!(st.tensor("m.u64").unwrap().dtype(), Dtype::U64);
        assert_eq!(st.tensor("m.u64").unwrap().data(), 9u64.to_le_bytes());
        let (_, meta) = SafeTensors::read_metadata(&file).unwrap();
        assert_eq!(meta.metadata().as_ref().unwrap()["k"], "v");
    }

    #[test]
    fn a_malformed_header_or_a_failed_receive_is_a_typed_error() {
        let mut ids = vec![1u32, 2];
        let (header, _) = Writer::new().array("ids", &mut ids).into_parts().unwrap();
        let ok = |_: &mut [u8]| Ok(());
        assert!(Reader::receive(&header, ok).is_ok());
        assert!(shared_err(Reader::receive(&header[..header.len() - 1], ok)));
        assert!(shared_err(Reader::receive(&header[..4], ok)));
        assert!(shared_err(Reader::receive(b"not a header", ok)));
        let mut foreign = header.clone();
        let json = String::from_utf8(foreign[8..].to_vec())
            .unwrap()
            .replace("U32", "F32");
        foreign.truncate(8);
        foreign.extend(json.into_bytes());
        let mut calls = 0;
        let counted = |_: &mut [u8]| {
            calls += 1;
            Ok(())
        };
        assert!(
            shared_err(Reader::receive(&foreign, counted)),
            "an F32 array"
        );
        assert_eq!(calls, 1, "the refused array is received all the same");
        let failed = |_: &mut [u8]| Err(shared("the link went down"));
        assert!(shared_err(Reader::receive(&header, failed)));
    }
}
