//! Checks and times the Hopper tensor-core GEMM family on a GPU.
//!
//! Usage: `gemm_bench check|bench [--iters N] [--dump DIR] [--only SUBSTRING[,SUBSTRING...]]`
//! - `check`: small and ragged shapes over every layout pair, dtype, epilogue, batching and a
//!   few parameter sets: fresh random inputs, the output poisoned with NaN first, every output
//!   element checked for NaN and compared (all of them on small problems, sampled rows and
//!   columns plus the edges on large ones) with an f64 reference on the CPU. Inputs are drawn
//!   in their own format (fp8 and tf32 rounded on the host first), so the reference multiplies
//!   exactly the values the tensor cores see.
//! - `bench`: the large shapes, timed (median of `--iters` runs after warm-ups, CUDA events),
//!   each also checked on samples.
//!
//! - `compile`: no device: renders and compiles (NVRTC, sm_90a) every kernel of both phases
//!   (`--dump DIR` writes their sources).
//!
//! Prints one JSON object per line. `--dump DIR` writes each kernel's source and cubin there.

use serde_json::json;
use tilec_cuda::gemm::{self, host, Activation, Epilogue, GemmKernel, Layout, Params, Problem};
use tilec_cuda::*;
use tilec_ir::DType;

mod common;
use common::{from_bits, median, to_bits, Rng};

struct Case {
    label: String,
    problem: Problem,
    params: Option<Params>,
    time: bool,
}

fn pr(m: usize, n: usize, k: usize, d: DType, a: Layout, b: Layout) -> Problem {
    Problem::new(m, n, k, d).with_layouts(a, b)
}

use Layout::{ColMajor as C, RowMajor as R};

