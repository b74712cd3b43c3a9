//! Fusion partitioner: group counts on the transformer exports and light models,
//! partition invariants, and refused fusions on hand-built graphs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use tilec_ir::op::{BinaryOp, LayoutOp, LinalgOp, NormOp, Padding, ReduceKind, ReduceOp, UnaryOp, Window};
use tilec_ir::{DType, Graph, NodeId, Op, Tensor, TensorType, ValueDef};
use tilec_opt::partition::{
    explain, explain_group, partition, Class, GroupKind, Partition, RejectReason, Target,
};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn load(path: &Path) -> Option<Graph> {
    if !path.exists() {
        eprintln!("skipping {}: not present", path.display());
        return None;
    }
    let mut g = tilec_onnx::import_file(path, &Default::default()).expect("import");
    tilec_opt::manager::optimize(&mut g, 3).expect("optimize");
    Some(g)
}

/// Every non-source node in exactly one group; group graph acyclic; inputs/outputs
/// consistent with the nodes.
fn check_invariants(g: &Graph, p: &Partition, what: &str) {
    let mut seen = vec![0usize; g.nodes().len()];
    for gr in &p.groups {
        assert!(!gr.nodes.is_empty(), "{what}: empty group #{}", gr.id);
        for n in &gr.nodes {
            seen[n.index()] += 1;
            assert_eq!(p.group_of[n.index()], Some(gr.id), "{what}: group_of");
        }
        if let Some(a) = gr.anchor {
            assert!(
                gr.nodes.contains(&a),
                "{what}: anchor outside group #{}",
                gr.id
            );
        }
    }
    for (i, n) in g.nodes().iter().enumerate() {
        let source = tilec_opt::partition::cost::classify(&n.op) == Class::Source;
        let want = if source { 0 } else { 1 };
        assert_eq!(
            seen[i],
            want,
            "{what}: node '{}' ({}) in {} groups",
            n.name,
            n.op.name(),
            seen[i]
        );
    }
    // Inputs: read by a node of the group, defined outside it; outputs: defined inside,
    // read outside or a graph output.
    let uses = g.uses();
    for gr in &p.groups {
        let set: BTreeSet<NodeId> = gr.nodes.iter().copied().collect();
        let inside = |v: tilec_ir::ValueId| matches!(g.value(v).def, ValueDef::Node { node, .. } if set.contains(&node));
        let mut want_in = BTreeSet::new();
        let mut want_out = BTreeSet::new();
        for n in &gr.nodes {
            for &v in &g.node(*n).inputs {
                if !inside(v) {
                    want_in.insert(v);
                }
            }
            for &v in &g.node(*n).outputs {
                let u = &uses[v.index()];
                if !u.by_output.is_empty() || u.by_node.iter().any(|(c, _)| !set.contains(c)) {
                    want_out.insert(v);
                }
            }
        }
        assert_eq!(
            gr.inputs.iter().copied().collect::<BTreeSet<_>>(),
            want_in,
            "{what}: inputs of #{}",
            gr.id
        );
        assert_eq!(
            gr.outputs.iter().copied().collect::<BTreeSet<_>>(),
            want_out,
            "{what}: outputs of #{}",
            gr.id
        );
    }
    // Acyclic: Kahn's algorithm over group edges.
    let ng = p.groups.len();
    let mut succ: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); ng];
    for gr in &p.groups {
        for &v in &gr.inputs {
            if let ValueDef::Node { node, .. } = g.value(v).def {
                if let Some(pg) = p.group_of[node.index()] {
                    succ[pg].insert(gr.id);
                }
            }
        }
    }
    let mut indeg = vec![0usize; ng];
    for s in &succ {
        for &t in s {
            indeg[t] += 1;
        }
    }
    let mut stack: Vec<usize> = (0..ng).filter(|&i| indeg[i] == 0).collect();
    let mut done = 0;
    while let Some(x) = stack.pop() {
        done += 1;
        for &t in &succ[x] {
            indeg[t] -= 1;
            if indeg[t] == 0 {
                stack.push(t);
            }
        }
    }
    assert_eq!(done, ng, "{what}: group graph has a cycle");
}

