//! Data structures of the tile IR.
//!
//! A [`Kernel`] owns its buffers and scalar variables; statements refer to them by id. Global
//! buffers listed in `params` are the kernel's arguments, in ABI order. Loops run from 0 to a
//! constant extent with step 1; schedule primitives (split, reorder, ...) rewrite loops and the
//! index expressions that use their variables.

use tilec_ir::DType;

/// A buffer of the kernel.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufId(pub u32);

/// A scalar variable: a loop index, a `let` value or a mutable accumulator.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VarId(pub u32);

/// Where a buffer lives.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Main memory, passed in by the caller (a kernel argument).
    Global,
    /// Scratch local to one execution of the enclosing block: a stack array on the CPU, shared
    /// memory on a GPU.
    Local,
    /// Small arrays the back end keeps in registers (fully unrolled indices).
    Register,
}

/// A dense, row-major buffer.
#[derive(Clone, Debug, PartialEq)]
pub struct Buffer {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<i64>,
    pub scope: Scope,
}

impl Buffer {
    pub fn numel(&self) -> i64 {
        self.shape.iter().product()
    }
    /// Row-major strides in elements.
    pub fn strides(&self) -> Vec<i64> {
        let mut s = vec![1i64; self.shape.len()];
        for i in (0..self.shape.len().saturating_sub(1)).rev() {
            s[i] = s[i + 1] * self.shape[i + 1];
        }
        s
    }
}

/// The type of a scalar variable or expression.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Ty {
    /// A signed 64-bit index.
    Index,
    /// An element of the given dtype.
    Elem(DType),
}

#[derive(Clone, Debug, PartialEq)]
pub struct VarInfo {
    pub name: String,
    pub ty: Ty,
    /// Mutable variables (accumulators) may be updated with [`Stmt::Assign`].
    pub mutable: bool,
}

/// A literal of an element type.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum Lit {
    Int(i64, DType),
    UInt(u64, DType),
    Float(f64, DType),
    Bool(bool),
}

impl Lit {
    pub fn dtype(self) -> DType {
        match self {
            Lit::Int(_, d) | Lit::UInt(_, d) | Lit::Float(_, d) => d,
            Lit::Bool(_) => DType::Bool,
        }
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum UnOp {
    Neg,
    /// Logical not (bool).
    Not,
    /// Bitwise not (integers).
    BitNot,
    Abs,
    Sqrt,
    Rsqrt,
    Recip,
    Exp,
    /// `exp(min(x, 0))` with results below `2^-126` (`x < -87.34`) flushed to zero, NaN kept:
    /// the exponential of a softmax's logits less their maximum, which back ends may compute
    /// more cheaply than [`UnOp::Exp`] (no overflow, no subnormal results).
    ExpNeg,
    Log,
    Sin,
    Cos,
    Tan,
    Asin,
    Acos,
    Atan,
    Sinh,
    Cosh,
    Tanh,
    Asinh,
    Acosh,
    Atanh,
    Erf,
    Floor,
    Ceil,
    /// Round half to even.
    Round,
    Trunc,
    Sign,
    Sigmoid,
    /// GELU, `0.5 x (1 + erf(x / sqrt 2))`: a named function (the graph recognized it), so
    /// that each back end computes it with one routine of its own.
    GeluErf,
    /// GELU's tanh form, `0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))`.
    GeluTanh,
    /// SiLU, `x sigmoid(x)`.
    Silu,
    IsNan,
    /// True for +inf or -inf.
    IsInf,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    /// Float division; for integers, truncating division (C semantics).
    Div,
    /// C remainder (sign of the dividend); `fmod` for floats.
    Rem,
    /// Floor division for integers (index arithmetic with possibly negative operands).
    FloorDiv,
    /// Floor modulo (sign of the divisor).
    FloorMod,
    /// NaN-propagating minimum / maximum.
    Min,
    Max,
    Pow,
    Atan2,
    And,
    Or,
    Xor,
    BitAnd,
    BitOr,
    BitXor,
    Shl,
    Shr,
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
}

impl BinOp {
    pub fn is_compare(self) -> bool {
        matches!(self, BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge | BinOp::Eq | BinOp::Ne)
    }
    pub fn is_logical(self) -> bool {
        matches!(self, BinOp::And | BinOp::Or | BinOp::Xor)
    }
}

/// A scalar expression.
#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    /// An index constant (type [`Ty::Index`]).
    Int(i64),
    /// A typed literal.
    Lit(Lit),
    Var(VarId),
    /// An element of a buffer at a multi-dimensional index (one index expression per dim).
    Load(BufId, Vec<Expr>),
    Unary(UnOp, Box<Expr>),
    Binary(BinOp, Box<Expr>, Box<Expr>),
    /// `cond ? a : b`.
    Select(Box<Expr>, Box<Expr>, Box<Expr>),
    /// Conversion to an element type (C conversion semantics, with rounding for f16/bf16/fp8).
    Cast(DType, Box<Expr>),
    /// Conversion of an element value to an index.
    ToIndex(Box<Expr>),
    /// An index read from data, checked against the dimension it addresses (see [`IndexCheck`]):
    /// the result is always inside `0..len`, and a value outside the allowed range is recorded
    /// as a violation of the check's site.
    CheckIndex(Box<Expr>, IndexCheck),
}

/// How [`Expr::CheckIndex`] treats its index `i` (a [`Ty::Index`] value): with `wrap`, a
/// negative `i` counts from the end once (`i + len`); whatever is then still outside `0..len`
/// is a violation, recorded in the run's status (the first one of a run wins) and clamped into
/// `0..len` so that memory is never addressed outside the buffer.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct IndexCheck {
    /// The size of the indexed dimension (at least 1).
    pub len: i64,
    pub wrap: bool,
    /// The entry of [`Kernel::checks`] that says where the index comes from.
    pub site: u32,
}

