//! The SIMT f32 GEMM's rendered CUDA source run on the CPU: the kernel body compiled with the
//! system C++ compiler under a small emulation of CUDA (one OS thread per CUDA thread, a
//! `std::barrier` for `__syncthreads`, static storage for `__shared__`, blocks one after
//! another), so that every index of the copies, fragments, split-K fix-up and epilogue band is
//! checked without a GPU. Outputs are poisoned with NaN first and compared with an f64
//! reference. Skips (passes, saying so) when no C++20 compiler is found.

use std::path::{Path, PathBuf};
use std::process::Command;

use tilec_cuda::families::OperandRef;
use tilec_cuda::gemm::{BatchSplit, CustomEpilogue, Layout, Problem};
use tilec_cuda::simt::{self, Params};
use tilec_cuda::PRELUDE;
use tilec_ir::DType;

const EMU: &str = r#"
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>
struct dim3 { unsigned x, y, z; };
thread_local dim3 threadIdx;
static dim3 blockIdx;
static std::barrier<>* g_bar;
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __restrict__ __restrict
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) float2 { float x, y; };
static inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
static inline float2 make_float2(float a, float b) { return {a, b}; }
template <class T> static inline T __ldg(const T* p) { return *p; }
static inline float __ldcg(const float* p) { return *(volatile const float*)p; }
static inline void __stcg(float* p, float v) { *(volatile float*)p = v; }
static inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
static inline void __syncthreads() { g_bar->arrive_and_wait(); }
static inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
static inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
"#;

struct Case {
    label: &'static str,
    p: Problem,
    q: Params,
    a: OperandRef,
    b: OperandRef,
    /// Floats of the A and B buffers.
    len_a: usize,
    len_b: usize,
}

fn compiler() -> Option<String> {
    for cc in [std::env::var("CXX").unwrap_or_default(), "g++".into(), "clang++".into(), "c++".into()] {
        if cc.is_empty() {
            continue;
        }
        let ok = Command::new(&cc).arg("--version").output().is_ok_and(|o| o.status.success());
        if ok {
            return Some(cc);
        }
    }
    None
}

/// Element (batch, i, k) of A and (batch, k, j) of B: their offsets in floats.
fn a_at(c: &Case, bz: usize, i: usize, k: usize) -> usize {
    let p = &c.p;
    let mut off = c.a.offset_bytes as usize / 4 + bz * p.batch_stride_a;
    if let Some(s) = p.batch_split {
        off += (bz / s.div) * s.a.0 + (bz % s.div) * s.a.1;
    }
    off + match (p.a_layout, p.a_split) {
        (Layout::RowMajor, Some(sp)) => (i / sp.rows) * sp.group_stride + (k / 64) * sp.head_stride + (i % sp.rows) * p.lda() + k % 64,
        (Layout::RowMajor, None) => i * p.lda() + k,
        (Layout::ColMajor, _) => k * p.lda() + i,
    }
}

fn b_at(c: &Case, bz: usize, k: usize, j: usize) -> usize {
    let p = &c.p;
    let mut off = c.b.offset_bytes as usize / 4 + bz * p.batch_stride_b;
    if let Some(s) = p.batch_split {
        off += (bz / s.div) * s.b.0 + (bz % s.div) * s.b.1;
    }
    off + match p.b_layout {
        Layout::RowMajor => k * p.ldb() + j,
        Layout::ColMajor => j * p.ldb() + k,
    }
}

fn write_f32(path: &Path, v: &[f32]) {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    std::fs::write(path, bytes).unwrap();
}

