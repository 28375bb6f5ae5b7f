//! Classifies review texts with a model exported by `imdb_mlp --export FILE`, on the plain
//! NdArray backend with no layouts (the tutorial's SavedModel section).
//!
//! `cargo run --release --example imdb_predict -- --model FILE "a wonderful film" "dull and too long"`

use std::path::PathBuf;
use std::process::ExitCode;

use burn::backend::NdArray;
use clap::Parser;
use dtensor_imdb::train::{classify, load_exported};

#[derive(Parser, Debug)]
struct Args {
    /// The file given to `imdb_mlp --export`.
    #[arg(long)]
    model: PathBuf,
    /// Review texts to classify.
    #[arg(required = true)]
    texts: Vec<String>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let device = Default::default();
    let (model, vectorizer) = match load_exported::<NdArray>(&args.model, &device) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let p = match classify(&model, &vectorizer, &args.texts, &device) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    for (i, t) in args.texts.iter().enumerate() {
        let pos = p[i];
        println!(
            "{} ({:.3})  {}",
            if pos >= 0.5 { "positive" } else { "negative" },
            pos,
            t
        );
    }
    ExitCode::SUCCESS
}
