//! ONNX → canonical graph import.
//!
//! One pass over the (topologically sorted) ONNX nodes. Each op type maps through a
//! function of its family module (`lookup` in each) that reads typed attributes, checks
//! them, and emits canonical ops through [`NodeCx`]; ONNX conveniences (Gemm, Clip,
//! HardSwish, Squeeze, ...) are decomposed or canonicalized there.
//!
//! Shape operands (Reshape's shape, Slice's starts, reduction axes, ...) must be known at
//! import: from initializers, Constant nodes, inputs bound by the caller
//! ([`ImportOptions::bind_inputs`]), or *shape subgraphs* (Shape → Gather → Concat → ...)
//! that this module folds while importing. A folded value's elements may be symbolic
//! dimensions, so a model with a dynamic batch still imports with exact shapes.

mod control;
mod elementwise;
mod index;
mod layout;
mod linalg;
mod nn;
mod norm;
mod reduce;
mod source;
#[cfg(test)]
mod test_util;

use crate::load::LoadError;
use crate::proto::{self, AttributeProto, NodeProto};
use crate::tensor::{dtype_from_onnx, onnx_type_name, tensor_from_proto};
use std::collections::HashMap;
use tilec_ir::{Dim, Graph, IrError, Op, SymbolId, Tensor, TensorType, ValueId};

/// The newest opset of the default domain this importer was written against (the `onnx`
/// package's current); models stamped with a newer one are refused, as their operators may
/// mean something else.
pub const MAX_OPSET: i64 = 28;

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("malformed model: {0}")]
    Model(String),
    #[error("node '{node}' ({op_type}, opset {opset}): unsupported: {what}")]
    Unsupported { node: String, op_type: String, opset: i64, what: String },
    #[error("node '{node}' ({op_type}): input {position} ('{input}') must be a constant known at import ({what}); bind it or make it an initializer")]
    NonConstant { node: String, op_type: String, position: usize, input: String, what: String },
    #[error("node '{node}' ({op_type}): {msg}")]
    Invalid { node: String, op_type: String, msg: String },
}

/// Caller choices for an import.
#[derive(Clone, Debug, Default)]
pub struct ImportOptions {
    /// Graph inputs to treat as constants with these values (specialization).
    pub bind_inputs: HashMap<String, Tensor>,
    /// Fixed sizes for named symbolic dimensions (`dim_param`s), e.g. `batch = 1`.
    pub dim_values: HashMap<String, usize>,
}

/// One element of a folded shape tensor: a known integer or a symbolic dimension.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ShapeElem {
    Int(i64),
    Sym(SymbolId),
}

impl ShapeElem {
    pub fn from_dim(d: Dim) -> ShapeElem {
        match d {
            Dim::Fixed(n) => ShapeElem::Int(n as i64),
            Dim::Sym(s) => ShapeElem::Sym(s),
        }
    }
    pub fn as_int(self) -> Option<i64> {
        match self {
            ShapeElem::Int(v) => Some(v),
            ShapeElem::Sym(_) => None,
        }
    }
}

/// Import state: the graph under construction and what is known about values.
pub struct Importer {
    pub graph: Graph,
    names: HashMap<String, ValueId>,
    /// Known contents of small integer tensors that are not constants (they depend on
    /// symbolic dimensions), keyed by value.
    contents: HashMap<ValueId, Vec<ShapeElem>>,
    opsets: HashMap<String, i64>,
    node_counter: usize,
}

type MapFn = fn(&mut NodeCx) -> Result<Vec<ValueId>, ImportError>;

fn lookup(op_type: &str) -> Option<MapFn> {
    match op_type {
        "Constant" => return Some(map_constant),
        "Identity" => return Some(map_identity),
        _ => {}
    }
    elementwise::lookup(op_type)
        .or_else(|| reduce::lookup(op_type))
        .or_else(|| norm::lookup(op_type))
        .or_else(|| linalg::lookup(op_type))
        .or_else(|| nn::lookup(op_type))
        .or_else(|| layout::lookup(op_type))
        .or_else(|| index::lookup(op_type))
        .or_else(|| source::lookup(op_type))
        .or_else(|| control::lookup(op_type))
}

