//! Loading, binding and launching the GEMV kernel.

use std::sync::Arc;

use super::{applies, kernel_name, packed_len, repacked, smem_bytes, tiles, workspace, Params};
use crate::driver::{Device, DeviceBuffer, Function, LaunchConfig, Stream};
use crate::error::{CudaError, Result};
use crate::families::OperandRef;
use crate::repack::Repacked;
use crate::gemm::Problem;

/// A loaded kernel for one problem and parameter set, with what it owns on the device: the
/// split-K workspace and tile counters, and a row-major B's repacked copy.
pub struct GemvKernel {
    pub name: String,
    pub problem: Problem,
    pub params: Params,
    pub b: OperandRef,
    pub cache_hit: bool,
    func: Function,
    /// Partial sums (f32) and one arrival counter per tile (zero between launches).
    workspace: Option<(DeviceBuffer, DeviceBuffer)>,
    /// A row-major B repacked into K-contiguous rows.
    packed: Option<Repacked>,
}

impl GemvKernel {
    /// Loads a compiled image of [`super::render`]'s source and allocates what the kernel owns.
    pub fn from_image(
        device: &Device,
        problem: &Problem,
        params: &Params,
        a: &OperandRef,
        b: &OperandRef,
        image: &[u8],
        cache_hit: bool,
    ) -> Result<GemvKernel> {
        let name = kernel_name(problem, params, a, b);
        applies(problem, params, device.props().compute_capability)
            .map_err(|msg| CudaError::Schedule { kernel: name.clone(), msg })?;
        let module = Arc::new(device.load_module(image)?);
        let func = module.function(&name)?;
        func.reserve_dynamic_smem(smem_bytes(problem, params) as u32)?;
        let (floats, counters) = workspace(problem, params);
        let workspace = if counters > 0 {
            let ws = device.alloc(floats * 4)?;
            let cnt = device.alloc(counters * 4)?;
            let s = device.stream()?;
            cnt.fill(&s, 0, counters * 4, 0)?;
            s.synchronize()?;
            Some((ws, cnt))
        } else {
            None
        };
        let packed = if repacked(problem, params) {
            let f = module.function(&format!("{name}_repack"))?;
            Some(Repacked::new(&name, f, device.alloc(packed_len(problem, params) * 2)?))
        } else {
            None
        };
        Ok(GemvKernel {
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

    /// The grid: column tiles along x, splits of K along y, batches along z.
    pub fn launch_config(&self) -> LaunchConfig {
        config(&self.problem, &self.params)
    }

    /// Repacks a row-major B into K-contiguous rows on `stream` and waits: call before
    /// launching, outside any graph capture. The weights must not change afterwards (they are
    /// a model's constants). Nothing to do for a column-major B.
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

/// The launch shape of a problem and parameters.
pub fn config(p: &Problem, q: &Params) -> LaunchConfig {
    LaunchConfig {
        grid: (tiles(p, q) as u32, q.split_k as u32, p.batch as u32),
        block: (q.threads() as u32, 1, 1),
        shared_mem_bytes: smem_bytes(p, q) as u32,
    }
}
