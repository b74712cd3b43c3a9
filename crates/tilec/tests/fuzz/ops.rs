//! The ops the generator applies to a pool value: each builds the operands the op needs
//! around it (partners, index operands, attributes that fit its shape) and adds the node, or
//! returns `None` when the op does not apply to the value.

use rand::Rng;
use tilec_ir::op::{
    BinaryOp, IndexOp, LayoutOp, LinalgOp, NormOp, PadMode, ReduceKind, ReduceOp, ScanKind, ScatterReduction,
    SliceBound, UnaryOp,
};
use tilec_ir::{DType, Dim, Op, Tensor};

use super::gen::{Gen, Val};

impl Gen {
    pub(super) fn unary(&mut self, a: Val) -> Option<Val> {
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
        // A periodic function turns the relative rounding error of a large argument into an
        // absolute error of the same size times the argument (cos(1e4) moves by 1e-3 when its
        // argument moves by one rounding step of a sum taken in another order). An argument
        // that is not exact is squashed into [-1, 1] first, where the error stays that of the
        // argument; exact ones of any size are the same on both sides.
        let a = if matches!(op, UnaryOp::Sin | UnaryOp::Cos) && !a.exact {
            self.add(Op::Unary(UnaryOp::Tanh), &[a.id], false)?
        } else {
            a
        };
        self.add(Op::Unary(op), &[a.id], exact)
    }

