//! The CPU back end: renders tile-IR kernels to C (with a BLIS-style GEMM template for
//! `Stmt::Gemm`), compiles them with the system C compiler into a cached shared library, and
//! loads it. Parallel regions run on the process's thread pool ([`pool`]).
//!
//! ```text
//! render_c(&kernel)              -> C source of one kernel
//! Compiler::new(opts).compile(&kernels) -> Module
//! module.get("name")             -> KernelFn = unsafe extern "C" fn(*const *mut c_void)
//! ```

pub mod compiler;
pub mod cpuinfo;
pub mod families;
pub mod gemm;
pub mod pool;
mod prepare;
mod region;
pub mod render;

pub use compiler::{
    default_cache_dir, default_flags, tensor_ptr, CompileError, CompileOptions, CompileStats,
    Compiler, KernelFn, Module, PackFn, PackedKernelFn,
};
pub use cpuinfo::CpuInfo;
pub use gemm::{gemm_params, PackOperand, PackSlot};
pub use render::{
    c_symbol, render_c, render_c_with, render_function, render_function_packs, RenderError,
    RenderOptions,
};
