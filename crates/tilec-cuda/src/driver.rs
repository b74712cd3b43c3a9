//! The CUDA driver API through `cudarc`'s raw bindings, loaded at run time.
//!
//! Every call goes through [`check`], which turns a failure into [`CudaError::Driver`] naming
//! the call. Nothing here touches libcuda before [`driver_present`] has confirmed that it can
//! be loaded, so a machine without CUDA gets clean errors, never a panic.

use std::ffi::{c_void, CStr};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys;
use tilec_ir::{DType, Tensor};

use crate::error::{CudaError, Result};

/// Turns a driver result into an error naming `call`.
pub(crate) fn check(r: sys::CUresult, call: &'static str) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let code = r as u32;
    let mut p: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: cuGetErrorName writes a pointer to a static string or leaves it null.
    let name = unsafe {
        if sys::cuGetErrorName(r, &mut p) == sys::CUresult::CUDA_SUCCESS && !p.is_null() {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        } else {
            format!("{r:?}")
        }
    };
    let mut s: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: as above.
    let detail = unsafe {
        if sys::cuGetErrorString(r, &mut s) == sys::CUresult::CUDA_SUCCESS && !s.is_null() {
            CStr::from_ptr(s).to_string_lossy().into_owned()
        } else {
            String::new()
        }
    };
    Err(CudaError::Driver {
        call,
        code,
        name,
        detail,
    })
}

macro_rules! cu {
    ($f:ident ( $($a:expr),* $(,)? )) => {
        check(sys::$f($($a),*), stringify!($f))
    };
}

/// Whether libcuda can be loaded (checked once).
fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to open the library.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// Loads and initializes the driver (once); the error says why CUDA cannot be used.
fn init() -> Result<()> {
    static INIT: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    INIT.get_or_init(|| {
        if !driver_present() {
            return Err("the CUDA driver library (libcuda.so) was not found".into());
        }
        // SAFETY: the library is present; cuInit has no other precondition.
        unsafe { cu!(cuInit(0)) }.map_err(|e| e.to_string())
    })
    .clone()
    .map_err(CudaError::Unavailable)
}

/// Whether a CUDA driver is installed and reports at least one device. Never panics.
pub fn is_available() -> bool {
    device_count().map(|n| n > 0).unwrap_or(false)
}

/// The number of CUDA devices (an error when no driver is installed).
pub fn device_count() -> Result<usize> {
    init()?;
    let mut n = 0i32;
    // SAFETY: the driver is initialized.
    unsafe { cu!(cuDeviceGetCount(&mut n))? };
    Ok(n.max(0) as usize)
}

/// The driver's CUDA version as `major * 1000 + minor * 10` (13000 for CUDA 13.0).
pub fn driver_version() -> Result<i32> {
    init()?;
    let mut v = 0i32;
    // SAFETY: the driver is initialized.
    unsafe { cu!(cuDriverGetVersion(&mut v))? };
    Ok(v)
}

/// What the back end needs to know about a device.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceProps {
    pub ordinal: usize,
    pub name: String,
    /// Compute capability (major, minor): (9, 0) on Hopper.
    pub compute_capability: (u32, u32),
    pub sm_count: u32,
    pub max_threads_per_block: u32,
    pub max_threads_per_sm: u32,
    /// Static shared memory a block may use without opting in (48 KiB).
    pub shared_mem_per_block: usize,
    /// Shared memory a block may use after opting in (227 KiB on H100/H200).
    pub shared_mem_per_block_optin: usize,
    pub shared_mem_per_sm: usize,
    pub registers_per_sm: u32,
    pub l2_bytes: usize,
    pub total_mem_bytes: usize,
    /// Peak DRAM bandwidth from the memory clock and bus width, in bytes per second (0 when the
    /// driver does not report them).
    pub peak_dram_bytes_per_s: f64,
}

