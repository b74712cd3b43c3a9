//! `simplify`: algebraic identities that remove work without changing any result.
//!
//! - `x + 0`, `0 + x`, `x - 0`, `x * 1`, `1 * x`, `x / 1` (the constant all zeros / all
//!   ones): `x` when the result has `x`'s type; when the constant broadcasts `x` to a bigger
//!   shape the op becomes `expand(x)`. `x + 0` with `x = -0.0` gives `-0.0` where
//!   IEEE gives `+0.0` (no-signed-zeros, as every DL compiler assumes); all others are exact.
//! - `transpose` by the identity permutation → `x`; `transpose(transpose(x))` → one
//!   transpose by the composed permutation (or `x`).
//! - `reshape` to the input's own shape → `x`; `reshape(reshape(x))` → one reshape.
//! - `cast` to the input's dtype → `x`. `cast(cast(x: A → B) → C)` → `cast(x → C)` (or `x`
//!   when `C = A`) only when `A → B` is exact, i.e. B represents every value of A (widening:
//!   f16→f32, i32→i64, u8→i16, bool→anything, ...). Narrowing first is never removed:
//!   f32→f16→f32 rounds, i64→i32→i64 wraps.
//! - `expand` to the input's own shape → `x`; `slice` with unit steps that keeps every
//!   element → `x`; `concat` of one input → `x`.
//! - `neg(neg(x))` → `x` for floats (for integers the kernel's overflow behaviour at MIN
//!   would matter).
//! - `scatter_nd(x, [[a], [a + 1], ..., [b - 1]], y)` (constant indices, no reduction: a
//!   slice assignment) → `concat(x[:a], y, x[b:])` (`slice_updates.rs`).
//! - `reshape(binary(reshape(x, [1.., *S]), c), S)` (a view that only adds leading ones,
//!   undone after the op) → `binary(x, c)` with `c`'s leading ones dropped (`unit_views.rs`).
//! - `gather{axis}(x, [0, 1, ..., n-1])` with constant indices that list every position of
//!   the axis in order → `x` (Whisper's positional embedding, looked up by an `arange` of all
//!   of its rows: the lookup's checked index kept the epilogue around it from vectorizing).

use super::ir;
use crate::{OptError, Pass};
use tilec_ir::op::{BinaryOp, IndexOp, LayoutOp, UnaryOp};
use tilec_ir::{DType, Graph, Op, ValueId};

pub struct Simplify;

/// True when every value of `a` converts to `b` exactly (so converting back is identity).
pub fn cast_is_exact(a: DType, b: DType) -> bool {
    use DType::*;
    if a == b || a == Bool {
        return true;
    }
    // Bits of integer magnitude (unsigned width, or width-1 for signed) and signedness.
    let int = |d: DType| -> Option<(u32, bool)> {
        Some(match d {
            I8 => (7, true),
            I16 => (15, true),
            I32 => (31, true),
            I64 => (63, true),
            U8 => (8, false),
            U16 => (16, false),
            U32 => (32, false),
            U64 => (64, false),
            _ => return None,
        })
    };
    // Significand bits (incl. the implicit one) of float types.
    let mant = |d: DType| -> Option<u32> {
        Some(match d {
            F8E5M2 => 3,
            F8E4M3 => 4,
            BF16 => 8,
            F16 => 11,
            F32 => 24,
            F64 => 53,
            _ => return None,
        })
    };
    match (int(a), int(b), mant(a), mant(b)) {
        (Some((wa, sa)), Some((wb, sb)), _, _) => {
            if sa {
                sb && wb >= wa
            } else {
                wb >= wa
            }
        }
        // Integer to float: exact when the magnitude fits in the significand.
        (Some((wa, _)), None, _, Some(mb)) => wa <= mb,
        // Float to float: every narrower float type here has a subset of the exponent range
        // and precision of the wider ones, except f16 vs bf16 (incomparable).
        (None, None, Some(ma), Some(mb)) => {
            mb > ma
                && !matches!((a, b), (F16, BF16) | (BF16, F16))
                && !matches!((a, b), (F8E5M2, F8E4M3) | (F8E4M3, F8E5M2))
        }
        _ => false,
    }
}

/// The constant behind `v` is all `want` (0 or 1).
fn const_all(g: &Graph, v: ValueId, want: i64) -> bool {
    let Some(t) = g.const_value(v) else {
        return false;
    };
    if t.dtype().is_float() {
        t.to_f64_vec().iter().all(|&x| x == want as f64)
    } else if t.dtype().is_int() {
        t.to_i64_vec().iter().all(|&x| x == want)
    } else {
        false
    }
}

/// The constant behind `v` is the 1-D integer sequence `0, 1, ..., n - 1`.
fn const_iota(g: &Graph, v: ValueId, n: usize) -> bool {
    let Some(t) = g.const_value(v) else {
        return false;
    };
    t.dtype().is_int()
        && t.shape() == [n]
        && t.to_i64_vec().iter().enumerate().all(|(i, &x)| x == i as i64)
}

enum Rw {
    /// Replace the node's output by an existing value.
    Alias(ValueId),
    /// Replace it by a new node on `input`.
    New(Op, ValueId),
}

fn producer_op(g: &Graph, v: ValueId) -> Option<(&Op, ValueId)> {
    let n = g.node(g.producer(v)?);
    Some((&n.op, *n.inputs.first()?))
}

