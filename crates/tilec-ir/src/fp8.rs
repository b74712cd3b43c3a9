//! fp8 storage formats: e4m3 ("fn": no infinities, NaN = all ones) and e5m2 (IEEE-like).
//! Conversion from wider floats rounds to nearest even; `saturate` clamps out-of-range
//! finite values (and, as ONNX specifies, infinities for e4m3) to the largest finite value.

/// An fp8 e4m3fn value, stored as its bit pattern.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
#[repr(transparent)]
pub struct F8E4M3(pub u8);

/// An fp8 e5m2 value, stored as its bit pattern.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
#[repr(transparent)]
pub struct F8E5M2(pub u8);

struct Format {
    mant_bits: i32,
    bias: i32,
    /// Largest finite magnitude.
    max: f64,
    /// e4m3fn has no infinity: the all-ones exponent still holds finite values.
    has_inf: bool,
}

const E4M3: Format = Format { mant_bits: 3, bias: 7, max: 448.0, has_inf: false };
const E5M2: Format = Format { mant_bits: 2, bias: 15, max: 57344.0, has_inf: true };

fn round_half_even(x: f64) -> f64 {
    let r = x.round();
    if (x - x.trunc()).abs() == 0.5 && r % 2.0 != 0.0 {
        r - x.signum()
    } else {
        r
    }
}

fn encode(fmt: &Format, x: f64, saturate: bool) -> u8 {
    let sign: u8 = if x.is_sign_negative() { 0x80 } else { 0 };
    let nan = if fmt.has_inf { 0x7f } else { 0x7f };
    let inf_bits = if fmt.has_inf { 0x7c } else { nan };
    let max_bits = encode_finite(fmt, fmt.max);
    if x.is_nan() {
        return sign | nan;
    }
    let a = x.abs();
    if a.is_infinite() {
        return if saturate { sign | max_bits } else { sign | inf_bits };
    }
    if a == 0.0 {
        return sign;
    }
    let emin = 1 - fmt.bias;
    let e = (a.log2().floor() as i32).max(emin);
    let quantum = 2f64.powi(e - fmt.mant_bits);
    let q = round_half_even(a / quantum) * quantum;
    if q > fmt.max {
        return if saturate { sign | max_bits } else { sign | inf_bits };
    }
    sign | encode_finite(fmt, q)
}

/// Bits of a non-negative value exactly representable in the format.
fn encode_finite(fmt: &Format, q: f64) -> u8 {
    if q == 0.0 {
        return 0;
    }
    let emin = 1 - fmt.bias;
    let min_normal = 2f64.powi(emin);
    if q < min_normal {
        let m = (q / 2f64.powi(emin - fmt.mant_bits)).round() as u8;
        return m;
    }
    let mut e = q.log2().floor() as i32;
    // log2 can be off by one ulp near powers of two.
    if 2f64.powi(e) > q {
        e -= 1;
    } else if 2f64.powi(e + 1) <= q {
        e += 1;
    }
    let m = (q / 2f64.powi(e - fmt.mant_bits)).round() as i32 - (1 << fmt.mant_bits);
    ((((e + fmt.bias) as u32) << fmt.mant_bits) | m as u32) as u8
}

fn decode(fmt: &Format, b: u8) -> f64 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp_bits = 7 - fmt.mant_bits;
    let e = ((b & 0x7f) >> fmt.mant_bits) as i32;
    let m = (b & ((1 << fmt.mant_bits) - 1)) as i32;
    let e_all = (1 << exp_bits) - 1;
    if fmt.has_inf && e == e_all {
        return if m == 0 { sign * f64::INFINITY } else { f64::NAN };
    }
    if !fmt.has_inf && e == e_all && m == (1 << fmt.mant_bits) - 1 {
        return f64::NAN;
    }
    if e == 0 {
        sign * (m as f64) * 2f64.powi(1 - fmt.bias - fmt.mant_bits)
    } else {
        sign * (1.0 + m as f64 / (1 << fmt.mant_bits) as f64) * 2f64.powi(e - fmt.bias)
    }
}

impl F8E4M3 {
    pub fn from_f64(x: f64, saturate: bool) -> Self {
        F8E4M3(encode(&E4M3, x, saturate))
    }
    pub fn to_f64(self) -> f64 {
        decode(&E4M3, self.0)
    }
}

impl F8E5M2 {
    pub fn from_f64(x: f64, saturate: bool) -> Self {
        F8E5M2(encode(&E5M2, x, saturate))
    }
    pub fn to_f64(self) -> f64 {
        decode(&E5M2, self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_e4m3_pattern_round_trips() {
        for b in 0..=255u8 {
            let v = F8E4M3(b).to_f64();
            if v.is_nan() {
                assert!(F8E4M3::from_f64(v, true).to_f64().is_nan());
                continue;
            }
            assert_eq!(F8E4M3::from_f64(v, false).to_f64(), v, "pattern {b:#x}");
        }
    }

    #[test]
    fn every_e5m2_pattern_round_trips() {
        for b in 0..=255u8 {
            let v = F8E5M2(b).to_f64();
            if v.is_nan() {
                continue;
            }
            assert_eq!(F8E5M2::from_f64(v, false).to_f64(), v, "pattern {b:#x}");
        }
    }

    #[test]
    fn saturation_and_rounding() {
        assert_eq!(F8E4M3::from_f64(1e6, true).to_f64(), 448.0);
        assert!(F8E4M3::from_f64(1e6, false).to_f64().is_nan());
        assert_eq!(F8E5M2::from_f64(f64::INFINITY, false).to_f64(), f64::INFINITY);
        assert_eq!(F8E5M2::from_f64(1e9, true).to_f64(), 57344.0);
        // 1.0625 lies halfway between 1.0 and 1.125 in e4m3: ties to even (1.0).
        assert_eq!(F8E4M3::from_f64(1.0625, true).to_f64(), 1.0);
        assert_eq!(F8E4M3::from_f64(1.1875, true).to_f64(), 1.25);
    }
}
