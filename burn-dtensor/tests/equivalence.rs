//! The promise under test: **a layout never changes the result**. Any op, on any mesh, with any
//! input layouts (uneven and empty shards, pending partial reductions included), gives on
//! `DistributedBackend<NdArray>` what `NdArray` gives on the whole tensor.
//!
//! Every result is checked twice: the gathered value (`into_data`) against the oracle, and every
//! device's own shard (not only the representatives `into_data` reads) against the oracle's
//! chunk under the result's layout, so a wrong replica cannot hide.
//!
//! Data are multiples of 1/8 in [-2, 2] (or of magnitude in [0.5, 2.5] where they divide): sums
//! and matmuls of such values are exact in f32 whatever the order, so a sharded reduction and the
//! oracle agree to the last bit on the linear parts and the tolerance (relative 1e-4, absolute
//! 1e-5) only absorbs transcendental/division rounding.

use std::ops::Range;
use std::sync::Mutex;

use burn::backend::NdArray;
use burn::backend::ndarray::NdArrayDevice;
use burn::tensor::activation::{log_softmax, relu, sigmoid, softmax};
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Distribution, IndexingUpdateOp, Int, Slice, Tensor, TensorData};
use burn_dtensor::{
    CollectiveKind, DTensorError, DTensorExt, DistributedBackend, DistributedDevice,
    DistributedOps, Layout, Mesh, ReduceOp, UNSHARDED, distribute, from_local_shards, record_comms,
    with_creation_layout,
};
use proptest::prelude::*;

type N = NdArray;
type DB = DistributedBackend<NdArray>;
type Dev = NdArrayDevice;

// ---------------------------------------------------------------------------------------------
// Meshes, layouts, data
// ---------------------------------------------------------------------------------------------

/// 1, 2, 4 and 8 virtual devices in 1-D, 2-D and 3-D (size-1 axes included).
const MESHES: &[&[(&str, usize)]] = &[
    &[("s", 1)],
    &[("a", 2)],
    &[("a", 4)],
    &[("x", 8)],
    &[("a", 1), ("b", 2)],
    &[("x", 2), ("y", 4)],
    &[("r", 4), ("c", 2)],
    &[("x", 2), ("y", 2), ("z", 2)],
    &[("p", 2), ("q", 1), ("r", 4)],
];

/// Mesh `i % MESHES.len()`; indices below `MESHES.len()` run in stacked form (the default on a
/// virtual mesh), the others per device (the path of meshes of distinct devices), so that every
/// property covers both.
fn mesh(i: usize) -> Mesh<Dev> {
    let n = MESHES.len();
    Mesh::virtual_devices(MESHES[i % n].iter().copied(), Dev::default())
        .unwrap()
        .with_stacked_execution(i < n)
}

fn mdev(m: &Mesh<Dev>) -> DistributedDevice<Dev> {
    DistributedDevice::new(m.clone())
}

/// A random layout, resolved against a mesh and rank by [`build`]: per dim a choice among the
/// mesh axes or unsharded (an axis already taken falls back to unsharded), plus an optional
/// pending reduction on an axis that shards no dim.
#[derive(Debug, Clone)]
struct LSpec {
    dims: Vec<usize>,
    /// `(axis choice, max instead of sum, also pending on a second free axis)`.
    partial: Option<(usize, bool, bool)>,
}

fn lspec() -> impl Strategy<Value = LSpec> {
    let partial = prop::option::weighted(
        0.4,
        (
            0usize..3,
            prop::bool::weighted(0.2),
            prop::bool::weighted(0.3),
        ),
    );
    (prop::collection::vec(0usize..4, 5), partial)
        .prop_map(|(dims, partial)| LSpec { dims, partial })
}

fn lspec_settled() -> impl Strategy<Value = LSpec> {
    prop::collection::vec(0usize..4, 5).prop_map(|dims| LSpec {
        dims,
        partial: None,
    })
}

fn build(m: &Mesh<Dev>, rank: usize, s: &LSpec) -> Layout {
    let axes = m.topology().axes();
    let n = axes.len();
    let mut used = vec![false; n];
    let spec: Vec<String> = (0..rank)
        .map(|d| {
            let c = s.dims[d % s.dims.len()] % (n + 1);
            if c < n && !used[c] {
                used[c] = true;
                axes[c].0.clone()
            } else {
                UNSHARDED.to_string()
            }
        })
        .collect();
    let mut l = Layout::new(m, spec).unwrap();
    if let Some((a, max, two)) = s.partial {
        // The chosen axis (or the next one that shards no dim), and maybe a second free axis
        // pending the same reduction (mixed kinds never arise: ops settle them).
        let op = if max { ReduceOp::Max } else { ReduceOp::Sum };
        let free: Vec<usize> = (0..n).map(|i| (a + i) % n).filter(|&a| !used[a]).collect();
        for &a in free.iter().take(if two { 2 } else { 1 }) {
            l = l.with_partial(a, op);
        }
    }
    l
}

/// SplitMix64.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Multiples of 1/8 in [-2, 2].
fn data(shape: &[usize], seed: u64) -> TensorData {
    let mut r = Rng(seed);
    TensorData::new(
        (0..numel(shape))
            .map(|_| (r.below(33) as f32 - 16.0) / 8.0)
            .collect::<Vec<f32>>(),
        shape.to_vec(),
    )
}

/// Multiples of 1/8 of magnitude in [0.5, 2.5] (safe denominators).
fn data_nz(shape: &[usize], seed: u64) -> TensorData {
    let mut r = Rng(seed);
    TensorData::new(
        (0..numel(shape))
            .map(|_| {
                let v = (4 + r.below(17)) as f32 / 8.0;
                if r.next() & 1 == 0 { v } else { -v }
            })
            .collect::<Vec<f32>>(),
        shape.to_vec(),
    )
}

fn int_data(shape: &[usize], seed: u64, hi: usize) -> TensorData {
    let mut r = Rng(seed);
    TensorData::new(
        (0..numel(shape))
            .map(|_| r.below(hi) as i64)
            .collect::<Vec<i64>>(),
        shape.to_vec(),
    )
}

/// The distributed tensor: `distribute` under the settled layout, then (for a partial layout)
/// `relayout` to it.
fn dist<const D: usize>(d: &TensorData, l: &Layout) -> Tensor<DB, D> {
    let t: Tensor<DB, D> = distribute(d.clone(), &l.without_partial()).unwrap();
    let t = if l.is_partial() {
        t.relayout(l).unwrap()
    } else {
        t
    };
    assert_eq!(&t.layout(), l);
    t
}

fn dist_int<const D: usize>(d: &TensorData, l: &Layout) -> Tensor<DB, D, Int> {
    let t: Tensor<DB, D, Int> = distribute(d.clone(), l).unwrap();
    assert_eq!(&t.layout(), l);
    t
}

fn orc<const D: usize>(d: &TensorData) -> Tensor<N, D> {
    Tensor::from_data(d.clone(), &Dev::default())
}

fn orc_int<const D: usize>(d: &TensorData) -> Tensor<N, D, Int> {
    Tensor::from_data(d.clone(), &Dev::default())
}

// ---------------------------------------------------------------------------------------------
// Comparison
// ---------------------------------------------------------------------------------------------

fn close(got: &[f32], want: &[f32]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{} values vs {}", got.len(), want.len()));
    }
    let mut bad = Vec::new();
    for (i, (&a, &b)) in got.iter().zip(want).enumerate() {
        let same = (a.is_nan() && b.is_nan())
            || a == b
            || (a.is_finite()
                && b.is_finite()
                && (a - b).abs() <= 1e-4 * a.abs().max(b.abs()) + 1e-5);
        if !same && bad.len() < 5 {
            bad.push(format!("[{i}] {a} != {b}"));
        }
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(bad.join(", "))
    }
}

/// The box `ranges` of a row-major buffer of `shape`.
fn extract<T: Copy>(v: &[T], shape: &[usize], ranges: &[Range<usize>]) -> Vec<T> {
    let mut out = Vec::new();
    if ranges.iter().any(|r| r.is_empty()) {
        return out;
    }
    let rank = shape.len();
    let mut idx: Vec<usize> = ranges.iter().map(|r| r.start).collect();
    loop {
        let off = (0..rank).fold(0, |acc, d| acc * shape[d] + idx[d]);
        out.push(v[off]);
        let mut d = rank;
        loop {
            if d == 0 {
                return out;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < ranges[d].end {
                break;
            }
            idx[d] = ranges[d].start;
        }
    }
}

fn check<const D: usize>(what: &str, got: Tensor<DB, D>, want: Tensor<N, D>) {
    let desc = got.describe();
    let want = want.into_data();
    let shape = want.shape.to_vec();
    let w: Vec<f32> = want.to_vec().unwrap();
    assert_eq!(got.dims().to_vec(), shape, "{what}: global shape of {desc}");
    let g: Vec<f32> = got.clone().into_data().to_vec().unwrap();
    close(&g, &w).unwrap_or_else(|e| panic!("{what} -> {desc}: {e}"));
    // Every device's own shard (a partial result is settled first).
    let l = got.layout();
    let settled = if l.is_partial() {
        got.relayout(&l.without_partial()).unwrap()
    } else {
        got
    };
    let sl = settled.layout();
    for (i, s) in settled.to_local_shards().into_iter().enumerate() {
        let ranges = sl.shard_ranges(&shape, i);
        let lens: Vec<usize> = ranges.iter().map(|r| r.len()).collect();
        assert_eq!(s.dims().to_vec(), lens, "{what} -> {desc}: shard {i} shape");
        let v: Vec<f32> = s.into_data().to_vec().unwrap();
        close(&v, &extract(&w, &shape, &ranges))
            .unwrap_or_else(|e| panic!("{what} -> {desc}: shard {i}: {e}"));
    }
}

fn check_int<const D: usize>(what: &str, got: Tensor<DB, D, Int>, want: Tensor<N, D, Int>) {
    let l = got.layout();
    let g: Vec<i64> = got.into_data().convert::<i64>().to_vec().unwrap();
    let w: Vec<i64> = want.into_data().convert::<i64>().to_vec().unwrap();
    assert_eq!(g, w, "{what} (layout {l})");
}

fn check_bool<const D: usize>(what: &str, got: Tensor<DB, D, Bool>, want: Tensor<N, D, Bool>) {
    let g: Vec<bool> = got.into_data().to_vec().unwrap();
    let w: Vec<bool> = want.into_data().to_vec().unwrap();
    assert_eq!(g, w, "{what}");
}

/// `by_rank!(rank, f(args))` calls `f::<rank>(args)` for a runtime rank of 1 to 4.
macro_rules! by_rank {
    ($r:expr, $f:ident($($a:expr),* $(,)?)) => {
        match $r {
            1 => $f::<1>($($a),*),
            2 => $f::<2>($($a),*),
            3 => $f::<3>($($a),*),
            4 => $f::<4>($($a),*),
            r => unreachable!("rank {r}"),
        }
    };
}

/// 64 cases a property; `PROPTEST_CASES=<n>` runs `n` (a longer soak run by hand).
fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(64),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn shape_strat() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(1usize..=9, 1..=4)
}

fn mesh_strat() -> impl Strategy<Value = usize> {
    0..2 * MESHES.len()
}

// ---------------------------------------------------------------------------------------------
// Element-wise
// ---------------------------------------------------------------------------------------------

fn unary_case<const D: usize>(m: &Mesh<Dev>, shape: &[usize], ls: &LSpec, seed: u64) {
    let d = data(shape, seed);
    let l = build(m, D, ls);
    let x = || dist::<D>(&d, &l);
    let o = || orc::<D>(&d);
    check("exp", x().exp(), o().exp());
    check("tanh", x().tanh(), o().tanh());
    check("relu", relu(x()), relu(o()));
    check("sigmoid", sigmoid(x()), sigmoid(o()));
    check("neg", x().neg(), o().neg());
    check("mul_scalar", x().mul_scalar(-1.5), o().mul_scalar(-1.5));
    check("div_scalar", x().div_scalar(4.0), o().div_scalar(4.0));
    check("add_scalar", x().add_scalar(0.75), o().add_scalar(0.75));
    check("sub_scalar", x().sub_scalar(0.25), o().sub_scalar(0.25));
    check("abs.sqrt", x().abs().sqrt(), o().abs().sqrt());
    check("powf_scalar", x().powf_scalar(2.0), o().powf_scalar(2.0));
    check("clamp", x().clamp(-0.5, 1.0), o().clamp(-0.5, 1.0));
    check(
        "neg.mul_scalar.exp",
        x().neg().mul_scalar(0.5).exp(),
        o().neg().mul_scalar(0.5).exp(),
    );
}

