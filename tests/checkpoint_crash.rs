//! Crash safety of checkpoints: the trainer is killed with SIGKILL at every write point of a
//! checkpoint save (before, inside and after each file, around the commit), and every resume
//! must either load the last complete checkpoint and continue with the losses of an unbroken
//! run, or fail with a typed error; never exit 0 on mixed state. Then damaged and mismatched
//! checkpoints must give typed errors naming the file.
//!
//! The binary has no test harness: it is both the parent (the checks) and, with
//! `DTENSOR_CRASH_CHILD` set, the child trainer the parent kills (`DTENSOR_CKPT_KILL_AT=k` makes
//! the child SIGKILL itself at the k-th write point, see `dtensor_imdb::checkpoint`). Training
//! runs on a small synthetic corpus (the point is the file handling, not the data), model mode
//! on a `batch=2,model=2` mesh. The kills are then repeated with the trainer running as 2 MPI
//! processes (`mpirun -np 2`), at each write point of each rank in turn.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use burn::backend::NdArray;
use burn_dtensor::LayoutMap;
use dtensor_imdb::batch::{DropPolicy, VectorizedSet};
use dtensor_imdb::checkpoint;
use dtensor_imdb::data::tfidf::TfIdfVectorizer;
use dtensor_imdb::model::{INPUT_DIM, LossReduction};
use dtensor_imdb::train::{
    self, AppError, Distributed, Mode, OptimizerKind, Prepared, Quiet, TrainConfig,
};

const STEPS: usize = 4;
const EPOCHS: usize = 3;

/// A synthetic corpus: 96 train / 32 test reviews over 1500 words (label = which half of the
/// vocabulary dominates), vectorised with the real TF-IDF.
fn data() -> Prepared {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut texts = Vec::new();
    let mut labels = Vec::new();
    for i in 0..128 {
        let label = (i % 2) as u8;
        let words: Vec<String> = (0..60)
            .map(|_| {
                let w = (next() % 750) as usize
                    + if next() % 4 == 0 {
                        0
                    } else {
                        750 * label as usize
                    };
                format!("w{w}")
            })
            .collect();
        texts.push(words.join(" "));
        labels.push(label);
    }
    let v = std::sync::Arc::new(TfIdfVectorizer::fit(&texts, INPUT_DIM).unwrap());
    let set = |r: std::ops::Range<usize>| {
        VectorizedSet::from_texts(v.clone(), &texts[r.clone()], labels[r].to_vec()).unwrap()
    };
    Prepared {
        train: set(0..96),
        test: set(96..128),
        vectorizer: TfIdfVectorizer::clone(&v),
    }
}

fn config(epochs: usize, ckpt: Option<&Path>, resume: Option<&Path>) -> TrainConfig {
    TrainConfig {
        mode: Mode::Model,
        epochs,
        max_steps: Some(STEPS),
        batch_size: 16,
        optimizer: OptimizerKind::Adam,
        lr: 1e-3,
        seed: 7,
        loss: LossReduction::Mean,
        drop_policy: DropPolicy::Uneven,
        eval: false,
        checkpoint_dir: ckpt.map(Path::to_path_buf),
        resume: resume.map(Path::to_path_buf),
    }
}

fn train_run(data: &Prepared, cfg: &TrainConfig) -> Result<Vec<f32>, AppError> {
    let map = LayoutMap::from_toml_str(Mode::Model.default_layout_map()).unwrap();
    let p = Distributed::<NdArray>::new("batch=2,model=2", 4, Default::default(), map).unwrap();
    let (s, _) = train::train(&p, cfg, data, &mut Quiet)?;
    Ok(s.train_losses)
}

