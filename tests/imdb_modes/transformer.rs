//! The transformer text classifier of `imdb_transformer` trained by layout map alone (issue
//! 21), on synthetic reviews: every parallel mode gives the bare backend's per-step losses
//! (f32 here, f64 in `imdb_f64`), and each mode's step communicates what its plan implies.

use burn::backend::NdArray;
use burn_dtensor::CollectiveKind;
use dtensor_imdb::transformer_train::{TfMode, TfSummary};

#[path = "../common/transformer.rs"]
mod setup;
use setup::MODES;

fn run_mode(mode: TfMode, steps: usize) -> TfSummary {
    setup::run_mode::<NdArray<f32>>(mode, steps, &crate::RNG_LOCK)
}

/// Every mode gives the bare backend's per-step losses over 50 steps, f32 within 1e-5
/// relative.
#[test]
fn modes_match_the_bare_backend_f32() {
    let steps = 50;
    let want = run_mode(TfMode::Single, steps).train_losses;
    assert_eq!(want.len(), steps);
    // The model learns: the loss falls (a comparison of constants could not fail).
    assert!(want[steps - 1] < want[0], "losses {want:?}");
    for mode in MODES {
        let got = run_mode(mode, steps);
        for (s, (g, w)) in got.train_losses.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 * w.abs(),
                "{mode:?} f32 step {s}: {g} vs {w} (single)"
            );
        }
    }
}

/// The collectives of one training step (forward, backward, settling, Adam) of each mode,
/// against each plan's analytic count (bytes: received, summed over the devices; an all-reduce
/// of `n` bytes per device over a group of `g` receives `2 (g - 1) / g * n` on each).
#[test]
fn communication_of_each_mode() {
    let (.., devices) = TINY;
    let count = |s: &TfSummary, kind: CollectiveKind, axis: &str| {
        s.comm_events
            .iter()
            .filter(|e| e.kind == kind && e.axis == axis)
            .count()
    };
    for mode in MODES {
        let s = run_mode(mode, 1);
        println!("{mode:?}: {}", s.comm_first_step);
        for e in &s.comm_events {
            println!("  {}@{} {:?} {} B", e.kind, e.axis, e.shape, e.bytes);
        }
        let tensors = s.parameters.len();
        assert_eq!(tensors, 20, "{mode:?}: parameter tensors");
        match mode {
            // DDP: one all-reduce per gradient and the loss's scalar, nothing else.
            TfMode::Data => {
                assert_eq!(count(&s, CollectiveKind::AllReduce, "batch"), tensors + 1);
                assert_eq!(s.comm_events.len(), tensors + 1);
                let bytes: u64 = s.comm_events.iter().map(|e| e.bytes).sum();
                let want = 2 * (devices as u64 - 1) * 4 * (s.num_params as u64 + 1);
                assert_eq!(bytes, want, "data: all-reduce bytes");
            }
            // FSDP (ZeRO-3, resharded after the forward as FSDP2's default): each parameter
            // all-gathered once where the forward uses it (20), again where the backward reads
            // its value (the 7 linear weights: query, key, value, output, both feed-forward
            // linears and the head; the 2 layer norms' gammas: 9), every gradient
            // reduce-scattered to its parameter's shard once (20), and the loss's scalar.
            TfMode::Fsdp => {
                assert_eq!(count(&s, CollectiveKind::AllGather, "batch"), tensors + 9);
                assert_eq!(count(&s, CollectiveKind::ReduceScatter, "batch"), tensors);
                assert_eq!(count(&s, CollectiveKind::AllReduce, "batch"), 1);
                assert_eq!(
                    s.comm_events.len(),
                    2 * tensors + 9 + 1,
                    "fsdp: nothing else"
                );
                // FSDP's memory: each matrix's gradient (7 linear weights, 2 tables) is
                // reduce-scattered inside the backward pass as soon as it is computed,
                // interleaved with the backward's all-gathers, not held full-size until the
                // step's end (where the 1-D gradients settle, in parameter order).
                let kinds: Vec<(CollectiveKind, usize)> = s
                    .comm_events
                    .iter()
                    .map(|e| (e.kind, e.shape.len()))
                    .collect();
                let rs = |rank: usize| {
                    kinds
                        .iter()
                        .enumerate()
                        .filter(move |(_, k)| **k == (CollectiveKind::ReduceScatter, rank))
                        .map(|(i, _)| i)
                };
                let last_gather = kinds
                    .iter()
                    .rposition(|(k, _)| *k == CollectiveKind::AllGather)
                    .unwrap();
                let (matrices, vectors): (Vec<usize>, Vec<usize>) =
                    (rs(2).collect(), rs(1).collect());
                assert_eq!(matrices.len(), 9, "fsdp: matrix gradients");
                assert!(matrices[0] < last_gather, "fsdp: {kinds:?}");
                assert!(
                    matrices.iter().all(|m| vectors.iter().all(|v| m < v)),
                    "fsdp: the matrices' reduce-scatters come before the vectors': {kinds:?}"
                );
            }
            // Megatron: one all-reduce of the [batch, seq, d_model] activation over `model` for
            // the vocabulary-parallel embedding, two per block forward (each settles the
            // row-parallel output's pending sum, which the residual add and the layer norm's
            // mean keep pending until the centred values are squared) and two backward (each
            // device holds [batch / 4, seq, d_model] of f32; groups of 2).
            TfMode::Tp | TfMode::TwoD => megatron(&s, mode),
            // Megatron-SP's collectives in place of tp's all-reduces: the activations between
            // the blocks are sequence-sharded over `model`; each linear keeps its weight where
            // the layout map put it and moves the activation. The vocabulary-parallel lookup's
            // pending output is reduce-scattered onto the sequence (1) and its gradient
            // all-gathered back (1), as Megatron-SP's embedding. Forward, per sublayer (attention,
            // feed-forward): one all-gather of its input over the sequence (query, key and
            // value share it) and one reduce-scatter of the row-parallel output's pending sum
            // into the sequence-sharded residual: 2 + 2, Megatron-SP's count. Backward: each
            // row-parallel linear all-gathers its output gradient once for its input and weight
            // gradients (2), each sublayer re-gathers its input for the column-parallel weight
            // gradients (2, as Megatron-SP recomputes its all-gather), and each sublayer's input
            // gradient is reduce-scattered once (2, Megatron-SP's count): autodiff adds the
            // query, key and value input gradients (pending sums) to the residual's
            // (sequence-sharded) one at a time, and the sum stays pending until the layer
            // norm's backward reads it (`Step::PadPartial`, `DTensor::settle_to`). No
            // all-reduce of an activation, no all-to-all.
            TfMode::TpSp => megatron_sp(&s),
            TfMode::Single => {}
        }
    }
}

