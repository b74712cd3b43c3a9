//! The long-running differential fuzzer of the compiled CPU path:
//!
//! ```text
//! cargo run --release -p tilec --example fuzz_compiled -- --cases 1000 --seed 0 --runs 500 --out fuzz-findings
//! ```
//!
//! Case `i` is the graph of seed `S + i`, compiled once and run on `--runs` fresh input sets
//! against the reference interpreter. Each disagreement is minimized, printed with its seed
//! and written under `--out`; a progress line names the case before it runs, so that a
//! crash still leaves its seed. A run with an out-of-range index must fail on both sides.

#[path = "../tests/fuzz/mod.rs"]
mod fuzz;

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use fuzz::check::{check_case, describe, minimize, save, Options, Stats};
use fuzz::gen::generate;

fn main() {
    let mut cases = 100u64;
    let mut seed = 0u64;
    let mut out = PathBuf::from("fuzz-findings");
    let mut opts = Options::default();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = |what: &str| args.next().unwrap_or_else(|| usage(&format!("{what} needs a value")));
        let num = |s: String| s.parse::<u64>().unwrap_or_else(|_| usage(&format!("not a number: {s}")));
        match a.as_str() {
            "--cases" => cases = num(val("--cases")),
            "--seed" => seed = num(val("--seed")),
            "--runs" => opts.runs = num(val("--runs")) as usize,
            "--out" => out = PathBuf::from(val("--out")),
            _ => usage(&format!("unknown argument {a}")),
        }
    }
    let t0 = Instant::now();
    let mut st = Stats::default();
    let mut findings = 0;
    for s in seed..seed + cases {
        eprint!("\rcase {s} ");
        let _ = std::io::stderr().flush();
        if let Err(f) = check_case(&generate(s), &opts, &mut st) {
            findings += 1;
            let m = minimize(&f);
            let at = save(&out, &m).map(|d| d.display().to_string()).unwrap_or_else(|e| format!("(not written: {e})"));
            println!("\nFINDING {}\n(written to {at})", describe(&m));
        }
        if (s - seed + 1) % 100 == 0 {
            eprintln!("\r{} graphs, {} executions, {findings} findings, {:.0} s", st.cases, st.executions, t0.elapsed().as_secs_f64());
        }
    }
    println!(
        "\n{} graphs ({} nodes, {} run on the interpreter), {} executions ({} failed on both sides), {findings} findings in {:.0} s",
        st.cases,
        st.nodes,
        st.fallbacks,
        st.executions,
        st.both_failed,
        t0.elapsed().as_secs_f64()
    );
    if findings > 0 {
        std::process::exit(1);
    }
}

fn usage(msg: &str) -> ! {
    eprintln!("{msg}\nusage: fuzz_compiled [--cases N] [--seed S] [--runs R] [--out DIR]");
    std::process::exit(2)
}
