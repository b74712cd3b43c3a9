//! CPU-side tests of the GEMV family: parameter and problem checks, the heuristic over many
//! shapes, and an emulation of the kernel's work split and `mma.sync` fragment layout (as the
//! PTX manual defines it) on small problems against a direct sum.

use super::*;
use crate::gemm::{BatchSplit, CustomEpilogue};

fn with_epi(mut p: Problem) -> Problem {
    p.custom = Some(CustomEpilogue { loads: false, name: "f".into(), source: "x".into(), params: vec![], rows: None, rounds_to: None, vector: None });
    p
}

fn gemv(m: usize, n: usize, k: usize, b: Layout) -> Problem {
    with_epi(Problem::new(m, n, k, DType::BF16).with_layouts(Layout::RowMajor, b))
}

#[test]
fn params_are_checked() {
    let q = Params::default();
    assert_eq!(q.validate(), Ok(()));
    assert_eq!((q.threads(), q.block_cols()), (256, 64));
    for bad in [
        Params { cols: 3, ..q },
        Params { unroll: 3, ..q },
        Params { cols: 4, unroll: 8, ..q },
        Params { warps_n: 8, warps_k: 4, ..q },
        Params { warps_k: 0, ..q },
        Params { split_k: 0, ..q },
        Params { split_k: 65, ..q },
        Params { prefetch: 32, ..q },
        Params { min_blocks: 9, ..q },
    ] {
        assert!(bad.validate().is_err(), "{bad:?}");
    }
}

#[test]
fn problems_outside_the_family_are_refused_with_a_reason() {
    let q = Params::default();
    let ok = gemv(16, 8192, 8192, Layout::ColMajor);
    assert_eq!(applies(&ok, &q, (9, 0)), Ok(()));
    assert_eq!(applies(&gemv(1, 203, 1000, Layout::RowMajor), &q, (8, 0)), Ok(()));
    let why = |p: &Problem, q: &Params, cc| applies(p, q, cc).unwrap_err();
    assert!(why(&ok, &q, (7, 5)).contains("8.0"));
    assert!(why(&gemv(17, 64, 64, Layout::ColMajor), &q, (9, 0)).contains("17 rows"));
    let col_a = with_epi(Problem::new(8, 64, 64, DType::F16).with_layouts(Layout::ColMajor, Layout::ColMajor));
    assert!(why(&col_a, &q, (9, 0)).contains("A is column-major"));
    let f32 = with_epi(Problem::new(8, 64, 64, DType::F32).with_layouts(Layout::RowMajor, Layout::ColMajor));
    assert!(why(&f32, &q, (9, 0)).contains("not both bf16"));
    let mut odd = gemv(4, 64, 100, Layout::ColMajor);
    assert!(why(&odd, &q, (9, 0)).contains("A: leading dimension 100"));
    odd.lda = Some(104);
    odd.ldb = Some(104);
    assert_eq!(applies(&odd, &q, (9, 0)), Ok(()));
    odd.lda = Some(101);
    assert!(why(&odd, &q, (9, 0)).contains("A: leading dimension 101"));
    odd.lda = Some(104);
    odd.ldb = Some(102);
    assert!(why(&odd, &q, (9, 0)).contains("B: leading dimension 102"));
    let mut split = gemv(4, 64, 64, Layout::ColMajor);
    split.batch = 4;
    split.batch_split = Some(BatchSplit { div: 2, a: (0, 0), b: (0, 0) });
    assert!(why(&split, &q, (9, 0)).contains("batches split"));
    let mut batched_rr = gemv(4, 64, 64, Layout::RowMajor);
    batched_rr.batch = 2;
    assert!(why(&batched_rr, &q, (9, 0)).contains("shared by every batch"));
    batched_rr.batch_stride_b = 0;
    assert_eq!(applies(&batched_rr, &q, (9, 0)), Ok(()));
    assert!(why(&gemv(4, 64, 64, Layout::ColMajor), &Params { split_k: 3, ..q }, (9, 0)).contains("exceeds the 2 chunks"));
    let mut plain = gemv(4, 64, 64, Layout::ColMajor);
    plain.custom = None;
    assert!(why(&plain, &q, (9, 0)).contains("epilogue"));
}

