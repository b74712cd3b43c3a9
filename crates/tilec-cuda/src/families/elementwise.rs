//! `cuda.elementwise`: perfect elementwise nests over 16-byte vectors, a few per thread in an
//! unrolled loop, over a grid that covers the tensor
//! ([`crate::schedule::schedule_elementwise_with`]).

use tilec_tile::family::{ParamSpace, Params};
use tilec_tile::{Kernel, Stmt};

use super::TileSchedule;
use crate::schedule::{bad, row_nest, schedule_elementwise_with, GpuTarget};

pub struct Elementwise;

impl TileSchedule for Elementwise {
    fn name(&self) -> &'static str {
        "cuda.elementwise"
    }

    fn fits(&self, k: &Kernel) -> crate::Result<()> {
        let (loops, body) = row_nest(&k.body);
        if loops.is_empty() {
            return Err(bad(k, "no loop nest"));
        }
        if body.iter().any(|s| matches!(s, Stmt::For(_))) {
            return Err(bad(k, "not a perfect nest (it loops over rows)"));
        }
        Ok(())
    }

    /// Vectors per thread (0: a grid-stride loop over a grid sized for the resident blocks;
    /// -1: 4 for large tensors, 1 for small ones).
    fn space(&self) -> ParamSpace {
        ParamSpace { axes: vec![("vectors_per_thread", vec![-1, 0, 1, 2, 4, 8])] }
    }

    fn heuristic(&self) -> Params {
        Params::new(&[("vectors_per_thread", -1)])
    }

    fn schedule(&self, k: &Kernel, t: &GpuTarget, params: &Params) -> crate::Result<(Kernel, &'static str)> {
        let v = params.get("vectors_per_thread").filter(|&v| v >= 0);
        schedule_elementwise_with(k, t, v).map(|s| (s, "elementwise"))
    }
}
