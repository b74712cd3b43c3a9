//! `tilec generate` on LLaMA exports in bf16 as the GPU decode benchmark makes them
//! (models/decoder/llama-bf16 and llama-bf16-tied, by scripts/export-llama-decode.py
//! --config test --test-model: transformers' LlamaForCausalLM arithmetic with RMSNorm in f32
//! between casts, RoPE rounded to bf16, grouped-query attention (4 query, 2 KV heads), SwiGLU,
//! f32 logits; the LM head its own weight or the embedding's transpose). Greedy generation
//! equals the argmax of recomputing the whole sequence on the interpreter at every step, for a
//! batch of prompts of different lengths crossing block boundaries, on the interpreter and
//! compiled for the CPU; the first step's logits (`first_logits`) are the recomputation's.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tilec::generate::{generate, Engine, GenerateOptions, Sampling};
use tilec::onnx::load::load_model;
use tilec::{Graph, ImportOptions, Tensor};

const VOCAB: i64 = 128;

fn model_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/decoder").join(name).join("model.onnx")
}

/// Prompts of 5, 13, 1 and 18 tokens (blocks of 4: ending inside, at and across boundaries).
fn prompts() -> Vec<Vec<i64>> {
    [5usize, 13, 1, 18].iter().enumerate().map(|(i, &n)| (0..n).map(|j| ((i * 37 + j * 11 + 5) as i64) % VOCAB).collect()).collect()
}

/// The last token's logits of the whole sequence `seq` through the symbolic model.
fn last_logits(g: &Graph, seq: &[i64]) -> Vec<f32> {
    let l = seq.len();
    let inputs = HashMap::from([
        ("input_ids".to_string(), Tensor::from_vec(vec![1, l], seq.to_vec()).unwrap()),
        ("position_ids".to_string(), Tensor::from_vec(vec![1, l], (0..l as i64).collect::<Vec<_>>()).unwrap()),
    ]);
    let logits = tilec::run(g, inputs, tilec::Backend::Ref).unwrap().remove(0).cast(tilec::DType::F32);
    let v = logits.shape()[2];
    assert_eq!(v as i64, VOCAB);
    logits.as_slice::<f32>().unwrap()[(l - 1) * v..l * v].to_vec()
}

/// The bf16 model and its f32 twin (the same weights widened, every op in f32).
struct Models {
    bf16: Graph,
    f32: Graph,
}

impl Models {
    fn load(name: &str) -> Models {
        let p = model_path(name);
        let load = |p: &Path| tilec::load(p, &ImportOptions::default()).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        Models { bf16: load(&p), f32: load(&p.with_file_name("model-f32.onnx")) }
    }
}

/// Checks `got` (the new tokens of `prompt`) step by step against recomputing the whole
/// sequence `prompt + got[..i]` with the f32 twin: token `i` has the twin's largest logit, or
/// one within twice the bf16 noise of it (how far the bf16 model's own logits are from the
/// twin's at that step, at most: bf16 logits are coarse, and near ties fall either way).
/// Returns the first step's logits of both models and how many tokens were not the largest.
fn check_tokens(m: &Models, name: &str, prompt: &[i64], got: &[i64]) -> (Vec<f32>, Vec<f32>, usize) {
    let mut seq = prompt.to_vec();
    let (mut first, mut others) = ((vec![], vec![]), 0);
    for (i, &t) in got.iter().enumerate() {
        let (b, f) = (last_logits(&m.bf16, &seq), last_logits(&m.f32, &seq));
        let noise = b.iter().zip(&f).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
        let best = tilec::generate::sample::argmax(&f);
        let (top, mine) = (f[best], f[t as usize]);
        assert!(
            mine >= top - 2.0 * noise - 1e-3,
            "{name}: prompt of {} tokens, step {i}: generated {t} (f32 logit {mine}), the largest is {best}'s ({top}), bf16 noise {noise}; tokens so far {:?}",
            prompt.len(),
            &got[..i]
        );
        others += usize::from(best != t as usize);
        if i == 0 {
            first = (b, f);
        }
        seq.push(t);
    }
    (first.0, first.1, others)
}

fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let d: f64 = a.iter().zip(b).map(|(x, y)| (*x as f64 - *y as f64).powi(2)).sum();
    let n: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (d / n.max(1e-30)).sqrt()
}