#[test]
fn heuristic_params_apply_to_many_shapes() {
    for m in [1, 5, 8, 9, 16] {
        for n in [1, 7, 8, 64, 203, 4096, 8200, 14336] {
            for k in [1, 8, 31, 32, 1000, 4104, 8192, 14336] {
                for (b, batch) in [(Layout::ColMajor, 1), (Layout::RowMajor, 1), (Layout::ColMajor, 3)] {
                    let mut p = gemv(m, n, k, b);
                    p.lda = Some(k.next_multiple_of(8));
                    p.ldb = Some(if b == Layout::ColMajor { k.next_multiple_of(8) } else { n });
                    p.batch = batch;
                    p.batch_stride_a = m * k.next_multiple_of(8);
                    p.batch_stride_b = n * k.next_multiple_of(8);
                    for (sms, konst) in [(1, false), (108, true), (132, false), (132, true)] {
                        let q = heuristic_for(&p, sms, konst);
                        assert_eq!(applies(&p, &q, (9, 0)), Ok(()), "{m}x{n}x{k} x{batch} {b:?} on {sms} SMs: {q:?}");
                        assert!(q.block_cols() <= n.next_multiple_of(8).max(8) || q.cols == 1 && q.warps_n == 1);
                        // Only constant weights (or a row-major B, which the caller vouches is
                        // one), shared by the batches, are tiled.
                        assert!(!q.tiled || (konst || b == Layout::RowMajor) && (batch <= 1 || p.batch_stride_b == 0), "{q:?}");
                        assert_eq!(q.tiled, (konst || b == Layout::RowMajor) && batch <= 1, "{m}x{n}x{k} x{batch} {b:?}: {q:?}");
                    }
                }
            }
        }
    }
    // Constant weights of the decode shape are tiled.
    let qc = heuristic_for(&gemv(16, 8192, 8192, Layout::ColMajor), 132, true);
    assert!(qc.tiled && qc.a_ahead && qc.stages == 0, "{qc:?}");
    // Otherwise it splits K so that its 128 column tiles fill the SMs.
    let q = heuristic(&gemv(16, 8192, 8192, Layout::ColMajor), 132);
    assert!(!q.tiled && q.a_ahead, "{q:?}");
    assert!(q.split_k >= 2 && q.split_k <= 8, "{q:?}");
    let p = gemv(16, 8192, 8192, Layout::ColMajor);
    let blocks = tiles(&p, &q) * q.split_k;
    assert!(blocks * 10 >= 132 * blocks_per_sm(&p, &q) * 9, "{blocks} blocks: {q:?}");
}

/// Reads 8 elements of a K-contiguous row as the kernel does: 16 bytes when the whole chunk is
/// inside K, else element by element with zeros from `K` on (the row's own bounds checked).
fn load8(row: &[f64], c: usize, t: usize, k: usize, whole: bool) -> [f64; 8] {
    let k0 = c * CHUNK + t * 8;
    let mut v = [0.0; 8];
    for (e, x) in v.iter_mut().enumerate() {
        if whole || k0 + e < k {
            *x = row[k0 + e];
        }
    }
    v
}

/// The chunks a warp multiplies, in the kernel's order: steps of `u` whole chunks in a loop
/// unrolled by two (buffers `cur` and `nxt`), then the rest one by one (`whole` false for the
/// ragged last chunk).
fn kernel_chunks(c_lo: usize, c_hi: usize, nfull_all: usize, u: usize) -> Vec<(usize, bool)> {
    let (c_lo, c_hi, nfull_all) = (c_lo as i64, c_hi as i64, nfull_all as i64);
    let nfull = (c_hi.min(nfull_all) - c_lo).max(0);
    let steps = nfull / u as i64;
    let mut out = vec![];
    let mut loaded: Vec<i64> = vec![];
    if steps > 0 {
        loaded = (0..u as i64).map(|x| c_lo + x).collect();
    }
    let mut s = 0;
    while s < steps {
        let c = c_lo + s * u as i64;
        let mut nxt = vec![];
        if s + 1 < steps {
            nxt = (0..u as i64).map(|x| c + u as i64 + x).collect();
        }
        out.extend(loaded.iter().map(|&x| (x as usize, true)));
        if s + 1 >= steps {
            break;
        }
        if s + 2 < steps {
            loaded = (0..u as i64).map(|x| c + 2 * u as i64 + x).collect();
        }
        out.extend(nxt.iter().map(|&x| (x as usize, true)));
        s += 2;
    }
    let mut c = c_lo + steps * u as i64;
    while c < c_hi {
        out.push((c as usize, c < nfull_all));
        c += 1;
    }
    out
}

