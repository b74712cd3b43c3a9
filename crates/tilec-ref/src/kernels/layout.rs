//! Layout kernels: every op here is an index map from output elements to input elements
//! (plus a fill value for padding), except Concat (several inputs) and Resize
//! (interpolation weights, computed in f64 one axis at a time).

use super::util::{broadcast, broadcast_index_map, split_at_axis};
use crate::EvalCtx;
use tilec_ir::op::{slice_range, CoordMode, LayoutOp, NearestMode, PadMode, ResizeAttrs, ResizeMode, SliceBound};
use tilec_ir::{dispatch, strides, with_dtype_fn, DType, DTypeFn, Element, Tensor, TensorData};

/// Marks an output element that takes the fill value instead of an input element.
const FILL: usize = usize::MAX;

fn take_t<T: Element>(v: &[T], idx: &[usize], fill: Option<&Tensor>) -> Result<TensorData, String> {
    let fv: T = match fill {
        Some(f) => *f.as_slice::<T>().and_then(|s| s.first()).ok_or("fill value has the wrong dtype")?,
        None => T::default(),
    };
    let mut out = Vec::with_capacity(idx.len());
    for &i in idx {
        out.push(if i == FILL { fv } else { *v.get(i).ok_or_else(|| format!("index {i} out of range"))? });
    }
    Ok(T::wrap(out))
}

/// The tensor whose element `k` is `x[idx[k]]` (or the fill value / zero where
/// `idx[k] == FILL`).
pub fn take(x: &Tensor, idx: &[usize], shape: Vec<usize>, fill: Option<&Tensor>) -> Result<Tensor, String> {
    let data = dispatch!(x.data(), v => take_t(&v[..], idx, fill))?;
    Tensor::new(shape, data).map_err(|e| e.to_string())
}

/// Index map of a separable re-indexing: output coordinate `c` along axis `a` reads
/// input coordinate `per_axis[a][c]` (or FILL), at `in_strides[a]`.
pub fn separable_map(out_shape: &[usize], per_axis: &[Vec<usize>], in_strides: &[usize]) -> Result<Vec<usize>, String> {
    let n = tilec_ir::size::numel(out_shape).map_err(|e| e.to_string())?;
    let r = out_shape.len();
    let mut map = tilec_ir::size::try_with_capacity(n)?;
    if n == 0 {
        return Ok(map);
    }
    let mut idx = vec![0usize; r];
    for _ in 0..n {
        let mut off = 0usize;
        let mut fill = false;
        for a in 0..r {
            let c = per_axis[a][idx[a]];
            if c == FILL {
                fill = true;
                break;
            }
            off += c * in_strides[a];
        }
        map.push(if fill { FILL } else { off });
        for d in (0..r).rev() {
            idx[d] += 1;
            if idx[d] < out_shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    Ok(map)
}

struct ConcatF<'a> {
    args: &'a [&'a Tensor],
    axis: usize,
}

impl DTypeFn<(), Result<TensorData, String>> for ConcatF<'_> {
    fn call<T: Element>(&self, _: ()) -> Result<TensorData, String> {
        let mut parts = Vec::with_capacity(self.args.len());
        for t in self.args {
            let s = t.as_slice::<T>().ok_or("concat inputs differ in dtype")?;
            let (outer, len, inner) = split_at_axis(t.shape(), self.axis);
            parts.push((s, outer, len * inner));
        }
        let outer = parts.first().map(|p| p.1).unwrap_or(0);
        let total: usize = parts.iter().map(|p| p.0.len()).sum();
        let mut out = Vec::with_capacity(total);
        for o in 0..outer {
            for &(s, _, chunk) in &parts {
                out.extend_from_slice(&s[o * chunk..(o + 1) * chunk]);
            }
        }
        Ok(T::wrap(out))
    }
}

fn identity_axes(shape: &[usize]) -> Vec<Vec<usize>> {
    shape.iter().map(|&n| (0..n).collect()).collect()
}

fn slice(x: &Tensor, axes: &[usize], starts: &[i64], ends: &[i64], steps: &[i64]) -> Result<Tensor, String> {
    let shape = x.shape().to_vec();
    let mut per_axis = identity_axes(&shape);
    let mut out_shape = shape.clone();
    for (i, &a) in axes.iter().enumerate() {
        let d = *shape.get(a).ok_or_else(|| format!("axis {a} out of range"))? as i64;
        let (s, n) = slice_range(d, starts[i], ends[i], steps[i]);
        per_axis[a] = (0..n).map(|k| (s + k * steps[i]) as usize).collect();
        out_shape[a] = n as usize;
    }
    let map = separable_map(&out_shape, &per_axis, &strides(&shape))?;
    take(x, &map, out_shape, None)
}

