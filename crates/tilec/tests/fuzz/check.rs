//! The differential check: a graph compiled for the CPU against the reference interpreter on
//! the same inputs. Both must give the same outputs (same dtype and shape, values within the
//! dtype's tolerance) or both must fail; a panic on either side is a finding.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tilec::compiled::{compile, CompileOptions, Compiled};
use tilec_ir::{DType, Graph, Tensor};

use super::gen::{inputs, Build, Case};

/// How cases are run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Input sets per compiled graph.
    pub runs: usize,
    /// Share of runs with an out-of-range index in every index input (both sides must then
    /// fail).
    pub oob_rate: f64,
}

impl Default for Options {
    fn default() -> Self {
        Options { runs: 20, oob_rate: 0.1 }
    }
}

/// Counters over the cases run.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub cases: usize,
    /// Cases whose graph compiled (the others were rejected by both sides).
    pub compiled: usize,
    pub nodes: usize,
    /// Runs of a compiled graph (each on fresh inputs).
    pub executions: usize,
    /// Runs where both sides failed (out-of-range indices, mostly).
    pub both_failed: usize,
    /// Nodes the compiled path ran on the interpreter.
    pub fallbacks: usize,
}

/// A disagreement: what differed, on which graph and inputs.
#[derive(Clone, Debug)]
pub struct Finding {
    pub seed: u64,
    pub build: Build,
    pub what: String,
    pub graph: Graph,
    pub inputs: Vec<Tensor>,
}

/// `(rtol, atol)` for outputs of `dt`; `atol` is scaled by the output's largest magnitude.
pub fn tolerance(dt: DType) -> (f64, f64) {
    match dt {
        DType::F32 => (1e-4, 1e-4),
        DType::F16 => (1e-2, 4e-3),
        DType::BF16 => (4e-2, 3e-2),
        _ => (0.0, 0.0),
    }
}

fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "(no message)".into())
}

/// Compares outputs; `None` when they agree.
pub fn compare_outputs(want: &[Tensor], got: &[Tensor]) -> Option<String> {
    if want.len() != got.len() {
        return Some(format!("{} outputs expected, {} returned", want.len(), got.len()));
    }
    for (k, (w, g)) in want.iter().zip(got).enumerate() {
        let (rtol, atol) = tolerance(w.dtype());
        let scale = w.to_f64_vec().iter().filter(|x| x.is_finite()).fold(1.0f64, |m, x| m.max(x.abs()));
        match tilec::compare::compare(w, g, rtol, atol * scale) {
            Err(e) => return Some(format!("output {k}: {e}")),
            Ok(c) if !c.ok() => {
                let (i, x, y) = c.first_mismatch.unwrap_or_default();
                return Some(format!(
                    "output {k} ({}{:?}): {} of {} elements differ; first at flat index {i}: expected {x}, got {y}",
                    w.dtype(),
                    w.shape(),
                    c.mismatches,
                    c.count
                ));
            }
            Ok(_) => {}
        }
    }
    None
}

fn compile_caught(g: &Graph, b: Build) -> Result<Compiled, String> {
    let co = CompileOptions { opt_level: b.opt_level, threads: b.threads, ..CompileOptions::default() };
    match catch_unwind(AssertUnwindSafe(|| compile(g, &co))) {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(format!("compile failed: {e}")),
        Err(p) => Err(format!("compile panicked: {}", panic_text(p))),
    }
}

/// One run on both sides: both return the same outputs, or both fail.
fn run_once(c: &mut Compiled, g: &Graph, ins: &[Tensor], st: &mut Stats) -> Result<(), String> {
    let want = catch_unwind(AssertUnwindSafe(|| tilec_ref::run(g, ins.to_vec())))
        .map_err(|p| format!("the interpreter panicked: {}", panic_text(p)))?;
    c.poison().map_err(|e| format!("poisoning the arena: {e}"))?;
    let got = catch_unwind(AssertUnwindSafe(|| c.run(ins))).map_err(|p| format!("the compiled run panicked: {}", panic_text(p)))?;
    st.executions += 1;
    match (want, got) {
        (Ok(w), Ok(o)) => compare_outputs(&w, &o).map_or(Ok(()), Err),
        (Err(_), Err(_)) => {
            st.both_failed += 1;
            Ok(())
        }
        (Err(e), Ok(_)) => Err(format!("the interpreter failed ({e}), the compiled run returned outputs")),
        (Ok(_), Err(e)) => Err(format!("the compiled run failed ({e}), the interpreter returned outputs")),
    }
}

