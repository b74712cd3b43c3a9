//! The search: pruning happens before any build (a family whose build panics on a point its
//! constraints refuse is never built with one), the cost model orders the candidates, failures
//! are scored, the budget and candidate limits hold.

use std::sync::Mutex;
use std::time::Duration;

use tilec_ir::op::LinalgOp;
use tilec_ir::{DType, Graph, Op, TensorType};
use tilec_tile::family::{Family, ParamSpace, Params, Problem};
use tilec_tune::search::{candidates, search, Measurer, Outcome, SearchOptions};

/// A family of `a` in 1..=8 and `b` in 1..=4, valid when `a * b <= 8`; its time is `|a - 6| +
/// |b - 1|` (best at a=6, b=1), its model says `|a - 5| + |b - 1|`, and `a == 7` fails to run.
struct Toy {
    builds: Mutex<Vec<Params>>,
}

impl Family for Toy {
    type Target = ();
    type Built = Params;
    fn name(&self) -> &'static str {
        "toy"
    }
    fn applies(&self, _p: &Problem, _t: &()) -> Result<(), String> {
        Ok(())
    }
    fn space(&self, _p: &Problem, _t: &()) -> ParamSpace {
        ParamSpace { axes: vec![("a", (1..=8).collect()), ("b", (1..=4).collect())] }
    }
    fn check(&self, p: &Problem, t: &(), q: &Params) -> Result<(), String> {
        self.space(p, t).contains(q)?;
        let (a, b) = (q.get("a").unwrap(), q.get("b").unwrap());
        if a * b > 8 {
            return Err(format!("a*b = {} > 8", a * b));
        }
        Ok(())
    }
    fn heuristic(&self, _p: &Problem, _t: &()) -> Params {
        Params::new(&[("a", 2), ("b", 2)])
    }
    fn estimate(&self, _p: &Problem, _t: &(), q: &Params) -> Option<f64> {
        Some(((q.get("a")? - 5).abs() + (q.get("b")? - 1).abs()) as f64)
    }
    fn build(&self, p: &Problem, t: &(), q: &Params) -> Result<Params, String> {
        assert!(self.check(p, t, q).is_ok(), "built a point its constraints refuse: {q}");
        self.builds.lock().unwrap().push(q.clone());
        Ok(q.clone())
    }
}

struct ToyMeasurer<'a> {
    f: &'a Toy,
    p: &'a Problem<'a>,
    batches: Vec<usize>,
}

impl Measurer for ToyMeasurer<'_> {
    fn measure(&mut self, batch: &[Params]) -> Vec<Outcome> {
        self.batches.push(batch.len());
        batch
            .iter()
            .map(|q| match self.f.build(self.p, &(), q) {
                Err(e) => Outcome::Failed(e),
                Ok(q) if q.get("a") == Some(7) => Outcome::Failed("crashed".into()),
                Ok(q) => {
                    let t = ((q.get("a").unwrap() - 6).abs() + (q.get("b").unwrap() - 1).abs()) as f64;
                    Outcome::Time { median_ns: 100.0 + t, runs: 5 }
                }
            })
            .collect()
    }
}

fn graph() -> Graph {
    let mut g = Graph::new("t");
    let a = g.add_input("a", TensorType::fixed(DType::F32, &[4, 4]));
    let c = g.add(Op::Linalg(LinalgOp::MatMul), &[a, a]).unwrap();
    g.set_outputs(vec![c]);
    g
}

#[test]
fn pruned_points_are_never_built() {
    let g = graph();
    let p = Problem::of_node(&g, g.node_ids().next().unwrap(), "k0");
    let toy = Toy { builds: Mutex::new(vec![]) };
    let f: &'static Toy = Box::leak(Box::new(toy));
    let c = candidates(f, &p, &());
    assert_eq!(c.space, 32);
    // Valid: a*b <= 8 → 8 + 4 + 2 + 2 = 16 points; 16 pruned.
    assert_eq!(c.pruned.len(), 16);
    assert_eq!(c.list.len(), 16);
    assert!(f.builds.lock().unwrap().is_empty(), "candidates() builds nothing");
    assert!(c.list[0].heuristic && c.list[0].params == Params::new(&[("a", 2), ("b", 2)]));
    assert!(c.modeled);
    // Best-first by the model after the heuristic.
    assert_eq!(c.list[1].params, Params::new(&[("a", 5), ("b", 1)]));
    let ests: Vec<f64> = c.list[1..].iter().map(|x| x.estimate.unwrap()).collect();
    assert!(ests.windows(2).all(|w| w[0] <= w[1]), "{ests:?}");

    let mut m = ToyMeasurer { f, p: &p, batches: vec![] };
    let mut seen = 0;
    let o = SearchOptions { max_candidates: 100, budget: Duration::from_secs(60), batch: 4, confirm_rounds: 0 };
    let r = search(&c, &mut m, &o, &mut |n| seen = n);
    assert_eq!(seen, 16);
    assert_eq!(m.batches[0], 1, "the heuristic alone first");
    // Every point built was valid, each once, and exactly the unpruned ones.
    let builds = f.builds.lock().unwrap();
    assert_eq!(builds.len(), 16);
    for q in builds.iter() {
        assert!(f.check(&p, &(), q).is_ok(), "{q}");
    }
    assert_eq!(r.default_ns, Some(100.0 + 4.0 + 1.0));
    assert_eq!(r.best, Some((Params::new(&[("a", 6), ("b", 1)]), 100.0)));
    assert_eq!(r.failed(), 1, "a=7 b=1 failed and was scored as such");
    assert!(r.rank_corr.unwrap() > 0.5, "{:?}", r.rank_corr);
    assert!(!r.out_of_time);
}

