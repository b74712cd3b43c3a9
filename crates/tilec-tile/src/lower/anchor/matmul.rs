//! Matrix products: float matmul as a `Gemm`, integer matmul and einsum as direct nests.

use tilec_ir::op::LinalgOp;
use tilec_ir::{DType, NodeId, Op};

use super::common::{acc_dtype, output_nest};
use super::super::{bin, compute_dtype, lit, unravel, Lowerer, R};
use crate::ir::*;

pub(super) fn gemm_params() -> GemmParams {
    GemmParams {
        mr: 6,
        nr: 16,
        kc: 256,
        mc: 96,
        nc: 2048,
    }
}

/// The variables of one product over `batch x m x nn x k` (loop variables and the accumulator)
/// and its extents: [`GemmVars::gemm`] builds the product from its operands and epilogue.
pub(super) struct GemmVars {
    pub b: VarId,
    pub i: VarId,
    pub j: VarId,
    pub k: VarId,
    pub acc: VarId,
    extents: [i64; 4],
    acc_dtype: DType,
}

pub(super) fn gemm_vars(l: &mut Lowerer, batch: i64, m: i64, nn: i64, k: i64, acc_d: DType) -> GemmVars {
    GemmVars {
        b: l.loop_var("gb", batch),
        i: l.loop_var("gi", m),
        j: l.loop_var("gj", nn),
        k: l.loop_var("gk", k),
        acc: l.elem_var("acc", acc_d, false),
        extents: [batch, m, nn, k],
        acc_dtype: acc_d,
    }
}

impl GemmVars {
    /// The product `C[b, i, j] = sum over k of a * b` (`a` and `b` expressions of these
    /// variables), `epilogue` run per element of C with the sum in `acc`; default parameters.
    pub(super) fn gemm(&self, a: Expr, b: Expr, epilogue: Vec<Stmt>) -> Stmt {
        let [batch, m, n, k] = self.extents;
        Stmt::Gemm(Box::new(Gemm {
            batch,
            m,
            n,
            k,
            b_var: self.b,
            i_var: self.i,
            j_var: self.j,
            k_var: self.k,
            acc_var: self.acc,
            acc_dtype: self.acc_dtype,
            a,
            b,
            epilogue,
            params: gemm_params(),
            vector: false,
        }))
    }
}

/// Builds an operand expression without temporaries (GEMM operands are pure expressions).
pub(super) fn operand(l: &mut Lowerer, f: &mut dyn FnMut(&mut Lowerer) -> R<Expr>) -> R<Expr> {
    l.without_cse(f)
}

pub(super) fn matmul(l: &mut Lowerer, n: NodeId, _: &Op) -> R<Vec<Stmt>> {
    let node = l.node(n);
    let (a, b, out) = (node.inputs[0], node.inputs[1], node.outputs[0]);
    let (sa, sb, so) = (l.shape(a), l.shape(b), l.shape(out));
    let (a1, b1) = (sa.len() == 1, sb.len() == 1);
    let m = if a1 { 1 } else { sa[sa.len() - 2] };
    let k = sa[sa.len() - 1];
    let nn = if b1 { 1 } else { sb[sb.len() - 1] };
    let batch_shape: Vec<i64> = so[..so.len() - usize::from(!a1) - usize::from(!b1)].to_vec();
    let batch: i64 = batch_shape.iter().product();
    let d = l.dtype(out);
    let float = d.is_float();
    if !float {
        // Integer matmul: a direct loop nest accumulating in i64.
        let ad = acc_dtype(d);
        return output_nest(l, &so, &mut |l, oidx| {
            let nb = batch_shape.len();
            let bi = &oidx[..nb];
            let (i, j) = (
                if a1 { Expr::Int(0) } else { oidx[nb].clone() },
                if b1 {
                    Expr::Int(0)
                } else {
                    oidx[oidx.len() - 1].clone()
                },
            );
            let kv = l.loop_var("r", k);
            let acc = l.elem_var("acc", ad, true);
            let ai = mm_index(&sa, bi, &i, &Expr::Var(kv), true);
            let bidx = mm_index(&sb, bi, &Expr::Var(kv), &j, false);
            let m2 = l.begin_block();
            let av = l.value_at(a, &ai);
            let bv = l.value_at(b, &bidx);
            let mut inner = l.end_block(m2);
            let (av, bv) = (av?, bv?);
            inner.push(Stmt::Assign {
                var: acc,
                value: bin(
                    BinOp::Add,
                    Expr::Var(acc),
                    bin(BinOp::Mul, Expr::cast(ad, av), Expr::cast(ad, bv)),
                ),
            });
            let mut st = vec![
                Stmt::Let {
                    var: acc,
                    value: lit(0.0, ad),
                },
                Stmt::for_(kv, k, inner),
            ];
            st.extend(l.epilogue(out, oidx, Expr::cast(d, Expr::Var(acc)))?);
            Ok(st)
        });
    }
    let acc_d = compute_dtype(d);
    // A batch of thin products sharing one 2-D B (`[S, B, E] @ W` after a transpose, as
    // nn.MultiheadAttention's in-projection reads its sequence-first input) is one product
    // with the batch folded into the rows: `S * B` rows instead of S products of B rows,
    // which would fill the register tiles' rows by B / mr only.
    let fold = !a1 && sb.len() == 2 && batch > 1 && m < FOLD_BELOW_ROWS;
    let (gbatch, gm) = if fold { (1, batch * m) } else { (batch, m) };
    let gv = gemm_vars(l, gbatch, gm, nn, k, acc_d);
    let (bidx, vi) = if fold {
        let r = Expr::Var(gv.i);
        let bidx = unravel(l.simp(bin(BinOp::Div, r.clone(), Expr::Int(m))), &batch_shape);
        (bidx, l.simp(bin(BinOp::Rem, r, Expr::Int(m))))
    } else {
        (unravel(Expr::Var(gv.b), &batch_shape), Expr::Var(gv.i))
    };
    let (vj, vk) = (Expr::Var(gv.j), Expr::Var(gv.k));
    let ai = mm_index(&sa, &bidx, &vi, &vk, true);
    let bi = mm_index(&sb, &bidx, &vk, &vj, false);
    let ae = operand(l, &mut |l| l.value_at(a, &ai))?;
    let be = operand(l, &mut |l| l.value_at(b, &bi))?;
    let mut oidx = bidx.clone();
    if !a1 {
        oidx.push(vi.clone());
    }
    if !b1 {
        oidx.push(vj.clone());
    }
    let accv = if acc_d != d {
        Expr::cast(d, Expr::Var(gv.acc))
    } else {
        Expr::Var(gv.acc)
    };
    let m2 = l.begin_block();
    let epi = l.epilogue(out, &oidx, accv);
    let mut e = l.end_block(m2);
    e.extend(epi?);
    Ok(vec![gv.gemm(l.up(ae, d), l.up(be, d), e)])
}

