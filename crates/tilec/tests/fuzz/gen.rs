//! Random small graphs: a pool of values grows by one op at a time, each op applied to a pool
//! value (and partners made to fit it). Shapes are small, with 0 and 1 common; dtypes are
//! f32/f16/bf16/i64/i32/bool; binary ops broadcast; index operands are graph inputs (fresh
//! values on every run) or constants.
//!
//! Values carry an *exact* flag: graph inputs and constants hold small multiples of 1/16, and
//! what is computed from them without rounding (layout and index ops, integer arithmetic, min,
//! max, abs, ...) stays exact. Ops whose result jumps where the operand moves by one rounding
//! step (comparisons, floor, casts to integers, argmax, a divisor, a logarithm) only take
//! exact operands, so that the compiled code and the interpreter, which round differently,
//! still have to agree.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tilec_ir::op::{
    BinaryOp, IndexOp, LayoutOp, LinalgOp, NormOp, PadMode, ReduceKind, ReduceOp, SliceBound, UnaryOp,
};
use tilec_ir::{DType, Dim, Graph, Op, Tensor, TensorType, ValueId};

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

/// One generated graph and how to feed it.
#[derive(Clone, Debug)]
pub struct Case {
    pub seed: u64,
    pub graph: Graph,
    /// One per graph input.
    pub inputs: Vec<InputKind>,
    /// A constant index operand is out of range: every run reads out of range.
    pub const_oob: bool,
}

#[derive(Copy, Clone)]
struct Val {
    id: ValueId,
    exact: bool,
}

