//! `cuda.rows`: row-wise kernels (reductions, softmax, normalizations, attention rows) with
//! rows long enough for a block ([`crate::schedule_rows`]): a row in registers over a block or
//! a power-of-two warp segment, block reductions through warp shuffles.

use tilec_opt::target::Target;
use tilec_tile::family::{Family, ParamSpace, Params, Problem};
use tilec_tile::Stmt;

use super::{lowered, tile_ir, GpuBuilt};
use crate::schedule::{row_nest, schedule_rows, RowOptions};

pub struct Rows;
pub static ROWS: Rows = Rows;

/// Rows shorter than this are not worth a block (the elementwise or direct schedules are).
const MIN_ROW: i64 = 32;

fn options(params: &Params) -> RowOptions {
    let d = RowOptions::default();
    let auto = |v: Option<i64>| v.filter(|&x| x > 0);
    RowOptions {
        threads: auto(params.get("threads")),
        rows_per_block: auto(params.get("rows_per_block")),
        max_register_elems: params.get("max_register_elems").unwrap_or(d.max_register_elems),
    }
}

impl Family for Rows {
    type Target = Target;
    type Built = GpuBuilt;

    fn name(&self) -> &'static str {
        "cuda.rows"
    }

    fn applies(&self, p: &Problem, _t: &Target) -> Result<(), String> {
        let l = lowered(p)?;
        let (_, body) = row_nest(&l.kernel.body);
        let longest = body
            .iter()
            .filter_map(|s| match s {
                Stmt::For(l) => Some(l.extent),
                _ => None,
            })
            .max();
        match longest {
            None => Err("no loop over a row".into()),
            Some(n) if n < MIN_ROW => Err(format!("rows of {n} are too short for a block")),
            Some(_) => Ok(()),
        }
    }

    /// Threads per block and rows per block (0: chosen from the row length), and the elements
    /// a thread keeps in registers per cached row.
    fn space(&self, _p: &Problem, _t: &Target) -> ParamSpace {
        ParamSpace {
            axes: vec![
                ("threads", vec![0, 64, 128, 256, 512, 1024]),
                ("rows_per_block", vec![0, 1, 2, 4, 8]),
                ("max_register_elems", vec![16, 32, 64, 128]),
            ],
        }
    }

    fn heuristic(&self, _p: &Problem, _t: &Target) -> Params {
        let d = RowOptions::default();
        Params::new(&[
            ("threads", d.threads.unwrap_or(0)),
            ("rows_per_block", d.rows_per_block.unwrap_or(0)),
            ("max_register_elems", d.max_register_elems),
        ])
    }

    fn build(&self, p: &Problem, _t: &Target, params: &Params) -> Result<GpuBuilt, String> {
        let opts = options(params);
        tile_ir(p, "rows", |k| schedule_rows(k, &opts))
    }
}
