//! A direct interpreter of the tile IR: the oracle for lowering and schedule transforms.
//!
//! Slow and simple: every scalar is a [`Val`], floats are computed in f64 and rounded to their
//! buffer's dtype on store. Loop kinds are ignored (parallel and vector loops run serially), so a
//! schedule that changes results shows up as a difference against the unscheduled kernel.

use std::collections::HashMap;

use tilec_ir::{DType, Tensor};

use crate::ir::*;

/// A scalar value.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum Val {
    I(i64),
    U(u64),
    F(f64),
    B(bool),
}

impl Val {
    pub fn as_f64(self) -> f64 {
        match self {
            Val::I(x) => x as f64,
            Val::U(x) => x as f64,
            Val::F(x) => x,
            Val::B(b) => b as u8 as f64,
        }
    }
    pub fn as_i64(self) -> i64 {
        match self {
            Val::I(x) => x,
            Val::U(x) => x as i64,
            Val::F(x) => x as i64,
            Val::B(b) => b as i64,
        }
    }
    pub fn as_bool(self) -> bool {
        match self {
            Val::I(x) => x != 0,
            Val::U(x) => x != 0,
            Val::F(x) => x != 0.0,
            Val::B(b) => b,
        }
    }
    /// Converts to the representation of `d` (rounding floats to `d`'s precision).
    pub fn convert(self, d: DType) -> Val {
        if d == DType::Bool {
            return Val::B(self.as_bool());
        }
        if d.is_float() {
            let x = self.as_f64();
            return Val::F(round_to(x, d));
        }
        let signed = matches!(d, DType::I8 | DType::I16 | DType::I32 | DType::I64);
        let bits = d.size_bytes() as u32 * 8;
        let raw: u64 = match self {
            Val::I(x) => x as u64,
            Val::U(x) => x,
            Val::B(b) => b as u64,
            Val::F(x) => {
                if signed {
                    (x as i64) as u64
                } else {
                    x as u64
                }
            }
        };
        let masked = if bits == 64 { raw } else { raw & ((1u64 << bits) - 1) };
        if signed {
            let shift = 64 - bits;
            Val::I(((masked << shift) as i64) >> shift)
        } else {
            Val::U(masked)
        }
    }
}

pub(crate) fn round_to(x: f64, d: DType) -> f64 {
    match d {
        DType::F64 => x,
        DType::F32 => x as f32 as f64,
        DType::F16 => half::f16::from_f64(x).to_f64(),
        DType::BF16 => half::bf16::from_f64(x).to_f64(),
        DType::F8E4M3 | DType::F8E5M2 => {
            match Tensor::from_f64s(d, vec![1], &[x]) {
                Ok(t) => t.to_f64_vec()[0],
                Err(_) => x,
            }
        }
        _ => x,
    }
}

/// Errors of the interpreter: malformed kernels (unbound variables, out-of-range indices).
#[derive(Debug, thiserror::Error)]
pub enum InterpError {
    #[error("kernel {kernel}: {msg}")]
    Bad { kernel: String, msg: String },
    /// A checked index ([`Expr::CheckIndex`]) was out of range. As on every back end, the
    /// kernel ran to its end with the index clamped; `message` is [`Kernel::index_error`].
    #[error("{message}")]
    Index { violation: IndexViolation, message: String },
}

