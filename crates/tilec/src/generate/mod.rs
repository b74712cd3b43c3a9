//! Text generation with decoder-only models over a paged KV cache (`tilec generate`).
//!
//! A batch of prompts of different lengths runs in two compiled graphs, both the model
//! rewritten by `tilec_opt::decoder::paged_decoder` so that its attentions read and append
//! to one paged cache:
//!
//! - the *prefill* over `[rows, T]` tokens, `T` the longest prompt, shorter prompts padded on
//!   the right (causal attention: a padding token never changes a real one's keys or logits;
//!   the padding's keys land in the cache past the prompt and are overwritten by the decode
//!   steps before anything reads them), returning each prompt's last token's logits only
//!   ([`last_token`]);
//! - the *decode step* over `[rows, 1]`: each sequence's last token at its own position.
//!
//! `rows` is the batch *bucket* (the number of prompts rounded up to a power of two): padding
//! rows point at the null block. A sequence that produces the end-of-sequence token stops and
//! frees its blocks; the decode steps then run in the bucket of the sequences left, each
//! bucket's step built once, when first needed. On a GPU ([`Engine::Cuda`]) each bucket's
//! decode step is one compiled executor whose device runs are captured CUDA graphs replayed
//! every step (the block table, lengths and ids change, the addresses do not). The caches
//! stay where the last step left them, in its executor's storage, updated in place
//! ([`crate::exec::Executor::run_state`]): they cross to the host only when another stage
//! takes over (prefill to decode, a smaller bucket), and a step reads back only its logits.
//! The same holds on the CPU. [`cache::BlockPool`] hands out the blocks, [`sample`]
//! chooses tokens, and the timings give prefill and decode tokens per second.

pub mod cache;
pub mod last_token;
pub mod sample;
pub mod text;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tilec_ir::{DType, Dim, Graph, Tensor};
use tilec_onnx::proto::ModelProto;
use tilec_opt::decoder::{self, CacheShape, PagedDecoder};

use crate::compiled::{self, CompileOptions};
use crate::{Error, ImportOptions};
use cache::BlockPool;
pub use sample::{Rng, Sampling};

/// Where the steps run.
#[derive(Clone, Debug)]
pub enum Engine {
    /// The reference interpreter (the oracle; slow).
    Ref,
    /// Compiled for the host CPU.
    Cpu(CompileOptions),
    /// Compiled for an NVIDIA GPU: `paged_attention` over 16-bit caches runs as the paged
    /// decode kernels (`tilec_cuda::paged`), f32 caches on the host kernel. The caches stay
    /// on the device between steps.
    Cuda(crate::compiled_cuda::CudaOptions),
}

/// Options of [`generate`].
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    /// Tokens generated per prompt (the first comes from the prefill).
    pub max_new_tokens: usize,
    /// Tokens per cache block.
    pub block_size: usize,
    pub sampling: Sampling,
    /// A sequence that produces this token stops (the token is kept) and frees its blocks.
    pub eos: Option<i64>,
    pub engine: Engine,
    /// Runs the prefill and each decode bucket's first step once more, untimed, before the
    /// timed run (their outputs dropped): a stage's first run does one-time work (on a GPU it
    /// captures the CUDA graphs), which the speeds then leave out, as a warmed-up peer would.
    pub warmup: bool,
    /// After the timed steps, runs the last decode step this many times more with every
    /// kernel timed ([`Generation::profile`]; compiled engines only; 0: none).
    pub profile_steps: usize,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions { max_new_tokens: 16, block_size: 16, sampling: Sampling::default(), eos: None, engine: Engine::Ref, warmup: false, profile_steps: 0 }
    }
}