fn kinds(p: &Partition) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for gr in &p.groups {
        *m.entry(gr.kind.to_string()).or_insert(0) += 1;
    }
    m
}

/// Groups per transformer block. Blocks are delimited by normalization anchors:
/// `pre_norm` models start a block at every other norm (ln_1); post-norm (BERT) blocks
/// start after the embedding norm and end with their second norm.
fn per_block(g: &Graph, p: &Partition, pre_norm: bool) -> Vec<usize> {
    let norms: Vec<usize> = g
        .nodes()
        .iter()
        .enumerate()
        .filter(|(_, n)| {
            matches!(
                n.op,
                Op::Norm(NormOp::LayerNorm { .. } | NormOp::RmsNorm { .. })
            )
        })
        .map(|(i, _)| i)
        .collect();
    // Block boundaries as node indices: [start_i, start_{i+1}).
    let starts: Vec<usize> = if pre_norm {
        norms.iter().step_by(2).copied().collect()
    } else {
        norms.iter().step_by(2).map(|&i| i + 1).collect()
    };
    let nblocks = (norms.len() - 1) / 2;
    // Only groups on the hidden-state path (downstream of the first norm) belong to a
    // block; mask and position preambles computed once per model do not.
    let on_path = hidden_path(g, p, norms[0]);
    let key = |gr: &tilec_opt::partition::KernelGroup| {
        gr.anchor.unwrap_or(gr.nodes[gr.nodes.len() - 1]).index()
    };
    (0..nblocks)
        .map(|b| {
            let (lo, hi) = (starts[b], starts[b + 1]);
            p.groups
                .iter()
                .filter(|gr| on_path[gr.id] && (lo..hi).contains(&key(gr)))
                .count()
        })
        .collect()
}

/// Groups reachable from the group of node `from` (inclusive).
fn hidden_path(g: &Graph, p: &Partition, from: usize) -> Vec<bool> {
    let mut on = vec![false; p.groups.len()];
    if let Some(s) = p.group_of[from] {
        on[s] = true;
    }
    // Groups are numbered in topological order of their first node, but a group's
    // inputs may come from later-numbered groups; iterate to a fixpoint.
    loop {
        let mut changed = false;
        for gr in &p.groups {
            if on[gr.id] {
                continue;
            }
            let reach = gr.inputs.iter().any(|&v| match g.value(v).def {
                ValueDef::Node { node, .. } => {
                    p.group_of[node.index()].map(|x| on[x]).unwrap_or(false)
                }
                _ => false,
            });
            if reach {
                on[gr.id] = true;
                changed = true;
            }
        }
        if !changed {
            return on;
        }
    }
}

fn standalone_layout(p: &Partition) -> usize {
    p.count(GroupKind::Layout)
}

#[test]
fn transformers_group_counts() {
    let cuda = Target::cuda_h100();
    let cpu = Target::cpu();
    let mut printed = false;
    for (m, pre_norm) in [("gpt2", true), ("bert", false), ("llama", true)] {
        let g = match load(&root().join(format!("models/{m}/model.onnx"))) {
            Some(g) => g,
            None => continue,
        };
        for t in [&cuda, &cpu] {
            let p = partition(&g, t);
            check_invariants(&g, &p, m);
            let blocks = per_block(&g, &p, pre_norm);
            eprintln!(
                "{m} [{}]: {} nodes -> {} groups {:?}; per block {:?}; standalone layout {}; rejected {}; est {:.1} us",
                t.name,
                g.nodes().len(),
                p.groups.len(),
                kinds(&p),
                blocks,
                standalone_layout(&p),
                p.rejected.len(),
                p.total_time() * 1e6
            );
            assert!(
                standalone_layout(&p) == 0,
                "{m}: standalone layout groups:\n{}",
                explain(&g, &p, t)
            );
            let max_per_block = 7;
            for &b in &blocks {
                assert!(
                    b <= max_per_block,
                    "{m}: {b} groups in a block:\n{}",
                    explain(&g, &p, t)
                );
            }
            if m == "gpt2" && t.is_gpu() && !printed {
                printed = true;
                let norms: Vec<usize> = g
                    .nodes()
                    .iter()
                    .enumerate()
                    .filter(|(_, n)| matches!(n.op, Op::Norm(NormOp::LayerNorm { .. })))
                    .map(|(i, _)| i)
                    .collect();
                eprintln!("---- gpt2 block 0 on {} ----", t.name);
                for gr in &p.groups {
                    let k = gr.anchor.unwrap_or(gr.nodes[gr.nodes.len() - 1]).index();
                    if (norms[0]..norms[2]).contains(&k) {
                        eprint!("{}", explain_group(&g, &p, t, gr.id));
                    }
                }
                let full = explain(&g, &p, t);
                let tail: Vec<&str> = full
                    .lines()
                    .skip_while(|l| !l.starts_with("rejected"))
                    .collect();
                eprintln!("{}", tail.join("\n"));
            }
        }
    }
}

