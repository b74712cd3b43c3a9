//! C-style printing of scalar expressions, shared by the C and CUDA renderers.
//!
//! The semantics are the interpreter's and the same on every target: values of f16, bf16 and
//! fp8 type are computed in `float` and rounded after every operation; signed integer add,
//! subtract, multiply and negate wrap (they go through unsigned 64-bit arithmetic); integer
//! division and remainder by zero give 0 (by -1: wrapping negation and 0); shifts by 64 or more
//! give 0; float-to-integer conversions saturate (NaN to 0). Index arithmetic (type
//! [`Ty::Index`]) stays plain C, which compilers analyse best: indices do not overflow.
//!
//! What differs between targets (type names, the spelling of booleans, literals and math
//! functions, helpers of the target's prelude, how variables and buffers are reached) is a
//! [`CTarget`]. Helpers of the prelude are named `PREFIX + name`, with the prefix the target's
//! (`tc_` for C, `tl_` for CUDA), and mean the same on both: `sdiv`, `srem`, `udiv`, `urem`,
//! `sfloordiv`, `sfloormod`, `spow`, `upow`, `sshl`, `sshr`, `ushl`, `ushr` on 64-bit integers,
//! `f2i64`, `f2u64` (saturating from `double`), `d2f_odd` (`double` to `float` rounding to odd),
//! `ffloormod` (on `double`), `fmin`/`fmax` (`double`) and `fminf`/`fmaxf` (`float`),
//! NaN-propagating.

use tilec_ir::DType;

use crate::ir::*;

/// Integer operations whose spelling is the target's (both evaluate their operands once).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum IntFn {
    Min,
    Max,
    /// Wrapping absolute value of a signed value.
    Abs,
    /// -1, 0 or 1 for a signed value.
    Sign,
    /// Floor division and modulo of indices (fast for a positive divisor, 0 for a zero one).
    FloorDiv,
    FloorMod,
}

/// How a target spells C: types, literals, helpers and math functions.
pub trait CStyle {
    /// The C type of indices.
    fn index_ty(&self) -> &'static str;
    /// The C types of signed and unsigned 64-bit integers.
    fn i64_ty(&self) -> &'static str;
    fn u64_ty(&self) -> &'static str;
    /// The C type an element of `d` is stored as.
    fn storage_ty(&self, d: DType) -> &'static str;
    /// The C type values of `d` are computed in.
    fn value_ty(&self, d: DType) -> &'static str;
    /// The prefix of the prelude's helpers.
    fn prefix(&self) -> &'static str;
    /// A C truth value (`int` 0 or 1) as a value of type bool.
    fn truth(&self, c: String) -> String;
    fn bool_lit(&self, b: bool) -> String;
    /// An index constant.
    fn index_lit(&self, x: i64) -> String;
    /// NaN or an infinity of `float` (or `double`).
    fn nonfinite(&self, x: f64, dbl: bool) -> String;
    /// Rounds a `float` holding a computed value to the precision of a 16-bit or fp8 type.
    fn round(&self, d: DType, code: String) -> String;
    /// Whether `&&`/`||` (else `&`/`|`, which vectorize) join logical operands.
    fn short_circuit(&self) -> bool;
    /// An integer operation of C type `ct` on operands `a` (and `b`).
    fn int_fn(&self, f: IntFn, ct: &str, a: &str, b: &str) -> String;
    /// A float function of the target: `Some` where it has its own spelling, else `None` for
    /// C's (`name`, or `namef` on `float`). Must answer for `Sign`, `Sigmoid`, the named
    /// activations (`GeluErf`, `GeluTanh`, `Silu`), `IsNan` and
    /// `IsInf` (a C truth value) and for the named functions.
    fn math(&self, op: UnOp, d: DType, a: &str) -> Option<String>;
}

/// What the printer reaches through its renderer: the kernel, variables and buffers.
pub trait CTarget {
    type Style: CStyle;
    type Error;
    fn style(&self) -> &Self::Style;
    fn error(&self, msg: String) -> Self::Error;
    fn kernel(&self) -> &Kernel;
    /// A variable's name.
    fn var(&mut self, v: VarId) -> Result<String, Self::Error>;
    /// A load of `b` at `idx`, as a computed value of the buffer's dtype.
    fn load(&mut self, b: BufId, idx: &[Expr]) -> Result<String, Self::Error>;
    /// A checked index: `i` (a 64-bit value) checked against `c`, as an index.
    fn check_index(&mut self, c: IndexCheck, i: String) -> String;
    /// A target-specific rendering of `e` (code and type), tried first.
    fn special(&mut self, _e: &Expr) -> Result<Option<(String, Ty)>, Self::Error> {
        Ok(None)
    }
}