/// Input coordinate for output coordinate `o` of a padded axis (FILL for constant).
fn pad_coord(o: i64, before: i64, n: i64, mode: PadMode) -> usize {
    let i = o - before;
    if (0..n).contains(&i) {
        return i as usize;
    }
    if n == 0 {
        return FILL;
    }
    match mode {
        PadMode::Constant => FILL,
        PadMode::Edge => i.clamp(0, n - 1) as usize,
        PadMode::Wrap => i.rem_euclid(n) as usize,
        PadMode::Reflect => {
            if n == 1 {
                return 0;
            }
            let period = 2 * (n - 1);
            let m = i.rem_euclid(period);
            (if m < n { m } else { period - m }) as usize
        }
    }
}

pub fn eval(op: &LayoutOp, args: &[&Tensor], cx: &EvalCtx) -> Result<Vec<Tensor>, String> {
    let x = *args.first().ok_or("missing input")?;
    match op {
        LayoutOp::Reshape { shape } => {
            let s = cx.dims(shape)?;
            Ok(vec![x.clone().reshaped(s).map_err(|e| e.to_string())?])
        }
        LayoutOp::Transpose { perm } => {
            let sh = x.shape();
            let st = strides(sh);
            let out_shape: Vec<usize> = perm.iter().map(|&p| sh[p]).collect();
            let pst: Vec<usize> = perm.iter().map(|&p| st[p]).collect();
            let map = separable_map(&out_shape, &identity_axes(&out_shape), &pst)?;
            Ok(vec![take(x, &map, out_shape, None)?])
        }
        LayoutOp::Concat { axis } => {
            let mut shape = x.shape().to_vec();
            if *axis >= shape.len() {
                return Err(format!("axis {axis} out of range"));
            }
            shape[*axis] = 0;
            for t in args {
                if t.rank() != x.rank() {
                    return Err("concat inputs differ in rank".into());
                }
                for i in 0..x.rank() {
                    if i != *axis && t.shape()[i] != x.shape()[i] {
                        return Err(format!("concat inputs {:?} and {:?} differ off the axis", x.shape(), t.shape()));
                    }
                }
                shape[*axis] += t.shape()[*axis];
            }
            let data = with_dtype_fn(x.dtype(), (), ConcatF { args, axis: *axis })?;
            Ok(vec![Tensor::new(shape, data).map_err(|e| e.to_string())?])
        }
        LayoutOp::Split { axis, sizes } => {
            let sizes = cx.dims(sizes)?;
            let total: usize = sizes.iter().sum();
            if x.shape().get(*axis) != Some(&total) {
                return Err(format!("split sizes {sizes:?} do not cover axis {axis} of {:?}", x.shape()));
            }
            let mut out = Vec::with_capacity(sizes.len());
            let mut start = 0i64;
            for &s in &sizes {
                let end = start + s as i64;
                out.push(slice(x, &[*axis], &[start], &[end], &[1])?);
                start = end;
            }
            Ok(out)
        }
        LayoutOp::Slice { axes, starts, ends, steps } => {
            let idx = |b: &SliceBound| match b {
                SliceBound::Index(v) => Ok(*v),
                SliceBound::Dim(d) => cx.dim(*d).map(|n| n as i64),
            };
            let starts = starts.iter().map(idx).collect::<Result<Vec<i64>, String>>()?;
            let ends = ends.iter().map(idx).collect::<Result<Vec<i64>, String>>()?;
            Ok(vec![slice(x, axes, &starts, &ends, steps)?])
        }
        LayoutOp::Expand { shape } => {
            let target = cx.dims(shape)?;
            let out_shape = broadcast(x.shape(), &target)?;
            let map = broadcast_index_map(x.shape(), &out_shape)?;
            Ok(vec![take(x, &map, out_shape, None)?])
        }
        LayoutOp::Tile { repeats } => {
            let sh = x.shape();
            if repeats.len() != sh.len() {
                return Err("repeats do not match the rank".into());
            }
            let out_shape: Vec<usize> = sh.iter().zip(repeats).map(|(&d, &r)| d * r).collect();
            let per_axis: Vec<Vec<usize>> =
                out_shape.iter().zip(sh).map(|(&o, &d)| (0..o).map(|c| c % d.max(1)).collect()).collect();
            let map = separable_map(&out_shape, &per_axis, &strides(sh))?;
            Ok(vec![take(x, &map, out_shape, None)?])
        }
        LayoutOp::Pad { pads, mode } => {
            let fill = *args.get(1).ok_or("missing pad value")?;
            let sh = x.shape();
            let r = sh.len();
            let mut out_shape = Vec::with_capacity(r);
            let mut per_axis = Vec::with_capacity(r);
            for a in 0..r {
                let n = sh[a] as i64;
                let (b, e) = (pads[a], pads[a + r]);
                let m = n + b + e;
                if m < 0 {
                    return Err(format!("pads crop more than axis {a} has"));
                }
                if n == 0 && m > 0 && *mode != PadMode::Constant {
                    return Err(format!("cannot pad an empty axis in {mode:?} mode"));
                }
                out_shape.push(m as usize);
                per_axis.push((0..m).map(|o| pad_coord(o, b, n, *mode)).collect());
            }
            let map = separable_map(&out_shape, &per_axis, &strides(sh))?;
            Ok(vec![take(x, &map, out_shape, Some(fill))?])
        }
        LayoutOp::Trilu { upper, k } => {
            let sh = x.shape();
            let r = sh.len();
            if r < 2 {
                return Err("trilu needs rank >= 2".into());
            }
            let (rows, cols) = (sh[r - 2], sh[r - 1]);
            let mut map = Vec::with_capacity(x.numel());
            for flat in 0..x.numel() {
                let j = (flat % cols) as i64;
                let i = ((flat / cols) % rows) as i64;
                let keep = if *upper { j - i >= *k } else { j - i <= *k };
                map.push(if keep { flat } else { FILL });
            }
            Ok(vec![take(x, &map, sh.to_vec(), None)?])
        }
        LayoutOp::Resize(a) => Ok(vec![resize(x, a, cx)?]),
    }
}

