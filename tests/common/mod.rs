//! Shared by the integration tests on the real data.

use std::path::PathBuf;

/// The IMDB archive: `$IMDB_DATA`, else the shared copy beside the checkout; `None` (with the
/// reason printed, so the skip is visible in the test output) when absent.
pub fn archive() -> Option<PathBuf> {
    let p = std::env::var_os("IMDB_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../shared/data/imdb/aclImdb_v1_labeled.tar.gz"
            ))
        });
    if p.exists() {
        Some(p)
    } else {
        println!(
            "skipped: IMDB archive not found at {} (set IMDB_DATA)",
            p.display()
        );
        None
    }
}
