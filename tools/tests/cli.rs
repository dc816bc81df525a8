//! The `flashattn` binary end to end, on the CPU backend (no GPU needed): `run` on the
//! MiniLM sample, on hand-written files (NaN references, score modifiers, backward, packed
//! variable-length and KV-cache files) and on bad input (one message on stderr, never a panic),
//! `info`, and `ring`. Moved here from the library's tests with the binary (issue 39).

use flashattn::compare::random_vec;
use flashattn::io::{SafeFile, Writer};
use flashattn::{AttnProblem, Mask, reference};
use half::f16;
use std::path::PathBuf;

/// The repository root: the binary is run from there, as users run it (`run`'s default input
/// is `data/minilm-L6-s77.safetensors`, relative to it).
fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn s77() -> PathBuf {
    repo().join("data/minilm-L6-s77.safetensors")
}

/// The `flashattn` binary, to be run from the repository root.
fn command() -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_flashattn"));
    c.current_dir(repo());
    c
}

/// Runs the `flashattn` binary: (success, stdout, stderr).
fn flashattn(args: &[&str]) -> (bool, String, String) {
    let out = command().args(args).output().unwrap();
    let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
    (out.status.success(), text(out.stdout), text(out.stderr))
}

#[test]
fn cli_run_default_sample_all_layers() {
    let out =
        std::env::temp_dir().join(format!("flashattn-run-{}.safetensors", std::process::id()));
    let out_s = out.display().to_string();
    for causal in [false, true] {
        let mut args = vec!["run", "--backend", "cpu", "--out", &out_s];
        if causal {
            args.push("--causal");
        }
        let (ok, stdout, stderr) = flashattn(&args);
        assert!(ok, "stdout:\n{stdout}\nstderr:\n{stderr}");
        assert_eq!(stdout.matches(" ok").count(), 2, "{stdout}");
        assert!(
            stdout.contains("GFLOP/s") && stdout.contains("backend: cpu"),
            "{stdout}"
        );
        let written = SafeFile::open(&out).unwrap();
        let sfx = if causal { "_causal" } else { "" };
        for l in 0..2 {
            assert!(
                written.has(&format!("layer{l}.o{sfx}"))
                    && written.has(&format!("layer{l}.lse{sfx}"))
            );
        }
    }
    // Field report (turn 2, 5): the same run twice writes the same bytes.
    let again = out.with_extension("again.safetensors");
    let again_s = again.display().to_string();
    let (ok, _, _) = flashattn(&["run", "--backend", "cpu", "--causal", "--out", &again_s]);
    assert!(ok);
    let (a, b) = (std::fs::read(&out).unwrap(), std::fs::read(&again).unwrap());
    assert!(a == b, "two identical runs wrote different bytes");
    let _ = std::fs::remove_file(&again);
    let _ = std::fs::remove_file(&out);
    // Converted inputs are judged against the oracle; --prefix picks one layer.
    let (ok, stdout, stderr) =
        flashattn(&["run", "--dtype", "bf16", "--prefix", "layer1", "--causal"]);
    assert!(ok, "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stdout.contains("vs f64 oracle") && stdout.contains("layer1:"),
        "{stdout}"
    );
}

