//! Checks and times the `mma.sync` GEMM family (matrix products and implicit-GEMM
//! convolutions) on a GPU.
//!
//! Usage: `mma_bench check|bench [--iters N] [--only SUBSTRING] [--dump DIR]`
//! - `check`: small and ragged shapes over the layouts, batching, split-K, and convolutions
//!   (strides, padding, dilation, few channels): fresh random inputs, the output poisoned with
//!   NaN first, compared with an f64 reference on the CPU (every element of small problems,
//!   samples of large ones).
//! - `bench`: decode-shaped and LLM products and the 53 convolutions of ResNet-50 at batch 64
//!   (channels-last, f16), timed (median of `--iters` runs, CUDA events) and checked on samples.
//!
//! `BENCH_FAMILY=sm90` runs the cases the Hopper template takes on it instead (convolutions
//! through the im2col copy; the others are reported as not applying); `BENCH_FAMILY=auto` runs
//! each convolution on the template model dispatch picks. `SM90_PARK=32` makes the Hopper
//! template's staged epilogue park the accumulators as f32 where it would park them in 16
//! bits (the `park16` cases of `check` and 16-bit outputs: compare in one run); `MMA_PARK=32`
//! likewise for the mma.sync template. `EPI_RES=1` gives every case a residual operand of C's
//! shape and dtype that the epilogue adds (as a model's products with a fused residual add
//! do; the vector function loads 8 of it at a time with `tl_ld_v4`), checked like the rest.
//! `EPI_GELU=1` applies GELU (tanh form) to each value before the store, likewise checked.
//!
//! Prints one JSON object per line.

use std::fmt::Write as _;
use serde_json::json;
use tilec_cuda::families::{FamilyKernel, FamilyPlan, OperandRef, PlanKind, HOPPER_GEMM, MMA_GEMM, NARROW_CONV_N, SHALLOW_CONV_K};
use tilec_cuda::gemm::{self, CustomEpilogue, Layout, Problem};
use tilec_cuda::mma::{self, ConvGeom, MmaProblem, Params};
use tilec_cuda::*;
use tilec_ir::DType;

mod common;
use common::{from_bits, to_bits, Rng};

#[derive(Clone)]
enum Shape {
    /// m, n, k, batch, layouts, padded leading dimensions.
    Gemm { m: usize, n: usize, k: usize, batch: usize, a: Layout, b: Layout, lda: usize, ldb: usize },
    Conv { g: ConvGeom, o: usize },
}

struct Case {
    label: String,
    dtype: DType,
    out: DType,
    shape: Shape,
    params: Option<Params>,
    /// Parameters for the Hopper template (under `BENCH_FAMILY=sm90`) instead of its heuristic.
    sm90: Option<gemm::Params>,
    /// A vector epilogue function even where N is not a multiple of 8 (storing element by
    /// element): the templates' right edge of whole-vector epilogues.
    edge_vec: bool,
    time: bool,
}

use Layout::{ColMajor as C, RowMajor as R};

fn gemm(m: usize, n: usize, k: usize, batch: usize, a: Layout, b: Layout) -> Shape {
    let lda = if a == R { k.next_multiple_of(8) } else { m.next_multiple_of(8) };
    let ldb = if b == R { n.next_multiple_of(8) } else { k.next_multiple_of(8) };
    Shape::Gemm { m, n, k, batch, a, b, lda, ldb }
}

#[allow(clippy::too_many_arguments)]
fn conv(n: usize, h: usize, c: usize, o: usize, kk: usize, s: usize, p: usize, d: usize) -> Shape {
    let oh = (h + 2 * p - d * (kk - 1) - 1) / s + 1;
    Shape::Conv { g: ConvGeom { n, h, w: h, c, kh: kk, kw: kk, oh, ow: oh, stride: (s, s), pad: (p, p), dil: (d, d), nchw_input: false }, o }
}

