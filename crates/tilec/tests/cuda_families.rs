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

/// Attention's two products per (batch, head) as exported: Q, K and V are `[2, 16, 4 * 64]`
/// tensors split into heads by a reshape and a transpose, so a batch index splits into batch and
/// head with their own strides.
fn heads(d: DType) -> Graph {
    let mut g = Graph::new("heads");
    let split = |g: &mut Graph, name: &str, perm: Vec<usize>| {
        let x = g.add_input(name, TensorType::fixed(d, &[2, 16, 256]));
        let shape = [2, 16, 4, 64].map(tilec_ir::Dim::Fixed).to_vec();
        let r = g.add(Op::Layout(LayoutOp::Reshape { shape }), &[x]).unwrap();
        g.add(Op::Layout(LayoutOp::Transpose { perm }), &[r]).unwrap()
    };
    let q = split(&mut g, "q", vec![0, 2, 1, 3]);
    let kt = split(&mut g, "k", vec![0, 2, 3, 1]);
    let v = split(&mut g, "v", vec![0, 2, 1, 3]);
    let s = g.add(Op::Linalg(LinalgOp::MatMul), &[q, kt]).unwrap();
    let o = g.add(Op::Linalg(LinalgOp::MatMul), &[s, v]).unwrap();
    g.set_outputs(vec![o]);
    g
}

/// Attention's output projection: `[2, 4, 16, 64]` heads merged back into `[2, 16, 256]` rows
/// (a transpose and a reshape) times a weight: A read across heads in 64-wide K slices, in
/// groups of 16 rows (smaller than the Hopper template's tiles).
fn heads_out(d: DType) -> Graph {
    let mut g = Graph::new("heads_out");
    let o = g.add_input("o", TensorType::fixed(d, &[2, 4, 16, 64]));
    let t = g.add(Op::Layout(LayoutOp::Transpose { perm: vec![0, 2, 1, 3] }), &[o]).unwrap();
    let r = g.add(Op::Layout(LayoutOp::Reshape { shape: [2, 16, 256].map(tilec_ir::Dim::Fixed).to_vec() }), &[t]).unwrap();
    let w = konst(&mut g, "w", d, &[256, 192]);
    let y = g.add(Op::Linalg(LinalgOp::MatMul), &[r, w]).unwrap();
    g.set_outputs(vec![y]);
    g
}

fn families(p: &Prepared) -> Vec<(&'static str, Option<String>)> {
    p.kernels()
        .iter()
        .filter(|k| tilec::cuda::families::has_gemm(&k.lowered))
        .map(|k| (k.schedule, Some(k.family.describe())))
        .collect()
}

/// A product whose Hopper tiles fill at most a quarter of the SMs over a deep K goes to the
/// mma.sync family, which splits K over blocks; one with more tiles or a shallow K stays on the
/// Hopper template.
#[test]
fn short_products_with_few_tiles_split_k_on_the_mma_family() {
    let h = GpuTarget::hopper();
    // GPT-2's second MLP product at 128 tokens: 128 x 768 x 3072.
    let p = prepared(&linear(DType::F16, 1, 128, 3072, 768), &h);
    let f = families(&p);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].0, "sm80_mma_gemm", "{f:?}");
    let why = f[0].1.clone().unwrap_or_default();
    assert!(why.contains("sm90_tc_gemm: a skinny product") && why.contains("K-blocks"), "{why}");
    // The same product at 4096 tokens has tiles for every SM.
    let p = prepared(&linear(DType::F16, 8, 512, 3072, 768), &h);
    let f = families(&p);
    assert_eq!(f[0].0, "sm90_tc_gemm", "{f:?}");
    // A shallow K (4 K-blocks) stays on the Hopper template however few its tiles.
    let p = prepared(&linear(DType::F16, 1, 128, 256, 512), &h);
    assert_eq!(families(&p)[0].0, "sm90_tc_gemm");
    // GPT-2's fused QKV projection at 128 tokens: 36 tiles of 12 K-blocks stay.
    let p = prepared(&linear(DType::F16, 1, 128, 768, 2304), &h);
    assert_eq!(families(&p)[0].0, "sm90_tc_gemm");
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
    let ampere = GpuTarget { compute_capability: (8, 0), ..h.clone() };
    let cases: [(Graph, GpuTarget, &str, &str); 3] = [
        // f32 without --allow-tf32: the exact SIMT template.
        (linear(DType::F32, 1, 64, 256, 512), h.clone(), "simt_f32_gemm", "are f32, not f16, bf16 or fp8"),
        (linear(DType::F16, 1, 64, 100, 512), h.clone(), "gemm", "not a multiple of 8"),
        // Without wgmma, the mma.sync family takes it.
        (linear(DType::F16, 1, 64, 256, 512), ampere, "sm80_mma_gemm", "compute capability 9.0"),
    ];
    for (g, t, family, want) in cases {
        let p = prepared(&g, &t);
        let f = families(&p);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].0, family, "{f:?}");
        let why = f[0].1.clone().unwrap_or_default();
        assert!(why.contains(want), "expected '{want}' in: {why}");
    }
}

/// Two convolutions with ReLUs over 16-bit `d`, NCHW as exported (two, so that the layout
/// pass makes the region channels-last): `c -> o` with a `k x k` kernel, then `o -> o` with a
/// `k2 x k2` one (stride 1).
fn conv(d: DType, n: usize, c: usize, hw: usize, o: usize, k: usize, stride: usize, k2: usize, w_input: bool) -> Graph {
    let mut g = Graph::new("conv");
    let mut y = g.add_input("x", TensorType::fixed(d, &[n, c, hw, hw]));
    for (i, (cin, k, stride)) in [(c, k, stride), (o, k2, 1)].into_iter().enumerate() {
        let shape = [o, cin, k, k];
        let w = if w_input { g.add_input(&format!("w{i}"), TensorType::fixed(d, &shape)) } else { konst(&mut g, &format!("w{i}"), d, &shape) };
        let b = konst(&mut g, &format!("b{i}"), d, &[o]);
        let window = tilec_ir::op::Window {
            kernel: vec![k, k],
            strides: vec![stride, stride],
            dilations: vec![1, 1],
            pads: tilec_ir::op::Padding::Explicit(vec![k / 2, k / 2, k / 2, k / 2]),
        };
        y = g.add(Op::Linalg(LinalgOp::Conv { window, group: 1, channels_last: false }), &[y, w, b]).unwrap();
        y = g.add(Op::Unary(UnaryOp::Relu), &[y]).unwrap();
    }
    g.set_outputs(vec![y]);
    g
}

#[test]
fn products_per_batch_and_head_take_the_mma_family() {
    let p = prepared(&heads(DType::F16), &GpuTarget::hopper());
    let f = families(&p);
    assert_eq!(f.len(), 2, "{f:?}");
    for (s, why) in &f {
        let why = why.clone().unwrap_or_default();
        assert_eq!(*s, "sm80_mma_gemm", "{why}");
        assert!(why.contains("batches split by 4 into two strides"), "{why}");
        assert!(why.contains("sm90_tc_gemm: batches split in two"), "{why}");
    }
    let p = prepared(&heads_out(DType::F16), &GpuTarget::hopper());
    let f = families(&p);
    assert_eq!(f.len(), 1, "{f:?}");
    let why = f[0].1.clone().unwrap_or_default();
    assert_eq!(f[0].0, "sm80_mma_gemm", "{why}");
    assert!(why.contains("A read as 2 groups of 16 rows x 4 slices of 64"), "{why}");
}