#[test]
fn cli_errors_are_messages_not_panics() {
    let (ok, _, stderr) = flashattn(&["run", "--input", "/nonexistent/x.safetensors"]);
    assert!(
        !ok && stderr.starts_with("error:") && !stderr.contains("panicked"),
        "{stderr}"
    );
    let (ok, _, stderr) = flashattn(&["run", "--backend", "cpu", "--prefix", "layer9"]);
    assert!(
        !ok && stderr.contains("layer9")
            && stderr.contains("its layers are: layer0")
            && !stderr.contains("panicked"),
        "{stderr}"
    );
    // Field report (turn 2, 3): one rule for --scale, written either way, and for metadata.
    for form in [
        ["--scale=-0.25"].as_slice(),
        &["--scale", "-0.25"],
        &["--scale", "-1e-3"],
        &["--scale", "-inf"],
        &["--scale", "0"],
    ] {
        let mut args = vec!["run", "--backend", "cpu"];
        args.extend_from_slice(form);
        let (ok, _, stderr) = flashattn(&args);
        assert!(
            !ok && stderr.contains("softmax_scale")
                && !stderr.contains("unexpected argument")
                && !stderr.contains("panicked"),
            "{form:?}: {stderr}"
        );
    }
    let bad = std::env::temp_dir().join(format!(
        "flashattn-badscale-{}.safetensors",
        std::process::id()
    ));
    let src = SafeFile::open(s77()).unwrap();
    let qkv = src.qkv::<f16>("layer0").unwrap();
    let s = qkv.shape;
    let mut w = Writer::new();
    w.add("q", &[s.batch, s.seqlen_q, s.heads_q, s.head_dim], &qkv.q)
        .unwrap();
    w.add("k", &[s.batch, s.seqlen_k, s.heads_kv, s.head_dim], &qkv.k)
        .unwrap();
    w.add("v", &[s.batch, s.seqlen_k, s.heads_kv, s.head_dim], &qkv.v)
        .unwrap();
    w.meta("scale", "nan");
    w.write(&bad).unwrap();
    let bad_s = bad.display().to_string();
    let (ok, _, stderr) = flashattn(&["run", "--backend", "cpu", "--input", &bad_s, "--check"]);
    assert!(
        !ok && stderr.contains(&bad_s) && stderr.contains("'nan'") && !stderr.contains("panicked"),
        "{stderr}"
    );
    // --scale overrides the metadata (it is then neither read nor refused).
    let (ok, stdout, stderr) = flashattn(&[
        "run",
        "--backend",
        "cpu",
        "--input",
        &bad_s,
        "--check",
        "--scale",
        "0.125",
    ]);
    assert!(ok && stdout.contains(" ok"), "{stdout}{stderr}");
    let _ = std::fs::remove_file(&bad);
    let (ok, stdout, stderr) = flashattn(&["info"]);
    assert!(
        ok && stdout.contains("CPU:") && stdout.contains("GPU"),
        "{stdout}{stderr}"
    );
}

/// Field report (turn 2, 6): a file whose stored reference holds NaN where NaN is the
/// documented answer (a NaN in v at key 3 reaches exactly the rows that see key 3) passes.
#[test]
fn cli_run_accepts_nan_where_the_reference_has_nan() {
    let shape = flashattn::AttnShape::new(1, 6, 1, 8);
    let path = std::env::temp_dir().join(format!(
        "flashattn-nanref-{}.safetensors",
        std::process::id()
    ));
    let path_s = path.display().to_string();
    for mask in [Mask::Causal, Mask::None] {
        let p = AttnProblem::new(shape).unwrap().with_mask(mask);
        let (q, k, mut v) = flashattn::compare::random_inputs::<f16>(&p, 3);
        v[3 * 8..4 * 8].fill(f16::NAN);
        let r = reference::attention(&p, &q, &k, &v).unwrap();
        let nan_rows = r.lse.iter().filter(|x| x.is_nan()).count()
            + r.o
                .chunks(8)
                .filter(|row| row.iter().any(|x| x.is_nan()))
                .count();
        assert!(nan_rows > 0);
        let o: Vec<f32> = r.o.iter().map(|&x| x as f32).collect();
        let lse: Vec<f32> = r.lse.iter().map(|&x| x as f32).collect();
        let mut w = Writer::new();
        w.add("q", &[1, 6, 1, 8], &q).unwrap();
        w.add("k", &[1, 6, 1, 8], &k).unwrap();
        w.add("v", &[1, 6, 1, 8], &v).unwrap();
        w.add_output("", mask, &shape, &o, &lse).unwrap();
        w.write(&path).unwrap();
        let mut args = vec!["run", "--backend", "cpu", "--input", &path_s];
        if mask.is_causal() {
            args.push("--causal");
        }
        let (ok, stdout, stderr) = flashattn(&args);
        assert!(ok && stdout.contains(" ok"), "{mask:?}: {stdout}{stderr}");
        // A NaN where the reference has a number fails.
        let mut w = Writer::new();
        let (_, _, clean_v) = flashattn::compare::random_inputs::<f16>(&p, 3);
        w.add("q", &[1, 6, 1, 8], &q).unwrap();
        w.add("k", &[1, 6, 1, 8], &k).unwrap();
        w.add("v", &[1, 6, 1, 8], &v).unwrap();
        let rc = reference::attention(&p, &q, &k, &clean_v).unwrap();
        let oc: Vec<f32> = rc.o.iter().map(|&x| x as f32).collect();
        let lc: Vec<f32> = rc.lse.iter().map(|&x| x as f32).collect();
        w.add_output("", mask, &shape, &oc, &lc).unwrap();
        w.write(&path).unwrap();
        let (ok, stdout, stderr) = flashattn(&args);
        assert!(
            !ok && stdout.contains("NaN mismatches"),
            "{mask:?}: {stdout}{stderr}"
        );
    }
    let _ = std::fs::remove_file(&path);
}