impl DeviceProps {
    /// The device as the schedules and kernel families see it.
    pub fn gpu_target(&self) -> crate::GpuTarget {
        crate::GpuTarget {
            sm_count: self.sm_count,
            max_threads_per_block: self.max_threads_per_block,
            blocks_per_sm: 8,
            compute_capability: self.compute_capability,
            smem_per_block: self.shared_mem_per_block_optin,
            regs_per_sm: self.registers_per_sm,
            l2_bytes: self.l2_bytes,
            allow_tf32: false,
            flash_attention: false,
        }
    }

    /// The whole target description of this device (measured).
    pub fn target(&self) -> tilec_opt::target::Target {
        tilec_opt::target::Target::cuda_measured(self.gpu_target(), Some(self.peak_dram_bytes_per_s))
    }

    /// The NVRTC `--gpu-architecture` value for this device: `sm_90a` on Hopper (the `a`
    /// variant unlocks wgmma/TMA), `sm_XY` elsewhere.
    pub fn arch(&self) -> String {
        arch_for(self.compute_capability)
    }
}

/// The architecture name for a compute capability (`sm_90a` for 9.0, `sm_100a` for 10.0, ...).
pub fn arch_for(cc: (u32, u32)) -> String {
    let (major, minor) = cc;
    // Architecture-specific features exist for 9.0 and the 10.x/12.x families.
    let suffix = if (major == 9 && minor == 0) || major >= 10 {
        "a"
    } else {
        ""
    };
    format!("sm_{major}{minor}{suffix}")
}

struct Ctx {
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
    /// Kernel launches ask for programmatic dependent launch ([`crate::pdl`]).
    pdl: bool,
}

// SAFETY: a CUDA context handle may be used from any thread once made current there.
unsafe impl Send for Ctx {}
unsafe impl Sync for Ctx {}

impl Ctx {
    fn bind(&self) -> Result<()> {
        // SAFETY: ctx is a retained primary context.
        unsafe { cu!(cuCtxSetCurrent(self.ctx)) }
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        // SAFETY: releases the retain done in `Device::open`.
        unsafe {
            let _ = sys::cuDevicePrimaryCtxRelease_v2(self.dev);
        }
    }
}

/// An open device: its primary context and properties. Cheap to clone.
#[derive(Clone)]
pub struct Device {
    ctx: Arc<Ctx>,
    props: Arc<DeviceProps>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("props", &*self.props)
            .finish()
    }
}

fn attr(dev: sys::CUdevice, a: sys::CUdevice_attribute) -> Result<i32> {
    let mut v = 0i32;
    // SAFETY: dev is a valid device handle.
    unsafe { cu!(cuDeviceGetAttribute(&mut v, a, dev))? };
    Ok(v)
}

