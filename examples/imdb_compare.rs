//! Draws the loss and accuracy curves of several `imdb_mlp --summary-json` (or
//! `imdb_learner --summary-json`) runs into one SVG, one line per run (e.g. the three parallel
//! modes).
//!
//! `cargo run --release --example imdb_compare -- --out modes.svg data.json model.json spatial.json`

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use dtensor_imdb::learner::LearnerSummary;
use dtensor_imdb::plot::Curves;
use dtensor_imdb::train::{AppError, Summary};

#[derive(Parser, Debug)]
#[command(about = "Plot several imdb_mlp / imdb_learner --summary-json runs into one SVG")]
struct Args {
    /// The SVG file to write.
    #[arg(long)]
    out: PathBuf,
    /// Summary files written by `imdb_mlp --summary-json` or `imdb_learner --summary-json`.
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
            match serde_json::from_str::<Summary>(&text) {
                Ok(s) => Ok(Curves::from(&s)),
                Err(e) => serde_json::from_str::<LearnerSummary>(&text)
                    .map(|s| Curves::from(&s))
                    .map_err(|_| {
                        AppError::Config(format!(
                            "{} is not an imdb_mlp or imdb_learner --summary-json file: {e}",
                            p.display()
                        ))
                    }),
            }
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