fn is_float(t: Ty) -> bool {
    matches!(t, Ty::Elem(d) if d.is_float())
}

fn is_unsigned(t: Ty) -> bool {
    matches!(t, Ty::Elem(DType::U8 | DType::U16 | DType::U32 | DType::U64))
}

/// The C type values of `t` are computed in.
pub fn value_ty<S: CStyle + ?Sized>(t: &S, ty: Ty) -> &'static str {
    match ty {
        Ty::Index => t.index_ty(),
        Ty::Elem(d) => t.value_ty(d),
    }
}

/// A float literal of dtype `d` (f16, bf16 and fp8 values rounded to their type here).
pub fn float_lit<S: CStyle + ?Sized>(t: &S, x: f64, d: DType) -> String {
    let dbl = d == DType::F64;
    let x = if dbl { x } else { crate::interp::round_to(x as f32 as f64, d) };
    if !x.is_finite() {
        return t.nonfinite(x, dbl);
    }
    if dbl {
        format!("{x:e}")
    } else {
        format!("{:e}f", x as f32)
    }
}

/// Code converting `code` of type `from` to type `to` (the interpreter's `Val::convert`).
pub fn convert<S: CStyle + ?Sized>(t: &S, code: &str, from: Ty, to: Ty) -> String {
    if from == to {
        return code.to_string();
    }
    let p = t.prefix();
    match to {
        Ty::Index => match from {
            Ty::Elem(d) if d.is_float() => format!("(({}){p}f2i64((double)({code})))", t.index_ty()),
            _ => format!("(({})({code}))", t.index_ty()),
        },
        Ty::Elem(DType::Bool) => t.truth(format!("({code}) != 0")),
        Ty::Elem(DType::F64) => format!("((double)({code}))"),
        Ty::Elem(d) if d.is_float() => {
            let src = match from {
                Ty::Elem(s) if s.is_float() && s != DType::F64 => format!("((float)({code}))"),
                // Exact in double, so rounding once either way.
                Ty::Index
                | Ty::Elem(DType::I8 | DType::I16 | DType::I32 | DType::U8 | DType::U16 | DType::U32 | DType::Bool)
                    if d == DType::F32 =>
                {
                    format!("((float)({code}))")
                }
                // Integers and f64 round once, like the interpreter (via f64).
                _ if d == DType::F32 => format!("((float)(double)({code}))"),
                // To a narrow format: round to odd first so that the second rounding is exact.
                _ => format!("{p}d2f_odd((double)({code}))"),
            };
            t.round(d, src)
        }
        Ty::Elem(d) => {
            let ct = t.storage_ty(d);
            match from {
                Ty::Elem(s) if s.is_float() => {
                    let f = if is_unsigned(to) { "f2u64" } else { "f2i64" };
                    format!("(({ct}){p}{f}((double)({code})))")
                }
                _ => format!("(({ct})({code}))"),
            }
        }
    }
}

