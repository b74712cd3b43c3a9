//! ONNX mappings for matmuls, convolutions, pools, einsum and friends.

use super::{ImportError, MapFn, NodeCx};
use tilec_ir::op::{BinaryOp, LayoutOp, LinalgOp, Padding, PoolKind, Window};
use tilec_ir::{dispatch, DType, Dim, Element, Op, Tensor, TensorType, ValueId};

pub(super) fn lookup(op_type: &str) -> Option<MapFn> {
    Some(match op_type {
        "MatMul" => map_matmul,
        "Gemm" => map_gemm,
        "MatMulInteger" => map_matmul_integer,
        "QLinearMatMul" => map_qlinear_matmul,
        "Conv" => map_conv,
        "ConvInteger" => map_conv_integer,
        "QLinearConv" => map_qlinear_conv,
        "ConvTranspose" => map_conv_transpose,
        "DeformConv" => map_deform_conv,
        "MaxPool" | "AveragePool" | "LpPool" => map_pool,
        "GlobalAveragePool" | "GlobalMaxPool" | "GlobalLpPool" => map_global_pool,
        "Einsum" => map_einsum,
        "Det" => map_det,
        "MaxUnpool" => map_max_unpool,
        "Col2Im" => map_col2im,
        _ => return None,
    })
}

fn lin(op: LinalgOp) -> Op {
    Op::Linalg(op)
}

// ---- helpers ----

fn to_usize(cx: &NodeCx, v: &[i64], what: &str) -> Result<Vec<usize>, ImportError> {
    v.iter()
        .map(|&x| {
            if x >= 0 {
                Ok(x as usize)
            } else {
                Err(cx.invalid(format!("{what} must be non-negative, got {v:?}")))
            }
        })
        .collect()
}

fn to_positive(cx: &NodeCx, v: &[i64], what: &str) -> Result<Vec<usize>, ImportError> {
    v.iter()
        .map(|&x| {
            if x > 0 {
                Ok(x as usize)
            } else {
                Err(cx.invalid(format!("{what} must be positive, got {v:?}")))
            }
        })
        .collect()
}

/// `attr` as positive ints of length `n`, or `default` repeated.
fn ints_n(
    cx: &NodeCx,
    name: &str,
    n: usize,
    default: usize,
    positive: bool,
) -> Result<Vec<usize>, ImportError> {
    match cx.attr_ints(name)? {
        None => Ok(vec![default; n]),
        Some(v) => {
            if v.len() != n {
                return Err(cx.invalid(format!(
                    "{name} {v:?} must have {n} entries (one per spatial axis)"
                )));
            }
            if positive {
                to_positive(cx, &v, name)
            } else {
                to_usize(cx, &v, name)
            }
        }
    }
}

/// Spatial rank of input 0 (`[N, C, spatial...]`).
fn spatial_rank(cx: &NodeCx, i: usize) -> Result<usize, ImportError> {
    let r = cx.input_ty(i)?.rank();
    if r < 3 {
        return Err(cx.invalid(format!(
            "input {i} must be [N, C, spatial...] (rank >= 3), got rank {r}"
        )));
    }
    Ok(r - 2)
}

/// Kernel shape from the attribute, else from the weights' fixed spatial dims.
fn kernel_shape(
    cx: &NodeCx,
    n: usize,
    weights: Option<&TensorType>,
) -> Result<Vec<usize>, ImportError> {
    if let Some(k) = cx.attr_ints("kernel_shape")? {
        if k.len() != n {
            return Err(cx.invalid(format!("kernel_shape {k:?} must have {n} entries")));
        }
        return to_positive(cx, &k, "kernel_shape");
    }
    let w = weights.ok_or_else(|| cx.invalid("kernel_shape is required"))?;
    if w.rank() != n + 2 {
        return Err(cx.invalid(format!(
            "weights must have rank {}, got {}",
            n + 2,
            w.rank()
        )));
    }
    w.shape[2..]
        .iter()
        .map(|d| {
            d.fixed().ok_or_else(|| {
                cx.unsupported("weights with symbolic spatial dims and no kernel_shape")
            })
        })
        .collect()
}

fn auto_pad(cx: &NodeCx) -> Result<String, ImportError> {
    let s = cx.attr_s("auto_pad")?.unwrap_or_default();
    match s.as_str() {
        "" | "NOTSET" | "VALID" | "SAME_UPPER" | "SAME_LOWER" => Ok(s),
        _ => Err(cx.invalid(format!(
            "auto_pad '{s}' is not one of NOTSET, VALID, SAME_UPPER, SAME_LOWER"
        ))),
    }
}