#[test]
fn light_models_invariants() {
    let dir = root().join("testdata/gen/light");
    let mut names: Vec<String> = match std::fs::read_dir(&dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => return,
    };
    names.sort();
    for m in names {
        let g = match load(&dir.join(&m).join("model.onnx")) {
            Some(g) => g,
            None => continue,
        };
        for t in [Target::cuda_h100(), Target::cpu()] {
            let p = partition(&g, &t);
            check_invariants(&g, &p, &m);
            let anchors = g
                .nodes()
                .iter()
                .filter(|n| matches!(n.op, Op::Linalg(LinalgOp::Conv { .. })))
                .count();
            eprintln!(
                "{m} [{}]: {} nodes ({anchors} conv) -> {} groups {:?}; rejected {}; est {:.1} us",
                t.name,
                g.nodes().len(),
                p.groups.len(),
                kinds(&p),
                p.rejected.len(),
                p.total_time() * 1e6
            );
            // Every conv is its own kernel, and fusion leaves few groups beyond them.
            assert_eq!(p.count(GroupKind::Conv), anchors, "{m}");
            assert!(
                p.groups.len() <= anchors + anchors / 2 + 8,
                "{m}: too many groups:\n{}",
                explain(&g, &p, &t)
            );
        }
    }
}

fn f32t(shape: &[usize]) -> TensorType {
    TensorType::fixed(DType::F32, shape)
}

fn weight(g: &mut Graph, name: &str, k: usize, n: usize) -> tilec_ir::ValueId {
    let v: Vec<f64> = (0..k * n).map(|i| (i % 7) as f64 * 0.1).collect();
    g.add_const(name, Tensor::from_f64s(DType::F32, vec![k, n], &v).unwrap())
}

#[test]
fn gemm_epilogue_and_layout_fold() {
    // y = gelu(reshape(x @ w + b)) ; the reshape folds, bias and gelu fuse into the GEMM.
    let mut g = Graph::new("mlp");
    let x = g.add_input("x", f32t(&[64, 32]));
    let w = weight(&mut g, "w", 32, 48);
    let b = weight(&mut g, "b", 1, 48);
    let mm = g.add(Op::Linalg(LinalgOp::MatMul), &[x, w]).unwrap();
    let a = g.add(Op::Binary(BinaryOp::Add), &[mm, b]).unwrap();
    let r = g
        .add(
            Op::Layout(LayoutOp::Reshape {
                shape: vec![8.into(), 8.into(), 48.into()],
            }),
            &[a],
        )
        .unwrap();
    let y = g
        .add(Op::Unary(UnaryOp::Gelu { tanh_approx: false }), &[r])
        .unwrap();
    g.set_outputs(vec![y]);
    let t = Target::cuda_h100();
    let p = partition(&g, &t);
    check_invariants(&g, &p, "mlp");
    assert_eq!(p.groups.len(), 1, "{}", explain(&g, &p, &t));
    assert_eq!(p.groups[0].kind, GroupKind::Gemm);
}

