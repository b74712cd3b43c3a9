//! Control-flow kernels: `if`, `loop` and `scan` run their subgraphs with [`crate::run`].
//!
//! Slicing and stacking along an axis are done on the little-endian bytes of the
//! tensors, so they work for every dtype without per-type code.

use crate::EvalCtx;
use std::collections::HashMap;
use tilec_ir::op::ControlOp;
use tilec_ir::{DType, Graph, Tensor, TensorType};

pub fn eval(op: &ControlOp, args: &[&Tensor], _cx: &EvalCtx) -> Result<Vec<Tensor>, String> {
    match op {
        ControlOp::If {
            then_branch,
            else_branch,
            ..
        } => {
            let cond = args.first().ok_or("expected a condition input")?;
            let branch = if single_bool(cond, "the condition")? {
                then_branch
            } else {
                else_branch
            };
            let what = if std::ptr::eq(branch, then_branch) {
                "then branch"
            } else {
                "else branch"
            };
            run_sub(
                what,
                branch,
                args[1..].iter().map(|t| (*t).clone()).collect(),
            )
        }
        ControlOp::Loop {
            body,
            has_max_trip,
            has_cond,
            n_carried,
            ..
        } => run_loop(body, *has_max_trip, *has_cond, *n_carried, args),
        ControlOp::Scan { .. } => run_scan(op, args),
    }
}

fn run_sub(what: &str, g: &Graph, inputs: Vec<Tensor>) -> Result<Vec<Tensor>, String> {
    crate::run(g, inputs).map_err(|e| format!("{what}: {e}"))
}

fn single_bool(t: &Tensor, what: &str) -> Result<bool, String> {
    match t.as_slice::<bool>() {
        Some([b]) => Ok(*b),
        _ => Err(format!(
            "{what} must be a single bool, got {} of shape {:?}",
            t.dtype(),
            t.shape()
        )),
    }
}

fn check_outputs(what: &str, outs: &[Tensor], want: usize) -> Result<(), String> {
    if outs.len() != want {
        return Err(format!(
            "{what} yielded {} outputs, expected {want}",
            outs.len()
        ));
    }
    Ok(())
}

fn run_loop(
    body: &Graph,
    has_max_trip: bool,
    has_cond: bool,
    n: usize,
    args: &[&Tensor],
) -> Result<Vec<Tensor>, String> {
    let nfix = has_max_trip as usize + has_cond as usize;
    if args.len() < nfix + n {
        return Err(format!(
            "expected at least {} inputs, got {}",
            nfix + n,
            args.len()
        ));
    }
    let max_trip = if has_max_trip {
        match args[0].as_slice::<i64>() {
            Some([m]) => Some(*m),
            _ => {
                return Err(format!(
                    "the trip count must be a single i64, got {} of shape {:?}",
                    args[0].dtype(),
                    args[0].shape()
                ))
            }
        }
    } else {
        None
    };
    let mut cond = if has_cond {
        single_bool(args[nfix - 1], "the condition")?
    } else {
        true
    };
    if max_trip.is_none() && !has_cond {
        return Err("a loop with neither a trip count nor a condition never ends".into());
    }
    let mut carried: Vec<Tensor> = args[nfix..nfix + n].iter().map(|t| (*t).clone()).collect();
    let caps = &args[nfix + n..];
    let nscan = body
        .outputs()
        .len()
        .checked_sub(1 + n)
        .ok_or("the body yields too few outputs")?;
    let mut scans: Vec<Vec<Tensor>> = vec![Vec::new(); nscan];
    let mut i: i64 = 0;
    while max_trip.map_or(true, |m| i < m) && (!has_cond || cond) {
        let mut inputs = Vec::with_capacity(body.inputs().len());
        inputs.push(Tensor::scalar(i));
        inputs.push(Tensor::scalar(cond));
        inputs.append(&mut carried);
        inputs.extend(caps.iter().map(|t| (*t).clone()));
        let what = format!("body (iteration {i})");
        let mut outs = run_sub(&what, body, inputs)?;
        check_outputs(&what, &outs, 1 + n + nscan)?;
        let scan_outs = outs.split_off(1 + n);
        carried = outs.split_off(1);
        cond = single_bool(&outs[0], "the body's condition output")?;
        for (k, t) in scan_outs.into_iter().enumerate() {
            scans[k].push(t);
        }
        i += 1;
    }
    let mut result = carried;
    for (k, parts) in scans.into_iter().enumerate() {
        let ty = &body.value(body.outputs()[1 + n + k]).ty;
        result.push(stack(&parts, 0, ty, body).map_err(|e| format!("scan output {k}: {e}"))?);
    }
    Ok(result)
}