impl DeviceProps {
    /// Reads device `ordinal`'s properties without creating its context (the driver's
    /// initialization only), so that a compile can build its kernels while the context is
    /// created.
    pub fn query(ordinal: usize) -> Result<DeviceProps> {
        let n = device_count()?;
        if ordinal >= n {
            return Err(CudaError::Unavailable(format!(
                "device {ordinal} requested, {n} present"
            )));
        }
        use sys::CUdevice_attribute as A;
        let mut dev: sys::CUdevice = 0;
        let mut name = [0 as std::ffi::c_char; 256];
        let mut total = 0usize;
        // SAFETY: the driver is initialized and the ordinal is in range; buffer sizes as given.
        unsafe {
            cu!(cuDeviceGet(&mut dev, ordinal as i32))?;
            cu!(cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, dev))?;
            cu!(cuDeviceTotalMem_v2(&mut total, dev))?;
        }
        // SAFETY: the driver NUL-terminates the name within the buffer.
        let name = unsafe { CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let mem_clock_khz = attr(dev, A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE).unwrap_or(0) as f64;
        let bus_bits =
            attr(dev, A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH).unwrap_or(0) as f64;
        Ok(DeviceProps {
            ordinal,
            name,
            compute_capability: (
                attr(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)? as u32,
                attr(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)? as u32,
            ),
            sm_count: attr(dev, A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32,
            max_threads_per_block: attr(dev, A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)? as u32,
            max_threads_per_sm: attr(dev, A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)?
                as u32,
            shared_mem_per_block: attr(dev, A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK)?
                as usize,
            shared_mem_per_block_optin: attr(
                dev,
                A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )? as usize,
            shared_mem_per_sm: attr(
                dev,
                A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
            )? as usize,
            registers_per_sm: attr(dev, A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR)?
                as u32,
            l2_bytes: attr(dev, A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as usize,
            total_mem_bytes: total,
            // DDR: two transfers per clock.
            peak_dram_bytes_per_s: 2.0 * mem_clock_khz * 1e3 * bus_bits / 8.0,
        })
    }
}

impl Device {
    /// Opens device `ordinal` (retains its primary context) and reads its properties.
    pub fn open(ordinal: usize) -> Result<Device> {
        let props = DeviceProps::query(ordinal)?;
        let mut dev: sys::CUdevice = 0;
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: the driver is initialized and the ordinal is in range (`query`).
        unsafe {
            cu!(cuDeviceGet(&mut dev, ordinal as i32))?;
            cu!(cuDevicePrimaryCtxRetain(&mut ctx, dev))?;
        }
        let ctx = Ctx { dev, ctx, pdl: crate::pdl::enabled(props.compute_capability) };
        ctx.bind()?;
        Ok(Device {
            ctx: Arc::new(ctx),
            props: Arc::new(props),
        })
    }

    pub fn props(&self) -> &DeviceProps {
        &self.props
    }

    /// Makes this device's context current on the calling thread.
    pub fn bind(&self) -> Result<()> {
        self.ctx.bind()
    }

    /// Free and total device memory in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        self.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: context bound.
        unsafe { cu!(cuMemGetInfo_v2(&mut free, &mut total))? };
        Ok((free, total))
    }

    /// Waits for all work on the device.
    pub fn synchronize(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: context bound.
        unsafe { cu!(cuCtxSynchronize()) }
    }

    /// Allocates `bytes` of device memory (uninitialized).
    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer> {
        self.bind()?;
        let mut ptr: sys::CUdeviceptr = 0;
        if bytes > 0 {
            // SAFETY: context bound.
            unsafe { cu!(cuMemAlloc_v2(&mut ptr, bytes))? };
        }
        Ok(DeviceBuffer {
            ptr,
            bytes,
            ctx: self.ctx.clone(),
        })
    }

    /// Allocates a buffer holding a copy of `t`.
    pub fn upload(&self, t: &Tensor) -> Result<DeviceBuffer> {
        let buf = self.alloc(t.numel() * t.dtype().size_bytes())?;
        buf.write(0, &t.le_bytes())?;
        Ok(buf)
    }

    /// A new non-blocking stream.
    pub fn stream(&self) -> Result<Stream> {
        self.bind()?;
        let mut s: sys::CUstream = std::ptr::null_mut();
        // SAFETY: context bound; flag 1 = CU_STREAM_NON_BLOCKING.
        unsafe { cu!(cuStreamCreate(&mut s, 1))? };
        Ok(Stream {
            raw: s,
            ctx: self.ctx.clone(),
        })
    }

    /// Loads a compiled module (cubin or PTX image).
    pub fn load_module(&self, image: &[u8]) -> Result<Module> {
        self.bind()?;
        // The driver reads PTX as a NUL-terminated string; cubins carry their own size.
        let mut owned;
        let data: &[u8] = if image.starts_with(b"\x7fELF") {
            image
        } else {
            owned = image.to_vec();
            owned.push(0);
            &owned
        };
        let mut m: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: context bound, image valid for the call.
        unsafe { cu!(cuModuleLoadData(&mut m, data.as_ptr() as *const c_void))? };
        Ok(Module {
            raw: m,
            ctx: self.ctx.clone(),
        })
    }

    /// Opens a device arena sized by a memory plan (one allocation; buffers are offsets).
    pub fn arena(&self, plan: &tilec_runtime::MemoryPlan) -> Result<DeviceArena> {
        Ok(DeviceArena {
            buf: self.alloc(plan.arena_bytes.max(1))?,
            offsets: plan.offsets.clone(),
        })
    }

    /// A timing event.
    pub fn event(&self) -> Result<Event> {
        self.bind()?;
        let mut e: sys::CUevent = std::ptr::null_mut();
        // SAFETY: context bound; flags 0 = default (timing enabled).
        unsafe { cu!(cuEventCreate(&mut e, 0))? };
        Ok(Event {
            raw: e,
            ctx: self.ctx.clone(),
        })
    }
}

/// A device allocation, freed on drop.
pub struct DeviceBuffer {
    ptr: sys::CUdeviceptr,
    bytes: usize,
    ctx: Arc<Ctx>,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBuffer({:#x}, {} bytes)", self.ptr, self.bytes)
    }
}

impl DeviceBuffer {
    /// The device address of byte `offset`.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
    pub fn len(&self) -> usize {
        self.bytes
    }
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    fn range(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.bytes => Ok(()),
            _ => Err(CudaError::Usage(format!(
                "device access of {len} bytes at offset {offset} outside a buffer of {} bytes",
                self.bytes
            ))),
        }
    }

