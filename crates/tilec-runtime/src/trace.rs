//! What a profile shows beyond its table: the calls on a timeline (Chrome's trace event
//! format, which Perfetto and `chrome://tracing` open), where the time goes by kind of kernel
//! (with the gaps between calls), and a roofline plot (SVG) with each kernel as a point under
//! the memory and compute ceilings.

use std::fmt::Write;

use serde::{Deserialize, Serialize};

use crate::Profile;

/// One call: when it started (after the recorder's epoch) and how long it took.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Span {
    pub name: String,
    pub start_ns: u64,
    pub dur_ns: u64,
    /// The run it belongs to ([`Profile::begin_run`]; 0: recorded outside any run).
    #[serde(default)]
    pub run: u32,
}

/// The kind of a kernel from its name (`k12_conv [cpu.direct]` → `conv`, `k3_gemm_1` →
/// `gemm`): the partitioner's group kind.
pub fn kind_of(name: &str) -> &str {
    let base = name.split_whitespace().next().unwrap_or(name);
    let rest = base.strip_prefix('k').map(|r| r.trim_start_matches(|c: char| c.is_ascii_digit())).unwrap_or(base);
    let rest = rest.strip_prefix('_').unwrap_or(rest);
    let end = rest.find(|c: char| !c.is_ascii_alphabetic()).unwrap_or(rest.len());
    if end == 0 {
        "other"
    } else {
        &rest[..end]
    }
}

/// The profile as Chrome trace events (JSON): one complete event per call, named by kernel,
/// in a category of its kind, with its bytes and FLOPs per call.
pub fn chrome_trace(p: &Profile) -> String {
    let per_call = |name: &str| {
        p.kernels.iter().find(|k| k.name == name).map_or((0, 0), |k| {
            let c = k.calls.max(1);
            (k.bytes / c, k.flops / c)
        })
    };
    let events: Vec<serde_json::Value> = p
        .spans
        .iter()
        .map(|s| {
            let (bytes, flops) = per_call(&s.name);
            serde_json::json!({
                "name": s.name, "cat": kind_of(&s.name), "ph": "X", "pid": 1, "tid": 1,
                "ts": s.start_ns as f64 / 1e3, "dur": s.dur_ns as f64 / 1e3,
                "args": {"bytes": bytes, "flops": flops},
            })
        })
        .collect();
    serde_json::json!({"traceEvents": events, "displayTimeUnit": "ms"}).to_string()
}

/// Time by kind of kernel, most first, plus `gaps` (between consecutive calls of a run: the
/// host's share), as (kind, nanoseconds, percent of the sum).
pub fn time_by_kind(p: &Profile) -> Vec<(String, u64, f64)> {
    let mut kinds: Vec<(String, u64)> = vec![];
    for k in &p.kernels {
        let kind = kind_of(&k.name).to_string();
        match kinds.iter_mut().find(|x| x.0 == kind) {
            Some(x) => x.1 = x.1.saturating_add(k.total_ns),
            None => kinds.push((kind, k.total_ns)),
        }
    }
    // Gaps: between one call's end and the next call's start within a run (calls recorded
    // outside runs: when the next starts within 10 ms).
    let mut spans: Vec<&Span> = p.spans.iter().collect();
    spans.sort_by_key(|s| s.start_ns);
    let gaps: u64 = spans
        .windows(2)
        .filter(|w| if w[0].run > 0 || w[1].run > 0 { w[0].run == w[1].run } else { w[1].start_ns < w[0].start_ns + w[0].dur_ns + 10_000_000 })
        .map(|w| w[1].start_ns.saturating_sub(w[0].start_ns + w[0].dur_ns))
        .sum();
    if !spans.is_empty() {
        kinds.push(("gaps".to_string(), gaps));
    }
    let total: u64 = kinds.iter().map(|k| k.1).sum();
    kinds.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    kinds
        .into_iter()
        .map(|(k, ns)| (k, ns, if total == 0 { 0.0 } else { 100.0 * ns as f64 / total as f64 }))
        .collect()
}

/// The ceilings of a roofline: memory bandwidth (GB/s) and compute (GFLOP/s), each with where
/// it came from (`measured`, `declared`).
#[derive(Debug, Clone, PartialEq)]
pub struct Ceilings {
    pub gbps: f64,
    pub gbps_from: String,
    pub gflops: f64,
    pub gflops_from: String,
}