#[test]
fn the_k_loop_visits_each_chunk_once_in_order() {
    for u in [1, 2, 4, 8] {
        for c_lo in [0, 3, 10] {
            for len in 0..40 {
                for ragged in [false, true] {
                    let c_hi = c_lo + len;
                    // The ragged chunk, if any, is the last of K; here possibly this range's last.
                    let nfull_all = if ragged && len > 0 { c_hi - 1 } else { c_hi + 5 };
                    let got = kernel_chunks(c_lo, c_hi, nfull_all, u);
                    let want: Vec<(usize, bool)> = (c_lo..c_hi).map(|c| (c, c < nfull_all)).collect();
                    assert_eq!(got, want, "u {u}, chunks {c_lo}..{c_hi}");
                }
            }
        }
    }
}

/// The kernel on the CPU: the same block, warp and chunk ranges, clamped rows and columns,
/// the lane's registers assigned to fragment slots as the renderer does, each `mma.sync`
/// evaluated from the PTX fragment layout, the shared-memory sums and the split order.
/// `a` is `m x lda` (row-major), `b` is `n x ldb` (K-contiguous). Returns C (NaN where no
/// store happened) and the number of stores per element.
fn emulate(m: usize, n: usize, k: usize, q: &Params, a: &[f64], b: &[f64], lda: usize, ldb: usize) -> (Vec<f64>, Vec<u32>) {
    let p = gemv(m, n, k, Layout::ColMajor);
    let (nt, nch, nfull) = (tiles(&p, q), chunks(&p), k / CHUNK);
    let (cpb, cpw) = chunks_per_block(&p, q);
    let (nb, cw, nbp) = (q.block_cols(), 8 * q.cols, red_stride(q));
    let mut c_out = vec![f64::NAN; m * n];
    let mut stores = vec![0u32; m * n];
    for tile in 0..nt {
        let n0 = tile * nb;
        let mut parts = vec![];
        for split in 0..q.split_k {
            let mut red = vec![f64::NAN; q.warps_k * m * nbp];
            for wk in 0..q.warps_k {
                for wn in 0..q.warps_n {
                    // acc[lane][j][4]
                    let mut acc = vec![[[0.0f64; 4]; 4]; 32];
                    let c_lo = split * cpb + wk * cpw;
                    let c_hi = nch.min(split * cpb + cpb).min(c_lo + cpw);
                    for (c, whole) in kernel_chunks(c_lo, c_hi, nfull, q.unroll) {
                        // Per lane: x0, x1 (A rows) and w[j] (B columns).
                        let mut x = vec![[[0.0; 8]; 2]; 32];
                        let mut w = vec![[[0.0; 8]; 4]; 32];
                        for lane in 0..32 {
                            let (g, t) = (lane / 4, lane % 4);
                            let r0 = g.min(m - 1);
                            let r1 = (g + 8).min(m - 1);
                            x[lane][0] = load8(&a[r0 * lda..r0 * lda + lda], c, t, k, whole);
                            x[lane][1] = if m > 8 { load8(&a[r1 * lda..r1 * lda + lda], c, t, k, whole) } else { [0.0; 8] };
                            for j in 0..q.cols {
                                let col = (n0 + wn * cw + j * 8 + g).min(n - 1);
                                w[lane][j] = load8(&b[col * ldb..col * ldb + ldb], c, t, k, whole);
                            }
                        }
                        for j in 0..q.cols {
                            for half in 0..2 {
                                // Words: f0 = {x0.x, x1.x, x0.y, x1.y}, b0 = {w.x, w.y}; f1 and
                                // b1 the .z, .w words. Word i holds elements 2i, 2i+1.
                                let (wa, wb) = if half == 0 { (0, 1) } else { (2, 3) };
                                let mut fa = [[0.0f64; 16]; 16];
                                let mut fb = [[0.0f64; 8]; 16];
                                for lane in 0..32 {
                                    let (g, t) = (lane / 4, lane % 4);
                                    let word = |v: &[f64; 8], i: usize| [v[2 * i], v[2 * i + 1]];
                                    let regs_a = [word(&x[lane][0], wa), word(&x[lane][1], wa), word(&x[lane][0], wb), word(&x[lane][1], wb)];
                                    // PTX m16n8k16 A: a0 (g, 2t..), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..).
                                    for (i, reg) in regs_a.iter().enumerate() {
                                        let row = g + 8 * (i % 2);
                                        let slot = 2 * t + 8 * (i / 2);
                                        fa[row][slot] = reg[0];
                                        fa[row][slot + 1] = reg[1];
                                    }
                                    // B: b0 (2t.., col g), b1 (2t+8.., col g).
                                    let regs_b = [word(&w[lane][j], wa), word(&w[lane][j], wb)];
                                    for (i, reg) in regs_b.iter().enumerate() {
                                        fb[2 * t + 8 * i][g] = reg[0];
                                        fb[2 * t + 8 * i + 1][g] = reg[1];
                                    }
                                }
                                for lane in 0..32 {
                                    let (g, t) = (lane / 4, lane % 4);
                                    // D: d0 (g, 2t), d1 (g, 2t+1), d2 (g+8, 2t), d3 (g+8, 2t+1).
                                    for (i, d) in acc[lane][j].iter_mut().enumerate() {
                                        let (row, col) = (g + 8 * (i / 2), 2 * t + i % 2);
                                        *d += (0..16).map(|s| fa[row][s] * fb[s][col]).sum::<f64>();
                                    }
                                }
                            }
                        }
                    }
                    for lane in 0..32 {
                        let (g, t) = (lane / 4, lane % 4);
                        for j in 0..q.cols {
                            let cl = wn * cw + j * 8 + 2 * t;
                            for (row, e) in [(g, 0), (g + 8, 2)] {
                                if row < m {
                                    red[(wk * m + row) * nbp + cl] = acc[lane][j][e];
                                    red[(wk * m + row) * nbp + cl + 1] = acc[lane][j][e + 1];
                                }
                            }
                        }
                    }
                }
            }
            let sums: Vec<f64> = (0..m * nb)
                .map(|v| {
                    let (r, cl) = (v / nb, v % nb);
                    (0..q.warps_k).map(|w| red[(w * m + r) * nbp + cl]).sum()
                })
                .collect();
            parts.push(sums);
        }
        for v in 0..m * nb {
            let (r, cl) = (v / nb, v % nb);
            let sum: f64 = parts.iter().map(|s| s[v]).sum();
            if n0 + cl < n {
                c_out[r * n + n0 + cl] = sum;
                stores[r * n + n0 + cl] += 1;
            }
        }
    }
    (c_out, stores)
}

