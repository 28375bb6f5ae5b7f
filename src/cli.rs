//! The command line of the `imdb_mlp` example (kept in the library so that tests drive the same
//! entry point a user does).

use std::path::PathBuf;

use crate::batch::DropPolicy;
use crate::model::LossReduction;
use crate::train::{
    self, AppError, Distributed, Mode, OptimizerKind, Placement, Prepared, Progress, Single,
    TrainConfig,
};
use burn::module::AutodiffModule;
use burn::tensor::backend::Backend;
use burn_dtensor::CommLog;
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};

/// The flags `imdb_mlp` and `imdb_learner` share: mesh, layout map, backend, training
/// settings, data and outputs.
#[derive(clap::Args, Debug, Clone)]
pub struct RunFlags {
    /// Parallel mode: picks the tutorial's mesh and layout map (see the README's table).
    #[arg(long, value_enum, default_value = "data")]
    pub mode: Mode,
    /// Override the mesh, e.g. "batch=4,model=2" (its size must equal --devices).
    #[arg(long)]
    pub mesh: Option<String>,
    /// Number of (virtual) devices.
    #[arg(long, default_value_t = 8)]
    pub devices: usize,
    /// Override the layout map with a TOML file (`"regex" = ["axis"|"unsharded", ...]`).
    #[arg(long)]
    pub layout_map: Option<PathBuf>,
    /// Inner backend.
    #[arg(long, value_enum, default_value = "ndarray")]
    pub backend: BackendKind,
    /// The inner device of each process: `auto` (a GPU backend takes the GPU the resource
    /// spec assigns, else that of the process's local rank on its node; CPU backends their one
    /// device) or a device index of the backend.
    #[arg(long, default_value = "auto")]
    pub device: train::DeviceChoice,
    /// Total epochs.
    #[arg(long, default_value_t = 2)]
    pub epochs: usize,
    /// At most this many steps per epoch.
    #[arg(long)]
    pub max_steps: Option<usize>,
    /// Global batch size.
    #[arg(long, default_value_t = 64)]
    pub batch_size: usize,
    /// Optimizer.
    #[arg(long, value_enum, default_value = "adam")]
    pub optimizer: OptimizerKind,
    /// Learning rate (default: 1e-3 for Adam, 1e-2 for SGD as in the tutorial).
    #[arg(long)]
    pub lr: Option<f64>,
    /// What to do with a batch the batch axis cannot shard evenly.
    #[arg(long, value_enum, default_value = "uneven")]
    pub drop_policy: DropPolicy,
    /// Seed of the weights and of the data order.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// aclImdb: the .tar.gz or the extracted directory (else $IMDB_DATA, else the cache, else download).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Write the trained weights for single-device inference (see the imdb_predict example).
    #[arg(long)]
    pub export: Option<PathBuf>,
    /// Write a JSON summary of the run (losses, accuracies, settings).
    #[arg(long)]
    pub summary_json: Option<PathBuf>,
    /// Draw the loss and accuracy curves of the run into this SVG file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Print every parameter's layout and the input batch's as device-block tables (coloured on
    /// a terminal), then train.
    #[arg(long)]
    pub show_layouts: bool,
}

impl RunFlags {
    /// The run's [`TrainConfig`]: these flags, the learning rate defaulting to the optimizer's,
    /// with the settings only one example has (loss reduction, evaluation, checkpoints).
    pub fn train_config(
        &self,
        loss: LossReduction,
        eval: bool,
        checkpoint_dir: Option<PathBuf>,
        resume: Option<PathBuf>,
    ) -> TrainConfig {
        TrainConfig {
            mode: self.mode,
            epochs: self.epochs,
            max_steps: self.max_steps,
            batch_size: self.batch_size,
            optimizer: self.optimizer,
            lr: self.lr.unwrap_or(self.optimizer.default_lr()),
            seed: self.seed,
            loss,
            drop_policy: self.drop_policy,
            eval,
            checkpoint_dir,
            resume,
        }
    }

    /// The distributed placement on inner backend `I` (on [`train::process_device`]): `--mesh` and
    /// `--layout-map`, or the tutorial's for `--mode` ([`train::mesh_and_layout_map`]), over
    /// `--devices` virtual devices. Not for `--mode single`.
    ///
    /// # Errors
    /// A malformed mesh or layout map, a mesh/device-count mismatch, an axis the mesh lacks.
    pub fn distributed<I: Backend>(&self) -> Result<Distributed<I>, AppError> {
        self.distributed_on::<I>(train::process_device::<I>(self.device)?)
    }

