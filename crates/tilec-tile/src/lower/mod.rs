//! Lowering of kernel groups into tile IR.
//!
//! A group's nodes fall into two kinds. *Inline* nodes (elementwise functions, casts,
//! quantization, re-indexing such as reshape/transpose/slice/concat/pad/gather, and the source
//! ops) become expressions: [`value_at`](Lowerer::value_at) builds the expression of element
//! `idx` of a value by walking its producers back to the group's inputs, which become loads.
//! *Anchors* (reductions, normalizations, matrix products, convolutions, pools, attention)
//! become loop nests with accumulators or a [`Stmt::Gemm`]; when an anchor has produced the
//! element at index `aidx`, that element is *bound* and every group output that reads it
//! element for element (its epilogue: bias, activation, residual add, cast, reshape,
//! transpose) is computed and stored right there. An anchor value that is also read in any
//! other way is materialized (into its output buffer if it is a group output, else into a
//! local buffer). Outputs that do not follow an anchor are computed by a final loop nest
//! over their shape. Only group outputs are written to memory.
//!
//! Kernel parameters are the group's inputs (those the kernel reads, in the group's order;
//! one-element constants are inlined as literals and source ops are generated inline) and
//! then its outputs. Variables are named uniquely: `i<n>` output loops, `r<n>` reduction
//! loops, `acc<n>` accumulators, `t<n>` temporaries, `g[bijk]<n>` GEMM indices. A loop nest
//! over an output index space runs its dimensions in order (dimensions of extent 1 get no
//! loop), so the first loop is the one to parallelize and the innermost one runs along the
//! contiguous dimension.

mod anchor;
mod col2im;
pub use anchor::conv_transpose;
pub use anchor::depthwise;
pub use anchor::group_direct;
mod expr;
mod resize;
pub mod simplify;

use std::collections::{HashMap, HashSet};

use tilec_ir::{DType, Graph, NodeId, Op, Uses, ValueDef, ValueId};
use tilec_opt::partition::KernelGroup;

use crate::ir::*;
use simplify::{simplify, Ranges};

/// A lowered kernel and the graph values bound to its parameters.
#[derive(Clone, Debug)]
pub struct Lowered {
    pub kernel: Kernel,
    /// Values passed as the first parameters, in order.
    pub inputs: Vec<ValueId>,
    /// Values the kernel writes, passed after the inputs, in order.
    pub outputs: Vec<ValueId>,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum LowerError {
    /// A value's shape has a symbolic dimension: specialize the graph first.
    #[error("value '{value}' has a symbolic shape; specialize the graph before lowering")]
    Symbolic { value: String },
    /// A node whose op (or these attributes of it) has no lowering; run it on the reference
    /// interpreter instead.
    #[error("node '{node}' ({op}): cannot lower: {why}")]
    Unsupported {
        node: String,
        op: &'static str,
        why: String,
    },
    /// The node set is not a valid group (empty, or names nodes that do not exist).
    #[error("invalid node set: {0}")]
    Invalid(String),
}

/// How a convolution becomes a loop nest. Which form a kernel uses is the choice of a kernel
/// family (`tilec_cpu::families`, `tilec_cuda::families`); lowering only carries it out.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum ConvAlgo {
    /// A `Gemm` (implicit im2col) when its reduction and per-group outputs are deep enough for
    /// register tiles (at least 16 and 4), else a direct nest.
    #[default]
    Auto,
    /// A direct loop nest: each output a sum over channels and taps.
    Direct,
    /// A `Gemm` whose `A` is the implicit im2col of the input (a transposed convolution: one
    /// `Gemm` per output phase, `conv_transpose.rs`, where it takes the shape).
    Gemm,
    /// Winograd F(4×4, 3×3) or F(2×2, 3×3) (`winograd.rs`): a 3×3 stride-1 f32 channels-last
    /// convolution with enough channels and tiles; anything else is `Unsupported`.
    Winograd,
    /// A depthwise or narrow grouped convolution (`depthwise.rs`): channels-last, 2-D, up to
    /// 8 input and 8 output channels per group, vectorized along the groups in register
    /// blocks of output pixels, borders without bounds checks; anything else is
    /// `Unsupported`. `wide`: the target has 32 vector registers, so that a grouped
    /// convolution's blocks may hold two pixels of 8 output channels each.
    Depthwise { wide: bool },
    /// A `Gemm` as [`ConvAlgo::Gemm`] over groups merged `merge` at a time: each merged
    /// group's weights block-diagonal (zero between its groups), so that a convolution with
    /// few output channels per group fills whole vectors of them (`conv.rs`). `merge` must
    /// divide the groups; anything else is `Unsupported`.
    GroupedGemm { merge: u32 },
    /// A grouped convolution vectorized within each group (`group_direct.rs`): channels-last,
    /// 2-D, at most 64 input channels per group; a vectorized loop over one group's output
    /// channels, each input value broadcast to them, in register blocks of `pixels` output
    /// pixels; anything else is `Unsupported`.
    GroupDirect { pixels: u32 },
}

