//! Tensor-core GEMM on Hopper (sm_90a): a kernel family rendered as CUDA C++ for given
//! parameters, compiled with NVRTC and launched through the driver.
//!
//! `C[b] = act(scale_a · scale_b · A[b] · B[b] + bias)` for bf16, f16, fp8 (e4m3, e5m2) or
//! tf32 inputs with f32 accumulation, written as bf16, f16 or f32. Shared memory is laid out in
//! bytes: a stage holds 128 bytes of K per row (64 16-bit, 128 fp8 or 32 tf32 elements), one
//! 128-byte swizzle row, so the copies and descriptors are the same for every input type. The kernel is warp-specialized and persistent: one producer
//! warpgroup streams K-slices of A and B into a ring of shared-memory stages with the bulk
//! tensor copy engine (TMA, 128-byte swizzle, completion on mbarriers), and one or two consumer
//! warpgroups multiply them with `wgmma.mma_async` from shared-memory descriptors, then apply
//! the epilogue from registers. Tiles are visited in groups of rows (L2-friendly order) by a
//! grid of one block per SM.
//!
//! - [`Problem`]: shapes, dtypes, operand layouts, batch strides and the epilogue.
//! - [`Params`]: tile shape, pipeline depth, consumer warpgroups, tile order.
//! - [`applies`] says whether a pair can run (and why not); [`heuristic`] picks parameters;
//!   [`render`] gives the CUDA source; [`GemmKernel`] compiles, loads and launches it.
//!
//! Shapes (M, N, K, batch) are run-time arguments: one compiled kernel serves every shape with
//! the same dtypes, layouts, epilogue and parameters ([`kernel_name`] is that key).

pub mod host;
mod launch;
pub(crate) mod render;
pub(crate) mod shuffle;
pub mod stream_k;

pub use launch::{GemmArgs, GemmKernel};
pub use render::{kernel_name, render};

use tilec_ir::DType;

/// How a matrix is stored: row-major (rows contiguous) or column-major.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    RowMajor,
    ColMajor,
}

/// The activation applied in the epilogue, after the bias.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Activation {
    None,
    Relu,
    /// The exact (erf) GELU, `x * Phi(x)`.
    Gelu,
}

/// What happens to the f32 accumulators before they are stored: `act(acc + bias[n])`, then a
/// cast to the output dtype.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Epilogue {
    /// A bias vector over N of this dtype (f32, bf16 or f16), shared by all rows and batches.
    pub bias: Option<DType>,
    pub activation: Activation,
}

impl Epilogue {
    pub const NONE: Epilogue = Epilogue {
        bias: None,
        activation: Activation::None,
    };
}

/// A row-major A stored with its rows and its K split: element (i, k) at
/// `(i / rows) * group_stride + (k / 64) * head_stride + (i % rows) * lda + k % 64` (elements).
/// This is attention's output `[batch, heads, seq, 64]` read as the `[batch * seq, heads * 64]`
/// matrix of the output projection, without a transposing copy: TMA reads it through a 4-D
/// tensor map, one 64-wide K slice (one head) at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ASplit {
    pub rows: usize,
    pub head_stride: usize,
    pub group_stride: usize,
}

/// Batches split in two with their own strides: batch `b` of A starts at
/// `b * batch_stride_a + (b / div) * a.0 + (b % div) * a.1` (elements), and likewise for B.
/// This is attention's (batch, head) read from `[batch, seq, heads * dim]` tensors, where a
/// head is not a fixed stride from the previous batch's last head.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BatchSplit {
    pub div: usize,
    pub a: (usize, usize),
    pub b: (usize, usize),
}

/// An epilogue given as code: a `__device__` function (see
/// [`render_gemm_epilogue_fn`](crate::render::render_gemm_epilogue_fn)) called once per
/// element of C with its batch, row, column and f32 accumulator, after the kernel's own
/// pointer parameters. It replaces the built-in store: the function writes the outputs itself
/// (any dtype, any index), so `C`, the bias and the activation are unused.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CustomEpilogue {
    /// The function's name.
    pub name: String,
    /// Its definition (without the prelude).
    pub source: String,
    /// The extra kernel parameters passed through to it, in order: C type text, e.g.
    /// `const tl_f16* __restrict__ b1_bias`.
    pub params: Vec<String>,
    /// Whether the function expects a flattened row (`row = b * rows + i`, batch 0): it then
    /// splits the row itself.
    pub rows: Option<usize>,
    /// The dtype the function rounds its accumulator to before anything else (a 16-bit
    /// product's own dtype: the graph's MatMul output), where every use of the accumulator is
    /// that rounding. A template may then hand it the value already rounded (the staged
    /// epilogue parks it in 16 bits: [`park_dtype`]) without changing any result.
    pub rounds_to: Option<DType>,
    /// A second function of the source over [`EPILOGUE_VEC`](crate::render::EPILOGUE_VEC)
    /// adjacent columns (see
    /// [`render_gemm_epilogue_vec_fn`](crate::render::render_gemm_epilogue_vec_fn)), taking
    /// the column group `jv` and a pointer to its accumulators: the templates call it for whole
    /// groups inside N.
    pub vector: Option<String>,
    /// Whether the function reads tensors besides the accumulator (a bias, a residual): its
    /// loads then weigh on the tile's epilogue, which [`heuristic`] spreads over both consumer
    /// warpgroups rather than leaving to one in ping-pong.
    pub loads: bool,
}

impl CustomEpilogue {
    /// A short stable hash of the source and parameters (part of the kernel name).
    pub fn key(&self) -> u64 {
        // FNV-1a: stable across runs and builds, unlike the std hasher.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let rows = self.rows.map(|r| r.to_string()).unwrap_or_default();
        // The vector function's name only when there is one (keys of epilogues without one
        // are as before it existed).
        for part in [self.name.as_str(), self.source.as_str(), rows.as_str()].into_iter().chain(self.vector.as_deref())
            .into_iter()
            .chain(self.params.iter().map(String::as_str))
        {
            for byte in part.bytes().chain([0u8]) {
                h ^= u64::from(byte);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
        }
        h
    }
}

/// A channels-last 2-D convolution read as the A operand: input `[N][H][W][C]`, weights
/// `[O][C][KH][KW]`, output pixels `OH x OW` per image (one group).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ConvGeom {
    pub n: usize,
    pub h: usize,
    pub w: usize,
    pub c: usize,
    pub kh: usize,
    pub kw: usize,
    pub oh: usize,
    pub ow: usize,
    pub stride: (usize, usize),
    pub pad: (usize, usize),
    pub dil: (usize, usize),
    /// The input is stored `[N][C][H][W]` (a transpose to channels-last fused into the
    /// convolution's kernel, as at a model's first layer).
    pub nchw_input: bool,
}

impl ConvGeom {
    /// The GEMM's depth: taps times channels.
    pub fn k(&self) -> usize {
        self.kh * self.kw * self.c
    }
    /// Row length of the repacked weights (K padded to 16 bytes).
    pub fn k_padded(&self) -> usize {
        self.k().next_multiple_of(8)
    }
    /// Whether 16-byte slices of a pixel's channels can be copied whole.
    pub fn vector(&self) -> bool {
        self.c % 8 == 0 && !self.nchw_input
    }
    /// Whether, short of [`vector`](Self::vector), a pixel's channels come in whole 8-byte
    /// groups of four (a thin input padded to four channels, as an image's first convolution
    /// gets on GPUs).
    pub fn half_vector(&self) -> bool {
        !self.vector() && self.c % 4 == 0 && !self.nchw_input
    }
    /// A 1x1 convolution of stride 1 without padding over a channels-last input: the input is
    /// already the product's A (`[N*H*W][C]`, row-major) and the weights `[O][C][1][1]` its
    /// column-major B, so it is a plain GEMM of its buffers (no im2col, no repacking).
    pub fn pointwise(&self) -> bool {
        self.kh == 1 && self.kw == 1 && self.stride == (1, 1) && self.pad == (0, 0) && !self.nchw_input
    }
    /// Element strides of the input along (H, W, C).
    pub fn input_strides(&self) -> (usize, usize, usize) {
        if self.nchw_input {
            (self.w, 1, self.h * self.w)
        } else {
            (self.w * self.c, self.c, 1)
        }
    }
}