    /// As [`RunFlags::distributed`] on the inner `device` given (the flags are validated on
    /// NdArray's one device before the data loads, whatever `--backend` and `--device` say).
    ///
    /// # Errors
    /// As [`RunFlags::distributed`], but for the device.
    pub fn distributed_on<I: Backend>(
        &self,
        device: I::Device,
    ) -> Result<Distributed<I>, AppError> {
        let (mesh, map) = train::mesh_and_layout_map(
            self.mode,
            self.mesh.as_deref(),
            self.layout_map.as_deref(),
        )?;
        Distributed::<I>::new(&mesh, self.devices, device, map)
    }

    /// Prints the mesh of `p` and, with `--show-layouts`, every parameter's and the input
    /// batch's layout ([`show_layouts`]).
    ///
    /// # Errors
    /// Layout-map errors.
    pub fn announce<I: Backend>(&self, p: &Distributed<I>) -> Result<(), AppError> {
        let world = burn_dtensor::spmd::init()?;
        let backend = I::name(&Default::default());
        if world.size() > 1 {
            crate::say!(
                "mesh [{}] over {} processes ({}) x {} virtual {backend} devices each",
                p.mesh,
                world.size(),
                world.engine(),
                self.devices / world.size()
            );
            let mut hosts: Vec<String> = Vec::new();
            for h in world.hosts() {
                if !hosts.contains(&h) {
                    hosts.push(h);
                }
            }
            crate::say!(
                "launched by {}: {} processes on {} node(s) ({}); rank 0 on {:?}",
                world.launch().source,
                world.size(),
                hosts.len(),
                hosts.join(", "),
                p.mesh.devices()[0]
            );
        } else {
            crate::say!(
                "mesh [{}] over {} virtual {backend} devices on {:?}",
                p.mesh,
                self.devices,
                p.mesh.devices()[0]
            );
        }
        if self.show_layouts {
            let tables = show_layouts(p, self.batch_size)?;
            crate::say!("{}", tables.trim_end());
        }
        Ok(())
    }
}

/// The flags of `imdb_mlp`.
#[derive(Parser, Debug)]
#[command(
    name = "imdb_mlp",
    about = "IMDB sentiment MLP (TF-IDF 1200 -> 48 relu -> BatchNorm -> 2) on burn-dtensor, as the TensorFlow DTensor tutorial"
)]
pub struct Args {
    /// Mesh, layout map, backend, training settings, data, outputs.
    #[command(flatten)]
    pub run: RunFlags,
    /// Loss reduction over the batch.
    #[arg(long, value_enum, default_value = "mean")]
    pub loss: LossReduction,
    /// Save model and optimizer state here at each epoch's end.
    #[arg(long)]
    pub checkpoint_dir: Option<PathBuf>,
    /// Resume from a checkpoint written in any mode.
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Skip the test-set evaluation.
    #[arg(long)]
    pub no_eval: bool,
}

/// Inner backend of the example.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum BackendKind {
    /// `burn::backend::NdArray`.
    Ndarray,
    /// `burn::backend::Flex`.
    Flex,
    /// `burn::backend::Wgpu` (CubeCL; needs the `wgpu` cargo feature and a Vulkan/Metal/DX12
    /// adapter, Mesa's software `lavapipe` included).
    #[cfg(feature = "wgpu")]
    Wgpu,
    /// `burn::backend::Cuda` (CubeCL; needs the `cuda` cargo feature and an NVIDIA GPU).
    #[cfg(feature = "cuda")]
    Cuda,
}

struct Bars {
    bar: Option<ProgressBar>,
    loss: f32,
    acc: f32,
    n: usize,
}

impl Progress for Bars {
    fn resumed(&mut self, epochs_done: usize, dir: &std::path::Path) {
        println!(
            "resumed from epoch {epochs_done} of {} (training epochs {}..)",
            dir.display(),
            epochs_done + 1
        );
    }
    fn epoch_start(&mut self, epoch: usize, steps: usize) {
        let bar = ProgressBar::new(steps as u64).with_prefix(format!("epoch {}", epoch + 1));
        if !crate::console::color() {
            // Off a terminal (a file, a pipe, or any rank of an SPMD launch): the epoch lines only.
            bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
        }
        bar.set_style(
            ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {elapsed_precise} {msg}")
                .unwrap()
                .progress_chars("=> "),
        );
        self.bar = Some(bar);
        (self.loss, self.acc, self.n) = (0.0, 0.0, 0);
    }
    fn step(&mut self, loss: f32, acc: f32) {
        self.n += 1;
        self.loss += (loss - self.loss) / self.n as f32;
        self.acc += (acc - self.acc) / self.n as f32;
        if let Some(b) = &self.bar {
            b.set_message(format!("loss {:.4} acc {:.3}", self.loss, self.acc));
            b.inc(1);
        }
    }
    fn epoch_end(&mut self, epoch: usize, test: Option<f64>, comm: &CommLog) {
        if let Some(b) = self.bar.take() {
            b.finish();
        }
        match test {
            Some(a) => println!(
                "epoch {}: train loss {:.4}, train acc {:.3}, test accuracy {:.4}",
                epoch + 1,
                self.loss,
                self.acc,
                a
            ),
            None => println!(
                "epoch {}: train loss {:.4}, train acc {:.3}",
                epoch + 1,
                self.loss,
                self.acc
            ),
        }
        println!("  communication of one step: {comm}");
    }
}

