//! Indexing kernels: gathers, scatters, data-dependent selections, ROI pooling.
//!
//! Most ops here only move elements: they compute, with all index checks, a list of
//! source flat indices (or destination/source pairs) and then copy elements of any
//! dtype generically ([`pick`], [`scatter`]).

use super::util::split_at_axis;
use crate::EvalCtx;
use std::cmp::Ordering;
use tilec_ir::op::{IndexOp, RoiPoolMode, ScatterReduction};
use tilec_ir::{dispatch, strides, DType, Element, Tensor, TensorData};

pub fn eval(op: &IndexOp, args: &[&Tensor], _cx: &EvalCtx) -> Result<Vec<Tensor>, String> {
    let arg = |i: usize| args.get(i).copied().ok_or_else(|| format!("missing input {i}"));
    match op {
        IndexOp::Gather { axis } => Ok(vec![gather(arg(0)?, arg(1)?, *axis)?]),
        IndexOp::GatherElements { axis } => Ok(vec![gather_elements(arg(0)?, arg(1)?, *axis)?]),
        IndexOp::GatherND { batch_dims } => Ok(vec![gather_nd(arg(0)?, arg(1)?, *batch_dims)?]),
        IndexOp::ScatterElements { axis, reduction } => {
            Ok(vec![scatter_elements(arg(0)?, arg(1)?, arg(2)?, *axis, *reduction)?])
        }
        IndexOp::ScatterND { reduction } => Ok(vec![scatter_nd(arg(0)?, arg(1)?, arg(2)?, *reduction)?]),
        IndexOp::OneHot { axis, depth } => Ok(vec![one_hot(arg(0)?, arg(1)?, *axis, *depth)?]),
        IndexOp::NonZero { .. } => Ok(vec![nonzero(arg(0)?)?]),
        IndexOp::Compress { axis, .. } => Ok(vec![compress(arg(0)?, arg(1)?, *axis)?]),
        IndexOp::ReverseSequence { batch_axis, time_axis } => {
            Ok(vec![reverse_sequence(arg(0)?, arg(1)?, *batch_axis, *time_axis)?])
        }
        IndexOp::Unique { axis, sorted, .. } => unique(arg(0)?, *axis, *sorted),
        IndexOp::TensorScatter { axis, circular } => {
            Ok(vec![tensor_scatter(arg(0)?, arg(1)?, arg(2)?, *axis, *circular)?])
        }
        IndexOp::NonMaxSuppression {
            center_point_box,
            max_output_boxes_per_class,
            iou_threshold,
            score_threshold,
            ..
        } => Ok(vec![nms(
            arg(0)?,
            arg(1)?,
            *center_point_box,
            *max_output_boxes_per_class,
            *iou_threshold,
            *score_threshold,
        )?]),
        IndexOp::RoiAlign { mode, output_height, output_width, sampling_ratio, spatial_scale, half_pixel } => {
            let p = RoiAlignParams {
                mode: *mode,
                oh: *output_height,
                ow: *output_width,
                sampling_ratio: *sampling_ratio,
                spatial_scale: *spatial_scale as f64,
                half_pixel: *half_pixel,
            };
            Ok(vec![roi_align(arg(0)?, arg(1)?, arg(2)?, &p)?])
        }
        IndexOp::MaxRoiPool { pooled_h, pooled_w, spatial_scale } => {
            Ok(vec![max_roi_pool(arg(0)?, arg(1)?, *pooled_h, *pooled_w, *spatial_scale as f64)?])
        }
    }
}

// ---- shared helpers ----

