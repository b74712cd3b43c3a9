//! The CPU back end: scheduled tile-IR kernels rendered to C, compiled by the system C compiler
//! into a shared object, cached on disk and loaded.
//!
//! Calling convention of every generated kernel:
//! `void NAME(void *const *args)`, where `args[i]` points at the first element of the kernel's
//! `i`-th parameter buffer (`Kernel::params` order), row-major and contiguous.