/// The kernel `{name}_repack` that turns a convolution's weights `[O][C][KH][KW]` (16-bit)
/// into K-contiguous rows `[O][KH][KW][C]`, each padded with zeros to
/// [`ConvGeom::k_padded`]: one thread per output element, `o` output channels.
pub fn render_repack(name: &str, cv: &ConvGeom, o: usize) -> String {
    format!(
        r#"
// Weights [O][C][KH*KW] to K-contiguous rows [O][KH*KW][C], each padded with zeros to {kp}.
extern "C" __global__ void {name}_repack(const unsigned short* __restrict__ w, unsigned short* __restrict__ out) {{
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= {total}LL) return;
  const int o = (int)(i / {kp}), k = (int)(i % {kp});
  unsigned short v = 0;
  if (k < {k}) {{
    const int tap = k / {c}, ch = k % {c};
    v = w[((long long)o * {c} + ch) * {taps} + tap];
  }}
  out[i] = v;
}}
"#,
        kp = cv.k_padded(),
        total = o * cv.k_padded(),
        k = cv.k(),
        c = cv.c,
        taps = cv.kh * cv.kw,
    )
}

/// Bytes of K a pipeline stage holds per row of A or B: one 128-byte swizzle row.
pub const K_BYTES: usize = 128;

/// One GEMM: `C[b] (M x N) = A[b] (M x K) · B[b] (K x N)` for `b < batch`.
///
/// Leading dimensions are in elements (`None`: dense); batch strides are in elements, 0 meaning
/// that every batch reads the same matrix (a broadcast operand).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Problem {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: usize,
    /// Element type of A (and of B unless `b_dtype` says otherwise): bf16, f16, fp8 (e4m3,
    /// e5m2), or f32 with `tf32`.
    pub in_dtype: DType,
    /// B's element type where it differs from A's: fp8 only (e4m3 with e5m2).
    pub b_dtype: Option<DType>,
    /// f32 operands multiplied as tf32 (the tensor cores drop the low 13 mantissa bits): the
    /// caller's consent, without which f32 operands are refused.
    pub tf32: bool,
    /// Per-tensor scales: one f32 each in device memory (a kernel parameter each, passed at
    /// launch), multiplied into the accumulators before the bias and activation, as
    /// `torch._scaled_mm` does.
    pub scale_a: bool,
    pub scale_b: bool,
    /// Element type of C: bf16, f16 or f32.
    pub out_dtype: DType,
    pub a_layout: Layout,
    pub b_layout: Layout,
    pub lda: Option<usize>,
    pub ldb: Option<usize>,
    pub ldc: Option<usize>,
    pub batch_stride_a: usize,
    pub batch_stride_b: usize,
    pub batch_stride_c: usize,
    pub epilogue: Epilogue,
    /// An epilogue given as code (replacing `epilogue` and the store of C).
    pub custom: Option<CustomEpilogue>,
    /// A split row-major A (see [`ASplit`]).
    pub a_split: Option<ASplit>,
    /// Batches split in two (see [`BatchSplit`]).
    pub batch_split: Option<BatchSplit>,
    /// A is the implicit im2col of this convolution's channels-last input (then `m` is
    /// `n * oh * ow`, `k` the taps times channels, and B the weights repacked at bind into
    /// K-contiguous rows `[O][KH][KW][C]`).
    pub conv: Option<ConvGeom>,
}

impl Problem {
    /// A dense, unbatched problem: row-major A, B and C of one dtype (C bf16 for fp8 inputs),
    /// no epilogue.
    pub fn new(m: usize, n: usize, k: usize, dtype: DType) -> Problem {
        Problem {
            m,
            n,
            k,
            batch: 1,
            in_dtype: dtype,
            b_dtype: None,
            tf32: false,
            scale_a: false,
            scale_b: false,
            out_dtype: match dtype {
                DType::F8E4M3 | DType::F8E5M2 => DType::BF16,
                d => d,
            },
            a_layout: Layout::RowMajor,
            b_layout: Layout::RowMajor,
            lda: None,
            ldb: None,
            ldc: None,
            batch_stride_a: m * k,
            batch_stride_b: k * n,
            batch_stride_c: m * n,
            epilogue: Epilogue::NONE,
            custom: None,
            a_split: None,
            batch_split: None,
            conv: None,
        }
    }

    /// A channels-last convolution with `o` output channels as a GEMM over `dtype` (C f32,
    /// for a custom epilogue to store): `M = N*OH*OW` pixels, `N = o`, `K` taps times channels.
    /// A pointwise one ([`ConvGeom::pointwise`]) is a plain product of its buffers; any other
    /// reads A through an implicit im2col and B as the weights repacked at bind.
    pub fn for_conv(g: ConvGeom, o: usize, dtype: DType) -> Problem {
        let mut p = Problem::new(g.n * g.oh * g.ow, o, g.k(), dtype).with_layouts(Layout::RowMajor, Layout::ColMajor);
        p.out_dtype = DType::F32;
        p.lda = Some(g.c);
        p.batch_stride_a = 0;
        p.batch_stride_b = 0;
        if g.pointwise() {
            p.ldb = Some(g.c);
        } else {
            p.ldb = Some(g.k_padded());
            p.conv = Some(g);
        }
        p
    }

    /// The same problem with other operand layouts (dense leading dimensions).
    pub fn with_layouts(mut self, a: Layout, b: Layout) -> Problem {
        self.a_layout = a;
        self.b_layout = b;
        self
    }

    /// B's element type.
    pub fn b_dtype(&self) -> DType {
        self.b_dtype.unwrap_or(self.in_dtype)
    }

    /// Bytes of one operand element (A and B have the same size).
    pub fn elem_bytes(&self) -> usize {
        self.in_dtype.size_bytes()
    }

    /// K per pipeline stage, in elements: one 128-byte swizzle row.
    pub fn tile_k(&self) -> usize {
        K_BYTES / self.elem_bytes().max(1)
    }

    /// K of one wgmma instruction: 32 bytes of K (16 16-bit, 32 fp8 or 8 tf32 elements).
    pub fn mma_k(&self) -> usize {
        32 / self.elem_bytes().max(1)
    }

    /// A stored row-major B (K x N) is contiguous along N; column-major along K.
    pub fn lda(&self) -> usize {
        self.lda.unwrap_or(match self.a_layout {
            Layout::RowMajor => self.k,
            Layout::ColMajor => self.m,
        })
    }
    pub fn ldb(&self) -> usize {
        self.ldb.unwrap_or(match self.b_layout {
            Layout::RowMajor => self.n,
            Layout::ColMajor => self.k,
        })
    }
    pub fn ldc(&self) -> usize {
        self.ldc.unwrap_or(self.n)
    }

