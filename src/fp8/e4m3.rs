//! The 8-bit float `e4m3` (OCP FP8 "E4M3FN", PTX `.e4m3`): 1 sign bit, 4 exponent bits (bias
//! 7), 3 mantissa bits, no infinities, NaN = `S.1111.111`. Largest finite value 448 (`0x7E`),
//! smallest normal 2^-6, subnormals `m * 2^-9`.
//!
//! The conversion from f32 is PTX's `cvt.rn.satfinite.e4m3x2.f32` (PTX ISA 9.0, 9.7.9.21 cvt):
//! round to nearest even, finite values beyond 448 (and infinities) saturate to +-448, NaN
//! stays NaN. The GPU kernel quantises P with that instruction; this codec is its CPU twin, so
//! that host code quantises inputs the way the device would and the tests can emulate the
//! kernel's arithmetic bit for bit. (An own 30-line codec rather than a crate: the saturating
//! PTX semantics are the point, and every one of the 256 codes is tested below.)

/// One e4m3 value, stored as its bit pattern. `#[repr(transparent)]` over `u8`, so that a
/// `&[E4m3]` is a byte buffer for the device.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct E4m3(u8);

impl E4m3 {
    /// The largest finite value, 448 = 1.75 * 2^8.
    pub const MAX: f32 = 448.0;
    /// The smallest normal value, 2^-6.
    pub const MIN_NORMAL: f32 = 1.0 / 64.0;
    /// 1.0 (`0x38`).
    pub const ONE: E4m3 = E4m3(0x38);

    /// The value with this bit pattern.
    pub const fn from_bits(bits: u8) -> Self {
        E4m3(bits)
    }

    /// The bit pattern.
    pub const fn to_bits(self) -> u8 {
        self.0
    }

    /// `true` for the two NaN patterns (`0x7F`, `0xFF`).
    pub fn is_nan(self) -> bool {
        self.0 & 0x7F == 0x7F
    }

    /// The exact value (every e4m3 value is an f32).
    pub fn to_f32(self) -> f32 {
        let sign = if self.0 & 0x80 != 0 { -1.0f32 } else { 1.0 };
        let e = i32::from((self.0 >> 3) & 0xF);
        let m = f32::from(self.0 & 7);
        if self.is_nan() {
            return f32::NAN;
        }
        let mag = if e == 0 {
            m * (2.0f32).powi(-9)
        } else {
            (1.0 + m / 8.0) * (2.0f32).powi(e - 7)
        };
        sign * mag
    }

    /// Rounds `x` to nearest even, saturating finite overflow and infinities to +-448 and
    /// keeping NaN (as `cvt.rn.satfinite.e4m3x2.f32`).
    pub fn from_f32(x: f32) -> Self {
        if x.is_nan() {
            return E4m3(0x7F);
        }
        let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
        let a = f64::from(x.abs()).min(f64::from(Self::MAX));
        let code = if a < f64::from(Self::MIN_NORMAL) {
            // Subnormal steps of 2^-9; 8 steps is the smallest normal, code 0x08.
            (a * 512.0).round_ties_even() as u8
        } else {
            let e = a.log2().floor() as i32;
            // log2 may land one off at binade edges: correct it so that 1 <= mant < 2.
            let e = if a / 2f64.powi(e) >= 2.0 {
                e + 1
            } else if a / 2f64.powi(e) < 1.0 {
                e - 1
            } else {
                e
            };
            let q = ((a / 2f64.powi(e) - 1.0) * 8.0).round_ties_even() as i32;
            // q = 8 carries into the exponent; (e + 7) << 3 | q does that by itself.
            (((e + 7) << 3) + q) as u8
        };
        E4m3(sign | code)
    }

    /// Half the distance to the next e4m3 value above `|x|` for `|x| <= 448`: the largest
    /// error of rounding `x` to e4m3 (RNE). 2^-10 below 2^-6 (the subnormal half-step),
    /// `2^(floor(log2 |x|) - 4)` above.
    pub fn half_ulp(x: f64) -> f64 {
        let a = x.abs();
        if a < f64::from(Self::MIN_NORMAL) {
            return 2f64.powi(-10);
        }
        2f64.powf(a.log2().floor() - 4.0)
    }
}

impl From<E4m3> for f32 {
    fn from(x: E4m3) -> f32 {
        x.to_f32()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips() {
        for b in 0..=255u8 {
            let x = E4m3::from_bits(b);
            if x.is_nan() {
                assert!(x.to_f32().is_nan());
                assert!(E4m3::from_f32(x.to_f32()).is_nan());
                continue;
            }
            assert_eq!(
                E4m3::from_f32(x.to_f32()),
                x,
                "code {b:#04x} = {}",
                x.to_f32()
            );
        }
        assert_eq!(E4m3::ONE.to_f32(), 1.0);
        assert_eq!(E4m3::from_bits(0x7E).to_f32(), 448.0);
        assert_eq!(E4m3::from_bits(0x01).to_f32(), 2f32.powi(-9));
        assert_eq!(E4m3::from_bits(0x08).to_f32(), 2f32.powi(-6));
    }

    #[test]
    fn rounds_to_nearest_even_and_saturates() {
        // Every midpoint between consecutive positive values goes to the even code.
        let vals: Vec<f32> = (0..0x7Fu8).map(|b| E4m3::from_bits(b).to_f32()).collect();
        for (i, w) in vals.windows(2).enumerate() {
            let mid = (w[0] + w[1]) / 2.0;
            let even = if i % 2 == 0 { i } else { i + 1 } as u8;
            assert_eq!(E4m3::from_f32(mid).to_bits(), even, "mid {mid}");
            assert_eq!(E4m3::from_f32(-mid).to_bits(), 0x80 | even, "mid {mid}");
            // Just off the midpoint: the nearer one.
            assert_eq!(E4m3::from_f32(mid * 0.9999).to_bits(), i as u8);
            assert_eq!(E4m3::from_f32(mid * 1.0001).to_bits(), i as u8 + 1);
            // The half-ulp bound holds on both sides of each value.
            let err =
                (f64::from(E4m3::from_f32(mid * 0.9999).to_f32()) - f64::from(mid * 0.9999)).abs();
            assert!(err <= E4m3::half_ulp(f64::from(mid * 0.9999)), "{mid}");
        }
        for x in [449.0f32, 464.0, 1e6, f32::INFINITY] {
            assert_eq!(E4m3::from_f32(x).to_f32(), 448.0);
            assert_eq!(E4m3::from_f32(-x).to_f32(), -448.0);
        }
        assert!(E4m3::from_f32(f32::NAN).is_nan());
        assert_eq!(E4m3::from_f32(-0.0).to_bits(), 0x80);
        assert_eq!(E4m3::from_f32(2f32.powi(-11)).to_bits(), 0); // below half the least step
    }

    #[test]
    fn half_ulp() {
        assert_eq!(E4m3::half_ulp(1.0), 1.0 / 16.0);
        assert_eq!(E4m3::half_ulp(0.99), 1.0 / 32.0);
        assert_eq!(E4m3::half_ulp(0.001), 2f64.powi(-10));
    }
}