fn run<P: Placement>(
    p: &P,
    args: &Args,
    cfg: &TrainConfig,
    data: &Prepared,
) -> Result<(), AppError> {
    let mut bars = Bars {
        bar: None,
        loss: 0.0,
        acc: 0.0,
        n: 0,
    };
    let world = burn_dtensor::spmd::init()?;
    // In an SPMD run every rank trains; the chief (rank 0) reports and writes the outputs.
    let (summary, model) = if world.is_chief() {
        train::train(p, cfg, data, &mut bars)?
    } else {
        train::train(p, cfg, data, &mut train::Quiet)?
    };
    if let Some(path) = &args.run.export {
        // Exporting gathers every weight (a collective): every rank records, the chief's file
        // is the one kept.
        let out = if world.is_chief() {
            path.clone()
        } else {
            std::env::temp_dir().join(format!("dtensor-export-rank{}", world.rank()))
        };
        train::export(model.valid(), &data.vectorizer, &out)?;
        if world.is_chief() {
            println!("exported to {} (+ .vectorizer.json)", path.display());
        } else {
            let _ = std::fs::remove_file(out.with_extension("mpk"));
            let _ = std::fs::remove_file(train::vectorizer_path(&out));
        }
    }
    if !world.is_chief() {
        return Ok(());
    }
    if let Some(path) = &args.run.summary_json {
        std::fs::write(path, serde_json::to_string_pretty(&summary).unwrap())
            .map_err(|e| AppError::Config(format!("cannot write {}: {e}", path.display())))?;
    }
    if let Some(path) = &args.run.plot {
        crate::plot::plot_runs(&[(&summary).into()], path)?;
        println!("curves drawn to {}", path.display());
    }
    println!(
        "done: mode {:?}, mesh [{}], {} steps, median step {:.2} ms, wall {:.1} s, test accuracy {}",
        summary.mode,
        summary.mesh,
        summary.steps,
        summary.median_step_ms,
        summary.wall_s,
        summary
            .test_accuracy
            .map_or("n/a".into(), |a| format!("{a:.4}"))
    );
    Ok(())
}

fn with_backend<I: Backend>(
    args: &Args,
    cfg: &TrainConfig,
    data: &Prepared,
) -> Result<(), AppError> {
    if args.run.mode == Mode::Single {
        let device = train::process_device::<I>(args.run.device)?;
        return run(&Single::<I> { device }, args, cfg, data);
    }
    let p = args.run.distributed::<I>()?;
    burn_dtensor::spmd::init()?.agree_backend::<I>()?;
    args.run.announce(&p)?;
    run(&p, args, cfg, data)
}

/// Every parameter's layout under `p`'s layout map and the input batch's (`[batch_size, 1200]`),
/// as [`burn_dtensor::visualize_sharding`] tables, coloured when stdout is a terminal.
///
/// # Errors
/// Layout-map errors.
pub fn show_layouts<I: Backend>(p: &Distributed<I>, batch_size: usize) -> Result<String, AppError> {
    use burn::module::{Module, ModuleVisitor, Param};
    use burn::tensor::Tensor;
    use burn_dtensor::DTensorExt;
    type AD<I> = burn::backend::Autodiff<burn_dtensor::DistributedBackend<I>>;
    struct Tables {
        path: Vec<String>,
        color: bool,
        out: String,
    }
    impl<I: Backend> ModuleVisitor<AD<I>> for Tables {
        fn enter_module(&mut self, name: &str, _container: &str) {
            self.path.push(name.to_string());
        }
        fn exit_module(&mut self, _name: &str, _container: &str) {
            self.path.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<AD<I>, D>>) {
            let table = param.val().sharding_table(self.color);
            self.out += &format!("{}: {table}\n", self.path.join("."));
        }
    }
    let color = crate::console::color();
    let model = p.prepare_model(crate::model::ImdbMlp::new(&p.device()))?;
    let mut v = Tables {
        path: Vec::new(),
        color,
        out: String::new(),
    };
    model.visit(&mut v);
    let input = burn_dtensor::visualize_sharding(
        &p.input_layout,
        &[batch_size, crate::model::INPUT_DIM],
        color,
    )?;
    Ok(format!("{}input batch: {input}\n", v.out))
}