fn terr(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Index values of an integer tensor (u64 values beyond i64 are rejected).
fn index_values(t: &Tensor, what: &str) -> Result<Vec<i64>, String> {
    if !t.dtype().is_int() {
        return Err(format!("{what} must be integers, got {}", t.dtype()));
    }
    if let Some(v) = t.as_slice::<u64>() {
        return v.iter().map(|&x| i64::try_from(x).map_err(|_| format!("{what}: index {x} out of range"))).collect();
    }
    Ok(t.to_i64_vec())
}

/// Normalizes one index against a dimension of size `n` (negative counts from the end).
fn norm_index(i: i64, n: usize, what: &str) -> Result<usize, String> {
    let j = if i < 0 { i + n as i64 } else { i };
    if j < 0 || j >= n as i64 {
        return Err(format!("{what}: index {i} out of range for a dimension of size {n}"));
    }
    Ok(j as usize)
}

/// Elements of `src` at flat positions `idx`, as a tensor of `shape`.
fn pick(src: &Tensor, idx: &[usize], shape: Vec<usize>) -> Result<Tensor, String> {
    fn go<T: Element>(v: &[T], idx: &[usize]) -> Result<TensorData, String> {
        let mut out = Vec::with_capacity(idx.len());
        for &i in idx {
            out.push(*v.get(i).ok_or_else(|| format!("internal: element {i} of {}", v.len()))?);
        }
        Ok(T::wrap(out))
    }
    let data = dispatch!(src.data(), v => go(v, idx))?;
    Tensor::new(shape, data).map_err(terr)
}

/// Integer view used by integer reductions: u64 compares as unsigned.
fn int_cmp(a: i64, b: i64, unsigned: bool) -> Ordering {
    if unsigned {
        (a as u64).cmp(&(b as u64))
    } else {
        a.cmp(&b)
    }
}

fn fmax(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

fn fmin(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.min(b)
    }
}

/// A copy of `data` with `updates[src]` combined into position `dst` for each
/// `(dst, src)` pair, in order. Float reductions round to the dtype after each step (as
/// an elementwise op in that dtype would); integer ones wrap.
fn scatter(data: &Tensor, updates: &Tensor, pairs: &[(usize, usize)], red: ScatterReduction) -> Result<Tensor, String> {
    if data.dtype() != updates.dtype() {
        return Err(format!("updates dtype {} differs from data dtype {}", updates.dtype(), data.dtype()));
    }
    fn go<T: Element>(
        out: &mut [T],
        upd: &TensorData,
        pairs: &[(usize, usize)],
        red: ScatterReduction,
    ) -> Result<(), String> {
        let upd = T::slice(upd).ok_or("internal: dtype mismatch")?;
        let float = T::DTYPE.is_float();
        let unsigned = T::DTYPE == DType::U64;
        for &(d, s) in pairs {
            let u = *upd.get(s).ok_or("internal: update index out of range")?;
            let o = out.get_mut(d).ok_or("internal: destination index out of range")?;
            *o = match red {
                ScatterReduction::None => u,
                _ if float => {
                    let (a, b) = (o.to_f64(), u.to_f64());
                    T::from_f64(match red {
                        ScatterReduction::Add => a + b,
                        ScatterReduction::Mul => a * b,
                        ScatterReduction::Max => fmax(a, b),
                        _ => fmin(a, b),
                    })
                }
                _ if T::DTYPE == DType::Bool => {
                    let (a, b) = (o.to_i64() != 0, u.to_i64() != 0);
                    T::from_i64(match red {
                        ScatterReduction::Add | ScatterReduction::Max => a || b,
                        _ => a && b,
                    } as i64)
                }
                _ => {
                    let (a, b) = (o.to_i64(), u.to_i64());
                    T::from_i64(match red {
                        ScatterReduction::Add => a.wrapping_add(b),
                        ScatterReduction::Mul => a.wrapping_mul(b),
                        ScatterReduction::Max => {
                            if int_cmp(a, b, unsigned) == Ordering::Less {
                                b
                            } else {
                                a
                            }
                        }
                        _ => {
                            if int_cmp(a, b, unsigned) == Ordering::Greater {
                                b
                            } else {
                                a
                            }
                        }
                    })
                }
            };
        }
        Ok(())
    }
    let mut out = data.clone();
    dispatch!(out.data_mut(), v => go(v, updates.data(), pairs, red))?;
    Ok(out)
}

/// Calls `f(flat, coords)` for every position of `shape` in row-major order.
fn for_each_index(shape: &[usize], mut f: impl FnMut(usize, &[usize]) -> Result<(), String>) -> Result<(), String> {
    let n: usize = shape.iter().product();
    let mut c = vec![0usize; shape.len()];
    for flat in 0..n {
        f(flat, &c)?;
        for d in (0..shape.len()).rev() {
            c[d] += 1;
            if c[d] < shape[d] {
                break;
            }
            c[d] = 0;
        }
    }
    Ok(())
}

fn check_axis(axis: usize, rank: usize) -> Result<(), String> {
    if axis >= rank {
        return Err(format!("axis {axis} out of range for rank {rank}"));
    }
    Ok(())
}

// ---- gathers ----

fn gather(data: &Tensor, indices: &Tensor, axis: usize) -> Result<Tensor, String> {
    check_axis(axis, data.rank())?;
    let (outer, len, inner) = split_at_axis(data.shape(), axis);
    let idx: Vec<usize> = index_values(indices, "indices")?
        .into_iter()
        .map(|i| norm_index(i, len, "indices"))
        .collect::<Result<_, _>>()?;
    let mut map = Vec::with_capacity(outer * idx.len() * inner);
    for o in 0..outer {
        for &j in &idx {
            let base = (o * len + j) * inner;
            map.extend(base..base + inner);
        }
    }
    let mut shape = data.shape()[..axis].to_vec();
    shape.extend_from_slice(indices.shape());
    shape.extend_from_slice(&data.shape()[axis + 1..]);
    pick(data, &map, shape)
}

/// For `GatherElements`/`ScatterElements`: the data flat index of every element of
/// `indices` (row-major), with the axis coordinate replaced by the index value.
fn element_positions(data_shape: &[usize], indices: &Tensor, axis: usize) -> Result<Vec<usize>, String> {
    let r = data_shape.len();
    check_axis(axis, r)?;
    if indices.rank() != r {
        return Err(format!("indices must have data's rank {r}, have rank {}", indices.rank()));
    }
    for k in 0..r {
        if k != axis && indices.shape()[k] > data_shape[k] {
            return Err(format!(
                "indices shape {:?} exceeds data shape {:?} in dimension {k}",
                indices.shape(),
                data_shape
            ));
        }
    }
    let st = strides(data_shape);
    let vals = index_values(indices, "indices")?;
    let mut out = Vec::with_capacity(vals.len());
    for_each_index(indices.shape(), |flat, c| {
        let j = norm_index(vals[flat], data_shape[axis], "indices")?;
        let mut p = 0;
        for k in 0..r {
            p += if k == axis { j } else { c[k] } * st[k];
        }
        out.push(p);
        Ok(())
    })?;
    Ok(out)
}

fn gather_elements(data: &Tensor, indices: &Tensor, axis: usize) -> Result<Tensor, String> {
    let pos = element_positions(data.shape(), indices, axis)?;
    pick(data, &pos, indices.shape().to_vec())
}

/// For GatherND/ScatterND: splits `indices` into tuples of its last dimension `k` and
/// returns, per tuple, the flat offset (in units of slices of `data_shape[b+k..]`)
/// within its batch, checking every index.
fn nd_tuples(data_shape: &[usize], indices: &Tensor, b: usize) -> Result<(usize, Vec<usize>), String> {
    let q = indices.rank();
    if q == 0 {
        return Err("indices must have rank >= 1".into());
    }
    let k = indices.shape()[q - 1];
    if b >= q || b + k > data_shape.len() {
        return Err(format!(
            "batch_dims {b} with index depth {k} does not fit data shape {data_shape:?} and indices shape {:?}",
            indices.shape()
        ));
    }
    for x in 0..b {
        if data_shape[x] != indices.shape()[x] {
            return Err(format!("batch dimension {x} differs: data {data_shape:?} vs indices {:?}", indices.shape()));
        }
    }
    let vals = index_values(indices, "indices")?;
    let addressed = &data_shape[b..b + k];
    let st = strides(addressed);
    let tuples: usize = indices.shape()[..q - 1].iter().product();
    let mut offs = Vec::with_capacity(tuples);
    for t in 0..tuples {
        let mut p = 0;
        for j in 0..k {
            p += norm_index(vals[t * k + j], addressed[j], "indices")? * st[j];
        }
        offs.push(p);
    }
    let k_size: usize = addressed.iter().product();
    Ok((k_size, offs))
}

fn gather_nd(data: &Tensor, indices: &Tensor, b: usize) -> Result<Tensor, String> {
    let (k_size, offs) = nd_tuples(data.shape(), indices, b)?;
    let q = indices.rank();
    let k = indices.shape()[q - 1];
    let batch: usize = data.shape()[..b].iter().product();
    let slice: usize = data.shape()[b + k..].iter().product();
    let per_batch = if batch == 0 { 0 } else { offs.len() / batch };
    let mut map = Vec::with_capacity(offs.len() * slice);
    for (t, &o) in offs.iter().enumerate() {
        let bi = if per_batch == 0 { 0 } else { t / per_batch };
        let base = (bi * k_size + o) * slice;
        map.extend(base..base + slice);
    }
    let mut shape = indices.shape()[..q - 1].to_vec();
    shape.extend_from_slice(&data.shape()[b + k..]);
    pick(data, &map, shape)
}

// ---- scatters ----

fn scatter_elements(
    data: &Tensor,
    indices: &Tensor,
    updates: &Tensor,
    axis: usize,
    red: ScatterReduction,
) -> Result<Tensor, String> {
    if updates.shape() != indices.shape() {
        return Err(format!("updates shape {:?} must equal indices shape {:?}", updates.shape(), indices.shape()));
    }
    let pos = element_positions(data.shape(), indices, axis)?;
    let pairs: Vec<(usize, usize)> = pos.into_iter().enumerate().map(|(s, d)| (d, s)).collect();
    scatter(data, updates, &pairs, red)
}

fn scatter_nd(data: &Tensor, indices: &Tensor, updates: &Tensor, red: ScatterReduction) -> Result<Tensor, String> {
    let (_, offs) = nd_tuples(data.shape(), indices, 0)?;
    let q = indices.rank();
    let k = indices.shape()[q - 1];
    let mut want = indices.shape()[..q - 1].to_vec();
    want.extend_from_slice(&data.shape()[k..]);
    if updates.shape() != want.as_slice() {
        return Err(format!("updates shape {:?} must be {want:?}", updates.shape()));
    }
    let slice: usize = data.shape()[k..].iter().product();
    let mut pairs = Vec::with_capacity(offs.len() * slice);
    for (t, &o) in offs.iter().enumerate() {
        for e in 0..slice {
            pairs.push((o * slice + e, t * slice + e));
        }
    }
    scatter(data, updates, &pairs, red)
}

fn tensor_scatter(
    past: &Tensor,
    update: &Tensor,
    write: &Tensor,
    axis: usize,
    circular: bool,
) -> Result<Tensor, String> {
    let (ps, us) = (past.shape(), update.shape());
    if axis == 0 || axis >= ps.len() || us.len() != ps.len() {
        return Err(format!("bad shapes {ps:?} / {us:?} for axis {axis}"));
    }
    for k in 0..ps.len() {
        if (k == axis && us[k] > ps[k]) || (k != axis && us[k] != ps[k]) {
            return Err(format!("update shape {us:?} does not fit past_cache shape {ps:?} along axis {axis}"));
        }
    }
    let w = index_values(write, "write_indices")?;
    if w.len() != ps[0] {
        return Err(format!("write_indices has {} entries, batch is {}", w.len(), ps[0]));
    }
    let prefix: usize = ps[..axis].iter().product();
    let per_batch = prefix / ps[0].max(1);
    let inner: usize = ps[axis + 1..].iter().product();
    let (max_len, len) = (ps[axis], us[axis]);
    let mut pairs = Vec::with_capacity(update.numel());
    for p in 0..prefix {
        let b = p / per_batch.max(1);
        for s in 0..len {
            let mut pos = w[b].saturating_add(s as i64);
            if circular && max_len > 0 {
                pos = pos.rem_euclid(max_len as i64);
            }
            if pos < 0 || pos >= max_len as i64 {
                return Err(format!(
                    "write_indices[{b}] = {} plus {len} updates exceeds the cache length {max_len}",
                    w[b]
                ));
            }
            let dst = (p * max_len + pos as usize) * inner;
            let src = (p * len + s) * inner;
            for e in 0..inner {
                pairs.push((dst + e, src + e));
            }
        }
    }
    scatter(past, update, &pairs, ScatterReduction::None)
}

// ---- selections ----

fn one_hot(indices: &Tensor, values: &Tensor, axis: usize, depth: usize) -> Result<Tensor, String> {
    if values.numel() != 2 {
        return Err(format!("values must have 2 elements [off, on], has {}", values.numel()));
    }
    if axis > indices.rank() {
        return Err(format!("axis {axis} out of range for output rank {}", indices.rank() + 1));
    }
    let idx = indices.to_i64_vec();
    let outer: usize = indices.shape()[..axis].iter().product();
    let inner: usize = indices.shape()[axis..].iter().product();
    let d = i64::try_from(depth).map_err(|_| format!("depth {depth} too large"))?;
    let total = outer
        .checked_mul(depth)
        .and_then(|x| x.checked_mul(inner))
        .ok_or_else(|| format!("one-hot output of depth {depth} is too large"))?;
    let mut map = Vec::with_capacity(total);
    for o in 0..outer {
        for k in 0..d {
            for i in 0..inner {
                let mut v = idx[o * inner + i];
                if v < 0 {
                    v += d;
                }
                map.push(usize::from(v == k));
            }
        }
    }
    let mut shape = indices.shape().to_vec();
    shape.insert(axis, depth);
    pick(values, &map, shape)
}

/// Whether each element is non-zero (NaN counts as non-zero).
fn truthy(t: &Tensor) -> Vec<bool> {
    if t.dtype().is_float() {
        t.to_f64_vec().into_iter().map(|x| x != 0.0).collect()
    } else {
        t.to_i64_vec().into_iter().map(|x| x != 0).collect()
    }
}

fn nonzero(x: &Tensor) -> Result<Tensor, String> {
    let nz = truthy(x);
    let r = x.rank();
    let mut coords: Vec<Vec<i64>> = vec![Vec::new(); r];
    for_each_index(x.shape(), |flat, c| {
        if nz[flat] {
            for d in 0..r {
                coords[d].push(c[d] as i64);
            }
        }
        Ok(())
    })?;
    let n = nz.iter().filter(|&&b| b).count();
    let flat: Vec<i64> = coords.into_iter().flatten().collect();
    Tensor::from_vec(vec![r, if r == 0 { 0 } else { n }], flat).map_err(terr)
}

fn compress(data: &Tensor, cond: &Tensor, axis: Option<usize>) -> Result<Tensor, String> {
    let c = cond.as_slice::<bool>().ok_or_else(|| format!("condition must be bool, got {}", cond.dtype()))?;
    let len = match axis {
        None => data.numel(),
        Some(a) => {
            check_axis(a, data.rank())?;
            data.shape()[a]
        }
    };
    if let Some(p) = c.iter().skip(len).position(|&b| b) {
        return Err(format!("condition is true at {} beyond the compressed length {len}", p + len));
    }
    let keep: Vec<usize> = (0..len.min(c.len())).filter(|&i| c[i]).collect();
    match axis {
        None => pick(data, &keep, vec![keep.len()]),
        Some(a) => {
            let (outer, _, inner) = split_at_axis(data.shape(), a);
            let mut map = Vec::with_capacity(outer * keep.len() * inner);
            for o in 0..outer {
                for &j in &keep {
                    let base = (o * len + j) * inner;
                    map.extend(base..base + inner);
                }
            }
            let mut shape = data.shape().to_vec();
            shape[a] = keep.len();
            pick(data, &map, shape)
        }
    }
}

fn reverse_sequence(data: &Tensor, lens: &Tensor, batch_axis: usize, time_axis: usize) -> Result<Tensor, String> {
    let s = data.shape();
    if s.len() < 2 || batch_axis > 1 || time_axis > 1 || batch_axis == time_axis {
        return Err(format!("bad axes {batch_axis}/{time_axis} for shape {s:?}"));
    }
    let l = index_values(lens, "sequence_lens")?;
    if l.len() != s[batch_axis] {
        return Err(format!("sequence_lens has {} entries, batch is {}", l.len(), s[batch_axis]));
    }
    let t_len = s[time_axis];
    if let Some(&bad) = l.iter().find(|&&x| x < 0 || x > t_len as i64) {
        return Err(format!("sequence length {bad} out of range [0, {t_len}]"));
    }
    let st = strides(s);
    let mut map = Vec::with_capacity(data.numel());
    for_each_index(s, |flat, c| {
        let (b, t) = (c[batch_axis], c[time_axis]);
        let n = l[b] as usize;
        map.push(if t < n { flat - t * st[time_axis] + (n - 1 - t) * st[time_axis] } else { flat });
        Ok(())
    })?;
    pick(data, &map, s.to_vec())
}

/// Sort key of one element: exact for every dtype; NaNs are equal and greatest.
#[derive(Copy, Clone, Debug)]
enum Key {
    I(i128),
    F(f64),
}

fn key_cmp(a: &Key, b: &Key) -> Ordering {
    match (a, b) {
        (Key::I(x), Key::I(y)) => x.cmp(y),
        (Key::F(x), Key::F(y)) => match (x.is_nan(), y.is_nan()) {
            (true, true) => Ordering::Equal,
            (true, false) => Ordering::Greater,
            (false, true) => Ordering::Less,
            _ => x.partial_cmp(y).unwrap_or(Ordering::Equal),
        },
        // Never mixed within one tensor.
        _ => Ordering::Equal,
    }
}

fn keys(t: &Tensor) -> Vec<Key> {
    if t.dtype().is_float() {
        t.to_f64_vec().into_iter().map(Key::F).collect()
    } else if let Some(v) = t.as_slice::<u64>() {
        v.iter().map(|&x| Key::I(x as i128)).collect()
    } else {
        t.to_i64_vec().into_iter().map(|x| Key::I(x as i128)).collect()
    }
}

fn unique(x: &Tensor, axis: Option<usize>, sorted: bool) -> Result<Vec<Tensor>, String> {
    // Items: elements (flattened) or slices along `axis`, as lists of element positions.
    let (outer, n, inner) = match axis {
        None => (1, x.numel(), 1),
        Some(a) => {
            check_axis(a, x.rank())?;
            split_at_axis(x.shape(), a)
        }
    };
    let item_positions = |i: usize| -> Vec<usize> {
        let mut p = Vec::with_capacity(outer * inner);
        for o in 0..outer {
            let base = (o * n + i) * inner;
            p.extend(base..base + inner);
        }
        p
    };
    let k = keys(x);
    let item_keys: Vec<Vec<Key>> = (0..n).map(|i| item_positions(i).iter().map(|&p| k[p]).collect()).collect();
    let cmp = |a: usize, b: usize| -> Ordering {
        for (p, q) in item_keys[a].iter().zip(&item_keys[b]) {
            let c = key_cmp(p, q);
            if c != Ordering::Equal {
                return c;
            }
        }
        Ordering::Equal
    };
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| cmp(a, b)); // stable: equal items keep input order
                                       // Groups in sorted order: (first occurrence, members).
    let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
    for &i in &order {
        match groups.last_mut() {
            Some((first, members)) if cmp(*first, i) == Ordering::Equal => members.push(i),
            _ => groups.push((i, vec![i])),
        }
    }
    if !sorted {
        groups.sort_by_key(|g| g.0);
    }
    let u = groups.len();
    let mut inverse = vec![0i64; n];
    for (gi, (_, members)) in groups.iter().enumerate() {
        for &m in members {
            inverse[m] = gi as i64;
        }
    }
    let firsts: Vec<usize> = groups.iter().map(|g| g.0).collect();
    let y = match axis {
        None => pick(x, &firsts, vec![u])?,
        Some(a) => {
            let mut map = Vec::with_capacity(outer * u * inner);
            for o in 0..outer {
                for &f in &firsts {
                    let base = (o * n + f) * inner;
                    map.extend(base..base + inner);
                }
            }
            let mut shape = x.shape().to_vec();
            shape[a] = u;
            pick(x, &map, shape)?
        }
    };
    let indices: Vec<i64> = firsts.iter().map(|&f| f as i64).collect();
    let counts: Vec<i64> = groups.iter().map(|g| g.1.len() as i64).collect();
    Ok(vec![
        y,
        Tensor::from_vec(vec![u], indices).map_err(terr)?,
        Tensor::from_vec(vec![n], inverse).map_err(terr)?,
        Tensor::from_vec(vec![u], counts).map_err(terr)?,
    ])
}

