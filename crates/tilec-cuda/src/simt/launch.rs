//! Loading and launching the SIMT f32 GEMM kernel.

use std::sync::Arc;

use super::{applies, kernel_name, tiles, Params};
use crate::driver::{Device, DeviceBuffer, Function, LaunchConfig, Stream};
use crate::error::{CudaError, Result};
use crate::families::OperandRef;
use crate::gemm::Problem;

/// A loaded kernel for one problem and parameter set, with its split-K workspace and tile
/// counters (zero between launches).
pub struct SimtKernel {
    pub name: String,
    pub problem: Problem,
    pub params: Params,
    pub cache_hit: bool,
    func: Function,
    workspace: Option<(DeviceBuffer, DeviceBuffer)>,
}

impl SimtKernel {
    /// Loads a compiled image of [`super::render`]'s source and allocates what the kernel owns.
    pub fn from_image(
        device: &Device,
        problem: &Problem,
        params: &Params,
        a: &OperandRef,
        b: &OperandRef,
        image: &[u8],
        cache_hit: bool,
    ) -> Result<SimtKernel> {
        let name = kernel_name(problem, params, a, b);
        applies(problem, params, device.props().compute_capability)
            .map_err(|msg| CudaError::Schedule { kernel: name.clone(), msg })?;
        let module = Arc::new(device.load_module(image)?);
        let func = module.function(&name)?;
        let workspace = if params.split_k > 1 {
            let t = tiles(problem, params);
            let ws = device.alloc(t * params.split_k * params.tile_m * params.tile_n * 4)?;
            let counters = device.alloc(t * 4)?;
            let s = device.stream()?;
            counters.fill(&s, 0, t * 4, 0)?;
            s.synchronize()?;
            Some((ws, counters))
        } else {
            None
        };
        Ok(SimtKernel { name, problem: problem.clone(), params: *params, cache_hit, func, workspace })
    }

    pub fn function(&self) -> &Function {
        &self.func
    }

    /// The grid: one block per tile and split, batches along z (shared memory is static).
    pub fn launch_config(&self) -> LaunchConfig {
        launch_config(&self.problem, &self.params)
    }

    /// Launches with one device pointer per parameter of the tile-IR kernel.
    pub fn launch(&self, stream: &Stream, ptrs: &[u64]) -> Result<()> {
        let (ws, cnt) = self.workspace.as_ref().map_or((0, 0), |(w, c)| (w.ptr(), c.ptr()));
        let mut args = ptrs.to_vec();
        args.extend([ws, cnt]);
        self.func.launch(stream, &self.launch_config(), &args)
    }
}

/// The launch shape of a problem and parameters.
pub fn launch_config(p: &Problem, q: &Params) -> LaunchConfig {
    LaunchConfig {
        grid: (tiles(p, q) as u32, 1, (p.batch * q.split_k) as u32),
        block: (q.threads() as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}
