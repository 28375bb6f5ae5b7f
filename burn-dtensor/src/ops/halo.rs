//! The halo exchange of spatial parallelism (convolutions, `ops/conv.rs`; pools,
//! `ops/pool.rs`), on the plans of [`crate::rules::conv`]: each device's *window* on a sharded
//! spatial dim (the rows its output chunk reads) built from its block and its neighbours' edge
//! rows, and the adjoint that sums a window's gradient back onto the blocks.
//!
//! **The halo exchange** of a spatial dim is one collective permute along its mesh axis
//! ([`collective_permute`], XLA's collective-permute): each block sends its last `left` rows to its
//! right neighbour and its first `right` rows to its left one, so a device receives `left + right`
//! rows whatever the axis size (an all-gather of the strips, the first implementation, received
//! `(parts - 1) × (left + right)`). Across processes only the pieces between neighbouring processes
//! cross, point to point (MPI's `MPI_Isend` / `MPI_Irecv`); values are moved, never combined, so
//! the exchange is bitwise the same on any process count. Each device's *window* (the rows its
//! output chunk reads, the padding's rows included, filled with the op's padding value, the op then
//! run unpadded on that dim) is padded to the longest window, so windows of every device form a
//! tensor of even chunks and a second sharded spatial dim exchanges them in turn (its pieces carry
//! the first dim's halo rows: the corners). The input gradient is the adjoint: each device's window
//! gradient, the gradient of its halo rows sent back to the neighbours that own them and added into
//! their blocks, dims in reverse order.

use burn::tensor::backend::Backend;
use burn::tensor::{Slice, TensorMetadata};

use crate::collective::generic::collective_permute;
use crate::layout::Layout;
use crate::rules::conv::Halo;
use crate::tensor::{DTensor, FloatKind, Kind};

type P<B> = <B as burn::tensor::backend::BackendTypes>::FloatTensorPrimitive;
type FT<B> = DTensor<P<B>>;

pub(super) fn narrow<B: Backend>(t: P<B>, dim: usize, r: std::ops::Range<usize>) -> P<B> {
    <FloatKind as Kind<B>>::narrow(t, dim, r)
}

/// Zeros shaped as `like` but `rows` long on `dim`, pushed onto `v` (none for 0 rows: no
/// device allocates or launches for an empty piece).
pub(super) fn zeros<B: Backend>(v: &mut Vec<P<B>>, like: &P<B>, dim: usize, rows: usize) {
    filled::<B>(v, like, dim, rows, 0.0)
}

/// [`zeros`] of `value` (a window's padding: 0 for a convolution or an average pool, `-inf`
/// for a max pool).
fn filled<B: Backend>(v: &mut Vec<P<B>>, like: &P<B>, dim: usize, rows: usize, value: f64) {
    if rows > 0 {
        let mut s = like.shape();
        s[dim] = rows;
        let (device, dtype) = (B::float_device(like), like.dtype().into());
        v.push(if value == 0.0 {
            B::float_zeros(s, &device, dtype)
        } else {
            B::float_full(s, value.into(), &device, dtype)
        });
    }
}

/// The pieces concatenated along `dim` (empty ones skipped).
pub(super) fn cat<B: Backend>(parts: Vec<P<B>>, dim: usize) -> P<B> {
    <FloatKind as Kind<B>>::cat(parts, dim)
}

/// `t` with `v` added into its rows `r` of `dim`.
fn add_rows<B: Backend>(t: P<B>, dim: usize, r: std::ops::Range<usize>, v: P<B>) -> P<B> {
    let mut s = vec![Slice::full(); t.shape().num_dims()];
    s[dim] = Slice::new(r.start as isize, Some(r.end as isize), 1);
    let cur = B::float_slice(t.clone(), &s);
    B::float_slice_assign(t, &s, B::float_add(cur, v))
}

/// The coordinate along `h`'s axis of this process's `j`-th position.
pub(super) fn coord_of(t: &Layout, h: &Halo, j: usize) -> usize {
    t.mesh.coord(t.mesh.global(j), h.axis)
}

/// Per device, the pieces received from its left and its right neighbour ([`exchange`]).
type Received<B> = Vec<(Option<P<B>>, Option<P<B>>)>;

/// The piece a device sends a neighbour, from its coordinate on the axis and its shard.
type Piece<'a, B> = &'a dyn Fn(usize, &P<B>) -> P<B>;

