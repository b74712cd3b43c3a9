//! The paged decode kernels' rendered CUDA source run on the CPU under an emulation of CUDA,
//! compared with the interpreter's `paged_attention` (f64): one OS thread per CUDA thread, a
//! `std::barrier` per block for `__syncthreads` (and `__syncthreads_or`) and one per warp for `__shfl_xor_sync` (lanes
//! exchange through per-warp slots), `__shared__` as static storage, blocks one after another,
//! the kernels launched in the order `PagedKernel::launch` launches them (the attention and merge
//! kernels twice). Every 16-byte
//! load is checked to be aligned and inside an input buffer; the outputs are poisoned (NaN)
//! and followed by canaries that must survive.
//!
//! Cases: ragged past lengths (one sequence empty before the append, one ending exactly on a
//! block boundary), GQA, MQA, several new tokens (causal among them), shuffled block tables
//! with garbage in the entries no sequence reaches, several chunk lengths (one chunk, many,
//! chunks past a sequence's end), f16 and bf16, head dims 64 and 128 and a value head dim
//! different from the key's, the caches copied (separate new caches) or updated in place, and
//! a bad block table (NaN for that sequence, the others exact). Skips (passes, saying so)
//! when no C++20 compiler is found. `PAGED_EMU_ONLY=substring` runs the matching cases.

use std::path::{Path, PathBuf};
use std::process::Command;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tilec_cuda::paged::{self, PagedProblem, Params, KERNEL_MARK};
use tilec_ir::op::NnOp;
use tilec_ir::{DType, Graph, Op, Tensor};

const EMU: &str = r#"
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>
struct dim3 { unsigned x, y, z; };
thread_local dim3 threadIdx;
static dim3 blockIdx, gridDim;
static std::barrier<>* g_bar;
static std::barrier<>* g_wbar[8];
struct Span { const unsigned char* p; size_t n; };
static std::vector<Span> g_bufs;
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define TL_INF_F __builtin_inff()
#define TL_NAN_F __builtin_nanf("")
struct alignas(16) uint4 { unsigned x, y, z, w; };
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
static void fail(const char* what, long long a, long long b) { fprintf(stderr, "%s (%lld, %lld) block (%u,%u,%u) thread %u\n", what, a, b, blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x); exit(4); }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline void __syncthreads() { g_bar->arrive_and_wait(); }
static std::atomic<int> g_or;
static inline int __syncthreads_or(int p) {
  if (p) g_or = 1;
  g_bar->arrive_and_wait();
  const int r = g_or;
  g_bar->arrive_and_wait();
  if (threadIdx.x == 0) g_or = 0;
  g_bar->arrive_and_wait();
  return r;
}
static inline int tl_warp() { return threadIdx.x >> 5; }
static inline float tl_h2f(unsigned short h) {
#ifdef TL_EMU_BF16
  unsigned u = (unsigned)h << 16; float f; memcpy(&f, &u, 4); return f;
#else
  _Float16 x; memcpy(&x, &h, 2); return (float)x;
#endif
}
static inline unsigned short tl_pg_f2h(float f) {
#ifdef TL_EMU_BF16
  unsigned u; memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (unsigned short)(u >> 16);
#else
  _Float16 x = (_Float16)f; unsigned short h; memcpy(&h, &x, 2); return h;
#endif
}
static inline uint4 tl_pg_ld16(const void* p) {
  if ((uintptr_t)p % 16 != 0) fail("16-byte load not aligned", (long long)(uintptr_t)p, 0);
  bool inside = false;
  for (auto& s : g_bufs) inside |= (const unsigned char*)p >= s.p && (const unsigned char*)p + 16 <= s.p + s.n;
  if (!inside) fail("16-byte load outside every buffer", (long long)(uintptr_t)p, 0);
  uint4 r; memcpy(&r, p, 16); return r;
}
static inline void tl_pg_unpack(uint4 v, float* f) {
  const unsigned ws[4] = {v.x, v.y, v.z, v.w};
  for (int i = 0; i < 4; ++i) { f[2 * i] = tl_h2f(ws[i] & 0xffff); f[2 * i + 1] = tl_h2f(ws[i] >> 16); }
}
struct WarpX { float f[32]; };
static WarpX g_wx[8];
static inline float __shfl_xor_sync(unsigned, float v, int m) {
  const int w = tl_warp(), l = threadIdx.x & 31;
  g_wx[w].f[l] = v;
  g_wbar[w]->arrive_and_wait();
  const float r = g_wx[w].f[l ^ m];
  g_wbar[w]->arrive_and_wait();
  return r;
}
static void launch(dim3 grid, unsigned threads, const std::function<void()>& f) {
  gridDim = grid;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        blockIdx = dim3{x, y, z};
        std::barrier<> bar(threads);
        g_bar = &bar;
        std::vector<std::barrier<>*> wb;
        for (unsigned w = 0; w < (threads + 31) / 32; ++w) { wb.push_back(new std::barrier<>(32)); g_wbar[w] = wb.back(); }
        std::vector<std::thread> ts;
        for (unsigned t = 0; t < threads; ++t) ts.emplace_back([&, t] { threadIdx = dim3{t, 0, 0}; f(); });
        for (auto& t : ts) t.join();
        for (auto* b : wb) delete b;
      }
}
"#;

