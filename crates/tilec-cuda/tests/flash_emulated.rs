//! The FlashAttention kernel's rendered CUDA source run on the CPU under an emulation of the
//! instructions it uses, compared with an f64 reference: one OS thread per CUDA thread, a
//! `std::barrier` per block for `__syncthreads` and one per warp for the warp-collective
//! instructions, which exchange their operands through per-warp slots and compute what the
//! PTX ISA specifies for each lane:
//! - `ldmatrix.m8n8.x4` (and `.trans`): lanes `8i..8i+7` give the row addresses of matrix `i`;
//!   lane `l` gets, in register `i`, elements `(l/4, 2(l%4))` and `(l/4, 2(l%4)+1)` of it
//!   (transposed: `(2(l%4), l/4)` and `(2(l%4)+1, l/4)`), the first in the low half;
//! - `mma.sync.m16n8k16` (row.col, f32 accumulators): A rows `g`, `g+8` x columns
//!   `2t, 2t+1, 2t+8, 2t+9` in registers `{a0 a1} {a2 a3} {a4 a5} {a6 a7}` ordered
//!   (row g, k lo), (row g+8, k lo), (row g, k hi), (row g+8, k hi); B k rows `2t, 2t+1` and
//!   `2t+8, 2t+9` of column `g`; C/D rows `g`, `g+8`, columns `2t, 2t+1`;
//! - `__shfl_xor_sync`;
//! - `cp.async`: each thread's copies are queued in commit groups and land only when
//!   `wait_group` lets them (so a missing wait or barrier reads stale or poisoned data); the
//!   source must be 16-byte aligned and inside one of the buffers, the destination inside
//!   shared memory, which is poisoned (0xFF: NaN) before each block.
//!
//! The packing of floats to 16-bit pairs uses the host's round-to-nearest-even conversion.
//! Outputs are poisoned (NaN) with a canary past their end. What is not covered: the inline
//! PTX of the helpers themselves (shared with the validated `mma` template, except the packing
//! and `cvt.f32.f16`), timing, and the real memory model. Skips (passes, saying so) when no
//! C++20 compiler is found. `FLASH_EMU_ONLY=substring` runs the matching cases.

use std::path::{Path, PathBuf};
use std::process::Command;

use half::{bf16, f16};
use tilec_cuda::flash::{self, Causal, FlashArgs, FlashProblem, Mask, MaskKind, Params, Strides, KERNEL_MARK};
use tilec_ir::DType;

