//! Kernel-family dispatch on the CUDA path (no GPU needed): which matrix products of small
//! 16-bit graphs the Hopper tensor-core GEMM family takes, with the reasons for those it does
//! not, and (when NVRTC is present) that the family kernels with their fused epilogues compile.

use tilec::compiled_cuda::{prepare, CudaOptions, Prepared};
use tilec::cuda::GpuTarget;
use tilec_ir::op::{BinaryOp, LayoutOp, LinalgOp, UnaryOp};
use tilec_ir::{DType, Graph, Op, Tensor, TensorType, ValueId};

fn konst(g: &mut Graph, name: &str, d: DType, shape: &[usize]) -> ValueId {
    let n: usize = shape.iter().product();
    let vals: Vec<f64> = (0..n)
        .map(|i| ((i * 7919) % 997) as f64 / 997.0 - 0.5)
        .collect();
    g.add_const(name, Tensor::from_f64s(d, shape.to_vec(), &vals).unwrap())
}

fn prepared(g: &Graph, target: &GpuTarget) -> Prepared {
    prepare(g, &CudaOptions::default(), target).unwrap_or_else(|e| panic!("{e}"))
}

/// `gelu(x @ w + bias) + r` over 16-bit `d`, with `x` [batch, m, k].
fn linear(d: DType, batch: usize, m: usize, k: usize, n: usize) -> Graph {
    let mut g = Graph::new("linear");
    let x = g.add_input("x", TensorType::fixed(d, &[batch, m, k]));
    let r = g.add_input("r", TensorType::fixed(d, &[batch, m, n]));
    let w = konst(&mut g, "w", d, &[k, n]);
    let b = konst(&mut g, "b", d, &[n]);
    let y = g.add(Op::Linalg(LinalgOp::MatMul), &[x, w]).unwrap();
    let y = g.add(Op::Binary(BinaryOp::Add), &[y, b]).unwrap();
    let y = g
        .add(Op::Unary(UnaryOp::Gelu { tanh_approx: false }), &[y])
        .unwrap();
    let y = g.add(Op::Binary(BinaryOp::Add), &[y, r]).unwrap();
    g.set_outputs(vec![y]);
    g
}

/// `q @ transpose(k)` per batch and head: a column-major B.
fn scores(d: DType) -> Graph {
    let mut g = Graph::new("scores");
    let q = g.add_input("q", TensorType::fixed(d, &[2, 4, 64, 32]));
    let k = g.add_input("k", TensorType::fixed(d, &[2, 4, 64, 32]));
    let kt = g
        .add(
            Op::Layout(LayoutOp::Transpose {
                perm: vec![0, 1, 3, 2],
            }),
            &[k],
        )
        .unwrap();
    let s = g.add(Op::Linalg(LinalgOp::MatMul), &[q, kt]).unwrap();
    g.set_outputs(vec![s]);
    g
}

fn families(p: &Prepared) -> Vec<(&'static str, Option<String>)> {
    p.kernels()
        .iter()
        .filter(|k| tilec::cuda::families::has_gemm(&k.lowered))
        .map(|k| (k.schedule, Some(k.family.describe())))
        .collect()
}

#[test]
fn sixteen_bit_linear_layers_take_the_tensor_core_family() {
    let h = GpuTarget::hopper();
    for d in [DType::F16, DType::BF16] {
        let p = prepared(&linear(d, 4, 64, 256, 512), &h);
        let f = families(&p);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].0, "sm90_tc_gemm", "{f:?}");
        let why = f[0].1.clone().unwrap_or_default();
        // Four batches of 64 rows against one weight: one 256-row problem.
        assert!(
            why.contains("256x512x256 batch 1 (4 batches of 64 rows flattened)"),
            "{why}"
        );
        let k = &p.kernels()[0];
        // The bias, GELU and residual run in the family's epilogue: one kernel in all.
        assert_eq!(
            p.kernels().len(),
            1,
            "{:?}",
            p.kernels().iter().map(|k| &k.name).collect::<Vec<_>>()
        );
        assert!(k.source.source.contains("tl_epi("), "no epilogue call");
        // The epilogue's pointers follow the fixed parameters, in the order launches pass them.
        let sig = &k.source.source[k
            .source
            .source
            .find("long long batch_stride_c")
            .unwrap_or(0)..];
        assert!(
            sig.starts_with("long long batch_stride_c,\n       const tl_"),
            "{}",
            &sig[..80.min(sig.len())]
        );
        assert!(k.source.source.contains("wgmma.mma_async"), "no wgmma");
    }
}

#[test]
fn transposed_operands_and_batches_take_the_family() {
    let p = prepared(&scores(DType::F16), &GpuTarget::hopper());
    let f = families(&p);
    assert_eq!(f.len(), 1, "{f:?}");
    let why = f[0].1.clone().unwrap_or_default();
    assert_eq!(f[0].0, "sm90_tc_gemm", "{why}");
    assert!(
        why.contains("64x64x32 batch 8") && why.contains("B col-major"),
        "{why}"
    );
}

