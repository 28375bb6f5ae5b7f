//! Convolutions (`conv2d`, `conv3d`; `conv1d` through `conv2d`) with the batch *and the spatial
//! dims* kept sharded: spatial parallelism (Mesh-TensorFlow's and GSPMD's spatial partitioning,
//! PyTorch's `tp_convolution`). Each device convolves its own block of the input plus a *halo*:
//! the input rows next to its block that its output rows read, received from its neighbours
//! along the spatial dim's mesh axis. The output comes out sharded as the input (its batch and
//! spatial dims on the same axes; every output chunk computed where it lands), so no device
//! ever holds a whole image, and the weight's gradient is a pending sum over those axes.
//!
//! The geometry is JAX's rule beside the shape rule: output size
//! `o = (n + 2p - d(k - 1) - 1) / s + 1` (Burn's `calculate_conv_output_size`), and the input
//! window the output rows `olo..ohi` read, `olo·s - p .. (ohi - 1)·s - p + d(k - 1) + 1` (below
//! 0 or past `n`: the padding's zeros). A spatial dim keeps its sharding when every device's
//! window reaches at most into its two neighbours' blocks (the halo `left`/`right` rows at most
//! the smallest block) and no block of the input or the output is empty; else that dim is
//! gathered, as the batch-parallel rule did for every spatial dim before. A device then
//! receives `left + right` rows (one collective permute, `ops/halo.rs`), never more than its
//! own block twice, where gathering the dim would bring it every other block. The channel dim
//! is always whole (the weight is replicated); a pool ([`pool`]) keeps it sharded.

use std::ops::Range;

use crate::layout::Layout;
use crate::shard::chunk;

/// The halo exchange of one spatial dim sharded over one mesh axis: for each coordinate `c`
/// along the axis, its input block [`Halo::block`] and the window its output chunk reads
/// ([`Halo::window`], global rows, the padding outside `0..input`).
#[derive(Debug, Clone, PartialEq)]
pub struct Halo {
    /// The tensor dim (2 for a 2-D convolution's height).
    pub dim: usize,
    /// The mesh axis sharding it.
    pub axis: usize,
    /// Global input size on `dim`.
    pub input: usize,
    /// Global output size on `dim`.
    pub output: usize,
    /// Rows each block sends its right neighbour: its last `left` rows (its neighbour's left
    /// halo), the most any device reads from its left neighbour.
    pub left: usize,
    /// Rows each block sends its left neighbour: its first `right` rows.
    pub right: usize,
    /// `(stride, padding, dilation, kernel)` on `dim`.
    geometry: [usize; 4],
    /// The axis size.
    parts: usize,
}

impl Halo {
    /// The global input rows coordinate `c` holds.
    pub fn block(&self, c: usize) -> Range<usize> {
        chunk(self.input, self.parts, c)
    }
    /// The global output rows coordinate `c` computes.
    pub fn out_block(&self, c: usize) -> Range<usize> {
        chunk(self.output, self.parts, c)
    }
    /// The input window coordinate `c`'s output rows read, in global rows: may start below 0
    /// and end past `input` (the padding's zero rows).
    pub fn window(&self, c: usize) -> Range<isize> {
        let [s, p, d, k] = self.geometry.map(|v| v as isize);
        let o = self.out_block(c);
        let (lo, hi) = (o.start as isize, o.end as isize);
        lo * s - p..(hi - 1) * s - p + d * (k - 1) + 1
    }
    /// The axis size: the number of blocks.
    pub fn parts(&self) -> usize {
        self.parts
    }
    /// Rows of coordinate `c`'s window, [`Halo::window`]'s length.
    pub fn window_len(&self, c: usize) -> usize {
        self.window(c).len()
    }
    /// The longest window: every device's windowed block is padded to it, so the blocks form
    /// a tensor of even chunks (`parts × padded` rows) that the exchange can move.
    pub fn padded(&self) -> usize {
        (0..self.parts)
            .map(|c| self.window_len(c))
            .max()
            .unwrap_or(0)
    }
    /// The pieces of coordinate `c`'s window, each a global row range (empty where none):
    /// `(zeros above, from the left neighbour, own, from the right neighbour, zeros below)`.
    pub fn pieces(&self, c: usize) -> [Range<usize>; 5] {
        let (w, b, n) = (self.window(c), self.block(c), self.input as isize);
        let clamp = |v: isize, lo: usize, hi: usize| v.clamp(lo as isize, hi as isize) as usize;
        let (wlo, whi) = (clamp(w.start, 0, self.input), clamp(w.end, 0, self.input));
        let own = clamp(w.start, b.start, b.end)..clamp(w.end, b.start, b.end);
        [
            0..(-w.start).max(0) as usize,
            wlo..whi.min(b.start).max(wlo),
            own,
            wlo.max(b.end)..whi.max(wlo.max(b.end)),
            0..(w.end - n).max(0) as usize,
        ]
    }
}

