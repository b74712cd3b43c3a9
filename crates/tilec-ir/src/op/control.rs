//! Control flow: ops that own subgraphs (`if`, `loop`, `scan`).
//!
//! A subgraph is an ordinary, closed [`Graph`]. Its inputs are the op's *formal* inputs
//! (e.g. a loop body's iteration number, condition and carried values) followed by its
//! *captures*: values of enclosing scopes that the subgraph reads. The node's input list
//! carries the outer values for the formals and then for the captures, in the same order,
//! so every graph stays self-contained and verifiable on its own.
//!
//! Symbols: a subgraph's symbol table starts as a copy of the enclosing graph's table;
//! its first `outer_syms` symbols are the enclosing graph's and mean the same dimension
//! in both (inference checks this). Symbols the subgraph added itself (ids at or above
//! `outer_syms`) are local: an output dimension built only from enclosing symbols is
//! carried over, any other one that is not the same for every branch/iteration gets a
//! fresh symbol in the enclosing graph.

use super::{fmt_dims, InferCtx, OpInfo};
use crate::{DType, Dim, Graph, SymExpr, SymbolTable, TensorType};

#[derive(Clone, Debug, PartialEq)]
pub enum ControlOp {
    /// Runs one of two branches. Node inputs: `cond` (bool, one element), then the
    /// captures. Both branches take exactly the captures as inputs (a branch may ignore
    /// some) and yield the same number of outputs, with equal dtypes and ranks.
    If {
        then_branch: Box<Graph>,
        else_branch: Box<Graph>,
        outer_syms: usize,
    },
    /// ONNX `Loop`. Node inputs: the trip count (i64, one element) when `has_max_trip`,
    /// the initial condition (bool, one element) when `has_cond`, `n_carried` initial
    /// values, then the captures. Body inputs: iteration number (i64 scalar), condition
    /// (bool scalar), the carried values, the captures. Body outputs: condition, carried
    /// values, then the scan outputs. Node outputs: the final carried values, then each
    /// scan output stacked over the iterations along a new leading axis. Without
    /// `has_cond`, the body's condition output is ignored.
    Loop {
        body: Box<Graph>,
        has_max_trip: bool,
        has_cond: bool,
        n_carried: usize,
        outer_syms: usize,
    },
    /// ONNX `Scan` (opset 9 semantics). Node inputs: `n_state` initial states, then
    /// `n_scan_inputs` sequences, then the captures. Every iteration the body receives the
    /// states, one slice of each sequence (taken along `input_axes[j]`, from the end when
    /// `input_reverse[j]`) and the captures; it yields the new states and one slice of
    /// each scan output, which are stacked along `output_axes[k]` (in reverse iteration
    /// order when `output_reverse[k]`). With `batched` (opset 8), states, sequences and
    /// outputs carry an extra leading batch dimension and every batch element is scanned
    /// independently; axes are then relative to the per-element tensors.
    Scan {
        body: Box<Graph>,
        n_state: usize,
        n_scan_inputs: usize,
        input_axes: Vec<usize>,
        input_reverse: Vec<bool>,
        output_axes: Vec<usize>,
        output_reverse: Vec<bool>,
        batched: bool,
        outer_syms: usize,
    },
}

impl ControlOp {
    /// The subgraphs with their attribute names, for the printer and the verifier.
    pub fn subgraphs(&self) -> Vec<(&'static str, &Graph)> {
        match self {
            ControlOp::If {
                then_branch,
                else_branch,
                ..
            } => vec![("then", then_branch), ("else", else_branch)],
            ControlOp::Loop { body, .. } | ControlOp::Scan { body, .. } => vec![("body", body)],
        }
    }

    /// Number of subgraph inputs (and node inputs) that are formal, i.e. not captures.
    pub fn n_formal_inputs(&self) -> usize {
        match self {
            ControlOp::If { .. } => 0,
            ControlOp::Loop { n_carried, .. } => 2 + n_carried,
            ControlOp::Scan {
                n_state,
                n_scan_inputs,
                ..
            } => n_state + n_scan_inputs,
        }
    }

    /// Number of captured values (the trailing node inputs).
    pub fn n_captures(&self) -> usize {
        match self {
            ControlOp::If { then_branch, .. } => then_branch.inputs().len(),
            _ => {
                let g = self.subgraphs()[0].1;
                g.inputs().len().saturating_sub(self.n_formal_inputs())
            }
        }
    }

