//! Buckets: several partial tensors that settle by an all-reduce over the same mesh axes,
//! settled by **one** all-reduce of their shards laid end to end. This is PyTorch DDP's gradient
//! bucket (`bucket_cap_mb`, `torch/csrc/distributed/c10d/reducer.cpp`: gradients copied into one
//! flat buffer per bucket, one `allreduce` per bucket, views back into it) and XLA's all-reduce
//! combiner: across processes a collective costs a latency per message (a start-up handshake, a
//! barrier, a poll), so six small gradients cost six latencies where one bucket costs one.
//!
//! What a bucket may hold ([`bucketable`]): a partial tensor held per device (or stacked on a
//! multi-process mesh, sliced per position for the bucket) whose settled layout shards no dim
//! (every shard is the whole tensor: a data-parallel gradient), whose reduction is not memoised
//! yet, and which is not set to settle into a sharded layout (`DTensor::settle_to`). Every member
//! of one bucket has the same mesh, the same pending reductions and the same dtype ([`Key`]). The reduction is element-wise, so each element is
//! reduced from the same shard values in the same order as it would be alone: the ordered
//! reduction gives the bits of the tensors settled one by one (tested), and the communication
//! accounting records one all-reduce of the bucket's bytes (the members' bytes summed).

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Shape, TensorMetadata};

use crate::error::Result;
use crate::layout::{Layout, Partials};
use crate::tensor::{DTensor, Kind, Shards};

/// What the members of one bucket share: the mesh (its id), the pending reductions and the
/// dtype.
#[derive(Clone, Debug, PartialEq)]
pub struct Key {
    mesh: u16,
    partial: Partials,
    dtype: DType,
}

/// The bucket key of `t` when it may join a bucket (see the module docs), else `None`.
pub fn bucketable<P: TensorMetadata>(t: &DTensor<P>) -> Option<Key> {
    let memoised = t.reduced.as_ref().is_some_and(|m| m.get().is_some());
    (t.layout.is_partial()
        && t.layout.dims.iter().all(Option::is_none)
        && (matches!(t.shards, Shards::PerDevice(_))
            || (t.layout.mesh.multi && matches!(t.shards, Shards::Stacked(_))))
        && !memoised
        && t.settle_to.is_none())
    .then(|| Key {
        mesh: t.layout.mesh.id,
        partial: t.layout.partial.clone(),
        dtype: t.dtype(),
    })
}

