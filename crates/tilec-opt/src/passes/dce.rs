//! `dce`: dead-code elimination. Removes nodes none of whose outputs is (transitively)
//! used by a graph output, and constants nobody reads, via `Graph::cleanup` (which also
//! restores topological order and dense numbering). Graph inputs stay even when unused:
//! they are the graph's signature.

use super::ir;
use crate::{OptError, Pass};
use tilec_ir::Graph;

pub struct Dce;

impl Pass for Dce {
    fn name(&self) -> &'static str {
        "dce"
    }

    fn run(&self, g: &mut Graph) -> Result<bool, OptError> {
        let values = g.values().len();
        let removed = g.cleanup().map_err(ir("dce"))?;
        Ok(removed > 0 || g.values().len() != values)
    }
}
