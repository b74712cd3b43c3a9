//! Weights repacked once, when a kernel is bound: a template's module carries a `_repack`
//! kernel (`(weights, out)`, one thread per element of the output; see
//! [`crate::gemm::render_repack`] and the GEMV family's), the loaded kernel owns the output
//! buffer, and launches read it. The weights are a model's constants: repacking runs on the
//! first bind (outside any graph capture) and again only if the weights' address changes.

use std::sync::Mutex;

use crate::driver::{DeviceBuffer, Function, LaunchConfig, Stream};
use crate::error::{CudaError, Result};

/// A kernel's repacked weights and the repacking kernel that makes them.
pub struct Repacked {
    /// The owning kernel's name, for messages.
    kernel: String,
    func: Function,
    out: DeviceBuffer,
    /// The weights' address the output was made from.
    from: Mutex<Option<u64>>,
}

impl Repacked {
    /// `out` holds 16-bit elements; `func` writes each of them.
    pub fn new(kernel: &str, func: Function, out: DeviceBuffer) -> Repacked {
        Repacked { kernel: kernel.to_string(), func, out, from: Mutex::new(None) }
    }

    fn state(&self) -> Result<std::sync::MutexGuard<'_, Option<u64>>> {
        self.from.lock().map_err(|_| CudaError::Usage(format!("kernel {}: repack state poisoned", self.kernel)))
    }

    /// Repacks the weights at `w` on `stream` and waits, unless they already were.
    pub fn bind(&self, stream: &Stream, w: u64) -> Result<()> {
        let mut from = self.state()?;
        if *from == Some(w) {
            return Ok(());
        }
        let total = self.out.len() / 2;
        let cfg = LaunchConfig { grid: (total.div_ceil(256) as u32, 1, 1), block: (256, 1, 1), shared_mem_bytes: 0 };
        self.func.launch(stream, &cfg, &[w, self.out.ptr()])?;
        stream.synchronize()?;
        *from = Some(w);
        Ok(())
    }

    /// The repacked weights' address, once they were made from the weights at `w`.
    pub fn ptr(&self, w: u64) -> Result<u64> {
        if *self.state()? != Some(w) {
            return Err(CudaError::Usage(format!(
                "kernel {}: launched before its weights were repacked (bind it first)",
                self.kernel
            )));
        }
        Ok(self.out.ptr())
    }
}
