//! `paged_attention` (layout in `tilec_ir::op::paged`): the new tokens' keys and values
//! written into copies of the caches, then for every query a softmax over its sequence's
//! positions read back through the block table, all in f64, rounded once at the end.

use tilec_ir::Tensor;

/// Checked geometry of one call.
struct Geo {
    b: usize,
    hq: usize,
    hkv: usize,
    t: usize,
    d: usize,
    dv: usize,
    blocks: usize,
    bs: usize,
    m: usize,
}

fn geometry(args: &[&Tensor]) -> Result<Geo, String> {
    if args.len() != 7 {
        return Err(format!("expected 7 inputs, got {}", args.len()));
    }
    let (q, k, v, kc, vc) = (args[0].shape(), args[1].shape(), args[2].shape(), args[3].shape(), args[4].shape());
    let (bt, pl) = (args[5].shape(), args[6].shape());
    if q.len() != 4 || k.len() != 4 || v.len() != 4 || kc.len() != 4 || vc.len() != 4 || bt.len() != 2 || pl.len() != 1 {
        return Err("q, k, v, k_cache, v_cache must be 4-D, block_table 2-D, past_lens 1-D".into());
    }
    let g = Geo { b: q[0], hq: q[1], hkv: k[1], t: q[2], d: q[3], dv: v[3], blocks: kc[0], bs: kc[1], m: bt[1] };
    let ok = k == [g.b, g.hkv, g.t, g.d]
        && v == [g.b, g.hkv, g.t, g.dv]
        && kc == [g.blocks, g.bs, g.hkv, g.d]
        && vc == [g.blocks, g.bs, g.hkv, g.dv]
        && bt[0] == g.b
        && pl == [g.b]
        && g.hkv > 0
        && g.hq % g.hkv == 0
        && g.bs > 0;
    if !ok {
        return Err(format!(
            "shapes do not fit: q {q:?}, k {k:?}, v {v:?}, k_cache {kc:?}, v_cache {vc:?}, block_table {bt:?}, past_lens {pl:?}"
        ));
    }
    Ok(g)
}

/// The cache slot (block, offset) of position `p` of sequence `b`.
fn slot(g: &Geo, table: &[i64], b: usize, p: usize) -> Result<usize, String> {
    let lb = p / g.bs;
    if lb >= g.m {
        return Err(format!(
            "sequence {b}: position {p} needs logical block {lb}, but the block table has {} per sequence",
            g.m
        ));
    }
    let blk = table[b * g.m + lb];
    if blk < 0 || blk as usize >= g.blocks {
        return Err(format!("block_table[{b}, {lb}] = {blk} is outside the pool of {} blocks", g.blocks));
    }
    Ok(blk as usize * g.bs + p % g.bs)
}

pub fn paged_attention(args: &[&Tensor], scale: f32) -> Result<Vec<Tensor>, String> {
    let g = geometry(args)?;
    let dt = args[0].dtype();
    let (q, k, v) = (args[0].to_f64_vec(), args[1].to_f64_vec(), args[2].to_f64_vec());
    let (mut kc, mut vc) = (args[3].to_f64_vec(), args[4].to_f64_vec());
    let table = args[5].to_i64_vec();
    let past = args[6].to_i64_vec();
    // Append first: queries read their own token from the cache.
    for b in 0..g.b {
        let p0 = usize::try_from(past[b]).map_err(|_| format!("past_lens[{b}] = {} is negative", past[b]))?;
        for t in 0..g.t {
            let s = slot(&g, &table, b, p0 + t)?;
            for h in 0..g.hkv {
                let src = ((b * g.hkv + h) * g.t + t) * g.d;
                kc[(s * g.hkv + h) * g.d..][..g.d].copy_from_slice(&k[src..src + g.d]);
                let src = ((b * g.hkv + h) * g.t + t) * g.dv;
                vc[(s * g.hkv + h) * g.dv..][..g.dv].copy_from_slice(&v[src..src + g.dv]);
            }
        }
    }
    let rep = g.hq / g.hkv;
    let mut y = vec![0.0; g.b * g.hq * g.t * g.dv];
    for b in 0..g.b {
        let p0 = past[b] as usize;
        let slots: Vec<usize> = (0..p0 + g.t).map(|p| slot(&g, &table, b, p)).collect::<Result<_, _>>()?;
        for h in 0..g.hq {
            let hk = h / rep;
            for t in 0..g.t {
                let qi = &q[((b * g.hq + h) * g.t + t) * g.d..][..g.d];
                let n = p0 + t + 1;
                let scores: Vec<f64> = slots[..n]
                    .iter()
                    .map(|&s| {
                        let kr = &kc[(s * g.hkv + hk) * g.d..][..g.d];
                        qi.iter().zip(kr).map(|(a, b)| a * b).sum::<f64>() * scale as f64
                    })
                    .collect();
                let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - mx).exp()).collect();
                let sum: f64 = e.iter().sum();
                let out = &mut y[((b * g.hq + h) * g.t + t) * g.dv..][..g.dv];
                for (&s, &w) in slots[..n].iter().zip(&e) {
                    let vr = &vc[(s * g.hkv + hk) * g.dv..][..g.dv];
                    for (o, x) in out.iter_mut().zip(vr) {
                        *o += w / sum * x;
                    }
                }
            }
        }
    }
    let make = |shape: Vec<usize>, data: &[f64]| Tensor::from_f64s(dt, shape, data).map_err(|e| e.to_string());
    Ok(vec![
        make(vec![g.b, g.hq, g.t, g.dv], &y)?,
        make(args[3].shape().to_vec(), &kc)?,
        make(args[4].shape().to_vec(), &vc)?,
    ])
}
