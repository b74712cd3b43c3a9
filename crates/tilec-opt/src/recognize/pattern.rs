//! A small matcher for op trees rooted at a value, and the driver that turns a match into
//! a rewrite.
//!
//! A recognizer walks *up* from a root node through producers, checking op kinds and
//! constant operands, and records every node it consumes. A match is only applied when
//! every consumed node except the root is used solely by other consumed nodes (no graph
//! output, no outside reader): otherwise the primitives would have to stay alive anyway
//! and the rewrite would duplicate work. Constant operands are recognized through
//! constant-only subtrees too (`sqrt(cast(2.0))` as the importer leaves expanded ONNX
//! functions), evaluated with the reference kernels.

use crate::OptError;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use tilec_ir::op::{BinaryOp, UnaryOp};
use tilec_ir::{Graph, IrError, Node, NodeId, Op, Tensor, Uses, ValueId};

/// Largest constant (in elements) that constant matching evaluates or inspects.
const MAX_CONST_ELEMS: usize = 64;

/// Read-only view of the graph while matching, plus the nodes consumed so far.
pub struct Matcher<'g> {
    pub g: &'g Graph,
    uses: &'g [Uses],
    dead: &'g HashSet<NodeId>,
    matched: Vec<NodeId>,
    /// Whether [`Matcher::product`] also opens single-use float-to-float casts (mixed
    /// precision exports compute norms in f32 between casts).
    pub through_casts: bool,
    /// Large constant-computed values already evaluated in this pass
    /// ([`Matcher::const_tensor_upto`]), by value and size limit.
    consts: &'g Consts,
    /// Facts about values already established in this pass ([`Matcher::fact`]).
    facts: &'g Facts,
}

/// Constant-computed values evaluated in one pass, by value and size limit.
type Consts = RefCell<HashMap<(ValueId, usize), Option<Rc<Tensor>>>>;