// ---- non-max suppression ----

/// Whether two boxes overlap by more than `iou_threshold` (computed in f32 like the
/// ONNX reference).
fn suppress(b1: &[f32], b2: &[f32], center: bool, iou_threshold: f32) -> bool {
    let (x1min, x1max, y1min, y1max, x2min, x2max, y2min, y2max);
    if !center {
        let mm = |a: f32, b: f32| if a >= b { (b, a) } else { (a, b) };
        (x1min, x1max) = mm(b1[1], b1[3]);
        (x2min, x2max) = mm(b2[1], b2[3]);
        (y1min, y1max) = mm(b1[0], b1[2]);
        (y2min, y2max) = mm(b2[0], b2[2]);
    } else {
        (x1min, x1max) = (b1[0] - b1[2] / 2.0, b1[0] + b1[2] / 2.0);
        (x2min, x2max) = (b2[0] - b2[2] / 2.0, b2[0] + b2[2] / 2.0);
        (y1min, y1max) = (b1[1] - b1[3] / 2.0, b1[1] + b1[3] / 2.0);
        (y2min, y2max) = (b2[1] - b2[3] / 2.0, b2[1] + b2[3] / 2.0);
    }
    let (ixmin, ixmax) = (x1min.max(x2min), x1max.min(x2max));
    if ixmax <= ixmin {
        return false;
    }
    let (iymin, iymax) = (y1min.max(y2min), y1max.min(y2max));
    if iymax <= iymin {
        return false;
    }
    let inter = (ixmax - ixmin) * (iymax - iymin);
    if inter <= 0.0 {
        return false;
    }
    let a1 = (x1max - x1min) * (y1max - y1min);
    let a2 = (x2max - x2min) * (y2max - y2min);
    let union = a1 + a2 - inter;
    if a1 <= 0.0 || a2 <= 0.0 || union <= 0.0 {
        return false;
    }
    inter / union > iou_threshold
}

