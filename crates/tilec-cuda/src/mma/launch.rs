//! Loading, binding and launching the `mma.sync` GEMM kernel.

use std::sync::Arc;

use super::{applies, kernel_name, tiles, MmaProblem, Params};
use crate::driver::{Device, DeviceBuffer, Function, LaunchConfig, Stream};
use crate::error::{CudaError, Result};
use crate::families::OperandRef;
use crate::repack::Repacked;

/// A loaded kernel for one problem and parameter set, with what it owns on the device: the
/// split-K workspace and tile counters, and a convolution's repacked weights.
pub struct MmaKernel {
    pub name: String,
    pub problem: MmaProblem,
    pub params: Params,
    pub b: OperandRef,
    pub cache_hit: bool,
    func: Function,

    /// Partial tiles (f32) and one arrival counter per tile (zero between launches).
    workspace: Option<(DeviceBuffer, DeviceBuffer)>,
    /// A convolution's repacked weights.
    packed: Option<Repacked>,
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
            Some(c) => {
                let f = module.function(&format!("{name}_repack"))?;
                Some(Repacked::new(&name, f, device.alloc(problem.gemm.n * c.k_padded() * 2)?))
            }
            None => None,
        };
        Ok(MmaKernel {
            name,
            problem: problem.clone(),
            params: *params,
            b: b.clone(),
            cache_hit,
            func,
            workspace,
            packed,
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
        match &self.packed {
            Some(p) => p.bind(stream, self.weights(ptrs)?),
            None => Ok(()),
        }
    }

    fn weights(&self, ptrs: &[u64]) -> Result<u64> {
        ptrs.get(self.b.param)
            .map(|p| p + self.b.offset_bytes)
            .ok_or_else(|| CudaError::Usage(format!("kernel {}: weight parameter {} missing", self.name, self.b.param)))
    }

    /// Launches with one device pointer per parameter of the tile-IR kernel.
    pub fn launch(&self, stream: &Stream, ptrs: &[u64]) -> Result<()> {
        let packed = match &self.packed {
            Some(p) => p.ptr(self.weights(ptrs)?)?,
            None => 0,
        };
        let (ws, cnt) = self.workspace.as_ref().map_or((0, 0), |(w, c)| (w.ptr(), c.ptr()));
        let mut args = ptrs.to_vec();
        args.extend([packed, ws, cnt]);
        self.func.launch(stream, &self.launch_config(), &args)
    }
}