/// The window attributes common to Conv and the pools.
fn window(cx: &NodeCx, n: usize, kernel: Vec<usize>) -> Result<Window, ImportError> {
    let strides = ints_n(cx, "strides", n, 1, true)?;
    let dilations = ints_n(cx, "dilations", n, 1, true)?;
    let pads = match auto_pad(cx)?.as_str() {
        "SAME_UPPER" => Padding::SameUpper,
        "SAME_LOWER" => Padding::SameLower,
        "VALID" => Padding::Explicit(vec![0; 2 * n]),
        _ => match cx.attr_ints("pads")? {
            None => Padding::Explicit(vec![0; 2 * n]),
            Some(p) => {
                if p.len() != 2 * n {
                    return Err(cx.invalid(format!("pads {p:?} must have {} entries", 2 * n)));
                }
                Padding::Explicit(to_usize(cx, &p, "pads")?)
            }
        },
    };
    Ok(Window {
        kernel,
        strides,
        dilations,
        pads,
    })
}

fn group(cx: &NodeCx) -> Result<usize, ImportError> {
    let g = cx.attr_i("group", 1)?;
    if g < 1 {
        return Err(cx.invalid(format!("group must be positive, got {g}")));
    }
    Ok(g as usize)
}

/// A zero-filled 1-D value of `n` elements: a constant when small, else a `fill` op, so a
/// declared (untrusted) channel count never allocates at import.
fn zeros_vec(cx: &mut NodeCx, dt: DType, n: Dim, what: &str) -> Result<ValueId, ImportError> {
    let n = n
        .fixed()
        .ok_or_else(|| cx.unsupported(format!("absent {what} with a symbolic channel count")))?;
    if n <= 4096 {
        return Ok(cx.constant(Tensor::zeros(dt, vec![n])));
    }
    let fill = tilec_ir::op::SourceOp::Fill { shape: vec![Dim::Fixed(n)], value: Tensor::zeros(dt, vec![]) };
    cx.emit1(Op::Source(fill), &[])
}

/// Input `i`, or a scalar zero of `dt` when absent.
fn zero_point(cx: &mut NodeCx, i: usize, dt: DType) -> ValueId {
    match cx.input(i) {
        Some(v) => v,
        None => cx.constant(Tensor::zeros(dt, vec![])),
    }
}

/// 2-D transpose, folded when the operand is a constant.
fn transpose2d(cx: &mut NodeCx, v: ValueId) -> Result<ValueId, ImportError> {
    if let Some(t) = cx.graph().const_value(v) {
        if let [r, c] = *t.shape() {
            fn tr<T: Element>(v: &[T], r: usize, c: usize) -> Vec<T> {
                let mut out = Vec::with_capacity(v.len());
                for j in 0..c {
                    for i in 0..r {
                        out.push(v[i * c + j]);
                    }
                }
                out
            }
            let data = dispatch!(t.data(), v => T2::wrap_vec(tr(v, r, c)));
            let t = Tensor::new(vec![c, r], data).map_err(|e| cx.invalid(e.to_string()))?;
            return Ok(cx.constant(t));
        }
    }
    cx.emit1(Op::Layout(LayoutOp::Transpose { perm: vec![1, 0] }), &[v])
}

/// `Element::wrap` through a free function so `dispatch!` arms type-check uniformly.
struct T2;
impl T2 {
    fn wrap_vec<T: Element>(v: Vec<T>) -> tilec_ir::TensorData {
        T::wrap(v)
    }
}

fn scalar_const(cx: &mut NodeCx, dt: DType, x: f64) -> Result<ValueId, ImportError> {
    let t = Tensor::from_f64s(dt, vec![], &[x]).map_err(|e| cx.invalid(e.to_string()))?;
    Ok(cx.constant(t))
}

// ---- matmuls ----

fn map_matmul(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let (a, b) = (cx.req_input(0)?, cx.req_input(1)?);
    Ok(vec![cx.emit1(lin(LinalgOp::MatMul), &[a, b])?])
}

