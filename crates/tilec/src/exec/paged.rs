//! The host kernel of `paged_attention` (layout in `tilec_ir::op::paged`), run by host steps
//! in place of the interpreter for f32 caches: the append, then per (sequence, query head,
//! new token) the context split into chunks of whole blocks, each chunk's partial softmax
//! (maximum, sum of exponentials, unnormalized output) computed on its own and the chunks
//! merged through their log-sum-exp, the structure of a split-KV decode kernel on a GPU (one
//! block per chunk, a second pass merging). Sums run in f32 as a device kernel's do; the
//! interpreter (f64) is the oracle it is tested against.

use tilec_ir::Tensor;

/// Tokens per chunk of the split-KV form by default (rounded to whole blocks).
pub const DEFAULT_SPLIT_TOKENS: usize = 256;

/// Runs `paged_attention` on f32 tensors, chunks of `split_tokens` tokens (rounded up to whole
/// blocks; 0: one chunk). Returns `None` when the tensors are not f32 (the caller then runs
/// the interpreter), an error naming the input when the geometry or an index does not fit.
pub fn paged_attention(args: &[&Tensor], scale: f32, split_tokens: usize) -> Option<Result<Vec<Tensor>, String>> {
    if args.len() != 7 || args[..5].iter().any(|t| t.as_slice::<f32>().is_none()) {
        return None;
    }
    Some(run(args, scale, split_tokens))
}

fn run(args: &[&Tensor], scale: f32, split_tokens: usize) -> Result<Vec<Tensor>, String> {
    let f = |i: usize| args[i].as_slice::<f32>().unwrap_or(&[]);
    let (q, k, v) = (f(0), f(1), f(2));
    let (qs, ks, vs, kcs, vcs) = (args[0].shape(), args[1].shape(), args[2].shape(), args[3].shape(), args[4].shape());
    let (bts, pls) = (args[5].shape(), args[6].shape());
    if [qs.len(), ks.len(), vs.len(), kcs.len(), vcs.len(), bts.len(), pls.len()] != [4, 4, 4, 4, 4, 2, 1] {
        return Err("q, k, v, k_cache, v_cache must be 4-D, block_table 2-D, past_lens 1-D".into());
    }
    let (b_n, hq, t_n, d) = (qs[0], qs[1], qs[2], qs[3]);
    let (hkv, dv, blocks, bs, m) = (ks[1], vs[3], kcs[0], kcs[1], bts[1]);
    if ks != [b_n, hkv, t_n, d]
        || vs != [b_n, hkv, t_n, dv]
        || kcs != [blocks, bs, hkv, d]
        || vcs != [blocks, bs, hkv, dv]
        || bts[0] != b_n
        || pls != [b_n]
        || hkv == 0
        || hq % hkv != 0
        || bs == 0
    {
        return Err(format!("shapes do not fit: q {qs:?}, k {ks:?}, v {vs:?}, k_cache {kcs:?}, v_cache {vcs:?}, block_table {bts:?}, past_lens {pls:?}"));
    }
    let table = args[5].to_i64_vec();
    let past = args[6].to_i64_vec();
    let (mut kc, mut vc) = (f(3).to_vec(), f(4).to_vec());
    // The slot (block * bs + offset) of every position of every sequence, checked once.
    let mut slots: Vec<Vec<usize>> = Vec::with_capacity(b_n);
    for b in 0..b_n {
        let p0 = usize::try_from(past[b]).map_err(|_| format!("past_lens[{b}] = {} is negative", past[b]))?;
        let n = p0 + t_n;
        if n > m * bs {
            return Err(format!("sequence {b}: {n} positions do not fit its {m} blocks of {bs} tokens in block_table"));
        }
        let mut s = Vec::with_capacity(n);
        for p in 0..n {
            let blk = table[b * m + p / bs];
            if blk < 0 || blk as usize >= blocks {
                return Err(format!("block_table[{b}, {}] = {blk} is outside the pool of {blocks} blocks", p / bs));
            }
            s.push(blk as usize * bs + p % bs);
        }
        // Append the new tokens.
        for t in 0..t_n {
            let sl = s[p0 + t];
            for h in 0..hkv {
                let src = ((b * hkv + h) * t_n + t) * d;
                kc[(sl * hkv + h) * d..][..d].copy_from_slice(&k[src..src + d]);
                let src = ((b * hkv + h) * t_n + t) * dv;
                vc[(sl * hkv + h) * dv..][..dv].copy_from_slice(&v[src..src + dv]);
            }
        }
        slots.push(s);
    }
    let chunk = if split_tokens == 0 { usize::MAX } else { split_tokens.div_ceil(bs) * bs };
    let rep = hq / hkv;
    let mut y = vec![0f32; b_n * hq * t_n * dv];
    let mut part = Partial::new(dv);
    let mut acc = Partial::new(dv);
    let mut scores: Vec<f32> = vec![];
    for b in 0..b_n {
        let p0 = slots[b].len() - t_n;
        for h in 0..hq {
            let hk = h / rep;
            for t in 0..t_n {
                let qi = &q[((b * hq + h) * t_n + t) * d..][..d];
                let ctx = &slots[b][..p0 + t + 1];
                acc.clear();
                for c in ctx.chunks(chunk.min(ctx.len()).max(1)) {
                    part.clear();
                    scores.clear();
                    scores.extend(c.iter().map(|&s| dot(qi, &kc[(s * hkv + hk) * d..][..d]) * scale));
                    part.max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    for (&s, &x) in c.iter().zip(&scores) {
                        let w = (x - part.max).exp();
                        part.sum += w;
                        for (o, &val) in part.out.iter_mut().zip(&vc[(s * hkv + hk) * dv..][..dv]) {
                            *o += w * val;
                        }
                    }
                    acc.merge(&part);
                }
                let out = &mut y[((b * hq + h) * t_n + t) * dv..][..dv];
                for (o, &a) in out.iter_mut().zip(&acc.out) {
                    *o = a / acc.sum;
                }
            }
        }
    }
    let mk = |shape: &[usize], data: Vec<f32>| Tensor::from_vec(shape.to_vec(), data).map_err(|e| e.to_string());
    Ok(vec![mk(&[b_n, hq, t_n, dv], y)?, mk(kcs, kc)?, mk(vcs, vc)?])
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// A chunk's softmax state: the maximum score, the sum of `exp(score - max)` and the output
/// weighted by those exponentials, not yet divided by the sum.
struct Partial {
    max: f32,
    sum: f32,
    out: Vec<f32>,
}

impl Partial {
    fn new(dv: usize) -> Partial {
        Partial { max: f32::NEG_INFINITY, sum: 0.0, out: vec![0.0; dv] }
    }

    fn clear(&mut self) {
        self.max = f32::NEG_INFINITY;
        self.sum = 0.0;
        self.out.iter_mut().for_each(|o| *o = 0.0);
    }

    /// Folds another chunk in: both rescaled to the larger maximum (the log-sum-exp merge).
    fn merge(&mut self, o: &Partial) {
        let m = self.max.max(o.max);
        if m == f32::NEG_INFINITY {
            return;
        }
        let (a, b) = ((self.max - m).exp(), (o.max - m).exp());
        self.sum = self.sum * a + o.sum * b;
        for (x, &y) in self.out.iter_mut().zip(&o.out) {
            *x = *x * a + y * b;
        }
        self.max = m;
    }
}
