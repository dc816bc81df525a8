//! The warpgroup layout model (tools/src/layout_wgmma.rs) and the wgmma probe on its emulator:
//! the maps are bijections, the emulated TMA + descriptor + wgmma path computes plain matrix
//! products in every form attn_wgmma uses, and the probe passes, and catches its faults, with
//! the thread and register of each wrong cell.

use flashattn::DType;
use flashattn_tools::layout::{Input16, pack};
use flashattn_tools::layout_wgmma::{
    self as lw, AOperand, Descriptor, Major, Swizzle, WARPGROUP, a_cell, acc_cell, acc_owner,
};
use flashattn_tools::probe_wgmma::{self, WgmmaDump};
use rand::{Rng, SeedableRng, rngs::StdRng};

#[test]
fn accumulator_map_is_a_bijection_onto_64xn() {
    for n in [8usize, 64, 128, 256] {
        let mut seen = vec![false; 64 * n];
        for tid in 0..WARPGROUP {
            for reg in 0..n / 2 {
                let (r, c) = acc_cell(tid, reg);
                assert!(r < 64 && c < n);
                assert!(!seen[r * n + c], "cell ({r},{c}) twice");
                seen[r * n + c] = true;
                assert_eq!(acc_owner(r, c), (tid, reg));
            }
        }
        assert!(seen.iter().all(|&x| x));
    }
}

#[test]
fn register_a_operand_covers_64x16_once() {
    let mut seen = [[false; 16]; 64];
    for tid in 0..WARPGROUP {
        for reg in 0..4 {
            for half in 0..2 {
                let (r, k) = a_cell(tid, reg, half);
                assert!(!seen[r][k]);
                seen[r][k] = true;
            }
        }
    }
    assert!(seen.iter().flatten().all(|&x| x));
    // Each warp owns 16 rows, and the A fragment of an m16n8k16 inside them.
    assert_eq!(a_cell(37, 1, 0), (16 + 1 + 8, 2));
    assert_eq!(a_cell(127, 3, 1), (48 + 7 + 8, 6 + 1 + 8));
}

#[test]
fn swizzles_permute_16_byte_chunks_inside_their_rows() {
    for sw in [Swizzle::None, Swizzle::B32, Swizzle::B64, Swizzle::B128] {
        for a in (0..8192).step_by(2) {
            let p = sw.apply(a);
            assert_eq!(sw.apply(p), a, "{sw:?} is an involution");
            assert_eq!(p % 16, a % 16);
            assert_eq!(p / 128, a / 128);
        }
        assert_eq!(Swizzle::from_code(sw.code()), sw);
    }
    // Row 3 of a 128-byte atom: chunk 0 sits at chunk 3.
    assert_eq!(Swizzle::B128.apply(3 * 128), 3 * 128 + 3 * 16);
}

#[test]
fn descriptor_encoding_round_trips() {
    let d = Descriptor {
        start: 0x1_2340,
        lbo: 16384,
        sbo: 1024,
        swizzle: Swizzle::B128,
    };
    assert_eq!(Descriptor::decode(d.encode()), d);
    assert_eq!(d.encode() >> 62, 1);
    assert_eq!((d.encode() >> 32) & 0x3FFF, 64);
    assert_eq!(Descriptor::kmajor_sw128(0, 5, 8192).start, 8192 + 32);
    assert_eq!(Descriptor::mnmajor_sw128(0, 3, 8192).start, 3 * 2048);
}

fn random_ints(rng: &mut StdRng, input: Input16, len: usize) -> Vec<u16> {
    (0..len)
        .map(|_| input.encode(rng.gen_range(-8i32..=8) as f32))
        .collect()
}

fn dec(input: Input16, x: u16) -> f64 {
    f64::from(input.decode(x))
}

/// Q (64 x d) K^T through TMA boxes and K-major descriptors, as attn_wgmma's S, equals the
/// plain product, for head dims of one to four boxes.
#[test]
fn emulated_kmajor_path_is_the_matrix_product() {
    let mut rng = StdRng::seed_from_u64(7);
    for input in [Input16::F16, Input16::BF16] {
        for d in [64usize, 128, 256] {
            let n = 96;
            let q = random_ints(&mut rng, input, 64 * d);
            let k = random_ints(&mut rng, input, n * d);
            let (sq, sk) = (0usize, 64 * d * 2);
            let mut smem = vec![0u8; sk + n * d * 2];
            lw::tma_load(&mut smem, sq, &q, 64, d, 64 * 128);
            lw::tma_load(&mut smem, sk, &k, n, d, n * 128);
            let mut s = lw::zero_acc(n);
            for kk in 0..d / 16 {
                let (dq, dk) = (
                    Descriptor::kmajor_sw128(sq, kk, 64 * 128),
                    Descriptor::kmajor_sw128(sk, kk, n * 128),
                );
                lw::wgmma(
                    input,
                    &smem,
                    AOperand::Smem(dq),
                    &dk,
                    Major::K,
                    n,
                    &mut s,
                    kk > 0,
                );
            }
            let got = lw::scatter_acc(&s);
            for i in 0..64 {
                for j in 0..n {
                    let want: f64 = (0..d)
                        .map(|c| dec(input, q[i * d + c]) * dec(input, k[j * d + c]))
                        .sum();
                    assert_eq!(f64::from(got[i][j]), want, "d{d} S[{i}][{j}]");
                }
            }
        }
    }
}