    pub(super) fn binary(&mut self, a: Val) -> Option<Val> {
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

    pub(super) fn reduce(&mut self, a: Val) -> Option<Val> {
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
    pub(super) fn row_op(&mut self, a: Val) -> Option<Val> {
        let sh = self.sh(a);
        let axis = self.rng.gen_range(0..sh.len());
        // A normalization divides by sqrt(var + epsilon): a row of values that are not exact
        // and nearly equal (4.625 and 4.625 plus a rounding step, after another layer norm)
        // has a variance of rounding noise, which the division blows up by 1/sqrt(epsilon).
        // Such rows get an epsilon that bounds that gain by 2; exact ones the usual one.
        let epsilon = if a.exact { 1e-5 } else { 0.25 };
        match self.rng.gen_range(0..5) {
            0 => self.add(Op::Norm(NormOp::Softmax { axis }), &[a.id], false),
            1 => self.add(Op::Norm(NormOp::LogSoftmax { axis }), &[a.id], false),
            2 if a.exact => self.add(Op::Norm(NormOp::Hardmax { axis }), &[a.id], true),
            3 => {
                let scale = self.operand(self.dt(a), &sh[axis..], true);
                self.add(Op::Norm(NormOp::RmsNorm { axis, epsilon }), &[a.id, scale.id], false)
            }
            _ => {
                let has_bias = self.rng.gen_bool(0.5);
                let scale = self.operand(self.dt(a), &sh[axis..], true);
                let mut ins = vec![a.id, scale.id];
                if has_bias {
                    ins.push(self.operand(self.dt(a), &sh[axis..], true).id);
                }
                let op = NormOp::LayerNorm { axis, epsilon, stash: DType::F32, has_bias };
                let outs = self.g.add_node("ln", Op::Norm(op), &ins).ok()?;
                let k = if self.rng.gen_bool(0.8) { 0 } else { self.rng.gen_range(0..outs.len()) };
                Some(Val { id: outs[k], exact: false })
            }
        }
    }

    pub(super) fn matmul(&mut self, a: Val) -> Option<Val> {
        let (dt, sh) = (self.dt(a), self.sh(a));
        let k = *sh.last().unwrap();
        let n = if self.rng.gen_bool(0.3) { self.long_dim() } else { self.dim() };
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

    pub(super) fn small_shape(&mut self, max_rank: usize) -> Vec<usize> {
        let rank = self.rng.gen_range(0..=max_rank);
        (0..rank).map(|_| [0, 1, 1, 2, 2, 3, 4][self.rng.gen_range(0..7)]).collect()
    }

    pub(super) fn gather(&mut self, a: Val) -> Option<Val> {
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

    pub(super) fn slice(&mut self, a: Val) -> Option<Val> {
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

    pub(super) fn concat(&mut self, a: Val) -> Option<Val> {
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

    pub(super) fn reshape(&mut self, a: Val) -> Option<Val> {
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

    pub(super) fn expand_or_tile(&mut self, a: Val) -> Option<Val> {
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

    pub(super) fn scatter(&mut self, a: Val) -> Option<Val> {
        use ScatterReduction as S;
        let (dt, sh) = (self.dt(a), self.sh(a));
        let reduction = [S::None, S::None, S::Add, S::Mul, S::Max, S::Min][self.rng.gen_range(0..6)];
        if dt == DType::Bool && reduction != S::None {
            return None;
        }
        let exact = a.exact && (!dt.is_float() || matches!(reduction, S::None | S::Max | S::Min));
        if self.rng.gen_bool(0.5) {
            let axis = self.rng.gen_range(0..sh.len());
            let ish: Vec<usize> = sh.iter().map(|&d| self.rng.gen_range(0..=d)).collect();
            let i = self.index_operand(&ish, vec![sh[axis]]);
            let u = self.operand(dt, &ish, true);
            let op = IndexOp::ScatterElements { axis, reduction };
            self.add(Op::Index(op), &[a.id, i, u.id], exact)
        } else {
            let k = self.rng.gen_range(1..=sh.len());
            let mut ish = self.small_shape(1);
            let ush = [ish.clone(), sh[k..].to_vec()].concat();
            ish.push(k);
            let i = self.index_operand(&ish, sh[..k].to_vec());
            let u = self.operand(dt, &ush, true);
            self.add(Op::Index(IndexOp::ScatterND { reduction }), &[a.id, i, u.id], exact)
        }
    }

    pub(super) fn split_or_trilu(&mut self, a: Val) -> Option<Val> {
        let sh = self.sh(a);
        if sh.len() >= 2 && self.rng.gen_bool(0.3) {
            let op = LayoutOp::Trilu { upper: self.rng.gen_bool(0.5), k: self.rng.gen_range(-3..=3) };
            return self.add(Op::Layout(op), &[a.id], a.exact);
        }
        let axis = self.rng.gen_range(0..sh.len());
        let (mut left, mut sizes) = (sh[axis], vec![]);
        while left > 0 && sizes.len() < 3 {
            let p = self.rng.gen_range(0..=left);
            sizes.push(p);
            left -= p;
        }
        sizes.push(left);
        let op = LayoutOp::Split { axis, sizes: sizes.into_iter().map(Dim::Fixed).collect() };
        let outs = self.g.add_node("split", Op::Layout(op), &[a.id]).ok()?;
        let k = self.rng.gen_range(0..outs.len());
        Some(Val { id: outs[k], exact: a.exact })
    }

    pub(super) fn scan_or_topk(&mut self, a: Val) -> Option<Val> {
        let (dt, sh) = (self.dt(a), self.sh(a));
        let axis = self.rng.gen_range(0..sh.len());
        if a.exact && self.rng.gen_bool(0.5) {
            let k = self.rng.gen_range(0..=sh[axis]);
            let op = ReduceOp::TopK { axis, k, largest: self.rng.gen_bool(0.5), sorted: true };
            let outs = self.g.add_node("topk", Op::Reduce(op), &[a.id]).ok()?;
            let k = self.rng.gen_range(0..outs.len());
            return Some(Val { id: outs[k], exact: true });
        }
        let kind = if self.rng.gen_bool(0.7) { ScanKind::Sum } else { ScanKind::Prod };
        let op = ReduceOp::Scan { kind, axis, exclusive: self.rng.gen_bool(0.3), reverse: self.rng.gen_bool(0.3) };
        self.add(Op::Reduce(op), &[a.id], a.exact && !dt.is_float())
    }

    /// One-hot of integer data values (out-of-range ones give a row of `off`).
    pub(super) fn one_hot(&mut self) -> Option<Val> {
        let ish = self.small_shape(2);
        let dt = if self.rng.gen_bool(0.5) { DType::I64 } else { DType::I32 };
        let i = self.operand(dt, &ish, true);
        let vt = self.dtype();
        let v = Tensor::from_f64s(vt, vec![2], &[0.0, 1.5]).ok()?;
        let v = self.g.add_const("onoff", v);
        let op = IndexOp::OneHot { axis: self.rng.gen_range(0..=ish.len()), depth: self.rng.gen_range(0..=7) };
        self.add(Op::Index(op), &[i.id, v], true)
    }

    pub(super) fn pad(&mut self, a: Val) -> Option<Val> {
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
