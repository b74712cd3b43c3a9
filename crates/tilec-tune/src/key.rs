//! What identifies a kernel problem in the tuning database: a fingerprint of its problem class
//! (the ops of its nodes in order, with their dtypes, ranks and which inputs are constants),
//! its exact shape (every dimension, and a hash of the ops' attributes) and its shape bucket
//! (every dimension rounded up to a power of two).
//!
//! The kernel cache keys compiled code by the SHA-256 of the rendered source, which depends on
//! the parameters being tuned; the tuning database needs a key that does not, so it hashes the
//! problem as the graph states it (the same facts [`Problem::key`] prints).

use sha2::{Digest, Sha256};
use tilec_ir::{Dim, Graph, ValueDef, ValueId};
use tilec_tile::family::Problem;

/// Bumped whenever the fingerprint's recipe changes (old entries then no longer match).
const KEY_FORMAT: &str = "tilec-tune-key-1";

/// The database key of a problem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProblemKey {
    /// Hex SHA-256 (first 16 bytes) of the problem class: shape-independent.
    pub fingerprint: String,
    /// Every dimension of every node's inputs and outputs, and a hash of the ops' attributes.
    pub shape: String,
    /// The dimensions rounded up to powers of two (attributes left out).
    pub bucket: String,
    /// The element type of the problem's main output (the anchor's, else the first node's).
    pub dtype: String,
    /// The problem as people read it ([`Problem::key`], shortened).
    pub desc: String,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn digest(s: &str) -> String {
    hex(&Sha256::digest(s.as_bytes())[..16])
}

fn dims(g: &Graph, v: ValueId, round: bool) -> String {
    let t = &g.value(v).ty;
    let d: Vec<String> = t
        .shape
        .iter()
        .map(|&d| match d {
            Dim::Fixed(n) if round => n.max(1).next_power_of_two().to_string(),
            Dim::Fixed(n) => n.to_string(),
            Dim::Sym(_) => g.syms.display(d),
        })
        .collect();
    d.join("x")
}

/// The key of a problem (its graph's shapes should be concrete; symbolic ones are named).
pub fn problem_key(p: &Problem) -> ProblemKey {
    let g = p.graph;
    let mut class = vec![KEY_FORMAT.to_string()];
    let mut shape = vec![];
    let mut bucket = vec![];
    let mut attrs = String::new();
    for &n in &p.nodes {
        let node = g.node(n);
        let ins: Vec<String> = node
            .inputs
            .iter()
            .map(|&v| {
                let t = &g.value(v).ty;
                let c = if matches!(g.value(v).def, ValueDef::Const(_)) { "c" } else { "" };
                format!("{}/{}{c}", t.dtype, t.rank())
            })
            .collect();
        let outs: Vec<String> = node.outputs.iter().map(|&v| format!("{}/{}", g.value(v).ty.dtype, g.value(v).ty.rank())).collect();
        class.push(format!("{}({})->{}", node.op.name(), ins.join(","), outs.join(",")));
        let vals: Vec<ValueId> = node.inputs.iter().chain(&node.outputs).copied().collect();
        shape.push(vals.iter().map(|&v| dims(g, v, false)).collect::<Vec<_>>().join(","));
        bucket.push(vals.iter().map(|&v| dims(g, v, true)).collect::<Vec<_>>().join(","));
        attrs.push_str(&format!("{:?};", node.op));
    }
    let main = p.anchor.or_else(|| p.nodes.first().copied());
    let dtype = main
        .and_then(|n| g.node(n).outputs.first().map(|&v| g.value(v).ty.dtype.to_string()))
        .unwrap_or_default();
    let mut desc = p.key();
    if desc.len() > 400 {
        let mut cut = 400;
        while !desc.is_char_boundary(cut) {
            cut -= 1;
        }
        desc.truncate(cut);
        desc.push_str("...");
    }
    ProblemKey {
        fingerprint: digest(&class.join(";")),
        shape: format!("{}#{}", shape.join(";"), &digest(&attrs)[..12]),
        bucket: bucket.join(";"),
        dtype,
        desc,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tilec_ir::op::LinalgOp;
    use tilec_ir::{DType, Op, TensorType};

    fn matmul(m: usize, k: usize, n: usize) -> Graph {
        let mut g = Graph::new("t");
        let a = g.add_input("a", TensorType::fixed(DType::F32, &[m, k]));
        let b = g.add_input("b", TensorType::fixed(DType::F32, &[k, n]));
        let c = g.add(Op::Linalg(LinalgOp::MatMul), &[a, b]).unwrap();
        g.set_outputs(vec![c]);
        g
    }

    fn key(g: &Graph) -> ProblemKey {
        let n = g.node_ids().next().unwrap();
        problem_key(&Problem::of_node(g, n, "k0"))
    }

    #[test]
    fn shapes_share_a_class_and_buckets_round_up() {
        let (a, b, c) = (key(&matmul(100, 64, 64)), key(&matmul(120, 64, 64)), key(&matmul(130, 64, 64)));
        assert_eq!(a.fingerprint, b.fingerprint);
        assert_eq!(a.fingerprint, c.fingerprint);
        assert_ne!(a.shape, b.shape);
        assert_eq!(a.bucket, b.bucket, "100 and 120 both round up to 128");
        assert_ne!(a.bucket, c.bucket, "130 rounds up to 256");
        assert_eq!(a.dtype, "f32");
        assert_eq!(key(&matmul(100, 64, 64)), a, "the key is stable");
    }
}
