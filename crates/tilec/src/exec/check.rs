//! Checking a loaded model step by step against the reference interpreter.

use std::collections::HashMap;

use tilec_ir::{Tensor, ValueId};

use super::{eval_node, Backend, Executor};
use crate::compare::compare;
use crate::Error;

impl<B: Backend> Executor<B> {
    /// Runs the model step by step on a poisoned arena and compares every step's outputs with
    /// the reference interpreter evaluating the same nodes on the same (compiled) inputs.
    /// Returns one line per step output that differs beyond `rtol`/`atol`.
    pub fn check_steps(&mut self, inputs: &[Tensor], rtol: f64, atol: f64) -> Result<Vec<String>, Error> {
        if self.interpreted {
            return Ok(vec![]);
        }
        self.poison()?;
        self.write_inputs(inputs)?;
        self.reset_status()?;
        let mut bad = vec![];
        for si in 0..self.steps.len() {
            // Reference values of the step's nodes, from the current contents of its inputs.
            self.backend.sync()?;
            let mut env: HashMap<ValueId, Tensor> = HashMap::new();
            for &n in &self.steps[si].info.nodes {
                let node = self.graph.node(n);
                let args: Vec<Tensor> = node
                    .inputs
                    .iter()
                    .map(|v| env.get(v).cloned().map_or_else(|| self.read(*v), Ok))
                    .collect::<Result<_, _>>()?;
                for (&v, t) in node.outputs.iter().zip(eval_node(&self.graph, n, &args)?) {
                    env.insert(v, t);
                }
            }
            self.step(si)?;
            self.backend.sync()?;
            self.check_status()?;
            let st = &self.steps[si].info;
            for &v in &st.outputs {
                let Some(want) = env.get(&v) else { continue };
                let got = self.read(v)?;
                let what = format!("step {si} ({}): value '{}'", st.name, self.graph.value(v).name);
                match compare(want, &got, rtol, atol) {
                    Err(e) => bad.push(format!("{what}: {e}")),
                    Ok(c) if c.ok() => {}
                    Ok(c) => {
                        let first = c
                            .first_mismatch
                            .map(|(i, x, y)| format!("; first at element {i}: expected {x}, got {y}"))
                            .unwrap_or_default();
                        bad.push(format!(
                            "{what}: {} of {} elements differ (max abs err {}){first}",
                            c.mismatches, c.count, c.max_abs
                        ));
                    }
                }
            }
        }
        Ok(bad)
    }
}