/// How attention becomes a loop nest.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum AttentionAlgo {
    /// One query row at a time: scores, a running softmax and the weighted sum per row.
    #[default]
    Rows,
    /// Two matrix products around a row softmax per (batch, head) (`attention_gemm.rs`): f32
    /// attention without past, softcap, windows or a requested QK output; anything else is
    /// `Unsupported`.
    Gemm,
    /// Flash-style (`attention_flash.rs`): per (batch, head, block of `bq` queries) a loop
    /// over blocks of `bk` keys with an online softmax, memory linear in the sequence; the
    /// same forms as `Gemm`, anything else `Unsupported`.
    Flash { bq: i64, bk: i64 },
}

/// How a channels-last global pool becomes a loop nest.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum PoolAlgo {
    /// One output element at a time, its positions in an inner loop (any back end).
    #[default]
    PerOutput,
    /// Per image and block of channels, one accumulator per channel and one pass over the
    /// positions along the contiguous channels (`pool.rs`; the CPU's vector loops).
    ChannelBlocks,
}

/// The algorithms lowering uses for the anchors that have several (the default suits every
/// back end). Kernel families set them; lowering does not choose.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct LowerOptions {
    pub conv: ConvAlgo,
    pub attention: AttentionAlgo,
    pub pool: PoolAlgo,
}

/// Lowers one kernel group of a partition.
pub fn lower_group(g: &Graph, group: &KernelGroup, name: &str) -> Result<Lowered, LowerError> {
    lower_set(g, &group.nodes, name, LowerOptions::default())
}

/// [`lower_group`] with target choices.
pub fn lower_group_with(g: &Graph, group: &KernelGroup, name: &str, opts: LowerOptions) -> Result<Lowered, LowerError> {
    lower_set(g, &group.nodes, name, opts)
}

/// Lowers any set of nodes (e.g. a single node) as one kernel. Its inputs are the values its
/// nodes read from outside the set; its outputs the values read outside the set or that are
/// graph outputs (as the partitioner computes them).
pub fn lower_nodes(g: &Graph, nodes: &[NodeId], name: &str) -> Result<Lowered, LowerError> {
    lower_set(g, nodes, name, LowerOptions::default())
}

/// [`lower_nodes`] with target choices.
pub fn lower_nodes_with(g: &Graph, nodes: &[NodeId], name: &str, opts: LowerOptions) -> Result<Lowered, LowerError> {
    lower_set(g, nodes, name, opts)
}

fn lower_set(g: &Graph, nodes: &[NodeId], name: &str, opts: LowerOptions) -> Result<Lowered, LowerError> {
    if nodes.is_empty() {
        return Err(LowerError::Invalid("no nodes".into()));
    }
    let mut sorted: Vec<NodeId> = nodes.to_vec();
    sorted.sort();
    sorted.dedup();
    if let Some(n) = sorted.iter().find(|n| n.index() >= g.nodes().len()) {
        return Err(LowerError::Invalid(format!("node id {} out of range", n.0)));
    }
    let mut l = Lowerer::new(g, sorted, name, opts)?;
    l.run().map_err(|f| l.to_error(f))?;
    if let Some(f) = l.unevaluated().or_else(|| l.lost_check()) {
        return Err(l.to_error(f));
    }
    Ok(l.finish())
}

/// Why an expression could not be built.
#[derive(Debug)]
pub(crate) enum Fail {
    /// A node cannot be lowered.
    Unsupported(NodeId, String),
    /// The value of an anchor is needed at an index other than the one it just produced.
    NeedMat(ValueId),
}

pub(crate) type R<T> = Result<T, Fail>;

/// How a node is lowered.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Inline,
    Anchor,
}

pub(crate) struct Lowerer<'g> {
    // The graph and the group (expression building in `expr.rs` reads `g` directly).
    g: &'g Graph,
    opts: LowerOptions,
    grp: Group,
    // The kernel under construction.
    k: Kernel,
    bufs: Buffers,
    prog: Progress,
    body: Vec<Stmt>,
    // Expression building: names, index ranges, temporaries and guards.
    counters: HashMap<&'static str, usize>,
    ranges: Ranges,
    /// Common subexpressions of the current block: (value, index) → temporary.
    cse: Vec<(ValueId, Vec<Expr>, VarId)>,
    lets: Vec<Stmt>,
    cse_on: bool,
    /// Inside a guarded branch (padding, concat): no hoisting of loads out of it.
    guard: usize,
    /// Nodes whose inline expression checks indices read from data (see `checked_index`).
    checking: HashSet<NodeId>,
    /// Temporaries that hold a checked index (not loop variables, whatever their range).
    check_vars: HashSet<VarId>,
}

/// The group being lowered, fixed once built.
struct Group {
    nodes: Vec<NodeId>,
    set: HashSet<NodeId>,
    uses: Vec<Uses>,
    /// Group outputs, in order.
    outputs: Vec<ValueId>,
}

