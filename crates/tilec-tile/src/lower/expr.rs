//! Inline nodes as expressions: elementwise functions with numpy broadcasting, casts,
//! quantization, re-indexing (reshape, transpose, slice, expand, tile, concat, split, pad,
//! trilu, linear resize: `resize.rs`), gathers and one-hot, and the source ops.
//!
//! Arithmetic runs in the compute dtype (f32 for narrow floats) and each node's result is
//! rounded to its dtype, as the reference interpreter rounds every op's output.

use tilec_ir::op::{
    BinaryOp, DimValue, IndexOp, LayoutOp, NnOp, NormOp, PadMode, QuantOp, SourceOp, UnaryOp,
};
use tilec_ir::{DType, Dim, NodeId, Op};

use super::{bin, compute_dtype, lit, lit_i, ravel, unravel, Fail, Lowerer, R};
use crate::ir::*;

/// Which inline ops and attributes are lowered (checked before any code is built).
pub(crate) fn check_inline(l: &Lowerer, n: NodeId) -> R<()> {
    let node = l.g.node(n);
    let in_dt = node.inputs.first().map(|&v| l.dtype(v));
    let bad = |why: &str| Err(Fail::Unsupported(n, why.to_string()));
    match &node.op {
        Op::Unary(UnaryOp::BitCast { .. }) => bad("bit casts are not lowered"),
        Op::Binary(BinaryOp::Pow) if in_dt.is_some_and(|d| !d.is_float()) => {
            bad("integer pow is not lowered")
        }
        Op::Cast {
            to,
            saturate: false,
        } if matches!(to, DType::F8E4M3 | DType::F8E5M2) => {
            bad("non-saturating fp8 casts are not lowered")
        }
        Op::Quant(QuantOp::QuantizeLinear { to, .. })
            if matches!(to, DType::F8E4M3 | DType::F8E5M2) =>
        {
            bad("fp8 quantization is not lowered")
        }
        Op::Quant(QuantOp::DynamicQuantizeLinear) => bad("dynamic quantization is not lowered"),
        Op::Linalg(_) => match super::col2im::refusal(&node.op) {
            Some(why) => bad(&why),
            None => Ok(()),
        },
        Op::Layout(LayoutOp::Resize(a)) => match super::resize::refusal(a, &l.shape(node.inputs[0]), &l.shape(node.outputs[0])) {
            Some(why) => bad(&why),
            None => Ok(()),
        },
        Op::Source(SourceOp::DimValues { elems, .. }) if elems.len() > 64 => {
            bad("large dim-value tensors are not lowered")
        }
        Op::Source(SourceOp::DimValues { elems, .. })
            if elems
                .iter()
                .any(|e| matches!(e, DimValue::Dim(Dim::Sym(_)))) =>
        {
            bad("symbolic dim values")
        }
        _ => Ok(()),
    }
}

