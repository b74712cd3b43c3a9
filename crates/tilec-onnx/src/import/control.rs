//! ONNX mappings for control flow: If, Loop, Scan.
//!
//! A subgraph attribute is imported as a closed [`Graph`] by a child importer that shares
//! the opsets and starts from a copy of the enclosing graph's symbol table. The names a
//! subgraph reads but does not define (its *free names*, found recursively through nested
//! subgraphs) are resolved in the enclosing scope: constants are copied into the
//! subgraph, every other value becomes an extra subgraph input (a *capture*) whose outer
//! value the node passes after its formal inputs.
//!
//! Specialization: an If whose condition is known at import is replaced by the branch
//! taken, imported inline (so constants and folded shapes flow through it). A Loop whose
//! body needs an import-time constant that depends on the iteration (e.g. a Slice start
//! computed from the iteration number) is unrolled when its trip count and condition are
//! known; otherwise the importer asks for them to be bound (a `NonConstant` error on the
//! Loop's trip count or condition).
//!
//! Loop-carried values (and Scan states) whose shape changes across iterations get local
//! symbols in the body: the body is imported with the initial types, and every dimension
//! where the value it yields differs from the one it takes is generalized and the body
//! re-imported, until the types are stable.

use super::{ImportError, Importer, MapFn, NodeCx, ShapeElem};
use crate::proto::{self, AttributeProto, GraphProto, NodeProto};
use crate::tensor::{dtype_from_onnx, onnx_type_name};
use std::collections::{HashMap, HashSet};
use tilec_ir::op::{ControlOp, LayoutOp};
use tilec_ir::{DType, Dim, Graph, Op, Tensor, TensorType, ValueId};

/// Most iterations a Loop is unrolled to at import.
const MAX_UNROLL: usize = 4096;

pub(super) fn lookup(op_type: &str) -> Option<MapFn> {
    Some(match op_type {
        "If" => map_if,
        "Loop" => map_loop,
        "Scan" => map_scan,
        _ => return None,
    })
}

// ---- subgraph plumbing ----

/// The graph attribute `name` (required).
fn graph_attr<'a>(cx: &NodeCx<'a>, name: &str) -> Result<&'a GraphProto, ImportError> {
    let node: &'a NodeProto = cx.node;
    let a = node
        .attribute
        .iter()
        .find(|a| a.name == name)
        .ok_or_else(|| cx.invalid(format!("missing graph attribute '{name}'")))?;
    if !a.ref_attr_name.is_empty() {
        return Err(cx.unsupported(format!("attribute '{name}' refers to a function attribute")));
    }
    if a.r#type != 5 && a.r#type != 0 {
        return Err(cx.invalid(format!(
            "attribute '{name}' must be a graph, has type code {}",
            a.r#type
        )));
    }
    a.g.as_ref()
        .ok_or_else(|| cx.invalid(format!("attribute '{name}' has no graph")))
}

/// Names `g` reads but does not define, in first-use order (recursively through the
/// subgraphs of its nodes).
pub(super) fn free_names(g: &GraphProto) -> Vec<String> {
    let mut defined: HashSet<&str> = g.input.iter().map(|i| i.name.as_str()).collect();
    defined.extend(g.initializer.iter().map(|t| t.name.as_str()));
    let mut out: Vec<String> = Vec::new();
    fn push(n: &str, defined: &HashSet<&str>, out: &mut Vec<String>) {
        if !n.is_empty() && !defined.contains(n) && !out.iter().any(|x| x == n) {
            out.push(n.to_string());
        }
    }
    for node in &g.node {
        for i in &node.input {
            push(i, &defined, &mut out);
        }
        for a in &node.attribute {
            for sg in a.g.iter().chain(a.graphs.iter()) {
                for n in free_names(sg) {
                    push(&n, &defined, &mut out);
                }
            }
        }
        defined.extend(
            node.output
                .iter()
                .map(|o| o.as_str())
                .filter(|o| !o.is_empty()),
        );
    }
    for o in &g.output {
        push(&o.name, &defined, &mut out);
    }
    out
}

/// Outer values a set of subgraphs reads: constants (copied in) and captured values.
struct Captures {
    consts: Vec<(String, Tensor)>,
    inputs: Vec<(String, ValueId)>,
}

impl Captures {
    /// Whether `name` is an outer value the subgraphs read.
    fn reads(&self, name: &str) -> bool {
        self.inputs.iter().any(|c| c.0 == name) || self.consts.iter().any(|c| c.0 == name)
    }
}

/// Whether a subgraph's `NonConstant` error is about a captured outer value (binding that
/// value helps directly, so the error is passed on as it is).
fn non_constant_capture(e: &ImportError, caps: &Captures) -> bool {
    matches!(e, ImportError::NonConstant { input, .. } if caps.reads(input))
}

fn resolve_captures(cx: &NodeCx, graphs: &[(&str, &GraphProto)]) -> Result<Captures, ImportError> {
    let mut caps = Captures {
        consts: Vec::new(),
        inputs: Vec::new(),
    };
    let mut seen: HashSet<String> = HashSet::new();
    for (what, g) in graphs {
        for n in free_names(g) {
            if !seen.insert(n.clone()) {
                continue;
            }
            let v = *cx.imp.names.get(&n).ok_or_else(|| {
                cx.invalid(format!(
                    "{what} reads '{n}', which no enclosing scope defines before this node"
                ))
            })?;
            match cx.graph().const_value(v) {
                Some(t) => caps.consts.push((n, t.clone())),
                None => caps.inputs.push((n, v)),
            }
        }
    }
    Ok(caps)
}

