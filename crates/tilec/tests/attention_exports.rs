//! Models exported the way users export them (models/sdpa/, made by
//! scripts/gen-sdpa-models.py: transformers' default SDPA attention and
//! nn.MultiheadAttention through PyTorch's dynamo exporter): the optimized graph has
//! exactly one attention op per layer, the compiled CPU run reproduces PyTorch's outputs,
//! and the recognized op keeps the exported graph's semantics on fully masked rows and on
//! non-finite logits (the `where(isnan(p), 0, p)` guard).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tilec_ir::op::NnOp;
use tilec_ir::{Graph, Op, Tensor};
use tilec_onnx::{import_file, ImportOptions};

fn model_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/sdpa").join(name)
}

fn cache() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/tilec-cache")
}

fn load_set(dir: &Path, prefix: &str) -> Vec<Tensor> {
    (0..)
        .map(|i| dir.join(format!("test_data_set_0/{prefix}_{i}.pb")))
        .take_while(|p| p.exists())
        .map(|p| tilec_onnx::tensor::tensor_from_proto(&tilec_onnx::load::load_tensor_pb(&p).unwrap()).unwrap())
        .collect()
}

fn layers(dir: &Path) -> usize {
    let meta = std::fs::read_to_string(dir.join("meta.json")).unwrap();
    let at = meta.find("\"layers\":").expect("meta.json has layers") + 9;
    meta[at..].trim_start().split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
}

fn max_err(want: &Tensor, got: &Tensor, rtol: f64, atol: f64) -> Option<String> {
    assert_eq!(want.shape(), got.shape());
    let (w, g) = (want.to_f64_vec(), got.to_f64_vec());
    let bad = (0..w.len()).filter(|&i| !((w[i] - g[i]).abs() <= atol + rtol * w[i].abs())).count();
    (bad > 0).then(|| format!("{bad}/{} elements out of tolerance", w.len()))
}

/// The reference inputs' symbolic dims as import bindings.
fn dims_of(name: &str, inputs: &[Tensor]) -> HashMap<String, usize> {
    let s = inputs[0].shape();
    let mut d = HashMap::from([("batch".to_string(), s[0])]);
    if name != "vit" {
        d.insert("seq".to_string(), s[1]);
    }
    if name == "mha" {
        d.insert("mem".to_string(), inputs[1].shape()[1]);
    }
    d
}