fn check_cases() -> Vec<Case> {
    let mut v = vec![];
    let mut add = |label: &str, problem: Problem, params: Option<Params>| {
        v.push(Case {
            label: label.to_string(),
            problem,
            params,
            time: false,
        })
    };
    // K-major A and B first (the plainest copies), then the other layouts.
    for (a, b) in [(R, C), (R, R), (C, C), (C, R)] {
        add(
            "layouts",
            pr(256, 512, 128, DType::BF16, a, b),
            Some(Params::default()),
        );
        add(
            "ragged",
            pr(336, 520, 264, DType::BF16, a, b),
            Some(Params::default()),
        );
    }
    // Odd N: row-major A, column-major B (the weight layout), odd ldc takes scalar stores.
    add("odd_n", pr(200, 517, 136, DType::BF16, R, C), None);
    // Odd N over several tiles of each width (each row a different offset from 16-byte
    // alignment: element-wise stores), with a bias and GELU.
    for tn in [64, 128, 192, 256] {
        let mut p = pr(520, 1031, 192, DType::F16, R, C);
        p.epilogue = Epilogue { bias: Some(DType::F16), activation: Activation::Gelu };
        let q = Params { tile_n: tn, ..gemm::heuristic(&p, 132) };
        add(&format!("odd_n_tiles_{tn}"), p.clone(), Some(q));
        let r = Params { rowstore: true, ..q };
        let r = Params { stages: (2..=r.stages).rev().find(|&s| Params { stages: s, ..r }.smem_bytes() <= gemm::MAX_SMEM).unwrap_or(2), ..r };
        add(&format!("odd_n_rowstore_{tn}"), p.clone(), Some(r));
        if tn == 256 {
            let q = Params { tile_m: 128, consumers: 2, stages: 4, ..q };
            add("odd_n_tiles_128x256_c2", p.clone(), Some(q));
            let r = Params { rowstore: true, stages: 3, ..q };
            add("odd_n_rowstore_128x256_c2", p.clone(), Some(r));
            let mut bt = p.clone();
            bt.batch = 2;
            bt.batch_stride_a = 520 * 192 + 24;
            bt.batch_stride_b = 1031 * 192 + 40;
            bt.batch_stride_c = 520 * 1031 + 4;
            add("odd_n_rowstore_batched", bt, Some(r));
            let pp = Params { rowstore: true, pingpong: true, tile_m: 128, tile_n: 128, stages: 4, ..q };
            add("odd_n_rowstore_pingpong", p, Some(pp));
        }
    }
    let mut padded = pr(130, 72, 1000, DType::F16, R, R);
    padded.ldc = Some(80);
    add("ldc_padded", padded, None);
    let mut ep = pr(1000, 1000, 1000, DType::BF16, R, R);
    ep.epilogue = Epilogue {
        bias: Some(DType::BF16),
        activation: Activation::Gelu,
    };
    add("bias_gelu", ep, None);
    let mut ep = pr(384, 768, 1024, DType::F16, R, C);
    ep.out_dtype = DType::F32;
    ep.epilogue = Epilogue {
        bias: Some(DType::F32),
        activation: Activation::Relu,
    };
    add("f16_f32out_bias_relu", ep, None);
    let mut ep = pr(304, 200, 512, DType::BF16, C, R);
    ep.out_dtype = DType::F32;
    ep.epilogue = Epilogue {
        bias: None,
        activation: Activation::Gelu,
    };
    add("f32out_gelu", ep, None);
    let mut bt = pr(200, 136, 96, DType::BF16, R, R);
    bt.batch = 3;
    bt.batch_stride_a = 200 * 96 + 64;
    bt.batch_stride_b = 96 * 136 + 8;
    bt.batch_stride_c = 200 * 136 + 5;
    add("batched", bt.clone(), None);
    bt.batch_stride_b = 0;
    add("batched_bcast_b", bt, None);
    add("m16", pr(16, 4096, 4096, DType::BF16, R, C), None);
    add("m1", pr(1, 1000, 512, DType::BF16, R, C), None);
    // Parameter variants on a ragged shape.
    for (tm, tn, st, c, k) in [
        (128, 128, 6, 2, 1),
        (256, 128, 4, 2, 1),
        (64, 256, 4, 1, 1),
        (128, 64, 8, 1, 1),
        (128, 192, 4, 2, 1),
        (128, 256, 4, 2, 2),
        (256, 128, 4, 2, 2),
    ] {
        let q = Params {
            tile_m: tm,
            tile_n: tn,
            stages: st,
            consumers: c,
            cluster_m: k,
            ..Params::default()
        };
        add(
            &format!("params_{tm}x{tn}_s{st}_c{c}_k{k}"),
            pr(1000, 1000, 520, DType::BF16, R, C),
            Some(q),
        );
    }
    // Clusters over both B layouts, a ragged M (odd tile count: a cluster's second tile past
    // M), batches and the epilogue.
    let cl = Params {
        cluster_m: 2,
        ..Params::default()
    };
    for b in [R, C] {
        add(
            "cluster_ragged",
            pr(264, 776, 328, DType::BF16, R, b),
            Some(cl),
        );
    }
    let mut ep = pr(200, 136, 96, DType::F16, C, R);
    ep.batch = 3;
    ep.batch_stride_a = 200 * 96 + 64;
    ep.batch_stride_b = 96 * 136 + 8;
    ep.batch_stride_c = 200 * 136 + 5;
    ep.epilogue = Epilogue {
        bias: Some(DType::F16),
        activation: Activation::Gelu,
    };
    add(
        "cluster_batched_bias_gelu",
        ep,
        Some(Params { tile_n: 128, ..cl }),
    );
    narrow_check_cases(&mut add);
    v
}

/// An fp8 problem as `torch._scaled_mm` takes it: row-major A, column-major B, both scales.
fn fp8(m: usize, n: usize, k: usize, d: DType, out: DType) -> Problem {
    let mut p = pr(m, n, k, d, R, C);
    p.out_dtype = out;
    p.scale_a = true;
    p.scale_b = true;
    p
}

/// A tf32 problem: f32 operands (row-major A, column-major B) and output.
fn tf32(m: usize, n: usize, k: usize) -> Problem {
    let mut p = pr(m, n, k, DType::F32, R, C);
    p.tf32 = true;
    p
}

