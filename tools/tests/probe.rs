//! The layout probe: emulated runs, the checker, and NVRTC compilation of the probe kernels.

use flashattn::DType;
use flashattn::cuda::nvrtc::nvrtc_present;
use flashattn::cuda::{CI_ARCHS, KernelSource, compile_cubin};
use flashattn_tools::layout::{Input16, WARP};
use flashattn_tools::probe::{self, HANDOFF_REGS, PROBE_REGS, RegisterDump};

const PASS_LINES: [&str; 12] = [
    "[PASS] A[i][j] = i: all 256 cells",
    "[PASS] B[k][j] = j: all 128 cells",
    "[PASS] D[i][j] = 16*i*j: all 128 cells",
    "[PASS] A[i][j] = i + 16*j (A from A^T, ldmatrix.trans): all 256 cells",
    "[PASS] B[k][j] = j (A from A^T, ldmatrix.trans): all 128 cells",
    "[PASS] D[i][j] = 16*i*j + 1920*j (A from A^T, ldmatrix.trans): all 128 cells",
    "[PASS] A[i][j] = i + 16*j (A stored from A^T's fragments, stmatrix.trans): all 256 cells",
    "[PASS] B[k][j] = j (A stored from A^T's fragments, stmatrix.trans): all 128 cells",
    "[PASS] D[i][j] = 16*i*j + 1920*j (A stored from A^T's fragments, stmatrix.trans): all 128 cells",
    "[PASS] S = A1*B1 = 16*i+k (two C fragments): all 256 cells",
    "[PASS] P = S packed to {dt} pairs as an A fragment: all 256 cells",
    "[PASS] D2 = P*B2 (emulator, two steps): all 128 cells",
];

#[test]
fn emulated_probe_passes_for_f16_and_bf16() {
    for dtype in [DType::F16, DType::BF16] {
        let report = probe::run_emulated(dtype, false);
        let want: Vec<String> = PASS_LINES
            .iter()
            .map(|l| l.replace("{dt}", dtype.name()))
            .collect();
        assert_eq!(report.lines, want, "{dtype}:\n{report}");
        assert!(report.passed);
        assert_eq!((report.checked, report.wrong), (2176, 0));
        assert!(report.mismatches.is_empty());
        assert_eq!(report.source, "emulator");
    }
}

#[test]
fn emulated_fault_is_caught_with_lanes_and_registers() {
    for dtype in [DType::F16, DType::BF16] {
        let report = probe::run_emulated(dtype, true);
        let text = report.text();
        assert!(!report.passed, "{text}");
        // A is untouched; B and D are wrong; the hand-off case does not use the faulty load;
        // in the transposed-A case A (loaded without .trans) and D are wrong, B is not.
        assert_eq!(report.lines[0], "[PASS] A[i][j] = i: all 256 cells");
        assert!(
            text.contains("[FAIL] A[i][j] = i + 16*j (A from A^T, ldmatrix.trans): "),
            "{text}"
        );
        assert!(
            text.contains("[PASS] B[k][j] = j (A from A^T, ldmatrix.trans): all 128 cells"),
            "{text}"
        );
        // The fragments stored without .trans land transposed: A and so D are wrong.
        assert!(
            text.contains(
                "[FAIL] A[i][j] = i + 16*j (A stored from A^T's fragments, stmatrix.trans): "
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "[FAIL] D[i][j] = 16*i*j + 1920*j (A stored from A^T's fragments, stmatrix.trans): "
            ),
            "{text}"
        );
        assert!(text.contains("[FAIL] B[k][j] = j: "), "{text}");
        assert!(
            text.contains("[FAIL] D[i][j] = 16*i*j: 120 of 128 cells wrong"),
            "{text}"
        );
        assert!(
            text.contains("[PASS] D2 = P*B2 (emulator, two steps): all 128 cells"),
            "{text}"
        );
        // Without .trans lane 13 (g=3, t=1) gets row 3 of B, columns 2 and 3, so b0 holds B[*][2]
        // where B[2][3] belongs, and every k contributes k: D[3][3] = 3 * 56.
        assert!(
            text.contains("  lane 13 b0.lo: got B[*][2] (value 2), expected B[2][3] (value 3)"),
            "{text}"
        );
        assert!(
            text.contains(
                "  lane 13 d1: got value 168 (no cell holds it), expected D[3][3] (value 144)"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "  lane 24 d0: got one of D[3][7], D[7][3] (value 336), expected D[6][0] (value 0)"
            ),
            "{text}"
        );
        assert!(
            report
                .mismatches
                .iter()
                .any(|m| m.lane == 13 && m.register == "d1")
        );
        assert_eq!(report.wrong_lanes(), (0..WARP).collect::<Vec<_>>());
        // Row 0 of D is 0 either way: lanes 0..4 keep d0, d1 (in the probe case; the
        // transposed-A case, reported after it, has a wrong A and so a wrong row 0).
        let probe_part = &text[..text.find("(A from A^T").expect("transposed-A section")];
        assert!(
            !(0..4).any(|l| ["d0", "d1"]
                .iter()
                .any(|r| probe_part.contains(&format!("  lane {l} {r}:")))),
            "{probe_part}"
        );
    }
}

