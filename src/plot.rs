//! Training curves as SVG (with `plotters`): the loss of every step and the training accuracy
//! (running mean over [`SMOOTHING`] steps) with the test accuracy after each epoch, one line per
//! run. `imdb_mlp --plot FILE` and `imdb_learner --plot FILE` draw their own run; the
//! `imdb_compare` example draws several runs' `--summary-json` files, one line per mode.

use std::path::Path;

use plotters::prelude::*;

use crate::learner::LearnerSummary;
use crate::train::{AppError, Summary};

/// One run's curves, as [`plot_runs`] draws them.
#[derive(Debug, Clone, PartialEq)]
pub struct Curves {
    /// The legend entry (mode, mesh, backend).
    pub label: String,
    /// The training loss of every step.
    pub losses: Vec<f32>,
    /// The training accuracy of every step's batch, as a fraction (empty when not recorded).
    pub train_accuracy: Vec<f32>,
    /// The test accuracy after each epoch, as a fraction; drawn at each epoch's last step.
    pub epoch_test_accuracy: Vec<f64>,
}

fn label(mode: crate::train::Mode, mesh: &str, backend: &str) -> String {
    format!("{mode:?} [{mesh}] on {backend}").to_lowercase()
}

impl From<&Summary> for Curves {
    fn from(r: &Summary) -> Self {
        Self {
            label: label(r.mode, &r.mesh, &r.backend),
            losses: r.train_losses.clone(),
            train_accuracy: r.train_accuracy.clone(),
            epoch_test_accuracy: r.epoch_test_accuracy.clone(),
        }
    }
}

impl From<&LearnerSummary> for Curves {
    fn from(r: &LearnerSummary) -> Self {
        Self {
            label: format!("{} (learner)", label(r.mode, &r.mesh, &r.backend)),
            losses: r.train_losses.clone(),
            train_accuracy: Vec::new(),
            epoch_test_accuracy: r.valid_accuracy.clone(),
        }
    }
}

/// Steps in the running mean of the training accuracy.
pub const SMOOTHING: usize = 50;

/// Checks that `path` names an SVG file (the only format written, so that no system fonts or
/// image codecs are needed).
///
/// # Errors
/// [`AppError::Config`] for another extension.
pub fn check_plot_path(path: &Path) -> Result<(), AppError> {
    if path.extension().and_then(|e| e.to_str()) != Some("svg") {
        return Err(AppError::Config(format!(
            "--plot {}: plots are written as SVG; give a path ending in .svg",
            path.display()
        )));
    }
    Ok(())
}

fn running_mean(v: &[f32], window: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(v.len());
    let mut sum = 0.0f64;
    for (i, x) in v.iter().enumerate() {
        sum += f64::from(*x);
        if i >= window {
            sum -= f64::from(v[i - window]);
        }
        out.push((sum / (i + 1).min(window) as f64) as f32);
    }
    out
}

/// Draws the curves of `runs` (each labelled by its mode and mesh) into the SVG file `path`:
/// loss per step above, training accuracy (running mean) and test accuracy per epoch below.
///
/// # Errors
/// [`AppError::Config`] when `path` is not `.svg` or cannot be written, or when no run has a
/// step.
pub fn plot_runs(runs: &[Curves], path: &Path) -> Result<(), AppError> {
    check_plot_path(path)?;
    let steps = runs.iter().map(|r| r.losses.len()).max().unwrap_or(0);
    if steps == 0 {
        return Err(AppError::Config(
            "nothing to plot: the runs trained no step".into(),
        ));
    }
    let err = |e: &dyn std::fmt::Display| {
        AppError::Config(format!("cannot draw the plot {}: {e}", path.display()))
    };
    let root = SVGBackend::new(path, (1280, 700)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    // The legend has its own column beside the charts, so it never covers a curve.
    let (charts, legend) = root.split_horizontally(880);
    let (top, bottom) = charts.split_vertically(350);
    // Runs with equal curves (the same losses in two modes, as promised) would hide each other:
    // earlier runs are drawn wider, so every colour shows along a shared line.
    let width = |i: usize| 1 + 2 * (runs.len() - 1 - i) as u32;
    let max_loss = runs
        .iter()
        .flat_map(|r| r.losses.iter().copied())
        .filter(|x| x.is_finite())
        .fold(0.0f32, f32::max)
        .max(1e-3);
    let mut loss = ChartBuilder::on(&top)
        .caption("training loss per step", ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0usize..steps, 0f32..max_loss * 1.05)
        .map_err(|e| err(&e))?;
    loss.configure_mesh()
        .x_desc("step")
        .y_desc("loss")
        .draw()
        .map_err(|e| err(&e))?;
    for (i, r) in runs.iter().enumerate() {
        let c = Palette99::pick(i).to_rgba();
        loss.draw_series(LineSeries::new(
            r.losses.iter().copied().enumerate(),
            c.stroke_width(width(i)),
        ))
        .map_err(|e| err(&e))?;
        let y = 40 + 24 * i as i32;
        legend
            .draw(&PathElement::new(
                vec![(10, y), (40, y)],
                c.stroke_width(width(i)),
            ))
            .map_err(|e| err(&e))?;
        legend
            .draw(&Text::new(
                r.label.clone(),
                (48, y - 7),
                ("sans-serif", 14).into_font(),
            ))
            .map_err(|e| err(&e))?;
    }
    let mut acc = ChartBuilder::on(&bottom)
        .caption(
            format!("accuracy: training (mean of {SMOOTHING} steps), test after each epoch (dots)"),
            ("sans-serif", 20),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0usize..steps, 0.4f32..1.0)
        .map_err(|e| err(&e))?;
    acc.configure_mesh()
        .x_desc("step")
        .y_desc("accuracy")
        .draw()
        .map_err(|e| err(&e))?;
    for (i, r) in runs.iter().enumerate() {
        let c = Palette99::pick(i).to_rgba();
        acc.draw_series(LineSeries::new(
            running_mean(&r.train_accuracy, SMOOTHING)
                .into_iter()
                .enumerate(),
            c.stroke_width(width(i)),
        ))
        .map_err(|e| err(&e))?;
        // Test accuracy at the last step of each epoch.
        let per_epoch = r.losses.len() / r.epoch_test_accuracy.len().max(1);
        acc.draw_series(r.epoch_test_accuracy.iter().enumerate().map(|(e, a)| {
            Circle::new(
                (((e + 1) * per_epoch).saturating_sub(1), *a as f32),
                4,
                c.filled(),
            )
        }))
        .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::running_mean;

    #[test]
    fn running_mean_over_a_window() {
        assert_eq!(
            running_mean(&[1.0, 3.0, 5.0, 7.0], 2),
            vec![1.0, 2.0, 4.0, 6.0]
        );
    }
}
