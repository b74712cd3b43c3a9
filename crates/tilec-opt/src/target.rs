//! The one description of a machine: what the cost model, the kernel families, the schedules
//! and (later) the tuner read. A [`Target`] has the roofline numbers the fusion cost model
//! ranks decisions with, and the details the code generators need: for a CPU its threads,
//! vector width and caches ([`CpuTarget`]), for a GPU its SMs, shared memory, registers and
//! compute capability ([`GpuTarget`]). Presets are *declared* (order-of-magnitude numbers for
//! a kind of machine); [`Target::host_cpu`] and the CUDA back end's device query give
//! *measured* ones.

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
    /// Output tile edge of a GEMM kernel; sets how often a fused prologue is recomputed
    /// (the tensor-core GEMM's tiles on a GPU, the CPU GEMM's cache blocks).
    pub gemm_tile: usize,
    /// Whether the numbers were measured on this machine or declared for its kind.
    pub origin: Origin,
    /// CPU details (for a GPU target: the host that drives it).
    pub cpu: CpuTarget,
    /// GPU details (meaningful when `kind` is [`TargetKind::Cuda`]).
    pub gpu: GpuTarget,
}

/// Where a target's numbers come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Origin {
    /// Written down for a kind of machine (the presets).
    #[default]
    Declared,
    /// Read from the machine this runs on (CPU features and caches, CUDA device properties).
    Measured,
}

/// What the CPU schedules, kernel families and C renderer know about a CPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuTarget {
    /// Worker threads for parallel loops.
    pub threads: usize,
    /// Width of a vector register in bytes (64 for AVX-512, 32 for AVX2, 16 for SSE/NEON).
    pub vector_bytes: usize,
    /// L1 data cache per core, bytes.
    pub l1_bytes: usize,
    /// L2 cache per core, bytes.
    pub l2_bytes: usize,
    /// Shared last-level cache, bytes.
    pub l3_bytes: usize,
    /// Instruction sets the C renderer may use.
    pub avx512f: bool,
    pub avx2: bool,
    pub fma: bool,
}

impl CpuTarget {
    /// The machine this runs on: instruction sets from the CPU features, threads from the
    /// available parallelism, cache sizes from sysfs where readable (32 KiB, 1 MiB and 8 MiB
    /// otherwise).
    pub fn host() -> CpuTarget {
        #[cfg(target_arch = "x86_64")]
        let (avx512f, avx2, fma) = (
            std::arch::is_x86_feature_detected!("avx512f"),
            std::arch::is_x86_feature_detected!("avx2"),
            std::arch::is_x86_feature_detected!("fma"),
        );
        #[cfg(not(target_arch = "x86_64"))]
        let (avx512f, avx2, fma) = (false, false, false);
        let (l1, l2, l3) = sysfs_caches();
        CpuTarget {
            threads: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            vector_bytes: if avx512f { 64 } else if avx2 { 32 } else { 16 },
            l1_bytes: l1.unwrap_or(32 << 10),
            l2_bytes: l2.unwrap_or(1 << 20),
            l3_bytes: l3.unwrap_or(8 << 20),
            avx512f,
            avx2,
            fma,
        }
    }

    /// A baseline x86-64 CPU with SSE only, one thread (for portable code).
    pub fn baseline() -> CpuTarget {
        CpuTarget {
            threads: 1,
            vector_bytes: 16,
            l1_bytes: 32 << 10,
            l2_bytes: 256 << 10,
            l3_bytes: 8 << 20,
            avx512f: false,
            avx2: false,
            fma: false,
        }
    }

    /// Vector lanes for elements of `d`.
    pub fn lanes(&self, d: tilec_ir::DType) -> i64 {
        self.lanes_of(d.size_bytes()) as i64
    }

    /// Vector lanes for elements of `elem_bytes` bytes.
    pub fn lanes_of(&self, elem_bytes: usize) -> usize {
        (self.vector_bytes / elem_bytes.max(1)).max(1)
    }
}

impl Default for CpuTarget {
    /// A two-core AVX-512 machine with 32 KiB L1 and 1 MiB L2 per core.
    fn default() -> Self {
        CpuTarget {
            threads: 2,
            vector_bytes: 64,
            l1_bytes: 32 << 10,
            l2_bytes: 1 << 20,
            l3_bytes: 8 << 20,
            avx512f: true,
            avx2: true,
            fma: true,
        }
    }
}

