//! The cuBLAS family (`cublas.gemm`) on the CUDA path: which matrix products the dispatcher
//! gives it (no GPU needed), and, on a GPU machine with cuBLASLt, forced products of every
//! dtype and layout against the reference interpreter, then a timing beside the default
//! families. Without a GPU or cuBLASLt the device tests say so and pass.

use tilec::compiled_cuda::{prepare, CudaOptions, Prepared};
use tilec::cuda::GpuTarget;
use tilec_ir::op::{BinaryOp, LayoutOp, LinalgOp};
use tilec_ir::{DType, Graph, Op, Tensor, TensorType};

/// `x @ y` with `x` [.., m, k] and `y` [.., k, n] (or [.., n, k] transposed when `y_t`), and a
/// bias added when `bias`.
fn matmul(d: DType, xs: &[usize], ys: &[usize], y_t: bool, bias: bool) -> Graph {
    let mut g = Graph::new("mm");
    let x = g.add_input("x", TensorType::fixed(d, xs));
    let mut y = g.add_input("y", TensorType::fixed(d, ys));
    if y_t {
        let mut perm: Vec<usize> = (0..ys.len()).collect();
        perm.swap(ys.len() - 1, ys.len() - 2);
        y = g.add(Op::Layout(LayoutOp::Transpose { perm }), &[y]).unwrap();
    }
    let mut z = g.add(Op::Linalg(LinalgOp::MatMul), &[x, y]).unwrap();
    if bias {
        let n = if y_t { ys[ys.len() - 2] } else { ys[ys.len() - 1] };
        let b = g.add_input("b", TensorType::fixed(d, &[n]));
        z = g.add(Op::Binary(BinaryOp::Add), &[z, b]).unwrap();
    }
    g.set_outputs(vec![z]);
    g
}

fn forced() -> CudaOptions {
    CudaOptions { families: vec![("MatMul".into(), "cublas.gemm".into())], ..Default::default() }
}

fn prepared(g: &Graph, opts: &CudaOptions) -> Prepared {
    prepare(g, opts, &GpuTarget::hopper()).unwrap_or_else(|e| panic!("{e}"))
}

/// The matrix-product kernel's schedule and its report line.
fn the_gemm(p: &Prepared) -> (&'static str, String) {
    let ks: Vec<_> = p.kernels().iter().filter(|k| tilec::cuda::families::has_gemm(&k.lowered)).collect();
    assert_eq!(ks.len(), 1, "{:?}", ks.iter().map(|k| &k.name).collect::<Vec<_>>());
    (ks[0].schedule, ks[0].family.describe())
}

#[test]
fn sixteen_bit_products_the_tensor_core_template_refuses_go_to_cublas() {
    // K = 100: not a multiple of 8, which the Hopper template's TMA needs.
    let (s, why) = the_gemm(&prepared(&matmul(DType::F16, &[64, 100], &[100, 72], false, false), &Default::default()));
    assert_eq!(s, "cublas.gemm", "{why}");
    assert!(why.contains("passed over: ") && why.contains("sm80_gemv: 64 rows") && why.contains("; sm90_tc_gemm: ") && why.contains("cuBLASLt, f16 out"), "{why}");
    // The template keeps what it takes.
    let (s, why) = the_gemm(&prepared(&matmul(DType::BF16, &[64, 128], &[128, 64], false, false), &Default::default()));
    assert_eq!(s, "sm90_tc_gemm", "{why}");
}

#[test]
fn f32_products_stay_on_tilecs_gemm_unless_cublas_is_forced() {
    let g = matmul(DType::F32, &[2, 33, 20], &[2, 20, 17], false, false);
    // tilec's exact-f32 template comes before cuBLAS (whose policy also leaves f32 products to
    // tilec's own kernels unless forced).
    let (s, why) = the_gemm(&prepared(&g, &Default::default()));
    assert_eq!(s, "simt_f32_gemm", "{why}");
    assert!(!why.contains("cublas"), "{why}");
    let (s, why) = the_gemm(&prepared(&g, &forced()));
    assert_eq!(s, "cublas.gemm", "{why}");
    assert!(why.contains("forced"), "{why}");
}

#[test]
fn forced_f32_products_use_tf32_only_when_allowed() {
    let g = matmul(DType::F32, &[64, 40], &[40, 24], false, false);
    let (s, why) = the_gemm(&prepared(&g, &forced()));
    assert_eq!(s, "cublas.gemm", "{why}");
    assert!(why.contains("compute 32F") && !why.contains("TF32"), "{why}");
    let opts = CudaOptions { allow_tf32: true, ..forced() };
    let (s, why) = the_gemm(&prepared(&g, &opts));
    assert_eq!(s, "cublas.gemm", "{why}");
    assert!(why.contains("compute 32F_FAST_TF32"), "{why}");
}

