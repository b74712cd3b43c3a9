//! The roofline's ceilings for `--profile`, measured on the machine that runs the model rather
//! than taken from a datasheet: a large copy (bytes read plus bytes written) and tilec's own
//! matrix product (f32 on the CPU, 16-bit on the tensor cores of a GPU).

use std::time::Instant;

use anyhow::{Context, Result};
use rand::{Rng, SeedableRng};
use tilec::ir::{Graph, TensorType};
use tilec::runtime::trace::Ceilings;
use tilec::{DType, Tensor};
use tilec_opt::target::Target;

/// The ceilings of the CPU: a 32 MiB copy (best of five) and tilec's f32 GEMM at 2048^3 on every
/// core (best of four); the declared f32 peak if the GEMM cannot be built.
pub fn cpu() -> Ceilings {
    let n = 32 << 20;
    let src = vec![1u8; n];
    let mut dst = vec![0u8; n];
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        dst.copy_from_slice(&src);
        std::hint::black_box(&mut dst);
        best = best.min(t.elapsed().as_secs_f64());
    }
    let gbps = 2.0 * n as f64 / best / 1e9;
    let (gflops, gflops_from) = match cpu_gemm_gflops() {
        Ok(g) => (g, "measured: tilec's f32 GEMM at 2048^3".to_string()),
        Err(e) => {
            println!("note: the GEMM ceiling could not be measured ({e:#}); using the declared peak");
            (Target::host_cpu().peak_f32 / 1e9, "declared f32 peak".to_string())
        }
    };
    Ceilings { gbps, gbps_from: "measured: a 32 MiB copy".into(), gflops, gflops_from }
}

/// A square matrix product `x · y` of `dtype` at `n`.
fn gemm_graph(n: usize, dtype: DType) -> Result<Graph> {
    let mut g = Graph::new("ceiling");
    let x = g.add_input("x", TensorType::fixed(dtype, &[n, n]));
    let y = g.add_input("y", TensorType::fixed(dtype, &[n, n]));
    let z = g.add(tilec::ir::Op::Linalg(tilec::ir::op::LinalgOp::MatMul), &[x, y])?;
    g.set_outputs(vec![z]);
    Ok(g)
}

/// GFLOP/s of tilec's own f32 matrix product at 2048^3 on this CPU (best of four runs).
fn cpu_gemm_gflops() -> Result<f64> {
    let n = 2048;
    let g = gemm_graph(n, DType::F32)?;
    let mut c = tilec::compiled::compile(&g, &tilec::compiled::CompileOptions::default())?;
    let t = Tensor::from_f64s(DType::F32, vec![n, n], &vec![0.5; n * n])?;
    let ins = vec![t.clone(), t];
    let mut best = f64::MAX;
    for _ in 0..4 {
        let s = Instant::now();
        c.run(&ins)?;
        best = best.min(s.elapsed().as_secs_f64());
    }
    Ok(2.0 * (n * n * n) as f64 / best / 1e9)
}

/// The ceilings of GPU `device`: a 1 GiB device-to-device copy and tilec's f16 GEMM at 8192^3
/// on the tensor cores (each the best of several runs, timed with events); the H200's declared
/// figures for either that cannot be measured, with a note.
pub fn cuda(device: usize) -> Ceilings {
    let declared = Target::cuda_h200();
    let (gbps, gbps_from) = match cuda_copy_gbps(device) {
        Ok(g) => (g, "measured: a 1 GiB device copy".to_string()),
        Err(e) => {
            println!("note: the copy ceiling could not be measured ({e:#}); using the declared bandwidth");
            (declared.mem_bw / 1e9, "declared".to_string())
        }
    };
    let (gflops, gflops_from) = match cuda_gemm_gflops(device) {
        Ok(g) => (g, "measured: tilec's f16 GEMM at 8192^3".to_string()),
        Err(e) => {
            println!("note: the GEMM ceiling could not be measured ({e:#}); using the declared peak");
            (declared.peak_mma_16 / 1e9, "declared, 16-bit tensor cores".to_string())
        }
    };
    Ceilings { gbps, gbps_from, gflops, gflops_from }
}

fn cuda_copy_gbps(device: usize) -> Result<f64> {
    let d = tilec::compiled_cuda::open_device(device)?;
    let bytes = 1usize << 30;
    let (src, dst) = (d.alloc(bytes)?, d.alloc(bytes)?);
    let stream = d.stream()?;
    let (start, end) = (d.event()?, d.event()?);
    src.fill(&stream, 0, bytes, 1)?;
    let mut best = f64::MAX;
    for _ in 0..6 {
        start.record(&stream)?;
        tilec_cuda::driver::copy_dtod(&stream, dst.ptr(), src.ptr(), bytes)?;
        end.record(&stream)?;
        best = best.min(end.elapsed_ms_since(&start)? as f64 / 1e3);
    }
    Ok(2.0 * bytes as f64 / best / 1e9)
}

fn cuda_gemm_gflops(device: usize) -> Result<f64> {
    let n = 8192;
    let g = gemm_graph(n, DType::F16)?;
    let opts = tilec::compiled_cuda::CudaOptions { device, ..Default::default() };
    let mut c = tilec::compiled_cuda::compile(&g, &opts).context("compiling the ceiling's GEMM")?;
    // Random operands: constant ones let the tensor cores run cooler and faster than on data.
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut operand = || -> Result<Tensor> {
        let v: Vec<f64> = (0..n * n).map(|_| rng.gen_range(-1.0..1.0)).collect();
        Ok(Tensor::from_f64s(DType::F16, vec![n, n], &v)?)
    };
    let (x, y) = (operand()?, operand()?);
    let times = c.bench(&[x, y], 8)?;
    let best = times.iter().copied().fold(f64::MAX, f64::min) / 1e3;
    Ok(2.0 * (n as f64).powi(3) / best / 1e9)
}
