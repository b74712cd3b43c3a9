//! The search over a family's parameters for one problem.
//!
//! [`candidates`] takes every point of the family's [`space`](tilec_tile::family::Family::space)
//! and prunes those its [`check`](tilec_tile::family::Family::check) refuses *before anything is
//! built*; the rest are ordered by the family's analytic [`estimate`](tilec_tile::family::Family::estimate)
//! where it has one, else by closeness to the heuristic, with the heuristic itself first (its
//! time is the default every speedup is measured against). [`search`] hands them to a
//! [`Measurer`] (which builds, compiles and times them on the device; a candidate that fails to
//! build, compile, run or match the heuristic's results is scored as failed, never fatal) in
//! batches, up to a number of candidates and a time budget, and reports the best, the default,
//! and how well the model's order agreed with the measured one (Spearman's rank correlation).

use std::time::{Duration, Instant};

use tilec_tile::family::{FamilyRef, Params, Problem};

/// A point to measure.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    pub params: Params,
    /// The family's estimate, seconds (ordering only).
    pub estimate: Option<f64>,
    /// The family's heuristic choice (measured first: the default).
    pub heuristic: bool,
}

/// The candidates of a problem, best-first.
#[derive(Clone, Debug, Default)]
pub struct Candidates {
    pub list: Vec<Candidate>,
    /// Points in the family's space.
    pub space: usize,
    /// Points its constraints refused, with why (never built).
    pub pruned: Vec<(Params, String)>,
    /// Whether the order comes from the family's cost model (else closeness to the heuristic).
    pub modeled: bool,
}

/// Number of parameters in which two points differ.
fn distance(a: &Params, b: &Params) -> usize {
    a.0.iter().filter(|(n, v)| b.get(n) != Some(*v)).count()
}

/// The candidates of `p` for family `f` on target `t` (see the module documentation). A family
/// without parameters gives none.
pub fn candidates<T: ?Sized, B>(f: FamilyRef<T, B>, p: &Problem, t: &T) -> Candidates {
    let space = f.space(p, t);
    if space.axes.is_empty() {
        return Candidates::default();
    }
    let heuristic = f.heuristic(p, t);
    let points = space.points();
    let mut out = Candidates { space: points.len(), ..Default::default() };
    let mut kept = vec![];
    for q in points {
        if q == heuristic {
            continue;
        }
        match f.check(p, t, &q) {
            Ok(()) => kept.push(q),
            Err(why) => out.pruned.push((q, why)),
        }
    }
    let mut list: Vec<Candidate> = kept
        .into_iter()
        .map(|q| Candidate { estimate: f.estimate(p, t, &q), params: q, heuristic: false })
        .collect();
    out.modeled = list.iter().any(|c| c.estimate.is_some());
    let h = &heuristic;
    list.sort_by(|a, b| {
        let by_model = match (a.estimate, b.estimate) {
            (Some(x), Some(y)) => x.total_cmp(&y),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => std::cmp::Ordering::Equal,
        };
        by_model.then(distance(&a.params, h).cmp(&distance(&b.params, h)))
    });
    if f.check(p, t, &heuristic).is_ok() {
        let est = f.estimate(p, t, &heuristic);
        list.insert(0, Candidate { params: heuristic, estimate: est, heuristic: true });
    }
    out.list = list;
    out
}

/// What measuring one candidate gave.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// The median of `runs` timed runs (after warm-up), nanoseconds.
    Time { median_ns: f64, runs: usize },
    /// It did not build, compile, run, or compute what the heuristic computes.
    Failed(String),
}

impl Outcome {
    pub fn ns(&self) -> Option<f64> {
        match self {
            Outcome::Time { median_ns, .. } => Some(*median_ns),
            Outcome::Failed(_) => None,
        }
    }
}

/// Builds and times candidates on a device. The first batch holds the heuristic alone when it
/// is a candidate: a measurer may keep its results as the reference the others must match.
pub trait Measurer {
    /// One outcome per point, in order.
    fn measure(&mut self, batch: &[Params]) -> Vec<Outcome>;
}

