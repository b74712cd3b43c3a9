//! Hardware targets and roofline helpers for the fusion cost model.
//!
//! Numbers are order-of-magnitude presets, good enough to rank fusion decisions
//! (bytes saved vs. FLOPs recomputed vs. launches saved), not to predict wall time.

/// The kind of machine a pipeline compiles for: what the passes that depend on the
/// target (today `choose-layout`) look at. The machine's numbers are in [`Target`]; its
/// `kind` field says which kind it is, and [`Target::preset`] gives the default machine
/// of a kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TargetKind {
    #[default]
    Cpu,
    Cuda,
}

/// A compute target as the cost model sees it: a [`TargetKind`] and its machine numbers.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    pub name: &'static str,
    pub kind: TargetKind,
    /// Streaming multiprocessors (GPU) or cores (CPU).
    pub units: usize,
    /// Main-memory bandwidth, bytes/s.
    pub mem_bw: f64,
    /// Peak FLOP/s on matrix units for 16-bit floats (tensor cores; equal to
    /// `peak_f32` on a CPU).
    pub peak_mma_16: f64,
    /// Peak FLOP/s of plain (non-tensor) f32 arithmetic.
    pub peak_f32: f64,
    /// On-chip scratch per unit in bytes (shared memory per SM; L2 per core on a CPU).
    pub scratch_per_unit: usize,
    /// 32-bit registers per unit (GPU); 0 on a CPU.
    pub regs_per_unit: usize,
    /// Fixed cost of one kernel launch / dispatch, seconds.
    pub launch_s: f64,
    /// Longest elementwise epilogue/prologue chain fused into one anchor (register budget).
    pub max_epilogue_ops: usize,
    /// Output tile edge of a GEMM kernel; sets how often a fused prologue is recomputed.
    pub gemm_tile: usize,
}

impl Target {
    /// NVIDIA H100 SXM (H200 has the same SMs with 4.8 TB/s HBM3e).
    pub fn cuda_h100() -> Target {
        Target {
            name: "cuda-h100",
            kind: TargetKind::Cuda,
            units: 132,
            mem_bw: 3.35e12,
            peak_mma_16: 990e12,
            peak_f32: 60e12,
            scratch_per_unit: 228 * 1024,
            regs_per_unit: 64 * 1024,
            launch_s: 4e-6,
            max_epilogue_ops: 8,
            gemm_tile: 128,
        }
    }

    pub fn cuda_h200() -> Target {
        Target {
            name: "cuda-h200",
            mem_bw: 4.8e12,
            ..Target::cuda_h100()
        }
    }

    /// The development machine: 2 AVX-512 cores, ~20 GB/s DRAM, 1 MB L2 per core.
    pub fn cpu() -> Target {
        Target {
            name: "cpu-avx512-2c",
            kind: TargetKind::Cpu,
            units: 2,
            mem_bw: 20e9,
            peak_mma_16: 150e9,
            peak_f32: 150e9,
            scratch_per_unit: 1024 * 1024,
            regs_per_unit: 0,
            launch_s: 1e-6,
            max_epilogue_ops: 16,
            gemm_tile: 64,
        }
    }

    /// The default machine of a kind: [`Target::cpu`] or [`Target::cuda_h200`].
    pub fn preset(kind: TargetKind) -> Target {
        match kind {
            TargetKind::Cpu => Target::cpu(),
            TargetKind::Cuda => Target::cuda_h200(),
        }
    }

    pub fn is_gpu(&self) -> bool {
        self.kind == TargetKind::Cuda
    }

    /// Peak FLOP/s for a group: matrix units for 16-bit (or narrower) float matrix work,
    /// plain f32 otherwise (f32 GEMMs are costed without TF32).
    pub fn peak(&self, matrix: bool, elem_bytes: usize) -> f64 {
        if matrix && elem_bytes <= 2 {
            self.peak_mma_16
        } else {
            self.peak_f32
        }
    }

    /// Roofline time of one kernel: `max(bytes / bw, flops / peak) + launch`.
    pub fn time(&self, bytes: f64, flops: f64, peak: f64) -> f64 {
        (bytes / self.mem_bw).max(flops / peak) + self.launch_s
    }

    /// Arithmetic intensity (FLOP per byte) at which a kernel turns compute-bound.
    pub fn ridge(&self, peak: f64) -> f64 {
        peak / self.mem_bw
    }

    /// Time to move `bytes` through main memory.
    pub fn mem_time(&self, bytes: f64) -> f64 {
        bytes / self.mem_bw
    }

    /// Time to do `flops` of plain f32 arithmetic on the whole device.
    pub fn flop_time(&self, flops: f64) -> f64 {
        flops / self.peak_f32
    }
}

/// Arithmetic intensity in FLOP per byte (0 when nothing moves).
pub fn intensity(bytes: f64, flops: f64) -> f64 {
    if bytes > 0.0 {
        flops / bytes
    } else {
        0.0
    }
}