/// The kernel's buffers.
struct Buffers {
    /// Group inputs in first-use order (the candidates for parameters).
    input_order: Vec<ValueId>,
    inputs: HashMap<ValueId, BufId>,
    outputs: HashMap<ValueId, BufId>,
    /// Anchor values stored in a buffer, readable by later nests.
    mat: HashMap<ValueId, BufId>,
    /// Local buffers allocated at the top of the kernel.
    locals: Vec<BufId>,
}

/// What has been produced so far.
#[derive(Default)]
struct Progress {
    /// Anchor values available as scalars at one index.
    bound: Vec<(ValueId, Vec<Expr>, Expr)>,
    /// Group outputs stored.
    done: HashSet<ValueId>,
    /// Anchors whose nest is built.
    emitted: HashSet<NodeId>,
    /// Inline nodes whose expression was built at least once (see `unevaluated`).
    evaluated: HashSet<NodeId>,
}

pub(crate) struct BlockMark {
    cse_len: usize,
    lets: Vec<Stmt>,
}

/// The dtype arithmetic runs in: narrow floats compute in f32.
pub(crate) fn compute_dtype(d: DType) -> DType {
    match d {
        DType::F16 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2 => DType::F32,
        d => d,
    }
}

/// A literal of dtype `d` with value `x`.
pub(crate) fn lit(x: f64, d: DType) -> Expr {
    if d.is_float() {
        Expr::Lit(Lit::Float(x, d))
    } else if d == DType::Bool {
        Expr::Lit(Lit::Bool(x != 0.0))
    } else if d.is_signed_int() {
        Expr::Lit(Lit::Int(x as i64, d))
    } else {
        Expr::Lit(Lit::UInt(x as u64, d))
    }
}

pub(crate) fn lit_i(x: i64, d: DType) -> Expr {
    if d.is_float() {
        Expr::Lit(Lit::Float(x as f64, d))
    } else if d == DType::Bool {
        Expr::Lit(Lit::Bool(x != 0))
    } else if d.is_signed_int() {
        Expr::Lit(Lit::Int(x, d))
    } else {
        Expr::Lit(Lit::UInt(x as u64, d))
    }
}

fn trivial(e: &Expr) -> bool {
    matches!(e, Expr::Var(_) | Expr::Lit(_) | Expr::Int(_))
}

pub(crate) fn bin(op: BinOp, a: Expr, b: Expr) -> Expr {
    Expr::bin(op, a, b)
}

pub(crate) fn ravel(idx: &[Expr], shape: &[i64]) -> Expr {
    let mut e = Expr::Int(0);
    for (i, x) in idx.iter().enumerate() {
        let stride: i64 = shape[i + 1..].iter().product();
        e = Expr::add(e, Expr::mul(x.clone(), Expr::Int(stride)));
    }
    e
}

pub(crate) fn unravel(flat: Expr, shape: &[i64]) -> Vec<Expr> {
    let mut out = Vec::with_capacity(shape.len());
    for i in 0..shape.len() {
        if shape[i] == 1 {
            out.push(Expr::Int(0));
            continue;
        }
        let stride: i64 = shape[i + 1..].iter().product();
        let q = bin(BinOp::Div, flat.clone(), Expr::Int(stride));
        out.push(if i == 0 {
            q
        } else {
            bin(BinOp::Rem, q, Expr::Int(shape[i]))
        });
    }
    out
}

