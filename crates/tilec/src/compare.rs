//! Comparing computed tensors with expected ones, numpy `allclose`-style:
//! `|actual - expected| <= atol + rtol * |expected|`, NaN matches NaN, infinities must be
//! equal; integer and bool tensors must match exactly. A NaN or an infinity facing a
//! different value is a mismatch that no error statistic measures: it is counted apart.

use tilec_ir::Tensor;

/// The outcome of comparing one tensor pair.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    /// Number of elements compared.
    pub count: usize,
    /// Number of elements outside the tolerance.
    pub mismatches: usize,
    /// Of those, the elements where a NaN or an infinity faces a different value (not
    /// counted in `max_abs` and `max_rel`).
    pub nonfinite_mismatches: usize,
    /// Largest `|actual - expected|` over finite pairs.
    pub max_abs: f64,
    /// Largest `|actual - expected| / |expected|` over finite pairs with `expected != 0`.
    pub max_rel: f64,
    /// The first mismatching element: flat index, expected, actual.
    pub first_mismatch: Option<(usize, f64, f64)>,
}

impl Comparison {
    pub fn ok(&self) -> bool {
        self.mismatches == 0
    }
}

/// Compares `actual` with `expected`. Errors (rather than a [`Comparison`]) when the
/// dtypes or shapes differ.
pub fn compare(expected: &Tensor, actual: &Tensor, rtol: f64, atol: f64) -> Result<Comparison, String> {
    if expected.dtype() != actual.dtype() {
        return Err(format!("dtype differs: expected {}, got {}", expected.dtype(), actual.dtype()));
    }
    if expected.shape() != actual.shape() {
        return Err(format!("shape differs: expected {:?}, got {:?}", expected.shape(), actual.shape()));
    }
    let mut c = Comparison { count: expected.numel(), mismatches: 0, nonfinite_mismatches: 0, max_abs: 0.0, max_rel: 0.0, first_mismatch: None };
    if !expected.dtype().is_float() {
        let (e, a) = (expected.to_i64_vec(), actual.to_i64_vec());
        for (i, (&x, &y)) in e.iter().zip(&a).enumerate() {
            let d = (x as i128 - y as i128).unsigned_abs() as f64;
            c.max_abs = c.max_abs.max(d);
            if x != 0 {
                c.max_rel = c.max_rel.max(d / (x as f64).abs());
            }
            if x != y {
                c.mismatches += 1;
                c.first_mismatch.get_or_insert((i, x as f64, y as f64));
            }
        }
        return Ok(c);
    }
    let (e, a) = (expected.to_f64_vec(), actual.to_f64_vec());
    for (i, (&x, &y)) in e.iter().zip(&a).enumerate() {
        let ok = if !x.is_finite() || !y.is_finite() {
            // NaN matches NaN only; an infinity only the same infinity.
            let same = (x.is_nan() && y.is_nan()) || x == y;
            if !same {
                c.nonfinite_mismatches += 1;
            }
            same
        } else {
            let d = (x - y).abs();
            c.max_abs = c.max_abs.max(d);
            if x != 0.0 {
                c.max_rel = c.max_rel.max(d / x.abs());
            }
            d <= atol + rtol * x.abs()
        };
        if !ok {
            c.mismatches += 1;
            c.first_mismatch.get_or_insert((i, x, y));
        }
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_tolerances() {
        let e = Tensor::from_vec(vec![4], vec![1.0f32, 100.0, f32::NAN, f32::INFINITY]).unwrap();
        let a = Tensor::from_vec(vec![4], vec![1.0f32 + 1e-6, 100.05, f32::NAN, f32::INFINITY]).unwrap();
        let c = compare(&e, &a, 1e-3, 1e-5).unwrap();
        assert!(c.ok(), "{c:?}");
        assert!((c.max_abs - 0.05).abs() < 1e-3);
        let c = compare(&e, &a, 1e-5, 1e-5).unwrap();
        assert_eq!(c.mismatches, 1);
        assert_eq!(c.first_mismatch.map(|m| m.0), Some(1));
        let b = Tensor::from_vec(vec![4], vec![1.0f32, 100.0, 0.0, f32::NEG_INFINITY]).unwrap();
        let c = compare(&e, &b, 1.0, 1.0).unwrap();
        assert_eq!((c.mismatches, c.nonfinite_mismatches), (2, 2));
    }

    #[test]
    fn nan_and_infinity_against_numbers_are_mismatches() {
        let e = Tensor::from_vec(vec![4], vec![1.0f32, 2.0, f32::NAN, f32::INFINITY]).unwrap();
        let a = Tensor::from_vec(vec![4], vec![f32::NAN, f32::INFINITY, 3.0, 4.0]).unwrap();
        let c = compare(&e, &a, 1e3, 1e3).unwrap();
        assert_eq!((c.mismatches, c.nonfinite_mismatches), (4, 4));
        assert_eq!(c.first_mismatch.map(|m| m.0), Some(0));
        let c = compare(&e, &e, 0.0, 0.0).unwrap();
        assert!(c.ok() && c.nonfinite_mismatches == 0, "{c:?}");
    }

    #[test]
    fn ints_exact_and_shape_checked() {
        let e = Tensor::from_vec(vec![2], vec![i64::MAX, 3]).unwrap();
        let a = Tensor::from_vec(vec![2], vec![i64::MAX - 1, 3]).unwrap();
        let c = compare(&e, &a, 1.0, 1.0).unwrap();
        assert_eq!(c.mismatches, 1);
        assert_eq!(c.max_abs, 1.0);
        let a = Tensor::from_vec(vec![1, 2], vec![i64::MAX, 3]).unwrap();
        assert!(compare(&e, &a, 1.0, 1.0).unwrap_err().contains("shape"));
        let a = Tensor::from_vec(vec![2], vec![1i32, 3]).unwrap();
        assert!(compare(&e, &a, 1.0, 1.0).unwrap_err().contains("dtype"));
    }
}
