//! cuBLASLt, loaded at run time: one matrix product (`cublasLtMatmul`) described once, its
//! algorithm chosen once by cuBLASLt's heuristic, then launched on our own stream with our own
//! device pointers. Only the raw C API is used (the enum values come from `cudarc`'s bindings),
//! with our own loader so that a missing library or symbol is an error, never a panic.
//!
//! The library is looked up as `$TILEC_CUBLASLT_LIB` (a path) if set, then by the sonames of
//! CUDA 13 and 12 on the dynamic linker's search path, then next to `$TILEC_NVRTC_LIB`, under
//! `$CUDA_HOME`/`$CUDA_PATH` and in `/usr/local/cuda/lib64`.
//!
//! Matrices are column-major here, as cuBLASLt sees them; `families::cublas_gemm` maps the
//! tile IR's row-major products onto this.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::cublaslt::sys as lt;
use tilec_ir::DType;

use crate::driver::{Device, DeviceBuffer, Stream};
use crate::error::{CudaError, Result};

type Status = c_int;
type Handle = *mut c_void;

/// `cublasLtMatmulHeuristicResult_t`, with the status as a plain integer.
#[repr(C)]
#[derive(Copy, Clone)]
struct HeuristicResult {
    algo: [u64; 8],
    workspace_size: usize,
    state: Status,
    waves: f32,
    reserved: [c_int; 4],
}

#[allow(clippy::type_complexity)]
struct Api {
    _lib: libloading::Library,
    path: String,
    version: usize,
    status_name: Option<unsafe extern "C" fn(Status) -> *const c_char>,
    create: unsafe extern "C" fn(*mut Handle) -> Status,
    destroy: unsafe extern "C" fn(Handle) -> Status,
    desc_create: unsafe extern "C" fn(*mut Handle, u32, u32) -> Status,
    desc_set: unsafe extern "C" fn(Handle, u32, *const c_void, usize) -> Status,
    desc_destroy: unsafe extern "C" fn(Handle) -> Status,
    layout_create: unsafe extern "C" fn(*mut Handle, u32, u64, u64, i64) -> Status,
    layout_set: unsafe extern "C" fn(Handle, u32, *const c_void, usize) -> Status,
    layout_destroy: unsafe extern "C" fn(Handle) -> Status,
    pref_create: unsafe extern "C" fn(*mut Handle) -> Status,
    pref_set: unsafe extern "C" fn(Handle, u32, *const c_void, usize) -> Status,
    pref_destroy: unsafe extern "C" fn(Handle) -> Status,
    heuristic: unsafe extern "C" fn(
        Handle, Handle, Handle, Handle, Handle, Handle, Handle, c_int, *mut HeuristicResult, *mut c_int,
    ) -> Status,
    matmul: unsafe extern "C" fn(
        Handle, Handle, *const c_void, *const c_void, Handle, *const c_void, Handle, *const c_void,
        *const c_void, Handle, *mut c_void, Handle, *const c_void, *mut c_void, usize, *mut c_void,
    ) -> Status,
}

impl Api {
    fn check(&self, s: Status, call: &'static str) -> Result<()> {
        if s == 0 {
            return Ok(());
        }
        // SAFETY: the function returns a static string or null.
        let name = self
            .status_name
            .map(|f| unsafe { f(s) })
            .filter(|p| !p.is_null())
            .map(|p| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
            .unwrap_or_else(|| "cuBLAS status".into());
        Err(CudaError::Cublas { call, msg: format!("{name} ({s})") })
    }
}

/// The loaded cuBLASLt library. Cheap to clone.
#[derive(Clone)]
pub struct CublasLt {
    api: Arc<Api>,
}

impl std::fmt::Debug for CublasLt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CublasLt({} version {})", self.api.path, self.api.version)
    }
}