    /// Copies host bytes to `offset` and waits until they are in device memory. From pageable
    /// memory the driver's synchronous copy may return before its DMA lands, and work on a
    /// non-blocking stream is not ordered after it: the legacy stream that carries the copy is
    /// waited for. Work already running on other streams is not: for a buffer that kernels
    /// may be reading, use [`DeviceBuffer::write_on`] with their stream.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.range(offset, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        self.ctx.bind()?;
        // SAFETY: range checked; host slice valid for the call; the null stream is the
        // context's legacy stream.
        unsafe {
            cu!(cuMemcpyHtoD_v2(
                self.ptr + offset as u64,
                data.as_ptr() as *const c_void,
                data.len()
            ))?;
            cu!(cuStreamSynchronize(std::ptr::null_mut()))
        }
    }

    /// Copies host bytes to `offset` in `stream`'s order (after the work queued on it before,
    /// before the work queued after) and waits for the copy.
    pub fn write_on(&self, stream: &Stream, offset: usize, data: &[u8]) -> Result<()> {
        self.range(offset, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        stream.ctx.bind()?;
        // SAFETY: range checked; the host slice outlives the copy (the stream is waited for).
        unsafe {
            cu!(cuMemcpyHtoDAsync_v2(
                self.ptr + offset as u64,
                data.as_ptr() as *const c_void,
                data.len(),
                stream.raw
            ))?;
        }
        stream.synchronize()
    }

    /// Copies `out.len()` bytes from `offset` to the host after the work queued on `stream`.
    pub fn read_on(&self, stream: &Stream, offset: usize, out: &mut [u8]) -> Result<()> {
        self.range(offset, out.len())?;
        if out.is_empty() {
            return Ok(());
        }
        stream.ctx.bind()?;
        // SAFETY: range checked; the host slice outlives the copy (the stream is waited for).
        unsafe {
            cu!(cuMemcpyDtoHAsync_v2(
                out.as_mut_ptr() as *mut c_void,
                self.ptr + offset as u64,
                out.len(),
                stream.raw
            ))?;
        }
        stream.synchronize()
    }

    /// Copies `out.len()` bytes from `offset` to the host (synchronous).
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.range(offset, out.len())?;
        if out.is_empty() {
            return Ok(());
        }
        self.ctx.bind()?;
        // SAFETY: range checked; host slice valid for the call.
        unsafe {
            cu!(cuMemcpyDtoH_v2(
                out.as_mut_ptr() as *mut c_void,
                self.ptr + offset as u64,
                out.len()
            ))
        }
    }