fn nms(
    boxes: &Tensor,
    scores: &Tensor,
    center: bool,
    max_per_class: usize,
    iou_threshold: f32,
    score_threshold: Option<f32>,
) -> Result<Tensor, String> {
    let (bs, ss) = (boxes.shape(), scores.shape());
    if bs.len() != 3 || ss.len() != 3 || bs[2] != 4 || bs[0] != ss[0] || bs[1] != ss[2] {
        return Err(format!("boxes {bs:?} and scores {ss:?} must be [batch, boxes, 4] and [batch, classes, boxes]"));
    }
    let (nb, nc, n) = (ss[0], ss[1], ss[2]);
    let bx: Vec<f32> = boxes.to_f64_vec().into_iter().map(|v| v as f32).collect();
    let sc: Vec<f32> = scores.to_f64_vec().into_iter().map(|v| v as f32).collect();
    let mut out: Vec<i64> = Vec::new();
    for b in 0..nb {
        let bbox = |i: usize| &bx[(b * n + i) * 4..(b * n + i) * 4 + 4];
        for c in 0..nc {
            let cs = &sc[(b * nc + c) * n..(b * nc + c + 1) * n];
            let mut cand: Vec<usize> = (0..n).filter(|&i| score_threshold.map(|t| cs[i] > t).unwrap_or(true)).collect();
            // Highest score first; ties by lower box index.
            cand.sort_by(|&i, &j| cs[j].partial_cmp(&cs[i]).unwrap_or(Ordering::Equal).then(i.cmp(&j)));
            let mut selected: Vec<usize> = Vec::new();
            for i in cand {
                if selected.len() >= max_per_class {
                    break;
                }
                if selected.iter().all(|&s| !suppress(bbox(i), bbox(s), center, iou_threshold)) {
                    selected.push(i);
                    out.extend_from_slice(&[b as i64, c as i64, i as i64]);
                }
            }
        }
    }
    let rows = out.len() / 3;
    Tensor::from_vec(vec![rows, 3], out).map_err(terr)
}

