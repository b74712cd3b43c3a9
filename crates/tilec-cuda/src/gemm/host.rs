//! Host-side conversions to the tensor cores' narrow input formats, for preparing operands and
//! exact references: f32 to fp8 (e4m3, e5m2) bits and back, and f32 rounded to tf32.
//!
//! The conversions round to nearest, ties to even, on the f32 bit pattern (fast enough for
//! operands of 10^8 elements). fp8 saturates out-of-range finite values (and infinities) to the
//! largest finite value, as `torch.float8_*` casts with saturation do; NaN stays NaN.

use tilec_ir::DType;

/// The parameters of an fp8 format.
struct Fp8 {
    mant: u32,
    bias: i32,
    /// Bits of the largest finite magnitude.
    max_code: u32,
    /// Bits of the canonical NaN (sign clear).
    nan: u8,
}

fn format(d: DType) -> Fp8 {
    match d {
        // e4m3fn: no infinities, S.1111.111 is NaN, the largest finite is 448 (0x7e).
        DType::F8E4M3 => Fp8 { mant: 3, bias: 7, max_code: 0x7e, nan: 0x7f },
        // e5m2: IEEE-like, 0x7c is infinity, the largest finite is 57344 (0x7b).
        DType::F8E5M2 => Fp8 { mant: 2, bias: 15, max_code: 0x7b, nan: 0x7f },
        d => panic!("{} is not an fp8 format", d.name()),
    }
}

/// `x` rounded to the nearest value of the fp8 format `d` (ties to even), as its bits.
pub fn fp8_bits(d: DType, x: f32) -> u8 {
    let f = format(d);
    let bits = x.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    if x.is_nan() {
        return sign | f.nan;
    }
    let a = bits & 0x7fff_ffff;
    let exp = (a >> 23) as i32 - 127;
    let min_normal_exp = 1 - f.bias;
    let code = if exp < min_normal_exp {
        // Subnormal in fp8 (or zero): multiples of 2^(min_normal_exp - mant); the rounded count
        // of them is the code, and a count of 2^mant is the smallest normal's code.
        let quantum = (min_normal_exp - f.mant as i32) as f64;
        let q = f64::from(f32::from_bits(a)) / quantum.exp2();
        let r = q.round();
        let r = if (q - q.trunc()) == 0.5 && r % 2.0 != 0.0 { r - 1.0 } else { r };
        r as u32
    } else {
        // Normal: drop 23 - mant mantissa bits with ties to even; a carry moves into the
        // exponent by itself.
        let shift = 23 - f.mant;
        let lsb = (a >> shift) & 1;
        let rounded = (a + (1 << (shift - 1)) - 1 + lsb) >> shift;
        let rebias = ((127 - f.bias) as u32) << f.mant;
        // Infinity and values past the largest finite saturate.
        rounded.saturating_sub(rebias).min(f.max_code + 1)
    };
    sign | code.min(f.max_code) as u8
}

/// The value of fp8 bits of format `d`.
pub fn fp8_value(d: DType, bits: u8) -> f32 {
    match d {
        DType::F8E4M3 => tilec_ir::F8E4M3(bits).to_f64() as f32,
        DType::F8E5M2 => tilec_ir::F8E5M2(bits).to_f64() as f32,
        d => panic!("{} is not an fp8 format", d.name()),
    }
}

/// The 256 values of an fp8 format, indexed by bits (for decoding large operands).
pub fn fp8_table(d: DType) -> [f32; 256] {
    let mut t = [0f32; 256];
    for (b, v) in t.iter_mut().enumerate() {
        *v = fp8_value(d, b as u8);
    }
    t
}

