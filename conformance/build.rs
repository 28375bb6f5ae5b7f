//! Sets `cfg(conformance_suite)` when Burn's vendored conformance suite is beside the checkout
//! (`../shared/vendor/burn-backend-tests-0.21.0/`, as in CI), and says why the suite is skipped
//! when it is not (a user's machine has no `../shared`).
use std::path::Path;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(conformance_suite)");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/vendor/burn-backend-tests-0.21.0/tests");
    println!("cargo::rerun-if-changed={}", dir.display());
    let wanted = std::env::var_os("CARGO_FEATURE_SUITE").is_some();
    if dir.join("tensor.rs").exists() {
        println!("cargo::rustc-cfg=conformance_suite");
    } else if wanted {
        println!(
            "cargo::warning=Burn's conformance suite is not at {} (it is vendored beside the checkout in CI, see shared/vendor/README.md): the conformance tests are skipped",
            dir.display()
        );
    }
}
