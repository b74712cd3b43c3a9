//! Control flow on the reference interpreter: hand-built graphs with if/loop/scan nodes,
//! checked against plain Rust loops.

use tilec_ir::op::{BinaryOp, ControlOp};
use tilec_ir::*;

fn f32s(shape: &[usize], v: &[f32]) -> Tensor {
    Tensor::from_vec(shape.to_vec(), v.to_vec()).unwrap()
}

fn scalar_ty(d: DType) -> TensorType {
    TensorType::new(d, vec![])
}

/// A loop body: `acc += float(i)`, scan output `acc`, condition `bool(limit - i)` (so a
/// condition-driven loop stops after the iteration where `i == limit`).
fn cumsum_body(outer: &Graph, limit: i64) -> Graph {
    let mut b = Graph::new("body");
    b.syms = outer.syms.clone();
    let i = b.add_input("i", scalar_ty(DType::I64));
    let _c = b.add_input("cond", scalar_ty(DType::Bool));
    let acc = b.add_input("acc", scalar_ty(DType::F32));
    let fi = b
        .add(
            Op::Cast {
                to: DType::F32,
                saturate: true,
            },
            &[i],
        )
        .unwrap();
    let acc2 = b.add(Op::Binary(BinaryOp::Add), &[acc, fi]).unwrap();
    let lim = b.add_const("limit", Tensor::scalar(limit));
    let left = b.add(Op::Binary(BinaryOp::Sub), &[lim, i]).unwrap();
    let c2 = b
        .add(
            Op::Cast {
                to: DType::Bool,
                saturate: true,
            },
            &[left],
        )
        .unwrap();
    b.set_outputs(vec![c2, acc2, acc2]);
    b
}

#[test]
fn loop_with_trip_count_computes_a_cumulative_sum() {
    let mut g = Graph::new("main");
    let m = g.add_input("m", scalar_ty(DType::I64));
    let a0 = g.add_input("a0", scalar_ty(DType::F32));
    let body = cumsum_body(&g, 1000);
    let op = ControlOp::Loop {
        body: Box::new(body),
        has_max_trip: true,
        has_cond: false,
        n_carried: 1,
        outer_syms: g.syms.symbols.len(),
    };
    let outs = g.add_node("loop", Op::Control(op), &[m, a0]).unwrap();
    g.set_outputs(outs);
    verify(&g).unwrap();
    for n in [0i64, 1, 5] {
        let r = tilec_ref::run(&g, vec![Tensor::scalar(n), Tensor::scalar(0.5f32)]).unwrap();
        let mut acc = 0.5f32;
        let mut want = Vec::new();
        for i in 0..n {
            acc += i as f32;
            want.push(acc);
        }
        assert_eq!(r[0].to_f64_vec(), vec![acc as f64], "n = {n}");
        assert_eq!(r[1].shape(), &[n as usize]);
        assert_eq!(
            r[1].to_f64_vec(),
            want.iter().map(|&x| x as f64).collect::<Vec<_>>(),
            "n = {n}"
        );
    }
}

#[test]
fn loop_driven_by_its_condition_stops_when_the_body_says_so() {
    let mut g = Graph::new("main");
    let c = g.add_input("c", scalar_ty(DType::Bool));
    let a0 = g.add_input("a0", scalar_ty(DType::F32));
    let body = cumsum_body(&g, 3);
    let op = ControlOp::Loop {
        body: Box::new(body),
        has_max_trip: false,
        has_cond: true,
        n_carried: 1,
        outer_syms: g.syms.symbols.len(),
    };
    let outs = g.add_node("loop", Op::Control(op), &[c, a0]).unwrap();
    g.set_outputs(outs);
    verify(&g).unwrap();
    // Iterations 0..=3 run (the body's condition turns false at i == 3).
    let r = tilec_ref::run(&g, vec![Tensor::scalar(true), Tensor::scalar(0f32)]).unwrap();
    assert_eq!(r[0].to_f64_vec(), vec![6.0]);
    assert_eq!(r[1].to_f64_vec(), vec![0.0, 1.0, 3.0, 6.0]);
    // A false initial condition runs nothing: the carried value passes through.
    let r = tilec_ref::run(&g, vec![Tensor::scalar(false), Tensor::scalar(2f32)]).unwrap();
    assert_eq!(r[0].to_f64_vec(), vec![2.0]);
    assert_eq!(r[1].shape(), &[0]);
}

