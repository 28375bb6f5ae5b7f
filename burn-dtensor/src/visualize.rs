//! Sharding visualisation: a layout drawn as a table of device blocks, like JAX's
//! `jax.debug.visualize_sharding` and PyTorch's `visualize_sharding`.
//!
//! A rank-2 tensor is drawn as its grid of blocks (rows and columns of the global shape), each
//! cell naming the mesh devices (flat, row-major indices) that hold that block; a rank-1 tensor
//! as one row of blocks; higher ranks as one line per distinct shard with its range in every
//! dim. The title gives the layout in JAX's notation and the mesh; a replicated or partial
//! layout is said so beneath it. Table drawing is [`comfy_table`]'s.
//!
//! ```
//! use burn_dtensor::{Layout, Mesh, visualize_sharding};
//! let mesh = Mesh::virtual_devices([("batch", 4), ("model", 2)], ())?;
//! let w = Layout::new(&mesh, ["unsharded", "model"])?;
//! assert_eq!(visualize_sharding(&w, &[1200, 48], false)?, "\
//! [1200, 48@model] on mesh batch=4,model=2 (8 devices)
//! ┌──────────────┬─────────┬─────────┐
//! │              ┆ 0..24   ┆ 24..48  │
//! ╞══════════════╪═════════╪═════════╡
//! │ rows 0..1200 ┆ 0,2,4,6 ┆ 1,3,5,7 │
//! └──────────────┴─────────┴─────────┘");
//! # Ok::<(), burn_dtensor::DTensorError>(())
//! ```

use std::collections::BTreeMap;
use std::ops::Range;

use comfy_table::presets::UTF8_FULL;
use comfy_table::{Cell, Color, Table};

use crate::error::Result;
use crate::layout::Layout;
use crate::layout::local_ranges;

/// Background colours of the device blocks (cycled), chosen to stay readable with black text.
const PALETTE: [Color; 8] = [
    Color::Cyan,
    Color::Green,
    Color::Yellow,
    Color::Magenta,
    Color::Blue,
    Color::Red,
    Color::Grey,
    Color::DarkCyan,
];

/// Draws `layout` for a tensor of global shape `shape` as a table of device blocks (see the
/// module docs), with ANSI colours (one background per block) when `color` is true.
///
/// Device numbers are flat mesh indices in row-major order (the last mesh axis varies
/// fastest), as in [`Mesh::devices`](crate::Mesh::devices) and
/// [`DTensorExt::to_local_shards`](crate::DTensorExt::to_local_shards).
///
/// # Errors
/// [`DTensorError::RankMismatch`](crate::DTensorError::RankMismatch) when `shape.len()` is not
/// the layout's rank.
pub fn visualize_sharding(layout: &Layout, shape: &[usize], color: bool) -> Result<String> {
    layout.check_rank(shape.len())?;
    Ok(render(layout, shape, "", color))
}