/// What [`conv`] decides: the input's layout, the output's and its global shape, and the halo
/// exchanges (in dim order; none: a batch-parallel convolution).
#[derive(Debug, Clone, PartialEq)]
pub struct ConvPlan {
    /// The layout the input is redistributed to: dim 0 as the input's, the channels whole,
    /// each spatial dim sharded where it has a [`Halo`], else whole.
    pub x: Layout,
    /// The output's layout: the input's dims (`[batch, channels_out, spatial...]`), replicated
    /// channels.
    pub out: Layout,
    /// The output's global shape.
    pub out_shape: Vec<usize>,
    /// One exchange per sharded spatial dim.
    pub halos: Vec<Halo>,
}

impl ConvPlan {
    /// The mesh axes the input is sharded over (batch and halos): the weight's and the bias's
    /// gradients are pending sums over them.
    pub fn sharded_axes(&self) -> Vec<usize> {
        self.x.dims.iter().flatten().copied().collect()
    }
    /// The padding each device runs with, of `padding` (one per spatial dim): none on a dim
    /// with a halo (its window holds the padding rows where it reaches past the tensor).
    pub fn local_padding<const N: usize>(&self, mut padding: [usize; N]) -> [usize; N] {
        for h in &self.halos {
            padding[h.dim - 2] = 0;
        }
        padding
    }
}

/// The plan of a convolution of `x` (global shape `[batch, channels_in, spatial...]`) with a
/// kernel of spatial sizes `kernel`, per spatial dim `stride`, `padding` and `dilation`
/// (Burn's `ConvOptions`; `channels_out` the weight's dim 0). See the module docs for when a
/// spatial dim keeps its sharding.
pub fn conv(
    x: &Layout,
    x_shape: &[usize],
    channels_out: usize,
    kernel: &[usize],
    [stride, padding, dilation]: [&[usize]; 3],
) -> ConvPlan {
    let mut l = x.without_partial();
    l.dims[1] = None;
    let mut out_shape = vec![x_shape[0], channels_out];
    let mut halos = Vec::new();
    for (s, &k) in kernel.iter().enumerate() {
        let dim = 2 + s;
        let n = x_shape[dim];
        let geometry = [stride[s], padding[s], dilation[s], k];
        let o = burn::tensor::ops::conv::calculate_conv_output_size(
            k,
            stride[s],
            padding[s],
            dilation[s],
            n,
        );
        out_shape.push(o);
        let Some(axis) = l.dims[dim] else { continue };
        let parts = l.mesh.axis_size(axis);
        let mut h = Halo {
            dim,
            axis,
            input: n,
            output: o,
            left: 0,
            right: 0,
            geometry,
            parts,
        };
        let ok = n >= parts && o >= parts && {
            for c in 0..parts {
                let [_, from_left, _, from_right, _] = h.pieces(c);
                let b = h.block(c);
                if !from_left.is_empty() {
                    h.left = h.left.max(b.start - from_left.start);
                }
                if !from_right.is_empty() {
                    h.right = h.right.max(from_right.end - b.end);
                }
            }
            let smallest = (0..parts).map(|c| h.block(c).len()).min().unwrap_or(0);
            h.left <= smallest && h.right <= smallest
        };
        if ok {
            halos.push(h);
        } else {
            l.dims[dim] = None;
        }
    }
    let out = l.clone();
    ConvPlan {
        x: l,
        out,
        out_shape,
        halos,
    }
}