/// Limits of a search.
#[derive(Clone, Debug)]
pub struct SearchOptions {
    /// Candidates measured at most (the heuristic included).
    pub max_candidates: usize,
    /// Wall-clock budget: a batch starts with only as many candidates as the time left covers
    /// at the last batch's cost per candidate; confirmation only while time is left.
    pub budget: Duration,
    /// Candidates handed to the measurer at once (compiled together).
    pub batch: usize,
    /// Rounds in which the best and the heuristic are measured again, alternately, at the
    /// end (0: none). On a busy machine one measurement can be far off; the final default
    /// and tuned times are the medians over the rounds, and the heuristic stays unless the
    /// best still beats it.
    pub confirm_rounds: usize,
}

impl Default for SearchOptions {
    fn default() -> Self {
        SearchOptions { max_candidates: 24, budget: Duration::from_secs(30), batch: 4, confirm_rounds: 3 }
    }
}

/// One measured candidate.
#[derive(Clone, Debug, PartialEq)]
pub struct Measured {
    pub candidate: Candidate,
    pub outcome: Outcome,
}

/// What a search found.
#[derive(Clone, Debug, Default)]
pub struct SearchResult {
    pub space: usize,
    pub pruned: usize,
    /// Candidates after pruning.
    pub considered: usize,
    pub measured: Vec<Measured>,
    /// The heuristic's median, nanoseconds (when it was measured and ran).
    pub default_ns: Option<f64>,
    /// The fastest candidate and its median.
    pub best: Option<(Params, f64)>,
    /// Spearman's correlation between the model's estimates and the measured times, over the
    /// candidates that ran (at least three, with estimates).
    pub rank_corr: Option<f64>,
    /// The budget ran out before `max_candidates` were measured.
    pub out_of_time: bool,
    /// The best and the heuristic were measured again alternately (`confirm_rounds`).
    pub confirmed: bool,
    pub elapsed: Duration,
}

impl SearchResult {
    pub fn failed(&self) -> usize {
        self.measured.iter().filter(|m| m.outcome.ns().is_none()).count()
    }
}

/// Measures the best-first candidates in batches within the limits (see the module
/// documentation); `progress` is told how many were measured so far.
pub fn search(c: &Candidates, m: &mut dyn Measurer, o: &SearchOptions, progress: &mut dyn FnMut(usize)) -> SearchResult {
    let start = Instant::now();
    let mut r = SearchResult { space: c.space, pruned: c.pruned.len(), considered: c.list.len(), ..Default::default() };
    let todo: Vec<&Candidate> = c.list.iter().take(o.max_candidates.max(1)).collect();
    let mut i = 0;
    // What one candidate of the last batch cost (building, compiling and timing it): a batch
    // starts only with as many candidates as the budget still covers, so that the budget
    // holds to within one candidate rather than one batch.
    let mut per_candidate: Option<Duration> = None;
    while i < todo.len() {
        let left = o.budget.saturating_sub(start.elapsed());
        // The heuristic alone first: its results are the reference.
        let mut n = if i == 0 && todo[0].heuristic { 1 } else { o.batch.max(1) };
        if i > 0 {
            let fits = match per_candidate {
                Some(c) if !c.is_zero() => (left.as_secs_f64() / c.as_secs_f64()) as usize,
                _ => usize::from(!left.is_zero()) * n,
            };
            n = n.min(fits);
            if n == 0 {
                r.out_of_time = true;
                break;
            }
        }
        let batch: Vec<&Candidate> = todo[i..(i + n).min(todo.len())].to_vec();
        let params: Vec<Params> = batch.iter().map(|c| c.params.clone()).collect();
        let began = Instant::now();
        let mut outs = m.measure(&params);
        per_candidate = Some(began.elapsed() / params.len().max(1) as u32);
        outs.resize(batch.len(), Outcome::Failed("the measurer gave no result".into()));
        for (cand, out) in batch.into_iter().zip(outs) {
            r.measured.push(Measured { candidate: cand.clone(), outcome: out });
        }
        i += n;
        progress(i.min(todo.len()));
    }
    let heuristic = r.measured.iter().find(|x| x.candidate.heuristic).cloned();
    r.default_ns = heuristic.as_ref().and_then(|x| x.outcome.ns());
    r.best = r
        .measured
        .iter()
        .filter_map(|x| x.outcome.ns().map(|t| (x.candidate.params.clone(), t)))
        .min_by(|a, b| a.1.total_cmp(&b.1));
    if let (Some(h), Some(def), Some((best, bt))) = (&heuristic, r.default_ns, r.best.clone()) {
        // Confirmed while the budget lasts (the two are compiled already).
        if best != h.candidate.params && o.confirm_rounds > 0 && start.elapsed() < o.budget {
            let (mut hs, mut bs) = (vec![def], vec![bt]);
            for round in 0..o.confirm_rounds {
                let pair = if round % 2 == 0 {
                    [h.candidate.params.clone(), best.clone()]
                } else {
                    [best.clone(), h.candidate.params.clone()]
                };
                let outs = m.measure(&pair);
                let (ho, bo) = if round % 2 == 0 { (outs.first(), outs.get(1)) } else { (outs.get(1), outs.first()) };
                hs.extend(ho.and_then(Outcome::ns));
                bs.extend(bo.and_then(Outcome::ns));
            }
            let median = |v: &mut Vec<f64>| {
                v.sort_by(f64::total_cmp);
                v[v.len() / 2]
            };
            let (def, bt) = (median(&mut hs), median(&mut bs));
            r.default_ns = Some(def);
            r.best = if bt < def { Some((best, bt)) } else { Some((h.candidate.params.clone(), def)) };
            r.confirmed = true;
        }
    }
    let pairs: Vec<(f64, f64)> =
        r.measured.iter().filter_map(|x| Some((x.candidate.estimate?, x.outcome.ns()?))).collect();
    r.rank_corr = spearman(&pairs);
    r.elapsed = start.elapsed();
    r
}

