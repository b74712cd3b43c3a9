//! A stable, readable text form of a graph.
//!
//! ```text
//! graph main(%0 "x": f32[batch, 3]) {
//!   %1 "w" = const f32[3, 4] {0.1, 0.2, ...}
//!   %2 "y" = matmul(%0, %1) : f32[batch, 4]
//!   return %2
//! }
//! ```

use crate::graph::{Graph, ValueDef, ValueId};
use crate::{dispatch, Element, TensorType};
use std::fmt::Write;

fn ty_str(g: &Graph, t: &TensorType) -> String {
    let dims: Vec<String> = t.shape.iter().map(|&d| g.syms.display(d)).collect();
    format!("{}[{}]", t.dtype, dims.join(", "))
}

fn val(g: &Graph, v: ValueId) -> String {
    let name = &g.value(v).name;
    if name.is_empty() {
        format!("%{}", v.0)
    } else {
        format!("%{} {:?}", v.0, name)
    }
}

fn const_preview(t: &crate::Tensor) -> String {
    fn show<T: Element>(v: &[T]) -> String {
        let parts: Vec<String> = v.iter().take(6).map(|x| format!("{}", x.to_f64())).collect();
        let more = if v.len() > 6 { ", ..." } else { "" };
        format!("{{{}{}}}", parts.join(", "), more)
    }
    dispatch!(t.data(), v => show(v))
}

/// Prints the graph in its text form.
pub fn print_graph(g: &Graph) -> String {
    let mut s = String::new();
    let ins: Vec<String> = g.inputs().iter().map(|&v| format!("{}: {}", val(g, v), ty_str(g, &g.value(v).ty))).collect();
    let _ = writeln!(s, "graph {}({}) {{", if g.name.is_empty() { "main" } else { &g.name }, ins.join(", "));
    for v in g.value_ids() {
        if let ValueDef::Const(t) = &g.value(v).def {
            let _ = writeln!(s, "  {} = const {} {}", val(g, v), ty_str(g, &g.value(v).ty), const_preview(t));
        }
    }
    for n in g.nodes() {
        let outs: Vec<String> = n.outputs.iter().map(|&v| val(g, v)).collect();
        let args: Vec<String> = n.inputs.iter().map(|&v| format!("%{}", v.0)).collect();
        let attrs = n.op.attrs_string();
        let attrs = if attrs.is_empty() { String::new() } else { format!("{{{attrs}}}") };
        let tys: Vec<String> = n.outputs.iter().map(|&v| ty_str(g, &g.value(v).ty)).collect();
        let _ = writeln!(s, "  {} = {}{}({}) : {}", outs.join(", "), n.op.name(), attrs, args.join(", "), tys.join(", "));
        if let crate::Op::Control(c) = &n.op {
            for (what, sg) in c.subgraphs() {
                let _ = writeln!(s, "    {what}:");
                for line in print_graph(sg).lines() {
                    let _ = writeln!(s, "    {line}");
                }
            }
        }
    }
    let outs: Vec<String> = g.outputs().iter().map(|v| format!("%{}", v.0)).collect();
    let _ = writeln!(s, "  return {}", outs.join(", "));
    s.push('}');
    s.push('\n');
    s
}