/// The child: trains per the environment, then exits 0 (or 3 on a typed error).
fn child() -> ! {
    let dir = PathBuf::from(std::env::var("DTENSOR_CRASH_DIR").unwrap());
    let epochs: usize = std::env::var("DTENSOR_CRASH_EPOCHS")
        .unwrap()
        .parse()
        .unwrap();
    let resume = std::env::var("DTENSOR_CRASH_RESUME").is_ok();
    let cfg = config(epochs, Some(&dir), resume.then_some(dir.as_path()));
    match train_run(&data(), &cfg) {
        Ok(_) => std::process::exit(0),
        Err(e) => {
            eprintln!("child error: {e}");
            std::process::exit(3)
        }
    }
}

/// Where the child runs: in one process, or as `np` MPI processes with `rank` the one killed.
#[derive(Clone, Copy)]
enum Run {
    Alone,
    Mpi { np: usize, rank: usize },
}

fn spawn(
    dir: &Path,
    epochs: usize,
    resume: bool,
    kill_at: Option<usize>,
) -> std::process::ExitStatus {
    spawn_as(Run::Alone, dir, epochs, resume, kill_at)
}

fn spawn_as(
    run: Run,
    dir: &Path,
    epochs: usize,
    resume: bool,
    kill_at: Option<usize>,
) -> std::process::ExitStatus {
    let exe = std::env::current_exe().unwrap();
    let mut c = match run {
        Run::Alone => Command::new(exe),
        Run::Mpi { np, rank } => {
            let mut c = Command::new("timeout");
            c.args([
                "120",
                "mpirun",
                "--allow-run-as-root",
                "--oversubscribe",
                "-np",
            ])
            .arg(np.to_string())
            .arg(exe)
            .env("DTENSOR_CKPT_KILL_RANK", rank.to_string())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
            c
        }
    };
    c.env("DTENSOR_CRASH_CHILD", "1")
        .env("DTENSOR_CRASH_DIR", dir)
        .env("DTENSOR_CRASH_EPOCHS", epochs.to_string())
        .env_remove("DTENSOR_CKPT_KILL_AT");
    if resume {
        c.env("DTENSOR_CRASH_RESUME", "1");
    }
    if let Some(k) = kill_at {
        c.env("DTENSOR_CKPT_KILL_AT", k.to_string());
    }
    c.status().expect("spawning the child trainer")
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let t = to.join(e.file_name());
        if e.path().is_dir() {
            copy_dir(&e.path(), &t);
        } else {
            std::fs::copy(e.path(), t).unwrap();
        }
    }
}

/// Kills the trainer (`run`: alone, or one rank of an MPI run) at each write point of its
/// epoch-2 save in turn; every resume (in one process) must continue the unbroken run bitwise.
/// Returns the number of write points.
fn kill_points(root: &Path, data: &Prepared, reference: &[f32], run: Run) -> usize {
    let tag = match run {
        Run::Alone => "alone".to_string(),
        Run::Mpi { np, rank } => format!("np{np}-rank{rank}"),
    };
    // One complete checkpoint after epoch 1, the starting point of every try.
    let base = root.join(format!("base-{tag}"));
    assert!(
        spawn_as(run, &base, 1, false, None).success(),
        "{tag}: first epoch"
    );
    let mut k = 1;
    let mut outcomes = Vec::new();
    loop {
        let dir = root.join(format!("kill-{tag}-{k}"));
        copy_dir(&base, &dir);
        // Resume at epoch 1 and train epoch 2, killed at the k-th write point of its save.
        let st = spawn_as(run, &dir, 2, true, Some(k));
        if st.success() {
            // k is past the last write point: the save completed.
            break;
        }
        match run {
            Run::Alone => assert_eq!(
                st.signal(),
                Some(9),
                "try {k}: the child should have been SIGKILLed, got {st:?}"
            ),
            // mpirun ends the job when a rank dies; `timeout` gives 124 for a hang.
            Run::Mpi { .. } => assert!(
                st.code() != Some(124) && st.code() != Some(3),
                "{tag} try {k}: the job should have ended by the kill, got {st:?}"
            ),
        }
        // Whatever was left, a resume must continue from a complete checkpoint.
        let state = checkpoint::read(&dir)
            .unwrap_or_else(|e| {
                panic!("try {k}: the checkpoint left by the kill does not read: {e}")
            })
            .state;
        assert!(
            state.epochs_done == 1 || state.epochs_done == 2,
            "try {k}: epochs_done {}",
            state.epochs_done
        );
        let done = state.epochs_done;
        let losses = train_run(data, &config(EPOCHS, Some(&dir), Some(&dir)))
            .unwrap_or_else(|e| panic!("{tag} try {k}: resume failed: {e}"));
        assert_eq!(
            losses,
            reference[done * STEPS..],
            "{tag} try {k}: resumed after epoch {done}, losses differ from the unbroken run"
        );
        let last = checkpoint::read(&dir).unwrap().state;
        assert_eq!(last.epochs_done, EPOCHS);
        assert_eq!(
            last.train_losses, reference,
            "try {k}: the checkpoint's loss history"
        );
        outcomes.push(done);
        k += 1;
        assert!(k < 256, "more write points than expected");
    }
    // Both outcomes occur: killed before the commit (epoch 1 kept), after it (epoch 2); a rank
    // other than the chief has no write point after the commit.
    let chief = matches!(run, Run::Alone | Run::Mpi { rank: 0, .. });
    assert!(
        outcomes.contains(&1) && (outcomes.contains(&2) || !chief),
        "{tag}: {outcomes:?}"
    );
    k - 1
}