/// The element type a subgraph input declares, if it declares one; non-tensor types
/// are unsupported.
fn declared_dtype(
    cx: &NodeCx,
    what: &str,
    vi: &proto::ValueInfoProto,
) -> Result<Option<DType>, ImportError> {
    use proto::type_proto::Value;
    match vi.r#type.as_ref().and_then(|t| t.value.as_ref()) {
        None => Ok(None),
        Some(Value::TensorType(t)) if t.elem_type == 0 => Ok(None),
        Some(Value::TensorType(t)) => dtype_from_onnx(t.elem_type).map(Some).ok_or_else(|| {
            cx.unsupported(format!(
                "{what} input '{}': element type {}",
                vi.name,
                onnx_type_name(t.elem_type)
            ))
        }),
        Some(_) => Err(cx.unsupported(format!(
            "{what} input '{}' is not a tensor (sequences, optionals and maps are not supported)",
            vi.name
        ))),
    }
}

/// Re-labels an error raised inside subgraph `what` so it names the enclosing node too.
fn nest(cx: &NodeCx, what: &str, e: ImportError) -> ImportError {
    let path = |inner: String| format!("{}/{what}/{inner}", cx.name);
    match e {
        ImportError::Invalid { node, op_type, msg } => ImportError::Invalid {
            node: path(node),
            op_type,
            msg,
        },
        ImportError::Unsupported {
            node,
            op_type,
            opset,
            what,
        } => ImportError::Unsupported {
            node: path(node),
            op_type,
            opset,
            what,
        },
        ImportError::NonConstant {
            node,
            op_type,
            position,
            input,
            what,
        } => ImportError::NonConstant {
            node: path(node),
            op_type,
            position,
            input,
            what,
        },
        other => other,
    }
}

/// Imports subgraph `what` as a closed graph. Its inputs are the formal inputs (types
/// `formal`; dims flagged in `loose` get fresh local symbols) followed by the captures.
fn import_sub(
    cx: &NodeCx,
    what: &str,
    gp: &GraphProto,
    formal: &[TensorType],
    loose: &[Vec<bool>],
    caps: &Captures,
) -> Result<Graph, ImportError> {
    if gp.input.len() != formal.len() {
        return Err(cx.invalid(format!(
            "{what} takes {} inputs, expected {}",
            gp.input.len(),
            formal.len()
        )));
    }
    let name = if gp.name.is_empty() {
        format!("{}/{what}", cx.name)
    } else {
        gp.name.clone()
    };
    let mut child = Importer {
        graph: Graph::new(&name),
        names: HashMap::new(),
        contents: HashMap::new(),
        opsets: cx.imp.opsets.clone(),
        node_counter: 0,
    };
    child.graph.syms = cx.graph().syms.clone();
    for (k, (vi, ty)) in gp.input.iter().zip(formal).enumerate() {
        if let Some(dt) = declared_dtype(cx, what, vi)? {
            if dt != ty.dtype {
                return Err(cx.invalid(format!(
                    "{what} input '{}' is declared {dt} but receives {}",
                    vi.name, ty.dtype
                )));
            }
        }
        let mut ty = ty.clone();
        if let Some(l) = loose.get(k) {
            for (d, &is_loose) in ty.shape.iter_mut().zip(l) {
                if is_loose {
                    *d = Dim::Sym(child.graph.syms.fresh(&format!(
                        "{}_{}",
                        super::sanitize(&vi.name),
                        "d"
                    )));
                }
            }
        }
        let v = child.graph.add_input(&vi.name, ty);
        child.names.insert(vi.name.clone(), v);
    }
    for init in &gp.initializer {
        let t = crate::tensor::tensor_from_proto(init)
            .map_err(|e| cx.invalid(format!("{what} initializer '{}': {e}", init.name)))?;
        let v = child.graph.add_const(&init.name, t);
        child.names.insert(init.name.clone(), v);
    }
    for (n, t) in &caps.consts {
        let v = child.graph.add_const(n, t.clone());
        child.names.insert(n.clone(), v);
    }
    for (n, outer) in &caps.inputs {
        let v = child.graph.add_input(n, cx.ty(*outer).clone());
        child.names.insert(n.clone(), v);
        if let Some(c) = cx.imp.contents.get(outer) {
            child.contents.insert(v, c.clone());
        }
    }
    let model = proto::ModelProto::default();
    for (i, node) in gp.node.iter().enumerate() {
        child
            .import_node(node, i, &model)
            .map_err(|e| nest(cx, what, e))?;
    }
    let mut outs = Vec::with_capacity(gp.output.len());
    for o in &gp.output {
        let v = *child.names.get(&o.name).ok_or_else(|| {
            cx.invalid(format!("{what} output '{}' is not defined in it", o.name))
        })?;
        outs.push(v);
    }
    child.graph.set_outputs(outs);
    Ok(child.graph)
}

