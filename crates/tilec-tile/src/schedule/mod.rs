//! Schedule primitives: IR→IR transforms of a [`Kernel`] that change how its loops execute but
//! not what it computes, plus default schedules for CPUs.
//!
//! Loops are named by their variable (variable names are unique within a kernel). Every primitive
//! checks its legality and either rewrites the kernel or returns a [`ScheduleError`] naming the
//! kernel, the primitive and the reason; a failed primitive leaves the kernel untouched.
//! A [`Schedule`] is plain data (a list of [`Primitive`]s, JSON-serializable) applied with
//! [`apply`]; [`default_cpu`] builds one from heuristics.
//!
//! New variables and buffers get deterministic names, so a schedule can name what earlier steps
//! created: `split(i)` creates `i_o` and `i_i`, `fuse(i, j)` creates `i_j`, `rfactor(j)` creates
//! `j_o`/`j_i` and the partial buffer `<acc>_rf`, caches are `<buf>_local` / `<buf>_reg`. When a
//! name is taken, a number is appended (`i_o2`).
//!
//! Dependence tests are conservative: index expressions are analysed as quasi-affine forms of
//! loop variables (sums, products by constants, divisions and remainders by constants; immutable
//! index `let`s are seen through), and a primitive that cannot prove itself legal refuses.

mod affine;
mod cache;
mod contig;
mod default;
mod deps;
mod loops;
mod partition;
mod rfactor;

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ir::*;

pub use cache::{cache_read, cache_write, compute_at, MAX_LOCAL_BYTES, MAX_REGISTER_ELEMS};
pub use default::{default_cpu, gemm_params, CpuTarget, PARALLEL_MIN_WORK};
pub use loops::{
    fuse, gemm_blocking, gemm_transpose, gemm_vector, parallel, reorder, split, unroll, vectorize, MAX_INNER_TRIPS,
    MAX_UNROLL,
};
pub use partition::{delinearize, partition, Partitioned};
pub use rfactor::rfactor;

/// A primitive that could not be applied.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("kernel {kernel}: {primitive}: {reason}")]
pub struct ScheduleError {
    pub kernel: String,
    pub primitive: String,
    pub reason: String,
}

pub(crate) fn err(k: &Kernel, primitive: &str, reason: impl Into<String>) -> ScheduleError {
    ScheduleError {
        kernel: k.name.clone(),
        primitive: primitive.to_string(),
        reason: reason.into(),
    }
}

/// Memory scope of a cache buffer.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheScope {
    Local,
    Register,
}

impl CacheScope {
    pub fn scope(self) -> Scope {
        match self {
            CacheScope::Local => Scope::Local,
            CacheScope::Register => Scope::Register,
        }
    }
}

/// One schedule step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Primitive {
    /// `loop` becomes `loop_o` (extent `ceil(n / factor)`) around `loop_i` (extent `factor`).
    Split {
        #[serde(rename = "loop")]
        loop_var: String,
        factor: i64,
    },
    /// Permutes perfectly nested loops into the listed order.
    Reorder { loops: Vec<String> },
    /// Merges `outer` and the loop `inner` directly inside it into `outer_inner`.
    Fuse { outer: String, inner: String },
    Unroll {
        #[serde(rename = "loop")]
        loop_var: String,
    },
    Vectorize {
        #[serde(rename = "loop")]
        loop_var: String,
    },
    Parallel {
        #[serde(rename = "loop")]
        loop_var: String,
    },
    /// Stages the part of `buffer` read inside loop `at` into a cache filled just before it.
    CacheRead {
        buffer: String,
        at: String,
        scope: CacheScope,
    },
    /// Redirects the writes of `buffer` inside loop `at` to a cache copied back just after it.
    CacheWrite {
        buffer: String,
        at: String,
        scope: CacheScope,
    },
    /// Moves the loop nest `producer` (which fills a local buffer) to the start of the body of
    /// loop `at`, computing only the part that one iteration of `at` reads.
    ComputeAt { producer: String, at: String },
    /// Splits a reduction loop by `factor` with `factor` partial accumulators.
    Rfactor {
        #[serde(rename = "loop")]
        loop_var: String,
        factor: i64,
    },
    /// Blocking of the gemm whose row variable is `gemm` (all gemms when absent).
    /// Cuts a loop into border / interior / border by the bounds checks in its body, dropping
    /// the checks that hold throughout the interior (which keeps the loop's name).
    Partition {
        #[serde(rename = "loop")]
        loop_var: String,
    },
    /// Splits `loop` by `factor` (a divisor of its extent) and simplifies its body's indices,
    /// `loop / factor` and `loop % factor` becoming the two new variables.
    Delinearize {
        #[serde(rename = "loop")]
        loop_var: String,
        factor: i64,
    },
    /// Swaps the operands of the gemm whose row variable is `gemm` (all gemms when absent):
    /// computes the transposed product, the register tile running along the other dimension.
    GemmTranspose {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gemm: Option<String>,
    },
    GemmBlocking {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gemm: Option<String>,
        mr: i64,
        nr: i64,
        kc: i64,
        mc: i64,
        nc: i64,
    },
    /// Renders the gemm whose row variable is `gemm` (all gemms when absent) as a
    /// matrix-vector product (`Gemm::vector`): for products of a few rows whose `B` is read
    /// once per call.
    GemmVector {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gemm: Option<String>,
    },
}