/// With dropout (0.1, Burn's `Dropout`: the input times a Bernoulli mask, then times
/// `1 / keep`), tensor and sequence parallelism still communicate exactly what their plans do:
/// the mask multiplies each member's term of the row-parallel output's pending sum, so the sum
/// settles where the residual says (tp-sp: Megatron-SP's reduce-scatter after the dropout, not
/// an all-reduce before it). The masks are drawn from the decorator's counter-based stream, the
/// same in every mode, so every mode's losses agree with the data-parallel run's (whose
/// activations are never pending sums) within f32 rounding, and differ from the run without
/// dropout.
#[test]
fn dropout_keeps_each_plans_communication() {
    let steps = 20;
    let run =
        |mode| setup::run_mode_with_dropout::<NdArray<f32>>(mode, steps, 0.1, &crate::RNG_LOCK);
    let data = run(TfMode::Data).train_losses;
    let plain = run_mode(TfMode::Data, steps).train_losses;
    assert!(
        data.iter().zip(&plain).any(|(a, b)| a != b),
        "dropout changes the losses"
    );
    for mode in [TfMode::Tp, TfMode::TpSp, TfMode::TwoD] {
        let s = run(mode);
        for (i, (g, w)) in s.train_losses.iter().zip(&data).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 * w.abs(),
                "{mode:?} with dropout, step {i}: {g} vs {w} (data)"
            );
        }
        let first: Vec<_> = s
            .comm_events
            .iter()
            .map(|e| format!("{}@{} {:?}", e.kind, e.axis, e.shape))
            .collect();
        println!("{mode:?} with dropout: {first:?}");
        match mode {
            TfMode::TpSp => megatron_sp(&s),
            _ => megatron(&s, mode),
        }
    }
}

/// The tiny configuration's batch, sequence, width and mesh size.
const TINY: (usize, usize, usize, usize) = (8, 8, 8, 8);

