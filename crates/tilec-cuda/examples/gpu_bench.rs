//! Memory-bound kernel benchmark on a GPU: softmax, LayerNorm and RMSNorm over the last axis,
//! and gelu(x * w + b) with w, b vectors over the last axis, in bf16 and f32, compared with a
//! device-to-device copy measured in the same run.
//!
//! Usage: `gpu_bench [--rows N] [--cols N] [--iters N] [--check-rows N] [--threads N]`
//! (defaults 32768 x 8192, 50 timed runs after 5 warm-up runs, 64 checked rows). NVRTC is
//! found through TILEC_NVRTC_LIB (a path) or the dynamic linker's search path.
//!
//! Prints one JSON object per line: the device, the copy, then one per kernel with
//! `{op, dtype, ms, tb_s, vs_copy, max_rel_err, ok}` (ms: median of the timed runs; tb_s:
//! bytes read + written once per run, over the median; vs_copy: tb_s over the copy's).

use half::bf16;
use rand::{Rng, SeedableRng};
use serde_json::json;
use tilec_cuda::handbuilt::{self, reference};
use tilec_cuda::*;
use tilec_ir::{DType, Tensor};

struct Args {
    rows: usize,
    cols: usize,
    iters: usize,
    check_rows: usize,
    threads: Option<i64>,
    /// Also time alternative schedules of each kernel (tuning data for the heuristics).
    variants: bool,
}

fn parse_args() -> std::result::Result<Args, String> {
    let mut a = Args {
        rows: 32768,
        cols: 8192,
        iters: 50,
        check_rows: 64,
        threads: None,
        variants: true,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        if argv[i] == "--no-variants" {
            a.variants = false;
            i += 1;
            continue;
        }
        let val = argv
            .get(i + 1)
            .ok_or_else(|| format!("{} needs a value", argv[i]))?;
        let n: usize = val
            .parse()
            .map_err(|_| format!("{}: {val:?} is not a number", argv[i]))?;
        match argv[i].as_str() {
            "--rows" => a.rows = n,
            "--cols" => a.cols = n,
            "--iters" => a.iters = n.max(1),
            "--check-rows" => a.check_rows = n,
            "--threads" => a.threads = Some(n as i64),
            other => return Err(format!("unknown option {other}")),
        }
        i += 2;
    }
    Ok(a)
}

fn median(mut v: Vec<f32>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    v[v.len() / 2] as f64
}

/// Median milliseconds of `iters` runs of `f` (each between two events) after 5 warm-ups.
fn time(
    dev: &Device,
    stream: &Stream,
    iters: usize,
    mut f: impl FnMut(&Stream) -> Result<()>,
) -> Result<f64> {
    for _ in 0..5 {
        f(stream)?;
    }
    stream.synchronize()?;
    let events: Vec<(Event, Event)> = (0..iters)
        .map(|_| Ok((dev.event()?, dev.event()?)))
        .collect::<Result<_>>()?;
    for (a, b) in &events {
        a.record(stream)?;
        f(stream)?;
        b.record(stream)?;
    }
    stream.synchronize()?;
    let times = events
        .iter()
        .map(|(a, b)| b.elapsed_ms_since(a))
        .collect::<Result<Vec<f32>>>()?;
    Ok(median(times))
}

fn random_tensor(d: DType, shape: Vec<usize>, lo: f32, hi: f32, seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    match d {
        DType::BF16 => Tensor::from_vec(
            shape,
            (0..n)
                .map(|_| bf16::from_f32(rng.gen_range(lo..hi)))
                .collect::<Vec<_>>(),
        ),
        _ => Tensor::from_vec(
            shape,
            (0..n).map(|_| rng.gen_range(lo..hi)).collect::<Vec<f32>>(),
        ),
    }
    .expect("sizes match")
}

fn row_f64(t: &Tensor, r: usize, cols: usize) -> Vec<f64> {
    match t.dtype() {
        DType::BF16 => t.as_slice::<bf16>().map(|s| {
            s[r * cols..(r + 1) * cols]
                .iter()
                .map(|v| v.to_f64())
                .collect()
        }),
        _ => t.as_slice::<f32>().map(|s| {
            s[r * cols..(r + 1) * cols]
                .iter()
                .map(|&v| v as f64)
                .collect()
        }),
    }
    .unwrap_or_default()
}

fn has_nan(t: &Tensor) -> bool {
    match t.dtype() {
        DType::BF16 => t
            .as_slice::<bf16>()
            .is_some_and(|s| s.iter().any(|v| v.is_nan())),
        _ => t
            .as_slice::<f32>()
            .is_some_and(|s| s.iter().any(|v| v.is_nan())),
    }
}

