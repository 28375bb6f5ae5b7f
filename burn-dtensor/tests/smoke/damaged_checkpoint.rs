//! Damaged and edited checkpoints: whatever a `metadata.json` or a shard file holds, opening and
//! reading give either the saved values (bitwise) or a typed error, never a panic, an abort on
//! a huge allocation, another file's bytes or silently wrong values.

use std::path::{Path, PathBuf};

use burn::tensor::{Bool, Int, Tensor, TensorData};
use burn_dtensor::checkpoint::{Checkpoint, METADATA_FILE, SaveOptions, StateDict, save};
use burn_dtensor::{DTensorError, Layout, distribute};
use proptest::prelude::*;

use super::{B, data, mesh, scratch};

/// A checkpoint of four tensors: `w` `[512, 300]` f32 row-sharded over 2 (two shards of two
/// checksum blocks each), `g` `[6, 8]` on a 2 x 2 grid (four shards), `i` an int vector and `b`
/// a bool matrix, replicated (one shard each). Returns its directory and each tensor's saved
/// value read back whole.
fn saved(root: &Path) -> (PathBuf, Vec<(&'static str, TensorData)>) {
    let rows = mesh(&[("a", 2)]);
    let grid = mesh(&[("x", 2), ("y", 2)]);
    let w: Tensor<B, 2> = distribute(
        data([512, 300], 5),
        &Layout::new(&rows, ["a", "unsharded"]).unwrap(),
    )
    .unwrap();
    let g: Tensor<B, 2> =
        distribute(data([6, 8], 6), &Layout::new(&grid, ["x", "y"]).unwrap()).unwrap();
    let i: Tensor<B, 1, Int> = distribute(
        TensorData::new((0..6).map(|v| v * 3 - 7).collect::<Vec<i64>>(), [6]),
        &Layout::replicated(&rows, 1),
    )
    .unwrap();
    let b: Tensor<B, 2, Bool> = distribute(
        TensorData::new((0..12).map(|v| v % 5 == 1).collect::<Vec<bool>>(), [3, 4]),
        &Layout::replicated(&grid, 2),
    )
    .unwrap();
    let mut state = StateDict::new();
    state.insert("w", w).unwrap();
    state.insert("g", g).unwrap();
    state.insert("i", i).unwrap();
    state.insert("b", b).unwrap();
    let dir = root.join("ck");
    let meta = save(&dir, state, &SaveOptions::default()).unwrap();
    assert_eq!(meta.tensors["w"].shards.len(), 2);
    assert_eq!(meta.tensors["w"].shards[0].block_crc32.len(), 2);
    assert_eq!(meta.tensors["g"].shards.len(), 4);
    let ckpt = Checkpoint::open(&dir).unwrap();
    let whole = ["w", "g", "i", "b"].map(|n| (n, ckpt.read_whole(n).unwrap()));
    (dir, whole.to_vec())
}

/// Every read the test makes of `dir`: each tensor whole and a box across `w`'s two shards and
/// its checksum blocks. `Ok` only when every read gives the saved values.
fn read_all(dir: &Path, whole: &[(&'static str, TensorData)]) -> Result<(), DTensorError> {
    let ckpt = Checkpoint::open(dir)?;
    for (name, want) in whole {
        let got = ckpt.read_whole(name)?;
        assert_eq!(got.dtype, want.dtype, "{name}");
        assert_eq!(got.shape, want.shape, "{name}");
        assert_eq!(
            got.as_bytes(),
            want.as_bytes(),
            "{name}: other values read without error"
        );
    }
    let got = ckpt.read_box("w", &[200..300, 7..290])?;
    let w: Vec<f32> = whole[0].1.to_vec().unwrap();
    let want: Vec<f32> = (200..300)
        .flat_map(|r| (7..290).map(move |c| (r, c)))
        .map(|(r, c)| w[r * 300 + c])
        .collect();
    assert_eq!(got.to_vec::<f32>().unwrap(), want, "a box of `w`");
    Ok(())
}

/// The JSON pointers of every number in `v`.
fn numbers(v: &serde_json::Value, at: String, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Number(_) => out.push(at),
        serde_json::Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                numbers(x, format!("{at}/{i}"), out);
            }
        }
        serde_json::Value::Object(o) => {
            for (k, x) in o {
                let k = k.replace('~', "~0").replace('/', "~1");
                numbers(x, format!("{at}/{k}"), out);
            }
        }
        _ => {}
    }
}