fn compiler() -> Option<String> {
    for cc in [std::env::var("CXX").unwrap_or_default(), "g++".into(), "clang++".into(), "c++".into()] {
        if cc.is_empty() {
            continue;
        }
        if Command::new(&cc).arg("--version").output().is_ok_and(|o| o.status.success()) {
            return Some(cc);
        }
    }
    None
}

struct Case {
    label: &'static str,
    p: PagedProblem,
    q: Params,
    past: Vec<usize>,
    /// New caches in separate buffers (the copy kernel runs) instead of in place.
    copied: bool,
    /// A sequence whose table names a block outside the pool.
    bad_seq: Option<usize>,
}

/// Inputs: q, k, v, k_cache, v_cache (values in [-1, 1) rounded to the dtype), the shuffled
/// table (garbage past what each sequence reaches) and the past lengths.
fn inputs(c: &Case, rng: &mut StdRng) -> Vec<Tensor> {
    let p = &c.p;
    let mut f = |shape: Vec<usize>| {
        let n: usize = shape.iter().product();
        let v: Vec<f64> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
        Tensor::from_f64s(p.dtype, shape, &v).unwrap()
    };
    let (b, t) = (p.batch, p.new_tokens);
    let q = f(vec![b, p.heads_q, t, p.head_dim]);
    let k = f(vec![b, p.heads_kv, t, p.head_dim]);
    let v = f(vec![b, p.heads_kv, t, p.v_head_dim]);
    let kc = f(vec![p.blocks, p.block_size, p.heads_kv, p.head_dim]);
    let vc = f(vec![p.blocks, p.block_size, p.heads_kv, p.v_head_dim]);
    let mut ids: Vec<i32> = (0..p.blocks as i32).collect();
    for i in (1..ids.len()).rev() {
        ids.swap(i, rng.gen_range(0..=i));
    }
    let mut next = ids.into_iter();
    let mut table = vec![];
    for s in 0..b {
        let used = (c.past[s] + t).div_ceil(p.block_size);
        for j in 0..p.max_blocks {
            table.push(if j < used { next.next().expect("enough blocks") } else { -1_000_000 - j as i32 });
        }
    }
    if let Some(s) = c.bad_seq {
        table[s * p.max_blocks] = p.blocks as i32 + 3;
    }
    let bt = Tensor::from_vec(vec![b, p.max_blocks], table).unwrap();
    let pl = Tensor::from_vec(vec![b], c.past.iter().map(|&x| x as i32).collect::<Vec<_>>()).unwrap();
    vec![q, k, v, kc, vc, bt, pl]
}

fn oracle(args: &[Tensor], scale: f32) -> Result<Vec<Tensor>, String> {
    let g = Graph::new("empty");
    let bound = Default::default();
    let cx = tilec_ref::EvalCtx { graph: &g, bound: &bound };
    let refs: Vec<&Tensor> = args.iter().collect();
    tilec_ref::eval_op(&Op::Nn(NnOp::PagedAttention { scale }), &refs, &cx)
}

