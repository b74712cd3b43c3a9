//! Run-time compilation of CUDA C++ with NVRTC, loaded at run time, with a disk cache.
//!
//! The library is looked up as `$TILEC_NVRTC_LIB` (a path) if set, then by the sonames of CUDA
//! 13, 12 and 11 on the dynamic linker's search path (`LD_LIBRARY_PATH`), then under
//! `$CUDA_HOME`/`$CUDA_PATH`. NVRTC 12 and later have `cuda_fp16.h` and `cuda_bf16.h` built in,
//! so no include path is needed.
//!
//! Compiled images are cached (`tilec_runtime::cache`) in the `cuda` folder of the kernel
//! cache directory, named by a digest of the source, the architecture, the NVRTC library
//! (path and version) and the options, and verified before use.

use std::ffi::{c_char, c_int, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use tilec_runtime::cache::{Cache, Key};

/// Stack of each NVRTC worker thread.
const COMPILE_STACK_BYTES: usize = 64 << 20;

use crate::error::{CudaError, Result};

type NvrtcResult = c_int;
type Program = *mut std::ffi::c_void;

#[allow(clippy::type_complexity)]
struct Api {
    _lib: libloading::Library,
    /// `libnvrtc-builtins` from the directory of an explicitly given NVRTC, loaded first so
    /// that NVRTC finds it without a search path.
    _builtins: Option<libloading::Library>,
    path: String,
    version: (i32, i32),
    get_error_string: unsafe extern "C" fn(NvrtcResult) -> *const c_char,
    create: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> NvrtcResult,
    compile: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> NvrtcResult,
    destroy: unsafe extern "C" fn(*mut Program) -> NvrtcResult,
    log_size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    log: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
    cubin_size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    cubin: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
    ptx_size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    ptx: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
}

/// A loaded NVRTC library. Cheap to clone.
#[derive(Clone)]
pub struct Nvrtc {
    api: Arc<Api>,
}

impl std::fmt::Debug for Nvrtc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Nvrtc({} {}.{})",
            self.api.path, self.api.version.0, self.api.version.1
        )
    }
}

fn candidates() -> Vec<String> {
    let mut c = vec![];
    if let Ok(p) = std::env::var("TILEC_NVRTC_LIB") {
        if !p.is_empty() {
            c.push(p);
        }
    }
    for name in [
        "libnvrtc.so.13",
        "libnvrtc.so.12",
        "libnvrtc.so",
        "libnvrtc.so.11.2",
    ] {
        c.push(name.to_string());
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Ok(root) = std::env::var(var) {
            for name in ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"] {
                c.push(format!("{root}/lib64/{name}"));
            }
        }
    }
    c
}

impl Nvrtc {
    /// Loads NVRTC (once per process; later calls share it).
    pub fn load() -> Result<Nvrtc> {
        static LIB: OnceLock<std::result::Result<Nvrtc, String>> = OnceLock::new();
        LIB.get_or_init(Self::load_uncached)
            .clone()
            .map_err(CudaError::NvrtcUnavailable)
    }

    /// Whether NVRTC can be loaded.
    pub fn is_available() -> bool {
        Self::load().is_ok()
    }

    fn load_uncached() -> std::result::Result<Nvrtc, String> {
        let mut tried = vec![];
        for cand in candidates() {
            let builtins = preload_builtins(&cand);
            // SAFETY: loading NVRTC runs no initialization with preconditions.
            match unsafe { libloading::Library::new(&cand) } {
                Ok(lib) => return Self::from_library(lib, builtins, cand),
                Err(e) => tried.push(format!("{cand} ({e})")),
            }
        }
        Err(format!("libnvrtc not found; tried {}", tried.join(", ")))
    }

