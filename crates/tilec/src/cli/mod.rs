//! Subcommands of the `tilec` tool and the helpers they share.

pub mod ceilings;
pub mod generate;
pub mod inspect;
pub mod opt;
pub mod run;
pub mod tune;

use anyhow::{bail, Context, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tilec::onnx::proto::{self, ModelProto};
use tilec::{ImportError, ImportOptions, Tensor};

/// The most threads `--threads` accepts: far more than any machine's cores, far fewer than
/// what would exhaust memory with the thread pool's stacks.
pub const MAX_THREADS: usize = 4096;

/// The most timed runs `--bench` accepts.
pub const MAX_BENCH_RUNS: usize = 1_000_000;

/// Parses `NAME=VALUE` for `--dim`. A value must fit an ONNX dimension (a signed 64-bit
/// integer).
pub fn parse_dim(s: &str) -> Result<(String, usize), String> {
    let (name, v) = s.split_once('=').ok_or_else(|| format!("expected NAME=VALUE, got '{s}'"))?;
    if name.is_empty() {
        return Err(format!("expected NAME=VALUE, got '{s}' (empty name)"));
    }
    let v: usize = v.trim().parse().map_err(|_| format!("'{v}' is not a non-negative integer (in '{s}')"))?;
    if i64::try_from(v).is_err() {
        return Err(format!("{v} is larger than an ONNX dimension can be (at most {}; in '{s}')", i64::MAX));
    }
    Ok((name.to_string(), v))
}

/// Parses `--family OP=NAME`: the op (or kernel name, or `*`) and the family forced for it.
pub fn parse_family(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((op, fam)) if !op.trim().is_empty() && !fam.trim().is_empty() => {
            Ok((op.trim().to_string(), fam.trim().to_string()))
        }
        _ => Err(format!("expected OP=FAMILY, got '{s}' (e.g. conv=cpu.direct)")),
    }
}

/// Parses `--rtol` and `--atol`: a finite, non-negative number (a NaN tolerance would fail
/// every comparison, a negative one even equal values).
pub fn parse_tolerance(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|_| format!("'{s}' is not a number"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!("{v} is not a tolerance: it must be finite and at least 0"));
    }
    Ok(v)
}