/// What [`generate`] produced and how long it took.
#[derive(Clone, Debug, Default)]
pub struct Generation {
    /// The new tokens of each prompt, in prompt order.
    pub tokens: Vec<Vec<i64>>,
    /// The prefill's logits at each prompt's last token (what its first new token is chosen
    /// from), in prompt order, as f32.
    pub first_logits: Vec<Vec<f32>>,
    /// Rewriting and compiling the prefill and decode graphs (a bucket first needed during
    /// the decode steps included here, not in `decode`).
    pub compile: Duration,
    /// The untimed warm-up runs ([`GenerateOptions::warmup`]), in neither `prefill` nor `decode`.
    pub warmup: Duration,
    pub prefill: Duration,
    pub decode: Duration,
    /// Prompt tokens (without padding) and tokens produced by decode steps.
    pub prefill_tokens: usize,
    pub decode_tokens: usize,
    /// Decode steps run.
    pub steps: usize,
    /// Rows of the prefill's batch bucket, and the buckets of the decode steps in the order
    /// they were first needed (smaller ones as sequences stop).
    pub bucket: usize,
    pub decode_buckets: Vec<usize>,
    /// Blocks of the pool (the null block included), tokens per block.
    pub blocks: usize,
    pub block_size: usize,
    /// Whether the model had past key/value inputs.
    pub had_past: bool,
    /// The last decode step's kernels, timed ([`GenerateOptions::profile_steps`]).
    pub profile: Option<tilec_runtime::Profile>,
}

impl Generation {
    pub fn prefill_tokens_per_s(&self) -> f64 {
        self.prefill_tokens as f64 / self.prefill.as_secs_f64().max(1e-9)
    }
    pub fn decode_tokens_per_s(&self) -> f64 {
        self.decode_tokens as f64 / self.decode.as_secs_f64().max(1e-9)
    }
}

/// The batch bucket of `n` sequences.
pub fn bucket(n: usize) -> usize {
    n.max(1).next_power_of_two()
}

fn err(msg: impl Into<String>) -> Error {
    Error::Generate(msg.into())
}

/// The names of the batch and sequence dims of the model's `input_ids`.
fn token_dims(model: &ModelProto) -> Result<(String, String), Error> {
    let g = crate::import(model, &ImportOptions::default())?;
    let names: Vec<&str> = g.inputs().iter().map(|&v| g.value(v).name.as_str()).collect();
    let v = g
        .inputs()
        .iter()
        .copied()
        .find(|&v| g.value(v).name == decoder::INPUT_IDS)
        .ok_or_else(|| err(format!("the model has no input 'input_ids': expected a decoder-only model with inputs input_ids and position_ids [batch, seq] (its inputs: {})", names.join(", "))))?;
    match g.value(v).ty.shape.as_slice() {
        [Dim::Sym(b), Dim::Sym(s)] => Ok((g.syms.name(*b).to_string(), g.syms.name(*s).to_string())),
        s => Err(err(format!(
            "input 'input_ids' has shape {}: expected symbolic [batch, seq] dims, so that prefill and decode steps can take their own sizes",
            g.syms.display_shape(s)
        ))),
    }
}

/// A graph ready to run on an engine.
enum Runner {
    Ref(Graph),
    /// Any executor (the CPU's or the GPU's).
    Compiled(Box<dyn RunSteps>),
}

/// What the driver needs of a compiled executor: runs that keep state in place
/// ([`crate::exec::Executor::run_state`]) and the state read back.
trait RunSteps {
    fn run_state(&mut self, inputs: &[Option<&Tensor>], state: &[(usize, usize)], fetch: &[bool]) -> Result<Vec<Option<Tensor>>, Error>;
    fn read_input(&self, i: usize) -> Result<Tensor, Error>;
    /// One plain run on every input, each step's time recorded in `p`.
    fn profile(&mut self, inputs: &[Tensor], p: &mut tilec_runtime::Profile) -> Result<(), Error>;
}

impl<B: crate::exec::Backend> RunSteps for crate::exec::Executor<B> {
    fn run_state(&mut self, inputs: &[Option<&Tensor>], state: &[(usize, usize)], fetch: &[bool]) -> Result<Vec<Option<Tensor>>, Error> {
        crate::exec::Executor::run_state(self, inputs, state, fetch)
    }
    fn read_input(&self, i: usize) -> Result<Tensor, Error> {
        crate::exec::Executor::read_input(self, i)
    }
    fn profile(&mut self, inputs: &[Tensor], p: &mut tilec_runtime::Profile) -> Result<(), Error> {
        self.run_profiled(inputs, Some(p)).map(|_| ())
    }
}