/// The halo exchange along `h`'s axis: every device sends `to_right(c, shard)` to its right
/// neighbour and `to_left(c, shard)` to its left one (`None`: that direction carries no rows),
/// in one collective permute. Returns, per device, what came from its left and from its right
/// neighbour (`None` at the axis' ends and for a direction that carries nothing).
fn exchange<B: Backend>(
    t: &FT<B>,
    h: &Halo,
    to_right: Option<Piece<'_, B>>,
    to_left: Option<Piece<'_, B>>,
) -> Received<B> {
    let pieces = |f: Piece<'_, B>| -> Vec<P<B>> {
        (t.per_device().iter().enumerate())
            .map(|(j, p)| f(coord_of(&t.layout, h, j), p))
            .collect()
    };
    let (mut sends, mut shifts) = (Vec::new(), Vec::new());
    for (f, shift) in [(to_right, 1), (to_left, -1)] {
        if let Some(f) = f {
            sends.push(pieces(f));
            shifts.push(shift);
        }
    }
    // Logged as the pieces' global shape: each device's pieces side by side on `h.dim`.
    let mut shape = t.shape.clone();
    shape[h.dim] = h.parts()
        * sends
            .iter()
            .map(|v| v.first().map_or(0, |p| p.shape()[h.dim]))
            .sum::<usize>();
    let mut got =
        collective_permute::<B, FloatKind>(&sends, &t.layout.mesh, h.axis, &shifts, &shape)
            .into_iter();
    let n = t.per_device().len();
    let mut take = |present: bool| {
        if present {
            got.next().expect("one result per shift")
        } else {
            vec![None; n]
        }
    };
    let from_left = take(to_right.is_some());
    let from_right = take(to_left.is_some());
    from_left.into_iter().zip(from_right).collect()
}

/// `x` (blocks on `h.dim`) as every device's window on it, padded to [`Halo::padded`] rows:
/// `[parts × padded]` rows of even chunks, on `x`'s layout; the window's rows outside the
/// tensor (the op's padding) hold `pad`.
fn extend<B: Backend>(x: FT<B>, h: &Halo, pad: f64) -> FT<B> {
    let (d, l, r) = (h.dim, h.left, h.right);
    // Each block's last `l` rows go right (its right neighbour's left halo), its first `r` rows
    // left (its left neighbour's right halo).
    let last = |c: usize, p: &P<B>| {
        let n = h.block(c).len();
        narrow::<B>(p.clone(), d, n - l..n)
    };
    let first = |_: usize, p: &P<B>| narrow::<B>(p.clone(), d, 0..r);
    let halos = exchange::<B>(&x, h, (l > 0).then_some(&last), (r > 0).then_some(&first));
    let padded = h.padded();
    let windows: Vec<P<B>> = (x.per_device().iter().enumerate())
        .map(|(j, p)| {
            let c = coord_of(&x.layout, h, j);
            let [above, from_left, own, from_right, below] = h.pieces(c);
            let b = h.block(c);
            let mut v = Vec::new();
            filled::<B>(&mut v, p, d, above.len(), pad);
            if !from_left.is_empty() {
                // The left neighbour's last `l` rows are global rows `b.start - l..b.start`.
                let at = from_left.start + l - b.start;
                let g = halos[j].0.clone().expect("a left halo received");
                v.push(narrow::<B>(g, d, at..at + from_left.len()));
            }
            v.push(narrow::<B>(
                p.clone(),
                d,
                own.start - b.start..own.end - b.start,
            ));
            if !from_right.is_empty() {
                // The right neighbour's first `r` rows are global rows `b.end..b.end + r`.
                let at = from_right.start - b.end;
                let g = halos[j].1.clone().expect("a right halo received");
                v.push(narrow::<B>(g, d, at..at + from_right.len()));
            }
            filled::<B>(&mut v, p, d, below.len(), pad);
            zeros::<B>(&mut v, p, d, padded - h.window_len(c));
            cat::<B>(v, d)
        })
        .collect();
    let mut shape = x.shape.clone();
    shape[d] = h.parts() * padded;
    DTensor::from_parts(shape, x.layout.clone(), windows)
}

