//! Checks and times the decode-shaped GEMV family (`crate::gemv`) on a GPU.
//!
//! Usage: `gemv_bench check|bench [--iters N] [--only SUBSTRING] [--stream] [--dump DIR]`
//! - `check`: 1, 5, 8, 9 and 16 rows, ragged N and K, both B layouts (a row-major B repacked
//!   when the kernel is bound), batches, forced parameters (split-K, unrolls, warps along K):
//!   fresh random inputs, the output poisoned with NaN first, compared with an f64 reference
//!   on the CPU (every element of small problems, samples of large ones), launched twice (the
//!   split-K counters must be back at zero).
//! - `bench`: `gemv_bf16_16x8192x8192` (B column-major: `nn.Linear`'s weight), its `_rr`
//!   twin (B row-major, repacked at bind, so the timed kernel reads K-contiguous rows) and the
//!   LLM decode products `llm_bf16_{1,16}xNxK`, timed (median of `--iters` runs, CUDA events)
//!   in µs and TB/s of A + B + C, and checked on samples. With `--stream`, each time is a
//!   long run of launches back to back (one event pair around it) over copies of B that
//!   together exceed the L2: weights from memory and one stream's launch gaps, as in a
//!   decode step, rather than one launch between events with B in the L2.
//!
//! `GEMV_PARAMS=warps_n,warps_k,cols,unroll,split_k[,prefetch[,min_blocks[,stages[,tiled[,a_ahead[,early]]]]]]` replaces
//! the heuristic's parameters (for sweeps; split_k 0: the heuristic's split for the others). Prints one JSON object per line, then a summary.

use serde_json::json;
use tilec_cuda::families::OperandRef;
use tilec_cuda::gemm::{CustomEpilogue, Layout, Problem};
use tilec_cuda::gemv::{self, GemvKernel, Params};
use tilec_cuda::*;
use tilec_ir::DType;

mod common;
use common::{from_bits, to_bits, Rng};

use Layout::{ColMajor as C, RowMajor as R};

struct Case {
    label: String,
    dtype: DType,
    out: DType,
    m: usize,
    n: usize,
    k: usize,
    batch: usize,
    /// B's layout (row-major: repacked at bind, one B shared by the batches).
    b: Layout,
    params: Option<Params>,
    time: bool,
}

fn case(label: &str, dtype: DType, m: usize, n: usize, k: usize, batch: usize, b: Layout, params: Option<Params>) -> Case {
    Case { label: label.into(), dtype, out: DType::F32, m, n, k, batch, b, params, time: false }
}

