//! The error type of the CUDA back end.

/// Everything that can go wrong in the CUDA back end. Driver and NVRTC failures name the call
/// that failed.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// The CUDA driver library (libcuda) could not be loaded, or it reports no usable device.
    #[error("CUDA is not available: {0}")]
    Unavailable(String),
    /// A driver API call returned an error.
    #[error("{call} failed: {name} ({code}){}", detail_suffix(.detail))]
    Driver {
        call: &'static str,
        code: u32,
        name: String,
        detail: String,
    },
    /// The NVRTC library could not be loaded.
    #[error("NVRTC is not available: {0}")]
    NvrtcUnavailable(String),
    /// An NVRTC call failed (for a compilation, the log is included).
    #[error("{call} failed for module {module}: {msg}")]
    Nvrtc {
        call: &'static str,
        module: String,
        msg: String,
    },
    /// The cuBLASLt library could not be loaded.
    #[error("cuBLAS not found: {0}")]
    CublasUnavailable(String),
    /// A cuBLASLt call failed.
    #[error("{call} failed: {msg}")]
    Cublas { call: &'static str, msg: String },
    /// A kernel cannot be rendered to CUDA C++.
    #[error("kernel {kernel}: cannot render for CUDA: {msg}")]
    Render { kernel: String, msg: String },
    /// A GPU schedule does not apply to a kernel.
    #[error("kernel {kernel}: {msg}")]
    Schedule { kernel: String, msg: String },
    /// Wrong use of the runtime API (sizes, offsets, argument counts).
    #[error("{0}")]
    Usage(String),
}

fn detail_suffix(d: &str) -> String {
    if d.is_empty() {
        String::new()
    } else {
        format!(": {d}")
    }
}

pub type Result<T, E = CudaError> = std::result::Result<T, E>;
