//! Compiling kernels to a shared library: rendering, deduplication, parallel `cc` runs, the
//! kernel cache (`tilec_runtime::cache`) and loading.

use std::collections::{BTreeMap, HashMap};
use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tilec_ir::{DType, Tensor};
use tilec_runtime::cache::{hex, Cache, Key};
use tilec_tile::ir::Kernel;

use crate::cpuinfo::CpuInfo;
use crate::gemm::PackSlot;
use crate::render::{render_function_packs, RenderError, RenderOptions, PRELUDE};

/// A compiled kernel: `args[i]` points at the first element of the kernel's `i`-th parameter.
pub type KernelFn = unsafe extern "C" fn(*const *mut c_void);

/// A kernel reading prepacked gemm operands: `packed[s]` is slot `s`'s packed operand, or null
/// (then the kernel packs that operand itself). See [`Module::packs`].
pub type PackedKernelFn = unsafe extern "C" fn(*const *mut c_void, *const *mut c_void);

/// Packs slot `slot`'s gemm operand from the kernel's arguments into `dst`
/// ([`PackSlot::bytes`] long, 64-byte aligned).
pub type PackFn = unsafe extern "C" fn(*const *mut c_void, i64, *mut c_void);

/// Bumped whenever the generated code's conventions change, to invalidate cached libraries.
pub const FORMAT_VERSION: &str = "tilec-cpu-3";
/// Extension of cached libraries (a cache header, then the shared object).
const ENTRY_EXT: &str = "so.tilec";

/// How kernels are compiled.
#[derive(Clone, Debug)]
pub struct CompileOptions {
    /// The C compiler (`$CC`, else `cc`).
    pub cc: String,
    /// Flags for every compile (see [`default_flags`]).
    pub flags: Vec<String>,
    /// Where compiled libraries are cached; `None` picks [`default_cache_dir`]. A directory
    /// that cannot be trusted or written is replaced by a private temporary one (a warning).
    pub cache_dir: Option<PathBuf>,
    /// Parallel compiler processes (and translation units).
    pub jobs: usize,
    /// The CPU the code is generated for (must match what `flags` target).
    pub cpu: CpuInfo,
    /// Gemms with fewer multiply-adds than this run single-threaded.
    pub gemm_parallel_min_flops: i64,
    /// Parallel loops with less estimated work than this (`region::loop_work`: loads, stores
    /// and arithmetic, all iterations) run single-threaded; `$TILEC_LOOP_PARALLEL_MIN_WORK`
    /// overrides the default (0: every parallel loop is a region, as before).
    pub loop_parallel_min_work: i64,
    /// Also keep the generated C sources next to the cached library (`<library>.unitN.c`).
    pub keep_sources: bool,
}

/// `-O3 -march=native -fopenmp-simd` and friends; no `-ffast-math` (NaN semantics must hold).
/// `-fopenmp-simd` honours the `omp simd` vectorization hints without the OpenMP runtime:
/// parallel regions run on [`crate::pool`].
/// With AVX-512, loops gcc vectorizes by itself use full 64-byte vectors (it prefers 32-byte
/// ones on current cores, where the wider ones no longer lower the clock much).
pub fn default_flags() -> Vec<String> {
    let mut f: Vec<String> = [
        "-std=gnu11",
        "-O3",
        "-march=native",
        "-fopenmp-simd",
        "-fno-math-errno",
        "-fno-trapping-math",
        "-fPIC",
        "-w",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if CpuInfo::host().avx512f {
        f.push("-mprefer-vector-width=512".into());
    }
    f
}

/// `$TILEC_CACHE_DIR`, else `$XDG_CACHE_HOME/tilec`, else `$HOME/.cache/tilec`, else
/// `tilec-<uid>` in the system's temporary directory (see `tilec_runtime::cache`).
pub fn default_cache_dir() -> PathBuf {
    tilec_runtime::cache::default_dir()
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            cc: std::env::var("CC")
                .ok()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "cc".into()),
            flags: default_flags(),
            cache_dir: None,
            jobs: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            cpu: CpuInfo::host(),
            gemm_parallel_min_flops: 1 << 18,
            loop_parallel_min_work: std::env::var("TILEC_LOOP_PARALLEL_MIN_WORK")
                .ok()
                .and_then(|v| v.trim().parse::<i64>().ok())
                .unwrap_or(crate::region::LOOP_PARALLEL_MIN_WORK),
            keep_sources: std::env::var_os("TILEC_KEEP_SOURCES")
                .is_some_and(|v| !v.is_empty() && v != "0"),
        }
    }
}

