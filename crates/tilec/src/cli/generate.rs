//! `tilec generate`: prompts in (token ids, or text through a tokenizer), new tokens out,
//! with prefill and decode speeds.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use tilec::generate::text::Text;
use tilec::onnx::proto::ModelProto;
use tilec::generate::{generate as run_generate, Engine, GenerateOptions, Sampling};

use super::opt::{explain_optimized, optimize_for, TargetArg as OptTarget};
use super::run::TargetArg;
use super::{load_model, MAX_THREADS};
use crate::BackendArg;

#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    /// A decoder-only ONNX model with inputs `input_ids` and `position_ids` [batch, seq] (and
    /// optionally past key/value inputs), whose first output is the logits.
    pub model: PathBuf,
    /// A prompt as comma-separated token ids (repeat for a batch of prompts).
    #[arg(long = "prompt-ids", value_name = "IDS", value_parser = parse_ids)]
    pub prompt_ids: Vec<Vec<i64>>,
    /// A prompt as text (repeat for a batch; needs --tokenizer).
    #[arg(long = "prompt", value_name = "TEXT")]
    pub prompts: Vec<String>,
    /// A Hugging Face tokenizer.json: encodes --prompt and prints the new tokens as text.
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
    /// Tokens to generate per prompt.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_new_tokens: u32,
    /// Sampling temperature; 0 (the default) is greedy.
    #[arg(long, default_value_t = 0.0, allow_hyphen_values = true)]
    pub temperature: f32,
    /// Sample among the K most likely tokens only (0: all).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Sample among the most likely tokens whose probabilities reach P (1: all).
    #[arg(long, default_value_t = 1.0, allow_hyphen_values = true)]
    pub top_p: f32,
    /// Seed of the sampler: the same seed gives the same tokens.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// The end-of-sequence token: a prompt whose continuation produces it stops there.
    #[arg(long, value_name = "ID")]
    pub eos: Option<i64>,
    /// Tokens per block of the paged KV cache.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub block_size: u32,
    /// Where the steps run: compiled for this CPU, or on the reference interpreter.
    #[arg(long, value_enum, default_value_t = BackendArg::Cpu)]
    pub backend: BackendArg,
    /// The target of compiled code: this CPU, or an NVIDIA GPU (paged decode attention on
    /// 16-bit caches as CUDA kernels).
    #[arg(long, value_enum, default_value_t = TargetArg::Cpu)]
    pub target: TargetArg,
    /// Writes the prefill's logits at each prompt's last token (those its first new token is
    /// chosen from) to this `.npy` file: f32 [prompts, vocab].
    #[arg(long, value_name = "FILE")]
    pub logits_out: Option<PathBuf>,
    /// Runs the prefill and the first decode step once more, untimed, before the timed run
    /// (their first runs do one-time work: on a GPU, capturing the CUDA graphs), so that the
    /// speeds printed are the steady ones.
    #[arg(long)]
    pub warmup: bool,
    /// After the timed steps, times every kernel of the last decode step (5 runs; compiled
    /// steps only) and prints the table and where the time goes by kind.
    #[arg(long)]
    pub profile: bool,
    /// Shows how the decode step is partitioned into kernels on the target (as `tilec
    /// explain` does for a model: each group's ops, cost and bound, the rejected fusions, the
    /// family of each kernel) and exits without running anything.
    #[arg(long)]
    pub explain: bool,
    /// Threads of compiled code (default: all cores).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=MAX_THREADS as u64))]
    pub threads: Option<u64>,
}

/// Parses `1,2,3` (spaces allowed).
fn parse_ids(s: &str) -> Result<Vec<i64>, String> {
    let ids: Vec<i64> = s
        .split(',')
        .map(|x| x.trim().parse::<i64>().map_err(|_| format!("'{}' is not a token id (in '{s}'; expected comma-separated integers)", x.trim())))
        .collect::<Result<_, _>>()?;
    if ids.is_empty() {
        return Err("expected at least one token id".into());
    }
    Ok(ids)
}

