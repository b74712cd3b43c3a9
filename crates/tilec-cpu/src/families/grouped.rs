//! `cpu.grouped`: channels-last grouped convolutions with few output channels per group
//! (fewer than a vector: ResNeXt's 4 and 8, RegNet's narrow stages) as the GEMM family's
//! template over groups merged a few at a time (`ConvAlgo::GroupedGemm`): a merged group's
//! weights are block-diagonal, so that its output channels fill whole vectors and one
//! deeper, wider product replaces several narrow ones. The zero blocks cost the multiply-adds
//! the padding of a narrow register tile would cost anyway; what the merge saves is the
//! per-product overhead (packing, tile edges, short reductions). The schedule is the default
//! CPU schedule's (its `GemmBlocking`).

use tilec_ir::op::LinalgOp;
use tilec_ir::Op;
use tilec_opt::target::Target;
use tilec_tile::family::{Family, Params, Problem};
use tilec_tile::lower::{ConvAlgo, LowerOptions};
use tilec_tile::schedule::default_cpu;

use super::{build_with, has_gemm, CpuBuilt};

pub struct Grouped;
pub static GROUPED: Grouped = Grouped;

/// Groups merged for a convolution of `groups` groups of `cg` input and `mg` output channels
/// on vectors of `lanes` elements: the most that keep the merged output channels within one
/// vector and divide the groups, if that is more than one.
pub fn merge_for(groups: i64, cg: i64, mg: i64, lanes: i64) -> Option<i64> {
    if groups < 2 || cg < 2 || mg < 1 || mg >= lanes {
        return None;
    }
    let m = (1..=lanes / mg).rev().find(|&m| groups % m == 0)?;
    (m > 1).then_some(m)
}

/// The merge for the problem's convolution, or why there is none.
fn merge(p: &Problem, t: &Target) -> Result<i64, String> {
    let Some(Op::Linalg(LinalgOp::Conv { group, channels_last, .. })) = p.anchor_op() else {
        return Err("not a convolution".into());
    };
    if !channels_last {
        return Err("not channels-last".into());
    }
    let node = p.graph.node(p.anchor.unwrap_or(p.nodes[0]));
    let ty = &p.graph.value(node.inputs[1]).ty;
    let Some(ws) = ty.fixed_shape() else {
        return Err("symbolic weights".into());
    };
    if !ty.dtype.is_float() {
        return Err("not a floating-point convolution".into());
    }
    let lanes = (t.cpu.vector_bytes as i64 / ty.dtype.size_bytes().max(1) as i64).max(1);
    let g = *group as i64;
    let (cg, mg) = (ws[1] as i64, ws[0] as i64 / g.max(1));
    merge_for(g, cg, mg, lanes).ok_or_else(|| {
        format!("{g} groups of {cg} input and {mg} output channels: nothing to merge into vectors of {lanes}")
    })
}

impl Family for Grouped {
    type Target = Target;
    type Built = CpuBuilt;

    fn name(&self) -> &'static str {
        "cpu.grouped"
    }

    fn applies(&self, p: &Problem, t: &Target) -> Result<(), String> {
        let m = merge(p, t)?;
        let l = p.lower(opts(m)).map_err(|e| e.to_string())?;
        if !has_gemm(&l.kernel) {
            return Err("it lowers to no matrix product".into());
        }
        Ok(())
    }

    fn build(&self, p: &Problem, t: &Target, _params: &Params) -> Result<CpuBuilt, String> {
        build_with(p, opts(merge(p, t)?), |k| default_cpu(k, &t.cpu))
    }
}

fn opts(merge: i64) -> LowerOptions {
    LowerOptions { conv: ConvAlgo::GroupedGemm { merge: merge as u32 }, ..Default::default() }
}

#[cfg(test)]
mod tests {
    use super::merge_for;

    #[test]
    fn merges_into_one_vector() {
        assert_eq!(merge_for(32, 4, 4, 16), Some(4));
        assert_eq!(merge_for(32, 8, 8, 16), Some(2));
        assert_eq!(merge_for(10, 16, 16, 16), None);
        assert_eq!(merge_for(6, 3, 3, 16), Some(3));
        assert_eq!(merge_for(7, 4, 4, 16), None);
        assert_eq!(merge_for(32, 1, 1, 16), None);
    }
}