#[test]
fn checker_names_lanes_with_swapped_d_registers() {
    let mut dump = probe::emulate(Input16::F16, false);
    let (d3, d13) = (dump.probe[3].d, dump.probe[13].d);
    dump.probe[3].d = d13;
    dump.probe[13].d = d3;
    let report = probe::check(&dump, "hand-corrupted");
    let text = report.text();
    assert!(!report.passed);
    assert_eq!(report.wrong_lanes(), vec![3, 13], "{text}");
    assert_eq!(report.wrong, 8);
    assert!(
        text.contains("[FAIL] D[i][j] = 16*i*j: 8 of 128 cells wrong"),
        "{text}"
    );
    // Lane 13 now holds lane 3's cells (0,6) (0,7) (8,6) (8,7) and vice versa.
    assert!(
        text.contains("  lane 13 d0: got value 0 (23 cells hold it), expected D[3][2] (value 96)"),
        "{text}"
    );
    assert!(
        text.contains(
            "  lane 13 d2: got one of D[8][6], D[12][4] (value 768), expected D[11][2] (value 352)"
        ),
        "{text}"
    );
    assert!(
        text.contains("  lane 3 d3: got D[11][3] (value 528), expected D[8][7] (value 896)"),
        "{text}"
    );
    for m in &report.mismatches {
        assert!(m.register.starts_with('d'), "{m:?}");
    }
}

#[test]
fn checker_names_cells_of_a_broken_handoff() {
    let mut dump = probe::emulate(Input16::BF16, false);
    // Swap the halves of lane 5's p0: P[1][2] and P[1][3] change places.
    let p0 = dump.handoff[5].p[0];
    dump.handoff[5].p[0] = p0.rotate_left(16);
    dump.handoff[9].s[6] = dump.handoff[9].s[7];
    let text = probe::check(&dump, "hand-corrupted").text();
    assert!(
        text.contains("  lane 5 p0.lo: got P[1][3] (value 19), expected P[1][2] (value 18)"),
        "{text}"
    );
    assert!(
        text.contains("  lane 5 p0.hi: got P[1][2] (value 18), expected P[1][3] (value 19)"),
        "{text}"
    );
    assert!(
        text.contains("  lane 9 s6: got S[10][11] (value 171), expected S[10][10] (value 170)"),
        "{text}"
    );
}

