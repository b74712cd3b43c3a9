//! Per-kernel profiling records and their rendering.

use serde::{Deserialize, Serialize};

/// Accumulated figures for one kernel over all its calls.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct KernelProfile {
    pub name: String,
    /// Number of calls recorded.
    pub calls: u64,
    /// Wall time over all calls, in nanoseconds.
    pub total_ns: u64,
    /// Bytes read and written over all calls.
    pub bytes: u64,
    /// Floating-point operations over all calls (a multiply-add counts as two).
    pub flops: u64,
    /// What the back end says of the kernel: family parameters, launch shape, registers,
    /// shared memory, spills (empty when nothing was said).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

impl KernelProfile {
    /// Achieved bandwidth in GB/s (10^9 bytes per second); 0 when no time was recorded.
    pub fn gbps(&self) -> f64 {
        per_ns(self.bytes, self.total_ns)
    }

    /// Achieved GFLOP/s; 0 when no time was recorded.
    pub fn gflops(&self) -> f64 {
        per_ns(self.flops, self.total_ns)
    }
}

fn per_ns(x: u64, ns: u64) -> f64 {
    if ns == 0 {
        0.0
    } else {
        x as f64 / ns as f64
    }
}

/// One rendered row: the record and the figures derived from it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProfileRow {
    #[serde(flatten)]
    pub kernel: KernelProfile,
    /// Mean time per call in milliseconds.
    pub mean_ms: f64,
    /// Share of the profile's total time, in percent.
    pub share_pct: f64,
    pub gbps: f64,
    pub gflops: f64,
}

/// Profiling records of a run, one per kernel name, in first-recorded order.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Profile {
    pub kernels: Vec<KernelProfile>,
    /// Each call with its start, for a timeline (`crate::trace`); empty when calls were
    /// recorded without one.
    #[serde(default)]
    pub spans: Vec<crate::trace::Span>,
    /// Runs begun ([`Profile::begin_run`]); the spans recorded since belong to the last.
    #[serde(default)]
    pub runs: u32,
}

impl Profile {
    pub fn new() -> Self {
        Profile::default()
    }

    /// Adds one call of kernel `name` that took `ns` nanoseconds and moved `bytes` bytes and
    /// `flops` operations (per call).
    pub fn record(&mut self, name: &str, ns: u64, bytes: u64, flops: u64) {
        let k = match self.kernels.iter().position(|k| k.name == name) {
            Some(i) => &mut self.kernels[i],
            None => {
                self.kernels.push(KernelProfile {
                    name: name.to_string(),
                    ..Default::default()
                });
                self.kernels.last_mut().expect("just pushed")
            }
        };
        k.calls += 1;
        k.total_ns = k.total_ns.saturating_add(ns);
        k.bytes = k.bytes.saturating_add(bytes);
        k.flops = k.flops.saturating_add(flops);
    }

    /// [`record`](Self::record), also keeping the call on the timeline: it started `start_ns`
    /// after the profile's epoch (any fixed instant of the caller's).
    pub fn record_span(&mut self, name: &str, start_ns: u64, ns: u64, bytes: u64, flops: u64) {
        self.record(name, ns, bytes, flops);
        self.spans.push(crate::trace::Span { name: name.to_string(), start_ns, dur_ns: ns, run: self.runs });
    }

    /// Starts a run: the spans recorded after it belong together (gaps are counted within a
    /// run, never between two).
    pub fn begin_run(&mut self) {
        self.runs += 1;
    }

    /// Sets what is known of kernel `name` beyond its figures (kept from the first call that
    /// said something).
    pub fn describe(&mut self, name: &str, detail: &str) {
        if let Some(k) = self.kernels.iter_mut().find(|k| k.name == name) {
            if k.detail.is_empty() {
                k.detail = detail.to_string();
            }
        }
    }

    /// Adds the records of `other` (for example from another run).
    pub fn merge(&mut self, other: &Profile) {
        for o in &other.kernels {
            match self.kernels.iter_mut().find(|k| k.name == o.name) {
                Some(k) => {
                    k.calls += o.calls;
                    k.total_ns = k.total_ns.saturating_add(o.total_ns);
                    k.bytes = k.bytes.saturating_add(o.bytes);
                    k.flops = k.flops.saturating_add(o.flops);
                    if k.detail.is_empty() {
                        k.detail = o.detail.clone();
                    }
                }
                None => self.kernels.push(o.clone()),
            }
        }
    }

    /// Sum of all kernels' time in nanoseconds.
    pub fn total_ns(&self) -> u64 {
        self.kernels
            .iter()
            .fold(0u64, |a, k| a.saturating_add(k.total_ns))
    }

    /// The rows, slowest kernel first (ties by name).
    pub fn rows(&self) -> Vec<ProfileRow> {
        let total = self.total_ns();
        let mut rows: Vec<ProfileRow> = self
            .kernels
            .iter()
            .map(|k| ProfileRow {
                kernel: k.clone(),
                mean_ms: if k.calls == 0 {
                    0.0
                } else {
                    k.total_ns as f64 / k.calls as f64 / 1e6
                },
                share_pct: if total == 0 {
                    0.0
                } else {
                    100.0 * k.total_ns as f64 / total as f64
                },
                gbps: k.gbps(),
                gflops: k.gflops(),
            })
            .collect();
        rows.sort_by(|a, b| {
            b.kernel
                .total_ns
                .cmp(&a.kernel.total_ns)
                .then_with(|| a.kernel.name.cmp(&b.kernel.name))
        });
        rows
    }