// ---- resize ----

fn cubic_coeffs(r: f64, a: f64) -> Vec<f64> {
    let s = 1.0 - r;
    vec![
        ((a * (r + 1.0) - 5.0 * a) * (r + 1.0) + 8.0 * a) * (r + 1.0) - 4.0 * a,
        ((a + 2.0) * r - (a + 3.0)) * r * r + 1.0,
        ((a + 2.0) * s - (a + 3.0)) * s * s + 1.0,
        ((a * (s + 1.0) - 5.0 * a) * (s + 1.0) + 8.0 * a) * (s + 1.0) - 4.0 * a,
    ]
}

fn cubic_coeffs_antialias(r: f64, scale: f64, a: f64) -> Vec<f64> {
    let scale = scale.min(1.0);
    let f = |x: f64| {
        let x = x.abs();
        let (x2, x3) = (x * x, x * x * x);
        if x <= 1.0 {
            (a + 2.0) * x3 - (a + 3.0) * x2 + 1.0
        } else if x < 2.0 {
            a * x3 - 5.0 * a * x2 + 8.0 * a * x - 4.0 * a
        } else {
            0.0
        }
    };
    let i_start = (-2.0 / scale).floor() as i64 + 1;
    let i_end = 2 - i_start;
    let c: Vec<f64> = (i_start..i_end).map(|i| f(scale * (i as f64 - r))).collect();
    let s: f64 = c.iter().sum();
    c.into_iter().map(|v| v / s).collect()
}

fn linear_coeffs_antialias(r: f64, scale: f64) -> Vec<f64> {
    let scale = scale.min(1.0);
    let start = (-1.0 / scale).floor() as i64 + 1;
    let footprint = 2 - 2 * start;
    let c: Vec<f64> =
        (start..start + footprint).map(|i| (1.0 - ((i as f64 - r) * scale).abs()).clamp(0.0, 1.0)).collect();
    let s: f64 = c.iter().sum();
    c.into_iter().map(|v| v / s).collect()
}

fn nearest_coeffs(r: f64, mode: NearestMode) -> Vec<f64> {
    let b = |c: bool| if c { 1.0 } else { 0.0 };
    if r.fract() == 0.0 {
        return vec![0.0, 1.0];
    }
    match mode {
        NearestMode::RoundPreferFloor => vec![b(r <= 0.5), b(r > 0.5)],
        NearestMode::RoundPreferCeil => vec![b(r < 0.5), b(r >= 0.5)],
        NearestMode::Floor => vec![1.0, 0.0],
        NearestMode::Ceil => vec![0.0, 1.0],
    }
}