/// Each kernel's arithmetic intensity (FLOP/byte), achieved GFLOP/s and the fraction of the
/// roofline's ceiling at its intensity, for kernels that do arithmetic.
pub fn roofline_points(p: &Profile, c: &Ceilings) -> Vec<(String, f64, f64, f64)> {
    p.kernels
        .iter()
        .filter(|k| k.flops > 0 && k.bytes > 0 && k.total_ns > 0)
        .map(|k| {
            let ai = k.flops as f64 / k.bytes as f64;
            let roof = (ai * c.gbps).min(c.gflops);
            (k.name.clone(), ai, k.gflops(), if roof > 0.0 { k.gflops() / roof } else { 0.0 })
        })
        .collect()
}

/// One kernel against the roofline: what binds it on this device, how close it runs to its
/// ceiling, and the time it would take at the ceiling.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Bound {
    pub name: String,
    pub calls: u64,
    pub total_ms: f64,
    /// FLOP per byte moved (0 for kernels that only move data).
    pub intensity: f64,
    pub gbps: f64,
    pub gflops: f64,
    /// `memory` below the ridge point (the ceilings' ratio), `compute` above.
    pub bound: &'static str,
    /// Achieved over the ceiling at this intensity (bandwidth for kernels without FLOPs).
    pub roof_fraction: f64,
    /// The time at the ceiling, all calls.
    pub roof_ms: f64,
    pub detail: String,
}

/// Every kernel with a recorded time against the ceilings, slowest first.
pub fn bounds(p: &Profile, c: &Ceilings) -> Vec<Bound> {
    p.rows()
        .into_iter()
        .filter(|r| r.kernel.total_ns > 0)
        .map(|r| {
            let k = &r.kernel;
            let intensity = if k.bytes > 0 { k.flops as f64 / k.bytes as f64 } else { 0.0 };
            let ridge = c.gflops / c.gbps.max(1e-9);
            // Seconds at the ceilings: the longer of moving the bytes and doing the FLOPs.
            let at_roof = (k.bytes as f64 / (c.gbps * 1e9).max(1e-9)).max(k.flops as f64 / (c.gflops * 1e9).max(1e-9));
            let took = k.total_ns as f64 / 1e9;
            Bound {
                name: k.name.clone(),
                calls: k.calls,
                total_ms: took * 1e3,
                intensity,
                gbps: r.gbps,
                gflops: r.gflops,
                bound: if k.flops > 0 && intensity >= ridge { "compute" } else { "memory" },
                roof_fraction: at_roof / took,
                roof_ms: at_roof * 1e3,
                detail: k.detail.clone(),
            }
        })
        .collect()
}

/// The profile of `runs` runs against the roofline as a table (slowest first; times per run),
/// closed by the account of the gap: the time at the ceilings against the time taken, and the
/// kernels that lose the most.
pub fn bounds_table(p: &Profile, c: &Ceilings, runs: usize) -> String {
    let b = bounds(p, c);
    let per_run = 1.0 / runs.max(1) as f64;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "roofline: {:.1} GB/s ({}), {:.1} TFLOP/s ({}); ridge at {:.1} FLOP/B",
        c.gbps,
        c.gbps_from,
        c.gflops / 1e3,
        c.gflops_from,
        c.gflops / c.gbps.max(1e-9)
    );
    let _ = writeln!(s, "{:<44} {:>9} {:>7} {:>9} {:>9} {:>8} {:>6}  detail", "kernel", "ms/run", "FLOP/B", "GB/s", "GFLOP/s", "bound", "roof");
    for k in &b {
        let name: String = k.name.chars().take(44).collect();
        let _ = writeln!(
            s,
            "{name:<44} {:>9.3} {:>7.1} {:>9.1} {:>9.1} {:>8} {:>5.0}%  {}",
            k.total_ms * per_run,
            k.intensity,
            k.gbps,
            k.gflops,
            k.bound,
            100.0 * k.roof_fraction,
            k.detail
        );
    }
    let took: f64 = b.iter().map(|k| k.total_ms).sum::<f64>() * per_run;
    let roof: f64 = b.iter().map(|k| k.roof_ms).sum::<f64>() * per_run;
    let _ = writeln!(
        s,
        "gap to the roofline: {took:.3} ms taken per run, {roof:.3} ms at the ceilings ({:.0}% of the roofline over the run)",
        if took > 0.0 { 100.0 * roof / took } else { 0.0 }
    );
    let mut lost: Vec<&Bound> = b.iter().collect();
    lost.sort_by(|x, y| (y.total_ms - y.roof_ms).total_cmp(&(x.total_ms - x.roof_ms)));
    for k in lost.iter().take(5) {
        let lost = (k.total_ms - k.roof_ms) * per_run;
        let share = if took > roof { 100.0 * lost / (took - roof) } else { 0.0 };
        let _ = writeln!(s, "  {lost:.3} ms lost ({share:.0}% of the gap): {} ({}-bound)", k.name, k.bound);
    }
    s
}

