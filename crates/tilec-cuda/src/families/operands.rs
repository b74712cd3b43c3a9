//! What a GEMM template needs to know about a tile-IR kernel that is one `Gemm`: its operands
//! as strided views of buffers (layouts, leading dimensions, batch strides, an A split across
//! heads), its shape and its epilogue rendered as a device function. Shared by the template
//! families; each adds its own constraints (dtypes, device, alignment, parameters).

use tilec_ir::DType;
use tilec_tile::{BinOp, BufId, Expr, Gemm, Kernel, Scope, Stmt, VarId};

use crate::error::CudaError;
use crate::gemm::{self, CustomEpilogue, Layout, Problem};

use super::template::OperandRef;

/// A kernel's matrix product as a template sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct GemmView {
    /// Shape, dtypes, layouts, batching and the epilogue (`custom`: the kernel's own).
    pub problem: Problem,
    /// Where A and B start.
    pub a: OperandRef,
    pub b: OperandRef,
}

/// Whether a kernel holds a matrix product (where family decisions are worth reporting).
pub fn has_gemm(k: &Kernel) -> bool {
    let mut found = false;
    for s in &k.body {
        s.visit(&mut |s| found |= matches!(s, Stmt::Gemm(_)));
    }
    found
}

/// A term of an operand's offset: an index variable, or its quotient or remainder by a
/// constant (a split dimension, such as attention heads read back as one K).
#[derive(Copy, Clone, Debug, PartialEq)]
enum Atom {
    Plain(VarId),
    Div(VarId, i64),
    Rem(VarId, i64),
}

/// A 16-bit operand read straight from a buffer: the buffer and its flat offset as
/// `konst + sum(coef * atom)`.
struct Strided {
    buf: BufId,
    dtype: DType,
    konst: i64,
    atoms: Vec<(Atom, i64)>,
}

impl Strided {
    fn coef(&self, a: Atom) -> i64 {
        self.atoms.iter().filter(|c| c.0 == a).map(|c| c.1).sum()
    }
    /// Whether every term is plain except quotients and remainders of the batch variable `bv`
    /// by one divisor.
    fn plain_but_batch(&self, bv: VarId) -> bool {
        let mut div = None;
        self.atoms.iter().all(|&(a, _)| match a {
            Atom::Plain(_) => true,
            Atom::Div(v, d) | Atom::Rem(v, d) if v == bv => div.replace(d).is_none_or(|x| x == d),
            _ => false,
        })
    }
    /// The batch variable's divisor and the strides of its quotient and remainder, if split.
    fn batch_div(&self, bv: VarId) -> Option<(i64, i64, i64)> {
        let d = self.atoms.iter().find_map(|&(a, _)| match a {
            Atom::Div(v, d) | Atom::Rem(v, d) if v == bv => Some(d),
            _ => None,
        })?;
        Some((d, self.coef(Atom::Div(bv, d)), self.coef(Atom::Rem(bv, d))))
    }
    fn plain(&self) -> bool {
        self.atoms.iter().all(|a| matches!(a.0, Atom::Plain(_)))
    }
    /// A as `[groups][heads][rows][64]`: `Some((rows, lda, head_stride, group_stride))` when
    /// the offset is `(i / R) * g + (i % R) * lda + (k / 64) * h + k % 64` (or `i * lda` for
    /// one group, or `b * g + i * lda` for batches `b` of `m` rows when `batch` is given).
    fn split(
        &self,
        i: VarId,
        k: VarId,
        m: i64,
        batch: Option<VarId>,
    ) -> Option<(i64, i64, i64, i64)> {
        let mut rows = None;
        let (mut g, mut lda, mut h, mut unit) = (0, 0, 0, 0);
        for &(a, c) in &self.atoms {
            match a {
                Atom::Plain(v) if Some(v) == batch => {
                    if rows.replace(m).is_some_and(|r| r != m) {
                        return None;
                    }
                    g = c;
                }
                Atom::Div(v, d) if v == i => {
                    if rows.replace(d).is_some_and(|r| r != d) {
                        return None;
                    }
                    g = c;
                }
                Atom::Rem(v, d) if v == i => {
                    if rows.replace(d).is_some_and(|r| r != d) {
                        return None;
                    }
                    lda = c;
                }
                Atom::Plain(v) if v == i => {
                    if rows.replace(m).is_some_and(|r| r != m) {
                        return None;
                    }
                    lda = c;
                }
                Atom::Div(v, 64) if v == k => h = c,
                Atom::Rem(v, 64) if v == k => unit = c,
                _ => return None,
            }
        }
        let rows = rows?;
        if g == 0 {
            g = h.max(lda) * rows;
        }
        (unit == 1 && h > 0 && lda > 0).then_some((rows, lda, h, g))
    }
}

