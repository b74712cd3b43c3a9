//! The differential fuzzer on a fixed set of seeds: random small graphs compiled for the CPU
//! must agree with the reference interpreter on fresh random inputs. For long runs use
//! `cargo run --release -p tilec --example fuzz_compiled -- --cases N --seed S`.

mod fuzz;

use fuzz::check::{check_case, describe, minimize, Options, Stats};
use fuzz::gen::generate;

#[test]
fn random_graphs_agree_with_the_interpreter() {
    let opts = Options::default();
    let mut st = Stats::default();
    let mut failures = vec![];
    for seed in 0..40 {
        if let Err(f) = check_case(&generate(seed), &opts, &mut st) {
            failures.push(describe(&minimize(&f)));
        }
    }
    println!(
        "fuzz: {} graphs ({} nodes, {} run on the interpreter), {} executions, {} failed on both sides",
        st.cases, st.nodes, st.fallbacks, st.executions, st.both_failed
    );
    assert!(failures.is_empty(), "{} of {} graphs disagree:\n{}", failures.len(), st.cases, failures.join("\n"));
    // Not vacuous: nearly every graph compiles and runs (a few read a constant index out of
    // range, which both sides may reject).
    assert!(st.compiled * 10 >= st.cases * 9, "only {} of {} graphs compiled", st.compiled, st.cases);
    assert_eq!(st.executions, st.compiled * opts.runs);
}