impl Primitive {
    /// The primitive's name as used in errors and printed schedules.
    pub fn name(&self) -> &'static str {
        match self {
            Primitive::Split { .. } => "split",
            Primitive::Reorder { .. } => "reorder",
            Primitive::Fuse { .. } => "fuse",
            Primitive::Unroll { .. } => "unroll",
            Primitive::Vectorize { .. } => "vectorize",
            Primitive::Parallel { .. } => "parallel",
            Primitive::CacheRead { .. } => "cache_read",
            Primitive::CacheWrite { .. } => "cache_write",
            Primitive::ComputeAt { .. } => "compute_at",
            Primitive::Rfactor { .. } => "rfactor",
            Primitive::Partition { .. } => "partition",
            Primitive::Delinearize { .. } => "delinearize",
            Primitive::GemmTranspose { .. } => "gemm_transpose",
            Primitive::GemmBlocking { .. } => "gemm_blocking",
            Primitive::GemmVector { .. } => "gemm_vector",
        }
    }
}

impl fmt::Display for Primitive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scope = |s: &CacheScope| match s {
            CacheScope::Local => "local",
            CacheScope::Register => "register",
        };
        match self {
            Primitive::Split { loop_var, factor } => write!(f, "split {loop_var} by {factor}"),
            Primitive::Reorder { loops } => write!(f, "reorder {}", loops.join(", ")),
            Primitive::Fuse { outer, inner } => write!(f, "fuse {outer}, {inner}"),
            Primitive::Unroll { loop_var } => write!(f, "unroll {loop_var}"),
            Primitive::Vectorize { loop_var } => write!(f, "vectorize {loop_var}"),
            Primitive::Parallel { loop_var } => write!(f, "parallel {loop_var}"),
            Primitive::CacheRead {
                buffer,
                at,
                scope: s,
            } => write!(f, "cache_read {buffer} at {at} ({})", scope(s)),
            Primitive::CacheWrite {
                buffer,
                at,
                scope: s,
            } => write!(f, "cache_write {buffer} at {at} ({})", scope(s)),
            Primitive::ComputeAt { producer, at } => write!(f, "compute_at {producer} at {at}"),
            Primitive::Rfactor { loop_var, factor } => write!(f, "rfactor {loop_var} by {factor}"),
            Primitive::Partition { loop_var } => write!(f, "partition {loop_var}"),
            Primitive::Delinearize { loop_var, factor } => write!(f, "delinearize {loop_var} by {factor}"),
            Primitive::GemmTranspose { gemm } => match gemm {
                Some(g) => write!(f, "gemm_transpose {g}"),
                None => write!(f, "gemm_transpose"),
            },
            Primitive::GemmVector { gemm } => match gemm {
                Some(g) => write!(f, "gemm_vector {g}"),
                None => write!(f, "gemm_vector"),
            },
            Primitive::GemmBlocking {
                gemm,
                mr,
                nr,
                kc,
                mc,
                nc,
            } => {
                write!(f, "gemm_blocking")?;
                if let Some(g) = gemm {
                    write!(f, " {g}")?;
                }
                write!(f, " mr={mr} nr={nr} kc={kc} mc={mc} nc={nc}")
            }
        }
    }
}

/// A list of primitives applied in order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schedule {
    pub steps: Vec<Primitive>,
}

impl Schedule {
    pub fn new() -> Schedule {
        Schedule::default()
    }
    pub fn push(&mut self, p: Primitive) {
        self.steps.push(p);
    }
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|_| "{\"steps\":[]}".into())
    }
    pub fn from_json(s: &str) -> Result<Schedule, serde_json::Error> {
        serde_json::from_str(s)
    }
}

