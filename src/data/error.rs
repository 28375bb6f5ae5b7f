//! Typed errors of the data pipeline: the IMDB loader ([`super::imdb`]) and the TF-IDF
//! vectorizer ([`super::tfidf`]).
//!
//! Every variant that concerns a file names the path, and its message ends with a `fix:` hint
//! saying what to do about it.

use std::io;
use std::path::PathBuf;

/// How a user points the loader at a local copy of the data; repeated in several messages.
const POINT_AT_LOCAL_COPY: &str = "pass `--data PATH` or set the environment variable \
`IMDB_DATA=PATH`, where PATH is the archive aclImdb_v1.tar.gz or the extracted `aclImdb` \
directory (or the directory that contains it)";

/// Errors of the IMDB loader and the TF-IDF vectorizer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    /// A path given explicitly (`--data`, `IMDB_DATA`, or an argument of
    /// [`super::imdb::load`]) does not exist.
    #[error(
        "IMDB data path {} (from {origin}) does not exist; fix: {}",
        path.display(),
        POINT_AT_LOCAL_COPY
    )]
    PathNotFound {
        /// The missing path.
        path: PathBuf,
        /// Where the path came from (`--data`, `IMDB_DATA`, `load()` ...).
        origin: String,
    },

    /// The path is a file, but not a gzip-compressed tar archive (wrong magic bytes).
    #[error(
        "{} is neither a directory nor a gzip-compressed tar archive ({reason}); fix: {}",
        path.display(),
        POINT_AT_LOCAL_COPY
    )]
    NotAnArchive {
        /// The offending file.
        path: PathBuf,
        /// What was found instead.
        reason: String,
    },

    /// The file starts like a gzip archive but cannot be decompressed or un-tarred to the end:
    /// truncated download, garbage bytes, bad checksum.
    #[error(
        "corrupt or truncated archive {}: {source}; fix: delete it and download it again \
         (or extract a good copy and point at the directory with `--data`/`IMDB_DATA`)",
        path.display()
    )]
    CorruptArchive {
        /// The archive.
        path: PathBuf,
        /// The decompression or tar error.
        #[source]
        source: io::Error,
    },

    /// A directory that contains neither `train/`+`test/` nor an `aclImdb/` sub-directory.
    #[error(
        "{} is not an aclImdb directory: it has no `train`/`test` sub-directories and no \
         `aclImdb` sub-directory; fix: {}",
        path.display(),
        POINT_AT_LOCAL_COPY
    )]
    NotImdbDir {
        /// The directory.
        path: PathBuf,
    },

    /// One of the four review groups (`train/pos`, `train/neg`, `test/pos`, `test/neg`) is
    /// missing or empty.
    #[error(
        "found {found} reviews in {group} in {}: expected the aclImdb layout \
         aclImdb/{{train,test}}/{{pos,neg}}/<id>_<rating>.txt; fix: use the complete archive \
         aclImdb_v1.tar.gz or a complete extracted copy ({})",
        path.display(),
        POINT_AT_LOCAL_COPY
    )]
    MissingReviews {
        /// The archive or directory that was read.
        path: PathBuf,
        /// The group, e.g. `"test/neg"`.
        group: String,
        /// How many reviews were found (0 in practice).
        found: usize,
    },

    /// A `.txt` file in a `pos`/`neg` directory whose name is not `<id>_<rating>.txt`.
    #[error(
        "review file {} is not named <id>_<rating>.txt (both decimal numbers, e.g. \
         `123_8.txt`); fix: remove or rename it, or use an unmodified copy of aclImdb",
        file.display()
    )]
    BadFileName {
        /// The file (a path inside the archive, or on disk).
        file: PathBuf,
    },

    /// Two review files of the same split and label have the same numeric id.
    #[error(
        "duplicate review id {id} in {group} of {} (second copy: {}); fix: use an unmodified \
         copy of aclImdb with one file per id",
        path.display(),
        file.display()
    )]
    DuplicateReview {
        /// The archive or directory that was read.
        path: PathBuf,
        /// The group, e.g. `"train/pos"`.
        group: String,
        /// The repeated id.
        id: u32,
        /// One of the files carrying it.
        file: PathBuf,
    },

    /// Reading or writing a file failed.
    #[error("I/O error on {}: {source}; fix: check that the path is readable/writable", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// Downloading the archive failed (typically: no internet access).
    #[error(
        "could not download the IMDB archive from {url} to {}: {reason}; fix: download it on \
         a machine with internet access (or copy it) and {}",
        cache_path.display(),
        POINT_AT_LOCAL_COPY
    )]
    Download {
        /// The URL that was tried.
        url: String,
        /// What went wrong.
        reason: String,
        /// Where the archive would have been stored.
        cache_path: PathBuf,
    },

    /// No data given, nothing in the cache, and automatic download disabled.
    #[error(
        "no IMDB data found: no `--data`, no `IMDB_DATA`, and neither {} nor {} exists \
         (automatic download is disabled); fix: {}",
        archive.display(),
        extracted.display(),
        POINT_AT_LOCAL_COPY
    )]
    NotFound {
        /// The cached archive path that was looked at.
        archive: PathBuf,
        /// The cached extracted directory that was looked at.
        extracted: PathBuf,
    },

    /// The platform has no per-user cache directory (`dirs::cache_dir()` is `None`).
    #[error(
        "no per-user cache directory on this system to store the IMDB archive; fix: {}",
        POINT_AT_LOCAL_COPY
    )]
    NoCacheDir,

    /// `max_tokens` below 2 (the vocabulary needs the OOV slot plus at least one term).
    #[error(
        "max_tokens must be at least 2 (index 0 is the OOV bucket), got {max_tokens}; fix: \
         use e.g. 1200 as in the TensorFlow DTensor tutorial"
    )]
    InvalidMaxTokens {
        /// The rejected value.
        max_tokens: usize,
    },

    /// `max_tokens` of an integer-sequence vectorizer below 3 (index 0 is the padding, 1 the
    /// OOV bucket, and the vocabulary needs at least one term).
    #[error(
        "max_tokens must be at least 3 for integer sequences (index 0 is padding, 1 the OOV \
         bucket), got {max_tokens}; fix: use e.g. 20000 as in Keras' transformer example"
    )]
    InvalidSequenceTokens {
        /// The rejected value.
        max_tokens: usize,
    },

    /// `output_sequence_length` of an integer-sequence vectorizer is 0.
    #[error(
        "the output sequence length must be at least 1, got 0; fix: use e.g. 200 as in Keras' \
         transformer example (`--seq-len`)"
    )]
    InvalidSequenceLength,

    /// `fit` was called with zero documents.
    #[error("cannot fit a TF-IDF vectorizer on zero documents; fix: pass the training texts")]
    EmptyCorpus,

    /// The fitted documents contain no token at all (all empty, whitespace or punctuation).
    #[error(
        "the {documents} fitted documents contain no tokens (only whitespace/punctuation); \
         fix: fit on real text"
    )]
    NoTokens {
        /// Number of documents that were fitted.
        documents: usize,
    },

    /// A multi-process launch's shared preparation ([`crate::shared_data::once_per_launch`]:
    /// `train::prepare_once`, `TextData::prepare_once`) failed on the receiving side: rank 0
    /// failed, or its file did not decode (a malformed header, an array missing or of another
    /// type, or data that does not fit).
    #[error(
        "the IMDB data prepared by rank 0 could not be used: {reason}; fix: see rank 0's error, \
         or run every rank from the same build"
    )]
    SharedPreparation {
        /// What went wrong.
        reason: String,
    },

    /// Sparse term counts do not fit the vectorizer they are weighed with.
    #[error(
        "sparse term counts do not fit the TF-IDF vectorizer: {reason}; fix: count them with \
         `TfIdfVectorizer::count_rows` of the same vectorizer"
    )]
    InvalidCounts {
        /// What does not fit.
        reason: String,
    },

    /// A serialized vectorizer is inconsistent (e.g. vocabulary and idf lengths differ).
    #[error("invalid TF-IDF vectorizer state: {reason}; fix: re-fit and save it again")]
    InvalidVectorizer {
        /// What is inconsistent.
        reason: String,
    },

    /// JSON (de)serialization of a vectorizer failed.
    #[error("JSON error in {}: {source}; fix: re-fit and save the vectorizer again", path.display())]
    Json {
        /// The JSON file.
        path: PathBuf,
        /// The serde_json error.
        #[source]
        source: serde_json::Error,
    },
}

impl DataError {
    /// Shorthand for [`DataError::Io`].
    pub(crate) fn io(path: impl Into<PathBuf>, source: io::Error) -> Self {
        DataError::Io {
            path: path.into(),
            source,
        }
    }
}