    fn from_library(
        lib: libloading::Library,
        builtins: Option<libloading::Library>,
        path: String,
    ) -> std::result::Result<Nvrtc, String> {
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol has the C signature declared in nvrtc.h.
                *unsafe { lib.get($name.as_bytes()) }
                    .map_err(|e| format!("{path}: missing {}: {e}", $name))?
            };
        }
        let version_fn: unsafe extern "C" fn(*mut c_int, *mut c_int) -> NvrtcResult =
            sym!("nvrtcVersion");
        let (mut major, mut minor) = (0, 0);
        // SAFETY: two out-parameters.
        if unsafe { version_fn(&mut major, &mut minor) } != 0 {
            return Err(format!("{path}: nvrtcVersion failed"));
        }
        let api = Api {
            path: path.clone(),
            version: (major, minor),
            get_error_string: sym!("nvrtcGetErrorString"),
            create: sym!("nvrtcCreateProgram"),
            compile: sym!("nvrtcCompileProgram"),
            destroy: sym!("nvrtcDestroyProgram"),
            log_size: sym!("nvrtcGetProgramLogSize"),
            log: sym!("nvrtcGetProgramLog"),
            cubin_size: sym!("nvrtcGetCUBINSize"),
            cubin: sym!("nvrtcGetCUBIN"),
            ptx_size: sym!("nvrtcGetPTXSize"),
            ptx: sym!("nvrtcGetPTX"),
            _lib: lib,
            _builtins: builtins,
        };
        Ok(Nvrtc { api: Arc::new(api) })
    }

    /// NVRTC's version (major, minor).
    pub fn version(&self) -> (i32, i32) {
        self.api.version
    }

    /// Where the library was loaded from.
    pub fn path(&self) -> &str {
        &self.api.path
    }

    fn err(&self, call: &'static str, module: &str, r: NvrtcResult, log: &str) -> CudaError {
        // SAFETY: returns a static string.
        let s = unsafe { (self.api.get_error_string)(r) };
        let name = if s.is_null() {
            format!("error {r}")
        } else {
            // SAFETY: NUL-terminated static string.
            unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
        };
        let msg = if log.trim().is_empty() {
            name
        } else {
            format!("{name}\n{}", log.trim_end())
        };
        CudaError::Nvrtc {
            call,
            module: module.to_string(),
            msg,
        }
    }

    /// Compiles `source` (module name `name`) with `options`; returns the cubin when
    /// `want_cubin` (the architecture must then be a real `sm_XX`), else the PTX.
    pub fn compile_raw(
        &self,
        name: &str,
        source: &str,
        options: &[String],
        want_cubin: bool,
    ) -> Result<Vec<u8>> {
        let bad =
            |what: &str| CudaError::Usage(format!("module {name}: {what} contains a NUL byte"));
        let csrc = CString::new(source).map_err(|_| bad("source"))?;
        let cname = CString::new(format!("{name}.cu")).map_err(|_| bad("name"))?;
        let copts: Vec<CString> = options
            .iter()
            .map(|o| CString::new(o.as_str()))
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| bad("an option"))?;
        let optp: Vec<*const c_char> = copts.iter().map(|o| o.as_ptr()).collect();
        let api = &self.api;
        let mut prog: Program = std::ptr::null_mut();
        // SAFETY: pointers valid for the call; no headers passed.
        let r = unsafe {
            (api.create)(
                &mut prog,
                csrc.as_ptr(),
                cname.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        if r != 0 {
            return Err(self.err("nvrtcCreateProgram", name, r, ""));
        }
        struct Guard<'a>(&'a Api, Program);
        impl Drop for Guard<'_> {
            fn drop(&mut self) {
                // SAFETY: program created above.
                unsafe {
                    (self.0.destroy)(&mut self.1);
                }
            }
        }
        let g = Guard(api, prog);
        // SAFETY: valid program and options.
        let r = unsafe { (api.compile)(g.1, optp.len() as c_int, optp.as_ptr()) };
        let log = self.log(g.1);
        if r != 0 {
            return Err(self.err("nvrtcCompileProgram", name, r, &log));
        }
        let (size_fn, get_fn, call) = if want_cubin {
            (api.cubin_size, api.cubin, "nvrtcGetCUBIN")
        } else {
            (api.ptx_size, api.ptx, "nvrtcGetPTX")
        };
        let mut n = 0usize;
        // SAFETY: valid program.
        let r = unsafe { size_fn(g.1, &mut n) };
        if r != 0 {
            return Err(self.err(call, name, r, ""));
        }
        let mut out = vec![0u8; n];
        // SAFETY: buffer of the reported size.
        let r = unsafe { get_fn(g.1, out.as_mut_ptr() as *mut c_char) };
        if r != 0 {
            return Err(self.err(call, name, r, ""));
        }
        if !want_cubin {
            while out.last() == Some(&0) {
                out.pop();
            }
        }
        Ok(out)
    }

    fn log(&self, prog: Program) -> String {
        let mut n = 0usize;
        // SAFETY: valid program.
        if unsafe { (self.api.log_size)(prog, &mut n) } != 0 || n == 0 {
            return String::new();
        }
        let mut buf = vec![0u8; n];
        // SAFETY: buffer of the reported size.
        if unsafe { (self.api.log)(prog, buf.as_mut_ptr() as *mut c_char) } != 0 {
            return String::new();
        }
        String::from_utf8_lossy(&buf)
            .trim_end_matches('\0')
            .to_string()
    }
}

