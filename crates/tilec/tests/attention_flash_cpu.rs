//! Flash-style attention on the compiled CPU path (`cpu.attention_flash`), against the
//! reference interpreter on fresh random inputs, the arena poisoned before each of two runs:
//! causal and not, without a mask, with additive masks (broadcast over batch or heads, with
//! fully masked rows) and a boolean padding mask, query and key lengths that are not a
//! multiple of the blocks, cross attention (queries and keys of different lengths, causal
//! too), grouped-query heads, 3-D `[batch, seq, heads · dim]` inputs with a value dimension
//! other than the key's, an explicit scale, a NaN query row under `zero_nan_rows`, softcapping
//! and sliding windows (there for `cpu.attention_gemm` too). Every
//! case forces the family and asserts that it built the attention. A long sequence must take
//! the family by default and keep its scratch linear in the sequence.

use std::collections::HashMap;

use rand::{Rng, SeedableRng};
use tilec::compiled::{compile, prepare, CompileOptions};
use tilec_ir::op::NnOp;
use tilec_ir::{DType, Graph, Op, Tensor, TensorType};

const FAMILY: &str = "cpu.attention_flash";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mask {
    None,
    /// Additive f32 `[batch, 1, sq, skv]` in [-3, 0), two rows of the first batch -inf.
    PerBatch,
    /// Additive f32 `[sq, skv]`, a column of -inf.
    Shared,
    /// Boolean `[batch, 1, 1, skv]`: the last fifth of the keys masked out.
    Padding,
}

#[derive(Clone, Copy, Debug)]
struct Case {
    batch: usize,
    hq: usize,
    hkv: usize,
    sq: usize,
    skv: usize,
    dh: usize,
    dv: usize,
    /// `[batch, seq, heads · dim]` inputs instead of `[batch, heads, seq, dim]`.
    rank3: bool,
    causal: bool,
    mask: Mask,
    scale: Option<f32>,
    /// Query row 5 of the first batch and head is NaN, and the op zeros NaN rows.
    nan_row: bool,
    /// Softcapping (0: none) and the sliding window (left, right; negative: unbounded).
    softcap: f32,
    window: (i64, i64),
}

fn case(sq: usize, skv: usize) -> Case {
    Case { batch: 1, hq: 2, hkv: 2, sq, skv, dh: 64, dv: 64, rank3: false, causal: false, mask: Mask::None, scale: None, nan_row: false, softcap: 0.0, window: (-1, -1) }
}

fn random(shape: &[usize], rng: &mut impl Rng, lo: f32, hi: f32) -> Vec<f32> {
    (0..shape.iter().product::<usize>()).map(|_| rng.gen_range(lo..hi)).collect()
}

fn f32_tensor(shape: &[usize], v: Vec<f32>) -> Tensor {
    Tensor::from_vec(shape.to_vec(), v).unwrap()
}