#[test]
fn if_reads_a_captured_outer_value() {
    let mut g = Graph::new("main");
    let n = g.syms.free("n");
    let ty = TensorType::new(DType::F32, vec![Dim::Sym(n)]);
    let c = g.add_input("c", scalar_ty(DType::Bool));
    let x = g.add_input("x", ty.clone());
    let y = g.add_input("y", ty.clone());
    let branch = |op: BinaryOp| {
        let mut b = Graph::new("branch");
        b.syms = g.syms.clone();
        let bx = b.add_input("x", ty.clone());
        let by = b.add_input("y", ty.clone());
        let r = b.add(Op::Binary(op), &[bx, by]).unwrap();
        b.set_outputs(vec![r]);
        b
    };
    let op = ControlOp::If {
        then_branch: Box::new(branch(BinaryOp::Add)),
        else_branch: Box::new(branch(BinaryOp::Sub)),
        outer_syms: g.syms.symbols.len(),
    };
    let outs = g.add_node("if", Op::Control(op), &[c, x, y]).unwrap();
    // Both branches keep the outer symbol: the output is [n], not a fresh size.
    assert_eq!(g.value(outs[0]).ty.shape, vec![Dim::Sym(n)]);
    g.set_outputs(outs);
    verify(&g).unwrap();
    let xs = f32s(&[3], &[1.0, 2.0, 3.0]);
    let ys = f32s(&[3], &[10.0, 20.0, 30.0]);
    let r = tilec_ref::run(&g, vec![Tensor::scalar(true), xs.clone(), ys.clone()]).unwrap();
    assert_eq!(r[0].to_f64_vec(), vec![11.0, 22.0, 33.0]);
    let r = tilec_ref::run(&g, vec![Tensor::scalar(false), xs, ys]).unwrap();
    assert_eq!(r[0].to_f64_vec(), vec![-9.0, -18.0, -27.0]);
    let text = print_graph(&g);
    assert!(text.contains("if{captures: 2}"), "{text}");
    assert!(text.contains("    then:\n    graph branch("), "{text}");
}

#[test]
fn if_branches_of_different_sizes_give_a_fresh_symbol() {
    let mut g = Graph::new("main");
    let c = g.add_input("c", scalar_ty(DType::Bool));
    let branch = |n: usize| {
        let mut b = Graph::new("b");
        b.syms = g.syms.clone();
        let k = b.add_const("k", Tensor::from_vec(vec![n], vec![1i32; n]).unwrap());
        b.set_outputs(vec![k]);
        b
    };
    let op = ControlOp::If {
        then_branch: Box::new(branch(2)),
        else_branch: Box::new(branch(3)),
        outer_syms: 0,
    };
    let outs = g.add_node("if", Op::Control(op), &[c]).unwrap();
    assert!(matches!(g.value(outs[0]).ty.shape[0], Dim::Sym(_)));
    g.set_outputs(outs);
    verify(&g).unwrap();
    assert_eq!(
        tilec_ref::run(&g, vec![Tensor::scalar(true)]).unwrap()[0].shape(),
        &[2]
    );
    assert_eq!(
        tilec_ref::run(&g, vec![Tensor::scalar(false)]).unwrap()[0].shape(),
        &[3]
    );
}

/// Scan over `x` (`[3, 4]` or `[4, 3]`): state `s += slice`, scan output `s * 2`.
fn scan_graph(in_axis: usize, in_rev: bool, out_axis: usize, out_rev: bool) -> Graph {
    let mut g = Graph::new("main");
    let s0 = g.add_input("s0", TensorType::fixed(DType::F32, &[3]));
    let xshape = if in_axis == 0 { [4, 3] } else { [3, 4] };
    let x = g.add_input("x", TensorType::fixed(DType::F32, &xshape));
    let mut b = Graph::new("body");
    b.syms = g.syms.clone();
    let s = b.add_input("s", TensorType::fixed(DType::F32, &[3]));
    let xi = b.add_input("xi", TensorType::fixed(DType::F32, &[3]));
    let s2 = b.add(Op::Binary(BinaryOp::Add), &[s, xi]).unwrap();
    let two = b.add_const("two", Tensor::scalar(2f32));
    let y = b.add(Op::Binary(BinaryOp::Mul), &[s2, two]).unwrap();
    b.set_outputs(vec![s2, y]);
    let op = ControlOp::Scan {
        body: Box::new(b),
        n_state: 1,
        n_scan_inputs: 1,
        input_axes: vec![in_axis],
        input_reverse: vec![in_rev],
        output_axes: vec![out_axis],
        output_reverse: vec![out_rev],
        batched: false,
        outer_syms: 0,
    };
    let outs = g.add_node("scan", Op::Control(op), &[s0, x]).unwrap();
    g.set_outputs(outs);
    g
}