fn run(cc: &str, dir: &Path, c: &Case) -> Result<(), String> {
    let p = &c.p;
    paged::applies(p, &c.q)?;
    let full = paged::render(p, &c.q);
    let body = full.split(KERNEL_MARK).nth(1).ok_or("no kernel mark in the source")?;
    let name = paged::kernel_name(p, &c.q);
    let [cb, cm] = paged::configs(p, &c.q);
    let merged = paged::merge_in_attn(p, &c.q);
    let cp = paged::copy_config(p.k_cache_elems().max(p.v_cache_elems()));
    let mut rng = StdRng::seed_from_u64(0x5eed ^ c.label.len() as u64);
    let args = inputs(c, &mut rng);
    let bytes: Vec<Vec<u8>> = args.iter().map(|t| t.to_le_bytes()).collect();
    let lens: Vec<usize> = bytes.iter().map(|b| b.len()).collect();
    let y_len = p.batch * p.heads_q * p.new_tokens * p.v_head_dim * 2;
    let ws = paged::workspace_bytes(p, &c.q) / 4;
    let g = |c: (u32, u32, u32)| format!("dim3{{{}, {}, {}}}", c.0, c.1, c.2);
    let (kco, vco) = if c.copied { ("kco.data()", "vco.data()") } else { ("in[3].data()", "in[4].data()") };
    let main = format!(
        r#"
int main(int argc, char** argv) {{
  const size_t lens[7] = {{{l0}, {l1}, {l2}, {l3}, {l4}, {l5}, {l6}}};
  std::vector<std::vector<unsigned char>> in(7);
  FILE* f = fopen(argv[1], "rb");
  for (int i = 0; i < 7; ++i) {{
    in[i].resize(lens[i] + 64, 0xa5);
    if (fread(in[i].data(), 1, lens[i], f) != lens[i]) {{ fprintf(stderr, "short input\n"); return 2; }}
  }}
  fclose(f);
  std::vector<unsigned char> y({y_len} + 64, 0xa5), kco(lens[3] + 64, 0xa5), vco(lens[4] + 64, 0xa5);
  memset(y.data(), 0xff, {y_len});
  memset(kco.data(), 0xff, lens[3]);
  memset(vco.data(), 0xff, lens[4]);
  std::vector<float> ws({ws}, NAN);
  for (int i = 0; i < 5; ++i) g_bufs.push_back({{in[i].data(), lens[i]}});
  if ({copied}) {{ g_bufs.push_back({{kco.data(), lens[3]}}); g_bufs.push_back({{vco.data(), lens[4]}}); }}
  auto call = [&](void (*k)(const void*, const void*, const void*, const void*, const void*, const int*, const int*, void*, void*, void*, float*)) {{
    k(in[0].data(), in[1].data(), in[2].data(), in[3].data(), in[4].data(), (const int*)in[5].data(), (const int*)in[6].data(), y.data(), {kco}, {vco}, ws.data());
  }};
  if ({copied}) launch({gcp}, 256, [&] {{ call({name}_copy); }});
  for (int rep = 0; rep < 2; ++rep) {{
    // Twice: the second launch finds the new tokens already in their slots and must give the
    // same outputs.
    launch({gb}, {threads}, [&] {{ call({name}_attn); }});
    if (!{merged}) launch({gm}, 128, [&] {{ call({name}_merge); }});
  }}
  const unsigned char* outs[3] = {{y.data(), {kco}, {vco}}};
  const size_t olen[3] = {{{y_len}, lens[3], lens[4]}};
  for (int o = 0; o < 3; ++o)
    for (int i = 0; i < 64; ++i)
      if (outs[o][olen[o] + i] != 0xa5) {{ fprintf(stderr, "store past output %d\n", o); return 5; }}
  for (int i = 0; i < 7; ++i)
    for (int j = 0; j < 64; ++j)
      if (in[i][lens[i] + j] != 0xa5) {{ fprintf(stderr, "store past input %d\n", i); return 5; }}
  f = fopen(argv[2], "wb");
  for (int o = 0; o < 3; ++o) fwrite(outs[o], 1, olen[o], f);
  fclose(f);
  return 0;
}}
"#,
        l0 = lens[0],
        l1 = lens[1],
        l2 = lens[2],
        l3 = lens[3],
        l4 = lens[4],
        l5 = lens[5],
        l6 = lens[6],
        copied = c.copied,
        gcp = g(cp.grid),
        merged = merged,
        gb = g(cb.grid),
        gm = g(cm.grid),
        threads = c.q.threads(),
    );
    let def = if p.dtype == DType::BF16 { "#define TL_EMU_BF16\n" } else { "" };
    let src = dir.join(format!("{}.cpp", c.label));
    std::fs::write(&src, format!("{def}{EMU}\n{body}\n{main}")).unwrap();
    let exe = dir.join(c.label);
    let out = Command::new(cc)
        .args(["-std=c++20", "-O1", "-pthread", "-w", "-fno-strict-aliasing", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!("compile failed:\n{}", String::from_utf8_lossy(&out.stderr).chars().take(3000).collect::<String>()));
    }
    let fin = dir.join(format!("{}.in", c.label));
    let fout = dir.join(format!("{}.out", c.label));
    std::fs::write(&fin, bytes.concat()).unwrap();
    let r = Command::new(&exe).arg(&fin).arg(&fout).output().map_err(|e| e.to_string())?;
    if !r.status.success() {
        return Err(format!("run failed: {}", String::from_utf8_lossy(&r.stderr)));
    }
    let raw = std::fs::read(&fout).map_err(|e| e.to_string())?;
    let y = Tensor::from_le_bytes(p.dtype, vec![p.batch, p.heads_q, p.new_tokens, p.v_head_dim], &raw[..y_len]).unwrap();
    let kc = Tensor::from_le_bytes(p.dtype, args[3].shape().to_vec(), &raw[y_len..y_len + lens[3]]).unwrap();
    let vc = Tensor::from_le_bytes(p.dtype, args[4].shape().to_vec(), &raw[y_len + lens[3]..]).unwrap();
    compare(c, &args, &[y, kc, vc])
}

