//! Classifies review texts with a model exported by `imdb_mlp --export FILE`, on the plain
//! NdArray backend with no layouts (the tutorial's SavedModel section).
//!
//! `cargo run --release --example imdb_predict -- --model FILE "a wonderful film" "dull and too long"`

use std::path::PathBuf;
use std::process::ExitCode;

use burn::backend::NdArray;
use burn::tensor::activation::softmax;
use burn::tensor::{Tensor, TensorData};
use clap::Parser;
use dtensor_imdb::train::load_exported;

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
    let m = vectorizer.transform(&args.texts);
    let x = Tensor::<NdArray, 2>::from_data(TensorData::new(m.values, [m.rows, m.cols]), &device);
    let p = softmax(model.forward(x), 1)
        .into_data()
        .to_vec::<f32>()
        .unwrap();
    for (i, t) in args.texts.iter().enumerate() {
        let pos = p[i * 2 + 1];
        println!(
            "{} ({:.3})  {}",
            if pos >= 0.5 { "positive" } else { "negative" },
            pos,
            t
        );
    }
    ExitCode::SUCCESS
}
