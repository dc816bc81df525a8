//! NVRTC compiles every kernel specialisation we ship to CUBIN for every arch in `CI_ARCHS`,
//! with zero spills, and checks the shared memory of each tile against the arch's per-block
//! limit. Runs on machines without a GPU (only NVRTC is needed).
//!
//! Without NVRTC the test prints "skipped: NVRTC not found" and passes, unless
//! `FLASHATTN_REQUIRE_NVRTC=1` (CI), where it fails.

use flashattn::DType;
use flashattn::cuda::decode::{CacheRows, DecodeTile};
use flashattn::cuda::nvrtc::nvrtc_present;
use flashattn::cuda::simt::SimtTile;
use flashattn::cuda::{
    CI_ARCHS, KernelSource, MmaTile, PtxasStats, WgmmaTile, compile_cubin, naive,
};
use rayon::prelude::*;
use std::time::Instant;

// 8, 24, 56, 120: rows padded with a zero chunk on the one-column (FAST_LOADS) K/V path.
const HEAD_DIMS: [usize; 11] = [8, 24, 32, 40, 56, 64, 80, 96, 120, 128, 256];
const DTYPES: [DType; 2] = [DType::F16, DType::BF16];

/// One specialisation to compile.
struct Job {
    source: KernelSource,
    arch: &'static str,
    d: usize,
    dtype: DType,
    causal: bool,
    defines: Vec<(String, String)>,
    /// Entry points that must be in the module.
    functions: &'static [&'static str],
    /// Dynamic shared memory the launcher will ask for, and a description of the tile.
    smem: usize,
    tile: String,
    /// Registers of each warpgroup role after `setmaxnreg` (wgmma), for the report.
    roles: Option<(u32, u32)>,
}

/// The attn_wgmma job of a tile (sm_90a): `defines` are the tile's, with the problem's score
/// modifiers where it has them; `label` follows the tile's Br x Bc.
fn wgmma_job(
    t: &WgmmaTile,
    d: usize,
    dtype: DType,
    causal: bool,
    defines: Vec<(String, String)>,
    label: &str,
) -> Job {
    Job {
        source: KernelSource::AttnWgmma,
        arch: "sm_90a",
        d,
        dtype,
        causal,
        defines,
        functions: &["attn_wgmma"],
        smem: t.smem_bytes(),
        tile: format!("Br{}xBc{} {label}", t.br(), t.bc),
        roles: Some((t.registers().1, t.registers().0)),
    }
}

/// (major, minor) from "sm_XY" / "sm_XYZ": the last digit is the minor version.
fn parse_cc(arch: &str) -> (i32, i32) {
    let digits = arch.trim_start_matches("sm_").trim_end_matches('a');
    let (major, minor) = digits.split_at(digits.len() - 1);
    (
        major.parse().expect("arch major"),
        minor.parse().expect("arch minor"),
    )
}

/// Shared memory a block may opt in to, per arch (bytes).
fn smem_limit(arch: &str) -> usize {
    match parse_cc(arch) {
        (8, 0) => 163 * 1024,
        (9, 0) => 227 * 1024,
        _ => 99 * 1024, // sm_86, sm_89, sm_120
    }
}

/// A backward job's problem: 256 tokens, 2 heads, no mask, causal, or a (40, 8) window.
fn bwd_problem(d: usize, causal: bool, window: bool) -> flashattn::AttnProblem {
    let shape = flashattn::AttnShape::new(1, 256, 2, d);
    let mut p = flashattn::AttnProblem::new(shape).unwrap();
    if causal {
        p = p.with_mask(flashattn::Mask::Causal);
    }
    if window {
        p = p
            .with_scores(flashattn::scores::ScoreMods {
                window: flashattn::scores::Window::from_fa(40, 8).unwrap(),
                ..Default::default()
            })
            .unwrap();
    }
    p
}

/// `p` with softcap 30 and/or ALiBi (geometric slopes of its heads) added to its modifiers.
fn with_softcap_alibi(
    p: flashattn::AttnProblem,
    softcap: bool,
    alibi: bool,
) -> flashattn::AttnProblem {
    let mods = flashattn::scores::ScoreMods {
        softcap: softcap.then_some(30.0),
        alibi: alibi.then(|| flashattn::scores::Alibi::geometric(p.shape.heads_q)),
        ..p.scores.clone()
    };
    p.with_scores(mods).unwrap()
}