fn map_gemm(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let (mut a, mut b) = (cx.req_input(0)?, cx.req_input(1)?);
    let dt = cx.ty(a).dtype;
    for (v, name) in [(a, "A"), (b, "B")] {
        if cx.ty(v).rank() != 2 {
            return Err(cx.invalid(format!("{name} must be 2-D, got rank {}", cx.ty(v).rank())));
        }
    }
    let alpha = cx.attr_f("alpha", 1.0)? as f64;
    let beta = cx.attr_f("beta", 1.0)? as f64;
    if cx.attr_i("transA", 0)? != 0 {
        a = transpose2d(cx, a)?;
    }
    if cx.attr_i("transB", 0)? != 0 {
        b = transpose2d(cx, b)?;
    }
    let mut y = cx.emit1(lin(LinalgOp::MatMul), &[a, b])?;
    if alpha != 1.0 {
        let k = scalar_const(cx, dt, alpha)?;
        y = cx.emit1(Op::Binary(BinaryOp::Mul), &[y, k])?;
    }
    if let Some(mut c) = cx.input(2) {
        if beta != 0.0 {
            if beta != 1.0 {
                let k = scalar_const(cx, dt, beta)?;
                c = cx.emit1(Op::Binary(BinaryOp::Mul), &[c, k])?;
            }
            y = cx.emit1(Op::Binary(BinaryOp::Add), &[y, c])?;
        }
    }
    Ok(vec![y])
}

fn map_matmul_integer(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let (a, b) = (cx.req_input(0)?, cx.req_input(1)?);
    let (da, db) = (cx.ty(a).dtype, cx.ty(b).dtype);
    let za = zero_point(cx, 2, da);
    let zb = zero_point(cx, 3, db);
    Ok(vec![
        cx.emit1(lin(LinalgOp::MatMulInteger), &[a, b, za, zb])?
    ])
}

fn map_qlinear_matmul(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let mut ins = Vec::new();
    for i in 0..8 {
        ins.push(cx.req_input(i)?);
    }
    Ok(vec![cx.emit1(lin(LinalgOp::QLinearMatMul), &ins)?])
}

// ---- convolutions ----

fn conv_window(cx: &NodeCx, x: usize, w: usize) -> Result<(Window, usize), ImportError> {
    let n = spatial_rank(cx, x)?;
    let wt = cx.input_ty(w)?;
    let k = kernel_shape(cx, n, Some(&wt))?;
    Ok((window(cx, n, k)?, group(cx)?))
}

fn map_conv(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let (x, w) = (cx.req_input(0)?, cx.req_input(1)?);
    let (window, group) = conv_window(cx, 0, 1)?;
    let dt = cx.ty(x).dtype;
    let b = match cx.input(2) {
        Some(b) => b,
        None => {
            let m = cx.ty(w).shape[0];
            zeros_vec(cx, dt, m, "bias")?
        }
    };
    Ok(vec![cx.emit1(
        lin(LinalgOp::Conv {
            window,
            group,
            channels_last: false,
        }),
        &[x, w, b],
    )?])
}

fn map_conv_integer(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let (x, w) = (cx.req_input(0)?, cx.req_input(1)?);
    let (window, group) = conv_window(cx, 0, 1)?;
    let (dx, dw) = (cx.ty(x).dtype, cx.ty(w).dtype);
    let zx = zero_point(cx, 2, dx);
    let zw = zero_point(cx, 3, dw);
    Ok(vec![cx.emit1(
        lin(LinalgOp::ConvInteger { window, group }),
        &[x, w, zx, zw],
    )?])
}

fn map_qlinear_conv(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let mut ins = Vec::new();
    for i in 0..8 {
        ins.push(cx.req_input(i)?);
    }
    let (window, group) = conv_window(cx, 0, 3)?;
    let b = match cx.input(8) {
        Some(b) => b,
        None => {
            let m = cx.ty(ins[3]).shape[0];
            zeros_vec(cx, DType::I32, m, "bias")?
        }
    };
    ins.push(b);
    Ok(vec![cx.emit1(
        lin(LinalgOp::QLinearConv { window, group }),
        &ins,
    )?])
}