    /// Reads a tensor of `dtype` and `shape` stored at `offset`.
    pub fn download(&self, offset: usize, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        let n: usize = shape.iter().product();
        let mut bytes = vec![0u8; n * dtype.size_bytes()];
        self.read(offset, &mut bytes)?;
        Tensor::from_le_bytes(dtype, shape.to_vec(), &bytes)
            .map_err(|e| CudaError::Usage(e.to_string()))
    }

    /// Fills `len` bytes at `offset` with `byte` on `stream`.
    pub fn fill(&self, stream: &Stream, offset: usize, len: usize, byte: u8) -> Result<()> {
        self.range(offset, len)?;
        self.ctx.bind()?;
        // SAFETY: range checked.
        unsafe {
            cu!(cuMemsetD8Async(
                self.ptr + offset as u64,
                byte,
                len,
                stream.raw
            ))
        }
    }

    /// Fills the buffer with a 32-bit pattern on `stream` (the length must be a multiple of 4).
    pub fn fill_u32(&self, stream: &Stream, pattern: u32) -> Result<()> {
        if self.bytes % 4 != 0 {
            return Err(CudaError::Usage(format!(
                "fill_u32 on a buffer of {} bytes",
                self.bytes
            )));
        }
        self.ctx.bind()?;
        // SAFETY: whole buffer.
        unsafe {
            cu!(cuMemsetD32Async(
                self.ptr,
                pattern,
                self.bytes / 4,
                stream.raw
            ))
        }
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.ptr != 0 && self.ctx.bind().is_ok() {
            // SAFETY: allocated by cuMemAlloc in this context.
            unsafe {
                let _ = sys::cuMemFree_v2(self.ptr);
            }
        }
    }
}

/// Copies `bytes` from `src` to `dst` on the device (asynchronous on `stream`).
pub fn copy_dtod(stream: &Stream, dst: u64, src: u64, bytes: usize) -> Result<()> {
    stream.ctx.bind()?;
    // SAFETY: the caller passes device addresses valid for `bytes`.
    unsafe { cu!(cuMemcpyDtoDAsync_v2(dst, src, bytes, stream.raw)) }
}

/// One device allocation holding every buffer of a [`MemoryPlan`](tilec_runtime::MemoryPlan),
/// each at its planned offset.
pub struct DeviceArena {
    buf: DeviceBuffer,
    offsets: Vec<usize>,
}

impl DeviceArena {
    pub fn buffer(&self) -> &DeviceBuffer {
        &self.buf
    }
    /// Offset of planned buffer `i`.
    pub fn offset(&self, i: usize) -> Result<usize> {
        self.offsets.get(i).copied().ok_or_else(|| {
            CudaError::Usage(format!(
                "arena has {} buffers, asked for {i}",
                self.offsets.len()
            ))
        })
    }
    /// Device address of planned buffer `i`.
    pub fn ptr(&self, i: usize) -> Result<u64> {
        Ok(self.buf.ptr() + self.offset(i)? as u64)
    }
    /// Copies a tensor into planned buffer `i`.
    pub fn upload(&self, i: usize, t: &Tensor) -> Result<()> {
        self.buf.write(self.offset(i)?, &t.le_bytes())
    }
    /// Reads planned buffer `i` as a tensor.
    pub fn download(&self, i: usize, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        self.buf.download(self.offset(i)?, dtype, shape)
    }
}

/// A stream; work on it runs in order.
pub struct Stream {
    raw: sys::CUstream,
    ctx: Arc<Ctx>,
}

// SAFETY: stream handles may be used from any thread with the context current.
unsafe impl Send for Stream {}
unsafe impl Sync for Stream {}

impl Stream {
    /// The raw handle with the stream's context made current on this thread (for libraries
    /// such as cuBLASLt that take a stream).
    pub(crate) fn raw_current(&self) -> Result<sys::CUstream> {
        self.ctx.bind()?;
        Ok(self.raw)
    }