/// Renders an expression: its C code and its type.
pub fn expr<T: CTarget + ?Sized>(t: &mut T, e: &Expr) -> Result<(String, Ty), T::Error> {
    if let Some(r) = t.special(e)? {
        return Ok(r);
    }
    Ok(match e {
        Expr::Int(x) => (t.style().index_lit(*x), Ty::Index),
        Expr::Lit(l) => {
            let d = l.dtype();
            let ty = Ty::Elem(d);
            let code = match *l {
                Lit::Float(x, d) if d.is_float() => float_lit(t.style(), x, d),
                Lit::Float(x, _) => convert(t.style(), &float_lit(t.style(), x, DType::F64), Ty::Elem(DType::F64), ty),
                Lit::Int(x, _) if d.is_float() => float_lit(t.style(), x as f64, d),
                Lit::Int(x, _) => convert(t.style(), &int64_lit(t.style(), x), Ty::Elem(DType::I64), ty),
                Lit::UInt(x, _) if d.is_float() => float_lit(t.style(), x as f64, d),
                Lit::UInt(x, _) => convert(t.style(), &format!("{x}ULL"), Ty::Elem(DType::U64), ty),
                Lit::Bool(b) => t.style().bool_lit(b),
            };
            (code, ty)
        }
        Expr::Var(v) => (t.var(*v)?, t.kernel().var_info(*v).ty),
        Expr::Load(b, idx) => (t.load(*b, idx)?, Ty::Elem(t.kernel().buf(*b).dtype)),
        Expr::Cast(d, a) => {
            let (c, at) = expr(t, a)?;
            (convert(t.style(), &c, at, Ty::Elem(*d)), Ty::Elem(*d))
        }
        Expr::ToIndex(a) => {
            let (c, at) = expr(t, a)?;
            (convert(t.style(), &c, at, Ty::Index), Ty::Index)
        }
        Expr::CheckIndex(a, ck) => {
            if ck.len < 1 || ck.site as usize >= t.kernel().checks.len() {
                return Err(t.error(format!(
                    "index check of length {} at unknown site {}",
                    ck.len, ck.site
                )));
            }
            // Checked at 64 bits: narrowing to a 32-bit index first could wrap an
            // out-of-range value into range.
            let inner = match a.as_ref() {
                Expr::ToIndex(x) => x,
                a => a,
            };
            let (c, at) = expr(t, inner)?;
            let c = match at {
                Ty::Elem(d) if d.is_float() => format!("{}f2i64((double)({c}))", t.style().prefix()),
                _ => format!("(({})({c}))", t.style().i64_ty()),
            };
            (t.check_index(*ck, c), Ty::Index)
        }
        Expr::Select(c, a, b) => {
            let (cc, _) = expr(t, c)?;
            let (ac, at) = expr(t, a)?;
            let (bc, bt) = expr(t, b)?;
            let ty = if at == Ty::Index { bt } else { at };
            (
                format!("(({cc}) ? {} : {})", convert(t.style(), &ac, at, ty), convert(t.style(), &bc, bt, ty)),
                ty,
            )
        }
        Expr::Unary(op, a) => {
            let (c, at) = expr(t, a)?;
            let ty = match op {
                UnOp::IsNan | UnOp::IsInf | UnOp::Not => Ty::Elem(DType::Bool),
                _ => at,
            };
            (unary(t.style(), *op, c, at), ty)
        }
        Expr::Binary(op, a, b) => {
            let (ac, at) = expr(t, a)?;
            let (bc, bt) = expr(t, b)?;
            let ot = if at == Ty::Index { bt } else { at };
            let ac = convert(t.style(), &ac, at, ot);
            let bc = convert(t.style(), &bc, bt, ot);
            let positive_const = matches!(**b, Expr::Int(c) if c > 0);
            let ty = if op.is_compare() || op.is_logical() { Ty::Elem(DType::Bool) } else { ot };
            let code = binary(t.style(), *op, ac, bc, ot, positive_const).map_err(|m| t.error(m))?;
            (code, ty)
        }
    })
}

/// A 64-bit integer constant.
fn int64_lit<S: CStyle + ?Sized>(t: &S, x: i64) -> String {
    if x == i64::MIN {
        format!("(({})(-9223372036854775807LL - 1))", t.i64_ty())
    } else if x < 0 {
        format!("({x}LL)")
    } else {
        format!("{x}LL")
    }
}