#[test]
fn sixteen_bit_convolutions_run_as_implicit_gemms_on_tensor_cores() {
    for (c, k, stride) in [(64, 3, 1), (3, 7, 2), (64, 1, 2)] {
        let p = prepared(&conv(DType::F16, 2, c, 16, 64, k, stride, 3, false), &GpuTarget::hopper());
        let on = |f: &str| p.kernels().iter().filter(|k| k.family.decision.family == f).collect::<Vec<_>>();
        let (mma, sm90) = (on("sm80_mma_gemm"), on("sm90_tc_gemm"));
        let all: Vec<String> = p.kernels().iter().map(|k| format!("{} {}", k.name, k.family.describe())).collect();
        // The first convolution reads the channels-first input through a fused transpose (the
        // mma.sync template gathers it); the second reads 64 channels-last channels, which the
        // Hopper template's im2col copy takes.
        assert_eq!((mma.len(), sm90.len()), (1, 1), "{all:#?}");
        let why = mma[0].family.describe();
        assert!(why.contains("implicit im2col") && why.contains(&format!("kernel {k}x{k}, stride {stride}x{stride}")), "{why}");
        let src = &mma[0].source.source;
        assert!(src.contains("mma.sync.aligned.m16n8k16") && src.contains("_repack("), "no mma or repack kernel");
        // Three input channels are padded to four (`pad-thin-channels`, a kernel of its own
        // with the transpose): the template copies whole 8-byte pixels.
        assert_eq!(src.contains("tl_cp8(dst"), c == 3, "{all:#?}");
        if c == 3 {
            assert!(why.contains("im2col of 2x16x16x4 (kernel 7x7"), "{why}");
            assert_eq!(p.kernels().len(), 3, "{all:#?}");
        }
        let why = sm90[0].family.describe();
        assert!(why.contains("implicit im2col") && why.contains("kernel 3x3, stride 1x1"), "{why}");
        let src = &sm90[0].source.source;
        assert!(src.contains(".im2col.mbarrier") && src.contains("wgmma.mma_async") && src.contains("_repack("), "no im2col copy");
        // Both templates hand the epilogue (bias, ReLU, f16 store) whole groups of 8 columns:
        // the bias moves as one 16-byte vector, and so does the store of the first
        // convolution's channels-last output (the second's is transposed to NCHW).
        for (k, store) in [(&mma[0], true), (&sm90[0], false)] {
            let src = &k.source.source;
            let vf = src.find("void tl_epi_v(").unwrap_or_else(|| panic!("no vector epilogue: {src}"));
            let body = &src[vf..vf + src[vf..].find("\n}\n").unwrap()];
            assert!(body.contains("reinterpret_cast<const uint4*>((&b"), "{body}");
            assert_eq!(body.contains("reinterpret_cast<uint4*>((&b"), store, "{body}");
            assert!(src.matches("tl_epi_v(").count() >= 2, "the vector epilogue is not called");
        }
    }
    // A 1x1 convolution of stride 1 is a plain product of its buffers on either template: the
    // mma.sync one for a shallow one into at most 64 channels, else the Hopper one.
    for o in [64, 256, 320] {
        let p = prepared(&conv(DType::F16, 2, 64, 12, o, 3, 1, 1, false), &GpuTarget::hopper());
        let k = p.kernels().into_iter().find(|k| k.family.describe().contains(&format!("x{o}x{o} batch"))).expect("the 1x1 kernel");
        let (why, src) = (k.family.describe(), &k.source.source);
        let fam = if o > 64 { "sm90_tc_gemm" } else { "sm80_mma_gemm" };
        assert_eq!(k.family.decision.family, fam, "{why}");
        assert!(!why.contains("im2col") && !src.contains("_repack(") && !src.contains(".im2col."), "{why}");
    }
    // Weights that are graph inputs cannot be repacked once: the tile-IR GEMM keeps them.
    let p = prepared(&conv(DType::F16, 2, 64, 16, 64, 3, 1, 3, true), &GpuTarget::hopper());
    let why: Vec<String> = p.kernels().iter().map(|k| k.family.describe()).collect();
    assert!(why.iter().any(|w| w.contains("weights are not a constant")), "{why:#?}");
}

/// A convolution with tiles for one and a half waves whose epilogue reads its bias runs in
/// two-block clusters without ping-pong (both warpgroups share each tile's epilogue).
#[test]
fn convolutions_with_a_bias_take_two_block_clusters() {
    let p = prepared(&conv(DType::F16, 64, 128, 28, 128, 3, 1, 3, false), &GpuTarget::hopper());
    let sm90: Vec<_> = p.kernels().into_iter().filter(|k| k.family.decision.family == "sm90_tc_gemm").collect();
    assert_eq!(sm90.len(), 1, "{:?}", p.kernels().iter().map(|k| k.family.describe()).collect::<Vec<_>>());
    let src = &sm90[0].source.source;
    assert!(src.contains("__cluster_dims__(2, 1, 1)"), "{}", sm90[0].family.describe());
    assert!(!src.contains("bar.sync %0, 256;"), "ping-pong: {}", sm90[0].family.describe());
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
        linear_kmajor(DType::F8E4M3, 256, 512, 384),
        linear_kmajor(DType::F32, 200, 100, 72),
    ]
    .iter()
    .enumerate()
    {
        let t = GpuTarget { allow_tf32: true, ..h };
        for k in prepared(g, &t).kernels() {
            if k.schedule == "sm90_tc_gemm" {
                modules.push((format!("m{i}_{}", k.name), k.source.source.clone()));
            }
        }
    }
    assert_eq!(modules.len(), 5);
    for (i, g) in [conv(DType::F16, 2, 64, 16, 64, 3, 1, 3, false), conv(DType::BF16, 2, 3, 32, 64, 7, 2, 3, false)].iter().enumerate() {
        for k in prepared(g, &h).kernels() {
            if k.schedule == "sm80_mma_gemm" || k.schedule == "sm90_tc_gemm" {
                modules.push((format!("c{i}_{}", k.name), k.source.source.clone()));
            }
        }
    }
    assert_eq!(modules.len(), 9);
    for (i, g) in [linear(DType::F32, 2, 96, 256, 200), heads(DType::F32), linear(DType::F32, 1, 1, 2048, 512)].iter().enumerate() {
        for k in prepared(g, &h).kernels() {
            if k.schedule == "simt_f32_gemm" {
                modules.push((format!("f{i}_{}", k.name), k.source.source.clone()));
            }
        }
    }
    for (i, g) in [linear(DType::BF16, 1, 16, 1024, 520), linear_kmajor(DType::F16, 1, 1000, 300)].iter().enumerate() {
        for k in prepared(g, &h).kernels() {
            if k.schedule == "sm80_gemv" {
                modules.push((format!("v{i}_{}", k.name), k.source.source.clone()));
            }
        }
    }
    assert_eq!(modules.len(), 15);
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
    // (model, length, kernels on the families at least, kernels off them at most): both exports
    // have 4 layers; every matrix product runs on a tensor-core family (attention's two per
    // layer on the FlashAttention family, below). BERT's q, k and v are one product
    // (`merge-products`), as GPT-2's are in its export: four products a layer in both.
    for (m, seq, families_min, off_max) in [
        ("gpt2", 16, 17, 0),
        ("bert", 16, 16, 0),
        ("gpt2", 128, 17, 0),
        ("bert", 128, 16, 0),
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
        // On a tensor-core family: the Hopper template, or the mma.sync one for the skinny
        // products the Hopper template passes to it.
        let tc = |s: &str| s == "sm90_tc_gemm" || s == "sm80_mma_gemm" || s == "sm80_gemv";
        let on: Vec<_> = f.iter().filter(|x| tc(x.0)).collect();
        let off: Vec<_> = f.iter().filter(|x| !tc(x.0)).collect();
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
        for k in p.kernels().iter().filter(|k| tc(k.schedule)) {
            modules.push((format!("{m}{seq}_{}", k.name), k.source.source.clone()));
        }
        // Each of the 4 layers' attention is one kernel on the FlashAttention family (GPT-2's
        // Q, K and V read in place as pieces of the fused projection's output).
        let p = prepare(&g, &flash_opts(), &GpuTarget::hopper()).unwrap();
        let att: Vec<_> = p.kernels().into_iter().filter(|k| k.name.contains("attention")).collect();
        let why: Vec<String> = att.iter().map(|k| format!("{} {}", k.schedule, k.family.describe())).collect();
        assert_eq!(att.len(), 4, "{m}: {why:#?}");
        assert!(att.iter().all(|k| k.schedule == "sm90_flash_attn"), "{m}: {why:#?} {:?}", p.report.decisions.iter().filter(|(n, _)| n.contains("attention")).map(|(_, d)| d.rejected.clone()).collect::<Vec<_>>());
    }
    if let Ok(nv) = tilec::cuda::Nvrtc::load() {
        let c = tilec::cuda::Compiler::new(nv, "sm_90a");
        for ((name, _), r) in modules.iter().zip(c.compile_many(&modules)) {
            let r = r.unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(r.image.starts_with(b"\x7fELF"), "{name}: not a cubin");
        }
    }
}

