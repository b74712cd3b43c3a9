//! Loading and launching the paged decode kernels.

use std::sync::Arc;

use super::{applies, configs, copy_config, kernel_name, merge_in_attn, workspace_bytes, PagedProblem, Params};
use crate::driver::{Device, DeviceBuffer, Function, LaunchConfig, Stream};
use crate::error::{CudaError, Result};

/// Pointer parameters of `paged_attention` (seven inputs, three outputs).
pub const PARAMS: usize = 10;

/// The kernels of one problem and parameter set, with their workspace.
pub struct PagedKernel {
    pub name: String,
    pub problem: PagedProblem,
    pub params: Params,
    pub cache_hit: bool,
    copy: Function,
    attn: Function,
    merge: Function,
    workspace: DeviceBuffer,
}

impl PagedKernel {
    /// Loads a compiled image of [`super::render`]'s source and allocates the workspace.
    pub fn from_image(device: &Device, problem: &PagedProblem, params: &Params, image: &[u8], cache_hit: bool) -> Result<PagedKernel> {
        let name = kernel_name(problem, params);
        applies(problem, params).map_err(|msg| CudaError::Schedule { kernel: name.clone(), msg })?;
        let module = Arc::new(device.load_module(image)?);
        let f = |suffix: &str| module.function(&format!("{name}_{suffix}"));
        let (copy, attn, merge) = (f("copy")?, f("attn")?, f("merge")?);
        let workspace = device.alloc(workspace_bytes(problem, params))?;
        Ok(PagedKernel { name, problem: problem.clone(), params: *params, cache_hit, copy, attn, merge, workspace })
    }

    /// The attention kernel (the one that reads the caches).
    pub fn function(&self) -> &Function {
        &self.attn
    }

    pub fn launch_config(&self) -> LaunchConfig {
        configs(&self.problem, &self.params)[0]
    }

    /// Launches the step with the ten pointers of `paged_attention`: the caches copied when
    /// the new ones are not the old ones' storage, the chunks (appending the new tokens), the
    /// merge when there is more than one chunk.
    pub fn launch(&self, stream: &Stream, ptrs: &[u64]) -> Result<()> {
        if ptrs.len() != PARAMS {
            return Err(CudaError::Usage(format!("kernel {}: {} pointers for {PARAMS} parameters", self.name, ptrs.len())));
        }
        let mut args = ptrs.to_vec();
        args.push(self.workspace.ptr());
        let p = &self.problem;
        if ptrs[3] != ptrs[8] || ptrs[4] != ptrs[9] {
            self.copy.launch(stream, &copy_config(p.k_cache_elems().max(p.v_cache_elems())), &args)?;
        }
        let [attn, merge] = configs(p, &self.params);
        self.attn.launch(stream, &attn, &args)?;
        if merge_in_attn(p, &self.params) {
            return Ok(());
        }
        self.merge.launch(stream, &merge, &args)
    }
}