// ---- ROI pooling ----

struct RoiAlignParams {
    mode: RoiPoolMode,
    oh: usize,
    ow: usize,
    sampling_ratio: usize,
    spatial_scale: f64,
    half_pixel: bool,
}

/// Bilinear sample positions and weights; zero weights outside the feature map.
fn bilinear(y: f64, x: f64, h: usize, w: usize) -> [(usize, f64); 4] {
    if y < -1.0 || y > h as f64 || x < -1.0 || x > w as f64 || h == 0 || w == 0 {
        return [(0, 0.0); 4];
    }
    let (mut y, mut x) = (y.max(0.0), x.max(0.0));
    let (mut yl, mut xl) = (y as usize, x as usize);
    let (yh, xh);
    if yl >= h - 1 {
        yl = h - 1;
        yh = yl;
        y = yl as f64;
    } else {
        yh = yl + 1;
    }
    if xl >= w - 1 {
        xl = w - 1;
        xh = xl;
        x = xl as f64;
    } else {
        xh = xl + 1;
    }
    let (ly, lx) = (y - yl as f64, x - xl as f64);
    let (hy, hx) = (1.0 - ly, 1.0 - lx);
    [(yl * w + xl, hy * hx), (yl * w + xh, hy * lx), (yh * w + xl, ly * hx), (yh * w + xh, ly * lx)]
}

