//! GPU schedules: tile-IR → tile-IR transforms that bind a lowered kernel's loops to the
//! GPU's blocks and threads. Each is a kernel family's transform (`crate::families`, whose
//! `schedule_gpu` tries them in the families' order on a kernel alone).
//!
//! - [`rows`]: a row-wise kernel (softmax, normalizations, reductions over rows) as one block
//!   or one warp segment per row, the row's vectors spread over the threads.
//! - [`elementwise`]: a perfect elementwise nest over 16-byte vectors, a few per thread.
//! - [`gemm`]: a single `Gemm` as a block-tiled matrix product on the CUDA cores, and the
//!   folding of a scratch consumer into a GEMM's epilogue.
//! - [`direct`]: any other nest, its independent outer loops over a grid-stride loop.
//!
//! Every schedule keeps the serial semantics: run by the tile interpreter (thread loops
//! serially, block reductions as no-ops) a scheduled kernel computes what the original does.

mod direct;
mod elementwise;
mod gemm;
mod reduce;
mod rows;

use tilec_ir::DType;
use tilec_tile::*;

use crate::error::CudaError;

pub use direct::{schedule_direct, schedule_direct_named};
pub use elementwise::{schedule_elementwise, schedule_elementwise_with};
pub use gemm::{fuse_scratch_epilogue, schedule_gemm, GEMM_BK, GEMM_THREADS};
pub use rows::{schedule_rows, RowOptions};
pub use tilec_opt::target::GpuTarget;

pub(crate) fn bad(k: &Kernel, msg: impl Into<String>) -> CudaError {
    CudaError::Schedule {
        kernel: k.name.clone(),
        msg: msg.into(),
    }
}

/// A new variable named `base` (with a number appended when the name is taken).
pub(crate) fn fresh(k: &mut Kernel, base: &str, ty: Ty, mutable: bool) -> VarId {
    let mut name = base.to_string();
    let mut n = 0;
    while k.var_named(&name).is_some() {
        n += 1;
        name = format!("{base}{n}");
    }
    k.new_var(name, ty, mutable)
}

/// A new buffer named `base` (with a number appended when the name is taken).
pub(crate) fn fresh_buf(k: &mut Kernel, base: &str, dtype: DType, shape: Vec<i64>, scope: Scope) -> BufId {
    let mut name = base.to_string();
    let mut n = 0;
    while k.buffers.iter().any(|b| b.name == name) {
        n += 1;
        name = format!("{base}{n}");
    }
    k.buffer(name, dtype, shape, scope)
}

/// Sibling nests merged into one: when the body is several loop nests and each later one's
/// outer loops have the extents of the first one's (its loops down to a body that is not a
/// single loop), the later bodies below those loops join the first's, their variables renamed.
/// Taken only when no nest reads or writes a buffer another one writes, so the order of their
/// iterations does not matter. This is a normalization kept beside the residual it writes (a
/// group with two outputs): one row nest, which the row schedule spreads over the GPU, where
/// two nests would run on one block.
pub fn fuse_sibling_nests(k: &Kernel) -> Option<Kernel> {
    if k.body.len() < 2 || !k.body.iter().all(|s| matches!(s, Stmt::For(_))) {
        return None;
    }
    let (outer, _) = row_nest(&k.body[..1]);
    if outer.is_empty() || outer.iter().any(|l| l.kind != LoopKind::Serial) {
        return None;
    }
    let depth = outer.len();
    // Buffers each nest stores to and reads.
    let io = |s: &Stmt| {
        let (mut w, mut r) = (std::collections::HashSet::new(), std::collections::HashSet::new());
        s.visit(&mut |x| {
            if let Stmt::Store { buf, .. } = x {
                w.insert(*buf);
            }
        });
        each_expr(s, &mut |e| {
            if let Expr::Load(b, _) = e {
                r.insert(*b);
            }
        });
        (w, r)
    };
    let nests: Vec<_> = k.body.iter().map(io).collect();
    for (i, (wi, ri)) in nests.iter().enumerate() {
        for (j, (wj, rj)) in nests.iter().enumerate() {
            if i != j && (wi.iter().any(|b| rj.contains(b) || wj.contains(b)) || wj.iter().any(|b| ri.contains(b))) {
                return None;
            }
        }
    }
    let mut fused = k.body[0].clone();
    let mut extra = vec![];
    for s in &k.body[1..] {
        let (chain, _) = row_nest(std::slice::from_ref(s));
        if chain.len() < depth || chain.iter().zip(&outer).any(|(a, b)| a.extent != b.extent || a.kind != LoopKind::Serial) {
            return None;
        }
        let mut body = chain[depth - 1].body.clone();
        for (a, b) in chain.iter().zip(&outer) {
            for st in &mut body {
                st.substitute(a.var, &Expr::Var(b.var));
            }
        }
        extra.extend(body);
    }
    // Append to the innermost outer loop of the first nest.
    let mut cur = &mut fused;
    for _ in 1..depth {
        let Stmt::For(l) = cur else { return None };
        cur = &mut l.body[0];
    }
    let Stmt::For(l) = cur else { return None };
    l.body.extend(extra);
    let mut out = k.clone();
    out.body = vec![fused];
    Some(out)
}