fn compare(c: &Case, args: &[Tensor], got: &[Tensor]) -> Result<(), String> {
    let p = &c.p;
    // The output is rounded once to the dtype (2^-9 relative for bf16, 2^-12 for f16), the
    // sums run in f32: tight enough that one key dropped from a few hundred shows.
    let (rel, abs) = if p.dtype == DType::BF16 { (8e-3, 1e-4) } else { (1e-3, 2e-5) };
    let ok = |a: f64, b: f64| (a - b).abs() <= rel * b.abs() + abs;
    let tol = rel;
    let Some(bad) = c.bad_seq else {
        let want = oracle(args, p.scale)?;
        let names = ["y", "k_cache", "v_cache"];
        for (o, (g, w)) in got.iter().zip(&want).enumerate() {
            // The caches are copies of 16-bit values: exact.
            for (i, (a, b)) in g.to_f64_vec().iter().zip(w.to_f64_vec()).enumerate() {
                if !(if o == 0 { ok(*a, b) } else { *a == b }) {
                    return Err(format!("{}[{i}] = {a}, expected {b}", names[o]));
                }
            }
        }
        eprintln!("{}: {} outputs within {tol}", c.label, got[0].numel());
        return Ok(());
    };
    // The interpreter refuses the bad table; the kernels give that sequence NaN and leave the
    // others exact (checked against the interpreter on the other sequences alone).
    if oracle(args, p.scale).is_ok() {
        return Err("the interpreter took a bad block table".into());
    }
    let row = p.heads_q * p.new_tokens * p.v_head_dim;
    let y = got[0].to_f64_vec();
    if !y[bad * row..(bad + 1) * row].iter().all(|x| x.is_nan()) {
        return Err(format!("sequence {bad} (bad table) has outputs that are not NaN"));
    }
    let sub = |t: &Tensor, keep: bool| -> Tensor {
        let s = t.shape();
        let n: usize = s[1..].iter().product();
        let v: Vec<f64> = t.to_f64_vec().chunks(n).enumerate().filter(|(i, _)| (*i != bad) == keep).flat_map(|(_, c)| c.to_vec()).collect();
        let mut shape = s.to_vec();
        shape[0] = v.len() / n;
        Tensor::from_f64s(t.dtype(), shape, &v).unwrap()
    };
    let mut others: Vec<Tensor> = args.to_vec();
    for i in [0, 1, 2, 5, 6] {
        others[i] = sub(&args[i], true);
    }
    let want = oracle(&others, p.scale)?;
    let gy = sub(&got[0], true).to_f64_vec();
    for (i, (a, b)) in gy.iter().zip(want[0].to_f64_vec()).enumerate() {
        if !ok(*a, b) {
            return Err(format!("y of the good sequences [{i}] = {a}, expected {b}"));
        }
    }
    eprintln!("{}: sequence {bad} NaN, the others within {tol}", c.label);
    Ok(())
}

