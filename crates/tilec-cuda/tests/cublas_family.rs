//! The cuBLAS family without a GPU: which lowered matrix products it takes (and why not), and
//! that its column-major description of a product (`lt_gemm`), run by an emulation of
//! cuBLASLt's semantics on the kernel's own buffers, gives what the tile interpreter computes.

use tilec_cuda::cublaslt::{LtGemm, MatLayout};
use tilec_cuda::families::{cublas_plan, FamilyPlan, PlanKind};
use tilec_ir::op::{BinaryOp, LayoutOp, LinalgOp};
use tilec_ir::{DType, Graph, Op, Tensor, TensorType};
use tilec_tile::lower::lower_nodes;
use tilec_tile::Kernel;

/// `x @ y` (y transposed over its last two axes first when `ty_t`), plus a bias when `bias`.
fn matmul(d: DType, xs: &[usize], ys: &[usize], y_t: bool, bias: bool) -> Kernel {
    let mut g = Graph::new("mm");
    let x = g.add_input("x", TensorType::fixed(d, xs));
    let mut y = g.add_input("y", TensorType::fixed(d, ys));
    if y_t {
        let r = ys.len();
        let mut perm: Vec<usize> = (0..r).collect();
        perm.swap(r - 1, r - 2);
        y = g.add(Op::Layout(LayoutOp::Transpose { perm }), &[y]).unwrap();
    }
    let mut z = g.add(Op::Linalg(LinalgOp::MatMul), &[x, y]).unwrap();
    if bias {
        let n = if y_t { ys[ys.len() - 2] } else { ys[ys.len() - 1] };
        let b = g.add_input("b", TensorType::fixed(d, &[n]));
        z = g.add(Op::Binary(BinaryOp::Add), &[z, b]).unwrap();
    }
    g.set_outputs(vec![z]);
    let nodes: Vec<_> = g.node_ids().collect();
    lower_nodes(&g, &nodes, "mm").unwrap_or_else(|e| panic!("{e}")).kernel
}

fn lt(p: &FamilyPlan) -> &LtGemm {
    match &p.kind {
        PlanKind::Cublas(q) => &q.lt,
        k => panic!("not a cuBLAS plan: {k:?}"),
    }
}

/// `op(M)(r, c)` of a column-major matrix in `mem` for batch `b`.
fn at(l: &MatLayout, t: bool, mem: &[f64], base: usize, b: usize, r: u64, c: u64) -> f64 {
    let (r, c) = if t { (c, r) } else { (r, c) };
    mem[base + b * l.batch_stride as usize + (r + c * l.ld as u64) as usize]
}

/// cuBLASLt's `D = op(A) op(B)` over the kernel's parameters; returns the output parameter's
/// elements (C) as the plan says they are laid out.
fn emulate(k: &Kernel, p: &FamilyPlan, args: &[Tensor]) -> Vec<f64> {
    let g = lt(p);
    let PlanKind::Cublas(q) = &p.kind else { unreachable!() };
    let es = p.problem.in_dtype.size_bytes() as u64;
    // cuBLAS's A is the kernel's B.
    let a = args[p.b.param].to_f64_vec();
    let b = args[p.a.param].to_f64_vec();
    let (abase, bbase) = ((p.b.offset_bytes / es) as usize, (p.a.offset_bytes / es) as usize);
    let mut d = vec![0.0; k.buf(k.params[q.c.param]).numel() as usize];
    let (m, n) = (g.d.rows, g.d.cols);
    let depth = if g.trans_a { g.a.rows } else { g.a.cols };
    for bt in 0..g.batch.max(1) as usize {
        for r in 0..m {
            for c in 0..n {
                let mut s = 0.0;
                for kk in 0..depth {
                    s += at(&g.a, g.trans_a, &a, abase, bt, r, kk) * at(&g.b, g.trans_b, &b, bbase, bt, kk, c);
                }
                d[bt * g.d.batch_stride as usize + (r + c * g.d.ld as u64) as usize] = s;
            }
        }
    }
    d
}

/// Random inputs for every parameter, the interpreter's C, and the emulated C.
fn check_against_interpreter(k: &Kernel, what: &str) -> FamilyPlan {
    let p = cublas_plan(k, false).unwrap_or_else(|e| panic!("{what}: {e}"));
    let mut args: Vec<Tensor> = k
        .params
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            let buf = k.buf(b);
            let shape: Vec<usize> = buf.shape.iter().map(|&s| s as usize).collect();
            let vals: Vec<f64> = (0..buf.numel() as usize).map(|j| ((j * 31 + i * 17) % 23) as f64 / 8.0 - 1.4).collect();
            Tensor::from_f64s(buf.dtype, shape, &vals).unwrap()
        })
        .collect();
    tilec_tile::interp::run(k, &mut args).unwrap_or_else(|e| panic!("{what}: {e}"));
    let PlanKind::Cublas(q) = &p.kind else { unreachable!() };
    let want = args[q.c.param].to_f64_vec();
    let got = emulate(k, &p, &args);
    assert_eq!(want.len(), got.len(), "{what}");
    let tol = if q.out_dtype == DType::F32 { 1e-4 } else { 2e-2 };
    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
        assert!((w - g).abs() <= tol * w.abs().max(1.0), "{what}: element {i}: interpreter {w}, cuBLAS layout {g}");
    }
    p
}