/// Random inputs for a graph's inputs (values in [-1, 1), fixed seed per input).
fn random_inputs(g: &Graph) -> Vec<Tensor> {
    g.inputs()
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let ty = &g.value(v).ty;
            let shape = ty.fixed_shape().unwrap();
            let n: usize = shape.iter().product();
            let mut s = 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(i as u64 + 1);
            let vals: Vec<f64> = (0..n)
                .map(|_| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    (s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
                })
                .collect();
            Tensor::from_f64s(ty.dtype, shape, &vals).unwrap()
        })
        .collect()
}

/// On a GPU: the mma.sync family's matrix products (forced, with split-K on a skinny one) and
/// implicit-GEMM convolutions (few channels read channels-first through a fused transpose,
/// strided, 1x1, ragged output channels) match the reference interpreter, outputs poisoned
/// first. Without a GPU, says so and passes.
#[test]
fn tensor_core_family_kernels_match_the_reference_on_a_gpu() {
    if !tilec::cuda::is_available() {
        eprintln!("note: no CUDA GPU; the mma family's kernels were not run");
        return;
    }
    let force = |op: &str| vec![(op.to_string(), "sm80_mma_gemm".to_string())];
    let cases: Vec<(&str, Graph, Vec<(String, String)>)> = vec![
        ("linear f16", linear(DType::F16, 2, 96, 256, 200), force("matmul")),
        ("linear bf16 m16 split-K", linear(DType::BF16, 1, 16, 2048, 512), force("matmul")),
        ("scores f16", scores(DType::F16), force("matmul")),
        ("heads f16", heads(DType::F16), vec![]),
        ("heads bf16", heads(DType::BF16), vec![]),
        ("heads out f16", heads_out(DType::F16), vec![]),
        // Convolutions: the first reads the channels-first input (mma.sync), the second 64 or
        // 128 channels-last ones (the Hopper template's im2col copy), except in the ragged one.
        ("conv 3x3", conv(DType::F16, 2, 64, 16, 64, 3, 1, 3, false), vec![]),
        ("conv 7x7 s2 c3", conv(DType::F16, 2, 3, 32, 64, 7, 2, 3, false), vec![]),
        ("conv 1x1 s2", conv(DType::BF16, 2, 64, 15, 128, 1, 2, 3, false), vec![]),
        ("conv 3x3 s2 o192", conv(DType::BF16, 3, 128, 13, 192, 3, 2, 3, false), vec![]),
        ("conv ragged", conv(DType::F16, 3, 24, 11, 40, 3, 1, 3, false), vec![]),
        ("conv 1x1 s1 K=256 (plain product)", conv(DType::F16, 2, 64, 14, 256, 3, 1, 1, false), vec![]),
        ("conv 1x1 s1 K=320 (plain product)", conv(DType::BF16, 2, 64, 12, 320, 3, 1, 1, false), vec![]),
    ];
    for (what, g, families) in cases {
        let opts = CudaOptions { families, ..CudaOptions::default() };
        let mut c = tilec::compiled_cuda::compile(&g, &opts).unwrap_or_else(|e| panic!("{what}: {e}"));
        let on = c.report.schedules.clone();
        let count = |f: &str| on.iter().find(|(s, _)| s == f).map_or(0, |(_, n)| *n);
        assert!(count("sm80_mma_gemm") > 0, "{what}: not on the family: {on:?}");
        if what.starts_with("conv") && what != "conv ragged" && !what.contains("K=256") {
            // The second convolution: the im2col copy, or a 1x1 deeper than 256 channels as a
            // plain product (a shallower one stays on mma.sync).
            assert_eq!(count("sm90_tc_gemm"), 1, "{what}: the second convolution is not on the Hopper template: {on:?}");
        }
        // A family kernel that failed to compile or load would run its fallback: not here.
        assert!(c.report.notes.is_empty(), "{what}: {:?}", c.report.notes);
        let inputs = random_inputs(&g);
        let want = tilec::reference::run(&g, inputs.clone()).unwrap_or_else(|e| panic!("{what}: {e}"));
        c.poison().unwrap();
        let got = c.run(&inputs).unwrap_or_else(|e| panic!("{what}: {e}"));
        for (w, gt) in want.iter().zip(&got) {
            let cmp = tilec::compare::compare(w, gt, 2e-2, 2e-2).unwrap();
            assert!(cmp.ok(), "{what}: max abs err {}, {} mismatches ({on:?})", cmp.max_abs, cmp.mismatches);
        }
    }
}

/// `x [m, k] · transpose(w [n, k])`: a column-major B (the nn.Linear weight layout).
fn linear_kmajor(d: DType, m: usize, k: usize, n: usize) -> Graph {
    let mut g = Graph::new("linear_kmajor");
    let x = g.add_input("x", TensorType::fixed(d, &[m, k]));
    let w = g.add_input("w", TensorType::fixed(d, &[n, k]));
    let wt = g.add(Op::Layout(LayoutOp::Transpose { perm: vec![1, 0] }), &[w]).unwrap();
    let y = g.add(Op::Linalg(LinalgOp::MatMul), &[x, wt]).unwrap();
    g.set_outputs(vec![y]);
    g
}

#[test]
fn f32_products_take_tf32_only_when_allowed_and_k_major() {
    let h = GpuTarget::hopper();
    let tf32 = GpuTarget { allow_tf32: true, ..h };
    // Not allowed: exact f32 on the SIMT GEMM, with the reason.
    let p = prepared(&linear_kmajor(DType::F32, 256, 512, 384), &h);
    let f = families(&p);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_ne!(f[0].0, "sm90_tc_gemm", "{f:?}");
    assert!(f[0].1.clone().unwrap_or_default().contains("--allow-tf32"), "{f:?}");
    // Allowed and K-major: the tensor-core family, multiplying as tf32.
    let p = prepared(&linear_kmajor(DType::F32, 256, 512, 384), &tf32);
    let f = families(&p);
    assert_eq!(f[0].0, "sm90_tc_gemm", "{f:?}");
    assert!(p.kernels()[0].source.source.contains(".f32.tf32.tf32"), "no tf32 wgmma");
    // Through the options as the CLI sets them.
    let opts = CudaOptions { allow_tf32: true, ..CudaOptions::default() };
    let p = prepare(&linear_kmajor(DType::F32, 256, 512, 384), &opts, &h).unwrap();
    assert_eq!(families(&p)[0].0, "sm90_tc_gemm");
    // Allowed but B row-major: refused (the tf32 wgmma has no transpose).
    let p = prepared(&linear(DType::F32, 1, 64, 256, 512), &tf32);
    let f = families(&p);
    assert_ne!(f[0].0, "sm90_tc_gemm", "{f:?}");
    assert!(f[0].1.clone().unwrap_or_default().contains("B column-major"), "{f:?}");
}

#[test]
fn fp8_products_take_the_family_when_k_major() {
    let h = GpuTarget::hopper();
    for (d, t) in [(DType::F8E4M3, "e4m3"), (DType::F8E5M2, "e5m2")] {
        let p = prepared(&linear_kmajor(d, 256, 512, 384), &h);
        assert_eq!(families(&p)[0].0, "sm90_tc_gemm", "{:?}", families(&p));
        let src = &p.kernels()[0].source.source;
        assert!(src.contains(&format!("k32.f32.{t}.{t}")), "no fp8 wgmma");
        assert!(!src.contains("ab_scale"), "an ONNX product has no scales");
        // A row-major B: refused, with the layout rule.
        let p = prepared(&linear(d, 1, 64, 256, 512), &h);
        let f = families(&p);
        assert_ne!(f[0].0, "sm90_tc_gemm", "{f:?}");
        assert!(f[0].1.clone().unwrap_or_default().contains("B column-major"), "{f:?}");
    }
}