    pub fn synchronize(&self) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: valid stream.
        unsafe { cu!(cuStreamSynchronize(self.raw)) }
    }

    /// Starts capturing the work launched on this stream into a graph (nothing runs until the
    /// graph is launched).
    pub fn begin_capture(&self) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: valid stream.
        unsafe {
            cu!(cuStreamBeginCapture_v2(
                self.raw,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
            ))
        }
    }

    /// Ends a capture and instantiates the captured graph.
    pub fn end_capture(&self) -> Result<Graph> {
        self.ctx.bind()?;
        let mut g: sys::CUgraph = std::ptr::null_mut();
        let mut exec: sys::CUgraphExec = std::ptr::null_mut();
        // SAFETY: valid stream in capture mode.
        unsafe {
            cu!(cuStreamEndCapture(self.raw, &mut g))?;
            if let Err(e) = cu!(cuGraphInstantiateWithFlags(&mut exec, g, 0)) {
                let _ = sys::cuGraphDestroy(g);
                return Err(e);
            }
        }
        Ok(Graph {
            graph: g,
            exec,
            ctx: self.ctx.clone(),
        })
    }

    /// Captures the launches `f` makes on this stream into a graph.
    pub fn capture(&self, f: impl FnOnce(&Stream) -> Result<()>) -> Result<Graph> {
        self.begin_capture()?;
        let r = f(self);
        let g = self.end_capture();
        r?;
        g
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: created by cuStreamCreate.
            unsafe {
                let _ = sys::cuStreamDestroy_v2(self.raw);
            }
        }
    }
}

/// An instantiated CUDA graph, replayable on any stream of its device.
pub struct Graph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    ctx: Arc<Ctx>,
}

// SAFETY: graph handles are plain driver objects.
unsafe impl Send for Graph {}
unsafe impl Sync for Graph {}

impl Graph {
    pub fn launch(&self, stream: &Stream) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: valid exec and stream.
        unsafe { cu!(cuGraphLaunch(self.exec, stream.raw)) }
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: created in end_capture.
            unsafe {
                let _ = sys::cuGraphExecDestroy(self.exec);
                let _ = sys::cuGraphDestroy(self.graph);
            }
        }
    }
}

/// A timing event.
pub struct Event {
    raw: sys::CUevent,
    ctx: Arc<Ctx>,
}

impl Event {
    pub fn record(&self, stream: &Stream) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: valid event and stream.
        unsafe { cu!(cuEventRecord(self.raw, stream.raw)) }
    }
    /// Records the event so that a stream capture keeps it as a node of the graph (on a stream
    /// that is not capturing, the same as [`Event::record`]): replaying the graph then stamps
    /// it on the device's clock between the kernels around it.
    pub fn record_in_graph(&self, stream: &Stream) -> Result<()> {
        self.ctx.bind()?;
        let flags = sys::CUevent_record_flags_enum::CU_EVENT_RECORD_EXTERNAL as u32;
        // SAFETY: valid event and stream.
        unsafe { cu!(cuEventRecordWithFlags(self.raw, stream.raw, flags)) }
    }
    /// Makes `stream` wait for everything queued so far on `foreign`, a stream handle made
    /// elsewhere (another library's, such as PyTorch's current stream) in this event's context.
    ///
    /// # Safety
    /// `foreign` must be a live stream of this event's context (or 0, the legacy default).
    pub unsafe fn order_after_foreign(&self, stream: &Stream, foreign: u64) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: valid event and stream; the caller vouches for `foreign`.
        unsafe {
            cu!(cuEventRecord(self.raw, foreign as sys::CUstream))?;
            cu!(cuStreamWaitEvent(stream.raw, self.raw, 0))
        }
    }
    /// Milliseconds from `start` to this event (both recorded; waits for this one).
    pub fn elapsed_ms_since(&self, start: &Event) -> Result<f32> {
        self.ctx.bind()?;
        let mut ms = 0f32;
        // SAFETY: valid events.
        unsafe {
            cu!(cuEventSynchronize(self.raw))?;
            cu!(cuEventElapsedTime_v2(&mut ms, start.raw, self.raw))?;
        }
        Ok(ms)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: created by cuEventCreate.
            unsafe {
                let _ = sys::cuEventDestroy_v2(self.raw);
            }
        }
    }
}