/// A log-log roofline plot (SVG): the ceilings as lines, each kernel as a labelled point.
pub fn roofline_svg(p: &Profile, c: &Ceilings, title: &str) -> String {
    let pts = roofline_points(p, c);
    let (w, h, m) = (900.0, 560.0, 70.0);
    let ai_lo = pts.iter().map(|x| x.1).fold(c.gflops / c.gbps, f64::min).max(1e-3) / 4.0;
    let ai_hi = pts.iter().map(|x| x.1).fold(c.gflops / c.gbps, f64::max) * 4.0;
    let g_hi = c.gflops * 2.0;
    let g_lo = pts.iter().map(|x| x.2).filter(|&g| g > 0.0).fold(c.gbps * ai_lo, f64::min).max(1e-6) / 2.0;
    let x = |ai: f64| m + (ai.ln() - ai_lo.ln()) / (ai_hi.ln() - ai_lo.ln()) * (w - 2.0 * m);
    let y = |g: f64| h - m - (g.ln() - g_lo.ln()) / (g_hi.ln() - g_lo.ln()) * (h - 2.0 * m);
    let esc = |s: &str| s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
    let mut s = String::new();
    let _ = writeln!(s, r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">"#);
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(s, r#"<text x="{m}" y="24" font-size="14">{}</text>"#, esc(title));
    let _ = writeln!(
        s,
        r#"<line x1="{m}" y1="{b}" x2="{r}" y2="{b}" stroke="black"/><line x1="{m}" y1="{m}" x2="{m}" y2="{b}" stroke="black"/>"#,
        b = h - m,
        r = w - m
    );
    let _ = writeln!(s, r#"<text x="{}" y="{}" text-anchor="middle">arithmetic intensity (FLOP/byte, log)</text>"#, w / 2.0, h - 20.0);
    let _ = writeln!(s, r#"<text x="18" y="{}" transform="rotate(-90 18 {})" text-anchor="middle">achieved GFLOP/s (log)</text>"#, h / 2.0, h / 2.0);
    // Decade ticks on both axes.
    let decades = |lo: f64, hi: f64| {
        let (a, b) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
        (a..=b).map(|e| 10f64.powi(e)).filter(move |v| *v >= lo && *v <= hi).collect::<Vec<_>>()
    };
    for v in decades(ai_lo, ai_hi) {
        let _ = writeln!(s, r#"<text x="{:.1}" y="{}" text-anchor="middle">{v}</text>"#, x(v), h - m + 16.0);
    }
    for v in decades(g_lo, g_hi) {
        let _ = writeln!(s, r#"<text x="{}" y="{:.1}" text-anchor="end">{v}</text>"#, m - 6.0, y(v) + 4.0);
    }
    // The roof: bandwidth slope up to the ridge, then the compute ceiling.
    let ridge = c.gflops / c.gbps;
    let _ = writeln!(
        s,
        r##"<polyline fill="none" stroke="#c33" stroke-width="2" points="{:.1},{:.1} {:.1},{:.1} {:.1},{:.1}"/>"##,
        x(ai_lo),
        y(ai_lo * c.gbps),
        x(ridge),
        y(c.gflops),
        x(ai_hi),
        y(c.gflops)
    );
    let _ = writeln!(
        s,
        r##"<text x="{:.1}" y="{:.1}" fill="#c33">{:.0} GB/s ({}) · {:.0} GFLOP/s ({})</text>"##,
        x(ridge) + 8.0,
        y(c.gflops) - 8.0,
        c.gbps,
        esc(&c.gbps_from),
        c.gflops,
        esc(&c.gflops_from)
    );
    for (name, ai, g, frac) in &pts {
        let (px, py) = (x(*ai), y(g.max(g_lo)));
        let _ = writeln!(
            s,
            r##"<circle cx="{px:.1}" cy="{py:.1}" r="4" fill="#36c"><title>{} — {ai:.2} FLOP/B, {g:.1} GFLOP/s, {:.0}% of the roof</title></circle><text x="{:.1}" y="{:.1}" fill="#333">{}</text>"##,
            esc(name),
            frac * 100.0,
            px + 6.0,
            py - 4.0,
            esc(name.split_whitespace().next().unwrap_or(name))
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Profile {
        let mut p = Profile::default();
        p.record_span("k0_conv [cpu.blis_gemm]", 1_000, 4_000, 1_000_000, 40_000_000);
        p.record_span("k1_elementwise", 6_000, 1_000, 2_000_000, 500_000);
        p.record_span("k0_conv [cpu.blis_gemm]", 100_000_000, 4_000, 1_000_000, 40_000_000);
        p.record_span("k1_elementwise", 100_005_000, 1_000, 2_000_000, 500_000);
        p
    }

    #[test]
    fn kinds_come_from_kernel_names() {
        assert_eq!(kind_of("k12_conv [cpu.direct]"), "conv");
        assert_eq!(kind_of("k3_gemm_1"), "gemm");
        assert_eq!(kind_of("k4_normalization"), "normalization");
        assert_eq!(kind_of("weird"), "weird");
        assert_eq!(kind_of("k9_"), "other");
    }

    #[test]
    fn trace_has_one_event_per_call_with_its_bytes() {
        let p = sample();
        let t: serde_json::Value = serde_json::from_str(&chrome_trace(&p)).unwrap();
        let ev = t["traceEvents"].as_array().unwrap();
        assert_eq!(ev.len(), 4);
        assert_eq!(ev[0]["ph"], "X");
        assert_eq!(ev[0]["cat"], "conv");
        assert_eq!(ev[1]["ts"].as_f64(), Some(6.0));
        assert_eq!(ev[1]["dur"].as_f64(), Some(1.0));
        assert_eq!(ev[0]["args"]["bytes"], 1_000_000);
    }

    #[test]
    fn time_by_kind_counts_gaps_within_a_run_only() {
        let k = time_by_kind(&sample());
        let get = |n: &str| k.iter().find(|x| x.0 == n).map(|x| x.1);
        assert_eq!(get("conv"), Some(8_000));
        assert_eq!(get("elementwise"), Some(2_000));
        // 1 us between the calls of each run; the 100 ms between runs is not a gap.
        assert_eq!(get("gaps"), Some(2_000));
        assert_eq!(k[0].0, "conv");
        let pct: f64 = k.iter().map(|x| x.2).sum();
        assert!((pct - 100.0).abs() < 1e-9);
    }

    #[test]
    fn gaps_count_within_a_run_only_when_runs_are_marked() {
        let mut p = Profile::default();
        p.begin_run();
        p.record_span("k0_conv", 0, 1_000, 0, 0);
        p.record_span("k1_conv", 3_000, 1_000, 0, 0);
        p.begin_run();
        // 5 us after the last run's end: another run, not a gap.
        p.record_span("k0_conv", 9_000, 1_000, 0, 0);
        let k = time_by_kind(&p);
        assert_eq!(k.iter().find(|x| x.0 == "gaps").map(|x| x.1), Some(2_000));
        assert_eq!(p.spans.iter().map(|s| s.run).collect::<Vec<_>>(), vec![1, 1, 2]);
    }

    #[test]
    fn bounds_say_what_binds_each_kernel_and_the_gap() {
        let c = Ceilings { gbps: 20.0, gbps_from: "measured".into(), gflops: 150.0, gflops_from: "declared".into() };
        let mut p = sample();
        p.describe("k0_conv [cpu.blis_gemm]", "mr 6");
        let b = bounds(&p, &c);
        assert_eq!(b.len(), 2);
        // 40 FLOP/B over a ridge of 7.5: compute-bound; 80 MFLOP at 150 GFLOP/s take 533 us
        // (the sample runs faster than its ceilings allow: the fraction shows it as it is).
        assert_eq!((b[0].name.as_str(), b[0].bound, b[0].detail.as_str()), ("k0_conv [cpu.blis_gemm]", "compute", "mr 6"));
        assert!((b[0].roof_ms - 80e6 / 150e9 * 1e3).abs() < 1e-9);
        // 4 MB at 20 GB/s: 200 us at the roof against 2 us taken.
        assert_eq!(b[1].bound, "memory");
        assert!((b[1].roof_fraction - 0.2e-3 / 2e-6).abs() < 1e-6);
        let t = bounds_table(&p, &c, 2);
        assert!(t.contains("ridge at 7.5 FLOP/B") && t.contains("gap to the roofline") && t.contains("mr 6"));
    }

    #[test]
    fn roofline_places_kernels_under_the_roof() {
        let c = Ceilings { gbps: 20.0, gbps_from: "measured".into(), gflops: 150.0, gflops_from: "declared".into() };
        let pts = roofline_points(&sample(), &c);
        let conv = pts.iter().find(|p| p.0.starts_with("k0")).unwrap();
        assert!((conv.1 - 40.0).abs() < 1e-9); // 40 FLOP per byte: compute-bound.
        assert!((conv.2 - 10_000.0).abs() < 1e-6); // 80 MFLOP in 8 us.
        let svg = roofline_svg(&sample(), &c, "t <1>");
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<circle").count(), 2);
        assert!(svg.contains("t &lt;1&gt;") && svg.contains("GB/s (measured)"));
    }
}
