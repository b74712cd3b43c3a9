//! Local buffers prepared from parameters alone, packed once ahead of the calls.
//!
//! A kernel body that opens with `Alloc(b)` followed by one loop nest that stores only into
//! `b`, reads only parameters the kernel never writes, uses no variable from outside the nest
//! and checks no index (the `[taps, M, C]` transposed weights of `cpu.depthwise`), and never
//! stores into `b` again, gets a pack slot ([`PackOperand::Buffer`]): `NAME__pack` runs the
//! nest into the slot's buffer, and `NAME__packed` with that slot filled reads it instead of
//! running the nest; with the slot null (a parameter that is not a constant) the nest runs on
//! every call, as before.

use std::collections::HashSet;

use tilec_tile::ir::*;

use crate::gemm::{PackOperand, PackSlot};
use crate::render::{storage_type, Ctx, RenderError, Renderer, STACK_LIMIT_BYTES};

/// What a walk over a loop nest found.
#[derive(Default)]
struct Facts {
    defined: HashSet<VarId>,
    used: HashSet<VarId>,
    loads: HashSet<BufId>,
    stores: HashSet<BufId>,
    /// Anything that rules the nest out: a parallel or GPU loop, an index check, an `Alloc`,
    /// a gemm, a barrier or a cross-thread reduction.
    other: bool,
}

fn expr(e: &Expr, f: &mut Facts) {
    e.visit(&mut |e| match e {
        Expr::Var(v) => {
            f.used.insert(*v);
        }
        Expr::Load(b, _) => {
            f.loads.insert(*b);
        }
        Expr::CheckIndex(..) => f.other = true,
        _ => {}
    });
}

fn walk(s: &Stmt, f: &mut Facts) {
    match s {
        Stmt::For(l) => {
            f.defined.insert(l.var);
            if matches!(l.kind, LoopKind::Parallel | LoopKind::Bound(_)) {
                f.other = true;
            }
            l.body.iter().for_each(|s| walk(s, f));
        }
        Stmt::Store { buf, index, value } => {
            f.stores.insert(*buf);
            index.iter().for_each(|e| expr(e, f));
            expr(value, f);
        }
        Stmt::Let { var, value } => {
            f.defined.insert(*var);
            expr(value, f);
        }
        Stmt::Assign { var, value } => {
            f.used.insert(*var);
            expr(value, f);
        }
        Stmt::If { cond, then_, else_ } => {
            expr(cond, f);
            then_.iter().chain(else_).for_each(|s| walk(s, f));
        }
        Stmt::Alloc(_) | Stmt::Barrier | Stmt::Gemm(_) | Stmt::BlockReduce { .. } => f.other = true,
    }
}

/// If `body[i]` is `Alloc(b)` and `body[i + 1]` a nest preparing `b` (see the module doc),
/// `b` and the indices of the parameters the nest reads.
pub(crate) fn prepared(r: &Renderer, body: &[Stmt], i: usize) -> Option<(BufId, Vec<usize>)> {
    let (Some(Stmt::Alloc(b)), Some(nest @ Stmt::For(_))) = (body.get(i), body.get(i + 1)) else {
        return None;
    };
    let k = r.k;
    if k.buf(*b).scope != Scope::Local {
        return None;
    }
    let mut f = Facts::default();
    walk(nest, &mut f);
    if f.other || f.stores.len() != 1 || !f.stores.contains(b) || !f.used.is_subset(&f.defined) {
        return None;
    }
    let mut params = vec![];
    for q in &f.loads {
        let pos = k.params.iter().position(|p| p == q)?;
        if r.written.contains(q) {
            return None;
        }
        params.push(pos);
    }
    params.sort_unstable();
    // Nothing else in the body stores into `b` (or allocates it again).
    for (j, s) in body.iter().enumerate() {
        if j == i || j == i + 1 {
            continue;
        }
        let mut g = Facts::default();
        let mut again = false;
        s.visit(&mut |s| again |= matches!(s, Stmt::Alloc(x) if x == b));
        walk(s, &mut g);
        if again || g.stores.contains(b) {
            return None;
        }
    }
    Some((*b, params))
}

/// Renders `Alloc(b)` and its preparing `nest` (found by [`prepared`]) with a pack slot
/// reading `params`; returns the line that frees the buffer at the end of the body, if any.
pub(crate) fn render(r: &mut Renderer, b: BufId, params: Vec<usize>, nest: &Stmt, ctx: Ctx) -> Result<Option<String>, RenderError> {
    let buf = r.k.buf(b);
    let t = storage_type(buf.dtype);
    let n = buf.numel().max(1);
    let bytes = n.saturating_mul(buf.dtype.size_bytes() as i64);
    // The nest's code, one scope deeper than the body.
    let saved = std::mem::take(&mut r.out);
    r.open_scope();
    let res = r.stmt(nest, ctx);
    r.close_scope();
    let code = std::mem::replace(&mut r.out, saved);
    res?;
    if let Some(l) = r.locals.last_mut() {
        l.push(b);
    }
    let s = r.packs.len();
    let pack = format!("{{\n        {t} *TC_RESTRICT buf{i} = ({t} *)tc_dst;\n{code}    }}", i = b.0);
    r.packs.push((PackSlot { operand: PackOperand::Buffer, params, bytes: (bytes as usize).max(64) }, pack));
    let i = b.0;
    r.line(&format!("{t} *TC_RESTRICT buf{i};"));
    let (own, free) = if bytes > STACK_LIMIT_BYTES {
        r.line(&format!("void *tc_own{i} = NULL;"));
        (format!("buf{i} = ({t} *)(tc_own{i} = tc_alloc({bytes}));"), Some(format!("free(tc_own{i});")))
    } else {
        r.line(&format!("{t} tc_stack{i}[{n}] __attribute__((aligned(64)));"));
        (format!("buf{i} = tc_stack{i};"), None)
    };
    r.line(&format!("if (tc_pk && tc_pk[{s}]) {{"));
    r.line(&format!("    buf{i} = ({t} *)tc_pk[{s}];"));
    r.line("} else {");
    r.line(&format!("    {own}"));
    r.out.push_str(&code);
    r.line("}");
    Ok(free)
}
