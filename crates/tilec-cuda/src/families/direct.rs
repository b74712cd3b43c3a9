//! `cuda.direct`: any other kernel as direct loop nests
//! ([`crate::schedule::schedule_direct_named`]): the outer loops proven independent spread
//! over a grid-stride loop (`direct`), several nests in one block separated by barriers
//! (`block`), or one thread when nothing is provably parallel (`serial`).

use tilec_tile::family::Params;
use tilec_tile::Kernel;

use super::TileSchedule;
use crate::schedule::{schedule_direct_named, GpuTarget};

pub struct Direct;

impl TileSchedule for Direct {
    fn name(&self) -> &'static str {
        "cuda.direct"
    }

    fn fits(&self, _k: &Kernel) -> crate::Result<()> {
        Ok(())
    }

    fn schedule(&self, k: &Kernel, t: &GpuTarget, _params: &Params) -> crate::Result<(Kernel, &'static str)> {
        schedule_direct_named(k, t)
    }
}