fn check_cases() -> Vec<Case> {
    let mut v = vec![];
    let mut add = |label: &str, dtype: DType, shape: Shape, params: Option<Params>| {
        v.push(Case { label: label.into(), dtype, out: DType::F32, shape, params, sm90: None, edge_vec: false, time: false })
    };
    for (a, b) in [(R, C), (R, R), (C, C), (C, R)] {
        add("layouts", DType::BF16, gemm(296, 200, 136, 1, a, b), None);
        add("ragged", DType::F16, gemm(291, 203, 130, 1, a, b), None);
    }
    add("batched", DType::BF16, gemm(72, 136, 200, 3, R, R), None);
    add("batched_cc", DType::F16, gemm(100, 64, 96, 2, C, C), None);
    add("m16_split", DType::BF16, gemm(16, 1000, 2048, 1, R, C), Some(Params { tile_m: 16, tile_n: 128, warps_m: 1, warps_n: 4, stages: 6, split_k: 4, ..Params::default() }));
    add("m5_split_rr", DType::BF16, gemm(5, 520, 1000, 1, R, R), Some(Params { tile_m: 16, tile_n: 128, warps_m: 1, warps_n: 4, stages: 4, split_k: 5, ..Params::default() }));
    add("m1", DType::F16, gemm(1, 777, 512, 1, R, C), None);
    add("heuristic_skinny", DType::BF16, gemm(16, 4096, 4096, 1, R, C), None);
    add("big_tile", DType::BF16, gemm(300, 520, 264, 1, R, C), Some(Params { tile_n: 256, stages: 3, ..Params::default() }));
    add("tile_64", DType::F16, gemm(300, 520, 264, 1, C, R), Some(Params { tile_m: 64, tile_n: 64, warps_m: 2, warps_n: 2, stages: 5, ..Params::default() }));
    add("conv3x3", DType::F16, conv(2, 9, 16, 32, 3, 1, 1, 1), None);
    add("conv3x3_s2", DType::BF16, conv(3, 15, 8, 64, 3, 2, 1, 1), None);
    add("conv_stem_c3", DType::F16, conv(2, 23, 3, 64, 7, 2, 3, 1), None);
    // Four channels a pixel (8-byte copies): a padded stem, and a ragged 3x3.
    add("conv_stem_c4", DType::F16, conv(2, 23, 4, 64, 7, 2, 3, 1), None);
    add("conv_c4_ragged", DType::BF16, conv(3, 13, 12, 40, 3, 2, 1, 1), None);
    add("conv1x1_s2", DType::F16, conv(2, 14, 64, 128, 1, 2, 0, 1), None);
    add("conv_dil2", DType::BF16, conv(1, 17, 24, 40, 3, 1, 2, 2), None);
    add("conv_ragged", DType::F16, conv(3, 11, 40, 72, 3, 1, 0, 1), Some(Params { tile_m: 64, tile_n: 64, warps_m: 2, warps_n: 2, ..Params::default() }));
    if let Shape::Conv { g, o } = conv(2, 12, 16, 32, 3, 1, 1, 1) {
        add("conv_nchw_input", DType::F16, Shape::Conv { g: ConvGeom { nchw_input: true, ..g }, o }, None);
    }
    add("k128_ragged", DType::BF16, gemm(291, 203, 330, 1, R, C), Some(Params { tile_k: 128, stages: 3, ..Params::default() }));
    add("k256_cr", DType::F16, gemm(200, 136, 600, 1, C, R), Some(Params { tile_k: 256, tile_n: 64, warps_m: 4, warps_n: 2, stages: 2, ..Params::default() }));
    add("k256_m16_split", DType::BF16, gemm(16, 520, 4096, 1, R, C), Some(Params { tile_m: 16, tile_n: 64, warps_m: 1, warps_n: 4, stages: 4, split_k: 4, tile_k: 256, ..Params::default() }));
    add("k128_conv", DType::F16, conv(2, 9, 40, 64, 3, 1, 1, 1), Some(Params { tile_k: 128, tile_n: 64, warps_m: 4, warps_n: 2, stages: 3, ..Params::default() }));
    // Channels in multiples of 64 (the Hopper template's im2col copy takes these too):
    // padding, strides, dilation, 1x1, ragged output channels and pixel counts, several images.
    add("conv64_3x3", DType::F16, conv(2, 13, 64, 64, 3, 1, 1, 1), None);
    add("conv64_3x3_s2_o72", DType::BF16, conv(3, 15, 128, 72, 3, 2, 1, 1), None);
    add("conv64_1x1", DType::F16, conv(2, 10, 64, 256, 1, 1, 0, 1), None);
    add("conv64_1x1_s2", DType::F16, conv(2, 14, 128, 128, 1, 2, 0, 1), None);
    add("conv64_dil2_p0", DType::BF16, conv(1, 17, 64, 96, 3, 1, 0, 2), None);
    add("conv64_5x5_p2", DType::F16, conv(2, 9, 64, 136, 5, 1, 2, 1), None);
    add("conv64_7x7_s2_p3", DType::F16, conv(1, 23, 64, 64, 7, 2, 3, 1), None);
    // The epilogue from registers (no staging), ragged and split.
    add("unstaged_ragged", DType::F16, gemm(291, 203, 130, 1, R, C), Some(Params { staged: false, ..Params::default() }));
    add("unstaged_conv_split", DType::F16, conv(1, 7, 64, 72, 3, 1, 1, 1), Some(Params { tile_m: 64, tile_n: 64, warps_m: 2, warps_n: 2, split_k: 3, staged: false, ..Params::default() }));
    add("conv_split", DType::F16, conv(1, 7, 512, 512, 3, 1, 1, 1), Some(Params { tile_m: 64, tile_n: 128, warps_m: 2, warps_n: 2, split_k: 6, ..Params::default() }));
    v.extend(park16_cases());
    v
}