/// Whether the importer maps this op type of the default domain.
pub fn is_supported(op_type: &str) -> bool {
    lookup(op_type).is_some()
}

/// All op types the importer knows, for reports (`tilec inspect`, the conformance summary).
pub fn supported_op_types() -> Vec<&'static str> {
    let mut v: Vec<&'static str> = ALL_ONNX_OPS.iter().copied().filter(|o| is_supported(o)).collect();
    v.sort();
    v
}

/// Imports a decoded model.
pub fn import_model(model: &proto::ModelProto, opts: &ImportOptions) -> Result<Graph, ImportError> {
    let graph = model.graph.as_ref().ok_or_else(|| ImportError::Model("model has no graph".into()))?;
    let opsets = opset_imports(model)?;
    if !model.functions.is_empty() {
        // Only an error if a node calls one; handled at the node.
    }
    let mut imp = Importer {
        graph: Graph::new(if graph.name.is_empty() { "main" } else { &graph.name }),
        names: HashMap::new(),
        contents: HashMap::new(),
        opsets,
        node_counter: 0,
    };
    imp.import_graph(graph, opts, model)?;
    Ok(imp.graph)
}

/// The model's opset imports by domain (`""` for the default one), checked as the ONNX
/// checker does: each domain once, and the default domain's version one this importer knows.
/// A model of IR version 1 or 2 may import nothing and is then opset 1; a later one must
/// import at least one opset.
fn opset_imports(model: &proto::ModelProto) -> Result<HashMap<String, i64>, ImportError> {
    let mut opsets = HashMap::new();
    for o in &model.opset_import {
        let d = if o.domain == "ai.onnx" { String::new() } else { o.domain.clone() };
        let shown = if d.is_empty() { "the default domain (ai.onnx)".to_string() } else { format!("domain '{d}'") };
        if let Some(v) = opsets.insert(d, o.version) {
            if v != o.version {
                return Err(ImportError::Model(format!("{shown} is imported twice, at opsets {v} and {}", o.version)));
            }
        }
    }
    match opsets.get("") {
        Some(&v) if !(1..=MAX_OPSET).contains(&v) => {
            return Err(ImportError::Model(format!(
                "opset {v} of the default domain (ai.onnx) is not supported (tilec knows opsets 1 to {MAX_OPSET})"
            )))
        }
        Some(_) => {}
        None if model.opset_import.is_empty() && model.ir_version < 3 => {
            opsets.insert(String::new(), 1);
        }
        None if model.opset_import.is_empty() => {
            return Err(ImportError::Model(format!(
                "the model imports no opset (IR version {} requires opset_import, with the default domain's version for ONNX operators)",
                model.ir_version
            )))
        }
        // Nodes of the default domain are refused where they appear.
        None => {}
    }
    Ok(opsets)
}

impl Importer {
    fn import_graph(&mut self, g: &proto::GraphProto, opts: &ImportOptions, model: &proto::ModelProto) -> Result<(), ImportError> {
        for init in &g.initializer {
            // onnxruntime keeps the last of two initializers of one name; the ONNX checker
            // refuses the model, and so does tilec: which value was meant is unknown.
            if self.names.contains_key(&init.name) {
                return Err(ImportError::Model(format!("initializer '{}' is defined twice", init.name)));
            }
            let t = tensor_from_proto(init).map_err(ImportError::Model)?;
            let v = self.graph.add_const(&init.name, t);
            self.names.insert(init.name.clone(), v);
        }
        if !g.sparse_initializer.is_empty() {
            return Err(ImportError::Model("sparse initializers are not supported".into()));
        }
        let mut seen_inputs = std::collections::HashSet::new();
        for inp in &g.input {
            if !seen_inputs.insert(inp.name.as_str()) {
                return Err(ImportError::Model(format!("graph input '{}' is listed twice", inp.name)));
            }
            if self.names.contains_key(&inp.name) {
                continue; // an initializer also listed as an input (IR < 4): a constant
            }
            if let Some(t) = opts.bind_inputs.get(&inp.name) {
                let v = self.graph.add_const(&inp.name, t.clone());
                self.names.insert(inp.name.clone(), v);
                continue;
            }
            let ty = self.value_info_type(inp, opts)?;
            tilec_ir::size::check_type(&ty)
                .map_err(|e| ImportError::Model(format!("graph input '{}': {e}", inp.name)))?;
            let v = self.graph.add_input(&inp.name, ty);
            self.names.insert(inp.name.clone(), v);
        }
        for (i, node) in g.node.iter().enumerate() {
            self.import_node(node, i, model)?;
        }
        let mut outs = Vec::new();
        for o in &g.output {
            let v = *self
                .names
                .get(&o.name)
                .ok_or_else(|| ImportError::Model(format!("graph output '{}' is not produced by any node", o.name)))?;
            outs.push(v);
        }
        self.graph.set_outputs(outs);
        Ok(())
    }