fn check_cases() -> Vec<Case> {
    let d = Params::default();
    let mut v = vec![];
    for b in [C, R] {
        let l = if b == C { "cc" } else { "rr" };
        v.push(case(&format!("m16_{l}"), DType::BF16, 16, 512, 1024, 1, b, None));
        v.push(case(&format!("m1_{l}"), DType::F16, 1, 777, 512, 1, b, None));
        v.push(case(&format!("m5_{l}"), DType::BF16, 5, 520, 1000, 1, b, None));
        v.push(case(&format!("ragged_16x203x1000_{l}"), DType::BF16, 16, 203, 1000, 1, b, None));
        v.push(case(&format!("ragged_1x8200x4104_{l}"), DType::F16, 1, 8200, 4104, 1, b, None));
        v.push(case(&format!("ragged_9x100x33_{l}"), DType::F16, 9, 100, 33, 1, b, None));
        v.push(case(&format!("ragged_8x13x7_{l}"), DType::BF16, 8, 13, 7, 1, b, None));
        v.push(case(&format!("batched_4x300x520_{l}"), DType::BF16, 4, 300, 520, 3, b, None));
        v.push(case(&format!("split_ragged_16x1000x2052_{l}"), DType::BF16, 16, 1000, 2052, 1, b, Some(Params { split_k: 5, ..d })));
    }
    v.push(case("unroll4_cols4_m8", DType::F16, 8, 1030, 3000, 1, C, Some(Params { cols: 4, unroll: 4, warps_n: 2, warps_k: 2, split_k: 3, ..d })));
    v.push(case("warps_k4_prefetch", DType::BF16, 12, 4096, 4096, 1, C, Some(Params { warps_n: 2, warps_k: 4, prefetch: 256, ..d })));
    v.push(case("unroll8_min_blocks", DType::BF16, 16, 2048, 2048, 1, C, Some(Params { cols: 1, unroll: 8, min_blocks: 4, ..d })));
    v.push(case("batched_split_ragged", DType::F16, 3, 72, 1000, 5, C, Some(Params { split_k: 4, ..d })));
    v.push(case("heuristic_decode", DType::BF16, 16, 4096, 4096, 1, C, None));
    // The shared-memory stages: ragged N and K (zero-filled pieces, a partial piece), splits
    // whose last one is short or empty, both layouts, 1 to 16 rows.
    let st = Params { stages: 3, ..d };
    for b in [C, R] {
        let l = if b == C { "cc" } else { "rr" };
        v.push(case(&format!("staged_16x203x1000_{l}"), DType::BF16, 16, 203, 1000, 1, b, Some(st)));
        v.push(case(&format!("staged_1x8200x4100_{l}"), DType::F16, 1, 8200, 4104, 1, b, Some(Params { stages: 4, unroll: 4, ..d })));
        v.push(case(&format!("staged_split_9x1000x2052_{l}"), DType::BF16, 9, 1000, 2052, 1, b, Some(Params { split_k: 3, ..st })));
    }
    // Tiled weights: ragged N and K (zero tiles past them), both layouts, splits, batches
    // sharing one B.
    let tl = Params { tiled: true, ..d };
    for b in [C, R] {
        let l = if b == C { "cc" } else { "rr" };
        v.push(case(&format!("tiled_16x203x1000_{l}"), DType::BF16, 16, 203, 1000, 1, b, Some(tl)));
        v.push(case(&format!("tiled_1x8200x4104_{l}"), DType::F16, 1, 8200, 4104, 1, b, Some(Params { unroll: 4, split_k: 3, ..tl })));
        v.push(case(&format!("tiled_ragged_9x100x33_{l}"), DType::F16, 9, 100, 33, 1, b, Some(tl)));
    }
    let ah = Params { a_ahead: true, ..d };
    v.push(case("ahead_16x520x1000", DType::BF16, 16, 520, 1000, 1, C, Some(Params { split_k: 3, ..ah })));
    v.push(case("ahead_tiled_5x203x1000", DType::F16, 5, 203, 1000, 1, R, Some(Params { tiled: true, unroll: 4, ..ah })));
    v.push(case("ahead_ragged_9x100x33", DType::BF16, 9, 100, 33, 1, C, Some(ah)));
    // Weights requested before the wait for the previous kernel: tiled and row-major
    // repacked, ragged, split, A ahead or not, steps fewer than the early ones.
    let ea = Params { tiled: true, a_ahead: true, unroll: 4, early: 3, ..d };
    v.push(case("early_tiled_16x203x1000", DType::BF16, 16, 203, 1000, 1, C, Some(ea)));
    v.push(case("early_tiled_split_1x2560x2048", DType::BF16, 1, 2560, 2048, 1, C, Some(Params { warps_n: 2, warps_k: 4, cols: 1, split_k: 2, ..ea })));
    v.push(case("early_rr_9x100x33", DType::F16, 9, 100, 33, 1, R, Some(Params { tiled: false, a_ahead: false, early: 2, ..ea })));
    v.push(case("early_rr_split_5x1000x2052", DType::BF16, 5, 1000, 2052, 1, R, Some(Params { tiled: false, split_k: 3, early: 8, ..ea })));
    v.push(case("early_tiled_batched_4x300x520_rr", DType::BF16, 4, 300, 520, 3, R, Some(Params { early: 1, ..ea })));
    v.push(case("tiled_batched_shared_4x300x520_rr", DType::BF16, 4, 300, 520, 3, R, Some(Params { split_k: 2, ..tl })));
    v.push(case("staged_ragged_8x13x7", DType::BF16, 8, 13, 7, 1, C, Some(st)));
    v.push(case("staged_batched_3x72x1000", DType::F16, 3, 72, 1000, 5, C, Some(Params { split_k: 4, ..st })));
    v.push(case("staged_empty_split_5x64x2304", DType::BF16, 5, 64, 2304, 1, C, Some(Params { split_k: 4, unroll: 4, warps_k: 2, ..st })));
    v.push(case("staged_wide_16x4096x4096", DType::BF16, 16, 4096, 4096, 1, C, Some(Params { warps_n: 4, warps_k: 2, cols: 4, unroll: 2, stages: 4, split_k: 2, ..d })));
    v
}