/// Makes sure `--out DIR` can take the outputs before anything is compiled or run: creates
/// it if missing and checks that a file can be written in it.
pub fn prepare_out_dir(dir: &Path) -> Result<()> {
    if dir.exists() && !dir.is_dir() {
        bail!("--out {}: exists and is not a directory", dir.display());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("--out {}: cannot create the directory", dir.display()))?;
    let probe = dir.join(format!(".tilec-write-check-{}", std::process::id()));
    std::fs::File::create(&probe)
        .with_context(|| format!("--out {}: cannot write in the directory", dir.display()))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// An error and its causes, `outer: inner: ...`, skipping causes whose text an outer
/// message already includes (many library errors embed their source's message).
pub fn render_error(e: &anyhow::Error) -> String {
    let mut s = String::new();
    for cause in e.chain() {
        let m = cause.to_string();
        if m.is_empty() || s.contains(&m) {
            continue;
        }
        if !s.is_empty() {
            s.push_str(": ");
        }
        s.push_str(&m);
    }
    s
}

/// The tuning database for compiling on this CPU with `threads` threads, unless `off`
/// (`--no-tuning`). A database that cannot be used is ignored with a note.
pub fn tuning(off: bool, threads: usize) -> Option<std::sync::Arc<tilec::tuner::Tuning>> {
    if off {
        return None;
    }
    match tilec::tune::open_tuning(None, threads) {
        Ok(t) => t,
        Err(e) => {
            println!("note: {e}; tuning ignored (--no-tuning silences this)");
            None
        }
    }
}

/// The tuning database for compiling on CUDA GPU `device`, unless `off` (`--no-tuning`). A
/// database or a device that cannot be used is ignored with a note.
pub fn cuda_tuning(off: bool, device: usize) -> Option<std::sync::Arc<tilec::tuner::Tuning>> {
    if off {
        return None;
    }
    match tilec::tune::open_cuda_tuning(None, device) {
        Ok(t) => t,
        Err(e) => {
            println!("note: {e}; tuning ignored (--no-tuning silences this)");
            None
        }
    }
}

/// The GPU the CUDA target's kernels are built for where there is none to ask: the H200.
pub fn preset_gpu() -> tilec_cuda::GpuTarget {
    tilec_cuda::GpuTarget::hopper()
}

/// The GPU `device` as the families see it, its name and its tuning database (unless `off`);
/// without a device, the H200 preset and no tuning (the database is keyed by GPU), with a note
/// when tuning was not turned off.
pub fn cuda_for_explain(off: bool, device: usize) -> (tilec_cuda::GpuTarget, String, Option<std::sync::Arc<tilec::tuner::Tuning>>) {
    match tilec::compiled_cuda::open_device(device) {
        Ok(d) => {
            let p = d.props();
            let title = format!("{} (sm_{}{}, {} SMs)", p.name, p.compute_capability.0, p.compute_capability.1, p.sm_count);
            (p.gpu_target(), title, cuda_tuning(off, device))
        }
        Err(e) => {
            if !off {
                println!("note: {e}; showing the H200 preset's families with heuristic parameters (the tuning database is keyed by GPU)");
            }
            (preset_gpu(), "sm_90, 132 SMs".to_string(), None)
        }
    }
}

/// Prints what lookups in the tuning database ignored (stale, foreign, undecodable entries).
pub fn tuning_notes(t: &Option<std::sync::Arc<tilec::tuner::Tuning>>) {
    if let Some(t) = t {
        for n in t.db.notes() {
            println!("note: tuning database: {n}");
        }
    }
}

/// Parses `NAME=FILE` for `--input` and `--expect`.
pub fn parse_named_file(s: &str) -> Result<(String, PathBuf), String> {
    let (name, f) = s.split_once('=').ok_or_else(|| format!("expected NAME=FILE, got '{s}'"))?;
    if name.is_empty() || f.is_empty() {
        return Err(format!("expected NAME=FILE, got '{s}'"));
    }
    Ok((name.to_string(), PathBuf::from(f)))
}

/// Reads and decodes a model file (external data inlined).
pub fn load_model(path: &Path) -> Result<ModelProto> {
    let m = tilec::onnx::load_model(path)?;
    if m.graph.is_none() {
        bail!("{}: the model has no graph", path.display());
    }
    Ok(m)
}

/// The model's graph (checked present by [`load_model`]).
pub fn graph_of(m: &ModelProto) -> Result<&proto::GraphProto> {
    m.graph.as_ref().context("the model has no graph")
}

/// Names of the graph inputs that are real inputs (not initializers listed as inputs).
pub fn input_names(g: &proto::GraphProto) -> Vec<String> {
    let init: std::collections::HashSet<&str> = g.initializer.iter().map(|t| t.name.as_str()).collect();
    g.input.iter().filter(|i| !init.contains(i.name.as_str())).map(|i| i.name.clone()).collect()
}

/// `None` for a tensor-typed value, else what it is (`"a sequence"`, ...).
pub fn non_tensor_kind(vi: &proto::ValueInfoProto) -> Option<&'static str> {
    use proto::type_proto::Value;
    match vi.r#type.as_ref().and_then(|t| t.value.as_ref()) {
        Some(Value::TensorType(_)) | None => None,
        Some(Value::SequenceType(_)) => Some("a sequence"),
        Some(Value::OptionalType(_)) => Some("an optional"),
        Some(Value::MapType(_)) => Some("a map"),
        Some(Value::SparseTensorType(_)) => Some("a sparse tensor"),
        Some(Value::OpaqueType(_)) => Some("an opaque value"),
    }
}

/// The named symbolic dimensions (`dim_param`s) of the model's inputs.
pub fn dim_params(g: &proto::GraphProto) -> Vec<String> {
    use proto::tensor_shape_proto::dimension::Value as D;
    use proto::type_proto::Value;
    let mut params = Vec::new();
    for vi in &g.input {
        if let Some(Value::TensorType(t)) = vi.r#type.as_ref().and_then(|t| t.value.as_ref()) {
            for d in t.shape.iter().flat_map(|s| s.dim.iter()) {
                if let Some(D::DimParam(p)) = &d.value {
                    if !p.is_empty() && !params.contains(p) {
                        params.push(p.clone());
                    }
                }
            }
        }
    }
    params
}

/// The shape a graph output declares, where it is known: fixed sizes and symbolic ones whose
/// names are in `dims` (None for the others; None overall without a declared shape).
pub fn declared_shape(vi: &proto::ValueInfoProto, dims: &HashMap<String, usize>) -> Option<Vec<Option<usize>>> {
    use proto::tensor_shape_proto::dimension::Value as D;
    use proto::type_proto::Value;
    let Some(Value::TensorType(t)) = vi.r#type.as_ref().and_then(|t| t.value.as_ref()) else { return None };
    let shape = t.shape.as_ref()?;
    Some(
        shape
            .dim
            .iter()
            .map(|d| match &d.value {
                Some(D::DimValue(n)) if *n >= 0 => Some(*n as usize),
                Some(D::DimParam(p)) => dims.get(p).copied(),
                _ => None,
            })
            .collect(),
    )
}

