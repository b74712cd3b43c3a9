//! Differential check of the whole -O3 pipeline on the repo's transformer exports
//! (models/): the optimized graph must reproduce the unoptimized one and PyTorch's
//! reference outputs, on the reference inputs and on fresh random token ids, for both
//! targets' pipelines.

use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::path::Path;
use tilec_ir::{Graph, Tensor};
use tilec_onnx::{import_file, ImportOptions};
use tilec_opt::manager::{Pipeline, PipelineOptions};
use tilec_opt::passes::TargetKind;

fn load(dir: &Path, prefix: &str) -> Vec<Tensor> {
    (0..)
        .map(|i| dir.join(format!("test_data_set_0/{prefix}_{i}.pb")))
        .take_while(|p| p.exists())
        .map(|p| tilec_onnx::tensor::tensor_from_proto(&tilec_onnx::load::load_tensor_pb(&p).unwrap()).unwrap())
        .collect()
}

fn run(g: &Graph, inputs: &[Tensor]) -> Vec<Tensor> {
    let feeds: HashMap<String, Tensor> =
        g.inputs().iter().map(|&v| g.value(v).name.clone()).zip(inputs.iter().cloned()).collect();
    tilec_ref::run_named(g, feeds).unwrap()
}

fn assert_close(what: &str, want: &Tensor, got: &Tensor, rtol: f64, atol: f64) {
    assert_eq!(want.shape(), got.shape(), "{what}");
    let (w, g) = (want.to_f64_vec(), got.to_f64_vec());
    let bad: Vec<usize> = (0..w.len()).filter(|&i| !((w[i] - g[i]).abs() <= atol + rtol * w[i].abs())).collect();
    assert!(bad.is_empty(), "{what}: {}/{} elements differ, e.g. {} vs {}", bad.len(), w.len(), w[bad[0]], g[bad[0]]);
}

fn check(name: &str) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models").join(name);
    let g0 = import_file(&dir.join("model.onnx"), &ImportOptions::default()).unwrap();
    let inputs = load(&dir, "input");
    let expected = load(&dir, "output");
    let before = run(&g0, &inputs);
    // Random token ids (vocabulary 1024) at another batch and sequence length; masks stay ones.
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let random: Vec<Tensor> = inputs
        .iter()
        .enumerate()
        .map(|(k, _)| {
            let v: Vec<i64> = (0..3 * 17).map(|_| if k == 0 { rng.gen_range(0..1024) } else { 1 }).collect();
            Tensor::from_vec(vec![3, 17], v).unwrap()
        })
        .collect();
    let before_random = run(&g0, &random);
    for target in [TargetKind::Cpu, TargetKind::Cuda] {
        let mut g = g0.clone();
        let opts = PipelineOptions { verify: true, print_ir_after: None };
        Pipeline::for_level_and_target(3, target).run(&mut g, &opts).unwrap();
        assert!(g.nodes().len() < g0.nodes().len(), "{name}: -O3 removes nodes");
        let after = run(&g, &inputs);
        assert_close(&format!("{name} {target:?} vs PyTorch"), &expected[0], &after[0], 1e-3, 1e-4);
        assert_close(&format!("{name} {target:?} vs -O0"), &before[0], &after[0], 1e-4, 1e-5);
        let after_random = run(&g, &random);
        assert_close(&format!("{name} {target:?} random ids vs -O0"), &before_random[0], &after_random[0], 1e-4, 1e-5);
    }
}

#[test]
fn gpt2_style_export_survives_o3() {
    check("gpt2");
}

#[test]
fn bert_style_export_survives_o3() {
    check("bert");
}

#[test]
fn llama_style_export_survives_o3() {
    check("llama");
}