/// Imports subgraph `what` inline into the enclosing graph with its formal inputs bound
/// to `bind`; returns the values of its outputs. Names it defines are scoped to it.
fn inline(
    cx: &mut NodeCx,
    what: &str,
    gp: &GraphProto,
    bind: &[ValueId],
) -> Result<Vec<ValueId>, ImportError> {
    if gp.input.len() != bind.len() {
        return Err(cx.invalid(format!(
            "{what} takes {} inputs, expected {}",
            gp.input.len(),
            bind.len()
        )));
    }
    for (vi, &v) in gp.input.iter().zip(bind) {
        if let Some(dt) = declared_dtype(cx, what, vi)? {
            if dt != cx.ty(v).dtype {
                return Err(cx.invalid(format!(
                    "{what} input '{}' is declared {dt} but receives {}",
                    vi.name,
                    cx.ty(v).dtype
                )));
            }
        }
    }
    let saved = cx.imp.names.clone();
    let r = inline_body(cx, what, gp, bind);
    cx.imp.names = saved;
    r
}

fn inline_body(
    cx: &mut NodeCx,
    what: &str,
    gp: &GraphProto,
    bind: &[ValueId],
) -> Result<Vec<ValueId>, ImportError> {
    for (vi, &v) in gp.input.iter().zip(bind) {
        cx.imp.names.insert(vi.name.clone(), v);
    }
    for init in &gp.initializer {
        let t = crate::tensor::tensor_from_proto(init)
            .map_err(|e| cx.invalid(format!("{what} initializer '{}': {e}", init.name)))?;
        let v = cx.constant(t);
        cx.imp.names.insert(init.name.clone(), v);
    }
    let model = proto::ModelProto::default();
    for (i, node) in gp.node.iter().enumerate() {
        let mut n = node.clone();
        let inner = if node.name.is_empty() {
            format!("{}_{i}", node.op_type)
        } else {
            node.name.clone()
        };
        n.name = format!("{}/{what}/{inner}", cx.name);
        cx.imp.import_node(&n, i, &model)?;
    }
    gp.output
        .iter()
        .map(|o| {
            cx.imp.names.get(&o.name).copied().ok_or_else(|| {
                cx.invalid(format!("{what} output '{}' is not defined in it", o.name))
            })
        })
        .collect()
}

/// The known value of a one-element integer/bool input, if known at import.
fn known_scalar(cx: &NodeCx, i: usize) -> Option<i64> {
    match cx.contents(i)?.as_slice() {
        [ShapeElem::Int(v)] => Some(*v),
        _ => None,
    }
}

fn known_value_scalar(cx: &NodeCx, v: ValueId) -> Option<i64> {
    match cx.value_contents(v)?.as_slice() {
        [ShapeElem::Int(x)] => Some(*x),
        _ => None,
    }
}

/// Imports a body whose first `nfixed` formal inputs are not carried and the next
/// `ncarried` are (their yielded values follow `out_skip` leading outputs), generalizing
/// carried dims that change across iterations until the body's types are stable.
fn import_stable(
    cx: &NodeCx,
    gp: &GraphProto,
    formal: &[TensorType],
    nfixed: usize,
    ncarried: usize,
    out_skip: usize,
    caps: &Captures,
) -> Result<Graph, ImportError> {
    let mut loose: Vec<Vec<bool>> = formal.iter().map(|t| vec![false; t.rank()]).collect();
    loop {
        let g = import_sub(cx, "body", gp, formal, &loose, caps)?;
        if g.outputs().len() < out_skip + ncarried {
            return Err(cx.invalid(format!(
                "body yields {} outputs, expected at least {}",
                g.outputs().len(),
                out_skip + ncarried
            )));
        }
        let mut changed = false;
        for k in 0..ncarried {
            let fin = &g.value(g.inputs()[nfixed + k]).ty;
            let out = &g.value(g.outputs()[out_skip + k]).ty;
            if fin.dtype != out.dtype {
                return Err(cx.invalid(format!(
                    "carried value {k}: the body takes {} but yields {}",
                    fin.dtype, out.dtype
                )));
            }
            if fin.rank() != out.rank() {
                return Err(cx.unsupported(format!(
                    "carried value {k} changes rank across iterations ({} to {})",
                    fin.rank(),
                    out.rank()
                )));
            }
            for d in 0..fin.rank() {
                if fin.shape[d] != out.shape[d] && !loose[nfixed + k][d] {
                    loose[nfixed + k][d] = true;
                    changed = true;
                }
            }
        }
        if !changed {
            return Ok(g);
        }
    }
}

fn scalar_ty(dtype: DType) -> TensorType {
    TensorType::new(dtype, vec![])
}

// ---- If ----

fn map_if(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let then_g = graph_attr(cx, "then_branch")?;
    let else_g = graph_attr(cx, "else_branch")?;
    let cond = cx.req_input(0)?;
    if let Some(c) = known_scalar(cx, 0) {
        let (what, g) = if c != 0 {
            ("then_branch", then_g)
        } else {
            ("else_branch", else_g)
        };
        return inline(cx, what, g, &[]);
    }
    let caps = resolve_captures(cx, &[("then_branch", then_g), ("else_branch", else_g)])?;
    // A branch needing a constant that is a captured outer value asks for that value;
    // one needing a constant computed inside it asks for the condition (to inline).
    let ask = |cx: &NodeCx, e: ImportError| match e {
        ImportError::NonConstant { ref input, .. } if !caps.reads(input) => cx.non_constant(
            0,
            &format!("the condition, to import only the branch taken ({e})"),
        ),
        e => e,
    };
    let t = import_sub(cx, "then_branch", then_g, &[], &[], &caps).map_err(|e| ask(cx, e))?;
    let e = import_sub(cx, "else_branch", else_g, &[], &[], &caps).map_err(|e| ask(cx, e))?;
    let outer_syms = cx.graph().syms.symbols.len();
    let mut inputs = vec![cond];
    inputs.extend(caps.inputs.iter().map(|c| c.1));
    let op = ControlOp::If {
        then_branch: Box::new(t),
        else_branch: Box::new(e),
        outer_syms,
    };
    cx.emit(Op::Control(op), &inputs)
}