/// A QKV projection split into Q, K and V (`x @ w + b`, reshaped, split in three): one
/// kernel, the split folded into the product's epilogue (no materialized product, no node by
/// node build), and that kernel, scheduled, computes what the lowered one does (tile
/// interpreter, outputs poisoned).
#[test]
fn a_split_projection_is_one_kernel_with_the_split_in_its_epilogue() {
    use tilec_tile::interp;
    for d in [DType::F32, DType::F16] {
        let mut g = Graph::new("qkv");
        let x = g.add_input("x", TensorType::fixed(d, &[2, 16, 64]));
        let w = konst(&mut g, "w", d, &[64, 192]);
        let b = konst(&mut g, "b", d, &[192]);
        let y = g.add(Op::Linalg(LinalgOp::MatMul), &[x, w]).unwrap();
        let y = g.add(Op::Binary(BinaryOp::Add), &[y, b]).unwrap();
        let sizes = vec![tilec_ir::Dim::Fixed(64); 3];
        let qkv = g.add_node("split", Op::Layout(LayoutOp::Split { axis: 2, sizes }), &[y]).unwrap();
        g.set_outputs(qkv);
        let p = prepared(&g, &GpuTarget::hopper());
        let names: Vec<String> = p.kernels().iter().map(|k| format!("{} {}", k.name, k.family.describe())).collect();
        assert_eq!(p.kernels().len(), 1, "{names:#?}");
        assert!(p.report.notes.is_empty(), "{:?}", p.report.notes);
        let k = &p.kernels()[0];
        let mut a: Vec<Tensor> = k
            .lowered
            .params
            .iter()
            .enumerate()
            .map(|(i, &pb)| {
                let buf = k.lowered.buf(pb);
                let shape: Vec<usize> = buf.shape.iter().map(|&s| s as usize).collect();
                let n: usize = shape.iter().product();
                let vals: Vec<f64> = if i < 3 { (0..n).map(|j| ((j * 37 + i * 11) % 23) as f64 / 23.0 - 0.5).collect() } else { vec![f64::NAN; n] };
                Tensor::from_f64s(buf.dtype, shape, &vals).unwrap()
            })
            .collect();
        let mut bb = a.clone();
        interp::run(&k.lowered, &mut a).unwrap();
        interp::run(&k.scheduled, &mut bb).unwrap();
        for i in 3..a.len() {
            let (x, y) = (a[i].to_f64_vec(), bb[i].to_f64_vec());
            assert!(x.iter().all(|v| v.is_finite()), "output {i} not written by the lowered kernel");
            for (p, q) in x.iter().zip(&y) {
                assert!((p - q).abs() <= 2e-2 * (1.0 + p.abs()), "{d:?} output {i}: lowered {p}, scheduled {q}");
            }
        }
    }
}

/// `x[:, 1:] @ w` for `x` [m, k + 1]: A starts one element into its buffer.
fn sliced(d: DType, m: usize, k: usize, n: usize) -> Graph {
    use tilec_ir::op::SliceBound;
    let mut g = Graph::new("sliced");
    let x = g.add_input("x", TensorType::fixed(d, &[m, k + 1]));
    let slice = LayoutOp::Slice { axes: vec![1], starts: vec![SliceBound::Index(1)], ends: vec![SliceBound::Index(k as i64 + 1)], steps: vec![1] };
    let xs = g.add(Op::Layout(slice), &[x]).unwrap();
    let w = konst(&mut g, "w", d, &[k, n]);
    let y = g.add(Op::Linalg(LinalgOp::MatMul), &[xs, w]).unwrap();
    g.set_outputs(vec![y]);
    g
}

/// f32 products without `--allow-tf32` take the exact SIMT template: a linear layer whose
/// batches flatten into one taller product (bias, GELU and residual in its epilogue), batched
/// products with a column-major B, attention's per (batch, head) products and its output
/// projection read across heads; with tf32 allowed, the Hopper template still comes first
/// where it applies and the SIMT template takes what it refuses.
#[test]
fn f32_products_take_the_simt_f32_family() {
    let h = GpuTarget::hopper();
    let cases: [(Graph, &str); 4] = [
        (linear(DType::F32, 4, 64, 256, 512), "256x512x256 batch 1 (4 batches of 64 rows flattened)"),
        (scores(DType::F32), "64x64x32 batch 8"),
        (heads(DType::F32), "batches split by 4 into two strides"),
        (heads_out(DType::F32), "A read as 2 groups of 16 rows x 4 slices of 64"),
    ];
    for (g, want) in cases {
        let p = prepared(&g, &h);
        let f = families(&p);
        assert!(!f.is_empty(), "{want}");
        for (s, why) in &f {
            let why = why.clone().unwrap_or_default();
            assert_eq!(*s, "simt_f32_gemm", "{why}");
            assert!(why.contains(want) && why.contains("exact f32 FMA"), "expected '{want}' in: {why}");
            assert!(why.contains("sm90_tc_gemm: operands are f32"), "{why}");
        }
        for k in p.kernels().iter().filter(|k| k.schedule == "simt_f32_gemm") {
            let src = &k.source.source;
            assert!(src.contains("__fmaf_rn") && src.contains("tl_epi("), "{}", k.name);
            assert!(!src.contains("tf32"), "{}", k.name);
            // The fallback is the tile-IR GEMM.
            assert_eq!(k.family.fallback.as_ref().map(|f| f.0), Some("gemm"));
        }
    }
    // The linear layer is one kernel: bias, GELU and residual in the epilogue.
    let p = prepared(&linear(DType::F32, 4, 64, 256, 512), &h);
    assert_eq!(p.kernels().len(), 1, "{:?}", p.kernels().iter().map(|k| &k.name).collect::<Vec<_>>());
    // tf32 allowed: K-major products go to the Hopper template as tf32, the others stay exact.
    let tf32 = GpuTarget { allow_tf32: true, ..h.clone() };
    let f = families(&prepared(&linear_kmajor(DType::F32, 256, 512, 384), &tf32));
    assert_eq!(f[0].0, "sm90_tc_gemm", "{f:?}");
    let f = families(&prepared(&linear(DType::F32, 1, 64, 256, 512), &tf32));
    assert_eq!(f[0].0, "simt_f32_gemm", "{f:?}");
    assert!(f[0].1.clone().unwrap_or_default().contains("B column-major"), "{f:?}");
    // An operand that starts one element into its buffer (refused by TMA) is read by scalars.
    let f = families(&prepared(&sliced(DType::F32, 64, 256, 128), &h));
    let why = f[0].1.clone().unwrap_or_default();
    assert_eq!(f[0].0, "simt_f32_gemm", "{why}");
    assert!(why.contains("1 and 4 floats per read of A and B"), "{why}");
    // A decode-shaped product splits K over blocks.
    let names = families(&prepared(&linear(DType::F32, 1, 1, 2048, 512), &h));
    assert!(names[0].1.clone().unwrap_or_default().contains("split-K"), "{names:?}");
}

/// On a GPU: f32 graphs through the SIMT f32 family (a linear layer with bias, GELU and a
/// residual, a ragged one, a decode-shaped one with K split over blocks, batched products
/// with a column-major B, attention's products per (batch, head)) match the reference
/// interpreter, outputs poisoned first. Without a GPU, says so and passes.
#[test]
fn simt_f32_family_kernels_match_the_reference_on_a_gpu() {
    if !tilec::cuda::is_available() {
        eprintln!("note: no CUDA GPU; the SIMT f32 family's kernels were not run");
        return;
    }
    let cases: Vec<(&str, Graph)> = vec![
        ("linear f32", linear(DType::F32, 2, 96, 256, 200)),
        ("linear f32 ragged", linear(DType::F32, 1, 37, 53, 29)),
        ("linear f32 m1 split-K", linear(DType::F32, 1, 1, 2048, 512)),
        ("scores f32", scores(DType::F32)),
        ("heads f32", heads(DType::F32)),
        ("heads out f32", heads_out(DType::F32)),
        ("sliced f32 (A misaligned)", sliced(DType::F32, 45, 100, 70)),
    ];
    for (what, g) in cases {
        let mut c = tilec::compiled_cuda::compile(&g, &CudaOptions::default()).unwrap_or_else(|e| panic!("{what}: {e}"));
        let on = c.report.schedules.clone();
        assert!(on.iter().any(|(s, n)| s == "simt_f32_gemm" && *n > 0), "{what}: not on the family: {on:?}");
        assert!(c.report.notes.is_empty(), "{what}: {:?}", c.report.notes);
        let inputs = random_inputs(&g);
        let want = tilec::reference::run(&g, inputs.clone()).unwrap_or_else(|e| panic!("{what}: {e}"));
        c.poison().unwrap();
        let got = c.run(&inputs).unwrap_or_else(|e| panic!("{what}: {e}"));
        for (w, gt) in want.iter().zip(&got) {
            let cmp = tilec::compare::compare(w, gt, 1e-4, 1e-4).unwrap();
            assert!(cmp.ok(), "{what}: max abs err {}, {} mismatches ({on:?})", cmp.max_abs, cmp.mismatches);
        }
    }
}

