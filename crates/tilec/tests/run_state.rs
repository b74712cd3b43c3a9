//! `Executor::run_state`: state carried from a run's outputs into the next run's inputs
//! without leaving the back end, against the same recurrence computed on the host.

mod poisoned;

use std::path::{Path, PathBuf};

use rand::SeedableRng;
use tilec::compiled::{compile, CompileOptions, Compiled};
use tilec_ir::op::{BinaryOp, UnaryOp};
use tilec_ir::{DType, Graph, Op, Tensor, TensorType};

fn cache() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/tilec-cache")
}

const N: usize = 300;

/// Inputs `p`, `x`, `q`; outputs `y = tanh(p) * x`, `p' = q + x`, `q' = p * 0.5 + x`: the
/// state pairs (p' → p, q' → q) swap the two states through the step, so whatever storage the
/// planner gives the new states, carrying them needs care.
fn swap_graph() -> Graph {
    let mut g = Graph::new("swap");
    let f = TensorType::fixed(DType::F32, &[N]);
    let p = g.add_input("p", f.clone());
    let x = g.add_input("x", f.clone());
    let q = g.add_input("q", f);
    let t = g.add(Op::Unary(UnaryOp::Tanh), &[p]).unwrap();
    let y = g.add(Op::Binary(BinaryOp::Mul), &[t, x]).unwrap();
    let p2 = g.add(Op::Binary(BinaryOp::Add), &[q, x]).unwrap();
    let half = g.add_const("half", Tensor::scalar(0.5f32));
    let ph = g.add(Op::Binary(BinaryOp::Mul), &[p, half]).unwrap();
    let q2 = g.add(Op::Binary(BinaryOp::Add), &[ph, x]).unwrap();
    g.set_outputs(vec![y, p2, q2]);
    g
}

fn compiled() -> Compiled {
    compile(&swap_graph(), &CompileOptions { cache_dir: Some(cache()), threads: 1, ..Default::default() }).unwrap()
}

fn close(name: &str, got: &Tensor, want: &[f32]) {
    let g = got.to_f64_vec();
    assert_eq!(g.len(), want.len(), "{name}");
    for (i, (a, b)) in want.iter().zip(&g).enumerate() {
        assert!((*a as f64 - b).abs() <= 1e-5 + 1e-5 * (*a as f64).abs(), "{name}: element {i}: want {a}, got {b}");
    }
}

const STATE: [(usize, usize); 2] = [(1, 0), (2, 2)];

#[test]
fn state_stays_between_runs() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let mut c = compiled();
    c.poison().unwrap();
    let (p0, q0) = (poisoned::random(&[N], &mut rng, -1.0, 1.0), poisoned::random(&[N], &mut rng, -1.0, 1.0));
    let (mut p, mut q) = (p0.to_f64_vec().iter().map(|&v| v as f32).collect::<Vec<_>>(), q0.to_f64_vec().iter().map(|&v| v as f32).collect::<Vec<_>>());
    for run in 0..5 {
        let x = poisoned::random(&[N], &mut rng, -1.0, 1.0);
        let xs: Vec<f32> = x.to_f64_vec().iter().map(|&v| v as f32).collect();
        let first = run == 0;
        let outs = c.run_state(&[first.then_some(&p0), Some(&x), first.then_some(&q0)], &STATE, &[true, false, false]).unwrap();
        assert!(outs[1].is_none() && outs[2].is_none(), "run {run}: outputs not asked for were read back");
        let want_y: Vec<f32> = p.iter().zip(&xs).map(|(a, b)| a.tanh() * b).collect();
        close(&format!("run {run}: y"), outs[0].as_ref().unwrap(), &want_y);
        let np: Vec<f32> = q.iter().zip(&xs).map(|(a, b)| a + b).collect();
        let nq: Vec<f32> = p.iter().zip(&xs).map(|(a, b)| a * 0.5 + b).collect();
        (p, q) = (np, nq);
        close(&format!("run {run}: state p"), &c.read_input(0).unwrap(), &p);
        close(&format!("run {run}: state q"), &c.read_input(2).unwrap(), &q);
    }
}

#[test]
fn state_left_out_must_have_been_left_there() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(6);
    let mut c = compiled();
    let t = poisoned::random(&[N], &mut rng, -1.0, 1.0);
    // Never run: nothing to keep.
    let e = c.run_state(&[None, Some(&t), Some(&t)], &STATE, &[true, true, true]).unwrap_err().to_string();
    assert!(e.contains("input 'p' was left out but holds no state"), "{e}");
    // x is not a state input: leaving it out after a stateful run is refused too.
    c.run_state(&[Some(&t), Some(&t), Some(&t)], &STATE, &[true, true, true]).unwrap();
    let e = c.run_state(&[None, None, None], &STATE, &[true, true, true]).unwrap_err().to_string();
    assert!(e.contains("input 'x' was left out"), "{e}");
    // A plain run clears the state.
    c.run(&[t.clone(), t.clone(), t.clone()]).unwrap();
    let e = c.run_state(&[None, Some(&t), None], &STATE, &[true, true, true]).unwrap_err().to_string();
    assert!(e.contains("input 'p' was left out"), "{e}");
    // Malformed pairs and counts.
    for (state, want) in [(&[(1usize, 0usize), (2, 0)][..], "each input at most once"), (&[(3, 0)][..], "expected an output and an input"), (&[(0, 0)][..], "")] {
        let r = c.run_state(&[Some(&t), Some(&t), Some(&t)], state, &[true, true, true]);
        if want.is_empty() {
            // y and p have the same type: a legal pair.
            r.unwrap();
        } else {
            let e = r.unwrap_err().to_string();
            assert!(e.contains(want), "{state:?}: {e}");
        }
    }
    let e = c.run_state(&[Some(&t)], &STATE, &[true]).unwrap_err().to_string();
    assert!(e.contains("the model has 3 inputs and 3 outputs"), "{e}");
    let bad = poisoned::random(&[N + 1], &mut rng, -1.0, 1.0);
    let e = c.run_state(&[Some(&bad), Some(&t), Some(&t)], &STATE, &[true, true, true]).unwrap_err().to_string();
    assert!(e.contains("input 'p': expected f32[300]"), "{e}");
}