fn jobs() -> Vec<Job> {
    let mut out = Vec::new();
    for &arch in CI_ARCHS.iter() {
        let cc = parse_cc(arch);
        for d in HEAD_DIMS {
            for dtype in DTYPES {
                for causal in [false, true] {
                    out.push(Job {
                        source: KernelSource::AttnNaive,
                        arch,
                        d,
                        dtype,
                        causal,
                        defines: naive::defines(dtype, d, causal),
                        functions: &["attn_naive_scores", "attn_naive_softmax", "attn_naive_pv"],
                        smem: 0,
                        tile: "-".into(),
                        roles: None,
                    });
                    let st = SimtTile::for_head_dim(d);
                    out.push(Job {
                        source: KernelSource::AttnSimt,
                        arch,
                        d,
                        dtype,
                        causal,
                        defines: st.defines(dtype, d, causal),
                        functions: &["attn_simt"],
                        smem: st.smem_bytes(d),
                        tile: format!("Br{}xBc{}", st.br(), st.bc()),
                        roles: None,
                    });
                    let mt = MmaTile::default_for(cc, d);
                    out.push(Job {
                        source: KernelSource::AttnMma,
                        arch,
                        d,
                        dtype,
                        causal,
                        defines: mt.defines(dtype, d, causal),
                        functions: &["attn_mma"],
                        smem: mt.smem_bytes(d),
                        tile: mt.to_string(),
                        roles: None,
                    });
                }
            }
        }
    }
    // The backward pass (attn_bwd and its two small kernels), every arch, the head dims it
    // serves at the edges of its register budget (256: each of its two channel passes, where
    // the tile's shared memory fits), no mask, causal and a sliding window; softcap (no mask),
    // ALiBi (causal) and both with a causal window (attn_bwd alone takes them).
    for &arch in CI_ARCHS.iter() {
        for d in [8, 40, 56, 64, 96, 128, 256] {
            for dtype in DTYPES {
                for (causal, window, deterministic, softcap, alibi) in [
                    (false, false, false, false, false),
                    (true, false, false, false, false),
                    (false, true, false, false, false),
                    (false, true, true, false, false),
                    (false, false, false, true, false),
                    (true, false, false, false, true),
                    (true, true, false, true, true),
                ] {
                    if deterministic && dtype != DType::F16 {
                        continue;
                    }
                    let opts = flashattn::cuda::backward::BackwardOptions {
                        deterministic,
                        ..Default::default()
                    };
                    let p = with_softcap_alibi(bwd_problem(d, causal, window), softcap, alibi);
                    let tile = flashattn::cuda::backward::BwdTile::for_problem(
                        &p,
                        dtype,
                        parse_cc(arch),
                        smem_limit(arch),
                    );
                    if tile.smem_bytes(d) > smem_limit(arch) {
                        continue; // refused with a typed error there (BwdTile::for_call)
                    }
                    for ch0 in flashattn::cuda::backward::BwdTile::passes(d) {
                        out.push(Job {
                            source: KernelSource::AttnBwd,
                            arch,
                            d,
                            dtype,
                            causal,
                            defines: tile.defines(dtype, &p, opts, ch0),
                            functions: &["attn_bwd", "attn_bwd_dsum", "attn_bwd_dq"],
                            smem: tile.smem_bytes(d),
                            tile: format!(
                                "bwd {}x{}x{}{}{}{}{}{}",
                                tile.nwarps,
                                tile.keys_per_warp,
                                tile.br,
                                if ch0 > 0 { " ch128" } else { "" },
                                if window { " window" } else { "" },
                                if deterministic { " det" } else { "" },
                                if softcap { " softcap" } else { "" },
                                if alibi { " alibi" } else { "" }
                            ),
                            roles: None,
                        });
                    }
                }
            }
        }
    }
    // The backward of packed variable-length batches (attn_bwd with IS_VARLEN), every arch,
    // with the tile its launcher takes (within the limit less the sequence's parameters in
    // static shared memory, src/cuda/bwd/varlen.rs): no mask, causal, a window in the
    // deterministic mode, softcap, ALiBi (causal), at the head dims of the dense jobs.
    for &arch in CI_ARCHS.iter() {
        use flashattn::cuda::bwd::varlen::STATIC_SMEM;
        for d in [8, 40, 56, 64, 96, 128, 256] {
            for dtype in DTYPES {
                for (causal, window, deterministic, softcap, alibi) in [
                    (false, false, false, false, false),
                    (true, false, false, false, false),
                    (false, true, true, false, false),
                    (false, false, false, true, false),
                    (true, false, false, false, true),
                ] {
                    let opts = flashattn::cuda::backward::BackwardOptions {
                        deterministic,
                        ..Default::default()
                    };
                    let p = with_softcap_alibi(bwd_problem(d, causal, window), softcap, alibi);
                    let limit = smem_limit(arch) - STATIC_SMEM;
                    let tile = flashattn::cuda::backward::BwdTile::for_problem(
                        &p,
                        dtype,
                        parse_cc(arch),
                        limit,
                    );
                    if tile.smem_bytes(d) > limit {
                        continue; // refused with a typed error there (BwdTile::for_call)
                    }
                    for ch0 in flashattn::cuda::backward::BwdTile::passes(d) {
                        let mut defines = tile.defines(dtype, &p, opts, ch0);
                        defines.push(("IS_VARLEN".into(), "1".into()));
                        out.push(Job {
                            source: KernelSource::AttnBwd,
                            arch,
                            d,
                            dtype,
                            causal,
                            defines,
                            functions: &["attn_bwd", "attn_bwd_dsum", "attn_bwd_dq"],
                            smem: tile.smem_bytes(d) + STATIC_SMEM,
                            tile: format!(
                                "bwd {}x{}x{}{}{}{}{}{} varlen",
                                tile.nwarps,
                                tile.keys_per_warp,
                                tile.br,
                                if ch0 > 0 { " ch128" } else { "" },
                                if window { " window" } else { "" },
                                if deterministic { " det" } else { "" },
                                if softcap { " softcap" } else { "" },
                                if alibi { " alibi" } else { "" }
                            ),
                            roles: None,
                        });
                    }
                }
            }
        }
    }
    // The Hopper backward: sm_90a only, both padded head dims (64, 128) and 96, each mask,
    // the deterministic mode, one block per tile and persistent.
    for d in [64, 96, 128] {
        for dtype in DTYPES {
            for (causal, window) in [(false, false), (true, false), (false, true)] {
                for deterministic in [false, true] {
                    for persistent in [false, true] {
                        let p = bwd_problem(d, causal, window);
                        use flashattn::cuda::backward_wgmma as bw;
                        out.push(Job {
                            source: KernelSource::AttnBwdWgmma,
                            arch: "sm_90a",
                            d,
                            dtype,
                            causal,
                            defines: bw::defines(dtype, &p, deterministic, persistent),
                            functions: &["attn_bwd_wgmma", "attn_bwd_dsum", "attn_bwd_dq_tiled"],
                            smem: bw::smem_bytes(d, persistent),
                            tile: format!(
                                "bwd-wg{}{}{}",
                                if window { " window" } else { "" },
                                if deterministic { " det" } else { "" },
                                if persistent { " persistent" } else { "" }
                            ),
                            roles: Some((40, 232)),
                        });
                    }
                }
            }
        }
    }
    // The Hopper backward with the score modifiers: softcap, ALiBi and both, no mask and
    // causal, both padded head dims, the default grid of each (persistent_default).
    for d in [64, 128] {
        for dtype in DTYPES {
            for causal in [false, true] {
                for (softcap, alibi) in [(true, false), (false, true), (true, true)] {
                    let p = with_softcap_alibi(bwd_problem(d, causal, false), softcap, alibi);
                    use flashattn::cuda::backward_wgmma as bw;
                    let persistent = flashattn::cuda::backward::persistent_default(&p, false);
                    out.push(Job {
                        source: KernelSource::AttnBwdWgmma,
                        arch: "sm_90a",
                        d,
                        dtype,
                        causal,
                        defines: bw::defines(dtype, &p, false, persistent),
                        functions: &["attn_bwd_wgmma", "attn_bwd_dsum", "attn_bwd_dq_tiled"],
                        smem: bw::smem_bytes(d, persistent),
                        tile: format!(
                            "bwd-wg{}{}",
                            if softcap { " softcap" } else { "" },
                            if alibi { " alibi" } else { "" }
                        ),
                        roles: Some((40, 232)),
                    });
                }
            }
        }
    }
    // Packed variable-length batches (IS_VARLEN) on attn_mma, every arch, with the tile the
    // varlen launcher takes (at most two blocks per SM).
    for &arch in CI_ARCHS.iter() {
        let cc = parse_cc(arch);
        for d in [40, 64, 128, 256] {
            for causal in [false, true] {
                let mt = MmaTile::default_for(cc, d).with_headroom(d, false);
                let mut defines = mt.defines(DType::BF16, d, causal);
                defines.push(("IS_VARLEN".into(), "1".into()));
                out.push(Job {
                    source: KernelSource::AttnMma,
                    arch,
                    d,
                    dtype: DType::BF16,
                    causal,
                    defines,
                    functions: &["attn_mma"],
                    smem: mt.smem_bytes(d),
                    tile: format!("{mt} varlen"),
                    roles: None,
                });
            }
        }
    }
    // Decoding against a KV cache: attn_decode with the stages its launcher picks for the
    // arch (f16 contiguous and bf16 causal paged; every modifier on sm_80 and sm_90; the
    // KV-cache features: rotary, cache_batch_idx and cache_leftpad on a contiguous cache,
    // rotary on a paged one), the split-KV combine, the in-place append (plain and rotary)
    // and the read-bandwidth pass. d256 needs more shared memory than sm_86/89/120 allow per
    // block: the launcher refuses it there.
    for &arch in CI_ARCHS.iter() {
        let limit = smem_limit(arch);
        for d in [40, 64, 128, 256] {
            // the launcher's tile for this arch: with the copy engine on sm_90 (d % 64 == 0)
            let tile = DecodeTile::for_head_dim(d, limit).with_bulk_where_it_fits(
                parse_cc(arch),
                d,
                CacheRows::Contiguous { seqlen_cache: 1 },
                limit,
            );
            if tile.smem_bytes(d) > limit {
                continue;
            }
            let mods = matches!(parse_cc(arch), (8, 0) | (9, 0)) && d != 40;
            // (dtype, causal, paged, every modifier, the KV-cache features)
            for (dtype, causal, paged, all_mods, features) in [
                (DType::F16, false, false, false, &[][..]),
                (DType::BF16, true, true, false, &[][..]),
                (DType::BF16, true, true, true, &[][..]),
                (
                    DType::F16,
                    true,
                    false,
                    false,
                    &[
                        "ROTARY",
                        "ROTARY_INTERLEAVED",
                        "HAS_BATCH_IDX",
                        "HAS_LEFTPAD",
                    ][..],
                ),
                (DType::BF16, false, true, false, &["ROTARY"][..]),
            ] {
                if all_mods && !mods {
                    continue;
                }
                let mut defines = tile.defines(dtype, d, causal, paged);
                if all_mods {
                    for m in ["IS_LOCAL", "HAS_SOFTCAP", "HAS_ALIBI"] {
                        defines.push((m.into(), "1".into()));
                    }
                }
                defines.extend(features.iter().map(|f| (f.to_string(), "1".to_string())));
                out.push(Job {
                    source: KernelSource::AttnDecode,
                    arch,
                    d,
                    dtype,
                    causal,
                    defines,
                    functions: &["attn_decode"],
                    smem: tile.smem_bytes(d),
                    tile: format!(
                        "decode {} stages{}{}{}{}",
                        tile.stages,
                        if tile.bulk { " copy-engine" } else { "" },
                        if paged { " paged" } else { "" },
                        if all_mods { " mods" } else { "" },
                        if features.is_empty() {
                            String::new()
                        } else {
                            format!(" {}", features.join("+").to_lowercase())
                        }
                    ),
                    roles: None,
                });
            }
        }
        for (d, dtype) in [(40, DType::F16), (128, DType::BF16), (256, DType::F16)] {
            out.push(Job {
                source: KernelSource::AttnCombine,
                arch,
                d,
                dtype,
                causal: false,
                defines: vec![
                    ("HEAD_DIM".into(), d.to_string()),
                    ("IS_BF16".into(), u8::from(dtype == DType::BF16).to_string()),
                ],
                functions: &["attn_combine"],
                smem: 0,
                tile: "combine".into(),
                roles: None,
            });
        }
        // (head_dim, dtype, paged, the features)
        for (d, dtype, paged, features) in [
            (40, DType::F16, false, &[][..]),
            (256, DType::F16, true, &[][..]),
            (
                64,
                DType::F16,
                false,
                &[
                    "ROTARY",
                    "ROTARY_INTERLEAVED",
                    "HAS_BATCH_IDX",
                    "HAS_LEFTPAD",
                ][..],
            ),
            (128, DType::BF16, true, &["ROTARY"][..]),
        ] {
            let mut defines = vec![
                ("HEAD_DIM".to_string(), d.to_string()),
                ("IS_PAGED".to_string(), u8::from(paged).to_string()),
            ];
            defines.extend(features.iter().map(|f| (f.to_string(), "1".to_string())));
            if features.contains(&"ROTARY") {
                defines.push(("IS_BF16".into(), u8::from(dtype == DType::BF16).to_string()));
            }
            out.push(Job {
                source: KernelSource::KvAppend,
                arch,
                d,
                dtype,
                causal: false,
                defines,
                functions: &["kv_append"],
                smem: 0,
                tile: format!(
                    "append{}{}",
                    if paged { " paged" } else { "" },
                    if features.is_empty() {
                        String::new()
                    } else {
                        format!(" {}", features.join("+").to_lowercase())
                    }
                ),
                roles: None,
            });
        }
        out.push(Job {
            source: KernelSource::ReadPass,
            arch,
            d: 0,
            dtype: DType::F16,
            causal: false,
            defines: Vec::new(),
            functions: &["read_pass"],
            smem: 0,
            tile: "read pass".into(),
            roles: None,
        });
    }
    // The head_dim padding copies (head dims that are not a multiple of 8), every arch.
    for &arch in CI_ARCHS.iter() {
        out.push(Job {
            source: KernelSource::PadRows,
            arch,
            d: 0,
            dtype: DType::F16,
            causal: false,
            defines: Vec::new(),
            functions: &["pad_rows", "unpad_rows"],
            smem: 0,
            tile: "pad".into(),
            roles: None,
        });
    }
    // The Hopper kernel: sm_90a only, every padded head_dim it is specialised for.
    // Every default tile (one per padded head_dim, for every seqlen_k and mask).
    for d in [64, 96, 128, 192, 256] {
        for dtype in DTYPES {
            for causal in [false, true] {
                let t = WgmmaTile::default_for(d)
                    .expect("served head_dim")
                    .for_dtype(dtype);
                let label = format!(
                    "{}st{}",
                    t.stages,
                    if t.row_sums_in_pv() { " vsum" } else { "" }
                );
                out.push(wgmma_job(
                    &t,
                    d,
                    dtype,
                    causal,
                    t.defines(dtype, causal),
                    &label,
                ));
            }
        }
    }
    // Three consumers at d128 with Bc 64 (`64,2,wg3`, a tile knob: run 104 measured it 4-17 %
    // slower than the default), so that the override the knob allows stays free of spills.
    for causal in [false, true] {
        let t = WgmmaTile::default_for(128)
            .expect("served head_dim")
            .with_spec("64,2,wg3,nopp")
            .expect("valid spec");
        let defines = t.defines(DType::F16, causal);
        out.push(wgmma_job(&t, 128, DType::F16, causal, defines, "wg3"));
    }
    // The timeline build (`trace`, a diagnostics knob): d64 causal (three consumers, the
    // producer at 32 registers) and d256 causal, so that it keeps compiling without spills.
    for d in [64, 256] {
        let t = WgmmaTile {
            trace: true,
            ..WgmmaTile::default_for(d).expect("served head_dim")
        };
        let defines = t.defines(DType::F16, true);
        out.push(wgmma_job(&t, d, DType::F16, true, defines, "trace"));
    }
    // The score modifiers (window, softcap, ALiBi), one at a time, window with softcap, and all three, on
    // the kernels that claim them, for sm_90 (mma) and sm_90a (wgmma), f16: the launchers'
    // choices (mma at most two blocks per SM and Bc 32 with ALiBi above d64, wgmma two
    // consumers with softcap or ALiBi).
    for (d, causal) in [
        (64, false),
        (64, true),
        (128, false),
        (128, true),
        (256, true),
    ] {
        for (name, mods) in score_mod_variants() {
            let shape = flashattn::AttnShape::new(1, 4096, 2, d);
            let mask = if causal {
                flashattn::Mask::Causal
            } else {
                flashattn::Mask::None
            };
            let p = flashattn::AttnProblem::new(shape)
                .unwrap()
                .with_mask(mask)
                .with_scores(mods)
                .unwrap();
            let mt = MmaTile::default_for((9, 0), d);
            let mt = if p.scores.scores_unmodified() {
                mt
            } else {
                mt.with_headroom(d, p.scores.alibi.is_some())
            };
            let mut defines = mt.defines(DType::F16, d, causal);
            defines.extend(flashattn::cuda::score_defines(&p));
            defines.extend(flashattn::cuda::sink_defines(&p));
            out.push(Job {
                source: KernelSource::AttnMma,
                arch: "sm_90",
                d,
                dtype: DType::F16,
                causal,
                defines,
                functions: &["attn_mma"],
                smem: mt.smem_bytes(d),
                tile: format!("{mt} {name}"),
                roles: None,
            });
            let t = flashattn::cuda::wgmma::tile_for(&p, DType::F16)
                .unwrap()
                .unwrap();
            let defines = t.problem_defines(DType::F16, &p);
            out.push(wgmma_job(&t, d, DType::F16, causal, defines, name));
        }
    }
    let flag = |b: bool| if b { "1" } else { "0" }.to_string();
    for dtype in DTYPES {
        for fault in [false, true] {
            out.push(Job {
                source: KernelSource::WgmmaProbe,
                arch: "sm_90a",
                d: 64,
                dtype,
                causal: fault,
                // The probe's host side is in flashattn-tools (`probe_wgmma::defines`, which
                // tools/tests/layout_wgmma.rs holds to these two flags).
                defines: vec![
                    ("IS_BF16".to_string(), flag(dtype == DType::BF16)),
                    ("PROBE_FAULT".to_string(), flag(fault)),
                ],
                functions: &[
                    "wg_probe_acc",
                    "wg_probe_kmajor",
                    "wg_probe_pv",
                    "wg_probe_fp8_qk",
                    "wg_probe_fp8_vt",
                    "wg_probe_fp8_pv",
                ],
                smem: 42 * 1024,
                tile: if fault { "probe, fault" } else { "probe" }.into(),
                roles: None,
            });
        }
    }
    // The FP8 forward (e4m3, sm_90a): every head_dim and mask it takes, with its pre-pass.
    for d in flashattn::cuda::fwd::wgmma_fp8::HEAD_DIMS {
        for causal in [false, true] {
            let mask = if causal {
                flashattn::Mask::Causal
            } else {
                flashattn::Mask::None
            };
            let p = flashattn::AttnProblem::new(flashattn::AttnShape::new(1, 4096, 2, d))
                .unwrap()
                .with_mask(mask);
            out.push(Job {
                source: KernelSource::AttnWgmmaFp8,
                arch: "sm_90a",
                d,
                dtype: DType::BF16,
                causal,
                defines: flashattn::cuda::fwd::wgmma_fp8::defines(&p),
                functions: &["attn_wgmma_fp8", "fp8_v_transpose"],
                smem: flashattn::cuda::fwd::wgmma_fp8::smem_bytes(d),
                tile: "fp8 e4m3 Br128xBc128".into(),
                roles: Some((40, 232)),
            });
        }
    }
    out.extend(sink_jobs());
    out
}

