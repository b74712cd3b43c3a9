//! The paged decode kernels (`tilec_cuda::paged`) in `attn_bench`: one step (append, chunks,
//! merge) over a paged cache with shuffled block tables, the caches updated in place.
//! - check: small ragged, GQA, MQA and three-token problems compared whole with the
//!   interpreter's `paged_attention` (f64), the output poisoned first;
//! - bench: `attn_decode_bf16_b32h32kv8192d128` (MHA: 32 heads, 8192 keys per sequence after
//!   the append, blocks of 16 tokens), its GQA twin (8 KV heads) and a ragged twin (lengths
//!   uniform in 1..=8192), timed (median, CUDA events) in TB/s of the K and V bytes the step
//!   reads; sampled rows checked against an f64 reference. `bench/attn_peer.py` times
//!   PyTorch's SDPA on the same labels (K/V contiguous).
//!
//! `PAGED_PARAMS=chunk,warps,rows,unroll` overrides the heuristic.

use serde_json::json;
use tilec_cuda::paged::{self, PagedKernel, PagedProblem, Params};
use tilec_cuda::*;
use tilec_ir::op::NnOp;
use tilec_ir::{DType, Graph, Op, Tensor};

use super::common::{self, from_bits, to_bits, Rng};

pub struct Case {
    pub label: String,
    p: PagedProblem,
    /// Tokens in the cache before the step, per sequence.
    past: Vec<usize>,
    pub time: bool,
}

fn problem(batch: usize, hq: usize, hkv: usize, t: usize, d: usize, ctx: usize, dtype: DType) -> PagedProblem {
    let bs = 16;
    let max_blocks = ctx.div_ceil(bs);
    PagedProblem {
        batch,
        heads_q: hq,
        heads_kv: hkv,
        new_tokens: t,
        head_dim: d,
        v_head_dim: d,
        blocks: batch * max_blocks + 1,
        block_size: bs,
        max_blocks,
        dtype,
        scale: 1.0 / (d as f32).sqrt(),
    }
}

pub fn check_cases() -> Vec<Case> {
    let c = |label: &str, p: PagedProblem, past: Vec<usize>| Case { label: label.into(), p, past, time: false };
    vec![
        c("decode_gqa_bf16_d128_ragged", problem(4, 8, 2, 1, 128, 512, DType::BF16), vec![0, 15, 300, 511]),
        c("decode_mqa_f16_d64", problem(3, 12, 1, 1, 64, 320, DType::F16), vec![7, 159, 319]),
        c("decode_three_tokens_bf16_d128", problem(2, 4, 2, 3, 128, 400, DType::BF16), vec![9, 390]),
        c("decode_mha_f16_d128_b32", problem(32, 8, 8, 1, 128, 1024, DType::F16), (0..32).map(|i| i * 31 + 5).collect()),
        // A 1.1B LLaMA's step at batch 1, and a long context at batch 1 (64 chunks).
        c("decode_llama_bs1_gqa_bf16_d64", problem(1, 32, 4, 1, 64, 272, DType::BF16), vec![200]),
        c("decode_long_bs1_gqa_bf16_d128", problem(1, 32, 8, 1, 128, 4096, DType::BF16), vec![4000]),
    ]
}

pub fn bench_cases(seed: u64) -> Vec<Case> {
    let full = vec![8191; 32];
    let mut rng = Rng(seed ^ 0x5a5a);
    let ragged: Vec<usize> = (0..32).map(|_| rng.below(8192)).collect();
    let b = |label: &str, hkv: usize, past: Vec<usize>| Case { label: label.into(), p: problem(32, 32, hkv, 1, 128, 8192, DType::BF16), past, time: true };
    vec![
        b("attn_decode_bf16_b32h32kv8192d128", 32, full.clone()),
        b("attn_decode_gqa_bf16_b32h32g8kv8192d128", 8, full),
        b("attn_decode_ragged_bf16_b32h32kv8192d128", 32, ragged),
    ]
}

pub fn params_of(p: &PagedProblem, sms: usize) -> Params {
    let d = paged::heuristic(p, sms);
    let env = std::env::var("PAGED_PARAMS").unwrap_or_default();
    let v: Vec<usize> = env.split(',').filter_map(|x| x.trim().parse().ok()).collect();
    match v[..] {
        [chunk, warps, rows, unroll] => Params { chunk, warps, rows, unroll },
        _ => d,
    }
}

