//! Shared by the CPU family tests: random f32 inputs, the reference interpreter's output for a graph, and
//! compiled runs compared with it, each after poisoning every buffer (so a kernel that skips
//! elements or reads what it never wrote fails).
#![allow(dead_code)] // each test crate uses a part of it

use std::collections::HashMap;

use rand::Rng;
use tilec::compiled::Compiled;
use tilec_ir::{Graph, Tensor};

/// An f32 tensor of `shape` with values uniform in `[lo, hi)`.
pub fn random(shape: &[usize], rng: &mut impl Rng, lo: f32, hi: f32) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|_| rng.gen_range(lo..hi)).collect();
    Tensor::from_vec(shape.to_vec(), v).unwrap()
}

/// The first output of `g` on `inputs` (in the graph's input order), by the reference
/// interpreter.
pub fn reference(g: &Graph, inputs: &[Tensor]) -> Tensor {
    let names = g.inputs().iter().map(|&v| g.value(v).name.clone());
    tilec_ref::run_named(g, names.zip(inputs.iter().cloned()).collect::<HashMap<_, _>>())
        .unwrap()
        .remove(0)
}

/// Two poisoned runs of `c` on `inputs`, each output element within `atol + rtol * |want|`.
pub fn check_runs(name: &str, c: &mut Compiled, inputs: &[Tensor], want: &Tensor, atol: f64, rtol: f64) {
    let w = want.to_f64_vec();
    for run in 0..2 {
        c.poison().unwrap_or_else(|e| panic!("{name}: {e}"));
        let got = c.run(inputs).unwrap_or_else(|e| panic!("{name}: {e}")).remove(0);
        assert_eq!(got.shape(), want.shape(), "{name}");
        for (i, (a, b)) in w.iter().zip(&got.to_f64_vec()).enumerate() {
            assert!((a - b).abs() <= atol + rtol * a.abs(), "{name} run {run}: element {i}: reference {a}, compiled {b}");
        }
    }
}