/// `op a` on an operand of type `ty`.
pub fn unary<S: CStyle + ?Sized>(t: &S, op: UnOp, a: String, ty: Ty) -> String {
    use UnOp::*;
    let boolean = Ty::Elem(DType::Bool);
    if !is_float(ty) {
        let ct = value_ty(t, ty);
        let signed = !is_unsigned(ty) && ty != boolean;
        let u = t.u64_ty();
        return match op {
            Not => t.truth(format!("!({a})")),
            IsNan | IsInf => t.bool_lit(false),
            Neg if ty != boolean => format!("(({ct})(0 - ({u})({a})))"),
            Abs if signed => t.int_fn(IntFn::Abs, ct, &a, ""),
            BitNot if ty != boolean => format!("(({ct})~({a}))"),
            Sign if signed => t.int_fn(IntFn::Sign, ct, &a, ""),
            Sign if ty != boolean => format!("(({ct})(({a}) != 0))"),
            _ => a,
        };
    }
    let Ty::Elem(d) = ty else { unreachable!() };
    let dbl = d == DType::F64;
    let one = if dbl { "1.0" } else { "1.0f" };
    if let Some(code) = t.math(op, d, &a) {
        return match op {
            IsNan | IsInf => t.truth(code),
            _ => t.round(d, code),
        };
    }
    let f = |name: &str| if dbl { format!("{name}({a})") } else { format!("{name}f({a})") };
    let code = match op {
        Neg => format!("(-({a}))"),
        Not => return t.truth(format!("({a}) == 0")),
        BitNot => a,
        Recip => format!("({one} / ({a}))"),
        Rsqrt => format!("({one} / {})", f("sqrt")),
        Abs => f("fabs"),
        Sqrt => f("sqrt"),
        Exp => f("exp"),
        ExpNeg => {
            let m = if dbl { format!("fmin({a}, 0.0)") } else { format!("fminf({a}, 0.0f)") };
            if dbl { format!("exp({m})") } else { format!("expf({m})") }
        }
        Log => f("log"),
        Sin => f("sin"),
        Cos => f("cos"),
        Tan => f("tan"),
        Asin => f("asin"),
        Acos => f("acos"),
        Atan => f("atan"),
        Sinh => f("sinh"),
        Cosh => f("cosh"),
        Tanh => f("tanh"),
        Asinh => f("asinh"),
        Acosh => f("acosh"),
        Atanh => f("atanh"),
        Erf => f("erf"),
        Floor => f("floor"),
        Ceil => f("ceil"),
        Round => f("rint"),
        Trunc => f("trunc"),
        Sign | Sigmoid | GeluErf | GeluTanh | Silu | IsNan | IsInf => unreachable!("the target spells {op:?}"),
    };
    t.round(d, code)
}