impl<'g> Lowerer<'g> {
    fn new(g: &'g Graph, nodes: Vec<NodeId>, name: &str, opts: LowerOptions) -> Result<Lowerer<'g>, LowerError> {
        let set: HashSet<NodeId> = nodes.iter().copied().collect();
        let uses = g.uses();
        let in_set = |v: ValueId| matches!(g.value(v).def, ValueDef::Node { node, .. } if set.contains(&node));
        // Inputs in first-use order; outputs as the partitioner computes them.
        let mut input_order = Vec::new();
        let mut seen = HashSet::new();
        let mut outputs = Vec::new();
        for n in &nodes {
            let node = g.node(*n);
            for &v in &node.inputs {
                if !in_set(v) && seen.insert(v) {
                    input_order.push(v);
                }
            }
            for &v in &node.outputs {
                let u = &uses[v.index()];
                if !u.by_output.is_empty() || u.by_node.iter().any(|(c, _)| !set.contains(c)) {
                    outputs.push(v);
                }
            }
        }
        // Concrete shapes everywhere the kernel looks.
        for n in &nodes {
            let node = g.node(*n);
            for &v in node.inputs.iter().chain(&node.outputs) {
                if g.value(v).ty.fixed_shape().is_none() {
                    return Err(LowerError::Symbolic {
                        value: g.value(v).name.clone(),
                    });
                }
            }
        }
        let mut l = Lowerer {
            g,
            opts,
            grp: Group {
                nodes,
                set,
                uses,
                outputs: outputs.clone(),
            },
            k: Kernel::new(name),
            bufs: Buffers {
                input_order,
                inputs: HashMap::new(),
                outputs: HashMap::new(),
                mat: HashMap::new(),
                locals: Vec::new(),
            },
            prog: Progress::default(),
            body: Vec::new(),
            counters: HashMap::new(),
            ranges: Ranges::new(),
            cse: Vec::new(),
            lets: Vec::new(),
            cse_on: true,
            guard: 0,
            checking: HashSet::new(),
            check_vars: HashSet::new(),
        };
        for (i, &v) in outputs.iter().enumerate() {
            let ty = &g.value(v).ty;
            let shape = l.shape(v);
            let b =
                l.k.buffer(format!("out{i}"), ty.dtype, shape, Scope::Global);
            l.bufs.outputs.insert(v, b);
        }
        Ok(l)
    }

    fn to_error(&self, f: Fail) -> LowerError {
        match f {
            Fail::Unsupported(n, why) => {
                let node = self.g.node(n);
                LowerError::Unsupported {
                    node: node.name.clone(),
                    op: node.op.name(),
                    why,
                }
            }
            Fail::NeedMat(v) => {
                let (node, op) = match self.g.value(v).def {
                    ValueDef::Node { node, .. } => {
                        (self.g.node(node).name.clone(), self.g.node(node).op.name())
                    }
                    _ => (self.g.value(v).name.clone(), "value"),
                };
                LowerError::Unsupported {
                    node,
                    op,
                    why: format!(
                        "value '{}' is read at an index the kernel does not produce it at",
                        self.g.value(v).name
                    ),
                }
            }
        }
    }

    // ---- small helpers ----

    pub fn shape(&self, v: ValueId) -> Vec<i64> {
        self.g
            .value(v)
            .ty
            .fixed_shape()
            .unwrap_or_default()
            .into_iter()
            .map(|d| d as i64)
            .collect()
    }
    pub fn node(&self, n: NodeId) -> &'g tilec_ir::Node {
        self.g.node(n)
    }
    pub fn dtype(&self, v: ValueId) -> DType {
        self.g.value(v).ty.dtype
    }
    pub fn numel(&self, v: ValueId) -> i64 {
        self.shape(v).iter().product()
    }

    pub fn fresh(&mut self, prefix: &'static str) -> String {
        let c = self.counters.entry(prefix).or_insert(0);
        let s = format!("{prefix}{c}");
        *c += 1;
        s
    }

    /// A new loop variable over `0..extent`.
    pub fn loop_var(&mut self, prefix: &'static str, extent: i64) -> VarId {
        let name = self.fresh(prefix);
        let v = self.k.index_var(name);
        self.ranges.insert(v, extent);
        v
    }

    pub fn elem_var(&mut self, prefix: &'static str, d: DType, mutable: bool) -> VarId {
        let name = self.fresh(prefix);
        self.k.new_var(name, Ty::Elem(d), mutable)
    }

    pub fn simp(&self, e: Expr) -> Expr {
        simplify(e, &self.ranges)
    }

    /// A local buffer allocated at the top of the kernel.
    pub fn local(&mut self, d: DType, shape: Vec<i64>) -> BufId {
        let name = self.fresh("loc");
        let b = self.k.buffer(name, d, shape, Scope::Local);
        self.bufs.locals.push(b);
        b
    }

    /// A local buffer allocated by the caller (`Stmt::Alloc` in the block that uses it).
    pub fn scratch(&mut self, d: DType, shape: Vec<i64>) -> BufId {
        let name = self.fresh("loc");
        self.k.buffer(name, d, shape, Scope::Local)
    }

    pub fn node_of(&self, v: ValueId) -> Option<(NodeId, usize)> {
        match self.g.value(v).def {
            ValueDef::Node { node, index } => Some((node, index)),
            _ => None,
        }
    }

    pub fn opts(&self) -> LowerOptions {
        self.opts
    }

    /// Whether node `n` is one of the group's.
    pub fn in_group(&self, n: NodeId) -> bool {
        self.grp.set.contains(&n)
    }

    /// Whether `v` is a group output or read by a node of the group.
    pub fn is_used(&self, v: ValueId) -> bool {
        let read = |(c, _): &(NodeId, usize)| self.grp.set.contains(c);
        self.grp.outputs.contains(&v) || self.grp.uses[v.index()].by_node.iter().any(read)
    }

    /// The dtype of variable `v` (`I64` for an index).
    pub fn var_dtype(&self, v: VarId) -> DType {
        match self.k.var_info(v).ty {
            Ty::Elem(d) => d,
            Ty::Index => DType::I64,
        }
    }

    /// A new index temporary (a `Let`, not a loop: it has no range).
    pub fn index_temp(&mut self, prefix: &'static str) -> VarId {
        let name = self.fresh(prefix);
        self.k.index_var(name)
    }

    /// The range of values `e` takes as the enclosing loops run, when known.
    pub fn range_of(&self, e: &Expr) -> Option<(i64, i64)> {
        simplify::expr_range(e, &self.ranges)
    }

    /// `f` built inside a guarded branch when `on`: what it reads is not hoisted out of it.
    pub fn guarded<T>(&mut self, on: bool, f: impl FnOnce(&mut Self) -> T) -> T {
        let g = usize::from(on);
        self.guard += g;
        let r = f(self);
        self.guard -= g;
        r
    }