/// 16-bit outputs (the Hopper template's staged epilogue parks them in 16 bits) on every tile
/// shape it takes: ragged M and N, N a multiple of 8 or not (the vector epilogue and its right
/// edge, or one element per call), more tiles than blocks (chunks running on across tiles).
fn park16_cases() -> Vec<Case> {
    let st = gemm::Params { staged: true, ..gemm::Params::default() };
    let shapes: [(&str, gemm::Params); 7] = [
        ("128x256", st),
        ("128x128_pp", gemm::Params { tile_n: 128, pingpong: true, ..st }),
        ("128x256_k2", gemm::Params { cluster_m: 2, stages: 3, ..st }),
        ("256x128", gemm::Params { tile_m: 256, tile_n: 128, stages: 3, ..st }),
        ("64x64", gemm::Params { tile_m: 64, tile_n: 64, consumers: 1, stages: 8, ..st }),
        ("64x192", gemm::Params { tile_m: 64, tile_n: 192, consumers: 1, stages: 5, ..st }),
        ("128x64_pp", gemm::Params { tile_m: 128, tile_n: 64, pingpong: true, stages: 6, ..st }),
    ];
    let mut v = vec![];
    for (i, (name, q)) in shapes.into_iter().enumerate() {
        let (dtype, a, b) = [(DType::F16, R, C), (DType::BF16, R, R), (DType::F16, C, R), (DType::BF16, C, C)][i % 4];
        for (what, shape, edge_vec) in [
            ("ragged", gemm(291, 203, 136, 1, a, b), false),
            ("edge_vec", gemm(291, 203, 136, 1, a, b), true),
            ("vec", gemm(300, 520, 200, 1, a, b), false),
            ("tiles", gemm(4133, 2000, 72, 1, a, b), false),
        ] {
            let label = format!("park16_{name}_{what}_{}", dtype.name());
            v.push(Case { label, dtype, out: dtype, shape, params: None, sm90: Some(q), edge_vec, time: false });
        }
    }
    // The heuristic's choice, f16 into bf16 (a custom epilogue rounding to bf16).
    v.push(Case { label: "park16_heuristic_f16_bf16".into(), dtype: DType::F16, out: DType::BF16, shape: gemm(1000, 777, 264, 1, R, C), params: None, sm90: None, edge_vec: true, time: false });
    v
}

/// The 53 convolutions of ResNet-50 (torchvision): (input size, in, out, kernel, stride).
fn resnet50_convs() -> Vec<(usize, usize, usize, usize, usize)> {
    let mut v = vec![(224, 3, 64, 7, 2)];
    let mut cin = 64;
    for (blocks, width, size, stride) in [(3, 64, 56, 1), (4, 128, 56, 2), (6, 256, 28, 2), (3, 512, 14, 2)] {
        let out = width * 4;
        for b in 0..blocks {
            let (s, at) = if b == 0 { (stride, size) } else { (1, size / stride) };
            v.push((at, cin, width, 1, 1));
            v.push((at, width, width, 3, s));
            v.push((at / s, width, out, 1, 1));
            if b == 0 {
                v.push((at, cin, out, 1, s));
            }
            cin = out;
        }
    }
    v
}

fn bench_cases() -> Vec<Case> {
    let mut v = vec![];
    let mut add = |label: String, dtype: DType, shape: Shape| v.push(Case { label, dtype, out: dtype, shape, params: None, sm90: None, edge_vec: false, time: true });
    add("gemv_bf16_16x8192x8192".into(), DType::BF16, gemm(16, 8192, 8192, 1, R, C));
    add("gemv_bf16_16x8192x8192_rr".into(), DType::BF16, gemm(16, 8192, 8192, 1, R, R));
    for m in [1, 16] {
        for (n, k) in [(4096, 4096), (14336, 4096), (4096, 14336)] {
            add(format!("llm_bf16_{m}x{n}x{k}"), DType::BF16, gemm(m, n, k, 1, R, C));
        }
    }
    add("gemm_bf16_8192_mma".into(), DType::BF16, gemm(8192, 8192, 8192, 1, R, R));
    // GPT-2 small's projections at batch 8 x 512 and 1 x 128 (Conv1D weights: B row-major).
    for m in [4096, 128] {
        for (what, n, k) in [("qkv", 2304, 768), ("proj", 768, 768), ("fc1", 3072, 768), ("fc2", 768, 3072)] {
            add(format!("gpt2_{what}_f16_{m}x{n}x{k}"), DType::F16, gemm(m, n, k, 1, R, R));
        }
    }
    // Its tied output projection: a vocabulary of 50257 (N not a multiple of 8), the weights
    // as the embedding stores them (K-contiguous) and transposed.
    add("gpt2_lmhead_f16_4096x50257x768".into(), DType::F16, gemm(4096, 50257, 768, 1, R, C));
    add("gpt2_lmhead_rr_f16_4096x50257x768".into(), DType::F16, gemm(4096, 50257, 768, 1, R, R));
    // The same with the vocabulary padded to a multiple of 8 (every row 16-byte aligned).
    add("gpt2_lmhead_pad8_f16_4096x50264x768".into(), DType::F16, gemm(4096, 50264, 768, 1, R, C));
    for (i, (h, c, o, k, s)) in resnet50_convs().into_iter().enumerate() {
        add(format!("resnet50_conv{i:02}_{h}x{c}x{o}_k{k}s{s}"), DType::F16, conv(64, h, c, o, k, s, k / 2, 1));
    }
    // The first convolution as CUDA targets run it: its input padded to 4 channels
    // (`pad-thin-channels`; the padding copy is a kernel of its own).
    add("resnet50_stem_c4_224x4x64_k7s2".into(), DType::F16, conv(64, 224, 4, 64, 7, 2, 3, 1));
    v
}