/// `run --window/--softcap/--alibi` (issue 12): judged by the oracle (stored references hold
/// plain attention), bad values refused, `--out` refused with a modifier.
#[test]
fn cli_run_score_modifiers() {
    for extra in [
        &["--window", "16,0"][..],
        &["--window", "-1,3", "--causal"],
        &["--softcap", "30", "--alibi", "--dtype", "bf16"],
        // Another scale than the file's: its stored references do not apply (review report).
        &["--scale", "0.5"],
    ] {
        let mut args = vec!["run", "--backend", "cpu", "--prefix", "layer1"];
        args.extend_from_slice(extra);
        let (ok, stdout, stderr) = flashattn(&args);
        assert!(
            ok && stdout.contains("vs f64 oracle") && !stdout.contains("stored"),
            "{extra:?}: {stdout}{stderr}"
        );
    }
    for (extra, want) in [
        (&["--window", "-2,0"][..], "window left = -2"),
        (&["--window", "7"], "expected LEFT,RIGHT"),
        (&["--softcap", "-1"], "softcap = -1"),
        (&["--threads", "100000"], "1..=1024"),
        (
            &["--alibi", "--out", "/tmp/flashattn-never.safetensors"],
            "--out with",
        ),
    ] {
        let mut args = vec!["run", "--backend", "cpu"];
        args.extend_from_slice(extra);
        let (ok, _, stderr) = flashattn(&args);
        assert!(
            !ok && stderr.contains(want) && !stderr.contains("panicked"),
            "{extra:?}: {stderr}"
        );
    }
}

#[test]
fn cli_run_backward_against_the_exact_gradients() {
    for extra in [
        &[][..],
        &["--causal", "--window", "8,0"],
        &["--dtype", "bf16"],
    ] {
        let mut args = vec!["run", "--backend", "cpu", "--backward"];
        args.extend_from_slice(extra);
        let (ok, stdout, stderr) = flashattn(&args);
        let lines = stdout.matches("backward (CPU, dO seed").count();
        assert!(
            ok && lines == 2 && !stdout.contains("FAIL"),
            "{extra:?}: {stdout}{stderr}"
        );
    }
}

fn cu(lens: &[i32]) -> Vec<i32> {
    let mut out = vec![0];
    for l in lens {
        out.push(out.last().unwrap() + l);
    }
    out
}

