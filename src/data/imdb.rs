//! Loader for the Large Movie Review Dataset v1.0 ("aclImdb", Maas et al., 2011, *Learning
//! Word Vectors for Sentiment Analysis*, ACL), the data of TensorFlow's DTensor IMDB tutorial.
//!
//! # Layout
//!
//! The original layout of Stanford's `aclImdb_v1.tar.gz` is read:
//!
//! ```text
//! aclImdb/train/pos/<id>_<rating>.txt   12,500 reviews, label 1 (rating >= 7)
//! aclImdb/train/neg/<id>_<rating>.txt   12,500 reviews, label 0 (rating <= 4)
//! aclImdb/test/pos/<id>_<rating>.txt    12,500 reviews, label 1
//! aclImdb/test/neg/<id>_<rating>.txt    12,500 reviews, label 0
//! ```
//!
//! Everything else (`train/unsup`, `imdb.vocab`, the bag-of-words files, non-`.txt` files)
//! is ignored. Texts are decoded as UTF-8 (invalid sequences replaced by U+FFFD) and kept
//! verbatim, HTML line breaks `<br />` included.
//!
//! # Sources
//!
//! [`load`] reads either an extracted directory (the `aclImdb` directory itself or its parent)
//! or the `.tar.gz` archive directly, streaming it once through gzip and tar without
//! extracting anything. [`resolve_source`] finds the data (`--data`, then `IMDB_DATA`, then the
//! per-user cache) and downloads the official archive into the cache when none holds it.
//!
//! # Order
//!
//! Within each split, reviews are sorted by `(label, id)` ascending: all negative reviews
//! (label 0) by numeric id, then all positive reviews (label 1) by numeric id. The order does
//! not depend on the file system or on the order of the archive; shuffling is left to the
//! (seeded) training code.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fmt;
use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Write};
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use rayon::prelude::*;
use sha2::{Digest, Sha256};

use super::error::DataError;

/// URL of the official archive (about 80 MiB; 84,125,825 bytes).
pub const OFFICIAL_URL: &str = "https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz";

/// SHA-256 of the official archive at [`OFFICIAL_URL`], as published by e.g. TensorFlow
/// Datasets' `imdb_reviews` checksums.
pub const OFFICIAL_SHA256: &str =
    "c40f74a18d3b61f90feba1e17730e0d38e8b97c05fde7008942e91923d1658fe";

/// Environment variable naming the data (archive or extracted directory).
pub const ENV_VAR: &str = "IMDB_DATA";

/// File name of the archive in the cache directory.
pub const ARCHIVE_NAME: &str = "aclImdb_v1.tar.gz";

/// Name of the extracted top-level directory.
pub const EXTRACTED_NAME: &str = "aclImdb";

/// Number of reviews per split in the complete dataset.
pub const REVIEWS_PER_SPLIT: usize = 25_000;

/// One labelled review.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Review {
    /// The review text, verbatim (UTF-8, lossily decoded; contains `<br />` tags).
    pub text: String,
    /// Sentiment label: 0 = negative (`neg/`, rating <= 4), 1 = positive (`pos/`, rating >= 7).
    pub label: u8,
    /// The numeric id from the file name `<id>_<rating>.txt` (unique per split and label).
    pub id: u32,
    /// The star rating from the file name `<id>_<rating>.txt` (1..=10 in the real data).
    pub rating: u8,
}

/// A dataset split.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Split {
    /// `aclImdb/train`.
    Train,
    /// `aclImdb/test`.
    Test,
}

impl Split {
    /// Both splits, train first.
    pub const ALL: [Split; 2] = [Split::Train, Split::Test];

    /// The directory name: `"train"` or `"test"`.
    pub fn dir_name(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Test => "test",
        }
    }

    fn from_dir_name(name: &str) -> Option<Self> {
        match name {
            "train" => Some(Split::Train),
            "test" => Some(Split::Test),
            _ => None,
        }
    }
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.dir_name())
    }
}

/// Directory name of a label: 0 = `"neg"`, 1 = `"pos"`.
fn label_dir(label: u8) -> &'static str {
    if label == 0 { "neg" } else { "pos" }
}

fn label_from_dir(name: &str) -> Option<u8> {
    match name {
        "neg" => Some(0),
        "pos" => Some(1),
        _ => None,
    }
}

/// Both splits of the labelled IMDB data, loaded in one pass.
///
/// Each split is sorted by `(label, id)` ascending (all negatives by id, then all positives
/// by id).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImdbData {
    /// `aclImdb/train/{neg,pos}`: 25,000 reviews in the real data.
    pub train: Vec<Review>,
    /// `aclImdb/test/{neg,pos}`: 25,000 reviews in the real data.
    pub test: Vec<Review>,
}

impl ImdbData {
    /// The reviews of one split.
    pub fn split(&self, split: Split) -> &[Review] {
        match split {
            Split::Train => &self.train,
            Split::Test => &self.test,
        }
    }

    /// Number of reviews with `label` in `split`.
    pub fn count_label(&self, split: Split, label: u8) -> usize {
        self.split(split)
            .iter()
            .filter(|r| r.label == label)
            .count()
    }
}

// ---------------------------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------------------------

