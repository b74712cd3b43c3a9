//! Checks and times the FlashAttention kernel (`tilec_cuda::flash`) and the paged decode
//! kernels (`tilec_cuda::paged`, see `decode/mod.rs`) on a GPU.
//!
//! Usage: `attn_bench check|bench [--iters N] [--only SUBSTRING] [--dump DIR]`
//! - `check`: head dims 64 and 128, bf16 and f16, causal (both alignments) or not, ragged
//!   lengths (77 queries, 131 keys), seq_q != seq_k, GQA 8/2 and MQA, `[b, h, s, d]` and
//!   `[b, s, h*d]` layouts, bool and additive masks with a fully masked row (zero rows):
//!   fresh random inputs, the output poisoned with NaN first, every row compared with an f64
//!   reference on the CPU (sampled rows for large problems), and the log-sum-exp checked.
//! - `bench`: `attn_prefill_bf16_b4h32s4096d128`, `attn_prefill_causal_bf16_b4h32s4096d128`
//!   and GPT-2 small's `attn_f16_b8h12s512d64`, timed (median of `--iters` runs, CUDA
//!   events) in TFLOP/s of `4 * b * h * sq * sk * d` (halved when causal), checked on samples.
//!   `bench/attn_peer.py` times PyTorch's SDPA (flash and cuDNN backends) on the same labels.
//!
//! - decode (both phases): the paged decode step, checked against the interpreter (`check`)
//!   and timed in TB/s of K and V read on `attn_decode_bf16_b32h32kv8192d128` and its GQA
//!   and ragged twins (`bench`); see `decode/mod.rs`.
//!
//! `FLASH_WGMMA=1` takes the Hopper variant (`flash::sm90`) instead of the `mma.sync` one;
//! `FLASH_PARAMS=block_m,block_n,warps,stages` and `PAGED_PARAMS=chunk,warps,rows,unroll`
//! override the heuristics. Prints one JSON object per line.

use serde_json::json;
use tilec_cuda::flash::{self, Causal, FlashArgs, FlashKernel, FlashProblem, Mask, MaskKind, Params, Strides};
use tilec_cuda::*;
use tilec_ir::DType;

mod common;
mod decode;
use common::{from_bits, to_bits, Rng};

struct Case {
    label: String,
    p: FlashProblem,
    time: bool,
}

fn bhsd(b: usize, hq: usize, hkv: usize, sq: usize, sk: usize, d: usize, dt: DType) -> FlashProblem {
    FlashProblem::new(b, hq, hkv, sq, sk, d, dt)
}

fn to_bshd(mut p: FlashProblem) -> FlashProblem {
    p.q = Strides::bshd(p.heads_q, p.seq_q, p.head_dim);
    p.o = Strides::bshd(p.heads_q, p.seq_q, p.head_dim);
    p.k = Strides::bshd(p.heads_kv, p.seq_k, p.head_dim);
    p.v = Strides::bshd(p.heads_kv, p.seq_k, p.head_dim);
    p
}

fn check_cases() -> Vec<Case> {
    let mut v = vec![];
    let mut add = |label: &str, p: FlashProblem| v.push(Case { label: label.into(), p, time: false });
    for dt in [DType::BF16, DType::F16] {
        for d in [64, 128] {
            let n = dt.name();
            add(&format!("{n}_d{d}_square"), bhsd(2, 4, 4, 256, 256, d, dt));
            add(&format!("{n}_d{d}_ragged"), bhsd(2, 3, 3, 77, 131, d, dt));
            let mut c = bhsd(2, 3, 3, 77, 131, d, dt);
            c.causal = Some(Causal::TopLeft);
            add(&format!("{n}_d{d}_causal_topleft"), c.clone());
            c.causal = Some(Causal::BottomRight);
            add(&format!("{n}_d{d}_causal_bottomright"), c);
            let mut g = to_bshd(bhsd(2, 8, 2, 77, 131, d, dt));
            g.causal = Some(Causal::TopLeft);
            add(&format!("{n}_d{d}_gqa8x2_bshd_causal"), g);
            add(&format!("{n}_d{d}_mqa_decode"), bhsd(3, 8, 1, 1, 1000, d, dt));
            let mut m = bhsd(2, 2, 2, 70, 150, d, dt);
            m.mask = Some(Mask { kind: MaskKind::Bool, strides: [70 * 150, 0, 150, 1], len: 150 });
            m.zero_nan_rows = true;
            add(&format!("{n}_d{d}_bool_mask_zero_rows"), m);
            let mut a = to_bshd(bhsd(1, 3, 1, 33, 131, d, dt));
            a.mask = Some(Mask { kind: MaskKind::Additive, strides: [0, 0, 120, 1], len: 120 });
            a.scale = 0.1;
            add(&format!("{n}_d{d}_additive_short_mask_bshd"), a);
            let mut big = bhsd(1, 2, 2, 1500, 1500, d, dt);
            big.causal = Some(Causal::TopLeft);
            add(&format!("{n}_d{d}_causal_1500"), big);
        }
    }
    v
}