/// fp8 and tf32 cases (labels start with `fp8_` and `tf32_`): ragged M, N and K (K a multiple
/// of 16 fp8 or 4 f32 elements, as TMA rows need, but not of the stage's K), epilogues, both
/// outputs, parameter variants, batches.
fn narrow_check_cases(add: &mut impl FnMut(&str, Problem, Option<Params>)) {
    use DType::{BF16, F16, F32, F8E4M3 as E4, F8E5M2 as E5};
    let bias = |mut p: Problem, b: DType, a: Activation| {
        p.epilogue = Epilogue { bias: Some(b), activation: a };
        p
    };
    add("fp8_e4m3_ragged_f32out", fp8(336, 520, 272, E4, F32), None);
    add("fp8_e4m3_ragged_bf16out", fp8(336, 520, 272, E4, BF16), None);
    add("fp8_e5m2_ragged_f32out", fp8(200, 517, 400, E5, F32), None);
    add(
        "fp8_e4m3_bias_gelu_bf16out",
        bias(fp8(1000, 1000, 1008, E4, BF16), BF16, Activation::Gelu),
        None,
    );
    add(
        "fp8_e5m2_bias_relu_f32out",
        bias(fp8(264, 776, 528, E5, F32), F32, Activation::Relu),
        None,
    );
    add(
        "fp8_e4m3_bias_gelu_f16out",
        bias(fp8(384, 768, 1024, E4, F16), F32, Activation::Gelu),
        None,
    );
    let mut mixed = fp8(264, 776, 528, E4, F32);
    mixed.b_dtype = Some(E5);
    mixed.scale_b = false;
    add("fp8_e4m3_e5m2_scale_a_f32out", mixed, None);
    let mut plain = fp8(300, 300, 256, E4, F32);
    plain.scale_a = false;
    plain.scale_b = false;
    add("fp8_e4m3_no_scales", plain, None);
    add("fp8_e4m3_m16", fp8(16, 4096, 4096, E4, BF16), None);
    add("fp8_e4m3_m1", fp8(1, 1000, 512, E4, F32), None);
    let mut bt = fp8(200, 136, 96, E4, F32);
    bt.batch = 3;
    bt.batch_stride_a = 200 * 96 + 64;
    bt.batch_stride_b = 136 * 96 + 16;
    bt.batch_stride_c = 200 * 136 + 5;
    add("fp8_e4m3_batched", bt.clone(), None);
    bt.batch_stride_b = 0;
    add("fp8_e4m3_batched_bcast_b", bt, None);
    for (tm, tn, st, c, k) in [
        (128, 128, 6, 2, 1),
        (64, 256, 4, 1, 1),
        (128, 64, 8, 1, 1),
        (128, 256, 4, 2, 2),
        (256, 128, 4, 2, 2),
    ] {
        let q = Params {
            tile_m: tm,
            tile_n: tn,
            tile_k: 128,
            stages: st,
            consumers: c,
            cluster_m: k,
            ..Params::default()
        };
        add(
            &format!("fp8_params_{tm}x{tn}_s{st}_c{c}_k{k}"),
            fp8(1000, 1000, 528, E4, BF16),
            Some(q),
        );
    }
    add("tf32_ragged", tf32(336, 520, 260), None);
    add("tf32_odd_n", tf32(200, 517, 136), None);
    add("tf32_bias_relu", bias(tf32(1000, 1000, 1000), F32, Activation::Relu), None);
    let mut t = bias(tf32(384, 768, 1024), BF16, Activation::Gelu);
    t.out_dtype = BF16;
    add("tf32_bias_gelu_bf16out", t, None);
    let mut t = tf32(300, 300, 200);
    t.scale_a = true;
    add("tf32_scale_a", t, None);
    add("tf32_m1", tf32(1, 1000, 512), None);
    for (tm, tn, st, c, k) in [(128, 128, 6, 2, 1), (64, 256, 4, 1, 1), (128, 256, 4, 2, 2)] {
        let q = Params {
            tile_m: tm,
            tile_n: tn,
            tile_k: 32,
            stages: st,
            consumers: c,
            cluster_m: k,
            ..Params::default()
        };
        add(&format!("tf32_params_{tm}x{tn}_s{st}_c{c}_k{k}"), tf32(1000, 1000, 520), Some(q));
    }
}