/// `x [m, k] · transpose(w [n, k]) + bias`: the `nn.Linear` layout, a column-major B read
/// directly (the weight a graph input, so that constant folding does not transpose it).
fn linear_nk_bias(d: DType, m: usize, k: usize, n: usize) -> Graph {
    let mut g = Graph::new("linear_nk");
    let x = g.add_input("x", TensorType::fixed(d, &[m, k]));
    let w = g.add_input("w", TensorType::fixed(d, &[n, k]));
    let wt = g.add(Op::Layout(LayoutOp::Transpose { perm: vec![1, 0] }), &[w]).unwrap();
    let y = g.add(Op::Linalg(LinalgOp::MatMul), &[x, wt]).unwrap();
    let b = konst(&mut g, "b", d, &[n]);
    let y = g.add(Op::Binary(BinaryOp::Add), &[y, b]).unwrap();
    g.set_outputs(vec![y]);
    g
}

/// `x [m, k] · w [k, n]` with the weight a graph input: a row-major B that is not a constant.
fn linear_kn_input(d: DType, m: usize, k: usize, n: usize) -> Graph {
    let mut g = Graph::new("linear_kn");
    let x = g.add_input("x", TensorType::fixed(d, &[m, k]));
    let w = g.add_input("w", TensorType::fixed(d, &[k, n]));
    let y = g.add(Op::Linalg(LinalgOp::MatMul), &[x, w]).unwrap();
    g.set_outputs(vec![y]);
    g
}

#[test]
fn decode_shaped_products_take_the_gemv_family() {
    let h = GpuTarget::hopper();
    // A constant row-major weight (GPT-2's Conv1D): repacked at bind; bias, GELU and the
    // residual in the epilogue.
    for (m, k, n) in [(16, 1024, 520), (1, 2048, 300)] {
        let p = prepared(&linear(DType::BF16, 1, m, k, n), &h);
        let f = families(&p);
        assert_eq!(f.len(), 1, "{f:?}");
        let why = f[0].1.clone().unwrap_or_default();
        assert_eq!(f[0].0, "sm80_gemv", "{why}");
        assert!(why.contains(&format!("{m}x{n}x{k} batch 1")) && why.contains("B repacked"), "{why}");
        assert_eq!(p.kernels().len(), 1);
        let src = &p.kernels()[0].source.source;
        assert!(src.contains("mma.sync.aligned.m16n8k16") && src.contains("_repack(") && src.contains("tl_epi("));
    }
    // Batches of rows against one weight, 4 x 4 rows: one product of 16 rows (the lowering
    // folds a batch of products of fewer than 16 rows sharing a 2-D weight into one).
    let p = prepared(&linear(DType::F16, 4, 4, 512, 256), &h);
    let why = families(&p)[0].1.clone().unwrap_or_default();
    assert_eq!(families(&p)[0].0, "sm80_gemv", "{why}");
    assert!(why.contains("16x256x512 batch 1"), "{why}");
    // The nn.Linear layout: read directly.
    let p = prepared(&linear_nk_bias(DType::F16, 16, 1000, 300), &h);
    let why = families(&p)[0].1.clone().unwrap_or_default();
    assert_eq!(families(&p)[0].0, "sm80_gemv", "{why}");
    assert!(why.contains("B col-major") && !why.contains("repacked"), "{why}");
    // A row-major weight that is not a constant cannot be repacked once: another family,
    // with the reason.
    let p = prepared(&linear_kn_input(DType::F16, 16, 512, 256), &h);
    let why = families(&p)[0].1.clone().unwrap_or_default();
    assert_ne!(families(&p)[0].0, "sm80_gemv", "{why}");
    assert!(why.contains("sm80_gemv: B is row-major and not a constant"), "{why}");
    // More than 16 rows: the GEMM templates.
    let p = prepared(&linear(DType::F16, 1, 17, 512, 256), &h);
    assert_ne!(families(&p)[0].0, "sm80_gemv");
}

/// On a GPU: the GEMV family's kernels (16 rows and one row, ragged N, both weight layouts,
/// bias and activation in the epilogue) match the reference interpreter, outputs poisoned
/// first. Without a GPU, says so and passes.
#[test]
fn gemv_family_kernels_match_the_reference_on_a_gpu() {
    if !tilec::cuda::is_available() {
        eprintln!("note: no CUDA GPU; the GEMV family's kernels were not run");
        return;
    }
    let cases: Vec<(&str, Graph)> = vec![
        ("m16 constant [k, n] bf16", linear(DType::BF16, 1, 16, 1024, 520)),
        ("m1 constant [k, n] f16", linear(DType::F16, 1, 1, 2048, 300)),
        ("m16 [n, k] f16", linear_nk_bias(DType::F16, 16, 1000, 300)),
        ("m1 [n, k] bf16", linear_nk_bias(DType::BF16, 1, 4096, 1030)),
        ("4 x 4 rows flattened", linear(DType::F16, 4, 4, 512, 256)),
    ];
    for (what, g) in cases {
        let mut c = tilec::compiled_cuda::compile(&g, &CudaOptions::default()).unwrap_or_else(|e| panic!("{what}: {e}"));
        let on = c.report.schedules.clone();
        assert!(on.iter().any(|(s, n)| s == "sm80_gemv" && *n > 0), "{what}: not on the family: {on:?}");
        assert!(c.report.notes.is_empty(), "{what}: {:?}", c.report.notes);
        let inputs = random_inputs(&g);
        let want = tilec::reference::run(&g, inputs.clone()).unwrap_or_else(|e| panic!("{what}: {e}"));
        c.poison().unwrap();
        // Twice: split-K counters must be back at zero, and the repacked weights reused.
        for _ in 0..2 {
            let got = c.run(&inputs).unwrap_or_else(|e| panic!("{what}: {e}"));
            for (w, gt) in want.iter().zip(&got) {
                let cmp = tilec::compare::compare(w, gt, 2e-2, 2e-2).unwrap();
                assert!(cmp.ok(), "{what}: max abs err {}, {} mismatches ({on:?})", cmp.max_abs, cmp.mismatches);
            }
        }
    }
}