/// Where a checked index comes from, for the error a violation becomes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckSite {
    /// The graph node's name.
    pub node: String,
    /// The op's name.
    pub op: String,
    /// The input that holds the indices.
    pub input: String,
    /// Negative indices count from the end.
    pub wrap: bool,
}

/// Kernels with checks take one more argument after their parameters: the run's status, this
/// many 64-bit words, zero before the run. A violation writes `site + 1`, the index as read and
/// the dimension's size into words 0, 1 and 2 (only the first violation of a run is kept).
pub const STATUS_WORDS: usize = 3;

/// An out-of-range index caught while a kernel ran.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct IndexViolation {
    pub site: u32,
    /// The index as read (before negative indices were wrapped).
    pub index: i64,
    pub len: i64,
}

impl IndexViolation {
    /// The violation recorded in a status (none when word 0 is zero).
    pub fn from_status(words: &[i64]) -> Option<IndexViolation> {
        match words {
            [s, i, n, ..] if *s > 0 && *s <= u32::MAX as i64 => {
                Some(IndexViolation { site: (*s - 1) as u32, index: *i, len: *n })
            }
            _ => None,
        }
    }

    /// The error this violation of a kernel named `kernel` with check sites `sites` becomes:
    /// the node, op and input the index came from, its value and the range allowed.
    pub fn message(&self, sites: &[CheckSite], kernel: &str) -> String {
        match sites.get(self.site as usize) {
            Some(s) => format!(
                "node '{}' ({}): {} value {} is out of range for a dimension of size {} (allowed {}..={})",
                s.node,
                s.op,
                s.input,
                self.index,
                self.len,
                if s.wrap { -self.len } else { 0 },
                self.len - 1
            ),
            None => format!(
                "kernel {kernel}: index {} is out of range for a dimension of size {} (check {})",
                self.index, self.len, self.site
            ),
        }
    }

    /// The index normalized as the check does, and whether it was in range.
    pub fn check(index: i64, c: IndexCheck) -> (i64, bool) {
        let j = if c.wrap && index < 0 { index + c.len } else { index };
        if (0..c.len).contains(&j) {
            (j, true)
        } else {
            (j.clamp(0, (c.len - 1).max(0)), false)
        }
    }
}

impl Expr {
    pub fn var(v: VarId) -> Expr {
        Expr::Var(v)
    }
    pub fn f32(x: f32) -> Expr {
        Expr::Lit(Lit::Float(x as f64, DType::F32))
    }
    pub fn float(x: f64, d: DType) -> Expr {
        Expr::Lit(Lit::Float(x, d))
    }
    pub fn load(b: BufId, idx: Vec<Expr>) -> Expr {
        Expr::Load(b, idx)
    }
    pub fn un(op: UnOp, a: Expr) -> Expr {
        Expr::Unary(op, Box::new(a))
    }
    pub fn bin(op: BinOp, a: Expr, b: Expr) -> Expr {
        Expr::Binary(op, Box::new(a), Box::new(b))
    }
    pub fn select(c: Expr, a: Expr, b: Expr) -> Expr {
        Expr::Select(Box::new(c), Box::new(a), Box::new(b))
    }
    pub fn cast(d: DType, a: Expr) -> Expr {
        Expr::Cast(d, Box::new(a))
    }