/// Swaps the offsets of shards `a` and `b` (modulo their count) of the `t`-th tensor (modulo
/// the count) of `meta`, a `metadata.json`.
fn swap_offsets(meta: &mut serde_json::Value, t: usize, a: usize, b: usize) {
    let tensors = meta["tensors"].as_object_mut().unwrap();
    let n = tensors.len();
    let shards = tensors.values_mut().nth(t % n).unwrap()["shards"]
        .as_array_mut()
        .unwrap();
    let (a, b) = (a % shards.len(), b % shards.len());
    let offsets = shards[a]["offsets"].take();
    shards[a]["offsets"] = shards[b]["offsets"].take();
    shards[b]["offsets"] = offsets;
}

/// One damage to a checkpoint.
#[derive(Debug, Clone)]
enum Damage {
    /// The `k`-th number of `metadata.json` (modulo their count) replaced: by `to`, or moved by
    /// `to` as a signed step when `by` is set.
    Number { k: usize, to: u64, by: bool },
    /// Shard file `f` (modulo their count) cut to `keep` of its bytes (modulo its length).
    Truncate { f: usize, keep: usize },
    /// Byte `at` (modulo the length) of shard file `f` XOR-ed with `mask` (non-zero).
    Flip { f: usize, at: usize, mask: u8 },
    /// The offsets of shards `a` and `b` (modulo their count) of tensor `t` (modulo the count)
    /// swapped, their byte ranges and checksums kept: an index consistent with itself and with
    /// the bytes' checksums, which only the shard file's own header contradicts.
    Swap { t: usize, a: usize, b: usize },
}

