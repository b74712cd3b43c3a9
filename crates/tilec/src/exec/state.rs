//! State that stays with the back end between runs: a decode step's KV caches, updated in
//! place, need not go to the host and back with every token.
//!
//! [`Executor::run_state`] names pairs (output, input): after each run the output's value
//! lies in the input's storage — nothing to move when the memory plan already put the output
//! there (a cache `paged_attention` updates in place), a copy within the arena otherwise — and
//! the next run may leave that input out. Only the outputs asked for are read back.

use tilec_ir::Tensor;

use super::{fixed_shape, Backend, Executor, Slot};
use crate::Error;

fn err(msg: String) -> Error {
    Error::Compile(msg)
}

impl<B: Backend> Executor<B> {
    /// Runs with state kept in place. `inputs[i]`: the tensor for input `i`, or `None` to
    /// keep what input `i`'s storage holds, which must be state a previous `run_state` left
    /// there. `state`: pairs (output, input) carried into the next run. `fetch[o]`: whether
    /// output `o` is read back (`None` in its place otherwise).
    pub fn run_state(&mut self, inputs: &[Option<&Tensor>], state: &[(usize, usize)], fetch: &[bool]) -> Result<Vec<Option<Tensor>>, Error> {
        let g = &self.graph;
        let (ni, no) = (g.inputs().len(), g.outputs().len());
        if inputs.len() != ni || fetch.len() != no {
            return Err(err(format!("the model has {ni} inputs and {no} outputs; {} inputs and {} output flags were given", inputs.len(), fetch.len())));
        }
        if self.interpreted {
            return Err(err("this model runs on the host interpreter, which keeps no state between runs".into()));
        }
        let mut seen_in = vec![false; ni];
        let mut spans = Vec::with_capacity(state.len());
        for &(o, i) in state {
            if o >= no || i >= ni || std::mem::replace(&mut seen_in[i], true) {
                return Err(err(format!("state pair (output {o}, input {i}): expected an output and an input of the model, each input at most once")));
            }
            let (ov, iv) = (g.outputs()[o], g.inputs()[i]);
            let (a, b) = (g.value(ov), g.value(iv));
            if a.ty.dtype != b.ty.dtype || fixed_shape(g, ov) != fixed_shape(g, iv) {
                return Err(err(format!("state pair: output '{}' and input '{}' differ in type", a.name, b.name)));
            }
            let (Some(&Slot::Arena(src)), Some(&Slot::Arena(dst))) = (self.slots.get(&ov), self.slots.get(&iv)) else {
                return Err(err(format!("state pair: output '{}' or input '{}' has no storage in the arena", a.name, b.name)));
            };
            spans.push((src, dst, b.ty.byte_size().unwrap_or(0)));
        }
        for (i, t) in inputs.iter().enumerate() {
            let v = g.value(g.inputs()[i]);
            match t {
                None if !self.resident[i] => {
                    return Err(err(format!("input '{}' was left out but holds no state from a previous run", v.name)));
                }
                None => {}
                Some(t) => {
                    let want = fixed_shape(g, g.inputs()[i]).unwrap_or_default();
                    if t.dtype() != v.ty.dtype || t.shape() != want.as_slice() {
                        return Err(err(format!(
                            "input '{}': expected {}{:?}, got {}{:?} (the model was compiled for these shapes)",
                            v.name,
                            v.ty.dtype,
                            want,
                            t.dtype(),
                            t.shape()
                        )));
                    }
                }
            }
        }
        self.backend.sync()?;
        for (i, t) in inputs.iter().enumerate() {
            if let Some(t) = t {
                self.write(self.graph.inputs()[i], t)?;
                self.resident[i] = false;
            }
        }
        self.exec()?;
        self.backend.sync()?;
        self.check_status()?;
        let outs = self
            .graph
            .outputs()
            .iter()
            .zip(fetch)
            .map(|(&v, &f)| if f { self.read(v).map(Some) } else { Ok(None) })
            .collect::<Result<Vec<_>, _>>()?;
        self.carry(&spans)?;
        for (i, r) in self.resident.iter_mut().enumerate() {
            *r = seen_in[i];
        }
        Ok(outs)
    }

    /// Moves each state output into its input's storage: in place already, on the device when
    /// no copy's destination overlaps a source still to be copied (its own included), else
    /// through the host. (Destinations are inputs' storage, which every run's inputs hold at
    /// once, so a destination never overlaps a state left in place.)
    fn carry(&self, spans: &[(usize, usize, usize)]) -> Result<(), Error> {
        let moves: Vec<_> = spans.iter().copied().filter(|&(s, d, n)| s != d && n > 0).collect();
        let clash = moves.iter().any(|&(_, d, n)| moves.iter().any(|&(s, _, m)| d < s + m && s < d + n));
        if !clash {
            for &(s, d, n) in &moves {
                self.backend.copy_within(s, d, n)?;
            }
            return self.backend.sync();
        }
        let held: Vec<Tensor> = moves.iter().map(|&(s, _, n)| self.backend.read(s, tilec_ir::DType::U8, &[n])).collect::<Result<_, _>>()?;
        for (&(_, d, _), t) in moves.iter().zip(&held) {
            self.backend.write(d, t)?;
        }
        self.backend.sync()
    }

    /// Input `i` as its storage holds it now (after [`Executor::run_state`], the state the last
    /// run left there).
    pub fn read_input(&self, i: usize) -> Result<Tensor, Error> {
        let v = *self.graph.inputs().get(i).ok_or_else(|| err(format!("the model has no input {i}")))?;
        if self.interpreted {
            return Err(err("this model runs on the host interpreter, which keeps no state between runs".into()));
        }
        self.read(v)
    }
}