/// The modifier sets compiled: each alone, a window with softcap, and all three.
fn score_mod_variants() -> Vec<(&'static str, flashattn::scores::ScoreMods)> {
    use flashattn::scores::{Alibi, ScoreMods, Window};
    let window = Window::from_fa(256, 0).unwrap();
    vec![
        (
            "window",
            ScoreMods {
                window,
                ..ScoreMods::default()
            },
        ),
        (
            "softcap",
            ScoreMods {
                softcap: Some(30.0),
                ..ScoreMods::default()
            },
        ),
        (
            "alibi",
            ScoreMods {
                alibi: Some(Alibi::geometric(2)),
                ..ScoreMods::default()
            },
        ),
        (
            "window+softcap",
            ScoreMods {
                window,
                softcap: Some(30.0),
                ..ScoreMods::default()
            },
        ),
        (
            "window+softcap+alibi",
            ScoreMods {
                window,
                softcap: Some(30.0),
                alibi: Some(Alibi::geometric(2)),
                sink: None,
            },
        ),
        (
            "window+softcap+alibi+sink",
            ScoreMods {
                window,
                softcap: Some(30.0),
                alibi: Some(Alibi::geometric(2)),
                sink: Some(vec![0.5, -1.0]),
            },
        ),
    ]
}

/// A problem of `d` with a learnable sink (two heads), causal or not.
fn sink_problem(d: usize, causal: bool) -> flashattn::AttnProblem {
    let mask = if causal {
        flashattn::Mask::Causal
    } else {
        flashattn::Mask::None
    };
    flashattn::AttnProblem::new(flashattn::AttnShape::new(1, 4096, 2, d))
        .unwrap()
        .with_mask(mask)
        .with_scores(flashattn::scores::ScoreMods {
            sink: Some(vec![0.5, -1.0]),
            ..Default::default()
        })
        .unwrap()
}

