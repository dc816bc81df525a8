//! Every validation error is reachable from some input, and none of them panics: each entry
//! point (oracle, CPU backend, host `forward`, file reader) returns the typed error first.

use flashattn::compare::{Diff, Tolerance};
use flashattn::io::{SafeFile, Writer};
use flashattn::{AttnError, AttnProblem, AttnShape, BackendChoice, Mask, Strides, cpu, reference};
use half::f16;

mod common;
use common::shape;

/// A problem whose fields were set directly (bypassing the checked constructors), as a user
/// of the public struct can.
fn raw(s: AttnShape) -> AttnProblem {
    let st = Strides {
        batch: 1,
        seq: 1,
        head: 1,
    };
    AttnProblem {
        shape: s,
        mask: Mask::None,
        softmax_scale: 0.125,
        q_strides: st,
        k_strides: st,
        v_strides: st,
        o_strides: st,
        scores: Default::default(),
    }
}

/// Runs every entry point on `p` with small buffers and returns their errors.
fn all_errors(p: &AttnProblem) -> Vec<AttnError> {
    let buf = vec![f16::ONE; 64];
    let mut o = vec![f16::ZERO; 64];
    let mut lse = vec![0.0f32; 64];
    vec![
        reference::attention(p, &buf, &buf, &buf).unwrap_err(),
        cpu::forward(p, &buf, &buf, &buf, &mut o, &mut lse).unwrap_err(),
        flashattn::forward(BackendChoice::Cpu, p, &buf, &buf, &buf).unwrap_err(),
        flashattn::forward(BackendChoice::Auto, p, &buf, &buf, &buf).unwrap_err(),
    ]
}

#[test]
fn zero_dims() {
    let names = [
        "batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv", "head_dim",
    ];
    for (i, want) in names.iter().enumerate() {
        let mut dims = [2usize; 6];
        dims[i] = 0;
        let s = shape(dims[0], dims[1], dims[2], dims[3], dims[4], dims[5]);
        assert!(matches!(AttnProblem::new(s), Err(AttnError::ZeroDim { name }) if name == *want));
        for e in all_errors(&raw(s)) {
            assert!(
                matches!(e, AttnError::ZeroDim { name } if name == *want),
                "{e}"
            );
        }
    }
}

#[test]
fn heads_not_multiple() {
    let s = shape(1, 4, 4, 6, 4, 8);
    assert!(matches!(
        AttnProblem::new(s),
        Err(AttnError::HeadsNotMultiple {
            heads_q: 6,
            heads_kv: 4
        })
    ));
    for e in all_errors(&raw(s)) {
        assert!(matches!(e, AttnError::HeadsNotMultiple { .. }), "{e}");
    }
}

#[test]
fn head_dim_too_large() {
    let s = shape(1, 4, 4, 2, 2, 300);
    assert!(matches!(
        AttnProblem::new(s),
        Err(AttnError::UnsupportedHeadDim { head_dim: 300, .. })
    ));
    for e in all_errors(&raw(s)) {
        assert!(matches!(e, AttnError::UnsupportedHeadDim { .. }), "{e}");
    }
}

#[test]
fn invalid_scales() {
    let p = AttnProblem::new(shape(1, 4, 4, 2, 2, 8)).unwrap();
    for s in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -1.0, 0.0, -0.0] {
        assert!(
            matches!(p.clone().with_scale(s), Err(AttnError::InvalidScale { .. })),
            "{s}"
        );
        let bad = AttnProblem {
            softmax_scale: s,
            ..p.clone()
        };
        for e in all_errors(&bad) {
            assert!(matches!(e, AttnError::InvalidScale { .. }), "{e}");
        }
    }
}

#[test]
fn size_overflow() {
    let s = shape(usize::MAX / 2, 4, 4, 2, 2, 8);
    assert!(matches!(
        AttnProblem::new(s),
        Err(AttnError::Overflow { .. })
    ));
    for e in all_errors(&raw(s)) {
        assert!(matches!(e, AttnError::Overflow { .. }), "{e}");
    }
    // Strides whose largest offset overflows.
    let p = AttnProblem::new(shape(4, 4, 4, 2, 2, 8)).unwrap();
    let huge = Strides {
        batch: usize::MAX / 2,
        seq: 16,
        head: 8,
    };
    assert!(matches!(
        p.clone()
            .with_strides(huge, p.k_strides, p.v_strides, p.o_strides),
        Err(AttnError::Overflow { .. })
    ));
}

