//! Checks and times the exact-f32 SIMT GEMM family (`simt_f32_gemm`) on a GPU.
//!
//! Usage: `f32_bench check|bench|compile [--iters N] [--only SUBSTRING] [--dump DIR]`
//! - `check`: small and ragged shapes over the four layout pairs, misaligned leading
//!   dimensions (scalar reads), batches (a broadcast B too), M = 1, split-K and a custom
//!   epilogue (bias and ReLU): fresh random inputs, the output poisoned with NaN first, each
//!   kernel launched twice (split-K counters must be back at zero), compared with an f64
//!   reference on the CPU (every element of small problems, samples of large ones).
//! - `bench`: `gemm_f32_8192` (A and B row-major, as `bench/gemm_tc_peer.py`'s exact-f32
//!   peer) and 4096, timed (median of `--iters` runs, CUDA events) and checked on samples.
//!
//! `F32_PARAMS=tile_m,tile_n,tile_k,split_k[,min_blocks]` overrides the heuristic's parameters for cases
//! that do not fix their own (sweeps). Prints one JSON object per line, then a summary line.

use serde_json::json;
use tilec_cuda::families::OperandRef;
use tilec_cuda::gemm::{CustomEpilogue, Layout, Problem};
use tilec_cuda::simt::{self, Params, SimtKernel};
use tilec_cuda::*;
use tilec_ir::DType;

mod common;
use common::Rng;

use Layout::{ColMajor as C, RowMajor as R};

struct Case {
    label: String,
    m: usize,
    n: usize,
    k: usize,
    batch: usize,
    a: Layout,
    b: Layout,
    lda: usize,
    ldb: usize,
    /// B shared by every batch (batch stride 0).
    shared_b: bool,
    /// The epilogue adds a bias over N and applies ReLU.
    bias_relu: bool,
    params: Option<Params>,
    time: bool,
}

/// A case with dense leading dimensions padded to `pad` elements.
#[allow(clippy::too_many_arguments)]
fn case(label: &str, m: usize, n: usize, k: usize, batch: usize, a: Layout, b: Layout, pad: usize) -> Case {
    let lda = if a == R { k.next_multiple_of(pad) } else { m.next_multiple_of(pad) };
    let ldb = if b == R { n.next_multiple_of(pad) } else { k.next_multiple_of(pad) };
    Case { label: label.into(), m, n, k, batch, a, b, lda, ldb, shared_b: false, bias_relu: false, params: None, time: false }
}

fn with(c: Case, q: Params) -> Case {
    Case { params: Some(q), ..c }
}

fn lname(a: Layout, b: Layout) -> String {
    let l = |l: Layout| if l == R { 'r' } else { 'c' };
    format!("{}{}", l(a), l(b))
}

fn check_cases() -> Vec<Case> {
    let mut v = vec![];
    let q = |tile_m, tile_n, tile_k, split_k| Params { tile_m, tile_n, tile_k, split_k, min_blocks: 2 };
    for (a, b) in [(R, C), (R, R), (C, C), (C, R)] {
        let l = lname(a, b);
        v.push(with(case(&format!("layouts_{l}"), 296, 200, 136, 1, a, b, 4), Params::default()));
        v.push(with(case(&format!("ragged_{l}"), 291, 203, 130, 1, a, b, 4), Params::default()));
        v.push(with(case(&format!("ragged_scalar_{l}"), 291, 203, 130, 1, a, b, 1), q(64, 64, 16, 1)));
        v.push(case(&format!("ragged_heuristic_{l}"), 291, 203, 130, 1, a, b, 4));
    }
    v.push(with(case("tile_32x128", 300, 520, 264, 1, R, C, 4), q(32, 128, 8, 1)));
    v.push(with(case("tile_128x32_k16", 300, 520, 264, 1, C, R, 4), q(128, 32, 16, 1)));
    v.push(with(case("tile_64x32", 77, 45, 33, 1, R, R, 1), q(64, 32, 8, 1)));
    v.push(case("batched", 72, 136, 200, 3, R, R, 4));
    v.push(case("batched_cc_ragged", 100, 65, 97, 2, C, C, 1));
    let mut shared = case("batched_shared_b", 40, 96, 64, 4, C, R, 4);
    shared.shared_b = true;
    v.push(shared);
    v.push(case("m1", 1, 777, 512, 1, R, C, 4));
    v.push(case("m1_rr_ragged", 1, 1001, 999, 1, R, R, 1));
    v.push(with(case("split_m16_rc", 16, 1000, 2048, 1, R, C, 4), q(32, 64, 16, 4)));
    v.push(with(case("split_ragged_cr", 70, 90, 1000, 1, C, R, 1), q(64, 64, 8, 7)));
    v.push(case("split_heuristic", 16, 4096, 4096, 1, R, C, 4));
    let mut epi = with(case("bias_relu_ragged", 291, 203, 130, 1, R, C, 4), Params::default());
    epi.bias_relu = true;
    v.push(epi);
    let mut epi = with(case("bias_relu_split", 33, 200, 900, 1, R, R, 4), q(32, 64, 16, 3));
    epi.bias_relu = true;
    v.push(epi);
    v
}