    /// Floating-point operations (2 per multiply-add).
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64 * self.batch as f64
    }

    /// Elements each operand spans in memory: (A, B, C).
    pub fn extents(&self) -> (usize, usize, usize) {
        let span = |ld: usize, outer: usize, inner: usize, bs: usize| {
            if outer == 0 || inner == 0 {
                return 0;
            }
            (self.batch - 1) * bs + (outer - 1) * ld + inner
        };
        let (ao, ai) = match self.a_layout {
            Layout::RowMajor => (self.m, self.k),
            Layout::ColMajor => (self.k, self.m),
        };
        let (bo, bi) = match self.b_layout {
            Layout::RowMajor => (self.k, self.n),
            Layout::ColMajor => (self.n, self.k),
        };
        (
            span(self.lda(), ao, ai, self.batch_stride_a),
            span(self.ldb(), bo, bi, self.batch_stride_b),
            span(self.ldc(), self.m, self.n, self.batch_stride_c),
        )
    }
}

/// Parameters of the kernel family.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Params {
    /// Rows of C per block: 64 or 128 per consumer warpgroup.
    pub tile_m: usize,
    /// Columns of C per block: a multiple of 64 up to 256 (the wgmma N).
    pub tile_n: usize,
    /// K per pipeline stage, in elements: one 128-byte swizzle row ([`Problem::tile_k`]: 64 for
    /// 16-bit inputs, 128 for fp8, 32 for tf32).
    pub tile_k: usize,
    /// Shared-memory stages in the ring.
    pub stages: usize,
    /// Consumer warpgroups (1 or 2); the producer is one more.
    pub consumers: usize,
    /// Blocks per cluster along M (1 or 2). The blocks of a cluster compute vertically adjacent
    /// tiles and share B: each block copies its part of B to all of them (TMA multicast).
    pub cluster_m: usize,
    /// Tile rows per group of the L2-friendly order (tiles run down a group's rows first).
    pub group_m: usize,
    /// Shared-memory swizzle span in bytes (128: the only one implemented).
    pub swizzle: usize,
    /// Registers per thread after reallocation: (producer, consumers).
    pub regs: (u32, u32),
    /// The epilogue reads each warp's accumulators back from shared memory, 16 rows by 32
    /// columns at a time, so that a warp's lanes take adjacent columns of one row (whole-sector
    /// loads and stores, in the epilogue function or the built-in store). Takes
    /// [`STAGING_BYTES`] of shared memory beside the ring.
    pub staged: bool,
    /// Ping-pong: each of the two consumer warpgroups owns whole tiles (every other one of the
    /// block's sequence), so one's epilogue overlaps the other's products; otherwise they
    /// share each tile, `tile_m / consumers` rows each.
    pub pingpong: bool,
    /// The staged epilogue parks the accumulators in 16 bits where that changes no result
    /// ([`park_dtype`]); `false` keeps them f32 (for comparisons).
    pub park16: bool,
    /// The epilogue regroups each quad's accumulators with warp shuffles, so that a lane holds
    /// [`EPILOGUE_VEC`](crate::render::EPILOGUE_VEC) adjacent columns of one row, and stores
    /// them from registers (16-byte stores, a quad covering 64 contiguous bytes of a row for
    /// 16-bit outputs): no shared memory and no warp barrier. Where it applies
    /// ([`shuffle_applies`]) it takes the place of `staged`.
    pub shuffle: bool,
    /// Stream-K: the last waves' tiles are split by K-blocks evenly over the persistent grid
    /// (the tiles before them run whole), so that a tile count that leaves part of the last
    /// wave idle keeps every SM busy. The block holding a split tile's first K-blocks adds the
    /// partial sums the later blocks park in a workspace, then runs the epilogue (see
    /// [`stream_k`] for the decomposition). Not with ping-pong or clusters.
    pub stream_k: bool,
    /// With the shuffled built-in epilogue of 16-bit results, C's rows not 16-byte aligned (an
    /// odd N: GPT-2's LM head over 50257 ids): each warp parks 8 rows of its tile at a time in
    /// shared memory ([`Params::rowstore_bytes`] beside the ring) and stores each row as one
    /// instruction of realigned 16-byte vectors and one of the few elements at its two ends.
    pub rowstore: bool,
}

/// Whether the shuffled epilogue can run a problem's epilogue: the built-in one, or a custom
/// one with a vector function (a lane's 8 columns handed over at once).
pub fn shuffle_applies(p: &Problem) -> bool {
    p.custom.as_ref().is_none_or(|c| c.vector.is_some())
}

/// Whether the kernel for `p` and `q` uses the shuffled epilogue.
pub fn shuffled(p: &Problem, q: &Params) -> bool {
    q.shuffle && shuffle_applies(p)
}

/// Shared memory of the staged epilogue, for up to 8 consumer warps: per warp, one slice of 16
/// rows of 32 f32 columns padded to 40 (2560 bytes), or, parking in 16 bits, two slices of 16
/// rows of 32 16-bit columns (2 x 1024 bytes; see `render_parked16`). The larger is reserved.
pub const STAGING_BYTES: usize = 8 * 16 * 40 * 4;

/// The 16-bit dtype the staged epilogue parks the accumulators in, or `None` for f32: where the
/// value the epilogue goes on with is the product rounded to that dtype anyway, so rounding it
/// before parking is exact. That is a custom epilogue that rounds its accumulator first
/// ([`CustomEpilogue::rounds_to`]: a MatMul over f16 or bf16 whose output, in the graph, is
/// f16 or bf16, followed by Add, activations and the like), or the built-in epilogue of
/// 16-bit operands into C of the same dtype (the product is of that dtype, as in ONNX, then
/// the bias and activation). f32, tf32 and fp8 products written as f32 keep f32, and so does a
/// custom epilogue without a vector function.
pub fn park_dtype(p: &Problem, q: &Params) -> Option<DType> {
    if !q.staged || !q.park16 || shuffled(p, q) {
        return None;
    }
    let d = match &p.custom {
        // Without a vector epilogue function (N not a multiple of 8: GPT-2's LM head over
        // 50257 ids) the readback goes a row at a time, and parking in 16 bits measured slower
        // on an H200 (LM head 4096 x 50257 x 768: 697 µs against 587 with f32 parking), while
        // the vector readback gains (GPT-2's qkv 41.8 → 32.3 µs).
        Some(c) if c.vector.is_none() => return None,
        Some(c) => c.rounds_to?,
        None if p.in_dtype == p.out_dtype && p.b_dtype() == p.in_dtype => p.out_dtype,
        None => return None,
    };
    matches!(d, DType::F16 | DType::BF16).then_some(d)
}

impl Default for Params {
    fn default() -> Params {
        Params {
            tile_m: 128,
            tile_n: 256,
            tile_k: 64,
            stages: 4,
            consumers: 2,
            cluster_m: 1,
            group_m: 8,
            swizzle: 128,
            regs: (40, 232),
            staged: false,
            pingpong: false,
            park16: true,
            shuffle: false,
            stream_k: false,
            rowstore: false,
        }
    }
}

/// Shared memory a block may take on sm_90 (227 KiB).
pub const MAX_SMEM: usize = 232_448;