fn strided(
    k: &Kernel,
    e: &Expr,
    name: &str,
    vars: [VarId; 3],
) -> std::result::Result<Strided, String> {
    let inner = match e {
        Expr::Cast(DType::F32, x) => &**x,
        x => x,
    };
    let Expr::Load(buf, index) = inner else {
        return Err(format!(
            "operand {name} is computed (a fused prologue), not read from a buffer"
        ));
    };
    let b = k
        .buffers
        .get(buf.0 as usize)
        .ok_or_else(|| format!("operand {name} reads an undeclared buffer"))?;
    if b.scope != Scope::Global || !k.params.contains(buf) {
        return Err(format!("operand {name} reads scratch buffer {}", b.name));
    }
    if index.len() != b.shape.len() {
        return Err(format!(
            "operand {name}: index rank differs from its buffer's"
        ));
    }
    let terms: Vec<(Expr, i64)> = index.iter().cloned().zip(b.strides()).collect();
    let (atoms, konst) = tilec_tile::affine::linear_offset(&terms)
        .ok_or_else(|| format!("operand {name}: its offset overflows"))?;
    let mut coefs = vec![];
    for (c, atom) in atoms {
        let split = |x: &Expr, d: &Expr| match (x, d) {
            (Expr::Var(v), Expr::Int(d)) if vars.contains(v) && *d > 0 => Some((*v, *d)),
            _ => None,
        };
        let term = match &atom {
            Expr::Var(v) if vars.contains(v) => Some(Atom::Plain(*v)),
            Expr::Binary(BinOp::Div | BinOp::FloorDiv, x, d) => {
                split(x, d).map(|(v, d)| Atom::Div(v, d))
            }
            Expr::Binary(BinOp::Rem | BinOp::FloorMod, x, d) => {
                split(x, d).map(|(v, d)| Atom::Rem(v, d))
            }
            _ => None,
        };
        match term {
            Some(t) => coefs.push((t, c)),
            _ => {
                return Err(format!(
                    "operand {name} ({}) is not a strided view of its buffer (its offset is not \
                     linear in the batch, row and depth indices)",
                    b.name
                ))
            }
        }
    }
    if coefs.iter().any(|c| c.1 < 0) || konst < 0 {
        return Err(format!("operand {name} ({}) runs backwards", b.name));
    }
    Ok(Strided {
        buf: *buf,
        dtype: b.dtype,
        konst,
        atoms: coefs,
    })
}

pub(crate) fn usize_of(x: i64) -> usize {
    usize::try_from(x).unwrap_or(0)
}

/// A kernel that is one `Gemm` (after folding a scratch consumer into its epilogue) seen as a
/// template's problem: operands read straight from buffers as strided views, f32
/// accumulation, the epilogue as a device function (`tl_epi`) over the kernel's parameters.
/// Each operand starts 16 bytes into its buffer (TMA and `cp.async` copies need it).
pub fn gemm_view(k: &Kernel) -> Result<GemmView, String> {
    gemm_view_with(k, true)
}

