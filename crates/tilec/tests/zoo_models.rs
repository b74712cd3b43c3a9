//! The committed small variants of the CPU model set (models/zoo/, made by
//! `scripts/gen-zoo-models.py --tiny`: MobileNet-V2/-V3, EfficientNet-B0, ConvNeXt, RegNet,
//! ViT, Swin, DistilBERT, Qwen2 and a Whisper encoder, random weights, exported with
//! PyTorch's dynamo exporter) reproduce PyTorch's outputs compiled for the CPU, the arena
//! poisoned first, with no kernel left to the interpreter.

use std::path::{Path, PathBuf};
use tilec_ir::Tensor;
use tilec_onnx::{import_file, ImportOptions};

fn zoo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/zoo")
}

fn cache() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/tilec-cache")
}

fn load_set(dir: &Path, prefix: &str) -> Vec<Tensor> {
    (0..)
        .map(|i| dir.join(format!("test_data_set_0/{prefix}_{i}.pb")))
        .take_while(|p| p.exists())
        .map(|p| tilec_onnx::tensor::tensor_from_proto(&tilec_onnx::load::load_tensor_pb(&p).unwrap()).unwrap())
        .collect()
}

/// A number field of meta.json.
fn meta(dir: &Path, key: &str) -> f64 {
    let text = std::fs::read_to_string(dir.join("meta.json")).unwrap();
    let at = text.find(&format!("\"{key}\":")).unwrap_or_else(|| panic!("meta.json has {key}")) + key.len() + 3;
    text[at..].trim_start().split(|c: char| c == ',' || c == '\n' || c == '}').next().unwrap().trim().parse().unwrap()
}

fn check(name: &str) {
    let dir = zoo().join(name);
    let inputs = load_set(&dir, "input");
    let expected = load_set(&dir, "output");
    let (rtol, atol) = (meta(&dir, "rtol"), meta(&dir, "atol"));
    let g = import_file(&dir.join("model.onnx"), &ImportOptions::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
    let opts = tilec::compiled::CompileOptions { cache_dir: Some(cache()), ..Default::default() };
    let mut c = tilec::compiled::compile(&g, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(!c.interpreted(), "{name}: compiled, not interpreted");
    assert!(c.report.fallbacks.is_empty(), "{name}: fallbacks {:?}", c.report.fallbacks);
    c.check_plan().unwrap_or_else(|e| panic!("{name}: memory plan: {e}"));
    c.poison().unwrap_or_else(|e| panic!("{name}: {e}"));
    let outs = c.run(&inputs).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(outs.len(), expected.len(), "{name}: outputs");
    for (want, got) in expected.iter().zip(&outs) {
        assert_eq!(want.shape(), got.shape(), "{name}");
        let (w, o) = (want.to_f64_vec(), got.to_f64_vec());
        let bad = (0..w.len()).filter(|&i| !((w[i] - o[i]).abs() <= atol + rtol * w[i].abs())).count();
        assert_eq!(bad, 0, "{name}: {bad}/{} elements out of tolerance (rtol {rtol}, atol {atol})", w.len());
    }
}

macro_rules! zoo_tests {
    ($($t:ident),* $(,)?) => { $( #[test] fn $t() { check(stringify!($t)); } )* };
}

zoo_tests!(mobilenet_v3, efficientnet_b0, convnext, regnet, swin, whisper_encoder);