/// For an NVRTC given by path, loads the `libnvrtc-builtins.so.*` beside it (NVRTC opens it by
/// soname at compile time, which then resolves to the loaded copy).
fn preload_builtins(cand: &str) -> Option<libloading::Library> {
    let dir = Path::new(cand)
        .parent()
        .filter(|d| !d.as_os_str().is_empty())?;
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libnvrtc-builtins.so") && !n.contains(".alt."))
        })
        .collect();
    names.sort();
    // SAFETY: the builtins library has no initialization with preconditions.
    names
        .iter()
        .rev()
        .find_map(|p| unsafe { libloading::Library::new(p) }.ok())
}

/// The cache directory: the `cuda` folder of the kernel cache directory
/// (`tilec_runtime::cache::default_dir`: `$TILEC_CACHE_DIR`, `$XDG_CACHE_HOME/tilec`,
/// `~/.cache/tilec`, else a per-user folder in the temporary directory).
pub fn default_cache_dir() -> Option<PathBuf> {
    Some(tilec_runtime::cache::default_dir().join("cuda"))
}

/// The outcome of one compilation.
#[derive(Clone, Debug)]
pub struct Compiled {
    pub name: String,
    /// A cubin (ELF) for the target architecture, or PTX text when [`Output::Ptx`] was asked.
    pub image: Vec<u8>,
    /// Whether the image came from the disk cache.
    pub cache_hit: bool,
}

/// What the compiler produces.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Output {
    Cubin,
    Ptx,
}

/// Compiles CUDA C++ modules for one architecture, with a disk cache.
#[derive(Clone, Debug)]
pub struct Compiler {
    nvrtc: Nvrtc,
    arch: String,
    options: Vec<String>,
    output: Output,
    cache_dir: Option<PathBuf>,
    /// `cache_dir`, opened on the first compile (`None` if it could not be).
    cache: Arc<OnceLock<Option<Cache>>>,
}

impl Compiler {
    /// A compiler for `arch` (e.g. `sm_90a`) producing cubins, cached in the default
    /// directory.
    pub fn new(nvrtc: Nvrtc, arch: &str) -> Compiler {
        let options = vec![
            format!("--gpu-architecture={arch}"),
            "-std=c++17".to_string(),
            // Full device optimization (the default, stated so it is part of the cache key).
            "--dopt=on".to_string(),
            "--fmad=true".to_string(),
        ];
        Compiler {
            nvrtc,
            arch: arch.to_string(),
            options,
            output: Output::Cubin,
            cache_dir: default_cache_dir(),
            cache: Arc::default(),
        }
    }

    /// Compiles to PTX instead of cubin.
    pub fn with_output(mut self, output: Output) -> Compiler {
        self.output = output;
        self
    }

    /// Uses `dir` as the cache (None: no cache).
    pub fn with_cache_dir(mut self, dir: Option<PathBuf>) -> Compiler {
        self.cache_dir = dir;
        self.cache = Arc::default();
        self
    }

    /// Appends an NVRTC option.
    pub fn with_option(mut self, opt: &str) -> Compiler {
        self.options.push(opt.to_string());
        self
    }

    pub fn arch(&self) -> &str {
        &self.arch
    }
    pub fn options(&self) -> &[String] {
        &self.options
    }
    pub fn cache_dir(&self) -> Option<&Path> {
        self.cache_dir.as_deref()
    }

