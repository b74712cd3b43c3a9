//! Compiling, loading and launching the Hopper GEMM kernel.

use std::ffi::c_void;
use std::sync::Arc;

use tilec_ir::DType;

use super::{applies, kernel_name, render, stream_k, Layout, Params, Problem};
use crate::driver::{Device, DeviceBuffer, Function, LaunchConfig, Stream};
use crate::error::{CudaError, Result};
use crate::nvrtc::Compiler;
use crate::tma::{Im2colMap, TensorMap, TiledMap, TmaDType, TmaSwizzle};

/// A compiled GEMM kernel for one problem class (dtypes, layouts, epilogue, broadcasts) and
/// one parameter set; it runs any shape of that class.
pub struct GemmKernel {
    pub name: String,
    pub problem: Problem,
    pub params: Params,
    pub cache_hit: bool,
    /// Blocks that run at once: one per SM, or for clusters, whole clusters that fit.
    resident_blocks: u32,
    func: Function,
    /// A convolution's weight repacking kernel (see [`super::render_repack`]).
    repack: Option<Function>,
    /// Stream-K's counters and parked partial sums (see [`super::stream_k`]), for a grid of
    /// `resident_blocks`; the counters start at zero and every launch leaves them so.
    workspace: Option<DeviceBuffer>,
}

/// Everything one launch needs: the tensor maps of A and B (which hold their addresses), the
/// other arguments and the grid.
pub struct GemmArgs {
    map_a: TensorMap,
    map_b: TensorMap,
    c: u64,
    bias: u64,
    dims: [i32; 4],
    ldc: i64,
    batch_stride_c: i64,
    /// The scales' addresses (those the problem has, A's first), after the fixed parameters.
    scales: Vec<u64>,
    /// Pointers passed to a custom epilogue, after the scales.
    extra: Vec<u64>,
    pub launch: LaunchConfig,
}

fn tma_dtype(d: DType) -> Result<TmaDType> {
    match d {
        DType::BF16 => Ok(TmaDType::BF16),
        DType::F16 => Ok(TmaDType::F16),
        DType::F32 => Ok(TmaDType::F32),
        // The copy moves bytes; the wgmma gives them their format.
        DType::F8E4M3 | DType::F8E5M2 => Ok(TmaDType::U8),
        d => Err(CudaError::Usage(format!("no tensor map for {}", d.name()))),
    }
}

/// The tensor map of one operand: `inner` x `outer` elements per batch, leading dimension
/// `ld`, `batches` matrices `batch_stride` apart, read in boxes of `box_inner` x `box_outer`.
#[allow(clippy::too_many_arguments)]
fn operand_map(
    dtype: DType,
    address: u64,
    inner: usize,
    outer: usize,
    ld: usize,
    batches: usize,
    batch_stride: usize,
    box_inner: usize,
    box_outer: usize,
) -> Result<TensorMap> {
    let es = dtype.size_bytes() as u64;
    // A single matrix still gets a valid batch stride (the driver checks it).
    let bs = if batches > 1 {
        batch_stride as u64
    } else {
        (outer as u64 * ld as u64).max(8)
    };
    TiledMap {
        dtype: tma_dtype(dtype)?,
        address,
        dims: vec![inner as u64, outer as u64, batches as u64],
        strides: vec![ld as u64 * es, (bs * es).next_multiple_of(16)],
        box_dims: vec![box_inner as u32, box_outer as u32, 1],
        swizzle: TmaSwizzle::B128,
    }
    .encode()
}

/// The kernel's name, once the family has said it applies to `problem` on this device.
fn checked_name(device: &Device, problem: &Problem, params: &Params) -> Result<String> {
    let name = kernel_name(problem, params);
    applies(problem, params, device.props().compute_capability)
        .map_err(|msg| CudaError::Schedule { kernel: name.clone(), msg })?;
    Ok(name)
}

impl GemmKernel {
    /// Checks, renders, compiles (through the compiler's cache) and loads the kernel.
    pub fn load(
        device: &Device,
        compiler: &Compiler,
        problem: &Problem,
        params: &Params,
    ) -> Result<GemmKernel> {
        let name = checked_name(device, problem, params)?;
        let source = render(problem, params);
        let compiled = compiler.compile(&name, &source)?;
        GemmKernel::from_image(device, problem, params, &compiled.image, compiled.cache_hit)
    }