/// `a op b` on operands of type `ty`; `positive_const`: `b` is a positive index constant.
pub fn binary<S: CStyle + ?Sized>(
    t: &S,
    op: BinOp,
    a: String,
    b: String,
    ty: Ty,
    positive_const: bool,
) -> Result<String, String> {
    use BinOp::*;
    let p = t.prefix();
    if op.is_logical() {
        let o = match (op, t.short_circuit()) {
            (And, true) => "&&",
            (And, false) => "&",
            (Or, true) => "||",
            (Or, false) => "|",
            _ => "^",
        };
        return Ok(t.truth(format!("(({a}) != 0) {o} (({b}) != 0)")));
    }
    if op.is_compare() {
        let o = match op {
            Lt => "<",
            Le => "<=",
            Gt => ">",
            Ge => ">=",
            Eq => "==",
            _ => "!=",
        };
        return Ok(t.truth(format!("({a}) {o} ({b})")));
    }
    if is_float(ty) {
        let Ty::Elem(d) = ty else { unreachable!() };
        let dbl = d == DType::F64;
        let (sfx, ft) = if dbl { ("", "double") } else { ("f", "float") };
        let code = match op {
            Add => format!("(({a}) + ({b}))"),
            Sub => format!("(({a}) - ({b}))"),
            Mul => format!("(({a}) * ({b}))"),
            Div => format!("(({a}) / ({b}))"),
            Rem => format!("fmod{sfx}({a}, {b})"),
            // In double like the interpreter: the floor of a quotient rounded to float can
            // differ by one.
            FloorDiv if dbl => format!("floor(({a}) / ({b}))"),
            FloorDiv => format!("((float)floor((double)({a}) / (double)({b})))"),
            FloorMod => format!("(({ft}){p}ffloormod((double)({a}), (double)({b})))"),
            Min => format!("{p}fmin{sfx}({a}, {b})"),
            Max => format!("{p}fmax{sfx}({a}, {b})"),
            Pow => format!("pow{sfx}({a}, {b})"),
            Atan2 => format!("atan2{sfx}({a}, {b})"),
            _ => return Err(format!("{op:?} is not defined on floats")),
        };
        return Ok(t.round(d, code));
    }
    let ct = value_ty(t, ty);
    let (i64t, u64t) = (t.i64_ty(), t.u64_ty());
    if ty == Ty::Index {
        return Ok(match op {
            Add => format!("(({a}) + ({b}))"),
            Sub => format!("(({a}) - ({b}))"),
            Mul => format!("(({a}) * ({b}))"),
            Div if positive_const => format!("(({a}) / ({b}))"),
            Rem if positive_const => format!("(({a}) % ({b}))"),
            Div => format!("{p}sdiv({a}, {b})"),
            Rem => format!("{p}srem({a}, {b})"),
            FloorDiv => t.int_fn(IntFn::FloorDiv, ct, &a, &b),
            FloorMod => t.int_fn(IntFn::FloorMod, ct, &a, &b),
            Min => t.int_fn(IntFn::Min, ct, &a, &b),
            Max => t.int_fn(IntFn::Max, ct, &a, &b),
            Pow => format!("{p}spow({a}, {b})"),
            BitAnd => format!("(({a}) & ({b}))"),
            BitOr => format!("(({a}) | ({b}))"),
            BitXor => format!("(({a}) ^ ({b}))"),
            Shl => format!("{p}sshl({a}, {b})"),
            Shr => format!("{p}sshr({a}, {b})"),
            _ => return Err(format!("{op:?} is not defined on indices")),
        });
    }
    let unsigned = is_unsigned(ty);
    let w = if unsigned { u64t } else { i64t };
    let s = if unsigned { "u" } else { "s" };
    let code = match op {
        Add => format!("(({ct})(({u64t})({a}) + ({u64t})({b})))"),
        Sub => format!("(({ct})(({u64t})({a}) - ({u64t})({b})))"),
        Mul => format!("(({ct})(({u64t})({a}) * ({u64t})({b})))"),
        Div => format!("(({ct}){p}{s}div(({w})({a}), ({w})({b})))"),
        Rem => format!("(({ct}){p}{s}rem(({w})({a}), ({w})({b})))"),
        FloorDiv if unsigned => format!("(({ct}){p}udiv(({w})({a}), ({w})({b})))"),
        FloorMod if unsigned => format!("(({ct}){p}urem(({w})({a}), ({w})({b})))"),
        FloorDiv => format!("(({ct}){p}sfloordiv(({w})({a}), ({w})({b})))"),
        FloorMod => format!("(({ct}){p}sfloormod(({w})({a}), ({w})({b})))"),
        Min => t.int_fn(IntFn::Min, ct, &a, &b),
        Max => t.int_fn(IntFn::Max, ct, &a, &b),
        Pow if unsigned => format!("(({ct}){p}upow(({w})({a}), ({w})({b})))"),
        Pow => format!("(({ct}){p}spow(({w})({a}), ({w})({b})))"),
        BitAnd => format!("(({ct})(({a}) & ({b})))"),
        BitOr => format!("(({ct})(({a}) | ({b})))"),
        BitXor => format!("(({ct})(({a}) ^ ({b})))"),
        Shl => format!("(({ct}){p}{s}shl(({w})({a}), ({w})({b})))"),
        Shr => format!("(({ct}){p}{s}shr(({w})({a}), ({w})({b})))"),
        _ => return Err(format!("{op:?} is not defined on integers")),
    };
    Ok(if ty == Ty::Elem(DType::Bool) { t.truth(format!("({code}) != 0")) } else { code })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A style with recognizable spellings.
    struct S;
    impl CStyle for S {
        fn index_ty(&self) -> &'static str {
            "ix"
        }
        fn i64_ty(&self) -> &'static str {
            "i64"
        }
        fn u64_ty(&self) -> &'static str {
            "u64"
        }
        fn storage_ty(&self, d: DType) -> &'static str {
            d.name()
        }
        fn value_ty(&self, d: DType) -> &'static str {
            if d.is_float() && d != DType::F64 { "float" } else { d.name() }
        }
        fn prefix(&self) -> &'static str {
            "p_"
        }
        fn truth(&self, c: String) -> String {
            format!("B({c})")
        }
        fn bool_lit(&self, b: bool) -> String {
            format!("{b}")
        }
        fn index_lit(&self, x: i64) -> String {
            format!("{x}")
        }
        fn nonfinite(&self, _: f64, _: bool) -> String {
            "INF".into()
        }
        fn round(&self, d: DType, code: String) -> String {
            format!("R{}({code})", d.name())
        }
        fn short_circuit(&self) -> bool {
            false
        }
        fn int_fn(&self, f: IntFn, ct: &str, a: &str, b: &str) -> String {
            format!("{f:?}<{ct}>({a}, {b})")
        }
        fn math(&self, op: UnOp, _: DType, a: &str) -> Option<String> {
            matches!(op, UnOp::Sign | UnOp::Sigmoid | UnOp::GeluErf | UnOp::GeluTanh | UnOp::Silu | UnOp::IsNan | UnOp::IsInf).then(|| format!("{op:?}({a})"))
        }
    }

    struct T(Kernel);
    impl CTarget for T {
        type Style = S;
        type Error = String;
        fn style(&self) -> &S {
            &S
        }
        fn error(&self, msg: String) -> String {
            msg
        }
        fn kernel(&self) -> &Kernel {
            &self.0
        }
        fn var(&mut self, v: VarId) -> Result<String, String> {
            Ok(self.0.var_info(v).name.clone())
        }
        fn load(&mut self, b: BufId, idx: &[Expr]) -> Result<String, String> {
            let i: Vec<String> = idx.iter().map(|e| expr(self, e).map(|r| r.0)).collect::<Result<_, _>>()?;
            Ok(format!("{}[{}]", self.0.buf(b).name, i.join(",")))
        }
        fn check_index(&mut self, c: IndexCheck, i: String) -> String {
            format!("chk({i}, {})", c.len)
        }
    }

    fn setup() -> (T, Expr, Expr, Expr) {
        let mut k = Kernel::new("k");
        let x = k.new_var("x", Ty::Elem(DType::I32), false);
        let f = k.new_var("f", Ty::Elem(DType::F16), false);
        let i = k.index_var("i");
        (T(k), Expr::Var(x), Expr::Var(f), Expr::Var(i))
    }

    fn code(t: &mut T, e: &Expr) -> String {
        expr(t, e).unwrap().0
    }

    #[test]
    fn signed_integers_wrap_and_divide_safely() {
        let (mut t, x, _, _) = setup();
        assert_eq!(code(&mut t, &Expr::un(UnOp::Neg, x.clone())), "((i32)(0 - (u64)(x)))");
        assert_eq!(
            code(&mut t, &Expr::bin(BinOp::Add, x.clone(), x.clone())),
            "((i32)((u64)(x) + (u64)(x)))"
        );
        assert_eq!(
            code(&mut t, &Expr::bin(BinOp::Div, x.clone(), x.clone())),
            "((i32)p_sdiv((i64)(x), (i64)(x)))"
        );
        assert_eq!(code(&mut t, &Expr::un(UnOp::Abs, x.clone())), "Abs<i32>(x, )");
        // A comparison is a truth value; logical operands are tested against zero.
        assert_eq!(code(&mut t, &Expr::bin(BinOp::Lt, x.clone(), x.clone())), "B((x) < (x))");
        assert_eq!(
            code(&mut t, &Expr::bin(BinOp::And, x.clone(), x)),
            "B(((x) != 0) & ((x) != 0))"
        );
    }

    #[test]
    fn indices_stay_plain_and_mix_by_conversion() {
        let (mut t, x, _, i) = setup();
        let e = Expr::bin(BinOp::Mul, Expr::bin(BinOp::Div, i.clone(), Expr::Int(4)), Expr::Int(3));
        assert_eq!(code(&mut t, &e), "((((i) / (4))) * (3))");
        assert_eq!(code(&mut t, &Expr::bin(BinOp::Div, i.clone(), i.clone())), "p_sdiv(i, i)");
        assert_eq!(
            code(&mut t, &Expr::bin(BinOp::FloorMod, i.clone(), Expr::Int(3))),
            "FloorMod<ix>(i, 3)"
        );
        // An index operand takes the element type of the other side.
        assert_eq!(code(&mut t, &Expr::bin(BinOp::Sub, x, i)), "((i32)((u64)(x) - (u64)(((i32)(i)))))");
    }

    #[test]
    fn narrow_floats_round_after_every_operation() {
        let (mut t, _, f, _) = setup();
        let e = Expr::bin(BinOp::Mul, f.clone(), Expr::float(0.1, DType::F16));
        // The literal is rounded to f16 here (0.1 is 0.0999755859375 in f16).
        assert_eq!(code(&mut t, &e), "Rf16(((f) * (9.9975586e-2f)))");
        assert_eq!(code(&mut t, &Expr::bin(BinOp::Max, f.clone(), f.clone())), "Rf16(p_fmaxf(f, f))");
        assert_eq!(code(&mut t, &Expr::un(UnOp::IsNan, f.clone())), "B(IsNan(f))");
        // To integers through the saturating helper; from indices to f16 rounding to odd.
        assert_eq!(code(&mut t, &Expr::cast(DType::I32, f)), "((i32)p_f2i64((double)(f)))");
        assert_eq!(
            code(&mut t, &Expr::cast(DType::F16, Expr::Int(3))),
            "Rf16(p_d2f_odd((double)(3)))"
        );
    }
}