#[test]
fn fused_epilogues_keep_tilecs_kernels_with_a_reason() {
    let (s, why) = the_gemm(&prepared(&matmul(DType::F16, &[64, 100], &[100, 72], false, true), &forced()));
    assert_eq!(s, "gemm", "{why}");
    assert!(why.contains("cublas.gemm: forced, but the epilogue does more than store the product"), "{why}");
}

/// The products the device test runs: (what, graph).
fn cases() -> Vec<(String, Graph)> {
    let mut out = vec![];
    for d in [DType::BF16, DType::F16, DType::F32] {
        let n = d.name();
        out.push((format!("{n} small"), matmul(d, &[16, 32], &[32, 24], false, false)));
        out.push((format!("{n} ragged"), matmul(d, &[37, 53], &[53, 29], false, false)));
        out.push((format!("{n} batched"), matmul(d, &[3, 21, 40], &[3, 40, 19], false, false)));
        out.push((format!("{n} shared weight"), matmul(d, &[4, 9, 24], &[24, 40], false, false)));
        out.push((format!("{n} B transposed"), matmul(d, &[2, 3, 17, 32], &[2, 3, 45, 32], true, false)));
    }
    out
}

fn inputs(g: &Graph, seed: usize) -> Vec<Tensor> {
    g.inputs()
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let ty = &g.value(v).ty;
            let shape: Vec<usize> = ty.shape.iter().map(|s| s.fixed().unwrap_or(1)).collect();
            let n: usize = shape.iter().product();
            let vals: Vec<f64> = (0..n).map(|j| ((j * 7919 + i * 131 + seed) % 997) as f64 / 997.0 - 0.5).collect();
            Tensor::from_f64s(ty.dtype, shape, &vals).unwrap()
        })
        .collect()
}

/// Whether the device tests can run here; says why not.
fn device_ready() -> bool {
    if !tilec::cuda::is_available() {
        eprintln!("note: cuBLAS device test skipped: no CUDA GPU");
        return false;
    }
    if let Err(e) = tilec::cuda::cublaslt::CublasLt::load() {
        eprintln!("note: cuBLAS device test skipped: {e}");
        return false;
    }
    true
}

#[test]
fn forced_cublas_products_match_the_interpreter_on_a_gpu() {
    if !device_ready() {
        return;
    }
    for (what, g) in cases() {
        let mut c = tilec::compiled_cuda::compile(&g, &forced()).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(c.report.notes.is_empty(), "{what}: {:?}", c.report.notes);
        let fams: Vec<_> = c.report.decisions.iter().map(|d| d.1.family).collect();
        assert!(fams.contains(&"cublas.gemm"), "{what}: {fams:?}");
        let x = inputs(&g, 1);
        let want = tilec::reference::run(&g, x.clone()).unwrap();
        c.poison().unwrap();
        // Twice: the first run captures a CUDA graph, the second replays it.
        for _ in 0..2 {
            let got = c.run(&x).unwrap_or_else(|e| panic!("{what}: {e}"));
            let (rtol, atol) = if what.starts_with("f32") { (1e-4, 1e-4) } else { (2e-2, 2e-2) };
            let cmp = tilec::compare::compare(&want[0], &got[0], rtol, atol).unwrap();
            assert!(cmp.ok(), "{what}: max abs err {}, {} mismatches", cmp.max_abs, cmp.mismatches);
        }
        eprintln!("{what}: ok");
    }
}

/// Median device time of 20 runs, milliseconds.
fn median_ms(g: &Graph, opts: &CudaOptions) -> (f64, String) {
    let mut c = tilec::compiled_cuda::compile(g, opts).unwrap_or_else(|e| panic!("{e}"));
    let fam = c.report.decisions.iter().map(|d| d.1.family).collect::<Vec<_>>().join(",");
    let x = inputs(g, 2);
    let mut t = c.bench(&x, 20).unwrap();
    t.sort_by(f64::total_cmp);
    (t[t.len() / 2], fam)
}

#[test]
fn cublas_timing_beside_the_default_families_on_a_gpu() {
    if !device_ready() {
        return;
    }
    for (what, g) in [
        ("bf16 4096x4096x4096", matmul(DType::BF16, &[4096, 4096], &[4096, 4096], false, false)),
        ("f16 ragged 2000x3000x1000", matmul(DType::F16, &[2000, 1000], &[1000, 3000], false, false)),
        ("f16 batched 16x512x512x64", matmul(DType::F16, &[16, 512, 64], &[16, 64, 512], false, false)),
        ("f32 1024x1024x1024", matmul(DType::F32, &[1024, 1024], &[1024, 1024], false, false)),
    ] {
        let (base, bf) = median_ms(&g, &Default::default());
        let (lib, lf) = median_ms(&g, &forced());
        eprintln!("timing {what}: default [{bf}] {base:.3} ms, forced [{lf}] {lib:.3} ms");
    }
}