/// What a compilation did.
#[derive(Clone, Debug, Default)]
pub struct CompileStats {
    /// Kernels asked for.
    pub kernels: usize,
    /// Distinct kernels after deduplication.
    pub unique: usize,
    /// Translation units compiled (0 on a cache hit).
    pub units: usize,
    /// The library came from the cache.
    pub cache_hit: bool,
    pub render_time: Duration,
    /// Time in the C compiler and linker (zero on a cache hit).
    pub compile_time: Duration,
    /// Everything, including loading.
    pub total_time: Duration,
    /// The cache entry of the library (loaded from a verified private copy).
    pub library: PathBuf,
}

/// Errors of [`Compiler::compile`].
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error(transparent)]
    Render(#[from] RenderError),
    #[error("two kernels are named {0:?}")]
    DuplicateName(String),
    #[error("C compiler failed on kernels [{}] ({command}):\n{stderr}", kernels.join(", "))]
    Cc {
        kernels: Vec<String>,
        command: String,
        stderr: String,
    },
    #[error("cannot run the C compiler {cc:?}: {msg}")]
    NoCompiler { cc: String, msg: String },
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("cannot load {path}: {msg}")]
    Load { path: PathBuf, msg: String },
    #[error("kernel {kernel}: {msg}")]
    Call { kernel: String, msg: String },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> CompileError {
    let what = what.into();
    move |source| CompileError::Io { what, source }
}

/// Compiles kernels into loadable modules. Cheap to share; counts cache hits and misses.
pub struct Compiler {
    opts: CompileOptions,
    cc_version: OnceLock<Result<String, String>>,
    /// Opened on the first compile.
    cache: OnceLock<Result<Cache, (std::io::ErrorKind, String)>>,
    hits: std::sync::atomic::AtomicUsize,
    misses: std::sync::atomic::AtomicUsize,
}

/// A loaded library of compiled kernels.
pub struct Module {
    // Function pointers below stay valid while the library is loaded.
    fns: HashMap<String, KernelFn>,
    /// Per kernel with packable gemm operands: the slots and the packed/pack entry points.
    packed: HashMap<String, (Vec<PackSlot>, PackedKernelFn, PackFn)>,
    set_threads: Option<unsafe extern "C" fn(i32)>,
    stats: CompileStats,
    params: HashMap<String, Vec<(DType, i64)>>,
    _lib: libloading::Library,
}

impl std::fmt::Debug for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Module")
            .field("kernels", &self.fns.len())
            .field("stats", &self.stats)
            .finish()
    }
}

struct Unit {
    source: String,
    kernels: Vec<String>,
}

impl Compiler {
    pub fn new(opts: CompileOptions) -> Compiler {
        Compiler {
            opts,
            cc_version: OnceLock::new(),
            cache: OnceLock::new(),
            hits: 0.into(),
            misses: 0.into(),
        }
    }

    pub fn options(&self) -> &CompileOptions {
        &self.opts
    }