fn candidates() -> Vec<String> {
    let mut c = vec![];
    let env = |v: &str| std::env::var(v).ok().filter(|p| !p.is_empty());
    c.extend(env("TILEC_CUBLASLT_LIB"));
    let names = ["libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"];
    c.extend(names.iter().map(|n| n.to_string()));
    let mut dirs = vec![];
    if let Some(nvrtc) = env("TILEC_NVRTC_LIB") {
        dirs.extend(std::path::Path::new(&nvrtc).parent().map(|d| d.display().to_string()));
    }
    dirs.extend(["CUDA_HOME", "CUDA_PATH"].iter().filter_map(|v| env(v)).map(|r| format!("{r}/lib64")));
    dirs.push("/usr/local/cuda/lib64".into());
    for d in dirs.into_iter().filter(|d| !d.is_empty()) {
        c.extend(names.iter().map(|n| format!("{d}/{n}")));
    }
    c
}

impl CublasLt {
    /// Loads cuBLASLt (once per process; later calls share it, or its error).
    pub fn load() -> Result<CublasLt> {
        static LIB: OnceLock<std::result::Result<CublasLt, String>> = OnceLock::new();
        LIB.get_or_init(Self::load_uncached).clone().map_err(CudaError::CublasUnavailable)
    }

    /// Whether cuBLASLt can be loaded.
    pub fn is_available() -> bool {
        Self::load().is_ok()
    }

    pub fn version(&self) -> usize {
        self.api.version
    }

    pub fn path(&self) -> &str {
        &self.api.path
    }

    fn load_uncached() -> std::result::Result<CublasLt, String> {
        let mut tried = vec![];
        for cand in candidates() {
            // SAFETY: loading cuBLASLt runs no initialization with preconditions.
            match unsafe { libloading::Library::new(&cand) } {
                Ok(lib) => return Self::from_library(lib, cand),
                Err(e) => tried.push(format!("{cand} ({e})")),
            }
        }
        Err(format!(
            "libcublasLt not found (set TILEC_CUBLASLT_LIB to its path); tried {}",
            tried.join(", ")
        ))
    }

    fn from_library(lib: libloading::Library, path: String) -> std::result::Result<CublasLt, String> {
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol has the C signature declared in cublasLt.h.
                *unsafe { lib.get($name.as_bytes()) }.map_err(|e| format!("{path}: missing {}: {e}", $name))?
            };
        }
        let version_fn: unsafe extern "C" fn() -> usize = sym!("cublasLtGetVersion");
        // SAFETY: no arguments.
        let version = unsafe { version_fn() };
        // SAFETY: as in `sym!`; an older library may lack it.
        let status_name = unsafe { lib.get(b"cublasLtGetStatusName") }.ok().map(|s| *s);
        let api = Api {
            path: path.clone(),
            version,
            status_name,
            create: sym!("cublasLtCreate"),
            destroy: sym!("cublasLtDestroy"),
            desc_create: sym!("cublasLtMatmulDescCreate"),
            desc_set: sym!("cublasLtMatmulDescSetAttribute"),
            desc_destroy: sym!("cublasLtMatmulDescDestroy"),
            layout_create: sym!("cublasLtMatrixLayoutCreate"),
            layout_set: sym!("cublasLtMatrixLayoutSetAttribute"),
            layout_destroy: sym!("cublasLtMatrixLayoutDestroy"),
            pref_create: sym!("cublasLtMatmulPreferenceCreate"),
            pref_set: sym!("cublasLtMatmulPreferenceSetAttribute"),
            pref_destroy: sym!("cublasLtMatmulPreferenceDestroy"),
            heuristic: sym!("cublasLtMatmulAlgoGetHeuristic"),
            matmul: sym!("cublasLtMatmul"),
            _lib: lib,
        };
        Ok(CublasLt { api: Arc::new(api) })
    }
}

/// A matrix as cuBLASLt sees it: column-major `rows x cols`, `ld` elements between columns,
/// `batch_stride` elements between batches (0: shared by every batch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatLayout {
    pub dtype: DType,
    pub rows: u64,
    pub cols: u64,
    pub ld: i64,
    pub batch_stride: i64,
}