fn check(name: &str, engine: Engine) {
    let path = model_path(name);
    let model = load_model(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
    let m = Models::load(name);
    let ps = prompts();
    let new = 8;
    let opts = GenerateOptions { max_new_tokens: new, block_size: 4, sampling: Sampling::default(), eos: None, engine, warmup: false, profile_steps: 0 };
    let got = generate(&model, &ps, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(got.steps, new - 1, "{name}");
    assert_eq!(got.first_logits.len(), ps.len(), "{name}");
    let mut others = 0;
    for (i, p) in ps.iter().enumerate() {
        assert_eq!(got.tokens[i].len(), new, "{name}");
        let (b, f, o) = check_tokens(&m, name, p, &got.tokens[i]);
        others += o;
        // The paged steps round in other places than the whole-sequence graph (attention in
        // one op): as close to the f32 twin as the bf16 graph itself, not closer to the graph.
        let (e, floor) = (rel_err(&got.first_logits[i], &f), rel_err(&b, &f));
        assert!(
            e <= 2.0 * floor + 1e-3,
            "{name}: prompt {i}: first-step logits {e:.3e} from the f32 twin's; the bf16 graph's are {floor:.3e} from them"
        );
    }
    // Near ties are the exception: most tokens have the largest logit outright.
    assert!(others * 4 <= ps.len() * new, "{name}: {others} of {} tokens were not the largest logit", ps.len() * new);
}

#[test]
fn bf16_llama_greedy_matches_recompute_on_the_interpreter() {
    for name in ["llama-bf16", "llama-bf16-tied"] {
        check(name, Engine::Ref);
    }
}

#[test]
fn bf16_llama_greedy_matches_recompute_compiled() {
    let o = tilec::compiled::CompileOptions { threads: 1, ..Default::default() };
    for name in ["llama-bf16", "llama-bf16-tied"] {
        check(name, Engine::Cpu(o.clone()));
    }
}

/// The CLI's `--logits-out` writes the first step's logits `[prompts, vocab]` as f32, those
/// [`generate`] returns (checked above).
#[test]
fn cli_writes_the_first_step_logits() {
    let dir = std::env::temp_dir().join(format!("tilec-generate-bf16-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("logits.npy");
    let m = model_path("llama-bf16");
    let st = std::process::Command::new(env!("CARGO_BIN_EXE_tilec"))
        .args(["generate", m.to_str().unwrap(), "--prompt-ids", "1,2,3", "--prompt-ids", "7", "--max-new-tokens", "2", "--backend", "ref"])
        .arg("--logits-out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    let t = tilec::tensor_io::read_npy(&out).unwrap();
    assert_eq!(t.shape(), &[2, VOCAB as usize]);
    let opts = GenerateOptions { max_new_tokens: 2, engine: Engine::Ref, ..Default::default() };
    let g = generate(&load_model(&m).unwrap(), &[vec![1, 2, 3], vec![7]], &opts).unwrap();
    assert_eq!(t.as_slice::<f32>().unwrap(), g.first_logits.concat().as_slice());
    let _ = std::fs::remove_dir_all(&dir);
}


/// The warm-up runs (`warmup`) change nothing but the timings: the same tokens and logits, on
/// the interpreter and compiled, with the bucket shrinking (an end token) so that a second
/// decode bucket warms up too.
#[test]
fn warmup_changes_no_token() {
    let model = load_model(&model_path("llama-bf16")).unwrap();
    let ps = &prompts()[..3];
    let o = tilec::compiled::CompileOptions { threads: 1, ..Default::default() };
    for engine in [Engine::Ref, Engine::Cpu(o)] {
        let run = |warmup: bool, eos: Option<i64>| {
            let opts = GenerateOptions { max_new_tokens: 6, block_size: 4, eos, engine: engine.clone(), warmup, ..Default::default() };
            generate(&model, ps, &opts).unwrap()
        };
        let eos = Some(run(false, None).tokens[2][1]);
        let (a, b) = (run(false, eos), run(true, eos));
        assert_eq!(a.tokens, b.tokens);
        assert_eq!(a.first_logits, b.first_logits);
        assert_eq!(a.decode_buckets, b.decode_buckets);
        assert!(a.decode_buckets.len() > 1, "the bucket shrinks: {:?}", a.decode_buckets);
        assert!(a.warmup.is_zero() && !b.warmup.is_zero());
    }
}

/// `last_token::keep_last` on a rewritten prefill: the logits it returns are exactly the rows
/// of the whole prefill's logits at the positions asked for (on the interpreter), with the
/// LM head moved behind the pick on the LLaMA exports (its product then runs on one token per
/// row) and the logits picked after the head when there is no head to find (GPT-2's is the
/// product with the embedding's transpose, not a constant matrix, before folding).
#[test]
fn prefill_keeps_the_last_tokens_logits_exactly() {
    use tilec_opt::decoder::{paged_decoder, CacheShape};
    let (rows, t) = (3usize, 6usize);
    let shape = CacheShape { blocks: 1 + rows * 2, block_size: 4, max_blocks: 2 };
    for name in ["llama-bf16", "llama-bf16-tied", "gpt2-nopast", "llama-past"] {
        let dims = HashMap::from([("batch".to_string(), rows), ("seq".to_string(), t)]);
        let g = tilec::load(&model_path(name), &ImportOptions { dim_values: dims, ..Default::default() }).unwrap();
        let full = paged_decoder(&g, rows, t, shape).unwrap();
        let last = [5usize, 0, 3];
        let mut picked = full.clone();
        tilec::generate::last_token::keep_last(&mut picked, &last).unwrap();
        let pg = &picked.graph;
        // The product behind the logits (through casts): on `rows` tokens for the LLaMA exports.
        let mut v = pg.outputs()[0];
        while let Some(n) = pg.producer(v) {
            match &pg.node(n).op {
                tilec_ir::Op::Cast { .. } => v = pg.node(n).inputs[0],
                _ => break,
            }
        }
        let is_head = pg.producer(v).is_some_and(|n| matches!(pg.node(n).op, tilec_ir::Op::Linalg(tilec_ir::op::LinalgOp::MatMul)));
        if name.starts_with("llama") {
            assert!(is_head, "{name}: the logits come from the LM head's product");
            assert_eq!(pg.value(v).ty.fixed_shape().unwrap(), vec![rows, 1, VOCAB as usize], "{name}: the head runs on one token per row");
        }
        // The same inputs for both: random tokens, each row's own positions, empty caches.
        let mut inputs = HashMap::new();
        for &v in full.graph.inputs() {
            let val = full.graph.value(v);
            let s = val.ty.fixed_shape().unwrap();
            let n: usize = s.iter().product();
            let tensor = match val.name.as_str() {
                "input_ids" => Tensor::from_vec(s, (0..n as i64).map(|i| (i * 29 + 7) % VOCAB).collect::<Vec<_>>()).unwrap(),
                "position_ids" => Tensor::from_vec(s, (0..n as i64).map(|i| i % t as i64).collect::<Vec<_>>()).unwrap(),
                "block_table" => Tensor::from_vec(s, (1..=n as i32).collect::<Vec<_>>()).unwrap(),
                "past_lens" => Tensor::from_vec(s, vec![0i32; n]).unwrap(),
                _ => Tensor::zeros(val.ty.dtype, s),
            };
            inputs.insert(val.name.clone(), tensor);
        }
        let run = |g: &Graph| {
            let ins = g.inputs().iter().map(|&v| inputs[&g.value(v).name].clone()).collect();
            tilec_ref::run(g, ins).unwrap().remove(0).cast(tilec::DType::F32)
        };
        let (all, got) = (run(&full.graph), run(pg));
        assert_eq!(got.shape(), &[rows, 1, VOCAB as usize], "{name}");
        let (a, b) = (all.as_slice::<f32>().unwrap(), got.as_slice::<f32>().unwrap());
        let v = VOCAB as usize;
        for (r, &l) in last.iter().enumerate() {
            assert_eq!(&b[r * v..(r + 1) * v], &a[(r * t + l) * v..(r * t + l + 1) * v], "{name}: row {r}, token {l}");
        }
    }
}

/// The rewritten bf16 LLaMA's prefill (its last tokens picked) and decode steps prepare for a
/// Hopper GPU (no device needed) with every node on the device, no interpreter fallback, and
/// each layer's attention on the paged decode family.
#[test]
fn bf16_llama_steps_prepare_for_a_gpu_without_fallbacks() {
    use tilec_opt::decoder::{paged_decoder, CacheShape};
    for (rows, t) in [(2usize, 8usize), (1, 1), (2, 1)] {
        let shape = CacheShape { blocks: 1 + rows * 2, block_size: 16, max_blocks: 2 };
        let dims = HashMap::from([("batch".to_string(), rows), ("seq".to_string(), t)]);
        let g = tilec::load(&model_path("llama-bf16"), &ImportOptions { dim_values: dims, ..Default::default() }).unwrap();
        let mut dec = paged_decoder(&g, rows, t, shape).unwrap();
        if t > 1 {
            tilec::generate::last_token::keep_last(&mut dec, &vec![t - 1; rows]).unwrap();
        }
        let opts = tilec::compiled_cuda::CudaOptions::default();
        let p = tilec::compiled_cuda::prepare(&dec.graph, &opts, &tilec::cuda::GpuTarget::hopper()).unwrap();
        let r = &p.report;
        eprintln!("{rows} x {t}: {} kernels {:?}", r.kernels, r.schedules);
        assert!(r.fallbacks.is_empty(), "{rows} x {t}: nodes on the interpreter: {:?}", r.fallbacks);
        let paged = r.schedules.iter().find(|(s, _)| s == "sm80_paged_attn").map_or(0, |c| c.1);
        assert_eq!(paged, dec.layers.len(), "{rows} x {t}: {:?}", r.schedules);
        // A group that does not build whole (the q, k and v products with the rotary
        // embedding) splits into a few kernels, not one per node, and no kernel runs on one
        // GPU thread (the normalizations of a one-row step included).
        let per_layer = (r.kernels - 3) as f64 / dec.layers.len() as f64;
        assert!(per_layer <= 10.0, "{rows} x {t}: {} kernels for {} layers {:?}", r.kernels, dec.layers.len(), r.schedules);
        // The products that read one normalized state (q, k and v; gate and up) are one
        // product each (`merge-products`): four matrix-vector kernels a layer and the head.
        if t == 1 {
            let gemv = r.schedules.iter().find(|(s, _)| s == "sm80_gemv").map_or(0, |c| c.1);
            assert!(gemv <= 4 * dec.layers.len() + 1, "{rows} x {t}: {gemv} GEMV kernels {:?}", r.schedules);
        }
        assert!(r.schedules.iter().all(|(s, _)| s != "serial"), "{rows} x {t}: {:?}", r.schedules);
    }
}
