//! The host CPU as the C renderer sees it: the one target description's CPU part
//! (`tilec_opt::target::CpuTarget`: instruction sets, caches, threads).

pub use tilec_opt::target::CpuTarget as CpuInfo;
