//! The CUDA back end: kernels rendered to CUDA C++ (tile-IR schedules or family templates),
//! compiled with NVRTC (parallel, cached) and launched on one stream with pointers into a
//! device arena. Each run of device steps between host steps is captured into a CUDA graph on
//! its first launch and replayed afterwards. Everything CUDA is loaded at run time.

use std::time::Instant;

use tilec_cuda::{CudaError, Device, DeviceBuffer, GpuKernel, GpuTarget, Stream};
use tilec_ir::{DType, Tensor, ValueId};
use tilec_opt::target::Target;
use tilec_cuda::families::GpuBuilt;
use tilec_tile::family::{Decision, Problem, Registry};
use tilec_tile::{CheckSite, Kernel};

use super::{Backend, Build, Executor, Memory, Report};
use crate::cuda_families::FamilyInfo;
use crate::Error;

/// One GPU kernel of a prepared model.
#[derive(Clone, Debug)]
pub struct GpuKernelSource {
    pub name: String,
    /// The graph values of its parameters: inputs, then outputs.
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
    /// The kernel as lowered (serial loops).
    pub lowered: Kernel,
    /// After its GPU schedule.
    pub scheduled: Kernel,
    /// The GPU schedule's name (`gemm`, `rows`, `elementwise`, `direct`, `block`, `serial`),
    /// or the template family's (`sm90_tc_gemm`).
    pub schedule: &'static str,
    pub source: tilec_cuda::CudaSource,
    /// The family decision, and a template family's plan and fallback (see `cuda_families`).
    pub family: FamilyInfo,
}

/// Builds GPU kernels through the GPU families (`tilec_cuda::families`; no device needed).
pub struct CudaBuild;

/// The target of a device as the schedules see it (the H200 preset's other numbers).
pub fn gpu_target(gpu: &GpuTarget) -> Target {
    Target { units: gpu.sm_count as usize, gpu: *gpu, ..Target::cuda_h200() }
}

impl Build for CudaBuild {
    type Family = GpuBuilt;
    type Built = GpuKernelSource;

    fn registry() -> &'static Registry<Target, GpuBuilt> {
        tilec_cuda::families::registry()
    }

    fn finish(&self, p: &Problem, b: GpuBuilt, d: &Decision) -> GpuKernelSource {
        GpuKernelSource {
            name: p.name.clone(),
            inputs: b.lowered.inputs,
            outputs: b.lowered.outputs,
            lowered: b.lowered.kernel,
            scheduled: b.scheduled,
            schedule: b.schedule,
            source: b.source,
            family: FamilyInfo { decision: d.clone(), plan: b.plan, fallback: b.fallback },
        }
    }

    fn params(b: &GpuKernelSource) -> (&[ValueId], &[ValueId]) {
        (&b.inputs, &b.outputs)
    }

    fn checks(b: &GpuKernelSource) -> &[CheckSite] {
        &b.lowered.checks
    }
}

fn cuda_err(what: &str) -> impl Fn(CudaError) -> Error + '_ {
    move |e| Error::Compile(format!("{what}: {e}"))
}

/// Says why there is no GPU, if there is none.
fn check_gpu() -> Result<(), Error> {
    if !tilec_cuda::is_available() {
        let why = match tilec_cuda::device_count() {
            Err(e) => e.to_string(),
            Ok(0) => "the CUDA driver reports no device".to_string(),
            Ok(_) => "no usable CUDA device".to_string(),
        };
        return Err(Error::Compile(format!("no CUDA GPU: {why} (the cuda target needs an NVIDIA driver and device)")));
    }
    Ok(())
}

/// Opens the device, or says why there is none.
pub fn open_device(ordinal: usize) -> Result<Device, Error> {
    check_gpu()?;
    Device::open(ordinal).map_err(cuda_err("opening the CUDA device"))
}

/// The device's properties, read without opening it (no context), or why there is none.
pub fn device_props(ordinal: usize) -> Result<tilec_cuda::DeviceProps, Error> {
    check_gpu()?;
    tilec_cuda::DeviceProps::query(ordinal).map_err(cuda_err("reading the CUDA device's properties"))
}

/// A CUDA device with its stream, arena and constants.
pub struct Cuda {
    /// The captured graph of each run of device steps, by run.
    graphs: Vec<Option<tilec_cuda::Graph>>,
    /// Use CUDA graphs (off: launch step by step, for debugging).
    pub use_graphs: bool,
    compiler: tilec_cuda::Compiler,
    /// Kept alive: kernel arguments point into them.
    consts: Vec<DeviceBuffer>,
    // Dropped before the device context: the arena and the stream.
    arena: Option<DeviceBuffer>,
    stream: Stream,
    device: Device,
}