#[test]
fn overlapping_strides() {
    let p = AttnProblem::new(shape(2, 4, 4, 2, 2, 8)).unwrap();
    let overlap = Strides {
        batch: 64,
        seq: 8,
        head: 4,
    }; // heads overlap head_dim
    // o must not overlap itself: refused by every entry point that takes o strides.
    let e = p
        .clone()
        .with_strides(p.q_strides, p.k_strides, p.v_strides, overlap)
        .unwrap_err();
    assert!(
        matches!(e, AttnError::InvalidStrides { tensor: "o", .. }),
        "{e}"
    );
    let bad = AttnProblem {
        o_strides: overlap,
        ..p.clone()
    };
    // `flashattn::forward` (the last two entry points) returns o dense and ignores
    // o_strides by contract, so only the others must reject overlapping o strides.
    for e in &all_errors(&bad)[..2] {
        assert!(
            matches!(e, AttnError::InvalidStrides { tensor: "o", .. }),
            "{e}"
        );
    }
    let bcast_o = Strides {
        batch: 0,
        seq: 16,
        head: 8,
    };
    assert!(
        p.clone()
            .with_strides(p.q_strides, p.k_strides, p.v_strides, bcast_o)
            .is_err()
    );
}

/// Field report (turn 2, 7): q, k and v are only read, so overlapping or broadcast views
/// (PyTorch's `expand` of k/v heads, or of a shared prefix over the batch: stride 0) are
/// legal on every backend, and give the result of the materialised tensors.
#[test]
fn broadcast_inputs_match_their_materialised_copies() {
    let s = shape(3, 5, 7, 4, 2, 8);
    let dense = AttnProblem::new(s).unwrap();
    // k and v: one [seqlen_k, head_dim] block shared by every batch and kv head.
    let bcast = Strides {
        batch: 0,
        seq: 8,
        head: 0,
    };
    // q: heads overlapping (head stride 4 < head_dim 8).
    let q_overlap = Strides {
        batch: 5 * 4 * 4 + 4,
        seq: 4 * 4 + 4,
        head: 4,
    };
    for mask in [flashattn::Mask::None, flashattn::Mask::Causal] {
        let p = dense
            .clone()
            .with_mask(mask)
            .with_strides(q_overlap, bcast, bcast, dense.o_strides)
            .unwrap();
        let (q, k, v) = flashattn::compare::random_inputs::<f16>(&p, 9);
        assert_eq!(k.len(), 7 * 8);
        // The same values, materialised densely.
        let gather = |x: &[f16], st: Strides, seqlen: usize, heads: usize| {
            let mut out = Vec::new();
            for b in 0..3 {
                for i in 0..seqlen {
                    for h in 0..heads {
                        let at = st.offset(b, i, h);
                        out.extend_from_slice(&x[at..at + 8]);
                    }
                }
            }
            out
        };
        let (qd, kd, vd) = (
            gather(&q, q_overlap, 5, 4),
            gather(&k, bcast, 7, 2),
            gather(&v, bcast, 7, 2),
        );
        let want = flashattn::forward(
            BackendChoice::Cpu,
            &dense.clone().with_mask(mask),
            &qd,
            &kd,
            &vd,
        )
        .unwrap();
        let got = flashattn::forward(BackendChoice::Cpu, &p, &q, &k, &v).unwrap();
        assert_eq!(got.o, want.o, "{mask:?}");
        assert_eq!(got.lse, want.lse, "{mask:?}");
        let r = reference::attention(&p, &q, &k, &v).unwrap();
        let rd = reference::attention(&dense.clone().with_mask(mask), &qd, &kd, &vd).unwrap();
        assert_eq!(r, rd);
    }
}