fn problem(batch: usize, hq: usize, hkv: usize, t: usize, d: usize, dv: usize, bs: usize, max_blocks: usize, dtype: DType) -> PagedProblem {
    PagedProblem {
        batch,
        heads_q: hq,
        heads_kv: hkv,
        new_tokens: t,
        head_dim: d,
        v_head_dim: dv,
        blocks: batch * max_blocks + 3,
        block_size: bs,
        max_blocks,
        dtype,
        scale: 1.0 / (d as f32).sqrt(),
    }
}

fn cases() -> Vec<Case> {
    let mut v = vec![];
    let w = |chunk, warps, rows, unroll| Params { chunk, warps, rows, unroll };
    // GQA 8/2, decode, ragged (empty, one block exactly, long), chunks of 64 over 512.
    let p = problem(4, 8, 2, 1, 128, 128, 16, 32, DType::BF16);
    v.push(Case { label: "gqa_bf16_d128_ragged_chunk64", p, q: w(64, 4, 4, 4), past: vec![0, 15, 300, 511], copied: false, bad_seq: None });
    // The same with one chunk per sequence, two warps, unroll 2, caches copied.
    let p = problem(4, 8, 2, 1, 128, 128, 16, 32, DType::BF16);
    v.push(Case { label: "gqa_bf16_d128_one_chunk_copied", p, q: w(512, 2, 4, 2), past: vec![0, 15, 300, 511], copied: true, bad_seq: None });
    // MQA: 12 query heads over one KV head (rows split over two groups), f16, head dim 64.
    let p = problem(3, 12, 1, 1, 64, 64, 8, 20, DType::F16);
    v.push(Case { label: "mqa_f16_d64_row_groups", p, q: w(32, 4, 8, 4), past: vec![7, 159, 64], copied: false, bad_seq: None });
    // Three new tokens per sequence (causal among them), value dim 32, blocks of 4.
    let p = problem(2, 4, 2, 3, 64, 32, 4, 24, DType::BF16);
    v.push(Case { label: "three_tokens_bf16_dv32", p, q: w(16, 4, 6, 4), past: vec![5, 90], copied: true, bad_seq: None });
    // Head dim 256 (a whole warp per key row), f16, many chunks.
    let p = problem(2, 2, 2, 1, 256, 256, 16, 8, DType::F16);
    v.push(Case { label: "mha_f16_d256", p, q: w(32, 2, 1, 2), past: vec![100, 37], copied: false, bad_seq: None });
    // The decode benchmark's parameters (chunks of 1024, one row per block), full chunks.
    let p = problem(2, 2, 2, 1, 128, 128, 16, 128, DType::BF16);
    let q = paged::heuristic(&problem(32, 32, 32, 1, 128, 128, 16, 512, DType::BF16), 132);
    v.push(Case { label: "mha_bf16_d128_bench_params", p, q, past: vec![2047, 1500], copied: false, bad_seq: None });
    // GQA 4/1 with one row per block: four row groups reading the same keys.
    let p = problem(2, 4, 1, 1, 64, 64, 16, 8, DType::F16);
    v.push(Case { label: "gqa_f16_rows1", p, q: w(64, 4, 1, 8), past: vec![90, 127], copied: false, bad_seq: None });
    // More chunks than the attention kernel merges itself: the `_merge` kernel's path.
    let p = problem(2, 8, 2, 1, 64, 64, 16, 32, DType::BF16);
    let q = w(16, 2, 4, 2);
    assert!(!paged::merge_in_attn(&p, &q));
    v.push(Case { label: "gqa_bf16_many_chunks_merge_kernel", p, q, past: vec![450, 77], copied: true, bad_seq: None });
    // A bad table entry in sequence 1: NaN there, the rest exact.
    let p = problem(3, 4, 2, 1, 64, 64, 16, 8, DType::BF16);
    v.push(Case { label: "bad_table_bf16", p, q: w(32, 4, 2, 4), past: vec![40, 70, 100], copied: true, bad_seq: Some(1) });
    // The same with one chunk a sequence (the attention kernel stores the rows).
    let p = problem(3, 4, 2, 1, 64, 64, 16, 8, DType::F16);
    v.push(Case { label: "bad_table_f16_one_chunk", p, q: w(128, 4, 2, 4), past: vec![40, 70, 100], copied: false, bad_seq: Some(1) });
    v
}