// ---- Loop ----

fn map_loop(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let body = graph_attr(cx, "body")?;
    let m = cx.input(0);
    let c = cx.input(1);
    if m.is_none() && c.is_none() {
        return Err(cx.invalid("a Loop with neither a trip count nor a condition never ends"));
    }
    let n = cx.n_inputs().saturating_sub(2);
    let carried: Vec<ValueId> = (2..2 + n)
        .map(|i| cx.req_input(i))
        .collect::<Result<_, _>>()?;
    if body.input.len() != 2 + n {
        return Err(cx.invalid(format!(
            "body takes {} inputs, expected {} (iteration number, condition, {n} carried values)",
            body.input.len(),
            2 + n
        )));
    }
    if body.output.len() < 1 + n {
        return Err(cx.invalid(format!(
            "body yields {} outputs, expected at least {} (condition, {n} carried values)",
            body.output.len(),
            1 + n
        )));
    }
    let caps = resolve_captures(cx, &[("body", body)])?;
    let mut formal = vec![scalar_ty(DType::I64), scalar_ty(DType::Bool)];
    formal.extend(carried.iter().map(|&v| cx.ty(v).clone()));
    let g = match import_stable(cx, body, &formal, 2, n, 1, &caps) {
        Ok(g) => g,
        Err(e @ ImportError::NonConstant { .. }) if !non_constant_capture(&e, &caps) => {
            return unroll_loop(cx, body, &carried, e)
        }
        Err(e) => return Err(e),
    };
    let outer_syms = cx.graph().syms.symbols.len();
    let mut inputs: Vec<ValueId> = m.into_iter().chain(c).collect();
    inputs.extend(&carried);
    inputs.extend(caps.inputs.iter().map(|c| c.1));
    let op = ControlOp::Loop {
        body: Box::new(g),
        has_max_trip: m.is_some(),
        has_cond: c.is_some(),
        n_carried: n,
        outer_syms,
    };
    cx.emit(Op::Control(op), &inputs)
}

/// Unrolls a Loop whose trip count and condition are known at import.
fn unroll_loop(
    cx: &mut NodeCx,
    body: &GraphProto,
    carried: &[ValueId],
    why: ImportError,
) -> Result<Vec<ValueId>, ImportError> {
    let has_m = cx.input(0).is_some();
    let has_c = cx.input(1).is_some();
    let trips = if has_m {
        match known_scalar(cx, 0) {
            Some(t) => Some(t.max(0) as usize),
            None => {
                return Err(
                    cx.non_constant(0, &format!("the trip count, to unroll the loop ({why})"))
                )
            }
        }
    } else {
        None
    };
    let mut cond = true;
    if has_c {
        match known_scalar(cx, 1) {
            Some(v) => cond = v != 0,
            None => {
                return Err(
                    cx.non_constant(1, &format!("the condition, to unroll the loop ({why})"))
                )
            }
        }
    }
    let n = carried.len();
    let mut carried = carried.to_vec();
    let mut scans: Vec<Vec<ValueId>> = vec![Vec::new(); body.output.len() - 1 - n];
    let mut i = 0usize;
    while trips.map_or(true, |t| i < t) && (!has_c || cond) {
        if i >= MAX_UNROLL {
            return Err(cx.unsupported(format!(
                "unrolling a loop of more than {MAX_UNROLL} iterations ({why})"
            )));
        }
        let iv = cx.constant(Tensor::scalar(i as i64));
        let cv = cx.constant(Tensor::scalar(cond));
        let mut bind = vec![iv, cv];
        bind.extend(&carried);
        let outs = inline(cx, &format!("body[{i}]"), body, &bind)?;
        if outs.len() < 1 + n {
            return Err(cx.invalid("body yields too few outputs"));
        }
        if has_c {
            cond = match known_value_scalar(cx, outs[0]) {
                Some(v) => v != 0,
                None => {
                    return Err(cx.unsupported(format!(
                        "the loop condition is computed at run time, so the loop cannot be unrolled ({why})"
                    )))
                }
            };
        }
        carried = outs[1..1 + n].to_vec();
        for (k, &v) in outs[1 + n..].iter().enumerate() {
            if let Some(s) = scans.get_mut(k) {
                s.push(v);
            }
        }
        i += 1;
    }
    let mut result = carried;
    for (k, parts) in scans.into_iter().enumerate() {
        if parts.is_empty() {
            return Err(cx.unsupported(format!(
                "scan output {k} of a loop unrolled to zero iterations"
            )));
        }
        let mut rows = Vec::with_capacity(parts.len());
        for p in parts {
            let mut shape = vec![Dim::Fixed(1)];
            shape.extend(cx.ty(p).shape.iter().copied());
            rows.push(cx.emit1(Op::Layout(LayoutOp::Reshape { shape }), &[p])?);
        }
        result.push(if rows.len() == 1 {
            rows[0]
        } else {
            concat0(cx, k, &rows)?
        });
    }
    Ok(result)
}

