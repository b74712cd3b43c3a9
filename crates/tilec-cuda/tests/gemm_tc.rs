//! The Hopper GEMM family: rendering for several parameter sets and problem classes, and
//! compilation with NVRTC for sm_90a where the library is found (skipped with a note
//! otherwise: set TILEC_NVRTC_LIB to its path). Runs on a GPU are in `examples/gemm_bench.rs`.

mod common;

use common::*;
use tilec_cuda::gemm::{self, Activation, Epilogue, Layout, Params, Problem};
use tilec_cuda::*;
use tilec_ir::DType;

fn classes() -> Vec<(Problem, Params)> {
    use Layout::{ColMajor as C, RowMajor as R};
    let mut v = vec![];
    for (a, b) in [(R, R), (R, C), (C, R), (C, C)] {
        v.push((
            Problem::new(1000, 1000, 1000, DType::BF16).with_layouts(a, b),
            Params::default(),
        ));
    }
    let mut p = Problem::new(384, 768, 1024, DType::F16).with_layouts(R, C);
    p.out_dtype = DType::F32;
    p.epilogue = Epilogue {
        bias: Some(DType::F32),
        activation: Activation::Relu,
    };
    v.push((
        p,
        Params {
            tile_n: 128,
            stages: 6,
            ..Params::default()
        },
    ));
    let mut p = Problem::new(200, 136, 96, DType::BF16);
    p.batch = 3;
    p.batch_stride_b = 0;
    p.epilogue = Epilogue {
        bias: Some(DType::BF16),
        activation: Activation::Gelu,
    };
    v.push((
        p,
        Params {
            tile_m: 256,
            tile_n: 128,
            ..Params::default()
        },
    ));
    for b in [R, C] {
        let p = Problem::new(1000, 1000, 1000, DType::BF16).with_layouts(R, b);
        v.push((
            p,
            Params {
                cluster_m: 2,
                ..Params::default()
            },
        ));
    }
    let p = Problem::new(16, 8192, 8192, DType::BF16).with_layouts(R, C);
    let q = gemm::heuristic(&p, 132);
    v.push((p, q));
    v
}

#[test]
fn kernels_render_with_wgmma_tma_and_register_reallocation() {
    for (p, q) in classes() {
        assert_eq!(gemm::applies(&p, &q, (9, 0)), Ok(()), "{p:?} {q:?}");
        let src = gemm::render(&p, &q);
        let name = gemm::kernel_name(&p, &q);
        assert!(
            src.contains(&format!("__launch_bounds__({}, 1)\n{name}(", q.threads())),
            "{name}"
        );
        assert!(
            src.contains(&format!("m64n{}k16.f32.{}", q.tile_n, p.in_dtype.name())),
            "{name}"
        );
        assert!(src.contains("cp.async.bulk.tensor.3d"));
        assert!(src.contains("setmaxnreg.dec.sync.aligned.u32 40;"));
        assert!(src.contains("setmaxnreg.inc.sync.aligned.u32 232;"));
        assert!(src.contains("const __grid_constant__ tl_tmap map_a"));
        // One copy per 64-wide box of an MN-major operand, one per tile otherwise.
        // One copy per 64-wide box of an MN-major operand, one per tile otherwise; in a
        // cluster each block copies its share of B to all.
        let copies =
            src.matches("tl_tma_load3(s").count() + src.matches("tl_tma_load3_mc(s").count();
        let cl = q.cluster_m;
        let want = match p.a_layout {
            Layout::RowMajor => 1,
            Layout::ColMajor => q.tile_m / 64,
        } + match p.b_layout {
            Layout::ColMajor => 1,
            Layout::RowMajor => q.tile_n / 64 / cl,
        };
        assert_eq!(copies, want, "{name}");
        assert_eq!(src.contains("__cluster_dims__(2, 1, 1)"), cl == 2, "{name}");
        assert_eq!(
            src.matches("tl_cluster_sync();").count(),
            if cl == 2 { 2 } else { 0 },
            "{name}"
        );
        // The lane that frees a slot frees it in every block of the cluster.
        if cl == 2 {
            assert!(
                src.contains("if (lane == 0) { tl_mbar_arrive_cta("),
                "{name}"
            );
        }
        // Braces balance (the source is assembled from format strings).
        assert_eq!(src.matches('{').count(), src.matches('}').count(), "{name}");
    }
}

#[test]
fn kernels_compile_with_nvrtc_for_sm_90a() {
    let Some(nv) = nvrtc_or_skip("kernels_compile_with_nvrtc_for_sm_90a") else {
        return;
    };
    let c = Compiler::new(nv, "sm_90a").with_cache_dir(None);
    let modules: Vec<(String, String)> = classes()
        .iter()
        .map(|(p, q)| (gemm::kernel_name(p, q), gemm::render(p, q)))
        .collect();
    for (r, (name, _)) in c.compile_many(&modules).into_iter().zip(&modules) {
        let img = r.unwrap_or_else(|e| panic!("{name}: {e}")).image;
        assert!(img.starts_with(b"\x7fELF"), "{name}");
    }
}