impl Lowerer<'_> {
    /// Up-converts `e` of dtype `d` to its compute dtype.
    pub(crate) fn up(&self, e: Expr, d: DType) -> Expr {
        let c = compute_dtype(d);
        if c != d {
            Expr::cast(c, e)
        } else {
            e
        }
    }

    /// Rounds `e` (of `d`'s compute dtype) to `d`.
    pub(crate) fn down(&self, e: Expr, d: DType) -> Expr {
        if compute_dtype(d) != d {
            Expr::cast(d, e)
        } else {
            e
        }
    }

    /// A value used more than once in one expression, as a temporary when allowed.
    pub(crate) fn reuse(&mut self, e: Expr, d: DType) -> Expr {
        if self.cse_on && self.guard == 0 {
            self.hoist(e, d)
        } else {
            e
        }
    }

    /// The index into operand `v` (numpy broadcasting) for output index `idx`.
    pub(crate) fn bcast_idx(&self, v: tilec_ir::ValueId, idx: &[Expr]) -> Vec<Expr> {
        let s = self.shape(v);
        let off = idx.len() - s.len();
        (0..s.len())
            .map(|i| {
                if s[i] == 1 {
                    Expr::Int(0)
                } else {
                    idx[off + i].clone()
                }
            })
            .collect()
    }

    /// The operand's element at output index `idx`, in its compute dtype.
    fn operand(&mut self, v: tilec_ir::ValueId, idx: &[Expr]) -> R<Expr> {
        let bi = self.bcast_idx(v, idx);
        let e = self.value_at(v, &bi)?;
        Ok(self.up(e, self.dtype(v)))
    }

    /// An index read from input `input` of node `n` for a dimension of `len`, checked as ONNX
    /// defines it: with `wrap`, negative values count from the end once; anything else outside
    /// `0..len` is an error of the run (recorded by the kernel, which clamps the index so that
    /// memory stays in bounds). `e` is an index or an integer element read from `ind`.
    ///
    /// Every index is checked, whatever the output's size (as the interpreter does): a kernel
    /// that may not read every element of `ind` because the node's output is empty, or one of
    /// the kernel's loops is, leaves the node to the interpreter.
    pub(crate) fn checked_index(
        &mut self,
        n: NodeId,
        ind: tilec_ir::ValueId,
        input: &str,
        e: Expr,
        len: i64,
        wrap: bool,
    ) -> R<Expr> {
        if len < 1 {
            return self.unsupported(n, format!("{input} index an empty dimension"));
        }
        let empty_out = self.g.node(n).outputs.iter().any(|&o| self.shape(o).contains(&0));
        if !self.shape(ind).contains(&0) && (empty_out || self.ranges.values().any(|&r| r == 0)) {
            return self.unsupported(n, format!("{input} are checked by the interpreter where the output is empty"));
        }
        self.checking.insert(n);
        let node = self.g.node(n);
        let site = CheckSite {
            node: node.name.clone(),
            op: node.op.name().to_string(),
            input: input.to_string(),
            wrap,
        };
        let at = match self.k.checks.iter().position(|s| *s == site) {
            Some(i) => i,
            None => {
                self.k.checks.push(site);
                self.k.checks.len() - 1
            }
        };
        let i = match e {
            Expr::Int(_) | Expr::Var(_) => e,
            e if self.k.type_of(&e) == Ty::Index => e,
            e => Expr::ToIndex(Box::new(e)),
        };
        let check = Expr::CheckIndex(
            Box::new(i),
            IndexCheck {
                len,
                wrap,
                site: at as u32,
            },
        );
        // The check is a statement wherever temporaries may be placed: the index it yields
        // can then be dropped (an index into a dimension of length 1 is always 0, a branch of
        // a select may not be taken) without losing the check. Elsewhere (gemm operands,
        // guarded branches) it stays inline, and `finish` makes sure it survived.
        if !(self.cse_on && self.guard == 0) {
            return Ok(check);
        }
        let name = self.fresh("ix");
        let t = self.k.new_var(name, Ty::Index, false);
        self.ranges.insert(t, len);
        self.check_vars.insert(t);
        self.lets.push(Stmt::Let { var: t, value: check });
        Ok(Expr::Var(t))
    }

    pub(crate) fn inline(&mut self, n: NodeId, out: usize, idx: &[Expr]) -> R<Expr> {
        let g = self.g;
        let node = g.node(n);
        let ins = &node.inputs;
        let od = self.dtype(node.outputs[out]);
        let oshape = self.shape(node.outputs[out]);
        match &node.op {
            Op::Unary(u) => {
                let d = self.dtype(ins[0]);
                let x = self.operand(ins[0], idx)?;
                let r = self.unary(n, u, x, d)?;
                Ok(self.down(r, od))
            }
            Op::Binary(b) => {
                let (da, db) = (self.dtype(ins[0]), self.dtype(ins[1]));
                let a = self.operand(ins[0], idx)?;
                let bb = self.operand(ins[1], idx)?;
                let r = self.binary(n, b, a, bb, compute_dtype(da), db)?;
                Ok(self.down(r, od))
            }
            Op::Where => {
                let c = self.operand(ins[0], idx)?;
                let a = self.value_at(ins[1], &self.bcast_idx(ins[1], idx))?;
                let b = self.value_at(ins[2], &self.bcast_idx(ins[2], idx))?;
                Ok(Expr::select(c, a, b))
            }
            Op::Cast { to, .. } => {
                let x = self.value_at(ins[0], idx)?;
                let d = self.dtype(ins[0]);
                if d == *to {
                    return Ok(x);
                }
                // NaN converts to 0 for integer targets, as the reference does.
                if d.is_float() && !to.is_float() && *to != DType::Bool {
                    let x = self.reuse(x, d);
                    return Ok(Expr::select(
                        Expr::un(UnOp::IsNan, x.clone()),
                        lit(0.0, *to),
                        Expr::cast(*to, x),
                    ));
                }
                Ok(Expr::cast(*to, x))
            }
            Op::Quant(q) => self.quant(n, q, idx),
            Op::Norm(NormOp::BatchNorm { epsilon, channels_last }) => {
                // y = (x - mean) * scale / sqrt(var + eps) + bias, per channel (axis 1, or the
                // last axis when channels-last).
                let d = self.dtype(ins[0]);
                let ct = compute_dtype(d);
                let x = self.operand(ins[0], idx)?;
                let cax = if *channels_last { idx.len() - 1 } else { 1 };
                let c = vec![idx[cax].clone()];
                let mut p = Vec::new();
                for &pv in &ins[1..5] {
                    let e = self.value_at(pv, &c)?;
                    p.push(self.up(e, d));
                }
                let a = bin(
                    BinOp::Div,
                    p[0].clone(),
                    Expr::un(
                        UnOp::Sqrt,
                        bin(BinOp::Add, p[3].clone(), lit(*epsilon as f64, ct)),
                    ),
                );
                let y = bin(
                    BinOp::Add,
                    bin(BinOp::Mul, bin(BinOp::Sub, x, p[2].clone()), a),
                    p[1].clone(),
                );
                Ok(self.down(y, od))
            }
            Op::Norm(NormOp::NllLoss { .. }) => {
                let (loss, _) = self.nll_element(n, idx)?;
                Ok(self.down(loss, od))
            }
            Op::Nn(NnOp::RotaryEmbedding {
                interleaved,
                rotary_dim,
                num_heads,
                has_position_ids,
            }) => self.rotary(
                n,
                *interleaved,
                *rotary_dim,
                *num_heads,
                *has_position_ids,
                idx,
            ),
            Op::Nn(NnOp::SwiGlu { alpha }) => {
                let d = self.dtype(ins[0]);
                let ct = compute_dtype(d);
                let a = self.operand(ins[0], idx)?;
                let a = self.reuse(a, ct);
                let b = self.operand(ins[1], idx)?;
                let s = Expr::un(
                    UnOp::Sigmoid,
                    bin(BinOp::Mul, lit(*alpha as f64, ct), a.clone()),
                );
                Ok(self.down(bin(BinOp::Mul, bin(BinOp::Mul, a, s), b), od))
            }
            Op::Layout(lo) => self.layout(n, lo, out, idx, &oshape),
            Op::Linalg(tilec_ir::op::LinalgOp::Col2Im { .. }) => self.col2im(n, idx),
            Op::Index(ix) => self.index(n, ix, idx),
            Op::Source(s) => self.source(n, s, idx, od),
            Op::Nn(NnOp::Attention { .. }) => super::anchor::attention_present(self, n, out, idx),
            _ => self.unsupported(n, "not an inline op"),
        }
    }

    /// The loss and the weight of one target element of an NLL loss (both 0 when ignored).
    /// A target outside the class range (and not ignored) is an error of the run.
    pub(crate) fn nll_element(&mut self, n: NodeId, tidx: &[Expr]) -> R<(Expr, Expr)> {
        let node = self.g.node(n);
        let Op::Norm(NormOp::NllLoss {
            ignore_index,
            has_weight,
            ..
        }) = &node.op
        else {
            return self.unsupported(n, "not an nll loss");
        };
        let (x, target) = (node.inputs[0], node.inputs[1]);
        let wv = if *has_weight {
            Some(node.inputs[2])
        } else {
            None
        };
        let d = self.dtype(x);
        let ct = compute_dtype(d);
        let c = self.shape(x)[1];
        let t = self.value_at(target, tidx)?;
        let ti = Expr::ToIndex(Box::new(t));
        let skip = ignore_index.map(|ig| bin(BinOp::Eq, ti.clone(), Expr::Int(ig)));
        // An ignored target reads class 0 (and is not checked).
        let cls = match &skip {
            Some(s) => Expr::select(s.clone(), Expr::Int(0), ti.clone()),
            None => ti.clone(),
        };
        let cls = self.checked_index(n, target, "target", cls, c, false)?;
        let mut xi = vec![tidx[0].clone(), cls.clone()];
        xi.extend_from_slice(&tidx[1..]);
        let xe = self.value_at(x, &xi)?;
        let xe = self.up(xe, d);
        let w = match wv {
            Some(w) => {
                let e = self.value_at(w, &[cls])?;
                self.up(e, self.dtype(w))
            }
            None => lit(1.0, ct),
        };
        let w = self.reuse(w, ct);
        let loss = Expr::un(UnOp::Neg, bin(BinOp::Mul, xe, w.clone()));
        Ok(match skip {
            Some(skip) => {
                let skip = self.reuse(skip, DType::Bool);
                (
                    Expr::select(skip.clone(), lit(0.0, ct), loss),
                    Expr::select(skip, lit(0.0, ct), w),
                )
            }
            None => (loss, w),
        })
    }

    fn rotary(
        &mut self,
        n: NodeId,
        interleaved: bool,
        rotary_dim: usize,
        num_heads: usize,
        has_pos: bool,
        idx: &[Expr],
    ) -> R<Expr> {
        let node = self.g.node(n);
        let (x, cos, sin) = (node.inputs[0], node.inputs[1], node.inputs[2]);
        let xs = self.shape(x);
        let d = self.dtype(x);
        let ct = compute_dtype(d);
        // (b, s, h, dd) of this element and the index of element (b, s, h, e).
        let (b, s, h, dd, dn) = match xs.len() {
            4 => (
                idx[0].clone(),
                idx[2].clone(),
                idx[1].clone(),
                idx[3].clone(),
                xs[3],
            ),
            3 if num_heads > 0 && xs[2] % num_heads as i64 == 0 => {
                let dn = xs[2] / num_heads as i64;
                (
                    idx[0].clone(),
                    idx[1].clone(),
                    bin(BinOp::Div, idx[2].clone(), Expr::Int(dn)),
                    bin(BinOp::Rem, idx[2].clone(), Expr::Int(dn)),
                    dn,
                )
            }
            _ => return self.unsupported(n, "rotary input must be [B, H, S, D] or [B, S, H*D]"),
        };
        let at = |e: Expr| -> Vec<Expr> {
            if xs.len() == 4 {
                vec![b.clone(), h.clone(), s.clone(), e]
            } else {
                vec![
                    b.clone(),
                    s.clone(),
                    bin(BinOp::Add, bin(BinOp::Mul, h.clone(), Expr::Int(dn)), e),
                ]
            }
        };
        let rd = if rotary_dim == 0 {
            dn
        } else {
            rotary_dim as i64
        };
        let half = rd / 2;
        let dd = self.simp(dd);
        let (i, first) = if interleaved {
            (
                bin(BinOp::Div, dd.clone(), Expr::Int(2)),
                bin(
                    BinOp::Eq,
                    bin(BinOp::Rem, dd.clone(), Expr::Int(2)),
                    Expr::Int(0),
                ),
            )
        } else {
            let f = bin(BinOp::Lt, dd.clone(), Expr::Int(half));
            (
                Expr::select(
                    f.clone(),
                    dd.clone(),
                    bin(BinOp::Sub, dd.clone(), Expr::Int(half)),
                ),
                f,
            )
        };
        let (i1, i2) = if interleaved {
            (
                bin(BinOp::Mul, i.clone(), Expr::Int(2)),
                bin(
                    BinOp::Add,
                    bin(BinOp::Mul, i.clone(), Expr::Int(2)),
                    Expr::Int(1),
                ),
            )
        } else {
            (i.clone(), bin(BinOp::Add, i.clone(), Expr::Int(half)))
        };
        let cs = self.shape(cos);
        let row = if has_pos {
            let p = self.value_at(node.inputs[3], &[b.clone(), s.clone()])?;
            let rows: i64 = cs[..cs.len() - 1].iter().product();
            self.checked_index(n, node.inputs[3], "position_ids", p, rows, false)?
        } else {
            bin(
                BinOp::Add,
                bin(
                    BinOp::Mul,
                    b.clone(),
                    Expr::Int(xs[if xs.len() == 4 { 2 } else { 1 }]),
                ),
                s.clone(),
            )
        };
        let mut ci = unravel(row, &cs[..cs.len() - 1]);
        ci.push(i);
        let xe = self.value_at(x, idx)?;
        let xe = self.up(xe, d);
        self.guard += 1;
        let parts = (|| -> R<(Expr, Expr, Expr, Expr)> {
            let c = self.value_at(cos, &ci)?;
            let sn = self.value_at(sin, &ci)?;
            let x1 = self.value_at(x, &at(i1))?;
            let x2 = self.value_at(x, &at(i2))?;
            Ok((
                self.up(c, d),
                self.up(sn, d),
                self.up(x1, d),
                self.up(x2, d),
            ))
        })();
        self.guard -= 1;
        let (c, sn, x1, x2) = parts?;
        let o1 = bin(
            BinOp::Sub,
            bin(BinOp::Mul, c.clone(), x1.clone()),
            bin(BinOp::Mul, sn.clone(), x2.clone()),
        );
        let o2 = bin(BinOp::Add, bin(BinOp::Mul, sn, x1), bin(BinOp::Mul, c, x2));
        let rot = Expr::select(first, o1, o2);
        let _ = ct;
        Ok(self.down(Expr::select(bin(BinOp::Lt, dd, Expr::Int(rd)), rot, xe), d))
    }

    fn unary(&mut self, n: NodeId, u: &UnaryOp, x: Expr, d: DType) -> R<Expr> {
        use UnaryOp::*;
        let ct = compute_dtype(d);
        let f = |v: f64| lit(v, ct);
        if !d.is_float() {
            return Ok(match u {
                Abs => Expr::un(UnOp::Abs, x),
                Neg => Expr::un(UnOp::Neg, x),
                Sign => Expr::un(UnOp::Sign, x),
                Relu => bin(BinOp::Max, x, lit(0.0, d)),
                Not => Expr::un(UnOp::Not, x),
                BitwiseNot => Expr::un(UnOp::BitNot, x),
                Shrink { lambd, bias } => {
                    let xf = Expr::cast(DType::F64, x);
                    let xf = self.reuse(xf, DType::F64);
                    let (l, b) = (*lambd as f64, *bias as f64);
                    let e = Expr::select(
                        bin(BinOp::Lt, xf.clone(), lit(-l, DType::F64)),
                        bin(BinOp::Add, xf.clone(), lit(b, DType::F64)),
                        Expr::select(
                            bin(BinOp::Gt, xf.clone(), lit(l, DType::F64)),
                            bin(BinOp::Sub, xf, lit(b, DType::F64)),
                            lit(0.0, DType::F64),
                        ),
                    );
                    Expr::cast(d, Expr::un(UnOp::Trunc, e))
                }
                _ => {
                    return self.unsupported(n, format!("{} on {d}", tilec_ir::op::OpInfo::name(u)))
                }
            });
        }
        let simple = |op: UnOp, x: Expr| Expr::un(op, x);
        Ok(match u {
            Abs => simple(UnOp::Abs, x),
            Neg => simple(UnOp::Neg, x),
            Exp => simple(UnOp::Exp, x),
            Log => simple(UnOp::Log, x),
            Sqrt => simple(UnOp::Sqrt, x),
            Reciprocal => simple(UnOp::Recip, x),
            Sin => simple(UnOp::Sin, x),
            Cos => simple(UnOp::Cos, x),
            Tan => simple(UnOp::Tan, x),
            Asin => simple(UnOp::Asin, x),
            Acos => simple(UnOp::Acos, x),
            Atan => simple(UnOp::Atan, x),
            Sinh => simple(UnOp::Sinh, x),
            Cosh => simple(UnOp::Cosh, x),
            Asinh => simple(UnOp::Asinh, x),
            Acosh => simple(UnOp::Acosh, x),
            Atanh => simple(UnOp::Atanh, x),
            Tanh => simple(UnOp::Tanh, x),
            Sigmoid => simple(UnOp::Sigmoid, x),
            Erf => simple(UnOp::Erf, x),
            Floor => simple(UnOp::Floor, x),
            Ceil => simple(UnOp::Ceil, x),
            Round => simple(UnOp::Round, x),
            Sign => simple(UnOp::Sign, x),
            IsNaN => simple(UnOp::IsNan, x),
            Relu => bin(BinOp::Max, x, f(0.0)),
            IsInf {
                detect_negative,
                detect_positive,
            } => {
                let x = self.reuse(x, ct);
                let pos = bin(BinOp::Eq, x.clone(), f(f64::INFINITY));
                let neg = bin(BinOp::Eq, x, f(f64::NEG_INFINITY));
                match (detect_negative, detect_positive) {
                    (true, true) => bin(BinOp::Or, pos, neg),
                    (false, true) => pos,
                    (true, false) => neg,
                    (false, false) => Expr::Lit(Lit::Bool(false)),
                }
            }
            Softplus => {
                let x = self.reuse(x, ct);
                softplus(x, ct)
            }
            Softsign => {
                let x = self.reuse(x, ct);
                bin(
                    BinOp::Div,
                    x.clone(),
                    bin(BinOp::Add, f(1.0), Expr::un(UnOp::Abs, x)),
                )
            }
            Mish => {
                let x = self.reuse(x, ct);
                bin(BinOp::Mul, x.clone(), Expr::un(UnOp::Tanh, softplus(x, ct)))
            }
            Gelu { tanh_approx: false } => Expr::un(UnOp::GeluErf, x),
            Gelu { tanh_approx: true } => Expr::un(UnOp::GeluTanh, x),
            LeakyRelu { alpha } => {
                let x = self.reuse(x, ct);
                Expr::select(
                    bin(BinOp::Lt, x.clone(), f(0.0)),
                    bin(BinOp::Mul, f(*alpha as f64), x.clone()),
                    x,
                )
            }
            Elu { alpha } => {
                let x = self.reuse(x, ct);
                let em1 = bin(BinOp::Sub, Expr::un(UnOp::Exp, x.clone()), f(1.0));
                Expr::select(
                    bin(BinOp::Lt, x.clone(), f(0.0)),
                    bin(BinOp::Mul, f(*alpha as f64), em1),
                    x,
                )
            }
            Selu { alpha, gamma } => {
                let x = self.reuse(x, ct);
                let (a, g) = (*alpha as f64, *gamma as f64);
                let neg = bin(
                    BinOp::Mul,
                    f(g),
                    bin(
                        BinOp::Sub,
                        bin(BinOp::Mul, f(a), Expr::un(UnOp::Exp, x.clone())),
                        f(a),
                    ),
                );
                Expr::select(
                    bin(BinOp::Gt, x.clone(), f(0.0)),
                    bin(BinOp::Mul, f(g), x),
                    neg,
                )
            }
            Celu { alpha } => {
                let x = self.reuse(x, ct);
                let a = *alpha as f64;
                let em1 = bin(
                    BinOp::Sub,
                    Expr::un(UnOp::Exp, bin(BinOp::Div, x.clone(), f(a))),
                    f(1.0),
                );
                bin(
                    BinOp::Add,
                    bin(BinOp::Max, x, f(0.0)),
                    bin(BinOp::Min, bin(BinOp::Mul, f(a), em1), f(0.0)),
                )
            }
            HardSigmoid { alpha, beta } => {
                let y = bin(
                    BinOp::Add,
                    bin(BinOp::Mul, f(*alpha as f64), x),
                    f(*beta as f64),
                );
                bin(BinOp::Min, bin(BinOp::Max, y, f(0.0)), f(1.0))
            }
            HardSwish => {
                let x = self.reuse(x, ct);
                let y = bin(BinOp::Add, bin(BinOp::Div, x.clone(), f(6.0)), f(0.5));
                bin(
                    BinOp::Mul,
                    x,
                    bin(BinOp::Min, bin(BinOp::Max, y, f(0.0)), f(1.0)),
                )
            }
            ThresholdedRelu { alpha } => {
                let x = self.reuse(x, ct);
                Expr::select(bin(BinOp::Gt, x.clone(), f(*alpha as f64)), x, f(0.0))
            }
            Shrink { lambd, bias } => {
                let x = self.reuse(x, ct);
                let (l, b) = (*lambd as f64, *bias as f64);
                Expr::select(
                    bin(BinOp::Lt, x.clone(), f(-l)),
                    bin(BinOp::Add, x.clone(), f(b)),
                    Expr::select(
                        bin(BinOp::Gt, x.clone(), f(l)),
                        bin(BinOp::Sub, x, f(b)),
                        f(0.0),
                    ),
                )
            }
            Swish { alpha } if *alpha == 1.0 => Expr::un(UnOp::Silu, x),
            Swish { alpha } => {
                let x = self.reuse(x, ct);
                bin(
                    BinOp::Mul,
                    x.clone(),
                    Expr::un(UnOp::Sigmoid, bin(BinOp::Mul, f(*alpha as f64), x)),
                )
            }
            Not => Expr::un(UnOp::Not, x),
            BitwiseNot | BitCast { .. } => return self.unsupported(n, "not defined on floats"),
        })
    }

    /// `a op b`; `a` in compute dtype `ct`, `b` in its own compute dtype (`db` its dtype).
    fn binary(
        &mut self,
        n: NodeId,
        b: &BinaryOp,
        a: Expr,
        bb: Expr,
        ct: DType,
        db: DType,
    ) -> R<Expr> {
        use BinaryOp::*;
        let float = ct.is_float();
        let zero = lit(0.0, ct);
        Ok(match b {
            Add => bin(BinOp::Add, a, bb),
            Sub => bin(BinOp::Sub, a, bb),
            Mul => bin(BinOp::Mul, a, bb),
            Div if float => bin(BinOp::Div, a, bb),
            Div => {
                let bb = self.reuse(bb, ct);
                Expr::select(
                    bin(BinOp::Eq, bb.clone(), zero.clone()),
                    zero,
                    bin(BinOp::Div, a, bb),
                )
            }
            Pow => {
                let e = if compute_dtype(db) != ct {
                    Expr::cast(ct, bb)
                } else {
                    bb
                };
                bin(BinOp::Pow, a, e)
            }
            Mod { fmod: true } if float => bin(BinOp::Rem, a, bb),
            Mod { fmod: true } => {
                let bb = self.reuse(bb, ct);
                Expr::select(
                    bin(BinOp::Eq, bb.clone(), zero.clone()),
                    zero,
                    bin(BinOp::Rem, a, bb),
                )
            }
            Mod { fmod: false } if float => {
                let bb = self.reuse(bb, ct);
                let m = self.reuse(bin(BinOp::Rem, a, bb.clone()), ct);
                let fix = bin(
                    BinOp::And,
                    bin(BinOp::Ne, m.clone(), zero.clone()),
                    bin(
                        BinOp::Ne,
                        bin(BinOp::Lt, bb.clone(), zero.clone()),
                        bin(BinOp::Lt, m.clone(), zero),
                    ),
                );
                Expr::select(fix, bin(BinOp::Add, m.clone(), bb), m)
            }
            Mod { fmod: false } => {
                let bb = self.reuse(bb, ct);
                Expr::select(
                    bin(BinOp::Eq, bb.clone(), zero.clone()),
                    zero,
                    bin(BinOp::FloorMod, a, bb),
                )
            }
            Min => bin(BinOp::Min, a, bb),
            Max => bin(BinOp::Max, a, bb),
            And => bin(BinOp::And, a, bb),
            Or => bin(BinOp::Or, a, bb),
            Xor => bin(BinOp::Xor, a, bb),
            Equal => bin(BinOp::Eq, a, bb),
            Less => bin(BinOp::Lt, a, bb),
            LessOrEqual => bin(BinOp::Le, a, bb),
            Greater => bin(BinOp::Gt, a, bb),
            GreaterOrEqual => bin(BinOp::Ge, a, bb),
            BitwiseAnd => bin(BinOp::BitAnd, a, bb),
            BitwiseOr => bin(BinOp::BitOr, a, bb),
            BitwiseXor => bin(BinOp::BitXor, a, bb),
            BitShiftLeft | BitShiftRight => {
                if float {
                    return self.unsupported(n, "shift of floats");
                }
                let bits = (ct.size_bytes() * 8) as i64;
                let s = self.reuse(bb, ct);
                let a = self.reuse(a, ct);
                let out_of_range = bin(
                    BinOp::Or,
                    bin(BinOp::Lt, s.clone(), lit_i(0, ct)),
                    bin(BinOp::Ge, s.clone(), lit_i(bits, ct)),
                );
                let (op, over) = if *b == BitShiftLeft {
                    (BinOp::Shl, lit_i(0, ct))
                } else if ct.is_signed_int() {
                    (
                        BinOp::Shr,
                        Expr::select(
                            bin(BinOp::Lt, a.clone(), lit_i(0, ct)),
                            lit_i(-1, ct),
                            lit_i(0, ct),
                        ),
                    )
                } else {
                    (BinOp::Shr, lit_i(0, ct))
                };
                Expr::select(out_of_range, over, bin(op, a, s))
            }
            PRelu => {
                let a = self.reuse(a, ct);
                Expr::select(
                    bin(BinOp::Lt, a.clone(), zero),
                    bin(BinOp::Mul, bb, a.clone()),
                    a,
                )
            }
        })
    }

    fn quant(&mut self, n: NodeId, q: &QuantOp, idx: &[Expr]) -> R<Expr> {
        let node = self.g.node(n);
        let ins = node.inputs.clone();
        let od = self.dtype(node.outputs[0]);
        let (axis, block) = match q {
            QuantOp::QuantizeLinear {
                axis, block_size, ..
            }
            | QuantOp::DequantizeLinear {
                axis, block_size, ..
            } => (*axis, *block_size),
            QuantOp::DynamicQuantizeLinear => return self.unsupported(n, "dynamic quantization"),
        };
        let param_idx = |l: &Self, p: tilec_ir::ValueId| -> Vec<Expr> {
            let ps = l.shape(p);
            if ps.len() <= 1 && ps.iter().product::<i64>() == 1 {
                return vec![Expr::Int(0); ps.len()];
            }
            if block == 0 {
                return vec![idx[axis].clone()];
            }
            let mut v = idx.to_vec();
            v[axis] = bin(BinOp::Div, idx[axis].clone(), Expr::Int(block as i64));
            v
        };
        let (xd, sd) = (self.dtype(ins[0]), self.dtype(ins[1]));
        let x = self.value_at(ins[0], idx)?;
        let si = param_idx(self, ins[1]);
        let s = self.value_at(ins[1], &si)?;
        let zi = param_idx(self, ins[2]);
        let z = self.value_at(ins[2], &zi)?;
        match q {
            QuantOp::QuantizeLinear { .. } => {
                // numpy's promotion of x / scale.
                let cd = if xd == sd && xd.is_float() {
                    xd
                } else if xd == DType::F64 || sd == DType::F64 || !xd.is_float() || !sd.is_float() {
                    DType::F64
                } else {
                    DType::F32
                };
                let wd = DType::F64;
                let qv = Expr::cast(cd, bin(BinOp::Div, Expr::cast(wd, x), Expr::cast(wd, s)));
                let qv = Expr::cast(wd, qv);
                let qv = self.reuse(qv, wd);
                let (lo, hi) = match od {
                    DType::U8 => (0.0, 255.0),
                    DType::I8 => (-128.0, 127.0),
                    DType::U16 => (0.0, 65535.0),
                    DType::I16 => (-32768.0, 32767.0),
                    _ => return self.unsupported(n, format!("quantization to {od}")),
                };
                let r = bin(
                    BinOp::Add,
                    Expr::un(UnOp::Round, qv.clone()),
                    Expr::cast(wd, z),
                );
                let r = bin(BinOp::Min, bin(BinOp::Max, r, lit(lo, wd)), lit(hi, wd));
                let r = Expr::select(Expr::un(UnOp::IsNan, qv), lit(lo, wd), r);
                Ok(Expr::cast(od, r))
            }
            QuantOp::DequantizeLinear { .. } => {
                let fp8 = matches!(xd, DType::F8E4M3 | DType::F8E5M2);
                let cd = if sd == DType::F64 || xd == DType::I32 {
                    DType::F64
                } else {
                    DType::F32
                };
                let xv = Expr::cast(DType::F64, x);
                let d = if fp8 {
                    xv
                } else {
                    bin(BinOp::Sub, xv, Expr::cast(DType::F64, z))
                };
                let v = Expr::cast(cd, bin(BinOp::Mul, d, Expr::cast(DType::F64, s)));
                Ok(Expr::cast(od, v))
            }
            QuantOp::DynamicQuantizeLinear => self.unsupported(n, "dynamic quantization"),
        }
    }

    fn layout(
        &mut self,
        n: NodeId,
        lo: &LayoutOp,
        out: usize,
        idx: &[Expr],
        oshape: &[i64],
    ) -> R<Expr> {
        let node = self.g.node(n);
        let x = node.inputs[0];
        let xs = self.shape(x);
        match lo {
            LayoutOp::Reshape { .. } => {
                let flat = ravel(idx, oshape);
                let ii = unravel(flat, &xs);
                self.value_at(x, &ii)
            }
            LayoutOp::Transpose { perm } => {
                let mut ii = vec![Expr::Int(0); xs.len()];
                for (i, &p) in perm.iter().enumerate() {
                    ii[p] = idx[i].clone();
                }
                self.value_at(x, &ii)
            }
            LayoutOp::Expand { .. } => {
                let bi = self.bcast_idx(x, idx);
                self.value_at(x, &bi)
            }
            LayoutOp::Tile { .. } => {
                let ii: Vec<Expr> = idx
                    .iter()
                    .zip(&xs)
                    .map(|(e, &d)| bin(BinOp::Rem, e.clone(), Expr::Int(d)))
                    .collect();
                self.value_at(x, &ii)
            }
            LayoutOp::Slice {
                axes,
                starts,
                ends,
                steps,
            } => {
                let mut ii = idx.to_vec();
                for (k, &a) in axes.iter().enumerate() {
                    let (Some(s), Some(e)) = (starts[k].index(), ends[k].index()) else {
                        return self.unsupported(n, "symbolic slice bounds");
                    };
                    let (start, _) = tilec_ir::op::slice_range(xs[a], s, e, steps[k]);
                    ii[a] = bin(
                        BinOp::Add,
                        Expr::Int(start),
                        bin(BinOp::Mul, idx[a].clone(), Expr::Int(steps[k])),
                    );
                }
                self.value_at(x, &ii)
            }
            LayoutOp::Split { axis, .. } => {
                let mut off = 0;
                for &o in &node.outputs[..out] {
                    off += self.shape(o)[*axis];
                }
                let mut ii = idx.to_vec();
                ii[*axis] = bin(BinOp::Add, idx[*axis].clone(), Expr::Int(off));
                self.value_at(x, &ii)
            }
            LayoutOp::Concat { axis } => {
                // A select chain over the pieces, last piece innermost.
                let ins = node.inputs.clone();
                let mut offs = Vec::new();
                let mut off = 0;
                for &v in &ins {
                    offs.push(off);
                    off += self.shape(v)[*axis];
                }
                let a = idx[*axis].clone();
                let piece = |l: &mut Self, k: usize| -> R<Expr> {
                    let mut ii = idx.to_vec();
                    ii[*axis] = bin(BinOp::Sub, a.clone(), Expr::Int(offs[k]));
                    l.value_at(ins[k], &ii)
                };
                // A constant index picks its piece directly.
                let sa = self.simp(a.clone());
                if let Expr::Int(c) = sa {
                    let k = (0..ins.len()).rev().find(|&k| offs[k] <= c).unwrap_or(0);
                    return piece(self, k);
                }
                let live: Vec<usize> = (0..ins.len())
                    .filter(|&k| self.shape(ins[k])[*axis] > 0)
                    .collect();
                let Some(&last) = live.last() else {
                    return self.unsupported(n, "concat of empty pieces");
                };
                self.guard += 1;
                let mut e = piece(self, last);
                for &k in live.iter().rev().skip(1) {
                    let Ok(acc) = e else { break };
                    let p = piece(self, k);
                    e = p.map(|p| {
                        Expr::select(
                            bin(
                                BinOp::Lt,
                                a.clone(),
                                Expr::Int(offs[k] + self.shape(ins[k])[*axis]),
                            ),
                            p,
                            acc,
                        )
                    });
                }
                self.guard -= 1;
                e
            }
            LayoutOp::Pad { pads, mode } => {
                let r = xs.len();
                let mut ii = Vec::with_capacity(r);
                let mut inside: Option<Expr> = None;
                for a in 0..r {
                    let (b, nlen) = (pads[a], xs[a]);
                    let i = bin(BinOp::Sub, idx[a].clone(), Expr::Int(b));
                    if pads[a] <= 0 && pads[a + r] <= 0 {
                        ii.push(i);
                        continue;
                    }
                    match mode {
                        PadMode::Constant => {
                            let c = bin(
                                BinOp::And,
                                bin(BinOp::Ge, i.clone(), Expr::Int(0)),
                                bin(BinOp::Lt, i.clone(), Expr::Int(nlen)),
                            );
                            inside = Some(match inside {
                                None => c,
                                Some(p) => bin(BinOp::And, p, c),
                            });
                            ii.push(i);
                        }
                        PadMode::Edge => ii.push(bin(
                            BinOp::Min,
                            bin(BinOp::Max, i, Expr::Int(0)),
                            Expr::Int(nlen - 1),
                        )),
                        PadMode::Wrap => ii.push(bin(BinOp::FloorMod, i, Expr::Int(nlen))),
                        PadMode::Reflect => {
                            if nlen == 1 {
                                ii.push(Expr::Int(0));
                            } else {
                                let period = 2 * (nlen - 1);
                                let m = bin(BinOp::FloorMod, i, Expr::Int(period));
                                ii.push(Expr::select(
                                    bin(BinOp::Lt, m.clone(), Expr::Int(nlen)),
                                    m.clone(),
                                    bin(BinOp::Sub, Expr::Int(period), m),
                                ));
                            }
                        }
                    }
                }
                match inside {
                    None => self.value_at(x, &ii),
                    Some(c) => {
                        let fill = self.value_at(node.inputs[1], &[])?;
                        self.guard += 1;
                        let v = self.value_at(x, &ii);
                        self.guard -= 1;
                        Ok(Expr::select(c, v?, fill))
                    }
                }
            }
            LayoutOp::Trilu { upper, k } => {
                let r = idx.len();
                let d = bin(BinOp::Sub, idx[r - 1].clone(), idx[r - 2].clone());
                let keep = if *upper {
                    bin(BinOp::Ge, d, Expr::Int(*k))
                } else {
                    bin(BinOp::Le, d, Expr::Int(*k))
                };
                let v = self.value_at(x, idx)?;
                Ok(Expr::select(keep, v, lit(0.0, self.dtype(x))))
            }
            LayoutOp::Resize(a) => self.resize(n, a, idx),
        }
    }

    fn index(&mut self, n: NodeId, ix: &IndexOp, idx: &[Expr]) -> R<Expr> {
        let node = self.g.node(n);
        let ins = node.inputs.clone();
        match ix {
            IndexOp::Gather { axis } => {
                let (data, ind) = (ins[0], ins[1]);
                let (ds, q) = (self.shape(data), self.shape(ind).len());
                let ii: Vec<Expr> = idx[*axis..*axis + q].to_vec();
                let iv = self.value_at(ind, &ii)?;
                let pos = self.checked_index(n, ind, "indices", iv, ds[*axis], true)?;
                let mut di = idx[..*axis].to_vec();
                di.push(pos);
                di.extend_from_slice(&idx[*axis + q..]);
                self.value_at(data, &di)
            }
            IndexOp::GatherElements { axis } => {
                let (data, ind) = (ins[0], ins[1]);
                let ds = self.shape(data);
                let iv = self.value_at(ind, idx)?;
                let mut di = idx.to_vec();
                di[*axis] = self.checked_index(n, ind, "indices", iv, ds[*axis], true)?;
                self.value_at(data, &di)
            }
            IndexOp::GatherND { batch_dims } => {
                let (data, ind) = (ins[0], ins[1]);
                let (ds, is) = (self.shape(data), self.shape(ind));
                let q = is.len();
                let k = is[q - 1] as usize;
                let b = *batch_dims;
                let mut di: Vec<Expr> = idx[..b].to_vec();
                for j in 0..k {
                    let mut ii: Vec<Expr> = idx[..q - 1].to_vec();
                    ii.push(Expr::Int(j as i64));
                    let iv = self.value_at(ind, &ii)?;
                    di.push(self.checked_index(n, ind, "indices", iv, ds[b + j], true)?);
                }
                di.extend_from_slice(&idx[q - 1..]);
                self.value_at(data, &di)
            }
            IndexOp::OneHot { axis, depth } => {
                let (ind, vals) = (ins[0], ins[1]);
                let d = *depth as i64;
                let mut ii = idx.to_vec();
                let k = ii.remove(*axis);
                let iv = self.value_at(ind, &ii)?;
                let dt = self.dtype(ind);
                let iv = if dt.is_float() {
                    Expr::un(UnOp::Trunc, iv)
                } else {
                    iv
                };
                let i = Expr::ToIndex(Box::new(iv));
                let i = Expr::select(
                    bin(BinOp::Lt, i.clone(), Expr::Int(0)),
                    bin(BinOp::Add, i.clone(), Expr::Int(d)),
                    i,
                );
                let vs = self.shape(vals);
                let at = |j: i64| {
                    if vs.is_empty() {
                        vec![]
                    } else {
                        vec![Expr::Int(j)]
                    }
                };
                let on = self.value_at(vals, &at(1))?;
                let off = self.value_at(vals, &at(0))?;
                Ok(Expr::select(bin(BinOp::Eq, i, k), on, off))
            }
            _ => self.unsupported(n, "not an inline index op"),
        }
    }

    fn source(&mut self, n: NodeId, s: &SourceOp, idx: &[Expr], od: DType) -> R<Expr> {
        let node = self.g.node(n);
        match s {
            SourceOp::Fill { value, .. } => {
                let d = value.dtype();
                Ok(if d.is_float() {
                    lit(value.to_f64_vec()[0], d)
                } else if d == DType::U64 {
                    Expr::Lit(Lit::UInt(
                        value.as_slice::<u64>().map(|s| s[0]).unwrap_or(0),
                        d,
                    ))
                } else {
                    lit_i(value.to_i64_vec()[0], d)
                })
            }
            SourceOp::Eye { k, dtype, .. } => {
                let on = bin(
                    BinOp::Eq,
                    bin(BinOp::Sub, idx[1].clone(), idx[0].clone()),
                    Expr::Int(*k),
                );
                Ok(Expr::select(on, lit(1.0, *dtype), lit(0.0, *dtype)))
            }
            SourceOp::Range { .. } => {
                let (start, delta) = (node.inputs[0], node.inputs[2]);
                let z = vec![Expr::Int(0); self.shape(start).len()];
                let s = self.value_at(start, &z)?;
                let zd = vec![Expr::Int(0); self.shape(delta).len()];
                let d = self.value_at(delta, &zd)?;
                if od.is_float() {
                    let w = DType::F64;
                    let i = Expr::cast(w, idx[0].clone());
                    let v = bin(
                        BinOp::Add,
                        Expr::cast(w, s),
                        bin(BinOp::Mul, i, Expr::cast(w, d)),
                    );
                    Ok(Expr::cast(od, v))
                } else {
                    let i = Expr::cast(od, idx[0].clone());
                    Ok(bin(BinOp::Add, s, bin(BinOp::Mul, i, d)))
                }
            }
            SourceOp::DimValues {
                elems,
                shape,
                dtype,
            } => {
                let sh: Vec<i64> = shape.iter().map(|&x| x as i64).collect();
                let flat = self.simp(ravel(idx, &sh));
                let val = |e: &DimValue| match e {
                    DimValue::Int(i) => *i,
                    DimValue::Dim(Dim::Fixed(f)) => *f as i64,
                    DimValue::Dim(Dim::Sym(_)) => 0,
                };
                if let Expr::Int(c) = flat {
                    return Ok(lit_i(val(&elems[c as usize]), *dtype));
                }
                let mut e = lit_i(elems.last().map(val).unwrap_or(0), *dtype);
                for (i, el) in elems.iter().enumerate().rev().skip(1) {
                    e = Expr::select(
                        bin(BinOp::Eq, flat.clone(), Expr::Int(i as i64)),
                        lit_i(val(el), *dtype),
                        e,
                    );
                }
                Ok(e)
            }
        }
    }
}

fn softplus(x: Expr, ct: DType) -> Expr {
    // x > 0 ? x + log(1 + exp(-x)) : log(1 + exp(x))
    let one = lit(1.0, ct);
    let pos = bin(
        BinOp::Add,
        x.clone(),
        Expr::un(
            UnOp::Log,
            bin(
                BinOp::Add,
                one.clone(),
                Expr::un(UnOp::Exp, Expr::un(UnOp::Neg, x.clone())),
            ),
        ),
    );
    let neg = Expr::un(
        UnOp::Log,
        bin(BinOp::Add, one, Expr::un(UnOp::Exp, x.clone())),
    );
    Expr::select(bin(BinOp::Gt, x, lit(0.0, ct)), pos, neg)
}
