//! `paged_attention` on the CUDA path: which graphs the paged decode family
//! (`sm80_paged_attn`) takes and why it refuses the others (no GPU needed); on a GPU, the
//! compiled graphs against the interpreter — ragged past lengths, GQA and MQA, several new
//! tokens, shuffled block tables, outputs poisoned, the caches updated in place or copied
//! when the old cache is read again.

use tilec::compiled_cuda::{prepare, CudaOptions, Prepared};
use tilec::cuda::GpuTarget;
use tilec_ir::op::NnOp;
use tilec_ir::{DType, Graph, Op, Tensor, TensorType};

/// Geometry of one test graph.
#[derive(Clone, Copy)]
struct Geo {
    dtype: DType,
    hq: usize,
    hkv: usize,
    t: usize,
    d: usize,
    bs: usize,
    max_blocks: usize,
}

/// `past.len()` sequences; the old caches also graph outputs when `keep_old` (so the new ones
/// cannot take their storage).
fn graph(g0: Geo, batch: usize, keep_old: bool) -> Graph {
    let Geo { dtype, hq, hkv, t, d, bs, max_blocks } = g0;
    let blocks = batch * max_blocks + 2;
    let mut g = Graph::new("paged");
    let q = g.add_input("q", TensorType::fixed(dtype, &[batch, hq, t, d]));
    let k = g.add_input("k", TensorType::fixed(dtype, &[batch, hkv, t, d]));
    let v = g.add_input("v", TensorType::fixed(dtype, &[batch, hkv, t, d]));
    let kc = g.add_input("k_cache", TensorType::fixed(dtype, &[blocks, bs, hkv, d]));
    let vc = g.add_input("v_cache", TensorType::fixed(dtype, &[blocks, bs, hkv, d]));
    let bt = g.add_input("block_table", TensorType::fixed(DType::I32, &[batch, max_blocks]));
    let pl = g.add_input("past_lens", TensorType::fixed(DType::I32, &[batch]));
    let scale = 1.0 / (d as f32).sqrt();
    let outs = g.add_node("paged", Op::Nn(NnOp::PagedAttention { scale }), &[q, k, v, kc, vc, bt, pl]).unwrap();
    let mut o = outs.clone();
    if keep_old {
        o.push(kc);
    }
    g.set_outputs(o);
    g
}

/// Random q, k, v and caches; each sequence's blocks drawn from a shuffled pool, garbage in the
/// table entries it never reaches.
fn inputs(g: &Graph, past: &[usize], geo: Geo, seed: u64) -> Vec<Tensor> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let mut out = vec![];
    for &v in &g.inputs()[..5] {
        let ty = &g.value(v).ty;
        let shape = ty.fixed_shape().unwrap();
        let n: usize = shape.iter().product();
        let vals: Vec<f64> = (0..n).map(|_| (next() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0).collect();
        out.push(Tensor::from_f64s(ty.dtype, shape, &vals).unwrap());
    }
    let blocks = g.value(g.inputs()[3]).ty.fixed_shape().unwrap()[0];
    let mut ids: Vec<i32> = (0..blocks as i32).collect();
    for i in (1..ids.len()).rev() {
        ids.swap(i, (next() % (i as u64 + 1)) as usize);
    }
    let mut ids = ids.into_iter();
    let mut table = vec![];
    for &p in past {
        let used = (p + geo.t).div_ceil(geo.bs);
        for j in 0..geo.max_blocks {
            table.push(if j < used { ids.next().unwrap() } else { i32::MIN + j as i32 });
        }
    }
    out.push(Tensor::from_vec(vec![past.len(), geo.max_blocks], table).unwrap());
    out.push(Tensor::from_vec(vec![past.len()], past.iter().map(|&p| p as i32).collect::<Vec<_>>()).unwrap());
    out
}

fn prepared(g: &Graph) -> Prepared {
    prepare(g, &CudaOptions::default(), &GpuTarget::hopper()).unwrap_or_else(|e| panic!("{e}"))
}

