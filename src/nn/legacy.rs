//! The fixed MLP and embedding gather/scatter the model used before layer graphs (removed once
//! the graph executor replaces them).
#![allow(missing_docs)]

use super::Activation;
use crate::table::DenseParam;

/// A stack of linear layers, each followed by its activation.
#[derive(Clone, Debug)]
pub struct Mlp {
    /// The layers.
    pub layers: Vec<super::Linear>,
    /// One activation per layer.
    pub activations: Vec<Activation>,
}

/// Buffers an [`Mlp`] reuses from step to step.
#[derive(Default)]
pub struct MlpWork {
    /// Output of every layer (after its activation).
    outs: Vec<Vec<f32>>,
    grad: Vec<f32>,
    grad_in: Vec<f32>,
}

impl Mlp {
    /// Layers of `widths[0] -> widths[1] -> ...`, named `name.0`, `name.1`, ..., parameters
    /// starting at `offset`; hidden layers use `hidden`, the last one `last`.
    pub fn new(
        name: &str,
        widths: &[usize],
        hidden: Activation,
        last: Activation,
        offset: usize,
    ) -> (Mlp, Vec<DenseParam>) {
        let (mut layers, mut activations, mut params) = (Vec::new(), Vec::new(), Vec::new());
        let mut at = offset;
        for (l, w) in widths.windows(2).enumerate() {
            let (layer, p) = super::Linear::new(&format!("{name}.{l}"), w[0], w[1], at);
            at += layer.len();
            layers.push(layer);
            activations.push(if l + 2 == widths.len() { last } else { hidden });
            params.extend(p);
        }
        (Mlp { layers, activations }, params)
    }

    /// Output width.
    pub fn output(&self) -> usize {
        self.layers.last().map_or(0, |l| l.output)
    }

    /// Runs the stack on `x` (rows x input); the result is `work.output()`.
    pub fn forward(&self, params: &[f32], x: &[f32], rows: usize, work: &mut MlpWork) {
        work.outs.resize_with(self.layers.len(), Vec::new);
        for (l, layer) in self.layers.iter().enumerate() {
            let (before, after) = work.outs.split_at_mut(l);
            let input = if l == 0 { x } else { &before[l - 1][..] };
            let out = &mut after[0];
            out.resize(rows * layer.output, 0.0);
            layer.forward(params, input, rows, out);
            self.activations[l].forward(out);
        }
    }

    #[allow(clippy::too_many_arguments)]
    /// Back-propagates `dy` (gradient w.r.t. the final output, after its activation), adding
    /// parameter gradients into `grads`; writes the gradient w.r.t. `x` into `dx` if asked.
    pub fn backward(
        &self,
        params: &[f32],
        x: &[f32],
        dy: &[f32],
        rows: usize,
        work: &mut MlpWork,
        grads: &mut [f32],
        dx: Option<&mut [f32]>,
    ) {
        work.grad.clear();
        work.grad.extend_from_slice(dy);
        let mut dx = dx;
        for l in (0..self.layers.len()).rev() {
            let layer = &self.layers[l];
            self.activations[l].backward(&work.outs[l], &mut work.grad);
            let input = if l == 0 { x } else { &work.outs[l - 1][..] };
            if l == 0 {
                layer.backward(params, input, &work.grad, rows, grads, dx.as_deref_mut());
            } else {
                work.grad_in.clear();
                work.grad_in.resize(rows * layer.input, 0.0);
                layer.backward(params, input, &work.grad, rows, grads, Some(&mut work.grad_in));
                std::mem::swap(&mut work.grad, &mut work.grad_in);
            }
        }
    }
}

impl MlpWork {
    /// The last forward pass's output.
    pub fn output(&self) -> &[f32] {
        self.outs.last().map_or(&[], |v| &v[..])
    }
}

/// Copies embedding rows into an input matrix: for sample `r` and slot `s`, the `dim` floats of
/// row `index[r * slots + s]` of `rows` go to columns `s*dim..` of row `r` of `x` (width `stride`).
pub fn gather_rows(rows: &[f32], index: &[u32], slots: usize, dim: usize, x: &mut [f32], stride: usize) {
    for (k, &u) in index.iter().enumerate() {
        let (r, s) = (k / slots, k % slots);
        let u = u as usize;
        x[r * stride + s * dim..r * stride + (s + 1) * dim].copy_from_slice(&rows[u * dim..(u + 1) * dim]);
    }
}

/// The reverse of [`gather_rows`]: adds the input-gradient columns back onto their rows.
pub fn scatter_add_rows(dx: &[f32], index: &[u32], slots: usize, dim: usize, stride: usize, row_grads: &mut [f32]) {
    for (k, &u) in index.iter().enumerate() {
        let (r, s) = (k / slots, k % slots);
        let u = u as usize;
        let src = &dx[r * stride + s * dim..r * stride + (s + 1) * dim];
        row_grads[u * dim..(u + 1) * dim].iter_mut().zip(src).for_each(|(g, d)| *g += d);
    }
}