fn store(d: DType) -> &'static str {
    match d {
        DType::F32 => "tl_acc",
        DType::F16 => "tl_st_f16(tl_acc)",
        _ => "tl_st_bf16(tl_acc)",
    }
}
/// The C expression reading a stored element `e` of dtype `d` as f32.
fn load(d: DType, e: &str) -> String {
    match d {
        DType::F32 => e.to_string(),
        DType::F16 => format!("tl_ld_f16({e})"),
        _ => format!("tl_ld_bf16({e})"),
    }
}

/// Whether `EPI_RES=1` asks for a residual operand added in the epilogue.
fn residual() -> bool {
    std::env::var("EPI_RES").is_ok_and(|v| v == "1")
}

/// Whether `EPI_GELU=1` asks for GELU (tanh form, as GPT-2's MLP) on each value before the
/// store: an epilogue with arithmetic to hide.
fn gelu() -> bool {
    std::env::var("EPI_GELU").is_ok_and(|v| v == "1")
}

/// `e` through the epilogue's activation (`EPI_GELU`), in the form a model's kernel takes for
/// 16-bit outputs (`EPI_GELU_PRECISE=1`: `tanhf`'s).
fn act(e: &str) -> String {
    if gelu() {
        let precise = std::env::var("EPI_GELU_PRECISE").is_ok_and(|v| v == "1");
        format!("tl_gelu_tanh{}({e})", if precise { "" } else { "_fast" })
    } else {
        e.to_string()
    }
}

fn storage(d: DType) -> &'static str {
    match d {
        DType::F32 => "float",
        DType::F16 => "tl_f16",
        _ => "tl_bf16",
    }
}

/// The problem with an epilogue storing C densely (`[batch][m][n]`, or NHWC for a
/// convolution).
fn problem(case: &Case) -> MmaProblem {
    let (dt, od) = (case.dtype, case.out);
    // Named apart from both templates' own parameters and locals.
    let params = vec![
        format!("const {}* __restrict__ x_in", storage(dt)),
        format!("const {}* __restrict__ w_in", storage(dt)),
        format!("{}* __restrict__ y_out", storage(od)),
    ];
    let mut params = params;
    let res = residual();
    if res {
        params.push(format!("const {}* __restrict__ r_in", storage(od)));
    }
    let (mut gp, conv, rows, index) = match &case.shape {
        Shape::Gemm { m, n, k, batch, a, b, lda, ldb } => {
            let mut p = Problem::new(*m, *n, *k, dt).with_layouts(*a, *b);
            p.lda = Some(*lda);
            p.ldb = Some(*ldb);
            p.batch = *batch;
            p.batch_stride_a = lda * if *a == R { *m } else { *k };
            p.batch_stride_b = ldb * if *b == R { *k } else { *n };
            (p, None, None, format!("tl_b * {} + tl_i * {n} + tl_j", m * n))
        }
        Shape::Conv { g, o } => {
            let mut p = Problem::for_conv(*g, *o, dt);
            // `CONV_PLAIN=0`: pointwise convolutions through the im2col path too (to compare).
            if std::env::var("CONV_PLAIN").is_ok_and(|v| v == "0") {
                p.ldb = Some(g.k_padded());
                p.conv = Some(*g);
            }
            let conv = p.conv;
            (p, conv, Some(g.oh * g.ow), format!("(tl_b * {} + tl_i) * {o} + tl_j", g.oh * g.ow))
        }
    };
    // `EPI_NULL=1` (an experiment): the epilogue stores only values it never sees, so the
    // kernel keeps its accumulators and the epilogue's control but writes nothing.
    let guard = if std::env::var("EPI_NULL").is_ok_and(|v| v == "1") { "if (tl_acc == 1.2345e38f) " } else { "" };
    // With a residual, each accumulator gets its element of `r_in` added first.
    let plus = if res { format!(" + {}", load(od, &format!("r_in[{index}]"))) } else { String::new() };
    let mut source = format!(
        "static __device__ __forceinline__ void tl_epi({}, long long tl_b, long long tl_i, long long tl_j, float tl_acc) {{ {guard}y_out[{index}] = {}; }}\n",
        params.join(", "),
        store(od).replace("tl_acc", &act(&format!("(tl_acc{plus})")))
    );
    // Groups of 8 columns as one vector store where rows keep 16-byte alignment (as the
    // renderer's vector epilogue gives a model's kernels); `EPI_VEC=0` leaves them out.
    let no_vec = std::env::var("EPI_VEC").is_ok_and(|v| v == "0");
    let vector = (gp.n % 8 == 0 && !no_vec).then(|| {
        // The residual's 8 elements in whole 16-byte loads, as a model's vector epilogue reads them.
        let (rload, radd) = if res {
            (
                format!("__align__(16) {st} tl_r[8];\n  for (int w = 0; w < (int)sizeof(tl_r) / 16; ++w) reinterpret_cast<uint4*>(tl_r)[w] = tl_ld_v4(reinterpret_cast<const uint4*>(&r_in[{index}]) + w);\n  ", st = storage(od)),
                format!(" + {}", load(od, "tl_r[l]")),
            )
        } else {
            (String::new(), String::new())
        };
        let _ = write!(
            source,
            "static __device__ __forceinline__ void tl_epi_v({}, long long tl_b, long long tl_i, long long tl_jv, const float* __restrict__ tl_acc) {{\n  \
             __align__(16) {} tl_v[8];\n  const long long tl_j = tl_jv * 8;\n  {rload}\
             for (int l = 0; l < 8; ++l) {{ const float tl_acc0 = tl_acc[l]{radd}; tl_v[l] = {}; }}\n  \
             {vguard}for (int w = 0; w < (int)sizeof(tl_v) / 16; ++w) tl_st_v4(reinterpret_cast<uint4*>(&y_out[{index}]) + w, reinterpret_cast<const uint4*>(tl_v)[w]);\n}}\n",
            params.join(", "),
            storage(od),
            store(od).replace("tl_acc", &act("tl_acc0")),
            vguard = if guard.is_empty() { "" } else { "if (tl_acc[0] == 1.2345e38f) " },
        );
        "tl_epi_v".to_string()
    });
    // Otherwise, for the cases that ask, groups of 8 columns stored one by one.
    let vector = vector.or_else(|| {
        (case.edge_vec && !no_vec).then(|| {
            let _ = write!(
                source,
                "static __device__ __forceinline__ void tl_epi_v({}, long long tl_b, long long tl_i, long long tl_jv, const float* __restrict__ tl_acc) {{\n  \
                 for (int l = 0; l < 8; ++l) {{ const long long tl_j = tl_jv * 8 + l; const float tl_acc0 = tl_acc[l]{plus}; {guard}y_out[{index}] = {}; }}\n}}\n",
                params.join(", "),
                store(od).replace("tl_acc", &act("tl_acc0")),
                guard = guard.replace("tl_acc", "tl_acc0"),
            );
            "tl_epi_v".to_string()
        })
    });
    gp.out_dtype = od;
    // The function's first step is the cast to a 16-bit output: the templates may round first.
    let rounds_to = (matches!(od, DType::F16 | DType::BF16) && !gelu()).then_some(od);
    gp.custom = Some(CustomEpilogue { loads: res, name: "tl_epi".into(), source, params, rows, rounds_to, vector });
    gp.conv = conv;
    MmaProblem { gemm: gp, conv }
}

