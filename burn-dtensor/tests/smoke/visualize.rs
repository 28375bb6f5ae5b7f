//! Sharding visualisation: the tables of the TensorFlow DTensor tutorial's three layouts (data,
//! model, spatial parallel), checked against hand-drawn expectations, and every drawn block
//! checked against the tensor's own shards (the device named in a cell holds exactly that block
//! of the global tensor).

use burn::backend::NdArray;
use burn::tensor::{Tensor, TensorData};
use burn_dtensor::*;

type Inner = NdArray;
type B = DistributedBackend<Inner>;

fn mesh<const N: usize>(axes: [(&str, usize); N]) -> Mesh<burn::backend::ndarray::NdArrayDevice> {
    Mesh::virtual_devices(axes, Default::default()).unwrap()
}

fn table(layout: &Layout, shape: &[usize]) -> String {
    visualize_sharding(layout, shape, false).unwrap()
}

#[test]
fn data_parallel_input_is_one_row_block_per_device() {
    let m = mesh([("batch", 8)]);
    let l = Layout::batch_sharded(&m, "batch", 2).unwrap();
    let t = table(&l, &[16, 1200]);
    assert_eq!(
        t,
        "\
[16@batch, 1200] on mesh batch=8 (8 devices)
┌─────────────┬─────────┐
│             ┆ 0..1200 │
╞═════════════╪═════════╡
│ rows 0..2   ┆ 0       │
├╌╌╌╌╌╌╌╌╌╌╌╌╌┼╌╌╌╌╌╌╌╌╌┤
│ rows 2..4   ┆ 1       │
├╌╌╌╌╌╌╌╌╌╌╌╌╌┼╌╌╌╌╌╌╌╌╌┤
│ rows 4..6   ┆ 2       │
├╌╌╌╌╌╌╌╌╌╌╌╌╌┼╌╌╌╌╌╌╌╌╌┤
│ rows 6..8   ┆ 3       │
├╌╌╌╌╌╌╌╌╌╌╌╌╌┼╌╌╌╌╌╌╌╌╌┤
│ rows 8..10  ┆ 4       │
├╌╌╌╌╌╌╌╌╌╌╌╌╌┼╌╌╌╌╌╌╌╌╌┤
│ rows 10..12 ┆ 5       │
├╌╌╌╌╌╌╌╌╌╌╌╌╌┼╌╌╌╌╌╌╌╌╌┤
│ rows 12..14 ┆ 6       │
├╌╌╌╌╌╌╌╌╌╌╌╌╌┼╌╌╌╌╌╌╌╌╌┤
│ rows 14..16 ┆ 7       │
└─────────────┴─────────┘"
    );
    // A replicated weight: one block, every device, said so.
    assert_eq!(
        table(&Layout::replicated(&m, 2), &[1200, 48]),
        "\
[1200, 48] on mesh batch=8 (8 devices)
replicated: every device holds the whole tensor
┌──────────────┬───────┐
│              ┆ 0..48 │
╞══════════════╪═══════╡
│ rows 0..1200 ┆ 0-7   │
└──────────────┴───────┘"
    );
}

#[test]
fn model_parallel_weights_split_over_the_model_axis() {
    let m = mesh([("batch", 4), ("model", 2)]);
    // dense2.weight [48, 2] sharded on its input dim: devices with model index 0 are the even ones.
    assert_eq!(
        table(&Layout::new(&m, ["model", "unsharded"]).unwrap(), &[48, 2]),
        "\
[48@model, 2] on mesh batch=4,model=2 (8 devices)
┌─────────────┬─────────┐
│             ┆ 0..2    │
╞═════════════╪═════════╡
│ rows 0..24  ┆ 0,2,4,6 │
├╌╌╌╌╌╌╌╌╌╌╌╌╌┼╌╌╌╌╌╌╌╌╌┤
│ rows 24..48 ┆ 1,3,5,7 │
└─────────────┴─────────┘"
    );
    // dense1.bias [48]: a rank-1 tensor is one row of blocks.
    assert_eq!(
        table(&Layout::new(&m, ["model"]).unwrap(), &[48]),
        "\
[48@model] on mesh batch=4,model=2 (8 devices)
┌─────────┬─────────┐
│ 0..24   ┆ 24..48  │
╞═════════╪═════════╡
│ 0,2,4,6 ┆ 1,3,5,7 │
└─────────┴─────────┘"
    );
}

#[test]
fn spatial_parallel_input_is_a_grid() {
    let m = mesh([("batch", 2), ("feature", 2), ("model", 2)]);
    assert_eq!(
        table(&Layout::new(&m, ["batch", "feature"]).unwrap(), &[64, 1200]),
        "\
[64@batch, 1200@feature] on mesh batch=2,feature=2,model=2 (8 devices)
┌─────────────┬────────┬───────────┐
│             ┆ 0..600 ┆ 600..1200 │
╞═════════════╪════════╪═══════════╡
│ rows 0..32  ┆ 0,1    ┆ 2,3       │
├╌╌╌╌╌╌╌╌╌╌╌╌╌┼╌╌╌╌╌╌╌╌┼╌╌╌╌╌╌╌╌╌╌╌┤
│ rows 32..64 ┆ 4,5    ┆ 6,7       │
└─────────────┴────────┴───────────┘"
    );
}