/// Loads both splits from `path`: an extracted directory (`aclImdb` itself or its parent) or a
/// gzip-compressed tar archive such as `aclImdb_v1.tar.gz`, read without extracting.
///
/// Order: see [`ImdbData`]. Cost: one pass over the data; the full archive (50,000 labelled
/// reviews) loads in about a second with optimised dependencies.
///
/// # Errors
/// - [`DataError::PathNotFound`]: `path` does not exist;
/// - [`DataError::NotAnArchive`]: a file that is not gzip-compressed;
/// - [`DataError::CorruptArchive`]: a gzip file that is truncated, corrupt or not a tar;
/// - [`DataError::NotImdbDir`]: a directory without `train`/`test` or `aclImdb` inside;
/// - [`DataError::MissingReviews`]: one of `{train,test}/{pos,neg}` is missing or empty;
/// - [`DataError::BadFileName`]: a `.txt` in `pos`/`neg` not named `<id>_<rating>.txt`;
/// - [`DataError::DuplicateReview`]: two files with the same id in the same group;
/// - [`DataError::Io`]: a read error.
pub fn load(path: &Path) -> Result<ImdbData, DataError> {
    let meta = fs::metadata(path).map_err(|e| open_error(path, "imdb::load", e))?;
    if meta.is_dir() {
        load_dir(path)
    } else {
        load_archive(path)
    }
}

/// A review before sorting, with the file it came from (for error messages).
struct RawReview {
    split: Split,
    review: Review,
    file: PathBuf,
}

/// Sorts, checks for duplicates and for missing groups, and splits into train/test.
fn assemble(source: &Path, raw: Vec<RawReview>) -> Result<ImdbData, DataError> {
    let mut train = Vec::new();
    let mut test = Vec::new();
    for r in raw {
        match r.split {
            Split::Train => train.push((r.review, r.file)),
            Split::Test => test.push((r.review, r.file)),
        }
    }
    let mut out = ImdbData::default();
    for (split, mut items) in [(Split::Train, train), (Split::Test, test)] {
        items.sort_unstable_by_key(|(r, _)| (r.label, r.id));
        for label in [0u8, 1] {
            if !items.iter().any(|(r, _)| r.label == label) {
                return Err(DataError::MissingReviews {
                    path: source.to_path_buf(),
                    group: format!("{split}/{}", label_dir(label)),
                    found: 0,
                });
            }
        }
        if let Some(w) = items
            .windows(2)
            .find(|w| (w[0].0.label, w[0].0.id) == (w[1].0.label, w[1].0.id))
        {
            return Err(DataError::DuplicateReview {
                path: source.to_path_buf(),
                group: format!("{split}/{}", label_dir(w[1].0.label)),
                id: w[1].0.id,
                file: w[1].1.clone(),
            });
        }
        let reviews = items.into_iter().map(|(r, _)| r).collect();
        match split {
            Split::Train => out.train = reviews,
            Split::Test => out.test = reviews,
        }
    }
    Ok(out)
}

/// Parses `<id>_<rating>.txt` (`name` is the whole file name, already known to end in `.txt`).
fn parse_file_name(name: &str) -> Option<(u32, u8)> {
    let stem = name.strip_suffix(".txt")?;
    let (id, rating) = stem.split_once('_')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(id) || !digits(rating) {
        return None;
    }
    Some((id.parse().ok()?, rating.parse().ok()?))
}

/// Decodes review bytes as UTF-8, replacing invalid sequences (no copy when valid).
fn decode(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// Finds the `aclImdb` root inside `dir`: `dir` itself when it has `train` or `test`, else
/// `dir/aclImdb`.
fn dataset_root(dir: &Path) -> Result<PathBuf, DataError> {
    if dir.join("train").is_dir() || dir.join("test").is_dir() {
        return Ok(dir.to_path_buf());
    }
    let nested = dir.join(EXTRACTED_NAME);
    if nested.is_dir() {
        return Ok(nested);
    }
    Err(DataError::NotImdbDir {
        path: dir.to_path_buf(),
    })
}

/// Loads an extracted copy: `path` is the `aclImdb` directory or its parent.
///
/// Files are read in parallel (rayon). Order as in [`load`].
///
/// # Errors
/// As [`load`], except [`DataError::NotAnArchive`] and [`DataError::CorruptArchive`].
pub fn load_dir(path: &Path) -> Result<ImdbData, DataError> {
    let root = dataset_root(path)?;
    // Collect (split, label, id, rating, file) for the four groups.
    let mut jobs: Vec<(Split, u8, u32, u8, PathBuf)> = Vec::new();
    for split in Split::ALL {
        for label in [0u8, 1] {
            let dir = root.join(split.dir_name()).join(label_dir(label));
            let entries = match fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    return Err(DataError::MissingReviews {
                        path: root.clone(),
                        group: format!("{split}/{}", label_dir(label)),
                        found: 0,
                    });
                }
                Err(e) => return Err(DataError::io(&dir, e)),
            };
            for entry in entries {
                let entry = entry.map_err(|e| DataError::io(&dir, e))?;
                let file = entry.path();
                let name = entry.file_name();
                let name = name.to_string_lossy();
                if !name.ends_with(".txt") {
                    continue;
                }
                let file_type = entry.file_type().map_err(|e| DataError::io(&file, e))?;
                if file_type.is_dir() {
                    continue;
                }
                let (id, rating) = parse_file_name(&name)
                    .ok_or_else(|| DataError::BadFileName { file: file.clone() })?;
                jobs.push((split, label, id, rating, file));
            }
        }
    }
    let raw = jobs
        .into_par_iter()
        .map(|(split, label, id, rating, file)| {
            let bytes = fs::read(&file).map_err(|e| DataError::io(&file, e))?;
            Ok(RawReview {
                split,
                review: Review {
                    text: decode(bytes),
                    label,
                    id,
                    rating,
                },
                file,
            })
        })
        .collect::<Result<Vec<_>, DataError>>()?;
    assemble(&root, raw)
}

