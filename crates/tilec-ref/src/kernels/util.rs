//! Index helpers shared by kernels.

use tilec_ir::strides;

/// For an output of shape `out` broadcast from an input of shape `inp` (numpy rules),
/// the input's flat index for every output flat index. Errors when the map cannot be
/// allocated (an output expanded far beyond its input).
pub fn broadcast_index_map(inp: &[usize], out: &[usize]) -> Result<Vec<usize>, String> {
    let n = tilec_ir::size::numel(out).map_err(|e| e.to_string())?;
    let r = out.len();
    let off = r - inp.len();
    let in_strides = strides(inp);
    // Stride 0 along broadcast dims.
    let mut eff = vec![0usize; r];
    for i in 0..inp.len() {
        eff[off + i] = if inp[i] == 1 { 0 } else { in_strides[i] };
    }
    let mut idx = vec![0usize; r];
    let mut map = tilec_ir::size::try_with_capacity(n)?;
    let mut cur = 0usize;
    for _ in 0..n {
        map.push(cur);
        // Increment the multi-index, updating `cur` incrementally.
        for d in (0..r).rev() {
            idx[d] += 1;
            cur += eff[d];
            if idx[d] < out[d] {
                break;
            }
            cur -= eff[d] * idx[d];
            idx[d] = 0;
        }
    }
    Ok(map)
}

/// Numpy broadcast of concrete shapes.
pub fn broadcast(a: &[usize], b: &[usize]) -> Result<Vec<usize>, String> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let da = if i + a.len() >= n { a[i + a.len() - n] } else { 1 };
        let db = if i + b.len() >= n { b[i + b.len() - n] } else { 1 };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return Err(format!("shapes {a:?} and {b:?} do not broadcast"));
        };
    }
    Ok(out)
}

/// Splits a shape around `axis` into (outer, axis length, inner) element counts.
pub fn split_at_axis(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    let outer = shape[..axis].iter().product();
    let len = shape[axis];
    let inner = shape[axis + 1..].iter().product();
    (outer, len, inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_map_matches_naive() {
        let inp = [3, 1];
        let out = [2, 3, 4];
        let m = broadcast_index_map(&inp, &out).unwrap();
        let mut k = 0;
        for _a in 0..2 {
            for b in 0..3 {
                for _c in 0..4 {
                    assert_eq!(m[k], b);
                    k += 1;
                }
            }
        }
    }
}
