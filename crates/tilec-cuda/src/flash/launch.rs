//! Loading and launching the FlashAttention kernel.

use std::sync::Arc;

use super::render::FlashArgs;
use super::{applies, grid, kernel_name, FlashProblem, Params};
use crate::driver::{Device, Function, LaunchConfig, Stream};
use crate::error::{CudaError, Result};

/// A loaded kernel for one problem and parameter set.
pub struct FlashKernel {
    pub name: String,
    pub problem: FlashProblem,
    pub params: Params,
    pub args: FlashArgs,
    pub cache_hit: bool,
    func: Function,
}

impl FlashKernel {
    /// Loads a compiled image of [`super::render`]'s source (checking the device and raising
    /// the dynamic shared memory limit: outside any graph capture).
    pub fn from_image(device: &Device, problem: &FlashProblem, params: &Params, args: &FlashArgs, image: &[u8], cache_hit: bool) -> Result<FlashKernel> {
        let name = kernel_name(problem, params, args);
        applies(problem, params, device.props().compute_capability).map_err(|msg| CudaError::Schedule { kernel: name.clone(), msg })?;
        let module = Arc::new(device.load_module(image)?);
        let func = module.function(&name)?;
        func.reserve_dynamic_smem(params.smem_bytes(problem.head_dim) as u32)?;
        Ok(FlashKernel { name, problem: problem.clone(), params: *params, args: args.clone(), cache_hit, func })
    }

    pub fn function(&self) -> &Function {
        &self.func
    }

    /// The grid: query blocks, query heads, batches.
    pub fn launch_config(&self) -> LaunchConfig {
        config(&self.problem, &self.params)
    }

    /// Launches with one device pointer per pointer parameter and no log-sum-exp output.
    pub fn launch(&self, stream: &Stream, ptrs: &[u64]) -> Result<()> {
        self.launch_with_lse(stream, ptrs, 0)
    }

    /// Launches, also writing the log-sum-exp of every row (f32 `[batch][heads][seq_q]`) at
    /// `lse` when it is not 0.
    pub fn launch_with_lse(&self, stream: &Stream, ptrs: &[u64], lse: u64) -> Result<()> {
        if ptrs.len() != self.args.params {
            return Err(CudaError::Usage(format!("kernel {}: {} pointers for {} parameters", self.name, ptrs.len(), self.args.params)));
        }
        let mut args = ptrs.to_vec();
        args.push(lse);
        self.func.launch(stream, &self.launch_config(), &args)
    }
}

/// The launch shape of a problem and parameters.
pub fn config(p: &FlashProblem, q: &Params) -> LaunchConfig {
    LaunchConfig { grid: grid(p, q), block: (q.threads() as u32, 1, 1), shared_mem_bytes: q.smem_bytes(p.head_dim) as u32 }
}
