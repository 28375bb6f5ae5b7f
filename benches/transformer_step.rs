//! The transformer's training step (`imdb_transformer`'s driver: forward, backward, settling
//! the gradients, Adam) per parallel mode, as a ratio to the single-device step measured in the
//! same run: in one process (the 8-device virtual mesh) and under `mpirun -np 2` (4 mesh
//! devices per process, collectives across processes on MPI), for the default configuration
//! (width 32, 2 heads, feed-forward 32, one block, 200 tokens, 20000 ids, batch 32) and a larger
//! one (`--d-model 256 --heads 8 --ff 1024 --layers 4`).
//!
//! `cargo bench --features mpi --bench transformer_step`: rank 0 prints the median step (ms) of
//! each mode over a fixed number of steps (the same on every rank) on synthetic reviews (random
//! words; the step's cost does not depend on the text). Machines with fewer cores than
//! processes x threads measure overhead, not scaling. Figures in NOTES.md.

use clap::Parser;
use dtensor_imdb::transformer_train::{TextData, TfConfig, TfMode, run};

#[path = "common/mod.rs"]
mod common;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const MODES: [&str; 6] = ["single", "data", "fsdp", "tp", "tp-sp", "2d"];

/// `n` reviews of `len` random words out of `vocab` (label: parity of the index), from a
/// xorshift generator seeded with `seed`.
fn reviews(n: usize, vocab: usize, len: usize, seed: u64) -> Vec<(String, u8)> {
    let mut s = seed;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    (0..n)
        .map(|i| {
            let words: Vec<String> = (0..len)
                .map(|_| format!("w{}", next() % vocab as u64))
                .collect();
            (words.join(" "), (i % 2) as u8)
        })
        .collect()
}

/// Median step (ms) of each mode of [`MODES`] with the model flags `flags`.
fn medians(
    flags: &[&str],
    max_tokens: usize,
    seq_len: usize,
    batch: usize,
    steps: usize,
) -> Vec<f64> {
    let train = reviews(batch * steps, max_tokens, seq_len + 10, 7);
    let pairs: Vec<(&str, u8)> = train.iter().map(|(t, l)| (t.as_str(), *l)).collect();
    let data = TextData::from_texts(&pairs, &pairs[..batch], max_tokens, seq_len).unwrap();
    let (max_tokens, seq_len, batch, steps) = (
        max_tokens.to_string(),
        seq_len.to_string(),
        batch.to_string(),
        steps.to_string(),
    );
    MODES
        .iter()
        .map(|mode| {
            let mut args = vec![
                "transformer_step",
                "--mode",
                mode,
                "--epochs",
                "1",
                "--eval",
                "false",
                "--dropout",
                "0",
                "--max-steps",
                &steps,
                "--max-tokens",
                &max_tokens,
                "--seq-len",
                &seq_len,
                "--batch-size",
                &batch,
            ];
            args.extend_from_slice(flags);
            let cfg = TfConfig::parse_from(args);
            assert_eq!(cfg.mode == TfMode::Single, *mode == "single");
            run::<burn::backend::NdArray>(&cfg, &data, Default::default())
                .unwrap_or_else(|e| panic!("{mode}: {e}"))
                .median_step_ms
        })
        .collect()
}

fn report(name: &str, ms: &[f64]) {
    if !dtensor_imdb::console::is_chief() {
        return;
    }
    let world = burn_dtensor::spmd::init().map_or(1, |w| w.size());
    let row: Vec<String> = MODES
        .iter()
        .zip(ms)
        .map(|(m, t)| format!("{m} {t:.1} ms ({:.2}x)", t / ms[0]))
        .collect();
    println!("{name}, {world} process(es): {}", row.join(", "));
}

fn worker() {
    if common::smoke() {
        let tiny = ["--d-model", "8", "--heads", "2", "--ff", "8"];
        report("tiny (smoke)", &medians(&tiny, 50, 8, 8, 2));
        return;
    }
    report("default", &medians(&[], 20_000, 200, 32, 12));
    let large = [
        "--d-model",
        "256",
        "--heads",
        "8",
        "--ff",
        "1024",
        "--layers",
        "4",
    ];
    report(
        "--d-model 256 --heads 8 --ff 1024 --layers 4",
        &medians(&large, 20_000, 200, 32, 4),
    );
}

fn main() {
    common::one_then_under_mpirun(&[2], worker);
}