fn map_conv_transpose(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let (x, w) = (cx.req_input(0)?, cx.req_input(1)?);
    let n = spatial_rank(cx, 0)?;
    let wt = cx.ty(w).clone();
    let kernel = kernel_shape(cx, n, Some(&wt))?;
    let strides = ints_n(cx, "strides", n, 1, true)?;
    let dilations = ints_n(cx, "dilations", n, 1, true)?;
    let output_padding = ints_n(cx, "output_padding", n, 0, false)?;
    let group = group(cx)?;
    let ap = auto_pad(cx)?;
    let xs = cx.ty(x).shape.clone();
    let fixed_in = |cx: &NodeCx, what: &str| -> Result<Vec<i64>, ImportError> {
        xs[2..]
            .iter()
            .map(|d| {
                d.fixed().map(|v| v as i64).ok_or_else(|| {
                    cx.unsupported(format!("{what} with symbolic spatial input dims"))
                })
            })
            .collect()
    };
    let natural = |i: usize, len: i64| -> i64 {
        strides[i] as i64 * (len - 1)
            + output_padding[i] as i64
            + ((kernel[i] as i64 - 1) * dilations[i] as i64 + 1)
    };
    let split = |total: i64, upper: bool| -> (i64, i64) {
        let half = total.div_euclid(2);
        if upper {
            (half, total - half)
        } else {
            (total - half, half)
        }
    };
    let output_shape = cx.attr_ints("output_shape")?;
    let mut pads = vec![0i64; 2 * n];
    if let Some(mut os) = output_shape {
        if os.len() == n + 2 {
            os.drain(..2);
        }
        if os.len() != n {
            return Err(cx.invalid(format!("output_shape {os:?} must have {n} entries")));
        }
        let ins = fixed_in(cx, "output_shape")?;
        for i in 0..n {
            let (pb, pe) = split(natural(i, ins[i]) - os[i], ap == "SAME_UPPER");
            pads[i] = pb;
            pads[n + i] = pe;
        }
    } else if ap == "SAME_UPPER" || ap == "SAME_LOWER" {
        let ins = fixed_in(cx, "auto_pad SAME")?;
        for i in 0..n {
            let total = natural(i, ins[i]) - ins[i] * strides[i] as i64;
            let (pb, pe) = split(total, ap == "SAME_UPPER");
            pads[i] = pb;
            pads[n + i] = pe;
        }
    } else if ap != "VALID" {
        if let Some(p) = cx.attr_ints("pads")? {
            if p.len() != 2 * n {
                return Err(cx.invalid(format!("pads {p:?} must have {} entries", 2 * n)));
            }
            to_usize(cx, &p, "pads")?;
            pads = p;
        }
    }
    let dt = cx.ty(x).dtype;
    let b = match cx.input(2) {
        Some(b) => b,
        None => {
            let m = match wt.shape.get(1).copied() {
                Some(Dim::Fixed(m)) => Dim::Fixed(m * group),
                _ => return Err(cx.unsupported("absent bias with symbolic weight dims")),
            };
            zeros_vec(cx, dt, m, "bias")?
        }
    };
    let op = LinalgOp::ConvTranspose {
        kernel,
        strides,
        dilations,
        pads,
        output_padding,
        group,
    };
    Ok(vec![cx.emit1(lin(op), &[x, w, b])?])
}

fn map_deform_conv(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let (x, w, off) = (cx.req_input(0)?, cx.req_input(1)?, cx.req_input(2)?);
    let (window, group) = conv_window(cx, 0, 1)?;
    if !matches!(window.pads, Padding::Explicit(_)) {
        return Err(cx.invalid("DeformConv has no auto_pad"));
    }
    let og = cx.attr_i("offset_group", 1)?;
    if og < 1 {
        return Err(cx.invalid(format!("offset_group must be positive, got {og}")));
    }
    let dt = cx.ty(x).dtype;
    let b = match cx.input(3) {
        Some(b) => b,
        None => {
            let m = cx.ty(w).shape[0];
            zeros_vec(cx, dt, m, "bias")?
        }
    };
    // An absent mask is a scalar one, broadcast by the kernel.
    let mask = match cx.input(4) {
        Some(m) => m,
        None => scalar_const(cx, dt, 1.0)?,
    };
    let op = LinalgOp::DeformConv {
        window,
        group,
        offset_group: og as usize,
    };
    Ok(vec![cx.emit1(lin(op), &[x, w, off, b, mask])?])
}

// ---- pools ----