/// [`visualize_sharding`] with `dtype` in the title (what tensors pass), for a `shape` of the
/// layout's rank.
pub(crate) fn render(layout: &Layout, shape: &[usize], dtype: &str, color: bool) -> String {
    debug_assert_eq!(shape.len(), layout.rank());
    let mesh = layout.mesh();
    let mut out = format!(
        "{} on mesh {} ({} device{})",
        layout.describe(dtype, shape),
        mesh,
        mesh.size(),
        if mesh.size() == 1 { "" } else { "s" }
    );
    if layout.is_replicated() && mesh.size() > 1 {
        out.push_str("\nreplicated: every device holds the whole tensor");
    }
    if layout.is_partial() {
        let pending: Vec<String> = (0..mesh.ndim())
            .filter_map(|a| {
                layout.partial(a).map(|op| {
                    format!(
                        "{} over {}",
                        format!("{op:?}").to_lowercase(),
                        mesh.axis_name(a)
                    )
                })
            })
            .collect();
        out.push_str(&format!(
            "\npartial: each block's devices hold values whose {} is the tensor",
            pending.join(", then ")
        ));
    }
    // The devices holding each distinct block, blocks in row-major order of their ranges.
    let mut blocks: BTreeMap<Vec<(usize, usize)>, Vec<usize>> = BTreeMap::new();
    for i in 0..mesh.size() {
        let key = local_ranges(layout, shape, i)
            .into_iter()
            .map(|r| (r.start, r.end))
            .collect();
        blocks.entry(key).or_default().push(i);
    }
    let mut table = Table::new();
    table.load_style(UTF8_FULL).force_no_tty();
    if color {
        table.enforce_styling();
    }
    let mut shade = 0;
    let mut cell = |devices: &[usize]| {
        let c = Cell::new(device_list(devices));
        shade += 1;
        if color {
            c.bg(PALETTE[(shade - 1) % PALETTE.len()]).fg(Color::Black)
        } else {
            c
        }
    };
    match shape.len() {
        0 => {
            return format!(
                "{out}\nscalar held by devices {}",
                device_list(&(0..mesh.size()).collect::<Vec<_>>())
            );
        }
        1 => {
            table.set_header(blocks.keys().map(|k| range_text(&(k[0].0..k[0].1))));
            let row: Vec<Cell> = blocks.values().map(|d| cell(d)).collect();
            table.add_row(row);
        }
        2 => {
            let rows = distinct(blocks.keys().map(|k| k[0]));
            let cols = distinct(blocks.keys().map(|k| k[1]));
            let mut header = vec![String::new()];
            header.extend(cols.iter().map(|c| range_text(&(c.0..c.1))));
            table.set_header(header);
            for r in &rows {
                let mut row = vec![Cell::new(format!("rows {}", range_text(&(r.0..r.1))))];
                row.extend(cols.iter().map(|c| cell(&blocks[&vec![*r, *c]])));
                table.add_row(row);
            }
        }
        _ => {
            let mut header = vec!["devices".to_string()];
            header.extend((0..shape.len()).map(|d| match layout.dim_axis(d) {
                Some(a) => format!("dim {d} @{}", mesh.axis_name(a)),
                None => format!("dim {d}"),
            }));
            table.set_header(header);
            for (k, d) in &blocks {
                let mut row = vec![cell(d)];
                row.extend(k.iter().map(|r| Cell::new(range_text(&(r.0..r.1)))));
                table.add_row(row);
            }
        }
    }
    format!("{out}\n{table}")
}

/// The distinct values in first-seen order (the keys iterate sorted, so this is sorted too).
fn distinct(it: impl Iterator<Item = (usize, usize)>) -> Vec<(usize, usize)> {
    let mut v: Vec<(usize, usize)> = it.collect();
    v.dedup();
    v.sort_unstable();
    v.dedup();
    v
}

/// `0..24`, or `3..3 (empty)` for an empty shard.
fn range_text(r: &Range<usize>) -> String {
    if r.is_empty() {
        format!("{}..{} (empty)", r.start, r.end)
    } else {
        format!("{}..{}", r.start, r.end)
    }
}

/// `0,2,4,6`; runs of three or more consecutive devices shortened to `0-7`.
fn device_list(devices: &[usize]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < devices.len() {
        let mut j = i;
        while j + 1 < devices.len() && devices[j + 1] == devices[j] + 1 {
            j += 1;
        }
        if j - i >= 2 {
            parts.push(format!("{}-{}", devices[i], devices[j]));
        } else {
            parts.extend(devices[i..=j].iter().map(usize::to_string));
        }
        i = j + 1;
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::device_list;

    #[test]
    fn device_lists_shorten_runs() {
        assert_eq!(device_list(&[0, 2, 4, 6]), "0,2,4,6");
        assert_eq!(device_list(&[0, 1, 2, 3, 5, 6]), "0-3,5,6");
        assert_eq!(device_list(&[7]), "7");
    }
}