    /// Index addition with constant folding (`x + 0 = x`, constants combined).
    pub fn add(a: Expr, b: Expr) -> Expr {
        match (a, b) {
            (Expr::Int(0), e) | (e, Expr::Int(0)) => e,
            (Expr::Int(x), Expr::Int(y)) => Expr::Int(x + y),
            (a, b) => Expr::bin(BinOp::Add, a, b),
        }
    }
    /// Index multiplication with constant folding (`x * 1 = x`, `x * 0 = 0`).
    pub fn mul(a: Expr, b: Expr) -> Expr {
        match (a, b) {
            (Expr::Int(0), _) | (_, Expr::Int(0)) => Expr::Int(0),
            (Expr::Int(1), e) | (e, Expr::Int(1)) => e,
            (Expr::Int(x), Expr::Int(y)) => Expr::Int(x * y),
            (a, b) => Expr::bin(BinOp::Mul, a, b),
        }
    }
    /// Index floor division by a positive constant.
    pub fn div(a: Expr, d: i64) -> Expr {
        match a {
            _ if d == 1 => a,
            Expr::Int(x) => Expr::Int(x.div_euclid(d)),
            a => Expr::bin(BinOp::Div, a, Expr::Int(d)),
        }
    }
    /// Index remainder by a positive constant.
    pub fn rem(a: Expr, d: i64) -> Expr {
        match a {
            _ if d == 1 => Expr::Int(0),
            Expr::Int(x) => Expr::Int(x.rem_euclid(d)),
            a => Expr::bin(BinOp::Rem, a, Expr::Int(d)),
        }
    }

    /// Calls `f` on every sub-expression, children first.
    pub fn visit(&self, f: &mut impl FnMut(&Expr)) {
        match self {
            Expr::Int(_) | Expr::Lit(_) | Expr::Var(_) => {}
            Expr::Load(_, idx) => idx.iter().for_each(|e| e.visit(f)),
            Expr::Unary(_, a) | Expr::Cast(_, a) | Expr::ToIndex(a) | Expr::CheckIndex(a, _) => a.visit(f),
            Expr::Binary(_, a, b) => {
                a.visit(f);
                b.visit(f);
            }
            Expr::Select(c, a, b) => {
                c.visit(f);
                a.visit(f);
                b.visit(f);
            }
        }
        f(self);
    }

    /// Rewrites the expression bottom-up: `f` sees each node after its children were rewritten
    /// and may return a replacement.
    pub fn rewrite(self, f: &mut impl FnMut(Expr) -> Expr) -> Expr {
        let e = match self {
            e @ (Expr::Int(_) | Expr::Lit(_) | Expr::Var(_)) => e,
            Expr::Load(b, idx) => Expr::Load(b, idx.into_iter().map(|e| e.rewrite(f)).collect()),
            Expr::Unary(op, a) => Expr::Unary(op, Box::new(a.rewrite(f))),
            Expr::Cast(d, a) => Expr::Cast(d, Box::new(a.rewrite(f))),
            Expr::ToIndex(a) => Expr::ToIndex(Box::new(a.rewrite(f))),
            Expr::CheckIndex(a, c) => Expr::CheckIndex(Box::new(a.rewrite(f)), c),
            Expr::Binary(op, a, b) => Expr::Binary(op, Box::new(a.rewrite(f)), Box::new(b.rewrite(f))),
            Expr::Select(c, a, b) => Expr::Select(
                Box::new(c.rewrite(f)),
                Box::new(a.rewrite(f)),
                Box::new(b.rewrite(f)),
            ),
        };
        f(e)
    }

    /// Replaces every use of `v` by `with`.
    pub fn substitute(self, v: VarId, with: &Expr) -> Expr {
        self.rewrite(&mut |e| match e {
            Expr::Var(x) if x == v => with.clone(),
            e => e,
        })
    }