fn run_scan(op: &ControlOp, args: &[&Tensor]) -> Result<Vec<Tensor>, String> {
    let ControlOp::Scan {
        body,
        n_state,
        n_scan_inputs,
        batched,
        ..
    } = op
    else {
        return Err("not a scan".into());
    };
    let nsv = n_state + n_scan_inputs;
    if args.len() < nsv {
        return Err(format!(
            "expected at least {nsv} inputs, got {}",
            args.len()
        ));
    }
    if !batched {
        let vals: Vec<Tensor> = args[..nsv].iter().map(|t| (*t).clone()).collect();
        return scan_one(op, body, vals, &args[nsv..]);
    }
    let nb = *args[0]
        .shape()
        .first()
        .ok_or("input 0 needs a leading batch dimension")?;
    if nb == 0 {
        return Err("an empty batch is not supported".into());
    }
    let mut per_batch: Vec<Vec<Tensor>> = Vec::with_capacity(nb);
    for b in 0..nb {
        let vals = args[..nsv]
            .iter()
            .map(|t| take(t, 0, b))
            .collect::<Result<Vec<_>, _>>()?;
        per_batch.push(
            scan_one(op, body, vals, &args[nsv..])
                .map_err(|e| format!("batch element {b}: {e}"))?,
        );
    }
    let nout = per_batch[0].len();
    let mut outs = Vec::with_capacity(nout);
    for k in 0..nout {
        let parts: Vec<Tensor> = per_batch.iter().map(|o| o[k].clone()).collect();
        let ty = parts[0].tensor_type();
        outs.push(stack(&parts, 0, &ty, body)?);
    }
    Ok(outs)
}

/// One (unbatched) scan: `vals` holds the initial states then the sequences.
fn scan_one(
    op: &ControlOp,
    body: &Graph,
    vals: Vec<Tensor>,
    caps: &[&Tensor],
) -> Result<Vec<Tensor>, String> {
    let ControlOp::Scan {
        n_state,
        input_axes,
        input_reverse,
        output_axes,
        output_reverse,
        ..
    } = op
    else {
        return Err("not a scan".into());
    };
    let ns = *n_state;
    let mut states = vals;
    let seqs = states.split_off(ns);
    let mut len: Option<usize> = None;
    for (j, s) in seqs.iter().enumerate() {
        let ax = *input_axes.get(j).ok_or("missing scan input axis")?;
        let l = *s.shape().get(ax).ok_or_else(|| {
            format!(
                "scan input {j}: axis {ax} out of range for shape {:?}",
                s.shape()
            )
        })?;
        match len {
            Some(x) if x != l => {
                return Err(format!(
                    "scan input {j} has sequence length {l}, scan input 0 has {x}"
                ))
            }
            _ => len = Some(l),
        }
    }
    let len = len.ok_or("a scan needs at least one scan input")?;
    let nso = body
        .outputs()
        .len()
        .checked_sub(ns)
        .ok_or("the body yields too few outputs")?;
    let mut parts: Vec<Vec<Tensor>> = vec![Vec::with_capacity(len); nso];
    for t in 0..len {
        let mut inputs = Vec::with_capacity(body.inputs().len());
        inputs.append(&mut states);
        for (j, s) in seqs.iter().enumerate() {
            let idx = if input_reverse.get(j).copied().unwrap_or(false) {
                len - 1 - t
            } else {
                t
            };
            inputs.push(take(s, input_axes[j], idx)?);
        }
        inputs.extend(caps.iter().map(|c| (*c).clone()));
        let what = format!("body (iteration {t})");
        let mut outs = run_sub(&what, body, inputs)?;
        check_outputs(&what, &outs, ns + nso)?;
        let scan_outs = outs.split_off(ns);
        states = outs;
        for (k, x) in scan_outs.into_iter().enumerate() {
            parts[k].push(x);
        }
    }
    let mut result = states;
    for (k, mut p) in parts.into_iter().enumerate() {
        if output_reverse.get(k).copied().unwrap_or(false) {
            p.reverse();
        }
        let ax = *output_axes.get(k).ok_or("missing scan output axis")?;
        let ty = &body.value(body.outputs()[ns + k]).ty;
        result.push(stack(&p, ax, ty, body).map_err(|e| format!("scan output {k}: {e}"))?);
    }
    Ok(result)
}