/// The plan of a transposed convolution (`conv_transpose2d`, `conv_transpose3d`;
/// `conv_transpose1d` through the 2-D one) of `x` (global shape `[batch, channels_in,
/// spatial...]`) by a weight of global shape `weight` (`[channels_in, channels_out / groups,
/// kernel...]`), with per spatial dim `stride`, `padding`, `padding_out` and `dilation` (Burn's
/// `ConvTransposeOptions`): the plan of the convolution it is the adjoint of, and the output's
/// global shape `[batch, channels_out, spatial_out...]`, `spatial_out = (n - 1)s - 2p + d(k - 1) +
/// 1 + padding_out` (Burn's `calculate_conv_transpose_output_size`).
///
/// A transposed convolution is the input gradient of the convolution with the same weight,
/// stride, padding, dilation and groups, taken at `x` as that convolution's output gradient (Burn's
/// `conv2d_x_backward` is a `conv_transpose2d`; the weight `[channels_in, channels_out / groups,
/// kernel...]` is that convolution's `[channels_out, channels_in / groups, kernel...]`). So the
/// output is that convolution's input, laid out as [`ConvPlan::x`], and `x` its output, laid out
/// as [`ConvPlan::out`]: each device computes its window of the output from its own block of `x`
/// alone, and the window's halo rows go back to the neighbours that own them and are added in
/// (the adjoint of the halo exchange, one collective permute per sharded spatial dim).
///
/// `None` (the batch-parallel form: the spatial dims gathered) where no spatial dim keeps its
/// sharding, and where the convolution of an output that long is not as long as `x` (an output
/// padding not below the stride: Burn's input gradient then cuts rows off).
pub fn conv_transpose(
    x: &Layout,
    x_shape: &[usize],
    weight: &[usize],
    [stride, padding, padding_out, dilation]: [&[usize]; 4],
    groups: usize,
) -> Option<(ConvPlan, Vec<usize>)> {
    let kernel = &weight[2..];
    let mut out_shape = vec![x_shape[0], weight[1] * groups];
    for (s, &k) in kernel.iter().enumerate() {
        out_shape.push(
            burn::tensor::ops::conv::calculate_conv_transpose_output_size(
                k,
                stride[s],
                padding[s],
                padding_out[s],
                dilation[s],
                x_shape[2 + s],
            ),
        );
    }
    let plan = conv(
        x,
        &out_shape,
        weight[0],
        kernel,
        [stride, padding, dilation],
    );
    (plan.out_shape == x_shape && !plan.halos.is_empty()).then_some((plan, out_shape))
}

/// The batch-parallel plan of `x` (dim 0 as `x`'s, every other dim whole: the batch-parallel
/// rule's layout, [`super::module::batch_parallel`]) for an output of global shape `out_shape`:
/// what [`conv`] gives when no spatial dim keeps its sharding, for an op whose geometry [`conv`]
/// does not describe (a transposed convolution's weight gradient with an output padding not
/// below the stride).
pub fn batch(x: &Layout, out_shape: Vec<usize>) -> ConvPlan {
    let r = x.dims.len();
    let l = super::module::batch_parallel(x, &[true], &[r], r).inputs[0].clone();
    ConvPlan {
        x: l.clone(),
        out: l,
        out_shape,
        halos: Vec::new(),
    }
}

/// The plan of a 2-D pool (`avg_pool2d`, `max_pool2d`, `max_pool2d_with_indices` and their
/// backward passes) of `x` (global shape `[batch, channels, height, width]`) with `kernel`,
/// `stride`, `padding` and `dilation` (1 for an average pool): a convolution's geometry
/// ([`conv`]) with one output channel per input channel, so the channel dim keeps its sharding
/// too (each channel is pooled alone). The window's padding rows are filled with the pool's
/// padding value (`-inf` for a max pool, zeros for an average pool that counts them).
///
/// `None` (the batch-parallel form: the spatial dims gathered) where no spatial dim keeps its
/// sharding, with `ceil_mode` (a partial last window: the output size is not [`conv`]'s), and
/// for an average pool that leaves the padding out of its divisor (`counts_padding` false) with
/// padding on a dim that has a halo (a window's divisor would count the filled rows).
pub fn pool(
    x: &Layout,
    x_shape: &[usize],
    [kernel, stride, padding, dilation]: [[usize; 2]; 4],
    ceil_mode: bool,
    counts_padding: bool,
) -> Option<ConvPlan> {
    if ceil_mode {
        return None;
    }
    let mut plan = conv(
        x,
        x_shape,
        x_shape[1],
        &kernel,
        [&stride, &padding, &dilation],
    );
    if plan.halos.is_empty()
        || (!counts_padding && plan.halos.iter().any(|h| padding[h.dim - 2] > 0))
    {
        return None;
    }
    let channels = x.dims[1];
    plan.x.dims[1] = channels;
    plan.out.dims[1] = channels;
    Some(plan)
}