    /// Whether the expression reads variable `v`.
    pub fn uses_var(&self, v: VarId) -> bool {
        let mut found = false;
        self.visit(&mut |e| {
            if *e == Expr::Var(v) {
                found = true
            }
        });
        found
    }

    /// Whether the expression reads buffer `b`.
    pub fn reads(&self, b: BufId) -> bool {
        let mut found = false;
        self.visit(&mut |e| {
            if let Expr::Load(x, _) = e {
                if *x == b {
                    found = true
                }
            }
        });
        found
    }
}

/// How a loop executes.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum LoopKind {
    Serial,
    /// Iterations are independent and run on different threads.
    Parallel,
    /// Iterations are independent and map onto vector lanes.
    Vectorized,
    /// The back end emits the body `extent` times.
    Unrolled,
    /// Bound to a GPU grid/block axis.
    Bound(GpuAxis),
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum GpuAxis {
    BlockX,
    BlockY,
    BlockZ,
    ThreadX,
    ThreadY,
    ThreadZ,
}

/// A counted loop `for var in 0..extent`.
#[derive(Clone, Debug, PartialEq)]
pub struct Loop {
    pub var: VarId,
    pub extent: i64,
    pub kind: LoopKind,
    pub body: Vec<Stmt>,
}

/// A matrix product tile operation: for every batch `b`, row `i` and column `j`,
/// `acc = sum_k a(b, i, k) * b(b, k, j)` accumulated in `acc_dtype`, then `epilogue` runs with the
/// variables `b`, `i`, `j` and `acc` bound (typically one store, with bias, activation and
/// residual folded in). The operand expressions read buffers at any index built from the
/// variables, so an implicit im2col (convolution) or a transposed operand is just another
/// expression. Back ends render it with a packed, cache-blocked, register-tiled template.
#[derive(Clone, Debug, PartialEq)]
pub struct Gemm {
    pub batch: i64,
    pub m: i64,
    pub n: i64,
    pub k: i64,
    pub b_var: VarId,
    pub i_var: VarId,
    pub j_var: VarId,
    pub k_var: VarId,
    pub acc_var: VarId,
    pub acc_dtype: DType,
    /// `A[b, i, k]` in terms of `b_var`, `i_var`, `k_var`.
    pub a: Expr,
    /// `B[b, k, j]` in terms of `b_var`, `k_var`, `j_var`.
    pub b: Expr,
    pub epilogue: Vec<Stmt>,
    pub params: GemmParams,
    /// Render as a matrix-vector product (few rows; `B` streamed once from panels prepared
    /// ahead of the calls) instead of the blocked template, whose `params` it then ignores.
    /// Set by the `gemm_vector` schedule primitive (the CPU's `cpu.gemv`); back ends without
    /// such a template ignore it.
    pub vector: bool,
}

/// Blocking of the GEMM template: an `mr × nr` register tile, `kc` deep panels, `mc × nc`
/// cache blocks.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct GemmParams {
    pub mr: i64,
    pub nr: i64,
    pub kc: i64,
    pub mc: i64,
    pub nc: i64,
}

/// A statement.
#[derive(Clone, Debug, PartialEq)]
pub enum Stmt {
    For(Loop),
    Store {
        buf: BufId,
        index: Vec<Expr>,
        value: Expr,
    },
    /// Defines a variable (immutable or, if declared mutable, an accumulator's initial value).
    Let {
        var: VarId,
        value: Expr,
    },
    /// Updates a mutable variable.
    Assign {
        var: VarId,
        value: Expr,
    },
    /// A local buffer comes into existence here and lives until the end of the enclosing block.
    Alloc(BufId),
    If {
        cond: Expr,
        then_: Vec<Stmt>,
        else_: Vec<Stmt>,
    },
    /// All threads of a block synchronize (GPU); a no-op on the CPU.
    Barrier,
    Gemm(Box<Gemm>),
    /// Cross-thread reduction of a mutable accumulator (GPU). It follows loops bound to the
    /// thread axis `axis` that updated `var` with `op`: on a GPU every thread then holds a
    /// partial value and, afterwards, all of them hold `op` over the threads of the block along
    /// `axis` (every thread must have started from `op`'s identity). Where the thread loops run
    /// serially (CPU, interpreter), `var` already holds the full result and this is a no-op.
    BlockReduce {
        var: VarId,
        op: BinOp,
        axis: GpuAxis,
    },
}