/// Writes a packed safetensors file: `cu_seqlens_q`/`_k` (I32), q/k/v (F16) and optionally
/// slopes, under prefix `layer0`.
fn packed_file(path: &std::path::Path, lq: &[i32], lk: &[i32], hq: usize, hkv: usize, d: usize) {
    use safetensors::tensor::{Dtype, TensorView};
    let (cq, ck) = (cu(lq), cu(lk));
    let (tq, tk) = (*cq.last().unwrap() as usize, *ck.last().unwrap() as usize);
    let half_bytes = |n: usize, seed: u64| -> Vec<u8> {
        random_vec::<f16>(n, seed)
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect()
    };
    let i32_bytes = |x: &[i32]| -> Vec<u8> { x.iter().flat_map(|v| v.to_le_bytes()).collect() };
    let data = [
        (
            "layer0.cu_seqlens_q",
            Dtype::I32,
            vec![cq.len()],
            i32_bytes(&cq),
        ),
        (
            "layer0.cu_seqlens_k",
            Dtype::I32,
            vec![ck.len()],
            i32_bytes(&ck),
        ),
        (
            "layer0.q",
            Dtype::F16,
            vec![tq, hq, d],
            half_bytes(tq * hq * d, 1),
        ),
        (
            "layer0.k",
            Dtype::F16,
            vec![tk, hkv, d],
            half_bytes(tk * hkv * d, 2),
        ),
        (
            "layer0.v",
            Dtype::F16,
            vec![tk, hkv, d],
            half_bytes(tk * hkv * d, 3),
        ),
    ];
    let views: Vec<(String, TensorView)> = data
        .iter()
        .map(|(n, t, s, b)| (n.to_string(), TensorView::new(*t, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

#[test]
fn cli_run_reads_packed_files() {
    let dir = std::env::temp_dir();
    let path = dir.join(format!(
        "flashattn-packed-{}.safetensors",
        std::process::id()
    ));
    packed_file(&path, &[5, 0, 17, 1], &[7, 3, 0, 40], 4, 2, 16);
    let file = path.to_str().unwrap();
    for extra in [
        &[][..],
        &["--causal"],
        &["--causal", "--window", "8,0", "--softcap", "30", "--alibi"],
    ] {
        let mut args = vec!["run", "--backend", "cpu", "--input", file];
        args.extend_from_slice(extra);
        let (ok, stdout, stderr) = flashattn(&args);
        assert!(
            ok && stdout.contains("varlen batch 4 total_q 23 total_k 50")
                && stdout.contains("vs f64 oracle")
                && stdout.contains(" ok"),
            "{extra:?}: {stdout}{stderr}"
        );
    }
    let (ok, _, stderr) = flashattn(&["run", "--input", file, "--out", "/tmp/x.safetensors"]);
    assert!(
        !ok && stderr.contains("packed") && !stderr.contains("panicked"),
        "{stderr}"
    );
    // Offsets that do not end at the packed row count are refused with both numbers.
    packed_file(&path, &[5, 0, 17, 1], &[7, 3, 0, 40], 4, 2, 16);
    let bad = dir.join(format!(
        "flashattn-packed-bad-{}.safetensors",
        std::process::id()
    ));
    {
        use safetensors::tensor::{Dtype, TensorView};
        let cq: Vec<u8> = [0i32, 5, 9].iter().flat_map(|v| v.to_le_bytes()).collect();
        let q: Vec<u8> = vec![0u8; 10 * 2 * 8 * 2];
        let views = vec![
            (
                "cu_seqlens_q".to_string(),
                TensorView::new(Dtype::I32, vec![3], &cq).unwrap(),
            ),
            (
                "cu_seqlens_k".to_string(),
                TensorView::new(Dtype::I32, vec![3], &cq).unwrap(),
            ),
            (
                "q".to_string(),
                TensorView::new(Dtype::F16, vec![10, 2, 8], &q).unwrap(),
            ),
            (
                "k".to_string(),
                TensorView::new(Dtype::F16, vec![10, 2, 8], &q).unwrap(),
            ),
            (
                "v".to_string(),
                TensorView::new(Dtype::F16, vec![10, 2, 8], &q).unwrap(),
            ),
        ];
        safetensors::serialize_to_file(views, None, &bad).unwrap();
    }
    let (ok, _, stderr) = flashattn(&["run", "--backend", "cpu", "--input", bad.to_str().unwrap()]);
    assert!(
        !ok && stderr.contains("ends at 9") && stderr.contains("10 rows"),
        "{stderr}"
    );
    // Offsets broken in other ways, mixed element types, one offset tensor missing: each
    // named (new-user trial findings).
    use safetensors::tensor::Dtype::{F16, F32, I32};
    type Tensors = Vec<(
        &'static str,
        safetensors::tensor::Dtype,
        Vec<usize>,
        Vec<u8>,
    )>;
    let write = |tensors: &Tensors| {
        let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
            .iter()
            .map(|(n, t, sh, b)| {
                let v = safetensors::tensor::TensorView::new(*t, sh.clone(), b).unwrap();
                (n.to_string(), v)
            })
            .collect();
        safetensors::serialize_to_file(views, None, &bad).unwrap();
    };
    let offs = |x: &[i32]| -> Vec<u8> { x.iter().flat_map(|v| v.to_le_bytes()).collect() };
    let (q16, q32) = (vec![0u8; 10 * 2 * 8 * 2], vec![0u8; 10 * 2 * 8 * 4]);
    let qkv = |q: (safetensors::tensor::Dtype, Vec<u8>)| -> Tensors {
        vec![
            ("q", q.0, vec![10, 2, 8], q.1),
            ("k", F16, vec![10, 2, 8], q16.clone()),
            ("v", F16, vec![10, 2, 8], q16.clone()),
        ]
    };
    let with = |mut t: Tensors, extra: Tensors| {
        t.extend(extra);
        t
    };
    let cases: Vec<(Tensors, &str)> = vec![
        (
            with(
                qkv((F16, q16.clone())),
                vec![
                    ("cu_seqlens_q", I32, vec![3], offs(&[0, 5, 3])),
                    ("cu_seqlens_k", I32, vec![3], offs(&[0, 5, 10])),
                ],
            ),
            "decreases at entry 2",
        ),
        (
            with(
                qkv((F32, q32)),
                vec![
                    ("cu_seqlens_q", I32, vec![3], offs(&[0, 5, 10])),
                    ("cu_seqlens_k", I32, vec![3], offs(&[0, 5, 10])),
                ],
            ),
            "one element type",
        ),
        (
            with(
                qkv((F16, q16.clone())),
                vec![
                    ("cu_seqlens_q", I32, vec![1, 3], offs(&[0, 5, 10])),
                    ("cu_seqlens_k", I32, vec![3], offs(&[0, 5, 10])),
                ],
            ),
            "1-D",
        ),
        (
            with(
                qkv((F16, q16.clone())),
                vec![("cu_seqlens_k", I32, vec![3], offs(&[0, 5, 10]))],
            ),
            "cu_seqlens_q is not",
        ),
    ];
    for (tensors, want) in &cases {
        write(tensors);
        let (ok, _, stderr) =
            flashattn(&["run", "--backend", "cpu", "--input", bad.to_str().unwrap()]);
        assert!(
            !ok && stderr.contains(want) && !stderr.contains("panicked"),
            "{want}: {stderr}"
        );
    }
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&bad);
}

/// `flashattn run` on KV-cache files: contiguous and paged (with new rows), judged by the
/// oracle; `--backend cuda` runs the GPU kernels, or says why there is no GPU.
#[test]
fn cli_run_reads_cache_files() {
    use safetensors::tensor::{Dtype, TensorView};
    let bytes16 = |n: usize, seed: u64| -> Vec<u8> {
        random_vec::<f16>(n, seed)
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect()
    };
    let i32s = |x: &[i32]| -> Vec<u8> { x.iter().flat_map(|v| v.to_le_bytes()).collect() };
    let (batch, sq, hq, hkv, d) = (2usize, 2usize, 4usize, 2usize, 16usize);
    let path = std::env::temp_dir().join(format!(
        "flashattn-cache-{}.safetensors",
        std::process::id()
    ));
    type T = (&'static str, Dtype, Vec<usize>, Vec<u8>);
    let write = |tensors: &[T]| {
        let views: Vec<(String, TensorView)> = tensors
            .iter()
            .map(|(n, t, s, b)| (n.to_string(), TensorView::new(*t, s.clone(), b).unwrap()))
            .collect();
        safetensors::serialize_to_file(views, None, &path).unwrap();
    };
    let q: T = (
        "layer0.q",
        Dtype::F16,
        vec![batch, sq, hq, d],
        bytes16(batch * sq * hq * d, 1),
    );
    let lens: T = (
        "layer0.cache_seqlens",
        Dtype::I32,
        vec![batch],
        i32s(&[40, 5]),
    );
    let new = |n: usize| -> [T; 2] {
        [
            (
                "layer0.k",
                Dtype::F16,
                vec![batch, n, hkv, d],
                bytes16(batch * n * hkv * d, 5),
            ),
            (
                "layer0.v",
                Dtype::F16,
                vec![batch, n, hkv, d],
                bytes16(batch * n * hkv * d, 6),
            ),
        ]
    };
    // Contiguous, capacity 64.
    let n = batch * 64 * hkv * d;
    let contiguous = vec![
        q.clone(),
        lens.clone(),
        (
            "layer0.k_cache",
            Dtype::F16,
            vec![batch, 64, hkv, d],
            bytes16(n, 2),
        ),
        (
            "layer0.v_cache",
            Dtype::F16,
            vec![batch, 64, hkv, d],
            bytes16(n, 3),
        ),
    ];
    // Paged: 8 pages of 16, tables shuffled; sequence 0 appends across a page boundary.
    let n = 8 * 16 * hkv * d;
    let mut paged = vec![
        q,
        lens,
        (
            "layer0.k_cache",
            Dtype::F16,
            vec![8, 16, hkv, d],
            bytes16(n, 2),
        ),
        (
            "layer0.v_cache",
            Dtype::F16,
            vec![8, 16, hkv, d],
            bytes16(n, 3),
        ),
        (
            "layer0.block_table",
            Dtype::I32,
            vec![batch, 4],
            i32s(&[5, 2, 7, 0, 1, 6, 3, 4]),
        ),
    ];
    paged.extend(new(3));
    let file = path.to_str().unwrap();
    for (tensors, extra) in [
        (&contiguous, &[][..]),
        (&paged, &["--causal"]),
        (&paged, &["--alibi", "--window", "10,0"]),
    ] {
        write(tensors);
        let mut args = vec!["run", "--backend", "cpu", "--input", file];
        args.extend_from_slice(extra);
        let out = command().args(&args).output().unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(
            out.status.success()
                && stdout.contains("kv-cache batch 2")
                && stdout.contains("vs f64 oracle")
                && stdout.contains(" ok"),
            "{extra:?}: {stdout}{stderr}"
        );
    }
    write(&paged);
    let out = command()
        .args(["run", "--backend", "cuda", "--input", file])
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    if out.status.success() {
        assert!(
            stdout.contains("attn_decode") && stdout.contains(" ok"),
            "{stdout}"
        );
    } else {
        assert!(stderr.to_lowercase().contains("cuda"), "{stderr}");
    }
    let _ = std::fs::remove_file(&path);
}

/// `flashattn ring`: the simulated ring on the command line, judged against one device and the
/// oracle; the GPU path refused by name.
#[test]
fn cli_ring_runs_the_simulation_and_refuses_gpus_by_name() {
    for extra in [&["--causal"][..], &["--dtype", "bf16", "--heads-kv", "1"]] {
        let mut args = vec![
            "ring",
            "--ranks",
            "2,3",
            "--seqlen",
            "301",
            "--heads",
            "4",
            "--head-dim",
            "32",
        ];
        args.extend_from_slice(extra);
        let out = command().args(&args).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.matches(" ok").count() == 2,
            "{extra:?}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = command()
        .args(["ring", "--backend", "cuda"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("NCCL"), "{stderr}");
}