#[test]
fn buffers_too_short() {
    let p = AttnProblem::new(shape(2, 5, 7, 4, 2, 8)).unwrap();
    let (nq, nk, nl) = (2 * 5 * 4 * 8, 2 * 7 * 2 * 8, 2 * 4 * 5);
    let names = ["q", "k", "v", "o", "lse"];
    for (i, want) in names.iter().enumerate() {
        let mut lens = [nq, nk, nk, nq, nl];
        lens[i] -= 1;
        let q = vec![f16::ONE; lens[0]];
        let k = vec![f16::ONE; lens[1]];
        let v = vec![f16::ONE; lens[2]];
        let mut o = vec![f16::ZERO; lens[3]];
        let mut lse = vec![0.0f32; lens[4]];
        let e = cpu::forward(&p, &q, &k, &v, &mut o, &mut lse).unwrap_err();
        assert!(
            matches!(e, AttnError::BufferTooShort { tensor, len, required } if tensor == *want && len + 1 == required),
            "{e}"
        );
        assert!(
            o.iter().all(|x| *x == f16::ZERO),
            "nothing is written on error"
        );
        if i < 3 {
            for e in [
                reference::attention(&p, &q, &k, &v).unwrap_err(),
                flashattn::forward(BackendChoice::Cpu, &p, &q, &k, &v).unwrap_err(),
            ] {
                assert!(
                    matches!(e, AttnError::BufferTooShort { tensor, .. } if tensor == *want),
                    "{e}"
                );
            }
        }
    }
}

fn file_with(tensors: &[(&str, &[usize], bool)]) -> SafeFile {
    // (name, shape, f32?) with f16 otherwise.
    let mut w = Writer::new();
    for (name, shape, is_f32) in tensors {
        let n: usize = shape.iter().product();
        if *is_f32 {
            w.add(name, shape, &vec![1.0f32; n]).unwrap();
        } else {
            w.add(name, shape, &vec![f16::ONE; n]).unwrap();
        }
    }
    SafeFile::from_bytes("test", w.to_bytes().unwrap()).unwrap()
}

#[test]
fn dtype_mismatch() {
    let f = file_with(&[
        ("q", &[1, 4, 2, 8], false),
        ("k", &[1, 4, 2, 8], true),
        ("v", &[1, 4, 2, 8], false),
    ]);
    assert!(matches!(
        f.qkv::<f16>(""),
        Err(AttnError::DTypeMismatch { .. })
    ));
    assert!(matches!(
        f.read_exact::<f16>("k"),
        Err(AttnError::DTypeMismatch { .. })
    ));
    assert!(f.read::<f16>("k").is_ok(), "read() converts");
    // A stored type that is not f16/bf16/f32.
    let bytes = safetensors::serialize(
        [(
            "q",
            safetensors::tensor::TensorView::new(safetensors::Dtype::I32, vec![2], &[0u8; 8])
                .unwrap(),
        )],
        None,
    )
    .unwrap();
    let f = SafeFile::from_bytes("i32", bytes).unwrap();
    assert!(matches!(
        f.read::<f32>("q"),
        Err(AttnError::DTypeMismatch { .. })
    ));
}

#[test]
fn shape_mismatch_in_files() {
    // k and v disagree.
    let f = file_with(&[
        ("q", &[1, 4, 2, 8], false),
        ("k", &[1, 4, 2, 8], false),
        ("v", &[1, 5, 2, 8], false),
    ]);
    assert!(matches!(
        f.qkv::<f16>(""),
        Err(AttnError::ShapeMismatch { .. })
    ));
    // head_dim differs between q and k.
    let f = file_with(&[
        ("q", &[1, 4, 2, 16], false),
        ("k", &[1, 4, 2, 8], false),
        ("v", &[1, 4, 2, 8], false),
    ]);
    assert!(matches!(
        f.qkv::<f16>(""),
        Err(AttnError::ShapeMismatch { .. })
    ));
    // Not 4-D.
    let f = file_with(&[
        ("q", &[4, 2, 8], false),
        ("k", &[4, 2, 8], false),
        ("v", &[4, 2, 8], false),
    ]);
    assert!(matches!(
        f.qkv::<f16>(""),
        Err(AttnError::SafeTensors { .. })
    ));
    // GQA rule from the file's shapes.
    let f = file_with(&[
        ("q", &[1, 4, 3, 8], false),
        ("k", &[1, 4, 2, 8], false),
        ("v", &[1, 4, 2, 8], false),
    ]);
    assert!(matches!(
        f.qkv::<f16>(""),
        Err(AttnError::HeadsNotMultiple { .. })
    ));
    // Writer: data length disagrees with the shape.
    assert!(matches!(
        Writer::new().add("x", &[2, 3], &[1.0f32; 5]),
        Err(AttnError::ShapeMismatch { .. })
    ));
}

