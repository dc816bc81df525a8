//! The e4m3 warpgroup probe on the CPU: its layout model is consistent (the key each byte of
//! P's fragment holds is the key V^T stores where the hardware reads that byte), the emulator
//! passes every check, and the injected fault is caught.

use flashattn_tools::layout_wgmma::{WARPGROUP, acc_cell};
use flashattn_tools::probe_wgmma_fp8::{
    a8_cell, emulate, p_acc_index, run_emulated, vt_key, vt_slot,
};

#[test]
fn p_fragment_and_vt_order_agree() {
    for x in 0..256 {
        assert_eq!(vt_slot(vt_key(x)), x);
        assert_eq!(vt_key(vt_slot(x)), x);
    }
    for tid in 0..WARPGROUP {
        let mut seen = [false; 64];
        for kk in 0..4 {
            for j in 0..4 {
                for e in 0..4 {
                    let acc = p_acc_index(kk, j, e);
                    assert!(!seen[acc], "accumulator {acc} packed twice");
                    seen[acc] = true;
                    // The row and key of the S accumulator, and the row and k the hardware
                    // reads the byte as: same row, and V^T holds that key at that k.
                    let (row, key) = acc_cell(tid, acc);
                    let (arow, k) = a8_cell(tid, j, e);
                    assert_eq!(row, arow, "thread {tid} k-step {kk} p{j}.b{e}");
                    assert_eq!(
                        vt_slot(key),
                        32 * kk + k,
                        "thread {tid} k-step {kk} p{j}.b{e}"
                    );
                }
            }
        }
        assert!(seen.iter().all(|&s| s));
    }
}

#[test]
fn emulator_passes_and_the_fault_is_caught() {
    let r = run_emulated(false);
    assert!(r.passed, "{r}");
    assert!(r.checked > 60_000, "{}", r.checked);
    let f = run_emulated(true);
    assert!(!f.passed);
    // Every thread holds a wrong cell: the fault is named lane by lane.
    assert_eq!(f.wrong_lanes().len(), WARPGROUP);
    // The dumps differ only where the fault reaches (S of pv reads no faulted descriptor).
    let (a, b) = (emulate(false), emulate(true));
    assert_eq!(a.pv_s, b.pv_s);
    assert_ne!(a.pv_o, b.pv_o);
}
