//! The GEMV family's sources compile with NVRTC for sm_90a and sm_80, register and
//! shared-memory main loops alike, on ragged shapes, both weight layouts, splits and batches
//! (no GPU needed; skipped with a note when NVRTC is not found: set TILEC_NVRTC_LIB). Runs on a
//! GPU are in `examples/gemv_bench.rs`.

mod common;

use common::nvrtc_or_skip;
use tilec_cuda::families::OperandRef;
use tilec_cuda::gemm::{CustomEpilogue, Layout, Problem};
use tilec_cuda::gemv::{self, Params};
use tilec_cuda::Compiler;
use tilec_ir::DType;

const A: OperandRef = OperandRef { param: 0, offset_bytes: 0 };
const B: OperandRef = OperandRef { param: 1, offset_bytes: 0 };

fn problem(m: usize, n: usize, k: usize, batch: usize, b: Layout, dt: DType) -> Problem {
    let mut p = Problem::new(m, n, k, dt).with_layouts(Layout::RowMajor, b);
    let ty = if dt == DType::F16 { "tl_f16" } else { "tl_bf16" };
    p.batch = batch;
    if batch > 1 {
        p.batch_stride_a = m * k.next_multiple_of(8);
        p.batch_stride_b = if b == Layout::ColMajor { n * k.next_multiple_of(8) } else { 0 };
    }
    p.lda = Some(k.next_multiple_of(8));
    p.ldb = Some(if b == Layout::ColMajor { k.next_multiple_of(8) } else { n });
    p.custom = Some(CustomEpilogue {
        loads: false,
        name: "f".into(),
        source: format!("__device__ __forceinline__ void f(const {ty}* a, const {ty}* b, float* o, long long bz, long long r, long long c, float v) {{ o[(bz * {m} + r) * {n} + c] = v; }}\n"),
        params: vec![format!("const {ty}* __restrict__ a"), format!("const {ty}* __restrict__ b"), "float* __restrict__ o".into()],
        rows: None,
        rounds_to: None,
        vector: None,
    });
    p
}

fn cases() -> Vec<(Problem, Params)> {
    let d = Params::default();
    let mut v = vec![];
    for (m, n, k, batch) in [(16, 8192, 8192, 1), (1, 203, 1000, 1), (9, 100, 33, 1), (8, 13, 7, 1), (3, 72, 1000, 5)] {
        for b in [Layout::ColMajor, Layout::RowMajor] {
            if batch > 1 && b == Layout::RowMajor {
                continue;
            }
            let dt = if m % 2 == 0 { DType::BF16 } else { DType::F16 };
            let p = problem(m, n, k, batch, b, dt);
            let h = gemv::heuristic(&p, 132);
            v.push((p.clone(), h));
            v.push((p.clone(), Params { a_ahead: true, ..h }));
            if batch == 1 {
                v.push((p.clone(), Params { tiled: true, ..h }));
                v.push((p.clone(), Params { tiled: true, a_ahead: true, ..h }));
                // Weights requested before the wait for the previous kernel.
                v.push((p.clone(), Params { tiled: true, a_ahead: true, unroll: 4, early: 3, ..h }));
                v.push((p.clone(), Params { tiled: true, early: 1, ..h }));
            }
            if b == Layout::RowMajor {
                v.push((p.clone(), Params { early: 4, ..h }));
            }
            for st in [Params { stages: 3, ..d }, Params { stages: 3, unroll: 4, cols: 2, ..d }, Params { stages: 2, warps_k: 4, warps_n: 2, ..d }] {
                let q = Params { split_k: gemv::split_for(&p, &st, 132), ..st };
                v.push((p.clone(), q));
            }
        }
    }
    v
}

#[test]
fn gemv_kernels_compile_with_nvrtc() {
    let Some(nv) = nvrtc_or_skip("gemv_kernels_compile_with_nvrtc") else {
        return;
    };
    let cases = cases();
    for arch in ["sm_90a", "sm_80"] {
        let c = Compiler::new(nv.clone(), arch).with_cache_dir(None);
        let mut modules = vec![];
        for (p, q) in &cases {
            gemv::applies(p, q, (9, 0)).unwrap_or_else(|e| panic!("{q:?} on {}x{}x{}: {e}", p.m, p.n, p.k));
            let src = gemv::render(p, q, &A, &B);
            assert_eq!(src.matches('{').count(), src.matches('}').count(), "{q:?}");
            if q.tiled {
                assert!(src.contains("_repack(") && src.contains("B = tl_bpk"), "{q:?}");
                assert!(src.contains("bc[j] + kc * 256"), "{q:?}");
            }
            if q.stages >= 2 {
                assert!(src.contains("cp.async.cg.shared.global"), "{q:?}");
                assert!(src.contains(&format!("tl_gv_wait_{}();", q.stages - 2)), "{q:?}");
            }
            modules.push((gemv::kernel_name(p, q, &A, &B), src));
        }
        for (r, (name, src)) in c.compile_many(&modules).into_iter().zip(&modules) {
            let img = r.unwrap_or_else(|e| panic!("{arch} {name}: {e}\n{src}")).image;
            assert!(img.starts_with(b"\x7fELF"), "{name}");
        }
    }
}

#[test]
fn staged_parameters_are_checked() {
    let p = problem(16, 4096, 4096, 1, Layout::ColMajor, DType::BF16);
    let d = Params::default();
    assert!(Params { stages: 1, ..d }.validate().is_err());
    assert!(Params { stages: 9, ..d }.validate().is_err());
    // Registers bound the register loop's loads, not the staged loop's.
    assert!(Params { cols: 4, unroll: 8, ..d }.validate().is_err());
    assert_eq!(Params { cols: 4, unroll: 8, stages: 3, ..d }.validate(), Ok(()));
    // Tiled weights are for the register loop, and one B shared by the batches.
    assert!(Params { tiled: true, stages: 3, ..d }.validate().is_err());
    let mut batched = problem(4, 300, 520, 3, Layout::ColMajor, DType::BF16);
    assert_eq!(gemv::applies(&batched, &Params { tiled: true, ..d }, (9, 0)), Err("tiled weights are repacked once: B must be one matrix shared by every batch".into()));
    batched.batch_stride_b = 0;
    assert_eq!(gemv::applies(&batched, &Params { tiled: true, ..d }, (9, 0)), Ok(()));
    assert_eq!(gemv::packed_len(&problem(9, 100, 33, 1, Layout::ColMajor, DType::F16), &Params { tiled: true, ..d }), 104 * 64);
    // More splits than stages of K.
    let q = Params { stages: 3, unroll: 8, warps_k: 2, split_k: 9, ..d };
    assert_eq!(gemv::staged::stages_of(&p, &q), 8);
    assert!(gemv::applies(&p, &q, (9, 0)).unwrap_err().contains("8 stages"));
    // Stages that do not fit in shared memory.
    let big = Params { stages: 8, unroll: 8, warps_k: 2, warps_n: 8, cols: 4, ..d };
    assert!(gemv::applies(&p, &big, (9, 0)).unwrap_err().contains("shared memory"));
    // The staged ring is part of the dynamic shared memory.
    let st = Params { stages: 4, ..d };
    assert_eq!(gemv::smem_bytes(&p, &st), 4 * (64 + 16) * (2 * 128 + 64));
}