/// Runs `k` on `args` (one tensor per parameter, in order; outputs are overwritten in place).
/// A violated index check is reported after the run, with the outputs written as a compiled
/// kernel would leave them.
pub fn run(k: &Kernel, args: &mut [Tensor]) -> Result<(), InterpError> {
    let bad = |msg: String| InterpError::Bad { kernel: k.name.clone(), msg };
    if args.len() != k.params.len() {
        return Err(bad(format!("expected {} arguments, got {}", k.params.len(), args.len())));
    }
    let mut bufs: HashMap<BufId, Vec<Val>> = HashMap::new();
    for (i, &p) in k.params.iter().enumerate() {
        let b = k.buf(p);
        if args[i].dtype() != b.dtype || args[i].numel() as i64 != b.numel() {
            return Err(bad(format!(
                "argument {i} ({}): expected {}[{:?}], got {} with {} elements",
                b.name,
                b.dtype,
                b.shape,
                args[i].dtype(),
                args[i].numel()
            )));
        }
        bufs.insert(p, tensor_vals(&args[i]));
    }
    let mut st = State { k, bufs, vars: HashMap::new(), violation: None };
    st.block(&k.body).map_err(bad)?;
    for (i, &p) in k.params.iter().enumerate() {
        let b = k.buf(p);
        let vals = &st.bufs[&p];
        args[i] = vals_tensor(b.dtype, &args[i].shape().to_vec(), vals).map_err(|e| bad(e.to_string()))?;
    }
    match st.violation {
        Some(v) => Err(InterpError::Index { violation: v, message: k.index_error(&v) }),
        None => Ok(()),
    }
}

fn tensor_vals(t: &Tensor) -> Vec<Val> {
    let d = t.dtype();
    if d.is_float() {
        t.to_f64_vec().into_iter().map(Val::F).collect()
    } else if d == DType::Bool {
        t.to_i64_vec().into_iter().map(|x| Val::B(x != 0)).collect()
    } else if d == DType::U64 {
        match t.as_slice::<u64>() {
            Some(s) => s.iter().map(|&x| Val::U(x)).collect(),
            None => t.to_i64_vec().into_iter().map(|x| Val::U(x as u64)).collect(),
        }
    } else if matches!(d, DType::U8 | DType::U16 | DType::U32) {
        t.to_i64_vec().into_iter().map(|x| Val::U(x as u64)).collect()
    } else {
        t.to_i64_vec().into_iter().map(Val::I).collect()
    }
}

fn vals_tensor(d: DType, shape: &[usize], vals: &[Val]) -> Result<Tensor, tilec_ir::TensorSizeError> {
    if d.is_float() {
        let xs: Vec<f64> = vals.iter().map(|v| v.as_f64()).collect();
        Tensor::from_f64s(d, shape.to_vec(), &xs)
    } else if d == DType::U64 {
        let xs: Vec<u64> = vals.iter().map(|v| match v {
            Val::U(x) => *x,
            v => v.as_i64() as u64,
        }).collect();
        Tensor::from_vec(shape.to_vec(), xs)
    } else {
        let xs: Vec<i64> = vals.iter().map(|v| v.as_i64()).collect();
        Tensor::from_i64s(d, shape.to_vec(), &xs)
    }
}

struct State<'a> {
    k: &'a Kernel,
    bufs: HashMap<BufId, Vec<Val>>,
    vars: HashMap<VarId, Val>,
    /// The first index check that failed.
    violation: Option<IndexViolation>,
}