/// `D = op(A) · op(B)` in column-major terms (`op` transposes when asked), `batch` times, f32
/// accumulation and scaling (TF32 tensor cores for f32 operands when `tf32`). D is also C
/// (beta is 0).
#[derive(Clone, Debug, PartialEq)]
pub struct LtGemm {
    pub trans_a: bool,
    pub trans_b: bool,
    pub a: MatLayout,
    pub b: MatLayout,
    pub d: MatLayout,
    pub batch: i32,
    pub tf32: bool,
}

/// The workspace cuBLASLt may use per launch (the algorithm's need is allocated at load).
pub const MAX_WORKSPACE: u64 = 32 << 20;

/// The pointer alignment every operand is guaranteed (the executor checks it per launch).
const ALIGN: u32 = 16;

fn data_type(d: DType) -> Result<u32> {
    Ok(match d {
        DType::F16 => lt::cudaDataType_t::CUDA_R_16F as u32,
        DType::BF16 => lt::cudaDataType_t::CUDA_R_16BF as u32,
        DType::F32 => lt::cudaDataType_t::CUDA_R_32F as u32,
        d => return Err(CudaError::Usage(format!("cuBLASLt: no {} matrices here", d.name()))),
    })
}

/// A product described and its algorithm chosen on a device; launched with device pointers.
pub struct LtMatmul {
    api: Arc<Api>,
    handle: Handle,
    desc: Handle,
    layouts: [Handle; 3],
    algo: [u64; 8],
    workspace: Option<DeviceBuffer>,
    /// One launch at a time on the handle.
    lock: Mutex<()>,
}

// SAFETY: the handle and descriptors are only read after construction, and launches are
// serialized by `lock`.
unsafe impl Send for LtMatmul {}
unsafe impl Sync for LtMatmul {}

impl LtMatmul {
    /// Describes `g` on `device`, asks the heuristic for an algorithm and allocates its
    /// workspace (nothing is allocated or synchronized at launch, which may be captured).
    pub fn new(lib: &CublasLt, device: &Device, g: &LtGemm) -> Result<LtMatmul> {
        device.bind()?;
        let api = lib.api.clone();
        let mut m = LtMatmul {
            api: api.clone(),
            handle: std::ptr::null_mut(),
            desc: std::ptr::null_mut(),
            layouts: [std::ptr::null_mut(); 3],
            algo: [0; 8],
            workspace: None,
            lock: Mutex::new(()),
        };
        // SAFETY: every call gets valid out-parameters and attribute buffers of the sizes the
        // attributes take (int32 operations and batch counts, int64 strides, uint64
        // workspace, uint32 alignments); `m` destroys what was created if a later call fails.
        unsafe {
            api.check((api.create)(&mut m.handle), "cublasLtCreate")?;
            let compute = if g.tf32 && g.a.dtype == DType::F32 {
                lt::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
            } else {
                lt::cublasComputeType_t::CUBLAS_COMPUTE_32F
            };
            let f32t = lt::cudaDataType_t::CUDA_R_32F as u32;
            api.check((api.desc_create)(&mut m.desc, compute as u32, f32t), "cublasLtMatmulDescCreate")?;
            use lt::cublasLtMatmulDescAttributes_t as D;
            for (attr, t) in [(D::CUBLASLT_MATMUL_DESC_TRANSA, g.trans_a), (D::CUBLASLT_MATMUL_DESC_TRANSB, g.trans_b)] {
                let op: i32 = if t { 1 } else { 0 }; // CUBLAS_OP_T, CUBLAS_OP_N
                let p = &op as *const i32 as *const c_void;
                api.check((api.desc_set)(m.desc, attr as u32, p, 4), "cublasLtMatmulDescSetAttribute")?;
            }
            use lt::cublasLtMatrixLayoutAttribute_t as L;
            for (slot, l) in [&g.a, &g.b, &g.d].into_iter().enumerate() {
                let h = &mut m.layouts[slot];
                api.check((api.layout_create)(h, data_type(l.dtype)?, l.rows, l.cols, l.ld), "cublasLtMatrixLayoutCreate")?;
                if g.batch > 1 {
                    let (count, stride) = (g.batch, l.batch_stride);
                    let set = |a: L, p: *const c_void, n| (api.layout_set)(*h, a as u32, p, n);
                    let c = &count as *const i32 as *const c_void;
                    api.check(set(L::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, c, 4), "cublasLtMatrixLayoutSetAttribute")?;
                    let s = &stride as *const i64 as *const c_void;
                    api.check(set(L::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, s, 8), "cublasLtMatrixLayoutSetAttribute")?;
                }
            }
            let mut pref: Handle = std::ptr::null_mut();
            api.check((api.pref_create)(&mut pref), "cublasLtMatmulPreferenceCreate")?;
            let chosen = m.choose(pref);
            (api.pref_destroy)(pref);
            let r = chosen?;
            m.algo = r.algo;
            if r.workspace_size > 0 {
                m.workspace = Some(device.alloc(r.workspace_size)?);
            }
        }
        Ok(m)
    }