/// The caches a stage holds after its last run.
enum Held {
    None,
    /// On the host (the interpreter's outputs).
    Host(Vec<Tensor>),
    /// In the compiled executor's storage (on its device), where the run updated them.
    Resident,
}

/// One rewritten graph (prefill or decode step) and how it runs. The caches a step updates
/// stay with the stage that ran it until another stage needs them ([`Stage::take_caches`]).
struct Stage {
    dec: PagedDecoder,
    runner: Runner,
    /// Per cache (`k_cache_0`, `v_cache_0`, `k_cache_1`, ...): its graph input.
    cache_inputs: Vec<usize>,
    /// Pairs (output, input): each updated cache and the cache input it replaces.
    state: Vec<(usize, usize)>,
    held: Held,
}

impl Stage {
    /// The model imported with `rows` sequences of `tokens` new tokens and rewritten over the
    /// paged cache (not compiled yet: see [`Stage::load`]).
    fn rewrite(model: &ModelProto, dims: &(String, String), rows: usize, tokens: usize, cache: CacheShape) -> Result<PagedDecoder, Error> {
        let dim_values = HashMap::from([(dims.0.clone(), rows), (dims.1.clone(), tokens)]);
        let g = crate::import(model, &ImportOptions { dim_values, ..Default::default() })?;
        decoder::paged_decoder(&g, rows, tokens, cache).map_err(err)
    }

    /// Readies a rewritten graph on the engine (compiles it for the CPU or the GPU).
    fn load(dec: PagedDecoder, engine: &Engine) -> Result<Stage, Error> {
        let g = &dec.graph;
        let input = |name: &str| g.inputs().iter().position(|&v| g.value(v).name == name);
        let mut cache_inputs = vec![];
        for l in 0..dec.layers.len() {
            for name in [decoder::k_cache_name(l), decoder::v_cache_name(l)] {
                cache_inputs.push(input(&name).ok_or_else(|| err(format!("the rewritten step has no input '{name}'")))?);
            }
        }
        // Outputs: the logits, then the caches in the inputs' order.
        if g.outputs().len() != 1 + cache_inputs.len() {
            return Err(err(format!("the rewritten step has {} outputs: expected the logits and {} caches", g.outputs().len(), cache_inputs.len())));
        }
        let state = cache_inputs.iter().enumerate().map(|(j, &i)| (1 + j, i)).collect();
        let runner = match engine {
            Engine::Ref => Runner::Ref(dec.graph.clone()),
            Engine::Cpu(o) => Runner::Compiled(Box::new(compiled::compile(&dec.graph, o)?)),
            Engine::Cuda(o) => Runner::Compiled(Box::new(crate::compiled_cuda::compile(&dec.graph, o)?)),
        };
        Ok(Stage { dec, runner, cache_inputs, state, held: Held::None })
    }

