//! Times the host side of a CUDA compile, no GPU needed: import with fixed dimensions, then
//! `compiled_cuda::prepare` (optimize, partition, lower, schedule, render) for the H200 preset,
//! best of `--reps`, with the optimizer's slowest passes.
//!
//! ```text
//! cargo run --release -p tilec --example prepare_cuda -- model.onnx --dim batch=8 --dim seq=512 --reps 5
//! ```
//!
//! `--dump DIR` also writes each kernel's CUDA source (`DIR/<index>_<entry>.cu`) as it would be
//! compiled, to read or compile with NVRTC on a machine without a GPU.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tilec::compiled_cuda::{prepare, CudaOptions};
use tilec::ImportOptions;
use tilec_opt::manager::{Pipeline, PipelineOptions};
use tilec_opt::target::TargetKind;

fn usage(why: &str) -> ! {
    eprintln!("{why}\nusage: prepare_cuda MODEL.onnx [--dim NAME=N]... [--reps N] [--dump DIR]");
    std::process::exit(2)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let mut model = None;
    let mut dims = HashMap::new();
    let mut reps = 5usize;
    let mut dump: Option<std::path::PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--dim" => {
                let d = args.next().unwrap_or_else(|| usage("--dim needs NAME=N"));
                let (k, v) = d.split_once('=').unwrap_or_else(|| usage("--dim needs NAME=N"));
                dims.insert(k.to_string(), v.parse().unwrap_or_else(|_| usage("--dim needs NAME=N")));
            }
            "--dump" => dump = Some(args.next().unwrap_or_else(|| usage("--dump needs a directory")).into()),
            "--reps" => reps = args.next().and_then(|n| n.parse().ok()).unwrap_or_else(|| usage("--reps needs a number")),
            _ if model.is_none() => model = Some(a),
            _ => usage(&format!("unexpected argument {a}")),
        }
    }
    let model = model.unwrap_or_else(|| usage("no model"));
    let t = Instant::now();
    let g = tilec::load(model.as_ref(), &ImportOptions { dim_values: dims, ..Default::default() })
        .unwrap_or_else(|e| usage(&format!("{model}: {e}")));
    println!("import {:.1} ms, {} nodes", ms(t.elapsed()), g.nodes().len());

    let gpu = tilec_cuda::GpuTarget::hopper();
    let opts = CudaOptions::default();
    let mut best: Option<(Duration, Duration, Duration)> = None;
    let mut kernels = 0;
    for _ in 0..reps.max(1) {
        let p = prepare(&g, &opts, &gpu).unwrap_or_else(|e| usage(&format!("prepare: {e}")));
        let r = &p.report;
        kernels = p.kernels().len();
        println!("prepare: optimize {:.1} ms, lower+schedule {:.1} ms, total {:.1} ms", ms(r.optimize), ms(r.lower), ms(r.total));
        if best.is_none_or(|b| r.total < b.2) {
            best = Some((r.optimize, r.lower, r.total));
        }
    }
    if let Some(dir) = &dump {
        let p = prepare(&g, &opts, &gpu).unwrap_or_else(|e| usage(&format!("prepare: {e}")));
        std::fs::create_dir_all(dir).unwrap_or_else(|e| usage(&format!("{}: {e}", dir.display())));
        for (i, k) in p.kernels().iter().enumerate() {
            let path = dir.join(format!("{i:03}_{}.cu", k.source.name));
            std::fs::write(&path, &k.source.source).unwrap_or_else(|e| usage(&format!("{}: {e}", path.display())));
        }
        println!("wrote {} kernel sources to {}", p.kernels().len(), dir.display());
    }
    let (o, l, t) = best.unwrap_or_default();
    println!("best of {reps}: optimize {:.1} ms, lower+schedule {:.1} ms, total {:.1} ms ({kernels} kernels)", ms(o), ms(l), ms(t));

    // The optimizer alone, pass by pass (the slowest five).
    let mut g2 = g.clone();
    let pipe = Pipeline::for_level_target_with(opts.opt_level, TargetKind::Cuda, true);
    let reports = pipe.run(&mut g2, &PipelineOptions::default()).unwrap_or_else(|e| usage(&format!("optimize: {e}")));
    let mut by_time: Vec<_> = reports.iter().collect();
    by_time.sort_by(|a, b| b.time.cmp(&a.time));
    let total: Duration = reports.iter().map(|r| r.time).sum();
    println!("passes: {:.1} ms in {} runs; slowest:", ms(total), reports.len());
    for r in by_time.iter().take(5) {
        println!("  {:<22} round {} {:>8.2} ms", r.pass, r.iteration, ms(r.time));
    }
}
