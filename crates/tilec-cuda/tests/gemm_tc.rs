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

/// fp8 (e4m3, e5m2, mixed; scales; fused epilogues; clusters) and tf32 classes.
fn narrow_classes() -> Vec<(Problem, Params)> {
    use Layout::{ColMajor as C, RowMajor as R};
    let mut v = vec![];
    for (a, b, out) in [
        (DType::F8E4M3, None, DType::BF16),
        (DType::F8E5M2, None, DType::F32),
        (DType::F8E4M3, Some(DType::F8E5M2), DType::F16),
    ] {
        let mut p = Problem::new(1000, 1000, 1024, a).with_layouts(R, C);
        p.b_dtype = b;
        p.out_dtype = out;
        p.scale_a = true;
        p.scale_b = b.is_none();
        p.epilogue = Epilogue { bias: Some(DType::F32), activation: Activation::Gelu };
        let q = gemm::heuristic(&p, 132);
        v.push((p, q));
    }
    let p = Problem::new(8192, 8192, 8192, DType::F8E4M3).with_layouts(R, C);
    let q = gemm::heuristic(&p, 132);
    v.push((p.clone(), Params { cluster_m: 2, ..q }));
    v.push((p, Params { tile_m: 64, tile_n: 256, consumers: 1, ..q }));
    let mut t = Problem::new(1000, 1000, 1000, DType::F32).with_layouts(R, C);
    t.tf32 = true;
    let q = gemm::heuristic(&t, 132);
    v.push((t.clone(), q));
    t.out_dtype = DType::BF16;
    t.epilogue = Epilogue { bias: Some(DType::BF16), activation: Activation::Relu };
    v.push((t, Params { tile_n: 128, ..q }));
    v
}