#[test]
fn limits_hold() {
    let g = graph();
    let p = Problem::of_node(&g, g.node_ids().next().unwrap(), "k0");
    let f: &'static Toy = Box::leak(Box::new(Toy { builds: Mutex::new(vec![]) }));
    let c = candidates(f, &p, &());
    let mut m = ToyMeasurer { f, p: &p, batches: vec![] };
    let r = search(&c, &mut m, &SearchOptions { max_candidates: 6, budget: Duration::from_secs(60), batch: 2, confirm_rounds: 0 }, &mut |_| {});
    assert_eq!(r.measured.len(), 6);
    assert_eq!(m.batches, vec![1, 2, 2, 1]);
    // A zero budget still measures the default (the first batch), then stops.
    let mut m = ToyMeasurer { f, p: &p, batches: vec![] };
    let r = search(&c, &mut m, &SearchOptions { max_candidates: 100, budget: Duration::ZERO, batch: 4, confirm_rounds: 0 }, &mut |_| {});
    assert_eq!(r.measured.len(), 1);
    assert!(r.out_of_time && r.default_ns.is_some());
}

/// Times that change between measurements: the heuristic measured slow once (a busy machine)
/// must not make a worse candidate win.
struct Noisy {
    calls: usize,
}

impl Measurer for Noisy {
    fn measure(&mut self, batch: &[Params]) -> Vec<Outcome> {
        batch
            .iter()
            .map(|q| {
                self.calls += 1;
                // The heuristic (a=2, b=2) takes 100, everything else 110; the first
                // measurement of the heuristic is 1000.
                let t = if q.get("a") == Some(2) && q.get("b") == Some(2) {
                    if self.calls == 1 { 1000.0 } else { 100.0 }
                } else {
                    110.0
                };
                Outcome::Time { median_ns: t, runs: 5 }
            })
            .collect()
    }
}

#[test]
fn confirmation_rounds_undo_a_noisy_default() {
    let g = graph();
    let p = Problem::of_node(&g, g.node_ids().next().unwrap(), "k0");
    let f: &'static Toy = Box::leak(Box::new(Toy { builds: Mutex::new(vec![]) }));
    let c = candidates(f, &p, &());
    let o = SearchOptions { max_candidates: 5, budget: Duration::from_secs(60), batch: 4, confirm_rounds: 3 };
    let r = search(&c, &mut Noisy { calls: 0 }, &o, &mut |_| {});
    assert!(r.confirmed);
    assert_eq!(r.default_ns, Some(100.0));
    assert_eq!(r.best, Some((Params::new(&[("a", 2), ("b", 2)]), 100.0)), "the heuristic stays");
}

/// A measurer whose every candidate takes a fixed time.
struct Slow {
    each: Duration,
    batches: Vec<usize>,
}

impl Measurer for Slow {
    fn measure(&mut self, batch: &[Params]) -> Vec<Outcome> {
        self.batches.push(batch.len());
        std::thread::sleep(self.each * batch.len() as u32);
        batch.iter().map(|q| Outcome::Time { median_ns: 100.0 + q.get("a").unwrap_or(0) as f64, runs: 5 }).collect()
    }
}

/// The budget holds to within one candidate: batches shrink to what the time left covers
/// instead of a whole batch running past it.
#[test]
fn batches_shrink_to_the_budget_left() {
    let g = graph();
    let p = Problem::of_node(&g, g.node_ids().next().unwrap(), "k0");
    let f: &'static Toy = Box::leak(Box::new(Toy { builds: Mutex::new(vec![]) }));
    let c = candidates(f, &p, &());
    let each = Duration::from_millis(100);
    let mut m = Slow { each, batches: vec![] };
    let o = SearchOptions { max_candidates: 100, budget: Duration::from_millis(650), batch: 4, confirm_rounds: 0 };
    let t = std::time::Instant::now();
    let r = search(&c, &mut m, &o, &mut |_| {});
    let took = t.elapsed();
    // 100 ms for the heuristic, 400 for a batch of 4, then about 150 ms left: one more
    // candidate, not four (which would end 250 ms past the budget).
    assert_eq!(m.batches[..2], [1, 4], "{:?}", m.batches);
    assert!(r.out_of_time && took < o.budget + each + Duration::from_millis(100), "{took:?} {:?}", m.batches);
}