/// Builds `op` over the last axis of a `[r, c]` tensor as a tilec graph, optimizes it for cuda,
/// partitions it, lowers its one kernel group and schedules it for the GPU. Returns the kernel
/// and, per kernel parameter, which of (x, w, b, y) it is.
fn from_graph(
    op: &str,
    r: i64,
    c: i64,
    d: DType,
    eps: f32,
    target: &GpuTarget,
) -> std::result::Result<(tilec_tile::Kernel, Vec<usize>, tilec_tile::Kernel), String> {
    use tilec_ir::op::{BinaryOp, NormOp, UnaryOp};
    use tilec_ir::{Graph, Op, TensorType};
    let (ru, cu) = (r as usize, c as usize);
    let mut g = Graph::new(op);
    let x = g.add_input("x", TensorType::fixed(d, &[ru, cu]));
    let w = g.add_input("w", TensorType::fixed(d, &[cu]));
    let b = g.add_input("b", TensorType::fixed(d, &[cu]));
    let e = |e: tilec_ir::IrError| e.to_string();
    let y = match op {
        "softmax" => g.add(Op::Norm(NormOp::Softmax { axis: 1 }), &[x]).map_err(e)?,
        "layernorm" => {
            let ln = NormOp::LayerNorm { axis: 1, epsilon: eps, stash: DType::F32, has_bias: true };
            g.add_node("ln", Op::Norm(ln), &[x, w, b]).map_err(e)?[0]
        }
        "rmsnorm" => g.add(Op::Norm(NormOp::RmsNorm { axis: 1, epsilon: eps }), &[x, w]).map_err(e)?,
        _ => {
            let xw = g.add(Op::Binary(BinaryOp::Mul), &[x, w]).map_err(e)?;
            let xb = g.add(Op::Binary(BinaryOp::Add), &[xw, b]).map_err(e)?;
            g.add(Op::Unary(UnaryOp::Gelu { tanh_approx: false }), &[xb]).map_err(e)?
        }
    };
    g.set_outputs(vec![y]);
    let pipe = tilec_opt::manager::Pipeline::for_level_and_target(3, tilec_opt::partition::TargetKind::Cuda);
    pipe.run(&mut g, &Default::default()).map_err(|e| e.to_string())?;
    let p = tilec_opt::partition::partition(&g, &tilec_opt::partition::Target::preset(tilec_opt::partition::TargetKind::Cuda));
    if p.groups.len() != 1 {
        return Err(format!("{} kernel groups", p.groups.len()));
    }
    let l = tilec_tile::lower::lower_group(&g, &p.groups[0], &format!("{op}_{}", d.name())).map_err(|e| e.to_string())?;
    let names = ["x", "w", "b"];
    let mut order = vec![];
    for v in l.inputs.iter() {
        let n = &g.value(*v).name;
        order.push(names.iter().position(|m| m == n).ok_or_else(|| format!("unexpected kernel input {n}"))?);
    }
    if l.outputs.len() != 1 {
        return Err(format!("{} kernel outputs", l.outputs.len()));
    }
    order.push(3);
    let k = schedule_gpu(&l.kernel, target).map_err(|e| e.to_string())?;
    Ok((k, order, l.kernel))
}

/// Alternative schedules of a lowered kernel, timed beside the default to tune the heuristics:
/// other block sizes for row kernels, other vectors per thread (0: grid-stride) for elementwise.
fn variants(op: &str, lowered: &tilec_tile::Kernel, target: &GpuTarget) -> Vec<(String, tilec_tile::Kernel)> {
    let mut out = vec![];
    if op == "gelu_bias" {
        for u in [0i64, 1, 2, 8] {
            if let Ok(k) = schedule_elementwise_with(lowered, target, Some(u)) {
                out.push((format!("vectors/thread {u}"), k));
            }
        }
    } else {
        for t in [128i64, 256, 1024] {
            let o = RowOptions { threads: Some(t), ..RowOptions::default() };
            if let Ok(k) = schedule_rows(lowered, &o) {
                out.push((format!("threads {t}"), k));
            }
        }
    }
    out
}

fn main() {
    if let Err(e) = run() {
        eprintln!("gpu_bench: {e}");
        std::process::exit(1);
    }
}