/// The case's parameters, else `MMA_PARAMS=tile_m,tile_n,warps_m,warps_n,stages,split_k[,prefetch[,tile_k]]`
/// (for sweeps), else the heuristic's.
fn params_of(case: &Case, p: &MmaProblem, sms: usize) -> Params {
    if let Some(q) = case.params {
        return q;
    }
    let env: Vec<usize> = std::env::var("MMA_PARAMS").unwrap_or_default().split(',').filter_map(|x| x.parse().ok()).collect();
    match env[..] {
        [tile_m, tile_n, warps_m, warps_n, stages, split_k] => Params { tile_m, tile_n, warps_m, warps_n, stages, split_k, ..Params::default() },
        [tile_m, tile_n, warps_m, warps_n, stages, split_k, prefetch] => Params { tile_m, tile_n, warps_m, warps_n, stages, split_k, prefetch, ..Params::default() },
        [tile_m, tile_n, warps_m, warps_n, stages, split_k, prefetch, tile_k] => Params { tile_m, tile_n, warps_m, warps_n, stages, split_k, prefetch, tile_k, ..Params::default() },
        _ => mma::heuristic(p, sms),
    }
}

/// [`params_of`] with `MMA_STAGED=0|1` (the staged epilogue off or on) and `MMA_PARK=32|16`
/// (the staged tile parked f32, as before 16-bit parking, or in 16 bits where exact: the
/// default) applied last.
fn params_with_env(case: &Case, p: &MmaProblem, sms: usize) -> Params {
    let mut q = params_of(case, p, sms);
    if let Some(v) = std::env::var("MMA_STAGED").ok().and_then(|v| v.parse::<u8>().ok()) {
        q.staged = v != 0;
    }
    if let Some(v) = std::env::var("MMA_PARK").ok().and_then(|v| v.parse::<u8>().ok()) {
        q.park16 = v != 32;
    }
    // `MMA_SHUFFLE=0|1`: the epilogue regrouped by warp shuffles off or on.
    if let Some(v) = std::env::var("MMA_SHUFFLE").ok().and_then(|v| v.parse::<u8>().ok()) {
        q.shuffle = v != 0;
    }
    q
}

const A: OperandRef = OperandRef { param: 0, offset_bytes: 0 };
const B: OperandRef = OperandRef { param: 1, offset_bytes: 0 };

/// Whether `BENCH_FAMILY=sm90` asks for the Hopper template (wgmma, TMA; convolutions through
/// the im2col copy) instead of the mma.sync one.
fn hopper() -> bool {
    std::env::var("BENCH_FAMILY").is_ok_and(|f| f == "sm90")
}

/// Whether `BENCH_FAMILY=auto` asks for the template model dispatch picks for a convolution:
/// the Hopper one where it applies, unless K is at most [`SHALLOW_CONV_K`] and N at most
/// [`NARROW_CONV_N`]; else mma.sync.
fn auto() -> bool {
    std::env::var("BENCH_FAMILY").is_ok_and(|f| f == "auto")
}