fn bench_cases() -> Vec<Case> {
    let mut v = vec![];
    for (label, s, a, b) in [
        ("gemm_f32_8192", 8192, R, R),
        ("gemm_f32_8192_rc", 8192, R, C),
        ("gemm_f32_4096", 4096, R, R),
    ] {
        v.push(Case { time: true, ..case(label, s, s, s, 1, a, b, 4) });
    }
    v.push(Case { time: true, ..case("gemv_f32_1x4096x4096", 1, 4096, 4096, 1, R, C, 4) });
    v
}

/// The problem with an epilogue storing C densely (`[batch][m][n]`), optionally
/// `max(acc + bias[j], 0)`.
fn problem(c: &Case) -> Problem {
    let mut params = vec!["const float* __restrict__ a".to_string(), "const float* __restrict__ b".into(), "float* __restrict__ c".into()];
    let value = if c.bias_relu {
        params.push("const float* __restrict__ bias".into());
        "fmaxf(tl_acc + bias[tl_j], 0.f)"
    } else {
        "tl_acc"
    };
    let source = format!(
        "static __device__ __forceinline__ void tl_epi({}, long long tl_b, long long tl_i, long long tl_j, float tl_acc) {{ c[tl_b * {} + tl_i * {} + tl_j] = {value}; }}\n",
        params.join(", "),
        c.m * c.n,
        c.n
    );
    let mut p = Problem::new(c.m, c.n, c.k, DType::F32).with_layouts(c.a, c.b);
    p.lda = Some(c.lda);
    p.ldb = Some(c.ldb);
    p.batch = c.batch;
    p.batch_stride_a = c.lda * if c.a == R { c.m } else { c.k };
    p.batch_stride_b = if c.shared_b { 0 } else { c.ldb * if c.b == R { c.k } else { c.n } };
    p.custom = Some(CustomEpilogue { loads: false, name: "tl_epi".into(), source, params, rows: None, rounds_to: None, vector: None });
    p
}

/// The case's parameters, else `F32_PARAMS`, else the heuristic's.
fn params_of(c: &Case, p: &Problem, sms: usize) -> Params {
    if let Some(q) = c.params {
        return q;
    }
    let env: Vec<usize> = std::env::var("F32_PARAMS").unwrap_or_default().split(',').filter_map(|x| x.parse().ok()).collect();
    match env[..] {
        [tile_m, tile_n, tile_k, split_k] => Params { tile_m, tile_n, tile_k, split_k, min_blocks: 2 },
        [tile_m, tile_n, tile_k, split_k, min_blocks] => Params { tile_m, tile_n, tile_k, split_k, min_blocks },
        _ => simt::heuristic(p, sms),
    }
}

const A: OperandRef = OperandRef { param: 0, offset_bytes: 0 };
const B: OperandRef = OperandRef { param: 1, offset_bytes: 0 };

fn reference(c: &Case, p: &Problem, a: &[f32], b: &[f32], bias: &[f32], idx: usize) -> f64 {
    let (bz, i, j) = (idx / (c.m * c.n), idx % (c.m * c.n) / c.n, idx % c.n);
    let s: f64 = (0..c.k)
        .map(|kk| {
            let ai = bz * p.batch_stride_a + if c.a == R { i * c.lda + kk } else { kk * c.lda + i };
            let bi = bz * p.batch_stride_b + if c.b == R { kk * c.ldb + j } else { j * c.ldb + kk };
            a[ai] as f64 * b[bi] as f64
        })
        .sum();
    if c.bias_relu {
        (s + bias[j] as f64).max(0.0)
    } else {
        s
    }
}