/// Facts established in one pass: (question, value, context) to the answer.
type Facts = RefCell<HashMap<(&'static str, ValueId, Vec<tilec_ir::Dim>), bool>>;

impl<'g> Matcher<'g> {
    /// The node producing `v`, when it is a live, known node.
    pub fn node(&self, v: ValueId) -> Option<&'g Node> {
        if v.index() >= self.uses.len() {
            return None;
        }
        let n = self.g.producer(v)?;
        if self.dead.contains(&n) {
            return None;
        }
        Some(self.g.node(n))
    }

    fn record(&mut self, v: ValueId) {
        if let Some(n) = self.g.producer(v) {
            if !self.matched.contains(&n) {
                self.matched.push(n);
            }
        }
    }

    /// Runs `f`; when it fails, forgets the nodes it recorded (backtracking).
    pub fn attempt<T>(&mut self, f: impl FnOnce(&mut Self) -> Option<T>) -> Option<T> {
        let mark = self.matched.len();
        let r = f(self);
        if r.is_none() {
            self.matched.truncate(mark);
        }
        r
    }

    /// Number of readers of `v` (nodes and graph outputs).
    pub fn use_count(&self, v: ValueId) -> usize {
        self.uses
            .get(v.index())
            .map(|u| u.count())
            .unwrap_or(usize::MAX)
    }

    /// `v = op(a)` for a unary op with the given kind: records the node, returns `a`.
    pub fn unary(&mut self, v: ValueId, op: UnaryOp) -> Option<ValueId> {
        let n = self.node(v)?;
        if n.op != Op::Unary(op) || n.outputs.len() != 1 {
            return None;
        }
        self.record(v);
        n.inputs.first().copied()
    }

    /// `v = a op b`: records the node, returns `(a, b)`.
    pub fn binary(&mut self, v: ValueId, op: BinaryOp) -> Option<(ValueId, ValueId)> {
        let n = self.node(v)?;
        if n.op != Op::Binary(op) || n.inputs.len() != 2 {
            return None;
        }
        self.record(v);
        Some((n.inputs[0], n.inputs[1]))
    }

    /// `v` is produced by a node whose op satisfies `pred`; records it, returns the node.
    pub fn op_where(&mut self, v: ValueId, pred: impl Fn(&Op) -> bool) -> Option<&'g Node> {
        let n = self.node(v)?;
        if !pred(&n.op) {
            return None;
        }
        self.record(v);
        Some(n)
    }

    /// `v = cast(a)` between float types: returns `a` (recorded; the internal-use check
    /// then requires every reader of `v` to be in the match), else `v` itself.
    pub fn skip_float_cast(&mut self, v: ValueId) -> ValueId {
        if let Some(n) = self.node(v) {
            if let Op::Cast { to, .. } = n.op {
                let src = n.inputs[0];
                if to.is_float() && self.g.value(src).ty.dtype.is_float() {
                    self.record(v);
                    return src;
                }
            }
        }
        v
    }

    /// Whether `what` holds for `v` in the context `of` (e.g. "causal" for a mask against
    /// the scores' shape): `test` runs once per pass for each question (every layer of a
    /// model asks about the same shared mask).
    pub fn fact(&self, what: &'static str, v: ValueId, of: &[tilec_ir::Dim], test: impl FnOnce(&Self) -> bool) -> bool {
        let key = (what, v, of.to_vec());
        if let Some(&known) = self.facts.borrow().get(&key) {
            return known;
        }
        let r = test(self);
        self.facts.borrow_mut().insert(key, r);
        r
    }

    /// The value of `v` when it is a (small) constant or computed from constants only.
    pub fn const_tensor(&self, v: ValueId) -> Option<Tensor> {
        self.const_rec(v, 0)
    }

    /// The value of `v` when it is a constant or computed from constants only, through
    /// subgraphs of any shape (at most 64 nodes deep) whose values all have at most
    /// `max_elems` elements: masks that exports build from position iotas, too large for
    /// constant folding. Evaluated once per pass (shared by every match that asks).
    pub fn const_tensor_upto(&self, v: ValueId, max_elems: usize) -> Option<Rc<Tensor>> {
        self.const_big(v, max_elems, 0)
    }

    /// [`Matcher::const_tensor_upto`] for a value `depth` producers below the one asked for.
    pub(crate) fn const_big(&self, v: ValueId, max_elems: usize, depth: usize) -> Option<Rc<Tensor>> {
        if let Some(t) = self.g.const_value(v) {
            return (t.numel() <= max_elems).then(|| Rc::new(t.clone()));
        }
        if let Some(hit) = self.consts.borrow().get(&(v, max_elems)) {
            return hit.clone();
        }
        let out = (|| {
            if depth > 64 || self.g.value(v).ty.fixed_shape()?.iter().product::<usize>() > max_elems {
                return None;
            }
            let n = self.node(v)?;
            if n.outputs.len() != 1 {
                return None;
            }
            let args: Vec<Rc<Tensor>> = n.inputs.iter().map(|&x| self.const_big(x, max_elems, depth + 1)).collect::<Option<_>>()?;
            let refs: Vec<&Tensor> = args.iter().map(|t| t.as_ref()).collect();
            let bound = HashMap::new();
            let cx = tilec_ref::EvalCtx { graph: self.g, bound: &bound };
            let out = tilec_ref::eval_op(&n.op, &refs, &cx).ok()?.into_iter().next()?;
            (out.numel() <= max_elems).then(|| Rc::new(out))
        })();
        self.consts.borrow_mut().insert((v, max_elems), out.clone());
        out
    }

    fn const_rec(&self, v: ValueId, depth: usize) -> Option<Tensor> {
        if depth > 8 {
            return None;
        }
        if let Some(t) = self.g.const_value(v) {
            return (t.numel() <= MAX_CONST_ELEMS).then(|| t.clone());
        }
        let n = self.node(v)?;
        if n.outputs.len() != 1 {
            return None;
        }
        let args: Vec<Tensor> = n
            .inputs
            .iter()
            .map(|&x| self.const_rec(x, depth + 1))
            .collect::<Option<_>>()?;
        let refs: Vec<&Tensor> = args.iter().collect();
        let bound = HashMap::new();
        let cx = tilec_ref::EvalCtx {
            graph: self.g,
            bound: &bound,
        };
        let out = tilec_ref::eval_op(&n.op, &refs, &cx)
            .ok()?
            .into_iter()
            .next()?;
        (out.numel() <= MAX_CONST_ELEMS).then_some(out)
    }

    /// The value of `v` when it is a float constant whose elements are all equal.
    pub fn const_scalar(&self, v: ValueId) -> Option<f64> {
        let t = self.const_tensor(v)?;
        if !t.dtype().is_float() {
            return None;
        }
        let xs = t.to_f64_vec();
        let first = *xs.first()?;
        xs.iter().all(|&x| x == first).then_some(first)
    }

    /// `v` is a uniform constant equal to `want` within relative tolerance `rtol`.
    pub fn const_is(&self, v: ValueId, want: f64, rtol: f64) -> bool {
        self.const_scalar(v)
            .map(|c| approx(c, want, rtol))
            .unwrap_or(false)
    }

    /// Flattens the product tree at `v`: single-use `Mul` nodes (and `v`'s own node when
    /// `root`) are opened up; `Div` by a value contributes a denominator; constants
    /// multiply into the coefficient. Returns `(coefficient, factors, denominators)`.
    pub fn product(&mut self, v: ValueId) -> Product {
        let mut p = Product {
            coef: 1.0,
            factors: vec![],
            denoms: vec![],
        };
        self.product_rec(v, true, false, &mut p);
        p
    }

    fn product_rec(&mut self, v: ValueId, root: bool, inverted: bool, p: &mut Product) {
        if let Some(c) = self.const_scalar(v) {
            p.coef = if inverted { p.coef / c } else { p.coef * c };
            return;
        }
        let open = root || self.use_count(v) == 1;
        if open {
            if let Some(n) = self.node(v) {
                match n.op {
                    Op::Cast { to, .. } if self.through_casts && to.is_float() => {
                        let src = n.inputs[0];
                        if self.g.value(src).ty.dtype.is_float() {
                            self.record(v);
                            self.product_rec(src, false, inverted, p);
                            return;
                        }
                    }
                    Op::Binary(BinaryOp::Mul) => {
                        self.record(v);
                        let (a, b) = (n.inputs[0], n.inputs[1]);
                        self.product_rec(a, false, inverted, p);
                        self.product_rec(b, false, inverted, p);
                        return;
                    }
                    Op::Binary(BinaryOp::Div) => {
                        self.record(v);
                        let (a, b) = (n.inputs[0], n.inputs[1]);
                        self.product_rec(a, false, inverted, p);
                        self.product_rec(b, false, !inverted, p);
                        return;
                    }
                    _ => {}
                }
            }
        }
        if inverted {
            p.denoms.push(v);
        } else {
            p.factors.push(v);
        }
    }

    /// `v = a + b` with `b` a constant equal to `c` (either order): returns `a`.
    pub fn add_const(&mut self, v: ValueId, c: f64, rtol: f64) -> Option<ValueId> {
        self.attempt(|m| {
            let (a, b) = m.binary(v, BinaryOp::Add)?;
            if m.const_is(b, c, rtol) {
                Some(a)
            } else if m.const_is(a, c, rtol) {
                Some(b)
            } else {
                None
            }
        })
    }

    /// Whether the consumed nodes other than the one producing `root` are read only by
    /// consumed nodes (and are no graph outputs).
    pub fn internal_only(&self, root: ValueId) -> bool {
        let root_node = self.g.producer(root);
        let set: HashSet<NodeId> = self.matched.iter().copied().collect();
        for &n in &self.matched {
            if Some(n) == root_node {
                continue;
            }
            for &o in &self.g.node(n).outputs {
                let Some(u) = self.uses.get(o.index()) else {
                    return false;
                };
                if !u.by_output.is_empty() || u.by_node.iter().any(|(r, _)| !set.contains(r)) {
                    return false;
                }
            }
        }
        true
    }
}

