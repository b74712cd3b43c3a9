//! `cpu.blis_gemm`: kernels whose anchor lowers to a `Gemm` (matrix products, convolutions as
//! an implicit im2col, with their fused prologues and epilogues) rendered by the BLIS-style
//! template of `crate::gemm`: an `mr × nr` register tile, `kc`-deep packed panels and
//! `mc × nc` cache blocks. Its parameters are that blocking; the heuristic is the default CPU
//! schedule's ([`tilec_tile::schedule::gemm_params`]).

use tilec_ir::op::LinalgOp;
use tilec_ir::Op;
use tilec_opt::target::Target;
use tilec_tile::family::{Family, ParamSpace, Params, Problem};
use tilec_tile::lower::{ConvAlgo, LowerOptions};
use tilec_tile::schedule::{default_cpu, Primitive, Schedule};
use tilec_tile::Kernel;

use super::{build_with, has_gemm, the_gemm, CpuBuilt};

pub struct BlisGemm;
pub static BLIS_GEMM: BlisGemm = BlisGemm;

/// A convolution is a GEMM of depth `channels per group × taps` with `output channels per
/// group` columns; shallower or narrower ones waste the register tiles (a direct nest is
/// faster). Depths of 8 to 15 (wav2vec2's first conv: one channel, 10 taps; a 1×1 conv over 8
/// channels; a 3×3 over one) still run faster as a GEMM than as a direct nest.
const MIN_DEPTH: i64 = 8;
const MIN_OUT_CHANNELS: i64 = 4;

/// Accumulator registers a tile may take (of the 32 vector registers of AVX-512; the rest
/// hold the A broadcasts and B vectors).
const MAX_ACC_REGS: i64 = 28;

const NAMES: [&str; 5] = ["mr", "nr", "kc", "mc", "nc"];

fn opts(p: &Problem) -> LowerOptions {
    match p.anchor_op() {
        Some(Op::Linalg(LinalgOp::Conv { .. })) => LowerOptions { conv: ConvAlgo::Gemm, ..Default::default() },
        _ => LowerOptions::default(),
    }
}

/// Vector lanes of the gemm's accumulation type.
fn lanes(k: &Kernel, t: &Target) -> i64 {
    let elem = the_gemm(k).map_or(4, |g| g.acc_dtype.size_bytes().clamp(4, 8)) as i64;
    (t.cpu.vector_bytes as i64 / elem).max(1)
}

/// The default CPU schedule of the problem's GEMM lowering (computed once per problem: the
/// heuristic reads its blocking, the build starts from it).
fn default_schedule(p: &Problem, t: &Target) -> Option<Schedule> {
    p.memo("cpu.blis_gemm.schedule", || p.lower(opts(p)).ok().map(|l| default_cpu(&l.kernel, &t.cpu)))
}

/// The blocking a schedule gives its (single) gemm.
fn blocking_of(s: &Schedule) -> Option<[i64; 5]> {
    s.steps.iter().find_map(|p| match p {
        Primitive::GemmBlocking { mr, nr, kc, mc, nc, .. } => Some([*mr, *nr, *kc, *mc, *nc]),
        _ => None,
    })
}

impl Family for BlisGemm {
    type Target = Target;
    type Built = CpuBuilt;