fn import_fixed(name: &str, inputs: &[Tensor]) -> Graph {
    let opts = ImportOptions { dim_values: dims_of(name, inputs), ..Default::default() };
    import_file(&model_dir(name).join("model.onnx"), &opts).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn attention_ops(g: &Graph) -> usize {
    g.nodes().iter().filter(|n| matches!(n.op, Op::Nn(NnOp::Attention { .. }))).count()
}

/// Optimized for the CPU, partitioned and built: one attention per layer, each its own
/// attention kernel; then compiled and run against PyTorch's outputs.
fn check(name: &str) {
    let dir = model_dir(name);
    let inputs = load_set(&dir, "input");
    let expected = load_set(&dir, "output");
    let g = import_fixed(name, &inputs);
    let opts = tilec::compiled::CompileOptions { cache_dir: Some(cache()), ..Default::default() };
    let prep = tilec::compiled::prepare(&g, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
    let n = layers(&dir);
    assert_eq!(attention_ops(prep.graph()), n, "{name}: attention ops after -O3 (one per layer)");
    if matches!(name, "gpt2" | "llama") {
        // Causal decoders exported with input_ids alone: the mask the export computes from
        // position iotas is recognized as the op's causal flag, with no mask read.
        for node in prep.graph().nodes() {
            if let Op::Nn(NnOp::Attention { is_causal, has_mask, .. }) = &node.op {
                assert!(*is_causal && !*has_mask, "{name}: attention not causal or still reading a mask");
            }
        }
    }
    let attn_kernels = prep.kernels().iter().filter(|k| k.kernel.name.contains("attention")).count();
    assert_eq!(attn_kernels, n, "{name}: attention kernels");

    let mut c = tilec::compiled::compile(&g, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(!c.interpreted(), "{name}: compiled, not interpreted");
    assert!(c.report.fallbacks.is_empty(), "{name}: fallbacks {:?}", c.report.fallbacks);
    c.check_plan().unwrap_or_else(|e| panic!("{name}: memory plan: {e}"));
    c.poison().unwrap_or_else(|e| panic!("{name}: {e}"));
    let outs = c.run(&inputs).unwrap_or_else(|e| panic!("{name}: {e}"));
    if let Some(m) = max_err(&expected[0], &outs[0], 1e-3, 1e-4) {
        panic!("{name} compiled: {m}");
    }
}

#[test]
fn gpt2_sdpa() {
    check("gpt2");
}

#[test]
fn bert_sdpa() {
    check("bert");
}

#[test]
fn distilbert_sdpa() {
    check("distilbert");
}

#[test]
fn llama_sdpa_gqa() {
    check("llama");
}

#[test]
fn qwen2_sdpa_gqa() {
    check("qwen2");
}

#[test]
fn vit_multihead_attention() {
    check("vit");
}

#[test]
fn multihead_cross_attention() {
    check("mha");
}

/// The exported guard zeroes the probabilities of a query row that sees no key (left
/// padding in a causal LM) and of rows with a non-finite logit; the compiled model, with
/// the guard folded into the attention op, gives what the exported graph gives on the
/// interpreter (not PyTorch eager, which answers fully masked rows differently).
#[test]
fn qwen2_fully_masked_rows_keep_the_graph_semantics() {
    let name = "qwen2";
    let dir = model_dir(name);
    let mut inputs = load_set(&dir, "input");
    let s = inputs[1].shape().to_vec();
    // Row 1: the first quarter is (left) padding: those query rows see no key at all.
    let mut mask = vec![1i64; s[0] * s[1]];
    mask[s[1]..s[1] + s[1] / 4].iter_mut().for_each(|x| *x = 0);
    inputs[1] = Tensor::from_i64s(inputs[1].dtype(), s.clone(), &mask).unwrap();
    let g = import_fixed(name, &inputs);
    let names: Vec<String> = g.inputs().iter().map(|&v| g.value(v).name.clone()).collect();
    let want = tilec_ref::run_named(&g, names.into_iter().zip(inputs.clone()).collect()).unwrap().remove(0);
    let opts = tilec::compiled::CompileOptions { cache_dir: Some(cache()), ..Default::default() };
    let mut c = tilec::compiled::compile(&g, &opts).unwrap();
    assert_eq!(attention_ops(c.graph()), 2);
    let got = c.run(&inputs).unwrap().remove(0);
    assert!(want.to_f64_vec().iter().all(|x| x.is_finite()), "the guard leaves no NaN");
    if let Some(m) = max_err(&want, &got, 1e-3, 1e-4) {
        panic!("{name} left-padded: {m}");
    }
}

/// The same guard on a hand-built SDPA graph with a NaN and an +inf in Q and a batch
/// whose keys are all masked, compiled for the CPU (attention as matrix products) and
/// compared with the graph on the interpreter: rows zeroed by the guard stay zeros.
#[test]
fn guard_on_non_finite_logits_compiled() {
    use tilec_ir::op::{BinaryOp, LayoutOp, LinalgOp, NormOp, UnaryOp};
    use tilec_ir::{DType, Dim, TensorType};
    let (b, h, s, d) = (2usize, 2usize, 8usize, 16usize);
    let mut g = Graph::new("guard");
    let f = |xs: &[usize]| TensorType::fixed(DType::F32, xs);
    let q = g.add_input("q", f(&[b, h, s, d]));
    let k = g.add_input("k", f(&[b, h, s, d]));
    let v = g.add_input("v", f(&[b, h, s, d]));
    let keep = g.add_input("keep", TensorType::fixed(DType::Bool, &[b, 1, 1, s]));
    let dims = |xs: &[usize]| xs.iter().map(|&x| Dim::Fixed(x)).collect::<Vec<_>>();
    let r = g.add(Op::Layout(LayoutOp::Reshape { shape: dims(&[b * h, s, d]) }), &[k]).unwrap();
    let t = g.add(Op::Layout(LayoutOp::Transpose { perm: vec![0, 2, 1] }), &[r]).unwrap();
    let kt = g.add(Op::Layout(LayoutOp::Reshape { shape: dims(&[b, h, d, s]) }), &[t]).unwrap();
    let c = g.add_const("c", Tensor::scalar((1.0f32 / (d as f32).sqrt()).sqrt()));
    let qs = g.add(Op::Binary(BinaryOp::Mul), &[q, c]).unwrap();
    let ks = g.add(Op::Binary(BinaryOp::Mul), &[kt, c]).unwrap();
    let sc = g.add(Op::Linalg(LinalgOp::MatMul), &[qs, ks]).unwrap();
    let z = g.add_const("z", Tensor::scalar(0.0f32));
    let ninf = g.add_const("ninf", Tensor::scalar(f32::NEG_INFINITY));
    let m = g.add(Op::Where, &[keep, z, ninf]).unwrap();
    let sm = g.add(Op::Binary(BinaryOp::Add), &[sc, m]).unwrap();
    let p = g.add(Op::Norm(NormOp::Softmax { axis: 3 }), &[sm]).unwrap();
    let nan = g.add(Op::Unary(UnaryOp::IsNaN), &[p]).unwrap();
    let pg = g.add(Op::Where, &[nan, z, p]).unwrap();
    let y = g.add(Op::Linalg(LinalgOp::MatMul), &[pg, v]).unwrap();
    g.set_outputs(vec![y]);
    tilec_ir::verify(&g).unwrap();

    let val = |i: usize| ((i * 7919 % 1000) as f32 / 500.0) - 1.0;
    let mut qv: Vec<f32> = (0..b * h * s * d).map(val).collect();
    qv[5] = f32::NAN; // batch 0, head 0, row 0
    qv[3 * d + 2] = f32::INFINITY; // batch 0, head 0, row 3
    let kv: Vec<f32> = (0..b * h * s * d).map(|i| val(i + 17)).collect();
    let vv: Vec<f32> = (0..b * h * s * d).map(|i| val(i + 31)).collect();
    // Batch 1 masks every key.
    let kp: Vec<f64> = (0..b * s).map(|i| if i < s { 1.0 } else { 0.0 }).collect();
    let ins = vec![
        Tensor::from_vec(vec![b, h, s, d], qv).unwrap(),
        Tensor::from_vec(vec![b, h, s, d], kv).unwrap(),
        Tensor::from_vec(vec![b, h, s, d], vv).unwrap(),
        Tensor::from_f64s(DType::Bool, vec![b, 1, 1, s], &kp).unwrap(),
    ];
    let want = tilec_ref::run(&g, ins.clone()).unwrap().remove(0);
    let w = want.to_f64_vec();
    assert!(w[..d].iter().chain(&w[3 * d..4 * d]).all(|&x| x == 0.0), "the graph zeroes NaN rows");
    assert!(w[b * h * s * d / 2..].iter().all(|&x| x == 0.0), "and fully masked ones");
    // Both CPU lowerings of attention: as matrix products (the default) and row by row.
    for families in [vec![], vec![("attention".to_string(), "cpu.direct".to_string())]] {
        let opts = tilec::compiled::CompileOptions { cache_dir: Some(cache()), families, ..Default::default() };
        let mut c = tilec::compiled::compile(&g, &opts).unwrap();
        assert_eq!(attention_ops(c.graph()), 1, "recognized");
        let o = c.run(&ins).unwrap().remove(0).to_f64_vec();
        for i in 0..w.len() {
            assert!((w[i] - o[i]).abs() <= 1e-5 + 1e-4 * w[i].abs(), "{:?}: element {i}: {} vs {}", opts.families, w[i], o[i]);
        }
    }
}

/// Multiply-adds (x2) a kernel's `Gemm` statements execute on the register tiles (rows
/// padded to `mr`, columns to `nr`, times the loops around each) and the ones they need.
fn gemm_flops(k: &tilec_tile::Kernel) -> (f64, f64) {
    fn walk(s: &[tilec_tile::ir::Stmt], times: f64, acc: &mut (f64, f64)) {
        use tilec_tile::ir::Stmt;
        for st in s {
            match st {
                Stmt::For(l) => walk(&l.body, times * l.extent as f64, acc),
                Stmt::If { then_, else_, .. } => {
                    walk(then_, times, acc);
                    walk(else_, times, acc);
                }
                Stmt::Gemm(g) => {
                    let p = &g.params;
                    let up = |x: i64, t: i64| if t > 0 { ((x + t - 1) / t * t) as f64 } else { x as f64 };
                    let base = times * 2.0 * g.batch as f64 * g.k as f64;
                    acc.0 += base * up(g.m, p.mr) * up(g.n, p.nr);
                    acc.1 += base * g.m as f64 * g.n as f64;
                }
                _ => {}
            }
        }
    }
    let mut acc = (0.0, 0.0);
    walk(&k.body, 1.0, &mut acc);
    acc
}

/// torchvision's ViT reads its in-projection sequence-first (`[S, B, E] @ W`): lowered as
/// S products of B rows, every register tile computed mr rows for B useful ones (3x the
/// layer's work at B = 2 with 6-row tiles; 20x for one image with wider tiles). The
/// product folds the batch into its rows: no matrix-product kernel of the model computes
/// more than 1.5x what its products need.
#[test]
fn vit_in_projection_is_computed_once() {
    let name = "vit";
    let dir = model_dir(name);
    let inputs = load_set(&dir, "input");
    let g = import_fixed(name, &inputs);
    let opts = tilec::compiled::CompileOptions { cache_dir: Some(cache()), ..Default::default() };
    let prep = tilec::compiled::prepare(&g, &opts).unwrap();
    let mut checked = 0;
    for k in prep.kernels() {
        if !k.kernel.name.contains("gemm") {
            continue;
        }
        let (done, need) = gemm_flops(&k.kernel);
        // The classifier head ([B, E] @ [E, 10], 2 rows) cannot fill a tile whatever it does.
        if need < 0.1e6 {
            continue;
        }
        println!("{}: {:.3} MFLOP on the tiles for {:.3} needed ({:.2}x)", k.kernel.name, done / 1e6, need / 1e6, done / need);
        assert!(done <= 1.5 * need, "{}: {:.2}x the products' work on the register tiles", k.kernel.name, done / need);
        checked += 1;
    }
    assert!(checked >= 6, "matrix-product kernels checked: {checked}");
}