/// Whether `g` compiled (`-O3`, one thread) and run once on `ins` disagrees with the
/// interpreter (`None`: agrees). Out-of-range indices are never excused here: regression graphs
/// state what they expect.
pub fn differ(g: &Graph, ins: &[Tensor]) -> Option<String> {
    differ_with(g, ins, Build::default())
}

/// [`differ`] compiled as `b` says.
pub fn differ_with(g: &Graph, ins: &[Tensor], b: Build) -> Option<String> {
    let mut c = match compile_caught(g, b) {
        Ok(c) => c,
        Err(e) => {
            return match tilec_ref::run(g, ins.to_vec()) {
                Ok(_) => Some(e),
                Err(_) => None,
            }
        }
    };
    run_once(&mut c, g, ins, &mut Stats::default()).err()
}

/// Compiles `case` once and runs it on `opts.runs` fresh input sets.
pub fn check_case(case: &Case, opts: &Options, st: &mut Stats) -> Result<(), Finding> {
    let g = &case.graph;
    st.cases += 1;
    st.nodes += g.nodes().len();
    let mut rng = StdRng::seed_from_u64(case.seed ^ 0x9e37_79b9_7f4a_7c15);
    let finding =
        |what: String, ins: Vec<Tensor>| Finding { seed: case.seed, build: case.build, what, graph: g.clone(), inputs: ins };
    let mut c = match compile_caught(g, case.build) {
        Ok(c) => c,
        Err(e) => {
            // Fine only when the interpreter rejects the graph too.
            let (ins, _) = inputs(case, &mut rng, false);
            return match tilec_ref::run(g, ins.clone()) {
                Err(_) => Ok(()),
                Ok(_) => Err(finding(e, ins)),
            };
        }
    };
    st.compiled += 1;
    st.fallbacks += c.report.fallbacks.len();
    for _ in 0..opts.runs {
        let oob = rng.gen_bool(opts.oob_rate);
        let (ins, _) = inputs(case, &mut rng, oob);
        if let Err(e) = run_once(&mut c, g, &ins, st) {
            return Err(finding(e, ins));
        }
    }
    Ok(())
}

/// Shrinks a finding to the smallest prefix of the graph that still disagrees: the first
/// node output that, as the only graph output, reproduces a difference on the same inputs.
pub fn minimize(f: &Finding) -> Finding {
    for n in f.graph.nodes() {
        for &v in &n.outputs {
            let mut g = f.graph.clone();
            g.set_outputs(vec![v]);
            if g.cleanup().is_err() {
                continue;
            }
            if let Some(what) = differ_with(&g, &f.inputs, f.build) {
                return Finding { what, graph: g, ..f.clone() };
            }
        }
    }
    f.clone()
}

/// Describes a finding: seed, difference, graph text and inputs.
pub fn describe(f: &Finding) -> String {
    let mut s = format!(
        "seed {} (-O{}, {} threads): {}\n{}",
        f.seed,
        f.build.opt_level,
        f.build.threads,
        f.what,
        tilec_ir::print_graph(&f.graph)
    );
    for (k, (&v, t)) in f.graph.inputs().iter().zip(&f.inputs).enumerate() {
        s += &format!("input {k} '{}' {}{:?} = {:?}\n", f.graph.value(v).name, t.dtype(), t.shape(), t.to_f64_vec());
    }
    s
}

/// Writes a finding under `dir/seed-<seed>/`: `finding.txt` (see [`describe`]) and the inputs
/// as `input_<k>.npy`.
pub fn save(dir: &Path, f: &Finding) -> std::io::Result<std::path::PathBuf> {
    let d = dir.join(format!("seed-{}", f.seed));
    std::fs::create_dir_all(&d)?;
    std::fs::write(d.join("finding.txt"), describe(f))?;
    for (k, t) in f.inputs.iter().enumerate() {
        if let Err(e) = tilec::tensor_io::write_npy(&d.join(format!("input_{k}.npy")), t) {
            std::fs::write(d.join(format!("input_{k}.error")), e.to_string())?;
        }
    }
    Ok(d)
}