#[test]
fn the_kernels_work_split_and_fragments_compute_the_product() {
    let mut seed = 0x1234_5678_u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        ((seed >> 11) % 17) as f64 - 8.0
    };
    let shapes: [(usize, usize, usize, Params); 8] = [
        (16, 64, 64, Params::default()),
        (5, 203, 100, Params { split_k: 3, ..Params::default() }),
        (1, 37, 1000, Params { warps_n: 1, warps_k: 4, cols: 4, unroll: 1, split_k: 5, ..Params::default() }),
        (9, 24, 33, Params { warps_n: 2, warps_k: 1, cols: 1, unroll: 4, ..Params::default() }),
        (16, 130, 520, Params { warps_n: 2, warps_k: 3, cols: 2, unroll: 2, split_k: 2, ..Params::default() }),
        (8, 8, 7, Params { warps_n: 1, warps_k: 1, cols: 1, unroll: 1, ..Params::default() }),
        (3, 100, 300, Params { unroll: 8, cols: 1, ..Params::default() }),
        (12, 50, 2048, Params { split_k: 4, unroll: 4, ..Params::default() }),
    ];
    for (m, n, k, q) in shapes {
        let (lda, ldb) = (k.next_multiple_of(8), k.next_multiple_of(8));
        let mut p = gemv(m, n, k, Layout::ColMajor);
        p.lda = Some(lda);
        p.ldb = Some(ldb);
        assert_eq!(applies(&p, &q, (9, 0)), Ok(()), "{m}x{n}x{k}");
        // Padding past K poisoned: the kernel must never multiply it in.
        let a: Vec<f64> = (0..m * lda).map(|i| if i % lda < k { rnd() } else { f64::NAN }).collect();
        let b: Vec<f64> = (0..n * ldb).map(|i| if i % ldb < k { rnd() } else { f64::NAN }).collect();
        let (c, stores) = emulate(m, n, k, &q, &a, &b, lda, ldb);
        for r in 0..m {
            for j in 0..n {
                let want: f64 = (0..k).map(|kk| a[r * lda + kk] * b[j * ldb + kk]).sum();
                assert_eq!(stores[r * n + j], 1, "{m}x{n}x{k} {q:?}: ({r}, {j}) stored {} times", stores[r * n + j]);
                assert_eq!(c[r * n + j], want, "{m}x{n}x{k} {q:?}: C({r}, {j})");
            }
        }
    }
}
