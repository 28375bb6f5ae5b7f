//! The setup of the transformer tests (`imdb_modes` for f32 and the communication,
//! `imdb_f64` for f64, which needs a process of its own): `imdb_transformer`'s driver
//! (`dtensor_imdb::transformer_train::run`, the code the example runs) on a tiny configuration
//! and synthetic reviews.

use std::sync::Mutex;

use burn::tensor::backend::Backend;
use clap::Parser;
use dtensor_imdb::transformer_train::{TextData, TfConfig, TfMode, TfSummary, run};

/// The parallel modes, each against `single`.
pub const MODES: [TfMode; 5] = [
    TfMode::Data,
    TfMode::Fsdp,
    TfMode::Tp,
    TfMode::TpSp,
    TfMode::TwoD,
];

/// Synthetic reviews: 8 to 11 words from a pool of 40; the label says whether "w3" occurs more
/// often than "w5" (something attention can learn).
pub fn reviews(n: usize, salt: usize) -> Vec<(String, u8)> {
    (0..n)
        .map(|r| {
            let len = 8 + (r * 7 + salt) % 4;
            let words: Vec<usize> = (0..len)
                .map(|i| (r * 31 + i * 17 + salt * i * i) % 40)
                .collect();
            let count = |w: usize| words.iter().filter(|&&x| x == w).count();
            let text = words.iter().map(|w| format!("w{w}")).collect::<Vec<_>>();
            (text.join(" "), u8::from(count(3) > count(5)))
        })
        .collect()
}

/// The tiny configuration: vocabulary 42 (pad, OOV, 40 words), 8 tokens, width 8, 2 heads,
/// feed-forward 8, batch 8, dropout rate `dropout` (the tests comparing with the bare backend
/// use none: the decorator draws the same masks in every mode and on every process count, the
/// bare backend other ones).
pub fn config(mode: TfMode, steps: usize, dropout: f64) -> TfConfig {
    let mode = format!("{mode:?}");
    let mode = match mode.as_str() {
        "TpSp" => "tp-sp".to_string(),
        "TwoD" => "2d".to_string(),
        m => m.to_lowercase(),
    };
    let steps = steps.to_string();
    let dropout = dropout.to_string();
    TfConfig::parse_from([
        "imdb_transformer",
        "--mode",
        &mode,
        "--batch-size",
        "8",
        "--epochs",
        "1",
        "--max-steps",
        &steps,
        "--lr",
        "0.01",
        "--max-tokens",
        "50",
        "--seq-len",
        "8",
        "--d-model",
        "8",
        "--heads",
        "2",
        "--ff",
        "8",
        "--dropout",
        &dropout,
        "--eval",
        "false",
        "--seed",
        "7",
    ])
}

/// `steps` training steps of `mode` with the inner backend `I`, holding `rng_lock` (runs that
/// seed and draw weights must not interleave: the generators are process-wide).
pub fn run_mode<I: Backend>(mode: TfMode, steps: usize, rng_lock: &Mutex<()>) -> TfSummary {
    run_mode_with_dropout::<I>(mode, steps, 0.0, rng_lock)
}

/// [`run_mode`] with dropout rate `dropout`.
pub fn run_mode_with_dropout<I: Backend>(
    mode: TfMode,
    steps: usize,
    dropout: f64,
    rng_lock: &Mutex<()>,
) -> TfSummary {
    let train = reviews(steps * 8, 1);
    let test = reviews(16, 2);
    fn pairs(r: &[(String, u8)]) -> Vec<(&str, u8)> {
        r.iter().map(|(t, l)| (t.as_str(), *l)).collect()
    }
    let data = TextData::from_texts(&pairs(&train), &pairs(&test), 50, 8).unwrap();
    let _guard = rng_lock.lock().unwrap_or_else(|e| e.into_inner());
    run::<I>(&config(mode, steps, dropout), &data, Default::default()).unwrap()
}
