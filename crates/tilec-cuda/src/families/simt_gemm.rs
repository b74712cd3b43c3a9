//! `cuda.simt_gemm`: a kernel that is one `Gemm` (after folding the nest that consumes its
//! scratch into its epilogue) as a block-tiled GEMM on the CUDA cores
//! ([`crate::schedule_nest::schedule_gemm`]): output tiles per block, A/B tiles of depth
//! [`GEMM_BK`] staged in shared memory, a register micro-tile per thread.

use tilec_opt::target::Target;
use tilec_tile::family::{Family, ParamSpace, Params, Problem};
use tilec_tile::{Kernel, Stmt};

use super::{lowered, tile_ir, GpuBuilt};
use crate::schedule_nest::{fuse_scratch_epilogue, schedule_gemm, GEMM_BK, GEMM_THREADS};

pub struct SimtGemm;
pub static SIMT_GEMM: SimtGemm = SimtGemm;

/// The kernel the GEMM schedule takes: the scratch consumer folded in, or the kernel itself
/// when it is a single `Gemm`.
pub(crate) fn gemm_kernel(k: &Kernel) -> Option<Kernel> {
    fuse_scratch_epilogue(k).or_else(|| matches!(k.body.as_slice(), [Stmt::Gemm(_)]).then(|| k.clone()))
}

impl Family for SimtGemm {
    type Target = Target;
    type Built = GpuBuilt;

    fn name(&self) -> &'static str {
        "cuda.simt_gemm"
    }

    fn applies(&self, p: &Problem, _t: &Target) -> Result<(), String> {
        let l = lowered(p)?;
        match gemm_kernel(&l.kernel) {
            Some(_) => Ok(()),
            None if super::has_gemm(&l.kernel) => Err("the matrix product shares its kernel with other loop nests".into()),
            None => Err("not a matrix product".into()),
        }
    }

    /// The block shape is fixed today: one point.
    fn space(&self, _p: &Problem, _t: &Target) -> ParamSpace {
        ParamSpace { axes: vec![("threads", vec![GEMM_THREADS]), ("bk", vec![GEMM_BK])] }
    }

    fn heuristic(&self, _p: &Problem, _t: &Target) -> Params {
        Params::new(&[("threads", GEMM_THREADS), ("bk", GEMM_BK)])
    }

    fn build(&self, p: &Problem, _t: &Target, _params: &Params) -> Result<GpuBuilt, String> {
        tile_ir(p, "gemm", |k| {
            let g = gemm_kernel(k).unwrap_or_else(|| k.clone());
            schedule_gemm(&g)
        })
    }
}
