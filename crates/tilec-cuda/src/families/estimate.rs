//! The analytic cost model of the tiled GEMM templates (`sm90_tc_gemm`, `sm80_mma_gemm`), for
//! the tuner's ordering of candidates (`Family::estimate`; only the order matters).
//!
//! A roofline over the tiles: the compute of the busiest SM (blocks are dealt to the SMs in
//! waves, so a last partial wave costs a whole block's time: wave quantization), slowed for
//! small tiles (each stage loads `tile_m + tile_n` rows for `tile_m * tile_n` products), against
//! the bytes moved from DRAM (operands once, the output, split-K partials) and from L2 (every
//! tile's operands), plus the load latency a ring of too few stages leaves exposed.

use tilec_opt::target::Target;

/// A tiled product as the model sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TiledGemm {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: usize,
    pub tile_m: usize,
    pub tile_n: usize,
    pub tile_k: usize,
    pub stages: usize,
    /// Blocks sharing one tile's K range.
    pub split_k: usize,
    /// Bytes of an operand element and of an output element.
    pub in_bytes: usize,
    pub out_bytes: usize,
    /// The template's share of the device's tensor peak (mma.sync reaches less than wgmma).
    pub efficiency: f64,
}

/// Load latency from L2/DRAM that the stage ring must cover, seconds.
const LOAD_LATENCY_S: f64 = 1.0e-6;
/// L2 bandwidth over DRAM bandwidth.
const L2_OVER_DRAM: f64 = 2.5;

/// Estimated seconds of `g` on `t` (see the module documentation).
pub(crate) fn roofline(g: &TiledGemm, t: &Target) -> f64 {
    let sms = t.units.max(1);
    let split = g.split_k.max(1);
    let (tm, tn, tk) = (g.tile_m.max(1), g.tile_n.max(1), g.tile_k.max(1));
    let blocks = g.m.div_ceil(tm) * g.n.div_ceil(tn) * g.batch.max(1) * split;
    // K of one block, in whole stages.
    let k_block = g.k.div_ceil(split).div_ceil(tk) * tk;
    let sm_peak = (t.peak_mma_16 * g.efficiency).max(1.0) / sms as f64;
    // Operand traffic through shared memory per product: small tiles pay more.
    let small_tiles = 1.0 + 32.0 * (1.0 / tm as f64 + 1.0 / tn as f64);
    let block_s = 2.0 * (tm * tn * k_block) as f64 / sm_peak * small_tiles;
    // The busiest SM runs this many blocks.
    let rounds = blocks.div_ceil(sms) as f64;
    let compute = rounds * block_s;
    let (m, n, k, b) = (g.m as f64, g.n as f64, g.k as f64, g.batch.max(1) as f64);
    let mut dram = b * ((m * k + k * n) * g.in_bytes as f64 + m * n * g.out_bytes as f64);
    if split > 1 {
        // f32 partials parked and read back.
        dram += b * m * n * 4.0 * 2.0 * split as f64;
    }
    let l2 = blocks as f64 * ((tm + tn) * k_block * g.in_bytes) as f64;
    let memory = (dram / t.mem_bw.max(1.0)).max(l2 / (t.mem_bw.max(1.0) * L2_OVER_DRAM));
    // A stage's products must cover the latency of the loads in flight ahead of it.
    let step_s = block_s * tk as f64 / k_block.max(1) as f64;
    let steps = (k_block / tk).max(1) as f64;
    let exposed = rounds * steps * (LOAD_LATENCY_S / (g.stages.max(2) - 1) as f64 - step_s).max(0.0);
    compute.max(memory) + exposed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(m: usize, n: usize, k: usize, tm: usize, tn: usize, stages: usize, split_k: usize) -> TiledGemm {
        TiledGemm {
            m,
            n,
            k,
            batch: 1,
            tile_m: tm,
            tile_n: tn,
            tile_k: 64,
            stages,
            split_k,
            in_bytes: 2,
            out_bytes: 2,
            efficiency: 1.0,
        }
    }

    #[test]
    fn waves_small_tiles_stages_and_split_k() {
        let t = Target::cuda_h200();
        // 132 tiles of 128x128 fill one wave; 133 take two.
        let one = roofline(&g(128 * 12, 128 * 11, 4096, 128, 128, 4, 1), &t);
        let two = roofline(&g(128 * 12 + 1, 128 * 11, 4096, 128, 128, 4, 1), &t);
        assert!(two > 1.8 * one, "{one} {two}");
        // Larger tiles beat small ones on a large product.
        let big = roofline(&g(4096, 4096, 4096, 128, 256, 4, 1), &t);
        let small = roofline(&g(4096, 4096, 4096, 64, 64, 4, 1), &t);
        assert!(big < small, "{big} {small}");
        // Two stages expose load latency that four hide.
        let s2 = roofline(&g(256, 256, 8192, 64, 64, 2, 1), &t);
        let s4 = roofline(&g(256, 256, 8192, 64, 64, 4, 1), &t);
        assert!(s4 < s2, "{s2} {s4}");
        // A skinny product with long K wants K split over the idle SMs.
        let k1 = roofline(&g(64, 768, 16384, 64, 128, 4, 1), &t);
        let k8 = roofline(&g(64, 768, 16384, 64, 128, 4, 8), &t);
        assert!(k8 < k1, "{k1} {k8}");
    }
}