#[test]
fn other_matrix_products_fall_back_with_a_reason() {
    let h = GpuTarget::hopper();
    let cases: [(Graph, GpuTarget, &str); 3] = [
        (
            linear(DType::F32, 1, 64, 256, 512),
            h.clone(),
            "operands are f32, not f16 or bf16",
        ),
        (
            linear(DType::F16, 1, 64, 100, 512),
            h.clone(),
            "not a multiple of 8",
        ),
        (
            linear(DType::F16, 1, 64, 256, 512),
            GpuTarget {
                compute_capability: (8, 0),
                ..h.clone()
            },
            "compute capability 9.0",
        ),
    ];
    for (g, t, want) in cases {
        let p = prepared(&g, &t);
        let f = families(&p);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].0, "gemm", "{f:?}");
        let why = f[0].1.clone().unwrap_or_default();
        assert!(why.contains(want), "expected '{want}' in: {why}");
    }
}

#[test]
fn family_kernels_compile_with_nvrtc() {
    let nv = match tilec::cuda::Nvrtc::load() {
        Ok(n) => n,
        Err(e) => {
            eprintln!("note: NVRTC compile skipped: {e} (set TILEC_NVRTC_LIB to a libnvrtc.so)");
            return;
        }
    };
    let h = GpuTarget::hopper();
    let mut modules = vec![];
    for (i, g) in [
        linear(DType::F16, 4, 64, 256, 512),
        linear(DType::BF16, 1, 40, 64, 72),
        scores(DType::F16),
    ]
    .iter()
    .enumerate()
    {
        for k in prepared(g, &h).kernels() {
            if k.schedule == "sm90_tc_gemm" {
                modules.push((format!("m{i}_{}", k.name), k.source.source.clone()));
            }
        }
    }
    assert_eq!(modules.len(), 3);
    let c = tilec::cuda::Compiler::new(nv, "sm_90a");
    for ((name, _), r) in modules.iter().zip(c.compile_many(&modules)) {
        let r = r.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(r.image.starts_with(b"\x7fELF"), "{name}: not a cubin");
    }
}

/// The graph with every f32 value, constant and cast in f16 (the repository's exports are f32).
fn to_f16(g: &Graph) -> Graph {
    let mut h = g.clone();
    let ids: Vec<ValueId> = h.value_ids().collect();
    for v in ids {
        let val = h.value_mut(v);
        if val.ty.dtype == DType::F32 {
            val.ty.dtype = DType::F16;
        }
        if let tilec_ir::ValueDef::Const(t) = &val.def {
            if t.dtype() == DType::F32 {
                val.def = tilec_ir::ValueDef::Const(t.cast(DType::F16));
            }
        }
    }
    for n in h.nodes_mut_unchecked() {
        if let Op::Cast { to, .. } = &mut n.op {
            if *to == DType::F32 {
                *to = DType::F16;
            }
        }
    }
    h
}

/// GPT-2 and BERT exports in f16: at length 128 every matrix product outside attention runs on
/// the family (on CUDA attention stays two batched products per layer, which read K and V per
/// head and keep the tile-IR GEMM, saying why) (the attention output projections read their A across heads, 64-wide K slices of
/// `[batch, heads, seq, 64]`, through a 4-D tensor map); at length 16 those projections keep
/// the tile-IR GEMM, saying why (a group of 16 rows is smaller than a tile). With NVRTC present,
/// every family kernel compiles.
#[test]
fn f16_transformer_exports_dispatch_their_matrix_products() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models");
    let mut modules = vec![];
    // (model, length, kernels on the family at least, kernels off it at most): both exports
    // have 4 layers, so 8 attention products.
    for (m, seq, families_min, off_max) in [
        ("gpt2", 16, 13, usize::MAX),
        ("bert", 16, 20, usize::MAX),
        ("gpt2", 128, 17, 8),
        ("bert", 128, 24, 8),
    ] {
        let path = root.join(m).join("model.onnx");
        if !path.is_file() {
            eprintln!("note: {} missing", path.display());
            continue;
        }
        let opts = tilec::ImportOptions {
            dim_values: [("batch".to_string(), 2), ("seq".to_string(), seq)]
                .into_iter()
                .collect(),
            ..Default::default()
        };
        let g = to_f16(&tilec::load(&path, &opts).unwrap_or_else(|e| panic!("{m}: {e}")));
        let p = prepared(&g, &GpuTarget::hopper());
        let f = families(&p);
        let on: Vec<_> = f.iter().filter(|x| x.0 == "sm90_tc_gemm").collect();
        let off: Vec<_> = f.iter().filter(|x| x.0 != "sm90_tc_gemm").collect();
        eprintln!(
            "{m} at length {seq}: {} matrix-product kernels, {} on the family",
            f.len(),
            on.len()
        );
        for (s, why) in &off {
            eprintln!("  {s}: {}", why.clone().unwrap_or_default());
            assert!(
                why.as_ref().is_some_and(|w| w.contains("sm90_tc_gemm: ")),
                "no reason given"
            );
        }
        assert!(
            on.len() >= families_min,
            "{m}: only {} kernels on the family: {f:?}",
            on.len()
        );
        assert!(off.len() <= off_max, "{m} at length {seq}: {off:?}");
        for k in p.kernels().iter().filter(|k| k.schedule == "sm90_tc_gemm") {
            modules.push((format!("{m}{seq}_{}", k.name), k.source.source.clone()));
        }
    }
    if let Ok(nv) = tilec::cuda::Nvrtc::load() {
        let c = tilec::cuda::Compiler::new(nv, "sm_90a");
        for ((name, _), r) in modules.iter().zip(c.compile_many(&modules)) {
            let r = r.unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(r.image.starts_with(b"\x7fELF"), "{name}: not a cubin");
        }
    }
}
