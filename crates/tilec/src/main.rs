//! The `tilec` command-line tool: inspect ONNX models, run them, print their IR, explain
//! how they are optimized and partitioned into kernels.

mod cli;

use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;

/// tilec: an AI compiler for ONNX models.
#[derive(Parser, Debug)]
#[command(name = "tilec", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Summarize a model: producer, opsets, inputs and outputs, op histograms, parameters,
    /// and whether (and why not) it imports.
    ///
    /// Exits 0 whenever the file is a readable ONNX model, even if it does not import;
    /// the report then lists the unsupported op types.
    Inspect {
        /// The ONNX model file.
        model: PathBuf,
    },
    /// Run a model and print a summary of each output.
    ///
    /// Inputs not given with --input (or found in --expect-dir) get random values of the
    /// right dtype and shape: floats uniform in [-1, 1), integers in [0, 4), random bools.
    Run(cli::run::RunArgs),
    /// Run a model and show where its time goes: per kernel the time, share, bytes, FLOPs,
    /// family and parameters, launch shape, registers and spills, what binds it and how close it
    /// runs to the roofline (ceilings measured on this machine: a copy and a GEMM), time by kind
    /// of kernel, and the gap to the roofline. Writes profile.txt, profile.json, trace.json
    /// (Chrome trace, opens in Perfetto) and roofline.svg into --profile-dir (default:
    /// MODEL's name with `.profile`). Takes every option of `run`.
    Profile(cli::run::RunArgs),
    /// Print the graph in tilec's IR text form after import and optimization (-O0 shows
    /// the graph as imported).
    PrintIr(cli::opt::OptArgs),
    /// Optimize a model and show how it is partitioned into kernels: each kernel group
    /// with its ops, bytes, FLOPs and bound on the target, and every rejected fusion with
    /// the cost model's numbers.
    Explain(cli::opt::ExplainArgs),
    /// Measure the best parameters of the model's kernels on this machine and remember them in
    /// the tuning database ($TILEC_TUNING_DB, else ~/.cache/tilec/tuning.sqlite), which `run`
    /// and `explain` then read; --export/--import carry it to other machines.
    Tune(cli::tune::TuneArgs),
    /// Generate text with a decoder-only model over a paged KV cache: a batch of prompts
    /// (token ids, or text with --tokenizer) prefilled together, then one decode step per new
    /// token, greedy or sampled (--temperature, --top-k, --top-p, --seed); prints the new
    /// tokens and the prefill and decode speeds in tokens per second.
    Generate(cli::generate::GenerateArgs),
}

/// The backends `--backend` accepts.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendArg {
    /// Compiled to native code for this CPU (the default).
    Cpu,
    /// The reference interpreter.
    Ref,
}

impl From<BackendArg> for tilec::Backend {
    fn from(b: BackendArg) -> tilec::Backend {
        match b {
            BackendArg::Cpu => tilec::Backend::Cpu,
            BackendArg::Ref => tilec::Backend::Ref,
        }
    }
}

fn main() -> ExitCode {
    // Like other command-line tools, end quietly when the reader of our output goes away
    // (`tilec run ... | head`) instead of failing on the closed pipe.
    // SAFETY: restoring a signal's default disposition before any thread exists.
    #[cfg(unix)]
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // A script that asked for JSON gets its error as JSON too (help and version are
            // not errors).
            if e.use_stderr() && std::env::args_os().any(|a| a == "--json") {
                let msg = e.to_string();
                let first = msg.lines().next().unwrap_or_default().trim_start_matches("error: ");
                println!("{}", serde_json::json!({ "ok": false, "error": first }));
            }
            e.exit()
        }
    };
    let result = match cli.cmd {
        Cmd::Inspect { model } => cli::inspect::inspect(&model),
        Cmd::Run(args) => cli::run::run(&args),
        Cmd::Profile(args) => cli::run::profile_cmd(args),
        Cmd::PrintIr(args) => cli::opt::print_ir(&args),
        Cmd::Explain(args) => cli::opt::explain(&args),
        Cmd::Tune(args) => cli::tune::tune(&args),
        Cmd::Generate(args) => cli::generate::generate(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", cli::render_error(&e));
            ExitCode::FAILURE
        }
    }
}