/// The learnable sink's specialisations (HAS_SINK), with the tiles the launchers pick for a
/// problem with a sink alone (the plain problem's: the sink is epilogue work): attn_mma on
/// every arch, attn_wgmma's default tiles, the packed (varlen) attn_mma, attn_decode and
/// attn_combine, and the gradient's sink_grad.
fn sink_jobs() -> Vec<Job> {
    let mut out = Vec::new();
    for &arch in CI_ARCHS.iter() {
        let cc = parse_cc(arch);
        for (d, dtype) in [
            (40, DType::F16),
            (64, DType::F16),
            (64, DType::BF16),
            (128, DType::BF16),
            (256, DType::F16),
        ] {
            for causal in [false, true] {
                let p = sink_problem(d, causal);
                let mt = MmaTile::default_for(cc, d);
                let mut defines = mt.defines(dtype, d, causal);
                defines.extend(flashattn::cuda::sink_defines(&p));
                out.push(Job {
                    source: KernelSource::AttnMma,
                    arch,
                    d,
                    dtype,
                    causal,
                    defines,
                    functions: &["attn_mma"],
                    smem: mt.smem_bytes(d),
                    tile: format!("{mt} sink"),
                    roles: None,
                });
            }
        }
        // A packed batch with a sink, with the varlen launcher's tile.
        for d in [64, 128] {
            let mt = MmaTile::default_for(cc, d).with_headroom(d, false);
            let mut defines = mt.defines(DType::BF16, d, true);
            defines.push(("IS_VARLEN".into(), "1".into()));
            defines.push(("HAS_SINK".into(), "1".into()));
            out.push(Job {
                source: KernelSource::AttnMma,
                arch,
                d,
                dtype: DType::BF16,
                causal: true,
                defines,
                functions: &["attn_mma"],
                smem: mt.smem_bytes(d),
                tile: format!("{mt} varlen sink"),
                roles: None,
            });
        }
        // Decoding: the launcher's tile, bf16 causal paged with the sink (and every modifier
        // where the arch compiles them: sm_80, sm_90, and there every KV-cache feature too:
        // the most registers a sink's decode asks for), and the combine with it.
        let limit = smem_limit(arch);
        for d in [64, 128, 256] {
            let tile = DecodeTile::for_head_dim(d, limit).with_bulk_where_it_fits(
                cc,
                d,
                CacheRows::Contiguous { seqlen_cache: 1 },
                limit,
            );
            if tile.smem_bytes(d) > limit {
                continue;
            }
            let mut defines = tile.defines(DType::BF16, d, true, true);
            defines.push(("HAS_SINK".into(), "1".into()));
            let all = matches!(cc, (8, 0) | (9, 0));
            if all {
                for m in [
                    "IS_LOCAL",
                    "HAS_SOFTCAP",
                    "HAS_ALIBI",
                    "ROTARY",
                    "ROTARY_INTERLEAVED",
                    "HAS_BATCH_IDX",
                    "HAS_LEFTPAD",
                ] {
                    defines.push((m.into(), "1".into()));
                }
            }
            out.push(Job {
                source: KernelSource::AttnDecode,
                arch,
                d,
                dtype: DType::BF16,
                causal: true,
                defines,
                functions: &["attn_decode"],
                smem: tile.smem_bytes(d),
                tile: format!(
                    "decode {} stages{} paged sink{}",
                    tile.stages,
                    if tile.bulk { " copy-engine" } else { "" },
                    if all {
                        " mods+rotary+batch_idx+leftpad"
                    } else {
                        ""
                    }
                ),
                roles: None,
            });
        }
        out.push(Job {
            source: KernelSource::AttnCombine,
            arch,
            d: 128,
            dtype: DType::F16,
            causal: false,
            defines: vec![
                ("HEAD_DIM".into(), "128".into()),
                ("IS_BF16".into(), "0".into()),
                ("HAS_SINK".into(), "1".into()),
            ],
            functions: &["attn_combine"],
            smem: 0,
            tile: "combine sink".into(),
            roles: None,
        });
        out.push(Job {
            source: KernelSource::SinkGrad,
            arch,
            d: 0,
            dtype: DType::F16,
            causal: false,
            defines: Vec::new(),
            functions: &["sink_grad"],
            smem: 0,
            tile: "sink grad".into(),
            roles: None,
        });
    }
    for d in [64, 96, 128, 192, 256] {
        for dtype in DTYPES {
            for causal in [false, true] {
                let p = sink_problem(d, causal);
                let t = flashattn::cuda::wgmma::tile_for(&p, dtype)
                    .unwrap()
                    .unwrap();
                let defines = t.problem_defines(dtype, &p);
                out.push(wgmma_job(&t, d, dtype, causal, defines, "sink"));
            }
        }
    }
    out
}