fn run() -> std::result::Result<(), String> {
    if std::env::args().any(|x| x == "--plan") {
        // Where each kernel comes from, without a GPU (small shape, printed tile IR).
        for d in [DType::BF16, DType::F32] {
            for op in ["softmax", "layernorm", "rmsnorm", "gelu_bias"] {
                let (pr, pc) = if std::env::args().any(|x| x == "--full") { (32768, 8192) } else if std::env::args().any(|x| x == "--short") { (2097152, 128) } else { (4, 256) };
                match from_graph(op, pr, pc, d, 1e-5, &GpuTarget::hopper()) {
                    Ok((k, order, _)) => println!(
                        "{op} {}: from the graph, args {order:?}\n{k}\n{}",
                        d.name(),
                        render(&k).map(|c| c.source.lines().filter(|l| l.contains("tl_") && !l.starts_with("__device__") && !l.starts_with("//") && !l.starts_with("struct") && !l.starts_with("template") && !l.starts_with('#')).collect::<Vec<_>>().join("\n")).unwrap_or_default()
                    ),
                    Err(e) => println!("{op} {}: hand-built fallback: {e}", d.name()),
                }
            }
        }
        return Ok(());
    }
    let a = parse_args()?;
    let s = |e: CudaError| e.to_string();
    if !is_available() {
        return Err(Device::open(0)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_else(|| "no CUDA device".into()));
    }
    let dev = Device::open(0).map_err(s)?;
    let nv = Nvrtc::load().map_err(s)?;
    let p = dev.props().clone();
    println!(
        "{}",
        json!({"device": p.name, "cc": format!("{}.{}", p.compute_capability.0, p.compute_capability.1), "sms": p.sm_count,
               "l2_mb": p.l2_bytes as f64 / 1048576.0, "mem_gb": p.total_mem_bytes as f64 / 1e9,
               "peak_dram_tb_s": p.peak_dram_bytes_per_s / 1e12, "driver": driver_version().unwrap_or(0),
               "nvrtc": format!("{}.{}", nv.version().0, nv.version().1), "arch": p.arch()})
    );
    let compiler = Compiler::new(nv, &p.arch());
    let stream = dev.stream().map_err(s)?;

    // Device-to-device copy of 2 GiB: read + write bytes over the time.
    let copy_bytes = 2usize << 30;
    let src = dev.alloc(copy_bytes).map_err(s)?;
    let dst = dev.alloc(copy_bytes).map_err(s)?;
    src.fill(&stream, 0, copy_bytes, 1).map_err(s)?;
    let copy_ms = time(&dev, &stream, a.iters.max(20), |st| {
        driver::copy_dtod(st, dst.ptr(), src.ptr(), copy_bytes)
    })
    .map_err(s)?;
    let copy_tb_s = 2.0 * copy_bytes as f64 / (copy_ms * 1e-3) / 1e12;
    println!(
        "{}",
        json!({"op": "copy_dtod", "bytes": copy_bytes, "ms": copy_ms, "tb_s": copy_tb_s})
    );
    drop((src, dst));

    let (rows, cols) = (a.rows, a.cols);
    let target = p.gpu_target();
    let eps = 1e-5f32;
    for d in [DType::BF16, DType::F32] {
        let x = random_tensor(d, vec![rows, cols], -3.0, 3.0, 1);
        let w = random_tensor(d, vec![cols], 0.5, 1.5, 2);
        let b = random_tensor(d, vec![cols], -0.5, 0.5, 3);
        let dx = dev.upload(&x).map_err(s)?;
        let dw = dev.upload(&w).map_err(s)?;
        let db = dev.upload(&b).map_err(s)?;
        let dy = dev.alloc(rows * cols * d.size_bytes()).map_err(s)?;
        let (r, c) = (rows as i64, cols as i64);
        let row_opts = RowOptions {
            threads: a.threads,
            ..RowOptions::default()
        };
        // Each kernel comes from tilec's own pipeline (graph -> -O3 for cuda -> partition ->
        // lowering -> GPU schedule); the hand-built tile IR is the fallback, recorded as such.
        let ptrs = [dx.ptr(), dw.ptr(), db.ptr(), dy.ptr()];
        let mut ops: Vec<(&str, tilec_tile::Kernel, Vec<u64>, String, Option<String>)> = vec![];
        for op in ["softmax", "layernorm", "rmsnorm", "gelu_bias"] {
            match from_graph(op, r, c, d, eps, &target) {
                Ok((k, order, lowered)) => {
                    let args: Vec<u64> = order.iter().map(|&i| ptrs[i]).collect();
                    ops.push((op, k, args.clone(), "graph".into(), None));
                    if a.variants {
                        for (name, vk) in variants(op, &lowered, &target) {
                            ops.push((op, vk, args.clone(), "graph".into(), Some(name)));
                        }
                    }
                }
                Err(why) => {
                    let (k, order): (tilec_tile::Kernel, Vec<usize>) = match op {
                        "softmax" => (schedule_rows(&handbuilt::softmax(r, c, d), &row_opts).map_err(s)?, vec![0, 3]),
                        "layernorm" => (schedule_rows(&handbuilt::layernorm(r, c, d, eps), &row_opts).map_err(s)?, vec![0, 1, 2, 3]),
                        "rmsnorm" => (schedule_rows(&handbuilt::rmsnorm(r, c, d, eps), &row_opts).map_err(s)?, vec![0, 1, 3]),
                        _ => (schedule_elementwise(&handbuilt::gelu_bias(r, c, d), &target).map_err(s)?, vec![0, 1, 2, 3]),
                    };
                    ops.push((op, k, order.iter().map(|&i| ptrs[i]).collect(), format!("handbuilt ({why})"), None));
                }
            }
        }
        let kernels: Vec<tilec_tile::Kernel> = ops.iter().map(|o| o.1.clone()).collect();
        let t0 = std::time::Instant::now();
        let loaded = load_kernels(&dev, &compiler, &kernels).map_err(s)?;
        let compile_s = t0.elapsed().as_secs_f64();
        let (wv, bv) = (row_f64(&w, 0, cols), row_f64(&b, 0, cols));
        for ((op, _, args, source, variant), gk) in ops.iter().zip(&loaded) {
            // Correctness: poisoned output, one run, sampled rows against f64.
            let poison = if d == DType::F32 {
                0x7fc0_0000
            } else {
                0x7fc0_7fc0
            };
            dy.fill_u32(&stream, poison).map_err(s)?;
            gk.launch(&stream, args).map_err(s)?;
            stream.synchronize().map_err(s)?;
            let y = dy.download(0, d, &[rows, cols]).map_err(s)?;
            let nan = has_nan(&y);
            let mut max_err = 0.0f64;
            let step = (rows / a.check_rows.max(1)).max(1);
            for row in (0..rows).step_by(step).chain([rows - 1]) {
                let xr = row_f64(&x, row, cols);
                let want = match *op {
                    "softmax" => reference::softmax(&xr),
                    "layernorm" => reference::layernorm(&xr, &wv, &bv, eps as f64),
                    "rmsnorm" => reference::rmsnorm(&xr, &wv, eps as f64),
                    // The graph rounds x*w and x*w + b to the dtype (each op's output is bf16).
                    _ if d == DType::BF16 && source == "graph" => {
                        let r16 = |v: f64| bf16::from_f64(v).to_f64();
                        let t: Vec<f64> = xr.iter().zip(&wv).zip(&bv).map(|((x, w), b)| r16(r16(x * w) + b)).collect();
                        let zero = vec![0.0; t.len()];
                        let one = vec![1.0; t.len()];
                        reference::gelu_bias(&t, &one, &zero)
                    }
                    _ => reference::gelu_bias(&xr, &wv, &bv),
                };
                let got = row_f64(&y, row, cols);
                let rms = (want.iter().map(|v| v * v).sum::<f64>() / cols as f64).sqrt();
                for (g, wv) in got.iter().zip(&want) {
                    let e = (g - wv).abs() / wv.abs().max(1e-2 * rms).max(1e-30);
                    max_err = if e.is_nan() {
                        f64::INFINITY
                    } else {
                        max_err.max(e)
                    };
                }
            }
            let tol = if d == DType::F32 { 1e-4 } else { 2e-2 };
            let ok = !nan && max_err <= tol;
            let bytes: usize = gk.params.iter().map(|(dt, n)| dt.size_bytes() * n).sum();
            let ms = time(&dev, &stream, a.iters.max(20), |st| gk.launch(st, args)).map_err(s)?;
            let tb_s = bytes as f64 / (ms * 1e-3) / 1e12;
            println!(
                "{}",
                json!({"op": op, "dtype": d.name(), "rows": rows, "cols": cols, "ms": ms, "tb_s": tb_s,
                       "vs_copy": tb_s / copy_tb_s, "max_rel_err": max_err, "ok": ok,
                       "grid": gk.launch.grid.0, "block": gk.launch.block.0, "bytes": bytes,
                       "compile_s": compile_s, "cache_hit": gk.cache_hit, "source": source, "variant": variant,
                       "regs": gk.function().and_then(|f| f.num_regs().ok()),
                       "blocks_per_sm": gk.function().and_then(|f| f.max_active_blocks_per_sm(gk.launch.block.0, gk.launch.shared_mem_bytes).ok())})
            );
        }
    }
    Ok(())
}