/// The gzip magic bytes.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// `PathNotFound` for a missing path (naming who asked), an I/O error otherwise.
fn open_error(path: &Path, origin: &str, e: io::Error) -> DataError {
    if e.kind() == io::ErrorKind::NotFound {
        DataError::PathNotFound {
            path: path.to_path_buf(),
            origin: origin.into(),
        }
    } else {
        DataError::io(path, e)
    }
}

/// Opens `path` and checks that it starts with the gzip magic bytes.
fn open_gzip(path: &Path) -> Result<File, DataError> {
    let mut file = File::open(path).map_err(|e| open_error(path, "imdb::load_archive", e))?;
    let mut magic = [0u8; 2];
    let mut got = 0;
    while got < 2 {
        match file.read(&mut magic[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(DataError::io(path, e)),
        }
    }
    if got < 2 || magic != GZIP_MAGIC {
        let reason = if got < 2 {
            format!("the file is only {got} byte(s) long")
        } else {
            format!(
                "it starts with bytes {:02x} {:02x}, not the gzip magic 1f 8b",
                magic[0], magic[1]
            )
        };
        return Err(DataError::NotAnArchive {
            path: path.to_path_buf(),
            reason,
        });
    }
    // Re-open rather than seek so that the reader starts at byte 0 on every platform.
    File::open(path).map_err(|e| DataError::io(path, e))
}

/// Where a tar entry belongs, from its path: `.../{train,test}/{pos,neg}/<name>.txt`.
enum EntryKind {
    /// A review file of the given group; the name is still to be parsed.
    Review(Split, u8, String),
    /// Anything else (ignored).
    Other,
}

fn classify_entry(path: &Path) -> EntryKind {
    let parts: Vec<&std::ffi::OsStr> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s),
            _ => None,
        })
        .collect();
    if parts.len() < 3 {
        return EntryKind::Other;
    }
    let n = parts.len();
    let (Some(split), Some(label), Some(name)) = (
        parts[n - 3].to_str().and_then(Split::from_dir_name),
        parts[n - 2].to_str().and_then(label_from_dir),
        parts[n - 1].to_str(),
    ) else {
        return EntryKind::Other;
    };
    if !name.ends_with(".txt") {
        return EntryKind::Other;
    }
    EntryKind::Review(split, label, name.to_owned())
}

/// Loads both splits straight from a gzip-compressed tar archive (e.g. `aclImdb_v1.tar.gz`),
/// in one streaming pass, without extracting.
///
/// Review files are recognised by the last three components of their path,
/// `{train,test}/{pos,neg}/<id>_<rating>.txt` (normally under `aclImdb/`); other entries are
/// skipped. The whole gzip stream is read to its end, so a truncated archive or a bad gzip
/// checksum is an error. Order as in [`load`].
///
/// # Errors
/// As [`load`], except [`DataError::NotImdbDir`].
pub fn load_archive(path: &Path) -> Result<ImdbData, DataError> {
    let file = open_gzip(path)?;
    let corrupt = |source: io::Error| DataError::CorruptArchive {
        path: path.to_path_buf(),
        source,
    };
    let gz = flate2::read::GzDecoder::new(io::BufReader::with_capacity(1 << 16, file));
    let mut archive = tar::Archive::new(gz);
    let mut raw = Vec::with_capacity(2 * REVIEWS_PER_SPLIT);
    let mut entries_seen = 0usize;
    for entry in archive.entries().map_err(corrupt)? {
        let mut entry = entry.map_err(corrupt)?;
        entries_seen += 1;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let entry_path = entry.path().map_err(corrupt)?.into_owned();
        let EntryKind::Review(split, label, name) = classify_entry(&entry_path) else {
            continue;
        };
        let (id, rating) = parse_file_name(&name).ok_or_else(|| DataError::BadFileName {
            file: path.join(&entry_path),
        })?;
        let size = entry.size();
        let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0).min(1 << 24));
        entry.read_to_end(&mut bytes).map_err(corrupt)?;
        if bytes.len() as u64 != size {
            return Err(corrupt(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "entry {} is {size} bytes long but only {} could be read",
                    entry_path.display(),
                    bytes.len()
                ),
            )));
        }
        raw.push(RawReview {
            split,
            review: Review {
                text: decode(bytes),
                label,
                id,
                rating,
            },
            file: entry_path,
        });
    }
    // Read the gzip stream to its end: this checks the gzip trailer (CRC-32 and length), so a
    // truncated file is reported even when the tar end-of-archive marker was reached early.
    let mut gz = archive.into_inner();
    io::copy(&mut gz, &mut io::sink()).map_err(corrupt)?;
    if entries_seen == 0 {
        return Err(corrupt(io::Error::new(
            io::ErrorKind::InvalidData,
            "the gzip stream holds no tar entries",
        )));
    }
    assemble(path, raw)
}