const EMU: &str = r#"
#include <barrier>
#include <cmath>
#include <math.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
struct dim3 { unsigned x, y, z; };
thread_local dim3 threadIdx;
static dim3 blockIdx, gridDim;
static std::barrier<>* g_bar;
static std::barrier<>* g_wbar[8];
static size_t g_smem_len;
alignas(128) static unsigned char g_smem[256 * 1024];
struct Span { const unsigned char* p; size_t n; };
static std::vector<Span> g_bufs;
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define TL_INF_F __builtin_inff()
static void fail(const char* what, long long a, long long b) { fprintf(stderr, "%s (%lld, %lld) block (%u,%u,%u) thread %u\n", what, a, b, blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x); exit(4); }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline void __syncthreads() { g_bar->arrive_and_wait(); }
static inline int tl_lane() { return threadIdx.x & 31; }
static inline int tl_warp() { return threadIdx.x >> 5; }
static inline void tl_warp_sync() { g_wbar[tl_warp()]->arrive_and_wait(); }
static inline unsigned tl_mma_saddr(const void* p) { return (unsigned)((const unsigned char*)p - g_smem); }
static inline float tl_h2f(unsigned short h) {
#ifdef TL_EMU_BF16
  unsigned u = (unsigned)h << 16; float f; memcpy(&f, &u, 4); return f;
#else
  _Float16 x; memcpy(&x, &h, 2); return (float)x;
#endif
}
static inline unsigned short tl_f2h(float f) {
#ifdef TL_EMU_BF16
  unsigned u; memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (unsigned short)(u >> 16);
#else
  _Float16 x = (_Float16)f; unsigned short h; memcpy(&h, &x, 2); return h;
#endif
}
static inline unsigned tl_fa_pack(float lo, float hi) { return (unsigned)tl_f2h(lo) | ((unsigned)tl_f2h(hi) << 16); }
static inline float tl_fa_h2f(unsigned short h) { return tl_h2f(h); }
// cp.async: queued per thread in commit groups.
struct Copy { unsigned dst; const void* src; unsigned bytes; };
thread_local std::vector<Copy> t_open;
thread_local std::vector<std::vector<Copy>> t_groups;
static inline void tl_cp16(unsigned dst, const void* src, unsigned bytes) {
  if (bytes > 16) fail("cp.async of more than 16 bytes", bytes, 0);
  if (dst % 16 != 0 || dst + 16 > g_smem_len) fail("cp.async destination outside shared memory or misaligned", dst, g_smem_len);
  if (bytes > 0) {
    if ((uintptr_t)src % 16 != 0) fail("cp.async source not 16-byte aligned", (long long)(uintptr_t)src, 0);
    bool inside = false;
    for (auto& s : g_bufs) inside |= (const unsigned char*)src >= s.p && (const unsigned char*)src + bytes <= s.p + s.n;
    if (!inside) fail("cp.async source outside every buffer", (long long)(uintptr_t)src, bytes);
  }
  t_open.push_back({dst, src, bytes});
}
static inline void tl_fa_commit() { t_groups.push_back(t_open); t_open.clear(); }
template <int N> static inline void tl_fa_wait() {
  while (t_groups.size() > (size_t)N) {
    for (auto& c : t_groups.front()) {
      if (c.bytes) memcpy(g_smem + c.dst, c.src, c.bytes);
      memset(g_smem + c.dst + c.bytes, 0, 16 - c.bytes);
    }
    t_groups.erase(t_groups.begin());
  }
}
// Per-warp exchange slots for the collective instructions.
struct WarpX { unsigned u[32][8]; float f[32]; };
static WarpX g_wx[8];
static inline void tl_ldm(unsigned addr, unsigned* r, bool trans) {
  const int w = tl_warp(), l = tl_lane();
  if (addr % 16 != 0 || addr + 16 > g_smem_len) fail("ldmatrix row address outside shared memory or misaligned", addr, g_smem_len);
  g_wx[w].u[l][0] = addr;
  tl_warp_sync();
  for (int i = 0; i < 4; ++i) {
    if (!trans) {
      memcpy(&r[i], g_smem + g_wx[w].u[8 * i + (l >> 2)][0] + 4 * (l & 3), 4);
    } else {
      unsigned short lo, hi;
      memcpy(&lo, g_smem + g_wx[w].u[8 * i + 2 * (l & 3)][0] + 2 * (l >> 2), 2);
      memcpy(&hi, g_smem + g_wx[w].u[8 * i + 2 * (l & 3) + 1][0] + 2 * (l >> 2), 2);
      r[i] = (unsigned)lo | ((unsigned)hi << 16);
    }
  }
  tl_warp_sync();
}
static inline void tl_ldm4(unsigned addr, unsigned* r) { tl_ldm(addr, r, false); }
static inline void tl_ldm4t(unsigned addr, unsigned* r) { tl_ldm(addr, r, true); }
static inline float tl_half_of(unsigned u, int hi) { return tl_h2f((unsigned short)(hi ? u >> 16 : u & 0xffff)); }
static inline void tl_mma16816(float* d, const unsigned* a, const unsigned* b) {
  const int w = tl_warp(), l = tl_lane();
  for (int i = 0; i < 4; ++i) g_wx[w].u[l][i] = a[i];
  g_wx[w].u[l][4] = b[0];
  g_wx[w].u[l][5] = b[1];
  tl_warp_sync();
  const int g = l >> 2, t = l & 3;
  float out[4];
  for (int e = 0; e < 4; ++e) {
    const int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
    float acc = 0.f;
    for (int k = 0; k < 16; ++k) {
      const unsigned* al = g_wx[w].u[(row % 8) * 4 + (k % 8) / 2];
      const unsigned* bl = g_wx[w].u[col * 4 + (k % 8) / 2];
      acc += tl_half_of(al[(row >= 8) + 2 * (k >= 8)], k % 2) * tl_half_of(bl[4 + (k >= 8)], k % 2);
    }
    out[e] = d[e] + acc;
  }
  tl_warp_sync();
  for (int e = 0; e < 4; ++e) d[e] = out[e];
}
static inline float __shfl_xor_sync(unsigned, float v, int m) {
  const int w = tl_warp(), l = tl_lane();
  g_wx[w].f[l] = v;
  tl_warp_sync();
  const float r = g_wx[w].f[l ^ m];
  tl_warp_sync();
  return r;
}
"#;