    fn cache(&self) -> Option<&Cache> {
        self.cache
            .get_or_init(|| {
                let dir = self.cache_dir.as_ref()?;
                Cache::open(dir)
                    .map_err(|e| {
                        tilec_runtime::cache::warn_once(
                            "cache-open",
                            format_args!("no kernel cache ({e}); compiling every kernel"),
                        )
                    })
                    .ok()
            })
            .as_ref()
    }

    fn key(&self, source: &str) -> Key {
        let (ma, mi) = self.nvrtc.version();
        let kind = match self.output {
            Output::Cubin => "cuda-cubin",
            Output::Ptx => "cuda-ptx",
        };
        let compiler = format!("nvrtc {ma}.{mi} ({})", self.nvrtc.path());
        let mut key = Key::builder(kind, &compiler).part(&self.arch);
        for o in &self.options {
            key = key.part(o);
        }
        key.part(source).finish()
    }

    /// Compiles one module (or takes it from the cache).
    ///
    /// Every kernel of the module first waits for the previous kernel of its stream
    /// ([`crate::pdl`]).
    pub fn compile(&self, name: &str, source: &str) -> Result<Compiled> {
        let source = &*crate::pdl::inject(source);
        let ext = match self.output {
            Output::Cubin => "cubin.tilec",
            Output::Ptx => "ptx.tilec",
        };
        let cache = self.cache().map(|c| (c, self.key(source)));
        if let Some((c, key)) = &cache {
            if let Some(image) = c.get(key, ext) {
                return Ok(Compiled {
                    name: name.to_string(),
                    image,
                    cache_hit: true,
                });
            }
        }
        let image =
            self.nvrtc
                .compile_raw(name, source, &self.options, self.output == Output::Cubin)?;
        if let Some((c, key)) = &cache {
            c.put(key, ext, &image);
        }
        Ok(Compiled {
            name: name.to_string(),
            image,
            cache_hit: false,
        })
    }

    /// Compiles several modules on parallel threads; results in input order.
    pub fn compile_many(&self, modules: &[(String, String)]) -> Vec<Result<Compiled>> {
        // Identical sources (kernel-family instances of repeated layers) compile once.
        let mut first: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
        let mut unique: Vec<(String, String)> = vec![];
        let mut which = vec![];
        for (name, src) in modules {
            let u = *first.entry(src.as_str()).or_insert_with(|| {
                unique.push((name.clone(), src.clone()));
                unique.len() - 1
            });
            which.push(u);
        }
        if unique.len() < modules.len() {
            let done = self.compile_unique(&unique);
            return which
                .into_iter()
                .zip(modules)
                .map(|(u, (name, _))| match &done[u] {
                    Ok(c) => Ok(Compiled { name: name.clone(), ..c.clone() }),
                    Err(e) => Err(CudaError::Usage(format!("module {name}: {e}"))),
                })
                .collect();
        }
        self.compile_unique(modules)
    }

    fn compile_unique(&self, modules: &[(String, String)]) -> Vec<Result<Compiled>> {
        let threads = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .min(modules.len())
            .max(1);
        let next = std::sync::atomic::AtomicUsize::new(0);
        let mut results: Vec<Option<Result<Compiled>>> = (0..modules.len()).map(|_| None).collect();
        let slots: Vec<std::sync::Mutex<&mut Option<Result<Compiled>>>> =
            results.iter_mut().map(std::sync::Mutex::new).collect();
        std::thread::scope(|s| {
            for _ in 0..threads {
                // NVRTC's front end recurses over nested expressions: a large stack, as the
                // main thread of a compiler would have.
                let worker = std::thread::Builder::new().stack_size(COMPILE_STACK_BYTES);
                let spawned = worker.spawn_scoped(s, || loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= modules.len() {
                        break;
                    }
                    let r = self.compile(&modules[i].0, &modules[i].1);
                    **slots[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
                });
                if spawned.is_err() {
                    // Modules left over report "not compiled" below.
                    break;
                }
            }
        });
        drop(slots);
        results
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                r.unwrap_or_else(|| {
                    Err(CudaError::Usage(format!(
                        "module {}: not compiled",
                        modules[i].0
                    )))
                })
            })
            .collect()
    }
}