/// [`gemm_view`], with operands starting anywhere in their buffers unless `aligned` (a
/// template that reads misaligned operands element by element).
pub fn gemm_view_with(k: &Kernel, aligned: bool) -> Result<GemmView, String> {
    let fused = crate::schedule::fuse_scratch_epilogue(k);
    let k = fused.as_ref().unwrap_or(k);
    let g: &Gemm = match k.body.as_slice() {
        [Stmt::Gemm(g)] => g,
        _ if has_gemm(k) => {
            return Err("the matrix product shares its kernel with other loop nests".into())
        }
        _ => return Err("not a matrix product".into()),
    };
    if !k.checks.is_empty() {
        return Err("the kernel checks indices (the templates have no status words yet)".into());
    }
    if g.acc_dtype != DType::F32 {
        return Err(format!("accumulates in {}, not f32", g.acc_dtype.name()));
    }
    let (m, n, kk, batch) = (
        usize_of(g.m),
        usize_of(g.n),
        usize_of(g.k),
        usize_of(g.batch),
    );
    let a = strided(k, &g.a, "A", [g.b_var, g.i_var, g.k_var])?;
    let b = strided(k, &g.b, "B", [g.b_var, g.k_var, g.j_var])?;
    if a.dtype != b.dtype {
        return Err(format!(
            "operands of two dtypes ({} and {})",
            a.dtype.name(),
            b.dtype.name()
        ));
    }
    // Batches split in two (batch and head, as attention reads Q, K and V per head): the batch
    // offset is `(b / d) * hi + (b % d) * lo` in either operand, one divisor for both.
    let bsplit = if batch > 1 && a.plain_but_batch(g.b_var) && b.plain_but_batch(g.b_var) && !(a.plain() && b.plain()) {
        let (da, db) = (a.batch_div(g.b_var), b.batch_div(g.b_var));
        let d = da.or(db).map_or(1, |x| x.0);
        if da.is_some_and(|x| x.0 != d) || db.is_some_and(|x| x.0 != d) {
            return Err("operands split the batch by different divisors".into());
        }
        let st = |x: Option<(i64, i64, i64)>| x.map_or((0, 0), |x| (usize_of(x.1), usize_of(x.2)));
        Some(gemm::BatchSplit { div: usize_of(d), a: st(da), b: st(db) })
    } else {
        None
    };
    if !b.plain() && bsplit.is_none() {
        return Err("operand B is not a 2-D strided view of its buffer".into());
    }
    // A read across split dimensions (attention heads): a 4-D view.
    let a_split = if a.plain() || bsplit.is_some() {
        None
    } else if batch > 1 && b.coef(Atom::Plain(g.b_var)) != 0 {
        return Err(
            "operand A is split across dimensions in a product whose B is batched too".into(),
        );
    } else {
        let bv = (batch > 1).then_some(g.b_var);
        let (rows, lda, h, gs) = a.split(g.i_var, g.k_var, g.m, bv).ok_or_else(|| {
            "operand A is not a strided view of its buffer (nor rows and 64-wide K slices of one)"
                .to_string()
        })?;
        Some((usize_of(rows), usize_of(lda), usize_of(h), usize_of(gs)))
    };
    // A (M x K): row-major when K is contiguous, column-major when M is.
    let (ai, ak) = (a.coef(Atom::Plain(g.i_var)), a.coef(Atom::Plain(g.k_var)));
    // A leading dimension that is never stepped (one row or column) is any 16-byte multiple.
    let row16 = 16 / a.dtype.size_bytes().max(1);
    let pad8 = |x: usize| x.next_multiple_of(row16);
    let (a_layout, lda) = if let Some((_, lda, _, _)) = a_split {
        (Layout::RowMajor, lda)
    } else if ak == 1 || (kk == 1 && ai != 1) {
        (
            Layout::RowMajor,
            if m == 1 { pad8(kk) } else { usize_of(ai) },
        )
    } else if ai == 1 || m == 1 {
        (
            Layout::ColMajor,
            if kk == 1 { pad8(m) } else { usize_of(ak) },
        )
    } else {
        return Err(format!(
            "operand A: neither its rows nor its columns are contiguous (strides {ai} and {ak})"
        ));
    };
    // B (K x N): row-major when N is contiguous, column-major when K is.
    let (bk, bj) = (b.coef(Atom::Plain(g.k_var)), b.coef(Atom::Plain(g.j_var)));
    let (b_layout, ldb) = if bj == 1 || (n == 1 && bk != 1) {
        (
            Layout::RowMajor,
            if kk == 1 { pad8(n) } else { usize_of(bk) },
        )
    } else if bk == 1 || kk == 1 {
        (
            Layout::ColMajor,
            if n == 1 { pad8(kk) } else { usize_of(bj) },
        )
    } else {
        return Err(format!(
            "operand B: neither its rows nor its columns are contiguous (strides {bk} and {bj})"
        ));
    };
    let es = a.dtype.size_bytes() as i64;
    for (name, op) in [("A", &a), ("B", &b)] {
        if aligned && (op.konst * es) % 16 != 0 {
            return Err(format!(
                "operand {name} starts {} elements into its buffer: not 16-byte aligned for TMA",
                op.konst
            ));
        }
    }
    let (sa, sb) = (
        usize_of(a.coef(Atom::Plain(g.b_var))),
        usize_of(b.coef(Atom::Plain(g.b_var))),
    );
    let mut problem = Problem::new(m, n, kk, a.dtype).with_layouts(a_layout, b_layout);
    problem.out_dtype = DType::F32;
    problem.lda = Some(lda);
    problem.ldb = Some(ldb);
    problem.batch = batch.max(1);
    problem.batch_stride_a = if batch > 1 { sa } else { 0 };
    problem.batch_stride_b = if batch > 1 { sb } else { 0 };
    problem.batch_stride_c = m * n;
    problem.a_split = a_split.map(|(rows, _, head_stride, group_stride)| gemm::ASplit {
        rows,
        head_stride,
        group_stride,
    });
    problem.batch_split = bsplit;
    // Batches of a row-major A stacked densely against one shared B: one taller matrix.
    let mut rows = None;
    if batch > 1
        && sb == 0
        && bsplit.is_none()
        && a_layout == Layout::RowMajor
        && (sa == m * lda || a_split.is_some())
    {
        rows = Some(m);
        problem.m = m * batch;
        problem.batch = 1;
        problem.batch_stride_a = 0;
        problem.batch_stride_c = problem.m * n;
    }
    problem.custom = Some(epilogue_fn(k, g, rows)?);
    let pos = |buf: BufId| k.params.iter().position(|&p| p == buf).unwrap_or(0);
    Ok(GemmView {
        a: OperandRef { param: pos(a.buf), offset_bytes: (a.konst * es) as u64 },
        b: OperandRef { param: pos(b.buf), offset_bytes: (b.konst * es) as u64 },
        problem,
    })
}

