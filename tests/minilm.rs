//! Real inputs: q/k/v of all-MiniLM-L6-v2's first two layers with exact stored references.
//!
//! Both files ship in the repository (`data/minilm-L6-s77.safetensors`: all 12 heads of the
//! first 2 of the model's 6 layers, `-s200`: the first head of the first 2 layers; cut by
//! `data/slice_heads.py`, references exact)
//! and are always tested.

use flashattn::compare::{Tolerance, diff_lse, diff_o, widen};
use flashattn::io::SafeFile;
use flashattn::{AttnProblem, Mask, cpu, reference};
use half::f16;
use std::path::PathBuf;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn s77() -> PathBuf {
    repo().join("data/minilm-L6-s77.safetensors")
}

fn s200() -> PathBuf {
    repo().join("data/minilm-L6-s200.safetensors")
}

fn to_f64(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

/// Every layer, both masks: the oracle reproduces the stored references (~1e-7) and the
/// CPU backend matches them within the f16 tolerance.
fn check_file(path: &PathBuf, seqlen: usize, heads: usize) {
    let file = SafeFile::open(path).unwrap();
    let layers = file.layer_prefixes();
    assert_eq!(
        layers,
        (0..2).map(|l| format!("layer{l}")).collect::<Vec<_>>()
    );
    for prefix in &layers {
        let qkv = file.qkv::<f16>(prefix).unwrap();
        assert_eq!(qkv.file_dtype, flashattn::DType::F16);
        let s = qkv.shape;
        assert_eq!(
            (s.batch, s.seqlen_q, s.heads_q, s.head_dim),
            (1, seqlen, heads, 32)
        );
        for mask in [Mask::None, Mask::Causal] {
            let what = format!("{} {prefix} {mask:?}", path.display());
            let p = AttnProblem::new(s)
                .unwrap()
                .with_mask(mask)
                .with_scale(file.scale().unwrap().unwrap())
                .unwrap();
            let stored = file
                .reference(prefix, mask, &s)
                .unwrap()
                .expect("stored reference");
            let (so, sl) = (to_f64(&stored.o), to_f64(&stored.lse));

            let r = reference::attention(&p, &qkv.q, &qkv.k, &qkv.v).unwrap();
            let (od, ld) = (
                diff_o(r.o.iter().copied(), &so),
                diff_lse(r.lse.iter().copied(), &sl),
            );
            assert!(
                od.is_clean() && od.rel_l2 < 1e-6,
                "{what}: oracle vs stored o {od}"
            );
            assert!(
                ld.is_clean() && ld.max_abs < 1e-5,
                "{what}: oracle vs stored lse {ld}"
            );

            let mut o = vec![f16::NAN; qkv.q.len()];
            let mut lse = vec![f32::NAN; s.lse_len()];
            cpu::forward(&p, &qkv.q, &qkv.k, &qkv.v, &mut o, &mut lse).unwrap();
            let (od, ld) = (diff_o(widen(&o), &so), diff_lse(widen(&lse), &sl));
            Tolerance::F16
                .check(&what, &od, &ld)
                .unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

#[test]
fn minilm_s77_all_layers() {
    check_file(&s77(), 77, 12);
}

#[test]
fn minilm_s200_all_layers() {
    check_file(&s200(), 200, 1);
}

#[test]
fn minilm_bf16_and_f32_against_the_oracle() {
    // Converted inputs: the stored references belong to the f16 inputs, so the oracle on the
    // converted inputs is the judge.
    let file = SafeFile::open(s77()).unwrap();
    for mask in [Mask::None, Mask::Causal] {
        let q = file.qkv::<half::bf16>("layer0").unwrap();
        let p = AttnProblem::new(q.shape).unwrap().with_mask(mask);
        let r = reference::attention(&p, &q.q, &q.k, &q.v).unwrap();
        let f = flashattn::forward(flashattn::BackendChoice::Cpu, &p, &q.q, &q.k, &q.v).unwrap();
        Tolerance::BF16
            .check(
                "bf16",
                &diff_o(widen(&f.o), &r.o),
                &diff_lse(widen(&f.lse), &r.lse),
            )
            .unwrap();
        let q = file.qkv::<f32>("layer1").unwrap();
        let r = reference::attention(&p, &q.q, &q.k, &q.v).unwrap();
        let f = flashattn::forward(flashattn::BackendChoice::Cpu, &p, &q.q, &q.k, &q.v).unwrap();
        Tolerance::F32
            .check(
                "f32",
                &diff_o(widen(&f.o), &r.o),
                &diff_lse(widen(&f.lse), &r.lse),
            )
            .unwrap();
    }
}