fn bench_cases() -> Vec<Case> {
    let mut v = vec![];
    let p = bhsd(4, 32, 32, 4096, 4096, 128, DType::BF16);
    v.push(Case { label: "attn_prefill_bf16_b4h32s4096d128".into(), p: p.clone(), time: true });
    let mut c = p;
    c.causal = Some(Causal::TopLeft);
    v.push(Case { label: "attn_prefill_causal_bf16_b4h32s4096d128".into(), p: c, time: true });
    // GPT-2 small at batch 8 x 512 (f16): Q, K and V as the QKV projection leaves them.
    v.push(Case { label: "attn_f16_b8h12s512d64".into(), p: to_bshd(bhsd(8, 12, 12, 512, 512, 64, DType::F16)), time: true });
    v
}

fn params_of(p: &FlashProblem, sms: usize) -> Params {
    let wgmma = std::env::var("FLASH_WGMMA").is_ok_and(|v| v == "1");
    let d = if wgmma { flash::sm90::heuristic(p, sms) } else { flash::heuristic(p, sms) };
    let env = std::env::var("FLASH_PARAMS").unwrap_or_default();
    let v: Vec<usize> = env.split(',').filter_map(|x| x.trim().parse().ok()).collect();
    match v[..] {
        [block_m, block_n, warps, stages] => Params { block_m, block_n, warps, stages, wgmma },
        _ => d,
    }
}

fn span(p: &FlashProblem, s: Strides, heads: usize, seq: usize) -> usize {
    (p.batch - 1) * s.batch + (heads - 1) * s.head + (seq - 1) * s.row + p.head_dim
}

fn mask_len(p: &FlashProblem) -> usize {
    p.mask.map_or(0, |m| (p.batch - 1) * m.strides[0] + (p.heads_q - 1) * m.strides[1] + (p.seq_q - 1) * m.strides[2] + (m.len - 1) * m.strides[3] + 1)
}

/// Row `(b, h, i)` of the reference: its output and log-sum-exp (`-inf`: fully masked, zeros).
fn reference(p: &FlashProblem, q: &[u16], k: &[u16], v: &[u16], mask: &[f64], (b, h, i): (usize, usize, usize)) -> (Vec<f64>, f64) {
    let d = p.head_dim;
    let hk = h / (p.heads_q / p.heads_kv);
    let x = |t: &[u16], at: usize| from_bits(p.dtype, t[at]);
    let off = p.causal_offset();
    let qr = p.q.at(b, h, i);
    let logits: Vec<f64> = (0..p.seq_k)
        .map(|j| {
            if p.causal.is_some() && j as i64 > i as i64 + off {
                return f64::NEG_INFINITY;
            }
            let kr = p.k.at(b, hk, j);
            let mut s = p.scale as f64 * (0..d).map(|e| x(q, qr + e) * x(k, kr + e)).sum::<f64>();
            if let Some(m) = &p.mask {
                if j >= m.len {
                    return f64::NEG_INFINITY;
                }
                let mv = mask[b * m.strides[0] + h * m.strides[1] + i * m.strides[2] + j * m.strides[3]];
                match m.kind {
                    MaskKind::Bool if mv == 0.0 => return f64::NEG_INFINITY,
                    MaskKind::Bool => {}
                    MaskKind::Additive => s += mv,
                }
            }
            s
        })
        .collect();
    let mx = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mut out = vec![0.0; d];
    if mx == f64::NEG_INFINITY {
        return (out, mx);
    }
    let e: Vec<f64> = logits.iter().map(|&l| (l - mx).exp()).collect();
    let sum: f64 = e.iter().sum();
    for (j, w) in e.iter().enumerate() {
        if *w == 0.0 {
            continue;
        }
        let vr = p.v.at(b, hk, j);
        for (c, o) in out.iter_mut().enumerate() {
            *o += w / sum * x(v, vr + c);
        }
    }
    (out, mx + sum.ln())
}