fn damage() -> impl Strategy<Value = Damage> {
    let to = prop_oneof![
        Just(0u64),
        Just(1),
        0..700u64,
        Just(u64::from(u32::MAX)),
        Just(1 << 40),
        Just(u64::MAX),
        any::<u64>(),
    ];
    prop_oneof![
        (any::<usize>(), to, Just(false)).prop_map(|(k, to, by)| Damage::Number { k, to, by }),
        (any::<usize>(), 1..3u64, any::<bool>()).prop_map(|(k, step, down)| Damage::Number {
            k,
            to: if down { step.wrapping_neg() } else { step },
            by: true,
        }),
        (any::<usize>(), any::<usize>()).prop_map(|(f, keep)| Damage::Truncate { f, keep }),
        (any::<usize>(), any::<usize>(), 1..=255u8).prop_map(|(f, at, mask)| Damage::Flip {
            f,
            at,
            mask
        }),
        (any::<usize>(), any::<usize>(), any::<usize>()).prop_map(|(t, a, b)| Damage::Swap {
            t,
            a,
            b
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(256),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// One number of `metadata.json` changed (to 0, 1, a small value, a huge one, or by 1 or
    /// 2), two shards' offsets swapped, or a shard file cut short or with a byte flipped:
    /// opening and reading the checkpoint give the saved values bitwise or a
    /// `DTensorError::Checkpoint`, never a panic or other values. The metadata is checked on
    /// open ([`CheckpointMetadata::check`]), against each shard file's header on read, and the
    /// bytes read by their checksums.
    #[test]
    fn a_damaged_checkpoint_reads_right_or_fails_typed(damages in prop::collection::vec(damage(), 1..3)) {
        let root = scratch("damaged");
        let (dir, whole) = saved(&root);
        let meta_path = dir.join(METADATA_FILE);
        let mut meta: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&meta_path).unwrap()).unwrap();
        let mut shards: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        shards.sort();
        for d in &damages {
            match *d {
                Damage::Number { k, to, by } => {
                    let mut at = Vec::new();
                    numbers(&meta, String::new(), &mut at);
                    let leaf = meta.pointer_mut(&at[k % at.len()]).unwrap();
                    let old = leaf.as_u64().unwrap_or(0);
                    *leaf = (if by { old.wrapping_add(to) } else { to }).into();
                }
                Damage::Truncate { f, keep } => {
                    let p = &shards[f % shards.len()];
                    let bytes = std::fs::read(p).unwrap();
                    std::fs::write(p, &bytes[..keep % bytes.len()]).unwrap();
                }
                Damage::Flip { f, at, mask } => {
                    let p = &shards[f % shards.len()];
                    let mut bytes = std::fs::read(p).unwrap();
                    let n = bytes.len();
                    bytes[at % n] ^= mask;
                    std::fs::write(p, &bytes).unwrap();
                }
                Damage::Swap { t, a, b } => swap_offsets(&mut meta, t, a, b),
            }
        }
        std::fs::write(&meta_path, serde_json::to_vec(&meta).unwrap()).unwrap();
        match read_all(&dir, &whole) {
            Ok(()) | Err(DTensorError::Checkpoint { .. }) => {}
            Err(e) => prop_assert!(false, "{damages:?}: not a checkpoint error: {e}"),
        }
        std::fs::remove_dir_all(&root).unwrap();
    }
}

/// A `metadata.json` edited so that a shard's file lies outside the checkpoint directory (with
/// that file's true checksums, so only the path gives it away) is refused when opened, as are a
/// shard moved onto another and a shard taken out (before, the first read the outside file and
/// the other two left zeros where the missing shard was); a shard file cut short is named.
#[test]
fn an_edited_checkpoint_is_refused_on_open() {
    let root = scratch("edited");
    let (dir, whole) = saved(&root);
    read_all(&dir, &whole).unwrap();
    let meta_path = dir.join(METADATA_FILE);
    let original = std::fs::read(&meta_path).unwrap();
    let edit = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut meta: serde_json::Value = serde_json::from_slice(&original).unwrap();
        f(&mut meta);
        std::fs::write(&meta_path, serde_json::to_vec(&meta).unwrap()).unwrap();
        match Checkpoint::open(&dir) {
            Err(e @ DTensorError::Checkpoint { .. }) => e.to_string(),
            Err(e) => panic!("not a checkpoint error: {e}"),
            Ok(_) => panic!("an edited checkpoint opened"),
        }
    };
    // The grid tensor's first shard's file copied outside, and named by path: absolute and
    // relative.
    let meta: serde_json::Value = serde_json::from_slice(&original).unwrap();
    let file = meta["tensors"]["g"]["shards"][0]["file"]
        .as_str()
        .unwrap()
        .to_string();
    let outside = root.join("elsewhere.safetensors");
    std::fs::copy(dir.join(&file), &outside).unwrap();
    for path in [
        outside.to_str().unwrap().to_string(),
        "../elsewhere.safetensors".into(),
    ] {
        let e = edit(&|m| m["tensors"]["g"]["shards"][0]["file"] = path.clone().into());
        assert!(e.contains("`g`") && e.contains("not a path inside"), "{e}");
    }
    // Shard 1 of `g` (rows 0..3, columns 4..8) moved onto shard 0 (columns 0..4).
    let e = edit(&|m| m["tensors"]["g"]["shards"][1]["offsets"][1] = 0.into());
    assert!(e.contains("`g`") && e.contains("overlap"), "{e}");
    // A shard taken out of the metadata.
    let e = edit(&|m| {
        m["tensors"]["g"]["shards"].as_array_mut().unwrap().pop();
    });
    assert!(e.contains("`g`") && e.contains("36 of the 48"), "{e}");
    // A byte range that ends before it starts, a shape too large to address.
    let e = edit(&|m| m["tensors"]["w"]["shards"][1]["byte_range"][1] = 3.into());
    assert!(
        e.contains("`w`") && e.contains("ends before it starts"),
        "{e}"
    );
    let e = edit(&|m| m["tensors"]["i"]["shape"] = serde_json::json!([u64::MAX, 2]));
    assert!(e.contains("`i`") && e.contains("more elements"), "{e}");
    // `g`'s first two shards' offsets swapped, their bytes and checksums kept: an index that
    // tiles the shape and opens, but the shard file's header names those bytes `g@0,0` and
    // `g@0,4` the other way round (before, `g` read back with its column blocks swapped).
    let mut swapped = meta.clone();
    swap_offsets(&mut swapped, 1, 0, 1);
    assert_eq!(
        swapped["tensors"]["g"]["shards"][0]["offsets"],
        serde_json::json!([0, 4])
    );
    std::fs::write(&meta_path, serde_json::to_vec(&swapped).unwrap()).unwrap();
    let ckpt = Checkpoint::open(&dir).unwrap();
    let e = ckpt.read_whole("g").unwrap_err().to_string();
    assert!(
        e.contains("`g`") && e.contains("shard `g@0,4`") && e.contains("not from the same save"),
        "{e}"
    );
    // Back as saved, one shard file cut short: the tensors it holds name it, the others read.
    std::fs::write(&meta_path, &original).unwrap();
    let shard = &meta["tensors"]["w"]["shards"][1];
    let file = shard["file"].as_str().unwrap().to_string();
    let end = shard["byte_range"][1].as_u64().unwrap() as usize;
    let bytes = std::fs::read(dir.join(&file)).unwrap();
    std::fs::write(dir.join(&file), &bytes[..end - 10]).unwrap();
    let ckpt = Checkpoint::open(&dir).unwrap();
    let e = ckpt.read_whole("w").unwrap_err().to_string();
    assert!(
        e.contains("`w`")
            && e.contains(&file)
            && e.contains("cut short")
            && e.contains(&format!("at byte {end}")),
        "{e}"
    );
    ckpt.read_box("w", &[0..256, 0..300]).unwrap();
    // A box outside the tensor, of another rank, or reversed.
    #[allow(clippy::reversed_empty_ranges, clippy::single_range_in_vec_init)]
    for bad in [vec![0..513, 0..300], vec![0..4], vec![9..3, 0..300]] {
        let e = ckpt.read_box("w", &bad).unwrap_err().to_string();
        assert!(e.contains("not a box of tensor `w`"), "{bad:?}: {e}");
    }
    std::fs::remove_dir_all(&root).unwrap();
}

/// A box over more shards than the process may have files open: the reader checks the files'
/// sizes by name and opens one shard's file at a time (600 shards under a limit of 256 open
/// files; lowered for this process, which no other test here comes near).
#[test]
fn a_box_over_hundreds_of_shards_reads_with_few_files_open() {
    let root = scratch("many");
    let m = mesh(&[("a", 600)]);
    let want = data([600, 3], 8);
    let x: Tensor<B, 2> =
        distribute(want.clone(), &Layout::new(&m, ["a", "unsharded"]).unwrap()).unwrap();
    let mut state = StateDict::new();
    state.insert("x", x).unwrap();
    let meta = save(&root.join("ck"), state, &SaveOptions::default()).unwrap();
    assert_eq!(meta.tensors["x"].shards.len(), 600);
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain reads and writes of this process's own limit.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        lim.rlim_cur = lim.rlim_cur.min(256);
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
    }
    let ckpt = Checkpoint::open(&root.join("ck")).unwrap();
    ckpt.read_whole("x").unwrap().assert_eq(&want, true);
    std::fs::remove_dir_all(&root).unwrap();
}