/// Builds, runs and checks one case; `Err` describes a mismatch.
fn run(cc: &str, dir: &Path, c: &Case) -> Result<(), String> {
    let p = &c.p;
    simt::applies(p, &c.q, (9, 0))?;
    let full = simt::render(p, &c.q, &c.a, &c.b);
    let body = full.strip_prefix(PRELUDE).ok_or("the source does not start with the prelude")?;
    let name = simt::kernel_name(p, &c.q, &c.a, &c.b);
    let cfg = simt::launch_config(p, &c.q);
    let tiles = simt::tiles(p, &c.q);
    let (rows, total) = (p.m, p.batch * p.m * p.n);
    let main = format!(
        r#"
static std::vector<float> load(const char* path, size_t n) {{
  std::vector<float> v(n);
  FILE* f = fopen(path, "rb");
  if (!f || fread(v.data(), 4, n, f) != n) {{ fprintf(stderr, "read %s\n", path); exit(2); }}
  fclose(f);
  return v;
}}
int main(int argc, char** argv) {{
  std::vector<float> a = load(argv[1], {la}), b = load(argv[2], {lb}), c({total}, NAN);
  std::vector<float> ws({ws} + 1, NAN);
  std::vector<int> cnt({tiles}, 0);
  for (int launch = 0; launch < 2; ++launch)
    for (unsigned z = 0; z < {gz}; ++z)
      for (unsigned x = 0; x < {gx}; ++x) {{
        blockIdx = dim3{{x, 0, z}};
        std::barrier<> bar(256);
        g_bar = &bar;
        std::vector<std::thread> ts;
        for (unsigned t = 0; t < 256; ++t)
          ts.emplace_back([&, t] {{ threadIdx = dim3{{t, 0, 0}}; {name}(a.data(), b.data(), c.data(), ws.data(), cnt.data()); }});
        for (auto& t : ts) t.join();
      }}
  for (int i = 0; i < {tiles}; ++i) if (cnt[i] != 0) {{ fprintf(stderr, "counter %d left at %d\n", i, cnt[i]); return 3; }}
  FILE* f = fopen(argv[3], "wb");
  fwrite(c.data(), 4, c.size(), f);
  fclose(f);
  return 0;
}}
"#,
        la = c.len_a,
        lb = c.len_b,
        ws = tiles * c.q.split_k * c.q.tile_m * c.q.tile_n,
        gx = cfg.grid.0,
        gz = cfg.grid.2,
    );
    let src = dir.join(format!("{}.cpp", c.label));
    std::fs::write(&src, format!("{EMU}\n{body}\n{main}")).unwrap();
    let exe = dir.join(c.label);
    let out = Command::new(cc)
        .args(["-std=c++20", "-O1", "-pthread", "-w", "-ffp-contract=off", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!("compile failed:\n{}", String::from_utf8_lossy(&out.stderr).chars().take(3000).collect::<String>()));
    }
    // Values on a grid of 1/64 in [-1, 1): products and sums of a few hundred are exact in f32
    // up to the order of the sums, so the tolerance below is loose.
    let mut s = 0x2545_f491_4f6c_dd1du64 ^ c.label.len() as u64;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ((s >> 20) % 128) as f32 / 64.0 - 1.0
    };
    let va: Vec<f32> = (0..c.len_a).map(|_| next()).collect();
    let vb: Vec<f32> = (0..c.len_b).map(|_| next()).collect();
    let (fa, fb, fc) = (dir.join(format!("{}.a", c.label)), dir.join(format!("{}.b", c.label)), dir.join(format!("{}.c", c.label)));
    write_f32(&fa, &va);
    write_f32(&fb, &vb);
    let out = Command::new(&exe).arg(&fa).arg(&fb).arg(&fc).output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!("run failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let raw = std::fs::read(&fc).map_err(|e| e.to_string())?;
    let got: Vec<f32> = raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    if got.len() != total {
        return Err(format!("{} outputs, expected {total}", got.len()));
    }
    // The epilogue stores C densely as [batch][m][n] (a flattened problem: [m][n]).
    let _ = rows;
    for bz in 0..p.batch {
        for i in 0..p.m {
            for j in 0..p.n {
                let want: f64 = (0..p.k).map(|k| va[a_at(c, bz, i, k)] as f64 * vb[b_at(c, bz, k, j)] as f64).sum();
                let g = got[(bz * p.m + i) * p.n + j] as f64;
                if !(g - want).abs().le(&(1e-5 * (1.0 + want.abs()))) {
                    return Err(format!("C[{bz}][{i}][{j}] = {g}, expected {want}"));
                }
            }
        }
    }
    Ok(())
}

fn epilogue(p: &mut Problem, flatten: Option<usize>) {
    let params = vec!["const float* __restrict__ a".to_string(), "const float* __restrict__ b".into(), "float* __restrict__ c".into()];
    let index = match flatten {
        Some(r) => format!("(tl_b * {r} + tl_i) * {n} + tl_j", n = p.n),
        None => format!("(tl_b * {} + tl_i) * {} + tl_j", p.m, p.n),
    };
    let source = format!(
        "static __device__ __forceinline__ void tl_epi({}, long long tl_b, long long tl_i, long long tl_j, float tl_acc) {{ c[{index}] = tl_acc; }}\n",
        params.join(", ")
    );
    p.custom = Some(CustomEpilogue { loads: false, name: "tl_epi".into(), source, params, rows: flatten, rounds_to: None, vector: None });
}

const A0: OperandRef = OperandRef { param: 0, offset_bytes: 0 };
const B0: OperandRef = OperandRef { param: 1, offset_bytes: 0 };