fn run_case(dev: &Device, comp: &Compiler, stream: &Stream, c: &Case, iters: usize, dump: Option<&str>, rng: &mut Rng) -> Result<serde_json::Value, String> {
    let s = |e: CudaError| e.to_string();
    let p = &c.p;
    let q = params_of(p, dev.props().sm_count as usize);
    flash::applies(p, &q, dev.props().compute_capability)?;
    let args = FlashArgs::dense(p.mask.is_some());
    let name = flash::kernel_name(p, &q, &args);
    let source = flash::render(p, &q, &args);
    if let Some(dir) = dump {
        let _ = std::fs::write(format!("{dir}/{name}.cu"), &source);
    }
    let t0 = std::time::Instant::now();
    let compiled = comp.compile(&name, &source).map_err(s)?;
    let compile_s = t0.elapsed().as_secs_f64();
    let kern = FlashKernel::from_image(dev, p, &q, &args, &compiled.image, compiled.cache_hit).map_err(s)?;
    let up = |bytes: &[u8]| -> Result<DeviceBuffer> {
        let buf = dev.alloc(bytes.len().max(16))?;
        buf.write(0, bytes)?;
        Ok(buf)
    };
    let gen = |n: usize, rng: &mut Rng, scale: f32| -> Vec<u16> { (0..n).map(|_| to_bits(p.dtype, rng.unit() * scale)).collect() };
    let bytes = |v: &[u16]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let (hq, hkv) = (p.heads_q, p.heads_kv);
    let qv = gen(span(p, p.q, hq, p.seq_q), rng, 2.0);
    let kv = gen(span(p, p.k, hkv, p.seq_k), rng, 2.0);
    let vv = gen(span(p, p.v, hkv, p.seq_k), rng, 1.0);
    let nm = mask_len(p);
    let (mbytes, mvals): (Vec<u8>, Vec<f64>) = match p.mask.map(|m| m.kind) {
        Some(MaskKind::Bool) => {
            let m = p.mask.unwrap_or(Mask { kind: MaskKind::Bool, strides: [0; 4], len: 1 });
            let mut vals: Vec<f64> = (0..nm).map(|_| if rng.below(4) == 0 { 0.0 } else { 1.0 }).collect();
            // Row 5 of every (batch, head) fully masked: zeros.
            for b in 0..p.batch {
                for h in 0..hq {
                    for j in 0..m.len {
                        vals[b * m.strides[0] + h * m.strides[1] + 5 * m.strides[2] + j * m.strides[3]] = 0.0;
                    }
                }
            }
            (vals.iter().map(|&x| x as u8).collect(), vals)
        }
        Some(MaskKind::Additive) => {
            let bits: Vec<u16> = (0..nm).map(|i| if i % 7 == 3 { to_bits(p.dtype, f32::NEG_INFINITY) } else { to_bits(p.dtype, rng.unit() * 3.0) }).collect();
            (bytes(&bits), bits.iter().map(|&b| from_bits(p.dtype, b)).collect())
        }
        None => (vec![], vec![]),
    };
    let (dq, dk, dv) = (up(&bytes(&qv)).map_err(s)?, up(&bytes(&kv)).map_err(s)?, up(&bytes(&vv)).map_err(s)?);
    let dm = if p.mask.is_some() { Some(up(&mbytes).map_err(s)?) } else { None };
    let no = span(p, p.o, hq, p.seq_q);
    let d_o = dev.alloc(no * 2).map_err(s)?;
    let rows = p.batch * hq * p.seq_q;
    let dl = dev.alloc(rows * 4).map_err(s)?;
    let mut ptrs = vec![dq.ptr(), dk.ptr(), dv.ptr()];
    ptrs.extend(dm.as_ref().map(|m| m.ptr()));
    ptrs.push(d_o.ptr());
    d_o.fill_u32(stream, 0xffff_ffff).map_err(s)?;
    dl.fill_u32(stream, 0xffff_ffff).map_err(s)?;
    kern.launch_with_lse(stream, &ptrs, dl.ptr()).map_err(s)?;
    stream.synchronize().map_err(s)?;
    let mut raw = vec![0u8; no * 2];
    d_o.read(0, &mut raw).map_err(s)?;
    let mut lraw = vec![0u8; rows * 4];
    dl.read(0, &mut lraw).map_err(s)?;
    // Rows checked: all of small problems, samples (and the first and last) of large ones.
    let mut pts: Vec<(usize, usize, usize)> = vec![];
    if rows <= 4096 {
        for b in 0..p.batch {
            for h in 0..hq {
                for i in 0..p.seq_q {
                    pts.push((b, h, i));
                }
            }
        }
    } else {
        pts.push((0, 0, 0));
        pts.push((p.batch - 1, hq - 1, p.seq_q - 1));
        for _ in 0..48 {
            pts.push((rng.below(p.batch), rng.below(hq), rng.below(p.seq_q)));
        }
    }
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let chunk = pts.len().div_ceil(threads).max(1);
    let (raw, lraw) = (&raw, &lraw);
    let parts: Vec<(f64, f64, usize)> = std::thread::scope(|sc| {
        let hs: Vec<_> = pts
            .chunks(chunk)
            .map(|part| {
                let (qv, kv, vv, mvals) = (&qv, &kv, &vv, &mvals);
                sc.spawn(move || {
                    let (mut err, mut lerr, mut nan) = (0f64, 0f64, 0usize);
                    for &(b, h, i) in part {
                        let (want, lse) = reference(p, qv, kv, vv, mvals, (b, h, i));
                        let at = p.o.at(b, h, i);
                        for (c, w) in want.iter().enumerate() {
                            let g = from_bits(p.dtype, u16::from_le_bytes([raw[2 * (at + c)], raw[2 * (at + c) + 1]]));
                            if !g.is_finite() {
                                nan += 1;
                            }
                            err = err.max((g - w).abs() / (1.0 + w.abs()));
                        }
                        let li = 4 * ((b * hq + h) * p.seq_q + i);
                        let gl = f32::from_le_bytes([lraw[li], lraw[li + 1], lraw[li + 2], lraw[li + 3]]) as f64;
                        let le = if lse == f64::NEG_INFINITY { if gl == lse { 0.0 } else { f64::INFINITY } } else { (gl - lse).abs() / (1.0 + lse.abs()) };
                        lerr = lerr.max(le);
                    }
                    (err, lerr, nan)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or((f64::NAN, f64::NAN, 1))).collect()
    });
    let max_err = parts.iter().map(|x| x.0).fold(0f64, f64::max);
    let lse_err = parts.iter().map(|x| x.1).fold(0f64, f64::max);
    let nans: usize = parts.iter().map(|x| x.2).sum();
    let tol = if p.dtype == DType::BF16 { 2e-2 } else { 4e-3 };
    let ok = nans == 0 && max_err < tol && lse_err < 1e-3;
    let f = kern.function();
    let cfg = kern.launch_config();
    let mut j = json!({
        "kind": if c.time { "bench" } else { "check" },
        "label": c.label, "kernel": name,
        "batch": p.batch, "heads": [p.heads_q, p.heads_kv], "seq": [p.seq_q, p.seq_k], "head_dim": p.head_dim,
        "dtype": p.dtype.name(), "causal": format!("{:?}", p.causal), "mask": p.mask.map(|m| format!("{:?}", m.kind)),
        "params": format!("m{} n{} w{} s{}{}", q.block_m, q.block_n, q.warps, q.stages, if q.wgmma { " wgmma" } else { "" }),
        "ok": ok, "max_err": max_err, "lse_err": lse_err, "nan": nans, "rows_checked": pts.len(),
        "regs": f.num_regs().unwrap_or(0), "local_bytes": f.local_bytes().unwrap_or(0),
        "occupancy": f.max_active_blocks_per_sm(cfg.block.0, cfg.shared_mem_bytes).unwrap_or(0),
        "compile_s": compile_s, "grid": [cfg.grid.0, cfg.grid.1, cfg.grid.2], "smem": cfg.shared_mem_bytes,
    });
    if c.time && ok {
        let ms = common::time_ms(dev, stream, 3, iters, || kern.launch(stream, &ptrs)).map_err(s)?;
        j["ms"] = json!(ms);
        j["tflops"] = json!(p.flops() / (ms * 1e-3) / 1e12);
    }
    Ok(j)
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let phase = argv.first().cloned().unwrap_or_else(|| "check".into());
    let opt = |name: &str| argv.iter().position(|a| a == name).and_then(|i| argv.get(i + 1).cloned());
    let iters: usize = opt("--iters").and_then(|v| v.parse().ok()).unwrap_or(20).max(1);
    let dump = opt("--dump");
    let only = opt("--only");
    let fail = |e: String| -> ! {
        eprintln!("attn_bench: {e}");
        std::process::exit(1)
    };
    if phase != "check" && phase != "bench" {
        fail(format!("unknown phase '{phase}' (check or bench)"));
    }
    let dev = Device::open(0).unwrap_or_else(|e| fail(e.to_string()));
    let nv = Nvrtc::load().unwrap_or_else(|e| fail(e.to_string()));
    let props = dev.props().clone();
    println!("{}", json!({"device": props.name, "sms": props.sm_count, "arch": props.arch(), "nvrtc": format!("{:?}", nv.version()), "flash_params": std::env::var("FLASH_PARAMS").ok()}));
    let comp = Compiler::new(nv, &props.arch());
    let stream = dev.stream().unwrap_or_else(|e| fail(e.to_string()));
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1);
    let mut rng = Rng(seed);
    let cases = if phase == "bench" { bench_cases() } else { check_cases() };
    let cases: Vec<Case> = cases.into_iter().filter(|c| only.as_ref().is_none_or(|o| c.label.contains(o.as_str()))).collect();
    let sms = props.sm_count as usize;
    let modules: Vec<(String, String)> = cases
        .iter()
        .filter_map(|c| {
            let q = params_of(&c.p, sms);
            flash::applies(&c.p, &q, props.compute_capability).ok()?;
            let a = FlashArgs::dense(c.p.mask.is_some());
            Some((flash::kernel_name(&c.p, &q, &a), flash::render(&c.p, &q, &a)))
        })
        .collect();
    let dcases = if phase == "bench" { decode::bench_cases(seed) } else { decode::check_cases() };
    let dcases: Vec<decode::Case> = dcases.into_iter().filter(|c| only.as_ref().is_none_or(|o| c.label.contains(o.as_str()))).collect();
    let mut modules = modules;
    modules.extend(dcases.iter().filter_map(|c| decode::module(c, sms)));
    common::precompile(&comp, &modules);
    let mut failed = 0;
    if !cases.is_empty() {
        failed += common::run_all(&cases, |x| &x.label, |c| run_case(&dev, &comp, &stream, c, iters, dump.as_deref(), &mut rng));
    }
    if !dcases.is_empty() {
        failed += common::run_all(&dcases, |x| &x.label, |c| decode::run_case(&dev, &comp, &stream, c, iters, &mut rng));
    }
    if failed > 0 {
        std::process::exit(1);
    }
}
