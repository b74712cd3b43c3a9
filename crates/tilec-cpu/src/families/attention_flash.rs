//! `cpu.attention_flash`: flash-style attention for long sequences: per (batch, head, block of
//! `bq` queries) a loop over blocks of `bk` keys, each a score tile and an online softmax
//! between two matrix products on the GEMM template's micro-kernels, in parallel over
//! (batch, head, query block); memory linear in the sequence. The same forms as
//! `cpu.attention_gemm` (f32 attention without past, per-batch lengths or a requested QK
//! output; softcapping and sliding windows in the score tile's epilogue). Short sequences (fewer than [`MIN_KEYS`] keys) are left to
//! `cpu.attention_gemm`, whose one score matrix per head is then no larger than a tile.

use tilec_ir::op::NnOp;
use tilec_ir::Op;
use tilec_opt::target::Target;
use tilec_tile::family::{Family, ParamSpace, Params, Problem};
use tilec_tile::lower::{AttentionAlgo, LowerOptions};
use tilec_tile::schedule::default_cpu;

use super::{build_with, CpuBuilt};

pub struct AttentionFlash;
pub static ATTENTION_FLASH: AttentionFlash = AttentionFlash;

/// Keys from which the flash form is chosen by default. With a single key block it is the
/// two-product form plus its own passes (the keys' transposition, the queries' copy, the
/// final division): with two threads the two-product form was faster at 64 and 128 keys
/// (0.089 against 0.117 ms, 0.192 against 0.204), the flash form from 256 (0.61 against
/// 0.64 ms; 1.16 against 1.53 at 384) (`bench/results/cpu-flash-2026-12-02/families`).
pub const MIN_KEYS: i64 = 256;

/// Query and key blocks: a `256 × 256` score tile (256 KiB, in L2 beside the `256 × dv`
/// accumulator and the packed key and value panels). Every key block's K and V are packed
/// for the micro-kernels once per query block, so tall query blocks pay less packing per
/// multiply-add; deep key blocks make the accumulator's rescaling and the tile stores small
/// beside the products (`bench/results/cpu-flash-2026-12-02` has the block sizes measured).
const BQ: i64 = 256;
const BK: i64 = 256;

/// How many blocks of about `target` to cut `len` into: one while `len` is at most a
/// quarter over `target` (DINOv2's 257 tokens in blocks of 256 and 1 gave a second key
/// block of a single key and a second query block of a single row: two passes for one
/// element), else `ceil(len / target)`.
fn balanced(len: i64, target: i64) -> i64 {
    if len <= target + target / 4 {
        1
    } else {
        (len + target - 1) / target
    }
}

/// The block length that cuts `len` into `n` nearly equal blocks (a multiple of 8).
fn block_of(len: i64, n: i64) -> i64 {
    let b = (len + n.max(1) - 1) / n.max(1);
    ((b + 7) / 8 * 8).max(8)
}

/// (queries, keys, batch × query heads) of the problem's attention.
fn lengths(p: &Problem) -> Option<(i64, i64, i64)> {
    let n = p.anchor?;
    let node = p.graph.node(n);
    let Op::Nn(NnOp::Attention { .. }) = &node.op else {
        return None;
    };
    let dims = |v| p.graph.value(v).ty.fixed_shape();
    let (qs, ks) = (dims(node.inputs[0])?, dims(node.inputs[1])?);
    let at = |s: &[usize]| if s.len() == 3 { s[1] } else { s[s.len() - 2] } as i64;
    let heads = match (&node.op, qs.len()) {
        (Op::Nn(NnOp::Attention { q_num_heads, .. }), 3) => *q_num_heads as i64,
        _ => *qs.get(1)? as i64,
    };
    Some((at(&qs), at(&ks), qs[0] as i64 * heads.max(1)))
}

impl Family for AttentionFlash {
    type Target = Target;
    type Built = CpuBuilt;

    fn name(&self) -> &'static str {
        "cpu.attention_flash"
    }

    fn applies(&self, p: &Problem, _t: &Target) -> Result<(), String> {
        match lengths(p) {
            Some(_) => Ok(()),
            None => Err("not attention with known lengths".into()),
        }
    }

    /// Not below [`MIN_KEYS`] keys: there the two-product form's score matrix per head is
    /// small and it skips the rescaling (see `bench/results/cpu-flash-2026-12-02`).
    fn by_default(&self, p: &Problem, _t: &Target) -> Result<(), String> {
        match lengths(p) {
            Some((_, keys, _)) if keys >= MIN_KEYS => Ok(()),
            Some((_, keys, _)) => Err(format!("{keys} keys, fewer than {MIN_KEYS}: one score matrix per head is small")),
            None => Err("not attention with known lengths".into()),
        }
    }

    /// Powers of two, and the heuristic's balanced blocks.
    fn space(&self, p: &Problem, t: &Target) -> ParamSpace {
        let h = self.heuristic(p, t);
        let with = |mut v: Vec<i64>, x: Option<i64>| {
            if let Some(x) = x.filter(|x| !v.contains(x)) {
                v.push(x);
                v.sort();
            }
            v
        };
        ParamSpace { axes: vec![("bq", with(vec![32, 64, 128, 256], h.get("bq"))), ("bk", with(vec![64, 128, 256, 512], h.get("bk")))] }
    }

    /// Blocks of about `256 × 256`, balanced over the lengths ([`balanced`]), with more query
    /// blocks where (batch, head, query block) would give fewer than four tasks per thread.
    fn heuristic(&self, p: &Problem, t: &Target) -> Params {
        let (mut bq, mut bk) = (BQ, BK);
        if let Some((queries, keys, heads)) = lengths(p) {
            let mut nq = balanced(queries, BQ);
            while heads * nq < 4 * t.cpu.threads as i64 && (queries + nq - 1) / nq > 32 {
                nq *= 2;
            }
            bq = block_of(queries, nq);
            bk = block_of(keys, balanced(keys, BK));
        }
        Params::new(&[("bq", bq), ("bk", bk)])
    }

    fn build(&self, p: &Problem, t: &Target, params: &Params) -> Result<CpuBuilt, String> {
        let bq = params.get("bq").unwrap_or(BQ);
        let bk = params.get("bk").unwrap_or(BK);
        let opts = LowerOptions { attention: AttentionAlgo::Flash { bq, bk }, ..Default::default() };
        build_with(p, opts, |k| default_cpu(k, &t.cpu))
    }
}
