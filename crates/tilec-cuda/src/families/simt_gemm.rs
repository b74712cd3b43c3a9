//! `cuda.simt_gemm`: a kernel that is one `Gemm` (after folding the nest that consumes its
//! scratch into its epilogue) as a block-tiled GEMM on the CUDA cores
//! ([`crate::schedule::schedule_gemm`]).

use tilec_tile::family::{ParamSpace, Params};
use tilec_tile::{Kernel, Stmt};

use super::TileSchedule;
use crate::schedule::{bad, fuse_scratch_epilogue, schedule_gemm, GpuTarget, GEMM_BK, GEMM_THREADS};

pub struct SimtGemm;

/// The kernel the GEMM schedule takes: the scratch consumer folded in, or the kernel itself
/// when it is a single `Gemm`.
fn gemm_kernel(k: &Kernel) -> Option<Kernel> {
    fuse_scratch_epilogue(k).or_else(|| matches!(k.body.as_slice(), [Stmt::Gemm(_)]).then(|| k.clone()))
}

impl TileSchedule for SimtGemm {
    fn name(&self) -> &'static str {
        "cuda.simt_gemm"
    }

    fn fits(&self, k: &Kernel) -> crate::Result<()> {
        match gemm_kernel(k) {
            Some(_) => Ok(()),
            None if super::has_gemm(k) => Err(bad(k, "the matrix product shares its kernel with other loop nests")),
            None => Err(bad(k, "not a matrix product")),
        }
    }

    /// The block shape is fixed today: one point.
    fn space(&self) -> ParamSpace {
        ParamSpace { axes: vec![("threads", vec![GEMM_THREADS]), ("bk", vec![GEMM_BK])] }
    }

    fn heuristic(&self) -> Params {
        Params::new(&[("threads", GEMM_THREADS), ("bk", GEMM_BK)])
    }

    fn schedule(&self, k: &Kernel, _t: &GpuTarget, _params: &Params) -> crate::Result<(Kernel, &'static str)> {
        let g = gemm_kernel(k).ok_or_else(|| bad(k, "not a matrix product"))?;
        schedule_gemm(&g).map(|s| (s, "gemm"))
    }
}
