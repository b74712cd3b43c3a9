//! The CPU back end: kernels rendered to C, compiled into one shared object and called on the
//! host with pointers into an arena in host memory. Gemm operands that read only constants
//! (conv weights, weight matrices) are packed once at load, through the kernel's pack function,
//! and the step calls the kernel's `__packed` entry with them.

use std::ffi::c_void;

use tilec_ir::{DType, Tensor, ValueId};
use tilec_opt::target::Target;
use tilec_runtime::Arena;
use tilec_cpu::families::CpuBuilt;
use tilec_tile::family::{Decision, Problem, Registry};
use tilec_tile::{CheckSite, Kernel};

use super::{Backend, Build, Memory, Report};
use crate::Error;

/// Builds CPU kernels through the CPU families (`tilec_cpu::families`).
pub struct CpuBuild {
    /// Apply the families' schedules (off: plain loop nests, for debugging).
    pub schedule: bool,
}

impl Build for CpuBuild {
    type Family = CpuBuilt;
    type Built = CpuBuilt;

    fn registry() -> &'static Registry<Target, CpuBuilt> {
        tilec_cpu::families::registry()
    }

    fn finish(&self, _p: &Problem, mut b: CpuBuilt, _d: &Decision) -> CpuBuilt {
        if !self.schedule {
            b.kernel = b.lowered.kernel.clone();
        }
        b
    }

    fn params(b: &CpuBuilt) -> (&[ValueId], &[ValueId]) {
        (&b.lowered.inputs, &b.lowered.outputs)
    }

    fn checks(b: &CpuBuilt) -> &[CheckSite] {
        &b.kernel.checks
    }
}

/// Bytes with 64-byte alignment.
struct AlignedBytes {
    words: Vec<u64>,
}

impl AlignedBytes {
    fn new(n: usize) -> AlignedBytes {
        AlignedBytes { words: vec![0u64; n.div_ceil(8).max(1) + 8] }
    }
    fn ptr(&self) -> *mut u8 {
        let base = self.words.as_ptr() as usize;
        (base + (64 - base % 64) % 64) as *mut u8
    }
}

/// The host CPU: the compiled module, the arena, the constants and the packed operands.
pub struct Cpu {
    compiler: tilec_cpu::Compiler,
    threads: usize,
    /// Never unloaded: every thread that ran its kernels keeps the library's per-thread scratch
    /// (`tc_scratch`), which unloading would leak.
    module: Option<std::mem::ManuallyDrop<tilec_cpu::Module>>,
    arena: Option<Arena>,
    consts: Vec<AlignedBytes>,
    /// Constant gemm operands in the layout of the kernels that read them.
    packed: Vec<AlignedBytes>,
}

impl Cpu {
    pub fn new(cache_dir: Option<std::path::PathBuf>, threads: usize) -> Cpu {
        let mut cc = tilec_cpu::CompileOptions::default();
        if cache_dir.is_some() {
            cc.cache_dir = cache_dir;
        }
        Cpu { compiler: tilec_cpu::Compiler::new(cc), threads, module: None, arena: None, consts: vec![], packed: vec![] }
    }

    /// The compiled module (absent when the graph is interpreted).
    pub fn module(&self) -> Option<&tilec_cpu::Module> {
        self.module.as_deref()
    }

    fn arena(&self) -> Result<&Arena, Error> {
        self.arena.as_ref().ok_or_else(|| Error::Compile("the arena is not allocated".into()))
    }

    /// `len` bytes of the arena at `offset`, checked, as a pointer.
    fn span(&self, offset: usize, len: usize) -> Result<*mut u8, Error> {
        let a = self.arena()?;
        a.bytes(offset, len).map_err(|e| Error::Compile(e.to_string()))?;
        a.try_ptr(offset).map_err(|e| Error::Compile(e.to_string()))
    }
}

/// The CPU back end reads and writes host memory only.
fn host_only(mem: Memory) -> Result<(), Error> {
    match mem {
        Memory::Host => Ok(()),
        Memory::Device(d) => Err(Error::Compile(format!(
            "a tensor in the memory of GPU {d} was given to a model compiled for the CPU (move it to the host, or compile for cuda)"
        ))),
    }
}

/// A kernel bound to its arguments.
pub enum CpuKernel {
    Plain { func: tilec_cpu::KernelFn, ptrs: Vec<*mut c_void> },
    /// Some gemm operands packed at load: `packed[s]` is slot `s`'s (null: packed per call).
    Prepacked { func: tilec_cpu::PackedKernelFn, ptrs: Vec<*mut c_void>, packed: Vec<*mut c_void> },
}

impl Backend for Cpu {
    type Build = CpuBuild;
    type Loaded = tilec_cpu::KernelFn;
    type Bound = CpuKernel;
    const ALIGN: usize = 64;

    fn load(&mut self, kernels: &[CpuBuilt], report: &mut Report) -> Result<Vec<Result<Self::Loaded, String>>, Error> {
        let ks: Vec<Kernel> = kernels.iter().map(|k| k.kernel.clone()).collect();
        let module = self.compiler.compile(&ks).map_err(|e| Error::Compile(e.to_string()))?;
        module.set_threads(self.threads);
        let stats = module.stats();
        report.unique_kernels = stats.unique;
        report.cache_hits = if stats.cache_hit { stats.unique } else { 0 };
        let out = ks
            .iter()
            .map(|k| module.get(&k.name).ok_or_else(|| format!("kernel {} is missing from the compiled module", k.name)))
            .collect();
        self.module = Some(std::mem::ManuallyDrop::new(module));
        Ok(out)
    }