#[test]
fn heavy_producer_with_two_consumers_is_not_fused() {
    // h = x @ w ; a = relu(h) (epilogue) ; s = reduce_sum(h) (a second anchor reads h).
    let mut g = Graph::new("two_consumers");
    let x = g.add_input("x", f32t(&[256, 128]));
    let w = weight(&mut g, "w", 128, 256);
    let h = g.add(Op::Linalg(LinalgOp::MatMul), &[x, w]).unwrap();
    let a = g.add(Op::Unary(UnaryOp::Relu), &[h]).unwrap();
    let s = g
        .add(
            Op::Reduce(ReduceOp::Reduce {
                kind: ReduceKind::Sum,
                axes: vec![1],
                keepdims: true,
            }),
            &[h],
        )
        .unwrap();
    g.set_outputs(vec![a, s]);
    let t = Target::cuda_h100();
    let p = partition(&g, &t);
    check_invariants(&g, &p, "two_consumers");
    let out = explain(&g, &p, &t);
    eprintln!("{out}");
    assert_eq!(p.groups.len(), 2, "{out}");
    let gemm = p
        .groups
        .iter()
        .find(|gr| gr.kind == GroupKind::Gemm)
        .unwrap();
    let red = p
        .groups
        .iter()
        .find(|gr| gr.kind == GroupKind::Reduction)
        .unwrap();
    assert!(
        p.rejected.iter().any(|r| r.producer == gemm.id
            && r.consumer == red.id
            && r.reason == RejectReason::HeavyProducer),
        "{out}"
    );
}

#[test]
fn cheap_broadcast_producer_with_two_consumers_escapes() {
    // m = exp(c) over a small [1, 64] row, read by a GEMM and broadcast into an add:
    // the add cannot recompute it while the GEMM also reads it.
    let mut g = Graph::new("escape");
    let x = g.add_input("x", f32t(&[64, 64]));
    let c = g.add_input("c", f32t(&[1, 64]));
    let w = weight(&mut g, "w", 64, 64);
    let m = g.add(Op::Unary(UnaryOp::Exp), &[c]).unwrap();
    let y = g.add(Op::Binary(BinaryOp::Add), &[x, m]).unwrap();
    let z = g.add(Op::Linalg(LinalgOp::MatMul), &[m, w]).unwrap();
    g.set_outputs(vec![y, z]);
    let t = Target::cuda_h100();
    let p = partition(&g, &t);
    check_invariants(&g, &p, "escape");
    let out = explain(&g, &p, &t);
    eprintln!("{out}");
    assert!(
        p.rejected.iter().any(|r| r.reason == RejectReason::Escapes),
        "{out}"
    );
}

#[test]
fn fusion_that_would_create_a_cycle_is_rejected() {
    // a = x @ w1 ; b = relu(a) (epilogue of GEMM 1) ; c = b @ w2 ; d = a + c.
    // Fusing d into GEMM 1 would need GEMM 2's result inside GEMM 1: a cycle.
    let mut g = Graph::new("cycle");
    let x = g.add_input("x", f32t(&[64, 64]));
    let w1 = weight(&mut g, "w1", 64, 64);
    let w2 = weight(&mut g, "w2", 64, 64);
    let a = g.add(Op::Linalg(LinalgOp::MatMul), &[x, w1]).unwrap();
    let b = g.add(Op::Unary(UnaryOp::Relu), &[a]).unwrap();
    let c = g.add(Op::Linalg(LinalgOp::MatMul), &[b, w2]).unwrap();
    let d = g.add(Op::Binary(BinaryOp::Add), &[a, c]).unwrap();
    g.set_outputs(vec![d]);
    let t = Target::cpu();
    let p = partition(&g, &t);
    check_invariants(&g, &p, "cycle");
    let out = explain(&g, &p, &t);
    eprintln!("{out}");
    assert_eq!(p.groups.len(), 2, "{out}");
    let g1 = p.group_of[0].unwrap(); // first matmul
    let g2 = p.group_of[3].unwrap(); // the add ends up as GEMM 2's epilogue
    assert_ne!(g1, g2);
    assert!(
        p.rejected
            .iter()
            .any(|r| r.producer == g1 && r.consumer == g2 && r.reason == RejectReason::Cycle),
        "{out}"
    );
}

