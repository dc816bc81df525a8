//! CPU model of the kernels' exponential on the FMA pipe (`ex2_poly` in kernels/ptx.cuh).
//!
//! The forward kernel can compute part of its `2^x` with a polynomial on the FMA pipe instead
//! of the MUFU unit (16 results per clock per SM on Hopper), as FlashAttention-4 does: at
//! head_dim 64 the exponentials of a score tile take as many cycles as its two GEMMs. This
//! module evaluates the same steps in f32 so that a test holds the kernel's coefficients (read
//! from the kernel source) to their error bound.

/// The kernel source that defines `ex2_poly` and its coefficients.
const PTX_CUH: &str = include_str!("../kernels/ptx.cuh");

/// Coefficients c1, c2, c3 of `2^f = 1 + f (c1 + f (c2 + f c3))` on `[0, 1)`, as written in
/// kernels/ptx.cuh (`EX2_POLY_C1..3`); `None` if the source no longer defines them.
pub fn kernel_coefficients() -> Option<[f32; 3]> {
    let mut c = [0f32; 3];
    for (k, slot) in c.iter_mut().enumerate() {
        let name = format!("EX2_POLY_C{} = ", k + 1);
        let start = PTX_CUH.find(&name)? + name.len();
        let end = start + PTX_CUH[start..].find('f')?;
        *slot = PTX_CUH[start..end].trim().parse().ok()?;
    }
    Some(c)
}

/// `2^x` as `ex2_poly` computes it, step for step in f32: `j = floor(max(x, -127))`,
/// `f = x - j`, the polynomial by FMAs, `j` added to the exponent field; 0 below -127 (and for
/// -inf). Valid for `x < 128`.
pub fn ex2_poly(x: f32, c: [f32; 3]) -> f32 {
    let xc = x.max(-127.0);
    // add.rm.f32 xc + 1.5 * 2^23 is exactly 1.5 * 2^23 + floor(xc) in this range.
    let t = 12_582_912.0f32 + xc.floor();
    let fr = xc - (t - 12_582_912.0);
    let p = c[2].mul_add(fr, c[1]).mul_add(fr, c[0]).mul_add(fr, 1.0);
    let bits = p.to_bits().wrapping_add(t.to_bits() << 23);
    if x < -127.0 {
        0.0
    } else {
        f32::from_bits(bits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_polynomial_is_within_its_bound() {
        let c = kernel_coefficients().expect("EX2_POLY_C1..3 in kernels/ptx.cuh");
        let mut worst = 0f64;
        // Every 1/4096 from -126 to 9 (the softmax's inputs lie below the rescale slack, 8).
        for i in 0..(135 * 4096) {
            let x = -126.0 + i as f32 / 4096.0;
            let got = ex2_poly(x, c) as f64;
            let want = (x as f64).exp2();
            worst = worst.max((got / want - 1.0).abs());
        }
        assert!(worst <= 8.7e-5, "max relative error {worst:e}");
        // Below the range and at -inf: exactly 0, as a masked score needs.
        for x in [-127.5f32, -200.0, -1e30, f32::NEG_INFINITY] {
            assert_eq!(ex2_poly(x, c), 0.0, "{x}");
        }
        // Exact at the integers (p(0) = 1): 2^0 = 1, 2^8, 2^-100.
        for j in [0i32, 8, -100] {
            assert_eq!(ex2_poly(j as f32, c), (j as f32).exp2(), "{j}");
        }
    }
}