// ---------------------------------------------------------------------------------------------
// Finding the data
// ---------------------------------------------------------------------------------------------

/// The per-user cache directory for this dataset: `dirs::cache_dir()/burn-dtensor/imdb`
/// (e.g. `~/.cache/burn-dtensor/imdb` on Linux). `None` when the platform has none.
pub fn default_cache_dir() -> Option<PathBuf> {
    dirs::cache_dir().map(|d| d.join("burn-dtensor").join("imdb"))
}

/// Where [`resolve`] looks for the data, and whether it may download.
///
/// [`SourceConfig::from_env`] builds the standard configuration; tests build one by hand so
/// that they neither read the process environment nor touch the network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceConfig {
    /// The `--data PATH` command-line value, if any (highest priority).
    pub cli: Option<PathBuf>,
    /// The value of `IMDB_DATA`, if set and non-empty (second priority).
    pub env: Option<PathBuf>,
    /// The cache directory holding `aclImdb_v1.tar.gz` or `aclImdb/` (third priority);
    /// `None` when the platform has none.
    pub cache_dir: Option<PathBuf>,
    /// URL to download the archive from into `cache_dir` when nothing is found;
    /// `None` disables downloading.
    pub download_url: Option<String>,
}

impl SourceConfig {
    /// The standard configuration: `cli`, the `IMDB_DATA` environment variable (ignored when
    /// empty), [`default_cache_dir`], and download from [`OFFICIAL_URL`].
    pub fn from_env(cli: Option<&Path>) -> Self {
        let env = std::env::var_os(ENV_VAR)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from);
        SourceConfig {
            cli: cli.map(Path::to_path_buf),
            env,
            cache_dir: default_cache_dir(),
            download_url: Some(OFFICIAL_URL.to_owned()),
        }
    }

    /// The same configuration with automatic download disabled.
    pub fn offline(mut self) -> Self {
        self.download_url = None;
        self
    }
}

/// Finds the data: `--data PATH` if given, else `IMDB_DATA`, else the per-user cache
/// (`aclImdb_v1.tar.gz`, then an extracted `aclImdb/` there), else downloads the official
/// archive into the cache (see [`download`]).
///
/// Returns a path for [`load`] (an archive or a directory). Equivalent to
/// `resolve(&SourceConfig::from_env(cli))`.
///
/// # Errors
/// [`DataError::PathNotFound`] when `--data` or `IMDB_DATA` names a missing path (no fallback
/// then); [`DataError::NoCacheDir`]; [`DataError::Download`] when the download fails, e.g.
/// offline (its message says how to point at a local copy); [`DataError::CorruptArchive`] /
/// [`DataError::Io`] from the download.
pub fn resolve_source(cli: Option<&Path>) -> Result<PathBuf, DataError> {
    resolve(&SourceConfig::from_env(cli))
}

/// [`resolve_source`] without the automatic download: [`DataError::NotFound`] when neither
/// `--data`, `IMDB_DATA` nor the cache holds the data.
///
/// # Errors
/// [`DataError::PathNotFound`], [`DataError::NoCacheDir`], [`DataError::NotFound`].
pub fn resolve_source_offline(cli: Option<&Path>) -> Result<PathBuf, DataError> {
    resolve(&SourceConfig::from_env(cli).offline())
}

/// Resolves the data location from an explicit [`SourceConfig`]; see [`resolve_source`].
///
/// # Errors
/// As [`resolve_source`]; [`DataError::NotFound`] instead of a download when
/// `config.download_url` is `None`.
pub fn resolve(config: &SourceConfig) -> Result<PathBuf, DataError> {
    for (given, origin) in [(&config.cli, "--data"), (&config.env, ENV_VAR)] {
        if let Some(path) = given {
            if path.exists() {
                return Ok(path.clone());
            }
            return Err(DataError::PathNotFound {
                path: path.clone(),
                origin: origin.to_owned(),
            });
        }
    }
    let cache = config.cache_dir.as_ref().ok_or(DataError::NoCacheDir)?;
    let archive = cache.join(ARCHIVE_NAME);
    let extracted = cache.join(EXTRACTED_NAME);
    if archive.is_file() {
        return Ok(archive);
    }
    if extracted.is_dir() {
        return Ok(extracted);
    }
    match &config.download_url {
        None => Err(DataError::NotFound { archive, extracted }),
        Some(url) => {
            let done = download(url, &archive)?;
            if url == OFFICIAL_URL && done.sha256 != OFFICIAL_SHA256 {
                eprintln!(
                    "warning: {} has sha256 {} but the published archive has {}; it opened \
                     as a valid aclImdb archive, so it is used anyway",
                    archive.display(),
                    done.sha256,
                    OFFICIAL_SHA256
                );
            }
            Ok(done.path)
        }
    }
}

/// What [`download`] stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Downloaded {
    /// The final path (`dest`).
    pub path: PathBuf,
    /// Size in bytes.
    pub bytes: u64,
    /// SHA-256 of the file, lower-case hex (also written to `<dest>.sha256`).
    pub sha256: String,
}