#[test]
fn partial_and_higher_rank_layouts() {
    let m = mesh([("batch", 4), ("model", 2)]);
    let partial = Layout::replicated(&m, 2).with_partial(0, ReduceOp::Sum);
    assert_eq!(
        table(&partial, &[2, 3]),
        "\
[2, 3]{partial sum@batch} on mesh batch=4,model=2 (8 devices)
partial: each block's devices hold values whose sum over batch is the tensor
┌───────────┬──────┐
│           ┆ 0..3 │
╞═══════════╪══════╡
│ rows 0..2 ┆ 0-7  │
└───────────┴──────┘"
    );
    // Rank 3, uneven (3 rows over 4 devices): one line per shard, empty shards named.
    let t = table(
        &Layout::new(&m, ["batch", "unsharded", "model"]).unwrap(),
        &[3, 5, 4],
    );
    let lines: Vec<&str> = t.lines().collect();
    assert_eq!(
        lines[0],
        "[3@batch, 5, 4@model] on mesh batch=4,model=2 (8 devices)"
    );
    assert_eq!(
        lines[2],
        "│ devices ┆ dim 0 @batch ┆ dim 1 ┆ dim 2 @model │"
    );
    assert_eq!(
        lines[4],
        "│ 0       ┆ 0..1         ┆ 0..5  ┆ 0..2         │"
    );
    assert_eq!(
        lines[6],
        "│ 1       ┆ 0..1         ┆ 0..5  ┆ 2..4         │"
    );
    assert_eq!(
        lines[16],
        "│ 6       ┆ 3..3 (empty) ┆ 0..5  ┆ 0..2         │"
    );
    assert_eq!(lines.len(), 4 + 2 * 8 - 1 + 1);
}

#[test]
fn rank_mismatch_is_a_typed_error() {
    let m = mesh([("batch", 2)]);
    let err = visualize_sharding(&Layout::replicated(&m, 2), &[4], false).unwrap_err();
    assert!(
        matches!(
            err,
            DTensorError::RankMismatch {
                layout_rank: 2,
                tensor_rank: 1
            }
        ),
        "{err}"
    );
}

/// A drawn block: its row range, column range and devices.
type Block = ((usize, usize), (usize, usize), Vec<usize>);

/// Parses a rank-2 grid table into `(row range, column range, devices)` blocks.
fn blocks(t: &str) -> Vec<Block> {
    let range = |s: &str| {
        let (a, b) = s.trim().split_once("..").unwrap();
        (a.parse().unwrap(), b.parse().unwrap())
    };
    let devices = |s: &str| -> Vec<usize> {
        s.trim()
            .split(',')
            .flat_map(|p| match p.split_once('-') {
                Some((a, b)) => (a.parse().unwrap()..=b.parse().unwrap()).collect::<Vec<_>>(),
                None => vec![p.parse().unwrap()],
            })
            .collect()
    };
    let cells = |l: &str| -> Vec<String> {
        l.trim_matches('│')
            .split('┆')
            .map(|c| c.trim().to_string())
            .collect()
    };
    let mut lines = t.lines().filter(|l| l.starts_with('│'));
    let cols: Vec<(usize, usize)> = cells(lines.next().unwrap())[1..]
        .iter()
        .map(|c| range(c))
        .collect();
    let mut out = Vec::new();
    for l in lines {
        let c = cells(l);
        let rows = range(
            c[0].trim_start_matches("rows ")
                .trim_end_matches(" (empty)"),
        );
        for (j, cell) in c[1..].iter().enumerate() {
            out.push((rows, cols[j], devices(cell)));
        }
    }
    out
}

/// Every block the table draws is what the named devices hold (independent oracle: the global
/// tensor sliced by hand), and every device appears in exactly one block.
#[test]
fn drawn_blocks_are_the_devices_shards() {
    let m = mesh([("batch", 2), ("feature", 2), ("model", 2)]);
    let (rows, cols) = (6, 5);
    let values: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
    for spec in [
        ["batch", "feature"],
        ["feature", "model"],
        ["unsharded", "model"],
        ["model", "unsharded"],
    ] {
        let l = Layout::new(&m, spec).unwrap();
        let x: Tensor<B, 2> =
            distribute(TensorData::new(values.clone(), [rows, cols]), &l).unwrap();
        let t = x.sharding_table(false);
        assert!(t.starts_with("f32["), "{t}");
        let shards = x.to_local_shards();
        let mut seen = vec![0; 8];
        for ((r0, r1), (c0, c1), devs) in blocks(&t) {
            let expected: Vec<f32> = (r0..r1)
                .flat_map(|r| (c0..c1).map(move |c| (r * cols + c) as f32))
                .collect();
            for d in devs {
                seen[d] += 1;
                let got = shards[d].to_data();
                assert_eq!(
                    got.shape.to_vec(),
                    vec![r1 - r0, c1 - c0],
                    "{spec:?} device {d}"
                );
                assert_eq!(
                    got.to_vec::<f32>().unwrap(),
                    expected,
                    "{spec:?} device {d}"
                );
            }
        }
        assert_eq!(
            seen,
            vec![1; 8],
            "{spec:?}: every device in exactly one block\n{t}"
        );
    }
}