impl Stmt {
    pub fn for_(var: VarId, extent: i64, body: Vec<Stmt>) -> Stmt {
        Stmt::For(Loop { var, extent, kind: LoopKind::Serial, body })
    }
    pub fn store(buf: BufId, index: Vec<Expr>, value: Expr) -> Stmt {
        Stmt::Store { buf, index, value }
    }

    /// Calls `f` on every expression directly held by this statement and, recursively, by
    /// nested statements (the read-only twin of [`Stmt::map_exprs`]).
    pub fn visit_exprs(&self, f: &mut impl FnMut(&Expr)) {
        match self {
            Stmt::For(l) => l.body.iter().for_each(|s| s.visit_exprs(f)),
            Stmt::Store { index, value, .. } => {
                index.iter().for_each(&mut *f);
                f(value);
            }
            Stmt::Let { value, .. } | Stmt::Assign { value, .. } => f(value),
            Stmt::Alloc(_) | Stmt::Barrier | Stmt::BlockReduce { .. } => {}
            Stmt::If { cond, then_, else_ } => {
                f(cond);
                then_.iter().for_each(|s| s.visit_exprs(f));
                else_.iter().for_each(|s| s.visit_exprs(f));
            }
            Stmt::Gemm(g) => {
                f(&g.a);
                f(&g.b);
                g.epilogue.iter().for_each(|s| s.visit_exprs(f));
            }
        }
    }

    /// Applies `f` to every expression directly held by this statement and, recursively, by
    /// nested statements.
    pub fn map_exprs(&mut self, f: &mut impl FnMut(Expr) -> Expr) {
        let take = |e: &mut Expr, f: &mut dyn FnMut(Expr) -> Expr| {
            let old = std::mem::replace(e, Expr::Int(0));
            *e = f(old);
        };
        match self {
            Stmt::For(l) => l.body.iter_mut().for_each(|s| s.map_exprs(f)),
            Stmt::Store { index, value, .. } => {
                for e in index.iter_mut() {
                    take(e, f);
                }
                take(value, f);
            }
            Stmt::Let { value, .. } | Stmt::Assign { value, .. } => take(value, f),
            Stmt::Alloc(_) | Stmt::Barrier | Stmt::BlockReduce { .. } => {}
            Stmt::If { cond, then_, else_ } => {
                take(cond, f);
                then_.iter_mut().for_each(|s| s.map_exprs(f));
                else_.iter_mut().for_each(|s| s.map_exprs(f));
            }
            Stmt::Gemm(g) => {
                take(&mut g.a, f);
                take(&mut g.b, f);
                g.epilogue.iter_mut().for_each(|s| s.map_exprs(f));
            }
        }
    }

    /// Calls `f` on this statement and every nested one (pre-order).
    pub fn visit(&self, f: &mut impl FnMut(&Stmt)) {
        f(self);
        match self {
            Stmt::For(l) => l.body.iter().for_each(|s| s.visit(f)),
            Stmt::If { then_, else_, .. } => {
                then_.iter().for_each(|s| s.visit(f));
                else_.iter().for_each(|s| s.visit(f));
            }
            Stmt::Gemm(g) => g.epilogue.iter().for_each(|s| s.visit(f)),
            _ => {}
        }
    }

    /// Replaces every use of variable `v` by `with` in this statement tree.
    pub fn substitute(&mut self, v: VarId, with: &Expr) {
        self.map_exprs(&mut |e| e.substitute(v, with));
    }
}

/// A kernel: buffers, variables and a body.
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    pub name: String,
    pub buffers: Vec<Buffer>,
    pub vars: Vec<VarInfo>,
    /// Global buffers passed as arguments, in ABI order.
    pub params: Vec<BufId>,
    pub body: Vec<Stmt>,
    /// The sites of the kernel's index checks; when there are any, the kernel takes the run's
    /// status (see [`STATUS_WORDS`]) as one more argument after `params`.
    pub checks: Vec<CheckSite>,
}

impl Kernel {
    pub fn new(name: impl Into<String>) -> Kernel {
        Kernel { name: name.into(), buffers: vec![], vars: vec![], params: vec![], body: vec![], checks: vec![] }
    }

    /// Adds a global buffer and appends it to the argument list.
    pub fn param(&mut self, name: impl Into<String>, dtype: DType, shape: Vec<i64>) -> BufId {
        let id = self.buffer(name, dtype, shape, Scope::Global);
        self.params.push(id);
        id
    }