/// One line per step.
impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for s in &self.steps {
            writeln!(f, "{s}")?;
        }
        Ok(())
    }
}

/// Applies every step of `s` in order. On error the kernel is left as it was before the call.
pub fn apply(k: &mut Kernel, s: &Schedule) -> Result<(), ScheduleError> {
    let mut w = k.clone();
    for p in &s.steps {
        apply_primitive(&mut w, p)?;
    }
    *k = w;
    Ok(())
}

/// Applies one primitive (the kernel is unchanged on error).
pub fn apply_primitive(k: &mut Kernel, p: &Primitive) -> Result<(), ScheduleError> {
    match p {
        Primitive::Split { loop_var, factor } => split(k, loop_var, *factor).map(drop),
        Primitive::Reorder { loops } => {
            let names: Vec<&str> = loops.iter().map(|s| s.as_str()).collect();
            reorder(k, &names)
        }
        Primitive::Fuse { outer, inner } => fuse(k, outer, inner).map(drop),
        Primitive::Unroll { loop_var } => unroll(k, loop_var),
        Primitive::Vectorize { loop_var } => vectorize(k, loop_var),
        Primitive::Parallel { loop_var } => parallel(k, loop_var),
        Primitive::CacheRead { buffer, at, scope } => cache_read(k, buffer, at, *scope).map(drop),
        Primitive::CacheWrite { buffer, at, scope } => cache_write(k, buffer, at, *scope).map(drop),
        Primitive::ComputeAt { producer, at } => compute_at(k, producer, at),
        Primitive::Rfactor { loop_var, factor } => rfactor(k, loop_var, *factor).map(drop),
        Primitive::Partition { loop_var } => partition(k, loop_var).map(drop),
        Primitive::Delinearize { loop_var, factor } => delinearize(k, loop_var, *factor).map(drop),
        Primitive::GemmTranspose { gemm } => gemm_transpose(k, gemm.as_deref()),
        Primitive::GemmVector { gemm } => gemm_vector(k, gemm.as_deref()),
        Primitive::GemmBlocking {
            gemm,
            mr,
            nr,
            kc,
            mc,
            nc,
        } => gemm_blocking(
            k,
            gemm.as_deref(),
            GemmParams {
                mr: *mr,
                nr: *nr,
                kc: *kc,
                mc: *mc,
                nc: *nc,
            },
        ),
    }
}

/// Runs `f` on a copy of the kernel and keeps the result only on success.
pub(crate) fn atomically<R>(
    k: &mut Kernel,
    f: impl FnOnce(&mut Kernel) -> Result<R, ScheduleError>,
) -> Result<R, ScheduleError> {
    let mut w = k.clone();
    let r = f(&mut w)?;
    *k = w;
    Ok(r)
}

// ---------------------------------------------------------------------------------------------
// Navigation

/// Which statement list of a statement a path step enters.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Sub {
    Body,
    Then,
    Else,
}

/// Where a loop statement sits: the path to its block, its index there, the loops around it.
#[derive(Clone, Debug)]
pub(crate) struct LoopPos {
    pub block: Vec<(usize, Sub)>,
    pub idx: usize,
    /// Enclosing loops, outermost first: variable, extent, kind.
    pub ancestors: Vec<(VarId, i64, LoopKind)>,
}

impl LoopPos {
    /// Bounds of the enclosing loop variables.
    pub fn outer_ranges(&self) -> affine::Ranges {
        self.ancestors
            .iter()
            .map(|&(v, n, _)| (v, (0, n.saturating_sub(1).max(0))))
            .collect()
    }
}

pub(crate) fn locate(body: &[Stmt], v: VarId) -> Option<LoopPos> {
    fn go(
        stmts: &[Stmt],
        v: VarId,
        path: &mut Vec<(usize, Sub)>,
        anc: &mut Vec<(VarId, i64, LoopKind)>,
    ) -> Option<LoopPos> {
        for (i, s) in stmts.iter().enumerate() {
            match s {
                Stmt::For(l) => {
                    if l.var == v {
                        return Some(LoopPos {
                            block: path.clone(),
                            idx: i,
                            ancestors: anc.clone(),
                        });
                    }
                    path.push((i, Sub::Body));
                    anc.push((l.var, l.extent, l.kind));
                    let r = go(&l.body, v, path, anc);
                    path.pop();
                    anc.pop();
                    if r.is_some() {
                        return r;
                    }
                }
                Stmt::If { then_, else_, .. } => {
                    for (sub, b) in [(Sub::Then, then_), (Sub::Else, else_)] {
                        path.push((i, sub));
                        let r = go(b, v, path, anc);
                        path.pop();
                        if r.is_some() {
                            return r;
                        }
                    }
                }
                _ => {}
            }
        }
        None
    }
    go(body, v, &mut vec![], &mut vec![])
}