impl Cuda {
    /// The device `ordinal` with NVRTC, compiling for its architecture (cached in `cache_dir`,
    /// else the back end's default directory).
    pub fn open(ordinal: usize, cache_dir: Option<std::path::PathBuf>) -> Result<Cuda, Error> {
        let device = open_device(ordinal)?;
        let nvrtc = tilec_cuda::Nvrtc::load().map_err(|e| {
            Error::Compile(format!("{e} (put CUDA's lib directory on LD_LIBRARY_PATH or set TILEC_NVRTC_LIB)"))
        })?;
        let cache = cache_dir.or_else(tilec_cuda::nvrtc::default_cache_dir);
        let compiler = tilec_cuda::Compiler::new(nvrtc, &device.props().arch()).with_cache_dir(cache);
        let stream = device.stream().map_err(cuda_err("creating a CUDA stream"))?;
        Ok(Cuda { graphs: vec![], use_graphs: true, compiler, consts: vec![], arena: None, stream, device })
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Checks that a caller's device buffer lies on this back end's GPU.
    fn same_device(&self, ordinal: usize) -> Result<(), Error> {
        let ours = self.device.props().ordinal;
        if ordinal != ours {
            return Err(Error::Compile(format!("a tensor on GPU {ordinal} was given to a model compiled for GPU {ours}")));
        }
        Ok(())
    }

    fn arena(&self) -> Result<&DeviceBuffer, Error> {
        self.arena.as_ref().ok_or_else(|| Error::Compile("the device arena is not allocated".into()))
    }
}

impl Backend for Cuda {
    type Build = CudaBuild;
    type Loaded = GpuKernel;
    type Bound = (GpuKernel, Vec<u64>);
    const ALIGN: usize = 256;

    fn load(&mut self, kernels: &[GpuKernelSource], report: &mut Report) -> Result<Vec<Result<GpuKernel, String>>, Error> {
        // A library kernel (cuBLAS) has no source: nothing to compile.
        let modules: Vec<(String, String)> = kernels
            .iter()
            .filter(|k| !k.source.source.is_empty())
            .map(|k| (k.name.clone(), k.source.source.clone()))
            .collect();
        let t0 = Instant::now();
        let mut compiled = self.compiler.compile_many(&modules).into_iter();
        report.phases.push(("nvrtc", t0.elapsed()));
        let t1 = Instant::now();
        let mut out = vec![];
        for k in kernels {
            let c = if k.source.source.is_empty() {
                Ok(tilec_cuda::Compiled { name: k.name.clone(), image: vec![], cache_hit: false })
            } else {
                compiled.next().unwrap_or_else(|| Err(CudaError::Usage(format!("kernel {}: not compiled", k.name))))
            };
            let loaded =
                crate::cuda_families::load_or_fallback(&self.device, &self.compiler, k, c, &mut report.notes);
            if loaded.as_ref().is_ok_and(|g| g.cache_hit) {
                report.cache_hits += 1;
            }
            out.push(loaded.map_err(|e| e.to_string()));
        }
        report.unique_kernels = kernels.len();
        report.phases.push(("modules", t1.elapsed()));
        Ok(out)
    }

    fn alloc(&mut self, bytes: usize) -> Result<(), Error> {
        let a = self.device.alloc(bytes.max(Self::ALIGN)).map_err(cuda_err("allocating the device arena"))?;
        self.arena = Some(a);
        Ok(())
    }

    fn constant(&mut self, name: &str, t: &Tensor) -> Result<u64, Error> {
        // Uploaded from the tensor's own buffer (no byte copy on the host).
        let b = self.device.upload(t).map_err(cuda_err(&format!("uploading constant '{name}'")))?;
        let p = b.ptr();
        self.consts.push(b);
        Ok(p)
    }

    fn base(&self) -> u64 {
        self.arena.as_ref().map_or(0, |a| a.ptr())
    }

    fn bind(&mut self, k: GpuKernel, name: &str, ptrs: Vec<u64>, _constant: &[bool]) -> Result<Self::Bound, Error> {
        if ptrs.len() != k.params.len() {
            return Err(Error::Compile(format!(
                "kernel {name}: {} arguments planned, {} parameters",
                ptrs.len(),
                k.params.len()
            )));
        }
        k.bind(&self.stream, &ptrs).map_err(cuda_err(&format!("binding kernel {name}")))?;
        Ok((k, ptrs))
    }

    fn write(&self, offset: usize, t: &Tensor) -> Result<(), Error> {
        self.arena()?.write_on(&self.stream, offset, &t.le_bytes()).map_err(cuda_err("uploading a value"))
    }