fn bench_cases() -> Vec<Case> {
    let mut v = vec![];
    let mut add = |label: String, m, n, k, b| {
        v.push(Case { label, dtype: DType::BF16, out: DType::BF16, m, n, k, batch: 1, b, params: None, time: true })
    };
    add("gemv_bf16_16x8192x8192".into(), 16, 8192, 8192, C);
    add("gemv_bf16_16x8192x8192_rr".into(), 16, 8192, 8192, R);
    for m in [1, 16] {
        for (n, k) in [(4096, 4096), (14336, 4096), (4096, 14336)] {
            add(format!("llm_bf16_{m}x{n}x{k}"), m, n, k, C);
        }
        // A 1.1B LLaMA's decode products: q, k and v merged, o, gate and up merged, down, the
        // LM head.
        for (n, k) in [(2560, 2048), (2048, 2048), (11264, 2048), (2048, 5632), (32000, 2048)] {
            add(format!("llm_bf16_{m}x{n}x{k}"), m, n, k, C);
        }
    }
    v
}

fn storage(d: DType) -> &'static str {
    match d {
        DType::F32 => "float",
        DType::F16 => "tl_f16",
        _ => "tl_bf16",
    }
}
fn store(d: DType) -> &'static str {
    match d {
        DType::F32 => "tl_acc",
        DType::F16 => "tl_st_f16(tl_acc)",
        _ => "tl_st_bf16(tl_acc)",
    }
}

/// Leading dimensions: A rows and a column-major B's rows padded to 8 elements; a row-major
/// B's rows exactly N long (the repack reads them element by element).
fn lds(c: &Case) -> (usize, usize) {
    (c.k.next_multiple_of(8), if c.b == C { c.k.next_multiple_of(8) } else { c.n })
}

/// Elements of A, B and C.
fn sizes(c: &Case) -> (usize, usize, usize) {
    let (lda, ldb) = lds(c);
    let b = if c.b == C { c.batch * c.n * ldb } else { c.k * ldb };
    (c.batch * c.m * lda, b, c.batch * c.m * c.n)
}

/// The problem with an epilogue storing C densely (`[batch][m][n]`).
fn problem(c: &Case) -> Problem {
    let (lda, ldb) = lds(c);
    let mut p = Problem::new(c.m, c.n, c.k, c.dtype).with_layouts(R, c.b);
    p.lda = Some(lda);
    p.ldb = Some(ldb);
    p.batch = c.batch;
    p.batch_stride_a = c.m * lda;
    p.batch_stride_b = if c.b == C { c.n * ldb } else { 0 };
    p.batch_stride_c = c.m * c.n;
    p.out_dtype = c.out;
    let params = vec![
        format!("const {}* __restrict__ a", storage(c.dtype)),
        format!("const {}* __restrict__ b", storage(c.dtype)),
        format!("{}* __restrict__ c", storage(c.out)),
    ];
    let source = format!(
        "static __device__ __forceinline__ void tl_epi({}, long long tl_b, long long tl_i, long long tl_j, float tl_acc) {{ c[tl_b * {} + tl_i * {} + tl_j] = {}; }}\n",
        params.join(", "),
        c.m * c.n,
        c.n,
        store(c.out)
    );
    p.custom = Some(CustomEpilogue { loads: false, name: "tl_epi".into(), source, params, rows: None, rounds_to: None, vector: None });
    p
}