/// The module of a case (for precompiling).
pub fn module(c: &Case, sms: usize) -> Option<(String, String)> {
    let q = params_of(&c.p, sms);
    paged::applies(&c.p, &q).ok()?;
    Some((paged::kernel_name(&c.p, &q), paged::render(&c.p, &q)))
}

/// `n` random 16-bit values in [-scale, scale), generated on every core.
fn random(dt: DType, n: usize, seed: u64, scale: f32) -> Vec<u16> {
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let mut v = vec![0u16; n];
    let per = n.div_ceil(threads).max(1);
    std::thread::scope(|s| {
        for (i, part) in v.chunks_mut(per).enumerate() {
            s.spawn(move || {
                let mut r = Rng(seed ^ (i as u64 + 1).wrapping_mul(0x9e37_79b9));
                part.iter_mut().for_each(|x| *x = to_bits(dt, r.unit() * scale));
            });
        }
    });
    v
}

struct Host {
    q: Vec<u16>,
    k: Vec<u16>,
    v: Vec<u16>,
    kc: Vec<u16>,
    vc: Vec<u16>,
    table: Vec<i32>,
}

/// Where position `pos` of sequence `b`, KV head `hk` lies: the new keys (values) past the
/// cached ones, else the cache slot the table names.
fn source<'a>(p: &PagedProblem, x: &'a Host, past: usize, (b, hk, pos): (usize, usize, usize), k: bool) -> (&'a [u16], usize) {
    let d = p.head_dim;
    if pos >= past {
        (if k { &x.k } else { &x.v }, ((b * p.heads_kv + hk) * p.new_tokens + pos - past) * d)
    } else {
        let blk = x.table[b * p.max_blocks + pos / p.block_size] as usize;
        (if k { &x.kc } else { &x.vc }, ((blk * p.block_size + pos % p.block_size) * p.heads_kv + hk) * d)
    }
}

/// Row `(b, h, t)` of the reference from the host copies (the new tokens read from `k`/`v`).
fn reference(p: &PagedProblem, x: &Host, past: &[usize], (b, h, t): (usize, usize, usize)) -> Vec<f64> {
    let (d, hk) = (p.head_dim, h / p.rep());
    let f = |v: &[u16], at: usize| from_bits(p.dtype, v[at]);
    let src = |pos: usize, k: bool| source(p, x, past[b], (b, hk, pos), k);
    let qr = ((b * p.heads_q + h) * p.new_tokens + t) * d;
    let n = past[b] + t + 1;
    let s: Vec<f64> = (0..n)
        .map(|pos| {
            let (kv, at) = src(pos, true);
            p.scale as f64 * (0..d).map(|e| f(&x.q, qr + e) * f(kv, at + e)).sum::<f64>()
        })
        .collect();
    let mx = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let w: Vec<f64> = s.iter().map(|&v| (v - mx).exp()).collect();
    let sum: f64 = w.iter().sum();
    let mut out = vec![0.0; d];
    for (pos, wi) in w.iter().enumerate() {
        let (vv, at) = src(pos, false);
        for (e, o) in out.iter_mut().enumerate() {
            *o += wi / sum * f(vv, at + e);
        }
    }
    out
}

/// The whole output through the interpreter's `paged_attention`.
fn interpreter(p: &PagedProblem, x: &Host, past: &[usize]) -> Result<Vec<f64>, String> {
    let t = |shape: Vec<usize>, v: &[u16]| {
        let vals: Vec<f64> = v.iter().map(|&b| from_bits(p.dtype, b)).collect();
        Tensor::from_f64s(p.dtype, shape, &vals).map_err(|e| e.to_string())
    };
    let (b, hq, hkv, tn, d) = (p.batch, p.heads_q, p.heads_kv, p.new_tokens, p.head_dim);
    let args = [
        t(vec![b, hq, tn, d], &x.q)?,
        t(vec![b, hkv, tn, d], &x.k)?,
        t(vec![b, hkv, tn, d], &x.v)?,
        t(vec![p.blocks, p.block_size, hkv, d], &x.kc)?,
        t(vec![p.blocks, p.block_size, hkv, d], &x.vc)?,
        Tensor::from_vec(vec![b, p.max_blocks], x.table.clone()).map_err(|e| e.to_string())?,
        Tensor::from_vec(vec![b], past.iter().map(|&v| v as i32).collect::<Vec<_>>()).map_err(|e| e.to_string())?,
    ];
    let g = Graph::new("empty");
    let bound = Default::default();
    let cx = tilec_ref::EvalCtx { graph: &g, bound: &bound };
    let refs: Vec<&Tensor> = args.iter().collect();
    let out = tilec_ref::eval_op(&Op::Nn(NnOp::PagedAttention { scale: p.scale }), &refs, &cx)?;
    Ok(out[0].to_f64_vec())
}