/// P (registers) V (MN-major, boxes of 64 columns, LBO = the next box) as attn_wgmma's
/// O += P V equals the plain product.
#[test]
fn emulated_pv_path_is_the_matrix_product() {
    let mut rng = StdRng::seed_from_u64(11);
    let input = Input16::BF16;
    for (keys, d) in [(64usize, 128usize), (128, 64), (96, 192)] {
        let p = random_ints(&mut rng, input, 64 * keys);
        let v = random_ints(&mut rng, input, keys * d);
        let mut smem = vec![0u8; keys * d.div_ceil(64) * 128];
        lw::tma_load(&mut smem, 0, &v, keys, d, keys * 128);
        let mut o = lw::zero_acc(d);
        for kk in 0..keys / 16 {
            // Thread tid's A fragment of keys 16kk..16kk+16, through the register map.
            let frag: Vec<[u32; 4]> = (0..WARPGROUP)
                .map(|tid| {
                    std::array::from_fn(|reg| {
                        let (r0, c0) = a_cell(tid, reg, 0);
                        let (r1, c1) = a_cell(tid, reg, 1);
                        pack(p[r0 * keys + 16 * kk + c0], p[r1 * keys + 16 * kk + c1])
                    })
                })
                .collect();
            let dv = Descriptor::mnmajor_sw128(0, kk, keys * 128);
            lw::wgmma(
                input,
                &smem,
                AOperand::Regs(&frag),
                &dv,
                Major::MN,
                d,
                &mut o,
                true,
            );
        }
        let got = lw::scatter_acc(&o);
        for i in 0..64 {
            for j in 0..d {
                let want: f64 = (0..keys)
                    .map(|k| dec(input, p[i * keys + k]) * dec(input, v[k * d + j]))
                    .sum();
                assert_eq!(f64::from(got[i][j]), want, "keys {keys} d{d} O[{i}][{j}]");
            }
        }
    }
}

#[test]
fn wgmma_probe_passes_on_the_emulator() {
    for dtype in [DType::F16, DType::BF16] {
        let r = probe_wgmma::run_emulated(dtype, false);
        assert!(r.passed, "{r}");
        assert_eq!(r.lines.len(), 8, "{r}");
        assert!(r.lines.iter().all(|l| l.starts_with("[PASS]")));
        assert_eq!(r.checked, 4096 * 5 + 8192 + 16 + 4);
    }
    assert!(!probe_wgmma::run_emulated(DType::F32, false).passed);
}

#[test]
fn wgmma_probe_fault_is_caught_with_threads_and_registers() {
    for dtype in [DType::F16, DType::BF16] {
        let r = probe_wgmma::run_emulated(dtype, true);
        assert!(!r.passed);
        let failed: Vec<&String> = r.lines.iter().filter(|l| l.starts_with("[FAIL]")).collect();
        // The swizzle fault breaks both K-major reads and their descriptors; the stride
        // fault breaks P V and the V descriptors; accumulators, S and P stay right.
        assert_eq!(failed.len(), 5, "{r}");
        for ok in ["wgmma accumulators", "S = Q K^T", "P = S packed"] {
            assert!(
                r.lines
                    .iter()
                    .any(|l| l.starts_with("[PASS]") && l.contains(ok)),
                "{ok}: {r}"
            );
        }
        assert!(r.text().contains("  thread "), "{r}");
        assert!(
            r.mismatches
                .iter()
                .any(|m| m.register.ends_with(" o64") || m.register.contains(" o"))
        );
    }
}

/// A dump with two accumulator registers of one thread swapped: the checker names both.
#[test]
fn checker_names_swapped_accumulators() {
    let mut dump: WgmmaDump = probe_wgmma::emulate(Input16::F16, false);
    dump.acc[37].swap(4, 6);
    let r = probe_wgmma::check(&dump, "test");
    assert!(!r.passed);
    let lines: Vec<&str> = r
        .lines
        .iter()
        .filter(|l| l.contains("thread 37"))
        .map(|s| s.as_str())
        .collect();
    assert_eq!(lines.len(), 2, "{r}");
    assert!(
        lines[0].contains("d4") && lines[0].contains("expected D[17][10]"),
        "{}",
        lines[0]
    );
}

/// The probe kernels' defines: `tests/kernels_compile.rs` (in the library, which cannot see
/// this crate) compiles the probe with these two flags written out, so they are held here.
#[test]
fn probe_defines_are_the_two_flags_the_compile_test_writes() {
    let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
    assert_eq!(
        probe_wgmma::defines(Input16::BF16, true),
        vec![pair("IS_BF16", "1"), pair("PROBE_FAULT", "1")]
    );
    assert_eq!(
        probe_wgmma::defines(Input16::F16, false),
        vec![pair("IS_BF16", "0"), pair("PROBE_FAULT", "0")]
    );
}