    /// Runs on inputs by name (the caches left out) over `caches`, or over the caches this
    /// stage holds from its last run when `None`; returns the logits. The updated caches
    /// stay with the stage.
    fn run(&mut self, mut inputs: HashMap<String, Tensor>, caches: Option<Vec<Tensor>>) -> Result<Tensor, Error> {
        let mut given = match (caches, std::mem::replace(&mut self.held, Held::None)) {
            (Some(c), _) | (None, Held::Host(c)) => Some(c),
            (None, Held::Resident) => None,
            (None, Held::None) => return Err(err("a step was asked to run on caches it does not hold")),
        };
        if given.as_ref().is_some_and(|c| c.len() != self.cache_inputs.len()) {
            return Err(err(format!("{} caches given, the step takes {}", given.map_or(0, |c| c.len()), self.cache_inputs.len())));
        }
        // Graph inputs in order, the caches `None` for now.
        let g = &self.dec.graph;
        let mut by_input: Vec<Option<Tensor>> = Vec::with_capacity(g.inputs().len());
        for (i, &v) in g.inputs().iter().enumerate() {
            let name = &g.value(v).name;
            by_input.push(if self.cache_inputs.contains(&i) {
                None
            } else {
                Some(inputs.remove(name).ok_or_else(|| err(format!("input '{name}' of the step is missing")))?)
            });
        }
        if let Some(c) = given.take() {
            for (&i, t) in self.cache_inputs.iter().zip(c) {
                by_input[i] = Some(t);
            }
        }
        match &mut self.runner {
            Runner::Ref(g) => {
                let ordered: Vec<Tensor> = by_input.into_iter().collect::<Option<_>>().ok_or_else(|| err("the interpreter keeps no caches between steps"))?;
                let mut outs = tilec_ref::run(g, ordered)?.into_iter();
                let logits = outs.next().ok_or_else(|| err("the step returned no logits"))?;
                self.held = Held::Host(outs.collect());
                Ok(logits)
            }
            Runner::Compiled(x) => {
                let refs: Vec<Option<&Tensor>> = by_input.iter().map(|t| t.as_ref()).collect();
                let mut fetch = vec![false; 1 + self.cache_inputs.len()];
                fetch[0] = true;
                let outs = x.run_state(&refs, &self.state, &fetch)?;
                self.held = Held::Resident;
                outs.into_iter().next().flatten().ok_or_else(|| err("the step returned no logits"))
            }
        }
    }

    /// Runs the step `reps` times more on the inputs of its last run, every kernel timed; the
    /// caches it holds are read back and given whole (the keys and values written again are
    /// the same). Compiled engines only.
    fn profile(&mut self, mut inputs: HashMap<String, Tensor>, reps: usize) -> Result<tilec_runtime::Profile, Error> {
        let caches = self.take_caches()?;
        let names: Vec<String> = (0..self.cache_inputs.len() / 2).flat_map(|l| [decoder::k_cache_name(l), decoder::v_cache_name(l)]).collect();
        for (n, c) in names.into_iter().zip(caches) {
            inputs.insert(n, c);
        }
        let g = &self.dec.graph;
        let ordered: Vec<Tensor> = g
            .inputs()
            .iter()
            .map(|&v| inputs.remove(&g.value(v).name).ok_or_else(|| err(format!("input '{}' of the step is missing", g.value(v).name))))
            .collect::<Result<_, _>>()?;
        let Runner::Compiled(x) = &mut self.runner else {
            return Err(err("only compiled steps can be profiled"));
        };
        let mut p = tilec_runtime::Profile::default();
        for _ in 0..reps {
            x.profile(&ordered, &mut p)?;
        }
        Ok(p)
    }

    /// The caches this stage holds (read back from its executor's storage if there); the stage
    /// holds none after.
    fn take_caches(&mut self) -> Result<Vec<Tensor>, Error> {
        match (std::mem::replace(&mut self.held, Held::None), &self.runner) {
            (Held::Host(c), _) => Ok(c),
            (Held::Resident, Runner::Compiled(x)) => self.cache_inputs.iter().map(|&i| x.read_input(i)).collect(),
            _ => Err(err("a step was asked for caches it does not hold")),
        }
    }
}

/// Which stage holds the caches between steps.
#[derive(Copy, Clone, PartialEq, Eq)]
enum Holder {
    Prefill,
    /// The decode stage at this index of the stage list.
    Decode(usize),
}

/// Checks the prompts: at least one, none empty, every id in `[0, vocab)`.
fn check_prompts(prompts: &[Vec<i64>], vocab: usize) -> Result<(), Error> {
    if prompts.is_empty() {
        return Err(err("no prompt given: expected at least one prompt of token ids"));
    }
    for (i, p) in prompts.iter().enumerate() {
        if p.is_empty() {
            return Err(err(format!("prompt {i} is empty: expected at least one token id")));
        }
        if let Some(&t) = p.iter().find(|&&t| t < 0 || t as u64 >= vocab as u64) {
            return Err(err(format!("prompt {i}: token id {t} is out of range: the model's vocabulary has ids 0 to {}", vocab.saturating_sub(1))));
        }
    }
    Ok(())
}

