//! JSON files of the fitted vectorizers: one writer and one reader with the pipeline's typed
//! errors (the file named in each).

use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::error::DataError;

/// Writes `value` as JSON to `path`, with a final newline.
///
/// # Errors
/// [`DataError::Io`] or [`DataError::Json`].
pub(crate) fn save<T: Serialize>(value: &T, path: &Path) -> Result<(), DataError> {
    let file = File::create(path).map_err(|e| DataError::io(path, e))?;
    let mut out = BufWriter::new(file);
    serde_json::to_writer(&mut out, value).map_err(|source| DataError::Json {
        path: path.to_path_buf(),
        source,
    })?;
    out.write_all(b"\n")
        .and_then(|()| out.flush())
        .map_err(|e| DataError::io(path, e))
}

/// Reads a `T` from the JSON file `path` (validation is `T`'s `Deserialize`).
///
/// # Errors
/// [`DataError::Io`], or [`DataError::Json`] for malformed or inconsistent content.
pub(crate) fn load<T: DeserializeOwned>(path: &Path) -> Result<T, DataError> {
    let file = File::open(path).map_err(|e| DataError::io(path, e))?;
    serde_json::from_reader(BufReader::new(file)).map_err(|source| DataError::Json {
        path: path.to_path_buf(),
        source,
    })
}
