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

/// Greedy tokens by recomputing the whole sequence through the symbolic model `name` on the
/// interpreter, one prompt at a time (a model with past inputs gets an empty past).
fn recompute(name: &str, prompt: &[i64], n: usize) -> Vec<i64> {
    let g: Graph = tilec::load(&model_path(name), &ImportOptions::default()).unwrap();
    let mut seq = prompt.to_vec();
    let mut out = vec![];
    for _ in 0..n {
        let l = seq.len();
        let mut inputs = HashMap::from([
            ("input_ids".to_string(), Tensor::from_vec(vec![1, l], seq.clone()).unwrap()),
            ("position_ids".to_string(), Tensor::from_vec(vec![1, l], (0..l as i64).collect::<Vec<_>>()).unwrap()),
        ]);
        for &v in g.inputs() {
            let val = g.value(v);
            if val.name.starts_with("past_") {
                let s = &val.ty.shape;
                let d = |i: usize| s[i].fixed().unwrap();
                inputs.insert(val.name.clone(), Tensor::zeros(val.ty.dtype, vec![1, d(1), 0, d(3)]));
            }
        }
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
    let opts = GenerateOptions { max_new_tokens: new, block_size, sampling, eos: None, engine, warmup: false, profile_steps: 0 };
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
        // The model itself, and for the past export also its no-past twin (same weights).
        let want = recompute(&name, p, new);
        if past {
            assert_eq!(want, recompute(&format!("decoder/{arch}-nopast"), p, new), "{name}: the two exports disagree");
        }
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

/// On a GPU: greedy generation compiled for CUDA equals recomputing (the models' caches are
/// f32, so `paged_attention` runs on the host kernel between captured device runs). Without a
/// GPU, says so and passes.
#[test]
fn greedy_matches_recompute_on_a_gpu() {
    if !tilec::cuda::is_available() {
        eprintln!("note: no CUDA GPU; generation on the cuda target was not run");
        return;
    }
    let o = tilec::compiled_cuda::CudaOptions::default();
    check_greedy("llama", true, Engine::Cuda(o.clone()), true);
    check_greedy("gpt2", false, Engine::Cuda(o), false);
}

#[test]
fn end_of_sequence_stops_a_sequence_and_shrinks_the_bucket() {
    // Without an end token, then with one that some prompts produce: those stop there, the
    // others go on unchanged in a smaller bucket (3 sequences in 4 rows, then 2 or 1).
    let ps = prompts(128, true);
    let full = run("decoder/llama-past", &ps, 8, 4, Engine::Ref, Sampling::default());
    let eos = full.tokens[1][2];
    let opts = GenerateOptions { max_new_tokens: 8, block_size: 4, eos: Some(eos), ..Default::default() };
    let g = generate(&model("decoder/llama-past"), &ps, &opts).unwrap();
    let mut stopped = 0;
    for (i, t) in full.tokens.iter().enumerate() {
        let want: Vec<i64> = match t.iter().position(|&x| x == eos) {
            Some(j) => {
                stopped += 1;
                t[..=j].to_vec()
            }
            None => t.clone(),
        };
        assert_eq!(g.tokens[i], want, "prompt {i}, end token {eos}");
    }
    assert!((1..3).contains(&stopped), "{stopped} prompts stopped");
    assert_eq!(g.decode_buckets[0], 4);
    assert!(g.decode_buckets.len() > 1, "the bucket shrinks: {:?}", g.decode_buckets);
    assert_eq!(g.decode_tokens, g.tokens.iter().map(|t| t.len() - 1).sum::<usize>());
    // Compiled, the caches stay in each step's storage and move when the bucket shrinks (to
    // another executor): the same tokens.
    let cpu = Engine::Cpu(tilec::compiled::CompileOptions { threads: 1, ..Default::default() });
    let c = generate(&model("decoder/llama-past"), &ps, &GenerateOptions { engine: cpu, ..opts }).unwrap();
    assert_eq!(c.tokens, g.tokens);
    assert_eq!(c.decode_buckets, g.decode_buckets);
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

fn tilec(args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tilec")).args(args).output().expect("the tilec binary runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// A word-level tokenizer.json over the 128 ids of the decoder exports: `w0` .. `w126`, and
/// `[UNK]` as 127.
fn word_tokenizer(dir: &Path) -> PathBuf {
    let mut vocab: Vec<String> = (0..127).map(|i| format!("\"w{i}\": {i}")).collect();
    vocab.push("\"[UNK]\": 127".into());
    let json = format!(
        r#"{{"version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
            "pre_tokenizer": {{"type": "Whitespace"}}, "post_processor": null, "decoder": null,
            "model": {{"type": "WordLevel", "vocab": {{{}}}, "unk_token": "[UNK]"}}}}"#,
        vocab.join(", ")
    );
    let p = dir.join("tokenizer.json");
    std::fs::write(&p, json).unwrap();
    p
}

#[test]
fn cli_generates_ids_and_text() {
    let m = model_path("decoder/llama-past");
    let m = m.to_str().unwrap();
    let (ok, out) = tilec(&["generate", m, "--prompt-ids", "1,2,3", "--prompt-ids", "9", "--max-new-tokens", "4", "--backend", "ref", "--block-size", "2"]);
    assert!(ok, "{out}");
    let ps = [vec![1i64, 2, 3], vec![9]];
    let g = run("decoder/llama-past", &ps, 4, 2, Engine::Ref, Sampling::default());
    for t in &g.tokens {
        let line = format!("new tokens: {}", t.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(" "));
        assert!(out.contains(&line), "{line} not in {out}");
    }
    assert!(out.contains("prefill: 4 tokens") && out.contains("decode: 3 steps, 6 tokens"), "{out}");
    assert!(out.contains("tokens/s"), "{out}");

    let dir = std::env::temp_dir().join(format!("tilec-generate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tok = word_tokenizer(&dir);
    let tok = tok.to_str().unwrap();
    let (ok, out) = tilec(&["generate", m, "--tokenizer", tok, "--prompt", "w1 w2 w3", "--max-new-tokens", "4", "--backend", "ref"]);
    assert!(ok, "{out}");
    // The same prompt as ids 1 2 3, so the same tokens, now also as words.
    let words: Vec<String> = g.tokens[0].iter().map(|t| format!("w{t}")).collect();
    assert!(out.contains("prompt 0 (3 tokens): 1 2 3"), "{out}");
    assert!(out.contains(&format!("text: {:?}", words.join(" "))), "{out}");

    // Unknown and broken tokenizer files, a text prompt without one, bad ids, cuda.
    let missing = dir.join("missing.json");
    let (ok, out) = tilec(&["generate", m, "--tokenizer", missing.to_str().unwrap(), "--prompt", "w1"]);
    assert!(!ok && out.contains("missing.json") && out.contains("cannot read"), "{out}");
    let broken = dir.join("broken.json");
    std::fs::write(&broken, "{\"model\": 3}").unwrap();
    let (ok, out) = tilec(&["generate", m, "--tokenizer", broken.to_str().unwrap(), "--prompt", "w1"]);
    assert!(!ok && out.contains("broken.json") && out.contains("expected a Hugging Face tokenizer.json"), "{out}");
    let (ok, out) = tilec(&["generate", m, "--prompt", "w1"]);
    assert!(!ok && out.contains("--prompt needs --tokenizer"), "{out}");
    let (ok, out) = tilec(&["generate", m, "--prompt-ids", "1,x"]);
    assert!(!ok && out.contains("'x' is not a token id"), "{out}");
    let (ok, out) = tilec(&["generate", m, "--prompt-ids", "1,500", "--backend", "ref"]);
    assert!(!ok && out.contains("token id 500 is out of range"), "{out}");
    let (ok, out) = tilec(&["generate", m]);
    assert!(!ok && out.contains("no prompt"), "{out}");
    let (ok, out) = tilec(&["generate", m, "--prompt-ids", "1", "--temperature", "-1"]);
    assert!(!ok && out.contains("temperature -1"), "{out}");
    let (ok, out) = tilec(&["generate", m, "--prompt-ids", "1", "--target", "cuda", "--backend", "ref"]);
    assert!(!ok && out.contains("--target cuda") && out.contains("--backend ref"), "{out}");
    if !tilec::cuda::is_available() {
        let (ok, out) = tilec(&["generate", m, "--prompt-ids", "1", "--target", "cuda"]);
        assert!(!ok && out.contains("no CUDA GPU"), "{out}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cli_explains_the_decode_step() {
    // Three prompts: the decode step of bucket 4, one token a row, partitioned for the GPU
    // (no GPU needed: the explanation plans for a preset one) and for this CPU.
    let m = model_path("decoder/llama-bf16");
    let m = m.to_str().unwrap();
    let (ok, out) = tilec(&["generate", m, "--prompt-ids", "1,2,3", "--prompt-ids", "4", "--prompt-ids", "5,6", "--explain", "--target", "cuda"]);
    assert!(ok, "{out}");
    assert!(out.contains("decode step: 4 rows of one new token"), "{out}");
    // One paged attention kernel per layer, each taken by the paged-attention family; the
    // products by the decode-shaped template.
    let layers = model("decoder/llama-bf16").graph.unwrap().initializer.iter().filter(|t| t.name.ends_with(".ln1.weight")).count();
    assert!(layers >= 2, "{layers} layers");
    assert_eq!(out.matches("attention/paged' (1 ops)").count(), layers, "{out}");
    assert_eq!(out.lines().filter(|l| l.contains(": sm80_paged_attn (")).count(), layers, "{out}");
    assert!(out.lines().any(|l| l.contains(": sm80_gemv (")), "{out}");
    // Nothing ran.
    assert!(!out.contains("tokens/s"), "{out}");
    let (ok, out) = tilec(&["generate", m, "--prompt-ids", "1,2,3", "--explain"]);
    assert!(ok && out.contains("decode step: 1 rows") && out.contains("kernels (families for this CPU"), "{out}");
}