struct Gen {
    rng: StdRng,
    g: Graph,
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
    let steps = s.rng.gen_range(1..=8);
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
    Case { seed, graph: s.g, inputs: s.kinds, const_oob: s.const_oob }
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

fn data(dt: DType, shape: &[usize], rng: &mut impl Rng) -> Tensor {
    let n: usize = shape.iter().product();
    let vals: Vec<f64> = (0..n)
        .map(|_| match dt {
            DType::Bool => rng.gen_range(0..2) as f64,
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
    fn dt(&self, v: Val) -> DType {
        self.g.value(v.id).ty.dtype
    }

    fn sh(&self, v: Val) -> Vec<usize> {
        self.g.value(v.id).ty.fixed_shape().expect("generated shapes are fixed")
    }

    fn dtype(&mut self) -> DType {
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

    fn dim(&mut self) -> usize {
        [0, 1, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 5, 5, 7][self.rng.gen_range(0..16)]
    }

    fn shape(&mut self) -> Vec<usize> {
        loop {
            let rank = [0, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 4][self.rng.gen_range(0..12)];
            let s: Vec<usize> = (0..rank).map(|_| self.dim()).collect();
            if s.iter().product::<usize>() <= 200 {
                return s;
            }
        }
    }

    /// A new graph input (most often) or constant with data values.
    fn operand(&mut self, dt: DType, shape: &[usize], allow_const: bool) -> Val {
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
    fn index_operand(&mut self, shape: &[usize], bounds: Vec<usize>) -> ValueId {
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
    fn pick(&mut self, ok: impl Fn(&Gen, Val) -> bool, dt: DType, min_rank: usize) -> Val {
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
    fn broadcast_partner(&mut self, s: &[usize]) -> Vec<usize> {
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
    fn partner(&mut self, a: Val, exact: bool) -> Val {
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

    fn add(&mut self, op: Op, ins: &[ValueId], exact: bool) -> Option<Val> {
        let v = self.g.add(op, ins).ok()?;
        Some(Val { id: v, exact })
    }

    /// One random op on the pool; `None` when the drawn op does not apply.
    fn step(&mut self) -> Option<Val> {
        let any = |_: &Gen, _: Val| true;
        let float = |s: &Gen, v: Val| s.dt(v).is_float();
        let ranked = |s: &Gen, v: Val| !s.sh(v).is_empty();
        match self.rng.gen_range(0..20) {
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
                if self.dt(a).is_float() && !to.is_float() && !a.exact {
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
            _ => {
                let a = self.pick(ranked, DType::F32, 1);
                self.pad(a)
            }
        }
    }

    fn unary(&mut self, a: Val) -> Option<Val> {
        let dt = self.dt(a);
        let (op, exact) = if dt == DType::Bool {
            (UnaryOp::Not, true)
        } else if !dt.is_float() {
            let ops = [UnaryOp::Abs, UnaryOp::Neg, UnaryOp::Sign, UnaryOp::Relu, UnaryOp::BitwiseNot];
            (ops[self.rng.gen_range(0..ops.len())].clone(), true)
        } else if a.exact && self.rng.gen_bool(0.4) {
            // Discontinuous or ill-conditioned near some operand values.
            let ops = [
                (UnaryOp::Floor, true),
                (UnaryOp::Ceil, true),
                (UnaryOp::Round, true),
                (UnaryOp::Sign, true),
                (UnaryOp::Log, false),
                (UnaryOp::Sqrt, false),
                (UnaryOp::Reciprocal, false),
                (UnaryOp::IsNaN, true),
                (UnaryOp::IsInf { detect_negative: true, detect_positive: false }, true),
            ];
            ops[self.rng.gen_range(0..ops.len())].clone()
        } else {
            let ops = [
                (UnaryOp::Abs, a.exact),
                (UnaryOp::Neg, a.exact),
                (UnaryOp::Relu, a.exact),
                (UnaryOp::Exp, false),
                (UnaryOp::Sin, false),
                (UnaryOp::Cos, false),
                (UnaryOp::Tanh, false),
                (UnaryOp::Sigmoid, false),
                (UnaryOp::Erf, false),
                (UnaryOp::Softplus, false),
                (UnaryOp::Softsign, false),
                (UnaryOp::Gelu { tanh_approx: false }, false),
                (UnaryOp::Gelu { tanh_approx: true }, false),
                (UnaryOp::LeakyRelu { alpha: 0.1 }, false),
                (UnaryOp::Elu { alpha: 1.0 }, false),
                (UnaryOp::HardSigmoid { alpha: 0.2, beta: 0.5 }, false),
                (UnaryOp::HardSwish, false),
            ];
            ops[self.rng.gen_range(0..ops.len())].clone()
        };
        self.add(Op::Unary(op), &[a.id], exact)
    }

    fn binary(&mut self, a: Val) -> Option<Val> {
        use BinaryOp::*;
        let dt = self.dt(a);
        let b = self.partner(a, false);
        let exact = a.exact && b.exact;
        let (op, out_exact) = if dt == DType::Bool {
            ([And, Or, Xor, Equal][self.rng.gen_range(0..4)].clone(), true)
        } else if !dt.is_float() {
            let ops = [
                Add,
                Sub,
                Mul,
                Div,
                Mod { fmod: false },
                Mod { fmod: true },
                Min,
                Max,
                BitwiseAnd,
                BitwiseOr,
                BitwiseXor,
                Equal,
                Less,
                GreaterOrEqual,
            ];
            (ops[self.rng.gen_range(0..ops.len())].clone(), true)
        } else if exact && self.rng.gen_bool(0.4) {
            let ops = [
                (Div, false),
                (Pow, false),
                (Mod { fmod: true }, false),
                (Mod { fmod: false }, false),
                (PRelu, false),
                (Equal, true),
                (Less, true),
                (LessOrEqual, true),
                (Greater, true),
            ];
            ops[self.rng.gen_range(0..ops.len())].clone()
        } else {
            let ops = [(Add, false), (Sub, false), (Mul, false), (Min, exact), (Max, exact)];
            ops[self.rng.gen_range(0..ops.len())].clone()
        };
        let ins = if self.rng.gen_bool(0.5) { [a.id, b.id] } else { [b.id, a.id] };
        self.add(Op::Binary(op), &ins, out_exact)
    }

    fn reduce(&mut self, a: Val) -> Option<Val> {
        use ReduceKind::*;
        let (dt, rank) = (self.dt(a), self.sh(a).len());
        let keepdims = self.rng.gen_bool(0.5);
        if dt != DType::Bool && a.exact && rank > 0 && self.rng.gen_bool(0.25) {
            let axis = self.rng.gen_range(0..rank);
            let select_last_index = self.rng.gen_bool(0.3);
            let op = if self.rng.gen_bool(0.5) {
                ReduceOp::ArgMax { axis, keepdims, select_last_index }
            } else {
                ReduceOp::ArgMin { axis, keepdims, select_last_index }
            };
            return self.add(Op::Reduce(op), &[a.id], true);
        }
        let (kind, exact) = if dt == DType::Bool {
            ([Max, Min][self.rng.gen_range(0..2)], true)
        } else if !dt.is_float() {
            ([Sum, Max, Min, Prod][self.rng.gen_range(0..4)], true)
        } else {
            let kinds = [Sum, Mean, Max, Min, Prod, L1, L2, LogSumExp, SumSquare];
            let k = kinds[self.rng.gen_range(0..kinds.len())];
            (k, a.exact && matches!(k, Max | Min))
        };
        let axes: Vec<usize> = (0..rank).filter(|_| self.rng.gen_bool(0.5)).collect();
        // The max of nothing is -inf: not a small multiple of 1/16.
        let exact = exact && axes.iter().all(|&ax| self.sh(a)[ax] > 0);
        self.add(Op::Reduce(ReduceOp::Reduce { kind, axes, keepdims }), &[a.id], exact)
    }

    /// Softmax-like and normalization rows.
    fn row_op(&mut self, a: Val) -> Option<Val> {
        let sh = self.sh(a);
        let axis = self.rng.gen_range(0..sh.len());
        match self.rng.gen_range(0..5) {
            0 => self.add(Op::Norm(NormOp::Softmax { axis }), &[a.id], false),
            1 => self.add(Op::Norm(NormOp::LogSoftmax { axis }), &[a.id], false),
            2 if a.exact => self.add(Op::Norm(NormOp::Hardmax { axis }), &[a.id], true),
            3 => {
                let scale = self.operand(self.dt(a), &sh[axis..], true);
                self.add(Op::Norm(NormOp::RmsNorm { axis, epsilon: 1e-5 }), &[a.id, scale.id], false)
            }
            _ => {
                let has_bias = self.rng.gen_bool(0.5);
                let scale = self.operand(self.dt(a), &sh[axis..], true);
                let mut ins = vec![a.id, scale.id];
                if has_bias {
                    ins.push(self.operand(self.dt(a), &sh[axis..], true).id);
                }
                let op = NormOp::LayerNorm { axis, epsilon: 1e-5, stash: DType::F32, has_bias };
                let outs = self.g.add_node("ln", Op::Norm(op), &ins).ok()?;
                let k = if self.rng.gen_bool(0.8) { 0 } else { self.rng.gen_range(0..outs.len()) };
                Some(Val { id: outs[k], exact: false })
            }
        }
    }

    fn matmul(&mut self, a: Val) -> Option<Val> {
        let (dt, sh) = (self.dt(a), self.sh(a));
        let k = *sh.last().unwrap();
        let n = self.dim();
        let bsh = if sh.len() == 1 && self.rng.gen_bool(0.3) || self.rng.gen_bool(0.1) {
            vec![k]
        } else {
            let mut batch = if sh.len() > 2 { self.broadcast_partner(&sh[..sh.len() - 2]) } else { vec![] };
            if sh.len() <= 2 && self.rng.gen_bool(0.2) {
                batch.push(self.rng.gen_range(1..3));
            }
            [batch, vec![k, n]].concat()
        };
        let b = self.operand(dt, &bsh, true);
        let ins = [a.id, b.id];
        self.add(Op::Linalg(LinalgOp::MatMul), &ins, !dt.is_float())
    }

    fn small_shape(&mut self, max_rank: usize) -> Vec<usize> {
        let rank = self.rng.gen_range(0..=max_rank);
        (0..rank).map(|_| [0, 1, 1, 2, 2, 3, 4][self.rng.gen_range(0..7)]).collect()
    }

    fn gather(&mut self, a: Val) -> Option<Val> {
        let sh = self.sh(a);
        let rank = sh.len();
        match self.rng.gen_range(0..3) {
            0 => {
                let axis = self.rng.gen_range(0..rank);
                let ish = self.small_shape(2);
                let i = self.index_operand(&ish, vec![sh[axis]]);
                self.add(Op::Index(IndexOp::Gather { axis }), &[a.id, i], a.exact)
            }
            1 => {
                let axis = self.rng.gen_range(0..rank);
                let ish: Vec<usize> = (0..rank)
                    .map(|d| if d == axis { self.rng.gen_range(0..4) } else { self.rng.gen_range(0..=sh[d]) })
                    .collect();
                let i = self.index_operand(&ish, vec![sh[axis]]);
                self.add(Op::Index(IndexOp::GatherElements { axis }), &[a.id, i], a.exact)
            }
            _ => {
                let b = if rank >= 2 && self.rng.gen_bool(0.3) { 1 } else { 0 };
                let k = self.rng.gen_range(1..=rank - b);
                let mut ish = sh[..b].to_vec();
                ish.extend(self.small_shape(2));
                ish.push(k);
                let i = self.index_operand(&ish, sh[b..b + k].to_vec());
                self.add(Op::Index(IndexOp::GatherND { batch_dims: b }), &[a.id, i], a.exact)
            }
        }
    }

    fn slice(&mut self, a: Val) -> Option<Val> {
        let sh = self.sh(a);
        let mut axes: Vec<usize> = (0..sh.len()).filter(|_| self.rng.gen_bool(0.6)).collect();
        if axes.is_empty() {
            axes.push(self.rng.gen_range(0..sh.len()));
        }
        if self.rng.gen_bool(0.3) {
            axes.reverse();
        }
        let bound = |s: &mut Gen, d: usize| {
            let d = d as i64;
            match s.rng.gen_range(0..10) {
                0 => i64::MAX,
                1 => i64::MIN,
                _ => s.rng.gen_range(-d - 3..=d + 3),
            }
        };
        let (mut starts, mut ends, mut steps) = (vec![], vec![], vec![]);
        for &ax in &axes {
            starts.push(SliceBound::Index(bound(self, sh[ax])));
            ends.push(SliceBound::Index(bound(self, sh[ax])));
            steps.push([1, 1, 1, 2, 3, -1, -1, -2][self.rng.gen_range(0..8)]);
        }
        self.add(Op::Layout(LayoutOp::Slice { axes, starts, ends, steps }), &[a.id], a.exact)
    }

    fn concat(&mut self, a: Val) -> Option<Val> {
        let (dt, sh) = (self.dt(a), self.sh(a));
        let axis = self.rng.gen_range(0..sh.len());
        let mut ins = vec![a.id];
        let mut exact = a.exact;
        for _ in 0..self.rng.gen_range(1..=2) {
            if self.rng.gen_bool(0.2) {
                ins.push(a.id);
                continue;
            }
            let mut s2 = sh.clone();
            s2[axis] = self.rng.gen_range(0..4);
            let b = self.operand(dt, &s2, true);
            exact &= b.exact;
            ins.push(b.id);
        }
        if self.rng.gen_bool(0.5) {
            let j = self.rng.gen_range(0..ins.len());
            ins.swap(0, j);
        }
        self.add(Op::Layout(LayoutOp::Concat { axis }), &ins, exact)
    }

    fn reshape(&mut self, a: Val) -> Option<Val> {
        let n: usize = self.sh(a).iter().product();
        let rank = self.rng.gen_range(0..=4);
        let mut shape = vec![1usize; rank];
        if n == 0 {
            if rank == 0 {
                return None;
            }
            for d in shape.iter_mut() {
                *d = self.rng.gen_range(0..4);
            }
            let z = self.rng.gen_range(0..rank);
            shape[z] = 0;
        } else if rank == 0 {
            if n != 1 {
                return None;
            }
        } else {
            // Spread n's prime factors over the dims.
            let (mut m, mut p) = (n, 2);
            while m > 1 {
                if m % p == 0 {
                    let i = self.rng.gen_range(0..rank);
                    shape[i] *= p;
                    m /= p;
                } else {
                    p += 1;
                }
            }
        }
        let shape = shape.into_iter().map(Dim::Fixed).collect();
        self.add(Op::Layout(LayoutOp::Reshape { shape }), &[a.id], a.exact)
    }

    fn expand_or_tile(&mut self, a: Val) -> Option<Val> {
        let sh = self.sh(a);
        let op = if self.rng.gen_bool(0.7) {
            let mut t: Vec<usize> =
                sh.iter().map(|&d| if d == 1 { self.rng.gen_range(0..4) } else if self.rng.gen_bool(0.3) { 1 } else { d }).collect();
            for _ in 0..self.rng.gen_range(0..=2) {
                t.insert(0, self.rng.gen_range(1..4));
            }
            LayoutOp::Expand { shape: t.into_iter().map(Dim::Fixed).collect() }
        } else {
            LayoutOp::Tile { repeats: sh.iter().map(|_| self.rng.gen_range(0..=3)).collect() }
        };
        self.add(Op::Layout(op), &[a.id], a.exact)
    }

    fn pad(&mut self, a: Val) -> Option<Val> {
        let (dt, sh) = (self.dt(a), self.sh(a));
        let r = sh.len();
        let mode = [PadMode::Constant, PadMode::Constant, PadMode::Reflect, PadMode::Edge, PadMode::Wrap]
            [self.rng.gen_range(0..5)];
        let mut pads = vec![0i64; 2 * r];
        for i in 0..r {
            let n = sh[i] as i64;
            // Reflect needs two elements and at most n - 1 on a side; the others pad any amount.
            let hi = match mode {
                PadMode::Constant => 3,
                PadMode::Reflect if n < 2 => 0,
                PadMode::Reflect => (n - 1).min(3),
                _ if n == 0 => 0,
                _ => n.min(3),
            };
            let (b, e) = (self.rng.gen_range(-n.min(2)..=hi), self.rng.gen_range(-n.min(2)..=hi));
            if n + b + e < 0 {
                continue;
            }
            pads[i] = b;
            pads[i + r] = e;
        }
        let fill = Tensor::from_f64s(dt, vec![], &[[0.0, 1.0, -2.5][self.rng.gen_range(0..3)]]).ok()?;
        let fill = self.g.add_const("fill", fill);
        self.add(Op::Layout(LayoutOp::Pad { pads, mode }), &[a.id, fill], a.exact)
    }
}