    fn value_info_type(&mut self, vi: &proto::ValueInfoProto, opts: &ImportOptions) -> Result<TensorType, ImportError> {
        use proto::type_proto::Value;
        use proto::tensor_shape_proto::dimension::Value as D;
        let bad = |m: String| ImportError::Model(format!("input '{}': {m}", vi.name));
        let tt = match vi.r#type.as_ref().and_then(|t| t.value.as_ref()) {
            Some(Value::TensorType(t)) => t,
            Some(Value::SequenceType(_)) => return Err(bad("sequence inputs are not supported".into())),
            Some(Value::OptionalType(_)) => return Err(bad("optional inputs are not supported".into())),
            Some(Value::MapType(_)) => return Err(bad("map inputs are not supported".into())),
            Some(_) => return Err(bad("only tensor inputs are supported".into())),
            None => return Err(bad("has no type".into())),
        };
        let dtype = dtype_from_onnx(tt.elem_type)
            .ok_or_else(|| bad(format!("element type {} is not supported", onnx_type_name(tt.elem_type))))?;
        let shape = tt.shape.as_ref().ok_or_else(|| bad("has no shape (unknown rank is not supported)".into()))?;
        let mut dims = Vec::new();
        for (k, d) in shape.dim.iter().enumerate() {
            dims.push(match &d.value {
                Some(D::DimValue(n)) if *n >= 0 => Dim::Fixed(*n as usize),
                Some(D::DimValue(n)) => return Err(bad(format!("negative dimension {n}"))),
                Some(D::DimParam(p)) if !p.is_empty() => match opts.dim_values.get(p) {
                    Some(&n) => Dim::Fixed(n),
                    None => Dim::Sym(self.graph.syms.free(p)),
                },
                _ => Dim::Sym(self.graph.syms.fresh(&format!("{}_d{k}", sanitize(&vi.name)))),
            });
        }
        Ok(TensorType::new(dtype, dims))
    }

    fn import_node(&mut self, node: &NodeProto, index: usize, model: &proto::ModelProto) -> Result<(), ImportError> {
        let domain = if node.domain == "ai.onnx" { "" } else { node.domain.as_str() };
        let name = if node.name.is_empty() { format!("{}_{index}", node.op_type) } else { node.name.clone() };
        let opset = match self.opsets.get(domain) {
            Some(&v) => v,
            None => {
                return Err(ImportError::Unsupported {
                    node: name,
                    op_type: node.op_type.clone(),
                    opset: 0,
                    what: if domain.is_empty() {
                        "the model does not import the default domain (ai.onnx)".to_string()
                    } else {
                        format!("domain '{}' is not imported by the model", node.domain)
                    },
                })
            }
        };
        if !domain.is_empty() {
            let is_fn = model.functions.iter().any(|f| f.name == node.op_type && f.domain == node.domain);
            return Err(ImportError::Unsupported {
                node: name,
                op_type: node.op_type.clone(),
                opset,
                what: if is_fn {
                    "model-local functions are not supported".into()
                } else {
                    format!("operators of domain '{}' are not supported (only the default ONNX domain)", node.domain)
                },
            });
        }
        let f = lookup(&node.op_type);
        if f.is_none() && !layout::is_foldable(&node.op_type) {
            return Err(ImportError::Unsupported {
                node: name.clone(),
                op_type: node.op_type.clone(),
                opset,
                what: "no mapping for this operator".into(),
            });
        }
        for (k, i) in node.input.iter().enumerate() {
            if !i.is_empty() && !self.names.contains_key(i) {
                return Err(ImportError::Invalid {
                    node: name,
                    op_type: node.op_type.clone(),
                    msg: format!("input {k} '{i}' is not defined before this node (dangling value or cycle)"),
                });
            }
        }
        let mut cx = NodeCx { imp: self, node, name: name.clone(), opset, emitted: 0 };
        // Shape computations on known values fold first (see layout::fold_shape_op).
        let outs = match layout::fold_shape_op(&mut cx)? {
            Some(o) => o,
            None => match f {
                Some(f) => f(&mut cx)?,
                None => return Err(cx.unsupported("no mapping for this operator (and its inputs are not known at import)")),
            },
        };
        let wanted: Vec<(usize, &String)> = node.output.iter().enumerate().filter(|(_, n)| !n.is_empty()).collect();
        for (k, out_name) in wanted {
            let v = *outs.get(k).ok_or_else(|| ImportError::Unsupported {
                node: name.clone(),
                op_type: node.op_type.clone(),
                opset,
                what: format!("output {k} ('{out_name}') is not produced by this importer"),
            })?;
            if self.names.contains_key(out_name) {
                return Err(ImportError::Invalid {
                    node: name.clone(),
                    op_type: node.op_type.clone(),
                    msg: format!("output '{out_name}' is defined twice (not SSA)"),
                });
            }
            // Keep the ONNX name on values this node defined (not on aliases).
            if let tilec_ir::ValueDef::Node { .. } = self.graph.value(v).def {
                if self.graph.value(v).name.starts_with(&name) {
                    self.graph.value_mut(v).name = out_name.clone();
                }
            }
            self.names.insert(out_name.clone(), v);
        }
        Ok(())
    }
}