struct Case {
    label: &'static str,
    p: FlashProblem,
    q: Params,
    /// Elements of Q, K, V, O and the mask buffers.
    lens: [usize; 5],
}

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

fn round(d: DType, x: f64) -> (u16, f64) {
    match d {
        DType::BF16 => {
            let h = bf16::from_f64(x);
            (h.to_bits(), h.to_f64())
        }
        _ => {
            let h = f16::from_f64(x);
            (h.to_bits(), h.to_f64())
        }
    }
}

fn from_bits(d: DType, b: u16) -> f64 {
    match d {
        DType::BF16 => bf16::from_bits(b).to_f64(),
        _ => f16::from_bits(b).to_f64(),
    }
}

fn write(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap();
}

/// The f64 reference: O (`[b][h][i][d]`) and the log-sum-exp per row.
fn reference(p: &FlashProblem, q: &[f64], k: &[f64], v: &[f64], mask: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let d = p.head_dim;
    let rep = p.heads_q / p.heads_kv;
    let mut out = vec![0.0; p.batch * p.heads_q * p.seq_q * d];
    let mut lse = vec![f64::NEG_INFINITY; p.batch * p.heads_q * p.seq_q];
    let off = p.causal_offset();
    for b in 0..p.batch {
        for h in 0..p.heads_q {
            let hk = h / rep;
            for i in 0..p.seq_q {
                let qr = p.q.at(b, h, i);
                let logits: Vec<f64> = (0..p.seq_k)
                    .map(|j| {
                        if p.causal.is_some() && j as i64 > i as i64 + off {
                            return f64::NEG_INFINITY;
                        }
                        let kr = p.k.at(b, hk, j);
                        let mut s = p.scale as f64 * (0..d).map(|x| q[qr + x] * k[kr + x]).sum::<f64>();
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
                if mx == f64::NEG_INFINITY {
                    continue;
                }
                let e: Vec<f64> = logits.iter().map(|&x| (x - mx).exp()).collect();
                let sum: f64 = e.iter().sum();
                lse[(b * p.heads_q + h) * p.seq_q + i] = mx + sum.ln();
                let o = ((b * p.heads_q + h) * p.seq_q + i) * d;
                for (j, w) in e.iter().enumerate() {
                    let vr = p.v.at(b, hk, j);
                    for x in 0..d {
                        out[o + x] += w / sum * v[vr + x];
                    }
                }
            }
        }
    }
    (out, lse)
}

fn run(cc: &str, dir: &Path, c: &Case) -> Result<(), String> {
    let p = &c.p;
    flash::applies(p, &c.q, (8, 0))?;
    let args = FlashArgs::dense(p.mask.is_some());
    let full = flash::render(p, &c.q, &args);
    let body = full.split(KERNEL_MARK).nth(1).ok_or("no kernel mark in the source")?;
    let decl = "extern __shared__ __align__(128) unsigned char tl_smem[];";
    if !body.contains(decl) {
        return Err("the shared memory declaration changed".into());
    }
    let body = body.replace(decl, "unsigned char* tl_smem = g_smem;");
    let name = flash::kernel_name(p, &c.q, &args);
    let cfg = flash::config(p, &c.q);
    let [lq, lk, lv, lo, lm] = c.lens;
    let mask_bytes = match p.mask.map(|m| m.kind) {
        Some(MaskKind::Bool) => 1,
        _ => 2,
    };
    let ptrs = if p.mask.is_some() { "q.data(), k.data(), v.data(), m.data(), o.data()" } else { "q.data(), k.data(), v.data(), o.data()" };
    let main = format!(
        r#"
static std::vector<unsigned char> load(const char* path, size_t n) {{
  std::vector<unsigned char> v(n + 64);
  FILE* f = fopen(path, "rb");
  if (!f || fread(v.data(), 1, n, f) != n) {{ fprintf(stderr, "read %s\n", path); exit(2); }}
  fclose(f);
  return v;
}}
int main(int argc, char** argv) {{
  auto q = load(argv[1], {lq} * 2), k = load(argv[2], {lk} * 2), v = load(argv[3], {lv} * 2), m = load(argv[4], {lm} * {mb});
  std::vector<unsigned char> o({lo} * 2 + 64, 0xff);
  std::vector<float> lse({lse_n} + 16, NAN);
  g_bufs = {{ {{q.data(), {lq} * 2}}, {{k.data(), {lk} * 2}}, {{v.data(), {lv} * 2}}, {{m.data(), {lm} * {mb}}} }};
  g_smem_len = {smem};
  gridDim = dim3{{{gx}, {gy}, {gz}}};
  for (unsigned z = 0; z < {gz}; ++z)
    for (unsigned y = 0; y < {gy}; ++y)
      for (unsigned x = 0; x < {gx}; ++x) {{
        blockIdx = dim3{{x, y, z}};
        memset(g_smem, 0xff, sizeof g_smem);
        std::barrier<> bar({threads});
        g_bar = &bar;
        std::vector<std::barrier<>*> wb;
        for (int w = 0; w < {warps}; ++w) {{ wb.push_back(new std::barrier<>(32)); g_wbar[w] = wb.back(); }}
        std::vector<std::thread> ts;
        for (unsigned t = 0; t < {threads}; ++t)
          ts.emplace_back([&, t] {{
            threadIdx = dim3{{t, 0, 0}};
            {name}({ptrs}, lse.data());
            if (!t_open.empty() || !t_groups.empty()) fail("copies never waited for", t_open.size(), t_groups.size());
          }});
        for (auto& t : ts) t.join();
        for (auto* b : wb) delete b;
      }}
  for (int i = 0; i < 64; ++i) if (o[{lo} * 2 + i] != 0xff) {{ fprintf(stderr, "store past the output\n"); return 5; }}
  FILE* f = fopen(argv[5], "wb");
  fwrite(o.data(), 1, {lo} * 2, f);
  fwrite(lse.data(), 4, {lse_n}, f);
  fclose(f);
  return 0;
}}
"#,
        mb = mask_bytes,
        lse_n = p.batch * p.heads_q * p.seq_q,
        smem = c.q.smem_bytes(p.head_dim),
        gx = cfg.grid.0,
        gy = cfg.grid.1,
        gz = cfg.grid.2,
        threads = c.q.threads(),
        warps = c.q.warps,
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
    // Inputs: values in [-1, 1) rounded to the dtype; scores of a few units.
    let mut s = 0x2545_f491_4f6c_dd1du64 ^ (c.label.len() as u64 * 0x9e37);
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    };
    let mut gen = |n: usize, scale: f64| -> (Vec<u8>, Vec<f64>) {
        let (mut bytes, mut vals) = (vec![], vec![]);
        for _ in 0..n {
            let (b, v) = round(p.dtype, next() * scale);
            bytes.extend(b.to_le_bytes());
            vals.push(v);
        }
        (bytes, vals)
    };
    let (qb, qv) = gen(lq, 2.0);
    let (kb, kv) = gen(lk, 2.0);
    let (vb, vv) = gen(lv, 1.0);
    let (mbytes, mvals) = match p.mask.map(|m| m.kind) {
        Some(MaskKind::Bool) => {
            // About one key in four masked, and query row 5 (every head, every batch) fully.
            let m = p.mask.unwrap();
            let mut vals = vec![0.0; lm];
            for (i, x) in vals.iter_mut().enumerate() {
                *x = if next() < -0.5 { 0.0 } else { 1.0 };
                let _ = i;
            }
            for b in 0..p.batch {
                for h in 0..p.heads_q {
                    for j in 0..m.len {
                        vals[b * m.strides[0] + h * m.strides[1] + 5 * m.strides[2] + j * m.strides[3]] = 0.0;
                    }
                }
            }
            (vals.iter().map(|&x| x as u8).collect(), vals)
        }
        Some(MaskKind::Additive) => {
            let mut bytes = vec![];
            let mut vals = vec![];
            for i in 0..lm {
                // A bias of a few units, some -inf.
                let x = if i % 7 == 3 { f64::NEG_INFINITY } else { next() * 3.0 };
                let (b, v) = round(p.dtype, x);
                bytes.extend(b.to_le_bytes());
                vals.push(v);
            }
            (bytes, vals)
        }
        None => (vec![0u8; 2], vec![]),
    };
    let f = |n: &str| dir.join(format!("{}.{n}", c.label));
    write(&f("q"), &qb);
    write(&f("k"), &kb);
    write(&f("v"), &vb);
    write(&f("m"), &mbytes);
    let run = Command::new(&exe).args([f("q"), f("k"), f("v"), f("m"), f("o")]).output().map_err(|e| e.to_string())?;
    if !run.status.success() {
        return Err(format!("run failed: {}", String::from_utf8_lossy(&run.stderr)));
    }
    let raw = std::fs::read(f("o")).map_err(|e| e.to_string())?;
    let (want, want_lse) = reference(p, &qv, &kv, &vv, &mvals);
    let tol = if p.dtype == DType::BF16 { 2e-2 } else { 4e-3 };
    let d = p.head_dim;
    let mut checked = 0;
    for b in 0..p.batch {
        for h in 0..p.heads_q {
            for i in 0..p.seq_q {
                for x in 0..d {
                    let at = p.o.at(b, h, i) + x;
                    let got = from_bits(p.dtype, u16::from_le_bytes([raw[2 * at], raw[2 * at + 1]]));
                    let w = want[((b * p.heads_q + h) * p.seq_q + i) * d + x];
                    if !((got - w).abs() <= tol * (1.0 + w.abs())) {
                        return Err(format!("O[b {b}][h {h}][row {i}][{x}] = {got}, expected {w}"));
                    }
                    checked += 1;
                }
                let li = (b * p.heads_q + h) * p.seq_q + i;
                let at = 2 * lo + 4 * li;
                let got = f32::from_le_bytes([raw[at], raw[at + 1], raw[at + 2], raw[at + 3]]) as f64;
                let w = want_lse[li];
                let ok = if w == f64::NEG_INFINITY { got == w } else { (got - w).abs() <= 1e-3 * (1.0 + w.abs()) };
                if !ok {
                    return Err(format!("lse[b {b}][h {h}][row {i}] = {got}, expected {w}"));
                }
            }
        }
    }
    eprintln!("{}: {checked} outputs within {tol}", c.label);
    Ok(())
}

fn case(label: &'static str, p: FlashProblem, q: Params) -> Case {
    let span = |s: Strides, heads: usize, seq: usize| (p.batch - 1) * s.batch + (heads - 1) * s.head + (seq - 1) * s.row + p.head_dim;
    let lm = p.mask.map_or(1, |m| {
        (p.batch - 1) * m.strides[0] + (p.heads_q - 1) * m.strides[1] + (p.seq_q - 1) * m.strides[2] + (m.len - 1) * m.strides[3] + 1
    });
    let lens = [
        span(p.q, p.heads_q, p.seq_q),
        span(p.k, p.heads_kv, p.seq_k),
        span(p.v, p.heads_kv, p.seq_k),
        span(p.o, p.heads_q, p.seq_q),
        lm,
    ];
    Case { label, p, q, lens }
}

fn cases() -> Vec<Case> {
    let w8 = Params::default();
    let w4 = Params { block_m: 64, warps: 4, ..w8 };
    let mut v = vec![];
    // Square, head dim 64, 8 warps, two key blocks.
    v.push(case("d64_bf16", FlashProblem::new(1, 2, 2, 128, 128, 64, DType::BF16), w8));
    // Head dim 128, ragged 77 queries x 131 keys, causal top-left, three stages, f16.
    let mut p = FlashProblem::new(1, 2, 2, 77, 131, 128, DType::F16);
    p.causal = Some(Causal::TopLeft);
    v.push(case("d128_f16_causal_ragged", p, Params { stages: 3, ..w4 }));
    // GQA 8/2, causal bottom-right (the last query sees every key), [batch, seq, heads * dim].
    let mut p = FlashProblem::new(2, 8, 2, 77, 131, 64, DType::BF16);
    p.causal = Some(Causal::BottomRight);
    p.q = Strides::bshd(8, 77, 64);
    p.o = Strides::bshd(8, 77, 64);
    p.k = Strides::bshd(2, 131, 64);
    p.v = Strides::bshd(2, 131, 64);
    v.push(case("d64_bf16_gqa_causal_br_bshd", p, w4));
    // More queries than keys, bottom-right: the first 60 rows see nothing (zeros).
    let mut p = FlashProblem::new(1, 1, 1, 100, 40, 64, DType::F16);
    p.causal = Some(Causal::BottomRight);
    v.push(case("d64_f16_causal_br_empty_rows", p, w8));
    // A bool mask [b, 1, sq, sk] broadcast over heads with a fully masked row, zero_nan_rows,
    // 128 keys per step, three stages.
    let mut p = FlashProblem::new(2, 2, 2, 70, 150, 64, DType::F16);
    p.mask = Some(Mask { kind: MaskKind::Bool, strides: [70 * 150, 0, 150, 1], len: 150 });
    p.zero_nan_rows = true;
    v.push(case("d64_f16_bool_mask", p, Params { block_n: 128, stages: 3, ..w4 }));
    // An additive mask [sq, 120] shorter than the 131 keys (the rest masked), head dim 128,
    // Q and O as [batch, seq, heads * dim], MQA.
    let mut p = FlashProblem::new(1, 3, 1, 33, 131, 128, DType::BF16);
    p.mask = Some(Mask { kind: MaskKind::Additive, strides: [0, 0, 120, 1], len: 120 });
    p.q = Strides::bshd(3, 33, 128);
    p.o = Strides::bshd(3, 33, 128);
    p.scale = 0.1;
    v.push(case("d128_bf16_additive_mqa_bshd", p, w4));
    // One query (decode) against 200 keys.
    v.push(case("d64_bf16_one_query", FlashProblem::new(1, 2, 1, 1, 200, 64, DType::BF16), w4));
    v
}

#[test]
fn rendered_flash_kernels_match_an_f64_reference_under_emulation() {
    let Some(cc) = compiler() else {
        eprintln!("note: no C++ compiler; the FlashAttention kernels were not emulated");
        return;
    };
    let dir: PathBuf = std::env::temp_dir().join(format!("tilec-flash-emu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let only = std::env::var("FLASH_EMU_ONLY").unwrap_or_default();
    let mut failed = vec![];
    for c in cases().iter().filter(|c| c.label.contains(only.as_str())) {
        match run(&cc, &dir, c) {
            Ok(()) => {}
            Err(e) => failed.push(format!("{}: {e}", c.label)),
        }
    }
    if failed.is_empty() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    assert!(failed.is_empty(), "{failed:#?} (sources in {})", dir.display());
}

/// The Hopper variant (`flash::sm90`, wgmma) is not emulated; its sources are compiled for
/// sm_90a with NVRTC (skipped without the library), every feature the sm80 kernel has:
/// both head dims and dtypes, causal alignments, masks, GQA, each parameter set in range.
#[test]
fn sm90_variants_compile_with_nvrtc() {
    let Ok(nv) = tilec_cuda::Nvrtc::load() else {
        eprintln!("note: sm90_variants_compile_with_nvrtc skipped: no NVRTC (set TILEC_NVRTC_LIB)");
        return;
    };
    let c = tilec_cuda::Compiler::new(nv, "sm_90a").with_cache_dir(None);
    let mut modules = vec![];
    for dt in [DType::BF16, DType::F16] {
        for d in [64, 128] {
            let mut variants = vec![FlashProblem::new(2, 8, 2, 77, 131, d, dt)];
            let mut causal = FlashProblem::new(2, 3, 3, 300, 300, d, dt);
            causal.causal = Some(Causal::BottomRight);
            variants.push(causal);
            let mut masked = FlashProblem::new(2, 2, 2, 70, 150, d, dt);
            masked.mask = Some(Mask { kind: MaskKind::Additive, strides: [70 * 150, 0, 150, 1], len: 150 });
            masked.zero_nan_rows = true;
            variants.push(masked);
            for p in variants {
                for (block_m, block_n, stages) in [(128, 128, 2), (64, 128, 3), (128, 64, 4), (64, 64, 2)] {
                    let q = Params { block_m, block_n, warps: 4 * (1 + block_m / 64), stages, wgmma: true };
                    if q.validate(d).is_err() {
                        continue;
                    }
                    let a = FlashArgs::dense(p.mask.is_some());
                    modules.push((flash::kernel_name(&p, &q, &a), flash::render(&p, &q, &a)));
                }
            }
        }
    }
    assert!(modules.len() >= 40, "{}", modules.len());
    for (r, (name, _)) in c.compile_many(&modules).into_iter().zip(&modules) {
        let img = r.unwrap_or_else(|e| panic!("{name}: {e}")).image;
        assert!(img.starts_with(b"\x7fELF"), "{name}");
    }
}