/// The slice `index` of `t` along `axis`, with that axis removed.
pub fn take(t: &Tensor, axis: usize, index: usize) -> Result<Tensor, String> {
    let shape = t.shape();
    if axis >= shape.len() || index >= shape[axis] {
        return Err(format!(
            "cannot take index {index} along axis {axis} of shape {:?}",
            shape
        ));
    }
    let sz = t.dtype().size_bytes();
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product::<usize>() * sz;
    let bytes = t.to_le_bytes();
    let mut out = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        let start = (o * shape[axis] + index) * inner;
        out.extend_from_slice(&bytes[start..start + inner]);
    }
    let mut s = shape.to_vec();
    s.remove(axis);
    Tensor::from_le_bytes(t.dtype(), s, &out).map_err(|e| e.to_string())
}

/// Stacks equally shaped tensors along a new axis `axis`. With no parts, the element
/// shape comes from `ty` (a subgraph output type), which must then be fully known.
pub fn stack(parts: &[Tensor], axis: usize, ty: &TensorType, g: &Graph) -> Result<Tensor, String> {
    let (dtype, elem): (DType, Vec<usize>) = match parts.first() {
        Some(p) => (p.dtype(), p.shape().to_vec()),
        None => {
            let dims = ty
                .shape
                .iter()
                .map(|&d| g.syms.eval(d, &HashMap::new()))
                .collect::<Option<Vec<usize>>>()
                .ok_or("no iterations ran and the element shape is not static")?;
            (ty.dtype, dims)
        }
    };
    if axis > elem.len() {
        return Err(format!(
            "axis {axis} out of range for stacking shape {elem:?}"
        ));
    }
    for (i, p) in parts.iter().enumerate() {
        if p.dtype() != dtype || p.shape() != elem.as_slice() {
            return Err(format!(
                "iteration {i} yields {} {:?}, iteration 0 yields {dtype} {elem:?} (values cannot change shape across iterations)",
                p.dtype(),
                p.shape()
            ));
        }
    }
    let sz = dtype.size_bytes();
    let outer: usize = elem[..axis].iter().product();
    let inner: usize = elem[axis..].iter().product::<usize>() * sz;
    let bytes: Vec<Vec<u8>> = parts.iter().map(|p| p.to_le_bytes()).collect();
    let mut out = Vec::with_capacity(outer * inner * parts.len());
    for o in 0..outer {
        for b in &bytes {
            out.extend_from_slice(&b[o * inner..(o + 1) * inner]);
        }
    }
    let mut shape = elem;
    shape.insert(axis, parts.len());
    Tensor::from_le_bytes(dtype, shape, &out).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_and_stack_are_inverse_on_every_axis() {
        let vals: Vec<i64> = (0..24).collect();
        let t = Tensor::from_vec(vec![2, 3, 4], vals.clone()).unwrap();
        for axis in 0..3 {
            let n = t.shape()[axis];
            let parts: Vec<Tensor> = (0..n).map(|i| take(&t, axis, i).unwrap()).collect();
            // Naive check of one slice element against the flat index.
            let s = &parts[n - 1];
            let sv = s.to_i64_vec();
            let mut k = 0;
            for a in 0..2 {
                for b in 0..3 {
                    for c in 0..4 {
                        let idx = [a, b, c];
                        if idx[axis] != n - 1 {
                            continue;
                        }
                        assert_eq!(sv[k], (a * 12 + b * 4 + c) as i64, "axis {axis}");
                        k += 1;
                    }
                }
            }
            let ty = parts[0].tensor_type();
            let back = stack(&parts, axis, &ty, &Graph::new("g")).unwrap();
            assert_eq!(back, t, "axis {axis}");
        }
    }

    #[test]
    fn stack_rejects_shape_changes_and_handles_zero_parts() {
        let a = Tensor::from_vec(vec![2], vec![1.0f32, 2.0]).unwrap();
        let b = Tensor::from_vec(vec![3], vec![1.0f32, 2.0, 3.0]).unwrap();
        let ty = a.tensor_type();
        let g = Graph::new("g");
        let e = stack(&[a, b], 0, &ty, &g).unwrap_err();
        assert!(e.contains("cannot change shape"), "{e}");
        let z = stack(&[], 0, &ty, &g).unwrap();
        assert_eq!(z.shape(), &[0, 2]);
    }
}