impl Params {
    pub fn threads(&self) -> usize {
        128 * (self.consumers + 1)
    }
    /// Bytes of one stage (A and B tiles, each row one 128-byte swizzle row of K).
    pub fn stage_bytes(&self) -> usize {
        (self.tile_m + self.tile_n) * K_BYTES
    }
    /// Dynamic shared memory: the stages, 1 KiB of alignment slack and the barriers.
    pub fn smem_bytes(&self) -> usize {
        self.stages * self.stage_bytes() + 1024 + 16 * self.stages + if self.staged { STAGING_BYTES } else { 0 } + self.rowstore_bytes()
    }
    /// Shared memory of the row stores ([`Params::rowstore`]): per consumer warp 8 rows of the
    /// tile in 16 bits, each padded by 8 columns (16-byte aligned rows, conflict-free parking).
    pub fn rowstore_bytes(&self) -> usize {
        if self.rowstore {
            4 * self.consumers * 8 * (self.tile_n + 8) * 2
        } else {
            0
        }
    }
    /// Rows of C one consumer warpgroup owns.
    pub fn warp_m(&self) -> usize {
        if self.pingpong {
            self.tile_m
        } else {
            self.tile_m / self.consumers.max(1)
        }
    }
    /// Checks the parameters on their own.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=2).contains(&self.consumers) {
            return Err(format!("{} consumer warpgroups (1 or 2)", self.consumers));
        }
        if self.pingpong && (self.consumers != 2 || self.cluster_m != 1) {
            return Err(format!(
                "ping-pong needs two consumer warpgroups and no cluster (got {} and cluster {})",
                self.consumers, self.cluster_m
            ));
        }
        if self.tile_m % self.consumers != 0 || ![64, 128].contains(&self.warp_m()) {
            return Err(format!(
                "tile_m {} over {} consumers: each must own 64 or 128 rows",
                self.tile_m, self.consumers
            ));
        }
        if self.tile_n == 0 || self.tile_n % 64 != 0 || self.tile_n > 256 {
            return Err(format!(
                "tile_n {} (a multiple of 64 up to 256)",
                self.tile_n
            ));
        }
        if ![32, 64, 128].contains(&self.tile_k) {
            return Err(format!(
                "tile_k {} (one 128-byte swizzle row: 64 16-bit, 128 fp8 or 32 tf32 elements)",
                self.tile_k
            ));
        }
        if self.swizzle != 128 {
            return Err(format!(
                "swizzle {} (only 128 is implemented)",
                self.swizzle
            ));
        }
        if !(1..=2).contains(&self.cluster_m) {
            return Err(format!("cluster_m {} (1 or 2)", self.cluster_m));
        }
        if self.stream_k && (self.pingpong || self.cluster_m != 1) {
            return Err("stream-K runs without ping-pong and without clusters".into());
        }
        if self.rowstore && (!self.shuffle || self.staged) {
            return Err("row stores are a form of the shuffled epilogue (not staged)".into());
        }
        if self.cluster_m > 1 && self.tile_n % (64 * self.cluster_m) != 0 {
            return Err(format!(
                "tile_n {} does not split into {} multicast parts of 64-column boxes",
                self.tile_n, self.cluster_m
            ));
        }
        if self.stages < 2 {
            return Err(format!("{} stages (at least 2)", self.stages));
        }
        if self.group_m == 0 {
            return Err("group_m 0".into());
        }
        if self.smem_bytes() > MAX_SMEM {
            return Err(format!(
                "{} stages of {} bytes need {} bytes of shared memory, more than {MAX_SMEM}",
                self.stages,
                self.stage_bytes(),
                self.smem_bytes()
            ));
        }
        let (p, c) = self.regs;
        if p % 8 != 0 || c % 8 != 0 || !(24..=256).contains(&p) || !(24..=256).contains(&c) {
            return Err(format!(
                "register counts {:?} (multiples of 8 in 24..=256)",
                self.regs
            ));
        }
        if (128 * p + 128 * self.consumers as u32 * c) > 65536 {
            return Err(format!(
                "registers {:?} for {} warpgroups exceed the 64K register file",
                self.regs,
                self.consumers + 1
            ));
        }
        // Accumulators per consumer thread: warp_m * tile_n / 128.
        if self.warp_m() * self.tile_n / 128 > 128 {
            return Err(format!(
                "a {}x{} warpgroup tile needs more than 128 accumulator registers per thread",
                self.warp_m(),
                self.tile_n
            ));
        }
        Ok(())
    }
}

/// Whether `params` can run `problem` (and the device, given as its compute capability);
/// `Err` says why not.
pub fn applies(problem: &Problem, params: &Params, cc: (u32, u32)) -> Result<(), String> {
    if cc != (9, 0) {
        return Err(format!(
            "wgmma and TMA need compute capability 9.0 (sm_90a); the device has {}.{}",
            cc.0, cc.1
        ));
    }
    params.validate()?;
    let p = problem;
    if p.batch_split.is_some() {
        return Err("batches split in two with their own strides (the tensor maps take one batch stride)".into());
    }
    check_input_dtypes(p)?;
    if params.tile_k != p.tile_k() {
        return Err(format!(
            "tile_k {} for {} operands (one 128-byte swizzle row is {} elements)",
            params.tile_k,
            p.in_dtype.name(),
            p.tile_k()
        ));
    }
    // fp8 and tf32 wgmma read shared memory K-major only (no transpose bits).
    if p.elem_bytes() != 2 && (p.a_layout != Layout::RowMajor || p.b_layout != Layout::ColMajor) {
        return Err(format!(
            "{} operands need A row-major and B column-major (the fp8 and tf32 wgmma read both \
             K-major from shared memory, with no transpose); A is {:?} and B {:?}",
            if p.tf32 { "tf32" } else { p.in_dtype.name() },
            p.a_layout,
            p.b_layout
        ));
    }
    if !matches!(p.out_dtype, DType::BF16 | DType::F16 | DType::F32) {
        return Err(format!(
            "output dtype {} (bf16, f16 or f32)",
            p.out_dtype.name()
        ));
    }
    if let Some(b) = p.epilogue.bias {
        if !matches!(b, DType::BF16 | DType::F16 | DType::F32) {
            return Err(format!("bias dtype {} (bf16, f16 or f32)", b.name()));
        }
    }
    if p.m == 0 || p.n == 0 || p.k == 0 || p.batch == 0 {
        return Err(format!(
            "empty problem {}x{}x{} x{} (nothing for a GEMM kernel to do)",
            p.m, p.n, p.k, p.batch
        ));
    }
    if p.m >= 1 << 31 || p.n >= 1 << 31 || p.k >= 1 << 31 || p.batch >= 1 << 31 {
        return Err("a dimension of 2^31 or more".into());
    }
    // TMA reads rows whose byte stride is a multiple of 16: 8 elements of 16 bits, 16 of fp8,
    // 4 of f32.
    let align = 16 / p.elem_bytes();
    let tma_rule = |name: &str, ld: usize, inner: usize, inner_name: &str| {
        if ld < inner {
            Err(format!(
                "{name}: leading dimension {ld} is smaller than its row of {inner} ({inner_name})"
            ))
        } else if ld % align != 0 {
            Err(format!(
                "{name}: leading dimension {ld} is not a multiple of {align} elements; the bulk \
                 tensor copy needs 16-byte row strides (pad {inner_name} to a multiple of {align} \
                 with zeros, or store the operand with a padded leading dimension)"
            ))
        } else {
            Ok(())
        }
    };
    if let Some(c) = &p.conv {
        check_conv(p, c, params)?;
    }
    match p.a_layout {
        // A convolution's A is the im2col tensor map over its input (checked above).
        _ if p.conv.is_some() => {}
        Layout::RowMajor if p.a_split.is_some() => tma_rule("A (split)", p.lda(), 64, "a K slice")?,
        Layout::RowMajor => tma_rule("A (row-major)", p.lda(), p.k, "K")?,
        Layout::ColMajor => tma_rule("A (column-major)", p.lda(), p.m, "M")?,
    }
    match p.b_layout {
        Layout::RowMajor => tma_rule("B (row-major)", p.ldb(), p.n, "N")?,
        Layout::ColMajor => tma_rule("B (column-major)", p.ldb(), p.k, "K")?,
    }
    if let Some(c) = &p.custom {
        if p.epilogue != Epilogue::NONE {
            return Err("a custom epilogue replaces the bias and activation; both are set".into());
        }
        if c.rows.is_some_and(|r| r == 0 || p.m % r != 0 || p.batch != 1) {
            return Err(format!(
                "custom epilogue: flattened rows {:?} do not divide M = {} (batch {})",
                c.rows, p.m, p.batch
            ));
        }
    }
    if let Some(s) = p.a_split {
        if p.elem_bytes() != 2 {
            return Err("a split A is implemented for 16-bit operands only".into());
        }
        if p.a_layout != Layout::RowMajor || p.batch != 1 {
            return Err("a split A must be row-major and unbatched".into());
        }
        if p.k % 64 != 0 {
            return Err(format!("split A: K = {} is not a multiple of 64", p.k));
        }
        if s.rows == 0 || s.rows % params.tile_m != 0 || p.m % s.rows != 0 {
            return Err(format!(
                "split A: groups of {} rows do not split into {}-row tiles (or M = {})",
                s.rows, params.tile_m, p.m
            ));
        }
        if s.head_stride % 8 != 0 || s.group_stride % 8 != 0 || p.lda() < 64 {
            return Err("split A: strides are not multiples of 8 elements".into());
        }
    }
    if p.custom.is_none() && p.ldc() < p.n {
        return Err(format!(
            "C: leading dimension {} below N = {}",
            p.ldc(),
            p.n
        ));
    }
    if p.batch > 1 {
        for (name, s) in [("A", p.batch_stride_a), ("B", p.batch_stride_b)] {
            if s % align != 0 {
                return Err(format!(
                    "{name}: batch stride {s} is not a multiple of {align} elements (16 bytes)"
                ));
            }
        }
        if p.batch_stride_c == 0 {
            return Err("C: batch stride 0 (batches would overwrite each other)".into());
        }
    }
    Ok(())
}