/// The case's plan on the chosen template (`Err`: the template does not take it).
fn plan_for(case: &Case, sms: usize, cc: (u32, u32)) -> Result<FamilyPlan, String> {
    let p = problem(case);
    let mut q90 = case.sm90.unwrap_or_else(|| gemm::heuristic(&p.gemm, sms));
    // `SM90_PARAMS=tile_m,tile_n,stages,cluster_m[,pingpong]` (sweeps of the Hopper template;
    // ping-pong gives each of two consumer warpgroups whole tiles of tile_m rows).
    let env: Vec<usize> = std::env::var("SM90_PARAMS").unwrap_or_default().split(',').filter_map(|x| x.parse().ok()).collect();
    if let [tile_m, tile_n, stages, cluster_m, ..] = env[..] {
        let pingpong = env.get(4).is_some_and(|&p| p != 0);
        let consumers = if tile_m >= 128 || pingpong { 2 } else { 1 };
        q90 = gemm::Params { tile_m, tile_n, stages, cluster_m, consumers, pingpong, ..q90 };
    }
    // `SM90_STAGED=0|1`: the epilogue from registers or through shared memory.
    if let Some(v) = std::env::var("SM90_STAGED").ok().and_then(|v| v.parse::<u8>().ok()) {
        q90.staged = v != 0;
    }
    // `SM90_SHUFFLE=0|1`: the epilogue regrouped by warp shuffles off or on; staged wherever
    // the shuffled one does not run.
    if let Some(v) = std::env::var("SM90_SHUFFLE").ok().and_then(|v| v.parse::<u8>().ok()) {
        q90.shuffle = v != 0;
        q90.staged = !gemm::shuffled(&p.gemm, &q90);
    }
    // `SM90_PARK=32|16`: the staged epilogue parks f32 (as before 16-bit parking), or 16 bits
    // where that is exact (the default).
    if let Some(v) = std::env::var("SM90_PARK").ok().and_then(|v| v.parse::<u8>().ok()) {
        q90.park16 = v != 32;
    }
    // `SM90_SK=0|1`: stream-K off or on (on: without ping-pong or clusters).
    if let Some(v) = std::env::var("SM90_SK").ok().and_then(|v| v.parse::<u8>().ok()) {
        q90.stream_k = v != 0;
        if v != 0 {
            q90.pingpong = false;
            q90.cluster_m = 1;
        }
    }
    let auto_sm90 = auto() && matches!(case.shape, Shape::Conv { .. }) && (p.gemm.k > SHALLOW_CONV_K || p.gemm.n > NARROW_CONV_N) && gemm::applies(&p.gemm, &q90, cc).is_ok();
    if hopper() || auto_sm90 {
        let q = q90;
        gemm::applies(&p.gemm, &q, cc)?;
        return Ok(FamilyPlan {
            family: HOPPER_GEMM,
            entry: gemm::kernel_name(&p.gemm, &q),
            source: gemm::render(&p.gemm, &q),
            problem: p.gemm,
            kind: PlanKind::Sm90(q, None),
            a: A,
            b: B,
        });
    }
    let q = params_with_env(case, &p, sms);
    mma::applies(&p, &q, cc)?;
    Ok(FamilyPlan {
        family: MMA_GEMM,
        entry: mma::kernel_name(&p, &q, &A, &B),
        source: mma::render(&p, &q, &A, &B),
        problem: p.gemm,
        kind: PlanKind::Mma(q, p.conv),
        a: A,
        b: B,
    })
}

/// The parameters a plan runs with, for the report.
fn describe_params(plan: &FamilyPlan) -> String {
    match &plan.kind {
        PlanKind::Mma(q, conv) => {
            let park = match (q.staged, mma::park_dtype(&MmaProblem { gemm: plan.problem.clone(), conv: *conv }, q)) {
                (false, _) => "",
                (true, None) => " st32",
                (true, Some(_)) => " st16",
            };
            format!("{}x{}x{} w{}x{} s{} k{}{park}", q.tile_m, q.tile_n, q.tile_k, q.warps_m, q.warps_n, q.stages, q.split_k)
        }
        PlanKind::Sm90(q, _) => format!(
            "sm90 {}x{}x{} s{} c{} cl{}{}{}",
            q.tile_m,
            q.tile_n,
            q.tile_k,
            q.stages,
            q.consumers,
            q.cluster_m,
            if q.pingpong { " pp" } else { "" },
            match (q.staged, gemm::park_dtype(&plan.problem, q)) {
                (false, _) => "",
                (true, None) => " st32",
                (true, Some(_)) => " st16",
            }
        ),
        _ => String::new(),
    }
}


struct Data {
    a: Vec<u16>,
    b: Vec<u16>,
    /// The residual (`EPI_RES=1`) as f64, C's shape; empty without one.
    r: Vec<f64>,
    da: DeviceBuffer,
    db: DeviceBuffer,
}

/// Operand sizes in elements (A or the convolution input, B or the weights, C).
fn sizes(case: &Case) -> (usize, usize, usize) {
    match &case.shape {
        Shape::Gemm { m, n, k, batch, a, b, lda, ldb } => (
            batch * lda * if *a == R { *m } else { *k },
            batch * ldb * if *b == R { *k } else { *n },
            batch * m * n,
        ),
        Shape::Conv { g, o } => (g.n * g.h * g.w * g.c, o * g.c * g.kh * g.kw, g.n * g.oh * g.ow * o),
    }
}

