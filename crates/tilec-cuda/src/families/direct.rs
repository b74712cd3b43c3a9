//! `cuda.direct`: any other kernel as direct loop nests ([`crate::schedule_nest`]): the outer
//! loops proven independent spread over a grid-stride loop (`direct`), several nests in one
//! block separated by barriers (`block`), or one thread when nothing is provably parallel
//! (`serial`). A group of several nodes that would run serially is refused, so that its nodes
//! become kernels of their own with parallel schedules.

use tilec_opt::target::Target;
use tilec_tile::family::{Family, Params, Problem};

use super::{lowered, GpuBuilt};
use crate::render::render;
use crate::schedule_nest::schedule_direct_named;

pub struct Direct;
pub static DIRECT: Direct = Direct;

impl Family for Direct {
    type Target = Target;
    type Built = GpuBuilt;

    fn name(&self) -> &'static str {
        "cuda.direct"
    }

    fn applies(&self, p: &Problem, _t: &Target) -> Result<(), String> {
        lowered(p).map(drop)
    }

    fn build(&self, p: &Problem, t: &Target, _params: &Params) -> Result<GpuBuilt, String> {
        let lowered = lowered(p)?;
        let (scheduled, how) = schedule_direct_named(&lowered.kernel, &t.gpu).map_err(|e| e.to_string())?;
        if how == "serial" && p.nodes.len() > 1 {
            return Err("fused, the nodes would run on one GPU thread".into());
        }
        let source = render(&scheduled).map_err(|e| e.to_string())?;
        Ok(GpuBuilt { lowered, scheduled, schedule: how, source, plan: None, fallback: None })
    }
}