/// What an implicit-GEMM convolution needs: the input read by the copy engine's im2col mode
/// (channels-last, 64 channels of one tap per K step, 4-D tensor map limits), one image
/// matrix, the repacked weights as a column-major B.
fn check_conv(p: &Problem, c: &ConvGeom, q: &Params) -> Result<(), String> {
    if p.elem_bytes() != 2 {
        return Err("a convolution needs 16-bit operands".into());
    }
    if c.nchw_input {
        return Err("a channels-first input (the im2col copy reads channels-last tensors)".into());
    }
    if c.c % 64 != 0 {
        return Err(format!(
            "{} input channels: the im2col copy takes 64 channels of one tap per K step (a multiple of 64)",
            c.c
        ));
    }
    if p.batch != 1 || p.a_split.is_some() || p.a_layout != Layout::RowMajor || p.b_layout != Layout::ColMajor {
        return Err("a convolution's GEMM is one matrix with a row-major A and the repacked weights as B".into());
    }
    if [c.n, c.h, c.w, c.kh, c.kw, c.oh, c.ow, c.stride.0, c.stride.1, c.dil.0, c.dil.1].contains(&0) {
        return Err("a convolution with an empty or zero-strided axis".into());
    }
    if p.m != c.n * c.oh * c.ow || p.k != c.k() || p.ldb() != c.k_padded() {
        return Err(format!(
            "the GEMM {}x{}x{} (ldb {}) is not the convolution's {}x{}x{} over repacked weights",
            p.m,
            p.n,
            p.k,
            p.ldb(),
            c.n * c.oh * c.ow,
            p.n,
            c.k()
        ));
    }
    // The traversal stride is an element stride of the map (1 to 8); the pixel box corners
    // of a 4-D map lie in [-128, 127]; one copy brings tile_m pixels (at most 256).
    if c.stride.0 > 8 || c.stride.1 > 8 {
        return Err(format!("stride {:?} (the im2col copy strides by at most 8)", c.stride));
    }
    let corners = [c.pad.0 as i64, c.pad.1 as i64, (c.dil.0 * (c.kh - 1)) as i64 - c.pad.0 as i64, (c.dil.1 * (c.kw - 1)) as i64 - c.pad.1 as i64];
    if corners.iter().any(|&v| !(-127..=128).contains(&v)) {
        return Err(format!(
            "padding {:?} with a {}x{} window dilated {:?}: the im2col box corners exceed [-128, 127]",
            c.pad, c.kh, c.kw, c.dil
        ));
    }
    if c.dil.0 * (c.kh - 1) >= 1 << 15 || c.dil.1 * (c.kw - 1) >= 1 << 15 {
        return Err("a window wider than the copy's 16-bit offsets".into());
    }
    if q.tile_m > 256 {
        return Err(format!("tile_m {} (one im2col copy brings at most 256 pixels)", q.tile_m));
    }
    if c.n * c.h * c.w * c.c >= 1 << 40 {
        return Err("a convolution input of 2^40 elements or more".into());
    }
    Ok(())
}

/// The input dtypes the kernel multiplies: bf16 or f16 (A and B alike), fp8 (e4m3 and e5m2,
/// mixed if wanted) or f32 as tf32 (with the caller's consent).
fn check_input_dtypes(p: &Problem) -> Result<(), String> {
    let fp8 = |d: DType| matches!(d, DType::F8E4M3 | DType::F8E5M2);
    let (a, b) = (p.in_dtype, p.b_dtype());
    match a {
        DType::BF16 | DType::F16 | DType::F32 if b != a => Err(format!(
            "operands of two dtypes ({} and {}): only fp8 formats mix",
            a.name(),
            b.name()
        )),
        DType::BF16 | DType::F16 if p.tf32 => {
            Err(format!("tf32 is set for {} operands (it is for f32 ones)", a.name()))
        }
        DType::BF16 | DType::F16 => Ok(()),
        DType::F8E4M3 | DType::F8E5M2 if !fp8(b) => Err(format!(
            "operands of two dtypes ({} and {}): fp8 mixes only with fp8",
            a.name(),
            b.name()
        )),
        DType::F8E4M3 | DType::F8E5M2 if p.tf32 => Err("tf32 is set for fp8 operands".into()),
        DType::F8E4M3 | DType::F8E5M2 => Ok(()),
        DType::F32 if p.tf32 => Ok(()),
        DType::F32 => Err(
            "f32 operands: the tensor cores multiply them as tf32 (10-bit mantissas), which \
             needs consent (Problem::tf32; --allow-tf32 for models)"
                .into(),
        ),
        d => Err(format!(
            "input dtype {} (bf16, f16, fp8 e4m3/e5m2, or f32 as tf32)",
            d.name()
        )),
    }
}

/// Default parameters for a problem on a device with `sm_count` multiprocessors.
///
/// Large problems take 128x256 tiles (two consumer warpgroups of 64x256, 4 stages), the shape
/// with the most arithmetic per byte of shared memory read. When those tiles would leave most
/// SMs idle, narrower tiles (128x128, then 64-row tiles with one consumer) trade intensity for
/// parallelism.
///
/// `TILEC_SM90_CLUSTER` (an experiment, read once) overrides the choice of clusters to compare
/// whole models with and without them: `2` turns every choice whose M spans two tile rows or
/// more into two-block clusters sharing B through TMA multicast (without ping-pong, which
/// clusters exclude); `0` leaves every product unclustered (convolutions with loading
/// epilogues back on ping-pong).
pub fn heuristic(problem: &Problem, sm_count: usize) -> Params {
    // The epilogue's stores are coalesced: from registers regrouped by warp shuffles where it
    // has a vector path, otherwise through shared memory, taking stages that no longer fit.
    let shuffle = shuffle_applies(problem);
    // The built-in epilogue of 16-bit results into rows that are not whole 16-byte vectors
    // stores each row through shared memory (`rowstore`).
    let sixteen = matches!(problem.out_dtype, DType::F16 | DType::BF16);
    let rowstore = shuffle && problem.custom.is_none() && sixteen && (problem.ldc() % 8 != 0 || problem.batch_stride_c % 8 != 0);
    let mut q = Params { staged: !shuffle, shuffle, rowstore, ..shape_heuristic(problem, sm_count) };
    while q.stages > 2 && q.smem_bytes() > MAX_SMEM {
        q.stages -= 1;
    }
    if cluster_env() == Some(2) && problem.m > q.tile_m {
        let mut c = Params { cluster_m: 2, pingpong: false, stages: 8, ..q };
        while c.stages > 2 && c.smem_bytes() > MAX_SMEM {
            c.stages -= 1;
        }
        if c.validate().is_ok() {
            q = c;
        }
    }
    q
}