/// Checks, before any work, that the `--summary-json`, `--export` (`.mpk` and
/// `.vectorizer.json`) and `--plot` outputs can be written (and that the plot is `.svg`).
///
/// # Errors
/// [`AppError::Config`] naming the flag and the path.
pub fn check_outputs(
    summary_json: Option<&std::path::Path>,
    export: Option<&std::path::Path>,
    plot: Option<&std::path::Path>,
) -> Result<(), AppError> {
    if let Some(p) = summary_json {
        train::check_output_file("--summary-json", p)?;
    }
    if let Some(p) = export {
        let mut mpk = p.as_os_str().to_owned();
        mpk.push(".mpk");
        train::check_output_file("--export", std::path::Path::new(&mpk))?;
        train::check_output_file("--export", &train::vectorizer_path(p))?;
    }
    if let Some(p) = plot {
        crate::plot::check_plot_path(p)?;
        train::check_output_file("--plot", p)?;
    }
    Ok(())
}

/// Runs the example with parsed flags.
///
/// # Errors
/// Every bad input (missing or corrupt data, malformed layout map, mesh/device mismatch, unknown
/// axis, unshardable batch size under `--drop-policy strict`) as a typed [`AppError`].
pub fn run_args(args: Args) -> Result<(), AppError> {
    let cfg = args.run.train_config(
        args.loss,
        !args.no_eval,
        args.checkpoint_dir.clone(),
        args.resume.clone(),
    );
    // Validate every input before the (slow) data preparation.
    train::check_lr(cfg.lr)?;
    train::check_counts(cfg.epochs, cfg.max_steps)?;
    check_outputs(
        args.run.summary_json.as_deref(),
        args.run.export.as_deref(),
        args.run.plot.as_deref(),
    )?;
    if let Some(d) = &args.checkpoint_dir {
        crate::checkpoint::check_writable(d)?;
    }
    if let Some(d) = &args.resume {
        let loaded = crate::checkpoint::read(d)?;
        let fresh = crate::model::ImdbMlp::<burn::backend::NdArray>::new(&Default::default());
        loaded.check(&crate::checkpoint::param_shapes(&fresh), cfg.optimizer)?;
    }
    if args.run.mode != Mode::Single {
        let p = args
            .run
            .distributed_on::<burn::backend::NdArray>(Default::default())?;
        train::check_batch(cfg.batch_size, p.batch_axis(), cfg.drop_policy)?;
        // Rules that match no parameter, or of the wrong rank, fail here too (the parameters
        // are lazy: nothing is allocated).
        p.prepare_model(crate::model::ImdbMlp::new(&p.device()))?;
        // SPMD start-up handshake (free in one process): every rank must train the same model
        // the same way. The mesh, device type, engine and reduction were agreed when the mesh
        // was built; here the backend flag, the layout map and every training setting.
        let world = burn_dtensor::spmd::init()?;
        let mut fields = train::config_fields(&cfg);
        fields.push((
            "--backend".into(),
            format!("{:?}", args.run.backend).to_lowercase(),
        ));
        fields.push(("--devices".into(), args.run.devices.to_string()));
        world.agree_fields("training configuration", &fields)?;
        world.agree("layout map", &format!("{:?}", p.layout_map.rules()))?;
    } else if crate::console::is_multi_process() {
        return Err(AppError::Config(
            "--mode single trains the bare backend in one process, but this process is one of \
             an SPMD launch (each rank would train the whole model alone); start it without \
             mpirun, or pick --mode data|model|spatial"
                .into(),
        ));
    }
    let t = std::time::Instant::now();
    // In an SPMD launch rank 0 prepares the data and sends it to the others (a world of one,
    // `--mode single` included, prepares it itself).
    let data = train::prepare_once(
        burn_dtensor::spmd::init()?,
        args.run.data.as_deref(),
        |path| crate::say!("loading {} ...", path.display()),
    )?;
    crate::say!(
        "{} train / {} test reviews vectorised (TF-IDF, {} terms) in {:.1} s, held as term counts in {:.0} MB",
        data.train.len(),
        data.test.len(),
        data.vectorizer.vocab_size(),
        t.elapsed().as_secs_f64(),
        (data.train.heap_bytes() + data.test.heap_bytes()) as f64 / 1e6
    );
    match args.run.backend {
        BackendKind::Ndarray => with_backend::<burn::backend::NdArray>(&args, &cfg, &data),
        BackendKind::Flex => with_backend::<burn::backend::Flex>(&args, &cfg, &data),
        #[cfg(feature = "wgpu")]
        BackendKind::Wgpu => with_backend::<burn::backend::Wgpu>(&args, &cfg, &data),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => with_backend::<burn::backend::Cuda>(&args, &cfg, &data),
    }
}