/// Concatenates values along axis 0 through the importer's own ONNX Concat mapping.
fn concat0(cx: &mut NodeCx, k: usize, parts: &[ValueId]) -> Result<ValueId, ImportError> {
    let base = format!("{}/scan{k}", cx.name);
    let mut inputs = Vec::with_capacity(parts.len());
    for (i, &p) in parts.iter().enumerate() {
        let n = format!("{base}/part{i}");
        cx.imp.names.insert(n.clone(), p);
        inputs.push(n);
    }
    let out = format!("{base}/stacked");
    let node = NodeProto {
        input: inputs,
        output: vec![out.clone()],
        name: format!("{base}/concat"),
        op_type: "Concat".into(),
        attribute: vec![AttributeProto {
            name: "axis".into(),
            r#type: 2,
            i: 0,
            ..Default::default()
        }],
        ..Default::default()
    };
    cx.imp
        .import_node(&node, 0, &proto::ModelProto::default())?;
    cx.imp
        .names
        .get(&out)
        .copied()
        .ok_or_else(|| cx.invalid("stacking the scan outputs produced nothing"))
}

// ---- Scan ----

fn map_scan(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let body = graph_attr(cx, "body")?;
    let nsi = cx
        .attr_i_opt("num_scan_inputs")?
        .ok_or_else(|| cx.invalid("missing attribute 'num_scan_inputs'"))?;
    if nsi < 1 {
        return Err(cx.invalid(format!("num_scan_inputs must be positive, got {nsi}")));
    }
    let nsi = nsi as usize;
    let batched = cx.opset < 9;
    let first = if batched { 1 } else { 0 };
    let total = cx.n_inputs().saturating_sub(first);
    if total < nsi {
        return Err(cx.invalid(format!(
            "num_scan_inputs is {nsi} but the node has {total} state and scan inputs"
        )));
    }
    let ns = total - nsi;
    let vals: Vec<ValueId> = (first..first + total)
        .map(|i| cx.req_input(i))
        .collect::<Result<_, _>>()?;
    // Per batch element types (opset 8 strips the leading batch dimension).
    let mut elem = Vec::with_capacity(total);
    for (i, &v) in vals.iter().enumerate() {
        let t = cx.ty(v).clone();
        if batched {
            if t.rank() == 0 {
                return Err(cx.invalid(format!(
                    "input {} needs a leading batch dimension",
                    first + i
                )));
            }
            elem.push(TensorType::new(t.dtype, t.shape[1..].to_vec()));
        } else {
            elem.push(t);
        }
    }
    let ints = |cx: &NodeCx, name: &str| -> Result<Vec<i64>, ImportError> {
        Ok(cx.attr_ints(name)?.unwrap_or_default())
    };
    let (axes_in, dirs_in) = if batched {
        if let Some(sl) = cx.input(0) {
            let _ = sl;
            let seq_dim = elem[ns].shape.first().copied();
            let ok = match (cx.const_input(0), seq_dim) {
                (Some(t), Some(Dim::Fixed(l))) => t.to_i64_vec().iter().all(|&x| x == l as i64),
                _ => false,
            };
            if !ok {
                return Err(cx.unsupported("sequence_lens shorter than the sequences"));
            }
        }
        (vec![0; nsi], ints(cx, "directions")?)
    } else {
        (
            ints(cx, "scan_input_axes")?,
            ints(cx, "scan_input_directions")?,
        )
    };
    let mut input_axes = Vec::with_capacity(nsi);
    let mut input_reverse = Vec::with_capacity(nsi);
    for j in 0..nsi {
        let rank = elem[ns + j].rank() as i64;
        let a = axes_in.get(j).copied().unwrap_or(0);
        let a = if a < 0 { a + rank } else { a };
        if a < 0 || a >= rank {
            return Err(cx.invalid(format!(
                "scan input {j}: axis {} out of range for rank {rank}",
                axes_in.get(j).copied().unwrap_or(0)
            )));
        }
        input_axes.push(a as usize);
        input_reverse.push(match dirs_in.get(j).copied().unwrap_or(0) {
            0 => false,
            1 => true,
            d => {
                return Err(cx.invalid(format!("scan input {j}: direction must be 0 or 1, got {d}")))
            }
        });
    }
    if !axes_in.is_empty() && axes_in.len() != nsi {
        return Err(cx.invalid(format!(
            "scan_input_axes has {} entries, expected {nsi}",
            axes_in.len()
        )));
    }
    let mut formal: Vec<TensorType> = elem[..ns].to_vec();
    for j in 0..nsi {
        let mut t = elem[ns + j].clone();
        t.shape.remove(input_axes[j]);
        formal.push(t);
    }
    let caps = resolve_captures(cx, &[("body", body)])?;
    let g = import_stable(cx, body, &formal, 0, ns, 0, &caps)?;
    let nso = g.outputs().len() - ns;
    let (axes_out, dirs_out) = if batched {
        (vec![], vec![])
    } else {
        (
            ints(cx, "scan_output_axes")?,
            ints(cx, "scan_output_directions")?,
        )
    };
    let mut output_axes = Vec::with_capacity(nso);
    let mut output_reverse = Vec::with_capacity(nso);
    for k in 0..nso {
        let rank = g.value(g.outputs()[ns + k]).ty.rank() as i64 + 1;
        let a0 = axes_out.get(k).copied().unwrap_or(0);
        let a = if a0 < 0 { a0 + rank } else { a0 };
        if a < 0 || a >= rank {
            return Err(cx.invalid(format!(
                "scan output {k}: axis {a0} out of range for rank {rank}"
            )));
        }
        output_axes.push(a as usize);
        output_reverse.push(match dirs_out.get(k).copied().unwrap_or(0) {
            0 => false,
            1 => true,
            d => {
                return Err(cx.invalid(format!(
                    "scan output {k}: direction must be 0 or 1, got {d}"
                )))
            }
        });
    }
    let outer_syms = cx.graph().syms.symbols.len();
    let mut inputs = vals;
    inputs.extend(caps.inputs.iter().map(|c| c.1));
    let op = ControlOp::Scan {
        body: Box::new(g),
        n_state: ns,
        n_scan_inputs: nsi,
        input_axes,
        input_reverse,
        output_axes,
        output_reverse,
        batched,
        outer_syms,
    };
    cx.emit(Op::Control(op), &inputs)
}

