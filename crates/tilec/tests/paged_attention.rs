//! `paged_attention`: the host kernel (split-KV chunks merged through their log-sum-exp)
//! against the interpreter on random data (ragged lengths, grouped queries, several new
//! tokens, shuffled blocks), bad block tables rejected with errors naming the entry, and the
//! decoder rewrite's errors when there is no decoder to rewrite.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tilec::exec::paged;
use tilec::ir::op::{NnOp, UnaryOp};
use tilec::ir::{DType, Graph, Op, Tensor, TensorType};
use tilec_opt::decoder::{paged_decoder, CacheShape};

struct Case {
    args: Vec<Tensor>,
}

/// `b` sequences with `past` tokens each already cached, `t` new ones, `hq`/`hkv` heads.
fn case(rng: &mut StdRng, past: &[usize], t: usize, hq: usize, hkv: usize, d: usize, bs: usize) -> Case {
    let b = past.len();
    let m = past.iter().map(|&p| (p + t).div_ceil(bs)).max().unwrap_or(1);
    let blocks = 1 + b * m;
    // Blocks handed out in a shuffled order, so that no table is contiguous.
    let mut ids: Vec<i32> = (1..blocks as i32).collect();
    for i in (1..ids.len()).rev() {
        ids.swap(i, rng.gen_range(0..=i));
    }
    let table: Vec<i32> = (0..b).flat_map(|s| ids[s * m..(s + 1) * m].to_vec()).collect();
    let mut f = |shape: Vec<usize>| {
        let n = shape.iter().product();
        Tensor::from_vec(shape, (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect::<Vec<f32>>()).unwrap()
    };
    let q = f(vec![b, hq, t, d]);
    let k = f(vec![b, hkv, t, d]);
    let v = f(vec![b, hkv, t, d + 2]);
    let kc = f(vec![blocks, bs, hkv, d]);
    let vc = f(vec![blocks, bs, hkv, d + 2]);
    let bt = Tensor::from_vec(vec![b, m], table).unwrap();
    let pl = Tensor::from_vec(vec![b], past.iter().map(|&p| p as i32).collect::<Vec<_>>()).unwrap();
    Case { args: vec![q, k, v, kc, vc, bt, pl] }
}

fn oracle(args: &[Tensor], scale: f32) -> Result<Vec<Tensor>, String> {
    let g = Graph::new("empty");
    let bound = Default::default();
    let cx = tilec::reference::EvalCtx { graph: &g, bound: &bound };
    let refs: Vec<&Tensor> = args.iter().collect();
    tilec::reference::eval_op(&Op::Nn(NnOp::PagedAttention { scale }), &refs, &cx)
}

fn host(args: &[Tensor], scale: f32, split: usize) -> Result<Vec<Tensor>, String> {
    let refs: Vec<&Tensor> = args.iter().collect();
    paged::paged_attention(&refs, scale, split).expect("f32 tensors run on the host kernel")
}

fn close(a: &Tensor, b: &Tensor, what: &str) {
    assert_eq!(a.shape(), b.shape(), "{what}");
    let (x, y) = (a.to_f64_vec(), b.to_f64_vec());
    for (i, (p, q)) in x.iter().zip(&y).enumerate() {
        assert!((p - q).abs() <= 1e-5 + 1e-4 * q.abs(), "{what}: element {i}: {p} vs {q}");
    }
}

#[test]
fn host_kernel_matches_the_interpreter() {
    let mut rng = StdRng::seed_from_u64(7);
    let shapes: &[(&[usize], usize, usize, usize)] = &[
        (&[0, 5, 17, 40], 1, 8, 2), // decode, GQA 4:1, ragged, the first sequence empty
        (&[3, 0, 9], 3, 4, 4),      // three new tokens each, plain multi-head
        (&[33], 1, 6, 1),           // multi-query
    ];
    for &(past, t, hq, hkv) in shapes {
        let c = case(&mut rng, past, t, hq, hkv, 8, 4);
        let want = oracle(&c.args, 0.35).unwrap();
        // One chunk, chunks of one block, of several blocks, and a size that rounds up.
        for split in [0, 4, 8, 10, 256] {
            let got = host(&c.args, 0.35, split).unwrap();
            for (i, what) in ["y", "k_cache", "v_cache"].iter().enumerate() {
                close(&got[i], &want[i], &format!("past {past:?}, {t} new, {hq}/{hkv} heads, split {split}: {what}"));
            }
        }
    }
}

#[test]
fn the_append_lands_where_the_table_says() {
    let mut rng = StdRng::seed_from_u64(1);
    let c = case(&mut rng, &[5], 1, 2, 2, 4, 4);
    let out = host(&c.args, 1.0, 0).unwrap();
    // Position 5 is logical block 1, slot 1.
    let blk = c.args[5].to_i64_vec()[1] as usize;
    let (k, kc) = (c.args[1].to_f64_vec(), out[1].to_f64_vec());
    for h in 0..2 {
        let at = ((blk * 4 + 1) * 2 + h) * 4;
        assert_eq!(&kc[at..at + 4], &k[h * 4..h * 4 + 4]);
    }
    // Everything else is untouched.
    let before = c.args[3].to_f64_vec();
    let changed = (0..kc.len()).filter(|&i| kc[i] != before[i]).count();
    assert!(changed <= 8);
}

#[test]
fn bad_tables_and_lengths_are_errors() {
    let mut rng = StdRng::seed_from_u64(2);
    let c = case(&mut rng, &[2, 6], 1, 4, 2, 8, 4);
    let mut bad = c.args.clone();
    bad[5] = Tensor::from_vec(vec![2, 2], vec![1i32, 2, 99, 3]).unwrap();
    for e in [oracle(&bad, 1.0).unwrap_err(), host(&bad, 1.0, 0).unwrap_err()] {
        assert!(e.contains("block_table[1, 0] = 99") && e.contains("pool"), "{e}");
    }
    let mut long = c.args.clone();
    long[6] = Tensor::from_vec(vec![2], vec![2i32, 8]).unwrap();
    for e in [oracle(&long, 1.0).unwrap_err(), host(&long, 1.0, 0).unwrap_err()] {
        assert!(e.contains("sequence 1"), "{e}");
    }
    let mut neg = c.args.clone();
    neg[6] = Tensor::from_vec(vec![2], vec![-1i32, 0]).unwrap();
    for e in [oracle(&neg, 1.0).unwrap_err(), host(&neg, 1.0, 0).unwrap_err()] {
        assert!(e.contains("past_lens[0] = -1"), "{e}");
    }
}

#[test]
fn shape_inference_names_the_input() {
    let mut g = Graph::new("g");
    let f = |s: &[usize]| TensorType::fixed(DType::F32, s);
    let q = g.add_input("q", f(&[2, 4, 1, 8]));
    let k = g.add_input("k", f(&[2, 3, 1, 8]));
    let v = g.add_input("v", f(&[2, 3, 1, 8]));
    let kc = g.add_input("kc", f(&[5, 4, 3, 8]));
    let vc = g.add_input("vc", f(&[5, 4, 3, 8]));
    let bt = g.add_input("bt", TensorType::fixed(DType::I32, &[2, 3]));
    let pl = g.add_input("pl", TensorType::fixed(DType::I64, &[2]));
    let e = g.add(Op::Nn(NnOp::PagedAttention { scale: 1.0 }), &[q, k, v, kc, vc, bt, pl]).unwrap_err().to_string();
    assert!(e.contains("multiple of kv heads"), "{e}");
    let k2 = g.add_input("k2", f(&[2, 2, 1, 8]));
    let v2 = g.add_input("v2", f(&[2, 2, 1, 8]));
    let kc2 = g.add_input("kc2", f(&[5, 4, 2, 8]));
    let vc2 = g.add_input("vc2", f(&[5, 4, 2, 8]));
    let e = g.add(Op::Nn(NnOp::PagedAttention { scale: 1.0 }), &[q, k2, v2, kc2, vc2, bt, pl]).unwrap_err().to_string();
    assert!(e.contains("past_lens must be i32"), "{e}");
}

#[test]
fn a_graph_without_attention_is_not_a_decoder() {
    let mut g = Graph::new("g");
    let ids = g.add_input("input_ids", TensorType::fixed(DType::I64, &[2, 3]));
    let _pos = g.add_input("position_ids", TensorType::fixed(DType::I64, &[2, 3]));
    let x = g.add(Op::Cast { to: DType::F32, saturate: false }, &[ids]).unwrap();
    let y = g.add(Op::Unary(UnaryOp::Neg), &[x]).unwrap();
    g.set_outputs(vec![y]);
    let shape = CacheShape { blocks: 4, block_size: 4, max_blocks: 2 };
    let e = paged_decoder(&g, 2, 3, shape).unwrap_err();
    assert!(e.contains("no attention found") && e.contains("decoder-only"), "{e}");
    let e = paged_decoder(&g, 2, 4, shape).unwrap_err();
    assert!(e.contains("input 'input_ids'") && e.contains("[2, 4]"), "{e}");
}

/// A one-layer "decoder": queries, keys and values are the token ids as floats, the
/// attention masked by a constant `keep` mask, the logits its output.
fn toy_decoder(keep: Vec<bool>) -> Graph {
    use tilec::ir::op::LayoutOp;
    use tilec::ir::Dim;
    let mut g = Graph::new("toy");
    let ids = g.add_input("input_ids", TensorType::fixed(DType::I64, &[2, 3]));
    let _pos = g.add_input("position_ids", TensorType::fixed(DType::I64, &[2, 3]));
    let x = g.add(Op::Cast { to: DType::F32, saturate: false }, &[ids]).unwrap();
    let shape = [2, 1, 3, 1].map(Dim::Fixed).to_vec();
    let x = g.add(Op::Layout(LayoutOp::Reshape { shape }), &[x]).unwrap();
    let mask = g.add_const("mask", Tensor::from_vec(vec![3, 3], keep).unwrap());
    let att = Op::Nn(NnOp::Attention {
        q_num_heads: 0,
        kv_num_heads: 0,
        scale: None,
        is_causal: false,
        softcap: 0.0,
        qk_matmul_output_mode: 0,
        softmax_precision: None,
        left_window: -1,
        right_window: -1,
        has_mask: true,
        has_past: false,
        has_nonpad: false,
        zero_nan_rows: false,
    });
    let y = g.add(att, &[x, x, x, mask]).unwrap();
    let y = g.add(Op::Layout(LayoutOp::Reshape { shape: [2, 3, 1].map(Dim::Fixed).to_vec() }), &[y]).unwrap();
    g.set_outputs(vec![y]);
    g
}

#[test]
fn a_constant_mask_must_be_causal() {
    let shape = CacheShape { blocks: 4, block_size: 4, max_blocks: 2 };
    let causal: Vec<bool> = (0..9).map(|a| a % 3 <= a / 3).collect();
    let d = paged_decoder(&toy_decoder(causal), 2, 3, shape).unwrap();
    assert_eq!(d.layers.len(), 1);
    assert!(d.graph.nodes().iter().any(|n| n.op.name() == "paged_attention"));
    let e = paged_decoder(&toy_decoder(vec![true; 9]), 2, 3, shape).unwrap_err();
    assert!(e.contains("not causal") && e.contains("[0, 1]"), "{e}");
}