/// `conv(concat(transpose(a), b))`, channels-last, over a `k`×`k` window; `producer` puts an
/// elementwise op (`Some(false)`) or an NCHW 1×1 convolution (`Some(true)`) in front of `a`,
/// and a ReLU in front of `b` with either.
fn transposed_concat_conv(k: usize, producer: Option<bool>) -> Graph {
    let mut g = Graph::new("unet_decoder");
    let a = g.add_input("a", f32t(&[1, 8, 6, 6]));
    let b = g.add_input("b", f32t(&[1, 6, 6, 8]));
    let window = |k: usize| Window {
        kernel: vec![k, k],
        strides: vec![1, 1],
        dilations: vec![1, 1],
        pads: Padding::Explicit(vec![k / 2; 4]),
    };
    let weights = |g: &mut Graph, name: &str, m: usize, c: usize, k: usize| {
        let wv: Vec<f64> = (0..m * c * k * k).map(|i| (i % 5) as f64 * 0.1).collect();
        let w = g.add_const(name, Tensor::from_f64s(DType::F32, vec![m, c, k, k], &wv).unwrap());
        let bias = g.add_const(&format!("{name}.bias"), Tensor::from_f64s(DType::F32, vec![m], &vec![0.0; m]).unwrap());
        (w, bias)
    };
    let (a, b) = match producer {
        None => (a, b),
        Some(conv) => {
            let a = if conv {
                let (w, bias) = weights(&mut g, "w0", 8, 8, 1);
                let op = Op::Linalg(LinalgOp::Conv { window: window(1), group: 1, channels_last: false });
                g.add(op, &[a, w, bias]).unwrap()
            } else {
                g.add(Op::Unary(UnaryOp::Relu), &[a]).unwrap()
            };
            (a, g.add(Op::Unary(UnaryOp::Relu), &[b]).unwrap())
        }
    };
    let t = g.add(Op::Layout(LayoutOp::Transpose { perm: vec![0, 2, 3, 1] }), &[a]).unwrap();
    let c = g.add(Op::Layout(LayoutOp::Concat { axis: 3 }), &[t, b]).unwrap();
    let (w, bias) = weights(&mut g, "w", 8, 16, k);
    let op = Op::Linalg(LinalgOp::Conv { window: window(k), group: 1, channels_last: true });
    let y = g.add(op, &[c, w, bias]).unwrap();
    g.set_outputs(vec![y]);
    g
}

#[test]
fn reindexing_stays_out_of_windowed_convs() {
    // A 3×3 convolution would gather across the transposed axes and select between the
    // concatenated inputs at every tap: both stay out of it, whatever produces the inputs.
    // A 1×1 convolution reads each element once and takes them. A transpose of an anchor's
    // result is written by that anchor, not gathered by the concatenation.
    let t = Target::cpu();
    let is_layout = |g: &Graph, n: NodeId| matches!(g.node(n).op, Op::Layout(_));
    let is_transpose = |g: &Graph, n: NodeId| matches!(g.node(n).op, Op::Layout(LayoutOp::Transpose { .. }));
    for k in [3, 1] {
        for producer in [None, Some(false), Some(true)] {
            let g = transposed_concat_conv(k, producer);
            let p = partition(&g, &t);
            let what = format!("k{k} producer {producer:?}");
            check_invariants(&g, &p, &what);
            let out = explain(&g, &p, &t);
            let last = p.group_of[g.nodes().len() - 1].unwrap();
            let folded = p.groups[last].nodes.iter().any(|&n| is_layout(&g, n));
            assert_eq!(folded, k == 1, "{what}: {out}");
            // An anchor's result is transposed by the anchor, not in the concatenation.
            if producer == Some(true) {
                let conv0 = p.group_of[0].unwrap();
                let written = p.groups[conv0].nodes.iter().any(|&n| is_transpose(&g, n));
                assert!(written, "{what}: {out}");
            }
        }
    }
}

