//! Classifies review texts on the plain NdArray backend with no layouts (the tutorial's
//! SavedModel section), with a model exported by `imdb_mlp --export FILE` or straight from a
//! sharded checkpoint directory (`imdb_mlp --checkpoint-dir DIR`, written by any mesh and
//! process count: every tensor is read whole). `--export FILE` converts the checkpoint into one
//! ordinary Burn record (`FILE.mpk`) and its vectorizer (`FILE.vectorizer.json`), the files
//! `--model` reads.
//!
//! ```text
//! cargo run --release --example imdb_predict -- --model FILE "a wonderful film" "dull and too long"
//! cargo run --release --example imdb_predict -- --checkpoint ckpt "a wonderful film"
//! cargo run --release --example imdb_predict -- --checkpoint ckpt --export model
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use burn::backend::NdArray;
use clap::Parser;
use dtensor_imdb::checkpoint::load_whole;
use dtensor_imdb::train::{AppError, classify, export, load_exported};

#[derive(Parser, Debug)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["model", "checkpoint"])))]
struct Args {
    /// The file given to `imdb_mlp --export`.
    #[arg(long)]
    model: Option<PathBuf>,
    /// A checkpoint directory written by `imdb_mlp --checkpoint-dir` (its `LATEST` epoch).
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// Writes the checkpoint's model as one Burn record `FILE.mpk` plus `FILE.vectorizer.json`
    /// (the converter off the mesh); needs `--checkpoint`.
    #[arg(long, requires = "checkpoint")]
    export: Option<PathBuf>,
    /// Review texts to classify.
    #[arg(required_unless_present = "export")]
    texts: Vec<String>,
}

fn run(args: &Args) -> Result<(), AppError> {
    let device = Default::default();
    let (model, vectorizer) = match (&args.model, &args.checkpoint) {
        (Some(f), _) => load_exported::<NdArray>(f, &device)?,
        (None, Some(d)) => load_whole::<NdArray>(d, &device)?,
        (None, None) => unreachable!("clap requires one source"),
    };
    if let Some(f) = &args.export {
        export(model.clone(), &vectorizer, f)?;
        println!(
            "wrote {}.mpk and {}",
            f.display(),
            dtensor_imdb::train::vectorizer_path(f).display()
        );
    }
    if args.texts.is_empty() {
        return Ok(());
    }
    let p = classify(&model, &vectorizer, &args.texts, &device)?;
    for (t, pos) in args.texts.iter().zip(p) {
        println!(
            "{} ({:.3})  {}",
            if pos >= 0.5 { "positive" } else { "negative" },
            pos,
            t
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    match run(&Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