/// What one compile gave: per-function stats, or the error.
struct Outcome {
    stats: Vec<PtxasStats>,
    /// ptxas warnings (setmaxnreg ignored, wgmma serialised, ...): failures for our kernels.
    warnings: Vec<String>,
    /// The CUBIN, kept only when `FLASHATTN_CUBIN_DIR` asks for the images.
    image: Option<Vec<u8>>,
    error: Option<String>,
    seconds: f64,
}

#[test]
fn every_kernel_compiles_for_every_arch_without_spills() {
    if !nvrtc_present() {
        if std::env::var("FLASHATTN_REQUIRE_NVRTC").as_deref() == Ok("1") {
            panic!(
                "NVRTC not found but FLASHATTN_REQUIRE_NVRTC=1: install nvidia-cuda-nvrtc 13.0.x and add its lib folder to LD_LIBRARY_PATH"
            );
        }
        println!("skipped: NVRTC not found");
        return;
    }
    // FLASHATTN_COMPILE_ONLY=attn_bwd_wgmma (a substring of the source's name, or of the
    // tile's description: `sink`) compiles a part only: a kernel's edit-compile loop, not CI's.
    let only = std::env::var("FLASHATTN_COMPILE_ONLY").ok();
    let jobs: Vec<Job> = jobs()
        .into_iter()
        .filter(|j| {
            only.as_deref()
                .is_none_or(|o| j.source.name().contains(o) || j.tile.contains(o))
        })
        .collect();
    // The sources are expanded once; each job compiles its own program.
    let texts: Vec<(KernelSource, String)> = [
        KernelSource::AttnNaive,
        KernelSource::AttnSimt,
        KernelSource::AttnMma,
        KernelSource::AttnWgmma,
        KernelSource::WgmmaProbe,
        KernelSource::AttnWgmmaFp8,
        KernelSource::PadRows,
        KernelSource::AttnDecode,
        KernelSource::AttnCombine,
        KernelSource::KvAppend,
        KernelSource::ReadPass,
        KernelSource::AttnBwd,
        KernelSource::AttnBwdWgmma,
        KernelSource::SinkGrad,
    ]
    .into_iter()
    .map(|s| (s, s.text()))
    .collect();
    let text = |s: KernelSource| {
        texts
            .iter()
            .find(|(k, _)| *k == s)
            .map(|(_, t)| t.as_str())
            .expect("source")
    };

    // With FLASHATTN_CUBIN_DIR set, every CUBIN is written there under a name built from the
    // job (scripts/sass-compare.sh diffs two such folders' SASS: a refactor's proof that the
    // kernels did not change).
    let cubin_dir = std::env::var_os("FLASHATTN_CUBIN_DIR").map(std::path::PathBuf::from);
    let t0 = Instant::now();
    let outcomes: Vec<Outcome> = jobs
        .par_iter()
        .map(|j| {
            let t = Instant::now();
            match compile_cubin(text(j.source), j.source.name(), j.arch, &j.defines) {
                Ok(c) => Outcome {
                    stats: c.stats,
                    warnings: c
                        .log
                        .lines()
                        .filter(|l| {
                            // C7514/C7515 (wgmma serialised: "Potential Performance Loss")
                            // and C7517 (a wait injected) are "info" lines, not warnings, but
                            // cost a quarter of attn_wgmma's speed when they appear.
                            l.contains("ptxas warning")
                                || l.contains("C7508")
                                || l.contains("C7510")
                                || l.contains("Potential Performance Loss")
                                || l.contains("C7517")
                        })
                        .map(str::to_string)
                        .collect(),
                    error: None,
                    seconds: t.elapsed().as_secs_f64(),
                    image: cubin_dir.as_ref().map(|_| c.image),
                },
                Err(e) => Outcome {
                    stats: Vec::new(),
                    warnings: Vec::new(),
                    error: Some(e.to_string()),
                    seconds: t.elapsed().as_secs_f64(),
                    image: None,
                },
            }
        })
        .collect();
    let wall = t0.elapsed().as_secs_f64();
    if let Some(dir) = &cubin_dir {
        write_cubins(dir, &jobs, &outcomes);
    }

    let mut failures = Vec::new();
    println!(
        "{:<7} {:<7} {:>4} {:<5} {:<7} {:>16} {:>7} {:>7} {:<26} {:>6}",
        "kernel", "arch", "d", "dtype", "mask", "registers", "spills", "smem", "tile", "secs"
    );
    for (j, o) in jobs.iter().zip(&outcomes) {
        let what = format!(
            "{} {} d={} {} {}",
            j.source.name(),
            j.arch,
            j.d,
            j.dtype.name(),
            if j.causal { "causal" } else { "none" }
        );
        if let Some(e) = &o.error {
            failures.push(format!(
                "{what}: compile failed: {}",
                e.chars().take(2000).collect::<String>()
            ));
            continue;
        }
        let mut regs = Vec::new();
        let mut spills = 0u32;
        for f in j.functions {
            match o.stats.iter().find(|s| s.function == *f) {
                Some(s) => {
                    regs.push(s.registers.to_string());
                    spills += s.spill_stores + s.spill_loads;
                    if s.spill_stores != 0 || s.spill_loads != 0 {
                        failures.push(format!(
                            "{what}: {f} spills ({} bytes stores, {} bytes loads, {} registers, tile {})",
                            s.spill_stores, s.spill_loads, s.registers, j.tile
                        ));
                    }
                }
                None => failures.push(format!("{what}: no ptxas statistics for entry {f}")),
            }
        }
        for w in &o.warnings {
            failures.push(format!("{what}: {w}"));
        }
        let limit = smem_limit(j.arch);
        if j.smem > limit {
            failures.push(format!(
                "{what}: tile {} needs {} bytes of shared memory, {} allows {limit}",
                j.tile, j.smem, j.arch
            ));
        }
        println!(
            "{:<7} {:<7} {:>4} {:<5} {:<7} {:>16} {:>7} {:>7} {:<26} {:>6.2}",
            j.source.name().trim_start_matches("attn_"),
            j.arch,
            j.d,
            j.dtype.name(),
            if j.causal { "causal" } else { "none" },
            match j.roles {
                // registers at launch, then what setmaxnreg gives each warpgroup role
                Some((producer, consumer)) =>
                    format!("{} (p{producer}/c{consumer})", regs.join("/")),
                None => regs.join("/"),
            },
            spills,
            j.smem,
            j.tile,
            o.seconds
        );
    }
    println!(
        "{} compiles in {wall:.1} s on {} threads",
        jobs.len(),
        rayon::current_num_threads()
    );
    assert!(
        failures.is_empty(),
        "{} failure(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Writes each job's CUBIN as `<kernel>.<arch>.d<d>.<dtype>.<mask>.<tile>[.<n>].cubin`; `n`
/// counts jobs that share the rest of the name, in the order `jobs()` lists them.
fn write_cubins(dir: &std::path::Path, jobs: &[Job], outcomes: &[Outcome]) {
    std::fs::create_dir_all(dir).expect("create FLASHATTN_CUBIN_DIR");
    let mut seen = std::collections::HashMap::<String, usize>::new();
    for (j, o) in jobs.iter().zip(outcomes) {
        let tile: String = j
            .tile
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let base = format!(
            "{}.{}.d{}.{}.{}.{tile}",
            j.source.name(),
            j.arch,
            j.d,
            j.dtype.name(),
            if j.causal { "causal" } else { "none" }
        );
        let n = seen.entry(base.clone()).or_insert(0);
        let name = if *n == 0 {
            format!("{base}.cubin")
        } else {
            format!("{base}.{n}.cubin")
        };
        *n += 1;
        if let Some(image) = &o.image {
            std::fs::write(dir.join(name), image).expect("write a CUBIN");
        }
    }
}

#[test]
fn arch_parsing() {
    assert_eq!(parse_cc("sm_80"), (8, 0));
    assert_eq!(parse_cc("sm_86"), (8, 6));
    assert_eq!(parse_cc("sm_90"), (9, 0));
    assert_eq!(parse_cc("sm_90a"), (9, 0));
    assert_eq!(parse_cc("sm_120"), (12, 0));
    assert_eq!(smem_limit("sm_120"), 99 * 1024);
}