    /// A plain-text table, slowest kernel first, with a total line.
    pub fn render_table(&self) -> String {
        let rows = self.rows();
        let header = [
            "kernel", "calls", "total ms", "mean ms", "share", "MB", "MFLOP", "GB/s", "GFLOP/s",
        ];
        let mut cells: Vec<[String; 9]> = rows
            .iter()
            .map(|r| {
                let k = &r.kernel;
                [
                    k.name.clone(),
                    k.calls.to_string(),
                    format!("{:.3}", k.total_ns as f64 / 1e6),
                    format!("{:.3}", r.mean_ms),
                    format!("{:.1}%", r.share_pct),
                    format!("{:.2}", k.bytes as f64 / 1e6),
                    format!("{:.1}", k.flops as f64 / 1e6),
                    format!("{:.2}", r.gbps),
                    format!("{:.2}", r.gflops),
                ]
            })
            .collect();
        let total = self.total_ns();
        let (bytes, flops, calls) = self
            .kernels
            .iter()
            .fold((0u64, 0u64, 0u64), |(b, f, c), k| {
                (
                    b.saturating_add(k.bytes),
                    f.saturating_add(k.flops),
                    c + k.calls,
                )
            });
        cells.push([
            "total".to_string(),
            calls.to_string(),
            format!("{:.3}", total as f64 / 1e6),
            String::new(),
            if total == 0 {
                "0.0%".into()
            } else {
                "100.0%".into()
            },
            format!("{:.2}", bytes as f64 / 1e6),
            format!("{:.1}", flops as f64 / 1e6),
            format!("{:.2}", per_ns(bytes, total)),
            format!("{:.2}", per_ns(flops, total)),
        ]);
        let mut width = header.map(|h| h.chars().count());
        for row in &cells {
            for (w, c) in width.iter_mut().zip(row) {
                *w = (*w).max(c.chars().count());
            }
        }
        let line = |row: &[String]| -> String {
            let mut s = String::new();
            for (i, (c, w)) in row.iter().zip(width).enumerate() {
                if i == 0 {
                    s.push_str(&format!("{c:<w$}"));
                } else {
                    s.push_str(&format!("  {c:>w$}"));
                }
            }
            s.trim_end().to_string() + "\n"
        };
        let mut out = line(&header.map(String::from));
        out.push_str(&line(&width.map(|w| "-".repeat(w))));
        let n = cells.len();
        for (i, row) in cells.iter().enumerate() {
            if i + 1 == n {
                out.push_str(&line(&width.map(|w| "-".repeat(w))));
            }
            out.push_str(&line(row));
        }
        out
    }

    /// The rows as JSON (`{"total_ns": .., "kernels": [rows, slowest first]}`).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({ "total_ns": self.total_ns(), "kernels": self.rows() })
    }
}

impl std::fmt::Display for Profile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.render_table())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Profile {
        let mut p = Profile::new();
        p.record("conv_0", 2_000_000, 4_000_000, 200_000_000);
        p.record("relu_1", 500_000, 8_000_000, 1_000_000);
        p.record("conv_0", 2_000_000, 4_000_000, 200_000_000);
        p.record("gemm_2", 1_500_000, 3_000_000, 300_000_000);
        p
    }

    #[test]
    fn accumulates_and_derives() {
        let p = sample();
        assert_eq!(p.kernels.len(), 3);
        let conv = &p.kernels[0];
        assert_eq!(
            (conv.calls, conv.total_ns, conv.bytes, conv.flops),
            (2, 4_000_000, 8_000_000, 400_000_000)
        );
        assert!((conv.gbps() - 2.0).abs() < 1e-12);
        assert!((conv.gflops() - 100.0).abs() < 1e-12);
        let rows = p.rows();
        let names: Vec<&str> = rows.iter().map(|r| r.kernel.name.as_str()).collect();
        assert_eq!(names, ["conv_0", "gemm_2", "relu_1"]);
        assert!((rows[0].share_pct - 66.666_666).abs() < 1e-3);
        assert!((rows[0].mean_ms - 2.0).abs() < 1e-12);
        assert!((rows.iter().map(|r| r.share_pct).sum::<f64>() - 100.0).abs() < 1e-9);
        assert!((rows[2].gbps - 16.0).abs() < 1e-12);
        assert_eq!(KernelProfile::default().gflops(), 0.0);
    }

    #[test]
    fn table_is_sorted_and_aligned() {
        let t = sample().render_table();
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 7, "{t}");
        assert!(lines[0].starts_with("kernel") && lines[0].ends_with("GFLOP/s"));
        assert!(
            lines[2].starts_with("conv_0 ")
                && lines[2].contains("66.7%")
                && lines[2].ends_with("100.00")
        );
        assert!(lines[3].starts_with("gemm_2 ") && lines[3].ends_with("200.00"));
        assert!(lines[4].starts_with("relu_1 ") && lines[4].contains("16.00"));
        assert!(
            lines[6].starts_with("total ")
                && lines[6].contains("6.000")
                && lines[6].contains("100.0%")
        );
        // Every line of the table body has the same width as the header rule.
        assert!(lines[2..5].iter().all(|l| l.len() == lines[1].len()), "{t}");
        assert!(Profile::new().render_table().contains("total"));
    }

    #[test]
    fn json_round_trips() {
        let p = sample();
        let v = p.to_json();
        assert_eq!(v["total_ns"], 6_000_000);
        assert_eq!(v["kernels"][0]["name"], "conv_0");
        assert_eq!(v["kernels"][0]["calls"], 2);
        assert_eq!(v["kernels"][1]["gflops"], 200.0);
        let rows: Vec<ProfileRow> = serde_json::from_value(v["kernels"].clone()).unwrap();
        assert_eq!(rows, p.rows());
        let back: Profile = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
        assert_eq!(back, p);
        let mut m = Profile::new();
        m.merge(&p);
        m.merge(&p);
        assert_eq!(m.kernels[0].calls, 4);
        assert_eq!(m.total_ns(), 12_000_000);
    }
}