/// Ranks from 1, ties sharing their mean rank.
fn ranks(v: &[f64]) -> Vec<f64> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| v[a].total_cmp(&v[b]));
    let mut out = vec![0.0; v.len()];
    let mut i = 0;
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && v[idx[j + 1]] == v[idx[i]] {
            j += 1;
        }
        let r = (i + j) as f64 / 2.0 + 1.0;
        for &k in &idx[i..=j] {
            out[k] = r;
        }
        i = j + 1;
    }
    out
}

/// Spearman's rank correlation of the pairs (`None` under three pairs or when either side is
/// constant).
pub fn spearman(pairs: &[(f64, f64)]) -> Option<f64> {
    if pairs.len() < 3 {
        return None;
    }
    let a = ranks(&pairs.iter().map(|p| p.0).collect::<Vec<_>>());
    let b = ranks(&pairs.iter().map(|p| p.1).collect::<Vec<_>>());
    let n = a.len() as f64;
    let (ma, mb) = (a.iter().sum::<f64>() / n, b.iter().sum::<f64>() / n);
    let cov: f64 = a.iter().zip(&b).map(|(x, y)| (x - ma) * (y - mb)).sum();
    let va: f64 = a.iter().map(|x| (x - ma).powi(2)).sum();
    let vb: f64 = b.iter().map(|y| (y - mb).powi(2)).sum();
    if va == 0.0 || vb == 0.0 {
        return None;
    }
    Some(cov / (va * vb).sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_correlation() {
        let up: Vec<(f64, f64)> = (0..5).map(|i| (i as f64, 10.0 * i as f64)).collect();
        assert!((spearman(&up).unwrap() - 1.0).abs() < 1e-12);
        let down: Vec<(f64, f64)> = (0..5).map(|i| (i as f64, -(i as f64))).collect();
        assert!((spearman(&down).unwrap() + 1.0).abs() < 1e-12);
        assert_eq!(spearman(&up[..2]), None);
        assert_eq!(spearman(&[(1.0, 1.0), (1.0, 2.0), (1.0, 3.0)]), None);
        assert_eq!(ranks(&[3.0, 1.0, 3.0]), vec![2.5, 1.0, 2.5]);
    }
}
