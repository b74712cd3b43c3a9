//! Random small graphs: a pool of values grows by one op at a time, each op (`ops.rs`) applied
//! to a pool value, with partners made to fit it. Shapes are small, with 0 and 1 common and now
//! and then a longer dim; dtypes are f32/f16/bf16/i64/i32/bool; binary ops broadcast; index
//! operands are graph inputs (fresh values on every run) or constants. Each case is compiled
//! at a random optimization level on one or two threads.
//!
//! Values carry an *exact* flag: graph inputs and constants hold small multiples of 1/16, and
//! what is computed from them without rounding (layout and index ops, integer arithmetic, min,
//! max, abs, ...) stays exact. Ops whose result jumps where the operand moves by one rounding
//! step (comparisons, floor, casts to integers, argmax, a divisor, a logarithm) only take
//! exact operands, so that the compiled code and the interpreter, which round differently,
//! still have to agree.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tilec_ir::op::{LayoutOp, UnaryOp};
use tilec_ir::{DType, Graph, Op, Tensor, TensorType, ValueId};

use super::check::tolerance;

/// How the values of a graph input are drawn on each run.
#[derive(Clone, Debug, PartialEq)]
pub enum InputKind {
    /// Floats: multiples of 1/16 in [-3, 3]; integers in [-6, 6]; bools half and half.
    Data,
    /// Indices into axes of these sizes; element `i` addresses axis `i % bounds.len()` (the
    /// coordinates along GatherND's last index dimension). In range, negative ones included,
    /// unless the run asks for an out-of-range one.
    Index { bounds: Vec<usize> },
}

/// How a graph is compiled.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct Build {
    pub opt_level: u8,
    pub threads: usize,
}

impl Default for Build {
    fn default() -> Self {
        Build { opt_level: 3, threads: 1 }
    }
}

/// One generated graph, how to compile it and how to feed it.
#[derive(Clone, Debug)]
pub struct Case {
    pub seed: u64,
    pub graph: Graph,
    pub build: Build,
    /// One per graph input.
    pub inputs: Vec<InputKind>,
    /// A constant index operand is out of range: every run reads out of range.
    pub const_oob: bool,
}

/// A pool value and whether it is exact (see the module documentation).
#[derive(Copy, Clone)]
pub(super) struct Val {
    pub id: ValueId,
    pub exact: bool,
}

/// The generator's state: the graph so far, how its inputs are drawn, and the pool.
pub(super) struct Gen {
    pub rng: StdRng,
    pub g: Graph,
    kinds: Vec<InputKind>,
    pool: Vec<Val>,
    const_oob: bool,
}

const DTYPES: [(DType, u32); 6] =
    [(DType::F32, 4), (DType::F16, 2), (DType::BF16, 2), (DType::I64, 2), (DType::I32, 2), (DType::Bool, 1)];

/// Builds the graph of case `seed`.
pub fn generate(seed: u64) -> Case {
    let mut s = Gen {
        rng: StdRng::seed_from_u64(seed),
        g: Graph::new(&format!("fuzz{seed}")),
        kinds: vec![],
        pool: vec![],
        const_oob: false,
    };
    for _ in 0..s.rng.gen_range(1..=2) {
        let (dt, sh) = (s.dtype(), s.shape());
        let v = s.operand(dt, &sh, false);
        s.pool.push(v);
    }
    let steps = s.rng.gen_range(1..=12);
    let mut made = 0;
    for _ in 0..steps * 4 {
        if made == steps {
            break;
        }
        if let Some(v) = s.step() {
            s.pool.push(v);
            made += 1;
        }
    }
    if made == 0 {
        let a = s.pool[0];
        let op = if s.dt(a) == DType::Bool { UnaryOp::Not } else { UnaryOp::Abs };
        let v = s.g.add(Op::Unary(op), &[a.id]).expect("abs/not apply to every dtype they are given");
        s.pool.push(Val { id: v, exact: a.exact });
    }
    // Every computed value nothing reads, and now and then another one (an input or a
    // constant among them).
    let read: std::collections::HashSet<ValueId> = s.g.nodes().iter().flat_map(|n| n.inputs.clone()).collect();
    let mut outs: Vec<ValueId> =
        s.g.nodes().iter().flat_map(|n| n.outputs.clone()).filter(|v| !read.contains(v)).collect();
    if outs.len() > 3 {
        outs.drain(..outs.len() - 3);
    }
    for _ in 0..s.rng.gen_range(0..=1) {
        let v = s.pool[s.rng.gen_range(0..s.pool.len())].id;
        if !outs.contains(&v) {
            outs.push(v);
        }
    }
    s.g.set_outputs(outs);
    let _ = s.g.cleanup();
    tilec_ir::verify(&s.g).expect("generated graphs are valid");
    let build = Build { opt_level: [0, 1, 3, 3][s.rng.gen_range(0..4)], threads: s.rng.gen_range(1..=2) };
    Case { seed, graph: s.g, build, inputs: s.kinds, const_oob: s.const_oob }
}