fn expect_checkpoint_error(r: Result<Vec<f32>, AppError>, file: &str, what: &str) {
    match r {
        Err(AppError::Checkpoint { path, reason }) => {
            assert!(
                path.ends_with(file),
                "error names `{path}`, expected `{file}`: {reason}"
            );
            assert!(reason.contains(what), "`{reason}` should say `{what}`");
        }
        Err(e) => panic!("expected a checkpoint error naming {file}, got: {e}"),
        Ok(_) => panic!("resume from a bad checkpoint ({what}) succeeded"),
    }
}

fn damaged(root: &Path, data: &Prepared) {
    let good = root.join("good");
    assert!(spawn(&good, 1, false, None).success());
    let edir = |d: &Path| d.join("epoch-0001");
    let shard_file = "shards-00000-of-00001.safetensors";
    let resume = |d: &Path| train_run(data, &config(2, None, Some(d)));
    // A truncated shard file.
    let d = root.join("truncated");
    copy_dir(&good, &d);
    let f = edir(&d).join(shard_file);
    let len = std::fs::metadata(&f).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .unwrap()
        .set_len(len / 3)
        .unwrap();
    expect_checkpoint_error(resume(&d), shard_file, "cut short");
    // One flipped byte in the shards' data.
    let d = root.join("flipped");
    copy_dir(&good, &d);
    let f = edir(&d).join(shard_file);
    let mut b = std::fs::read(&f).unwrap();
    let mid = b.len() / 2;
    b[mid] ^= 0x40;
    std::fs::write(&f, b).unwrap();
    expect_checkpoint_error(resume(&d), shard_file, "fails its checksum");
    // A missing shard file.
    let d = root.join("missing");
    copy_dir(&good, &d);
    std::fs::remove_file(edir(&d).join(shard_file)).unwrap();
    expect_checkpoint_error(resume(&d), shard_file, "cannot be opened");
    // No commit point.
    let d = root.join("no-latest");
    copy_dir(&good, &d);
    std::fs::remove_file(d.join(checkpoint::LATEST)).unwrap();
    expect_checkpoint_error(resume(&d), "LATEST", "cannot read");
    // A corrupt metadata file.
    let d = root.join("bad-meta");
    copy_dir(&good, &d);
    std::fs::write(edir(&d).join("metadata.json"), b"{\"format\": 1,").unwrap();
    expect_checkpoint_error(resume(&d), "metadata.json", "not a sharded checkpoint");
    // Another optimizer.
    let r = train_run(
        data,
        &TrainConfig {
            optimizer: OptimizerKind::Sgd,
            ..config(2, None, Some(&good))
        },
    );
    expect_checkpoint_error(r, "metadata.json", "--optimizer");
    // A checkpoint of another model size (hidden 64 instead of 48): `dense1.weight` given 16
    // more columns, held by a third shard in a file of its own, so that the metadata stays
    // consistent (the reader refuses shards that do not tile the shape).
    let d = root.join("hidden64");
    copy_dir(&good, &d);
    let mp = edir(&d).join("metadata.json");
    let mut meta: burn_dtensor::checkpoint::CheckpointMetadata =
        serde_json::from_str(&std::fs::read_to_string(&mp).unwrap()).unwrap();
    let w = meta.tensors.get_mut("dense1.weight").unwrap();
    w.shape = vec![INPUT_DIM, 64];
    let extra = vec![0u8; INPUT_DIM * 16 * 4];
    std::fs::write(edir(&d).join("extra.bin"), &extra).unwrap();
    w.shards.push(burn_dtensor::checkpoint::ShardMetadata {
        offsets: vec![0, 48],
        sizes: vec![INPUT_DIM, 16],
        file: "extra.bin".into(),
        byte_range: (0, extra.len() as u64),
        block_crc32: burn_dtensor::checkpoint::format::block_checksums(&extra),
    });
    std::fs::write(&mp, serde_json::to_vec(&meta).unwrap()).unwrap();
    expect_checkpoint_error(
        resume(&d),
        "metadata.json",
        "dense1.weight: checkpoint Some([1200, 64]), model [1200, 48]",
    );
}

