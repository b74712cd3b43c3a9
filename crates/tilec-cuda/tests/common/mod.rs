#![allow(dead_code)]

use rand::{Rng, SeedableRng};
use tilec_cuda::handbuilt;
use tilec_cuda::*;
use tilec_ir::{DType, Tensor};
use tilec_tile::Kernel;

pub const EPS: f32 = 1e-5;

/// The NVRTC library, or None with a printed note.
pub fn nvrtc_or_skip(test: &str) -> Option<Nvrtc> {
    match Nvrtc::load() {
        Ok(n) => Some(n),
        Err(e) => {
            eprintln!("note: {test} skipped: {e} (set TILEC_NVRTC_LIB to a libnvrtc.so)");
            None
        }
    }
}

/// Kernel builders of the benchmark ops: (name, kernel, is a row kernel).
pub fn kernels(rows: i64, cols: i64, d: DType) -> Vec<(&'static str, Kernel, bool)> {
    vec![
        ("softmax", handbuilt::softmax(rows, cols, d), true),
        ("layernorm", handbuilt::layernorm(rows, cols, d, EPS), true),
        ("rmsnorm", handbuilt::rmsnorm(rows, cols, d, EPS), true),
        ("gelu_bias", handbuilt::gelu_bias(rows, cols, d), false),
    ]
}

pub fn schedule(k: &Kernel, row: bool) -> Kernel {
    if row {
        schedule_rows(k, &RowOptions::default()).unwrap_or_else(|e| panic!("{e}"))
    } else {
        schedule_elementwise(k, &GpuTarget::hopper()).unwrap_or_else(|e| panic!("{e}"))
    }
}

/// Random arguments for a kernel: inputs in [-3, 3] (weights in [0.5, 1.5]), the output (last
/// parameter) poisoned with NaN.
pub fn random_args(k: &Kernel, seed: u64) -> Vec<Tensor> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let n = k.params.len();
    k.params
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            let buf = k.buf(b);
            let shape: Vec<usize> = buf.shape.iter().map(|&d| d as usize).collect();
            let count: usize = shape.iter().product();
            let vals: Vec<f64> = if i == n - 1 {
                vec![f64::NAN; count]
            } else if buf.shape.len() == 1 {
                (0..count).map(|_| rng.gen_range(0.5..1.5)).collect()
            } else {
                (0..count).map(|_| rng.gen_range(-3.0..3.0)).collect()
            };
            Tensor::from_f64s(buf.dtype, shape, &vals).unwrap()
        })
        .collect()
}

/// The f64 reference of the benchmark op on all rows, from the (rounded) inputs.
pub fn reference(op: &str, args: &[Tensor], rows: usize, cols: usize) -> Vec<f64> {
    let x = args[0].to_f64_vec();
    let mut out = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        let row = &x[r * cols..(r + 1) * cols];
        let y = match op {
            "softmax" => handbuilt::reference::softmax(row),
            "layernorm" => handbuilt::reference::layernorm(
                row,
                &args[1].to_f64_vec(),
                &args[2].to_f64_vec(),
                EPS as f64,
            ),
            "rmsnorm" => handbuilt::reference::rmsnorm(row, &args[1].to_f64_vec(), EPS as f64),
            "gelu_bias" => {
                handbuilt::reference::gelu_bias(row, &args[1].to_f64_vec(), &args[2].to_f64_vec())
            }
            other => panic!("unknown op {other}"),
        };
        out.extend(y);
    }
    out
}

/// Largest error relative to max(|want|, floor), and a check against a tolerance.
pub fn assert_close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let mut worst = (0.0f64, 0usize);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let e = if g.is_nan() || w.is_nan() {
            f64::INFINITY
        } else {
            (g - w).abs() / w.abs().max(1e-2)
        };
        if e > worst.0 {
            worst = (e, i);
        }
    }
    assert!(
        worst.0 <= tol,
        "{what}: error {} at {} (got {}, want {})",
        worst.0,
        worst.1,
        got[worst.1],
        want[worst.1]
    );
}

pub fn tol(d: DType) -> f64 {
    if d == DType::F32 {
        1e-4
    } else {
        2e-2
    }
}