    /// Adds a buffer (declare local ones in the body with [`Stmt::Alloc`]).
    pub fn buffer(&mut self, name: impl Into<String>, dtype: DType, shape: Vec<i64>, scope: Scope) -> BufId {
        self.buffers.push(Buffer { name: name.into(), dtype, shape, scope });
        BufId(self.buffers.len() as u32 - 1)
    }

    /// Adds an index variable.
    pub fn index_var(&mut self, name: impl Into<String>) -> VarId {
        self.new_var(name, Ty::Index, false)
    }

    /// Adds a variable of any type.
    pub fn new_var(&mut self, name: impl Into<String>, ty: Ty, mutable: bool) -> VarId {
        self.vars.push(VarInfo { name: name.into(), ty, mutable });
        VarId(self.vars.len() as u32 - 1)
    }

    pub fn buf(&self, b: BufId) -> &Buffer {
        &self.buffers[b.0 as usize]
    }
    pub fn var_info(&self, v: VarId) -> &VarInfo {
        &self.vars[v.0 as usize]
    }

    /// The type of an expression (element types follow C-like rules inside one dtype: binary
    /// operands have the same type, comparisons are bool).
    pub fn type_of(&self, e: &Expr) -> Ty {
        match e {
            Expr::Int(_) | Expr::ToIndex(_) | Expr::CheckIndex(..) => Ty::Index,
            Expr::Lit(l) => Ty::Elem(l.dtype()),
            Expr::Var(v) => self.var_info(*v).ty,
            Expr::Load(b, _) => Ty::Elem(self.buf(*b).dtype),
            Expr::Unary(UnOp::IsNan | UnOp::IsInf | UnOp::Not, _) => Ty::Elem(DType::Bool),
            Expr::Unary(_, a) => self.type_of(a),
            Expr::Binary(op, a, b) => {
                if op.is_compare() || op.is_logical() {
                    Ty::Elem(DType::Bool)
                } else {
                    match self.type_of(a) {
                        Ty::Index => self.type_of(b),
                        t => t,
                    }
                }
            }
            Expr::Select(_, a, b) => match self.type_of(a) {
                Ty::Index => self.type_of(b),
                t => t,
            },
            Expr::Cast(d, _) => Ty::Elem(*d),
        }
    }

    /// The buffers some statement of the body stores to.
    pub fn stored_buffers(&self) -> std::collections::HashSet<BufId> {
        let mut stored = std::collections::HashSet::new();
        for s in &self.body {
            s.visit(&mut |s| {
                if let Stmt::Store { buf, .. } = s {
                    stored.insert(*buf);
                }
            });
        }
        stored
    }

    /// Every loop of the body in pre-order.
    pub fn loops(&self) -> Vec<&Loop> {
        fn go<'a>(stmts: &'a [Stmt], out: &mut Vec<&'a Loop>) {
            for s in stmts {
                match s {
                    Stmt::For(l) => {
                        out.push(l);
                        go(&l.body, out);
                    }
                    Stmt::If { then_, else_, .. } => {
                        go(then_, out);
                        go(else_, out);
                    }
                    _ => {}
                }
            }
        }
        let mut out = vec![];
        go(&self.body, &mut out);
        out
    }

    /// Finds the loop over `v`, mutably.
    pub fn find_loop_mut(&mut self, v: VarId) -> Option<&mut Loop> {
        fn go(stmts: &mut [Stmt], v: VarId) -> Option<&mut Loop> {
            for s in stmts {
                match s {
                    Stmt::For(l) => {
                        if l.var == v {
                            return Some(l);
                        }
                        if let Some(x) = go(&mut l.body, v) {
                            return Some(x);
                        }
                    }
                    Stmt::If { then_, else_, .. } => {
                        if let Some(x) = go(then_, v) {
                            return Some(x);
                        }
                        if let Some(x) = go(else_, v) {
                            return Some(x);
                        }
                    }
                    _ => {}
                }
            }
            None
        }
        go(&mut self.body, v)
    }

    /// The error an index violation of this kernel becomes ([`IndexViolation::message`]).
    pub fn index_error(&self, v: &IndexViolation) -> String {
        v.message(&self.checks, &self.name)
    }

    /// Looks a variable up by name.
    pub fn var_named(&self, name: &str) -> Option<VarId> {
        self.vars.iter().position(|v| v.name == name).map(|i| VarId(i as u32))
    }
}