#[test]
fn row_major_products_map_to_column_major_swapped_operands() {
    let k = matmul(DType::F16, &[64, 40], &[40, 72], false, false);
    let p = check_against_interpreter(&k, "f16 64x40x72");
    let g = lt(&p);
    // C^T = B^T A^T: cuBLAS's A is B read column-major (72 x 40), its B is A (40 x 64).
    assert!(!g.trans_a && !g.trans_b, "{g:?}");
    assert_eq!((g.a.rows, g.a.cols, g.a.ld), (72, 40, 72));
    assert_eq!((g.b.rows, g.b.cols, g.b.ld), (40, 64, 40));
    assert_eq!((g.d.rows, g.d.cols, g.d.ld, g.batch), (72, 64, 72, 1));
    assert_eq!(p.source, "", "a library kernel has nothing to compile");
    assert!(!p.compiles());
    assert!(p.describe().contains("cublas.gemm 64x72x40") && p.describe().contains("cuBLASLt"), "{}", p.describe());
}

#[test]
fn batched_ragged_and_transposed_products_match_the_interpreter() {
    // Ragged, batched on both sides: batch strides of every operand.
    let k = matmul(DType::BF16, &[3, 33, 17], &[3, 17, 29], false, false);
    let g = lt(&check_against_interpreter(&k, "bf16 batched")).clone();
    assert_eq!(g.batch, 3);
    assert_eq!((g.a.batch_stride, g.b.batch_stride, g.d.batch_stride), (17 * 29, 33 * 17, 33 * 29));
    // B transposed (attention scores): column-major B, so cuBLAS transposes its A.
    let k = matmul(DType::F16, &[2, 3, 24, 16], &[2, 3, 40, 16], true, false);
    let g = lt(&check_against_interpreter(&k, "f16 q@k^T")).clone();
    assert!(g.trans_a && !g.trans_b, "{g:?}");
    assert_eq!((g.a.rows, g.a.cols, g.a.ld, g.batch), (16, 40, 16, 6));
    // A shared weight: batches of rows flattened into one taller product.
    let k = matmul(DType::F32, &[4, 5, 12], &[12, 7], false, false);
    let g = lt(&check_against_interpreter(&k, "f32 flattened")).clone();
    assert_eq!((g.d.rows, g.d.cols, g.batch), (7, 20, 1));
    // A broadcast over the batch: its batch stride is 0.
    let k = matmul(DType::F16, &[9, 11], &[2, 11, 13], false, false);
    let g = lt(&check_against_interpreter(&k, "f16 shared A")).clone();
    assert_eq!((g.b.batch_stride, g.batch), (0, 2));
    // Vectors on either side.
    check_against_interpreter(&matmul(DType::F32, &[11], &[11, 6], false, false), "f32 vector @ matrix");
    check_against_interpreter(&matmul(DType::F32, &[5, 11], &[11], false, false), "f32 matrix @ vector");
}

#[test]
fn tf32_is_a_plan_choice() {
    let k = matmul(DType::F32, &[16, 16], &[16, 16], false, false);
    assert!(!lt(&cublas_plan(&k, false).unwrap()).tf32);
    let p = cublas_plan(&k, true).unwrap();
    assert!(lt(&p).tf32 && p.describe().contains("32F_FAST_TF32"), "{}", p.describe());
}

#[test]
fn fused_epilogues_and_other_kernels_are_refused_with_a_reason() {
    let cases = [
        (matmul(DType::F16, &[8, 16], &[16, 8], false, true), "does more than store the product"),
        (matmul(DType::I32, &[8, 16], &[16, 8], false, false), "not a matrix product"),
    ];
    for (k, want) in cases {
        let why = cublas_plan(&k, false).err().unwrap_or_default();
        assert!(why.contains(want), "expected '{want}' in: {why}");
    }
}

#[test]
fn a_missing_library_is_an_error_not_a_panic() {
    match tilec_cuda::cublaslt::CublasLt::load() {
        Ok(lt) => eprintln!("note: cuBLASLt {} at {}", lt.version(), lt.path()),
        Err(e) => {
            let e = e.to_string();
            assert!(e.starts_with("cuBLAS not found: libcublasLt not found"), "{e}");
        }
    }
}