fn roi_align(x: &Tensor, rois: &Tensor, batch_indices: &Tensor, p: &RoiAlignParams) -> Result<Tensor, String> {
    let xs = x.shape();
    if xs.len() != 4 || rois.rank() != 2 || rois.shape()[1] != 4 {
        return Err(format!("X {xs:?} and rois {:?} must be [N, C, H, W] and [R, 4]", rois.shape()));
    }
    let (nn, c, h, w) = (xs[0], xs[1], xs[2], xs[3]);
    let r = rois.shape()[0];
    let bi = index_values(batch_indices, "batch_indices")?;
    if bi.len() != r {
        return Err(format!("batch_indices has {} entries, rois has {r}", bi.len()));
    }
    let xv = x.to_f64_vec();
    let rv = rois.to_f64_vec();
    let (oh, ow) = (p.oh, p.ow);
    let mut out = vec![0.0f64; r * c * oh * ow];
    for n in 0..r {
        let b = usize::try_from(bi[n])
            .ok()
            .filter(|&b| b < nn)
            .ok_or_else(|| format!("batch_indices[{n}] = {} out of range for batch {nn}", bi[n]))?;
        let off = if p.half_pixel { 0.5 } else { 0.0 };
        let ro = &rv[n * 4..n * 4 + 4];
        let (sw, sh) = (ro[0] * p.spatial_scale - off, ro[1] * p.spatial_scale - off);
        let (ew, eh) = (ro[2] * p.spatial_scale - off, ro[3] * p.spatial_scale - off);
        let (mut rw, mut rh) = (ew - sw, eh - sh);
        if !p.half_pixel {
            rw = rw.max(1.0);
            rh = rh.max(1.0);
        }
        let (bh, bw) = (rh / oh as f64, rw / ow as f64);
        let gh = if p.sampling_ratio > 0 { p.sampling_ratio } else { (rh / oh as f64).ceil().max(0.0) as usize };
        let gw = if p.sampling_ratio > 0 { p.sampling_ratio } else { (rw / ow as f64).ceil().max(0.0) as usize };
        let count = (gh * gw).max(1) as f64;
        // Sample points shared by all channels: per output cell, gh*gw samples.
        let total = oh
            .checked_mul(ow)
            .and_then(|x| x.checked_mul(gh))
            .and_then(|x| x.checked_mul(gw))
            .ok_or_else(|| format!("roi {n}: too many sampling points ({gh} x {gw} per bin)"))?;
        let mut pre = Vec::with_capacity(total);
        for ph in 0..oh {
            for pw in 0..ow {
                for iy in 0..gh {
                    let yy = sh + ph as f64 * bh + (iy as f64 + 0.5) * bh / gh as f64;
                    for ix in 0..gw {
                        let xx = sw + pw as f64 * bw + (ix as f64 + 0.5) * bw / gw as f64;
                        pre.push(bilinear(yy, xx, h, w));
                    }
                }
            }
        }
        let per = gh * gw;
        for ch in 0..c {
            let plane = &xv[(b * c + ch) * h * w..(b * c + ch + 1) * h * w];
            for cell in 0..oh * ow {
                let samples = &pre[cell * per..(cell + 1) * per];
                let v = match p.mode {
                    RoiPoolMode::Avg => {
                        samples
                            .iter()
                            .map(|s| s.iter().map(|&(i, wt)| wt * plane.get(i).copied().unwrap_or(0.0)).sum::<f64>())
                            .sum::<f64>()
                            / count
                    }
                    RoiPoolMode::Max => samples
                        .iter()
                        .map(|s| {
                            s.iter()
                                .map(|&(i, wt)| wt * plane.get(i).copied().unwrap_or(0.0))
                                .fold(f64::NEG_INFINITY, f64::max)
                        })
                        .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))
                        .unwrap_or(0.0),
                };
                out[(n * c + ch) * oh * ow + cell] = v;
            }
        }
    }
    Tensor::from_f64s(x.dtype(), vec![r, c, oh, ow], &out).map_err(terr)
}