/// L1 data, L2 and L3 sizes of CPU 0 from sysfs.
fn sysfs_caches() -> (Option<usize>, Option<usize>, Option<usize>) {
    let (mut l1, mut l2, mut l3) = (None, None, None);
    for i in 0..8 {
        let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{i}");
        let read = |f: &str| std::fs::read_to_string(format!("{dir}/{f}")).ok().map(|s| s.trim().to_string());
        let (Some(level), Some(ty), Some(size)) = (read("level"), read("type"), read("size")) else {
            continue;
        };
        let bytes = parse_size(&size);
        match (level.as_str(), ty.as_str()) {
            ("1", "Data") => l1 = bytes,
            ("2", "Unified") | ("2", "Data") => l2 = bytes,
            ("3", _) => l3 = bytes,
            _ => {}
        }
    }
    (l1, l2, l3)
}

/// `48K`, `2M`, `1G` or a plain byte count.
fn parse_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, mul) = match s.chars().last()? {
        'K' | 'k' => (&s[..s.len() - 1], 1usize << 10),
        'M' | 'm' => (&s[..s.len() - 1], 1 << 20),
        'G' | 'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.trim().parse::<usize>().ok().map(|n| n * mul)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("48K"), Some(48 << 10));
        assert_eq!(parse_size("2M"), Some(2 << 20));
        assert_eq!(parse_size("512"), Some(512));
        assert_eq!(parse_size("x"), None);
    }

    #[test]
    fn host_is_consistent() {
        let h = CpuTarget::host();
        assert!(h.threads >= 1);
        assert_eq!(h.vector_bytes, if h.avx512f { 64 } else if h.avx2 { 32 } else { 16 });
        assert_eq!(h.lanes(tilec_ir::DType::F32) as usize, h.vector_bytes / 4);
    }
}

/// What the GPU schedules and kernel families know about a device.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct GpuTarget {
    pub sm_count: u32,
    pub max_threads_per_block: u32,
    /// Resident blocks per SM the elementwise grid is sized for.
    pub blocks_per_sm: u32,
    /// Compute capability (major, minor): which kernel families the device can run (the
    /// tensor-core generation: 9.0 has wgmma and TMA).
    pub compute_capability: (u32, u32),
    /// Shared memory one block may use after opting in, bytes.
    pub smem_per_block: usize,
    /// 32-bit registers per SM.
    pub regs_per_sm: u32,
    /// L2 cache, bytes.
    pub l2_bytes: usize,
    /// Whether f32 matrix products may run on the tensor cores as tf32 (10-bit mantissas;
    /// `--allow-tf32`). Off by default: f32 models stay exact f32, as in PyTorch.
    pub allow_tf32: bool,
    /// Whether attention is recognized for the CUDA target so that the FlashAttention family
    /// (`sm80_flash_attn`) runs it: opt-in (`TILEC_CUDA_ATTENTION=flash`) until the kernel is
    /// validated on a GPU; off, attention stays two batched products and a row softmax.
    pub flash_attention: bool,
}

impl GpuTarget {
    /// H100/H200 SXM: 132 SMs, sm_90, 227 KiB of shared memory per block, 50 MiB of L2.
    pub fn hopper() -> GpuTarget {
        GpuTarget {
            sm_count: 132,
            max_threads_per_block: 1024,
            blocks_per_sm: 8,
            compute_capability: (9, 0),
            smem_per_block: 227 * 1024,
            regs_per_sm: 64 * 1024,
            l2_bytes: 50 << 20,
            allow_tf32: false,
            flash_attention: false,
        }
    }

    /// Whether the device has Hopper's tensor-core instructions (wgmma, TMA).
    pub fn has_wgmma(&self) -> bool {
        self.compute_capability.0 == 9
    }
}

impl Default for GpuTarget {
    fn default() -> Self {
        GpuTarget::hopper()
    }
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
            origin: Origin::Declared,
            cpu: CpuTarget::default(),
            gpu: GpuTarget::hopper(),
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
            origin: Origin::Declared,
            cpu: CpuTarget::default(),
            gpu: GpuTarget::hopper(),
        }
    }

    /// The CPU this runs on: the preset's roofline numbers with the measured threads, vector
    /// width and caches.
    pub fn host_cpu() -> Target {
        let cpu = CpuTarget::host();
        Target {
            name: "cpu-host",
            units: cpu.threads,
            scratch_per_unit: cpu.l2_bytes,
            origin: Origin::Measured,
            cpu,
            ..Target::cpu()
        }
    }

    /// A CUDA device from its measured details (the H200 preset's bandwidth and peaks unless
    /// given).
    pub fn cuda_measured(gpu: GpuTarget, mem_bw: Option<f64>) -> Target {
        let base = Target::cuda_h200();
        Target {
            name: "cuda-device",
            units: gpu.sm_count as usize,
            mem_bw: mem_bw.filter(|&b| b > 0.0).unwrap_or(base.mem_bw),
            scratch_per_unit: gpu.smem_per_block,
            origin: Origin::Measured,
            gpu,
            ..base
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
