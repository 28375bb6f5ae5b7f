//! The transformer text classifier of `imdb_transformer` trained by layout map alone (issue
//! 21), on synthetic reviews: every parallel mode gives the bare backend's per-step losses
//! (f32 here, f64 in `imdb_f64`), and each mode's step communicates what its plan implies.

use burn::backend::NdArray;
use burn_dtensor::CollectiveKind;
use dtensor_imdb::transformer_train::TfMode;

#[path = "../common/transformer.rs"]
mod setup;
use setup::MODES;

fn run_mode(mode: TfMode, steps: usize) -> dtensor_imdb::transformer_train::TfSummary {
    setup::run_mode::<NdArray<f32>>(mode, steps, &crate::RNG_LOCK)
}

/// Every mode gives the bare backend's per-step losses over 50 steps, f32 within 1e-5
/// relative.
#[test]
fn modes_match_the_bare_backend_f32() {
    let steps = 50;
    let want = run_mode(TfMode::Single, steps).train_losses;
    assert_eq!(want.len(), steps);
    // The model learns: the loss falls (a comparison of constants could not fail).
    assert!(want[steps - 1] < want[0], "losses {want:?}");
    for mode in MODES {
        let got = run_mode(mode, steps);
        for (s, (g, w)) in got.train_losses.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 * w.abs(),
                "{mode:?} f32 step {s}: {g} vs {w} (single)"
            );
        }
    }
}

/// The collectives of one training step of each mode, printed as `kind@axis shape bytes`.
#[test]
fn communication_of_each_mode() {
    for mode in MODES {
        let s = run_mode(mode, 1);
        println!("{mode:?}: {}", s.comm_first_step);
        for e in &s.comm_events {
            println!("  {}@{} {:?} {} B", e.kind, e.axis, e.shape, e.bytes);
        }
        if mode == TfMode::Data {
            // Data parallel: no collective but all-reduces over `batch`.
            assert!(
                s.comm_events
                    .iter()
                    .all(|e| e.kind == CollectiveKind::AllReduce && e.axis == "batch")
            );
        }
    }
}