    /// Attributes for the printer (the subgraphs are printed separately).
    pub fn attrs_string(&self) -> String {
        let caps = self.n_captures();
        match self {
            ControlOp::If { .. } => format!("captures: {caps}"),
            ControlOp::Loop {
                has_max_trip,
                has_cond,
                n_carried,
                ..
            } => {
                format!("has_max_trip: {has_max_trip}, has_cond: {has_cond}, n_carried: {n_carried}, captures: {caps}")
            }
            ControlOp::Scan {
                n_state,
                n_scan_inputs,
                input_axes,
                input_reverse,
                output_axes,
                output_reverse,
                batched,
                ..
            } => format!(
                "n_state: {n_state}, n_scan_inputs: {n_scan_inputs}, input_axes: {input_axes:?}, \
                 input_reverse: {input_reverse:?}, output_axes: {output_axes:?}, \
                 output_reverse: {output_reverse:?}, batched: {batched}, captures: {caps}"
            ),
        }
    }
}

/// Whether `d` is a symbol the subgraph minted itself.
fn is_local(d: Dim, base: usize) -> bool {
    matches!(d, Dim::Sym(s) if s.0 as usize >= base)
}

/// A subgraph dimension expressed in the enclosing graph's symbols, if it can be.
fn lift(d: Dim, inner: &SymbolTable, base: usize, outer: &mut SymbolTable) -> Option<Dim> {
    match d {
        Dim::Fixed(_) => Some(d),
        Dim::Sym(s) if (s.0 as usize) < base => Some(d),
        Dim::Sym(s) => {
            let e = inner.symbols.get(s.0 as usize)?.expr.clone()?;
            let mut l = |x: Dim| lift(x, inner, base, outer);
            let e = match e {
                SymExpr::Add(a, b) => SymExpr::Add(l(a)?, l(b)?),
                SymExpr::Sub(a, b) => SymExpr::Sub(l(a)?, l(b)?),
                SymExpr::Mul(a, b) => SymExpr::Mul(l(a)?, l(b)?),
                SymExpr::Div(a, b) => SymExpr::Div(l(a)?, l(b)?),
                SymExpr::CeilDiv(a, b) => SymExpr::CeilDiv(l(a)?, l(b)?),
                SymExpr::Max(a, b) => SymExpr::Max(l(a)?, l(b)?),
                SymExpr::Min(a, b) => SymExpr::Min(l(a)?, l(b)?),
            };
            Some(outer.derive(e))
        }
    }
}

/// A subgraph dimension in the enclosing graph: lifted, or a fresh symbol.
fn lift_or_fresh(d: Dim, g: &Graph, base: usize, outer: &mut SymbolTable, hint: &str) -> Dim {
    lift(d, &g.syms, base, outer).unwrap_or_else(|| Dim::Sym(outer.fresh(hint)))
}

/// Checks that the subgraph's first `base` symbols are the enclosing graph's.
fn check_outer_syms(what: &str, g: &Graph, base: usize, outer: &SymbolTable) -> Result<(), String> {
    if base > outer.symbols.len()
        || base > g.syms.symbols.len()
        || g.syms.symbols[..base] != outer.symbols[..base]
    {
        return Err(format!(
            "{what}: its symbol table does not extend the enclosing graph's first {base} symbols"
        ));
    }
    Ok(())
}

/// Checks that a node input of type `actual` may be bound to a subgraph input of type
/// `formal` (equal, except where the formal has a local symbol, which accepts any size).
fn check_formal(
    what: &str,
    actual: &TensorType,
    formal: &TensorType,
    g: &Graph,
    base: usize,
    outer: &SymbolTable,
) -> Result<(), String> {
    let ok = actual.dtype == formal.dtype
        && actual.rank() == formal.rank()
        && actual
            .shape
            .iter()
            .zip(&formal.shape)
            .all(|(&a, &f)| a == f || is_local(f, base));
    if !ok {
        return Err(format!(
            "{what}: the node passes {}{} but the subgraph takes {}{}",
            actual.dtype,
            fmt_dims(&actual.shape, outer),
            formal.dtype,
            fmt_dims(&formal.shape, &g.syms)
        ));
    }
    Ok(())
}