/// The case's parameters, else `GEMV_PARAMS`, else the heuristic's.
fn params_of(c: &Case, p: &Problem, sms: usize) -> Params {
    if let Some(q) = c.params {
        return q;
    }
    let env: Vec<usize> = std::env::var("GEMV_PARAMS").unwrap_or_default().split(',').filter_map(|x| x.parse().ok()).collect();
    // A model's weights are constants: the heuristic may tile them.
    let d = gemv::heuristic_for(p, sms, true);
    let mut q = match env[..] {
        [warps_n, warps_k, cols, unroll, split_k] => Params { warps_n, warps_k, cols, unroll, split_k, ..d },
        [warps_n, warps_k, cols, unroll, split_k, prefetch] => Params { warps_n, warps_k, cols, unroll, split_k, prefetch, ..d },
        [warps_n, warps_k, cols, unroll, split_k, prefetch, min_blocks] => {
            Params { warps_n, warps_k, cols, unroll, split_k, prefetch, min_blocks, ..d }
        }
        [warps_n, warps_k, cols, unroll, split_k, prefetch, min_blocks, stages] => {
            Params { warps_n, warps_k, cols, unroll, split_k, prefetch, min_blocks, stages, ..d }
        }
        [warps_n, warps_k, cols, unroll, split_k, prefetch, min_blocks, stages, tiled] => {
            Params { warps_n, warps_k, cols, unroll, split_k, prefetch, min_blocks, stages, tiled: tiled != 0, ..d }
        }
        [warps_n, warps_k, cols, unroll, split_k, prefetch, min_blocks, stages, tiled, a_ahead] => {
            Params { warps_n, warps_k, cols, unroll, split_k, prefetch, min_blocks, stages, tiled: tiled != 0, a_ahead: a_ahead != 0, ..d }
        }
        [warps_n, warps_k, cols, unroll, split_k, prefetch, min_blocks, stages, tiled, a_ahead, early] => {
            Params { warps_n, warps_k, cols, unroll, split_k, prefetch, min_blocks, stages, tiled: tiled != 0, a_ahead: a_ahead != 0, early }
        }
        _ => return d,
    };
    if q.split_k == 0 {
        q.split_k = gemv::split_for(p, &q, sms);
    }
    q
}

const A: OperandRef = OperandRef { param: 0, offset_bytes: 0 };
const B: OperandRef = OperandRef { param: 1, offset_bytes: 0 };

/// The reference value of output element `idx` (dense C).
fn reference(c: &Case, a: &[u16], b: &[u16], idx: usize) -> f64 {
    let (lda, ldb) = lds(c);
    let (bb, i, j) = (idx / (c.m * c.n), idx % (c.m * c.n) / c.n, idx % c.n);
    (0..c.k)
        .map(|kk| {
            let ai = (bb * c.m + i) * lda + kk;
            let bi = if c.b == C { (bb * c.n + j) * ldb + kk } else { kk * ldb + j };
            from_bits(c.dtype, a[ai]) * from_bits(c.dtype, b[bi])
        })
        .sum()
}

