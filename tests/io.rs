//! safetensors round trips: outputs written by `Writer` read back bit for bit, q/k/v read
//! with and without conversion, layer prefixes, metadata and stored references.

use flashattn::compare::{random_inputs, random_vec};
use flashattn::io::{SafeFile, Writer, tensor_name};
use flashattn::{AttnProblem, AttnShape, DType, Mask, cpu};
use half::{bf16, f16};

fn tmp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "flashattn-io-{}-{name}.safetensors",
        std::process::id()
    ))
}

#[test]
fn o_and_lse_round_trip_through_a_file() {
    let shape = AttnShape {
        batch: 2,
        seqlen_q: 9,
        seqlen_k: 5,
        heads_q: 4,
        heads_kv: 2,
        head_dim: 16,
    };
    for mask in [Mask::None, Mask::Causal] {
        let p = AttnProblem::new(shape).unwrap().with_mask(mask);
        let (q, k, v) = random_inputs::<f16>(&p, 11);
        let mut o = vec![f16::ZERO; q.len()];
        let mut lse = vec![0.0f32; shape.lse_len()];
        cpu::forward(&p, &q, &k, &v, &mut o, &mut lse).unwrap();
        assert_eq!(lse.contains(&f32::NEG_INFINITY), mask.is_causal());

        let path = tmp(mask.name());
        let mut w = Writer::new();
        w.add_output("layer1", mask, &shape, &o, &lse).unwrap();
        w.add("layer1.q", &[2, 9, 4, 16], &q).unwrap();
        w.add("layer1.k", &[2, 5, 2, 16], &k).unwrap();
        w.add("layer1.v", &[2, 5, 2, 16], &v).unwrap();
        w.meta("scale", "0.25");
        w.write(&path).unwrap();

        let f = SafeFile::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let sfx = if mask.is_causal() { "_causal" } else { "" };
        let (o2, os) = f.read_exact::<f16>(&format!("layer1.o{sfx}")).unwrap();
        let (l2, ls) = f.read_exact::<f32>(&format!("layer1.lse{sfx}")).unwrap();
        assert_eq!(os, [2, 9, 4, 16]);
        assert_eq!(ls, [2, 4, 9]);
        assert_eq!(o2, o);
        assert_eq!(
            l2.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            lse.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
        assert_eq!(f.scale().unwrap(), Some(0.25));
        assert_eq!(f.layer_prefixes(), ["layer1"]);
        let qkv = f.qkv::<f16>("layer1").unwrap();
        assert_eq!((qkv.shape, qkv.q, qkv.k, qkv.v), (shape, q, k, v));
        // The stored reference of the other mask is absent; this mask's is present.
        let r = f.reference("layer1", mask, &shape).unwrap().unwrap();
        assert_eq!(r.lse.len(), lse.len());
        let other = if mask.is_causal() {
            Mask::None
        } else {
            Mask::Causal
        };
        assert!(f.reference("layer1", other, &shape).unwrap().is_none());
    }
}

#[test]
fn conversion_on_read() {
    let x: Vec<f32> = random_vec(64, 3);
    let mut w = Writer::new();
    w.add("a", &[64], &x).unwrap();
    let f = SafeFile::from_bytes("mem", w.to_bytes().unwrap()).unwrap();
    assert_eq!(f.info("a").unwrap(), (DType::F32, vec![64]));
    let (h, _) = f.read::<f16>("a").unwrap();
    let (b, _) = f.read::<bf16>("a").unwrap();
    for i in 0..64 {
        assert_eq!(h[i], f16::from_f32(x[i]));
        assert_eq!(b[i], bf16::from_f32(x[i]));
    }
    // Writing bf16 and reading it as f32 is exact.
    let mut w = Writer::new();
    w.add("b", &[8, 8], &b).unwrap();
    let f = SafeFile::from_bytes("mem", w.to_bytes().unwrap()).unwrap();
    let (back, shape) = f.read::<f32>("b").unwrap();
    assert_eq!(shape, [8, 8]);
    assert!(back.iter().zip(&b).all(|(a, b)| *a == b.to_f32()));
}

#[test]
fn prefixes_and_names() {
    let one = [f16::ONE; 8];
    let mut w = Writer::new();
    for p in ["layer10", "layer2", "", "enc.layer0"] {
        for t in ["q", "k", "v"] {
            w.add(&tensor_name(p, t), &[1, 1, 1, 8], &one).unwrap();
        }
    }
    w.add("layer3.q", &[1, 1, 1, 8], &one).unwrap(); // no k/v: not a layer
    assert!(
        w.add("layer3.q", &[1, 1, 1, 8], &one).is_err(),
        "duplicate names are refused"
    );
    let f = SafeFile::from_bytes("mem", w.to_bytes().unwrap()).unwrap();
    assert_eq!(f.layer_prefixes(), ["", "enc.layer0", "layer2", "layer10"]);
    assert!(f.has("layer10.v") && !f.has("layer3.k"));
    assert_eq!(f.names().len(), 13);
    assert!(f.metadata().is_empty());
}

#[test]
fn partial_or_misshapen_references_are_errors() {
    let shape = AttnShape::new(1, 2, 1, 4);
    let mut w = Writer::new();
    w.add("o", &[1, 2, 1, 4], &[0.5f32; 8]).unwrap();
    let f = SafeFile::from_bytes("mem", w.to_bytes().unwrap()).unwrap();
    assert!(
        f.reference("", Mask::None, &shape).is_err(),
        "o without lse"
    );
    w.add("lse", &[1, 2, 1], &[0.0f32; 2]).unwrap();
    let f = SafeFile::from_bytes("mem", w.to_bytes().unwrap()).unwrap();
    assert!(
        f.reference("", Mask::None, &shape).is_err(),
        "lse has the wrong shape"
    );
}

/// Field report (turn 2, 5): `run --out` wrote its metadata in hash order, so two identical
/// runs gave different bytes. Same entries, same metadata: same bytes, in any insertion order.
#[test]
fn written_bytes_do_not_depend_on_hash_order() {
    let o: Vec<f16> = random_vec(2 * 3 * 4, 5);
    let keys = ["source", "mask", "layout", "scale", "a", "zz", "m1", "m2"];
    let write = |rev: bool| {
        let mut w = Writer::new();
        w.add("layer0.o", &[2, 3, 4], &o).unwrap();
        w.add("layer0.lse", &[2, 3], &[0.5f32; 6]).unwrap();
        let mut ks = keys.to_vec();
        if rev {
            ks.reverse();
        }
        for k in ks {
            w.meta(k, &format!("value of {k}"));
        }
        w.to_bytes().unwrap()
    };
    let first = write(false);
    for i in 0..8 {
        assert_eq!(write(i % 2 == 1), first, "writer {i}");
    }
    // Still a valid file: tensors and metadata read back.
    let f = SafeFile::from_bytes("mem", first.clone()).unwrap();
    assert_eq!(f.metadata().len(), keys.len());
    assert_eq!(f.metadata()["zz"], "value of zz");
    assert_eq!(f.read_exact::<f16>("layer0.o").unwrap().0, o);
    assert_eq!(u64::from_le_bytes(first[..8].try_into().unwrap()) % 8, 0);
}

/// Field report (turn 2, 3): a file's `scale` metadata that is not a finite number above 0
/// was silently replaced by 1/sqrt(head_dim); it is refused, naming the file and the value.
#[test]
fn bad_scale_metadata_is_refused() {
    let with_scale = |v: &str| {
        let mut w = Writer::new();
        w.add("q", &[1, 2, 1, 4], &[0.5f32; 8]).unwrap();
        w.meta("scale", v);
        SafeFile::from_bytes("data/x.safetensors", w.to_bytes().unwrap()).unwrap()
    };
    for bad in ["nan", "0", "-0.25", "not a number", "inf", ""] {
        let e = with_scale(bad).scale().unwrap_err().to_string();
        assert!(
            e.contains("data/x.safetensors") && e.contains(&format!("'{bad}'")),
            "{bad}: {e}"
        );
    }
    assert_eq!(with_scale(" 0.125 ").scale().unwrap(), Some(0.125));
    let mut w = Writer::new();
    w.add("q", &[1], &[0.5f32]).unwrap();
    let none = SafeFile::from_bytes("mem", w.to_bytes().unwrap()).unwrap();
    assert_eq!(none.scale().unwrap(), None);
}

#[test]
fn minilm_sample_header() {
    let f = SafeFile::open(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/data/minilm-L6-s77.safetensors"
    ))
    .unwrap();
    assert_eq!(f.layer_prefixes().len(), 2);
    assert_eq!(
        f.info("layer1.q").unwrap(),
        (DType::F16, vec![1, 77, 12, 32])
    );
    assert_eq!(
        f.info("layer1.lse_causal").unwrap(),
        (DType::F32, vec![1, 12, 77])
    );
    assert!((f.scale().unwrap().unwrap() - 1.0 / 32f32.sqrt()).abs() < 1e-7);
    assert_eq!(f.metadata().get("layout").map(String::as_str), Some("bshd"));
}