/// Fresh input values for `case`; with `oob`, one element of each index input (that has one)
/// is out of range. Returns the inputs and whether any index is out of range.
pub fn inputs(case: &Case, rng: &mut impl Rng, oob: bool) -> (Vec<Tensor>, bool) {
    let mut any_oob = case.const_oob;
    let mut out = vec![];
    for (&v, kind) in case.graph.inputs().iter().zip(&case.inputs) {
        let ty = &case.graph.value(v).ty;
        let shape = ty.fixed_shape().expect("generated inputs have fixed shapes");
        let t = match kind {
            InputKind::Data => data(ty.dtype, &shape, rng),
            InputKind::Index { bounds } => {
                let (t, o) = indices(ty.dtype, &shape, bounds, rng, oob);
                any_oob |= o;
                t
            }
        };
        out.push(t);
    }
    (out, any_oob)
}

/// Data values (see [`InputKind::Data`]); now and then a float tensor has NaNs among them.
fn data(dt: DType, shape: &[usize], rng: &mut impl Rng) -> Tensor {
    let n: usize = shape.iter().product();
    let nans = if dt.is_float() && rng.gen_bool(0.05) { 0.1 } else { 0.0 };
    let vals: Vec<f64> = (0..n)
        .map(|_| match dt {
            DType::Bool => rng.gen_range(0..2) as f64,
            d if d.is_float() && rng.gen_bool(nans) => f64::NAN,
            d if d.is_float() => rng.gen_range(-48..=48) as f64 / 16.0,
            _ => rng.gen_range(-6..=6) as f64,
        })
        .collect();
    Tensor::from_f64s(dt, shape.to_vec(), &vals).expect("sizes agree")
}

fn indices(dt: DType, shape: &[usize], bounds: &[usize], rng: &mut impl Rng, oob: bool) -> (Tensor, bool) {
    let n: usize = shape.iter().product();
    let mut any = false;
    let mut vals: Vec<i64> = (0..n)
        .map(|i| match bounds[i % bounds.len()] as i64 {
            0 => {
                any = true;
                0
            }
            b => rng.gen_range(-b..b),
        })
        .collect();
    if oob && n > 0 {
        let i = rng.gen_range(0..n);
        let b = bounds[i % bounds.len()] as i64;
        let far = if dt == DType::I32 { i32::MAX as i64 } else { i64::MAX };
        vals[i] = [b, -b - 1, b + rng.gen_range(1..100), -b - rng.gen_range(2..1100), far, -far][rng.gen_range(0..6)];
        any = true;
    }
    (Tensor::from_i64s(dt, shape.to_vec(), &vals).expect("sizes agree"), any)
}

impl Gen {
    pub(super) fn dt(&self, v: Val) -> DType {
        self.g.value(v.id).ty.dtype
    }

    pub(super) fn sh(&self, v: Val) -> Vec<usize> {
        self.g.value(v.id).ty.fixed_shape().expect("generated shapes are fixed")
    }