/// One attention node with the case's inputs, and their values.
fn graph(t: &Case, rng: &mut impl Rng) -> (Graph, Vec<Tensor>) {
    let mut g = Graph::new("attention");
    let shape = |heads: usize, s: usize, d: usize| {
        if t.rank3 {
            vec![t.batch, s, heads * d]
        } else {
            vec![t.batch, heads, s, d]
        }
    };
    let (qs, ks, vs) = (shape(t.hq, t.sq, t.dh), shape(t.hkv, t.skv, t.dh), shape(t.hkv, t.skv, t.dv));
    let mut ins = vec![];
    let mut vals = vec![];
    for (name, s) in [("q", &qs), ("k", &ks), ("v", &vs)] {
        ins.push(g.add_input(name, TensorType::fixed(DType::F32, s)));
        let mut v = random(s, rng, -1.5, 1.5);
        if name == "q" && t.nan_row {
            // Row 5 of batch 0, head 0.
            for d in 0..t.dh {
                let at = if t.rank3 { 5 * t.hq * t.dh + d } else { 5 * t.dh + d };
                v[at] = f32::NAN;
            }
        }
        vals.push(f32_tensor(s, v));
    }
    let (sq, skv) = (t.sq, t.skv);
    match t.mask {
        Mask::None => {}
        Mask::PerBatch => {
            let s = [t.batch, 1, sq, skv];
            let mut v = random(&s, rng, -3.0, 0.0);
            for row in [1, sq / 2] {
                v[row * skv..(row + 1) * skv].fill(f32::NEG_INFINITY);
            }
            ins.push(g.add_input("mask", TensorType::fixed(DType::F32, &s)));
            vals.push(f32_tensor(&s, v));
        }
        Mask::Shared => {
            let mut v = random(&[sq, skv], rng, -3.0, 0.0);
            for r in 0..sq {
                v[r * skv + skv / 3] = f32::NEG_INFINITY;
            }
            ins.push(g.add_input("mask", TensorType::fixed(DType::F32, &[sq, skv])));
            vals.push(f32_tensor(&[sq, skv], v));
        }
        Mask::Padding => {
            let s = [t.batch, 1, 1, skv];
            let keep: Vec<bool> = (0..t.batch * skv).map(|i| i % skv < skv - skv / 5).collect();
            ins.push(g.add_input("mask", TensorType::fixed(DType::Bool, &s)));
            vals.push(Tensor::from_vec(s.to_vec(), keep).unwrap());
        }
    }
    let op = NnOp::Attention {
        q_num_heads: if t.rank3 { t.hq } else { 0 },
        kv_num_heads: if t.rank3 { t.hkv } else { 0 },
        scale: t.scale,
        is_causal: t.causal,
        softcap: t.softcap,
        qk_matmul_output_mode: 0,
        softmax_precision: None,
        left_window: t.window.0,
        right_window: t.window.1,
        has_mask: t.mask != Mask::None,
        has_past: false,
        has_nonpad: false,
        zero_nan_rows: t.nan_row,
    };
    let outs = g.add_node("att", Op::Nn(op), &ins).unwrap();
    g.set_outputs(vec![outs[0]]);
    (g, vals)
}

fn cache() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/tilec-cache")
}

fn check(name: &str, t: Case) {
    check_family(name, t, FAMILY)
}

fn check_family(name: &str, t: Case, family: &str) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(name.bytes().map(u64::from).sum::<u64>() * 7919);
    let (g, inputs) = graph(&t, &mut rng);
    // Forced: whether the family is the default at these lengths is the registry's choice.
    let families = vec![("attention".to_string(), family.to_string())];
    let opts = CompileOptions { cache_dir: Some(cache()), families, ..Default::default() };
    let mut c = compile(&g, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(c.report.fallbacks.is_empty(), "{name}: fallbacks {:?}", c.report.fallbacks);
    let built = c.report.decisions.iter().filter(|(_, d)| d.family == family).count();
    assert_eq!(built, 1, "{name}: {family} kernels in {:?}", c.report.decisions);
    let names: Vec<String> = g.inputs().iter().map(|&v| g.value(v).name.clone()).collect();
    let want = tilec_ref::run_named(&g, names.into_iter().zip(inputs.iter().cloned()).collect::<HashMap<_, _>>())
        .unwrap()
        .remove(0);
    let w = want.to_f64_vec();
    if t.nan_row {
        let row: Vec<f64> = (0..t.dv).map(|d| w[if t.rank3 { 5 * t.hq * t.dv + d } else { 5 * t.dv + d }]).collect();
        assert!(row.iter().all(|&x| x == 0.0), "{name}: the reference's NaN row is not zeros");
    }
    for run in 0..2 {
        c.poison().unwrap_or_else(|e| panic!("{name}: {e}"));
        let got = c.run(&inputs).unwrap_or_else(|e| panic!("{name}: {e}")).remove(0);
        assert_eq!(got.shape(), want.shape(), "{name}");
        for (i, (a, b)) in w.iter().zip(&got.to_f64_vec()).enumerate() {
            assert!((a - b).abs() <= 2e-5 + 1e-4 * a.abs(), "{name} run {run}: element {i}: reference {a}, compiled {b}");
        }
    }
}