    /// Loads a kernel compiled elsewhere from [`render`]'s source for `problem` and `params`.
    pub fn from_image(
        device: &Device,
        problem: &Problem,
        params: &Params,
        image: &[u8],
        cache_hit: bool,
    ) -> Result<GemmKernel> {
        let name = checked_name(device, problem, params)?;
        let props = device.props();
        let module = Arc::new(device.load_module(image)?);
        let func = module.function(&name)?;
        let repack = match problem.conv {
            Some(_) => Some(module.function(&format!("{name}_repack"))?),
            None => None,
        };
        let mut resident_blocks = props.sm_count;
        if params.cluster_m > 1 {
            // Not every SM can hold a block of a cluster (clusters live inside one GPC): a
            // persistent grid larger than the resident clusters would run in two waves.
            let cl = params.cluster_m as u32;
            let clusters = func.max_active_clusters(
                props.sm_count / cl * cl,
                params.threads() as u32,
                params.smem_bytes() as u32,
            )?;
            resident_blocks = (clusters * cl).clamp(cl, props.sm_count / cl * cl);
        }
        let workspace = if params.stream_k {
            let ws = device.alloc(stream_k::workspace_bytes(params, resident_blocks as usize))?;
            ws.write(0, &[0u8; stream_k::FLAG_SLOTS * 4])?;
            Some(ws)
        } else {
            None
        };
        Ok(GemmKernel {
            name,
            problem: problem.clone(),
            params: *params,
            cache_hit,
            resident_blocks,
            func,
            repack,
            workspace,
        })
    }

    pub fn function(&self) -> &Function {
        &self.func
    }

    /// A convolution's weight repacking kernel, `(weights, out)`, one thread per element of
    /// the `n x k_padded` output, handed to its owner ([`crate::repack::Repacked`]).
    pub fn take_repack_function(&mut self) -> Option<Function> {
        self.repack.take()
    }

    /// Blocks of the persistent grid (at most; small problems get fewer).
    pub fn resident_blocks(&self) -> u32 {
        self.resident_blocks
    }

    /// Arguments for a launch over `problem` (a shape of this kernel's class) with operands at
    /// device addresses `a`, `b`, `c` and the bias at `bias`.
    pub fn args(
        &self,
        problem: &Problem,
        a: u64,
        b: u64,
        c: u64,
        bias: Option<u64>,
    ) -> Result<GemmArgs> {
        self.args_with(problem, a, b, c, bias, &[])
    }

    /// [`args`](Self::args) with the pointers a custom epilogue takes (one per entry of its
    /// `params`).
    pub fn args_with(
        &self,
        problem: &Problem,
        a: u64,
        b: u64,
        c: u64,
        bias: Option<u64>,
        extra: &[u64],
    ) -> Result<GemmArgs> {
        self.args_scaled(problem, a, b, c, bias, (None, None), extra)
    }