/// For one axis: per output coordinate, the (input index, weight) taps, or `None` where
/// the value is the extrapolation value.
#[allow(clippy::type_complexity)]
fn axis_taps(a: &ResizeAttrs, axis: usize, in_len: usize, out_len: usize) -> Vec<Option<Vec<(usize, f64)>>> {
    let scale = a.scales[axis];
    let inw = in_len as f64;
    let outw = scale * inw;
    let roi = if a.roi.is_empty() { (0.0, 1.0) } else { (a.roi[axis], a.roi[axis + a.scales.len()]) };
    let mut res = Vec::with_capacity(out_len);
    for y in 0..out_len {
        let yf = y as f64;
        let x = match a.coord {
            CoordMode::AlignCorners => {
                if outw == 1.0 {
                    0.0
                } else {
                    yf * (inw - 1.0) / (outw - 1.0)
                }
            }
            CoordMode::Asymmetric => yf / scale,
            CoordMode::TfCropAndResize => {
                let x = if outw == 1.0 {
                    (roi.1 - roi.0) * (inw - 1.0) / 2.0
                } else {
                    yf * (roi.1 - roi.0) * (inw - 1.0) / (outw - 1.0)
                };
                x + roi.0 * (inw - 1.0)
            }
            CoordMode::PytorchHalfPixel => {
                if outw == 1.0 {
                    -0.5
                } else {
                    (yf + 0.5) / scale - 0.5
                }
            }
            CoordMode::HalfPixel => (yf + 0.5) / scale - 0.5,
            CoordMode::HalfPixelSymmetric => {
                let adjustment = out_len as f64 / outw;
                let center = inw / 2.0;
                center * (1.0 - adjustment) + (yf + 0.5) / scale - 0.5
            }
        };
        if a.coord == CoordMode::TfCropAndResize && (x < 0.0 || x > inw - 1.0) {
            res.push(None);
            continue;
        }
        let p0 = x.floor();
        let ratio = if x == p0 { 1.0 } else { x - p0 };
        let mut coeffs = match a.mode {
            ResizeMode::Nearest => nearest_coeffs(ratio, a.nearest),
            ResizeMode::Linear if a.antialias => linear_coeffs_antialias(ratio, scale),
            ResizeMode::Linear => vec![1.0 - ratio, ratio],
            ResizeMode::Cubic if a.antialias => cubic_coeffs_antialias(ratio, scale, a.cubic_a),
            ResizeMode::Cubic => cubic_coeffs(ratio, a.cubic_a),
        };
        let n = coeffs.len() as i64;
        // Window of n taps (n is even): ties go to the smaller indices.
        let start = p0 as i64 + if x == p0 { -(n / 2) } else { -(n / 2) + 1 };
        let idxs: Vec<i64> = (0..n).map(|k| start + k).collect();
        if a.exclude_outside {
            for (c, &i) in coeffs.iter_mut().zip(&idxs) {
                if i < 0 || i >= in_len as i64 {
                    *c = 0.0;
                }
            }
            let s: f64 = coeffs.iter().sum();
            let s = if s == 0.0 { 1.0 } else { s };
            coeffs.iter_mut().for_each(|c| *c /= s);
        }
        let hi = in_len.saturating_sub(1) as i64;
        res.push(Some(idxs.iter().zip(&coeffs).map(|(&i, &c)| (i.clamp(0, hi) as usize, c)).collect()));
    }
    res
}

fn resize(x: &Tensor, a: &ResizeAttrs, cx: &EvalCtx) -> Result<Tensor, String> {
    let out_shape = cx.dims(&a.sizes)?;
    let r = x.rank();
    if out_shape.len() != r || a.scales.len() != r {
        return Err("resize sizes do not match the rank".into());
    }
    let mut shape = x.shape().to_vec();
    let mut data = x.to_f64_vec();
    for axis in 0..r {
        let (in_len, out_len) = (shape[axis], out_shape[axis]);
        let roi_identity = a.roi.is_empty() || (a.roi[axis] == 0.0 && a.roi[axis + r] == 1.0);
        if (a.scales[axis] - 1.0).abs() < 1e-9 && in_len == out_len && roi_identity {
            continue;
        }
        if in_len == 0 && out_len > 0 {
            return Err(format!("cannot resize an empty axis {axis}"));
        }
        let taps = axis_taps(a, axis, in_len, out_len);
        let (outer, _, inner) = split_at_axis(&shape, axis);
        let mut next = vec![0.0; outer * out_len * inner];
        for o in 0..outer {
            for (y, t) in taps.iter().enumerate() {
                let dst = (o * out_len + y) * inner;
                match t {
                    None => next[dst..dst + inner].iter_mut().for_each(|v| *v = a.extrapolation_value),
                    Some(t) => {
                        for &(i, w) in t {
                            if w == 0.0 {
                                continue;
                            }
                            let src = (o * in_len + i) * inner;
                            for k in 0..inner {
                                next[dst + k] += w * data[src + k];
                            }
                        }
                    }
                }
            }
        }
        data = next;
        shape[axis] = out_len;
    }
    let dt = x.dtype();
    if dt.is_int() {
        let (lo, hi) = int_range(dt);
        data.iter_mut().for_each(|v| *v = v.round_ties_even().clamp(lo, hi));
    }
    Tensor::from_f64s(dt, shape, &data).map_err(|e| e.to_string())
}