/// `tp` and `2d` over `model`: Megatron's all-reduces and nothing else.
fn megatron(s: &TfSummary, mode: TfMode) {
    let (batch, seq, d, devices) = TINY;
    let act = |e: &&burn_dtensor::CommEvent| {
        e.kind == CollectiveKind::AllReduce && e.axis == "model" && e.shape == [batch, seq, d]
    };
    let acts: Vec<_> = s.comm_events.iter().filter(act).collect();
    assert_eq!(acts.len(), 1 + 4, "{mode:?}: activation all-reduces");
    let local = (batch / 4 * seq * d * 4) as u64;
    for e in acts {
        assert_eq!(e.bytes, local * devices as u64, "{mode:?}: {e:?}");
    }
    // Nothing else over `model`. Two gradients are summed from a pending activation
    // gradient before another consumer settles it: the position embedding's
    // `[seq, d]` (the same gradient feeds the vocabulary-parallel lookup's backward,
    // which settles it) and the first layer norm's beta `[d]` (autodiff runs
    // `+ beta`'s backward before `* gamma`'s, which settles it). They settle from the
    // activation gradient's settled value (`Memo`'s derived tensors), not by
    // all-reduces of their own: Megatron settles the column-parallel input's
    // gradient first, so both are replicated there too.
    let other: Vec<_> = s
        .comm_events
        .iter()
        .filter(|e| e.axis == "model" && !act(e))
        .collect();
    assert!(
        other.is_empty(),
        "{mode:?}: beyond Megatron's count: {other:?}"
    );
}

/// `tp-sp` over `model`: Megatron-SP's all-gathers and reduce-scatters in place of tp's
/// all-reduces, and exactly the other small collectives listed.
fn megatron_sp(s: &TfSummary) {
    let (batch, seq, d, devices) = TINY;
    let count = |s: &TfSummary, kind: CollectiveKind, axis: &str| {
        s.comm_events
            .iter()
            .filter(|e| e.kind == kind && e.axis == axis)
            .count()
    };
    let act = |kind: CollectiveKind| {
        let acts: Vec<_> = s
            .comm_events
            .iter()
            .filter(|e| e.kind == kind && e.axis == "model" && e.shape == [batch, seq, d])
            .collect();
        // Each device receives the other half of its [batch / 4, seq, d] block.
        let half = (batch / 4 * seq / 2 * d * 4) as u64;
        for e in &acts {
            assert_eq!(e.bytes, half * devices as u64, "tp-sp: {e:?}");
        }
        acts.len()
    };
    assert_eq!(act(CollectiveKind::AllGather), 2 + 2 + 2 + 1);
    assert_eq!(act(CollectiveKind::ReduceScatter), 1 + 2 + 2);
    assert_eq!(act(CollectiveKind::AllReduce), 0);
    assert_eq!(count(s, CollectiveKind::AllToAll, "model"), 0);
    // Everything else over `model`, exactly: the token ids gathered over the
    // sequence for the lookup, forward and backward (`[batch, seq]` integers); the
    // position embedding's `[1, seq, d]` gradient gathered for its replicated
    // positions; the mean-pooled `[batch, d]` summed over the sequence shards; and
    // the `[d]` gradients of parameters applied to the sequence shards (layer
    // norms, row-parallel biases), summed over them as Megatron-SP all-reduces its
    // sequence-parallel parameters' gradients.
    let mut rest: Vec<(CollectiveKind, Vec<usize>)> = s
        .comm_events
        .iter()
        .filter(|e| e.axis == "model" && e.shape != [batch, seq, d])
        .map(|e| (e.kind, e.shape.clone()))
        .collect();
    rest.sort_by_key(|(k, sh)| (format!("{k}"), sh.clone()));
    let mut want = vec![
        (CollectiveKind::AllGather, vec![batch, seq]),
        (CollectiveKind::AllGather, vec![batch, seq]),
        (CollectiveKind::AllGather, vec![1, seq, d]),
        (CollectiveKind::AllReduce, vec![batch, d]),
    ];
    want.extend(std::iter::repeat_n((CollectiveKind::AllReduce, vec![d]), 5));
    want.sort_by_key(|(k, sh)| (format!("{k}"), sh.clone()));
    assert_eq!(rest, want, "tp-sp: the other collectives over model");
}
