//! Losses reduced over the whole target (NLL loss with a sum or mean reduction).

use tilec_ir::op::{LossReduction, NormOp};
use tilec_ir::{NodeId, Op};

use super::common::accumulate;
use super::super::{bin, compute_dtype, lit, Lowerer, R};
use crate::ir::*;

pub(super) fn nll_loss(l: &mut Lowerer, n: NodeId, op: &Op) -> R<Vec<Stmt>> {
    let Op::Norm(NormOp::NllLoss { reduction, .. }) = op else {
        return l.unsupported(n, "not an nll loss");
    };
    let node = l.node(n);
    let ins = node.inputs.clone();
    let y = node.outputs[0];
    let d = l.dtype(ins[0]);
    let cd = compute_dtype(d);
    // Sum or weighted mean of the per-element losses over the whole target.
    let target = ins[1];
    let ts = l.shape(target);
    let row: Vec<(usize, i64)> = ts.iter().copied().enumerate().collect();
    let base = vec![Expr::Int(0); ts.len()];
    let mean = *reduction == LossReduction::Mean;
    let m = l.begin_block();
    let res = (|| -> R<Vec<Stmt>> {
        let (mut st, acc) = accumulate(
            l,
            &row,
            &base,
            vec![(cd, lit(0.0, cd)), (cd, lit(0.0, cd))],
            &mut |l, i, a| {
                let (loss, wt) = l.nll_element(n, i)?;
                Ok(vec![
                    bin(BinOp::Add, a[0].clone(), loss),
                    bin(BinOp::Add, a[1].clone(), wt),
                ])
            },
        )?;
        let r = if mean {
            bin(BinOp::Div, acc[0].clone(), acc[1].clone())
        } else {
            acc[0].clone()
        };
        st.extend(l.take_lets());
        st.extend(l.epilogue(y, &[], l.down(r, d))?);
        Ok(st)
    })();
    let mut inner = l.end_block(m);
    inner.extend(res?);
    Ok(inner)
}