#[test]
fn dump_words_round_trip() {
    let dump = probe::emulate(Input16::F16, false);
    let probe_words: Vec<u32> = dump
        .probe
        .iter()
        .flat_map(|l| l.a.into_iter().chain(l.b).chain(l.d.map(f32::to_bits)))
        .collect();
    let handoff_words: Vec<u32> = dump
        .handoff
        .iter()
        .flat_map(|l| {
            l.s.map(f32::to_bits)
                .into_iter()
                .chain(l.p)
                .chain(l.d.map(f32::to_bits))
        })
        .collect();
    let trans_a_words: Vec<u32> = dump
        .trans_a
        .iter()
        .flat_map(|l| l.a.into_iter().chain(l.b).chain(l.d.map(f32::to_bits)))
        .collect();
    assert_eq!(probe_words.len(), WARP * PROBE_REGS);
    assert_eq!(handoff_words.len(), WARP * HANDOFF_REGS);
    let trans_store_words: Vec<u32> = dump
        .trans_store
        .expect("the emulator runs the transposed-store case")
        .iter()
        .flat_map(|l| l.a.into_iter().chain(l.b).chain(l.d.map(f32::to_bits)))
        .collect();
    let back = RegisterDump::from_words(
        Input16::F16,
        &probe_words,
        &handoff_words,
        &trans_a_words,
        Some(&trans_store_words),
    )
    .unwrap();
    assert_eq!(back, dump);
    assert!(
        RegisterDump::from_words(
            Input16::F16,
            &probe_words,
            &handoff_words,
            &trans_a_words,
            Some(&trans_store_words[1..])
        )
        .is_err()
    );
    assert!(
        RegisterDump::from_words(
            Input16::F16,
            &probe_words[1..],
            &handoff_words,
            &trans_a_words,
            None
        )
        .is_err()
    );
    assert!(
        RegisterDump::from_words(
            Input16::F16,
            &probe_words,
            &handoff_words,
            &trans_a_words[1..],
            None
        )
        .is_err()
    );
    // Unwritten (poisoned) registers fail the check.
    let poisoned = RegisterDump::from_words(
        Input16::F16,
        &vec![u32::MAX; WARP * PROBE_REGS],
        &vec![u32::MAX; WARP * HANDOFF_REGS],
        &vec![u32::MAX; WARP * PROBE_REGS],
        Some(&vec![u32::MAX; WARP * PROBE_REGS]),
    )
    .unwrap();
    let report = probe::check(&poisoned, "poison");
    assert_eq!(report.wrong, report.checked);
    assert!(
        report
            .text()
            .contains("  lane 0 d0: got value NaN (no cell holds it), expected D[0][0] (value 0)")
    );
}

#[test]
fn expected_handoff_is_the_designed_product() {
    for input in [Input16::F16, Input16::BF16] {
        let d2 = probe::expected_handoff(input);
        for (i, row) in d2.iter().enumerate() {
            for (j, &v) in row.iter().enumerate() {
                let p = |k: usize| (16 * i + k) as f32;
                assert_eq!(v, p(j) + 256.0 * p(j + 8), "{input:?} D2[{i}][{j}]");
            }
        }
    }
}

#[test]
fn f32_is_refused() {
    let report = probe::run_emulated(DType::F32, false);
    assert!(!report.passed);
    assert!(report.text().contains("f16 or bf16"));
}

/// Both kernels, normal and fault variants, f16 and bf16, compile for every CI arch with no
/// spills. Fails when NVRTC is missing and FLASHATTN_REQUIRE_NVRTC=1.
#[test]
fn probe_kernels_compile_without_spills() {
    if !nvrtc_present() {
        assert!(
            std::env::var("FLASHATTN_REQUIRE_NVRTC").as_deref() != Ok("1"),
            "NVRTC not found but FLASHATTN_REQUIRE_NVRTC=1: install nvidia-cuda-nvrtc 13.0 and add its lib folder to LD_LIBRARY_PATH"
        );
        println!("skipped: NVRTC not found");
        return;
    }
    let src = KernelSource::LayoutProbe.text();
    for arch in CI_ARCHS {
        for input in [Input16::F16, Input16::BF16] {
            for fault in [false, true] {
                let defines = probe::defines(input, fault);
                let cubin = compile_cubin(&src, KernelSource::LayoutProbe.name(), arch, &defines)
                    .unwrap_or_else(|e| panic!("{arch} {input:?} fault={fault}: {e}"));
                assert!(!cubin.image.is_empty());
                // layout_trans_store has a body on sm_90 and above only (stmatrix).
                let sm90 = arch
                    .trim_start_matches("sm_")
                    .trim_end_matches('a')
                    .parse::<u32>()
                    .unwrap_or(0)
                    >= 90;
                let store: &[&str] = if sm90 { &["layout_trans_store"] } else { &[] };
                for &f in ["layout_probe", "layout_handoff", "layout_trans_a"]
                    .iter()
                    .chain(store)
                {
                    let s = cubin
                        .stats
                        .iter()
                        .find(|s| s.function == f)
                        .unwrap_or_else(|| {
                            panic!("{arch}: no ptxas stats for {f}:\n{}", cubin.log)
                        });
                    assert_eq!(
                        (s.spill_stores, s.spill_loads),
                        (0, 0),
                        "{arch} {input:?} fault={fault} {f}: {s:?}"
                    );
                    assert!(s.registers > 0 && s.shared > 0, "{arch} {f}: {s:?}");
                }
            }
        }
    }
}
