//! The Keras example "Text classification with Transformer" on the IMDB reviews, single-device
//! or data-, FSDP-, tensor-, sequence- or 2-D-parallel on `DistributedBackend<NdArray>`, where
//! the parallelism is only a mesh, a layout map (`layouts/transformer/`) and the layout of the
//! token ids. Runs alone (a virtual mesh of 8 devices) or under `mpirun -np 2|4|8` with the same
//! flags. `--help` lists the flags.

use std::process::ExitCode;

use clap::Parser;
use dtensor_imdb::say;
use dtensor_imdb::train::AppError;
use dtensor_imdb::transformer_train::{TextData, TfConfig, TfMode, run};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    dtensor_imdb::console::finish(main_with(TfConfig::parse()))
}

fn main_with(cfg: TfConfig) -> Result<(), AppError> {
    cfg.check()?;
    let t0 = std::time::Instant::now();
    // Under `mpirun` rank 0 alone loads and vectorises the reviews and sends the token ids to
    // the other ranks.
    let data = TextData::prepare_once(
        burn_dtensor::spmd::init()?,
        cfg.data.as_deref(),
        cfg.max_tokens,
        cfg.seq_len,
        cfg.truncate,
    )?;
    say!(
        "loaded {} train / {} test reviews, vocabulary {} ids, {} tokens each ({:.1} s)",
        data.train.labels.len(),
        data.test.labels.len(),
        data.vectorizer.vocab_size(),
        cfg.seq_len,
        t0.elapsed().as_secs_f64()
    );
    let summary = run::<burn::backend::NdArray>(&cfg, &data, Default::default())?;
    if cfg.mode != TfMode::Single {
        say!(
            "mesh {} ({} process(es)); parameters:",
            summary.mesh,
            summary.world_size
        );
        for p in &summary.parameters {
            say!("  {p}");
        }
    }
    say!("collectives of the first step: {}", summary.comm_first_step);
    say!(
        "{} steps, median step {:.1} ms, {:.1} s; test accuracy by epoch: {:?}",
        summary.steps,
        summary.median_step_ms,
        summary.wall_s,
        summary.epoch_test_accuracy
    );
    // Every rank reports its own memory (under `mpirun` each line is one process's).
    let m = &summary.memory;
    if let (Some(start), Some(model), Some(creation), Some(training)) =
        (m.start, m.model, m.creation_peak, m.training_peak)
    {
        let rank = burn_dtensor::spmd::init()?.rank();
        println!(
            "rank {rank} memory: {start:.0} MiB with the data, peak {creation:.0} MiB creating the model, {model:.0} MiB with it, peak {training:.0} MiB training"
        );
    }
    if let Some(path) = &cfg.summary
        && dtensor_imdb::console::is_chief()
    {
        let json = serde_json::to_string_pretty(&summary)
            .map_err(|e| AppError::Config(format!("summary: {e}")))?;
        std::fs::write(path, json + "\n").map_err(|e| {
            AppError::Config(format!("cannot write --summary {}: {e}", path.display()))
        })?;
    }
    Ok(())
}