#[test]
fn reduction_row_over_scratch_budget_rejects_prologue() {
    // softmax over a 50k-wide row with a scale prologue: the row does not fit shared memory.
    let mut g = Graph::new("wide_softmax");
    let x = g.add_input("x", f32t(&[4, 50_000]));
    let s = g.add_const("s", Tensor::from_f64s(DType::F32, vec![1], &[0.5]).unwrap());
    let y = g.add(Op::Binary(BinaryOp::Mul), &[x, s]).unwrap();
    let z = g.add(Op::Norm(NormOp::Softmax { axis: 1 }), &[y]).unwrap();
    g.set_outputs(vec![z]);
    let t = Target::cuda_h100();
    let p = partition(&g, &t);
    check_invariants(&g, &p, "wide_softmax");
    let out = explain(&g, &p, &t);
    assert_eq!(p.groups.len(), 2, "{out}");
    assert!(
        p.rejected
            .iter()
            .any(|r| r.reason == RejectReason::ScratchBudget),
        "{out}"
    );
    // On the CPU target (1 MB L2 per core) the same row fits: one group.
    let p = partition(&g, &Target::cpu());
    assert_eq!(p.groups.len(), 1, "{}", explain(&g, &p, &Target::cpu()));
}

/// The longest chain of nodes inside each group.
fn group_depths(g: &Graph, p: &Partition) -> Vec<u32> {
    let mut depth = vec![0u32; g.nodes().len()];
    for (i, n) in g.nodes().iter().enumerate() {
        let mine = p.group_of[i];
        let d = n
            .inputs
            .iter()
            .filter_map(|&v| match g.value(v).def {
                ValueDef::Node { node, .. } if p.group_of[node.index()] == mine => Some(depth[node.index()]),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        depth[i] = d + 1;
    }
    let mut out = vec![0u32; p.groups.len()];
    for (i, gi) in p.group_of.iter().enumerate() {
        if let Some(gi) = gi {
            out[*gi] = out[*gi].max(depth[i]);
        }
    }
    out
}

#[test]
fn deep_chains_are_cut_at_the_expression_budget() {
    use tilec_opt::partition::{MAX_INLINE_DEPTH, MAX_INLINE_TREE};
    // A chain of unary ops, then a chain whose every value is read twice (x*x + x).
    let mut g = Graph::new("deep");
    let mut x = g.add_input("x", f32t(&[8, 8]));
    for i in 0..300 {
        let op = if i % 2 == 0 { UnaryOp::Neg } else { UnaryOp::Tanh };
        x = g.add(Op::Unary(op), &[x]).unwrap();
    }
    let chain_end = g.nodes().len();
    for _ in 0..40 {
        let m = g.add(Op::Binary(BinaryOp::Mul), &[x, x]).unwrap();
        x = g.add(Op::Binary(BinaryOp::Add), &[m, x]).unwrap();
    }
    g.set_outputs(vec![x]);
    let t = Target::cpu();
    let p = partition(&g, &t);
    check_invariants(&g, &p, "deep");
    let out = explain(&g, &p, &t);
    let depths = group_depths(&g, &p);
    assert!(depths.iter().all(|&d| d <= MAX_INLINE_DEPTH), "{depths:?}");
    // The unary chain fills groups to the depth budget.
    assert_eq!(p.group_of[chain_end - 1].unwrap() - p.group_of[0].unwrap() + 1, 300usize.div_ceil(MAX_INLINE_DEPTH as usize), "{out}");
    // Each read of x expands once more per level: a group holds about log2(budget) levels.
    let levels = (MAX_INLINE_TREE as f64).log2() as usize;
    assert!(p.groups.len() >= 300 / MAX_INLINE_DEPTH as usize + 40 / levels, "{out}");
    assert!(p.rejected.iter().any(|r| r.reason == RejectReason::ExpressionBudget), "{out}");
}

/// A weight shared by two layers through one transpose (ALBERT's shared layers, or a `cse`
/// merge): after `unshare-constant-views` each product reads its own copy of the view, the
/// partition writes no transposed weight, and the graph computes what it did.
#[test]
fn shared_transposed_weight_is_not_materialized() {
    use tilec_opt::passes::UnshareConstantViews;
    use tilec_opt::Pass;
    let mut g = Graph::new("shared_view");
    let x = g.add_input("x", f32t(&[16, 24]));
    let w = weight(&mut g, "w", 24, 24);
    let wt = g.add(Op::Layout(LayoutOp::Transpose { perm: vec![1, 0] }), &[w]).unwrap();
    let h = g.add(Op::Linalg(LinalgOp::MatMul), &[x, wt]).unwrap();
    let r = g.add(Op::Unary(UnaryOp::Relu), &[h]).unwrap();
    let y = g.add(Op::Linalg(LinalgOp::MatMul), &[r, wt]).unwrap();
    g.set_outputs(vec![y]);
    let before = g.clone();
    let t = Target::preset(tilec_opt::partition::TargetKind::Cpu);
    let shared = partition(&g, &t);
    assert!(shared.groups.iter().any(|gr| gr.outputs.contains(&wt)), "the shared view is written:\n{}", explain(&g, &shared, &t));
    assert!(UnshareConstantViews.run(&mut g).unwrap());
    tilec_ir::verify(&g).unwrap();
    let transposes = g.nodes().iter().filter(|n| n.op.name() == "transpose").count();
    assert_eq!(transposes, 2);
    let p = partition(&g, &t);
    check_invariants(&g, &p, "shared_view");
    let written: Vec<_> = p.groups.iter().flat_map(|gr| gr.outputs.iter()).filter(|&&v| g.producer(v).is_some_and(|n| g.nodes()[n.0 as usize].op.name() == "transpose")).collect();
    assert!(written.is_empty(), "{}", explain(&g, &p, &t));
    assert!(!UnshareConstantViews.run(&mut g).unwrap(), "a second run changes nothing");
    let xs: Vec<f64> = (0..16 * 24).map(|i| ((i * 37 % 101) as f64 - 50.0) / 50.0).collect();
    let input = Tensor::from_f64s(DType::F32, vec![16, 24], &xs).unwrap();
    let a = tilec_ref::run(&before, vec![input.clone()]).unwrap();
    let b = tilec_ref::run(&g, vec![input]).unwrap();
    assert_eq!(a[0].to_f64_vec(), b[0].to_f64_vec());
}

/// A linear resize into a 1x1 convolution's input (SegFormer's head): on the CPU it is
/// materialized (the packing would interpolate per element); a nearest one, and any on the
/// GPU, is folded in.
#[test]
fn interpolation_stays_out_of_products_on_the_cpu() {
    use tilec_ir::op::{CoordMode, NearestMode, ResizeAttrs, ResizeMode};
    let build = |mode: ResizeMode| {
        let mut g = Graph::new("resize_conv");
        let x = g.add_input("x", f32t(&[1, 16, 7, 7]));
        let attrs = ResizeAttrs {
            mode,
            coord: CoordMode::HalfPixel,
            nearest: NearestMode::Floor,
            cubic_a: -0.75,
            exclude_outside: false,
            antialias: false,
            extrapolation_value: 0.0,
            sizes: vec![1.into(), 16.into(), 28.into(), 28.into()],
            scales: vec![1.0, 1.0, 4.0, 4.0],
            roi: vec![],
        };
        let r = g.add(Op::Layout(LayoutOp::Resize(Box::new(attrs))), &[x]).unwrap();
        let wv: Vec<f64> = (0..8 * 16).map(|i| (i % 5) as f64 * 0.1).collect();
        let w = g.add_const("w", Tensor::from_f64s(DType::F32, vec![8, 16, 1, 1], &wv).unwrap());
        let b = g.add_const("b", Tensor::from_f64s(DType::F32, vec![8], &[0.0; 8]).unwrap());
        let window = Window { kernel: vec![1, 1], strides: vec![1, 1], dilations: vec![1, 1], pads: Padding::Explicit(vec![0; 4]) };
        let y = g.add(Op::Linalg(LinalgOp::Conv { window, group: 1, channels_last: false }), &[r, w, b]).unwrap();
        g.set_outputs(vec![y]);
        g
    };
    for (mode, t, folded) in [
        (ResizeMode::Linear, Target::cpu(), false),
        (ResizeMode::Cubic, Target::cpu(), false),
        (ResizeMode::Nearest, Target::cpu(), true),
        (ResizeMode::Linear, Target::cuda_h100(), true),
    ] {
        let g = build(mode.clone());
        let p = partition(&g, &t);
        check_invariants(&g, &p, "resize_conv");
        assert_eq!(p.groups.len() == 1, folded, "{mode:?}: {}", explain(&g, &p, &t));
    }
}

/// A transpose that brings the normalized axis last (SqueezeBERT's LayerNorm between
/// channels-first 1-D convolutions): on the CPU the normalization does not fold it (each pass
/// would stride across the source); the convolution before writes it. A transpose that keeps
/// the last axis, and any on the GPU, folds in.
#[test]
fn transposed_rows_stay_out_of_normalizations_on_the_cpu() {
    let build = |perm: Vec<usize>| {
        let mut g = Graph::new("conv_ln");
        let x = g.add_input("x", f32t(&[1, 16, 12]));
        let wv: Vec<f64> = (0..16 * 16).map(|i| (i % 7) as f64 * 0.1 - 0.3).collect();
        let w = g.add_const("w", Tensor::from_f64s(DType::F32, vec![16, 16, 1], &wv).unwrap());
        let b = g.add_const("b", Tensor::from_f64s(DType::F32, vec![16], &[0.1; 16]).unwrap());
        let window = Window { kernel: vec![1], strides: vec![1], dilations: vec![1], pads: Padding::Explicit(vec![0; 2]) };
        let c = g.add(Op::Linalg(LinalgOp::Conv { window, group: 1, channels_last: false }), &[x, w, b]).unwrap();
        let r = g.add(Op::Binary(BinaryOp::Add), &[c, x]).unwrap();
        let t = g.add(Op::Layout(LayoutOp::Transpose { perm: perm.clone() }), &[r]).unwrap();
        let last = g.value(t).ty.shape.len() - 1;
        let n = g.value(t).ty.fixed_shape().unwrap()[last];
        let sc = g.add_const("scale", Tensor::from_f64s(DType::F32, vec![n], &vec![1.5; n]).unwrap());
        let bi = g.add_const("bias", Tensor::from_f64s(DType::F32, vec![n], &vec![0.5; n]).unwrap());
        let ln = Op::Norm(NormOp::LayerNorm { axis: last, epsilon: 1e-5, stash: DType::F32, has_bias: true });
        let y = g.add(ln, &[t, sc, bi]).unwrap();
        let back = g.add(Op::Layout(LayoutOp::Transpose { perm }), &[y]).unwrap();
        g.set_outputs(vec![back]);
        g
    };
    for (perm, t, folded) in [
        (vec![0, 2, 1], Target::cpu(), false),
        (vec![1, 0, 2], Target::cpu(), true),
        (vec![0, 2, 1], Target::cuda_h100(), true),
    ] {
        let g = build(perm.clone());
        let p = partition(&g, &t);
        check_invariants(&g, &p, "conv_ln");
        let ln = p
            .groups
            .iter()
            .find(|k| k.nodes.iter().any(|&n| matches!(g.node(n).op, Op::Norm(NormOp::LayerNorm { .. }))))
            .unwrap();
        let ln_input = g.node(ln.nodes.iter().copied().find(|&n| matches!(g.node(n).op, Op::Norm(_))).unwrap()).inputs[0];
        let ValueDef::Node { node: tr, .. } = g.value(ln_input).def else { panic!("the normalization reads a transpose") };
        assert_eq!(ln.nodes.contains(&tr), folded, "{perm:?} on {}: {}", t.name, explain(&g, &p, &t));
    }
}