/// The reference value of output element `idx` (dense C).
fn reference(case: &Case, d: &Data, idx: usize) -> f64 {
    let x = d.r.get(idx).copied().unwrap_or(0.0) + product(case, d, idx);
    if gelu() {
        0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
    } else {
        x
    }
}

/// The matrix product's (or convolution's) value of output element `idx`.
fn product(case: &Case, d: &Data, idx: usize) -> f64 {
    let dt = case.dtype;
    match &case.shape {
        Shape::Gemm { m, n, k, a, b, lda, ldb, .. } => {
            let (bb, i, j) = (idx / (m * n), idx % (m * n) / n, idx % n);
            let sa = lda * if *a == R { *m } else { *k };
            let sb = ldb * if *b == R { *k } else { *n };
            (0..*k)
                .map(|kk| {
                    let ai = bb * sa + if *a == R { i * lda + kk } else { kk * lda + i };
                    let bi = bb * sb + if *b == R { kk * ldb + j } else { j * ldb + kk };
                    from_bits(dt, d.a[ai]) * from_bits(dt, d.b[bi])
                })
                .sum()
        }
        Shape::Conv { g, o } => {
            let p = g.oh * g.ow;
            let (img, pix, oc) = (idx / (p * o), idx % (p * o) / o, idx % o);
            let (oh, ow) = (pix / g.ow, pix % g.ow);
            let mut s = 0f64;
            for th in 0..g.kh {
                for tw in 0..g.kw {
                    let ih = (oh * g.stride.0 + th * g.dil.0) as isize - g.pad.0 as isize;
                    let iw = (ow * g.stride.1 + tw * g.dil.1) as isize - g.pad.1 as isize;
                    if ih < 0 || iw < 0 || ih >= g.h as isize || iw >= g.w as isize {
                        continue;
                    }
                    for c in 0..g.c {
                        let (sh, sw, sc) = g.input_strides();
                        let x = d.a[img * g.h * g.w * g.c + ih as usize * sh + iw as usize * sw + c * sc];
                        let w = d.b[((oc * g.c + c) * g.kh + th) * g.kw + tw];
                        s += from_bits(dt, x) * from_bits(dt, w);
                    }
                }
            }
            s
        }
    }
}