    pub(super) fn dtype(&mut self) -> DType {
        let total: u32 = DTYPES.iter().map(|d| d.1).sum();
        let mut r = self.rng.gen_range(0..total);
        for (d, w) in DTYPES {
            if r < w {
                return d;
            }
            r -= w;
        }
        DType::F32
    }

    pub(super) fn dim(&mut self) -> usize {
        [0, 1, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 5, 5, 7][self.rng.gen_range(0..16)]
    }

    /// A dim past a vector width or a register tile now and then, so that vector loops,
    /// their tails and the GEMM micro-kernels run too.
    pub(super) fn long_dim(&mut self) -> usize {
        [8, 15, 16, 17, 31, 33, 48, 64][self.rng.gen_range(0..8)]
    }

    fn shape(&mut self) -> Vec<usize> {
        loop {
            let rank = [0, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 4][self.rng.gen_range(0..12)];
            let mut s: Vec<usize> = (0..rank).map(|_| self.dim()).collect();
            if rank > 0 && self.rng.gen_bool(0.25) {
                let i = self.rng.gen_range(0..rank);
                s[i] = self.long_dim();
            }
            if s.iter().product::<usize>() <= 2048 {
                return s;
            }
        }
    }

    /// A new graph input (most often) or constant with data values.
    pub(super) fn operand(&mut self, dt: DType, shape: &[usize], allow_const: bool) -> Val {
        let id = if allow_const && self.rng.gen_bool(0.3) {
            let t = data(dt, shape, &mut self.rng);
            self.g.add_const("c", t)
        } else {
            let name = format!("x{}", self.g.inputs().len());
            self.kinds.push(InputKind::Data);
            self.g.add_input(&name, TensorType::fixed(dt, shape))
        };
        Val { id, exact: true }
    }

    /// An index operand of `shape` over axes of sizes `bounds` (see [`InputKind::Index`]).
    pub(super) fn index_operand(&mut self, shape: &[usize], bounds: Vec<usize>) -> ValueId {
        let dt = if self.rng.gen_bool(0.5) { DType::I64 } else { DType::I32 };
        if self.rng.gen_bool(0.3) {
            let oob = self.rng.gen_bool(0.05);
            let (t, any) = indices(dt, shape, &bounds, &mut self.rng, oob);
            self.const_oob |= any;
            self.g.add_const("idx", t)
        } else {
            let name = format!("i{}", self.g.inputs().len());
            self.kinds.push(InputKind::Index { bounds });
            self.g.add_input(&name, TensorType::fixed(dt, shape))
        }
    }

    /// A pool value satisfying `ok`, else a new operand of `dt` and a random shape of rank
    /// `min_rank` or more.
    pub(super) fn pick(&mut self, ok: impl Fn(&Gen, Val) -> bool, dt: DType, min_rank: usize) -> Val {
        let fit: Vec<Val> = self.pool.iter().copied().filter(|&v| ok(self, v)).collect();
        if !fit.is_empty() && self.rng.gen_bool(0.85) {
            // The newest value half the time: chains, not only fans.
            let i = if self.rng.gen_bool(0.5) { fit.len() - 1 } else { self.rng.gen_range(0..fit.len()) };
            return fit[i];
        }
        let mut sh = self.shape();
        while sh.len() < min_rank {
            sh = self.shape();
        }
        self.operand(dt, &sh, true)
    }

    /// A shape that broadcasts with `s` (the result may be larger than `s`).
    pub(super) fn broadcast_partner(&mut self, s: &[usize]) -> Vec<usize> {
        let drop = self.rng.gen_range(0..=s.len().min(2));
        let mut p: Vec<usize> = s[drop..].to_vec();
        for d in p.iter_mut() {
            if self.rng.gen_bool(0.25) {
                *d = if *d == 1 { self.rng.gen_range(0..4) } else { 1 };
            }
        }
        if self.rng.gen_bool(0.15) {
            p.insert(0, self.rng.gen_range(1..4));
        }
        p
    }