pub(crate) fn block_mut<'a>(
    mut cur: &'a mut Vec<Stmt>,
    path: &[(usize, Sub)],
) -> Option<&'a mut Vec<Stmt>> {
    for &(i, sub) in path {
        cur = match (cur.get_mut(i)?, sub) {
            (Stmt::For(l), Sub::Body) => &mut l.body,
            (Stmt::If { then_, .. }, Sub::Then) => then_,
            (Stmt::If { else_, .. }, Sub::Else) => else_,
            _ => return None,
        };
    }
    Some(cur)
}

pub(crate) fn block_ref<'a>(
    mut cur: &'a Vec<Stmt>,
    path: &[(usize, Sub)],
) -> Option<&'a Vec<Stmt>> {
    for &(i, sub) in path {
        cur = match (cur.get(i)?, sub) {
            (Stmt::For(l), Sub::Body) => &l.body,
            (Stmt::If { then_, .. }, Sub::Then) => then_,
            (Stmt::If { else_, .. }, Sub::Else) => else_,
            _ => return None,
        };
    }
    Some(cur)
}

pub(crate) fn loop_ref<'a>(k: &'a Kernel, pos: &LoopPos) -> Option<&'a Loop> {
    match block_ref(&k.body, &pos.block)?.get(pos.idx)? {
        Stmt::For(l) => Some(l),
        _ => None,
    }
}

pub(crate) fn loop_mut<'a>(k: &'a mut Kernel, pos: &LoopPos) -> Option<&'a mut Loop> {
    match block_mut(&mut k.body, &pos.block)?.get_mut(pos.idx)? {
        Stmt::For(l) => Some(l),
        _ => None,
    }
}

/// Finds the loop named `name`.
pub(crate) fn find_loop(
    k: &Kernel,
    prim: &str,
    name: &str,
) -> Result<(VarId, LoopPos), ScheduleError> {
    let v = k
        .var_named(name)
        .ok_or_else(|| err(k, prim, format!("no loop named `{name}`")))?;
    let pos = locate(&k.body, v).ok_or_else(|| {
        err(k, prim, format!("`{name}` is not the variable of a loop (an earlier step may have replaced the loop)"))
    })?;
    Ok((v, pos))
}

/// Finds a buffer by name.
pub(crate) fn find_buffer(k: &Kernel, prim: &str, name: &str) -> Result<BufId, ScheduleError> {
    let mut it = k.buffers.iter().enumerate().filter(|(_, b)| b.name == name);
    match (it.next(), it.next()) {
        (Some((i, _)), None) => Ok(BufId(i as u32)),
        (None, _) => Err(err(k, prim, format!("no buffer named `{name}`"))),
        (Some(_), Some(_)) => Err(err(k, prim, format!("several buffers are named `{name}`"))),
    }
}

fn unique(base: &str, taken: impl Fn(&str) -> bool) -> String {
    if !taken(base) {
        return base.to_string();
    }
    (2..)
        .map(|n| format!("{base}{n}"))
        .find(|c| !taken(c))
        .unwrap_or_else(|| base.to_string())
}

/// Adds a variable with a name not yet used in the kernel (based on `base`).
pub(crate) fn fresh_var(k: &mut Kernel, base: &str, ty: Ty, mutable: bool) -> VarId {
    let name = unique(base, |n| k.vars.iter().any(|v| v.name == n));
    k.new_var(name, ty, mutable)
}

/// Adds a buffer with a name not yet used in the kernel.
pub(crate) fn fresh_buffer(
    k: &mut Kernel,
    base: &str,
    dtype: tilec_ir::DType,
    shape: Vec<i64>,
    scope: Scope,
) -> BufId {
    let name = unique(base, |n| k.buffers.iter().any(|b| b.name == n));
    k.buffer(name, dtype, shape, scope)
}

pub(crate) fn var_name(k: &Kernel, v: VarId) -> String {
    k.vars
        .get(v.0 as usize)
        .map(|i| i.name.clone())
        .unwrap_or_else(|| format!("v{}", v.0))
}