fn i64_tensor(shape: Vec<usize>, v: Vec<i64>) -> Result<Tensor, Error> {
    Tensor::from_vec(shape, v).map_err(|e| err(e.to_string()))
}

fn i32_tensor(shape: Vec<usize>, v: Vec<i64>) -> Result<Tensor, Error> {
    let v: Vec<i32> = v.iter().map(|&x| x.clamp(i32::MIN as i64, i32::MAX as i64) as i32).collect();
    Tensor::from_vec(shape, v).map_err(|e| err(e.to_string()))
}

/// Rows `(r, t)` (row, token) of logits `[rows, T, vocab]` as f32; the logits are converted
/// once, not per row (a prefill's logits hold every token's).
fn logits_rows(logits: &Tensor, picks: &[(usize, usize)]) -> Result<Vec<Vec<f32>>, Error> {
    let s = logits.shape();
    let cast;
    let all = if logits.dtype() == DType::F32 {
        logits
    } else {
        cast = logits.cast(DType::F32);
        &cast
    };
    let v = all.as_slice::<f32>().ok_or_else(|| err(format!("logits {s:?} cannot be read as f32")))?;
    picks
        .iter()
        .map(|&(r, t)| {
            if s.len() != 3 || r >= s[0] || t >= s[1] {
                return Err(err(format!("logits have shape {s:?}: expected [rows, tokens, vocab] with row {r}, token {t}")));
            }
            let at = (r * s[1] + t) * s[2];
            v.get(at..at + s[2]).map(|x| x.to_vec()).ok_or_else(|| err(format!("logits {s:?}: row {r}, token {t} cannot be read")))
        })
        .collect()
}

/// The paged cache `generate` sizes for these prompts: every position a sequence ever
/// writes (its padded prompt, then its new tokens) has a block.
fn cache_shape(prompts: &[Vec<i64>], opts: &GenerateOptions) -> CacheShape {
    let bs = opts.block_size.max(1);
    let tp = prompts.iter().map(|p| p.len()).max().unwrap_or(1);
    let need: Vec<usize> = prompts.iter().map(|p| tp.max(p.len() + opts.max_new_tokens)).collect();
    let max_blocks = need.iter().map(|&x| x.div_ceil(bs)).max().unwrap_or(1).max(tp.div_ceil(bs));
    let blocks = 1 + need.iter().map(|&x| x.div_ceil(bs)).sum::<usize>();
    CacheShape { blocks, block_size: bs, max_blocks }
}

/// The decode step `generate` would compile for these prompts (their batch bucket, one new
/// token per row, over the cache sized for them), rewritten over the paged cache and not yet
/// optimized: what `tilec generate --explain` partitions.
pub fn decode_step_graph(model: &ModelProto, prompts: &[Vec<i64>], opts: &GenerateOptions) -> Result<Graph, Error> {
    if prompts.is_empty() {
        return Err(err("no prompt given: expected at least one prompt of token ids"));
    }
    let dims = token_dims(model)?;
    let dec = Stage::rewrite(model, &dims, bucket(prompts.len()), 1, cache_shape(prompts, opts))?;
    Ok(dec.graph)
}