    fn alloc(&mut self, bytes: usize) -> Result<(), Error> {
        self.arena = Some(Arena::new(bytes.max(Self::ALIGN)).map_err(|e| Error::Compile(e.to_string()))?);
        Ok(())
    }

    fn constant(&mut self, _name: &str, t: &Tensor) -> Result<u64, Error> {
        let bytes = t.to_le_bytes();
        let buf = AlignedBytes::new(bytes.len());
        // SAFETY: the buffer holds at least `bytes.len()` bytes after its aligned start.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.ptr(), bytes.len()) };
        let p = buf.ptr() as u64;
        self.consts.push(buf);
        Ok(p)
    }

    fn base(&self) -> u64 {
        self.arena.as_ref().map_or(0, |a| a.ptr(0) as u64)
    }

    fn bind(&mut self, func: Self::Loaded, name: &str, ptrs: Vec<u64>, constant: &[bool]) -> Result<CpuKernel, Error> {
        let ptrs: Vec<*mut c_void> = ptrs.into_iter().map(|p| p as *mut c_void).collect();
        let Some(module) = self.module.as_deref() else { return Ok(CpuKernel::Plain { func, ptrs }) };
        let Some((packed_func, pack)) = module.get_packed(name) else { return Ok(CpuKernel::Plain { func, ptrs }) };
        let mut packed = vec![];
        for (i, slot) in module.packs(name).iter().enumerate() {
            if !slot.params.iter().all(|&p| constant.get(p) == Some(&true)) {
                packed.push(std::ptr::null_mut());
                continue;
            }
            let buf = AlignedBytes::new(slot.bytes);
            // SAFETY: the pack function reads only the slot's (constant, live) parameters and
            // writes `slot.bytes` bytes at the 64-byte-aligned buffer.
            unsafe { pack(ptrs.as_ptr(), i as i64, buf.ptr() as *mut c_void) };
            packed.push(buf.ptr() as *mut c_void);
            self.packed.push(buf);
        }
        if packed.iter().all(|p| p.is_null()) {
            return Ok(CpuKernel::Plain { func, ptrs });
        }
        Ok(CpuKernel::Prepacked { func: packed_func, ptrs, packed })
    }

    fn write(&self, offset: usize, t: &Tensor) -> Result<(), Error> {
        let n = t.numel() * t.dtype().size_bytes();
        let p = self.span(offset, n)?;
        // SAFETY: the span lies in the arena and nothing else refers to it during the copy.
        t.write_le_bytes(unsafe { std::slice::from_raw_parts_mut(p, n) });
        Ok(())
    }

    fn read(&self, offset: usize, dtype: DType, shape: &[usize]) -> Result<Tensor, Error> {
        let n = shape.iter().product::<usize>() * dtype.size_bytes();
        let bytes = self.arena()?.bytes(offset, n).map_err(|e| Error::Compile(e.to_string()))?;
        Tensor::from_le_bytes(dtype, shape.to_vec(), bytes).map_err(|e| Error::Compile(e.to_string()))
    }

    unsafe fn write_raw(&self, offset: usize, src: u64, len: usize, mem: Memory) -> Result<(), Error> {
        host_only(mem)?;
        let p = self.span(offset, len)?;
        // SAFETY: the span lies in the arena; the caller vouches for `src`.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, p, len) };
        Ok(())
    }

    unsafe fn read_raw(&self, offset: usize, dst: u64, len: usize, mem: Memory) -> Result<(), Error> {
        host_only(mem)?;
        let p = self.span(offset, len)?;
        // SAFETY: as in `write_raw`.
        unsafe { std::ptr::copy_nonoverlapping(p as *const u8, dst as *mut u8, len) };
        Ok(())
    }

    fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<(), Error> {
        let p = self.span(offset, len)?;
        // SAFETY: as in `write`.
        unsafe { std::ptr::write_bytes(p, byte, len) };
        Ok(())
    }

    fn launch(&self, k: &CpuKernel, _name: &str) -> Result<(), Error> {
        match k {
            // SAFETY: the kernel was generated for exactly these buffers (dtypes and shapes
            // checked at compile time); each pointer addresses a live slot.
            CpuKernel::Plain { func, ptrs } => unsafe { func(ptrs.as_ptr()) },
            // SAFETY: as above; each non-null packed entry holds its slot's operand, packed
            // from the same constants at load.
            CpuKernel::Prepacked { func, ptrs, packed } => unsafe { func(ptrs.as_ptr(), packed.as_ptr()) },
        }
        Ok(())
    }

    fn sync(&self) -> Result<(), Error> {
        Ok(())
    }
}

impl super::Executor<Cpu> {
    /// The compiled module (absent when the graph is interpreted).
    pub fn module(&self) -> Option<&tilec_cpu::Module> {
        self.backend.module()
    }
}
