//! The pass trait and the pass manager.
//!
//! [`pipeline_spec`] is THE list of graph passes, in order, each with the optimization
//! level that enables it; [`Pipeline::for_level`] keeps those enabled at a level. A stage
//! is either one pass run once, or a group of passes iterated to a fixpoint (until no
//! pass in the group changes the graph, at most `max_iters` rounds), which is how the
//! cheap canonicalizations (folding, simplification, CSE, DCE) feed each other.
//!
//! Every pass run is recorded in a [`PassReport`] (wall time, whether it changed the
//! graph, node counts, and optionally the printed IR after it). With verification on
//! (the default in debug builds and tests), `tilec_ir::verify` runs after every pass and
//! a failure names the pass that broke the graph.

use crate::passes::{ChooseLayout, Cse, Dce, EinsumToMatmul, FoldBatchNorm, FoldConstants, MergeProducts, PadThinChannels, PadThinConvs, SinkTransposes, Simplify, SplitResizes, TargetKind, UnshareConstantViews};
use std::time::{Duration, Instant};
use tilec_ir::{Graph, IrError};

#[derive(Debug, thiserror::Error)]
pub enum OptError {
    #[error("pass '{pass}': {source}")]
    Ir { pass: &'static str, source: IrError },
    #[error("pass '{pass}': {msg}")]
    Pass { pass: &'static str, msg: String },
}

/// A graph-to-graph transformation.
pub trait Pass {
    /// A short kebab-case name, used by `--print-ir-after=NAME`.
    fn name(&self) -> &'static str;
    /// Rewrites the graph in place; returns whether anything changed.
    fn run(&self, g: &mut Graph) -> Result<bool, OptError>;
}

/// One step of a pipeline.
pub enum Stage {
    /// One pass, run once.
    Once(Box<dyn Pass>),
    /// Passes run in order, repeatedly, until a whole round changes nothing (or
    /// `max_iters` rounds ran).
    Fixpoint {
        name: &'static str,
        max_iters: usize,
        passes: Vec<Box<dyn Pass>>,
    },
}

/// An entry of [`pipeline_spec`]: a pass and the lowest level that enables it.
pub struct SpecEntry {
    pub level: u8,
    pub pass: Box<dyn Pass>,
}

/// A stage of [`pipeline_spec`] before filtering by level.
pub enum SpecStage {
    Once(SpecEntry),
    Fixpoint {
        name: &'static str,
        max_iters: usize,
        passes: Vec<SpecEntry>,
    },
}

fn at(level: u8, pass: impl Pass + 'static) -> SpecEntry {
    SpecEntry {
        level,
        pass: Box::new(pass),
    }
}

/// The canonicalization group: constant folding, algebraic simplification, CSE and DCE
/// enable each other (a fold makes a simplification visible, a simplification makes two
/// nodes identical, ...), so they run to a fixpoint.
fn canonicalize() -> SpecStage {
    SpecStage::Fixpoint {
        name: "canonicalize",
        max_iters: 8,
        passes: vec![
            at(1, FoldConstants::default()), // evaluate all-constant nodes (size-capped)
            at(1, Simplify),                 // x*1, transpose∘transpose, cast chains, ...
            at(2, Cse::default()),           // merge identical nodes and small constants
            at(1, Dce),                      // drop the dead, restore order
        ],
    }
}

/// Every graph pass in pipeline order, with the level (0..=3) that enables it.
///
/// ```text
///  level  stage
///  1      dce                      remove what the importer left unused
///  1      einsum-to-matmul         an einsum that is a batched matrix product -> matmul
///  1-2    canonicalize (fixpoint)  fold-constants(1) simplify(1) cse(2) dce(1)
///  2      fold-batchnorm           conv + batch_norm -> conv with scaled weights
///  3      recognize-*              gelu silu swiglu groupnorm layernorm rmsnorm softmax attention
///  3      merge-products           products of one activation by constant weights -> one product
///  3      choose-layout            NCHW vs NHWC per conv region, per target (cuda: rewrites to NHWC)
///  2      sink-transposes          move transposes down until they cancel or merge
///  1-2    canonicalize (fixpoint)  clean up after the rewrites above
///  1      unshare-constant-views   a view of constants read by several nodes: one copy each
/// ```
///
/// This is the spec for the default target ([`TargetKind::Cpu`]); see [`pipeline_spec_for`].
pub fn pipeline_spec() -> Vec<SpecStage> {
    pipeline_spec_for(TargetKind::default())
}

/// Whether attention is recognized for the CUDA target (for the FlashAttention family): yes
/// unless `TILEC_CUDA_ATTENTION=off`, which keeps its products and softmax apart.
pub fn cuda_flash_attention_env() -> bool {
    !matches!(std::env::var("TILEC_CUDA_ATTENTION").as_deref(), Ok("off"))
}

/// Whether `merge-products` runs: yes unless `TILEC_MERGE_PRODUCTS=off` (for measuring what
/// the merge is worth on the same build).
pub fn merge_products_env() -> bool {
    !matches!(std::env::var("TILEC_MERGE_PRODUCTS").as_deref(), Ok("off"))
}

/// [`pipeline_spec`] for a given target (`choose-layout` depends on it; `pad-thin-convs` runs on
/// the CPU only, `pad-thin-channels` on CUDA only; on CUDA `recognize-attention` takes only what the FlashAttention family runs,
/// and not at all with `TILEC_CUDA_ATTENTION=off`).
pub fn pipeline_spec_for(target: TargetKind) -> Vec<SpecStage> {
    pipeline_spec_with(target, target == TargetKind::Cuda && cuda_flash_attention_env())
}

/// [`pipeline_spec_for`] with the CUDA attention opt-in given: with `cuda_flash` the CUDA
/// pipeline recognizes the attention the FlashAttention family can take (16-bit, head dims 64
/// or 128 alike for Q, K and V, no softcapping: `recognize::attention::attention_flash`); other
/// attention stays unrecognized, as without it.
pub fn pipeline_spec_with(target: TargetKind, cuda_flash: bool) -> Vec<SpecStage> {
    let mut v = vec![
        SpecStage::Once(at(1, Dce)),
        SpecStage::Once(at(1, EinsumToMatmul)),
        canonicalize(),
        SpecStage::Once(at(2, FoldBatchNorm)),
    ];
    // ---- O3: composite-op recognition (order matters: see recognize/mod.rs) ----
    for pass in crate::recognize::passes() {
        // On CUDA a recognized attention has only a direct nest (one thread per query row),
        // far slower than its two matrix products and a row softmax as separate kernels: keep
        // it unrecognized there until an attention kernel family exists.
        if target == TargetKind::Cuda && pass.name() == "recognize-attention" {
            if cuda_flash {
                let pass = Box::new(crate::recognize::pattern::RecognizePass {
                    name: "recognize-attention",
                    rec: crate::recognize::attention::attention_flash,
                });
                v.push(SpecStage::Once(SpecEntry { level: 3, pass }));
            }
            continue;
        }
        v.push(SpecStage::Once(SpecEntry { level: 3, pass }));
    }
    if merge_products_env() {
        v.push(SpecStage::Once(at(3, MergeProducts)));
    }
    // ---- layout ----
    v.push(SpecStage::Once(at(3, ChooseLayout::new(target))));
    v.push(SpecStage::Once(at(2, SinkTransposes)));
    if target == TargetKind::Cpu {
        v.push(SpecStage::Once(at(3, PadThinConvs)));
        v.push(SpecStage::Once(at(3, SplitResizes)));
    }
    if target == TargetKind::Cuda {
        v.push(SpecStage::Once(at(3, PadThinChannels)));
    }
    v.push(canonicalize());
    v.push(SpecStage::Once(at(1, UnshareConstantViews)));
    v
}

/// Options for [`Pipeline::run`].
#[derive(Clone, Debug)]
pub struct PipelineOptions {
    /// Run `tilec_ir::verify` after every pass (default: on in debug builds).
    pub verify: bool,
    /// Collect the printed IR after every pass ("all") or after the named pass.
    pub print_ir_after: Option<String>,
}

impl Default for PipelineOptions {
    fn default() -> Self {
        PipelineOptions {
            verify: cfg!(debug_assertions),
            print_ir_after: None,
        }
    }
}

/// What one run of one pass did.
#[derive(Clone, Debug)]
pub struct PassReport {
    pub pass: &'static str,
    /// The fixpoint stage the run belongs to, if any.
    pub stage: Option<&'static str>,
    /// The round of the fixpoint stage (0 for a `Once` stage).
    pub iteration: usize,
    pub changed: bool,
    pub nodes_before: usize,
    pub nodes_after: usize,
    pub time: Duration,
    /// `tilec_ir::print_graph` after the pass, when `print_ir_after` selected it.
    pub ir_after: Option<String>,
}

/// An ordered list of stages for one optimization level.
pub struct Pipeline {
    pub level: u8,
    pub stages: Vec<Stage>,
}

impl Pipeline {
    /// The passes of [`pipeline_spec`] enabled at `level` (levels above 3 act as 3).
    pub fn for_level(level: u8) -> Pipeline {
        Pipeline::for_level_and_target(level, TargetKind::default())
    }

    /// [`Pipeline::for_level`] for a given target (on CUDA, attention is recognized unless
    /// `TILEC_CUDA_ATTENTION=off` is set).
    pub fn for_level_and_target(level: u8, target: TargetKind) -> Pipeline {
        Pipeline::for_level_target_with(level, target, target == TargetKind::Cuda && cuda_flash_attention_env())
    }

    /// [`Pipeline::for_level_and_target`] with the CUDA attention opt-in given (see
    /// [`pipeline_spec_with`]).
    pub fn for_level_target_with(level: u8, target: TargetKind, cuda_flash: bool) -> Pipeline {
        let mut stages = Vec::new();
        for s in pipeline_spec_with(target, cuda_flash) {
            match s {
                SpecStage::Once(e) if e.level <= level => stages.push(Stage::Once(e.pass)),
                SpecStage::Once(_) => {}
                SpecStage::Fixpoint {
                    name,
                    max_iters,
                    passes,
                } => {
                    let passes: Vec<Box<dyn Pass>> = passes
                        .into_iter()
                        .filter(|e| e.level <= level)
                        .map(|e| e.pass)
                        .collect();
                    if !passes.is_empty() {
                        stages.push(Stage::Fixpoint {
                            name,
                            max_iters,
                            passes,
                        });
                    }
                }
            }
        }
        Pipeline { level, stages }
    }

    /// Names of the passes in run order (a fixpoint group as `name(a, b, c)`).
    pub fn describe(&self) -> Vec<String> {
        self.stages
            .iter()
            .map(|s| match s {
                Stage::Once(p) => p.name().to_string(),
                Stage::Fixpoint { name, passes, .. } => {
                    let n: Vec<&str> = passes.iter().map(|p| p.name()).collect();
                    format!("{name}({})", n.join(", "))
                }
            })
            .collect()
    }

    /// Runs the pipeline on `g`; returns one report per pass run.
    pub fn run(&self, g: &mut Graph, opts: &PipelineOptions) -> Result<Vec<PassReport>, OptError> {
        let mut reports = Vec::new();
        for s in &self.stages {
            match s {
                Stage::Once(p) => {
                    run_one(p.as_ref(), None, 0, g, opts, &mut reports)?;
                }
                Stage::Fixpoint {
                    name,
                    max_iters,
                    passes,
                } => {
                    for it in 0..*max_iters {
                        let mut any = false;
                        for p in passes {
                            any |= run_one(p.as_ref(), Some(name), it, g, opts, &mut reports)?;
                        }
                        if !any {
                            break;
                        }
                    }
                }
            }
        }
        Ok(reports)
    }
}

fn run_one(
    p: &dyn Pass,
    stage: Option<&'static str>,
    iteration: usize,
    g: &mut Graph,
    opts: &PipelineOptions,
    reports: &mut Vec<PassReport>,
) -> Result<bool, OptError> {
    let nodes_before = g.nodes().len();
    let t0 = Instant::now();
    let changed = p.run(g)?;
    let time = t0.elapsed();
    if opts.verify {
        tilec_ir::verify(g).map_err(|source| OptError::Ir {
            pass: p.name(),
            source,
        })?;
    }
    let ir_after = match &opts.print_ir_after {
        Some(sel) if sel == "all" || sel == p.name() => Some(tilec_ir::print_graph(g)),
        _ => None,
    };
    reports.push(PassReport {
        pass: p.name(),
        stage,
        iteration,
        changed,
        nodes_before,
        nodes_after: g.nodes().len(),
        time,
        ir_after,
    });
    Ok(changed)
}

/// Runs the pipeline of `level` with default options (verification in debug builds).
pub fn optimize(g: &mut Graph, level: u8) -> Result<Vec<PassReport>, OptError> {
    Pipeline::for_level(level).run(g, &PipelineOptions::default())
}