fn int_range(dt: DType) -> (f64, f64) {
    match dt {
        DType::I8 => (i8::MIN as f64, i8::MAX as f64),
        DType::I16 => (i16::MIN as f64, i16::MAX as f64),
        DType::I32 => (i32::MIN as f64, i32::MAX as f64),
        DType::U8 => (0.0, u8::MAX as f64),
        DType::U16 => (0.0, u16::MAX as f64),
        DType::U32 => (0.0, u32::MAX as f64),
        DType::U64 => (0.0, u64::MAX as f64),
        _ => (i64::MIN as f64, i64::MAX as f64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pad_reflect_matches_numpy() {
        // numpy.pad([0,1,2], 4, mode='reflect') = [0,1,2,1,0,1,2,1,0,1,2]
        let got: Vec<usize> = (0..11).map(|o| pad_coord(o, 4, 3, PadMode::Reflect)).collect();
        assert_eq!(got, vec![0, 1, 2, 1, 0, 1, 2, 1, 0, 1, 2]);
        // numpy.pad([0,1,2,3], (2,0), mode='reflect') = [2,1,0,1,2,3]
        let got: Vec<usize> = (0..6).map(|o| pad_coord(o, 2, 4, PadMode::Reflect)).collect();
        assert_eq!(got, vec![2, 1, 0, 1, 2, 3]);
        // wrap: [1,2,0,1,2,0,1]
        let got: Vec<usize> = (0..7).map(|o| pad_coord(o, 2, 3, PadMode::Wrap)).collect();
        assert_eq!(got, vec![1, 2, 0, 1, 2, 0, 1]);
        let got: Vec<usize> = (0..5).map(|o| pad_coord(o, 1, 3, PadMode::Edge)).collect();
        assert_eq!(got, vec![0, 0, 1, 2, 2]);
    }

    #[test]
    fn separable_map_transposes_like_naive_loops() {
        // A 2x3x4 tensor transposed by perm [2, 0, 1].
        let sh = [2usize, 3, 4];
        let st = strides(&sh);
        let perm = [2usize, 0, 1];
        let out: Vec<usize> = perm.iter().map(|&p| sh[p]).collect();
        let pst: Vec<usize> = perm.iter().map(|&p| st[p]).collect();
        let m = separable_map(&out, &identity_axes(&out), &pst).unwrap();
        let mut k = 0;
        for c in 0..4 {
            for a in 0..2 {
                for b in 0..3 {
                    assert_eq!(m[k], a * 12 + b * 4 + c);
                    k += 1;
                }
            }
        }
    }

    #[test]
    fn linear_taps_half_pixel_upsample() {
        let a = ResizeAttrs {
            mode: ResizeMode::Linear,
            coord: CoordMode::HalfPixel,
            nearest: NearestMode::RoundPreferFloor,
            cubic_a: -0.75,
            exclude_outside: false,
            antialias: false,
            extrapolation_value: 0.0,
            sizes: vec![],
            scales: vec![2.0],
            roi: vec![],
        };
        let t = axis_taps(&a, 0, 2, 4);
        // x = -0.25, 0.25, 0.75, 1.25 → clamped edge taps.
        let val = |taps: &Option<Vec<(usize, f64)>>| {
            taps.as_ref().unwrap().iter().map(|&(i, w)| w * [10.0, 20.0][i]).sum::<f64>()
        };
        let got: Vec<f64> = t.iter().map(val).collect();
        assert_eq!(got, vec![10.0, 12.5, 17.5, 20.0]);
    }
}