fn broadcast_shape(shape: &[usize], ones: &[bool]) -> Vec<usize> {
    shape
        .iter()
        .enumerate()
        .map(|(d, &n)| if ones[d] { 1 } else { n })
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn binary_case<const D: usize>(
    m: &Mesh<Dev>,
    shape: &[usize],
    ones: &[bool],
    swap: bool,
    la: &LSpec,
    lb: &LSpec,
    same_partial: bool,
    seed: u64,
) {
    let small = broadcast_shape(shape, ones);
    let (sa, sb) = if swap {
        (small, shape.to_vec())
    } else {
        (shape.to_vec(), small)
    };
    let (da, db) = (data_nz(&sa, seed), data_nz(&sb, seed ^ 0xB));
    let la = build(m, D, la);
    let mut lb = build(m, D, lb);
    if same_partial {
        // The same pending sums on both sides (when the axes shard nothing of `b`): stays partial.
        let mut l = lb.without_partial();
        for a in 0..m.topology().ndim() {
            if la.partial(a) == Some(ReduceOp::Sum) && l.axis_dim(a).is_none() {
                l = l.with_partial(a, ReduceOp::Sum);
            }
        }
        lb = l;
    }
    let a = || dist::<D>(&da, &la);
    let b = || dist::<D>(&db, &lb);
    let (oa, ob) = (|| orc::<D>(&da), || orc::<D>(&db));
    check("add", a().add(b()), oa().add(ob()));
    check("sub", a().sub(b()), oa().sub(ob()));
    check("rsub", b().sub(a()), ob().sub(oa()));
    check("mul", a().mul(b()), oa().mul(ob()));
    check("div", a().div(b()), oa().div(ob()));
    check("rdiv", b().div(a()), ob().div(oa()));
    check("(a*b)+a", a().mul(b()).add(a()), oa().mul(ob()).add(oa()));
    check("(a-b).exp", a().sub(b()).exp(), oa().sub(ob()).exp());
    check(
        "a*2-b",
        a().mul_scalar(2.0).sub(b()),
        oa().mul_scalar(2.0).sub(ob()),
    );
}

#[allow(clippy::too_many_arguments)]
fn compare_mask_case<const D: usize>(
    m: &Mesh<Dev>,
    shape: &[usize],
    ones: &[bool],
    la: &LSpec,
    lb: &LSpec,
    lc: &LSpec,
    seed: u64,
) {
    let small = broadcast_shape(shape, ones);
    let (da, db, dc) = (
        data(shape, seed),
        data(&small, seed ^ 0xB),
        data(shape, seed ^ 0xC),
    );
    let (la, lb, lc) = (build(m, D, la), build(m, D, lb), build(m, D, lc));
    let a = || dist::<D>(&da, &la);
    let b = || dist::<D>(&db, &lb);
    let c = || dist::<D>(&dc, &lc);
    let (oa, ob, oc) = (|| orc::<D>(&da), || orc::<D>(&db), || orc::<D>(&dc));
    check_bool("greater", a().greater(b()), oa().greater(ob()));
    check_bool("lower_equal", a().lower_equal(b()), oa().lower_equal(ob()));
    check_bool("equal", a().equal(b()), oa().equal(ob()));
    check_bool(
        "greater_elem",
        a().greater_elem(0.25),
        oa().greater_elem(0.25),
    );
    // A mask of a third layout.
    let mask = || c().lower_elem(0.0);
    let omask = || oc().lower_elem(0.0);
    check(
        "mask_fill",
        a().mask_fill(mask(), 9.0),
        oa().mask_fill(omask(), 9.0),
    );
    check(
        "mask_where",
        a().mask_where(mask(), c().mul_scalar(3.0)),
        oa().mask_where(omask(), oc().mul_scalar(3.0)),
    );
    // A mask from a broadcast comparison.
    let bm = || a().greater(b());
    let obm = || oa().greater(ob());
    check(
        "mask_where(a>b, a, c)",
        c().mask_where(bm(), a()),
        oc().mask_where(obm(), oa()),
    );
    check("bool_into_float", bm().float(), obm().float());
    check_bool(
        "bool_not.and",
        bm().bool_not().bool_and(mask()),
        obm().bool_not().bool_and(omask()),
    );
}

/// Every settled layout of a rank-`rank` tensor on `m`, plus, for each, every pending
/// reduction (sum or max) on one free axis and a pending sum on all free axes at once.
fn all_layouts_with_partial(m: &Mesh<Dev>, rank: usize) -> Vec<Layout> {
    let mut out = Vec::new();
    for l in all_layouts(m, rank) {
        let free: Vec<usize> = (0..m.topology().ndim())
            .filter(|&a| l.axis_dim(a).is_none())
            .collect();
        for &a in &free {
            out.push(l.clone().with_partial(a, ReduceOp::Sum));
            out.push(l.clone().with_partial(a, ReduceOp::Max));
        }
        if free.len() > 1 {
            out.push(
                free.iter()
                    .fold(l.clone(), |l, &a| l.with_partial(a, ReduceOp::Sum)),
            );
        }
        out.push(l);
    }
    out
}

/// Every pair of layouts (partial ones included) for every binary op, without and with
/// broadcasting on either side, on a 2x4 mesh with uneven dims.
#[test]
fn binary_every_layout_pair() {
    let m = mesh(5); // x=2, y=4
    let ls = all_layouts_with_partial(&m, 2);
    for (sa, sb) in [([5, 3], [5, 3]), ([5, 3], [1, 3]), ([5, 1], [5, 3])] {
        let (da, db) = (data_nz(&sa, 1), data_nz(&sb, 2));
        for la in &ls {
            for lb in &ls {
                let ctx = format!("{la} . {lb}");
                let a = || dist::<2>(&da, la);
                let b = || dist::<2>(&db, lb);
                let (oa, ob) = (|| orc::<2>(&da), || orc::<2>(&db));
                check(&format!("add {ctx}"), a().add(b()), oa().add(ob()));
                check(&format!("sub {ctx}"), a().sub(b()), oa().sub(ob()));
                check(&format!("mul {ctx}"), a().mul(b()), oa().mul(ob()));
                check(&format!("div {ctx}"), a().div(b()), oa().div(ob()));
            }
        }
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn pointwise_unary(mi in mesh_strat(), shape in shape_strat(), l in lspec(), seed in any::<u64>()) {
        let m = mesh(mi);
        by_rank!(shape.len(), unary_case(&m, &shape, &l, seed));
    }

    #[test]
    fn pointwise_binary_broadcast(
        mi in mesh_strat(), shape in shape_strat(), ones in prop::collection::vec(prop::bool::weighted(0.3), 4),
        swap in any::<bool>(), la in lspec(), lb in lspec(), same_partial in prop::bool::weighted(0.3), seed in any::<u64>(),
    ) {
        let m = mesh(mi);
        by_rank!(shape.len(), binary_case(&m, &shape, &ones, swap, &la, &lb, same_partial, seed));
    }

    #[test]
    fn compare_and_mask(
        mi in mesh_strat(), shape in shape_strat(), ones in prop::collection::vec(prop::bool::weighted(0.3), 4),
        la in lspec(), lb in lspec(), lc in lspec(), seed in any::<u64>(),
    ) {
        let m = mesh(mi);
        by_rank!(shape.len(), compare_mask_case(&m, &shape, &ones, &la, &lb, &lc, seed));
    }
}

// ---------------------------------------------------------------------------------------------
// Matmul
// ---------------------------------------------------------------------------------------------

fn matmul_case<const D: usize>(ls: &[usize], rs: &[usize], la: &Layout, lb: &Layout, seed: u64) {
    let (da, db) = (data(ls, seed), data(rs, seed ^ 0xB));
    let got = dist::<D>(&da, la).matmul(dist::<D>(&db, lb));
    check(
        &format!("matmul {la} x {lb}"),
        got,
        orc::<D>(&da).matmul(orc::<D>(&db)),
    );
}

/// Every layout (each dim unsharded or a distinct axis) of a rank-`rank` tensor on `m`.
fn all_layouts(m: &Mesh<Dev>, rank: usize) -> Vec<Layout> {
    let n = m.topology().ndim();
    let mut out = Vec::new();
    let total = (n + 1).pow(rank as u32);
    'next: for code in 0..total {
        let mut c = code;
        let mut spec = Vec::new();
        let mut used = vec![false; n];
        for _ in 0..rank {
            let v = c % (n + 1);
            c /= n + 1;
            if v < n {
                if used[v] {
                    continue 'next;
                }
                used[v] = true;
                spec.push(m.topology().axis_name(v).to_string());
            } else {
                spec.push(UNSHARDED.to_string());
            }
        }
        out.push(Layout::new(m, spec).unwrap());
    }
    out
}

/// Every combination of sharded batch / free / contracting dims, on a 3-D mesh of 2x2x2 and on
/// a 2x4 mesh, with uneven sizes (and a contracting dim smaller than an axis).
#[test]
fn matmul_every_layout_pair() {
    for mi in [7, 5] {
        let m = mesh(mi);
        let l2 = all_layouts(&m, 2);
        for la in &l2 {
            for lb in &l2 {
                matmul_case::<2>(&[5, 3], &[3, 7], la, lb, 1);
            }
        }
    }
    let m = mesh(7);
    let l3 = all_layouts(&m, 3);
    assert_eq!(l3.len(), 34);
    for la in &l3 {
        for lb in &l3 {
            matmul_case::<3>(&[3, 5, 7], &[3, 7, 2], la, lb, 2);
        }
    }
}

/// The embedding lookup and its backward (the table only gives the shape) under every pair of
/// table and ids layouts (vocabulary-parallel tables included), with an output gradient in a
/// replicated, a partial and (rotating through them all) every sharded layout: on a 2x2x2 mesh
/// with uneven sizes, and on a 2x4 mesh with a vocabulary of 3 (a device without rows). The
/// rule picks a vocabulary-parallel lookup only where its all-reduce is the cheaper move, so
/// the cases span both: a small table (gathered) and a large one or few ids (vocabulary
/// parallel).
#[test]
fn embedding_every_layout_pair() {
    use burn::tensor::TensorPrimitive;
    use burn::tensor::module::embedding;
    use burn::tensor::ops::ModuleOps;
    for (mi, vocab, [b, s]) in [(7, 7, [3, 5]), (7, 40, [3, 5]), (5, 3, [1, 1])] {
        let m = mesh(mi);
        let (l2, l3) = (all_layouts(&m, 2), all_layouts(&m, 3));
        let dw = data(&[vocab, 5], 3);
        let (dids, dg) = (int_data(&[b, s], 4, vocab), data(&[b, s, 5], 5));
        let want = embedding(orc::<2>(&dw), orc_int::<2>(&dids));
        let want_grad =
            Tensor::<N, 2>::from_primitive(TensorPrimitive::Float(N::embedding_backward(
                orc::<2>(&dw).into_primitive().tensor(),
                orc::<3>(&dg).into_primitive().tensor(),
                orc_int::<2>(&dids).into_primitive(),
            )));
        let partial = Layout::replicated(&m, 3).with_partial(1, ReduceOp::Sum);
        let mut k = 0;
        for lw in &l2 {
            for li in &l2 {
                let got = embedding(dist::<2>(&dw, lw), dist_int::<2>(&dids, li));
                check(&format!("embedding {lw}, ids {li}"), got, want.clone());
                for lg in [
                    Layout::replicated(&m, 3),
                    partial.clone(),
                    l3[k % l3.len()].clone(),
                ] {
                    k += 1;
                    let got = DB::embedding_backward(
                        dist::<2>(&dw, lw).into_primitive().tensor(),
                        dist::<3>(&dg, &lg).into_primitive().tensor(),
                        dist_int::<2>(&dids, li).into_primitive(),
                    );
                    check(
                        &format!("embedding_backward {lw}, grad {lg}, ids {li}"),
                        Tensor::<DB, 2>::from_primitive(TensorPrimitive::Float(got)),
                        want_grad.clone(),
                    );
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn matmul_2d(mi in mesh_strat(), mkn in prop::collection::vec(1usize..=9, 3), la in lspec(), lb in lspec(), seed in any::<u64>()) {
        let m = mesh(mi);
        let (ls, rs) = ([mkn[0], mkn[1]], [mkn[1], mkn[2]]);
        matmul_case::<2>(&ls, &rs, &build(&m, 2, &la), &build(&m, 2, &lb), seed);
    }

    #[test]
    fn matmul_batched(
        mi in mesh_strat(), dims in prop::collection::vec(1usize..=9, 5), bcast in 0usize..3, rank4 in any::<bool>(),
        la in lspec(), lb in lspec(), seed in any::<u64>(),
    ) {
        let m = mesh(mi);
        let (b0, b1, mm, k, n) = (dims[0], dims[1], dims[2], dims[3], dims[4]);
        // Batch dims possibly broadcast (size 1) on one side.
        let (lb0, rb0) = match bcast { 0 => (b0, b0), 1 => (1, b0), _ => (b0, 1) };
        if rank4 {
            let (ls, rs) = ([lb0, b1, mm, k], [rb0, b1, k, n]);
            matmul_case::<4>(&ls, &rs, &build(&m, 4, &la), &build(&m, 4, &lb), seed);
        } else {
            let (ls, rs) = ([lb0, mm, k], [rb0, k, n]);
            matmul_case::<3>(&ls, &rs, &build(&m, 3, &la), &build(&m, 3, &lb), seed);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Reductions
// ---------------------------------------------------------------------------------------------

fn reduce_case<const D: usize>(m: &Mesh<Dev>, shape: &[usize], ls: &LSpec, dim: usize, seed: u64) {
    let dim = dim % D;
    let d = data(shape, seed);
    let l = build(m, D, ls);
    let x = || dist::<D>(&d, &l);
    let o = || orc::<D>(&d);
    check("sum", x().sum(), o().sum());
    check("mean", x().mean(), o().mean());
    check("max", x().max(), o().max());
    check("min", x().min(), o().min());
    check("sum_dim", x().sum_dim(dim), o().sum_dim(dim));
    check("mean_dim", x().mean_dim(dim), o().mean_dim(dim));
    check("max_dim", x().max_dim(dim), o().max_dim(dim));
    check("min_dim", x().min_dim(dim), o().min_dim(dim));
    check("var", x().var(dim), o().var(dim));
    check("prod_dim", x().prod_dim(dim), o().prod_dim(dim));
    check("cumsum", x().cumsum(dim), o().cumsum(dim));
    check_int("argmax", x().argmax(dim), o().argmax(dim));
    check_int("argmin", x().argmin(dim), o().argmin(dim));
    check(
        "sum_dim.exp",
        x().sum_dim(dim).exp(),
        o().sum_dim(dim).exp(),
    );
    check(
        "max_dim.neg",
        x().max_dim(dim).neg(),
        o().max_dim(dim).neg(),
    );
    check(
        "sum_dim twice",
        x().sum_dim(dim).sum_dim(D - 1 - dim),
        o().sum_dim(dim).sum_dim(D - 1 - dim),
    );
    // Over the size-1 dim the first sum left (a pending sum where `dim` was sharded): the
    // operand itself, no inner op; then an op that reads it settled.
    check(
        "sum_dim over a dim of one",
        x().sum_dim(dim).sum_dim(dim).exp(),
        o().sum_dim(dim).sum_dim(dim).exp(),
    );
    let (v, i) = x().max_dim_with_indices(dim);
    let (ov, oi) = o().max_dim_with_indices(dim);
    check("max_dim_with_indices", v, ov);
    check_int("max_dim_with_indices.idx", i, oi);
}

/// Int tensors: arithmetic, reductions (partial int sums and maxima), comparisons, casts.
fn int_case<const D: usize>(
    m: &Mesh<Dev>,
    shape: &[usize],
    la: &LSpec,
    lb: &LSpec,
    dim: usize,
    seed: u64,
) {
    let dim = dim % D;
    let da = int_data(shape, seed, 7);
    let db = TensorData::new(
        int_data(shape, seed ^ 1, 4)
            .to_vec::<i64>()
            .unwrap()
            .into_iter()
            .map(|v| v + 1)
            .collect::<Vec<i64>>(),
        shape.to_vec(),
    );
    let (la, lb) = (build(m, D, la), build(m, D, lb));
    let a = || dist_int::<D>(&da, &la);
    let b = || dist_int::<D>(&db, &lb);
    let (oa, ob) = (|| orc_int::<D>(&da), || orc_int::<D>(&db));
    check_int("int add", a().add(b()), oa().add(ob()));
    check_int("int sub", a().sub(b()), oa().sub(ob()));
    check_int("int mul", a().mul(b()), oa().mul(ob()));
    check_int("int div", a().div(b()), oa().div(ob()));
    check_int("int mul_scalar", a().mul_scalar(-3), oa().mul_scalar(-3));
    check_int("int sum", a().sum(), oa().sum());
    check_int("int sum_dim", a().sum_dim(dim), oa().sum_dim(dim));
    check_int("int mean_dim", a().mean_dim(dim), oa().mean_dim(dim));
    check_int("int max_dim", a().max_dim(dim), oa().max_dim(dim));
    check_int("int min_dim", a().min_dim(dim), oa().min_dim(dim));
    check_int("int prod_dim", a().prod_dim(dim), oa().prod_dim(dim));
    check_int("int argmax", a().argmax(dim), oa().argmax(dim));
    check_int("int cumsum", a().cumsum(dim), oa().cumsum(dim));
    check_bool("int greater", a().greater(b()), oa().greater(ob()));
    check("int float", a().float(), oa().float());
    check_int(
        "float int",
        a().float().mul_scalar(0.5).int(),
        oa().float().mul_scalar(0.5).int(),
    );
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn int_ops(mi in mesh_strat(), shape in shape_strat(), la in lspec(), lb in lspec(), dim in 0usize..4, seed in any::<u64>()) {
        let m = mesh(mi);
        by_rank!(shape.len(), int_case(&m, &shape, &la, &lb, dim, seed));
    }

    #[test]
    fn int_matmul(mi in mesh_strat(), mkn in prop::collection::vec(1usize..=9, 3), la in lspec(), lb in lspec(), seed in any::<u64>()) {
        let m = mesh(mi);
        let (da, db) = (int_data(&[mkn[0], mkn[1]], seed, 5), int_data(&[mkn[1], mkn[2]], seed ^ 1, 5));
        let got = dist_int::<2>(&da, &build(&m, 2, &la)).matmul(dist_int::<2>(&db, &build(&m, 2, &lb)));
        check_int("int matmul", got, orc_int::<2>(&da).matmul(orc_int::<2>(&db)));
    }

    #[test]
    fn reductions(mi in mesh_strat(), shape in shape_strat(), l in lspec(), dim in 0usize..4, seed in any::<u64>()) {
        let m = mesh(mi);
        by_rank!(shape.len(), reduce_case(&m, &shape, &l, dim, seed));
    }
}

// ---------------------------------------------------------------------------------------------
// Views: swap_dims, permute, transpose, reshape, flatten, unsqueeze, expand
// ---------------------------------------------------------------------------------------------

fn arr<const D: usize>(v: &[usize]) -> [usize; D] {
    v.try_into().unwrap()
}

fn permute_case<const D: usize>(
    m: &Mesh<Dev>,
    shape: &[usize],
    ls: &LSpec,
    perm: &[usize],
    seed: u64,
) {
    let d = data(shape, seed);
    let l = build(m, D, ls);
    let x = || dist::<D>(&d, &l);
    let o = || orc::<D>(&d);
    let perm: Vec<usize> = perm.iter().copied().filter(|&p| p < D).collect();
    let (d1, d2) = (perm[0], perm[D - 1]);
    check("swap_dims", x().swap_dims(d1, d2), o().swap_dims(d1, d2));
    check(
        "permute",
        x().permute(arr::<D>(&perm)),
        o().permute(arr::<D>(&perm)),
    );
    if D >= 2 {
        check("transpose", x().transpose(), o().transpose());
    }
    check(
        "permute.exp.sum_dim",
        x().permute(arr::<D>(&perm)).exp().sum_dim(0),
        o().permute(arr::<D>(&perm)).exp().sum_dim(0),
    );
}

fn reshape_to<const D: usize, const D2: usize>(d: &TensorData, l: &Layout, to: &[usize]) {
    let got = dist::<D>(d, l).reshape(arr::<D2>(to));
    check(
        &format!("reshape {:?} ({l}) -> {to:?}", d.shape),
        got,
        orc::<D>(d).reshape(arr::<D2>(to)),
    );
}

fn reshape_from<const D: usize>(d: &TensorData, l: &Layout, to: &[usize]) {
    match to.len() {
        1 => reshape_to::<D, 1>(d, l, to),
        2 => reshape_to::<D, 2>(d, l, to),
        3 => reshape_to::<D, 3>(d, l, to),
        4 => reshape_to::<D, 4>(d, l, to),
        5 => reshape_to::<D, 5>(d, l, to),
        r => unreachable!("rank {r}"),
    }
}

fn primes(mut n: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut p = 2;
    while n > 1 {
        while n.is_multiple_of(p) {
            out.push(p);
            n /= p;
        }
        p += 1;
    }
    out
}

/// Target shapes for a reshape: whole flatten, the dims' own sizes with a 1 inserted, merged
/// neighbours, split dims, and a random regrouping of the prime factors.
fn reshape_targets(shape: &[usize], seed: u64) -> Vec<Vec<usize>> {
    let mut r = Rng(seed);
    let mut t = vec![vec![numel(shape)]];
    let mut ins = shape.to_vec();
    ins.insert(r.below(shape.len() + 1), 1);
    t.push(ins);
    if shape.len() >= 2 {
        let i = r.below(shape.len() - 1);
        let mut merged = shape.to_vec();
        let v = merged.remove(i + 1);
        merged[i] *= v;
        t.push(merged);
    }
    if shape.len() < 4 {
        let i = r.below(shape.len());
        let ps = primes(shape[i]);
        if ps.len() >= 2 {
            let mut split = shape.to_vec();
            split[i] = ps[0];
            split.insert(i + 1, shape[i] / ps[0]);
            t.push(split);
        }
    }
    let mut ps: Vec<usize> = shape.iter().flat_map(|&n| primes(n)).collect();
    for i in (1..ps.len()).rev() {
        ps.swap(i, r.below(i + 1));
    }
    let rank = 1 + r.below(4);
    let mut regroup = vec![1; rank];
    for p in ps {
        regroup[r.below(rank)] *= p;
    }
    t.push(regroup);
    t.retain(|s| s.len() <= 5);
    t
}

fn view_case<const D: usize>(m: &Mesh<Dev>, shape: &[usize], ls: &LSpec, seed: u64) {
    let d = data(shape, seed);
    let l = build(m, D, ls);
    for to in reshape_targets(shape, seed) {
        reshape_from::<D>(&d, &l, &to);
    }
    let x = || dist::<D>(&d, &l);
    let o = || orc::<D>(&d);
    check(
        "flatten",
        x().flatten::<1>(0, D - 1),
        o().flatten::<1>(0, D - 1),
    );
    if D >= 3 {
        check(
            "flatten(1, D-1)",
            x().flatten::<2>(1, D - 1),
            o().flatten::<2>(1, D - 1),
        );
    }
    let pos = (seed as usize) % (D + 1);
    match D {
        1 => check(
            "unsqueeze_dim",
            dist::<1>(&d, &l).unsqueeze_dim::<2>(pos),
            orc::<1>(&d).unsqueeze_dim::<2>(pos),
        ),
        2 => check(
            "unsqueeze_dim",
            dist::<2>(&d, &l).unsqueeze_dim::<3>(pos),
            orc::<2>(&d).unsqueeze_dim::<3>(pos),
        ),
        3 => check(
            "unsqueeze_dim",
            dist::<3>(&d, &l).unsqueeze_dim::<4>(pos),
            orc::<3>(&d).unsqueeze_dim::<4>(pos),
        ),
        _ => check(
            "unsqueeze_dim",
            dist::<4>(&d, &l).unsqueeze_dim::<5>(pos),
            orc::<4>(&d).unsqueeze_dim::<5>(pos),
        ),
    }
}

fn expand_case<const D: usize>(
    m: &Mesh<Dev>,
    shape: &[usize],
    ones: &[bool],
    ls: &LSpec,
    seed: u64,
) {
    // The input has size-1 dims (possibly sharded: empty shards) that expand to `shape`.
    let small = broadcast_shape(shape, ones);
    let d = data(&small, seed);
    let l = build(m, D, ls);
    check(
        "expand",
        dist::<D>(&d, &l).expand(arr::<D>(shape)),
        orc::<D>(&d).expand(arr::<D>(shape)),
    );
    let reps: Vec<usize> = (0..D).map(|i| 1 + (seed as usize >> (2 * i)) % 3).collect();
    check(
        "repeat",
        dist::<D>(&d, &l).repeat(&reps),
        orc::<D>(&d).repeat(&reps),
    );
    let dim = seed as usize % D;
    check(
        "repeat_dim",
        dist::<D>(&d, &l).repeat_dim(dim, 3),
        orc::<D>(&d).repeat_dim(dim, 3),
    );
    // Expanding to one more (leading) dim.
    let mut big = vec![3];
    big.extend_from_slice(shape);
    match D {
        1 => check(
            "expand+1",
            dist::<1>(&d, &l).expand(arr::<2>(&big)),
            orc::<1>(&d).expand(arr::<2>(&big)),
        ),
        2 => check(
            "expand+1",
            dist::<2>(&d, &l).expand(arr::<3>(&big)),
            orc::<2>(&d).expand(arr::<3>(&big)),
        ),
        3 => check(
            "expand+1",
            dist::<3>(&d, &l).expand(arr::<4>(&big)),
            orc::<3>(&d).expand(arr::<4>(&big)),
        ),
        _ => check(
            "expand+1",
            dist::<4>(&d, &l).expand(arr::<5>(&big)),
            orc::<4>(&d).expand(arr::<5>(&big)),
        ),
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn permutations(mi in mesh_strat(), shape in shape_strat(), l in lspec(), perm in Just(vec![0usize, 1, 2, 3]).prop_shuffle(), seed in any::<u64>()) {
        let m = mesh(mi);
        by_rank!(shape.len(), permute_case(&m, &shape, &l, &perm, seed));
    }

    #[test]
    fn reshapes(mi in mesh_strat(), shape in shape_strat(), l in lspec(), seed in any::<u64>()) {
        let m = mesh(mi);
        by_rank!(shape.len(), view_case(&m, &shape, &l, seed));
    }

    #[test]
    fn expand_and_repeat(
        mi in mesh_strat(), shape in shape_strat(), ones in prop::collection::vec(prop::bool::weighted(0.5), 4),
        l in lspec(), seed in any::<u64>(),
    ) {
        let m = mesh(mi);
        by_rank!(shape.len(), expand_case(&m, &shape, &ones, &l, seed));
    }
}

// ---------------------------------------------------------------------------------------------
// Indexing: slice, narrow, select, gather, cat, softmax
// ---------------------------------------------------------------------------------------------

fn index_case<const D: usize>(m: &Mesh<Dev>, shape: &[usize], ls: &LSpec, li: &LSpec, seed: u64) {
    let mut r = Rng(seed ^ 0x5EED);
    let d = data(shape, seed);
    let l = build(m, D, ls);
    let x = || dist::<D>(&d, &l);
    let o = || orc::<D>(&d);
    let dim = r.below(D);

    // slice: a random range (step 1 or 2) per dim, some dims whole.
    let slices: Vec<Slice> = shape
        .iter()
        .map(|&n| {
            if r.below(3) == 0 {
                return Slice::full();
            }
            let s = r.below(n);
            let e = s + 1 + r.below(n - s);
            Slice::new(s as isize, Some(e as isize), 1 + r.below(2) as isize)
        })
        .collect();
    check(
        &format!("slice {slices:?}"),
        x().slice(&slices),
        o().slice(&slices),
    );
    let n = shape[dim];
    let start = r.below(n);
    let len = 1 + r.below(n - start);
    check(
        "narrow",
        x().narrow(dim, start, len),
        o().narrow(dim, start, len),
    );

    // select: random indices (repeats allowed), replicated or sharded over an axis (an
    // embedding lookup of batch-sharded ids).
    let k = 1 + r.below(6);
    let idx = TensorData::new((0..k).map(|_| r.below(n) as i64).collect::<Vec<i64>>(), [k]);
    let lidx = build(
        m,
        1,
        &LSpec {
            dims: vec![li.dims[0]],
            partial: None,
        },
    );
    check(
        &format!("select, indices {lidx}"),
        x().select(dim, dist_int::<1>(&idx, &lidx)),
        o().select(dim, orc_int::<1>(&idx)),
    );

    // gather (as cross-entropy uses it): indices of the tensor's shape off `dim`, any layout.
    let mut ishape = shape.to_vec();
    ishape[dim] = 1 + r.below(4);
    let gi = int_data(&ishape, seed ^ 0x6, n);
    let gl = build(m, D, li);
    check(
        "gather",
        x().gather(dim, dist_int::<D>(&gi, &gl)),
        o().gather(dim, orc_int::<D>(&gi)),
    );

    // The backward ops of slice, gather and select: slice_assign, scatter-add, select-add,
    // with values of yet another layout.
    let vshape: Vec<usize> = slices
        .iter()
        .zip(shape)
        .map(|(s, &n)| s.output_size(n))
        .collect();
    let dv = data(&vshape, seed ^ 0x7);
    let lv = build(
        m,
        D,
        &LSpec {
            dims: li.dims.iter().map(|c| c + 1).collect(),
            partial: ls.partial,
        },
    );
    check(
        "slice_assign",
        x().slice_assign(&slices, dist::<D>(&dv, &lv)),
        o().slice_assign(&slices, orc::<D>(&dv)),
    );
    let sv = data(&ishape, seed ^ 0x8);
    check(
        "scatter add",
        x().scatter(
            dim,
            dist_int::<D>(&gi, &gl),
            dist::<D>(&sv, &lv),
            IndexingUpdateOp::Add,
        ),
        o().scatter(dim, orc_int::<D>(&gi), orc::<D>(&sv), IndexingUpdateOp::Add),
    );
    let mut selshape = shape.to_vec();
    selshape[dim] = k;
    let dsel = data(&selshape, seed ^ 0x9);
    check(
        &format!("select_assign add, indices {lidx}"),
        x().select_assign(
            dim,
            dist_int::<1>(&idx, &lidx),
            dist::<D>(&dsel, &lv),
            IndexingUpdateOp::Add,
        ),
        o().select_assign(
            dim,
            orc_int::<1>(&idx),
            orc::<D>(&dsel),
            IndexingUpdateOp::Add,
        ),
    );

    // cat: three tensors of different layouts and sizes along `dim`.
    let mut s2 = shape.to_vec();
    s2[dim] = 1 + r.below(5);
    let d2 = data(&s2, seed ^ 0x2);
    let l2 = build(
        m,
        D,
        &LSpec {
            dims: li.dims.iter().rev().copied().collect(),
            partial: ls.partial,
        },
    );
    let d3 = data(shape, seed ^ 0x3);
    let l3 = build(m, D, li);
    let got = Tensor::cat(vec![x(), dist::<D>(&d2, &l2), dist::<D>(&d3, &l3)], dim);
    check(
        "cat",
        got,
        Tensor::cat(vec![o(), orc::<D>(&d2), orc::<D>(&d3)], dim),
    );

    // softmax and log_softmax along a random dim.
    check("softmax", softmax(x(), dim), softmax(o(), dim));
    check("log_softmax", log_softmax(x(), dim), log_softmax(o(), dim));
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn indexing(mi in mesh_strat(), shape in shape_strat(), l in lspec(), li in lspec_settled(), seed in any::<u64>()) {
        let m = mesh(mi);
        by_rank!(shape.len(), index_case(&m, &shape, &l, &li, seed));
    }

    /// Cross-entropy's exact pattern: `log_softmax(logits, 1).gather(1, targets.reshape([n, 1]))`
    /// then `mean().neg()`, with batch-sharded logits and targets.
    #[test]
    fn cross_entropy_pattern(mi in mesh_strat(), n in 1usize..=9, c in 1usize..=9, ll in lspec(), lt in lspec_settled(), seed in any::<u64>()) {
        let m = mesh(mi);
        let (dl, dt) = (data(&[n, c], seed), int_data(&[n], seed ^ 1, c));
        let logits = dist::<2>(&dl, &build(&m, 2, &ll));
        let targets = dist_int::<1>(&dt, &build(&m, 1, &lt));
        let got = log_softmax(logits, 1).gather(1, targets.reshape([n, 1])).reshape([n]).mean().neg();
        let want = log_softmax(orc::<2>(&dl), 1).gather(1, orc_int::<1>(&dt).reshape([n, 1])).reshape([n]).mean().neg();
        check("cross-entropy", got, want);
    }
}

// ---------------------------------------------------------------------------------------------
// Creation and relayout
// ---------------------------------------------------------------------------------------------

/// The decorator's random stream is process-global: tests that seed and draw hold this lock.
static RNG_LOCK: Mutex<()> = Mutex::new(());

fn creation_case<const D: usize>(m: &Mesh<Dev>, shape: &[usize], ls: &LSpec) {
    let l = build(m, D, ls);
    let dv = mdev(m);
    let s = arr::<D>(shape);
    check(
        "zeros",
        Tensor::<DB, D>::zeros(s, &dv).relayout(&l).unwrap(),
        Tensor::<N, D>::zeros(s, &Dev::default()),
    );
    check(
        "ones",
        Tensor::<DB, D>::ones(s, &dv).relayout(&l).unwrap(),
        Tensor::<N, D>::ones(s, &Dev::default()),
    );
    check(
        "full",
        Tensor::<DB, D>::full(s, -2.5, &dv).relayout(&l).unwrap(),
        Tensor::<N, D>::full(s, -2.5, &Dev::default()),
    );
    let (got, one) = {
        let _g = RNG_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        DB::seed(&dv, 7);
        let got = Tensor::<DB, D>::random(s, Distribution::Default, &dv);
        let single = mdev(&Mesh::single(Dev::default()));
        DB::seed(&single, 7);
        let one = Tensor::<DB, D>::random(s, Distribution::Default, &single);
        (got, one)
    };
    // Identical values on every mesh (against the mesh of one), bit for bit, then under any
    // layout, against NdArray holding those values.
    let want = Tensor::<N, D>::from_data(one.into_data(), &Dev::default());
    got.clone()
        .into_data()
        .assert_eq(&want.clone().into_data(), true);
    check("random", got.relayout(&l).unwrap(), want);
}

fn relayout_case<const D: usize>(
    m: &Mesh<Dev>,
    shape: &[usize],
    from: &LSpec,
    to: &LSpec,
    to2: &LSpec,
    seed: u64,
) {
    let d = data(shape, seed);
    let (lf, lt, lt2) = (build(m, D, from), build(m, D, to), build(m, D, to2));
    let x = dist::<D>(&d, &lf);
    let y = x.relayout(&lt).unwrap();
    assert_eq!(y.layout(), lt);
    check(&format!("relayout {lf} -> {lt}"), y.clone(), orc::<D>(&d));
    let z = y.relayout(&lt2).unwrap();
    check(&format!("relayout {lf} -> {lt} -> {lt2}"), z, orc::<D>(&d));
    // Int tensors (settled layouts).
    let di = int_data(shape, seed, 100);
    let xi = dist_int::<D>(&di, &lf.without_partial());
    let yi = xi.relayout(&lt.without_partial()).unwrap();
    check_int("relayout_int", yi, orc_int::<D>(&di));
}

/// A tensor on mesh `m1` relaid out to a layout of mesh `m2` (JAX's `device_put` to another
/// mesh's sharding), and back: the global value and every target shard are the data's; int and
/// bool tensors too. `to_device` gives the target mesh's creation layout (replicated, or a
/// scoped creation layout) with the same values.
fn across_meshes_case<const D: usize>(
    (m1, m2): (&Mesh<Dev>, &Mesh<Dev>),
    shape: &[usize],
    (from, to): (&LSpec, &LSpec),
    seed: u64,
) {
    let d = data(shape, seed);
    let (lf, lt) = (build(m1, D, from), build(m2, D, to));
    let x = dist::<D>(&d, &lf);
    let y = x.clone().relayout(&lt).unwrap();
    assert_eq!(y.layout(), lt);
    check(&format!("relayout {lf} -> {lt}"), y.clone(), orc::<D>(&d));
    let back = y.relayout(&lf.without_partial()).unwrap();
    check(
        &format!("relayout {lf} -> {lt} -> back"),
        back,
        orc::<D>(&d),
    );
    // `to_device` onto the tensor's own mesh leaves it as it is (as Burn's does).
    let same = m1.id() == m2.id();
    let moved = x.clone().to_device(&mdev(m2));
    let created = |l: Layout| if same { lf.clone() } else { l };
    assert_eq!(moved.layout(), created(Layout::replicated(m2, D)));
    check(&format!("to_device {lf} -> {m2}"), moved, orc::<D>(&d));
    let settled = lt.without_partial();
    let moved = with_creation_layout(&settled, shape, || x.to_device(&mdev(m2))).unwrap();
    assert_eq!(moved.layout(), created(settled.clone()));
    check(
        &format!("to_device {lf} -> {settled} (scoped)"),
        moved,
        orc::<D>(&d),
    );
    let di = int_data(shape, seed, 100);
    let xi = dist_int::<D>(&di, &lf.without_partial());
    check_int(
        "relayout_int",
        xi.clone().relayout(&settled).unwrap(),
        orc_int::<D>(&di),
    );
    check_bool(
        "relayout_bool",
        xi.greater_elem(49).relayout(&settled).unwrap(),
        orc_int::<D>(&di).greater_elem(49),
    );
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn relayout_across_meshes(m1 in mesh_strat(), m2 in mesh_strat(), shape in shape_strat(), from in lspec(), to in lspec(), seed in any::<u64>()) {
        let (m1, m2) = (mesh(m1), mesh(m2));
        by_rank!(shape.len(), across_meshes_case((&m1, &m2), &shape, (&from, &to), seed));
    }

    #[test]
    fn creation_honours_layouts(mi in mesh_strat(), shape in shape_strat(), l in lspec()) {
        let m = mesh(mi);
        by_rank!(shape.len(), creation_case(&m, &shape, &l));
    }

    #[test]
    fn relayout_between_any_layouts(mi in mesh_strat(), shape in shape_strat(), from in lspec(), to in lspec(), to2 in lspec(), seed in any::<u64>()) {
        let m = mesh(mi);
        by_rank!(shape.len(), relayout_case(&m, &shape, &from, &to, &to2, seed));
    }
}

// ---------------------------------------------------------------------------------------------
// Typed errors
// ---------------------------------------------------------------------------------------------

/// The message of the panic `f` must raise (a test failure when it returns).
fn panic_message(f: impl FnOnce()) -> String {
    let p = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_err();
    p.downcast_ref::<String>().cloned().unwrap_or_default()
}

#[test]
fn typed_errors() {
    let m = mesh(5); // x=2, y=4
    let other = mesh(6); // r=4, c=2
    let t: Tensor<DB, 2> =
        distribute(data(&[4, 4], 1), &Layout::new(&m, ["x", "y"]).unwrap()).unwrap();
    // Relayout to a layout of another mesh of the wrong rank, or of a mesh of other devices.
    let e = t
        .clone()
        .relayout(&Layout::new(&other, ["r"]).unwrap())
        .unwrap_err();
    assert!(matches!(e, DTensorError::RankMismatch { .. }), "{e}");
    let foreign = Mesh::virtual_devices([("x", 2)], ()).unwrap();
    let e = t
        .clone()
        .relayout(&Layout::replicated(&foreign, 2))
        .unwrap_err();
    assert!(matches!(e, DTensorError::UnknownMesh { .. }), "{e}");
    // distribute with a layout whose mesh is not a mesh of the backend's devices.
    let e = distribute::<DB, 2, burn::tensor::Float>(
        data(&[4, 4], 1),
        &Layout::replicated(&foreign, 2),
    )
    .unwrap_err();
    assert!(matches!(e, DTensorError::UnknownMesh { .. }), "{e}");
    // from_local_shards: a layout on a mesh of other devices (before: accepted, then a panic
    // in the first op), shards of two dtypes (before: a panic inside the inner backend).
    let dev = Dev::default();
    let halves = || {
        vec![
            Tensor::<N, 2>::from_data(data(&[2, 4], 2), &dev),
            Tensor::<N, 2>::from_data(data(&[2, 4], 3), &dev),
        ]
    };
    let e = from_local_shards(
        halves(),
        [4, 4],
        &Layout::new(&foreign, ["x", "unsharded"]).unwrap(),
    )
    .unwrap_err();
    assert!(matches!(e, DTensorError::UnknownMesh { .. }), "{e}");
    let rows = Layout::new(&mesh(1), ["a", "unsharded"]).unwrap();
    let mut mixed = halves();
    mixed[1] = mixed[1].clone().cast(burn::tensor::DType::F64);
    let e = from_local_shards(mixed, [4, 4], &rows).unwrap_err();
    assert_eq!(
        e,
        DTensorError::ShardDtypeMismatch {
            index: 1,
            found: "F64".into(),
            expected: "F32".into()
        }
    );
    let x = from_local_shards(halves(), [4, 4], &rows).unwrap();
    let mut whole = halves()[0].clone().into_data().to_vec::<f32>().unwrap();
    whole.extend(halves()[1].clone().into_data().to_vec::<f32>().unwrap());
    assert_eq!(x.into_data().to_vec::<f32>().unwrap(), whole);
    // with_dim: an axis that already shards another dim (before: accepted, and the tensor
    // distributed on it read back with zeros in place of its values), an axis that is
    // pending, an unknown axis or dim; a valid change equals the layout built by name.
    let xy = Layout::new(&m, ["x", "unsharded"]).unwrap();
    assert_eq!(
        xy.clone().with_dim(1, Some(0)).unwrap_err(),
        DTensorError::AxisUsedTwice {
            axis: "x".into(),
            first: 0,
            second: 1
        }
    );
    let e = xy
        .clone()
        .with_partial(1, ReduceOp::Sum)
        .with_dim(1, Some(1))
        .unwrap_err();
    assert!(
        matches!(&e, DTensorError::Unsupported(m) if m.contains("`y` holds a pending reduction")),
        "{e}"
    );
    assert!(matches!(
        xy.clone().with_dim(1, Some(2)),
        Err(DTensorError::UnknownAxis { .. })
    ));
    assert!(matches!(
        xy.clone().with_dim(2, None),
        Err(DTensorError::RankMismatch { .. })
    ));
    assert_eq!(
        xy.clone().with_dim(1, Some(1)).unwrap(),
        Layout::new(&m, ["x", "y"]).unwrap()
    );
    assert_eq!(
        xy.with_dim(0, Some(1)).unwrap(),
        Layout::new(&m, ["y", "unsharded"]).unwrap()
    );
    // Rank mismatches.
    let e = t
        .clone()
        .relayout(&Layout::new(&m, ["x"]).unwrap())
        .unwrap_err();
    assert_eq!(
        e,
        DTensorError::RankMismatch {
            layout_rank: 1,
            tensor_rank: 2
        }
    );
    let e = distribute::<DB, 3, burn::tensor::Float>(data(&[4, 4], 1), &Layout::replicated(&m, 3))
        .unwrap_err();
    assert!(matches!(e, DTensorError::RankMismatch { .. }), "{e}");
    let e = distribute::<DB, 2, burn::tensor::Float>(data(&[4, 4], 1), &Layout::replicated(&m, 3))
        .unwrap_err();
    assert!(matches!(e, DTensorError::RankMismatch { .. }), "{e}");
    // Unknown axis, axis used twice.
    let e = Layout::new(&m, ["x", "model"]).unwrap_err();
    assert!(
        matches!(&e, DTensorError::UnknownAxis { axis, .. } if axis == "model"),
        "{e}"
    );
    let e = Layout::new(&m, ["y", "y"]).unwrap_err();
    assert_eq!(
        e,
        DTensorError::AxisUsedTwice {
            axis: "y".into(),
            first: 0,
            second: 1
        }
    );
    assert!(matches!(
        Layout::batch_sharded(&m, "batch", 2),
        Err(DTensorError::UnknownAxis { .. })
    ));
    // A scalar has no batch dim (before: the replicated scalar layout, without a word).
    assert_eq!(
        Layout::batch_sharded(&m, "x", 0).unwrap_err(),
        DTensorError::RankMismatch {
            layout_rank: 1,
            tensor_rank: 0
        }
    );
    // A pending reduction by axis name: the layout `with_partial` builds by index, and typed
    // errors for an unknown axis or one that shards a dim (`with_partial` panics there).
    let rows = Layout::new(&m, ["x", UNSHARDED]).unwrap();
    assert_eq!(
        rows.clone().with_partial_on("y", ReduceOp::Max).unwrap(),
        rows.clone().with_partial(1, ReduceOp::Max)
    );
    let e = rows
        .clone()
        .with_partial_on("model", ReduceOp::Sum)
        .unwrap_err();
    assert!(
        matches!(&e, DTensorError::UnknownAxis { axis, available } if axis == "model" && available == "x, y"),
        "{e}"
    );
    let e = rows
        .clone()
        .with_partial_on("x", ReduceOp::Sum)
        .unwrap_err();
    assert!(
        matches!(&e, DTensorError::Unsupported(m) if m.contains("`x` shards dim 0")),
        "{e}"
    );
    // A shard's ranges for a shape of another rank, or a device past the mesh: a panic naming
    // it, documented (before: the ranges of fewer dims, or of another device, without a word).
    let m1 = panic_message(|| drop(rows.shard_ranges(&[4], 0)));
    assert!(m1.contains("shape [4] has rank 1"), "{m1}");
    let m2 = panic_message(|| drop(rows.shard_shape(&[4, 4], 8)));
    assert!(m2.contains("device 8 is not a position"), "{m2}");
    assert_eq!(rows.shard_ranges(&[5, 3], 7), vec![3..5, 0..3]);
    // A process's block of a shape of another rank (before: the block of the dims given).
    assert_eq!(
        burn_dtensor::process_block(&rows, &[4]).unwrap_err(),
        DTensorError::RankMismatch {
            layout_rank: 2,
            tensor_rank: 1
        }
    );
    // Mesh specs with an empty axis (before: skipped, `a=2,,b=1` was the mesh `a=2,b=1`), and
    // axis names holding the characters of the textual forms (before: `a b=2` made an axis
    // `a b`, and a tensor's description `f32[4@a b]`).
    for spec in ["x=2,,y=4", "x=2,y=4,", ",x=2,y=4"] {
        let e = Mesh::parse(spec, vec![Dev::default(); 8]).unwrap_err();
        assert!(
            matches!(&e, DTensorError::MeshParse { reason, .. } if reason.contains("is empty")),
            "{spec}: {e}"
        );
    }
    for name in ["a b", "a,b", "a=b", "a@b", "a[0]", "\tx"] {
        let e = Mesh::new([(name, 2)], vec![Dev::default(); 2]).unwrap_err();
        assert_eq!(
            e,
            DTensorError::InvalidAxis {
                axis: name.into(),
                size: 2
            },
            "{name:?}"
        );
    }
    assert!(matches!(
        Mesh::parse("a b=2", vec![Dev::default(); 2]),
        Err(DTensorError::InvalidAxis { .. })
    ));
    let named = Mesh::parse(" data_0 = 2 , model-1=1 ", vec![Dev::default(); 2]).unwrap();
    assert_eq!(named.to_string(), "data_0=2,model-1=1");
    // A mesh whose device count does not match its axes.
    let e = Mesh::new([("x", 2), ("y", 4)], vec![Dev::default(); 6]).unwrap_err();
    assert!(
        matches!(
            e,
            DTensorError::DeviceCountMismatch {
                expected: 8,
                given: 6,
                ..
            }
        ),
        "{e}"
    );
    let e = Mesh::new([("x", 2), ("x", 2)], vec![Dev::default(); 4]).unwrap_err();
    assert_eq!(
        e,
        DTensorError::DuplicateMeshAxis {
            axis: "x".into(),
            first: 0,
            second: 1
        }
    );
    assert!(e.to_string().contains("defined twice in the mesh"), "{e}");
    let e = Mesh::new([("x", 0)], Vec::<Dev>::new()).unwrap_err();
    assert!(matches!(e, DTensorError::InvalidAxis { .. }), "{e}");
    // Axis sizes whose product overflows (it wrapped to 0 = the 0 devices given, and the mesh
    // was built), and a mistyped size for virtual devices (it allocated a handle per position
    // first: an endless loop for a zero-sized device type): refused before anything is made.
    let e = Mesh::new([("x", 1 << 32), ("y", 1 << 32)], Vec::<Dev>::new()).unwrap_err();
    assert!(
        matches!(&e, DTensorError::MeshTooLarge { shape, .. } if shape == "x=4294967296,y=4294967296"),
        "{e}"
    );
    let e = Mesh::virtual_devices([("batch", usize::MAX)], Dev::default()).unwrap_err();
    assert!(
        matches!(e, DTensorError::MeshTooLarge { .. }) && e.to_string().contains("mistyped"),
        "{e}"
    );
    let e = Mesh::virtual_devices(
        [("batch", burn_dtensor::MAX_VIRTUAL_POSITIONS / 2), ("m", 3)],
        Dev::default(),
    )
    .unwrap_err();
    assert!(matches!(e, DTensorError::MeshTooLarge { .. }), "{e}");
    let wide = Mesh::virtual_devices(
        [("batch", burn_dtensor::MAX_VIRTUAL_POSITIONS)],
        Dev::default(),
    )
    .unwrap();
    assert_eq!(wide.size(), burn_dtensor::MAX_VIRTUAL_POSITIONS);
    // The original tensor is untouched by the refused relayouts.
    check("after errors", t, orc::<2>(&data(&[4, 4], 1)));
}

/// Ops whose operands live on two meshes panic naming both meshes and the move that fixes it
/// (ops cannot return errors, as in Burn), whatever the op family. Before: an embedding with
/// its table on `x=2,y=4` and its ids on `r=4,c=2` returned **wrong rows without a word** (the
/// second and fourth rows of ids looked up as the first and third), on `batch=2,model=2` and
/// `x=4` it panicked on an index out of bounds inside its rule, with the table on one device
/// on an internal "per-device shards expected"; `cat` and `conv2d` named a relayout the user
/// never asked for.
#[test]
fn operands_on_two_meshes_are_refused_by_name() {
    use burn::tensor::module::{conv2d, embedding};
    use burn::tensor::ops::ConvOptions;
    let (m1, m2) = (mesh(5), mesh(6)); // x=2,y=4 and r=4,c=2
    let (d1, d2) = (
        DistributedDevice::new(m1.clone()),
        DistributedDevice::new(m2.clone()),
    );
    let one = DistributedDevice::new(Mesh::single(Dev::default()));
    let ids = |d: &DistributedDevice<Dev>, m: &Mesh<Dev>| {
        let t = Tensor::<DB, 2, Int>::from_data([[0, 1, 2], [2, 1, 0], [1, 1, 1], [0, 0, 2]], d);
        let spec = if m.size() > 1 {
            [m.topology().axis_name(0), UNSHARDED]
        } else {
            [UNSHARDED; 2]
        };
        t.relayout(&Layout::new(m, spec).unwrap()).unwrap()
    };
    let table = |d: &DistributedDevice<Dev>| Tensor::<DB, 2>::from_data(data(&[3, 4], 1), d);
    let x = |d: &DistributedDevice<Dev>| Tensor::<DB, 4>::from_data(data(&[2, 2, 4, 4], 2), d);
    let w = |d: &DistributedDevice<Dev>| Tensor::<DB, 4>::from_data(data(&[2, 2, 3, 3], 3), d);
    type Case<'a> = (&'static str, Box<dyn Fn() + 'a>);
    let cases: Vec<Case> = vec![
        (
            "embedding",
            Box::new(|| drop(embedding(table(&d1), ids(&d2, &m2)).into_data())),
        ),
        (
            "embedding, table on one device",
            Box::new(|| drop(embedding(table(&one), ids(&d2, &m2)).into_data())),
        ),
        (
            "conv2d",
            Box::new(|| {
                let o = ConvOptions::new([1, 1], [1, 1], [1, 1], 1);
                drop(conv2d(x(&d1), w(&d2), None, o).into_data())
            }),
        ),
        (
            "cat",
            Box::new(|| drop(Tensor::cat(vec![table(&d1), table(&d2)], 0).into_data())),
        ),
        (
            "mask_where",
            Box::new(|| {
                let t = table(&d1);
                drop(
                    t.clone()
                        .mask_where(table(&d2).greater_elem(0.0), t)
                        .into_data(),
                )
            }),
        ),
    ];
    for (what, f) in cases {
        let msg = panic_message(f);
        assert!(
            msg.contains("operands live on different meshes") && msg.contains("to_device"),
            "{what}: {msg}"
        );
    }
    // The move the message names works: the result is the one-mesh op's.
    let moved = embedding(table(&d1).to_device(&d2), ids(&d2, &m2));
    let want = embedding(table(&d1), ids(&d1, &m1));
    assert_eq!(moved.into_data(), want.into_data());
}

/// `distribute` and `distribute_local` create what Burn's `Tensor::from_data` creates on the
/// mesh's device (dtype and bytes), for data of every kind given to every kind, on stacked and
/// per-device meshes, sharded and replicated; the bytes are the inner backend's `from_data`'s
/// on the whole data. Before, `distribute` kept the data's dtype: float data made an `Int`
/// tensor of dtype `F64`, int data a `Float` tensor of dtype `I64`.
#[test]
fn distribute_creates_what_from_data_creates() {
    use burn::tensor::{BasicOps, Float};
    fn each<K>(m: &Mesh<Dev>, d: &TensorData, what: &str)
    where
        K: burn_dtensor::DistributedKind<DB> + BasicOps<N>,
        <K as BasicOps<N>>::Elem: burn::tensor::Element,
    {
        let device = DistributedDevice::new(m.clone());
        let want = Tensor::<DB, 2, K>::from_data(d.clone(), &device).into_data();
        let inner = Tensor::<N, 2, K>::from_data(d.clone(), &Dev::default()).into_data();
        assert_eq!(want, inner, "{what}: the oracle");
        let dims: Vec<usize> = d.shape.to_vec();
        for spec in [[UNSHARDED, UNSHARDED], ["x", "y"], ["y", UNSHARDED]] {
            let spec = spec.map(|s| {
                if m.topology().axes().len() < 2 {
                    UNSHARDED
                } else {
                    s
                }
            });
            let l = Layout::new(m, spec).unwrap();
            let got = distribute::<DB, 2, K>(d.clone(), &l).unwrap();
            assert_eq!(got.layout(), l);
            assert_eq!(got.into_data(), want, "{what} distribute on {l}");
            let local =
                burn_dtensor::distribute_local::<N, 2, K>(d.clone(), [dims[0], dims[1]], &l)
                    .unwrap();
            assert_eq!(local.into_data(), want, "{what} distribute_local on {l}");
        }
    }
    let n = 6 * 4usize;
    let given = [
        TensorData::new(
            (0..n).map(|i| i as f64 * 0.75 - 3.0).collect::<Vec<_>>(),
            [6, 4],
        ),
        TensorData::new(
            (0..n).map(|i| i as f32 * 0.5 - 2.0).collect::<Vec<_>>(),
            [6, 4],
        ),
        TensorData::new((0..n).map(|i| i as i64 - 7).collect::<Vec<_>>(), [6, 4]),
        TensorData::new((0..n).map(|i| i as i32 % 3).collect::<Vec<_>>(), [6, 4]),
        TensorData::new((0..n).map(|i| i % 3 == 0).collect::<Vec<_>>(), [6, 4]),
    ];
    for mi in [5, 5 + MESHES.len()] {
        let m = mesh(mi); // x=2, y=4: stacked, then per device
        for d in &given {
            let what = format!("{:?} data on {m}", d.dtype);
            each::<Float>(&m, d, &format!("Float from {what}"));
            each::<Int>(&m, d, &format!("Int from {what}"));
            each::<Bool>(&m, d, &format!("Bool from {what}"));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Communication
// ---------------------------------------------------------------------------------------------

#[test]
fn batch_sharded_matmul_by_replicated_weight_runs_no_collective() {
    let m = mesh(6); // r=4, c=2
    for (n, k, o) in [(8, 5, 3), (10, 7, 2), (3, 4, 4)] {
        let (dx, dw) = (data(&[n, k], 1), data(&[k, o], 2));
        let x = dist::<2>(&dx, &Layout::batch_sharded(&m, "r", 2).unwrap());
        let w = dist::<2>(&dw, &Layout::replicated(&m, 2));
        let (y, log) = record_comms(|| x.matmul(w));
        assert!(log.events.is_empty(), "{log}");
        assert_eq!(y.layout(), Layout::batch_sharded(&m, "r", 2).unwrap());
        check("x@w", y, orc::<2>(&dx).matmul(orc::<2>(&dw)));
    }
}

#[test]
fn a_partial_used_twice_is_reduced_once() {
    let m = mesh(5); // x=2, y=4
    let (da, db) = (data(&[6, 8], 1), data(&[8, 5], 2));
    // A contracting dim sharded on both sides: a partial sum over `y`.
    let a = dist::<2>(&da, &Layout::new(&m, ["x", "y"]).unwrap());
    let b = dist::<2>(&db, &Layout::new(&m, ["y", "unsharded"]).unwrap());
    let (p, log) = record_comms(|| a.matmul(b));
    assert!(log.events.is_empty(), "{log}");
    assert!(p.layout().is_partial(), "{}", p.describe());
    // Every consumer shares one memoised reduction, linear ones included (the Adam pattern:
    // `g * (1 - beta1)` and `g^2` of one gradient cost one all-reduce, not two).
    let (q, log) = record_comms(|| p.clone().mul_scalar(2.0).neg());
    assert_eq!(log.count(CollectiveKind::AllReduce), 1, "{log}");
    assert_eq!(log.events.len(), 1, "{log}");
    assert!(!q.layout().is_partial(), "{}", q.describe());
    let p2 = p.clone();
    let ((e, t), log) = record_comms(|| (p.exp(), p2.tanh()));
    assert!(log.events.is_empty(), "{log}");
    let want = orc::<2>(&da).matmul(orc::<2>(&db));
    check("-2 partial", q, want.clone().mul_scalar(-2.0));
    check("exp(partial)", e, want.clone().exp());
    check("tanh(partial)", t, want.tanh());
}

#[test]
fn a_reduced_partial_feeds_linear_ops_settled() {
    let m = mesh(1); // a=2
    let d = data(&[3, 4], 5);
    let p = dist::<2>(
        &d,
        &Layout::replicated(&m, 2).with_partial(0, ReduceOp::Sum),
    );
    let (e, log) = record_comms(|| p.clone().exp());
    assert_eq!(log.count(CollectiveKind::AllReduce), 1, "{log}");
    // The reduction is memoised: a scaled copy (BatchNorm's running statistics) is settled,
    // at no cost, instead of a new partial sum that would be reduced again.
    let (q, log) = record_comms(|| p.mul_scalar(0.1).reshape([12]));
    assert!(log.events.is_empty(), "{log}");
    assert!(!q.layout().is_partial(), "{}", q.describe());
    check("exp", e, orc::<2>(&d).exp());
    check("scaled", q, orc::<2>(&d).mul_scalar(0.1).reshape([12]));
}

#[test]
fn a_broadcast_partial_is_reduced_before_broadcasting() {
    let m = mesh(2); // a=4
    let (dg, dx) = (data(&[1, 6], 1), data(&[10, 6], 2));
    // A partial `[1, 6]` (a batch sum) times a batch-sharded `[10, 6]`: one small all-reduce,
    // not a reduce-scatter of the `[10, 6]` product.
    let g = dist::<2>(
        &dg,
        &Layout::replicated(&m, 2).with_partial(0, ReduceOp::Sum),
    );
    let x = dist::<2>(&dx, &Layout::batch_sharded(&m, "a", 2).unwrap());
    let (y, log) = record_comms(|| g.clone().mul(x.clone()).add(x.clone()));
    assert_eq!(log.events.len(), 1, "{log}");
    assert_eq!(
        (log.events[0].kind, log.events[0].shape.clone()),
        (CollectiveKind::AllReduce, vec![1, 6]),
        "{log}"
    );
    check(
        "g*x+x",
        y,
        orc::<2>(&dg).mul(orc::<2>(&dx)).add(orc::<2>(&dx)),
    );
    let g = dist::<2>(
        &dg,
        &Layout::replicated(&m, 2).with_partial(0, ReduceOp::Sum),
    );
    let (y, log) = record_comms(|| g.expand([10, 6]).add(x));
    assert_eq!(log.events.len(), 1, "{log}");
    assert_eq!(log.events[0].shape, vec![1, 6], "{log}");
    check(
        "expand(g)+x",
        y,
        orc::<2>(&dg).expand([10, 6]).add(orc::<2>(&dx)),
    );
}

#[test]
fn scatter_into_replicated_zeros_keeps_the_index_sharding() {
    // The backward of cross-entropy's gather: zeros (replicated) scattered with batch-sharded
    // indices and values: no collective, a batch-sharded result.
    let m = mesh(2); // a=4
    let (di, dv) = (int_data(&[10, 1], 1, 3), data(&[10, 1], 2));
    let l = Layout::batch_sharded(&m, "a", 2).unwrap();
    let idx = dist_int::<2>(&di, &l);
    let v = dist::<2>(&dv, &l);
    let (y, log) = record_comms(|| {
        Tensor::<DB, 2>::zeros([10, 3], &mdev(&m)).scatter(1, idx, v, IndexingUpdateOp::Add)
    });
    assert!(log.events.is_empty(), "{log}");
    assert_eq!(y.layout(), l);
    check(
        "scatter",
        y,
        Tensor::<N, 2>::zeros([10, 3], &Dev::default()).scatter(
            1,
            orc_int::<2>(&di),
            orc::<2>(&dv),
            IndexingUpdateOp::Add,
        ),
    );
}

/// Indexing ops on a sharded indexed dim mask instead of gathering (PyTorch DTensor's
/// `MaskPartial`, Megatron-LM's vocab-parallel embedding and cross entropy): `select` from a
/// vocabulary-sharded table and `gather` from class-sharded log-probabilities leave a pending sum
/// over the sharding axis (settled by an all-reduce of the selected values, never an all-gather
/// of the table), and `scatter_add` / `select_add` into a sharded tensor communicate nothing. On
/// both execution forms (stacked meshes run these per device), uneven shards included; values
/// against NdArray on the whole tensors, repeated and boundary indices included.
#[test]
fn indexing_a_sharded_dim_masks_instead_of_gathering() {
    for (axes, stacked) in [(vec![("v", 4)], true), (vec![("b", 2), ("v", 3)], false)] {
        let m = Mesh::virtual_devices(axes, Dev::default())
            .unwrap()
            .with_stacked_execution(stacked);
        // 12 rows over 4 devices, 11 over 3: even and uneven shards.
        let (vocab, d) = (if stacked { 12 } else { 11 }, 3);
        let dt = data(&[vocab, d], 7);
        let rows = Layout::new(&m, ["v", UNSHARDED]).unwrap();
        let table = || dist::<2>(&dt, &rows);
        // Few enough indices that the masked lookup's all-reduce moves less than gathering the
        // table (2 x 4 rows against 11 or 12): ends of the table, a shard's first row, a repeat.
        let ids: Vec<i64> = vec![0, vocab as i64 - 1, 3, 3];
        let di = TensorData::new(ids.clone(), [ids.len()]);
        let idx = || dist_int::<1>(&di, &Layout::replicated(&m, 1));
        let no_gather = |what: &str, log: &burn_dtensor::CommLog| {
            assert_eq!(log.count(CollectiveKind::AllGather), 0, "{what}: {log}");
            assert_eq!(log.count(CollectiveKind::AllToAll), 0, "{what}: {log}");
        };

        // select: a pending sum over `v`, settled by one all-reduce of the [4, 3] rows.
        let (y, log) = record_comms(|| table().select(0, idx()));
        assert!(log.events.is_empty(), "select: {log}");
        assert_eq!(
            y.layout().partial(m.topology().axis_index("v").unwrap()),
            Some(ReduceOp::Sum)
        );
        let (y, log) = record_comms(|| y.relayout(&Layout::replicated(&m, 2)).unwrap());
        no_gather("select settled", &log);
        assert!(
            log.events.iter().all(|e| e.shape == [ids.len(), d]),
            "{log}"
        );
        check("select", y, orc::<2>(&dt).select(0, orc_int::<1>(&di)));
        // As many indices as rows: an all-reduce of the output would move more than gathering
        // the table, so the table is gathered (one all-gather, a settled output).
        let many = TensorData::new((0..vocab as i64).rev().collect::<Vec<i64>>(), [vocab]);
        let (y, log) =
            record_comms(|| table().select(0, dist_int::<1>(&many, &Layout::replicated(&m, 1))));
        assert!(!y.layout().is_partial(), "{}", y.layout());
        assert_eq!(log.count(CollectiveKind::AllGather), 1, "{log}");
        check(
            "select, many",
            y,
            orc::<2>(&dt).select(0, orc_int::<1>(&many)),
        );

        // gather along the sharded dim: the cross entropy's pick of each row's target class.
        let (n, c) = (5, vocab);
        let dl = data(&[n, c], 9);
        let classes = Layout::new(&m, [UNSHARDED, "v"]).unwrap();
        let dtg = TensorData::new(vec![0i64, 10, 4, 7, 10], [n, 1]);
        let (y, log) = record_comms(|| {
            dist::<2>(&dl, &classes).gather(1, dist_int::<2>(&dtg, &Layout::replicated(&m, 2)))
        });
        assert!(log.events.is_empty(), "gather: {log}");
        check("gather", y, orc::<2>(&dl).gather(1, orc_int::<2>(&dtg)));
        let (y, log) = record_comms(|| {
            let logits = dist::<2>(&dl, &classes);
            let picked =
                log_softmax(logits, 1).gather(1, dist_int::<2>(&dtg, &Layout::replicated(&m, 2)));
            picked.reshape([n]).mean().neg()
        });
        no_gather("cross entropy", &log);
        assert!(
            log.events
                .iter()
                .all(|e| e.shape.iter().product::<usize>() <= n),
            "{log}"
        );
        check(
            "cross entropy",
            y,
            log_softmax(orc::<2>(&dl), 1)
                .gather(1, orc_int::<2>(&dtg))
                .reshape([n])
                .mean()
                .neg(),
        );

        // scatter_add and select_add into the sharded tensor: no collective, its layout kept.
        let dv = data(&[n, 1], 11);
        let (y, log) = record_comms(|| {
            dist::<2>(&dl, &classes).scatter(
                1,
                dist_int::<2>(&dtg, &Layout::replicated(&m, 2)),
                dist::<2>(&dv, &Layout::replicated(&m, 2)),
                IndexingUpdateOp::Add,
            )
        });
        assert!(log.events.is_empty(), "scatter: {log}");
        assert_eq!(y.layout(), classes);
        check(
            "scatter",
            y,
            orc::<2>(&dl).scatter(1, orc_int::<2>(&dtg), orc::<2>(&dv), IndexingUpdateOp::Add),
        );
        let dsel = data(&[ids.len(), d], 13);
        let (y, log) = record_comms(|| {
            table().select_assign(
                0,
                idx(),
                dist::<2>(&dsel, &Layout::replicated(&m, 2)),
                IndexingUpdateOp::Add,
            )
        });
        assert!(log.events.is_empty(), "select_add: {log}");
        assert_eq!(y.layout(), rows);
        check(
            "select_add",
            y,
            orc::<2>(&dt).select_assign(
                0,
                orc_int::<1>(&di),
                orc::<2>(&dsel),
                IndexingUpdateOp::Add,
            ),
        );
        // Int tensors take the same path (a pending sum of ints); bool keeps the gathering rule.
        let ti = int_data(&[vocab, d], 3, 100);
        let (y, log) = record_comms(|| dist_int::<2>(&ti, &rows).select(0, idx()));
        assert!(log.events.is_empty(), "int select: {log}");
        assert_eq!(
            y.into_data().to_vec::<i64>().unwrap(),
            orc_int::<2>(&ti)
                .select(0, orc_int::<1>(&di))
                .into_data()
                .to_vec::<i64>()
                .unwrap()
        );
    }
}

/// On a virtual mesh, tensors are held stacked (one inner primitive with the mesh axes leading)
/// and ops run once on the stack; switched off, they run per device. Both give the oracle's
/// values and record the same communication.
/// A sequence-parallel block's input gradient: the residual's gradient, sharded over `y` on the
/// sequence, plus the query, key and value input gradients, pending sums over `y`, in any order
/// of addition (autodiff's). The sums are added pending (the sharded term joins with its chunk
/// at its offset, zeros elsewhere) and settle once, by one reduce-scatter onto the residual's
/// sharding, where a consumer needs the value: Megatron-SP's one reduce-scatter, not one per
/// pending term. Stacked and per device; values against NdArray on the whole tensors.
#[test]
fn sharded_plus_pending_sums_settle_by_one_reduce_scatter() {
    let shape = [8, 6];
    let d: Vec<TensorData> = (0..4).map(|i| data(&shape, 10 + i)).collect();
    let want = || {
        let o: Vec<Tensor<N, 2>> = d.iter().map(orc::<2>).collect();
        (o[0].clone() + o[1].clone() + o[2].clone() + o[3].clone()).exp()
    };
    for i in [5, 5 + MESHES.len()] {
        let m = mesh(i); // x=2, y=4
        let sharded = Layout::new(&m, ["y", "unsharded"]).unwrap();
        let pending = Layout::new(&m, ["unsharded", "unsharded"])
            .unwrap()
            .with_partial(1, ReduceOp::Sum);
        // The residual's gradient first (autodiff's usual order), then in the middle.
        for at in [0, 2] {
            let mut terms: Vec<Tensor<DB, 2>> =
                (1..4).map(|j| dist::<2>(&d[j], &pending)).collect();
            terms.insert(at, dist::<2>(&d[0], &sharded));
            let (y, log) = record_comms(|| {
                let sum = terms.into_iter().reduce(|a, b| a + b).unwrap();
                let y = sum.clone().exp();
                // A second consumer of the same sum: the settled value is shared.
                let z = sum.mul_scalar(2.0);
                (y, z)
            });
            let ctx = format!("mesh {i}, sharded term at {at}: {log}");
            assert_eq!(log.events.len(), 1, "{ctx}");
            let e = &log.events[0];
            assert_eq!(
                (e.kind, e.axis.as_str(), e.shape.as_slice()),
                (CollectiveKind::ReduceScatter, "y", &shape[..]),
                "{ctx}"
            );
            assert_eq!(y.0.layout(), sharded, "{ctx}");
            check(&format!("sum then exp, {ctx}"), y.0, want());
        }
    }
}

#[test]
fn stacked_and_per_device_forms_agree() {
    let (dx, dw) = (data(&[8, 6], 1), data(&[6, 4], 2));
    let want = orc::<2>(&dx).matmul(orc::<2>(&dw)).exp().sum_dim(0);
    let mut logs = Vec::new();
    for (i, stacked) in [(5, true), (5 + MESHES.len(), false)] {
        let m = mesh(i); // x=2, y=4
        let x = dist::<2>(&dx, &Layout::new(&m, ["y", "unsharded"]).unwrap());
        let w = dist::<2>(&dw, &Layout::new(&m, ["unsharded", "x"]).unwrap());
        let (y, log) = record_comms(|| {
            (x.matmul(w).exp().sum_dim(0))
                .relayout(&Layout::new(&m, ["unsharded", "y"]).unwrap())
                .unwrap()
        });
        let p = DB::float_into_dtensor(y.clone().into_primitive().tensor());
        assert_eq!(p.is_stacked(), stacked, "{}", y.describe());
        if stacked {
            // y shards dim 1 (4 over 4 devices); x is unused: stack [1, 4] + shard [1, 1].
            assert_eq!(
                burn::tensor::TensorMetadata::shape(&p.shards()[0]).to_vec(),
                vec![1, 4, 1, 1]
            );
        } else {
            assert_eq!(p.shards().len(), 8);
        }
        check("stacked vs per device", y, want.clone());
        logs.push(log.summary());
    }
    assert_eq!(logs[0], logs[1]);
    assert!(!logs[0].is_empty());
}

/// Linear functions of a pending sum taken before the sum settles (a sum over a dim, a view:
/// tensor parallelism's position-embedding and layer-norm-bias gradients, summed from the
/// activation gradient before its own consumer all-reduces it) settle from the sum's settled
/// value: the all-reduce over `y` runs once, for the sum, and the sum over the `x`-sharded dim
/// is left pending over `x` alone, even though its intermediate `[1, 6]` was dropped at once.
/// Stacked and per device; values against NdArray on the whole tensors.
#[test]
fn linear_functions_of_a_pending_sum_settle_from_its_value() {
    let shape = [8, 6];
    let d: Vec<TensorData> = (0..2).map(|i| data(&shape, 40 + i)).collect();
    let whole = || orc::<2>(&d[0]) + orc::<2>(&d[1]);
    for i in [5, 5 + MESHES.len()] {
        let m = mesh(i); // x=2, y=4
        let pending = Layout::new(&m, ["x", "unsharded"])
            .unwrap()
            .with_partial(1, ReduceOp::Sum);
        let (a, b) = (dist::<2>(&d[0], &pending), dist::<2>(&d[1], &pending));
        let ((e, q, t), log) = record_comms(|| {
            let x = a + b;
            let q = x.clone().sum_dim(0).reshape([6]);
            let t = x.clone().swap_dims(0, 1);
            let e = x.exp();
            (e, q.exp(), t.exp())
        });
        let ctx = format!("mesh {i}: {log}");
        let events: Vec<_> = log
            .events
            .iter()
            .map(|e| (e.kind, e.axis.as_str(), e.shape.clone()))
            .collect();
        assert_eq!(
            events,
            [
                (CollectiveKind::AllReduce, "y", shape.to_vec()),
                (CollectiveKind::AllReduce, "x", vec![6]),
            ],
            "{ctx}"
        );
        check(&format!("exp, {ctx}"), e, whole().exp());
        check(
            &format!("sum_dim, reshape, {ctx}"),
            q,
            whole().sum_dim(0).reshape([6]).exp(),
        );
        check(
            &format!("swap_dims, {ctx}"),
            t,
            whole().swap_dims(0, 1).exp(),
        );
    }
}

/// A product of a pending sum by a settled tensor, and a scaling of that product, keep the sum
/// pending (each member's term multiplied: PyTorch DTensor's linearity of `mul.Tensor`), so
/// dropout's mask on a row-parallel output settles where the residual after it says: one
/// reduce-scatter over `y`, not an all-reduce before the mask. Where the pending sum has another
/// holder, it settles first, once, for both; a scaling of any other pending sum (`lr * g`
/// before it updates a parameter) settles it, so the updated state is not a pending sum.
/// Stacked and per device; values against NdArray on the whole tensors.
#[test]
fn products_keep_a_pending_sum_pending_on_the_activation_path() {
    let shape = [8, 8];
    let d: Vec<TensorData> = (0..4).map(|i| data(&shape, 60 + i)).collect();
    let whole = || orc::<2>(&d[0]) + orc::<2>(&d[1]);
    let events = |log: &burn_dtensor::CommLog| -> Vec<(CollectiveKind, String, Vec<usize>)> {
        log.events
            .iter()
            .map(|e| (e.kind, e.axis.clone(), e.shape.clone()))
            .collect()
    };
    for i in [5, 5 + MESHES.len()] {
        let m = mesh(i); // x=2, y=4
        let rows = Layout::new(&m, ["x", "unsharded"]).unwrap();
        let pending = rows.clone().with_partial(1, ReduceOp::Sum);
        let sum = || (dist::<2>(&d[0], &pending), dist::<2>(&d[1], &pending));
        let mask = dist::<2>(&d[2], &rows);
        let r = dist::<2>(&d[3], &Layout::new(&m, ["x", "y"]).unwrap());
        let ctx = |log: &burn_dtensor::CommLog| format!("mesh {i}: {log}");

        // Dropout on a row-parallel output, then the residual sharded over `y`.
        let (a, b) = sum();
        let (out, log) = record_comms(|| ((a + b) * mask.clone() * 0.5 + r.clone()).exp());
        let one = |kind| vec![(kind, "y".to_string(), shape.to_vec())];
        assert_eq!(
            events(&log),
            one(CollectiveKind::ReduceScatter),
            "{}",
            ctx(&log)
        );
        let want = (whole() * orc::<2>(&d[2]) * 0.5 + orc::<2>(&d[3])).exp();
        check(&format!("dropout, {}", ctx(&log)), out, want);

        // The pending sum held twice: settled once, before the product.
        let (a, b) = sum();
        let ((u, v), log) = record_comms(|| {
            let g = a + b;
            ((g.clone() * mask.clone()).exp(), g.exp())
        });
        assert_eq!(
            events(&log),
            one(CollectiveKind::AllReduce),
            "{}",
            ctx(&log)
        );
        check(
            &format!("held twice, {}", ctx(&log)),
            u,
            (whole() * orc::<2>(&d[2])).exp(),
        );
        check(&format!("held twice, {}", ctx(&log)), v, whole().exp());

        // An SGD update `p - lr * g`: the gradient settles, the parameter stays settled.
        let (a, b) = sum();
        let (q, log) = record_comms(|| mask.clone() - (a + b) * 0.1);
        assert_eq!(
            events(&log),
            one(CollectiveKind::AllReduce),
            "{}",
            ctx(&log)
        );
        assert!(!q.layout().is_partial(), "{}", q.describe());
        check(
            &format!("sgd, {}", ctx(&log)),
            q,
            orc::<2>(&d[2]) - whole() * 0.1,
        );
    }
}

/// Spatial parallelism for pools: `avg_pool2d` (padding counted or not), `max_pool2d` and
/// `max_pool2d_with_indices` of an input sharded over its height (and width, and channels) keep
/// those shards, each device pooling its window (halo rows from its neighbours in one collective
/// permute per sharded spatial dim, none where the windows stay inside the blocks); the indices
/// are the global plane's, as NdArray's on the whole tensor. Ceil mode, and an average that
/// leaves padding out of its divisor with padding on a sharded dim, run batch-parallel (the
/// spatial dims gathered), as before. Values and every shard against NdArray on the whole tensor.
#[test]
fn pools_keep_spatial_shards_with_halos() {
    use burn::tensor::module::{avg_pool2d, max_pool2d, max_pool2d_with_indices};
    // (kernel, stride, padding, dilation, [height, width]).
    type Case = (usize, usize, usize, usize, [usize; 2]);
    let cases: &[Case] = &[
        (2, 2, 0, 1, [16, 12]),
        (3, 2, 1, 1, [17, 13]),
        (3, 1, 1, 1, [12, 10]),
        (3, 1, 0, 2, [20, 16]),
        (2, 1, 0, 1, [13, 11]),
        (4, 3, 2, 1, [18, 12]),
    ];
    // (mesh axes, the input's sharding spec).
    type OnMesh = (&'static [(&'static str, usize)], [&'static str; 4]);
    let meshes: [OnMesh; 3] = [
        (
            &[("batch", 2), ("h", 4)],
            ["batch", UNSHARDED, "h", UNSHARDED],
        ),
        (&[("h", 2), ("w", 4)], [UNSHARDED, UNSHARDED, "h", "w"]),
        (&[("c", 2), ("h", 2), ("w", 2)], [UNSHARDED, "c", "h", "w"]),
    ];
    for (axes, spec) in meshes {
        let m = Mesh::virtual_devices(axes.iter().copied(), Dev::default()).unwrap();
        let xl = Layout::new(&m, spec).unwrap();
        for (i, &(k, s, p, d, [h, w])) in cases.iter().enumerate() {
            let ctx = format!("{xl}, kernel {k} stride {s} padding {p} dilation {d}, {h}x{w}");
            let dx = data(&[2, 4, h, w], 30 + i as u64);
            let ([k2, s2, p2, d2], x) = ([[k; 2], [s; 2], [p; 2], [d; 2]], || dist::<4>(&dx, &xl));
            // Only halo rows move: at most one collective permute per sharded spatial dim.
            let spatial = (2..4).filter(|&d| spec[d] != UNSHARDED).count();
            let halo_only = |what: &str, log: &burn_dtensor::CommLog| {
                for e in &log.events {
                    assert_eq!(
                        e.kind,
                        CollectiveKind::CollectivePermute,
                        "{ctx} {what}: {log}"
                    );
                }
                assert!(log.events.len() <= spatial, "{ctx} {what}: {log}");
            };
            if d == 1 {
                for cip in [true, false] {
                    let what = format!("{ctx}, avg count_include_pad {cip}");
                    let (y, log) = record_comms(|| avg_pool2d(x(), k2, s2, p2, cip, false));
                    if cip || p == 0 {
                        assert_eq!(y.layout().dims(), xl.dims(), "{what}: {}", y.layout());
                        halo_only(&what, &log);
                    }
                    check(&what, y, avg_pool2d(orc::<4>(&dx), k2, s2, p2, cip, false));
                }
            }
            let (y, log) = record_comms(|| max_pool2d(x(), k2, s2, p2, d2, false));
            assert_eq!(y.layout().dims(), xl.dims(), "{ctx} max: {}", y.layout());
            halo_only("max", &log);
            check(
                &format!("{ctx} max"),
                y,
                max_pool2d(orc::<4>(&dx), k2, s2, p2, d2, false),
            );
            let (y, ix) = max_pool2d_with_indices(x(), k2, s2, p2, d2, false);
            let (wy, wix) = max_pool2d_with_indices(orc::<4>(&dx), k2, s2, p2, d2, false);
            assert_eq!(
                ix.layout().dims(),
                xl.dims(),
                "{ctx} indices: {}",
                ix.layout()
            );
            check(&format!("{ctx} max with indices"), y, wy);
            check_int(&format!("{ctx} indices"), ix, wix);
        }
        // Ceil mode: batch-parallel, the values NdArray's.
        let dx = data(&[2, 4, 13, 11], 3);
        let y = max_pool2d(dist::<4>(&dx, &xl), [2, 2], [2, 2], [0, 0], [1, 1], true);
        assert_eq!(
            y.layout().dim_axis(2),
            None,
            "ceil mode gathers: {}",
            y.layout()
        );
        check(
            &format!("{xl} ceil mode"),
            y,
            max_pool2d(orc::<4>(&dx), [2, 2], [2, 2], [0, 0], [1, 1], true),
        );
    }
}

/// The meshes the convolution tests shard an image `[batch, channels, height, width]` on, with
/// its sharding spec: batch and height (stacked), height and width (stacked), and all three on a
/// mesh whose axes are not in the dims' order (per device).
fn image_meshes() -> Vec<(Mesh<Dev>, [&'static str; 4])> {
    type OnMesh = (&'static [(&'static str, usize)], [&'static str; 4], bool);
    let meshes: [OnMesh; 3] = [
        (
            &[("batch", 2), ("h", 4)],
            ["batch", UNSHARDED, "h", UNSHARDED],
            true,
        ),
        (
            &[("h", 2), ("w", 4)],
            [UNSHARDED, UNSHARDED, "h", "w"],
            true,
        ),
        (
            &[("w", 2), ("batch", 2), ("h", 2)],
            ["batch", UNSHARDED, "h", "w"],
            false,
        ),
    ];
    meshes
        .into_iter()
        .map(|(axes, spec, stacked)| {
            let m = Mesh::virtual_devices(axes.iter().copied(), Dev::default())
                .unwrap()
                .with_stacked_execution(stacked);
            (m, spec)
        })
        .collect()
}

/// A global average pool (`adaptive_avg_pool2d` to `[1, 1]`, a ResNet's head) of an image
/// sharded over its height and/or width moves nothing: each device averages its block over the
/// global count, leaving a pending sum over the axes that sharded those dims (the batch kept);
/// `adaptive_avg_pool1d` to 1 of a sharded length likewise. Other output sizes run
/// batch-parallel. Values and every shard (settled) against NdArray on the whole tensor.
#[test]
fn global_average_pool_is_a_pending_sum() {
    use burn::tensor::module::{adaptive_avg_pool1d, adaptive_avg_pool2d};
    let dx = data(&[4, 6, 11, 10], 41);
    for (m, spec) in image_meshes() {
        let xl = Layout::new(&m, spec).unwrap();
        let (y, log) = record_comms(|| adaptive_avg_pool2d(dist::<4>(&dx, &xl), [1, 1]));
        assert!(log.events.is_empty(), "{xl}: {log}");
        let l = y.layout();
        assert_eq!(l.dim_axis(0), xl.dim_axis(0), "{l}");
        for d in [2, 3] {
            if let Some(a) = xl.dim_axis(d) {
                assert!(
                    l.partial(a).is_some(),
                    "{xl}: pending over dim {d}'s axis: {l}"
                );
            }
        }
        check(
            &format!("{xl} global average"),
            y,
            adaptive_avg_pool2d(orc::<4>(&dx), [1, 1]),
        );
        let y = adaptive_avg_pool2d(dist::<4>(&dx, &xl), [3, 2]);
        assert!(!y.layout().is_partial(), "{}", y.layout());
        check(
            &format!("{xl} adaptive [3, 2]"),
            y,
            adaptive_avg_pool2d(orc::<4>(&dx), [3, 2]),
        );
    }
    let m = Mesh::virtual_devices([("batch", 2), ("t", 4)], Dev::default()).unwrap();
    let d1 = data(&[2, 3, 21], 42);
    let xl = Layout::new(&m, ["batch", UNSHARDED, "t"]).unwrap();
    let (y, log) = record_comms(|| adaptive_avg_pool1d(dist::<3>(&d1, &xl), 1));
    assert!(log.events.is_empty(), "{log}");
    check(
        "adaptive_avg_pool1d",
        y,
        adaptive_avg_pool1d(orc::<3>(&d1), 1),
    );
}

/// Spatial parallelism for transposed convolutions (a decoder's upsampling): `conv_transpose2d`
/// of an input sharded over its height (and width) keeps those shards, each device computing its
/// output window from its own block alone and sending the window's overlap rows back to the
/// neighbours that own them (one collective permute per sharded spatial dim: the adjoint of a
/// convolution's halo exchange), never the whole input or output. DCGAN's kernel 4 stride 2,
/// output padding, groups, dilation, a non-overlapping kernel (no exchange), uneven blocks, both
/// spatial dims sharded; an output padding not below the stride runs batch-parallel;
/// `conv_transpose1d` (through the 2-D one) and `conv_transpose3d`. Values and every shard against
/// NdArray on the whole tensors, stacked and per device.
#[test]
fn transposed_convolution_keeps_spatial_shards() {
    use burn::tensor::module::{conv_transpose1d, conv_transpose2d, conv_transpose3d};
    use burn::tensor::ops::ConvTransposeOptions;
    // (kernel, stride, padding, padding_out, dilation, groups, [height, width]); channels 6 -> 4.
    type Case = (usize, usize, usize, usize, usize, usize, [usize; 2]);
    let cases: &[Case] = &[
        (4, 2, 1, 0, 1, 1, [8, 6]),
        (3, 2, 1, 1, 1, 1, [7, 9]),
        (3, 1, 1, 0, 1, 2, [12, 10]),
        (2, 2, 0, 0, 1, 1, [8, 12]),
        (3, 1, 0, 0, 2, 1, [10, 8]),
        (5, 3, 2, 2, 1, 1, [6, 5]),
    ];
    for (m, spec) in image_meshes() {
        let xl = Layout::new(&m, spec).unwrap();
        let rep = |r| Layout::replicated(&m, r);
        for (i, &(k, s, p, op, d, g, [h, w])) in cases.iter().enumerate() {
            let ctx = format!(
                "{xl}, kernel {k} stride {s} padding {p} out {op} dilation {d} groups {g}, {h}x{w}"
            );
            let (dx, dw, db) = (
                data(&[4, 6, h, w], 170 + i as u64),
                data(&[6, 4 / g, k, k], 180 + i as u64),
                data(&[4], 190 + i as u64),
            );
            let opts = || ConvTransposeOptions::new([s, s], [p, p], [op, op], [d, d], g);
            let (y, log) = record_comms(|| {
                conv_transpose2d(
                    dist::<4>(&dx, &xl),
                    dist::<4>(&dw, &rep(4)),
                    Some(dist::<1>(&db, &rep(1))),
                    opts(),
                )
            });
            assert_eq!(y.layout().dims(), xl.dims(), "{ctx}: {}", y.layout());
            let spatial = (2..4).filter(|&d| spec[d] != UNSHARDED).count();
            // One permute per sharded dim where the kernel overlaps its neighbours, none where
            // it does not.
            let overlap = (k - 1) * d + 1 > s;
            for e in &log.events {
                assert_eq!(e.kind, CollectiveKind::CollectivePermute, "{ctx}: {log}");
            }
            let permutes = if overlap { spatial } else { 0 };
            assert_eq!(log.events.len(), permutes, "{ctx}: {log}");
            let want = conv_transpose2d(orc::<4>(&dx), orc::<4>(&dw), Some(orc::<1>(&db)), opts());
            check(&ctx, y, want);
        }
        // An output padding of 1 at stride 1 (dilation 2): batch-parallel, NdArray's values.
        let (dx, dw) = (data(&[4, 6, 8, 8], 5), data(&[6, 4, 3, 3], 6));
        let opts = || ConvTransposeOptions::new([1, 1], [1, 1], [1, 1], [2, 2], 1);
        let y = conv_transpose2d(dist::<4>(&dx, &xl), dist::<4>(&dw, &rep(4)), None, opts());
        assert_eq!(y.layout().dim_axis(2), None, "{}", y.layout());
        check(
            &format!("{xl} output padding at stride 1"),
            y,
            conv_transpose2d(orc::<4>(&dx), orc::<4>(&dw), None, opts()),
        );
    }

    // conv_transpose1d of a sharded length (Burn's runs through the 2-D one), conv_transpose3d
    // of a sharded depth.
    let m = Mesh::virtual_devices([("batch", 2), ("t", 4)], Dev::default()).unwrap();
    let (dx, dw, db) = (data(&[2, 3, 13], 15), data(&[3, 4, 4], 16), data(&[4], 17));
    let opts = || ConvTransposeOptions::new([2], [1], [0], [1], 1);
    let xl = Layout::new(&m, ["batch", UNSHARDED, "t"]).unwrap();
    let (y, log) = record_comms(|| {
        conv_transpose1d(
            dist::<3>(&dx, &xl),
            dist::<3>(&dw, &Layout::replicated(&m, 3)),
            Some(dist::<1>(&db, &Layout::replicated(&m, 1))),
            opts(),
        )
    });
    assert_eq!(y.layout().sharding_spec(), ["batch", UNSHARDED, "t"]);
    assert_eq!(log.count(CollectiveKind::CollectivePermute), 1, "{log}");
    check(
        "conv_transpose1d",
        y,
        conv_transpose1d(orc::<3>(&dx), orc::<3>(&dw), Some(orc::<1>(&db)), opts()),
    );
    let (dx, dw) = (data(&[2, 2, 6, 5, 4], 18), data(&[2, 3, 3, 3, 3], 19));
    let opts = || ConvTransposeOptions::new([2, 1, 1], [1, 1, 1], [1, 0, 0], [1, 1, 1], 1);
    depth_sharded(
        "conv_transpose3d",
        &m,
        [&dx, &dw],
        |x, w| conv_transpose3d(x, w, None, opts()),
        |x, w| conv_transpose3d(x, w, None, opts()),
    );
}

/// A 3-D op of `x` by `w` (`[x, w]`: a convolution or a transposed one) with `x` sharded over
/// its batch and its depth on `m` (axes `batch`, `t`): the output keeps the input's layout and
/// equals `whole` (the op on NdArray) on the whole tensors.
fn depth_sharded(
    what: &str,
    m: &Mesh<Dev>,
    [dx, dw]: [&TensorData; 2],
    op: impl Fn(Tensor<DB, 5>, Tensor<DB, 5>) -> Tensor<DB, 5>,
    whole: impl Fn(Tensor<N, 5>, Tensor<N, 5>) -> Tensor<N, 5>,
) {
    let xl = Layout::new(m, ["batch", UNSHARDED, "t", UNSHARDED, UNSHARDED]).unwrap();
    let y = op(dist::<5>(dx, &xl), dist::<5>(dw, &Layout::replicated(m, 5)));
    assert_eq!(y.layout().dims(), xl.dims(), "{what}");
    check(what, y, whole(orc::<5>(dx), orc::<5>(dw)));
}

/// Spatial parallelism: a convolution of an input sharded over its height (and width) keeps
/// those shards, each device convolving its block plus the halo rows its output reads, received
/// from its neighbours in one collective permute per sharded spatial dim; never the whole input. Same
/// padding, strides, dilation, even kernels, uneven blocks, a grouped convolution, and both
/// spatial dims sharded (the corners come through the second exchange); `conv1d` (Burn's, through
/// `conv2d`) with a sharded length and a `conv3d` with a sharded depth. Values and every shard
/// against NdArray on the whole tensors, stacked and per device.
#[test]
fn convolution_keeps_spatial_shards_with_halos() {
    use burn::tensor::module::{conv1d, conv2d, conv3d};
    use burn::tensor::ops::ConvOptions;
    // (kernel, stride, padding, dilation, groups, [height, width]); channels 6 -> 4.
    type Case = (usize, usize, usize, usize, usize, [usize; 2]);
    let cases: &[Case] = &[
        (3, 1, 1, 1, 1, [16, 10]),
        (3, 2, 1, 1, 1, [15, 10]),
        (5, 1, 2, 1, 2, [24, 18]),
        (3, 1, 0, 2, 1, [28, 26]),
        (2, 1, 0, 1, 1, [13, 11]),
        (4, 3, 2, 1, 1, [18, 12]),
        (1, 1, 0, 1, 1, [12, 8]),
    ];
    for (m, spec) in image_meshes() {
        let xl = Layout::new(&m, spec).unwrap();
        for (i, &(k, s, p, d, g, [h, w])) in cases.iter().enumerate() {
            let ctx =
                format!("{xl}, kernel {k} stride {s} padding {p} dilation {d} groups {g}, {h}x{w}");
            let (dx, dw, db) = (
                data(&[4, 6, h, w], 70 + i as u64),
                data(&[4, 6 / g, k, k], 80 + i as u64),
                data(&[4], 90 + i as u64),
            );
            let opts = || ConvOptions::new([s, s], [p, p], [d, d], g);
            let rep = |r| Layout::replicated(&m, r);
            let (y, log) = record_comms(|| {
                conv2d(
                    dist::<4>(&dx, &xl),
                    dist::<4>(&dw, &rep(4)),
                    Some(dist::<1>(&db, &rep(1))),
                    opts(),
                )
            });
            // Each sharded spatial dim keeps its axis (in these cases every window reaches at
            // most into its neighbours' blocks and the strips are fewer rows than the dim), and
            // only the strips move: one collective permute per dim whose windows reach past its
            // block, never the input's spatial extent on that dim, each strip received by one
            // neighbour only: of the pieces' global shape (`k` strips side by side on the dim),
            // the `k - 1` that have a neighbour on their side, where an all-gather would move
            // every strip to `k - 1` devices.
            assert_eq!(y.layout().dims(), xl.dims(), "{ctx}: {}", y.layout());
            let halo_dims: Vec<usize> = if k == 1 {
                vec![]
            } else {
                (2..4).filter(|&d| spec[d] != UNSHARDED).collect()
            };
            assert_eq!(
                log.count(CollectiveKind::CollectivePermute),
                halo_dims.len(),
                "{ctx}: {log}"
            );
            assert_eq!(log.events.len(), halo_dims.len(), "{ctx}: {log}");
            for (e, d) in log.events.iter().zip(&halo_dims) {
                assert!(e.shape[*d] < dx.shape[*d], "{ctx}: {log}");
                let parts = m.axis_size(spec[*d]).unwrap() as u64;
                let numel: usize = e.shape.iter().product();
                assert_eq!(
                    e.bytes * parts,
                    numel as u64 * 4 * (parts - 1),
                    "{ctx}: {log}"
                );
            }
            let want = burn::tensor::module::conv2d(
                orc::<4>(&dx),
                orc::<4>(&dw),
                Some(orc::<1>(&db)),
                opts(),
            );
            check(&ctx, y, want);
        }
    }

    // conv1d of a sharded length (Burn's conv1d runs through conv2d), conv3d of a sharded depth.
    let m = Mesh::virtual_devices([("batch", 2), ("t", 4)], Dev::default()).unwrap();
    let (dx, dw, db) = (data(&[2, 3, 21], 5), data(&[4, 3, 3], 6), data(&[4], 7));
    let opts = || ConvOptions::new([1], [1], [1], 1);
    let (y, log) = record_comms(|| {
        conv1d(
            dist::<3>(&dx, &Layout::new(&m, ["batch", UNSHARDED, "t"]).unwrap()),
            dist::<3>(&dw, &Layout::replicated(&m, 3)),
            Some(dist::<1>(&db, &Layout::replicated(&m, 1))),
            opts(),
        )
    });
    assert_eq!(y.layout().sharding_spec(), ["batch", UNSHARDED, "t"]);
    assert_eq!(
        log.count(CollectiveKind::CollectivePermute),
        1,
        "conv1d: {log}"
    );
    check(
        "conv1d",
        y,
        conv1d(orc::<3>(&dx), orc::<3>(&dw), Some(orc::<1>(&db)), opts()),
    );
    // Halos of 4 rows on blocks of 5 or 6 (kernel 9): kept, each device receiving 4 + 4 rows
    // from its neighbours; a window past the neighbour's block (kernel 13, halos of 6): the
    // length gathered, the batch kept.
    for (k, kept) in [(9, true), (13, false)] {
        let wide = || ConvOptions::new([1], [k / 2], [1], 1);
        let dk = data(&[4, 3, k], 11);
        let y = conv1d(
            dist::<3>(&dx, &Layout::new(&m, ["batch", UNSHARDED, "t"]).unwrap()),
            dist::<3>(&dk, &Layout::replicated(&m, 3)),
            None,
            wide(),
        );
        let t = if kept { "t" } else { UNSHARDED };
        assert_eq!(y.layout().sharding_spec(), ["batch", UNSHARDED, t]);
        check(
            &format!("conv1d, kernel {k}"),
            y,
            conv1d(orc::<3>(&dx), orc::<3>(&dk), None, wide()),
        );
    }
    let (dx, dw) = (data(&[2, 2, 12, 5, 4], 8), data(&[3, 2, 3, 3, 3], 9));
    let opts = || ConvOptions::new([1, 1, 1], [1, 1, 1], [1, 1, 1], 1);
    depth_sharded(
        "conv3d",
        &m,
        [&dx, &dw],
        |x, w| conv3d(x, w, None, opts()),
        |x, w| conv3d(x, w, None, opts()),
    );
}