#[test]
fn rendered_paged_kernels_match_the_interpreter_under_emulation() {
    let Some(cc) = compiler() else {
        eprintln!("note: no C++ compiler; the paged decode kernels were not emulated");
        return;
    };
    let dir: PathBuf = std::env::temp_dir().join(format!("tilec-paged-emu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Both ways of storing the rows (one chunk: the attention kernel; more: the merge) are
    // among the cases.
    assert!(cases().iter().any(|c| paged::merge_in_attn(&c.p, &c.q)) && cases().iter().any(|c| !paged::merge_in_attn(&c.p, &c.q)));
    let only = std::env::var("PAGED_EMU_ONLY").unwrap_or_default();
    let mut failed = vec![];
    for c in cases().iter().filter(|c| c.label.contains(only.as_str())) {
        if let Err(e) = run(&cc, &dir, c) {
            failed.push(format!("{}: {e}", c.label));
        }
    }
    if failed.is_empty() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    assert!(failed.is_empty(), "{failed:#?} (sources in {})", dir.display());
}

#[test]
fn the_heuristic_plans_of_decode_shapes_apply() {
    for (b, ctx) in [(32usize, 8192usize), (1, 8192), (7, 300)] {
        let p = problem(b, 32, 8, 1, 128, 128, 16, ctx.div_ceil(16), DType::BF16);
        let q = paged::heuristic(&p, 132);
        paged::applies(&p, &q).unwrap_or_else(|e| panic!("{b} x {ctx}: {e}"));
    }
}

/// The rendered kernels compile with NVRTC (skips, saying so, when the library is not found:
/// set TILEC_NVRTC_LIB), for Hopper and Ampere in both dtypes and for Turing in f16, every
/// case's parameters and the decode benchmark's heuristic ones (`PAGED_DUMP=dir` writes the
/// sources there).
#[test]
fn paged_kernels_compile_with_nvrtc() {
    let nv = match tilec_cuda::Nvrtc::load() {
        Ok(n) => n,
        Err(e) => {
            eprintln!("note: the paged kernels were not compiled: {e} (set TILEC_NVRTC_LIB to a libnvrtc.so)");
            return;
        }
    };
    let mut modules = vec![];
    for c in cases() {
        modules.push((paged::kernel_name(&c.p, &c.q), paged::render(&c.p, &c.q)));
    }
    for hkv in [32, 8] {
        let p = problem(32, 32, hkv, 1, 128, 128, 16, 512, DType::BF16);
        let q = paged::heuristic(&p, 132);
        modules.push((paged::kernel_name(&p, &q), paged::render(&p, &q)));
    }
    if let Ok(dir) = std::env::var("PAGED_DUMP") {
        for (name, src) in &modules {
            std::fs::write(Path::new(&dir).join(format!("{name}.cu")), src).unwrap();
        }
    }
    for arch in ["sm_90a", "sm_80"] {
        let c = tilec_cuda::Compiler::new(nv.clone(), arch).with_cache_dir(None);
        for ((name, _), r) in modules.iter().zip(c.compile_many(&modules)) {
            let r = r.unwrap_or_else(|e| panic!("{arch} {name}: {e}"));
            assert!(r.image.starts_with(b"\x7fELF"), "{arch} {name}: not a cubin");
        }
    }
    let f16: Vec<(String, String)> = cases()
        .into_iter()
        .filter(|c| c.p.dtype == DType::F16)
        .map(|c| (paged::kernel_name(&c.p, &c.q), paged::render(&c.p, &c.q)))
        .collect();
    let c = tilec_cuda::Compiler::new(nv, "sm_75").with_cache_dir(None);
    for ((name, _), r) in f16.iter().zip(c.compile_many(&f16)) {
        r.unwrap_or_else(|e| panic!("sm_75 {name}: {e}"));
    }
}