fn bench_cases() -> Vec<Case> {
    let mut v = vec![];
    let mut add = |label: &str, problem: Problem, params: Option<Params>| {
        v.push(Case {
            label: label.to_string(),
            problem,
            params,
            time: true,
        })
    };
    add(
        "gemm_bf16_8192",
        pr(8192, 8192, 8192, DType::BF16, R, R),
        None,
    );
    add(
        "gemm_bf16_8192_rc",
        pr(8192, 8192, 8192, DType::BF16, R, C),
        None,
    );
    add(
        "gemm_f16_8192",
        pr(8192, 8192, 8192, DType::F16, R, R),
        None,
    );
    add(
        "gemm_bf16_4096",
        pr(4096, 4096, 4096, DType::BF16, R, R),
        None,
    );
    // GPT-2's LM head: a plain product into rows of 50257 (not 16-byte aligned: element-wise
    // stores), and padded to 50264 (aligned rows), to compare.
    add("gpt2_lmhead_f16_4096x50257x768", pr(4096, 50257, 768, DType::F16, R, C), None);
    add("gpt2_lmhead_pad8_f16_4096x50264x768", pr(4096, 50264, 768, DType::F16, R, C), None);
    let mut ep = pr(8192, 4096, 16384, DType::BF16, R, C);
    ep.epilogue = Epilogue {
        bias: Some(DType::BF16),
        activation: Activation::Gelu,
    };
    add("gemm_bias_gelu_bf16_8192x4096x16384", ep, None);
    add(
        "gemv_bf16_16x8192x8192",
        pr(16, 8192, 8192, DType::BF16, R, C),
        None,
    );
    for (tm, tn, st, c, g, k) in [
        (128, 256, 4, 2, 8, 1),
        (128, 256, 4, 2, 8, 2),
        (128, 256, 4, 2, 16, 2),
        (256, 128, 4, 2, 8, 2),
        (128, 256, 4, 2, 16, 1),
        (128, 256, 4, 2, 8, 1),
    ] {
        let q = Params {
            tile_m: tm,
            tile_n: tn,
            stages: st,
            consumers: c,
            group_m: g,
            cluster_m: k,
            ..Params::default()
        };
        add(
            &format!("gemm_bf16_8192_{tm}x{tn}_s{st}_c{c}_g{g}_k{k}"),
            pr(8192, 8192, 8192, DType::BF16, R, R),
            Some(q),
        );
    }
    add(
        "gemm_fp8_8192",
        fp8(8192, 8192, 8192, DType::F8E4M3, DType::BF16),
        None,
    );
    add("gemm_tf32_8192", tf32(8192, 8192, 8192), None);
    let q = Params {
        cluster_m: 2,
        ..Params::default()
    };
    add(
        "gemm_f16_8192_k2",
        pr(8192, 8192, 8192, DType::F16, R, R),
        Some(q),
    );
    add(
        "gemm_bf16_8192_rc_k2",
        pr(8192, 8192, 8192, DType::BF16, R, C),
        Some(q),
    );
    add(
        "gemm_bf16_4096_k2",
        pr(4096, 4096, 4096, DType::BF16, R, R),
        Some(q),
    );
    v
}

/// Element (b, i, j) of an operand stored with `layout`.
fn at(layout: Layout, ld: usize, bs: usize, b: usize, i: usize, j: usize) -> usize {
    b * bs
        + match layout {
            Layout::RowMajor => i * ld + j,
            Layout::ColMajor => j * ld + i,
        }
}

fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + tilec_ref::kernels::elementwise::erf(x / std::f64::consts::SQRT_2))
}

struct Outcome {
    max_err: f64,
    rel_l2: f64,
    nan: usize,
    checked: usize,
    poison_kept: bool,
}