pub fn run_case(dev: &Device, comp: &Compiler, stream: &Stream, c: &Case, iters: usize, rng: &mut Rng) -> Result<serde_json::Value, String> {
    let s = |e: CudaError| e.to_string();
    let p = &c.p;
    let q = params_of(p, dev.props().sm_count as usize);
    paged::applies(p, &q)?;
    let name = paged::kernel_name(p, &q);
    let t0 = std::time::Instant::now();
    let compiled = comp.compile(&name, &paged::render(p, &q)).map_err(s)?;
    let compile_s = t0.elapsed().as_secs_f64();
    let kern = PagedKernel::from_image(dev, p, &q, &compiled.image, compiled.cache_hit).map_err(s)?;
    let (b, d, dt) = (p.batch, p.head_dim, p.dtype);
    // Error over tolerance: the output is rounded once to the dtype, the sums run in f32 (one
    // key dropped from a few hundred shows).
    let (rel, abs) = if dt == DType::BF16 { (8e-3, 1e-4) } else { (1e-3, 2e-5) };
    let excess = |g: f64, w: f64| (g - w).abs() / (rel * w.abs() + abs);
    let seed = rng.next();
    // Each sequence's blocks drawn from a shuffled pool.
    let mut ids: Vec<i32> = (0..p.blocks as i32).collect();
    for i in (1..ids.len()).rev() {
        ids.swap(i, rng.below(i + 1));
    }
    let table: Vec<i32> = ids[..b * p.max_blocks].to_vec();
    let x = Host {
        q: random(dt, b * p.heads_q * p.new_tokens * d, seed, 2.0),
        k: random(dt, b * p.heads_kv * p.new_tokens * d, seed + 1, 2.0),
        v: random(dt, b * p.heads_kv * p.new_tokens * d, seed + 2, 1.0),
        kc: random(dt, p.k_cache_elems(), seed + 3, 2.0),
        vc: random(dt, p.v_cache_elems(), seed + 4, 1.0),
        table,
    };
    let up = |bytes: &[u8]| -> Result<DeviceBuffer> {
        let buf = dev.alloc(bytes.len().max(16))?;
        buf.write(0, bytes)?;
        Ok(buf)
    };
    let b16 = |v: &[u16]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let b32 = |v: &[i32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let past32: Vec<i32> = c.past.iter().map(|&v| v as i32).collect();
    let bufs = [b16(&x.q), b16(&x.k), b16(&x.v), b16(&x.kc), b16(&x.vc), b32(&x.table), b32(&past32)];
    let dbufs = bufs.iter().map(|v| up(v)).collect::<Result<Vec<_>>>().map_err(s)?;
    let ny = b * p.heads_q * p.new_tokens * d;
    let dy = dev.alloc(ny * 2).map_err(s)?;
    let mut ptrs: Vec<u64> = dbufs.iter().map(|b| b.ptr()).collect();
    ptrs.extend([dy.ptr(), dbufs[3].ptr(), dbufs[4].ptr()]);
    dy.fill_u32(stream, 0xffff_ffff).map_err(s)?;
    kern.launch(stream, &ptrs).map_err(s)?;
    stream.synchronize().map_err(s)?;
    let mut raw = vec![0u8; ny * 2];
    dy.read(0, &mut raw).map_err(s)?;
    // A second launch (the new tokens already in their slots) gives the same output bit for
    // bit, and the new keys and values are in the slots the table names.
    dy.fill_u32(stream, 0xffff_ffff).map_err(s)?;
    kern.launch(stream, &ptrs).map_err(s)?;
    stream.synchronize().map_err(s)?;
    let mut again = vec![0u8; ny * 2];
    dy.read(0, &mut again).map_err(s)?;
    let repeat_same = again == raw;
    let read16 = |buf: &DeviceBuffer, n: usize| -> Result<Vec<u16>> {
        let mut r = vec![0u8; n * 2];
        buf.read(0, &mut r)?;
        Ok(r.chunks_exact(2).map(|h| u16::from_le_bytes([h[0], h[1]])).collect())
    };
    let (kc_after, vc_after) = (read16(&dbufs[3], p.k_cache_elems()).map_err(s)?, read16(&dbufs[4], p.v_cache_elems()).map_err(s)?);
    let mut appended = true;
    for (bb, &past) in c.past.iter().enumerate() {
        for hk in 0..p.heads_kv {
            for t in 0..p.new_tokens {
                let pos = past + t;
                let blk = x.table[bb * p.max_blocks + pos / p.block_size] as usize;
                let slot = (blk * p.block_size + pos % p.block_size) * p.heads_kv + hk;
                let src = (bb * p.heads_kv + hk) * p.new_tokens + t;
                let (dk, dv) = (p.head_dim, p.v_head_dim);
                appended &= kc_after[slot * dk..(slot + 1) * dk] == x.k[src * dk..(src + 1) * dk];
                appended &= vc_after[slot * dv..(slot + 1) * dv] == x.v[src * dv..(src + 1) * dv];
            }
        }
    }
    let got = |i: usize| from_bits(dt, u16::from_le_bytes([raw[2 * i], raw[2 * i + 1]]));
    let rows = b * p.heads_q * p.new_tokens;
    let (mut err, mut nan, mut checked) = (0f64, 0usize, 0usize);
    if c.time {
        // Sampled rows (first, last, random) against the f64 reference.
        let mut pts = vec![(0, 0, 0), (b - 1, p.heads_q - 1, p.new_tokens - 1)];
        pts.extend((0..14).map(|_| (rng.below(b), rng.below(p.heads_q), rng.below(p.new_tokens))));
        for (bb, h, t) in pts {
            let want = reference(p, &x, &c.past, (bb, h, t));
            let at = ((bb * p.heads_q + h) * p.new_tokens + t) * d;
            for (e, w) in want.iter().enumerate() {
                let g = got(at + e);
                nan += usize::from(!g.is_finite());
                err = err.max(excess(g, *w));
            }
            checked += 1;
        }
    } else {
        let want = interpreter(p, &x, &c.past)?;
        // The sampled reference of the bench cases agrees with the interpreter (whose output
        // is rounded once to the dtype: within half a unit in the last place).
        let half_ulp = if dt == DType::BF16 { 4e-3 } else { 5e-4 };
        for (bb, h, t) in [(0, 0, 0), (b - 1, p.heads_q - 1, p.new_tokens - 1)] {
            let at = ((bb * p.heads_q + h) * p.new_tokens + t) * d;
            let mine = reference(p, &x, &c.past, (bb, h, t));
            if mine.iter().zip(&want[at..at + d]).any(|(a, w)| (a - w).abs() > half_ulp * (1.0 + w.abs())) {
                return Err(format!("the sampled reference disagrees with the interpreter on row ({bb}, {h}, {t})"));
            }
        }
        for (i, w) in want.iter().enumerate() {
            let g = got(i);
            nan += usize::from(!g.is_finite());
            err = err.max(excess(g, *w));
        }
        checked = rows;
    }
    let ok = nan == 0 && err <= 1.0 && repeat_same && appended;
    let cfg = kern.launch_config();
    let f = kern.function();
    let lens: Vec<usize> = c.past.iter().map(|&l| l + p.new_tokens).collect();
    let kv_bytes = paged::kv_bytes_read(p, &lens);
    let mut j = json!({
        "kind": if c.time { "bench" } else { "check" },
        "label": c.label, "kernel": name,
        "batch": b, "heads": [p.heads_q, p.heads_kv], "new_tokens": p.new_tokens, "head_dim": d, "dtype": dt.name(),
        "block_size": p.block_size, "max_context": p.context(), "kv_gb": kv_bytes / 1e9,
        "params": format!("chunk {} warps {} rows {} unroll {}", q.chunk, q.warps, q.rows, q.unroll),
        "ok": ok, "max_err_over_tol": err, "nan": nan, "rows_checked": checked,
        "repeat_same": repeat_same, "appended": appended, "merge_in_attn": paged::merge_in_attn(p, &q),
        "regs": f.num_regs().unwrap_or(0), "local_bytes": f.local_bytes().unwrap_or(0),
        "occupancy": f.max_active_blocks_per_sm(cfg.block.0, cfg.shared_mem_bytes).unwrap_or(0),
        "compile_s": compile_s, "grid": [cfg.grid.0, cfg.grid.1, cfg.grid.2],
    });
    if c.time && ok {
        let ms = common::time_ms(dev, stream, 3, iters, || kern.launch(stream, &ptrs)).map_err(s)?;
        j["ms"] = json!(ms);
        j["us"] = json!(ms * 1e3);
        j["tbps"] = json!(kv_bytes / (ms * 1e-3) / 1e12);
    }
    Ok(j)
}

