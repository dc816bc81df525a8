//! kernels/common/wgmma_ops.cuh is written by scripts/gen_wgmma_ops.py: the committed header must be
//! what the script writes now (edit the script, then run it from the repository root).

use std::process::Command;

#[test]
fn committed_header_matches_the_generator() {
    same_as_generated(
        "scripts/gen_wgmma_ops.py",
        "wgmma_ops",
        include_str!("../kernels/common/wgmma_ops.cuh"),
    );
}

/// kernels/common/wgmma_fp8_ops.cuh likewise, from scripts/gen_wgmma_fp8_ops.py.
#[test]
fn committed_fp8_header_matches_the_generator() {
    same_as_generated(
        "scripts/gen_wgmma_fp8_ops.py",
        "wgmma_fp8_ops",
        include_str!("../kernels/common/wgmma_fp8_ops.cuh"),
    );
}

fn same_as_generated(script: &str, stem: &str, committed: &str) {
    let out = std::env::temp_dir().join(format!("{stem}_{}.cuh", std::process::id()));
    let ran = Command::new("python3")
        .arg(script)
        .arg(&out)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status();
    match ran {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("{script} failed: {s}"),
        Err(e) => {
            println!("skipped: python3 not runnable ({e})");
            return;
        }
    }
    let fresh = std::fs::read_to_string(&out).expect("generated header");
    let _ = std::fs::remove_file(&out);
    assert!(
        fresh == committed,
        "kernels/common/{stem}.cuh differs from what {script} writes: run `python3 {script}` from the repository root"
    );
}