/// The chain of loops from the top of `body` down to the first body that is not a single loop
/// (a nest's outer loops).
pub(crate) fn row_nest(body: &[Stmt]) -> (Vec<&Loop>, &[Stmt]) {
    let mut loops = vec![];
    let mut cur = body;
    while let [Stmt::For(l)] = cur {
        loops.push(l);
        cur = &l.body;
    }
    (loops, cur)
}

/// Vector width in elements for rows of `c` elements of the given dtypes: 16 bytes of the
/// narrowest type, halved until it divides `c`.
pub(crate) fn vector_lanes(c: i64, dtypes: &[DType]) -> i64 {
    let min = dtypes
        .iter()
        .map(|d| d.size_bytes() as i64)
        .min()
        .unwrap_or(4)
        .max(1);
    let mut v = (16 / min).max(1);
    while v > 1 && c % v != 0 {
        v /= 2;
    }
    v
}

pub(crate) fn global_dtypes(k: &Kernel, stmts: &[Stmt]) -> Vec<DType> {
    let mut out = vec![];
    for s in stmts {
        s.visit(&mut |s| {
            if let Stmt::Store { buf, .. } = s {
                if k.buf(*buf).scope == Scope::Global {
                    out.push(k.buf(*buf).dtype);
                }
            }
        });
        each_expr(s, &mut |e| {
            if let Expr::Load(b, _) = e {
                if k.buf(*b).scope == Scope::Global {
                    out.push(k.buf(*b).dtype);
                }
            }
        });
    }
    out
}

/// Calls `f` on every expression (and sub-expression) a statement and its nested statements
/// hold: stored values and indices, lets, assignments, conditions, GEMM operands.
pub(crate) fn each_expr(s: &Stmt, f: &mut dyn FnMut(&Expr)) {
    s.visit(&mut |s| match s {
        Stmt::Store { index, value, .. } => {
            index.iter().for_each(|e| e.visit(&mut |x| f(x)));
            value.visit(&mut |x| f(x));
        }
        Stmt::Let { value, .. } | Stmt::Assign { value, .. } => value.visit(&mut |x| f(x)),
        Stmt::If { cond, .. } => cond.visit(&mut |x| f(x)),
        Stmt::Gemm(g) => {
            g.a.visit(&mut |x| f(x));
            g.b.visit(&mut |x| f(x));
        }
        _ => {}
    });
}

/// Collapses the loops `loops` (outermost first) into one variable `flat`: returns each loop
/// variable's value in terms of `flat`.
pub(crate) fn decompose(loops: &[(VarId, i64)], flat: Expr) -> Vec<(VarId, Expr)> {
    let mut out = vec![];
    let mut inner = 1i64;
    for &(v, e) in loops.iter().rev() {
        let q = Expr::div(flat.clone(), inner);
        let val = if inner * e == loops.iter().map(|l| l.1).product::<i64>() {
            q
        } else {
            Expr::rem(q, e)
        };
        out.push((v, val));
        inner *= e;
    }
    out
}

pub(crate) fn subst_all(stmts: &mut [Stmt], subs: &[(VarId, Expr)]) {
    for s in stmts.iter_mut() {
        for (v, e) in subs {
            s.substitute(*v, e);
        }
    }
}


pub(crate) fn v(x: VarId) -> Expr {
    Expr::Var(x)
}

pub(crate) fn lt(a: Expr, n: i64) -> Expr {
    Expr::bin(BinOp::Lt, a, Expr::Int(n))
}

pub(crate) fn and(a: Option<Expr>, b: Option<Expr>) -> Option<Expr> {
    match (a, b) {
        (Some(a), Some(b)) => Some(Expr::bin(BinOp::And, a, b)),
        (a, None) => a,
        (None, b) => b,
    }
}

pub(crate) fn guard(cond: Option<Expr>, then_: Vec<Stmt>, else_: Vec<Stmt>) -> Vec<Stmt> {
    match cond {
        Some(c) => vec![Stmt::If { cond: c, then_, else_ }],
        None => then_,
    }
}

pub(crate) fn bound(var: VarId, extent: i64, axis: GpuAxis, body: Vec<Stmt>) -> Stmt {
    Stmt::For(Loop { var, extent, kind: LoopKind::Bound(axis), body })
}

pub(crate) fn unrolled(var: VarId, extent: i64, body: Vec<Stmt>) -> Stmt {
    Stmt::For(Loop { var, extent, kind: LoopKind::Unrolled, body })
}

pub(crate) fn zero_of(d: DType) -> Expr {
    if d.is_float() {
        Expr::Lit(Lit::Float(0.0, d))
    } else if d == DType::Bool {
        Expr::Lit(Lit::Bool(false))
    } else if d.is_signed_int() {
        Expr::Lit(Lit::Int(0, d))
    } else {
        Expr::Lit(Lit::UInt(0, d))
    }
}

/// Calls `f` on every expression of `s` and its sub-expressions (loads' indices included).
pub(crate) fn each_expr_in(s: &Stmt, f: &mut impl FnMut(&Expr)) {
    let mut c = s.clone();
    c.map_exprs(&mut |e| {
        e.visit(f);
        e
    });
}