fn map_pool(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let x = cx.req_input(0)?;
    let n = spatial_rank(cx, 0)?;
    let kernel = kernel_shape(cx, n, None)?;
    let window = window(cx, n, kernel)?;
    let ceil_mode = cx.attr_i("ceil_mode", 0)? != 0;
    let kind = match cx.op_type() {
        "MaxPool" => {
            let indices = cx.node.output.get(1).is_some_and(|s| !s.is_empty());
            let so = cx.attr_i("storage_order", 0)?;
            if so != 0 && so != 1 {
                return Err(cx.invalid(format!("storage_order must be 0 or 1, got {so}")));
            }
            PoolKind::Max {
                indices,
                column_major: so == 1,
            }
        }
        "AveragePool" => PoolKind::Avg {
            count_include_pad: cx.attr_i("count_include_pad", 0)? != 0,
        },
        _ => PoolKind::Lp { p: lp_p(cx)? },
    };
    let outs = cx.emit(
        lin(LinalgOp::Pool {
            kind,
            window,
            ceil_mode,
            channels_last: false,
        }),
        &[x],
    )?;
    Ok(outs)
}

/// LpPool's `p`: an int since opset 2, a float in opset 1.
fn lp_p(cx: &NodeCx) -> Result<i64, ImportError> {
    let p = match cx.attr("p") {
        None => 2,
        Some(a) if a.r#type == 1 => a.f as i64,
        Some(_) => cx.attr_i("p", 2)?,
    };
    if p < 1 {
        return Err(cx.invalid(format!("p must be positive, got {p}")));
    }
    Ok(p)
}

fn map_global_pool(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let x = cx.req_input(0)?;
    let kind = match cx.op_type() {
        "GlobalMaxPool" => PoolKind::Max {
            indices: false,
            column_major: false,
        },
        "GlobalAveragePool" => PoolKind::Avg {
            count_include_pad: false,
        },
        _ => PoolKind::Lp { p: lp_p(cx)? },
    };
    Ok(vec![cx.emit1(lin(LinalgOp::GlobalPool {
        kind,
        channels_last: false,
    }), &[x])?])
}

// ---- einsum ----

/// Parses an einsum equation given the operand ranks; ellipsis dims become labels
/// `128 + j` (right-aligned across operands, as numpy broadcasts them).
pub(crate) fn parse_einsum(eq: &str, ranks: &[usize]) -> Result<(Vec<Vec<u8>>, Vec<u8>), String> {
    let eq: String = eq.chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l, Some(r)),
        None => (eq.as_str(), None),
    };
    let terms: Vec<&str> = lhs.split(',').collect();
    if terms.len() != ranks.len() {
        return Err(format!(
            "equation '{eq}' has {} operands, the node has {} inputs",
            terms.len(),
            ranks.len()
        ));
    }
    // (letters before the ellipsis, has ellipsis, letters after)
    let split_term = |t: &str| -> Result<(Vec<u8>, bool, Vec<u8>), String> {
        let (a, b, ell) = match t.split_once("...") {
            Some((a, b)) => (a, b, true),
            None => (t, "", false),
        };
        for c in a.bytes().chain(b.bytes()) {
            if !c.is_ascii_alphabetic() {
                return Err(format!("bad subscript '{}' in '{eq}'", c as char));
            }
        }
        Ok((a.bytes().collect(), ell, b.bytes().collect()))
    };
    let mut parsed = Vec::new();
    let mut ell_rank = 0;
    for (t, &r) in terms.iter().zip(ranks) {
        let (a, ell, b) = split_term(t)?;
        let letters = a.len() + b.len();
        let e = if ell {
            r.checked_sub(letters).ok_or_else(|| {
                format!("term '{t}' has more subscripts than its operand's rank {r}")
            })?
        } else {
            if letters != r {
                return Err(format!(
                    "term '{t}' has {letters} subscripts, its operand has rank {r}"
                ));
            }
            0
        };
        ell_rank = ell_rank.max(e);
        parsed.push((a, e, b));
    }
    let ell_labels =
        |e: usize| -> Vec<u8> { (ell_rank - e..ell_rank).map(|j| 128 + j as u8).collect() };
    if ell_rank > 100 {
        return Err("too many ellipsis dimensions".into());
    }
    let mut inputs = Vec::new();
    for (a, e, b) in &parsed {
        let mut v = a.clone();
        v.extend(ell_labels(*e));
        v.extend(b);
        inputs.push(v);
    }
    let output = match rhs {
        Some(r) => {
            let (a, ell, b) = split_term(r)?;
            let mut v = a;
            if ell {
                v.extend(ell_labels(ell_rank));
            }
            v.extend(b);
            for &l in &v {
                if l < 128 && !inputs.iter().any(|s| s.contains(&l)) {
                    return Err(format!("output label '{}' is not in any input", l as char));
                }
            }
            v
        }
        None => {
            let mut v = ell_labels(ell_rank);
            let mut letters: Vec<u8> = inputs
                .iter()
                .flatten()
                .copied()
                .filter(|&l| l < 128)
                .collect();
            letters.sort_unstable();
            for (i, &l) in letters.iter().enumerate() {
                let once = (i == 0 || letters[i - 1] != l) && letters.get(i + 1) != Some(&l);
                if once {
                    v.push(l);
                }
            }
            v
        }
    };
    Ok((inputs, output))
}