    /// (cache hits, cache misses) so far.
    pub fn cache_counts(&self) -> (usize, usize) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.hits.load(Relaxed), self.misses.load(Relaxed))
    }

    /// The C compiler's `--version` output (run once).
    pub fn cc_version(&self) -> Result<String, CompileError> {
        self.cc_version
            .get_or_init(
                || match Command::new(&self.opts.cc).arg("--version").output() {
                    Ok(o) if o.status.success() => {
                        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
                    }
                    Ok(o) => Err(String::from_utf8_lossy(&o.stderr).into_owned()),
                    Err(e) => Err(e.to_string()),
                },
            )
            .clone()
            .map_err(|msg| CompileError::NoCompiler {
                cc: self.opts.cc.clone(),
                msg,
            })
    }

    fn cache(&self) -> Result<&Cache, CompileError> {
        self.cache
            .get_or_init(|| {
                let dir = self.opts.cache_dir.clone().unwrap_or_else(default_cache_dir);
                Cache::open(&dir).map_err(|e| (e.kind(), e.to_string()))
            })
            .as_ref()
            .map_err(|(kind, msg)| CompileError::Io {
                what: "opening the kernel cache".into(),
                source: std::io::Error::new(*kind, msg.clone()),
            })
    }

    /// Renders, compiles (or finds in the cache) and loads `kernels`.
    pub fn compile(&self, kernels: &[Kernel]) -> Result<Module, CompileError> {
        let t0 = Instant::now();
        let ropts = RenderOptions {
            cpu: self.opts.cpu.clone(),
            gemm_parallel_min_flops: self.opts.gemm_parallel_min_flops,
            loop_parallel_min_work: self.opts.loop_parallel_min_work,
        };
        // Render each kernel under a canonical name; identical bodies share one symbol.
        let mut by_hash: BTreeMap<String, (String, Vec<String>)> = BTreeMap::new();
        let mut symbol_of: HashMap<String, String> = HashMap::new();
        let mut params = HashMap::new();
        let mut packs: HashMap<String, Vec<PackSlot>> = HashMap::new();
        for k in kernels {
            if symbol_of.contains_key(&k.name) {
                return Err(CompileError::DuplicateName(k.name.clone()));
            }
            let (body, slots) = render_function_packs(k, "TC_KERNEL_NAME", &ropts)?;
            if !slots.is_empty() {
                packs.insert(k.name.clone(), slots);
            }
            let hash = hex(&Sha256::digest(body.as_bytes()))[..24].to_string();
            let sym = format!("tk_{hash}");
            symbol_of.insert(k.name.clone(), sym.clone());
            params.insert(
                k.name.clone(),
                k.params
                    .iter()
                    .map(|&p| (k.buf(p).dtype, k.buf(p).numel()))
                    .collect(),
            );
            by_hash
                .entry(sym)
                .or_insert_with(|| (body, vec![]))
                .1
                .push(k.name.clone());
        }
        let render_time = t0.elapsed();

        // Split into translation units of similar size.
        let jobs = self.opts.jobs.max(1).min(by_hash.len().max(1));
        let mut units: Vec<Unit> = (0..jobs)
            .map(|_| Unit {
                source: String::new(),
                kernels: vec![],
            })
            .collect();
        let mut entries: Vec<(&String, &(String, Vec<String>))> = by_hash.iter().collect();
        entries.sort_by(|a, b| b.1 .0.len().cmp(&a.1 .0.len()).then(a.0.cmp(b.0)));
        for (sym, (body, names)) in entries {
            let u = units
                .iter_mut()
                .min_by_key(|u| u.source.len())
                .expect("at least one unit");
            u.source.push_str(&body.replace("TC_KERNEL_NAME", sym));
            u.source.push('\n');
            u.kernels.extend(names.iter().cloned());
        }
        for u in &mut units {
            u.source = format!("{PRELUDE}\n{}", u.source);
        }
        // Units are deterministic given the set of unique kernels.

        let version = self.cc_version()?;
        let first_line = version.lines().next().unwrap_or("").trim();
        let mut key = Key::builder("cpu-library", &format!("{} ({first_line})", self.opts.cc))
            .part(FORMAT_VERSION)
            .part(&version);
        for f in &self.opts.flags {
            key = key.part(f);
        }
        key = key
            .part(format!("{:?}", self.opts.cpu))
            .part(host_cpu_id())
            .part(PRELUDE);
        // The set of kernel bodies decides the library, not how they are split into units.
        for (sym, (body, _)) in &by_hash {
            key = key.part(sym).part(body);
        }
        let key = key.finish();
        let cache = self.cache()?;
        let lib_path = cache.entry_path(&key, ENTRY_EXT);

        let mut stats = CompileStats {
            kernels: kernels.len(),
            unique: by_hash.len(),
            render_time,
            library: lib_path.clone(),
            ..Default::default()
        };
        use std::sync::atomic::Ordering::Relaxed;
        let library = match cache.get(&key, ENTRY_EXT) {
            Some(bytes) => {
                stats.cache_hit = true;
                self.hits.fetch_add(1, Relaxed);
                bytes
            }
            None => {
                self.misses.fetch_add(1, Relaxed);
                let tc = Instant::now();
                let bytes = self.build(&units, cache, &lib_path)?;
                stats.compile_time = tc.elapsed();
                stats.units = units.len();
                cache.put(&key, ENTRY_EXT, &bytes);
                bytes
            }
        };
        // Load a private copy of the verified bytes: the entry may be replaced or truncated
        // by another process at any time, and a mapped library must never change.
        let copy = cache
            .private_copy(&library, ".so")
            .map_err(io("writing the library to load"))?;
        let mut m = load(copy.path(), &symbol_of, params, packs)?;
        drop(copy);
        stats.total_time = t0.elapsed();
        m.stats = stats;
        Ok(m)
    }

    /// Compiles and links `units` in a scratch folder of the cache; returns the library.
    fn build(
        &self,
        units: &[Unit],
        cache: &Cache,
        lib_path: &Path,
    ) -> Result<Vec<u8>, CompileError> {
        let scratch = cache
            .scratch()
            .map_err(io(format!("creating a build folder in {}", cache.dir().display())))?;
        self.build_in(units, scratch.path(), lib_path)
    }

    fn build_in(
        &self,
        units: &[Unit],
        work: &Path,
        lib_path: &Path,
    ) -> Result<Vec<u8>, CompileError> {
        let mut children = vec![];
        for (i, u) in units.iter().enumerate() {
            let c = work.join(format!("unit{i}.c"));
            let o = work.join(format!("unit{i}.o"));
            std::fs::write(&c, &u.source).map_err(io(format!("writing {}", c.display())))?;
            if self.opts.keep_sources {
                let keep = lib_path.with_extension(format!("unit{i}.c"));
                std::fs::write(&keep, &u.source)
                    .map_err(io(format!("writing {}", keep.display())))?;
            }
            let mut cmd = Command::new(&self.opts.cc);
            cmd.args(&self.opts.flags)
                .arg("-c")
                .arg(&c)
                .arg("-o")
                .arg(&o);
            let desc = format!(
                "{} {} -c {}",
                self.opts.cc,
                self.opts.flags.join(" "),
                c.display()
            );
            let child = cmd
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .map_err(|e| CompileError::NoCompiler {
                    cc: self.opts.cc.clone(),
                    msg: e.to_string(),
                })?;
            children.push((child, o, desc, i));
        }
        let mut objects = vec![];
        let mut failure: Option<CompileError> = None;
        for (child, o, desc, i) in children {
            let out = child
                .wait_with_output()
                .map_err(io(format!("waiting for {desc}")))?;
            if !out.status.success() && failure.is_none() {
                failure = Some(CompileError::Cc {
                    kernels: units[i].kernels.clone(),
                    command: desc,
                    stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
                });
            }
            objects.push(o);
        }
        if let Some(f) = failure {
            return Err(f);
        }
        let tmp_lib = work.join("lib.so");
        let mut link = Command::new(&self.opts.cc);
        link.args(&self.opts.flags)
            .arg("-shared")
            .arg("-o")
            .arg(&tmp_lib)
            .args(&objects)
            .arg("-lm");
        let out = link.output().map_err(|e| CompileError::NoCompiler {
            cc: self.opts.cc.clone(),
            msg: e.to_string(),
        })?;
        if !out.status.success() {
            return Err(CompileError::Cc {
                kernels: units
                    .iter()
                    .flat_map(|u| u.kernels.iter().cloned())
                    .collect(),
                command: format!("{} -shared (link)", self.opts.cc),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        std::fs::read(&tmp_lib).map_err(io(format!("reading {}", tmp_lib.display())))
    }
}

/// Identifies the host CPU model for the cache key (`-march=native` code is CPU specific).
pub fn host_cpu_id() -> String {
    let Ok(s) = std::fs::read_to_string("/proc/cpuinfo") else {
        return String::new();
    };
    s.lines()
        .filter(|l| l.starts_with("model name") || l.starts_with("flags"))
        .take(2)
        .collect::<Vec<_>>()
        .join("\n")
}

fn load(
    path: &Path,
    symbol_of: &HashMap<String, String>,
    params: HashMap<String, Vec<(DType, i64)>>,
    packs: HashMap<String, Vec<PackSlot>>,
) -> Result<Module, CompileError> {
    let lerr = |msg: String| CompileError::Load {
        path: path.to_path_buf(),
        msg,
    };
    // SAFETY: the library was produced by this crate's code generator; its initializers are
    // those of the C runtime.
    let lib = unsafe { libloading::Library::new(path) }.map_err(|e| lerr(e.to_string()))?;
    let mut fns = HashMap::new();
    for (name, sym) in symbol_of {
        // SAFETY: every generated kernel has the `KernelFn` signature.
        let f: libloading::Symbol<KernelFn> =
            unsafe { lib.get(sym.as_bytes()) }.map_err(|e| lerr(format!("kernel {name}: {e}")))?;
        fns.insert(name.clone(), *f);
    }
    let mut packed = HashMap::new();
    for (name, slots) in packs {
        let sym = &symbol_of[&name];
        // SAFETY: kernels with pack slots define both entry points with these signatures.
        let pf: libloading::Symbol<PackedKernelFn> = unsafe { lib.get(format!("{sym}__packed").as_bytes()) }
            .map_err(|e| lerr(format!("kernel {name}: {e}")))?;
        let pk: libloading::Symbol<PackFn> = unsafe { lib.get(format!("{sym}__pack").as_bytes()) }
            .map_err(|e| lerr(format!("kernel {name}: {e}")))?;
        let (pf, pk) = (*pf, *pk);
        packed.insert(name, (slots, pf, pk));
    }
    // SAFETY: `tilec_set_threads(int)` and `tilec_set_pool(tc_pool_fn)` are defined by the
    // prelude of every unit; `pool::run_chunks` has the signature of `tc_pool_fn`.
    let set_threads = unsafe { lib.get::<unsafe extern "C" fn(i32)>(b"tilec_set_threads") }
        .ok()
        .map(|f| *f);
    type SetPool = unsafe extern "C" fn(crate::pool::RunChunks);
    if let Ok(set_pool) = unsafe { lib.get::<SetPool>(b"tilec_set_pool") } {
        unsafe { set_pool(crate::pool::run_chunks) };
    }
    let m = Module {
        fns,
        packed,
        set_threads,
        stats: CompileStats::default(),
        params,
        _lib: lib,
    };
    m.set_threads(0);
    Ok(m)
}

impl Module {
    /// The compiled kernel named `name` (valid while this module is alive).
    pub fn get(&self, name: &str) -> Option<KernelFn> {
        self.fns.get(name).copied()
    }

    /// The gemm operands of kernel `name` that can be packed ahead of the calls (empty if none).
    pub fn packs(&self, name: &str) -> &[PackSlot] {
        self.packed.get(name).map(|p| p.0.as_slice()).unwrap_or(&[])
    }

    /// The entry points of kernel `name` for prepacked operands: the kernel reading packed
    /// slots and the function packing one slot (`None` if it has no [`Module::packs`]).
    pub fn get_packed(&self, name: &str) -> Option<(PackedKernelFn, PackFn)> {
        self.packed.get(name).map(|p| (p.1, p.2))
    }

    /// Names of the kernels in the module.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.fns.keys().map(|s| s.as_str())
    }

    /// Threads used by parallel loops and gemms of this module, the calling thread included
    /// (0: [`crate::pool::default_threads`], which a module starts with).
    pub fn set_threads(&self, n: usize) {
        let n = if n == 0 { crate::pool::default_threads() } else { n };
        if let Some(f) = self.set_threads {
            // SAFETY: plain C function setting an int.
            unsafe { f(n.min(i32::MAX as usize) as i32) }
        }
    }

    pub fn stats(&self) -> &CompileStats {
        &self.stats
    }

    /// Runs kernel `name` on tensors (one per parameter, in order), checking dtypes and sizes.
    pub fn run(&self, name: &str, args: &mut [Tensor]) -> Result<(), CompileError> {
        let err = |msg: String| CompileError::Call {
            kernel: name.to_string(),
            msg,
        };
        let f = self
            .get(name)
            .ok_or_else(|| err("no such kernel in the module".into()))?;
        let ps = &self.params[name];
        if ps.len() != args.len() {
            return Err(err(format!(
                "expected {} arguments, got {}",
                ps.len(),
                args.len()
            )));
        }
        for (i, ((d, n), t)) in ps.iter().zip(args.iter()).enumerate() {
            if t.dtype() != *d || t.numel() as i64 != *n {
                return Err(err(format!(
                    "argument {i}: expected {d} with {n} elements, got {} with {}",
                    t.dtype(),
                    t.numel()
                )));
            }
        }
        let ptrs: Vec<*mut c_void> = args.iter_mut().map(tensor_ptr).collect();
        // SAFETY: every pointer addresses a live buffer of the dtype and element count the
        // kernel was compiled for; the tensors are distinct objects so buffers do not overlap.
        unsafe { f(ptrs.as_ptr()) };
        Ok(())
    }

    /// Like [`Module::run`], but first packs the operands of the slots selected by `pack`
    /// (all of [`Module::packs`] when it returns true) and runs the kernel on the packed
    /// copies (the packs are made from the tensors as given, before the call).
    pub fn run_prepacked(
        &self,
        name: &str,
        args: &mut [Tensor],
        pack: impl Fn(usize, &PackSlot) -> bool,
    ) -> Result<(), CompileError> {
        let Some((slots, pf, pk)) = self.packed.get(name) else {
            return self.run(name, args);
        };
        let ps = &self.params[name];
        if ps.len() != args.len() {
            return Err(CompileError::Call {
                kernel: name.to_string(),
                msg: format!("expected {} arguments, got {}", ps.len(), args.len()),
            });
        }
        for (i, ((d, n), t)) in ps.iter().zip(args.iter()).enumerate() {
            if t.dtype() != *d || t.numel() as i64 != *n {
                return Err(CompileError::Call {
                    kernel: name.to_string(),
                    msg: format!(
                        "argument {i}: expected {d} with {n} elements, got {} with {}",
                        t.dtype(),
                        t.numel()
                    ),
                });
            }
        }
        let ptrs: Vec<*mut c_void> = args.iter_mut().map(tensor_ptr).collect();
        let mut bufs: Vec<Vec<u64>> = vec![];
        let mut packed: Vec<*mut c_void> = vec![];
        for (i, s) in slots.iter().enumerate() {
            if pack(i, s) {
                // 64 bytes of slack for alignment.
                let mut b = vec![0u64; s.bytes.div_ceil(8) + 8];
                let base = b.as_mut_ptr() as usize;
                let p = (base + (64 - base % 64) % 64) as *mut c_void;
                // SAFETY: `p` has `s.bytes` writable bytes; the arguments are live buffers.
                unsafe { pk(ptrs.as_ptr(), i as i64, p) };
                packed.push(p);
                bufs.push(b);
            } else {
                packed.push(std::ptr::null_mut());
            }
        }
        // SAFETY: as in `run`; packed entries address buffers filled by the pack function.
        unsafe { pf(ptrs.as_ptr(), packed.as_ptr()) };
        drop(bufs);
        Ok(())
    }
}

/// A pointer to the first element of a tensor's buffer.
pub fn tensor_ptr(t: &mut Tensor) -> *mut c_void {
    tilec_ir::dispatch!(t.data_mut(), v => v.as_mut_ptr() as *mut c_void)
}