fn run_case(dev: &Device, comp: &Compiler, stream: &Stream, c: &Case, iters: usize, stream_mode: bool, dump: Option<&str>, rng: &mut Rng) -> Result<serde_json::Value, String> {
    let s = |e: CudaError| e.to_string();
    let p = problem(c);
    let q = params_of(c, &p, dev.props().sm_count as usize);
    gemv::applies(&p, &q, dev.props().compute_capability)?;
    let name = gemv::kernel_name(&p, &q, &A, &B);
    let source = gemv::render(&p, &q, &A, &B);
    if let Some(dir) = dump {
        let _ = std::fs::write(format!("{dir}/{name}.cu"), &source);
    }
    let t0 = std::time::Instant::now();
    let compiled = comp.compile(&name, &source).map_err(s)?;
    let compile_s = t0.elapsed().as_secs_f64();
    let kern = GemvKernel::from_image(dev, &p, &q, &A, &B, &compiled.image, compiled.cache_hit).map_err(s)?;
    let (ea, eb, ec) = sizes(c);
    let up = |v: &[u16]| -> Result<DeviceBuffer> {
        let buf = dev.alloc(v.len().max(1) * 2)?;
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        buf.write(0, &bytes)?;
        Ok(buf)
    };
    // Padding past K is NaN: the kernel must never multiply it in.
    let (lda, ldb) = lds(c);
    let nan = to_bits(c.dtype, f32::NAN);
    let a: Vec<u16> = (0..ea).map(|i| if i % lda < c.k { to_bits(c.dtype, rng.unit()) } else { nan }).collect();
    let b: Vec<u16> = (0..eb).map(|i| if c.b == R || i % ldb < c.k { to_bits(c.dtype, rng.unit()) } else { nan }).collect();
    let (da, db) = (up(&a).map_err(s)?, up(&b).map_err(s)?);
    let osz = c.out.size_bytes();
    let dc = dev.alloc(ec * osz).map_err(s)?;
    let ptrs = [da.ptr(), db.ptr(), dc.ptr()];
    kern.bind(stream, &ptrs).map_err(s)?;
    dc.fill_u32(stream, 0xffff_ffff).map_err(s)?;
    kern.launch(stream, &ptrs).map_err(s)?;
    kern.launch(stream, &ptrs).map_err(s)?;
    stream.synchronize().map_err(s)?;
    let mut raw = vec![0u8; ec * osz];
    dc.read(0, &mut raw).map_err(s)?;
    let out: Vec<f64> = match c.out {
        DType::F32 => raw.chunks_exact(4).map(|x| f32::from_le_bytes([x[0], x[1], x[2], x[3]]) as f64).collect(),
        o => raw.chunks_exact(2).map(|x| from_bits(o, u16::from_le_bytes([x[0], x[1]]))).collect(),
    };
    let nans = out.iter().filter(|x| !x.is_finite()).count();
    let mut points: Vec<usize> = if ec <= 1 << 16 { (0..ec).collect() } else { (0..2000).map(|_| rng.below(ec)).collect() };
    points.extend([0, ec - 1]);
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let chunk = points.len().div_ceil(threads).max(1);
    let parts: Vec<(f64, f64)> = std::thread::scope(|sc| {
        let hs: Vec<_> = points
            .chunks(chunk)
            .map(|part| {
                let (a, b, out) = (&a, &b, &out);
                sc.spawn(move || {
                    let (mut me, mut mr) = (0f64, 0f64);
                    for &i in part {
                        let r = reference(c, a, b, i);
                        me = me.max((out[i] - r).abs());
                        mr = mr.max(r.abs());
                    }
                    (me, mr)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or((f64::NAN, 0.0))).collect()
    });
    let max_err = parts.iter().map(|x| x.0).fold(0f64, f64::max) / parts.iter().map(|x| x.1).fold(1e-30, f64::max);
    let tol = match c.out {
        DType::BF16 => 1e-2,
        DType::F16 => 3e-3,
        _ => 1e-4,
    };
    let ok = nans == 0 && max_err < tol;
    let f = kern.function();
    let cfg = kern.launch_config();
    let mut j = json!({
        "kind": if c.time { "bench" } else { "check" },
        "label": c.label, "kernel": name,
        "m": c.m, "n": c.n, "k": c.k, "batch": c.batch, "dtype": c.dtype.name(), "out": c.out.name(),
        "b": if c.b == C { "col" } else { "row (repacked)" },
        "params": format!("w{}x{} c{} u{} s{} p{} mb{} st{} t{} a{} e{}", q.warps_n, q.warps_k, q.cols, q.unroll, q.split_k, q.prefetch, q.min_blocks, q.stages, q.tiled as u8, q.a_ahead as u8, q.early),
        "ok": ok, "max_err": max_err, "nan": nans, "checked": points.len(),
        "regs": f.num_regs().unwrap_or(0), "local_bytes": f.local_bytes().unwrap_or(0),
        "occupancy": f.max_active_blocks_per_sm(cfg.block.0, cfg.shared_mem_bytes).unwrap_or(0),
        "compile_s": compile_s, "grid": [cfg.grid.0, cfg.grid.1, cfg.grid.2], "smem": cfg.shared_mem_bytes,
    });
    if c.time && ok && stream_mode {
        // Back-to-back launches over copies of B that together exceed the L2, each copy with
        // its own kernel instance (a tiled or row-major B is repacked per instance): the
        // weights come from memory, as in a decode step, and the launch gaps are those of
        // one stream (no events between launches).
        let copies = (256usize << 20).div_ceil((eb * 2).max(1)).clamp(2, 64);
        let mut insts = vec![];
        let mut bufs = vec![];
        for _ in 0..copies {
            let k2 = GemvKernel::from_image(dev, &p, &q, &A, &B, &compiled.image, true).map_err(s)?;
            let db2 = up(&b).map_err(s)?;
            let ptrs2 = [da.ptr(), db2.ptr(), dc.ptr()];
            k2.bind(stream, &ptrs2).map_err(s)?;
            insts.push((k2, ptrs2));
            bufs.push(db2);
        }
        let rounds = iters.div_ceil(copies).max(3);
        let ms = common::time_ms(dev, stream, 1, 5, || {
            for _ in 0..rounds {
                for (k2, p2) in &insts {
                    k2.launch(stream, p2)?;
                }
            }
            Ok(())
        })
        .map_err(s)?
            / (rounds * copies) as f64;
        let bytes = (c.m * c.k + c.k * c.n) * 2 * c.batch + ec * osz;
        j["timing"] = json!(format!("stream of {} launches over {copies} weight copies", rounds * copies));
        j["ms"] = json!(ms);
        j["us"] = json!(ms * 1e3);
        j["tb_s"] = json!(bytes as f64 / ms / 1e9);
        drop(bufs);
    } else if c.time && ok {
        let ms = common::time_ms(dev, stream, 5, iters, || kern.launch(stream, &ptrs)).map_err(s)?;
        let bytes = (c.m * c.k + c.k * c.n) * 2 * c.batch + ec * osz;
        j["ms"] = json!(ms);
        j["us"] = json!(ms * 1e3);
        j["tb_s"] = json!(bytes as f64 / ms / 1e9);
    }
    Ok(j)
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let phase = argv.first().cloned().unwrap_or_else(|| "check".into());
    let opt = |name: &str| argv.iter().position(|a| a == name).and_then(|i| argv.get(i + 1).cloned());
    let iters: usize = opt("--iters").and_then(|v| v.parse().ok()).unwrap_or(30).max(1);
    let dump = opt("--dump");
    let only = opt("--only");
    let stream_mode = argv.iter().any(|a| a == "--stream");
    let fail = |e: String| -> ! {
        eprintln!("gemv_bench: {e}");
        std::process::exit(1)
    };
    if phase != "check" && phase != "bench" {
        fail(format!("unknown phase '{phase}' (check or bench)"));
    }
    let dev = Device::open(0).unwrap_or_else(|e| fail(e.to_string()));
    let nv = Nvrtc::load().unwrap_or_else(|e| fail(e.to_string()));
    let props = dev.props().clone();
    println!("{}", json!({"device": props.name, "sms": props.sm_count, "arch": props.arch(), "nvrtc": format!("{:?}", nv.version()), "gemv_params": std::env::var("GEMV_PARAMS").ok()}));
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
            gemv::applies(&p, &q, props.compute_capability).ok()?;
            Some((gemv::kernel_name(&p, &q, &A, &B), gemv::render(&p, &q, &A, &B)))
        })
        .collect();
    common::precompile(&comp, &modules);
    common::run_all(&cases, |x| &x.label, |c| run_case(&dev, &comp, &stream, c, iters, stream_mode, dump.as_deref(), &mut rng));
}