/// Why the multi-process kills cannot run here, if they cannot.
fn mpi_missing() -> Option<&'static str> {
    if !cfg!(feature = "mpi") {
        Some("built without the `mpi` feature")
    } else if Command::new("mpirun").arg("--version").output().is_err() {
        Some("no `mpirun` (apt-get install openmpi-bin libopenmpi-dev)")
    } else {
        None
    }
}

fn main() {
    if std::env::var("DTENSOR_CRASH_CHILD").is_ok() {
        child();
    }
    let root = std::env::temp_dir().join(format!("dtensor-ckpt-crash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let data = data();
    // The unbroken run, in process.
    let reference = train_run(&data, &config(EPOCHS, Some(&root.join("ref")), None)).unwrap();
    assert_eq!(reference.len(), EPOCHS * STEPS);
    let mut passed = 0;
    let points = kill_points(&root, &data, &reference, Run::Alone);
    println!("kill at each of {points} write points: every resume continued the unbroken run");
    passed += 1;
    // The same trainer as 2 MPI processes (each writing its own shards), each rank killed at
    // each of its write points; the resumes run in one process and must still be bitwise.
    match mpi_missing() {
        Some(why) if std::env::var_os("BURN_DTENSOR_REQUIRE_MPI").is_some() => {
            panic!("BURN_DTENSOR_REQUIRE_MPI is set but {why}")
        }
        Some(why) => println!("kill under mpirun: skipped ({why})"),
        None => {
            for rank in 0..2 {
                let t = std::time::Instant::now();
                let points = kill_points(&root, &data, &reference, Run::Mpi { np: 2, rank });
                println!(
                    "mpirun -np 2, rank {rank} killed at each of its {points} write points: every \
                     resume continued the unbroken run ({:.1} s)",
                    t.elapsed().as_secs_f64()
                );
            }
            passed += 1;
        }
    }
    damaged(&root, &data);
    println!("damaged and mismatched checkpoints: typed errors naming the file");
    passed += 1;
    let _ = std::fs::remove_dir_all(&root);
    println!("checkpoint_crash: {passed} passed, 0 failed");
}
