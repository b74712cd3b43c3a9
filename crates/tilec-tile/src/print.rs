//! A stable text form of kernels (`tilec print-ir` shows it after lowering and scheduling).

use std::fmt::Write;

use crate::ir::*;

impl std::fmt::Display for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&print_kernel(self))
    }
}

/// Renders a kernel as text.
pub fn print_kernel(k: &Kernel) -> String {
    let mut out = String::new();
    let params: Vec<String> = k.params.iter().map(|&b| buf_decl(k, b)).collect();
    let _ = writeln!(out, "kernel {}({}) {{", k.name, params.join(", "));
    for (i, c) in k.checks.iter().enumerate() {
        let _ = writeln!(out, "  // site {i}: {} of node {} ({})", c.input, c.node, c.op);
    }
    let mut p = Printer { k, out, indent: 1 };
    p.block(&k.body);
    p.out.push_str("}\n");
    p.out
}

fn buf_decl(k: &Kernel, b: BufId) -> String {
    let buf = k.buf(b);
    let dims: Vec<String> = buf.shape.iter().map(|d| d.to_string()).collect();
    let scope = match buf.scope {
        Scope::Global => "",
        Scope::Local => "local ",
        Scope::Register => "reg ",
    };
    format!("{scope}{}: {}[{}]", buf.name, buf.dtype, dims.join(", "))
}

struct Printer<'a> {
    k: &'a Kernel,
    out: String,
    indent: usize,
}

impl Printer<'_> {
    fn line(&mut self, s: &str) {
        for _ in 0..self.indent {
            self.out.push_str("  ");
        }
        self.out.push_str(s);
        self.out.push('\n');
    }

    fn block(&mut self, stmts: &[Stmt]) {
        for s in stmts {
            self.stmt(s);
        }
    }

    fn var(&self, v: VarId) -> String {
        self.k.vars.get(v.0 as usize).map(|i| i.name.clone()).unwrap_or_else(|| format!("v{}", v.0))
    }

    fn stmt(&mut self, s: &Stmt) {
        match s {
            Stmt::For(l) => {
                let kind = match l.kind {
                    LoopKind::Serial => String::new(),
                    LoopKind::Parallel => " parallel".into(),
                    LoopKind::Vectorized => " vectorized".into(),
                    LoopKind::Unrolled => " unrolled".into(),
                    LoopKind::Bound(a) => format!(" bind({a:?})"),
                };
                let head = format!("for {} in 0..{}{} {{", self.var(l.var), l.extent, kind);
                self.line(&head);
                self.indent += 1;
                self.block(&l.body);
                self.indent -= 1;
                self.line("}");
            }
            Stmt::Store { buf, index, value } => {
                let t = format!("{}[{}] = {}", self.k.buf(*buf).name, self.list(index), self.expr(value));
                self.line(&t);
            }
            Stmt::Let { var, value } => {
                let info = self.k.var_info(*var);
                let kw = if info.mutable { "var" } else { "let" };
                let ty = match info.ty {
                    Ty::Index => "idx".to_string(),
                    Ty::Elem(d) => d.to_string(),
                };
                let t = format!("{kw} {}: {ty} = {}", self.var(*var), self.expr(value));
                self.line(&t);
            }
            Stmt::Assign { var, value } => {
                let t = format!("{} = {}", self.var(*var), self.expr(value));
                self.line(&t);
            }
            Stmt::Alloc(b) => {
                let t = format!("alloc {}", buf_decl(self.k, *b));
                self.line(&t);
            }
            Stmt::If { cond, then_, else_ } => {
                let t = format!("if {} {{", self.expr(cond));
                self.line(&t);
                self.indent += 1;
                self.block(then_);
                self.indent -= 1;
                if !else_.is_empty() {
                    self.line("} else {");
                    self.indent += 1;
                    self.block(else_);
                    self.indent -= 1;
                }
                self.line("}");
            }
            Stmt::Barrier => self.line("barrier"),
            Stmt::BlockReduce { var, op, axis } => {
                let t = format!("{} = block_reduce_{}({}, {axis:?})", self.var(*var), format!("{op:?}").to_lowercase(), self.var(*var));
                self.line(&t);
            }
            Stmt::Gemm(g) => {
                let p = g.params;
                let how = if g.vector {
                    "matrix-vector".to_string()
                } else {
                    format!("mr={} nr={} kc={} mc={} nc={}", p.mr, p.nr, p.kc, p.mc, p.nc)
                };
                let t = format!(
                    "gemm[{} x {} x {} x {}] ({how}) acc {}: {} {{",
                    g.batch,
                    g.m,
                    g.n,
                    g.k,
                    g.acc_dtype,
                    self.var(g.acc_var)
                );
                self.line(&t);
                self.indent += 1;
                let (b, i, j, k) = (self.var(g.b_var), self.var(g.i_var), self.var(g.j_var), self.var(g.k_var));
                let a = format!("A({b}, {i}, {k}) = {}", self.expr(&g.a));
                self.line(&a);
                let bb = format!("B({b}, {k}, {j}) = {}", self.expr(&g.b));
                self.line(&bb);
                self.line("epilogue:");
                self.indent += 1;
                self.block(&g.epilogue);
                self.indent -= 2;
                self.line("}");
            }
        }
    }

    fn list(&self, es: &[Expr]) -> String {
        es.iter().map(|e| self.expr(e)).collect::<Vec<_>>().join(", ")
    }

    fn expr(&self, e: &Expr) -> String {
        match e {
            Expr::Int(x) => x.to_string(),
            Expr::Lit(l) => match l {
                Lit::Int(x, d) => format!("{x}:{d}"),
                Lit::UInt(x, d) => format!("{x}:{d}"),
                Lit::Float(x, d) => format!("{x:?}:{d}"),
                Lit::Bool(b) => b.to_string(),
            },
            Expr::Var(v) => self.var(*v),
            Expr::Load(b, idx) => format!("{}[{}]", self.k.buf(*b).name, self.list(idx)),
            Expr::Unary(op, a) => format!("{}({})", format!("{op:?}").to_lowercase(), self.expr(a)),
            Expr::Binary(op, a, b) => {
                let sym = match op {
                    BinOp::Add => "+",
                    BinOp::Sub => "-",
                    BinOp::Mul => "*",
                    BinOp::Div => "/",
                    BinOp::Rem => "%",
                    BinOp::Lt => "<",
                    BinOp::Le => "<=",
                    BinOp::Gt => ">",
                    BinOp::Ge => ">=",
                    BinOp::Eq => "==",
                    BinOp::Ne => "!=",
                    BinOp::And => "&&",
                    BinOp::Or => "||",
                    BinOp::BitAnd => "&",
                    BinOp::BitOr => "|",
                    BinOp::BitXor => "^",
                    BinOp::Shl => "<<",
                    BinOp::Shr => ">>",
                    other => {
                        let name = format!("{other:?}").to_lowercase();
                        return format!("{name}({}, {})", self.expr(a), self.expr(b));
                    }
                };
                format!("({} {sym} {})", self.expr(a), self.expr(b))
            }
            Expr::Select(c, a, b) => format!("select({}, {}, {})", self.expr(c), self.expr(a), self.expr(b)),
            Expr::Cast(d, a) => format!("{d}({})", self.expr(a)),
            Expr::ToIndex(a) => format!("idx({})", self.expr(a)),
            Expr::CheckIndex(a, c) => format!(
                "check{}({}, {}, site {})",
                if c.wrap { "_wrap" } else { "" },
                self.expr(a),
                c.len,
                c.site
            ),
        }
    }
}