// The query blocks are at most 256 rows and a power of two (the heuristic halves them while
// there are fewer than four (batch, head, block) tasks per thread), the key blocks 256 keys:
// 300 and 37 are multiples of neither, so every case below ends in shorter blocks.

#[test]
fn self_attention() {
    check("plain", case(300, 300));
    check("causal", Case { causal: true, ..case(300, 300) });
    check("scaled", Case { scale: Some(0.3), batch: 2, ..case(37, 37) });
}

#[test]
fn masks() {
    check("per_batch", Case { batch: 2, mask: Mask::PerBatch, ..case(300, 300) });
    check("shared_causal", Case { causal: true, mask: Mask::Shared, ..case(300, 300) });
    check("padding", Case { batch: 2, mask: Mask::Padding, ..case(300, 300) });
}

#[test]
fn cross_attention() {
    check("short_queries", Case { mask: Mask::PerBatch, ..case(37, 300) });
    check("causal_short_keys", Case { causal: true, ..case(300, 37) });
    check("causal_short_queries", Case { causal: true, ..case(37, 600) });
}

#[test]
fn grouped_heads_and_3d() {
    check("gqa_causal", Case { hq: 4, hkv: 2, causal: true, ..case(300, 300) });
    check("mqa", Case { hq: 3, hkv: 1, mask: Mask::Shared, ..case(300, 300) });
    check("rank3", Case { rank3: true, hq: 3, hkv: 3, dh: 32, dv: 48, causal: true, ..case(300, 300) });
    check("rank3_gqa", Case { rank3: true, hq: 4, hkv: 2, dh: 16, dv: 16, mask: Mask::Padding, ..case(37, 300) });
}

#[test]
fn nan_rows_are_zeros() {
    check("nan_row", Case { nan_row: true, ..case(300, 300) });
    check("nan_row_3d", Case { nan_row: true, rank3: true, causal: true, ..case(37, 300) });
}

/// Softcapping (Gemma-2: `50 * tanh(s / 50)` before the mask) and sliding windows, causal
/// and two-sided, with and without a mask, in the flash form and the two-product form alike.
#[test]
fn softcap_and_windows() {
    for family in [FAMILY, "cpu.attention_gemm"] {
        let at = |n: &str| format!("{n}_{family}");
        check_family(&at("softcap"), Case { softcap: 2.0, scale: Some(0.5), ..case(300, 300) }, family);
        check_family(&at("softcap_causal_mask"), Case { softcap: 1.5, causal: true, mask: Mask::Shared, ..case(300, 300) }, family);
        check_family(&at("window_causal"), Case { causal: true, window: (40, -1), hq: 4, hkv: 2, ..case(300, 300) }, family);
        check_family(&at("window_both"), Case { window: (17, 9), mask: Mask::PerBatch, batch: 2, ..case(37, 300) }, family);
    }
}

/// A long sequence takes the flash form by default, and no buffer of its kernel grows with
/// the square of the sequence (the two-product form's score matrix per head would be
/// `seq × seq`).
#[test]
fn long_sequence_takes_flash() {
    let t = Case { hq: 8, hkv: 8, causal: true, ..case(4096, 4096) };
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let (g, _) = graph(&t, &mut rng);
    let p = prepare(&g, &CompileOptions::default()).unwrap();
    let flash: Vec<_> = p.report.decisions.iter().filter(|(_, d)| d.family == FAMILY).collect();
    assert_eq!(flash.len(), 1, "decisions {:?}", p.report.decisions);
    assert_eq!(p.kernels().len(), 1);
    let k = &p.kernels()[0].kernel;
    let largest = k.buffers.iter().filter(|b| b.scope == tilec_tile::ir::Scope::Local).map(|b| b.numel()).max();
    let seq = (t.sq * t.hq * t.dh) as i64;
    assert!(largest.is_some_and(|n| n <= seq), "a scratch buffer of {largest:?} elements for {} tokens", t.sq);
}
