//! The fragment-layout maps and the warp emulator built on them (no GPU needed).

use flashattn_tools::layout::{
    self, Input16, LdmatrixNum, WARP, Warp, a_cell, a_owner, a_x4_addrs, b_cell, b_owner,
    b_x4_trans_addrs, cd_cell, cd_owner, first_two, last_two, ldmatrix, ldmatrix_cell,
    ldmatrix_owner,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::HashSet;

const INPUTS: [Input16; 2] = [Input16::F16, Input16::BF16];

/// Asserts that `cells` (one per (lane, reg, half)) hit every cell of `rows x cols` exactly once.
fn assert_bijection(what: &str, cells: &[(usize, usize)], rows: usize, cols: usize) {
    assert_eq!(cells.len(), rows * cols, "{what}: wrong number of slots");
    let set: HashSet<_> = cells.iter().copied().collect();
    assert_eq!(set.len(), cells.len(), "{what}: a cell is held twice");
    assert!(
        cells.iter().all(|&(r, c)| r < rows && c < cols),
        "{what}: cell out of range"
    );
}

#[test]
fn a_map_is_a_bijection_and_inverts() {
    let mut cells = Vec::new();
    for lane in 0..WARP {
        for reg in 0..4 {
            for half in 0..2 {
                let (r, c) = a_cell(lane, reg, half);
                assert_eq!(a_owner(r, c), (lane, reg, half));
                cells.push((r, c));
            }
        }
    }
    assert_bijection("A", &cells, 16, 16);
}

#[test]
fn b_map_is_a_bijection_and_inverts() {
    let mut cells = Vec::new();
    for lane in 0..WARP {
        for reg in 0..2 {
            for half in 0..2 {
                let (k, n) = b_cell(lane, reg, half);
                assert_eq!(b_owner(k, n), (lane, reg, half));
                cells.push((k, n));
            }
        }
    }
    assert_bijection("B", &cells, 16, 8);
}

#[test]
fn cd_map_is_a_bijection_and_inverts() {
    let mut cells = Vec::new();
    for lane in 0..WARP {
        for reg in 0..4 {
            let (i, j) = cd_cell(lane, reg);
            assert_eq!(cd_owner(i, j), (lane, reg));
            cells.push((i, j));
        }
    }
    assert_bijection("C/D", &cells, 16, 8);
}

#[test]
fn ldmatrix_maps_are_bijections_for_x1_x2_x4() {
    for num in LdmatrixNum::ALL {
        for trans in [false, true] {
            let mut cells = Vec::new();
            for lane in 0..WARP {
                for reg in 0..num.tiles() {
                    for half in 0..2 {
                        let (r, c) = ldmatrix_cell(lane, reg, half, trans);
                        assert_eq!(ldmatrix_owner(r, c, trans), (lane, half));
                        // Tile `reg` stacked below the earlier ones: one 8x8 block per register.
                        cells.push((8 * reg + r, c));
                    }
                }
            }
            assert_bijection(
                &format!("ldmatrix {num:?} trans={trans}"),
                &cells,
                8 * num.tiles(),
                8,
            );
        }
    }
}

#[test]
fn documented_cells() {
    // Lane 13: g = 3, t = 1.
    assert_eq!(a_cell(13, 0, 0), (3, 2));
    assert_eq!(a_cell(13, 3, 1), (11, 11));
    assert_eq!(b_cell(13, 0, 1), (3, 3));
    assert_eq!(b_cell(13, 1, 0), (10, 3));
    assert_eq!(cd_cell(13, 1), (3, 3));
    assert_eq!(cd_cell(13, 2), (11, 2));
    assert_eq!(ldmatrix_cell(13, 0, 1, false), (3, 3));
    assert_eq!(ldmatrix_cell(13, 0, 1, true), (3, 3));
    assert_eq!(ldmatrix_cell(6, 0, 0, true), (4, 1));
}

/// Two n=8 C fragments, side by side, are one A fragment: pairs (c0, c1) and (c2, c3) of the
/// fragment for columns 8*(reg>>1).. are the halves of A register reg.
#[test]
fn c_fragments_repack_into_an_a_fragment() {
    for lane in 0..WARP {
        for reg in 0..4 {
            for half in 0..2 {
                let (i, j) = cd_cell(lane, 2 * (reg & 1) + half);
                assert_eq!(a_cell(lane, reg, half), (i, j + 8 * (reg >> 1)));
            }
        }
    }
}

#[test]
fn pack_and_encode_round_trip() {
    assert_eq!(layout::pack(0x1234, 0xabcd), 0xabcd_1234);
    assert_eq!(layout::unpack(0xabcd_1234, 0), 0x1234);
    assert_eq!(layout::unpack(0xabcd_1234, 1), 0xabcd);
    for input in INPUTS {
        for x in [-256.0f32, -3.0, 0.0, 1.0, 15.0, 255.0] {
            assert_eq!(input.decode(input.encode(x)), x);
        }
    }
    assert_eq!(Input16::F16.encode(1.0), 0x3c00);
    assert_eq!(Input16::BF16.encode(1.0), 0x3f80);
}

/// The seed experiment: A[i][j] = i, B[k][j] = j through ldmatrix.x4 / .x4.trans: D = 16*i*j.
#[test]
fn seed_experiment_gives_16ij() {
    for input in INPUTS {
        let mut smem: Vec<u16> = (0..256).map(|e| input.encode((e / 16) as f32)).collect();
        smem.extend((0..128).map(|e| input.encode((e % 8) as f32)));
        let a = ldmatrix(&smem, &a_x4_addrs(0, 16), LdmatrixNum::X4, false);
        let b = ldmatrix(&smem, &b_x4_trans_addrs(256, 8, 1), LdmatrixNum::X4, true);
        let d = layout::mma(input, &a, &first_two(&b), &[[0.0; 4]; WARP]);
        for (lane, regs) in d.iter().enumerate() {
            for (reg, &v) in regs.iter().enumerate() {
                let (i, j) = cd_cell(lane, reg);
                assert_eq!(v, (16 * i * j) as f32, "{input:?} lane {lane} d{reg}");
            }
        }
        // Without .trans the product is wrong (the probe's fault variant).
        let b = ldmatrix(&smem, &b_x4_trans_addrs(256, 8, 1), LdmatrixNum::X4, false);
        let d = layout::mma(input, &a, &first_two(&b), &[[0.0; 4]; WARP]);
        assert_ne!(layout::scatter_cd(&d)[3][5], 240.0);
    }
}

fn random_matrix(rng: &mut StdRng, rows: usize, cols: usize) -> Vec<Vec<f32>> {
    (0..rows)
        .map(|_| (0..cols).map(|_| rng.gen_range(-8i32..=8) as f32).collect())
        .collect()
}

fn matmul(a: &[Vec<f32>], b: &[Vec<f32>], c: &[Vec<f32>]) -> Vec<Vec<f32>> {
    (0..a.len())
        .map(|i| {
            (0..b[0].len())
                .map(|j| c[i][j] + (0..b.len()).map(|k| a[i][k] * b[k][j]).sum::<f32>())
                .collect()
        })
        .collect()
}

/// Writes `m` into `smem` at `base` with row stride `ld` (padding left as garbage).
fn store(smem: &mut [u16], input: Input16, m: &[Vec<f32>], base: usize, ld: usize) {
    for (r, row) in m.iter().enumerate() {
        for (c, &x) in row.iter().enumerate() {
            smem[base + r * ld + c] = input.encode(x);
        }
    }
}

/// Random small-integer matrices (exact in f16 and bf16) through emulated ldmatrix + mma give
/// the plain matrix product: A row-major via x4, B row-major [k][n] via x4.trans (two n=8
/// halves), B stored transposed [n][k] (K of attention) via x2 without .trans, and C added.
#[test]
fn random_matrices_through_ldmatrix_and_mma_match_matmul() {
    let mut rng = StdRng::seed_from_u64(0x5eed_1a70);
    for round in 0..20 {
        for input in INPUTS {
            let a = random_matrix(&mut rng, 16, 16);
            let b = random_matrix(&mut rng, 16, 16);
            let c = random_matrix(&mut rng, 16, 16);
            let want = matmul(&a, &b, &c);
            // Padded strides (24 elements = 48 bytes keep 16-byte row alignment).
            let ld = 24;
            let mut smem = vec![0xdead_u16; 4 * 16 * ld];
            store(&mut smem, input, &a, 0, ld);
            store(&mut smem, input, &b, 16 * ld, ld);
            let bt: Vec<Vec<f32>> = (0..16)
                .map(|n| (0..16).map(|k| b[k][n]).collect())
                .collect();
            store(&mut smem, input, &bt, 32 * ld, ld);

            let af = ldmatrix(&smem, &a_x4_addrs(0, ld), LdmatrixNum::X4, false);
            let bf = ldmatrix(
                &smem,
                &b_x4_trans_addrs(16 * ld, ld, 2),
                LdmatrixNum::X4,
                true,
            );
            for nb in 0..2 {
                let cm: layout::Acc16x8 =
                    std::array::from_fn(|i| std::array::from_fn(|j| c[i][8 * nb + j]));
                let b_regs = if nb == 0 {
                    first_two(&bf)
                } else {
                    last_two(&bf)
                };
                let d =
                    layout::scatter_cd(&layout::mma(input, &af, &b_regs, &layout::gather_cd(&cm)));
                // The same B columns from the transposed copy: lanes 0..8 give n rows, k 0..8;
                // lanes 8..16 the same n rows, k 8..16. Lanes 16..32 are ignored by x2.
                let addrs: Warp<usize> = std::array::from_fn(|l| {
                    if l < 16 {
                        32 * ld + (8 * nb + l % 8) * ld + 8 * (l / 8)
                    } else {
                        usize::MAX
                    }
                });
                let kt = first_two(&ldmatrix(&smem, &addrs, LdmatrixNum::X2, false));
                let d2 = layout::scatter_cd(&layout::mma(input, &af, &kt, &layout::gather_cd(&cm)));
                for i in 0..16 {
                    for j in 0..8 {
                        assert_eq!(
                            d[i][j],
                            want[i][8 * nb + j],
                            "round {round} {input:?} D[{i}][{}]",
                            8 * nb + j
                        );
                        assert_eq!(
                            d2[i][j],
                            want[i][8 * nb + j],
                            "round {round} {input:?} K^T D[{i}][{}]",
                            8 * nb + j
                        );
                    }
                }
            }
        }
    }
}

/// `ldmatrix` reads only the addresses of lanes 0..8*tiles, and x1/x2 fill only 1/2 registers.
#[test]
fn ldmatrix_x1_x2_use_only_their_lanes() {
    let smem: Vec<u16> = (0..64u16).collect(); // one 8x8 tile, element = 8*row + col
    for (num, used) in [(LdmatrixNum::X1, 8), (LdmatrixNum::X2, 16)] {
        let addrs: Warp<usize> =
            std::array::from_fn(|l| if l < used { 8 * (l % 8) } else { usize::MAX });
        for trans in [false, true] {
            let regs = ldmatrix(&smem, &addrs, num, trans);
            for (lane, r) in regs.iter().enumerate() {
                for (reg, &value) in r.iter().enumerate() {
                    if reg >= num.tiles() {
                        assert_eq!(value, 0);
                        continue;
                    }
                    for half in 0..2 {
                        let (row, col) = ldmatrix_cell(lane, reg, half, trans);
                        assert_eq!(layout::unpack(value, half), (8 * row + col) as u16);
                    }
                }
            }
        }
    }
}

/// Gather and scatter through the maps are inverse to each other.
#[test]
fn gather_scatter_round_trip() {
    let mut rng = StdRng::seed_from_u64(7);
    let a: layout::Mat16x16 = std::array::from_fn(|_| std::array::from_fn(|_| rng.r#gen()));
    let b: layout::Mat16x8 = std::array::from_fn(|_| std::array::from_fn(|_| rng.r#gen()));
    let c: layout::Acc16x8 =
        std::array::from_fn(|_| std::array::from_fn(|_| rng.gen_range(-1e3..1e3)));
    assert_eq!(layout::scatter_a(&layout::gather_a(&a)), a);
    assert_eq!(layout::scatter_b(&layout::gather_b(&b)), b);
    assert_eq!(layout::scatter_cd(&layout::gather_cd(&c)), c);
}
