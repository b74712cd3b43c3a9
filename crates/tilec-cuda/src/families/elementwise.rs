//! `cuda.elementwise`: perfect elementwise nests over 16-byte vectors, a few per thread in an
//! unrolled loop, over a grid that covers the tensor ([`crate::schedule_elementwise_with`]).

use tilec_opt::target::Target;
use tilec_tile::family::{Family, ParamSpace, Params, Problem};
use tilec_tile::Stmt;

use super::{lowered, tile_ir, GpuBuilt};
use crate::schedule::{row_nest, schedule_elementwise_with};

pub struct Elementwise;
pub static ELEMENTWISE: Elementwise = Elementwise;

impl Family for Elementwise {
    type Target = Target;
    type Built = GpuBuilt;

    fn name(&self) -> &'static str {
        "cuda.elementwise"
    }

    fn applies(&self, p: &Problem, _t: &Target) -> Result<(), String> {
        let l = lowered(p)?;
        let (loops, body) = row_nest(&l.kernel.body);
        if loops.is_empty() {
            return Err("no loop nest".into());
        }
        if body.iter().any(|s| matches!(s, Stmt::For(_))) {
            return Err("not a perfect nest (it loops over rows)".into());
        }
        Ok(())
    }

    /// Vectors per thread (0: a grid-stride loop over a grid sized for the resident blocks;
    /// -1: 4 for large tensors, 1 for small ones).
    fn space(&self, _p: &Problem, _t: &Target) -> ParamSpace {
        ParamSpace { axes: vec![("vectors_per_thread", vec![-1, 0, 1, 2, 4, 8])] }
    }

    fn heuristic(&self, _p: &Problem, _t: &Target) -> Params {
        Params::new(&[("vectors_per_thread", -1)])
    }

    fn build(&self, p: &Problem, t: &Target, params: &Params) -> Result<GpuBuilt, String> {
        let v = params.get("vectors_per_thread").filter(|&v| v >= 0);
        tile_ir(p, "elementwise", |k| schedule_elementwise_with(k, &t.gpu, v))
    }
}