/// A loaded module.
pub struct Module {
    raw: sys::CUmodule,
    ctx: Arc<Ctx>,
}

// SAFETY: module handles are plain driver objects.
unsafe impl Send for Module {}
unsafe impl Sync for Module {}

impl Module {
    /// Looks a kernel up by name.
    pub fn function(self: &Arc<Self>, name: &str) -> Result<Function> {
        let cname = std::ffi::CString::new(name)
            .map_err(|_| CudaError::Usage(format!("kernel name {name:?} contains a NUL byte")))?;
        self.ctx.bind()?;
        let mut f: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: valid module; name NUL-terminated.
        unsafe { cu!(cuModuleGetFunction(&mut f, self.raw, cname.as_ptr())) }.map_err(
            |e| match e {
                CudaError::Driver {
                    call,
                    code,
                    name: n,
                    detail,
                } => CudaError::Driver {
                    call,
                    code,
                    name: n,
                    detail: format!("kernel {name}: {detail}"),
                },
                e => e,
            },
        )?;
        Ok(Function {
            raw: f,
            name: name.to_string(),
            module: self.clone(),
            dyn_smem: Mutex::new(0),
        })
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: loaded by cuModuleLoadData.
            unsafe {
                let _ = sys::cuModuleUnload(self.raw);
            }
        }
    }
}

/// Grid and block dimensions and dynamic shared memory of a launch.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct LaunchConfig {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub shared_mem_bytes: u32,
}

/// A kernel of a loaded module. Its parameters are device pointers, one per kernel param.
pub struct Function {
    raw: sys::CUfunction,
    name: String,
    module: Arc<Module>,
    dyn_smem: Mutex<u32>,
}

// SAFETY: function handles are plain driver objects.
unsafe impl Send for Function {}
unsafe impl Sync for Function {}

impl std::fmt::Debug for Function {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Function({})", self.name)
    }
}

impl Function {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Registers per thread the compiled kernel uses.
    pub fn num_regs(&self) -> Result<u32> {
        self.module.ctx.bind()?;
        let mut v = 0i32;
        // SAFETY: valid function, out-pointer to a live i32.
        unsafe {
            cu!(cuFuncGetAttribute(
                &mut v,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS,
                self.raw
            ))?
        };
        Ok(v.max(0) as u32)
    }

