//! The CPU's kernel families (see `tilec_tile::family`): the algorithms the CPU back end can
//! run a kernel group with, each in its own file, listed in [`registry`] in the order they are
//! tried. Each family chooses how the group is lowered (`LowerOptions`) and scheduled
//! ([`tilec_tile::schedule::default_cpu`], with the family's parameters where it has some) and
//! builds a [`CpuBuilt`], which the C renderer compiles.
//!
//! Adding a family: a new file here with a `static` implementing
//! `Family<Target = Target, Built = CpuBuilt>`, and one [`Entry`] in [`registry`] naming the
//! kinds of kernel it is tried for.

mod attention_flash;
mod attention_gemm;
mod blis_gemm;
mod conv_transpose;
mod depthwise;
mod direct;
mod gemv;
mod group_direct;
mod grouped;
mod winograd;

use std::sync::OnceLock;

use tilec_opt::partition::GroupKind;
use tilec_opt::target::Target;
use tilec_tile::family::{Entry, Problem, Registry};
use tilec_tile::lower::{LowerOptions, Lowered};
use tilec_tile::schedule::{self, Schedule};
use tilec_tile::{Kernel, Stmt};

pub use blis_gemm::BLIS_GEMM;
pub use gemv::GEMV;

/// What a CPU family builds: the kernel as lowered and as scheduled.
#[derive(Clone, Debug)]
pub struct CpuBuilt {
    /// The lowered kernel with the graph values bound to its parameters.
    pub lowered: Lowered,
    /// The kernel after its schedule.
    pub kernel: Kernel,
    /// The schedule applied.
    pub schedule: Schedule,
}

/// The CPU families, in the order they are tried.
pub fn registry() -> &'static Registry<Target, CpuBuilt> {
    static REG: OnceLock<Registry<Target, CpuBuilt>> = OnceLock::new();
    REG.get_or_init(|| Registry {
        entries: vec![
            Entry { family: &winograd::WINOGRAD, kinds: &[GroupKind::Conv] },
            // Before `cpu.depthwise`: where both apply (groups of 8 output channels with
            // AVX2), whole vectors of a group's output channels beat lanes of groups, whose
            // inputs are strided loads.
            Entry { family: &group_direct::GROUP_DIRECT, kinds: &[GroupKind::Conv] },
            Entry { family: &depthwise::DEPTHWISE, kinds: &[GroupKind::Conv] },
            Entry { family: &conv_transpose::CONV_TRANSPOSE, kinds: &[GroupKind::Conv] },
            Entry { family: &grouped::GROUPED, kinds: &[GroupKind::Conv] },
            Entry { family: &attention_flash::ATTENTION_FLASH, kinds: &[GroupKind::Attention] },
            Entry { family: &attention_gemm::ATTENTION_GEMM, kinds: &[GroupKind::Attention] },
            Entry { family: &gemv::GEMV, kinds: &[GroupKind::Gemm] },
            Entry { family: &blis_gemm::BLIS_GEMM, kinds: &[] },
            Entry { family: &direct::DIRECT, kinds: &[] },
        ],
    })
}

/// Whether a kernel holds a matrix product.
pub(crate) fn has_gemm(k: &Kernel) -> bool {
    let mut found = false;
    for s in &k.body {
        s.visit(&mut |s| found |= matches!(s, Stmt::Gemm(_)));
    }
    found
}

/// The fixed dimensions of a value's shape (`None` if any is symbolic).
pub(crate) fn fixed_dims(p: &Problem, v: tilec_ir::ValueId) -> Option<Vec<i64>> {
    p.graph.value(v).ty.fixed_shape().map(|s| s.into_iter().map(|d| d as i64).collect())
}

/// A schedule by loop names: loops named from `parallel` run in parallel, loops named from
/// `vector` are vectorized (the direct convolution families name their loops so).
pub(crate) fn by_loop_names(k: &Kernel, parallel: &str, vector: &str) -> Schedule {
    let mut names = vec![];
    for st in &k.body {
        st.visit(&mut |st| {
            if let Stmt::For(l) = st {
                names.push(k.var_info(l.var).name.clone());
            }
        });
    }
    let mut s = Schedule::new();
    for name in names {
        if name.starts_with(parallel) {
            s.push(schedule::Primitive::Parallel { loop_var: name });
        } else if name.starts_with(vector) {
            s.push(schedule::Primitive::Vectorize { loop_var: name });
        }
    }
    s
}

/// The single gemm of a kernel.
pub(crate) fn the_gemm(k: &Kernel) -> Option<tilec_tile::Gemm> {
    let mut gemms = vec![];
    for s in &k.body {
        s.visit(&mut |s| {
            if let Stmt::Gemm(g) = s {
                gemms.push((**g).clone());
            }
        });
    }
    match gemms.len() {
        1 => gemms.pop(),
        _ => None,
    }
}

/// Lowers the problem with `opts` and applies `schedule` (computed from the lowered kernel).
pub(crate) fn build_with(
    p: &Problem,
    opts: LowerOptions,
    schedule: impl FnOnce(&Kernel) -> Schedule,
) -> Result<CpuBuilt, String> {
    let lowered = p.lower(opts).map_err(|e| e.to_string())?;
    let s = schedule(&lowered.kernel);
    let mut kernel = lowered.kernel.clone();
    schedule::apply(&mut kernel, &s).map_err(|e| format!("its schedule does not apply: {e}"))?;
    Ok(CpuBuilt { lowered, kernel, schedule: s })
}