/// Whether an adaptive average pool of `x` (global shape `[batch, channels, height, width]`) to
/// `output` keeps the spatial shards: a *global* average (`output` `[1, 1]`: the head of a ResNet,
/// `burn::nn::pool::AdaptiveAvgPool2d`) of an input whose height or width is sharded, no shard
/// empty. Each device then averages its block over the *global* count `height × width` (the mean's
/// rule, `rules/reduce.rs`), which leaves a pending sum over the axes sharding those dims, settled
/// where a consumer needs it (one all-reduce of `[batch, channels]` values), never the image
/// gathered; the backward pass spreads `grad / (height × width)` over each device's own block.
/// Other output sizes (windows that straddle blocks unevenly) stay batch-parallel.
pub fn global_average(x: &Layout, x_shape: &[usize], output: [usize; 2]) -> bool {
    output == [1, 1]
        && (x.dims[2].is_some() || x.dims[3].is_some())
        && !crate::layout::has_empty_shard(x, x_shape)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Layout;

    const U: &str = crate::mesh::UNSHARDED;

    fn mesh() -> crate::Mesh<()> {
        crate::Mesh::new([("b", 2), ("h", 4)], vec![(); 8]).unwrap()
    }

    /// A 3x3 "same" convolution of 16 rows over 4 blocks of 4: each block reads one row of each
    /// neighbour, the outer blocks one padding row.
    #[test]
    fn same_padding_reads_one_row_of_each_neighbour() {
        let m = mesh();
        let x = Layout::new(&m, ["b", U, "h", U]).unwrap();
        let p = conv(&x, &[4, 3, 16, 5], 8, &[3, 3], [&[1, 1], &[1, 1], &[1, 1]]);
        assert_eq!(p.out_shape, vec![4, 8, 16, 5]);
        assert_eq!(p.halos.len(), 1);
        let h = &p.halos[0];
        assert_eq!((h.dim, h.axis, h.left, h.right), (2, 1, 1, 1));
        assert_eq!(h.window(0), -1..5);
        assert_eq!(h.pieces(0), [0..1, 0..0, 0..4, 4..5, 0..0]);
        assert_eq!(h.pieces(1), [0..0, 3..4, 4..8, 8..9, 0..0]);
        assert_eq!(h.pieces(3), [0..0, 11..12, 12..16, 16..16, 0..1]);
        assert_eq!(p.out.dims.to_vec(), vec![Some(0), None, Some(1), None]);
        assert_eq!(p.sharded_axes(), vec![0, 1]);
    }

    /// Stride 2 without padding over uneven blocks: output rows 0..7 of 15 input rows, the
    /// windows computed by hand from `olo·2 .. (ohi - 1)·2 + 3`.
    #[test]
    fn strided_windows_by_hand() {
        let m = mesh();
        let x = Layout::new(&m, [U, U, "h", U]).unwrap();
        let p = conv(&x, &[1, 1, 15, 1], 1, &[3, 1], [&[2, 1], &[0, 0], &[1, 1]]);
        let h = &p.halos[0];
        // Output 7 rows over 4: 2, 2, 2, 1; input blocks 0..4, 4..8, 8..12, 12..15.
        assert_eq!(p.out_shape[2], 7);
        assert_eq!(
            (0..4).map(|c| h.window(c)).collect::<Vec<_>>(),
            vec![0..5, 4..9, 8..13, 12..15]
        );
        assert_eq!((h.left, h.right), (0, 1));
    }

    /// A kernel wider than a block and more blocks than output rows: the dim is gathered; halos
    /// as large as the blocks are kept (each device receives 2 + 2 rows where gathering the dim
    /// would bring it 6).
    #[test]
    fn a_halo_past_the_neighbour_gathers_the_dim_a_block_wide_one_does_not() {
        let m = mesh();
        let x = Layout::new(&m, ["b", U, "h", U]).unwrap();
        let wide = conv(&x, &[2, 1, 8, 8], 1, &[7, 1], [&[1, 1], &[3, 0], &[1, 1]]);
        assert!(wide.halos.is_empty());
        assert_eq!(wide.x.dims.to_vec(), vec![Some(0), None, None, None]);
        // Halos of 2 on blocks of 2: each block sends its whole self to both neighbours.
        let whole = conv(&x, &[2, 1, 8, 8], 1, &[5, 1], [&[1, 1], &[2, 0], &[1, 1]]);
        assert_eq!((whole.halos[0].left, whole.halos[0].right), (2, 2));
        let short = conv(&x, &[2, 1, 8, 8], 1, &[7, 1], [&[1, 1], &[0, 0], &[1, 1]]);
        assert_eq!(short.out_shape[2], 2);
        assert!(short.halos.is_empty());
    }

    /// A DCGAN upsampling (kernel 4, stride 2, padding 1) of 8 rows over 4 blocks of 2: 16
    /// output rows in blocks of 4, and the convolution it transposes reads `4c - 1 .. 4c + 5` for
    /// the 2 rows of block `c`: one halo row on each side (by hand: `2c·2 - 1 .. (2c + 1)·2 - 1 +
    /// 3 + 1`). An output padding of 1 below a stride of 2 keeps the plan; one at stride 1
    /// (dilation 2) does not (the convolution of its output is a row longer than `x`).
    #[test]
    fn transposed_convolution_is_the_adjoint_plan() {
        let m = mesh();
        let x = Layout::new(&m, ["b", U, "h", U]).unwrap();
        let (p, shape) = conv_transpose(
            &x,
            &[2, 6, 8, 5],
            &[6, 3, 4, 4],
            [&[2, 2], &[1, 1], &[0, 0], &[1, 1]],
            1,
        )
        .unwrap();
        assert_eq!(shape, vec![2, 3, 16, 10]);
        assert_eq!(p.out_shape, vec![2, 6, 8, 5]);
        let h = &p.halos[0];
        assert_eq!(
            (0..4).map(|c| h.window(c)).collect::<Vec<_>>(),
            vec![-1..5, 3..9, 7..13, 11..17]
        );
        assert_eq!((h.left, h.right), (1, 1));
        assert_eq!(p.x.dims.to_vec(), vec![Some(0), None, Some(1), None]);
        let grouped = conv_transpose(
            &x,
            &[2, 6, 8, 5],
            &[6, 1, 3, 3],
            [&[2, 2], &[1, 1], &[1, 1], &[1, 1]],
            3,
        );
        assert_eq!(grouped.unwrap().1, vec![2, 3, 16, 10]);
        let longer = conv_transpose(
            &x,
            &[2, 6, 8, 5],
            &[6, 3, 3, 3],
            [&[1, 1], &[1, 1], &[1, 1], &[2, 2]],
            1,
        );
        assert!(longer.is_none());
        let whole = Layout::new(&m, ["b", U, U, U]).unwrap();
        assert!(
            conv_transpose(
                &whole,
                &[2, 6, 8, 5],
                &[6, 3, 4, 4],
                [&[2, 2], &[1, 1], &[0, 0], &[1, 1]],
                1
            )
            .is_none()
        );
    }

    /// The global average keeps a sharded height or width (a pending sum) and refuses other
    /// output sizes, an unsharded image and an empty block.
    #[test]
    fn global_average_needs_a_sharded_spatial_dim_and_no_empty_block() {
        let m = mesh();
        let h = Layout::new(&m, ["b", U, "h", U]).unwrap();
        assert!(global_average(&h, &[2, 3, 8, 8], [1, 1]));
        assert!(!global_average(&h, &[2, 3, 8, 8], [2, 1]));
        assert!(!global_average(&h, &[2, 3, 3, 8], [1, 1]));
        let b = Layout::new(&m, ["b", U, U, U]).unwrap();
        assert!(!global_average(&b, &[2, 3, 8, 8], [1, 1]));
    }
}