    /// `f` built without temporaries (a pure expression, such as a GEMM operand).
    pub fn without_cse<T>(&mut self, f: impl FnOnce(&mut Self) -> T) -> T {
        let saved = self.cse_on;
        self.cse_on = false;
        let r = f(self);
        self.cse_on = saved;
        r
    }

    /// The group outputs stored so far; with [`restore_stored`](Self::restore_stored), code
    /// that runs the epilogue at several places starts each from the same state.
    pub fn stored(&self) -> HashSet<ValueId> {
        self.prog.done.clone()
    }

    pub fn restore_stored(&mut self, s: HashSet<ValueId>) {
        self.prog.done = s;
    }

    pub fn unsupported<T>(&self, n: NodeId, why: impl Into<String>) -> R<T> {
        Err(Fail::Unsupported(n, why.into()))
    }

    /// Nested loops over `extents` (one per var, outermost first) around `body`; extent-1
    /// loops are kept only when `vars` says so (callers pass index `Int(0)` for those).
    pub fn nest(vars: &[(VarId, i64)], body: Vec<Stmt>) -> Vec<Stmt> {
        let mut b = body;
        for &(v, n) in vars.iter().rev() {
            b = vec![Stmt::for_(v, n, b)];
        }
        b
    }

    /// Index variables for a loop nest over `shape`: one loop per dimension of extent > 1,
    /// `Int(0)` for the others.
    pub fn index_space(
        &mut self,
        shape: &[i64],
        prefix: &'static str,
    ) -> (Vec<(VarId, i64)>, Vec<Expr>) {
        let mut loops = Vec::new();
        let mut idx = Vec::new();
        for &n in shape {
            if n == 1 {
                idx.push(Expr::Int(0));
            } else {
                let v = self.loop_var(prefix, n);
                loops.push((v, n));
                idx.push(Expr::Var(v));
            }
        }
        (loops, idx)
    }

    // ---- blocks and common subexpressions ----

    pub fn begin_block(&mut self) -> BlockMark {
        BlockMark {
            cse_len: self.cse.len(),
            lets: std::mem::take(&mut self.lets),
        }
    }

    /// Ends a block: returns the temporaries defined in it (to place before its statement).
    pub fn end_block(&mut self, m: BlockMark) -> Vec<Stmt> {
        self.cse.truncate(m.cse_len);
        std::mem::replace(&mut self.lets, m.lets)
    }

    /// Takes the temporaries defined so far in the current block.
    pub fn take_lets(&mut self) -> Vec<Stmt> {
        std::mem::take(&mut self.lets)
    }

    /// `e` as a temporary of dtype `d` (unless trivial): the `Let` goes to the current block.
    pub fn hoist(&mut self, e: Expr, d: DType) -> Expr {
        if trivial(&e) || matches!(e, Expr::Load(..)) {
            return e;
        }
        let t = self.elem_var("t", d, false);
        self.lets.push(Stmt::Let { var: t, value: e });
        Expr::Var(t)
    }

    fn multi_use(&self, v: ValueId) -> bool {
        let u = &self.grp.uses[v.index()];
        let inside = u
            .by_node
            .iter()
            .filter(|(n, _)| self.grp.set.contains(n))
            .count();
        inside + usize::from(self.grp.outputs.contains(&v)) > 1
    }

    pub fn kind(&self, n: NodeId) -> Kind {
        anchor::kind_of(&self.g.node(n).op)
    }

    /// `idx` with the index of every size-1 dimension of `v` replaced by 0 (the only value it
    /// can take), so that indices built through broadcasting compare equal to the anchor's.
    fn unit_dims_zero(&self, v: ValueId, mut idx: Vec<Expr>) -> Vec<Expr> {
        for (e, &d) in idx.iter_mut().zip(&self.shape(v)) {
            if d == 1 {
                *e = Expr::Int(0);
            }
        }
        idx
    }