/// Generates `opts.max_new_tokens` tokens for every prompt.
pub fn generate(model: &ModelProto, prompts: &[Vec<i64>], opts: &GenerateOptions) -> Result<Generation, Error> {
    opts.sampling.check().map_err(err)?;
    if opts.max_new_tokens == 0 {
        return Err(err("max new tokens must be at least 1"));
    }
    if opts.block_size == 0 {
        return Err(err("block size must be at least 1"));
    }
    if prompts.is_empty() {
        return Err(err("no prompt given: expected at least one prompt of token ids"));
    }
    if let Some(i) = prompts.iter().position(|p| p.is_empty()) {
        return Err(err(format!("prompt {i} is empty: expected at least one token id")));
    }
    let t0 = Instant::now();
    let dims = token_dims(model)?;
    let n = prompts.len();
    let rows = bucket(n);
    let bs = opts.block_size;
    let tp = prompts.iter().map(|p| p.len()).max().unwrap_or(1);
    let shape = cache_shape(prompts, opts);
    let (blocks, max_blocks) = (shape.blocks, shape.max_blocks);
    let mut prefill = Stage::rewrite(model, &dims, rows, tp, shape)?;
    check_prompts(prompts, prefill.vocab)?;
    // Only each prompt's last token's logits are read (padding rows: the first token's).
    let last: Vec<usize> = (0..rows).map(|b| prompts.get(b).map_or(0, |p| p.len() - 1)).collect();
    if tp > 1 {
        last_token::keep_last(&mut prefill, &last).map_err(|e| err(format!("picking the prefill's last tokens: {e}")))?;
    }
    let step = if opts.max_new_tokens > 1 { Some(Stage::rewrite(model, &dims, rows, 1, shape)?) } else { None };
    let mut prefill = Stage::load(prefill, &opts.engine)?;
    // The decode steps' stages by bucket, the prefill's bucket first.
    let mut stages: Vec<(usize, Stage)> = step.map(|s| Stage::load(s, &opts.engine)).transpose()?.map(|s| (rows, s)).into_iter().collect();
    let mut compile = t0.elapsed();

    let mut pool = BlockPool::new(blocks, bs, n).map_err(err)?;
    let g = &prefill.dec.graph;
    let dt = g.inputs().iter().map(|&v| g.value(v)).find(|v| v.name == decoder::k_cache_name(0)).map_or(DType::F32, |v| v.ty.dtype);
    let mut caches: Vec<Tensor> = vec![];
    for l in &prefill.dec.layers {
        caches.push(Tensor::try_zeros(dt, vec![blocks, bs, l.kv_heads, l.head_dim]).map_err(err)?);
        caches.push(Tensor::try_zeros(dt, vec![blocks, bs, l.kv_heads, l.v_head_dim]).map_err(err)?);
    }

    // Prefill.
    let t1 = Instant::now();
    let mut ids = vec![0i64; rows * tp];
    for (b, p) in prompts.iter().enumerate() {
        ids[b * tp..b * tp + p.len()].copy_from_slice(p);
        pool.reserve(b, tp).map_err(err)?;
    }
    let pos: Vec<i64> = (0..rows).flat_map(|_| 0..tp as i64).collect();
    let m = HashMap::from([
        (decoder::INPUT_IDS.to_string(), i64_tensor(vec![rows, tp], ids)?),
        (decoder::POSITION_IDS.to_string(), i64_tensor(vec![rows, tp], pos)?),
        (decoder::BLOCK_TABLE.to_string(), pool.block_table(&(0..n).collect::<Vec<_>>(), rows, max_blocks).map_err(err)?),
        (decoder::PAST_LENS.to_string(), i32_tensor(vec![rows], vec![0; rows])?),
    ]);
    // The caches go to the prefill's stage once; the stage that ran last holds them. A
    // second run of a step (a warm-up) writes the same keys and values again.
    let mut warmup = Duration::ZERO;
    let mut start = Some(caches);
    if opts.warmup {
        let tw = Instant::now();
        prefill.run(m.clone(), start.take())?;
        warmup += tw.elapsed();
    }
    let logits = prefill.run(m, start)?;
    let mut holder = Holder::Prefill;
    let mut rng = Rng::new(opts.sampling.seed);
    let mut out: Vec<Vec<i64>> = vec![vec![]; n];
    let picks: Vec<(usize, usize)> = (0..n).map(|b| (b, if tp > 1 { 0 } else { last[b] })).collect();
    let first_logits = logits_rows(&logits, &picks)?;
    for (b, row) in first_logits.iter().enumerate() {
        out[b].push(sample::sample(row, &opts.sampling, &mut rng) as i64);
    }
    let prefill_time = t1.elapsed().saturating_sub(warmup);

    // Decode steps, over the sequences still running, in the bucket of their number.
    let t2 = Instant::now();
    let (mut in_loop, mut decode_warmup) = (Duration::ZERO, Duration::ZERO);
    let (mut steps, mut decode_tokens) = (0, 0);
    let mut decode_buckets = vec![];
    let mut last_step: Option<(usize, HashMap<String, Tensor>)> = None;
    let stops = |t: i64| opts.eos == Some(t);
    let mut done: Vec<bool> = out.iter().map(|o| stops(o[0])).collect();
    for (b, _) in done.iter().enumerate().filter(|(_, d)| **d) {
        pool.release(b);
    }
    for i in 1..opts.max_new_tokens {
        let active: Vec<usize> = (0..n).filter(|&b| !done[b]).collect();
        if active.is_empty() {
            break;
        }
        let r = bucket(active.len());
        let k = match stages.iter().position(|(b, _)| *b == r) {
            Some(k) => k,
            None => {
                let tc = Instant::now();
                let s = Stage::load(Stage::rewrite(model, &dims, r, 1, shape)?, &opts.engine)?;
                stages.push((r, s));
                in_loop += tc.elapsed();
                stages.len() - 1
            }
        };
        let first_in_bucket = !decode_buckets.contains(&r);
        if first_in_bucket {
            decode_buckets.push(r);
        }
        // Row j feeds sequence active[j]'s last token at position len + i - 1.
        let mut ids = vec![0i64; r];
        let mut pos = vec![0i64; r];
        for (j, &b) in active.iter().enumerate() {
            ids[j] = out[b][i - 1];
            pos[j] = (prompts[b].len() + i - 1) as i64;
            pool.reserve(b, prompts[b].len() + i).map_err(err)?;
        }
        let m = HashMap::from([
            (decoder::INPUT_IDS.to_string(), i64_tensor(vec![r, 1], ids)?),
            (decoder::POSITION_IDS.to_string(), i64_tensor(vec![r, 1], pos.clone())?),
            (decoder::BLOCK_TABLE.to_string(), pool.block_table(&active, r, max_blocks).map_err(err)?),
            (decoder::PAST_LENS.to_string(), i32_tensor(vec![r], pos)?),
        ]);
        // The caches move only when the bucket changes (through the host, once).
        let mut start = match holder {
            Holder::Decode(j) if j == k => None,
            Holder::Decode(j) => Some(stages[j].1.take_caches()?),
            Holder::Prefill => Some(prefill.take_caches()?),
        };
        holder = Holder::Decode(k);
        if opts.warmup && first_in_bucket {
            let tw = Instant::now();
            stages[k].1.run(m.clone(), start.take())?;
            warmup += tw.elapsed();
            decode_warmup += tw.elapsed();
        }
        if opts.profile_steps > 0 {
            last_step = Some((k, m.clone()));
        }
        let logits = stages[k].1.run(m, start)?;
        let picks: Vec<(usize, usize)> = (0..active.len()).map(|j| (j, 0)).collect();
        let row_logits = logits_rows(&logits, &picks)?;
        for (&b, row) in active.iter().zip(&row_logits) {
            let t = sample::sample(row, &opts.sampling, &mut rng) as i64;
            out[b].push(t);
            if stops(t) {
                done[b] = true;
                pool.release(b);
            }
        }
        steps += 1;
        decode_tokens += active.len();
    }
    let decode = t2.elapsed().saturating_sub(in_loop + decode_warmup);
    compile += in_loop;
    let profile = match last_step {
        Some((k, m)) => Some(stages[k].1.profile(m, opts.profile_steps)?),
        None => None,
    };
    for b in 0..n {
        pool.release(b);
    }
    Ok(Generation {
        tokens: out,
        first_logits,
        warmup,
        compile,
        prefill: prefill_time,
        decode,
        prefill_tokens: prompts.iter().map(|p| p.len()).sum(),
        decode_tokens,
        steps,
        bucket: rows,
        decode_buckets,
        blocks,
        block_size: bs,
        had_past: prefill.dec.had_past,
        profile,
    })
}