fn sanitize(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect()
}

/// The view of one ONNX node that a mapping function works with.
pub struct NodeCx<'a> {
    imp: &'a mut Importer,
    pub node: &'a NodeProto,
    /// The node's name (or a generated one), used in errors and for emitted nodes.
    pub name: String,
    /// The opset version of the node's domain.
    pub opset: i64,
    emitted: usize,
}

impl NodeCx<'_> {
    pub fn op_type(&self) -> &str {
        &self.node.op_type
    }

    pub fn graph(&self) -> &Graph {
        &self.imp.graph
    }

    pub fn graph_mut(&mut self) -> &mut Graph {
        &mut self.imp.graph
    }

    // ---- errors ----

    pub fn invalid(&self, msg: impl Into<String>) -> ImportError {
        ImportError::Invalid { node: self.name.clone(), op_type: self.node.op_type.clone(), msg: msg.into() }
    }

    pub fn unsupported(&self, what: impl Into<String>) -> ImportError {
        ImportError::Unsupported {
            node: self.name.clone(),
            op_type: self.node.op_type.clone(),
            opset: self.opset,
            what: what.into(),
        }
    }

    fn non_constant(&self, i: usize, what: &str) -> ImportError {
        ImportError::NonConstant {
            node: self.name.clone(),
            op_type: self.node.op_type.clone(),
            position: i,
            input: self.node.input.get(i).cloned().unwrap_or_default(),
            what: what.to_string(),
        }
    }

    // ---- attributes ----

    pub fn attr(&self, name: &str) -> Option<&AttributeProto> {
        self.node.attribute.iter().find(|a| a.name == name)
    }

    pub fn has_attr(&self, name: &str) -> bool {
        self.attr(name).is_some()
    }

    fn attr_typed(&self, name: &str, ty: i32, tyname: &str) -> Result<Option<&AttributeProto>, ImportError> {
        match self.attr(name) {
            None => Ok(None),
            Some(a) if !a.ref_attr_name.is_empty() => {
                Err(self.unsupported(format!("attribute '{name}' refers to a function attribute")))
            }
            // Type 0 (undefined) comes from old writers; trust the caller's expectation.
            Some(a) if a.r#type == ty || a.r#type == 0 => Ok(Some(a)),
            Some(a) => Err(self.invalid(format!("attribute '{name}' must be {tyname}, has type code {}", a.r#type))),
        }
    }

    pub fn attr_i_opt(&self, name: &str) -> Result<Option<i64>, ImportError> {
        Ok(self.attr_typed(name, 2, "an int")?.map(|a| a.i))
    }

    pub fn attr_i(&self, name: &str, default: i64) -> Result<i64, ImportError> {
        Ok(self.attr_i_opt(name)?.unwrap_or(default))
    }

    pub fn attr_f_opt(&self, name: &str) -> Result<Option<f32>, ImportError> {
        Ok(self.attr_typed(name, 1, "a float")?.map(|a| a.f))
    }

    pub fn attr_f(&self, name: &str, default: f32) -> Result<f32, ImportError> {
        Ok(self.attr_f_opt(name)?.unwrap_or(default))
    }

    pub fn attr_ints(&self, name: &str) -> Result<Option<Vec<i64>>, ImportError> {
        Ok(self.attr_typed(name, 7, "a list of ints")?.map(|a| a.ints.clone()))
    }

    pub fn attr_floats(&self, name: &str) -> Result<Option<Vec<f32>>, ImportError> {
        Ok(self.attr_typed(name, 6, "a list of floats")?.map(|a| a.floats.clone()))
    }

    pub fn attr_s(&self, name: &str) -> Result<Option<String>, ImportError> {
        match self.attr_typed(name, 3, "a string")? {
            None => Ok(None),
            Some(a) => String::from_utf8(a.s.clone())
                .map(Some)
                .map_err(|_| self.invalid(format!("attribute '{name}' is not UTF-8"))),
        }
    }

    pub fn attr_t(&self, name: &str) -> Result<Option<Tensor>, ImportError> {
        match self.attr_typed(name, 4, "a tensor")? {
            None => Ok(None),
            Some(a) => {
                let t = a.t.as_ref().ok_or_else(|| self.invalid(format!("attribute '{name}' has no tensor")))?;
                tensor_from_proto(t).map(Some).map_err(|e| self.invalid(format!("attribute '{name}': {e}")))
            }
        }
    }

    /// A dtype attribute (an ONNX element type code), e.g. Cast's `to`.
    pub fn attr_dtype(&self, name: &str) -> Result<Option<tilec_ir::DType>, ImportError> {
        match self.attr_i_opt(name)? {
            None => Ok(None),
            Some(code) => dtype_from_onnx(code as i32)
                .map(Some)
                .ok_or_else(|| self.unsupported(format!("attribute '{name}': element type {}", onnx_type_name(code as i32)))),
        }
    }

    // ---- inputs ----

    /// Number of inputs as written (trailing optional inputs may be missing).
    pub fn n_inputs(&self) -> usize {
        self.node.input.len()
    }

    /// Input `i`, or `None` when absent or given as the empty name.
    pub fn input(&self, i: usize) -> Option<ValueId> {
        let n = self.node.input.get(i)?;
        if n.is_empty() {
            return None;
        }
        self.imp.names.get(n).copied()
    }

    pub fn req_input(&self, i: usize) -> Result<ValueId, ImportError> {
        self.input(i).ok_or_else(|| self.invalid(format!("required input {i} is missing")))
    }

    pub fn ty(&self, v: ValueId) -> &TensorType {
        &self.imp.graph.value(v).ty
    }

    pub fn input_ty(&self, i: usize) -> Result<TensorType, ImportError> {
        Ok(self.ty(self.req_input(i)?).clone())
    }

    /// The constant value of input `i`, if it is a constant (`None` if absent).
    pub fn const_input(&self, i: usize) -> Option<&Tensor> {
        self.input(i).and_then(|v| self.imp.graph.const_value(v))
    }

    /// Input `i` as integers; it must be a constant (or a fully known shape value).
    pub fn const_ints(&self, i: usize, what: &str) -> Result<Vec<i64>, ImportError> {
        let els = self.shape_input(i, what)?;
        els.iter()
            .map(|e| e.as_int().ok_or_else(|| self.non_constant(i, &format!("{what}; it depends on a symbolic dimension"))))
            .collect()
    }

    /// Input `i` as floats; it must be a constant.
    pub fn const_floats(&self, i: usize, what: &str) -> Result<Vec<f64>, ImportError> {
        match self.const_input(i) {
            Some(t) => Ok(t.to_f64_vec()),
            None => Err(self.non_constant(i, what)),
        }
    }

    /// The known contents of an integer input: from a constant, or from a folded shape
    /// computation (elements may be symbolic).
    pub fn shape_input(&self, i: usize, what: &str) -> Result<Vec<ShapeElem>, ImportError> {
        self.contents(i).ok_or_else(|| self.non_constant(i, what))
    }

    /// Known contents of input `i` (see [`Self::shape_input`]), if any.
    pub fn contents(&self, i: usize) -> Option<Vec<ShapeElem>> {
        let v = self.input(i)?;
        self.value_contents(v)
    }

    pub fn value_contents(&self, v: ValueId) -> Option<Vec<ShapeElem>> {
        if let Some(t) = self.imp.graph.const_value(v) {
            if t.dtype().is_int() || t.dtype().is_bool() {
                return Some(t.to_i64_vec().into_iter().map(ShapeElem::Int).collect());
            }
            return None;
        }
        self.imp.contents.get(&v).cloned()
    }

    /// Records the known contents of a value this node produced.
    pub fn set_contents(&mut self, v: ValueId, c: Vec<ShapeElem>) {
        self.imp.contents.insert(v, c);
    }

    // ---- emitting ----

    /// Adds a canonical op; returns its outputs.
    pub fn emit(&mut self, op: Op, inputs: &[ValueId]) -> Result<Vec<ValueId>, ImportError> {
        let name = if self.emitted == 0 { self.name.clone() } else { format!("{}/{}", self.name, self.emitted) };
        self.emitted += 1;
        self.imp.node_counter += 1;
        self.imp.graph.add_node(&name, op, inputs).map_err(|e| match e {
            IrError::Node { msg, .. } => self.invalid(msg),
            IrError::Graph(m) => self.invalid(m),
        })
    }

    /// Adds a single-output canonical op; returns its output.
    pub fn emit1(&mut self, op: Op, inputs: &[ValueId]) -> Result<ValueId, ImportError> {
        let outs = self.emit(op, inputs)?;
        outs.first().copied().ok_or_else(|| self.invalid("op produced no output"))
    }

    /// Adds a constant value.
    pub fn constant(&mut self, t: Tensor) -> ValueId {
        let name = format!("{}/const{}", self.name, self.emitted);
        self.emitted += 1;
        self.imp.graph.add_const(&name, t)
    }
}

fn map_constant(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let t = if let Some(t) = cx.attr_t("value")? {
        t
    } else if let Some(f) = cx.attr_f_opt("value_float")? {
        Tensor::scalar(f)
    } else if let Some(v) = cx.attr_floats("value_floats")? {
        let n = v.len();
        Tensor::from_vec(vec![n], v).map_err(|e| cx.invalid(e.to_string()))?
    } else if let Some(i) = cx.attr_i_opt("value_int")? {
        Tensor::scalar(i)
    } else if let Some(v) = cx.attr_ints("value_ints")? {
        let n = v.len();
        Tensor::from_vec(vec![n], v).map_err(|e| cx.invalid(e.to_string()))?
    } else if cx.has_attr("sparse_value") {
        return Err(cx.unsupported("sparse constants"));
    } else if cx.has_attr("value_string") || cx.has_attr("value_strings") {
        return Err(cx.unsupported("string tensors"));
    } else {
        return Err(cx.invalid("Constant has no value attribute"));
    };
    let name = cx.node.output.first().cloned().unwrap_or_else(|| cx.name.clone());
    Ok(vec![cx.imp.graph.add_const(&name, t)])
}

fn map_identity(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    // An alias, not a node: the output name resolves to the input's value.
    Ok(vec![cx.req_input(0)?])
}

/// Every operator of the default ONNX domain (for coverage reports).
pub const ALL_ONNX_OPS: &[&str] = &[
    "Abs", "Acos", "Acosh", "Add", "AffineGrid", "And", "ArgMax", "ArgMin", "Asin", "Asinh", "Atan", "Atanh",
    "Attention", "AveragePool", "BatchNormalization", "Bernoulli", "BitCast", "BitShift", "BitwiseAnd", "BitwiseNot",
    "BitwiseOr", "BitwiseXor", "BlackmanWindow", "Cast", "CastLike", "CausalConvWithState", "Ceil", "Celu",
    "CenterCropPad", "Clip", "Col2Im", "Compress", "Concat", "ConcatFromSequence", "Constant", "ConstantOfShape",
    "Conv", "ConvInteger", "ConvTranspose", "Cos", "Cosh", "CumProd", "CumSum", "DFT", "DeformConv", "DepthToSpace",
    "DequantizeLinear", "Det", "Div", "Dropout", "DynamicQuantizeLinear", "Einsum", "Elu", "Equal", "Erf", "Exp",
    "Expand", "EyeLike", "Flatten", "Floor", "GRU", "Gather", "GatherElements", "GatherND", "Gelu", "Gemm",
    "GlobalAveragePool", "GlobalLpPool", "GlobalMaxPool", "Greater", "GreaterOrEqual", "GridSample",
    "GroupNormalization", "HammingWindow", "HannWindow", "HardSigmoid", "HardSwish", "Hardmax", "Identity", "If",
    "ImageDecoder", "InstanceNormalization", "IsInf", "IsNaN", "LRN", "LSTM", "LayerNormalization", "LeakyRelu",
    "Less", "LessOrEqual", "LinearAttention", "Log", "LogSoftmax", "Loop", "LpNormalization", "LpPool", "MatMul",
    "MatMulInteger", "Max", "MaxPool", "MaxRoiPool", "MaxUnpool", "Mean", "MeanVarianceNormalization",
    "MelWeightMatrix", "Min", "Mish", "Mod", "Mul", "Multinomial", "Neg", "NegativeLogLikelihoodLoss",
    "NonMaxSuppression", "NonZero", "Not", "OneHot", "Optional", "OptionalGetElement", "OptionalHasElement", "Or",
    "PRelu", "Pad", "Pow", "QLinearConv", "QLinearMatMul", "QuantizeLinear", "RMSNormalization", "RNN",
    "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Range", "Reciprocal", "ReduceL1",
    "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin", "ReduceProd",
    "ReduceSum", "ReduceSumSquare", "RegexFullMatch", "Relu", "Reshape", "Resize", "ReverseSequence", "RoiAlign",
    "RotaryEmbedding", "Round", "STFT", "Scan", "Scatter", "ScatterElements", "ScatterND", "Selu", "SequenceAt",
    "SequenceConstruct", "SequenceEmpty", "SequenceErase", "SequenceInsert", "SequenceLength", "SequenceMap",
    "Shape", "Shrink", "Sigmoid", "Sign", "Sin", "Sinh", "Size", "Slice", "Softmax", "SoftmaxCrossEntropyLoss",
    "Softplus", "Softsign", "SpaceToDepth", "Split", "SplitToSequence", "Sqrt", "Squeeze", "StringConcat",
    "StringNormalizer", "StringSplit", "Sub", "Sum", "SwiGLU", "Swish", "Tan", "Tanh", "TensorScatter",
    "TfIdfVectorizer", "ThresholdedRelu", "Tile", "TopK", "Transpose", "Trilu", "Unique", "Unsqueeze", "Upsample",
    "Where", "Xor",
];