fn run_case(dev: &Device, comp: &Compiler, stream: &Stream, case: &Case, iters: usize, dump: Option<&str>, rng: &mut Rng) -> Result<serde_json::Value, String> {
    let s = |e: CudaError| e.to_string();
    let sms = dev.props().sm_count as usize;
    let plan = plan_for(case, sms, dev.props().compute_capability)?;
    let name = plan.entry.clone();
    if let Some(dir) = dump {
        let _ = std::fs::write(format!("{dir}/{name}.cu"), &plan.source);
    }
    let t0 = std::time::Instant::now();
    let compiled = comp.compile(&name, &plan.source).map_err(s)?;
    let compile_s = t0.elapsed().as_secs_f64();
    let kern = FamilyKernel::load(dev, &plan, &compiled.image, compiled.cache_hit).map_err(s)?;
    let (ea, eb, ec) = sizes(case);
    let up = |v: &[u16]| -> Result<DeviceBuffer> {
        let buf = dev.alloc(v.len().max(1) * 2)?;
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        buf.write(0, &bytes)?;
        Ok(buf)
    };
    let a: Vec<u16> = (0..ea).map(|_| to_bits(case.dtype, rng.unit())).collect();
    let b: Vec<u16> = (0..eb).map(|_| to_bits(case.dtype, rng.unit())).collect();
    let (da, db) = (up(&a).map_err(s)?, up(&b).map_err(s)?);
    let osz = case.out.size_bytes();
    // The residual in C's dtype (`EPI_RES=1`), rounded as the kernel reads it.
    let (r, dr) = if residual() {
        let (bits, vals): (Vec<u8>, Vec<f64>) = match case.out {
            DType::F32 => {
                let v: Vec<f32> = (0..ec).map(|_| rng.unit()).collect();
                (v.iter().flat_map(|x| x.to_le_bytes()).collect(), v.iter().map(|&x| x as f64).collect())
            }
            o => {
                let v: Vec<u16> = (0..ec).map(|_| to_bits(o, rng.unit())).collect();
                (v.iter().flat_map(|x| x.to_le_bytes()).collect(), v.iter().map(|&x| from_bits(o, x)).collect())
            }
        };
        let buf = dev.alloc(bits.len().max(4)).map_err(s)?;
        buf.write(0, &bits).map_err(s)?;
        (vals, Some(buf))
    } else {
        (vec![], None)
    };
    let d = Data { a, b, r, da, db };
    // Rounded up to whole words for the 32-bit poison fill (a ragged 16-bit C is odd-sized).
    let dc = dev.alloc((ec * osz).next_multiple_of(4)).map_err(s)?;
    let mut ptrs = vec![d.da.ptr(), d.db.ptr(), dc.ptr()];
    if let Some(r) = &dr {
        ptrs.push(r.ptr());
    }
    kern.bind(stream, &ptrs).map_err(s)?;
    dc.fill_u32(stream, 0xffff_ffff).map_err(s)?;
    kern.launch(stream, &ptrs).map_err(s)?;
    // Twice: the split-K counters must be back at zero after a launch.
    kern.launch(stream, &ptrs).map_err(s)?;
    stream.synchronize().map_err(s)?;
    let mut raw = vec![0u8; ec * osz];
    dc.read(0, &mut raw).map_err(s)?;
    let out: Vec<f64> = match case.out {
        DType::F32 => raw.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64).collect(),
        o => raw.chunks_exact(2).map(|c| from_bits(o, u16::from_le_bytes([c[0], c[1]]))).collect(),
    };
    let nan = out.iter().filter(|x| !x.is_finite()).count();
    let mut points: Vec<usize> = if ec <= 1 << 16 { (0..ec).collect() } else { (0..2000).map(|_| (rng.next() % ec as u64) as usize).collect() };
    points.extend([0, ec - 1]);
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let chunk = points.len().div_ceil(threads).max(1);
    let parts: Vec<(f64, f64)> = std::thread::scope(|sc| {
        let hs: Vec<_> = points
            .chunks(chunk)
            .map(|c| {
                let d = &d;
                let out = &out;
                sc.spawn(move || {
                    let (mut me, mut mr) = (0f64, 0f64);
                    for &i in c {
                        let r = reference(case, d, i);
                        me = me.max((out[i] - r).abs());
                        mr = mr.max(r.abs());
                    }
                    (me, mr)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or((f64::NAN, 0.0))).collect()
    });
    let max_err = parts.iter().map(|p| p.0).fold(0f64, f64::max) / parts.iter().map(|p| p.1).fold(1e-30, f64::max);
    let tol = match case.out {
        DType::BF16 => 1e-2,
        DType::F16 => 3e-3,
        _ => 1e-4,
    };
    let ok = nan == 0 && max_err < tol;
    let g = &plan.problem;
    let f = kern.function().ok_or("a template kernel has a function")?;
    let cfg = kern.launch_config();
    let mut j = json!({
        "kind": if case.time { "bench" } else { "check" },
        "label": case.label, "kernel": name,
        "m": g.m, "n": g.n, "k": g.k, "batch": g.batch, "dtype": case.dtype.name(), "out": case.out.name(),
        "layouts": format!("{:?}{:?}", g.a_layout, g.b_layout), "conv": g.conv.is_some(),
        "family": plan.family, "params": describe_params(&plan),
        "ok": ok, "max_err": max_err, "nan": nan, "checked": points.len(),
        "regs": f.num_regs().unwrap_or(0), "local_bytes": f.local_bytes().unwrap_or(0),
        "compile_s": compile_s, "grid": [cfg.grid.0, cfg.grid.2], "smem": cfg.shared_mem_bytes,
    });
    // `EPI_NULL=1` stores nothing by design: time it although its outputs cannot match.
    if case.time && (ok || std::env::var("EPI_NULL").is_ok_and(|v| v == "1")) {
        let ms = common::time_ms(dev, stream, 5, iters, || kern.launch(stream, &ptrs)).map_err(s)?;
        let bytes = (ea + eb) * 2 + ec * osz * if dr.is_some() { 2 } else { 1 };
        j["ms"] = json!(ms);
        j["tflops"] = json!(2.0 * g.m as f64 * g.n as f64 * g.k as f64 * g.batch as f64 / ms / 1e9);
        j["tb_s"] = json!(bytes as f64 / ms / 1e9);
    }
    Ok(j)
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let phase = argv.first().cloned().unwrap_or_else(|| "check".into());
    let opt = |name: &str| argv.iter().position(|a| a == name).and_then(|i| argv.get(i + 1).cloned());
    let iters: usize = opt("--iters").and_then(|v| v.parse().ok()).unwrap_or(30);
    let dump = opt("--dump");
    let only = opt("--only");
    let fail = |e: String| -> ! {
        eprintln!("mma_bench: {e}");
        std::process::exit(1)
    };
    let dev = Device::open(0).unwrap_or_else(|e| fail(e.to_string()));
    let nv = Nvrtc::load().unwrap_or_else(|e| fail(e.to_string()));
    let props = dev.props().clone();
    println!("{}", json!({"device": props.name, "sms": props.sm_count, "arch": props.arch(), "nvrtc": format!("{:?}", nv.version())}));
    let comp = Compiler::new(nv, &props.arch());
    let stream = dev.stream().unwrap_or_else(|e| fail(e.to_string()));
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1);
    let mut rng = Rng(seed);
    let cases: Vec<Case> = if phase == "bench" { bench_cases() } else { check_cases() };
    // `--only a,b`: cases whose label contains any of the parts.
    let cases: Vec<Case> = cases.into_iter().filter(|c| only.as_ref().is_none_or(|o| o.split(',').any(|x| c.label.contains(x)))).collect();
    // Compile every kernel first, in parallel (the runs then hit the compiler's cache).
    let sms = props.sm_count as usize;
    let modules: Vec<(String, String)> = cases
        .iter()
        .filter_map(|c| plan_for(c, sms, props.compute_capability).ok().map(|p| (p.entry, p.source)))
        .collect();
    common::precompile(&comp, &modules);
    common::run_all(&cases, |x| &x.label, |c| run_case(&dev, &comp, &stream, c, iters, dump.as_deref(), &mut rng));
}