fn rewrite(g: &Graph, ni: usize) -> Option<Rw> {
    let n = &g.nodes()[ni];
    if n.outputs.len() != 1 {
        return None;
    }
    let out_ty = &g.value(n.outputs[0]).ty;
    let x = *n.inputs.first()?;
    let same = |v: ValueId| g.value(v).ty == *out_ty;
    match &n.op {
        Op::Binary(b @ (BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div)) => {
            let (l, r) = (n.inputs[0], n.inputs[1]);
            let neutral = if matches!(b, BinaryOp::Add | BinaryOp::Sub) {
                0
            } else {
                1
            };
            let commutes = matches!(b, BinaryOp::Add | BinaryOp::Mul);
            let keep = if const_all(g, r, neutral) {
                l
            } else if commutes && const_all(g, l, neutral) {
                r
            } else {
                return None;
            };
            if same(keep) {
                Some(Rw::Alias(keep))
            } else if g.value(keep).ty.dtype == out_ty.dtype {
                Some(Rw::New(
                    Op::Layout(LayoutOp::Expand {
                        shape: out_ty.shape.clone(),
                    }),
                    keep,
                ))
            } else {
                None
            }
        }
        Op::Layout(LayoutOp::Transpose { perm }) => {
            if perm.iter().enumerate().all(|(i, &p)| i == p) {
                return Some(Rw::Alias(x));
            }
            match producer_op(g, x)? {
                (Op::Layout(LayoutOp::Transpose { perm: inner }), y) => {
                    let q: Vec<usize> = perm.iter().map(|&p| inner[p]).collect();
                    if q.iter().enumerate().all(|(i, &p)| i == p) {
                        Some(Rw::Alias(y))
                    } else {
                        Some(Rw::New(Op::Layout(LayoutOp::Transpose { perm: q }), y))
                    }
                }
                _ => None,
            }
        }
        Op::Layout(LayoutOp::Reshape { shape }) => {
            if same(x) {
                return Some(Rw::Alias(x));
            }
            match producer_op(g, x)? {
                (Op::Layout(LayoutOp::Reshape { .. }), y) => {
                    if same(y) {
                        Some(Rw::Alias(y))
                    } else {
                        Some(Rw::New(
                            Op::Layout(LayoutOp::Reshape {
                                shape: shape.clone(),
                            }),
                            y,
                        ))
                    }
                }
                _ => None,
            }
        }
        Op::Cast { to, saturate } => {
            if same(x) {
                return Some(Rw::Alias(x));
            }
            match producer_op(g, x)? {
                (Op::Cast { to: mid, .. }, y) if cast_is_exact(g.value(y).ty.dtype, *mid) => {
                    if same(y) {
                        Some(Rw::Alias(y))
                    } else {
                        Some(Rw::New(
                            Op::Cast {
                                to: *to,
                                saturate: *saturate,
                            },
                            y,
                        ))
                    }
                }
                _ => None,
            }
        }
        Op::Layout(LayoutOp::Expand { .. }) if same(x) => Some(Rw::Alias(x)),
        Op::Layout(LayoutOp::Slice { steps, .. }) if steps.iter().all(|&s| s == 1) && same(x) => {
            Some(Rw::Alias(x))
        }
        Op::Layout(LayoutOp::Concat { .. }) if n.inputs.len() == 1 && same(x) => Some(Rw::Alias(x)),
        Op::Index(IndexOp::Gather { axis }) if n.inputs.len() == 2 && same(x) => {
            let dim = g.value(x).ty.shape.get(*axis)?.fixed()?;
            const_iota(g, n.inputs[1], dim).then_some(Rw::Alias(x))
        }
        Op::Unary(UnaryOp::Neg) if out_ty.dtype.is_float() => match producer_op(g, x)? {
            (Op::Unary(UnaryOp::Neg), y) if same(y) => Some(Rw::Alias(y)),
            _ => None,
        },
        _ => None,
    }
}

impl Pass for Simplify {
    fn name(&self) -> &'static str {
        "simplify"
    }

    fn run(&self, g: &mut Graph) -> Result<bool, OptError> {
        let mut changed = false;
        // Nodes added here are appended; they are looked at in the next fixpoint round.
        for ni in 0..g.nodes().len() {
            let Some(rw) = rewrite(g, ni) else { continue };
            let out = g.nodes()[ni].outputs[0];
            let new = match rw {
                Rw::Alias(v) => v,
                Rw::New(op, input) => {
                    let name = format!("{}.simplified", g.nodes()[ni].name);
                    match g.add_node(&name, op, &[input]) {
                        Ok(outs) if outs.len() == 1 => outs[0],
                        _ => continue,
                    }
                }
            };
            // A rewrite whose type differs (e.g. symbolic dims derived differently) is
            // dropped; its new node, if any, is dead and goes with cleanup.
            if g.value(new).ty == g.value(out).ty {
                g.replace_all_uses(out, new).map_err(ir("simplify"))?;
                changed = true;
            }
        }
        changed |= super::slice_updates::rewrite(g)?;
        changed |= super::unit_views::rewrite(g)?;
        // Also removes nodes a rejected rewrite may have added.
        g.cleanup().map_err(ir("simplify"))?;
        Ok(changed)
    }
}