#[test]
fn scan_axes_and_directions_match_a_naive_loop() {
    let s0 = [1.0f32, -1.0, 0.5];
    for (in_axis, in_rev, out_axis, out_rev) in [
        (0, false, 0, false),
        (1, false, 0, false),
        (0, true, 1, false),
        (1, true, 1, true),
        (0, false, 0, true),
    ] {
        let g = scan_graph(in_axis, in_rev, out_axis, out_rev);
        verify(&g).unwrap();
        let xshape = if in_axis == 0 { vec![4, 3] } else { vec![3, 4] };
        let xv: Vec<f32> = (0..12).map(|k| k as f32 * 0.25 - 1.0).collect();
        let x = f32s(&xshape, &xv);
        let r = tilec_ref::run(&g, vec![f32s(&[3], &s0), x]).unwrap();
        // Naive: element (t, j) of the sequence.
        let at = |t: usize, j: usize| {
            if in_axis == 0 {
                xv[t * 3 + j]
            } else {
                xv[j * 4 + t]
            }
        };
        let mut s = s0;
        let mut rows: Vec<[f32; 3]> = Vec::new();
        for step in 0..4 {
            let t = if in_rev { 3 - step } else { step };
            for j in 0..3 {
                s[j] += at(t, j);
            }
            rows.push([s[0] * 2.0, s[1] * 2.0, s[2] * 2.0]);
        }
        if out_rev {
            rows.reverse();
        }
        assert_eq!(
            r[0].to_f64_vec(),
            s.iter().map(|&v| v as f64).collect::<Vec<_>>()
        );
        let want: Vec<f64> = if out_axis == 0 {
            rows.iter()
                .flat_map(|r| r.iter().map(|&v| v as f64))
                .collect()
        } else {
            (0..3)
                .flat_map(|j| rows.iter().map(move |r| r[j] as f64))
                .collect()
        };
        let want_shape: &[usize] = if out_axis == 0 { &[4, 3] } else { &[3, 4] };
        assert_eq!(
            r[1].shape(),
            want_shape,
            "{in_axis} {in_rev} {out_axis} {out_rev}"
        );
        assert_eq!(
            r[1].to_f64_vec(),
            want,
            "{in_axis} {in_rev} {out_axis} {out_rev}"
        );
    }
}

#[test]
fn batched_scan_runs_each_batch_element_independently() {
    let mut g = Graph::new("main");
    let s0 = g.add_input("s0", TensorType::fixed(DType::F32, &[2, 1]));
    let x = g.add_input("x", TensorType::fixed(DType::F32, &[2, 3, 1]));
    let mut b = Graph::new("body");
    let s = b.add_input("s", TensorType::fixed(DType::F32, &[1]));
    let xi = b.add_input("xi", TensorType::fixed(DType::F32, &[1]));
    let s2 = b.add(Op::Binary(BinaryOp::Add), &[s, xi]).unwrap();
    b.set_outputs(vec![s2, s2]);
    let op = ControlOp::Scan {
        body: Box::new(b),
        n_state: 1,
        n_scan_inputs: 1,
        input_axes: vec![0],
        input_reverse: vec![false],
        output_axes: vec![0],
        output_reverse: vec![false],
        batched: true,
        outer_syms: 0,
    };
    let outs = g.add_node("scan", Op::Control(op), &[s0, x]).unwrap();
    assert_eq!(
        g.value(outs[1]).ty,
        TensorType::fixed(DType::F32, &[2, 3, 1])
    );
    g.set_outputs(outs);
    verify(&g).unwrap();
    let r = tilec_ref::run(
        &g,
        vec![
            f32s(&[2, 1], &[0.0, 100.0]),
            f32s(&[2, 3, 1], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
        ],
    )
    .unwrap();
    assert_eq!(r[0].to_f64_vec(), vec![6.0, 115.0]);
    assert_eq!(r[1].to_f64_vec(), vec![1.0, 3.0, 6.0, 104.0, 109.0, 115.0]);
}

#[test]
fn malformed_subgraphs_are_errors_that_name_the_node() {
    let mut g = Graph::new("main");
    let m = g.add_input("m", scalar_ty(DType::I64));
    let a0 = g.add_input("a0", scalar_ty(DType::F32));
    // The body yields only the condition: the carried value is missing.
    let mut body = cumsum_body(&g, 3);
    let cond_out = body.outputs()[0];
    body.set_outputs(vec![cond_out]);
    let op = ControlOp::Loop {
        body: Box::new(body),
        has_max_trip: true,
        has_cond: false,
        n_carried: 1,
        outer_syms: 0,
    };
    let e = g
        .add_node("my_loop", Op::Control(op), &[m, a0])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("my_loop") && e.contains("body yields 1 outputs"),
        "{e}"
    );

    // A carried value whose dtype the body changes.
    let mut body = cumsum_body(&g, 3);
    let o = body.outputs().to_vec();
    let i = body.inputs()[0];
    body.set_outputs(vec![o[0], i, o[2]]);
    let op = ControlOp::Loop {
        body: Box::new(body),
        has_max_trip: true,
        has_cond: false,
        n_carried: 1,
        outer_syms: 0,
    };
    let e = g
        .add_node("my_loop2", Op::Control(op), &[m, a0])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("my_loop2") && e.contains("carried value 0"),
        "{e}"
    );

    // The verifier descends into subgraphs.
    let body = cumsum_body(&g, 3);
    let op = ControlOp::Loop {
        body: Box::new(body),
        has_max_trip: true,
        has_cond: false,
        n_carried: 1,
        outer_syms: 0,
    };
    let outs = g.add_node("broken", Op::Control(op), &[m, a0]).unwrap();
    g.set_outputs(outs);
    verify(&g).unwrap();
    if let Op::Control(ControlOp::Loop { body, .. }) = &mut g.nodes_mut_unchecked()[0].op {
        body.nodes_mut_unchecked().swap(0, 1);
    }
    let e = verify(&g).unwrap_err().to_string();
    assert!(
        e.contains("broken") && e.contains("body subgraph") && e.contains("before it is defined"),
        "{e}"
    );
}