#[test]
fn narrow_kernels_render_k_major_with_their_wgmma() {
    for (p, q) in narrow_classes() {
        assert_eq!(gemm::applies(&p, &q, (9, 0)), Ok(()), "{p:?} {q:?}");
        let src = gemm::render(&p, &q);
        let name = gemm::kernel_name(&p, &q);
        let (k, ta, tb) = match (p.in_dtype, p.b_dtype()) {
            (DType::F32, _) => (8, "tf32", "tf32"),
            (a, b) => (32, if a == DType::F8E4M3 { "e4m3" } else { "e5m2" }, if b == DType::F8E4M3 { "e4m3" } else { "e5m2" }),
        };
        assert!(src.contains(&format!("m64n{}k{k}.f32.{ta}.{tb} {{", q.tile_n)), "{name}");
        // No transpose operands; every copy is one K-major box per operand (per block share).
        assert!(src.contains("p, 1, 1; }"), "{name}");
        let copies = src.matches("tl_tma_load3(s").count() + src.matches("tl_tma_load3_mc(s").count();
        assert_eq!(copies, 2, "{name}");
        assert!(src.contains(&format!("BK = {}", 128 / p.in_dtype.size_bytes())), "{name}");
        assert_eq!(src.contains("ab_scale"), p.scale_a || p.scale_b, "{name}");
        assert_eq!(src.matches('{').count(), src.matches('}').count(), "{name}");
    }
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

/// Compiles every class's kernel for sm_90a with NVRTC (skipped with a note without NVRTC).
fn compile_all(test: &str, classes: impl IntoIterator<Item = (Problem, Params)>) {
    let Some(nv) = nvrtc_or_skip(test) else {
        return;
    };
    let c = Compiler::new(nv, "sm_90a").with_cache_dir(None);
    let modules: Vec<(String, String)> = classes.into_iter().map(|(p, q)| (gemm::kernel_name(&p, &q), gemm::render(&p, &q))).collect();
    for (r, (name, _)) in c.compile_many(&modules).into_iter().zip(&modules) {
        let img = r.unwrap_or_else(|e| panic!("{name}: {e}")).image;
        assert!(img.starts_with(b"\x7fELF"), "{name}");
    }
}

#[test]
fn kernels_compile_with_nvrtc_for_sm_90a() {
    compile_all("kernels_compile_with_nvrtc_for_sm_90a", classes().into_iter().chain(narrow_classes()));
}

/// A custom epilogue storing C (`[m][n]` of `out`), with the vector function where asked, and
/// rounding its accumulator to `out` first where that is 16-bit (as a model's does after a
/// 16-bit MatMul).
fn store_epilogue(n: usize, out: DType, vector: bool) -> gemm::CustomEpilogue {
    let (ty, st) = match out {
        DType::F16 => ("tl_f16", "tl_st_f16(v)"),
        DType::BF16 => ("tl_bf16", "tl_st_bf16(v)"),
        _ => ("float", "v"),
    };
    let mut source = format!("__device__ __forceinline__ void f({ty}* o, long long b, long long r, long long c, float v) {{ o[r * {n} + c] = {st}; }}\n");
    if vector {
        source.push_str(&format!(
            "__device__ __forceinline__ void fv({ty}* o, long long b, long long r, long long cv, const float* a) {{\n  for (int l = 0; l < 8; ++l) {{ const float v = a[l]; o[r * {n} + cv * 8 + l] = {st}; }}\n}}\n"
        ));
    }
    gemm::CustomEpilogue {
        loads: false,
        name: "f".into(),
        source,
        params: vec![format!("{ty}* __restrict__ o")],
        rows: None,
        rounds_to: matches!(out, DType::F16 | DType::BF16).then_some(out),
        vector: vector.then(|| "fv".to_string()),
    }
}

/// The staged epilogue on every tile shape the heuristic and the tuner can pick (64, 128 and
/// 256 rows by 64 to 256 columns, one or two consumers, ping-pong, clusters), each with the
/// epilogue parked in 16 bits through a custom vector function, and in turn with the other
/// epilogues: a custom one element per call, the built-in bias and GELU (16-bit C: parked in
/// 16 bits), f32 C (parked f32), a custom epilogue that does not round first (f32), 16-bit
/// parking turned off, fp8 with scales into a rounding epilogue (parked in 16 bits, scaled
/// first). Ragged shapes (N not a multiple of 8) are run-time arguments of the same sources.
fn staged_classes() -> Vec<(Problem, Params)> {
    use Layout::{ColMajor as C, RowMajor as R};
    let st = Params { staged: true, ..Params::default() };
    let mut shapes = vec![];
    for (tile_m, consumers) in [(64, 1), (128, 1), (128, 2), (256, 2)] {
        for tile_n in [64, 128, 192, 256] {
            let q = Params { tile_m, tile_n, consumers, stages: 2, ..st };
            if q.validate().is_ok() {
                shapes.push(q);
            }
        }
    }
    for tile_n in [64, 128] {
        shapes.push(Params { tile_m: 128, tile_n, pingpong: true, stages: 4, ..st });
    }
    shapes.push(Params { cluster_m: 2, ..st });
    shapes.push(Params { tile_m: 64, tile_n: 128, consumers: 1, cluster_m: 2, stages: 4, ..st });
    let mut v = vec![];
    for (i, q) in shapes.into_iter().enumerate() {
        let (d, a, b) = [(DType::F16, R, C), (DType::BF16, R, R), (DType::F16, C, R), (DType::BF16, C, C)][i % 4];
        let mut p = Problem::new(1000, 1000, 1000, d).with_layouts(a, b);
        p.custom = Some(store_epilogue(1000, d, true));
        assert_eq!(gemm::park_dtype(&p, &q), Some(d));
        v.push((p.clone(), q));
        let other = match i % 6 {
            0 => {
                p.custom = Some(store_epilogue(1000, d, false));
                p
            }
            1 => {
                p.custom = None;
                p.epilogue = Epilogue { bias: Some(DType::F32), activation: Activation::Gelu };
                p
            }
            2 => {
                p.custom = None;
                p.out_dtype = DType::F32;
                p.epilogue = Epilogue { bias: Some(d), activation: Activation::Relu };
                p
            }
            3 => {
                p.custom = Some(gemm::CustomEpilogue { rounds_to: None, ..store_epilogue(1000, DType::F32, true) });
                p
            }
            4 => {
                let q = Params { park16: false, ..q };
                assert_eq!(gemm::park_dtype(&p, &q), None);
                v.push((p, q));
                continue;
            }
            _ => {
                let mut f = Problem::new(1000, 1000, 1024, DType::F8E4M3).with_layouts(R, C);
                f.scale_a = true;
                f.scale_b = true;
                f.custom = Some(store_epilogue(1000, DType::BF16, true));
                let q = Params { tile_k: 128, ..q };
                assert_eq!(gemm::park_dtype(&f, &q), Some(DType::BF16));
                v.push((f, q));
                continue;
            }
        };
        v.push((other, q));
    }
    v
}

#[test]
fn staged_epilogues_render_their_parking() {
    let classes = staged_classes();
    assert!(classes.len() >= 30, "{}", classes.len());
    for (p, q) in &classes {
        assert_eq!(gemm::applies(p, q, (9, 0)), Ok(()), "{p:?} {q:?}");
        let src = gemm::render(p, q);
        let name = gemm::kernel_name(p, q);
        assert_eq!(src.matches('{').count(), src.matches('}').count(), "{name}");
        match gemm::park_dtype(p, q) {
            Some(d) => {
                let t = if d == DType::F16 { "f16" } else { "bf16" };
                assert!(name.contains("_sth"), "{name}");
                assert!(src.contains(&format!("tl_pack_{t}x2(acc[0][4 * (ch * 4 + qq) + 2 * h]")), "{name}");
                assert!(src.contains("unsigned* tl_s = tl_sh + (ch & 1) * 256;"), "{name}");
                // One barrier per chunk: the second slice takes the next chunk.
                assert_eq!(src.matches("__syncwarp();").count(), q.warp_m() / 64, "{name}");
                let vector = p.custom.as_ref().is_some_and(|c| c.vector.is_some());
                assert_eq!(src.contains("const uint4 tl_w ="), vector, "{name}");
                assert!(!src.contains("float* tl_st ="), "{name}");
            }
            None => {
                assert!(name.contains("_st") && !name.contains("_sth"), "{name}");
                assert!(src.contains("float* tl_st = (float*)tl_dyn_stage") && !src.contains("tl_pack_"), "{name}");
            }
        }
        // Two 1 KiB slices for each of up to 8 consumer warps fit the staging area.
        assert!(8 * 2 * 1024 <= gemm::STAGING_BYTES && q.smem_bytes() <= gemm::MAX_SMEM);
    }
    // The variants are told apart by name (the kernel cache keys on it).
    let (p, q) = &classes[0];
    assert_ne!(gemm::kernel_name(p, q), gemm::kernel_name(p, &Params { park16: false, ..*q }));
}

#[test]
fn staged_epilogues_compile_with_nvrtc_for_sm_90a() {
    compile_all("staged_epilogues_compile_with_nvrtc_for_sm_90a", staged_classes());
}

/// FNV-1a of a string: stable across runs and builds.
fn fnv(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The 16-bit problem classes render exactly the source they rendered before fp8 and tf32
/// were added (hashes taken then), custom epilogues and split A included; the one class on
/// heuristic parameters has since taken the staged epilogue (`_st`), then parked in 16 bits
/// (`_sth`), then the shuffled epilogue (`_sx`; hash retaken each time). All were retaken
/// once when the shared prelude gained the 16-byte global access helpers, once when the
/// loops over K took a unit's range (`kb_lo..kb_hi`, for stream-K), and once when the 16-byte
/// load became a plain load, cluster arrivals lost their cluster-scope release and the
/// shuffled epilogue gained its interior copy, and once when the prelude gained the fast GELU
/// in tanh form; the shuffled class's once more when its helpers gained the half shift of
/// the row stores.
#[test]
fn sixteen_bit_sources_are_unchanged() {
    let mut all = classes();
    let mut p = Problem::new(1024, 768, 768, DType::F16);
    p.lda = Some(64);
    p.a_split = Some(gemm::ASplit { rows: 512, head_stride: 512 * 64, group_stride: 12 * 512 * 64 });
    all.push((p, Params::default()));
    let mut p = Problem::new(1024, 256, 64, DType::BF16).with_layouts(Layout::RowMajor, Layout::ColMajor);
    p.custom = Some(gemm::CustomEpilogue {
        loads: false,
        name: "f".into(),
        source: "__device__ void f(float* o, long long b, long long r, int c, float v) { o[r * 256 + c] = v; }\n".into(),
        params: vec!["float* __restrict__ o".into()],
        rows: Some(256),
        rounds_to: None,
        vector: None,
    });
    all.push((p, Params { tile_n: 128, stages: 6, ..Params::default() }));
    let got: Vec<String> = all
        .iter()
        .map(|(p, q)| format!("{:016x} {}", fnv(&gemm::render(p, q)), gemm::kernel_name(p, q)))
        .collect();
    let want = EXPECTED_HASHES.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>();
    assert_eq!(got, want, "\n{}", got.join("\n"));
}

const EXPECTED_HASHES: &str = "
2853f2c60283c312 tl_gemm_sm90_bf16rr_bf16_128x256x64_s4_c2_g8_r40x232
0abf61f0d63a8922 tl_gemm_sm90_bf16rc_bf16_128x256x64_s4_c2_g8_r40x232
4b73365503087d88 tl_gemm_sm90_bf16cr_bf16_128x256x64_s4_c2_g8_r40x232
42995ec7269845d4 tl_gemm_sm90_bf16cc_bf16_128x256x64_s4_c2_g8_r40x232
2c944d9801eeab36 tl_gemm_sm90_f16rc_f32_128x128x64_s6_c2_g8_r40x232_biasf32_relu
cb9e6b434f30978a tl_gemm_sm90_bf16rr_bf16_256x128x64_s4_c2_g8_r40x232_biasbf16_gelu_bcb
400b450c1e969a9b tl_gemm_sm90_bf16rr_bf16_128x256x64_s4_c2_g8_r40x232_k2
3015361d05dedc6e tl_gemm_sm90_bf16rc_bf16_128x256x64_s4_c2_g8_r40x232_k2
5b86613db5a9e808 tl_gemm_sm90_bf16rc_bf16_64x64x64_s8_c1_g8_r40x232_sx
60f0660c7ba38973 tl_gemm_sm90_f16rr_f16_128x256x64_s4_c2_g8_r40x232_as
2b8fb4588202e9a9 tl_gemm_sm90_bf16rc_bf16_128x128x64_s6_c2_g8_r40x232_e9286d69871787cfb
";

/// The shuffled epilogue on the tile shapes of [`staged_classes`] with the epilogues it takes:
/// a custom one with its vector function (16-bit, and f32 without rounding first), the built-in
/// bias and GELU into 16 bits, the built-in f32 store with ReLU, fp8 with scales. A custom
/// epilogue without a vector function keeps the staged one.
fn shuffled_classes() -> Vec<(Problem, Params)> {
    use Layout::{ColMajor as C, RowMajor as R};
    let mut v = vec![];
    for (i, (p, q)) in staged_classes().into_iter().enumerate() {
        if i % 2 == 1 || p.in_dtype == DType::F8E4M3 {
            continue;
        }
        let q = Params { staged: false, shuffle: true, ..q };
        let d = p.in_dtype;
        v.push((p.clone(), q));
        let mut other = p.clone();
        match (i / 2) % 4 {
            0 => {
                other.custom = None;
                other.epilogue = Epilogue { bias: Some(DType::F32), activation: Activation::Gelu };
            }
            1 => {
                other.custom = None;
                other.out_dtype = DType::F32;
                other.epilogue = Epilogue { bias: Some(d), activation: Activation::Relu };
            }
            2 => other.custom = Some(gemm::CustomEpilogue { rounds_to: None, ..store_epilogue(1000, DType::F32, true) }),
            _ => {
                other = Problem::new(1000, 1000, 1024, DType::F8E4M3).with_layouts(R, C);
                other.scale_a = true;
                other.scale_b = true;
                other.custom = Some(store_epilogue(1000, DType::BF16, true));
                v.push((other, Params { tile_k: 128, ..q }));
                continue;
            }
        }
        v.push((other, q));
    }
    v
}

#[test]
fn shuffled_epilogues_render_their_exchanges() {
    let classes = shuffled_classes();
    assert!(classes.len() >= 16, "{}", classes.len());
    for (p, q) in &classes {
        assert_eq!(gemm::applies(p, q, (9, 0)), Ok(()), "{p:?} {q:?}");
        assert!(gemm::shuffled(p, q) && gemm::park_dtype(p, q).is_none());
        let src = gemm::render(p, q);
        let name = gemm::kernel_name(p, q);
        assert!(name.ends_with("_sx") || name.contains("_sx_e"), "{name}");
        assert_eq!(src.matches('{').count(), src.matches('}').count(), "{name}");
        // Four exchanges per 64-row block, in the interior tiles' copy of the loop and in the
        // edge tiles' one; no shared memory and no warp barrier.
        assert_eq!(src.matches("tl_quad_swap(tl_x").count(), 2 * 4 * q.warp_m() / 64, "{name}");
        assert!(src.contains(&format!("if (m0 + {} <= M && n0 + {} <= N) {{", q.tile_m, q.tile_n)), "{name}");
        assert!(!src.contains("__syncwarp();") && !src.contains("tl_dyn_stage"), "{name}");
        match &p.custom {
            Some(c) => assert!(src.contains(&format!("{}(o, eb, er, col / 8, tl_v);", c.vector.as_deref().unwrap_or("?"))), "{name}"),
            None => assert!(src.contains("if (tl_vec && col + 8 <= N)") && src.contains("if (tl_vec) {"), "{name}"),
        }
    }
    // Without a vector function the staged epilogue stays.
    let (mut p, q) = classes[0].clone();
    p.custom = Some(store_epilogue(1000, p.in_dtype, false));
    assert!(!gemm::shuffled(&p, &q) && !gemm::render(&p, &q).contains("tl_quad_swap(tl_x"));
    // The heuristic takes it wherever it applies.
    let (p, _) = &classes[0];
    assert!(gemm::heuristic(p, 132).shuffle && !gemm::heuristic(p, 132).staged);
    assert!(gemm::heuristic(&p.clone(), 132).smem_bytes() <= gemm::MAX_SMEM);
}

#[test]
fn shuffled_epilogues_compile_with_nvrtc_for_sm_90a() {
    compile_all("shuffled_epilogues_compile_with_nvrtc_for_sm_90a", shuffled_classes());
}

/// Stream-K on the staged and shuffled classes that take it (no ping-pong, no clusters):
/// 16-bit, fp8 and tf32 operands, built-in and custom epilogues, a convolution.
fn stream_k_classes() -> Vec<(Problem, Params)> {
    let mut v: Vec<(Problem, Params)> = staged_classes()
        .into_iter()
        .chain(shuffled_classes())
        .filter(|(_, q)| !q.pingpong && q.cluster_m == 1)
        .map(|(p, q)| (p, Params { stream_k: true, ..q }))
        .collect();
    let mut t = Problem::new(500, 300, 700, DType::F32).with_layouts(Layout::RowMajor, Layout::ColMajor);
    t.tf32 = true;
    v.push((t, Params { tile_k: 32, tile_n: 128, stream_k: true, ..Params::default() }));
    let g = gemm::ConvGeom { n: 2, h: 9, w: 7, c: 64, kh: 3, kw: 3, oh: 9, ow: 7, stride: (1, 1), pad: (1, 1), dil: (1, 1), nchw_input: false };
    let c = Problem::for_conv(g, 128, DType::F16);
    v.push((c, Params { tile_n: 128, stream_k: true, ..Params::default() }));
    v
}

#[test]
fn stream_k_kernels_render_their_fixup() {
    let classes = stream_k_classes();
    assert!(classes.len() >= 12, "{}", classes.len());
    for (p, q) in &classes {
        assert_eq!(gemm::applies(p, q, (9, 0)), Ok(()), "{p:?} {q:?}");
        let src = gemm::render(p, q);
        let name = gemm::kernel_name(p, q);
        assert!(name.contains("_sk"), "{name}");
        assert_eq!(src.matches('{').count(), src.matches('}').count(), "{name}");
        // Producer and consumers walk the same units; a parked part skips the epilogue.
        assert_eq!(src.matches("tl_sk_next(sk, u_t, u_pos, t, kb_lo, kb_hi)").count(), 2, "{name}");
        assert!(src.contains("float* __restrict__ sk_ws") && src.contains("bar.sync 3, ") && src.contains("continue;"), "{name}");
        // Each accumulator parked and added once per 4.
        let parked = src.matches("__stcg(part + ").count();
        assert_eq!(parked, q.tile_m * q.tile_n / q.threads().saturating_sub(128) / 4, "{name}");
        assert_eq!(src.matches("__ldcg(part + ").count(), parked, "{name}");
        let plain = gemm::render(p, &Params { stream_k: false, ..*q });
        assert!(!plain.contains("tl_sk") && !plain.contains("sk_ws"), "{name}");
    }
    // Not with ping-pong or clusters.
    for q in [Params { pingpong: true, tile_n: 128, stream_k: true, ..Params::default() }, Params { cluster_m: 2, stream_k: true, ..Params::default() }] {
        assert!(q.validate().is_err(), "{q:?}");
    }
}

#[test]
fn stream_k_kernels_compile_with_nvrtc_for_sm_90a() {
    compile_all("stream_k_kernels_compile_with_nvrtc_for_sm_90a", stream_k_classes());
}