/// Products with fewer rows than this whose B is shared by the whole batch are lowered as
/// one product over the batch's rows.
const FOLD_BELOW_ROWS: i64 = 16;

/// Index into a matmul operand of shape `s` (rank 1 operands are vectors) for output batch
/// index `bidx` and matrix coordinates (`r`, `c`); `lhs` says which operand.
fn mm_index(s: &[i64], bidx: &[Expr], r: &Expr, c: &Expr, lhs: bool) -> Vec<Expr> {
    if s.len() == 1 {
        return vec![if lhs { c.clone() } else { r.clone() }];
    }
    let nb = s.len() - 2;
    let off = bidx.len() - nb;
    let mut v: Vec<Expr> = (0..nb)
        .map(|i| {
            if s[i] == 1 {
                Expr::Int(0)
            } else {
                bidx[off + i].clone()
            }
        })
        .collect();
    v.push(r.clone());
    v.push(c.clone());
    v
}

pub(super) fn einsum(l: &mut Lowerer, n: NodeId, op: &Op) -> R<Vec<Stmt>> {
    let Op::Linalg(LinalgOp::Einsum { inputs: subs, output }) = op else {
        return l.unsupported(n, "not an einsum");
    };
    let node = l.node(n);
    let ins = node.inputs.clone();
    let out = node.outputs[0];
    let os = l.shape(out);
    let d = l.dtype(out);
    let cd = acc_dtype(d);
    // Extent of every label (the largest over its occurrences: size-1 dims broadcast).
    let mut ext: Vec<(u8, i64)> = Vec::new();
    for (t, s) in subs.iter().enumerate() {
        let sh = l.shape(ins[t]);
        for (i, &lb) in s.iter().enumerate() {
            match ext.iter_mut().find(|e| e.0 == lb) {
                Some(e) => e.1 = e.1.max(sh[i]),
                None => ext.push((lb, sh[i])),
            }
        }
    }
    let summed: Vec<(u8, i64)> = ext
        .iter()
        .copied()
        .filter(|(lb, _)| !output.contains(lb))
        .collect();
    let subs = subs.to_vec();
    let output = output.to_vec();
    output_nest(l, &os, &mut |l, oidx| {
        let mut at: Vec<(u8, Expr)> = output
            .iter()
            .zip(oidx)
            .map(|(&lb, e)| (lb, e.clone()))
            .collect();
        let mut loops = Vec::new();
        for &(lb, e) in &summed {
            if e == 1 {
                at.push((lb, Expr::Int(0)));
            } else {
                let v = l.loop_var("r", e);
                loops.push((v, e));
                at.push((lb, Expr::Var(v)));
            }
        }
        let acc = l.elem_var("acc", cd, true);
        let m2 = l.begin_block();
        let mut prod: Option<Expr> = None;
        for (t, s) in subs.iter().enumerate() {
            let sh = l.shape(ins[t]);
            let idx: Vec<Expr> = s
                .iter()
                .enumerate()
                .map(|(i, lb)| {
                    if sh[i] == 1 {
                        Expr::Int(0)
                    } else {
                        at.iter()
                            .find(|a| a.0 == *lb)
                            .map(|a| a.1.clone())
                            .unwrap_or(Expr::Int(0))
                    }
                })
                .collect();
            let v = l.value_at(ins[t], &idx);
            let v = match v {
                Ok(v) => v,
                Err(e) => {
                    l.end_block(m2);
                    return Err(e);
                }
            };
            let v = if d.is_float() {
                l.up(v, l.dtype(ins[t]))
            } else {
                Expr::cast(cd, v)
            };
            prod = Some(match prod {
                None => v,
                Some(p) => bin(BinOp::Mul, p, v),
            });
        }
        let mut inner = l.end_block(m2);
        inner.push(Stmt::Assign {
            var: acc,
            value: bin(BinOp::Add, Expr::Var(acc), prod.unwrap_or(lit(1.0, cd))),
        });
        let mut st = vec![Stmt::Let {
            var: acc,
            value: lit(0.0, cd),
        }];
        st.extend(Lowerer::nest(&loops, inner));
        let r = if cd != d {
            Expr::cast(d, Expr::Var(acc))
        } else {
            Expr::Var(acc)
        };
        st.extend(l.epilogue(out, oidx, r)?);
        Ok(st)
    })
}