    /// The expression of element `idx` of value `v`.
    pub fn value_at(&mut self, v: ValueId, idx: &[Expr]) -> R<Expr> {
        let idx: Vec<Expr> = idx.iter().map(|e| self.simp(e.clone())).collect();
        if self.prog.bound.iter().any(|(bv, _, _)| *bv == v) {
            let key = self.unit_dims_zero(v, idx.clone());
            if let Some((_, _, e)) = self.prog.bound.iter().rev().find(|(bv, bi, _)| *bv == v && *bi == key) {
                return Ok(e.clone());
            }
            // `v` is being produced right here (an epilogue that runs at several places, a
            // Winograd tile's pixels): its buffer holds only what earlier places stored, so
            // its other elements are read after the anchor, not from that buffer now.
            if self.bufs.mat.contains_key(&v) {
                return Err(Fail::NeedMat(v));
            }
        }
        if let Some(&b) = self.bufs.mat.get(&v) {
            return Ok(Expr::Load(b, idx));
        }
        if let Some(&b) = self.bufs.inputs.get(&v) {
            return Ok(Expr::Load(b, idx));
        }
        match &self.g.value(v).def {
            ValueDef::Const(t) => {
                if t.numel() == 1 {
                    let d = t.dtype();
                    return Ok(if d.is_float() {
                        lit(t.to_f64_vec()[0], d)
                    } else if d == DType::U64 {
                        Expr::Lit(Lit::UInt(t.as_slice::<u64>().map(|s| s[0]).unwrap_or(0), d))
                    } else {
                        lit_i(t.to_i64_vec()[0], d)
                    });
                }
                Ok(self.input_load(v, idx))
            }
            ValueDef::Input => Ok(self.input_load(v, idx)),
            ValueDef::Node { node, index } => {
                let (node, index) = (*node, *index);
                let op = &self.g.node(node).op;
                let source = matches!(op, Op::Source(_));
                if !self.grp.set.contains(&node) && !source {
                    return Ok(self.input_load(v, idx));
                }
                if self.kind(node) == Kind::Anchor && !anchor::inline_output(op, index) {
                    return Err(Fail::NeedMat(v));
                }
                let cse = self.cse_on && self.guard == 0 && self.multi_use(v);
                if cse {
                    if let Some((_, _, t)) =
                        self.cse.iter().find(|(cv, ci, _)| *cv == v && *ci == idx)
                    {
                        return Ok(Expr::Var(*t));
                    }
                }
                self.prog.evaluated.insert(node);
                let e = self.inline(node, index, &idx)?;
                if self.checking.contains(&node) && !self.covers(&idx, &self.shape(v)) {
                    // Only part of the value is read here, so only part of its indices would be
                    // checked: it gets a kernel of its own, which computes every element.
                    return self.unsupported(node, "a checked index op read only in part");
                }
                if cse && !trivial(&e) && !matches!(e, Expr::Load(..)) {
                    let t = self.elem_var("t", self.dtype(v), false);
                    self.lets.push(Stmt::Let { var: t, value: e });
                    self.cse.push((v, idx, t));
                    return Ok(Expr::Var(t));
                }
                Ok(e)
            }
        }
    }

    /// Whether the index `idx` into a value of `shape` takes every position as the enclosing
    /// loops run: each dimension longer than 1 is indexed by its own loop variable over
    /// exactly its extent.
    fn covers(&self, idx: &[Expr], shape: &[i64]) -> bool {
        let mut seen = HashSet::new();
        idx.len() == shape.len()
            && idx.iter().zip(shape).all(|(e, &d)| {
                d == 1
                    || matches!(e, Expr::Var(v) if !self.check_vars.contains(v)
                        && self.ranges.get(v) == Some(&d)
                        && seen.insert(*v))
            })
    }

    fn input_load(&mut self, v: ValueId, idx: Vec<Expr>) -> Expr {
        let b = match self.bufs.inputs.get(&v) {
            Some(&b) => b,
            None => {
                let i = self.bufs.inputs.len();
                let ty = &self.g.value(v).ty;
                let shape = self.shape(v);
                let b = self
                    .k
                    .buffer(format!("in{i}"), ty.dtype, shape, Scope::Global);
                self.bufs.inputs.insert(v, b);
                if !self.bufs.input_order.contains(&v) {
                    self.bufs.input_order.push(v);
                }
                b
            }
        };
        Expr::Load(b, idx)
    }

    // ---- the driver ----

    fn run(&mut self) -> R<()> {
        // Every node must be lowerable before any code is built.
        for &n in &self.grp.nodes.clone() {
            anchor::check(self, n)?;
        }
        for &n in &self.grp.nodes.clone() {
            if self.kind(n) == Kind::Anchor {
                let stmts = anchor::lower(self, n)?;
                self.body.extend(stmts);
                self.prog.emitted.insert(n);
            }
        }
        // Outputs not written by an anchor's epilogue: one nest per distinct shape.
        let pending: Vec<ValueId> = self
            .grp
            .outputs
            .iter()
            .copied()
            .filter(|v| !self.prog.done.contains(v))
            .collect();
        let mut shapes: Vec<Vec<i64>> = Vec::new();
        for &v in &pending {
            let s = self.shape(v);
            if !shapes.contains(&s) {
                shapes.push(s);
            }
        }
        for s in shapes {
            let (loops, idx) = self.index_space(&s, "i");
            let mut inner = Vec::new();
            let m = self.begin_block();
            for &v in &pending {
                if self.shape(v) != s {
                    continue;
                }
                let e = self.value_at(v, &idx)?;
                inner.extend(self.take_lets());
                inner.push(Stmt::store(self.bufs.outputs[&v], idx.clone(), e));
                self.prog.done.insert(v);
            }
            self.end_block(m);
            self.body.extend(Self::nest(&loops, inner));
        }
        Ok(())
    }

    /// An inline node of the group whose expression was never built: its consumers read none
    /// of its elements (through an empty gather, slice or concatenation), so whatever indices
    /// it reads would go unchecked, where the interpreter computes every node and checks them
    /// all. Whether it reads indices shows only once its expression is built, so any such
    /// node runs in a kernel of its own, which computes each of its elements. Only graphs with
    /// empty values take this path.
    fn unevaluated(&self) -> Option<Fail> {
        let n = self.grp.nodes.iter().copied().find(|&n| self.kind(n) == Kind::Inline && !self.prog.evaluated.contains(&n))?;
        Some(Fail::Unsupported(n, "no element of it is computed, so its indices would go unchecked".into()))
    }