/// Downloads `url` to `dest`, with a progress bar on stderr.
///
/// The data goes to `<dest>.part` first and is renamed to `dest` only once complete and
/// checked: it must open as a gzip-compressed tar containing `aclImdb/train/pos`
/// (see [`verify_archive`]). The SHA-256 is computed while downloading, printed to stderr and
/// recorded in `<dest>.sha256` (`sha256sum` format). Timeouts: 30 s to connect, 60 s without
/// data.
///
/// # Errors
/// [`DataError::Download`] (unreachable host, HTTP error, interrupted transfer, or a file that
/// is not an aclImdb archive; the `.part` file is removed), [`DataError::Io`] when the cache
/// directory or file cannot be written.
pub fn download(url: &str, dest: &Path) -> Result<Downloaded, DataError> {
    let fail = |reason: String| DataError::Download {
        url: url.to_owned(),
        reason,
        cache_path: dest.to_path_buf(),
    };
    if let Some(parent) = dest.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(parent).map_err(|e| DataError::io(parent, e))?;
    }
    let agent = ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(30))
        .timeout_read(Duration::from_secs(60))
        .build();
    let response = agent.get(url).call().map_err(|e| fail(e.to_string()))?;
    let total: Option<u64> = response
        .header("Content-Length")
        .and_then(|v| v.trim().parse().ok());

    let part = {
        let mut name = dest
            .file_name()
            .map_or_else(|| OsString::from(ARCHIVE_NAME), OsString::from);
        name.push(".part");
        dest.with_file_name(name)
    };
    let bar = match total {
        Some(n) => indicatif::ProgressBar::new(n),
        None => indicatif::ProgressBar::new_spinner(),
    };
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{msg} [{elapsed_precise}] [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec}, eta {eta})",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(format!("downloading {url}"));

    let result = (|| -> Result<(u64, String), DataError> {
        let file = File::create(&part).map_err(|e| DataError::io(&part, e))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        let mut reader = response.into_reader();
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 16];
        let mut bytes = 0u64;
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(fail(format!(
                        "transfer interrupted after {bytes} bytes: {e}"
                    )));
                }
            };
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n])
                .map_err(|e| DataError::io(&part, e))?;
            bytes += n as u64;
            bar.set_position(bytes);
        }
        if let Some(total) = total.filter(|&t| t != bytes) {
            return Err(fail(format!("expected {total} bytes, received {bytes}")));
        }
        let file = out
            .into_inner()
            .map_err(|e| DataError::io(&part, e.into_error()))?;
        file.sync_all().map_err(|e| DataError::io(&part, e))?;
        let sha256: String = hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        verify_archive(&part).map_err(|e| {
            fail(format!(
                "the downloaded file is not a valid aclImdb archive: {e}"
            ))
        })?;
        Ok((bytes, sha256))
    })();
    bar.finish_and_clear();
    let (bytes, sha256) = match result {
        Ok(v) => v,
        Err(e) => {
            let _ = fs::remove_file(&part);
            return Err(e);
        }
    };
    fs::rename(&part, dest).map_err(|e| DataError::io(dest, e))?;
    let file_name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut sidecar = dest.as_os_str().to_owned();
    sidecar.push(".sha256");
    // The checksum record is informational; failing to write it is not fatal.
    let _ = fs::write(PathBuf::from(sidecar), format!("{sha256}  {file_name}\n"));
    eprintln!(
        "downloaded {} ({bytes} bytes), sha256 {sha256}",
        dest.display()
    );
    Ok(Downloaded {
        path: dest.to_path_buf(),
        bytes,
        sha256,
    })
}

/// Checks that `path` is a gzip-compressed tar archive that can be read to its end and
/// contains `aclImdb/train/pos` (as a directory entry or as the prefix of a file).
///
/// # Errors
/// [`DataError::NotAnArchive`], [`DataError::CorruptArchive`], or
/// [`DataError::MissingReviews`] (group `train/pos`) when that directory is absent.
pub fn verify_archive(path: &Path) -> Result<(), DataError> {
    let file = open_gzip(path)?;
    let corrupt = |source: io::Error| DataError::CorruptArchive {
        path: path.to_path_buf(),
        source,
    };
    let gz = flate2::read::GzDecoder::new(io::BufReader::with_capacity(1 << 16, file));
    let mut archive = tar::Archive::new(gz);
    let wanted = Path::new(EXTRACTED_NAME).join("train").join("pos");
    let mut found = false;
    for entry in archive.entries().map_err(corrupt)? {
        let entry = entry.map_err(corrupt)?;
        let p = entry.path().map_err(corrupt)?;
        let p: PathBuf = p
            .components()
            .filter(|c| matches!(c, Component::Normal(_)))
            .collect();
        if p.starts_with(&wanted) {
            found = true;
        }
    }
    let mut gz = archive.into_inner();
    io::copy(&mut gz, &mut io::sink()).map_err(corrupt)?;
    if found {
        Ok(())
    } else {
        Err(DataError::MissingReviews {
            path: path.to_path_buf(),
            group: "train/pos".into(),
            found: 0,
        })
    }
}