fn run_case(dev: &Device, comp: &Compiler, stream: &Stream, c: &Case, iters: usize, dump: Option<&str>, rng: &mut Rng) -> std::result::Result<serde_json::Value, String> {
    let s = |e: CudaError| e.to_string();
    let p = problem(c);
    let q = params_of(c, &p, dev.props().sm_count as usize);
    simt::applies(&p, &q, dev.props().compute_capability)?;
    let name = simt::kernel_name(&p, &q, &A, &B);
    let source = simt::render(&p, &q, &A, &B);
    if let Some(dir) = dump {
        let _ = std::fs::write(format!("{dir}/{name}.cu"), &source);
    }
    let t0 = std::time::Instant::now();
    let compiled = comp.compile(&name, &source).map_err(s)?;
    let compile_s = t0.elapsed().as_secs_f64();
    let kern = SimtKernel::from_image(dev, &p, &q, &A, &B, &compiled.image, compiled.cache_hit).map_err(s)?;
    let (_, eb, _) = p.extents();
    let ea = c.batch * p.batch_stride_a;
    let eb = if c.shared_b { eb } else { c.batch * p.batch_stride_b };
    let ec = c.batch * c.m * c.n;
    let a: Vec<f32> = (0..ea).map(|_| rng.unit()).collect();
    let b: Vec<f32> = (0..eb).map(|_| rng.unit()).collect();
    let bias: Vec<f32> = (0..c.n).map(|_| rng.unit()).collect();
    let up = |v: &[f32]| -> Result<DeviceBuffer> {
        let buf = dev.alloc(v.len().max(1) * 4)?;
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        buf.write(0, &bytes)?;
        Ok(buf)
    };
    let (da, db, dbias) = (up(&a).map_err(s)?, up(&b).map_err(s)?, up(&bias).map_err(s)?);
    let dc = dev.alloc(ec * 4).map_err(s)?;
    let mut ptrs = vec![da.ptr(), db.ptr(), dc.ptr()];
    if c.bias_relu {
        ptrs.push(dbias.ptr());
    }
    dc.fill_u32(stream, 0xffff_ffff).map_err(s)?;
    kern.launch(stream, &ptrs).map_err(s)?;
    // Twice: the split-K counters must be back at zero after a launch.
    kern.launch(stream, &ptrs).map_err(s)?;
    stream.synchronize().map_err(s)?;
    let mut raw = vec![0u8; ec * 4];
    dc.read(0, &mut raw).map_err(s)?;
    let out: Vec<f64> = raw.chunks_exact(4).map(|x| f32::from_le_bytes([x[0], x[1], x[2], x[3]]) as f64).collect();
    let nan = out.iter().filter(|x| !x.is_finite()).count();
    let mut points: Vec<usize> = if ec <= 1 << 16 { (0..ec).collect() } else { (0..2000).map(|_| rng.below(ec)).collect() };
    points.extend([0, ec - 1]);
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let chunk = points.len().div_ceil(threads).max(1);
    let parts: Vec<(f64, f64)> = std::thread::scope(|sc| {
        let hs: Vec<_> = points
            .chunks(chunk)
            .map(|ch| {
                let (a, b, bias, out, p) = (&a, &b, &bias, &out, &p);
                sc.spawn(move || {
                    let (mut me, mut mr) = (0f64, 0f64);
                    for &i in ch {
                        let r = reference(c, p, a, b, bias, i);
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
    // Exact f32 products summed in f32: about sqrt(K) roundings of the sum's size.
    let ok = nan == 0 && max_err < 1e-5;
    let f = kern.function();
    let cfg = kern.launch_config();
    let mut j = json!({
        "kind": if c.time { "bench" } else { "check" },
        "label": c.label, "kernel": name,
        "m": c.m, "n": c.n, "k": c.k, "batch": c.batch, "layouts": lname(c.a, c.b), "lda": c.lda, "ldb": c.ldb,
        "params": format!("{}x{}x{} k{}", q.tile_m, q.tile_n, q.tile_k, q.split_k),
        "vectors": [simt::render::vector_a(&p, &A), simt::render::vector_b(&p, &B)],
        "ok": ok, "max_err": max_err, "nan": nan, "checked": points.len(),
        "regs": f.num_regs().unwrap_or(0), "local_bytes": f.local_bytes().unwrap_or(0),
        "compile_s": compile_s, "grid": [cfg.grid.0, cfg.grid.2],
    });
    if c.time && ok {
        let ms = common::time_ms(dev, stream, 5, iters, || kern.launch(stream, &ptrs)).map_err(s)?;
        j["ms"] = json!(ms);
        j["tflops"] = json!(p.flops() / ms / 1e9);
        j["tb_s"] = json!(((ea + eb + ec) * 4) as f64 / ms / 1e9);
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
        eprintln!("f32_bench: {e}");
        std::process::exit(1)
    };
    if phase == "compile" {
        // No device: renders and compiles (NVRTC, sm_90a) the kernels of both phases for 132
        // SMs; `--dump DIR` writes their sources and cubins.
        let nv = Nvrtc::load().unwrap_or_else(|e| fail(e.to_string()));
        let comp = Compiler::new(nv, "sm_90a").with_cache_dir(None);
        let mut modules: Vec<(String, String)> = vec![];
        for c in check_cases().into_iter().chain(bench_cases()) {
            let p = problem(&c);
            let q = params_of(&c, &p, 132);
            let name = simt::kernel_name(&p, &q, &A, &B);
            if only.as_ref().is_none_or(|o| c.label.contains(o.as_str())) && simt::applies(&p, &q, (9, 0)).is_ok() && !modules.iter().any(|m| m.0 == name) {
                modules.push((name, simt::render(&p, &q, &A, &B)));
            }
        }
        let results = comp.compile_many(&modules);
        for (r, (name, src)) in results.iter().zip(&modules) {
            match r {
                Ok(c) => {
                    if let Some(dir) = &dump {
                        let _ = std::fs::write(format!("{dir}/{name}.cu"), src);
                        let _ = std::fs::write(format!("{dir}/{name}.cubin"), &c.image);
                    }
                }
                Err(e) => println!("{}", json!({"compile_error": name, "error": e.to_string()})),
            }
        }
        let failed = results.iter().filter(|r| r.is_err()).count();
        println!("{}", json!({"compiled": modules.len(), "failed": failed}));
        std::process::exit(i32::from(failed > 0));
    }
    if phase != "check" && phase != "bench" {
        fail(format!("unknown phase {phase:?} (check, bench or compile)"));
    }
    let dev = Device::open(0).unwrap_or_else(|e| fail(e.to_string()));
    let nv = Nvrtc::load().unwrap_or_else(|e| fail(e.to_string()));
    let props = dev.props().clone();
    println!("{}", json!({"device": props.name, "sms": props.sm_count, "arch": props.arch(), "nvrtc": format!("{:?}", nv.version())}));
    let comp = Compiler::new(nv, &props.arch());
    let stream = dev.stream().unwrap_or_else(|e| fail(e.to_string()));
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1);
    let mut rng = Rng(seed);
    let cases = if phase == "bench" { bench_cases() } else { check_cases() };
    let cases: Vec<Case> = cases.into_iter().filter(|c| only.as_ref().is_none_or(|o| c.label.contains(o.as_str()))).collect();
    // Compile every kernel first, in parallel (the runs then hit the compiler's cache).
    let sms = props.sm_count as usize;
    let modules: Vec<(String, String)> = cases
        .iter()
        .filter_map(|c| {
            let p = problem(c);
            let q = params_of(c, &p, sms);
            simt::applies(&p, &q, props.compute_capability).ok()?;
            Some((simt::kernel_name(&p, &q, &A, &B), simt::render(&p, &q, &A, &B)))
        })
        .collect();
    common::precompile(&comp, &modules);
    common::run_all(&cases, |x| &x.label, |c| run_case(&dev, &comp, &stream, c, iters, dump.as_deref(), &mut rng));
}
