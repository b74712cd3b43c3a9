//! `cpu.direct`: any kernel as its lowered loop nests under the default CPU schedule (parallel
//! outer loops, vectorized inner ones, partitioned bounds checks); convolutions as direct
//! nests, attention one query row at a time, channels-last global pools by blocks of channels.
//! Kernels that lower to a matrix product are the GEMM family's.

use tilec_opt::target::Target;
use tilec_tile::family::{Family, Params, Problem};
use tilec_tile::lower::{AttentionAlgo, ConvAlgo, LowerOptions, PoolAlgo};
use tilec_tile::schedule::default_cpu;

use super::{build_with, has_gemm, CpuBuilt};

pub struct Direct;
pub static DIRECT: Direct = Direct;

const OPTS: LowerOptions = LowerOptions { conv: ConvAlgo::Direct, attention: AttentionAlgo::Rows, pool: PoolAlgo::ChannelBlocks };

impl Family for Direct {
    type Target = Target;
    type Built = CpuBuilt;

    fn name(&self) -> &'static str {
        "cpu.direct"
    }

    fn applies(&self, p: &Problem, _t: &Target) -> Result<(), String> {
        let l = p.lower(OPTS).map_err(|e| e.to_string())?;
        if has_gemm(&l.kernel) {
            return Err("it lowers to a matrix product".into());
        }
        Ok(())
    }

    fn build(&self, p: &Problem, t: &Target, _params: &Params) -> Result<CpuBuilt, String> {
        build_with(p, OPTS, |k| default_cpu(k, &t.cpu))
    }
}
