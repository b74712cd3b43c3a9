//! Parallel regions in the generated C: the code of one chunk outlined into a function of its
//! own, called through the thread pool (`tc_parallel` in the prelude, [`crate::pool`]).
//!
//! The outlined function sees what the kernel had in scope at the region: the variables,
//! parameters and local buffers its code names, passed by value (buffers as pointers) in a
//! context struct on the caller's stack, so nothing is allocated per region. Values do not flow
//! back out of a region through scalars (the schedules only make loops parallel whose
//! iterations are independent), and buffers are shared as they were under OpenMP.

use std::collections::HashSet;
use std::fmt::Write;

use tilec_tile::ir::{Expr, Loop, Scope, Stmt};

use crate::render::{storage_type, value_type, Ctx, RenderError, Renderer};

/// Parallel loops with less estimated work than this ([`loop_work`]) run on their caller:
/// about 10 µs on one core for vectorized code (50 or so operations a nanosecond). A region costs its caller a few µs on a quiet machine, and on a
/// loaded one a worker descheduled inside its chunk holds the region until it runs again
/// (MobileNet-V3's squeeze-and-excitation pools took 6-8x their one-thread time on 2 threads).
pub const LOOP_PARALLEL_MIN_WORK: i64 = 1 << 19;

/// The work of loop `l` (all its iterations), counted in operations: every load, store,
/// arithmetic node and select of the values once per execution (index arithmetic is free), a gemm's multiply-adds, the longer branch
/// of an `if`. A coarse count that only sizes regions; vector width is not considered.
pub fn loop_work(l: &Loop) -> i64 {
    l.extent.max(0).saturating_mul(stmts_work(&l.body))
}

fn stmts_work(body: &[Stmt]) -> i64 {
    body.iter()
        .fold(0i64, |acc, s| acc.saturating_add(stmt_work(s)))
}

fn stmt_work(s: &Stmt) -> i64 {
    match s {
        Stmt::For(l) => loop_work(l),
        Stmt::Store { index, value, .. } => index
            .iter()
            .map(loads_in)
            .fold(1i64.saturating_add(expr_work(value)), i64::saturating_add),
        Stmt::Let { value, .. } | Stmt::Assign { value, .. } => expr_work(value),
        Stmt::If { cond, then_, else_ } => {
            expr_work(cond).saturating_add(stmts_work(then_).max(stmts_work(else_)))
        }
        Stmt::Gemm(g) => g
            .batch
            .saturating_mul(g.m)
            .saturating_mul(g.n)
            .saturating_mul(g.k.max(1)),
        Stmt::Alloc(_) | Stmt::Barrier | Stmt::BlockReduce { .. } => 0,
    }
}

fn expr_work(e: &Expr) -> i64 {
    match e {
        Expr::Int(_) | Expr::Lit(_) | Expr::Var(_) => 0,
        // Index arithmetic is not counted (the compiler strength-reduces it); loads inside an
        // index (gathers) are.
        Expr::Load(_, idx) => idx.iter().map(loads_in).fold(1i64, i64::saturating_add),
        Expr::Unary(_, a) => 1i64.saturating_add(expr_work(a)),
        Expr::Cast(_, a) | Expr::ToIndex(a) | Expr::CheckIndex(a, _) => expr_work(a),
        Expr::Binary(_, a, b) => 1i64
            .saturating_add(expr_work(a))
            .saturating_add(expr_work(b)),
        Expr::Select(c, a, b) => 1i64
            .saturating_add(expr_work(c))
            .saturating_add(expr_work(a))
            .saturating_add(expr_work(b)),
    }
}

fn loads_in(e: &Expr) -> i64 {
    let mut n = 0i64;
    e.visit(&mut |e| {
        if let Expr::Load(..) = e {
            n = n.saturating_add(1);
        }
    });
    n
}

/// A name the chunk's code may read from the enclosing function, with its C type.
struct Capture {
    name: String,
    ty: String,
}