const GQA: Geo = Geo { dtype: DType::BF16, hq: 8, hkv: 2, t: 1, d: 128, bs: 16, max_blocks: 12 };

#[test]
fn sixteen_bit_paged_attention_takes_the_paged_family() {
    for dtype in [DType::BF16, DType::F16] {
        let p = prepared(&graph(Geo { dtype, ..GQA }, 3, false));
        let on: Vec<_> = p.kernels().iter().map(|k| (k.schedule, k.family.describe())).collect();
        assert_eq!(on.len(), 1, "{on:?}");
        assert_eq!(on[0].0, "sm80_paged_attn", "{on:?}");
        assert!(on[0].1.contains("paged attention batch 3 heads 8/2"), "{on:?}");
        assert!(p.report.fallbacks.is_empty(), "{:?}", p.report.fallbacks);
    }
}

#[test]
fn paged_attention_the_family_refuses_runs_on_the_host_with_the_reason() {
    for (geo, why) in [(Geo { dtype: DType::F32, ..GQA }, "caches in f32"), (Geo { d: 96, ..GQA }, "head dim 96")] {
        let p = prepared(&graph(geo, 2, false));
        assert!(p.kernels().is_empty(), "{why}");
        let f = &p.report.fallbacks;
        assert!(f.iter().any(|(op, r)| op == "paged_attention" && r.contains(why)), "{why}: {f:?}");
    }
}

/// On a GPU: the family's kernels against the interpreter, outputs poisoned. Without a GPU,
/// says so and passes.
#[test]
fn paged_decode_kernels_match_the_interpreter_on_a_gpu() {
    if !tilec::cuda::is_available() {
        eprintln!("note: no CUDA GPU; the paged decode kernels were not run");
        return;
    }
    let mqa = Geo { dtype: DType::F16, hq: 12, hkv: 1, d: 64, ..GQA };
    let three = Geo { t: 3, bs: 8, max_blocks: 20, ..GQA };
    let cases: Vec<(&str, Geo, Vec<usize>, bool)> = vec![
        ("gqa bf16 ragged", GQA, vec![0, 15, 100, 191], false),
        ("gqa bf16 old cache kept (copied)", GQA, vec![33, 7], true),
        ("mqa f16", mqa, vec![5, 150, 64], false),
        ("three new tokens", three, vec![9, 140], false),
    ];
    for (what, geo, past, keep_old) in cases {
        let g = graph(geo, past.len(), keep_old);
        let mut c = tilec::compiled_cuda::compile(&g, &CudaOptions::default()).unwrap_or_else(|e| panic!("{what}: {e}"));
        let on = c.report.schedules.clone();
        assert!(on.iter().any(|(s, n)| s == "sm80_paged_attn" && *n == 1), "{what}: not on the family: {on:?}");
        // The new caches on the old ones' storage unless the old one is read again.
        assert_eq!(c.report.inplace, if keep_old { 1 } else { 2 }, "{what}");
        for seed in [1, 2] {
            let x = inputs(&g, &past, geo, seed);
            let want = tilec::reference::run(&g, x.clone()).unwrap_or_else(|e| panic!("{what}: {e}"));
            c.poison().unwrap();
            let got = c.run(&x).unwrap_or_else(|e| panic!("{what}: {e}"));
            for (i, (w, gt)) in want.iter().zip(&got).enumerate() {
                // The output rounded once to the dtype on both sides; the caches are copies.
                let (rel, abs) = match (i, geo.dtype) {
                    (0, DType::BF16) => (8e-3, 1e-4),
                    (0, _) => (1e-3, 2e-5),
                    _ => (0.0, 0.0),
                };
                let cmp = tilec::compare::compare(w, gt, rel, abs).unwrap();
                assert!(cmp.ok(), "{what}: output {i}: max abs err {}, {} mismatches", cmp.max_abs, cmp.mismatches);
            }
        }
    }
}