#[cfg(test)]
mod tests {
    use super::free_names;
    use crate::proto::attribute_proto::AttributeType;
    use crate::proto::tensor_proto::DataType;
    use crate::proto::tensor_shape_proto::{dimension, Dimension};
    use crate::proto::{
        type_proto, AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto,
        TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
    };
    use crate::{import_model, ImportError, ImportOptions};
    use tilec_ir::op::ControlOp;
    use tilec_ir::{print_graph, verify, DType, Dim, Graph, Op, Tensor};

    fn vi(name: &str, ty: DataType, dims: &[i64]) -> ValueInfoProto {
        let dim = dims
            .iter()
            .map(|&d| Dimension {
                value: Some(dimension::Value::DimValue(d)),
                denotation: String::new(),
            })
            .collect();
        ValueInfoProto {
            name: name.into(),
            r#type: Some(TypeProto {
                value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                    elem_type: ty as i32,
                    shape: Some(TensorShapeProto { dim }),
                })),
                denotation: String::new(),
            }),
            ..Default::default()
        }
    }

    /// A value named in a subgraph's inputs/outputs without type information.
    fn untyped(name: &str) -> ValueInfoProto {
        ValueInfoProto {
            name: name.into(),
            ..Default::default()
        }
    }

    fn node(
        op: &str,
        name: &str,
        inputs: &[&str],
        outputs: &[&str],
        attribute: Vec<AttributeProto>,
    ) -> NodeProto {
        NodeProto {
            op_type: op.into(),
            name: name.into(),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs.iter().map(|s| s.to_string()).collect(),
            attribute,
            ..Default::default()
        }
    }

    fn graph_attr(name: &str, g: GraphProto) -> AttributeProto {
        AttributeProto {
            name: name.into(),
            r#type: AttributeType::Graph as i32,
            g: Some(g),
            ..Default::default()
        }
    }

    fn ints_attr(name: &str, v: &[i64]) -> AttributeProto {
        AttributeProto {
            name: name.into(),
            r#type: AttributeType::Ints as i32,
            ints: v.to_vec(),
            ..Default::default()
        }
    }

    fn int_attr(name: &str, v: i64) -> AttributeProto {
        AttributeProto {
            name: name.into(),
            r#type: AttributeType::Int as i32,
            i: v,
            ..Default::default()
        }
    }

    /// `Constant` producing a float tensor of the given values (shape `[len]`).
    fn constant(out: &str, v: &[f32]) -> NodeProto {
        let t = TensorProto {
            dims: vec![v.len() as i64],
            data_type: DataType::Float as i32,
            float_data: v.to_vec(),
            ..Default::default()
        };
        let a = AttributeProto {
            name: "value".into(),
            r#type: AttributeType::Tensor as i32,
            t: Some(t),
            ..Default::default()
        };
        node("Constant", "", &[], &[out], vec![a])
    }

    fn model(opset: i64, g: GraphProto) -> ModelProto {
        ModelProto {
            ir_version: 8,
            opset_import: vec![OperatorSetIdProto {
                domain: String::new(),
                version: opset,
            }],
            graph: Some(g),
            ..Default::default()
        }
    }

    fn control_nodes(g: &Graph) -> Vec<&ControlOp> {
        g.nodes()
            .iter()
            .filter_map(|n| match &n.op {
                Op::Control(c) => Some(c),
                _ => None,
            })
            .collect()
    }

    /// `y = If(c) { Identity(x) } else { Constant [5, 6] }` with x read from the outer graph.
    fn if_model() -> ModelProto {
        let then_g = GraphProto {
            name: "then".into(),
            node: vec![node("Identity", "", &["x"], &["t"], vec![])],
            output: vec![untyped("t")],
            ..Default::default()
        };
        let else_g = GraphProto {
            name: "else".into(),
            node: vec![constant("e", &[5.0, 6.0])],
            output: vec![untyped("e")],
            ..Default::default()
        };
        model(
            11,
            GraphProto {
                name: "g".into(),
                node: vec![node(
                    "If",
                    "the_if",
                    &["c"],
                    &["y"],
                    vec![
                        graph_attr("then_branch", then_g),
                        graph_attr("else_branch", else_g),
                    ],
                )],
                input: vec![vi("c", DataType::Bool, &[]), vi("x", DataType::Float, &[2])],
                output: vec![untyped("y")],
                ..Default::default()
            },
        )
    }

    #[test]
    fn if_captures_outer_values_as_subgraph_inputs() {
        let g = import_model(&if_model(), &ImportOptions::default()).unwrap();
        verify(&g).unwrap();
        let n = &g.nodes()[0];
        assert_eq!(n.name, "the_if");
        // Inputs: the condition, then the captured x.
        assert_eq!(n.inputs, vec![g.inputs()[0], g.inputs()[1]]);
        let ControlOp::If {
            then_branch,
            else_branch,
            ..
        } = control_nodes(&g)[0]
        else {
            panic!("not an if")
        };
        assert_eq!(then_branch.inputs().len(), 1);
        assert_eq!(then_branch.value(then_branch.inputs()[0]).name, "x");
        // The else branch ignores the capture but takes it all the same.
        assert_eq!(else_branch.inputs().len(), 1);
        assert_eq!(g.value(g.outputs()[0]).ty.shape, vec![Dim::Fixed(2)]);
    }

    #[test]
    fn if_with_a_known_condition_imports_only_the_branch_taken() {
        let mut opts = ImportOptions::default();
        opts.bind_inputs.insert("c".into(), Tensor::scalar(false));
        let g = import_model(&if_model(), &opts).unwrap();
        verify(&g).unwrap();
        assert!(control_nodes(&g).is_empty());
        let out = g
            .const_value(g.outputs()[0])
            .expect("the else branch's constant");
        assert_eq!(out.to_f64_vec(), vec![5.0, 6.0]);
        opts.bind_inputs.insert("c".into(), Tensor::scalar(true));
        let g = import_model(&if_model(), &opts).unwrap();
        assert_eq!(g.outputs()[0], g.inputs()[0], "the then branch is x itself");
    }

    /// `Loop(m, "", y)` whose body yields `outs` (from cond_in, y_in and a constant k of
    /// `k_len` elements).
    fn loop_model(outs: &[&str], k_len: usize) -> ModelProto {
        let body = GraphProto {
            name: "body".into(),
            node: vec![
                node("Identity", "", &["cond_in"], &["cond_out"], vec![]),
                constant("k", &vec![1.0; k_len]),
            ],
            input: vec![
                vi("i", DataType::Int64, &[]),
                vi("cond_in", DataType::Bool, &[]),
                untyped("y_in"),
            ],
            output: outs.iter().map(|o| untyped(o)).collect(),
            ..Default::default()
        };
        model(
            13,
            GraphProto {
                name: "g".into(),
                node: vec![node(
                    "Loop",
                    "the_loop",
                    &["m", "", "y"],
                    &["y_final", "ys"],
                    vec![graph_attr("body", body)],
                )],
                input: vec![
                    vi("m", DataType::Int64, &[]),
                    vi("y", DataType::Float, &[2]),
                ],
                output: vec![untyped("y_final"), untyped("ys")],
                ..Default::default()
            },
        )
    }

    #[test]
    fn loop_body_types_come_from_the_node_inputs() {
        let g = import_model(
            &loop_model(&["cond_out", "k", "y_in"], 2),
            &ImportOptions::default(),
        )
        .unwrap();
        verify(&g).unwrap();
        let ControlOp::Loop {
            body,
            has_max_trip,
            has_cond,
            n_carried,
            ..
        } = control_nodes(&g)[0]
        else {
            panic!("not a loop")
        };
        assert!(*has_max_trip && !*has_cond);
        assert_eq!(*n_carried, 1);
        // The untyped y_in got y's type; the carried value keeps it.
        assert_eq!(body.value(body.inputs()[2]).ty.shape, vec![Dim::Fixed(2)]);
        assert_eq!(g.value(g.outputs()[0]).ty.shape, vec![Dim::Fixed(2)]);
        let ys = &g.value(g.outputs()[1]).ty;
        assert_eq!(ys.dtype, DType::F32);
        assert!(
            matches!(ys.shape[..], [Dim::Sym(_), Dim::Fixed(2)]),
            "{ys:?}"
        );
    }

    #[test]
    fn loop_carried_value_that_changes_shape_gets_a_local_symbol() {
        // y is [2] initially, the body yields [3]: the body must take any size.
        let g = import_model(
            &loop_model(&["cond_out", "k", "y_in"], 3),
            &ImportOptions::default(),
        )
        .unwrap();
        verify(&g).unwrap();
        let ControlOp::Loop {
            body, outer_syms, ..
        } = control_nodes(&g)[0]
        else {
            panic!("not a loop")
        };
        let d = body.value(body.inputs()[2]).ty.shape[0];
        assert!(
            matches!(d, Dim::Sym(s) if s.0 as usize >= *outer_syms),
            "{d:?}"
        );
        // The final value is [2] or [3]: a fresh symbol.
        assert!(matches!(g.value(g.outputs()[0]).ty.shape[0], Dim::Sym(_)));
    }

    #[test]
    fn loop_body_with_too_few_outputs_names_the_node() {
        let e = import_model(&loop_model(&["cond_out"], 2), &ImportOptions::default()).unwrap_err();
        let s = e.to_string();
        assert!(matches!(e, ImportError::Invalid { .. }), "{s}");
        assert!(
            s.contains("the_loop") && s.contains("body yields 1 outputs"),
            "{s}"
        );
    }

    #[test]
    fn subgraph_reading_an_undefined_name_is_an_error() {
        let mut m = if_model();
        let g = m.graph.as_mut().unwrap();
        g.input.truncate(1); // drop x
        let e = import_model(&m, &ImportOptions::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("the_if") && e.contains("reads 'x'"), "{e}");
    }

    #[test]
    fn scan_axes_are_normalized() {
        let body = GraphProto {
            name: "body".into(),
            node: vec![
                node("Identity", "", &["s_in"], &["s_out"], vec![]),
                node("Identity", "", &["x_t"], &["y_t"], vec![]),
            ],
            input: vec![untyped("s_in"), untyped("x_t")],
            output: vec![untyped("s_out"), untyped("y_t")],
            ..Default::default()
        };
        let m = model(
            11,
            GraphProto {
                name: "g".into(),
                node: vec![node(
                    "Scan",
                    "the_scan",
                    &["s", "x"],
                    &["s_final", "ys"],
                    vec![
                        graph_attr("body", body),
                        int_attr("num_scan_inputs", 1),
                        ints_attr("scan_input_axes", &[-1]),
                        ints_attr("scan_output_axes", &[-1]),
                        ints_attr("scan_output_directions", &[1]),
                    ],
                )],
                input: vec![
                    vi("s", DataType::Float, &[4]),
                    vi("x", DataType::Float, &[2, 3]),
                ],
                output: vec![untyped("s_final"), untyped("ys")],
                ..Default::default()
            },
        );
        let g = import_model(&m, &ImportOptions::default()).unwrap();
        verify(&g).unwrap();
        let ControlOp::Scan {
            input_axes,
            output_axes,
            input_reverse,
            output_reverse,
            body,
            ..
        } = control_nodes(&g)[0]
        else {
            panic!("not a scan")
        };
        assert_eq!(
            (input_axes.as_slice(), output_axes.as_slice()),
            (&[1usize][..], &[1usize][..])
        );
        assert_eq!(
            (input_reverse.as_slice(), output_reverse.as_slice()),
            (&[false][..], &[true][..])
        );
        assert_eq!(body.value(body.inputs()[1]).ty.shape, vec![Dim::Fixed(2)]);
        assert_eq!(
            g.value(g.outputs()[1]).ty.shape,
            vec![Dim::Fixed(2), Dim::Fixed(3)]
        );
    }

    #[test]
    fn nested_subgraphs_capture_through_every_scope() {
        // Loop body: r = If(cond_in) { Identity(x) } else { Identity(x) }, x from the top graph.
        let branch = |n: &str| GraphProto {
            node: vec![node("Identity", "", &["x"], &[n], vec![])],
            output: vec![untyped(n)],
            ..Default::default()
        };
        let body = GraphProto {
            name: "body".into(),
            node: vec![
                node("Identity", "", &["cond_in"], &["cond_out"], vec![]),
                node(
                    "If",
                    "inner_if",
                    &["cond_in"],
                    &["r"],
                    vec![
                        graph_attr("then_branch", branch("t")),
                        graph_attr("else_branch", branch("e")),
                    ],
                ),
            ],
            input: vec![
                vi("i", DataType::Int64, &[]),
                vi("cond_in", DataType::Bool, &[]),
            ],
            output: vec![untyped("cond_out"), untyped("r")],
            ..Default::default()
        };
        let m = model(
            13,
            GraphProto {
                name: "g".into(),
                node: vec![node(
                    "Loop",
                    "the_loop",
                    &["m", "c"],
                    &["rs"],
                    vec![graph_attr("body", body)],
                )],
                input: vec![
                    vi("m", DataType::Int64, &[]),
                    vi("c", DataType::Bool, &[]),
                    vi("x", DataType::Float, &[3]),
                ],
                output: vec![untyped("rs")],
                ..Default::default()
            },
        );
        let g = import_model(&m, &ImportOptions::default()).unwrap();
        verify(&g).unwrap();
        assert_eq!(g.nodes()[0].inputs.len(), 3, "m, c and the captured x");
        let ControlOp::Loop { body, .. } = control_nodes(&g)[0] else {
            panic!("not a loop")
        };
        assert_eq!(body.inputs().len(), 3, "i, cond and the captured x");
        let x_in = body.inputs()[2];
        assert_eq!(body.value(x_in).name, "x");
        let inner = &body.nodes()[0];
        assert_eq!(inner.inputs[1], x_in, "the inner if captures the body's x");
        let text = print_graph(&g);
        assert!(text.contains("\n    graph body("), "{text}");
        assert!(
            text.contains("\n        then:\n        graph inner_if"),
            "nested graphs print indented twice: {text}"
        );
    }

    #[test]
    fn free_names_see_through_nested_subgraphs() {
        let inner = GraphProto {
            node: vec![
                node("Identity", "", &["deep"], &["d"], vec![]),
                node("Identity", "", &["local"], &["l"], vec![]),
            ],
            output: vec![untyped("d")],
            ..Default::default()
        };
        let outer = GraphProto {
            input: vec![untyped("a")],
            node: vec![
                node("Identity", "", &["a"], &["local"], vec![]),
                node("Add", "", &["local", "b"], &["c"], vec![]),
                node(
                    "If",
                    "",
                    &["c"],
                    &["r"],
                    vec![
                        graph_attr("then_branch", inner.clone()),
                        graph_attr("else_branch", inner),
                    ],
                ),
            ],
            output: vec![untyped("r"), untyped("e")],
            ..Default::default()
        };
        assert_eq!(
            free_names(&outer),
            vec!["b".to_string(), "deep".into(), "e".into()]
        );
    }
}