#[allow(clippy::too_many_arguments)]
fn verify(
    p: &Problem,
    a: &[f32],
    b: &[f32],
    scale: f64,
    bias: &[f64],
    out: &[f64],
    full_nan_scan: bool,
    rng: &mut Rng,
) -> Outcome {
    let (lda, ldb, ldc) = (p.lda(), p.ldb(), p.ldc());
    let mut nan = 0;
    // Every element of C inside the problem must be written (finite); padding must keep the
    // poison.
    let mut poison_kept = true;
    if full_nan_scan {
        for bb in 0..p.batch {
            for i in 0..p.m {
                let row = bb * p.batch_stride_c + i * ldc;
                nan += out[row..row + p.n]
                    .iter()
                    .filter(|v| !v.is_finite())
                    .count();
                if ldc > p.n && i + 1 < p.m {
                    poison_kept &= out[row + p.n..row + ldc].iter().all(|v| v.is_nan());
                }
            }
        }
    }
    let total = p.m * p.n * p.k * p.batch;
    let mut points = vec![];
    if total <= 1_100_000_000 {
        for bb in 0..p.batch {
            for i in 0..p.m {
                for j in 0..p.n {
                    points.push((bb, i, j));
                }
            }
        }
    } else {
        for _ in 0..3000 {
            points.push((rng.below(p.batch), rng.below(p.m), rng.below(p.n)));
        }
        for j in [0, p.n - 1] {
            for i in [0, p.m - 1] {
                points.push((p.batch - 1, i, j));
            }
        }
    }
    // The reference on all cores: (|out - ref|, |ref|, squared error, squared ref, NaNs).
    let one = |&(bb, i, j): &(usize, usize, usize)| -> (f64, f64, bool) {
        let mut s = 0f64;
        for kk in 0..p.k {
            let x = f64::from(a[at(p.a_layout, lda, p.batch_stride_a, bb, i, kk)]);
            let y = f64::from(b[at(p.b_layout, ldb, p.batch_stride_b, bb, kk, j)]);
            s += x * y;
        }
        s *= scale;
        if !bias.is_empty() {
            s += bias[j];
        }
        s = match p.epilogue.activation {
            Activation::None => s,
            Activation::Relu => s.max(0.0),
            Activation::Gelu => gelu(s),
        };
        (out[bb * p.batch_stride_c + i * ldc + j], s, true)
    };
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let chunk = points.len().div_ceil(threads).max(1);
    let parts: Vec<(f64, f64, f64, f64, usize)> = std::thread::scope(|sc| {
        let hs: Vec<_> = points
            .chunks(chunk)
            .map(|c| {
                sc.spawn(move || {
                    let (mut me, mut mr, mut se, mut sr, mut bad) =
                        (0f64, 0f64, 0f64, 0f64, 0usize);
                    for pt in c {
                        let (o, r, _) = one(pt);
                        if !o.is_finite() {
                            bad += 1;
                            continue;
                        }
                        me = me.max((o - r).abs());
                        mr = mr.max(r.abs());
                        se += (o - r) * (o - r);
                        sr += r * r;
                    }
                    (me, mr, se, sr, bad)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("reference thread"))
            .collect()
    });
    let (mut max_err, mut max_ref, mut se, mut sr) = (0f64, 0f64, 0f64, 0f64);
    for (me, mr, e, r, bad) in parts {
        max_err = max_err.max(me);
        max_ref = max_ref.max(mr);
        se += e;
        sr += r;
        nan += bad;
    }
    Outcome {
        max_err: max_err / max_ref.max(1e-30),
        rel_l2: (se / sr.max(1e-300)).sqrt(),
        nan,
        checked: points.len(),
        poison_kept,
    }
}

struct Operands {
    key: (DType, DType, usize, usize),
    a: Vec<f32>,
    b: Vec<f32>,
    da: DeviceBuffer,
    db: DeviceBuffer,
}


/// `n` random elements of `d` in [-1, 1) (fp8 rounded to nearest; f32 operands rounded to
/// tf32 when `tf32`): their bytes as stored and their exact values.
fn random_operand(d: DType, tf32: bool, n: usize, rng: &mut Rng) -> (Vec<u8>, Vec<f32>) {
    match d {
        DType::F8E4M3 | DType::F8E5M2 => {
            let table = host::fp8_table(d);
            let bits: Vec<u8> = (0..n).map(|_| host::fp8_bits(d, rng.unit())).collect();
            let vals = bits.iter().map(|&b| table[b as usize]).collect();
            (bits, vals)
        }
        DType::F32 => {
            let vals: Vec<f32> = (0..n)
                .map(|_| if tf32 { host::tf32_round(rng.unit()) } else { rng.unit() })
                .collect();
            (vals.iter().flat_map(|x| x.to_le_bytes()).collect(), vals)
        }
        _ => {
            let bits: Vec<u16> = (0..n).map(|_| to_bits(d, rng.unit())).collect();
            let vals = bits.iter().map(|&x| from_bits(d, x) as f32).collect();
            (bits.iter().flat_map(|x| x.to_le_bytes()).collect(), vals)
        }
    }
}

fn run_case(
    dev: &Device,
    comp: &Compiler,
    stream: &Stream,
    case: &Case,
    iters: usize,
    dump: Option<&str>,
    rng: &mut Rng,
    cache: &mut Option<Operands>,
) -> std::result::Result<serde_json::Value, String> {
    let s = |e: CudaError| e.to_string();
    let p = &case.problem;
    let sms = dev.props().sm_count as usize;
    let q = with_env(case.params.unwrap_or_else(|| gemm::heuristic(p, sms)));
    gemm::applies(p, &q, dev.props().compute_capability)?;
    let t0 = std::time::Instant::now();
    let kern = GemmKernel::load(dev, comp, p, &q).map_err(s)?;
    let compile_s = t0.elapsed().as_secs_f64();
    if let Some(dir) = dump {
        let _ = std::fs::write(format!("{dir}/{}.cu", kern.name), gemm::render(p, &q));
    }
    let (ea, eb, ec) = p.extents();
    let key = (p.in_dtype, p.b_dtype(), ea, eb);
    // Large operands are reused by the next case of the same size (timing variants); small
    // ones are drawn afresh for every case.
    if cache.as_ref().map(|c| c.key) != Some(key) || ea + eb < 1 << 24 {
        *cache = None;
        let (a_bytes, a) = random_operand(p.in_dtype, p.tf32, ea, rng);
        let (b_bytes, b) = random_operand(p.b_dtype(), p.tf32, eb, rng);
        let up = |bytes: &[u8]| -> Result<DeviceBuffer> {
            let buf = dev.alloc(bytes.len())?;
            buf.write(0, bytes)?;
            Ok(buf)
        };
        let da = up(&a_bytes).map_err(s)?;
        let db = up(&b_bytes).map_err(s)?;
        *cache = Some(Operands { key, a, b, da, db });
    }
    let ops = cache.as_ref().expect("filled above");
    let (a, b, da, db) = (&ops.a, &ops.b, &ops.da, &ops.db);
    let osz = p.out_dtype.size_bytes();
    let dc = dev.alloc(ec * osz).map_err(s)?;
    let (bias_f, dbias) = match p.epilogue.bias {
        Some(bd) => {
            let vals: Vec<f32> = (0..p.n).map(|_| rng.unit()).collect();
            let (f, bytes): (Vec<f64>, Vec<u8>) = match bd {
                DType::F32 => (
                    vals.iter().map(|&x| x as f64).collect(),
                    vals.iter().flat_map(|x| x.to_le_bytes()).collect(),
                ),
                _ => {
                    let bits: Vec<u16> = vals.iter().map(|&x| to_bits(bd, x)).collect();
                    (
                        bits.iter().map(|&x| from_bits(bd, x)).collect(),
                        bits.iter().flat_map(|x| x.to_le_bytes()).collect(),
                    )
                }
            };
            let buf = dev.alloc(bytes.len()).map_err(s)?;
            buf.write(0, &bytes).map_err(s)?;
            (f, Some(buf))
        }
        None => (vec![], None),
    };
    // Per-tensor scales: powers of two times a random factor, one f32 each on the device.
    let mut scale = 1f64;
    let mut scale_bufs = vec![];
    for set in [p.scale_a, p.scale_b] {
        if set {
            let v = (0.5 + rng.unit().abs()) * 2f32.powi(rng.below(5) as i32 - 2);
            scale *= f64::from(v);
            let buf = dev.alloc(4).map_err(s)?;
            buf.write(0, &v.to_le_bytes()).map_err(s)?;
            scale_bufs.push(Some(buf));
        } else {
            scale_bufs.push(None);
        }
    }
    let ptr = |b: &Option<DeviceBuffer>| b.as_ref().map(|x| x.ptr());
    let args = kern
        .args_scaled(
            p,
            da.ptr(),
            db.ptr(),
            dc.ptr(),
            dbias.as_ref().map(|x| x.ptr()),
            (ptr(&scale_bufs[0]), ptr(&scale_bufs[1])),
            &[],
        )
        .map_err(s)?;
    dc.fill_u32(stream, 0xffff_ffff).map_err(s)?;
    kern.launch(stream, &args).map_err(s)?;
    stream.synchronize().map_err(s)?;
    let mut raw = vec![0u8; ec * osz];
    dc.read(0, &mut raw).map_err(s)?;
    let out: Vec<f64> = match p.out_dtype {
        DType::F32 => raw
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
            .collect(),
        d => raw
            .chunks_exact(2)
            .map(|c| from_bits(d, u16::from_le_bytes([c[0], c[1]])))
            .collect(),
    };
    let o = verify(p, a, b, scale, &bias_f, &out, true, rng);
    let tol = match p.out_dtype {
        DType::BF16 => 1e-2,
        DType::F16 => 2e-3,
        _ => 1e-4,
    };
    // fp8 wgmma accumulates with fewer than f32's bits (reportedly about 14 kept: cuBLAS's
    // fast-accumulation mode): a bound that grows with the accumulations, one per 32 of K.
    let tol = if p.elem_bytes() == 1 {
        f64::max(tol, 5e-3).max(p.k.div_ceil(32) as f64 * 2f64.powi(-14))
    } else {
        tol
    };
    let ok = o.nan == 0 && o.poison_kept && o.max_err < tol;
    let f = kern.function();
    let mut j = json!({
        "kind": if case.time { "bench" } else { "check" },
        "label": case.label, "kernel": kern.name,
        "m": p.m, "n": p.n, "k": p.k, "batch": p.batch,
        "dtype": if p.tf32 { "tf32" } else { p.in_dtype.name() },
        "b_dtype": p.b_dtype().name(), "scales": format!("{}{}", if p.scale_a { "a" } else { "" }, if p.scale_b { "b" } else { "" }),
        "out": p.out_dtype.name(),
        "layouts": format!("{:?}{:?}", p.a_layout, p.b_layout),
        "params": format!("{}x{}x{} s{} c{} g{} k{}", q.tile_m, q.tile_n, q.tile_k, q.stages, q.consumers, q.group_m, q.cluster_m),
        "ok": ok, "tol": tol, "max_err": o.max_err, "rel_l2": o.rel_l2, "nan": o.nan, "checked": o.checked,
        "poison_kept": o.poison_kept,
        "regs": f.num_regs().unwrap_or(0), "local_bytes": f.local_bytes().unwrap_or(0),
        "compile_s": compile_s, "cache_hit": kern.cache_hit,
        "grid": args.launch.grid.0, "smem": args.launch.shared_mem_bytes,
    });
    if case.time && ok {
        for _ in 0..5 {
            kern.launch(stream, &args).map_err(s)?;
        }
        stream.synchronize().map_err(s)?;
        let events: Vec<(Event, Event)> = (0..iters)
            .map(|_| Ok((dev.event()?, dev.event()?)))
            .collect::<Result<_>>()
            .map_err(s)?;
        for (e0, e1) in &events {
            e0.record(stream).map_err(s)?;
            kern.launch(stream, &args).map_err(s)?;
            e1.record(stream).map_err(s)?;
        }
        stream.synchronize().map_err(s)?;
        let times: Vec<f32> = events
            .iter()
            .map(|(e0, e1)| e1.elapsed_ms_since(e0))
            .collect::<Result<_>>()
            .map_err(s)?;
        let ms = median(times.clone());
        let best = times.iter().cloned().fold(f32::MAX, f32::min) as f64;
        let bytes = (ea + eb) * p.elem_bytes() + ec * osz;
        j["ms"] = json!(ms);
        j["ms_min"] = json!(best);
        j["tflops"] = json!(p.flops() / ms / 1e9);
        j["tb_s"] = json!(bytes as f64 / ms / 1e9);
    }
    Ok(j)
}

/// `GEMM_STAGED=0|1` turns the staged epilogue off or on (for comparisons), fitting the stages;
/// `GEMM_SHUFFLE=0|1` the epilogue regrouped by warp shuffles (on: in place of staging);
/// `GEMM_PINGPONG=1` runs two consumer warpgroups on tiles of their own (128x128 tiles);
/// `GEMM_SK=0|1` stream-K.
fn with_env(q: Params) -> Params {
    let flag = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u8>().ok());
    let mut q = q;
    if let Some(v) = flag("GEMM_STAGED") {
        q.staged = v != 0;
    }
    // `GEMM_ROWSTORE=0|1`: the shuffled epilogue's row stores for unaligned rows of C.
    if let Some(v) = flag("GEMM_ROWSTORE") {
        q.rowstore = v != 0 && q.shuffle && !q.staged;
        while q.stages > 2 && q.smem_bytes() > gemm::MAX_SMEM {
            q.stages -= 1;
        }
    }
    if let Some(v) = flag("GEMM_PARK16") {
        q.park16 = v != 0;
    }
    if let Some(v) = flag("GEMM_SHUFFLE") {
        q.shuffle = v != 0;
        if v != 0 {
            q.staged = false;
        }
    }
    if flag("GEMM_PINGPONG") == Some(1) && q.consumers == 2 && q.cluster_m == 1 {
        q.pingpong = true;
        q.tile_m = 128;
        q.tile_n = q.tile_n.min(128);
        q.stages = 8;
    }
    // `GEMM_SK=0|1`: stream-K off or on (on: without ping-pong or clusters).
    if let Some(v) = flag("GEMM_SK") {
        q.stream_k = v != 0;
        if v != 0 {
            q.pingpong = false;
            q.cluster_m = 1;
        }
    }
    while q.stages > 2 && q.smem_bytes() > gemm::MAX_SMEM {
        q.stages -= 1;
    }
    q
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let phase = argv.first().cloned().unwrap_or_else(|| "check".into());
    let opt = |name: &str| {
        argv.iter()
            .position(|a| a == name)
            .and_then(|i| argv.get(i + 1).cloned())
    };
    let iters: usize = opt("--iters").and_then(|v| v.parse().ok()).unwrap_or(30);
    let dump = opt("--dump");
    // `--only a,b`: cases whose label contains any of the parts.
    let only: Option<Vec<String>> =
        opt("--only").map(|o| o.split(',').map(str::to_string).collect());
    let selected = |label: &str| {
        only.as_ref()
            .is_none_or(|o| o.iter().any(|part| label.contains(part.as_str())))
    };
    let fail = |e: String| -> ! {
        eprintln!("gemm_bench: {e}");
        std::process::exit(1)
    };
    if phase == "compile" {
        let nv = Nvrtc::load().unwrap_or_else(|e| fail(e.to_string()));
        let comp = Compiler::new(nv, "sm_90a").with_cache_dir(None);
        let mut modules: Vec<(String, String)> = vec![];
        for c in check_cases().into_iter().chain(bench_cases()) {
            let q = with_env(c.params.unwrap_or_else(|| gemm::heuristic(&c.problem, 132)));
            if let Err(e) = gemm::applies(&c.problem, &q, (9, 0)) {
                println!("{}", json!({"label": c.label, "error": e}));
                continue;
            }
            let name = gemm::kernel_name(&c.problem, &q);
            if selected(&c.label) && !modules.iter().any(|m| m.0 == name) {
                let src = gemm::render(&c.problem, &q);
                if let Some(dir) = &dump {
                    let _ = std::fs::write(format!("{dir}/{name}.cu"), &src);
                }
                modules.push((name, src));
            }
        }
        let results = comp.compile_many(&modules);
        let failed = results.iter().filter(|r| r.is_err()).count();
        for (r, (name, _)) in results.iter().zip(&modules) {
            if let Err(e) = r {
                println!("{}", json!({"compile_error": name, "error": e.to_string()}));
            }
        }
        println!("{}", json!({"compiled": modules.len(), "failed": failed}));
        std::process::exit(i32::from(failed > 0));
    }
    let dev = Device::open(0).unwrap_or_else(|e| fail(e.to_string()));
    let nv = Nvrtc::load().unwrap_or_else(|e| fail(e.to_string()));
    let props = dev.props().clone();
    println!(
        "{}",
        json!({"device": props.name, "sms": props.sm_count, "arch": props.arch(),
               "nvrtc": format!("{:?}", nv.version()), "driver": driver_version().unwrap_or(0)})
    );
    let comp = Compiler::new(nv, &props.arch());
    let stream = dev.stream().unwrap_or_else(|e| fail(e.to_string()));
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    let mut rng = Rng(seed);
    let cases = if phase == "bench" {
        bench_cases()
    } else {
        check_cases()
    };
    // Compile every kernel first, in parallel (later loads hit the compiler's cache).
    let sms = props.sm_count as usize;
    let modules: Vec<(String, String)> = cases
        .iter()
        .filter(|c| selected(&c.label))
        .filter_map(|c| {
            let q = with_env(c.params.unwrap_or_else(|| gemm::heuristic(&c.problem, sms)));
            gemm::applies(&c.problem, &q, props.compute_capability).ok()?;
            Some((
                gemm::kernel_name(&c.problem, &q),
                gemm::render(&c.problem, &q),
            ))
        })
        .collect();
    let t0 = std::time::Instant::now();
    let compiled = comp.compile_many(&modules);
    for (r, (name, _)) in compiled.iter().zip(&modules) {
        if let Err(e) = r {
            println!("{}", json!({"compile_error": name, "error": e.to_string()}));
        }
    }
    println!(
        "{}",
        json!({"compiled": modules.len(), "seconds": t0.elapsed().as_secs_f64()})
    );
    let (mut pass, mut total) = (0, 0);
    let mut cache = None;
    for c in cases {
        if !selected(&c.label) {
            continue;
        }
        total += 1;
        match run_case(
            &dev,
            &comp,
            &stream,
            &c,
            iters,
            dump.as_deref(),
            &mut rng,
            &mut cache,
        ) {
            Ok(j) => {
                pass += usize::from(j["ok"] == json!(true));
                println!("{j}");
            }
            Err(e) => println!(
                "{}",
                json!({"kind": phase, "label": c.label, "ok": false, "error": e,
                       "m": c.problem.m, "n": c.problem.n, "k": c.problem.k,
                       "layouts": format!("{:?}{:?}", c.problem.a_layout, c.problem.b_layout)})
            ),
        }
    }
    println!(
        "{}",
        json!({"summary": phase, "passed": pass, "total": total})
    );
}