    /// Blocks of `block_threads` threads (with `smem` bytes of dynamic shared memory) that can be
    /// resident on one SM at once.
    pub fn max_active_blocks_per_sm(&self, block_threads: u32, smem: u32) -> Result<u32> {
        self.module.ctx.bind()?;
        let mut v = 0i32;
        // SAFETY: valid function, out-pointer to a live i32.
        unsafe {
            cu!(cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut v,
                self.raw,
                block_threads as i32,
                smem as usize
            ))?
        };
        Ok(v.max(0) as u32)
    }

    /// Bytes of local memory (stack frame and register spills) per thread.
    pub fn local_bytes(&self) -> Result<u32> {
        self.module.ctx.bind()?;
        let mut v = 0i32;
        // SAFETY: valid function, out-pointer to a live i32.
        unsafe {
            cu!(cuFuncGetAttribute(
                &mut v,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
                self.raw
            ))?
        };
        Ok(v.max(0) as u32)
    }

    /// Raises the kernel's dynamic shared-memory limit to `bytes` (needed above 48 KiB before
    /// a launch or an occupancy query).
    pub fn reserve_dynamic_smem(&self, bytes: u32) -> Result<()> {
        self.module.ctx.bind()?;
        let mut cur = self.dyn_smem.lock().unwrap_or_else(|p| p.into_inner());
        if bytes > 48 * 1024 && *cur < bytes {
            // SAFETY: valid function.
            unsafe {
                cu!(cuFuncSetAttribute(
                    self.raw,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    bytes as i32
                ))?
            };
            *cur = bytes;
        }
        Ok(())
    }

    /// Clusters of a kernel with compile-time cluster dimensions that can be resident on the
    /// device at once, for blocks of `block_threads` threads and `smem` bytes.
    pub fn max_active_clusters(&self, grid: u32, block_threads: u32, smem: u32) -> Result<u32> {
        self.reserve_dynamic_smem(smem)?;
        let cfg = sys::CUlaunchConfig {
            gridDimX: grid,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: block_threads,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: smem,
            hStream: std::ptr::null_mut(),
            attrs: std::ptr::null_mut(),
            numAttrs: 0,
        };
        let mut n = 0i32;
        // SAFETY: valid function; the config lives for the call.
        unsafe { cu!(cuOccupancyMaxActiveClusters(&mut n, self.raw, &cfg))? };
        Ok(n.max(0) as u32)
    }

    /// Launches the kernel on `stream` with one device pointer per parameter.
    pub fn launch(&self, stream: &Stream, cfg: &LaunchConfig, args: &[u64]) -> Result<()> {
        let mut vals: Vec<u64> = args.to_vec();
        let mut params: Vec<*mut c_void> = vals
            .iter_mut()
            .map(|v| v as *mut u64 as *mut c_void)
            .collect();
        // SAFETY: one pointer-sized value per kernel parameter, alive for the call.
        unsafe { self.launch_raw(stream, cfg, &mut params) }
    }

    /// Launches the kernel with parameters of any type: `params[i]` points to the value of
    /// parameter `i`.
    ///
    /// # Safety
    /// There must be one pointer per kernel parameter, each to a live value of the size and
    /// alignment the kernel declares for that parameter.
    pub unsafe fn launch_raw(
        &self,
        stream: &Stream,
        cfg: &LaunchConfig,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        let smem = cfg.shared_mem_bytes;
        self.reserve_dynamic_smem(smem)?;
        if self.module.ctx.pdl {
            // The kernel may launch while the previous one in the stream finishes; it waits
            // for it before touching memory (every compiled kernel does, `crate::pdl`).
            let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
            attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attr.value.programmaticStreamSerializationAllowed = 1;
            let lc = sys::CUlaunchConfig {
                gridDimX: cfg.grid.0,
                gridDimY: cfg.grid.1,
                gridDimZ: cfg.grid.2,
                blockDimX: cfg.block.0,
                blockDimY: cfg.block.1,
                blockDimZ: cfg.block.2,
                sharedMemBytes: smem,
                hStream: stream.raw,
                attrs: &mut attr,
                numAttrs: 1,
            };
            // SAFETY: the caller passes one live value per kernel parameter; the config and
            // its attribute live for the call.
            return unsafe { cu!(cuLaunchKernelEx(&lc, self.raw, params.as_mut_ptr(), std::ptr::null_mut())) }
                .map_err(|e| self.launch_error(e, cfg));
        }
        // SAFETY: the caller passes one live value per kernel parameter.
        unsafe {
            cu!(cuLaunchKernel(
                self.raw,
                cfg.grid.0,
                cfg.grid.1,
                cfg.grid.2,
                cfg.block.0,
                cfg.block.1,
                cfg.block.2,
                smem,
                stream.raw,
                params.as_mut_ptr(),
                std::ptr::null_mut()
            ))
        }
        .map_err(|e| self.launch_error(e, cfg))
    }

    /// A launch's error with the kernel's name and shape.
    fn launch_error(&self, e: CudaError, cfg: &LaunchConfig) -> CudaError {
        match e {
            CudaError::Driver { call, code, name, detail } => CudaError::Driver {
                call,
                code,
                name,
                detail: format!("kernel {} grid {:?} block {:?}: {detail}", self.name, cfg.grid, cfg.block),
            },
            e => e,
        }
    }
}
