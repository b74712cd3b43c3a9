//! The repo's transformer exports (models/, made by scripts/gen-models.py from PyTorch)
//! import with their symbolic batch/sequence dims and reproduce PyTorch's outputs on the
//! reference interpreter, at the reference batch size and at another one.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tilec_ir::{Dim, Op, Tensor};
use tilec_onnx::{import_file, ImportOptions};

fn model_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models").join(name)
}

fn load_set(dir: &Path, prefix: &str) -> Vec<Tensor> {
    (0..)
        .map(|i| dir.join(format!("test_data_set_0/{prefix}_{i}.pb")))
        .take_while(|p| p.exists())
        .map(|p| tilec_onnx::tensor::tensor_from_proto(&tilec_onnx::load::load_tensor_pb(&p).unwrap()).unwrap())
        .collect()
}

fn max_err(want: &Tensor, got: &Tensor, rtol: f64, atol: f64) -> Option<String> {
    assert_eq!(want.shape(), got.shape());
    let (w, g) = (want.to_f64_vec(), got.to_f64_vec());
    let bad = (0..w.len()).filter(|&i| (w[i] - g[i]).abs() > atol + rtol * w[i].abs()).count();
    (bad > 0).then(|| format!("{bad}/{} elements out of tolerance", w.len()))
}

fn check(name: &str) {
    let dir = model_dir(name);
    let g = import_file(&dir.join("model.onnx"), &ImportOptions::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
    tilec_ir::verify(&g).unwrap();
    // The batch and sequence dims stay symbolic.
    let syms: Vec<&str> = g.inputs()[0..1]
        .iter()
        .flat_map(|&v| g.value(v).ty.shape.clone())
        .filter_map(|d| match d {
            Dim::Sym(s) => Some(g.syms.name(s)),
            Dim::Fixed(_) => None,
        })
        .collect();
    assert_eq!(syms, vec!["batch", "seq"], "{name}: inputs keep symbolic dims");
    // Shape arithmetic was folded away at import.
    let shape_ops = g.nodes().iter().filter(|n| matches!(n.op, Op::Source(_)) && n.op.name() == "shape").count();
    assert_eq!(shape_ops, 0);

    let inputs = load_set(&dir, "input");
    let expected = load_set(&dir, "output");
    let names: Vec<String> = g.inputs().iter().map(|&v| g.value(v).name.clone()).collect();
    let feeds: HashMap<String, Tensor> = names.iter().cloned().zip(inputs.iter().cloned()).collect();
    let outs = tilec_ref::run_named(&g, feeds).unwrap_or_else(|e| panic!("{name}: {e}"));
    if let Some(m) = max_err(&expected[0], &outs[0], 1e-3, 1e-4) {
        panic!("{name}: {m}");
    }

    // Another batch/sequence size through the same graph: the first row of a batch of
    // one must equal the corresponding row of the reference run (rows are independent).
    let row: Vec<Tensor> = inputs
        .iter()
        .map(|t| {
            let (s, v) = (t.shape().to_vec(), t.to_i64_vec());
            Tensor::from_vec(vec![1, s[1]], v[..s[1]].to_vec()).unwrap()
        })
        .collect();
    let feeds: HashMap<String, Tensor> = names.iter().cloned().zip(row).collect();
    let out1 = tilec_ref::run_named(&g, feeds).unwrap_or_else(|e| panic!("{name} batch 1: {e}"));
    let full = outs[0].to_f64_vec();
    let one = out1[0].to_f64_vec();
    assert_eq!(out1[0].shape()[0], 1);
    let n = one.len();
    let want = Tensor::from_vec(out1[0].shape().to_vec(), full[..n].iter().map(|&x| x as f32).collect()).unwrap();
    if let Some(m) = max_err(&want, &out1[0], 1e-3, 1e-4) {
        panic!("{name} batch 1 vs batch 2 row 0: {m}");
    }
}

#[test]
fn gpt2_style_export() {
    check("gpt2");
}

#[test]
fn bert_style_export() {
    check("bert");
}

#[test]
fn llama_style_export() {
    check("llama");
}

/// The compiled CPU path on the exports: specialized to the reference inputs' batch and
/// sequence, memory plan checked, arena poisoned, outputs equal to PyTorch's within tolerance;
/// and again at batch 1 against the reference interpreter.
fn check_compiled(name: &str) {
    let dir = model_dir(name);
    let inputs = load_set(&dir, "input");
    let expected = load_set(&dir, "output");
    let shape = inputs[0].shape().to_vec();
    let cache = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/tilec-cache");
    for (batch, want) in [(shape[0], None), (1, Some(()))] {
        let dims = HashMap::from([("batch".to_string(), batch), ("seq".to_string(), shape[1])]);
        let g = import_file(&dir.join("model.onnx"), &ImportOptions { dim_values: dims, ..Default::default() })
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let feeds: Vec<Tensor> = inputs
            .iter()
            .map(|t| {
                let v = t.to_i64_vec();
                Tensor::from_i64s(t.dtype(), vec![batch, shape[1]], &v[..batch * shape[1]]).unwrap()
            })
            .collect();
        let opts = tilec::compiled::CompileOptions { cache_dir: Some(cache.clone()), ..Default::default() };
        let mut c = tilec::compiled::compile(&g, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(!c.interpreted(), "{name}: compiled, not interpreted");
        assert!(c.report.fallbacks.is_empty(), "{name}: fallbacks {:?}", c.report.fallbacks);
        c.check_plan().unwrap_or_else(|e| panic!("{name}: memory plan: {e}"));
        assert!(c.report.arena_bytes < c.report.intermediate_bytes, "{name}: the arena reuses memory");
        c.poison().unwrap_or_else(|e| panic!("{name}: {e}"));
        let outs = c.run(&feeds).unwrap_or_else(|e| panic!("{name}: {e}"));
        let reference = match want {
            None => expected[0].clone(),
            Some(()) => {
                let names: Vec<String> = g.inputs().iter().map(|&v| g.value(v).name.clone()).collect();
                tilec_ref::run_named(&g, names.into_iter().zip(feeds.clone()).collect()).unwrap().remove(0)
            }
        };
        if let Some(m) = max_err(&reference, &outs[0], 1e-3, 1e-4) {
            panic!("{name} compiled at batch {batch}: {m}");
        }
    }
}

#[test]
fn gpt2_style_export_compiled() {
    check_compiled("gpt2");
}

#[test]
fn bert_style_export_compiled() {
    check_compiled("bert");
}

#[test]
fn llama_style_export_compiled() {
    check_compiled("llama");
}