/// A dense-ish problem with leading dimensions `lda`, `ldb` (batch strides dense over them).
fn case(label: &'static str, (m, n, k, batch): (usize, usize, usize, usize), (la, lb): (Layout, Layout), (lda, ldb): (usize, usize), q: Params) -> Case {
    let mut p = Problem::new(m, n, k, DType::F32).with_layouts(la, lb);
    p.lda = Some(lda);
    p.ldb = Some(ldb);
    p.batch = batch;
    p.batch_stride_a = lda * if la == Layout::RowMajor { m } else { k };
    p.batch_stride_b = ldb * if lb == Layout::RowMajor { k } else { n };
    epilogue(&mut p, None);
    let (len_a, len_b) = (batch * p.batch_stride_a, batch * p.batch_stride_b);
    Case { label, p, q, a: A0, b: B0, len_a, len_b }
}

fn cases() -> Vec<Case> {
    use Layout::{ColMajor as C, RowMajor as R};
    let big = Params::default();
    let small = Params { tile_m: 32, tile_n: 64, tile_k: 16, split_k: 1, min_blocks: 2 };
    let mut v = vec![
        // Ragged, 16-byte aligned leading dimensions (float4 reads with scalar edges).
        case("rr", (291, 203, 130, 1), (R, R), (132, 204), big),
        case("rc", (291, 203, 130, 1), (R, C), (132, 132), big),
        case("cr", (291, 203, 130, 1), (C, R), (292, 204), Params { tile_k: 16, ..big }),
        case("cc", (291, 203, 130, 1), (C, C), (292, 132), Params { tile_m: 64, tile_n: 32, tile_k: 8, split_k: 1, min_blocks: 2 }),
        // Dense odd leading dimensions: scalar reads.
        case("rr_odd", (133, 97, 75, 1), (R, R), (75, 97), small),
        case("cc_odd", (133, 97, 75, 1), (C, C), (133, 75), Params { tile_m: 128, tile_n: 32, ..small }),
        // Split K (ragged last slice, an empty split: 9 slices over 4 splits of 3).
        case("split_rc", (70, 90, 140, 1), (R, C), (140, 140), Params { tile_m: 64, tile_n: 64, tile_k: 16, split_k: 4, min_blocks: 2 }),
        case("split_m1", (1, 100, 300, 1), (R, R), (300, 100), Params { tile_m: 32, tile_n: 32, tile_k: 8, split_k: 5, min_blocks: 2 }),
        case("batched", (40, 36, 20, 3), (R, C), (20, 20), small),
    ];
    // A broadcast B (batch stride 0).
    let mut shared = case("shared_b", (33, 65, 48, 3), (C, R), (36, 68), small);
    shared.p.batch_stride_b = 0;
    shared.len_b = 48 * 68;
    v.push(shared);
    // Flattened rows: 3 batches of 30 rows against one B, the epilogue splitting the row.
    let mut flat = case("flattened", (90, 40, 24, 1), (R, R), (24, 40), small);
    epilogue(&mut flat.p, Some(30));
    v.push(flat);
    // Batches split in two (2 x 3 heads of [seq 20][heads * 16] tensors), A offset by 4 floats.
    let mut heads = case("heads", (20, 20, 16, 6), (R, C), (48, 48), small);
    heads.p.batch_stride_a = 0;
    heads.p.batch_stride_b = 0;
    heads.p.batch_split = Some(BatchSplit { div: 3, a: (20 * 48, 16), b: (20 * 48, 16) });
    heads.a = OperandRef { param: 0, offset_bytes: 16 };
    heads.len_a = 2 * 20 * 48 + 4;
    heads.len_b = 2 * 20 * 48;
    v.push(heads);
    // A split A: [2 groups][3 heads][rows 10][64] read as [20 rows][192], misaligned by 1 float.
    let mut split_a = case("a_split", (20, 24, 192, 1), (R, R), (64, 24), Params { tile_m: 32, tile_n: 32, tile_k: 8, split_k: 1, min_blocks: 2 });
    split_a.p.a_split = Some(tilec_cuda::gemm::ASplit { rows: 10, head_stride: 640, group_stride: 1920 });
    split_a.a = OperandRef { param: 0, offset_bytes: 4 };
    split_a.len_a = 2 * 1920 + 1;
    v.push(split_a);
    v
}

#[test]
fn rendered_kernels_compute_the_product_under_emulation() {
    let Some(cc) = compiler() else {
        eprintln!("note: no C++ compiler; the SIMT f32 kernels were not emulated");
        return;
    };
    let dir: PathBuf = std::env::temp_dir().join(format!("tilec-simt-emu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let only = std::env::var("SIMT_EMU_ONLY").unwrap_or_default();
    let mut failed = vec![];
    for c in cases().iter().filter(|c| c.label.contains(only.as_str())) {
        match run(&cc, &dir, c) {
            Ok(()) => eprintln!("{}: ok", c.label),
            Err(e) => failed.push(format!("{}: {e}", c.label)),
        }
    }
    if failed.is_empty() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    assert!(failed.is_empty(), "{failed:#?} (sources in {})", dir.display());
}