/// The adjoint of [`extend`]: `g`, every device's gradient of its padded window on `h.dim`,
/// summed back onto the blocks (`[input]` rows, the layout kept).
fn fold_back<B: Backend>(g: FT<B>, h: &Halo) -> FT<B> {
    let (d, l, r) = (h.dim, h.left, h.right);
    // Where each piece sits in a window: after the zeros above it.
    let offsets = |c: usize| {
        let [above, from_left, own, ..] = h.pieces(c);
        let o = above.len() + from_left.len();
        (above.len(), o, o + own.len())
    };
    // To the left neighbour: the gradient of its last `l` rows; to the right one: of its
    // first `r` rows (zeros where this device's window did not read them).
    let to_left = |c: usize, p: &P<B>| {
        let [_, from_left, ..] = h.pieces(c);
        let (b, (top, _, _)) = (h.block(c), offsets(c));
        let mut v = Vec::new();
        if from_left.is_empty() {
            zeros::<B>(&mut v, p, d, l);
        } else {
            zeros::<B>(&mut v, p, d, from_left.start + l - b.start);
            v.push(narrow::<B>(p.clone(), d, top..top + from_left.len()));
            zeros::<B>(&mut v, p, d, b.start - from_left.end);
        }
        cat::<B>(v, d)
    };
    let to_right = |c: usize, p: &P<B>| {
        let [_, _, _, from_right, _] = h.pieces(c);
        let (b, (_, _, after_own)) = (h.block(c), offsets(c));
        let mut v = Vec::new();
        if from_right.is_empty() {
            zeros::<B>(&mut v, p, d, r);
        } else {
            zeros::<B>(&mut v, p, d, from_right.start - b.end);
            v.push(narrow::<B>(
                p.clone(),
                d,
                after_own..after_own + from_right.len(),
            ));
            zeros::<B>(&mut v, p, d, b.end + r - from_right.end);
        }
        cat::<B>(v, d)
    };
    let halos = exchange::<B>(
        &g,
        h,
        (r > 0).then_some(&to_right),
        (l > 0).then_some(&to_left),
    );
    let blocks: Vec<P<B>> = (g.per_device().iter().enumerate())
        .map(|(j, p)| {
            let c = coord_of(&g.layout, h, j);
            let [_, _, own, _, _] = h.pieces(c);
            let b = h.block(c);
            let (_, at, _) = offsets(c);
            let mut v = Vec::new();
            zeros::<B>(&mut v, p, d, own.start - b.start);
            v.push(narrow::<B>(p.clone(), d, at..at + own.len()));
            zeros::<B>(&mut v, p, d, b.end - own.end);
            let mut t = cat::<B>(v, d);
            let n = b.len();
            // From the right neighbour, the gradient of this block's last `l` rows; from the
            // left one, of its first `r`.
            if let Some(s) = halos[j].1.clone() {
                t = add_rows::<B>(t, d, n - l..n, s);
            }
            if let Some(s) = halos[j].0.clone() {
                t = add_rows::<B>(t, d, 0..r, s);
            }
            t
        })
        .collect();
    let mut shape = g.shape.clone();
    shape[d] = h.input;
    DTensor::from_parts(shape, g.layout.clone(), blocks)
}

/// `x` (its blocks on every dim of `halos`) as every device's window, its halos received from
/// its neighbours dim after dim ([`extend`]; a second dim's pieces carry the first's halo rows:
/// the corners), padded to even chunks; rows outside the tensor hold `pad`. Cut each device's
/// own window out with [`window`].
pub(super) fn windows<B: Backend>(x: FT<B>, halos: &[Halo], pad: f64) -> FT<B> {
    halos.iter().fold(x, |t, h| extend::<B>(t, h, pad))
}

/// Device `j`'s window of `t` (padded windows on every halo dim, [`windows`]) cut to its own
/// length.
pub(super) fn window<B: Backend>(t: &FT<B>, halos: &[Halo], j: usize) -> P<B> {
    halos.iter().fold(t.per_device()[j].clone(), |p, h| {
        narrow::<B>(p, h.dim, 0..h.window_len(coord_of(&t.layout, h, j)))
    })
}

/// The shape of device `j`'s window of an input of global shape `x_shape` laid out as `x`
/// (its shard's shape, each dim of `halos` its window's length).
pub(super) fn window_shape(x: &Layout, x_shape: &[usize], halos: &[Halo], j: usize) -> Vec<usize> {
    let mut shape = x.shard_shape(x_shape, x.mesh.global(j));
    for h in halos {
        shape[h.dim] = h.window_len(coord_of(x, h, j));
    }
    shape
}

/// The adjoint of [`windows`]: every addressable device's gradient of its window (`grads[j]`,
/// its own length on each dim of `halos`), the halo rows' gradients sent back to the neighbours
/// that own them and added into their blocks, dims in reverse order. Returns the input's
/// gradient, of global shape `x_shape`, laid out as `x`.
pub(super) fn fold_windows<B: Backend>(
    grads: Vec<P<B>>,
    x: &Layout,
    x_shape: &[usize],
    halos: &[Halo],
) -> FT<B> {
    let padded: Vec<P<B>> = (grads.into_iter().enumerate())
        .map(|(j, g)| {
            halos.iter().fold(g, |t, h| {
                let (mut v, like) = (vec![t.clone()], t);
                let pad = h.padded() - h.window_len(coord_of(x, h, j));
                zeros::<B>(&mut v, &like, h.dim, pad);
                cat::<B>(v, h.dim)
            })
        })
        .collect();
    let mut shape = x_shape.to_vec();
    for h in halos {
        shape[h.dim] = h.parts() * h.padded();
    }
    let t = DTensor::from_parts(shape, x.clone(), padded);
    halos.iter().rev().fold(t, |t, h| fold_back::<B>(t, h))
}
