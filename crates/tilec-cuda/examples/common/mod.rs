//! What the benchmark drivers share: a seeded generator, 16-bit conversions, the median and
//! the timing of a kernel's launches.

#![allow(dead_code)]

use half::{bf16, f16};
use tilec_ir::DType;

/// splitmix64.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e3779b97f4a7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// `x` rounded to bf16 (for `DType::BF16`) or f16, as bits.
pub fn to_bits(d: DType, x: f32) -> u16 {
    match d {
        DType::BF16 => bf16::from_f32(x).to_bits(),
        _ => f16::from_f32(x).to_bits(),
    }
}

pub fn from_bits(d: DType, b: u16) -> f64 {
    match d {
        DType::BF16 => bf16::from_bits(b).to_f64(),
        _ => f16::from_bits(b).to_f64(),
    }
}

pub fn median(mut v: Vec<f32>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    v[v.len() / 2] as f64
}

/// Compiles every module in parallel (the runs then hit the compiler's cache), printing each
/// compile error and a summary line.
pub fn precompile(comp: &tilec_cuda::Compiler, modules: &[(String, String)]) {
    let t0 = std::time::Instant::now();
    for (r, (name, _)) in comp.compile_many(modules).iter().zip(modules) {
        if let Err(e) = r {
            println!("{}", serde_json::json!({"compile_error": name, "error": e.to_string()}));
        }
    }
    println!("{}", serde_json::json!({"compiled": modules.len(), "seconds": t0.elapsed().as_secs_f64()}));
}

/// Runs every case, printing its JSON line (`{"label", "error"}` when it fails to run), then
/// the summary line; returns how many failed (not `"ok": true`, or an error).
pub fn run_all<C>(cases: &[C], label: impl Fn(&C) -> &str, mut run: impl FnMut(&C) -> Result<serde_json::Value, String>) -> usize {
    let mut failed = 0;
    for c in cases {
        match run(c) {
            Ok(j) => {
                if j["ok"] != serde_json::json!(true) {
                    failed += 1;
                }
                println!("{j}");
            }
            Err(e) => {
                failed += 1;
                println!("{}", serde_json::json!({"label": label(c), "error": e}));
            }
        }
    }
    println!("{}", serde_json::json!({"cases": cases.len(), "failed": failed}));
    failed
}

/// The median time in ms of `iters` calls of `launch` on `stream`, each between two events,
/// after `warmup` untimed calls.
pub fn time_ms(
    dev: &tilec_cuda::Device,
    stream: &tilec_cuda::Stream,
    warmup: usize,
    iters: usize,
    mut launch: impl FnMut() -> tilec_cuda::Result<()>,
) -> tilec_cuda::Result<f64> {
    for _ in 0..warmup {
        launch()?;
    }
    let events = (0..iters).map(|_| Ok((dev.event()?, dev.event()?))).collect::<tilec_cuda::Result<Vec<_>>>()?;
    for (e0, e1) in &events {
        e0.record(stream)?;
        launch()?;
        e1.record(stream)?;
    }
    stream.synchronize()?;
    let times = events.iter().map(|(e0, e1)| e1.elapsed_ms_since(e0)).collect::<tilec_cuda::Result<Vec<f32>>>()?;
    Ok(median(times))
}