impl Renderer<'_> {
    /// A parallel loop: its iterations split into `tc_loop_chunks(extent)` contiguous chunks.
    pub(crate) fn parallel_loop(&mut self, l: &Loop, ctx: Ctx) -> Result<(), RenderError> {
        let v = self.var_name(l.var);
        let extent = l.extent;
        let inner = Ctx {
            in_parallel: true,
            ..ctx
        };
        self.parallel_region(&format!("tc_loop_chunks({extent}LL)"), |r| {
            r.line("int64_t tc_lo, tc_hi;");
            r.line(&format!(
                "tc_chunk_range({extent}LL, tc_c, tc_n, &tc_lo, &tc_hi);"
            ));
            r.line(&format!("for (int64_t {v} = tc_lo; {v} < tc_hi; ++{v}) {{"));
            r.open_scope();
            r.declare(l.var);
            for s in &l.body {
                r.stmt(s, inner)?;
            }
            r.close_scope();
            r.line("}");
            Ok(())
        })
    }

    /// Renders a parallel region of `chunks` chunks (a C expression): `body` writes the code of
    /// one chunk, with `tc_c` (the chunk) and `tc_n` (the number of chunks) in scope.
    pub(crate) fn parallel_region(
        &mut self,
        chunks: &str,
        body: impl FnOnce(&mut Self) -> Result<(), RenderError>,
    ) -> Result<(), RenderError> {
        let name = format!("{}__r{}", self.symbol, self.regions);
        self.regions += 1;
        let candidates = self.captures();
        let saved_out = std::mem::take(&mut self.out);
        let saved_indent = self.indent;
        self.indent = 1;
        let res = body(self);
        self.indent = saved_indent;
        let code = std::mem::replace(&mut self.out, saved_out);
        res?;
        let used = identifiers(&code);
        let caps: Vec<Capture> = candidates
            .into_iter()
            .filter(|c| used.contains(c.name.as_str()))
            .collect();

        let mut f = String::new();
        let _ = writeln!(f, "struct {name}_x {{");
        for c in &caps {
            let _ = writeln!(f, "    {} {};", c.ty, c.name);
        }
        if caps.is_empty() {
            f.push_str("    char tc_unused;\n");
        }
        f.push_str("};\n");
        let _ = writeln!(
            f,
            "static void {name}(void *tc_xp, int64_t tc_c, int64_t tc_n) {{"
        );
        let _ = writeln!(
            f,
            "    const struct {name}_x *tc_x = (const struct {name}_x *)tc_xp; (void)tc_x; (void)tc_c; (void)tc_n;"
        );
        for c in &caps {
            let _ = writeln!(f, "    {} {n} = tc_x->{n};", c.ty, n = c.name);
        }
        f.push_str(&code);
        f.push_str("}\n");
        self.pre.push_str(&f);

        let init: Vec<&str> = caps.iter().map(|c| c.name.as_str()).collect();
        let init = if init.is_empty() {
            "0".to_string()
        } else {
            init.join(", ")
        };
        self.line("{");
        self.line(&format!("    struct {name}_x tc_x = {{ {init} }};"));
        self.line(&format!("    tc_parallel({name}, &tc_x, {chunks});"));
        self.line("}");
        Ok(())
    }

    /// Everything in scope that a chunk may read: variables, parameters, local buffers, the
    /// run's status and the packed operands.
    fn captures(&self) -> Vec<Capture> {
        let k = self.k;
        let mut out = vec![];
        let mut vars: Vec<_> = self.declared.iter().flatten().copied().collect();
        vars.sort();
        vars.dedup();
        for v in vars {
            out.push(Capture {
                name: self.var_name(v),
                ty: value_type(k.var_info(v).ty).to_string(),
            });
        }
        let bufs = k.params.iter().chain(self.locals.iter().flatten());
        for &b in bufs {
            let buf = k.buf(b);
            let cst = if buf.scope == Scope::Global && !self.written.contains(&b) {
                "const "
            } else {
                ""
            };
            out.push(Capture {
                name: format!("buf{}", b.0),
                ty: format!("{cst}{} *TC_RESTRICT", storage_type(buf.dtype)),
            });
        }
        if !k.checks.is_empty() {
            out.push(Capture {
                name: "tc_st".into(),
                ty: "int64_t *".into(),
            });
        }
        out.push(Capture {
            name: "tc_pk".into(),
            ty: "void *const *".into(),
        });
        out
    }
}

/// The C identifiers in `code`.
fn identifiers(code: &str) -> HashSet<&str> {
    let mut out = HashSet::new();
    let b = code.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            out.insert(&code[start..i]);
        } else if c.is_ascii_digit() {
            // A number (with any suffix) is no identifier.
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::identifiers;

    #[test]
    fn identifiers_skip_numbers_and_split_on_punctuation() {
        let ids = identifiers("buf3[(v12) * 4LL + 1.5e3f] = tc_x->v7;");
        for id in ["buf3", "v12", "tc_x", "v7"] {
            assert!(ids.contains(id), "{id}");
        }
        assert!(!ids.contains("LL") && !ids.contains("e3f") && !ids.contains("f"));
    }
}