fn max_roi_pool(x: &Tensor, rois: &Tensor, ph_n: usize, pw_n: usize, scale: f64) -> Result<Tensor, String> {
    let xs = x.shape();
    if xs.len() != 4 || rois.rank() != 2 || rois.shape()[1] != 5 {
        return Err(format!("X {xs:?} and rois {:?} must be [N, C, H, W] and [R, 5]", rois.shape()));
    }
    let (nn, c, h, w) = (xs[0], xs[1], xs[2], xs[3]);
    let r = rois.shape()[0];
    let xv = x.to_f64_vec();
    let rv = rois.to_f64_vec();
    let mut out = vec![0.0f64; r * c * ph_n * pw_n];
    for n in 0..r {
        let ro = &rv[n * 5..n * 5 + 5];
        let b = ro[0];
        if !(b >= 0.0 && (b as usize) < nn) {
            return Err(format!("roi {n}: batch index {b} out of range for batch {nn}"));
        }
        let b = b as usize;
        let (sw, sh) = ((ro[1] * scale).round() as i64, (ro[2] * scale).round() as i64);
        let (ew, eh) = ((ro[3] * scale).round() as i64, (ro[4] * scale).round() as i64);
        let rh = eh.saturating_sub(sh).saturating_add(1).max(1) as f64;
        let rw = ew.saturating_sub(sw).saturating_add(1).max(1) as f64;
        let (bh, bw) = (rh / ph_n as f64, rw / pw_n as f64);
        for ch in 0..c {
            let plane = &xv[(b * c + ch) * h * w..(b * c + ch + 1) * h * w];
            for ph in 0..ph_n {
                let hs = ((ph as f64 * bh).floor() as i64).saturating_add(sh).clamp(0, h as i64) as usize;
                let he = (((ph + 1) as f64 * bh).ceil() as i64).saturating_add(sh).clamp(0, h as i64) as usize;
                for pw in 0..pw_n {
                    let ws = ((pw as f64 * bw).floor() as i64).saturating_add(sw).clamp(0, w as i64) as usize;
                    let we = (((pw + 1) as f64 * bw).ceil() as i64).saturating_add(sw).clamp(0, w as i64) as usize;
                    let mut m = if he <= hs || we <= ws { 0.0 } else { f64::NEG_INFINITY };
                    for yy in hs..he {
                        for xx in ws..we {
                            m = m.max(plane[yy * w + xx]);
                        }
                    }
                    out[((n * c + ch) * ph_n + ph) * pw_n + pw] = m;
                }
            }
        }
    }
    Tensor::from_f64s(x.dtype(), vec![r, c, ph_n, pw_n], &out).map_err(terr)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t_f32(shape: &[usize], v: &[f32]) -> Tensor {
        Tensor::from_vec(shape.to_vec(), v.to_vec()).unwrap()
    }
    fn t_i64(shape: &[usize], v: &[i64]) -> Tensor {
        Tensor::from_vec(shape.to_vec(), v.to_vec()).unwrap()
    }

    #[test]
    fn gather_matches_naive_loop() {
        let data: Vec<f32> = (0..60).map(|x| x as f32).collect();
        let d = t_f32(&[3, 4, 5], &data);
        let i = Tensor::from_vec(vec![2, 2], vec![3i32, -1, 0, 2]).unwrap();
        let o = gather(&d, &i, 1).unwrap();
        assert_eq!(o.shape(), &[3, 2, 2, 5]);
        let ov = o.to_f64_vec();
        let idx = [3usize, 3, 0, 2];
        let mut k = 0;
        for a in 0..3 {
            for j in idx {
                for c in 0..5 {
                    assert_eq!(ov[k], (a * 20 + j * 5 + c) as f64);
                    k += 1;
                }
            }
        }
        assert!(gather(&d, &t_i64(&[1], &[4]), 1).is_err());
        assert!(gather(&d, &t_i64(&[1], &[-5]), 1).is_err());
    }

    #[test]
    fn gather_elements_and_scatter_elements_are_inverse() {
        let d = t_f32(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
        let i = t_i64(&[2, 2], &[2, 0, -1, 1]);
        let g = gather_elements(&d, &i, 1).unwrap();
        assert_eq!(g.to_f64_vec(), vec![3., 1., 6., 5.]);
        let z = Tensor::zeros(DType::F32, vec![2, 3]);
        let s = scatter_elements(&z, &i, &g, 1, ScatterReduction::None).unwrap();
        assert_eq!(s.to_f64_vec(), vec![1., 0., 3., 0., 5., 6.]);
        let dup = t_i64(&[1, 2], &[1, 1]);
        let u = t_f32(&[1, 2], &[2., 3.]);
        let one = t_f32(&[1, 3], &[1., 1., 1.]);
        assert_eq!(scatter_elements(&one, &dup, &u, 1, ScatterReduction::Add).unwrap().to_f64_vec(), vec![1., 6., 1.]);
        assert_eq!(scatter_elements(&one, &dup, &u, 1, ScatterReduction::Mul).unwrap().to_f64_vec(), vec![1., 6., 1.]);
        assert_eq!(scatter_elements(&one, &dup, &u, 1, ScatterReduction::Min).unwrap().to_f64_vec(), vec![1., 1., 1.]);
        assert_eq!(scatter_elements(&one, &dup, &u, 1, ScatterReduction::None).unwrap().to_f64_vec(), vec![1., 3., 1.]);
        assert!(scatter_elements(&one, &t_i64(&[1, 2], &[3, 0]), &u, 1, ScatterReduction::None).is_err());
    }

    #[test]
    fn integer_scatter_is_exact() {
        let big = i64::MAX - 1;
        let d = t_i64(&[2], &[big, 0]);
        let i = t_i64(&[1, 1], &[0]);
        let u = t_i64(&[1], &[1]);
        let o = scatter_nd(&d, &i, &u, ScatterReduction::Add).unwrap();
        assert_eq!(o.to_i64_vec(), vec![i64::MAX, 0]);
        let du = Tensor::from_vec(vec![1], vec![u64::MAX]).unwrap();
        let uu = Tensor::from_vec(vec![1], vec![1u64]).unwrap();
        let o = scatter_nd(&du, &i, &uu, ScatterReduction::Max).unwrap();
        assert_eq!(o.as_slice::<u64>().unwrap(), &[u64::MAX]);
    }

    #[test]
    fn gather_nd_batch_dims() {
        let d = Tensor::from_vec(vec![2, 2, 2], (0..8).collect::<Vec<i32>>()).unwrap();
        let i = t_i64(&[2, 1], &[1, 0]);
        let o = gather_nd(&d, &i, 1).unwrap();
        assert_eq!(o.shape(), &[2, 2]);
        assert_eq!(o.to_i64_vec(), vec![2, 3, 4, 5]);
        let i = t_i64(&[2, 1, 2], &[0, 1, 1, 0]);
        let o = gather_nd(&d, &i, 0).unwrap();
        assert_eq!(o.shape(), &[2, 1, 2]);
        assert_eq!(o.to_i64_vec(), vec![2, 3, 4, 5]);
        assert!(gather_nd(&d, &t_i64(&[1, 2], &[0, 2]), 0).is_err());
    }

    #[test]
    fn unique_sorted_and_unsorted() {
        let x = t_f32(&[6], &[2., 1., 1., 3., 4., 3.]);
        let o = unique(&x, None, true).unwrap();
        assert_eq!(o[0].to_f64_vec(), vec![1., 2., 3., 4.]);
        assert_eq!(o[1].to_i64_vec(), vec![1, 0, 3, 4]);
        assert_eq!(o[2].to_i64_vec(), vec![1, 0, 0, 2, 3, 2]);
        assert_eq!(o[3].to_i64_vec(), vec![2, 1, 2, 1]);
        let o = unique(&x, None, false).unwrap();
        assert_eq!(o[0].to_f64_vec(), vec![2., 1., 3., 4.]);
        assert_eq!(o[1].to_i64_vec(), vec![0, 1, 3, 4]);
        assert_eq!(o[2].to_i64_vec(), vec![0, 1, 1, 2, 3, 2]);
        let m = t_f32(&[3, 2], &[1., 0., 0., 1., 1., 0.]);
        let o = unique(&m, Some(0), true).unwrap();
        assert_eq!(o[0].shape(), &[2, 2]);
        assert_eq!(o[0].to_f64_vec(), vec![0., 1., 1., 0.]);
        assert_eq!(o[2].to_i64_vec(), vec![1, 0, 1]);
    }

    #[test]
    fn nonzero_compress_reverse() {
        let x = Tensor::from_vec(vec![2, 2], vec![true, false, true, true]).unwrap();
        let o = nonzero(&x).unwrap();
        assert_eq!(o.shape(), &[2, 3]);
        assert_eq!(o.to_i64_vec(), vec![0, 1, 1, 0, 0, 1]);
        let d = t_f32(&[3, 2], &[1., 2., 3., 4., 5., 6.]);
        let c = Tensor::from_vec(vec![2], vec![false, true]).unwrap();
        assert_eq!(compress(&d, &c, Some(0)).unwrap().to_f64_vec(), vec![3., 4.]);
        assert_eq!(compress(&d, &c, None).unwrap().to_f64_vec(), vec![2.]);
        let c4 = Tensor::from_vec(vec![4], vec![false, false, false, true]).unwrap();
        assert!(compress(&d, &c4, Some(0)).is_err());
        let x = t_f32(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
        let r = reverse_sequence(&x, &t_i64(&[2], &[2, 3]), 0, 1).unwrap();
        assert_eq!(r.to_f64_vec(), vec![2., 1., 3., 6., 5., 4.]);
        assert!(reverse_sequence(&x, &t_i64(&[2], &[4, 0]), 0, 1).is_err());
    }

    #[test]
    fn one_hot_negative_and_out_of_range() {
        let i = t_i64(&[3], &[-1, 1, 5]);
        let v = t_f32(&[2], &[0., 7.]);
        let o = one_hot(&i, &v, 1, 3).unwrap();
        assert_eq!(o.to_f64_vec(), vec![0., 0., 7., 0., 7., 0., 0., 0., 0.]);
        let o = one_hot(&i, &v, 0, 3).unwrap();
        assert_eq!(o.shape(), &[3, 3]);
        assert_eq!(o.to_f64_vec(), vec![0., 0., 0., 0., 7., 0., 7., 0., 0.]);
    }

    #[test]
    fn tensor_scatter_linear_and_circular() {
        let past = Tensor::zeros(DType::F32, vec![1, 3, 1]);
        let upd = t_f32(&[1, 2, 1], &[1., 2.]);
        let w = t_i64(&[1], &[2]);
        assert!(tensor_scatter(&past, &upd, &w, 1, false).is_err());
        let o = tensor_scatter(&past, &upd, &w, 1, true).unwrap();
        assert_eq!(o.to_f64_vec(), vec![2., 0., 1.]);
    }

    #[test]
    fn nms_suppresses_overlaps() {
        let boxes = t_f32(&[1, 3, 4], &[0., 0., 1., 1., 0., 0.1, 1., 1.1, 0., 10., 1., 11.]);
        let scores = t_f32(&[1, 1, 3], &[0.9, 0.95, 0.5]);
        let o = nms(&boxes, &scores, false, 10, 0.5, None).unwrap();
        assert_eq!(o.to_i64_vec(), vec![0, 0, 1, 0, 0, 2]);
        let o = nms(&boxes, &scores, false, 10, 0.5, Some(0.6)).unwrap();
        assert_eq!(o.to_i64_vec(), vec![0, 0, 1]);
    }
}