/// Checks that a value a body yields for a carried slot fits the slot's formal input.
fn check_carried(
    what: &str,
    out: &TensorType,
    formal: &TensorType,
    g: &Graph,
    base: usize,
) -> Result<(), String> {
    let ok = out.dtype == formal.dtype
        && out.rank() == formal.rank()
        && out
            .shape
            .iter()
            .zip(&formal.shape)
            .all(|(&o, &f)| o == f || is_local(f, base));
    if !ok {
        return Err(format!(
            "{what}: the body takes {}{} but yields {}{} for the next iteration",
            formal.dtype,
            fmt_dims(&formal.shape, &g.syms),
            out.dtype,
            fmt_dims(&out.shape, &g.syms)
        ));
    }
    Ok(())
}

/// Whether a type holds exactly one element of `dtype` (rank 0, or all dims fixed 1).
fn check_single(
    what: &str,
    t: &TensorType,
    dtype: DType,
    syms: &SymbolTable,
) -> Result<(), String> {
    if t.dtype != dtype || !t.shape.iter().all(|&d| d == Dim::Fixed(1)) {
        return Err(format!(
            "{what} must be a single {dtype} element, got {}{}",
            t.dtype,
            fmt_dims(&t.shape, syms)
        ));
    }
    Ok(())
}

/// The type of the final value of a carried slot: the initial value's type where every
/// iteration agrees with it, a fresh symbol where a dimension may change.
fn join_carried(
    init: &TensorType,
    body_out: &TensorType,
    g: &Graph,
    base: usize,
    outer: &mut SymbolTable,
    hint: &str,
) -> TensorType {
    let shape = init
        .shape
        .iter()
        .zip(&body_out.shape)
        .map(|(&a, &b)| match lift(b, &g.syms, base, outer) {
            Some(l) if l == a => a,
            _ => Dim::Sym(outer.fresh(hint)),
        })
        .collect();
    TensorType::new(init.dtype, shape)
}

fn out_type(g: &Graph, i: usize) -> &TensorType {
    &g.value(g.outputs()[i]).ty
}

fn in_type(g: &Graph, i: usize) -> &TensorType {
    &g.value(g.inputs()[i]).ty
}