    /// The heuristic's first algorithm for the described product (16-byte aligned pointers,
    /// at most [`MAX_WORKSPACE`]).
    unsafe fn choose(&self, pref: Handle) -> Result<HeuristicResult> {
        let api = &self.api;
        use lt::cublasLtMatmulPreferenceAttributes_t as P;
        let ws: u64 = MAX_WORKSPACE;
        let set = |a: P, p: *const c_void, n| api.check((api.pref_set)(pref, a as u32, p, n), "cublasLtMatmulPreferenceSetAttribute");
        set(P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws as *const u64 as *const c_void, 8)?;
        for a in [
            P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
            P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
            P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
        ] {
            set(a, &ALIGN as *const u32 as *const c_void, 4)?;
        }
        let mut r = HeuristicResult { algo: [0; 8], workspace_size: 0, state: 0, waves: 0.0, reserved: [0; 4] };
        let mut n: c_int = 0;
        let [a, b, d] = self.layouts;
        api.check(
            (api.heuristic)(self.handle, self.desc, a, b, d, d, pref, 1, &mut r, &mut n),
            "cublasLtMatmulAlgoGetHeuristic",
        )?;
        if n < 1 || r.state != 0 {
            return Err(CudaError::Cublas {
                call: "cublasLtMatmulAlgoGetHeuristic",
                msg: "no algorithm for this product".into(),
            });
        }
        Ok(r)
    }

    /// Enqueues `D = op(A) op(B)` on `stream` (device pointers, 16-byte aligned).
    pub fn launch(&self, stream: &Stream, a: u64, b: u64, d: u64) -> Result<()> {
        let _g = self.lock.lock().map_err(|_| CudaError::Usage("a cuBLASLt kernel's lock is poisoned".into()))?;
        let raw = stream.raw_current()? as *mut c_void;
        let (alpha, beta) = (1f32, 0f32);
        let (ws, ws_bytes) = match &self.workspace {
            Some(w) => (w.ptr() as *mut c_void, w.len()),
            None => (std::ptr::null_mut(), 0),
        };
        let [la, lb, ld] = self.layouts;
        let (a, b, d) = (a as *const c_void, b as *const c_void, d as *mut c_void);
        let api = &self.api;
        // SAFETY: descriptors and algorithm were made for these layouts; the pointers are the
        // caller's device buffers of the described shapes; alpha and beta are host f32s read
        // before the call returns.
        unsafe {
            api.check(
                (api.matmul)(
                    self.handle,
                    self.desc,
                    &alpha as *const f32 as *const c_void,
                    a,
                    la,
                    b,
                    lb,
                    &beta as *const f32 as *const c_void,
                    d,
                    ld,
                    d,
                    ld,
                    self.algo.as_ptr() as *const c_void,
                    ws,
                    ws_bytes,
                    raw,
                ),
                "cublasLtMatmul",
            )
        }
    }
}

impl Drop for LtMatmul {
    fn drop(&mut self) {
        let api = &self.api;
        // SAFETY: each handle was created by this value (or is null and skipped).
        unsafe {
            for l in self.layouts {
                if !l.is_null() {
                    (api.layout_destroy)(l);
                }
            }
            if !self.desc.is_null() {
                (api.desc_destroy)(self.desc);
            }
            if !self.handle.is_null() {
                (api.destroy)(self.handle);
            }
        }
    }
}