/// Runs `f` on a matcher over `g` with nothing matched yet (for inspecting values).
#[cfg(test)]
pub(crate) fn with_matcher<R>(g: &Graph, f: impl FnOnce(&Matcher) -> R) -> R {
    let uses = g.uses();
    let dead = HashSet::new();
    let consts = RefCell::new(HashMap::new());
    let facts = RefCell::new(HashMap::new());
    let m = Matcher { g, uses: &uses, dead: &dead, matched: Vec::new(), through_casts: false, consts: &consts, facts: &facts };
    f(&m)
}

/// A flattened product `coef * prod(factors) / prod(denoms)`.
#[derive(Debug)]
pub struct Product {
    pub coef: f64,
    pub factors: Vec<ValueId>,
    pub denoms: Vec<ValueId>,
}

pub fn approx(a: f64, b: f64, rtol: f64) -> bool {
    (a - b).abs() <= rtol * b.abs().max(1e-30)
}

/// What a recognizer returns: builds the replacement for `root` and returns its value.
pub type Build = Box<dyn FnOnce(&mut Graph) -> Result<ValueId, IrError>>;

/// A recognizer: given a matcher and a candidate root value, a builder when it matches.
pub type Recognize = fn(&mut Matcher, ValueId) -> Option<Build>;

/// Runs a recognizer over every node output of `g` and applies the matches: builds the
/// replacement, redirects the root's readers, and finally cleans the graph up. Returns
/// whether anything was rewritten.
pub fn rewrite_all(g: &mut Graph, pass: &'static str, rec: Recognize) -> Result<bool, OptError> {
    let uses = g.uses();
    let mut dead: HashSet<NodeId> = HashSet::new();
    let mut plans: Vec<(ValueId, Build)> = Vec::new();
    let consts = RefCell::new(HashMap::new());
    let facts = RefCell::new(HashMap::new());
    let n_nodes = g.nodes().len();
    // Latest roots first, so the largest pattern (e.g. a norm with its affine tail) wins
    // over a sub-pattern rooted earlier.
    for ni in (0..n_nodes).rev() {
        let nid = NodeId(ni as u32);
        if dead.contains(&nid) {
            continue;
        }
        let Some(&root) = g.node(nid).outputs.first() else {
            continue;
        };
        if g.node(nid).outputs.len() != 1 {
            continue;
        }
        let mut m = Matcher {
            g,
            uses: &uses,
            dead: &dead,
            matched: Vec::new(),
            through_casts: false,
            consts: &consts,
            facts: &facts,
        };
        let Some(build) = rec(&mut m, root) else {
            continue;
        };
        if !m.internal_only(root) {
            continue;
        }
        let matched = std::mem::take(&mut m.matched);
        dead.extend(matched);
        dead.insert(nid);
        plans.push((root, build));
    }
    let mut changed = false;
    for (root, build) in plans {
        let Ok(new) = build(g) else { continue };
        if g.value(new).ty != g.value(root).ty {
            continue;
        }
        g.replace_all_uses(root, new)
            .map_err(|source| OptError::Ir { pass, source })?;
        changed = true;
    }
    g.cleanup()
        .map_err(|source| OptError::Ir { pass, source })?;
    Ok(changed)
}

/// A [`crate::Pass`] made of a name and a recognizer.
pub struct RecognizePass {
    pub name: &'static str,
    pub rec: Recognize,
}

impl crate::Pass for RecognizePass {
    fn name(&self) -> &'static str {
        self.name
    }
    fn run(&self, g: &mut Graph) -> Result<bool, OptError> {
        rewrite_all(g, self.name, self.rec)
    }
}

/// Adds a node and returns its first output, naming it after the value it replaces.
pub fn emit(g: &mut Graph, like: &str, op: Op, inputs: &[ValueId]) -> Result<ValueId, IrError> {
    let name = format!("{like}/{}", op.name());
    let outs = g.add_node(&name, op, inputs)?;
    outs.first()
        .copied()
        .ok_or_else(|| IrError::Graph(format!("node '{name}' has no outputs")))
}

/// A scalar constant of `dtype` with value `x`.
pub fn scalar_const(
    g: &mut Graph,
    name: &str,
    dtype: tilec_ir::DType,
    x: f64,
) -> Result<ValueId, IrError> {
    let t = Tensor::from_f64s(dtype, vec![], &[x]).map_err(|e| IrError::Graph(e.to_string()))?;
    Ok(g.add_const(name, t))
}