impl OpInfo for ControlOp {
    fn name(&self) -> &'static str {
        match self {
            ControlOp::If { .. } => "if",
            ControlOp::Loop { .. } => "loop",
            ControlOp::Scan { .. } => "scan",
        }
    }

    fn infer(&self, inputs: &[&TensorType], cx: &mut InferCtx) -> Result<Vec<TensorType>, String> {
        match self {
            ControlOp::If {
                then_branch,
                else_branch,
                outer_syms,
            } => {
                let base = *outer_syms;
                let (t, e) = (then_branch.as_ref(), else_branch.as_ref());
                check_outer_syms("then branch", t, base, cx.syms)?;
                check_outer_syms("else branch", e, base, cx.syms)?;
                let cond = inputs.first().ok_or("expected a condition input")?;
                check_single("the condition", cond, DType::Bool, cx.syms)?;
                let caps = &inputs[1..];
                for (what, g) in [("then branch", t), ("else branch", e)] {
                    if g.inputs().len() != caps.len() {
                        return Err(format!(
                            "{what} takes {} inputs, the node passes {} captures",
                            g.inputs().len(),
                            caps.len()
                        ));
                    }
                    for (i, a) in caps.iter().enumerate() {
                        check_formal(
                            &format!("{what} capture {i}"),
                            a,
                            in_type(g, i),
                            g,
                            base,
                            cx.syms,
                        )?;
                    }
                }
                if t.outputs().len() != e.outputs().len() {
                    return Err(format!(
                        "then branch yields {} outputs, else branch {}",
                        t.outputs().len(),
                        e.outputs().len()
                    ));
                }
                let mut outs = Vec::with_capacity(t.outputs().len());
                for k in 0..t.outputs().len() {
                    let (a, b) = (out_type(t, k), out_type(e, k));
                    if a.dtype != b.dtype {
                        return Err(format!(
                            "output {k}: then branch yields {}, else branch {}",
                            a.dtype, b.dtype
                        ));
                    }
                    if a.rank() != b.rank() {
                        return Err(format!(
                            "output {k}: then branch yields rank {}, else branch rank {} (outputs need a static rank)",
                            a.rank(),
                            b.rank()
                        ));
                    }
                    let shape = a
                        .shape
                        .iter()
                        .zip(&b.shape)
                        .map(|(&x, &y)| {
                            match (
                                lift(x, &t.syms, base, cx.syms),
                                lift(y, &e.syms, base, cx.syms),
                            ) {
                                (Some(p), Some(q)) if p == q => p,
                                _ => Dim::Sym(cx.syms.fresh("if")),
                            }
                        })
                        .collect();
                    outs.push(TensorType::new(a.dtype, shape));
                }
                Ok(outs)
            }
            ControlOp::Loop {
                body,
                has_max_trip,
                has_cond,
                n_carried,
                outer_syms,
            } => {
                let (g, base, n) = (body.as_ref(), *outer_syms, *n_carried);
                check_outer_syms("body", g, base, cx.syms)?;
                let nfix = *has_max_trip as usize + *has_cond as usize;
                if g.inputs().len() < 2 + n {
                    return Err(format!(
                        "body takes {} inputs, expected at least {}",
                        g.inputs().len(),
                        2 + n
                    ));
                }
                let ncap = g.inputs().len() - 2 - n;
                if inputs.len() != nfix + n + ncap {
                    return Err(format!(
                        "expected {} inputs ({nfix} loop controls, {n} carried, {ncap} captures), got {}",
                        nfix + n + ncap,
                        inputs.len()
                    ));
                }
                if *has_max_trip {
                    check_single("the trip count", inputs[0], DType::I64, cx.syms)?;
                }
                if *has_cond {
                    check_single("the condition", inputs[nfix - 1], DType::Bool, cx.syms)?;
                }
                let scalar = |t: &TensorType, d: DType| t.dtype == d && t.rank() == 0;
                if !scalar(in_type(g, 0), DType::I64) || !scalar(in_type(g, 1), DType::Bool) {
                    return Err("body inputs 0 and 1 must be the iteration number (i64 scalar) and the condition (bool scalar)".into());
                }
                if g.outputs().len() < 1 + n {
                    return Err(format!(
                        "body yields {} outputs, expected the condition and {n} carried values and then the scan outputs",
                        g.outputs().len()
                    ));
                }
                check_single(
                    "the body's condition output",
                    out_type(g, 0),
                    DType::Bool,
                    &g.syms,
                )?;
                for k in 0..n + ncap {
                    let what = if k < n {
                        format!("carried value {k}")
                    } else {
                        format!("capture {}", k - n)
                    };
                    check_formal(&what, inputs[nfix + k], in_type(g, 2 + k), g, base, cx.syms)?;
                }
                let mut outs = Vec::new();
                for k in 0..n {
                    check_carried(
                        &format!("carried value {k}"),
                        out_type(g, 1 + k),
                        in_type(g, 2 + k),
                        g,
                        base,
                    )?;
                    outs.push(join_carried(
                        inputs[nfix + k],
                        out_type(g, 1 + k),
                        g,
                        base,
                        cx.syms,
                        "loop",
                    ));
                }
                let nscan = g.outputs().len() - 1 - n;
                if nscan > 0 {
                    let iters = Dim::Sym(cx.syms.fresh("loop_iters"));
                    for k in 0..nscan {
                        let t = out_type(g, 1 + n + k);
                        let mut shape = vec![iters];
                        shape.extend(
                            t.shape
                                .iter()
                                .map(|&d| lift_or_fresh(d, g, base, cx.syms, "loop")),
                        );
                        outs.push(TensorType::new(t.dtype, shape));
                    }
                }
                Ok(outs)
            }
            ControlOp::Scan {
                body,
                n_state,
                n_scan_inputs,
                input_axes,
                input_reverse,
                output_axes,
                output_reverse,
                batched,
                outer_syms,
            } => {
                let (g, base, ns, nsi) = (body.as_ref(), *outer_syms, *n_state, *n_scan_inputs);
                check_outer_syms("body", g, base, cx.syms)?;
                if nsi == 0 {
                    return Err("a scan needs at least one scan input".into());
                }
                if input_axes.len() != nsi || input_reverse.len() != nsi {
                    return Err(format!("expected {nsi} scan input axes and directions"));
                }
                if g.inputs().len() < ns + nsi {
                    return Err(format!(
                        "body takes {} inputs, expected at least {}",
                        g.inputs().len(),
                        ns + nsi
                    ));
                }
                let ncap = g.inputs().len() - ns - nsi;
                if inputs.len() != ns + nsi + ncap {
                    return Err(format!(
                        "expected {} inputs ({ns} states, {nsi} scan inputs, {ncap} captures), got {}",
                        ns + nsi + ncap,
                        inputs.len()
                    ));
                }
                if g.outputs().len() < ns {
                    return Err(format!(
                        "body yields {} outputs, expected at least the {ns} states",
                        g.outputs().len()
                    ));
                }
                let nso = g.outputs().len() - ns;
                if output_axes.len() != nso || output_reverse.len() != nso {
                    return Err(format!("expected {nso} scan output axes and directions"));
                }
                // Per batch element types of the states and sequences.
                let mut batch: Option<Dim> = None;
                let mut elem: Vec<TensorType> = Vec::with_capacity(ns + nsi);
                for (i, t) in inputs[..ns + nsi].iter().enumerate() {
                    if *batched {
                        let (&b, rest) = t.shape.split_first().ok_or_else(|| {
                            format!("input {i} needs a leading batch dimension, has rank 0")
                        })?;
                        match batch {
                            Some(Dim::Fixed(x)) if matches!(b, Dim::Fixed(y) if y != x) => {
                                return Err(format!(
                                    "input {i} has batch size {}, input 0 has {x}",
                                    cx.syms.display(b)
                                ))
                            }
                            None => batch = Some(b),
                            _ => {}
                        }
                        elem.push(TensorType::new(t.dtype, rest.to_vec()));
                    } else {
                        elem.push((*t).clone());
                    }
                }
                let mut seq: Option<Dim> = None;
                for j in 0..nsi {
                    let t = &elem[ns + j];
                    let ax = input_axes[j];
                    if ax >= t.rank() {
                        return Err(format!(
                            "scan input {j}: axis {ax} out of range for rank {}",
                            t.rank()
                        ));
                    }
                    let d = t.shape[ax];
                    match seq {
                        None => seq = Some(d),
                        Some(Dim::Fixed(x)) if matches!(d, Dim::Fixed(y) if y != x) => {
                            return Err(format!(
                                "scan input {j} has sequence length {}, scan input 0 has {x}",
                                cx.syms.display(d)
                            ))
                        }
                        _ => {}
                    }
                    let mut s = t.clone();
                    s.shape.remove(ax);
                    check_formal(
                        &format!("scan input {j}"),
                        &s,
                        in_type(g, ns + j),
                        g,
                        base,
                        cx.syms,
                    )?;
                }
                for k in 0..ns {
                    check_formal(
                        &format!("state {k}"),
                        &elem[k],
                        in_type(g, k),
                        g,
                        base,
                        cx.syms,
                    )?;
                }
                for c in 0..ncap {
                    check_formal(
                        &format!("capture {c}"),
                        inputs[ns + nsi + c],
                        in_type(g, ns + nsi + c),
                        g,
                        base,
                        cx.syms,
                    )?;
                }
                let with_batch = |t: TensorType| match batch {
                    Some(b) => {
                        let mut shape = vec![b];
                        shape.extend(t.shape);
                        TensorType::new(t.dtype, shape)
                    }
                    None => t,
                };
                let mut outs = Vec::new();
                for k in 0..ns {
                    check_carried(
                        &format!("state {k}"),
                        out_type(g, k),
                        in_type(g, k),
                        g,
                        base,
                    )?;
                    outs.push(with_batch(join_carried(
                        &elem[k],
                        out_type(g, k),
                        g,
                        base,
                        cx.syms,
                        "scan",
                    )));
                }
                let seq = seq.ok_or("a scan needs at least one scan input")?;
                for k in 0..nso {
                    let t = out_type(g, ns + k);
                    let ax = output_axes[k];
                    if ax > t.rank() {
                        return Err(format!(
                            "scan output {k}: axis {ax} out of range for rank {}",
                            t.rank() + 1
                        ));
                    }
                    let mut shape: Vec<Dim> = t
                        .shape
                        .iter()
                        .map(|&d| lift_or_fresh(d, g, base, cx.syms, "scan"))
                        .collect();
                    shape.insert(ax, seq);
                    outs.push(with_batch(TensorType::new(t.dtype, shape)));
                }
                Ok(outs)
            }
        }
    }
}
