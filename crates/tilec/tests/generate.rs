//! `tilec generate` over a paged KV cache (models/decoder, made by
//! scripts/gen-decoder-models.py): greedy generation equals the argmax of recomputing the
//! whole sequence with the original model at every step, for a batch of prompts of different
//! lengths crossing block boundaries, on both exports (with and without past inputs), on the
//! interpreter and compiled for the CPU; seeded sampling repeats; bad models and prompts fail
//! with errors naming what was expected.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tilec::generate::{generate, Engine, GenerateOptions, Generation, Sampling};
use tilec::onnx::load::load_model;
use tilec::onnx::proto::ModelProto;
use tilec::{Graph, ImportOptions, Tensor};

fn model_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models").join(name).join("model.onnx")
}

fn model(name: &str) -> ModelProto {
    load_model(&model_path(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Prompts of 1, 5, 13 and 18 tokens: with blocks of 4 they end inside, at and across block
/// boundaries, and the batch (4 rows) needs no padding rows; `three` drops one so that the
/// bucket of 4 has a padding row.
fn prompts(vocab: i64, three: bool) -> Vec<Vec<i64>> {
    let lens: &[usize] = if three { &[7, 1, 12] } else { &[5, 13, 1, 18] };
    lens.iter()
        .enumerate()
        .map(|(i, &n)| (0..n).map(|j| ((i * 31 + j * 17 + 3) as i64) % vocab).collect())
        .collect()
}

/// Greedy tokens by recomputing the whole sequence through the symbolic model `name` (no past
/// inputs) on the interpreter, one prompt at a time.
fn recompute(name: &str, prompt: &[i64], n: usize) -> Vec<i64> {
    let g: Graph = tilec::load(&model_path(name), &ImportOptions::default()).unwrap();
    let mut seq = prompt.to_vec();
    let mut out = vec![];
    for _ in 0..n {
        let l = seq.len();
        let inputs = HashMap::from([
            ("input_ids".to_string(), Tensor::from_vec(vec![1, l], seq.clone()).unwrap()),
            ("position_ids".to_string(), Tensor::from_vec(vec![1, l], (0..l as i64).collect::<Vec<_>>()).unwrap()),
        ]);
        let logits = tilec::run(&g, inputs, tilec::Backend::Ref).unwrap().remove(0).cast(tilec::DType::F32);
        let v = logits.shape()[2];
        let row = &logits.as_slice::<f32>().unwrap()[(l - 1) * v..l * v];
        let t = tilec::generate::sample::argmax(row) as i64;
        out.push(t);
        seq.push(t);
    }
    out
}

fn run(name: &str, prompts: &[Vec<i64>], new: usize, block_size: usize, engine: Engine, sampling: Sampling) -> Generation {
    let opts = GenerateOptions { max_new_tokens: new, block_size, sampling, engine };
    generate(&model(name), prompts, &opts).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn check_greedy(arch: &str, past: bool, engine: Engine, three: bool) {
    let name = format!("decoder/{arch}-{}", if past { "past" } else { "nopast" });
    let ps = prompts(128, three);
    let new = 8;
    let g = run(&name, &ps, new, 4, engine, Sampling::default());
    assert_eq!(g.had_past, past, "{name}");
    assert_eq!(g.bucket, 4);
    assert_eq!(g.steps, new - 1);
    for (i, p) in ps.iter().enumerate() {
        let want = recompute(&format!("decoder/{arch}-nopast"), p, new);
        assert_eq!(g.tokens[i], want, "{name}: prompt {i} ({} tokens)", p.len());
    }
}

#[test]
fn greedy_matches_recompute_on_the_interpreter() {
    for arch in ["llama", "gpt2"] {
        for past in [false, true] {
            check_greedy(arch, past, Engine::Ref, past);
        }
    }
}

#[test]
fn greedy_matches_recompute_compiled() {
    let o = tilec::compiled::CompileOptions { threads: 1, ..Default::default() };
    check_greedy("llama", true, Engine::Cpu(o.clone()), true);
    check_greedy("gpt2", false, Engine::Cpu(o), false);
}

#[test]
fn seeded_sampling_repeats() {
    let ps = prompts(128, true);
    let s = |seed| Sampling { temperature: 1.5, top_k: 20, top_p: 0.95, seed };
    let a = run("decoder/gpt2-past", &ps, 6, 4, Engine::Ref, s(1));
    let b = run("decoder/gpt2-past", &ps, 6, 4, Engine::Ref, s(1));
    let c = run("decoder/gpt2-past", &ps, 6, 4, Engine::Ref, s(2));
    assert_eq!(a.tokens, b.tokens);
    assert_ne!(a.tokens, c.tokens);
    // top-k 1 is greedy whatever the temperature.
    let greedy = run("decoder/gpt2-past", &ps, 6, 4, Engine::Ref, Sampling::default());
    let k1 = run("decoder/gpt2-past", &ps, 6, 4, Engine::Ref, Sampling { temperature: 2.0, top_k: 1, top_p: 1.0, seed: 5 });
    assert_eq!(greedy.tokens, k1.tokens);
}

fn error(name: &str, prompts: &[Vec<i64>], opts: GenerateOptions) -> String {
    match generate(&model(name), prompts, &opts) {
        Ok(_) => panic!("{name}: expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_models_and_prompts_fail_clearly() {
    let o = GenerateOptions::default;
    let e = error("decoder/llama-nopast", &[vec![1, 2], vec![3, 128]], o());
    assert!(e.contains("token id 128") && e.contains("0 to 127"), "{e}");
    let e = error("decoder/llama-nopast", &[vec![-1]], o());
    assert!(e.contains("token id -1"), "{e}");
    let e = error("decoder/llama-nopast", &[vec![]], o());
    assert!(e.contains("prompt 0 is empty"), "{e}");
    // BERT: no position_ids, and its attention is not causal.
    let e = error("bert", &[vec![1, 2]], o());
    assert!(e.contains("input_ids") || e.contains("position_ids"), "{e}");
    // The LLaMA export of models/ computes its positions inside: no position_ids input.
    let e = error("llama", &[vec![1, 2]], o());
    assert!(e.contains("no input 'position_ids'"), "{e}");
    let e = error("decoder/gpt2-past", &[vec![1]], GenerateOptions { max_new_tokens: 0, ..o() });
    assert!(e.contains("max new tokens"), "{e}");
    let e = error("decoder/gpt2-past", &[vec![1]], GenerateOptions { sampling: Sampling { top_p: 0.0, ..Default::default() }, ..o() });
    assert!(e.contains("top-p"), "{e}");
}
