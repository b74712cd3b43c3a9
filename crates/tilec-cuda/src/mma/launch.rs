//! Loading, binding and launching the `mma.sync` GEMM kernel.

use std::sync::{Arc, Mutex};

use super::{applies, kernel_name, tiles, MmaProblem, Params};
use crate::driver::{Device, DeviceBuffer, Function, LaunchConfig, Stream};
use crate::error::{CudaError, Result};
use crate::families::OperandRef;

/// A loaded kernel for one problem and parameter set, with what it owns on the device: the
/// split-K workspace and tile counters, and a convolution's repacked weights.
pub struct MmaKernel {
    pub name: String,
    pub problem: MmaProblem,
    pub params: Params,
    pub b: OperandRef,
    pub cache_hit: bool,
    func: Function,
    repack: Option<Function>,
    /// Partial tiles (f32) and one arrival counter per tile (zero between launches).
    workspace: Option<(DeviceBuffer, DeviceBuffer)>,
    /// The repacked weights, and the weights' address they were made from.
    packed: Option<DeviceBuffer>,
    packed_from: Mutex<Option<u64>>,
}

impl MmaKernel {
    /// Loads a compiled image of [`super::render`]'s source and allocates what the kernel owns.
    pub fn from_image(
        device: &Device,
        problem: &MmaProblem,
        params: &Params,
        a: &OperandRef,
        b: &OperandRef,
        image: &[u8],
        cache_hit: bool,
    ) -> Result<MmaKernel> {
        let name = kernel_name(problem, params, a, b);
        applies(problem, params, device.props().compute_capability)
            .map_err(|msg| CudaError::Schedule { kernel: name.clone(), msg })?;
        let module = Arc::new(device.load_module(image)?);
        let func = module.function(&name)?;
        func.reserve_dynamic_smem(params.smem_bytes() as u32)?;
        let repack = match problem.conv {
            Some(_) => Some(module.function(&format!("{name}_repack"))?),
            None => None,
        };
        let workspace = if params.split_k > 1 {
            let t = tiles(&problem.gemm, params);
            let ws = device.alloc(t * params.split_k * params.tile_m * params.tile_n * 4)?;
            let counters = device.alloc(t * 4)?;
            let s = device.stream()?;
            counters.fill(&s, 0, t * 4, 0)?;
            s.synchronize()?;
            Some((ws, counters))
        } else {
            None
        };
        let packed = match &problem.conv {
            Some(c) => Some(device.alloc(problem.gemm.n * c.k_padded() * 2)?),
            None => None,
        };
        Ok(MmaKernel {
            name,
            problem: problem.clone(),
            params: *params,
            b: b.clone(),
            cache_hit,
            func,
            repack,
            workspace,
            packed,
            packed_from: Mutex::new(None),
        })
    }

    pub fn function(&self) -> &Function {
        &self.func
    }

    /// The grid: one block per tile and split, batches along z.
    pub fn launch_config(&self) -> LaunchConfig {
        let (p, q) = (&self.problem.gemm, &self.params);
        LaunchConfig {
            grid: (tiles(p, q) as u32, 1, (p.batch * q.split_k) as u32),
            block: (q.threads() as u32, 1, 1),
            shared_mem_bytes: q.smem_bytes() as u32,
        }
    }

    /// Prepares what depends on the pointers (a convolution's repacked weights) on `stream`,
    /// and waits for it: call before launching, outside any graph capture. The weights must
    /// not change afterwards (they are a model's constants).
    pub fn bind(&self, stream: &Stream, ptrs: &[u64]) -> Result<()> {
        let (Some(repack), Some(out)) = (&self.repack, &self.packed) else {
            return Ok(());
        };
        let w = ptrs
            .get(self.b.param)
            .map(|p| p + self.b.offset_bytes)
            .ok_or_else(|| CudaError::Usage(format!("kernel {}: weight parameter {} missing", self.name, self.b.param)))?;
        let mut from = self.packed_from.lock().map_err(|_| CudaError::Usage("repack state poisoned".into()))?;
        if *from == Some(w) {
            return Ok(());
        }
        let total = out.len() / 2;
        let cfg = LaunchConfig { grid: (total.div_ceil(256) as u32, 1, 1), block: (256, 1, 1), shared_mem_bytes: 0 };
        repack.launch(stream, &cfg, &[w, out.ptr()])?;
        stream.synchronize()?;
        *from = Some(w);
        Ok(())
    }

    /// Launches with one device pointer per parameter of the tile-IR kernel.
    pub fn launch(&self, stream: &Stream, ptrs: &[u64]) -> Result<()> {
        let packed = match &self.packed {
            Some(buf) => {
                let from = *self.packed_from.lock().map_err(|_| CudaError::Usage("repack state poisoned".into()))?;
                let w = ptrs.get(self.b.param).map(|p| p + self.b.offset_bytes);
                if from.is_none() || from != w {
                    return Err(CudaError::Usage(format!(
                        "kernel {}: launched before its weights were repacked (bind it first)",
                        self.name
                    )));
                }
                buf.ptr()
            }
            None => 0,
        };
        let (ws, cnt) = self.workspace.as_ref().map_or((0, 0), |(w, c)| (w.ptr(), c.ptr()));
        let mut args = ptrs.to_vec();
        args.extend([packed, ws, cnt]);
        self.func.launch(stream, &self.launch_config(), &args)
    }
}