/// GPT-2's Conv1D as exported: `x [b, s, e]` viewed as `[b * s, e]`, times a constant weight,
/// plus a bias, viewed back as `[b, s, 3e]` and split into Q, K and V. The whole group is one
/// GEMM kernel on the GPU: the split, the bias and the reshape of the rows (row `b * s + t`
/// back to `(b, t)`) fold into the epilogue. The folded kernel computes what the lowered group
/// does (both run on the tile-IR interpreter), and the group builds whole.
#[test]
fn reshaped_and_split_projection_folds_into_one_gemm_kernel() {
    use tilec_ir::Dim::Fixed;
    let (b, s, e) = (2usize, 6usize, 8usize);
    let mut g = Graph::new("conv1d");
    let x = g.add_input("x", TensorType::fixed(DType::F32, &[b, s, e]));
    let r = g.add(Op::Layout(LayoutOp::Reshape { shape: vec![Fixed(b * s), Fixed(e)] }), &[x]).unwrap();
    let w = konst(&mut g, "w", DType::F32, &[e, 3 * e]);
    let y = g.add(Op::Linalg(LinalgOp::MatMul), &[r, w]).unwrap();
    let bias = konst(&mut g, "bias", DType::F32, &[3 * e]);
    let y = g.add(Op::Binary(BinaryOp::Add), &[y, bias]).unwrap();
    let y = g.add(Op::Layout(LayoutOp::Reshape { shape: vec![Fixed(b), Fixed(s), Fixed(3 * e)] }), &[y]).unwrap();
    let outs = g.add_node("split", Op::Layout(LayoutOp::Split { axis: 2, sizes: vec![Fixed(e); 3] }), &[y]).unwrap();
    g.set_outputs(outs);
    let mut opt = g.clone();
    tilec_opt::manager::Pipeline::for_level_and_target(3, tilec_opt::target::TargetKind::Cuda)
        .run(&mut opt, &tilec_opt::manager::PipelineOptions::default())
        .unwrap();
    let part = tilec_opt::partition::partition(&opt, &tilec_opt::partition::Target::preset(tilec_opt::target::TargetKind::Cuda));
    let grp = part.groups.iter().find(|grp| grp.nodes.iter().any(|&n| matches!(opt.node(n).op, Op::Linalg(LinalgOp::MatMul)))).unwrap();
    let p = tilec_tile::family::Problem::of_group(&opt, grp, "k");
    let k = p.lower(tilec_tile::lower::LowerOptions::default()).unwrap().kernel;
    assert!(k.body.len() > 1, "the group lowers to a product and a consumer nest:\n{k}");
    let fused = tilec::cuda::schedule::fuse_scratch_epilogue(&k).unwrap_or_else(|| panic!("not folded:\n{k}"));
    assert_eq!(fused.body.len(), 1, "{fused}");
    let args = |k: &tilec_tile::Kernel| -> Vec<Tensor> {
        k.params
            .iter()
            .enumerate()
            .map(|(i, &bf)| {
                let buf = k.buf(bf);
                let shape: Vec<usize> = buf.shape.iter().map(|&d| d as usize).collect();
                let vals: Vec<f64> = (0..buf.numel() as usize).map(|j| ((j * 37 + i * 11) % 29) as f64 / 8.0 - 1.7).collect();
                Tensor::from_f64s(buf.dtype, shape, &vals).unwrap()
            })
            .collect()
    };
    let (mut want, mut got) = (args(&k), args(&fused));
    tilec_tile::interp::run(&k, &mut want).unwrap();
    tilec_tile::interp::run(&fused, &mut got).unwrap();
    for (w, gt) in want.iter().zip(&got) {
        assert_eq!(w.to_f64_vec(), gt.to_f64_vec(), "the folded kernel differs:\n{fused}");
    }
    // On the Hopper target the group is one template kernel (no node-by-node split).
    let prep = prepared(&to_f16(&g), &GpuTarget::hopper());
    assert_eq!(prep.kernels().len(), 1, "{:?}", prep.kernels().iter().map(|k| &k.name).collect::<Vec<_>>());
    assert_eq!(prep.report.split_groups, 0);
}

/// Attention as exporters spell it: `[batch, seq, heads * dim]` Q, K and V split into heads
/// (reshape, transpose), `softmax(q @ kt * scale [masked]) @ v`, merged back. `mask`: a
/// constant lower-triangular bool mask (causal: the op's `is_causal`) or a `[batch, 1, s, s]`
/// bool input (read in place, with a fully masked row when the caller makes one).
fn attention_graph(d: DType, b: usize, s: usize, h: usize, dh: usize, mask: Option<&str>) -> Graph {
    use tilec_ir::op::NormOp;
    let mut g = Graph::new("attention");
    let e = h * dh;
    // Q, K and V as separate inputs, or (`mask` "qkv") pieces of one `[b, s, 3e]` input split
    // along its last axis, as GPT-2's fused projection leaves them.
    let pieces = (mask == Some("qkv")).then(|| {
        let x = g.add_input("qkv", TensorType::fixed(d, &[b, s, 3 * e]));
        let sizes = vec![tilec_ir::Dim::Fixed(e); 3];
        g.add_node("split_qkv", Op::Layout(LayoutOp::Split { axis: 2, sizes }), &[x]).unwrap()
    });
    let mask = mask.filter(|m| *m != "qkv");
    let split = |g: &mut Graph, name: &str, perm: Vec<usize>| {
        let x = match &pieces {
            Some(p) => p[["q", "k", "v"].iter().position(|n| *n == name).unwrap()],
            None => g.add_input(name, TensorType::fixed(d, &[b, s, e])),
        };
        let shape = [b, s, h, dh].map(tilec_ir::Dim::Fixed).to_vec();
        let r = g.add(Op::Layout(LayoutOp::Reshape { shape }), &[x]).unwrap();
        g.add(Op::Layout(LayoutOp::Transpose { perm }), &[r]).unwrap()
    };
    let q = split(&mut g, "q", vec![0, 2, 1, 3]);
    let kt = split(&mut g, "k", vec![0, 2, 3, 1]);
    let v = split(&mut g, "v", vec![0, 2, 1, 3]);
    let sc = g.add(Op::Linalg(LinalgOp::MatMul), &[q, kt]).unwrap();
    let c = g.add_const("scale", Tensor::from_f64s(d, vec![], &[1.0 / (dh as f64).sqrt()]).unwrap());
    let mut sc = g.add(Op::Binary(BinaryOp::Mul), &[sc, c]).unwrap();
    if let Some(kind) = mask {
        let keep = if kind == "causal" {
            let vals: Vec<f64> = (0..s * s).map(|i| ((i % s) <= (i / s)) as u8 as f64).collect();
            g.add_const("causal", Tensor::from_f64s(DType::Bool, vec![1, 1, s, s], &vals).unwrap())
        } else {
            g.add_input("keep", TensorType::fixed(DType::Bool, &[b, 1, s, s]))
        };
        let ninf = g.add_const("ninf", Tensor::from_f64s(d, vec![], &[f64::NEG_INFINITY]).unwrap());
        sc = g.add(Op::Where, &[keep, sc, ninf]).unwrap();
    }
    let p = g.add(Op::Norm(NormOp::Softmax { axis: 3 }), &[sc]).unwrap();
    let o = g.add(Op::Linalg(LinalgOp::MatMul), &[p, v]).unwrap();
    let o = g.add(Op::Layout(LayoutOp::Transpose { perm: vec![0, 2, 1, 3] }), &[o]).unwrap();
    let shape = [b, s, e].map(tilec_ir::Dim::Fixed).to_vec();
    let o = g.add(Op::Layout(LayoutOp::Reshape { shape }), &[o]).unwrap();
    g.set_outputs(vec![o]);
    g
}

fn flash_opts() -> CudaOptions {
    CudaOptions { flash_attention: true, ..CudaOptions::default() }
}

/// Turned off, attention on CUDA is not recognized (products and a softmax); by default the
/// attention kernel takes the FlashAttention family, reading Q, K and V in their
/// `[batch, seq, heads * dim]` layout and storing O in it. Attention the family does not take
/// (f32, head dim 32) keeps the unfused path.
#[test]
fn attention_takes_the_flash_family_unless_turned_off() {
    let h = GpuTarget::hopper();
    let names = |p: &Prepared| p.kernels().iter().map(|k| k.schedule).collect::<Vec<_>>();
    for (what, g) in [
        ("plain", attention_graph(DType::F16, 2, 80, 4, 64, None)),
        ("causal", attention_graph(DType::BF16, 1, 70, 2, 128, Some("causal"))),
        ("bool mask", attention_graph(DType::F16, 2, 33, 2, 64, Some("input"))),
        ("split qkv", attention_graph(DType::BF16, 2, 45, 3, 64, Some("qkv"))),
    ] {
        let off = prepare(&g, &CudaOptions { flash_attention: false, ..CudaOptions::default() }, &h).unwrap();
        assert!(!names(&off).iter().any(|n| is_flash(n)), "{what}: {:?}", names(&off));
        assert!(off.kernels().len() >= 2, "{what}: attention is products and a softmax by default: {:?}", names(&off));
        let on = prepare(&g, &flash_opts(), &h).unwrap();
        let flash: Vec<_> = on.kernels().iter().filter(|k| k.schedule == "sm90_flash_attn").collect();
        assert_eq!(flash.len(), 1, "{what}: {:?} {:?}", names(&on), on.report.fallbacks);
        let desc = flash[0].family.describe();
        eprintln!("{what}: {desc}");
        assert!(desc.contains("sm90_flash_attn attention"), "{desc}");
        if what == "causal" {
            assert!(desc.contains("causal TopLeft"), "{desc}");
        }
        if what == "bool mask" {
            assert!(desc.contains("Bool mask"), "{desc}");
        }
        // The layouts are read in place: Q's rows are heads * dim apart.
        let src = &flash[0].source.source;
        assert!(src.contains("wgmma.mma_async.sync.aligned.m64n") && !src.contains("mma.sync"), "{what}");
        // Before Hopper, the mma.sync kernel.
        let ampere = GpuTarget { compute_capability: (8, 0), ..h.clone() };
        let old = prepare(&g, &flash_opts(), &ampere).unwrap();
        let f80: Vec<_> = old.kernels().iter().filter(|k| k.schedule == "sm80_flash_attn").collect();
        assert_eq!(f80.len(), 1, "{what}: {:?}", names(&old));
        assert!(f80[0].source.source.contains("mma.sync.aligned.m16n8k16"), "{what}");
        let (e, qe) = match what {
            "causal" | "plain" => (256, 256),
            "split qkv" => (192, 576),
            _ => (128, 128),
        };
        assert!(src.contains(&format!("(long long)(m0 + r) * {qe} + c * 8")), "{what}: Q rows not {qe} apart");
        assert!(src.contains(&format!("Og + (long long)qi * {e}")), "{what}: O rows not {e} apart");
        if what == "split qkv" {
            // K and V start 192 and 384 elements into the one buffer.
            assert!(src.contains(" + 384)") && src.contains(" + 768)"), "{what}: no piece offsets");
        }
    }
    // Not taken: recognized attention stays what it is today.
    for (what, g) in [("f32", attention_graph(DType::F32, 1, 16, 2, 64, None)), ("head dim 32", attention_graph(DType::F16, 1, 16, 2, 32, None))] {
        let on = prepare(&g, &flash_opts(), &h).unwrap();
        assert!(!names(&on).iter().any(|n| is_flash(n)), "{what}: {:?}", names(&on));
        assert!(on.kernels().len() >= 2, "{what}: {:?}", names(&on));
    }
    // Before sm_80 the family refuses with the reason, and attention stays products and a
    // softmax (the report's note gives the family's reason).
    let old = GpuTarget { compute_capability: (7, 5), ..h };
    let g = attention_graph(DType::F16, 1, 16, 2, 64, None);
    let on = prepare(&g, &flash_opts(), &old).unwrap();
    assert!(!names(&on).iter().any(|n| is_flash(n)) && on.kernels().len() >= 2, "{:?}", names(&on));
    let note = on.report.notes.iter().find(|(_, n)| n.contains("attention kept")).expect("a note on attention");
    assert!(note.1.contains("8.0"), "{note:?}");
}

