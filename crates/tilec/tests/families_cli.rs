//! Kernel families through the `tilec` binary: `explain` names the family of every kernel on
//! both targets (CUDA's without a GPU), `--family OP=NAME` changes the choice, an unknown
//! family is an error listing the target's, and `run` reports the family per kernel.

use tilec::Tensor;

mod common;
use common::*;

/// `relu(conv3x3(x, w) + b) @ m` over 32 input and 16 output channels on a 16x16 image.
fn conv_model(dir: &std::path::Path) -> std::path::PathBuf {
    let konst = |name: &str, shape: &[usize]| {
        let n: usize = shape.iter().product();
        let vals = (0..n).map(|i| ((i * 7919) % 997) as f32 / 997.0 - 0.5).collect();
        tilec_onnx::tensor::tensor_to_proto(name, &Tensor::from_vec(shape.to_vec(), vals).unwrap())
    };
    let mut conv = node("conv", "Conv", &["x", "w", "b"], &["c"]);
    conv.attribute.push(tilec_onnx::proto::AttributeProto {
        name: "pads".into(),
        r#type: 7,
        ints: vec![1, 1, 1, 1],
        ..Default::default()
    });
    let mut m = model(
        vec![conv, node("relu", "Relu", &["c"], &["r"]), node("proj", "MatMul", &["r", "m"], &["y"])],
        vec![vi("x", F32, &[D::N(1), D::N(32), D::N(16), D::N(16)])],
        vec![vi("y", F32, &[D::N(1), D::N(16), D::N(16), D::N(8)])],
    );
    let g = m.graph.as_mut().unwrap();
    g.initializer = vec![konst("w", &[16, 32, 3, 3]), konst("b", &[16]), konst("m", &[16, 8])];
    save(dir, "conv.onnx", &m)
}

/// The kernels section of `explain`: (kernel, family) per kernel line.
fn families(stdout: &str) -> Vec<(String, String)> {
    let start = stdout.find("\nkernels (families for").unwrap_or_else(|| panic!("no kernels section:\n{stdout}"));
    stdout[start..]
        .lines()
        .skip(2)
        .filter(|l| l.starts_with("  ") && !l.starts_with("    "))
        .map(|l| {
            let (k, rest) = l.trim().split_once(": ").unwrap_or_else(|| panic!("not a kernel line: {l}"));
            (k.to_string(), rest.split(' ').next().unwrap_or_default().to_string())
        })
        .collect()
}

fn explain(model: &std::path::Path, target: &str, extra: &[&str]) -> Vec<(String, String)> {
    let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"explain", &model, &"--target", &target];
    for a in extra {
        args.push(a);
    }
    let o = tilec(&args);
    o.ok();
    families(&o.stdout)
}

/// The family of the kernel whose name ends in `suffix`.
fn family_of<'a>(f: &'a [(String, String)], suffix: &str) -> &'a str {
    &f.iter().find(|(k, _)| k.ends_with(suffix)).unwrap_or_else(|| panic!("no {suffix} kernel: {f:?}")).1
}

#[test]
fn explain_names_a_family_for_every_kernel() {
    let dir = scratch("families_explain");
    let m = conv_model(&dir);
    for (target, prefixes) in [("cpu", &["cpu."][..]), ("cuda", &["cuda.", "sm90_", "simt_f32_"][..])] {
        let f = explain(&m, target, &[]);
        assert!(f.len() >= 2, "{target}: {f:?}");
        for (k, fam) in &f {
            assert!(k.starts_with('k'), "{target}: a host step or no kernel name: {k}: {fam}");
            assert!(prefixes.iter().any(|p| fam.starts_with(p)), "{target}: kernel {k} has no {target} family: {fam}");
        }
    }
}

#[test]
fn family_choice_changes_the_kernel_and_unknown_ones_fail() {
    let dir = scratch("families_force");
    let m = conv_model(&dir);
    // On CUDA a forced direct nest is refused for the fused convolution (it would run on one
    // thread), so the matrix product is forced there.
    for (target, op, suffix, forced) in [("cpu", "conv", "_conv", "cpu.direct"), ("cuda", "matmul", "_gemm", "cuda.direct")] {
        let default = explain(&m, target, &[]);
        assert_ne!(family_of(&default, suffix), forced, "{target}: the {op} kernel is direct by default");
        let arg = format!("{op}={forced}");
        let f = explain(&m, target, &["--family", &arg]);
        assert_eq!(family_of(&f, suffix), forced, "{target}: {f:?}");
        // Only that kernel changes.
        let others = |f: &[(String, String)]| f.iter().filter(|(k, _)| !k.ends_with(suffix)).cloned().collect::<Vec<_>>();
        assert_eq!(others(&f), others(&default), "{target}");
        let bad = format!("{op}=no.such");
        tilec(&[&"explain", &m, &"--target", &target, &"--family", &bad]).fails_with(&["no family 'no.such'", forced]);
    }
    tilec(&[&"run", &m, &"--family", &"conv=no.such"]).fails_with(&["no family 'no.such'", "cpu.direct"]);
    tilec(&[&"run", &m, &"--family", &"conv"]).fails_with(&["expected OP=FAMILY"]);
}

#[test]
fn run_reports_the_family_per_kernel() {
    let dir = scratch("families_run");
    let m = conv_model(&dir);
    let o = tilec(&[&"run", &m, &"--family", &"conv=cpu.direct", &"--stats", &"--profile", &"--compare-ref"]);
    o.ok();
    assert!(o.stdout.contains("_conv: cpu.direct (forced)"), "{}", o.stdout);
    assert!(o.stdout.contains("_conv [cpu.direct]"), "profile rows carry the family:\n{}", o.stdout);
    let o = tilec(&[&"run", &m, &"--json"]);
    o.ok();
    let last = o.stdout.lines().last().unwrap_or_default();
    let j: serde_json::Value = serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {last}"));
    let fams = j["families"].as_object().unwrap_or_else(|| panic!("no families: {last}"));
    assert!(fams.len() >= 2 && fams.values().all(|d| d["family"].as_str().is_some_and(|f| f.starts_with("cpu."))), "{last}");
}
