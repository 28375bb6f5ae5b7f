//! Sharded checkpoint throughput ([`burn_dtensor::checkpoint`]) on 1, 2 and 4 processes, beside
//! a plain sequential write and read of the same bytes to the same disk.
//!
//! `cargo bench --features mpi --bench checkpoint_io` runs this binary in one process, then
//! re-runs it under `mpirun -np 2` and `-np 4` (one device per process, mesh `p=N`). The state is
//! four `[8192, 8192]` f32 tensors (1 GiB) sharded by rows, so each process writes and reads
//! `1/N` of it. Rank 0 prints, per phase, the time and the throughput in total and per rank:
//! - `save`: [`checkpoint::save`] (download, safetensors file per rank with block checksums,
//!   `fsync`, index exchange, the chief's metadata and rename);
//! - `plain write`: every rank writes its share of the bytes with `std::fs::write` and
//!   `fsync`s, at the same time: what the disk gives;
//! - `load same layout`: [`Checkpoint::read`] of every tensor into the layout it was saved in
//!   (each rank reads its blocks, verifies them, uploads);
//! - `load resharded`: the same into column shards (each rank reads every block that holds a
//!   part of its columns: all of them);
//! - `plain read`: every rank reads its share of the bytes back with `std::fs::read`.
//!
//! Reads hit the page cache for both the checkpoint and the plain files (written just before);
//! writes include the `fsync`. `cargo test --all-targets` runs it without `--bench`: 2 processes,
//! `[256, 256]` tensors, a smoke test. Figures in NOTES.md.

use std::path::Path;
use std::time::Instant;

use burn::backend::NdArray;
use burn::tensor::{Tensor, TensorData};
use burn_dtensor::checkpoint::{self, Checkpoint, SaveOptions, StateDict};
use burn_dtensor::spmd;
use burn_dtensor::{DTensorExt, DistributedBackend, Layout, Mesh, distribute_local, process_block};

#[path = "common/mod.rs"]
mod common;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

type DB = DistributedBackend<NdArray>;
const TENSORS: usize = 4;

fn worker(root: &Path) {
    let world = spmd::init().expect("joining the MPI world");
    let (p, rank) = (world.size(), world.rank());
    let side = if common::smoke() { 256 } else { 8192 };
    let mesh: Mesh<burn::backend::ndarray::NdArrayDevice> =
        Mesh::spmd([("p", p)], vec![Default::default()]).unwrap();
    let rows = Layout::new(&mesh, ["p", "unsharded"]).unwrap();
    let cols = Layout::new(&mesh, ["unsharded", "p"]).unwrap();
    let dir = root.join(format!("np{p}"));
    if world.is_chief() {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
    }
    world.barrier();
    // Each process makes only its rows.
    let block = process_block(&rows, &[side, side]).unwrap();
    let n = block[0].len() * side;
    let tensors: Vec<Tensor<DB, 2>> = (0..TENSORS)
        .map(|t| {
            let v: Vec<f32> = (0..n).map(|i| (i + t) as f32).collect();
            distribute_local(
                TensorData::new(v, [block[0].len(), side]),
                [side, side],
                &rows,
            )
            .unwrap()
        })
        .collect();
    let mine = (TENSORS * n * 4) as f64;
    let total = (TENSORS * side * side * 4) as f64;
    let line = |phase: &str, secs: f64, rank_bytes: f64, total_bytes: f64| {
        if world.is_chief() {
            println!(
                "np {p}  {phase:<18} {:>8.3} s  {:>6.2} GB/s total  {:>6.2} GB/s per rank",
                secs,
                total_bytes / secs / 1e9,
                rank_bytes / secs / 1e9
            );
        }
    };
    if world.is_chief() {
        println!(
            "np {p}: {} x [{side}, {side}] f32 = {:.0} MiB, {:.0} MiB per rank",
            TENSORS,
            total / (1 << 20) as f64,
            mine / (1 << 20) as f64
        );
    }

    world.barrier();
    let t = Instant::now();
    let mut state = StateDict::new();
    for (i, x) in tensors.iter().enumerate() {
        state.insert(format!("w{i}"), x.clone()).unwrap();
    }
    checkpoint::save(&dir.join("ckpt"), state, &SaveOptions::default()).unwrap();
    line("save", t.elapsed().as_secs_f64(), mine, total);

    let plain = dir.join(format!("plain-{rank}.bin"));
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|x| {
            x.clone().to_local_shards()[0]
                .clone()
                .into_data()
                .into_bytes()
                .to_vec()
        })
        .collect();
    world.barrier();
    let t = Instant::now();
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&plain).unwrap();
        for b in &bytes {
            f.write_all(b).unwrap();
        }
        f.sync_all().unwrap();
    }
    world.barrier();
    line("plain write", t.elapsed().as_secs_f64(), mine, total);
    drop(bytes);

    let ckpt = Checkpoint::open(&dir.join("ckpt")).unwrap();
    for (phase, layout, read_factor) in [
        ("load same layout", &rows, 1.0),
        ("load resharded", &cols, p as f64),
    ] {
        world.barrier();
        let t = Instant::now();
        for i in 0..TENSORS {
            let x: Tensor<DB, 2> = ckpt.read(&format!("w{i}"), layout).unwrap();
            let _ = x.to_local_shards();
        }
        world.barrier();
        // Bytes read from the files: the share, or every block for column shards.
        line(
            phase,
            t.elapsed().as_secs_f64(),
            mine * read_factor,
            total * read_factor,
        );
    }

    world.barrier();
    let t = Instant::now();
    let back = std::fs::read(&plain).unwrap();
    world.barrier();
    line("plain read", t.elapsed().as_secs_f64(), mine, total);
    assert_eq!(back.len() as f64, mine);
    world.barrier();
    if world.is_chief() {
        let _ = std::fs::remove_dir_all(&dir);
    }
}

fn main() {
    // One process (a world of one), then 2 and 4 under mpirun (2 only for the smoke test).
    let root = std::env::temp_dir().join("dtensor-bench-checkpoint-io");
    common::one_then_under_mpirun(&[2, 4], || worker(&root));
}
