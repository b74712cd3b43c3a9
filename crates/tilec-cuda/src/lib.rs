//! The CUDA back end: tile-IR kernels rendered to CUDA C++, compiled at run time with NVRTC for
//! the device's own architecture (with a disk cache), loaded and launched through the driver
//! API, plus GPU schedules for memory-bound kernels.
//!
//! Everything CUDA is loaded at run time: the crate builds, and its non-GPU tests run, on
//! machines without CUDA. [`is_available`] says whether a driver and a device are present;
//! [`Nvrtc::load`] whether the compiler is.
//!
//! - [`driver`]: devices, memory (buffers and a planned arena), streams, events, modules,
//!   launches and CUDA graphs; every failing call is reported by name.
//! - [`nvrtc`]: CUDA C++ → cubin, cached on disk, several modules in parallel.
//! - [`render`]: tile IR → CUDA C++ (`render_cuda`) and launch configuration.
//! - [`schedule`]: GPU schedules for row-wise (softmax/norm) and elementwise kernels.

pub mod driver;
pub mod error;
pub mod handbuilt;
pub mod nvrtc;
pub mod render;
pub mod schedule;

pub use driver::{device_count, driver_version, is_available, Device, DeviceArena, DeviceBuffer, DeviceProps, Event, Function, Graph, LaunchConfig, Module, Stream};
pub use error::{CudaError, Result};
pub use nvrtc::{Compiled, Compiler, Nvrtc, Output};
pub use schedule::{schedule_elementwise, schedule_gpu, schedule_rows, GpuTarget, RowOptions};
pub use render::{launch_config, render, render_cuda, CudaSource, PRELUDE};