/// Recognized attention that the FlashAttention family does not get (here: another family
/// forced on it) would run on a direct nest: the graph is prepared again with attention kept
/// as products and a softmax, and the report says why.
#[test]
fn attention_the_flash_family_does_not_take_stays_unfused() {
    let g = attention_graph(DType::F16, 2, 80, 4, 64, None);
    let opts = CudaOptions { families: vec![("attention".into(), "cuda.direct".into())], ..CudaOptions::default() };
    let p = prepare(&g, &opts, &GpuTarget::hopper()).unwrap();
    let names: Vec<_> = p.kernels().iter().map(|k| k.schedule).collect();
    assert!(!names.iter().any(|n| is_flash(n)) && !names.contains(&"direct"), "{names:?}");
    assert!(names.iter().filter(|s| s.contains("gemm")).count() >= 2, "{names:?}");
    assert!(p.report.notes.iter().any(|(_, n)| n.contains("attention kept as products and a softmax")), "{:?}", p.report.notes);
}

/// On a GPU: attention on the FlashAttention family matches the reference
/// interpreter, outputs poisoned first: head dims 64 and 128, causal, a bool mask input with a
/// fully masked row, ragged lengths. Without a GPU, says so and passes.
#[test]
fn flash_attention_kernels_match_the_reference_on_a_gpu() {
    if !tilec::cuda::is_available() {
        eprintln!("note: no CUDA GPU; the FlashAttention family's kernels were not run");
        return;
    }
    let cases = [
        ("f16 d64", attention_graph(DType::F16, 2, 80, 4, 64, None)),
        ("bf16 d128 causal", attention_graph(DType::BF16, 1, 77, 2, 128, Some("causal"))),
        ("f16 d64 bool mask", attention_graph(DType::F16, 2, 33, 2, 64, Some("input"))),
        ("bf16 d64 split qkv", attention_graph(DType::BF16, 2, 45, 3, 64, Some("qkv"))),
    ];
    for (what, g) in cases {
        let mut c = tilec::compiled_cuda::compile(&g, &flash_opts()).unwrap_or_else(|e| panic!("{what}: {e}"));
        let on = c.report.schedules.clone();
        assert!(on.iter().any(|(s, n)| s == "sm90_flash_attn" && *n == 1), "{what}: not on the family: {on:?}");
        assert!(c.report.notes.is_empty(), "{what}: {:?}", c.report.notes);
        let mut inputs = random_inputs(&g);
        if let Some(keep) = inputs.iter_mut().find(|t| t.dtype() == DType::Bool) {
            // Keep about three keys in four; row 5 of every batch fully masked.
            let shape = keep.shape().to_vec();
            let s = shape[3];
            let vals: Vec<f64> = (0..keep.numel()).map(|i| if (i / s) % s == 5 || (i * 7919) % 4 == 0 { 0.0 } else { 1.0 }).collect();
            *keep = Tensor::from_f64s(DType::Bool, shape, &vals).unwrap();
        }
        let mut want = tilec::reference::run(&g, inputs.clone()).unwrap_or_else(|e| panic!("{what}: {e}"));
        if what.contains("mask") {
            // The softmax over a fully masked row is NaN in the graph; the recognized Attention
            // op gives zeros there (as ONNX Attention specifies; see the recognizer's notes).
            for w in &mut want {
                let vals: Vec<f64> = w.to_f64_vec().iter().map(|v| if v.is_nan() { 0.0 } else { *v }).collect();
                assert!(vals.len() > 4 * 64, "{what}");
                *w = Tensor::from_f64s(w.dtype(), w.shape().to_vec(), &vals).unwrap();
            }
        }
        c.poison().unwrap();
        let got = c.run(&inputs).unwrap_or_else(|e| panic!("{what}: {e}"));
        for (w, gt) in want.iter().zip(&got) {
            let cmp = tilec::compare::compare(w, gt, 2e-2, 2e-2).unwrap();
            assert!(cmp.ok(), "{what}: max abs err {}, {} mismatches ({on:?})", cmp.max_abs, cmp.mismatches);
        }
    }
}

/// An output whose rows are not 16-byte aligned (N = 1003, as a 50257-token vocabulary) keeps
/// the element-wise staged epilogue (a warp's lanes over adjacent columns of one row): a
/// vector epilogue would store lane by lane into scattered, partly written sectors. With
/// N = 1024 the vector epilogue is used. On a GPU both match the reference. (K = 256: four
/// K-blocks, which keep the product on the Hopper template despite its few tiles.)
#[test]
fn unaligned_output_rows_keep_the_element_wise_epilogue() {
    let h = GpuTarget::hopper();
    for (n, vector) in [(1003, false), (1024, true)] {
        let g = linear_nk_bias(DType::F16, 256, 256, n);
        let p = prepared(&g, &h);
        let f = families(&p);
        assert_eq!(f[0].0, "sm90_tc_gemm", "n {n}: {f:?}");
        let src = &p.kernels()[0].source.source;
        assert_eq!(src.contains("tl_epi_v("), vector, "n {n}: vector epilogue present: {}", src.contains("tl_epi_v("));
        if tilec::cuda::is_available() {
            let mut c = tilec::compiled_cuda::compile(&g, &CudaOptions::default()).unwrap_or_else(|e| panic!("n {n}: {e}"));
            let inputs = random_inputs(&g);
            let want = tilec::reference::run(&g, inputs.clone()).unwrap();
            c.poison().unwrap();
            let got = c.run(&inputs).unwrap();
            let cmp = tilec::compare::compare(&want[0], &got[0], 2e-2, 2e-2).unwrap();
            assert!(cmp.ok(), "n {n}: max abs err {}, {} mismatches", cmp.max_abs, cmp.mismatches);
        }
    }
}