/// Settles `ts` (each [`bucketable`] with one [`Key`]) to their layouts without the pending
/// reductions by one relayout of their concatenation: per addressable shard, each member
/// flattened and laid end to end (a `[Σ n_i]` shard, `n_i` the member's elements), one
/// all-reduce over the pending axes, and each member's range of the result reshaped to its own
/// shape. Returns the settled tensors in the order given. One member is settled alone (no copy).
///
/// # Errors
/// As [`super::redistribute`] (none for members that satisfy the precondition).
pub fn settle_together<B: Backend, K: Kind<B>>(
    ts: Vec<DTensor<K::P>>,
) -> Result<Vec<DTensor<K::P>>> {
    if ts.len() < 2 {
        return ts
            .into_iter()
            .map(|t| {
                let to = t.layout.without_partial();
                super::redistribute::<B, K>(t, &to)
            })
            .collect();
    }
    let first = ts[0].layout.clone();
    debug_assert!(ts.iter().all(|t| bucketable(t) == bucketable(&ts[0])));
    let bucket_layout = Layout {
        mesh: first.mesh.clone(),
        dims: std::iter::once(None).collect(),
        partial: first.partial.clone(),
    };
    let settled_layout = bucket_layout.without_partial();
    let locals = first.mesh.local_size();
    let mut members = Vec::with_capacity(ts.len());
    let mut parts: Vec<Vec<K::P>> = (0..locals).map(|_| Vec::with_capacity(ts.len())).collect();
    for t in ts {
        let n: usize = t.shape.iter().product();
        let to = t.layout.without_partial();
        let t = crate::stack::to_per_device::<B, K>(t);
        let Shards::PerDevice(shards) = t.shards else {
            unreachable!("`to_per_device` holds the shards per device")
        };
        for (j, s) in shards.into_iter().enumerate() {
            parts[j].push(K::reshape(s, Shape::new([n])));
        }
        members.push((t.shape, to, n));
    }
    let total = members.iter().map(|m| m.2).sum();
    let shards = parts.into_iter().map(|p| K::cat(p, 0)).collect();
    let bucket = DTensor::from_parts(vec![total], bucket_layout, shards);
    let reduced =
        crate::stack::to_per_device::<B, K>(super::redistribute::<B, K>(bucket, &settled_layout)?)
            .into_per_device();
    let mut start = 0;
    Ok(members
        .into_iter()
        .map(|(shape, to, n)| {
            let shards = reduced
                .iter()
                .map(|s| {
                    K::reshape(
                        K::narrow(s.clone(), 0, start..start + n),
                        Shape::from(&shape[..]),
                    )
                })
                .collect();
            start += n;
            DTensor::from_parts(shape, to, shards)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use burn::backend::NdArray;
    use burn::tensor::{TensorData, TensorMetadata};

    use crate::comm::{CollectiveKind, record_comms};
    use crate::layout::{Layout, ReduceOp, UNSHARDED};
    use crate::mesh::Mesh;
    use crate::redistribute::bucket::{bucketable, settle_together};
    use crate::tensor::{DTensor, FloatKind, Kind};

    type B = NdArray<f32>;
    type P = <FloatKind as Kind<B>>::P;

    /// Shard `j`'s values of member `seed`: multiples of 1/8 (every sum exact in f32).
    fn value(seed: usize, j: usize, i: usize) -> f32 {
        (((seed * 31 + j * 7 + i * 3) % 17) as f32 - 8.0) / 8.0
    }

    /// A tensor of `shape` pending a sum over `batch`, replicated otherwise, shard `j` holding
    /// [`value`]`(seed, j, ..)`, per device.
    fn pending(m: &Mesh<()>, seed: usize, shape: &[usize]) -> DTensor<P> {
        let n: usize = shape.iter().product();
        let layout = Layout::replicated(m, shape.len()).with_partial(0, ReduceOp::Sum);
        let shards = (0..m.size())
            .map(|j| {
                let v: Vec<f32> = (0..n).map(|i| value(seed, j, i)).collect();
                <FloatKind as Kind<B>>::from_data(
                    TensorData::new(v, shape.to_vec()),
                    &Default::default(),
                )
            })
            .collect();
        DTensor::from_parts(shape.to_vec(), layout, shards)
    }

    fn host(t: &P) -> Vec<f32> {
        <FloatKind as Kind<B>>::into_data(t.clone())
            .to_vec()
            .unwrap()
    }

    /// Three pending tensors of ranks 2, 1 and 3 settle in one all-reduce of their 34 elements,
    /// each to its own shape and settled layout, with the values of each settled alone and of
    /// the hand-computed sum over the batch group.
    #[test]
    fn a_bucket_settles_as_its_members_alone() {
        let m = Mesh::new([("batch", 4), ("model", 2)], vec![(); 8])
            .unwrap()
            .with_stacked_execution(false);
        let shapes: [&[usize]; 3] = [&[3, 5], &[7], &[2, 2, 3]];
        let make = || -> Vec<DTensor<P>> {
            shapes
                .iter()
                .enumerate()
                .map(|(s, shape)| pending(&m, s, shape))
                .collect()
        };
        let key = bucketable(&make()[0]).unwrap();
        assert!(make().iter().all(|t| bucketable(t) == Some(key.clone())));
        let alone: Vec<DTensor<P>> = make()
            .into_iter()
            .map(|t| {
                let to = t.layout.without_partial();
                super::super::redistribute::<B, FloatKind>(t, &to).unwrap()
            })
            .collect();
        let (together, log) = record_comms(|| settle_together::<B, FloatKind>(make()).unwrap());
        assert_eq!(log.events.len(), 1, "{log:?}");
        let e = &log.events[0];
        assert_eq!(
            (e.kind, e.axis.as_str(), e.shape.clone()),
            (CollectiveKind::AllReduce, "batch", vec![15 + 7 + 12])
        );
        for (s, (t, a)) in together.iter().zip(&alone).enumerate() {
            assert_eq!(t.shape, shapes[s]);
            assert_eq!(*t.layout, a.layout.as_ref().clone());
            assert!(!t.layout.is_partial());
            let n: usize = shapes[s].iter().product();
            for (j, (ts, as_)) in t.per_device().iter().zip(a.per_device()).enumerate() {
                assert_eq!(ts.shape().to_vec(), shapes[s].to_vec());
                let got = host(ts);
                assert_eq!(got, host(as_), "member {s}, device {j}");
                // Device j = (batch b, model c): the sum over b' of shard (b', c).
                let c = j % 2;
                let want: Vec<f32> = (0..n)
                    .map(|i| (0..4).map(|b| value(s, b * 2 + c, i)).sum())
                    .collect();
                assert_eq!(got, want, "member {s}, device {j}");
            }
        }
        // Stacked, sharded or settled tensors do not join a bucket.
        let stacked = Mesh::new([("batch", 4)], vec![(); 4]).unwrap();
        let t = crate::stack::to_stacked::<B, FloatKind>(pending(&stacked, 0, &[4]));
        assert!(t.is_stacked() && bucketable(&t).is_none());
        assert!(bucketable(&alone[0]).is_none());
        let sharded = pending(&m, 0, &[4, 2]);
        let l = Layout::new(&m, [UNSHARDED, "model"])
            .unwrap()
            .with_partial(0, ReduceOp::Sum);
        let sharded = crate::redistribute::redistribute::<B, FloatKind>(sharded, &l).unwrap();
        assert!(bucketable(&sharded).is_none());
    }
}