    /// A check site no statement of the body refers to any more: an index check was dropped
    /// with the index expression that held it (checks that had to stay inline, see
    /// `checked_index`). The node then runs where its indices are checked.
    fn lost_check(&self) -> Option<Fail> {
        let mut seen = vec![false; self.k.checks.len()];
        for s in &self.body {
            s.visit_exprs(&mut |e| {
                e.visit(&mut |x| {
                    if let Expr::CheckIndex(_, c) = x {
                        if let Some(f) = seen.get_mut(c.site as usize) {
                            *f = true;
                        }
                    }
                });
            });
        }
        let lost = seen.iter().position(|f| !f)?;
        let site = &self.k.checks[lost];
        let n = self.grp.set.iter().copied().find(|&n| self.g.node(n).name == site.node)?;
        Some(Fail::Unsupported(n, format!("the check of {} was lost in lowering", site.input)))
    }

    fn finish(self) -> Lowered {
        let mut k = self.k;
        // Inputs the body actually reads, in the group's order.
        let mut read = HashSet::new();
        for s in &self.body {
            s.visit(&mut |st| {
                let mut f = |e: &Expr| {
                    e.visit(&mut |x| {
                        if let Expr::Load(b, _) = x {
                            read.insert(*b);
                        }
                    })
                };
                match st {
                    Stmt::Store { index, value, .. } => {
                        index.iter().for_each(&mut f);
                        f(value);
                    }
                    Stmt::Let { value, .. } | Stmt::Assign { value, .. } => f(value),
                    Stmt::If { cond, .. } => f(cond),
                    Stmt::Gemm(gm) => {
                        f(&gm.a);
                        f(&gm.b);
                    }
                    _ => {}
                }
            });
        }
        let inputs: Vec<ValueId> = self
            .bufs
            .input_order
            .iter()
            .copied()
            .filter(|v| self.bufs.inputs.get(v).is_some_and(|b| read.contains(b)))
            .collect();
        let mut params: Vec<BufId> = inputs.iter().map(|v| self.bufs.inputs[v]).collect();
        params.extend(self.grp.outputs.iter().map(|v| self.bufs.outputs[v]));
        // Name parameters by position so that names follow the ABI order.
        for (i, &b) in params.iter().enumerate() {
            let is_in = i < inputs.len();
            k.buffers[b.0 as usize].name = if is_in {
                format!("in{i}")
            } else {
                format!("out{}", i - inputs.len())
            };
        }
        k.params = params;
        let mut body: Vec<Stmt> = self.bufs.locals.iter().map(|&b| Stmt::Alloc(b)).collect();
        body.extend(self.body);
        k.body = body;
        // Buffers created for inputs that ended up unused are dropped from nothing: they stay
        // declared (global, not parameters) but are never referenced. Remove them so every
        // global buffer is a parameter.
        let unused: Vec<BufId> = self
            .bufs
            .inputs
            .values()
            .copied()
            .filter(|b| !read.contains(b))
            .collect();
        if !unused.is_empty() {
            k = drop_buffers(k, &unused);
        }
        Lowered {
            kernel: k,
            inputs,
            outputs: self.grp.outputs,
        }
    }

    // ---- epilogues ----

    /// Statements to run where the anchor has just produced `val` = element `aidx` of `v`:
    /// the group outputs that read it element for element, and its materialization if
    /// something else needs it.
    pub fn epilogue(&mut self, v: ValueId, aidx: &[Expr], val: Expr) -> R<Vec<Stmt>> {
        let aidx: Vec<Expr> = aidx.iter().map(|e| self.simp(e.clone())).collect();
        let mut out = Vec::new();
        let d = self.dtype(v);
        // The anchor's element, rounded to its dtype once.
        let val = if trivial(&val) {
            val
        } else {
            let t = self.elem_var("t", d, false);
            out.push(Stmt::Let { var: t, value: val });
            Expr::Var(t)
        };
        let key = self.unit_dims_zero(v, aidx.clone());
        self.prog.bound.push((v, key, val.clone()));
        let cands: Vec<ValueId> = self
            .grp
            .outputs
            .iter()
            .copied()
            .filter(|o| !self.prog.done.contains(o) && self.depends(*o, v))
            .collect();
        for o in cands {
            let Some(oidx) = self.forward_index(v, &aidx, o) else {
                continue;
            };
            let m = self.begin_block();
            match self.value_at(o, &oidx) {
                Ok(e) => {
                    let lets = self.end_block(m);
                    out.extend(lets);
                    let oidx = oidx.into_iter().map(|e| self.simp(e)).collect();
                    out.push(Stmt::store(self.bufs.outputs[&o], oidx, e));
                    self.prog.done.insert(o);
                }
                Err(Fail::NeedMat(_)) => {
                    self.end_block(m);
                }
                Err(e) => {
                    self.end_block(m);
                    self.prog.bound.pop();
                    return Err(e);
                }
            }
        }
        if self.needed_later(v) {
            if self.prog.done.contains(&v) {
                self.bufs.mat.insert(v, self.bufs.outputs[&v]);
            } else {
                // One buffer however many places produce elements of `v` (a Winograd tile's
                // pixels each run the epilogue).
                let b = match self.bufs.mat.get(&v) {
                    Some(&b) => b,
                    None => self.local(d, self.shape(v)),
                };
                out.push(Stmt::store(b, aidx, val));
                self.bufs.mat.insert(v, b);
            }
        }
        self.prog.bound.pop();
        Ok(out)
    }