    fn name(&self) -> &'static str {
        "cpu.blis_gemm"
    }

    fn applies(&self, p: &Problem, _t: &Target) -> Result<(), String> {
        if let Some(Op::Linalg(LinalgOp::Conv { group, .. })) = p.anchor_op() {
            let w = &p.graph.value(p.graph.node(p.anchor.unwrap_or(p.nodes[0])).inputs[1]).ty;
            let dims: Vec<i64> = w.shape.iter().map(|d| d.fixed().map_or(0, |n| n as i64)).collect();
            let depth: i64 = dims.iter().skip(1).product();
            let cols = dims.first().copied().unwrap_or(0) / (*group).max(1) as i64;
            if depth < MIN_DEPTH || cols < MIN_OUT_CHANNELS {
                return Err(format!(
                    "a depth of {depth} (channels x taps) and {cols} output channels per group are below {MIN_DEPTH} and {MIN_OUT_CHANNELS}: the register tiles would run mostly empty"
                ));
            }
        }
        let l = p.lower(opts(p)).map_err(|e| e.to_string())?;
        if !has_gemm(&l.kernel) {
            return Err("it lowers to no matrix product".into());
        }
        Ok(())
    }

    fn space(&self, p: &Problem, t: &Target) -> ParamSpace {
        let lanes = p.lower(opts(p)).map(|l| lanes(&l.kernel, t)).unwrap_or(16);
        if p.lower(opts(p)).ok().and_then(|l| the_gemm(&l.kernel)).is_none() {
            return ParamSpace::default();
        }
        ParamSpace {
            axes: vec![
                ("mr", vec![4, 6, 8, 12]),
                ("nr", vec![lanes, 2 * lanes, 3 * lanes]),
                ("kc", vec![64, 128, 256, 384, 512]),
                ("mc", vec![96, 192, 384, 768]),
                ("nc", vec![1024, 2048, 4096]),
            ],
        }
    }

    /// Any blocking the template supports: `nr` whole vectors, at most 28 accumulator
    /// registers, `kc` a multiple of 8, `mc` of `mr` and `nc` of `nr`.
    fn check(&self, p: &Problem, t: &Target, params: &Params) -> Result<(), String> {
        if params.is_empty() {
            return Ok(());
        }
        let l = p.lower(opts(p)).map_err(|e| e.to_string())?;
        if the_gemm(&l.kernel).is_none() {
            return Err("blocking parameters need a kernel with a single matrix product".into());
        }
        let v = |n: &str| params.get(n).ok_or_else(|| format!("parameter '{n}' is missing"));
        let (mr, nr, kc, mc, nc) = (v("mr")?, v("nr")?, v("kc")?, v("mc")?, v("nc")?);
        let lanes = lanes(&l.kernel, t);
        if [mr, nr, kc, mc, nc].iter().any(|&x| x <= 0) {
            return Err("every blocking parameter must be positive".into());
        }
        if nr % lanes != 0 || mr * (nr / lanes) > MAX_ACC_REGS {
            return Err(format!("an {mr}x{nr} tile is not whole vectors of {lanes} within {MAX_ACC_REGS} registers"));
        }
        if kc % 8 != 0 || mc % mr != 0 || nc % nr != 0 {
            return Err(format!("kc={kc} must be a multiple of 8, mc={mc} of mr, nc={nc} of nr"));
        }
        Ok(())
    }

    fn heuristic(&self, p: &Problem, t: &Target) -> Params {
        if p.lower(opts(p)).ok().and_then(|l| the_gemm(&l.kernel)).is_none() {
            return Params::default();
        }
        match default_schedule(p, t).as_ref().and_then(blocking_of) {
            Some(b) => Params(NAMES.iter().copied().zip(b).collect()),
            None => Params::default(),
        }
    }

    /// A roofline with the template's losses: register tiles padded at the edges, a
    /// micro-kernel bound by its loads when the tile is small (2 FMAs and 2 loads a cycle) or
    /// by FMA latency when it has fewer than 8 accumulators, C reloaded once per `kc` slice,
    /// `kc x nr` B panels overflowing half of L1, `mc x kc` A blocks overflowing L2 and
    /// `kc x nc` B blocks half of L3, `mc x nc` blocks quantized over the cores, and the
    /// packing traffic (A once per `nc` block, B once).
    fn estimate(&self, p: &Problem, t: &Target, params: &Params) -> Option<f64> {
        let l = p.lower(opts(p)).ok()?;
        let g = the_gemm(&l.kernel)?;
        let lanes = lanes(&l.kernel, t) as f64;
        let [mr, nr, kc, mc, nc] = NAMES.map(|n| params.get(n).map(|v| v.max(1) as f64));
        let (mr, nr, kc, mc, nc) = (mr?, nr?, kc?, mc?, nc?);
        let transposed = default_schedule(p, t)
            .is_some_and(|s| s.steps.iter().any(|st| matches!(st, Primitive::GemmTranspose { .. })));
        let (m, n) = if transposed { (g.n as f64, g.m as f64) } else { (g.m as f64, g.n as f64) };
        let (k, batch) = (g.k.max(1) as f64, g.batch.max(1) as f64);
        let elem = g.acc_dtype.size_bytes().clamp(4, 8) as f64;
        let padded = (m / mr).ceil() * mr * (n / nr).ceil() * nr;
        let vecs = nr / lanes;
        let accs = mr * vecs;
        let mut eff = (accs / 2.0) / (accs / 2.0).max((mr + vecs) / 2.0);
        eff *= (accs / 8.0).min(1.0);
        let kc_eff = kc.min(k.max(8.0));
        eff *= kc_eff / (kc_eff + 16.0);
        let cpu = &t.cpu;
        if kc_eff * nr * elem > cpu.l1_bytes as f64 / 2.0 {
            eff *= 0.7;
        }
        if mc.min(m) * kc_eff * elem > cpu.l2_bytes as f64 * 0.75 {
            eff *= 0.6;
        }
        if kc_eff * nc.min(n) * elem > cpu.l3_bytes as f64 / 2.0 {
            eff *= 0.8;
        }
        let threads = cpu.threads.max(1) as f64;
        let units = batch * (m / mc).ceil() * (n / nc).ceil();
        let par = units / ((units / threads).ceil() * threads);
        let peak = t.peak_f32.max(1.0);
        let compute = 2.0 * batch * padded * k / (peak * eff.max(1e-3) * par.max(1e-3));
        let pack = batch * (m * k * (n / nc).ceil() + k * n) * elem / t.mem_bw.max(1.0);
        Some(compute + pack)
    }

    fn build(&self, p: &Problem, t: &Target, params: &Params) -> Result<CpuBuilt, String> {
        build_with(p, opts(p), |k| {
            let mut s = default_schedule(p, t).unwrap_or_else(|| default_cpu(k, &t.cpu));
            if let [Some(mr), Some(nr), Some(kc), Some(mc), Some(nc)] = NAMES.map(|n| params.get(n)) {
                for step in &mut s.steps {
                    if let Primitive::GemmBlocking { mr: a, nr: b, kc: c, mc: d, nc: e, .. } = step {
                        (*a, *b, *c, *d, *e) = (mr, nr, kc, mc, nc);
                    }
                }
            }
            s
        })
    }
}