impl State<'_> {
    fn block(&mut self, stmts: &[Stmt]) -> Result<(), String> {
        let mut allocated = vec![];
        for s in stmts {
            if let Stmt::Alloc(b) = s {
                allocated.push(*b);
            }
            self.stmt(s)?;
        }
        for b in allocated {
            self.bufs.remove(&b);
        }
        Ok(())
    }

    fn offset(&mut self, b: BufId, index: &[Expr]) -> Result<usize, String> {
        let buf = self.k.buf(b);
        if index.len() != buf.shape.len() {
            return Err(format!("{} has rank {}, indexed with {}", buf.name, buf.shape.len(), index.len()));
        }
        let mut off = 0i64;
        for (d, e) in index.iter().enumerate() {
            let i = self.expr(e)?.as_i64();
            if i < 0 || i >= buf.shape[d] {
                return Err(format!("{} index {i} out of range 0..{} in dim {d}", buf.name, buf.shape[d]));
            }
            off = off * buf.shape[d] + i;
        }
        Ok(off as usize)
    }

    fn stmt(&mut self, s: &Stmt) -> Result<(), String> {
        match s {
            Stmt::For(l) => {
                for i in 0..l.extent {
                    self.vars.insert(l.var, Val::I(i));
                    self.block(&l.body)?;
                }
                self.vars.remove(&l.var);
            }
            Stmt::Store { buf, index, value } => {
                let v = self.expr(value)?;
                let off = self.offset(*buf, index)?;
                let d = self.k.buf(*buf).dtype;
                let data = self.bufs.get_mut(buf).ok_or_else(|| format!("store to unallocated buffer {}", self.k.buf(*buf).name))?;
                data[off] = v.convert(d);
            }
            Stmt::Let { var, value } | Stmt::Assign { var, value } => {
                let v = self.expr(value)?;
                let v = match self.k.var_info(*var).ty {
                    Ty::Index => Val::I(v.as_i64()),
                    Ty::Elem(d) => v.convert(d),
                };
                self.vars.insert(*var, v);
            }
            Stmt::Alloc(b) => {
                let buf = self.k.buf(*b);
                let zero = Val::F(f64::NAN).convert(buf.dtype);
                self.bufs.insert(*b, vec![zero; buf.numel() as usize]);
            }
            Stmt::If { cond, then_, else_ } => {
                if self.expr(cond)?.as_bool() {
                    self.block(then_)?;
                } else {
                    self.block(else_)?;
                }
            }
            // Thread loops run serially here, so the accumulator already holds the full value.
            Stmt::Barrier | Stmt::BlockReduce { .. } => {}
            Stmt::Gemm(g) => {
                for b in 0..g.batch {
                    self.vars.insert(g.b_var, Val::I(b));
                    for i in 0..g.m {
                        self.vars.insert(g.i_var, Val::I(i));
                        for j in 0..g.n {
                            self.vars.insert(g.j_var, Val::I(j));
                            let mut acc = 0.0f64;
                            for kk in 0..g.k {
                                self.vars.insert(g.k_var, Val::I(kk));
                                let a = self.expr(&g.a)?.as_f64();
                                let bb = self.expr(&g.b)?.as_f64();
                                acc = round_to(acc + round_to(a * bb, g.acc_dtype), g.acc_dtype);
                            }
                            self.vars.insert(g.acc_var, Val::F(acc));
                            self.block(&g.epilogue)?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn expr(&mut self, e: &Expr) -> Result<Val, String> {
        Ok(match e {
            Expr::Int(x) => Val::I(*x),
            Expr::Lit(l) => match *l {
                Lit::Int(x, _) => Val::I(x),
                Lit::UInt(x, _) => Val::U(x),
                Lit::Float(x, _) => Val::F(x),
                Lit::Bool(b) => Val::B(b),
            },
            Expr::Var(v) => *self.vars.get(v).ok_or_else(|| format!("variable {} read before it is set", self.k.var_info(*v).name))?,
            Expr::Load(b, idx) => {
                let off = self.offset(*b, idx)?;
                let data = self.bufs.get(b).ok_or_else(|| format!("load from unallocated buffer {}", self.k.buf(*b).name))?;
                data[off]
            }
            Expr::Cast(d, a) => self.expr(a)?.convert(*d),
            Expr::ToIndex(a) => Val::I(self.expr(a)?.as_i64()),
            Expr::CheckIndex(a, c) => {
                if c.len < 1 || c.site as usize >= self.k.checks.len() {
                    return Err(format!("index check of length {} at unknown site {}", c.len, c.site));
                }
                let i = self.expr(a)?.as_i64();
                let (j, ok) = IndexViolation::check(i, *c);
                if !ok && self.violation.is_none() {
                    self.violation = Some(IndexViolation { site: c.site, index: i, len: c.len });
                }
                Val::I(j)
            }
            Expr::Select(c, a, b) => {
                if self.expr(c)?.as_bool() {
                    self.expr(a)?
                } else {
                    self.expr(b)?
                }
            }
            Expr::Unary(op, a) => {
                // Predicates (isnan, isinf, not) are typed bool; their operand's type decides.
                let ty = match op {
                    UnOp::IsNan | UnOp::IsInf | UnOp::Not => self.k.type_of(a),
                    _ => self.k.type_of(e),
                };
                let v = self.expr(a)?;
                unary(*op, v, ty)
            }
            Expr::Binary(op, a, b) => {
                // The operands' common type: an index operand takes the other side's type.
                let ty = match self.k.type_of(a) {
                    Ty::Index => self.k.type_of(b),
                    t => t,
                };
                let x = self.expr(a)?;
                let y = self.expr(b)?;
                binary(*op, x, y, ty)?
            }
        })
    }
}

fn is_float_ty(t: Ty) -> bool {
    matches!(t, Ty::Elem(d) if d.is_float())
}

fn unary(op: UnOp, v: Val, ty: Ty) -> Val {
    if !is_float_ty(ty) {
        return match (op, v) {
            (UnOp::Neg, Val::I(x)) => Val::I(x.wrapping_neg()),
            (UnOp::Neg, Val::U(x)) => Val::U(x.wrapping_neg()),
            (UnOp::Abs, Val::I(x)) => Val::I(x.wrapping_abs()),
            (UnOp::Not, v) => Val::B(!v.as_bool()),
            (UnOp::BitNot, Val::I(x)) => Val::I(!x),
            (UnOp::BitNot, Val::U(x)) => Val::U(!x),
            (UnOp::Sign, Val::I(x)) => Val::I(x.signum()),
            (UnOp::Sign, Val::U(x)) => Val::U((x != 0) as u64),
            (UnOp::IsNan | UnOp::IsInf, _) => Val::B(false),
            (_, v) => v,
        };
    }
    let x = v.as_f64();
    let r = match op {
        UnOp::Neg => -x,
        UnOp::Not => return Val::B(x == 0.0),
        UnOp::BitNot => x,
        UnOp::Abs => x.abs(),
        UnOp::Sqrt => x.sqrt(),
        UnOp::Rsqrt => 1.0 / x.sqrt(),
        UnOp::Recip => 1.0 / x,
        UnOp::Exp => x.exp(),
        UnOp::ExpNeg if x < -87.336_544_75 => 0.0,
        UnOp::ExpNeg => x.min(0.0).exp(),
        UnOp::Log => x.ln(),
        UnOp::Sin => x.sin(),
        UnOp::Cos => x.cos(),
        UnOp::Tan => x.tan(),
        UnOp::Asin => x.asin(),
        UnOp::Acos => x.acos(),
        UnOp::Atan => x.atan(),
        UnOp::Sinh => x.sinh(),
        UnOp::Cosh => x.cosh(),
        UnOp::Tanh => x.tanh(),
        UnOp::Asinh => x.asinh(),
        UnOp::Acosh => x.acosh(),
        UnOp::Atanh => x.atanh(),
        UnOp::Erf => tilec_ref::kernels::elementwise::erf(x),
        UnOp::Floor => x.floor(),
        UnOp::Ceil => x.ceil(),
        UnOp::Round => {
            let r = x.round();
            if (x - x.trunc()).abs() == 0.5 {
                2.0 * (x / 2.0).round()
            } else {
                r
            }
        }
        UnOp::Trunc => x.trunc(),
        UnOp::Sign => {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                x
            }
        }
        UnOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        UnOp::GeluErf => 0.5 * x * (1.0 + tilec_ref::kernels::elementwise::erf(x * std::f64::consts::FRAC_1_SQRT_2)),
        UnOp::GeluTanh => {
            let k = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())
        }
        UnOp::Silu => x / (1.0 + (-x).exp()),
        UnOp::IsNan => return Val::B(x.is_nan()),
        UnOp::IsInf => return Val::B(x.is_infinite()),
    };
    let r = match ty {
        Ty::Elem(d) => round_to(r, d),
        Ty::Index => r,
    };
    Val::F(r)
}

fn binary(op: BinOp, x: Val, y: Val, ty: Ty) -> Result<Val, String> {
    use BinOp::*;
    if op.is_logical() {
        let (a, b) = (x.as_bool(), y.as_bool());
        return Ok(Val::B(match op {
            And => a && b,
            Or => a || b,
            _ => a ^ b,
        }));
    }
    if is_float_ty(ty) {
        let (a, b) = (x.as_f64(), y.as_f64());
        if op.is_compare() {
            return Ok(Val::B(match op {
                Lt => a < b,
                Le => a <= b,
                Gt => a > b,
                Ge => a >= b,
                Eq => a == b,
                _ => a != b,
            }));
        }
        let r = match op {
            Add => a + b,
            Sub => a - b,
            Mul => a * b,
            Div => a / b,
            Rem => a % b,
            FloorDiv => (a / b).floor(),
            FloorMod => a - b * (a / b).floor(),
            Min => {
                if a.is_nan() || b.is_nan() {
                    f64::NAN
                } else {
                    a.min(b)
                }
            }
            Max => {
                if a.is_nan() || b.is_nan() {
                    f64::NAN
                } else {
                    a.max(b)
                }
            }
            Pow => a.powf(b),
            Atan2 => a.atan2(b),
            _ => return Err(format!("{op:?} is not defined on floats")),
        };
        let r = match ty {
            Ty::Elem(d) => round_to(r, d),
            Ty::Index => r,
        };
        return Ok(Val::F(r));
    }
    if let (Val::U(a), Val::U(b)) = (x, y) {
        if op.is_compare() {
            return Ok(Val::B(match op {
                Lt => a < b,
                Le => a <= b,
                Gt => a > b,
                Ge => a >= b,
                Eq => a == b,
                _ => a != b,
            }));
        }
        let r = match op {
            Add => a.wrapping_add(b),
            Sub => a.wrapping_sub(b),
            Mul => a.wrapping_mul(b),
            Div | FloorDiv => a.checked_div(b).ok_or("integer division by zero")?,
            Rem | FloorMod => a.checked_rem(b).ok_or("integer division by zero")?,
            Min => a.min(b),
            Max => a.max(b),
            Pow => a.wrapping_pow(b as u32),
            BitAnd => a & b,
            BitOr => a | b,
            BitXor => a ^ b,
            Shl => a.checked_shl(b as u32).unwrap_or(0),
            Shr => a.checked_shr(b as u32).unwrap_or(0),
            _ => return Err(format!("{op:?} is not defined on integers")),
        };
        let r = match ty {
            Ty::Elem(d) => Val::U(r).convert(d),
            Ty::Index => Val::U(r),
        };
        return Ok(r);
    }
    let (a, b) = (x.as_i64(), y.as_i64());
    if op.is_compare() {
        return Ok(Val::B(match op {
            Lt => a < b,
            Le => a <= b,
            Gt => a > b,
            Ge => a >= b,
            Eq => a == b,
            _ => a != b,
        }));
    }
    let r = match op {
        Add => a.wrapping_add(b),
        Sub => a.wrapping_sub(b),
        Mul => a.wrapping_mul(b),
        Div => a.checked_div(b).ok_or("integer division by zero")?,
        Rem => a.checked_rem(b).ok_or("integer division by zero")?,
        FloorDiv => {
            if b == 0 {
                return Err("integer division by zero".into());
            }
            a.div_euclid(b) - if b < 0 && a.rem_euclid(b) != 0 { 1 } else { 0 }
        }
        FloorMod => {
            if b == 0 {
                return Err("integer division by zero".into());
            }
            let r = a % b;
            if r != 0 && ((r < 0) != (b < 0)) {
                r + b
            } else {
                r
            }
        }
        Min => a.min(b),
        Max => a.max(b),
        Pow => {
            if b < 0 {
                0
            } else {
                a.wrapping_pow(b.min(u32::MAX as i64) as u32)
            }
        }
        BitAnd => a & b,
        BitOr => a | b,
        BitXor => a ^ b,
        Shl => a.checked_shl(b as u32).unwrap_or(0),
        Shr => a.checked_shr(b as u32).unwrap_or(0),
        _ => return Err(format!("{op:?} is not defined on integers")),
    };
    Ok(match ty {
        Ty::Elem(d) => Val::I(r).convert(d),
        Ty::Index => Val::I(r),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_kernel_and_gemm() {
        // out[i, j] = relu(sum_k a[i, k] * b[k, j] + bias[j])
        let mut k = Kernel::new("mm");
        let a = k.param("a", DType::F32, vec![3, 4]);
        let b = k.param("b", DType::F32, vec![4, 5]);
        let bias = k.param("bias", DType::F32, vec![5]);
        let out = k.param("out", DType::F32, vec![3, 5]);
        let (vb, vi, vj, vk) = (k.index_var("b"), k.index_var("i"), k.index_var("j"), k.index_var("k"));
        let acc = k.new_var("acc", Ty::Elem(DType::F32), false);
        let value = Expr::bin(
            BinOp::Max,
            Expr::bin(BinOp::Add, Expr::Var(acc), Expr::load(bias, vec![Expr::Var(vj)])),
            Expr::f32(0.0),
        );
        k.body.push(Stmt::Gemm(Box::new(Gemm {
            batch: 1,
            m: 3,
            n: 5,
            k: 4,
            b_var: vb,
            i_var: vi,
            j_var: vj,
            k_var: vk,
            acc_var: acc,
            acc_dtype: DType::F32,
            a: Expr::load(a, vec![Expr::Var(vi), Expr::Var(vk)]),
            b: Expr::load(b, vec![Expr::Var(vk), Expr::Var(vj)]),
            epilogue: vec![Stmt::store(out, vec![Expr::Var(vi), Expr::Var(vj)], value)],
            params: GemmParams { mr: 4, nr: 8, kc: 4, mc: 4, nc: 8 },
            vector: false,
        })));
        let av: Vec<f32> = (0..12).map(|x| x as f32 * 0.5 - 2.0).collect();
        let bv: Vec<f32> = (0..20).map(|x| 1.0 - x as f32 * 0.25).collect();
        let biasv: Vec<f32> = (0..5).map(|x| x as f32).collect();
        let mut args = vec![
            Tensor::from_vec(vec![3, 4], av.clone()).unwrap(),
            Tensor::from_vec(vec![4, 5], bv.clone()).unwrap(),
            Tensor::from_vec(vec![5], biasv.clone()).unwrap(),
            Tensor::from_vec(vec![3, 5], vec![f32::NAN; 15]).unwrap(),
        ];
        run(&k, &mut args).unwrap();
        let got = args[3].to_f64_vec();
        for i in 0..3 {
            for j in 0..5 {
                let mut s = 0.0f32;
                for kk in 0..4 {
                    s += av[i * 4 + kk] * bv[kk * 5 + j];
                }
                let want = (s + biasv[j]).max(0.0) as f64;
                assert!((got[i * 5 + j] - want).abs() < 1e-5, "{i},{j}: {} vs {want}", got[i * 5 + j]);
            }
        }
        let text = crate::print::print_kernel(&k);
        assert!(text.contains("gemm[1 x 3 x 5 x 4]"), "{text}");
    }

    #[test]
    fn out_of_range_index_is_an_error() {
        let mut k = Kernel::new("oob");
        let x = k.param("x", DType::F32, vec![4]);
        let i = k.index_var("i");
        k.body.push(Stmt::for_(i, 5, vec![Stmt::store(x, vec![Expr::Var(i)], Expr::f32(1.0))]));
        let mut args = vec![Tensor::from_vec(vec![4], vec![0f32; 4]).unwrap()];
        let err = run(&k, &mut args).unwrap_err().to_string();
        assert!(err.contains("out of range"), "{err}");
    }
}