/// The epilogue of `g` (a `Gemm` of kernel `k`) as the device function `tl_epi` a template
/// calls per element of C; `rows`: the template passes flattened rows of batches this tall.
pub fn epilogue_fn(k: &Kernel, g: &Gemm, rows: Option<usize>) -> Result<CustomEpilogue, String> {
    let entry_fn = "tl_epi";
    // Buffers renamed by position, so that the same epilogue in every layer of a model is the
    // same source (compiled once).
    let mut plain = k.clone();
    for b in &mut plain.buffers {
        b.name = "t".into();
    }
    let source =
        crate::render::render_gemm_epilogue_fn(&plain, g, entry_fn).map_err(|e| match e {
            CudaError::Render { msg, .. } => format!("epilogue not renderable: {msg}"),
            e => format!("epilogue not renderable: {e}"),
        })?;
    // The same epilogue over groups of adjacent columns, where it renders (whole-vector loads
    // and stores for the templates' staged epilogues).
    let vec_fn = "tl_epi_v";
    let (source, vector) = match crate::render::render_gemm_epilogue_vec_fn(&plain, g, vec_fn) {
        Ok(v) => (source + &v, Some(vec_fn.to_string())),
        Err(_) => (source, None),
    };
    // Whether the epilogue reads any tensor of the kernel's (a bias, a residual).
    let mut loads = false;
    for s in &g.epilogue {
        crate::schedule::each_expr(s, &mut |x| {
            if let Expr::Load(b, _) = x {
                loads |= k.buf(*b).scope == Scope::Global;
            }
        });
    }
    Ok(CustomEpilogue {
        loads,
        name: entry_fn.into(),
        source,
        params: crate::render::param_list(&plain),
        rows,
        rounds_to: product_rounding(g),
        vector,
    })
}

/// The 16-bit dtype `g`'s epilogue rounds its accumulator to wherever it reads it (a MatMul
/// whose output is f16 or bf16 in the graph: its lowering casts the f32 sum to that dtype
/// before the fused operations), or `None` if some use sees the f32 sum itself (an f32 product,
/// or one over operands cast up to f32) or the epilogue assigns the accumulator.
pub fn product_rounding(g: &Gemm) -> Option<DType> {
    let acc = g.acc_var;
    let mut found: Option<DType> = None;
    let mut other = false;
    for s in &g.epilogue {
        s.visit(&mut |st| other |= matches!(st, Stmt::Assign { var, .. } if *var == acc));
        let mut s = s.clone();
        // Each rounding of the accumulator to one 16-bit dtype becomes a constant; what still
        // reads the accumulator afterwards reads it unrounded.
        s.map_exprs(&mut |e| {
            e.rewrite(&mut |e| match e {
                Expr::Cast(d @ (DType::F16 | DType::BF16), x) if *x == Expr::Var(acc) && found.is_none_or(|f| f == d) => {
                    found = Some(d);
                    Expr::Int(0)
                }
                e => e,
            })
        });
        s.map_exprs(&mut |e| {
            other |= e.uses_var(acc);
            e
        });
    }
    if other {
        None
    } else {
        found
    }
}