    fn read(&self, offset: usize, dtype: DType, shape: &[usize]) -> Result<Tensor, Error> {
        let n: usize = shape.iter().product();
        let mut bytes = vec![0u8; n * dtype.size_bytes()];
        self.arena()?.read_on(&self.stream, offset, &mut bytes).map_err(cuda_err("downloading a value"))?;
        Tensor::from_le_bytes(dtype, shape.to_vec(), &bytes).map_err(|e| Error::Compile(format!("downloading a value: {e}")))
    }

    unsafe fn write_raw(&self, offset: usize, src: u64, len: usize, mem: Memory) -> Result<(), Error> {
        let a = self.arena()?;
        match mem {
            Memory::Host => {
                // SAFETY: the caller vouches for `src`.
                let b = unsafe { std::slice::from_raw_parts(src as *const u8, len) };
                a.write_on(&self.stream, offset, b).map_err(cuda_err("uploading an input"))
            }
            Memory::Device(d) => {
                self.same_device(d)?;
                if offset.checked_add(len).is_none_or(|e| e > a.len()) {
                    return Err(Error::Compile(format!("{len} bytes at {offset} lie outside the arena")));
                }
                tilec_cuda::driver::copy_dtod(&self.stream, a.ptr() + offset as u64, src, len)
                    .map_err(cuda_err("copying an input on the device"))
            }
        }
    }

    unsafe fn read_raw(&self, offset: usize, dst: u64, len: usize, mem: Memory) -> Result<(), Error> {
        let a = self.arena()?;
        match mem {
            Memory::Host => {
                // SAFETY: the caller vouches for `dst`.
                let b = unsafe { std::slice::from_raw_parts_mut(dst as *mut u8, len) };
                a.read_on(&self.stream, offset, b).map_err(cuda_err("downloading an output"))
            }
            Memory::Device(d) => {
                self.same_device(d)?;
                if offset.checked_add(len).is_none_or(|e| e > a.len()) {
                    return Err(Error::Compile(format!("{len} bytes at {offset} lie outside the arena")));
                }
                tilec_cuda::driver::copy_dtod(&self.stream, dst, a.ptr() + offset as u64, len)
                    .map_err(cuda_err("copying an output on the device"))
            }
        }
    }

    fn copy_within(&self, src: usize, dst: usize, len: usize) -> Result<(), Error> {
        let a = self.arena()?;
        if src.max(dst).checked_add(len).is_none_or(|e| e > a.len()) {
            return Err(Error::Compile(format!("{len} bytes from {src} to {dst} lie outside the arena")));
        }
        tilec_cuda::driver::copy_dtod(&self.stream, a.ptr() + dst as u64, a.ptr() + src as u64, len)
            .map_err(cuda_err("copying state within the device arena"))
    }

    fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<(), Error> {
        self.arena()?.fill(&self.stream, offset, len, byte).map_err(cuda_err("filling the device arena"))
    }

    fn launch(&self, (k, ptrs): &Self::Bound, name: &str) -> Result<(), Error> {
        k.launch(&self.stream, ptrs).map_err(cuda_err(&format!("kernel {name}")))
    }

    fn launch_run<'a>(
        &mut self,
        run: usize,
        steps: impl Iterator<Item = (&'a Self::Bound, &'a str)> + Clone,
    ) -> Result<(), Error> {
        if !self.use_graphs {
            for (k, name) in steps {
                self.launch(k, name)?;
            }
            return Ok(());
        }
        if self.graphs.len() <= run {
            self.graphs.resize_with(run + 1, || None);
        }
        if self.graphs[run].is_none() {
            let names: Vec<&str> = steps.clone().map(|s| s.1).collect();
            let stream = &self.stream;
            let g = stream
                .capture(|_| {
                    for ((k, ptrs), _) in steps {
                        k.launch(stream, ptrs)?;
                    }
                    Ok(())
                })
                .map_err(cuda_err(&format!(
                    "capturing kernels {}..{} into a CUDA graph",
                    names.first().unwrap_or(&""),
                    names.last().unwrap_or(&"")
                )))?;
            self.graphs[run] = Some(g);
        }
        match &self.graphs[run] {
            Some(g) => g.launch(&self.stream).map_err(cuda_err("launching a CUDA graph")),
            None => Ok(()),
        }
    }