    /// [`args_with`](Self::args_with) with the addresses of the per-tensor scales (one f32
    /// each), given exactly for the scales the problem has.
    #[allow(clippy::too_many_arguments)]
    pub fn args_scaled(
        &self,
        problem: &Problem,
        a: u64,
        b: u64,
        c: u64,
        bias: Option<u64>,
        scales: (Option<u64>, Option<u64>),
        extra: &[u64],
    ) -> Result<GemmArgs> {
        if scales.0.is_some() != problem.scale_a || scales.1.is_some() != problem.scale_b {
            return Err(CudaError::Usage(format!(
                "scale pointers {:?} given for a problem with scale_a {} and scale_b {}",
                scales, problem.scale_a, problem.scale_b
            )));
        }
        if let Some(s) = [scales.0, scales.1].into_iter().flatten().find(|s| s % 4 != 0) {
            return Err(CudaError::Usage(format!("a scale at {s:#x} is not 4-byte aligned")));
        }
        let want = problem.custom.as_ref().map_or(0, |c| c.params.len());
        if extra.len() != want {
            return Err(CudaError::Usage(format!(
                "{} epilogue pointers given, {want} expected",
                extra.len()
            )));
        }
        let q = &self.params;
        let p = problem;
        if kernel_name(p, q) != self.name {
            return Err(CudaError::Usage(format!(
                "kernel {} cannot run a problem of class {}",
                self.name,
                kernel_name(p, q)
            )));
        }
        applies(p, q, (9, 0)).map_err(CudaError::Usage)?;
        if c % 16 != 0 {
            return Err(CudaError::Usage(format!(
                "C at {c:#x} is not 16-byte aligned"
            )));
        }
        if p.epilogue.bias.is_some() != bias.is_some() {
            return Err(CudaError::Usage(
                "a bias pointer is needed exactly when the epilogue has a bias".into(),
            ));
        }
        let batches = |s: usize| if s == 0 { 1 } else { p.batch };
        let es = p.in_dtype.size_bytes() as u64;
        // A convolution's input through the im2col mode: the window's top-left corner runs
        // from minus the padding to the last position a window fits, by the stride.
        let conv_map = |c: super::ConvGeom| -> Result<TensorMap> {
            let (ph, pw) = (c.pad.0 as i32, c.pad.1 as i32);
            Im2colMap {
                dtype: tma_dtype(p.in_dtype)?,
                address: a,
                dims: [c.n as u64, c.h as u64, c.w as u64, c.c as u64],
                lower: [-ph, -pw],
                upper: [ph - (c.dil.0 * (c.kh - 1)) as i32, pw - (c.dil.1 * (c.kw - 1)) as i32],
                stride: [c.stride.0 as u32, c.stride.1 as u32],
                channels: 64,
                pixels: q.tile_m as u32,
                swizzle: TmaSwizzle::B128,
            }
            .encode()
        };
        let map_a = match p.a_layout {
            Layout::RowMajor if p.conv.is_some() => conv_map(p.conv.unwrap_or_default())?,
            Layout::RowMajor if p.a_split.is_some() => {
                let s = p.a_split.unwrap_or(super::ASplit { rows: 1, head_stride: 0, group_stride: 0 });
                TiledMap {
                    dtype: tma_dtype(p.in_dtype)?,
                    address: a,
                    dims: vec![64, s.rows as u64, (p.k / 64) as u64, (p.m / s.rows) as u64],
                    strides: vec![
                        p.lda() as u64 * es,
                        s.head_stride as u64 * es,
                        s.group_stride as u64 * es,
                    ],
                    box_dims: vec![64, q.tile_m as u32, 1, 1],
                    swizzle: TmaSwizzle::B128,
                }
                .encode()?
            }
            Layout::RowMajor => operand_map(
                p.in_dtype,
                a,
                p.k,
                p.m,
                p.lda(),
                batches(p.batch_stride_a),
                p.batch_stride_a,
                q.tile_k,
                q.tile_m,
            )?,
            Layout::ColMajor => operand_map(
                p.in_dtype,
                a,
                p.m,
                p.k,
                p.lda(),
                batches(p.batch_stride_a),
                p.batch_stride_a,
                64,
                q.tile_k,
            )?,
        };
        let b_dtype = p.b_dtype();
        let map_b = match p.b_layout {
            Layout::ColMajor => operand_map(
                b_dtype,
                b,
                p.k,
                p.n,
                p.ldb(),
                batches(p.batch_stride_b),
                p.batch_stride_b,
                q.tile_k,
                q.tile_n / q.cluster_m,
            )?,
            Layout::RowMajor => operand_map(
                b_dtype,
                b,
                p.n,
                p.k,
                p.ldb(),
                batches(p.batch_stride_b),
                p.batch_stride_b,
                64,
                q.tile_k,
            )?,
        };
        // Persistent: one block per SM at most (whole clusters), fewer for small problems.
        let cl = q.cluster_m;
        let tiles = p.m.div_ceil(q.tile_m * cl) * p.n.div_ceil(q.tile_n) * p.batch;
        // In ping-pong a block works on two tiles at once.
        let per_block = if q.pingpong { tiles.div_ceil(2) } else { tiles };
        let grid = if q.stream_k {
            stream_k::grid(self.resident_blocks as usize, tiles, p.k.div_ceil(q.tile_k)) as u32
        } else {
            (per_block.min(self.resident_blocks as usize / cl).max(1) * cl) as u32
        };
        Ok(GemmArgs {
            map_a,
            map_b,
            c,
            bias: bias.unwrap_or(0),
            dims: [p.m as i32, p.n as i32, p.k as i32, p.batch as i32],
            ldc: p.ldc() as i64,
            // One matrix: no stride (an odd one would only cost the paired stores).
            batch_stride_c: if p.batch > 1 {
                p.batch_stride_c as i64
            } else {
                0
            },
            scales: [scales.0, scales.1].into_iter().flatten().collect(),
            extra: extra.to_vec(),
            launch: LaunchConfig {
                grid: (grid, 1, 1),
                block: (q.threads() as u32, 1, 1),
                shared_mem_bytes: q.smem_bytes() as u32,
            },
        })
    }

    /// Launches on `stream`.
    pub fn launch(&self, stream: &Stream, args: &GemmArgs) -> Result<()> {
        let a = args.map_a;
        let b = args.map_b;
        let mut c = args.c;
        let mut bias = args.bias;
        let [mut m, mut n, mut k, mut batch] = args.dims;
        let mut ldc = args.ldc;
        let mut bsc = args.batch_stride_c;
        let mut scales = args.scales.clone();
        let mut extra = args.extra.clone();
        let mut params: Vec<*mut c_void> = vec![
            a.as_param(),
            b.as_param(),
            &mut c as *mut u64 as *mut c_void,
            &mut bias as *mut u64 as *mut c_void,
            &mut m as *mut i32 as *mut c_void,
            &mut n as *mut i32 as *mut c_void,
            &mut k as *mut i32 as *mut c_void,
            &mut batch as *mut i32 as *mut c_void,
            &mut ldc as *mut i64 as *mut c_void,
            &mut bsc as *mut i64 as *mut c_void,
        ];
        let mut ws = self.workspace.as_ref().map_or(0, |w| w.ptr());
        if self.params.stream_k {
            params.push(&mut ws as *mut u64 as *mut c_void);
        }
        for e in scales.iter_mut().chain(extra.iter_mut()) {
            params.push(e as *mut u64 as *mut c_void);
        }
        // SAFETY: the values match the kernel's parameters in order, size and alignment (two
        // 128-byte tensor maps, two pointers, four ints, two 64-bit integers, stream-K's
        // workspace where the kernel has one, then one pointer per scale and per custom
        // epilogue parameter, checked in `args_scaled`).
        unsafe { self.func.launch_raw(stream, &args.launch, &mut params) }
    }
}