#[test]
fn malformed_files_are_errors() {
    let good = Writer::new()
        .add("q", &[2, 2], &[1.0f32; 4])
        .unwrap()
        .to_bytes()
        .unwrap();
    let mut cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("short", vec![1, 2, 3]),
        ("garbage", b"this is not a safetensors file at all".to_vec()),
        ("truncated", good[..good.len() - 3].to_vec()),
        ("header only", good[..12].to_vec()),
        ("huge header length", {
            let mut b = good.clone();
            b[..8].copy_from_slice(&u64::MAX.to_le_bytes());
            b
        }),
        ("extra bytes", {
            let mut b = good.clone();
            b.extend([0u8; 4]);
            b
        }),
    ];
    let mut bad_json = good.clone();
    bad_json[8] = b'!';
    cases.push(("bad json", bad_json));
    let header = br#"{"q":{"dtype":"F32","shape":[4,4],"data_offsets":[0,16]}}"#;
    let mut wrong_shape = (header.len() as u64).to_le_bytes().to_vec();
    wrong_shape.extend(header);
    wrong_shape.extend([0u8; 16]);
    cases.push(("shape vs offsets", wrong_shape));
    for (what, bytes) in cases {
        let e = SafeFile::from_bytes(what, bytes).unwrap_err();
        assert!(matches!(e, AttnError::SafeTensors { .. }), "{what}: {e}");
        assert!(!e.to_string().is_empty());
    }
    let f = SafeFile::from_bytes("good", good).unwrap();
    assert!(matches!(
        f.read::<f32>("nope"),
        Err(AttnError::SafeTensors { .. })
    ));
    assert!(matches!(
        f.qkv::<f32>("layer0"),
        Err(AttnError::SafeTensors { .. })
    ));
    assert!(matches!(
        SafeFile::open("/nonexistent/file.safetensors"),
        Err(AttnError::Io { .. })
    ));
    let dir = std::env::temp_dir();
    assert!(matches!(
        Writer::new().write(dir.join("no/such/dir/x.safetensors")),
        Err(AttnError::Io { .. })
    ));
}

#[test]
fn backend_unavailable_and_check_failed() {
    let p = AttnProblem::new(shape(1, 4, 4, 1, 1, 8)).unwrap();
    let x = vec![f16::ONE; 32];
    match flashattn::forward(BackendChoice::Cuda, &p, &x, &x, &x) {
        Err(AttnError::BackendUnavailable {
            backend: "cuda",
            reason,
        }) => assert!(!reason.is_empty()),
        Err(e) => panic!("unexpected {e}"),
        Ok(_) => {} // a CUDA build on a GPU machine
    }
    let bad = Diff {
        rel_l2: 1.0,
        count: 1,
        ..Diff::default()
    };
    let good = Diff {
        count: 1,
        ..Diff::default()
    };
    assert!(matches!(
        Tolerance::F16.check("x", &bad, &good),
        Err(AttnError::CheckFailed { .. })
    ));
    let nan = Diff {
        nan_mismatch: 1,
        count: 1,
        ..Diff::default()
    };
    assert!(matches!(
        Tolerance::F32.check("x", &good, &nan),
        Err(AttnError::CheckFailed { .. })
    ));
    assert!(Tolerance::BF16.check("x", &good, &good).is_ok());
}

#[test]
fn size_helpers_never_panic() {
    // Found by a new-user trial: these used to overflow (a panic in debug builds).
    let st = Strides::contiguous(1, 1, 1);
    assert_eq!(st.required_len("q", 0, 1, 1, 1).unwrap(), 0);
    assert_eq!(AttnShape::new(usize::MAX, 2, 1, 1).lse_len(), usize::MAX);
}

#[test]
fn forward_ignores_the_o_strides_it_replaces() {
    use flashattn::{BackendChoice, forward};
    let p = AttnProblem::new(AttnShape::new(1, 16, 2, 64)).unwrap();
    let mut bad = p.clone();
    bad.o_strides = Strides {
        batch: 0,
        seq: 0,
        head: 0,
    };
    let (q, k, v) = flashattn::compare::random_inputs::<f32>(&p, 3);
    let out = forward(BackendChoice::Cpu, &bad, &q, &k, &v).unwrap();
    assert_eq!(out.o.len(), 16 * 2 * 64);
}

#[test]
fn equal_strides_name_both_axes() {
    let p = AttnProblem::new(AttnShape::new(1, 16, 2, 64)).unwrap();
    let st = Strides {
        batch: 0,
        seq: 64,
        head: 64,
    };
    let e = p
        .clone()
        .with_strides(p.q_strides, p.k_strides, p.v_strides, st)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("seq and head strides are both 64")
            || e.contains("head and seq strides are both 64"),
        "{e}"
    );
}