    fn time_run<'a>(
        &mut self,
        steps: impl Iterator<Item = (&'a Self::Bound, &'a str)> + Clone,
    ) -> Result<Option<Vec<(u64, u64)>>, Error> {
        let n = steps.clone().count();
        let events = (0..=n).map(|_| self.device.event()).collect::<Result<Vec<_>, _>>().map_err(cuda_err("creating an event"))?;
        // An event before the first kernel and after each: kernel i takes the interval between
        // events i and i + 1 (with the device's gap between two nodes of a graph).
        let stream = &self.stream;
        let body = |s: &Stream| -> Result<(), CudaError> {
            events[0].record_in_graph(s)?;
            for (i, ((k, ptrs), _)) in steps.clone().enumerate() {
                k.launch(s, ptrs)?;
                events[i + 1].record_in_graph(s)?;
            }
            Ok(())
        };
        // Replayed from a graph as `launch_run` does, so that no launch from the host shows
        // between two kernels; launched one by one where capture fails or graphs are off.
        let graph = if self.use_graphs { stream.capture(body).ok() } else { None };
        match &graph {
            Some(g) => g.launch(stream).map_err(cuda_err("launching a CUDA graph"))?,
            None => body(stream).map_err(cuda_err("launching a profiled run"))?,
        }
        stream.synchronize().map_err(cuda_err("waiting for the GPU"))?;
        let ns = |a: &tilec_cuda::Event, b: &tilec_cuda::Event| -> Result<u64, Error> {
            let ms = b.elapsed_ms_since(a).map_err(cuda_err("reading an event"))?;
            Ok((ms.max(0.0) as f64 * 1e6) as u64)
        };
        // Every stamp from the first event, each kernel's time the difference of two (no
        // overlap from rounding).
        let at = events.iter().map(|e| ns(&events[0], e)).collect::<Result<Vec<_>, _>>()?;
        Ok(Some(at.windows(2).map(|w| (w[0], w[1].saturating_sub(w[0]))).collect()))
    }

    fn describe(&self, (k, _): &Self::Bound) -> String {
        let cfg = k.family().map_or(k.launch, |f| f.launch_config());
        let (g, b) = (cfg.grid, cfg.block);
        let mut s = format!("grid {}x{}x{} block {}", g.0, g.1, g.2, b.0 * b.1 * b.2);
        if cfg.shared_mem_bytes > 0 {
            s.push_str(&format!(", smem {} KiB", cfg.shared_mem_bytes.div_ceil(1024)));
        }
        match k.function() {
            Some(f) => {
                if let Ok(r) = f.num_regs() {
                    s.push_str(&format!(", {r} regs"));
                }
                if let Ok(l) = f.local_bytes() {
                    s.push_str(&if l > 0 { format!(", {l} B local (stack, spills)") } else { ", no spills".to_string() });
                }
            }
            None => s.push_str(", a library kernel"),
        }
        s
    }

    unsafe fn order_after(&self, foreign: u64) -> Result<(), Error> {
        let e = self.device.event().map_err(cuda_err("creating an event"))?;
        // SAFETY: the caller vouches for `foreign`.
        unsafe { e.order_after_foreign(&self.stream, foreign) }.map_err(cuda_err("ordering tilec's stream after the caller's"))
    }

    fn sync(&self) -> Result<(), Error> {
        self.stream.synchronize().map_err(cuda_err("waiting for the GPU"))
    }
}

impl Executor<Cuda> {
    /// The device's name and compute capability.
    pub fn device_name(&self) -> String {
        let p = self.backend.device.props();
        format!("{} (sm_{}{})", p.name, p.compute_capability.0, p.compute_capability.1)
    }

    /// Launches step by step instead of through CUDA graphs (for debugging).
    pub fn set_use_graphs(&mut self, on: bool) {
        self.backend.use_graphs = on;
    }

    /// Runs the model `n` times and returns each run's device time in milliseconds, measured
    /// with events around the device work (host steps included, the input upload before each
    /// run not).
    pub fn bench(&mut self, inputs: &[Tensor], n: usize) -> Result<Vec<f64>, Error> {
        if self.interpreted {
            let mut out = vec![];
            for _ in 0..n {
                let s = Instant::now();
                tilec_ref::run(&self.graph, inputs.to_vec())?;
                out.push(s.elapsed().as_secs_f64() * 1e3);
            }
            return Ok(out);
        }
        let start = self.backend.device.event().map_err(cuda_err("creating an event"))?;
        let end = self.backend.device.event().map_err(cuda_err("creating an event"))?;
        let mut out = vec![];
        for _ in 0..n {
            // The memory plan may reuse an input's storage once it is read, so every run gets
            // its inputs again (uploaded before the first event, outside the timed region).
            self.write_inputs(inputs)?;
            start.record(&self.backend.stream).map_err(cuda_err("recording an event"))?;
            self.exec()?;
            end.record(&self.backend.stream).map_err(cuda_err("recording an event"))?;
            self.backend.sync()?;
            self.check_status()?;
            out.push(end.elapsed_ms_since(&start).map_err(cuda_err("reading an event"))? as f64);
        }
        Ok(out)
    }
}
