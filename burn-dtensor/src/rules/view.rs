//! Views: permutations carry each dim's sharding along; reshapes keep a sharded dim when it
//! stays the leading dim of its group and its chunks map onto the new dim's chunks; expand keeps
//! the sharding of dims that are not broadcast.

use super::Strategy;
use crate::layout::Layout;

/// `permute(axes)`: output dim `i` is input dim `axes[i]` (also covers swap_dims).
pub fn permute(l: &Layout, axes: &[usize]) -> Strategy {
    let mut out = l.clone();
    out.dims = axes.iter().map(|&a| l.dims[a]).collect();
    Strategy {
        inputs: vec![l.clone()],
        output: out.into(),
    }
}

/// Groups of old and new dims with equal products (the classic view algorithm).
fn groups(
    old: &[usize],
    new: &[usize],
) -> Option<Vec<(std::ops::Range<usize>, std::ops::Range<usize>)>> {
    let (mut i, mut j) = (0, 0);
    let mut out = Vec::new();
    while i < old.len() || j < new.len() {
        let (si, sj) = (i, j);
        let (mut po, mut pn) = (1usize, 1usize);
        // Take at least one dim from a side that has some left, then grow the smaller product.
        if i < old.len() {
            po *= old[i];
            i += 1;
        }
        if j < new.len() {
            pn *= new[j];
            j += 1;
        }
        while po != pn {
            if po < pn && i < old.len() {
                po *= old[i];
                i += 1;
            } else if pn < po && j < new.len() {
                pn *= new[j];
                j += 1;
            } else {
                return None;
            }
        }
        // Absorb trailing size-1 dims into the group.
        while i < old.len() && old[i] == 1 && (j >= new.len() || new[j] != 1) {
            i += 1;
        }
        while j < new.len() && new[j] == 1 && (i >= old.len() || old[i] != 1) {
            j += 1;
        }
        out.push((si..i, sj..j));
    }
    Some(out)
}

/// `reshape(old -> new)`. A sharded dim survives when it is the first non-singleton dim of its
/// group and either keeps its size (e.g. `[N@b, C] -> [N@b, C, 1]`, exact on uneven shards) or
/// both it and the new leading dim divide evenly by the axis size. Other sharded dims are
/// gathered first.
pub fn reshape(l: &Layout, old: &[usize], new: &[usize]) -> Strategy {
    let mut input = l.clone();
    let mut out = Layout::replicated_on(&l.mesh, new.len());
    out.partial = l.partial.clone();
    let Some(gs) = groups(old, new) else {
        input.dims.iter_mut().for_each(|d| *d = None);
        return Strategy {
            inputs: vec![input],
            output: out.into(),
        };
    };
    for (go, gn) in gs {
        let lead_old = go.clone().find(|&d| old[d] != 1);
        let lead_new = gn.clone().find(|&d| new[d] != 1);
        for d in go.clone() {
            let Some(a) = l.dims[d] else { continue };
            let k = l.mesh.axis_size(a);
            let ok = match (lead_old, lead_new) {
                (Some(lo), Some(ln)) if lo == d => {
                    old[lo] == new[ln] || (old[lo].is_multiple_of(k) && new[ln].is_multiple_of(k))
                }
                _ => false,
            };
            if ok {
                out.dims[lead_new.unwrap()] = Some(a);
            } else {
                input.dims[d] = None;
            }
        }
    }
    Strategy {
        inputs: vec![input],
        output: out.into(),
    }
}

/// `expand(old -> new)` (new rank >= old rank, trailing alignment). A pending reduction is
/// kept when nothing is broadcast, and settled first when the expand broadcasts: reducing the
/// small tensor costs less than reducing its broadcast later (the backward pass of a mean over
/// a batch-sharded dim expands a partial gradient back to the batch, which would otherwise be
/// reduce-scattered at full batch size).
pub fn expand(l: &Layout, old: &[usize], new: &[usize]) -> Strategy {
    let off = new.len() - old.len();
    let broadcasts = new.iter().product::<usize>() > old.iter().product::<usize>();
    let mut input = if broadcasts {
        l.without_partial()
    } else {
        l.clone()
    };
    let mut out = Layout::replicated_on(&l.mesh, new.len());
    out.partial = input.partial.clone();
    for d in 0..old.len() {
        if old[d] == new[off + d] {
            out.dims[off + d] = l.dims[d];
        } else {
            input.dims[d] = None;
        }
    }
    Strategy {
        inputs: vec![input],
        output: out.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::groups;
    #[test]
    fn reshape_groups() {
        assert_eq!(
            groups(&[4, 6], &[4, 2, 3]).unwrap(),
            vec![(0..1, 0..1), (1..2, 1..3)]
        );
        assert_eq!(
            groups(&[2, 3, 4], &[6, 4]).unwrap(),
            vec![(0..2, 0..1), (2..3, 1..2)]
        );
        assert_eq!(
            groups(&[5, 3], &[5, 3, 1]).unwrap(),
            vec![(0..1, 0..1), (1..2, 1..3)]
        );
        assert_eq!(groups(&[1, 5], &[5]).unwrap(), vec![(0..2, 0..1)]);
    }
}