/// A plain product with rows not 16-byte aligned (N = 1031 in 16 bits, as GPT-2's LM head over
/// 50257 ids) goes straight into C through the Hopper template's built-in epilogue, which
/// stores each row of an interior tile as realigned whole 16-byte vectors; over 640 rows the
/// tiles cover every offset from alignment. On a GPU it matches the reference (output poisoned
/// first), in f16 and bf16.
#[test]
fn unaligned_plain_products_store_whole_rows() {
    let h = GpuTarget::hopper();
    for d in [DType::F16, DType::BF16] {
        let g = linear_kmajor(d, 640, 320, 1031);
        let p = prepared(&g, &h);
        let f = families(&p);
        assert_eq!(f[0].0, "sm90_tc_gemm", "{f:?}");
        let src = &p.kernels()[0].source.source;
        assert!(src.contains("tl_shift_halves(tl_a, tl_b, tl_s)"), "no row stores in the kernel");
        assert!(!src.contains("tl_epi("), "an epilogue function where the built-in one stores");
        matches_reference_on_a_gpu(d.name(), &g);
    }
}

/// On a GPU: `g` compiled with the default options (no family kernel falling back) matches the
/// reference interpreter on random inputs, its output poisoned first. Nothing without one.
fn matches_reference_on_a_gpu(what: &str, g: &Graph) {
    if !tilec::cuda::is_available() {
        return;
    }
    let mut c = tilec::compiled_cuda::compile(g, &CudaOptions::default()).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(c.report.notes.is_empty(), "{what}: {:?}", c.report.notes);
    let inputs = random_inputs(g);
    let want = tilec::reference::run(g, inputs.clone()).unwrap();
    c.poison().unwrap();
    let got = c.run(&inputs).unwrap();
    let cmp = tilec::compare::compare(&want[0], &got[0], 2e-2, 2e-2).unwrap();
    assert!(cmp.ok(), "{what}: max abs err {}, {} mismatches", cmp.max_abs, cmp.mismatches);
}

/// `gelu_tanh(x @ w + b)` over `d` (GPT-2's MLP up-projection).
fn linear_gelu_tanh(d: DType, m: usize, k: usize, n: usize) -> Graph {
    let mut g = Graph::new("linear_gelu_tanh");
    let x = g.add_input("x", TensorType::fixed(d, &[m, k]));
    let w = konst(&mut g, "w", d, &[k, n]);
    let b = konst(&mut g, "b", d, &[n]);
    let y = g.add(Op::Linalg(LinalgOp::MatMul), &[x, w]).unwrap();
    let y = g.add(Op::Binary(BinaryOp::Add), &[y, b]).unwrap();
    let y = g.add(Op::Unary(UnaryOp::Gelu { tanh_approx: true }), &[y]).unwrap();
    g.set_outputs(vec![y]);
    g
}

/// A product's GELU in its tanh form takes the two-special-function form (x times a sigmoid)
/// where the kernel writes 16-bit results, and `tanhf` where it writes f32 (the exact-f32
/// family's epilogue). On a GPU both match the reference.
#[test]
fn tanh_gelu_epilogues_take_the_fast_form_for_sixteen_bit_outputs() {
    let h = GpuTarget::hopper();
    for d in [DType::F16, DType::BF16, DType::F32] {
        let g = linear_gelu_tanh(d, 256, 192, 320);
        let p = prepared(&g, &h);
        let f = families(&p);
        assert_eq!(p.kernels().len(), 1, "{f:?}");
        let narrow = d != DType::F32;
        assert_eq!(f[0].0, if narrow { "sm90_tc_gemm" } else { "simt_f32_gemm" }, "{} {f:?}", d.name());
        let src = &p.kernels()[0].source.source;
        assert_eq!(src.contains("tl_gelu_tanh_fast(("), narrow, "{}: fast GELU in the epilogue", d.name());
        assert_eq!(src.contains("tl_gelu_tanh(("), !narrow, "{}: tanhf GELU in the epilogue", d.name());
        matches_reference_on_a_gpu(d.name(), &g);
    }
}

/// Whether a schedule is one of the FlashAttention families.
fn is_flash(schedule: &str) -> bool {
    schedule.ends_with("_flash_attn")
}

/// `cast(x, f32) · transpose(cast(w, f32))` over 16-bit inputs: an f32 product whose operands
/// are read from 16-bit buffers.
fn upcast_linear(d: DType, m: usize, k: usize, n: usize) -> Graph {
    let mut g = Graph::new("upcast_linear");
    let x = g.add_input("x", TensorType::fixed(d, &[m, k]));
    let w = g.add_input("w", TensorType::fixed(d, &[n, k]));
    let cast = Op::Cast { to: DType::F32, saturate: false };
    let x = g.add(cast.clone(), &[x]).unwrap();
    let w = g.add(cast, &[w]).unwrap();
    let wt = g.add(Op::Layout(LayoutOp::Transpose { perm: vec![1, 0] }), &[w]).unwrap();
    let y = g.add(Op::Linalg(LinalgOp::MatMul), &[x, wt]).unwrap();
    g.set_outputs(vec![y]);
    g
}

/// The Hopper template's epilogue runs from registers, regrouped by warp shuffles (8 adjacent
/// columns a lane, handed to the model's vector epilogue function), for 16-bit, f32 (over
/// operands cast up from 16 bits), fp8 and tf32 products alike; where N is not a multiple of 8
/// (no vector function) it is staged. The mma.sync template's staged tile parks a 16-bit
/// MatMul's products in its own dtype (the epilogue rounds them to it first: the graph's
/// MatMul output), f32 for a convolution's.
#[test]
fn sixteen_bit_products_park_in_sixteen_bits() {
    let h = GpuTarget::hopper();
    let sm90 = |g: &Graph, t: &GpuTarget| -> Vec<String> {
        prepared(g, t).kernels().iter().filter(|k| k.schedule == "sm90_tc_gemm").map(|k| k.source.source.clone()).collect()
    };
    for d in [DType::F16, DType::BF16] {
        let srcs = sm90(&linear(d, 4, 64, 256, 512), &h);
        assert_eq!(srcs.len(), 1);
        assert!(srcs[0].contains("tl_quad_swap(tl_x0, tl_x1") && srcs[0].contains("_sx"), "{d:?}");
        assert!(!srcs[0].contains("float* tl_st =") && !srcs[0].contains("tl_pack_"), "{d:?}");
        // N = 390 with a bias: no vector function, so the staged epilogue, read back a row at
        // a time (parked f32: 16-bit parking measured slower without the vector read-back).
        let srcs = sm90(&linear_nk_bias(d, 256, 512, 390), &h);
        assert_eq!(srcs.len(), 1);
        assert!(srcs[0].contains("float* tl_st =") && !srcs[0].contains("tl_pack_") && !srcs[0].contains("tl_quad_swap(tl_x"), "{d:?}");
        // The plain product: the built-in epilogue, shuffled, with row stores for C's
        // unaligned rows.
        let srcs = sm90(&linear_kmajor(d, 256, 512, 390), &h);
        assert_eq!(srcs.len(), 1);
        assert!(srcs[0].contains("tl_quad_swap(tl_x0, tl_x1") && srcs[0].contains("tl_shift_halves(tl_a"), "{d:?}");
    }
    let tf32 = GpuTarget { allow_tf32: true, ..h };
    let mut seen = 0;
    for g in [upcast_linear(DType::F16, 256, 512, 384), linear_kmajor(DType::F8E4M3, 256, 512, 384), linear_kmajor(DType::F32, 256, 512, 384)] {
        for src in sm90(&g, &tf32) {
            seen += 1;
            assert!(!src.contains("tl_pack_") && src.contains("tl_quad_swap(tl_x0, tl_x1"), "{}", g.name);
        }
    }
    // All three are the template's (the cast-up operands read straight from 16-bit buffers).
    assert_eq!(seen, 3);
    // The mma.sync template likewise (a short product split over K there); a convolution's
    // own bias is added to the f32 sum before the one rounding of its output, so it parks f32.
    let mma = |g: &Graph| -> Vec<String> {
        prepared(g, &h).kernels().iter().filter(|k| k.schedule == "sm80_mma_gemm").map(|k| k.source.source.clone()).collect()
    };
    let srcs = mma(&linear(DType::BF16, 1, 128, 3072, 768));
    assert_eq!(srcs.len(), 1);
    assert!(srcs[0].contains("tl_pack_bf16x2(acc"));
    let srcs = mma(&conv(DType::BF16, 2, 3, 32, 64, 7, 2, 3, false));
    assert_eq!(srcs.len(), 1);
    assert!(!srcs[0].contains("tl_pack_") && srcs[0].contains("float* tl_stage"));
}
