//! Helpers shared by the benches (each bench uses a part: `#[path]`-included, so the unused
//! rest is allowed).
#![allow(dead_code)]

use burn::tensor::TensorData;

/// A synthetic IMDB-like batch: `n` rows of `width` TF-IDF-like features (about 10% non-zero,
/// values in [0, 2)) and `n` binary labels, from a xorshift generator seeded with `seed`.
pub fn batch(n: usize, width: usize, seed: u64) -> (TensorData, TensorData) {
    let mut s = seed;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let x: Vec<f32> = (0..n * width)
        .map(|_| {
            if next() % 10 == 0 {
                (next() % 1000) as f32 / 500.0
            } else {
                0.0
            }
        })
        .collect();
    let y: Vec<i64> = (0..n).map(|_| (next() % 2) as i64).collect();
    (TensorData::new(x, [n, width]), TensorData::new(y, [n]))
}

/// Whether this run is a smoke test: `cargo test --all-targets` runs a `harness = false` bench
/// without `--bench` (the launcher passes the choice on to its ranks in `SPMD_BENCH_SMOKE`).
pub fn smoke() -> bool {
    std::env::var_os("SPMD_BENCH_SMOKE").is_some()
        || (!burn_dtensor::spmd::LaunchEnv::detect().is_ok_and(|l| l.is_multi_process())
            && !std::env::args().any(|a| a == "--bench"))
}

/// Runs this bench binary as `np` MPI processes for each `np` of `counts` (2 only in a smoke
/// run); says so and returns when there is no `mpirun`.
///
/// # Panics
/// When a run fails.
pub fn under_mpirun(counts: &[usize]) {
    let exe = std::env::current_exe().unwrap();
    let smoke = smoke();
    for &np in if smoke { &[2][..] } else { counts } {
        let mut c = std::process::Command::new("mpirun");
        c.args([
            "--allow-run-as-root",
            "--oversubscribe",
            "-np",
            &np.to_string(),
        ])
        .arg(&exe);
        if smoke {
            c.env("SPMD_BENCH_SMOKE", "1");
        }
        match c.status() {
            Ok(s) if s.success() => {}
            Ok(s) => panic!("mpirun -np {np} failed: {s}"),
            Err(e) => {
                println!("skipped: no mpirun ({e})");
                return;
            }
        }
    }
}

/// The `main` of a bench measured across processes: under `mpirun`, this rank runs `worker`;
/// started alone, it runs `worker` in one process (not in a smoke run), then itself under
/// `mpirun` for each count of `counts` ([`under_mpirun`]), or says why it cannot.
pub fn one_then_under_mpirun(counts: &[usize], worker: impl Fn()) {
    if burn_dtensor::spmd::LaunchEnv::detect().is_ok_and(|l| l.is_multi_process()) {
        worker();
        return;
    }
    if !smoke() {
        worker();
    }
    if !cfg!(feature = "mpi") {
        println!(
            "skipped: build with `--features mpi` (and install OpenMPI) to measure across processes"
        );
        return;
    }
    under_mpirun(counts);
}

/// One IMDB training step as the step benches time it: the model held in `slot` on placement
/// `p`, the batch `(x, y)` laid out as `p`'s training batch, `optim`'s update at learning rate
/// 1e-2 on the mean loss, and the loss read back so the step's work has completed. The updated
/// model goes back into `slot`.
///
/// # Panics
/// If `slot` is empty, or the placement rejects the batch or the step (a bench's set-up error).
pub fn imdb_train_step<P, O>(
    p: &P,
    slot: &mut Option<dtensor_imdb::model::ImdbMlp<P::AD>>,
    optim: &mut O,
    x: &TensorData,
    y: &TensorData,
) where
    P: dtensor_imdb::train::Placement,
    O: burn::optim::Optimizer<dtensor_imdb::model::ImdbMlp<P::AD>, P::AD>,
{
    let (xb, yb) = p.train_batch(x.clone(), y.clone()).unwrap();
    let model = slot.take().expect("a model in the slot");
    let (m, loss, _) = dtensor_imdb::train::step(
        p,
        model,
        optim,
        (xb, yb),
        1e-2,
        dtensor_imdb::model::LossReduction::Mean,
    )
    .unwrap();
    let _ = loss.into_data();
    *slot = Some(m);
}
