//! What the code generator needs to know about the host CPU.

/// Vector ISA and cache sizes of a CPU.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CpuInfo {
    pub avx512f: bool,
    pub avx2: bool,
    pub fma: bool,
    /// Per-core L1 data cache.
    pub l1d_bytes: usize,
    /// Per-core L2 cache.
    pub l2_bytes: usize,
    /// Shared last-level cache.
    pub l3_bytes: usize,
    /// Logical CPUs available to this process.
    pub threads: usize,
}

impl CpuInfo {
    /// Detects the host CPU (features at run time; cache sizes from sysfs with common defaults).
    pub fn detect() -> CpuInfo {
        #[cfg(target_arch = "x86_64")]
        let (avx512f, avx2, fma) = (
            std::arch::is_x86_feature_detected!("avx512f"),
            std::arch::is_x86_feature_detected!("avx2"),
            std::arch::is_x86_feature_detected!("fma"),
        );
        #[cfg(not(target_arch = "x86_64"))]
        let (avx512f, avx2, fma) = (false, false, false);
        let mut info = CpuInfo {
            avx512f,
            avx2,
            fma,
            l1d_bytes: 32 << 10,
            l2_bytes: 1 << 20,
            l3_bytes: 8 << 20,
            threads: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
        };
        for idx in 0..8 {
            let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{idx}");
            let read = |f: &str| {
                std::fs::read_to_string(format!("{dir}/{f}"))
                    .ok()
                    .map(|s| s.trim().to_string())
            };
            let (Some(level), Some(kind), Some(size)) = (read("level"), read("type"), read("size"))
            else {
                continue;
            };
            let Some(bytes) = parse_size(&size) else {
                continue;
            };
            match (level.as_str(), kind.as_str()) {
                ("1", "Data") => info.l1d_bytes = bytes,
                ("2", _) => info.l2_bytes = bytes,
                ("3", _) => info.l3_bytes = bytes,
                _ => {}
            }
        }
        info
    }

    /// A baseline x86-64 CPU with SSE only (for portable code).
    pub fn baseline() -> CpuInfo {
        CpuInfo {
            avx512f: false,
            avx2: false,
            fma: false,
            l1d_bytes: 32 << 10,
            l2_bytes: 256 << 10,
            l3_bytes: 8 << 20,
            threads: 1,
        }
    }

    /// Width of the widest usable vector register in bytes.
    pub fn vector_bytes(&self) -> usize {
        if self.avx512f {
            64
        } else if self.avx2 {
            32
        } else {
            16
        }
    }

    /// Lanes of a vector of `elem_bytes`-sized elements.
    pub fn lanes(&self, elem_bytes: usize) -> usize {
        self.vector_bytes() / elem_bytes.max(1)
    }
}

fn parse_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, mul) = if let Some(n) = s.strip_suffix('K') {
        (n, 1 << 10)
    } else if let Some(n) = s.strip_suffix('M') {
        (n, 1 << 20)
    } else if let Some(n) = s.strip_suffix('G') {
        (n, 1 << 30)
    } else {
        (s, 1)
    };
    num.trim().parse::<usize>().ok().map(|n| n * mul)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("48K"), Some(48 << 10));
        assert_eq!(parse_size("2M"), Some(2 << 20));
        assert_eq!(parse_size("512"), Some(512));
        assert_eq!(parse_size("x"), None);
    }
}