/// Checks `--dim` names against the symbolic dimensions of the model's inputs.
pub fn check_dims(g: &proto::GraphProto, dims: &[(String, usize)]) -> Result<HashMap<String, usize>> {
    let params = dim_params(g);
    let mut out = HashMap::new();
    for (name, v) in dims {
        if !params.contains(name) {
            if params.is_empty() {
                bail!("--dim {name}={v}: the model's inputs have no symbolic dimensions");
            }
            bail!("--dim {name}={v}: no symbolic dimension '{name}' (the model's are: {})", params.join(", "));
        }
        if out.insert(name.clone(), *v).is_some_and(|old| old != *v) {
            bail!("--dim {name} is given twice with different values");
        }
    }
    Ok(out)
}

/// Small integer inputs are what shape operands are computed from (a Pad's pads built by
/// Concat from an axes input, ...); larger ones are data.
const MAX_SHAPE_ARG_ELEMENTS: usize = 64;

/// Imports a model. Graph inputs that the importer needs as constants (shape operands
/// such as Reshape's shape) are bound to the values in `provided` and the import is
/// retried. When the operand is computed from graph inputs rather than being one, the
/// given small integer inputs are bound (once), as a user specializing on shape arguments
/// would. Returns the graph and the names bound this way.
pub fn import(
    model: &ModelProto,
    mut opts: ImportOptions,
    provided: &HashMap<String, Tensor>,
) -> Result<(tilec::Graph, Vec<String>)> {
    let graph_inputs = model.graph.as_ref().map(input_names).unwrap_or_default();
    let mut bound = Vec::new();
    loop {
        match tilec::import(model, &opts) {
            Ok(g) => return Ok((g, bound)),
            Err(tilec::Error::Import(ImportError::NonConstant { ref input, .. }))
                if provided.contains_key(input) && !opts.bind_inputs.contains_key(input) =>
            {
                opts.bind_inputs.insert(input.clone(), provided[input].clone());
                bound.push(input.clone());
            }
            Err(e @ tilec::Error::Import(ImportError::NonConstant { .. })) => {
                let input = match &e {
                    tilec::Error::Import(ImportError::NonConstant { input, .. }) => input.clone(),
                    _ => String::new(),
                };
                if !graph_inputs.contains(&input) {
                    let mut names: Vec<&String> = provided
                        .iter()
                        .filter(|(k, t)| {
                            t.dtype().is_int()
                                && t.numel() <= MAX_SHAPE_ARG_ELEMENTS
                                && !opts.bind_inputs.contains_key(*k)
                        })
                        .map(|(k, _)| k)
                        .collect();
                    names.sort();
                    if !names.is_empty() {
                        for k in names {
                            opts.bind_inputs.insert(k.clone(), provided[k].clone());
                            bound.push(k.clone());
                        }
                        continue;
                    }
                }
                let hint = if graph_inputs.contains(&input) {
                    format!(
                        "\n  hint: give its value with --input {input}=FILE.npy (it is then compiled in as a constant)"
                    )
                } else {
                    "\n  hint: it is computed from graph inputs; give the integer inputs it depends on with --input \
                     (they are then compiled in as constants)"
                        .to_string()
                };
                bail!("cannot import the model: {e}{hint}");
            }
            Err(e @ tilec::Error::Import(ImportError::Unsupported { .. })) => {
                let all = model.graph.as_ref().map(inspect::unsupported_ops).unwrap_or_default();
                let list: Vec<String> = all.iter().map(|(k, c)| format!("{k} (x{c})")).collect();
                if list.len() > 1 {
                    bail!("cannot import the model: {e}\n  all unsupported op types in the model: {}", list.join(", "));
                }
                bail!("cannot import the model: {e}");
            }
            Err(e) => return Err(anyhow::Error::new(e).context("cannot import the model")),
        }
    }
}

/// `1234567` → `1,234,567`.
pub fn thousands(n: u128) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A byte count for people: `97.5 MiB`.
pub fn human_bytes(n: u128) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formatting() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(25_557_032), "25,557,032");
        assert_eq!(human_bytes(10), "10 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
    }

    #[test]
    fn args() {
        assert_eq!(parse_dim("batch=4").unwrap(), ("batch".to_string(), 4));
        assert!(parse_dim("batch").is_err());
        assert!(parse_dim("batch=-1").is_err());
        assert!(parse_dim("=3").is_err());
        assert!(parse_dim(&format!("n={}", 1u64 << 63)).unwrap_err().contains("larger than an ONNX dimension"));
        assert_eq!(parse_tolerance("0").unwrap(), 0.0);
        for bad in ["-1e-3", "nan", "inf", "x"] {
            assert!(parse_tolerance(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_named_file("x=a=b.npy").unwrap(), ("x".to_string(), PathBuf::from("a=b.npy")));
        assert!(parse_named_file("x=").is_err());
    }
}
