//! `cuda.rows`: row-wise kernels (reductions, softmax, normalizations, attention rows) with
//! rows long enough for a block ([`crate::schedule::schedule_rows`]): a row in registers over
//! a block or a power-of-two warp segment, block reductions through warp shuffles.

use tilec_tile::family::{ParamSpace, Params};
use tilec_tile::{Kernel, Stmt};

use super::TileSchedule;
use crate::schedule::{bad, fuse_sibling_nests, row_nest, schedule_rows, GpuTarget, RowOptions};

pub struct Rows;

/// Rows shorter than this are not worth a block (the elementwise or direct schedules are).
const MIN_ROW: i64 = 32;

impl TileSchedule for Rows {
    fn name(&self) -> &'static str {
        "cuda.rows"
    }

    fn fits(&self, k: &Kernel) -> crate::Result<()> {
        let fused = fuse_sibling_nests(k);
        let (_, body) = row_nest(&fused.as_ref().unwrap_or(k).body);
        let longest = body
            .iter()
            .filter_map(|s| match s {
                Stmt::For(l) => Some(l.extent),
                _ => None,
            })
            .max();
        match longest {
            None => Err(bad(k, "no loop over a row")),
            Some(n) if n < MIN_ROW => Err(bad(k, format!("rows of {n} are too short for a block"))),
            Some(_) => Ok(()),
        }
    }

    /// Threads per block and rows per block (0: chosen from the row length), and the elements
    /// a thread keeps in registers per cached row.
    fn space(&self) -> ParamSpace {
        ParamSpace {
            axes: vec![
                ("threads", vec![0, 64, 128, 256, 512, 1024]),
                ("rows_per_block", vec![0, 1, 2, 4, 8]),
                ("max_register_elems", vec![16, 32, 64, 128]),
            ],
        }
    }

    fn heuristic(&self) -> Params {
        let d = RowOptions::default();
        Params::new(&[
            ("threads", d.threads.unwrap_or(0)),
            ("rows_per_block", d.rows_per_block.unwrap_or(0)),
            ("max_register_elems", d.max_register_elems),
        ])
    }

    fn schedule(&self, k: &Kernel, _t: &GpuTarget, params: &Params) -> crate::Result<(Kernel, &'static str)> {
        let auto = |v: Option<i64>| v.filter(|&x| x > 0);
        let opts = RowOptions {
            threads: auto(params.get("threads")),
            rows_per_block: auto(params.get("rows_per_block")),
            max_register_elems: params.get("max_register_elems").unwrap_or(RowOptions::default().max_register_elems),
        };
        // A normalization beside its residual output: the two nests as one row nest.
        let fused = fuse_sibling_nests(k);
        schedule_rows(fused.as_ref().unwrap_or(k), &opts).map(|s| (s, "rows"))
    }
}