pub fn generate(a: &GenerateArgs) -> Result<()> {
    if a.target == TargetArg::Cuda && a.backend == BackendArg::Ref {
        bail!("--target cuda runs compiled steps: it does not combine with --backend ref");
    }
    let text = a.tokenizer.as_deref().map(Text::load).transpose()?;
    let mut prompts = a.prompt_ids.clone();
    if !a.prompts.is_empty() {
        let Some(t) = &text else { bail!("--prompt needs --tokenizer FILE (or give token ids with --prompt-ids)") };
        for p in &a.prompts {
            prompts.push(t.encode(p)?);
        }
    }
    if prompts.is_empty() {
        bail!("no prompt: give --prompt-ids 1,2,3 (or --prompt TEXT with --tokenizer), repeated for a batch");
    }
    let model = load_model(&a.model)?;
    let threads = a.threads.map(|t| t as usize).unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
    let engine = match (a.backend, a.target) {
        (BackendArg::Ref, _) => Engine::Ref,
        (_, TargetArg::Cuda) => Engine::Cuda(tilec::compiled_cuda::CudaOptions::default()),
        (BackendArg::Cpu, _) => Engine::Cpu(tilec::compiled::CompileOptions { threads, ..Default::default() }),
    };
    let opts = GenerateOptions {
        max_new_tokens: a.max_new_tokens as usize,
        block_size: a.block_size as usize,
        sampling: Sampling { temperature: a.temperature, top_k: a.top_k, top_p: a.top_p, seed: a.seed },
        eos: a.eos,
        engine,
        warmup: a.warmup,
        profile_steps: if a.profile { 5 } else { 0 },
    };
    if a.profile && a.backend == BackendArg::Ref {
        bail!("--profile times compiled kernels: it does not combine with --backend ref");
    }
    if a.explain {
        return explain_step(a, &model, &prompts, &opts);
    }
    let g = run_generate(&model, &prompts, &opts).with_context(|| format!("generate {}", a.model.display()))?;
    if let Some(path) = &a.logits_out {
        let vocab = g.first_logits.first().map_or(0, |r| r.len());
        let t = tilec::Tensor::from_vec(vec![g.first_logits.len(), vocab], g.first_logits.concat())?;
        tilec::tensor_io::write_npy(path, &t)?;
    }
    for (i, (p, t)) in prompts.iter().zip(&g.tokens).enumerate() {
        println!("prompt {i} ({} tokens): {}", p.len(), join(p));
        println!("  new tokens: {}", join(t));
        if let Some(x) = &text {
            println!("  text: {:?}", x.decode(t)?);
        }
    }
    println!(
        "prefill: {} tokens in {:.2} ms ({:.1} tokens/s)",
        g.prefill_tokens,
        g.prefill.as_secs_f64() * 1e3,
        g.prefill_tokens_per_s()
    );
    println!(
        "decode: {} steps, {} tokens in {:.2} ms ({:.1} tokens/s)",
        g.steps,
        g.decode_tokens,
        g.decode.as_secs_f64() * 1e3,
        g.decode_tokens_per_s()
    );
    if a.warmup {
        println!("warm-up runs (untimed): {:.2} ms", g.warmup.as_secs_f64() * 1e3);
    }
    if let Some(p) = &g.profile {
        println!("the last decode step, every kernel timed (5 runs):");
        print!("{}", p.render_table());
        println!("time by kind (gaps: between the calls of a run):");
        for (kind, ns, pct) in tilec::runtime::trace::time_by_kind(p) {
            println!("  {kind:<16} {:>10.3} ms  {pct:>5.1}%", ns as f64 / 1e6);
        }
    }
    println!(
        "cache: {} blocks of {} tokens (block 0 the null block); batch buckets: prefill {}, decode {}; model {} past inputs; graphs built in {:.2} s ({})",
        g.blocks,
        g.block_size,
        g.bucket,
        g.decode_buckets.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(", "),
        if g.had_past { "with" } else { "without" },
        g.compile.as_secs_f64(),
        match (a.backend, a.target) {
            (BackendArg::Ref, _) => "reference interpreter",
            (_, TargetArg::Cuda) => "compiled for the GPU",
            (BackendArg::Cpu, _) => "compiled for the CPU",
        }
    );
    Ok(())
}

/// `--explain`: the decode step of these prompts' batch bucket, optimized as the compiled
/// step is, partitioned and its kernels' families chosen on the target.
fn explain_step(a: &GenerateArgs, model: &ModelProto, prompts: &[Vec<i64>], opts: &GenerateOptions) -> Result<()> {
    let mut g = tilec::generate::decode_step_graph(model, prompts, opts).with_context(|| format!("generate {}", a.model.display()))?;
    let target = match a.target {
        TargetArg::Cpu => OptTarget::Cpu,
        TargetArg::Cuda => OptTarget::Cuda,
    };
    optimize_for(&mut g, target)?;
    println!("decode step: {} rows of one new token, over a cache sized for {} new tokens", tilec::generate::bucket(prompts.len()), a.max_new_tokens);
    explain_optimized(&g, target, &Default::default(), &[], false, false)
}

fn join(ids: &[i64]) -> String {
    ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(" ")
}