    /// A partner of `a`'s dtype for a broadcasting op: a pool value or a new operand.
    pub(super) fn partner(&mut self, a: Val, exact: bool) -> Val {
        let (dt, sh) = (self.dt(a), self.sh(a));
        let fits = |s: &Gen, v: Val| s.dt(v) == dt && s.sh(v) == sh && (v.exact || !exact);
        if self.rng.gen_bool(0.4) {
            if let Some(&v) = self.pool.iter().find(|&&v| fits(self, v)) {
                return v;
            }
        }
        let p = self.broadcast_partner(&sh);
        self.operand(dt, &p, true)
    }

    pub(super) fn add(&mut self, op: Op, ins: &[ValueId], exact: bool) -> Option<Val> {
        let v = self.g.add(op, ins).ok()?;
        Some(Val { id: v, exact })
    }

    /// One random op on the pool; `None` when the drawn op does not apply.
    fn step(&mut self) -> Option<Val> {
        let any = |_: &Gen, _: Val| true;
        let float = |s: &Gen, v: Val| s.dt(v).is_float();
        let ranked = |s: &Gen, v: Val| !s.sh(v).is_empty();
        match self.rng.gen_range(0..23) {
            0..=2 => {
                let a = self.pick(any, DType::F32, 0);
                self.unary(a)
            }
            3..=5 => {
                let a = self.pick(any, DType::F32, 0);
                self.binary(a)
            }
            6 => {
                let a = self.pick(any, DType::F32, 0);
                let c = self.pick(|s, v| s.dt(v) == DType::Bool, DType::Bool, 0);
                let b = self.partner(a, false);
                self.add(Op::Where, &[c.id, a.id, b.id], a.exact && b.exact)
            }
            7 => {
                let a = self.pick(any, DType::F32, 0);
                let to = self.dtype();
                // A value that is not exact carries the rounding of its dtype: a cast to a dtype
                // compared more tightly (an integer, or f32 from f16 where a rounding tie went
                // the other way) would show that rounding as an error.
                if self.dt(a).is_float() && !a.exact && tolerance(to).0 < tolerance(self.dt(a)).0 {
                    return None;
                }
                self.add(Op::Cast { to, saturate: true }, &[a.id], a.exact)
            }
            8 => {
                let a = self.pick(any, DType::F32, 0);
                self.reduce(a)
            }
            9 => {
                let a = self.pick(|s, v| float(s, v) && ranked(s, v), DType::F32, 1);
                self.row_op(a)
            }
            10 => {
                let a = self.pick(|s, v| s.dt(v) != DType::Bool && ranked(s, v), DType::F32, 1);
                self.matmul(a)
            }
            11..=13 => {
                let a = self.pick(ranked, DType::F32, 1);
                self.gather(a)
            }
            14 => {
                let a = self.pick(ranked, DType::F32, 1);
                self.slice(a)
            }
            15 => {
                let a = self.pick(ranked, DType::F32, 1);
                self.concat(a)
            }
            16 => {
                let a = self.pick(any, DType::F32, 0);
                let mut perm: Vec<usize> = (0..self.sh(a).len()).collect();
                for i in (1..perm.len()).rev() {
                    perm.swap(i, self.rng.gen_range(0..=i));
                }
                self.add(Op::Layout(LayoutOp::Transpose { perm }), &[a.id], a.exact)
            }
            17 => {
                let a = self.pick(any, DType::F32, 0);
                self.reshape(a)
            }
            18 => {
                let a = self.pick(any, DType::F32, 0);
                self.expand_or_tile(a)
            }
            19 => {
                let a = self.pick(ranked, DType::F32, 1);
                self.scatter(a)
            }
            20 => {
                let a = self.pick(ranked, DType::F32, 1);
                self.split_or_trilu(a)
            }
            21 => {
                let a = self.pick(|s, v| s.dt(v) != DType::Bool && ranked(s, v), DType::F32, 1);
                self.scan_or_topk(a)
            }
            22 => self.one_hot(),
            _ => {
                let a = self.pick(ranked, DType::F32, 1);
                self.pad(a)
            }
        }
    }

}
