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
    let ask = |cx: &NodeCx, e: ImportError| match e {
        ImportError::NonConstant { .. } => cx.non_constant(
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
        Err(e @ ImportError::NonConstant { .. }) => return unroll_loop(cx, body, &carried, e),
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
