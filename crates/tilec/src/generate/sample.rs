//! Choosing the next token from a row of logits: greedy (the first maximum) or sampled from
//! the softmax at a temperature, restricted to the `top_k` most likely tokens and to the
//! smallest set whose probability reaches `top_p`, with a seeded generator so that a seed
//! gives the same tokens on every run.

/// How tokens are chosen.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct Sampling {
    /// 0: greedy.
    pub temperature: f32,
    /// 0: no limit.
    pub top_k: usize,
    /// 1: no limit.
    pub top_p: f32,
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0 }
    }
}

impl Sampling {
    /// Checks the parameters; errors name the one out of range.
    pub fn check(&self) -> Result<(), String> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(format!("temperature {} must be a finite number >= 0 (0: greedy)", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top-p {} must be in (0, 1]", self.top_p));
        }
        Ok(())
    }

    pub fn greedy(&self) -> bool {
        self.temperature == 0.0
    }
}

/// SplitMix64: small, fast and good enough to draw tokens; the same seed gives the same
/// stream on every platform.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The index of the first maximum (NaNs never win); 0 for an empty row.
pub fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] || row[best].is_nan() && !x.is_nan() {
            best = i;
        }
    }
    best
}

/// Chooses a token from `row` (one sequence's logits).
pub fn sample(row: &[f32], s: &Sampling, rng: &mut Rng) -> usize {
    if s.greedy() || row.len() <= 1 {
        return argmax(row);
    }
    // Candidates by decreasing logit (ties by index), NaNs dropped.
    let mut idx: Vec<usize> = (0..row.len()).filter(|&i| !row[i].is_nan()).collect();
    if idx.is_empty() {
        return 0;
    }
    idx.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
    if s.top_k > 0 {
        idx.truncate(s.top_k);
    }
    let t = s.temperature as f64;
    let top = row[idx[0]] as f64;
    let mut p: Vec<f64> = idx.iter().map(|&i| ((row[i] as f64 - top) / t).exp()).collect();
    let total: f64 = p.iter().sum();
    p.iter_mut().for_each(|x| *x /= total);
    if s.top_p < 1.0 {
        let mut cum = 0.0;
        let mut keep = p.len();
        for (j, &x) in p.iter().enumerate() {
            cum += x;
            if cum >= s.top_p as f64 {
                keep = j + 1;
                break;
            }
        }
        p.truncate(keep);
        idx.truncate(keep);
    }
    let total: f64 = p.iter().sum();
    let mut u = rng.next_f64() * total;
    for (j, &x) in p.iter().enumerate() {
        if u < x {
            return idx[j];
        }
        u -= x;
    }
    idx[p.len() - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_first_maximum() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, f32::NAN]), 1);
        assert_eq!(argmax(&[f32::NAN, 2.0]), 1);
    }

    #[test]
    fn top_k_one_is_greedy_and_seeds_repeat() {
        let row = [0.5, 2.0, 1.0, -1.0];
        let s = Sampling { temperature: 1.0, top_k: 1, top_p: 1.0, seed: 3 };
        assert_eq!(sample(&row, &s, &mut Rng::new(3)), 1);
        let s = Sampling { temperature: 1.0, top_k: 0, top_p: 1.0, seed: 3 };
        let draw = |seed| (0..64).map(|_| 0).scan(Rng::new(seed), |r, _: i32| Some(sample(&row, &s, r))).collect::<Vec<_>>();
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
        // top-p keeps the smallest set reaching p: here the maximum alone.
        let s = Sampling { temperature: 0.1, top_k: 0, top_p: 0.5, seed: 0 };
        assert!((0..32).all(|i| sample(&row, &s, &mut Rng::new(i)) == 1));
    }
}