/// `x` rounded to tf32 (10 mantissa bits; ties to even), kept as an f32 whose low 13 bits are
/// zero: the tensor cores, which drop those bits, then multiply it exactly.
pub fn tf32_round(x: f32) -> f32 {
    if !x.is_finite() {
        return x;
    }
    let b = x.to_bits();
    let lsb = (b >> 13) & 1;
    f32::from_bits((b + 0xfff + lsb) & !0x1fff)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(d: DType, x: f32) -> u8 {
        match d {
            DType::F8E4M3 => tilec_ir::F8E4M3::from_f64(f64::from(x), true).0,
            _ => tilec_ir::F8E5M2::from_f64(f64::from(x), true).0,
        }
    }

    #[test]
    fn fp8_rounding_matches_the_reference_conversion() {
        for d in [DType::F8E4M3, DType::F8E5M2] {
            // Every code and the midpoints between neighbours (ties to even).
            let table = fp8_table(d);
            for b in 0..=255u8 {
                let v = table[b as usize];
                if v.is_nan() {
                    assert!(fp8_value(d, fp8_bits(d, v)).is_nan());
                    continue;
                }
                if v.is_infinite() {
                    continue;
                }
                assert_eq!(fp8_value(d, fp8_bits(d, v)), v, "{} {b:#x}", d.name());
                let next = table[(b as usize + 1) & 0xff];
                if next.is_finite() && b & 0x7f < 0x7f && (next.abs() > v.abs()) {
                    let mid = (v + next) / 2.0;
                    assert_eq!(fp8_bits(d, mid), reference(d, mid), "{} mid {mid}", d.name());
                }
            }
            // A sweep over magnitudes, both signs, past saturation and into the subnormals.
            let mut x = 1e-9f32;
            while x < 1e6 {
                for s in [x, -x, x * 1.0001, -x * 0.9999] {
                    assert_eq!(fp8_bits(d, s), reference(d, s), "{} {s}", d.name());
                }
                x *= 1.0137;
            }
            assert_eq!(fp8_bits(d, 0.0), 0);
            assert_eq!(fp8_bits(d, -0.0), 0x80);
            assert_eq!(fp8_value(d, fp8_bits(d, f32::INFINITY)), if d == DType::F8E4M3 { 448.0 } else { 57344.0 });
        }
        assert_eq!(fp8_value(DType::F8E4M3, fp8_bits(DType::F8E4M3, 1e6)), 448.0);
        assert_eq!(fp8_value(DType::F8E4M3, fp8_bits(DType::F8E4M3, 1.0625)), 1.0);
        assert_eq!(fp8_value(DType::F8E4M3, fp8_bits(DType::F8E4M3, 1.1875)), 1.25);
        // The smallest e4m3 subnormal is 2^-9; half of it ties to zero, a bit more rounds up.
        assert_eq!(fp8_bits(DType::F8E4M3, 2f32.powi(-10)), 0);
        assert_eq!(fp8_bits(DType::F8E4M3, 2f32.powi(-10) * 1.01), 1);
        assert_eq!(fp8_bits(DType::F8E5M2, -3.0), 0xc2);
    }

    #[test]
    fn tf32_keeps_ten_mantissa_bits_with_ties_to_even() {
        assert_eq!(tf32_round(1.0), 1.0);
        let ulp = 2f32.powi(-10);
        // Halfway between 1 and 1 + ulp: to even (1); just above: up.
        assert_eq!(tf32_round(1.0 + ulp / 2.0), 1.0);
        assert_eq!(tf32_round(1.0 + ulp / 2.0 + 2f32.powi(-20)), 1.0 + ulp);
        // Halfway between 1 + ulp and 1 + 2 ulp: to even (1 + 2 ulp).
        assert_eq!(tf32_round(1.0 + 1.5 * ulp), 1.0 + 2.0 * ulp);
        assert_eq!(tf32_round(-1.0 - 1.5 * ulp), -1.0 - 2.0 * ulp);
        let x = tf32_round(0.123_456_79);
        assert_eq!(x.to_bits() & 0x1fff, 0);
        assert!((x - 0.123_456_79).abs() <= 0.123_456_79 * ulp / 2.0);
        assert!(tf32_round(f32::NAN).is_nan());
        assert_eq!(tf32_round(f32::INFINITY), f32::INFINITY);
    }
}