/// `TILEC_SM90_CLUSTER` (`0` or `2`; see [`heuristic`]).
fn cluster_env() -> Option<u8> {
    static ON: std::sync::OnceLock<Option<u8>> = std::sync::OnceLock::new();
    *ON.get_or_init(|| match std::env::var("TILEC_SM90_CLUSTER").as_deref().map(str::trim) {
        Ok("0") => Some(0),
        Ok("2") => Some(2),
        _ => None,
    })
}

/// Tile shape and pipeline depth (without the staged epilogue's shared memory).
fn shape_heuristic(problem: &Problem, sm_count: usize) -> Params {
    let tiles = |tm: usize, tn: usize| {
        problem.m.div_ceil(tm) * problem.n.div_ceil(tn) * problem.batch.max(1)
    };
    let big = Params {
        tile_k: problem.tile_k(),
        ..Params::default()
    };
    if problem.conv.is_some() {
        // Convolutions with 128 output channels or more and 128x128 tiles enough for one and a
        // half waves: ping-pong on 128x128 tiles (ResNet-50's at batch 64 on an H200: 9-18%
        // faster on the 3x3 ones over 28x28 and 14x14 maps and the 512- and 1024-channel 1x1
        // ones, 2.30 to 2.24 ms in all; with fewer tiles it halves the blocks and loses).
        // Unless the epilogue reads tensors (a model's folded batch-norm bias, a residual):
        // then both warpgroups share each tile's epilogue, in two-block clusters sharing B,
        // with as many stages as fit. In ResNet-50 at batch 64 that took its convolutions from
        // 2.630 to about 2.45 ms (H200; 2.725 to 2.574 ms for the model on an H100); on plain
        // stores ping-pong stays 5-20% faster per layer.
        if problem.n >= 128 && 2 * tiles(128, 128) >= 3 * sm_count {
            if problem.custom.as_ref().is_some_and(|c| c.loads) && cluster_env() != Some(0) {
                return Params { tile_n: 128, cluster_m: 2, stages: 8, ..big };
            }
            return Params { tile_n: 128, pingpong: true, stages: 4, ..big };
        }
        // Otherwise tiles as wide as the output channels need (64 or 128), 128x256 for
        // wide layers with tiles enough to fill the SMs; as many stages as fit.
        let tile_n = if problem.n <= 64 {
            64
        } else if problem.n <= 128 || tiles(128, 256) < sm_count {
            128
        } else {
            256
        };
        let q = Params { tile_n, ..big };
        let stages = (2..=8).rev().find(|&s| Params { stages: s, ..q }.smem_bytes() <= MAX_SMEM).unwrap_or(2);
        return Params { stages, ..q };
    }
    if problem.m <= 64 {
        let tn = if tiles(64, 128) >= sm_count { 128 } else { 64 };
        return Params {
            tile_m: 64,
            tile_n: tn,
            consumers: 1,
            stages: 8,
            ..big
        };
    }
    // 128x256 (the most arithmetic per byte of shared memory) unless its last wave leaves more
    // SMs idle than 128x128 tiles would, or K is short (up to 512: 128x128 tiles were faster on
    // ResNet-50's 1x1 convolutions; H200, batch 64). The share of SM slots a tile count fills:
    let waves = |t: usize| t as f64 / (t.div_ceil(sm_count.max(1)) * sm_count.max(1)) as f64;
    // One wave of 128x192 tiles that nearly fills the SMs, where 128x256 and 128x128 tiles
    // leave a quarter of them idle: GPT-2's 768-wide products at 4096 rows (H200: 16.4 to
    // 14.8 µs at K = 768, 38.0 to 32.2 at K = 3072).
    let t192 = tiles(128, 192);
    if problem.n > 128
        && t192 <= sm_count
        && waves(t192) >= waves(tiles(128, 256)).max(waves(tiles(128, 128))) + 0.1
    {
        return Params { tile_n: 192, ..big };
    }
    if problem.n > 128 && problem.k > 512 && waves(tiles(128, 256)) + 0.02 >= waves(tiles(128, 128)) {
        return big;
    }
    // Otherwise tiles as wide as N needs (a wider one computes on zeros), at most 128. A short
    // product (K up to 1024: at most 16 K-steps) is bound by its epilogue and the first
    // loads: 128-row tiles, or 64-row ones while 128-row tiles would leave the SMs fewer than
    // three waves (measured on ResNet-50's 1x1 convolutions at batch 64, H200: 1.05-1.3x).
    let tile_n = if problem.n <= 64 { 64 } else { 128 };
    let narrow = problem.k <= 1024 && tiles(128, tile_n) < 3 * sm_count;
    let q = Params {
        tile_n,
        tile_m: if narrow { 64 } else { 128 },
        consumers: if narrow { 1 } else { 2 },
        ..big
    };
    if !narrow && tile_n == 128 && problem.k <= 1024 {
        // Short products on 128x128 tiles: ping-pong (one consumer's epilogue under the
        // other's products), four stages: 1.02-1.13x on GPT-2's projections (H200).
        return Params { pingpong: true, stages: 4, ..q };
    }
    let stages = (2..=8).rev().find(|&s| Params { stages: s, ..q }.smem_bytes() <= MAX_SMEM).unwrap_or(2);
    Params { stages: stages.min(8), ..q }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_params_fit_and_problems_are_checked() {
        let p = Params::default();
        assert_eq!(p.validate(), Ok(()));
        assert_eq!(p.threads(), 384);
        assert_eq!(p.smem_bytes(), 4 * 49152 + 1024 + 64);
        let prob = Problem::new(8192, 8192, 8192, DType::BF16);
        assert_eq!(applies(&prob, &p, (9, 0)), Ok(()));
        assert!(applies(&prob, &p, (8, 0)).unwrap_err().contains("9.0"));
        let odd_k = Problem::new(100, 100, 99, DType::BF16);
        let e = applies(&odd_k, &p, (9, 0)).unwrap_err();
        assert!(e.contains("multiple of 8"), "{e}");
        let f32in = Problem::new(64, 64, 64, DType::F32);
        assert!(applies(&f32in, &p, (9, 0)).is_err());
        // Column-major A with M a multiple of 8 and K odd-free is fine.
        let t =
            Problem::new(136, 72, 40, DType::F16).with_layouts(Layout::ColMajor, Layout::ColMajor);
        assert_eq!(applies(&t, &p, (9, 0)), Ok(()));
        let too_deep = Params { stages: 5, ..p };
        assert!(too_deep.validate().unwrap_err().contains("shared memory"));
    }

    #[test]
    fn split_a_and_custom_epilogues_are_checked() {
        let q = Params::default();
        let mut p = Problem::new(1024, 768, 768, DType::F16);
        p.lda = Some(64);
        p.a_split = Some(ASplit { rows: 512, head_stride: 512 * 64, group_stride: 12 * 512 * 64 });
        assert_eq!(applies(&p, &q, (9, 0)), Ok(()));
        // Groups of 96 rows do not hold whole 128-row tiles.
        p.a_split = Some(ASplit { rows: 96, head_stride: 96 * 64, group_stride: 12 * 96 * 64 });
        p.m = 960;
        assert!(applies(&p, &q, (9, 0)).unwrap_err().contains("96 rows"));
        // K must be whole 64-wide slices.
        let mut p = Problem::new(512, 768, 760, DType::F16);
        p.lda = Some(64);
        p.a_split = Some(ASplit { rows: 512, head_stride: 512 * 64, group_stride: 0 });
        assert!(applies(&p, &q, (9, 0)).unwrap_err().contains("multiple of 64"));
        // A custom epilogue replaces the built-in one; both at once is refused.
        let c = CustomEpilogue { loads: false, name: "f".into(), source: "x".into(), params: vec![], rows: Some(256), rounds_to: None, vector: None };
        let mut p = Problem::new(1024, 256, 64, DType::BF16);
        p.custom = Some(c.clone());
        assert_eq!(applies(&p, &q, (9, 0)), Ok(()));
        assert!(kernel_name(&p, &q).ends_with(&format!("_e{:016x}", c.key())));
        p.epilogue.activation = Activation::Relu;
        assert!(applies(&p, &q, (9, 0)).is_err());
        p.epilogue = Epilogue::NONE;
        p.custom = Some(CustomEpilogue { rows: Some(300), ..c });
        assert!(applies(&p, &q, (9, 0)).unwrap_err().contains("300"));
    }

    #[test]
    fn fp8_and_tf32_are_checked() {
        use Layout::{ColMajor as C, RowMajor as R};
        let rc = |m, n, k, d| Problem::new(m, n, k, d).with_layouts(R, C);
        // fp8: 128-element K stages (still 128 bytes), any fp8 mix, K-major only.
        let mut p = rc(1000, 1000, 528, DType::F8E4M3);
        p.out_dtype = DType::BF16;
        p.scale_a = true;
        p.scale_b = true;
        let q = heuristic(&p, 132);
        assert_eq!(q.tile_k, 128);
        assert_eq!(q.stage_bytes(), Params { tile_k: 64, ..q }.stage_bytes());
        assert_eq!(applies(&p, &q, (9, 0)), Ok(()));
        assert!(applies(&p, &Params::default(), (9, 0)).unwrap_err().contains("tile_k 64"));
        p.b_dtype = Some(DType::F8E5M2);
        assert_eq!(applies(&p, &q, (9, 0)), Ok(()));
        p.b_dtype = Some(DType::BF16);
        assert!(applies(&p, &q, (9, 0)).unwrap_err().contains("fp8 mixes only with fp8"));
        p.b_dtype = None;
        for (a, b) in [(R, R), (C, C), (C, R)] {
            let e = applies(&p.clone().with_layouts(a, b), &q, (9, 0)).unwrap_err();
            assert!(e.contains("A row-major and B column-major"), "{e}");
        }
        // 16-byte rows: 16 fp8 elements.
        let mut odd = rc(100, 100, 520, DType::F8E5M2);
        odd.out_dtype = DType::F32;
        let e = applies(&odd, &heuristic(&odd, 132), (9, 0)).unwrap_err();
        assert!(e.contains("multiple of 16 elements"), "{e}");
        let mut split = rc(1024, 768, 768, DType::F8E4M3);
        split.out_dtype = DType::F16;
        split.a_split = Some(ASplit { rows: 512, head_stride: 512 * 64, group_stride: 0 });
        assert!(applies(&split, &heuristic(&split, 132), (9, 0)).unwrap_err().contains("16-bit"));
        // tf32: f32 operands only with consent; 32-element K stages; K-major only.
        let mut t = rc(336, 520, 260, DType::F32);
        let qt = heuristic(&t, 132);
        assert_eq!(qt.tile_k, 32);
        assert!(applies(&t, &qt, (9, 0)).unwrap_err().contains("consent"));
        t.tf32 = true;
        assert_eq!(applies(&t, &qt, (9, 0)), Ok(()));
        let e = applies(&t.clone().with_layouts(R, R), &qt, (9, 0)).unwrap_err();
        assert!(e.contains("tf32 operands need A row-major"), "{e}");
        t.k = 258;
        assert!(applies(&t, &qt, (9, 0)).unwrap_err().contains("multiple of 4 elements"));
        let mut bf = rc(64, 64, 64, DType::BF16);
        bf.tf32 = true;
        assert!(applies(&bf, &Params::default(), (9, 0)).is_err());
        // Names tell the classes apart.
        let mut named = rc(64, 64, 128, DType::F8E4M3);
        named.out_dtype = DType::F32;
        named.b_dtype = Some(DType::F8E5M2);
        named.scale_b = true;
        let qn = heuristic(&named, 132);
        assert!(kernel_name(&named, &qn).starts_with("tl_gemm_sm90_e4m3e5m2rc_f32_64x"), "{}", kernel_name(&named, &qn));
        assert!(kernel_name(&named, &qn).contains("_sb"));
        assert!(kernel_name(&t, &qt).starts_with("tl_gemm_sm90_tf32rc_f32_"));
    }

    #[test]
    fn one_wave_of_192_wide_tiles_where_wider_and_narrower_leave_sms_idle() {
        // 4096 x 768: 128 tiles of 128x192 against 96 of 128x256 and 192 of 128x128.
        for k in [768, 3072] {
            let p = Problem::new(4096, 768, k, DType::F16);
            let q = heuristic(&p, 132);
            assert_eq!((q.tile_m, q.tile_n, q.consumers), (128, 192, 2), "{q:?}");
            assert_eq!(applies(&p, &q, (9, 0)), Ok(()));
        }
        // Several waves either way: the usual tiles.
        assert_eq!(heuristic(&Problem::new(4096, 3072, 768, DType::F16), 132).tile_n, 256);
        assert_eq!(heuristic(&Problem::new(8192, 8192, 8192, DType::BF16), 132).tile_n, 256);
    }

    #[test]
    fn fp8_and_tf32_sources_use_their_wgmma_and_scales() {
        let mut p = Problem::new(1000, 1000, 1024, DType::F8E4M3)
            .with_layouts(Layout::RowMajor, Layout::ColMajor);
        p.out_dtype = DType::BF16;
        p.scale_a = true;
        p.scale_b = true;
        p.epilogue = Epilogue { bias: Some(DType::F32), activation: Activation::Gelu };
        let q = heuristic(&p, 132);
        let src = render(&p, &q);
        assert!(src.contains(&format!("m64n{}k32.f32.e4m3.e4m3", q.tile_n)));
        assert!(src.contains("for (int kk = 0; kk < BK / 32; ++kk)"));
        assert!(src.contains("const float* __restrict__ scale_a,\n       const float* __restrict__ scale_b)"));
        assert!(src.contains("const float ab_scale = __ldg(scale_a) * __ldg(scale_b);"));
        // Shuffled: scaled before the exchanges, the bias and activation added per column after.
        assert!(q.shuffle && !q.staged, "{q:?}");
        assert!(src.contains("float2 tl_x0 = make_float2(acc[0][16 * g + 0 + 2 * h + 0] * ab_scale,"), "{src}");
        assert!(src.contains("const float tl_t = tl_v[x] + (col + x < N ? bias[col + x] : 0.0f);"), "{src}");
        // Staged: scaled into shared memory, the bias and activation added per element after.
        let staged = render(&p, &Params { staged: true, shuffle: false, ..q });
        assert!(staged.contains("make_float2(acc[0][4 * (ch * 4 + qq) + 2 * h] * ab_scale,"), "{staged}");
        assert!(staged.contains("const float x = v + bias[col];"), "{staged}");
        let unstaged = render(&p, &Params { staged: false, shuffle: false, ..q });
        assert!(unstaged.contains("acc[0][4 * q + 2 * h] * ab_scale + bias0"));
        let mut t = Problem::new(300, 200, 100, DType::F32)
            .with_layouts(Layout::RowMajor, Layout::ColMajor);
        t.tf32 = true;
        let q = heuristic(&t, 132);
        let src = render(&t, &q);
        assert!(src.contains(&format!("m64n{}k8.f32.tf32.tf32", q.tile_n)));
        assert!(src.contains("BK = 32"));
        assert!(src.contains("kk < BK / 8;"));
        assert!(!src.contains("ab_scale"));
    }

    /// ResNet-50's 28x28 3x3 convolution at batch 64: ping-pong on plain stores, two-block
    /// clusters without ping-pong where the epilogue reads a bias or a residual.
    #[test]
    fn convolutions_with_loading_epilogues_take_clusters() {
        let g = ConvGeom { n: 64, h: 28, w: 28, c: 128, kh: 3, kw: 3, oh: 28, ow: 28, stride: (1, 1), pad: (1, 1), dil: (1, 1), nchw_input: false };
        let mut p = Problem::for_conv(g, 128, DType::F16);
        let epi = |loads: bool| CustomEpilogue { loads, name: "f".into(), source: "x".into(), params: vec![], rows: Some(784), rounds_to: None, vector: Some("fv".into()) };
        p.custom = Some(epi(false));
        let q = heuristic(&p, 132);
        assert!(q.pingpong && q.cluster_m == 1 && q.tile_n == 128, "{q:?}");
        p.custom = Some(epi(true));
        let q = heuristic(&p, 132);
        assert!(!q.pingpong && q.cluster_m == 2 && q.tile_n == 128 && q.stages >= 6, "{q:?}");
        assert_eq!(q.validate(), Ok(()));
        assert_eq!(applies(&p, &q, (9, 0)), Ok(()));
        // Too few tiles for ping-pong: neither.
        let small = ConvGeom { n: 2, oh: 7, ow: 7, h: 7, w: 7, ..g };
        let mut p = Problem::for_conv(small, 128, DType::F16);
        p.custom = Some(epi(true));
        let q = heuristic(&p, 132);
        assert!(!q.pingpong && q.cluster_m == 1, "{q:?}");
    }

    #[test]
    fn convolutions_read_through_im2col_copies() {
        let g = ConvGeom { n: 2, h: 14, w: 14, c: 128, kh: 3, kw: 3, oh: 7, ow: 7, stride: (2, 2), pad: (1, 1), dil: (1, 1), nchw_input: false };
        let mut p = Problem::new(2 * 49, 72, g.k(), DType::F16).with_layouts(Layout::RowMajor, Layout::ColMajor);
        p.lda = Some(g.c);
        p.ldb = Some(g.k_padded());
        p.batch_stride_a = 0;
        p.batch_stride_b = 0;
        p.conv = Some(g);
        let q = heuristic(&p, 132);
        assert!(q.tile_n == 128 && q.stages >= 4, "{q:?}");
        assert_eq!(applies(&p, &q, (9, 0)), Ok(()));
        let src = render(&p, &q);
        assert!(src.contains("const int tap = kb / 2, c0 = (kb - tap * 2) * 64, r = tap / 3, t = tap - r * 3;"), "{src}");
        assert!(src.contains("tl_tma_im2col4(sa, &map_a, c0, ow * 2 - 1, oh * 2 - 1, img, (unsigned short)(t * 1), (unsigned short)(r * 1), full);"));
        assert!(src.contains(&format!("void {}_repack(", kernel_name(&p, &q))));
        assert!(kernel_name(&p, &q).contains("_cv2x14x14x128_o72_k3x3_s2x2_p1x1_d1x1"));
        // The model epilogue goes through each warp's slice of shared memory.
        p.custom = Some(CustomEpilogue { loads: false, name: "f".into(), source: "x".into(), params: vec!["float* __restrict__ y".into()], rows: Some(49), rounds_to: None, vector: None });
        let q = heuristic(&p, 132);
        assert!(q.staged && q.smem_bytes() <= MAX_SMEM, "{q:?}");
        let src = render(&p, &q);
        assert!(src.contains("float* tl_st = (float*)tl_dyn_stage + (cw * 4 + warp) * 640;"), "{src}");
        assert!(src.contains("const float v = tl_st[r * 40 + lane];") && src.contains("f(y, eb, er, col, v);"), "{src}");
        assert!(kernel_name(&p, &q).contains("_st_e"));
        p.custom = None;
        // What the copy cannot do is refused with the reason.
        let refuse = |f: &dyn Fn(&mut ConvGeom), want: &str| {
            let mut bad = p.clone();
            let mut c = g;
            f(&mut c);
            bad.conv = Some(c);
            let e = applies(&bad, &q, (9, 0)).unwrap_err();
            assert!(e.contains(want), "{e}");
        };
        refuse(&|c| c.c = 96, "multiple of 64");
        refuse(&|c| c.nchw_input = true, "channels-first");
        refuse(&|c| c.stride = (9, 1), "at most 8");
        refuse(&|c| c.pad = (200, 1), "[-128, 127]");
        let mut wide = p.clone();
        wide.m += 1;
        assert!(applies(&wide, &q, (9, 0)).unwrap_err().contains("not the convolution's"));
    }

    #[test]
    fn ping_pong_gives_each_warpgroup_whole_tiles() {
        let p = Problem::new(8192, 8192, 8192, DType::BF16);
        let q = Params { tile_n: 128, pingpong: true, staged: true, stages: 6, ..Params::default() };
        assert_eq!(applies(&p, &q, (9, 0)), Ok(()));
        assert_eq!(q.warp_m(), 128);
        let src = render(&p, &q);
        if std::env::var("DUMP_PP").is_ok() {
            eprintln!("{src}");
        }
        assert!(src.contains("for (int t = blockIdx.x + cw * gridDim.x; t < tiles; t += 2 * gridDim.x)"), "{src}");
        assert!(src.contains("it += kblocks;"));
        assert!(src.contains("bar.sync %0, 256;") && src.contains("bar.arrive %0, 256;"));
        assert!(src.contains("tl_wgmma_desc(sa + (0 + 1) * 8192u"), "{src}");
        assert!(src.contains("tl_mbar_init(bars + 8 * (STAGES + s), 4);"));
        assert!(kernel_name(&p, &q).contains("_sth_pp"));
        // 128x256 per warpgroup would need 256 accumulators a thread; no clusters.
        assert!(Params { pingpong: true, ..Params::default() }.validate().is_err());
        assert!(Params { cluster_m: 2, ..q }.validate().unwrap_err().contains("ping-pong"));
        let coop = render(&p, &Params { pingpong: false, ..q });
        assert!(coop.contains("tl_mbar_init(bars + 8 * (STAGES + s), 8);") && !coop.contains("it += kblocks;"));
    }

    #[test]
    fn heuristic_params_are_valid() {
        for (m, n, k) in [
            (8192, 8192, 8192),
            (16, 8192, 8192),
            (512, 768, 768),
            (1, 64, 64),
        ] {
            let prob = Problem::new(m, n, k, DType::BF16);
            let p = heuristic(&prob, 132);
            assert_eq!(applies(&prob, &p, (9, 0)), Ok(()), "{m}x{n}x{k}: {p:?}");
        }
    }
}