/// Counts reviews per group (`"train/neg"` ...), e.g. for a summary line.
pub fn group_counts(data: &ImdbData) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for split in Split::ALL {
        for r in data.split(split) {
            *counts
                .entry(format!("{split}/{}", label_dir(r.label)))
                .or_insert(0) += 1;
        }
    }
    counts
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A fresh, empty directory under the system temp dir (removed by `Drop`).
    pub(crate) struct TempDir(pub PathBuf);

    impl TempDir {
        pub(crate) fn new(tag: &str) -> Self {
            static COUNTER: AtomicUsize = AtomicUsize::new(0);
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let dir = std::env::temp_dir().join(format!(
                "dtensor-imdb-test-{}-{tag}-{n}",
                std::process::id()
            ));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    /// (split, group dir, file name, contents) of the small fake dataset.
    fn fake_files() -> Vec<(&'static str, &'static str, &'static str, &'static [u8])> {
        vec![
            (
                "train",
                "pos",
                "10_9.txt",
                b"Great movie!<br /><br />Loved it.",
            ),
            ("train", "pos", "2_7.txt", b"Pretty good."),
            ("train", "pos", "0_10.txt", b"Masterpiece."),
            ("train", "neg", "5_1.txt", b"Awful."),
            ("train", "neg", "11_3.txt", b"Bad, bad, bad."),
            (
                "train",
                "neg",
                "3_4.txt",
                b"Caf\xc3\xa9 scene ok, rest \xff bad",
            ),
            ("train", "unsup", "0_0.txt", b"unlabelled, must be ignored"),
            ("train", "pos", "notes.md", b"not a review, ignored"),
            ("test", "pos", "1_8.txt", b"Nice."),
            ("test", "pos", "0_9.txt", b"Superb."),
            ("test", "neg", "7_2.txt", b"Boring."),
            ("test", "neg", "12_1.txt", b"Terrible."),
        ]
    }

    /// Writes the fake dataset as `<root>/aclImdb/...`, skipping groups in `skip`.
    fn write_tree(root: &Path, skip: &[&str]) -> PathBuf {
        let acl = root.join("aclImdb");
        for (split, group, name, text) in fake_files() {
            if skip.contains(&format!("{split}/{group}").as_str()) {
                continue;
            }
            let dir = acl.join(split).join(group);
            fs::create_dir_all(&dir).unwrap();
            fs::write(dir.join(name), text).unwrap();
        }
        fs::write(acl.join("README"), "fake").unwrap();
        acl
    }

    /// Builds `aclImdb.tar.gz` from the tree under `root` with the `tar` + `flate2` crates.
    fn write_archive(acl: &Path, out: &Path) {
        let file = File::create(out).unwrap();
        let gz = flate2::write::GzEncoder::new(file, flate2::Compression::default());
        let mut builder = tar::Builder::new(gz);
        builder.append_dir_all("aclImdb", acl).unwrap();
        builder.into_inner().unwrap().finish().unwrap();
    }

    fn fixture(tag: &str) -> (TempDir, PathBuf, PathBuf) {
        let tmp = TempDir::new(tag);
        let acl = write_tree(&tmp.0, &[]);
        let archive = tmp.0.join("aclImdb_v1.tar.gz");
        write_archive(&acl, &archive);
        (tmp, acl, archive)
    }

    fn review(text: &str, label: u8, id: u32, rating: u8) -> Review {
        Review {
            text: text.to_owned(),
            label,
            id,
            rating,
        }
    }

    #[test]
    fn file_names_parse() {
        assert_eq!(parse_file_name("0_10.txt"), Some((0, 10)));
        assert_eq!(parse_file_name("12499_3.txt"), Some((12499, 3)));
        assert_eq!(parse_file_name("12_.txt"), None);
        assert_eq!(parse_file_name("_3.txt"), None);
        assert_eq!(parse_file_name("+1_3.txt"), None);
        assert_eq!(parse_file_name("a_3.txt"), None);
        assert_eq!(parse_file_name("1_3_4.txt"), None);
        assert_eq!(parse_file_name("1_300.txt"), None); // rating overflows u8
    }

    #[test]
    fn directory_and_archive_give_identical_sorted_reviews() {
        let (tmp, acl, archive) = fixture("same");
        let from_acl = load(&acl).unwrap();
        let from_parent = load(&tmp.0).unwrap();
        let from_archive = load(&archive).unwrap();
        assert_eq!(from_acl, from_parent);
        assert_eq!(from_acl, from_archive);

        // (label, id) ascending: negatives by id, then positives by id; unsup and .md ignored.
        let expected_train = vec![
            review("Caf\u{e9} scene ok, rest \u{fffd} bad", 0, 3, 4),
            review("Awful.", 0, 5, 1),
            review("Bad, bad, bad.", 0, 11, 3),
            review("Masterpiece.", 1, 0, 10),
            review("Pretty good.", 1, 2, 7),
            review("Great movie!<br /><br />Loved it.", 1, 10, 9),
        ];
        let expected_test = vec![
            review("Boring.", 0, 7, 2),
            review("Terrible.", 0, 12, 1),
            review("Superb.", 1, 0, 9),
            review("Nice.", 1, 1, 8),
        ];
        assert_eq!(from_archive.train, expected_train);
        assert_eq!(from_archive.test, expected_test);
        assert_eq!(from_archive.split(Split::Test), &expected_test[..]);
        assert_eq!(from_archive.count_label(Split::Train, 1), 3);
        assert_eq!(group_counts(&from_archive)["test/neg"], 2);
    }

    #[test]
    fn missing_path_is_typed() {
        let tmp = TempDir::new("missing");
        let err = load(&tmp.0.join("nope.tar.gz")).unwrap_err();
        assert!(matches!(err, DataError::PathNotFound { .. }), "{err}");
        assert!(err.to_string().contains("IMDB_DATA"), "{err}");
    }

    #[test]
    fn random_bytes_are_not_an_archive() {
        let tmp = TempDir::new("random");
        // A fixed pseudo-random byte sequence (xorshift), not starting with the gzip magic.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let bytes: Vec<u8> = (0..4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect();
        assert_ne!(bytes[..2], GZIP_MAGIC);
        let path = tmp.0.join("garbage.tar.gz");
        fs::write(&path, &bytes).unwrap();
        let err = load(&path).unwrap_err();
        assert!(matches!(err, DataError::NotAnArchive { .. }), "{err}");

        // Gzip magic followed by garbage: corrupt, not a panic.
        let mut fake = GZIP_MAGIC.to_vec();
        fake.extend_from_slice(&bytes);
        fs::write(&path, &fake).unwrap();
        let err = load(&path).unwrap_err();
        assert!(matches!(err, DataError::CorruptArchive { .. }), "{err}");

        // Empty file.
        fs::write(&path, b"").unwrap();
        let err = load(&path).unwrap_err();
        assert!(matches!(err, DataError::NotAnArchive { .. }), "{err}");
    }

    #[test]
    fn truncated_gzip_is_corrupt() {
        let (tmp, _acl, archive) = fixture("trunc");
        let full = fs::read(&archive).unwrap();
        // Cut in the middle, and also just before the 8-byte gzip trailer.
        for keep in [full.len() / 2, full.len() - 4, 20] {
            let path = tmp.0.join(format!("cut{keep}.tar.gz"));
            fs::write(&path, &full[..keep]).unwrap();
            let err = load(&path).unwrap_err();
            assert!(
                matches!(err, DataError::CorruptArchive { .. }),
                "keep {keep}: {err}"
            );
            assert!(verify_archive(&path).is_err());
        }
        verify_archive(&archive).unwrap();
    }

    #[test]
    fn gzip_of_non_tar_is_corrupt() {
        let tmp = TempDir::new("nontar");
        let path = tmp.0.join("x.tar.gz");
        let mut enc = flate2::write::GzEncoder::new(
            File::create(&path).unwrap(),
            flate2::Compression::fast(),
        );
        enc.write_all(&[b'x'; 3000]).unwrap();
        enc.finish().unwrap();
        let err = load(&path).unwrap_err();
        assert!(matches!(err, DataError::CorruptArchive { .. }), "{err}");
    }

    #[test]
    fn missing_group_is_reported() {
        let tmp = TempDir::new("nogroup");
        let acl = write_tree(&tmp.0, &["test/neg"]);
        let err = load(&acl).unwrap_err();
        match &err {
            DataError::MissingReviews { group, found, .. } => {
                assert_eq!(group, "test/neg");
                assert_eq!(*found, 0);
            }
            other => panic!("unexpected error {other}"),
        }
        assert!(
            err.to_string().contains("found 0 reviews in test/neg"),
            "{err}"
        );

        let archive = tmp.0.join("partial.tar.gz");
        write_archive(&acl, &archive);
        let err = load(&archive).unwrap_err();
        assert!(
            matches!(&err, DataError::MissingReviews { group, .. } if group == "test/neg"),
            "{err}"
        );

        // An empty group directory counts as missing, too.
        fs::create_dir_all(acl.join("test/neg")).unwrap();
        let err = load(&acl).unwrap_err();
        assert!(matches!(err, DataError::MissingReviews { .. }), "{err}");
    }

    #[test]
    fn directory_without_layout_is_reported() {
        let tmp = TempDir::new("nolayout");
        let err = load(&tmp.0).unwrap_err();
        assert!(matches!(err, DataError::NotImdbDir { .. }), "{err}");
    }

    #[test]
    fn bad_file_name_is_an_error_naming_the_file() {
        let (tmp, acl, _archive) = fixture("badname");
        fs::write(acl.join("train/neg/oops.txt"), "x").unwrap();
        let err = load(&acl).unwrap_err();
        assert!(
            matches!(&err, DataError::BadFileName { file } if file.ends_with("train/neg/oops.txt")),
            "{err}"
        );
        assert!(err.to_string().contains("oops.txt"));
        let archive = tmp.0.join("bad.tar.gz");
        write_archive(&acl, &archive);
        let err = load(&archive).unwrap_err();
        assert!(matches!(err, DataError::BadFileName { .. }), "{err}");
    }

    #[test]
    fn duplicate_id_is_an_error() {
        let (_tmp, acl, _archive) = fixture("dup");
        // Same id 5 as `5_1.txt`, different rating.
        fs::write(acl.join("train/neg/5_2.txt"), "x").unwrap();
        let err = load(&acl).unwrap_err();
        assert!(
            matches!(&err, DataError::DuplicateReview { id: 5, group, .. } if group == "train/neg"),
            "{err}"
        );
    }

    fn config(cache: &Path) -> SourceConfig {
        SourceConfig {
            cli: None,
            env: None,
            cache_dir: Some(cache.to_path_buf()),
            download_url: None,
        }
    }

    #[test]
    fn resolve_priority_and_offline() {
        let (tmp, acl, archive) = fixture("resolve");
        let cache = tmp.0.join("cache");

        // Nothing anywhere, download disabled.
        let err = resolve(&config(&cache)).unwrap_err();
        assert!(matches!(err, DataError::NotFound { .. }), "{err}");
        assert!(err.to_string().contains("--data"), "{err}");

        // --data wins over IMDB_DATA; a missing --data path is an error, not a fallback.
        let mut c = config(&cache);
        c.cli = Some(acl.clone());
        c.env = Some(archive.clone());
        assert_eq!(resolve(&c).unwrap(), acl);
        c.cli = Some(tmp.0.join("missing"));
        let err = resolve(&c).unwrap_err();
        assert!(
            matches!(&err, DataError::PathNotFound { origin, .. } if origin == "--data"),
            "{err}"
        );
        c.cli = None;
        assert_eq!(resolve(&c).unwrap(), archive);
        c.env = Some(tmp.0.join("missing"));
        let err = resolve(&c).unwrap_err();
        assert!(
            matches!(&err, DataError::PathNotFound { origin, .. } if origin == ENV_VAR),
            "{err}"
        );

        // Cache: extracted directory, then archive (which takes precedence).
        fs::create_dir_all(cache.join(EXTRACTED_NAME)).unwrap();
        assert_eq!(
            resolve(&config(&cache)).unwrap(),
            cache.join(EXTRACTED_NAME)
        );
        fs::copy(&archive, cache.join(ARCHIVE_NAME)).unwrap();
        let found = resolve(&config(&cache)).unwrap();
        assert_eq!(found, cache.join(ARCHIVE_NAME));
        assert_eq!(load(&found).unwrap(), load(&acl).unwrap());

        // The environment-reading wrappers: `--data` wins whatever IMDB_DATA holds.
        assert_eq!(resolve_source_offline(Some(&acl)).unwrap(), acl);
        assert_eq!(resolve_source(Some(&archive)).unwrap(), archive);

        let mut none = config(&cache);
        none.cache_dir = None;
        assert!(matches!(resolve(&none), Err(DataError::NoCacheDir)));
    }

    #[test]
    fn unreachable_download_gives_typed_error_quickly() {
        let tmp = TempDir::new("download");
        let cache = tmp.0.join("cache");
        let url = "http://127.0.0.1:9/x.tar.gz";
        let start = std::time::Instant::now();
        let mut c = config(&cache);
        c.download_url = Some(url.to_owned());
        let err = resolve(&c).unwrap_err();
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{:?}",
            start.elapsed()
        );
        match &err {
            DataError::Download {
                url: u, cache_path, ..
            } => {
                assert_eq!(u, url);
                assert_eq!(cache_path, &cache.join(ARCHIVE_NAME));
            }
            other => panic!("unexpected error {other}"),
        }
        let msg = err.to_string();
        assert!(
            msg.contains("--data PATH") && msg.contains("IMDB_DATA=PATH"),
            "{msg}"
        );
        assert!(!cache.join(ARCHIVE_NAME).exists());
        assert!(!cache.join(format!("{ARCHIVE_NAME}.part")).exists());

        let err = download(url, &tmp.0.join("direct.tar.gz")).unwrap_err();
        assert!(matches!(err, DataError::Download { .. }), "{err}");
    }

    /// The real data: `IMDB_DATA`, else `../shared/data/imdb/aclImdb_v1_labeled.tar.gz` beside
    /// the crate. `None` (with a printed reason) when absent.
    pub(crate) fn real_data_path() -> Option<PathBuf> {
        if let Some(p) = std::env::var_os(ENV_VAR).filter(|v| !v.is_empty()) {
            return Some(PathBuf::from(p));
        }
        let p = PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../shared/data/imdb/aclImdb_v1_labeled.tar.gz"
        ));
        if p.exists() {
            Some(p)
        } else {
            eprintln!(
                "skipping: real IMDB data not found (set {ENV_VAR} or provide {})",
                p.display()
            );
            None
        }
    }

    #[test]
    fn real_archive_has_25k_reviews_per_split() {
        let Some(path) = real_data_path() else { return };
        let start = std::time::Instant::now();
        let data = load(&path).unwrap();
        eprintln!("loaded {} in {:.2?}", path.display(), start.elapsed());
        for split in Split::ALL {
            let reviews = data.split(split);
            assert_eq!(reviews.len(), REVIEWS_PER_SPLIT, "{split}");
            assert_eq!(data.count_label(split, 0), 12_500, "{split}");
            assert_eq!(data.count_label(split, 1), 12_500, "{split}");
            assert!(
                reviews
                    .windows(2)
                    .all(|w| (w[0].label, w[0].id) < (w[1].label, w[1].id))
            );
            // Ratings follow the dataset's definition of the labels.
            assert!(reviews.iter().all(|r| if r.label == 1 {
                (7..=10).contains(&r.rating)
            } else {
                (1..=4).contains(&r.rating)
            }));
            assert!(reviews.iter().all(|r| !r.text.is_empty()));
        }
        assert!(data.train.iter().any(|r| r.text.contains("<br />")));
        if path.is_file() {
            verify_archive(&path).unwrap();
        }
    }
}