fn map_einsum(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let eq = cx
        .attr_s("equation")?
        .ok_or_else(|| cx.invalid("equation is required"))?;
    let mut ins = Vec::new();
    let mut ranks = Vec::new();
    for i in 0..cx.n_inputs() {
        let v = cx.req_input(i)?;
        ranks.push(cx.ty(v).rank());
        ins.push(v);
    }
    let (inputs, output) = parse_einsum(&eq, &ranks).map_err(|m| cx.invalid(m))?;
    Ok(vec![
        cx.emit1(lin(LinalgOp::Einsum { inputs, output }), &ins)?
    ])
}

// ---- misc ----

fn map_det(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let x = cx.req_input(0)?;
    Ok(vec![cx.emit1(lin(LinalgOp::Det), &[x])?])
}

fn map_max_unpool(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let (x, ind) = (cx.req_input(0)?, cx.req_input(1)?);
    let n = spatial_rank(cx, 0)?;
    let kernel = kernel_shape(cx, n, None)?;
    let window = window(cx, n, kernel)?;
    let output_shape = match cx.input(2) {
        None => None,
        Some(_) => {
            let s = cx.shape_input(2, "MaxUnpool output_shape")?;
            let mut dims = Vec::new();
            for e in s {
                dims.push(match e {
                    super::ShapeElem::Int(v) if v >= 0 => Dim::Fixed(v as usize),
                    super::ShapeElem::Int(v) => {
                        return Err(cx.invalid(format!("negative output_shape entry {v}")))
                    }
                    super::ShapeElem::Sym(s) => Dim::Sym(s),
                });
            }
            Some(dims)
        }
    };
    Ok(vec![cx.emit1(
        lin(LinalgOp::MaxUnpool {
            window,
            output_shape,
        }),
        &[x, ind],
    )?])
}

fn map_col2im(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let x = cx.req_input(0)?;
    let image = cx.const_ints(1, "Col2Im image_shape")?;
    let block = cx.const_ints(2, "Col2Im block_shape")?;
    let n = image.len();
    if block.len() != n {
        return Err(cx.invalid(format!(
            "image_shape {image:?} and block_shape {block:?} differ in length"
        )));
    }
    let image_shape = to_positive(cx, &image, "image_shape")?;
    let block_shape = to_positive(cx, &block, "block_shape")?;
    let dilations = ints_n(cx, "dilations", n, 1, true)?;
    let strides = ints_n(cx, "strides", n, 1, true)?;
    let pads = match cx.attr_ints("pads")? {
        None => vec![0; 2 * n],
        Some(p) if p.len() == 2 * n => to_usize(cx, &p, "pads")?,
        Some(p) => return Err(cx.invalid(format!("pads {p:?} must have {} entries", 2 * n))),
    };
    let op = LinalgOp::Col2Im {
        image_shape,
        block_shape,
        dilations,
        pads,
        strides,
    };
    Ok(vec![cx.emit1(lin(op), &[x])?])
}

#[cfg(test)]
mod tests {
    use super::parse_einsum;

    #[test]
    fn einsum_parsing() {
        let (i, o) = parse_einsum("ij,jk", &[2, 2]).unwrap();
        assert_eq!(i, vec![b"ij".to_vec(), b"jk".to_vec()]);
        assert_eq!(o, b"ik".to_vec());
        let (i, o) = parse_einsum("...ii->...i", &[4]).unwrap();
        assert_eq!(i, vec![vec![128, 129, b'i', b'i']]);
        assert_eq!(o, vec![128, 129, b'i']);
        // Ellipses of different ranks right-align.
        let (i, o) = parse_einsum("...ij,...jk", &[4, 3]).unwrap();
        assert_eq!(i[1], vec![129, b'j', b'k']);
        assert_eq!(o, vec![128, 129, b'i', b'k']);
        assert_eq!(parse_einsum("i,i", &[1, 1]).unwrap().1, Vec::<u8>::new());
        assert!(parse_einsum("ij", &[3]).is_err());
        assert!(parse_einsum("ij->k", &[2]).is_err());
    }
}