    /// Whether output `o` reads value `v` through inline nodes of the set.
    fn depends(&self, o: ValueId, v: ValueId) -> bool {
        if o == v {
            return true;
        }
        let Some((n, _)) = self.node_of(o) else {
            return false;
        };
        if !self.grp.set.contains(&n) || self.kind(n) == Kind::Anchor {
            return false;
        }
        self.g.node(n).inputs.iter().any(|&x| self.depends(x, v))
    }

    /// Whether `v` is still read by something not yet produced.
    fn needed_later(&self, v: ValueId) -> bool {
        if self.grp.outputs.contains(&v) && !self.prog.done.contains(&v) {
            return true;
        }
        for (n, _) in &self.grp.uses[v.index()].by_node {
            if !self.grp.set.contains(n) {
                continue;
            }
            if self.kind(*n) == Kind::Anchor {
                if !self.prog.emitted.contains(n) {
                    return true;
                }
                continue;
            }
            if self
                .g
                .node(*n)
                .outputs
                .iter()
                .any(|&w| self.needed_later(w))
            {
                return true;
            }
        }
        false
    }

    /// The index of output `o` at which element `aidx` of `v` is read, following the path of
    /// shape-preserving ops (elementwise, transpose, reshape) from `v` to `o`.
    fn forward_index(&self, v: ValueId, aidx: &[Expr], o: ValueId) -> Option<Vec<Expr>> {
        if self.numel(o) != self.numel(v) {
            return None;
        }
        // The path from o back to v.
        let mut path = Vec::new();
        let mut cur = o;
        while cur != v {
            let (n, _) = self.node_of(cur)?;
            let node = self.g.node(n);
            let slot = node.inputs.iter().position(|&x| self.depends(x, v))?;
            path.push((n, slot));
            cur = node.inputs[slot];
        }
        let mut idx = aidx.to_vec();
        let mut at = v;
        for &(n, slot) in path.iter().rev() {
            let node = self.g.node(n);
            let out = node.outputs[0];
            let (ins, outs) = (self.shape(node.inputs[slot]), self.shape(out));
            idx = match &node.op {
                Op::Layout(tilec_ir::op::LayoutOp::Transpose { perm }) => {
                    perm.iter().map(|&p| idx[p].clone()).collect()
                }
                Op::Layout(tilec_ir::op::LayoutOp::Reshape { .. }) => {
                    unravel(ravel(&idx, &ins), &outs)
                }
                _ if ins == outs && node.outputs.len() == 1 => idx,
                _ => return None,
            };
            at = out;
        }
        debug_assert_eq!(at, o);
        Some(idx)
    }
}

/// Removes buffers that nothing references (renumbering the others).
fn drop_buffers(mut k: Kernel, drop: &[BufId]) -> Kernel {
    let mut map = Vec::with_capacity(k.buffers.len());
    let mut kept = Vec::new();
    for (i, b) in k.buffers.iter().enumerate() {
        if drop.contains(&BufId(i as u32)) {
            map.push(None);
        } else {
            map.push(Some(BufId(kept.len() as u32)));
            kept.push(b.clone());
        }
    }
    let re = |b: BufId| map[b.0 as usize].unwrap_or(b);
    k.buffers = kept;
    k.params = k.params.iter().map(|&b| re(b)).collect();
    // `map_exprs` reaches every nested statement itself: each load is renumbered once.
    for s in &mut k.body {
        s.map_exprs(&mut |e| {
            e.rewrite(&mut |x| match x {
                Expr::Load(b, i) => Expr::Load(re(b), i),
                x => x,
            })
        });
    }
    fn fix(s: &mut Stmt, re: &dyn Fn(BufId) -> BufId) {
        match s {
            Stmt::Store { buf, .. } => *buf = re(*buf),
            Stmt::Alloc(b) => *b = re(*b),
            Stmt::For(l) => l.body.iter_mut().for_each(|s| fix(s, re)),
            Stmt::If { then_, else_, .. } => {
                then_.iter_mut().for_each(|s| fix(s, re));
                else_.iter_mut().for_each(|s| fix(s, re));
            }
            Stmt::Gemm(g) => g.epilogue.iter_mut().for_each(|s| fix(s, re)),
            _ => {}
        }
    }
    for s in &mut k.body {
        fix(s, &re);
    }
    k
}
