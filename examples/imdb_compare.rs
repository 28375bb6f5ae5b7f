//! Draws the loss and accuracy curves of several `imdb_mlp --summary-json` runs into one SVG,
//! one line per run (e.g. the three parallel modes).
//!
//! `cargo run --release --example imdb_compare -- --out modes.svg data.json model.json spatial.json`

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use dtensor_imdb::train::{AppError, Summary};

#[derive(Parser, Debug)]
#[command(about = "Plot several imdb_mlp --summary-json runs into one SVG")]
struct Args {
    /// The SVG file to write.
    #[arg(long)]
    out: PathBuf,
    /// Summary files written by `imdb_mlp --summary-json`.
    #[arg(required = true)]
    summaries: Vec<PathBuf>,
}

fn run(args: &Args) -> Result<(), AppError> {
    let runs = args
        .summaries
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p)
                .map_err(|e| AppError::Config(format!("cannot read {}: {e}", p.display())))?;
            serde_json::from_str::<Summary>(&text).map_err(|e| {
                AppError::Config(format!(
                    "{} is not an imdb_mlp --summary-json file: {e}",
                    p.display()
                ))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    dtensor_imdb::plot::plot_runs(&runs, &args.out)?;
    println!("{} runs drawn to {}", runs.len(), args.out.display());
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
